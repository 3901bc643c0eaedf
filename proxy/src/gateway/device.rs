//! The device loop: one thread owns the QP engine, the WAN connection and
//! every packet socket, and moves packets between them.
//!
//! Each turn: wait in ppoll(2) for a socket, the wake-up eventfd or the
//! earliest timer (engine, transport, a paced packet), read a batch from
//! every ready socket, fire due timers, then *pump* (transport events into
//! the engine, engine outputs to the DC side and the transport, waiting
//! messages into the transport) until nothing moves ([`glue::pump`], shared
//! with the tests that drive two gateways in memory), and transmit what the
//! transport releases.
//!
//! No allocation per packet in steady state: sockets read into and send
//! from buffers owned here, and the packets that travel between engine and
//! transport as `Vec<u8>` are recycled through the engine's and the
//! transport's bounded pools (`buffer::pool`; what goes where: `glue`).
//! `proxy/tests/steady_state_alloc.rs` counts the allocations of that path.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::qp::{HalfKey, QpEngine, TwinMsg};
use crate::roce::{NakCode, Psn};
use crate::time::Time;
use crate::wan::{Event, PathState, Transmit, WanConfig, WanConnection};

use super::acl::{self, Acl, Verdict};
use super::backend::{DcIo, TxOutcome};
use super::glue::{self, accept, DcPort, Pending, PENDING_HIGH_WATER};
use super::shard::{self, HandoffRx, HandoffTx};
use super::snapshot::{
    BufferSnap, DcCounters, EngineCounters, FlowSnap, PathSnap, ShardSnap, Snapshot, TwinCounters,
    WanCounters, MAX_FLOWS,
};
use super::wanio::WanSockets;
use super::{sys, Command, RunOutcome, RunSummary, Shared};

/// Batches read from one socket per turn before the others get their turn
/// (each batch up to `WAN_IO_BATCH` / 64 messages).
const RX_BATCHES: usize = 4;
/// Staging buffer for WAN datagrams, in `max_datagram` slots.
const STAGE_SLOTS: usize = 64;
/// Packets transmitted per turn before reading again.
const TX_BATCH: usize = 512;
/// A paced packet due within this is waited for by spinning.
const SPIN: Duration = Duration::from_micros(50);
/// Longest wait without a timer (the eventfd wakes us for commands).
const IDLE_WAIT: Duration = Duration::from_millis(250);
/// Set (to anything) to keep the device thread at normal priority.
pub const NORMAL_PRIORITY_ENV: &str = "SOYA_NORMAL_PRIORITY";
/// Handed-over packets taken from each other shard per turn.
const HANDOFF_BUDGET: usize = 256;
/// A shard without a session this long after its start says why it thinks
/// so (the twin runs another shard count, another key, or is down).
const CONNECT_ALARM: Duration = Duration::from_secs(5);
/// How long a drain may take.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Static facts about a path, for snapshots and logs.
pub struct PathMeta {
    pub name: String,
    pub local: String,
    pub remote: String,
    pub dscp: u8,
    pub weight: u32,
}

/// This device's place among the gateway's shards.
pub struct ShardCtx {
    pub index: usize,
    pub count: usize,
    /// Reads the DC backend (udp lab: shard 0 only).
    pub reads_dc: bool,
    /// Toward each other shard (None at `index`).
    pub tx: Vec<Option<HandoffTx>>,
    /// From every other shard.
    pub rx: Vec<HandoffRx>,
}

impl ShardCtx {
    /// The only shard of a gateway.
    pub fn single() -> ShardCtx {
        ShardCtx {
            index: 0,
            count: 1,
            reads_dc: true,
            tx: vec![None],
            rx: Vec::new(),
        }
    }
}

pub struct Device {
    pub site: String,
    pub insecure: bool,
    pub policy: String,
    pub engine: QpEngine,
    pub wan: WanConnection,
    /// To rebuild the connection when the twin closes it.
    pub wan_cfg: WanConfig,
    pub dc: DcIo,
    pub socks: WanSockets,
    pub acl: Acl,
    pub paths: Vec<PathMeta>,
    pub shared: Arc<Shared>,
    pub epoch: Instant,
    pub slot_bytes: u64,
    pending: Pending,
    rx: Vec<u8>,
    /// A held (paced, not yet due) datagram's bytes.
    tx: Vec<u8>,
    held: Option<Transmit>,
    /// WAN datagrams of this turn, staged for one flush.
    stage: Vec<u8>,
    stage_used: usize,
    max_datagram: usize,
    dcc: DcCounters,
    tw: TwinCounters,
    draining: Option<Instant>,
    closing: bool,
    backend: String,
    shard: ShardCtx,
    /// Per shard: packets were handed to it this turn (wake it).
    woke: Vec<bool>,
    /// Why this shard has no session, once it has looked long enough.
    alarm: String,
    next_check: Instant,
}

/// A fresh, never-zero 64-bit session nonce from the kernel's CSPRNG.
pub fn session_nonce() -> std::io::Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open("/dev/urandom")?;
    loop {
        let mut b = [0u8; 8];
        f.read_exact(&mut b)?;
        let n = u64::from_le_bytes(b);
        if n != 0 {
            return Ok(n);
        }
    }
}

fn path_state(s: PathState) -> &'static str {
    match s {
        PathState::Probing => "probing",
        PathState::Up => "up",
        PathState::Down => "down",
    }
}

impl Device {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        site: String,
        insecure: bool,
        policy: String,
        engine: QpEngine,
        wan: WanConnection,
        wan_cfg: WanConfig,
        dc: DcIo,
        socks: WanSockets,
        acl: Acl,
        paths: Vec<PathMeta>,
        shared: Arc<Shared>,
        epoch: Instant,
        slot_bytes: u64,
        shard: ShardCtx,
    ) -> Device {
        let backend = dc.describe();
        let max_datagram = wan_cfg.max_datagram.max(crate::wan::MIN_MAX_DATAGRAM);
        Device {
            site,
            insecure,
            policy,
            engine,
            wan,
            wan_cfg,
            dc,
            socks,
            acl,
            paths,
            shared,
            epoch,
            slot_bytes,
            pending: Pending::default(),
            rx: vec![0; 65_536],
            tx: vec![0; 65_536],
            held: None,
            stage: vec![0; STAGE_SLOTS * max_datagram],
            stage_used: 0,
            max_datagram,
            dcc: DcCounters::default(),
            tw: TwinCounters::default(),
            draining: None,
            closing: false,
            backend,
            woke: vec![false; shard.count],
            shard,
            alarm: String::new(),
            next_check: Instant::now() + CONNECT_ALARM,
        }
    }

    fn wake(&self) -> &sys::EventFd {
        &self.shared.wakes[self.shard.index]
    }

    fn now(&self) -> Time {
        Time::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn instant(&self, t: Time) -> Instant {
        self.epoch + Duration::from_nanos(t.as_nanos())
    }

    /// Runs until drained, aborted or failed.
    pub fn run(mut self) -> RunSummary {
        sys::set_timer_slack(1_000);
        sys::keep_heap();
        if std::env::var_os(NORMAL_PRIORITY_ENV).is_none() && !sys::raise_thread_priority() {
            tracing::debug!(
                "device loop: cannot raise the thread priority; running at normal priority"
            );
        }
        let started = Instant::now();
        // A shard that does not read the DC side polls no descriptor
        // there (poll ignores negative ones).
        let dc_fd = if self.shard.reads_dc {
            self.dc.fd()
        } else {
            -1
        };
        let mut fds = vec![
            sys::pollfd(self.wake().fd(), libc::POLLIN),
            sys::pollfd(dc_fd, libc::POLLIN),
        ];
        for s in 0..self.socks.len() {
            fds.push(sys::pollfd(self.socks.fd(s), libc::POLLIN));
        }
        if self.shard.count > 1 {
            tracing::info!(
                shard = self.shard.index,
                shards = self.shard.count,
                wan = %self.socks.binds.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                reads_dc = self.shard.reads_dc,
                "shard {}/{}: talks only to the twin's shard {} (wan ports + {}); the twin must run gateway.shards = {}",
                self.shard.index, self.shard.count, self.shard.index, self.shard.index, self.shard.count
            );
        }
        tracing::info!(site = %self.site, backend = %self.backend, generation = format_args!("{:016x}", self.wan.generation()), "gateway running");
        loop {
            let now = self.now();
            let timeout = self.next_wait(now);
            for f in fds.iter_mut() {
                f.revents = 0;
            }
            if let Err(e) = sys::ppoll(&mut fds, Some(timeout)) {
                return self.stop(RunOutcome::Failed(format!("ppoll: {e}")), started);
            }
            if fds[0].revents != 0 {
                self.wake().clear();
            }
            match self.shared.command() {
                Command::Abort => return self.stop(RunOutcome::Aborted, started),
                Command::Drain if self.draining.is_none() => {
                    tracing::info!(
                        buffered_slots = self.engine.occupancy().slots_used,
                        waiting = self.pending.messages,
                        "draining: new requests from the DC side are refused; flushing (at most {} s)",
                        DRAIN_TIMEOUT.as_secs()
                    );
                    self.draining = Some(Instant::now() + DRAIN_TIMEOUT);
                }
                _ => {}
            }
            let now = self.now();
            for s in 0..self.socks.len() {
                if fds[2 + s].revents != 0 {
                    self.recv_wan(s, now);
                }
            }
            if fds[1].revents & libc::POLLIN != 0 {
                if let Err(e) = self.recv_dc(now) {
                    return self.stop(RunOutcome::Failed(format!("dc backend: {e}")), started);
                }
            }
            if !self.shard.rx.is_empty() {
                self.recv_handoff(now);
            }
            let now = self.now();
            if self.engine.poll_timeout().is_some_and(|t| t <= now) {
                self.engine.handle_timeout(now);
            }
            if self.wan.poll_timeout().is_some_and(|t| t <= now) {
                self.wan.handle_timeout(now);
            }
            self.pump(now);
            self.dc.flush();
            self.transmit();
            self.serve_snapshot();
            self.check_connected();
            if let Some(deadline) = self.draining {
                if self.is_drained() {
                    return self.stop(RunOutcome::Drained, started);
                }
                if Instant::now() >= deadline {
                    return self.stop(RunOutcome::DrainTimeout, started);
                }
            }
        }
    }

    fn next_wait(&self, now: Time) -> Duration {
        let mut t: Option<Time> = None;
        let mut at = |x: Option<Time>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t: Time| t.min(x)));
            }
        };
        at(self.engine.poll_timeout());
        at(self.wan.poll_timeout());
        at(self.held.map(|h| h.release_at));
        let mut wait = t.map_or(IDLE_WAIT, |t| t.since(now)).min(IDLE_WAIT);
        if self.draining.is_some() {
            wait = wait.min(Duration::from_millis(10));
        }
        if self.shard.rx.iter().any(|r| !r.is_empty()) {
            wait = Duration::ZERO;
        }
        wait
    }

    fn recv_wan(&mut self, s: usize, now: Time) {
        for _ in 0..RX_BATCHES {
            let wan = &mut self.wan;
            let (_, drained) = self.socks.recv_batch(s, |path, bytes| {
                wan.handle_datagram_in_place(now, path, bytes)
            });
            if drained {
                break;
            }
        }
    }

    fn recv_dc(&mut self, now: Time) -> std::io::Result<()> {
        let wall = Instant::now();
        let Device {
            dc,
            dcc,
            acl,
            engine,
            draining,
            pending,
            rx,
            shard,
            woke,
            ..
        } = self;
        let refuse_new = draining.is_some() || pending.bytes > PENDING_HIGH_WATER;
        let draining = draining.is_some();
        let (me, count) = (shard.index, shard.count);
        for _ in 0..RX_BATCHES {
            let (_, drained) = dc.recv_batch(rx, wall, |pkt, from| {
                dcc.rx_packets += 1;
                dcc.rx_bytes += pkt.len() as u64;
                let (verdict, addrs) = acl.outbound(pkt);
                match verdict {
                    Verdict::Malformed => dcc.rx_malformed += 1,
                    Verdict::BadSource => dcc.rx_acl_source += 1,
                    Verdict::BadDestination => dcc.rx_acl_destination += 1,
                    Verdict::Pass => {
                        let owner = addrs.map_or(0, |(s, d)| shard::shard_of_pair(s, d, count));
                        if owner != me {
                            // Another shard's host pair: hand it over (its
                            // owner learns the lab host from it).
                            let queued = shard
                                .tx
                                .get_mut(owner)
                                .and_then(Option::as_mut)
                                .is_some_and(|tx| tx.push(pkt, from));
                            if queued {
                                dcc.handoff_out += 1;
                                woke[owner] = true;
                            } else {
                                dcc.handoff_dropped += 1;
                            }
                            return None;
                        }
                        accept(dcc, engine, refuse_new, draining, now, pkt);
                        return addrs.map(|(src, _)| src);
                    }
                }
                None
            })?;
            if drained {
                break;
            }
        }
        for (j, w) in self.woke.iter_mut().enumerate() {
            if std::mem::take(w) {
                self.shared.wakes[j].wake();
            }
        }
        Ok(())
    }

    /// Takes the packets other shards read for this one.
    fn recv_handoff(&mut self, now: Time) {
        let wall = Instant::now();
        let refuse_new = self.draining.is_some() || self.pending.bytes > PENDING_HIGH_WATER;
        let draining = self.draining.is_some();
        for q in self.shard.rx.iter_mut() {
            for _ in 0..HANDOFF_BUDGET {
                let Some((len, from)) = q.pop(&mut self.rx) else {
                    break;
                };
                self.dcc.handoff_in += 1;
                let pkt = &self.rx[..len];
                if let (Some(from), Some((src, _))) = (from, acl::addresses(pkt)) {
                    self.dc.learn(src, from, wall);
                }
                accept(
                    &mut self.dcc,
                    &mut self.engine,
                    refuse_new,
                    draining,
                    now,
                    pkt,
                );
            }
        }
    }

    /// Once a second while there is no session: after [`CONNECT_ALARM`],
    /// says (once) what the counters suggest.
    fn check_connected(&mut self) {
        let now = Instant::now();
        if now < self.next_check {
            return;
        }
        self.next_check = now + Duration::from_secs(1);
        if self.wan.is_connected() {
            self.alarm.clear();
            return;
        }
        if !self.alarm.is_empty() {
            return;
        }
        let (i, n) = (self.shard.index, self.shard.count);
        let st = self.wan.stats();
        let heard = st.paths.iter().any(|p| p.counters.packets_received > 0);
        let alarm = if st.auth_failures > 0 {
            format!(
                "shard {i}/{n}: no session with the twin after {} s, and the twin's HELLOs fail \
                 authentication: the twin runs a different gateway.shards (this side: {n}) or \
                 another wan key",
                CONNECT_ALARM.as_secs()
            )
        } else if !heard && n > 1 {
            format!(
                "shard {i}/{n}: no session with the twin after {} s, and nothing ever came from \
                 its ports + {i}: the twin runs fewer shards than gateway.shards = {n} here, is \
                 down, or a firewall blocks those ports",
                CONNECT_ALARM.as_secs()
            )
        } else {
            return;
        };
        tracing::error!("{alarm}");
        self.alarm = alarm;
    }

    /// Moves events and outputs between engine and transport until quiet
    /// ([`glue::pump`]), handling the transport's other events on the way.
    fn pump(&mut self, now: Time) {
        loop {
            let mut dc = DcOut {
                dc: &mut self.dc,
                dcc: &mut self.dcc,
                acl: &self.acl,
            };
            let ev = glue::pump(
                now,
                &mut self.engine,
                &mut self.wan,
                &mut self.pending,
                &mut self.tw,
                &mut dc,
            );
            match ev {
                Some(ev) => self.on_event(now, ev),
                None => return,
            }
        }
    }

    fn on_event(&mut self, now: Time, ev: Event) {
        match ev {
            // Traffic: handled in `glue::pump`.
            Event::Message(_) | Event::Datagram(_) => {}
            Event::PathUp(i) => {
                tracing::info!(path = %self.path_name(i), "wan path up");
            }
            Event::PathDown(i) => {
                tracing::warn!(path = %self.path_name(i), "wan path DOWN");
            }
            Event::Connected { peer_generation } => {
                let cipher = self.wan.stats().cipher;
                tracing::info!(
                    peer_generation = format_args!("{peer_generation:016x}"),
                    cipher = cipher.map_or("none (insecure)", |c| c.name()),
                    "connected to the twin"
                );
            }
            Event::CipherMismatch {
                peer_generation,
                ours,
                theirs,
            } => {
                tracing::error!(
                    peer_generation = format_args!("{peer_generation:016x}"),
                    ours = %ours,
                    theirs = %theirs,
                    "the twin offers no cipher this gateway accepts: NO SESSION; \
                     set the same wan.cipher on both sites (or \"auto\")"
                );
            }
            Event::PeerRestarted {
                old_generation,
                new_generation,
            } => {
                tracing::warn!(
                    old_generation = format_args!("{old_generation:016x}"),
                    new_generation = format_args!("{new_generation:016x}"),
                    "the twin RESTARTED: failing every flow that was mid-stream"
                );
                self.fail_mid_stream(now, "twin restarted");
            }
            Event::Closed => {
                if self.closing {
                    return;
                }
                // The twin shut down (CLOSE frame). Whatever it had not
                // delivered is gone with it; start a new session so that
                // its next incarnation finds us.
                tracing::warn!("the twin closed the connection (shut down): failing every flow that was mid-stream, starting a new session");
                self.fail_mid_stream(now, "twin shut down");
                match session_nonce() {
                    Ok(nonce) => {
                        self.wan = WanConnection::new(self.wan_cfg.clone(), now, nonce);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot draw a session nonce; WAN stays closed")
                    }
                }
            }
        }
    }

    /// The conservative answer to a lost twin: every half with requests
    /// not yet reported delivered is failed toward its requester with a
    /// remote operational error (the engine injects the NAK at the
    /// requester's next outstanding PSN and answers everything later with
    /// it). See the module docs for the engine API that would do this
    /// without a synthetic `Error` message.
    fn fail_mid_stream(&mut self, now: Time, why: &str) {
        self.pending.clear();
        self.tw.discarded_on_restart = self.pending.discarded;
        let halves: Vec<HalfKey> = self
            .engine
            .ingress_halves()
            .filter(|a| !a.is_idle())
            .map(|a| a.key)
            .collect();
        for half in halves {
            tracing::warn!(flow = %half, reason = why, "failing flow toward its requester");
            self.tw.flows_failed_on_restart += 1;
            self.engine.handle_twin(
                now,
                TwinMsg::Error {
                    half,
                    psn: Psn::new(0),
                    code: NakCode::RemoteOperationalError,
                },
            );
        }
    }

    /// Sends what the transport releases, honouring `release_at`: datagrams
    /// already due are staged and sent together (see the module docs).
    fn transmit(&mut self) {
        if let Some(h) = self.held {
            let due = self.instant(h.release_at);
            if due > Instant::now() {
                return;
            }
            self.stage[..h.len].copy_from_slice(&self.tx[..h.len]);
            self.socks.stage(h.path, 0, h.len);
            self.stage_used = h.len;
            self.held = None;
        }
        for _ in 0..TX_BATCH {
            if self.stage.len() - self.stage_used < self.max_datagram {
                self.flush_wan();
            }
            let now = self.now();
            let off = self.stage_used;
            let Some(t) = self.wan.poll_transmit(now, &mut self.stage[off..]) else {
                break;
            };
            if t.release_at > now {
                if t.release_at.since(now) > SPIN {
                    self.tx[..t.len].copy_from_slice(&self.stage[off..off + t.len]);
                    self.held = Some(t);
                    break;
                }
                // Due soon: send what is due first, then wait for it.
                self.flush_wan();
                if off > 0 {
                    self.stage.copy_within(off..off + t.len, 0);
                }
                let due = self.instant(t.release_at);
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
            }
            let off = self.stage_used;
            self.socks.stage(t.path, off, t.len);
            self.stage_used = off + t.len;
        }
        self.flush_wan();
    }

    fn flush_wan(&mut self) {
        if self.stage_used > 0 {
            self.socks.flush(&self.stage[..self.stage_used]);
            self.stage_used = 0;
        }
    }

    fn is_drained(&self) -> bool {
        self.engine.occupancy().slots_used == 0
            && self.pending.is_empty()
            && self.wan.is_drained()
            && self.held.is_none()
    }

    fn path_name(&self, i: usize) -> &str {
        self.paths.get(i).map_or("?", |p| p.name.as_str())
    }

    fn serve_snapshot(&mut self) {
        let req = self.shared.snap_req.load(Ordering::Acquire);
        if req <= self.shared.snap_served(self.shard.index) {
            return;
        }
        let s = self.snapshot("running");
        self.shared.publish(self.shard.index, req, s);
    }

    /// Ends the loop: closes the session (unless aborted), publishes a last
    /// snapshot and reports.
    fn stop(mut self, outcome: RunOutcome, started: Instant) -> RunSummary {
        if let RunOutcome::Failed(e) = &outcome {
            // One shard down stops the gateway: the others drain.
            tracing::error!(
                shard = self.shard.index,
                shards = self.shard.count,
                "device loop FAILED: {e}; stopping the gateway"
            );
            self.shared.set_command(Command::Drain);
        }
        if !matches!(outcome, RunOutcome::Aborted) {
            self.closing = true;
            let now = self.now();
            self.wan.close(now);
            for _ in 0..8 {
                if let Some(h) = self.held.take() {
                    self.socks.send(h.path, &self.tx[..h.len]);
                }
                self.transmit();
                self.dc.flush();
                while self.wan.poll_event().is_some() {}
            }
        }
        for s in 0..self.socks.len() {
            let st = self.socks.io_stats(s);
            let (mode, gso, gro) = self.socks.io_describe(s);
            tracing::info!(
                socket = %self.socks.binds[s],
                mode = mode.name(),
                gso,
                gro,
                send_calls = st.send_calls,
                sent = st.datagrams_sent,
                gso_messages = st.gso_messages,
                recv_calls = st.recv_calls,
                received = st.datagrams_received,
                gro_messages = st.gro_messages,
                kernel_drops = st.kernel_drops,
                "wan socket i/o"
            );
        }
        if let Some(st) = self.dc.io_stats() {
            tracing::info!(
                send_calls = st.send_calls,
                sent = st.datagrams_sent,
                gso_messages = st.gso_messages,
                send_errors = st.send_errors,
                recv_calls = st.recv_calls,
                received = st.datagrams_received,
                kernel_drops = st.kernel_drops,
                "dc socket i/o"
            );
        }
        let (ep, wp) = (self.engine.pool_stats(), self.wan.pool_stats());
        tracing::info!(
            allocated = ep.allocated + wp.allocated,
            reused = ep.reused + wp.reused,
            freed = ep.freed + wp.freed,
            "packet buffers (engine and transport pools)"
        );
        let occ = self.engine.occupancy();
        let summary = RunSummary {
            outcome,
            elapsed: started.elapsed(),
            buffered_slots_left: occ.slots_used as u64,
            waiting_left: self.pending.messages as u64,
            wan_bytes_left: self.wan.stats().send_buffered,
            snapshot: self.snapshot("stopped"),
        };
        // Served for every later request: readers never wait on it.
        self.shared
            .publish(self.shard.index, u64::MAX, summary.snapshot.clone());
        self.shared.shard_stopped();
        summary
    }

    fn snapshot(&self, state: &str) -> Snapshot {
        let ws = self.wan.stats();
        let es = self.engine.stats;
        let occ = self.engine.occupancy();
        let mut flows: Vec<FlowSnap> = self
            .engine
            .ingress_halves()
            .map(|a| FlowSnap {
                role: "ingress".into(),
                half: a.key.to_string(),
                mode: format!("{:?}", a.mode).to_lowercase(),
                packets: a.stats.packets,
                bytes: a.stats.bytes,
                pseudo_acks: a.stats.pseudo_acks,
                naks: a.stats.seq_naks + a.stats.errors_injected,
                retransmissions: a.stats.duplicates_dropped,
                buffered: a.buffered() as u64,
                detail: format!("{:?}", a.stats),
            })
            .chain(self.engine.egress_halves().map(|r| FlowSnap {
                role: "egress".into(),
                half: r.key.to_string(),
                mode: String::new(),
                packets: r.stats.injected + r.stats.raw_injected,
                bytes: 0,
                pseudo_acks: 0,
                naks: r.stats.seq_naks + r.stats.rnr_naks + r.stats.fatal_naks,
                retransmissions: r.stats.retransmitted,
                buffered: r.held() as u64,
                detail: {
                    let (cwnd, out, srtt, min) = r.window();
                    format!(
                        "{:?} window {cwnd} in_flight {out} srtt {srtt:?} min_rtt {min:?}",
                        r.stats
                    )
                },
            }))
            .collect();
        let flows_total = flows.len();
        flows.sort_by_key(|f| std::cmp::Reverse((f.bytes, f.packets)));
        flows.truncate(MAX_FLOWS);
        let dc_refused = self.dc.io_stats().map_or(0, |s| s.send_errors);
        let (lab_hosts, lab_host_conflicts) = match &self.dc {
            DcIo::Udp(u) => (self.dc.peers() as u64, u.peer_conflicts),
            DcIo::Tun(_) | DcIo::Xdp(_) => (0, 0),
        };
        let state = if state == "running" && self.draining.is_some() {
            "draining"
        } else {
            state
        };
        Snapshot {
            site: self.site.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            backend: self.backend.clone(),
            state: state.into(),
            uptime_secs: self.epoch.elapsed().as_secs_f64(),
            generation: ws.generation,
            peer_generation: ws.peer_generation,
            connected: ws.connected,
            insecure: self.insecure,
            policy: self.policy.clone(),
            dc: DcCounters {
                lab_hosts,
                lab_host_conflicts,
                rx_kernel_drops: self.dc.kernel_drops(),
                tx_packets: self.dcc.tx_packets.saturating_sub(dc_refused),
                tx_errors: self.dcc.tx_errors + dc_refused,
                ..self.dcc.clone()
            },
            engine: EngineCounters {
                dc_packets: es.dc_packets,
                dc_malformed: es.dc_malformed,
                dc_bad_icrc: es.dc_bad_icrc,
                dc_not_roce: es.dc_not_roce,
                twin_msgs: es.twin_msgs,
                twin_malformed: es.twin_malformed,
                cm_messages: es.cm_messages,
                flows_learned_cm: es.flows_learned_cm,
                flows_learned_traffic: es.flows_learned_traffic,
                cnps_absorbed: es.cnps_absorbed,
                unmatched_responses: es.unmatched_responses,
            },
            buffer: BufferSnap {
                slots_used: occ.slots_used as u64,
                slots_total: occ.slots_total as u64,
                high_water: occ.high_water as u64,
                slot_bytes: self.slot_bytes,
            },
            twin: TwinCounters {
                pending_messages: self.pending.messages as u64,
                pending_bytes: self.pending.bytes as u64,
                pending_high_water_bytes: self.pending.high_water_bytes as u64,
                pending_overflow: self.pending.overflow,
                blocked: self.pending.blocked,
                send_errors: self.pending.send_errors,
                ..self.tw.clone()
            },
            wan: WanCounters {
                packets_sent: ws.packets_sent,
                packets_received: ws.packets_received,
                packets_lost: ws.packets_lost,
                packets_retransmitted: ws.packets_retransmitted,
                packets_accepted: ws.packets_accepted,
                auth_failures: ws.auth_failures,
                replays_dropped: ws.replays_dropped,
                malformed: ws.malformed,
                stale_generation: ws.stale_generation,
                no_session: ws.no_session,
                role_conflicts: ws.role_conflicts,
                protocol_violations: ws.protocol_violations,
                peer_restarts: ws.peer_restarts,
                events_dropped: ws.events_dropped,
                messages_queued: ws.messages_queued,
                messages_delivered: ws.messages_delivered,
                messages_discarded: ws.messages_discarded,
                datagrams_sent: ws.datagrams_sent,
                datagrams_received: ws.datagrams_received,
                datagrams_dropped: ws.datagrams_dropped,
                send_buffered_bytes: ws.send_buffered,
                recv_buffered_bytes: ws.recv_buffered,
                unknown_source: self.socks.unknown_source,
                foreign_source: self.socks.foreign_source,
                socket_send_errors: self.socks.send_errors,
                socket_recv_errors: self.socks.recv_errors(),
            },
            paths: ws
                .paths
                .iter()
                .zip(&self.paths)
                .map(|(p, m)| PathSnap {
                    name: m.name.clone(),
                    local: m.local.clone(),
                    remote: m.remote.clone(),
                    state: path_state(p.state).into(),
                    weight: m.weight,
                    dscp: m.dscp,
                    srtt_us: p.srtt.as_micros() as u64,
                    min_rtt_us: p.min_rtt.as_micros() as u64,
                    rttvar_us: p.rttvar.as_micros() as u64,
                    loss_rate: p.loss_rate,
                    cwnd_bytes: p.cwnd,
                    pacing_rate_bps: p.pacing_rate_bps,
                    bytes_in_flight: p.bytes_in_flight,
                    packets_sent: p.counters.packets_sent,
                    bytes_sent: p.counters.bytes_sent,
                    packets_received: p.counters.packets_received,
                    bytes_received: p.counters.bytes_received,
                    packets_lost: p.counters.packets_lost,
                    packets_retransmitted: p.counters.packets_retransmitted,
                    auth_failures: p.counters.auth_failures,
                    malformed: p.counters.malformed,
                    times_down: p.counters.times_down,
                    shard: self.shard.index,
                })
                .collect(),
            flows,
            flows_total,
            shards: vec![ShardSnap {
                index: self.shard.index,
                connected: ws.connected,
                generation: ws.generation,
                dc_rx_accepted: self.dcc.rx_accepted,
                dc_tx_packets: self.dcc.tx_packets,
                twin_msgs_out: self.tw.msgs_out,
                twin_msgs_in: self.tw.msgs_in,
                wan_packets_sent: ws.packets_sent,
                wan_packets_received: ws.packets_received,
                handoff_out: self.dcc.handoff_out,
                handoff_in: self.dcc.handoff_in,
                handoff_dropped: self.dcc.handoff_dropped,
                slots_used: occ.slots_used as u64,
                alarm: self.alarm.clone(),
            }],
        }
    }
}

/// The DC side of a device, for [`glue::pump`]: sends within the ACL's
/// local prefixes, and the ACL's verdict on datagrams from the twin.
struct DcOut<'a> {
    dc: &'a mut DcIo,
    dcc: &'a mut DcCounters,
    acl: &'a Acl,
}

impl DcPort for DcOut<'_> {
    fn send(&mut self, packet: &[u8]) {
        let Some((_, dst)) = acl::addresses(packet) else {
            self.dcc.tx_errors += 1;
            return;
        };
        if !self.acl.is_local(dst) {
            self.dcc.tx_acl += 1;
            return;
        }
        match self.dc.send(packet, dst) {
            TxOutcome::Sent => {
                self.dcc.tx_packets += 1;
                self.dcc.tx_bytes += packet.len() as u64;
            }
            TxOutcome::NoPeer => self.dcc.tx_no_peer += 1,
            TxOutcome::Error => self.dcc.tx_errors += 1,
        }
    }

    fn admits(&mut self, packet: &[u8]) -> bool {
        self.acl.inbound(packet).0 == Verdict::Pass
    }
}
