//! Packet-level tests of the egress's recovery after a timeout episode,
//! found by `soya-sim sweep` with burst loss on the data-center links
//! (issue 17's soak stalls: the gateway's `rx_kernel_drops` are bursts).

use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::QpEngine;
use super::tests::{cfg, drain, injected, request, response, run_timers};
use super::tests_twin::twin_request;
use crate::roce::{Opcode, Syndrome};
use crate::time::Time;

/// Sweep seed 420 (SEND, DC links losing packets in bursts): the
/// responder had every packet the egress injected, but a burst ate its
/// ACKs. The egress timed out and resent the oldest packet for seconds;
/// when one of the responder's re-ACKs (of that duplicate) finally came
/// through, it covered the whole pre-timeout flight, and the egress took
/// it as the round trip of the last packet of that flight, sent once,
/// seconds before: srtt jumped from microseconds to seconds. From then on
/// every loss waited a multi-second RTO (the ceiling does not cap an RTO
/// below srtt), and the flow crawled (three PSNs per 3.5 s) until the
/// give-up time failed it. Karn's rule: no RTT sample from a packet sent
/// before a timeout's resend and acknowledged after it.
#[test]
fn egress_takes_no_rtt_sample_across_a_timeout() {
    let c = cfg(AckPolicy::Edge);
    let (floor, max_rto) = (c.egress.min_rto, c.egress.max_rto);
    let mut e = QpEngine::new(c);
    // A responder that answers in 10 µs: the RTO sits at its floor.
    let t0 = answered_in_10us(&mut e);
    // 30..=39 injected; the responder gets them all, its ACKs are lost.
    let t1 = inject_30_to_39(&mut e, t0);
    // Two seconds of timeouts, each resending the oldest, re-ACKs lost.
    let t2 = t1 + Duration::from_secs(2);
    let resent = injected(&run_timers(&mut e, t2));
    assert!(
        resent.len() >= 5 && resent.iter().all(|&p| p == 30),
        "timeouts resend the oldest packet: {resent:?}"
    );
    // A re-ACK gets through: the responder had everything up to 39.
    let ack = response(Opcode::RC_ACK, 39, Syndrome::ACK_UNLIMITED, 0);
    e.handle_dc(t2, &ack);
    drain(&mut e);
    // The responder is as fast as ever. The answer came for packets sent
    // before the timeouts, so it tells nothing of the responder's pace:
    // the backed-off RTO stays (at most its ceiling), not the episode's
    // length...
    let t3 = t2 + Duration::from_millis(1);
    twin_request(&mut e, t3, request(Opcode::RC_SEND_ONLY, 40, true, 64, 0));
    assert_eq!(injected(&drain(&mut e)), vec![40]);
    let rto = e.poll_timeout().expect("timed").since(t3);
    assert!(
        rto <= max_rto,
        "RTO after the episode {rto:?} (srtt must not include its 2 s)"
    );
    // ...until a packet sent after them is answered: the floor again.
    let ack = response(Opcode::RC_ACK, 40, Syndrome::ACK_UNLIMITED, 0);
    e.handle_dc(t3 + Duration::from_micros(10), &ack);
    drain(&mut e);
    let t4 = t3 + Duration::from_millis(1);
    twin_request(&mut e, t4, request(Opcode::RC_SEND_ONLY, 41, true, 64, 0));
    assert_eq!(injected(&drain(&mut e)), vec![41]);
    let rto = e.poll_timeout().expect("timed").since(t4);
    assert_eq!(rto, floor, "RTO once a valid sample came");
}

/// Sweep seed 261 (bidirectional SEND, DC links losing packets in bursts):
/// a burst took the tail of the egress's flight. The timeout resent the
/// oldest packet, its ACK let two more out, and their ACK, past the resent
/// head, was taken for proof that the responder had the rest of the flight
/// ("slow, not lossy"): the rest stayed "in flight" until the next timeout,
/// three PSNs per RTO, until the give-up time failed the flow. Only an
/// answer to a packet sent before the timeout, and not resent since, shows
/// that the responder had more than what was resent.
#[test]
fn egress_resends_a_lost_flight_after_a_timeout_without_waiting_for_more() {
    let c = cfg(AckPolicy::Edge);
    let mut e = QpEngine::new(c);
    let t0 = answered_in_10us(&mut e);
    // 30..=39 injected; a burst takes them all.
    inject_30_to_39(&mut e, t0);
    // The timeout resends the oldest; the responder executes and ACKs it.
    let t2 = e.poll_timeout().expect("timed");
    let resent = injected(&run_timers(&mut e, t2));
    assert_eq!(resent, vec![30], "the timeout resends the oldest");
    let t = t2 + Duration::from_micros(10);
    e.handle_dc(t, &response(Opcode::RC_ACK, 30, Syndrome::ACK_UNLIMITED, 0));
    let next = injected(&drain(&mut e));
    assert!(
        !next.is_empty() && next[0] == 31,
        "window reopens: {next:?}"
    );
    // The responder executes what came and ACKs the last of it: a PSN
    // past the resent head, but of packets resent after the timeout.
    let high = *next.last().unwrap();
    let t = t + Duration::from_micros(10);
    e.handle_dc(
        t,
        &response(Opcode::RC_ACK, high, Syndrome::ACK_UNLIMITED, 0),
    );
    let more = injected(&drain(&mut e));
    assert!(
        more.first() == Some(&(high + 1)),
        "the rest of the lost flight goes out on that ACK, not an RTO later: {more:?}"
    );
}

/// PSNs 10..=29 (SEND, one packet each, 100 µs apart), each answered in
/// 10 µs by the responder: the RTO sits at its floor. Returns the start.
fn answered_in_10us(e: &mut QpEngine) -> Time {
    let t0 = Time::from_micros(1);
    for i in 0..20u32 {
        let at = t0 + Duration::from_micros(u64::from(i) * 100);
        twin_request(e, at, request(Opcode::RC_SEND_ONLY, 10 + i, true, 64, 0));
        drain(e);
        let ack = response(Opcode::RC_ACK, 10 + i, Syndrome::ACK_UNLIMITED, 0);
        e.handle_dc(at + Duration::from_micros(10), &ack);
        drain(e);
    }
    t0
}

/// PSNs 30..=39 from the twin 3 ms after `t0`, all injected at once.
fn inject_30_to_39(e: &mut QpEngine, t0: Time) -> Time {
    let t1 = t0 + Duration::from_millis(3);
    for psn in 30..40 {
        twin_request(e, t1, request(Opcode::RC_SEND_ONLY, psn, true, 64, 0));
    }
    assert_eq!(injected(&drain(e)), (30..40).collect::<Vec<_>>());
    t1
}
