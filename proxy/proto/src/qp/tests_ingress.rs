//! The ingress role, at the requester's site: what it pseudo-ACKs and when
//! (coalescing, never past an outstanding READ, MSNs), how it answers
//! duplicates and gaps, how backpressure withholds ACKs instead of dropping,
//! and what it refuses (forged or malformed packets, a failed half). Split
//! from the egress tests because a reader chasing a wrong pseudo-ACK should
//! not have to wade through re-injection.

use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::{Output, QpEngine};
use super::ingress::{HOLD_ACK_FOR, HOLD_ACK_INTERVAL};
use super::tests::{
    acks, assert_acks, assert_nak, cfg, drain, drained_acks, edge_ingress, forwarded,
    ingress_engine, key, raw_forwarded, request, response, run_timers, REQUESTER, RQ_QPN,
};
use super::tests_twin::{twin_delivered, twin_error, twin_response};
use crate::roce::builders::{self, ReplyTo};
use crate::roce::{NakCode, Opcode, Psn, RocePacket, Syndrome};
use crate::time::Time;

#[test]
fn write_is_pseudo_acked_with_responder_fields_and_msn() {
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_WRITE_FIRST, 100, false, 64, 0));
    e.handle_dc(t, &request(Opcode::RC_WRITE_MIDDLE, 101, false, 64, 0));
    e.handle_dc(t, &request(Opcode::RC_WRITE_LAST, 102, true, 64, 0));
    let out = drain(&mut e);
    assert_eq!(forwarded(&out), vec![100, 101, 102]);
    // MSN: the learning ACK said 0 at PSN 99, +1 for this WRITE.
    assert_eq!(acks(&out), vec![(102, Syndrome::ACK_UNLIMITED, 1)]);
    assert_eq!(e.occupancy().slots_used, 3);
}

#[test]
fn coalesces_to_every_n_packets_then_the_timer() {
    let (mut e, t) = edge_ingress();
    for psn in 100..106 {
        e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, psn, false, 8, 0));
    }
    assert_eq!(
        drained_acks(&mut e),
        vec![(103, Syndrome::ACK_UNLIMITED, 4)],
        "one ACK per 4 packets"
    );
    let deadline = e.poll_timeout().expect("timer for the remaining two");
    assert_eq!(deadline, t + Duration::from_micros(20));
    e.handle_timeout(deadline);
    assert_eq!(
        drained_acks(&mut e),
        vec![(105, Syndrome::ACK_UNLIMITED, 6)]
    );
}

#[test]
fn never_acks_at_or_past_an_outstanding_read() {
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 100, true, 64, 0));
    // READ of 2 x 4096: two PSNs (101, 102) once the MTU is known; unknown
    // here, so the gateway must not assume fewer than it can prove.
    e.handle_dc(t, &request(Opcode::RC_READ_REQUEST, 101, true, 0, 8192));
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 103, true, 64, 0));
    let out = drain(&mut e);
    assert_eq!(forwarded(&out), vec![100, 101, 103], "103 widened the READ");
    assert_eq!(acks(&out), vec![(100, Syndrome::ACK_UNLIMITED, 1)]);
    // The READ's responses come back; the last one answers it.
    let first = response(
        Opcode::RC_READ_RESPONSE_FIRST,
        101,
        Syndrome::ACK_UNLIMITED,
        4096,
    );
    let last = response(
        Opcode::RC_READ_RESPONSE_LAST,
        102,
        Syndrome::ACK_UNLIMITED,
        4096,
    );
    twin_response(&mut e, t, first.clone());
    assert_eq!(drain(&mut e), vec![Output::Dc(first.into())]);
    twin_response(&mut e, t, last.clone());
    let out = drain(&mut e);
    assert_eq!(out[0], Output::Dc(last.into()));
    assert_eq!(acks(&out[1..]), vec![(103, Syndrome::ACK_UNLIMITED, 3)]);
}

#[test]
fn duplicates_are_re_acked_and_a_gap_gets_one_nak() {
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 100, true, 8, 0));
    drain(&mut e);
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 100, true, 8, 0));
    let out = drain(&mut e);
    assert_eq!(
        forwarded(&out),
        Vec::<u32>::new(),
        "duplicate not forwarded"
    );
    assert_eq!(acks(&out), vec![(100, Syndrome::ACK_UNLIMITED, 1)]);
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 102, true, 8, 0));
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 103, true, 8, 0));
    let out = drain(&mut e);
    assert_eq!(
        acks(&out),
        vec![(101, Syndrome::Nak(NakCode::PsnSequenceError), 1)],
        "one NAK with the expected PSN, then silence"
    );
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 101, true, 8, 0));
    assert_acks(&mut e, &[(101, Syndrome::ACK_UNLIMITED, 2)]);
}

/// A gap after a READ still waiting for its response: the NAK would
/// acknowledge the READ (an implied NAK at the requester, which then
/// resends the READ and all after it), so it waits for the response and
/// follows it (issue 33: over-subscribed mixed runs, seeds 360, 472, 792).
#[test]
fn a_gap_nak_waits_for_the_response_of_an_earlier_read() {
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 100, true, 64, 0));
    e.handle_dc(t, &request(Opcode::RC_READ_REQUEST, 101, true, 0, 64));
    // 102 lost inside the DC (or dropped at the buffer's hard limit).
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 103, true, 64, 0));
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 104, true, 64, 0));
    let out = drain(&mut e);
    assert_eq!(forwarded(&out), vec![100, 101]);
    assert_eq!(
        acks(&out),
        vec![(100, Syndrome::ACK_UNLIMITED, 1)],
        "no NAK past the READ while its response is on its way"
    );
    let answer = response(
        Opcode::RC_READ_RESPONSE_ONLY,
        101,
        Syndrome::ACK_UNLIMITED,
        64,
    );
    twin_response(&mut e, t, answer.clone());
    let out = drain(&mut e);
    assert_eq!(out[0], Output::Dc(answer.into()), "the response first");
    assert_eq!(
        acks(&out[1..]),
        vec![(102, Syndrome::Nak(NakCode::PsnSequenceError), 2)],
        "then the NAK at the gap"
    );
    // The requester resends from the gap: accepted, acknowledged, and no
    // second NAK.
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 102, true, 64, 0));
    assert_acks(&mut e, &[(102, Syndrome::ACK_UNLIMITED, 3)]);
}

/// The requester resent the gap before the READ's response came (its
/// timer): the held NAK is no longer due and never goes out.
#[test]
fn a_held_gap_nak_is_dropped_once_the_gap_fills() {
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_READ_REQUEST, 100, true, 0, 64));
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 102, true, 64, 0));
    assert_eq!(acks(&drain(&mut e)), vec![]);
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 101, true, 64, 0));
    drain(&mut e);
    let answer = response(
        Opcode::RC_READ_RESPONSE_ONLY,
        100,
        Syndrome::ACK_UNLIMITED,
        64,
    );
    twin_response(&mut e, t, answer);
    let out = drain(&mut e);
    assert!(
        acks(&out)
            .iter()
            .all(|&(_, s, _)| !matches!(s, Syndrome::Nak(_))),
        "{:?}",
        acks(&out)
    );
    assert_eq!(acks(&out), vec![(101, Syndrome::ACK_UNLIMITED, 2)]);
}

#[test]
fn delivered_frees_the_buffer_and_errors_reach_the_requester() {
    let (mut e, t) = edge_ingress();
    for psn in 100..104 {
        e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, psn, true, 8, 0));
    }
    drain(&mut e);
    assert_eq!(e.occupancy().slots_used, 4);
    twin_delivered(&mut e, t, key(), 101);
    assert_eq!(e.occupancy().slots_used, 2);
    twin_error(&mut e, t, key(), 102, NakCode::RemoteAccessError);
    let out = drain(&mut e);
    assert_eq!(
        acks(&out),
        vec![(104, Syndrome::Nak(NakCode::RemoteAccessError), 4)],
        "NAK at the requester's next outstanding PSN"
    );
    assert_eq!(e.occupancy().slots_used, 0);
    // Anything new is refused the same way: never a silent success.
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 104, true, 8, 0));
    let out = drain(&mut e);
    assert_eq!(
        acks(&out),
        vec![(104, Syndrome::Nak(NakCode::RemoteAccessError), 4)]
    );
    assert!(forwarded(&out).is_empty());
}

#[test]
fn strict_waits_for_the_real_ack_of_each_message_end() {
    let mut e = ingress_engine(AckPolicy::Strict);
    let t = Time::from_micros(1);
    e.handle_dc(t, &request(Opcode::RC_WRITE_FIRST, 100, false, 64, 0));
    e.handle_dc(t, &request(Opcode::RC_WRITE_MIDDLE, 101, false, 64, 0));
    e.handle_dc(t, &request(Opcode::RC_WRITE_LAST, 102, true, 64, 0));
    let out = drain(&mut e);
    assert!(acks(&out).is_empty(), "coalescing: nothing due yet");
    let d = e.poll_timeout().unwrap();
    e.handle_timeout(d);
    assert_eq!(
        drained_acks(&mut e),
        vec![(101, Syndrome::ACK_UNLIMITED, 0)],
        "everything but the last packet"
    );
    twin_delivered(&mut e, d, key(), 102);
    assert_eq!(
        drained_acks(&mut e),
        vec![(102, Syndrome::ACK_UNLIMITED, 1)]
    );
}

/// An accelerated half in a 12-slot buffer with an 8-slot ACK reserve,
/// after SENDs 100..105 at `t`: the first four are acknowledged, then the
/// reserve is reached and ACKs are withheld.
fn nearly_full_engine() -> (QpEngine, Time) {
    let mut c = cfg(AckPolicy::Edge);
    c.buffer_slots = 12;
    c.ack.ack_reserve_slots = 8;
    let mut e = QpEngine::new(c);
    e.handle_dc(Time::ZERO, &request(Opcode::RC_SEND_ONLY, 99, true, 8, 0));
    twin_response(
        &mut e,
        Time::ZERO,
        response(Opcode::RC_ACK, 99, Syndrome::ACK_UNLIMITED, 0),
    );
    drain(&mut e);
    let t = Time::from_micros(1);
    for psn in 100..106 {
        e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, psn, true, 8, 0));
    }
    (e, t)
}

#[test]
fn backpressure_withholds_acks_instead_of_dropping() {
    let (mut e, t) = nearly_full_engine();
    let out = drain(&mut e);
    let a = acks(&out);
    // 12 slots, 8 reserved: ACKs stop once 5 are held.
    assert_eq!(a.last().unwrap().0, 103);
    assert_eq!(forwarded(&out).len(), 6, "all accepted and forwarded");
    twin_delivered(&mut e, t, key(), 105);
    assert_acks(&mut e, &[(105, Syndrome::ACK_UNLIMITED, 6)]);
}

/// A request dropped at the buffer's hard limit: the NAK that makes the
/// requester resend waits until the buffer has room for it and follows
/// the ACK of everything before the gap. Sent at once (before), the
/// resend met the same full buffer, was dropped again, and the requester
/// then heard nothing until its ACK timeout (issue 33, sweep seed 60).
#[test]
fn a_request_dropped_at_the_hard_limit_is_naked_once_there_is_room() {
    let (mut e, t) = nearly_full_engine();
    drain(&mut e);
    // The requester's window goes on past the last ACK (103): 106..111
    // fill the 12 slots, 112 is dropped, 113 is out of order.
    for psn in 106..114 {
        e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, psn, true, 8, 0));
    }
    let out = drain(&mut e);
    assert_eq!(forwarded(&out), (106..112).collect::<Vec<u32>>());
    assert_eq!(acks(&out), vec![], "no NAK into a full buffer");
    assert_eq!(e.occupancy().slots_used, 12);
    // The twin delivers everything: room for the ACK, then the NAK.
    twin_delivered(&mut e, t, key(), 111);
    assert_acks(
        &mut e,
        &[
            (111, Syndrome::ACK_UNLIMITED, 12),
            (112, Syndrome::Nak(NakCode::PsnSequenceError), 12),
        ],
    );
    // The resend is taken, and nothing more is owed.
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 112, true, 8, 0));
    assert_acks(&mut e, &[(112, Syndrome::ACK_UNLIMITED, 13)]);
}

#[test]
fn malformed_and_forged_packets_are_counted_and_dropped() {
    let mut e = ingress_engine(AckPolicy::Edge);
    let mut bad = request(Opcode::RC_SEND_ONLY, 100, true, 8, 0);
    let n = bad.len();
    bad[n - 1] ^= 0xff; // ICRC
    e.handle_dc(Time::ZERO, &bad);
    e.handle_dc(Time::ZERO, &bad[..30]);
    assert!(drain(&mut e).is_empty());
    assert_eq!((e.stats.dc_bad_icrc, e.stats.dc_malformed), (1, 1));
    // A forged pseudo-ACK builder check: ReplyTo reverses addresses.
    let p = RocePacket::parse(&request(Opcode::RC_SEND_ONLY, 1, true, 0, 0))
        .map(|p| ReplyTo::answering(&p, RQ_QPN))
        .unwrap();
    let ack = builders::ack(&p, Psn::new(1), 0).to_vec(&[]).unwrap();
    assert_eq!(
        RocePacket::parse_verified(&ack).unwrap().ip.dst(),
        REQUESTER
    );
}

#[test]
fn a_gap_before_the_switch_naks_the_first_psn_the_responder_has_not_acked() {
    // Raw 99..=101 went through the tunnel; the responder has acknowledged
    // only 99 when the requester's 103 arrives (102 lost in the DC). A NAK
    // at 102 would also acknowledge 100 and 101, which may never arrive
    // (rxe completes everything before a NAK's PSN): NAK 100 instead.
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::ZERO;
    for psn in 99..=101 {
        e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, psn, true, 8, 0));
    }
    assert_eq!(drain(&mut e).len(), 3, "tunnelled");
    // The real ACK of 99 carries the responder's MSN 5.
    let ack = builders::ack(
        &ReplyTo::answering(
            &RocePacket::parse(&request(Opcode::RC_SEND_ONLY, 99, true, 8, 0)).unwrap(),
            RQ_QPN,
        ),
        Psn::new(99),
        5,
    )
    .to_vec(&[])
    .unwrap();
    twin_response(&mut e, t, ack);
    drain(&mut e);
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 103, true, 8, 0));
    assert_nak(&mut e, 100, NakCode::PsnSequenceError, 5);
}

/// Backpressure withholds pseudo-ACKs; if that lasts longer than the
/// requester's ACK timeout (67 ms with perftest) it would resend its whole
/// window. The last pseudo-ACK is repeated meanwhile: it acknowledges
/// nothing new (the buffer is full), but rxe restarts its retransmission
/// timer on every response it processes.
#[test]
fn withheld_acks_repeat_the_last_one_until_the_buffer_drains() {
    let (mut e, t) = nearly_full_engine();
    assert_eq!(drained_acks(&mut e).last().unwrap().0, 103, "then withheld");
    // 10 intervals of a full buffer: the ACK of 103 again, every interval.
    let until = t + HOLD_ACK_INTERVAL * 10;
    let repeated = acks(&run_timers(&mut e, until));
    assert_eq!(repeated.len(), 10, "{repeated:?}");
    assert!(repeated
        .iter()
        .all(|&a| a == (103, Syndrome::ACK_UNLIMITED, 4)));
    // The twin delivers: the real pseudo-ACK moves on, the repeats stop.
    twin_delivered(&mut e, until, key(), 105);
    assert_acks(&mut e, &[(105, Syndrome::ACK_UNLIMITED, 6)]);
    assert!(acks(&run_timers(&mut e, until + Duration::from_millis(100))).is_empty());
    // A longer hold (every WAN path down) is the requester's to judge: the
    // repeats stop after HOLD_ACK_FOR.
    for psn in 106..113 {
        e.handle_dc(until, &request(Opcode::RC_SEND_ONLY, psn, true, 8, 0));
    }
    assert_eq!(
        drained_acks(&mut e).last().unwrap().0,
        109,
        "withheld again"
    );
    let held = acks(&run_timers(&mut e, until + Duration::from_secs(10)));
    let expected = (HOLD_ACK_FOR.as_micros() / HOLD_ACK_INTERVAL.as_micros()) as usize;
    assert!(
        (expected - 1..=expected).contains(&held.len()),
        "{} repeats",
        held.len()
    );
}

/// Over-subscribed sweep seed 1436 (READs over a 0.5 Gb/s path cut for
/// 150 ms): the requester's timer resent from the middle of one READ's
/// answer and then the READ after it. The first resend went to the
/// responder, whose replay makes the twin drop every answer of the QP
/// past it still queued there (`site::replays`); the second was dropped
/// here as "answered on its way". That READ then had no answer at all,
/// the next READ (sent fresh) did, and the requester took it as an
/// implied NAK. Once a round of resends replays one READ, the READs
/// after it in that round are replayed too; a new round starts afresh.
#[test]
fn a_round_of_resends_that_replays_a_read_replays_the_reads_after_it() {
    let mut e = ingress_engine(AckPolicy::Edge);
    let t = Time::from_micros(1);
    // READs of 2 x 4096 at 100 (100-101) and 102 (102-103), forwarded.
    let read = |psn| request(Opcode::RC_READ_REQUEST, psn, true, 0, 8192);
    e.handle_dc(t, &read(100));
    e.handle_dc(t, &read(102));
    assert_eq!(forwarded(&drain(&mut e)), vec![100, 102]);
    // The first response of READ 100 comes; the rest waits on the WAN.
    let first = response(
        Opcode::RC_READ_RESPONSE_FIRST,
        100,
        Syndrome::ACK_UNLIMITED,
        4096,
    );
    twin_response(&mut e, t, first);
    drain(&mut e);
    // The requester's timer: it re-asks READ 100 from 101, then READ 102.
    let later = t + Duration::from_millis(67);
    e.handle_dc(later, &read(101));
    e.handle_dc(later, &read(102));
    assert_eq!(
        raw_forwarded(&drain(&mut e)),
        vec![101, 102],
        "the READ after a replayed one is replayed too: its queued answer dies at the twin"
    );
    // A new round that starts at READ 102, its answer on its way: dropped.
    e.handle_dc(later + Duration::from_millis(67), &read(102));
    assert_eq!(raw_forwarded(&drain(&mut e)), Vec::<u32>::new());
}
