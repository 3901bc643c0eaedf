//! Over-subscribed scenarios for the sweep (issue 33): several QPs whose
//! data-center links together offer 2–16× what the WAN carries, for the
//! whole transfer, so that the gateway must push back into the lossless DC
//! (withholding pseudo-ACKs) the whole time, share the WAN between the QPs
//! and resume each of them on its own.
//!
//! The offered load is set by the hosts' line rate (`dc_gbps`, which every
//! QP of a host shares) against the WAN (`paths × wan_gbps`): a QP's own
//! window allows far more than the WAN at every distance drawn (an rxe
//! window of 128 packets per DC round trip of a few µs; a hardware send
//! queue of tx depth × message size), so what the QPs offer together is
//! the line rate. The deep buffer is drawn small against the transfer (at
//! most a quarter of it, at least 1.5 × BDP so the WAN can still be kept
//! full): it fills early and the rest of the transfer runs against it.
//! A buffer of the daemon's automatic size (3 × BDP plus 16 requester
//! windows of 8 MiB) holds seconds of a slow WAN; filling it takes
//! gigabytes, which `soya-sim run` measures (docs/benchmarks.md) and the
//! sweep cannot afford thousands of times.
//!
//! The invariants are the sweep's (every transfer finishes, nothing
//! acknowledged is lost, never silently, ...). The fairness the
//! backpressure aims at (docs/semantics.md, "Backpressure") is measured
//! too: while the gateway pushed back (from when what it held as the
//! buffer first filled had crossed the WAN, to when the first QP's
//! transfer was over) every QP should land at least [`FAIR_SHARE`] of an
//! equal share of what all of them landed. It does not hold in every run
//! yet, so a run below it is counted and reported apart
//! (`Outcome::unfair`, `SweepTotals::unfair`), not as a violation.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use soya_config::AckPolicy;

use super::scenario::{requester_window, Op, Scenario};
use crate::rc::hw::EndpointModel;

/// The fairness aimed at: each QP lands at least this share of an equal
/// share of the WAN while the gateway pushes back.
pub const FAIR_SHARE: f64 = 0.5;

/// Packets of 4,608-byte slots a scenario's buffer is never below: the
/// engine's ACK reserve floor is 256 slots, and with less than twice it
/// every pseudo-ACK would wait for an empty buffer.
const MIN_BUFFER_SLOTS: usize = 768;

/// The over-subscribed scenario of `seed` for `endpoint` endpoints.
pub fn oversubscribed_scenario(seed: u64, endpoint: EndpointModel) -> Scenario {
    // Its own stream: the same seed of the ordinary sweep draws something
    // else, and neither changes the other.
    let mut r = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0xA24B_AED4_963E_E407) ^ 0x0fe5);
    let op = [Op::Write, Op::Write, Op::Send, Op::Read, Op::Mixed][r.random_range(0..5)];
    let mtu = [1024, 2048, 4096][r.random_range(0..3)];
    let mut size = [4096u32, 16_384, 65_536, 262_144][r.random_range(0..4)];
    let mut distance_km: f64 = [0.0, 10.0, 300.0, 1000.0][r.random_range(0..4)];
    if op == Op::Read {
        // A QP has at most 16 READs outstanding (max_rd_atomic): 16 × 256
        // KiB per 2.94 ms RTT at 300 km is 11 Gb/s, above any WAN drawn;
        // smaller or farther, READs could not over-subscribe it.
        size = 262_144;
        distance_km = distance_km.min(300.0);
    }
    let paths = r.random_range(1..=3u32);
    let wan_gbps = [0.5, 1.0, 2.0][r.random_range(0..3)];
    let wan = wan_gbps * f64::from(paths);
    let factor = r.random_range(2.0..=16.0);
    let qps = r.random_range(2..=16u32);
    let mut tx_depth = r.random_range(4..=64u32);
    if endpoint == EndpointModel::Hw {
        // A hardware requester's window is its send queue: at most 1 MiB
        // here, so that the buffer can hold two of them (below).
        tx_depth = tx_depth.min((1u32 << 20) / size).max(1);
    }
    let window = requester_window(endpoint, tx_depth, size, mtu as u32);
    let rtt = Duration::from_secs_f64(2.0 * distance_km * 4.9e-6);
    let bdp_slots = (wan * 1e9 / 8.0 * rtt.as_secs_f64() / mtu as f64) as usize;
    // The buffer: at least 1.5 × BDP (the WAN can be kept full), and twice
    // a requester's window (the most a pseudo-ACK reserves for its own
    // flow is half the buffer: a window larger than that may overrun it,
    // which the daemon's sizing, a reserve of whole windows, rules out);
    // at most a quarter of the transfer, which grows to four times it if
    // need be, so that most of the transfer runs against a full buffer.
    let least = (bdp_slots * 3 / 2).max(2 * window).max(MIN_BUFFER_SLOTS);
    let mut total = r.random_range(8u64 << 20..=32 << 20);
    total = total.max(4 * least as u64 * mtu as u64);
    let iters = (total / u64::from(qps) / u64::from(size)).max(4) as u32;
    let total = u64::from(iters) * u64::from(size) * u64::from(qps);
    let packets = total.div_ceil(mtu as u64) as usize;
    let buffer_slots = r.random_range(least..=(packets / 4).max(least));
    // Time for the transfer at the WAN's rate, five times over, plus set-up.
    let at_wan = Duration::from_secs_f64(total as f64 * 8.0 / (wan * 1e9));
    let mut s = Scenario {
        seed,
        distance_km,
        accelerated: true,
        policy: if r.random_bool(0.8)
            || !strict_oversubscribes(qps, window, mtu as u32, size, tx_depth, rtt, wan)
        {
            AckPolicy::Edge
        } else {
            AckPolicy::Strict
        },
        op,
        size,
        tx_depth,
        qps,
        iters,
        mtu,
        wan_gbps,
        dc_gbps: factor * wan,
        paths,
        buffer_slots: Some(buffer_slots),
        time_limit: at_wan * 5 + Duration::from_secs(5),
        endpoint,
        fair_share: Some(FAIR_SHARE),
        ..Scenario::default()
    };
    if r.random_bool(0.2) {
        s.wan_loss = [0.0001, 0.001][r.random_range(0..2)];
    }
    if r.random_bool(0.15) {
        // Path 0 down for a while: with one path the twin is unreachable
        // (for less than wan.twin_timeout), and the flows must resume by
        // themselves when it comes back.
        s.cut_path = Some((
            Duration::from_millis(r.random_range(1..50)),
            Duration::from_millis(r.random_range(10..1000)),
        ));
        s.time_limit += Duration::from_secs(2);
    }
    s
}

/// Whether the QPs still offer more than twice the WAN under `strict`,
/// where each message's last packet waits for the responder's real ACK,
/// so a QP sends at most its send queue (and, for rxe, its 128-packet
/// window) per round trip. At 1,000 km with 4 messages of 4 KiB
/// outstanding that is 13 Mb/s a QP: two of them do not over-subscribe
/// 6 Gb/s, and the run, drawn as if they did, could not finish in its
/// time (over-subscribed seed 415 of the rxe sweep).
fn strict_oversubscribes(
    qps: u32,
    window_packets: usize,
    mtu: u32,
    size: u32,
    tx_depth: u32,
    rtt: Duration,
    wan_gbps: f64,
) -> bool {
    let rtt = rtt.as_secs_f64();
    if rtt == 0.0 {
        return true;
    }
    let per_round =
        (window_packets as f64 * f64::from(mtu)).min(f64::from(tx_depth) * f64::from(size));
    let offered_gbps = f64::from(qps) * per_round * 8.0 / rtt / 1e9;
    offered_gbps >= 2.0 * wan_gbps
}
