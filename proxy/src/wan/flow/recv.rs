//! The receiving half of all flows: reassembly, reorder buffers, credit,
//! and the memory of closed flows (see the parent module).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, VecDeque};

use crate::keyed::KeyedMap;

use super::closed::IdRanges;
use super::{DataOutcome, MAX_FRAGMENTS, MAX_MESSAGE};

use super::super::packet::{DataFrame, Frame, Writer};
use super::super::recovery::SentFrame;

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
    /// The buffers of reassembled messages, reused for the next ones: when
    /// messages are cut into fragments (a 1500-byte MTU path cuts every
    /// 4 KiB request in four) each of them is reassembled, and fresh
    /// vectors were two allocations per message. At most [`SPARE_PARTIALS`].
    spare: Vec<Spare>,
    pub offset_mismatches: u64,
    /// Flows closed by their FIN.
    pub flows_closed: u64,
    /// Frames of closed flows (late duplicates), dropped.
    pub closed_frames: u64,
    /// FINs refused because the closed set is at its bound (the flow stays
    /// open here; an honest peer never causes one).
    pub closed_overflow: u64,
}

/// Reassembly buffers kept for reuse (at most 64 × the largest message).
const SPARE_PARTIALS: usize = 64;

/// A reassembled message's data and fragment list, for reuse.
type Spare = (Vec<u8>, Vec<(u32, u32)>);

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

    pub fn new(window: u64, max_flows: usize) -> RecvFlows {
        RecvFlows {
            flows: KeyedMap::default(),
            closed: IdRanges::default(),
            max_closed_ranges: max_flows.saturating_mul(2).saturating_add(1),
            window,
            max_flows,
            credit_pending: VecDeque::new(),
            spare: Vec::new(),
            offset_mismatches: 0,
            flows_closed: 0,
            closed_frames: 0,
            closed_overflow: 0,
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
