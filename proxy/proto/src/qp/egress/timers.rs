//! The re-injector's clocks: its retransmission timer (RFC 6298 smoothing
//! of the responder's round trip, back-off, the floor that keeps it as
//! patient as the requester it stands in for), the tail probe, and the
//! give-up. Split from `egress.rs` along that seam: what happens when
//! nothing comes, against what happens when a packet does (the parent's
//! `on_request` / `on_response` / `pump`). See the parent's module docs
//! for why each timer is what it is.

use std::time::Duration;

use super::{Reinjector, RtoRecovery, QUEUE_MIN_CWND, RAW_WAIT_LIMIT, RTO_CWND};
use crate::buffer::DeepBuffer;
use crate::qp::outbox::{HeldRef, Outbox, Output};
use crate::roce::{set_ack_req, Psn};
use crate::time::Time;

impl Reinjector {
    pub(super) fn rto(&self) -> Duration {
        let base = match self.srtt {
            None => self.tuning.min_rto,
            Some(s) => (s + 4 * self.rttvar).max(self.tuning.min_rto),
        };
        (base * (1 << self.backoff.min(16))).min(self.tuning.max_rto.max(base))
    }

    /// Is a request for an ACK outstanding (sent, not yet answered)?
    pub(super) fn asking(&self) -> bool {
        self.ack_req_out
            .is_some_and(|r| self.acked.is_none_or(|a| r.after(a)))
    }

    /// Arms the retransmission timer for what is in flight: restarts it
    /// when `restart` (progress), otherwise keeps a running one, except a
    /// tail probe's once a request for an ACK is out again. Packets no
    /// request covers wait `tail_probe` (the twin's next packet will ask).
    pub(super) fn arm(&mut self, now: Time, restart: bool) {
        if self.next == 0 {
            self.rto_deadline = None;
            self.probing = false;
            return;
        }
        let covered = self.asking();
        if restart || self.rto_deadline.is_none() || (self.probing && covered) {
            let wait = if covered {
                self.rto()
            } else {
                self.rto().max(self.tuning.tail_probe)
            };
            self.rto_deadline = Some(now + wait);
            self.probing = !covered;
        }
    }

    /// Has the responder shown no progress for longer than we wait?
    pub(super) fn stalled_out(&self, now: Time) -> bool {
        // While raw packets are unacknowledged, ours may wait for the
        // requester's own recovery of them (its timeout, tens of ms, and a
        // WAN round trip): wait longer, but not forever.
        let raw_pending = self.raw_high.is_some() && !self.raw_done;
        let limit = if raw_pending {
            RAW_WAIT_LIMIT.max(self.tuning.give_up)
        } else {
            self.tuning.give_up
        };
        now.since(self.progress_at) >= limit
    }

    /// Takes an RTT sample; returns whether it shows a queue at the
    /// responder (then the window does not grow on this ACK).
    pub(super) fn rtt_sample(&mut self, now: Time, rtt: Duration) -> bool {
        // A sample well above the responder's unloaded RTT is our own queue
        // at the responder: halve the window (once per round trip).
        let min = *self.min_rtt.get_or_insert(rtt);
        self.min_rtt = Some(min.min(rtt));
        let srtt = self.srtt.unwrap_or(rtt);
        let queued = rtt > min + self.tuning.min_rto / 4;
        if queued && self.queue_cut_at.is_none_or(|t| now.since(t) >= srtt) {
            self.cwnd = (self.cwnd / 2).max(QUEUE_MIN_CWND).min(self.cwnd);
            self.queue_cut_at = Some(now);
            self.stats.queue_cuts += 1;
        }
        // RFC 6298 smoothing.
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(s) => {
                let err = s.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + err) / 4;
                self.srtt = Some((s * 7 + rtt) / 8);
            }
        }
        queued
    }

    pub fn on_timeout(&mut self, now: Time, buf: &mut DeepBuffer, out: &mut Outbox) {
        if self.rnr_until.is_some_and(|t| now >= t) {
            self.rnr_until = None;
            self.pump(now, out);
        }
        if self.rto_deadline.is_some_and(|t| now >= t) {
            self.rto_deadline = None;
            if self.queue.is_empty() {
                return;
            }
            if self.next == 0 {
                // Nothing in flight (we went back): just send.
                self.pump(now, out);
                return;
            }
            if self.stalled_out(now) {
                let psn = self.queue.front().map_or(Psn::new(0), |p| p.psn);
                return self.give_up(now, psn, "retransmission timeouts", buf, out);
            }
            if !self.asking() {
                // The twin's next packet never came to ask for the ACK of
                // what is in flight: ask with the last of it.
                return self.probe(now, out);
            }
            self.stats.timeouts += 1;
            self.rto_at = Some(now);
            // Resend the oldest packet alone (it asks for an ACK): a
            // responder that only stalled answers with how far it got, one
            // that lost packets gets the rest as the window reopens.
            let probe = self.queue[0].last();
            let high = self.queue[self.next - 1].last();
            let prev = self.rto_recovery.take();
            self.rto_recovery = Some(RtoRecovery {
                probe,
                high: prev.map_or(high, |r| if r.high.after(high) { r.high } else { high }),
                asked: prev.map_or(self.ack_req_out, |r| r.asked),
            });
            self.cwnd = RTO_CWND;
            self.ack_req_out = None;
            // Back off: double the timeout for each consecutive expiry.
            self.backoff += 1;
            self.next = 0;
            self.pump(now, out);
        }
    }

    /// Resends the last packet in flight with AckReq set.
    pub(super) fn probe(&mut self, now: Time, out: &mut Outbox) {
        let i = self.next - 1;
        let p = &mut self.queue[i];
        p.retransmitted = true;
        p.sent_at = Some(now);
        let (last, psn) = (p.last(), p.psn);
        if !p.ack_req {
            // Not in place while the DC backend may still be sending it
            // (see `PacketBuf::make_writable`).
            p.held.bytes.make_writable();
            if set_ack_req(&mut p.held.bytes).unwrap_or(false) {
                self.stats.ack_reqs_added += 1;
                p.ack_req = true;
            }
        }
        self.stats.retransmitted += 1;
        self.stats.tail_probes += 1;
        self.ack_req_out = Some(last);
        out.push_back(Output::DcHeld(HeldRef { key: self.key, psn }));
        self.arm(now, true);
    }
}
