//! Runs of the UMEM lent to the site's pools: toward the DC (gateway B),
//! the WAN decode writes a packet straight into UMEM, the egress holds it
//! there, and [`XdpDc::send`](super::XdpDc::send) sends it by offset, its
//! Ethernet header written into the room left before it. The decode is the
//! one user-space copy (issue 16).
//!
//! Layout: after the chunks of the fill ring and the TX rings, `count`
//! regions of two aligned 4 KiB chunks ([`REGION`]); a lent buffer is a
//! region less its first [`HEADROOM`] bytes. A packet of up to
//! `REGION - HEADROOM` bytes goes out as at most two chained descriptors
//! (the first one chunk-bounded, as aligned mode wants).
//!
//! A region is free, lent (a `PacketBuf` names it), or being sent (TX
//! descriptors name it, counted in `tx`); often both of the last two. It
//! is lent again only once neither holds: a buffer dropped while its
//! descriptors are out is marked `returned` and freed by the completion
//! of its last one. A held packet resent while still out is sent by the
//! copying path, and one about to be rewritten (AckReq) moves to the heap
//! first (`Lender::in_flight`): the kernel never reads bytes being
//! rewritten.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use soya_proto::buffer::{Lease, LendSource, Lender, LenderRef, PacketBuf};

use super::{lock, Shared, CHUNK, ETH};

/// Bytes of a lent region: two aligned UMEM chunks, for a 4176-byte RoCE
/// packet (4096-byte MTU) and its Ethernet header.
pub const REGION: usize = 2 * CHUNK;
/// Room before the packet for the Ethernet header, written at send.
pub const HEADROOM: usize = ETH;
/// Most regions a gateway lends (64 MiB of UMEM): see
/// [`regions_for`].
pub const MAX_REGIONS: usize = 8192;

/// How many regions to lend for a site whose deep buffer has `slots`
/// slots, over `shards` shards: the held set toward the DC is bounded by
/// the slots (the reinjector holds each request in one), plus what is in
/// transit between the decode and the TX ring (a TX ring's worth per
/// shard); capped at [`MAX_REGIONS`]. Past that the pools fall back to
/// heap buffers and the backend to the copying send (counted: never a
/// stall).
pub fn regions_for(slots: u64, shards: usize) -> usize {
    let want = slots.saturating_add((shards * super::RING as usize) as u64);
    want.min(MAX_REGIONS as u64) as usize
}

/// Counters of the lent regions (all shards).
#[derive(Default)]
pub struct LendCounters {
    /// Buffers lent.
    pub lent: AtomicU64,
    /// Lends refused: every region out (the pool used the heap).
    pub empty: AtomicU64,
    /// Packets sent in place, by offset.
    pub sent_in_place: AtomicU64,
    /// Lent packets sent by copying because their region was still being
    /// sent (a resend before the previous send completed).
    pub busy_copied: AtomicU64,
    /// Held packets moved to the heap before a rewrite (AckReq) because
    /// their region was still being sent.
    pub rewrites_moved: AtomicU64,
}

/// The lent regions of one UMEM.
pub(super) struct Regions {
    /// Offset in the area of region 0.
    first: u64,
    count: usize,
    state: Mutex<State>,
    pub counters: LendCounters,
}

struct State {
    free: Vec<u32>,
    /// TX descriptors naming each region not yet completed.
    tx: Vec<u16>,
    /// Given back by its buffer while descriptors were out.
    returned: Vec<bool>,
    /// Each region's lease box while the region is not lent (made at its
    /// first lend, then reused: lending allocates nothing after that).
    leases: Vec<Option<Box<Lease>>>,
}

impl Regions {
    pub fn new(first: u64, count: usize) -> Regions {
        Regions {
            first,
            count,
            state: Mutex::new(State {
                // Popped from the end: region 0 first.
                free: (0..count as u32).rev().collect(),
                tx: vec![0; count],
                returned: vec![false; count],
                leases: (0..count).map(|_| None).collect(),
            }),
            counters: LendCounters::default(),
        }
    }

    /// Bytes of UMEM the regions take.
    pub fn bytes(count: usize) -> usize {
        count * REGION
    }

    /// Bytes of UMEM these regions take.
    pub fn bytes_lent(&self) -> usize {
        Regions::bytes(self.count)
    }

    /// The region whose area offset range holds `off`.
    pub fn of_offset(&self, off: u64) -> Option<u32> {
        let rel = off.checked_sub(self.first)?;
        let r = rel / REGION as u64;
        (r < self.count as u64).then_some(r as u32)
    }

    /// Area offset of region `r`'s first byte (its headroom).
    pub fn offset(&self, r: u32) -> u64 {
        self.first + u64::from(r) * REGION as u64
    }

    /// The region lent as the run at area offset `off` (the buffer's
    /// first byte): only an exact run start counts.
    pub fn of_run(&self, off: u64) -> Option<u32> {
        let r = self.of_offset(off)?;
        (off == self.offset(r) + HEADROOM as u64).then_some(r)
    }

    #[cfg(test)]
    fn take(&self) -> Option<u32> {
        self.take_lease().map(|(r, _)| r)
    }

    /// A free region and its lease box, if it was lent before.
    fn take_lease(&self) -> Option<(u32, Option<Box<Lease>>)> {
        let mut s = lock(&self.state);
        let r = s.free.pop()?;
        Some((r, s.leases[r as usize].take()))
    }

    #[cfg(test)]
    fn give_back(&self, r: u32) {
        self.give_back_lease(r, None)
    }

    /// Region `r`'s buffer is dropped; its lease box (if any) is kept for
    /// the region's next lend.
    fn give_back_lease(&self, r: u32, lease: Option<Box<Lease>>) {
        let mut s = lock(&self.state);
        if lease.is_some() {
            s.leases[r as usize] = lease;
        }
        if s.tx[r as usize] > 0 {
            s.returned[r as usize] = true;
        } else {
            s.free.push(r);
        }
    }

    fn in_flight(&self, r: u32) -> bool {
        lock(&self.state).tx[r as usize] > 0
    }

    /// Marks `descs` descriptors of region `r` as going out; `false` (and
    /// nothing marked) when earlier ones are still out.
    pub fn begin_send(&self, r: u32, descs: u16) -> bool {
        let mut s = lock(&self.state);
        if s.tx[r as usize] > 0 {
            return false;
        }
        s.tx[r as usize] = descs;
        true
    }

    /// A completion for a descriptor of region `r`.
    pub fn completed(&self, r: u32) {
        let mut s = lock(&self.state);
        let t = &mut s.tx[r as usize];
        *t = t.saturating_sub(1);
        if *t == 0 && s.returned[r as usize] {
            s.returned[r as usize] = false;
            s.free.push(r);
        }
    }

    /// Regions lent or being sent (for tests and metrics).
    pub fn out(&self) -> usize {
        self.count - lock(&self.state).free.len()
    }
}

/// What a lent buffer goes back to: the shared UMEM (kept mapped while
/// any buffer names it).
struct Back(Arc<Shared>);

impl Back {
    fn region(&self, lease: &Lease) -> u32 {
        let off = (lease.addr() - self.0.area.base() as usize) as u64;
        self.0
            .lend
            .of_run(off)
            .expect("a lent run comes back where it was lent")
    }
}

impl Lender for Back {
    fn give_back(&self, mut lease: Box<Lease>) {
        let r = self.region(&lease);
        // The run is forgotten before the box is kept: a kept lease names
        // no memory (see `Area::lend_run`).
        lease.clear();
        self.0.lend.give_back_lease(r, Some(lease));
    }

    fn in_flight(&self, lease: &Lease) -> bool {
        let busy = self.0.lend.in_flight(self.region(lease));
        if busy {
            self.0
                .lend
                .counters
                .rewrites_moved
                .fetch_add(1, Ordering::Relaxed);
        }
        busy
    }
}

/// The site's pools take buffers here (`Site::set_lender`).
pub struct UmemSource {
    shared: Arc<Shared>,
    back: LenderRef,
}

impl UmemSource {
    pub(super) fn new(shared: Arc<Shared>) -> UmemSource {
        let back = LenderRef::new(Box::new(Back(shared.clone())));
        UmemSource { shared, back }
    }
}

impl LendSource for UmemSource {
    fn lend(&self) -> Option<PacketBuf> {
        let lend = &self.shared.lend;
        let Some((r, lease)) = lend.take_lease() else {
            lend.counters.empty.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        lend.counters.lent.fetch_add(1, Ordering::Relaxed);
        let off = lend.offset(r) as usize + HEADROOM;
        // SAFETY (`Area::lend_run`): `off .. off + REGION - HEADROOM` is
        // inside the area (the regions were sized into it; `lend_run`
        // checks) and region `r` was free: no buffer, no ring names it
        // until the buffer gives it back (`Back`, which clears the lease).
        // The area stays mapped while the lease is out: the buffer holds
        // `back`, which holds `Shared`, which holds the area.
        let run = unsafe { self.shared.area.lend_run(off, REGION - HEADROOM) };
        let lease = match lease {
            Some(mut l) => {
                l.set_run(run);
                l
            }
            None => Lease::new(run),
        };
        Some(PacketBuf::lent(lease, 0, &self.back))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_lent_again_only_when_neither_a_buffer_nor_a_descriptor_names_it() {
        let first = 10 * CHUNK as u64;
        let g = Regions::new(first, 2);
        let (a, b) = (g.take().unwrap(), g.take().unwrap());
        assert_eq!((a, b, g.take()), (0, 1, None));
        assert_eq!(g.of_run(g.offset(b) + HEADROOM as u64), Some(b));
        assert_eq!(g.of_run(g.offset(b)), None, "only a run's start");
        assert_eq!(g.of_offset(first + 2 * REGION as u64), None);
        assert_eq!(g.of_offset(first - 1), None);

        // Sent as two descriptors, then dropped by its holder.
        assert!(g.begin_send(a, 2));
        assert!(g.in_flight(a));
        assert!(!g.begin_send(a, 2), "not sent again while out");
        g.give_back(a);
        assert_eq!(g.out(), 2, "still named by the TX ring");
        g.completed(a);
        assert_eq!(g.out(), 2);
        g.completed(a);
        assert_eq!(g.out(), 1);
        assert_eq!(g.take(), Some(a));

        // Sent, completed, then dropped: free at once.
        assert!(g.begin_send(b, 1));
        g.completed(b);
        assert!(!g.in_flight(b));
        assert!(g.begin_send(b, 1), "resent once the first send completed");
        g.completed(b);
        g.give_back(b);
        assert_eq!(g.take(), Some(b));
    }

    #[test]
    fn the_regions_cover_the_held_set_up_to_a_cap() {
        assert_eq!(regions_for(1000, 1), 1000 + super::super::RING as usize);
        assert_eq!(regions_for(u64::MAX, 4), MAX_REGIONS);
    }

    /// The RX tape at gateway A follows the deep buffer the same way: two
    /// tape slots per held 4.2 KB frame, up to the cap.
    #[test]
    fn the_tape_holds_the_held_set_up_to_a_cap() {
        use super::super::{tape_hold_for, TAPE_HOLD};
        assert_eq!(tape_hold_for(1000), 2000);
        assert_eq!(tape_hold_for(u64::MAX), TAPE_HOLD);
    }
}
