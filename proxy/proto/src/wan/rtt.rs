//! Round-trip time estimation, shared by a path ([`super::path`]) and its
//! loss recovery ([`super::recovery`]).

use std::time::Duration;

/// Timer granularity assumed by loss detection (RFC 9002 kGranularity,
/// shrunk from 1 ms because the I/O layer runs microsecond timers and
/// datacenter-to-datacenter RTTs are a few milliseconds).
pub const GRANULARITY: Duration = Duration::from_micros(250);
/// RFC 9002 §5 RTT estimator.
#[derive(Clone, Debug)]
pub struct RttEstimator {
    latest: Duration,
    smoothed: Duration,
    var: Duration,
    min: Option<Duration>,
}

impl RttEstimator {
    pub fn new(initial: Duration) -> RttEstimator {
        RttEstimator {
            latest: initial,
            smoothed: initial,
            var: initial / 2,
            min: None,
        }
    }

    pub fn update(&mut self, latest: Duration, ack_delay: Duration) {
        self.latest = latest;
        let Some(min) = self.min else {
            self.min = Some(latest);
            self.smoothed = latest;
            self.var = latest / 2;
            return;
        };
        let min = min.min(latest);
        self.min = Some(min);
        // Remove the peer's ack delay unless that would go below min RTT.
        let adjusted = if latest >= min + ack_delay {
            latest - ack_delay
        } else {
            latest
        };
        let dev = self.smoothed.abs_diff(adjusted);
        self.var = (self.var * 3 + dev) / 4;
        self.smoothed = (self.smoothed * 7 + adjusted) / 8;
    }

    pub fn latest(&self) -> Duration {
        self.latest
    }
    pub fn smoothed(&self) -> Duration {
        self.smoothed
    }
    pub fn var(&self) -> Duration {
        self.var
    }
    /// Minimum RTT seen (the initial estimate before any sample).
    pub fn min(&self) -> Duration {
        self.min.unwrap_or(self.smoothed)
    }
    /// RFC 9002 time threshold: 9/8 × max(srtt, latest RTT).
    pub fn loss_delay(&self) -> Duration {
        (self.smoothed.max(self.latest) * 9 / 8).max(GRANULARITY)
    }

    /// Probe timeout before backoff.
    pub fn pto_base(&self, max_ack_delay: Duration) -> Duration {
        self.smoothed + (self.var * 4).max(GRANULARITY) + max_ack_delay
    }
}
