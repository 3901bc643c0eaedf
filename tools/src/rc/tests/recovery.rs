//! Loss, duplication, reordering, RNR, retry exhaustion, implied NAK and
//! fatal NAKs: each recovers (or fails) the way rxe does, and says so in
//! the counters.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use proptest::prelude::*;
use soya_proto::roce::opcode::Headers;
use soya_proto::roce::{
    Bth, ExtHeaders, IpHeader, NakCode, OpKind, Opcode, Psn, Reth, RoceRepr, Syndrome,
};
use soya_proto::time::Time;

use super::harness::*;
use crate::rc::*;

const ACK_TIMEOUT: Time = Time::from_nanos(4096 << 14);

/// A's WRITE of `len` bytes to the start of B's memory (1 KiB MTU), with
/// `fault` done to packet `index` from `from`, run until the wire is quiet.
fn write_with_fault(from: Side, index: usize, fault: Fault, len: u32) -> Harness {
    let mut h = Harness::new(cfg_mtu(1024));
    h.fault_from(from, Some(index), fault);
    let base = h.b.memory().base();
    h.post(WrOpcode::Write, base, len);
    h.run();
    h
}

/// A's one WRITE completed and B holds its `len` bytes, intact.
fn assert_write_landed(h: &mut Harness, len: usize) {
    assert_eq!(
        statuses(&h.completions(Side::A)),
        [CompletionStatus::Success]
    );
    assert_eq!(h.b.memory().check_region(h.b.memory().base(), len), Ok(1));
}

/// B's memory holds pattern 5 over its first `len` bytes, and A posts a READ
/// of them; returns the (va, rkey) it reads.
fn post_read_of_b(h: &mut Harness, len: u32) -> (u64, u32) {
    let (va, rkey) = (h.b.memory().base(), h.b.memory().rkey());
    let mut data = vec![0; len as usize];
    pattern_fill(&mut data, va, 5);
    h.b.memory_mut().write(va, &data);
    h.post(WrOpcode::Read, va, len);
    (va, rkey)
}

/// A lost middle packet: one NAK-seq (later out-of-order packets are dropped
/// silently), go-back-N from the lost PSN, no timeout.
#[test]
fn lost_middle_packet_gives_one_nak_seq_and_go_back_n() {
    let mut h = write_with_fault(Side::A, 5, Fault::Drop, 20 * 1024);
    assert_write_landed(&mut h, 20 * 1024);
    let (a, b) = (*h.a.stats(), *h.b.stats());
    assert_eq!(a.seq_naks_received, 1);
    assert_eq!(a.naks_received, 1);
    assert_eq!(
        b.seq_errors_sent, 1,
        "sent once for 14 out-of-order packets"
    );
    assert_eq!(a.retry_sequences, 1);
    assert_eq!(a.retransmitted_packets, 15, "PSNs 5..=19");
    assert_eq!(a.timeouts, 0);
    assert_eq!(b.duplicate_requests, 0);
    assert_eq!(b.data_errors, 0);
    // The NAK carries the expected PSN; the retransmission resumes there
    // with a WRITE Middle (no RETH).
    let nak = &h.sent(Side::B, |s| s.kind == OpKind::Ack)[0];
    assert_eq!(nak.syndrome, Some(Syndrome::Nak(NakCode::PsnSequenceError)));
    assert_eq!(nak.psn, Psn::new(A_PSN + 5));
    let resent = &h.sent(Side::A, |s| s.index == 20)[0];
    assert_eq!(
        (resent.psn, resent.opcode, resent.reth),
        (Psn::new(A_PSN + 5), Opcode::RC_WRITE_MIDDLE, None)
    );
}

/// The only ACK is lost: the timer fires, everything is resent, the
/// responder re-ACKs each duplicate with its last executed PSN.
#[test]
fn lost_ack_times_out_and_duplicates_are_reacked() {
    let mut h = write_with_fault(Side::B, 0, Fault::Drop, 3 * 1024);
    let c = h.completions(Side::A);
    assert_eq!(statuses(&c), [CompletionStatus::Success]);
    assert!(c[0].at >= ACK_TIMEOUT, "{:?}", c[0].at);
    let (a, b) = (*h.a.stats(), *h.b.stats());
    assert_eq!(a.timeouts, 1);
    assert_eq!(a.retry_sequences, 1);
    assert_eq!(a.retransmitted_packets, 3);
    assert_eq!(b.duplicate_requests, 3);
    assert_eq!(b.acks_sent, 4);
    assert_eq!(a.acks_received, 3);
    let acks = h.sent(Side::B, |s| s.kind == OpKind::Ack);
    assert!(acks.iter().all(|s| s.psn == Psn::new(A_PSN + 2)));
    assert_eq!(b.data_errors, 0);
    assert_eq!(h.b.msn(), 1, "executed once");
}

/// No receive posted: RNR NAK at the SEND's first PSN, wait the RNR timer,
/// retry; after post_recv the retry succeeds. The NAK-seq that trails each
/// RNR NAK does not start a second retry.
#[test]
fn rnr_nak_until_a_receive_is_posted() {
    let mut h = Harness::new(cfg_mtu(1024));
    h.a.post_send(WorkRequest::Send {
        len: 3000,
        imm: Some(9),
    })
    .unwrap();
    assert!(h.run_until(|h| h.a.stats().rnr_naks_received >= 3));
    h.b.post_recv(1);
    h.run();
    assert_eq!(
        statuses(&h.completions(Side::A)),
        [CompletionStatus::Success]
    );
    let r = h.recv_completions(Side::B);
    assert_eq!((r.len(), r[0].bytes, r[0].imm), (1, 3000, Some(9)));
    let (a, b) = (*h.a.stats(), *h.b.stats());
    assert_eq!(a.rnr_naks_received, b.rnr_naks_sent);
    assert!(a.rnr_naks_received >= 3);
    assert_eq!(a.retry_sequences, 0);
    assert_eq!(a.timeouts, 0);
    assert_eq!(b.data_errors, 0);
    let rnr = h.sent(Side::B, |s| {
        matches!(s.syndrome, Some(Syndrome::RnrNak { .. }))
    });
    assert!(rnr
        .iter()
        .all(|s| s.psn == Psn::new(A_PSN) && s.syndrome == Some(Syndrome::RnrNak { timer: 12 })));
    for w in rnr.windows(2) {
        assert!(
            w[1].at - w[0].at >= Duration::from_micros(640),
            "waited the RNR timer"
        );
    }
}

#[test]
fn rnr_retry_exhaustion() {
    let mut h = Harness::new(QpConfig {
        rnr_retry: 2,
        ..cfg()
    });
    for _ in 0..2 {
        h.a.post_send(WorkRequest::Send {
            len: 100,
            imm: None,
        })
        .unwrap();
    }
    h.run();
    assert_eq!(
        statuses(&h.completions(Side::A)),
        [
            CompletionStatus::RnrRetryExceeded,
            CompletionStatus::Flushed
        ]
    );
    assert!(h.a.is_error() && !h.b.is_error());
    assert_eq!(h.a.stats().rnr_naks_received, 3);
}

/// Every request is lost: retry_cnt retries, then RetryExceeded on the head,
/// Flushed for the rest, and the QP is in the error state.
#[test]
fn retry_exhaustion_fails_the_head_and_flushes_the_rest() {
    let mut h = Harness::new(QpConfig {
        retry_cnt: 3,
        ..cfg()
    });
    h.fault_from(Side::A, None, Fault::Drop);
    let (w1, w2) = (write(&h, 0, 1024), write(&h, 4096, 1024));
    h.a.post_send(w1).unwrap();
    h.a.post_send(w2).unwrap();
    h.run();
    let c = h.completions(Side::A);
    assert_eq!(
        statuses(&c),
        [CompletionStatus::RetryExceeded, CompletionStatus::Flushed]
    );
    assert!(c[0].at >= Time::from_nanos(4 * ACK_TIMEOUT.as_nanos()));
    let a = *h.a.stats();
    assert_eq!(a.timeouts, 4);
    assert_eq!(a.retry_sequences, 3);
    assert_eq!(a.retransmitted_packets, 6);
    assert!(h.a.is_error());
    assert_eq!(h.a.poll_timeout(), None);
    let mut buf = vec![0; h.a.max_packet_len()];
    assert_eq!(h.a.poll_transmit(h.now, &mut buf), None);
    // Posting to a QP in the error state completes at once, flushed.
    let w3 = write(&h, 0, 10);
    assert!(h.a.post_send(w3).is_ok());
    assert_eq!(
        statuses(&h.completions(Side::A)),
        [CompletionStatus::Flushed]
    );
    assert!(!h.b.is_error());
}

/// An ACK at (or past) the last PSN of a READ still waiting for its data is
/// an implied NAK: go-back-N re-requests the READ; it then completes.
#[test]
fn ack_covering_a_pending_read_is_an_implied_nak() {
    for past in [0, 2] {
        let mut h = Harness::new(cfg_mtu(1024));
        let blocked = Rc::new(Cell::new(true));
        let b2 = blocked.clone();
        h.set_fault(move |s, _| {
            if s.from == Side::B && b2.get() {
                Fault::Drop
            } else {
                Fault::Deliver
            }
        });
        let (va, rkey) = post_read_of_b(&mut h, 4096);
        assert!(h.run_until(|h| h.b.stats().responses_sent == 4));
        let last = Psn::new(A_PSN + 3 + past);
        let ack = h.forged_b_to_a(last, Syndrome::ACK_UNLIMITED);
        h.inject(Side::A, &ack);
        assert_eq!(h.a.stats().implied_naks, 1);
        assert_eq!(h.a.stats().retry_sequences, 1);
        assert_eq!(h.a.outstanding(), 1, "not completed by the ACK");
        blocked.set(false);
        h.run();
        let c = h.completions(Side::A);
        assert_eq!(statuses(&c), [CompletionStatus::Success]);
        assert_eq!(h.a.memory().check_region(va, 4096), Ok(5));
        let reads = h.sent(Side::A, |s| s.kind == OpKind::ReadRequest);
        assert_eq!(reads.len(), 2);
        assert!(reads.iter().all(|r| r.psn == Psn::new(A_PSN)
            && r.reth
                == Some(Reth {
                    va,
                    rkey,
                    len: 4096
                })));
        assert_eq!(h.b.stats().duplicate_requests, 1);
        assert_eq!(h.a.stats().timeouts, 0);
        assert_eq!(h.a.stats().data_errors, 0);
    }
}

/// A READ response is lost: later ones are dropped, the timer fires and the
/// READ is re-issued as a new request for the remaining bytes at the PSN of
/// the lost response; the responder replays from there (Middle, Last).
#[test]
fn partly_answered_read_is_reissued_for_the_rest() {
    let mut h = Harness::new(cfg_mtu(1024));
    h.fault_from(Side::B, Some(3), Fault::Drop);
    let (va, rkey) = post_read_of_b(&mut h, 8192);
    h.run();
    assert_eq!(
        statuses(&h.completions(Side::A)),
        [CompletionStatus::Success]
    );
    assert_eq!(h.a.memory().check_region(va, 8192), Ok(5));
    let reads = h.sent(Side::A, |s| s.kind == OpKind::ReadRequest);
    assert_eq!(reads.len(), 2);
    assert_eq!(reads[1].psn, Psn::new(A_PSN + 3));
    assert_eq!(
        reads[1].reth,
        Some(Reth {
            va: va + 3072,
            rkey,
            len: 5120
        })
    );
    let replay: Vec<_> = h
        .sent(Side::B, |s| s.index >= 8)
        .iter()
        .map(|s| (s.psn.value() - A_PSN, s.opcode))
        .collect();
    assert_eq!(
        replay,
        [
            (3, Opcode::RC_READ_RESPONSE_MIDDLE),
            (4, Opcode::RC_READ_RESPONSE_MIDDLE),
            (5, Opcode::RC_READ_RESPONSE_MIDDLE),
            (6, Opcode::RC_READ_RESPONSE_MIDDLE),
            (7, Opcode::RC_READ_RESPONSE_LAST),
        ]
    );
    let a = *h.a.stats();
    assert_eq!(
        (a.timeouts, a.data_errors, a.unexpected_responses),
        (1, 0, 0)
    );
    assert_eq!(h.b.stats().duplicate_requests, 1);
    assert_eq!(h.a.memory().stats().read_bytes_received, 8192);
}

/// The atomic ACK is lost: the resent atomic is a duplicate, answered from
/// the saved result, not executed twice.
#[test]
fn duplicate_atomic_is_replayed_not_executed_twice() {
    let mut h = Harness::new(cfg());
    h.fault_from(Side::B, Some(0), Fault::Drop);
    let (va, rkey) = (h.b.memory().base() + 64, h.b.memory().rkey());
    h.b.memory_mut().write(va, &40u64.to_le_bytes());
    h.a.post_send(WorkRequest::FetchAdd {
        remote_va: va,
        rkey,
        add: 2,
    })
    .unwrap();
    h.run();
    let c = h.completions(Side::A);
    assert_eq!(statuses(&c), [CompletionStatus::Success]);
    assert_eq!(c[0].atomic_orig, Some(40));
    assert_eq!(h.b.memory().read_u64(va), Some(42));
    assert_eq!(h.b.memory().stats().atomics_executed, 1);
    assert_eq!(h.b.stats().duplicate_requests, 1);
    assert_eq!(h.a.stats().timeouts, 1);
}

/// WRITE outside the region, with a wrong R_Key, or a READ outside: NAK
/// 0x62, the head fails with RemoteAccessError, the rest is flushed, both
/// QPs end in the error state (the responder's is class C).
#[test]
fn remote_access_errors_are_fatal() {
    for case in 0..3 {
        let mut h = Harness::new(cfg());
        let (base, rkey, size) = (
            h.b.memory().base(),
            h.b.memory().rkey(),
            h.b.memory().len() as u64,
        );
        let bad = match case {
            0 => WorkRequest::Write {
                remote_va: base + size - 100,
                rkey,
                len: 200,
                imm: None,
            },
            1 => WorkRequest::Write {
                remote_va: base,
                rkey: rkey ^ 1,
                len: 200,
                imm: None,
            },
            _ => WorkRequest::Read {
                remote_va: base - 64,
                rkey,
                len: 128,
            },
        };
        let ok = write(&h, 0, 10);
        h.a.post_send(ok).unwrap();
        h.a.post_send(bad).unwrap();
        h.a.post_send(ok).unwrap();
        h.run();
        assert_eq!(
            statuses(&h.completions(Side::A)),
            [
                CompletionStatus::Success,
                CompletionStatus::RemoteAccessError,
                CompletionStatus::Flushed
            ],
            "case {case}"
        );
        assert!(h.a.is_error() && h.b.is_error());
        assert_eq!(h.b.stats().error_naks_sent, 1);
        assert_eq!(h.a.stats().fatal_naks_received, 1);
        let nak = h.sent(Side::B, |s| s.kind == OpKind::Ack).pop().unwrap();
        assert_eq!(
            (nak.psn, nak.syndrome),
            (
                Psn::new(A_PSN + 1),
                Some(Syndrome::Nak(NakCode::RemoteAccessError))
            )
        );
        // The responder in error drops what arrives.
        let again = write(&h, 0, 10);
        h.b.post_send(again).unwrap();
        assert_eq!(
            statuses(&h.completions(Side::B)),
            [CompletionStatus::Flushed]
        );
    }
}

/// Misaligned atomic, a WRITE Middle without a First, a WRITE whose payload
/// disagrees with its RETH length: NAK 0x61 (invalid request), class C.
#[test]
fn invalid_requests_are_fatal() {
    // Misaligned atomic, through the requester.
    let mut h = Harness::new(cfg());
    let (va, rkey) = (h.b.memory().base() + 4, h.b.memory().rkey());
    h.a.post_send(WorkRequest::FetchAdd {
        remote_va: va,
        rkey,
        add: 1,
    })
    .unwrap();
    h.run();
    assert_eq!(
        statuses(&h.completions(Side::A)),
        [CompletionStatus::RemoteInvalidRequest]
    );
    assert!(h.b.is_error() && h.a.is_error());
    assert_eq!(h.b.memory().stats().atomics_executed, 0);

    // Crafted requests at the expected PSN.
    for (opcode, reth_len, payload) in [
        (Opcode::RC_WRITE_MIDDLE, None, 1024),
        (Opcode::RC_WRITE_ONLY, Some(100), 50),
        (Opcode::RC_WRITE_FIRST, Some(100_000), 1000), // First must carry a full MTU
        (Opcode::RC_SEND_LAST, None, 10),
    ] {
        let mut h = Harness::new(cfg_mtu(1024));
        let mut ext = ExtHeaders {
            present: Opcode(opcode.0).info().unwrap().headers,
            ..Default::default()
        };
        if let Some(len) = reth_len {
            ext.reth = Reth {
                va: h.b.memory().base(),
                rkey: h.b.memory().rkey(),
                len,
            };
        }
        assert_eq!(reth_len.is_some(), ext.present.contains(Headers::RETH));
        let pkt = RoceRepr {
            ip: IpHeader::v4(A_IP, B_IP),
            src_port: 0xC000,
            bth: Bth::new(opcode, B_QPN, h.b.expected_psn()),
            ext,
        }
        .to_vec(&vec![0; payload])
        .unwrap();
        h.inject(Side::B, &pkt);
        h.run();
        assert!(h.b.is_error(), "{opcode:?}");
        assert_eq!(h.b.stats().error_naks_sent, 1);
        assert_eq!(h.b.memory().stats().bytes_placed, 0, "{opcode:?}");
        let nak = h.sent(Side::B, |_| true).pop().unwrap();
        assert_eq!(nak.syndrome, Some(Syndrome::Nak(NakCode::InvalidRequest)));
        // A NAK for a PSN nothing is waiting on is ignored by A.
        assert_eq!(h.a.stats().fatal_naks_received, 1);
        assert!(!h.a.is_error());
    }
}

/// A packet overtaken by later ones: NAK-seq, go-back-N, and the late
/// original arrives as a duplicate.
#[test]
fn reordered_packet_recovers() {
    let mut h = write_with_fault(
        Side::A,
        2,
        Fault::Delay(Duration::from_micros(50)),
        10 * 1024,
    );
    assert_write_landed(&mut h, 10 * 1024);
    let (a, b) = (*h.a.stats(), *h.b.stats());
    assert_eq!(b.seq_errors_sent, 1);
    assert_eq!(b.duplicate_requests, 1);
    assert_eq!(a.retransmitted_packets, 8);
    assert_eq!((a.timeouts, b.data_errors), (0, 0));
}

/// Every request delivered twice: duplicates are re-ACKed or replayed, never
/// executed twice, and stale responses are ignored.
#[test]
fn duplicated_requests_are_harmless() {
    let mut h = Harness::new(cfg_mtu(1024));
    h.fault_from(Side::A, None, Fault::Duplicate);
    let (base, rkey) = (h.b.memory().base(), h.b.memory().rkey());
    h.b.post_recv(1);
    h.post(WrOpcode::Write, base, 64 * 1024);
    h.a.post_send(WorkRequest::Send {
        len: 5000,
        imm: None,
    })
    .unwrap();
    h.post(WrOpcode::Read, base + (1 << 20), 10_000);
    h.a.post_send(WorkRequest::FetchAdd {
        remote_va: base + (2 << 20),
        rkey,
        add: 1,
    })
    .unwrap();
    h.run();
    assert_eq!(h.completions(Side::A).len(), 4);
    let requests = h.sent(Side::A, |s| s.is_request()).len() as u64;
    let (a, b) = (*h.a.stats(), *h.b.stats());
    assert_eq!(b.duplicate_requests, requests);
    assert_eq!(h.b.memory().stats().atomics_executed, 1);
    assert_eq!(h.b.memory().stats().sends_received, 1);
    assert_eq!(h.b.msn(), 4);
    assert_eq!(h.b.memory().check_region(base, 64 * 1024), Ok(1));
    assert_eq!(
        (a.data_errors, b.data_errors, a.unexpected_responses),
        (0, 0, 0)
    );
    assert!(!h.a.is_error() && !h.b.is_error());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random loss, duplication and reordering in both directions: every
    /// WQE still completes successfully and the data arrives intact.
    #[test]
    fn random_faults_never_lose_or_corrupt_data(seed in any::<u64>(), drop_pct in 0u64..15) {
        let mut h = Harness::new(cfg_mtu(1024));
        h.delay = Duration::from_micros(100);
        let mut x = seed | 1;
        h.set_fault(move |_, _| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 100 {
                r if r < drop_pct => Fault::Drop,
                r if r < drop_pct + 3 => Fault::Duplicate,
                r if r < drop_pct + 6 => Fault::Delay(Duration::from_micros(x % 300)),
                _ => Fault::Deliver,
            }
        });
        let (base, rkey) = (h.b.memory().base(), h.b.memory().rkey());
        h.b.post_recv(4);
        for i in 0..4u64 {
            h.a.post_send(WorkRequest::Write {
                remote_va: base + i * (64 << 10),
                rkey,
                len: 40_000,
                imm: None,
            }).unwrap();
            h.a.post_send(WorkRequest::Read {
                remote_va: base + (1 << 20) + i * (64 << 10),
                rkey,
                len: 20_000,
            }).unwrap();
            h.a.post_send(WorkRequest::Send { len: 3000, imm: None }).unwrap();
        }
        h.run();
        let c = h.completions(Side::A);
        prop_assert_eq!(c.len(), 12);
        prop_assert!(c.iter().all(|c| c.status == CompletionStatus::Success), "{:?}", c);
        for i in 0..4u64 {
            prop_assert_eq!(
                h.b.memory().check_region(base + i * (64 << 10), 40_000),
                Ok(2 * i as u32 + 1)
            );
        }
        prop_assert_eq!(h.a.stats().data_errors + h.b.stats().data_errors, 0);
        prop_assert_eq!(h.b.memory().stats().sends_received, 4);
        prop_assert_eq!(h.a.memory().stats().read_bytes_received, 80_000);
    }
}
