//! soya-wanem on real loopback sockets (and, as root, between network
//! namespaces over TUN). Every test is bounded in time and traffic, and
//! sends only to 127.0.0.1 or to namespaces it creates itself. Timing
//! assertions are loose (a shared 2-core machine); the accuracy figures
//! are printed (`cargo test -- --nocapture`) and measured precisely by
//! `soya-wanem selftest`.

#![deny(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use soya_tools::wanem::engine::EngineOptions;
use soya_tools::wanem::profile::ProfileSpec;
use soya_tools::wanem::selftest::{self, Options};
use soya_tools::wanem::udp::{self, PathSpec};

mod common;
use common::{in_netns, ip, netns_missing, netns_required, skip, Netns};

const BIN: &str = env!("CARGO_BIN_EXE_soya-wanem");

/// A UDP socket on loopback whose receive buffer holds a whole test's
/// datagrams (16 MiB, forced beyond rmem_max as root, else the most the
/// kernel grants): a receiver the scheduler leaves waiting while the relay
/// sends must find them queued, not dropped.
fn loopback() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    soya_io::sys::tune_udp_socket(s.as_raw_fd(), 16 << 20);
    s
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    loopback().local_addr().unwrap().port()
}

fn relay(
    forward: SocketAddr,
    a2b: ProfileSpec,
    b2a: ProfileSpec,
) -> soya_tools::wanem::engine::Emulator {
    udp::start(
        vec![PathSpec {
            name: "t".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            forward,
            a_to_b: a2b.to_link(),
            b_to_a: b2a.to_link(),
        }],
        &EngineOptions::default(),
    )
    .unwrap()
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn relay_adds_the_configured_delay() {
    let o = Options {
        packets: 1000,
        probe_interval: Duration::from_micros(500),
        ..Options::default()
    };
    let d = selftest::measure_delay(&o, Duration::from_millis(3), false).unwrap();
    println!(
        "added delay at 3 ms over {} probes: error mean {:+.1} us, p50 {:+.1} us, p99 {:+.1} us, max |error| {:.1} us, {:.1} % within ±50 us",
        d.probes_received,
        d.error_mean_us,
        d.error_p50_us,
        d.error_p99_us,
        d.error_max_abs_us,
        d.within_50us * 100.0
    );
    assert_eq!(d.probes_received, 1000, "a lossless relay lost probes");
    // Loose: the median within ±1 ms; never noticeably early.
    assert!(d.error_p50_us.abs() < 1000.0, "{d:?}");
    assert!(d.error_p1_us > -100.0, "probes arrived early: {d:?}");
}

#[test]
fn random_loss_is_within_five_sd() {
    let l = selftest::measure_loss(
        20_000,
        ProfileSpec {
            loss: Some(0.1),
            ..Default::default()
        },
        "loss 0.1",
    )
    .unwrap();
    println!(
        "loss 0.1 over 20000: {} lost ({:.4}), z = {:+.2}; relay counted {}, kernel drops {}",
        l.sent - l.received,
        l.measured_loss,
        l.z,
        l.relay_drop_loss,
        l.kernel_drops
    );
    // The relay's own count is exact to the model: mean 2000, sd 42.4.
    let z = (l.relay_drop_loss as f64 - 2000.0) / (20_000.0f64 * 0.1 * 0.9).sqrt();
    assert!(z.abs() < 5.0, "{l:?}");
    // And what the receiver saw agrees, unless the machine dropped some.
    if l.kernel_drops == 0 {
        assert!(l.z.abs() < 5.0, "{l:?}");
    }
}

#[test]
fn link_down_window_drops_then_recovers() {
    let rx = loopback();
    rx.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let down = ProfileSpec {
        delay_ms: Some(1.0),
        down: Some(vec![[0.3, 0.6]]),
        ..Default::default()
    };
    let r = relay(rx.local_addr().unwrap(), down.clone(), down);
    let t0 = Instant::now();
    let tx = loopback();
    tx.connect(r.listen_addr(0)).unwrap();
    // The receiver runs until the end marker (a 9-byte datagram sent after
    // the last one, after the outage): however long the sending took.
    let recv = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < end, "the end marker never came through");
            match rx.recv(&mut buf) {
                Ok(8) => got.push(u64::from_le_bytes(buf[..8].try_into().unwrap())),
                Ok(9) => return got,
                _ => {}
            }
        }
    });
    // One datagram every 5 ms for 0.9 s; its payload is its send time (ms).
    let mut sent = Vec::new();
    for i in 0..180u64 {
        let at = Duration::from_millis(5 * i);
        if let Some(w) = at.checked_sub(t0.elapsed()) {
            std::thread::sleep(w);
        }
        let ms = t0.elapsed().as_millis() as u64;
        tx.send(&ms.to_le_bytes()).unwrap();
        sent.push(ms);
    }
    tx.send(b"end-mark!").unwrap();
    let got = recv.join().unwrap();
    let snap = r.stop();
    let st = &snap.paths[0].a_to_b;
    println!(
        "down 0.3-0.6 s: sent {}, got {}, drop_down {}",
        sent.len(),
        got.len(),
        st.drop_down
    );
    // Clear of the edges (the relay's clock starts a little before t0).
    for &ms in &sent {
        if (320..580).contains(&ms) {
            assert!(
                !got.contains(&ms),
                "sent at {ms} ms, inside the outage, yet delivered"
            );
        }
        if !(280..=640).contains(&ms) {
            assert!(
                got.contains(&ms),
                "sent at {ms} ms, outside the outage, yet lost"
            );
        }
    }
    // Between what was surely sent inside the outage and what may have
    // been (the edges): counted from the actual send times, so that a slow
    // machine that sends fewer datagrams in the window still passes.
    let inside = sent.iter().filter(|ms| (320..580).contains(*ms)).count() as u64;
    let maybe = sent.iter().filter(|ms| (280..=640).contains(*ms)).count() as u64;
    assert!(
        (inside..=maybe).contains(&st.drop_down),
        "{st:?}: {inside} to {maybe} sent inside the outage"
    );
    assert_eq!(st.drop_down + st.forwarded, st.received);
}

/// Starts the binary and waits until it has bound its sockets (its banner).
fn spawn_wanem(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = common::spawn_piped(BIN, args);
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l.contains("b->a:") => break,
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                panic!("soya-wanem did not start");
            }
        }
    }
    (child, rx)
}

/// A `soya-wanem udp --json` relay from a fresh port to `server`, with
/// `extra` options: (its listen address, the child).
fn udp_relay_to(server: &UdpSocket, extra: &[&str]) -> (String, Child) {
    let listen = format!("127.0.0.1:{}", free_port());
    let forward = server.local_addr().unwrap().to_string();
    let mut args = vec!["udp", "--listen", &listen, "--forward", &forward, "--json"];
    args.extend_from_slice(extra);
    let (child, _err) = spawn_wanem(&args);
    (listen, child)
}

/// Waits for `n` datagrams of `len` bytes at `server` (an event, not a
/// pause: the generous timeout only turns a lost datagram into a failure).
fn receive_all(server: &UdpSocket, n: usize, len: usize) {
    server
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 2048];
    for k in 0..n {
        match server.recv(&mut buf) {
            Ok(l) if l == len => {}
            other => panic!("datagram {k} of {n} not forwarded: {other:?}"),
        }
    }
}

fn summary(child: Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "exit {:?}", out.status);
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

#[test]
fn directions_have_their_own_profiles() {
    // Server side: an echo, timestamping arrivals.
    let server = loopback();
    let server_addr = server.local_addr().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let (child, _err) = spawn_wanem(&[
        "udp",
        "--listen",
        &listen,
        "--forward",
        &server_addr.to_string(),
        "--delay-ms",
        "1",
        "--b2a-delay-ms",
        "4",
        "--stats-interval",
        "0",
        // Ended by SIGTERM once the exchange is over (a loaded machine
        // may take longer than any fixed duration); this is a safety net.
        "--duration",
        "60",
        "--json",
    ]);
    let epoch = Instant::now();
    let echo = std::thread::spawn(move || {
        server
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut one_way = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = server.recv_from(&mut buf) {
            let now = epoch.elapsed().as_nanos() as u64;
            let sent = u64::from_le_bytes(buf[..8].try_into().unwrap());
            one_way.push((now - sent) as f64 / 1e6);
            buf[8..16].copy_from_slice(&epoch.elapsed().as_nanos().to_le_bytes()[..8]);
            server.send_to(&buf[..n.max(16)], from).unwrap();
        }
        one_way
    });
    let client = loopback();
    client.connect(&listen).unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut back = Vec::new();
    let mut buf = [0u8; 64];
    for _ in 0..100 {
        let mut m = [0u8; 16];
        m[..8].copy_from_slice(&(epoch.elapsed().as_nanos() as u64).to_le_bytes());
        client.send(&m).unwrap();
        if let Ok(16) = client.recv(&mut buf) {
            let now = epoch.elapsed().as_nanos() as u64;
            let sent = u64::from_le_bytes(buf[8..16].try_into().unwrap());
            back.push((now - sent) as f64 / 1e6);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut fwd = echo.join().unwrap();
    // The child we started, not yet waited for.
    let _ = soya_io::sys::kill(child.id(), libc::SIGTERM);
    let (a2b, b2a) = (percentile(&mut fwd, 0.5), percentile(&mut back, 0.5));
    let fastest = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (fa, fb) = (fastest(&fwd), fastest(&back));
    println!(
        "one-way: a->b median {a2b:.3} fastest {fa:.3} ms (1 ms asked), b->a median {b2a:.3} fastest {fb:.3} ms (4 ms asked)"
    );
    assert!(
        fwd.len() >= 95 && back.len() >= 95,
        "{} / {}",
        fwd.len(),
        back.len()
    );
    // Load-independent verdicts: no packet beats the delay asked (a lower
    // bound on every one), and the fastest of each direction is near it
    // (scheduling delays only ever add, and among ~100 packets one gets
    // through on time): a->b is not given b->a's 4 ms, nor b->a twice it.
    assert!(
        fwd.iter().all(|&d| d >= 0.9),
        "a->b faster than 1 ms: {fa} ms"
    );
    assert!(
        back.iter().all(|&d| d >= 3.9),
        "b->a faster than 4 ms: {fb} ms"
    );
    assert!(fa < 2.0, "a->b fastest {fa} ms: not its own 1 ms");
    assert!(fb < 5.0, "b->a fastest {fb} ms: not its own 4 ms");
    let s = summary(child);
    let p = &s["paths"][0];
    assert_eq!(s["mode"], "udp");
    assert_eq!(p["a_to_b"]["forwarded"], p["a_to_b"]["received"]);
    assert!(p["a_to_b"]["forwarded"].as_u64().unwrap() >= 95, "{s}");
    assert!(p["b_to_a"]["forwarded"].as_u64().unwrap() >= 95, "{s}");
    assert!(
        p["b_to_a_profile"]
            .as_str()
            .unwrap()
            .contains("delay 4.000 ms"),
        "{s}"
    );
}

#[test]
fn toml_paths_have_their_own_profiles() {
    let (sa, sb) = (loopback(), loopback());
    let (la, lb) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("wanem-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("wan.toml");
    std::fs::write(
        &cfg,
        format!(
            "stats_interval = 0\nduration = 1.5\n\
             [profile]\ndistance_km = 300\n\
             [[path]]\nname = \"clean\"\nlisten = \"127.0.0.1:{la}\"\nforward = \"{}\"\n\
             [[path]]\nname = \"dead\"\nlisten = \"127.0.0.1:{lb}\"\nforward = \"{}\"\n\
             [path.a_to_b]\nloss = 1.0\n",
            sa.local_addr().unwrap(),
            sb.local_addr().unwrap()
        ),
    )
    .unwrap();
    let (child, _err) = spawn_wanem(&["udp", "--config", cfg.to_str().unwrap(), "--json"]);
    let c = loopback();
    for _ in 0..50 {
        c.send_to(b"x", ("127.0.0.1", la)).unwrap();
        c.send_to(b"y", ("127.0.0.1", lb)).unwrap();
    }
    let s = summary(child);
    let _ = std::fs::remove_dir_all(&dir);
    let paths = s["paths"].as_array().unwrap();
    assert_eq!(paths[0]["name"], "clean");
    assert_eq!(paths[0]["a_to_b"]["forwarded"], 50, "{s}");
    assert_eq!(paths[1]["a_to_b"]["forwarded"], 0, "{s}");
    assert_eq!(paths[1]["a_to_b"]["drop_loss"], 50, "{s}");
    assert!(
        paths[0]["a_to_b_profile"]
            .as_str()
            .unwrap()
            .contains("delay 1.470 ms"),
        "{s}"
    );
}

fn expect_usage_error(args: &[&str], names: &[&str]) {
    let out = Command::new(BIN).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    for n in names {
        assert!(
            err.contains(n),
            "{args:?}: message does not name {n}: {err}"
        );
    }
}

#[test]
fn bad_configuration_exits_2_naming_the_flag() {
    let base = ["udp", "--listen", "127.0.0.1:1", "--forward", "127.0.0.1:2"];
    fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        base.iter().chain(extra).copied().collect()
    }
    expect_usage_error(&with(&base, &["--loss", "1.5"]), &["--loss", "probability"]);
    expect_usage_error(&with(&base, &["--a2b-ge", "0.1,0.2"]), &["--a2b-ge"]);
    expect_usage_error(
        &with(&base, &["--rate", "10GBps"]),
        &["--rate", "bytes per second"],
    );
    expect_usage_error(&with(&base, &["--queue", "lots"]), &["--queue"]);
    expect_usage_error(
        &with(&base, &["--distance-km", "300", "--delay-ms", "3"]),
        &["--distance-km", "--delay-ms"],
    );
    expect_usage_error(&with(&base, &["--down-at", "5"]), &["--down-at", "--up-at"]);
    expect_usage_error(
        &with(&base, &["--b2a-jitter-us", "-3"]),
        &["--b2a-jitter-us"],
    );
    expect_usage_error(
        &["udp", "--listen", "127.0.0.1:1"],
        &["--listen", "--forward"],
    );
    expect_usage_error(
        &["udp", "--listen", "nowhere", "--forward", "127.0.0.1:2"],
        &["--listen"],
    );
    expect_usage_error(&with(&base, &["--bogus"]), &["--bogus"]);
    let dir = std::env::temp_dir().join(format!("wanem-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[profile]\nlos = 0.1\n").unwrap();
    let c = cfg.to_str().unwrap();
    expect_usage_error(&with(&base, &["--config", c]), &["--config", "los"]);
    std::fs::write(&cfg, "[[path]]\nlisten = \"127.0.0.1:1\"\nforward = \"127.0.0.1:2\"\n[path.b_to_a]\nduplicate = 2\n").unwrap();
    expect_usage_error(&["udp", "--config", c], &["path[0].b_to_a.duplicate"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_prints_the_summary() {
    let server = loopback();
    let (listen, child) = udp_relay_to(&server, &["--stats-interval", "0.2"]);
    let c = loopback();
    for _ in 0..10 {
        c.send_to(b"hello", &listen).unwrap();
    }
    // The signal goes once all ten have come through (not after a pause
    // that a slow machine might not honour).
    receive_all(&server, 10, 5);
    let _ = soya_io::sys::kill(child.id(), libc::SIGTERM);
    let s = summary(child);
    assert_eq!(s["paths"][0]["a_to_b"]["forwarded"], 10, "{s}");
    assert_eq!(s["paths"][0]["a_to_b"]["forwarded_bytes"], 50, "{s}");
}

/// `--slack-us S` moderates wake-ups: behind a rate that spaces packets
/// well under S apart, the relay wakes about once per S, not once per
/// packet (each wake-up costs a context switch, which on a VM costs more
/// than the packets it moves). The bound is a count over the run's own
/// length, so a slower machine only makes it easier to meet; without the
/// moderation the 4,000 releases 200 µs apart each cost a wake-up.
#[test]
fn slack_moderates_wakeups() {
    let server = loopback();
    let (listen, child) = udp_relay_to(
        &server,
        &[
            "--rate",
            "40mbit",
            "--queue",
            "8MiB",
            "--slack-us",
            "2000",
            "--spin-us",
            "0",
        ],
    );
    const N: usize = 4000;
    let c = loopback();
    let payload = [7u8; 1000];
    for _ in 0..N {
        c.send_to(&payload, &listen).unwrap();
    }
    // Every datagram must come out (the queue holds them all) before the
    // relay is stopped.
    receive_all(&server, N, 1000);
    let _ = soya_io::sys::kill(child.id(), libc::SIGTERM);
    let s = summary(child);
    let a2b = &s["paths"][0]["a_to_b"];
    assert_eq!(a2b["forwarded"], N, "{s}");
    let wakeups = a2b["wakeups"].as_u64().expect("wakeups counted");
    let secs = s["elapsed_s"].as_f64().expect("elapsed_s");
    // At most about two wake-ups per 2 ms period (one moderated, one for
    // the next release or arrival), plus the idle waits (20 ms each).
    let bound = (secs / 0.002 * 2.0) as u64 + 100;
    eprintln!("{wakeups} wake-ups in {secs:.2} s (bound {bound}) for {N} packets");
    assert!(
        wakeups <= bound,
        "{wakeups} wake-ups in {secs:.2} s exceed {bound}: the relay woke per packet"
    );
}

#[test]
fn tun_mode_carries_ip_between_namespaces() {
    namespace_roundtrip(false, 0);
}

#[test]
fn tap_mode_carries_ethernet_between_namespaces() {
    namespace_roundtrip(true, 0);
}

/// With slack and `--one-thread`, one engine thread serves both directions of the path (the
/// process: its main thread and that one), and both still carry.
#[test]
fn tun_mode_with_slack_serves_both_directions_on_one_thread() {
    namespace_roundtrip(false, 100);
}

/// Two namespaces joined only through soya-wanem's two devices: UDP
/// ping-pong across, RTT = a->b + b->a delay (less up to twice the slack:
/// a packet may leave that much early).
fn namespace_roundtrip(tap: bool, slack_us: u32) {
    if let Some(why) = netns_missing(&[]) {
        skip("namespace_roundtrip", &why, netns_required());
        return;
    }
    let id = std::process::id() % 100_000;
    let k = if tap { "p" } else { "n" };
    let k = if slack_us > 0 { "s" } else { k };
    let (na, nb) = (format!("wanem{k}A{id}"), format!("wanem{k}B{id}"));
    let (da, db) = (format!("w{k}A{id}"), format!("w{k}B{id}"));
    let mut guard = Netns::new();
    guard.add(&na).unwrap();
    guard.add(&nb).unwrap();
    let slack = slack_us.to_string();
    let mut args = vec![
        "tun",
        "--a-dev",
        &da,
        "--b-dev",
        &db,
        "--delay-ms",
        "2",
        "--b2a-delay-ms",
        "5",
        "--stats-interval",
        "0",
        "--duration",
        "4",
        "--json",
    ];
    if slack_us > 0 {
        args.extend(["--slack-us", &slack, "--one-thread"]);
    }
    let (child, _err) = spawn_wanem(&args);
    let threads = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(
        threads,
        if slack_us > 0 { 2 } else { 3 },
        "main thread and engine threads"
    );
    // Only ever inside the two namespaces made above.
    let net = match (tap, slack_us > 0) {
        (true, _) => "10.201.1",
        (false, false) => "10.201.0",
        (false, true) => "10.201.3",
    };
    for (dev, ns, addr) in [
        (&da, &na, format!("{net}.1/24")),
        (&db, &nb, format!("{net}.2/24")),
    ] {
        assert!(ip(&["link", "set", dev, "netns", ns]));
        assert!(ip(&["-n", ns, "addr", "add", &addr, "dev", dev]));
        assert!(ip(&["-n", ns, "link", "set", dev, "up"]));
    }
    let (aa, ba) = (format!("{net}.1:0"), format!("{net}.2:9000"));
    let a = in_netns(&na, move || UdpSocket::bind(aa)).unwrap();
    let b = in_netns(&nb, move || UdpSocket::bind(ba)).unwrap();
    let to_b = format!("{net}.2:9000");
    a.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    b.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // Ping-pong, each ping numbered so a late pong is not mistaken for
    // the current one; the first may wait for the links to come up.
    let mut rtts = Vec::new();
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + Duration::from_millis(3000);
    let mut seq = 0u8;
    while rtts.len() < 20 && Instant::now() < deadline {
        seq = seq.wrapping_add(1);
        let t = Instant::now();
        a.send_to(&[seq], &to_b).unwrap();
        while let Ok((1, from)) = b.recv_from(&mut buf) {
            b.send_to(&buf[..1], from).unwrap();
            if buf[0] == seq {
                break;
            }
        }
        while let Ok(1) = a.recv(&mut buf) {
            if buf[0] == seq {
                rtts.push(t.elapsed().as_secs_f64() * 1e3);
                break;
            }
        }
    }
    let s = summary(child);
    println!(
        "{} rtt over {} pings: median {:.3} ms (2 + 5 ms asked)",
        if tap { "tap" } else { "tun" },
        rtts.len(),
        percentile(&mut rtts.clone(), 0.5)
    );
    assert!(rtts.len() >= 15, "{rtts:?} {s}");
    // The emulator can only add delay, so every ping takes at least the
    // 2 + 5 ms asked (a speed-independent bound); a busy machine adds its
    // own scheduling delay on top, so the upper bound looks at the fastest
    // ping only: at least one must have seen the delay applied once (a
    // delay applied twice would make every ping take 14 ms or more).
    let m = percentile(&mut rtts, 0.5);
    let fastest = rtts.iter().copied().fold(f64::INFINITY, f64::min);
    let floor = 6.9 - 2.0 * f64::from(slack_us) / 1e3;
    assert!(
        fastest >= floor,
        "faster than the delay asked: {fastest} ms (median {m})"
    );
    assert!(
        fastest < 13.0,
        "the delay applied twice? fastest {fastest} ms"
    );
    assert!(
        s["paths"][0]["a_to_b"]["forwarded"].as_u64().unwrap() >= 15,
        "{s}"
    );
}

/// UDP GSO through a TUN pair (virtio-net headers): a sender in A writes
/// runs of 8 datagrams with UDP_SEGMENT; each datagram is impaired on its
/// own (the relay counts 8 per run), arrives intact and once, and a run
/// that leaves together crosses whole: B's socket, with UDP_GRO, receives
/// coalesced batches. Before, the relay read and wrote datagram by
/// datagram, and B never saw a batch.
#[test]
fn tun_mode_carries_udp_gso_runs_whole() {
    use soya_io::sys::batch::{RecvBatch, RxMeta, SendBatch};
    if let Some(why) = netns_missing(&[]) {
        skip(
            "tun_mode_carries_udp_gso_runs_whole",
            &why,
            netns_required(),
        );
        return;
    }
    const RUNS: usize = 100;
    const PER_RUN: usize = 8;
    const LEN: usize = 1_400;
    let id = std::process::id() % 100_000;
    let (na, nb) = (format!("wanemgA{id}"), format!("wanemgB{id}"));
    let (da, db) = (format!("wgA{id}"), format!("wgB{id}"));
    let mut guard = Netns::new();
    guard.add(&na).unwrap();
    guard.add(&nb).unwrap();
    let (child, _err) = spawn_wanem(&[
        "tun",
        "--a-dev",
        &da,
        "--b-dev",
        &db,
        "--delay-ms",
        "1",
        "--stats-interval",
        "0",
        "--duration",
        "5",
        "--json",
    ]);
    // Only ever inside the two namespaces made above.
    for (dev, ns, addr) in [(&da, &na, "10.201.2.1/24"), (&db, &nb, "10.201.2.2/24")] {
        assert!(ip(&["link", "set", dev, "netns", ns]));
        assert!(ip(&["-n", ns, "addr", "add", addr, "dev", dev]));
        assert!(ip(&["-n", ns, "link", "set", dev, "up"]));
    }
    let a = in_netns(&na, || UdpSocket::bind("10.201.2.1:0")).unwrap();
    let b = in_netns(&nb, || UdpSocket::bind("10.201.2.2:9001")).unwrap();
    a.connect("10.201.2.2:9001").unwrap();
    assert!(soya_io::sys::enable_gro(b.as_raw_fd()), "UDP_GRO refused");
    b.set_nonblocking(true).unwrap();
    let dgram = |k: usize| -> Vec<u8> {
        let mut d = (k as u32).to_be_bytes().to_vec();
        d.extend((4..LEN).map(|j| (k * 7 + j) as u8));
        d
    };
    let mut tx = SendBatch::new(PER_RUN, true);
    let mut rx = RecvBatch::new(16, 65_536);
    let mut bufs = vec![vec![0u8; LEN]; 16];
    let mut meta = vec![RxMeta::default(); 16];
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut batches = 0;
    // One run at a time, the next once the last has arrived (the bound
    // only turns a lost datagram into a failure).
    let deadline = Instant::now() + Duration::from_secs(4);
    for r in 0..RUNS {
        let run: Vec<Vec<u8>> = (0..PER_RUN).map(|i| dgram(r * PER_RUN + i)).collect();
        let slices: Vec<&[u8]> = run.iter().map(Vec::as_slice).collect();
        let o = tx.send_slices(a.as_raw_fd(), &slices, None);
        assert_eq!(o.sent, PER_RUN, "run {r}: {o:?}");
        while got.len() < (r + 1) * PER_RUN {
            assert!(
                Instant::now() < deadline,
                "run {r}: {} datagrams arrived",
                got.len()
            );
            soya_io::sys::wait_readable(b.as_raw_fd(), Duration::from_millis(50));
            let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
            let n = rx.recv_into(b.as_raw_fd(), &mut refs, &mut meta).unwrap();
            for (i, m) in meta[..n].iter().enumerate() {
                let mut whole = bufs[i][..m.len.min(LEN)].to_vec();
                whole.extend_from_slice(&rx.landing(i)[..m.len.saturating_sub(LEN)]);
                let seg = m.segment.unwrap_or(m.len);
                batches += usize::from(m.len > seg);
                got.extend(whole.chunks(seg).map(<[u8]>::to_vec));
            }
        }
    }
    let s = summary(child);
    let want: Vec<Vec<u8>> = (0..RUNS * PER_RUN).map(dgram).collect();
    assert_eq!(got.len(), want.len());
    let mut sorted = got.clone();
    sorted.sort();
    assert!(sorted == want, "datagrams changed, lost or doubled");
    // At least: the link's own IPv6 packets (router solicitations as it
    // comes up) cross as well.
    let d = &s["paths"][0]["a_to_b"];
    for k in ["received", "forwarded"] {
        let n = d[k].as_u64().unwrap();
        assert!(
            n >= (RUNS * PER_RUN) as u64,
            "{k} {n}, not per datagram: {s}"
        );
    }
    println!("{batches} of {RUNS} runs arrived as one GRO batch or more");
    assert!(batches > 0, "no run crossed whole: {s}");
}
