//! Is the twin gateway still there? [`TwinWatch`] follows the WAN paths'
//! liveness and declares the twin **lost** once no path has been up for
//! `wan.twin_timeout`.
//!
//! Why a gateway needs this: it pseudo-ACKs requests, so a requester whose
//! twin died has nothing outstanding and waits for ever for an answer that
//! cannot come (issue 14: an `rping` hung 130 s until killed). The WAN
//! transport only reports paths down; a twin that simply vanishes never
//! restarts and never says CLOSE. Declaring it lost is what lets the site
//! fail every flow toward its application within a stated bound
//! (docs/semantics.md), as a direct RC connection would fail after its
//! retries.
//!
//! Sans-IO: it is told path events and the time, and answers with a
//! deadline and a verdict.

use std::time::Duration;

use crate::time::Time;

/// What the site knows of its twin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinState {
    /// No path has been up yet since `since` (start, or a new session
    /// after a CLOSE): never declared lost, nothing went through it.
    Connecting { since: Time },
    /// At least one path is up.
    Connected,
    /// Every path is down since `since`; not yet for `twin_timeout`.
    Unreachable { since: Time },
    /// Every path has been down since `since`, and at `declared` that had
    /// lasted `twin_timeout`: the twin's flows were failed, new requests
    /// are refused until a path comes back.
    Lost { since: Time, declared: Time },
}

impl TwinState {
    /// A word for status lines and metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            TwinState::Connecting { .. } => "connecting",
            TwinState::Connected => "connected",
            TwinState::Unreachable { .. } => "unreachable",
            TwinState::Lost { .. } => "lost",
        }
    }

    pub fn is_lost(&self) -> bool {
        matches!(self, TwinState::Lost { .. })
    }
}

/// Path liveness → twin liveness.
#[derive(Debug)]
pub struct TwinWatch {
    timeout: Duration,
    up: Vec<bool>,
    state: TwinState,
}

/// A change [`TwinWatch`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinChange {
    /// The timeout ran out: fail everything, refuse new requests.
    Lost { since: Time },
    /// A path is up again after the twin was declared lost.
    Back { lost_for: Duration },
}

impl TwinWatch {
    pub fn new(paths: usize, timeout: Duration, now: Time) -> TwinWatch {
        TwinWatch {
            timeout,
            up: vec![false; paths],
            state: TwinState::Connecting { since: now },
        }
    }

    pub fn state(&self) -> TwinState {
        self.state
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// When the twin will be declared lost if nothing changes. A twin that
    /// never answered is not: nothing went through it, so there is nothing
    /// to fail (and two gateways started minutes apart must not log a loss
    /// at start-up); new flows toward it stay tunnels that the requesters'
    /// own retries bound.
    pub fn deadline(&self) -> Option<Time> {
        match self.state {
            TwinState::Unreachable { since } => Some(since + self.timeout),
            TwinState::Connecting { .. } | TwinState::Connected | TwinState::Lost { .. } => None,
        }
    }

    /// A path's liveness changed.
    pub fn path(&mut self, now: Time, path: usize, up: bool) -> Option<TwinChange> {
        if let Some(p) = self.up.get_mut(path) {
            *p = up;
        }
        let any_up = self.up.iter().any(|&u| u);
        match (self.state, any_up) {
            (TwinState::Lost { declared, .. }, true) => {
                self.state = TwinState::Connected;
                Some(TwinChange::Back {
                    lost_for: now.since(declared),
                })
            }
            (_, true) => {
                self.state = TwinState::Connected;
                None
            }
            (TwinState::Connected, false) => {
                self.state = TwinState::Unreachable { since: now };
                None
            }
            (_, false) => None,
        }
    }

    /// A reload changed the path set to `paths` slots, of which `retired`
    /// are out of service (never up again), and maybe the timeout.
    pub fn reconfigure(&mut self, now: Time, paths: usize, retired: &[usize], timeout: Duration) {
        self.timeout = timeout;
        self.up.resize(paths, false);
        for &i in retired {
            if let Some(u) = self.up.get_mut(i) {
                *u = false;
            }
        }
        if matches!(self.state, TwinState::Connected) && !self.up.iter().any(|&u| u) {
            self.state = TwinState::Unreachable { since: now };
        }
    }

    /// Fires the timeout when due.
    pub fn poll(&mut self, now: Time) -> Option<TwinChange> {
        let due = self.deadline().is_some_and(|d| d <= now);
        if !due {
            return None;
        }
        let TwinState::Unreachable { since } = self.state else {
            return None;
        };
        self.state = TwinState::Lost {
            since,
            declared: now,
        };
        Some(TwinChange::Lost { since })
    }

    /// The twin closed to restart: its next incarnation has `twin_timeout`
    /// to answer, from now, before it is declared lost (a lost twin stays
    /// lost).
    pub fn await_return(&mut self, now: Time) {
        self.up.iter_mut().for_each(|u| *u = false);
        if !self.state.is_lost() {
            self.state = TwinState::Unreachable { since: now };
        }
    }

    /// The WAN session was rebuilt (after a loss or a CLOSE): every path
    /// starts again unproven. A lost twin stays lost until a path is up.
    pub fn restart_paths(&mut self, now: Time) {
        self.up.iter_mut().for_each(|u| *u = false);
        if !self.state.is_lost() {
            self.state = TwinState::Connecting { since: now };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Time {
        Time::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn lost_only_after_every_path_was_down_for_the_timeout() {
        let mut w = TwinWatch::new(2, Duration::from_secs(5), t(0));
        assert_eq!(w.path(t(10), 0, true), None);
        assert_eq!(w.path(t(20), 1, true), None);
        assert_eq!(w.state(), TwinState::Connected);
        // One path down: still connected, no deadline.
        w.path(t(1_000), 0, false);
        assert_eq!(w.deadline(), None);
        // Both down: unreachable, lost 5 s later, not before.
        w.path(t(2_000), 1, false);
        assert_eq!(w.state(), TwinState::Unreachable { since: t(2_000) });
        assert_eq!(w.deadline(), Some(t(7_000)));
        assert_eq!(w.poll(t(6_999)), None);
        assert_eq!(w.poll(t(7_000)), Some(TwinChange::Lost { since: t(2_000) }));
        assert!(w.state().is_lost());
        assert_eq!(w.poll(t(9_000)), None, "reported once");
        assert_eq!(
            w.path(t(9_000), 1, true),
            Some(TwinChange::Back {
                lost_for: Duration::from_secs(2)
            })
        );
        assert_eq!(w.state(), TwinState::Connected);
    }

    #[test]
    fn an_outage_shorter_than_the_timeout_changes_nothing() {
        let mut w = TwinWatch::new(1, Duration::from_secs(5), t(0));
        w.path(t(1), 0, true);
        w.path(t(100), 0, false);
        assert_eq!(w.poll(t(5_099)), None);
        assert_eq!(w.path(t(5_099), 0, true), None);
        assert_eq!(w.poll(t(20_000)), None);
        assert_eq!(w.state(), TwinState::Connected);
    }

    #[test]
    fn a_twin_that_never_answered_is_not_declared_lost() {
        let mut w = TwinWatch::new(1, Duration::from_secs(3), t(500));
        assert_eq!(w.deadline(), None);
        assert_eq!(w.poll(t(60_000)), None);
        assert_eq!(w.state(), TwinState::Connecting { since: t(500) });
        // Once it answered and went silent, it is.
        w.path(t(61_000), 0, true);
        w.path(t(62_000), 0, false);
        assert_eq!(
            w.poll(t(65_000)),
            Some(TwinChange::Lost { since: t(62_000) })
        );
        // Rebuilding the session keeps it lost until a path is up.
        w.restart_paths(t(65_000));
        assert!(w.state().is_lost());
        assert_eq!(w.deadline(), None);
    }
}
