//! The far gateway (B, at the responder's site) crashes mid-stream and
//! restarts at once (issue 35): site A resumes its flow toward the new
//! incarnation instead of failing it. Two sites in virtual time, an RC
//! responder that behaves as rxe_resp.c (in-order execution, duplicates
//! re-ACKed or replayed, never executed twice), a requester that never
//! retransmits on its own (so the gateways alone must recover), WAN loss.
//!
//! The invariant: what the responder's application saw (placed WRITEs,
//! received SENDs, executed READs and atomics) is every request once, in
//! order, with its bytes; what the requester saw is every READ response
//! and atomic answer with the right bytes, every request acknowledged, no
//! error; and no QP was failed.

use std::collections::VecDeque;

use super::*;
use crate::roce::{AtomicEth, NakCode};
use soya_config::AckPolicy;

const REQ_QPN: u32 = 0x11;
const PMTU: usize = 1024;
/// Packets per WRITE or SEND message, and per READ.
const MSG_PACKETS: u32 = 3;
/// PSNs the requester sends past its last acknowledged one (rxe: 128).
const WINDOW: u32 = 96;
const FIRST_PSN: u32 = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write,
    Send,
    Read,
    FetchAdd,
}

fn to_requester() -> builders::ReplyTo {
    builders::ReplyTo {
        ip: IpHeader::v4(RESPONDER, REQUESTER),
        src_port: 0xc000,
        dest_qp: REQ_QPN,
    }
}

/// The bytes of the `i`-th packet of PSN `psn`'s payload.
fn payload(psn: u32, salt: u8) -> Vec<u8> {
    (0..PMTU)
        .map(|i| (psn as u8).wrapping_mul(31) ^ (i as u8) ^ salt)
        .collect()
}

/// One request packet of the requester.
struct Req {
    psn: u32,
    packet: Vec<u8>,
    /// PSNs it occupies (a READ: its responses).
    span: u32,
    op: Op,
}

/// The requester's stream of `messages` messages of `op`, in order.
fn stream(op: Op, messages: u32) -> Vec<Req> {
    let ip = IpHeader::v4(REQUESTER, RESPONDER);
    let mut out = Vec::new();
    let mut psn = FIRST_PSN;
    for m in 0..messages {
        let va = 0x10_0000 + u64::from(m) * 4096;
        match op {
            Op::Write | Op::Send => {
                for i in 0..MSG_PACKETS {
                    let (first, last) = (i == 0, i == MSG_PACKETS - 1);
                    let code = match (op, first, last) {
                        (Op::Write, true, _) => Opcode::RC_WRITE_FIRST,
                        (Op::Write, false, false) => Opcode::RC_WRITE_MIDDLE,
                        (Op::Write, false, true) => Opcode::RC_WRITE_LAST,
                        (_, true, _) => Opcode::RC_SEND_FIRST,
                        (_, false, false) => Opcode::RC_SEND_MIDDLE,
                        (_, false, true) => Opcode::RC_SEND_LAST,
                    };
                    let reth = Reth {
                        va,
                        rkey: 7,
                        len: MSG_PACKETS * PMTU as u32,
                    };
                    out.push(Req {
                        psn,
                        packet: request(ip, code, psn, last, reth, &payload(psn, 0)),
                        span: 1,
                        op,
                    });
                    psn += 1;
                }
            }
            Op::Read => {
                let reth = Reth {
                    va,
                    rkey: 7,
                    len: MSG_PACKETS * PMTU as u32,
                };
                let packet = request(ip, Opcode::RC_READ_REQUEST, psn, true, reth, &[]);
                out.push(Req {
                    psn,
                    packet,
                    span: MSG_PACKETS,
                    op,
                });
                psn += MSG_PACKETS;
            }
            Op::FetchAdd => {
                let mut repr = builders::request(
                    ip,
                    RS_QPN,
                    Opcode::RC_FETCH_ADD,
                    Psn::new(psn),
                    true,
                    EMPTY_RETH,
                );
                repr.ext.atomic = AtomicEth {
                    va: 0x2000,
                    rkey: 7,
                    swap_add: 1,
                    compare: 0,
                };
                out.push(Req {
                    psn,
                    packet: repr.to_vec(&[]).unwrap(),
                    span: 1,
                    op,
                });
                psn += 1;
            }
        }
    }
    out
}

/// An RC responder as rxe_resp.c behaves (`check_psn`, `execute`,
/// `duplicate_request`), with its application's view.
#[derive(Default)]
struct Responder {
    epsn: u32,
    msn: u32,
    nak_sent: bool,
    /// What its application saw, in order: (PSN, opcode, payload).
    executed: Vec<(u32, Opcode, Vec<u8>)>,
    /// Saved READ and atomic resources (rxe: `max_dest_rd_atomic` of them):
    /// (first PSN, PSNs, original value of an atomic).
    resources: VecDeque<(u32, u32, Option<u64>)>,
    /// The atomic counter.
    counter: u64,
    duplicates: usize,
    replays: usize,
}

const RESOURCES: usize = 16;

impl Responder {
    fn new() -> Responder {
        Responder {
            epsn: FIRST_PSN,
            ..Responder::default()
        }
    }

    fn read_answer(&self, psn: u32, n: u32) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let op = Opcode::read_response(i == 0, i == n - 1);
                let data = payload(psn + i, 0xa5);
                builders::response(
                    &to_requester(),
                    op,
                    Psn::new(psn + i),
                    Syndrome::ACK_UNLIMITED,
                    self.msn,
                )
                .to_vec(&data)
                .unwrap()
            })
            .collect()
    }

    fn atomic_answer(&self, psn: u32, original: u64) -> Vec<u8> {
        let mut r = builders::response(
            &to_requester(),
            Opcode::RC_ATOMIC_ACK,
            Psn::new(psn),
            Syndrome::ACK_UNLIMITED,
            self.msn,
        );
        r.ext.atomic_ack = original;
        r.to_vec(&[]).unwrap()
    }

    fn ack(&self, psn: u32) -> Vec<u8> {
        builders::ack(&to_requester(), Psn::new(psn), self.msn)
            .to_vec(&[])
            .unwrap()
    }

    /// Its answers to one request packet.
    fn on_request(&mut self, pkt: &[u8]) -> Vec<Vec<u8>> {
        let p = RocePacket::parse_verified(pkt).expect("a valid request");
        let psn = p.psn().value();
        let d = p.psn().diff(Psn::new(self.epsn));
        if d > 0 {
            // Ahead of the expected PSN: one NAK-seq, then silence.
            if std::mem::replace(&mut self.nak_sent, true) {
                return Vec::new();
            }
            let nak = builders::nak(
                &to_requester(),
                Psn::new(self.epsn),
                NakCode::PsnSequenceError,
                self.msn,
            );
            return vec![nak.to_vec(&[]).unwrap()];
        }
        if d < 0 {
            // A duplicate: SEND/WRITE re-ACKed with the last executed PSN
            // (C9-105), READ replayed and atomic answered from the saved
            // resource, or dropped when none is saved.
            self.duplicates += 1;
            let res = self.resources.iter().find(|r| r.0 == psn).copied();
            return match (p.info.kind, res) {
                (OpKind::ReadRequest, Some((first, n, _))) => {
                    self.replays += 1;
                    self.read_answer(first, n)
                }
                (OpKind::Atomic, Some((first, _, Some(v)))) => {
                    self.replays += 1;
                    vec![self.atomic_answer(first, v)]
                }
                (OpKind::ReadRequest | OpKind::Atomic, _) => Vec::new(),
                _ => vec![self.ack(self.epsn - 1)],
            };
        }
        self.nak_sent = false;
        self.executed
            .push((psn, p.bth.opcode, p.payload().to_vec()));
        let mut out = Vec::new();
        match p.info.kind {
            OpKind::ReadRequest => {
                let n = (p.ext.reth.len as usize).div_ceil(PMTU).max(1) as u32;
                self.msn += 1;
                out = self.read_answer(psn, n);
                self.save(psn, n, None);
                self.epsn += n;
            }
            OpKind::Atomic => {
                let original = self.counter;
                self.counter += p.ext.atomic.swap_add;
                self.msn += 1;
                out.push(self.atomic_answer(psn, original));
                self.save(psn, 1, Some(original));
                self.epsn += 1;
            }
            _ => {
                if p.info.completes_message() {
                    self.msn += 1;
                }
                self.epsn += 1;
                if p.bth.ack_req {
                    out.push(self.ack(psn));
                }
            }
        }
        out
    }

    fn save(&mut self, psn: u32, n: u32, original: Option<u64>) {
        if self.resources.len() == RESOURCES {
            self.resources.pop_front();
        }
        self.resources.push_back((psn, n, original));
    }
}

/// The requester's view: what it was told.
#[derive(Default)]
struct Requester {
    /// Next request to send (index into the stream).
    next: usize,
    /// Highest PSN acknowledged (pseudo-ACK, real ACK, or answer).
    acked: Option<u32>,
    /// Every READ response and atomic answer, first copy of each PSN.
    answers: Vec<(u32, Vec<u8>, u64)>,
    duplicate_answers: usize,
    error_naks: usize,
    seen: usize,
    /// Retransmissions after its ACK timeout (rxe `retransmit_timer`: it
    /// goes back to its oldest unacknowledged PSN).
    retries: usize,
    progress_at: Option<Time>,
}

/// The requester's ACK timeout (rxe and perftest: about 67 ms).
const ACK_TIMEOUT: Duration = Duration::from_millis(67);

impl Requester {
    fn window_open(&self, stream: &[Req]) -> bool {
        let Some(r) = stream.get(self.next) else {
            return false;
        };
        let base = self.acked.map_or(FIRST_PSN, |a| a + 1);
        // At most `max_rd_atomic` READs and atomics outstanding, which
        // the responder's `max_dest_rd_atomic` matches (RESOURCES): as
        // RDMA-CM negotiates them, and as the IB spec requires.
        let outstanding = stream[..self.next]
            .iter()
            .filter(|q| q.op == Op::Read || q.op == Op::FetchAdd)
            .filter(|q| q.psn + q.span > base)
            .count();
        let reads = matches!(r.op, Op::Read | Op::FetchAdd);
        r.psn + r.span <= base + WINDOW && !(reads && outstanding >= RESOURCES)
    }

    /// Reads what the gateway sent it since last time, as rxe_comp.c
    /// does: in order. An answer is taken only at the PSN it waits for
    /// (an earlier one is a duplicate, dropped); an answer or ACK past a
    /// READ or atomic still unanswered makes it retry from there
    /// (`COMPST_ERROR_RETRY`), and so does a gap inside a READ's answer.
    fn absorb(&mut self, p: &Pair, stream: &[Req]) {
        for b in &p.to_requester[self.seen..] {
            let Ok(r) = RocePacket::parse_verified(b) else {
                continue;
            };
            let psn = r.psn().value();
            match (r.info.kind, r.ext.aeth.map(|a| a.syndrome)) {
                (OpKind::Ack, Some(Syndrome::Nak(NakCode::PsnSequenceError))) => {
                    self.ack(stream, psn.wrapping_sub(1));
                    // Go back to the PSN the gateway expects.
                    if let Some(i) = stream.iter().position(|q| q.psn == psn) {
                        self.next = self.next.min(i);
                    }
                }
                (OpKind::Ack, Some(Syndrome::Nak(_))) => self.error_naks += 1,
                (OpKind::Ack, Some(Syndrome::Ack { .. })) => self.ack(stream, psn),
                (OpKind::ReadResponse | OpKind::AtomicAck, _) => {
                    let base = self.acked.map_or(FIRST_PSN, |a| a + 1);
                    if psn < base {
                        self.duplicate_answers += 1;
                        continue;
                    }
                    // The answer it waits for: the oldest READ or atomic
                    // not answered, at its next PSN.
                    let Some(i) = self.waiting(stream) else {
                        continue;
                    };
                    let q = &stream[i];
                    let want = base.max(q.psn);
                    if psn != want {
                        if psn > want {
                            self.retry(i);
                        } else {
                            self.duplicate_answers += 1;
                        }
                        continue;
                    }
                    self.answers
                        .push((psn, r.payload().to_vec(), r.ext.atomic_ack));
                    // Everything before it is done too.
                    self.set_acked(psn);
                }
                _ => {}
            }
        }
        self.seen = p.to_requester.len();
    }

    /// The oldest READ or atomic sent and not fully answered.
    fn waiting(&self, stream: &[Req]) -> Option<usize> {
        let base = self.acked.map_or(FIRST_PSN, |a| a + 1);
        stream[..self.next]
            .iter()
            .position(|q| matches!(q.op, Op::Read | Op::FetchAdd) && q.psn + q.span > base)
    }

    /// An ACK of everything up to `psn`: past a READ or atomic still
    /// waiting for its answer, an implied NAK (retry from it).
    fn ack(&mut self, stream: &[Req], psn: u32) {
        if let Some(i) = self.waiting(stream) {
            let base = self.acked.map_or(FIRST_PSN, |a| a + 1);
            let q = &stream[i];
            if psn >= q.psn.max(base) {
                self.set_acked(q.psn.max(base) - 1);
                self.retry(i);
                return;
            }
        }
        self.set_acked(psn);
    }

    fn retry(&mut self, i: usize) {
        self.retries += 1;
        self.next = self.next.min(i);
    }

    fn set_acked(&mut self, psn: u32) {
        if self.acked.is_none_or(|a| psn > a) {
            self.acked = Some(psn);
            self.progress_at = None;
        }
    }

    /// Its retransmission timer: nothing acknowledged for `ACK_TIMEOUT`
    /// while requests are outstanding sends them again from the oldest.
    fn on_time(&mut self, now: Time, stream: &[Req]) {
        let base = self.acked.map_or(FIRST_PSN, |a| a + 1);
        let oldest = stream[..self.next]
            .iter()
            .position(|q| q.psn + q.span > base);
        let Some(i) = oldest else {
            self.progress_at = None;
            return;
        };
        let since = *self.progress_at.get_or_insert(now);
        if now - since >= ACK_TIMEOUT {
            self.retries += 1;
            self.next = i;
            self.progress_at = Some(now);
        }
    }
}

/// What one run saw.
struct Outcome {
    responder: Responder,
    requester: Requester,
    stream: Vec<Req>,
    events: Vec<(Time, SiteEvent)>,
    events_b: Vec<(Time, SiteEvent)>,
    resumed: u64,
    resent: u64,
    /// New requests the draining gateway refused (a planned restart).
    refused: u64,
}

/// How a gateway restarts mid-stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Restart {
    /// B (the far gateway) crashes and restarts at once, with no state.
    FarCrash,
    /// A planned restart (`systemctl restart`: SIGTERM, drain, CLOSE
    /// "restart", a new process) of A (`near`) or of B.
    Planned { near: bool },
}

/// Where a planned restart is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Before,
    Draining,
    Done,
}

/// Sends `messages` messages of `op` through A and B; once the responder
/// executed `crash_after` requests, B crashes and restarts at once (no
/// state), while the rest is on its way. Every `drop_every`-th WAN
/// datagram is lost (0: none).
fn run(op: Op, messages: u32, crash_after: usize, drop_every: usize) -> Outcome {
    run_with(op, messages, Restart::FarCrash, crash_after, drop_every)
}

/// [`run`] with the restart `restart` once the responder executed `at`
/// requests.
fn run_with(op: Op, messages: u32, restart: Restart, at: usize, drop_every: usize) -> Outcome {
    run_policy(AckPolicy::Edge, op, messages, restart, at, drop_every)
}

/// A gateway with the ACK policy `policy` (`off`: every QP stays a
/// tunnel), a new incarnation if `first_nonce` is new.
fn site_policy(client: bool, first_nonce: u64, policy: AckPolicy) -> Site {
    let mut engine = EngineConfig::default();
    engine.ack.policy = policy;
    site_with(client, first_nonce, engine)
}

/// [`run_with`] through gateways with the ACK policy `policy`.
fn run_policy(
    policy: AckPolicy,
    op: Op,
    messages: u32,
    restart: Restart,
    at: usize,
    drop_every: usize,
) -> Outcome {
    let stream = stream(op, messages);
    let last = stream.last().map(|r| r.psn + r.span - 1).unwrap();
    let mut p = Pair::with(
        site_policy(true, 0x1000, policy),
        site_policy(false, 0x2000, policy),
    );
    p.drop_every = drop_every;
    let mut rs = Responder::new();
    let mut rq = Requester::default();
    let mut at_responder = 0;
    let mut phase = Phase::Before;
    let mut refused = 0;
    let limit = p.now + Duration::from_secs(30);
    loop {
        // The requester sends what its window allows.
        while rq.window_open(&stream) {
            p.a.handle_dc(p.now, &stream[rq.next].packet);
            rq.next += 1;
        }
        p.drain();
        if let (Phase::Draining, Restart::Planned { near }) = (phase, restart) {
            let victim = if near { &mut p.a } else { &mut p.b };
            if victim.is_restartable() {
                // The drain is done: CLOSE "restart" goes out, the process
                // exits, and the new one starts with no state.
                refused = victim.dc_counters().rx_draining;
                assert!(victim.close_for_restart(p.now));
                p.drain();
                if near {
                    p.a = site_policy(true, 0x7000, policy);
                } else {
                    p.b = site_policy(false, 0x9000, policy);
                }
                phase = Phase::Done;
            }
        }
        // The responder answers what B re-injected.
        while at_responder < p.to_responder.len() {
            let pkt = p.to_responder[at_responder].clone();
            at_responder += 1;
            let is_request = RocePacket::parse_verified(&pkt)
                .is_ok_and(|r| r.info.is_request() && r.bth.dest_qp == RS_QPN);
            if !is_request {
                continue;
            }
            for answer in rs.on_request(&pkt) {
                p.b.handle_dc(p.now, &answer);
            }
            if phase == Phase::Before && rs.executed.len() >= at {
                match restart {
                    // kill -9 and an immediate restart, a new generation:
                    // the answers B just took die with it, what it sent
                    // before is on the wire.
                    Restart::FarCrash => {
                        p.b = site_policy(false, 0x9000, policy);
                        phase = Phase::Done;
                    }
                    // SIGTERM: new requests from its DC are refused (the
                    // requester sends them again), what it holds goes on.
                    Restart::Planned { near } => {
                        if near {
                            p.a.start_drain();
                        } else {
                            p.b.start_drain();
                        }
                        phase = Phase::Draining;
                    }
                }
            }
            p.drain();
        }
        rq.absorb(&p, &stream);
        rq.on_time(p.now, &stream);
        assert_eq!(rq.error_naks, 0, "{op:?}: an error reached the requester");
        let done = rq.acked == Some(last) && rq.next == stream.len();
        if done && phase == Phase::Done {
            break;
        }
        assert!(
            p.now < limit,
            "{op:?}: not done within 30 s of virtual time: acked {:?} of {last}, \
             executed {}, error NAKs {}, events {:?}",
            rq.acked,
            rs.executed.len(),
            rq.error_naks,
            p.events_a
        );
        p.step();
    }
    // Let late duplicates land.
    p.run_for(Duration::from_millis(200));
    while at_responder < p.to_responder.len() {
        let pkt = p.to_responder[at_responder].clone();
        at_responder += 1;
        for answer in rs.on_request(&pkt) {
            p.b.handle_dc(p.now, &answer);
        }
        p.drain();
    }
    rq.absorb(&p, &stream);
    let e = &p.a.engine().stats;
    Outcome {
        resumed: e.halves_resumed,
        resent: e.packets_resent_on_resume,
        refused,
        responder: rs,
        requester: rq,
        stream,
        events: p.events_a.clone(),
        events_b: p.events_b.clone(),
    }
}

/// The invariant: nothing lost, duplicated or misordered at either
/// application, no error, no QP failed, the flow resumed.
fn check(o: &Outcome) {
    let restarted: Vec<_> = o
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            SiteEvent::TwinRestarted {
                flows_failed,
                flows_resumed,
                ..
            } => Some((*flows_failed, *flows_resumed)),
            _ => None,
        })
        .collect();
    assert_eq!(
        restarted,
        vec![(0, 1)],
        "one restart: nothing failed, one flow resumed"
    );
    assert_eq!(o.resumed, 1);
    check_applications(o);
}

/// What the applications saw: every request executed once, in order, with
/// its bytes; every answer, in order, with its bytes; no error.
fn check_applications(o: &Outcome) {
    let rq = &o.requester;
    let rs = &o.responder;
    assert_eq!(rq.error_naks, 0, "no error reached the requester");
    // The responder's application: every request once, in order, intact.
    let want: Vec<(u32, Opcode, Vec<u8>)> = o
        .stream
        .iter()
        .map(|r| {
            let p = RocePacket::parse_verified(&r.packet).unwrap();
            (r.psn, p.bth.opcode, p.payload().to_vec())
        })
        .collect();
    assert_eq!(rs.executed.len(), want.len(), "every request executed once");
    assert!(rs.executed == want, "in order, with its bytes");
    // The requester's application: every answer, in order, intact.
    let mut answers = Vec::new();
    let mut counter = 0;
    for r in &o.stream {
        match r.op {
            Op::Read => {
                for i in 0..r.span {
                    answers.push((r.psn + i, payload(r.psn + i, 0xa5), 0));
                }
            }
            Op::FetchAdd => {
                answers.push((r.psn, Vec::new(), counter));
                counter += 1;
            }
            _ => {}
        }
    }
    assert_eq!(rq.answers.len(), answers.len(), "every answer");
    assert!(rq.answers == answers, "answers in order, with their bytes");
}

/// `run`, then says what happened (`what` names the case) and `check`s it.
fn run_and_check(
    what: &str,
    op: Op,
    messages: u32,
    crash_after: usize,
    drop_every: usize,
) -> Outcome {
    let o = run(op, messages, crash_after, drop_every);
    println!(
        "{what}: {} requests executed once; responder saw {} duplicates, replayed {}; \
         A resent {} packets; requester retried {} times, dropped {} duplicate answers",
        o.responder.executed.len(),
        o.responder.duplicates,
        o.responder.replays,
        o.resent,
        o.requester.retries,
        o.requester.duplicate_answers
    );
    check(&o);
    o
}

#[test]
fn a_far_gateway_restarted_mid_write_stream_resumes_and_loses_nothing() {
    let o = run_and_check("write", Op::Write, 120, 90, 0);
    assert!(o.resent > 0, "something was in flight when B crashed");
}

#[test]
fn a_far_gateway_restarted_mid_send_stream_with_wan_loss_resumes() {
    let o = run_and_check("send, WAN loss 1/7", Op::Send, 120, 100, 7);
    assert!(o.resent > 0);
}

#[test]
fn a_far_gateway_restarted_mid_write_stream_with_wan_loss_resumes() {
    run_and_check("write, WAN loss 1/5", Op::Write, 150, 60, 5);
}

#[test]
fn a_far_gateway_restarted_mid_read_stream_resumes_and_loses_nothing() {
    let o = run_and_check("read", Op::Read, 60, 20, 0);
    assert!(o.resent > 0);
}

#[test]
fn a_far_gateway_restarted_mid_read_stream_with_wan_loss_resumes() {
    run_and_check("read, WAN loss 1/6", Op::Read, 60, 35, 6);
}

#[test]
fn a_far_gateway_restarted_mid_atomic_stream_answers_each_atomic_once() {
    run_and_check("fetch-add", Op::FetchAdd, 60, 10, 0);
}

/// A QP with requests both ways: those the twin pseudo-ACKed for the far
/// host died with it, so that QP fails as before (counted), and alone: a
/// QP beside it with requests one way only resumes.
#[test]
fn a_qp_with_requests_both_ways_is_not_resumed_and_fails_alone() {
    let mut p = pair_with_undelivered_writes();
    // RESPONDER's QP writes to REQUESTER's QP (0x11) the other way: B
    // carries it, A re-injects it (an egress half at A).
    let ip = IpHeader::v4(RESPONDER, REQUESTER);
    let mut pkt = vec![0; 512];
    let n = builders::request(
        ip,
        REQ_QPN,
        Opcode::RC_WRITE_ONLY,
        Psn::new(500),
        true,
        EMPTY_RETH,
    )
    .emit(&[], &mut pkt)
    .unwrap();
    p.b.handle_dc(p.now, &pkt[..n]);
    p.run_until(
        |p| p.a.engine().egress_halves().count() == 1,
        "the reverse request at A",
    );
    // A second QP, one way: a READ answered (A learns its requester QPN),
    // then a READ outstanding when B crashes.
    p.a.handle_dc(p.now, &read_request(QP_Y, 7000, 1));
    p.run_until(|p| reads_at_responder(p) == 1, "the first READ at B");
    for r in read_responses(QP_Y, 7000, 1) {
        p.b.handle_dc(p.now, &r);
    }
    p.run_until(|p| responses_received(p, QP_Y) == [7000], "its answer");
    p.a.handle_dc(p.now, &read_request(QP_Y, 7001, 1));
    p.run_until(|p| reads_at_responder(p) == 2, "the second READ at B");
    let before = p.to_responder.len();
    p.b = site_from(false, 0x9000);
    p.run_until(
        |p| {
            p.events_a
                .iter()
                .any(|(_, e)| matches!(e, SiteEvent::TwinRestarted { .. }))
        },
        "the restart seen at A",
    );
    let restarted: Vec<_> = p
        .events_a
        .iter()
        .filter_map(|(_, e)| match e {
            SiteEvent::TwinRestarted {
                flows_failed,
                flows_resumed,
                ..
            } => Some((*flows_failed, *flows_resumed)),
            _ => None,
        })
        .collect();
    // QP 0x22's ingress half fails (a NAK or its poison); QP_Y resumes.
    assert_eq!(restarted.len(), 1);
    assert!(restarted[0].0 >= 1, "{restarted:?}");
    assert_eq!(restarted[0].1, 1, "{restarted:?}");
    let e = &p.a.engine().stats;
    assert_eq!((e.halves_resumed, e.halves_unresumable), (1, 1));
    // Why: requests the other way, which B had pseudo-ACKed.
    assert_eq!(
        (
            e.halves_unresumable_two_way,
            e.halves_unresumable_bytes_lost
        ),
        (1, 0)
    );
    assert!(p.a.engine().egress_halves().next().is_none(), "dropped");
    // The outstanding READ goes to the new incarnation again; the failed
    // QP's WRITEs do not: the new B only moves RESPONDER's QP to error
    // (told by A, `qp::orphan`: payload-free poison packets).
    p.run_until(|p| reads_at_responder(p) == 3, "the READ again at B");
    p.run_for(Duration::from_millis(50));
    let sent: Vec<(u32, Opcode, usize)> = p.to_responder[before..]
        .iter()
        .filter_map(|b| RocePacket::parse_verified(b).ok())
        .filter(|r| r.info.is_request())
        .map(|r| (r.bth.dest_qp, r.bth.opcode, r.payload().len()))
        .collect();
    assert!(
        sent.contains(&(QP_Y.0, Opcode::RC_READ_REQUEST, 0)),
        "{sent:?}"
    );
    assert!(
        sent.iter()
            .all(|&(qp, op, len)| qp == QP_Y.0 || (op == Opcode::RC_SEND_MIDDLE && len == 0)),
        "{sent:?}"
    );
    assert!(
        sent.iter().any(|&(qp, ..)| qp == RS_QPN),
        "the far QP is poisoned"
    );
}

/// A planned restart of A (`near`) or B mid-stream of `op`: the twin that
/// stays heard CLOSE "restart" and kept its flows; nothing failed, lost,
/// duplicated or misordered at either application.
fn planned(op: Op, messages: u32, near: bool, at: usize, drop_every: usize) -> Outcome {
    planned_policy(AckPolicy::Edge, op, messages, near, at, drop_every)
}

/// [`planned`] through gateways with the ACK policy `policy`.
fn planned_policy(
    policy: AckPolicy,
    op: Op,
    messages: u32,
    near: bool,
    at: usize,
    drop_every: usize,
) -> Outcome {
    let o = run_policy(
        policy,
        op,
        messages,
        Restart::Planned { near },
        at,
        drop_every,
    );
    let (victim, survivor_events) = if near {
        ("A", &o.events_b)
    } else {
        ("B", &o.events)
    };
    println!(
        "{op:?}, planned restart of {victim}: {} requests executed once; responder saw {} \
         duplicates; requester retried {} times",
        o.responder.executed.len(),
        o.responder.duplicates,
        o.requester.retries,
    );
    let kept: Vec<usize> = survivor_events
        .iter()
        .filter_map(|(_, e)| match e {
            SiteEvent::TwinRestarting { flows_resumed } => Some(*flows_resumed),
            _ => None,
        })
        .collect();
    assert_eq!(
        kept.len(),
        1,
        "one CLOSE \"restart\" heard: {survivor_events:?}"
    );
    // The survivor saw the next incarnation answer, and says after what
    // pause (`soya status`, `soya_twin_restart_pause_seconds`).
    let pauses: Vec<Duration> = survivor_events
        .iter()
        .filter_map(|(_, e)| match e {
            SiteEvent::TwinReturned { pause } => Some(*pause),
            _ => None,
        })
        .collect();
    assert_eq!(pauses.len(), 1, "one return: {survivor_events:?}");
    assert!(pauses[0] > Duration::ZERO, "{pauses:?}");
    for (_, e) in o.events.iter().chain(&o.events_b) {
        assert!(
            !matches!(
                e,
                SiteEvent::TwinShutDown { .. }
                    | SiteEvent::TwinLost { .. }
                    | SiteEvent::TwinRestarted { .. }
            ),
            "nothing failed: {e:?}"
        );
    }
    check_applications(&o);
    // The requester resends only what the drain refused: no answer died
    // with the old session (WAN loss is the transport's to repair). But a
    // tunnel (policy `off`) keeps no copy of what it forwarded: what was
    // on its way to the far gateway when it closed is lost with it, and
    // the requester's own timer resends it (an RC retransmission, no
    // error), as through any middlebox that restarts.
    if o.refused == 0 && (near || policy != AckPolicy::Off) {
        assert_eq!(o.requester.retries, 0, "an answer died with {victim}");
    }
    o
}

#[test]
fn a_planned_restart_of_the_near_gateway_mid_write_stream_fails_nothing() {
    planned(Op::Write, 120, true, 40, 0);
}

#[test]
fn a_planned_restart_of_the_near_gateway_mid_read_stream_with_wan_loss_fails_nothing() {
    planned(Op::Read, 60, true, 20, 6);
}

#[test]
fn a_planned_restart_of_the_near_gateway_mid_atomic_stream_answers_each_once() {
    planned(Op::FetchAdd, 60, true, 10, 0);
}

#[test]
fn a_planned_restart_of_the_far_gateway_mid_send_stream_with_wan_loss_fails_nothing() {
    let o = planned(Op::Send, 120, false, 50, 7);
    assert_eq!(o.resumed, 1, "A resumed its flow toward the new B");
}

#[test]
fn a_planned_restart_of_the_far_gateway_mid_read_stream_fails_nothing() {
    planned(Op::Read, 60, false, 20, 0);
}

/// A tunnel (policy `off`) holds no copy of what it forwarded: the drain
/// before a planned restart of the requester's gateway waits until the
/// responder has answered everything it forwarded, or those answers would
/// die with the old session and the requester would wait for its timer.
#[test]
fn a_planned_restart_of_a_tunnels_near_gateway_waits_for_its_answers() {
    let o = planned_policy(AckPolicy::Off, Op::Read, 60, true, 20, 0);
    // The requester never resends a READ the responder executed: no
    // answer died with the old session.
    assert_eq!(o.responder.duplicates, 0, "no READ executed twice");
}

#[test]
fn a_planned_restart_of_a_tunnels_near_gateway_mid_write_stream_fails_nothing() {
    let o = planned_policy(AckPolicy::Off, Op::Write, 120, true, 40, 0);
    assert_eq!(
        o.responder.duplicates, 0,
        "no ACK died with the old session"
    );
}

#[test]
fn a_planned_restart_of_a_tunnels_far_gateway_mid_read_stream_fails_nothing() {
    let o = planned_policy(AckPolicy::Off, Op::Read, 60, false, 20, 0);
    assert_eq!(o.responder.duplicates, 0, "no READ executed twice");
}

/// `strict` acknowledges a request only once it is delivered: the drain
/// ends when the last one is both (an entry delivered first and
/// acknowledged after must not linger as owed).
#[test]
fn a_planned_restart_of_a_strict_near_gateway_mid_send_stream_fails_nothing() {
    planned_policy(AckPolicy::Strict, Op::Send, 120, true, 40, 0);
}

#[test]
fn a_planned_restart_of_a_strict_near_gateway_mid_read_stream_fails_nothing() {
    planned_policy(AckPolicy::Strict, Op::Read, 60, true, 20, 0);
}
