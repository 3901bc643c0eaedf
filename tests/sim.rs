//! The simulator driving the real gateway state machines and RC endpoints:
//! invariants over randomized scenarios, and latency hiding at 300 km.
//! Virtual time, so the figures are deterministic (not wall-clock timings).

#![deny(unsafe_code)]

use soya_tools::rc::hw::EndpointModel;
use soya_tools::sim::oversub::oversubscribed_scenario;
use soya_tools::sim::scenario::{run, Op, Scenario};
use soya_tools::sim::sweep::{sweep, SweepConfig, SweepTotals};

/// A sweep of `scenarios` from `seed` as CI runs it: no progress line or
/// per-scenario report, loss inside the DC too, the default (rxe)
/// endpoints, no extra key updates, none over-subscribed.
fn quiet(scenarios: u64, seed: u64) -> SweepConfig {
    SweepConfig {
        scenarios,
        seed,
        progress: false,
        verbose: false,
        dc_loss: true,
        endpoint: Default::default(),
        key_update_interval: None,
        oversub_every: 0,
        standby_deaths: false,
        threads: 0,
    }
}

/// Runs the sweep; every invariant held and no byte was lost, duplicated
/// or misordered.
fn sweep_clean(cfg: SweepConfig) -> SweepTotals {
    let t = sweep(&cfg);
    assert_eq!(t.violations, 0, "{}", t.summary());
    assert_eq!(
        (t.bytes_lost, t.bytes_duplicated, t.bytes_misordered),
        (0, 0, 0)
    );
    t
}

#[test]
fn randomized_scenarios_keep_every_invariant() {
    // Everything the sweep draws, loss inside the requester's DC included.
    // (The over-subscribed draws run in `oversubscribed_scenarios_...`.)
    let t = sweep_clean(quiet(300, 1));
    assert!(t.bytes_verified > 10_000_000, "{}", t.summary());
    assert!(t.messages_failed_as_injected > 0, "failure paths exercised");
    eprintln!("{}", t.summary());
}

#[test]
fn randomized_scenarios_keep_every_invariant_with_hardware_endpoints() {
    // The same draws with ConnectX-class endpoints (send-queue windows,
    // adaptive 2/4/8/16 ms timer, 655 ms RNR waits, DCQCN): other seeds
    // than the rxe sweep above, so CI covers more of the space. (300:
    // "a few hundred seeds of both models", issue 18; affordable since a
    // simulator step visits only the QPs it touches.)
    let t = sweep_clean(SweepConfig {
        endpoint: EndpointModel::Hw,
        ..quiet(300, 100_001)
    });
    assert!(t.bytes_verified > 1_000_000, "{}", t.summary());
    eprintln!("{}", t.summary());
}

#[test]
fn randomized_scenarios_keep_every_invariant_with_frequent_key_updates() {
    // Other draws, with the gateways replacing their WAN keys as often as
    // they may (an update asked for every millisecond; each still waits
    // for the twin's ACK under the current key, then 2 × its retention).
    let t = sweep_clean(SweepConfig {
        key_update_interval: Some(std::time::Duration::from_millis(1)),
        ..quiet(100, 200_001)
    });
    assert!(t.wan_key_updates > 100, "{}", t.summary());
    eprintln!("{}", t.summary());
}

#[test]
fn a_gateway_replaced_by_its_standby_at_random_points_fails_nothing() {
    // Issue 38: every scenario's gateways have standbys and one of them (A
    // or B) dies at a random point (mid-message, mid-READ, during WAN or
    // DC loss, a path cut), the mirror's delay and the takeover's length
    // drawn. What the
    // scenario injects itself (a responder error, missing receives) may
    // fail; the death may not (the verdict's "taken over").
    let t = sweep_clean(SweepConfig {
        standby_deaths: true,
        ..quiet(200, 300_001)
    });
    assert!(t.standby_takeovers > 50, "{}", t.summary());
    eprintln!("{}", t.summary());
}

/// Over-subscribed scenarios (`sim::oversub`, issue 33): 2–16 QPs offering
/// 2–16× the WAN for the whole transfer against a small buffer, rxe and
/// hardware endpoints, one and several paths, WRITE/SEND/READ/mixed. Every
/// invariant of the sweep must hold. 2,000 of them (issue 33 asks for at
/// least that many in CI): rxe seeds 1–1,500 and hardware seeds
/// 100,001–100,500, about 10 CPU-minutes, spread over the machine's cores
/// (`SweepConfig::threads`). They hold the regressions found so far: rxe
/// seed 61 (seven owed NAKs in one round before a window granted to a flow
/// holding nothing was promised), rxe seed 1436 (a round of READ resends
/// whose queued answers the far side dropped; also the ingress test
/// `a_round_of_resends_that_replays_a_read_...`), and hardware seed
/// 100104 (a READ's copies from a path cut replayed 29 times, past the far
/// pending queue's bound, before the egress injected one copy per RTO).
/// The QPs' shares of the WAN are measured and printed
/// (`SweepTotals::unfair`), not asserted: a few runs in a thousand still
/// fall below half an equal share (docs/benchmarks.md).
#[test]
fn oversubscribed_scenarios_keep_every_invariant() {
    oversubscribed_sweeps((1, 1_500), (100_001, 500));
}

/// The two least fair over-subscribed runs of rxe seeds 1–1,500 before
/// the ingress counted a requester's dropped packets in its window
/// (`PseudoAcker::note_dropped`): strict policy, one window per 256 KiB
/// message, a QP at 0.05 (seed 240) and 0.03 (seed 334) of an equal share.
/// Each QP that hit the hard limit looked stopped at the packets admitted
/// before the drop, half its window; promised that half after its NAK,
/// its resend overran the room promised to the others' resends, which were
/// dropped again, and one QP lost round after round. Now 0.91 each.
#[test]
fn a_requester_whose_window_was_dropped_gets_its_share() {
    for seed in [240, 334] {
        let s = oversubscribed_scenario(seed, EndpointModel::Rxe);
        let o = run(&s).unwrap();
        assert!(o.violations.is_empty(), "seed {seed}: {:?}", o.violations);
        let share = o.min_share.expect("judged");
        assert!(share >= 0.5, "seed {seed}: {:?}", o.unfair);
    }
}

/// Over-subscribed hardware seed 100819: four QPs whose send queues hold
/// 8 packets each, over three 2 Gb/s paths at 0 km. A QP stopped at so
/// narrow a window has no more outstanding than a paced promise allows, so
/// the pacer leaves it alone (`qp::ingress::pacing`): paced after 1 ms of
/// withholding like a wide one, their CNPs cut the QPs' DCQCN rates until
/// the four carried 2.5 Gb/s instead of 5.5, one of them 0.08 of an equal
/// share. Now 0.87.
#[test]
fn requesters_at_narrow_windows_are_not_paced_below_their_share() {
    let s = oversubscribed_scenario(100_819, EndpointModel::Hw);
    let o = run(&s).unwrap();
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    let share = o.min_share.expect("judged");
    assert!(share >= 0.5, "{:?}", o.unfair);
    let goodput = o.goodput_gbps.expect("finished");
    assert!(goodput >= 5.0, "{goodput} Gb/s over three 2 Gb/s paths");
}

/// 1,000 more of each, other seeds than the test above:
/// `cargo test --release --test sim -- --ignored oversubscribed`.
#[test]
#[ignore = "long: 1,000 more over-subscribed scenarios of each endpoint model"]
fn oversubscribed_scenarios_keep_every_invariant_1000_more() {
    oversubscribed_sweeps((1_501, 1_000), (100_501, 1_000));
}

/// `(first seed, scenarios)` of each endpoint model.
fn oversubscribed_sweeps(rxe: (u64, u64), hw: (u64, u64)) {
    for (endpoint, (seed, scenarios)) in [(EndpointModel::Rxe, rxe), (EndpointModel::Hw, hw)] {
        let t = sweep_clean(SweepConfig {
            dc_loss: false,
            endpoint,
            oversub_every: 1,
            ..quiet(scenarios, seed)
        });
        assert_eq!(t.oversubscribed, scenarios);
        eprintln!("{}", t.summary());
    }
}

/// 256 MiB of 64 KiB WRITEs, 128 outstanding, over 300 km: the workload of
/// the latency-hiding figures below.
fn write_64k_at_300_km() -> Scenario {
    Scenario {
        distance_km: 300.0,
        op: Op::Write,
        size: 65_536,
        tx_depth: 128,
        iters: 4096,
        ..Scenario::default()
    }
}

#[test]
fn pseudo_acks_hide_300_km() {
    let base = write_64k_at_300_km();
    let zero = run(&Scenario {
        distance_km: 0.0,
        accelerated: false,
        ..base.clone()
    })
    .unwrap();
    let direct = run(&Scenario {
        accelerated: false,
        ..base.clone()
    })
    .unwrap();
    let accel = run(&base).unwrap();
    for o in [&zero, &direct, &accel] {
        assert!(o.violations.is_empty(), "{:?}", o.violations);
    }
    let g = |o: &soya_tools::sim::scenario::Outcome| o.goodput_gbps.expect("finished");
    let (z, d, a) = (g(&zero), g(&direct), g(&accel));
    eprintln!("300 km, WRITE 64 KiB, tx depth 128: 0 km {z:.3}, direct {d:.3}, Sōya {a:.3} Gbit/s");
    // rxe's window: 128 × 4 KiB per 2.94 ms RTT ≈ 1.43 Gbit/s direct.
    assert!(d < 1.5, "direct {d}");
    // Includes the WAN session set-up, the tunnel phase (one RTT) and the
    // last one-way delay.
    assert!(a / z > 0.90, "Sōya ÷ 0 km = {}", a / z);
    assert!(a / d > 5.0, "Sōya ÷ direct = {}", a / d);
}

/// Two equal WAN paths carry one QP at twice one path's rate: the flow's
/// WAN credit window follows its buffer quota, so credit (not capacity)
/// never caps it. With the old fixed 8 MiB window this gave 1.71× at 1 GiB
/// (1.68× here).
#[test]
fn two_paths_carry_one_flow_at_twice_the_rate() {
    let one = write_64k_at_300_km();
    let two = Scenario {
        paths: 2,
        ..one.clone()
    };
    let (a, b) = (run(&one).unwrap(), run(&two).unwrap());
    for o in [&a, &b] {
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        assert_eq!(o.data_errors, 0);
    }
    let (ga, gb) = (
        a.goodput_gbps.expect("finished"),
        b.goodput_gbps.expect("finished"),
    );
    let ratio = gb / ga;
    eprintln!("300 km, 256 MiB: one path {ga:.3}, two paths {gb:.3} Gbit/s: {ratio:.3}×");
    assert!(ratio >= 1.8, "two paths ÷ one = {ratio:.3}");
}

#[test]
fn a_responder_error_never_looks_like_success_for_later_requests() {
    let s = Scenario {
        responder_error: true,
        iters: 40,
        size: 8192,
        ..Scenario::default()
    };
    let o = run(&s).unwrap();
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    assert!(o.messages_failed > 0, "the error reached the requester");
}

/// A planned restart (`systemctl restart`: a drain, CLOSE "restart", a new
/// incarnation) of either gateway 20 ms into 256 MiB of 64 KiB WRITEs,
/// SENDs and READs at 300 km: the drain ends clean, every work request
/// completes and every byte is verified (issue 35). Taken as a final
/// CLOSE, as before, the flows failed.
#[test]
fn a_planned_restart_of_either_gateway_fails_nothing() {
    for op in [Op::Write, Op::Send, Op::Read] {
        for near in [false, true] {
            let o = run(&Scenario {
                op,
                twin_restart: Some(std::time::Duration::from_millis(20)),
                restart_near: near,
                planned_restart: true,
                ..write_64k_at_300_km()
            })
            .unwrap();
            let what = format!(
                "{op:?}, restart of the {} gateway",
                ["far", "near"][usize::from(near)]
            );
            eprintln!(
                "{what}: drain {:?} s, {} B verified, {} requester retransmissions",
                o.restart_pause_s, o.bytes_verified, o.requester_retransmissions
            );
            assert!(o.violations.is_empty(), "{what}: {:?}", o.violations);
            assert_eq!(o.restart_clean, Some(true), "{what}: the drain ended clean");
            assert!(o.finished, "{what}");
            assert_eq!(o.messages_failed, 0, "{what}");
            assert_eq!(o.bytes_verified, 256 << 20, "{what}");
        }
    }
}

/// Planned restarts of the 10,000-scenario sweep that once ended with
/// implied NAKs (4657, 6149, 6337: a tunnel's answers died with the old
/// session), did not finish (2582) or timed out their drain for nothing
/// (990, 1858: resends and the rest of a message refused; 874, 2994,
/// 4110: entries acknowledged while switching to pseudo-ACKs counted as
/// owed; 3603: `strict`'s last entry, delivered before it was
/// acknowledged). Each drains clean and keeps every invariant.
#[test]
fn planned_restarts_of_the_sweep_drain_clean() {
    for seed in [4657, 6149, 6337, 2582, 990, 1858, 874, 2994, 4110, 3603] {
        let s = soya_tools::sim::sweep::sweep_scenario(seed, EndpointModel::Rxe, true);
        assert!(s.planned_restart, "seed {seed} draws a planned restart");
        let o = run(&s).unwrap();
        assert!(o.violations.is_empty(), "seed {seed}: {:?}", o.violations);
        assert_eq!(
            o.restart_clean,
            Some(true),
            "seed {seed}: the drain timed out"
        );
    }
}

/// A run cut at its time limit while the gateways hold pseudo-ACKed data
/// (8 QPs of WRITEs over a 1 Gb/s WAN, 300 km, 2 GiB in all, stopped after
/// 200 ms of virtual time; the second of settling after the cut, in which
/// the workload goes on, ends with the gateways still holding data): the verdict says it did not finish and that what the
/// applications were told had landed was still on its way, once, with no
/// goodput and no byte counted lost. Before, such a run (64 hardware QPs
/// at the event cap) printed a "silent loss" line per QP for bytes that
/// were only held in the gateways' buffers.
#[test]
fn a_run_cut_short_is_reported_as_cut_not_as_a_silent_loss() {
    let s = Scenario {
        distance_km: 300.0,
        op: Op::Write,
        size: 65_536,
        tx_depth: 128,
        qps: 8,
        iters: 4096,
        wan_gbps: 1.0,
        time_limit: std::time::Duration::from_millis(200),
        ..Scenario::default()
    };
    let o = run(&s).expect("runs");
    println!(
        "{:?} completed {} verified {} ok {}",
        o.violations, o.bytes_completed, o.bytes_verified, o.messages_ok
    );
    assert!(!o.finished, "{o:?}");
    assert!(o.goodput_gbps.is_none(), "{o:?}");
    assert_eq!(o.bytes_lost, 0, "{:?}", o.violations);
    let starts = |p: &str| o.violations.iter().filter(|v| v.starts_with(p)).count();
    assert_eq!(starts("did not finish"), 1, "{:?}", o.violations);
    assert_eq!(starts("cut before the end"), 1, "{:?}", o.violations);
    assert!(
        !o.violations.iter().any(|v| v.contains("silent loss")),
        "{:?}",
        o.violations
    );
}
