//! A one-way link with delay, rate, a bounded queue, and the impairments a
//! WAN has: random and burst loss, jitter, reordering, duplication, outages.

use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use soya_proto::time::Time;

/// Gilbert–Elliott burst loss, the model the WAN transport's tests use too.
pub use soya_proto::wan::testing::GilbertElliott;

#[derive(Clone, Debug, PartialEq)]
pub struct LinkProfile {
    pub delay: Duration,
    /// Uniform extra delay in [0, jitter); FIFO order is kept unless a
    /// packet is picked for reordering.
    pub jitter: Duration,
    /// Bits per second; `None` = infinitely fast.
    pub rate_bps: Option<u64>,
    /// Most bytes waiting to be serialised; beyond it, tail drop.
    pub queue_bytes: usize,
    pub loss: f64,
    pub burst: Option<GilbertElliott>,
    /// Probability a packet is held back by `reorder_delay`, letting later
    /// packets overtake it.
    pub reorder: f64,
    pub reorder_delay: Duration,
    pub duplicate: f64,
    /// Intervals during which everything is dropped.
    pub down: Vec<(Time, Time)>,
}

impl LinkProfile {
    /// A lossless link of the given one-way delay and rate.
    pub fn new(delay: Duration, rate_bps: Option<u64>) -> LinkProfile {
        LinkProfile {
            delay,
            jitter: Duration::ZERO,
            rate_bps,
            queue_bytes: usize::MAX,
            loss: 0.0,
            burst: None,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            duplicate: 0.0,
            down: Vec::new(),
        }
    }

    /// One-way delay of light in fibre: 4.9 µs per km.
    pub fn fibre(km: f64) -> Duration {
        Duration::from_nanos((km * 4_900.0).round() as u64)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub sent: u64,
    pub bytes: u64,
    pub delivered: u64,
    pub lost: u64,
    pub queue_drops: u64,
    pub down_drops: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

pub struct Link {
    pub profile: LinkProfile,
    busy_until: Time,
    last_arrival: Time,
    bad: bool,
    pub stats: LinkStats,
}

impl Link {
    pub fn new(profile: LinkProfile) -> Link {
        Link {
            profile,
            busy_until: Time::ZERO,
            last_arrival: Time::ZERO,
            bad: false,
            stats: LinkStats::default(),
        }
    }

    /// When the packets already given have been serialised: a sender
    /// that never queues (a NIC port) sends again no earlier.
    pub fn free_at(&self) -> Time {
        self.busy_until
    }

    fn serialisation(&self, bytes: usize) -> Duration {
        match self.profile.rate_bps {
            Some(r) if r > 0 => Duration::from_nanos((bytes as u64 * 8 * 1_000_000_000) / r),
            _ => Duration::ZERO,
        }
    }

    /// When a packet of `bytes` sent at `now` arrives: none (lost), one, or
    /// two (duplicated) arrival times.
    pub fn transmit(&mut self, now: Time, bytes: usize, rng: &mut ChaCha8Rng) -> Vec<Time> {
        self.stats.sent += 1;
        self.stats.bytes += bytes as u64;
        let start = self.busy_until.max(now);
        if let Some(r) = self.profile.rate_bps {
            let backlog = (start - now).as_nanos() * u128::from(r) / 8_000_000_000;
            if backlog > self.profile.queue_bytes as u128 {
                self.stats.queue_drops += 1;
                return Vec::new();
            }
        }
        let departure = start + self.serialisation(bytes);
        self.busy_until = departure;
        if self
            .profile
            .down
            .iter()
            .any(|&(a, b)| departure >= a && departure < b)
        {
            self.stats.down_drops += 1;
            return Vec::new();
        }
        if let Some(ge) = self.profile.burst {
            if ge.lose(&mut self.bad, || rng.random::<f64>()) {
                self.stats.lost += 1;
                return Vec::new();
            }
        }
        if self.profile.loss > 0.0 && rng.random::<f64>() < self.profile.loss {
            self.stats.lost += 1;
            return Vec::new();
        }
        let mut arrival = departure + self.profile.delay;
        if !self.profile.jitter.is_zero() {
            let j = rng.random_range(0..self.profile.jitter.as_nanos() as u64);
            arrival += Duration::from_nanos(j);
        }
        if self.profile.reorder > 0.0 && rng.random::<f64>() < self.profile.reorder {
            self.stats.reordered += 1;
            arrival += self.profile.reorder_delay;
        } else {
            // Jitter alone never reorders a FIFO link.
            arrival = arrival.max(self.last_arrival);
            self.last_arrival = arrival;
        }
        self.stats.delivered += 1;
        let mut at = vec![arrival];
        if self.profile.duplicate > 0.0 && rng.random::<f64>() < self.profile.duplicate {
            self.stats.duplicated += 1;
            at.push(arrival + Duration::from_nanos(1));
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn serialises_at_rate_and_adds_delay() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut l = Link::new(LinkProfile::new(
            Duration::from_micros(100),
            Some(8_000_000_000), // 1 byte per ns
        ));
        let a = l.transmit(Time::ZERO, 1000, &mut rng);
        let b = l.transmit(Time::ZERO, 1000, &mut rng);
        assert_eq!(a, vec![Time::from_nanos(101_000)]);
        assert_eq!(b, vec![Time::from_nanos(102_000)]);
    }

    #[test]
    fn loss_rate_is_within_statistical_bounds() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut p = LinkProfile::new(Duration::ZERO, None);
        p.loss = 0.01;
        let mut l = Link::new(p);
        let n = 200_000;
        for _ in 0..n {
            l.transmit(Time::ZERO, 100, &mut rng);
        }
        // Binomial: mean 2000, sd ≈ 44.5; ±5 sd.
        assert!((1778..=2222).contains(&l.stats.lost), "{}", l.stats.lost);
    }

    #[test]
    fn tail_drops_beyond_the_queue_and_drops_while_down() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut p = LinkProfile::new(Duration::ZERO, Some(8_000_000)); // 1 byte/us
        p.queue_bytes = 2_500;
        p.down = vec![(Time::from_millis(100), Time::from_millis(200))];
        let mut l = Link::new(p);
        let got: usize = (0..5)
            .map(|_| l.transmit(Time::ZERO, 1000, &mut rng).len())
            .sum();
        assert_eq!((got, l.stats.queue_drops), (3, 2));
        assert!(l.transmit(Time::from_millis(150), 10, &mut rng).is_empty());
        assert_eq!(l.stats.down_drops, 1);
        assert_eq!(l.transmit(Time::from_millis(250), 10, &mut rng).len(), 1);
    }
}
