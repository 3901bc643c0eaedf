//! Packets toward local hosts whose neighbour entry the kernel is still
//! resolving, held until it has one (as the kernel's own neighbour queue
//! holds them) instead of dropped.
//!
//! A drop there is expensive: the first pseudo-ACKs toward a requester the
//! gateway had no entry for (its first contact, or an entry the kernel
//! flushed) are what it waits for once its window is out, so a dropped one
//! costs the requester a retransmission timeout (forward.py with a second
//! host address saw 128 retransmissions, one window). Resolution takes one
//! ARP exchange on the DC segment, well under a millisecond.
//!
//! Bounded in packets and in time: past [`MAX_HELD`] a packet is dropped
//! at once, and one held for [`WAIT`] without an entry is dropped then
//! (both counted as `tx_no_neighbour`). The order toward one host is kept:
//! held packets go before any later one (`XdpDc::send` sends what it can
//! of the queue first).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Packets held per shard at most (the kernel's `unres_qlen` is 101 per
/// entry; a few windows of pseudo-ACKs for a few hosts fit here).
pub const MAX_HELD: usize = 64;
/// How long a packet may wait for its host's entry (the kernel gives up
/// after 3 probes, 1 s apart; a requester's retransmission comes sooner).
pub const WAIT: Duration = Duration::from_secs(1);

/// A copy of one packet and what it waits for.
pub(super) struct Held {
    pub dst: IpAddr,
    pub since: Instant,
    pub packet: Vec<u8>,
}

/// The held packets of one shard, oldest first.
#[derive(Default)]
pub(super) struct Unresolved {
    pub queue: VecDeque<Held>,
}

impl Unresolved {
    /// Holds a copy of `packet` (counted: a rare path); `false` when full.
    pub fn hold(&mut self, packet: &[u8], dst: IpAddr, now: Instant) -> bool {
        if self.queue.len() >= MAX_HELD {
            return false;
        }
        soya_proto::copies::note(packet.len());
        self.queue.push_back(Held {
            dst,
            since: now,
            packet: packet.to_vec(),
        });
        true
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }
}
