//! A far gateway killed and restarted mid-stream, in the simulator (issue
//! 35): gateway B (the one re-injecting toward host B's responders)
//! crashes and a new incarnation starts at once. Gateway A sends the new
//! one again whatever B had not delivered, the new B learns each QP from
//! those packets, and every transfer completes with every byte verified;
//! nothing failed. A near gateway's restart (gateway A: what it
//! pseudo-ACKed died with it) still fails its flows, loudly. Virtual time:
//! no check depends on the machine's speed.

use std::time::Duration;

use soya_proto::site::SiteEvent;
use soya_tools::sim::scenario::{run_world, Op, Scenario};
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
