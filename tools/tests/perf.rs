//! soya-perf end to end over loopback: a server and a client, each on its
//! own 127.x address on UDP port 4791, in-process (library API) and as
//! processes (the binary). Every test uses its own address pair so the
//! tests can run in parallel; all are bounded in time.

#![deny(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use soya_tools::perf::server::Server;

mod common;
use soya_tools::perf::{
    run_client, run_server, ClientConfig, Op, PerfReport, ProgressTo, RunLimit, ServerConfig,
};

const BIN: &str = env!("CARGO_BIN_EXE_soya-perf");

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Server on `srv` (one session, in a thread) and client on `cli`.
fn pair(srv: &str, cli: &str, tweak: impl FnOnce(&mut ClientConfig)) -> (PerfReport, PerfReport) {
    let scfg = ServerConfig {
        bind_ip: ip(srv),
        accept_timeout: Some(Duration::from_secs(20)),
        idle_timeout: Duration::from_secs(20),
        ..ServerConfig::default()
    };
    let server = thread::spawn(move || run_server(scfg));
    let mut c = ClientConfig {
        server: SocketAddr::new(ip(srv), 18515),
        bind_ip: ip(cli),
        progress: ProgressTo::Off,
        ..ClientConfig::default()
    };
    tweak(&mut c);
    let client = run_client(&c).expect("client ran");
    let server = server.join().unwrap().expect("server ran");
    (client, server)
}

fn assert_clean(c: &PerfReport, s: &PerfReport) {
    assert!(c.ok, "client: {}", c.human());
    assert!(s.ok, "server: {}", s.human());
    assert_eq!(c.data_errors, 0);
    assert_eq!(c.remote_data_errors, Some(0));
    assert_eq!(s.data_errors, 0);
    assert_eq!(c.failed_completions, 0);
    assert_eq!(c.incomplete, 0);
    assert_eq!(c.bytes_lost, 0);
    assert_eq!(c.io.unknown_qp + c.io.bad_datagrams, 0);
    assert_eq!(s.packets.malformed_dropped + c.packets.malformed_dropped, 0);
    assert_eq!(
        s.packets.misaddressed_dropped + c.packets.misaddressed_dropped,
        0
    );
}

/// An `--iters` run: clean, and exactly `iters` messages per QP completed
/// at the client and counted at the server (WRITEs placed, SENDs received,
/// READs served).
fn exact_run(
    srv: &str,
    cli: &str,
    iters: u64,
    tweak: impl FnOnce(&mut ClientConfig),
) -> (PerfReport, PerfReport) {
    let mut qps = 0;
    let (c, s) = pair(srv, cli, |c| {
        c.limit = RunLimit::Iters(iters);
        tweak(c);
        qps = u64::from(c.qps);
    });
    assert_clean(&c, &s);
    assert_eq!(c.messages, qps * iters);
    assert_eq!(s.messages, c.messages, "the server's count");
    (c, s)
}

#[test]
fn write_iters_exact_and_verified() {
    let (c, s) = exact_run("127.0.41.3", "127.0.41.2", 300, |c| {
        c.op = Op::Write;
        c.size = 65_536;
        c.tx_depth = 32;
        c.qps = 2;
    });
    assert_eq!(c.messages, 600);
    assert_eq!(c.bytes, 600 * 65_536);
    assert_eq!(s.bytes, c.bytes);
    // The server checked every byte it received against the pattern.
    assert_eq!(c.bytes_verified, c.bytes);
    assert!(c.goodput_gbps > 0.0);
    assert_eq!(c.server.as_ref().unwrap().messages, 600);
}

#[test]
fn send_iters_exact_and_verified() {
    let (c, s) = exact_run("127.0.42.3", "127.0.42.2", 500, |c| {
        c.op = Op::Send;
        c.size = 10_000;
        c.tx_depth = 64;
        c.qps = 3;
        c.mtu = 2048;
    });
    assert_eq!(c.messages, 1500);
    assert_eq!(s.bytes, 1500 * 10_000);
    assert_eq!(c.bytes_verified, s.bytes);
    assert_eq!(c.rnrs, 0, "the server keeps receives posted");
}

#[test]
fn read_iters_exact_and_verified() {
    let (c, _) = exact_run("127.0.43.3", "127.0.43.2", 200, |c| {
        c.op = Op::Read;
        c.size = 100_000;
        c.tx_depth = 16;
        c.mtu = 1024;
        c.latency = true;
    });
    assert_eq!(c.messages, 200);
    // READ data is checked where it lands: at the client.
    assert_eq!(c.local_data_errors, 0);
    assert!(c.bytes_verified >= 200 * 100_000);
    let l = c.latency.as_ref().expect("latency with --lat");
    assert_eq!(l.samples, 200);
    assert!(l.min_us <= l.p50_us && l.p50_us <= l.p99_us && l.p99_us <= l.max_us);
}

/// The demo's way: a bound `Server` (control port 0: any free one) moved
/// to a thread, two sessions in a row on the same sockets.
#[test]
fn server_object_serves_sessions_in_a_row() {
    let mut srv = Server::bind(ServerConfig {
        bind_ip: ip("127.0.51.3"),
        port: 0,
        accept_timeout: Some(Duration::from_secs(20)),
        ..ServerConfig::default()
    })
    .unwrap();
    let ctl = srv.control_addr();
    assert_ne!(ctl.port(), 0);
    assert_eq!(srv.roce_addr().port(), 4791);
    let server = thread::spawn(move || (srv.serve_one(), srv.serve_one()));
    for op in [Op::Send, Op::Write] {
        let c = run_client(&ClientConfig {
            server: ctl,
            bind_ip: ip("127.0.51.2"),
            op,
            size: 3000,
            limit: RunLimit::Iters(77),
            ..ClientConfig::default()
        })
        .unwrap();
        assert!(c.ok, "{}", c.human());
        assert_eq!(c.messages, 77);
    }
    let (a, b) = server.join().unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.ok && b.ok);
    assert_eq!((a.op, a.messages), (Some(Op::Send), 77));
    assert_eq!((b.op, b.messages), (Some(Op::Write), 77));
}

#[test]
fn duration_mode_many_qps() {
    let t = Instant::now();
    let (c, s) = pair("127.0.44.3", "127.0.44.2", |c| {
        c.op = Op::Write;
        c.size = 4096;
        c.qps = 4;
        c.limit = RunLimit::Duration(Duration::from_millis(700));
    });
    assert_clean(&c, &s);
    assert!(c.messages > 0);
    assert_eq!(s.messages, c.messages);
    // Only a safety net against a run that never stops (not a speed
    // verdict: generous on any machine).
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "a 0.7 s run took {:?}: duration mode does not stop",
        t.elapsed()
    );
}

#[test]
fn wrong_rkey_is_a_remote_access_error() {
    let scfg = ServerConfig {
        bind_ip: ip("127.0.45.3"),
        accept_timeout: Some(Duration::from_secs(20)),
        wrong_rkey: true,
        ..ServerConfig::default()
    };
    let server = thread::spawn(move || run_server(scfg));
    let c = run_client(&ClientConfig {
        server: SocketAddr::new(ip("127.0.45.3"), 18515),
        bind_ip: ip("127.0.45.2"),
        op: Op::Write,
        size: 8192,
        limit: RunLimit::Iters(50),
        ..ClientConfig::default()
    })
    .expect("client ran");
    server.join().unwrap().expect("server ran");
    assert!(!c.ok);
    assert!(c.failed_completions >= 1);
    assert_eq!(c.messages, 0);
    assert!(c.fatal_naks >= 1, "{}", c.human());
    assert!(
        c.errors[0].contains("remote access error"),
        "{:?}",
        c.errors
    );
}

/// What goes on the wire is RoCEv2 with a valid ICRC for its real headers
/// (what a capture, a NIC or a gateway would check), not only for the
/// headers soya-perf rebuilds. A raw socket sees the datagrams with the IP
/// header the kernel sent; it needs CAP_NET_RAW, so without it the test says
/// so and passes.
#[test]
fn wire_packets_carry_valid_icrcs() {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let Ok(raw) = Socket::new(Domain::IPV4, Type::RAW.nonblocking(), Some(Protocol::UDP)) else {
        eprintln!("wire_packets_carry_valid_icrcs: skipped (raw sockets need CAP_NET_RAW)");
        return;
    };
    // Only 127.0.50.0/24 (this test's pair), so the other tests' traffic
    // cannot fill the buffer: a classic BPF filter on the IPv4 destination.
    let prog = [
        libc::sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 16,
        }, // ld [16]
        libc::sock_filter {
            code: 0x54,
            jt: 0,
            jf: 0,
            k: 0xffff_ff00,
        }, // and
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: 0x7f00_3200,
        }, // jeq
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0xffff,
        }, // ret all
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0,
        }, // ret none
    ];
    // A large buffer (SO_RCVBUFFORCE, beyond rmem_max: we have the
    // capability, raw sockets need it too), so the whole run fits.
    let _ = soya_io::sys::setsockopt_int(raw.as_raw_fd(), libc::SOL_SOCKET, 33, 16 << 20);
    raw.attach_filter(&prog)
        .unwrap_or_else(|e| panic!("attach filter: {e}"));
    for op in [Op::Write, Op::Read] {
        let (c, s) = pair("127.0.50.3", "127.0.50.2", |c| {
            c.op = op;
            c.size = 9000;
            c.tx_depth = 4;
            c.mtu = 4096;
            c.limit = RunLimit::Iters(20);
        });
        assert_clean(&c, &s);
    }
    let mut buf = vec![0u8; 70_000];
    let (mut ok, mut bad) = (0, Vec::new());
    loop {
        // Nothing more waiting (WouldBlock) ends the loop.
        let n = (&raw).read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        let p = &buf[..n];
        // Only ours: 127.0.50.x on both ends, UDP to 4791.
        let ours = p.len() > 28
            && p[12..15] == [127, 0, 50]
            && p[16..19] == [127, 0, 50]
            && u16::from_be_bytes([p[22], p[23]]) == 4791;
        if !ours {
            continue;
        }
        match soya_proto::roce::RocePacket::parse_verified(p) {
            Ok(_) => ok += 1,
            Err(e) => bad.push(format!("{e}")),
        }
    }
    assert!(
        bad.is_empty(),
        "{} bad of {}: {:?}",
        bad.len(),
        ok + bad.len(),
        &bad[..bad.len().min(5)]
    );
    // 20 WRITEs of 3 packets + 20 READs of 3 responses, plus ACKs/requests.
    assert!(ok >= 120, "only {ok} packets seen");
}

// ---- the binary ----

/// Kills the child (by its own handle) if the test ends early.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_server(addr: &str, extra: &[&str]) -> Reaper {
    let child = Command::new(BIN)
        .args([
            "server",
            "--once",
            "--json",
            "-q",
            "--accept-timeout",
            "20",
            "--bind-ip",
            addr,
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Reaper(child)
}

fn run_bin(args: &[&str]) -> Output {
    let mut child = common::spawn_piped(BIN, args);
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("soya-perf {args:?} did not finish");
        }
        thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `soya-perf client SERVER --bind-ip CLIENT ARGS...`, run to its end.
fn run_client_bin(server: &str, client: &str, args: &[&str]) -> Output {
    run_bin(&[&["client", server, "--bind-ip", client], args].concat())
}

fn server_output(mut r: Reaper) -> (Option<i32>, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while r.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "server did not exit");
        thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    use std::io::Read;
    r.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    (r.0.wait().unwrap().code(), out)
}

#[test]
fn binary_json_for_each_op() {
    for (k, op) in ["write", "send", "read"].iter().enumerate() {
        let srv = format!("127.0.46.{}", 10 + 2 * k);
        let cli = format!("127.0.46.{}", 11 + 2 * k);
        let server = spawn_server(&srv, &[]);
        let out = run_client_bin(
            &srv,
            &cli,
            &[
                "--op",
                op,
                "--size",
                "16K",
                "--tx-depth",
                "8",
                "--qps",
                "2",
                "--iters",
                "100",
                "--mtu",
                "4096",
                "--json",
                "-q",
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{op}: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        // The figures a script reads: those with no fixed value are numbers.
        for key in ["goodput_gbps", "retransmissions"] {
            assert!(v[key].is_number(), "{op}: {key} in {v}");
        }
        assert_eq!(v["op"], *op);
        assert_eq!(v["messages"], 200);
        assert_eq!(v["data_errors"], 0);
        assert_eq!(v["server"]["messages"], 200);
        let (code, sout) = server_output(server);
        assert_eq!(code, Some(0), "{op} server: {sout}");
        let sv: serde_json::Value = serde_json::from_str(sout.trim()).expect("server JSON");
        assert_eq!(sv["role"], "server");
        assert_eq!(sv["data_errors"], 0);
    }
}

#[test]
fn binary_human_output_and_progress() {
    let server = spawn_server("127.0.47.3", &[]);
    let out = run_client_bin(
        "127.0.47.3",
        "127.0.47.2",
        &["--op", "write", "--size", "4096", "--duration", "1.3"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("Gb/s  (avg"), "a progress line: {stdout}");
    assert!(stdout.contains("soya-perf client summary"), "{stdout}");
    assert!(stdout.contains("soya-perf server summary"), "{stdout}");
    assert!(stdout.contains("result       OK"), "{stdout}");
    drop(server);
}

#[test]
fn binary_usage_errors_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["client", "--op", "frobnicate"], "frobnicate"),
        (&["client", "--mtu", "1500"], "--mtu 1500"),
        (&["client", "--size", "0"], "--size 0"),
        (
            &["client", "--iters", "5", "--duration", "1"],
            "cannot be used with",
        ),
        (&["client", "--transport", "verbs"], "`verbs`"),
        (&["server", "--transport", "verbs"], "RDMA device"),
        (&["launch"], "unrecognized subcommand"),
    ];
    for (args, msg) in cases {
        let out = run_bin(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(msg), "{args:?}: {stderr}");
    }
}

#[test]
fn binary_wrong_rkey_fails_the_client() {
    let server = spawn_server("127.0.48.3", &["--wrong-rkey"]);
    let out = run_client_bin(
        "127.0.48.3",
        "127.0.48.2",
        &["--op", "read", "--size", "4096", "--iters", "20"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("remote access error"), "{stderr}");
    let (code, _) = server_output(server);
    assert_eq!(code, Some(0), "the server itself saw nothing wrong");
}

#[test]
fn binary_no_server_fails_cleanly() {
    let out = run_client_bin(
        "127.0.49.3",
        "127.0.49.2",
        &["--iters", "1", "--connect-timeout", "0.3"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot reach the soya-perf server"),
        "{stderr}"
    );
}

// ---- wait-send: nothing outstanding, waiting for the peer's SEND ----

#[test]
fn wait_send_succeeds_when_the_servers_sends_arrive() {
    let (c, s) = pair("127.0.57.1", "127.0.57.2", |c| {
        c.op = Op::WaitSend;
        c.size = 4096;
        c.send_after = Duration::from_millis(200);
        c.limit = RunLimit::Duration(Duration::from_secs(20));
    });
    assert!(c.ok, "client: {}", c.human());
    assert!(s.ok, "server: {}", s.human());
    assert_eq!((c.messages, c.bytes), (2, 8192), "two SENDs received");
    assert_eq!(s.messages, 2, "two SENDs completed at the server");
    assert_eq!(c.packets.requests_sent, 0, "nothing posted but receives");
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(v["op"], "wait-send");
    assert!(v.get("error").is_none(), "no error key on success: {v}");
}

/// Between the two: a relay playing the near gateway. It carries the first
/// SEND and its ACK, then loses its twin: it stops carrying and moves the
/// client's QP to error the way `soya_proto::qp::poison` does (a SEND Middle at
/// the QP's expected PSN, from the server's address to the client's QPN).
#[test]
fn wait_send_fails_with_an_error_when_its_qp_is_poisoned() {
    use soya_proto::qp::poison::{self, InProgress, Target};
    use soya_proto::roce::{OpKind, RocePacket};
    use std::net::UdpSocket;

    let (srv, cli, relay) = ("127.0.58.1", "127.0.58.2", "127.0.58.3");
    let relay_addr = SocketAddr::new(ip(relay), 4791);
    let srv_udp = SocketAddr::new(ip(srv), 4791);
    let cli_udp = SocketAddr::new(ip(cli), 4791);
    let sock = UdpSocket::bind(relay_addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let relay_thread = thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut first_send: Option<(u32, u32)> = None; // (PSN, client QPN)
        let mut server_qpn = None;
        let mut poisoned = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let pkt = &buf[..n];
            let Ok(p) = RocePacket::parse_verified(pkt) else {
                continue;
            };
            if from == cli_udp {
                if p.info.kind == OpKind::Ack {
                    server_qpn = Some(p.bth.dest_qp);
                }
                if first_send.is_none() || poisoned == 0 {
                    let _ = sock.send_to(pkt, srv_udp);
                }
                // The client ACKed the first SEND: the twin is now lost.
                if let (Some((psn, qpn)), 0) = (first_send, poisoned) {
                    if p.info.kind == OpKind::Ack && p.psn().value() == psn {
                        let t = Target {
                            far: ip(srv),
                            far_qpn: server_qpn,
                            local: ip(cli),
                            local_qpn: qpn,
                        };
                        let next = soya_proto::roce::Psn::new(psn).next();
                        let v = poison::packet(&t, next, InProgress::Nothing)
                            .unwrap()
                            .to_vec(&[])
                            .unwrap();
                        sock.send_to(&v, cli_udp).unwrap();
                        poisoned += 1;
                    }
                }
            } else if from == srv_udp && poisoned == 0 {
                if p.info.kind == OpKind::Send && first_send.is_none() {
                    first_send = Some((p.psn().value(), p.bth.dest_qp));
                }
                let _ = sock.send_to(pkt, cli_udp);
            }
        }
        poisoned
    });
    let tunnel = |me: &str| soya_tools::perf::endpoint::Tunnel {
        roce_ip: ip(me),
        to: Some(relay_addr),
        announce: false,
    };
    let scfg = ServerConfig {
        bind_ip: ip(srv),
        tunnel: Some(tunnel(srv)),
        accept_timeout: Some(Duration::from_secs(20)),
        idle_timeout: Duration::from_secs(20),
        ..ServerConfig::default()
    };
    let server = thread::spawn(move || run_server(scfg));
    let started = Instant::now();
    let c = run_client(&ClientConfig {
        server: SocketAddr::new(ip(srv), 18515),
        bind_ip: ip(cli),
        tunnel: Some(tunnel(cli)),
        op: Op::WaitSend,
        size: 4096,
        send_after: Duration::from_secs(2),
        limit: RunLimit::Duration(Duration::from_secs(20)),
        progress: ProgressTo::Off,
        ..ClientConfig::default()
    })
    .expect("client ran");
    let _ = server.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(relay_thread.join().unwrap(), 1, "one poison packet");
    assert!(!c.ok, "{}", c.human());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "failed fast, not at the wait limit"
    );
    assert_eq!(c.messages, 1, "the first SEND arrived");
    let err = c.error.clone().expect("an error");
    assert!(
        err.contains("flushed") && err.contains("error state"),
        "{err}"
    );
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(v["error"], serde_json::Value::String(err));
    assert_eq!(
        c.packets.error_naks_sent, 1,
        "NAK Invalid Request to the poison"
    );
}

#[test]
fn binary_wait_send_json() {
    let (srv, cli) = ("127.0.59.1", "127.0.59.2");
    let server = spawn_server(srv, &[]);
    let out = run_client_bin(
        srv,
        cli,
        &["--op", "wait-send", "--send-after", "0.2", "--json", "-q"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["op"], "wait-send");
    assert_eq!(v["messages"], 2);
    assert_eq!(v["ok"], true);
    let (code, sout) = server_output(server);
    assert_eq!(code, Some(0), "server: {sout}");
}
