//! Forgetting quiet halves (`qp::engine::expiry`, issue 17), packet by packet: a
//! quiet half goes with its side-table entries; a half with anything held
//! or armed stays whatever the silence; a failed half keeps answering with
//! its NAK for `idle_after`, then goes; and a QP that resumes after being
//! forgotten (at one gateway, the other, or both) carries on in order, with
//! no error and nothing lost or repeated. The addressing is `tests.rs`'s
//! (REQUESTER at gateway A's site, RESPONDER at B's).

use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::expiry::idle_after;
use super::engine::{EngineConfig, Output, QpEngine};
use super::ingress::Mode;
use super::tests::{
    cfg, drain, drained_acks, ingress_engine, key, request, response, to_requester, REQUESTER,
    RESPONDER, RQ_QPN,
};
use super::tests_twin::{twin_delivered, twin_delivered_msn};
use super::tests_twin_lost::{ack_to, cm_engine, request_to};
use super::twin::{Carry, TwinMsg};
use crate::roce::builders;
use crate::roce::{NakCode, OpKind, Opcode, Psn, RocePacket, Syndrome};
use crate::time::Time;

/// `dc.give_up_after` in these tests: `idle_after` is 15 × this = 3 s.
const GIVE_UP: Duration = Duration::from_millis(200);

fn quick(give_up: Duration) -> EngineConfig {
    let mut c = cfg(AckPolicy::Edge);
    c.egress.give_up = give_up;
    c
}

/// Runs `e`'s protocol timers and its expiry sweeps up to `until`, as the
/// site does; returns what they sent.
fn run(e: &mut QpEngine, until: Time) -> Vec<Output> {
    let mut out = Vec::new();
    while let Some(t) = next_deadline(e).filter(|&t| t <= until) {
        fire_due(e, t);
        out.extend(drain(e));
    }
    out
}

/// `e`'s next deadline: a protocol timer or an expiry sweep.
fn next_deadline(e: &QpEngine) -> Option<Time> {
    e.poll_timeout()
        .into_iter()
        .chain(e.expiry_deadline())
        .min()
}

/// Fires what of `e` is due at `t`: its timers, then its sweep, which must
/// move its deadline past `t` (or the site would spin on it).
fn fire_due(e: &mut QpEngine, t: Time) {
    if e.poll_timeout().is_some_and(|d| d <= t) {
        e.handle_timeout(t);
    }
    if e.expiry_deadline().is_some_and(|d| d <= t) {
        e.expire(t);
        assert!(
            e.expiry_deadline().is_none_or(|d| d > t),
            "the sweep at {t:?} did not move its deadline"
        );
    }
}

#[test]
fn a_quiet_half_is_forgotten_with_its_side_tables_and_counters_kept() {
    // Learned from RDMA-CM (both directions mapped, the far requester's
    // first PSN noted), then one request delivered: nothing held.
    let mut e = cm_engine(700, 5000);
    let t = Time::from_micros(1);
    e.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 5000, true, 8, 0));
    drain(&mut e);
    twin_delivered_msn(&mut e, t, key(), 5000, Some(1));
    drain(&mut e);
    assert_eq!(e.occupancy().slots_used, 0);
    assert_eq!(e.halves(), (1, 0));
    assert_eq!(e.by_requester.len(), 2, "both directions mapped by RDMA-CM");
    assert_eq!(e.cm_start.len(), 1);
    let idle = idle_after(e.config().egress.give_up);
    assert_eq!(idle, Duration::from_secs(60), "15 x the default 4 s");
    // Just short of `idle_after`: still known.
    run(&mut e, t + (idle - Duration::from_millis(1)));
    assert_eq!(e.halves(), (1, 0), "not before idle_after");
    run(&mut e, t + idle * 2);
    assert_eq!(e.halves(), (0, 0), "forgotten");
    assert_eq!(e.stats.halves_expired_ingress, 1);
    assert_eq!(e.stats.halves_expired_failed, 0);
    assert!(e.by_requester.is_empty(), "its QPN mappings went with it");
    assert!(e.cm_start.is_empty(), "and the RDMA-CM starting PSN");
    assert_eq!(e.expiry_deadline(), None, "nothing left: no more sweeps");
    // Its counters stay in the totals.
    assert_eq!(e.ingress_totals().packets, 1);
    assert_eq!(e.ingress_totals().pseudo_acks, 1);
}

#[test]
fn a_half_with_anything_held_or_armed_is_never_forgotten() {
    // Ingress: pseudo-ACKed, never reported delivered (the twin's egress
    // still works on it).
    let mut a = QpEngine::new(quick(GIVE_UP));
    let learn = |e: &mut QpEngine| {
        e.handle_dc(Time::ZERO, &request(Opcode::RC_SEND_ONLY, 99, true, 8, 0));
        drain(e);
        let ack = response(Opcode::RC_ACK, 99, Syndrome::ACK_UNLIMITED, 0);
        e.handle_twin(Time::ZERO, TwinMsg::Response { packet: ack.into() });
        drain(e);
    };
    learn(&mut a);
    let t = Time::from_micros(1);
    a.handle_dc(t, &request(Opcode::RC_SEND_ONLY, 100, true, 8, 0));
    drain(&mut a);
    assert_eq!(a.occupancy().slots_used, 1);
    let idle = idle_after(GIVE_UP);
    run(&mut a, t + idle * 10);
    assert_eq!(a.halves(), (1, 0), "held for 10 x idle_after: kept");
    assert_eq!(a.occupancy().slots_used, 1);
    assert!(a.expiry_deadline().is_some(), "the sweeps went on");
    // Delivered: now quiet, and forgotten once silent for idle_after.
    let t = t + idle * 10;
    twin_delivered(&mut a, t, key(), 100);
    drain(&mut a);
    run(&mut a, t + (idle - Duration::from_millis(1)));
    assert_eq!(a.halves(), (1, 0), "silent since the Delivered only");
    run(&mut a, t + idle * 2);
    assert_eq!(a.halves(), (0, 0));

    // Egress: a request the responder keeps refusing with RNR NAKs (its
    // receive queue empty) for longer than idle_after but less than
    // `dc.rnr_give_up` (20 s): held and armed, so kept.
    let mut b = QpEngine::new(quick(GIVE_UP));
    let t = Time::from_micros(1);
    b.handle_twin(
        t,
        TwinMsg::Request {
            carry: Carry::Reliable,
            packet: request(Opcode::RC_SEND_ONLY, 10, true, 8, 0).into(),
        },
    );
    drain(&mut b);
    let rnr = response(Opcode::RC_ACK, 10, Syndrome::RnrNak { timer: 0 }, 0);
    b.handle_dc(t, &rnr);
    drain(&mut b);
    // Every resend (after each 655 ms RNR wait) gets another RNR NAK.
    let mut now = t;
    let end = t + idle * 5;
    while now < end {
        now += Duration::from_millis(5);
        if !run(&mut b, now).is_empty() {
            b.handle_dc(now, &rnr);
            drain(&mut b);
        }
    }
    assert_eq!(b.halves(), (0, 1), "RNR-NAKed for 5 x idle_after: kept");
    assert_eq!(b.stats.halves_expired_egress, 0);
    let eg = b.egress_halves().next().unwrap();
    assert_eq!((eg.held(), eg.is_failed()), (1, false));
    let rnr_naks = eg.stats.rnr_naks;
    assert!(rnr_naks > 20, "{rnr_naks} RNR NAKs");
    // The receive comes: acknowledged, quiet, forgotten after idle_after.
    b.handle_dc(
        now,
        &response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0),
    );
    drain(&mut b);
    run(&mut b, now + idle * 2);
    assert_eq!(b.halves(), (0, 0));
    assert_eq!(b.stats.halves_expired_egress, 1);
    assert_eq!(b.egress_totals().rnr_naks, rnr_naks, "its counts stay");
}

#[test]
fn a_failed_half_answers_with_its_nak_for_idle_after_then_is_forgotten() {
    let mut e = ingress_engine(AckPolicy::Edge);
    let idle = idle_after(e.config().egress.give_up);
    let t = Time::from_micros(1);
    e.fail_all(t, NakCode::RemoteOperationalError);
    drain(&mut e);
    // Asked again just before idle_after: still answered with the NAK,
    // which starts the silence over.
    let late = t + (idle - Duration::from_millis(1));
    run(&mut e, late);
    e.handle_dc(late, &request(Opcode::RC_SEND_ONLY, 100, true, 8, 0));
    assert_eq!(
        drained_acks(&mut e),
        vec![(100, Syndrome::Nak(NakCode::RemoteOperationalError), 0)],
        "the fatal NAK it owes"
    );
    let errors = e.ingress_totals().errors_injected;
    run(&mut e, late + (idle - Duration::from_millis(1)));
    assert_eq!(e.halves(), (1, 0), "the promise holds idle_after");
    run(&mut e, late + idle * 2);
    assert_eq!(e.halves(), (0, 0), "then it is forgotten");
    assert_eq!(e.stats.halves_expired_failed, 1);
    assert_eq!(
        e.ingress_totals().errors_injected,
        errors,
        "its count of errors stays (the simulator's failure checks read it)"
    );
}

#[test]
fn poisoned_qps_are_forgotten_between_one_and_two_idle_afters() {
    // A far requester's half toward a local QP, its far QPN learned from
    // the local responder's ACK; fail_all poisons that QP.
    let mut e = QpEngine::new(quick(GIVE_UP));
    let t = Time::from_micros(1);
    let far = RESPONDER;
    let local = REQUESTER;
    e.handle_twin(
        t,
        TwinMsg::Request {
            carry: Carry::Reliable,
            packet: request_to(far, local, RQ_QPN, Opcode::RC_SEND_ONLY, 40, 8).into(),
        },
    );
    drain(&mut e);
    e.handle_dc(t, &ack_to(local, far, 0x22, 40, Syndrome::ACK_UNLIMITED));
    drain(&mut e);
    e.fail_all(t, NakCode::RemoteOperationalError);
    drain(&mut e);
    assert_eq!(e.poisoned.len(), 1);
    let idle = idle_after(GIVE_UP);
    run(&mut e, t + (idle - Duration::from_millis(1)));
    assert_eq!(e.poisoned.len(), 1, "its answers are absorbed a while");
    run(&mut e, t + idle * 2 + idle / 2);
    assert!(e.poisoned.is_empty());
    assert_eq!(e.stats.poisoned_expired, 1);
    assert_eq!(e.expiry_deadline(), None);
}

/// A responder QP as rxe's responder role runs it, reduced to what these
/// tests need: executes requests in PSN order exactly once, ACKs those
/// that ask, answers READs (4096-byte MTU), re-ACKs duplicates and NAKs a
/// gap once.
#[derive(Default)]
struct Responder {
    epsn: Option<Psn>,
    msn: u32,
    nak_sent: bool,
    /// Every request executed: (PSN, opcode).
    executed: Vec<(u32, Opcode)>,
}

const PMTU: u32 = 4096;

fn read_responses(psn: Psn, len: u32, msn: u32) -> Vec<Vec<u8>> {
    let n = len.div_ceil(PMTU).max(1);
    (0..n)
        .map(|i| {
            let op = Opcode::read_response(i == 0, i + 1 == n);
            let payload = (len - i * PMTU).min(PMTU) as usize;
            builders::response(
                &to_requester(),
                op,
                psn.add(i),
                Syndrome::ACK_UNLIMITED,
                msn,
            )
            .to_vec(&vec![0xcd; payload])
            .unwrap()
        })
        .collect()
}

impl Responder {
    fn on_packet(&mut self, v: &[u8]) -> Vec<Vec<u8>> {
        let p = RocePacket::parse_verified(v).expect("valid ICRC");
        assert!(p.info.is_request(), "only requests reach the responder");
        let psn = p.psn();
        let epsn = *self.epsn.get_or_insert(psn);
        let read = p.info.kind == OpKind::ReadRequest;
        let span = if read {
            p.ext.reth.len.div_ceil(PMTU).max(1)
        } else {
            1
        };
        if psn == epsn {
            self.executed.push((psn.value(), p.bth.opcode));
            self.nak_sent = false;
            if p.info.completes_message() {
                self.msn = (self.msn + 1) & 0xFF_FFFF;
            }
            self.epsn = Some(psn.add(span));
            if read {
                return read_responses(psn, p.ext.reth.len, self.msn);
            }
            if p.bth.ack_req {
                return vec![builders::ack(&to_requester(), psn, self.msn)
                    .to_vec(&[])
                    .unwrap()];
            }
            return Vec::new();
        }
        if psn.before(epsn) {
            if read {
                return read_responses(psn, p.ext.reth.len, self.msn);
            }
            return vec![builders::ack(&to_requester(), epsn.sub(1), self.msn)
                .to_vec(&[])
                .unwrap()];
        }
        if std::mem::replace(&mut self.nak_sent, true) {
            return Vec::new();
        }
        vec![
            builders::nak(&to_requester(), epsn, NakCode::PsnSequenceError, self.msn)
                .to_vec(&[])
                .unwrap(),
        ]
    }
}

/// Gateway A (the requester's site), gateway B (the responder's) and the
/// responder, joined without a WAN (messages go straight across).
struct Pair {
    a: QpEngine,
    b: QpEngine,
    responder: Responder,
    now: Time,
    /// Everything A sent its requester.
    to_requester: Vec<Vec<u8>>,
}

impl Pair {
    fn new(a_give_up: Duration, b_give_up: Duration) -> Pair {
        Pair {
            a: QpEngine::new(quick(a_give_up)),
            b: QpEngine::new(quick(b_give_up)),
            responder: Responder::default(),
            now: Time::from_micros(1),
            to_requester: Vec::new(),
        }
    }

    fn settle(&mut self) {
        loop {
            let mut moved = false;
            while let Some(o) = self.a.poll_output_owned() {
                moved = true;
                match o {
                    Output::Twin(m) => self.b.handle_twin(self.now, m),
                    Output::Dc(v) => self.to_requester.push(v.to_vec()),
                    Output::DcHeld(_) => unreachable!("owned"),
                }
            }
            while let Some(o) = self.b.poll_output_owned() {
                moved = true;
                match o {
                    Output::Twin(m) => self.a.handle_twin(self.now, m),
                    Output::Dc(v) => {
                        for answer in self.responder.on_packet(&v) {
                            self.b.handle_dc(self.now, &answer);
                        }
                    }
                    Output::DcHeld(_) => unreachable!("owned"),
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Runs both gateways' timers and sweeps up to `until`.
    fn run(&mut self, until: Time) {
        loop {
            let next = [&self.a, &self.b]
                .into_iter()
                .filter_map(next_deadline)
                .min();
            let Some(t) = next.filter(|&t| t <= until) else {
                break;
            };
            self.now = t;
            fire_due(&mut self.a, t);
            fire_due(&mut self.b, t);
            self.settle();
        }
        self.now = until;
    }

    /// The requester sends `reqs` back to back (pipelined), then the
    /// gateways run for a millisecond.
    fn send(&mut self, reqs: &[(Opcode, u32, u32)]) {
        for &(op, psn, len) in reqs {
            let (payload, read_len) = if op == Opcode::RC_READ_REQUEST {
                (0, len)
            } else {
                (len as usize, 0)
            };
            let ack_req = op != Opcode::RC_WRITE_FIRST && op != Opcode::RC_WRITE_MIDDLE;
            self.a
                .handle_dc(self.now, &request(op, psn, ack_req, payload, read_len));
        }
        self.settle();
        self.run(self.now + Duration::from_millis(1));
    }

    /// What the requester was told: the highest PSN acknowledged (by an
    /// ACK or the last READ response), and every NAK.
    fn told(&self) -> (Option<u32>, Vec<(u32, Syndrome)>) {
        let mut high: Option<u32> = None;
        let mut naks = Vec::new();
        for v in &self.to_requester {
            let p = RocePacket::parse_verified(v).expect("valid ICRC");
            let psn = p.psn().value();
            match (p.info.kind, p.ext.aeth) {
                (OpKind::Ack, Some(a)) if matches!(a.syndrome, Syndrome::Ack { .. }) => {
                    high = Some(high.map_or(psn, |h| h.max(psn)));
                }
                (OpKind::Ack, Some(a)) => naks.push((psn, a.syndrome)),
                (OpKind::ReadResponse, _) if p.info.position.ends() => {
                    high = Some(high.map_or(psn, |h| h.max(psn)));
                }
                _ => {}
            }
        }
        (high, naks)
    }
}

/// A burst of `n` requests from `psn`: SENDs, a two-packet WRITE, a READ of
/// two MTUs (two PSNs) when `read`.
fn burst(psn: u32, read: bool) -> (Vec<(Opcode, u32, u32)>, u32) {
    let mut v = Vec::new();
    let mut p = psn;
    if read {
        // First: a READ outstanding at the far end while the rest is sent
        // behind it, through a half that does not know the MTU yet.
        v.push((Opcode::RC_READ_REQUEST, p, 2 * PMTU));
        p += 2;
    }
    v.push((Opcode::RC_WRITE_FIRST, p, PMTU));
    v.push((Opcode::RC_WRITE_LAST, p + 1, 64));
    p += 2;
    for _ in 0..6 {
        v.push((Opcode::RC_SEND_ONLY, p, 32));
        p += 1;
    }
    (v, p)
}

/// Which gateway forgets the QP during its silence.
#[derive(Clone, Copy, Debug)]
enum Forgets {
    Both,
    OnlyA,
    OnlyB,
}

fn idle_then_resume(forgets: Forgets) {
    let long = GIVE_UP * 20;
    let (ga, gb) = match forgets {
        Forgets::Both => (GIVE_UP, GIVE_UP),
        Forgets::OnlyA => (GIVE_UP, long),
        Forgets::OnlyB => (long, GIVE_UP),
    };
    let mut w = Pair::new(ga, gb);
    // Learned from traffic, then accelerated.
    let (first, next) = burst(1000, false);
    w.send(&first);
    let (more, next) = burst(next, true);
    w.send(&more);
    assert_eq!(w.a.ingress_halves().next().unwrap().mode, Mode::Accelerated);
    let pseudo_before = w.a.ingress_totals().pseudo_acks;
    assert!(pseudo_before > 0);
    // Silent for 2 x the shorter idle_after (less than the longer one).
    let silence = idle_after(GIVE_UP) * 2;
    w.run(w.now + silence);
    let gone = |e: &QpEngine| e.halves() == (0, 0);
    match forgets {
        Forgets::Both => assert!(gone(&w.a) && gone(&w.b), "{forgets:?}"),
        Forgets::OnlyA => assert!(gone(&w.a) && !gone(&w.b), "{forgets:?}"),
        Forgets::OnlyB => assert!(!gone(&w.a) && gone(&w.b), "{forgets:?}"),
    }
    // It resumes where it stopped, with a READ first, then more.
    let (resume, next) = burst(next, true);
    w.send(&resume);
    let (tail, next) = burst(next, true);
    w.send(&tail);
    let (tail2, end) = burst(next, false);
    w.send(&tail2);
    // The responder executed every PSN once, in order.
    let executed: Vec<u32> = w.responder.executed.iter().map(|e| e.0).collect();
    let mut expected = Vec::new();
    let mut p = 1000;
    for (op, psn, _) in first
        .iter()
        .chain(&more)
        .chain(&resume)
        .chain(&tail)
        .chain(&tail2)
    {
        assert_eq!(*psn, p);
        expected.push(p);
        p += if *op == Opcode::RC_READ_REQUEST { 2 } else { 1 };
    }
    assert_eq!(executed, expected, "{forgets:?}: in order, once each");
    // The requester heard of all of it, and of nothing going wrong.
    let (high, naks) = w.told();
    assert_eq!(high, Some(end - 1), "{forgets:?}: all acknowledged");
    assert!(naks.is_empty(), "{forgets:?}: no NAK: {naks:?}");
    for e in [&w.a, &w.b] {
        assert_eq!(e.ingress_totals().errors_injected, 0);
        assert_eq!(e.egress_totals().gave_up + e.egress_totals().fatal_naks, 0);
        assert_eq!(e.occupancy().slots_used, 0, "nothing left held");
    }
    // Accelerated again after the resumption (pseudo-ACKs, not the
    // responder's own ACKs through a tunnel, for the last burst).
    let a = w.a.ingress_halves().next().unwrap();
    assert_eq!(a.mode, Mode::Accelerated, "{forgets:?}");
    assert!(w.a.ingress_totals().pseudo_acks > pseudo_before);
    let expired = (
        w.a.stats.halves_expired_ingress,
        w.b.stats.halves_expired_egress,
    );
    let want = match forgets {
        Forgets::Both => (1, 1),
        Forgets::OnlyA => (1, 0),
        Forgets::OnlyB => (0, 1),
    };
    assert_eq!(expired, want, "{forgets:?}");
}

#[test]
fn a_qp_forgotten_at_both_gateways_resumes_in_order() {
    idle_then_resume(Forgets::Both);
}

#[test]
fn a_qp_forgotten_at_the_requesters_gateway_only_resumes_in_order() {
    idle_then_resume(Forgets::OnlyA);
}

#[test]
fn a_qp_forgotten_at_the_responders_gateway_only_resumes_in_order() {
    idle_then_resume(Forgets::OnlyB);
}
