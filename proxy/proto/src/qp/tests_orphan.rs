//! A restarted gateway and the requester it orphaned, which retransmits
//! (`qp::orphan`, "An orphaned requester that is retransmitting"): the
//! fatal NAK lands at its oldest outstanding PSN and nowhere else, and a QP
//! this incarnation learned is never hit.

use soya_config::AckPolicy;

use super::engine::{Output, QpEngine};
use super::half::HalfKey;
use super::tests::{acks, cfg, drain, request, response, REQUESTER, RESPONDER, RQ_QPN, RS_QPN};
use super::tests_twin::twin_response;
use super::twin::{Carry, TwinMsg};
use crate::roce::{NakCode, Opcode, RocePacket, Syndrome};
use crate::time::Time;

/// The orphan message the twin (at RESPONDER's site) sends the restarted
/// gateway (at REQUESTER's site) about REQUESTER's QP: it saw only
/// REQUESTER's WRITEs, so it knows the QP's number but not its ePSN.
fn orphaned() -> TwinMsg {
    TwinMsg::Orphaned {
        qp: HalfKey {
            requester: RESPONDER.into(),
            responder: REQUESTER.into(),
            responder_qpn: RQ_QPN,
        },
        far_qpn: Some(RS_QPN),
        hint: None,
        candidates: Vec::new(),
    }
}

/// PSNs of the requests carried to the twin (either carry).
fn carried(out: &[Output]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::Twin(TwinMsg::Request { packet, .. }) => {
                Some(RocePacket::parse(packet).unwrap().psn().value())
            }
            _ => None,
        })
        .collect()
}

/// One go-back-N retry of the requester: WRITEs `psns`, as rxe resends its
/// window from `comp.psn`.
fn burst(n: &mut QpEngine, t: Time, psns: impl IntoIterator<Item = u32>) -> Vec<Output> {
    for psn in psns {
        n.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, psn, false, 64, 0));
    }
    drain(n)
}

fn fatal_naks(out: &[Output]) -> Vec<u32> {
    acks(out)
        .into_iter()
        .filter(|(_, s, _)| *s == Syndrome::Nak(NakCode::RemoteOperationalError))
        .map(|(psn, _, _)| psn)
        .collect()
}

#[test]
fn an_orphaned_requester_gets_a_fatal_nak_at_its_oldest_outstanding_psn() {
    // REQUESTER's QP had 100..=107 outstanding when its gateway died
    // (everything before was pseudo-ACKed). The new incarnation comes up
    // in the middle of a retry burst (105.. first), then the twin's orphan
    // message arrives.
    let mut n = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    let out = burst(&mut n, t, 105..108);
    assert_eq!(carried(&out), vec![105, 106, 107], "a tunnel, as before");
    n.handle_twin(t, orphaned());
    let probes = drain(&mut n);
    assert_eq!(
        n.probes_pending(),
        1,
        "its responder role probed: {probes:?}"
    );
    assert_eq!(n.stats.orphan_requesters_watched, 1);

    // The next retry starts at the oldest outstanding PSN. 105 was seen
    // first, and seen again now: but 100 is lower, so 105 is not the start.
    let out = burst(&mut n, t, 100..108);
    assert!(fatal_naks(&out).is_empty(), "100 seen once: {out:?}");
    assert_eq!(carried(&out), (100..108).collect::<Vec<_>>());

    // The retry after: 100 again, the lowest and seen twice: the NAK,
    // exactly there, to REQUESTER's QP (checked by `acks`), and nothing
    // more is carried to the twin.
    let out = burst(&mut n, t, 100..108);
    assert_eq!(fatal_naks(&out), vec![100], "{out:?}");
    assert_eq!(acks(&out).len(), 1, "no other answer: {out:?}");
    assert!(carried(&out).is_empty(), "{out:?}");
    assert_eq!(n.stats.orphan_requesters_failed, 1);
    // The probe is moot; a late answer of its QP is absorbed.
    assert_eq!(n.probes_pending(), 0);
    assert_eq!(n.stats.orphan_probes_superseded, 1);

    // A lost NAK costs one retry: the next one is answered again.
    let out = burst(&mut n, t, 100..108);
    assert_eq!(fatal_naks(&out), vec![100]);
    assert!(carried(&out).is_empty());
    assert_eq!(
        (
            n.stats.orphan_requester_naks,
            n.stats.orphan_requesters_failed
        ),
        (2, 1)
    );
}

#[test]
fn a_qp_answered_through_the_new_incarnation_is_not_an_orphan() {
    // The same numbers, but the far side answers (a QP this incarnation
    // serves, or an orphan whose far responder still takes its requests
    // in order): never NAKed, however often it retransmits.
    let mut n = QpEngine::new(cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    n.handle_twin(t, orphaned());
    drain(&mut n);
    let out = burst(&mut n, t, 200..204);
    assert_eq!(carried(&out), vec![200, 201, 202, 203]);
    // A stale answer (a re-ACK of a duplicate, before 200) proves nothing.
    twin_response(
        &mut n,
        t,
        response(Opcode::RC_ACK, 150, Syndrome::ACK_UNLIMITED, 0),
    );
    drain(&mut n);
    assert_eq!(n.orphan_requesters_pending(), 1);
    // An answer at 201: the requester makes progress through us.
    twin_response(
        &mut n,
        t,
        response(Opcode::RC_ACK, 201, Syndrome::ACK_UNLIMITED, 0),
    );
    drain(&mut n);
    assert_eq!(n.orphan_requesters_pending(), 0);
    for _ in 0..3 {
        let out = burst(&mut n, t, 202..204);
        assert!(fatal_naks(&out).is_empty(), "{out:?}");
    }
    assert_eq!(n.stats.orphan_requester_naks, 0);
}

#[test]
fn an_orphan_record_lapses_and_a_connection_set_up_now_is_not_watched() {
    let t = Time::from_micros(1);
    // Lapsed: a retry long after the message is carried as any request.
    let mut n = QpEngine::new(cfg(AckPolicy::Edge));
    n.handle_twin(t, orphaned());
    drain(&mut n);
    burst(&mut n, t, [300]);
    let later = t + super::orphan::ORPHAN_REQUESTER_TTL;
    // By then the twin has it (until it does, a tunnel drops resends of a
    // request still in the gateway's hands: `ingress::tunnel`).
    n.raw_left(&super::tests::key(), crate::roce::Psn::new(300));
    let out = burst(&mut n, later, [300, 300]);
    assert!(fatal_naks(&out).is_empty(), "{out:?}");
    assert_eq!(carried(&out), vec![300, 300]);
    assert!(out.iter().all(|o| !matches!(
        o,
        Output::Twin(TwinMsg::Request {
            carry: Carry::Reliable,
            ..
        })
    )));

    // A half this incarnation learned (RDMA-CM, or answered) before the
    // message: not watched at all.
    let mut n = super::tests::ingress_engine(AckPolicy::Edge);
    n.handle_twin(t, orphaned());
    drain(&mut n);
    assert_eq!(n.stats.orphan_requesters_watched, 0);
}
