//! Forgetting QPs that went quiet (issue 17): an appliance that sees QPs
//! come and go must not grow until restarted.
//!
//! Nothing tells a gateway that a QP was destroyed: RoCE has no FIN, and a
//! QP may be torn down without RDMA-CM. So a half is forgotten when it is
//! *quiescent* and has been *silent* for [`idle_after`]:
//!
//! - quiescent: nothing held (the ingress holds no request, pseudo-ACKed
//!   or not; the egress no request to inject, retransmit or have
//!   answered) and no timer armed (no ACK to coalesce, no withheld ACK to
//!   repeat, no RNR wait, no retransmission);
//! - silent: no packet or twin message for the half at any sweep for
//!   `idle_after` ([`Quiet`] notes activity between sweeps).
//!
//! Every per-QP entry that goes with a half goes with it: its
//! requester-QPN mapping (`by_requester`, kept while either half of the QP
//! pair lives), its RDMA-CM starting PSN (`cm_start`), and, on their own
//! clocks, poisoned QPs (absorbing their answers: kept between `idle_after`
//! and twice that after the poison) and orphaned requesters (their
//! [`crate::qp::orphan::ORPHAN_REQUESTER_TTL`]). The counters of a forgotten
//! half are added to the engine's retired totals
//! ([`QpEngine::ingress_totals`], [`QpEngine::egress_totals`]), so that no
//! count is lost with it.
//!
//! # Why forgetting a quiescent half is safe
//!
//! A quiescent half owes nobody anything: everything it pseudo-ACKed was
//! delivered (and so popped), and everything the egress injected was
//! acknowledged. What is lost is what it had learned (the requester's QPN,
//! the MSN base, the path MTU), and all of it is learned again from
//! traffic, as for a QP first seen mid-stream: the QP's next request finds
//! no half, a new one starts as a tunnel (`Mode::Raw`), the responder's
//! first answer names the requester's QPN, and pseudo-ACKs resume once the
//! tunnel phase is acknowledged. Its PSNs did not move while it was
//! silent, so the half at the other gateway, which may or may not have
//! forgotten it too (each gateway sweeps on its own clock), sees the next
//! PSN after the last it knew; a requester's duplicate (an ACK lost in its
//! data center) goes through the tunnel and the responder re-ACKs it. A
//! failed half is quiescent once its buffers are released: it keeps
//! answering later requests with the fatal NAK it owes for `idle_after`
//! after the last one it answered.
//!
//! # Why `idle_after` is 15 × `dc.give_up_after`
//!
//! `dc.give_up_after` (4 s by default) is the gateway's patience: several
//! times a hardware requester's retry budget (7 × 67 ms with perftest's
//! defaults). A half that stayed silent fifteen times that long (60 s by
//! default) cannot still be waited on by anyone: a requester that lost an
//! ACK resends it within its own ACK timeout (RDMA-CM over RoCE asks for
//! about 1-8 s; 7 retries at 8.6 s fit in 60 s), a responder that stalled
//! would have made the egress give up after one `give_up_after`, and a
//! failed half's NAK, if lost, is asked for again by the requester's next
//! retry well within it. Shorter would re-learn bursty QPs often (a tunnel
//! phase costs the first WAN round trip of acceleration); longer only
//! keeps dead state longer. And a QP silent that long is, if the twin is
//! lost later, left as a direct connection would be (docs/semantics.md):
//! nothing was pseudo-ACKed that did not land, so there is no false
//! promise to undo; its next request is refused or dropped and its own
//! retry budget ends it.
//!
//! The sweep runs every `idle_after / 4` while anything can expire, so a
//! half goes between `idle_after` and 1.25 × `idle_after` after its last
//! packet; it visits every half once per sweep (a gateway with 100,000
//! halves spends well under a millisecond every 15 s on it).

use std::time::Duration;

use crate::time::Time;

use super::QpEngine;
use crate::buffer::DeepBuffer;
use crate::qp::egress::{EgressStats, Reinjector};
use crate::qp::half::HalfKey;
use crate::qp::ingress::{IngressStats, PseudoAcker};
use crate::qp::quiet::Quiet;
use crate::qp::timers::{Halves, Timed};

/// `idle_after` in units of `dc.give_up_after` (module docs).
pub const IDLE_GIVE_UPS: u32 = 15;

/// Sweeps per `idle_after`.
const SWEEPS_PER_IDLE: u32 = 4;

/// How long a quiescent half must be silent before it is forgotten.
pub fn idle_after(give_up: Duration) -> Duration {
    give_up * IDLE_GIVE_UPS
}

/// The engine's expiry state.
#[derive(Debug, Default)]
pub struct Expiry {
    /// The next sweep; `None` while nothing can expire (an idle gateway
    /// sleeps).
    next: Option<Time>,
    /// When poisoned QPs were last looked at, and which were poisoned
    /// then: those still there at the next look are forgotten.
    poisoned_look: Option<Time>,
    poisoned_seen: Vec<HalfKey>,
    /// Counters of the halves forgotten so far.
    pub(super) retired_ingress: IngressStats,
    pub(super) retired_egress: EgressStats,
}

impl QpEngine {
    fn idle_after(&self) -> Duration {
        idle_after(self.config().egress.give_up)
    }

    /// Arms the sweep once something that can expire exists (called on
    /// every input: a branch when armed).
    pub(super) fn arm_expiry(&mut self, now: Time) {
        if self.expiry.next.is_none() {
            self.expiry.next = Some(now + self.idle_after() / SWEEPS_PER_IDLE);
        }
    }

    /// When [`Self::expire`] next has something to do; `None` while
    /// nothing can expire. Not part of [`Self::poll_timeout`], which is the
    /// protocol's timers: the site (`site::Site::handle_timeout`) runs both.
    pub fn expiry_deadline(&self) -> Option<Time> {
        self.expiry.next
    }

    /// Halves the engine knows: (ingress, egress).
    pub fn halves(&self) -> (usize, usize) {
        (self.ingress.len(), self.egress.len())
    }

    /// Every ingress half's counters, the forgotten ones included.
    pub fn ingress_totals(&self) -> IngressStats {
        let mut t = self.expiry.retired_ingress;
        for a in self.ingress.values() {
            add_ingress(&mut t, &a.stats);
        }
        t
    }

    /// Every egress half's counters, the forgotten ones included.
    pub fn egress_totals(&self) -> EgressStats {
        let mut t = self.expiry.retired_egress;
        for r in self.egress.values() {
            add_egress(&mut t, &r.stats);
        }
        t
    }

    /// The sweep (module docs), when due ([`Self::expiry_deadline`]):
    /// forgets quiescent halves silent for `idle_after` and the side-table
    /// entries that go with them.
    pub fn expire(&mut self, now: Time) {
        if self.expiry.next.is_none_or(|t| now < t) {
            return;
        }
        let after = self.idle_after();
        let QpEngine {
            ingress,
            egress,
            buffer,
            expiry,
            stats,
            ..
        } = self;
        let (n, failed) = sweep(ingress, buffer, &mut expiry.retired_ingress, now, after);
        stats.halves_expired_ingress += n;
        stats.halves_expired_failed += failed;
        let (n, failed) = sweep(egress, buffer, &mut expiry.retired_egress, now, after);
        stats.halves_expired_egress += n;
        stats.halves_expired_failed += failed;
        self.expire_side_tables(now, after);
        self.expiry.next = (!self.nothing_to_expire()).then(|| now + after / SWEEPS_PER_IDLE);
    }

    /// Side-table entries whose halves are gone, and those on their own
    /// clocks.
    fn expire_side_tables(&mut self, now: Time, after: Duration) {
        let (ingress, egress) = (&self.ingress, &self.egress);
        let live = |k: &HalfKey| ingress.contains_key(k) || egress.contains_key(k);
        // (requester, requester QPN, responder) → half: kept while the
        // half or the other half of the same QP pair lives (the reverse
        // half's requester is this half's responder, its responder QP this
        // half's requester QP). An RDMA-CM mapping for an egress half that
        // has seen no request yet thus stays as long as its ingress sibling.
        self.by_requester.retain(|id, k| {
            let sibling = HalfKey {
                requester: id.2,
                responder: id.0,
                responder_qpn: id.1,
            };
            live(k) || live(&sibling)
        });
        let mapped: std::collections::HashSet<HalfKey> =
            self.by_requester.values().copied().collect();
        self.cm_start.retain(|k, _| live(k) || mapped.contains(k));
        self.ingress_flows.retain(|_, k| ingress.contains_key(k));
        self.orphan_requesters.retain(|_, o| now < o.until);
        // Poisoned QPs answer their poison within a round trip inside the
        // site; a few late answers are all that is absorbed after that.
        if self
            .expiry
            .poisoned_look
            .is_none_or(|t| now.since(t) >= after)
        {
            for k in std::mem::take(&mut self.expiry.poisoned_seen) {
                if self.poisoned.remove(&k).is_some() {
                    self.stats.poisoned_expired += 1;
                }
            }
            self.expiry.poisoned_seen = self.poisoned.keys().copied().collect();
            self.expiry.poisoned_look = Some(now);
        }
        // Give back what a burst of QPs grew the tables to.
        self.ingress.shrink();
        self.egress.shrink();
        shrink(&mut self.by_requester);
        shrink(&mut self.cm_start);
        shrink(&mut self.ingress_flows);
        shrink(&mut self.poisoned);
        shrink(&mut self.orphan_requesters);
    }

    fn nothing_to_expire(&self) -> bool {
        self.ingress.is_empty()
            && self.egress.is_empty()
            && self.by_requester.is_empty()
            && self.cm_start.is_empty()
            && self.poisoned.is_empty()
            && self.orphan_requesters.is_empty()
    }
}

fn shrink<K: std::hash::Hash + Eq, V, S: std::hash::BuildHasher>(
    m: &mut std::collections::HashMap<K, V, S>,
) {
    if m.capacity() > 64 && m.len() < m.capacity() / 4 {
        m.shrink_to(m.len() * 2);
    }
}

/// What the sweep needs of a half, whichever its role.
trait Expirable: Timed {
    type Stats;
    fn quiet_mut(&mut self) -> &mut Quiet;
    /// Nothing held, nothing armed.
    fn quiescent(&self) -> bool;
    fn failed(&self) -> bool;
    fn release(&mut self, buffer: &mut DeepBuffer);
    /// Adds the half's counters to `t`.
    fn retire_into(&self, t: &mut Self::Stats);
}

/// Both roles answer through their own methods of the same names.
macro_rules! expirable {
    ($half:ty, $stats:ty, $add:ident) => {
        impl Expirable for $half {
            type Stats = $stats;
            fn quiet_mut(&mut self) -> &mut Quiet {
                &mut self.quiet
            }
            fn quiescent(&self) -> bool {
                self.is_idle() && self.poll_timeout().is_none()
            }
            fn failed(&self) -> bool {
                self.is_failed()
            }
            fn release(&mut self, buffer: &mut DeepBuffer) {
                self.release_all(buffer)
            }
            fn retire_into(&self, t: &mut $stats) {
                $add(t, &self.stats)
            }
        }
    };
}

expirable!(PseudoAcker, IngressStats, add_ingress);
expirable!(Reinjector, EgressStats, add_egress);

/// One role's share of a sweep at `now`: forgets the halves quiescent and
/// silent for `after`, their buffer released and their counters added to
/// `retired`. Returns how many it forgot, and how many of them had failed.
fn sweep<V: Expirable>(
    halves: &mut Halves<V>,
    buffer: &mut DeepBuffer,
    retired: &mut V::Stats,
    now: Time,
    after: Duration,
) -> (u64, u64) {
    let mut gone: Vec<HalfKey> = Vec::new();
    for (k, h) in halves.iter_mut() {
        let quiescent = h.quiescent();
        if h.quiet_mut().sweep(now, quiescent, after) {
            gone.push(*k);
        }
    }
    let mut failed = 0;
    for k in &gone {
        if let Some(mut h) = halves.remove(k) {
            h.release(buffer);
            failed += u64::from(h.failed());
            h.retire_into(retired);
        }
    }
    (gone.len() as u64, failed)
}

/// Adds `s` to `t` field by field: `Type { field, ... }` destructures `s`,
/// so a new counter that is not listed here does not compile.
macro_rules! add_fields {
    ($t:expr, $s:expr, $ty:ident, [$($f:ident),* $(,)?]) => {{
        let $ty { $($f),* } = *$s;
        $($t.$f += $f;)*
    }};
}

fn add_ingress(t: &mut IngressStats, s: &IngressStats) {
    add_fields!(
        t,
        s,
        IngressStats,
        [
            packets,
            bytes,
            raw_packets,
            raw_resends_dropped,
            pseudo_acks,
            duplicate_acks,
            duplicates_dropped,
            seq_naks,
            seq_naks_deferred,
            seq_naks_owed,
            out_of_order_dropped,
            backpressure_drops,
            withheld_acks,
            hold_acks,
            cnps_sent,
            responses_delivered,
            errors_injected,
        ]
    );
}

fn add_egress(t: &mut EgressStats, s: &EgressStats) {
    add_fields!(
        t,
        s,
        EgressStats,
        [
            injected,
            retransmitted,
            raw_injected,
            raw_read_copies_dropped,
            acks_absorbed,
            acks_forwarded,
            seq_naks,
            rnr_naks,
            fatal_naks,
            timeouts,
            responses_forwarded,
            duplicates_dropped,
            overflow_held,
            implied_naks,
            ack_reqs_added,
            tail_probes,
            gave_up,
            queue_cuts,
        ]
    );
}
