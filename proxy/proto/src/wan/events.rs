//! What the transport hands back to its I/O layer: datagrams to send, events,
//! and why a message was refused.

use super::*;
use crate::buffer::PacketBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum SendError {
    /// The peer's credit for this flow is used up and the local queue is
    /// full: hold back until messages drain (poll, transmit, retry).
    #[error("flow blocked: peer credit exhausted and local flow queue full")]
    FlowBlocked,
    #[error("send buffer full")]
    BufferFull,
    #[error("too many flows")]
    TooManyFlows,
    #[error("message too large")]
    MessageTooLarge,
    #[error("connection closed")]
    Closed,
}

/// Why a gateway says CLOSE: the code of the CLOSE frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CloseWhy {
    /// It stops (or gave up draining): whatever its twin had in flight
    /// through it is failed (code 0, "closed").
    #[default]
    Final,
    /// It drained cleanly (nothing it pseudo-ACKed is still undelivered)
    /// and restarts: its twin keeps every flow and resumes them toward the
    /// next incarnation, or fails them if none comes within
    /// `wan.twin_timeout` (code 1, "restart"; issue 35).
    Restart,
}

impl CloseWhy {
    pub const fn code(self) -> u64 {
        match self {
            CloseWhy::Final => 0,
            CloseWhy::Restart => 1,
        }
    }

    pub const fn reason(self) -> &'static [u8] {
        match self {
            CloseWhy::Final => b"closed",
            CloseWhy::Restart => b"restart",
        }
    }

    /// An unknown code is a final CLOSE: nothing is kept for a twin whose
    /// intent is not understood.
    pub const fn from_code(code: u64) -> CloseWhy {
        match code {
            1 => CloseWhy::Restart,
            _ => CloseWhy::Final,
        }
    }
}

/// A datagram to send: `buf[..len]` on path `path`, not before `release_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub path: usize,
    pub len: usize,
    pub release_at: Time,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// First session with the twin established.
    Connected {
        peer_generation: u64,
    },
    /// In order per flow, exactly once.
    Message(TwinMsg),
    Datagram(PacketBuf),
    PathUp(usize),
    PathDown(usize),
    /// The twin restarted: everything queued for or received from its old
    /// generation was discarded; flows start afresh.
    PeerRestarted {
        old_generation: u64,
        new_generation: u64,
    },
    /// The twin (generation `peer_generation`) offers no cipher we accept:
    /// no session until one of the two is reconfigured. Reported once per
    /// twin generation; its HELLOs are refused and counted meanwhile.
    CipherMismatch {
        peer_generation: u64,
        ours: CipherOffer,
        theirs: CipherOffer,
    },
    /// The session ended: the twin said CLOSE (or ours went out).
    /// `restart`: the CLOSE said the gateway drained cleanly and will be
    /// back as a new incarnation ([`CloseWhy::Restart`]).
    Closed {
        restart: bool,
    },
}
