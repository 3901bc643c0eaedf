//! Packet-level tests of the pacer (issue 33, `qp::engine::pacer`): while
//! packets stand in the deep buffer, the requesters that fill it get CNPs;
//! when the queue is gone they get none. (That a requester stopped at a
//! narrow window is never paced is the simulator's hardware seed 100819,
//! `tests/sim.rs`.)

use std::time::Duration;

use super::engine::QpEngine;
use super::tests::{drain, run_timers};
use super::tests_reserve::{requesters, Requester, WINDOW};
use super::tests_twin::twin_delivered;
use crate::time::Time;

const MS: Duration = Duration::from_millis(1);

/// CNPs each requester's half sent so far, in the order of `reqs`.
fn cnps(e: &QpEngine, reqs: &[Requester]) -> Vec<u64> {
    reqs.iter()
        .map(|r| {
            e.ingress_halves()
                .find(|h| h.key == r.key())
                .map_or(0, |h| h.stats.cnps_sent)
        })
        .collect()
}

/// Each requester sends a whole window at `t`, acknowledged at once (the
/// buffer is large).
fn send_windows(e: &mut QpEngine, t: Time, reqs: &mut [Requester]) {
    for r in reqs.iter_mut() {
        for _ in 0..WINDOW {
            let p = r.send();
            e.handle_dc(t, &p);
            r.take_acks(&drain(e));
        }
        assert_eq!(r.acked, r.next, "a window fits the buffer");
    }
}

/// The twin reports everything sent so far delivered at `t`.
fn deliver(e: &mut QpEngine, t: Time, reqs: &[Requester]) {
    for r in reqs {
        twin_delivered(e, t, r.key(), r.next - 1);
    }
    drain(e);
}

/// Two requesters, a buffer far larger than their windows (nothing is ever
/// withheld, so the reserve never asks for a CNP). Their first packets
/// cross in 1 ms, the path's own delay; then packets take 11 ms: 10 ms
/// stand in the buffer, the top of the pacer's ramp, and both requesters,
/// holding equal shares, get a CNP at each look once the queue has stood
/// for an interval. When packets cross in 1 ms again, the marks stop.
/// Without the pacer the gateway sent no CNP at all, however long the
/// queue (the 64 hardware QPs of issue 33 resent 1.4 to 58 packets per
/// packet carried).
#[test]
fn a_standing_queue_marks_the_requesters_that_fill_the_buffer_until_it_drains() {
    let (mut e, t0, mut reqs) = requesters::<2>(4096, WINDOW as usize, 1);
    send_windows(&mut e, t0, &mut reqs);
    let t1 = t0 + MS;
    deliver(&mut e, t1, &reqs);
    send_windows(&mut e, t1, &mut reqs);
    // These cross in 11 ms: a queue, which arms the pacer; its first look
    // closes the interval that still holds the 1 ms packets.
    let t2 = t1 + 11 * MS;
    deliver(&mut e, t2, &reqs);
    send_windows(&mut e, t2, &mut reqs);
    run_timers(&mut e, t2 + MS);
    assert_eq!(cnps(&e, &reqs), [0, 0], "no interval of 11 ms packets yet");
    let t3 = t2 + 11 * MS;
    deliver(&mut e, t3, &reqs);
    send_windows(&mut e, t3, &mut reqs);
    run_timers(&mut e, t3 + 3 * MS);
    let marked = cnps(&e, &reqs);
    assert!(
        marked.iter().all(|&c| c > 0),
        "both requesters hold the buffer while the queue stands: {marked:?}"
    );
    // The queue is gone: packets cross in the path's 1 ms again.
    let t4 = t3 + 4 * MS;
    deliver(&mut e, t4, &reqs);
    send_windows(&mut e, t4, &mut reqs);
    let t5 = t4 + MS;
    deliver(&mut e, t5, &reqs);
    send_windows(&mut e, t5, &mut reqs);
    run_timers(&mut e, t5 + 3 * MS);
    let before = cnps(&e, &reqs);
    let t6 = t5 + MS;
    deliver(&mut e, t6, &reqs);
    send_windows(&mut e, t6, &mut reqs);
    run_timers(&mut e, t6 + 10 * MS);
    assert_eq!(cnps(&e, &reqs), before, "no mark once the queue drained");
}
