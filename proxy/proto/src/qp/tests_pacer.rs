//! Packet-level tests of the pacer (issue 33, `qp::engine::pacer`): while
//! requesters wait for room in turn and packets stand in the deep buffer,
//! the requesters are paced; when the queue is gone they are not; a lone
//! requester is never paced. (That a requester stopped at a narrow window
//! is not paced either is the simulator's hardware seed 100819,
//! `tests/sim.rs`.)

use std::collections::VecDeque;
use std::time::Duration;

use super::engine::QpEngine;
use super::tests::{drain, run_timers};
use super::tests_reserve::{requesters, send_while_allowed, Requester};
use super::tests_twin::twin_delivered;
use crate::time::Time;

const MS: Duration = Duration::from_millis(1);

/// A WAN in front of the engine: what the requesters sent at each round
/// reaches the responder `transit` later, and the twin reports it
/// delivered then.
struct Wan {
    /// (when sent, each requester's last PSN sent by then).
    sent: VecDeque<(Time, Vec<u32>)>,
}

impl Wan {
    /// One round at `t`: the packets sent `transit` ago or earlier are
    /// delivered, then the requesters send what their windows and the
    /// pseudo-ACKs allow.
    fn round(&mut self, e: &mut QpEngine, t: Time, reqs: &mut [Requester], transit: Duration) {
        run_timers_into(e, t, reqs);
        while let Some((at, last)) = self.sent.front() {
            if *at + transit > t {
                break;
            }
            for (r, &psn) in reqs.iter().zip(last) {
                if psn >= r.acked0() {
                    twin_delivered(e, t, r.key(), psn);
                }
            }
            self.sent.pop_front();
        }
        let out = drain(e);
        for r in reqs.iter_mut() {
            r.take_acks(&out);
        }
        send_while_allowed(e, t, reqs);
        self.sent
            .push_back((t, reqs.iter().map(|r| r.next - 1).collect()));
    }

    /// Rounds every 0.5 ms from `from` to `to`.
    fn run(
        &mut self,
        e: &mut QpEngine,
        from: Time,
        to: Time,
        reqs: &mut [Requester],
        transit: Duration,
    ) {
        let mut t = from;
        while t < to {
            self.round(e, t, reqs, transit);
            t += MS / 2;
        }
    }
}

/// The engine's timers up to `t`, the requesters taking their ACKs.
fn run_timers_into(e: &mut QpEngine, t: Time, reqs: &mut [Requester]) {
    let out = run_timers(e, t);
    for r in reqs.iter_mut() {
        r.take_acks(&out);
    }
}

fn paced(e: &QpEngine) -> usize {
    e.ingress_halves().filter(|h| h.is_paced()).count()
}

/// `N` requesters of 16-packet windows, learned, behind a buffer of
/// `slots`.
fn setup<const N: usize>(slots: usize) -> (QpEngine, Time, [Requester; N], Wan) {
    let (e, t, reqs) = requesters::<N>(slots, 16, 1);
    let wan = Wan {
        sent: VecDeque::new(),
    };
    (e, t, reqs, wan)
}

/// Six requesters wait for room in turn behind 128 slots (room for their
/// windows, with the reserve for them, only a few at a time). While packets cross in the
/// path's own 1 ms, nobody is paced; when they take 11 ms (10 ms standing
/// in the buffer, the top of the pacer's ramp), the requesters are paced;
/// when they cross in 1 ms again, pacing ends. Without the pacer nothing
/// slowed hardware requesters down while they waited their turn, and 64
/// of them resent 1.4 to 58 packets per packet carried (docs/benchmarks.md
/// §2).
#[test]
fn requesters_waiting_in_turn_are_paced_while_a_queue_stands_and_not_after() {
    let (mut e, t0, mut reqs, mut wan) = setup::<6>(128);
    let t1 = t0 + 20 * MS;
    wan.run(&mut e, t0, t1, &mut reqs, MS);
    assert_eq!(paced(&e), 0, "no queue stands: nobody is paced");
    let t2 = t1 + 60 * MS;
    let mut most = 0;
    let mut t = t1;
    while t < t2 {
        wan.round(&mut e, t, &mut reqs, 11 * MS);
        most = most.max(paced(&e));
        t += MS / 2;
    }
    assert!(
        most >= 2,
        "a queue stood while they waited: {most} paced at most"
    );
    let t3 = t2 + 60 * MS;
    wan.run(&mut e, t2, t3, &mut reqs, MS);
    assert_eq!(paced(&e), 0, "the queue drained: pacing ended");
}

/// A lone requester behind 64 slots (withheld at its quota) and the same
/// 10 ms queue is never paced: room comes back to it as its own packets are delivered,
/// and a CNP would only slow it (one hardware QP over 1 Gb/s fell to 0.67
/// of the link when the pacer marked it). It still gets the CNPs of a
/// requester eating into the reserve for its window (`acking`).
#[test]
fn a_lone_requester_is_never_paced() {
    let (mut e, t0, mut reqs, mut wan) = setup::<1>(64);
    wan.run(&mut e, t0, t0 + 20 * MS, &mut reqs, MS);
    let mut t = t0 + 20 * MS;
    while t < t0 + 80 * MS {
        wan.round(&mut e, t, &mut reqs, 11 * MS);
        assert_eq!(paced(&e), 0);
        t += MS / 2;
    }
}
