//! Two [`RcQp`]s back to back through a deterministic wire.
//!
//! Every packet either QP emits is recorded in [`Harness::trace`], offered to
//! the scripted fault function (which may drop, duplicate, delay or rewrite
//! it), and delivered after the one-way delay. Time jumps to the next event:
//! a packet arrival or a QP deadline. Ties go to the packet sent first.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use soya_proto::roce::builders::{self, ReplyTo};
use soya_proto::roce::{IpHeader, NakCode, OpKind, Opcode, Psn, Reth, RocePacket, Syndrome};
use soya_proto::time::Time;

use crate::rc::{
    Completion, CompletionStatus, QpAddr, QpConfig, RcQp, RecvCompletion, WorkRequest, WrOpcode,
};

pub const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const A_QPN: u32 = 0x11;
pub const B_QPN: u32 = 0x22;
pub const A_PSN: u32 = 0x100;
pub const B_PSN: u32 = 0x5000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl Side {
    fn i(self) -> usize {
        self as usize
    }
}

/// One packet as a QP emitted it (before any fault).
#[derive(Clone, Debug)]
pub struct Sent {
    pub at: Time,
    pub from: Side,
    /// Position among the packets `from` emitted, from 0.
    pub index: usize,
    pub opcode: Opcode,
    pub kind: OpKind,
    pub psn: Psn,
    pub ack_req: bool,
    pub payload_len: usize,
    pub syndrome: Option<Syndrome>,
    pub reth: Option<Reth>,
}

impl Sent {
    pub fn is_request(&self) -> bool {
        self.opcode.info().is_some_and(|i| i.is_request())
    }
}

/// What the wire does with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Deliver,
    Drop,
    /// Deliver two copies.
    Duplicate,
    /// Deliver after this much extra delay (reordering).
    Delay(Duration),
}

type FaultFn = Box<dyn FnMut(&Sent, &mut Vec<u8>) -> Fault>;

pub struct Harness {
    pub now: Time,
    pub a: RcQp,
    pub b: RcQp,
    /// One-way delay of the wire.
    pub delay: Duration,
    wire: BTreeMap<(Time, u64), (Side, Vec<u8>)>,
    seq: u64,
    fault: FaultFn,
    pub trace: Vec<Sent>,
    emitted: [usize; 2],
    /// Per requester side: the acknowledgement bound implied by the
    /// responses delivered to it, and the most request PSNs seen in flight.
    acked: [Psn; 2],
    pub max_inflight: [i32; 2],
    /// Per requester side: READ/atomic requests emitted minus their final
    /// responses delivered (meaningful without loss), and its maximum.
    reads_out: [i32; 2],
    pub max_reads_out: [i32; 2],
    pub time_limit: Time,
    /// Packets handed to each side (wire deliveries and injections).
    pub delivered: [u64; 2],
    buf: Vec<u8>,
}

/// The configuration tests use unless they say otherwise: rxe defaults with
/// a 4 MiB memory (the 64 MiB default costs time to pattern-fill).
pub fn cfg() -> QpConfig {
    QpConfig {
        mem_size: 4 << 20,
        ..QpConfig::default()
    }
}

pub fn cfg_mtu(mtu: usize) -> QpConfig {
    QpConfig { mtu, ..cfg() }
}

/// A WRITE of `len` bytes from A into B's memory at `off`.
pub fn write(h: &Harness, off: u64, len: u32) -> WorkRequest {
    WorkRequest::Write {
        remote_va: h.b.memory().base() + off,
        rkey: h.b.memory().rkey(),
        len,
        imm: None,
    }
}

pub fn statuses(c: &[Completion]) -> Vec<CompletionStatus> {
    c.iter().map(|c| c.status).collect()
}

impl Harness {
    pub fn new(c: QpConfig) -> Harness {
        Harness::with(c.clone(), c, Psn::new(A_PSN), Psn::new(B_PSN))
    }

    pub fn with(ca: QpConfig, cb: QpConfig, psn_a: Psn, psn_b: Psn) -> Harness {
        Harness::between(ca, cb, psn_a, psn_b, A_IP.into(), B_IP.into())
    }

    pub fn between(
        ca: QpConfig,
        cb: QpConfig,
        psn_a: Psn,
        psn_b: Psn,
        ip_a: IpAddr,
        ip_b: IpAddr,
    ) -> Harness {
        let a_addr = QpAddr {
            ip: ip_a,
            qpn: A_QPN,
        };
        let b_addr = QpAddr {
            ip: ip_b,
            qpn: B_QPN,
        };
        let a = RcQp::new(ca, a_addr, b_addr, psn_a, psn_b).expect("valid config");
        let b = RcQp::new(cb, b_addr, a_addr, psn_b, psn_a).expect("valid config");
        let buf = vec![0; a.max_packet_len().max(b.max_packet_len())];
        Harness {
            now: Time::ZERO,
            a,
            b,
            delay: Duration::from_micros(10),
            wire: BTreeMap::new(),
            seq: 0,
            fault: Box::new(|_, _| Fault::Deliver),
            trace: Vec::new(),
            emitted: [0; 2],
            acked: [psn_a, psn_b],
            max_inflight: [0; 2],
            reads_out: [0; 2],
            max_reads_out: [0; 2],
            time_limit: Time::from_millis(20_000),
            delivered: [0; 2],
            buf,
        }
    }

    pub fn set_fault(&mut self, f: impl FnMut(&Sent, &mut Vec<u8>) -> Fault + 'static) {
        self.fault = Box::new(f);
    }

    /// Applies `fault` to the packets `from` emits (only its `index`th, from
    /// 0, when given); every other packet is delivered.
    pub fn fault_from(&mut self, from: Side, index: Option<usize>, fault: Fault) {
        self.set_fault(move |s, _| {
            if s.from == from && index.is_none_or(|i| s.index == i) {
                fault
            } else {
                Fault::Deliver
            }
        });
    }

    pub fn qp(&mut self, s: Side) -> &mut RcQp {
        match s {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Emits everything both QPs have to send.
    fn pump(&mut self) {
        for side in [Side::A, Side::B] {
            loop {
                let now = self.now;
                let mut buf = std::mem::take(&mut self.buf);
                let n = self.qp(side).poll_transmit(now, &mut buf);
                self.buf = buf;
                let Some(n) = n else { break };
                let mut bytes = self.buf[..n].to_vec();
                let p = RocePacket::parse_verified(&bytes).expect("QPs emit valid packets");
                let sent = Sent {
                    at: now,
                    from: side,
                    index: self.emitted[side.i()],
                    opcode: p.bth.opcode,
                    kind: p.info.kind,
                    psn: p.psn(),
                    ack_req: p.bth.ack_req,
                    payload_len: p.payload().len(),
                    syndrome: p.ext.aeth.map(|a| a.syndrome),
                    reth: p
                        .info
                        .headers
                        .contains(soya_proto::roce::opcode::Headers::RETH)
                        .then_some(p.ext.reth),
                };
                self.emitted[side.i()] += 1;
                if sent.is_request() {
                    let inflight = sent.psn.diff(self.acked[side.i()]) + 1;
                    let m = &mut self.max_inflight[side.i()];
                    *m = (*m).max(inflight);
                    if matches!(sent.kind, OpKind::ReadRequest | OpKind::Atomic) {
                        self.reads_out[side.i()] += 1;
                        let m = &mut self.max_reads_out[side.i()];
                        *m = (*m).max(self.reads_out[side.i()]);
                    }
                }
                let action = (self.fault)(&sent, &mut bytes);
                self.trace.push(sent);
                let to = match side {
                    Side::A => Side::B,
                    Side::B => Side::A,
                };
                match action {
                    Fault::Deliver => self.put(now + self.delay, to, bytes),
                    Fault::Drop => {}
                    Fault::Duplicate => {
                        self.put(now + self.delay, to, bytes.clone());
                        self.put(now + self.delay, to, bytes);
                    }
                    Fault::Delay(d) => self.put(now + self.delay + d, to, bytes),
                }
            }
        }
    }

    fn put(&mut self, at: Time, to: Side, bytes: Vec<u8>) {
        self.seq += 1;
        self.wire.insert((at, self.seq), (to, bytes));
    }

    /// Hands `bytes` to `to` now, as if it had just arrived.
    pub fn inject(&mut self, to: Side, bytes: &[u8]) {
        self.deliver(to, bytes);
        self.pump();
    }

    fn deliver(&mut self, to: Side, bytes: &[u8]) {
        if let Ok(p) = RocePacket::parse_verified(bytes) {
            // Track what the requester at `to` has been told.
            let bound = match (p.info.kind, p.ext.aeth.map(|a| a.syndrome)) {
                (OpKind::Ack, Some(Syndrome::Ack { .. })) => Some(p.psn().next()),
                (OpKind::Ack, Some(Syndrome::Nak(NakCode::PsnSequenceError))) => Some(p.psn()),
                (OpKind::ReadResponse | OpKind::AtomicAck, _) => Some(p.psn().next()),
                _ => None,
            };
            if let Some(b) = bound {
                let acked = &mut self.acked[to.i()];
                if b.after(*acked) {
                    *acked = b;
                }
            }
            if p.info.kind == OpKind::AtomicAck
                || p.info.kind == OpKind::ReadResponse && p.info.position.ends()
            {
                self.reads_out[to.i()] -= 1;
            }
        }
        self.delivered[to.i()] += 1;
        let now = self.now;
        self.qp(to).handle_packet(now, bytes);
    }

    /// Processes the next event; false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.pump();
        let next_pkt = self.wire.keys().next().map(|k| k.0);
        let next_timer = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let t = match (next_pkt, next_timer) {
            (None, None) => return false,
            (Some(p), Some(d)) => p.min(d),
            (p, d) => p.or(d).expect("one is set"),
        };
        assert!(
            t <= self.time_limit,
            "still busy at the time limit: {:?} / {:?}",
            self.a,
            self.b
        );
        self.now = self.now.max(t);
        if next_pkt.is_some_and(|p| p <= t) {
            let (_, (to, bytes)) = self.wire.pop_first().expect("non-empty");
            self.deliver(to, &bytes);
        } else {
            let now = self.now;
            for s in [Side::A, Side::B] {
                if self.qp(s).poll_timeout().is_some_and(|d| d <= now) {
                    self.qp(s).handle_timeout(now);
                }
            }
        }
        self.pump();
        true
    }

    /// Runs until nothing is in flight and no timer is armed.
    pub fn run(&mut self) {
        while self.step() {}
    }

    /// Runs until nothing is left to happen or `d` of virtual time passed.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        let limit = std::mem::replace(&mut self.time_limit, Time::MAX);
        while self.step() && self.now < end {}
        self.time_limit = limit;
    }

    /// Runs until `pred` holds (true) or nothing is left to happen (false).
    pub fn run_until(&mut self, mut pred: impl FnMut(&Harness) -> bool) -> bool {
        loop {
            if pred(self) {
                return true;
            }
            if !self.step() {
                return pred(self);
            }
        }
    }

    pub fn completions(&mut self, s: Side) -> Vec<Completion> {
        std::iter::from_fn(|| self.qp(s).poll_completion()).collect()
    }

    pub fn recv_completions(&mut self, s: Side) -> Vec<RecvCompletion> {
        std::iter::from_fn(|| self.qp(s).poll_recv_completion()).collect()
    }

    /// Packets `from` emitted that match `f`.
    pub fn sent(&self, from: Side, f: impl Fn(&Sent) -> bool) -> Vec<Sent> {
        self.trace
            .iter()
            .filter(|s| s.from == from && f(s))
            .cloned()
            .collect()
    }

    /// A posts a WRITE (A's pattern into B) or a READ (B's bytes into A's
    /// memory at the same VA) of `len` bytes at `va` in B's memory.
    pub fn post(&mut self, op: WrOpcode, va: u64, len: u32) {
        let rkey = self.b.memory().rkey();
        let wr = match op {
            WrOpcode::Write => WorkRequest::Write {
                remote_va: va,
                rkey,
                len,
                imm: None,
            },
            WrOpcode::Read => WorkRequest::Read {
                remote_va: va,
                rkey,
                len,
            },
            _ => panic!("the harness posts WRITEs and READs, not {op:?}"),
        };
        self.a.post_send(wr).unwrap();
    }

    /// One field of every request packet `from` emitted, in order.
    pub fn requests<T>(&self, from: Side, field: impl Fn(&Sent) -> T) -> Vec<T> {
        self.sent(from, |s| s.is_request())
            .iter()
            .map(field)
            .collect()
    }

    /// An ACK/NAK as B would send it to A (for injection).
    pub fn forged_b_to_a(&self, psn: Psn, syndrome: Syndrome) -> Vec<u8> {
        let to = ReplyTo {
            ip: IpHeader::v4(B_IP, A_IP),
            src_port: 0xC000,
            dest_qp: A_QPN,
        };
        let repr = match syndrome {
            Syndrome::Nak(c) => builders::nak(&to, psn, c, 0),
            Syndrome::RnrNak { timer } => builders::rnr_nak(&to, psn, timer, 0),
            _ => builders::ack(&to, psn, 0),
        };
        repr.to_vec(&[]).expect("valid ACK")
    }
}

/// Rewrites the PSN of an IPv4 RoCE packet and re-seals its ICRC.
pub fn set_psn(bytes: &mut [u8], psn: Psn) {
    let at = 20 + 8 + 9;
    bytes[at..at + 3].copy_from_slice(&psn.value().to_be_bytes()[1..]);
    soya_proto::roce::icrc::seal(bytes).expect("sealable");
}
