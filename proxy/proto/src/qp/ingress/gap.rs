//! NAKs for gaps in the requester's PSN sequence: when one goes out, and
//! at which PSN (a NAK acknowledges every PSN before it, so it must never
//! say more than a pseudo-ACK could).

use crate::roce::builders;
use crate::roce::{NakCode, Psn};

use super::{Mode, PseudoAcker};
use crate::qp::outbox::Outbox;

impl PseudoAcker {
    /// A gap before `expected`: NAK it now, or, when a READ or atomic
    /// before it still waits for its response, once that response has
    /// reached the requester.
    ///
    /// The NAK acknowledges every PSN before it, so sent past a pending
    /// READ/atomic it is an implied NAK at the requester (rxe `check_psn`:
    /// a response past a READ still waiting for its data): the requester
    /// goes back to the READ and resends it and all after it. A responder
    /// never does that, since its responses leave in PSN order; over the
    /// WAN the READ's answer comes one round trip later, so the gap NAK
    /// waits for it (issue 33: over-subscribed mixed runs, where the gap
    /// comes from a request dropped at the buffer's hard limit).
    pub(super) fn nak_gap(&mut self, expected: Psn, out: &mut Outbox) {
        let read_pending = self.mode == Mode::Accelerated
            && self
                .entries
                .iter()
                .skip(self.first_unacked)
                .any(|e| e.needs_response && !e.answered && e.psn.before(expected));
        if read_pending {
            if !self.nak_deferred {
                self.stats.seq_naks_deferred += 1;
            }
            self.nak_deferred = true;
        } else {
            self.nak_deferred = false;
            self.send_gap_nak(expected, out);
        }
    }

    /// A PSN-sequence-error NAK for a gap before `expected`.
    ///
    /// Such a NAK also acknowledges every PSN before it (rxe_comp.c: "a nak
    /// implicitly acks all packets with psns before"). While packets of the
    /// tunnel phase are not yet acknowledged by the real responder
    /// (`Switching`), NAKing at `expected` would complete raw packets that
    /// may never have arrived — and the responder's own NAK for them would
    /// then be ignored as stale, hanging the QP. So until then the NAK goes
    /// back to the first PSN the responder has not acknowledged, with its
    /// real MSN: the requester resends from there (the raw ones through the
    /// tunnel again). With no real ACK seen yet, stay silent and leave the
    /// recovery to the responder's NAK or the requester's timeout.
    pub(super) fn send_gap_nak(&mut self, expected: Psn, out: &mut Outbox) {
        let at = if self.mode == Mode::Accelerated {
            expected
        } else {
            match self.acked {
                Some((a, _)) if a.next().before(expected) => a.next(),
                Some(_) => expected,
                None => return,
            }
        };
        self.stats.seq_naks += 1;
        self.send_nak(at, NakCode::PsnSequenceError, out);
    }

    pub(super) fn send_nak(&self, psn: Psn, code: NakCode, out: &mut Outbox) {
        let msn = self.acked.map_or(self.msn_at(0), |(_, m)| m);
        if let Some(reply) = self.reply {
            out.dc_repr(&builders::nak(&reply, psn, code, msn));
        }
    }
}
