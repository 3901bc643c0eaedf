//! What the engine's halves want sent, and the pool their buffers come from.
//!
//! Its own module so that the halves (`ingress`, `egress`) and the engine
//! that owns them all depend on it, and none of them on each other's
//! home: before, `Outbox` lived in engine.rs, which imports both halves,
//! while both halves imported it back (an import cycle).

use crate::buffer::PacketBuf;
use std::collections::VecDeque;

use crate::buffer::PacketPool;
use crate::roce::RoceRepr;

use super::half::HalfKey;
use super::twin::TwinMsg;
use crate::roce::Psn;

/// Names a request held by an egress half: its half and its first PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldRef {
    pub key: HalfKey,
    pub psn: Psn,
}

/// Something the engine wants sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// An IP packet for the local DC side.
    Dc(PacketBuf),
    /// A request the egress holds, to be (re)sent toward the local
    /// responder from where it is held: no copy. Its bytes are
    /// [`QpEngine::held_packet`](super::QpEngine::held_packet) until the
    /// responder acknowledges it (an ACK cannot come before it is sent) or
    /// the half fails, after which the reference finds nothing and the
    /// send is skipped: a failed half sends nothing more anyway.
    DcHeld(HeldRef),
    /// A message for the twin gateway.
    Twin(TwinMsg),
}

/// Where the halves put what they want sent, with the pool their packet
/// buffers come from: every packet the engine hands out (`Output::Dc`, the
/// packet of a `TwinMsg`) is a recycled vector, which the caller gives back
/// with [`QpEngine::recycle`] once sent (see `buffer::pool`).
#[derive(Default)]
pub struct Outbox {
    queue: VecDeque<Output>,
    pub pool: PacketPool,
}

impl Outbox {
    pub fn push_back(&mut self, o: Output) {
        self.queue.push_back(o);
    }

    pub fn pop_front(&mut self) -> Option<Output> {
        self.queue.pop_front()
    }

    /// A pooled copy of `packet`, for the DC side.
    pub fn dc(&mut self, packet: &[u8]) {
        let v = self.pool.copy_of(packet);
        self.queue.push_back(Output::Dc(v));
    }

    /// A packet the gateway originates (ACK, NAK, CNP), built in a pooled
    /// buffer, for the DC side. Nothing if it does not build (never for
    /// the builders' packets).
    pub fn dc_repr(&mut self, repr: &RoceRepr) {
        let mut v = self.pool.take();
        v.resize(repr.buffer_len(0), 0);
        match repr.emit(&[], &mut v) {
            Ok(n) => {
                v.truncate(n);
                self.queue.push_back(Output::Dc(v));
            }
            Err(_) => self.pool.put(v),
        }
    }

    /// A pooled copy of `packet` for the twin, as `make` wraps it.
    pub fn twin(&mut self, packet: &[u8], make: impl FnOnce(PacketBuf) -> TwinMsg) {
        let v = self.pool.copy_of(packet);
        self.queue.push_back(Output::Twin(make(v)));
    }
}
