//! The requester's resends while a half is still a tunnel (`Mode::Raw`,
//! and the raw PSNs of `Mode::Switching`).
//!
//! Before the gateway knows a QP (no RDMA-CM seen: QPNs exchanged out of
//! band, as NCCL does) it forwards each request as is and pseudo-ACKs
//! nothing, so the requester's timer runs on the WAN's RTT and on whatever
//! queue stands in front of it. A ConnectX-class requester's first timeout
//! step is about 2 ms, under 300 km's RTT alone: it resends its whole
//! window, again and again, until the responder's first answer comes back.
//! Forwarded, every such round queued one more window of duplicates for
//! the WAN, in front of the answers that would end them: 16 QPs over a
//! 1 Gbit/s path carried 0.33 Gbit/s through the gateways against 0.50
//! direct, 4.3 million packets resent (`soya-sim run --endpoint hw
//! --no-rdma-cm --qps 16 --path-gbps 1 --iters 256`).
//!
//! **The rule.** A resend of a WRITE/SEND packet is dropped while its
//! original is still in this gateway's hands: forwarded, not answered, and
//! neither acknowledged by the twin's transport nor dropped on the way
//! ([`TunnelResends::left`]). Twin messages are reliable and in order per
//! half, so the resend would reach the responder right behind the
//! original and only ever be a duplicate there; dropping it delays nothing.
//!
//! A packet that left but whose answer is still due is dropped too, while
//! no NAK was seen: the responder answers a WRITE/SEND only at a packet
//! asking for it (AckReq: a message's last), and a message of one QP among
//! sixteen takes 8 ms to cross 1 Gbit/s, four expiries of a 2 ms timer.
//! If the AckReq packet at or after it is still here, its answer will
//! come once that packet crosses, or the responder, having missed
//! something before it, will NAK. A responder that NAKed once stays silent
//! until the NAKed PSN arrives, so after the first NAK this shortcut is
//! off and only the rule above holds.
//!
//! Everything else goes through as before:
//!
//! - a PSN never forwarded (lost between the requester and this gateway:
//!   a gap in what it forwarded, [`TunnelResends::gaps`]);
//! - a PSN whose original left this gateway and whose answer is not due
//!   (above): it may have been lost past the twin, and the responder may
//!   be waiting for it in silence (it NAKs a gap only once);
//! - a round a NAK asked for (sequence error or RNR: the responder dropped
//!   everything from that PSN on, including originals still on their way);
//! - anything answered (the requester lost the ACK in its data centre),
//!   and READs and atomics, whose resends `resend` and the twin's
//!   `site::replays` keep consistent with their answers.
//!
//! **Liveness.** Every original leaves this gateway's hands: the twin
//! acknowledges it, the site drops it (reported as it happens), or the
//! twin restarts (every half resumes and forgets the rule). So does the
//! AckReq packet an answer is due at, which ends that wait too. The
//! requester's next resend after that goes through.

use std::collections::VecDeque;

use crate::roce::{Psn, RocePacket};

use super::PseudoAcker;

/// Most gaps remembered in what the tunnel forwarded; past that, every
/// resend goes through (as if the rule did not exist: safe, merely
/// wasteful).
const MAX_GAPS: usize = 8;

/// Most AckReq PSNs remembered ahead of the responder's answers; past
/// that, the answer-due shortcut is off.
const MAX_ACK_REQS: usize = 512;

/// What decides whether a tunnel-phase resend goes on.
#[derive(Clone, Debug, Default)]
pub(super) struct TunnelResends {
    /// A NAK at this PSN: the requester's resends from it go through,
    /// until one covers the newest PSN forwarded.
    round_from: Option<Psn>,
    /// The newest PSN whose forwarded request left this gateway (the twin
    /// acknowledged it, or it was dropped here). Messages of one half
    /// leave in the order they were sent, and originals are sent in PSN
    /// order, so every original up to it has left too.
    left: Option<Psn>,
    /// Ranges inside `[raw_low, raw_high]` never forwarded (lost on the
    /// way from the requester), inclusive.
    gaps: VecDeque<(Psn, Psn)>,
    /// More gaps than [`MAX_GAPS`] were seen: the rule is off.
    gaps_lost: bool,
    /// The PSNs of the AckReq packets forwarded, oldest first, beyond the
    /// responder's last answer: an answer is due at each.
    ack_reqs: VecDeque<Psn>,
    /// A NAK was seen (or too many AckReqs): an answer due may never come
    /// from a responder that stays silent after a NAK.
    answers_unsure: bool,
}

impl TunnelResends {
    /// The responder NAKed `psn` (sequence error or RNR) in the tunnel
    /// phase: it took nothing from there on, so the requester's resends
    /// from there must all reach it.
    pub(super) fn nak(&mut self, psn: Psn) {
        self.round_from = Some(psn);
        self.answers_unsure = true;
        self.ack_reqs.clear();
    }

    /// The request at `psn` forwarded raw has left this gateway.
    pub(super) fn left(&mut self, psn: Psn) {
        if self.left.is_none_or(|l| psn.after(l)) {
            self.left = Some(psn);
        }
    }

    /// A new request at `psn` (ending at `last`) is forwarded after
    /// `high`, the newest so far (`None` for the first): what lies between
    /// was never forwarded.
    pub(super) fn forwarded(&mut self, high: Option<Psn>, psn: Psn, last: Psn, ack_req: bool) {
        if let Some(high) = high {
            if psn.after(high.add(1)) {
                if self.gaps.len() == MAX_GAPS {
                    self.gaps_lost = true;
                } else {
                    self.gaps.push_back((high.add(1), psn.sub(1)));
                }
            }
        }
        if ack_req && !self.answers_unsure {
            if self.ack_reqs.len() == MAX_ACK_REQS {
                self.answers_unsure = true;
                self.ack_reqs.clear();
            } else {
                self.ack_reqs.push_back(last);
            }
        }
    }

    /// Is an answer covering `psn` still due: the first AckReq packet at
    /// or after it has not left yet (and no NAK made answers unsure)?
    fn answer_due(&self, psn: Psn) -> bool {
        if self.answers_unsure {
            return false;
        }
        match self.ack_reqs.iter().find(|a| !a.before(psn)) {
            Some(a) => self.left.is_none_or(|l| a.after(l)),
            None => false,
        }
    }
}

impl PseudoAcker {
    /// Whether the tunnel forwards `p` (module docs).
    pub(super) fn raw_resend_goes(&mut self, p: &RocePacket<'_>) -> bool {
        let (Some(lo), Some(hi)) = (self.raw_low, self.raw_high) else {
            return true;
        };
        let psn = p.psn();
        if p.info.needs_real_response() || !psn.in_range(lo, hi) {
            return true;
        }
        let r = &mut self.raw_resends;
        if let Some(a) = self.raw_answered {
            if !psn.after(a) {
                return true;
            }
            // Gaps and asks the responder has answered past are closed.
            while r.gaps.front().is_some_and(|&(_, end)| !end.after(a)) {
                r.gaps.pop_front();
            }
            while r.ack_reqs.front().is_some_and(|q| !q.after(a)) {
                r.ack_reqs.pop_front();
            }
        }
        if r.left.is_some_and(|l| !psn.after(l)) && !r.answer_due(psn) {
            return true;
        }
        if let Some(from) = r.round_from {
            if !psn.before(from) {
                if !psn.before(hi) {
                    r.round_from = None;
                }
                return true;
            }
        }
        r.gaps_lost || r.gaps.iter().any(|&(s, e)| psn.in_range(s, e))
    }

    /// The request at `psn`, forwarded raw, left this gateway: the twin
    /// acknowledged it, or the site dropped it on the way.
    pub fn raw_left(&mut self, psn: Psn) {
        self.raw_resends.left(psn);
    }
}
