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
    Closed,
}
