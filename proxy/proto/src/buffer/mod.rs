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

pub use packet::{Lease, Lender, LenderRef, PacketBuf};
pub use pool::{LendSource, PacketPool, PoolStats};
pub use slab::{PacketSlab, SlabError, SlotHandle, MAX_SLOTS, MAX_SLOT_BYTES};

use crate::keyed::{Keyed, KeyedMap};

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
    /// What each flow holding any slot holds and was promised, in one
    /// table so that each call looks a flow up once (these lookups run
    /// several times per packet). The ids are hashes of what the data
    /// center sends, so the table is keyed (`crate::keyed`); it is only ever
    /// looked up, never walked, so a random key changes no output.
    flows: KeyedMap<u64, FlowUse>,
    promised: usize,
    /// The flows waiting for room in the shared slab, served in turn
    /// (`room`).
    room: room::RoomQueue,
}

/// One flow's share of the buffer.
#[derive(Clone, Copy, Debug, Default)]
struct FlowUse {
    /// Slots it holds (never 0 in the table: a flow holding none is
    /// forgotten).
    used: usize,
    /// Slots it may be sent more of without notice (its requester's
    /// window past the last pseudo-ACK, `qp::ingress`): the shared slab
    /// must keep the sum of these free, since every such flow may use its
    /// window at once. Forgotten with the flow's last slot (so a vanished
    /// flow cannot pin a promise).
    promised: usize,
}

impl DeepBuffer {
    /// `slots` slots of `slot_bytes` each; a flow may hold `per_flow_slots`.
    pub fn new(slots: usize, slot_bytes: usize, per_flow_slots: usize) -> DeepBuffer {
        DeepBuffer {
            slab: PacketSlab::new(slots, slot_bytes),
            per_flow_slots: per_flow_slots.min(slots).max(1),
            flows: KeyedMap::with_hasher(Keyed::random()),
            promised: 0,
            room: room::RoomQueue::new(),
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
                Ok(h)
            }
            None => {
                let h = self.slab.alloc(bytes).ok_or(Refused::SiteFull)?;
                let first = FlowUse {
                    used: 1,
                    promised: 0,
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

    /// Records that `flow` (which holds slots) may be sent up to `slots`
    /// more packets without a new ACK. Ignored for a flow holding none.
    pub fn promise(&mut self, flow: u64, slots: usize) {
        if let Some(f) = self.flows.get_mut(&flow) {
            if slots < f.promised {
                // Less to keep free: a waiting flow may now fit.
                self.room.note_freed();
            }
            self.promised = self.promised - f.promised + slots;
            f.promised = slots;
        }
    }

    /// `flow`'s promise (0 for a flow holding no slot).
    pub fn promise_of(&self, flow: u64) -> usize {
        self.flows.get(&flow).map_or(0, |f| f.promised)
    }

    /// The sum of the promises of the flows holding slots.
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
    fn promises_sum_over_flows_holding_slots_and_go_with_their_last_slot() {
        let mut b = DeepBuffer::new(64, 64, 64);
        b.promise(1, 10);
        assert_eq!(b.promised(), 0, "a flow holding nothing promises nothing");
        let h1 = b.reserve(1, 8).unwrap();
        let h2 = b.reserve(2, 8).unwrap();
        b.promise(1, 10);
        b.promise(2, 5);
        b.promise(1, 12);
        assert_eq!(b.promised(), 17);
        b.release(1, h1);
        assert_eq!(b.promised(), 5, "flow 1 holds nothing: its promise is gone");
        b.release(2, h2);
        assert_eq!(b.promised(), 0);
        assert_eq!(b.free_slots(), 64);
    }
}
