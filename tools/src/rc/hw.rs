//! What a hardware (ConnectX-class) RC endpoint does differently from rxe,
//! as two small state machines the requester consults, and the QP settings
//! that make up the `hw` endpoint model. Sources: docs/roce-notes.md,
//! "Hardware endpoints".
//!
//! - **Window.** No PSN window: outstanding data is bounded by the send
//!   queue (the application's tx depth × message size). [`hw_config`] sets
//!   `max_unacked_psns` to the largest value the PSN space allows.
//! - **Retransmission timer** ([`RetransmitTimer`]): the configured
//!   `4.096 µs << timeout`, or the field-observed adaptive mode in which
//!   consecutive expiries without progress come after 2, 4, 8 and 16 ms
//!   whatever the configured timeout (perftest#251 on ConnectX-5 over a
//!   40 ms link; nccl#1555 on a 30 ms link), then the configured one.
//! - **max_rd_atomic 16** (`max_qp_rd_atom` of ConnectX): `QpConfig`'s
//!   default, the same in both models.
//! - **RNR timer**: RDMA-CM leaves `min_rnr_timer` at 0, which IBTA
//!   defines as 655.36 ms; NCCL (no RDMA-CM) sets 12 (0.64 ms).
//! - **DCQCN** ([`Dcqcn`]): the reaction point cuts its rate on each CNP
//!   and recovers on a timer (Zhu et al., SIGCOMM 2015; the mlx5
//!   `roce_rp` parameters).
//!
//! Both machines are sans-IO: they take `now` and answer durations and
//! instants; the requester arms its own deadlines from them.

use std::time::Duration;

use soya_proto::time::Time;

use super::QpConfig;

/// Which retransmission timer a requester runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TimerMode {
    /// `4.096 µs << timeout_code` on every expiry (rxe; hardware with
    /// adaptive retransmission off).
    #[default]
    Configured,
    /// The first expiries of a retry sequence come after
    /// [`ADAPTIVE_STEPS`], then the configured timeout.
    Adaptive,
}

/// The field-observed adaptive steps (perftest#251: "retransmitted each
/// request 5 times, at intervals of 2ms, 4ms, 8ms, 16ms" with `-u 18`).
pub const ADAPTIVE_STEPS: [Duration; 4] = [
    Duration::from_millis(2),
    Duration::from_millis(4),
    Duration::from_millis(8),
    Duration::from_millis(16),
];

/// The retransmission timer's backoff: how long the next expiry takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetransmitTimer {
    pub mode: TimerMode,
    /// Expiries since the last progress.
    expiries: u32,
}

impl RetransmitTimer {
    pub fn new(mode: TimerMode) -> RetransmitTimer {
        RetransmitTimer { mode, expiries: 0 }
    }

    /// The timeout to arm now; `None`: no timer (timeout code 0).
    pub fn timeout(&self, cfg: &QpConfig) -> Option<Duration> {
        let configured = cfg.ack_timeout()?;
        Some(match self.mode {
            TimerMode::Configured => configured,
            TimerMode::Adaptive => ADAPTIVE_STEPS
                .get(self.expiries as usize)
                .copied()
                .unwrap_or(configured),
        })
    }

    /// The timer fired with something outstanding.
    pub fn expired(&mut self) {
        self.expiries = self.expiries.saturating_add(1);
    }

    /// An acknowledgement made progress: back to the first step.
    pub fn progress(&mut self) {
        self.expiries = 0;
    }
}

/// DCQCN reaction-point parameters (the mlx5 `roce_rp` names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DcqcnParams {
    /// Line rate: the rate after full recovery, and the start rate.
    pub line_bps: f64,
    /// `rpg_min_rate`.
    pub min_bps: f64,
    /// `rpg_time_reset`: a rate-increase event this often.
    pub increase_period: Duration,
    /// `rpg_ai_rate`: additive increase per event after fast recovery.
    pub ai_bps: f64,
    /// `rpg_hai_rate`: hyper increase.
    pub hai_bps: f64,
    /// `rpg_threshold`: fast-recovery events before additive increase.
    pub threshold: u32,
    /// `dce_tcp_g` / 1024: the gain of the alpha estimate.
    pub g: f64,
    /// `dce_tcp_rtt`: alpha decays this often without a CNP.
    pub alpha_period: Duration,
    /// `rpg_min_dec_fac` (percent): a cut keeps at least this share.
    pub min_dec_fac: f64,
}

impl DcqcnParams {
    /// mlx5 defaults (`rpg_time_reset` 300 µs, `rpg_ai_rate` 5 Mb/s,
    /// `rpg_hai_rate` 50 Mb/s, `rpg_threshold` 1, `rpg_min_dec_fac` 50 %)
    /// for a port of `line_bps`.
    pub fn mlx5(line_bps: f64) -> DcqcnParams {
        DcqcnParams {
            line_bps,
            min_bps: 1e6,
            increase_period: Duration::from_micros(300),
            ai_bps: 5e6,
            hai_bps: 50e6,
            threshold: 1,
            // The DCQCN paper's g = 1/256 and alpha timer of 55 µs (the
            // firmware encodes them as dce_tcp_g / dce_tcp_rtt).
            g: 1.0 / 256.0,
            alpha_period: Duration::from_micros(55),
            min_dec_fac: 0.5,
        }
    }
}

/// The DCQCN reaction point of one QP: a rate, cut on CNPs, recovered on a
/// timer, and the pacing that rate implies. Rate increases are computed
/// lazily from the time elapsed (no timer events of its own).
#[derive(Clone, Debug)]
pub struct Dcqcn {
    p: DcqcnParams,
    /// Current rate (Rc) and target rate (Rt).
    rate: f64,
    target: f64,
    alpha: f64,
    /// Increase events since the last cut.
    increases: u32,
    /// When the last cut or increase happened (increase periods count from it).
    last_update: Time,
    last_alpha: Time,
    /// The next request may leave no earlier than this.
    next_send: Time,
    pub cnps: u64,
    pub cuts: u64,
}

impl Dcqcn {
    pub fn new(p: DcqcnParams) -> Dcqcn {
        Dcqcn {
            rate: p.line_bps,
            target: p.line_bps,
            alpha: 1.0,
            increases: 0,
            last_update: Time::ZERO,
            last_alpha: Time::ZERO,
            next_send: Time::ZERO,
            cnps: 0,
            cuts: 0,
            p,
        }
    }

    /// At full rate: pacing adds nothing (the port paces at line rate).
    pub fn at_line_rate(&self) -> bool {
        self.rate >= self.p.line_bps
    }

    /// The rate at `now` (increase events since the last update applied).
    pub fn rate(&mut self, now: Time) -> f64 {
        self.catch_up(now);
        self.rate
    }

    /// A CNP arrived: Rt = Rc; Rc ×= (1 − α/2); α grows.
    pub fn on_cnp(&mut self, now: Time) {
        self.catch_up(now);
        self.cnps += 1;
        self.cuts += 1;
        self.alpha = (1.0 - self.p.g) * self.alpha + self.p.g;
        self.target = self.rate;
        let keep = (1.0 - self.alpha / 2.0).max(self.p.min_dec_fac);
        self.rate = (self.rate * keep).max(self.p.min_bps);
        self.increases = 0;
        self.last_update = now;
        self.last_alpha = now;
    }

    /// Applies the increase events (fast recovery, then additive, then
    /// hyper) and alpha decays that fell due since the last update.
    fn catch_up(&mut self, now: Time) {
        if now <= self.last_update || self.at_line_rate() {
            return;
        }
        let alpha_steps = ((now - self.last_alpha).as_nanos()
            / self.p.alpha_period.as_nanos().max(1))
        .min(1 << 20) as i32;
        if alpha_steps > 0 {
            self.alpha *= (1.0 - self.p.g).powi(alpha_steps);
            self.last_alpha = now;
        }
        let period = self.p.increase_period.as_nanos().max(1);
        let steps = ((now - self.last_update).as_nanos() / period) as u64;
        for _ in 0..steps.min(100_000) {
            self.increases += 1;
            if self.increases > self.p.threshold * 2 {
                self.target += self.p.hai_bps;
            } else if self.increases > self.p.threshold {
                self.target += self.p.ai_bps;
            }
            self.target = self.target.min(self.p.line_bps);
            self.rate = ((self.rate + self.target) / 2.0).min(self.p.line_bps);
            if self.rate >= self.p.line_bps * 0.999_999 {
                self.rate = self.p.line_bps;
                break;
            }
        }
        self.last_update += Duration::from_nanos((steps * period as u64).min(u64::MAX / 2));
    }

    /// When a request of `bytes` may leave (now, at line rate).
    pub fn release_at(&mut self, now: Time) -> Time {
        self.catch_up(now);
        if self.at_line_rate() {
            now
        } else {
            self.next_send.max(now)
        }
    }

    /// A request of `bytes` left at `now`: the next one waits its
    /// serialisation time at the current rate.
    pub fn sent(&mut self, now: Time, bytes: usize) {
        if self.at_line_rate() {
            return;
        }
        let ns = (bytes as f64 * 8.0 / self.rate * 1e9) as u64;
        self.next_send = self.next_send.max(now) + Duration::from_nanos(ns);
    }
}

/// Which endpoint the simulator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointModel {
    /// Linux rxe: a 128-PSN window, the configured timer, no rate control.
    #[default]
    Rxe,
    /// ConnectX-class: send-queue windows, adaptive timer, DCQCN, line-rate
    /// port scheduling.
    Hw,
}

impl std::str::FromStr for EndpointModel {
    type Err = String;
    fn from_str(s: &str) -> Result<EndpointModel, String> {
        match s {
            "rxe" => Ok(EndpointModel::Rxe),
            "hw" => Ok(EndpointModel::Hw),
            _ => Err(format!("unknown endpoint {s:?}: rxe or hw")),
        }
    }
}

/// PSNs a hardware requester may have outstanding: the PSN space allows
/// 2^23 (half of it) before the comparisons wrap; `QpConfig` takes < 2^22.
pub const HW_MAX_UNACKED_PSNS: u32 = (1 << 22) - 1;

/// The settings of a hardware endpoint on top of `base` (MTU, memory,
/// retry counts). `rdma_cm`: the connection was set up by RDMA-CM, which
/// leaves the responder's `min_rnr_timer` at 0 (655.36 ms).
pub fn hw_config(base: QpConfig, line_bps: f64, rdma_cm: bool) -> QpConfig {
    QpConfig {
        max_unacked_psns: HW_MAX_UNACKED_PSNS,
        timer: TimerMode::Adaptive,
        min_rnr_timer: if rdma_cm { 0 } else { 12 },
        dcqcn: Some(DcqcnParams::mlx5(line_bps)),
        max_rd_atomic: 16,
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn adaptive_timer_steps_2_4_8_16_then_the_configured_timeout_and_resets_on_progress() {
        let cfg = QpConfig {
            timeout_code: 18, // 1.07 s
            ..QpConfig::default()
        };
        let mut t = RetransmitTimer::new(TimerMode::Adaptive);
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(t.timeout(&cfg).unwrap());
            t.expired();
        }
        let conf = cfg.ack_timeout().unwrap();
        assert_eq!(seen, vec![ms(2), ms(4), ms(8), ms(16), conf, conf]);
        t.progress();
        assert_eq!(t.timeout(&cfg), Some(ms(2)));
        let c = RetransmitTimer::new(TimerMode::Configured);
        assert_eq!(c.timeout(&cfg), Some(conf));
        let off = QpConfig {
            timeout_code: 0,
            ..cfg
        };
        assert_eq!(t.timeout(&off), None);
    }

    #[test]
    fn dcqcn_cuts_on_a_cnp_paces_at_the_lower_rate_and_recovers_to_line_rate() {
        let line = 100e9;
        let mut d = Dcqcn::new(DcqcnParams::mlx5(line));
        let t0 = Time::ZERO + ms(1);
        assert_eq!(d.release_at(t0), t0);
        d.on_cnp(t0);
        // α starts at 1: the first cut halves the rate.
        let r = d.rate(t0);
        assert!((r - line / 2.0).abs() < 1e6, "{r}");
        // Pacing: a 4 KiB packet at 50 Gb/s takes 655 ns.
        d.sent(t0, 4096);
        let next = d.release_at(t0);
        assert_eq!((next - t0).as_nanos(), 655);
        // A second CNP cuts again.
        d.on_cnp(t0);
        assert!(d.rate(t0) < r * 0.6);
        // Fast recovery halves the distance to the target (the rate of the
        // last cut) each 300 µs; then the target grows by 5 then 50 Mb/s
        // per period: back at line rate from 25 Gb/s takes about 0.3 s
        // (DCQCN's well-known slow recovery at high rates).
        let later = t0 + Duration::from_micros(300 * 20);
        let back = d.rate(later);
        assert!(back > r * 0.99 && back < r * 1.05, "{back}");
        let later = t0 + Duration::from_secs(1);
        assert_eq!(d.rate(later), line);
        assert_eq!(d.release_at(later + ms(10)), later + ms(10));
    }
}
