//! The deep buffer: where packets wait while the WAN carries them.
//!
//! A preallocated [`slab::PacketSlab`] of fixed-size slots addressed by small
//! handles (no allocation per packet), with per-flow and per-site quotas
//! ([`DeepBuffer`]). Occupancy and high-water marks are kept for export.
//!
//! Packets are [`PacketBuf`]s: a heap vector, or bytes an I/O backend lent
//! (`packet`). Packets in transit between stages (not held) live in
//! recycled heap buffers: [`pool::PacketPool`].

pub mod packet;
pub mod pool;
mod room;
pub mod slab;
mod sojourn;

pub use packet::{Lease, Lender, LenderRef, PacketBuf};
pub use pool::{LendSource, PacketPool, PoolStats};
pub use slab::{PacketSlab, SlabError, SlotHandle, MAX_SLOTS, MAX_SLOT_BYTES};

use std::collections::VecDeque;
use std::time::Duration;

use crate::keyed::{Keyed, KeyedMap};
use crate::time::Time;

/// How long a promise to a flow that holds no slot lasts
/// ([`DeepBuffer::promise`]). Such a promise is made when a pseudo-ACK or
/// a NAK lets a requester whose packets have all left the buffer send its
/// window again; its first packets arrive a data-center round trip later
/// (microseconds; a busy host's requester may take a scheduling delay
/// more), and from the first one on the flow holds a slot and its promise
/// is the ordinary one. Until then the promise must count, or every flow
/// granted in the same round sees the same free slots and their windows
/// together overrun the buffer (over-subscribed sweep seed 61: seven owed
/// NAKs sent at once, each QP's resend dropped again). It must not last:
/// a requester that sends nothing more (its application is done) would pin
/// room it never uses. One millisecond is the hold interval by which the
/// ingress judges a requester stopped (`qp::ingress::HOLD_ACK_INTERVAL`)
/// too: a requester silent that long after a grant is not about to use it.
pub const PROMISE_WITHOUT_SLOTS_FOR: Duration = Duration::from_millis(1);

/// Why the buffer refused a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The whole site's buffer is full.
    SiteFull,
    /// This flow used its quota.
    FlowQuota,
    /// Larger than a slot (the configured MTU is too large for `slot_bytes`).
    TooLarge,
}

/// Occupancy figures for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    pub slots_used: usize,
    pub slots_total: usize,
    pub high_water: usize,
}

/// A slab plus quotas, keyed by a flow id chosen by the caller.
pub struct DeepBuffer {
    slab: PacketSlab,
    per_flow_slots: usize,
    /// What each flow holding any slot, or promised room while it holds
    /// none, holds and was promised, in one table so that each call looks
    /// a flow up once (these lookups run several times per packet). The ids
    /// are hashes of what the data center sends, so the table is keyed
    /// (`crate::keyed`); it is only ever looked up, never walked, so a
    /// random key changes no output.
    flows: KeyedMap<u64, FlowUse>,
    promised: usize,
    /// The promises to flows holding no slot, by when they lapse
    /// ([`PROMISE_WITHOUT_SLOTS_FOR`]), oldest first (the deadlines only
    /// grow: each is a promise's time plus the same span). An entry whose
    /// flow took a slot or was promised again since is skipped when due.
    lapsing: VecDeque<(Time, u64)>,
    /// The flows waiting for room in the shared slab, served in turn
    /// (`room`).
    room: room::RoomQueue,
    /// How long delivered packets stood in it (`sojourn`).
    sojourn: sojourn::SojournMeter,
    /// A pseudo-ACK was withheld since [`Self::take_pressure`] last
    /// looked.
    pushed_back: bool,
}

/// One flow's share of the buffer.
#[derive(Clone, Copy, Debug, Default)]
struct FlowUse {
    /// Slots it holds: 0 only while a promise made to it without slots
    /// lasts (`lapses`); a flow holding none is otherwise forgotten.
    used: usize,
    /// Slots it may be sent more of without notice (its requester's
    /// window past the last pseudo-ACK, `qp::ingress`): the shared slab
    /// must keep the sum of these free, since every such flow may use its
    /// window at once. Forgotten with the flow's last slot, or when it
    /// lapses if made while the flow held none (so a vanished flow cannot
    /// pin a promise).
    promised: usize,
    /// When a promise made while the flow held no slot lapses; `None` once
    /// it holds one.
    lapses: Option<Time>,
}

impl DeepBuffer {
    /// `slots` slots of `slot_bytes` each; a flow may hold `per_flow_slots`.
    pub fn new(slots: usize, slot_bytes: usize, per_flow_slots: usize) -> DeepBuffer {
        DeepBuffer {
            slab: PacketSlab::new(slots, slot_bytes),
            per_flow_slots: per_flow_slots.min(slots).max(1),
            flows: KeyedMap::with_hasher(Keyed::random()),
            promised: 0,
            lapsing: VecDeque::new(),
            room: room::RoomQueue::new(),
            sojourn: sojourn::SojournMeter::default(),
            pushed_back: false,
        }
    }

    /// A new per-flow quota (a reload), within the slots allocated at
    /// start. A flow above a lowered quota keeps what it holds and gets no
    /// new slot until it is below: backpressure, never a drop.
    pub fn set_per_flow_slots(&mut self, per_flow_slots: usize) {
        self.per_flow_slots = per_flow_slots.min(self.slab.capacity()).max(1);
        self.room.note_freed();
    }

    pub fn per_flow_slots(&self) -> usize {
        self.per_flow_slots
    }

    /// Stores a copy of `bytes` for `flow`.
    pub fn store(&mut self, flow: u64, bytes: &[u8]) -> Result<SlotHandle, Refused> {
        self.take_slot(flow, bytes.len(), bytes)
    }

    /// Reserves a slot for `flow` for a packet of `len` bytes held
    /// elsewhere (in place, in the pooled buffer it arrived in) and not
    /// copied here: the slot stands for that packet in the quotas and
    /// occupancy, so the buffer's bounds hold as if it were stored. The
    /// engine's halves hold packets this way (no copy), see `qp`.
    pub fn reserve(&mut self, flow: u64, len: usize) -> Result<SlotHandle, Refused> {
        self.take_slot(flow, len, &[])
    }

    /// One lookup for a flow that holds slots (the steady state); a new
    /// flow is entered only once the slab gave it a slot.
    fn take_slot(&mut self, flow: u64, len: usize, bytes: &[u8]) -> Result<SlotHandle, Refused> {
        if len > self.slab.slot_bytes() {
            return Err(Refused::TooLarge);
        }
        match self.flows.get_mut(&flow) {
            Some(f) => {
                if f.used >= self.per_flow_slots {
                    return Err(Refused::FlowQuota);
                }
                let h = self.slab.alloc(bytes).ok_or(Refused::SiteFull)?;
                f.used += 1;
                // Holding a slot, its promise lasts as long as it does.
                f.lapses = None;
                Ok(h)
            }
            None => {
                let h = self.slab.alloc(bytes).ok_or(Refused::SiteFull)?;
                let first = FlowUse {
                    used: 1,
                    promised: 0,
                    lapses: None,
                };
                self.flows.insert(flow, first);
                Ok(h)
            }
        }
    }

    /// Frees a slot held by `flow`.
    pub fn release(&mut self, flow: u64, h: SlotHandle) {
        self.slab.free(h);
        self.room.note_freed();
        if let Some(f) = self.flows.get_mut(&flow) {
            f.used -= 1;
            if f.used == 0 {
                self.promised -= f.promised;
                self.flows.remove(&flow);
            }
        }
    }

    pub fn get(&self, h: SlotHandle) -> &[u8] {
        self.slab.get(h)
    }

    pub fn get_mut(&mut self, h: SlotHandle) -> &mut [u8] {
        self.slab.get_mut(h)
    }

    /// Slots `flow` holds now.
    pub fn flow_slots(&self, flow: u64) -> usize {
        self.flows.get(&flow).map_or(0, |f| f.used)
    }

    /// Flows holding slots or promised room.
    pub fn flow_count(&self) -> usize {
        self.flows.len()
    }

    /// Whether `flow` holds at least an equal share of the slots in use
    /// among the flows holding or promised any.
    pub fn holds_mean_share(&self, flow: u64) -> bool {
        let used = self.capacity() - self.free_slots();
        self.flow_slots(flow) * self.flows.len().max(1) >= used
    }

    /// A packet admitted at `admitted` was delivered at `now` (its slot
    /// is released separately): one sample of the standing queue.
    pub fn note_transit(&mut self, admitted: Time, now: Time) {
        self.sojourn.note(admitted, now);
    }

    /// A pseudo-ACK was withheld for want of room.
    pub fn note_pushback(&mut self) {
        self.pushed_back = true;
    }

    /// Whether the buffer pushed back, or its last delivered packet stood
    /// `queue` or more beyond the path's delay, since the last
    /// [`Self::take_pressure`]: reasons for the pacer to look.
    pub fn under_pressure(&self, queue: Duration) -> bool {
        self.pushed_back || self.sojourn.last_excess() >= queue
    }

    /// [`Self::under_pressure`], and forget the push-back seen so far.
    pub fn take_pressure(&mut self, queue: Duration) -> bool {
        let p = self.under_pressure(queue);
        self.pushed_back = false;
        p
    }

    /// How long packets stood in the buffer beyond the path's own delay,
    /// over the last `interval` (`sojourn`).
    pub fn standing_queue(&mut self, now: Time, interval: Duration) -> Duration {
        self.sojourn.standing(now, interval)
    }

    /// Slots still free for `flow`, the lesser of its quota and the site's.
    pub fn headroom(&self, flow: u64) -> usize {
        // Saturating: a reload may lower the quota below a flow's use.
        let flow_left = self.per_flow_slots.saturating_sub(self.flow_slots(flow));
        flow_left.min(self.slab.free_slots())
    }

    /// Slots free in the whole buffer.
    pub fn free_slots(&self) -> usize {
        self.slab.free_slots()
    }

    pub fn capacity(&self) -> usize {
        self.slab.capacity()
    }

    /// Records that `flow` may be sent up to `slots` more packets without a
    /// new ACK. A flow holding no slot is promised for
    /// [`PROMISE_WITHOUT_SLOTS_FOR`] after `now` (until it takes a slot,
    /// when the promise lasts as long as it holds one); [`Self::lapse`]
    /// forgets it after that.
    pub fn promise(&mut self, flow: u64, slots: usize, now: Time) {
        let lapses = now + PROMISE_WITHOUT_SLOTS_FOR;
        let f = match self.flows.get_mut(&flow) {
            Some(f) => f,
            None if slots == 0 => return,
            None => self.flows.entry(flow).or_default(),
        };
        if slots < f.promised {
            // Less to keep free: a waiting flow may now fit.
            self.room.note_freed();
        }
        self.promised = self.promised - f.promised + slots;
        f.promised = slots;
        if f.used == 0 {
            f.lapses = Some(lapses);
            self.lapsing.push_back((lapses, flow));
        }
    }

    /// When the oldest promise to a flow holding no slot lapses, for the
    /// owner's timer ([`Self::lapse`] then).
    pub fn next_lapse(&self) -> Option<Time> {
        self.lapsing.front().map(|&(t, _)| t)
    }

    /// Forgets the promises to flows holding no slot that lapsed by `now`
    /// ([`PROMISE_WITHOUT_SLOTS_FOR`]): the room they kept is free for the
    /// flows waiting for it.
    pub fn lapse(&mut self, now: Time) {
        while let Some(&(t, flow)) = self.lapsing.front() {
            if t > now {
                break;
            }
            self.lapsing.pop_front();
            // Only if this is still its promise: it may have taken a slot,
            // or been promised again later, since.
            if let Some(f) = self.flows.get(&flow) {
                if f.used == 0 && f.lapses == Some(t) {
                    self.promised -= f.promised;
                    self.flows.remove(&flow);
                    self.room.note_freed();
                }
            }
        }
    }

    /// `flow`'s promise (0 for a flow holding no slot and promised none).
    pub fn promise_of(&self, flow: u64) -> usize {
        self.flows.get(&flow).map_or(0, |f| f.promised)
    }

    /// The sum of the promises of the flows holding slots, and of those
    /// holding none whose promise has not lapsed.
    pub fn promised(&self) -> usize {
        self.promised
    }

    /// May `flow` take room in the shared slab now: no flow waits for
    /// room, or `flow` is the first that does (`room`: first come, first
    /// served, so that a flow with no deliveries of its own is not starved
    /// by flows whose deliveries re-check them first).
    pub fn is_turn_of(&self, flow: u64) -> bool {
        self.room.is_turn_of(flow)
    }

    /// `flow` must wait for room in the shared slab; it keeps its place if
    /// it already waits.
    pub fn wait_for_room(&mut self, flow: u64) {
        self.room.wait(flow);
    }

    /// `flow` no longer waits for room (it took it, needs none, or is
    /// gone).
    pub fn stop_waiting(&mut self, flow: u64) {
        self.room.leave(flow);
    }

    /// The flow whose turn it is, if any waits.
    pub fn first_waiting(&self) -> Option<u64> {
        self.room.first()
    }

    /// Flows waiting for room.
    pub fn waiting(&self) -> usize {
        self.room.len()
    }

    /// Whether room may have appeared for the first waiting flow since the
    /// last call (slots freed, promises shrunk, the quota raised, the first
    /// waiter gone): the engine then offers it the room
    /// (`QpEngine::serve_room_waiters`). False while nobody waits.
    pub fn room_freed(&mut self) -> bool {
        self.room.take_freed()
    }

    pub fn occupancy(&self) -> Occupancy {
        Occupancy {
            slots_used: self.slab.used_slots(),
            slots_total: self.slab.capacity(),
            high_water: self.slab.high_water(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_refuse_and_release_restores() {
        let mut b = DeepBuffer::new(4, 64, 3);
        let h: Vec<_> = (0..3).map(|i| b.store(1, &[i; 10]).unwrap()).collect();
        assert_eq!(b.store(1, &[9]), Err(Refused::FlowQuota));
        let other = b.store(2, &[7; 5]).unwrap();
        assert_eq!(b.store(3, &[7]), Err(Refused::SiteFull));
        assert_eq!(b.store(3, &[0; 65]), Err(Refused::TooLarge));
        assert_eq!(b.get(h[1]), &[1; 10]);
        assert_eq!(b.get(other), &[7; 5]);
        b.release(1, h[0]);
        assert_eq!(b.headroom(1), 1);
        assert_eq!(b.flow_slots(1), 2);
        b.store(3, &[1]).unwrap();
        assert_eq!(b.occupancy().high_water, 4);
        for x in &h[1..] {
            b.release(1, *x);
        }
        assert_eq!(b.flow_slots(1), 0);
        assert_eq!(b.occupancy().slots_used, 2);
    }

    #[test]
    fn promises_sum_over_flows_and_go_with_their_last_slot() {
        let t0 = Time::ZERO;
        let mut b = DeepBuffer::new(64, 64, 64);
        let h1 = b.reserve(1, 8).unwrap();
        let h2 = b.reserve(2, 8).unwrap();
        b.promise(1, 10, t0);
        b.promise(2, 5, t0);
        b.promise(1, 12, t0);
        assert_eq!(b.promised(), 17);
        assert_eq!(b.next_lapse(), None, "flows holding slots do not lapse");
        b.release(1, h1);
        assert_eq!(b.promised(), 5, "flow 1 holds nothing: its promise is gone");
        b.release(2, h2);
        assert_eq!(b.promised(), 0);
        assert_eq!(b.free_slots(), 64);
    }

    #[test]
    fn a_promise_to_a_flow_holding_nothing_counts_until_it_lapses() {
        let t0 = Time::ZERO;
        let mut b = DeepBuffer::new(64, 64, 64);
        b.promise(1, 10, t0);
        b.promise(2, 0, t0);
        assert_eq!(b.promised(), 10, "granted a window, flow 1 may use it");
        assert_eq!(b.promise_of(2), 0);
        let due = t0 + PROMISE_WITHOUT_SLOTS_FOR;
        assert_eq!(b.next_lapse(), Some(due));
        b.lapse(t0 + (PROMISE_WITHOUT_SLOTS_FOR - Duration::from_nanos(1)));
        assert_eq!(b.promised(), 10);
        b.wait_for_room(3);
        let _ = b.room_freed(); // whatever came before the lapse
        b.lapse(due);
        assert_eq!(b.promised(), 0, "lapsed: the room is free again");
        assert!(b.room_freed(), "a waiting flow is offered the room");
        assert_eq!(b.next_lapse(), None);
    }

    #[test]
    fn a_promise_made_without_slots_lasts_once_the_flow_takes_one() {
        let t0 = Time::ZERO;
        let mut b = DeepBuffer::new(64, 64, 64);
        b.promise(1, 10, t0);
        let h = b.reserve(1, 8).unwrap();
        b.promise(1, 9, t0);
        b.lapse(t0 + 10 * PROMISE_WITHOUT_SLOTS_FOR);
        assert_eq!(b.promised(), 9, "holding a slot, its promise stays");
        b.release(1, h);
        assert_eq!(b.promised(), 0);
        // Promised again later: the earlier deadline does not end it.
        let t1 = t0 + PROMISE_WITHOUT_SLOTS_FOR / 2;
        b.promise(4, 3, t0);
        b.promise(4, 3, t1);
        b.lapse(t0 + PROMISE_WITHOUT_SLOTS_FOR);
        assert_eq!(b.promised(), 3);
        b.lapse(t1 + PROMISE_WITHOUT_SLOTS_FOR);
        assert_eq!(b.promised(), 0);
    }
}
