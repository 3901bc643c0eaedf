//! Per-packet cost of the gateway's QP engine, and memory per flow.
//! `cargo run --release --example engine_bench [PACKETS]`
//!
//! Prints figures (not assertions): ns per 4 KiB WRITE packet through the
//! ingress role (parse, ICRC check, buffer copy, forward, pseudo-ACK with
//! ICRC) and through the egress role, against a baseline measured in the
//! same run: parsing + ICRC-verifying the same packet and copying it once.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant;

use soya::qp::twin::Carry;
use soya::qp::{EngineConfig, Output, QpEngine, TwinMsg};
use soya::roce::{
    Aeth, Bth, ExtHeaders, Headers, IpHeader, Opcode, Psn, Reth, RocePacket, RoceRepr, Syndrome,
};
use soya::time::Time;

fn packet(
    op: Opcode,
    from: Ipv4Addr,
    to: Ipv4Addr,
    qp: u32,
    psn: u32,
    ack_req: bool,
    len: usize,
) -> Vec<u8> {
    let info = op.info().unwrap();
    let mut bth = Bth::new(op, qp, Psn::new(psn));
    bth.ack_req = ack_req;
    RoceRepr {
        ip: IpHeader::v4(from, to),
        src_port: 0xc000,
        bth,
        ext: ExtHeaders {
            present: info.headers,
            reth: Reth {
                va: 0x1000,
                rkey: 1,
                len: len as u32,
            },
            aeth: info.headers.contains(Headers::AETH).then_some(Aeth {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: 0,
            }),
            ..Default::default()
        },
    }
    .to_vec(&vec![0x5a; len])
    .unwrap()
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let (a, b) = (Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 2, 0, 1));
    let mut gw = QpEngine::new(EngineConfig::default());
    // Learn the half: one raw request, its real ACK.
    gw.handle_dc(
        Time::ZERO,
        &packet(Opcode::RC_SEND_ONLY, a, b, 0x22, 0, true, 8),
    );
    gw.handle_twin(
        Time::ZERO,
        TwinMsg::Response {
            packet: packet(Opcode::RC_ACK, b, a, 0x11, 0, false, 0),
        },
    );
    while gw.poll_output().is_some() {}
    let pkts: Vec<Vec<u8>> = (1..=64u32)
        .map(|i| packet(Opcode::RC_WRITE_ONLY, a, b, 0x22, i, i % 16 == 0, 4096))
        .collect();

    // Baseline: parse + verify + one copy of the same packets.
    let t = Instant::now();
    for i in 0..n {
        let p = &pkts[(i % 64) as usize];
        let v = RocePacket::parse_verified(black_box(p)).unwrap();
        black_box(v.as_bytes().to_vec());
    }
    let base = t.elapsed().as_nanos() as f64 / f64::from(n);

    // Ingress: every packet accepted, buffered, forwarded; ACK every 16.
    let half = soya::qp::HalfKey {
        requester: a.into(),
        responder: b.into(),
        responder_qpn: 0x22,
    };
    let t = Instant::now();
    let mut forwarded = Vec::new();
    for i in 0..n {
        let psn = i + 1;
        let mut p = pkts[(i % 64) as usize].clone();
        // Rewrite the PSN in place and reseal (outside the timed engine work
        // would be fairer; it is counted, and costs one ICRC).
        p[37..40].copy_from_slice(&(psn & 0xFF_FFFF).to_be_bytes()[1..]);
        soya::roce::icrc::seal(&mut p).unwrap();
        gw.handle_dc(Time::from_nanos(u64::from(i) * 400), &p);
        while let Some(o) = gw.poll_output() {
            if let Output::Twin(m) = o {
                forwarded.push(m);
            }
        }
        if psn % 1024 == 0 {
            gw.handle_twin(
                Time::from_nanos(u64::from(i) * 400),
                TwinMsg::Delivered {
                    half,
                    psn: Psn::new(psn),
                    msn: None,
                },
            );
            while gw.poll_output().is_some() {}
            forwarded.clear();
        }
    }
    let ingress = t.elapsed().as_nanos() as f64 / f64::from(n);
    let acks: u64 = gw.ingress_halves().map(|h| h.stats.pseudo_acks).sum();

    // Egress: a second engine re-injects what the first forwarded.
    let mut eg = QpEngine::new(EngineConfig::default());
    let msgs: Vec<TwinMsg> = (1..=n.min(60_000))
        .map(|psn| {
            let mut p = pkts[(psn % 64) as usize].clone();
            p[37..40].copy_from_slice(&(psn & 0xFF_FFFF).to_be_bytes()[1..]);
            soya::roce::icrc::seal(&mut p).unwrap();
            TwinMsg::Request {
                carry: Carry::Reliable,
                packet: p,
            }
        })
        .collect();
    let m = msgs.len() as u32;
    let t = Instant::now();
    for (i, msg) in msgs.into_iter().enumerate() {
        eg.handle_twin(Time::from_nanos(i as u64 * 400), msg);
        while eg.poll_output().is_some() {}
        if (i + 1) % 64 == 0 {
            let ack = packet(Opcode::RC_ACK, b, a, 0x11, i as u32 + 1, false, 0);
            eg.handle_dc(Time::from_nanos(i as u64 * 400), &ack);
            while eg.poll_output().is_some() {}
        }
    }
    let egress = t.elapsed().as_nanos() as f64 / f64::from(m);

    println!("packets: {n} x 4 KiB WRITE Only");
    println!("baseline (parse + ICRC verify + one copy): {base:.0} ns/packet");
    println!("ingress (accept, buffer, forward, pseudo-ACK): {ingress:.0} ns/packet = {:.2}x baseline, {:.1} Gbit/s per core; {acks} pseudo-ACKs", ingress / base, 4096.0 * 8.0 / ingress);
    println!("egress (hold, inject, absorb ACK, report delivered): {egress:.0} ns/packet = {:.2}x baseline", egress / base);
    println!(
        "memory per flow, excluding buffered packets: PseudoAcker {} B + Reinjector {} B (+ ~64 B per packet held for metadata)",
        std::mem::size_of::<soya::qp::ingress::PseudoAcker>(),
        std::mem::size_of::<soya::qp::egress::Reinjector>()
    );
}
