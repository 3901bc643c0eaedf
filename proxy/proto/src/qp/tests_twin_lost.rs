//! The twin is lost for good: [`QpEngine::fail_all`] and
//! [`QpEngine::set_twin_reachable`] (issue 14), packet by packet. The
//! helpers and the addressing (REQUESTER at the ingress site, RESPONDER at
//! the egress site) are those of `tests.rs`.

use std::net::Ipv4Addr;

use soya_config::AckPolicy;

use super::engine::{Output, QpEngine, TwinLostSummary};
use super::poison;
use super::tests::{
    acks, assert_acks, cfg, drain, drained_acks, edge_engine, edge_ingress, egress_engine_with,
    forwarded, injected, key, request, request_on, response, REQUESTER, RESPONDER, RQ_QPN, RS_QPN,
};
use super::tests_twin::{twin_error, twin_request};
use super::twin::{Carry, TwinMsg};
use crate::roce::ip::rxe_udp_sport;
use crate::roce::{IpHeader, NakCode, Opcode, Psn, Reth, RocePacket, Syndrome};
use crate::time::Time;

const LOST: NakCode = NakCode::RemoteOperationalError;

/// A request between any two hosts (the reverse direction of a QP too).
pub(super) fn request_to(
    from: Ipv4Addr,
    to: Ipv4Addr,
    dest_qp: u32,
    op: Opcode,
    psn: u32,
    payload: usize,
) -> Vec<u8> {
    request_on(IpHeader::v4(from, to), dest_qp, op, psn, true, payload, 0)
}

/// An ACK/NAK between any two hosts.
pub(super) fn ack_to(
    from: Ipv4Addr,
    to: Ipv4Addr,
    dest_qp: u32,
    psn: u32,
    syndrome: Syndrome,
) -> Vec<u8> {
    let to_ = crate::roce::builders::ReplyTo {
        ip: IpHeader::v4(from, to),
        src_port: 0xc000,
        dest_qp,
    };
    crate::roce::builders::response(&to_, Opcode::RC_ACK, Psn::new(psn), syndrome, 0)
        .to_vec(&[])
        .unwrap()
}

/// The far host (RESPONDER) sends REQUESTER's QP a SEND, through the twin.
pub(super) fn far_send(e: &mut QpEngine, t: Time, psn: u32, payload: usize) {
    let p = request_to(
        RESPONDER,
        REQUESTER,
        RQ_QPN,
        Opcode::RC_SEND_ONLY,
        psn,
        payload,
    );
    twin_request(e, t, p);
}

/// REQUESTER's QP acknowledges the far host's requests up to `psn`.
pub(super) fn local_acks_far(e: &mut QpEngine, t: Time, psn: u32) {
    e.handle_dc(
        t,
        &ack_to(REQUESTER, RESPONDER, RS_QPN, psn, Syndrome::ACK_UNLIMITED),
    );
}

/// REQUESTER's QP answers a poison at `psn` as a QP in error does (NAK
/// Invalid Request to the far QP): the gateway absorbs it.
pub(super) fn poison_answer_absorbed(e: &mut QpEngine, t: Time, psn: u32) {
    let nak = Syndrome::Nak(NakCode::InvalidRequest);
    e.handle_dc(t, &ack_to(REQUESTER, RESPONDER, RS_QPN, psn, nak));
    assert!(drain(e).is_empty(), "the poison's answer is absorbed");
}

/// The poison REQUESTER's QP RQ_QPN gets at `psn`, as [`dc_requests`]
/// lists it: a SEND Middle from the far host, no payload.
pub(super) fn poison_at(psn: u32) -> (Ipv4Addr, Ipv4Addr, u32, Opcode, u32, usize) {
    (RESPONDER, REQUESTER, RQ_QPN, Opcode::RC_SEND_MIDDLE, psn, 0)
}

/// Request packets sent to the DC side: (source, destination, dest QP,
/// opcode, PSN, payload length, AckReq, UDP source port), ICRC checked.
pub(super) fn dc_requests(out: &[Output]) -> Vec<(Ipv4Addr, Ipv4Addr, u32, Opcode, u32, usize)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Dc(v) => {
                let p = RocePacket::parse_verified(v).expect("valid ICRC");
                p.info.is_request().then(|| {
                    let (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) =
                        (p.ip.src(), p.ip.dst())
                    else {
                        panic!("v4")
                    };
                    assert!(p.bth.ack_req, "a poison packet asks for its answer");
                    assert_eq!(p.ext.reth, Reth::default(), "never a RETH");
                    (
                        s,
                        d,
                        p.bth.dest_qp,
                        p.bth.opcode,
                        p.psn().value(),
                        p.payload().len(),
                    )
                })
            }
            _ => None,
        })
        .collect()
}

/// An RDMA-CM MAD in a UD SEND Only to QP1.
pub(super) fn cm_packet(
    from: Ipv4Addr,
    to: Ipv4Addr,
    attr: u16,
    fields: &[(usize, u32, usize)],
) -> Vec<u8> {
    let mut m = vec![0u8; 256];
    m[0] = 1; // base version
    m[1] = 0x07; // CM
    m[2] = 2;
    m[3] = 3;
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    for &(at, v, n) in fields {
        m[at..at + n].copy_from_slice(&v.to_be_bytes()[4 - n..]);
    }
    crate::roce::builders::cm_mad(IpHeader::v4(from, to))
        .to_vec(&m)
        .unwrap()
}

/// An engine at REQUESTER's site that saw RDMA-CM connect REQUESTER's QP
/// RQ_QPN (active, local) to RESPONDER's QP RS_QPN: the local QP sends
/// from `rep_psn` and expects the far one's first PSN, `req_psn`.
pub(super) fn cm_engine(req_psn: u32, rep_psn: u32) -> QpEngine {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    const COMM: u32 = 0x1234;
    let req = cm_packet(
        REQUESTER,
        RESPONDER,
        0x10,
        &[
            (24, COMM, 4),
            (56, RQ_QPN, 3),
            (68, req_psn, 3),
            (74, 5 << 4, 1), // path MTU 4096
        ],
    );
    e.handle_dc(Time::ZERO, &req);
    let rep = cm_packet(
        RESPONDER,
        REQUESTER,
        0x13,
        &[
            (24, 0x5678, 4),
            (28, COMM, 4),
            (36, RS_QPN, 3),
            (44, rep_psn, 3),
        ],
    );
    e.handle_twin(Time::ZERO, TwinMsg::Datagram { packet: rep.into() });
    drain(&mut e);
    assert_eq!(e.stats.flows_learned_cm, 1);
    e
}

#[test]
fn fail_all_naks_the_first_psn_when_nothing_was_acknowledged() {
    // Learned from RDMA-CM: the requester starts at 5000 and nothing of it
    // was ever acknowledged (a READ first, and a WRITE behind it).
    let mut e = cm_engine(700, 5000);
    let t = Time::from_micros(1);
    e.handle_dc(t, &request(Opcode::RC_READ_REQUEST, 5000, true, 0, 4096));
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 5001, true, 64, 0));
    let out = drain(&mut e);
    assert_eq!(forwarded(&out), vec![5000, 5001]);
    assert!(acks(&out).is_empty(), "nothing before or past a READ");
    assert_eq!(e.occupancy().slots_used, 2);
    let sum = e.fail_all(t, LOST);
    let out = drain(&mut e);
    assert_eq!(
        acks(&out),
        vec![(5000, Syndrome::Nak(LOST), 0)],
        "the NAK lands on the READ: the requester's oldest outstanding PSN, not 0"
    );
    assert!(
        dc_requests(&out).is_empty(),
        "its QP goes to error through the NAK: no poison"
    );
    assert_eq!(e.occupancy().slots_used, 0);
    assert_eq!((sum.halves_failed, sum.halves_nacked), (1, 1));
    assert_eq!(e.stats.halves_nacked_twin_lost, 1);
}

#[test]
fn fail_all_naks_the_psn_after_the_last_ack_and_refuses_what_follows() {
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 100, true, 64, 0));
    e.handle_dc(t, &request(Opcode::RC_READ_REQUEST, 101, true, 0, 4096));
    let out = drain(&mut e);
    assert_eq!(acks(&out), vec![(100, Syndrome::ACK_UNLIMITED, 1)]);
    e.fail_all(t, LOST);
    let out = drain(&mut e);
    assert_eq!(acks(&out), vec![(101, Syndrome::Nak(LOST), 1)]);
    assert_eq!(e.occupancy().slots_used, 0);
    // A later request (already in flight when the twin was lost) gets the
    // same NAK, at the first unacknowledged PSN, never past it.
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 102, true, 8, 0));
    let out = drain(&mut e);
    assert_eq!(acks(&out), vec![(101, Syndrome::Nak(LOST), 1)]);
    assert!(forwarded(&out).is_empty());
    assert_eq!(e.occupancy().slots_used, 0);
}

#[test]
fn a_failed_half_never_naks_past_a_request_accepted_but_not_acknowledged() {
    // Coalescing holds the ACK of 100..=101 when the twin reports an error:
    // the NAK for a later request must not implicitly acknowledge them.
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 100, false, 8, 0));
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 101, false, 8, 0));
    assert!(drained_acks(&mut e).is_empty(), "coalescing");
    twin_error(&mut e, t, key(), 0, LOST);
    assert_acks(&mut e, &[(100, Syndrome::Nak(LOST), 0)]);
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 102, true, 8, 0));
    assert_acks(&mut e, &[(100, Syndrome::Nak(LOST), 0)]);
}

/// The far host sent `ops` (from PSN 10) toward the local QP RS_QPN at
/// RESPONDER, all injected and all acknowledged; returns the poison packets
/// fail_all sends.
fn poison_after(ops: &[Opcode]) -> Vec<(Ipv4Addr, Ipv4Addr, u32, Opcode, u32, usize)> {
    let (mut e, t) = edge_engine();
    for (i, &op) in ops.iter().enumerate() {
        let payload = if matches!(op, Opcode::RC_READ_REQUEST) {
            0
        } else {
            4096
        };
        twin_request(&mut e, t, request(op, 10 + i as u32, true, payload, 4096));
    }
    let last = 10 + ops.len() as u32 - 1;
    assert_eq!(injected(&drain(&mut e)).len(), ops.len());
    let answer = if ops.last() == Some(&Opcode::RC_READ_REQUEST) {
        response(
            Opcode::RC_READ_RESPONSE_ONLY,
            last,
            Syndrome::ACK_UNLIMITED,
            4096,
        )
    } else {
        response(Opcode::RC_ACK, last, Syndrome::ACK_UNLIMITED, 0)
    };
    e.handle_dc(t, &answer);
    drain(&mut e);
    assert_eq!(e.occupancy().slots_used, 0, "all acknowledged");
    let sum = e.fail_all(t, LOST);
    let out = drain(&mut e);
    assert_eq!(sum.qps_poisoned, 1);
    dc_requests(&out)
}

#[test]
fn a_qp_with_nothing_outstanding_is_poisoned_at_its_epsn_with_an_opcode_that_cannot_continue() {
    use Opcode as O;
    let one = |ops: &[Opcode]| {
        let v = poison_after(ops);
        assert_eq!(v.len(), 1, "exact ePSN: one packet ({ops:?})");
        let (src, dst, qp, op, psn, len) = v[0];
        // From the far host to the local QP (rxe_recv.c check_addr), no
        // payload: nothing can be placed.
        assert_eq!((src, dst, qp, len), (REQUESTER, RESPONDER, RS_QPN, 0));
        assert_eq!(
            psn,
            10 + ops.len() as u32,
            "the PSN after the last executed"
        );
        op
    };
    // Nothing in progress: a Middle without a First (missing first).
    assert_eq!(one(&[O::RC_SEND_ONLY]), O::RC_SEND_MIDDLE);
    assert_eq!(
        one(&[O::RC_WRITE_FIRST, O::RC_WRITE_LAST]),
        O::RC_SEND_MIDDLE
    );
    // A READ does not change the message in progress (none).
    assert_eq!(one(&[O::RC_READ_REQUEST]), O::RC_SEND_MIDDLE);
    // A SEND in progress: a WRITE Middle (missing last), never a SEND Middle
    // that would place data into the posted receive.
    assert_eq!(one(&[O::RC_SEND_FIRST]), O::RC_WRITE_MIDDLE);
    assert_eq!(
        one(&[O::RC_SEND_FIRST, O::RC_SEND_MIDDLE]),
        O::RC_WRITE_MIDDLE
    );
    // A WRITE in progress: a SEND Middle, never a WRITE Middle that would
    // place data at the WRITE's address.
    assert_eq!(one(&[O::RC_WRITE_FIRST]), O::RC_SEND_MIDDLE);
}

#[test]
fn unacknowledged_injections_get_one_poison_per_possible_epsn() {
    let (mut e, t) = edge_engine();
    let ops = [
        Opcode::RC_SEND_FIRST,
        Opcode::RC_SEND_MIDDLE,
        Opcode::RC_SEND_LAST,
    ];
    for (i, op) in ops.into_iter().enumerate() {
        twin_request(&mut e, t, request(op, 10 + i as u32, i == 2, 4096, 0));
    }
    assert_eq!(injected(&drain(&mut e)), vec![10, 11, 12]);
    // The responder acknowledged 10 only; 11 and 12 may or may not have
    // been executed.
    e.handle_dc(t, &response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0));
    drain(&mut e);
    assert_eq!(e.occupancy().slots_used, 2);
    let sum = e.fail_all(t, LOST);
    let v: Vec<(Opcode, u32)> = dc_requests(&drain(&mut e))
        .into_iter()
        .map(|(_, _, _, op, psn, _)| (op, psn))
        .collect();
    assert_eq!(
        v,
        vec![
            (Opcode::RC_WRITE_MIDDLE, 11), // ePSN 11: SEND in progress
            (Opcode::RC_WRITE_MIDDLE, 12), // ePSN 12: SEND in progress
            (Opcode::RC_SEND_MIDDLE, 13),  // ePSN 13: the SEND ended
        ],
        "increasing PSNs: the ones before the true ePSN are duplicates, the ones after reach a QP in error"
    );
    assert_eq!(
        (sum.poison_packets, sum.egress_packets_dropped),
        (3, 2),
        "and the two unacknowledged packets are dropped"
    );
    assert_eq!(e.occupancy().slots_used, 0);
}

#[test]
fn a_pseudo_acked_requester_is_poisoned_through_its_responder_role() {
    // REQUESTER's QP RQ_QPN wrote through us (pseudo-ACKed: nothing
    // outstanding) and earlier received a SEND from the far host (PSN 7),
    // which it acknowledged. It now waits for the next SEND.
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 100, true, 64, 0));
    assert_acks(&mut e, &[(100, Syndrome::ACK_UNLIMITED, 1)]);
    far_send(&mut e, t, 7, 16);
    assert_eq!(drain(&mut e).len(), 1, "injected");
    local_acks_far(&mut e, t, 7);
    drain(&mut e);
    assert_eq!(e.occupancy().slots_used, 1, "the WRITE, not yet delivered");
    let sum = e.fail_all(t, LOST);
    let out = drain(&mut e);
    assert!(
        acks(&out).is_empty(),
        "a NAK would find no work request to land on"
    );
    assert_eq!(dc_requests(&out), vec![poison_at(8)]);
    assert_eq!(
        sum,
        TwinLostSummary {
            halves_failed: 1,
            halves_nacked: 0,
            qps_poisoned: 1,
            poison_packets: 1,
            unattributable: 0,
            probing: 0,
            egress_halves_dropped: 1,
            egress_packets_dropped: 0,
            dreqs_sent: 0,
        }
    );
    assert_eq!(e.occupancy().slots_used, 0);
    // The UDP source port is the one the far QP uses (rxe's hash of both).
    let Output::Dc(v) = &out[0] else { panic!() };
    let p = RocePacket::parse_verified(v).unwrap();
    assert_eq!(p.udp.src_port, rxe_udp_sport(RS_QPN, RQ_QPN));
    // Its answer (NAK Invalid Request) is absorbed, not sent to the lost twin.
    poison_answer_absorbed(&mut e, t, 8);
    assert_eq!(e.stats.poison_answers_absorbed, 1);
}

#[test]
fn an_idle_qp_learned_from_rdma_cm_is_poisoned_at_the_far_sides_starting_psn() {
    // rping: connected, nothing sent yet either way; the local QP waits
    // for the far side's first SEND, which would carry PSN 700.
    let mut e = cm_engine(700, 5000);
    let sum = e.fail_all(Time::from_micros(1), LOST);
    let out = drain(&mut e);
    assert!(acks(&out).is_empty());
    assert_eq!(dc_requests(&out), vec![poison_at(700)]);
    assert_eq!((sum.qps_poisoned, sum.unattributable), (1, 0));
    assert_eq!(e.stats.qps_poisoned, 1);
}

#[test]
fn the_far_sides_traffic_tells_the_epsn_better_than_rdma_cm() {
    let mut e = cm_engine(700, 5000);
    let t = Time::from_micros(1);
    for psn in 700..703 {
        far_send(&mut e, t, psn, 8);
    }
    drain(&mut e);
    local_acks_far(&mut e, t, 702);
    drain(&mut e);
    e.fail_all(t, LOST);
    let v = dc_requests(&drain(&mut e));
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].3, v[0].4), (Opcode::RC_SEND_MIDDLE, 703));
}

#[test]
fn nothing_is_sent_to_a_qp_the_engine_cannot_attribute() {
    let (mut e, t) = edge_engine();
    // A tunnel phase toward a local responder whose ACK we never saw: its
    // ePSN is anywhere in the raw packets.
    e.handle_twin(
        t,
        TwinMsg::Request {
            carry: Carry::Raw,
            packet: request(Opcode::RC_SEND_ONLY, 10, true, 8, 0).into(),
        },
    );
    // A local requester still in its tunnel phase (QPN unknown).
    e.handle_dc(
        t,
        &request_to(REQUESTER, RESPONDER, 0x99, Opcode::RC_SEND_ONLY, 40, 8),
    );
    drain(&mut e);
    let sum = e.fail_all(t, LOST);
    let out = drain(&mut e);
    assert!(
        out.iter().all(|o| !matches!(o, Output::Dc(_))),
        "no packet toward the DC: {out:?}"
    );
    assert_eq!(sum.unattributable, 2);
    assert_eq!(e.stats.poison_unattributable, 2);
    assert_eq!(sum.egress_halves_dropped, 1);
}

#[test]
fn fail_all_drops_the_lost_twins_egress_state_and_frees_its_slots() {
    let (mut e, t) = egress_engine_with(Opcode::RC_WRITE_ONLY, 10, 64);
    drain(&mut e);
    assert_eq!(e.occupancy().slots_used, 10);
    assert_eq!(e.egress_halves().count(), 1);
    let sum = e.fail_all(t, LOST);
    assert_eq!(e.occupancy().slots_used, 0);
    assert_eq!(e.egress_halves().count(), 0);
    assert_eq!(
        (sum.egress_halves_dropped, sum.egress_packets_dropped),
        (1, 10)
    );
    assert_eq!(e.stats.egress_packets_dropped, 10);
    // No retransmission timer of the dropped half survives.
    assert_eq!(e.poll_timeout(), None);
}

#[test]
fn while_the_twin_is_unreachable_new_requests_are_refused_at_once() {
    let (mut e, t) = edge_ingress();
    e.set_twin_reachable(false);
    assert!(!e.twin_reachable());
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 100, true, 8, 0));
    let out = drain(&mut e);
    assert_eq!(
        acks(&out),
        vec![(100, Syndrome::Nak(LOST), 0)],
        "NAK at that PSN, no pseudo-ACK"
    );
    assert!(forwarded(&out).is_empty(), "nothing carried");
    assert_eq!(e.occupancy().slots_used, 0, "nothing buffered");
    // A QP the engine never learned cannot be answered: dropped, counted.
    e.handle_dc(
        t,
        &request_to(REQUESTER, RESPONDER, 0x99, Opcode::RC_SEND_ONLY, 40, 8),
    );
    assert!(drain(&mut e).is_empty());
    assert_eq!(
        (
            e.stats.requests_refused_unreachable,
            e.stats.requests_dropped_unreachable
        ),
        (1, 1)
    );
    // Reachable again: a new QP is served normally; the refused one stays
    // refused (its QP is in the error state).
    e.set_twin_reachable(true);
    e.handle_dc(
        t,
        &request_to(REQUESTER, RESPONDER, 0x77, Opcode::RC_SEND_ONLY, 50, 8),
    );
    let out = drain(&mut e);
    assert!(
        matches!(
            &out[..],
            [Output::Twin(TwinMsg::Request {
                carry: Carry::Raw,
                ..
            })]
        ),
        "{out:?}"
    );
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 101, true, 8, 0));
    assert_acks(&mut e, &[(100, Syndrome::Nak(LOST), 0)]);
}

// --- Learning the ePSN by probing (`qp::poison`, probing) -----------------

/// REQUESTER's QP RQ_QPN (learned from the far responder's ACK) wrote
/// through us and was pseudo-ACKed: nothing outstanding, and the far host
/// never sent it anything (no egress half, no RDMA-CM). The twin is lost.
fn probed_engine() -> (QpEngine, TwinLostSummary, Vec<Output>) {
    let (mut e, t) = edge_ingress();
    e.handle_dc(t, &request(Opcode::RC_WRITE_ONLY, 100, true, 64, 0));
    assert_acks(&mut e, &[(100, Syndrome::ACK_UNLIMITED, 1)]);
    let sum = e.fail_all(t, LOST);
    let out = drain(&mut e);
    (e, sum, out)
}

/// [`probed_engine`] whose QP answered the probes at 2 µs with a re-ACK of
/// 899 (rxe's `resp.ack_psn`, which may lag the ePSN): the engine, that
/// time and what the re-ACK led to (the poison at 900).
fn re_acked_899() -> (QpEngine, Time, Vec<Output>) {
    let (mut e, _, _) = probed_engine();
    let t = Time::from_micros(2);
    e.handle_dc(t, &answer(899, Syndrome::ACK_UNLIMITED));
    let out = drain(&mut e);
    (e, t, out)
}

/// What an rxe responder (rxe_resp.c `check_psn`, `duplicate_request`,
/// `check_op_seq`) expecting `epsn` answers to a probe/poison at `psn`:
/// (PSN, syndrome), or nothing. `sent_nak`: rxe's `sent_psn_nak`;
/// `error`: the QP is in the error state (drops everything).
fn rxe_answer(
    epsn: u32,
    sent_nak: &mut bool,
    error: &mut bool,
    psn: u32,
) -> Option<(u32, Syndrome)> {
    if *error {
        return None;
    }
    let d = Psn::new(psn).diff(Psn::new(epsn));
    if d > 0 {
        if *sent_nak {
            return None;
        }
        *sent_nak = true;
        return Some((epsn, Syndrome::Nak(NakCode::PsnSequenceError)));
    }
    if d < 0 {
        return Some((Psn::new(epsn).sub(1).value(), Syndrome::ACK_UNLIMITED));
    }
    *error = true;
    Some((psn, Syndrome::Nak(NakCode::InvalidRequest)))
}

/// The local QP's answer, from REQUESTER to the far QP RS_QPN.
fn answer(psn: u32, syndrome: Syndrome) -> Vec<u8> {
    ack_to(REQUESTER, RESPONDER, RS_QPN, psn, syndrome)
}

fn no_twin_output(out: &[Output]) {
    assert!(
        out.iter().all(|o| !matches!(o, Output::Twin(_))),
        "nothing to the twin: {out:?}"
    );
}

#[test]
fn a_qp_with_no_known_epsn_is_probed_half_the_psn_space_apart() {
    let (e, sum, out) = probed_engine();
    assert_eq!(
        (sum.probing, sum.unattributable, sum.qps_poisoned),
        (1, 0, 0)
    );
    assert!(acks(&out).is_empty());
    // From the far host to the local QP, its learned QPN, no payload, no
    // RETH (checked by dc_requests), with the far QP's UDP port.
    assert_eq!(dc_requests(&out), vec![poison_at(0), poison_at(1 << 23),]);
    let Output::Dc(v) = &out[0] else { panic!() };
    let p = RocePacket::parse_verified(v).unwrap();
    assert_eq!(p.udp.src_port, rxe_udp_sport(RS_QPN, RQ_QPN));
    assert_eq!((e.stats.qps_probed, e.stats.probes_sent), (1, 2));
    assert_eq!(e.probes_pending(), 1);
    assert!(e.poll_timeout().is_some(), "bounded by a timer");
}

/// ePSN 5000: a re-ACK of 4999 answers a probe (C9-105); the poison goes
/// to 5000 and the QP refuses it fatally (in error; the NAK is absorbed).
fn reack_4999_then_the_poison_lands_at_5000(e: &mut QpEngine, t: Time) {
    e.handle_dc(t, &answer(4999, Syndrome::ACK_UNLIMITED));
    let out = drain(e);
    no_twin_output(&out);
    assert_eq!(
        dc_requests(&out),
        vec![poison_at(5000)],
        "the poison, at ePSN = re-ACK + 1"
    );
    e.handle_dc(t, &answer(5000, Syndrome::Nak(NakCode::InvalidRequest)));
    assert!(drain(e).is_empty());
    assert_eq!(e.stats.qps_poisoned_after_probe, 1);
}

#[test]
fn a_probe_behind_the_epsn_is_re_acked_and_the_poison_lands_at_the_exact_epsn() {
    let (mut e, _, _) = probed_engine();
    let t = Time::from_micros(2);
    // ePSN 5000: the probe at 0 is a duplicate, re-ACKed with 4999 (C9-105);
    // the NAK-seq of the probe at 2^23 was already sent earlier (silent).
    reack_4999_then_the_poison_lands_at_5000(&mut e, t);
    assert_eq!(e.stats.probe_answers, 2);
    assert_eq!(e.stats.poison_packets, 1);
    assert_eq!(e.stats.unmatched_responses, 0);
    assert_eq!(e.probes_pending(), 0);
    assert_eq!(e.poll_timeout(), None, "done: no timer left");
    // A late answer (to the other probe) is still absorbed.
    e.handle_dc(t, &answer(4999, Syndrome::ACK_UNLIMITED));
    assert!(drain(&mut e).is_empty());
}

#[test]
fn a_probe_ahead_of_the_epsn_gets_a_nak_seq_and_the_poison_goes_there() {
    let (mut e, _, _) = probed_engine();
    let t = Time::from_micros(2);
    // ePSN 2^23 + 7: the probe at 0 is ahead (NAK-seq carrying the ePSN),
    // and the re-ACK of the one at 2^23 was lost.
    let epsn = (1 << 23) + 7;
    e.handle_dc(t, &answer(epsn, Syndrome::Nak(NakCode::PsnSequenceError)));
    let out = drain(&mut e);
    no_twin_output(&out);
    assert_eq!(dc_requests(&out), vec![poison_at(epsn)]);
    // The re-ACK arriving late (epsn - 1 + 1 = epsn) changes nothing.
    e.handle_dc(t, &answer(epsn - 1, Syndrome::ACK_UNLIMITED));
    assert!(dc_requests(&drain(&mut e)).is_empty());
    e.handle_dc(t, &answer(epsn, Syndrome::Nak(NakCode::InvalidRequest)));
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.stats.qps_poisoned_after_probe, 1);
}

#[test]
fn a_nak_seq_corrects_an_estimate_from_a_lagging_re_ack() {
    // rxe's re-ACK uses resp.ack_psn, which a READ does not advance: the
    // re-ACK can say 899 when the ePSN is 903. The NAK-seq is exact.
    let (mut e, t, out) = re_acked_899();
    assert_eq!(dc_requests(&out)[0].4, 900);
    e.handle_dc(t, &answer(903, Syndrome::Nak(NakCode::PsnSequenceError)));
    let v = dc_requests(&drain(&mut e));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].4, 903);
}

#[test]
fn probing_ends_with_the_poison_at_the_epsn_wherever_the_epsn_is() {
    // Against a model of rxe's responder, every ePSN (around 0, 2^23, the
    // wrap), with or without a NAK-seq already sent: the QP ends in error
    // through a packet at its exact ePSN, nothing ever reaches the twin,
    // and it takes at most the two probes and one poison.
    for epsn in [
        0,
        1,
        5000,
        (1 << 23) - 1,
        1 << 23,
        (1 << 23) + 1,
        (1 << 24) - 1,
    ] {
        for already_nacked in [false, true] {
            let (mut e, _, mut out) = probed_engine();
            let (mut sent_nak, mut error) = (already_nacked, false);
            let mut t = Time::from_micros(2);
            let mut packets = 0;
            while !out.is_empty() {
                no_twin_output(&out);
                let mut answers = vec![];
                for (.., psn, _) in dc_requests(&out) {
                    packets += 1;
                    let was = error;
                    if let Some(a) = rxe_answer(epsn, &mut sent_nak, &mut error, psn) {
                        answers.push(a);
                    }
                    if error && !was {
                        assert_eq!(psn, epsn, "the error comes from the exact ePSN");
                    }
                }
                t += std::time::Duration::from_micros(5);
                for (psn, syn) in answers {
                    e.handle_dc(t, &answer(psn, syn));
                }
                out = drain(&mut e);
            }
            assert!(error, "ePSN {epsn} nacked {already_nacked}: in error");
            assert!(packets <= 3, "ePSN {epsn}: {packets} packets");
            assert_eq!(e.stats.qps_poisoned_after_probe, 1);
            assert_eq!(e.poll_timeout(), None);
        }
    }
}

#[test]
fn an_unanswered_probe_is_retried_a_few_times_then_counted_unattributable() {
    let (mut e, _, _) = probed_engine();
    let mut sends = 1;
    let mut last = Time::from_micros(1);
    while let Some(t) = e.poll_timeout() {
        assert!(t > last, "the timer moves forward");
        let gap = t - last;
        // Each wait doubles (the answer may come behind a requester's
        // retransmitted window): 2, 4, 8 ... ms.
        assert_eq!(gap, poison::probe_wait(sends), "wait after send {sends}");
        last = t;
        e.handle_timeout(t);
        let v = dc_requests(&drain(&mut e));
        if v.is_empty() {
            break;
        }
        assert_eq!(v.len(), 2, "both probes again");
        sends += 1;
        assert!(sends <= poison::PROBE_ATTEMPTS, "bounded");
    }
    assert_eq!(sends, poison::PROBE_ATTEMPTS);
    assert_eq!(e.poll_timeout(), None, "never a loop");
    assert_eq!(e.probes_pending(), 0);
    assert_eq!(
        (
            e.stats.probes_sent,
            e.stats.probes_unanswered,
            e.stats.poison_unattributable
        ),
        (2 * u64::from(poison::PROBE_ATTEMPTS), 1, 1)
    );
    // A very late answer is absorbed, not carried to the twin.
    e.handle_dc(last, &answer(41, Syndrome::ACK_UNLIMITED));
    no_twin_output(&drain(&mut e));
}

/// The answer to a probe can reach the gateway behind a requester's whole
/// retransmitted window (after a near gateway's restart): one that comes
/// 100 ms late, after the retries have backed off, still leads to the
/// poison. With three tries 2 ms apart (the code before) it was absorbed
/// as late and the QP stalled, unattributable.
#[test]
fn a_probe_answered_late_behind_a_burst_still_leads_to_the_poison() {
    let (mut e, _, _) = probed_engine();
    let late = Time::from_micros(1) + std::time::Duration::from_millis(100);
    let mut sends = 1;
    while let Some(t) = e.poll_timeout().filter(|&t| t <= late) {
        e.handle_timeout(t);
        sends += usize::from(!dc_requests(&drain(&mut e)).is_empty());
    }
    assert!(sends > 3, "retried while waiting: {sends} sends");
    assert_eq!(e.probes_pending(), 1, "still probing at 100 ms");
    reack_4999_then_the_poison_lands_at_5000(&mut e, late);
    assert_eq!(e.stats.poison_unattributable, 0);
}

#[test]
fn a_poison_that_gets_no_fatal_answer_is_retried_then_given_up() {
    // The re-ACK said 899 and the poison at 900 gets the same re-ACK again
    // (the ePSN is further, no NAK-seq comes): bounded, then unattributable.
    let (mut e, _, _) = re_acked_899();
    let mut n = 0;
    while let Some(t) = e.poll_timeout() {
        e.handle_dc(t, &answer(899, Syndrome::ACK_UNLIMITED));
        e.handle_timeout(t);
        let out = drain(&mut e);
        no_twin_output(&out);
        n += dc_requests(&out).len();
        assert!(n < 10);
    }
    assert_eq!(n as u32, poison::PROBE_ATTEMPTS - 1, "the poison's retries");
    assert_eq!(e.stats.probes_unanswered, 1);
    assert_eq!(e.stats.qps_poisoned_after_probe, 0);
}

#[test]
fn answers_of_other_qps_are_not_taken_for_probe_answers() {
    let (mut e, _, _) = probed_engine();
    let t = Time::from_micros(2);
    // The same hosts, another far QP: not ours to absorb.
    let other = ack_to(
        REQUESTER,
        RESPONDER,
        RS_QPN + 1,
        4999,
        Syndrome::ACK_UNLIMITED,
    );
    e.handle_dc(t, &other);
    let out = drain(&mut e);
    assert!(dc_requests(&out).is_empty(), "no poison from it");
    assert!(matches!(&out[..], [Output::Twin(TwinMsg::Response { .. })]));
    assert_eq!(e.stats.probe_answers, 0);
}

#[test]
fn a_tunnel_phase_toward_the_qp_gives_the_first_probe_its_psn() {
    // The far requester's raw packets 10..=12 were injected, their ACK not
    // seen; the far QPN is known from RDMA-CM-less traffic: the local QP
    // answered with dest QP RS_QPN... here the engine learns it from the
    // local QP's own ACK of 10.
    let (mut e, t) = edge_engine();
    for psn in 10..13 {
        e.handle_twin(
            t,
            TwinMsg::Request {
                carry: Carry::Raw,
                packet: request_to(RESPONDER, REQUESTER, RQ_QPN, Opcode::RC_SEND_ONLY, psn, 8)
                    .into(),
            },
        );
    }
    local_acks_far(&mut e, t, 10);
    drain(&mut e);
    let sum = e.fail_all(t, LOST);
    assert_eq!((sum.probing, sum.unattributable), (1, 0));
    let v = dc_requests(&drain(&mut e));
    assert_eq!(
        v.iter().map(|r| r.4).collect::<Vec<_>>(),
        vec![13, 13 + (1 << 23)],
        "the likeliest ePSN first"
    );
}

/// The DREQs the engine sent toward the DC side: (source, destination,
/// local comm ID, remote comm ID, remote QPN), ICRC checked.
pub(super) fn dreqs(out: &[Output]) -> Vec<(std::net::IpAddr, std::net::IpAddr, u32, u32, u32)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Dc(v) => {
                let p = RocePacket::parse_verified(v).expect("valid packet");
                match crate::roce::cm::parse_packet(&p) {
                    Ok(crate::roce::cm::CmMessage::Dreq {
                        local_comm_id,
                        remote_comm_id,
                        remote_qpn,
                    }) => Some((
                        p.ip.src(),
                        p.ip.dst(),
                        local_comm_id,
                        remote_comm_id,
                        remote_qpn,
                    )),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect()
}

#[test]
fn fail_all_disconnects_rdma_cm_connections_in_the_far_hosts_name() {
    // rping and other librdmacm users wait for DISCONNECTED (rping even
    // ignores flushed completions): a DREQ as the far host's CM would send
    // it, for the connection REQ/REP set up (comm IDs 0x1234 here, 0x5678
    // there), naming the local QP.
    let mut e = cm_engine(700, 5000);
    let sum = e.fail_all(Time::from_micros(1), LOST);
    let out = drain(&mut e);
    assert_eq!(sum.dreqs_sent, 1);
    assert_eq!(
        dreqs(&out),
        vec![(RESPONDER.into(), REQUESTER.into(), 0x5678, 0x1234, RQ_QPN)]
    );
    assert_eq!(e.stats.dreqs_sent, 1);
    // Once: a second failure finds no connection left.
    e.fail_all(Time::from_micros(2), LOST);
    assert!(dreqs(&drain(&mut e)).is_empty());
}

#[test]
fn a_connection_already_disconnected_gets_no_dreq() {
    let mut e = cm_engine(700, 5000);
    // The application disconnected normally (its DREQ crossed).
    let dreq = cm_packet(
        REQUESTER,
        RESPONDER,
        0x15,
        &[(24, 0x1234, 4), (28, 0x5678, 4), (32, RS_QPN, 3)],
    );
    e.handle_dc(Time::from_micros(1), &dreq);
    drain(&mut e);
    let sum = e.fail_all(Time::from_micros(2), LOST);
    assert_eq!(sum.dreqs_sent, 0);
    assert!(dreqs(&drain(&mut e)).is_empty());
}
