//! What one gateway tells its twin about QP traffic.
//!
//! The WAN transport carries these reliably and in order per half; its own
//! framing, encryption and retransmission live in `wan/`. Until it lands,
//! the simulator carries them over a delayed in-order link.

use crate::roce::{NakCode, Psn};

use super::half::HalfKey;

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
    Request { carry: Carry, packet: Vec<u8> },
    /// A packet from the egress side's responder to the requester: READ
    /// responses and atomic ACKs always; ACKs and NAKs for `Raw` PSNs.
    Response { packet: Vec<u8> },
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
    Datagram { packet: Vec<u8> },
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
        }
    }
}
