//! What a [`WanConnection`](super::WanConnection) is built from: its paths, the
//! congestion controller, the protocol tunables and the key.

use super::*;

/// One WAN path to the twin. Path `i` here must be path `i` at the twin.
#[derive(Clone, Debug)]
pub struct PathConfig {
    pub name: String,
    /// Provisioned rate: FixedRate paces at it; Bbr never exceeds it.
    pub rate_bps: Option<u64>,
    /// Scheduler preference (see `scheduler`); 0 = backup path.
    pub weight: u32,
    /// Expected RTT, used until measured.
    pub rtt_hint: Option<Duration>,
}

impl PathConfig {
    pub fn new(name: impl Into<String>) -> PathConfig {
        PathConfig {
            name: name.into(),
            rate_bps: None,
            weight: 1,
            rtt_hint: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CcKind {
    FixedRate,
    Bbr,
}

/// Protocol timers and resource bounds; the defaults suit sites a few
/// milliseconds apart.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// Longest the receiver delays an ACK (also part of the PTO).
    pub max_ack_delay: Duration,
    /// A path is Down after `max(3 × PTO, down_floor)` without an ACK.
    pub down_floor: Duration,
    /// Keepalive PING on an idle path every `max(4 × srtt, keepalive_min)`.
    pub keepalive_min: Duration,
    /// PING period on Down (and not yet Up) paths.
    pub probe_interval: Duration,
    /// First HELLO retry period (doubles up to 1 s while unanswered).
    pub hello_interval: Duration,
    /// Per flow: bytes `send` may queue beyond the peer's credit.
    pub flow_queue_bytes: u64,
    /// All flows: bytes held for sending or retransmission.
    pub max_buffered_bytes: u64,
    pub max_flows: usize,
    /// Pacing burst after idle, in packets: the least a late sender may
    /// catch up at once.
    pub pacing_burst_packets: u64,
    /// ... or this much of the path's rate, if more (at most 64 packets).
    /// A sender on a shared host wakes late by scheduling delays of up to a
    /// millisecond; a pacer that forgives only a few packets loses the rest
    /// of that time for good, and a 1 Gb/s path paced from a busy 2-core
    /// machine carried 0.6 Gb/s. (quinn lets 2 ms of rate go in a burst.)
    pub pacing_burst_time: Duration,
    /// How early `poll_transmit` may hand out a paced packet.
    pub pacing_lookahead: Duration,
    /// RTT assumed for paths without `rtt_hint` until measured.
    pub initial_rtt: Duration,
    /// A flow with nothing queued or unacknowledged for this long is closed
    /// (a FIN) and its state dropped on both sides; the half's next message
    /// opens a new flow (`flow`: why that keeps order). Clamped to
    /// [[`FLOW_IDLE_MIN`], [`FLOW_IDLE_MAX`]].
    pub flow_idle_timeout: Duration,
    /// Packets one sending key seals before it is replaced (a key update:
    /// `keyphase`); never more than half the AEAD's confidentiality limit
    /// for `max_datagram` (docs/wan-protocol.md § Key updates).
    pub key_update_packets: u64,
    /// Age of a sending key before it is replaced, however few packets it
    /// sealed.
    pub key_update_interval: Duration,
    /// Identity mode: how often the client runs the handshake again inside
    /// the session (a fresh ephemeral DH: `session::rekey`);
    /// `Duration::ZERO`: never. PSK-only mode has no DH to run again.
    pub rekey_interval: Duration,
}

/// Default [`Tuning::flow_idle_timeout`]. Closing costs a FIN and its ACK,
/// and reopening a flow nothing more than a table entry, so the timeout
/// need not wait for long lulls; it should exceed the gaps within a
/// transfer (milliseconds) so that busy halves do not churn, and bound the
/// flows a gateway holds: `max_flows` (65 536) / 5 s lets ~13 000 new QP
/// halves a second come and go, beyond any RDMA-CM connection rate seen.
pub const FLOW_IDLE_DEFAULT: Duration = Duration::from_secs(5);
/// Shortest idle timeout: below it a flow would close between the bursts of
/// one transfer (correct, but a FIN per burst).
pub const FLOW_IDLE_MIN: Duration = Duration::from_millis(1);
/// Longest idle timeout: beyond it a gateway with QP churn holds flows of
/// long-gone QPs for so long that `max_flows` becomes reachable again.
pub const FLOW_IDLE_MAX: Duration = Duration::from_secs(3600);

/// Most packets a late sender may catch up at once (`Tuning::pacing_burst_time`).
pub const PACING_BURST_CAP_PACKETS: u64 = 64;

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            max_ack_delay: Duration::from_micros(250),
            down_floor: Duration::from_millis(30),
            keepalive_min: Duration::from_millis(5),
            probe_interval: Duration::from_millis(25),
            hello_interval: Duration::from_millis(10),
            flow_queue_bytes: 1 << 20,
            max_buffered_bytes: 256 << 20,
            max_flows: 65_536,
            pacing_burst_packets: 4,
            pacing_burst_time: Duration::from_millis(1),
            pacing_lookahead: Duration::from_micros(20),
            initial_rtt: Duration::from_millis(50),
            flow_idle_timeout: FLOW_IDLE_DEFAULT,
            key_update_packets: KEY_UPDATE_PACKETS,
            key_update_interval: KEY_UPDATE_INTERVAL,
            rekey_interval: REKEY_INTERVAL,
        }
    }
}

#[derive(Clone, Debug)]
pub struct WanConfig {
    pub paths: Vec<PathConfig>,
    /// Pre-shared 32-byte key. `None` is the insecure lab mode: no
    /// encryption, a CRC instead of a MAC, refused by keyed peers.
    pub key: Option<[u8; 32]>,
    /// This side's static X25519 key and the twin's public key: sessions
    /// are set up by the Noise IKpsk2 handshake (`handshake`), with `key`,
    /// if any, mixed in as its PSK. `None`: the PSK exchange (or lab mode).
    pub identity: Option<Identity>,
    /// Which packet AEAD this side accepts (ignored without a key); the
    /// twins agree on one in the HELLO exchange (see `cipher`).
    pub cipher: CipherPolicy,
    pub cc: CcKind,
    /// Largest UDP payload sent (default [`DEFAULT_MAX_DATAGRAM`]); larger
    /// messages are fragmented. Use 1452 on 1500-MTU paths.
    pub max_datagram: usize,
    /// Per-flow receive credit: bytes the peer may send beyond what the
    /// application consumed. At least a flow's share of the BDP.
    pub flow_window_bytes: u64,
    /// Exactly one of the twins is the client (key direction labels).
    pub is_client: bool,
    pub tuning: Tuning,
    /// Bound into the HELLO MAC (the CRC in lab mode): twins whose contexts
    /// differ never authenticate each other's HELLOs. Empty (the default)
    /// leaves the HELLO exactly as without it. The gateway puts
    /// `shard i/N` here when it runs several shards (docs/architecture.md).
    pub hello_context: Vec<u8>,
}

impl WanConfig {
    pub fn new(paths: Vec<PathConfig>, key: Option<[u8; 32]>, is_client: bool) -> WanConfig {
        WanConfig {
            paths,
            key,
            identity: None,
            cipher: CipherPolicy::Auto,
            cc: CcKind::Bbr,
            max_datagram: DEFAULT_MAX_DATAGRAM,
            flow_window_bytes: 8 << 20,
            is_client,
            tuning: Tuning::default(),
            hello_context: Vec::new(),
        }
    }
}
