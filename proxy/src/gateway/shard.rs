//! Shards: which device thread owns a packet, and the bounded queues that
//! carry a DC packet from the shard that read it to the shard that owns it.
//!
//! A shard is a whole device (QP engine, WAN connection, WAN sockets at
//! `wan.bind` port + shard index). Shard *i* of one site talks only to shard
//! *i* of the twin, so the two sites must send every packet of a QP, in
//! both directions, to the same shard index without sharing any state. The
//! key both can compute from any packet of a QP is the unordered pair of IP
//! addresses: requests and their ACKs / READ responses differ in UDP source
//! port and destination QPN, not in the host pair. Non-RoCE traffic is
//! sharded the same way, so a TCP connection between two hosts stays on one
//! shard (in order).

use std::net::{IpAddr, SocketAddr};

use ringbuf::traits::{Consumer, Observer, Producer, Split};
use ringbuf::{HeapCons, HeapProd, HeapRb};

use soya_proto::shard::canonical;
pub use soya_proto::shard::shard_of_pair;

/// The shard of an IP packet (by its addresses); 0 when it has none.
pub fn shard_of(packet: &[u8], shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    soya_proto::site::acl::addresses(packet).map_or(0, |(s, d)| shard_of_pair(s, d, shards))
}

/// Bytes of one handoff record before the packet: length (2), address
/// family (1: 0 none, 4, 6), port (2), address (16).
const HEADER: usize = 21;

/// Bytes of each handoff queue for `shards` shards: 4 MiB inbound per
/// shard in all, at least 256 KiB a queue (bounded: at most 16 × 15 ×
/// 256 KiB... 4 MiB, see [`queues`]).
pub fn queue_bytes(shards: usize) -> usize {
    ((4 << 20) / shards.saturating_sub(1).max(1)).max(256 << 10)
}

/// The sending end of one shard-to-shard queue (single producer).
pub struct HandoffTx {
    prod: HeapProd<u8>,
    /// One record, assembled so that it is published in one step.
    scratch: Box<[u8]>,
}

/// The receiving end (single consumer).
pub struct HandoffRx {
    cons: HeapCons<u8>,
}

/// Creates the queue from one shard to another.
pub fn queue(bytes: usize, max_packet: usize) -> (HandoffTx, HandoffRx) {
    let (prod, cons) = HeapRb::<u8>::new(bytes).split();
    (
        HandoffTx {
            prod,
            scratch: vec![0u8; HEADER + max_packet].into_boxed_slice(),
        },
        HandoffRx { cons },
    )
}

impl HandoffTx {
    /// Queues `packet` (read from lab host `from`). False when the queue is
    /// full or the packet too large: the caller drops and counts it (never
    /// blocks, never grows).
    pub fn push(&mut self, packet: &[u8], from: Option<SocketAddr>) -> bool {
        let n = HEADER + packet.len();
        if n > self.scratch.len() || self.prod.vacant_len() < n {
            return false;
        }
        let h = &mut self.scratch[..HEADER];
        h[..2].copy_from_slice(&(packet.len() as u16).to_le_bytes());
        match from {
            None => h[2] = 0,
            Some(a) => {
                h[2] = if a.is_ipv4() { 4 } else { 6 };
                h[3..5].copy_from_slice(&a.port().to_be_bytes());
                h[5..21].copy_from_slice(&canonical(a.ip()));
            }
        }
        soya_proto::copies::note(packet.len());
        self.scratch[HEADER..n].copy_from_slice(packet);
        // One publication of the whole record: the consumer never sees half.
        self.prod.push_slice(&self.scratch[..n]) == n
    }
}

impl HandoffRx {
    /// Takes the oldest record into `buf`: its length and lab-host address.
    pub fn pop(&mut self, buf: &mut [u8]) -> Option<(usize, Option<SocketAddr>)> {
        if self.cons.occupied_len() < HEADER {
            return None;
        }
        let mut h = [0u8; HEADER];
        self.cons.pop_slice(&mut h);
        let len = usize::from(u16::from_le_bytes([h[0], h[1]]));
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&h[5..21]);
        let port = u16::from_be_bytes([h[3], h[4]]);
        let from = match h[2] {
            4 => std::net::Ipv6Addr::from(ip)
                .to_ipv4_mapped()
                .map(|v4| SocketAddr::new(IpAddr::V4(v4), port)),
            6 => Some(SocketAddr::new(IpAddr::V6(ip.into()), port)),
            _ => None,
        };
        // The producer published header and packet together, and checked
        // the packet fits a receive buffer of the same size.
        let take = len.min(buf.len());
        self.cons.pop_slice(&mut buf[..take]);
        if take < len {
            self.cons.skip(len - take);
            return None;
        }
        Some((len, from))
    }

    pub fn is_empty(&self) -> bool {
        self.cons.is_empty()
    }
}

/// Every queue of `shards` shards: `tx[i][j]` sends from shard i to j,
/// `rx[j]` lists what shard j receives (None on the diagonal).
#[allow(clippy::type_complexity)]
pub fn queues(
    shards: usize,
    max_packet: usize,
) -> (Vec<Vec<Option<HandoffTx>>>, Vec<Vec<HandoffRx>>) {
    let mut tx: Vec<Vec<Option<HandoffTx>>> = (0..shards)
        .map(|_| (0..shards).map(|_| None).collect())
        .collect();
    let mut rx: Vec<Vec<HandoffRx>> = (0..shards).map(|_| Vec::new()).collect();
    if shards > 1 {
        let bytes = queue_bytes(shards);
        for (i, row) in tx.iter_mut().enumerate() {
            for (j, slot) in row.iter_mut().enumerate() {
                if i != j {
                    let (t, r) = queue(bytes, max_packet);
                    *slot = Some(t);
                    rx[j].push(r);
                }
            }
        }
    }
    (tx, rx)
}

/// A copy of `cfg` for shard `index` of `count`: every `wan.bind` and path
/// port + index, the deep buffer divided among the shards.
pub fn shard_site(
    cfg: &soya_config::SiteConfig,
    index: u16,
    count: u16,
) -> soya_config::SiteConfig {
    let mut c = cfg.clone();
    if count <= 1 {
        return c;
    }
    let shift = |a: &mut SocketAddr| a.set_port(a.port().wrapping_add(index));
    c.wan.bind.iter_mut().for_each(shift);
    for p in &mut c.wan.paths {
        shift(&mut p.bind);
        shift(&mut p.remote);
    }
    let n = u64::from(count);
    for p in &mut c.wan.paths {
        // A provisioned rate is the circuit's: the shards share it.
        p.rate_bps = p.rate_bps.map(|r| (r / n).max(1));
    }
    c.buffer.slots = (c.buffer.slots / n).max(16);
    c.buffer.bytes = c.buffer.slots * u64::from(c.buffer.slot_bytes);
    if let Some(q) = c.buffer.per_flow_quota.as_mut() {
        *q = (*q).min(c.buffer.bytes);
    }
    c
}

/// Bound into each shard's HELLOs (empty with one shard: the HELLO of a
/// gateway without shards).
pub fn hello_context(index: u16, count: u16) -> Vec<u8> {
    if count <= 1 {
        Vec::new()
    } else {
        format!("soya shard {index}/{count}").into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn the_shard_hash_is_symmetric_stable_and_spreads() {
        for n in 1..=16 {
            for x in 0..50u8 {
                for y in 0..20u8 {
                    let (a, b) = (v4(10, 1, 0, x), v4(10, 2, 0, y));
                    let s = shard_of_pair(a, b, n);
                    assert!(s < n);
                    assert_eq!(s, shard_of_pair(b, a, n), "{a} {b} / {n}");
                }
            }
        }
        // Fixed values: both sites (any machine, any build) agree.
        assert_eq!(shard_of_pair(v4(10, 1, 0, 5), v4(10, 2, 0, 7), 2), 1);
        assert_eq!(shard_of_pair(v4(10, 1, 0, 5), v4(10, 2, 0, 8), 2), 0);
        assert_eq!(shard_of_pair(v4(10, 1, 0, 5), v4(10, 2, 0, 7), 7), 2);
        let six = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1));
        assert_eq!(
            shard_of_pair(six, v4(10, 2, 0, 7), 4),
            shard_of_pair(v4(10, 2, 0, 7), six, 4)
        );
        // Spread: 1000 host pairs over 4 shards, none starved.
        let mut count = [0usize; 4];
        for x in 0..40u8 {
            for y in 0..25u8 {
                count[shard_of_pair(v4(10, 1, 1, x), v4(10, 2, 2, y), 4)] += 1;
            }
        }
        assert!(count.iter().all(|&c| c > 180), "{count:?}");
    }

    #[test]
    fn handoff_is_bounded_ordered_and_keeps_the_sender() {
        let (mut tx, mut rx) = queue(1024, 600);
        let from: SocketAddr = "127.0.0.7:5555".parse().unwrap();
        let mut buf = [0u8; 600];
        assert!(rx.pop(&mut buf).is_none());
        assert!(tx.push(&[1; 500], Some(from)));
        assert!(tx.push(&[2; 400], None));
        assert!(!tx.push(&[3; 200], None), "full: refused, not grown");
        assert!(!tx.push(&[4; 700], None), "larger than a packet");
        assert_eq!(rx.pop(&mut buf), Some((500, Some(from))));
        assert_eq!(buf[..500], [1; 500]);
        assert!(tx.push(&[3; 200], None), "room again (wraps around)");
        assert_eq!(rx.pop(&mut buf), Some((400, None)));
        assert_eq!(buf[..400], [2; 400]);
        assert_eq!(rx.pop(&mut buf), Some((200, None)));
        assert_eq!(buf[..200], [3; 200]);
        assert!(rx.is_empty());
        let six: SocketAddr = "[fd00::1]:9".parse().unwrap();
        assert!(tx.push(&[5; 10], Some(six)));
        assert_eq!(rx.pop(&mut buf), Some((10, Some(six))));
    }

    #[test]
    fn shard_sites_shift_ports_and_split_the_buffer() {
        let text = "site = \"t\"\n[dc]\nbackend = \"udp\"\nlisten = \"127.0.0.1:7000\"\n\
             local_prefixes = [\"10.1.0.0/16\"]\nremote_prefixes = [\"10.2.0.0/16\"]\n\
             [wan]\nbind = [\"127.0.0.1:7400\"]\ninsecure = true\n[[wan.paths]]\n\
             name = \"a\"\nremote = \"127.0.0.1:7500\"\nrate = \"10gbit\"\nrtt = \"3ms\"\n\
             [buffer]\nsize = \"64MiB\"\n";
        let cfg = soya_config::parse_str(text, "t.toml").unwrap();
        assert_eq!(shard_site(&cfg, 0, 1), cfg);
        let s1 = shard_site(&cfg, 1, 2);
        assert_eq!(s1.wan.bind[0].port(), 7401);
        assert_eq!(s1.wan.paths[0].bind.port(), 7401);
        assert_eq!(s1.wan.paths[0].remote.port(), 7501);
        assert_eq!(s1.buffer.slots, cfg.buffer.slots / 2);
        assert!(hello_context(0, 1).is_empty());
        assert_ne!(hello_context(0, 2), hello_context(0, 3));
    }
}
