//! The WAN transport between twin gateways (sans-IO).
//!
//! [`WanConnection`] carries [`TwinMsg`]s reliably and in order per *flow*
//! (one QP half each: flows never block each other), plus unreliable
//! datagrams, over one or more UDP paths to the twin gateway. It never reads
//! a clock or touches a socket: the I/O layer feeds it received datagrams
//! and timer expiries with the current [`Time`], and sends what
//! [`WanConnection::poll_transmit`] produces no earlier than `release_at`.
//!
//! Wire format and security model: `docs/wan-protocol.md`. Module map:
//!
//! - `packet`: header and frame codec; `msg`: `TwinMsg` codec;
//! - `cipher`: the packet AEADs (AES-256-GCM, ChaCha20-Poly1305) and how
//!   the twins agree on one;
//! - `crypto`, `session`: PSK key schedule and the HELLO exchange;
//!   `replay`: per-path anti-replay window;
//! - `path`: RTT, pacing, liveness; `recovery`: loss detection per path;
//!   `ack`: what to acknowledge; [`cc`]: congestion controllers;
//! - `scheduler`: which path carries the next packet;
//! - `flow`: per-flow queues, reassembly, reorder buffers and credit
//!   (`idhash`: the hasher of its send-side table);
//!   `dgram`: unreliable datagrams.

mod ack;
pub mod cc;
mod cipher;
mod crypto;
mod dgram;
mod flow;
mod idhash;
pub mod msg;
pub mod packet;
mod path;
mod reconfig;
mod recovery;
mod replay;
mod rtt;
mod scheduler;
mod session;
pub mod testing;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::Duration;

use thiserror::Error;

use crate::buffer::{PacketPool, PoolStats};
use crate::qp::twin::TwinMsg;
use crate::time::Time;

use cc::{AckSample, Bbr, Controller, FixedRate};
use dgram::{DgramRecv, DgramSend};
use flow::{DataOutcome, PushError, RecvFlows, SendFlows};
use packet::{
    check_frames, Frame, Header, Hello, PacketKind, Writer, DATA_OVERHEAD, HEADER_LEN, HELLO_LEN,
    TAG_LEN,
};
use path::{tx_time, Path};
use recovery::{FrameLists, SentFrame, SentPacket};
use session::{HelloVerdict, Session};

pub use cipher::{aes_hardware, Cipher, CipherOffer, CipherPolicy};
pub use packet::VERSION as PROTOCOL_VERSION;
pub use path::{PathCounters, PathState};
pub use reconfig::PathChange;

/// Default largest UDP payload: a 9000-byte jumbo MTU less IPv6 and UDP
/// headers. Every path must then carry jumbo frames end to end.
pub const DEFAULT_MAX_DATAGRAM: usize = 8952;
/// Smallest `max_datagram` accepted (smaller values are raised to it).
pub const MIN_MAX_DATAGRAM: usize = 1200;
/// Largest `max_datagram` accepted (larger values are lowered to it).
pub const MAX_MAX_DATAGRAM: usize = 65_000;
/// Room kept in every data packet for an ACK, a PING and two credits, so
/// that a full-size fragment always fits beside them.
const CONTROL_RESERVE: usize = 64 + 1 + 32;
/// Cap on queued non-message events (path changes, datagrams): when the
/// application does not poll, the newest are dropped and counted.
const MAX_OTHER_EVENTS: usize = 4096;

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
        }
    }
}

#[derive(Clone, Debug)]
pub struct WanConfig {
    pub paths: Vec<PathConfig>,
    /// Pre-shared 32-byte key. `None` is the insecure lab mode: no
    /// encryption, a CRC instead of a MAC, refused by keyed peers.
    pub key: Option<[u8; 32]>,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum SendError {
    /// The peer's credit for this flow is used up and the local queue is
    /// full: hold back until messages drain (poll, transmit, retry).
    #[error("flow blocked: peer credit exhausted and local flow queue full")]
    FlowBlocked,
    #[error("send buffer full")]
    BufferFull,
    #[error("too many flows")]
    TooManyFlows,
    #[error("message too large")]
    MessageTooLarge,
    #[error("connection closed")]
    Closed,
}

/// A datagram to send: `buf[..len]` on path `path`, not before `release_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub path: usize,
    pub len: usize,
    pub release_at: Time,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// First session with the twin established.
    Connected {
        peer_generation: u64,
    },
    /// In order per flow, exactly once.
    Message(TwinMsg),
    Datagram(Vec<u8>),
    PathUp(usize),
    PathDown(usize),
    /// The twin restarted: everything queued for or received from its old
    /// generation was discarded; flows start afresh.
    PeerRestarted {
        old_generation: u64,
        new_generation: u64,
    },
    /// The twin (generation `peer_generation`) offers no cipher we accept:
    /// no session until one of the two is reconfigured. Reported once per
    /// twin generation; its HELLOs are refused and counted meanwhile.
    CipherMismatch {
        peer_generation: u64,
        ours: CipherOffer,
        theirs: CipherOffer,
    },
    Closed,
}

/// Snapshot of one path.
#[derive(Clone, Debug, PartialEq)]
pub struct PathStats {
    pub name: String,
    pub state: PathState,
    pub srtt: Duration,
    pub min_rtt: Duration,
    pub rttvar: Duration,
    /// Recent fraction of packets lost (exponentially weighted).
    pub loss_rate: f64,
    pub cwnd: u64,
    pub pacing_rate_bps: u64,
    pub bytes_in_flight: u64,
    pub counters: PathCounters,
}

/// Snapshot of the connection.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnStats {
    pub generation: u64,
    pub peer_generation: Option<u64>,
    /// Largest datagram the twin says it sends (its `max_datagram`): a
    /// mismatch with ours hints at a path MTU misconfiguration.
    pub peer_max_datagram: Option<u16>,
    pub connected: bool,
    /// The session's packet AEAD (`None`: no session, or lab mode).
    pub cipher: Option<Cipher>,
    /// Flows this side sends on now (live and closing).
    pub flows: usize,
    /// Flows this side closed and forgot (FIN acknowledged).
    pub flows_retired: u64,
    /// Flows of the peer open here (receiving).
    pub recv_flows: usize,
    /// Flows of the peer closed here (FIN delivered).
    pub recv_flows_closed: u64,
    /// Ranges of closed peer flow ids remembered (bounded: `flow`).
    pub recv_closed_ranges: usize,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub packets_lost: u64,
    pub packets_retransmitted: u64,
    /// Protected packets that authenticated and parsed.
    pub packets_accepted: u64,
    pub hellos_accepted: u64,
    pub messages_queued: u64,
    pub messages_delivered: u64,
    pub bytes_delivered: u64,
    /// Messages dropped because the peer restarted before they were acked.
    pub messages_discarded: u64,
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub datagrams_dropped: u64,
    pub auth_failures: u64,
    pub replays_dropped: u64,
    pub malformed: u64,
    /// Protected packets of another generation than the peer's current one.
    pub stale_generation: u64,
    /// Protected packets before any session existed.
    pub no_session: u64,
    pub role_conflicts: u64,
    /// HELLOs refused because the twin offers no cipher we accept.
    pub cipher_mismatches: u64,
    /// Frames that broke the protocol after authenticating (credit overrun…).
    pub protocol_violations: u64,
    pub peer_restarts: u64,
    pub events_dropped: u64,
    /// Bytes held for sending or retransmission.
    pub send_buffered: u64,
    /// Bytes in receive reorder buffers.
    pub recv_buffered: u64,
    pub paths: Vec<PathStats>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    Closing,
    Closed,
}

/// An event, or a message whose credit is returned when the application
/// takes it (so that credit tracks consumption, not arrival).
enum Queued {
    Msg { flow: u64, len: u64, msg: TwinMsg },
    Other(Event),
}

#[derive(Default)]
struct Counters {
    packets_accepted: u64,
    hellos_accepted: u64,
    messages_delivered: u64,
    bytes_delivered: u64,
    datagrams_received: u64,
    auth_failures: u64,
    replays_dropped: u64,
    malformed: u64,
    stale_generation: u64,
    no_session: u64,
    role_conflicts: u64,
    cipher_mismatches: u64,
    protocol_violations: u64,
    peer_restarts: u64,
    events_dropped: u64,
}

pub struct WanConnection {
    tuning: Tuning,
    max_datagram: usize,
    session: Session,
    paths: Vec<Path>,
    send: SendFlows,
    recv: RecvFlows,
    dsend: DgramSend,
    drecv: DgramRecv,
    events: VecDeque<Queued>,
    other_events: usize,
    state: State,
    close_pending: Vec<bool>,
    hello_next: Time,
    hello_interval: Duration,
    rr: usize,
    scratch: Vec<u8>,
    /// Buffers of sent messages the twin acknowledged, reused for the
    /// packets of received messages (see `buffer::pool`).
    pool: PacketPool,
    /// Frame lists of sent packets, reused (see `recovery::FrameLists`).
    frame_lists: FrameLists,
    /// Lent to `Recovery::on_ack` for the packets each ACK acknowledges.
    acked: Vec<SentPacket>,
    counters: Counters,
    /// Latest `now` seen (for `poll_timeout`, which gets none).
    last_now: Time,
    /// How new paths (a reload) are paced (`reconfig`).
    cc_kind: CcKind,
}

/// Most paths a connection has: the header's path number is one byte.
pub const MAX_PATHS: usize = u8::MAX as usize + 1;

/// A path as `pc` asks, fresh: no round trip seen, packet numbers from 0.
fn new_path(pc: &PathConfig, kind: CcKind, mss: u64, tuning: &Tuning, now: Time) -> Path {
    let rtt = pc.rtt_hint.unwrap_or(tuning.initial_rtt);
    let mut p = Path::new(
        pc.name.clone(),
        pc.weight,
        rtt,
        new_controller(pc.rate_bps, kind, mss, rtt, now),
        now,
    );
    p.rate_bps = pc.rate_bps;
    p.burst_bytes = tuning.pacing_burst_packets * mss;
    p.burst_time = tuning.pacing_burst_time;
    p.burst_cap = PACING_BURST_CAP_PACKETS * mss;
    p
}

fn new_controller(
    rate_bps: Option<u64>,
    kind: CcKind,
    mss: u64,
    rtt: Duration,
    now: Time,
) -> Box<dyn Controller> {
    match kind {
        CcKind::FixedRate => Box::new(FixedRate::new(
            rate_bps.unwrap_or(cc::DEFAULT_RATE_BPS),
            mss,
            rtt,
            now,
        )),
        CcKind::Bbr => Box::new(Bbr::new(mss, rate_bps, rtt, now)),
    }
}

impl WanConnection {
    /// `session_nonce` must be fresh randomness for every start of the
    /// gateway: it is this side's generation and salts the session keys.
    pub fn new(cfg: WanConfig, now: Time, session_nonce: u64) -> WanConnection {
        let max_datagram = cfg.max_datagram.clamp(MIN_MAX_DATAGRAM, MAX_MAX_DATAGRAM);
        let mss = max_datagram as u64;
        let tuning = cfg.tuning.clone();
        let paths: Vec<Path> = cfg
            .paths
            .iter()
            .take(MAX_PATHS)
            .map(|pc| new_path(pc, cfg.cc, mss, &tuning, now))
            .collect();
        let frag_size = max_datagram - HEADER_LEN - TAG_LEN - DATA_OVERHEAD - CONTROL_RESERVE;
        let window = cfg.flow_window_bytes.max(2 * flow::MAX_MESSAGE as u64);
        let n = paths.len();
        let mut c = WanConnection {
            send: SendFlows::new(
                frag_size,
                window,
                tuning.flow_queue_bytes,
                tuning.max_buffered_bytes,
                tuning.max_flows,
                tuning.flow_idle_timeout.clamp(FLOW_IDLE_MIN, FLOW_IDLE_MAX),
            ),
            recv: RecvFlows::new(window, tuning.max_flows),
            session: Session::new(
                session_nonce,
                cfg.is_client,
                cfg.key,
                CipherOffer::new(cfg.cipher, aes_hardware()),
                window,
                max_datagram as u16,
            ),
            max_datagram,
            paths,
            dsend: DgramSend::default(),
            drecv: DgramRecv::default(),
            events: VecDeque::new(),
            other_events: 0,
            state: State::Open,
            close_pending: vec![false; n],
            hello_next: now,
            hello_interval: tuning.hello_interval,
            rr: 0,
            scratch: Vec::with_capacity(max_datagram),
            pool: PacketPool::default(),
            frame_lists: FrameLists::default(),
            acked: Vec::new(),
            counters: Counters::default(),
            last_now: now,
            cc_kind: cfg.cc,
            tuning,
        };
        if !cfg.hello_context.is_empty() {
            c.session.set_hello_context(&cfg.hello_context);
        }
        c
    }

    /// This side's session generation.
    pub fn generation(&self) -> u64 {
        self.session.generation()
    }

    /// A session with the twin exists.
    pub fn is_connected(&self) -> bool {
        self.session.peer.is_some() && self.state == State::Open
    }

    /// Nothing queued, unacknowledged or undelivered: a `close` now loses
    /// nothing this side knows of.
    pub fn is_drained(&self) -> bool {
        self.send.buffered == 0 && self.events.is_empty() && !self.dsend.has_pending()
    }

    /// Largest encoded message `send` accepts.
    pub fn max_message(&self) -> usize {
        self.send.max_message()
    }

    /// Queues a message for the twin on the flow of `flow` (a key: the
    /// wire id is the transport's, fresh after the flow retired).
    pub fn send(&mut self, _now: Time, flow: u64, msg: TwinMsg) -> Result<(), SendError> {
        if self.state != State::Open {
            return Err(SendError::Closed);
        }
        self.send
            .push(flow, msg::encode_owned(msg))
            .map_err(|e| match e {
                PushError::TooLarge => SendError::MessageTooLarge,
                PushError::FlowBlocked => SendError::FlowBlocked,
                PushError::BufferFull => SendError::BufferFull,
                PushError::TooManyFlows => SendError::TooManyFlows,
            })
    }

    /// Encoded bytes `send` would accept on `flow` right now (0 when closed,
    /// blocked or out of flows): lets a caller apply backpressure before
    /// building a message. A message costs `wire_len(msg)` bytes.
    pub fn send_room(&self, flow: u64) -> u64 {
        if self.state != State::Open {
            return 0;
        }
        self.send.room(flow)
    }

    /// Returns a packet buffer to the transport's pool (a received
    /// message's packet, once the application is done with it).
    pub fn recycle(&mut self, packet: Vec<u8>) {
        self.pool.put(packet);
    }

    /// The transport's pool of packet buffers: acknowledged messages' go
    /// in, received messages' come out.
    pub fn pool_mut(&mut self) -> &mut PacketPool {
        &mut self.pool
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats
    }

    /// Bytes a message occupies against flow credit and buffers.
    pub fn wire_len(msg: &TwinMsg) -> u64 {
        msg::encoded_len(msg) as u64
    }

    /// Queues an unreliable datagram (sent once, may be lost; dropped and
    /// counted when the bounded queue overflows or it exceeds 64 KiB).
    pub fn send_datagram(&mut self, _now: Time, packet: Vec<u8>) {
        if self.state == State::Open {
            self.dsend.push(packet);
        }
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        match self.events.pop_front()? {
            Queued::Msg { flow, len, msg } => {
                self.recv.on_consumed(flow, len);
                self.counters.messages_delivered += 1;
                self.counters.bytes_delivered += len;
                Some(Event::Message(msg))
            }
            Queued::Other(e) => {
                self.other_events -= 1;
                Some(e)
            }
        }
    }

    fn push_event(&mut self, e: Event) {
        // Closed and session changes are never dropped; path events and
        // datagrams are, past the bound.
        let droppable = matches!(
            e,
            Event::Datagram(_) | Event::PathUp(_) | Event::PathDown(_)
        );
        if droppable && self.other_events >= MAX_OTHER_EVENTS {
            self.counters.events_dropped += 1;
            return;
        }
        self.other_events += 1;
        self.events.push_back(Queued::Other(e));
    }

    /// Starts closing: a CLOSE goes out on every path, then `Event::Closed`.
    /// Unsent and unacknowledged data is abandoned (see [`Self::is_drained`]).
    pub fn close(&mut self, _now: Time) {
        if self.state != State::Open {
            return;
        }
        if self.session.peer.is_none() || self.paths.is_empty() {
            self.state = State::Closed;
            self.push_event(Event::Closed);
            return;
        }
        self.state = State::Closing;
        for (c, p) in self.close_pending.iter_mut().zip(&self.paths) {
            *c = p.state != PathState::Retired;
        }
    }

    // ----- receiving -----

    /// A datagram arrived on `path`. Anything that fails to parse,
    /// authenticate or pass the replay window is dropped and counted.
    ///
    /// Copies the datagram into a scratch buffer to decrypt it: an I/O
    /// layer that owns its receive buffer should call
    /// [`Self::handle_datagram_in_place`] instead.
    pub fn handle_datagram(&mut self, now: Time, path: usize, bytes: &[u8]) {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        crate::copies::note(bytes.len());
        buf.extend_from_slice(bytes);
        self.handle_datagram_in_place(now, path, &mut buf);
        self.scratch = buf;
    }

    /// [`Self::handle_datagram`] without the copy: a protected packet is
    /// decrypted where it lies, so `bytes` is left holding plaintext (or
    /// garbage, if it failed to authenticate).
    pub fn handle_datagram_in_place(&mut self, now: Time, path: usize, bytes: &mut [u8]) {
        self.last_now = self.last_now.max(now);
        if self.state == State::Closed {
            return;
        }
        let Some(p) = self.paths.get_mut(path) else {
            self.counters.malformed += 1;
            return;
        };
        if p.state == PathState::Retired {
            // Removed by a reload: the twin sends on it until it reloads
            // too; what it sent is retransmitted on the other paths.
            p.counters.retired_drops += 1;
            return;
        }
        let hdr = match Header::decode(bytes) {
            Ok(h) if usize::from(h.path) == path => h,
            other => {
                tracing::trace!(path, cause = ?other.err(), "malformed WAN datagram");
                p.counters.malformed += 1;
                self.counters.malformed += 1;
                return;
            }
        };
        if hdr.insecure != self.session.insecure() {
            // A lab-mode peer talking to a keyed one (or the reverse).
            p.counters.auth_failures += 1;
            self.counters.auth_failures += 1;
            return;
        }
        match hdr.kind {
            PacketKind::Hello => self.handle_hello(now, path, &hdr, bytes),
            PacketKind::Protected => self.handle_protected(now, path, &hdr, bytes),
        }
    }

    fn handle_hello(&mut self, now: Time, path: usize, hdr: &Header, bytes: &[u8]) {
        if !self.session.verify_hello(bytes) {
            self.paths[path].counters.auth_failures += 1;
            self.counters.auth_failures += 1;
            return;
        }
        let hello = match Hello::decode(&bytes[HEADER_LEN..HELLO_LEN - TAG_LEN]) {
            Ok(h) => h,
            Err(e) => {
                tracing::trace!(path, cause = %e, "malformed HELLO");
                self.paths[path].counters.malformed += 1;
                self.counters.malformed += 1;
                return;
            }
        };
        self.counters.hellos_accepted += 1;
        match self.session.on_hello(hdr, &hello) {
            HelloVerdict::RoleConflict => self.counters.role_conflicts += 1,
            HelloVerdict::Retired => self.counters.replays_dropped += 1,
            HelloVerdict::Known { needs_hello } => {
                // The peer has not seen a protected packet from us yet:
                // send one, and our HELLO if it has not committed. (Never
                // answer a committed peer's HELLO with a HELLO: two
                // committed sides would bounce HELLOs forever.)
                self.paths[path].ping_due = true;
                if needs_hello {
                    self.reply_hello(now, path);
                }
            }
            HelloVerdict::Candidate => {
                self.hello_interval = self.tuning.hello_interval;
                self.hello_next = self.hello_next.min(now + self.hello_interval);
                self.reply_hello(now, path);
            }
            HelloVerdict::Committed { previous } => self.on_commit(now, path, previous),
            HelloVerdict::CipherMismatch { theirs, first } => {
                self.counters.cipher_mismatches += 1;
                if first {
                    let ours = self.session.offer;
                    self.push_event(Event::CipherMismatch {
                        peer_generation: hdr.generation,
                        ours,
                        theirs,
                    });
                }
            }
        }
    }

    /// Answers a HELLO at once, at most once per millisecond per path.
    fn reply_hello(&mut self, now: Time, path: usize) {
        let p = &mut self.paths[path];
        if p.last_hello_tx
            .is_none_or(|t| now.since(t) >= Duration::from_millis(1))
        {
            p.hello_due = true;
        }
    }

    fn on_commit(&mut self, now: Time, path: usize, previous: Option<u64>) {
        let Some(peer) = self.session.peer.as_ref() else {
            return;
        };
        let (generation, window) = (peer.generation, peer.flow_window);
        match previous {
            Some(old) => {
                // Everything in flight belonged to the old peer's state.
                self.send.reset();
                self.recv.reset();
                self.drecv.clear();
                for p in &mut self.paths {
                    p.recovery.reset();
                    p.acks.reset();
                    p.replay = Default::default();
                }
                // The twin restarted with its configuration's paths: slots
                // removed by a reload are forgotten for good.
                self.drop_trailing_retired();
                self.counters.peer_restarts += 1;
                self.push_event(Event::PeerRestarted {
                    old_generation: old,
                    new_generation: generation,
                });
            }
            None => self.push_event(Event::Connected {
                peer_generation: generation,
            }),
        }
        self.send
            .set_initial_credit(window.max(2 * flow::MAX_MESSAGE as u64));
        for p in self
            .paths
            .iter_mut()
            .filter(|p| p.state != PathState::Retired)
        {
            p.ping_due = true;
            p.last_ack_rx = now;
        }
        self.hello_interval = self.tuning.hello_interval;
        self.hello_next = now + self.hello_interval;
        self.reply_hello(now, path);
    }

    fn handle_protected(&mut self, now: Time, path: usize, hdr: &Header, bytes: &mut [u8]) {
        let Some(peer) = self.session.peer.as_ref() else {
            self.counters.no_session += 1;
            return;
        };
        if hdr.generation != peer.generation {
            self.counters.stale_generation += 1;
            return;
        }
        let p = &mut self.paths[path];
        if hdr.client == self.session.is_client || hdr.conn_id != peer.keys.conn_id {
            p.counters.auth_failures += 1;
            self.counters.auth_failures += 1;
            return;
        }
        if bytes.len() < HEADER_LEN + TAG_LEN {
            p.counters.malformed += 1;
            self.counters.malformed += 1;
            return;
        }
        if p.replay.check(hdr.pn) != replay::Verdict::Fresh {
            p.counters.replays_dropped += 1;
            self.counters.replays_dropped += 1;
            return;
        }
        let len = bytes.len();
        let (head, rest) = bytes.split_at_mut(HEADER_LEN);
        let (plain, tag) = rest.split_at_mut(len - HEADER_LEN - TAG_LEN);
        // Decrypted in place: the payload is never copied before parsing.
        if !peer.keys.open(hdr.path, hdr.pn, head, plain, tag) {
            p.counters.auth_failures += 1;
            self.counters.auth_failures += 1;
            return;
        }
        let plain: &[u8] = plain;
        // Authentic from here on: only now may the packet move any state.
        p.replay.accept(hdr.pn);
        match check_frames(plain) {
            Ok((frames, eliciting)) => {
                let p = &mut self.paths[path];
                p.counters.packets_received += 1;
                p.counters.bytes_received += len as u64;
                self.counters.packets_accepted += 1;
                if !self.session.confirmed {
                    self.session.confirmed = true;
                    // Our packets may have been dropped before the peer
                    // committed: probe every path that is not Up yet.
                    for q in &mut self.paths {
                        if q.state != PathState::Up && q.state != PathState::Retired {
                            q.ping_due = true;
                        }
                    }
                }
                for f in frames {
                    self.on_frame(now, f);
                }
                let max_delay = self.tuning.max_ack_delay;
                self.paths[path]
                    .acks
                    .on_packet(hdr.pn, now, eliciting, max_delay);
            }
            Err(e) => {
                // Authentic but unparsable: a peer bug. Nothing was applied.
                tracing::debug!(path, cause = %e, "authentic WAN packet with malformed frames");
                self.paths[path].counters.malformed += 1;
                self.counters.malformed += 1;
            }
        }
    }

    fn on_frame(&mut self, now: Time, f: Frame<'_>) {
        match f {
            Frame::Ping => {}
            Frame::Ack(a) => self.on_ack_frame(now, &a),
            Frame::Data(d) => {
                let (events, counters, pool) =
                    (&mut self.events, &mut self.counters, &mut self.pool);
                // (flow, len) of messages that did not decode (rare).
                let mut undecodable: Vec<(u64, u64)> = Vec::new();
                // Decoding copies the packet out of the datagram into the
                // message (a pooled buffer): the one copy of the payload on
                // the receiving side.
                let mut deliver = |flow, bytes: &[u8]| {
                    let len = bytes.len() as u64;
                    match msg::decode_with(bytes, |b| pool.copy_of(b)) {
                        Ok(msg) => events.push_back(Queued::Msg { flow, len, msg }),
                        Err(e) => {
                            tracing::debug!(flow, cause = %e, "undecodable twin message");
                            counters.malformed += 1;
                            undecodable.push((flow, len));
                        }
                    }
                };
                if self.recv.on_data(&d, &mut deliver) == DataOutcome::Violation {
                    self.counters.protocol_violations += 1;
                }
                for (flow, len) in undecodable {
                    // Keep the flow's credit flowing past it.
                    self.recv.on_consumed(flow, len);
                }
            }
            Frame::Credit { flow, max_offset } => self.send.on_credit(flow, max_offset),
            Frame::Fin { flow, seq } => {
                if self.recv.on_fin(flow, seq) == DataOutcome::Violation {
                    self.counters.protocol_violations += 1;
                }
            }
            Frame::Datagram(d) => {
                if let Some(dg) = self.drecv.on_frame(&d, &mut self.pool) {
                    self.counters.datagrams_received += 1;
                    self.push_event(Event::Datagram(dg));
                }
            }
            Frame::Close { .. } => {
                self.state = State::Closed;
                self.push_event(Event::Closed);
            }
        }
    }

    fn on_ack_frame(&mut self, now: Time, a: &packet::AckFrame<'_>) {
        let i = usize::from(a.path);
        let max_ack_delay = self.tuning.max_ack_delay;
        let Some(p) = self.paths.get_mut(i) else {
            self.counters.protocol_violations += 1;
            return;
        };
        if p.state == PathState::Retired {
            // Its packets were declared lost when it was removed.
            return;
        }
        let acked = std::mem::take(&mut self.acked);
        let Some(mut res) = p.recovery.on_ack(now, a, &mut p.rtt, max_ack_delay, acked) else {
            self.counters.protocol_violations += 1;
            return;
        };
        if !res.acked.is_empty() {
            p.last_ack_rx = now;
            p.pto_count = 0;
            if p.state != PathState::Up {
                p.state = PathState::Up;
                self.push_event(Event::PathUp(i));
            }
        }
        let p = &mut self.paths[i];
        for sp in res.acked.drain(..) {
            p.note_loss_sample(false);
            for f in &sp.frames {
                match *f {
                    SentFrame::Data { flow, seq, frag } => {
                        self.send.on_acked(now, flow, seq, frag, &mut self.pool)
                    }
                    SentFrame::Fin { flow } => self.send.on_fin_acked(flow),
                    SentFrame::Credit { .. } => {}
                }
            }
            self.frame_lists.put(sp.frames);
        }
        self.acked = std::mem::take(&mut res.acked);
        if res.bytes_acked > 0 {
            let sample = AckSample {
                now,
                rtt: res.rtt_sample.unwrap_or(p.rtt.smoothed()),
                srtt: p.rtt.smoothed(),
                min_rtt: p.rtt.min(),
                bytes_acked: res.bytes_acked,
                delivery_rate: res.delivery_rate,
                app_limited: res.app_limited,
                prior_delivered: res.prior_delivered,
                delivered: p.recovery.delivered,
                bytes_in_flight: p.recovery.bytes_in_flight,
            };
            p.cc.on_ack(&sample);
        }
        self.on_lost(now, i, res.lost);
    }

    fn on_lost(&mut self, now: Time, i: usize, lost: Vec<SentPacket>) {
        if lost.is_empty() {
            return;
        }
        let mut bytes = 0;
        for sp in lost {
            let p = &mut self.paths[i];
            p.counters.packets_lost += 1;
            p.counters.bytes_lost += u64::from(sp.size);
            p.note_loss_sample(true);
            bytes += u64::from(sp.size);
            self.requeue_frames(sp);
        }
        let p = &mut self.paths[i];
        p.cc.on_loss(now, bytes, p.recovery.bytes_in_flight);
    }

    /// Queues the data, credits and FIN a packet carried again (it was lost,
    /// or its path removed), and recycles its frame list.
    fn requeue_frames(&mut self, sp: SentPacket) {
        for &f in &sp.frames {
            match f {
                SentFrame::Data { flow, seq, frag } => self.send.on_lost(flow, seq, frag),
                SentFrame::Credit { flow } => self.recv.requeue_credit(flow),
                SentFrame::Fin { flow } => self.send.on_fin_lost(flow),
            }
        }
        self.frame_lists.put(sp.frames);
    }

    /// Bytes of per-flow state in the transport, besides buffers (see
    /// `SendFlows::state_bytes`, `RecvFlows::state_bytes`).
    pub fn flow_state_bytes(&self) -> usize {
        self.send.state_bytes() + self.recv.state_bytes()
    }

    // ----- timers -----

    pub fn poll_timeout(&self) -> Option<Time> {
        if self.state == State::Closed {
            return None;
        }
        let mut t: Option<Time> = None;
        let mut at = |x: Option<Time>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        if self.session.wants_hello() {
            at(Some(self.hello_next));
        }
        if self.session.peer.is_none() {
            return t;
        }
        let d = self.tuning.max_ack_delay;
        for p in self.paths.iter().filter(|p| p.state != PathState::Retired) {
            at(p.recovery.loss_time());
            at(p.pto_deadline(d));
            at(p.down_deadline(d, self.tuning.down_floor));
            at(p.acks.deadline());
            at(self.keepalive_deadline(p));
            if p.state != PathState::Up {
                at(Some(p.next_probe));
            }
        }
        at(self.send.idle_deadline());
        if self.has_data() {
            match self.choose_data_path(self.last_now) {
                scheduler::Choice::Now(_) => at(Some(self.last_now)),
                scheduler::Choice::Wait(t) => at(Some(t)),
                scheduler::Choice::Nothing => {}
            }
        }
        t
    }

    fn keepalive_deadline(&self, p: &Path) -> Option<Time> {
        if p.state != PathState::Up || p.recovery.packets_in_flight > 0 {
            return None;
        }
        let every = (p.rtt.smoothed() * 4).max(self.tuning.keepalive_min);
        Some(
            p.recovery
                .last_sent_time
                .unwrap_or(p.last_ack_rx)
                .max(p.last_ack_rx)
                + every,
        )
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.last_now = self.last_now.max(now);
        if self.state == State::Closed {
            return;
        }
        if self.session.wants_hello() && now >= self.hello_next {
            for p in self
                .paths
                .iter_mut()
                .filter(|p| p.state != PathState::Retired)
            {
                p.hello_due = true;
            }
            self.session.on_hello_round();
            self.hello_next = now + self.hello_interval;
            self.hello_interval = (self.hello_interval * 2).min(Duration::from_secs(1));
        }
        if self.session.peer.is_none() {
            return;
        }
        self.send.close_idle(now);
        let d = self.tuning.max_ack_delay;
        for i in 0..self.paths.len() {
            if self.paths[i].state == PathState::Retired {
                continue;
            }
            if self.paths[i].recovery.loss_time().is_some_and(|t| t <= now) {
                let p = &mut self.paths[i];
                let lost = p.recovery.detect_lost(now, &p.rtt);
                self.on_lost(now, i, lost);
            }
            let p = &self.paths[i];
            if p.down_deadline(d, self.tuning.down_floor)
                .is_some_and(|t| t <= now)
            {
                self.path_down(now, i);
            } else if p.pto_deadline(d).is_some_and(|t| t <= now) {
                let p = &mut self.paths[i];
                p.pto_count += 1;
                p.ping_due = true;
            }
            if self
                .keepalive_deadline(&self.paths[i])
                .is_some_and(|t| t <= now)
            {
                self.paths[i].ping_due = true;
            }
            let probe_interval = self.tuning.probe_interval;
            let p = &mut self.paths[i];
            if p.state != PathState::Up && now >= p.next_probe {
                // Earlier probes will never be acknowledged if the path is
                // dead: forget them so a long outage holds no state.
                if p.state == PathState::Down && self.has_other_up_path(i) {
                    let p = &mut self.paths[i];
                    let lost = p.recovery.drain_all();
                    self.on_lost(now, i, lost);
                }
                let p = &mut self.paths[i];
                p.ping_due = true;
                p.next_probe = now + probe_interval;
            }
        }
    }

    fn has_other_up_path(&self, i: usize) -> bool {
        self.paths
            .iter()
            .enumerate()
            .any(|(k, p)| k != i && p.state == PathState::Up)
    }

    fn path_down(&mut self, now: Time, i: usize) {
        let survivors = self.has_other_up_path(i);
        let p = &mut self.paths[i];
        p.state = PathState::Down;
        p.counters.times_down += 1;
        p.pto_count = 0;
        p.next_probe = now + self.tuning.probe_interval;
        p.cc.on_path_down(now);
        // Its data goes back to the retransmission queue, for the survivors.
        // With none, there is nowhere better to send it: a silent path is
        // more often stalled (a busy relay or host) than cut, and declaring
        // everything in flight lost would resend it all when the ACKs were
        // merely late. Normal loss detection sorts it out once the path
        // answers again.
        if survivors {
            let lost = p.recovery.drain_all();
            self.on_lost(now, i, lost);
        }
        self.push_event(Event::PathDown(i));
    }

    // ----- sending -----

    fn has_data(&self) -> bool {
        self.send.has_pending() || self.dsend.has_pending()
    }

    /// Where the next data packet goes (see `scheduler`).
    fn choose_data_path(&self, now: Time) -> scheduler::Choice {
        let size = self.max_datagram as u64;
        let lookahead = self.tuning.pacing_lookahead;
        let cands = self
            .paths
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state == PathState::Up && p.has_cwnd_room(size))
            .map(|(index, p)| scheduler::Candidate {
                index,
                weight: p.weight,
                release_at: p.pacer.release_at(now),
                ready_at: p.pacer.ready_at(lookahead),
                tx_time: tx_time(size, p.cc.pacing_rate()),
                rate_bps: p.cc.pacing_rate(),
                srtt: p.rtt.smoothed(),
            });
        let backlog = self.send.backlog_bytes() + self.dsend.queued_bytes();
        // This runs for every data packet (and every `poll_timeout`): up to
        // 16 paths (the site configuration's limit) the candidates live on
        // the stack, not in a fresh vector each time.
        const INLINE: usize = 16;
        if self.paths.len() <= INLINE {
            let mut buf = [scheduler::Candidate::NONE; INLINE];
            let mut n = 0;
            for c in cands {
                buf[n] = c;
                n += 1;
            }
            scheduler::choose(now, &buf[..n], backlog)
        } else {
            scheduler::choose(now, &cands.collect::<Vec<_>>(), backlog)
        }
    }

    /// Produces the next datagram to send into `buf`. `buf` must hold
    /// `max_datagram` bytes: with less, only control packets go out (and
    /// `poll_timeout` keeps reporting the waiting data as due). Call until it
    /// returns `None` after every `handle_*` call and timeout.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        self.last_now = self.last_now.max(now);
        if self.state == State::Closed || self.paths.is_empty() {
            return None;
        }
        let n = self.paths.len();
        if self.state == State::Closing {
            return self.transmit_close(now, buf);
        }
        for k in 0..n {
            let i = (self.rr + k) % n;
            if self.paths[i].hello_due {
                self.paths[i].hello_due = false;
                self.paths[i].last_hello_tx = Some(now);
                let len = self.session.write_hello(i as u8, buf);
                if len == 0 {
                    return None;
                }
                self.paths[i].counters.packets_sent += 1;
                self.paths[i].counters.bytes_sent += len as u64;
                self.rr = (i + 1) % n;
                return Some(Transmit {
                    path: i,
                    len,
                    release_at: now,
                });
            }
        }
        self.session.peer.as_ref()?;
        if self.has_data() && buf.len() >= self.max_datagram {
            if let scheduler::Choice::Now(i) = self.choose_data_path(now) {
                return self.build_packet(now, i, true, buf);
            }
        } else {
            // Nothing to send: rate samples taken now underestimate paths.
            for p in &mut self.paths {
                p.recovery.mark_app_limited();
            }
        }
        // Control-only packets: ACKs, PINGs, credits.
        let credit_path = self.recv.has_credit_pending().then(|| self.control_path());
        for k in 0..n {
            let i = (self.rr + k) % n;
            let p = &self.paths[i];
            if p.state == PathState::Retired {
                continue;
            }
            if p.acks.wants_ack(now) || p.ping_due || credit_path == Some(i) {
                self.rr = (i + 1) % n;
                return self.build_packet(now, i, false, buf);
            }
        }
        None
    }

    /// The Up path with the lowest RTT (path 0 when none is Up).
    fn control_path(&self) -> usize {
        self.paths
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state == PathState::Up)
            .min_by_key(|(_, p)| p.rtt.smoothed())
            .or_else(|| {
                self.paths
                    .iter()
                    .enumerate()
                    .find(|(_, p)| p.state != PathState::Retired)
            })
            .map_or(0, |(i, _)| i)
    }

    fn transmit_close(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        let Some(i) = self.close_pending.iter().position(|&c| c) else {
            self.state = State::Closed;
            self.push_event(Event::Closed);
            return None;
        };
        self.close_pending[i] = false;
        let max = self.max_datagram;
        let t = Self::seal_packet_on(
            &self.session,
            &mut self.paths[i],
            now,
            i,
            max,
            buf,
            &mut self.frame_lists,
            |w, _, _| {
                Frame::Close {
                    code: 0,
                    reason: b"closed",
                }
                .encode(w)
            },
        );
        if !self.close_pending.iter().any(|&c| c) {
            self.state = State::Closed;
            self.push_event(Event::Closed);
        }
        t
    }

    /// Builds one protected packet on path `i`: ACK, PING, credits and, for
    /// a data packet, retransmissions, datagrams and new data.
    fn build_packet(
        &mut self,
        now: Time,
        i: usize,
        with_data: bool,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let (send, recv, dsend, pool) = (
            &mut self.send,
            &mut self.recv,
            &mut self.dsend,
            &mut self.pool,
        );
        let path = &mut self.paths[i];
        let mut retransmission = false;
        let t = Self::seal_packet_on(
            &self.session,
            path,
            now,
            i,
            self.max_datagram,
            buf,
            &mut self.frame_lists,
            |w, acks, sent| {
                let mut eliciting = false;
                // ACK and credits first, each bounded in a data packet so a
                // full-size fragment still fits (see CONTROL_RESERVE).
                if acks.has_news() {
                    if with_data {
                        let mut small = [0u8; 64];
                        let mut aw = Writer::new(&mut small);
                        if acks.write(i as u8, now, &mut aw) {
                            let n = aw.len();
                            w.bytes(&small[..n]);
                        }
                    } else {
                        acks.write(i as u8, now, w);
                    }
                }
                if with_data {
                    // (A data packet has at least MIN_MAX_DATAGRAM bytes, so
                    // these 64 + 32 bytes always fit.)
                    let mut small = [0u8; 32];
                    let mut cw = Writer::new(&mut small);
                    recv.write_credits(&mut cw, sent);
                    let n = cw.len();
                    w.bytes(&small[..n]);
                    let before = sent.len();
                    send.write_retransmissions(w, sent);
                    retransmission = sent.len() > before;
                    send.write_fins(w, sent);
                    eliciting |= dsend.write(w, pool);
                    send.write_new(w, sent);
                } else {
                    recv.write_credits(w, sent);
                }
                eliciting || !sent.is_empty()
            },
        );
        if t.is_some() && retransmission {
            self.paths[i].counters.packets_retransmitted += 1;
        }
        t
    }

    /// Header, frames from `fill` (which returns whether it wrote anything
    /// ack-eliciting), encryption, and the bookkeeping of a sent packet
    /// (recovery, congestion control, pacing, counters). A due PING goes
    /// first, whatever the packet carries.
    #[allow(clippy::too_many_arguments)]
    fn seal_packet_on(
        session: &Session,
        p: &mut Path,
        now: Time,
        i: usize,
        max_datagram: usize,
        buf: &mut [u8],
        frame_lists: &mut FrameLists,
        fill: impl FnOnce(&mut Writer<'_>, &mut ack::AckTracker, &mut Vec<SentFrame>) -> bool,
    ) -> Option<Transmit> {
        let peer = session.peer.as_ref()?;
        let cap = buf.len().min(max_datagram);
        if cap < HEADER_LEN + TAG_LEN + 64 {
            return None;
        }
        let pn = p.recovery.next_pn();
        let hdr = Header {
            kind: PacketKind::Protected,
            insecure: session.insecure(),
            client: session.is_client,
            path: i as u8,
            conn_id: peer.keys.conn_id,
            generation: session.generation(),
            pn,
        };
        let mut head = [0u8; HEADER_LEN];
        hdr.encode(&mut head);
        let (hbuf, rest) = buf[..cap].split_at_mut(HEADER_LEN);
        hbuf.copy_from_slice(&head);
        let payload_cap = rest.len() - TAG_LEN;
        let mut sent = frame_lists.take();
        let (len, eliciting) = {
            let mut w = Writer::new(&mut rest[..payload_cap]);
            let mut eliciting = false;
            if p.ping_due && Frame::Ping.encode(&mut w) {
                p.ping_due = false;
                eliciting = true;
            }
            eliciting |= fill(&mut w, &mut p.acks, &mut sent);
            (w.len(), eliciting)
        };
        if len == 0 {
            frame_lists.put(sent);
            return None;
        }
        let tag = peer.keys.seal(i as u8, pn, &head, &mut rest[..len]);
        rest[len..len + TAG_LEN].copy_from_slice(&tag);
        let total = HEADER_LEN + len + TAG_LEN;
        let has_data = sent
            .iter()
            .any(|f| matches!(f, SentFrame::Data { .. } | SentFrame::Fin { .. }));
        let record = if eliciting {
            Some(SentPacket::new(now, total as u32, sent))
        } else {
            frame_lists.put(sent);
            None
        };
        p.recovery.on_sent(pn, record);
        p.counters.packets_sent += 1;
        p.counters.bytes_sent += total as u64;
        // Only data is paced; ACKs, PINGs and credits are small and late
        // control costs more than it saves.
        let release_at = if has_data {
            let rate = p.cc.pacing_rate();
            let burst = p.burst_allowance(rate);
            p.pacer.on_send(now, total as u64, rate, burst)
        } else {
            now
        };
        if eliciting {
            p.cc.on_sent(now, total as u64, p.recovery.bytes_in_flight);
        }
        Some(Transmit {
            path: i,
            len: total,
            release_at,
        })
    }

    // ----- statistics -----

    pub fn stats(&self) -> ConnStats {
        let paths: Vec<PathStats> = self
            .paths
            .iter()
            .map(|p| PathStats {
                name: p.name.clone(),
                state: p.state,
                srtt: p.rtt.smoothed(),
                min_rtt: p.rtt.min(),
                rttvar: p.rtt.var(),
                loss_rate: p.loss_ewma,
                cwnd: p.cc.cwnd(),
                pacing_rate_bps: p.cc.pacing_rate(),
                bytes_in_flight: p.recovery.bytes_in_flight,
                counters: PathCounters {
                    spurious_losses: p.recovery.spurious_losses,
                    ..p.counters.clone()
                },
            })
            .collect();
        let sum = |f: fn(&PathCounters) -> u64| paths.iter().map(|p| f(&p.counters)).sum();
        let c = &self.counters;
        ConnStats {
            generation: self.generation(),
            peer_generation: self.session.peer.as_ref().map(|p| p.generation),
            peer_max_datagram: self.session.peer.as_ref().map(|p| p.max_datagram),
            connected: self.is_connected(),
            cipher: self.session.peer.as_ref().and_then(|p| p.keys.cipher()),
            flows: self.send.flow_count(),
            flows_retired: self.send.flows_retired,
            recv_flows: self.recv.flow_count(),
            recv_flows_closed: self.recv.flows_closed,
            recv_closed_ranges: self.recv.closed_ranges(),
            packets_sent: sum(|c| c.packets_sent),
            packets_received: sum(|c| c.packets_received),
            packets_lost: sum(|c| c.packets_lost),
            packets_retransmitted: sum(|c| c.packets_retransmitted),
            packets_accepted: c.packets_accepted,
            hellos_accepted: c.hellos_accepted,
            messages_queued: self.send.messages_queued,
            messages_delivered: c.messages_delivered,
            bytes_delivered: c.bytes_delivered,
            messages_discarded: self.send.messages_discarded,
            datagrams_sent: self.dsend.sent,
            datagrams_received: c.datagrams_received,
            datagrams_dropped: self.dsend.dropped + self.drecv.evicted + self.drecv.inconsistent,
            auth_failures: c.auth_failures,
            replays_dropped: c.replays_dropped,
            malformed: c.malformed,
            stale_generation: c.stale_generation,
            no_session: c.no_session,
            role_conflicts: c.role_conflicts,
            cipher_mismatches: c.cipher_mismatches,
            protocol_violations: c.protocol_violations
                + self.recv.offset_mismatches
                + self.recv.closed_overflow,
            peer_restarts: c.peer_restarts,
            events_dropped: c.events_dropped,
            send_buffered: self.send.buffered,
            recv_buffered: self.recv.buffered_bytes(),
            paths,
        }
    }
}
