//! How long packets stand in the deep buffer beyond the path's own delay:
//! the queue the gateway paces its requesters by when the WAN is slower
//! than they are (`qp::engine::pacer`).
//!
//! A packet's transit is the time from its admission to the twin's
//! `Delivered` for it. The least transit ever seen is the empty-queue base
//! (one WAN round trip and the responder); the least transit seen over the
//! last interval, less that base, is the standing queue. A minimum, not a
//! mean, so that a packet the WAN lost and sent again (one more round trip)
//! does not read as a queue: only when *every* packet of an interval
//! waited does the queue stand (CoDel's reasoning, with its interval
//! shortened to the timescale of DCQCN, which the requesters pace by).

use std::time::Duration;

use crate::time::Time;

/// Standing-queue estimate over the last interval.
#[derive(Debug, Default)]
pub struct SojournMeter {
    base: Option<Duration>,
    interval_min: Option<Duration>,
    interval_start: Option<Time>,
    standing: Duration,
    /// The last packet's transit beyond the base.
    last_excess: Duration,
}

impl SojournMeter {
    /// A packet admitted at `admitted` was reported delivered at `now`.
    pub fn note(&mut self, admitted: Time, now: Time) {
        let t = now.since(admitted);
        self.base = Some(self.base.map_or(t, |b| b.min(t)));
        self.interval_min = Some(self.interval_min.map_or(t, |m| m.min(t)));
        self.interval_start.get_or_insert(now);
        self.last_excess = t.saturating_sub(self.base.unwrap_or(t));
    }

    /// How much longer than the base the last packet took: a queue may
    /// be standing.
    pub fn last_excess(&self) -> Duration {
        self.last_excess
    }

    /// The standing queue as of the last interval of at least `interval`
    /// that ended by `now`. An interval in which nothing was delivered
    /// keeps the previous estimate: a WAN that delivers nothing is not a
    /// queue that drained.
    pub fn standing(&mut self, now: Time, interval: Duration) -> Duration {
        if let (Some(start), Some(min), Some(base)) =
            (self.interval_start, self.interval_min, self.base)
        {
            if now.since(start) >= interval {
                self.standing = min.saturating_sub(base);
                self.interval_min = None;
                self.interval_start = None;
            }
        }
        self.standing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn a_queue_stands_only_when_every_packet_of_an_interval_waited() {
        let mut m = SojournMeter::default();
        // The base: 3 ms of WAN round trip.
        m.note(at(0), at(3));
        assert_eq!(m.standing(at(6), 2 * MS), Duration::ZERO);
        // Every packet of the next interval waited 5 ms more: a queue.
        m.note(at(10), at(18));
        m.note(at(11), at(19));
        assert_eq!(
            m.standing(at(19), 2 * MS),
            Duration::ZERO,
            "interval not over"
        );
        assert_eq!(m.standing(at(20), 2 * MS), 5 * MS);
        // One packet of an interval crossed with no wait (the others were
        // resent after a loss): the queue is gone.
        m.note(at(30), at(33));
        m.note(at(30), at(40));
        assert_eq!(m.standing(at(40), 2 * MS), Duration::ZERO);
    }

    #[test]
    fn an_interval_with_no_delivery_keeps_the_estimate() {
        let mut m = SojournMeter::default();
        m.note(at(0), at(3));
        assert_eq!(m.standing(at(5), 2 * MS), Duration::ZERO);
        m.note(at(4), at(11));
        assert_eq!(m.standing(at(13), 2 * MS), 4 * MS);
        assert_eq!(m.standing(at(50), 2 * MS), 4 * MS);
    }
}
