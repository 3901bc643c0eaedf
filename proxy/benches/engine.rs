//! Per-packet cost of the gateway's QP engine, and its memory per flow.
//!
//! ```sh
//! cargo bench -p soya --bench engine
//! cargo bench -p soya --bench engine -- --warm-up-time 1 --measurement-time 3   # about a minute
//! ```
//!
//! Prints one `memory per flow` line first (measured with a counting global
//! allocator, no assertion), then criterion groups, each timed per packet
//! (`Throughput::Elements(1)`), on 4 KiB RDMA WRITE Only packets:
//!
//! - `baseline`: parse, ICRC-verify and copy the packet once, what any
//!   forwarder must do;
//! - `ingress`: a learned, accelerated half at the requester's site taking
//!   in-order packets (accept, buffer, forward to the twin, pseudo-ACK every
//!   16), outputs drained (their buffers recycled, as the device loop does);
//!   the twin reports `Delivered` every 1024 packets so the buffer stays in
//!   a steady state;
//! - `egress`: the twin's reliable requests re-injected toward the responder,
//!   whose ACK (one per 64 packets) is absorbed and reported delivered;
//! - `wan_msg`: the WAN codec of one such `Request` (encode, decode);
//! - `wan_conn`: one such `Request` through a pair of `WanConnection`s in
//!   memory (no sockets): queue, frame, seal, open, parse, reassemble,
//!   decode, plus the ACKs and credit going back; per packet cipher, and
//!   insecure (CRC tag) for comparison. Building the message (its 4 KiB
//!   payload) is outside the timed part.
//!
//! Building the input packets (their ICRC) happens outside the timed part.

#![deny(unsafe_code)]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

use criterion::{criterion_group, BatchSize, Criterion, Throughput};

use soya_io::sys::{CountingAlloc, HeapChange};
use soya_proto::qp::egress::Reinjector;
use soya_proto::qp::ingress::{Mode, PseudoAcker};
use soya_proto::qp::twin::Carry;
use soya_proto::qp::{EngineConfig, Output, QpEngine, TwinMsg};
use soya_proto::roce::{Opcode, Psn, RocePacket};
use soya_proto::time::Time;
use soya_proto::wan::{
    msg, CcKind, Cipher, CipherPolicy, Event, PathConfig, WanConfig, WanConnection,
};

#[path = "../tests/common/hosts.rs"]
mod hosts;
use hosts::{key, REQUESTER};

// ---------------------------------------------------------------------------
// A global allocator that counts live heap bytes while `COUNTING` is set
// (only during the memory measurement: the timed benches pay one relaxed load).

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

fn note(change: HeapChange) {
    if COUNTING.load(Ordering::Relaxed) {
        let delta = match change {
            HeapChange::Alloc(n) => n as isize,
            HeapChange::Dealloc(n) => -(n as isize),
            HeapChange::Realloc { old, new } => new as isize - old as isize,
        };
        LIVE.fetch_add(delta, Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc(note);

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// Packets.

const PAYLOAD: usize = 4096;
/// The simulated clock advances this much per packet (4 KiB at ~80 Gbit/s):
/// pseudo-ACKs are due by count, long before the 20 µs coalescing timer.
const TICK_NS: u64 = 400;
/// The twin reports `Delivered` every this many packets (ingress).
const DELIVER_EVERY: u32 = 1024;
/// The responder ACKs every this many packets (egress).
const ACK_EVERY: u32 = 64;
/// PSN of the learning request; the timed packets follow it, so the 24-bit
/// PSN wraps within the first 256 of them (a long run wraps again every
/// 2^24 packets either way).
const FIRST_PSN: u32 = 0xFF_FF00;

/// PSN of the `n`th packet after the learning request.
fn psn(n: u32) -> u32 {
    FIRST_PSN.wrapping_add(n) & 0xFF_FFFF
}

/// A request from `requester` to the responder.
fn request(op: Opcode, requester: Ipv4Addr, psn: u32, ack_req: bool, len: usize) -> Vec<u8> {
    hosts::request(requester, op, psn, ack_req, len as u32)
        .to_vec(&vec![0x5a; len])
        .unwrap()
}

/// The `n`th 4 KiB WRITE Only after the learning request, AckReq set every
/// 16 packets.
fn write(requester: Ipv4Addr, n: u32) -> Vec<u8> {
    request(
        Opcode::RC_WRITE_ONLY,
        requester,
        psn(n),
        n % 16 == 0,
        PAYLOAD,
    )
}

/// The responder's ACK of `psn` to `requester`.
fn ack(requester: Ipv4Addr, psn: u32, msn: u32) -> Vec<u8> {
    hosts::ack(requester, psn, msn).to_vec(&[]).unwrap()
}

/// Takes every output, and gives its packet buffer back to the engine's
/// pool as the device loop does once it is sent (a `Request`'s comes back
/// through the transport's pool; here directly).
fn drain(e: &mut QpEngine) {
    while let Some(o) = e.poll_output() {
        match black_box(o) {
            Output::Dc(packet)
            | Output::Twin(TwinMsg::Request { packet, .. })
            | Output::Twin(TwinMsg::Response { packet })
            | Output::Twin(TwinMsg::Datagram { packet }) => e.recycle(packet),
            // Sent from where it is held: nothing to give back.
            Output::DcHeld(_) | Output::Twin(_) => {}
        }
    }
}

/// Requester address of flow `i` (one half per requester host).
fn host(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8)
}

/// Ingress: learn the half of `requester` from traffic (a request forwarded
/// raw, the responder's ACK back): accelerated from the next PSN on.
fn learn_ingress(e: &mut QpEngine, requester: Ipv4Addr) {
    e.handle_dc(
        Time::ZERO,
        &request(Opcode::RC_SEND_ONLY, requester, psn(0), true, 8),
    );
    drain(e);
    e.handle_twin(
        Time::ZERO,
        TwinMsg::Response {
            packet: ack(requester, psn(0), 1).into(),
        },
    );
    drain(e);
}

/// Egress: the twin's raw request, the responder's ACK of it.
fn learn_egress(e: &mut QpEngine, requester: Ipv4Addr) {
    e.handle_twin(
        Time::ZERO,
        TwinMsg::Request {
            carry: Carry::Raw,
            packet: request(Opcode::RC_SEND_ONLY, requester, psn(0), true, 8).into(),
        },
    );
    drain(e);
    e.handle_dc(Time::ZERO, &ack(requester, psn(0), 1));
    drain(e);
}

// ---------------------------------------------------------------------------
// Memory per flow.

/// Flows learned for the per-flow figure (the hash tables are then ~61 %
/// full: the figure includes their usual slack).
const FLOWS: u32 = 10_000;
/// Packets held by one half for the per-held-packet figure (a power of two:
/// the queues' capacity is then exactly this).
const HELD: u32 = 4096;

fn memory_per_flow() {
    let cfg = EngineConfig {
        buffer_slots: 2 * HELD as usize,
        ..EngineConfig::default()
    };
    // The buffer's slab is allocated up front (and is the packets' storage,
    // excluded here): create the engines before counting.
    let mut ing = QpEngine::new(cfg);
    let mut eg = QpEngine::new(cfg);
    let mut held_ing = QpEngine::new(cfg);
    let mut held_eg = QpEngine::new(cfg);
    COUNTING.store(true, Ordering::Relaxed);

    // One flow first, so the engines' output queues are allocated.
    learn_ingress(&mut ing, host(0));
    learn_egress(&mut eg, host(0));
    let before = live();
    for i in 1..=FLOWS {
        learn_ingress(&mut ing, host(i));
    }
    let ingress = (live() - before) as f64 / f64::from(FLOWS);
    let before = live();
    for i in 1..=FLOWS {
        learn_egress(&mut eg, host(i));
    }
    let egress = (live() - before) as f64 / f64::from(FLOWS);
    assert!(ing.ingress_halves().all(|h| h.mode == Mode::Accelerated));

    // Held packets: their bytes are in the slab; what grows is the halves'
    // queues (and the buffer's per-flow count, once per flow).
    learn_ingress(&mut held_ing, REQUESTER);
    learn_egress(&mut held_eg, REQUESTER);
    let pkts: Vec<Vec<u8>> = (1..=HELD).map(|n| write(REQUESTER, n)).collect();
    let before = live();
    for p in &pkts {
        held_ing.handle_dc(Time::ZERO, p);
        drain(&mut held_ing);
    }
    let per_held_ing = (live() - before) as f64 / f64::from(HELD);
    let mut msgs: Vec<TwinMsg> = pkts
        .into_iter()
        .map(|packet| TwinMsg::Request {
            carry: Carry::Reliable,
            packet: packet.into(),
        })
        .collect();
    let before = live();
    for m in msgs.drain(..) {
        held_eg.handle_twin(Time::ZERO, m);
        drain(&mut held_eg);
    }
    // The messages' own vectors were freed inside: count them back.
    let per_held_eg =
        (live() - before) as f64 / f64::from(HELD) + (write(REQUESTER, 1).capacity()) as f64;
    COUNTING.store(false, Ordering::Relaxed);
    assert_eq!(held_ing.occupancy().slots_used, HELD as usize);
    assert_eq!(held_eg.occupancy().slots_used, HELD as usize);

    println!(
        "memory per flow (excluding buffered packets): ingress {ingress:.0} B + egress {egress:.0} B \
         (+{per_held_ing:.0} B ingress / +{per_held_eg:.0} B egress per held packet); \
         size_of PseudoAcker {} B, Reinjector {} B; heap measured over {FLOWS} flows and {HELD} held packets",
        std::mem::size_of::<PseudoAcker>(),
        std::mem::size_of::<Reinjector>(),
    );
}

// ---------------------------------------------------------------------------
// Per-packet cost.

fn baseline(c: &mut Criterion) {
    let pkts: Vec<Vec<u8>> = (1..=64).map(|n| write(REQUESTER, n)).collect();
    let mut g = c.benchmark_group("baseline");
    g.throughput(Throughput::Elements(1));
    let mut i = 0;
    g.bench_function("parse_verify_copy_4KiB", |b| {
        b.iter(|| {
            let p = &pkts[i % pkts.len()];
            i += 1;
            let v = RocePacket::parse_verified(black_box(p)).unwrap();
            v.as_bytes().to_vec()
        })
    });
    g.finish();
}

fn ingress(c: &mut Criterion) {
    let mut e = QpEngine::new(EngineConfig::default());
    learn_ingress(&mut e, REQUESTER);
    assert!(e.ingress_halves().all(|h| h.mode == Mode::Accelerated));
    let half = key(REQUESTER);
    let mut next = 0u32; // packets built
    let mut done = 0u32; // packets handled
    let mut g = c.benchmark_group("ingress");
    g.throughput(Throughput::Elements(1));
    g.bench_function("write_4KiB_pseudo_ack", |b| {
        b.iter_batched(
            || {
                next += 1;
                write(REQUESTER, next)
            },
            |p| {
                done += 1;
                let now = Time::from_nanos(u64::from(done) * TICK_NS);
                e.handle_dc(now, &p);
                drain(&mut e);
                if done % DELIVER_EVERY == 0 {
                    e.handle_twin(
                        now,
                        TwinMsg::Delivered {
                            half,
                            psn: Psn::new(psn(done)),
                            msn: Some((done + 1) & 0xFF_FFFF),
                        },
                    );
                    drain(&mut e);
                }
                p
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
    let s = e.ingress_halves().next().unwrap().stats;
    assert_eq!(s.packets, u64::from(done) + 1, "every packet accepted");
    assert!(s.pseudo_acks >= u64::from(done / 16), "pseudo-ACKed: {s:?}");
    assert_eq!(s.withheld_acks + s.backpressure_drops, 0, "{s:?}");
    assert!(e.occupancy().slots_used <= DELIVER_EVERY as usize);
}

fn egress(c: &mut Criterion) {
    let mut e = QpEngine::new(EngineConfig::default());
    learn_egress(&mut e, REQUESTER);
    let mut next = 0u32;
    let mut g = c.benchmark_group("egress");
    g.throughput(Throughput::Elements(1));
    g.bench_function("write_4KiB_inject_absorb_ack", |b| {
        b.iter_batched(
            || {
                next += 1;
                let m = TwinMsg::Request {
                    carry: Carry::Reliable,
                    packet: write(REQUESTER, next).into(),
                };
                let a = (next % ACK_EVERY == 0).then(|| ack(REQUESTER, psn(next), next + 1));
                (next, m, a)
            },
            |(n, m, a)| {
                let now = Time::from_nanos(u64::from(n) * TICK_NS);
                e.handle_twin(now, m);
                drain(&mut e);
                if let Some(a) = &a {
                    e.handle_dc(now, a);
                    drain(&mut e);
                }
                a
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
    let s = e.egress_halves().next().unwrap().stats;
    assert_eq!(s.injected, u64::from(next), "every packet injected: {s:?}");
    assert_eq!(s.retransmitted + s.timeouts + s.overflow_held, 0, "{s:?}");
    assert!(e.occupancy().slots_used <= ACK_EVERY as usize);
}

fn wan_msg(c: &mut Criterion) {
    let m = TwinMsg::Request {
        carry: Carry::Reliable,
        packet: write(REQUESTER, 1).into(),
    };
    let bytes = msg::encode(&m);
    assert_eq!(msg::decode(&bytes).as_ref(), Ok(&m));
    let mut g = c.benchmark_group("wan_msg");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode_request_4KiB", |b| {
        b.iter(|| msg::encode(black_box(&m)))
    });
    g.bench_function("decode_request_4KiB", |b| {
        b.iter(|| msg::decode(black_box(&bytes)))
    });
    g.finish();
}

/// Two connected `WanConnection`s exchanging datagrams through one buffer,
/// on a clock that advances 1 µs per message (far below the pacing rate).
struct WanPair {
    a: WanConnection,
    b: WanConnection,
    now: Time,
    buf: Vec<u8>,
    delivered: u64,
}

impl WanPair {
    fn new(cipher: Option<Cipher>) -> WanPair {
        let mk = |client: bool| {
            let mut p = PathConfig::new("mem");
            p.rate_bps = Some(400_000_000_000);
            p.rtt_hint = Some(std::time::Duration::from_micros(10));
            let mut c = WanConfig::new(vec![p], cipher.map(|_| [0x42; 32]), client);
            if let Some(cipher) = cipher {
                c.cipher = CipherPolicy::Only(cipher);
            }
            c.cc = CcKind::FixedRate;
            c
        };
        let mut pair = WanPair {
            a: WanConnection::new(mk(true), Time::ZERO, 0x1111),
            b: WanConnection::new(mk(false), Time::ZERO, 0x2222),
            now: Time::ZERO,
            buf: vec![0; 9000],
            delivered: 0,
        };
        // The handshake (HELLOs are retried every 10 ms).
        for _ in 0..500 {
            pair.step(None);
            pair.now += std::time::Duration::from_micros(100);
        }
        assert!(
            pair.a.is_connected() && pair.b.is_connected(),
            "{:?} {:?}",
            pair.a.stats(),
            pair.b.stats()
        );
        assert_eq!(pair.b.stats().cipher, cipher);
        pair
    }

    fn step(&mut self, m: Option<TwinMsg>) {
        let now = self.now;
        if let Some(m) = m {
            self.a
                .send(now, 1, m)
                .expect("credit: the peer consumes at once");
        }
        for (from, to) in [(0, 1), (1, 0)] {
            let (tx, rx) = if from == 0 {
                (&mut self.a, &mut self.b)
            } else {
                (&mut self.b, &mut self.a)
            };
            while let Some(t) = tx.poll_transmit(now, &mut self.buf) {
                rx.handle_datagram_in_place(now, t.path, &mut self.buf[..t.len]);
            }
            while let Some(ev) = rx.poll_event() {
                if to == 1 && matches!(ev, Event::Message(_)) {
                    self.delivered += 1;
                }
                // The packet's buffer back to the pool, as the engine does
                // once it copied it.
                if let Event::Message(TwinMsg::Request { packet, .. }) = black_box(ev) {
                    rx.recycle(packet);
                }
            }
        }
        for c in [&mut self.a, &mut self.b] {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
        }
        self.now = now + std::time::Duration::from_micros(1);
    }
}

fn wan_conn(c: &mut Criterion) {
    let packet = write(REQUESTER, 1);
    let mut g = c.benchmark_group("wan_conn");
    g.throughput(Throughput::Elements(1));
    for (name, cipher) in [
        ("insecure", None),
        ("aes-256-gcm", Some(Cipher::Aes256Gcm)),
        ("chacha20-poly1305", Some(Cipher::ChaCha20Poly1305)),
    ] {
        let mut pair = WanPair::new(cipher);
        g.bench_function(format!("request_4KiB_{name}"), |b| {
            b.iter_batched(
                || TwinMsg::Request {
                    carry: Carry::Reliable,
                    packet: packet.clone().into(),
                },
                |m| pair.step(Some(m)),
                BatchSize::SmallInput,
            )
        });
        let s = pair.a.stats();
        assert_eq!(
            pair.delivered, s.messages_queued,
            "every message delivered at once"
        );
        // (Packets lost during the handshake, sent before the peer had
        // keys, are not counted against the steady state.)
        assert_eq!(pair.b.stats().auth_failures, 0);
    }
    g.finish();
}

criterion_group!(benches, baseline, ingress, egress, wan_msg, wan_conn);

fn main() {
    memory_per_flow();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
