//! Prometheus text exposition (format 0.0.4) of a [`Snapshot`], served over
//! a tiny HTTP/1.0 server on `control.metrics`. Metric names: see the list
//! in [`crate::gateway`].

use std::fmt::{Display, Write as _};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::snapshot::Snapshot;
use super::Shared;

struct Out {
    s: String,
    /// Several shards: path samples carry a `shard` label (path names
    /// repeat, one connection per shard).
    shard_label: bool,
}

impl Out {
    /// A per-path sample: labels `path` (and `shard`), then `extra`.
    fn path_sample(
        &mut self,
        name: &str,
        p: &super::snapshot::PathSnap,
        extra: &[(&str, &str)],
        v: impl Display,
    ) {
        let shard = p.shard.to_string();
        let mut labels = vec![("path", p.name.as_str())];
        if self.shard_label {
            labels.push(("shard", shard.as_str()));
        }
        labels.extend_from_slice(extra);
        self.sample(name, &labels, v);
    }

    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.s, "# HELP {name} {help}");
        let _ = writeln!(self.s, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: impl Display) {
        self.s.push_str(name);
        if !labels.is_empty() {
            self.s.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.s.push(',');
                }
                let _ = write!(self.s, "{k}=\"");
                for c in val.chars() {
                    match c {
                        '\\' => self.s.push_str("\\\\"),
                        '"' => self.s.push_str("\\\""),
                        '\n' => self.s.push_str("\\n"),
                        c => self.s.push(c),
                    }
                }
                self.s.push('"');
            }
            self.s.push('}');
        }
        let _ = writeln!(self.s, " {v}");
    }

    /// A family with one unlabelled sample.
    fn one(&mut self, name: &str, kind: &str, help: &str, v: impl Display) {
        self.family(name, kind, help);
        self.sample(name, &[], v);
    }

    /// A family with one label taking several values.
    fn by(&mut self, name: &str, kind: &str, help: &str, label: &str, vals: &[(&str, u64)]) {
        self.family(name, kind, help);
        for (l, v) in vals {
            self.sample(name, &[(label, l)], v);
        }
    }
}

/// Renders the snapshot in the Prometheus text format.
pub fn render(s: &Snapshot) -> String {
    let mut o = Out {
        s: String::with_capacity(16 << 10),
        shard_label: s.shards.len() > 1,
    };
    let gen = format!("{:#018x}", s.generation);
    o.family("soya_info", "gauge", "Gateway identity (value 1).");
    o.sample(
        "soya_info",
        &[
            ("site", &s.site),
            ("version", &s.version),
            ("backend", &s.backend),
            ("policy", &s.policy),
            ("generation", &gen),
            ("insecure", if s.insecure { "true" } else { "false" }),
        ],
        1,
    );
    o.one(
        "soya_uptime_seconds",
        "gauge",
        "Seconds since the gateway started.",
        format!("{:.3}", s.uptime_secs),
    );
    o.one(
        "soya_draining",
        "gauge",
        "1 while draining for shutdown.",
        u8::from(s.state == "draining"),
    );
    o.one(
        "soya_wan_connected",
        "gauge",
        "1 while a WAN path to the twin answers.",
        u8::from(s.connected),
    );
    let ts = &s.twin_status;
    o.by(
        "soya_twin_state",
        "gauge",
        "1 for the twin's current state: connecting, connected, unreachable (every path down) or lost (down for wan.twin_timeout: flows failed).",
        "state",
        &["connecting", "connected", "unreachable", "lost"].map(|n| (n, u64::from(ts.state == n))),
    );
    o.one(
        "soya_twin_unreachable_seconds",
        "gauge",
        "Seconds since every WAN path went down (0 while a path answers).",
        ts.for_secs,
    );

    let d = &s.dc;
    o.by(
        "soya_dc_rx_packets_total",
        "counter",
        "Packets read from the data-center side, by result.",
        "result",
        &[
            ("accepted", d.rx_accepted),
            ("malformed", d.rx_malformed),
            ("acl_source", d.rx_acl_source),
            ("acl_destination", d.rx_acl_destination),
            ("draining", d.rx_draining),
            ("backpressure", d.rx_backpressure),
        ],
    );
    o.one(
        "soya_dc_rx_kernel_drops_total",
        "counter",
        "Packets for the gateway the kernel dropped before it read them (tun queue or socket buffer full).",
        d.rx_kernel_drops,
    );
    o.one(
        "soya_dc_rx_bytes_total",
        "counter",
        "Bytes read from the data-center side.",
        d.rx_bytes,
    );
    o.by(
        "soya_dc_tx_packets_total",
        "counter",
        "Packets for the data-center side, by result.",
        "result",
        &[
            ("sent", d.tx_packets),
            ("no_peer", d.tx_no_peer),
            ("acl", d.tx_acl),
            ("error", d.tx_errors),
        ],
    );
    o.one(
        "soya_dc_tx_bytes_total",
        "counter",
        "Bytes written to the data-center side.",
        d.tx_bytes,
    );
    o.one(
        "soya_dc_lab_hosts",
        "gauge",
        "udp backend: lab hosts whose UDP address is learned.",
        d.lab_hosts,
    );
    o.one(
        "soya_dc_lab_host_conflicts_total",
        "counter",
        "udp backend: datagrams for a host bound to another active UDP address.",
        d.lab_host_conflicts,
    );
    o.by(
        "soya_dc_handoff_packets_total",
        "counter",
        "DC packets read by one shard for another: queued to it, dropped (its queue full), received by it.",
        "result",
        &[
            ("out", d.handoff_out),
            ("dropped", d.handoff_dropped),
            ("in", d.handoff_in),
        ],
    );

    // Per shard (device thread).
    o.one(
        "soya_shards",
        "gauge",
        "Shards (device threads) of the gateway.",
        s.shards.len().max(1),
    );
    o.family(
        "soya_shard_connected",
        "gauge",
        "1 when the shard has a session with the twin's shard of the same index.",
    );
    for sh in &s.shards {
        let i = sh.index.to_string();
        o.sample(
            "soya_shard_connected",
            &[("shard", &i)],
            u8::from(sh.connected),
        );
    }
    if s.shards.iter().any(|sh| !sh.dc_mode.is_empty()) {
        o.family(
            "soya_dc_xdp_mode",
            "gauge",
            "xdp backend: 1 for the mode each shard's AF_XDP socket runs in (zero-copy where the driver offers it, copy otherwise).",
        );
        for sh in s.shards.iter().filter(|sh| !sh.dc_mode.is_empty()) {
            let i = sh.index.to_string();
            o.sample(
                "soya_dc_xdp_mode",
                &[("shard", &i), ("mode", &sh.dc_mode)],
                1,
            );
        }
    }
    type ShardDir = (
        &'static str,
        &'static str,
        [(&'static str, fn(&super::snapshot::ShardSnap) -> u64); 2],
    );
    let shard_dirs: [ShardDir; 3] = [
        (
            "soya_shard_dc_packets_total",
            "DC packets of the shard: accepted into its engine (rx), written (tx).",
            [("rx", |x| x.dc_rx_accepted), ("tx", |x| x.dc_tx_packets)],
        ),
        (
            "soya_shard_twin_messages_total",
            "Messages between the shard's engine and its twin.",
            [("out", |x| x.twin_msgs_out), ("in", |x| x.twin_msgs_in)],
        ),
        (
            "soya_shard_wan_packets_total",
            "WAN packets of the shard's connection.",
            [
                ("sent", |x| x.wan_packets_sent),
                ("received", |x| x.wan_packets_received),
            ],
        ),
    ];
    for (name, help, dirs) in shard_dirs {
        o.family(name, "counter", help);
        for sh in &s.shards {
            let i = sh.index.to_string();
            for (dir, f) in dirs {
                o.sample(name, &[("shard", &i), ("dir", dir)], f(sh));
            }
        }
    }
    o.family(
        "soya_shard_handoff_packets_total",
        "counter",
        "DC packets the shard handed to others (out, dropped) or received from them (in).",
    );
    for sh in &s.shards {
        let i = sh.index.to_string();
        for (r, v) in [
            ("out", sh.handoff_out),
            ("dropped", sh.handoff_dropped),
            ("in", sh.handoff_in),
        ] {
            o.sample(
                "soya_shard_handoff_packets_total",
                &[("shard", &i), ("result", r)],
                v,
            );
        }
    }

    let e = &s.engine;
    o.by(
        "soya_engine_dc_packets_total",
        "counter",
        "Packets the QP engine took from the data-center side, by verdict.",
        "kind",
        &[
            ("all", e.dc_packets),
            ("malformed", e.dc_malformed),
            ("bad_icrc", e.dc_bad_icrc),
            ("not_roce", e.dc_not_roce),
        ],
    );
    o.by(
        "soya_engine_twin_messages_total",
        "counter",
        "Messages the QP engine took from the twin, by verdict.",
        "kind",
        &[("all", e.twin_msgs), ("malformed", e.twin_malformed)],
    );
    o.one(
        "soya_engine_cm_messages_total",
        "counter",
        "RDMA-CM MADs seen.",
        e.cm_messages,
    );
    o.by(
        "soya_engine_flows_learned_total",
        "counter",
        "Halves whose requester QPN was learned, by how.",
        "how",
        &[
            ("cm", e.flows_learned_cm),
            ("traffic", e.flows_learned_traffic),
        ],
    );
    o.one(
        "soya_engine_cnps_absorbed_total",
        "counter",
        "CNPs from local responders absorbed.",
        e.cnps_absorbed,
    );
    o.one(
        "soya_engine_unmatched_responses_total",
        "counter",
        "Responses forwarded without a known half.",
        e.unmatched_responses,
    );

    let b = &s.buffer;
    o.one(
        "soya_buffer_slots_used",
        "gauge",
        "Deep-buffer slots in use.",
        b.slots_used,
    );
    o.one(
        "soya_buffer_slots_total",
        "gauge",
        "Deep-buffer slots.",
        b.slots_total,
    );
    o.one(
        "soya_buffer_high_water_slots",
        "gauge",
        "Most deep-buffer slots ever in use.",
        b.high_water,
    );
    o.one(
        "soya_buffer_slot_bytes",
        "gauge",
        "Bytes per deep-buffer slot.",
        b.slot_bytes,
    );

    let t = &s.twin;
    o.by(
        "soya_twin_messages_total",
        "counter",
        "Reliable engine messages to and from the twin.",
        "dir",
        &[("out", t.msgs_out), ("in", t.msgs_in)],
    );
    o.one(
        "soya_twin_pending_messages",
        "gauge",
        "Messages waiting for room in the WAN transport.",
        t.pending_messages,
    );
    o.one(
        "soya_twin_pending_bytes",
        "gauge",
        "Bytes waiting for room in the WAN transport.",
        t.pending_bytes,
    );
    o.one(
        "soya_twin_pending_high_water_bytes",
        "gauge",
        "Most bytes ever waiting for the WAN transport.",
        t.pending_high_water_bytes,
    );
    o.one(
        "soya_twin_pending_overflow_total",
        "counter",
        "Messages dropped at the waiting-queue bound (must stay 0).",
        t.pending_overflow,
    );
    o.one(
        "soya_twin_blocked_total",
        "counter",
        "Messages that had to wait for WAN flow credit or buffer room.",
        t.blocked,
    );
    o.one(
        "soya_twin_send_errors_total",
        "counter",
        "Messages the WAN transport refused for good.",
        t.send_errors,
    );
    o.one(
        "soya_twin_discarded_on_restart_total",
        "counter",
        "Waiting messages dropped because the twin restarted.",
        t.discarded_on_restart,
    );
    o.one(
        "soya_flows_failed_on_restart_total",
        "counter",
        "Halves failed toward their requesters because the twin restarted mid-stream.",
        t.flows_failed_on_restart,
    );
    o.by(
        "soya_twin_failed_total",
        "counter",
        "What lost or restarted twins failed: ingress halves, local QPs moved to error through their responder role (poisoned), QPs that could not be (expected PSN unknown), egress halves dropped, RDMA-CM connections disconnected (DREQ in the far host's name).",
        "what",
        &[
            ("halves", e.halves_failed_twin_lost),
            ("qps_poisoned", e.qps_poisoned),
            ("unattributable", e.poison_unattributable),
            ("egress_halves", e.egress_halves_dropped),
            ("rdma_cm_dreqs", e.dreqs_sent),
        ],
    );
    o.one(
        "soya_twin_lost_total",
        "counter",
        "Times the twin was declared lost (no WAN path for wan.twin_timeout).",
        t.twin_lost,
    );
    o.one(
        "soya_flows_failed_twin_lost_total",
        "counter",
        "Halves failed toward their requesters because the twin was lost.",
        t.flows_failed_twin_lost,
    );
    o.one(
        "soya_twin_lost_requests_refused_total",
        "counter",
        "Requests from the DC side refused (error NAK, or dropped when their QP is unknown) while the twin was lost.",
        t.rx_refused_twin_lost.max(e.requests_refused_unreachable),
    );
    o.by(
        "soya_wan_datagrams_total",
        "counter",
        "Unreliable WAN datagrams (non-RoCE traffic, RDMA-CM), by direction.",
        "dir",
        &[("out", t.datagrams_out), ("in", t.datagrams_in)],
    );
    o.one(
        "soya_wan_datagram_acl_drops_total",
        "counter",
        "Datagrams from the twin refused by the ACL.",
        t.datagram_acl_drops,
    );

    let w = &s.wan;
    o.by(
        "soya_wan_packets_total",
        "counter",
        "WAN packets, by direction.",
        "dir",
        &[("sent", w.packets_sent), ("received", w.packets_received)],
    );
    for (name, help, v) in [
        (
            "soya_wan_packets_lost_total",
            "WAN packets declared lost.",
            w.packets_lost,
        ),
        (
            "soya_wan_packets_retransmitted_total",
            "WAN packets carrying retransmitted data.",
            w.packets_retransmitted,
        ),
        (
            "soya_wan_auth_failures_total",
            "WAN datagrams that failed authentication.",
            w.auth_failures,
        ),
        (
            "soya_wan_replays_dropped_total",
            "WAN datagrams refused by the replay window.",
            w.replays_dropped,
        ),
        (
            "soya_wan_malformed_total",
            "WAN datagrams that did not parse.",
            w.malformed,
        ),
        (
            "soya_wan_stale_generation_total",
            "WAN packets of an old twin session.",
            w.stale_generation,
        ),
        (
            "soya_wan_no_session_total",
            "Protected WAN packets before any session existed.",
            w.no_session,
        ),
        (
            "soya_wan_role_conflicts_total",
            "HELLOs from a twin of the same role.",
            w.role_conflicts,
        ),
        (
            "soya_wan_protocol_violations_total",
            "Authentic frames that broke the protocol.",
            w.protocol_violations,
        ),
        (
            "soya_wan_peer_restarts_total",
            "Twin restarts seen (new session generation).",
            w.peer_restarts,
        ),
        (
            "soya_wan_events_dropped_total",
            "Transport events dropped at their bound.",
            w.events_dropped,
        ),
        (
            "soya_wan_messages_discarded_total",
            "Messages the transport dropped when the twin restarted.",
            w.messages_discarded,
        ),
        (
            "soya_wan_unknown_source_total",
            "WAN datagrams from an address that is no path's remote.",
            w.unknown_source,
        ),
        (
            "soya_wan_foreign_source_total",
            "WAN datagrams from an unexpected address on a single-path socket.",
            w.foreign_source,
        ),
    ] {
        o.one(name, "counter", help, v);
    }
    o.by(
        "soya_wan_socket_errors_total",
        "counter",
        "WAN socket errors, by operation.",
        "op",
        &[
            ("send", w.socket_send_errors),
            ("recv", w.socket_recv_errors),
        ],
    );
    o.by(
        "soya_wan_transport_datagrams_total",
        "counter",
        "Datagrams as the WAN transport counts them.",
        "result",
        &[
            ("sent", w.datagrams_sent),
            ("received", w.datagrams_received),
            ("dropped", w.datagrams_dropped),
        ],
    );
    o.by(
        "soya_wan_buffered_bytes",
        "gauge",
        "Bytes held by the WAN transport.",
        "dir",
        &[
            ("send", w.send_buffered_bytes),
            ("recv", w.recv_buffered_bytes),
        ],
    );

    // Per path.
    let paths = &s.paths;
    o.family(
        "soya_path_state",
        "gauge",
        "1 for the path's current state (probing, up, down).",
    );
    for p in paths {
        for st in ["probing", "up", "down"] {
            o.path_sample(
                "soya_path_state",
                p,
                &[("state", st)],
                u8::from(p.state == st),
            );
        }
    }
    type PathGauge = (
        &'static str,
        &'static str,
        fn(&super::snapshot::PathSnap) -> f64,
    );
    let gauges: [PathGauge; 7] = [
        ("soya_path_rtt_seconds", "Smoothed RTT.", |p| {
            p.srtt_us as f64 / 1e6
        }),
        ("soya_path_min_rtt_seconds", "Minimum RTT.", |p| {
            p.min_rtt_us as f64 / 1e6
        }),
        (
            "soya_path_loss_ratio",
            "Recent fraction of packets lost.",
            |p| p.loss_rate,
        ),
        (
            "soya_path_pacing_rate_bits_per_second",
            "Congestion controller pacing rate.",
            |p| p.pacing_rate_bps as f64,
        ),
        ("soya_path_cwnd_bytes", "Congestion window.", |p| {
            p.cwnd_bytes as f64
        }),
        ("soya_path_bytes_in_flight", "Unacknowledged bytes.", |p| {
            p.bytes_in_flight as f64
        }),
        ("soya_path_weight", "Configured scheduler weight.", |p| {
            f64::from(p.weight)
        }),
    ];
    for (name, help, f) in gauges {
        o.family(name, "gauge", help);
        for p in paths {
            o.path_sample(name, p, &[], f(p));
        }
    }
    type PathCounter = (
        &'static str,
        &'static str,
        fn(&super::snapshot::PathSnap) -> (u64, u64),
    );
    let dir_counters: [PathCounter; 2] = [
        ("soya_path_packets_total", "Packets on the path.", |p| {
            (p.packets_sent, p.packets_received)
        }),
        ("soya_path_bytes_total", "Bytes on the path.", |p| {
            (p.bytes_sent, p.bytes_received)
        }),
    ];
    for (name, help, f) in dir_counters {
        o.family(name, "counter", help);
        for p in paths {
            let (tx, rx) = f(p);
            o.path_sample(name, p, &[("dir", "sent")], tx);
            o.path_sample(name, p, &[("dir", "received")], rx);
        }
    }
    type PathPlain = (
        &'static str,
        &'static str,
        fn(&super::snapshot::PathSnap) -> u64,
    );
    let counters: [PathPlain; 5] = [
        (
            "soya_path_packets_lost_total",
            "Packets declared lost.",
            |p| p.packets_lost,
        ),
        (
            "soya_path_packets_retransmitted_total",
            "Packets carrying retransmitted data.",
            |p| p.packets_retransmitted,
        ),
        (
            "soya_path_auth_failures_total",
            "Datagrams that failed authentication.",
            |p| p.auth_failures,
        ),
        (
            "soya_path_malformed_total",
            "Datagrams that did not parse.",
            |p| p.malformed,
        ),
        ("soya_path_down_total", "Times the path went down.", |p| {
            p.times_down
        }),
    ];
    for (name, help, f) in counters {
        o.family(name, "counter", help);
        for p in paths {
            o.path_sample(name, p, &[], f(p));
        }
    }

    // Per flow (half), the busiest only.
    o.one(
        "soya_flows",
        "gauge",
        "Halves the engine knows (ingress and egress roles).",
        s.flows_total,
    );
    type FlowField = (
        &'static str,
        &'static str,
        &'static str,
        fn(&super::snapshot::FlowSnap) -> u64,
    );
    let flow_metrics: [FlowField; 6] = [
        ("soya_flow_packets_total", "counter", "Request packets of the half (ingress: from the requester; egress: injected).", |f| f.packets),
        ("soya_flow_bytes_total", "counter", "IP bytes of the half's requests (ingress).", |f| f.bytes),
        ("soya_flow_pseudo_acks_total", "counter", "Pseudo-ACKs sent to the requester.", |f| f.pseudo_acks),
        ("soya_flow_naks_total", "counter", "NAKs (ingress: sent to the requester; egress: from the responder).", |f| f.naks),
        ("soya_flow_retransmissions_total", "counter", "Retransmissions (egress: go-back-N toward the responder; ingress: duplicates from the requester).", |f| f.retransmissions),
        ("soya_flow_buffered_packets", "gauge", "Packets held for the half.", |f| f.buffered),
    ];
    for (name, kind, help, f) in flow_metrics {
        o.family(name, kind, help);
        for fl in &s.flows {
            o.sample(name, &[("half", &fl.half), ("role", &fl.role)], f(fl));
        }
    }
    o.s
}

/// Serves `GET /metrics` on `addr` until the gateway stops.
pub fn serve(listener: TcpListener, shared: Arc<Shared>) -> io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("soya-metrics".into())
        .spawn(move || loop {
            if shared.stopping.load(Ordering::Acquire) {
                return;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = handle(stream, &shared);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        })
}

fn handle(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && !req.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
        if req.len() > 16 << 10 {
            break;
        }
    }
    let line = String::from_utf8_lossy(&req);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        )
    } else if path == "/metrics" || path.starts_with("/metrics?") {
        match shared.snapshot(Duration::from_secs(2)) {
            Some(s) => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                render(&s),
            ),
            None => (
                "503 Service Unavailable",
                "text/plain",
                "no snapshot\n".into(),
            ),
        }
    } else if path == "/" {
        (
            "200 OK",
            "text/html",
            "<html><body><a href=\"/metrics\">/metrics</a></body></html>\n".into(),
        )
    } else {
        ("404 Not Found", "text/plain", "not found\n".into())
    };
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

/// Binds the metrics listener (SO_REUSEADDR so a restart does not wait for
/// TIME_WAIT).
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(64)?;
    Ok(s.into())
}
