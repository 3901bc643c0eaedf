//! Loss-free operation: every op and size, the window, AckReq placement,
//! READ depth, both directions at once, PSN wrap-around, IPv6, config.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use soya_proto::roce::{OpKind, Opcode, Psn};

use super::harness::*;
use crate::rc::*;

/// 0 B to 1 MiB, around every block and MTU boundary.
const SIZES: &[u32] = &[
    0,
    1,
    3,
    4,
    5,
    63,
    64,
    65,
    1000,
    1024,
    1025,
    4096,
    4097,
    65536,
    1 << 20,
];

/// A harness with `mtu`, and distinct 4 KiB-aligned regions of B's memory
/// for SIZES, one after the other.
fn every_size(mtu: usize) -> (Harness, Vec<u64>) {
    let h = Harness::new(cfg_mtu(mtu));
    let mut va = h.b.memory().base();
    let vas = SIZES
        .iter()
        .map(|&s| {
            let v = va;
            va += u64::from(s).max(1).next_multiple_of(4096);
            v
        })
        .collect();
    (h, vas)
}

fn pattern(va: u64, len: u32, seq: u32) -> Vec<u8> {
    let mut v = vec![0; len as usize];
    pattern_fill(&mut v, va, seq);
    v
}

fn psns_for(len: u32, mtu: usize) -> u32 {
    len.div_ceil(mtu as u32).max(1)
}

fn assert_clean(h: &Harness) {
    for q in [&h.a, &h.b] {
        let s = q.stats();
        assert!(!q.is_error(), "{q:?}");
        assert_eq!(s.data_errors, 0, "{s:?}");
        assert_eq!(s.timeouts, 0, "{s:?}");
        assert_eq!(s.retransmitted_packets, 0, "{s:?}");
        assert_eq!(s.unexpected_responses, 0, "{s:?}");
        assert_eq!(q.memory().verify_all().map(|_| ()), Ok(()));
    }
}

/// A posts one `op` (WRITE or READ) of each of SIZES at its region in
/// `vas`, runs to the end, and each completes successfully, in order.
fn each_size_succeeds(h: &mut Harness, op: WrOpcode, vas: &[u64]) {
    for (&len, &va) in SIZES.iter().zip(vas) {
        h.post(op, va, len);
    }
    h.run();
    let comps = h.completions(Side::A);
    assert_eq!(comps.len(), SIZES.len());
    for (c, &len) in comps.iter().zip(SIZES) {
        assert_eq!(
            (c.status, c.bytes, c.opcode),
            (CompletionStatus::Success, len, op)
        );
    }
}

#[test]
fn write_of_every_size_lands_verified() {
    for mtu in [1024, 4096] {
        let (mut h, vas) = every_size(mtu);
        each_size_succeeds(&mut h, WrOpcode::Write, &vas);
        // The n-th WRITE/SEND posted carries msg_seq n.
        for (i, (&len, &va)) in SIZES.iter().zip(&vas).enumerate() {
            let got = h.b.memory().read(va, len as usize).unwrap();
            assert!(got == pattern(va, len, i as u32 + 1), "mtu {mtu} len {len}");
        }
        let total: u64 = SIZES.iter().map(|&s| u64::from(s)).sum();
        let ms = *h.b.memory().stats();
        assert_eq!(ms.bytes_placed, total);
        assert_eq!(ms.writes_placed, SIZES.len() as u64);
        assert_eq!(ms.bytes_unverified, 1 + 3, "only the 1- and 3-byte WRITEs");
        assert_eq!(ms.bytes_verified, total - 4);
        let psns: u32 = SIZES.iter().map(|&s| psns_for(s, mtu)).sum();
        assert_eq!(h.a.send_psn(), Psn::new(A_PSN).add(psns));
        assert_eq!(h.b.expected_psn(), h.a.send_psn());
        assert_eq!(h.b.msn(), SIZES.len() as u32);
        assert_eq!(h.a.stats().messages_completed, SIZES.len() as u64);
        assert_eq!(h.a.stats().bytes_completed_writes_sends(), total);
        assert_eq!(h.a.outstanding(), 0);
        assert_eq!(h.a.poll_timeout(), None, "timer disarmed once all is acked");
        assert_clean(&h);
    }
}

#[test]
fn send_and_write_with_imm_consume_receives() {
    for mtu in [1024, 4096] {
        let mut h = Harness::new(cfg_mtu(mtu));
        let rkey = h.b.memory().rkey();
        h.b.post_recv(SIZES.len() as u32 + 1);
        for (i, &len) in SIZES.iter().enumerate() {
            let imm = (i % 2 == 1).then_some(0xabc0 + i as u32);
            h.a.post_send(WorkRequest::Send { len, imm }).unwrap();
        }
        let va = h.b.memory().base() + (2 << 20);
        h.a.post_send(WorkRequest::Write {
            remote_va: va,
            rkey,
            len: 5000,
            imm: Some(7),
        })
        .unwrap();
        h.run();
        let comps = h.completions(Side::A);
        assert_eq!(comps.len(), SIZES.len() + 1);
        assert!(comps.iter().all(|c| c.status == CompletionStatus::Success));
        let recvs = h.recv_completions(Side::B);
        assert_eq!(recvs.len(), SIZES.len() + 1);
        for (i, (r, &len)) in recvs.iter().zip(SIZES).enumerate() {
            assert_eq!(r.bytes, len);
            assert_eq!(r.imm, (i % 2 == 1).then_some(0xabc0 + i as u32));
            assert!(!r.rdma_write);
        }
        let last = recvs.last().unwrap();
        assert_eq!(
            (last.bytes, last.imm, last.rdma_write),
            (5000, Some(7), true)
        );
        assert_eq!(
            h.b.memory().read(va, 5000).unwrap(),
            pattern(va, 5000, SIZES.len() as u32 + 1)
        );
        let ms = *h.b.memory().stats();
        let total: u64 = SIZES.iter().map(|&s| u64::from(s)).sum();
        assert_eq!(ms.send_bytes_received, total);
        assert_eq!(ms.sends_received, SIZES.len() as u64);
        assert_eq!(h.b.posted_recvs(), 0);
        assert_eq!(h.b.stats().recv_completed, SIZES.len() as u64 + 1);
        assert_eq!(h.b.stats().rnr_naks_sent, 0);
        assert_clean(&h);
    }
}

#[test]
fn read_of_every_size_brings_the_remote_data() {
    for mtu in [1024, 4096] {
        let (mut h, vas) = every_size(mtu);
        // Give B's copy a seq A's memory does not have, so a READ that does
        // nothing cannot pass.
        for (&len, &va) in SIZES.iter().zip(&vas) {
            h.b.memory_mut().write(va, &pattern(va, len, 77));
        }
        each_size_succeeds(&mut h, WrOpcode::Read, &vas);
        for (&len, &va) in SIZES.iter().zip(&vas) {
            assert!(h.a.memory().read(va, len as usize).unwrap() == pattern(va, len, 77));
        }
        // A READ of L bytes takes max(1, ceil(L/MTU)) PSNs; the next request
        // skips past them.
        let reqs = h.sent(Side::A, |s| s.kind == OpKind::ReadRequest);
        assert_eq!(reqs.len(), SIZES.len());
        for (w, &len) in reqs.windows(2).zip(SIZES) {
            assert_eq!(
                w[1].psn.diff(w[0].psn) as u32,
                psns_for(len, mtu),
                "len {len}"
            );
        }
        // Responses: Only, or First Middle* Last, PSN = request PSN + i, AETH
        // on all but Middle.
        let resps = h.sent(Side::B, |s| s.kind == OpKind::ReadResponse);
        let mut it = resps.iter();
        for (req, &len) in reqs.iter().zip(SIZES) {
            let n = psns_for(len, mtu);
            for i in 0..n {
                let r = it.next().unwrap();
                assert_eq!(r.psn, req.psn.add(i));
                let want = match (n, i) {
                    (1, _) => Opcode::RC_READ_RESPONSE_ONLY,
                    (_, 0) => Opcode::RC_READ_RESPONSE_FIRST,
                    (_, i) if i == n - 1 => Opcode::RC_READ_RESPONSE_LAST,
                    _ => Opcode::RC_READ_RESPONSE_MIDDLE,
                };
                assert_eq!(r.opcode, want);
                let rest = len - i * mtu as u32;
                assert_eq!(r.payload_len, rest.min(mtu as u32) as usize);
                assert_eq!(
                    r.syndrome.is_some(),
                    want != Opcode::RC_READ_RESPONSE_MIDDLE
                );
            }
        }
        assert!(it.next().is_none());
        let total: u64 = SIZES.iter().map(|&s| u64::from(s)).sum();
        assert_eq!(h.a.memory().stats().read_bytes_received, total);
        assert_eq!(h.b.memory().stats().read_bytes_served, total);
        assert_eq!(h.b.msn(), SIZES.len() as u32, "one MSN per READ");
        assert_clean(&h);
    }
}

#[test]
fn atomics_return_the_original_value() {
    let mut h = Harness::new(cfg());
    let rkey = h.b.memory().rkey();
    let va = h.b.memory().base() + 8 * 100;
    h.b.memory_mut().write(va, &40u64.to_le_bytes());
    for _ in 0..3 {
        h.a.post_send(WorkRequest::FetchAdd {
            remote_va: va,
            rkey,
            add: 2,
        })
        .unwrap();
    }
    for (compare, swap) in [(46, 1000), (5, 7)] {
        h.a.post_send(WorkRequest::CmpSwap {
            remote_va: va,
            rkey,
            compare,
            swap,
        })
        .unwrap();
    }
    h.run();
    let comps = h.completions(Side::A);
    let origs: Vec<_> = comps.iter().map(|c| c.atomic_orig).collect();
    assert_eq!(
        origs,
        [Some(40), Some(42), Some(44), Some(46), Some(1000)],
        "{comps:?}"
    );
    assert!(comps
        .iter()
        .all(|c| c.status == CompletionStatus::Success && c.bytes == 8));
    assert_eq!(comps[3].opcode, WrOpcode::CmpSwap);
    assert_eq!(h.b.memory().read_u64(va), Some(1000));
    assert_eq!(h.b.memory().stats().atomics_executed, 5);
    assert_eq!(h.b.stats().responses_sent, 5);
    assert_eq!(h.b.msn(), 5);
    assert_clean(&h);
}

/// 1024 PSNs of WRITE over a 2 ms RTT: the window fills to exactly
/// `max_unacked_psns` and never beyond (checked against the ACKs actually
/// delivered, on the wire).
#[test]
fn window_never_exceeds_max_unacked_psns() {
    for window in [128, 32] {
        let mut h = Harness::new(QpConfig {
            max_unacked_psns: window,
            ack_req_every: window.min(64) / 2,
            ..cfg_mtu(1024)
        });
        h.delay = Duration::from_millis(1);
        let va = h.b.memory().base();
        h.post(WrOpcode::Write, va, 1 << 20);
        h.run();
        assert_eq!(h.max_inflight[0], window as i32);
        assert_eq!(h.completions(Side::A)[0].status, CompletionStatus::Success);
        assert_eq!(h.b.memory().check_region(va, 1 << 20), Ok(1));
        assert_clean(&h);
    }
}

/// AckReq goes on the last packet of every message and on every 64th packet
/// since the previous AckReq, across message boundaries.
#[test]
fn ack_req_on_last_packet_and_every_64th() {
    let mut h = Harness::new(cfg_mtu(1024));
    let (base, rkey) = (h.b.memory().base(), h.b.memory().rkey());
    h.b.post_recv(1);
    let wrs = [
        WorkRequest::Write {
            remote_va: base,
            rkey,
            len: 200 * 1024,
            imm: None,
        },
        WorkRequest::Write {
            remote_va: base + (1 << 20),
            rkey,
            len: 10 * 1024,
            imm: None,
        },
        WorkRequest::Read {
            remote_va: base + (2 << 20),
            rkey,
            len: 3000,
        },
        WorkRequest::Send {
            len: 70 * 1024,
            imm: None,
        },
    ];
    let mut expected = Vec::new();
    let mut noack = 0;
    for wr in &wrs {
        let n = match wr {
            WorkRequest::Read { .. } => 1,
            _ => psns_for(wr.len(), 1024),
        };
        for i in 0..n {
            let ack = i == n - 1 || noack + 1 >= 64;
            noack = if ack { 0 } else { noack + 1 };
            expected.push(ack);
        }
    }
    for wr in wrs {
        h.a.post_send(wr).unwrap();
    }
    h.run();
    let got = h.requests(Side::A, |s| s.ack_req);
    assert_eq!(got, expected);
    assert!(got[63] && !got[62] && got[127] && got[199] && got[274] && !got[273]);
    // The responder ACKs exactly the AckReq'd SEND/WRITE packets.
    let acks = expected.iter().filter(|&&a| a).count() - 1; // minus the READ
    assert_eq!(h.b.stats().acks_sent, acks as u64);
    assert_clean(&h);
}

#[test]
fn read_and_atomic_depth_is_limited() {
    let mut h = Harness::new(QpConfig {
        max_rd_atomic: 3, // rounded up to 4, as rxe does
        ..cfg()
    });
    h.delay = Duration::from_millis(1);
    let (base, rkey) = (h.b.memory().base(), h.b.memory().rkey());
    for i in 0..10u64 {
        let wr = if i % 3 == 2 {
            WorkRequest::FetchAdd {
                remote_va: base + (3 << 20) + 8 * i,
                rkey,
                add: 1,
            }
        } else {
            WorkRequest::Read {
                remote_va: base + 4096 * i,
                rkey,
                len: 1024,
            }
        };
        h.a.post_send(wr).unwrap();
    }
    h.run();
    assert_eq!(h.max_reads_out[0], 4);
    assert_eq!(h.completions(Side::A).len(), 10);
    assert_clean(&h);
}

/// Both sides request at once: WRITE, READ, SEND and atomics each way over
/// one QP pair, with loss, duplication and reordering on the wire.
#[test]
fn bidirectional_traffic_on_one_qp_pair() {
    let mut h = Harness::new(cfg_mtu(1024));
    h.delay = Duration::from_micros(200);
    h.set_fault(|s, _| match (s.index + 1) % 53 {
        0 => Fault::Drop,
        17 => Fault::Duplicate,
        31 => Fault::Delay(Duration::from_micros(150)),
        _ => Fault::Deliver,
    });
    let mut writes = Vec::new();
    for side in [Side::A, Side::B] {
        let peer = match side {
            Side::A => Side::B,
            Side::B => Side::A,
        };
        let (base, rkey) = (h.qp(peer).memory().base(), h.qp(peer).memory().rkey());
        h.qp(peer).post_recv(3);
        // Peer memory: WRITEs in [0, 1 MiB), READs from [2, 2.5) MiB,
        // atomics at 3 MiB: READ data lands locally at the same VA, so the
        // regions must not overlap what the peer writes here.
        let mut seq = 0;
        for i in 0..4u64 {
            let va = base + i * (256 << 10);
            h.qp(side)
                .post_send(WorkRequest::Write {
                    remote_va: va,
                    rkey,
                    len: 256 << 10,
                    imm: None,
                })
                .unwrap();
            seq += 1;
            writes.push((peer, va, seq));
            h.qp(side)
                .post_send(WorkRequest::Read {
                    remote_va: base + (2 << 20) + i * (64 << 10),
                    rkey,
                    len: 64 << 10,
                })
                .unwrap();
            if i < 3 {
                h.qp(side)
                    .post_send(WorkRequest::Send {
                        len: 8 << 10,
                        imm: None,
                    })
                    .unwrap();
                seq += 1;
            }
            h.qp(side)
                .post_send(WorkRequest::FetchAdd {
                    remote_va: base + (3 << 20),
                    rkey,
                    add: 1,
                })
                .unwrap();
        }
    }
    h.run();
    for side in [Side::A, Side::B] {
        let comps = h.completions(side);
        assert_eq!(comps.len(), 15);
        assert!(
            comps.iter().all(|c| c.status == CompletionStatus::Success),
            "{comps:?}"
        );
        let mut origs: Vec<u64> = comps.iter().filter_map(|c| c.atomic_orig).collect();
        origs.sort();
        let first = origs[0];
        assert_eq!(origs, (first..first + 4).collect::<Vec<_>>());
        assert_eq!(h.recv_completions(side).len(), 3);
    }
    for (at, va, seq) in writes {
        assert_eq!(h.qp(at).memory().check_region(va, 256 << 10), Ok(seq));
    }
    for q in [&h.a, &h.b] {
        assert!(!q.is_error());
        assert_eq!(q.stats().data_errors, 0, "{:?}", q.stats());
        assert!(q.stats().retransmitted_packets > 0, "the faults did bite");
        assert!(q.memory().stats().read_bytes_received >= 4 * (64 << 10));
    }
    assert!(h.a.stats().duplicate_requests + h.b.stats().duplicate_requests > 0);
}

/// Start PSNs just below 2^24: a 1 MiB WRITE wraps A's PSN space (with a
/// loss right after the wrap), a READ wraps B's.
#[test]
fn psn_wraparound() {
    let mut h = Harness::with(
        cfg_mtu(1024),
        cfg_mtu(1024),
        Psn::new(0xFF_FF00),
        Psn::new(0xFF_FFF8),
    );
    h.delay = Duration::from_micros(100);
    let mut dropped = false;
    h.set_fault(move |s, _| {
        if s.from == Side::A && s.psn == Psn::new(5) && s.is_request() && !dropped {
            dropped = true;
            Fault::Drop
        } else {
            Fault::Deliver
        }
    });
    let (bbase, brkey) = (h.b.memory().base(), h.b.memory().rkey());
    let (abase, arkey) = (h.a.memory().base(), h.a.memory().rkey());
    h.a.post_send(WorkRequest::Write {
        remote_va: bbase,
        rkey: brkey,
        len: 1 << 20,
        imm: None,
    })
    .unwrap();
    let rva = abase + (2 << 20);
    h.a.memory_mut().write(rva, &pattern(rva, 64 << 10, 9));
    h.b.post_send(WorkRequest::Read {
        remote_va: rva,
        rkey: arkey,
        len: 64 << 10,
    })
    .unwrap();
    h.run();
    assert_eq!(h.completions(Side::A)[0].status, CompletionStatus::Success);
    assert_eq!(h.completions(Side::B)[0].status, CompletionStatus::Success);
    assert_eq!(h.b.memory().check_region(bbase, 1 << 20), Ok(1));
    assert_eq!(h.b.memory().check_region(rva, 64 << 10), Ok(9));
    assert_eq!(h.a.send_psn(), Psn::new(0xFF_FF00 + 1024 - (1 << 24)));
    assert_eq!(h.b.send_psn(), Psn::new(0xFF_FFF8 + 64 - (1 << 24)));
    assert_eq!(h.a.stats().seq_naks_received, 1);
    assert_eq!(h.a.stats().timeouts, 0);
    assert_eq!(h.b.stats().data_errors + h.a.stats().data_errors, 0);
}

#[test]
fn ipv6_endpoints() {
    let a6: IpAddr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into();
    let b6: IpAddr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into();
    let mut h = Harness::between(cfg(), cfg(), Psn::new(1), Psn::new(2), a6, b6);
    let va = h.b.memory().base();
    h.post(WrOpcode::Write, va, 10_000);
    h.post(WrOpcode::Read, va + (1 << 20), 10_000);
    h.run();
    assert_eq!(h.completions(Side::A).len(), 2);
    assert_eq!(h.b.memory().check_region(va, 10_000), Ok(1));
    assert_clean(&h);
}

#[test]
fn config_is_validated() {
    let a = QpAddr {
        ip: A_IP.into(),
        qpn: 1,
    };
    let b = QpAddr {
        ip: B_IP.into(),
        qpn: 2,
    };
    let p = Psn::new(0);
    let small = || QpConfig {
        mem_size: 4096,
        ..QpConfig::default()
    };
    for mtu in [256, 512, 1500, 9000] {
        assert!(RcQp::new(QpConfig { mtu, ..small() }, a, b, p, p).is_err());
    }
    for mtu in [1024, 2048, 4096] {
        assert!(RcQp::new(QpConfig { mtu, ..small() }, a, b, p, p).is_ok());
    }
    let bad = [
        QpConfig {
            max_rd_atomic: 0,
            ..small()
        },
        QpConfig {
            retry_cnt: 8,
            ..small()
        },
        QpConfig {
            max_unacked_psns: 0,
            ..small()
        },
        QpConfig {
            ack_req_every: 0,
            ..small()
        },
    ];
    for c in bad {
        assert!(RcQp::new(c, a, b, p, p).is_err());
    }
    let v6 = QpAddr {
        ip: Ipv6Addr::LOCALHOST.into(),
        qpn: 2,
    };
    assert!(RcQp::new(small(), a, v6, p, p).is_err(), "mixed families");
    let big = QpAddr {
        ip: b.ip,
        qpn: 1 << 24,
    };
    assert!(RcQp::new(small(), a, big, p, p).is_err());
    let d = QpConfig::default();
    assert_eq!(d.ack_timeout(), Some(Duration::from_nanos(4096 << 14)));
    assert_eq!(
        QpConfig {
            timeout_code: 0,
            ..d.clone()
        }
        .ack_timeout(),
        None
    );
    assert_eq!(
        QpConfig {
            max_rd_atomic: 3,
            ..d.clone()
        }
        .rd_atomic_depth(),
        4
    );
    assert_eq!(d.rd_atomic_depth(), 16);
    let q = RcQp::new(
        QpConfig {
            rkey: Some(0x1234),
            ..small()
        },
        a,
        b,
        p,
        p,
    )
    .unwrap();
    assert_eq!(q.memory().rkey(), 0x1234);
}

#[test]
fn send_queue_is_bounded() {
    let mut h = Harness::new(QpConfig {
        max_send_wqes: 4,
        ..cfg()
    });
    let send = WorkRequest::Send { len: 1, imm: None };
    for i in 1..=4 {
        assert_eq!(h.a.post_send(send), Ok(i));
    }
    assert_eq!(h.a.post_send(send), Err(PostError::QueueFull));
    assert_eq!(
        h.a.post_send(WorkRequest::Send {
            len: MAX_MSG_SIZE + 1,
            imm: None
        }),
        Err(PostError::TooLong)
    );
    assert_eq!(h.a.outstanding(), 4);
    h.b.post_recv(4);
    h.run();
    assert_eq!(h.completions(Side::A).len(), 4);
    assert_eq!(h.a.post_send(send), Ok(5));
}
