//! The two hosts of the in-memory benchmarks and tests: a requester
//! (10.1.0.1, QP 0x11) and a responder (10.2.0.1, QP 0x22), and the
//! packets each sends. Shared by `proxy/benches/engine.rs`,
//! `proxy/benches/pair.rs` and `proxy/tests/steady_state_alloc.rs` (which
//! include this file by path), so that the benchmarks time the packets the
//! allocation test counts.

// Each including file uses a part of it.
#![allow(dead_code)]

use std::net::Ipv4Addr;

use soya::qp::HalfKey;
use soya::roce::{builders, IpHeader, Opcode, Psn, Reth, RoceRepr};

pub const REQUESTER: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
pub const RESPONDER: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
/// The requester's QP (whatever host it runs on).
pub const RQ_QPN: u32 = 0x11;
/// The responder's QP.
pub const RS_QPN: u32 = 0x22;

/// The half of `requester`'s QP to the responder's.
pub fn key(requester: Ipv4Addr) -> HalfKey {
    HalfKey {
        requester: requester.into(),
        responder: RESPONDER.into(),
        responder_qpn: RS_QPN,
    }
}

/// A request of opcode `op` from `requester` to the responder's QP at PSN
/// `psn` (its low 24 bits), with a RETH (where `op` has one) for a message
/// of `len` bytes; the caller emits it with the payload.
pub fn request(requester: Ipv4Addr, op: Opcode, psn: u32, ack_req: bool, len: u32) -> RoceRepr {
    let reth = Reth {
        va: 0x1000,
        rkey: 7,
        len,
    };
    let ip = IpHeader::v4(requester, RESPONDER);
    builders::request(ip, RS_QPN, op, Psn::new(psn), ack_req, reth)
}

/// The responder's ACK of `psn` (its low 24 bits) with MSN `msn`, to
/// `requester`'s QP; the caller emits it (no payload).
pub fn ack(requester: Ipv4Addr, psn: u32, msn: u32) -> RoceRepr {
    let to = builders::ReplyTo {
        ip: IpHeader::v4(RESPONDER, requester),
        src_port: 0xc000,
        dest_qp: RQ_QPN,
    };
    builders::ack(&to, Psn::new(psn), msn)
}

/// [`ack`] to [`REQUESTER`]'s QP, written into `buf`; returns its length.
/// The pair benchmark and the allocation test answer in place, without a
/// `Vec` per ACK.
pub fn emit_ack(psn: u32, msn: u32, buf: &mut [u8]) -> usize {
    ack(REQUESTER, psn, msn).emit(&[], buf).unwrap()
}
