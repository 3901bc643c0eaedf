//! The gateway daemon as an operator and a lab host see it, on loopback:
//! configuration errors, the startup summary, `/metrics`, `soya status`,
//! ACL counters, non-RoCE traffic crossing, twin restarts, SIGTERM drain
//! and SIGHUP. Every gateway here uses the udp (lab) backend: no root.
//! RDMA end to end (RC endpoints through a gateway pair) is
//! `tests/gateway_e2e.rs` in the integration-test crate; the tun backend,
//! with real processes in network namespaces (root), is
//! `tools/tests/netns.rs`.

#![deny(unsafe_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use soya::gateway::{control, Gateway, RunOutcome, Snapshot};

#[path = "common/lab.rs"]
mod lab;
use lab::{config_text, pair, restart, start, unique_ip, wait_for, write_key, Knobs, Pair};

fn soya() -> Command {
    Command::new(env!("CARGO_BIN_EXE_soya"))
}

/// Third octet of this binary's loopback addresses (`common::lab`).
const IP_BLOCK: u8 = 0;

fn write_configs(p: &Pair, keyed: bool) -> (PathBuf, PathBuf) {
    let key = keyed.then(|| write_key(&p.dir));
    lab::write_configs(
        p,
        &Knobs {
            key: key.as_deref(),
            ..Knobs::default()
        },
    )
}

/// An IPv4 ICMP echo request (not RoCE: it must travel as a WAN datagram).
fn icmp(src: [u8; 4], dst: [u8; 4], id: u16) -> Vec<u8> {
    let mut p = vec![0u8; 28];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&28u16.to_be_bytes());
    p[8] = 64;
    p[9] = 1;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    let ck = soya::roce::ip::ipv4_checksum(&p[..20]);
    p[10..12].copy_from_slice(&ck.to_be_bytes());
    p[20] = 8;
    p[24..26].copy_from_slice(&id.to_be_bytes());
    p
}

fn host(ip: Ipv4Addr) -> UdpSocket {
    let s = UdpSocket::bind((ip, 0)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    s
}

fn recv_ip(s: &UdpSocket, want: &[u8], within: Duration) -> bool {
    let t0 = Instant::now();
    let mut buf = [0u8; 9000];
    while t0.elapsed() < within {
        if let Ok((n, _)) = s.recv_from(&mut buf) {
            if &buf[..n] == want {
                return true;
            }
        }
    }
    false
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    http(addr, &format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n"))
}

/// Sends `requests` (several may be pipelined on the one connection) and
/// reads until the server closes.
fn http(addr: SocketAddr, requests: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(requests.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Both hosts talk through the gateway pair; returns the two host sockets
/// once each gateway has learned its host.
fn cross_datagrams(p: &Pair, a: &Gateway) -> (UdpSocket, UdpSocket) {
    let ha = host(unique_ip());
    let hb = host(unique_ip());
    wait_for(a, "twin connected", |s| s.connected);
    // B's host speaks first so that gateway B learns where 10.2.0.1 is;
    // its ping reaches A's gateway, which does not know 10.1.0.1 yet.
    let from_b = icmp([10, 2, 0, 1], [10, 1, 0, 1], 1);
    hb.send_to(&from_b, p.b.dc).unwrap();
    wait_for(a, "first datagram at A (host unknown)", |s| {
        s.dc.tx_no_peer >= 1
    });
    let from_a = icmp([10, 1, 0, 1], [10, 2, 0, 1], 2);
    ha.send_to(&from_a, p.a.dc).unwrap();
    assert!(
        recv_ip(&hb, &from_a, Duration::from_secs(5)),
        "A's ping never reached host B"
    );
    hb.send_to(&from_b, p.b.dc).unwrap();
    assert!(
        recv_ip(&ha, &from_b, Duration::from_secs(5)),
        "B's ping never reached host A"
    );
    (ha, hb)
}

#[test]
fn config_errors_name_file_line_and_key() {
    let p = pair("cfgerr");
    let (fa, _) = write_configs(&p, false);
    let bad = std::fs::read_to_string(&fa)
        .unwrap()
        .replace("weight = 1", "weight = 0");
    std::fs::write(&fa, &bad).unwrap();
    let line = bad.lines().position(|l| l == "weight = 0").unwrap() + 1;
    let out = soya()
        .args(["gateway", "--config"])
        .arg(&fa)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:{line}:", fa.display())), "{err}");
    assert!(err.contains("wan.paths[0].weight"), "{err}");
}

#[test]
fn check_prints_the_startup_summary() {
    let p = pair("check");
    let (fa, _) = write_configs(&p, true);
    let out = soya()
        .args(["gateway", "--check", "--config"])
        .arg(&fa)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "lab-a",
        &format!("udp lab backend on {}", p.a.dc),
        "10.1.0.0/16",
        "path p0",
        &p.b.wan.to_string(),
        "16.0 MiB",
        "pseudo_ack edge",
        &format!("http://{}/metrics", p.a.metrics),
        &p.a.socket.display().to_string(),
        "pre-shared key",
        "role client",
        "configuration OK",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    assert!(text.lines().count() <= 24, "more than a screen:\n{text}");
    // Nothing was started: the control socket does not exist.
    assert!(!p.a.socket.exists());

    let (fb, _) = (p.dir.join("b.toml"), ());
    let out = soya()
        .args(["gateway", "--check", "-c"])
        .arg(&fb)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("role server"));
}

/// The removed afpacket backend is refused naming what exists; an xdp
/// backend on an interface that does not exist fails startup naming the
/// interface, the cause and the tun alternative (never a silent fallback).
#[test]
fn afpacket_is_refused_and_xdp_on_a_missing_interface_fails_clearly() {
    let p = pair("afpacket");
    let (fa, _) = write_configs(&p, false);
    let udp = format!("backend = \"udp\"\nlisten = \"{}\"", p.a.dc);
    let original = std::fs::read_to_string(&fa).unwrap();
    // Each backend line, and what its refusal must say.
    let cases: [(&str, &[&str]); 2] = [
        (
            "backend = \"afpacket\"\ninterface = \"eth9\"",
            &["afpacket", "`xdp`", "`tun`"],
        ),
        (
            "backend = \"xdp\"\ninterface = \"nosuch9\"",
            &[
                "nosuch9",
                "no such network interface",
                "dc.backend = \"tun\"",
            ],
        ),
    ];
    for (backend, wants) in cases {
        std::fs::write(&fa, original.replace(&udp, backend)).unwrap();
        let out = soya().args(["gateway", "-c"]).arg(&fa).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        for want in wants {
            assert!(err.contains(want), "{want:?} missing: {err}");
        }
    }
}

fn datagrams_cross_and_acl_counts(keyed: bool) {
    let p = pair(if keyed {
        "cross-keyed"
    } else {
        "cross-insecure"
    });
    let (fa, fb) = write_configs(&p, keyed);
    let a = start(&fa);
    let b = start(&fb);
    let (ha, _hb) = cross_datagrams(&p, &a);

    // Refused at A's DC side: wrong source, wrong destination, not IP.
    ha.send_to(&icmp([10, 9, 0, 1], [10, 2, 0, 1], 3), p.a.dc)
        .unwrap();
    ha.send_to(&icmp([10, 1, 0, 1], [10, 1, 0, 2], 4), p.a.dc)
        .unwrap();
    ha.send_to(&icmp([10, 1, 0, 1], [192, 0, 2, 1], 5), p.a.dc)
        .unwrap();
    ha.send_to(b"\x45garbage", p.a.dc).unwrap();
    ha.send_to(&[0u8; 0], p.a.dc).unwrap();
    // A RoCE packet with a bad ICRC passes the ACL and is refused by the engine.
    let ip = soya::roce::IpHeader::v4([10, 1, 0, 1].into(), [10, 2, 0, 1].into());
    let to = soya::roce::builders::ReplyTo {
        ip,
        src_port: 0xc000,
        dest_qp: 0x22,
    };
    let mut ack = soya::roce::builders::ack(&to, soya::roce::Psn::new(7), 1)
        .to_vec(&[])
        .unwrap();
    *ack.last_mut().unwrap() ^= 0xff;
    ha.send_to(&ack, p.a.dc).unwrap();
    let s = wait_for(&a, "ACL counters", |s| {
        s.dc.rx_acl_source == 1
            && s.dc.rx_acl_destination == 2
            && s.dc.rx_malformed == 2
            && s.engine.dc_bad_icrc == 1
    });
    assert_eq!(s.twin.datagrams_out, 1, "{s:#?}");
    assert_eq!(s.twin.datagrams_in, 2, "{s:#?}");
    assert_eq!(s.dc.lab_hosts, 1);
    // The device loop counts its wake-ups (packets per turn, with the
    // packet counters): it woke at least once per packet batch it read.
    assert_eq!(s.shards.len(), 1, "{:?}", s.shards);
    assert!(s.shards[0].turns > 0, "{:?}", s.shards);
    assert_eq!(s.insecure, !keyed);

    // Garbage on B's WAN socket: dropped and counted by the transport.
    let refused = |s: &Snapshot| {
        s.wan.malformed + s.wan.auth_failures + s.wan.stale_generation + s.wan.no_session
    };
    let before = refused(&b.snapshot().unwrap());
    let junk = host(unique_ip());
    junk.send_to(b"not a soya packet", p.b.wan).unwrap();
    let mut forged = vec![0u8; 100];
    forged[0] = 1; // version 1, PROTECTED, path 0: fails authentication
    if !keyed {
        forged[1] = 0x80;
    }
    junk.send_to(&forged, p.b.wan).unwrap();
    let sb = wait_for(&b, "WAN garbage counted", |s| {
        s.wan.foreign_source == 2 && refused(s) >= before + 2
    });
    assert!(sb.connected);

    // The metrics endpoint and the control socket tell the same story.
    let m = http_get(p.a.metrics, "/metrics");
    assert!(m.starts_with("HTTP/1.0 200 OK"), "{m}");
    for want in [
        "soya_dc_rx_packets_total{result=\"acl_source\"} 1",
        "soya_dc_rx_packets_total{result=\"acl_destination\"} 2",
        "soya_dc_rx_packets_total{result=\"malformed\"} 2",
        "soya_engine_dc_packets_total{kind=\"bad_icrc\"} 1",
        "soya_wan_datagrams_total{dir=\"out\"} 1",
        "soya_wan_connected 1",
        "soya_path_state{path=\"p0\",state=\"up\"} 1",
        "# TYPE soya_path_rtt_seconds gauge",
        "soya_buffer_slots_total ",
        "soya_wan_key_updates_total{dir=\"send\"} ",
        "soya_wan_key_limit_packets ",
    ] {
        assert!(m.contains(want), "{want:?} missing from /metrics:\n{m}");
    }
    assert!(http_get(p.a.metrics, "/nope").starts_with("HTTP/1.0 404"));
    // What the HTTP stack brings: content negotiation (OpenMetrics for
    // Prometheus' Accept), HEAD without a body, and keep-alive (a HEAD and
    // a GET pipelined on one HTTP/1.1 connection).
    let om = http(
        p.a.metrics,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3\r\nConnection: close\r\n\r\n",
    );
    assert!(om.starts_with("HTTP/1.1 200 OK\r\n"), "{om}");
    assert!(
        om.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{om}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    let two = http(
        p.a.metrics,
        "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let answers: Vec<&str> = two.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
    assert_eq!(answers.len(), 2, "HEAD then GET on one connection:\n{two}");
    assert!(
        answers[0].to_ascii_lowercase().contains("content-length: "),
        "{two}"
    );
    assert!(
        !answers[0].contains("# HELP"),
        "HEAD answered with a body:\n{two}"
    );
    assert!(answers[1].contains("soya_wan_connected 1\n"), "{two}");

    let snap = control::query(&p.a.socket).unwrap();
    assert_eq!(snap.site, "lab-a");
    assert_eq!(snap.dc.rx_acl_source, 1);
    let out = soya()
        .args(["status", "--socket"])
        .arg(&p.a.socket)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.contains("gateway: lab-a (running)"), "{table}");
    assert!(table.contains("twin: connected"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("p0 ") && l.contains(" up ")),
        "{table}"
    );
    let out = soya()
        .args(["status", "--json", "--socket"])
        .arg(&p.b.socket)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["site"], "lab-b");
    assert_eq!(v["paths"][0]["state"], "up");

    let sa = a.wait_drain();
    assert_eq!(sa.outcome, RunOutcome::Drained, "{sa}");
    assert!(!p.a.socket.exists(), "control socket left behind");
    drop(b);
}

trait DrainWait {
    fn wait_drain(self) -> soya::gateway::RunSummary;
}

impl DrainWait for Gateway {
    fn wait_drain(self) -> soya::gateway::RunSummary {
        self.drain();
        self.wait()
    }
}

#[test]
fn datagrams_cross_and_acl_drops_are_counted_insecure() {
    datagrams_cross_and_acl_counts(false);
}

#[test]
fn datagrams_cross_and_acl_drops_are_counted_keyed() {
    datagrams_cross_and_acl_counts(true);
}

#[test]
fn keyed_and_insecure_twins_refuse_each_other() {
    let p = pair("mismatch");
    let key = write_key(&p.dir);
    let fa = p.dir.join("a.toml");
    let fb = p.dir.join("b.toml");
    let keyed = Knobs {
        key: Some(&key),
        ..Knobs::default()
    };
    std::fs::write(&fa, config_text(&p.a, &p.b, &keyed)).unwrap();
    std::fs::write(&fb, config_text(&p.b, &p.a, &Knobs::default())).unwrap();
    let a = start(&fa);
    let b = start(&fb);
    let s = wait_for(&a, "auth failures", |s| s.wan.auth_failures >= 2);
    assert!(!s.connected);
    assert!(!b.snapshot().unwrap().connected);
}

#[test]
fn a_restarted_twin_is_detected_and_traffic_resumes() {
    let p = pair("restart");
    let (fa, fb) = write_configs(&p, false);
    let a = start(&fa);
    let b = start(&fb);
    wait_for(&a, "connected", |s| s.connected);
    let g1 = wait_for(&b, "connected", |s| s.connected).generation;
    let sb = b.abort();
    assert_eq!(sb.outcome, RunOutcome::Aborted);
    let _b = restart(&fb);
    let s = wait_for(&a, "peer restart", |s| {
        s.wan.peer_restarts == 1 && s.connected
    });
    assert_ne!(s.peer_generation, Some(g1));
    // Traffic resumes through the new session.
    cross_datagrams(&p, &a);
}

fn wait_child(c: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if let Some(s) = c.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A `soya gateway` child that is killed when the test ends, however it
/// ends: a failed assertion must not leave a daemon running (one left by a
/// failed run of `sighup_reloads_and_sigterm_drains_with_exit_zero` was
/// still up an hour and a half later, holding its loopback ports).
struct Daemon(Child);

impl std::ops::Deref for Daemon {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Both fail harmlessly once the child has exited and been reaped.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_daemon(cfg: &Path, socket: &Path) -> Daemon {
    let c = Daemon(
        soya()
            .args(["gateway", "--config"])
            .arg(cfg)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let t0 = Instant::now();
    while !socket.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "daemon never opened its control socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c
}

fn signal(c: &Child, sig: i32) {
    soya::sys::kill(c.id(), sig).unwrap();
}

#[test]
fn sighup_reloads_and_sigterm_drains_with_exit_zero() {
    let p = pair("signals");
    let (fa, _) = write_configs(&p, false);
    let mut child = spawn_daemon(&fa, &p.a.socket);

    // SIGHUP: a new log level and a new path weight apply live.
    let knobs = Knobs {
        level: "debug",
        weight: 7,
        ..Knobs::default()
    };
    let text = config_text(&p.a, &p.b, &knobs);
    std::fs::write(&fa, text).unwrap();
    // stderr is read as it comes: the reload is over once the daemon has
    // logged what needs a restart (its last line about a SIGHUP).
    let (lines, stderr) = std::sync::mpsc::channel();
    let reader = child.stderr.take().unwrap();
    let stderr_thread = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(reader)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines.send(line);
        }
    });
    signal(&child, libc::SIGHUP);
    let mut err = String::new();
    while !err.contains("need a restart") {
        match stderr.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => {
                err.push_str(&line);
                err.push('\n');
            }
            Err(e) => panic!("no reload logged after SIGHUP ({e}): {err}"),
        }
    }
    // After the reload the gateway keeps running and answering, with the
    // new weight.
    let s = control::query(&p.a.socket).unwrap();
    assert_eq!(s.state, "running");
    assert_eq!(s.paths[0].weight, 7);

    signal(&child, libc::SIGTERM);
    let status = wait_child(&mut child, Duration::from_secs(10)).expect("no exit after SIGTERM");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    stderr_thread.join().unwrap();
    for line in stderr.try_iter() {
        err.push_str(&line);
        err.push('\n');
    }
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("Sōya gateway \"lab-a\""), "{out}");
    assert!(out.contains("lab-a: drained cleanly"), "{out}");
    assert!(err.contains("SIGHUP"), "{err}");
    assert!(err.contains("log.level"), "{err}");
    assert!(
        err.contains("applied: log.level, wan.paths") && err.contains("weight changed"),
        "{err}"
    );
    assert!(err.contains("need a restart: nothing"), "{err}");
    assert!(err.contains("draining"), "{err}");
    assert!(!p.a.socket.exists());
}

#[test]
fn a_second_gateway_on_the_same_control_socket_is_refused() {
    let p = pair("twice");
    let (fa, _) = write_configs(&p, false);
    let a = start(&fa);
    // Same control socket, other ports.
    let other = p.a.moved();
    let f2 = p.dir.join("a2.toml");
    std::fs::write(&f2, config_text(&other, &p.b, &Knobs::default())).unwrap();
    let cfg = soya_config::load(&f2).unwrap();
    let err = Gateway::start(&cfg).err().expect("second gateway started");
    assert!(
        err.to_string().contains("another gateway is running"),
        "{err}"
    );
    drop(a);
}

/// `soya genkey` into `dir/name`; returns (file, public key).
fn genkey(dir: &Path, name: &str) -> (PathBuf, String) {
    let f = dir.join(name);
    assert!(soya()
        .arg("genkey")
        .arg(&f)
        .output()
        .unwrap()
        .status
        .success());
    let out = soya().arg("pubkey").arg(&f).output().unwrap();
    assert!(out.status.success());
    (f, String::from_utf8(out.stdout).unwrap().trim().to_string())
}

/// `me`'s configuration with identity keys and the PSK `psk` mixed in.
fn identity_config(
    me: &lab::Side,
    twin: &lab::Side,
    psk: &Path,
    private: &Path,
    twin_pub: &str,
) -> String {
    let text = config_text(
        me,
        twin,
        &Knobs {
            key: Some(psk),
            ..Knobs::default()
        },
    );
    let line = format!("key_file = \"{}\"", psk.display());
    assert!(text.contains(&line));
    text.replace(
        &line,
        &format!(
            "{line}\nprivate_key_file = \"{}\"\ntwin_public_key = \"{twin_pub}\"",
            private.display()
        ),
    )
}

/// The two gateways of a pair started with identity keys beside the PSK,
/// each config naming the other's public key: the files and the gateways.
struct Keyed {
    psk: PathBuf,
    /// A's and B's private key files and public keys, and their configs.
    ka: PathBuf,
    kb: PathBuf,
    pb: String,
    fa: PathBuf,
    fb: PathBuf,
    a: Gateway,
    b: Gateway,
}

fn start_keyed(p: &Pair) -> Keyed {
    let psk = write_key(&p.dir);
    let (ka, pa) = genkey(&p.dir, "a.key");
    let (kb, pb) = genkey(&p.dir, "b.key");
    let (fa, fb) = (p.dir.join("a.toml"), p.dir.join("b.toml"));
    std::fs::write(&fa, identity_config(&p.a, &p.b, &psk, &ka, &pb)).unwrap();
    std::fs::write(&fb, identity_config(&p.b, &p.a, &psk, &kb, &pa)).unwrap();
    let a = start(&fa);
    let b = start(&fb);
    Keyed {
        psk,
        ka,
        kb,
        pb,
        fa,
        fb,
        a,
        b,
    }
}

/// Reloads each gateway from its config file, in this order, and checks
/// that the key change applied live (nothing needs a restart, no error).
fn reload_keys_live(order: [(&Gateway, &PathBuf); 2]) {
    for (gw, f) in order {
        let r = gw.control().reload(&soya_config::load(f).unwrap());
        assert!(r.need_restart.is_empty() && r.errors.is_empty(), "{r:?}");
        assert!(
            r.applied
                .iter()
                .any(|k| k.starts_with("wan.private_key_file")),
            "{r:?}"
        );
    }
}

/// The hosts `cross_datagrams` made (A's, B's) ping each other through the
/// pair, one ping each way (ICMP ids `id` and `id + 1`).
fn ping_both_ways(p: &Pair, (ha, hb): (&UdpSocket, &UdpSocket), id: u16) {
    for (i, (from, to, dc, src, dst)) in [
        (ha, hb, p.a.dc, [10, 1, 0, 1], [10, 2, 0, 1]),
        (hb, ha, p.b.dc, [10, 2, 0, 1], [10, 1, 0, 1]),
    ]
    .into_iter()
    .enumerate()
    {
        let ping = icmp(src, dst, id + i as u16);
        from.send_to(&ping, dc).unwrap();
        assert!(recv_ip(to, &ping, Duration::from_secs(5)), "ping {i}");
    }
}

/// Identity keys rotated by reload (what SIGHUP does): a new key pair for
/// A, B told its new public key first, then A reloaded. Both reloads apply
/// live (nothing needs a restart), the session stays (no restart, same
/// generations), a re-handshake under the new keys completes, and traffic
/// crosses before and after.
#[test]
fn identity_keys_rotate_on_reload_without_a_restart() {
    let p = pair("rotate");
    let Keyed {
        psk,
        kb,
        pb,
        fa,
        fb,
        a,
        b,
        ..
    } = start_keyed(&p);
    let ga = wait_for(&b, "connected", |s| s.connected).peer_generation;
    let gb = wait_for(&a, "connected", |s| s.connected).peer_generation;
    let (ha, hb) = cross_datagrams(&p, &a);
    let (ka2, pa2) = genkey(&p.dir, "a2.key");
    std::fs::write(&fb, identity_config(&p.b, &p.a, &psk, &kb, &pa2)).unwrap();
    std::fs::write(&fa, identity_config(&p.a, &p.b, &psk, &ka2, &pb)).unwrap();
    reload_keys_live([(&b, &fb), (&a, &fa)]);
    for (gw, peer) in [(&a, gb), (&b, ga)] {
        let s = wait_for(gw, "a re-handshake under the new keys", |s| {
            s.wan.rekeys >= 1 && s.connected
        });
        assert_eq!(s.wan.peer_restarts, 0);
        assert_eq!(s.peer_generation, peer);
    }
    // The same hosts again (their gateways know where they are).
    ping_both_ways(&p, (&ha, &hb), 10);
}

/// A key rotated by rewriting the key file in place (same path, new key:
/// what `soya genkey` to a temporary file and a copy over the old one do):
/// `soya check-config --diff` with the running file on both sides sees it
/// (it asks the running gateway for the digests of its keys), and a reload
/// applies it live, as for a new path; a re-handshake under the new keys
/// completes on both sides and traffic crosses after it.
#[test]
fn a_key_file_rewritten_in_place_is_seen_and_rotated() {
    let p = pair("inplace");
    let Keyed {
        psk,
        ka,
        kb,
        fa,
        fb,
        a,
        b,
        ..
    } = start_keyed(&p);
    wait_for(&a, "connected", |s| s.connected);
    wait_for(&b, "connected", |s| s.connected);
    let (ha, hb) = cross_datagrams(&p, &a);
    let diff = || {
        let out = soya()
            .args(["check-config", "--diff"])
            .arg(&fa)
            .arg(&fa)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = diff();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("no change"), "{text}");
    assert!(
        text.contains("keys: compared with those the gateway"),
        "{text}"
    );
    // A's new key pair, written over a.key; B told its public key.
    let (ka2, pa2) = genkey(&p.dir, "a2.key");
    let new_key = std::fs::read(&ka2).unwrap();
    std::fs::write(&ka, &new_key).unwrap();
    std::fs::write(&fb, identity_config(&p.b, &p.a, &psk, &kb, &pa2)).unwrap();
    let (code, text) = diff();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("live:    wan.private_key_file / wan.twin_public_key / wan.key_file"),
        "{text}"
    );
    assert!(!text.contains("restart:"), "{text}");
    assert!(
        !text.contains(std::str::from_utf8(&new_key).unwrap().trim()),
        "{text}"
    );
    reload_keys_live([(&b, &fb), (&a, &fa)]);
    // Applied: the running gateway's keys are the file's again.
    let (_, text) = diff();
    assert!(text.contains("no change"), "{text}");
    for gw in [&a, &b] {
        let s = wait_for(gw, "a re-handshake under the new keys", |s| {
            s.wan.rekeys >= 1 && s.connected
        });
        assert_eq!(s.wan.peer_restarts, 0);
    }
    ping_both_ways(&p, (&ha, &hb), 20);
}
