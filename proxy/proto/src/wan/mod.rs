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
//! - this file: the connection's state, sending messages, timers;
//!   `receive`: datagrams in; `transmit`: datagrams out; `config`: what
//!   a connection is built from; `events`, `stats`: what it hands back;
//! - `packet`: header and frame codec; `msg`: `TwinMsg` codec;
//! - `cipher`: the packet AEADs (AES-256-GCM, ChaCha20-Poly1305) and how
//!   the twins agree on one;
//! - `crypto`, `session`: PSK key schedule and the HELLO exchange;
//!   `handshake`, `session::noise`: the identity-key handshake (Noise
//!   IKpsk2) that replaces it when identity keys are configured;
//!   `keyphase`: key updates (each direction's key replaced before the
//!   AEAD's limits, both phases readable during the switch);
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
mod config;
mod crypto;
mod dgram;
mod events;
mod flow;
mod handshake;
mod idhash;
mod keyphase;
pub mod msg;
pub mod packet;
mod path;
mod receive;
mod reconfig;
mod recovery;
mod replay;
mod rtt;
mod scheduler;
mod session;
mod stats;
pub mod testing;
mod transmit;

#[cfg(test)]
mod tests;

use crate::buffer::PacketBuf;
use std::collections::VecDeque;
use std::time::Duration;

use thiserror::Error;

use crate::buffer::{PacketPool, PoolStats};
use crate::qp::twin::TwinMsg;
use crate::time::Time;

use cc::{AckSample, Bbr, Controller, FixedRate};
use dgram::{DgramRecv, DgramSend};
use flow::{DataOutcome, Message, PushError, RecvFlows, SendFlows};
use keyphase::Opened;
use packet::{
    check_frames, Frame, Header, Hello, PacketKind, Writer, DATA_OVERHEAD, HEADER_LEN, HELLO_LEN,
    TAG_LEN,
};
use path::{tx_time, Path};
use recovery::{FrameLists, SentFrame, SentPacket};
use session::{HelloVerdict, Session};
pub use session::{KEY_UPDATE_INTERVAL, KEY_UPDATE_PACKETS, REKEY_INTERVAL, ROTATION_WINDOW};

pub use cipher::{aes_hardware, Cipher, CipherOffer, CipherPolicy};
pub use config::{
    CcKind, PathConfig, Tuning, WanConfig, FLOW_IDLE_MAX, FLOW_IDLE_MIN, PACING_BURST_CAP_PACKETS,
};
pub use events::{CloseWhy, Event, SendError, Transmit};
pub use handshake::{public_key, Identity, PATTERN as HANDSHAKE_PATTERN};
pub use packet::VERSION as PROTOCOL_VERSION;
pub use path::{PathCounters, PathState};
pub use reconfig::PathChange;
pub use stats::{ConnStats, PathStats};

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
/// Least time the peer's key before an update is held (`key_retain`):
/// covers scheduling delays of a busy gateway host that RTT samples on a
/// short path do not show.
const KEY_RETAIN_MIN: Duration = Duration::from_millis(10);
/// Cap on queued non-message events (path changes, datagrams): when the
/// application does not poll, the newest are dropped and counted.
const MAX_OTHER_EVENTS: usize = 4096;

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
    /// Identity mode: handshake messages that did not authenticate (or a
    /// PSK-only twin's HELLOs), INITIATIONs from an unknown static key,
    /// RESPONSEs and probes that changed nothing.
    handshake_failures: u64,
    unknown_peer_keys: u64,
    stale_handshakes: u64,
    /// Datagrams of another protocol version (also `malformed`).
    wrong_version: u64,
    protocol_violations: u64,
    peer_restarts: u64,
    events_dropped: u64,
    /// Sessions abandoned because the peer's key met the AEAD's integrity
    /// limit (that many forgeries under one key).
    integrity_limit_closes: u64,
    /// Sends held back because the sending key met its hard limit and the
    /// update was not allowed yet.
    key_exhausted: u64,
    /// Key updates over the connection's life (`keyphase`): ours, the
    /// peer's, and packets opened with the peer's key before.
    tx_key_updates: u64,
    rx_key_updates: u64,
    rx_key_previous: u64,
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
    /// What our CLOSE says, once [`Self::close_with`] was called.
    close_why: CloseWhy,
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
            recv: RecvFlows::new(window, tuning.max_flows).with_body_at(msg::packet_at),
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
            close_why: CloseWhy::Final,
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
        if let Some(id) = cfg.identity.clone() {
            c.session
                .set_identity(id, CipherOffer::new(cfg.cipher, aes_hardware()));
        }
        c.session
            .set_key_updates(c.tuning.key_update_packets, c.tuning.key_update_interval);
        c.session.set_rekey_interval(c.tuning.rekey_interval);
        c
    }

    /// This side's session generation.
    pub fn generation(&self) -> u64 {
        self.session.generation()
    }

    /// Our CLOSE went out on every path (or there was nobody to tell).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
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
    pub fn recycle(&mut self, packet: PacketBuf) {
        self.pool.put(packet);
    }

    /// The packet of a held request (a `Request` carried `Reliable`) that
    /// the transport is done with: acknowledged by the twin, or dropped
    /// because the twin restarted. Its sender (the engine's ingress half)
    /// keeps it until the twin reports it delivered, so that a twin that
    /// restarts can be sent it again (`qp::resume`); the transport's copy
    /// of the message and the engine's are thus one buffer, handed back,
    /// never copied.
    /// Gives back every held request's packet this connection still keeps
    /// for the twin (sent and not acknowledged, or not yet sent), through
    /// [`Self::take_handed_back`], and forgets the rest of what it had to
    /// send: the twin closed to restart, and its next incarnation gets
    /// those requests again from their halves.
    pub fn hand_back_all(&mut self) {
        self.send.reset();
    }

    pub fn take_handed_back(&mut self) -> Option<PacketBuf> {
        self.send.handed_back.pop_front()
    }

    /// A raw request (a tunnel's) the twin acknowledged
    /// (`flow::SendFlows::raw_released`): for `QpEngine::raw_released`.
    pub fn take_raw_released(&mut self) -> Option<PacketBuf> {
        self.send.raw_released.pop_front()
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
    pub fn send_datagram(&mut self, _now: Time, packet: PacketBuf) {
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
    pub fn close(&mut self, now: Time) {
        self.close_with(now, CloseWhy::Final);
    }

    /// [`Self::close`], saying why: a [`CloseWhy::Restart`] lets the twin
    /// keep its flows for our next incarnation.
    pub fn close_with(&mut self, _now: Time, why: CloseWhy) {
        if self.state != State::Open {
            return;
        }
        self.close_why = why;
        let restart = why == CloseWhy::Restart;
        if self.session.peer.is_none() || self.paths.is_empty() {
            self.state = State::Closed;
            self.push_event(Event::Closed { restart });
            return;
        }
        self.state = State::Closing;
        for (c, p) in self.close_pending.iter_mut().zip(&self.paths) {
            *c = p.state != PathState::Retired;
        }
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
        at(self.session.rekey_deadline());
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

    /// How long a receiver holds the peer's key before an update: three
    /// probe timeouts of the slowest live path (RFC 9001 §6.5), so that
    /// packets sent before the update and delayed on any path still open.
    /// A sender waits twice this after the peer showed it reads the
    /// current phase before it updates again (`keyphase`).
    fn key_retain(&self) -> Duration {
        let d = self.tuning.max_ack_delay;
        self.paths
            .iter()
            .filter(|p| p.state != PathState::Retired)
            .map(|p| p.rtt.pto_base(d) * 3)
            .max()
            .unwrap_or(Duration::ZERO)
            .max(KEY_RETAIN_MIN)
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
        if self.session.rekey_deadline().is_some_and(|t| t <= now) {
            // The periodic re-handshake: its INITIATION goes out now, on
            // every path, and on the HELLO rounds until answered.
            self.session.start_rekey();
            self.hello_interval = self.tuning.hello_interval;
            self.hello_next = now;
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
}
