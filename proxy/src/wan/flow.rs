//! Flows: reliable, in-order message streams, independent of each other.
//!
//! A flow is what must stay in order (one QP half). Each message gets the
//! flow's next sequence number and byte offset; the receiver reassembles
//! fragments, buffers out-of-order messages and hands them over strictly in
//! sequence. A lost fragment only stalls its own flow: there is no cross-flow
//! head-of-line blocking.
//!
//! Credit (QUIC-style flow control): the receiver lets the sender use flow
//! byte offsets below `granted = consumed + window`, where `consumed` counts
//! bytes the application has taken out of `poll_event`. So per flow the
//! receiver never holds more than `window` bytes (reorder buffer plus
//! undelivered events), and a slow consumer pushes back on the sender.
//!
//! Bounds and what happens at them:
//! - sender, per flow: unsent bytes beyond the peer's credit ≤ `queue_limit`,
//!   else `send` fails with `FlowBlocked` (the caller holds back);
//! - sender, all flows: bytes held (unsent + unacknowledged) ≤ `max_buffered`,
//!   else `BufferFull`;
//! - both sides: at most `max_flows` flows, else `TooManyFlows` (sender) or
//!   the frame is refused as a protocol violation (receiver);
//! - receiver, per flow: buffered bytes ≤ window (a peer exceeding its credit
//!   violates the protocol: the frame is dropped and counted).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};

use super::idhash::IdMap;
use crate::buffer::PacketPool;

use super::msg::Encoded;
use super::packet::{DataFrame, Frame, Writer};
use super::recovery::SentFrame;

/// Largest encoded message (a RoCE packet is at most ~4.2 KB; the margin
/// leaves room for later message kinds). Fragments per message ≤ 64.
pub const MAX_MESSAGE: usize = 65_536;
/// Fragments of one message are tracked in a `u64` bitmap.
pub const MAX_FRAGMENTS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    TooLarge,
    FlowBlocked,
    BufferFull,
    TooManyFlows,
}

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
}

impl SendFlow {
    fn front_seq(&self) -> u64 {
        self.msgs.front().map_or(self.next_seq, |m| m.seq)
    }

    fn msg_mut(&mut self, seq: u64) -> Option<&mut OutMsg> {
        let i = seq.checked_sub(self.front_seq())?;
        self.msgs.get_mut(usize::try_from(i).ok()?)
    }

    /// Has a fragment it may send now.
    fn sendable(&self) -> bool {
        match self.msgs.get(self.cursor) {
            Some(m) => m.next_frag > 0 || m.offset + m.bytes.len() as u64 <= self.credit,
            None => false,
        }
    }
}

/// Sending half of all flows.
pub struct SendFlows {
    /// Keyed by ids the local engine picks: see `idhash`.
    flows: IdMap<SendFlow>,
    /// Flows with a fragment they may send, round robin.
    ready: VecDeque<u64>,
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
}

impl SendFlows {
    pub fn new(
        frag_size: usize,
        initial_credit: u64,
        queue_limit: u64,
        max_buffered: u64,
        max_flows: usize,
    ) -> SendFlows {
        SendFlows {
            flows: IdMap::default(),
            ready: VecDeque::new(),
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
        }
    }

    pub fn max_message(&self) -> usize {
        MAX_MESSAGE.min(self.frag_size * MAX_FRAGMENTS)
    }

    /// Queues one encoded message on `flow`.
    pub fn push(&mut self, flow: u64, bytes: Encoded) -> Result<(), PushError> {
        let len = bytes.len() as u64;
        if bytes.len() > self.max_message() {
            return Err(PushError::TooLarge);
        }
        // (One table lookup in the common case: the membership test only
        // runs when the table is full.)
        if self.flows.len() >= self.max_flows && !self.flows.contains_key(&flow) {
            return Err(PushError::TooManyFlows);
        }
        if self.buffered + len > self.max_buffered {
            return Err(PushError::BufferFull);
        }
        let initial_credit = self.initial_credit;
        let f = self.flows.entry(flow).or_insert_with(|| SendFlow {
            credit: initial_credit,
            ..SendFlow::default()
        });
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
        if !f.in_ready && f.sendable() {
            f.in_ready = true;
            self.ready.push_back(flow);
        }
        Ok(())
    }

    /// Bytes `push` would accept now on `flow` (0 if it would refuse).
    pub fn room(&self, flow: u64) -> u64 {
        let global = self.max_buffered.saturating_sub(self.buffered);
        let per_flow = match self.flows.get(&flow) {
            Some(f) => (f.credit + self.queue_limit).saturating_sub(f.next_offset),
            None if self.flows.len() >= self.max_flows => 0,
            None => self.initial_credit + self.queue_limit,
        };
        global.min(per_flow).min(self.max_message() as u64)
    }

    /// Lost fragments or new data waiting.
    pub fn has_pending(&self) -> bool {
        !self.rtx.is_empty() || !self.ready.is_empty()
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
    pub fn write_new(&mut self, w: &mut Writer<'_>, out: &mut Vec<SentFrame>) {
        let mut tries = self.ready.len();
        while tries > 0 {
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
            let cursor = f.cursor;
            let m = &mut f.msgs[cursor];
            let frag = m.next_frag;
            if !Self::write_frag(w, m, id, frag, frag_size) {
                // Does not fit this packet; a smaller message of another
                // flow might.
                f.in_ready = true;
                self.ready.push_back(id);
                continue;
            }
            out.push(SentFrame::Data {
                flow: id,
                seq: m.seq,
                frag,
            });
            m.next_frag += 1;
            if m.next_frag == m.nfrags {
                f.unsent_bytes -= m.bytes.len() as u64;
                self.unsent -= m.bytes.len() as u64;
                f.cursor += 1;
            }
            if f.sendable() {
                f.in_ready = true;
                self.ready.push_back(id);
            }
            tries = self.ready.len();
        }
    }

    /// Fragment `frag` of message `seq` arrived. A message acknowledged in
    /// full is released: its packet buffer goes to `pool`.
    pub fn on_acked(&mut self, flow: u64, seq: u64, frag: u8, pool: &mut PacketPool) {
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
                pool.put(m.bytes.into_body());
            }
            f.cursor = f.cursor.saturating_sub(1);
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
        if !f.in_ready && f.sendable() {
            f.in_ready = true;
            self.ready.push_back(flow);
        }
    }

    /// A new peer session: its initial credit for every flow.
    pub fn set_initial_credit(&mut self, credit: u64) {
        self.initial_credit = credit;
        for (id, f) in self.flows.iter_mut() {
            f.credit = credit;
            if !f.in_ready && f.sendable() {
                f.in_ready = true;
                self.ready.push_back(*id);
            }
        }
    }

    /// Drops everything (the peer restarted: its flows are gone).
    pub fn reset(&mut self) {
        let discarded: usize = self.flows.values().map(|f| f.msgs.len()).sum();
        self.messages_discarded += discarded as u64;
        self.flows.clear();
        self.ready.clear();
        self.rtx.clear();
        self.buffered = 0;
        self.unsent = 0;
    }

    pub fn flow_count(&self) -> usize {
        self.flows.len()
    }

    /// Bytes waiting to be sent: unsent messages (including those waiting
    /// for credit) and lost fragments (counted as whole fragments).
    pub fn backlog_bytes(&self) -> u64 {
        self.unsent + (self.rtx.len() * self.frag_size) as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOutcome {
    Accepted,
    /// Already delivered or already buffered: ignored.
    Duplicate,
    /// Beyond credit, inconsistent with earlier fragments, too many flows:
    /// the peer broke the protocol; the frame is dropped.
    Violation,
}

struct Partial {
    offset: u64,
    total: u32,
    data: Vec<u8>,
    /// Received fragment ranges `(start, len)`.
    frags: Vec<(u32, u32)>,
    received: u32,
}

impl Partial {
    fn complete(&self) -> bool {
        self.received == self.total && !self.frags.is_empty()
    }
}

#[derive(Default)]
struct RecvFlow {
    next_seq: u64,
    next_offset: u64,
    consumed: u64,
    granted: u64,
    buffer: BTreeMap<u64, Partial>,
    buffered_bytes: u64,
    credit_queued: bool,
}

/// Receiving half of all flows.
pub struct RecvFlows {
    /// Keyed by ids the peer picks: std's keyed SipHash (see `idhash`).
    flows: HashMap<u64, RecvFlow>,
    window: u64,
    max_flows: usize,
    credit_pending: VecDeque<u64>,
    /// The buffers of reassembled messages, reused for the next ones: when
    /// messages are cut into fragments (a 1500-byte MTU path cuts every
    /// 4 KiB request in four) each of them is reassembled, and fresh
    /// vectors were two allocations per message. At most [`SPARE_PARTIALS`].
    spare: Vec<Spare>,
    pub offset_mismatches: u64,
}

/// Reassembly buffers kept for reuse (at most 64 × the largest message).
const SPARE_PARTIALS: usize = 64;

/// A reassembled message's data and fragment list, for reuse.
type Spare = (Vec<u8>, Vec<(u32, u32)>);

impl RecvFlows {
    pub fn new(window: u64, max_flows: usize) -> RecvFlows {
        RecvFlows {
            flows: HashMap::new(),
            window,
            max_flows,
            credit_pending: VecDeque::new(),
            spare: Vec::new(),
            offset_mismatches: 0,
        }
    }

    /// Accepts one DATA frame; hands every message now complete in order to
    /// `deliver(flow, bytes)`.
    ///
    /// Fast path: the next expected message, whole in this frame (the usual
    /// case with jumbo datagrams), goes to `deliver` straight from the
    /// packet: no reassembly buffer is allocated, zeroed or copied into.
    /// Only fragments and out-of-order messages are buffered.
    pub fn on_data(
        &mut self,
        d: &DataFrame<'_>,
        deliver: &mut impl FnMut(u64, &[u8]),
    ) -> DataOutcome {
        let window = self.window;
        let flows = self.flows.len();
        let full = flows >= self.max_flows;
        let f = match self.flows.entry(d.flow) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(_) if full => return DataOutcome::Violation,
            Entry::Vacant(v) => {
                // Room for every flow's credit in the queue, now: queueing
                // it must not allocate in the steady state (each flow is
                // in it at most once, `credit_queued`).
                let pending = &mut self.credit_pending;
                pending.reserve((flows + 1).saturating_sub(pending.len()));
                v.insert(RecvFlow {
                    granted: window,
                    ..RecvFlow::default()
                })
            }
        };
        if d.seq < f.next_seq {
            return DataOutcome::Duplicate;
        }
        let total = u64::from(d.total);
        if d.offset.saturating_add(total) > f.granted
            || d.seq - f.next_seq > window
            || d.total as usize > MAX_MESSAGE
        {
            return DataOutcome::Violation;
        }
        let buffered = f.buffer.contains_key(&d.seq);
        // The same bound as for a buffered message (a frame delivered at
        // once would have been buffered and delivered in the same call).
        if !buffered && f.buffered_bytes + total > window {
            return DataOutcome::Violation;
        }
        let whole = d.frag_off == 0 && d.bytes.len() as u64 == total;
        if !buffered && whole && d.seq == f.next_seq {
            if d.offset != f.next_offset {
                self.offset_mismatches += 1;
            }
            f.next_offset = d.offset + total;
            f.next_seq += 1;
            deliver(d.flow, d.bytes);
        } else {
            if !buffered {
                f.buffered_bytes += total;
                let (mut data, mut frags) = self.spare.pop().unwrap_or_default();
                data.clear();
                data.resize(d.total as usize, 0);
                frags.clear();
                f.buffer.insert(
                    d.seq,
                    Partial {
                        offset: d.offset,
                        total: d.total,
                        data,
                        frags,
                        received: 0,
                    },
                );
            }
            let Some(p) = f.buffer.get_mut(&d.seq) else {
                return DataOutcome::Violation;
            };
            if p.offset != d.offset || p.total != d.total {
                return DataOutcome::Violation;
            }
            let (start, len) = (d.frag_off, d.bytes.len() as u32);
            if p.frags.contains(&(start, len)) {
                return DataOutcome::Duplicate;
            }
            let overlaps = p
                .frags
                .iter()
                .any(|&(s, l)| start < s + l && s < start + len.max(1));
            if overlaps || p.frags.len() >= MAX_FRAGMENTS {
                return DataOutcome::Violation;
            }
            // The parser guarantees frag_off + len <= total.
            crate::copies::note(d.bytes.len());
            p.data[start as usize..(start + len) as usize].copy_from_slice(d.bytes);
            p.frags.push((start, len));
            p.received += len;
        }
        // Deliver whatever is now complete at the head of the flow.
        while let Some(entry) = f.buffer.first_entry() {
            if *entry.key() != f.next_seq || !entry.get().complete() {
                break;
            }
            let p = entry.remove();
            f.buffered_bytes -= u64::from(p.total);
            if p.offset != f.next_offset {
                self.offset_mismatches += 1;
            }
            f.next_offset = p.offset + u64::from(p.total);
            f.next_seq += 1;
            deliver(d.flow, &p.data);
            if self.spare.len() < SPARE_PARTIALS {
                self.spare.push((p.data, p.frags));
            }
        }
        DataOutcome::Accepted
    }

    /// The application took `len` bytes of `flow` out of the event queue:
    /// top up the peer's credit once a quarter window was consumed.
    pub fn on_consumed(&mut self, flow: u64, len: u64) {
        let Some(f) = self.flows.get_mut(&flow) else {
            return;
        };
        f.consumed += len;
        if f.consumed + self.window - f.granted >= self.window / 4 {
            f.granted = f.consumed + self.window;
            if !f.credit_queued {
                f.credit_queued = true;
                self.credit_pending.push_back(flow);
            }
        }
    }

    /// A packet carrying this flow's credit was lost: send the latest again.
    pub fn requeue_credit(&mut self, flow: u64) {
        if let Some(f) = self.flows.get_mut(&flow) {
            if !f.credit_queued {
                f.credit_queued = true;
                self.credit_pending.push_back(flow);
            }
        }
    }

    pub fn has_credit_pending(&self) -> bool {
        !self.credit_pending.is_empty()
    }

    pub fn write_credits(&mut self, w: &mut Writer<'_>, out: &mut Vec<SentFrame>) {
        while let Some(&flow) = self.credit_pending.front() {
            let Some(f) = self.flows.get_mut(&flow) else {
                self.credit_pending.pop_front();
                continue;
            };
            let frame = Frame::Credit {
                flow,
                max_offset: f.granted,
            };
            if !frame.encode(w) {
                return;
            }
            f.credit_queued = false;
            self.credit_pending.pop_front();
            out.push(SentFrame::Credit { flow });
        }
    }

    pub fn reset(&mut self) {
        self.flows.clear();
        self.credit_pending.clear();
    }

    /// Bytes waiting in reorder buffers.
    pub fn buffered_bytes(&self) -> u64 {
        self.flows.values().map(|f| f.buffered_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wan::packet::parse_frames;

    fn send_one(s: &mut SendFlows, cap: usize) -> (Vec<u8>, Vec<SentFrame>) {
        let mut buf = vec![0u8; cap];
        let mut w = Writer::new(&mut buf);
        let mut out = Vec::new();
        s.write_retransmissions(&mut w, &mut out);
        s.write_new(&mut w, &mut out);
        let n = w.len();
        buf.truncate(n);
        (buf, out)
    }

    fn receive(r: &mut RecvFlows, buf: &[u8], got: &mut Vec<(u64, Vec<u8>)>) {
        for f in parse_frames(buf).unwrap() {
            if let Frame::Data(d) = f {
                let mut deliver = |flow, b: &[u8]| got.push((flow, b.to_vec()));
                assert_ne!(r.on_data(&d, &mut deliver), DataOutcome::Violation);
            }
        }
    }

    #[test]
    fn fragments_reorder_and_retransmit() {
        let mut s = SendFlows::new(100, 10_000, 10_000, 1 << 20, 16);
        let mut r = RecvFlows::new(10_000, 16);
        let big: Vec<u8> = (0..350u32).map(|i| i as u8).collect();
        s.push(1, big.clone().into()).unwrap();
        s.push(1, b"small".to_vec().into()).unwrap();
        s.push(2, b"other flow".to_vec().into()).unwrap();
        let mut packets = Vec::new();
        while s.has_pending() {
            packets.push(send_one(&mut s, 160));
        }
        // Lose the second packet (only a fragment of flow 1), deliver the rest.
        let mut got = Vec::new();
        for (i, (p, frames)) in packets.iter().enumerate() {
            if i == 1 {
                continue;
            }
            receive(&mut r, p, &mut got);
            for f in frames {
                if let SentFrame::Data { flow, seq, frag } = *f {
                    s.on_acked(flow, seq, frag, &mut PacketPool::default());
                }
            }
        }
        assert_eq!(got, vec![(2, b"other flow".to_vec())], "flow 2 not blocked");
        for f in &packets[1].1 {
            if let SentFrame::Data { flow, seq, frag } = *f {
                s.on_lost(flow, seq, frag);
                s.on_lost(flow, seq, frag); // twice: queued once
            }
        }
        let (p, frames) = send_one(&mut s, 160);
        assert!(!s.has_pending());
        receive(&mut r, &p, &mut got);
        assert_eq!(got[1], (1, big));
        assert_eq!(got[2], (1, b"small".to_vec()));
        for f in frames {
            if let SentFrame::Data { flow, seq, frag } = f {
                s.on_acked(flow, seq, frag, &mut PacketPool::default());
            }
        }
        assert_eq!(s.buffered, 0);
        // Receiving the same packet again changes nothing.
        let mut again = Vec::new();
        receive(&mut r, &p, &mut again);
        assert!(again.is_empty());
    }

    #[test]
    fn credit_blocks_and_releases() {
        let mut s = SendFlows::new(1000, 100, 50, 1 << 20, 16);
        s.push(7, vec![1; 60].into()).unwrap();
        s.push(7, vec![2; 60].into()).unwrap(); // 120 > credit 100: queued
        assert_eq!(s.push(7, vec![3; 40].into()), Err(PushError::FlowBlocked));
        let (_, frames) = send_one(&mut s, 1000);
        assert_eq!(frames.len(), 1, "second message waits for credit");
        assert!(!s.has_pending());
        s.on_credit(7, 200);
        let (_, frames) = send_one(&mut s, 1000);
        assert_eq!(frames.len(), 1);
        assert_eq!(s.push(1, vec![0; 70_000].into()), Err(PushError::TooLarge));
    }

    #[test]
    fn receiver_refuses_overrun() {
        let mut r = RecvFlows::new(1000, 2);
        let mut out = |_, _: &[u8]| {};
        let d = |flow, seq, offset, total: u32, bytes: &'static [u8]| DataFrame {
            flow,
            seq,
            offset,
            total,
            frag_off: 0,
            bytes,
        };
        assert_eq!(
            r.on_data(&d(1, 0, 990, 20, &[0; 20]), &mut out),
            DataOutcome::Violation
        );
        assert_eq!(
            r.on_data(&d(1, 0, 0, 3, b"abc"), &mut out),
            DataOutcome::Accepted
        );
        assert_eq!(
            r.on_data(&d(1, 0, 0, 3, b"abc"), &mut out),
            DataOutcome::Duplicate
        );
        assert_eq!(
            r.on_data(&d(2, 0, 0, 1, b"x"), &mut out),
            DataOutcome::Accepted
        );
        assert_eq!(
            r.on_data(&d(3, 0, 0, 1, b"x"), &mut out),
            DataOutcome::Violation,
            "max flows"
        );
        // Credit grows only as the application consumes.
        r.on_consumed(1, 300);
        assert!(r.has_credit_pending());
        assert_eq!(
            r.on_data(&d(1, 1, 1200, 50, &[0; 50]), &mut out),
            DataOutcome::Accepted
        );
    }

    /// Messages queued as header + packet (`msg::encode_owned`), cut into
    /// fragments across the two parts, arrive as the same bytes; whole
    /// in-order messages take the fast path, the others are reassembled,
    /// and a fast-path message releases the buffered ones behind it.
    #[test]
    fn two_part_messages_and_the_fast_path() {
        use crate::qp::twin::TwinMsg;
        use crate::wan::msg;
        let mut s = SendFlows::new(100, 10_000, 10_000, 1 << 20, 16);
        let mut r = RecvFlows::new(10_000, 16);
        let big = TwinMsg::Response {
            packet: (0..250u32).map(|i| i as u8).collect(),
        };
        let small = TwinMsg::Response {
            packet: vec![7; 40],
        };
        s.push(1, msg::encode_owned(small.clone())).unwrap();
        s.push(1, msg::encode_owned(big.clone())).unwrap();
        s.push(1, msg::encode_owned(small.clone())).unwrap();
        let mut packets = Vec::new();
        while s.has_pending() {
            packets.push(send_one(&mut s, 120).0);
        }
        assert_eq!(packets.len(), 5, "1 + 3 fragments + 1");
        // The last small message first: buffered (out of order).
        let mut got = Vec::new();
        receive(&mut r, &packets[4], &mut got);
        assert!(got.is_empty());
        assert_eq!(r.buffered_bytes(), 42);
        for p in &packets[..4] {
            receive(&mut r, p, &mut got);
        }
        let want: Vec<(u64, Vec<u8>)> = [&small, &big, &small]
            .iter()
            .map(|m| (1, msg::encode(m)))
            .collect();
        assert_eq!(got, want);
        assert_eq!(r.buffered_bytes(), 0);
        assert_eq!(r.offset_mismatches, 0);
    }
}
