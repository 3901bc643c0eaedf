//! One gateway's QP state: classifies packets, learns flows, and runs the
//! ingress and egress roles of every half over a shared deep buffer.
//!
//! Inputs: packets from the DC side ([`QpEngine::handle_dc`]), messages from
//! the twin ([`QpEngine::handle_twin`]) and timers. Outputs: packets for the
//! DC side and messages for the twin ([`QpEngine::poll_output`]).
//!
//! Forgetting quiet halves is part of the engine's own state, in the child
//! module [`expiry`] (it reads every table here; the halves it sweeps only
//! carry a [`Quiet`](super::quiet::Quiet) and never import it).

use crate::buffer::PacketBuf;
use std::collections::BTreeMap;

use crate::keyed::{HashKey, KeyedMap};
use std::net::IpAddr;
use std::time::Duration;

use soya_config::{AckPolicy, SiteConfig};

use crate::buffer::{DeepBuffer, Occupancy, PacketPool, PoolStats};
use crate::roce::builders::ReplyTo;
use crate::roce::cm::{self, CmMessage, CmReq};
use crate::roce::ip::rxe_udp_sport;
use crate::roce::{is_roce, IpHeader, NakCode, OpKind, Psn, RocePacket, WireError};
use crate::time::Time;

pub mod expiry;
mod pacer;
mod room;

use super::cm_conns::{CmConn, CmConns};
use super::egress::{EgressTuning, Reinjector, RequestInfo};
use super::half::HalfKey;
use super::ingress::{AckTuning, PseudoAcker};
pub use super::outbox::{HeldRef, Outbox, Output};
use super::poison::{Orphan, OrphanRequester, Probe};
use super::timers::Halves;
use super::twin::{Carry, TwinMsg};
use expiry::Expiry;

#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    pub ack: AckTuning,
    pub egress: EgressTuning,
    pub buffer_slots: usize,
    pub slot_bytes: usize,
    pub per_flow_slots: usize,
    /// Keys the engine's tables (`crate::keyed`): secret in the daemon, seeded
    /// in the simulator.
    pub hash_key: HashKey,
}

impl Default for EngineConfig {
    /// Lab defaults: 128 Ki slots of 4.5 KiB (576 MiB), edge policy.
    fn default() -> EngineConfig {
        EngineConfig {
            ack: AckTuning {
                policy: AckPolicy::Edge,
                coalesce_packets: 16,
                coalesce: Duration::from_micros(20),
                ack_reserve_slots: 256,
                // 8 MiB at a 4 KiB MTU: 2,048 packets, as a site config
                // with the default `buffer.requester_window` gives.
                assumed_window_slots: soya_config::window_slots(
                    soya_config::DEFAULT_REQUESTER_WINDOW,
                    soya_config::DEFAULT_SLOT_BYTES,
                ) as usize,
                egress_window: 16_384,
                cnp_on_backpressure: true,
            },
            egress: EgressTuning::default(),
            buffer_slots: 131_072,
            slot_bytes: 4_608,
            per_flow_slots: 131_072,
            hash_key: HashKey::default(),
        }
    }
}

impl EngineConfig {
    /// The engine settings a site configuration asks for.
    pub fn from_site(site: &SiteConfig) -> EngineConfig {
        let mut c = EngineConfig::default();
        c.ack.policy = site.pseudo_ack.policy;
        c.ack.coalesce_packets = site.pseudo_ack.coalesce_packets;
        c.ack.coalesce = site.pseudo_ack.coalesce;
        c.ack.cnp_on_backpressure = site.pseudo_ack.cnp_on_backpressure;
        c.slot_bytes = site.buffer.slot_bytes as usize;
        c.buffer_slots = site.buffer.slots as usize;
        c.per_flow_slots = site.buffer.per_flow_quota.map_or(c.buffer_slots, |q| {
            (q / u64::from(site.buffer.slot_bytes)) as usize
        });
        // The same window `buffer.size = "auto"` made room for.
        c.ack.assumed_window_slots = site.buffer.requester_window_slots as usize;
        // The twin holds at most this much of ours in flight: half a flow's quota.
        c.ack.egress_window = (c.per_flow_slots / 2).max(64) as u32;
        c.egress.min_rto = site.dc.retransmit_floor;
        c.egress.max_rto = c.egress.max_rto.max(site.dc.retransmit_floor);
        c.egress.give_up = site.dc.give_up_after;
        c.egress.rnr_give_up = site.dc.rnr_give_up;
        // The twin's next packet, which asks for the ACK of a tail sent
        // without AckReq, may be a few WAN round trips away (its credit
        // comes back with our Delivered; a WAN loss costs a retransmission).
        let wan_rtt = site.wan.paths.iter().filter_map(|p| p.rtt).max();
        if let Some(rtt) = wan_rtt {
            c.egress.tail_probe = c.egress.tail_probe.max(4 * rtt);
        }
        c.egress.tail_probe = c.egress.tail_probe.min(c.egress.give_up / 2);
        c
    }

    /// Most bytes of one flow the ingress holds un-delivered: its share of
    /// the deep buffer. The WAN receive window of a flow must be at least
    /// this, or the WAN credit, not the buffer, caps a flow's rate (with two
    /// 10 Gb/s paths at 300 km a fixed 8 MiB window gave 1.71× one path
    /// instead of 2×).
    pub fn flow_bytes(&self) -> u64 {
        self.per_flow_slots.min(self.buffer_slots) as u64 * self.slot_bytes as u64
    }

    /// Bytes of the whole deep buffer.
    pub fn buffer_bytes(&self) -> u64 {
        self.buffer_slots as u64 * self.slot_bytes as u64
    }
}

/// Engine-wide counters (per-half counters live in the halves).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub dc_packets: u64,
    pub dc_malformed: u64,
    pub dc_bad_icrc: u64,
    pub dc_not_roce: u64,
    pub twin_msgs: u64,
    pub twin_malformed: u64,
    pub cm_messages: u64,
    pub flows_learned_cm: u64,
    pub flows_learned_traffic: u64,
    pub cnps_absorbed: u64,
    pub unmatched_responses: u64,
    /// [`QpEngine::fail_all`] calls (the twin declared lost).
    pub twin_lost: u64,
    /// Ingress halves failed by `fail_all` (each answers every later
    /// request with the error).
    pub halves_failed_twin_lost: u64,
    /// ...of which the requester had something outstanding and got a NAK
    /// at its oldest outstanding PSN.
    pub halves_nacked_twin_lost: u64,
    /// Local QPs with nothing outstanding moved to error through their
    /// responder (`qp::poison`), and the packets sent for it.
    pub qps_poisoned: u64,
    pub poison_packets: u64,
    /// Halves whose local QP has nothing outstanding and could not be moved
    /// to error: its QPN or its responder's expected PSN is not known
    /// (counted per half: a tunnel-phase requester and the egress half
    /// toward the same QP count twice).
    pub poison_unattributable: u64,
    /// Answers of poisoned QPs (NAK Invalid Request, re-ACKs, NAK-seq)
    /// absorbed instead of carried to the lost twin.
    pub poison_answers_absorbed: u64,
    /// Egress halves (requests from the lost twin) dropped by `fail_all`,
    /// and the packets they held.
    pub egress_halves_dropped: u64,
    pub egress_packets_dropped: u64,
    /// DREQs sent in a lost twin's name to local RDMA-CM connections.
    pub dreqs_sent: u64,
    /// Requests from the DC side while the twin is unreachable: refused
    /// with a NAK, or dropped (requester QPN unknown: no NAK can be
    /// addressed).
    pub requests_refused_unreachable: u64,
    pub requests_dropped_unreachable: u64,
    /// Local QPs whose ePSN `fail_all` set out to learn by probing
    /// (`qp::poison`, probing): nothing outstanding, QPNs known, ePSN not.
    pub qps_probed: u64,
    /// Probe packets sent (first sends and retries).
    pub probes_sent: u64,
    /// Answers of probed QPs (re-ACKs, NAK-seq, the fatal NAK) recognised
    /// and absorbed: never carried to the twin.
    pub probe_answers: u64,
    /// Probed QPs whose poison was answered with a fatal NAK: in error.
    pub qps_poisoned_after_probe: u64,
    /// Probed QPs given up after the bounded retries (also counted in
    /// `poison_unattributable`).
    pub probes_unanswered: u64,
    /// [`TwinMsg::Error`]s for a half known here: the far side refused one
    /// of its requests for good ([`QpEngine::on_far_error`]).
    pub far_errors: u64,
    /// ...whose requester had nothing outstanding and had been told that
    /// requests landed which did not: its QP moved to error through its
    /// responder role (`qp::poison`), and the packets sent for it...
    pub far_error_qps_poisoned: u64,
    pub far_error_poison_packets: u64,
    /// ...or its ePSN probed first (the probe's end is counted with the
    /// probes: `qps_poisoned_after_probe`, `probes_unanswered`)...
    pub far_error_qps_probed: u64,
    /// ...or neither (its QPN, or its ePSN and the far QPN, unknown).
    pub far_error_unattributable: u64,
    /// Egress halves toward such a QP failed, the twin told: a QP in error
    /// executes nothing more.
    pub far_error_reverse_failed: u64,
    /// DREQs sent for such a QP's RDMA-CM connection (both ends).
    pub far_error_dreqs: u64,
    /// `TwinMsg::Orphaned` messages (and far-end DREQs) sent to a twin
    /// that came back, about QPs at its site whose flows were failed here
    /// while it was away (`qp::orphan`).
    pub orphans_told: u64,
    /// `TwinMsg::Orphaned` received: QPs of this site whose flows the twin
    /// failed while this gateway was away (it restarted)...
    pub orphans_received: u64,
    /// ...moved to error through their responder role, and the packets...
    pub orphan_qps_poisoned: u64,
    pub orphan_poison_packets: u64,
    /// ...or probed first (the probe's end is counted with the probes)...
    pub orphan_qps_probed: u64,
    /// ...or left alone: poisoned or probed already, or a live flow of
    /// this incarnation toward that QP number (a new QP)...
    pub orphans_skipped: u64,
    /// ...or not attributable (no candidate ePSN and no far QPN to probe).
    pub orphans_unattributable: u64,
    /// Orphaned requesters of this site watched for their retransmissions
    /// (`qp::orphan`: the half of their requests named by an orphan
    /// message, not learned by this incarnation)...
    pub orphan_requesters_watched: u64,
    /// ...proven to retransmit from their oldest outstanding PSN (seen
    /// twice as the lowest) and answered there with a fatal NAK...
    pub orphan_requesters_failed: u64,
    /// ...the NAKs sent (one per retry of that PSN)...
    pub orphan_requester_naks: u64,
    /// ...and the probes of their responder role that this made moot.
    pub orphan_probes_superseded: u64,
    /// [`QpEngine::twin_restarted`] calls: the twin came back as a new
    /// incarnation (`qp::resume`)...
    pub twin_restarts: u64,
    /// ...ingress halves resumed toward it, and the request packets they
    /// sent again (everything not yet reported delivered)...
    pub halves_resumed: u64,
    pub packets_resent_on_resume: u64,
    /// ...and ingress halves that could not be resumed (failed as before),
    /// of which: their QP had requests the other way, pseudo-ACKed by the
    /// twin that restarted, which died with it; or the bytes of a request
    /// not yet delivered were lost on the way to the transport.
    pub halves_unresumable: u64,
    pub halves_unresumable_two_way: u64,
    pub halves_unresumable_bytes_lost: u64,
    /// Halves forgotten after `idle_after` of quiet (`qp::engine::expiry`)...
    pub halves_expired_ingress: u64,
    pub halves_expired_egress: u64,
    /// ...of which failed halves (their fatal-NAK promise kept until then).
    pub halves_expired_failed: u64,
    /// Poisoned QPs no longer watched for answers (`qp::engine::expiry`).
    pub poisoned_expired: u64,
}

/// What one [`QpEngine::fail_all`] did (for the daemon's log line; the
/// totals are in [`EngineStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TwinLostSummary {
    /// Ingress halves failed.
    pub halves_failed: u64,
    /// ...of which NAKed at the requester's oldest outstanding PSN.
    pub halves_nacked: u64,
    /// Local QPs moved to error through their responder.
    pub qps_poisoned: u64,
    pub poison_packets: u64,
    /// Local QPs with nothing outstanding that could not be poisoned.
    pub unattributable: u64,
    /// Local QPs whose ePSN is being learned by probing: each ends
    /// poisoned (`EngineStats::qps_poisoned_after_probe`) or unattributable
    /// (`EngineStats::probes_unanswered`) within a few milliseconds.
    pub probing: u64,
    pub egress_halves_dropped: u64,
    /// Buffer slots (or heap copies) freed from those egress halves.
    pub egress_packets_dropped: u64,
    /// DREQs sent in a lost twin's name to local RDMA-CM connections.
    pub dreqs_sent: u64,
}

pub(super) use super::cm_conns::MAX_CM_CONNS;

/// A CM REQ seen, waiting for its REP.
struct PendingReq {
    req: CmReq,
    active: IpAddr,
    passive: IpAddr,
    /// The REQ came from the local DC (the active side is local).
    active_local: bool,
}

pub struct QpEngine {
    cfg: EngineConfig,
    pub(super) buffer: DeepBuffer,
    pub(super) ingress: Halves<PseudoAcker>,
    pub(super) egress: Halves<Reinjector>,
    /// The deep buffer's flow id of each ingress half (`HalfKey::id`) →
    /// the half: the buffer names the flows waiting for room by their ids
    /// (`buffer::room`), and the engine offers the room to the first of
    /// them ([`Self::serve_room_waiters`]). Entered when a half is made;
    /// an entry whose half is gone is dropped when met, and with the
    /// quiet halves' side tables (`expiry`).
    pub(super) ingress_flows: KeyedMap<u64, HalfKey>,
    /// (requester address, requester QPN, responder address) → half.
    pub(super) by_requester: KeyedMap<(IpAddr, u32, IpAddr), HalfKey>,
    pending_req: KeyedMap<u32, PendingReq>,
    /// RDMA-CM connections between a local and a far host, learned from
    /// REQ/REP: what a DREQ in the far host's name needs when the twin is
    /// lost (bounded; forgotten on DREQ, DREP or REJ; `qp::cm_conns`).
    pub(super) cm_conns: CmConns,
    /// From RDMA-CM: the first PSN the far requester of an egress half
    /// sends with (its responder's first expected PSN), for halves that
    /// may not have seen a packet yet.
    pub(super) cm_start: KeyedMap<HalfKey, Psn>,
    /// Is the twin reachable? While not, requests from the DC side are
    /// refused ([`QpEngine::set_twin_reachable`]).
    pub(super) twin_reachable: bool,
    /// Egress halves (far requester → local responder QP) whose local QP
    /// was poisoned, with the far requester's QPN when known: their
    /// answers are absorbed.
    pub(super) poisoned: KeyedMap<HalfKey, Option<u32>>,
    /// Local QPs being probed, by the (far requester → local responder)
    /// half toward them.
    pub(super) probes: BTreeMap<HalfKey, Probe>,
    /// QPs at the twin's site whose flows `fail_all` failed, and RDMA-CM
    /// connections whose far end gets a DREQ, until the twin answers again
    /// (`qp::orphan`).
    pub(super) orphans: Vec<Orphan>,
    pub(super) orphan_dreqs: Vec<CmConn>,
    /// Requesters of this site orphaned by this gateway's restart, watched
    /// for their retransmissions, by the half of their requests.
    pub(super) orphan_requesters: KeyedMap<HalfKey, OrphanRequester>,
    /// Forgetting quiet halves (`qp::engine::expiry`).
    pub(super) expiry: Expiry,
    pub(super) out: Outbox,
    /// `handle_timeout`'s list of halves due, kept so that a timeout
    /// allocates nothing.
    due: Vec<HalfKey>,
    /// The pacer's next look, and its list of halves to act on
    /// (`pacer`).
    pace_due: Option<Time>,
    pace_keys: Vec<HalfKey>,
    pub stats: EngineStats,
}

impl QpEngine {
    pub fn new(cfg: EngineConfig) -> QpEngine {
        QpEngine {
            buffer: DeepBuffer::new(cfg.buffer_slots, cfg.slot_bytes, cfg.per_flow_slots),
            cfg,
            ingress: Halves::with_hasher(cfg.hash_key),
            egress: Halves::with_hasher(cfg.hash_key),
            ingress_flows: KeyedMap::with_hasher(cfg.hash_key.state()),
            by_requester: KeyedMap::with_hasher(cfg.hash_key.state()),
            pending_req: KeyedMap::with_hasher(cfg.hash_key.state()),
            cm_conns: CmConns::default(),
            cm_start: KeyedMap::with_hasher(cfg.hash_key.state()),
            twin_reachable: true,
            poisoned: KeyedMap::with_hasher(cfg.hash_key.state()),
            probes: BTreeMap::new(),
            orphans: Vec::new(),
            orphan_dreqs: Vec::new(),
            orphan_requesters: KeyedMap::with_hasher(cfg.hash_key.state()),
            expiry: Expiry::default(),
            out: Outbox::default(),
            due: Vec::new(),
            pace_due: None,
            pace_keys: Vec::new(),
            stats: EngineStats::default(),
        }
    }

    /// The next output. Its packet (if any) is a pooled buffer: give it
    /// back with [`Self::recycle`] once sent, or it is simply freed.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The bytes an [`Output::DcHeld`] names, as they are to be sent now;
    /// `None` once the request is released (see `Output::DcHeld`).
    pub fn held_packet(&self, r: &HeldRef) -> Option<&[u8]> {
        self.egress.get(&r.key)?.held_request(r.psn)
    }

    /// A pooled copy of what `r` names, for a caller that must own the
    /// packet ([`Self::poll_output_owned`]; `Site` sends a held request
    /// from where it lies, with [`Self::held_packet`]).
    pub fn held_copy(&mut self, r: &HeldRef) -> Option<PacketBuf> {
        let bytes = self.egress.get(&r.key)?.held_request(r.psn)?;
        Some(self.out.pool.copy_of(bytes))
    }

    /// [`Self::poll_output`] for a driver that must own every DC packet
    /// (tests, models): an [`Output::DcHeld`] comes as an `Output::Dc` of a
    /// pooled copy, made now; a released one is skipped.
    pub fn poll_output_owned(&mut self) -> Option<Output> {
        loop {
            match self.out.pop_front()? {
                Output::DcHeld(r) => {
                    if let Some(v) = self.held_copy(&r) {
                        return Some(Output::Dc(v));
                    }
                }
                o => return Some(o),
            }
        }
    }

    /// Returns a packet buffer to the engine's pool (an `Output::Dc` after
    /// the socket send, a datagram refused by the ACL...).
    pub fn recycle(&mut self, packet: PacketBuf) {
        self.out.pool.put(packet);
    }

    /// A request's buffer the WAN transport is done with
    /// (`WanConnection::take_handed_back`): its ingress half keeps it until
    /// the twin reports the request delivered, or it goes to the pool.
    pub fn take_back(&mut self, packet: PacketBuf) {
        let back = match HalfKey::of_request_bytes(&packet) {
            Some((key, psn)) => match self.ingress.get_mut(&key) {
                Some(a) => a.take_back(psn, packet),
                None => Some(packet),
            },
            None => Some(packet),
        };
        if let Some(b) = back {
            self.out.pool.put(b);
        }
    }

    /// A request forwarded raw (a tunnel's) that the WAN transport is done
    /// with: the twin acknowledged it. Its half's requester may resend it
    /// now and be heard (`qp::ingress::tunnel`); the buffer goes to the pool.
    pub fn raw_released(&mut self, packet: PacketBuf) {
        if let Some((key, psn)) = HalfKey::of_request_bytes(&packet) {
            self.raw_left(&key, psn);
        }
        self.out.pool.put(packet);
    }

    /// The request at `psn` of `key`, forwarded raw, left this gateway
    /// without reaching the twin (the site dropped it on the way).
    pub fn raw_left(&mut self, key: &HalfKey, psn: Psn) {
        if let Some(a) = self.ingress.get_mut(key) {
            a.raw_left(psn);
        }
    }

    /// The engine's pool of packet buffers (the device loop balances it
    /// against the transport's).
    pub fn pool_mut(&mut self) -> &mut PacketPool {
        &mut self.out.pool
    }

    /// Idle buffers in the engine's pool.
    pub fn pool_idle(&self) -> usize {
        self.out.pool.idle()
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.out.pool.stats
    }

    /// The earliest timer: the halves' from their heaps (`qp::timers`),
    /// the probes' (few, and only after the twin was lost) by a scan.
    pub fn poll_timeout(&self) -> Option<Time> {
        let i = self.ingress.next_deadline();
        let e = self.egress.next_deadline();
        let p = self.probes.values().map(|p| p.deadline);
        // A lapsing promise frees room a waiting flow may need.
        let b = self.buffer.next_lapse();
        i.into_iter()
            .chain(e)
            .chain(p)
            .chain(b)
            .chain(self.pace_due)
            .min()
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.buffer.lapse(now);
        let mut due = std::mem::take(&mut self.due);
        self.ingress.take_due(now, &mut due);
        for k in &due {
            if let Some(a) = self.ingress.get_mut(k) {
                if a.poll_timeout().is_some_and(|t| t <= now) {
                    a.on_timeout(now, &mut self.buffer, &mut self.out);
                }
            }
        }
        self.egress.take_due(now, &mut due);
        for k in &due {
            if let Some(r) = self.egress.get_mut(k) {
                if r.poll_timeout().is_some_and(|t| t <= now) {
                    r.on_timeout(now, &mut self.buffer, &mut self.out);
                }
            }
        }
        self.due = due;
        if self.probes.values().any(|p| p.deadline <= now) {
            self.probe_timeouts(now);
        }
        self.pace(now);
        self.serve_room_waiters(now);
        self.arm_pacer(now);
    }

    /// A reload's new tuning: the pseudo-ACK and re-injection settings
    /// apply to halves learned from now on (a half keeps the policy it was
    /// learned with: switching strict/edge/off under packets already
    /// pseudo-ACKed would break its promises); the per-flow quota applies to
    /// every flow at once. Slots and slot size are fixed at start.
    pub fn retune(&mut self, cfg: &EngineConfig) {
        self.cfg.ack = cfg.ack;
        self.cfg.egress = cfg.egress;
        self.cfg.per_flow_slots = cfg.per_flow_slots;
        self.buffer.set_per_flow_slots(cfg.per_flow_slots);
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn occupancy(&self) -> Occupancy {
        self.buffer.occupancy()
    }

    /// Bytes of per-flow state, besides buffers: the ingress and egress
    /// tables (slots as allocated, timer heaps) with each half's own heap
    /// bookkeeping, and the flow-learning tables (`by_requester`,
    /// `cm_start`). Not counted: the deep buffer and the packets held (the
    /// buffers), and the engine's fixed-size parts.
    pub fn state_bytes(&self) -> usize {
        fn table<K, V, S>(m: &std::collections::HashMap<K, V, S>) -> usize {
            m.capacity() * (std::mem::size_of::<(K, V)>() + 1)
        }
        self.ingress.state_bytes(PseudoAcker::bookkeeping_bytes)
            + self.egress.state_bytes(Reinjector::bookkeeping_bytes)
            + table(&self.by_requester)
            + table(&self.cm_start)
    }

    pub fn ingress_halves(&self) -> impl Iterator<Item = &PseudoAcker> {
        self.ingress.values()
    }

    pub fn egress_halves(&self) -> impl Iterator<Item = &Reinjector> {
        self.egress.values()
    }

    /// The QPN of `key`'s requester, as this site's egress learned it from
    /// the responder's answers (`None` before the first).
    pub fn requester_qpn(&self, key: &HalfKey) -> Option<u32> {
        self.egress.get(key)?.requester_qpn
    }

    /// A packet from the local DC side. A request accepted into the deep
    /// buffer is held as a pooled copy of `packet`.
    pub fn handle_dc(&mut self, now: Time, packet: &[u8]) {
        self.dc_packet(now, &mut DcBytes::Borrowed(packet));
        self.serve_room_waiters(now);
        self.arm_pacer(now);
    }

    /// A packet from the local DC side that the backend read into a pooled
    /// buffer ([`Self::rx_buffer`]): a request accepted into the deep
    /// buffer is held in that very buffer, uncopied, until the twin has it.
    /// Anything else is handled as by [`Self::handle_dc`] and the buffer
    /// goes back to the pool.
    pub fn handle_dc_owned(&mut self, now: Time, packet: PacketBuf) {
        let mut bytes = DcBytes::Owned(Some(packet));
        self.dc_packet(now, &mut bytes);
        if let DcBytes::Owned(Some(v)) = bytes {
            self.out.pool.put(v);
        }
        self.serve_room_waiters(now);
        self.arm_pacer(now);
    }

    /// An empty pooled buffer for a DC backend to read a packet into and
    /// hand to [`Self::handle_dc_owned`] (capacity
    /// [`crate::buffer::pool::PACKET_BUF_BYTES`]).
    pub fn rx_buffer(&mut self) -> PacketBuf {
        self.out.pool.take()
    }

    /// Gives back a buffer from [`Self::rx_buffer`] that was not used.
    pub fn return_rx_buffer(&mut self, buf: PacketBuf) {
        self.out.pool.put(buf);
    }

    /// Handles a DC packet. A request admitted into an ingress half is
    /// held by that half, found once: `bytes` gives up its buffer (or a
    /// pooled copy of borrowed bytes) once the parse is done with it.
    fn dc_packet(&mut self, now: Time, bytes: &mut DcBytes<'_>) {
        let packet = bytes.as_slice();
        self.stats.dc_packets += 1;
        self.arm_expiry(now);
        if IpHeader::split(packet).is_err() {
            self.stats.dc_malformed += 1;
            return;
        }
        if !is_roce(packet) {
            // Other IP traffic between the sites travels as a datagram, in
            // the buffer it was read into (a copy of borrowed bytes).
            self.stats.dc_not_roce += 1;
            let packet = bytes.take(&mut self.out.pool);
            self.out
                .push_back(Output::Twin(TwinMsg::Datagram { packet }));
            return;
        }
        let p = match RocePacket::parse_verified(packet) {
            Ok(p) => p,
            Err(e) => {
                match e {
                    WireError::BadIcrc { .. } => self.stats.dc_bad_icrc += 1,
                    _ => self.stats.dc_malformed += 1,
                }
                return;
            }
        };
        if cm::is_qp1_mad(&p) {
            self.on_cm(&p, true);
            self.out.twin(packet, |packet| TwinMsg::Datagram { packet });
            return;
        }
        match p.info.kind {
            OpKind::Cnp => {
                // Congestion on our injection toward the local responder;
                // the far requester cannot act on it. Counted, not carried.
                self.stats.cnps_absorbed += 1;
            }
            // A requester orphaned by this gateway's restart (`qp::orphan`).
            _ if p.info.is_request()
                && p.info.is_rc()
                && !self.orphan_requesters.is_empty()
                && self.orphan_request(now, &p) => {}
            _ if p.info.is_request() && p.info.is_rc() && !self.twin_reachable => {
                // Refused at once: nothing buffered, nothing pseudo-ACKed,
                // nothing carried. A half whose requester QPN is unknown
                // cannot be answered (the BTH names only the destination
                // QP; a QPN is never guessed): its packets are dropped and
                // the requester's own retry budget ends it.
                let key = HalfKey::of_request(&p);
                let refused = self
                    .ingress
                    .get_mut(&key)
                    .is_some_and(|a| a.refuse(&p, NakCode::RemoteOperationalError, &mut self.out));
                if refused {
                    self.stats.requests_refused_unreachable += 1;
                } else {
                    self.stats.requests_dropped_unreachable += 1;
                }
            }
            _ if p.info.is_request() && p.info.is_rc() => {
                let key = HalfKey::of_request(&p);
                let tuning = self.cfg.ack;
                let (a, new) = self
                    .ingress
                    .get_or_insert_new(key, || PseudoAcker::new_raw(key, tuning));
                if new {
                    self.ingress_flows.insert(a.flow_id(), key);
                }
                if let Some(admitted) = a.on_request(now, &p, &mut self.buffer, &mut self.out) {
                    // `p` is done with the bytes: they may move now.
                    let held = bytes.take(&mut self.out.pool);
                    a.hold(now, admitted, held, &mut self.buffer, &mut self.out);
                }
            }
            _ if p.info.is_response() => self.dc_response(now, &p),
            _ => self.out.twin(packet, |packet| TwinMsg::Datagram { packet }),
        }
    }

    /// A response from a local responder, to a requester at the far site.
    fn dc_response(&mut self, now: Time, p: &RocePacket<'_>) {
        if p.info.kind == OpKind::Ack && !self.probes.is_empty() {
            if let Some(k) = self.probe_of(p) {
                self.on_probe_answer(now, k, p);
                return;
            }
        }
        let id = (p.ip.dst(), p.bth.dest_qp, p.ip.src());
        let key = self.by_requester.get(&id).copied().or_else(|| {
            // Unknown requester QPN: the half between these addresses that
            // has not learned it yet and whose PSNs this answer falls in
            // (several QPs between two hosts start at random PSNs).
            let psn = p.psn();
            let mut c = self.egress.iter().filter(|(k, r)| {
                k.requester == id.0
                    && k.responder == id.2
                    && r.claims(psn)
                    && !self.by_requester.values().any(|v| v == *k)
            });
            let k = *c.next()?.0;
            if c.next().is_some() {
                return None;
            }
            self.by_requester.insert(id, k);
            self.stats.flows_learned_traffic += 1;
            Some(k)
        });
        if p.info.kind == OpKind::Ack && self.is_poison_answer(key, p) {
            self.stats.poison_answers_absorbed += 1;
            return;
        }
        match key.and_then(|k| self.egress.get_mut(&k)) {
            Some(r) => {
                r.requester_qpn = Some(id.1);
                r.on_response(now, p, &mut self.buffer, &mut self.out);
            }
            None => {
                self.stats.unmatched_responses += 1;
                self.out
                    .twin(p.as_bytes(), |packet| TwinMsg::Response { packet });
            }
        }
    }

    /// A message from the twin. A packet it carries is copied where it is
    /// needed (deep buffer, an output) and its buffer goes to the pool.
    pub fn handle_twin(&mut self, now: Time, msg: TwinMsg) {
        self.twin_msg(now, msg);
        self.serve_room_waiters(now);
        self.arm_pacer(now);
    }

    fn twin_msg(&mut self, now: Time, msg: TwinMsg) {
        self.stats.twin_msgs += 1;
        self.arm_expiry(now);
        match msg {
            TwinMsg::Request { carry, packet } => self.twin_request(now, carry, packet),
            TwinMsg::Response { packet } => {
                // Parsed, not ICRC-checked again: see `twin_request`.
                match RocePacket::parse(&packet) {
                    Ok(p) => self.twin_response(now, &p),
                    Err(_) => self.stats.twin_malformed += 1,
                }
                self.out.pool.put(packet);
            }
            TwinMsg::Delivered { half, psn, msn } => {
                if let Some(a) = self.ingress.get_mut(&half) {
                    a.on_delivered(now, psn, msn, &mut self.buffer, &mut self.out);
                }
            }
            TwinMsg::Error { half, psn, code } => self.on_far_error(now, half, psn, code),
            TwinMsg::Orphaned {
                qp,
                far_qpn,
                hint,
                candidates,
            } => self.on_orphan(now, qp, far_qpn, hint, candidates),
            TwinMsg::Datagram { packet } => {
                if let Ok(p) = RocePacket::parse_verified(&packet) {
                    if cm::is_qp1_mad(&p) {
                        self.on_cm(&p, false);
                    }
                }
                // Injected as is: the same buffer, back to the pool after
                // the send.
                self.out.push_back(Output::Dc(packet));
            }
        }
    }

    /// A request from the twin in its pooled buffer: held in place by the
    /// reinjector (reliable), or copied into the injected packet and given
    /// back (raw).
    ///
    /// Its ICRC is not computed again here: the twin checked it when the
    /// packet entered its site (`handle_dc`, which drops a bad one), and
    /// the WAN carried it under the session's AEAD tag (or, insecure, a
    /// CRC over the datagram), which no corruption in between passes. The
    /// second check cost 4 % of the re-injecting gateway's CPU.
    fn twin_request(&mut self, now: Time, carry: Carry, mut packet: PacketBuf) {
        let Ok(p) = RocePacket::parse(&packet) else {
            self.stats.twin_malformed += 1;
            self.out.pool.put(packet);
            return;
        };
        let key = HalfKey::of_request(&p);
        let tuning = self.cfg.egress;
        let (r, new) = self
            .egress
            .get_or_insert_new(key, || Reinjector::new(key, tuning));
        if new {
            // A new QP behind a number once poisoned: its answers are its own.
            self.poisoned.remove(&key);
        }
        match carry {
            Carry::Raw => {
                r.on_raw_request(now, &p, &mut self.out);
                self.out.pool.put(packet);
            }
            Carry::Reliable => {
                let info = RequestInfo::of(&p);
                // The packet's own bytes (IP length), not any padding after.
                let len = p.as_bytes().len();
                packet.truncate(len);
                r.on_request(now, info, packet, &mut self.buffer, &mut self.out);
            }
        }
    }

    /// A response from the far responder to a local requester.
    fn twin_response(&mut self, now: Time, p: &RocePacket<'_>) {
        let id = (p.ip.dst(), p.bth.dest_qp, p.ip.src());
        let key = self.by_requester.get(&id).copied().or_else(|| {
            let psn = p.psn();
            let mut c = self.ingress.iter().filter(|(k, a)| {
                k.requester == id.0 && k.responder == id.2 && !a.is_learned() && a.claims(psn)
            });
            let (k, _) = c.next()?;
            let k = *k;
            if c.next().is_some() {
                return None;
            }
            self.by_requester.insert(id, k);
            self.stats.flows_learned_traffic += 1;
            Some(k)
        });
        if let Some(k) = key {
            // Answered through this incarnation: a live QP, not an orphan.
            self.forget_orphan_requester(&k, Some(p.psn()));
        }
        let delivered = match key.and_then(|k| self.ingress.get_mut(&k)) {
            Some(a) => a.on_response(now, p, &mut self.buffer, &mut self.out),
            None => {
                self.stats.unmatched_responses += 1;
                self.out.dc(p.as_bytes());
                true
            }
        };
        let _ = delivered;
    }

    /// RDMA-CM: a REQ and its REP name both QPNs and both starting PSNs.
    fn on_cm(&mut self, p: &RocePacket<'_>, from_dc: bool) {
        self.stats.cm_messages += 1;
        let Ok(msg) = cm::parse_packet(p) else { return };
        match msg {
            CmMessage::Req(req) => {
                // Bound the table: a REQ whose REP never comes is forgotten
                // when newer ones push it out.
                if self.pending_req.len() >= 1024 {
                    self.pending_req.clear();
                }
                self.pending_req.insert(
                    req.local_comm_id,
                    PendingReq {
                        req,
                        active: p.ip.src(),
                        passive: p.ip.dst(),
                        active_local: from_dc,
                    },
                );
            }
            CmMessage::Rep(rep) => {
                let Some(pr) = self.pending_req.remove(&rep.remote_comm_id) else {
                    return;
                };
                let (qa, qp) = (pr.req.local_qpn, rep.local_qpn);
                // Linux CM: the active side sends from the REP's PSN, the
                // passive side from the REQ's (see roce::cm).
                let a_to_p = HalfKey {
                    requester: pr.active,
                    responder: pr.passive,
                    responder_qpn: qp,
                };
                let p_to_a = HalfKey {
                    requester: pr.passive,
                    responder: pr.active,
                    responder_qpn: qa,
                };
                let (ing, ing_qpn, ing_psn, eg, eg_qpn) = if pr.active_local {
                    (a_to_p, qa, rep.starting_psn, p_to_a, qp)
                } else {
                    (p_to_a, qp, pr.req.starting_psn, a_to_p, qa)
                };
                self.learn_cm(ing, ing_qpn, ing_psn, pr.req.path_mtu);
                self.by_requester
                    .insert((eg.requester, eg_qpn, eg.responder), eg);
                // The far requester's first PSN: the other one.
                let eg_psn = if pr.active_local {
                    pr.req.starting_psn
                } else {
                    rep.starting_psn
                };
                if self.cm_start.len() >= 65_536 {
                    self.cm_start.clear();
                }
                self.cm_start.insert(eg, eg_psn);
                self.stats.flows_learned_cm += 1;
                let conn = if pr.active_local {
                    CmConn {
                        local: pr.active,
                        far: pr.passive,
                        local_comm_id: pr.req.local_comm_id,
                        far_comm_id: rep.local_comm_id,
                        local_qpn: qa,
                        far_qpn: qp,
                    }
                } else {
                    CmConn {
                        local: pr.passive,
                        far: pr.active,
                        local_comm_id: rep.local_comm_id,
                        far_comm_id: pr.req.local_comm_id,
                        local_qpn: qp,
                        far_qpn: qa,
                    }
                };
                self.cm_conns.push(conn);
            }
            // A connection torn down (or refused) normally: no DREQ for
            // it later.
            CmMessage::Dreq {
                local_comm_id,
                remote_comm_id,
                ..
            }
            | CmMessage::Drep {
                local_comm_id,
                remote_comm_id,
            }
            | CmMessage::Rej {
                local_comm_id,
                remote_comm_id,
                ..
            } => {
                self.cm_conns.forget_comm_ids(local_comm_id, remote_comm_id);
            }
            _ => {}
        }
    }

    fn learn_cm(&mut self, key: HalfKey, requester_qpn: u32, first_psn: Psn, pmtu: u16) {
        let Some(ip) = IpHeader::between(key.responder, key.requester) else {
            return;
        };
        // A connection set up through this incarnation: not an orphan.
        self.forget_orphan_requester(&key, None);
        if self.ingress.get(&key).is_some_and(|a| !a.is_idle()) {
            return; // traffic already flowing: keep learning from it
        }
        let reply = ReplyTo {
            ip,
            src_port: rxe_udp_sport(requester_qpn, key.responder_qpn),
            dest_qp: requester_qpn,
        };
        let mut a = PseudoAcker::new_learned(key, self.cfg.ack, reply, first_psn);
        a.set_pmtu(u32::from(pmtu));
        self.ingress_flows.insert(a.flow_id(), key);
        if let Some(old) = self.ingress.insert(key, a) {
            let mut old = old;
            old.release_all(&mut self.buffer);
        }
        self.by_requester
            .insert((key.requester, requester_qpn, key.responder), key);
    }
}

/// A DC packet as the engine receives it: borrowed (a copy is made if it is
/// held) or in a pooled buffer the backend read it into (held as is).
enum DcBytes<'a> {
    Borrowed(&'a [u8]),
    /// `None` once taken.
    Owned(Option<PacketBuf>),
}

impl DcBytes<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            DcBytes::Borrowed(b) => b,
            DcBytes::Owned(v) => v.as_deref().unwrap_or(&[]),
        }
    }

    /// The bytes to hold: the buffer itself, or a pooled copy.
    fn take(&mut self, pool: &mut PacketPool) -> PacketBuf {
        match self {
            DcBytes::Borrowed(b) => pool.copy_of(b),
            DcBytes::Owned(v) => v.take().unwrap_or_default(),
        }
    }
}
