//! Congestion control, one controller per path, behind [`Controller`].
//!
//! Recovery (`recovery.rs`) feeds the controller what it measured (RTT,
//! bytes acknowledged, a delivery-rate sample, losses); the controller only
//! answers two questions: how many bytes may be in flight ([`Controller::cwnd`])
//! and how fast to pace them ([`Controller::pacing_rate`]).

mod bbr;
mod fixed;

use std::time::Duration;

use crate::time::Time;

pub use bbr::Bbr;
pub use fixed::FixedRate;

/// What one ACK frame taught a path's sender.
#[derive(Clone, Copy, Debug)]
pub struct AckSample {
    pub now: Time,
    /// Latest RTT sample (ack delay removed), or the smoothed RTT when this
    /// ACK gave no new sample.
    pub rtt: Duration,
    pub srtt: Duration,
    pub min_rtt: Duration,
    /// Bytes newly acknowledged by this ACK (in-flight packets only).
    pub bytes_acked: u64,
    /// Delivery rate (bytes/s) measured over the newest acknowledged packet's
    /// flight, as in draft-cheng-iccrg-delivery-rate-estimation.
    pub delivery_rate: Option<u64>,
    /// The sample was taken while the sender had nothing to send: it may
    /// underestimate the path.
    pub app_limited: bool,
    /// Path's delivered-bytes counter when the newest acknowledged packet was
    /// sent: a round trip ends when this passes the value at the round's start.
    pub prior_delivered: u64,
    /// Path's delivered-bytes counter after this ACK.
    pub delivered: u64,
    pub bytes_in_flight: u64,
}

/// A congestion controller. All rates are bits per second, windows bytes.
pub trait Controller: Send {
    fn on_sent(&mut self, now: Time, bytes: u64, bytes_in_flight: u64);
    fn on_ack(&mut self, s: &AckSample);
    fn on_loss(&mut self, now: Time, bytes_lost: u64, bytes_in_flight: u64);
    /// The path went down (all in flight declared lost): forget what no
    /// longer holds. Default: nothing.
    fn on_path_down(&mut self, _now: Time) {}
    fn pacing_rate(&self) -> u64;
    fn cwnd(&self) -> u64;
    fn name(&self) -> &'static str;
}

/// Rate used when a path has no configured rate and nothing was measured.
pub const DEFAULT_RATE_BPS: u64 = 1_000_000_000;

/// Bytes per second in `bps` bits per second.
pub fn bytes_per_sec(bps: u64) -> u64 {
    bps / 8
}

/// `rate` bytes/s sustained for `d`.
pub fn bytes_in(rate_bytes_per_sec: u64, d: Duration) -> u64 {
    (u128::from(rate_bytes_per_sec) * d.as_nanos() / 1_000_000_000).min(u128::from(u64::MAX)) as u64
}
