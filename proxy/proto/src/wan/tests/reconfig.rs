//! Path-set changes mid-stream ([`WanConnection::reconfigure_paths`]), in
//! the simulator: nothing lost, nothing duplicated, and the change shows in
//! what the paths carry.

use super::*;
use crate::wan::PathChange;

/// Two links per direction; the configuration may use fewer.
fn two_links(rate: u64) -> Vec<LinkCfg> {
    vec![LinkCfg::new(us(1500), rate), LinkCfg::new(us(1500), rate)]
}

fn paths(cfg: &WanConfig, n: usize, rate: u64) -> Vec<PathConfig> {
    (0..n)
        .map(|i| PathConfig {
            name: format!("p{i}"),
            rate_bps: Some(rate),
            weight: 1,
            rtt_hint: cfg.paths[0].rtt_hint,
        })
        .collect()
}

/// When the tests change the paths, the traffic in full swing.
const CHANGE_AT: Time = Time::from_millis(100);

/// `flows` endless flows of 1000..4200-byte messages from side 0 over
/// `links`, run up to [`CHANGE_AT`]. Only ordering and exactly-once are
/// checked, not the bytes.
fn streaming(cfg: &WanConfig, links: Vec<LinkCfg>, seed: u64, flows: usize) -> (Sim, Workload) {
    let mut sim = Sim::symmetric(cfg.clone(), links, seed);
    let mut w = Workload::new(flows, None, (1000, 4200));
    w.full_check = false;
    run_until(&mut sim, &mut w, CHANGE_AT);
    (sim, w)
}

/// Both twins reload the same paths at once: what each reports (the
/// packets requeued may differ).
fn reconfigure_both(sim: &mut Sim, paths: &[PathConfig]) -> [Vec<PathChange>; 2] {
    let now = sim.now;
    [0, 1].map(|side| sim.ends[side].reconfigure_paths(now, paths))
}

fn data_bytes_sent(sim: &Sim, side: usize, path: usize) -> u64 {
    sim.ends[side].stats().paths[path].counters.bytes_sent
}

#[test]
fn a_path_added_mid_stream_carries_traffic() {
    let rate = GBPS / 4;
    let cfg = wan_cfg(&[(rate, ms(3))], CcKind::FixedRate, None);
    let (mut sim, mut w) = streaming(&cfg, two_links(rate), 71, 8);
    let new = paths(&cfg, 2, rate);
    let added = vec![PathChange::Added {
        index: 1,
        name: "p1".into(),
    }];
    assert_eq!(reconfigure_both(&mut sim, &new), [added.clone(), added]);
    run_until(&mut sim, &mut w, Time::from_millis(300));
    let before = w.goodput(Time::from_millis(50), CHANGE_AT);
    let after = w.goodput(Time::from_millis(200), Time::from_millis(300));
    let s = sim.ends[0].stats();
    println!(
        "path added at 100 ms: goodput {:.0} → {:.0} Mb/s; path 1 sent {} B",
        before / 1e6,
        after / 1e6,
        s.paths[1].counters.bytes_sent
    );
    assert_eq!(s.paths[1].state, PathState::Up, "{}", brief(&s));
    assert!(
        data_bytes_sent(&sim, 0, 1) > 1_000_000,
        "the new path carries data"
    );
    assert!(after > 1.5 * before, "two paths carry more than one");
    drain(&mut sim, &mut w, Time::from_millis(10_000));
    assert_done("path added", &sim, &w);
}

#[test]
fn a_path_removed_mid_stream_loses_nothing() {
    for cc in [CcKind::FixedRate, CcKind::Bbr] {
        let rate = GBPS / 4;
        let cfg = wan_cfg(&[(rate, ms(3)), (rate, ms(3))], cc, None);
        // Path 1 dies 5 ms before the operator removes it: what it had in
        // flight then is lost, and only the removal can resend it (a
        // removed path is never probed or declared down again).
        let mut links = two_links(rate);
        links[1].down = vec![(Time::from_millis(95), Time::from_millis(100_000))];
        let (mut sim, mut w) = streaming(&cfg, links, 72, 8);
        assert!(data_bytes_sent(&sim, 0, 1) > 1_000_000, "path 1 was used");
        // The sender removes path 1 first; the receiver 30 ms later (the
        // twins reload one after the other).
        let one = paths(&cfg, 1, rate);
        let ch = sim.ends[0].reconfigure_paths(sim.now, &one);
        let requeued = match ch.as_slice() {
            [PathChange::Removed {
                index: 1,
                requeued_packets,
                ..
            }] => *requeued_packets,
            other => panic!("{other:?}"),
        };
        let sent_at_removal = data_bytes_sent(&sim, 0, 1);
        run_until(&mut sim, &mut w, Time::from_millis(130));
        sim.ends[1].reconfigure_paths(sim.now, &one);
        run_until(&mut sim, &mut w, Time::from_millis(300));
        let after = w.goodput(Time::from_millis(200), Time::from_millis(300));
        println!(
            "{cc:?}: path removed mid-stream with {requeued} packets in flight; one path then carries {:.0} Mb/s",
            after / 1e6
        );
        assert!(requeued > 0, "something was in flight on the removed path");
        assert_eq!(
            data_bytes_sent(&sim, 0, 1),
            sent_at_removal,
            "nothing sent on a removed path"
        );
        assert_eq!(sim.ends[0].stats().paths[1].state, PathState::Retired);
        assert!(after > 0.8 * rate as f64, "the survivor carries on");
        // Everything queued (tens of MB for two paths) now drains at one
        // path's rate.
        drain(&mut sim, &mut w, Time::from_millis(10_000));
        // The workload asserted every message exactly once, in order.
        assert_done(&format!("path removed {cc:?}"), &sim, &w);
        // The last ACKs reach the sender.
        let end = sim.now + ms(100);
        run_until(&mut sim, &mut w, end);
        let a = sim.ends[0].stats();
        assert_eq!(a.messages_discarded, 0);
        assert_eq!(a.send_buffered, 0, "every message acknowledged");
    }
}

#[test]
fn a_path_replaced_in_its_slot_keeps_its_packet_numbers() {
    // Path 0 removed, so p1 becomes path 0 (renumbering): slot 0's packet
    // numbers continue (a reused nonce would be fatal), and the twin accepts
    // them once it reloaded too.
    let rate = GBPS / 4;
    let cfg = wan_cfg(&[(rate, ms(3)), (rate, ms(3))], CcKind::FixedRate, None);
    let (mut sim, mut w) = streaming(&cfg, two_links(rate), 73, 4);
    let mut renamed = paths(&cfg, 1, rate);
    renamed[0].name = "p1".into();
    for changes in reconfigure_both(&mut sim, &renamed) {
        assert!(changes.contains(&PathChange::Added {
            index: 0,
            name: "p1".into()
        }));
    }
    run_until(&mut sim, &mut w, Time::from_millis(300));
    let s = sim.ends[1].stats();
    assert_eq!(s.paths[0].state, PathState::Up, "{}", brief(&s));
    assert_eq!(s.replays_dropped, 0, "no packet taken for a replay");
    drain(&mut sim, &mut w, Time::from_millis(10_000));
    assert_done("path replaced", &sim, &w);
}

#[test]
fn a_rate_change_takes_effect() {
    let link = GBPS;
    let (low, high) = (GBPS / 5, GBPS * 3 / 5);
    let cfg = wan_cfg(&[(low, ms(3))], CcKind::FixedRate, None);
    let (mut sim, mut w) = streaming(&cfg, two_links(link), 74, 8);
    let faster = paths(&cfg, 1, high);
    let retuned = vec![PathChange::Retuned {
        index: 0,
        name: "p0".into(),
        what: vec!["rate"],
    }];
    assert_eq!(
        reconfigure_both(&mut sim, &faster),
        [retuned.clone(), retuned]
    );
    run_until(&mut sim, &mut w, Time::from_millis(300));
    let before = w.goodput(Time::from_millis(50), CHANGE_AT);
    let after = w.goodput(Time::from_millis(150), Time::from_millis(300));
    println!(
        "rate {} → {} Mb/s: goodput {:.0} → {:.0} Mb/s",
        low / 1_000_000,
        high / 1_000_000,
        before / 1e6,
        after / 1e6
    );
    assert!(before <= 1.05 * low as f64, "paced at the old rate");
    assert!(after > 1.05 * low as f64 * 2.0, "paced at the new rate");
    assert!(after <= 1.05 * high as f64);
    drain(&mut sim, &mut w, Time::from_millis(10_000));
    assert_done("rate change", &sim, &w);
}
