//! The tunnel phase (`qp::ingress::tunnel`): a QP the gateway has not
//! learned yet (no RDMA-CM seen) is forwarded as is. Its requester's
//! resends of WRITE/SEND packets whose originals are still in this
//! gateway's hands are dropped; a round a NAK asked for, anything that
//! left, was answered, never came, or a READ goes through.

use soya_config::AckPolicy;

use super::engine::{Output, QpEngine};
use super::tests::{cfg, drain, forwarded, key, request, RQ_QPN};
use super::tests_twin::twin_response;
use super::twin::{Carry, TwinMsg};
use crate::roce::builders::{self, ReplyTo};
use crate::roce::{NakCode, Opcode, Psn, RocePacket};
use crate::time::Time;

/// The PSNs forwarded as is (the tunnel's `Carry::Raw`).
fn raw(out: &[Output]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::Twin(TwinMsg::Request {
                carry: Carry::Raw,
                packet,
            }) => Some(RocePacket::parse(packet).unwrap().psn().value()),
            _ => None,
        })
        .collect()
}

fn write(psn: u32) -> Vec<u8> {
    request(Opcode::RC_WRITE_ONLY, psn, true, 64, 0)
}

/// The requester sends (or resends) `psns`; what the tunnel forwarded.
fn send(e: &mut QpEngine, t: Time, psns: impl IntoIterator<Item = u32>) -> Vec<u32> {
    for psn in psns {
        e.handle_dc(t, &write(psn));
    }
    raw(&drain(e))
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
    let to = ReplyTo::answering(&RocePacket::parse(&write(102)).unwrap(), RQ_QPN);
    let rnr = builders::rnr_nak(&to, Psn::new(102), 14, 2)
        .to_vec(&[])
        .unwrap();
    twin_response(&mut e, t, rnr);
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
    assert_eq!(raw(&drain(&mut e)), vec![100, 101]);
    // Unanswered READs resent in the tunnel phase still reach the
    // responder, which replays them (the twin's `site::replays` decides
    // what of their answers is dead).
    for psn in [100, 101] {
        e.handle_dc(t, &read(psn));
    }
    assert_eq!(raw(&drain(&mut e)), vec![100, 101]);
    assert_eq!(dropped(&e), 0);
}
