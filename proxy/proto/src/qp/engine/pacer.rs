//! The gateway as a DCQCN notification point (issue 33).
//!
//! When the WAN is slower than the requesters, the deep buffer fills and
//! the gateway pushes back by withholding pseudo-ACKs (`qp::ingress::acking`).
//! That alone is an ACK clock of whole windows: the buffer frees room a
//! window at a time, so with N QPs each one's pseudo-ACK moves once per N
//! windows of drain. A ConnectX-class requester's adaptive retransmission
//! timer starts at 2 ms and only an ACK that moves restarts it, so 64 such
//! QPs on a 10 Gb/s path resent 4.7 packets per packet carried, and on
//! 1 Gb/s the resends grew with the run until it never ended
//! (docs/benchmarks.md §2).
//!
//! So the gateway also does what a switch with a standing queue does: it
//! marks. While packets stand in the buffer longer than the path's own
//! delay (`buffer::sojourn`), each requester that sent lately gets CNPs
//! with a probability that grows with the queue (RED's ramp, on the queue's
//! sojourn time rather than its length, so that one figure fits every WAN
//! rate), weighted by the share of the buffer it holds: its DCQCN slows it
//! below its share, it has less outstanding for its timer, and the flows
//! that hold most are slowed most. A requester marked is also *paced*: it is
//! promised at most [`PACED_WINDOW`](crate::qp::ingress) packets past its
//! pseudo-ACK, so that room comes back to it in small grants, often, not a
//! whole send queue now and then. It marks only while at least three flows
//! wait for room ([`PACE_WHEN_WAITING`]): a deep buffer holds a lone
//! window-limited flow's whole window, so a queue stands by design, only
//! flows waiting through other flows' grants risk their timers, and a CNP
//! to one of two flows only hands the link to the other. When the
//! queue no longer stands, every flow is promised its window again.
//!
//! `pseudo_ack.cnp_on_backpressure = false` turns the pacer off with the
//! other CNPs.

use std::time::Duration;

use crate::time::Time;

use super::QpEngine;
use crate::qp::ingress::PACE_WHEN_WAITING;

/// How often the pacer looks at the queue while requesters send.
const PACE_EVERY: Duration = Duration::from_micros(300);
/// The standing queue is the least sojourn over this long: DCQCN's own
/// timescale (a ConnectX rate increase timer of 300 µs to a few ms).
const STANDING_OVER: Duration = Duration::from_millis(2);
/// A requester that sent within this long is paced; one quieter than that
/// has nothing in flight worth slowing.
const ACTIVE_WITHIN: Duration = Duration::from_millis(50);
/// The queue at which marking starts, and the one at which every active
/// requester is marked each look. The floor is well above the jitter of a
/// clean WAN and below the 2 ms first step of the requesters' timers.
const QUEUE_MIN: Duration = Duration::from_millis(1);
const QUEUE_MAX: Duration = Duration::from_millis(10);

/// The probability of a mark at each look, for a requester holding an
/// equal share of the buffer, with `standing` queued.
fn mark_probability(standing: Duration) -> f64 {
    let over = standing.saturating_sub(QUEUE_MIN).as_secs_f64();
    (over / (QUEUE_MAX - QUEUE_MIN).as_secs_f64()).min(1.0)
}

impl QpEngine {
    /// After each event: the pacer looks from now on if the buffer pushed
    /// back or a packet stood in it, and keeps looking while the queue
    /// stands or the buffer pushes back, and requesters send. Otherwise it
    /// sets no timer: a gateway under no pressure runs as if it had none.
    pub(super) fn arm_pacer(&mut self, now: Time) {
        if self.cfg.ack.cnp_on_backpressure
            && self.pace_due.is_none()
            && self.buffer.under_pressure(QUEUE_MIN)
        {
            self.pace_due = Some(now + PACE_EVERY);
        }
    }

    /// One look of the pacer, if due. Only the halves it acts on are
    /// touched mutably (each such touch re-reads the half's timer).
    pub(super) fn pace(&mut self, now: Time) {
        if self.pace_due.is_none_or(|t| now < t) {
            return;
        }
        self.pace_due = None;
        let pressed = self.buffer.take_pressure(QUEUE_MIN);
        let standing = self.buffer.standing_queue(now, STANDING_OVER);
        let p = if self.buffer.waiting() >= PACE_WHEN_WAITING {
            mark_probability(standing)
        } else {
            0.0
        };
        let mut keys = std::mem::take(&mut self.pace_keys);
        keys.clear();
        let mut active = false;
        let mut held = 0;
        for (k, a) in self.ingress.iter() {
            let sent = a.sent_within(now, ACTIVE_WITHIN);
            active |= sent;
            if p > 0.0 && sent {
                held += self.buffer.flow_slots(a.flow_id());
                keys.push(*k);
            } else if p == 0.0 && a.is_pacing() {
                keys.push(*k);
            }
        }
        let mean = (held as f64 / keys.len().max(1) as f64).max(1.0);
        for k in &keys {
            let Some(a) = self.ingress.get_mut(k) else {
                continue;
            };
            if p > 0.0 {
                let share = self.buffer.flow_slots(a.flow_id()) as f64 / mean;
                a.pace_mark(now, (p * share).min(1.0), &mut self.buffer, &mut self.out);
            } else {
                a.unpace(now, &mut self.buffer);
            }
        }
        self.pace_keys = keys;
        if active && (p > 0.0 || pressed) {
            self.pace_due = Some(now + PACE_EVERY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marking_ramps_from_the_floor_to_every_look() {
        assert_eq!(mark_probability(Duration::ZERO), 0.0);
        assert_eq!(mark_probability(QUEUE_MIN), 0.0);
        let mid = mark_probability(Duration::from_micros(5_500));
        assert!((mid - 0.5).abs() < 1e-9, "{mid}");
        assert_eq!(mark_probability(QUEUE_MAX), 1.0);
        assert_eq!(mark_probability(Duration::from_secs(1)), 1.0);
    }
}
