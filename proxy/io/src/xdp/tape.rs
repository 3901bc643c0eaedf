//! The RX "tape": how a multi-buffer frame from the DC stays where the
//! kernel wrote it (issue 16, gateway A; docs/benchmarks.md § "Copies per
//! packet", step 3).
//!
//! A UMEM chunk holds at most a page (4 KiB) on this kernel, so a 4.2 KB
//! RoCE frame arrives in two buffers. With the UMEM registered *unaligned*
//! and the fill ring given addresses at a stride of [`STRIDE`] (a chunk
//! minus the [`HEADROOM`] the kernel leaves before a buffer's data), each
//! buffer's data starts exactly where the previous one's ends: consecutive
//! fill entries form one run of bytes, a tape, and a frame whose buffers
//! were consecutive fill entries is contiguous. Such a frame is lent to
//! the site in place (a [`PacketBuf`] over its bytes, Ethernet header
//! skipped) and its slots stay out of the fill ring until that buffer is
//! dropped (the twin acknowledged the request): no gather, no copy.
//!
//! Slots are refilled only when free and in tape order: a held slot is
//! skipped, which (like the wrap from the last slot to the first) breaks
//! the tape, and a frame landing across a break is gathered as before
//! (counted). Held slots are capped ([`Tape::budget`]) so that the fill
//! and RX rings can always be fed: past the cap frames are gathered and
//! their slots freed at once -- never a stall, never a drop.
//!
//! Slot states are atomics, not under the UMEM mutex: a buffer may be
//! dropped on any shard's thread, and from inside the `recv_batch`
//! callback of the shard that read it. Each state change has one owner:
//! `Free -> Kernel` the refiller (under the UMEM mutex, with the cursor),
//! `Kernel -> Free | Held` the shard that read the slot off its RX ring,
//! `Held -> Free` the buffer's drop. Release stores / acquire loads order
//! the bytes' last use before the kernel writes the slot again.
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::xsk::{Area, Ring, CHUNK};
use soya_proto::buffer::{Lease, Lender, LenderRef, PacketBuf};

/// What the kernel leaves before a buffer's data in copy mode
/// (`XDP_PACKET_HEADROOM`; the UMEM is registered with no headroom of
/// its own).
pub const HEADROOM: usize = 256;
/// Distance between consecutive slots' addresses: a buffer's data ends
/// (slot + HEADROOM + data room = slot + CHUNK) where the next slot's data
/// begins (slot + STRIDE + HEADROOM).
pub const STRIDE: usize = CHUNK - HEADROOM;

const FREE: u8 = 0;
const KERNEL: u8 = 1;
const HELD: u8 = 2;

/// Bytes of UMEM a tape of `slots` slots covers (the last slot's chunk
/// ends a full chunk after its address), rounded up to a chunk so that the
/// TX chunks after it stay chunk-aligned.
pub fn bytes(slots: usize) -> usize {
    ((slots - 1) * STRIDE + CHUNK).next_multiple_of(CHUNK)
}

/// The address a descriptor's data starts at (unaligned mode puts the
/// offset into the chunk in the address's top 16 bits).
pub fn real(addr: u64) -> u64 {
    (addr & libc::XSK_UNALIGNED_BUF_ADDR_MASK) + (addr >> libc::XSK_UNALIGNED_BUF_OFFSET_SHIFT)
}

/// The slot states, shared by the shards and every lent buffer.
pub struct Slots {
    state: Vec<AtomicU8>,
    /// For the first slot of a held frame: how many slots it spans.
    span: Vec<AtomicU8>,
    held: AtomicUsize,
    /// Most slots held at once (the rest keep the fill and RX rings fed).
    budget: usize,
    /// Lease boxes given back, naming no memory, to lend again: at most
    /// one per frame held at once (sized for every slot up front, so that
    /// keeping one never grows it).
    // Boxed on purpose: a kept box goes into a `PacketBuf` as it is.
    #[allow(clippy::vec_box)]
    leases: Mutex<Vec<Box<Lease>>>,
}

impl Slots {
    pub fn new(slots: usize, budget: usize) -> Slots {
        Slots {
            state: (0..slots).map(|_| AtomicU8::new(FREE)).collect(),
            span: (0..slots).map(|_| AtomicU8::new(0)).collect(),
            held: AtomicUsize::new(0),
            budget,
            leases: Mutex::new(Vec::with_capacity(slots)),
        }
    }

    pub fn count(&self) -> usize {
        self.state.len()
    }

    /// Slots held by lent buffers now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The slot a descriptor came from (its address as given to the fill
    /// ring), if it is one of ours.
    pub fn slot_of(&self, addr: u64) -> Option<usize> {
        let base = (addr & libc::XSK_UNALIGNED_BUF_ADDR_MASK) as usize;
        let s = base / STRIDE;
        (base % STRIDE == 0 && s < self.count()).then_some(s)
    }

    /// A slot read off an RX ring whose bytes are no longer needed.
    pub fn release(&self, slot: usize) {
        debug_assert_eq!(self.state[slot].load(Ordering::Relaxed), KERNEL);
        self.state[slot].store(FREE, Ordering::Release);
    }

    /// Holds the `n` slots from `first` (just read off an RX ring) for a
    /// lent buffer, unless that would pass the budget.
    fn hold(&self, first: usize, n: usize) -> bool {
        if self.held.fetch_add(n, Ordering::Relaxed) + n > self.budget {
            self.held.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        self.span[first].store(n as u8, Ordering::Relaxed);
        for s in first..first + n {
            debug_assert_eq!(self.state[s].load(Ordering::Relaxed), KERNEL);
            self.state[s].store(HELD, Ordering::Relaxed);
        }
        true
    }

    /// The buffer over the frame starting at `first` was dropped.
    fn unhold(&self, first: usize) {
        let n = self.span[first].swap(0, Ordering::Relaxed) as usize;
        debug_assert!(n > 0, "slot {first} given back but not held");
        for s in first..first + n {
            self.state[s].store(FREE, Ordering::Release);
        }
        self.held.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The refill side: the cursor, under the UMEM mutex with the fill ring.
pub struct Tape {
    pub slots: Arc<Slots>,
    cursor: usize,
    /// Held slots the cursor stepped over (each a break in the tape).
    pub skipped: u64,
}

impl Tape {
    pub fn new(slots: Arc<Slots>) -> Tape {
        Tape {
            slots,
            cursor: 0,
            skipped: 0,
        }
    }

    /// Gives the fill ring free slots in tape order, from the cursor, until
    /// the ring is full or the cursor reaches a slot the kernel still has
    /// (the fill ring's oldest entries, or a frame a shard has not read
    /// yet: that shard's next batch frees it). Held slots are stepped over.
    /// Returns how many were given.
    pub fn refill(&mut self, fill: &mut Ring<u64>) -> usize {
        let mut room = fill.free() as usize;
        let mut given = 0;
        for _ in 0..self.slots.count() {
            if room == 0 {
                break;
            }
            let st = &self.slots.state[self.cursor];
            match st.load(Ordering::Acquire) {
                FREE => {
                    st.store(KERNEL, Ordering::Relaxed);
                    fill.push((self.cursor * STRIDE) as u64);
                    room -= 1;
                    given += 1;
                }
                HELD => self.skipped += 1,
                _ => break,
            }
            self.cursor = (self.cursor + 1) % self.slots.count();
        }
        if given > 0 {
            fill.submit();
        }
        given
    }
}

/// Takes lent frames back (a [`Lender`]): frees their slots, which the
/// next refill gives to the kernel when the cursor reaches them.
struct TapeLender {
    slots: Arc<Slots>,
    /// Kept mapped while any buffer points into it.
    area: Arc<Area>,
}

impl Lender for TapeLender {
    fn give_back(&self, mut lease: Box<Lease>) {
        let off = lease.addr() - self.area.base() as usize;
        // The run is forgotten before the box is kept (see `Area::lend_run`).
        lease.clear();
        super::lock(&self.slots.leases).push(lease);
        // The run starts ETH + the kernel's headroom (< STRIDE) past its
        // first slot's address.
        self.slots.unhold(off / STRIDE);
    }
}

pub fn lender(slots: &Arc<Slots>, area: &Arc<Area>) -> LenderRef {
    LenderRef::new(Box::new(TapeLender {
        slots: slots.clone(),
        area: area.clone(),
    }))
}

/// The frame of `len` bytes at `addr` (a real address, its descriptors'
/// slots `first..first + n` just read off an RX ring and contiguous), from
/// byte `skip` on, as a buffer lent in place; `None` (the slots untouched)
/// when the budget is spent.
pub fn lend(
    slots: &Slots,
    area: &Area,
    lender: &LenderRef,
    (first, n): (usize, usize),
    addr: u64,
    len: usize,
    skip: usize,
) -> Option<PacketBuf> {
    let start = addr as usize + skip;
    assert!(skip < len && start + (len - skip) <= area.size());
    if !slots.hold(first, n) {
        return None;
    }
    let len = len - skip;
    // SAFETY (`Area::lend_run`): the bytes are inside the area (checked
    // above, and by `lend_run`), which the lender keeps mapped while the
    // lease is out (it holds an `Arc` of the area) and clears the lease
    // when it comes back; the kernel wrote them and does not again while
    // their slots are HELD (never given to the fill ring), and nothing else
    // reads or writes them until the buffer gives them back: the slots'
    // other bytes (the Ethernet header, the headroom) are not in the run.
    // The run is exactly the frame, so the buffer never writes past it.
    let run = unsafe { area.lend_run(start, len) };
    let kept = super::lock(&slots.leases).pop();
    let lease = match kept {
        Some(mut l) => {
            l.set_run(run);
            l
        }
        None => Lease::new(run),
    };
    // All `len` bytes were written by the kernel: the packet is the run.
    Some(PacketBuf::lent(lease, len, lender))
}
