//! The tunnel phase (`qp::ingress::tunnel`): a QP the gateway has not
//! learned yet (no RDMA-CM seen) is forwarded as is. Its requester's
//! resends of WRITE/SEND packets whose originals are still in this
//! gateway's hands are dropped; a round a NAK asked for, anything that
//! left, was answered, never came, or a READ goes through.

use soya_config::AckPolicy;

use super::engine::QpEngine;
use super::tests::{cfg, drain, forwarded, key, raw_forwarded, request, RQ_QPN};
use super::tests_twin::twin_response;
use crate::roce::builders::{self, ReplyTo};
use crate::roce::{NakCode, Opcode, Psn, RocePacket};
use crate::time::Time;

fn write(psn: u32) -> Vec<u8> {
    request(Opcode::RC_WRITE_ONLY, psn, true, 64, 0)
}

/// The requester sends (or resends) `psns`; what the tunnel forwarded.
fn send(e: &mut QpEngine, t: Time, psns: impl IntoIterator<Item = u32>) -> Vec<u32> {
    for psn in psns {
        e.handle_dc(t, &write(psn));
    }
    raw_forwarded(&drain(e))
}

/// The responder's answer (`nak`: `None` for an ACK) reaching the tunnel.
fn answer(e: &mut QpEngine, t: Time, psn: u32, nak: Option<NakCode>, msn: u32) {
    let to = ReplyTo::answering(&RocePacket::parse(&write(psn)).unwrap(), RQ_QPN);
    let p = match nak {
        None => builders::ack(&to, Psn::new(psn), msn),
        Some(code) => builders::nak(&to, Psn::new(psn), code, msn),
    };
    twin_response(e, t, p.to_vec(&[]).unwrap());
    drain(e);
}

/// The responder's RNR NAK at `psn` reaching the tunnel.
fn rnr(e: &mut QpEngine, t: Time, psn: u32, msn: u32) {
    let to = ReplyTo::answering(&RocePacket::parse(&write(psn)).unwrap(), RQ_QPN);
    let p = builders::rnr_nak(&to, Psn::new(psn), 14, msn);
    twin_response(e, t, p.to_vec(&[]).unwrap());
}

fn dropped(e: &QpEngine) -> u64 {
    e.ingress_halves()
        .map(|h| h.stats.raw_resends_dropped)
        .sum()
}

#[test]
fn resends_are_dropped_while_their_originals_are_still_here() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    assert_eq!(send(&mut e, t, 100..108), (100..108).collect::<Vec<_>>());
    // The requester's timer, before anything crossed the WAN: every
    // original is still in this gateway's hands, ahead of any resend.
    assert_eq!(send(&mut e, t, 100..108), Vec::<u32>::new());
    assert_eq!(dropped(&e), 8);
    // The twin acknowledged up to 103: those may have been lost past it,
    // and the responder may wait for them in silence. Resends go on.
    e.raw_left(&key(), Psn::new(103));
    assert_eq!(send(&mut e, t, 100..108), vec![100, 101, 102, 103]);
    // A resend of something answered goes too: the requester lost the ACK
    // in its data centre, and only the responder's repeat ACK tells it.
    answer(&mut e, t, 105, None, 6);
    assert_eq!(send(&mut e, t, 104..108), vec![104, 105]);
    assert_eq!(dropped(&e), 14);
    // New requests go as ever (the answer taught the gateway the QP: they
    // are held and forwarded reliably now, no longer as is).
    for psn in 108..110 {
        e.handle_dc(t, &write(psn));
    }
    assert_eq!(forwarded(&drain(&mut e)), vec![108, 109]);
}

#[test]
fn a_request_that_never_reached_the_gateway_is_let_through() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    // 104 and 105 were lost between the requester and the gateway.
    assert_eq!(
        send(&mut e, t, [100, 101, 102, 103, 106, 107]),
        vec![100, 101, 102, 103, 106, 107]
    );
    assert_eq!(send(&mut e, t, 100..108), vec![104, 105]);
}

#[test]
fn a_naked_round_goes_through_whole_then_resends_are_dropped_again() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    send(&mut e, t, 100..108);
    // The responder NAKs 104 (lost past the twin) and drops what follows,
    // the originals still on their way included: every resend from 104
    // must reach it.
    answer(&mut e, t, 104, Some(NakCode::PsnSequenceError), 4);
    assert_eq!(send(&mut e, t, 104..108), vec![104, 105, 106, 107]);
    // That round reached the newest PSN forwarded: it is over.
    assert_eq!(send(&mut e, t, 104..108), Vec::<u32>::new());
    assert_eq!(dropped(&e), 4);
}

#[test]
fn an_rnr_round_goes_through_whole() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    send(&mut e, t, 100..104);
    // The responder had no receive posted for 102: RNR, and it dropped
    // what came after. The requester waits its RNR timer, then resends.
    rnr(&mut e, t, 102, 2);
    drain(&mut e);
    assert_eq!(send(&mut e, t, 102..104), vec![102, 103]);
    assert_eq!(dropped(&e), 0);
}

#[test]
fn read_resends_are_left_to_the_replay_rules() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    let read = |psn| request(Opcode::RC_READ_REQUEST, psn, true, 0, 64);
    for psn in [100, 101] {
        e.handle_dc(t, &read(psn));
    }
    assert_eq!(raw_forwarded(&drain(&mut e)), vec![100, 101]);
    // Unanswered READs resent in the tunnel phase still reach the
    // responder, which replays them (the twin's `site::replays` decides
    // what of their answers is dead).
    for psn in [100, 101] {
        e.handle_dc(t, &read(psn));
    }
    assert_eq!(raw_forwarded(&drain(&mut e)), vec![100, 101]);
    assert_eq!(dropped(&e), 0);
}

/// A message's packets that crossed while its AckReq packet (the last) is
/// still here: the responder answers them once that one crosses, so their
/// resends would only be duplicates too. Once a NAK was seen the shortcut
/// is off: a responder that NAKed stays silent until the NAKed PSN comes.
#[test]
fn packets_whose_answer_is_still_due_are_not_resent() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    let msg = [
        (100, Opcode::RC_WRITE_FIRST, false),
        (101, Opcode::RC_WRITE_MIDDLE, false),
        (102, Opcode::RC_WRITE_LAST, true),
        (103, Opcode::RC_WRITE_FIRST, false),
        (104, Opcode::RC_WRITE_LAST, true),
    ];
    let resend = |e: &mut QpEngine, psns: std::ops::Range<u32>| {
        for &(psn, op, ask) in &msg {
            if psns.contains(&psn) {
                e.handle_dc(t, &request(op, psn, ask, 64, 4096));
            }
        }
        raw_forwarded(&drain(e))
    };
    assert_eq!(resend(&mut e, 100..105), vec![100, 101, 102, 103, 104]);
    // 100 and 101 crossed; 102, which asks for the answer, did not.
    e.raw_left(&key(), Psn::new(101));
    assert_eq!(resend(&mut e, 100..105), Vec::<u32>::new());
    // 102 crossed: the answer is the responder's to give, or to withhold
    // (lost past the twin): resends of the first message go on. 103's is
    // still due (104 is here).
    e.raw_left(&key(), Psn::new(103));
    assert_eq!(resend(&mut e, 100..105), vec![100, 101, 102]);
    // A NAK (RNR at 104): from now on only the originals still here are
    // dropped, whatever answer is due; 104 and after are the NAK's round.
    rnr(&mut e, t, 104, 1);
    drain(&mut e);
    assert_eq!(resend(&mut e, 100..105), vec![100, 101, 102, 103, 104]);
}

/// A tunnel for good (policy `off`): after a NAK, an answer that seems due
/// is never waited for again, for messages sent after it too.
#[test]
fn after_a_nak_a_tunnel_never_waits_for_an_answer_due() {
    let mut e = QpEngine::new(cfg(AckPolicy::Off));
    let t = Time::from_micros(1);
    let first = |psn| request(Opcode::RC_WRITE_FIRST, psn, false, 64, 4096);
    let last = |psn| request(Opcode::RC_WRITE_LAST, psn, true, 64, 4096);
    e.handle_dc(t, &first(100));
    e.handle_dc(t, &last(101));
    rnr(&mut e, t, 100, 0);
    assert_eq!(raw_forwarded(&drain(&mut e)), vec![100, 101]);
    // The requester's round after its RNR wait, then a new message.
    for p in [first(100), last(101), first(102), last(103)] {
        e.handle_dc(t, &p);
    }
    assert_eq!(raw_forwarded(&drain(&mut e)), vec![100, 101, 102, 103]);
    // 102 crossed, 103 (its AckReq) not yet: resent, 102 goes anyway.
    e.raw_left(&key(), Psn::new(102));
    e.handle_dc(t, &first(102));
    e.handle_dc(t, &last(103));
    assert_eq!(raw_forwarded(&drain(&mut e)), vec![102]);
}
