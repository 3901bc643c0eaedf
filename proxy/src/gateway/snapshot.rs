//! A point-in-time view of one gateway: what `/metrics`, the control socket
//! and `soya status` show. The device loop builds it on request; readers
//! never touch the state machines.

use serde::{Deserialize, Serialize};

pub use soya_proto::site::counters::{DcCounters, TwinCounters};

/// Flows listed per snapshot (busiest first, by bytes then packets): bounds
/// the metrics' label cardinality.
pub const MAX_FLOWS: usize = 64;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    pub site: String,
    pub version: String,
    /// `udp 127.0.0.10:4791`, `tun soya0`.
    pub backend: String,
    /// `running`, `draining` or `stopped`.
    pub state: String,
    pub uptime_secs: f64,
    pub generation: u64,
    pub peer_generation: Option<u64>,
    /// A WAN path answers (never true for a twin that does not).
    pub connected: bool,
    /// The twin's life as the site sees it.
    #[serde(default)]
    pub twin_status: TwinStatus,
    pub insecure: bool,
    pub policy: String,
    pub dc: DcCounters,
    pub engine: EngineCounters,
    pub buffer: BufferSnap,
    pub twin: TwinCounters,
    pub wan: WanCounters,
    pub paths: Vec<PathSnap>,
    /// The busiest flows (at most [`MAX_FLOWS`]).
    pub flows: Vec<FlowSnap>,
    /// Halves the engine knows (ingress + egress).
    pub flows_total: usize,
    /// One entry per shard (device thread), by index.
    #[serde(default)]
    pub shards: Vec<ShardSnap>,
}

/// The twin as a site sees it (`site::TwinState`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TwinStatus {
    /// `connecting`, `connected`, `unreachable` or `lost`.
    pub state: String,
    /// Seconds since every path went down (unreachable, lost) or since the
    /// session started (connecting); 0 when connected.
    pub for_secs: f64,
    /// Seconds since it was declared lost (lost only).
    #[serde(default)]
    pub lost_for_secs: f64,
    /// `wan.twin_timeout`.
    pub timeout_secs: f64,
}

/// One shard's share of the traffic and its session.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShardSnap {
    pub index: usize,
    pub connected: bool,
    pub generation: u64,
    /// DC packets this shard fed its engine (read itself or handed over).
    pub dc_rx_accepted: u64,
    pub dc_tx_packets: u64,
    pub twin_msgs_out: u64,
    pub twin_msgs_in: u64,
    pub wan_packets_sent: u64,
    pub wan_packets_received: u64,
    /// DC packets it read for another shard and handed over / dropped
    /// (queue full), and packets other shards handed to it.
    pub handoff_out: u64,
    pub handoff_dropped: u64,
    pub handoff_in: u64,
    pub slots_used: u64,
    /// Why it thinks it has no session (empty when fine).
    pub alarm: String,
    /// xdp backend: `zero-copy` or `copy` (empty for the other backends).
    #[serde(default)]
    pub dc_mode: String,
    /// Turns of the device loop so far (each wake-up from `ppoll`). Beside
    /// the packet counters, the packets per turn: what a packet costs
    /// depends on it (docs/benchmarks.md §4, "The per-shard code without
    /// the kernel").
    #[serde(default)]
    pub turns: u64,
    /// xdp backend, packets toward the DC decoded into lent UMEM: sent in
    /// place (no copy), sent by copying (their UMEM still being sent),
    /// and decodes that found no UMEM free (heap buffer, copying send).
    #[serde(default)]
    pub xdp_tx_in_place: u64,
    #[serde(default)]
    pub xdp_tx_busy_copied: u64,
    #[serde(default)]
    pub xdp_lend_empty: u64,
    /// xdp backend, multi-buffer frames from the DC: lent to the site in
    /// place on the RX tape (no copy), gathered because they straddled a
    /// break in the tape, or gathered because the tape's budget of held
    /// frames was spent (one copy each).
    #[serde(default)]
    pub xdp_rx_in_place: u64,
    #[serde(default)]
    pub xdp_rx_gathered_break: u64,
    #[serde(default)]
    pub xdp_rx_gathered_full: u64,
    /// xdp backend, packets toward a host the kernel had no neighbour
    /// entry for yet: held until it had one, then sent; or dropped (the
    /// hold queue full, or no entry within a second).
    #[serde(default)]
    pub xdp_tx_held: u64,
    #[serde(default)]
    pub xdp_tx_unresolved_dropped: u64,
}

/// A snapshot's view of a protocol stats struct: the `copied` counters
/// are the source's of the same name, each named once (here: one that the
/// source lacks does not compile), and `copied_from` copies them; the
/// device loop fills in the others.
macro_rules! counters_from {
    (
        $(#[$meta:meta])*
        pub struct $name:ident from $src:ty {
            copied: [$($(#[$cm:meta])* $c:ident),* $(,)?],
            $($(#[$om:meta])* pub $o:ident: $ot:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
        pub struct $name {
            $($(#[$cm])* pub $c: u64,)*
            $($(#[$om])* pub $o: $ot,)*
        }

        impl $name {
            /// The `copied` counters of `s`; the others 0.
            pub fn copied_from(s: &$src) -> $name {
                $name {
                    $($c: s.$c,)*
                    ..Default::default()
                }
            }
        }
    };
}

counters_from! {
    /// `QpEngine::stats`.
    pub struct EngineCounters from soya_proto::qp::EngineStats {
        copied: [
            dc_packets, dc_malformed, dc_bad_icrc, dc_not_roce, twin_msgs, twin_malformed,
            cm_messages, flows_learned_cm, flows_learned_traffic, cnps_absorbed,
            unmatched_responses,
            /// What a lost or restarted twin failed (`QpEngine::fail_all`): halves
            /// failed, QPs moved to error through their responder role, QPs that
            /// could not be (their expected PSN unknown), egress halves dropped;
            /// and requests refused while the twin was lost.
            #[serde(default)] halves_failed_twin_lost,
            #[serde(default)] qps_poisoned,
            #[serde(default)] poison_unattributable,
            #[serde(default)] egress_halves_dropped,
            /// DREQs sent in a lost twin's host's name (RDMA-CM connections).
            #[serde(default)] dreqs_sent,
            /// Learning a local QP's expected PSN by probing (`qp::poison`): QPs
            /// probed, probe packets sent, answers absorbed, QPs then in error,
            /// QPs given up (their probes unanswered). Tell a QP whose probes went
            /// unanswered from one that could not be probed at all (no far QPN):
            /// both count in `poison_unattributable`.
            #[serde(default)] qps_probed,
            #[serde(default)] probes_sent,
            #[serde(default)] probe_answers,
            #[serde(default)] qps_poisoned_after_probe,
            #[serde(default)] probes_unanswered,
            /// The far side refused a request for good (`TwinMsg::Error`,
            /// `QpEngine::on_far_error`), and what it took to fail the requester
            /// (`EngineStats::far_error_*`).
            #[serde(default)] far_errors,
            #[serde(default)] far_error_qps_poisoned,
            #[serde(default)] far_error_qps_probed,
            #[serde(default)] far_error_unattributable,
            #[serde(default)] far_error_reverse_failed,
            #[serde(default)] far_error_dreqs,
            /// QPs orphaned by a gateway restart (`qp::orphan`): told to a twin
            /// that came back; received from the twin, and what became of them.
            #[serde(default)] orphans_told,
            #[serde(default)] orphans_received,
            #[serde(default)] orphan_qps_poisoned,
            #[serde(default)] orphan_qps_probed,
            #[serde(default)] orphans_skipped,
            #[serde(default)] orphans_unattributable,
            #[serde(default)] orphan_requesters_watched,
            #[serde(default)] orphan_requesters_failed,
            #[serde(default)] orphan_requester_naks,
            /// A twin that restarted (`qp::resume`): restarts seen, ingress halves
            /// resumed toward its new incarnation and the packets they sent
            /// again, halves that could not be, and why: their QP had requests
            /// the other way, pseudo-ACKed by the twin that died; or the bytes
            /// of a request not yet delivered were lost before the transport.
            #[serde(default)] twin_restarts,
            #[serde(default)] halves_resumed,
            #[serde(default)] packets_resent_on_resume,
            #[serde(default)] halves_unresumable,
            #[serde(default)] halves_unresumable_two_way,
            #[serde(default)] halves_unresumable_bytes_lost,
            /// Halves forgotten after `idle_after` of quiet (`qp::engine::expiry`), of
            /// which failed ones.
            #[serde(default)] halves_expired_ingress,
            #[serde(default)] halves_expired_egress,
            #[serde(default)] halves_expired_failed,
        ],
        /// Requests refused or dropped while the twin was unreachable.
        #[serde(default)]
        pub requests_refused_unreachable: u64,
        /// Halves the engine knows now, by role (gauges; `flows_total` is
        /// their sum).
        #[serde(default)]
        pub halves_ingress: u64,
        #[serde(default)]
        pub halves_egress: u64,
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BufferSnap {
    pub slots_used: u64,
    pub slots_total: u64,
    pub high_water: u64,
    pub slot_bytes: u64,
}

counters_from! {
    /// `Connection::stats`, and the WAN sockets' own counters.
    pub struct WanCounters from soya_proto::wan::ConnStats {
        copied: [
            packets_sent, packets_received, packets_lost, packets_retransmitted, packets_accepted,
            auth_failures, replays_dropped, malformed, stale_generation, no_session,
            role_conflicts, protocol_violations, peer_restarts, events_dropped, messages_queued,
            messages_delivered, messages_discarded, datagrams_sent, datagrams_received,
            datagrams_dropped,
            /// WAN flows this side retired (idle, FIN acknowledged: `wan::flow`).
            #[serde(default)] flows_retired,
            /// Fragmented messages moved once more in their reassembly
            /// buffer (their header's length guessed wrong: `wan::flow`).
            #[serde(default)] recv_reassembly_moves,
            /// Key updates (`wan::keyphase`): packets sealed under the
            /// current sending key (merged: the most of any shard) and what
            /// that key may seal (its AEAD limit; merged: the least), the
            /// sending and the twin's updates in this session, late packets
            /// opened with the twin's key before, sessions closed at the
            /// integrity limit, sends held back at the confidentiality limit.
            #[serde(default)] tx_key_packets,
            #[serde(default)] tx_key_limit,
            #[serde(default)] tx_key_updates,
            #[serde(default)] rx_key_updates,
            #[serde(default)] rx_key_previous,
            #[serde(default)] integrity_limit_closes,
            #[serde(default)] key_exhausted,
            /// The identity-key handshake (`wan::session::noise`): messages
            /// that did not authenticate (another key, another PSK, a
            /// PSK-only twin), INITIATIONs from an unknown static key,
            /// copies that changed nothing; datagrams of another wire
            /// version.
            #[serde(default)] handshake_failures,
            #[serde(default)] unknown_peer_keys,
            #[serde(default)] stale_handshakes,
            #[serde(default)] wrong_version,
            /// Re-handshakes completed (a fresh DH inside the session:
            /// `wan::session::rekey`).
            #[serde(default)] rekeys,
        ],
        pub send_buffered_bytes: u64,
        pub recv_buffered_bytes: u64,
        /// WAN flows this side sends on (live, or closing: FIN unacknowledged).
        #[serde(default)]
        pub flows_live: u64,
        /// WAN flows of the twin open here (receiving).
        #[serde(default)]
        pub recv_flows_live: u64,
        /// Datagrams from no path's remote on a multi-path socket.
        pub unknown_source: u64,
        /// Datagrams from another address on a single-path socket (handed to
        /// the transport, which authenticates them).
        pub foreign_source: u64,
        pub socket_send_errors: u64,
        pub socket_recv_errors: u64,
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PathSnap {
    pub name: String,
    pub local: String,
    pub remote: String,
    /// `probing`, `up` or `down`.
    pub state: String,
    pub weight: u32,
    pub dscp: u8,
    pub srtt_us: u64,
    pub min_rtt_us: u64,
    pub rttvar_us: u64,
    pub loss_rate: f64,
    pub cwnd_bytes: u64,
    pub pacing_rate_bps: u64,
    pub bytes_in_flight: u64,
    pub packets_sent: u64,
    pub bytes_sent: u64,
    pub packets_received: u64,
    pub bytes_received: u64,
    pub packets_lost: u64,
    pub packets_retransmitted: u64,
    pub auth_failures: u64,
    pub malformed: u64,
    pub times_down: u64,
    /// The shard (device thread) whose connection owns this path.
    #[serde(default)]
    pub shard: usize,
}

/// One half as this gateway sees it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FlowSnap {
    /// `ingress` (requester here: pseudo-ACKs) or `egress` (responder here:
    /// re-injects).
    pub role: String,
    /// `requester->responder/qpN`.
    pub half: String,
    /// Ingress: `raw`, `switching` or `accelerated`; egress: empty.
    pub mode: String,
    /// Ingress: request packets from the requester. Egress: packets
    /// injected toward the responder (retransmissions excluded).
    pub packets: u64,
    /// Ingress: their IP bytes. Egress: not counted by the engine (0).
    pub bytes: u64,
    pub pseudo_acks: u64,
    /// Ingress: NAKs sent to the requester (sequence and injected errors).
    /// Egress: NAKs received from the responder.
    pub naks: u64,
    /// Egress: go-back-N retransmissions toward the responder. Ingress:
    /// duplicates from the requester the gateway answered or dropped (a
    /// tunnel's included: `qp::ingress::tunnel`).
    pub retransmissions: u64,
    /// Ingress: packets held in the deep buffer; egress: held for injection.
    pub buffered: u64,
    /// Every engine counter of the half (`IngressStats` / `EgressStats`),
    /// for `soya status --json` and debugging.
    pub detail: String,
}

/// Adds every number of `b` into `a` (field by field, via serde: the
/// counter structs are flat).
fn add_into<T: Serialize + serde::de::DeserializeOwned>(a: &mut T, b: &T) {
    let (Ok(serde_json::Value::Object(mut x)), Ok(serde_json::Value::Object(y))) =
        (serde_json::to_value(&*a), serde_json::to_value(b))
    else {
        return;
    };
    for (k, v) in y {
        if let (Some(serde_json::Value::Number(p)), serde_json::Value::Number(q)) = (x.get(&k), &v)
        {
            if let (Some(p), Some(q)) = (p.as_u64(), q.as_u64()) {
                x.insert(k, serde_json::Value::from(p.saturating_add(q)));
            }
        }
    }
    if let Ok(t) = serde_json::from_value(serde_json::Value::Object(x)) {
        *a = t;
    }
}

/// The gateway's snapshot from its shards' (in shard order): counters
/// summed, paths and shards listed, the busiest flows of all. One shard:
/// its snapshot unchanged.
pub fn merge(mut parts: Vec<Snapshot>) -> Option<Snapshot> {
    if parts.len() <= 1 {
        return parts.pop();
    }
    parts.sort_by_key(|p| p.shards.first().map_or(0, |s| s.index));
    let mut it = parts.into_iter();
    let mut m = it.next()?;
    let slot_bytes = m.buffer.slot_bytes;
    for p in it {
        add_into(&mut m.dc, &p.dc);
        add_into(&mut m.engine, &p.engine);
        add_into(&mut m.buffer, &p.buffer);
        add_into(&mut m.twin, &p.twin);
        // Per-key figures are not sums: the key closest to its limit speaks.
        let key_packets = m.wan.tx_key_packets.max(p.wan.tx_key_packets);
        let key_limit = match (m.wan.tx_key_limit, p.wan.tx_key_limit) {
            (0, x) | (x, 0) => x,
            (x, y) => x.min(y),
        };
        add_into(&mut m.wan, &p.wan);
        m.wan.tx_key_packets = key_packets;
        m.wan.tx_key_limit = key_limit;
        m.connected &= p.connected;
        // The worst shard speaks for the twin.
        let rank = |t: &TwinStatus| match t.state.as_str() {
            "lost" => 3,
            "unreachable" => 2,
            "connecting" => 1,
            _ => 0,
        };
        if rank(&p.twin_status) > rank(&m.twin_status) {
            m.twin_status = p.twin_status.clone();
        }
        if p.state == "draining" || m.state == "stopped" {
            m.state = p.state.clone();
        }
        m.paths.extend(p.paths);
        m.flows.extend(p.flows);
        m.flows_total += p.flows_total;
        m.shards.extend(p.shards);
    }
    // Every shard has the same slot size. (A lab host is learned, and
    // counted, by every shard that owns one of its host pairs.)
    m.buffer.slot_bytes = slot_bytes;
    m.flows
        .sort_by_key(|f| std::cmp::Reverse((f.bytes, f.packets)));
    m.flows.truncate(MAX_FLOWS);
    Some(m)
}
