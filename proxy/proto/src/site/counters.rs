//! The site's counters: plain data, summed over shards and exported by the
//! gateway (`gateway::snapshot`, `/metrics`).

use serde::{Deserialize, Serialize};

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
    /// Packets for the gateway that the kernel dropped before it read them
    /// (tun: the device's queue was full; udp: the socket's receive
    /// buffer). Each one is a loss the requester must recover from.
    #[serde(default)]
    pub rx_kernel_drops: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// udp backend: destination host not learned yet.
    pub tx_no_peer: u64,
    /// Destination not a local host (never expected from the engine).
    pub tx_acl: u64,
    pub tx_errors: u64,
    /// Requests held by an egress half and queued to be sent, released
    /// before their turn (the half failed): not sent, as a failed half
    /// sends nothing more.
    #[serde(default)]
    pub tx_released: u64,
    /// udp backend: hosts learned, and datagrams refused because their host
    /// is bound to another, still active UDP address.
    pub lab_hosts: u64,
    pub lab_host_conflicts: u64,
    /// Read for another shard and queued to it / dropped because its queue
    /// was full; received from other shards.
    #[serde(default)]
    pub handoff_out: u64,
    #[serde(default)]
    pub handoff_dropped: u64,
    #[serde(default)]
    pub handoff_in: u64,
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
    /// Resent READs not injected toward the responder: their answer was
    /// still waiting for the WAN (`site::replays`).
    #[serde(default)]
    pub read_replays_suppressed: u64,
    /// Waiting READ responses dropped: the requester asked again from an
    /// earlier PSN, so it would have discarded them (a replay follows).
    #[serde(default)]
    pub stale_read_responses_dropped: u64,
    pub blocked: u64,
    pub send_errors: u64,
    pub discarded_on_restart: u64,
    /// Halves failed toward their requesters because the twin restarted
    /// (or shut down): those it could not resume (`qp::resume`).
    pub flows_failed_on_restart: u64,
    /// Halves resumed toward a twin that restarted: what it had not
    /// delivered was sent to its new incarnation again (`qp::resume`).
    #[serde(default)]
    pub flows_resumed_on_restart: u64,
    /// CLOSEs "restart" from the twin: it drained and restarted, and every
    /// flow was kept for its next incarnation (issue 35).
    #[serde(default)]
    pub twin_restarts_clean: u64,
    /// The pause of those planned restarts, seen from here: from the
    /// CLOSE "restart" to the next incarnation's session (microseconds;
    /// the last, the longest and the sum, over `twin_returns` returns).
    #[serde(default)]
    pub twin_returns: u64,
    #[serde(default)]
    pub restart_pause_last_us: u64,
    #[serde(default)]
    pub restart_pause_max_us: u64,
    #[serde(default)]
    pub restart_pause_sum_us: u64,
    pub datagrams_out: u64,
    pub datagrams_in: u64,
    /// WAN datagrams whose addresses the ACL refused.
    pub datagram_acl_drops: u64,
    /// Times the twin was declared lost (every path down for
    /// `wan.twin_timeout`).
    #[serde(default)]
    pub twin_lost: u64,
    /// Halves failed toward their requesters because the twin was lost.
    #[serde(default)]
    pub flows_failed_twin_lost: u64,
    /// Requests from the DC side refused (answered with an error NAK)
    /// while the twin was lost.
    #[serde(default)]
    pub rx_refused_twin_lost: u64,
}
