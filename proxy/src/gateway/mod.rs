//! The gateway daemon: `soya gateway --config site.toml`.
//!
//! It wraps the sans-IO [`Site`](soya_proto::site::Site) (the QP engine with its
//! pseudo-ACKs, deep buffer and re-injection, the authenticated multipath
//! WAN transport to the twin, and the glue between them) with real sockets
//! and a real clock: one site per shard.
//!
//! # Threads
//!
//! - **device loops** (`soya-device`, `soya-device-1`, …, [`device`]): one
//!   per shard ([`shard`], `gateway.shards`), each the only thread that
//!   touches its state machines and its packet sockets (DC backend, one UDP
//!   socket per `wan.bind` at port + shard). ppoll(2) on all of them plus
//!   an eventfd, with the earliest engine / transport / pacing deadline as
//!   timeout. Host pairs are hashed to shards; a DC packet read by another
//!   shard is handed over through a bounded SPSC ring.
//! - **control plane** (`soya-control`, [`control_plane`]): one thread
//!   driving a current-thread tokio runtime, off the data path. Its tasks:
//!   `/metrics` on `control.metrics` ([`metrics`]: prometheus-client over
//!   hyper), the Unix socket `control.socket` that `soya status` reads
//!   ([`control`]) and, in the daemon, the signals ([`signals`]: SIGTERM /
//!   SIGINT drain, SIGHUP runs the reload).
//!
//! The control plane never reads the state machines: it asks the device
//! loops for a [`Snapshot`] (a counter bump and an eventfd write; the loops
//! answer between two turns) and waits for it on a blocking-pool thread.
//!
//! # Modules
//!
//! [`ports`] (the I/O traits a shard's turn is written against),
//! [`backend`] (DC side: udp lab, tun, xdp; one file each behind the
//! [`ports`] traits), [`wanio`] (WAN sockets),
//! [`turn`] (one turn of a device loop), [`device`], [`snapshot`],
//! [`metrics`], [`control`], [`control_plane`], [`reload`] (SIGHUP diff), [`logging`],
//! [`signals`], [`soya_io::sys`] (the system calls).
//!
//! # Metrics (`/metrics`, OpenMetrics / Prometheus text)
//!
//! Every metric (name, type, help, labels, and how it is read from the
//! snapshot) is declared once, in [`metrics::table::METRICS`];
//! `soya metrics-spec --json` prints it (packaging/metrics-spec.json), and
//! docs/operations.md explains them for operators. Counters are sums over
//! the shards; with several shards the per-path series also carry the label
//! `shard`. Per flow (labels `half`, `role`), only the
//! [`snapshot::MAX_FLOWS`] busiest halves are exported.
//!
//! # Restarts and loss of the twin
//!
//! A new session generation at the twin, a CLOSE from it, or no WAN path
//! answering for `wan.twin_timeout` means whatever it held is gone: the
//! site fails every flow through it toward its application
//! ([`soya_proto::site`], docs/semantics.md).

pub mod backend;
pub mod connect_alarm;
pub mod control;
pub mod control_plane;
pub mod device;
pub mod health;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod ports;
pub mod reload;
pub mod shard;
pub mod signals;
pub mod snapshot;
pub mod turn;
pub use soya_io::sys::udpio;
pub mod wanio;
/// The AF_XDP backend lives in the I/O crate (it holds raw memory).
pub use soya_io::xdp;

use std::fmt;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use soya_config::{DcBackend, SiteConfig, WanSecurity};

use soya_proto::site::{Site, SiteParams};
use soya_proto::time::Time;
use soya_proto::wan::{aes_hardware, CcKind, CipherOffer, CipherPolicy};

pub use reload::ReloadReport;
pub use snapshot::Snapshot;

/// What the device loop is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Run,
    /// Stop taking new requests, flush, exit (SIGTERM / SIGINT).
    Drain,
    /// Stop at once, like a crash: no CLOSE to the twin, nothing flushed.
    Abort,
}

/// State shared between the device loops (one per shard) and the other
/// threads.
pub struct Shared {
    command: AtomicU8,
    /// Per shard: the eventfd its loop polls (commands, snapshot requests,
    /// packets handed over by another shard).
    wakes: Vec<soya_io::sys::EventFd>,
    snap_req: AtomicU64,
    /// Per shard: the last request served and its snapshot.
    snap: Mutex<Vec<(u64, Option<Snapshot>)>>,
    cv: Condvar,
    /// Device loops still running.
    running: AtomicUsize,
    /// Every device loop has ended; servers stop.
    pub(crate) stopping: AtomicBool,
    /// The same, for the control plane's tasks.
    stopped_tx: tokio::sync::watch::Sender<bool>,
    /// Reloads handed to the device loops, and their answers
    /// ([`reload::apply`]).
    pub(crate) reloads: Mutex<reload::Slots>,
    /// The configuration the gateway runs (what a reload compares with).
    pub(crate) config: Mutex<Option<SiteConfig>>,
    /// The last reload's report (the control socket's `last-reload`).
    pub(crate) last_reload: Mutex<Option<ReloadReport>>,
}

impl Shared {
    fn new(shards: usize) -> std::io::Result<Shared> {
        Ok(Shared {
            command: AtomicU8::new(0),
            wakes: (0..shards)
                .map(|_| soya_io::sys::EventFd::new())
                .collect::<Result<_, _>>()?,
            snap_req: AtomicU64::new(0),
            snap: Mutex::new(vec![(0, None); shards]),
            cv: Condvar::new(),
            running: AtomicUsize::new(shards),
            stopping: AtomicBool::new(false),
            stopped_tx: tokio::sync::watch::Sender::new(false),
            reloads: Mutex::new(reload::Slots::new(shards)),
            config: Mutex::new(None),
            last_reload: Mutex::new(None),
        })
    }

    /// Shards of this gateway.
    pub fn shards(&self) -> usize {
        self.wakes.len()
    }

    fn wake_all(&self) {
        for w in &self.wakes {
            w.wake();
        }
    }

    fn command(&self) -> Command {
        match self.command.load(Ordering::Acquire) {
            0 => Command::Run,
            1 => Command::Drain,
            _ => Command::Abort,
        }
    }

    fn set_command(&self, c: Command) {
        let v = match c {
            Command::Run => 0,
            Command::Drain => 1,
            Command::Abort => 2,
        };
        // Never downgrade (an abort stays an abort).
        self.command.fetch_max(v, Ordering::AcqRel);
        self.wake_all();
    }

    fn snap_served(&self, shard: usize) -> u64 {
        self.snap
            .lock()
            .map_or(0, |g| g.get(shard).map_or(0, |x| x.0))
    }

    fn publish(&self, shard: usize, req: u64, s: Snapshot) {
        if let Ok(mut g) = self.snap.lock() {
            if let Some(slot) = g.get_mut(shard) {
                slot.0 = slot.0.max(req);
                slot.1 = Some(s);
            }
        }
        self.cv.notify_all();
    }

    /// One device loop ended (its last snapshot is published).
    fn shard_stopped(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) <= 1 {
            self.stopped();
        }
    }

    fn stopped(&self) {
        self.stopping.store(true, Ordering::Release);
        self.stopped_tx.send_replace(true);
        self.cv.notify_all();
    }

    /// Turns true when every device loop has ended.
    pub(crate) fn stopped_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stopped_tx.subscribe()
    }

    /// A fresh snapshot of every shard, merged (the last ones once they
    /// ended), waiting at most `timeout`.
    pub fn snapshot(&self, timeout: Duration) -> Option<Snapshot> {
        let ticket = self.snap_req.fetch_add(1, Ordering::AcqRel) + 1;
        self.wake_all();
        let g = self.snap.lock().ok()?;
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |v| {
                v.iter().any(|(served, _)| *served < ticket)
                    && !self.stopping.load(Ordering::Acquire)
            })
            .ok()?;
        let parts: Vec<Snapshot> = g.iter().filter_map(|(_, s)| s.clone()).collect();
        drop(g);
        snapshot::merge(parts)
    }
}

/// How the device loop ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Drain finished: nothing pseudo-ACKed left undelivered; the twin was
    /// told to keep its flows for the next start (CLOSE "restart").
    Drained,
    /// Drain gave up after [`device::DRAIN_TIMEOUT`] with data left.
    DrainTimeout,
    Aborted,
    Failed(String),
}

/// What [`Gateway::wait`] reports.
#[derive(Clone, Debug)]
pub struct RunSummary {
    pub outcome: RunOutcome,
    pub elapsed: Duration,
    pub buffered_slots_left: u64,
    pub waiting_left: u64,
    pub wan_bytes_left: u64,
    pub snapshot: Snapshot,
}

impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.snapshot;
        let how = match &self.outcome {
            RunOutcome::Drained => "drained cleanly (the twin keeps its flows for the next start, \
                                     up to wan.twin_timeout)"
                .to_string(),
            RunOutcome::DrainTimeout => format!(
                "drain TIMED OUT: {} buffered packets, {} waiting messages, {} WAN bytes abandoned",
                self.buffered_slots_left, self.waiting_left, self.wan_bytes_left
            ),
            RunOutcome::Aborted => "aborted".to_string(),
            RunOutcome::Failed(e) => format!("FAILED: {e}"),
        };
        writeln!(
            f,
            "soya gateway {}: {how} after {:.1} s",
            s.site,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(
            f,
            "  dc: rx {} pkts (accepted {}, acl {}, malformed {}), tx {} pkts",
            s.dc.rx_packets,
            s.dc.rx_accepted,
            s.dc.rx_acl_source + s.dc.rx_acl_destination,
            s.dc.rx_malformed,
            s.dc.tx_packets
        )?;
        writeln!(
            f,
            "  twin: msgs out {}, in {}; datagrams out {}, in {}; flows failed on restart {}",
            s.twin.msgs_out,
            s.twin.msgs_in,
            s.twin.datagrams_out,
            s.twin.datagrams_in,
            s.twin.flows_failed_on_restart
        )?;
        write!(
            f,
            "  wan: packets sent {}, received {}, lost {}; auth failures {}; buffer high water {} slots",
            s.wan.packets_sent,
            s.wan.packets_received,
            s.wan.packets_lost,
            s.wan.auth_failures,
            s.buffer.high_water
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("dc backend: {0}")]
    Backend(std::io::Error),
    #[error("wan: {0}")]
    Wan(std::io::Error),
    #[error("wan key: {0}")]
    Key(String),
    #[error("metrics listener {addr}: {err}")]
    Metrics {
        addr: SocketAddr,
        err: std::io::Error,
    },
    #[error("control socket {path}: {err}")]
    Control { path: String, err: std::io::Error },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Environment variable choosing the packet I/O: `gso` (default: GSO / GRO
/// where the kernel has them, sendmmsg / recvmmsg otherwise), `mmsg`,
/// `single` (one datagram per system call) or `uring` (builds with the
/// `io-uring` feature). `soya gateway --io MODE` sets it.
pub const IO_ENV: &str = "SOYA_IO";

/// The packet I/O mode from [`IO_ENV`].
pub fn io_mode() -> Result<udpio::IoMode, GatewayError> {
    match std::env::var(IO_ENV) {
        Err(_) => Ok(udpio::IoMode::Gso),
        Ok(v) if v.is_empty() => Ok(udpio::IoMode::Gso),
        Ok(v) => match udpio::IoMode::parse(&v) {
            Some(m) if m.available() => Ok(m),
            Some(_) => Err(GatewayError::Io(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!(
                    "{IO_ENV}={v}: this build has no io_uring backend (cargo feature `io-uring`)"
                ),
            ))),
            None => Err(GatewayError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{IO_ENV}={v}: expected gso, mmsg, single or uring"),
            ))),
        },
    }
}

/// The 32-byte WAN key: the first 32 bytes of the key file's material
/// (`soya_config::read_key_file` guarantees at least 32); `None` in
/// insecure lab mode.
pub fn wan_key(cfg: &SiteConfig) -> Result<Option<[u8; 32]>, GatewayError> {
    match &cfg.wan.security {
        WanSecurity::Insecure { .. } | WanSecurity::Identity => Ok(None),
        WanSecurity::PreSharedKey { key_file } => {
            let k = soya_config::read_key_file(key_file)
                .map_err(|e| GatewayError::Key(e.to_string()))?;
            let mut key = [0u8; 32];
            let Some(first) = k.get(..32) else {
                return Err(GatewayError::Key(format!(
                    "{}: fewer than 32 bytes of key material",
                    key_file.display()
                )));
            };
            key.copy_from_slice(first);
            Ok(Some(key))
        }
    }
}

/// The identity keys (`wan.private_key_file`, `wan.twin_public_key`), if
/// configured: the private key read from its file (checked as
/// `soya_config::read_private_key_file` does).
pub fn wan_identity(cfg: &SiteConfig) -> Result<Option<soya_proto::wan::Identity>, GatewayError> {
    let Some(id) = &cfg.wan.identity else {
        return Ok(None);
    };
    let private = soya_config::read_private_key_file(&id.private_key_file)
        .map_err(|e| GatewayError::Key(e.to_string()))?;
    Ok(Some(soya_proto::wan::Identity {
        private,
        peer_public: id.twin_public_key,
    }))
}

/// `wan.cipher` in the startup summary, with what `auto` offers on this CPU.
fn cipher_summary(policy: CipherPolicy) -> String {
    match policy {
        CipherPolicy::Only(c) => format!("{c} only"),
        CipherPolicy::Auto => format!(
            "auto ({}; this CPU {} AES hardware)",
            CipherOffer::new(policy, aes_hardware()),
            if aes_hardware() { "has" } else { "lacks" }
        ),
    }
}

fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 && n % (1 << 30) == 0 {
        format!("{} GiB", n >> 30)
    } else if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else {
        format!("{n} B")
    }
}

/// The one-screen startup summary (also `soya gateway --check`).
pub fn startup_summary(cfg: &SiteConfig) -> String {
    let mut s = String::new();
    let insecure = matches!(cfg.wan.security, WanSecurity::Insecure { .. });
    if insecure {
        let _ = writeln!(
            s,
            "!!! INSECURE WAN (wan.insecure = true): plaintext, unauthenticated. LAB USE ONLY. !!!"
        );
    }
    let _ = writeln!(
        s,
        "Sōya gateway \"{}\" (soya {}, config {})",
        cfg.site,
        env!("CARGO_PKG_VERSION"),
        cfg.origin
    );
    let backend = match &cfg.dc.backend {
        DcBackend::Udp { listen } => {
            format!("udp lab backend on {listen} (IP-in-UDP, no root needed)")
        }
        DcBackend::Tun { interface } => format!(
            "tun device {interface} (MTU {}; route the remote prefixes to it)",
            backend::TUN_MTU
        ),
        DcBackend::Xdp { interface } => format!(
            "xdp on {interface} (AF_XDP, one socket per shard; the XDP program steers \
             local -> remote prefixes)"
        ),
    };
    let list = |v: &[soya_config::Prefix]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(s, "  dc:      {backend}");
    let _ = writeln!(
        s,
        "           local {}  <->  remote {}",
        list(&cfg.dc.local_prefixes),
        list(&cfg.dc.remote_prefixes)
    );
    let w = SiteParams::from_config(cfg, None).wan;
    let security = match &cfg.wan.security {
        WanSecurity::Insecure { .. } => "INSECURE (plaintext lab mode)".to_string(),
        WanSecurity::PreSharedKey { key_file } if cfg.wan.identity.is_none() => format!(
            "PSK-only: pre-shared key {} (first 32 bytes, no forward secrecy), cipher {}",
            key_file.display(),
            cipher_summary(w.cipher)
        ),
        WanSecurity::PreSharedKey { key_file } => format!(
            "identity keys ({}), pre-shared key {} mixed in, cipher {}",
            soya_proto::wan::HANDSHAKE_PATTERN,
            key_file.display(),
            cipher_summary(w.cipher)
        ),
        WanSecurity::Identity => format!(
            "identity keys ({}), cipher {}",
            soya_proto::wan::HANDSHAKE_PATTERN,
            cipher_summary(w.cipher)
        ),
    };
    let _ = writeln!(
        s,
        "  wan:     role {}, congestion control {}, max datagram {} B, {security}",
        if w.is_client { "client" } else { "server" },
        match w.cc {
            CcKind::FixedRate => "fixed-rate",
            CcKind::Bbr => "bbr",
        },
        w.max_datagram
    );
    for p in &cfg.wan.paths {
        let rate = p
            .rate_bps
            .map_or_else(|| "no rate cap".into(), control::rate);
        let rtt = p.rtt.map_or_else(
            || "rtt ?".into(),
            |r| format!("rtt {:.2} ms", r.as_secs_f64() * 1e3),
        );
        let _ = writeln!(
            s,
            "    path {:<14} {} -> {}  weight {}  {rate}  {rtt}  dscp {}",
            p.name, p.bind, p.remote, p.weight, p.dscp
        );
    }
    let b = &cfg.buffer;
    let _ = writeln!(
        s,
        "  buffer:  {} = {} slots x {} B, per-flow quota {}, WAN flow window {}",
        human_bytes(b.bytes),
        b.slots,
        b.slot_bytes,
        b.per_flow_quota.map_or_else(|| "none".into(), human_bytes),
        human_bytes(w.flow_window_bytes)
    );
    let pa = &cfg.pseudo_ack;
    let _ = writeln!(
        s,
        "  policy:  pseudo_ack {}, coalesce {} pkts / {} us, CNPs on backpressure: {}",
        pa.policy,
        pa.coalesce_packets,
        pa.coalesce.as_micros(),
        if pa.cnp_on_backpressure { "yes" } else { "no" }
    );
    let _ = writeln!(
        s,
        "  control: metrics {}, socket {}",
        cfg.control
            .metrics
            .map_or_else(|| "off".into(), |a| format!("http://{a}/metrics")),
        cfg.control.socket.display()
    );
    let _ = write!(s, "  log:     {}, {}", cfg.log.format, cfg.log.level);
    s
}

/// Drain and abort from another thread (a signal handler's helper).
#[derive(Clone)]
pub struct Control(Arc<Shared>);

impl Control {
    pub fn drain(&self) {
        self.0.set_command(Command::Drain);
    }
    pub fn abort(&self) {
        self.0.set_command(Command::Abort);
    }
    pub fn snapshot(&self, timeout: Duration) -> Option<Snapshot> {
        self.0.snapshot(timeout)
    }
    /// Applies a re-read configuration (SIGHUP): [`reload::apply`].
    pub fn reload(&self, new: &SiteConfig) -> ReloadReport {
        reload::apply(&self.0, new)
    }
}

/// A running gateway.
pub struct Gateway {
    shared: Arc<Shared>,
    /// One device loop per shard, by index.
    devices: Vec<JoinHandle<RunSummary>>,
    servers: Vec<JoinHandle<()>>,
    metrics_addr: Option<SocketAddr>,
    socket_path: PathBuf,
    site: String,
}

impl Gateway {
    /// Opens every socket and device, then starts the threads. Errors name
    /// what could not be opened.
    pub fn start(cfg: &SiteConfig) -> Result<Gateway, GatewayError> {
        Gateway::start_with(cfg, None)
    }

    /// [`Self::start`], and with `reload` the daemon's signals: SIGTERM or
    /// SIGINT drains (a second one aborts), SIGHUP runs `reload`. The
    /// handlers are installed before the control socket exists (whoever
    /// sees it may signal us).
    pub fn start_with(
        cfg: &SiteConfig,
        reload: Option<signals::Reload>,
    ) -> Result<Gateway, GatewayError> {
        let key = wan_key(cfg)?;
        let identity = wan_identity(cfg)?;
        if key.is_none() && identity.is_none() {
            tracing::warn!("WAN is INSECURE (wan.insecure = true): plaintext and unauthenticated; lab use only");
        }
        for w in cfg.warnings() {
            tracing::warn!("{w}");
        }
        let io = io_mode()?;
        let shards = usize::from(cfg.gateway.shards.resolve_here());
        let dcs = backend::DcIo::open_shards(
            &cfg.dc.backend,
            io,
            shards,
            &cfg.dc.local_prefixes,
            &cfg.dc.remote_prefixes,
            cfg.buffer.slots,
        )
        .map_err(GatewayError::Backend)?;
        let mut sites = Vec::with_capacity(shards);
        for i in 0..shards {
            let scfg = shard::shard_site(cfg, i as u16, shards as u16);
            let mut params = SiteParams::from_config(&scfg, key);
            params.wan.identity = identity.clone();
            params.wan.hello_context = shard::hello_context(i as u16, shards as u16);
            let (socks, warnings) = wanio::WanSockets::open(&scfg.wan, io, params.wan.max_datagram)
                .map_err(GatewayError::Wan)?;
            for w in warnings {
                tracing::warn!("{w}");
            }
            sites.push((scfg, params, socks));
        }
        let control_plane = control_plane::ControlPlane::new(reload)?;
        let mut metrics_listener = None;
        let mut metrics_addr = None;
        if let Some(addr) = cfg.control.metrics {
            let l = metrics::bind(addr).map_err(|err| GatewayError::Metrics { addr, err })?;
            metrics_addr = l.local_addr().ok();
            metrics_listener = Some(l);
        }
        let control_listener =
            control::bind(&cfg.control.socket).map_err(|err| GatewayError::Control {
                path: cfg.control.socket.display().to_string(),
                err,
            })?;

        let epoch = Instant::now();
        let shared = Arc::new(Shared::new(shards)?);
        if let Ok(mut r) = shared.config.lock() {
            *r = Some(cfg.clone());
        }
        let (mut txs, mut rxs) = shard::queues(shards, backend::DC_MAX_PACKET);
        let mut devs = Vec::with_capacity(shards);
        for (i, ((dc, reads_dc), (scfg, params, socks))) in dcs.into_iter().zip(sites).enumerate() {
            if device::session_nonce().is_none() {
                return Err(GatewayError::Io(std::io::Error::other(
                    "cannot draw a session nonce from the kernel's random source",
                )));
            }
            let mut site = Site::new(params, Time::ZERO, Box::new(device::session_nonce));
            if let Some(source) = ports::DcControl::lend_source(&dc) {
                // Packets from the WAN are decoded into the UMEM they are
                // sent toward the DC from (issue 16: one copy per packet).
                site.set_lender(source);
            }
            let paths = scfg.wan.paths.iter().map(device::PathMeta::of).collect();
            let ctx = device::ShardCtx {
                index: i,
                count: shards,
                reads_dc,
                tx: std::mem::take(&mut txs[i]),
                rx: std::mem::take(&mut rxs[i]),
            };
            let info = device::DeviceInfo {
                site: cfg.site.clone(),
                insecure: key.is_none(),
                policy: cfg.pseudo_ack.policy.to_string(),
                slot_bytes: u64::from(cfg.buffer.slot_bytes),
                paths,
            };
            devs.push(device::Device::new(
                info,
                site,
                dc,
                socks,
                shared.clone(),
                epoch,
                ctx,
            ));
        }
        let servers = vec![control_plane.start(
            control_plane::Listeners {
                metrics: metrics_listener,
                control: control_listener,
                control_path: cfg.control.socket.clone(),
            },
            shared.clone(),
        )?];
        if shards > 1 {
            tracing::info!(
                shards,
                "{shards} shards (device threads): host pairs are spread over them by a hash of \
                 the two addresses; shard i uses wan ports + i; the twin must run {shards} too"
            );
        }
        let mut devices = Vec::with_capacity(shards);
        for (i, dev) in devs.into_iter().enumerate() {
            let name = if i == 0 {
                "soya-device".to_string()
            } else {
                format!("soya-device-{i}")
            };
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || dev.run())
            {
                Ok(h) => devices.push(h),
                Err(e) => {
                    shared.set_command(Command::Abort);
                    for h in devices {
                        let _ = h.join();
                    }
                    shared.stopped();
                    return Err(e.into());
                }
            }
        }
        Ok(Gateway {
            shared,
            devices,
            servers,
            metrics_addr,
            socket_path: cfg.control.socket.clone(),
            site: cfg.site.clone(),
        })
    }

    pub fn site(&self) -> &str {
        &self.site
    }

    /// Where `/metrics` is served, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn socket_path(&self) -> &std::path::Path {
        &self.socket_path
    }

    pub fn control(&self) -> Control {
        Control(self.shared.clone())
    }

    /// Starts a drain (what SIGTERM does).
    pub fn drain(&self) {
        self.shared.set_command(Command::Drain);
    }

    /// A fresh snapshot (at most 2 s wait).
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.shared.snapshot(Duration::from_secs(2))
    }

    /// Whether every device loop has ended.
    pub fn is_finished(&self) -> bool {
        self.devices.iter().all(JoinHandle::is_finished)
    }

    /// Shards (device threads) of this gateway.
    pub fn shards(&self) -> usize {
        self.shared.shards()
    }

    /// Waits for the device loop to end (after [`Self::drain`] or
    /// [`Self::abort`], or a failure) and for the servers to stop.
    pub fn wait(mut self) -> RunSummary {
        self.join()
    }

    /// Stops at once, like a crash (no CLOSE to the twin, nothing flushed),
    /// and waits for the threads.
    pub fn abort(mut self) -> RunSummary {
        self.shared.set_command(Command::Abort);
        self.join()
    }

    fn join(&mut self) -> RunSummary {
        let failed = |why: &str| RunSummary {
            outcome: RunOutcome::Failed(why.into()),
            elapsed: Duration::ZERO,
            buffered_slots_left: 0,
            waiting_left: 0,
            wan_bytes_left: 0,
            snapshot: Snapshot::default(),
        };
        let mut parts: Vec<RunSummary> = self
            .devices
            .drain(..)
            .map(|d| d.join().unwrap_or_else(|_| failed("device loop panicked")))
            .collect();
        self.shared.stopped();
        for s in self.servers.drain(..) {
            let _ = s.join();
        }
        if parts.len() <= 1 {
            return parts.pop().unwrap_or(RunSummary {
                outcome: RunOutcome::Aborted,
                ..failed("")
            });
        }
        // The worst outcome of any shard, the sums of what was left.
        let rank = |o: &RunOutcome| match o {
            RunOutcome::Drained => 0,
            RunOutcome::Aborted => 1,
            RunOutcome::DrainTimeout => 2,
            RunOutcome::Failed(_) => 3,
        };
        let mut outcome = RunOutcome::Drained;
        for (i, p) in parts.iter().enumerate() {
            if rank(&p.outcome) > rank(&outcome) {
                outcome = match &p.outcome {
                    RunOutcome::Failed(e) => RunOutcome::Failed(format!("shard {i}: {e}")),
                    o => o.clone(),
                };
            }
        }
        RunSummary {
            outcome,
            elapsed: parts.iter().map(|p| p.elapsed).max().unwrap_or_default(),
            buffered_slots_left: parts.iter().map(|p| p.buffered_slots_left).sum(),
            waiting_left: parts.iter().map(|p| p.waiting_left).sum(),
            wan_bytes_left: parts.iter().map(|p| p.wan_bytes_left).sum(),
            snapshot: snapshot::merge(parts.into_iter().map(|p| p.snapshot).collect())
                .unwrap_or_default(),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if !self.devices.is_empty() {
            self.shared.set_command(Command::Abort);
            let _ = self.join();
        }
    }
}
