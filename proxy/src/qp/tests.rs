//! Packet-level tests of the ingress and egress roles, driven through the
//! engine with hand-made packets (the simulator drives them with real RC
//! endpoints; these pin individual rules).

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::{EngineConfig, Output, QpEngine};
use super::half::HalfKey;
use super::ingress::HOLD_ACK_FOR;
use super::tests_twin::{twin_delivered, twin_error, twin_request, twin_response};
use super::twin::{Carry, TwinMsg};
use crate::roce::builders::{self, ReplyTo};
use crate::roce::{
    Aeth, Bth, ExtHeaders, Headers, IpHeader, NakCode, Opcode, Psn, Reth, RocePacket, RoceRepr,
    Syndrome,
};
use crate::time::Time;

pub(super) const REQUESTER: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
pub(super) const RESPONDER: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
pub(super) const RQ_QPN: u32 = 0x11;
pub(super) const RS_QPN: u32 = 0x22;

pub(super) fn key() -> HalfKey {
    HalfKey {
        requester: REQUESTER.into(),
        responder: RESPONDER.into(),
        responder_qpn: RS_QPN,
    }
}

pub(super) fn request(
    op: Opcode,
    psn: u32,
    ack_req: bool,
    payload: usize,
    read_len: u32,
) -> Vec<u8> {
    let ip = IpHeader::v4(REQUESTER, RESPONDER);
    request_on(ip, RS_QPN, op, psn, ack_req, payload, read_len)
}

/// A request on any hosts' QP (its RETH, if it has one, for at least the
/// payload).
pub(super) fn request_on(
    ip: IpHeader,
    dest_qp: u32,
    op: Opcode,
    psn: u32,
    ack_req: bool,
    payload: usize,
    read_len: u32,
) -> Vec<u8> {
    let reth = Reth {
        va: 0x1000,
        rkey: 7,
        len: read_len.max(payload as u32),
    };
    crate::roce::builders::request(ip, dest_qp, op, Psn::new(psn), ack_req, reth)
        .to_vec(&vec![0xab; payload])
        .unwrap()
}

/// A response from the responder to the requester (what the egress twin sees).
pub(super) fn response(op: Opcode, psn: u32, syndrome: Syndrome, payload: usize) -> Vec<u8> {
    let info = op.info().unwrap();
    let repr = RoceRepr {
        ip: IpHeader::v4(RESPONDER, REQUESTER),
        src_port: 0xc000,
        bth: Bth::new(op, RQ_QPN, Psn::new(psn)),
        ext: ExtHeaders {
            present: info.headers,
            aeth: info
                .headers
                .contains(Headers::AETH)
                .then_some(Aeth { syndrome, msn: 0 }),
            ..Default::default()
        },
    };
    repr.to_vec(&vec![0xcd; payload]).unwrap()
}

pub(super) fn cfg(policy: AckPolicy) -> EngineConfig {
    let mut c = EngineConfig::default();
    c.ack.policy = policy;
    c.ack.coalesce_packets = 4;
    c.ack.coalesce = Duration::from_micros(20);
    c.buffer_slots = 512;
    c.ack.ack_reserve_slots = 8;
    // Windows as seen only (`tests_reserve` pins the assumed one).
    c.ack.assumed_window_slots = 0;
    c
}

/// An engine at the requester's site with the half already learned (as
/// RDMA-CM would have done), expecting PSN 100.
pub(super) fn ingress_engine(policy: AckPolicy) -> QpEngine {
    let mut e = QpEngine::new(cfg(policy));
    // Learn through the raw path: one request, its real ACK back.
    e.handle_dc(Time::ZERO, &request(Opcode::RC_SEND_ONLY, 99, true, 8, 0));
    let sent = drain(&mut e);
    assert!(matches!(
        &sent[..],
        [Output::Twin(TwinMsg::Request {
            carry: Carry::Raw,
            ..
        })]
    ));
    let ack = response(Opcode::RC_ACK, 99, Syndrome::ACK_UNLIMITED, 0);
    twin_response(&mut e, Time::ZERO, ack.clone());
    assert_eq!(drain(&mut e), vec![Output::Dc(ack)], "raw ACK delivered");
    e
}

/// An engine at the responder's site to which the twin forwarded `n`
/// pseudo-ACKed `op` requests of `payload` bytes from PSN 10, the last
/// asking for an ACK (what it injected not yet drained), and their time.
pub(super) fn egress_engine_with(op: Opcode, n: u32, payload: usize) -> (QpEngine, Time) {
    let (mut e, t) = edge_engine();
    for psn in 10..10 + n {
        twin_request(&mut e, t, request(op, psn, psn == 9 + n, payload, 0));
    }
    (e, t)
}

/// A new engine with the edge policy, and the time of the first input.
pub(super) fn edge_engine() -> (QpEngine, Time) {
    (QpEngine::new(cfg(AckPolicy::Edge)), Time::from_micros(1))
}

/// [`ingress_engine`] with the edge policy, and a time just after it
/// learned the half: most tests' first two lines.
pub(super) fn edge_ingress() -> (QpEngine, Time) {
    (ingress_engine(AckPolicy::Edge), Time::from_micros(1))
}

pub(super) fn drain(e: &mut QpEngine) -> Vec<Output> {
    std::iter::from_fn(|| e.poll_output_owned()).collect()
}

/// The (PSN, syndrome, MSN) of every ACK/NAK sent to the DC side.
pub(super) fn acks(out: &[Output]) -> Vec<(u32, Syndrome, u32)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Dc(v) => {
                let p = RocePacket::parse_verified(v).expect("valid ICRC");
                (p.bth.opcode == Opcode::RC_ACK).then(|| {
                    // A pseudo-ACK must look like the responder sent it.
                    assert_eq!(p.ip.src(), RESPONDER);
                    assert_eq!(p.ip.dst(), REQUESTER);
                    assert_eq!(p.bth.dest_qp, RQ_QPN);
                    let a = p.ext.aeth.unwrap();
                    (p.psn().value(), a.syndrome, a.msn)
                })
            }
            _ => None,
        })
        .collect()
}

/// Asserts that the ACKs/NAKs `e` has to send are `want`, (PSN, syndrome,
/// MSN) each.
#[track_caller]
pub(super) fn assert_acks(e: &mut QpEngine, want: &[(u32, Syndrome, u32)]) {
    assert_eq!(drained_acks(e), want);
}

/// Asserts that `e` has one NAK to send, `code` at `psn` (with `msn`).
#[track_caller]
pub(super) fn assert_nak(e: &mut QpEngine, psn: u32, code: NakCode, msn: u32) {
    assert_acks(e, &[(psn, Syndrome::Nak(code), msn)]);
}

/// The ACKs/NAKs of what `e` has to send.
pub(super) fn drained_acks(e: &mut QpEngine) -> Vec<(u32, Syndrome, u32)> {
    acks(&drain(e))
}

pub(super) fn forwarded(out: &[Output]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::Twin(TwinMsg::Request {
                carry: Carry::Reliable,
                packet,
            }) => Some(RocePacket::parse(packet).unwrap().psn().value()),
            _ => None,
        })
        .collect()
}

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
    assert_eq!(drain(&mut e), vec![Output::Dc(first)]);
    twin_response(&mut e, t, last.clone());
    let out = drain(&mut e);
    assert_eq!(out[0], Output::Dc(last));
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

/// A long READ's response may take longer than the egress RTO to stream
/// back; every response packet is progress (as for rxe's own requester), so
/// the READ is not re-requested, and the budget is not spent, while it flows.
#[test]
fn egress_does_not_time_out_a_read_whose_response_is_streaming() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let mut t = Time::from_micros(1);
    twin_request(
        &mut e,
        t,
        request(Opcode::RC_READ_REQUEST, 10, true, 0, 64 * 1024),
    );
    assert_eq!(drain(&mut e).len(), 1);
    let rto = e.poll_timeout().expect("the READ is timed").since(t);
    for i in 0..40u32 {
        // One response packet every half RTO: the whole answer takes 20 RTOs.
        t += rto / 2;
        let op = if i == 0 {
            Opcode::RC_READ_RESPONSE_FIRST
        } else {
            Opcode::RC_READ_RESPONSE_MIDDLE
        };
        e.handle_dc(t, &response(op, 10 + i, Syndrome::ACK_UNLIMITED, 1024));
        e.handle_timeout(t);
        let resent = drain(&mut e)
            .iter()
            .filter(|o| matches!(o, Output::Dc(_)))
            .count();
        assert_eq!(
            resent, 0,
            "READ re-requested while its response streams (packet {i})"
        );
    }
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

pub(super) fn injected(out: &[Output]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::Dc(v) => Some(RocePacket::parse(v).unwrap().psn().value()),
            _ => None,
        })
        .collect()
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
fn egress_timeouts_back_off_exponentially_up_to_the_ceiling() {
    let (mut e, t) = edge_engine();
    twin_request(&mut e, t, request(Opcode::RC_SEND_ONLY, 10, true, 8, 0));
    drain(&mut e);
    let mut now = t;
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let next = e.poll_timeout().unwrap();
        gaps.push(next - now);
        now = next;
        e.handle_timeout(now);
        assert_eq!(injected(&drain(&mut e)), vec![10]);
    }
    let tuning = EngineConfig::default().egress;
    let floor = tuning.min_rto;
    assert_eq!(
        gaps,
        vec![floor, floor * 2, floor * 4, tuning.max_rto, tuning.max_rto],
        "each consecutive timeout doubles the wait, up to the ceiling"
    );
}

/// Sends `psns` to the egress as pseudo-ACKed requests from the twin:
/// `(psn, opcode, ack_req)`. Returns what it injected, with AckReq.
pub(super) fn feed(e: &mut QpEngine, t: Time, psns: &[(u32, Opcode, bool)]) -> Vec<(u32, bool)> {
    for &(psn, op, ack) in psns {
        twin_request(e, t, request(op, psn, ack, 64, 0));
    }
    sent_with_ack_req(&drain(e))
}

pub(super) fn sent_with_ack_req(out: &[Output]) -> Vec<(u32, bool)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Dc(v) => {
                let p = RocePacket::parse_verified(v).expect("valid ICRC");
                Some((p.psn().value(), p.bth.ack_req))
            }
            _ => None,
        })
        .collect()
}

pub(super) fn delivered(out: &[Output]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::Twin(TwinMsg::Delivered { psn, .. }) => Some(psn.value()),
            _ => None,
        })
        .collect()
}

pub(super) fn errors(out: &[Output]) -> usize {
    out.iter()
        .filter(|o| matches!(o, Output::Twin(TwinMsg::Error { .. })))
        .count()
}

/// Runs the engine's timers up to `until`, collecting everything output.
pub(super) fn run_timers(e: &mut QpEngine, until: Time) -> Vec<Output> {
    let mut out = Vec::new();
    while let Some(d) = e.poll_timeout().filter(|&d| d <= until) {
        e.handle_timeout(d);
        out.extend(drain(e));
    }
    out
}

/// A WRITE's middle packets sent while the requester's AckReq (on the
/// previous message's end) was outstanding are covered by no request once
/// its ACK is in. The twin's next packets, a WAN round trip away, ask for
/// them: timing them out at the local RTO (µs) meant resending packets the
/// responder had (rxe: `duplicate_request` by the thousand).
#[test]
fn egress_does_not_resend_a_tail_while_the_twins_next_packet_is_a_wan_rtt_away() {
    let (mut e, t) = edge_engine();
    let sent = feed(
        &mut e,
        t,
        &[
            (10, Opcode::RC_SEND_ONLY, true),
            (11, Opcode::RC_WRITE_FIRST, false),
            (12, Opcode::RC_WRITE_MIDDLE, false),
            (13, Opcode::RC_WRITE_MIDDLE, false),
        ],
    );
    assert_eq!(
        sent,
        vec![(10, true), (11, false), (12, false), (13, false)],
        "one request for an ACK at a time"
    );
    // The responder (10 µs away) answers the only packet that asked.
    let t1 = t + Duration::from_micros(10);
    e.handle_dc(
        t1,
        &response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![10]);
    // A 30 ms WAN round trip later the rest of the WRITE arrives.
    let t2 = t1 + Duration::from_millis(30);
    let quiet = run_timers(&mut e, t2);
    assert!(
        injected(&quiet).is_empty(),
        "resent while waiting for the twin: {quiet:?}"
    );
    let sent = feed(&mut e, t2, &[(14, Opcode::RC_WRITE_LAST, true)]);
    assert_eq!(sent, vec![(14, true)]);
    e.handle_dc(
        t2 + Duration::from_micros(10),
        &response(Opcode::RC_ACK, 14, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![14]);
    let eg = e.egress_halves().next().unwrap();
    assert_eq!(
        (
            eg.stats.retransmitted,
            eg.stats.timeouts,
            eg.stats.tail_probes
        ),
        (0, 0, 0)
    );
}

/// ...and if the twin's next packet never comes, the last packet in flight
/// is resent once, asking for an ACK, after `tail_probe`: not the whole
/// tail at the local RTO.
#[test]
fn egress_probes_an_uncovered_tail_once_after_tail_probe() {
    let (mut e, t) = edge_engine();
    feed(
        &mut e,
        t,
        &[
            (10, Opcode::RC_SEND_ONLY, true),
            (11, Opcode::RC_WRITE_FIRST, false),
            (12, Opcode::RC_WRITE_MIDDLE, false),
        ],
    );
    let t1 = t + Duration::from_micros(10);
    e.handle_dc(
        t1,
        &response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0),
    );
    drain(&mut e);
    let probe_at = t1 + EngineConfig::default().egress.tail_probe;
    let before = run_timers(
        &mut e,
        t1 + (EngineConfig::default().egress.tail_probe - Duration::from_micros(1)),
    );
    assert!(injected(&before).is_empty(), "{before:?}");
    let out = run_timers(&mut e, probe_at);
    assert_eq!(sent_with_ack_req(&out), vec![(12, true)], "one probe");
    // The responder had both: its re-ACK says so.
    e.handle_dc(
        probe_at,
        &response(Opcode::RC_ACK, 12, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![12]);
    assert_eq!(e.occupancy().slots_used, 0);
    assert_eq!(e.egress_halves().next().unwrap().stats.tail_probes, 1);
}

/// The RTO comes from the measured local RTT but never below the floor: a
/// responder answering in 10 µs does not make a 40 µs stall a loss.
#[test]
fn egress_rto_has_a_floor_above_the_measured_local_rtt() {
    assert!(
        EngineConfig::default().egress.min_rto >= Duration::from_millis(10),
        "a lossless DC: the default floor is a responder stall, not a µs RTT"
    );
    for floor in [
        EngineConfig::default().egress.min_rto,
        Duration::from_millis(5),
    ] {
        let mut c = cfg(AckPolicy::Edge);
        c.egress.min_rto = floor;
        let mut e = QpEngine::new(c);
        let t = Time::from_micros(1);
        for i in 0..20u32 {
            let at = t + Duration::from_micros(u64::from(i) * 100);
            feed(&mut e, at, &[(10 + i, Opcode::RC_SEND_ONLY, true)]);
            let ack = response(Opcode::RC_ACK, 10 + i, Syndrome::ACK_UNLIMITED, 0);
            e.handle_dc(at + Duration::from_micros(10), &ack);
            drain(&mut e);
        }
        let at = t + Duration::from_millis(3);
        feed(&mut e, at, &[(30, Opcode::RC_SEND_ONLY, true)]);
        let rto = e.poll_timeout().expect("timed").since(at);
        assert_eq!(rto, floor, "RTO with a 10 µs measured RTT");
    }
}

/// A responder that stalls (a software responder descheduled, a PFC
/// storm) for longer than 16 back-offs is not dead: rxe's own requester
/// would still be waiting. Each timeout resends only the oldest packet, and
/// the flow continues when the responder does.
#[test]
fn egress_survives_a_responder_stall_of_two_seconds() {
    let (mut e, t) = edge_engine();
    let burst: Vec<(u32, Opcode, bool)> = (10..42)
        .map(|psn| (psn, Opcode::RC_SEND_ONLY, psn % 8 == 0))
        .collect();
    assert_eq!(feed(&mut e, t, &burst).len(), 32);
    let until = t + Duration::from_secs(2);
    let out = run_timers(&mut e, until);
    assert_eq!(errors(&out), 0, "gave up on a stalled responder");
    let resent = injected(&out);
    let eg = e.egress_halves().next().unwrap();
    assert!(eg.stats.timeouts >= 8, "{:?}", eg.stats);
    assert_eq!(
        resent,
        vec![10; eg.stats.timeouts as usize],
        "each timeout resends the oldest packet alone"
    );
    // The responder wakes up with everything received: its answer to the
    // resent packet (a duplicate) carries how far it got.
    e.handle_dc(
        until,
        &response(Opcode::RC_ACK, 41, Syndrome::ACK_UNLIMITED, 0),
    );
    let out = drain(&mut e);
    assert_eq!(delivered(&out), vec![41]);
    assert_eq!(e.occupancy().slots_used, 0);
}

/// Give-up is a time without progress, not a count of timeouts: a dead
/// responder fails the flow after `give_up`, not before.
#[test]
fn egress_gives_up_after_the_give_up_time_without_progress() {
    let mut c = cfg(AckPolicy::Edge);
    c.egress.give_up = Duration::from_secs(1);
    let mut e = QpEngine::new(c);
    let t = Time::from_micros(1);
    feed(&mut e, t, &[(10, Opcode::RC_SEND_ONLY, true)]);
    // Progress at 0.5 s restarts the clock.
    let half = t + Duration::from_millis(500);
    let out = run_timers(&mut e, half);
    assert_eq!(errors(&out), 0);
    e.handle_dc(
        half,
        &response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0),
    );
    feed(&mut e, half, &[(11, Opcode::RC_SEND_ONLY, true)]);
    let out = run_timers(&mut e, half + Duration::from_millis(999));
    assert_eq!(errors(&out), 0, "gave up before 1 s without progress");
    let out = run_timers(
        &mut e,
        half + Duration::from_millis(1000) + c.egress.max_rto,
    );
    assert_eq!(errors(&out), 1, "gave up within one RTO after 1 s");
    assert_eq!(e.egress_halves().next().unwrap().stats.gave_up, 1);
    assert_eq!(e.occupancy().slots_used, 0);
}

/// A responder whose receive queue stays empty answers every resend with an
/// RNR NAK. Under RDMA-CM's `min_rnr_timer` of 0 each NAK asks for 655 ms:
/// a budget counted in NAKs (1,000) held the buffer for 11 minutes and the
/// pseudo-ACKed requester never heard (issue 18, sweep seed 289). The
/// budget is a time: the flow fails once RNR NAKs alone have lasted
/// `rnr_give_up`, and not before.
#[test]
fn egress_gives_up_on_rnr_naks_after_rnr_give_up() {
    let c = cfg(AckPolicy::Edge);
    let give_up = c.egress.rnr_give_up;
    let mut e = QpEngine::new(c);
    let t0 = Time::from_micros(1);
    feed(&mut e, t0, &[(10, Opcode::RC_SEND_ONLY, true)]);
    let mut now = t0;
    let mut naks = 0u32;
    let failed_at = loop {
        // RNR NAK, timer 0 = 655.36 ms; then the engine resends when it ends.
        e.handle_dc(
            now,
            &response(Opcode::RC_ACK, 10, Syndrome::RnrNak { timer: 0 }, 0),
        );
        naks += 1;
        let out = drain(&mut e);
        if errors(&out) > 0 {
            break now;
        }
        assert!(naks < 1000, "still retrying after {naks} RNR NAKs");
        now = e.poll_timeout().expect("an RNR wait");
        e.handle_timeout(now);
        let out = drain(&mut e);
        assert_eq!(errors(&out), 0, "failed on a timer, not on an RNR NAK");
    };
    let lasted = failed_at.since(t0);
    assert!(
        lasted >= give_up,
        "gave up after {lasted:?} of RNR NAKs, before rnr_give_up {give_up:?}"
    );
    assert!(
        lasted < give_up + Duration::from_millis(700),
        "gave up after {lasted:?}: more than one RNR wait past {give_up:?}"
    );
    assert_eq!(e.egress_halves().next().unwrap().stats.gave_up, 1);
    assert_eq!(e.occupancy().slots_used, 0, "the buffer is freed");
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
        packet: request(Opcode::RC_SEND_ONLY, 10, true, 8, 0),
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

#[test]
fn site_config_sets_the_egress_timers() {
    let text = r#"site = "t"
[dc]
local_prefixes = ["10.1.0.0/16"]
remote_prefixes = ["10.2.0.0/16"]
retransmit_floor = "5ms"
give_up_after = "2s"
[wan]
insecure = true
[[wan.paths]]
name = "p0"
remote = "192.0.2.1:7400"
rtt = "30ms"
[buffer]
size = "64MiB"
"#;
    let site = soya_config::parse_str(text, "t.toml").unwrap();
    let e = EngineConfig::from_site(&site).egress;
    assert_eq!(
        (e.min_rto, e.give_up, e.tail_probe),
        (
            Duration::from_millis(5),
            Duration::from_secs(2),
            Duration::from_millis(120)
        ),
        "the tail probe waits 4 WAN round trips"
    );
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
    let mut queue: VecDeque<(u32, bool)> = VecDeque::new();
    let (mut expected, mut duplicates, mut longest) = (1000u32, 0u32, 0usize);
    let step = Duration::from_micros(250);
    let mut now = t0;
    for _ in 0..40_000 {
        queue.extend(sent_with_ack_req(&drain(&mut e)));
        longest = longest.max(queue.len());
        if let Some((psn, ack_req)) = queue.pop_front() {
            let ack = if psn == expected {
                expected += 1;
                ack_req.then_some(psn)
            } else {
                assert!(psn < expected, "a gap at {psn}: nothing is lost here");
                duplicates += 1;
                Some(expected - 1)
            };
            if let Some(a) = ack {
                e.handle_dc(
                    now,
                    &response(Opcode::RC_ACK, a, Syndrome::ACK_UNLIMITED, 0),
                );
            }
        }
        now += step;
        if e.poll_timeout().is_some_and(|d| d <= now) {
            e.handle_timeout(now);
        }
        if expected == 1000 + 3072 && queue.is_empty() {
            break;
        }
    }
    let eg = e.egress_halves().next().unwrap();
    assert_eq!(expected, 1000 + 3072, "everything executed: {:?}", eg.stats);
    assert_eq!(
        (duplicates, eg.stats.timeouts, eg.stats.retransmitted),
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

/// Backpressure withholds pseudo-ACKs; if that lasts longer than the
/// requester's ACK timeout (67 ms with perftest) it would resend its whole
/// window. The last pseudo-ACK is repeated meanwhile: it acknowledges
/// nothing new (the buffer is full), but rxe restarts its retransmission
/// timer on every response it processes.
#[test]
fn withheld_acks_repeat_the_last_one_until_the_buffer_drains() {
    let (mut e, t) = nearly_full_engine();
    assert_eq!(drained_acks(&mut e).last().unwrap().0, 103, "then withheld");
    // 100 ms of a full buffer: the ACK of 103 again, every 10 ms.
    let until = t + Duration::from_millis(100);
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
    let expected = (HOLD_ACK_FOR.as_millis() / 10) as usize;
    assert!(
        (expected - 1..=expected).contains(&held.len()),
        "{} repeats",
        held.len()
    );
}

/// An egress engine whose injection window has grown to 128: a first
/// 64-packet WRITE (PSNs 936..=999) went out whole and was acknowledged at
/// once. Returns it and the time of all that.
fn warmed_egress() -> (QpEngine, Time) {
    let (mut e, t) = edge_engine();
    let warm: Vec<(u32, Opcode, bool)> = (936..1000u32)
        .map(|psn| (psn, Opcode::RC_WRITE_MIDDLE, psn == 999))
        .collect();
    assert_eq!(feed(&mut e, t, &warm).len(), 64);
    e.handle_dc(
        t,
        &response(Opcode::RC_ACK, 999, Syndrome::ACK_UNLIMITED, 0),
    );
    drain(&mut e);
    (e, t)
}

/// A responder that stalls with packets queued (not lost): the timeout
/// resends the oldest packet; the responder's next answers cover more than
/// that one, so what was in flight stays in flight. Going back N here
/// resent everything behind the first ACK, duplicates the responder had
/// queued all along (seen against rxe at 300 ms RTT).
#[test]
fn egress_does_not_go_back_n_after_a_timeout_on_a_responder_that_only_stalled() {
    let (mut e, t0) = warmed_egress();
    // Two 64-packet WRITEs, AckReq on each last packet.
    let burst: Vec<(u32, Opcode, bool)> = (0..128u32)
        .map(|i| {
            let op = match i % 64 {
                0 => Opcode::RC_WRITE_FIRST,
                63 => Opcode::RC_WRITE_LAST,
                _ => Opcode::RC_WRITE_MIDDLE,
            };
            (1000 + i, op, i % 64 == 63)
        })
        .collect();
    let mut queue: VecDeque<(u32, bool)> = feed(&mut e, t0, &burst).into();
    assert_eq!(queue.len(), 128);
    // The responder stalls 60 ms (past the 50 ms RTO), then works through
    // its queue at one packet per ms: ACKs for 1063 and 1127, and for the
    // resent head, a duplicate, the re-ACK of the last it executed.
    let mut expected = 1000u32;
    let mut duplicates = 0;
    for ms in 0..400u64 {
        let now = t0 + Duration::from_millis(ms);
        if e.poll_timeout().is_some_and(|d| d <= now) {
            e.handle_timeout(now);
        }
        queue.extend(sent_with_ack_req(&drain(&mut e)));
        if ms < 60 {
            continue;
        }
        if let Some((psn, ack_req)) = queue.pop_front() {
            let ack = if psn == expected {
                expected += 1;
                ack_req.then_some(psn)
            } else {
                duplicates += 1;
                Some(expected - 1)
            };
            if let Some(a) = ack {
                e.handle_dc(
                    now,
                    &response(Opcode::RC_ACK, a, Syndrome::ACK_UNLIMITED, 0),
                );
            }
        }
    }
    queue.extend(sent_with_ack_req(&drain(&mut e)));
    let eg = e.egress_halves().next().unwrap();
    assert_eq!(expected, 1128, "{:?}", eg.stats);
    // The resent head (twice: its original's ACK, alone, cannot tell a
    // stall from a loss) and what one ACK let out before the responder's
    // next answer showed it had everything; not the 64 packets behind it.
    assert!(
        duplicates <= 4 && eg.stats.retransmitted <= 4,
        "{duplicates} duplicates: {:?}",
        eg.stats
    );
    assert_eq!(e.occupancy().slots_used, 0);
}

/// The discriminating step of the above: after a timeout resent the oldest
/// packet, an answer beyond it proves the responder has more than that
/// packet; the packets sent before the timeout behind the answer are still
/// in flight (queued at a slow responder), not lost, and are not resent.
#[test]
fn egress_keeps_in_flight_what_an_answer_past_the_resent_head_shows_received() {
    let (mut e, t0) = warmed_egress();
    let burst: Vec<(u32, Opcode, bool)> = (1000..1128u32)
        .map(|psn| (psn, Opcode::RC_WRITE_MIDDLE, psn == 1063 || psn == 1127))
        .collect();
    assert_eq!(feed(&mut e, t0, &burst).len(), 128);
    // Nothing for an RTO: the oldest packet goes again, asking.
    let rto = e.poll_timeout().unwrap();
    e.handle_timeout(rto);
    assert_eq!(sent_with_ack_req(&drain(&mut e)), vec![(1000, true)]);
    // The responder's answer to it: it had executed up to 1063 and is
    // still working through the rest.
    let t1 = rto + Duration::from_millis(5);
    e.handle_dc(
        t1,
        &response(Opcode::RC_ACK, 1063, Syndrome::ACK_UNLIMITED, 0),
    );
    let out = drain(&mut e);
    assert_eq!(delivered(&out), vec![1063]);
    assert!(
        injected(&out).is_empty(),
        "resent behind the answer: {:?}",
        injected(&out)
    );
    e.handle_dc(
        t1,
        &response(Opcode::RC_ACK, 1127, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![1127]);
    let eg = e.egress_halves().next().unwrap();
    assert_eq!((eg.stats.timeouts, eg.stats.retransmitted), (1, 1));
    assert_eq!(e.occupancy().slots_used, 0);
}
