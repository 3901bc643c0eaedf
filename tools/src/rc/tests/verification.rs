//! What the transport cannot see but the data pattern can: corruption with a
//! valid ICRC, and an old packet replayed under a fresh PSN. Plus hostile
//! input: misaddressed, malformed and mutated packets are counted, never
//! executed, never a panic.

use std::cell::RefCell;
use std::rc::Rc;

use proptest::prelude::*;
use soya_proto::roce::icrc;
use soya_proto::roce::{Bth, ExtHeaders, IpHeader, Opcode, Psn, RoceRepr};
use soya_proto::time::Time;

use super::harness::*;
use crate::rc::*;

/// Offset of the payload of a header-less (Middle) IPv4 request.
const MIDDLE_PAYLOAD_AT: usize = 20 + 8 + 12;

/// A payload byte flipped and the ICRC re-sealed: the transport accepts the
/// packet, the pattern check at placement does not.
#[test]
fn corrupted_payload_with_valid_icrc_is_a_data_error() {
    for reseal in [true, false] {
        let mut h = Harness::new(cfg_mtu(1024));
        h.set_fault(move |s, bytes| {
            if s.from == Side::A && s.index == 2 {
                bytes[MIDDLE_PAYLOAD_AT + 100] ^= 0x40;
                if reseal {
                    icrc::seal(bytes).unwrap();
                }
            }
            Fault::Deliver
        });
        let va = h.b.memory().base();
        h.post(WrOpcode::Write, va, 8192);
        h.run();
        // The transport cannot know either way.
        assert_eq!(h.completions(Side::A)[0].status, CompletionStatus::Success);
        let b = *h.b.stats();
        if reseal {
            assert_eq!(b.data_errors, 1);
            assert_eq!(h.b.memory().stats().data_errors, 1);
            assert!(h.b.memory().verify_all().is_err());
            assert_eq!(
                h.b.memory().check_region(va, 8192),
                Err(PatternError::Corrupt {
                    va: va + 2 * 1024 + 100
                })
            );
        } else {
            // A bad ICRC is a drop like a loss: recovered, no data error.
            assert_eq!(b.malformed_dropped, 1);
            assert_eq!(b.data_errors, 0);
            assert_eq!(h.b.memory().check_region(va, 8192), Ok(1));
            assert_eq!(h.a.stats().seq_naks_received, 1);
        }
    }
}

/// An old WRITE packet delayed in some buffer and replayed with the PSN the
/// responder expects now: the transport executes it; the pattern says it
/// belongs to an older message. The same packet at its old PSN is an
/// ordinary duplicate.
#[test]
fn stale_write_replayed_with_a_fresh_psn_is_detected() {
    let mut h = Harness::new(cfg());
    let captured = Rc::new(RefCell::new(None));
    let cap = captured.clone();
    h.set_fault(move |s, bytes| {
        if s.from == Side::A && s.index == 0 {
            *cap.borrow_mut() = Some(bytes.clone());
        }
        Fault::Deliver
    });
    let x = write_again_and_again(&mut h, 3, 2048);
    assert_eq!(h.b.memory().check_region(x, 2048), Ok(3));
    let old = captured.borrow().clone().unwrap();

    // At its own (old) PSN: a duplicate, re-ACKed, not executed.
    h.inject(Side::B, &old);
    h.run();
    assert_eq!(h.b.stats().duplicate_requests, 1);
    assert_eq!(h.b.stats().data_errors, 0);
    assert_eq!(h.b.memory().check_region(x, 2048), Ok(3));

    // Under the PSN B expects next: executed, and caught.
    let mut stale = old;
    set_psn(&mut stale, h.b.expected_psn());
    h.inject(Side::B, &stale);
    h.run();
    assert_eq!(h.b.stats().data_errors, 1);
    assert_eq!(
        h.b.memory().check_region(x, 2048),
        Ok(1),
        "old data is back"
    );

    // The PSN spaces have now slipped by one: A's next WRITE reaches B as a
    // duplicate, is re-ACKed and completes at A although nothing was placed.
    // Only the end-to-end data check sees the loss.
    let y = x + (1 << 20);
    h.post(WrOpcode::Write, y, 2048);
    h.run();
    assert_eq!(h.completions(Side::A)[0].status, CompletionStatus::Success);
    assert_eq!(
        h.b.memory().check_region(y, 2048),
        Ok(0),
        "WRITE 4 never landed"
    );
}

/// A WRITE whose First packet is replaced by the First of an older message
/// (same VA and length, fresh PSN): its blocks carry the older seq, and the
/// rest of the message then mixes seqs. Both are caught.
#[test]
fn packet_of_an_older_message_spliced_into_a_new_one_is_detected() {
    let mut h = Harness::new(cfg_mtu(1024));
    let first_of_msg1 = Rc::new(RefCell::new(None));
    let cap = first_of_msg1.clone();
    h.set_fault(move |s, bytes| {
        if s.from == Side::A && s.index == 0 {
            *cap.borrow_mut() = Some(bytes.clone());
        }
        if s.from == Side::A && s.index == 4 {
            // Message 2's First: swap in message 1's First at this PSN.
            let mut old = cap.borrow().clone().unwrap();
            set_psn(&mut old, s.psn);
            *bytes = old;
        }
        Fault::Deliver
    });
    write_again_and_again(&mut h, 2, 4096);
    // The stale First (older seq), and message 2's three later packets
    // (their seq differs from the one its First claimed).
    assert_eq!(h.b.stats().data_errors, 4);
}

/// A WRITEs `len` bytes `times` times to the start of B's memory (each
/// message with its own pattern seq) and each completes; returns that VA.
fn write_again_and_again(h: &mut Harness, times: usize, len: u32) -> u64 {
    let va = h.b.memory().base();
    for _ in 0..times {
        h.post(WrOpcode::Write, va, len);
    }
    h.run();
    assert_eq!(h.completions(Side::A).len(), times);
    va
}

fn valid_write(h: &Harness, psn: Psn) -> RoceRepr {
    RoceRepr {
        ip: IpHeader::v4(A_IP, B_IP),
        src_port: 0xC000,
        bth: Bth::new(Opcode::RC_WRITE_ONLY, B_QPN, psn),
        ext: ExtHeaders {
            present: Opcode::RC_WRITE_ONLY.info().unwrap().headers,
            reth: soya_proto::roce::Reth {
                va: h.b.memory().base(),
                rkey: h.b.memory().rkey(),
                len: 64,
            },
            ..Default::default()
        },
    }
}

#[test]
fn misaddressed_and_malformed_packets_are_counted_and_dropped() {
    let mut h = Harness::new(cfg());
    let psn = h.b.expected_psn();
    let good = valid_write(&h, psn);
    let payload = {
        let mut p = vec![0; 64];
        pattern_fill(&mut p, h.b.memory().base(), 1);
        p
    };
    let mut wrong_qp = good;
    wrong_qp.bth.dest_qp = B_QPN + 1;
    let mut wrong_dst = good;
    wrong_dst.ip = IpHeader::v4(A_IP, std::net::Ipv4Addr::new(10, 0, 0, 9));
    let mut wrong_src = good;
    wrong_src.ip = IpHeader::v4(std::net::Ipv4Addr::new(10, 0, 0, 9), B_IP);
    for r in [wrong_qp, wrong_dst, wrong_src] {
        h.b.handle_packet(Time::ZERO, &r.to_vec(&payload).unwrap());
    }
    let mut bad_icrc = good.to_vec(&payload).unwrap();
    let n = bad_icrc.len();
    bad_icrc[n - 1] ^= 1;
    let mut bad_pkey = good;
    bad_pkey.bth.pkey = 0x7FFF;
    let mut ud = good;
    ud.bth.opcode = Opcode::UD_SEND_ONLY;
    ud.ext.present = Opcode::UD_SEND_ONLY.info().unwrap().headers;
    let good_bytes = good.to_vec(&payload).unwrap();
    for bytes in [
        vec![],
        vec![0x45; 3],
        b"not a packet at all, but long enough to look at".to_vec(),
        good_bytes[..good_bytes.len() - 10].to_vec(),
        bad_icrc,
        bad_pkey.to_vec(&payload).unwrap(),
        ud.to_vec(&payload).unwrap(),
    ] {
        h.b.handle_packet(Time::ZERO, &bytes);
    }
    let cnp = soya_proto::roce::builders::cnp(&soya_proto::roce::builders::ReplyTo {
        ip: IpHeader::v4(A_IP, B_IP),
        src_port: 0,
        dest_qp: B_QPN,
    });
    h.b.handle_packet(Time::ZERO, &cnp.to_vec(&[]).unwrap());
    let s = *h.b.stats();
    assert_eq!(s.misaddressed_dropped, 3);
    assert_eq!(s.malformed_dropped, 7);
    assert_eq!(s.cnps_received, 1);
    assert_eq!(s.packets_received, 0);
    assert_eq!(h.b.expected_psn(), psn, "nothing executed");
    // The good one is executed.
    h.b.handle_packet(Time::ZERO, &good_bytes);
    assert_eq!(h.b.expected_psn(), psn.next());
    assert_eq!(h.b.memory().stats().bytes_placed, 64);
    assert_eq!(h.b.stats().data_errors, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Mutated packets (with or without a re-sealed ICRC) never panic, and
    /// every packet a QP is handed is accounted for exactly once.
    #[test]
    fn mutated_packets_never_panic(
        muts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        reseal in any::<bool>(),
        truncate in 0usize..8,
        opcode in prop::sample::select(vec![
            Opcode::RC_WRITE_ONLY, Opcode::RC_WRITE_FIRST, Opcode::RC_READ_REQUEST,
            Opcode::RC_FETCH_ADD, Opcode::RC_ACK, Opcode::RC_READ_RESPONSE_ONLY,
            Opcode::RC_SEND_ONLY_IMM, Opcode::RC_ATOMIC_ACK,
        ]),
    ) {
        let mut h = Harness::new(QpConfig { mem_size: 64 << 10, ..cfg() });
        let (va, rkey) = (h.b.memory().base(), h.b.memory().rkey());
        h.a.post_send(WorkRequest::Read { remote_va: va, rkey, len: 100 }).unwrap();
        for (target, from, qpn, psn) in [
            (Side::B, A_IP, B_QPN, h.b.expected_psn()),
            (Side::A, B_IP, A_QPN, h.a.send_psn()),
        ] {
            let to = if target == Side::A { A_IP } else { B_IP };
            let mut r = valid_write(&h, psn);
            r.ip = IpHeader::v4(from, to);
            r.bth.dest_qp = qpn;
            r.bth.opcode = opcode;
            r.ext.present = opcode.info().unwrap().headers;
            let data = matches!(opcode.info().unwrap().payload, soya_proto::roce::opcode::Payload::Data);
            let mut bytes = r.to_vec(if data { &[7u8; 64] } else { &[] }).unwrap();
            for (at, v) in &muts {
                let i = at.index(bytes.len());
                bytes[i] = *v;
            }
            bytes.truncate(bytes.len() - truncate.min(bytes.len()));
            if reseal && bytes.len() > 4 {
                let _ = icrc::seal(&mut bytes);
            }
            h.inject(target, &bytes);
            // A forged packet that executes can shift the PSN spaces for
            // good (then the requester retries forever, as rxe would).
            h.run_for(std::time::Duration::from_secs(1));
        }
        for side in [Side::A, Side::B] {
            let s = *h.qp(side).stats();
            prop_assert_eq!(
                s.malformed_dropped + s.misaddressed_dropped + s.cnps_received
                    + s.dropped_in_error + s.packets_received,
                h.delivered[side as usize]
            );
        }
    }
}
