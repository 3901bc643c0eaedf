//! The egress role, at the responder's site: how it re-injects what the twin
//! forwarded (in order, within a window that asks for an ACK at its edge and
//! keeps a slow responder's queue short), and how it reads the responder's
//! answers (ACKs absorbed, NAK-seq goes back, RNR waits, fatal NAKs reach
//! the twin, an atomic whose answer was lost is asked again). Its timers
//! (RTO, back-off, tail probe, give-up) are in `tests_egress_timeouts`.

use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::{EngineConfig, Output, QpEngine};
use super::tests::{
    cfg, drain, edge_engine, egress_engine_with, injected, key, request, response,
    sent_with_ack_req, InOrderResponder,
};
use super::tests_twin::twin_request;
use super::twin::{Carry, TwinMsg};
use crate::roce::{NakCode, Opcode, Psn, RocePacket, Syndrome};
use crate::time::Time;

#[test]
fn egress_injects_in_order_absorbs_acks_and_goes_back_on_nak() {
    let (mut e, t) = egress_engine_with(Opcode::RC_SEND_ONLY, 4, 8);
    let injected: Vec<u32> = drain(&mut e)
        .iter()
        .map(|o| match o {
            Output::Dc(v) => RocePacket::parse(v).unwrap().psn().value(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(injected, vec![10, 11, 12, 13]);
    // The responder lost 11: NAK-seq(11). 10 is delivered, 11.. resent.
    let nak = response(
        Opcode::RC_ACK,
        11,
        Syndrome::Nak(NakCode::PsnSequenceError),
        0,
    );
    e.handle_dc(t, &nak);
    let out = drain(&mut e);
    assert!(out.contains(&Output::Twin(TwinMsg::Delivered {
        half: key(),
        psn: Psn::new(10),
        msn: Some(0)
    })));
    let resent: Vec<u32> = out
        .iter()
        .filter_map(|o| match o {
            Output::Dc(v) => Some(RocePacket::parse(v).unwrap().psn().value()),
            _ => None,
        })
        .collect();
    assert_eq!(resent, vec![11, 12, 13]);
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::Twin(TwinMsg::Response { .. }))),
        "the NAK is handled here, not forwarded"
    );
    e.handle_dc(t, &response(Opcode::RC_ACK, 13, Syndrome::ACK_UNLIMITED, 0));
    let out = drain(&mut e);
    assert_eq!(
        out,
        vec![Output::Twin(TwinMsg::Delivered {
            half: key(),
            psn: Psn::new(13),
            msn: Some(0)
        })]
    );
    assert_eq!(e.occupancy().slots_used, 0);
}

/// rxe's responder acknowledges only packets with AckReq set: a re-injector
/// that stops at its window edge (or resends) must ask for an ACK there, or
/// nothing comes back until its own timeout.
#[test]
fn egress_asks_for_an_ack_at_its_window_edge() {
    let (mut e, t) = edge_engine();
    // 100 middle packets of one long WRITE: no AckReq from the requester
    // (its every-64th one falls elsewhere here).
    for psn in 1000..1100 {
        let op = if psn == 1000 {
            Opcode::RC_WRITE_FIRST
        } else {
            Opcode::RC_WRITE_MIDDLE
        };
        twin_request(&mut e, t, request(op, psn, false, 64, 0));
    }
    let sent = sent_with_ack_req(&drain(&mut e));
    let edge = sent.last().unwrap().0;
    assert!(
        edge < 1099,
        "the initial window stops before the end: {edge}"
    );
    // Packets arrive one by one, each the last we hold with no request
    // outstanding, but none ends a message: the requester must send the
    // rest, so none asks (asking there made the responder ACK every
    // packet). The one that fills the window asks.
    assert!(sent[..sent.len() - 1].iter().all(|&(_, a)| !a), "{sent:?}");
    assert!(sent.last().unwrap().1, "{sent:?}");
    // The responder ACKs that packet: the window moves on, and its new
    // edge asks again.
    e.handle_dc(
        t,
        &response(Opcode::RC_ACK, edge, Syndrome::ACK_UNLIMITED, 0),
    );
    let more = sent_with_ack_req(&drain(&mut e));
    assert!(!more.is_empty());
    let last = *more.last().unwrap();
    assert!(last.1 || last.0 == 1099, "{more:?}");
}

#[test]
fn egress_waits_out_rnr_and_retransmits_on_timeout() {
    let (mut e, t) = edge_engine();
    twin_request(&mut e, t, request(Opcode::RC_SEND_ONLY, 10, true, 8, 0));
    assert_eq!(drain(&mut e).len(), 1);
    // RNR NAK with timer 14 = 1.28 ms.
    e.handle_dc(
        t,
        &response(Opcode::RC_ACK, 10, Syndrome::RnrNak { timer: 14 }, 0),
    );
    assert!(drain(&mut e).is_empty(), "waits");
    let wake = e.poll_timeout().unwrap();
    assert_eq!(wake, t + Duration::from_micros(1280));
    e.handle_timeout(wake);
    assert_eq!(drain(&mut e).len(), 1, "retried after the RNR timer");
    // No answer at all: the local timeout resends.
    let rto = e.poll_timeout().unwrap();
    e.handle_timeout(rto);
    assert_eq!(drain(&mut e).len(), 1);
    let eg = e.egress_halves().next().unwrap();
    assert_eq!(
        (eg.stats.rnr_naks, eg.stats.timeouts, eg.stats.retransmitted),
        (1, 1, 2)
    );
}

#[test]
fn egress_reports_a_fatal_nak_to_the_twin() {
    let (mut e, t) = edge_engine();
    twin_request(&mut e, t, request(Opcode::RC_WRITE_ONLY, 10, true, 8, 0));
    drain(&mut e);
    e.handle_dc(
        t,
        &response(
            Opcode::RC_ACK,
            10,
            Syndrome::Nak(NakCode::RemoteAccessError),
            0,
        ),
    );
    assert_eq!(
        drain(&mut e),
        vec![Output::Twin(TwinMsg::Error {
            half: key(),
            psn: Psn::new(10),
            code: NakCode::RemoteAccessError
        })]
    );
    assert_eq!(e.occupancy().slots_used, 0);
}

fn forwarded_responses(out: &[Output]) -> usize {
    out.iter()
        .filter(|o| matches!(o, Output::Twin(TwinMsg::Response { .. })))
        .count()
}

#[test]
fn egress_injects_a_read_spanning_more_psns_than_its_window() {
    // A 1 MiB READ guessed at 4096-byte MTU occupies 256 PSNs: more than the
    // injection window at the start (64) or after a timeout (16). It must
    // still go out at the head of the queue, or the QP hangs.
    let (mut e, t) = edge_engine();
    twin_request(
        &mut e,
        t,
        request(Opcode::RC_READ_REQUEST, 10, true, 0, 1 << 20),
    );
    assert_eq!(injected(&drain(&mut e)), vec![10]);
    let rto = e.poll_timeout().unwrap();
    e.handle_timeout(rto);
    assert_eq!(injected(&drain(&mut e)), vec![10], "resent after a timeout");
}

#[test]
fn egress_forwards_the_re_ack_of_a_resent_raw_request() {
    // Tunnel phase: the responder's ACK was forwarded once and then lost in
    // the requester's datacenter. The requester resends; the responder's
    // re-ACK of that duplicate must reach it too, or it retries forever.
    let mut e = QpEngine::new(cfg(AckPolicy::Off));
    let t = Time::from_micros(1);
    let raw = TwinMsg::Request {
        carry: Carry::Raw,
        packet: request(Opcode::RC_SEND_ONLY, 10, true, 8, 0).into(),
    };
    let ack = response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0);
    e.handle_twin(t, raw.clone());
    assert_eq!(injected(&drain(&mut e)), vec![10]);
    e.handle_dc(t, &ack);
    assert_eq!(forwarded_responses(&drain(&mut e)), 1);
    e.handle_twin(t, raw);
    assert_eq!(
        injected(&drain(&mut e)),
        vec![10],
        "the duplicate goes through"
    );
    e.handle_dc(t, &ack);
    assert_eq!(
        forwarded_responses(&drain(&mut e)),
        1,
        "and so does its re-ACK"
    );
}

#[test]
fn copies_of_an_unanswered_raw_read_are_injected_once_per_rto() {
    // A path was down: the requester re-issued its READ at every timeout,
    // and the copies cross the WAN together. The responder gets the first;
    // the others, within an RTO and before its answer began, would each
    // make it replay the whole answer (hw sweep seeds 100104, 100989).
    let mut e = QpEngine::new(cfg(AckPolicy::Off));
    let t = Time::from_micros(1);
    let read = |psn| TwinMsg::Request {
        carry: Carry::Raw,
        packet: request(Opcode::RC_READ_REQUEST, psn, true, 0, 8192).into(),
    };
    for _ in 0..5 {
        e.handle_twin(t, read(10));
        e.handle_twin(t, read(12));
    }
    assert_eq!(injected(&drain(&mut e)), vec![10, 12], "one copy of each");
    // Its answer began: a copy after that (the answer lost on the way to
    // the requester) is replayed.
    e.handle_dc(
        t,
        &response(
            Opcode::RC_READ_RESPONSE_FIRST,
            10,
            Syndrome::ACK_UNLIMITED,
            1024,
        ),
    );
    drain(&mut e);
    e.handle_twin(t, read(10));
    e.handle_twin(t, read(12));
    assert_eq!(
        injected(&drain(&mut e)),
        vec![10],
        "12's answer has not begun"
    );
    // The copy injected may have been lost: after an RTO the next goes.
    let later = t + Duration::from_secs(5);
    e.handle_twin(later, read(12));
    assert_eq!(injected(&drain(&mut e)), vec![12]);
    let dropped: u64 = e
        .egress_halves()
        .map(|r| r.stats.raw_read_copies_dropped)
        .sum();
    assert_eq!(dropped, 9);
}

#[test]
fn egress_resends_after_a_sequence_nak_that_trails_an_expired_rnr_wait() {
    // RNR NAK on 10; the wait expires and 10, 11 go again; then the NAK-seq
    // the responder sent behind its RNR NAK arrives late. Going back to 10
    // must resend (or arm a timer): nothing in flight means no timer.
    let (mut e, t) = edge_engine();
    for psn in 10..12 {
        twin_request(&mut e, t, request(Opcode::RC_SEND_ONLY, psn, true, 8, 0));
    }
    assert_eq!(injected(&drain(&mut e)), vec![10, 11]);
    e.handle_dc(
        t,
        &response(Opcode::RC_ACK, 10, Syndrome::RnrNak { timer: 1 }, 0),
    );
    let wake = e.poll_timeout().unwrap();
    e.handle_timeout(wake);
    assert_eq!(injected(&drain(&mut e)), vec![10, 11]);
    let nak = response(
        Opcode::RC_ACK,
        10,
        Syndrome::Nak(NakCode::PsnSequenceError),
        0,
    );
    e.handle_dc(wake, &nak);
    let mut sent = injected(&drain(&mut e));
    if sent.is_empty() {
        let rto = e.poll_timeout().expect("a timer while packets are held");
        e.handle_timeout(rto);
        sent = injected(&drain(&mut e));
    }
    assert_eq!(sent, vec![10, 11]);
}

#[test]
fn egress_asks_again_for_an_atomic_whose_response_was_lost() {
    // FetchAdd 10 and SEND 11 injected; the responder's atomic ACK is lost
    // on its way to us and its ACK of 11 arrives. That must not count 10 as
    // delivered (the requester still needs its result): resend from 10.
    let (mut e, t) = edge_engine();
    for (psn, op) in [(10, Opcode::RC_FETCH_ADD), (11, Opcode::RC_SEND_ONLY)] {
        twin_request(
            &mut e,
            t,
            request(op, psn, true, if psn == 11 { 8 } else { 0 }, 0),
        );
    }
    assert_eq!(injected(&drain(&mut e)), vec![10, 11]);
    e.handle_dc(t, &response(Opcode::RC_ACK, 11, Syndrome::ACK_UNLIMITED, 0));
    let out = drain(&mut e);
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::Twin(TwinMsg::Delivered { .. }))),
        "nothing delivered past the unanswered atomic: {out:?}"
    );
    assert_eq!(injected(&out), vec![10, 11], "asked again");
}

/// A software responder on a busy CPU (rxe under emulation drains a few
/// thousand packets per second) must not be fed a queue longer than the
/// retransmission timeout: packets it merely has not reached yet would time
/// out and be resent (rxe: `duplicate_request`). The window follows the
/// queue the RTT samples show.
#[test]
fn egress_keeps_a_slow_responders_queue_below_the_rto() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t0 = Time::from_micros(1);
    // 3072 packets of 64-packet WRITEs, all at the egress at once (a WAN
    // burst); the requester asks for an ACK at each message end.
    for psn in 0..3072u32 {
        let op = match psn % 64 {
            0 => Opcode::RC_WRITE_FIRST,
            63 => Opcode::RC_WRITE_LAST,
            _ => Opcode::RC_WRITE_MIDDLE,
        };
        twin_request(&mut e, t0, request(op, 1000 + psn, psn % 64 == 63, 64, 0));
    }
    // The responder: in order, one packet per 250 µs, ACKs what asks,
    // re-ACKs duplicates with the last PSN it executed (C9-105).
    let mut r = InOrderResponder::new(1000);
    let mut longest = 0;
    let step = Duration::from_micros(250);
    let mut now = t0;
    for _ in 0..40_000 {
        r.receive(&mut e);
        longest = longest.max(r.queue.len());
        r.execute_one(&mut e, now);
        now += step;
        if e.poll_timeout().is_some_and(|d| d <= now) {
            e.handle_timeout(now);
        }
        if r.expected == 1000 + 3072 && r.queue.is_empty() {
            break;
        }
    }
    let eg = e.egress_halves().next().unwrap();
    assert_eq!(
        r.expected,
        1000 + 3072,
        "everything executed: {:?}",
        eg.stats
    );
    assert_eq!(
        (r.duplicates, eg.stats.timeouts, eg.stats.retransmitted),
        (0, 0, 0),
        "{:?}",
        eg.stats
    );
    let rto_floor_in_packets = (EngineConfig::default().egress.min_rto.as_micros() / 250) as usize;
    assert!(
        longest < rto_floor_in_packets,
        "queue at the responder {longest} packets = {} ms",
        longest / 4
    );
    assert!(eg.stats.queue_cuts > 0);
}
