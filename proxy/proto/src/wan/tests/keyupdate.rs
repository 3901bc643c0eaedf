//! Key updates end to end, at packet level: transfers across many updates
//! under loss, reordering and duplication; a packet of the old phase after
//! the switch; a forged phase bit; a retransmission racing an update;
//! replays from an earlier phase; goodput with frequent updates.

use proptest::prelude::*;

use super::*;

/// Bit 2 of the flags byte: the key phase (`packet::header`).
const PHASE_BIT: u8 = 0b100;

fn phase(b: &[u8]) -> bool {
    b[1] & PHASE_BIT != 0
}

fn is_protected(b: &[u8]) -> bool {
    b[1] & 3 == 0
}

fn pn(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[16..24].try_into().unwrap())
}

/// A keyed config whose sending keys are replaced after `packets` packets
/// or `interval`.
fn updating(paths: usize, cipher: Cipher, packets: u64, interval: Duration) -> WanConfig {
    let mut cfg = wan_cfg(&vec![(GBPS, ms(3)); paths], CcKind::FixedRate, Some(KEY));
    cfg.cipher = CipherPolicy::Only(cipher);
    cfg.tuning.key_update_packets = packets;
    cfg.tuning.key_update_interval = interval;
    cfg
}

/// Sim::transmit for side 0 where `hold(now, packet)` may keep a packet
/// out of the network (returned to the caller); side 1 is left to
/// `Sim::step`.
fn transmit_filtered(sim: &mut Sim, hold: &mut impl FnMut(Time, &[u8]) -> bool) -> Captured {
    let mut held = Vec::new();
    let now = sim.now;
    while let Some(t) = sim.ends[0].poll_transmit(now, &mut sim.buf) {
        let bytes = sim.buf[..t.len].to_vec();
        if hold(now, &bytes) {
            held.push((t.path, bytes));
        } else {
            inject(sim, t.path, t.release_at, bytes);
        }
    }
    held
}

/// Hands a packet of side 0 to its link at `at`.
fn inject(sim: &mut Sim, path: usize, at: Time, bytes: Vec<u8>) {
    for at in sim.links[0][path].send(&mut sim.rng, at, bytes.len()) {
        sim.seq += 1;
        sim.heap.push(Reverse((at, sim.seq)));
        sim.in_flight.insert(sim.seq, (1, path, bytes.clone()));
    }
}

/// Runs the workload with side 0's packets passed through `hold` until
/// `until` or `stop`; `held` gets the packets held back, and may give
/// some back to the network (`release`).
fn run_holding(
    sim: &mut Sim,
    w: &mut Workload,
    until: Time,
    mut hold: impl FnMut(Time, &[u8]) -> bool,
    mut release: impl FnMut(&mut Captured) -> Captured,
    mut stop: impl FnMut(&Sim) -> bool,
) -> Captured {
    let mut held = Vec::new();
    while sim.now < until && !stop(sim) {
        w.pump(sim);
        held.extend(transmit_filtered(sim, &mut hold));
        for (path, bytes) in release(&mut held) {
            let now = sim.now;
            inject(sim, path, now, bytes);
        }
        if !sim.step() {
            break;
        }
    }
    w.pump(sim);
    held
}

/// Delivers `p` to side 1 now; returns B's stats before and after.
fn deliver(sim: &mut Sim, p: &(usize, Vec<u8>)) -> (ConnStats, ConnStats) {
    let before = sim.ends[1].stats();
    sim.ends[1].handle_datagram(sim.now, p.0, &p.1);
    // Late data is a duplicate at the flow level: nothing to deliver.
    while sim.ends[1].poll_event().is_some() {}
    (before, sim.ends[1].stats())
}

fn keep_all(_: &mut Captured) -> Captured {
    Vec::new()
}

/// The standard transfer across many key updates, for each cipher, with
/// loss, reordering (past the switches), duplication and jitter on two
/// paths: everything arrives once and in order, the receiver follows every
/// update of its peer, reordered packets of the old phase open with the
/// key before, and no authentic packet fails.
#[test]
fn transfer_across_many_updates_with_loss_reordering_duplication() {
    for cipher in Cipher::ALL {
        let cfg = updating(2, cipher, 200, ms(15));
        let mut l = LinkCfg::rough();
        l.jitter = us(100);
        let mut sim = Sim::symmetric(cfg, vec![l.clone(), l], 300);
        let per_flow = if cfg!(debug_assertions) { 500 } else { 5000 };
        let mut w = Workload::new(8, Some(per_flow), (40, 4200));
        run(&mut sim, &mut w, Time::from_millis(20_000));
        assert_done(&format!("key updates, {cipher}"), &sim, &w);
        let (a, b) = (sim.ends[0].stats(), sim.ends[1].stats());
        println!(
            "{cipher}: A updated {} times, B {} times; B opened {} late packets with the key before",
            a.tx_key_updates, b.tx_key_updates, b.rx_key_previous
        );
        let least = if cfg!(debug_assertions) { 1 } else { 6 };
        assert!(
            a.tx_key_updates >= least,
            "{cipher}: {} updates",
            a.tx_key_updates
        );
        assert!(b.tx_key_updates >= 1, "{cipher}: B (ACKs) updates too");
        assert_eq!(b.rx_key_updates, a.tx_key_updates, "{cipher}");
        assert_eq!(a.rx_key_updates, b.tx_key_updates, "{cipher}");
        assert!(
            b.rx_key_previous > 0,
            "{cipher}: no reordering across a switch"
        );
        assert_eq!(a.auth_failures + b.auth_failures, 0, "{cipher}");
        // (The count may pass 200: an update also waits for the peer.)
        assert!(a.tx_key_packets < a.tx_key_limit && b.tx_key_packets < b.tx_key_limit);
    }
}

/// A packet of the old phase arriving after the switch opens with the key
/// before, and its replay is refused and counted; once that key is
/// dropped, a late packet of the old phase is refused and counted, and
/// moves nothing.
#[test]
fn old_phase_packet_after_the_switch_and_its_replay() {
    let cfg = updating(1, Cipher::Aes256Gcm, 1 << 30, ms(40));
    let mut sim = Sim::symmetric(cfg, vec![LinkCfg::new(us(1500), GBPS)], 301);
    let mut w = Workload::new(2, Some(50), (200, 3000));
    // Two phase-0 packets of A from 30 ms on (keepalives, once the small
    // transfer is done) never reach B on time.
    let mut n = 0;
    let held = run_holding(
        &mut sim,
        &mut w,
        Time::from_millis(1000),
        |now, b| {
            let hold = is_protected(b) && !phase(b) && now >= Time::from_millis(30) && n < 2;
            n += usize::from(hold);
            hold
        },
        keep_all,
        |s| s.ends[1].stats().rx_key_updates >= 1,
    );
    assert_done("old phase", &sim, &w);
    assert_eq!(held.len(), 2);
    let switched = sim.now;
    let (before, after) = deliver(&mut sim, &held[0]);
    assert_eq!(
        after.packets_accepted,
        before.packets_accepted + 1,
        "late packet"
    );
    assert_eq!(after.rx_key_previous, before.rx_key_previous + 1);
    assert_eq!(after.auth_failures, before.auth_failures);
    assert_eq!(after.rx_key_updates, 1);
    // Its replay: refused by the window, counted.
    let (before, after) = deliver(&mut sim, &held[0]);
    assert_eq!(after.packets_accepted, before.packets_accepted);
    assert_eq!(after.replays_dropped, before.replays_dropped + 1);
    // Past the retention (3 PTO, here < 25 ms) and before A's next update.
    let mut w = Workload::new(1, Some(0), (100, 100));
    run_until(&mut sim, &mut w, switched + ms(25));
    assert_eq!(sim.ends[1].stats().rx_key_updates, 1, "A updated again");
    let (before, after) = deliver(&mut sim, &held[1]);
    assert_eq!(after.packets_accepted, before.packets_accepted);
    assert_eq!(after.auth_failures, before.auth_failures + 1);
    assert_eq!(after.rx_key_failures, before.rx_key_failures + 1);
    assert_eq!(after.rx_key_updates, 1, "an old packet switched keys");
}

/// A phase bit flipped on the wire fails to authenticate, is counted, and
/// switches nothing: before any update (where it selects the next key),
/// and after one (where it selects the key before). The originals open.
#[test]
fn a_forged_key_phase_bit_is_refused_and_switches_nothing() {
    let cfg = updating(1, Cipher::ChaCha20Poly1305, 1 << 30, ms(30));
    let mut sim = Sim::symmetric(cfg, vec![LinkCfg::new(us(1500), GBPS)], 302);
    let mut w = Workload::new(2, Some(30), (200, 3000));
    let forge = |sim: &mut Sim, p: &(usize, Vec<u8>), accepted_as_previous: bool| {
        let mut forged = p.clone();
        forged.1[1] ^= PHASE_BIT;
        let (before, after) = deliver(sim, &forged);
        assert_eq!(after.auth_failures, before.auth_failures + 1);
        assert_eq!(after.packets_accepted, before.packets_accepted);
        assert_eq!(
            after.rx_key_updates, before.rx_key_updates,
            "forged bit switched"
        );
        let (before, after) = deliver(sim, p);
        assert_eq!(after.packets_accepted, before.packets_accepted + 1);
        assert_eq!(after.rx_key_updates, before.rx_key_updates);
        let previous = after.rx_key_previous - before.rx_key_previous;
        assert_eq!(previous, u64::from(accepted_as_previous));
    };
    // A phase-0 packet from 10 ms on, before any update.
    let taken = std::cell::Cell::new(false);
    let held = run_holding(
        &mut sim,
        &mut w,
        Time::from_millis(1000),
        |now, b| {
            let hold = !taken.get() && is_protected(b) && now >= Time::from_millis(10);
            taken.set(taken.get() | hold);
            hold
        },
        keep_all,
        |_| taken.get(),
    );
    assert_eq!(held.len(), 1);
    assert!(!phase(&held[0].1));
    assert_eq!(sim.ends[1].stats().rx_key_updates, 0);
    forge(&mut sim, &held[0], false);
    // The first packet of phase 1: B switches on the next one.
    let mut taken = false;
    let held = run_holding(
        &mut sim,
        &mut w,
        Time::from_millis(1000),
        |_, b| {
            let hold = !taken && is_protected(b) && phase(b);
            taken |= hold;
            hold
        },
        keep_all,
        |s| s.ends[1].stats().rx_key_updates >= 1,
    );
    assert_eq!(held.len(), 1);
    assert_eq!(sim.ends[1].stats().rx_key_updates, 1);
    // Flipped to phase 0, below B's first phase-1 number: the key before.
    // The original: the current key.
    forge(&mut sim, &held[0], false);
    assert_done("forged phase", &sim, &w);
}

/// The last packets A sealed before its update are lost: their data is
/// retransmitted in packets of the new phase, and arrives.
#[test]
fn a_key_update_racing_a_retransmission() {
    for cipher in Cipher::ALL {
        let cfg = updating(1, cipher, 1 << 30, ms(40));
        let mut sim = Sim::symmetric(cfg, vec![LinkCfg::new(us(1500), GBPS)], 303);
        let mut w = Workload::new(4, Some(3000), (1000, 4000));
        // Every phase-0 packet waits in a queue of 3 (released in order
        // when the fourth comes); at the first phase-1 packet the 3 queued
        // are dropped: the last three sealed under the old key.
        let mut switched = false;
        let dropped = run_holding(
            &mut sim,
            &mut w,
            Time::from_millis(1000),
            |_, b| {
                switched |= is_protected(b) && phase(b);
                is_protected(b) && !phase(b) && !switched
            },
            |held| {
                let n = held.len().saturating_sub(3);
                held.drain(..n).collect()
            },
            |s| s.ends[0].stats().tx_key_updates >= 1,
        );
        assert_eq!(dropped.len(), 3, "{cipher}");
        assert!(
            dropped.iter().all(|(_, b)| b.len() > 1000),
            "{cipher}: the dropped packets carry data"
        );
        let before = sim.ends[0].stats();
        drain(&mut sim, &mut w, Time::from_millis(5000));
        assert_done(
            &format!("retransmission across an update, {cipher}"),
            &sim,
            &w,
        );
        let (a, b) = (sim.ends[0].stats(), sim.ends[1].stats());
        assert!(a.packets_lost >= before.packets_lost + 3, "{cipher}");
        assert!(
            a.packets_retransmitted > before.packets_retransmitted,
            "{cipher}"
        );
        assert_eq!(b.auth_failures, 0, "{cipher}");
        assert!(b.rx_key_updates >= 1, "{cipher}");
    }
}

/// A packet B accepted in phase 0, replayed after several updates, is
/// refused by the replay window and counted (packet numbers run on across
/// updates); so is one of an earlier session (`tests::peer_restart…`).
#[test]
fn a_replay_from_an_earlier_phase_is_refused_and_counted() {
    let cfg = updating(1, Cipher::Aes256Gcm, 100, ms(15));
    let mut sim = Sim::symmetric(cfg, vec![LinkCfg::new(us(1500), GBPS)], 304);
    sim.tap = Some([vec![], vec![]]);
    let mut w = Workload::new(4, Some(4000), (100, 1500));
    run(&mut sim, &mut w, Time::from_millis(5000));
    assert_done("replay across phases", &sim, &w);
    let tap = sim.tap.take().unwrap();
    let accepted: Vec<&(usize, Vec<u8>)> = tap[1].iter().filter(|(_, b)| is_protected(b)).collect();
    let b = sim.ends[1].stats();
    assert!(b.rx_key_updates >= 2, "{} updates", b.rx_key_updates);
    let phases: Vec<bool> = accepted.iter().map(|(_, b)| phase(b)).collect();
    assert!(phases.contains(&true) && phases.contains(&false));
    for p in accepted.iter().step_by(7) {
        let (before, after) = deliver(&mut sim, p);
        assert_eq!(after.packets_accepted, before.packets_accepted);
        assert_eq!(after.replays_dropped, before.replays_dropped + 1);
        assert_eq!(after.rx_key_updates, before.rx_key_updates);
    }
}

/// Goodput on a 10 Gb/s path at 3 ms RTT with 0.1 % loss, keyed, with the
/// sending keys replaced as often as allowed, against the same run with
/// the default policy (no update within the run): within 1 %.
#[test]
fn goodput_with_frequent_key_updates_is_within_one_percent() {
    let end = Time::from_millis(if cfg!(debug_assertions) { 80 } else { 200 });
    let run_with = |interval: Duration| {
        let rate = 10 * GBPS;
        let mut cfg = wan_cfg(&[(rate, ms(3))], CcKind::FixedRate, Some(KEY));
        cfg.tuning.key_update_interval = interval;
        cfg.flow_window_bytes = 4 << 20;
        cfg.tuning.flow_queue_bytes = 64 << 10;
        let mut l = LinkCfg::new(us(1500), rate);
        l.loss = 0.001;
        let mut sim = Sim::symmetric(cfg, vec![l], 305);
        let mut w = Workload::new(16, None, (4000, 4000));
        w.full_check = false;
        run_until(&mut sim, &mut w, end);
        let updates = sim.ends[0].stats().tx_key_updates;
        (w.goodput(Time::from_millis(30), end), updates)
    };
    let (plain, none) = run_with(crate::wan::KEY_UPDATE_INTERVAL);
    let (updating, updates) = run_with(ms(1));
    println!(
        "10 Gb/s, 3 ms, 0.1 % loss ({end:?}): {:.3} Gb/s without key updates, \
         {:.3} Gb/s with {updates} (ratio {:.4})",
        plain / 1e9,
        updating / 1e9,
        updating / plain
    );
    assert_eq!(none, 0);
    assert!(updates >= 4, "{updates} updates");
    assert!(updating / plain >= 0.99, "ratio {}", updating / plain);
}

/// One run of [`every_datagram_accepted_exactly_once_across_updates`]:
/// every protected datagram of A that reaches B is accepted at most once,
/// and one that is never accepted was refused only because B had no
/// session yet (a data packet that overtook the handshake on the other
/// path; its data is sent again). Returns B's `no_session` count and
/// whether A's newest key phase was still in flight when the transfer
/// ended.
#[allow(clippy::too_many_arguments)]
fn accepted_exactly_once(
    seed: u64,
    loss: f64,
    reorder: f64,
    reorder_us: u64,
    duplicate: f64,
    packets: u64,
    aes: bool,
) -> Result<(u64, bool), TestCaseError> {
    let cipher = if aes {
        Cipher::Aes256Gcm
    } else {
        Cipher::ChaCha20Poly1305
    };
    let cfg = updating(2, cipher, packets, ms(5));
    let mut l = LinkCfg::new(us(1500), GBPS);
    l.loss = loss;
    l.reorder = reorder;
    l.reorder_delay = us(reorder_us);
    l.duplicate = duplicate;
    let mut sim = Sim::symmetric(cfg, vec![l.clone(), l], seed);
    sim.tap = Some([vec![], vec![]]);
    let per_flow = if cfg!(debug_assertions) { 100 } else { 600 };
    let mut w = Workload::new(8, Some(per_flow), (40, 4200));
    run(&mut sim, &mut w, Time::from_millis(20_000));
    assert_done("proptest", &sim, &w);
    // The transfer may end while A's newest phase is still on its way (the
    // PING an update sends, or a copy of it after a loss): B follows once
    // it arrives. A updates again only after B acknowledged the phase
    // before, so waiting for the two counts to meet cannot run away.
    let phase_in_flight = sim.ends[1].stats().rx_key_updates < sim.ends[0].stats().tx_key_updates;
    let deadline = sim.now + Duration::from_secs(2);
    while sim.ends[1].stats().rx_key_updates < sim.ends[0].stats().tx_key_updates
        && sim.now < deadline
        && sim.step()
    {}
    let tap = sim.tap.take().unwrap();
    let mut distinct = std::collections::HashSet::new();
    for (path, b) in tap[1].iter().filter(|(_, b)| is_protected(b)) {
        distinct.insert((*path, pn(b)));
    }
    let (a, b) = (sim.ends[0].stats(), sim.ends[1].stats());
    let distinct = distinct.len() as u64;
    prop_assert_eq!(b.auth_failures, 0);
    prop_assert_eq!(b.stale_generation, 0);
    prop_assert!(
        b.packets_accepted <= distinct,
        "{} accepted of {} distinct",
        b.packets_accepted,
        distinct
    );
    prop_assert!(
        b.packets_accepted + b.no_session >= distinct,
        "{} accepted + {} before the session < {} distinct",
        b.packets_accepted,
        b.no_session,
        distinct
    );
    prop_assert_eq!(b.rx_key_updates, a.tx_key_updates);
    prop_assert!(a.tx_key_updates >= 1);
    Ok((b.no_session, phase_in_flight))
}

/// The case CI drew (seed 857034): a data packet overtook the handshake
/// by 1.5 ms of reordering, so B refused it for want of a session; the
/// count must explain it (the invariant once asked for accepted ==
/// distinct and failed here).
#[test]
fn a_packet_ahead_of_the_session_is_refused_and_explained() {
    let (before_session, _) = accepted_exactly_once(
        857034,
        0.04685590509902375,
        0.09760753337999714,
        1501,
        0.011844016171104976,
        20,
        false,
    )
    .unwrap();
    if !cfg!(debug_assertions) {
        // The release run (600 messages per flow) is the one CI drew.
        assert!(before_session >= 1, "the case no longer arises");
    }
}

/// The case CI drew (seed 485420): A's second update came so near the end
/// of the transfer that its PING had not reached B when the last message
/// was delivered; B followed once it did (the check once compared the
/// counts at that moment and failed here).
#[test]
fn an_update_at_the_end_of_the_transfer_is_followed() {
    let (_, phase_in_flight) = accepted_exactly_once(
        485420,
        0.0428773041169696,
        0.09559932662629617,
        1841,
        0.01902657827298056,
        20,
        false,
    )
    .unwrap();
    if !cfg!(debug_assertions) {
        assert!(phase_in_flight, "the case no longer arises");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(debug_assertions) { 4 } else { 12 }))]

    /// Random loss, reordering, duplication and update rates: every
    /// protected datagram of A that reaches B is accepted at most once
    /// (copies are replays) and any not accepted arrived before B had a
    /// session; none fails to authenticate, and B follows every one of
    /// A's updates.
    #[test]
    fn every_datagram_accepted_exactly_once_across_updates(
        seed in 0u64..1_000_000,
        loss in 0.0f64..0.05,
        reorder in 0.0f64..0.1,
        reorder_us in 0u64..2000,
        duplicate in 0.0f64..0.05,
        packets in 20u64..400,
        aes in any::<bool>(),
    ) {
        accepted_exactly_once(seed, loss, reorder, reorder_us, duplicate, packets, aes)?;
    }
}
