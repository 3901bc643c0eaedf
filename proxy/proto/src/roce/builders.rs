//! Complete, ICRC-correct packets the gateway originates: ACK, NAK (each
//! code), RNR NAK, CNP and RDMA-CM MADs ([`cm_mad`]); and, for tests,
//! benchmarks and tools, a requester's packet ([`request`]) and a
//! responder's ([`response`]). They return a [`RoceRepr`]; emit it into a
//! slab slot with [`RoceRepr::emit`] or into a vector with
//! [`RoceRepr::to_vec`].

use super::bth::Bth;
use super::cm::GSI_QKEY;
use super::ext::{Aeth, Deth, ExtHeaders, NakCode, Reth, Syndrome};
use super::ip::IpHeader;
use super::opcode::{Headers, Opcode};
use super::packet::{RocePacket, RoceRepr};
use super::psn::Psn;

/// Where an answer goes: addresses as the real peer would use them.
///
/// rxe's receiver checks that an ACK comes *from* the QP's remote address
/// (rxe_recv.c `check_addr`), so a pseudo-ACK carries the responder's IP as
/// its source. The UDP source port is not checked; rxe uses the same port in
/// both directions, so the request's port is the natural choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyTo {
    pub ip: IpHeader,
    pub src_port: u16,
    /// The requester's QPN (the BTH carries only the destination QP).
    pub dest_qp: u32,
}

impl ReplyTo {
    /// The reply path for `request`, whose sender owns QP `requester_qpn`.
    pub fn answering(request: &RocePacket<'_>, requester_qpn: u32) -> ReplyTo {
        ReplyTo {
            ip: request.ip.reversed(),
            src_port: request.udp.src_port,
            dest_qp: requester_qpn,
        }
    }
}

fn aeth_packet(to: &ReplyTo, psn: Psn, syndrome: Syndrome, msn: u32) -> RoceRepr {
    response(to, Opcode::RC_ACK, psn, syndrome, msn)
}

/// A responder's packet of opcode `op` (an ACK, a part of a READ response,
/// an atomic ACK), its AETH, where the opcode has one, carrying `syndrome`
/// and `msn`; the caller emits it with the payload. The gateway itself
/// answers with [`ack`], [`nak`] and [`rnr_nak`]; tests and benchmarks
/// play a responder with this, as they play a requester with [`request`].
pub fn response(to: &ReplyTo, op: Opcode, psn: Psn, syndrome: Syndrome, msn: u32) -> RoceRepr {
    let present = op.info().map_or(Headers::NONE, |i| i.headers);
    RoceRepr {
        ip: to.ip,
        src_port: to.src_port,
        bth: Bth::new(op, to.dest_qp, psn),
        ext: ExtHeaders {
            present,
            aeth: present.contains(Headers::AETH).then_some(Aeth {
                syndrome,
                msn: msn & 0xFF_FFFF,
            }),
            ..Default::default()
        },
    }
}

/// Positive ACK of every request up to and including `psn` (syndrome 0x1F:
/// unlimited credits, as rxe sends).
pub fn ack(to: &ReplyTo, psn: Psn, msn: u32) -> RoceRepr {
    aeth_packet(to, psn, Syndrome::ACK_UNLIMITED, msn)
}

/// NAK. For a PSN sequence error `psn` is the *expected* PSN; for the other
/// codes it is the PSN of the offending request.
pub fn nak(to: &ReplyTo, psn: Psn, code: NakCode, msn: u32) -> RoceRepr {
    aeth_packet(to, psn, Syndrome::Nak(code), msn)
}

/// RNR NAK for the request at `psn`; the requester waits the time encoded
/// by `timer` (see [`super::ext::RNR_TIMER_US`]) before retrying.
pub fn rnr_nak(to: &ReplyTo, psn: Psn, timer: u8, msn: u32) -> RoceRepr {
    aeth_packet(
        to,
        psn,
        Syndrome::RnrNak {
            timer: timer & 0x1F,
        },
        msn,
    )
}

/// A request of opcode `op` to QP `dest_qp` from UDP port 0xc000 (as rxe
/// picks its source ports), with `reth` where the opcode carries a RETH;
/// the caller emits it with the payload.
pub fn request(
    ip: IpHeader,
    dest_qp: u32,
    op: Opcode,
    psn: Psn,
    ack_req: bool,
    reth: Reth,
) -> RoceRepr {
    let mut bth = Bth::new(op, dest_qp, psn);
    bth.ack_req = ack_req;
    RoceRepr {
        ip,
        src_port: 0xc000,
        bth,
        ext: ExtHeaders {
            present: op.info().map_or(Headers::NONE, |i| i.headers),
            reth,
            ..Default::default()
        },
    }
}

/// Congestion notification toward the QP `to.dest_qp` (the sender of the
/// congested flow): BECN set, PSN 0, 16 reserved bytes. Not in any PSN space.
pub fn cnp(to: &ReplyTo) -> RoceRepr {
    let mut bth = Bth::new(Opcode::CNP, to.dest_qp, Psn::new(0));
    bth.becn = true;
    RoceRepr {
        ip: to.ip,
        src_port: to.src_port,
        bth,
        ext: ExtHeaders {
            present: Headers::CNP_PAD,
            ..Default::default()
        },
    }
}

/// The headers of an RDMA-CM MAD from one host's CM to another's (`ip`):
/// UD SEND Only from QP1 to QP1 with the GSI Q_Key. The MAD is the payload.
pub fn cm_mad(ip: IpHeader) -> RoceRepr {
    let op = Opcode::UD_SEND_ONLY;
    RoceRepr {
        ip,
        src_port: 0xc000,
        bth: Bth::new(op, 1, Psn::new(0)),
        ext: ExtHeaders {
            present: op.info().map_or(Headers::NONE, |i| i.headers),
            deth: Deth {
                qkey: GSI_QKEY,
                src_qp: 1,
            },
            ..Default::default()
        },
    }
}
