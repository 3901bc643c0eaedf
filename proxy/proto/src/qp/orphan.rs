//! A gateway that crashes and restarts leaves its own site's QPs orphaned
//! (issue 14, a near gateway's crash): it pseudo-ACKed their requests, so
//! they may have nothing outstanding, and its new incarnation knows nothing
//! of them. Its twin does: for every flow it fails when it sees the restart
//! ([`QpEngine::fail_all`]), its ingress half toward the far QP knows that
//! QP's number and where its expected PSN (ePSN) can be (the twin's own
//! requests are the only ones that QP receives), and its RDMA-CM table the
//! connection. It keeps that list and sends it to the new incarnation
//! ([`TwinMsg::Orphaned`], over the authenticated WAN session) as soon as
//! one answers ([`QpEngine::tell_orphans`]); the receiver moves each QP to
//! the error state through its responder role, exactly as `qp::poison`
//! does for its own side ([`QpEngine::on_orphan`]), and the far end of
//! each RDMA-CM connection gets a DREQ.
//!
//! A connection the gateways break is thus broken at both ends: an
//! application at either site gets an error completion (flushed receives,
//! or its next request's NAK) or a DISCONNECTED event, never silence.
//!
//! Safety, as for `qp::poison`: the packets carry no payload and no RETH
//! and a Middle opcode chosen against the message in progress, so they can
//! place nothing; they go only to a local host (the site's ACL), from the
//! address and QPN the QP is connected to (rxe `check_addr`), at PSNs where
//! its ePSN can be. A QP with a live flow through the receiver's new
//! incarnation under the same number is skipped (a new QP behind a reused
//! number); a QP already poisoned or probed here is not touched twice. A
//! wrong candidate is a duplicate (re-ACKed) or ahead (one NAK-seq, or
//! nothing): neither changes the QP.
//!
//! # An orphaned requester that is retransmitting
//!
//! The responder role is only one way in. A requester that had requests
//! outstanding when its gateway died (not yet pseudo-ACKed, or sent into
//! the dead gateway) retransmits them, through the new incarnation, for as
//! long as nothing answers: the far QP is in error (the twin poisoned it),
//! so nothing ever will. Its own requests tell where it stands: rxe's
//! `req_retry` (and every go-back-N requester) resends from `comp.psn`, its
//! oldest unacknowledged PSN (O), and it never sends below it. So the
//! lowest PSN the new incarnation sees from it is O once one retry has
//! reached it, and a PSN seen twice is a retransmission. The orphan message
//! names the requester's half (the local host toward the far QPN) and its
//! QPN; from then on ([`QpEngine::orphan_request`]) the gateway notes the
//! lowest PSN of that half's requests, and once that PSN comes a second
//! time (the next retry started there), answers it with a NAK Remote
//! Operational Error: the requester's head work request completes with
//! `IB_WC_REM_OP_ERR` and its QP goes to error (rxe_comp.c `check_ack`),
//! whatever its responder role is doing, without a probe. Each later retry
//! of that PSN gets the NAK again (one per retry: a lost NAK costs one
//! retry), and, confirmed, the half's requests are no longer carried to the
//! twin (they could only reach a QP in error).
//!
//! Why not sooner, at the first request seen: a NAK implicitly acknowledges
//! every PSN before its own (rxe_comp.c: "a nak implicitly acks all
//! packets with psns before"; `check_psn` completes a SEND/WRITE WQE that
//! ends before the response's PSN with success), so a NAK past O would
//! report requests as done that never landed. Only O is safe, and only a
//! retransmission proves a PSN is O: the first request seen may be the
//! middle of a retry burst (the new incarnation came up during it) or one
//! reordered on the way. Seen twice as the lowest, a PSN started two
//! retries (O is the first packet of every burst, the one least likely to
//! be dropped by a full queue). The bound: two of the requester's ACK
//! timeouts after the orphan message.
//!
//! A requester that is not the orphan is never hit: a half learned by this
//! incarnation (RDMA-CM seen, or an answer carried back from the twin) is
//! left alone and forgets its orphan record; the record lapses after
//! [`ORPHAN_REQUESTER_TTL`]; and a new QP behind the same numbers would
//! have to repeat its lowest PSN without one answer in between.

use std::time::Duration;

use crate::roce::builders::{self, ReplyTo};
use crate::roce::ip::rxe_udp_sport;
use crate::roce::{IpHeader, NakCode, Psn, RocePacket};
use crate::time::Time;

use super::engine::QpEngine;
use super::half::HalfKey;
use super::poison::{InProgress, Orphan, OrphanRequester, Target};
use super::twin::TwinMsg;

/// At most this many orphans are kept for a twin that has not answered
/// yet (the oldest go first).
const MAX_ORPHANS: usize = 65_536;

/// How long an orphaned requester's record is kept after the orphan
/// message: several retries even at ACK timeouts of seconds (perftest's
/// default is 67 ms, RDMA-CM's over RoCE about half a second), short
/// enough that a new QP reusing the same numbers later is not watched.
pub const ORPHAN_REQUESTER_TTL: Duration = Duration::from_secs(20);

impl QpEngine {
    /// Notes, before `fail_all` drops them, the far QPs of every flow with
    /// the twin: through the ingress half toward each (its number is in
    /// the key, its ePSN in the half's plan), or, for a far QP that only
    /// sent requests here, through the egress half from it (its number
    /// learned from the local responder's answers; its ePSN unknown, so
    /// the receiver probes).
    pub(super) fn note_orphans(&mut self) {
        let mut found: Vec<Orphan> = Vec::new();
        for (k, a) in self.ingress.iter() {
            let (candidates, hint) = a.orphan_plan();
            found.push(Orphan {
                qp: *k,
                local_qpn: a.requester_qpn(),
                hint,
                candidates,
            });
        }
        for k in self.egress.keys() {
            let Some(far_qpn) = self
                .by_requester
                .iter()
                .find(|(_, v)| *v == k)
                .map(|(id, _)| id.1)
            else {
                continue;
            };
            let qp = HalfKey {
                requester: k.responder,
                responder: k.requester,
                responder_qpn: far_qpn,
            };
            if !self.ingress.contains_key(&qp) {
                found.push(Orphan {
                    qp,
                    local_qpn: Some(k.responder_qpn),
                    hint: None,
                    candidates: Vec::new(),
                });
            }
        }
        found.sort_by_key(|o| o.qp);
        // (A QP noted twice, by two failures before the twin answered, is
        // told twice; the receiver acts on the first and skips the other.)
        self.orphans.extend(found);
        let excess = self.orphans.len().saturating_sub(MAX_ORPHANS);
        self.orphans.drain(..excess);
    }

    /// Far QPs whose flows were failed and that the twin was not told of.
    pub fn orphans_pending(&self) -> usize {
        self.orphans.len() + self.orphan_dreqs.len()
    }

    /// Tells a twin that answers again (a new incarnation, or the same one
    /// back after it was declared lost) every QP at its site whose flow
    /// was failed here, and sends the far end of each RDMA-CM connection
    /// failed here a DREQ in the local host's name. Call it once the new
    /// session is up; returns the messages queued.
    pub fn tell_orphans(&mut self) -> u64 {
        let mut n = 0;
        for o in std::mem::take(&mut self.orphans) {
            self.out
                .push_back(super::outbox::Output::Twin(TwinMsg::Orphaned {
                    qp: o.qp,
                    far_qpn: o.local_qpn,
                    hint: o.hint,
                    candidates: o.candidates,
                }));
            n += 1;
        }
        for c in std::mem::take(&mut self.orphan_dreqs) {
            if self.send_far_dreq(&c) {
                n += 1;
            }
        }
        self.stats.orphans_told += n;
        n
    }

    /// A QP of this site whose flow the twin failed while this gateway was
    /// away ([`TwinMsg::Orphaned`]): moved to the error state through its
    /// responder role (see the module docs for when it is left alone).
    pub(super) fn on_orphan(
        &mut self,
        now: Time,
        qp: HalfKey,
        far_qpn: Option<u32>,
        hint: Option<Psn>,
        candidates: Vec<(Psn, InProgress)>,
    ) {
        self.stats.orphans_received += 1;
        let live_flow = self.egress.get(&qp).is_some_and(|r| !r.is_failed());
        if !live_flow {
            self.watch_orphan_requester(now, qp, far_qpn);
        }
        if live_flow || self.poisoned.contains_key(&qp) || self.probes.contains_key(&qp) {
            self.stats.orphans_skipped += 1;
            return;
        }
        let target = Target {
            far: qp.requester,
            far_qpn,
            local: qp.responder,
            local_qpn: qp.responder_qpn,
        };
        if candidates.is_empty() {
            if far_qpn.is_some() && self.start_probe(now, qp, target, hint) {
                self.stats.orphan_qps_probed += 1;
            } else {
                self.stats.orphans_unattributable += 1;
            }
            return;
        }
        let sent = self.send_poison(qp, &target, far_qpn, candidates);
        if sent == 0 {
            self.stats.orphans_unattributable += 1;
            return;
        }
        self.stats.orphan_qps_poisoned += 1;
        self.stats.orphan_poison_packets += sent;
    }
}

impl QpEngine {
    /// Starts watching the requests of the orphaned QP of `qp` (named as
    /// the far host's half toward it) toward `far_qpn`, unless this
    /// incarnation learned that half (a new QP: RDMA-CM seen, or answered).
    fn watch_orphan_requester(&mut self, now: Time, qp: HalfKey, far_qpn: Option<u32>) {
        let Some(far_qpn) = far_qpn else { return };
        let half = HalfKey {
            requester: qp.responder,
            responder: qp.requester,
            responder_qpn: far_qpn,
        };
        if self.ingress.get(&half).is_some_and(|a| a.is_learned()) {
            return;
        }
        let Some(ip) = IpHeader::between(half.responder, half.requester) else {
            return;
        };
        // Its tunnel-phase half of this incarnation carried requests to a
        // QP in error: nothing of it is worth keeping.
        if let Some(mut a) = self.ingress.remove(&half) {
            a.release_all(&mut self.buffer);
        }
        if self.orphan_requesters.len() >= MAX_ORPHANS {
            self.orphan_requesters.clear();
        }
        let reply = ReplyTo {
            ip,
            src_port: rxe_udp_sport(qp.responder_qpn, far_qpn),
            dest_qp: qp.responder_qpn,
        };
        self.orphan_requesters.insert(
            half,
            OrphanRequester {
                reply,
                low: None,
                until: now + ORPHAN_REQUESTER_TTL,
            },
        );
        self.stats.orphan_requesters_watched += 1;
    }

    /// A request from the DC side on a watched orphan's half (module docs):
    /// returns true when it was taken here (answered with the NAK, or
    /// dropped once the requester is known to be the orphan), false when it
    /// goes on as any request would.
    pub(super) fn orphan_request(&mut self, now: Time, p: &RocePacket<'_>) -> bool {
        let key = HalfKey::of_request(p);
        let Some(o) = self.orphan_requesters.get_mut(&key) else {
            return false;
        };
        if now >= o.until {
            self.orphan_requesters.remove(&key);
            return false;
        }
        let psn = p.psn();
        match o.low {
            Some((low, n)) if psn == low => o.low = Some((low, n + 1)),
            Some((low, _)) if psn.after(low) => {}
            _ => o.low = Some((psn, 1)),
        }
        let Some((low, n)) = o.low else { return false };
        if n < 2 {
            // Not yet proven a retransmission: carried as before.
            return false;
        }
        if psn == low {
            let reply = o.reply;
            // MSN: rxe's completer does not read it on a NAK.
            self.out.dc_repr(&builders::nak(
                &reply,
                low,
                NakCode::RemoteOperationalError,
                0,
            ));
            self.stats.orphan_requester_naks += 1;
            if n == 2 {
                self.stats.orphan_requesters_failed += 1;
                // Its responder role need not be probed any more: the QP
                // is in error once the NAK lands; its answers are absorbed.
                let toward = HalfKey {
                    requester: key.responder,
                    responder: key.requester,
                    responder_qpn: reply.dest_qp,
                };
                if self.probes.remove(&toward).is_some() {
                    self.stats.orphan_probes_superseded += 1;
                }
                self.note_poisoned(toward, Some(key.responder_qpn));
            }
        }
        true
    }

    /// Orphaned requesters of this site being watched.
    pub fn orphan_requesters_pending(&self) -> usize {
        self.orphan_requesters.len()
    }

    /// This incarnation learned `half`: RDMA-CM set it up (`answer`
    /// `None`), or the twin carried back an answer at PSN `answer` that is
    /// not stale (not before the lowest PSN the requester sent since the
    /// orphan message): a live QP, not an orphan to watch. (A stale answer,
    /// a far responder re-ACKing a carried duplicate, proves nothing.)
    pub(super) fn forget_orphan_requester(&mut self, half: &HalfKey, answer: Option<Psn>) {
        let Some(o) = self.orphan_requesters.get(half) else {
            return;
        };
        let live = match (answer, o.low) {
            (None, _) => true,
            (Some(psn), Some((low, _))) => !psn.before(low),
            (Some(_), None) => false,
        };
        if live {
            self.orphan_requesters.remove(half);
        }
    }
}
