//! The simulated world: two hosts, optionally two gateways between them,
//! directed links, and one event heap in virtual time.
//!
//! ```text
//! direct:       host A ───────── WAN ───────── host B
//! accelerated:  host A ── DC ── gw A ══ WAN ══ gw B ── DC ── host B
//! ```
//!
//! Hosts run [`RcQp`] endpoints (the same ones `soya-perf` runs over real
//! sockets); gateways run the real [`QpEngine`]. The WAN between gateways
//! is, for now, a delayed in-order link carrying [`TwinMsg`]s (the WAN
//! transport will replace it).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use rand_chacha::ChaCha8Rng;
use soya::qp::{Output, QpEngine, TwinMsg};
use soya::roce::RocePacket;
use soya::time::Time;

use super::link::Link;
use crate::rc::RcQp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Node {
    HostA,
    GwA,
    GwB,
    HostB,
}

#[derive(Debug)]
pub enum Payload {
    Ip(Vec<u8>),
    Twin(TwinMsg),
}

impl Payload {
    fn len(&self) -> usize {
        match self {
            Payload::Ip(v) => v.len(),
            Payload::Twin(m) => m.wire_len(),
        }
    }
}

struct Event {
    at: Time,
    seq: u64,
    to: Node,
    payload: Payload,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Reversed: `BinaryHeap` is a max-heap and we want the earliest first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// A host: its QPs, found by QPN.
#[derive(Default)]
pub struct Host {
    pub qps: Vec<RcQp>,
    by_qpn: HashMap<u32, usize>,
    pub misaddressed: u64,
}

impl Host {
    pub fn add(&mut self, qpn: u32, qp: RcQp) -> usize {
        self.qps.push(qp);
        self.by_qpn.insert(qpn, self.qps.len() - 1);
        self.qps.len() - 1
    }
}

pub struct World {
    pub now: Time,
    pub rng: ChaCha8Rng,
    heap: BinaryHeap<Event>,
    seq: u64,
    pub host_a: Host,
    pub host_b: Host,
    pub gw_a: Option<QpEngine>,
    pub gw_b: Option<QpEngine>,
    pub links: HashMap<(Node, Node), Link>,
    scratch: Vec<u8>,
    pub events: u64,
    /// Print every delivery (SOYA_SIM_TRACE_PACKETS).
    trace: bool,
}

/// One line about a payload, for traces.
fn describe(p: &Payload) -> String {
    let pkt = |v: &[u8]| match RocePacket::parse(v) {
        Ok(p) => format!(
            "{} {}->{} qp {:#x} psn {}{}{}",
            p.info.name,
            p.ip.src(),
            p.ip.dst(),
            p.bth.dest_qp,
            p.psn(),
            if p.bth.ack_req { " A" } else { "" },
            p.ext
                .aeth
                .map(|a| format!(" {:?} msn {}", a.syndrome, a.msn))
                .unwrap_or_default()
        ),
        Err(e) => format!("unparsable: {e}"),
    };
    match p {
        Payload::Ip(v) => pkt(v),
        Payload::Twin(TwinMsg::Request { carry, packet }) => {
            format!("Request {carry:?} {}", pkt(packet))
        }
        Payload::Twin(TwinMsg::Response { packet }) => format!("Response {}", pkt(packet)),
        Payload::Twin(m) => format!("{m:?}"),
    }
}

impl World {
    pub fn new(rng: ChaCha8Rng) -> World {
        World {
            now: Time::ZERO,
            rng,
            heap: BinaryHeap::new(),
            seq: 0,
            host_a: Host::default(),
            host_b: Host::default(),
            gw_a: None,
            gw_b: None,
            links: HashMap::new(),
            scratch: vec![0; 16 * 1024],
            events: 0,
            trace: std::env::var_os("SOYA_SIM_TRACE_PACKETS").is_some(),
        }
    }

    pub fn accelerated(&self) -> bool {
        self.gw_a.is_some()
    }

    /// Next hop for a packet leaving `from` toward the far side (`far`) or
    /// back toward its own host.
    fn hop(&self, from: Node, twin: bool) -> Node {
        match (from, self.accelerated(), twin) {
            (Node::HostA, true, _) => Node::GwA,
            (Node::HostA, false, _) => Node::HostB,
            (Node::HostB, true, _) => Node::GwB,
            (Node::HostB, false, _) => Node::HostA,
            (Node::GwA, _, true) => Node::GwB,
            (Node::GwA, _, false) => Node::HostA,
            (Node::GwB, _, true) => Node::GwA,
            (Node::GwB, _, false) => Node::HostB,
        }
    }

    fn send(&mut self, from: Node, twin: bool, payload: Payload) {
        let to = self.hop(from, twin);
        let link = self
            .links
            .get_mut(&(from, to))
            .unwrap_or_else(|| panic!("no link {from:?} -> {to:?}"));
        let arrivals = link.transmit(self.now, payload.len(), &mut self.rng);
        let mut payload = Some(payload);
        let n = arrivals.len();
        for (i, at) in arrivals.into_iter().enumerate() {
            let p = if i + 1 == n {
                payload.take().expect("one payload per arrival")
            } else {
                match payload.as_ref().expect("kept for the last arrival") {
                    Payload::Ip(v) => Payload::Ip(v.clone()),
                    Payload::Twin(m) => Payload::Twin(m.clone()),
                }
            };
            self.seq += 1;
            self.heap.push(Event {
                at,
                seq: self.seq,
                to,
                payload: p,
            });
        }
    }

    /// Lets every node send what it has at `now`.
    pub fn flush(&mut self) {
        for node in [Node::HostA, Node::HostB] {
            let mut pending = Vec::new();
            let host = if node == Node::HostA {
                &mut self.host_a
            } else {
                &mut self.host_b
            };
            for qp in host.qps.iter_mut() {
                while let Some(n) = qp.poll_transmit(self.now, &mut self.scratch) {
                    pending.push(self.scratch[..n].to_vec());
                }
            }
            for p in pending {
                self.send(node, true, Payload::Ip(p));
            }
        }
        for node in [Node::GwA, Node::GwB] {
            let mut pending = Vec::new();
            let gw = if node == Node::GwA {
                self.gw_a.as_mut()
            } else {
                self.gw_b.as_mut()
            };
            let Some(gw) = gw else { continue };
            while let Some(o) = gw.poll_output() {
                pending.push(o);
            }
            for o in pending {
                match o {
                    Output::Dc(v) => self.send(node, false, Payload::Ip(v)),
                    Output::Twin(m) => self.send(node, true, Payload::Twin(m)),
                }
            }
        }
    }

    /// Earliest pending event or timer.
    pub fn next_time(&self) -> Option<Time> {
        let mut t = self.heap.peek().map(|e| e.at);
        let mut consider = |x: Option<Time>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        for qp in self.host_a.qps.iter().chain(self.host_b.qps.iter()) {
            consider(qp.poll_timeout());
        }
        for gw in self.gw_a.iter().chain(self.gw_b.iter()) {
            consider(gw.poll_timeout());
        }
        t
    }

    /// Advances to `t` and processes everything due then.
    pub fn step_to(&mut self, t: Time) {
        self.now = self.now.max(t);
        while self.heap.peek().is_some_and(|e| e.at <= self.now) {
            let e = self.heap.pop().expect("peeked");
            self.events += 1;
            self.deliver(e.to, e.payload);
        }
        let now = self.now;
        for qp in self.host_a.qps.iter_mut().chain(self.host_b.qps.iter_mut()) {
            if qp.poll_timeout().is_some_and(|d| d <= now) {
                qp.handle_timeout(now);
            }
        }
        for gw in self.gw_a.iter_mut().chain(self.gw_b.iter_mut()) {
            if gw.poll_timeout().is_some_and(|d| d <= now) {
                gw.handle_timeout(now);
            }
        }
        self.flush();
    }

    /// Components whose timer is due but did not move (a stuck state
    /// machine would spin the simulation at one instant forever).
    pub fn stuck_timers(&self) -> Vec<String> {
        let now = self.now;
        let mut v = Vec::new();
        for (n, h) in [("A", &self.host_a), ("B", &self.host_b)] {
            for (i, qp) in h.qps.iter().enumerate() {
                if qp.poll_timeout().is_some_and(|d| d <= now) {
                    v.push(format!("host {n} qp {i}"));
                }
            }
        }
        for (n, gw) in [("A", &self.gw_a), ("B", &self.gw_b)] {
            if gw
                .as_ref()
                .and_then(|g| g.poll_timeout())
                .is_some_and(|d| d <= now)
            {
                v.push(format!("gateway {n}"));
            }
        }
        v
    }

    fn deliver(&mut self, to: Node, payload: Payload) {
        let now = self.now;
        if self.trace {
            eprintln!("{now:?} -> {to:?}: {}", describe(&payload));
        }
        match (to, payload) {
            (Node::HostA | Node::HostB, Payload::Ip(v)) => {
                let host = if to == Node::HostA {
                    &mut self.host_a
                } else {
                    &mut self.host_b
                };
                let qpn = RocePacket::parse(&v).map(|p| p.bth.dest_qp).ok();
                match qpn.and_then(|q| host.by_qpn.get(&q)) {
                    Some(&i) => host.qps[i].handle_packet(now, &v),
                    None => host.misaddressed += 1,
                }
            }
            (Node::GwA | Node::GwB, payload) => {
                let gw = if to == Node::GwA {
                    self.gw_a.as_mut()
                } else {
                    self.gw_b.as_mut()
                };
                let gw = gw.expect("gateway exists when addressed");
                let from_dc = matches!(payload, Payload::Ip(_));
                match payload {
                    Payload::Ip(v) => gw.handle_dc(now, &v),
                    Payload::Twin(m) => gw.handle_twin(now, m),
                }
                let _ = from_dc;
            }
            (node, Payload::Twin(m)) => panic!("twin message {m:?} delivered to host {node:?}"),
        }
    }

    /// Events still queued.
    pub fn pending_events(&self) -> usize {
        self.heap.len()
    }
}
