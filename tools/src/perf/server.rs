//! The server: listens on TCP, takes one client session at a time, creates
//! the QPs asked for, answers the traffic until the client says done, and
//! reports what its memory verification found.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use soya_proto::roce::ip::ROCE_PORT;
use soya_proto::roce::Psn;
use soya_proto::time::Time;

use super::endpoint::Endpoint;
use super::exchange::{Control, Msg, QpInfo, DEFAULT_PORT, VERSION};
use super::report::{PacketCounters, PerfReport};
use super::workload::{Layout, Op};
use super::{
    qp_config, random_psn, random_qpn_base, random_rkey, PerfError, ProgressTo, Shape, Transport,
    MEM_BASE, VERBS_UNAVAILABLE,
};
use crate::rc::{QpAddr, RcQp};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// RoCE address, and the address the control port listens on.
    pub bind_ip: IpAddr,
    /// TCP control port.
    pub port: u16,
    /// UDP port of the RoCE socket (4791 for real RoCEv2).
    pub roce_port: u16,
    pub transport: Transport,
    pub progress: ProgressTo,
    /// Give up waiting for a client after this long (`None`: forever).
    pub accept_timeout: Option<Duration>,
    /// End a session when the client is silent this long (no datagram and
    /// no control message).
    pub idle_timeout: Duration,
    /// After a `DoneAfter`, wait at most this long for the announced bytes.
    pub drain_timeout: Duration,
    /// For tests: advertise an R_Key other than the real one, so every
    /// WRITE/READ of the client fails with a remote access error.
    pub wrong_rkey: bool,
    /// Send with UDP GSO (see [`super::ClientConfig::gso`]).
    pub gso: bool,
    /// Busy-poll this long after the last activity before sleeping.
    pub busy_poll: Duration,
    /// IP-in-UDP mode (through a gateway or a relay); `None`: RoCEv2/UDP.
    pub tunnel: Option<super::endpoint::Tunnel>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            bind_ip: Ipv4Addr::LOCALHOST.into(),
            port: DEFAULT_PORT,
            roce_port: ROCE_PORT,
            transport: Transport::Udp,
            progress: ProgressTo::Off,
            accept_timeout: None,
            idle_timeout: Duration::from_secs(30),
            drain_timeout: super::exchange::DRAIN_MAX,
            wrong_rkey: false,
            gso: false,
            busy_poll: Duration::ZERO,
            tunnel: None,
        }
    }
}

/// A bound server: control listener and RoCE socket.
pub struct Server {
    cfg: ServerConfig,
    listener: TcpListener,
    ep: Endpoint,
    sessions: u64,
}

impl Server {
    pub fn bind(cfg: ServerConfig) -> Result<Server, PerfError> {
        if cfg.transport == Transport::Verbs {
            return Err(PerfError::Usage(VERBS_UNAVAILABLE.into()));
        }
        let ctl = SocketAddr::new(cfg.bind_ip, cfg.port);
        let listener = TcpListener::bind(ctl)
            .map_err(|e| PerfError::Failed(format!("cannot listen on {ctl}: {e} (use --port)")))?;
        let roce = SocketAddr::new(cfg.bind_ip, cfg.roce_port);
        let ep = Endpoint::open(roce, cfg.gso, cfg.busy_poll, cfg.tunnel)?;
        Ok(Server {
            cfg,
            listener,
            ep,
            sessions: 0,
        })
    }

    /// The control address (useful with port 0).
    pub fn control_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::new(self.cfg.bind_ip, self.cfg.port))
    }

    pub fn roce_addr(&self) -> SocketAddr {
        self.ep.local_addr()
    }

    fn accept(&self) -> Result<Control, PerfError> {
        let deadline = self.cfg.accept_timeout.map(|t| Instant::now() + t);
        self.listener
            .set_nonblocking(deadline.is_some())
            .map_err(|e| PerfError::Failed(format!("listener: {e}")))?;
        loop {
            match soya_io::sys::nonblocking(|| self.listener.accept()) {
                Ok(Some((s, _))) => {
                    let _ = s.set_nonblocking(false);
                    return Ok(Control::new(s));
                }
                Ok(None) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(PerfError::Failed("no client came".into()));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(PerfError::Failed(format!("accept: {e}"))),
            }
        }
    }

    /// Waits for one client and serves its session. `Ok` whenever a session
    /// ran (look at [`PerfReport::ok`]); `Err` if none could be set up.
    pub fn serve_one(&mut self) -> Result<PerfReport, PerfError> {
        let mut ctrl = self.accept()?;
        self.sessions += 1;
        let hello = ctrl
            .recv(Duration::from_secs(10))
            .map_err(|e| PerfError::Failed(format!("waiting for the hello: {e}")))?;
        let Msg::Hello {
            version,
            shape,
            ip,
            port,
            qp: theirs,
            send_after_ms,
        } = hello
        else {
            let m = format!("expected a hello, got {hello:?}");
            let _ = ctrl.send(&Msg::Error { message: m.clone() });
            return Err(PerfError::Failed(m));
        };
        // `wait-send`: between the first SEND and the second.
        let send_after = Duration::from_millis(send_after_ms.unwrap_or(1000));
        let Shape { size, qps, mtu, .. } = shape;
        let refusal = if version != VERSION {
            Some(format!(
                "protocol version {version}, this server speaks {VERSION}"
            ))
        } else if let Err(e) = shape.validate() {
            Some(e)
        } else if theirs.len() != qps as usize {
            Some(format!("{qps} QPs announced, {} described", theirs.len()))
        } else if std::mem::discriminant(&ip) != std::mem::discriminant(&self.ep.roce_ip()) {
            Some(format!(
                "client address {ip} and server address {} differ in family",
                self.ep.roce_ip()
            ))
        } else {
            None
        };
        if let Some(m) = refusal {
            let _ = ctrl.send(&Msg::Error { message: m.clone() });
            return Err(PerfError::Failed(format!("refused {}: {m}", ctrl.peer())));
        }

        let layout = Layout::new(MEM_BASE, size);
        let base = random_qpn_base(qps);
        let mut mine = Vec::with_capacity(qps as usize);
        let mut qp_list = Vec::with_capacity(qps as usize);
        for (i, t) in theirs.iter().enumerate() {
            let info = QpInfo {
                qpn: base + i as u32,
                psn: random_psn().value(),
                rkey: random_rkey(),
                vaddr: layout.base,
                len: layout.mem_size() as u64,
            };
            let qp = RcQp::new(
                qp_config(mtu, layout, info.rkey),
                QpAddr {
                    ip: self.ep.roce_ip(),
                    qpn: info.qpn,
                },
                QpAddr { ip, qpn: t.qpn },
                Psn::new(info.psn),
                Psn::new(t.psn),
            );
            let mut qp = match qp {
                Ok(q) => q,
                Err(e) => {
                    let _ = ctrl.send(&Msg::Error { message: e.clone() });
                    return Err(PerfError::Failed(format!("QP setup: {e}")));
                }
            };
            if shape.op == Op::Send {
                qp.post_recv(recv_target(shape.tx_depth));
            }
            let mut advertised = info;
            if self.cfg.wrong_rkey {
                advertised.rkey ^= 0x00ff_ff00;
            }
            mine.push(advertised);
            qp_list.push(qp);
        }
        let peer = SocketAddr::new(ip, port);
        self.ep.start_session(peer, qp_list, base);
        if let Err(e) = ctrl.send(&Msg::Accept {
            ip: self.ep.roce_ip(),
            port: self.ep.local_addr().port(),
            qp: mine,
        }) {
            self.ep.end_session();
            return Err(PerfError::Failed(format!("sending the accept: {e}")));
        }

        let (start, end, errors) = self.run_session(&mut ctrl, &shape, send_after);
        let qps_done = self.ep.end_session();
        let report = self.report(&shape, &qps_done, peer, start, end, errors);
        if let Err(e) = ctrl.send(&Msg::Summary {
            report: Box::new(report.clone()),
        }) {
            let mut r = report;
            r.errors.push(format!("sending the summary: {e}"));
            return Ok(r);
        }
        Ok(report)
    }

    fn run_session(
        &mut self,
        ctrl: &mut Control,
        shape: &Shape,
        send_after: Duration,
    ) -> (Time, Time, Vec<String>) {
        let start = self.ep.now();
        let mut errors = Vec::new();
        let mut next_report = start + Duration::from_secs(1);
        let mut next_ctrl = start;
        let mut last_ctrl = start;
        let mut last_bytes = 0u64;
        let mut last_report = start;
        let target = recv_target(shape.tx_depth);
        let mut drain: Option<(u64, Time)> = None;
        // wait-send: SENDs posted so far per QP (one at once, one later).
        let mut sends_posted = 0u32;
        loop {
            let now = self.ep.now();
            let mut moved = self.ep.receive(now) > 0;
            self.ep.timers(now);
            if shape.op == Op::WaitSend {
                let due = match sends_posted {
                    0 => true,
                    1 => now.since(start) >= send_after,
                    _ => false,
                };
                if due {
                    sends_posted += 1;
                    for qp in &mut self.ep.qps {
                        let wr = crate::rc::WorkRequest::Send {
                            len: shape.size,
                            imm: None,
                        };
                        if qp.post_send(wr).is_err() {
                            errors.push("cannot post the SEND".into());
                        }
                    }
                    moved = true;
                }
                for qp in &mut self.ep.qps {
                    while qp.poll_completion().is_some() {}
                }
            }
            if shape.op == Op::Send {
                for qp in &mut self.ep.qps {
                    let have = qp.posted_recvs();
                    if have < u64::from(target / 2) {
                        qp.post_recv(target - have as u32);
                    }
                }
            }
            moved |= self.ep.transmit(now) > 0;
            if now >= next_ctrl {
                next_ctrl = now + Duration::from_millis(2);
                match ctrl.try_recv() {
                    Ok(None) => {}
                    Ok(Some(Msg::Done)) if !self.sends_pending(shape, sends_posted) => {
                        return (start, now, errors)
                    }
                    Ok(Some(Msg::Done)) => {
                        // wait-send: the client saw its receives complete,
                        // but our SENDs complete only when its ACK comes
                        // back here, which can be after its Done.
                        drain = Some((0, now + self.cfg.drain_timeout));
                    }
                    Ok(Some(Msg::DoneAfter { bytes })) => {
                        last_ctrl = now;
                        drain = Some((bytes, now + self.cfg.drain_timeout));
                    }
                    Ok(Some(m)) => {
                        last_ctrl = now;
                        errors.push(format!("unexpected control message {m:?}"));
                    }
                    Err(e) => {
                        errors.push(format!("client went away: {e}"));
                        return (start, now, errors);
                    }
                }
            }
            if let Some((want, until)) = drain {
                if self.bytes() >= want && !self.sends_pending(shape, sends_posted) {
                    return (start, now, errors);
                }
                if now >= until && self.sends_pending(shape, sends_posted) {
                    errors.push(format!(
                        "the client said done, but not every SEND completed within {:?}",
                        self.cfg.drain_timeout
                    ));
                    return (start, now, errors);
                }
                if now >= until {
                    errors.push(format!(
                        "only {} of the {want} bytes the client completed arrived within {:?}",
                        self.bytes(),
                        self.cfg.drain_timeout
                    ));
                    return (start, now, errors);
                }
            }
            if now >= next_report {
                let bytes = self.bytes();
                let dt = (now - last_report).as_secs_f64();
                let all = (now - start).as_secs_f64();
                let errs: u64 = self.ep.qps.iter().map(|q| q.stats().data_errors).sum();
                self.cfg.progress.line(&format!(
                    "[{all:6.1} s] {:8.3} Gb/s  {} bytes  {} data errors",
                    (bytes - last_bytes) as f64 * 8.0 / dt / 1e9,
                    bytes,
                    errs
                ));
                last_bytes = bytes;
                last_report = now;
                next_report = now + Duration::from_secs(1);
            }
            let heard = self.ep.last_rx.max(last_ctrl).max(start);
            if now.since(heard) >= self.cfg.idle_timeout {
                errors.push(format!(
                    "client silent for {:?}: session abandoned",
                    self.cfg.idle_timeout
                ));
                return (start, now, errors);
            }
            let mut until = self
                .ep
                .next_deadline()
                .map_or(next_ctrl, |t| t.min(next_ctrl));
            if shape.op == Op::WaitSend && sends_posted == 1 {
                until = until.min(start + send_after);
            }
            self.ep
                .idle(now, moved, Some(until), Duration::from_millis(2));
        }
    }

    /// wait-send: whether a SEND this side posted is not yet completed.
    fn sends_pending(&self, shape: &Shape, sends_posted: u32) -> bool {
        shape.op == Op::WaitSend
            && self
                .ep
                .qps
                .iter()
                .any(|q| q.stats().messages_completed < u64::from(sends_posted))
    }

    /// Payload bytes this side received or served so far.
    fn bytes(&self) -> u64 {
        self.ep
            .qps
            .iter()
            .map(|q| {
                let m = q.memory().stats();
                m.bytes_placed + m.send_bytes_received + m.read_bytes_served
            })
            .sum()
    }

    fn report(
        &self,
        shape: &Shape,
        qps: &[RcQp],
        peer: SocketAddr,
        start: Time,
        end: Time,
        mut errors: Vec<String>,
    ) -> PerfReport {
        let mut r = PerfReport {
            local: self.ep.local_addr().to_string(),
            peer: peer.to_string(),
            elapsed_s: (end - start).as_secs_f64(),
            io: self.ep.io.clone(),
            ..PerfReport::of("server", "udp", *shape)
        };
        let mut packets = PacketCounters::default();
        for qp in qps {
            let s = qp.stats();
            let m = qp.memory().stats();
            packets.add(s);
            r.local_data_errors += s.data_errors;
            r.bytes_verified += m.bytes_verified;
            r.naks += s.naks_received;
            r.retransmissions += s.retransmitted_packets;
            match shape.op {
                Op::Write => {
                    r.messages += m.writes_placed;
                    r.bytes += m.bytes_placed;
                }
                Op::Send => {
                    r.messages += m.sends_received;
                    r.bytes += m.send_bytes_received;
                }
                Op::Read => {
                    r.bytes += m.read_bytes_served;
                    r.messages += m.read_bytes_served / u64::from(shape.size.max(1));
                }
                Op::Atomic => {
                    r.messages += m.atomics_executed;
                    r.bytes += 8 * m.atomics_executed;
                }
                Op::WaitSend => {
                    r.messages += s.messages_completed;
                    r.bytes += s.write_send_bytes_completed;
                }
            }
        }
        r.packets = packets;
        r.data_errors = r.local_data_errors;
        if r.data_errors > 0 {
            errors.push(format!(
                "{} data errors in what this side received",
                r.data_errors
            ));
        }
        if r.elapsed_s > 0.0 {
            r.goodput_gbps = r.bytes as f64 * 8.0 / r.elapsed_s / 1e9;
            r.msg_rate_mpps = r.messages as f64 / r.elapsed_s / 1e6;
        }
        r.ok = errors.is_empty();
        if !r.ok {
            r.error = errors.first().cloned();
        }
        r.errors = errors;
        r
    }
}

/// Receive WQEs kept posted per QP for SENDs.
fn recv_target(tx_depth: u32) -> u32 {
    (4 * tx_depth).max(1024)
}

/// Binds, serves one session, returns its report.
pub fn run_server(cfg: ServerConfig) -> Result<PerfReport, PerfError> {
    Server::bind(cfg)?.serve_one()
}
