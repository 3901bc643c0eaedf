//! Moving a local QP that has nothing outstanding to the error state when
//! its twin is lost (issue 14).
//!
//! A gateway that pseudo-ACKs leaves its requester with nothing outstanding.
//! When the far gateway is lost for good, a NAK toward that requester cannot
//! land: rxe's completer drops a response when no send WQE covers its PSN
//! (rxe_comp.c `check_psn`), and an application that only waits (rping
//! waiting for the peer's SEND, a server with receives posted) would wait
//! forever. The same QP is, however, also the *responder* of its peer's
//! requests, and the gateway is the only path from that peer to it. A
//! request its responder must refuse fatally moves the whole QP to the error
//! state, and then every posted receive completes with `IB_WC_WR_FLUSH_ERR`
//! (rxe_resp.c: `do_class_ac_error` sets `goto_error`; `RESPST_ERROR` calls
//! `rxe_qp_error`; in the error state `get_req` → `check_resource` completes
//! each receive WQE with `IB_WC_WR_FLUSH_ERR`).
//!
//! The request chosen is an **opcode-sequence error** at the responder's
//! expected PSN (ePSN), rxe_resp.c `check_op_seq`:
//!
//! | message in progress at the responder | rxe's answer to | the gateway sends |
//! | --- | --- | --- |
//! | none (last opcode ended a message, or a READ/atomic, or none yet) | SEND/WRITE Middle or Last: `RESPST_ERR_MISSING_OPCODE_FIRST` | SEND Middle |
//! | a SEND (First/Middle received) | anything but SEND Middle/Last: `RESPST_ERR_MISSING_OPCODE_LAST_C` | RDMA WRITE Middle |
//! | an RDMA WRITE (First/Middle received) | anything but WRITE Middle/Last: `RESPST_ERR_MISSING_OPCODE_LAST_C` | SEND Middle |
//!
//! All three are handled by rxe as "RC Only - Class C": `do_class_ac_error
//! (AETH_NAK_INVALID_REQ, IB_WC_REM_INV_REQ_ERR)`, a NAK Invalid Request to
//! the sender, and the QP goes to the error state. The packet carries no
//! payload and no RETH: `check_op_seq` runs before `check_resource` (no
//! receive WQE is consumed), `check_length` and `check_rkey`/`execute` (no
//! memory is named, nothing is placed). A Middle opcode is chosen so that
//! no implementation could take it as the start of a new message, and the
//! kind is the opposite of the message in progress so that it can never
//! continue it. (The InfiniBand book's table of responder errors lists the
//! PSN sequence error as class B, NAK and no state change, and the
//! out-of-sequence opcode among the class C errors, NAK Invalid Request and
//! QP to error, as rxe's comments do; Mellanox/NVIDIA hardware's exact
//! reaction is [UNVERIFIED], but it must NAK such a packet, and any fatal
//! NAK of the responder moves the QP to error too.)
//!
//! It only works at the exact ePSN (rxe_resp.c `check_psn`): before it, a
//! SEND/WRITE opcode is a duplicate and is re-ACKed with ePSN−1 (C9-105);
//! after it, a NAK-seq carrying the ePSN is sent once and later packets are
//! dropped. Neither changes the QP. The gateway knows the ePSN because it is
//! the only path from the far requester to this responder: its egress half
//! for that direction ([`super::egress::Reinjector`]) knows every packet it
//! injected and how far the responder acknowledged. When everything injected
//! is acknowledged, the ePSN is exact (the PSN after the last acknowledged
//! one, and the last SEND/WRITE opcode executed gives the message in
//! progress). When injected packets are still unacknowledged, the ePSN is
//! one of the message-packet boundaries between the last acknowledged PSN
//! and the last injected one; the gateway sends one poison packet per
//! candidate, in increasing PSN order, each with the opcode chosen for the
//! state *that* candidate implies. The candidates before the true ePSN are
//! duplicates (re-ACKed, nothing executed), the one at the ePSN is fatal,
//! and the ones after it reach a QP already in error and are dropped
//! (`get_req` in the error state drains the queue). With no egress half
//! yet (the far side never sent), the ePSN is the far side's starting PSN
//! from RDMA-CM.
//!
//! # Learning the ePSN by probing
//!
//! Anything else (a flow learned from traffic with no reverse traffic, a
//! raw tunnel phase whose responder ACKs are not all seen; NCCL-style
//! applications exchange QPNs out of band, and the simulator has no
//! RDMA-CM) is *probed*, provided the far QPN is known (the answers are
//! addressed to it, and that is how the engine recognises them). A probe is
//! the very same packet as the poison (no payload, no RETH, a Middle
//! opcode, AckReq set) at a PSN P, so it can never place data, and the
//! responder's answer tells its ePSN whatever P is (rxe_resp.c):
//!
//! | P against the ePSN (`psn_compare`, 24-bit signed) | rxe | ePSN |
//! | --- | --- | --- |
//! | behind (`check_psn` → `duplicate_request`) | SEND/WRITE mask: `send_ack(AETH_ACK_UNLIMITED, resp.ack_psn − 1)` (C9-105), with the current `resp.msn`; older kernels only when AckReq is set (it is) | ACK PSN + 1 |
//! | ahead (`check_psn`) | NAK PSN sequence error carrying `resp.psn`, once: `sent_psn_nak` silences later ones until a packet at the ePSN arrives | the NAK's PSN |
//! | equal | `check_op_seq` (or, a SEND in progress, `check_length`: a Middle must carry one MTU): class C, NAK Invalid Request, QP to error | reached: the probe was the poison |
//!
//! Two probes go out, at P and P + 2^23: whatever the ePSN, one of them is
//! behind it or at it (a distance of exactly 2^23 compares as behind), so
//! it is answered even when a sequence NAK was already sent. P is the PSN
//! after the last tunnel-phase packet seen toward that QP when there is
//! one (its likeliest ePSN: the probe may well be the poison itself), 0
//! otherwise: with two probes half the space apart any P works, and
//! nothing better is known (both ends draw their first PSN at random).
//!
//! The first answer (matched by addresses and QPNs, and never forwarded to
//! the twin) gives the ePSN and the poison is sent there, with the opcode
//! for "nothing in progress" (a QP whose far side never sent through this
//! gateway has no message in progress, and the SEND Middle fails on length
//! if it had). A NAK-seq is exact and overrides an estimate from a re-ACK
//! (rxe's `ack_psn` is not advanced by a READ, so a re-ACK can lag behind);
//! a NAK Invalid Request (or any fatal NAK) ends it: the QP is in error.
//! Everything is bounded: [`PROBE_TIMEOUT`] per step, [`PROBE_ATTEMPTS`]
//! sends of a step, [`PROBE_ROUNDS`] poison PSNs per QP; a QP that does
//! not end in error by then is counted unattributable. Without the far QPN
//! nothing is sent at all, and it is counted too.
//!
//! The packet goes only to a QP the engine knows belongs to a flow with the
//! lost twin: destination IP and QPN from the half (the requester QPN
//! learned from RDMA-CM or from the responder's own ACKs, the responder QPN
//! from the requests), source IP the far host (rxe_recv.c `check_addr`
//! requires the QP's remote address), ICRC computed by
//! [`crate::roce::builders`]. A QPN is never guessed.

use std::net::IpAddr;
use std::time::Duration;

use crate::roce::builders;
use crate::roce::ip::rxe_udp_sport;
use crate::roce::{IpHeader, OpKind, Opcode, Psn, Reth, RoceRepr};
use crate::time::Time;

use super::half::HalfKey;

/// What message a responder has in progress (rxe `resp.opcode`): only the
/// SEND and WRITE packets it executed change it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InProgress {
    /// The last SEND/WRITE packet ended its message (or there was none).
    #[default]
    Nothing,
    Send,
    Write,
}

impl InProgress {
    /// The state after the responder executed a packet of opcode `op`.
    pub fn after(self, op: Opcode) -> InProgress {
        let Some(info) = op.info() else { return self };
        match info.kind {
            OpKind::Send if info.position.ends() => InProgress::Nothing,
            OpKind::Send => InProgress::Send,
            OpKind::Write if info.position.ends() => InProgress::Nothing,
            OpKind::Write => InProgress::Write,
            // READ, atomics: rxe's execute() returns before setting
            // resp.opcode.
            _ => self,
        }
    }

    /// A Middle opcode that is out of sequence in this state and can never
    /// continue a message (see the table in the module docs).
    pub fn poison_opcode(self) -> Opcode {
        match self {
            InProgress::Nothing | InProgress::Write => Opcode::RC_SEND_MIDDLE,
            InProgress::Send => Opcode::RC_WRITE_MIDDLE,
        }
    }
}

/// A local QP to move to the error state: the far host and its QPN (when
/// known), the local host and the QP's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub far: IpAddr,
    pub far_qpn: Option<u32>,
    pub local: IpAddr,
    pub local_qpn: u32,
}

/// The poison packet for `target` at candidate ePSN `psn` with `state` the
/// message in progress there: no payload, no RETH, AckReq set (rxe NAKs a
/// class C error regardless). `None` if the addresses are of different
/// families.
pub fn packet(target: &Target, psn: Psn, state: InProgress) -> Option<RoceRepr> {
    let ip = IpHeader::between(target.far, target.local)?;
    let mut repr = builders::request(
        ip,
        target.local_qpn,
        state.poison_opcode(),
        psn,
        true,
        Reth::default(),
    );
    if let Some(f) = target.far_qpn {
        // As the far QP's own packets would carry it (rxe does not check it).
        repr.src_port = rxe_udp_sport(f, target.local_qpn);
    }
    Some(repr)
}

/// How long the engine first waits for the answer to a probe (or to the
/// poison it sent after one) before sending it again: a local round trip is
/// a few microseconds; this leaves room for a busy host. Each retry waits
/// twice as long as the one before ([`probe_wait`]).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(2);
/// Sends of one probing step (the first and the retries) before the QP is
/// given up as unattributable: with the doubling, 2 + 4 + ... + 256 ms,
/// about half a second in all.
///
/// Why that long: after a near gateway's restart, the answer to a probe
/// reaches the gateway behind whatever the requester is retransmitting at
/// the same time — a whole window, thousands of packets read first. With
/// three tries 2 ms apart (6 ms) the answer came too late in 1 of 11 runs
/// of `killing_the_near_gateway_fails_the_requester_qp` (the QP then
/// stalled, counted unattributable, behind 3,077 such packets).
pub const PROBE_ATTEMPTS: u32 = 8;

/// How long to wait after the `sent`-th send of a probing step (1-based).
pub fn probe_wait(sent: u32) -> Duration {
    PROBE_TIMEOUT * (1u32 << sent.clamp(1, PROBE_ATTEMPTS).saturating_sub(1))
}
/// Poison PSNs tried per QP after answers (a re-ACK's estimate, then a
/// NAK-seq's exact one...).
pub const PROBE_ROUNDS: u32 = 3;
/// Half the PSN space: the distance between the two probes.
pub const HALF_PSN_SPACE: u32 = 1 << 23;

/// The two probes' PSNs around a first guess `p` (see the module docs).
pub fn probe_psns(p: Psn) -> [Psn; 2] {
    [p, p.add(HALF_PSN_SPACE)]
}

// The engine's records of work in progress live here, in this leaf module,
// rather than beside the code that drives them (`qp::fail`, `qp::orphan`):
// those modules extend `QpEngine`, so the engine importing them back would be
// an import cycle.

/// A local QP whose expected PSN is being learned by probing (see
/// "Learning the ePSN by probing" above).
pub(super) struct Probe {
    pub(super) target: Target,
    /// The probes' PSNs, while no answer has told the ePSN.
    pub(super) psns: [Psn; 2],
    /// The ePSN the poison was last sent at, and whether a NAK-seq told it
    /// (exact) rather than a re-ACK.
    pub(super) poison_at: Option<(Psn, bool)>,
    /// Poison PSNs tried.
    pub(super) rounds: u32,
    /// Sends of the current step.
    pub(super) attempts: u32,
    pub(super) deadline: Time,
}

/// A QP at the twin's site whose flow through this gateway was failed.
#[derive(Clone, Debug)]
pub(super) struct Orphan {
    /// The local host's requests toward it (see `TwinMsg::Orphaned`).
    pub(super) qp: HalfKey,
    /// The local QP it is connected to.
    pub(super) local_qpn: Option<u32>,
    pub(super) hint: Option<Psn>,
    pub(super) candidates: Vec<(Psn, InProgress)>,
}

/// A requester at this site orphaned by this gateway's restart, watched
/// for its retransmissions (`qp::orphan`).
#[derive(Clone, Copy, Debug)]
pub(super) struct OrphanRequester {
    /// Where its NAK goes (its QPN, from the orphan message).
    pub(super) reply: crate::roce::builders::ReplyTo,
    /// The lowest PSN seen from it since the orphan message, and how many
    /// times.
    pub(super) low: Option<(Psn, u32)>,
    pub(super) until: Time,
}
