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

use crate::roce::Psn;
use crate::time::Time;

use super::engine::QpEngine;
use super::half::HalfKey;
use super::poison::{self, InProgress, Orphan, Target};
use super::twin::TwinMsg;

/// At most this many orphans are kept for a twin that has not answered
/// yet (the oldest go first).
const MAX_ORPHANS: usize = 65_536;

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
        let mut sent = 0;
        for (psn, state) in candidates {
            if let Some(repr) = poison::packet(&target, psn, state) {
                self.out.dc_repr(&repr);
                sent += 1;
            }
        }
        if sent == 0 {
            self.stats.orphans_unattributable += 1;
            return;
        }
        self.note_poisoned(qp, far_qpn);
        self.stats.orphan_qps_poisoned += 1;
        self.stats.orphan_poison_packets += sent;
    }
}
