//! The steering program on crafted frames (BPF_PROG_TEST_RUN): what it
//! passes to the kernel, what it steers, and to which shard -- the same
//! shard as `shard_of_pair` in Rust. Needs root (CAP_BPF); skipped with a
//! printed reason otherwise, unless SOYA_REQUIRE_NETNS=1.

use std::net::IpAddr;

use super::program::{Steering, XDP_PASS};
use soya_config::Prefix;
use soya_proto::shard::shard_of_pair;

fn prefixes(v: &[&str]) -> Vec<Prefix> {
    v.iter().map(|p| p.parse().unwrap()).collect()
}

fn steering(shards: usize) -> Option<Steering> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let required = std::env::var("SOYA_REQUIRE_NETNS").is_ok_and(|v| v == "1");
    if !root && !required {
        eprintln!("skipped: needs root (CAP_BPF) to load the XDP program");
        return None;
    }
    match Steering::load(
        &prefixes(&["10.1.0.0/16", "fd00:1::/48"]),
        &prefixes(&["10.2.0.0/16", "fd00:2::/48"]),
        shards,
    ) {
        Ok(s) => Some(s),
        Err(e) if !required && e.to_string().contains("not built") => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn frame(src: IpAddr, dst: IpAddr) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let mut ip = vec![0x45, 0, 0, 48, 0, 0, 0x40, 0, 64, 17, 0, 0];
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            f.extend_from_slice(&ip);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd]);
            f.extend_from_slice(&[0x60, 0, 0, 0, 0, 8, 17, 64]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => unreachable!(),
    }
    f.extend_from_slice(&[0u8; 28]);
    f
}

/// Runs `f` and returns the verdict and the shard whose counter moved.
fn run(s: &mut Steering, shards: usize, f: &[u8]) -> (u32, Option<usize>) {
    let before = s.steered(shards);
    let verdict = s.test_run(f).expect("BPF_PROG_TEST_RUN");
    let after = s.steered(shards);
    let moved: Vec<usize> = (0..shards).filter(|&i| after[i] != before[i]).collect();
    assert!(moved.len() <= 1, "{moved:?}");
    (verdict, moved.first().copied())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn steers_by_the_same_host_pair_hash_as_the_shards() {
    for shards in [1usize, 2, 3, 4, 7] {
        let Some(mut s) = steering(shards) else {
            return;
        };
        for a in 0..24u8 {
            for b in [1u8, 2, 9, 200] {
                for (src, dst) in [
                    (ip(&format!("10.1.{a}.{b}")), ip(&format!("10.2.{b}.{a}"))),
                    (
                        ip(&format!("fd00:1::{a:x}:{b:x}")),
                        ip(&format!("fd00:2::{b:x}")),
                    ),
                ] {
                    let (verdict, shard) = run(&mut s, shards, &frame(src, dst));
                    // No socket in the XSKMAP: the redirect falls back to PASS.
                    assert_eq!(verdict, XDP_PASS);
                    assert_eq!(
                        shard,
                        Some(shard_of_pair(src, dst, shards)),
                        "{src} -> {dst}, {shards} shards"
                    );
                }
            }
        }
    }
}

#[test]
fn passes_everything_else_untouched() {
    let Some(mut s) = steering(4) else { return };
    let cases = [
        // Wrong direction, other prefixes, mixed.
        (ip("10.2.0.1"), ip("10.1.0.1")),
        (ip("10.3.0.1"), ip("10.2.0.1")),
        (ip("10.1.0.1"), ip("10.3.0.1")),
        (ip("192.168.0.1"), ip("10.2.0.1")),
        (ip("fd00:2::1"), ip("fd00:1::1")),
        (ip("fd00:1::1"), ip("fd00:3::1")),
    ];
    for (src, dst) in cases {
        assert_eq!(
            run(&mut s, 4, &frame(src, dst)),
            (XDP_PASS, None),
            "{src} -> {dst}"
        );
    }
    // ARP.
    let mut arp = frame(ip("10.1.0.1"), ip("10.2.0.1"));
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(run(&mut s, 4, &arp), (XDP_PASS, None));
    // VLAN-tagged IPv4: not ours.
    let mut tagged = frame(ip("10.1.0.1"), ip("10.2.0.1"));
    tagged[12..14].copy_from_slice(&[0x81, 0x00]);
    assert_eq!(run(&mut s, 4, &tagged), (XDP_PASS, None));
    // Truncated IPv4 header.
    let short = &frame(ip("10.1.0.1"), ip("10.2.0.1"))[..20];
    assert_eq!(run(&mut s, 4, short), (XDP_PASS, None));
    // And the direction that is ours is counted.
    let (_, shard) = run(&mut s, 4, &frame(ip("10.1.0.1"), ip("10.2.0.1")));
    assert!(shard.is_some());
}
