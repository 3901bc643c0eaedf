//! RDMA end to end through a pair of Sōya gateways, on loopback:
//!
//! ```text
//! host A (RcQp 10.1.0.1) ─IP-in-UDP─ gateway A ─WAN/UDP─ gateway B ─IP-in-UDP─ host B (RcQp 10.2.0.1)
//! ```
//!
//! The hosts are the project's RC endpoint ([`soya_tools::rc::RcQp`]) on
//! plain UDP sockets; the gateways are the daemon's library API
//! ([`soya::gateway::Gateway`]) on threads of this process, configured
//! like `config/examples/lab-udp-{a,b}.toml` with free loopback ports.
//! Every test is bounded in time.

#![deny(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use soya::gateway::{Gateway, Snapshot};
use soya::roce::Psn;
use soya::time::Time;
use soya_tools::rc::{Completion, CompletionStatus, QpAddr, QpConfig, RcQp, WorkRequest};

// ----- addresses and configuration -----

#[path = "../proxy/tests/common/lab.rs"]
mod lab;
use lab::{pair, start, unique_ip, wait_for, write_configs, write_key, Knobs, Side};

/// Third octet of this binary's loopback addresses (`lab`): apart from
/// `proxy/tests/gateway.rs`'s.
const IP_BLOCK: u8 = 100;

/// A gateway pair's addresses and configuration files.
struct Lab {
    a: Side,
    b: Side,
    fa: PathBuf,
    fb: PathBuf,
}

/// The pair of `lab-udp-{a,b}.toml` on free loopback ports, its WAN path
/// at `rate`, no `/metrics`.
fn lab(test: &str, keyed: bool, rate: &str) -> Lab {
    let p = pair(test);
    let key = keyed.then(|| write_key(&p.dir));
    let knobs = Knobs {
        key: key.as_deref(),
        rate,
        buffer: "32MiB",
        metrics: false,
        ..Knobs::default()
    };
    let (fa, fb) = write_configs(&p, &knobs);
    Lab {
        a: p.a,
        b: p.b,
        fa,
        fb,
    }
}

/// `l`'s two gateways started and connected to each other, the time of
/// that (the hosts' epoch), and a host at each site: A with QP 0x11, B
/// with QP 0x22, each the other's peer.
fn two_sites(l: &Lab) -> (Gateway, Gateway, Instant, Host, Host) {
    let ga = start(&l.fa);
    let gb = start(&l.fb);
    wait_for(&ga, "twin", |s| s.connected);
    let epoch = Instant::now();
    let a = Host::new(A_IP, 0x11, B_IP, 0x22, l.a.dc, true);
    let b = Host::new(B_IP, 0x22, A_IP, 0x11, l.b.dc, true);
    (ga, gb, epoch, a, b)
}

// ----- lab hosts -----

const A_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
const MEM: usize = 8 << 20;

/// One RoCE host: an RcQp whose IP packets travel as UDP payloads to its
/// gateway's `dc.listen`.
struct Host {
    qp: RcQp,
    sock: UdpSocket,
    gw: SocketAddr,
    ip: Ipv4Addr,
    peer: Ipv4Addr,
    completions: Vec<Completion>,
    recvs: u64,
    last_announce: Option<Instant>,
}

/// A plain UDP/IPv4 packet from `src` to `dst`'s discard port: how a lab
/// host announces its UDP address to its gateway (soya-perf's own).
fn announce_packet(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    soya_tools::perf::wire::announce_packet(src.into(), dst.into()).expect("IPv4")
}

impl Host {
    fn new(
        ip: Ipv4Addr,
        qpn: u32,
        peer: Ipv4Addr,
        peer_qpn: u32,
        gw: SocketAddr,
        verify: bool,
    ) -> Host {
        let cfg = QpConfig {
            mem_size: MEM,
            verify_data: verify,
            ..QpConfig::default()
        };
        let (sp, rp) = if qpn < peer_qpn {
            (1000, 9000)
        } else {
            (9000, 1000)
        };
        let qp = RcQp::new(
            cfg,
            QpAddr { ip: ip.into(), qpn },
            QpAddr {
                ip: peer.into(),
                qpn: peer_qpn,
            },
            Psn::new(sp),
            Psn::new(rp),
        )
        .unwrap();
        let sock = UdpSocket::bind((unique_ip(), 0)).unwrap();
        sock.set_nonblocking(true).unwrap();
        // The egress gateway re-injects a whole window (up to 1024 packets)
        // at once after a timeout: a receive buffer smaller than that makes
        // every retransmission round lose packets again.
        set_buffers(&sock, 16 << 20);
        Host {
            qp,
            sock,
            gw,
            ip,
            peer,
            completions: Vec::new(),
            recvs: 0,
            last_announce: None,
        }
    }

    /// Receives, runs timers, transmits; true if anything happened.
    fn pump(&mut self, now: Time, buf: &mut [u8]) -> bool {
        let mut active = false;
        if self
            .last_announce
            .is_none_or(|t| t.elapsed() > Duration::from_millis(100))
        {
            let _ = self
                .sock
                .send_to(&announce_packet(self.ip, self.peer), self.gw);
            self.last_announce = Some(Instant::now());
        }
        for _ in 0..256 {
            match self.sock.recv_from(buf) {
                Ok((n, _)) => {
                    active = true;
                    self.qp.handle_packet(now, &buf[..n]);
                }
                Err(_) => break,
            }
        }
        if self.qp.poll_timeout().is_some_and(|t| t <= now) {
            self.qp.handle_timeout(now);
        }
        while let Some(n) = self.qp.poll_transmit(now, buf) {
            active = true;
            let _ = self.sock.send_to(&buf[..n], self.gw);
        }
        while let Some(c) = self.qp.poll_completion() {
            active = true;
            self.completions.push(c);
        }
        while self.qp.poll_recv_completion().is_some() {
            self.recvs += 1;
        }
        active
    }

    fn rkey(&self) -> u32 {
        self.qp.memory().rkey()
    }

    fn base(&self) -> u64 {
        self.qp.memory().base()
    }
}

/// Large socket buffers: SO_RCVBUFFORCE as root, else up to rmem_max.
fn set_buffers(s: &UdpSocket, bytes: libc::c_int) {
    let fd = s.as_raw_fd();
    if soya::sys::force_buffers(fd, bytes as usize).is_err() {
        for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            let _ = soya::sys::setsockopt_int(fd, libc::SOL_SOCKET, opt, bytes);
        }
    }
}

/// Drives the hosts until `done` holds or `limit` passes; `post` may post
/// new work before each turn. Returns whether `done` held.
fn drive(
    hosts: &mut [&mut Host],
    epoch: Instant,
    limit: Duration,
    mut post: impl FnMut(&mut [&mut Host]),
    mut done: impl FnMut(&[&mut Host]) -> bool,
) -> bool {
    let mut buf = vec![0u8; 9000];
    let t0 = Instant::now();
    loop {
        post(hosts);
        let now = Time::from_nanos(epoch.elapsed().as_nanos() as u64);
        let mut active = false;
        for h in hosts.iter_mut() {
            active |= h.pump(now, &mut buf);
        }
        if done(hosts) {
            return true;
        }
        if t0.elapsed() > limit {
            return false;
        }
        if !active {
            let mut fds: Vec<libc::pollfd> = hosts
                .iter()
                .map(|h| soya::sys::pollfd(h.sock.as_raw_fd(), libc::POLLIN))
                .collect();
            let _ = soya::sys::ppoll(&mut fds, Some(Duration::from_millis(1)));
        }
    }
}

fn cpu_seconds_of_threads(name: &str) -> f64 {
    // utime + stime (fields 14, 15) of every thread of this process with
    // that name, in clock ticks.
    let tick = 100.0;
    let mut total = 0.0;
    if let Ok(d) = std::fs::read_dir("/proc/self/task") {
        for t in d.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let after = stat.rsplit(')').next().unwrap_or("");
            let f: Vec<&str> = after.split_whitespace().collect();
            if f.len() > 13 {
                let u: f64 = f[11].parse().unwrap_or(0.0);
                let s: f64 = f[12].parse().unwrap_or(0.0);
                total += (u + s) / tick;
            }
        }
    }
    total
}

/// A mixed workload both ways with data verification, forged and malformed
/// packets injected on the DC side and the WAN side meanwhile, then a
/// throughput figure.
/// WRITE, SEND and READ through a gateway pair, verified; with `mtu`, the
/// pair's `wan.mtu` (else the default, 9000); with `identity`, identity
/// keys (the Noise IKpsk2 handshake, the PSK mixed in).
fn transfer(keyed: bool, mtu: Option<u32>, identity: bool) {
    let name = match (keyed, mtu, identity) {
        (_, Some(_), _) => "mtu",
        (_, None, true) => "identity",
        (true, None, false) => "keyed",
        (false, None, false) => "insecure",
    };
    let l = lab(name, keyed, "10gbit");
    if let Some(mtu) = mtu {
        for f in [&l.fa, &l.fb] {
            let text = std::fs::read_to_string(f).unwrap();
            std::fs::write(f, text.replace("[wan]\n", &format!("[wan]\nmtu = {mtu}\n"))).unwrap();
        }
    }
    if identity {
        identity_keys(&l);
    }
    let (ga, gb, epoch, mut a, mut b) = two_sites(&l);
    // Both gateways learn their host before any RoCE flows.
    drive(
        &mut [&mut a, &mut b],
        epoch,
        Duration::from_secs(5),
        |_| {},
        |_| true,
    );
    wait_for(&ga, "host A learned", |s| s.dc.lab_hosts == 1);
    wait_for(&gb, "host B learned", |s| s.dc.lab_hosts == 1);

    const WRITES: u32 = 150;
    const SENDS: u32 = 60;
    const READS: u32 = 60;
    const B_WRITES: u32 = 60;
    const W: u32 = 64 << 10;
    const S: u32 = 16 << 10;
    b.qp.post_recv(SENDS);
    let (b_base, b_rkey, a_base, a_rkey) = (b.base(), b.rkey(), a.base(), a.rkey());
    // A: WRITEs into B's lower half, READs of B's upper half (landing in
    // A's upper half), SENDs. B: WRITEs into A's lower half.
    let mut plan_a: Vec<WorkRequest> = Vec::new();
    for i in 0..WRITES.max(SENDS).max(READS) {
        if i < WRITES {
            plan_a.push(WorkRequest::Write {
                remote_va: b_base + u64::from(i % 64) * u64::from(W),
                rkey: b_rkey,
                len: W,
                imm: None,
            });
        }
        if i < SENDS {
            plan_a.push(WorkRequest::Send { len: S, imm: None });
        }
        if i < READS {
            plan_a.push(WorkRequest::Read {
                remote_va: b_base + (MEM as u64 / 2) + u64::from(i % 64) * u64::from(W),
                rkey: b_rkey,
                len: W,
            });
        }
    }
    let plan_b: Vec<WorkRequest> = (0..B_WRITES)
        .map(|i| WorkRequest::Write {
            remote_va: a_base + u64::from(i % 64) * u64::from(W),
            rkey: a_rkey,
            len: W,
            imm: None,
        })
        .collect();
    let (na, nb) = (plan_a.len(), plan_b.len());
    let mut ia = 0;
    let mut ib = 0;
    let injector = UdpSocket::bind((unique_ip(), 0)).unwrap();
    // Forgeries while the transfer runs, paced by its progress rather than
    // by the clock: round k goes out once A has k/ROUNDS of its work
    // completed, so all of them are sent before the transfer can end, on a
    // machine of any speed (`done` also requires them all).
    const ROUNDS: u32 = 20;
    let injected = std::cell::Cell::new(0u32);
    let ok = drive(
        &mut [&mut a, &mut b],
        epoch,
        Duration::from_secs(20),
        |hs| {
            while ia < na && hs[0].qp.outstanding() < 32 {
                hs[0].qp.post_send(plan_a[ia]).unwrap();
                ia += 1;
            }
            while ib < nb && hs[1].qp.outstanding() < 32 {
                hs[1].qp.post_send(plan_b[ib]).unwrap();
                ib += 1;
            }
            let k = injected.get();
            if k < ROUNDS && hs[0].completions.len() * ROUNDS as usize >= k as usize * na {
                injected.set(k + 1);
                inject_dc(&injector, l.a.dc);
                inject_wan(&injector, l.b.wan, keyed);
            }
        },
        // Completions come from pseudo-ACKs: wait for the data to land too.
        |hs| {
            injected.get() == ROUNDS
                && hs[0].completions.len() == na
                && hs[1].completions.len() == nb
                && hs[1].qp.memory().stats().bytes_placed == u64::from(WRITES) * u64::from(W)
                && hs[1].recvs == u64::from(SENDS)
                && hs[0].qp.memory().stats().bytes_placed == u64::from(B_WRITES) * u64::from(W)
        },
    );
    if !ok {
        let (sa, sb) = (ga.snapshot().unwrap(), gb.snapshot().unwrap());
        panic!(
            "transfer did not finish: A {}/{na} B {}/{nb}, {}/{ROUNDS} forgery rounds sent\nA: {:?}\nB: {:?}\n{sa:#?}\n{sb:#?}",
            a.completions.len(),
            b.completions.len(),
            injected.get(),
            a.qp.stats(),
            b.qp.stats()
        );
    }
    for c in a.completions.iter().chain(&b.completions) {
        assert_eq!(c.status, CompletionStatus::Success, "{c:?}");
    }
    assert_eq!(b.recvs, u64::from(SENDS));
    for (h, name) in [(&a, "A"), (&b, "B")] {
        let m = h.qp.memory().verify_all();
        assert!(m.is_ok(), "host {name} data errors: {m:?}");
        assert_eq!(h.qp.stats().data_errors, 0, "host {name}");
    }
    let ma = a.qp.memory().stats();
    let mb = b.qp.memory().stats();
    assert_eq!(mb.bytes_placed, u64::from(WRITES) * u64::from(W));
    assert_eq!(mb.send_bytes_received, u64::from(SENDS) * u64::from(S));
    assert_eq!(ma.read_bytes_received, u64::from(READS) * u64::from(W));
    assert_eq!(ma.bytes_placed, u64::from(B_WRITES) * u64::from(W));
    assert!(mb.bytes_verified > 0 && ma.bytes_verified > 0);

    // The forgeries were dropped and counted (the gateways' threads may
    // still be at the last round: wait for the counts), the sessions never
    // broke.
    assert_eq!(injected.get(), ROUNDS);
    let n = u64::from(ROUNDS);
    let sa = wait_for(&ga, "gateway A to count every DC forgery", |s| {
        s.dc.rx_acl_source >= n
            && s.dc.rx_acl_destination >= n
            && s.dc.rx_malformed >= n
            && s.engine.dc_bad_icrc >= n
    });
    let sb = wait_for(&gb, "gateway B to count every WAN forgery", |s| {
        s.wan.malformed + s.wan.auth_failures + s.wan.stale_generation >= 2 * n
    });
    assert_eq!(sa.wan.peer_restarts + sb.wan.peer_restarts, 0);
    assert_eq!(sa.twin.pending_overflow + sb.twin.pending_overflow, 0);
    // Pseudo-ACKs did the acknowledging at both edges.
    let acks = |s: &Snapshot| s.flows.iter().map(|f| f.pseudo_acks).sum::<u64>();
    assert!(acks(&sa) > 0 && acks(&sb) > 0, "{:#?}", sa.flows);
    println!(
        "mixed workload ({}): A completed {} WQEs, B {}; A's gateway pseudo-ACKed {}, B's {}; buffer high water A {} B {} slots",
        if keyed { "keyed" } else { "insecure" },
        na,
        nb,
        acks(&sa),
        acks(&sb),
        sa.buffer.high_water,
        sb.buffer.high_water
    );

    // Throughput: WRITE-only A -> B on a fresh QP pair without pattern
    // work, 4 KiB MTU, 64 KiB messages.
    let mut ta = Host::new(A_IP, 0x33, B_IP, 0x44, l.a.dc, false);
    let mut tb = Host::new(B_IP, 0x44, A_IP, 0x33, l.b.dc, false);
    let n_msgs: u32 = 1024; // 64 MiB
    let rkey = tb.rkey();
    let base = tb.base();
    let mut posted = 0;
    let cpu0 = cpu_seconds_of_threads("soya-device");
    let t0 = Instant::now();
    let ok = drive(
        &mut [&mut ta, &mut tb],
        epoch,
        Duration::from_secs(60),
        |hs| {
            while posted < n_msgs && hs[0].qp.outstanding() < 64 {
                hs[0]
                    .qp
                    .post_send(WorkRequest::Write {
                        remote_va: base + u64::from(posted % 64) * u64::from(W),
                        rkey,
                        len: W,
                        imm: None,
                    })
                    .unwrap();
                posted += 1;
            }
        },
        |hs| {
            hs[0].completions.len() == n_msgs as usize
                && hs[1].qp.memory().stats().writes_placed == u64::from(n_msgs)
        },
    );
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds_of_threads("soya-device") - cpu0;
    assert!(ok, "throughput phase did not finish");
    // The WAN datagrams fit the paths' MTU: A's are at most `mtu - 48`
    // bytes (IPv6 + UDP), so on average too; at the default 9000 the same
    // average is above what a 1500-byte path would carry (jumbo datagrams
    // of the WRITEs' packets), so this tells the two apart.
    let sa = ga.snapshot().unwrap();
    let (bytes, packets) = sa
        .paths
        .iter()
        .fold((0, 0), |(b, n), p| (b + p.bytes_sent, n + p.packets_sent));
    let mean = bytes / packets.max(1);
    match mtu {
        Some(mtu) => assert!(
            mean <= u64::from(mtu) - 48,
            "mean WAN datagram {mean} B for wan.mtu {mtu}"
        ),
        None => assert!(mean > 1452, "mean WAN datagram {mean} B at the default MTU"),
    }
    let sb = gb.snapshot().unwrap();
    println!(
        "WAN datagrams from A: {packets}, {mean} B on average; B moved {} reassembled messages",
        sb.wan.recv_reassembly_moves
    );
    if std::env::var_os("SOYA_E2E_DEBUG").is_some() {
        println!("host A: {:?}\nhost B: {:?}", ta.qp.stats(), tb.qp.stats());
        for (g, n) in [(&ga, "A"), (&gb, "B")] {
            let s = g.snapshot().unwrap();
            println!("gateway {n}: wan {:?}\npaths {:?}", s.wan, s.paths);
            for f in &s.flows {
                println!("  {} {} {}", f.role, f.half, f.detail);
            }
        }
    }
    assert!(ta
        .completions
        .iter()
        .all(|c| c.status == CompletionStatus::Success));
    let bits = f64::from(n_msgs) * f64::from(W) * 8.0;
    println!(
        "throughput ({}): {:.2} Gb/s goodput of 64 KiB WRITEs (4 KiB MTU) through the gateway pair on loopback, {:.3} s; \
         both device threads used {:.2} CPU-s = {:.2} Gb/s per gateway-core (2 cores shared with the hosts)",
        if keyed { "keyed" } else { "insecure" },
        bits / secs / 1e9,
        secs,
        cpu,
        if cpu > 0.0 { 2.0 * bits / cpu / 1e9 } else { f64::NAN }
    );
}

/// DC-side forgeries toward gateway A: a wrong source, a wrong
/// destination, garbage, and a RoCE packet of the flow with a bad ICRC.
fn inject_dc(s: &UdpSocket, dc: SocketAddr) {
    let _ = s.send_to(&announce_packet([10, 9, 9, 9].into(), B_IP), dc);
    let _ = s.send_to(&announce_packet(A_IP, [10, 1, 0, 99].into()), dc);
    let _ = s.send_to(b"\x45\x00\x00\xff garbage", dc);
    let to = soya::roce::builders::ReplyTo {
        ip: soya::roce::IpHeader::v4(A_IP, B_IP),
        src_port: 0xc000,
        dest_qp: 0x22,
    };
    let mut p = soya::roce::builders::ack(&to, Psn::new(1000), 1)
        .to_vec(&[])
        .unwrap();
    *p.last_mut().unwrap() ^= 0x5a;
    let _ = s.send_to(&p, dc);
}

/// WAN-side forgeries toward gateway B: garbage and a protected packet
/// that cannot authenticate.
fn inject_wan(s: &UdpSocket, wan: SocketAddr, keyed: bool) {
    let _ = s.send_to(b"\x01garbage that is not a soya packet", wan);
    let mut p = vec![0u8; 200];
    p[0] = 1;
    p[1] = if keyed { 0 } else { 0x80 };
    p[8..16].copy_from_slice(&0x1234_5678u64.to_be_bytes());
    let _ = s.send_to(&p, wan);
}

/// Each gateway of `l` gets an identity key (a file of mode 0600 beside
/// its config, as `soya genkey` writes) and its twin's public key.
fn identity_keys(l: &Lab) {
    use std::os::unix::fs::PermissionsExt;
    let keys = [[0x5a_u8; 32], [0xa5_u8; 32]];
    for (i, f) in [&l.fa, &l.fb].into_iter().enumerate() {
        let file = f.with_extension("key");
        std::fs::write(&file, soya_config::encode_key_base64(&keys[i]) + "\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let twin = soya_config::encode_key_base64(&soya::wan::public_key(&keys[1 - i]));
        let text = std::fs::read_to_string(f).unwrap();
        let wan = format!(
            "[wan]\nprivate_key_file = \"{}\"\ntwin_public_key = \"{twin}\"\n",
            file.display()
        );
        std::fs::write(f, text.replace("[wan]\n", &wan)).unwrap();
        let cfg = soya_config::load(f).unwrap();
        assert!(cfg.wan.identity.is_some() && cfg.warnings().is_empty());
    }
}

#[test]
fn write_send_read_through_a_gateway_pair_insecure() {
    transfer(false, None, false);
}

#[test]
fn write_send_read_through_a_gateway_pair_keyed() {
    transfer(true, None, false);
}

/// The same with identity keys: the gateways set their sessions up by the
/// Noise IKpsk2 handshake (the PSK mixed in).
#[test]
fn write_send_read_through_a_gateway_pair_with_identity_keys() {
    transfer(true, None, true);
}

/// The same across WAN paths of a standard 1500-byte MTU (`wan.mtu`):
/// every 4 KiB RoCE packet is cut into WAN fragments and reassembled.
#[test]
fn write_send_read_through_a_gateway_pair_on_1500_byte_wan_paths() {
    transfer(true, Some(1500), false);
}

/// Gateway B dies mid-transfer (no drain, no CLOSE) and comes back. Host A's
/// WRITEs were pseudo-ACKed by gateway A, which still holds what B had not
/// delivered: when it sees B's new session generation it sends that to
/// the new B again (issue 35, `qp::resume`), and everything lands, once,
/// with no error. Never a silent success either way.
#[test]
fn killing_the_far_gateway_resumes_and_loses_nothing() {
    // A slow WAN so that gateway A holds plenty pseudo-ACKed data.
    let l = lab("kill", false, "200mbit");
    let (ga, gb, epoch, mut a, mut b) = two_sites(&l);
    let (rkey, base) = (b.rkey(), b.base());
    const W: u32 = 64 << 10;
    let mut posted = 0u64;
    let mut post = |hs: &mut [&mut Host]| {
        while hs[0].qp.outstanding() < 32 && !hs[0].qp.is_error() {
            hs[0]
                .qp
                .post_send(WorkRequest::Write {
                    remote_va: base + (posted % 64) * u64::from(W),
                    rkey,
                    len: W,
                    imm: None,
                })
                .unwrap();
            posted += 1;
        }
    };
    // Run until gateway A holds at least 2 MiB it has pseudo-ACKed.
    let ok = drive(
        &mut [&mut a, &mut b],
        epoch,
        Duration::from_secs(20),
        &mut post,
        |hs| hs[0].qp.stats().write_send_bytes_completed >= 8 << 20,
    );
    assert!(ok, "no progress before the kill: {:?}", a.qp.stats());
    let before = ga.snapshot().unwrap();
    let sb = gb.abort();
    let landed_at_kill = b.qp.memory().stats().bytes_placed;
    let success_at_kill = a.qp.stats().write_send_bytes_completed;
    // Host A keeps posting for a while against a dead twin.
    drive(
        &mut [&mut a, &mut b],
        epoch,
        Duration::from_millis(500),
        &mut post,
        |_| false,
    );
    let success_dead = a.qp.stats().write_send_bytes_completed;
    // Gateway B comes back (a fresh process would do the same); host A
    // posts nothing more and waits for everything to land.
    let gb2 = start(&l.fb);
    let ok = drive(
        &mut [&mut a, &mut b],
        epoch,
        Duration::from_secs(20),
        &mut |_: &mut [&mut Host]| {},
        |hs| {
            hs[0].qp.outstanding() == 0
                && hs[1].qp.memory().stats().bytes_placed
                    >= hs[0].qp.stats().write_send_bytes_completed
        },
    );
    let after = ga.snapshot().unwrap();
    let landed = b.qp.memory().stats().bytes_placed;
    let success = a.qp.stats().write_send_bytes_completed;
    let errors: Vec<CompletionStatus> = a
        .completions
        .iter()
        .filter(|c| c.status != CompletionStatus::Success)
        .map(|c| c.status)
        .collect();
    println!(
        "kill: gateway A held {} slots when B died (B aborted: {:?}); \
         at the kill A had {} B of WRITEs completed successfully, {} B had landed at host B; \
         with B dead A completed {} B more; after B's restart A saw peer restart {}, resumed {} \
         and failed {} flow(s); host A: QP in error = {}, error completions = {}, \
         success total {} B, landed total {} B",
        before.buffer.slots_used,
        sb.outcome,
        success_at_kill,
        landed_at_kill,
        success_dead - success_at_kill,
        after.wan.peer_restarts,
        after.twin.flows_resumed_on_restart,
        after.twin.flows_failed_on_restart,
        a.qp.is_error(),
        errors.len(),
        success,
        landed,
    );
    assert!(
        b.qp.memory().verify_all().is_ok(),
        "host B saw corrupt data"
    );
    assert_eq!(after.wan.peer_restarts, 1);
    assert_eq!(
        (
            after.twin.flows_resumed_on_restart,
            after.twin.flows_failed_on_restart
        ),
        (1, 0),
        "{:?}",
        after.twin
    );
    let status = soya::gateway::control::render_status(&after);
    assert!(
        status.contains("twin restarts: 1 unplanned, 0 planned")
            && status.contains("QPs resumed 1,")
            && status.contains("failed 0,"),
        "soya status tells the resume: {status}"
    );
    assert!(
        ok,
        "not everything landed: {success} B completed, {landed} B landed"
    );
    assert!(!a.qp.is_error() && errors.is_empty(), "{errors:?}");
    assert_eq!(landed, success, "every completed WRITE landed, once");
    drop(gb2);
}

// ----- shards -----

/// A lab whose gateways run `sa` and `sb` shards.
fn lab_shards(test: &str, keyed: bool, sa: u16, sb: u16) -> Lab {
    let l = lab(test, keyed, "10gbit");
    for (f, n) in [(&l.fa, sa), (&l.fb, sb)] {
        let mut text = std::fs::read_to_string(f).unwrap();
        text.push_str(&format!("[gateway]\nshards = {n}\n"));
        std::fs::write(f, text).unwrap();
    }
    l
}

#[test]
fn two_shards_carry_verified_rdma_for_several_host_pairs() {
    use soya::gateway::shard::shard_of_pair;
    let l = lab_shards("shards", false, 2, 2);
    let ga = start(&l.fa);
    let gb = start(&l.fb);
    assert_eq!((ga.shards(), gb.shards()), (2, 2));
    wait_for(&ga, "both shards connected", |s| {
        s.connected && s.shards.len() == 2 && s.shards.iter().all(|x| x.connected)
    });
    // Four host pairs, two hashed to each shard.
    let mut pairs: Vec<(Ipv4Addr, Ipv4Addr)> = Vec::new();
    let mut per = [0; 2];
    for k in 10..60u8 {
        let (x, y) = (Ipv4Addr::new(10, 1, 0, k), Ipv4Addr::new(10, 2, 0, k));
        let s = shard_of_pair(x.into(), y.into(), 2);
        if per[s] < 2 {
            per[s] += 1;
            pairs.push((x, y));
        }
    }
    assert_eq!(pairs.len(), 4);
    let epoch = Instant::now();
    let mut hosts: Vec<Host> = Vec::new();
    for (i, (x, y)) in pairs.iter().enumerate() {
        let q = 0x100 + 2 * i as u32;
        hosts.push(Host::new(*x, q, *y, q + 1, l.a.dc, true));
        hosts.push(Host::new(*y, q + 1, *x, q, l.b.dc, true));
    }
    {
        let mut refs: Vec<&mut Host> = hosts.iter_mut().collect();
        drive(&mut refs, epoch, Duration::from_secs(5), |_| {}, |_| true);
    }
    wait_for(&ga, "A's hosts learned", |s| s.dc.lab_hosts == 4);
    wait_for(&gb, "B's hosts learned", |s| s.dc.lab_hosts == 4);
    const WRITES: u32 = 40;
    const READS: u32 = 20;
    const W: u32 = 64 << 10;
    let mut plans: Vec<Vec<WorkRequest>> = Vec::new();
    for i in 0..pairs.len() {
        let (base, rkey) = (hosts[2 * i + 1].base(), hosts[2 * i + 1].rkey());
        let mut p = Vec::new();
        for j in 0..WRITES {
            p.push(WorkRequest::Write {
                remote_va: base + u64::from(j % 64) * u64::from(W),
                rkey,
                len: W,
                imm: None,
            });
            if j < READS {
                p.push(WorkRequest::Read {
                    remote_va: base + (MEM as u64 / 2) + u64::from(j) * u64::from(W),
                    rkey,
                    len: W,
                });
            }
        }
        plans.push(p);
    }
    let mut next = vec![0usize; pairs.len()];
    let n_per = plans[0].len();
    let mut refs: Vec<&mut Host> = hosts.iter_mut().collect();
    let ok = drive(
        &mut refs,
        epoch,
        Duration::from_secs(30),
        |hs| {
            for (i, p) in plans.iter().enumerate() {
                while next[i] < p.len() && hs[2 * i].qp.outstanding() < 16 {
                    hs[2 * i].qp.post_send(p[next[i]]).unwrap();
                    next[i] += 1;
                }
            }
        },
        |hs| {
            (0..4).all(|i| {
                hs[2 * i].completions.len() == n_per
                    && hs[2 * i + 1].qp.memory().stats().bytes_placed
                        == u64::from(WRITES) * u64::from(W)
            })
        },
    );
    drop(refs);
    let sa = ga.snapshot().unwrap();
    let sb = gb.snapshot().unwrap();
    assert!(ok, "transfer did not finish\n{sa:#?}\n{sb:#?}");
    for (i, h) in hosts.iter().enumerate() {
        for c in &h.completions {
            assert_eq!(c.status, CompletionStatus::Success, "host {i}: {c:?}");
        }
        let m = h.qp.memory().verify_all();
        assert!(m.is_ok(), "host {i} data errors: {m:?}");
        assert_eq!(h.qp.stats().data_errors, 0);
    }
    for i in 0..4 {
        let m = hosts[2 * i].qp.memory().stats();
        assert_eq!(m.read_bytes_received, u64::from(READS) * u64::from(W));
        assert!(m.bytes_verified > 0);
    }
    // Both shards of both gateways carried traffic; the udp backend has
    // one reader (shard 0), so shard 1's packets were all handed over.
    for (s, name) in [(&sa, "A"), (&sb, "B")] {
        assert_eq!(s.shards.len(), 2, "{name}");
        for sh in &s.shards {
            assert!(
                sh.dc_rx_accepted > 0 && sh.twin_msgs_out > 0 && sh.twin_msgs_in > 0,
                "{name}: shard {} idle: {sh:?}",
                sh.index
            );
        }
        assert!(s.shards[0].handoff_out > 0, "{name}: {:?}", s.shards);
        assert_eq!(s.shards[1].handoff_in, s.shards[0].handoff_out, "{name}");
        assert_eq!(s.dc.handoff_dropped, 0, "{name}");
        assert_eq!(s.twin.pending_overflow, 0);
        assert_eq!(s.wan.peer_restarts, 0);
        // Path metrics are per shard.
        let m = soya::gateway::metrics::render(s);
        assert!(
            m.contains("soya_path_state{path=\"p0\",shard=\"1\",state=\"up\"} 1"),
            "{m}"
        );
        assert!(m.contains("soya_shard_handoff_packets_total{shard=\"1\",result=\"in\"}"));
    }
    println!("shards: A {:?}\nB {:?}", sa.shards, sb.shards);
    ga.drain();
    gb.drain();
    let (ra, rb) = (ga.wait(), gb.wait());
    assert_eq!(ra.outcome, soya::gateway::RunOutcome::Drained, "{ra}");
    assert_eq!(rb.outcome, soya::gateway::RunOutcome::Drained, "{rb}");
}

#[test]
fn a_shard_count_mismatch_is_reported() {
    let l = lab_shards("mismatch", true, 2, 1);
    let ga = start(&l.fa);
    let gb = start(&l.fb);
    let sa = wait_for(&ga, "A's alarm", |s| {
        s.shards.len() == 2 && s.shards.iter().all(|x| !x.alarm.is_empty())
    });
    let sb = wait_for(&gb, "B's alarm", |s| {
        s.shards.first().is_some_and(|x| !x.alarm.is_empty())
    });
    assert!(!sa.connected && !sb.connected);
    assert!(
        sa.shards[0]
            .alarm
            .contains("different gateway.shards (this side: 2)"),
        "{:?}",
        sa.shards
    );
    assert!(
        sa.shards[1].alarm.contains("fewer shards"),
        "{:?}",
        sa.shards
    );
    assert!(
        sb.shards[0]
            .alarm
            .contains("different gateway.shards (this side: 1)"),
        "{:?}",
        sb.shards
    );
    let status = soya::gateway::control::render_status(&sa);
    assert!(status.contains("!! shard 1/2"), "{status}");
}
