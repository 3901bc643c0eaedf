//! The packet-level tests' shared bench: hand-made packets between one
//! requester and one responder host, engines set up at either end of a
//! half, and readers of what an engine output. Every `tests_*` sibling
//! drives the engine through these (the simulator drives it with real RC
//! endpoints; these tests pin individual rules); the rules themselves are
//! pinned by role in `tests_ingress` (pseudo-ACKs), `tests_egress`
//! (re-injection) and `tests_egress_timeouts` (its timers), so that this
//! file stays the one place to read how a test packet is made.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::{EngineConfig, Output, QpEngine};
use super::half::HalfKey;
use super::tests_twin::{twin_request, twin_response};
use super::twin::{Carry, TwinMsg};
use crate::roce::builders::{self, ReplyTo};
use crate::roce::{IpHeader, NakCode, Opcode, Psn, Reth, RocePacket, Syndrome};
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
    builders::request(ip, dest_qp, op, Psn::new(psn), ack_req, reth)
        .to_vec(&vec![0xab; payload])
        .unwrap()
}

/// Where the responder answers the requester's QP.
pub(super) fn to_requester() -> ReplyTo {
    ReplyTo {
        ip: IpHeader::v4(RESPONDER, REQUESTER),
        src_port: 0xc000,
        dest_qp: RQ_QPN,
    }
}

/// A response from the responder to the requester (what the egress twin sees).
pub(super) fn response(op: Opcode, psn: u32, syndrome: Syndrome, payload: usize) -> Vec<u8> {
    builders::response(&to_requester(), op, Psn::new(psn), syndrome, 0)
        .to_vec(&vec![0xcd; payload])
        .unwrap()
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
    assert_eq!(
        drain(&mut e),
        vec![Output::Dc(ack.into())],
        "raw ACK delivered"
    );
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

/// The PSNs of requests forwarded `Carry::Reliable` (held, pseudo-ACKed).
pub(super) fn forwarded(out: &[Output]) -> Vec<u32> {
    forwarded_as(out, Carry::Reliable)
}

/// The PSNs of requests forwarded as is (`Carry::Raw`: a tunnel's, or a
/// resend the responder must replay).
pub(super) fn raw_forwarded(out: &[Output]) -> Vec<u32> {
    forwarded_as(out, Carry::Raw)
}

fn forwarded_as(out: &[Output], how: Carry) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::Twin(TwinMsg::Request { carry, packet }) if *carry == how => {
                Some(RocePacket::parse(packet).unwrap().psn().value())
            }
            _ => None,
        })
        .collect()
}

pub(super) fn injected(out: &[Output]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::Dc(v) => Some(RocePacket::parse(v).unwrap().psn().value()),
            _ => None,
        })
        .collect()
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

/// A responder behind the egress that executes what it was sent in order,
/// one packet per [`Self::execute_one`]: it ACKs what asks and re-ACKs a
/// duplicate with the last PSN it executed (C9-105). Nothing is lost on
/// its link: a gap fails the test.
pub(super) struct InOrderResponder {
    /// Sent to it and not executed yet: (PSN, AckReq).
    pub queue: VecDeque<(u32, bool)>,
    /// The PSN it executes next.
    pub expected: u32,
    /// Packets it had executed already.
    pub duplicates: u32,
}

impl InOrderResponder {
    pub fn new(first_psn: u32) -> Self {
        InOrderResponder {
            queue: VecDeque::new(),
            expected: first_psn,
            duplicates: 0,
        }
    }

    /// Queues what the egress `e` sent since it last looked.
    pub fn receive(&mut self, e: &mut QpEngine) {
        self.queue.extend(sent_with_ack_req(&drain(e)));
    }

    /// Executes the oldest packet it holds, if any, and answers at `now`.
    pub fn execute_one(&mut self, e: &mut QpEngine, now: Time) {
        let Some((psn, ack_req)) = self.queue.pop_front() else {
            return;
        };
        let ack = if psn == self.expected {
            self.expected += 1;
            ack_req.then_some(psn)
        } else {
            assert!(psn < self.expected, "a gap at {psn}: nothing is lost here");
            self.duplicates += 1;
            Some(self.expected - 1)
        };
        if let Some(a) = ack {
            let ack = response(Opcode::RC_ACK, a, Syndrome::ACK_UNLIMITED, 0);
            e.handle_dc(now, &ack);
        }
    }
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
