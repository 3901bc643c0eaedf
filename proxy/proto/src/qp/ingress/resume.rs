//! Resuming a half after the twin restarted (issue 35).
//!
//! The far gateway (the twin, which re-injects this half's requests
//! toward the responder) crashed and came back as a new incarnation: it
//! lost every request it had not yet seen acknowledged by the responder,
//! and the WAN transport dropped what it still carried (handing each
//! held request's buffer back: `wan::flow::SendFlows::handed_back`). This
//! half holds each of them again (an entry keeps its buffer until
//! `Delivered`), so it sends them again, in PSN order, and the new
//! incarnation learns the QP from them as from a QP first seen mid-stream.
//!
//! What reaches the responder twice is an RC duplicate (PSN below its
//! expected PSN; rxe_resp.c `check_psn` → `duplicate_request`): a SEND or
//! WRITE is acknowledged again and not placed again (C9-105), a READ is
//! executed again from the saved resource, an atomic is answered from the
//! reply cache. A READ or atomic whose answer came back already is not
//! sent again (nor anything before it, up to the first READ or atomic
//! still unanswered): the responder executed it and everything before it,
//! so it counts as delivered.

use crate::buffer::DeepBuffer;
use crate::time::Time;

use super::super::outbox::Outbox;
use super::PseudoAcker;

impl PseudoAcker {
    /// Can this half be resumed toward a new incarnation of the twin? Not
    /// when it failed already, nor when a request not yet delivered has no
    /// bytes here (lost on the way to the transport, which counts it as an
    /// overflow or a send error): sending the rest would leave a hole. A
    /// half in its tunnel phase holds nothing and pseudo-ACKed nothing:
    /// its requester resends on its own what the twin lost.
    pub fn resumable(&self) -> bool {
        self.failed.is_none()
            && !self
                .entries
                .iter()
                .any(|e| e.slot.is_some() && e.forwarded && e.bytes.is_none())
    }

    /// The twin restarted: forwards again every request not yet reported
    /// delivered, in PSN order (as the egress window allows, the rest as
    /// `Delivered` comes back). Returns the packets to send again. Only
    /// for a half that is [`Self::resumable`].
    pub fn resume(&mut self, now: Time, buf: &mut DeepBuffer, out: &mut Outbox) -> u64 {
        self.quiet.touch();
        // What the tunnel forwarded died with the old session: the
        // requester's resends of it must go through (`tunnel`).
        if let Some(h) = self.raw_high {
            self.raw_left(h);
        }
        // A READ or atomic already answered: the responder executed
        // everything up to its last PSN. Only up to the first one still
        // unanswered, though: its answer died with the twin (or is on its
        // way), and only sending it again brings it.
        let mut answered = None;
        for e in self.entries.iter().filter(|e| e.slot.is_some()) {
            if e.needs_response {
                if !e.answered {
                    break;
                }
                answered = Some(e.last());
            }
        }
        if let Some(last) = answered {
            self.release_delivered(now, last, buf, out);
        }
        // Nothing is in flight toward the new incarnation.
        self.in_flight = 0;
        let mut first = None;
        let mut resent = 0;
        for (i, e) in self.entries.iter_mut().enumerate() {
            if e.forwarded && e.slot.is_some() {
                e.forwarded = false;
                first.get_or_insert(i);
                resent += 1;
            }
        }
        if let Some(i) = first {
            self.next_forward = self.next_forward.min(i);
        }
        self.forward(out);
        self.maybe_ack(now, buf, out);
        resent
    }
}
