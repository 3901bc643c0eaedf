//! The receiving half of all flows: reassembly, reorder buffers, credit,
//! and the memory of closed flows (see the parent module).
//!
//! # Reassembly in place
//!
//! A message cut into fragments (WAN datagrams smaller than the packet it
//! carries: a 1500-byte path cuts every 4 KiB RoCE packet in four) is
//! reassembled into a buffer from the transport's [`PacketPool`], and that
//! buffer is handed over as it is: the packet the message carries is never
//! copied out of it again (issue 16: one user-space copy per packet per
//! gateway; at an xdp gateway the pool lends UMEM, so the packet goes to the
//! responder from where its fragments were written).
//!
//! For that the message's header must stay out of the buffer: the buffer
//! holds message bytes `[skip, total)` and a small side array the first
//! `skip`. `skip` comes from the header itself (`body_at`, the codec's
//! knowledge, given by the owner: this module does not know what a message
//! means) when fragment 0 arrives first, as it does unless the paths
//! reorder; otherwise from the last message of the same flow. A wrong guess
//! costs one counted move of the bytes when the message completes
//! ([`RecvFlows::misplaced`]), never wrong bytes.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, VecDeque};

use crate::buffer::{PacketBuf, PacketPool};
use crate::keyed::KeyedMap;

use super::closed::IdRanges;
use super::{DataOutcome, MAX_FRAGMENTS, MAX_MESSAGE};

use super::super::packet::{DataFrame, Frame, Writer};
use super::super::recovery::SentFrame;

/// Most header bytes a message keeps beside its buffer (`body_at` results
/// past it are ignored: the message is then delivered whole in the buffer).
pub const MAX_HEAD: usize = 8;

/// Where a message's body starts, judged from its first bytes (at most
/// [`MAX_HEAD`]); `None` when it has no separate body or the bytes are too
/// few to tell.
pub type BodyAt = fn(&[u8]) -> Option<usize>;

/// A message handed over in order: `head ‖ body`.
pub enum Message<'a> {
    /// Whole in one frame: its bytes, still in the datagram.
    InFrame(&'a [u8]),
    /// Reassembled from fragments. `head` is exactly what `body_at` said
    /// precedes the body (empty when it said `None`): `body` is the rest,
    /// in a pooled buffer the receiver now owns.
    Reassembled { head: &'a [u8], body: PacketBuf },
}

impl Message<'_> {
    /// All the bytes, contiguous (a copy, for tests).
    #[cfg(test)]
    pub fn to_vec(&self) -> Vec<u8> {
        match self {
            Message::InFrame(b) => b.to_vec(),
            Message::Reassembled { head, body } => [*head, &body[..]].concat(),
        }
    }
}

struct Partial {
    offset: u64,
    total: u32,
    /// Message bytes `[0, skip)`.
    head: [u8; MAX_HEAD],
    skip: u8,
    /// Message bytes `[skip, total)`.
    body: PacketBuf,
    /// Received fragment ranges `(start, len)`.
    frags: Vec<(u32, u32)>,
    received: u32,
}

impl Partial {
    fn complete(&self) -> bool {
        self.received == self.total && !self.frags.is_empty()
    }

    /// Writes the fragment at message offset `start` (within `total`).
    fn write(&mut self, start: usize, bytes: &[u8]) {
        let skip = usize::from(self.skip);
        let end = start + bytes.len();
        if start < skip {
            let n = end.min(skip) - start;
            self.head[start..start + n].copy_from_slice(&bytes[..n]);
        }
        if end > skip {
            let from = start.max(skip);
            let part = &bytes[from - start..];
            crate::copies::note(part.len());
            self.body[from - skip..end - skip].copy_from_slice(part);
        }
    }

    /// Moves bytes between the head and the body so that the head is
    /// `want` bytes long; whether any had to move.
    fn place_head(&mut self, want: usize) -> bool {
        let skip = usize::from(self.skip);
        if want == skip {
            return false;
        }
        if want > skip {
            let n = want - skip;
            self.head[skip..want].copy_from_slice(&self.body[..n]);
            self.body.remove_front(n);
        } else {
            self.body.insert_front(&self.head[want..skip]);
        }
        self.skip = want as u8;
        true
    }

    /// The message's first bytes (up to [`MAX_HEAD`]) and how many.
    fn first_bytes(&self) -> ([u8; MAX_HEAD], usize) {
        let skip = usize::from(self.skip);
        let mut first = [0u8; MAX_HEAD];
        first[..skip].copy_from_slice(&self.head[..skip]);
        let more = (MAX_HEAD - skip).min(self.body.len());
        first[skip..skip + more].copy_from_slice(&self.body[..more]);
        (first, skip + more)
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
    /// The head length of this flow's last reassembled message: the guess
    /// for the next one whose fragment 0 is not the first to arrive.
    skip_guess: u8,
}

/// Receiving half of all flows.
pub struct RecvFlows {
    /// Keyed by ids the peer picks: a keyed table (`crate::keyed`, see
    /// `idhash`). Only looked up or summed, never walked in an order that
    /// matters.
    flows: KeyedMap<u64, RecvFlow>,
    /// Ids whose FIN was delivered: their frames are duplicates.
    closed: IdRanges,
    /// Bound on `closed`'s ranges (see the parent module).
    max_closed_ranges: usize,
    window: u64,
    max_flows: usize,
    credit_pending: VecDeque<u64>,
    /// Where a message's body starts (see the module documentation).
    body_at: BodyAt,
    /// Fragment lists of reassembled messages, reused for the next ones
    /// (at most [`SPARE_LISTS`]; the buffers go back to the pool).
    spare: Vec<Vec<(u32, u32)>>,
    pub offset_mismatches: u64,
    /// Reassembled messages whose head was guessed wrong (fragment 0 came
    /// after another fragment, and the flow's previous message had a
    /// header of another length): their bytes were moved once more.
    pub misplaced: u64,
    /// Flows closed by their FIN.
    pub flows_closed: u64,
    /// Frames of closed flows (late duplicates), dropped.
    pub closed_frames: u64,
    /// FINs refused because the closed set is at its bound (the flow stays
    /// open here; an honest peer never causes one).
    pub closed_overflow: u64,
}

/// `body_at` of a message's first bytes, as a head length (0: whole in
/// the body).
fn head_len(body_at: BodyAt, first: &[u8], total: usize) -> usize {
    match body_at(first) {
        Some(n) if n <= MAX_HEAD && n <= total => n,
        _ => 0,
    }
}

/// Fragment lists kept for reuse.
const SPARE_LISTS: usize = 64;

impl RecvFlows {
    /// Bytes of per-flow state: the flow table as allocated, and each
    /// partly received message's record (its bytes are buffers, not
    /// counted; a B-tree node's overhead is left out too).
    pub fn state_bytes(&self) -> usize {
        self.flows.capacity() * (std::mem::size_of::<(u64, RecvFlow)>() + 1)
            + self
                .flows
                .values()
                .map(|f| f.buffer.len() * std::mem::size_of::<(u64, Partial)>())
                .sum::<usize>()
    }

    /// Flows whose messages are delivered whole (no head kept apart); see
    /// [`with_body_at`](Self::with_body_at).
    pub fn new(window: u64, max_flows: usize) -> RecvFlows {
        RecvFlows {
            flows: KeyedMap::default(),
            closed: IdRanges::default(),
            max_closed_ranges: max_flows.saturating_mul(2).saturating_add(1),
            window,
            max_flows,
            credit_pending: VecDeque::new(),
            body_at: |_| None,
            spare: Vec::new(),
            offset_mismatches: 0,
            misplaced: 0,
            flows_closed: 0,
            closed_frames: 0,
            closed_overflow: 0,
        }
    }

    /// Reassembled messages keep the head `body_at` finds apart from the
    /// body, so that the body needs no copy to be used alone.
    pub fn with_body_at(mut self, body_at: BodyAt) -> RecvFlows {
        self.body_at = body_at;
        self
    }

    /// Accepts one DATA frame; hands every message now complete in order to
    /// `deliver(flow, message, pool)`. Reassembly buffers come from `pool`
    /// and are handed over with their message (see the module
    /// documentation).
    ///
    /// Fast path: the next expected message, whole in this frame (the usual
    /// case with jumbo datagrams), goes to `deliver` straight from the
    /// packet: no reassembly buffer is taken, zeroed or copied into.
    /// Only fragments and out-of-order messages are buffered.
    pub fn on_data(
        &mut self,
        d: &DataFrame<'_>,
        pool: &mut PacketPool,
        deliver: &mut impl FnMut(u64, Message<'_>, &mut PacketPool),
    ) -> DataOutcome {
        let (window, body_at) = (self.window, self.body_at);
        let flows = self.flows.len();
        let full = flows >= self.max_flows;
        let f = match self.flows.entry(d.flow) {
            Entry::Occupied(o) => o.into_mut(),
            // (Looked up only for ids without a flow: not on the fast path.)
            Entry::Vacant(_) if self.closed.contains(d.flow) => {
                self.closed_frames += 1;
                return DataOutcome::Duplicate;
            }
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
            deliver(d.flow, Message::InFrame(d.bytes), pool);
        } else {
            if !buffered {
                // The head's length: from fragment 0 if this is it, else
                // the flow's last (checked when the message completes).
                let skip = if d.frag_off == 0 {
                    let first = &d.bytes[..d.bytes.len().min(MAX_HEAD)];
                    head_len(body_at, first, d.total as usize) as u8
                } else {
                    f.skip_guess.min(d.total.min(MAX_HEAD as u32) as u8)
                };
                f.buffered_bytes += total;
                let mut body = pool.take();
                body.resize(d.total as usize - usize::from(skip), 0);
                let mut frags = self.spare.pop().unwrap_or_default();
                frags.clear();
                f.buffer.insert(
                    d.seq,
                    Partial {
                        offset: d.offset,
                        total: d.total,
                        head: [0; MAX_HEAD],
                        skip,
                        body,
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
            p.write(start as usize, d.bytes);
            p.frags.push((start, len));
            p.received += len;
        }
        // Deliver whatever is now complete at the head of the flow.
        while let Some(entry) = f.buffer.first_entry() {
            if *entry.key() != f.next_seq || !entry.get().complete() {
                break;
            }
            let mut p = entry.remove();
            f.buffered_bytes -= u64::from(p.total);
            if p.offset != f.next_offset {
                self.offset_mismatches += 1;
            }
            f.next_offset = p.offset + u64::from(p.total);
            f.next_seq += 1;
            let (first, n) = p.first_bytes();
            let want = head_len(body_at, &first[..n], p.total as usize);
            if p.place_head(want) {
                self.misplaced += 1;
            }
            f.skip_guess = p.skip;
            let head = &p.head[..want];
            deliver(d.flow, Message::Reassembled { head, body: p.body }, pool);
            if self.spare.len() < SPARE_LISTS {
                self.spare.push(p.frags);
            }
        }
        DataOutcome::Accepted
    }

    /// The peer closes `flow` after its message `seq - 1`. In sequence (all
    /// of them delivered, nothing buffered beyond) the flow is dropped and
    /// its id remembered as closed; a FIN of a closed flow is a duplicate;
    /// anything else breaks the protocol (see the parent module).
    pub fn on_fin(&mut self, flow: u64, seq: u64) -> DataOutcome {
        let Some(f) = self.flows.get(&flow) else {
            if self.closed.contains(flow) {
                self.closed_frames += 1;
                return DataOutcome::Duplicate;
            }
            return DataOutcome::Violation;
        };
        if seq != f.next_seq || !f.buffer.is_empty() {
            return DataOutcome::Violation;
        }
        if !self.closed.insert(flow, self.max_closed_ranges) {
            self.closed_overflow += 1;
            return DataOutcome::Accepted;
        }
        // (A credit still queued for it finds no flow and is skipped.)
        self.flows.remove(&flow);
        self.flows_closed += 1;
        DataOutcome::Accepted
    }

    /// Open flows.
    pub fn flow_count(&self) -> usize {
        self.flows.len()
    }

    /// Ranges in the closed-id set.
    pub fn closed_ranges(&self) -> usize {
        self.closed.ranges()
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
        self.closed.clear();
        self.credit_pending.clear();
    }

    /// Bytes waiting in reorder buffers.
    pub fn buffered_bytes(&self) -> u64 {
        self.flows.values().map(|f| f.buffered_bytes).sum()
    }
}
