//! What one gateway tells its twin about QP traffic.
//!
//! The WAN transport carries these reliably and in order per half; its own
//! framing, encryption and retransmission live in `wan/`. Until it lands,
//! the simulator carries them over a delayed in-order link.

use crate::buffer::PacketBuf;
use crate::roce::{NakCode, Psn};

use super::half::HalfKey;
use super::poison::InProgress;

/// Most candidate ePSNs one [`TwinMsg::Orphaned`] carries; beyond that the
/// receiver probes instead (a deep WAN pipe can hold thousands of
/// undelivered packets, each a candidate).
pub const MAX_ORPHAN_CANDIDATES: usize = 64;

/// How the ingress gateway is handling a half, as seen on each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    /// Not learned yet (or policy `off`): a plain tunnel. The egress side
    /// injects as is and returns every response from the responder.
    Raw,
    /// Pseudo-ACKed at the ingress: the egress side owns delivery (in-order
    /// injection, go-back-N, RNR waits) and absorbs the responder's ACKs.
    Reliable,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TwinMsg {
    /// A request from the ingress side's requester, as it arrived (IP packet).
    Request { carry: Carry, packet: PacketBuf },
    /// A packet from the egress side's responder to the requester: READ
    /// responses and atomic ACKs always; ACKs and NAKs for `Raw` PSNs.
    Response { packet: PacketBuf },
    /// The responder acknowledged (or answered) every request of `half` up
    /// to and including `psn`; the ingress side may free them. `msn` is the
    /// responder's MSN at `psn` when its answer carried one (the ingress
    /// side needs it to pseudo-ACK with the MSN the responder would use).
    Delivered {
        half: HalfKey,
        psn: Psn,
        msn: Option<u32>,
    },
    /// The responder refused `psn` for good (or the egress side gave up on
    /// it): the requester's QP must learn it and go to error.
    Error {
        half: HalfKey,
        psn: Psn,
        code: NakCode,
    },
    /// Any other packet between the sites (RDMA-CM MADs, CNPs, unknown
    /// RoCE): injected as is at the far side.
    Datagram { packet: PacketBuf },
    /// A QP at the *receiver's* site whose connection through the two
    /// gateways this gateway failed when the receiver went away (restarted,
    /// or lost): the receiver pseudo-ACKed it, and, having lost its state,
    /// could not tell it by itself. The receiver moves it to the error
    /// state through its responder role (`qp::poison`), as this gateway
    /// did with its own end (issue 14: a near gateway's crash).
    ///
    /// `qp` names it as the half of the sender-side host's requests toward
    /// it (requester: the host at the sender's site; responder and
    /// responder QPN: the receiver-local QP). `far_qpn` is the sender-side
    /// QP (the poison comes in its name; probe answers are addressed to
    /// it). `candidates`: where the QP's expected PSN can be, with the
    /// message in progress there, as the sender's ingress half toward it
    /// knows (at most [`MAX_ORPHAN_CANDIDATES`]); empty: probe, first
    /// around `hint`.
    Orphaned {
        qp: HalfKey,
        far_qpn: Option<u32>,
        hint: Option<Psn>,
        candidates: Vec<(Psn, InProgress)>,
    },
}

impl TwinMsg {
    /// Bytes this message occupies on the WAN (for link models and credits).
    pub fn wire_len(&self) -> usize {
        const HDR: usize = 16;
        HDR + match self {
            TwinMsg::Request { packet, .. }
            | TwinMsg::Response { packet }
            | TwinMsg::Datagram { packet } => packet.len(),
            TwinMsg::Delivered { .. } | TwinMsg::Error { .. } => 40,
            TwinMsg::Orphaned { candidates, .. } => 48 + 5 * candidates.len(),
        }
    }
}
