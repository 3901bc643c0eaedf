//! The demo's circuit and the requester's window, chosen for this machine
//! (`soya demo --rate auto`, the default), and the verdict on what bound a
//! run.
//!
//! The demo is meant to show what distance costs an RDMA requester and what
//! Sōya gives back, not how fast this machine's CPU is. Both effects only
//! show when every run is bound by the emulated WAN circuit:
//!
//! - the **circuit** must be slower than what this machine carries through
//!   the heaviest set-up (two gateways, the relay and both endpoints, five
//!   processes), or the Sōya run measures the CPU. `auto` measures that
//!   (a short run through the gateways at the demo's distance with no
//!   bottleneck, the calibration) and sets the circuit at [`HEADROOM`] of it, at most
//!   [`MAX_AUTO_BPS`];
//! - the requester's **window** must carry less than the circuit over the
//!   distance without Sōya, or direct and Sōya tie. rxe's window is 128
//!   packets, which against the 2 Gb/s circuit of a fast machine carries
//!   0.7 of it over 300 km. A slower circuit scales the window with it
//!   ([`auto_window`]), so the direct run is bound the same way on any
//!   machine: by its window, as a real requester's is.
//!
//! After the runs, [`bound`] says whether the 0 km run reached the circuit;
//! when it did not, the machine bounded it and the ratio to 0 km is not
//! reported as Sōya's.

/// The circuit `auto` picks is this share of what the gateways carried
/// without a bottleneck. The margin covers what the calibration does not
/// see: the relay's pacing behind a rate, and the machine's drift between
/// the calibration and the runs.
pub const HEADROOM: f64 = 0.7;

/// `auto` never picks more than this: the circuit of the demo on a fast
/// machine, against which rxe's 128-packet window shows the distance.
pub const MAX_AUTO_BPS: u64 = 2_000_000_000;

/// Nor less than this (below it the 0 km run reports the machine as the
/// bound rather than the demo picking a circuit no RDMA user has).
pub const MIN_AUTO_BPS: u64 = 50_000_000;

/// `auto` rounds the circuit down to a multiple of this.
pub const RATE_STEP_BPS: u64 = 50_000_000;

/// rxe's window (`RXE_MAX_UNACKED_PSNS`), which the demo's requester has
/// against a [`MAX_AUTO_BPS`] circuit.
pub const FULL_WINDOW: u32 = 128;

/// The smallest window `auto` gives. A window shorter than a message is
/// an RC requester's ordinary state (it sends the message's packets as
/// ACKs open the window); below four packets a single late ACK stalls it.
pub const MIN_WINDOW: u32 = 4;

/// A trial circuit holds when Sōya carries this share of it. The WAN
/// datagrams' and the RoCE packets' headers take 3-4 % of a circuit
/// carrying 4 KiB packets, so an unhurried machine shows 0.93-0.95
/// (measured: 0.931-0.944 on 0.7-1.6 Gb/s circuits). A trial just above
/// 0.9 is a machine at the edge of its CPU: with a bar of 0.9 the
/// ten-second run then carried 0.87 of a 2 Gb/s circuit.
pub const TRIAL_SHARE: f64 = 0.92;

/// What a failed trial keeps of what Sōya carried on it for the next: a
/// machine that fell short carried about what it can pace; the margin is
/// for the run's ramp and for drift.
pub const TRIAL_BACKOFF: f64 = 0.85;

/// After a trial of circuit `rate_bps` on which Sōya carried `gbps`, the
/// next circuit to try, or `None` when this one holds
/// ([`TRIAL_SHARE`]). The next is [`TRIAL_BACKOFF`] of what was carried
/// (stepped down), and always below the one that failed.
pub fn next_trial_rate(rate_bps: u64, gbps: f64) -> Option<u64> {
    if gbps * 1e9 >= TRIAL_SHARE * rate_bps as f64 || rate_bps <= MIN_AUTO_BPS {
        return None;
    }
    let stepped =
        (gbps * 1e9 * TRIAL_BACKOFF / RATE_STEP_BPS as f64).floor() as u64 * RATE_STEP_BPS;
    let next = stepped.min(rate_bps - RATE_STEP_BPS);
    Some(next.max(MIN_AUTO_BPS))
}

/// The runs' circuit is this share of the trial circuit that held: a
/// ten-second run meets more of the machine's drift than a two-second
/// trial. Without it, 2 of 9 runs fell to 0.93 of 0 km on circuits
/// whose trials had held (2026-11-29, whole machine and 1-CPU cgroup).
pub const RUN_MARGIN: f64 = 0.9;

/// The runs' circuit when the kernel throttled the demo's cgroup for its
/// CPU quota during the calibration (`crate::cgroup`). Each throttled
/// period stops the gateways and their pacers for up to the rest of the
/// period, at times the trial did not meet: at 0.5 CPU (CFS quota 50 ms
/// per 100 ms) runs at 0.9 of a trial that held gave 0.79-0.95 of 0 km
/// on a 0.25 Gb/s circuit, and 0.97-0.99 on the 0.1-0.15 Gb/s circuits
/// this margin picks (2026-11-30).
pub const THROTTLED_RUN_MARGIN: f64 = 0.6;

/// The circuit of the runs after a trial of `trial_bps` held; `throttled`:
/// the calibration was throttled for a CPU quota.
pub fn run_rate(trial_bps: u64, throttled: bool) -> u64 {
    let margin = if throttled {
        THROTTLED_RUN_MARGIN
    } else {
        RUN_MARGIN
    };
    let stepped = (trial_bps as f64 * margin / RATE_STEP_BPS as f64).floor() as u64;
    (stepped * RATE_STEP_BPS).max(MIN_AUTO_BPS)
}

/// The 0 km run must reach this share of the circuit for the circuit to
/// count as the bound: the headers of a 4 KiB RoCE packet take 2 % of the
/// circuit, and the rest of the margin is for the run's ramp and drain.
pub const CIRCUIT_BOUND_SHARE: f64 = 0.9;

/// The circuit for a machine whose gateways carried `carried_bps` without
/// a bottleneck.
pub fn auto_rate(carried_bps: f64) -> u64 {
    let want = if carried_bps.is_finite() && carried_bps > 0.0 {
        carried_bps * HEADROOM
    } else {
        0.0
    };
    let stepped = (want / RATE_STEP_BPS as f64).floor() as u64 * RATE_STEP_BPS;
    stepped.clamp(MIN_AUTO_BPS, MAX_AUTO_BPS)
}

/// The requester's window, in packets, against a circuit of `rate_bps`:
/// rxe's 128 at [`MAX_AUTO_BPS`] and above, scaled down in proportion
/// below it, never under [`MIN_WINDOW`].
pub fn auto_window(rate_bps: Option<u64>) -> u32 {
    match rate_bps {
        None => FULL_WINDOW,
        Some(r) if r >= MAX_AUTO_BPS => FULL_WINDOW,
        Some(r) => {
            let w = u128::from(FULL_WINDOW) * u128::from(r) / u128::from(MAX_AUTO_BPS);
            (w as u32).clamp(MIN_WINDOW, FULL_WINDOW)
        }
    }
}

/// What bounded a demo's runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The 0 km run reached the circuit: the runs compare distance and
    /// Sōya, not CPU.
    Circuit,
    /// The 0 km run fell short of the circuit (or there was none): this
    /// machine's CPU bounded it, and the ratios measure the machine.
    Machine,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Circuit => "circuit",
            Bound::Machine => "machine",
        }
    }
}

/// The verdict for a 0 km run of `zero_km_gbps` on a circuit of
/// `rate_bps` (`None`: no bottleneck).
pub fn bound(rate_bps: Option<u64>, zero_km_gbps: f64) -> Bound {
    match rate_bps {
        Some(r) if zero_km_gbps * 1e9 >= CIRCUIT_BOUND_SHARE * r as f64 => Bound::Circuit,
        _ => Bound::Machine,
    }
}

/// The most a window of `window` packets of `mtu` bytes carries over a
/// round trip of `rtt_ms`, Gb/s (`None` at 0 km).
pub fn window_gbps(window: u32, mtu: u32, rtt_ms: f64) -> Option<f64> {
    (rtt_ms > 0.0).then(|| f64::from(window) * f64::from(mtu) * 8.0 / (rtt_ms * 1e-3) / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_rate_keeps_headroom_and_steps_down() {
        // 1.71 Gb/s carried: 70 % is 1.197, stepped down to 1.15.
        assert_eq!(auto_rate(1.71e9), 1_150_000_000);
        // A fast machine keeps the 2 Gb/s circuit.
        assert_eq!(auto_rate(9.0e9), MAX_AUTO_BPS);
        // Exactly on a step.
        assert_eq!(auto_rate(1e9 / HEADROOM), 1_000_000_000);
        // A machine that carried next to nothing, or a failed calibration.
        assert_eq!(auto_rate(10e6), MIN_AUTO_BPS);
        assert_eq!(auto_rate(0.0), MIN_AUTO_BPS);
        assert_eq!(auto_rate(f64::NAN), MIN_AUTO_BPS);
        for carried in [0.3e9, 0.77e9, 1.3e9, 2.5e9] {
            let r = auto_rate(carried) as f64;
            assert!(r <= carried * HEADROOM, "{carried}: {r}");
            assert!(
                r > carried * HEADROOM - RATE_STEP_BPS as f64,
                "{carried}: {r}"
            );
        }
    }

    #[test]
    fn auto_window_scales_with_the_circuit() {
        assert_eq!(auto_window(Some(2_000_000_000)), 128);
        assert_eq!(auto_window(Some(10_000_000_000)), 128);
        assert_eq!(auto_window(None), 128);
        assert_eq!(auto_window(Some(1_000_000_000)), 64);
        assert_eq!(auto_window(Some(1_150_000_000)), 73);
        assert_eq!(auto_window(Some(150_000_000)), 9);
        assert_eq!(auto_window(Some(50_000_000)), MIN_WINDOW);
        // Whatever the circuit above the floor, the window carries the
        // same share of it over the same distance: 0.7 at 300 km (less by
        // up to a packet, rounded down).
        for r in [
            200_000_000u64,
            500_000_000,
            800_000_000,
            1_500_000_000,
            2_000_000_000,
        ] {
            let w = auto_window(Some(r));
            let carried = window_gbps(w, 4096, 2.0 * 300.0 * 4.9e-3).unwrap();
            let share = carried * 1e9 / r as f64;
            assert!((0.65..=0.72).contains(&share), "{r}: window {w}, {share}");
        }
    }

    #[test]
    fn a_trial_steps_the_circuit_down_until_sōya_carries_it() {
        // Carried 0.94 of 1 Gb/s: it holds.
        assert_eq!(next_trial_rate(1_000_000_000, 0.94), None);
        // 0.304 of 0.5 Gb/s (a 0.5-CPU cgroup): 85 % of 0.304, stepped.
        assert_eq!(next_trial_rate(500_000_000, 0.304), Some(250_000_000));
        assert_eq!(next_trial_rate(1_000_000_000, 0.89), Some(750_000_000));
        // Just short of the share on a small circuit: one step below, not
        // the same circuit.
        assert_eq!(next_trial_rate(200_000_000, 0.179), Some(150_000_000));
        assert_eq!(next_trial_rate(100_000_000, 0.089), Some(MIN_AUTO_BPS));
        // Nothing lower to try.
        assert_eq!(next_trial_rate(MIN_AUTO_BPS, 0.01), None);
        // Each step is strictly lower.
        let mut r = 2_000_000_000;
        while let Some(n) = next_trial_rate(r, r as f64 * 0.85 / 1e9) {
            assert!(n < r, "{n} after {r}");
            r = n;
        }
    }

    #[test]
    fn the_runs_keep_a_margin_below_the_trial_that_held() {
        assert_eq!(run_rate(2_000_000_000, false), 1_800_000_000);
        assert_eq!(run_rate(1_150_000_000, false), 1_000_000_000);
        assert_eq!(run_rate(MIN_AUTO_BPS, false), MIN_AUTO_BPS);
        // A CPU quota's freezes: a wider margin.
        assert_eq!(run_rate(300_000_000, false), 250_000_000);
        assert_eq!(run_rate(300_000_000, true), 150_000_000);
        assert_eq!(run_rate(MIN_AUTO_BPS, true), MIN_AUTO_BPS);
    }

    #[test]
    fn the_bound_is_the_circuit_only_when_0_km_reaches_it() {
        assert_eq!(bound(Some(1_000_000_000), 0.99), Bound::Circuit);
        assert_eq!(bound(Some(1_000_000_000), 0.90), Bound::Circuit);
        assert_eq!(bound(Some(1_000_000_000), 0.85), Bound::Machine);
        assert_eq!(bound(None, 5.0), Bound::Machine);
    }
}
