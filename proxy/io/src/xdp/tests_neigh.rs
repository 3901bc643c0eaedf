//! Hosts without a neighbour entry, on a real AF_XDP socket (a veth pair
//! in a network namespace of its own, as `tests_copies`): packets toward
//! them are held until the kernel has the entry, then sent in order;
//! bounded in number and in time; and the entries of the hosts we send to
//! are marked in use for the kernel. Needs root; skipped with a printed
//! reason otherwise, unless SOYA_REQUIRE_NETNS=1.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use super::neigh::{Neighbours, MAX_AGE};
use super::tests_copies::{
    in_netns, ip, mac, packet_of, required, setup_with_hold, Peer, FAR, HOST, INNER,
};
use super::unresolved::{MAX_HELD, WAIT};
use super::{SendError, XdpDc, TAPE_HOLD};

/// The kernel's state of `host`'s entry on `dev` (`STALE`, `DELAY`, ...).
fn state(host: Ipv4Addr, dev: &str) -> String {
    let out = Command::new("ip")
        .args(["neigh", "show", &host.to_string(), "dev", dev])
        .output()
        .expect("run ip");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split_whitespace().last().unwrap_or("").to_string()
}

/// The IP packets the peer end receives, in order, until it has `n`:
/// flushing the backend between looks (held packets go out at a flush),
/// at times from `t0` on that step 25 ms a look and stay within
/// [`WAIT`] (so however slow the machine, nothing held ages out, and the
/// neighbour table is read again: it is re-read at most every 20 ms).
/// Gives up after 5 s without a packet (a safety net: the verdict is what
/// arrived).
fn receive(dc: &mut XdpDc, peer: &Peer, n: usize, t0: Instant) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 9000];
    let mut last = Instant::now();
    let step = Duration::from_millis(25);
    let mut at = t0;
    while got.len() < n && last.elapsed() < Duration::from_secs(5) {
        if at + step < t0 + WAIT {
            at += step;
        }
        dc.flush_at(at);
        if let Some(len) = peer.recv_within(&mut buf, 10) {
            // IPv4 only: the kernel's ARP requests arrive here too.
            if buf[12..14] == [0x08, 0x00] {
                got.push(buf[14..len].to_vec());
                last = Instant::now();
            }
        }
    }
    got
}

#[test]
fn unresolved_hosts_are_held_and_used_entries_kept() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 && !required() {
        eprintln!("skipped: needs root (network namespace, AF_XDP)");
        return;
    }
    let ns = format!("soya-xdp-neigh-{}", std::process::id());
    in_netns(&ns, "xdp::tests_neigh::in_namespace");
}

/// The body of [`unresolved_hosts_are_held_and_used_entries_kept`], in
/// its namespace.
#[test]
#[ignore = "run by unresolved_hosts_are_held_and_used_entries_kept inside a network namespace"]
fn in_namespace() {
    if std::env::var_os(INNER).is_none() {
        return;
    }
    let Some(mut dc) = setup_with_hold(TAPE_HOLD) else {
        return;
    };
    let peer = Peer::open("xb");
    let lladdr = mac("xb").map(|b| format!("{b:02x}")).join(":");
    let host = IpAddr::V4(HOST);

    // No entry for the host (its first contact): held, not dropped. The
    // kernel is asked to resolve it; nobody answers on this veth.
    // (The time is given, not read: the verdicts do not depend on how
    // fast this machine runs them.)
    let t0 = Instant::now();
    ip(&format!("neigh del {HOST} dev xa"));
    let (p1, p2) = (packet_of(FAR, HOST, 1, 1000), packet_of(FAR, HOST, 2, 1400));
    assert!(dc.send_at(&p1, host, t0).is_ok());
    dc.flush_at(t0);
    assert!(
        dc.send_at(&p2, host, t0).is_ok(),
        "the second waits behind the first"
    );
    assert_eq!((dc.held(), dc.stats.tx_packets), (2, 0));

    // The entry comes (as the ARP reply would put it): both go out, in
    // the order sent, at the next flushes.
    ip(&format!(
        "neigh replace {HOST} lladdr {lladdr} dev xa nud reachable"
    ));
    let got = receive(&mut dc, &peer, 2, t0);
    assert_eq!(got, [p1.clone(), p2], "held packets sent in order");
    assert_eq!(
        (dc.held(), dc.stats.tx_held, dc.stats.tx_no_neighbour),
        (0, 2, 0)
    );

    // A host that never answers: dropped after WAIT, counted.
    let mute = IpAddr::V4(Ipv4Addr::new(10, 1, 0, 77));
    let t1 = t0 + 2 * WAIT;
    assert!(dc.send_at(&p1, mute, t1).is_ok());
    dc.send_held(t1 + WAIT / 2);
    assert_eq!(dc.held(), 1, "still within WAIT");
    dc.send_held(t1 + WAIT);
    assert_eq!((dc.held(), dc.stats.tx_no_neighbour), (0, 1));
    // Bounded: MAX_HELD, then refused at once.
    for _ in 0..MAX_HELD {
        assert!(dc.send_at(&p1, mute, t1 + WAIT).is_ok());
    }
    assert!(matches!(
        dc.send_at(&p1, mute, t1 + WAIT),
        Err(SendError::NoNeighbour)
    ));
    assert_eq!((dc.held(), dc.stats.tx_no_neighbour), (MAX_HELD, 2));
    drop(dc);

    // Entries used are marked in use: one gone stale is re-confirmed
    // (NTF_USE moves it to DELAY, then a unicast probe) instead of being
    // left to the kernel's collection of unused entries.
    ip(&format!(
        "neigh replace {HOST} lladdr {lladdr} dev xa nud stale"
    ));
    let mut n = Neighbours::new("xa", super::ifindex("xa").unwrap()).unwrap();
    let t0 = Instant::now();
    assert!(n.header(host, t0).is_some());
    assert_eq!(state(HOST, "xa"), "STALE");
    assert!(n.header(host, t0 + MAX_AGE / 2).is_some());
    assert_eq!(state(HOST, "xa"), "STALE", "not before MAX_AGE");
    assert!(n.header(host, t0 + MAX_AGE).is_some());
    let s = state(HOST, "xa");
    assert_ne!(s, "STALE", "marked in use");
    println!("held 2 then sent in order; 1 dropped after {WAIT:?}, 1 past {MAX_HELD}; a used stale entry went {s}");
}
