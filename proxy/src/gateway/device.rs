//! The device loop: one thread per shard owns a [`Site`] (the sans-IO
//! engine, WAN connection and everything between them) and that shard's
//! packet I/O, and moves packets between them.
//!
//! Each turn: wait in ppoll(2) for a socket, the wake-up eventfd or the
//! earliest timer (the site's, or a paced datagram's), read a batch from
//! every ready socket into the site, fire due timers, send what the site
//! has for the data center, and transmit what it releases toward the twin
//! ([`Turn`], the same code the differential test drives over memory).
//! Then log what the site reports ([`SiteEvent`]) and answer snapshot
//! requests.
//!
//! No allocation per packet in steady state: sockets read into and send
//! from buffers owned here, and the packets inside the site are recycled
//! through its bounded pools. `proxy/tests/steady_state_alloc.rs` counts
//! the allocations of that path.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use soya_proto::site::{acl, Site, SiteEvent, TwinState};
use soya_proto::time::Time;
use soya_proto::wan::PathState;

use super::backend::DcIo;
use super::connect_alarm::{ConnectWatch, WanSeen};
use super::ports::{Clock, DcControl, MonotonicClock};
use super::shard::{self, HandoffRx, HandoffTx};
use super::snapshot::{
    BufferSnap, DcCounters, EngineCounters, FlowSnap, PathSnap, ShardSnap, Snapshot, TwinStatus,
    WanCounters, MAX_FLOWS,
};
use super::turn::{Route, Turn};
use super::wanio::WanSockets;
use super::{Command, RunOutcome, RunSummary, Shared};
use soya_io::sys;

/// Longest wait without a timer (the eventfd wakes us for commands).
const IDLE_WAIT: Duration = Duration::from_millis(250);
/// Set (to anything) to keep the device thread at normal priority.
pub const NORMAL_PRIORITY_ENV: &str = "SOYA_NORMAL_PRIORITY";
/// Handed-over packets taken from each other shard per turn.
const HANDOFF_BUDGET: usize = 256;
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

impl PathMeta {
    /// What the snapshot shows of a configured path.
    pub fn of(p: &soya_config::WanPath) -> Self {
        PathMeta {
            name: p.name.clone(),
            local: p.bind.to_string(),
            remote: p.remote.to_string(),
            dscp: p.dscp,
            weight: p.weight,
        }
    }
}

/// This device's place among the gateway's shards.
pub struct ShardCtx {
    pub index: usize,
    pub count: usize,
    /// Reads the DC backend (udp lab and tun: shard 0 only).
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

/// Facts about the gateway a device reports in its snapshots.
pub struct DeviceInfo {
    pub site: String,
    pub insecure: bool,
    pub policy: String,
    pub slot_bytes: u64,
    pub paths: Vec<PathMeta>,
}

pub struct Device {
    info: DeviceInfo,
    site: Site,
    /// Whichever backend runs, seen through [`DcControl`] and
    /// [`super::ports::DcPort`] only ([`super::backend`] says why this is
    /// an enum rather than a trait object).
    dc: DcIo,
    socks: WanSockets,
    turn: Turn,
    clock: MonotonicClock,
    shared: Arc<Shared>,
    draining: Option<Instant>,
    backend: String,
    shard: ShardCtx,
    /// Per shard: packets were handed to it this turn (wake it).
    woke: Vec<bool>,
    /// Why this shard has no session, once it has had none long enough.
    connect: ConnectWatch,
    next_check: Instant,
    /// Wake-ups of the loop ([`ShardSnap::turns`]).
    turns: u64,
}

/// A fresh session nonce for a [`Site`] ([`soya_proto::rand::session_nonce`]);
/// `None`, logged, if the kernel has none to give.
pub fn session_nonce() -> Option<u64> {
    soya_proto::rand::session_nonce()
        .map_err(|e| tracing::error!(error = %e, "cannot draw a session nonce from the kernel"))
        .ok()
}

fn path_state(s: PathState) -> &'static str {
    match s {
        PathState::Probing => "probing",
        PathState::Up => "up",
        PathState::Down => "down",
        PathState::Retired => "retired",
    }
}

/// The twin's state for `soya status` and the metrics.
fn twin_status(site: &Site, now: Time) -> TwinStatus {
    let secs = |t: Time| now.since(t).as_secs_f64();
    let (for_secs, lost_for_secs) = match site.twin_state() {
        TwinState::Connected => (0.0, 0.0),
        TwinState::Connecting { since } | TwinState::Unreachable { since } => (secs(since), 0.0),
        TwinState::Lost { since, declared } => (secs(since), secs(declared)),
    };
    TwinStatus {
        state: site.twin_state().name().into(),
        for_secs,
        lost_for_secs,
        timeout_secs: site.params().twin_timeout.as_secs_f64(),
    }
}

impl Device {
    pub fn new(
        info: DeviceInfo,
        site: Site,
        dc: DcIo,
        socks: WanSockets,
        shared: Arc<Shared>,
        epoch: Instant,
        shard: ShardCtx,
    ) -> Device {
        let backend = dc.describe();
        let turn = Turn::new(site.params().wan.max_datagram);
        Device {
            info,
            site,
            dc,
            socks,
            turn,
            clock: MonotonicClock { epoch },
            shared,
            draining: None,
            backend,
            woke: vec![false; shard.count],
            connect: ConnectWatch::new(shard.index, shard.count, Instant::now()),
            shard,
            next_check: Instant::now() + Duration::from_secs(1),
            turns: 0,
        }
    }

    fn wake(&self) -> &sys::EventFd {
        &self.shared.wakes[self.shard.index]
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
        tracing::info!(site = %self.info.site, backend = %self.backend, generation = format_args!("{:016x}", self.site.wan().generation()), "gateway running");
        loop {
            let now = self.clock.now();
            let timeout = self.next_wait(now);
            for f in fds.iter_mut() {
                f.revents = 0;
            }
            if let Err(e) = sys::ppoll(&mut fds, Some(timeout)) {
                return self.stop(RunOutcome::Failed(format!("ppoll: {e}")), started);
            }
            self.turns += 1;
            if fds[0].revents != 0 {
                self.wake().clear();
            }
            match self.shared.command() {
                Command::Abort => return self.stop(RunOutcome::Aborted, started),
                Command::Drain if self.draining.is_none() => {
                    tracing::info!(
                        buffered_slots = self.site.engine().occupancy().slots_used,
                        waiting = self.site.pending().messages,
                        "draining: new requests from the DC side are refused; flushing (at most {} s)",
                        DRAIN_TIMEOUT.as_secs()
                    );
                    self.site.start_drain();
                    self.draining = Some(Instant::now() + DRAIN_TIMEOUT);
                }
                _ => {}
            }
            if let Some((ticket, reload)) = self.shared.take_reload(self.shard.index) {
                let r = self.reload(reload);
                self.shared.reload_done(self.shard.index, ticket, r);
            }
            let now = self.clock.now();
            for s in 0..self.socks.len() {
                if fds[2 + s].revents != 0 {
                    self.turn.recv_wan(&mut self.site, &mut self.socks, s, now);
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
            Turn::timers(&mut self.site, self.clock.now());
            Turn::send_dc(&mut self.site, &mut self.dc);
            self.turn
                .transmit(&mut self.site, &mut self.socks, &self.clock);
            self.log_events();
            self.serve_snapshot();
            self.check_connected();
            if let Some(deadline) = self.draining {
                if self.is_restartable() {
                    return self.stop(RunOutcome::Drained, started);
                }
                if Instant::now() >= deadline {
                    return self.stop(RunOutcome::DrainTimeout, started);
                }
            }
        }
    }

    fn next_wait(&self, now: Time) -> Duration {
        let t = [self.site.poll_timeout(), self.turn.held_until()]
            .into_iter()
            .flatten()
            .min();
        let mut wait = t.map_or(IDLE_WAIT, |t| t.since(now)).min(IDLE_WAIT);
        if self.draining.is_some() {
            wait = wait.min(Duration::from_millis(10));
        }
        if self.dc.holds_unresolved() {
            // (Their hosts' entries come from the kernel, which wakes
            // nobody: look again soon.)
            wait = wait.min(Duration::from_millis(1));
        }
        if self.shard.rx.iter().any(|r| !r.is_empty()) {
            wait = Duration::ZERO;
        }
        wait
    }

    /// Reads the DC side: this shard's host pairs into its site, the
    /// others' handed over to their shards.
    fn recv_dc(&mut self, now: Time) -> std::io::Result<()> {
        let Device {
            site,
            dc,
            turn,
            shard,
            woke,
            ..
        } = self;
        let (me, count) = (shard.index, shard.count);
        let mut handoff_out = 0;
        let mut handoff_dropped = 0;
        let res = turn.recv_dc(site, dc, now, |pkt, from| {
            let owner = acl::addresses(pkt).map_or(me, |(s, d)| shard::shard_of_pair(s, d, count));
            if owner == me {
                return Route::Mine;
            }
            // Another shard's host pair: hand it over (its owner learns the
            // lab host from it).
            let queued = shard
                .tx
                .get_mut(owner)
                .and_then(Option::as_mut)
                .is_some_and(|tx| tx.push(pkt, from));
            if queued {
                handoff_out += 1;
                woke[owner] = true;
            } else {
                handoff_dropped += 1;
            }
            Route::Elsewhere
        });
        let c = self.site.dc_counters_mut();
        c.handoff_out += handoff_out;
        c.handoff_dropped += handoff_dropped;
        for (j, w) in self.woke.iter_mut().enumerate() {
            if std::mem::take(w) {
                self.shared.wakes[j].wake();
            }
        }
        res
    }

    /// Takes the packets other shards read for this one.
    fn recv_handoff(&mut self, now: Time) {
        for q in self.shard.rx.iter_mut() {
            for _ in 0..HANDOFF_BUDGET {
                let Some((len, from)) = q.pop(&mut self.turn.rx) else {
                    break;
                };
                self.site.dc_counters_mut().handoff_in += 1;
                Turn::handed_over(
                    &mut self.site,
                    &mut self.dc,
                    now,
                    &self.turn.rx[..len],
                    from,
                );
            }
        }
    }

    /// Once a second: a shard without a session for [`connect_alarm::CONNECT_ALARM`](super::connect_alarm::CONNECT_ALARM)
    /// says (once) what the counters suggest (`connect_alarm`).
    fn check_connected(&mut self) {
        let now = Instant::now();
        if now < self.next_check {
            return;
        }
        self.next_check = now + Duration::from_secs(1);
        let st = self.site.wan().stats();
        let seen = WanSeen {
            connected: self.site.is_connected(),
            auth_failures: st.auth_failures,
            heard: st.paths.iter().any(|p| p.counters.packets_received > 0),
        };
        if let Some(alarm) = self.connect.check(now, seen) {
            tracing::error!("{alarm}");
        }
    }

    fn path_name(&self, i: usize) -> &str {
        self.info.paths.get(i).map_or("?", |p| p.name.as_str())
    }

    /// Logs what the site reports.
    /// A reload ([`super::reload::apply`]): the sockets' paths first (the
    /// one thing that can fail, and then nothing changes), then the site.
    fn reload(
        &mut self,
        r: super::reload::ShardReload,
    ) -> Result<soya_proto::site::ReconfigureReport, String> {
        for w in self.socks.reconfigure(&r.wan)? {
            tracing::warn!("{w}");
        }
        self.info.paths = r.wan.paths.iter().map(PathMeta::of).collect();
        let report = self.site.reconfigure(r.params, self.clock.now());
        for c in &report.paths {
            tracing::info!(shard = self.shard.index, "reload: {c}");
        }
        Ok(report)
    }

    fn log_events(&mut self) {
        while let Some(ev) = self.site.poll_event() {
            match ev {
                SiteEvent::PathUp(i) => {
                    tracing::info!(path = %self.path_name(i), "wan path up");
                }
                SiteEvent::PathDown(i) => {
                    tracing::warn!(path = %self.path_name(i), "wan path DOWN");
                }
                SiteEvent::Connected { peer_generation } => {
                    let cipher = self.site.wan().stats().cipher;
                    tracing::info!(
                        peer_generation = format_args!("{peer_generation:016x}"),
                        cipher = cipher.map_or("none (insecure)", |c| c.name()),
                        "connected to the twin"
                    );
                }
                SiteEvent::CipherMismatch {
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
                SiteEvent::TwinRestarted {
                    old_generation,
                    new_generation,
                    flows_failed,
                    flows_resumed,
                } => {
                    tracing::warn!(
                        old_generation = format_args!("{old_generation:016x}"),
                        new_generation = format_args!("{new_generation:016x}"),
                        flows_failed,
                        flows_resumed,
                        "the twin RESTARTED: resumed the flows it re-injected, failed those \
                         whose requests it had pseudo-ACKed"
                    );
                }
                SiteEvent::TwinRestarting { flows_resumed } => {
                    tracing::warn!(
                        flows_resumed,
                        twin_timeout_secs = self.site.params().twin_timeout.as_secs_f64(),
                        "the twin drained and closed to RESTART: keeping every flow for its next \
                         start, which has wan.twin_timeout to answer"
                    );
                }
                SiteEvent::TwinReturned { pause } => {
                    tracing::info!(
                        pause_ms = pause.as_secs_f64() * 1e3,
                        "the twin is back from its planned restart: every flow kept"
                    );
                }
                SiteEvent::TwinShutDown { flows_failed } => {
                    tracing::warn!(
                        flows_failed,
                        "the twin closed the connection (shut down): failed every flow that was \
                         mid-stream; a new session waits for it"
                    );
                }
                SiteEvent::TwinLost {
                    since,
                    flows_failed,
                } => {
                    let down_for = self.clock.now().since(since);
                    tracing::error!(
                        down_for_secs = down_for.as_secs_f64(),
                        twin_timeout_secs = self.site.params().twin_timeout.as_secs_f64(),
                        flows_failed,
                        "twin LOST: no WAN path answered for {:.1} s (wan.twin_timeout); failed \
                         every flow through it, refusing new requests until it answers",
                        down_for.as_secs_f64()
                    );
                }
                SiteEvent::TwinBack { lost_for } => {
                    tracing::warn!(
                        lost_for_secs = lost_for.as_secs_f64(),
                        "the twin answers again after it was lost: accepting new requests"
                    );
                }
                SiteEvent::NoNonce => {
                    tracing::error!("no session nonce: the WAN stays closed");
                }
            }
        }
    }

    /// The drain is done: nothing this gateway pseudo-ACKed is
    /// undelivered and nothing waits for the DC (`Site::is_restartable`).
    /// What it re-injects for the twin's requesters need not be: the twin
    /// holds those and resumes them toward the next start.
    fn is_restartable(&self) -> bool {
        self.site.is_restartable() && !self.turn.holds()
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
        if matches!(outcome, RunOutcome::Drained) {
            // Nothing pseudo-ACKed is undelivered: the twin keeps every
            // flow for this gateway's next start (`Site::close_for_restart`).
            self.site.close_for_restart(self.clock.now());
        } else if !matches!(outcome, RunOutcome::Aborted) {
            self.site.close(self.clock.now());
        }
        if !matches!(outcome, RunOutcome::Aborted) {
            for _ in 0..8 {
                self.turn.release_held(&mut self.socks);
                self.turn
                    .transmit(&mut self.site, &mut self.socks, &self.clock);
                Turn::send_dc(&mut self.site, &mut self.dc);
                while self.site.poll_event().is_some() {}
            }
        }
        for s in 0..self.socks.len() {
            let (mode, gso, gro) = self.socks.io_describe(s);
            let how = format!("{} (gso {gso}, gro {gro})", mode.name());
            log_io_stats(
                "wan",
                &self.socks.binds[s].to_string(),
                &how,
                &self.socks.io_stats(s),
            );
        }
        if let Some(st) = self.dc.stats().socket_io {
            log_io_stats("dc", "lab", "udp", &st);
        }
        let (ep, wp) = (
            self.site.engine().pool_stats(),
            self.site.wan().pool_stats(),
        );
        tracing::info!(
            allocated = ep.allocated + wp.allocated,
            reused = ep.reused + wp.reused,
            freed = ep.freed + wp.freed,
            lent = wp.lent,
            lend_empty = wp.lend_empty,
            "packet buffers (engine and transport pools)"
        );
        let occ = self.site.engine().occupancy();
        let summary = RunSummary {
            outcome,
            elapsed: started.elapsed(),
            buffered_slots_left: occ.slots_used as u64,
            waiting_left: self.site.pending().messages as u64,
            wan_bytes_left: self.site.wan().stats().send_buffered,
            snapshot: self.snapshot("stopped"),
        };
        // Served for every later request: readers never wait on it.
        self.shared
            .publish(self.shard.index, u64::MAX, summary.snapshot.clone());
        self.shared.shard_stopped();
        summary
    }

    fn snapshot(&self, state: &str) -> Snapshot {
        let site = &self.site;
        let engine = site.engine();
        let ws = site.wan().stats();
        let es = engine.stats;
        let occ = engine.occupancy();
        let dcc = site.dc_counters();
        let tw = site.twin_counters();
        let mut flows: Vec<FlowSnap> = engine
            .ingress_halves()
            .map(|a| FlowSnap {
                role: "ingress".into(),
                half: a.key.to_string(),
                mode: format!("{:?}", a.mode).to_lowercase(),
                packets: a.stats.packets,
                bytes: a.stats.bytes,
                pseudo_acks: a.stats.pseudo_acks,
                naks: a.stats.seq_naks + a.stats.errors_injected,
                retransmissions: a.stats.duplicates_dropped + a.stats.raw_resends_dropped,
                buffered: a.buffered() as u64,
                detail: format!("{:?}", a.stats),
            })
            .chain(engine.egress_halves().map(|r| FlowSnap {
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
        let dcs = self.dc.stats();
        let dc_refused = dcs.send_refused;
        let state = if state == "running" && site.is_draining() {
            "draining"
        } else {
            state
        };
        Snapshot {
            site: self.info.site.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            backend: self.backend.clone(),
            state: state.into(),
            uptime_secs: self.clock.epoch.elapsed().as_secs_f64(),
            generation: ws.generation,
            peer_generation: ws.peer_generation,
            connected: site.is_connected(),
            twin_status: twin_status(site, self.clock.now()),
            insecure: self.info.insecure,
            policy: self.info.policy.clone(),
            dc: DcCounters {
                lab_hosts: dcs.lab_hosts,
                lab_host_conflicts: dcs.lab_host_conflicts,
                rx_kernel_drops: dcs.kernel_drops,
                tx_packets: dcc.tx_packets.saturating_sub(dc_refused),
                tx_errors: dcc.tx_errors + dc_refused,
                ..dcc.clone()
            },
            engine: EngineCounters {
                requests_refused_unreachable: es.requests_refused_unreachable
                    + es.requests_dropped_unreachable,
                halves_ingress: engine.halves().0 as u64,
                halves_egress: engine.halves().1 as u64,
                ..EngineCounters::copied_from(&es)
            },
            buffer: BufferSnap {
                slots_used: occ.slots_used as u64,
                slots_total: occ.slots_total as u64,
                high_water: occ.high_water as u64,
                slot_bytes: self.info.slot_bytes,
            },
            twin: tw.clone(),
            wan: WanCounters {
                send_buffered_bytes: ws.send_buffered,
                recv_buffered_bytes: ws.recv_buffered,
                flows_live: ws.flows as u64,
                recv_flows_live: ws.recv_flows as u64,
                unknown_source: self.socks.unknown_source,
                foreign_source: self.socks.foreign_source,
                socket_send_errors: self.socks.send_errors,
                socket_recv_errors: self.socks.recv_errors(),
                ..WanCounters::copied_from(&ws)
            },
            paths: ws
                .paths
                .iter()
                .zip(&self.info.paths)
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
                connected: site.is_connected(),
                generation: ws.generation,
                dc_rx_accepted: dcc.rx_accepted,
                dc_tx_packets: dcc.tx_packets,
                twin_msgs_out: tw.msgs_out,
                twin_msgs_in: tw.msgs_in,
                wan_packets_sent: ws.packets_sent,
                wan_packets_received: ws.packets_received,
                handoff_out: dcc.handoff_out,
                handoff_in: dcc.handoff_in,
                handoff_dropped: dcc.handoff_dropped,
                slots_used: occ.slots_used as u64,
                alarm: self.connect.alarm().to_owned(),
                dc_mode: dcs.mode.into(),
                turns: self.turns,
                xdp_tx_in_place: dcs.xdp.tx_in_place,
                xdp_tx_busy_copied: dcs.xdp.tx_busy_copied,
                xdp_lend_empty: site.wan().pool_stats().lend_empty,
                xdp_rx_in_place: dcs.xdp.rx_in_place,
                xdp_rx_gathered_break: dcs.xdp.rx_gathered_break,
                xdp_rx_gathered_full: dcs.xdp.rx_gathered_full,
                xdp_tx_held: dcs.xdp.tx_held,
                xdp_tx_unresolved_dropped: dcs.xdp.tx_no_neighbour,
            }],
        }
    }
}

/// The shutdown line of one packet socket's system-call counters.
fn log_io_stats(side: &str, socket: &str, how: &str, st: &soya_io::sys::udpio::IoStats) {
    tracing::info!(side, socket, how, stats = ?st, "socket i/o");
}
