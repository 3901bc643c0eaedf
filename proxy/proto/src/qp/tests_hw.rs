//! Packet-level tests of rules the hardware endpoint model of `soya-sim`
//! (`--endpoint hw`: adaptive 2/4/8/16 ms retransmission timer, whole
//! send-queue windows) revealed (issue 18).

use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::{Output, QpEngine};
use super::tests::{cfg, drain, errors, request, response, run_timers};
use super::tests_twin::{twin_delivered, twin_request, twin_response};
use super::twin::{Carry, TwinMsg};
use crate::roce::{Opcode, Syndrome};
use crate::time::Time;

/// Sweep seed 4259 (3,000 km, `edge`, WRITE, 3 % loss in the requester's
/// datacenter, hardware endpoints): the requester's 2 ms timer resends its
/// whole window through the tunnel long before the first real ACK (RTT
/// 29 ms), and the DC loss keeps the tunnel phase going for seconds, the
/// responder acknowledging it a little at a time. The packets pseudo-ACKed
/// after the switch wait behind it at the egress. The egress counted only
/// ACKs of *its* packets as the responder's progress: the moment the tunnel
/// phase was all acknowledged (its longer raw wait no longer applied), the
/// responder looked stalled since the first pseudo-ACKed packet arrived,
/// seconds earlier, and the egress gave up on a healthy flow at its next
/// timer. Every move of the responder's acknowledged PSN is progress.
#[test]
fn egress_counts_the_responders_progress_through_the_tunnel_phase() {
    let mut c = cfg(AckPolicy::Edge);
    c.egress.give_up = Duration::from_secs(1);
    let give_up = c.egress.give_up;
    let mut e = QpEngine::new(c);
    let t0 = Time::from_micros(1);
    // The tunnel phase: 10..=19 forwarded raw.
    for psn in 10..20 {
        e.handle_twin(
            t0,
            TwinMsg::Request {
                carry: Carry::Raw,
                packet: request(Opcode::RC_SEND_ONLY, psn, true, 64, 0).into(),
            },
        );
    }
    // Then 20 and 21, pseudo-ACKed at the twin, held here.
    for psn in [20, 21] {
        twin_request(&mut e, t0, request(Opcode::RC_SEND_ONLY, psn, true, 64, 0));
    }
    drain(&mut e);
    // The responder works through the tunnel phase slowly (the requester
    // refills its DC losses), one PSN every 0.4 s: 4 s in all, four times
    // the give-up time, never a give-up time without progress.
    let mut now = t0;
    for psn in 10..20 {
        now += Duration::from_millis(400);
        let out = run_timers(&mut e, now);
        assert_eq!(
            errors(&out),
            0,
            "gave up at {now:?}, before the raw ACK of {psn}"
        );
        e.handle_dc(
            now,
            &response(Opcode::RC_ACK, psn, Syndrome::ACK_UNLIMITED, 0),
        );
        assert_eq!(errors(&drain(&mut e)), 0, "gave up on the raw ACK of {psn}");
    }
    // The tunnel phase is all acknowledged: 20 and 21 are next. The
    // responder last moved just now; the egress must wait a give-up time.
    let out = run_timers(&mut e, now + (give_up - Duration::from_millis(1)));
    assert_eq!(
        errors(&out),
        0,
        "gave up less than {give_up:?} after the responder's last progress"
    );
    // The rule still holds: a give-up time without progress fails the flow.
    let out = run_timers(&mut e, now + give_up + c.egress.max_rto);
    assert_eq!(errors(&out), 1, "a responder that stopped is given up on");
    assert_eq!(e.occupancy().slots_used, 0);
}

/// Sweep seed 3408 (10 km, `strict`, READ of 183 KiB at 1 KiB MTU, 3 %
/// loss in one datacenter, 1 % on the WAN, hardware endpoints): the
/// requesters' 2 ms timers and their go-back-N after each response lost in
/// the DC had the responder replay READs faster than the 10 Gb/s WAN
/// carried them; the twin's queue for the response flow reached its bound
/// and dropped messages, among them the last response of one READ (and the
/// `Delivered` after it). The ingress dropped every resend of that READ
/// ("its answer is on its way"), forever: the requester retried for the
/// rest of the run and one buffer slot stayed held. A `Delivered` past a
/// READ travels behind its responses (one WAN flow): once it has come and
/// the last response has not, the answer was lost on the way, and a resend
/// must reach the responder, which replays it.
#[test]
fn a_resent_read_whose_answer_was_lost_on_the_way_reaches_the_responder() {
    use super::tests::{ingress_engine, key};
    use crate::roce::RocePacket;
    let mut e = ingress_engine(AckPolicy::Strict);
    let t = Time::from_micros(1);
    // READ of 2 x 4096 at 100 (PSNs 100 and 101), forwarded to the twin.
    let read = request(Opcode::RC_READ_REQUEST, 100, true, 0, 8192);
    e.handle_dc(t, &read);
    drain(&mut e);
    // Its first response arrives; the last one is lost on the way, then
    // the far side reports the READ delivered (it saw the last response).
    let first = response(
        Opcode::RC_READ_RESPONSE_FIRST,
        100,
        Syndrome::ACK_UNLIMITED,
        4096,
    );
    twin_response(&mut e, t, first);
    twin_delivered(&mut e, t, key(), 101);
    drain(&mut e);
    // The requester never got the last response: it asks again.
    let later = t + Duration::from_millis(2);
    e.handle_dc(later, &read);
    let out = drain(&mut e);
    let resent: Vec<(Carry, u32)> = out
        .iter()
        .filter_map(|o| match o {
            Output::Twin(TwinMsg::Request { carry, packet }) => {
                Some((*carry, RocePacket::parse(packet).unwrap().psn().value()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        resent,
        vec![(Carry::Raw, 100)],
        "the resent READ goes to the responder to be replayed"
    );
    // Its replayed answer completes the READ.
    let last = response(
        Opcode::RC_READ_RESPONSE_LAST,
        101,
        Syndrome::ACK_UNLIMITED,
        4096,
    );
    twin_response(&mut e, later, last.clone());
    assert_eq!(drain(&mut e), vec![Output::Dc(last.into())]);
    assert_eq!(e.occupancy().slots_used, 0);
}
