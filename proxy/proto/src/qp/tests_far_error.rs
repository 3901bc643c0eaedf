//! The far side refuses a pseudo-ACKed request for good ([`TwinMsg::Error`],
//! [`QpEngine::on_far_error`]), packet by packet: the requester must end in
//! the error state even when it has nothing outstanding (issue 14, gap b).
//! Addressing as in `tests.rs`: REQUESTER's QP RQ_QPN at this site,
//! RESPONDER's QP RS_QPN at the twin's.

use soya_config::AckPolicy;

use super::engine::{Output, QpEngine};
use super::tests::{
    acks, assert_acks, assert_nak, drain, drained_acks, edge_ingress, key, request, REQUESTER,
    RESPONDER, RQ_QPN, RS_QPN,
};
use super::tests_twin::{twin_delivered, twin_delivered_msn, twin_error, twin_request};
use super::tests_twin_lost::{
    ack_to, cm_engine, dc_requests, dreqs, far_send, local_acks_far, poison_answer_absorbed,
    poison_at, request_to,
};
use super::twin::{Carry, TwinMsg};
use super::HalfKey;
use crate::roce::{NakCode, Opcode, Psn, RocePacket, Syndrome};
use crate::time::Time;

/// The half of the far host's requests toward the local QP.
fn toward_local() -> HalfKey {
    HalfKey {
        requester: RESPONDER.into(),
        responder: REQUESTER.into(),
        responder_qpn: RQ_QPN,
    }
}

/// The `TwinMsg::Error`s the engine sent to the twin: (half, PSN, code).
fn twin_errors(out: &[Output]) -> Vec<(HalfKey, u32, NakCode)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Twin(TwinMsg::Error { half, psn, code }) => Some((*half, psn.value(), *code)),
            _ => None,
        })
        .collect()
}

/// DREQs carried to the twin as datagrams: (source, destination, local
/// comm ID, remote comm ID, remote QPN).
fn twin_dreqs(out: &[Output]) -> Vec<(std::net::IpAddr, std::net::IpAddr, u32, u32, u32)> {
    let as_dc: Vec<Output> = out
        .iter()
        .filter_map(|o| match o {
            Output::Twin(TwinMsg::Datagram { packet }) => Some(Output::Dc(packet.clone())),
            _ => None,
        })
        .collect();
    dreqs(&as_dc)
}

/// REQUESTER's QP wrote through us (pseudo-ACKed at 100: nothing
/// outstanding) after it had received and acknowledged a SEND of the far
/// host's (PSN 7). Returns the engine, the WRITE not yet delivered.
fn pseudo_acked_with_reverse_traffic() -> QpEngine {
    let (mut e, t) = edge_ingress();
    far_send(&mut e, t, 7, 16);
    assert_eq!(drain(&mut e).len(), 1, "injected");
    local_acks_far(&mut e, t, 7);
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 100, true, 64, 0));
    let out = drain(&mut e);
    assert_eq!(acks(&out), vec![(100, Syndrome::ACK_UNLIMITED, 1)]);
    assert_eq!(e.occupancy().slots_used, 1, "the WRITE, not yet delivered");
    e
}

#[test]
fn a_far_error_poisons_a_pseudo_acked_requester_with_nothing_outstanding() {
    // The far responder refused the WRITE (remote access error) after we
    // had pseudo-ACKed it. A NAK at 101 finds no work request (rxe drops
    // it): before this fix the requester's QP stayed in RTS, its
    // application sure that 64 bytes had landed.
    let mut e = pseudo_acked_with_reverse_traffic();
    let t = Time::from_micros(2);
    twin_error(&mut e, t, key(), 100, NakCode::RemoteAccessError);
    let out = drain(&mut e);
    assert_eq!(
        dc_requests(&out),
        vec![poison_at(8)],
        "the poison at the QP's exact ePSN, from the far QP, no payload"
    );
    let Some(Output::Dc(v)) = out.iter().find(
        |o| matches!(o, Output::Dc(v) if RocePacket::parse(v).is_ok_and(|p| p.info.is_request())),
    ) else {
        panic!("no poison packet")
    };
    let p = RocePacket::parse_verified(v).unwrap();
    assert_eq!(
        p.udp.src_port,
        crate::roce::ip::rxe_udp_sport(RS_QPN, RQ_QPN),
        "as the far QP's own packets"
    );
    // The far host's requests toward that QP can no longer land: its half
    // is failed and the twin told, once.
    assert_eq!(
        twin_errors(&out),
        vec![(toward_local(), 8, NakCode::RemoteOperationalError)]
    );
    assert_eq!(e.occupancy().slots_used, 0);
    assert_eq!(
        (
            e.stats.far_errors,
            e.stats.far_error_qps_poisoned,
            e.stats.far_error_poison_packets,
            e.stats.far_error_reverse_failed,
        ),
        (1, 1, 1, 1)
    );
    // Its answer (NAK Invalid Request to the far QP) is absorbed: the far
    // requester did not send that packet.
    poison_answer_absorbed(&mut e, t, 8);
    assert_eq!(e.stats.poison_answers_absorbed, 1);
    // A second error for the same half poisons nothing more.
    twin_error(&mut e, t, key(), 100, NakCode::RemoteAccessError);
    let out = drain(&mut e);
    assert!(dc_requests(&out).is_empty());
    assert!(twin_errors(&out).is_empty());
    // Later requests of the requester are refused with the far error.
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 101, true, 64, 0));
    assert_nak(&mut e, 101, NakCode::RemoteAccessError, 1);
}

#[test]
fn the_poison_covers_every_possible_epsn_while_far_requests_are_in_flight() {
    // The far host's SENDs 7..=9 are injected; the local QP acknowledged
    // only 7, so its ePSN is 8, 9 or 10: one poison at each, and nothing
    // injected behind them (the reverse half is failed first).
    let (mut e, t) = edge_ingress();
    for psn in 7..10 {
        far_send(&mut e, t, psn, 16);
    }
    drain(&mut e);
    local_acks_far(&mut e, t, 7);
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 100, true, 8, 0));
    drain(&mut e);
    twin_error(&mut e, t, key(), 100, NakCode::RemoteOperationalError);
    let out = drain(&mut e);
    let v: Vec<u32> = dc_requests(&out).iter().map(|r| r.4).collect();
    assert_eq!(v, vec![8, 9, 10]);
    assert_eq!(twin_errors(&out).len(), 1);
    // The twin's next request toward the QP is not injected.
    far_send(&mut e, t, 10, 16);
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.occupancy().slots_used, 0);
}

#[test]
fn a_requester_with_requests_outstanding_gets_the_nak_and_no_poison() {
    let (mut e, t) = edge_ingress();
    // A READ: never pseudo-ACKed, outstanding until its response.
    e.handle_dc(t, &request(Opcode::RC_READ_REQUEST, 100, true, 0, 4096));
    assert!(drained_acks(&mut e).is_empty());
    twin_error(&mut e, t, key(), 100, NakCode::RemoteAccessError);
    let out = drain(&mut e);
    assert_eq!(
        acks(&out),
        vec![(100, Syndrome::Nak(NakCode::RemoteAccessError), 0)]
    );
    assert!(dc_requests(&out).is_empty(), "the NAK lands: no poison");
    assert_eq!(e.stats.far_error_qps_poisoned, 0);
}

#[test]
fn a_requester_told_nothing_false_is_left_as_a_direct_connection_would_leave_it() {
    // Everything REQUESTER wrote was delivered (and acknowledged); the far
    // side then fails its half because it poisoned the far QP (the reverse
    // of `a_far_error_poisons...`). A direct connection would not move
    // this QP to error either: its next request fails.
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 100, true, 64, 0));
    drain(&mut e);
    twin_delivered(&mut e, t, key(), 100);
    drain(&mut e);
    twin_error(&mut e, t, key(), 101, NakCode::RemoteOperationalError);
    let out = drain(&mut e);
    assert!(dc_requests(&out).is_empty(), "no poison: {out:?}");
    assert!(twin_errors(&out).is_empty(), "no cascade back");
    assert_eq!(e.stats.far_error_qps_poisoned, 0);
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 101, true, 64, 0));
    assert_nak(&mut e, 101, NakCode::RemoteOperationalError, 1);
}

#[test]
fn an_rdma_cm_connection_is_poisoned_and_disconnected_at_both_ends() {
    // rping: REQUESTER (active, sends from 5000) SENT once, pseudo-ACKed;
    // the far side (sends from 700) never sent. Its receiver refuses.
    let mut e = cm_engine(700, 5000);
    let t = Time::from_micros(1);
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 5000, true, 64, 0));
    assert_acks(&mut e, &[(5000, Syndrome::ACK_UNLIMITED, 1)]);
    twin_error(&mut e, t, key(), 5000, NakCode::RemoteOperationalError);
    let out = drain(&mut e);
    assert_eq!(
        dc_requests(&out),
        vec![poison_at(700)],
        "at the far side's first PSN, from RDMA-CM"
    );
    // The local end in the far host's name (comm IDs 0x5678 there, 0x1234
    // here), the far end in the local host's name, through the twin.
    assert_eq!(
        dreqs(&out),
        vec![(RESPONDER.into(), REQUESTER.into(), 0x5678, 0x1234, RQ_QPN)]
    );
    assert_eq!(
        twin_dreqs(&out),
        vec![(REQUESTER.into(), RESPONDER.into(), 0x1234, 0x5678, RS_QPN)]
    );
    assert_eq!(e.stats.far_error_dreqs, 2);
    // Forgotten: losing the twin later sends no second DREQ.
    let sum = e.fail_all(t, NakCode::RemoteOperationalError);
    assert_eq!(sum.dreqs_sent, 0);
}

#[test]
fn a_qp_with_no_known_epsn_is_probed_while_the_twin_lives() {
    // No reverse traffic, no RDMA-CM: the ePSN is learned by probing, to
    // the far QP's number the half names.
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 100, true, 8, 0));
    drain(&mut e);
    twin_error(&mut e, t, key(), 100, NakCode::RemoteOperationalError);
    let out = drain(&mut e);
    let v: Vec<(u32, u32)> = dc_requests(&out).iter().map(|r| (r.2, r.4)).collect();
    assert_eq!(v, vec![(RQ_QPN, 0), (RQ_QPN, 1 << 23)]);
    assert_eq!(e.stats.far_error_qps_probed, 1);
    assert_eq!(e.probes_pending(), 1);
    // Behind the ePSN: re-ACKed with ePSN − 1 = 41; the poison goes to 42,
    // and its fatal answer ends the probe. Nothing reaches the twin.
    local_acks_far(&mut e, t, 41);
    let out = drain(&mut e);
    assert_eq!(
        dc_requests(&out).iter().map(|r| r.4).collect::<Vec<_>>(),
        vec![42]
    );
    assert!(out.iter().all(|o| matches!(o, Output::Dc(_))));
    poison_answer_absorbed(&mut e, t, 42);
    assert_eq!(e.probes_pending(), 0);
    assert_eq!(e.stats.qps_poisoned_after_probe, 1);
}

#[test]
fn a_late_answer_of_a_poisoned_qp_is_absorbed_after_the_twin_is_back() {
    // fail_all poisons the QP; a path answers again; the poisoned QP's
    // answer, late, must still not be carried to the twin.
    let mut e = pseudo_acked_with_reverse_traffic();
    let t = Time::from_micros(2);
    e.fail_all(t, NakCode::RemoteOperationalError);
    e.set_twin_reachable(false);
    assert_eq!(dc_requests(&drain(&mut e)).len(), 1);
    e.set_twin_reachable(true);
    poison_answer_absorbed(&mut e, t, 8);
    // A new QP behind the same number (a new egress half) is served: its
    // answers are its own.
    e.handle_twin(
        t,
        TwinMsg::Request {
            carry: Carry::Raw,
            packet: request_to(RESPONDER, REQUESTER, RQ_QPN, Opcode::RC_SEND_ONLY, 300, 8).into(),
        },
    );
    assert_eq!(drain(&mut e).len(), 1, "injected");
    local_acks_far(&mut e, t, 300);
    let out = drain(&mut e);
    assert!(
        matches!(out.first(), Some(Output::Twin(TwinMsg::Response { .. }))),
        "{out:?}"
    );
}

/// The `TwinMsg::Orphaned` messages an engine queued.
fn orphans(out: &[Output]) -> Vec<TwinMsg> {
    out.iter()
        .filter_map(|o| match o {
            Output::Twin(m @ TwinMsg::Orphaned { .. }) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_survivor_tells_a_restarted_twin_where_its_orphaned_qps_expect_their_next_psn() {
    use super::poison::InProgress;
    // The survivor is at REQUESTER's site: REQUESTER (RDMA-CM, sends from
    // 5000) wrote 5000..=5002 through the twin; the twin reported 5000
    // delivered, 5001 and 5002 were forwarded, not reported. The twin
    // restarts: RESPONDER's QP, pseudo-ACKed by it, may wait for ever.
    let mut e = cm_engine(700, 5000);
    let t = Time::from_micros(1);
    for psn in 5000..5003 {
        e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, psn, true, 64, 0));
    }
    twin_delivered_msn(&mut e, t, key(), 5000, Some(1));
    drain(&mut e);
    e.fail_all(t, NakCode::RemoteOperationalError);
    drain(&mut e);
    assert_eq!(e.orphans_pending(), 2, "the QP, and its CM connection");
    // Told once the new incarnation answers.
    e.tell_orphans();
    let out = drain(&mut e);
    let told = orphans(&out);
    assert_eq!(
        told,
        vec![TwinMsg::Orphaned {
            qp: key(),
            far_qpn: Some(RQ_QPN),
            hint: None,
            candidates: vec![
                (Psn::new(5001), InProgress::Nothing),
                (Psn::new(5002), InProgress::Nothing),
                (Psn::new(5003), InProgress::Nothing),
            ],
        }],
        "after the last delivered, and after each forwarded since"
    );
    assert_eq!(
        twin_dreqs(&out),
        vec![(REQUESTER.into(), RESPONDER.into(), 0x1234, 0x5678, RS_QPN)],
        "and the far end of the connection its DREQ"
    );
    assert_eq!(e.orphans_pending(), 0);

    // The restarted gateway at RESPONDER's site: a fresh engine.
    let mut n = QpEngine::new(super::tests::cfg(AckPolicy::Edge));
    for m in told {
        n.handle_twin(t, m);
    }
    let out = drain(&mut n);
    let v: Vec<(u32, Opcode, u32, usize)> = out
        .iter()
        .filter_map(|o| match o {
            Output::Dc(v) => {
                let p = RocePacket::parse_verified(v).unwrap();
                assert_eq!(
                    (p.ip.src(), p.ip.dst()),
                    (REQUESTER.into(), RESPONDER.into())
                );
                Some((
                    p.bth.dest_qp,
                    p.bth.opcode,
                    p.psn().value(),
                    p.payload().len(),
                ))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        v,
        vec![
            (RS_QPN, Opcode::RC_SEND_MIDDLE, 5001, 0),
            (RS_QPN, Opcode::RC_SEND_MIDDLE, 5002, 0),
            (RS_QPN, Opcode::RC_SEND_MIDDLE, 5003, 0),
        ]
    );
    assert_eq!(
        (n.stats.orphan_qps_poisoned, n.stats.orphan_poison_packets),
        (1, 3)
    );
    // The QP's fatal answer, to REQUESTER's QP, goes nowhere.
    n.handle_dc(
        t,
        &ack_to(
            RESPONDER,
            REQUESTER,
            RQ_QPN,
            5002,
            Syndrome::Nak(NakCode::InvalidRequest),
        ),
    );
    assert!(drain(&mut n).is_empty());
}

#[test]
fn an_orphan_is_not_poisoned_when_a_live_flow_of_the_new_incarnation_uses_its_number() {
    // A new QP behind the same number already talks through the restarted
    // gateway: the orphan message must not hit it.
    let mut n = QpEngine::new(super::tests::cfg(AckPolicy::Edge));
    let t = Time::from_micros(1);
    twin_request(&mut n, t, request(Opcode::RC_SEND_ONLY, 9000, true, 8, 0));
    assert_eq!(drain(&mut n).len(), 1, "injected");
    n.handle_twin(
        t,
        TwinMsg::Orphaned {
            qp: key(),
            far_qpn: Some(RQ_QPN),
            hint: None,
            candidates: vec![(Psn::new(9000), super::poison::InProgress::Nothing)],
        },
    );
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.stats.orphans_skipped, 1);
}
