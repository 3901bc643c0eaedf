//! The client: connects, negotiates, runs the workload (`tx_depth` work
//! requests outstanding per QP), prints progress, collects the server's
//! summary and reports.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use soya_proto::roce::ip::ROCE_PORT;
use soya_proto::roce::Psn;
use soya_proto::time::Time;

use super::endpoint::Endpoint;
use super::exchange::{Control, Msg, QpInfo, DEFAULT_PORT, DRAIN_MAX, VERSION};
use super::report::{LatencyReport, PacketCounters, PerfReport};
use super::workload::{Layout, Op, QpDriver};
use super::{
    qp_config, random_psn, random_qpn_base, random_rkey, PerfError, ProgressTo, Shape, Transport,
    MEM_BASE, VERBS_UNAVAILABLE,
};
use crate::rc::{CompletionStatus, QpAddr, RcQp, WrOpcode};

/// How long a run goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunLimit {
    /// Exactly this many messages per QP.
    Iters(u64),
    /// Post new work for this long, then wait for what is outstanding.
    Duration(Duration),
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The server's control (TCP) address.
    pub server: SocketAddr,
    /// This side's RoCE address (bound with `roce_port`).
    pub bind_ip: IpAddr,
    /// UDP port of this side's socket (4791 for real RoCEv2).
    pub roce_port: u16,
    pub transport: Transport,
    pub op: Op,
    pub size: u32,
    pub tx_depth: u32,
    /// PSNs the requester may have outstanding per QP
    /// ([`crate::rc::QpConfig::max_unacked_psns`]).
    pub window: u32,
    pub qps: u32,
    pub mtu: usize,
    pub limit: RunLimit,
    /// Record post-to-completion latency of every message.
    pub latency: bool,
    pub progress: ProgressTo,
    /// Keep trying to reach the server this long.
    pub connect_timeout: Duration,
    /// Give up when work is outstanding and nothing completes for this long.
    pub stall_timeout: Duration,
    /// Send with UDP GSO (runs of equal-size datagrams per system call;
    /// faster, but the segments' IPv4 IDs then differ from what the ICRC
    /// covers, so only soya-perf itself verifies them).
    pub gso: bool,
    /// Busy-poll this long after the last activity before sleeping.
    pub busy_poll: Duration,
    /// IP-in-UDP mode (through a gateway or a relay); `None`: RoCEv2/UDP.
    pub tunnel: Option<super::endpoint::Tunnel>,
    /// `wait-send`: how long the server waits after its first SEND before
    /// the second one (the one the client then waits for).
    pub send_after: Duration,
    /// Stop posting new work as soon as this file exists (checked every
    /// 20 ms), then wait for what is outstanding, as at the end of
    /// `limit`: a test ends a stream at an event, not after a guessed time.
    pub stop_file: Option<std::path::PathBuf>,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            server: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), DEFAULT_PORT),
            bind_ip: Ipv4Addr::new(127, 0, 0, 2).into(),
            roce_port: ROCE_PORT,
            transport: Transport::Udp,
            op: Op::Write,
            size: 65_536,
            tx_depth: 128,
            window: super::DEFAULT_WINDOW,
            qps: 1,
            mtu: 4096,
            limit: RunLimit::Duration(Duration::from_secs(5)),
            latency: false,
            progress: ProgressTo::Off,
            connect_timeout: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(5),
            gso: false,
            busy_poll: Duration::ZERO,
            tunnel: None,
            send_after: Duration::from_secs(1),
            stop_file: None,
        }
    }
}

impl ClientConfig {
    /// The shape of the run this configuration asks the server for.
    pub fn shape(&self) -> Shape {
        Shape {
            op: self.op,
            size: self.size,
            qps: self.qps,
            tx_depth: self.tx_depth,
            mtu: self.mtu,
        }
    }

    pub fn validate(&self) -> Result<(), PerfError> {
        if self.transport == Transport::Verbs {
            return Err(PerfError::Usage(VERBS_UNAVAILABLE.into()));
        }
        self.shape().validate().map_err(PerfError::Usage)?;
        if self.op == Op::WaitSend && matches!(self.limit, RunLimit::Iters(_)) {
            return Err(PerfError::Usage(
                "--op wait-send waits for two SENDs; --duration bounds the wait, --iters has no meaning".into(),
            ));
        }
        match self.limit {
            RunLimit::Iters(0) => Err(PerfError::Usage("--iters must be at least 1".into())),
            RunLimit::Duration(d) if d.is_zero() => {
                Err(PerfError::Usage("--duration must be positive".into()))
            }
            _ => Ok(()),
        }
    }
}

fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, PerfError> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(PerfError::Failed(format!(
                    "cannot reach the soya-perf server at {addr}: {e}"
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn failed(what: &str, e: io::Error) -> PerfError {
    PerfError::Failed(format!("{what}: {e}"))
}

/// Runs one client session against a server; blocks until it is over.
/// `Ok` whenever the run took place (look at [`PerfReport::ok`]).
pub fn run_client(cfg: &ClientConfig) -> Result<PerfReport, PerfError> {
    cfg.validate()?;
    let layout = Layout::new(MEM_BASE, cfg.size);
    let local_sock = SocketAddr::new(cfg.bind_ip, cfg.roce_port);
    let mut ep = Endpoint::open(local_sock, cfg.gso, cfg.busy_poll, cfg.tunnel)?;
    let my_ip = ep.roce_ip();
    let mut ctrl = Control::new(connect(cfg.server, cfg.connect_timeout)?);

    let base = random_qpn_base(cfg.qps);
    let mine: Vec<QpInfo> = (0..cfg.qps)
        .map(|i| QpInfo {
            qpn: base + i,
            psn: random_psn().value(),
            rkey: random_rkey(),
            vaddr: layout.base,
            len: layout.mem_size() as u64,
        })
        .collect();
    ctrl.send(&Msg::Hello {
        version: VERSION,
        shape: cfg.shape(),
        ip: my_ip,
        port: ep.local_addr().port(),
        qp: mine.clone(),
        send_after_ms: (cfg.op == Op::WaitSend).then_some(cfg.send_after.as_millis() as u64),
    })
    .map_err(|e| failed("sending the hello", e))?;
    let (peer_ip, peer_port, theirs) = match ctrl
        .recv(Duration::from_secs(10))
        .map_err(|e| failed("waiting for the server's answer", e))?
    {
        Msg::Accept { ip, port, qp } => (ip, port, qp),
        Msg::Error { message } => {
            return Err(PerfError::Failed(format!("server refused: {message}")))
        }
        m => return Err(PerfError::Failed(format!("unexpected answer {m:?}"))),
    };
    if theirs.len() != mine.len() {
        return Err(PerfError::Failed(format!(
            "server offered {} QPs, {} asked",
            theirs.len(),
            mine.len()
        )));
    }
    let mut qps = Vec::with_capacity(mine.len());
    for (m, t) in mine.iter().zip(&theirs) {
        let qp = RcQp::new(
            super::with_window(qp_config(cfg.mtu, layout, m.rkey), cfg.window),
            QpAddr {
                ip: my_ip,
                qpn: m.qpn,
            },
            QpAddr {
                ip: peer_ip,
                qpn: t.qpn,
            },
            Psn::new(m.psn),
            Psn::new(t.psn),
        )
        .map_err(|e| PerfError::Failed(format!("QP setup: {e}")))?;
        let mut qp = qp;
        if cfg.op == Op::WaitSend {
            qp.post_recv(WAIT_SENDS as u32);
        }
        qps.push(qp);
    }
    ep.start_session(SocketAddr::new(peer_ip, peer_port), qps, base);

    let run = if cfg.op == Op::WaitSend {
        wait_for_sends(cfg, &mut ep)
    } else {
        drive(cfg, &mut ep, layout, &theirs)
    };

    // Tell the server, collect its summary.
    let mut errors = run.errors;
    let placed: u64 = ep
        .qps
        .iter()
        .map(|q| q.stats().bytes_completed_writes_sends())
        .sum();
    let done = if matches!(cfg.op, Op::Write | Op::Send) && placed > 0 {
        Msg::DoneAfter { bytes: placed }
    } else {
        Msg::Done
    };
    let server = match ctrl.send(&done) {
        Err(e) => {
            errors.push(format!("telling the server we are done: {e}"));
            None
        }
        // The server may wait up to its drain timeout (DRAIN_MAX by
        // default) before it answers.
        Ok(()) => match ctrl.recv(DRAIN_MAX + Duration::from_secs(5)) {
            Ok(Msg::Summary { report }) => Some(report),
            Ok(m) => {
                errors.push(format!("unexpected message instead of the summary: {m:?}"));
                None
            }
            Err(e) => {
                errors.push(format!("no summary from the server: {e}"));
                None
            }
        },
    };
    let qps = ep.end_session();
    let mut lat = run.lat;
    let failed_at = run.failed_at;
    let mut r = report(
        cfg,
        &ep,
        &qps,
        &run.drivers,
        run.start,
        errors,
        server,
        &mut lat,
        SocketAddr::new(peer_ip, peer_port),
    );
    r.failed_at_unix_s = failed_at
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64());
    Ok(r)
}

/// SENDs a `wait-send` client waits for per QP: the server's first (which
/// teaches every gateway on the path the flow and its PSNs, as an
/// application's first exchange would) and the one it sends `send_after`
/// later.
pub const WAIT_SENDS: u64 = 2;

/// `wait-send`: nothing posted but receives; wait until every QP received
/// [`WAIT_SENDS`] SENDs (success), or a receive completes in error / a QP
/// enters the error state (failure: the error the application would see),
/// or the wait limit passes.
fn wait_for_sends(cfg: &ClientConfig, ep: &mut Endpoint) -> Run {
    let start = ep.now();
    let limit = match cfg.limit {
        RunLimit::Duration(d) => d,
        RunLimit::Iters(_) => cfg.send_after + Duration::from_secs(30),
    };
    // The receives posted are this mode's work requests.
    let mut drivers: Vec<QpDriver> = (0..cfg.qps)
        .map(|_| {
            let mut d = QpDriver::new(false);
            d.posted = WAIT_SENDS;
            d
        })
        .collect();
    let mut errors = Vec::new();
    let mut failed_at = None;
    cfg.progress.line(&format!(
        "waiting for {WAIT_SENDS} SENDs per QP from the server (nothing outstanding here), at most {limit:?}"
    ));
    loop {
        let now = ep.now();
        let mut moved = ep.receive(now) > 0;
        ep.timers(now);
        for (i, (qp, d)) in ep.qps.iter_mut().zip(&mut drivers).enumerate() {
            while let Some(c) = qp.poll_recv_completion() {
                moved = true;
                if c.status == CompletionStatus::Success {
                    d.ok += 1;
                    d.bytes += u64::from(c.bytes);
                    d.last_completion = c.at;
                    cfg.progress.line(&format!(
                        "QP {i}: SEND of {} bytes received ({}/{WAIT_SENDS})",
                        c.bytes, d.ok
                    ));
                } else {
                    d.failed += 1;
                    failed_at.get_or_insert_with(std::time::SystemTime::now);
                    if d.failed == 1 {
                        errors.push(format!(
                            "QP {i} (QPN {:#x}): receive completed with {}: the QP went to the error state",
                            qp.local().qpn,
                            status_text(c.status)
                        ));
                    }
                }
            }
            if qp.is_error() && d.failed == 0 {
                d.failed += 1;
                failed_at.get_or_insert_with(std::time::SystemTime::now);
                errors.push(format!(
                    "QP {i} (QPN {:#x}) entered the error state",
                    qp.local().qpn
                ));
            }
        }
        moved |= ep.transmit(now) > 0;
        if drivers.iter().any(|d| d.failed > 0) {
            break;
        }
        if drivers.iter().all(|d| d.ok >= WAIT_SENDS) {
            break;
        }
        if now.since(start) >= limit {
            errors.push(format!(
                "no error and not all SENDs within {limit:?}: still waiting (a hang)"
            ));
            break;
        }
        let until = ep
            .next_deadline()
            .map_or(start + limit, |t| t.min(start + limit));
        ep.idle(now, moved, Some(until), Duration::from_millis(10));
    }
    // Let queued ACKs out before the session ends.
    let now = ep.now();
    ep.transmit(now);
    Run {
        drivers,
        lat: Vec::new(),
        start,
        errors,
        failed_at,
    }
}

struct Run {
    drivers: Vec<QpDriver>,
    lat: Vec<u64>,
    start: Time,
    errors: Vec<String>,
    /// Wall-clock time of the first failed completion.
    failed_at: Option<std::time::SystemTime>,
}

/// How often [`ClientConfig::stop_file`] is looked for.
const STOP_FILE_CHECK: Duration = Duration::from_millis(20);

fn drive(cfg: &ClientConfig, ep: &mut Endpoint, layout: Layout, theirs: &[QpInfo]) -> Run {
    let depth = u64::from(cfg.tx_depth);
    let mut drivers: Vec<QpDriver> = (0..cfg.qps).map(|_| QpDriver::new(cfg.latency)).collect();
    let mut lat = Vec::new();
    let mut errors = Vec::new();
    let start = ep.now();
    let (iters, post_until) = match cfg.limit {
        RunLimit::Iters(n) => (n, None),
        RunLimit::Duration(d) => (u64::MAX, Some(start + d)),
    };
    let mut next_report = start + Duration::from_secs(1);
    let mut last_bytes = 0u64;
    let mut last_report = start;
    let mut last_done = 0u64;
    let mut last_move = start;
    let mut failed_at = None;
    let mut stopped = false;
    let mut stop_check = start;
    loop {
        let now = ep.now();
        let mut moved = ep.receive(now) > 0;
        ep.timers(now);
        if let Some(f) = cfg.stop_file.as_ref().filter(|_| now >= stop_check) {
            stopped = f.exists();
            stop_check = now + STOP_FILE_CHECK;
        }
        let posting = !stopped && post_until.is_none_or(|t| now < t);
        for (i, (qp, d)) in ep.qps.iter_mut().zip(&mut drivers).enumerate() {
            let limit = if posting { iters } else { d.posted };
            let rkey = theirs[i].rkey;
            moved |= d.pump(
                qp,
                now,
                depth,
                limit,
                |n| layout.wr(cfg.op, n, rkey),
                &mut lat,
            );
        }
        moved |= ep.transmit(now) > 0;
        if failed_at.is_none() && drivers.iter().any(QpDriver::has_failed) {
            // When the application learned of the failure (a gateway's
            // bound is measured against it).
            failed_at = Some(std::time::SystemTime::now());
        }

        let done: u64 = drivers.iter().map(QpDriver::done).sum();
        if done != last_done {
            last_done = done;
            last_move = now;
        }
        if now >= next_report {
            let bytes: u64 = drivers.iter().map(|d| d.bytes).sum();
            let msgs: u64 = drivers.iter().map(|d| d.ok).sum();
            let retx: u64 = ep.qps.iter().map(|q| q.stats().retransmitted_packets).sum();
            let naks: u64 = ep.qps.iter().map(|q| q.stats().naks_received).sum();
            let dt = (now - last_report).as_secs_f64();
            let all = (now - start).as_secs_f64();
            cfg.progress.line(&format!(
                "[{all:6.1} s] {:8.3} Gb/s  (avg {:.3} Gb/s)  {msgs} msgs  {} retx  {} NAKs",
                (bytes - last_bytes) as f64 * 8.0 / dt / 1e9,
                bytes as f64 * 8.0 / all / 1e9,
                retx,
                naks,
            ));
            last_bytes = bytes;
            last_report = now;
            next_report = now + Duration::from_secs(1);
        }

        let finished = drivers
            .iter()
            .all(|d| d.outstanding() == 0 && (d.has_failed() || !posting || d.posted >= iters));
        if finished {
            break;
        }
        let outstanding: u64 = drivers.iter().map(QpDriver::outstanding).sum();
        if outstanding > 0 && now.since(last_move) >= cfg.stall_timeout {
            errors.push(format!(
                "stalled: {outstanding} work requests outstanding and none completed for {:?}",
                cfg.stall_timeout
            ));
            break;
        }
        let mut until = next_report;
        if let Some(t) = ep.next_deadline() {
            until = until.min(t);
        }
        if let Some(t) = post_until.filter(|_| posting) {
            until = until.min(t);
        }
        if cfg.stop_file.is_some() && posting {
            until = until.min(stop_check);
        }
        ep.idle(now, moved, Some(until), Duration::from_millis(10));
    }
    Run {
        drivers,
        lat,
        start,
        errors,
        failed_at,
    }
}

fn status_text(s: CompletionStatus) -> &'static str {
    match s {
        CompletionStatus::Success => "success",
        CompletionStatus::RetryExceeded => "retry count exceeded (IB_WC_RETRY_EXC_ERR)",
        CompletionStatus::RnrRetryExceeded => "RNR retry count exceeded (IB_WC_RNR_RETRY_EXC_ERR)",
        CompletionStatus::RemoteAccessError => {
            "remote access error (NAK 0x62, IB_WC_REM_ACCESS_ERR)"
        }
        CompletionStatus::RemoteInvalidRequest => {
            "remote invalid request (NAK 0x61, IB_WC_REM_INV_REQ_ERR)"
        }
        CompletionStatus::RemoteOperationalError => {
            "remote operational error (NAK 0x63, IB_WC_REM_OP_ERR)"
        }
        CompletionStatus::Flushed => "flushed (IB_WC_WR_FLUSH_ERR)",
    }
}

fn opcode_text(o: WrOpcode) -> &'static str {
    match o {
        WrOpcode::Write => "RDMA WRITE",
        WrOpcode::Send => "SEND",
        WrOpcode::Read => "RDMA READ",
        WrOpcode::FetchAdd => "FETCH_ADD",
        WrOpcode::CmpSwap => "CMP_SWAP",
    }
}

#[allow(clippy::too_many_arguments)]
fn report(
    cfg: &ClientConfig,
    ep: &Endpoint,
    qps: &[RcQp],
    drivers: &[QpDriver],
    start: Time,
    mut errors: Vec<String>,
    server: Option<Box<PerfReport>>,
    lat: &mut [u64],
    peer: SocketAddr,
) -> PerfReport {
    let mut r = PerfReport {
        local: ep.local_addr().to_string(),
        peer: peer.to_string(),
        io: ep.io.clone(),
        ..PerfReport::of("client", "udp", cfg.shape())
    };
    let mut packets = PacketCounters::default();
    let mut write_send_bytes = 0u64;
    let mut last = start;
    for (i, (qp, d)) in qps.iter().zip(drivers).enumerate() {
        let s = qp.stats();
        packets.add(s);
        r.retransmissions += s.retransmitted_packets;
        r.naks += s.naks_received;
        r.seq_naks += s.seq_naks_received;
        r.rnrs += s.rnr_naks_received;
        r.fatal_naks += s.fatal_naks_received;
        r.local_data_errors += s.data_errors;
        r.bytes_verified += qp.memory().stats().bytes_verified;
        write_send_bytes += s.bytes_completed_writes_sends();
        r.messages += d.ok;
        r.bytes += d.bytes;
        r.failed_completions += d.failed;
        r.incomplete += d.outstanding();
        last = last.max(d.last_completion);
        if let Some(c) = d.first_error {
            // The first real error, not the flushes that follow it.
            errors.insert(
                0,
                format!(
                    "QP {i} (QPN {:#x}): {} work request {} failed: {}",
                    qp.local().qpn,
                    opcode_text(c.opcode),
                    c.wr_id,
                    status_text(c.status)
                ),
            );
        }
    }
    r.packets = packets;
    r.elapsed_s = (last - start).as_secs_f64();
    if r.elapsed_s > 0.0 {
        r.msg_rate_mpps = r.messages as f64 / r.elapsed_s / 1e6;
    }
    for (n, what) in [
        (r.incomplete, "work requests never completed"),
        (
            r.local_data_errors,
            "data errors in what this side received (READ data)",
        ),
    ] {
        if n > 0 {
            errors.push(format!("{n} {what}"));
        }
    }
    r.data_errors = r.local_data_errors;
    if let Some(s) = &server {
        r.remote_data_errors = Some(s.data_errors);
        r.data_errors += s.data_errors;
        r.bytes_verified += s.bytes_verified;
        if s.data_errors > 0 {
            errors.push(format!(
                "{} data errors at the server (WRITE/SEND data it received)",
                s.data_errors
            ));
        }
        if matches!(cfg.op, Op::Write | Op::Send) && write_send_bytes > s.bytes {
            r.bytes_lost = write_send_bytes - s.bytes;
            errors.push(format!(
                "{write_send_bytes} bytes completed here but the server placed only {}",
                s.bytes
            ));
        }
    }
    r.latency = LatencyReport::from_nanos(lat);
    r.ok = errors.is_empty()
        && r.data_errors == 0
        && r.failed_completions == 0
        && r.incomplete == 0
        && r.bytes_lost == 0
        && server.is_some();
    if cfg.op == Op::WaitSend {
        // Nothing was posted but receives: the drivers counted SENDs
        // received (ok) and receives failed.
        r.incomplete = 0;
        r.ok = errors.is_empty()
            && r.failed_completions == 0
            && r.data_errors == 0
            && server.is_some();
    }
    if !r.ok {
        r.error = Some(
            errors
                .first()
                .cloned()
                .unwrap_or_else(|| "the run was not clean".into()),
        );
    }
    r.errors = errors;
    r.server = server;
    r.set_client_goodput();
    r
}
