//! FixedRate: pace at the provisioned rate of a dedicated WAN circuit.
//!
//! Between two datacenters the path usually is a leased, rate-limited circuit
//! whose capacity is known. Probing for it (as loss-based controllers do)
//! only wastes it, and backing off on every loss would let 1 % random loss
//! cost half the throughput. So: send at the configured rate, and back off
//! multiplicatively only when loss is *sustained* and *heavy* (more than
//! [`HEAVY_LOSS`] of the bytes in each of [`BAD_WINDOWS`] consecutive
//! measurement windows of about two RTTs): that signals a misconfigured rate
//! or a real shared bottleneck. Recover additively once windows are clean.

use std::time::Duration;

use crate::time::Time;

use super::{bytes_in, bytes_per_sec, AckSample, Controller};

/// Loss fraction above which a window counts as bad.
pub const HEAVY_LOSS: f64 = 0.10;
/// Loss fraction below which a window lets the rate grow back.
const CLEAN_LOSS: f64 = 0.02;
/// Consecutive bad windows before one multiplicative decrease.
pub const BAD_WINDOWS: u32 = 3;
/// Multiplicative decrease, and the floor as a fraction of the configured rate.
const DECREASE: f64 = 0.7;
const FLOOR_FRACTION: u64 = 20;
/// Additive increase per clean window, as a fraction of the configured rate.
const INCREASE_FRACTION: u64 = 20;
/// A window closes only with at least this many packets' worth of bytes, so a
/// single loss in a near-idle window is not "10 % loss".
const MIN_WINDOW_PACKETS: u64 = 20;

pub struct FixedRate {
    configured_bps: u64,
    rate_bps: u64,
    mss: u64,
    min_rtt: Duration,
    srtt: Duration,
    window_start: Time,
    acked: u64,
    lost: u64,
    bad_windows: u32,
}

impl FixedRate {
    pub fn new(rate_bps: u64, mss: u64, initial_rtt: Duration, now: Time) -> FixedRate {
        FixedRate {
            configured_bps: rate_bps.max(1),
            rate_bps: rate_bps.max(1),
            mss,
            min_rtt: initial_rtt,
            srtt: initial_rtt,
            window_start: now,
            acked: 0,
            lost: 0,
            bad_windows: 0,
        }
    }

    fn maybe_close_window(&mut self, now: Time) {
        let len = (self.srtt * 2).max(Duration::from_millis(2));
        if now.since(self.window_start) < len {
            return;
        }
        let total = self.acked + self.lost;
        if total < MIN_WINDOW_PACKETS * self.mss {
            return; // keep accumulating
        }
        let frac = self.lost as f64 / total as f64;
        if frac > HEAVY_LOSS {
            self.bad_windows += 1;
            if self.bad_windows >= BAD_WINDOWS {
                let floor = self.configured_bps / FLOOR_FRACTION;
                self.rate_bps = ((self.rate_bps as f64 * DECREASE) as u64).max(floor).max(1);
                self.bad_windows = 0;
            }
        } else {
            self.bad_windows = 0;
            if frac < CLEAN_LOSS && self.rate_bps < self.configured_bps {
                self.rate_bps = (self.rate_bps + self.configured_bps / INCREASE_FRACTION)
                    .min(self.configured_bps);
            }
        }
        self.window_start = now;
        self.acked = 0;
        self.lost = 0;
    }
}

impl Controller for FixedRate {
    fn on_sent(&mut self, _now: Time, _bytes: u64, _in_flight: u64) {}

    fn on_ack(&mut self, s: &AckSample) {
        self.min_rtt = s.min_rtt;
        self.srtt = s.srtt;
        self.acked += s.bytes_acked;
        self.maybe_close_window(s.now);
    }

    fn on_loss(&mut self, now: Time, bytes_lost: u64, _in_flight: u64) {
        self.lost += bytes_lost;
        self.maybe_close_window(now);
    }

    fn pacing_rate(&self) -> u64 {
        self.rate_bps
    }

    /// Two bandwidth-delay products: one in flight, one for the data that
    /// waits for loss detection and retransmission meanwhile. The delay is
    /// the smoothed RTT, not the minimum: one spuriously short sample (seen
    /// on loopback relays: 7–15 µs on a 2.94 ms path) would otherwise pin
    /// the minimum, and with it the window, far below the path's BDP for
    /// good. Pacing, not the window, holds the rate to the circuit.
    fn cwnd(&self) -> u64 {
        let bdp = bytes_in(bytes_per_sec(self.rate_bps), self.srtt.max(self.min_rtt));
        (2 * bdp + 4 * self.mss).max(8 * self.mss)
    }

    fn name(&self) -> &'static str {
        "fixed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(now: Time, bytes: u64) -> AckSample {
        AckSample {
            now,
            rtt: Duration::from_millis(3),
            srtt: Duration::from_millis(3),
            min_rtt: Duration::from_millis(3),
            bytes_acked: bytes,
            delivery_rate: None,
            app_limited: false,
            prior_delivered: 0,
            delivered: 0,
            bytes_in_flight: 0,
        }
    }

    /// Feeds `ms` milliseconds of traffic at 1 packet per 10 µs with the
    /// given loss fraction (deterministic pattern).
    fn run(cc: &mut FixedRate, start_ms: u64, ms: u64, loss_per_mille: u64) {
        for i in 0..ms * 100 {
            let now = Time::from_micros(start_ms * 1000 + i * 10);
            if loss_per_mille > 0 && (i * loss_per_mille) % 1000 < loss_per_mille {
                cc.on_loss(now, 1000, 0);
            } else {
                cc.on_ack(&ack(now, 1000));
            }
        }
    }

    #[test]
    fn one_short_rtt_sample_does_not_shrink_the_window() {
        let mut cc = FixedRate::new(10_000_000_000, 1000, Duration::from_millis(3), Time::ZERO);
        let bdp = 10_000_000_000 / 8 * 3 / 1000;
        cc.on_ack(&ack(Time::from_millis(1), 1000));
        assert!(cc.cwnd() >= 2 * bdp, "{}", cc.cwnd());
        // A bogus 15 µs sample drags min RTT down; srtt barely moves.
        let mut bad = ack(Time::from_millis(2), 1000);
        bad.min_rtt = Duration::from_micros(15);
        bad.srtt = Duration::from_micros(2_700);
        cc.on_ack(&bad);
        assert!(
            cc.cwnd() >= 2 * bdp * 8 / 10,
            "window {} for a 3 ms path",
            cc.cwnd()
        );
    }

    #[test]
    fn random_loss_does_not_reduce_rate() {
        let mut cc = FixedRate::new(10_000_000_000, 1000, Duration::from_millis(3), Time::ZERO);
        run(&mut cc, 0, 500, 10); // 1 %
        assert_eq!(cc.pacing_rate(), 10_000_000_000);
        run(&mut cc, 500, 500, 50); // 5 %
        assert_eq!(cc.pacing_rate(), 10_000_000_000);
    }

    #[test]
    fn sustained_heavy_loss_backs_off_then_recovers() {
        let mut cc = FixedRate::new(10_000_000_000, 1000, Duration::from_millis(3), Time::ZERO);
        run(&mut cc, 0, 100, 300); // 30 % for 100 ms
        let low = cc.pacing_rate();
        assert!(low < 10_000_000_000 / 2, "backed off to {low}");
        assert!(low >= 10_000_000_000 / FLOOR_FRACTION);
        run(&mut cc, 100, 400, 0);
        assert_eq!(cc.pacing_rate(), 10_000_000_000, "recovered");
    }
}
