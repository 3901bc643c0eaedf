//! RDMA WRITE with immediate as NCCL's IB transport uses it (`sim::nccl`),
//! packet by packet, with both endpoint models: the immediate rides only
//! the message's last packet, the responder consumes one receive per
//! message (not per packet) and reports the immediate, a message with no
//! receive posted is RNR NAKed at its immediate's packet with the
//! responder's `min_rnr_timer` (12 without RDMA-CM, as NCCL connects) and
//! then lands whole, and NCCL's
//! zero-length WRITE_WITH_IMM (a QP whose share of a step is empty)
//! consumes a receive too.

use soya_proto::roce::{Opcode, Syndrome};

use super::harness::*;
use crate::rc::hw::hw_config;
use crate::rc::*;

fn models() -> [(&'static str, QpConfig); 2] {
    [("rxe", cfg()), ("hw", hw_config(cfg(), 100e9, false))]
}

fn write_imm(h: &Harness, off: u64, len: u32, imm: u32) -> WorkRequest {
    WorkRequest::Write {
        remote_va: h.b.memory().base() + off,
        rkey: h.b.memory().rkey(),
        len,
        imm: Some(imm),
    }
}

#[test]
fn write_with_imm_carries_the_immediate_on_its_last_packet_and_consumes_one_receive() {
    for (model, c) in models() {
        let mut h = Harness::new(c);
        h.b.post_recv(2);
        // 3 packets (FIRST, MIDDLE, LAST_WITH_IMM), then a one-packet one.
        let wr = write_imm(&h, 0, 3 * 4096 - 100, 0xa1);
        h.a.post_send(wr).unwrap();
        let wr = write_imm(&h, 64 << 10, 1000, 0xb2);
        h.a.post_send(wr).unwrap();
        h.run();
        let ops = h.requests(Side::A, |s| s.opcode);
        assert_eq!(
            ops,
            [
                Opcode::RC_WRITE_FIRST,
                Opcode::RC_WRITE_MIDDLE,
                Opcode::RC_WRITE_LAST_IMM,
                Opcode::RC_WRITE_ONLY_IMM
            ],
            "{model}"
        );
        let r = h.recv_completions(Side::B);
        let got: Vec<(u32, Option<u32>, bool)> =
            r.iter().map(|r| (r.bytes, r.imm, r.rdma_write)).collect();
        assert_eq!(
            got,
            [(3 * 4096 - 100, Some(0xa1), true), (1000, Some(0xb2), true)],
            "{model}: one receive per message, with its immediate"
        );
        assert_eq!(h.b.posted_recvs(), 0, "{model}");
        let m = *h.b.memory().stats();
        assert_eq!(m.bytes_placed, 3 * 4096 - 100 + 1000, "{model}");
        assert_eq!(m.data_errors, 0, "{model}");
        let done = h.completions(Side::A);
        assert_eq!(statuses(&done), [CompletionStatus::Success; 2], "{model}");
    }
}

#[test]
fn write_with_imm_without_a_receive_is_rnr_naked_then_lands_once_one_is_posted() {
    for (model, c) in models() {
        let mut h = Harness::new(c);
        let wr = write_imm(&h, 0, 2 * 4096, 7);
        h.a.post_send(wr).unwrap();
        assert!(
            h.run_until(|h| h.a.stats().rnr_naks_received >= 2),
            "{model}"
        );
        // The receive is needed by the packet that carries the immediate
        // (rxe_resp.c check_resource: RXE_RWR_MASK is on the LAST_WITH_IMM
        // opcode): the FIRST packet is placed, the LAST is refused, and
        // no receive completes.
        let rnr = h.sent(Side::B, |s| {
            matches!(s.syndrome, Some(Syndrome::RnrNak { .. }))
        });
        assert!(!rnr.is_empty(), "{model}");
        assert!(
            rnr.iter()
                .all(|s| s.psn == soya_proto::roce::Psn::new(A_PSN + 1)
                    && s.syndrome == Some(Syndrome::RnrNak { timer: 12 })),
            "{model}: RNR at the immediate's packet; without RDMA-CM the responder asks \
             for 0.64 ms: {rnr:?}"
        );
        assert!(h.recv_completions(Side::B).is_empty(), "{model}");
        h.b.post_recv(1);
        h.run();
        let r = h.recv_completions(Side::B);
        assert_eq!(r.len(), 1, "{model}");
        assert_eq!((r[0].bytes, r[0].imm), (2 * 4096, Some(7)), "{model}");
        assert_eq!(h.b.memory().stats().bytes_placed, 2 * 4096, "{model}");
        assert_eq!(h.b.memory().stats().data_errors, 0, "{model}");
        assert_eq!(
            statuses(&h.completions(Side::A)),
            [CompletionStatus::Success],
            "{model}"
        );
    }
}

#[test]
fn zero_length_write_with_imm_consumes_a_receive() {
    for (model, c) in models() {
        let mut h = Harness::new(c);
        h.b.post_recv(1);
        let wr = write_imm(&h, 0, 0, 0);
        h.a.post_send(wr).unwrap();
        h.run();
        let ops = h.requests(Side::A, |s| s.opcode);
        assert_eq!(ops, [Opcode::RC_WRITE_ONLY_IMM], "{model}");
        let r = h.recv_completions(Side::B);
        assert_eq!(r.len(), 1, "{model}");
        assert_eq!((r[0].bytes, r[0].imm, r[0].rdma_write), (0, Some(0), true));
        assert_eq!(h.b.posted_recvs(), 0, "{model}");
        assert_eq!(
            statuses(&h.completions(Side::A)),
            [CompletionStatus::Success],
            "{model}"
        );
    }
}
