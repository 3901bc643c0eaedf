//! A point-in-time view of one gateway: what `/metrics`, the control socket
//! and `soya status` show. The device loop builds it on request; readers
//! never touch the state machines.

use serde::{Deserialize, Serialize};

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
    pub connected: bool,
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
}

/// Packets between the gateway and its local data center.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DcCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Passed the ACL and went to the engine.
    pub rx_accepted: u64,
    /// Not an IP packet whose lengths agree.
    pub rx_malformed: u64,
    /// Source outside `dc.local_prefixes`.
    pub rx_acl_source: u64,
    /// Destination outside `dc.remote_prefixes`.
    pub rx_acl_destination: u64,
    /// New requests refused while draining (the requester resends them).
    pub rx_draining: u64,
    /// New requests refused while the twin queue is above its high water.
    pub rx_backpressure: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// udp backend: destination host not learned yet.
    pub tx_no_peer: u64,
    /// Destination not a local host (never expected from the engine).
    pub tx_acl: u64,
    pub tx_errors: u64,
    /// tun backend: packets the kernel dropped before the gateway read them
    /// (the device's `tx_dropped`: its transmit queue was full).
    #[serde(default)]
    pub kernel_dropped: u64,
    /// udp backend: hosts learned, and datagrams refused because their host
    /// is bound to another, still active UDP address.
    pub lab_hosts: u64,
    pub lab_host_conflicts: u64,
}

/// `QpEngine::stats`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct EngineCounters {
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
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BufferSnap {
    pub slots_used: u64,
    pub slots_total: u64,
    pub high_water: u64,
    pub slot_bytes: u64,
}

/// The glue between engine and transport.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TwinCounters {
    pub msgs_out: u64,
    pub msgs_in: u64,
    pub pending_messages: u64,
    pub pending_bytes: u64,
    pub pending_high_water_bytes: u64,
    /// Messages dropped at the pending-queue bound (must stay 0).
    pub pending_overflow: u64,
    pub blocked: u64,
    pub send_errors: u64,
    pub discarded_on_restart: u64,
    /// Halves failed toward their requesters because the twin restarted.
    pub flows_failed_on_restart: u64,
    pub datagrams_out: u64,
    pub datagrams_in: u64,
    /// WAN datagrams whose addresses the ACL refused.
    pub datagram_acl_drops: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct WanCounters {
    pub packets_sent: u64,
    pub packets_received: u64,
    pub packets_lost: u64,
    pub packets_retransmitted: u64,
    pub packets_accepted: u64,
    pub auth_failures: u64,
    pub replays_dropped: u64,
    pub malformed: u64,
    pub stale_generation: u64,
    pub no_session: u64,
    pub role_conflicts: u64,
    pub protocol_violations: u64,
    pub peer_restarts: u64,
    pub events_dropped: u64,
    pub messages_queued: u64,
    pub messages_delivered: u64,
    pub messages_discarded: u64,
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub datagrams_dropped: u64,
    pub send_buffered_bytes: u64,
    pub recv_buffered_bytes: u64,
    /// Datagrams from no path's remote on a multi-path socket.
    pub unknown_source: u64,
    /// Datagrams from another address on a single-path socket (handed to the
    /// transport, which authenticates them).
    pub foreign_source: u64,
    pub socket_send_errors: u64,
    pub socket_recv_errors: u64,
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
    /// duplicates from the requester.
    pub retransmissions: u64,
    /// Ingress: packets held in the deep buffer; egress: held for injection.
    pub buffered: u64,
    /// Every engine counter of the half (`IngressStats` / `EgressStats`),
    /// for `soya status --json` and debugging.
    pub detail: String,
}
