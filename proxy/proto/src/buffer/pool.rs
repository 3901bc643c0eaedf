//! A bounded free list of heap packet buffers ([`PacketBuf`]), so that packets in
//! transit between the gateway's stages are not allocated one by one.
//!
//! Packets cross the stages as owned [`PacketBuf`]s (an engine output for the DC
//! side, the packet inside a [`TwinMsg`](crate::qp::TwinMsg), a message the
//! WAN transport decoded). Each of those used to be a fresh allocation,
//! freed a stage later: at 4 KiB per packet and millions of packets per
//! second that is allocator work on every packet, and the issue asks for
//! none in steady state. Instead every sans-IO state machine that builds
//! such vectors takes them from its pool, and whoever is done with one (the
//! device loop after the socket send, the transport once the twin
//! acknowledged the message, the engine once it copied a twin's packet into
//! its deep buffer) puts it back.
//!
//! Bounded both ways: an empty pool allocates (counted in
//! [`PoolStats::allocated`]); a full one frees what it is given (counted in
//! [`PoolStats::freed`]). So memory held idle is at most `cap` buffers, and a
//! burst larger than that costs allocations, never unbounded growth. The
//! pool starts empty: a gateway that never carries traffic holds nothing.
//!
//! Two pools (the engine's, the transport's) fill and drain in opposite
//! directions: at the requester's site the engine builds the `Request`s and
//! the transport frees them when acknowledged; at the responder's site the
//! transport builds them (decoding) and the engine frees them. The device
//! loop evens them out with [`PacketPool::balance`] (moving vectors between
//! two free lists allocates nothing: both are sized for `cap` at creation).

use super::PacketBuf;

/// Capacity of a pooled buffer: a 4096-byte RoCE payload with IPv6, UDP,
/// BTH, RETH and ICRC (4176 bytes) and room to spare; the deep buffer's
/// default slot size too. Larger packets (jumbo non-RoCE datagrams) grow
/// their vector, which the pool keeps as it is.
pub const PACKET_BUF_BYTES: usize = 4608;

/// Default number of idle buffers a pool keeps (at most 18 MiB of
/// 4608-byte buffers). It must hold a whole wave of buffers released at
/// once between two balancings: one WAN acknowledgement at the requester's
/// site, or one responder ACK at the other, can release every packet in
/// flight (soya-perf's default, 128 outstanding 64 KiB WRITEs, is 2048
/// packets). With 1024, a perf profile of docs/bench/forward.py showed the
/// transport's pool freeing and the engine's allocating on every such wave
/// (tests/steady_state_alloc.rs, `deep_window`). A pool only ever holds
/// buffers that were in flight together before, so this is not memory the
/// gateway would not have used anyway; it starts empty.
pub const DEFAULT_POOL_CAP: usize = 4096;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers allocated because the pool was empty.
    pub allocated: u64,
    /// Buffers handed out from the pool.
    pub reused: u64,
    /// Buffers freed because the pool was full (or too small to keep).
    pub freed: u64,
    /// Buffers taken from the pool's [`LendSource`].
    pub lent: u64,
    /// Takes that found the source empty and fell back to a heap buffer.
    pub lend_empty: u64,
}

/// Where a pool takes buffers before its own (an AF_XDP backend's UMEM:
/// `Site::set_lender`).
pub trait LendSource: Send + Sync {
    /// An empty lent buffer with room for [`PACKET_BUF_BYTES`], or `None`
    /// when all are out (the pool then falls back to heap buffers).
    fn lend(&self) -> Option<PacketBuf>;
}

pub struct PacketPool {
    free: Vec<PacketBuf>,
    cap: usize,
    source: Option<std::sync::Arc<dyn LendSource>>,
    pub stats: PoolStats,
}

impl Default for PacketPool {
    fn default() -> PacketPool {
        PacketPool::new(DEFAULT_POOL_CAP)
    }
}

impl PacketPool {
    /// A pool keeping at most `cap` idle buffers. Its free list is sized
    /// now: returning a buffer never grows it.
    pub fn new(cap: usize) -> PacketPool {
        PacketPool {
            free: Vec::with_capacity(cap),
            cap,
            source: None,
            stats: PoolStats::default(),
        }
    }

    /// From now on, [`take`](Self::take) hands out `source`'s buffers
    /// first (the decode then writes a packet where the backend sends it
    /// from: no copy on the way out).
    pub fn set_source(&mut self, source: std::sync::Arc<dyn LendSource>) {
        self.source = Some(source);
    }

    /// An empty buffer with room for [`PACKET_BUF_BYTES`].
    pub fn take(&mut self) -> PacketBuf {
        if let Some(s) = &self.source {
            match s.lend() {
                Some(b) => {
                    self.stats.lent += 1;
                    return b;
                }
                None => self.stats.lend_empty += 1,
            }
        }
        match self.free.pop() {
            Some(v) => {
                self.stats.reused += 1;
                v
            }
            None => {
                self.stats.allocated += 1;
                PacketBuf::with_capacity(PACKET_BUF_BYTES)
            }
        }
    }

    /// A pooled copy of `bytes`.
    pub fn copy_of(&mut self, bytes: &[u8]) -> PacketBuf {
        let mut v = self.take();
        crate::copies::note(bytes.len());
        v.extend_from_slice(bytes);
        v
    }

    /// Returns a buffer. Vectors smaller than a packet buffer (an empty
    /// `Vec`, one built elsewhere) are not worth keeping: dropped, as is
    /// anything beyond the cap. A lent buffer is never kept: dropping it
    /// gives it back to its lender (not counted as freed).
    pub fn put(&mut self, mut v: PacketBuf) {
        if v.is_lent() {
            return;
        }
        if v.capacity() < PACKET_BUF_BYTES || self.free.len() >= self.cap {
            if v.capacity() > 0 {
                self.stats.freed += 1;
            }
            return;
        }
        v.clear();
        self.free.push(v);
    }

    /// Idle buffers held.
    pub fn idle(&self) -> usize {
        self.free.len()
    }

    /// Moves idle buffers from the fuller pool to the emptier until each
    /// holds about half of the two together (bounded by the receiver's
    /// cap). No allocation: vectors are moved, and free lists never grow
    /// past the capacity they were created with.
    pub fn balance(a: &mut PacketPool, b: &mut PacketPool) {
        let (from, to) = if a.free.len() > b.free.len() {
            (a, b)
        } else {
            (b, a)
        };
        let target = (from.free.len() + to.free.len()) / 2;
        while to.free.len() < target.min(to.cap) {
            let Some(v) = from.free.pop() else { break };
            to.free.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_up_to_the_cap_and_balances() {
        let mut p = PacketPool::new(2);
        let a = p.copy_of(b"abc");
        assert_eq!(a, b"abc");
        let b = p.take();
        let c = p.take();
        assert_eq!(p.stats.allocated, 3);
        p.put(a);
        p.put(b);
        p.put(c); // over the cap: freed
        p.put(PacketBuf::new()); // nothing to free, nothing kept
        p.put(vec![0; 10].into()); // too small to keep
        assert_eq!((p.idle(), p.stats.freed), (2, 2));
        let d = p.take();
        assert!(d.is_empty() && d.capacity() >= PACKET_BUF_BYTES);
        assert_eq!(p.stats.reused, 1);

        let mut q = PacketPool::new(4);
        p.put(d);
        PacketPool::balance(&mut q, &mut p);
        assert_eq!((p.idle(), q.idle()), (1, 1));
        PacketPool::balance(&mut p, &mut q);
        assert_eq!((p.idle(), q.idle()), (1, 1));
    }

    /// A lent buffer put back goes to its lender at once: a pool never
    /// hands out another's memory as its own.
    #[test]
    fn a_lent_buffer_is_given_back_not_kept() {
        use crate::buffer::{Lease, Lender, LenderRef};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;

        struct Count(AtomicUsize);
        impl Lender for Count {
            fn give_back(&self, _lease: Box<Lease>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let lender = LenderRef::new(Box::new(count.clone()));
        let run: &'static mut [u8] = Box::leak(vec![0u8; PACKET_BUF_BYTES].into_boxed_slice());
        let b = PacketBuf::lent(Lease::new(run), 0, &lender);
        let mut p = PacketPool::new(4);
        p.put(b);
        assert_eq!((p.idle(), p.stats.freed), (0, 0));
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }
}
