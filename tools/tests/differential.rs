//! The simulator and the daemon drive the same `Site` the same way.
//!
//! A simulated run (two gateways between two hosts at 300 km, two WAN
//! paths, one of them cut for a while, gateway B crashing and coming back
//! mid-stream) records everything gateway A was given, at which instants it
//! ran, and everything it sent. The same trace is then fed to a fresh
//! gateway A, built with the same settings and nonces, through the daemon's
//! own device turn (`soya::gateway::turn::Turn`) over in-memory DC and WAN
//! ports and a virtual clock. Both must send the same packets in the same
//! order: DC packets byte for byte, WAN datagrams byte for byte and path
//! for path.
//!
//! What this catches: any difference between how the simulator and the
//! daemon drive a gateway (the order they feed input, fire timers and take
//! output, or glue of their own between engine and transport, such as a
//! flow key of their own), since the sweep's verdicts are only worth
//! anything if the simulator runs what the daemon runs.

#![deny(unsafe_code)]

use std::cell::Cell;
use std::time::Duration;

use soya::gateway::memory::{MemDc, MemWan, VirtualClock};
use soya::gateway::turn::Turn;
use soya_proto::site::Site;
use soya_proto::time::Time;
use soya_tools::sim::scenario::{
    run_world, seeded_nonces, site_params, Op, Scenario, HOST_A, HOST_B,
};
use soya_tools::sim::world::{Emitted, Payload, TraceItem};

/// A run with a path cut and a twin restart, gateway A traced.
fn scenario() -> Scenario {
    Scenario {
        seed: 7,
        distance_km: 300.0,
        op: Op::Write,
        size: 16_384,
        tx_depth: 32,
        qps: 3,
        iters: 2_000,
        // Fast paths: the transport hands out datagrams due at once, so
        // the turn never holds one for later (the simulator schedules a
        // paced datagram at its release time; the daemon would wait for
        // it, and datagrams it then builds later carry later timestamps).
        wan_gbps: 400.0,
        paths: 2,
        cut_path: Some((Duration::from_millis(1), Duration::from_millis(40))),
        twin_restart: Some(Duration::from_millis(3)),
        bidirectional: true,
        ..Scenario::default()
    }
}

/// Replays the trace through the daemon's device turn.
fn replay_through_the_daemons_turn(s: &Scenario, seed: u64, trace: &[TraceItem]) -> Emitted {
    let mut site = Site::new(
        site_params(s, HOST_A, HOST_B),
        Time::ZERO,
        seeded_nonces(seed),
    );
    let mut turn = Turn::new(site.params().wan.max_datagram);
    let (mut dc, mut wan) = (MemDc::default(), MemWan::default());
    let clock = VirtualClock(Cell::new(Time::ZERO));
    for item in trace {
        match item {
            TraceItem::Input(Payload::Ip(p)) => dc.rx.push_back(p.clone()),
            TraceItem::Input(Payload::Wan(path, d)) => wan.rx.push_back((*path, d.clone())),
            TraceItem::Turn(t) => {
                clock.0.set(clock.0.get().max(*t));
                turn.run_all(&mut site, &mut dc, &mut wan, &clock)
                    .expect("memory never fails");
                while site.poll_event().is_some() {}
            }
        }
    }
    Emitted {
        dc: dc.tx.into(),
        wan: wan.sent.into(),
    }
}

/// Where two output sequences first differ, for the failure message.
fn first_difference<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
    (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
}

#[test]
fn the_simulator_and_the_daemons_turn_emit_the_same_packets() {
    let s = scenario();
    let (out, w) = run_world(&s, true).expect("scenario builds");
    let trace = w.trace_a.as_ref().expect("traced");
    let sim = &w.emitted_a;
    // The trace holds what it must: traffic both ways, the restart, the cut.
    let inputs = trace
        .iter()
        .filter(|t| matches!(t, TraceItem::Input(_)))
        .count();
    assert!(inputs > 1_000, "a real run: {inputs} inputs");
    assert!(
        sim.dc.len() > 100 && sim.wan.len() > 1_000,
        "{} {}",
        sim.dc.len(),
        sim.wan.len()
    );
    assert!(
        w.site_events
            .iter()
            .any(|(_, _, e)| matches!(e, soya_proto::site::SiteEvent::TwinRestarted { .. })),
        "gateway A saw the twin restart: {:?}",
        w.site_events
    );
    assert!(
        w.site_events
            .iter()
            .any(|(_, _, e)| matches!(e, soya_proto::site::SiteEvent::PathDown(0))),
        "gateway A saw path 0 cut"
    );
    assert!(out.messages_ok > 0);

    let daemon = replay_through_the_daemons_turn(&s, w.nonce_seeds[0], trace);
    if let Some(i) = first_difference(&sim.dc, &daemon.dc) {
        let show = |v: &[Vec<u8>]| {
            v[i.saturating_sub(2)..(i + 3).min(v.len())]
                .iter()
                .map(|p| match soya_proto::roce::RocePacket::parse(p) {
                    Ok(r) => r.to_string(),
                    Err(_) => format!("{} bytes", p.len()),
                })
                .collect::<Vec<_>>()
        };
        eprintln!(
            "simulator: {:#?}\ndaemon: {:#?}",
            show(&sim.dc),
            show(&daemon.dc)
        );
        panic!(
            "DC packet {i} differs (simulator sent {}, the daemon's turn {})",
            sim.dc.len(),
            daemon.dc.len()
        );
    }
    if let Some(i) = first_difference(&sim.wan, &daemon.wan) {
        panic!(
            "WAN datagram {i} differs (simulator sent {}, the daemon's turn {}): {:?} vs {:?}",
            sim.wan.len(),
            daemon.wan.len(),
            sim.wan.get(i).map(|(p, d)| (p, d.len())),
            daemon.wan.get(i).map(|(p, d)| (p, d.len())),
        );
    }
}
