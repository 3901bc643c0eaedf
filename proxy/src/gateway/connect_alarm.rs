//! Why a shard has no session with its twin, said once it has had none for
//! a while.
//!
//! The alarm names the likely misconfiguration (another `gateway.shards`
//! or another WAN key at the twin, or a twin that is down). It must judge
//! a stretch without a session, not a moment: a session is briefly down
//! whenever every path is (a path cut, a scheduling stall of the host),
//! and a gateway that restarted keeps receiving, for a moment, packets
//! sealed for its old incarnation, which fail authentication. Judged at
//! the first moment without a session once the gateway had run for
//! [`CONNECT_ALARM`], and with the authentication failures since start,
//! a restarted far gateway whose path blinked once at the end of a run
//! said `ERROR … the twin's HELLOs fail authentication` although it had
//! been connected for 90 s (the lab's `--restart` case, 2026-11-29).

use std::time::{Duration, Instant};

/// How long a shard must have been without a session before it says why.
pub const CONNECT_ALARM: Duration = Duration::from_secs(5);

/// What the shard's WAN counters say, for [`ConnectWatch::check`].
#[derive(Clone, Copy, Debug, Default)]
pub struct WanSeen {
    pub connected: bool,
    /// Packets that failed authentication, since start (cumulative).
    pub auth_failures: u64,
    /// Anything ever came from the twin on any path.
    pub heard: bool,
}

/// Watches one shard's session; see the module documentation.
#[derive(Debug)]
pub struct ConnectWatch {
    shard: (usize, usize),
    /// When the shard was last seen without a session, and its
    /// authentication failures then.
    down_since: Option<(Instant, u64)>,
    alarm: String,
}

impl ConnectWatch {
    /// A shard `index` of `count` that started at `start` (without a
    /// session: the first stretch is counted from there).
    pub fn new(index: usize, count: usize, start: Instant) -> ConnectWatch {
        ConnectWatch {
            shard: (index, count),
            down_since: Some((start, 0)),
            alarm: String::new(),
        }
    }

    /// The alarm in force (empty while connected, or not yet judged).
    pub fn alarm(&self) -> &str {
        &self.alarm
    }

    /// Looks at the session at `now`; returns the alarm when it is raised
    /// (once per stretch without a session).
    pub fn check(&mut self, now: Instant, seen: WanSeen) -> Option<&str> {
        if seen.connected {
            self.down_since = None;
            self.alarm.clear();
            return None;
        }
        let (since, failures_then) = *self.down_since.get_or_insert((now, seen.auth_failures));
        if !self.alarm.is_empty() || now.saturating_duration_since(since) < CONNECT_ALARM {
            return None;
        }
        let (i, n) = self.shard;
        let secs = CONNECT_ALARM.as_secs();
        self.alarm = if seen.auth_failures > failures_then {
            format!(
                "shard {i}/{n}: no session with the twin for {secs} s, and the twin's HELLOs fail \
                 authentication: the twin runs a different gateway.shards (this side: {n}) or \
                 another wan key"
            )
        } else if !seen.heard && n > 1 {
            format!(
                "shard {i}/{n}: no session with the twin for {secs} s, and nothing ever came from \
                 its ports + {i}: the twin runs fewer shards than gateway.shards = {n} here, is \
                 down, or a firewall blocks those ports"
            )
        } else {
            return None;
        };
        Some(&self.alarm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAILING: WanSeen = WanSeen {
        connected: false,
        auth_failures: 3,
        heard: true,
    };

    #[test]
    fn a_twin_whose_hellos_fail_from_the_start_is_named_after_the_alarm_time() {
        let t0 = Instant::now();
        let mut w = ConnectWatch::new(0, 1, t0);
        assert!(w.check(t0 + Duration::from_secs(1), FAILING).is_none());
        let said = w.check(t0 + CONNECT_ALARM, FAILING).map(str::to_owned);
        assert!(said.is_some_and(|s| s.contains("fail authentication")));
        // Said once per stretch.
        assert!(w.check(t0 + CONNECT_ALARM * 2, FAILING).is_none());
        assert!(!w.alarm().is_empty());
    }

    /// The lab's restarted gateway: connected for a long time, with
    /// authentication failures from its old incarnation's packets, then
    /// one moment without a session. Before, that moment raised the alarm.
    #[test]
    fn a_moment_without_a_session_after_a_long_one_raises_nothing() {
        let t0 = Instant::now();
        let mut w = ConnectWatch::new(0, 1, t0);
        let up = WanSeen {
            connected: true,
            auth_failures: 40,
            heard: true,
        };
        assert!(w.check(t0 + Duration::from_secs(1), up).is_none());
        let t1 = t0 + Duration::from_secs(90);
        let blink = WanSeen {
            connected: false,
            ..up
        };
        assert!(w.check(t1, blink).is_none(), "a blink is not a stretch");
        assert!(w.check(t1 + Duration::from_secs(1), up).is_none());
        assert!(w.alarm().is_empty());
        // A long stretch with no new failure: nothing names the key.
        let t2 = t1 + Duration::from_secs(10);
        assert!(w.check(t2, blink).is_none());
        assert!(w.check(t2 + CONNECT_ALARM, blink).is_none());
        // New failures during a long stretch do.
        let failing = WanSeen {
            auth_failures: 41,
            ..blink
        };
        assert!(w.check(t2 + CONNECT_ALARM * 2, failing).is_some());
    }

    #[test]
    fn a_shard_that_never_heard_its_twin_says_so() {
        let t0 = Instant::now();
        let mut w = ConnectWatch::new(1, 2, t0);
        let silent = WanSeen::default();
        let said = w.check(t0 + CONNECT_ALARM, silent).map(str::to_owned);
        assert!(said.is_some_and(|s| s.contains("nothing ever came")));
    }
}
