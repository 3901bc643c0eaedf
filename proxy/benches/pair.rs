//! Gb/s per gateway core of the daemon's per-shard code path, without the
//! kernel: two gateways' [`Site`]s, each driven by the device loop's own
//! turn (`soya::gateway::turn::Turn::run_all`, as the differential test
//! does) over in-memory DC and WAN ports, carry 64 KiB RDMA WRITEs in
//! 4 KiB packets (path MTU 4096, as forward.py's soya-perf sends them) from
//! a requester behind gateway A to a responder behind gateway B, whose ACKs
//! go back. Keyed (AES-256-GCM) and insecure.
//!
//! ```sh
//! cargo bench -p soya --bench pair                       # keyed and insecure, 3 rounds each
//! cargo bench -p soya --bench pair -- --packets 100000 --rounds 5 --insecure
//! ```
//!
//! The figure is a cost, like docs/bench/forward.py's: 8 × payload bytes
//! placed at the responder ÷ the CPU time of the thread (CLOCK_THREAD_CPUTIME_ID,
//! so a busy machine stretches the wall time, not the figure) spent in
//! gateway A's turns, and the same for B. The hosts' work (building
//! packets and their ICRC, checking what arrives, answering) is outside
//! the timed parts. The memory ports copy each packet once where the kernel
//! would (into the buffer the site lends the DC reader, as tun's `read`
//! does; out of the WAN staging buffer on flush, as `sendmmsg` does; out of
//! the site toward a host, as tun's `write` does), and those copies are
//! charged to the gateway, as the kernel's are in forward.py's figure. A
//! gateway takes a turn only when the daemon's `ppoll` would return:
//! something to read or a timer due.
//!
//! In the same run, with the same clock, it measures what the sans-IO
//! parts cost alone: the QP engine's ingress and egress roles
//! (proxy/benches/engine.rs's loops) and a pair of `WanConnection`s in
//! memory with the same cipher; and prints the ratios.

#![deny(unsafe_code)]

use std::cell::Cell;
use std::collections::VecDeque;
use std::time::Duration;

use soya::gateway::memory::{MemDc, MemWan, VirtualClock};
use soya::gateway::ports::Clock;
use soya::gateway::turn::Turn;
use soya_io::sys::thread_cpu_ns;
use soya_proto::qp::twin::Carry;
use soya_proto::qp::{EngineConfig, Output, QpEngine, TwinMsg};
use soya_proto::roce::{is_roce, OpKind, Opcode, Psn, RocePacket};
use soya_proto::site::{Site, SiteParams};
use soya_proto::time::Time;
use soya_proto::wan::{Event, WanConnection};

#[path = "../tests/common/hosts.rs"]
mod hosts;
use hosts::{key, REQUESTER};

const PAYLOAD: usize = 4096;
const FIRST_PSN: u32 = 0xFF_F000; // wraps early in the run
/// PSNs the requester may have unacknowledged: soya-perf's 128 WRs of
/// 64 KiB (16 packets each) in forward.py.
const WINDOW: u32 = 2048;
/// Packets the requester sends per round of the virtual clock, unless
/// `--burst N`: about the DC packets each gateway turn takes.
const BURST: u32 = 16;
/// The WAN path's rate (forward.py's default `--rate`): the transport
/// paces at it in virtual time.
const WAN_RATE: &str = "40gbit";
/// The requester offers `gbps` (default half the path's rate): a round of
/// `burst` packets per this much virtual time.
fn round(burst: u32, gbps: u32) -> Duration {
    Duration::from_nanos(u64::from(burst) * (PAYLOAD as u64) * 8 / u64::from(gbps.max(1)))
}
const WARM_UP: u32 = 5_000;

fn psn(n: u32) -> u32 {
    FIRST_PSN.wrapping_add(n) & 0xFF_FFFF
}

/// The `n`th 4 KiB WRITE Only (the parts' packets, as in engine.rs).
fn write(n: u32, ack_req: bool, buf: &mut [u8]) -> usize {
    write_op(n, Opcode::RC_WRITE_ONLY, ack_req, PAYLOAD, buf)
}

/// Packets per WRITE message of the pair: forward.py's 64 KiB WRITEs.
const MSG_PACKETS: u32 = 16;

/// The requester's `n`th packet: its WRITEs are 64 KiB messages (First,
/// Middle…, Last), AckReq on each Last, as rxe's requester sets it (on
/// message ends, and every 64th packet).
fn write_msg(n: u32, buf: &mut [u8]) -> usize {
    let op = match n % MSG_PACKETS {
        0 => Opcode::RC_WRITE_FIRST,
        i if i == MSG_PACKETS - 1 => Opcode::RC_WRITE_LAST,
        _ => Opcode::RC_WRITE_MIDDLE,
    };
    let last = n % MSG_PACKETS == MSG_PACKETS - 1;
    write_op(n, op, last, PAYLOAD * MSG_PACKETS as usize, buf)
}

fn write_op(n: u32, op: Opcode, ack_req: bool, len: usize, buf: &mut [u8]) -> usize {
    static DATA: [u8; PAYLOAD] = [0x5a; PAYLOAD];
    hosts::request(REQUESTER, op, psn(n), ack_req, len as u32)
        .emit(&DATA, buf)
        .unwrap()
}

// ----- the two gateways -----

fn site_config(client: bool) -> soya_config::SiteConfig {
    let (local, remote, wan, twin) = if client {
        ("10.1.0.0/16", "10.2.0.0/16", 7400, 7500)
    } else {
        ("10.2.0.0/16", "10.1.0.0/16", 7500, 7400)
    };
    // forward.py's gateway configuration (0 km), udp DC backend.
    let text = format!(
        "site = \"{}\"\n[dc]\nbackend = \"udp\"\nlisten = \"127.0.0.1:{}\"\n\
         local_prefixes = [\"{local}\"]\nremote_prefixes = [\"{remote}\"]\n\
         [wan]\nbind = [\"127.0.0.1:{wan}\"]\ninsecure = true\n[[wan.paths]]\n\
         name = \"p0\"\nremote = \"127.0.0.1:{twin}\"\nbind = 0\nrate = \"{WAN_RATE}\"\nrtt = \"1us\"\n\
         [buffer]\nsize = \"256MiB\"\nper_flow_quota = \"64MiB\"\n[pseudo_ack]\npolicy = \"edge\"\n",
        if client { "a" } else { "b" },
        wan - 3000,
    );
    soya_config::parse_str(&text, "pair.toml").unwrap()
}

struct Gateway {
    site: Site,
    turn: Turn,
    dc: MemDc,
    wan: MemWan,
    /// CPU nanoseconds of this thread spent in this gateway's turns.
    cpu_ns: u64,
    turns: u64,
    /// WAN datagrams sent.
    datagrams: u64,
}

impl Gateway {
    fn new(client: bool, keyed: bool) -> Gateway {
        let params = SiteParams::from_config(&site_config(client), keyed.then_some([0x42; 32]));
        let nonce = if client { 0xA1 } else { 0xB2 };
        let site = Site::new(params, Time::ZERO, Box::new(move || Some(nonce)));
        Gateway {
            turn: Turn::new(site.params().wan.max_datagram),
            site,
            // The kernel's batches: 64 packets per read.
            dc: MemDc {
                batch: 64,
                ..MemDc::default()
            },
            wan: MemWan {
                batch: 64,
                ..MemWan::default()
            },
            cpu_ns: 0,
            turns: 0,
            datagrams: 0,
        }
    }

    /// Whether the daemon's `ppoll` would return now: something to read,
    /// or a timer (the site's, a held paced datagram's) due.
    fn ready(&self, now: Time) -> bool {
        !self.dc.rx.is_empty()
            || !self.wan.rx.is_empty()
            || [self.site.poll_timeout(), self.turn.held_until()]
                .into_iter()
                .flatten()
                .any(|t| t <= now)
    }

    /// One turn of the device loop if it would wake now, timed; the site's
    /// events drained, as the device loop logs them.
    fn turn(&mut self, clock: &VirtualClock, timed: bool) {
        if !self.ready(clock.now()) {
            return;
        }
        let t0 = if timed { thread_cpu_ns() } else { 0 };
        self.turn
            .run_all(&mut self.site, &mut self.dc, &mut self.wan, clock)
            .expect("memory never fails");
        while self.site.poll_event().is_some() {}
        if timed {
            self.cpu_ns += thread_cpu_ns() - t0;
            self.turns += 1;
        }
    }
}

/// Gateway A's turn, under a name of its own so that a profile tells the
/// two gateways apart (`docs/bench/perf_groups.py --by-gateway`): both run
/// the same code on the same thread.
#[inline(never)]
fn turn_of_gateway_a(g: &mut Gateway, clock: &VirtualClock, timed: bool) {
    g.turn(clock, timed);
    // Not a tail call (its frame stays on the stack a profile unwinds), and
    // not the same code as B's, which the compiler would merge into one.
    std::hint::black_box(b'A');
}

/// Gateway B's turn (see [`turn_of_gateway_a`]).
#[inline(never)]
fn turn_of_gateway_b(g: &mut Gateway, clock: &VirtualClock, timed: bool) {
    g.turn(clock, timed);
    std::hint::black_box(b'B');
}

/// Moves what `from` sent to `to`'s socket (a lossless, instant WAN).
fn carry(from: &mut Gateway, to: &mut Gateway) -> bool {
    let moved = !from.wan.sent.is_empty();
    from.datagrams += from.wan.sent.len() as u64;
    while let Some(d) = from.wan.sent.pop_front() {
        to.wan.rx.push_back(d);
    }
    moved
}

struct World {
    a: Gateway,
    b: Gateway,
    clock: VirtualClock,
    sent: u32,
    acked: u32,
    /// WRITEs executed in order at the responder.
    received: u32,
    msn: u32,
    timed: bool,
    burst: u32,
    ignore_added_asks: bool,
    /// How long the responder takes to answer an AckReq (virtual time).
    responder_delay: Duration,
    offered_gbps: u32,
    /// Its answers not yet due, in order.
    owed: VecDeque<(Time, Vec<u8>)>,
}

impl World {
    fn new(o: &Opts, keyed: bool) -> World {
        let (a, mut b) = (Gateway::new(true, keyed), Gateway::new(false, keyed));
        b.wan.bufs = a.wan.bufs.clone();
        let mut w = World {
            a,
            b,
            clock: VirtualClock(Cell::new(Time::ZERO)),
            sent: 0,
            acked: 0,
            received: 0,
            msn: 0,
            timed: false,
            burst: o.burst,
            ignore_added_asks: o.ignore_added_asks,
            responder_delay: Duration::from_micros(u64::from(o.responder_delay_us)),
            owed: VecDeque::new(),
            offered_gbps: o.offered_gbps,
        };
        for _ in 0..500 {
            w.settle();
            w.advance(Duration::from_micros(100));
            if w.a.site.is_connected() && w.b.site.is_connected() {
                break;
            }
        }
        assert!(w.a.site.is_connected() && w.b.site.is_connected());
        w
    }

    fn advance(&mut self, d: Duration) {
        self.clock.0.set(self.clock.0.get() + d);
    }

    /// The hosts: the requester takes its ACKs, the responder executes the
    /// WRITEs and answers every AckReq.
    fn hosts(&mut self) -> bool {
        let mut moved = false;
        while let Some(p) = self.a.dc.tx.pop_front() {
            moved = true;
            let r = RocePacket::parse_verified(&p).expect("valid packet to the requester");
            if r.info.kind == OpKind::Ack {
                let n = r.psn().value().wrapping_sub(FIRST_PSN) & 0xFF_FFFF;
                self.acked = self.acked.max(n + 1);
            }
            self.a.dc.bufs.put(p);
        }
        while let Some(p) = self.b.dc.tx.pop_front() {
            moved = true;
            assert!(is_roce(&p));
            let r = RocePacket::parse_verified(&p).expect("valid packet to the responder");
            let n = r.psn().value().wrapping_sub(FIRST_PSN) & 0xFF_FFFF;
            assert!(n <= self.received, "in order, no loss");
            if n == self.received {
                self.received += 1;
                if r.info.completes_message() {
                    self.msn += 1;
                }
            }
            // (`--ignore-added-asks`: only the AckReqs on message ends
            // are answered, a what-if, see `main`.)
            let asked = r.bth.ack_req && (!self.ignore_added_asks || r.info.completes_message());
            if asked {
                let mut v = self.b.dc.bufs.take();
                v.resize(128, 0);
                let len = hosts::emit_ack(r.psn().value(), self.msn, &mut v);
                v.truncate(len);
                let due = self.clock.now() + self.responder_delay;
                self.owed.push_back((due, v));
            }
            self.b.dc.bufs.put(p);
        }
        // The ACKs due by now go to gateway B.
        while self
            .owed
            .front()
            .is_some_and(|(due, _)| *due <= self.clock.now())
        {
            let (_, v) = self.owed.pop_front().expect("just seen");
            self.b.dc.rx.push_back(v);
            moved = true;
        }
        moved
    }

    /// Turns of both gateways until nothing moves.
    fn settle(&mut self) {
        for _ in 0..64 {
            turn_of_gateway_a(&mut self.a, &self.clock, self.timed);
            let mut moved = carry(&mut self.a, &mut self.b);
            turn_of_gateway_b(&mut self.b, &self.clock, self.timed);
            moved |= self.hosts();
            moved |= carry(&mut self.b, &mut self.a);
            if !moved {
                return;
            }
        }
    }

    /// `count` more WRITEs through, acknowledged and executed.
    fn run(&mut self, count: u32) {
        let target = self.sent + count;
        let mut stuck = 0;
        while self.received < target || self.acked < target {
            let before = (self.sent, self.acked, self.received);
            let mut burst = 0;
            while self.sent < target && self.sent - self.acked < WINDOW && burst < self.burst {
                let mut v = self.a.dc.bufs.take();
                v.resize(PAYLOAD + 128, 0);
                let len = write_msg(self.sent, &mut v);
                v.truncate(len);
                self.a.dc.rx.push_back(v);
                self.sent += 1;
                burst += 1;
            }
            self.settle();
            self.advance(round(self.burst, self.offered_gbps));
            stuck = if (self.sent, self.acked, self.received) == before {
                stuck + 1
            } else {
                0
            };
            assert!(stuck < 100_000, "no progress");
        }
    }
}

/// CPU nanoseconds one reading of the thread's CPU clock costs.
fn clock_call_ns() -> f64 {
    const CALLS: u64 = 20_000;
    let t0 = thread_cpu_ns();
    for _ in 0..CALLS {
        std::hint::black_box(thread_cpu_ns());
    }
    (thread_cpu_ns() - t0) as f64 / (CALLS + 1) as f64
}

/// Gb/s per core: `packets` 4 KiB payloads in `ns` CPU nanoseconds.
fn gbps(packets: u64, ns: u64) -> f64 {
    (packets * PAYLOAD as u64 * 8) as f64 / ns as f64
}

struct PairRun {
    a: f64,
    b: f64,
    /// CPU ns one call of the thread CPU clock costs.
    clock_call_ns: f64,
    /// WAN datagrams per packet, A to B and B to A.
    datagrams_a: f64,
    datagrams_b: f64,
    /// Twin messages from B per packet (`Delivered`: one per responder ACK).
    messages_b: f64,
    turns_per_packet: f64,
}

fn pair(o: &Opts, keyed: bool) -> PairRun {
    let packets = o.packets;
    let mut w = World::new(o, keyed);
    w.run(WARM_UP);
    let lost = w.a.site.wan().stats().packets_lost;
    w.timed = true;
    let (da, db) = (w.a.datagrams, w.b.datagrams);
    let mb = w.b.site.wan().stats().messages_queued;
    w.run(packets);
    assert_eq!(w.received, WARM_UP + packets);
    assert_eq!(w.a.site.wan().stats().packets_lost, lost, "no loss");
    let ing = w.a.site.engine().ingress_halves().next().unwrap();
    assert_eq!(ing.mode, soya_proto::qp::ingress::Mode::Accelerated);
    assert!(ing.stats.pseudo_acks > 0);
    assert_eq!(ing.stats.withheld_acks + ing.stats.backpressure_drops, 0);
    let p = u64::from(packets);
    // Each timed turn also paid about one call of the clock (the end of
    // the first, the start of the second): a system call, as costly as a
    // small turn's work on this VM. Taken back out.
    let call = clock_call_ns();
    let net = |g: &Gateway| g.cpu_ns - (g.turns as f64 * call) as u64;
    PairRun {
        a: gbps(p, net(&w.a)),
        b: gbps(p, net(&w.b)),
        clock_call_ns: call,
        datagrams_a: (w.a.datagrams - da) as f64 / p as f64,
        datagrams_b: (w.b.datagrams - db) as f64 / p as f64,
        messages_b: (w.b.site.wan().stats().messages_queued - mb) as f64 / p as f64,
        turns_per_packet: (w.a.turns + w.b.turns) as f64 / 2.0 / p as f64,
    }
}

// ----- the sans-IO parts alone -----

fn drain(e: &mut QpEngine) {
    while let Some(o) = e.poll_output() {
        match o {
            Output::Dc(packet)
            | Output::Twin(TwinMsg::Request { packet, .. })
            | Output::Twin(TwinMsg::Response { packet })
            | Output::Twin(TwinMsg::Datagram { packet }) => e.recycle(packet),
            Output::DcHeld(_) | Output::Twin(_) => {}
        }
    }
}

fn packet(n: u32, ack_req: bool) -> Vec<u8> {
    let mut v = vec![0; PAYLOAD + 128];
    let len = write(n, ack_req, &mut v);
    v.truncate(len);
    v
}

fn ack_vec(n: u32, msn: u32) -> Vec<u8> {
    let mut v = vec![0; 128];
    let len = hosts::emit_ack(psn(n), msn, &mut v);
    v.truncate(len);
    v
}

/// Packets built per untimed batch of the engine loops.
const CHUNK: u32 = 1024;

/// The engine's ingress role (engine.rs `ingress`): CPU ns per packet.
fn engine_ingress(packets: u32) -> f64 {
    let mut e = QpEngine::new(EngineConfig::default());
    // Learned from a forwarded request and the responder's ACK of it.
    e.handle_dc(Time::ZERO, &packet(0, true));
    drain(&mut e);
    e.handle_twin(
        Time::ZERO,
        TwinMsg::Response {
            packet: ack_vec(0, 1).into(),
        },
    );
    drain(&mut e);
    let mut ns = 0;
    let mut n = 1;
    while n <= packets {
        let chunk: Vec<Vec<u8>> = (n..n + CHUNK).map(|i| packet(i, i % 16 == 0)).collect();
        let t0 = thread_cpu_ns();
        for p in &chunk {
            let now = Time::from_nanos(u64::from(n) * 400);
            e.handle_dc(now, p);
            drain(&mut e);
            if n % 1024 == 0 {
                e.handle_twin(
                    now,
                    TwinMsg::Delivered {
                        half: key(REQUESTER),
                        psn: Psn::new(psn(n)),
                        msn: Some((n + 1) & 0xFF_FFFF),
                    },
                );
                drain(&mut e);
            }
            n += 1;
        }
        ns += thread_cpu_ns() - t0;
    }
    let s = e.ingress_halves().next().unwrap().stats;
    assert_eq!(s.withheld_acks + s.backpressure_drops, 0, "{s:?}");
    ns as f64 / f64::from(n - 1)
}

/// The engine's egress role (engine.rs `egress`): CPU ns per packet.
fn engine_egress(packets: u32) -> f64 {
    let mut e = QpEngine::new(EngineConfig::default());
    e.handle_twin(
        Time::ZERO,
        TwinMsg::Request {
            carry: Carry::Raw,
            packet: packet(0, true).into(),
        },
    );
    drain(&mut e);
    e.handle_dc(Time::ZERO, &ack_vec(0, 1));
    drain(&mut e);
    let mut ns = 0;
    let mut n = 1;
    while n <= packets {
        let chunk: Vec<(TwinMsg, Option<Vec<u8>>)> = (n..n + CHUNK)
            .map(|i| {
                let m = TwinMsg::Request {
                    carry: Carry::Reliable,
                    packet: packet(i, i % 16 == 0).into(),
                };
                (m, (i % 64 == 0).then(|| ack_vec(i, i + 1)))
            })
            .collect();
        let t0 = thread_cpu_ns();
        for (m, a) in chunk {
            let now = Time::from_nanos(u64::from(n) * 400);
            e.handle_twin(now, m);
            drain(&mut e);
            if let Some(a) = &a {
                e.handle_dc(now, a);
                drain(&mut e);
            }
            n += 1;
        }
        ns += thread_cpu_ns() - t0;
    }
    let s = e.egress_halves().next().unwrap().stats;
    assert_eq!(s.retransmitted + s.timeouts, 0, "{s:?}");
    ns as f64 / f64::from(n - 1)
}

/// A pair of `WanConnection`s with the gateways' settings, one 4 KiB
/// request at a time (engine.rs `wan_conn`): CPU ns per message, both
/// sides together.
fn wan_pair(keyed: bool, packets: u32) -> f64 {
    let conn = |client: bool| {
        let p = SiteParams::from_config(&site_config(client), keyed.then_some([0x42; 32]));
        let mut w = p.wan.clone();
        w.is_client = client;
        WanConnection::new(w, Time::ZERO, if client { 0xA1 } else { 0xB2 })
    };
    let (mut a, mut b) = (conn(true), conn(false));
    let mut buf = vec![0; 9216];
    let mut now = Time::ZERO;
    let mut step = |a: &mut WanConnection, b: &mut WanConnection, now: Time, m: Option<TwinMsg>| {
        if let Some(m) = m {
            a.send(now, 1, m).expect("credit");
        }
        for dir in 0..2 {
            let (tx, rx) = if dir == 0 {
                (&mut *a, &mut *b)
            } else {
                (&mut *b, &mut *a)
            };
            while let Some(t) = tx.poll_transmit(now, &mut buf) {
                rx.handle_datagram_in_place(now, t.path, &mut buf[..t.len]);
            }
            while let Some(ev) = rx.poll_event() {
                if let Event::Message(TwinMsg::Request { packet, .. }) = ev {
                    rx.recycle(packet);
                }
            }
        }
        for c in [a, b] {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
        }
    };
    for _ in 0..500 {
        step(&mut a, &mut b, now, None);
        now += Duration::from_micros(100);
    }
    assert!(a.is_connected() && b.is_connected());
    let p = packet(1, false);
    let mut ns = 0;
    let mut done = 0;
    while done < packets {
        let msgs: Vec<TwinMsg> = (0..CHUNK)
            .map(|_| TwinMsg::Request {
                carry: Carry::Reliable,
                packet: p.clone().into(),
            })
            .collect();
        let t0 = thread_cpu_ns();
        for m in msgs {
            step(&mut a, &mut b, now, Some(m));
            // Far below the pacing rate: nothing is held.
            now += Duration::from_micros(1);
            done += 1;
        }
        ns += thread_cpu_ns() - t0;
    }
    ns as f64 / f64::from(done)
}

/// The command line.
struct Opts {
    packets: u32,
    rounds: u32,
    burst: u32,
    /// Only the pair, without the parts (for a profile of the gateways).
    only_pair: bool,
    /// A what-if, not a protocol: the responder answers only the AckReqs
    /// on message ends (the requester's, every 16th packet), not those
    /// gateway B's egress adds on the last packet it holds (`qp::egress`,
    /// `tail`), which with one packet per turn is every packet. Shows what
    /// those added ACKs and the `Delivered` messages they cause cost the
    /// gateways: what an egress that added asks only at message ends
    /// would save on this traffic.
    ignore_added_asks: bool,
    /// The responder's turnaround for an ACK, in µs of virtual time
    /// (default 0: at once, before the next packet when one comes per turn).
    /// With a turnaround longer than the gap between packets (1.6 µs at the
    /// default `--offered-gbps`), the asks gateway B adds are answered less
    /// often.
    responder_delay_us: u32,
    /// The requester's rate in Gb/s of virtual time (default 20, half the
    /// path's): with `--burst 1`, the gap between two packets.
    offered_gbps: u32,
    modes: Vec<bool>,
}

impl Opts {
    fn parse() -> Opts {
        let args: Vec<String> = std::env::args().collect();
        let num = |name: &str, default: u32| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
                .map_or(default, |v| v.parse().expect("a number"))
        };
        let flag = |name: &str| args.iter().any(|a| a == name);
        Opts {
            packets: num("--packets", 100_000),
            rounds: num("--rounds", 3),
            burst: num("--burst", BURST),
            only_pair: flag("--only-pair"),
            ignore_added_asks: flag("--ignore-added-asks"),
            responder_delay_us: num("--responder-delay-us", 0),
            offered_gbps: num("--offered-gbps", 20),
            modes: if flag("--insecure") {
                vec![false]
            } else if flag("--keyed") {
                vec![true]
            } else {
                vec![true, false]
            },
        }
    }
}

fn main() {
    let o = Opts::parse();
    let packets = o.packets;
    println!(
        "pair: {packets} 4 KiB packets (64 KiB WRITEs) per run after {WARM_UP} of warm-up, window {WINDOW}, \
         {} per {:?} of virtual time, responder answers after {} µs{}; \
         Gb/s per CPU-second of this thread",
        o.burst,
        round(o.burst, o.offered_gbps),
        o.responder_delay_us,
        if o.ignore_added_asks {
            ", responder ignores the AckReqs gateway B adds (what-if)"
        } else {
            ""
        }
    );
    for &keyed in &o.modes {
        let mode = if keyed { "keyed" } else { "insecure" };
        let mut runs = Vec::new();
        for r in 1..=o.rounds {
            let parts = (!o.only_pair).then(|| {
                (
                    engine_ingress(packets),
                    engine_egress(packets),
                    wan_pair(keyed, packets),
                )
            });
            let run = pair(&o, keyed);
            println!(
                "{mode} round {r}: gateway A {:.2} Gb/s per core, B {:.2}, mean {:.2} \
                 (per packet: {:.2} turns, WAN datagrams A>B {:.2} B>A {:.2}, B's twin messages {:.2}; \
                 clock call {:.0} ns)",
                run.a,
                run.b,
                (run.a + run.b) / 2.0,
                run.turns_per_packet,
                run.datagrams_a,
                run.datagrams_b,
                run.messages_b,
                run.clock_call_ns
            );
            runs.push((run.a, run.b));
            let Some((ing, eg, wan)) = parts else {
                continue;
            };
            let g = |ns: f64| PAYLOAD as f64 * 8.0 / ns;
            // What the parts alone would give each gateway: its engine
            // role plus half the WAN pair (both sides' work, about even).
            let parts_a = g(ing + wan / 2.0);
            let parts_b = g(eg + wan / 2.0);
            println!(
                "  parts: engine ingress {:.1} Gb/s per core, egress {:.1}; WAN pair {wan:.0} ns \
                 per message ({:.1} Gb/s per side); ingress + half the WAN {parts_a:.2}, \
                 egress + half {parts_b:.2} | pair / parts: A {:.2} B {:.2}",
                g(ing),
                g(eg),
                g(wan / 2.0),
                run.a / parts_a,
                run.b / parts_b,
            );
        }
        if runs.len() > 1 {
            let a: Vec<f64> = runs.iter().map(|r| r.0).collect();
            let b: Vec<f64> = runs.iter().map(|r| r.1).collect();
            let mean: Vec<f64> = runs.iter().map(|r| (r.0 + r.1) / 2.0).collect();
            println!(
                "{mode}, {} rounds at {} per turn, Gb/s per gateway core, min-max (median): \
                 A {}, B {}, mean of A and B {}",
                runs.len(),
                o.burst,
                spread(&a),
                spread(&b),
                spread(&mean)
            );
        }
    }
}

/// `min–max (median m)` of several rounds: the spread, never the best one.
fn spread(xs: &[f64]) -> String {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    format!("{:.2}-{:.2} (median {median:.2})", v[0], v[n - 1])
}
