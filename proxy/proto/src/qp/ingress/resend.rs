//! The requester's resends: PSNs below the one we expect.
//!
//! A SEND/WRITE resend is answered here, as its responder would (C9-105:
//! re-acknowledge the last executed PSN). A READ or atomic resend needs
//! the real responder's answer, and whether it must cross the WAN depends
//! on where that answer is:
//!
//! - **answered already** (the requester lost the response in its data
//!   centre), or **delivered and unanswered** (the answer was lost on the
//!   WAN side): forwarded raw, for the responder to replay;
//! - **on its way** (not answered, no `Delivered` past it): dropped, the
//!   answer will reach the requester; a second request would only make the
//!   responder replay it -- **unless an earlier READ of the same round
//!   was forwarded**.
//!
//! **Rounds.** A go-back-N requester resends from the PSN it expects and
//! then every request after it, in PSN order: one round. When the twin
//! injects a replay of a READ at PSN `p`, it drops every answer of the QP
//! past `p` still queued for the WAN there (`site::replays`: the requester
//! would discard them until `p`'s replay came, and they would reach it
//! before that replay). So the answer of a later READ in the round is no
//! longer "on its way": dropping its resend here left that READ with no
//! answer at all while the READs after it, sent fresh, were answered -- an
//! implied NAK at the requester, which spends one of its retries, and a
//! wait for its next timeout (over-subscribed sweep seed 1436: READs over a
//! 0.5 Gb/s path cut for 150 ms). Once a round forwarded one READ, every
//! later READ resend in it is forwarded too; the twin still injects only
//! those whose queued answer died (`site::replays` counts the others as
//! redundant), so the cost is one small request each.

use crate::roce::{Psn, RocePacket};

use super::{Mode, PseudoAcker};
use crate::qp::outbox::Outbox;

/// One go-back-N round of resends, as far as it has come.
#[derive(Clone, Copy, Debug)]
pub(super) struct Round {
    /// The newest PSN resent in it: a resend at or before this one starts
    /// a new round.
    last: Psn,
    /// A READ or atomic of this round was forwarded to the responder.
    replaying: bool,
}

impl PseudoAcker {
    /// The requester sent a PSN we already accepted.
    pub(super) fn on_duplicate(&mut self, p: &RocePacket<'_>, out: &mut Outbox) {
        let psn = p.psn();
        let replaying = match self.resend_round {
            Some(r) if psn.after(r.last) => r.replaying,
            _ => false,
        };
        self.resend_round = Some(Round {
            last: psn,
            replaying,
        });
        if self.mode != Mode::Accelerated && self.raw_high.is_some_and(|h| !psn.after(h)) {
            // Resent after a real NAK for the raw phase, before the
            // responder acknowledged it all: still the tunnel's. (Once it
            // has, we answer duplicates ourselves: the egress side no
            // longer forwards the responder's ACKs.)
            return self.replay(p, out);
        }
        if p.info.needs_real_response() {
            // A `Delivered` past a READ comes behind its responses (one WAN
            // flow): delivered and not answered here, its answer was lost
            // on the way (the twin's queue dropped it at its bound), and
            // only a replay by the responder can bring it (issue 18, seed
            // 3408: dropping these resends hung the QP for good).
            let delivered = self.delivered;
            let on_its_way = self.entries.iter().any(|e| {
                e.psn == psn
                    && e.needs_response
                    && !e.answered
                    && delivered.is_none_or(|d| e.last().after(d))
            });
            if on_its_way && !replaying {
                // The answer is on its way; a second request would only
                // make the responder replay it.
                self.stats.duplicates_dropped += 1;
            } else {
                // Already answered but the requester lost the response in
                // the DC (rxe keeps the last max_dest_rd_atomic READs for
                // exactly this), or an earlier replay of this round makes
                // the twin drop the answer still queued there (module
                // docs): let the real responder replay it.
                self.replay(p, out);
            }
            return;
        }
        // SEND/WRITE duplicate: re-acknowledge what we acknowledged last
        // (a responder re-ACKs its last executed PSN, C9-105).
        self.stats.duplicates_dropped += 1;
        if self.mode == Mode::Accelerated {
            if let Some((apsn, amsn)) = self.acked {
                self.stats.duplicate_acks += 1;
                self.send_ack(apsn, amsn, out);
            }
        }
    }

    /// Forwards resend `p` raw, for the responder to execute or replay;
    /// a READ or atomic makes the rest of its round replays too.
    fn replay(&mut self, p: &RocePacket<'_>, out: &mut Outbox) {
        if p.info.needs_real_response() {
            if let Some(r) = self.resend_round.as_mut() {
                r.replaying = true;
            }
        }
        self.forward_raw(p, out);
    }
}
