//! One WAN path: RTT estimate, pacer, liveness, and the per-path halves of
//! loss recovery, acknowledgement and replay protection.
//!
//! Liveness (see `docs/wan-protocol.md` § Paths): a path is `Probing` until
//! the first ACK proves a round trip, `Up` while ACKs keep coming, and `Down`
//! after `max(3 × PTO, floor)` without one while something was outstanding.
//! Idle paths send PING keepalives so that silence always means trouble; Down
//! paths are probed with a PING at a slow rate and come back on the first ACK.

use std::time::Duration;

use crate::time::Time;

use super::ack::AckTracker;
use super::cc::Controller;
use super::recovery::Recovery;
use super::replay::ReplayWindow;
use super::rtt::RttEstimator;

/// PTO backoff stops doubling here (2^6 × PTO).
const MAX_PTO_BACKOFF: u32 = 6;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathState {
    /// No round trip seen yet.
    Probing,
    Up,
    Down,
    /// Removed by a reconfiguration: never used again in this session (its
    /// slot keeps its packet numbers, so that a path added later in the
    /// same slot never reuses a nonce).
    Retired,
}

/// Token-bucket pacer: a packet may leave `lookahead` before its slot (so
/// the I/O layer can batch, honouring `release_at`), and an idle path may
/// send a burst of `burst` bytes at once.
#[derive(Clone, Debug, Default)]
pub struct Pacer {
    next: Time,
}

/// Time to send `bytes` at `rate_bps`.
pub fn tx_time(bytes: u64, rate_bps: u64) -> Duration {
    let ns = u128::from(bytes) * 8 * 1_000_000_000 / u128::from(rate_bps.max(1));
    Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
}

impl Pacer {
    /// When the next packet may be handed out (`lookahead` early).
    pub fn ready_at(&self, lookahead: Duration) -> Time {
        Time::from_nanos(
            self.next
                .as_nanos()
                .saturating_sub(lookahead.as_nanos() as u64),
        )
    }

    /// Release time of the next packet if it were sent now.
    pub fn release_at(&self, now: Time) -> Time {
        self.next.max(now)
    }

    /// Accounts a packet sent at `now`; returns its release time.
    pub fn on_send(&mut self, now: Time, bytes: u64, rate_bps: u64, burst: u64) -> Time {
        let floor = Time::from_nanos(
            now.as_nanos()
                .saturating_sub(tx_time(burst, rate_bps).as_nanos() as u64),
        );
        let start = self.next.max(floor);
        self.next = start + tx_time(bytes, rate_bps);
        start.max(now)
    }
}

/// Counters of one path (exposed through `PathStats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathCounters {
    pub packets_sent: u64,
    pub bytes_sent: u64,
    pub packets_received: u64,
    pub bytes_received: u64,
    pub packets_lost: u64,
    pub bytes_lost: u64,
    pub packets_retransmitted: u64,
    /// Packets declared lost whose ACK came later (reordering).
    pub spurious_losses: u64,
    pub auth_failures: u64,
    pub replays_dropped: u64,
    pub malformed: u64,
    pub times_down: u64,
    /// Datagrams that arrived on the path after a reload removed it.
    pub retired_drops: u64,
}

pub struct Path {
    pub name: String,
    pub weight: u32,
    /// The configured rate (`None`: not configured), as the controller was
    /// built with.
    pub rate_bps: Option<u64>,
    pub state: PathState,
    pub rtt: RttEstimator,
    pub cc: Box<dyn Controller>,
    pub recovery: Recovery,
    pub acks: AckTracker,
    pub replay: ReplayWindow,
    pub pacer: Pacer,
    /// Pacing burst allowance after idle (bytes): the floor.
    pub burst_bytes: u64,
    /// ... or this much of the rate, up to `burst_cap` bytes.
    pub burst_time: Duration,
    pub burst_cap: u64,
    pub pto_count: u32,
    /// Last ACK that acknowledged something new on this path (or the time
    /// liveness tracking started).
    pub last_ack_rx: Time,
    /// A PING must go out on this path (keepalive, PTO probe, Down probe).
    pub ping_due: bool,
    /// Next slow probe while Down (or Probing).
    pub next_probe: Time,
    /// A HELLO must go out on this path.
    pub hello_due: bool,
    pub last_hello_tx: Option<Time>,
    /// Loss fraction, exponentially weighted over packets (1/256 per packet).
    pub loss_ewma: f64,
    pub counters: PathCounters,
}

impl Path {
    pub fn new(
        name: String,
        weight: u32,
        initial_rtt: Duration,
        cc: Box<dyn Controller>,
        now: Time,
    ) -> Path {
        Path {
            name,
            weight,
            rate_bps: None,
            state: PathState::Probing,
            rtt: RttEstimator::new(initial_rtt),
            cc,
            recovery: Recovery::default(),
            acks: AckTracker::default(),
            replay: ReplayWindow::default(),
            pacer: Pacer::default(),
            burst_bytes: 0,
            burst_time: Duration::ZERO,
            burst_cap: 0,
            pto_count: 0,
            last_ack_rx: now,
            ping_due: false,
            next_probe: now,
            hello_due: false,
            last_hello_tx: None,
            loss_ewma: 0.0,
            counters: PathCounters::default(),
        }
    }

    pub fn pto(&self, max_ack_delay: Duration) -> Duration {
        self.rtt.pto_base(max_ack_delay) * (1 << self.pto_count.min(MAX_PTO_BACKOFF))
    }

    /// When the probe timer fires (something ack-eliciting in flight).
    pub fn pto_deadline(&self, max_ack_delay: Duration) -> Option<Time> {
        if matches!(self.state, PathState::Down | PathState::Retired)
            || self.recovery.packets_in_flight == 0
        {
            return None;
        }
        Some(self.recovery.last_sent_time? + self.pto(max_ack_delay))
    }

    /// When silence makes this path Down.
    pub fn down_deadline(&self, max_ack_delay: Duration, floor: Duration) -> Option<Time> {
        if matches!(self.state, PathState::Down | PathState::Retired) {
            return None;
        }
        let oldest = self.recovery.oldest_outstanding()?;
        let since = self.last_ack_rx.max(oldest);
        Some(since + (self.rtt.pto_base(max_ack_delay) * 3).max(floor))
    }

    /// Accounts one packet's fate in the loss estimate.
    pub fn note_loss_sample(&mut self, lost: bool) {
        let x = if lost { 1.0 } else { 0.0 };
        self.loss_ewma += (x - self.loss_ewma) / 256.0;
    }

    /// Bytes the pacer lets a late sender catch up at `rate_bps`: the
    /// floor in packets, or `burst_time` of the rate up to the cap.
    pub fn burst_allowance(&self, rate_bps: u64) -> u64 {
        let by_time = (u128::from(rate_bps) * self.burst_time.as_nanos() / 8_000_000_000) as u64;
        self.burst_bytes.max(by_time.min(self.burst_cap))
    }

    /// Room in the congestion window for a packet of `size` bytes.
    pub fn has_cwnd_room(&self, size: u64) -> bool {
        self.recovery.bytes_in_flight + size <= self.cc.cwnd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_allows_burst_then_spaces() {
        let mut p = Pacer::default();
        let now = Time::from_millis(10);
        let rate = 8_000_000_000; // 1 GB/s: 1000 B take 1 µs
                                  // The burst allowance (4 packets) on top of the packet due now.
        let r: Vec<Time> = (0..7).map(|_| p.on_send(now, 1000, rate, 4000)).collect();
        assert!(r[..5].iter().all(|&t| t == now), "{r:?}");
        assert_eq!(r[5], now + Duration::from_micros(1));
        assert_eq!(r[6], now + Duration::from_micros(2));
        assert_eq!(
            p.ready_at(Duration::from_micros(1)),
            now + Duration::from_micros(2)
        );
    }

    #[test]
    fn a_late_sender_catches_up_a_millisecond_of_rate() {
        let mut path = Path::new(
            "p".into(),
            1,
            Duration::from_millis(3),
            Box::new(crate::wan::cc::FixedRate::new(
                1_000_000_000,
                8952,
                Duration::from_millis(3),
                Time::ZERO,
            )),
            Time::ZERO,
        );
        path.burst_bytes = 4 * 8952;
        path.burst_time = Duration::from_millis(1);
        path.burst_cap = 64 * 8952;
        // 1 Gb/s: a millisecond is 125,000 B (14 packets), above the floor.
        assert_eq!(path.burst_allowance(1_000_000_000), 125_000);
        // Slow: the floor; fast: the cap.
        assert_eq!(path.burst_allowance(10_000_000), 4 * 8952);
        assert_eq!(path.burst_allowance(100_000_000_000), 64 * 8952);
        // A sender that woke 1 ms late at 1 Gb/s sends a millisecond's worth
        // at once (14 packets of 71.6 µs), where an allowance of 4 packets
        // sends 5 and loses the other 0.64 ms for good.
        let mut p = Pacer::default();
        let rate = 1_000_000_000;
        let t0 = Time::from_millis(10);
        p.on_send(t0, 8952, rate, path.burst_allowance(rate));
        let late = t0 + Duration::from_millis(1) + tx_time(8952, rate);
        let burst = path.burst_allowance(rate);
        let now_count = (0..40)
            .map(|_| p.on_send(late, 8952, rate, burst))
            .take_while(|&t| t == late)
            .count();
        assert_eq!(now_count, 14, "packets sent at once after a 1 ms stall");
        let mut q = Pacer::default();
        q.on_send(t0, 8952, rate, 4 * 8952);
        let old = (0..40)
            .map(|_| q.on_send(late, 8952, rate, 4 * 8952))
            .take_while(|&t| t == late)
            .count();
        assert_eq!(old, 5, "with the 4-packet floor alone");
    }

    #[test]
    fn rtt_estimator_follows_rfc9002() {
        let mut r = RttEstimator::new(Duration::from_millis(50));
        r.update(Duration::from_millis(3), Duration::ZERO);
        assert_eq!(r.smoothed(), Duration::from_millis(3));
        assert_eq!(r.min(), Duration::from_millis(3));
        // An ack delay that would go below min RTT is not subtracted.
        r.update(Duration::from_millis(4), Duration::from_millis(2));
        assert_eq!(r.latest(), Duration::from_millis(4));
        assert!(r.smoothed() > Duration::from_millis(3));
        assert!(r.loss_delay() >= Duration::from_millis(4) * 9 / 8);
    }
}
