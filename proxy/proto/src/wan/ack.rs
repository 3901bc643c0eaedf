//! Receiver side of one path's packet-number space: what to acknowledge, when.
//!
//! Keeps at most [`MAX_ACK_RANGES`] ranges of received packet numbers. Packet
//! numbers are never reused (a retransmission gets a new one), so holes never
//! fill and old ranges would pile up forever; at the bound the lowest range is
//! forgotten. Its packets were reported in earlier ACKs; if all of those were
//! lost the sender merely retransmits some data spuriously.

use std::time::Duration;

use crate::time::Time;

use super::packet::{encode_ack, Writer, MAX_ACK_RANGES};

/// ACK after this many ack-eliciting packets at the latest.
pub const ACK_THRESHOLD: u32 = 2;

#[derive(Default)]
pub struct AckTracker {
    /// Ascending, disjoint, non-adjacent inclusive ranges.
    ranges: Vec<(u64, u64)>,
    largest_time: Time,
    unacked_eliciting: u32,
    deadline: Option<Time>,
    immediate: bool,
    /// Something arrived since the last ACK we sent.
    dirty: bool,
}

impl AckTracker {
    /// Records a received (authenticated, fresh) packet.
    pub fn on_packet(&mut self, pn: u64, now: Time, ack_eliciting: bool, max_delay: Duration) {
        let largest = self.ranges.last().map(|r| r.1);
        // Reordered, or a gap before it: the sender should hear quickly
        // (RFC 9000 §13.2.1), but only for packets that elicit ACKs at all,
        // or two peers would answer each other's reordered ACKs forever.
        let out_of_order = match largest {
            Some(l) => pn < l || pn > l + 1,
            None => false,
        };
        if largest.is_none_or(|l| pn > l) {
            self.largest_time = now;
        }
        self.insert(pn);
        self.dirty = true;
        if ack_eliciting {
            self.unacked_eliciting += 1;
            if self.unacked_eliciting >= ACK_THRESHOLD || out_of_order {
                self.immediate = true;
            }
            if self.deadline.is_none() {
                self.deadline = Some(now + max_delay);
            }
        }
    }

    fn insert(&mut self, pn: u64) {
        // Ranges are few (≤ 32) and new packets usually extend the last one.
        let i = self.ranges.partition_point(|r| r.1 < pn);
        if i < self.ranges.len() && self.ranges[i].0 <= pn {
            return; // already inside a range
        }
        let joins_prev = i > 0 && self.ranges[i - 1].1 + 1 == pn;
        let joins_next = i < self.ranges.len() && self.ranges[i].0 == pn + 1;
        match (joins_prev, joins_next) {
            (true, true) => {
                self.ranges[i - 1].1 = self.ranges[i].1;
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i - 1].1 = pn,
            (false, true) => self.ranges[i].0 = pn,
            (false, false) => self.ranges.insert(i, (pn, pn)),
        }
        if self.ranges.len() > MAX_ACK_RANGES {
            self.ranges.remove(0);
        }
    }

    /// An ACK must go out now (or at the deadline, see [`Self::deadline`]).
    pub fn wants_ack(&self, now: Time) -> bool {
        self.unacked_eliciting > 0 && (self.immediate || self.deadline.is_some_and(|d| d <= now))
    }

    /// Worth piggybacking on a packet that goes out anyway.
    pub fn has_news(&self) -> bool {
        self.dirty
    }

    pub fn deadline(&self) -> Option<Time> {
        if self.unacked_eliciting == 0 {
            return None;
        }
        if self.immediate {
            return Some(Time::ZERO);
        }
        self.deadline
    }

    /// Writes an ACK frame for `path` into `w`, dropping the lowest ranges if
    /// the whole frame does not fit. `false` if not even one range fits.
    pub fn write(&mut self, path: u8, now: Time, w: &mut Writer<'_>) -> bool {
        if self.ranges.is_empty() {
            return false;
        }
        let delay_us = now.since(self.largest_time).as_micros() as u64;
        let mut n = self.ranges.len();
        while n > 0 {
            let ranges = self.ranges.iter().rev().take(n).copied();
            if encode_ack(w, path, delay_us, ranges) {
                self.dirty = false;
                self.immediate = false;
                self.unacked_eliciting = 0;
                self.deadline = None;
                return true;
            }
            n /= 2;
        }
        false
    }

    pub fn reset(&mut self) {
        *self = AckTracker::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wan::packet::{parse_frames, Frame};

    /// The ranges of the ACK frame `t` writes.
    fn frame(t: &mut AckTracker) -> Vec<(u64, u64)> {
        let mut buf = [0u8; 1024];
        let mut w = Writer::new(&mut buf);
        assert!(t.write(0, Time::ZERO, &mut w));
        let n = w.len();
        match parse_frames(&buf[..n]).unwrap().pop() {
            Some(Frame::Ack(a)) => a.ranges().collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ranges_merge_and_bound() {
        let mut t = AckTracker::default();
        let d = Duration::from_millis(1);
        for pn in [0, 1, 2, 5, 4, 9] {
            t.on_packet(pn, Time::ZERO, true, d);
        }
        assert_eq!(frame(&mut t), [(9, 9), (4, 5), (0, 2)]);
        t.on_packet(3, Time::ZERO, true, d);
        assert_eq!(frame(&mut t), [(9, 9), (0, 5)]);
        t.on_packet(3, Time::ZERO, true, d); // duplicate: no change
        for k in 0..100 {
            t.on_packet(20 + 2 * k, Time::ZERO, true, d);
        }
        let f = frame(&mut t);
        assert_eq!(f.len(), MAX_ACK_RANGES);
        assert_eq!(f[0].1, 218);
    }

    #[test]
    fn ack_timing() {
        let mut t = AckTracker::default();
        let d = Duration::from_micros(250);
        t.on_packet(0, Time::ZERO, true, d);
        assert!(!t.wants_ack(Time::ZERO));
        assert!(t.wants_ack(Time::from_micros(250)));
        t.on_packet(1, Time::ZERO, true, d);
        assert!(t.wants_ack(Time::ZERO), "threshold reached");
        frame(&mut t);
        assert!(!t.wants_ack(Time::from_millis(5)));
        t.on_packet(2, Time::ZERO, false, d);
        assert!(!t.wants_ack(Time::from_millis(5)), "ACK-only never elicits");
        t.on_packet(9, Time::ZERO, false, d);
        assert!(
            !t.wants_ack(Time::ZERO),
            "a gap before an ACK-only packet: no"
        );
        t.on_packet(7, Time::ZERO, true, d);
        assert!(t.wants_ack(Time::ZERO), "reordered: immediate");
    }
}
