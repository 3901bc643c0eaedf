//! A QP whose far gateway is lost for good is moved to the error state by
//! its own gateway (`soya_proto::qp::poison`): the packets that gateway sends,
//! against this rxe-modelled endpoint. At the responder's expected PSN the
//! opcode-sequence error is fatal (NAK Invalid Request, QP to error, every
//! posted receive completes in error, nothing placed); anywhere else it
//! changes nothing. And a fatal NAK on the requester side errors the work
//! request it lands on and flushes the receives too.

use std::time::Duration;

use soya_proto::qp::poison::{self, InProgress, Target};
use soya_proto::roce::{NakCode, Opcode, Psn, Syndrome};

use super::harness::*;
use crate::rc::*;

/// The poison packet a gateway would send from A's address to B's QP.
fn poison_to_b(psn: Psn, state: InProgress) -> Vec<u8> {
    let t = Target {
        far: A_IP.into(),
        far_qpn: Some(A_QPN),
        local: B_IP.into(),
        local_qpn: B_QPN,
    };
    poison::packet(&t, psn, state)
        .expect("same family")
        .to_vec(&[])
        .expect("builds")
}

fn recv_statuses(h: &mut Harness, s: Side) -> Vec<CompletionStatus> {
    h.recv_completions(s).iter().map(|r| r.status).collect()
}

/// A's requests are dropped on their way to B but for their packets of
/// opcode `first` (a multi-packet request's First): the far gateway died
/// after forwarding that one.
fn only_the_first_packet_reaches_b(h: &mut Harness, first: Opcode) {
    h.set_fault(move |s, _| {
        if s.from == Side::A && s.is_request() && s.opcode != first {
            Fault::Drop
        } else {
            Fault::Deliver
        }
    });
}

/// The statuses of the receive completions an endpoint without a harness
/// gives, oldest first.
fn recv_statuses_of(q: &mut RcQp) -> Vec<CompletionStatus> {
    std::iter::from_fn(|| q.poll_recv_completion())
        .map(|c| c.status)
        .collect()
}

/// B alone (no harness: a gateway drives it), connected to A, with `cfg`,
/// its own first PSN B_PSN and `epsn` as its responder's expected PSN.
fn endpoint_b(cfg: QpConfig, epsn: u32) -> RcQp {
    let (a, b) = (
        QpAddr {
            ip: A_IP.into(),
            qpn: A_QPN,
        },
        QpAddr {
            ip: B_IP.into(),
            qpn: B_QPN,
        },
    );
    RcQp::new(cfg, b, a, Psn::new(B_PSN), Psn::new(epsn)).expect("valid config")
}

fn b_naks(h: &Harness) -> Vec<(Psn, Syndrome)> {
    h.sent(Side::B, |s| s.syndrome.is_some())
        .iter()
        .map(|s| (s.psn, s.syndrome.unwrap()))
        .collect()
}

#[test]
fn poison_at_the_expected_psn_errors_the_qp_and_flushes_its_receives() {
    let mut h = Harness::new(cfg());
    // B waits for a SEND (rping), nothing outstanding as a requester.
    h.b.post_recv(4);
    let epsn = h.b.expected_psn();
    h.inject(Side::B, &poison_to_b(epsn, InProgress::Nothing));
    h.run();
    assert!(h.b.is_error());
    assert_eq!(
        b_naks(&h),
        vec![(epsn, Syndrome::Nak(NakCode::InvalidRequest))],
        "class C: NAK Invalid Request at the packet's PSN"
    );
    assert_eq!(
        recv_statuses(&mut h, Side::B),
        vec![CompletionStatus::Flushed; 4],
        "the application waiting for a SEND wakes up with an error"
    );
    assert_eq!(h.b.stats().recv_flushed, 4);
    assert_eq!(h.b.stats().recv_completed, 0);
    let m = h.b.memory().stats();
    assert_eq!((m.bytes_placed, m.send_bytes_received), (0, 0));
    // Receives posted afterwards are flushed at once.
    h.b.post_recv(2);
    assert_eq!(
        recv_statuses(&mut h, Side::B),
        vec![CompletionStatus::Flushed; 2]
    );
}

#[test]
fn poison_before_or_after_the_expected_psn_changes_nothing() {
    let mut h = Harness::new(cfg());
    h.b.post_recv(4);
    h.a.post_send(WorkRequest::Send { len: 64, imm: None })
        .unwrap();
    h.run();
    assert_eq!(h.recv_completions(Side::B).len(), 1);
    let epsn = h.b.expected_psn();
    // Before: a duplicate, re-ACKed with the last executed PSN (C9-105).
    h.inject(Side::B, &poison_to_b(epsn.sub(1), InProgress::Nothing));
    h.run();
    assert!(!h.b.is_error());
    assert_eq!(
        b_naks(&h).last(),
        Some(&(epsn.sub(1), Syndrome::ACK_UNLIMITED))
    );
    // After: NAK-seq carrying the expected PSN, nothing else.
    h.inject(Side::B, &poison_to_b(epsn.add(1), InProgress::Nothing));
    h.run();
    assert!(!h.b.is_error());
    assert_eq!(
        b_naks(&h).last(),
        Some(&(epsn, Syndrome::Nak(NakCode::PsnSequenceError)))
    );
    assert!(h.recv_completions(Side::B).is_empty());
    // The QP still works...
    h.a.post_send(WorkRequest::Send { len: 64, imm: None })
        .unwrap();
    h.run();
    assert_eq!(h.recv_completions(Side::B).len(), 1);
    // ...until a poison lands at its expected PSN.
    let epsn = h.b.expected_psn();
    h.inject(Side::B, &poison_to_b(epsn, InProgress::Nothing));
    h.run();
    assert!(h.b.is_error());
    assert_eq!(
        recv_statuses(&mut h, Side::B),
        vec![CompletionStatus::Flushed; 2]
    );
}

#[test]
fn poison_in_the_middle_of_a_send_never_continues_it() {
    let mut h = Harness::new(cfg_mtu(1024));
    h.b.post_recv(3);
    // A's 3-packet SEND: only its First reaches B (the far gateway died).
    only_the_first_packet_reaches_b(&mut h, Opcode::RC_SEND_FIRST);
    h.a.post_send(WorkRequest::Send {
        len: 3 * 1024,
        imm: None,
    })
    .unwrap();
    h.run_for(Duration::from_millis(1));
    assert_eq!(h.b.memory().stats().send_bytes_received, 1024);
    let epsn = h.b.expected_psn();
    // A SEND Middle here would be the SEND's continuation (data into the
    // application's receive buffer): the gateway sends a WRITE Middle.
    assert_eq!(InProgress::Send.poison_opcode(), Opcode::RC_WRITE_MIDDLE);
    h.inject(Side::B, &poison_to_b(epsn, InProgress::Send));
    assert!(h.b.is_error());
    assert_eq!(
        recv_statuses(&mut h, Side::B),
        vec![
            // The receive of the SEND in progress gets the error itself
            // (rxe do_complete with resp.status), the others a flush.
            CompletionStatus::RemoteInvalidRequest,
            CompletionStatus::Flushed,
            CompletionStatus::Flushed,
        ]
    );
    let m = h.b.memory().stats();
    assert_eq!((m.bytes_placed, m.send_bytes_received), (0, 1024));
}

#[test]
fn poison_in_the_middle_of_a_write_never_places_data() {
    let mut h = Harness::new(cfg_mtu(1024));
    h.b.post_recv(1);
    only_the_first_packet_reaches_b(&mut h, Opcode::RC_WRITE_FIRST);
    let va = h.b.memory().base();
    h.post(WrOpcode::Write, va, 3 * 1024);
    h.run_for(Duration::from_millis(1));
    assert_eq!(h.b.memory().stats().bytes_placed, 1024);
    assert_eq!(InProgress::Write.poison_opcode(), Opcode::RC_SEND_MIDDLE);
    let epsn = h.b.expected_psn();
    h.inject(Side::B, &poison_to_b(epsn, InProgress::Write));
    assert!(h.b.is_error());
    assert_eq!(h.b.memory().stats().bytes_placed, 1024, "nothing more");
    assert_eq!(
        recv_statuses(&mut h, Side::B),
        vec![CompletionStatus::Flushed]
    );
}

#[test]
fn a_fatal_nak_on_the_oldest_outstanding_psn_errors_the_requester_and_its_receives() {
    let mut h = Harness::new(cfg());
    h.a.post_recv(2);
    // A's SEND is never acknowledged (the gateway that held it is gone)...
    h.set_fault(|s, _| {
        if s.from == Side::A {
            Fault::Drop
        } else {
            Fault::Deliver
        }
    });
    h.a.post_send(WorkRequest::Send { len: 64, imm: None })
        .unwrap();
    h.run_for(Duration::from_micros(100));
    // ...and the near gateway injects the NAK at its oldest outstanding PSN.
    let nak = h.forged_b_to_a(
        h.a.unacked_psn(),
        Syndrome::Nak(NakCode::RemoteOperationalError),
    );
    h.inject(Side::A, &nak);
    assert!(h.a.is_error());
    assert_eq!(
        h.completions(Side::A)
            .iter()
            .map(|c| c.status)
            .collect::<Vec<_>>(),
        vec![CompletionStatus::RemoteOperationalError]
    );
    assert_eq!(
        recv_statuses(&mut h, Side::A),
        vec![CompletionStatus::Flushed; 2]
    );
}

/// B's gateway, end to end: a real [`QpEngine`] re-injects A's requests into
/// B (the rxe-modelled endpoint), then loses its twin. `deliver_acks`: how
/// many of B's answers reach the engine (the rest are still on their way
/// when the twin is lost, so the engine does not know how far B got).
fn through_a_gateway_then_twin_lost(
    ops: &[(Opcode, usize)],
    deliver_acks: usize,
) -> (RcQp, soya_proto::qp::TwinLostSummary) {
    use soya_proto::qp::twin::Carry;
    use soya_proto::qp::{EngineConfig, Output, QpEngine, TwinMsg};
    use soya_proto::roce::{builders, IpHeader, Reth};
    use soya_proto::time::Time;

    let mut b = endpoint_b(cfg_mtu(1024), A_PSN);
    b.post_recv(3);
    let mut e = QpEngine::new(EngineConfig::default());
    let now = Time::from_micros(1);
    let mut buf = vec![0u8; b.max_packet_len()];
    let mut acks_left = deliver_acks;
    let pump = |e: &mut QpEngine, b: &mut RcQp, buf: &mut [u8], acks_left: &mut usize| loop {
        let mut moved = false;
        while let Some(o) = e.poll_output_owned() {
            if let Output::Dc(v) = o {
                b.handle_packet(now, &v);
                moved = true;
            }
        }
        while let Some(n) = b.poll_transmit(now, buf) {
            moved = true;
            if *acks_left > 0 {
                *acks_left -= 1;
                e.handle_dc(now, &buf[..n]);
            }
        }
        if !moved {
            break;
        }
    };
    for (i, &(op, len)) in ops.iter().enumerate() {
        let last = i + 1 == ops.len();
        let pkt = builders::request(
            IpHeader::v4(A_IP, B_IP),
            B_QPN,
            op,
            Psn::new(A_PSN).add(i as u32),
            op.info().unwrap().position.ends() || last,
            Reth::default(),
        )
        .to_vec(&vec![0x5a; len])
        .unwrap();
        e.handle_twin(
            now,
            TwinMsg::Request {
                carry: Carry::Reliable,
                packet: pkt.into(),
            },
        );
        pump(&mut e, &mut b, &mut buf, &mut acks_left);
    }
    assert!(!b.is_error());
    let sum = e.fail_all(now, NakCode::RemoteOperationalError);
    acks_left = 0;
    pump(&mut e, &mut b, &mut buf, &mut acks_left);
    (b, sum)
}

#[test]
fn the_engines_poison_errors_an_endpoint_that_acknowledged_everything() {
    let (mut b, sum) = through_a_gateway_then_twin_lost(&[(Opcode::RC_SEND_ONLY, 100)], usize::MAX);
    assert_eq!(sum.poison_packets, 1, "exact ePSN");
    assert!(b.is_error());
    assert_eq!(
        recv_statuses_of(&mut b),
        vec![
            CompletionStatus::Success,
            CompletionStatus::Flushed,
            CompletionStatus::Flushed
        ]
    );
    assert_eq!(b.memory().stats().send_bytes_received, 100);
}

#[test]
fn the_engines_poison_sweep_errors_an_endpoint_whose_acks_it_never_saw() {
    // B executed a SEND Only and the first two packets of a SEND; the
    // engine saw only the ACK of the first, so B's ePSN may be any of three.
    let ops = [
        (Opcode::RC_SEND_ONLY, 100),
        (Opcode::RC_SEND_FIRST, 1024),
        (Opcode::RC_SEND_MIDDLE, 1024),
    ];
    let (mut b, sum) = through_a_gateway_then_twin_lost(&ops, 1);
    assert_eq!(sum.poison_packets, 3, "one per possible ePSN");
    assert!(b.is_error());
    // The candidates before the true ePSN were duplicates (re-ACKed), the
    // one at it was fatal (a WRITE Middle: a SEND is in progress).
    assert_eq!(b.stats().duplicate_requests, 2);
    assert_eq!(b.stats().error_naks_sent, 1);
    assert_eq!(
        recv_statuses_of(&mut b),
        vec![
            CompletionStatus::Success,
            CompletionStatus::RemoteInvalidRequest,
            CompletionStatus::Flushed
        ]
    );
    assert_eq!(
        b.memory().stats().send_bytes_received,
        100 + 2048,
        "nothing placed by the poison"
    );
}

/// B's gateway, end to end, when B is only a *requester* toward A: its
/// WRITEs are pseudo-ACKed (nothing outstanding), A never sends it
/// anything, there is no RDMA-CM (the simulator, NCCL-style out-of-band
/// QPN exchange): the engine knows B's QPN (from A's ACK of the tunnel
/// phase) but not B's responder's ePSN, `b_epsn`. The twin is lost; the
/// engine probes, B answers as rxe does, the engine poisons. Returns B,
/// the engine and the twin messages the engine produced after fail_all.
fn pseudo_acked_writer_then_twin_lost(b_epsn: u32) -> (RcQp, soya_proto::qp::QpEngine, usize) {
    use soya_proto::qp::twin::Carry;
    use soya_proto::qp::{EngineConfig, Output, QpEngine, TwinMsg};
    use soya_proto::roce::builders::{self, ReplyTo};
    use soya_proto::roce::{IpHeader, RocePacket};
    use soya_proto::time::Time;

    let mut b = endpoint_b(cfg(), b_epsn);
    b.post_recv(2);
    let mut e = QpEngine::new(EngineConfig::default());
    let mut now = Time::from_micros(1);
    let mut buf = vec![0u8; b.max_packet_len()];
    let mut twin_after = 0usize;
    let mut failed = false;
    let a_ack = |psn: Psn| {
        let to = ReplyTo {
            ip: IpHeader::v4(A_IP, B_IP),
            src_port: 0xc000,
            dest_qp: B_QPN,
        };
        builders::ack(&to, psn, 1).to_vec(&[]).unwrap()
    };
    let mut step =
        |e: &mut QpEngine, b: &mut RcQp, now: Time, failed: bool, twin_after: &mut usize| -> bool {
            let mut moved = false;
            while let Some(n) = b.poll_transmit(now, &mut buf) {
                moved = true;
                e.handle_dc(now, &buf[..n]);
            }
            while let Some(o) = e.poll_output_owned() {
                moved = true;
                match o {
                    Output::Dc(v) => b.handle_packet(now, &v),
                    Output::DcHeld(_) => unreachable!("poll_output_owned copies them out"),
                    Output::Twin(m) => {
                        if failed {
                            *twin_after += 1;
                        }
                        // The far gateway and A: the tunnel phase is answered
                        // (the engine learns B's QPN from it); reliable
                        // requests are taken, never reported delivered.
                        if let TwinMsg::Request {
                            carry: Carry::Raw,
                            packet,
                        } = m
                        {
                            let psn = RocePacket::parse(&packet).unwrap().psn();
                            e.handle_twin(
                                now,
                                TwinMsg::Response {
                                    packet: a_ack(psn).into(),
                                },
                            );
                        }
                    }
                }
            }
            moved
        };
    let write = WorkRequest::Write {
        remote_va: 0x10_0000,
        rkey: 7,
        len: 512,
        imm: None,
    };
    b.post_send(write).unwrap();
    while step(&mut e, &mut b, now, failed, &mut twin_after) {}
    for _ in 0..4 {
        b.post_send(write).unwrap();
    }
    while step(&mut e, &mut b, now, failed, &mut twin_after) {}
    assert_eq!(b.outstanding(), 0, "everything (pseudo-)ACKed");
    let c: Vec<_> = std::iter::from_fn(|| b.poll_completion())
        .map(|c| c.status)
        .collect();
    assert_eq!(
        c,
        vec![CompletionStatus::Success; 5],
        "the application was told"
    );
    assert_eq!(
        b.expected_psn(),
        Psn::new(b_epsn),
        "A never sent B anything"
    );

    let sum = e.fail_all(now, NakCode::RemoteOperationalError);
    assert_eq!((sum.probing, sum.unattributable), (1, 0));
    failed = true;
    for _ in 0..10_000 {
        if step(&mut e, &mut b, now, failed, &mut twin_after) {
            continue;
        }
        let next = [e.poll_timeout(), b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { break };
        now = now.max(t);
        if e.poll_timeout().is_some_and(|t| t <= now) {
            e.handle_timeout(now);
        }
        if b.poll_timeout().is_some_and(|t| t <= now) {
            b.handle_timeout(now);
        }
    }
    (b, e, twin_after)
}

fn check_probed_and_poisoned(b_epsn: u32) -> (RcQp, soya_proto::qp::QpEngine) {
    let (mut b, e, twin_after) = pseudo_acked_writer_then_twin_lost(b_epsn);
    assert!(b.is_error(), "ePSN {b_epsn:#x}: B is in the error state");
    assert_eq!(twin_after, 0, "no answer travels to the lost twin");
    assert_eq!(e.stats.qps_poisoned_after_probe, 1);
    assert_eq!(e.stats.probes_unanswered, 0);
    assert_eq!(e.probes_pending(), 0);
    assert_eq!(b.stats().error_naks_sent, 1, "one fatal NAK: the poison's");
    assert_eq!(
        recv_statuses_of(&mut b),
        vec![CompletionStatus::Flushed; 2],
        "its posted receives are flushed: the application wakes up"
    );
    let m = b.memory().stats();
    assert_eq!(
        (m.bytes_placed, m.send_bytes_received),
        (0, 0),
        "nothing placed"
    );
    (b, e)
}

#[test]
fn a_pseudo_acked_qp_with_no_reverse_traffic_is_probed_and_ends_in_error() {
    // ePSN A_PSN (0x100): the probe at 0 is a duplicate (re-ACK 0xff), the
    // one at 2^23 is ahead (NAK-seq 0x100).
    // B never executed anything, so (as rxe: `ack_psn` is still 0) its
    // re-ACK says 0xffffff: the engine's estimate (0) is one more
    // duplicate, and the NAK-seq's exact ePSN wins.
    let (b, e) = check_probed_and_poisoned(A_PSN);
    assert_eq!(b.stats().duplicate_requests, 2);
    assert_eq!(e.stats.probes_sent, 2);
    assert_eq!(
        e.stats.poison_packets, 2,
        "the estimate, then the exact ePSN"
    );
    // ePSN 0xf0_0000: the probe at 0 is ahead, the one at 2^23 behind.
    check_probed_and_poisoned(0xf0_0000);
    // ePSN 0: the first probe is the poison itself.
    let (_, e) = check_probed_and_poisoned(0);
    assert_eq!(e.stats.poison_packets, 0, "the probe at 0 was the poison");
    // ePSN 2^23: the probe at 0 is a duplicate (exactly half the space
    // behind compares as behind), the one at 2^23 the poison.
    check_probed_and_poisoned(1 << 23);
}

/// The answers the ePSN probe relies on, as rxe_resp.c gives them.
#[test]
fn duplicates_and_out_of_sequence_requests_are_answered_as_rxe_does() {
    let mut h = Harness::new(cfg());
    h.b.post_recv(4);
    let probe = |h: &mut Harness, psn: Psn| {
        let before = b_naks(h).len();
        h.inject(Side::B, &poison_to_b(psn, InProgress::Nothing));
        h.run();
        b_naks(h)[before..].to_vec()
    };
    // One request from A executed at B: B's new ePSN, one past the old.
    let execute = |h: &mut Harness, wr: WorkRequest| {
        let before = h.b.expected_psn();
        h.a.post_send(wr).unwrap();
        h.run();
        let after = h.b.expected_psn();
        assert_eq!(after, before.next());
        after
    };
    let e0 = h.b.expected_psn();
    // Nothing executed yet: rxe's resp.ack_psn is 0 (the receive PSN is
    // set in resp.psn only), so a duplicate is re-ACKed with 0xffffff.
    assert_eq!(
        probe(&mut h, e0.sub(5)),
        vec![(Psn::new(0xff_ffff), Syndrome::ACK_UNLIMITED)]
    );
    // Ahead: one NAK-seq with the ePSN, then silence (sent_psn_nak), while
    // duplicates are still re-ACKed.
    assert_eq!(
        probe(&mut h, e0.add(3)),
        vec![(e0, Syndrome::Nak(NakCode::PsnSequenceError))]
    );
    assert_eq!(probe(&mut h, e0.add(1 << 20)), vec![]);
    assert_eq!(probe(&mut h, e0.sub(1)).len(), 1);
    // Exactly half the PSN space away compares as behind (psn_compare).
    assert_eq!(
        probe(&mut h, e0.add(1 << 23)),
        vec![(Psn::new(0xff_ffff), Syndrome::ACK_UNLIMITED)]
    );
    assert!(!h.b.is_error());
    // A SEND executed: re-ACKs say ePSN - 1; the sequence recovered, so a
    // packet ahead gets a NAK-seq again.
    let e1 = execute(&mut h, WorkRequest::Send { len: 64, imm: None });
    assert_eq!(
        probe(&mut h, e1.sub(100)),
        vec![(e1.sub(1), Syndrome::ACK_UNLIMITED)]
    );
    assert_eq!(
        probe(&mut h, e1.add(9)),
        vec![(e1, Syndrome::Nak(NakCode::PsnSequenceError))]
    );
    // A READ executed: the ePSN moves, rxe's ack_psn does not (read_reply
    // never sets it): the re-ACK lags, the NAK-seq is exact.
    let (va, rkey) = (h.b.memory().base(), h.b.memory().rkey());
    let e2 = execute(
        &mut h,
        WorkRequest::Read {
            remote_va: va,
            rkey,
            len: 64,
        },
    );
    assert_eq!(
        probe(&mut h, e2.sub(50)),
        vec![(e1.sub(1), Syndrome::ACK_UNLIMITED)],
        "the re-ACK still names the SEND"
    );
    assert_eq!(
        probe(&mut h, e2.add(1)),
        vec![(e2, Syndrome::Nak(NakCode::PsnSequenceError))]
    );
    assert!(!h.b.is_error());
    assert_eq!(h.recv_completions(Side::B).len(), 1, "only the SEND");
}
