//! The WAN transport alone over real UDP loopback sockets: Gb/s per core.
//!
//! ```text
//! cargo run --release -p soya --example wan_loopback_bench -- [--secs 3] [--size 4096]
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
//! Runs, each `--secs` long: keyed (ChaCha20-Poly1305) with GSO/GRO, keyed
//! with sendmmsg/recvmmsg only, keyed with one datagram per system call,
//! and the unencrypted (insecure) transport with GSO/GRO. For each: goodput
//! (message bytes delivered), CPU seconds of the process (getrusage), and
//! Gb/s per core = bits / CPU seconds, plus the ratio to the first run.
//! The machine may be shared: compare the ratios, measured in one run.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use soya::gateway::udpio::{IoMode, TxDatagram, UdpIo};
use soya::qp::TwinMsg;
use soya::time::Time;
use soya::wan::{CcKind, Event, PathConfig, WanConfig, WanConnection};

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
            let n = self.io.recv(|d, _| conn.handle_datagram(now, 0, d));
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
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn run(keyed: bool, mode: IoMode, secs: f64, size: usize) -> Outcome {
    let key = keyed.then_some([0x42u8; 32]);
    let mk = |client: bool| {
        let mut p = PathConfig::new("lo");
        p.rate_bps = Some(200_000_000_000);
        p.rtt_hint = Some(Duration::from_micros(100));
        let mut c = WanConfig::new(vec![p], key, client);
        c.cc = CcKind::FixedRate;
        c.flow_window_bytes = 32 << 20;
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
        packet: payload.clone(),
    });

    let mut delivered = 0u64;
    let mut t0: Option<(Instant, f64, u64)> = None;
    let warmup = Duration::from_millis(300);
    let total = warmup + Duration::from_secs_f64(secs);
    loop {
        let t = now();
        if a.conn.is_connected() {
            while a.conn.send_room(FLOW) >= msg_len {
                let m = TwinMsg::Response {
                    packet: payload.clone(),
                };
                if a.conn.send(t, FLOW, m).is_err() {
                    break;
                }
            }
        }
        let mut busy = a.transmit(t);
        busy |= b.receive(now());
        while let Some(ev) = b.conn.poll_event() {
            if let Event::Message(TwinMsg::Response { packet }) = ev {
                delivered += packet.len() as u64;
            }
        }
        busy |= b.transmit(now());
        busy |= a.receive(now());
        while a.conn.poll_event().is_some() {}
        let t = now();
        a.timers(t);
        b.timers(t);
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
            let mut fds = [a.sock.as_raw_fd(), b.sock.as_raw_fd()].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: next.as_nanos() as libc::c_long,
            };
            // SAFETY: two live pollfds, a valid timespec, no signal mask.
            unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
        }
    }
    let (w0, c0, d0) = t0.expect("warm-up ended");
    let wall = w0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - c0;
    let bytes = delivered - d0;
    Outcome {
        gbps: bytes as f64 * 8.0 / wall / 1e9,
        cpu,
        wall,
        bytes,
        send_calls: a.io.stats.send_calls,
        datagrams: a.io.stats.datagrams_sent,
    }
}

fn main() {
    let mut secs = 3.0;
    let mut size = 4096;
    let mut only: Option<String> = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--secs" => {
                secs = args[i + 1].parse().expect("--secs N");
                i += 1;
            }
            "--size" => {
                size = args[i + 1].parse().expect("--size BYTES");
                i += 1;
            }
            "--only" => {
                only = Some(args[i + 1].clone());
                i += 1;
            }
            a => {
                eprintln!("unknown argument {a}; usage: [--secs S] [--size BYTES] [--only NAME]");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let runs = [
        ("keyed gso/gro", true, IoMode::Gso),
        ("keyed sendmmsg/recvmmsg", true, IoMode::Mmsg),
        ("keyed one per syscall", true, IoMode::Single),
        ("insecure gso/gro", false, IoMode::Gso),
    ];
    println!(
        "WAN transport over UDP loopback, {size}-byte messages, one flow, {secs} s per run (after 0.3 s warm-up)"
    );
    println!(
        "{:<26} {:>8} {:>8} {:>8} {:>11} {:>9} {:>10}",
        "run", "Gb/s", "CPU s", "wall s", "Gb/s/core", "vs first", "dgrams/call"
    );
    let mut first: Option<f64> = None;
    for (name, keyed, mode) in runs {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let o = run(keyed, mode, secs, size);
        let per_core = if o.cpu > 0.0 {
            o.bytes as f64 * 8.0 / o.cpu / 1e9
        } else {
            0.0
        };
        let f = *first.get_or_insert(per_core);
        println!(
            "{:<26} {:>8.2} {:>8.2} {:>8.2} {:>11.2} {:>8.2}x {:>10.1}",
            name,
            o.gbps,
            o.cpu,
            o.wall,
            per_core,
            if f > 0.0 { per_core / f } else { 0.0 },
            o.datagrams as f64 / o.send_calls.max(1) as f64
        );
    }
}
