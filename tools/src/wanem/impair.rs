//! The impairment pipeline: the simulator's [`Link`] model, run in real time.
//!
//! One [`LinkProfile`] is split into the same stages, in the same order, as
//! [`Link::transmit`] applies them: bottleneck (rate, bounded queue, outages)
//! → Gilbert-Elliott burst loss → random loss → wire (delay, jitter,
//! reordering, duplication). Each stage is a [`Link`] carrying only its own
//! part of the profile, so the emulator runs the simulator's code, and a
//! dropped packet is attributed to the stage that dropped it.

use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use soya_proto::time::Time;

use crate::sim::link::{Link, LinkProfile};

/// Why a packet did not make it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Random loss.
    Loss,
    /// Gilbert-Elliott burst loss.
    Burst,
    /// Bottleneck queue full (tail drop).
    Queue,
    /// Scheduled link-down interval.
    Down,
    /// The emulator's own hard cap on held packets.
    Overflow,
}

/// A profile that only carries a wire: no rate, no loss, no outages.
fn bare() -> LinkProfile {
    LinkProfile::new(Duration::ZERO, None)
}

pub struct Impairer {
    bottleneck: Option<Link>,
    burst: Option<Link>,
    loss: Option<Link>,
    wire: Link,
    rate_bps: Option<u64>,
    /// Mirror of the bottleneck's "busy until", for the queue-depth gauge.
    busy_until: Time,
}

impl Impairer {
    pub fn new(p: &LinkProfile) -> Impairer {
        let bottleneck = (p.rate_bps.is_some() || !p.down.is_empty()).then(|| {
            let mut b = bare();
            b.rate_bps = p.rate_bps;
            b.queue_bytes = p.queue_bytes;
            b.down = p.down.clone();
            Link::new(b)
        });
        let burst = p.burst.map(|ge| {
            let mut b = bare();
            b.burst = Some(ge);
            Link::new(b)
        });
        let loss = (p.loss > 0.0).then(|| {
            let mut b = bare();
            b.loss = p.loss;
            Link::new(b)
        });
        let mut w = bare();
        w.delay = p.delay;
        w.jitter = p.jitter;
        w.reorder = p.reorder;
        w.reorder_delay = p.reorder_delay;
        w.duplicate = p.duplicate;
        Impairer {
            bottleneck,
            burst,
            loss,
            wire: Link::new(w),
            rate_bps: p.rate_bps.filter(|&r| r > 0),
            busy_until: Time::ZERO,
        }
    }

    /// Sends a packet of `bytes` that reached the emulator at `now`:
    /// fills `out` with its release time(s) (two if duplicated), or says
    /// why it was dropped.
    pub fn transmit(
        &mut self,
        now: Time,
        bytes: usize,
        rng: &mut ChaCha8Rng,
        out: &mut Vec<Time>,
    ) -> Result<(), DropReason> {
        out.clear();
        let mut t = now;
        if let Some(b) = &mut self.bottleneck {
            let queue_drops = b.stats.queue_drops;
            let at = b.transmit(t, bytes, rng);
            if b.stats.queue_drops != queue_drops {
                return Err(DropReason::Queue);
            }
            if let Some(r) = self.rate_bps {
                let ser = bytes as u64 * 8 * 1_000_000_000 / r;
                self.busy_until = self.busy_until.max(t) + Duration::from_nanos(ser);
            }
            match at.first() {
                Some(&d) => t = d,
                None => return Err(DropReason::Down),
            }
        }
        if let Some(b) = &mut self.burst {
            if b.transmit(t, bytes, rng).is_empty() {
                return Err(DropReason::Burst);
            }
        }
        if let Some(l) = &mut self.loss {
            if l.transmit(t, bytes, rng).is_empty() {
                return Err(DropReason::Loss);
            }
        }
        out.extend(self.wire.transmit(t, bytes, rng));
        Ok(())
    }

    /// Bytes waiting in the bottleneck queue at `now`.
    pub fn queue_bytes(&self, now: Time) -> u64 {
        match self.rate_bps {
            Some(r) if self.busy_until > now => {
                ((self.busy_until - now).as_nanos() * u128::from(r) / 8_000_000_000) as u64
            }
            _ => 0,
        }
    }

    /// Packets held back for reordering so far.
    pub fn reordered(&self) -> u64 {
        self.wire.stats.reordered
    }

    /// Packets duplicated so far.
    pub fn duplicated(&self) -> u64 {
        self.wire.stats.duplicated
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::link::GilbertElliott;
    use rand::SeedableRng;

    #[test]
    fn attributes_drops_to_their_stage() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut p = LinkProfile::new(Duration::from_millis(3), Some(8_000_000));
        p.queue_bytes = 2_500;
        p.down = vec![(Time::from_millis(100), Time::from_millis(200))];
        let mut imp = Impairer::new(&p);
        let mut out = Vec::new();
        let r: Vec<_> = (0..5)
            .map(|_| imp.transmit(Time::ZERO, 1000, &mut rng, &mut out))
            .collect();
        assert_eq!(
            r.iter().filter(|r| **r == Err(DropReason::Queue)).count(),
            2
        );
        assert_eq!(imp.queue_bytes(Time::ZERO), 3000);
        let r = imp.transmit(Time::from_millis(150), 10, &mut rng, &mut out);
        assert_eq!(r, Err(DropReason::Down));
        imp.transmit(Time::from_millis(250), 10, &mut rng, &mut out)
            .unwrap();
        assert_eq!(out, vec![Time::from_micros(253_010)]);

        let mut p = LinkProfile::new(Duration::ZERO, None);
        p.burst = Some(GilbertElliott {
            p_enter_bad: 1.0,
            p_leave_bad: 0.0,
            loss_in_bad: 1.0,
        });
        let mut imp = Impairer::new(&p);
        assert_eq!(
            imp.transmit(Time::ZERO, 10, &mut rng, &mut out),
            Err(DropReason::Burst)
        );
    }
}
