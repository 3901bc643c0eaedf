//! The WAN transport alone over real UDP loopback sockets: Gb/s per core.
//!
//! ```text
//! cargo run --release -p soya --example wan_loopback_bench -- [--secs 3] [--size 4096] [--window 32] [--no-per-side] [--only NAME]
//! ```
//!
//! Two [`WanConnection`]s (client and server), each on its own UDP socket
//! on 127.0.0.1, driven by one thread: the client keeps one flow full of
//! `--size`-byte messages, the server consumes them. Every socket operation
//! goes through the gateway's batched I/O ([`UdpIo`]), exactly as the
//! device loop uses it: datagrams written by `poll_transmit` into one
//! staging buffer, sent with GSO runs / sendmmsg (only datagrams already
//! due), received with recvmmsg (+ GRO).
//!
//! Runs, each `--secs` long, all in one process so they share the machine's
//! load: the insecure transport (CRC tag, no encryption: the baseline), then
//! AES-256-GCM and ChaCha20-Poly1305 with GSO/GRO, then AES-256-GCM with
//! sendmmsg/recvmmsg only and with one datagram per system call. The cipher
//! column is what the two connections agreed on (from their stats), not
//! what was asked for.
//!
//! How "per core" is computed: **Gb/s per core = message bits delivered ÷
//! CPU seconds of the whole process** (user + system, getrusage). Both ends
//! run on this one thread, so those CPU seconds pay for *both* sides of the
//! transfer: the sender's encode, seal and send, the receiver's receive,
//! open, decode and delivery, and the ACKs going back. A gateway does one
//! side per direction of a flow, so per side the figures are higher: the
//! `send/core` and `recv/core` columns divide the same bits by the CPU time
//! spent in each side's calls alone (thread CPU clock around each side's
//! work in the loop; the loop itself, a few clock reads and `ppoll` are in
//! neither, so the two add up to a little less than the total).
//! The machine may be shared: compare the ratios to the insecure run,
//! measured in the same process minutes apart.

#![deny(unsafe_code)]

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use soya_io::sys::udpio::{IoMode, TxDatagram, UdpIo};
use soya_proto::qp::TwinMsg;
use soya_proto::time::Time;
use soya_proto::wan::{CcKind, Cipher, CipherPolicy, Event, PathConfig, WanConfig, WanConnection};

const FLOW: u64 = 7;
const STAGE_SLOTS: usize = 64;

struct End {
    conn: WanConnection,
    sock: UdpSocket,
    io: UdpIo,
    peer: SocketAddr,
    stage: Vec<u8>,
    staged: Vec<TxDatagram>,
    max_datagram: usize,
}

impl End {
    fn new(cfg: WanConfig, nonce: u64, mode: IoMode) -> End {
        let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
        sock.set_nonblocking(true).expect("nonblocking");
        let s2 = socket2::SockRef::from(&sock);
        let _ = s2.set_recv_buffer_size(16 << 20);
        let _ = s2.set_send_buffer_size(16 << 20);
        let max_datagram = cfg.max_datagram;
        let io = UdpIo::new(sock.as_raw_fd(), mode, 64, max_datagram, "bench");
        End {
            conn: WanConnection::new(cfg, Time::ZERO, nonce),
            sock,
            io,
            peer: "127.0.0.1:9".parse().unwrap(),
            stage: vec![0; STAGE_SLOTS * max_datagram],
            staged: Vec::with_capacity(STAGE_SLOTS),
            max_datagram,
        }
    }

    /// Stages and sends every datagram already due. True if any went out.
    fn transmit(&mut self, now: Time) -> bool {
        let mut used = 0;
        let mut any = false;
        loop {
            if self.stage.len() - used < self.max_datagram {
                self.flush(&mut used);
            }
            let Some(t) = self.conn.poll_transmit(now, &mut self.stage[used..]) else {
                break;
            };
            // (A paced datagram due later still goes out: with one thread
            // driving both ends, holding it would only add idle turns. The
            // pacing rate is far above what the loop reaches.)
            any = true;
            self.staged.push(TxDatagram {
                off: used,
                len: t.len,
                dest: self.peer,
            });
            used += t.len;
        }
        self.flush(&mut used);
        any
    }

    fn flush(&mut self, used: &mut usize) {
        if !self.staged.is_empty() {
            self.io.send(&self.stage, &self.staged);
            self.staged.clear();
        }
        *used = 0;
    }

    /// Reads what waits. True if anything came.
    fn receive(&mut self, now: Time) -> bool {
        let mut any = false;
        loop {
            let conn = &mut self.conn;
            let n = self
                .io
                .recv(|d, _| conn.handle_datagram_in_place(now, 0, d));
            any |= n > 0;
            if self.io.drained() {
                return any;
            }
        }
    }

    fn timers(&mut self, now: Time) {
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
    }
}

struct Outcome {
    gbps: f64,
    cpu: f64,
    wall: f64,
    bytes: u64,
    send_calls: u64,
    datagrams: u64,
    /// Thread CPU seconds in the sender's and the receiver's calls.
    cpu_send: f64,
    cpu_recv: f64,
    /// What the twins agreed on (`None`: insecure).
    cipher: Option<Cipher>,
}

/// Per-side CPU accounting (`--no-per-side` turns it off: its five clock
/// reads per loop turn are system calls; their cost was within the
/// run-to-run noise when measured, but the option removes any doubt).
static PER_SIDE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// CPU time of the calling thread (the one driving both ends); 0 when
/// per-side accounting is off.
fn thread_cpu() -> f64 {
    if !PER_SIDE.load(std::sync::atomic::Ordering::Relaxed) {
        return 0.0;
    }
    soya_io::sys::thread_cpu_ns() as f64 / 1e9
}

fn cpu_seconds() -> f64 {
    soya_io::sys::process_cpu_secs()
}

fn run(cipher: Option<Cipher>, mode: IoMode, secs: f64, size: usize, window: u64) -> Outcome {
    let key = cipher.map(|_| [0x42u8; 32]);
    let mk = |client: bool| {
        let mut p = PathConfig::new("lo");
        p.rate_bps = Some(200_000_000_000);
        p.rtt_hint = Some(Duration::from_micros(100));
        let mut c = WanConfig::new(vec![p], key, client);
        if let Some(cipher) = cipher {
            c.cipher = CipherPolicy::Only(cipher);
        }
        c.cc = CcKind::FixedRate;
        c.flow_window_bytes = window;
        c
    };
    let mut a = End::new(mk(true), 0x1111, mode);
    let mut b = End::new(mk(false), 0x2222, mode);
    a.peer = b.sock.local_addr().unwrap();
    b.peer = a.sock.local_addr().unwrap();
    let epoch = Instant::now();
    let now = || Time::from_nanos(epoch.elapsed().as_nanos() as u64);
    let payload = vec![0xa5u8; size];
    let msg_len = WanConnection::wire_len(&TwinMsg::Response {
        packet: payload.clone().into(),
    });

    let mut delivered = 0u64;
    let mut t0: Option<(Instant, f64, u64)> = None;
    let (mut cpu_send, mut cpu_recv) = (0.0, 0.0);
    let warmup = Duration::from_millis(300);
    let total = warmup + Duration::from_secs_f64(secs);
    loop {
        let c0 = thread_cpu();
        let t = now();
        if a.conn.is_connected() {
            while a.conn.send_room(FLOW) >= msg_len {
                let m = TwinMsg::Response {
                    packet: payload.clone().into(),
                };
                if a.conn.send(t, FLOW, m).is_err() {
                    break;
                }
            }
        }
        let mut busy = a.transmit(t);
        let c1 = thread_cpu();
        busy |= b.receive(now());
        while let Some(ev) = b.conn.poll_event() {
            if let Event::Message(TwinMsg::Response { packet }) = ev {
                delivered += packet.len() as u64;
            }
        }
        busy |= b.transmit(now());
        let c2 = thread_cpu();
        busy |= a.receive(now());
        while a.conn.poll_event().is_some() {}
        let t = now();
        a.timers(t);
        let c3 = thread_cpu();
        b.timers(t);
        let c4 = thread_cpu();
        if t0.is_some() {
            cpu_send += (c1 - c0) + (c3 - c2);
            cpu_recv += (c2 - c1) + (c4 - c3);
        }
        let el = epoch.elapsed();
        if t0.is_none() && el >= warmup {
            t0 = Some((Instant::now(), cpu_seconds(), delivered));
        }
        if el >= total {
            break;
        }
        if !busy {
            // Nothing moved: wait for a socket or the next timer.
            let next = [a.conn.poll_timeout(), b.conn.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
                .map_or(Duration::from_millis(1), |d| d.since(t))
                .min(Duration::from_millis(1));
            let mut fds = [a.sock.as_raw_fd(), b.sock.as_raw_fd()]
                .map(|fd| soya_io::sys::pollfd(fd, libc::POLLIN));
            let _ = soya_io::sys::ppoll(&mut fds, Some(next));
        }
    }
    let (w0, c0, d0) = t0.expect("warm-up ended");
    let wall = w0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - c0;
    let bytes = delivered - d0;
    let (sa, sb) = (a.conn.stats(), b.conn.stats());
    assert_eq!(sa.cipher, sb.cipher, "the twins agree");
    assert_eq!(sa.cipher, cipher, "the cipher asked for");
    Outcome {
        gbps: bytes as f64 * 8.0 / wall / 1e9,
        cpu,
        wall,
        bytes,
        send_calls: a.io.stats.send_calls,
        datagrams: a.io.stats.datagrams_sent,
        cpu_send,
        cpu_recv,
        cipher: sa.cipher,
    }
}

/// Gigabits per CPU second.
fn per_cpu(bytes: u64, cpu: f64) -> f64 {
    if cpu > 0.0 {
        bytes as f64 * 8.0 / cpu / 1e9
    } else {
        0.0
    }
}

#[derive(clap::Parser)]
struct Args {
    /// Length of each run, seconds (after a 0.3 s warm-up).
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Message size, bytes.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Per-flow credit, MiB: the sender keeps up to this much (+ 1 MiB of
    /// queue) outstanding, so it is also the working set of queued messages.
    #[arg(long = "window", default_value_t = 32)]
    window_mib: u64,
    /// Turn off the per-side CPU split (its clock reads are system calls).
    #[arg(long)]
    no_per_side: bool,
    /// Only the runs whose name contains this.
    #[arg(long)]
    only: Option<String>,
}

fn main() {
    let Args {
        secs,
        size,
        window_mib,
        no_per_side,
        only,
    } = clap::Parser::parse();
    PER_SIDE.store(!no_per_side, std::sync::atomic::Ordering::Relaxed);
    let (aes, chacha) = (Some(Cipher::Aes256Gcm), Some(Cipher::ChaCha20Poly1305));
    // The insecure run first: the others are compared with it.
    let runs = [
        ("insecure gso/gro", None, IoMode::Gso),
        ("aes-256-gcm gso/gro", aes, IoMode::Gso),
        ("chacha20-poly1305 gso/gro", chacha, IoMode::Gso),
        ("aes-256-gcm sendmmsg/recvmmsg", aes, IoMode::Mmsg),
        ("aes-256-gcm one per syscall", aes, IoMode::Single),
    ];
    println!(
        "WAN transport over UDP loopback, {size}-byte messages, one flow (window {window_mib} MiB), {secs} s per run (after 0.3 s warm-up)"
    );
    println!(
        "Gb/s/core = delivered bits / process CPU s, BOTH ends on this one thread (the core seals AND opens);"
    );
    println!(
        "send/core, recv/core = the same bits / thread CPU s spent in that side's calls alone."
    );
    println!(
        "{:<30} {:<18} {:>6} {:>6} {:>6} {:>9} {:>7} {:>9} {:>9} {:>6}",
        "run",
        "cipher (agreed)",
        "Gb/s",
        "CPU s",
        "wall s",
        "Gb/s/core",
        "÷ insec",
        "send/core",
        "recv/core",
        "dg/call"
    );
    let mut baseline: Option<f64> = None;
    for (name, cipher, mode) in runs {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let o = run(cipher, mode, secs, size, window_mib << 20);
        let per_core = per_cpu(o.bytes, o.cpu);
        if cipher.is_none() {
            baseline = Some(per_core);
        }
        let ratio = baseline.map_or("-".to_string(), |b| format!("{:.2}", per_core / b));
        let side = |cpu: f64| {
            if PER_SIDE.load(std::sync::atomic::Ordering::Relaxed) {
                format!("{:.2}", per_cpu(o.bytes, cpu))
            } else {
                "-".to_string()
            }
        };
        println!(
            "{:<30} {:<18} {:>6.2} {:>6.2} {:>6.2} {:>9.2} {:>7} {:>9} {:>9} {:>6.1}",
            name,
            o.cipher.map_or("none (CRC tag)", |c| c.name()),
            o.gbps,
            o.cpu,
            o.wall,
            per_core,
            ratio,
            side(o.cpu_send),
            side(o.cpu_recv),
            o.datagrams as f64 / o.send_calls.max(1) as f64
        );
    }
}
