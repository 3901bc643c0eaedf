//! The control socket (`control.socket`, a Unix stream socket) and the
//! `soya status` client.
//!
//! Protocol: the client sends one line, `status`, and reads the gateway's
//! [`Snapshot`] as one JSON document until the server closes (or
//! `last-reload`: what the last SIGHUP applied and what needs a restart). Anything else
//! gets `{"error": …}`.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use soya_config::KeyDigests;

use super::snapshot::Snapshot;
use super::Shared;

/// Binds the control socket, replacing a stale socket file; refuses when a
/// live gateway answers on it.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            std::fs::create_dir_all(dir)?;
        }
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "control socket {} is in use: another gateway is running",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(l)
}

/// How long a client may take to send its request line, and to take the
/// answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Answers `status` requests until the task is dropped (the control plane
/// stops; it then removes the socket file).
pub async fn serve(listener: UnixListener, shared: Arc<Shared>) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("control socket: {e}");
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = handle(stream, shared).await {
                        tracing::debug!("control client: {e}");
                    }
                });
            }
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!("control socket: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn handle(stream: tokio::net::UnixStream, shared: Arc<Shared>) -> io::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let timed_out = |_| io::Error::new(io::ErrorKind::TimedOut, "client too slow");
    let (rd, mut w) = stream.into_split();
    let mut line = String::new();
    tokio::time::timeout(
        CLIENT_TIMEOUT,
        tokio::io::BufReader::new(rd.take(1024)).read_line(&mut line),
    )
    .await
    .map_err(timed_out)??;
    let body = match line.trim() {
        "status" => {
            // The snapshot waits on the device loops (a condition
            // variable): off the runtime's thread.
            let snap = tokio::task::spawn_blocking(move || shared.snapshot(CLIENT_TIMEOUT))
                .await
                .ok()
                .flatten();
            match snap {
                Some(s) => serde_json::to_string(&s).map_err(io::Error::other)?,
                None => r#"{"error":"no snapshot"}"#.to_string(),
            }
        }
        // What the last SIGHUP applied and what needs a restart.
        "last-reload" => match shared.last_reload.lock().ok().and_then(|g| g.clone()) {
            Some(r) => r.to_json().to_string(),
            None => r#"{"error":"no reload yet"}"#.to_string(),
        },
        // Digests of the keys the running configuration was loaded with
        // (never the keys): `check-config --diff` compares a key file
        // rewritten in place with them.
        "key-digests" => match shared.config.lock().ok().and_then(|g| g.clone()) {
            Some(c) => {
                let d = c.wan.key_digests;
                serde_json::json!({
                    "psk": KeyDigests::hex(&d.psk),
                    "private_key": KeyDigests::hex(&d.private_key),
                })
                .to_string()
            }
            None => r#"{"error":"no running configuration"}"#.to_string(),
        },
        other => serde_json::json!({ "error": format!("unknown request {other:?}") }).to_string(),
    };
    tokio::time::timeout(CLIENT_TIMEOUT, async {
        w.write_all(body.as_bytes()).await?;
        w.write_all(b"\n").await?;
        w.shutdown().await
    })
    .await
    .map_err(timed_out)?
}

/// Sends `request` (one line) to the gateway behind `path` and returns its
/// JSON answer; an answer naming an error is that error. (`status` and
/// `key-digests` are asked the same way.)
fn ask(path: &Path, request: &str) -> io::Result<serde_json::Value> {
    let mut s = UnixStream::connect(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("{request}\n").as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| io::Error::other(format!("bad answer: {e}")))?;
    if let Some(e) = v.get("error") {
        return Err(io::Error::other(format!("gateway answered: {e}")));
    }
    Ok(v)
}

/// Asks the gateway behind `path` for its snapshot.
pub fn query(path: &Path) -> io::Result<Snapshot> {
    serde_json::from_value(ask(path, "status")?)
        .map_err(|e| io::Error::other(format!("bad answer: {e}")))
}

/// Asks the gateway behind `path` for the digests of the keys it runs
/// with (`key-digests`).
pub fn query_key_digests(path: &Path) -> io::Result<KeyDigests> {
    let v = ask(path, "key-digests")?;
    let digest = |k: &str| match v.get(k) {
        Some(serde_json::Value::Null) | None => Ok(None),
        Some(serde_json::Value::String(h)) => KeyDigests::from_hex(h)
            .map(Some)
            .ok_or_else(|| io::Error::other(format!("bad answer: {k}"))),
        Some(_) => Err(io::Error::other(format!("bad answer: {k}"))),
    };
    Ok(KeyDigests {
        psk: digest("psk")?,
        private_key: digest("private_key")?,
    })
}

/// A bit rate as `soya status` and the startup summary show it.
pub(super) fn rate(bps: u64) -> String {
    let b = bps as f64;
    if b >= 1e9 {
        format!("{:.2} Gb/s", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} Mb/s", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kb/s", b / 1e3)
    } else {
        format!("{bps} b/s")
    }
}

fn bytes(n: u64) -> String {
    let b = n as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{n} B")
    }
}

fn ms(us: u64) -> String {
    format!("{:.3} ms", us as f64 / 1e3)
}

/// The `soya status` table (think `wg show`).
pub fn render_status(s: &Snapshot) -> String {
    let mut o = String::new();
    let peer = s
        .peer_generation
        .map_or_else(|| "none".to_string(), |g| format!("{g:016x}"));
    let _ = writeln!(o, "gateway: {} ({})", s.site, s.state);
    let _ = writeln!(
        o,
        "  version: {}   uptime: {:.1} s   policy: {}{}",
        s.version,
        s.uptime_secs,
        s.policy,
        if s.insecure {
            "   WAN: INSECURE (lab)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        o,
        "  twin: {}   generation: {:016x}   peer generation: {}",
        twin_line(s),
        s.generation,
        peer
    );
    let _ = writeln!(o, "  dc: {}", s.backend);
    // Destructured so that each line reads as its format string.
    let super::snapshot::DcCounters {
        rx_packets,
        rx_accepted,
        rx_malformed,
        rx_acl_source,
        rx_acl_destination,
        rx_draining,
        rx_backpressure,
        rx_kernel_drops,
        tx_packets,
        tx_no_peer,
        tx_acl,
        tx_errors,
        ..
    } = s.dc;
    let (rx_bytes, tx_bytes) = (bytes(s.dc.rx_bytes), bytes(s.dc.tx_bytes));
    let _ = writeln!(
        o,
        "    rx {rx_packets} pkts ({rx_bytes}): accepted {rx_accepted}, malformed {rx_malformed}, acl src {rx_acl_source}, acl dst {rx_acl_destination}, draining {rx_draining}, backpressure {rx_backpressure}, kernel drops {rx_kernel_drops}"
    );
    let _ = writeln!(
        o,
        "    tx {tx_packets} pkts ({tx_bytes}): no peer {tx_no_peer}, acl {tx_acl}, errors {tx_errors}"
    );
    let super::snapshot::BufferSnap {
        slots_used,
        slots_total,
        high_water,
        slot_bytes,
    } = s.buffer;
    let (used_pct, slot_bytes) = (
        100.0 * slots_used as f64 / slots_total.max(1) as f64,
        bytes(slot_bytes),
    );
    let _ = writeln!(
        o,
        "  buffer: {slots_used}/{slots_total} slots ({used_pct:.1}%), high water {high_water} slots, {slot_bytes} per slot"
    );
    let super::snapshot::TwinCounters {
        msgs_out,
        msgs_in,
        pending_messages,
        pending_overflow,
        datagrams_out,
        datagrams_in,
        datagram_acl_drops,
        ..
    } = s.twin;
    let pending = bytes(s.twin.pending_bytes);
    let _ = writeln!(
        o,
        "  twin msgs: out {msgs_out}, in {msgs_in}; waiting {pending_messages} ({pending}), overflow {pending_overflow}; datagrams out {datagrams_out}, in {datagrams_in}, acl drops {datagram_acl_drops}"
    );
    // Only once the twin restarted: what became of the QPs through it
    // (`qp::resume`; a far gateway's restart resumes them, issue 35).
    let restarts = s.wan.peer_restarts;
    let planned = s.twin.twin_restarts_clean;
    if restarts + planned > 0 {
        let e = &s.engine;
        let _ = writeln!(
            o,
            "  twin restarts: {restarts} unplanned, {planned} planned (CLOSE \"restart\"); QPs resumed {}, \
             {} packets resent; failed {}, of which unresumable {} ({} with requests the other way, \
             pseudo-ACKed by the twin; {} missing a request's bytes)",
            s.twin.flows_resumed_on_restart,
            e.packets_resent_on_resume,
            s.twin.flows_failed_on_restart,
            e.halves_unresumable,
            e.halves_unresumable_two_way,
            e.halves_unresumable_bytes_lost,
        );
        let t = &s.twin;
        if t.twin_returns > 0 {
            let _ = writeln!(
                o,
                "  planned restarts' pause (CLOSE to the next session): last {:.1} ms, longest {:.1} ms, \
                 mean {:.1} ms over {}",
                t.restart_pause_last_us as f64 / 1e3,
                t.restart_pause_max_us as f64 / 1e3,
                t.restart_pause_sum_us as f64 / 1e3 / t.twin_returns as f64,
                t.twin_returns,
            );
        }
    }
    let super::snapshot::WanCounters {
        packets_sent,
        packets_received,
        packets_lost,
        packets_retransmitted,
        auth_failures,
        replays_dropped,
        malformed,
        peer_restarts,
        tx_key_packets,
        tx_key_limit,
        tx_key_updates,
        rx_key_updates,
        rekeys,
        ..
    } = s.wan;
    let _ = writeln!(
        o,
        "  wan: sent {packets_sent} pkts, received {packets_received}, lost {packets_lost}, retransmitted {packets_retransmitted}; auth failures {auth_failures}, replays {replays_dropped}, malformed {malformed}, peer restarts {peer_restarts}"
    );
    let limit = match tx_key_limit {
        0 => "no session".to_string(),
        u64::MAX => "no limit: lab mode".to_string(),
        n => format!("limit {n}"),
    };
    let _ = writeln!(
        o,
        "  wan keys: {tx_key_packets} pkts under the current sending key ({limit}); updates: ours {tx_key_updates}, twin's {rx_key_updates}; re-handshakes {rekeys}"
    );
    if s.shards.len() > 1 {
        let _ = writeln!(
            o,
            "  shards: {} (host pairs hashed over them; shard i uses wan ports + i)",
            s.shards.len()
        );
        for sh in &s.shards {
            let _ = writeln!(
                o,
                "    shard {:<2} {:<13} dc rx {} tx {}; twin msgs out {} in {}; wan sent {} received {}; handoff out {} in {} dropped {}; slots {}{}",
                sh.index,
                if sh.connected { "connected" } else { "NOT connected" },
                sh.dc_rx_accepted,
                sh.dc_tx_packets,
                sh.twin_msgs_out,
                sh.twin_msgs_in,
                sh.wan_packets_sent,
                sh.wan_packets_received,
                sh.handoff_out,
                sh.handoff_in,
                sh.handoff_dropped,
                sh.slots_used,
                if sh.alarm.is_empty() { String::new() } else { format!("\n      !! {}", sh.alarm) }
            );
        }
    } else if let Some(a) = s.shards.first().filter(|a| !a.alarm.is_empty()) {
        let _ = writeln!(o, "  !! {}", a.alarm);
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<16} {:<8} {:>10} {:>10} {:>7} {:>12} {:>11} {:>11} {:>11} {:>11}",
        "path", "state", "rtt", "min rtt", "loss", "rate", "cwnd", "in flight", "sent", "received"
    );
    for p in &s.paths {
        let name = if s.shards.len() > 1 {
            format!("{}#{}", p.name, p.shard)
        } else {
            p.name.clone()
        };
        let _ = writeln!(
            o,
            "{:<16} {:<8} {:>10} {:>10} {:>6.2}% {:>12} {:>11} {:>11} {:>11} {:>11}",
            name,
            p.state,
            ms(p.srtt_us),
            ms(p.min_rtt_us),
            p.loss_rate * 100.0,
            rate(p.pacing_rate_bps),
            bytes(p.cwnd_bytes),
            bytes(p.bytes_in_flight),
            bytes(p.bytes_sent),
            bytes(p.bytes_received)
        );
        let _ = writeln!(
            o,
            "  {} -> {}  weight {}  dscp {}  lost {}  down {}x",
            p.local, p.remote, p.weight, p.dscp, p.packets_lost, p.times_down
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "flows: {} known, busiest {} shown",
        s.flows_total,
        s.flows.len().min(10)
    );
    if !s.flows.is_empty() {
        let _ = writeln!(
            o,
            "{:<8} {:<36} {:<12} {:>10} {:>11} {:>10} {:>6} {:>6} {:>9}",
            "role", "half", "mode", "packets", "bytes", "pseudo-ack", "naks", "retx", "buffered"
        );
        for f in s.flows.iter().take(10) {
            let _ = writeln!(
                o,
                "{:<8} {:<36} {:<12} {:>10} {:>11} {:>10} {:>6} {:>6} {:>9}",
                f.role,
                f.half,
                f.mode,
                f.packets,
                bytes(f.bytes),
                f.pseudo_acks,
                f.naks,
                f.retransmissions,
                f.buffered
            );
        }
    }
    o
}

/// What the status says of the twin: never `connected` for a twin that
/// does not answer.
fn twin_line(s: &Snapshot) -> String {
    let t = &s.twin_status;
    match t.state.as_str() {
        "lost" => format!(
            "LOST since {:.1} s ago (no WAN path for {:.1} s; wan.twin_timeout {:.1} s): its flows were failed, new requests are refused",
            t.lost_for_secs, t.for_secs, t.timeout_secs
        ),
        "unreachable" => format!(
            "UNREACHABLE for {:.1} s (every WAN path down; lost after {:.1} s)",
            t.for_secs, t.timeout_secs
        ),
        "connecting" => format!(
            "NOT connected (waiting {:.1} s; lost after {:.1} s)",
            t.for_secs, t.timeout_secs
        ),
        _ if s.connected => "connected".into(),
        _ => "NOT connected".into(),
    }
}
