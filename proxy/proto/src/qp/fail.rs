//! Moving local QPs to the error state when their flow through the twin
//! can no longer be honoured: the twin is lost for good
//! ([`QpEngine::fail_all`]), or the far side refused one of a pseudo-ACKed
//! requester's requests for good ([`QpEngine::on_far_error`], a
//! [`TwinMsg::Error`]). Both use the same means (`qp::poison`): a NAK at
//! the requester's oldest outstanding PSN when it has one; otherwise a
//! request its responder role must refuse fatally, at its expected PSN,
//! probed first when nothing tells it; and, for RDMA-CM connections, a
//! DREQ, because some applications (rping) act only on the CM's
//! DISCONNECTED event.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use crate::roce::{builders, cm};
use crate::roce::{IpHeader, NakCode, Psn, RocePacket, Syndrome};
use crate::time::Time;

use super::cm_conns::CmConn;
use super::egress::Reinjector;
use super::engine::{QpEngine, TwinLostSummary};
use super::half::HalfKey;
use super::poison::{self, InProgress, Probe, Target};
use super::twin::TwinMsg;

/// At most this many poisoned QPs are remembered for absorbing answers.
const MAX_POISONED: usize = 65_536;

/// What became of one local QP the engine set out to move to the error
/// state through its responder role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Poisoning {
    /// Poison packets sent at every possible ePSN (this many).
    Sent(u64),
    /// Its ePSN is being probed (now, or already by an earlier call).
    Probing { started: bool },
    /// Neither its ePSN nor the far QPN a probe needs is known.
    Unattributable,
}

impl QpEngine {
    /// An ACK/NAK from a local QP we poisoned (its answer to a poison
    /// packet), which must not travel to the lost twin.
    pub(super) fn is_poison_answer(&self, key: Option<HalfKey>, p: &RocePacket<'_>) -> bool {
        if self.poisoned.is_empty() {
            return false;
        }
        match key {
            Some(k) if self.poisoned.contains_key(&k) => true,
            Some(_) => false,
            None => self.poisoned.iter().any(|(k, far_qpn)| {
                k.responder == p.ip.src()
                    && k.requester == p.ip.dst()
                    && far_qpn.is_some_and(|q| q == p.bth.dest_qp)
            }),
        }
    }

    /// Is the twin reachable (see [`Self::set_twin_reachable`])?
    pub fn twin_reachable(&self) -> bool {
        self.twin_reachable
    }

    /// Tells the engine whether the twin can be reached. While it cannot,
    /// every new request from the DC side is refused at once: a NAK
    /// (remote operational error) at the requester's first unacknowledged
    /// PSN (the request's own, when everything before it was
    /// acknowledged), nothing buffered, nothing pseudo-ACKed, nothing
    /// carried, and its half is failed so that the QP stays refused. A
    /// new connection attempt thus fails fast instead of hanging on
    /// pseudo-ACKs that nobody will honour. A half whose requester QPN the
    /// engine never learned cannot be answered: its requests are dropped
    /// (counted) and the requester's retry budget ends it (RDMA-CM
    /// connections cannot even be set up: their REQ gets no REP).
    ///
    /// The site calls it with `false` when it declares the twin lost (with
    /// [`Self::fail_all`], normally just before) and with `true` when a WAN
    /// path answers again: halves failed meanwhile stay failed (their QPs
    /// are in the error state), new QPs are served normally.
    pub fn set_twin_reachable(&mut self, reachable: bool) {
        // The poisoned QPs stay remembered: an answer of theirs arriving
        // late must not be carried to the twin (an entry goes when a new
        // egress half toward the same QP number appears).
        self.twin_reachable = reachable;
    }

    /// The twin is lost for good (every WAN path down for
    /// `wan.twin_timeout`, or it restarted and lost its state): no local QP
    /// that had a flow with it may wait forever, and nothing of its state
    /// may stay behind.
    ///
    /// - Every ingress half is failed with `code`: a requester with
    ///   requests outstanding gets the NAK at its oldest outstanding PSN
    ///   (exactly: the one after the last ACK, pseudo or real, or its first
    ///   PSN when none was acknowledged), buffered packets are released,
    ///   and every later request is answered with the same NAK.
    /// - Every local QP that has nothing outstanding as a requester (all
    ///   pseudo-ACKed, or idle) but belongs to a flow with the twin is
    ///   moved to the error state through its responder role, with a
    ///   request that can never place data (`qp::poison`); its posted
    ///   receives then complete with a flush error. When its expected PSN
    ///   is not known (no reverse traffic, no RDMA-CM) but both QPNs are,
    ///   the engine learns it by probing and poisons it when the answer
    ///   comes (timers: [`Self::poll_timeout`]; `TwinLostSummary::probing`).
    /// - Every egress half (requests received from the lost twin) is
    ///   dropped and its buffer slots are freed.
    ///
    /// It does not change reachability: see [`Self::set_twin_reachable`].
    pub fn fail_all(&mut self, now: Time, code: NakCode) -> TwinLostSummary {
        let mut sum = TwinLostSummary::default();
        // What the twin's next incarnation must hear (`qp::orphan`), taken
        // before the halves are failed and dropped.
        self.note_orphans();
        // Local QPs, named by the egress half toward them (far requester →
        // local responder QP), that a NAK reached, and those to poison.
        let mut nacked: HashSet<HalfKey> = HashSet::new();
        let mut to_poison: BTreeMap<HalfKey, Option<u32>> = BTreeMap::new();
        let mut keys: Vec<HalfKey> = self.ingress.keys().copied().collect();
        keys.sort();
        for k in keys {
            let Some(a) = self.ingress.get_mut(&k) else {
                continue;
            };
            sum.halves_failed += 1;
            let nak = a.fail_twin_lost(code, &mut self.buffer, &mut self.out);
            let Some(local_qpn) = a.requester_qpn() else {
                // Still a tunnel: the requester QPN is unknown, so neither
                // a NAK nor a poison packet can be addressed.
                sum.unattributable += 1;
                continue;
            };
            let toward_local = HalfKey {
                requester: k.responder,
                responder: k.requester,
                responder_qpn: local_qpn,
            };
            if nak.is_some() {
                sum.halves_nacked += 1;
                nacked.insert(toward_local);
            } else {
                to_poison.insert(toward_local, Some(k.responder_qpn));
            }
        }
        // A local QP that is only a responder to the twin's requests.
        for k in self.egress.keys() {
            if !nacked.contains(k) && !to_poison.contains_key(k) {
                let far_qpn = self
                    .by_requester
                    .iter()
                    .find(|(_, v)| *v == k)
                    .map(|(id, _)| id.1);
                to_poison.insert(*k, far_qpn);
            }
        }
        for (k, far_qpn) in to_poison {
            match self.poison_local(now, k, far_qpn) {
                Poisoning::Sent(n) => {
                    sum.qps_poisoned += 1;
                    sum.poison_packets += n;
                }
                Poisoning::Probing { started: true } => sum.probing += 1,
                // Already being probed (an earlier fail_all).
                Poisoning::Probing { started: false } => {}
                Poisoning::Unattributable => sum.unattributable += 1,
            }
        }
        for (_, mut r) in self.egress.drain() {
            sum.egress_halves_dropped += 1;
            sum.egress_packets_dropped += r.held() as u64;
            r.release_all(&mut self.buffer);
        }
        self.cm_start.clear();
        let all = self.cm_conns.take_all();
        sum.dreqs_sent = self.send_dreqs(all.clone(), false);
        // Their far ends hear it when the twin answers again.
        self.orphan_dreqs.extend(all);
        self.orphan_dreqs.truncate(super::engine::MAX_CM_CONNS);
        let st = &mut self.stats;
        st.dreqs_sent += sum.dreqs_sent;
        st.twin_lost += 1;
        st.halves_failed_twin_lost += sum.halves_failed;
        st.halves_nacked_twin_lost += sum.halves_nacked;
        st.qps_poisoned += sum.qps_poisoned;
        st.poison_packets += sum.poison_packets;
        st.poison_unattributable += sum.unattributable;
        st.egress_halves_dropped += sum.egress_halves_dropped;
        st.egress_packets_dropped += sum.egress_packets_dropped;
        st.qps_probed += sum.probing;
        sum
    }

    /// The far side refused a request of `half` for good
    /// ([`TwinMsg::Error`]: its responder's fatal NAK, such as a remote
    /// access error, or the twin's egress gave up on it: RNR retries
    /// exhausted, no progress for `dc.give_up_after`).
    ///
    /// The requester learns it as from its own responder: a NAK with `code`
    /// at its oldest outstanding PSN, and the same NAK for every later
    /// request. When it has nothing outstanding (everything pseudo-ACKed),
    /// that NAK has no work request to land on (rxe_comp.c drops it), and
    /// an application that only waits would wait for ever, believing in
    /// data that never landed. So, exactly when the requester was told that
    /// requests landed which did not, its QP is moved to the error state as
    /// when the twin is lost ([`Self::poison_local`]): without Sōya the
    /// refused request would have been outstanding and its error completion
    /// would have moved the QP to error just the same. Then:
    ///
    /// - the egress half toward that QP (the far host's requests to it) is
    ///   failed and the twin told ([`Reinjector::fail_responder_gone`]):
    ///   a QP in error executes nothing more, so what it holds or is sent
    ///   later can never land; the far requester learns it as it would from
    ///   its retries running out, only sooner. The plan was taken first, so
    ///   nothing is injected behind the poison.
    /// - the QP's RDMA-CM connection, if any, gets a DREQ at both ends:
    ///   without Sōya the application would have seen a real error status
    ///   on the refused request and torn the connection down (rping does,
    ///   and ignores flushed completions); its peer then gets the DREQ of
    ///   that teardown.
    ///
    /// A requester that was told nothing false (it has nothing outstanding
    /// and everything it sent landed: this happens when the far side fails
    /// the reverse half of a QP poisoned here) is left as a direct
    /// connection would leave it: its next request gets the NAK.
    pub(super) fn on_far_error(&mut self, now: Time, half: HalfKey, psn: Psn, code: NakCode) {
        let Some(a) = self.ingress.get_mut(&half) else {
            return;
        };
        self.stats.far_errors += 1;
        let first = !a.is_failed();
        let outstanding = a.next_outstanding().is_some();
        let told_undelivered = a.told_undelivered();
        a.on_error(psn, code, &mut self.out);
        a.release_all(&mut self.buffer);
        if !first || outstanding || !told_undelivered {
            return;
        }
        let Some(local_qpn) = a.requester_qpn() else {
            self.stats.far_error_unattributable += 1;
            return;
        };
        let k = HalfKey {
            requester: half.responder,
            responder: half.requester,
            responder_qpn: local_qpn,
        };
        match self.poison_local(now, k, Some(half.responder_qpn)) {
            Poisoning::Sent(n) => {
                self.stats.far_error_qps_poisoned += 1;
                self.stats.far_error_poison_packets += n;
            }
            Poisoning::Probing { .. } => self.stats.far_error_qps_probed += 1,
            Poisoning::Unattributable => self.stats.far_error_unattributable += 1,
        }
        if let Some(r) = self.egress.get_mut(&k) {
            if r.fail_responder_gone(&mut self.buffer, &mut self.out) {
                self.stats.far_error_reverse_failed += 1;
            }
        }
        let (local, far) = (half.requester, half.responder);
        let conns = self.cm_conns.take_local_qp(local, far, local_qpn);
        self.stats.far_error_dreqs += self.send_dreqs(conns, true);
    }

    /// Moves the local QP of `k` (the half from the far requester toward
    /// it) to the error state through its responder role (`qp::poison`):
    /// one poison packet at each PSN its ePSN can be, as the egress half
    /// toward it or RDMA-CM tells; a probe when neither does and the far
    /// QPN `far_qpn` is known (the answers are addressed to it). Its
    /// answers are absorbed from then on ([`Self::is_poison_answer`]).
    pub(super) fn poison_local(
        &mut self,
        now: Time,
        k: HalfKey,
        far_qpn: Option<u32>,
    ) -> Poisoning {
        let plan = match self.egress.get(&k) {
            Some(r) => r.poison_plan(),
            None => self
                .cm_start
                .get(&k)
                .map(|&psn| vec![(psn, InProgress::Nothing)]),
        };
        let target = Target {
            far: k.requester,
            far_qpn,
            local: k.responder,
            local_qpn: k.responder_qpn,
        };
        let Some(plan) = plan else {
            if self.probes.contains_key(&k) {
                return Poisoning::Probing { started: false };
            }
            let hint = self.egress.get(&k).and_then(Reinjector::probe_hint);
            if far_qpn.is_some() && self.start_probe(now, k, target, hint) {
                return Poisoning::Probing { started: true };
            }
            return Poisoning::Unattributable;
        };
        match self.send_poison(k, &target, far_qpn, plan) {
            0 => Poisoning::Unattributable,
            sent => Poisoning::Sent(sent),
        }
    }

    /// Sends the local QP of `k` (`target`'s) a poison packet at each PSN
    /// of `plan` and, if any could be built, remembers it poisoned: how
    /// many were sent.
    pub(super) fn send_poison(
        &mut self,
        k: HalfKey,
        target: &Target,
        far_qpn: Option<u32>,
        plan: impl IntoIterator<Item = (Psn, InProgress)>,
    ) -> u64 {
        let mut sent = 0;
        for (psn, state) in plan {
            if let Some(repr) = poison::packet(target, psn, state) {
                self.out.dc_repr(&repr);
                sent += 1;
            }
        }
        if sent > 0 {
            self.note_poisoned(k, far_qpn);
        }
        sent
    }

    /// Remembers that the local QP of `k` was poisoned, so that its answers
    /// are absorbed (bounded: a QP in error answers only the poison, and a
    /// new egress half for `k`, a new QP with the same number, forgets it).
    pub(super) fn note_poisoned(&mut self, k: HalfKey, far_qpn: Option<u32>) {
        if self.poisoned.len() >= MAX_POISONED && !self.poisoned.contains_key(&k) {
            self.poisoned.clear();
        }
        self.poisoned.insert(k, far_qpn);
    }

    /// Starts probing the ePSN of the local QP of `k` (see `qp::poison`):
    /// two probes half the PSN space apart around `hint` (or 0). False if
    /// no packet can be built.
    pub(super) fn start_probe(
        &mut self,
        now: Time,
        k: HalfKey,
        target: Target,
        hint: Option<Psn>,
    ) -> bool {
        let psns = poison::probe_psns(hint.unwrap_or(Psn::new(0)));
        let mut probe = Probe {
            target,
            psns,
            poison_at: None,
            rounds: 0,
            attempts: 0,
            deadline: now,
        };
        if !self.send_probe_step(now, &mut probe) {
            return false;
        }
        self.probes.insert(k, probe);
        true
    }

    /// Sends the current step of `probe` (the two probes, or the poison at
    /// the ePSN an answer told) and arms its timer.
    fn send_probe_step(&mut self, now: Time, probe: &mut Probe) -> bool {
        let mut sent = 0;
        match probe.poison_at {
            None => {
                for psn in probe.psns {
                    if let Some(repr) = poison::packet(&probe.target, psn, InProgress::Nothing) {
                        self.out.dc_repr(&repr);
                        sent += 1;
                    }
                }
                self.stats.probes_sent += sent;
            }
            Some((psn, _)) => {
                if let Some(repr) = poison::packet(&probe.target, psn, InProgress::Nothing) {
                    self.out.dc_repr(&repr);
                    sent += 1;
                }
                self.stats.poison_packets += sent;
            }
        }
        probe.attempts += 1;
        probe.deadline = now + poison::probe_wait(probe.attempts);
        sent > 0
    }

    /// The probed QP an ACK/NAK from the DC side comes from: sent by the
    /// local QP to the far host's QP, exactly as the targets name them.
    pub(super) fn probe_of(&self, p: &RocePacket<'_>) -> Option<HalfKey> {
        self.probes
            .iter()
            .find(|(_, pr)| {
                pr.target.local == p.ip.src()
                    && pr.target.far == p.ip.dst()
                    && pr.target.far_qpn == Some(p.bth.dest_qp)
            })
            .map(|(k, _)| *k)
    }

    /// An answer of a probed QP: learn its ePSN, poison it there, or note
    /// that it is in error. Absorbed in every case.
    pub(super) fn on_probe_answer(&mut self, now: Time, k: HalfKey, p: &RocePacket<'_>) {
        self.stats.probe_answers += 1;
        let Some(aeth) = p.ext.aeth else { return };
        let Some(mut probe) = self.probes.remove(&k) else {
            return;
        };
        // (ePSN, exact) this answer tells, if any.
        let told = match aeth.syndrome {
            // A duplicate: re-ACKed with the last executed PSN.
            Syndrome::Ack { .. } => Some((p.psn().next(), false)),
            Syndrome::Nak(NakCode::PsnSequenceError) => Some((p.psn(), true)),
            Syndrome::Nak(_) => {
                // A fatal NAK (Invalid Request: the probe or the poison
                // was at the ePSN): the QP is in the error state. Its
                // later answers are absorbed as a poisoned QP's.
                self.stats.qps_poisoned_after_probe += 1;
                self.note_poisoned(k, probe.target.far_qpn);
                return;
            }
            // An RNR NAK cannot answer a Middle opcode; nothing to learn.
            _ => None,
        };
        if let Some((epsn, exact)) = told {
            let better = match probe.poison_at {
                None => true,
                // A NAK-seq is exact; a re-ACK only ever moves the estimate
                // forward (a lagging re-ACK after a READ).
                Some((at, was_exact)) => at != epsn && (exact || (!was_exact && epsn.after(at))),
            };
            if better && probe.rounds < poison::PROBE_ROUNDS {
                probe.rounds += 1;
                probe.poison_at = Some((epsn, exact));
                probe.attempts = 0;
                self.send_probe_step(now, &mut probe);
            }
        }
        self.probes.insert(k, probe);
    }

    /// Probes whose answer did not come in time: sent again, or given up
    /// (unattributable) after [`poison::PROBE_ATTEMPTS`] sends.
    pub(super) fn probe_timeouts(&mut self, now: Time) {
        let due: Vec<HalfKey> = self
            .probes
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            let Some(mut probe) = self.probes.remove(&k) else {
                continue;
            };
            if probe.attempts < poison::PROBE_ATTEMPTS {
                self.send_probe_step(now, &mut probe);
                self.probes.insert(k, probe);
            } else {
                self.stats.probes_unanswered += 1;
                self.stats.poison_unattributable += 1;
                // Its late answers are still not the twin's business.
                self.note_poisoned(k, probe.target.far_qpn);
            }
        }
    }

    /// Local QPs whose ePSN is still being probed.
    pub fn probes_pending(&self) -> usize {
        self.probes.len()
    }

    /// DREQs for the RDMA-CM connections `chosen` (taken from
    /// `cm_conns`, so forgotten): to the local end in the far host's name, and, with
    /// `both_ends`, to the far end in the local host's name (carried to the
    /// twin as a datagram, which it injects as is). Returns the DREQs sent.
    ///
    /// Why: rping and other librdmacm users wait for the DISCONNECTED
    /// event, and rping ignores flushed completions (the lab showed it
    /// hanging with its QP already in the error state, and exiting 0.75 s
    /// after such a DREQ). A DREQ is a UD SEND Only to QP1 with the GSI
    /// Q_Key, as the sender's CM would send it; the receiving CM answers
    /// with a DREP (toward a lost twin it goes nowhere; toward a live one,
    /// the far CM takes it as the answer to the DREQ it got, or drops it).
    pub(super) fn send_dreqs(&mut self, chosen: Vec<CmConn>, both_ends: bool) -> u64 {
        let mut sent = 0;
        for c in chosen {
            // The local end, told by "the far host".
            let tid = 0x50A7_0000_0000_0000 | u64::from(c.local_comm_id);
            let mad = cm::dreq_mad(c.far_comm_id, c.local_comm_id, c.local_qpn, tid);
            if let Some(v) = dreq_packet(c.far, c.local, &mad) {
                self.out.dc(&v);
                sent += 1;
            }
            if both_ends && self.send_far_dreq(&c) {
                sent += 1;
            }
        }
        sent
    }

    /// A DREQ to the far end of `c` in the local host's name, carried to
    /// the twin as a datagram (it injects it as is).
    pub(super) fn send_far_dreq(&mut self, c: &CmConn) -> bool {
        let tid = 0x50A7_0000_0000_0000 | u64::from(c.far_comm_id);
        let mad = cm::dreq_mad(c.local_comm_id, c.far_comm_id, c.far_qpn, tid);
        match dreq_packet(c.local, c.far, &mad) {
            Some(v) => {
                self.out.twin(&v, |packet| TwinMsg::Datagram { packet });
                true
            }
            None => false,
        }
    }
}

/// A CM MAD from `from`'s CM to `to`'s.
fn dreq_packet(from: IpAddr, to: IpAddr, mad: &[u8]) -> Option<Vec<u8>> {
    builders::cm_mad(IpHeader::between(from, to)?)
        .to_vec(mad)
        .ok()
}
