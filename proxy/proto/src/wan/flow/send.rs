//! The sending half of all flows: queues, fragments, retransmissions,
//! credit, and the retirement of idle flows (see the parent module for why
//! retirement is safe).

use std::collections::VecDeque;
use std::time::Duration;

use super::super::idhash::IdMap;
use super::{PushError, MAX_FRAGMENTS, MAX_MESSAGE};
use crate::buffer::{PacketBuf, PacketPool};
use crate::keyed::KeyedMap;
use crate::time::Time;

use super::super::msg::Encoded;
use super::super::packet::{DataFrame, Frame, Writer};
use super::super::recovery::SentFrame;

struct OutMsg {
    seq: u64,
    offset: u64,
    /// The message as queued: its packet is moved in, never copied here.
    bytes: Encoded,
    nfrags: u8,
    /// Fragments handed out at least once (those below `next_frag`).
    next_frag: u8,
    acked: u64,
    in_rtx: u64,
}

impl OutMsg {
    fn all(&self) -> u64 {
        if self.nfrags as usize >= 64 {
            u64::MAX
        } else {
            (1u64 << self.nfrags) - 1
        }
    }
}

#[derive(Default)]
struct SendFlow {
    /// The caller's key for this flow (forgotten when the flow closes).
    key: u64,
    next_seq: u64,
    next_offset: u64,
    /// From the oldest unacknowledged message to the newest queued one.
    msgs: VecDeque<OutMsg>,
    /// Index in `msgs` of the first message with unsent fragments.
    cursor: usize,
    /// Peer's credit: offsets below this may be sent.
    credit: u64,
    /// Bytes of messages not completely handed out yet.
    unsent_bytes: u64,
    in_ready: bool,
    /// When the flow last became idle (everything acknowledged).
    idle_since: Time,
    /// Has an entry in `SendFlows::idle` (at most one per flow).
    idle_queued: bool,
    /// Closing: its FIN is queued or in flight; no message joins it.
    closing: bool,
    /// Its FIN waits in `SendFlows::fins` (at most once).
    fin_queued: bool,
}

impl SendFlow {
    /// Everything it carried is acknowledged and nothing waits.
    fn idle(&self) -> bool {
        self.msgs.is_empty()
    }

    fn front_seq(&self) -> u64 {
        self.msgs.front().map_or(self.next_seq, |m| m.seq)
    }

    fn msg_mut(&mut self, seq: u64) -> Option<&mut OutMsg> {
        let i = seq.checked_sub(self.front_seq())?;
        self.msgs.get_mut(usize::try_from(i).ok()?)
    }

    /// Encoded size of the DATA frame carrying its next fragment (the one
    /// `write_new` would write; a sendable flow has one). Never more than
    /// what `DataFrame::encode_with_tail` writes: it is used as a lower
    /// bound, and an overestimate would change which flow fills a packet.
    fn next_frame_len(&self, frag_size: usize) -> usize {
        let Some(m) = self.msgs.get(self.cursor) else {
            return 0;
        };
        let len = m.bytes.len();
        let start = (m.next_frag as usize * frag_size).min(len);
        let payload = (start + frag_size).min(len) - start;
        // Type byte, the flow id (a fixed 8 bytes), five varints, payload.
        1 + 8
            + varint_len(m.seq)
            + varint_len(m.offset)
            + varint_len(len as u64)
            + varint_len(start as u64)
            + varint_len(payload as u64)
            + payload
    }

    /// Has a fragment it may send now.
    fn sendable(&self) -> bool {
        match self.msgs.get(self.cursor) {
            Some(m) => m.next_frag > 0 || m.offset + m.bytes.len() as u64 <= self.credit,
            None => false,
        }
    }

    /// The next fragment of flow `id` went into the datagram: note it in
    /// `out` and move on (to the next message once the last fragment is
    /// out, which leaves the unsent bytes, the flow's and all flows').
    fn sent_frag(&mut self, id: u64, unsent: &mut u64, out: &mut Vec<SentFrame>) {
        let cursor = self.cursor;
        let m = &mut self.msgs[cursor];
        out.push(SentFrame::Data {
            flow: id,
            seq: m.seq,
            frag: m.next_frag,
        });
        m.next_frag += 1;
        if m.next_frag == m.nfrags {
            let len = m.bytes.len() as u64;
            self.unsent_bytes -= len;
            *unsent -= len;
            self.cursor += 1;
        }
    }
}

/// Sending half of all flows.
pub struct SendFlows {
    /// Live and closing flows by wire id (ids this side allocates: see
    /// `idhash`).
    flows: IdMap<SendFlow>,
    /// The caller's key → the wire id of its live (not closing) flow.
    /// The keys are the site's hashes of what the data center sends
    /// (unkeyed FNV: anyone can compute them), so this table is keyed
    /// (`crate::keyed`), unlike `flows`. Only looked up, never walked.
    keys: KeyedMap<u64, u64>,
    /// The next wire id: sequential, never reused in a connection.
    next_id: u64,
    /// Flows that went idle, oldest first: `(when queued, id)`. Each flow
    /// is in it at most once (`idle_queued`), so it is bounded by the flow
    /// table, and the times are in order because `now` never goes back.
    idle: VecDeque<(Time, u64)>,
    idle_timeout: Duration,
    /// Flows whose FIN is to be sent (again).
    fins: VecDeque<u64>,
    /// Flows with a fragment they may send, round robin.
    ready: VecDeque<u64>,
    /// No flow in `ready` has a next DATA frame smaller than this. With
    /// hundreds of flows ready, finding out the hard way that none fits
    /// the tail of a packet (one encode attempt per flow) cost O(flows) per
    /// packet; below this floor the answer is known without asking. It
    /// only drops when a flow joins `ready` (to that flow's frame size) and
    /// rises after a full round of flows that did not fit (each needs more
    /// than the room they were tried in).
    ready_floor: usize,
    /// Lost fragments to send again, oldest loss first.
    rtx: VecDeque<(u64, u64, u8)>,
    frag_size: usize,
    initial_credit: u64,
    queue_limit: u64,
    max_buffered: u64,
    max_flows: usize,
    /// Bytes held: queued plus sent-but-unacknowledged.
    pub buffered: u64,
    /// Bytes of messages not completely handed out yet, all flows.
    unsent: u64,
    pub messages_queued: u64,
    pub messages_acked: u64,
    pub messages_discarded: u64,
    /// Flows closed and forgotten (their FIN acknowledged).
    pub flows_retired: u64,
    /// The packets of held requests ([`Encoded::is_held_request`]) this
    /// side is done with, acknowledged or dropped by [`Self::reset`], for
    /// the sending gateway's engine to take back
    /// (`WanConnection::take_handed_back`): it keeps each until the twin
    /// reports it delivered, and sends it again should the twin restart
    /// before that. Its capacity is kept: in steady state it allocates
    /// nothing.
    pub handed_back: VecDeque<PacketBuf>,
    /// The packets of raw requests ([`Encoded::is_raw_request`]) the twin
    /// acknowledged, for the sending gateway's engine
    /// (`WanConnection::take_raw_released`, `QpEngine::raw_released`).
    pub raw_released: VecDeque<PacketBuf>,
}

impl SendFlows {
    /// Bytes of per-flow state: the flow table as allocated (capacity ×
    /// (id, flow, control byte)), each flow's message queue as allocated
    /// (the messages' packet bytes are buffers, not counted) and the key
    /// table.
    pub fn state_bytes(&self) -> usize {
        self.flows.capacity() * (std::mem::size_of::<(u64, SendFlow)>() + 1)
            + self
                .flows
                .values()
                .map(|f| f.msgs.capacity() * std::mem::size_of::<OutMsg>())
                .sum::<usize>()
            + self.keys.capacity() * (2 * std::mem::size_of::<u64>() + 1)
    }

    pub fn new(
        frag_size: usize,
        initial_credit: u64,
        queue_limit: u64,
        max_buffered: u64,
        max_flows: usize,
        idle_timeout: Duration,
    ) -> SendFlows {
        SendFlows {
            flows: IdMap::default(),
            keys: KeyedMap::default(),
            next_id: 1,
            idle: VecDeque::new(),
            idle_timeout,
            fins: VecDeque::new(),
            ready: VecDeque::new(),
            ready_floor: usize::MAX,
            rtx: VecDeque::new(),
            frag_size: frag_size.max(1),
            initial_credit,
            queue_limit,
            max_buffered,
            max_flows,
            buffered: 0,
            unsent: 0,
            messages_queued: 0,
            messages_acked: 0,
            messages_discarded: 0,
            flows_retired: 0,
            handed_back: VecDeque::new(),
            raw_released: VecDeque::new(),
        }
    }

    pub fn max_message(&self) -> usize {
        MAX_MESSAGE.min(self.frag_size * MAX_FRAGMENTS)
    }

    /// Queues one encoded message on the flow of `key` (a new flow, with a
    /// fresh wire id, if the key has none live).
    pub fn push(&mut self, key: u64, bytes: Encoded) -> Result<(), PushError> {
        let len = bytes.len() as u64;
        if bytes.len() > self.max_message() {
            return Err(PushError::TooLarge);
        }
        let live = self.keys.get(&key).copied();
        if live.is_none() && self.flows.len() >= self.max_flows {
            return Err(PushError::TooManyFlows);
        }
        if self.buffered + len > self.max_buffered {
            return Err(PushError::BufferFull);
        }
        let flow = match live {
            Some(id) => id,
            None => {
                if len > self.initial_credit + self.queue_limit {
                    return Err(PushError::FlowBlocked);
                }
                let id = self.next_id;
                self.next_id += 1;
                self.keys.insert(key, id);
                self.flows.insert(
                    id,
                    SendFlow {
                        key,
                        credit: self.initial_credit,
                        ..SendFlow::default()
                    },
                );
                id
            }
        };
        let Some(f) = self.flows.get_mut(&flow) else {
            return Err(PushError::TooManyFlows);
        };
        // Unsent bytes beyond what the peer's credit covers are the local
        // queue; it is bounded so that backpressure reaches the caller.
        if f.next_offset + len > f.credit + self.queue_limit {
            return Err(PushError::FlowBlocked);
        }
        let nfrags = bytes.len().div_ceil(self.frag_size).max(1) as u8;
        f.msgs.push_back(OutMsg {
            seq: f.next_seq,
            offset: f.next_offset,
            bytes,
            nfrags,
            next_frag: 0,
            acked: 0,
            in_rtx: 0,
        });
        f.next_seq += 1;
        f.next_offset += len;
        f.unsent_bytes += len;
        self.unsent += len;
        self.buffered += len;
        self.messages_queued += 1;
        wake(
            &mut self.ready,
            &mut self.ready_floor,
            flow,
            f,
            self.frag_size,
        );
        Ok(())
    }

    /// Bytes `push` would accept now for `key` (0 if it would refuse).
    pub fn room(&self, key: u64) -> u64 {
        let global = self.max_buffered.saturating_sub(self.buffered);
        let live = self.keys.get(&key).and_then(|id| self.flows.get(id));
        let per_flow = match live {
            Some(f) => (f.credit + self.queue_limit).saturating_sub(f.next_offset),
            None if self.flows.len() >= self.max_flows => 0,
            None => self.initial_credit + self.queue_limit,
        };
        global.min(per_flow).min(self.max_message() as u64)
    }

    /// Lost fragments, FINs or new data waiting.
    pub fn has_pending(&self) -> bool {
        !self.rtx.is_empty() || !self.ready.is_empty() || !self.fins.is_empty()
    }

    /// Writes fragment `frag` of `m` as a DATA frame; `false` if it does
    /// not fit. The fragment is copied straight from the message's parts
    /// into the packet: the one copy of the payload on the sending side.
    fn write_frag(w: &mut Writer<'_>, m: &OutMsg, flow: u64, frag: u8, frag_size: usize) -> bool {
        let len = m.bytes.len();
        let start = (frag as usize * frag_size).min(len);
        let (head, body) = m.bytes.range(start, start + frag_size);
        DataFrame {
            flow,
            seq: m.seq,
            offset: m.offset,
            total: len as u32,
            frag_off: start as u32,
            bytes: head,
        }
        .encode_with_tail(body, w)
    }

    /// Writes lost fragments, oldest first, while they fit.
    pub fn write_retransmissions(&mut self, w: &mut Writer<'_>, out: &mut Vec<SentFrame>) {
        while let Some(&(flow, seq, frag)) = self.rtx.front() {
            let frag_size = self.frag_size;
            let Some(m) = self.flows.get_mut(&flow).and_then(|f| f.msg_mut(seq)) else {
                self.rtx.pop_front();
                continue;
            };
            let bit = 1u64 << frag;
            if m.acked & bit != 0 {
                m.in_rtx &= !bit;
                self.rtx.pop_front();
                continue;
            }
            if !Self::write_frag(w, m, flow, frag, frag_size) {
                return;
            }
            m.in_rtx &= !bit;
            self.rtx.pop_front();
            out.push(SentFrame::Data { flow, seq, frag });
        }
    }

    /// Writes new fragments round robin over ready flows while they fit.
    /// A flow whose next fragment does not fit the room left goes to the
    /// back and the next one is tried (a smaller message of another flow
    /// might fit); a full round without a fit ends the packet. That round
    /// leaves `ready` as it found it, so it is skipped when `ready_floor`
    /// already says no flow fits: same packets, without O(flows) encode
    /// attempts per packet.
    pub fn write_new(&mut self, w: &mut Writer<'_>, out: &mut Vec<SentFrame>) {
        self.write_rounds(w, out, true);
    }

    /// `write_new` as it was before `ready_floor`: every round tried to
    /// the end (tests: the oracle the floor must not change).
    #[cfg(test)]
    pub fn write_new_every_round(&mut self, w: &mut Writer<'_>, out: &mut Vec<SentFrame>) {
        self.write_rounds(w, out, false);
    }

    /// The rounds of [`Self::write_new`]; `use_floor` false tries every
    /// round to the end, whatever `ready_floor` says.
    fn write_rounds(&mut self, w: &mut Writer<'_>, out: &mut Vec<SentFrame>, use_floor: bool) {
        if self.ready.is_empty() {
            self.ready_floor = usize::MAX;
            return;
        }
        let mut tries = self.ready.len();
        // Whether this attempt starts a round (at the start or after a
        // fragment was written): only then may the floor end it, since a
        // round cut short would leave `ready` rotated.
        let mut round_start = true;
        while tries > 0 {
            if round_start {
                round_start = false;
                if use_floor && w.remaining() < self.ready_floor {
                    return;
                }
            }
            tries -= 1;
            let Some(id) = self.ready.pop_front() else {
                return;
            };
            let frag_size = self.frag_size;
            let Some(f) = self.flows.get_mut(&id) else {
                continue;
            };
            f.in_ready = false;
            if !f.sendable() {
                continue; // blocked on credit: back in `ready` on FLOW_CREDIT
            }
            let need = f.next_frame_len(frag_size);
            let (room, before) = (w.remaining(), w.len());
            let cursor = f.cursor;
            let m = &mut f.msgs[cursor];
            let frag = m.next_frag;
            let written = Self::write_frag(w, m, id, frag, frag_size);
            // The floor rests on `next_frame_len` being exact (checked in
            // the unit tests, release builds included).
            if cfg!(any(test, debug_assertions)) {
                assert_eq!(written, need <= room, "frame size {need}, room {room}");
            }
            if !written {
                f.in_ready = true;
                self.ready.push_back(id);
                continue;
            }
            if cfg!(any(test, debug_assertions)) {
                assert_eq!(w.len() - before, need);
            }
            f.sent_frag(id, &mut self.unsent, out);
            wake(&mut self.ready, &mut self.ready_floor, id, f, frag_size);
            tries = self.ready.len();
            round_start = true;
        }
        // A full round found no fit: every flow left needs more than the
        // room it was tried in (which did not change during the round).
        if self.ready.is_empty() {
            self.ready_floor = usize::MAX;
        } else {
            self.ready_floor = self.ready_floor.max(w.remaining() + 1);
        }
    }

    /// Fragment `frag` of message `seq` arrived. A message acknowledged in
    /// full is released: its packet buffer goes to `pool`. A flow left with
    /// nothing unacknowledged is idle from `now`.
    pub fn on_acked(&mut self, now: Time, flow: u64, seq: u64, frag: u8, pool: &mut PacketPool) {
        let Some(f) = self.flows.get_mut(&flow) else {
            return;
        };
        let Some(m) = f.msg_mut(seq) else {
            return;
        };
        m.acked |= 1u64 << frag;
        // Release fully acknowledged messages from the front.
        while let Some(m) = f.msgs.front() {
            if m.acked != m.all() || m.next_frag < m.nfrags {
                break;
            }
            self.buffered -= m.bytes.len() as u64;
            self.messages_acked += 1;
            if let Some(m) = f.msgs.pop_front() {
                if m.bytes.is_held_request() {
                    self.handed_back.push_back(m.bytes.into_body());
                } else if m.bytes.is_raw_request() {
                    self.raw_released.push_back(m.bytes.into_body());
                } else {
                    pool.put(m.bytes.into_body());
                }
            }
            f.cursor = f.cursor.saturating_sub(1);
        }
        if f.idle() && !f.closing {
            f.idle_since = now;
            if !f.idle_queued {
                f.idle_queued = true;
                self.idle.push_back((now, flow));
            }
        }
    }

    pub fn on_lost(&mut self, flow: u64, seq: u64, frag: u8) {
        let Some(m) = self.flows.get_mut(&flow).and_then(|f| f.msg_mut(seq)) else {
            return;
        };
        let bit = 1u64 << frag;
        if m.acked & bit == 0 && m.in_rtx & bit == 0 {
            m.in_rtx |= bit;
            self.rtx.push_back((flow, seq, frag));
        }
    }

    pub fn on_credit(&mut self, flow: u64, max_offset: u64) {
        let Some(f) = self.flows.get_mut(&flow) else {
            return;
        };
        f.credit = f.credit.max(max_offset);
        wake(
            &mut self.ready,
            &mut self.ready_floor,
            flow,
            f,
            self.frag_size,
        );
    }

    /// A new peer session: its initial credit for every flow.
    pub fn set_initial_credit(&mut self, credit: u64) {
        self.initial_credit = credit;
        for (id, f) in self.flows.iter_mut() {
            f.credit = credit;
            wake(
                &mut self.ready,
                &mut self.ready_floor,
                *id,
                f,
                self.frag_size,
            );
        }
    }

    /// Drops everything (the peer restarted: its flows are gone, and so is
    /// its memory of closed ids; ids go on counting, which costs nothing).
    /// The packets of held requests not yet acknowledged are handed back
    /// ([`Self::handed_back`]): their sender sends them to the new peer.
    pub fn reset(&mut self) {
        let discarded: usize = self.flows.values().map(|f| f.msgs.len()).sum();
        self.messages_discarded += discarded as u64;
        for f in self.flows.values_mut() {
            for m in f.msgs.drain(..) {
                if m.bytes.is_held_request() {
                    self.handed_back.push_back(m.bytes.into_body());
                }
            }
        }
        self.flows.clear();
        self.keys.clear();
        self.idle.clear();
        self.fins.clear();
        self.ready.clear();
        self.ready_floor = usize::MAX;
        self.rtx.clear();
        self.buffered = 0;
        self.unsent = 0;
    }

    /// Live and closing flows.
    pub fn flow_count(&self) -> usize {
        self.flows.len()
    }

    /// Entries of every per-flow table: keys, flows, idle queue, FIN queue
    /// (tests: the memory bound).
    #[cfg(test)]
    pub fn table_sizes(&self) -> [usize; 4] {
        [
            self.keys.len(),
            self.flows.len(),
            self.idle.len(),
            self.fins.len(),
        ]
    }

    /// When the oldest idle flow may be due for closing.
    pub fn idle_deadline(&self) -> Option<Time> {
        self.idle.front().map(|&(t, _)| t + self.idle_timeout)
    }

    /// Closes the flows idle for `idle_timeout` at `now`: each forgets its
    /// key and queues its FIN. A flow queued here that was busy since is
    /// queued again from `now` if idle now (so it closes within two
    /// timeouts of its last acknowledgement), or left out until it is.
    pub fn close_idle(&mut self, now: Time) {
        while let Some(&(t, id)) = self.idle.front() {
            if t + self.idle_timeout > now {
                return;
            }
            self.idle.pop_front();
            let Some(f) = self.flows.get_mut(&id) else {
                continue;
            };
            f.idle_queued = false;
            if !f.idle() || f.closing {
                continue; // busy: `on_acked` queues it when idle again
            }
            if f.idle_since + self.idle_timeout > now {
                f.idle_queued = true;
                self.idle.push_back((now, id));
                continue;
            }
            f.closing = true;
            f.fin_queued = true;
            self.fins.push_back(id);
            if self.keys.get(&f.key) == Some(&id) {
                self.keys.remove(&f.key);
            }
        }
    }

    /// Writes queued FINs while they fit. A FIN carries the flow's next
    /// message number: it is in sequence after everything the flow carried.
    pub fn write_fins(&mut self, w: &mut Writer<'_>, out: &mut Vec<SentFrame>) {
        while let Some(&id) = self.fins.front() {
            let Some(f) = self.flows.get_mut(&id).filter(|f| f.fin_queued) else {
                self.fins.pop_front();
                continue;
            };
            let fin = Frame::Fin {
                flow: id,
                seq: f.next_seq,
            };
            if !fin.encode(w) {
                return;
            }
            f.fin_queued = false;
            self.fins.pop_front();
            out.push(SentFrame::Fin { flow: id });
        }
    }

    /// A FIN reached the peer, which has closed the flow: forget it.
    pub fn on_fin_acked(&mut self, flow: u64) {
        if self.flows.get(&flow).is_some_and(|f| f.closing) {
            self.flows.remove(&flow);
            self.flows_retired += 1;
        }
    }

    /// A packet carrying a FIN was lost: send it again (unless a copy was
    /// acknowledged meanwhile).
    pub fn on_fin_lost(&mut self, flow: u64) {
        if let Some(f) = self.flows.get_mut(&flow) {
            if f.closing && !f.fin_queued {
                f.fin_queued = true;
                self.fins.push_back(flow);
            }
        }
    }

    /// Bytes waiting to be sent: unsent messages (including those waiting
    /// for credit) and lost fragments (counted as whole fragments).
    pub fn backlog_bytes(&self) -> u64 {
        self.unsent + (self.rtx.len() * self.frag_size) as u64
    }
}

/// Marks `f` ready if it may send and is not already: to the back of the
/// round robin, and the floor of the ready flows' frame sizes lowered to
/// its next frame.
fn wake(ready: &mut VecDeque<u64>, floor: &mut usize, id: u64, f: &mut SendFlow, frag_size: usize) {
    if f.in_ready || !f.sendable() {
        return;
    }
    f.in_ready = true;
    ready.push_back(id);
    *floor = (*floor).min(f.next_frame_len(frag_size));
}

/// Encoded size of a QUIC varint (as `Writer::varint` writes it).
fn varint_len(v: u64) -> usize {
    if v < 1 << 6 {
        1
    } else if v < 1 << 14 {
        2
    } else if v < 1 << 30 {
        4
    } else {
        8
    }
}
