//! The twin restarted: resume what can be resumed, fail the rest (issue
//! 35).
//!
//! A twin that comes back as a new incarnation (a new WAN session
//! generation) lost two kinds of state, which this gateway treats apart:
//!
//! - **What it re-injected toward its responders** (this gateway's
//!   ingress halves: local requester → responder at the twin's site).
//!   Everything the responder had not acknowledged is still held here
//!   until `Delivered` (the WAN transport hands each request's buffer back
//!   when it is done with it: one buffer per packet, moved, not copied),
//!   so each such half sends it again, in PSN order
//!   ([`PseudoAcker::resume`]), and the new incarnation learns the QP from
//!   those packets as it learns a QP first seen mid-stream. What reaches
//!   the responder twice is an RC duplicate, executed at most once
//!   (`qp::ingress::resume`).
//! - **What it pseudo-ACKed** for requesters at its own site (this
//!   gateway's egress halves toward its local responders): those requests
//!   died with it, and only failing the QP keeps that from being silent.
//!   As before ([`QpEngine::fail_all`]): the egress half is dropped, the
//!   local QP moved to error, the twin told the QP is an orphan. A QP is
//!   one connection: an ingress half whose QP has such an egress half
//!   here (requests seen the other way) is not resumed either, but failed
//!   with it (`EngineStats::halves_unresumable`).
//!
//! Not resumable either, and failed by `fail_all` as before: halves that
//! had already failed, and halves missing the bytes of a request not yet
//! delivered ([`PseudoAcker::resumable`]).

use std::collections::BTreeSet;

use crate::roce::NakCode;
use crate::time::Time;

use super::engine::{QpEngine, TwinLostSummary};
use super::half::HalfKey;
use super::ingress::PseudoAcker;

/// What one [`QpEngine::twin_restarted`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestartSummary {
    /// Ingress halves resumed toward the new incarnation...
    pub halves_resumed: u64,
    /// ...and the request packets they send again.
    pub packets_resent: u64,
    /// Ingress halves not resumed (failed, in `failed`), for one of two
    /// reasons below.
    pub halves_unresumable: u64,
    /// ...their QP had requests the other way, which the twin pseudo-ACKed
    /// and which died with it (only a standby keeps those: issue 38)...
    pub unresumable_two_way: u64,
    /// ...or the bytes of a request not yet delivered were lost between
    /// the engine and the transport (an overflow or a send error, counted
    /// there): sending the rest would leave a hole.
    pub unresumable_bytes_lost: u64,
    /// What `fail_all` failed (the halves not resumed).
    pub failed: TwinLostSummary,
}

impl QpEngine {
    /// The twin restarted (a new incarnation, within `wan.twin_timeout`):
    /// resumes every ingress half that can be ([`PseudoAcker::resume`]),
    /// fails the rest with `code` as [`Self::fail_all`] does, and keeps the
    /// resumed QPs out of that failure (no NAK, no poison, no orphan
    /// message, no DREQ for their RDMA-CM connection).
    ///
    /// Call it once every request buffer the transport held for the old
    /// incarnation is back ([`Self::take_back`]).
    pub fn twin_restarted(&mut self, now: Time, code: NakCode) -> RestartSummary {
        let mut sum = RestartSummary::default();
        // QPs with requests the other way through the twin (the egress
        // halves toward local responder QPs): (far host, local host, local
        // QPN), and the host pairs, for halves whose local QPN is unknown.
        let reverse: BTreeSet<_> = self
            .egress
            .keys()
            .map(|k| (k.requester, k.responder, k.responder_qpn))
            .collect();
        let pairs: BTreeSet<_> = reverse.iter().map(|&(f, l, _)| (f, l)).collect();
        let mut keys: Vec<HalfKey> = self.ingress.keys().copied().collect();
        keys.sort();
        let mut kept: Vec<(HalfKey, PseudoAcker)> = Vec::new();
        for k in keys {
            let Some(a) = self.ingress.get(&k) else {
                continue;
            };
            if a.is_failed() {
                continue;
            }
            let two_way = match a.requester_qpn() {
                Some(q) => reverse.contains(&(k.responder, k.requester, q)),
                None => pairs.contains(&(k.responder, k.requester)),
            };
            if two_way {
                sum.unresumable_two_way += 1;
            } else if !a.resumable() {
                sum.unresumable_bytes_lost += 1;
            } else {
                if let Some(a) = self.ingress.remove(&k) {
                    kept.push((k, a));
                }
                continue;
            }
            sum.halves_unresumable += 1;
        }
        // Their RDMA-CM connections stay up: no DREQ.
        let mut conns = Vec::new();
        for (k, a) in &kept {
            if let Some(q) = a.requester_qpn() {
                conns.extend(self.cm_conns.take_local_qp(k.requester, k.responder, q));
            }
        }
        sum.failed = self.fail_all(now, code);
        for c in conns {
            self.cm_conns.push(c);
        }
        for (k, mut a) in kept {
            sum.packets_resent += a.resume(now, &mut self.buffer, &mut self.out);
            sum.halves_resumed += 1;
            self.ingress.insert(k, a);
        }
        let st = &mut self.stats;
        st.twin_restarts += 1;
        st.halves_resumed += sum.halves_resumed;
        st.packets_resent_on_resume += sum.packets_resent;
        st.halves_unresumable += sum.halves_unresumable;
        st.halves_unresumable_two_way += sum.unresumable_two_way;
        st.halves_unresumable_bytes_lost += sum.unresumable_bytes_lost;
        sum
    }

    /// The twin drained and said CLOSE to restart
    /// ([`crate::wan::CloseWhy::Restart`]): nothing it pseudo-ACKed was
    /// still undelivered, so nothing of any QP died with it. Every live
    /// ingress half resumes toward the next incarnation (a QP with
    /// requests both ways too), every egress half stays as it is (the next
    /// incarnation learns its side of the QP again from the requester's
    /// next packets, as a QP forgotten at one gateway is learned again:
    /// `qp::engine::expiry`), and nothing is failed, poisoned or told
    /// orphaned; RDMA-CM connections stay.
    ///
    /// `None`, changing nothing, when a live ingress half cannot be resumed
    /// (the bytes of a request not yet delivered are missing): the caller
    /// then treats the twin as one that crashed ([`Self::twin_restarted`]).
    pub fn twin_restarting(&mut self, now: Time) -> Option<RestartSummary> {
        if self
            .ingress
            .values()
            .any(|a| !a.is_failed() && !a.resumable())
        {
            return None;
        }
        let mut sum = RestartSummary::default();
        let mut keys: Vec<HalfKey> = self.ingress.keys().copied().collect();
        keys.sort();
        for k in keys {
            let Some(a) = self.ingress.get_mut(&k) else {
                continue;
            };
            if a.is_failed() {
                continue;
            }
            sum.packets_resent += a.resume(now, &mut self.buffer, &mut self.out);
            sum.halves_resumed += 1;
        }
        let st = &mut self.stats;
        st.twin_restarts += 1;
        st.halves_resumed += sum.halves_resumed;
        st.packets_resent_on_resume += sum.packets_resent;
        Some(sum)
    }

    /// Does `packet` finish what its half already took: the requester's
    /// resend of a request (lost, or unanswered), or the rest of a message
    /// whose first packet it took? A draining gateway takes those
    /// ([`crate::site::Site::start_drain`]) and refuses only requests that
    /// start a new message: the drain waits until its halves owe their
    /// requesters nothing, and a half owes the answer to a lost request
    /// until its resend gets through, and a message cut in two until its
    /// last packet does.
    pub fn finishes_what_was_taken(&self, packet: &[u8]) -> bool {
        let Ok(p) = crate::roce::RocePacket::parse(packet) else {
            return false;
        };
        p.info.is_request()
            && self
                .ingress
                .get(&super::half::HalfKey::of_request(&p))
                .is_some_and(|a| a.has_seen(p.psn()) || !p.info.position.starts())
    }

    /// Ingress halves that still owe their requester something: a request
    /// not yet reported delivered by the twin, or one whose answer or
    /// acknowledgement the requester has not yet been sent (a READ in
    /// flight back, a `strict` ACK), or, for a tunnel, a request whose
    /// answer has not come back ([`PseudoAcker::owes_requester`]). A
    /// gateway may say CLOSE to restart only at 0: its next incarnation
    /// then starts each QP as one that was quiet (`qp::engine::expiry`),
    /// with nothing in between.
    pub fn halves_owing_requesters(&self) -> usize {
        self.ingress.values().filter(|a| a.owes_requester()).count()
    }
}
