//! A half's activity as the expiry sweep (`qp::engine::expiry`) sees it.
//! Its own small module because both roles of a half (the ingress's
//! `PseudoAcker` and the egress's `Reinjector`) carry one, and the sweep
//! sits above them in the engine: they must not import the sweep.

use std::time::Duration;

use crate::time::Time;

/// A half's activity as the sweep sees it: touched by every packet or
/// message for the half, looked at by every sweep.
#[derive(Clone, Copy, Debug)]
pub struct Quiet {
    touched: bool,
    /// The first sweep that found it quiescent and untouched since the
    /// one before, in the current run of such sweeps.
    since: Option<Time>,
}

impl Default for Quiet {
    fn default() -> Quiet {
        Quiet {
            touched: true,
            since: None,
        }
    }
}

impl Quiet {
    /// Something happened to the half.
    pub fn touch(&mut self) {
        self.touched = true;
    }

    /// A sweep at `now`: true once the half has been `quiescent` and
    /// untouched for `after`. The silence is counted from the sweep after
    /// its last activity, so it is never shorter than `after`.
    pub(crate) fn sweep(&mut self, now: Time, quiescent: bool, after: Duration) -> bool {
        if std::mem::take(&mut self.touched) || !quiescent {
            self.since = Some(now);
            return false;
        }
        now.since(*self.since.get_or_insert(now)) >= after
    }
}
