//! Which shard a packet belongs to: the host-pair hash both twin gateways
//! compute alike (and the XDP program, soya-io's `xdp`, reimplements), so
//! that shard *i* of one site only ever talks to shard *i* of the other.
//! The queues between shards are the daemon's (`soya::gateway::shard`).

use std::net::IpAddr;

/// The shard of the host pair {a, b}: a fixed hash (FNV-1a 64 over the
/// smaller then the larger address, IPv4 as IPv4-mapped IPv6, then a
/// final avalanche), the same on every machine, build and run, and the
/// same for (a, b) and (b, a).
pub fn shard_of_pair(a: IpAddr, b: IpAddr, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let a = canonical(a);
    let b = canonical(b);
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in lo.iter().chain(hi.iter()) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser: FNV's low bits alone are weak for `mod n`.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h % shards as u64) as usize
}

/// `ip` as 16 bytes: IPv4 as IPv4-mapped IPv6.
pub fn canonical(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}
