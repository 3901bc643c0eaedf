//! A far gateway killed and restarted mid-stream, in the simulator (issue
//! 35): gateway B (the one re-injecting toward host B's responders)
//! crashes and a new incarnation starts at once. Gateway A sends the new
//! one again whatever B had not delivered, the new B learns each QP from
//! those packets, and every transfer completes with every byte verified;
//! nothing failed. A near gateway's restart (gateway A: what it
//! pseudo-ACKed died with it) still fails its flows, loudly, unless A has
//! a standby (issue 38, `tools/src/sim/standby.rs`): then A dies and does
//! not come back, the standby, which replayed every call A was given,
//! takes over, and nothing fails; gateway B sees the same WAN session (no
//! restart, and no AES-GCM nonce sealed over two different datagrams).
//! Virtual time: no check depends on the machine's speed.

use std::time::Duration;

use soya_proto::site::SiteEvent;
use soya_tools::rc::hw::EndpointModel;
use soya_tools::sim::scenario::{run_world, Op, Outcome, Scenario};
use soya_tools::sim::world::{Node, World};

fn restart(op: Op, near: bool) -> Scenario {
    Scenario {
        seed: 11,
        distance_km: 300.0,
        op,
        size: 65_536,
        tx_depth: 128,
        qps: 2,
        iters: 512,
        twin_restart: Some(Duration::from_millis(10)),
        restart_near: near,
        ..Scenario::default()
    }
}

/// (flows failed, flows resumed) of each restart gateway A saw.
fn restarts_seen_by_a(w: &World) -> Vec<(usize, usize)> {
    w.site_events
        .iter()
        .filter_map(|(node, _, e)| match e {
            SiteEvent::TwinRestarted {
                flows_failed,
                flows_resumed,
                ..
            } if *node == Node::GwA => Some((*flows_failed, *flows_resumed)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_far_gateway_restarted_mid_stream_fails_nothing_and_every_byte_is_verified() {
    for op in [Op::Write, Op::Send, Op::Read] {
        let s = restart(op, false);
        let (o, w) = run_world(&s, false).expect("runs");
        let all = u64::from(s.qps) * u64::from(s.iters);
        println!(
            "{op:?}: {} ok, {} failed, {} B verified of {} B, goodput {:?} Gb/s, \
             restarts seen by A {:?}",
            o.messages_ok,
            o.messages_failed,
            o.bytes_verified,
            all * s.size as u64,
            o.goodput_gbps,
            restarts_seen_by_a(&w)
        );
        assert!(o.violations.is_empty(), "{op:?}: {:?}", o.violations);
        assert!(o.finished, "{op:?}");
        assert_eq!((o.messages_ok, o.messages_failed), (all, 0), "{op:?}");
        assert_eq!(o.bytes_verified, all * s.size as u64, "{op:?}");
        assert_eq!(o.bytes_lost + o.bytes_duplicated + o.bytes_misordered, 0);
        // B did restart mid-stream, and A resumed both QPs.
        assert_eq!(restarts_seen_by_a(&w), vec![(0, 2)], "{op:?}");
        let resent: u64 = w.engines().map(|e| e.stats.packets_resent_on_resume).sum();
        assert!(resent > 0, "{op:?}: something was in flight");
    }
}

#[test]
fn a_near_gateway_restarted_mid_stream_still_fails_its_flows_loudly() {
    let s = restart(Op::Write, true);
    let (o, w) = run_world(&s, false).expect("runs");
    println!(
        "near: {} ok, {} failed, {} B verified, QPs in error {}, restarts seen by B {:?}",
        o.messages_ok,
        o.messages_failed,
        o.bytes_verified,
        w.host_a.qps.iter().filter(|q| q.is_error()).count(),
        w.site_events
            .iter()
            .filter(|(n, _, e)| *n == Node::GwB && matches!(e, SiteEvent::TwinRestarted { .. }))
            .map(|(_, _, e)| e)
            .collect::<Vec<_>>()
    );
    // The verdict's "never silently": every QP told of data that did not
    // land is in error.
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    // Gateway B saw A restart and resumed nothing toward it: A's
    // requesters' flows were pseudo-ACKed by the gateway that died.
    let seen_by_b: Vec<(usize, usize)> = w
        .site_events
        .iter()
        .filter_map(|(node, _, e)| match e {
            SiteEvent::TwinRestarted {
                flows_failed,
                flows_resumed,
                ..
            } if *node == Node::GwB => Some((*flows_failed, *flows_resumed)),
            _ => None,
        })
        .collect();
    assert_eq!(seen_by_b.len(), 1, "{seen_by_b:?}");
    assert!(seen_by_b[0].0 > 0 && seen_by_b[0].1 == 0, "{seen_by_b:?}");
    assert!(
        w.host_a.qps.iter().all(|q| q.is_error()),
        "every QP of host A moved to error"
    );
}

/// The near gateway dies at the same point, with standbys whose mirrors
/// have one-way delay `mirror`; its standby takes over 1 ms later.
fn death_with_standby(op: Op, mirror: Duration) -> Scenario {
    Scenario {
        standby: Some((mirror, Duration::from_millis(1))),
        ..restart(op, true)
    }
}

/// Restarts of its twin (a new incarnation) that gateway `by` saw.
fn restarts_seen(w: &World, by: Node) -> usize {
    w.site_events
        .iter()
        .filter(|(node, _, e)| *node == by && matches!(e, SiteEvent::TwinRestarted { .. }))
        .count()
}

fn check_nothing_failed(s: &Scenario, o: &Outcome, w: &World, what: &str) {
    let sides = if s.bidirectional { 2 } else { 1 };
    let all = sides * u64::from(s.qps) * u64::from(s.iters);
    println!(
        "{what}: {} ok, {} failed, {} B verified, calls lost on the mirror {:?}, sends made \
         again {:?}, packets lost while taking over {:?}, requester resends {}",
        o.messages_ok,
        o.messages_failed,
        o.bytes_verified,
        o.standby_lost_on_mirror,
        o.standby_resent,
        o.lost_while_taking_over,
        o.requester_retransmissions
    );
    assert!(o.violations.is_empty(), "{what}: {:?}", o.violations);
    assert!(o.finished, "{what}");
    assert_eq!((o.messages_ok, o.messages_failed), (all, 0), "{what}");
    if s.op != Op::Atomic {
        assert_eq!(o.bytes_verified, all * s.size as u64, "{what}");
    }
    assert_eq!(o.bytes_lost + o.bytes_duplicated + o.bytes_misordered, 0);
    // The standby did take over mid-stream, after losing what was on the
    // mirror, and B saw no new incarnation: the same WAN session.
    assert!(o.standby_lost_on_mirror.is_some(), "{what}: no takeover");
    let died = s.twin_restart.expect("a death").as_secs_f64();
    assert!(o.elapsed_s > 2.0 * died, "{what}: it died mid-stream");
    let survivor = if s.restart_near { Node::GwB } else { Node::GwA };
    assert_eq!(restarts_seen(w, survivor), 0, "{what}");
    assert_eq!(w.nonces_reused, 0, "{what}");
    assert!(w.gw_a.iter().all(|g| g.engine().stats.twin_lost == 0));
}

#[test]
fn a_near_gateway_that_dies_is_replaced_by_its_standby_and_nothing_fails() {
    for op in [Op::Write, Op::Send, Op::Read, Op::Atomic] {
        let s = death_with_standby(op, Duration::from_micros(5));
        let (o, w) = run_world(&s, false).expect("runs");
        check_nothing_failed(&s, &o, &w, &format!("{op:?}"));
    }
}

#[test]
fn a_standby_holds_through_wan_loss_hardware_requesters_and_a_slow_mirror() {
    let cases = [
        ("write, WAN loss 0.1 %", {
            let mut s = death_with_standby(Op::Write, Duration::from_micros(5));
            s.wan_loss = 0.001;
            s
        }),
        ("read, 4 hardware QPs", {
            let mut s = death_with_standby(Op::Read, Duration::from_micros(5));
            s.endpoint = EndpointModel::Hw;
            s.qps = 4;
            s
        }),
        // The far gateway dies, with requests both ways: B had
        // pseudo-ACKed host B's (without a standby those QPs fail).
        ("far, both ways", {
            let mut s = death_with_standby(Op::Write, Duration::from_micros(5));
            s.restart_near = false;
            s.bidirectional = true;
            s
        }),
        // A mirror of 0.1 ms: hundreds of calls on their way when A dies.
        (
            "send, mirror 100 µs",
            death_with_standby(Op::Send, Duration::from_micros(100)),
        ),
    ];
    for (what, s) in cases {
        let (o, w) = run_world(&s, false).expect("runs");
        check_nothing_failed(&s, &o, &w, what);
        assert!(o.standby_lost_on_mirror.is_some_and(|n| n > 0), "{what}");
    }
}

#[test]
fn a_standby_that_never_takes_over_changes_nothing_but_a_few_microseconds() {
    let mut s = death_with_standby(Op::Write, Duration::from_micros(5));
    s.twin_restart = None;
    let (with, _) = run_world(&s, false).expect("runs");
    s.standby = None;
    let (without, _) = run_world(&s, false).expect("runs");
    println!(
        "with a standby {:?} Gb/s in {} s, without {:?} Gb/s in {} s",
        with.goodput_gbps, with.elapsed_s, without.goodput_gbps, without.elapsed_s
    );
    assert!(with.violations.is_empty() && without.violations.is_empty());
    assert_eq!(with.bytes_verified, without.bytes_verified);
    assert!(with.standby_lost_on_mirror.is_none(), "no takeover");
    // What a standby costs in DC bandwidth: each gateway mirrors each
    // byte it carries once (plus headers, ACKs and twin messages).
    let mirrored = with.standby_mirrored_bytes.expect("standbys");
    for (gw, bytes) in ["A", "B"].into_iter().zip(mirrored) {
        let per_byte = bytes as f64 / with.bytes_verified as f64;
        println!("gateway {gw} mirrored {per_byte:.3} bytes per byte verified");
        assert!((1.0..1.1).contains(&per_byte), "{gw}: {per_byte}");
    }
    // Output commit delays what A sends by twice the mirror's 5 µs: the
    // run is longer by little more than that per round trip, far less
    // than 1 %.
    assert!(
        with.elapsed_s < without.elapsed_s * 1.01,
        "{} vs {}",
        with.elapsed_s,
        without.elapsed_s
    );
}
