//! A BBR-style model-based controller (after BBR v1, Cardwell et al. 2016).
//!
//! The model: the path's bottleneck bandwidth (windowed max of delivery-rate
//! samples over [`BW_ROUNDS`] round trips) and its propagation RTT (windowed
//! min over [`MIN_RTT_WINDOW`]). Pacing = gain × bandwidth, cwnd = 2 × BDP.
//! Loss is *not* a congestion signal here: the model only changes when the
//! measured delivery rate or RTT change, so 1 % random loss (which barely
//! moves the delivery rate) does not shrink the rate, where loss-based
//! controllers collapse. Pacing never exceeds the path's configured rate,
//! when one is given (a policed circuit).
//!
//! Phases: Startup (gain 2.89 until the bandwidth stops growing 25 % per
//! round for 3 rounds), Drain (until in-flight ≤ BDP), ProbeBw (gains cycle
//! 1.25, 0.75, then 6 × 1, one min-RTT each), ProbeRtt (every 10 s without a
//! new min-RTT: cwnd at half a BDP for 200 ms, as BBR v2 does, rather than
//! v1's 4 packets which would idle a long fat pipe).

use std::time::Duration;

use crate::time::Time;

use super::{bytes_in, bytes_per_sec, AckSample, Controller};

pub const BW_ROUNDS: usize = 10;
pub const MIN_RTT_WINDOW: Duration = Duration::from_secs(10);
const PROBE_RTT_TIME: Duration = Duration::from_millis(200);
const STARTUP_GAIN: f64 = 2.885;
const CWND_GAIN: f64 = 2.0;
const CYCLE: [f64; 8] = [1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
const INITIAL_CWND_PACKETS: u64 = 32;
const MIN_CWND_PACKETS: u64 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Startup,
    Drain,
    ProbeBw,
    ProbeRtt,
}

pub struct Bbr {
    mss: u64,
    cap_bps: Option<u64>,
    state: State,
    /// Per-round maxima of delivery rate (bytes/s), indexed by round % N.
    bw_rounds: [u64; BW_ROUNDS],
    round: u64,
    next_round_delivered: u64,
    min_rtt: Option<Duration>,
    min_rtt_stamp: Time,
    initial_rtt: Duration,
    full_bw: u64,
    full_bw_count: u32,
    filled_pipe: bool,
    cycle_idx: usize,
    cycle_stamp: Time,
    probe_rtt_done: Option<Time>,
    pacing_gain: f64,
    cwnd_gain: f64,
    cwnd: u64,
    pacing_bps: u64,
}

impl Bbr {
    pub fn new(mss: u64, cap_bps: Option<u64>, initial_rtt: Duration, now: Time) -> Bbr {
        let mut b = Bbr {
            mss,
            cap_bps,
            state: State::Startup,
            bw_rounds: [0; BW_ROUNDS],
            round: 0,
            next_round_delivered: 0,
            min_rtt: None,
            min_rtt_stamp: now,
            initial_rtt: initial_rtt.max(Duration::from_micros(10)),
            full_bw: 0,
            full_bw_count: 0,
            filled_pipe: false,
            cycle_idx: 0,
            cycle_stamp: now,
            probe_rtt_done: None,
            pacing_gain: STARTUP_GAIN,
            cwnd_gain: STARTUP_GAIN,
            cwnd: INITIAL_CWND_PACKETS * mss,
            pacing_bps: 0,
        };
        b.pacing_bps = b.initial_pacing();
        b
    }

    fn initial_pacing(&self) -> u64 {
        let bytes_per_sec =
            (self.cwnd as f64 / self.initial_rtt.as_secs_f64() * STARTUP_GAIN) as u64;
        self.capped(bytes_per_sec.saturating_mul(8))
    }

    fn capped(&self, bps: u64) -> u64 {
        match self.cap_bps {
            Some(cap) => bps.min(cap),
            None => bps,
        }
        .max(1)
    }

    /// Bottleneck bandwidth estimate, bytes/s (0 before the first sample).
    pub fn max_bw(&self) -> u64 {
        let bw = self.bw_rounds.iter().copied().max().unwrap_or(0);
        match self.cap_bps {
            Some(cap) => bw.min(bytes_per_sec(cap)),
            None => bw,
        }
    }

    fn rtt(&self) -> Duration {
        self.min_rtt.unwrap_or(self.initial_rtt)
    }

    fn bdp(&self) -> u64 {
        bytes_in(self.max_bw(), self.rtt())
    }

    fn target_cwnd(&self, gain: f64) -> u64 {
        let bdp = self.bdp();
        if bdp == 0 {
            return INITIAL_CWND_PACKETS * self.mss;
        }
        // Three extra packets absorb ACK aggregation (delayed ACKs).
        ((bdp as f64 * gain) as u64 + 3 * self.mss).max(MIN_CWND_PACKETS * self.mss)
    }

    fn enter_probe_bw(&mut self, now: Time) {
        self.state = State::ProbeBw;
        self.pacing_gain = 1.0;
        self.cwnd_gain = CWND_GAIN;
        // Start in a cruising phase: probing right after Drain would refill
        // the queue Drain just emptied.
        self.cycle_idx = 2;
        self.cycle_stamp = now;
    }

    fn update_round(&mut self, s: &AckSample) -> bool {
        if s.prior_delivered >= self.next_round_delivered {
            self.next_round_delivered = s.delivered;
            self.round += 1;
            self.bw_rounds[(self.round % BW_ROUNDS as u64) as usize] = 0;
            true
        } else {
            false
        }
    }

    fn update_model(&mut self, s: &AckSample, round_start: bool) {
        if let Some(rate) = s.delivery_rate {
            // An app-limited sample below the estimate says nothing about the
            // path, only about the sender.
            if !s.app_limited || rate >= self.max_bw() {
                let slot = &mut self.bw_rounds[(self.round % BW_ROUNDS as u64) as usize];
                *slot = (*slot).max(rate);
            }
        }
        let expired = s.now.since(self.min_rtt_stamp) > MIN_RTT_WINDOW;
        match self.min_rtt {
            Some(m) if s.rtt > m => {
                if expired && self.state != State::ProbeRtt {
                    // No lower sample for a whole window: the route may have
                    // changed. Take the current sample and go and measure.
                    self.min_rtt = Some(s.rtt);
                    self.min_rtt_stamp = s.now;
                    self.state = State::ProbeRtt;
                    self.pacing_gain = 1.0;
                    self.probe_rtt_done = None;
                }
            }
            _ => {
                self.min_rtt = Some(s.rtt.max(Duration::from_nanos(1)));
                self.min_rtt_stamp = s.now;
            }
        }
        // An app-limited round says nothing about whether the pipe is full:
        // a twin that only sends ACKs must not conclude its path is slow.
        if round_start && !self.filled_pipe && !s.app_limited {
            let bw = self.max_bw();
            if bw as f64 >= self.full_bw as f64 * 1.25 {
                self.full_bw = bw;
                self.full_bw_count = 0;
            } else {
                self.full_bw_count += 1;
                if self.full_bw_count >= 3 {
                    self.filled_pipe = true;
                }
            }
        }
    }

    fn update_state(&mut self, s: &AckSample) {
        match self.state {
            State::Startup => {
                if self.filled_pipe {
                    self.state = State::Drain;
                    self.pacing_gain = 1.0 / STARTUP_GAIN;
                    self.cwnd_gain = STARTUP_GAIN;
                }
            }
            State::Drain => {
                if s.bytes_in_flight <= self.bdp() {
                    self.enter_probe_bw(s.now);
                }
            }
            State::ProbeBw => {
                let phase_over = s.now.since(self.cycle_stamp) > self.rtt();
                // Leave the draining phase early once the queue is gone.
                let drained = CYCLE[self.cycle_idx] < 1.0 && s.bytes_in_flight <= self.bdp();
                if phase_over || drained {
                    self.cycle_idx = (self.cycle_idx + 1) % CYCLE.len();
                    self.cycle_stamp = s.now;
                }
                self.pacing_gain = CYCLE[self.cycle_idx];
            }
            State::ProbeRtt => {
                let target = self.target_cwnd(0.5);
                match self.probe_rtt_done {
                    None if s.bytes_in_flight <= target => {
                        self.probe_rtt_done = Some(s.now + PROBE_RTT_TIME);
                    }
                    Some(done) if s.now >= done => {
                        self.min_rtt_stamp = s.now;
                        if self.filled_pipe {
                            self.enter_probe_bw(s.now);
                        } else {
                            self.state = State::Startup;
                            self.pacing_gain = STARTUP_GAIN;
                            self.cwnd_gain = STARTUP_GAIN;
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn update_cwnd(&mut self, s: &AckSample) {
        let target = self.target_cwnd(self.cwnd_gain);
        if self.filled_pipe {
            self.cwnd = (self.cwnd + s.bytes_acked).min(target);
        } else if self.cwnd < target || s.delivered < INITIAL_CWND_PACKETS * self.mss {
            self.cwnd += s.bytes_acked;
        }
        if self.state == State::ProbeRtt {
            self.cwnd = self.cwnd.min(self.target_cwnd(0.5));
        }
        self.cwnd = self.cwnd.max(MIN_CWND_PACKETS * self.mss);
    }

    fn update_pacing(&mut self) {
        let bw = self.max_bw();
        if bw == 0 {
            return;
        }
        let rate = self.capped(((bw as f64 * self.pacing_gain) as u64).saturating_mul(8));
        // In Startup only ever speed up: early samples underestimate.
        if self.filled_pipe || rate > self.pacing_bps {
            self.pacing_bps = rate;
        }
    }
}

impl Controller for Bbr {
    fn on_sent(&mut self, _now: Time, _bytes: u64, _in_flight: u64) {}

    fn on_ack(&mut self, s: &AckSample) {
        let round_start = self.update_round(s);
        self.update_model(s, round_start);
        self.update_state(s);
        self.update_cwnd(s);
        self.update_pacing();
    }

    /// Loss is not a signal for this model (see the module docs); recovery
    /// still retransmits, and sustained loss lowers the measured delivery rate.
    fn on_loss(&mut self, _now: Time, _bytes_lost: u64, _in_flight: u64) {}

    fn on_path_down(&mut self, now: Time) {
        // The path may come back through another route: re-measure it.
        *self = Bbr::new(self.mss, self.cap_bps, self.rtt(), now);
    }

    fn pacing_rate(&self) -> u64 {
        self.pacing_bps
    }

    fn cwnd(&self) -> u64 {
        self.cwnd
    }

    fn name(&self) -> &'static str {
        "bbr"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1 Gb/s, 10 ms path fed one ACK per packet; `lose` says which
    /// packets are lost. Returns the final pacing rate.
    fn drive(lose: impl Fn(u64) -> bool) -> (Bbr, u64) {
        let mss = 1000u64;
        let bw = 125_000_000u64; // bytes/s
        let rtt = Duration::from_millis(10);
        let mut cc = Bbr::new(mss, None, Duration::from_millis(50), Time::ZERO);
        let mut delivered = 0u64;
        let per_pkt = Duration::from_nanos(1_000_000_000 * mss / bw);
        let mut now = Time::ZERO;
        for i in 0..200_000u64 {
            now += per_pkt;
            if lose(i) {
                cc.on_loss(now, mss, 0);
                continue;
            }
            let prior = delivered.saturating_sub(bytes_in(bw, rtt));
            delivered += mss;
            cc.on_ack(&AckSample {
                now,
                rtt,
                srtt: rtt,
                min_rtt: rtt,
                bytes_acked: mss,
                delivery_rate: Some(bw),
                app_limited: false,
                prior_delivered: prior,
                delivered,
                bytes_in_flight: bytes_in(bw, rtt),
            });
        }
        let r = cc.pacing_rate();
        (cc, r)
    }

    #[test]
    fn converges_and_ignores_random_loss() {
        let (cc, clean) = drive(|_| false);
        assert!(cc.filled_pipe);
        assert!(clean >= 900_000_000, "pacing {clean}");
        let (_, lossy) = drive(|i| i % 100 == 37);
        assert!(lossy >= clean * 9 / 10, "1 % loss: {lossy} vs {clean}");
        let bdp = bytes_in(125_000_000, Duration::from_millis(10));
        assert!(cc.cwnd() >= 2 * bdp && cc.cwnd() <= 2 * bdp + 10_000);
    }
}
