//! A requester paced by CNPs while a queue stands in the deep buffer: the
//! half's side of the engine's pacer (`qp::engine::pacer`, which says why).

use std::time::Duration;

use crate::buffer::DeepBuffer;
use crate::time::Time;

use super::{Outbox, PseudoAcker};

/// Most packets a paced requester is promised past its pseudo-ACK, against
/// a ConnectX send queue of 2,048 (128 × 64 KiB at a 4 KiB MTU): small
/// grants, often. Measured: 64 and 128 both end the resend storms, 128
/// keeps more of the link (docs/benchmarks.md §2).
pub const PACED_WINDOW: usize = 128;

/// Pacing only while at least this many flows wait for room in the
/// buffer, in turn (`buffer::room`): only then does a flow wait through
/// a round of other flows' grants long enough for its timer. With fewer,
/// a CNP to one of them only hands the link to the other: pacing whenever
/// two waited, one of two hardware QPs fell to 0.00 of an equal share (over-subscribed seed 5864; 0.99 now, as before the pacer),
/// and marking whenever a queue stood, one hardware QP over 1 Gb/s fell to
/// 0.67 of the link. A flow alone in the buffer is still paced once it is
/// withheld long (`pace_when_held`): there is no other flow to hand the
/// link to, and one hardware QP over 1 Gb/s then resends nothing instead
/// of 63,921 packets.
pub const PACE_WHEN_WAITING: usize = 3;

/// A requester withheld this long while it holds at least an equal share
/// of the buffer is paced even before the queue stands long enough for the
/// pacer's marks: half the first step of a ConnectX timer.
const HELD_BEFORE_PACING: Duration = Duration::from_millis(1);
/// ...once its window is known to be wider than a paced promise, or, while
/// its window is not known yet, after this long: a requester stopped at a
/// narrow window (8 packets) shows it at the second hold check (2 ms,
/// `note_stopped`) and is never paced, since a CNP slows it without
/// shrinking what it may send (over-subscribed hardware seed 100819: four
/// QPs of 8 packets paced at 1 ms fell to 0.08 of an equal share).
const HELD_BEFORE_PACING_UNSEEN: Duration = Duration::from_millis(2);

/// The pacing state of a half.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Marked by the pacer (or withheld long): CNPs each time it is
    /// withheld, and a promise of at most [`PACED_WINDOW`].
    paced: bool,
    /// The pacer's marks, in fractions of one: a CNP each time it reaches
    /// one (a deterministic stand-in for a coin per look, so that
    /// simulated runs repeat).
    credit: f64,
    /// When the requester last sent a new request.
    pub(super) last_arrival: Option<Time>,
}

impl PseudoAcker {
    /// Whether the requester sent a new request within `span` of `now`.
    pub fn sent_within(&self, now: Time, span: Duration) -> bool {
        self.pacing
            .last_arrival
            .is_some_and(|t| now.since(t) < span)
    }

    /// Paced, or owed part of a mark: what [`Self::unpace`] undoes.
    pub fn is_pacing(&self) -> bool {
        self.pacing.paced || self.pacing.credit > 0.0
    }

    /// The pacer's look: `p` of a mark (at most 1).
    pub fn pace_mark(&mut self, now: Time, p: f64, buf: &mut DeepBuffer, out: &mut Outbox) {
        self.pacing.credit += p;
        if self.pacing.credit >= 1.0 {
            self.pacing.credit -= 1.0;
            self.pace(now, buf, out);
        }
    }

    /// The queue no longer stands: the requester is promised its whole
    /// window again.
    pub fn unpace(&mut self, now: Time, buf: &mut DeepBuffer) {
        self.pacing.credit = 0.0;
        if self.pacing.paced {
            self.pacing.paced = false;
            self.renew_promise(now, buf);
        }
    }

    /// A CNP, and from now on a paced promise: a smaller promise may let
    /// a withheld pseudo-ACK go at once.
    pub(super) fn pace(&mut self, now: Time, buf: &mut DeepBuffer, out: &mut Outbox) {
        if !self.tuning.cnp_on_backpressure {
            return;
        }
        self.maybe_cnp(now, out);
        if !self.pacing.paced {
            self.pacing.paced = true;
            self.renew_promise(now, buf);
            self.maybe_ack(now, buf, out);
        }
    }

    /// The window to promise, `window` when not paced.
    pub(super) fn paced_window(&self, window: usize) -> usize {
        if self.pacing.paced {
            window.min(PACED_WINDOW)
        } else {
            window
        }
    }

    pub(crate) fn is_paced(&self) -> bool {
        self.pacing.paced
    }

    /// Withheld for `held`: pace it now? Only while other flows wait for
    /// room too ([`PACE_WHEN_WAITING`]) or while it is alone in the buffer,
    /// only a requester holding at least an equal share of the buffer (the
    /// others are not the ones filling it), and only one whose window is
    /// wider than a paced promise.
    pub(super) fn pace_when_held(&self, held: Duration, buf: &DeepBuffer) -> bool {
        let alone = buf.flow_count() <= 1;
        if self.pacing.paced
            || held < HELD_BEFORE_PACING
            || (buf.waiting() < PACE_WHEN_WAITING && !alone)
            || !buf.holds_mean_share(self.flow_id)
        {
            return false;
        }
        self.window > PACED_WINDOW || (!self.window_seen && held >= HELD_BEFORE_PACING_UNSEEN)
    }
}
