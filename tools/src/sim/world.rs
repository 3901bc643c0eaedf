//! The simulated world: two hosts, optionally two gateways between them,
//! directed links, and one event heap in virtual time.
//!
//! ```text
//! direct:       host A ───────── WAN ───────── host B
//! accelerated:  host A ── DC ── gw A ══ WAN ══ gw B ── DC ── host B
//! ```
//!
//! Hosts run [`RcQp`] endpoints (the same ones `soya-perf` runs over real
//! sockets); gateways are the real [`Site`] the daemon's shards run (QP
//! engine, WAN transport and the glue between them). The world models only
//! the network (links with delay, rate, loss, reordering, cuts) and the
//! endpoints, never the gateway: what a gateway does here, it does in the
//! daemon.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use soya_proto::qp::QpEngine;
use soya_proto::roce::cm::{self, CmMessage};
use soya_proto::roce::{Bth, Deth, ExtHeaders, IpHeader, Opcode, Psn, RocePacket, RoceRepr};
use soya_proto::site::{DcSent, Site, SiteEvent};
use soya_proto::time::Time;

use super::link::Link;
use super::standby::{Mirrored, Output, Standby, StandbyStats};
use crate::rc::RcQp;
use soya_proto::wan::packet::HEADER_LEN;

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
    /// Gateway to gateway: a WAN transport datagram on a path.
    Wan(usize, Vec<u8>),
}

impl Payload {
    fn len(&self) -> usize {
        match self {
            Payload::Ip(v) | Payload::Wan(_, v) => v.len(),
        }
    }
}

/// One entry of a gateway's trace.
#[derive(Debug)]
pub enum TraceItem {
    /// A packet reached it (DC side) or a datagram (WAN side).
    Input(Payload),
    /// It ran at this instant: timers due, then it sent what it had.
    Turn(Time),
}

/// What a gateway sent, in order: DC packets, and WAN datagrams by path.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Emitted {
    pub dc: Vec<Vec<u8>>,
    pub wan: Vec<(usize, Vec<u8>)>,
}

struct Event {
    at: Time,
    seq: u64,
    to: Node,
    payload: Payload,
    /// Sent by a gateway (0: A, 1: B) while a standby mirrors it: when
    /// it lets it out (output commit, `standby`). Dropped if that gateway
    /// dies before then.
    released: Option<(usize, Time)>,
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
///
/// With 1,024 QPs, visiting every QP at every step (its timer, whether it
/// has a packet, whether it completed work) cost more than everything else
/// the simulator does. A QP can only have something new to send or
/// complete after it was given a packet, fired a timer or was posted to:
/// the host keeps those (`dirty`, `touched`), and each QP's deadline in the
/// world's timer heap, so that a step costs what it touches.
#[derive(Default)]
pub struct Host {
    pub qps: Vec<RcQp>,
    by_qpn: HashMap<u32, usize>,
    pub misaddressed: u64,
    /// RDMA-CM, passive side: the REP to answer each REQ with, by the
    /// REQ's local communication ID (the scenario prepares them).
    pub cm_answers: HashMap<u32, Vec<u8>>,
    /// RDMA-CM, active side: REPs received (connections established).
    pub cm_established: u64,
    /// A hardware NIC port: its QPs take turns (round robin) to put one
    /// packet on the wire, and only when the port is free, so packets
    /// never queue behind the port and a request's timer starts when it
    /// leaves. Off (rxe): every QP emits all its window at once and the
    /// link queues it.
    pub port_scheduled: bool,
    /// The QP whose turn is next.
    next_turn: usize,
    /// The port is busy until then with more to send.
    port_wake: Option<Time>,
    /// QPs that may have a packet to send (touched since they last had
    /// none), in index order: the round robin visits only these.
    ready: BTreeSet<usize>,
    /// QPs touched since the last flush (to poll and re-arm), and a flag
    /// per QP so that each is listed once.
    dirty: Vec<usize>,
    is_dirty: Vec<bool>,
    /// QPs given a packet or a timer since the driver last asked
    /// ([`Host::take_touched`]): only they can have new completions.
    touched: Vec<usize>,
    is_touched: Vec<bool>,
    /// Each QP's deadline as the timer heap has it.
    armed: Vec<Option<Time>>,
}

impl Host {
    pub fn add(&mut self, qpn: u32, qp: RcQp) -> usize {
        self.qps.push(qp);
        let i = self.qps.len() - 1;
        self.by_qpn.insert(qpn, i);
        self.is_dirty.push(false);
        self.is_touched.push(false);
        self.armed.push(None);
        self.mark(i);
        i
    }

    /// QP `i`, for the driver to post work or receives to: it may have
    /// something to send afterwards.
    pub fn qp_mut(&mut self, i: usize) -> &mut RcQp {
        self.mark(i);
        &mut self.qps[i]
    }

    /// Every QP, for the driver to post to (all become candidates).
    pub fn qps_mut(&mut self) -> &mut [RcQp] {
        for i in 0..self.qps.len() {
            self.mark(i);
        }
        &mut self.qps
    }

    /// The QPs given a packet or a timer (or added) since the last call,
    /// in index order: the only ones that can have new completions.
    pub fn take_touched(&mut self) -> Vec<usize> {
        let mut v = std::mem::take(&mut self.touched);
        for &i in &v {
            self.is_touched[i] = false;
        }
        v.sort_unstable();
        v
    }

    fn mark(&mut self, i: usize) {
        if !self.is_dirty[i] {
            self.is_dirty[i] = true;
            self.dirty.push(i);
        }
        self.touch(i);
    }

    fn touch(&mut self, i: usize) {
        if !self.is_touched[i] {
            self.is_touched[i] = true;
            self.touched.push(i);
        }
    }

    /// The dirty QPs, in index order (the order every QP used to be
    /// visited in, so runs stay what they were).
    fn take_dirty(&mut self) -> Vec<usize> {
        let mut v = std::mem::take(&mut self.dirty);
        for &i in &v {
            self.is_dirty[i] = false;
        }
        v.sort_unstable();
        v
    }
}

/// A QP deadline in the world's timer heap: (when, host, QP index).
type QpTimer = Reverse<(Time, u8, usize)>;

pub struct World {
    pub now: Time,
    pub rng: ChaCha8Rng,
    heap: BinaryHeap<Event>,
    /// Every QP's deadline (stale entries skipped: `Host::armed` says which
    /// is current).
    qp_timers: BinaryHeap<QpTimer>,
    seq: u64,
    pub host_a: Host,
    pub host_b: Host,
    pub gw_a: Option<Site>,
    pub gw_b: Option<Site>,
    pub links: HashMap<(Node, Node), Link>,
    /// Each gateway's WAN paths (keyed by sending gateway and path index).
    pub wan_links: HashMap<(Node, usize), Link>,
    /// What the gateways reported, in order.
    pub site_events: Vec<(Node, Time, SiteEvent)>,
    /// Seeds the nonces of gateway B's next incarnation (a twin restart).
    pub twin_b_seed: u64,
    /// Seeds of gateways A's and B's session nonces.
    pub nonce_seeds: [u64; 2],
    /// When set: everything gateway A was given, in order, and the instants
    /// at which it ran (timers, then sending); and what it sent. The
    /// differential test replays it through the daemon's device turn.
    pub trace_a: Option<Vec<TraceItem>>,
    pub emitted_a: Emitted,
    /// RDMA-CM REQs host A sends before the workload (the scenario's
    /// `cm_handshake`).
    pub cm_requests: Vec<Vec<u8>>,
    scratch: Vec<u8>,
    pub events: u64,
    /// Print every delivery (SOYA_SIM_TRACE_PACKETS).
    trace: bool,
    /// Each gateway's standby (issue 38; 0: A, 1: B), while it lives.
    pub standby: [Option<Standby>; 2],
    /// A gateway died at the first instant; its standby takes over at the
    /// second (what reaches it in between is lost).
    dead: [Option<(Time, Time)>; 2],
    /// Packets and datagrams that reached a gateway while it was dead.
    pub lost_while_dead: u64,
    /// The standby's figures, once one took over.
    pub standby_stats: Option<StandbyStats>,
    /// With standbys: each WAN packet header a gateway received from its
    /// twin (the sender's key phase, path and packet number: the AES-GCM
    /// nonce) with a digest of the datagram, and how often one header came
    /// with other bytes (a nonce sealed over two plaintexts, which output
    /// commit forbids).
    pub sealed: Option<HashMap<(usize, [u8; HEADER_LEN]), u64>>,
    pub nonces_reused: u64,
    /// Bytes mirrored to each gateway's standbys that have since taken
    /// over.
    mirrored_bytes_before: [u64; 2],
}

/// 0 for gateway A, 1 for B; `None` for a host.
fn gateway_index(node: Node) -> Option<usize> {
    match node {
        Node::GwA => Some(0),
        Node::GwB => Some(1),
        _ => None,
    }
}

/// One line about a payload, for traces.
fn describe(p: &Payload) -> String {
    let pkt = |v: &[u8]| match RocePacket::parse(v) {
        Ok(p) => p.to_string(),
        Err(e) => format!("unparsable: {e}"),
    };
    match p {
        Payload::Ip(v) => pkt(v),
        Payload::Wan(path, d) => format!("WAN datagram path {path}, {} B", d.len()),
    }
}

impl World {
    pub fn new(rng: ChaCha8Rng) -> World {
        World {
            now: Time::ZERO,
            rng,
            heap: BinaryHeap::new(),
            qp_timers: BinaryHeap::new(),
            seq: 0,
            host_a: Host::default(),
            host_b: Host::default(),
            gw_a: None,
            gw_b: None,
            links: HashMap::new(),
            wan_links: HashMap::new(),
            site_events: Vec::new(),
            twin_b_seed: 0,
            nonce_seeds: [0; 2],
            trace_a: None,
            emitted_a: Emitted::default(),
            cm_requests: Vec::new(),
            scratch: vec![0; 64 * 1024],
            events: 0,
            trace: std::env::var_os("SOYA_SIM_TRACE_PACKETS").is_some(),
            standby: [None, None],
            dead: [None, None],
            lost_while_dead: 0,
            standby_stats: None,
            sealed: None,
            nonces_reused: 0,
            mirrored_bytes_before: [0; 2],
        }
    }

    pub fn accelerated(&self) -> bool {
        self.gw_a.is_some()
    }

    /// The gateways' engines (for the invariants and the figures).
    pub fn engines(&self) -> impl Iterator<Item = &QpEngine> {
        self.gw_a.iter().chain(self.gw_b.iter()).map(Site::engine)
    }

    fn site_mut(&mut self, node: Node) -> Option<&mut Site> {
        match node {
            Node::GwA => self.gw_a.as_mut(),
            Node::GwB => self.gw_b.as_mut(),
            _ => None,
        }
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

    /// A host sends an IP packet outside any QP (RDMA-CM).
    pub fn send_ip(&mut self, from: Node, packet: Vec<u8>) {
        self.send(from, false, Payload::Ip(packet));
    }

    fn send(&mut self, from: Node, twin: bool, payload: Payload) {
        self.send_at(from, twin, payload, self.now)
    }

    /// Sends no earlier than `at` (pacing: the transport's release time).
    fn send_at(&mut self, from: Node, twin: bool, payload: Payload, at: Time) {
        self.send_released(from, twin, payload, at, None)
    }

    /// [`Self::send_at`], for what gateway A releases at `released` under
    /// a standby's output commit.
    fn send_released(
        &mut self,
        from: Node,
        twin: bool,
        payload: Payload,
        at: Time,
        released: Option<(usize, Time)>,
    ) {
        let to = self.hop(from, twin);
        let link = match &payload {
            Payload::Wan(path, _) => self.wan_links.get_mut(&(from, *path)),
            _ => self.links.get_mut(&(from, to)),
        }
        .unwrap_or_else(|| panic!("no link {from:?} -> {to:?}"));
        let arrivals = link.transmit(at.max(self.now), payload.len(), &mut self.rng);
        let mut payload = Some(payload);
        let n = arrivals.len();
        for (i, at) in arrivals.into_iter().enumerate() {
            let p = if i + 1 == n {
                payload.take().expect("one payload per arrival")
            } else {
                match payload.as_ref().expect("kept for the last arrival") {
                    Payload::Ip(v) => Payload::Ip(v.clone()),
                    Payload::Wan(p, v) => Payload::Wan(*p, v.clone()),
                }
            };
            self.seq += 1;
            self.heap.push(Event {
                at,
                seq: self.seq,
                to,
                payload: p,
                released,
            });
        }
    }

    /// Lets every node send what it has at `now`.
    pub fn flush(&mut self) {
        for node in [Node::HostA, Node::HostB] {
            let dirty = self.host_mut(node).take_dirty();
            if self.host(node).port_scheduled {
                self.host_mut(node).ready.extend(dirty.iter().copied());
                self.flush_port(node);
            } else {
                let mut pending = Vec::new();
                let host = if node == Node::HostA {
                    &mut self.host_a
                } else {
                    &mut self.host_b
                };
                for &i in &dirty {
                    while let Some(n) = host.qps[i].poll_transmit(self.now, &mut self.scratch) {
                        pending.push(self.scratch[..n].to_vec());
                    }
                }
                for p in pending {
                    self.send(node, true, Payload::Ip(p));
                }
            }
            // Sending (or polling) arms the requesters' timers.
            self.rearm(node, &dirty);
        }
        for node in [Node::GwA, Node::GwB] {
            self.drain_gateway(node);
        }
    }

    /// Puts the deadlines of `qps` (of `node`) that changed into the timer
    /// heap, and drops stale entries from its top so that its first one is
    /// current.
    fn rearm(&mut self, node: Node, qps: &[usize]) {
        let h = u8::from(node == Node::HostB);
        let host = if node == Node::HostA {
            &mut self.host_a
        } else {
            &mut self.host_b
        };
        for &i in qps {
            // (Polled: the driver looks at it next, as at every QP before.)
            host.touch(i);
            let t = host.qps[i].poll_timeout();
            if t != host.armed[i] {
                host.armed[i] = t;
                if let Some(t) = t {
                    self.qp_timers.push(Reverse((t, h, i)));
                }
            }
        }
        self.drop_stale_timers();
    }

    fn drop_stale_timers(&mut self) {
        while let Some(&Reverse((t, h, i))) = self.qp_timers.peek() {
            let host = if h == 0 { &self.host_a } else { &self.host_b };
            if host.armed[i] == Some(t) {
                break;
            }
            self.qp_timers.pop();
        }
    }

    fn host(&self, node: Node) -> &Host {
        if node == Node::HostA {
            &self.host_a
        } else {
            &self.host_b
        }
    }

    fn host_mut(&mut self, node: Node) -> &mut Host {
        if node == Node::HostA {
            &mut self.host_a
        } else {
            &mut self.host_b
        }
    }

    /// A hardware host's port: while it is free, the next QP in turn that
    /// has a packet sends one; when it is busy, it wakes when it frees.
    /// (Only QPs that may have a packet are visited, in the order a scan
    /// of all of them from the next turn would find them.)
    fn flush_port(&mut self, node: Node) {
        let to = self.hop(node, true);
        let now = self.now;
        let mut polled = Vec::new();
        loop {
            let free_at = self.links.get(&(node, to)).map_or(now, |l| l.free_at());
            let host = if node == Node::HostA {
                &mut self.host_a
            } else {
                &mut self.host_b
            };
            if free_at > now {
                host.port_wake = Some(free_at);
                break;
            }
            host.port_wake = None;
            let mut sent = None;
            while let Some(i) = host
                .ready
                .range(host.next_turn..)
                .next()
                .or_else(|| host.ready.iter().next())
                .copied()
            {
                polled.push(i);
                if let Some(len) = host.qps[i].poll_transmit(now, &mut self.scratch) {
                    host.next_turn = (i + 1) % host.qps.len();
                    sent = Some(len);
                    break;
                }
                host.ready.remove(&i);
            }
            let Some(len) = sent else { break };
            let p = self.scratch[..len].to_vec();
            self.send(node, true, Payload::Ip(p));
        }
        polled.sort_unstable();
        polled.dedup();
        self.rearm(node, &polled);
    }

    /// Sends what a gateway's site has for its data center and for the
    /// WAN (each datagram no earlier than its release time), and records
    /// its events: the driver's half of the `Site` API, through the calls
    /// the daemon's turn (`soya::gateway::turn::Turn`) makes over sockets.
    pub fn drain_gateway(&mut self, node: Node) {
        let now = self.now;
        let Some(g) = gateway_index(node) else {
            return;
        };
        if self.dead[g].is_some() {
            return;
        }
        // Under a standby, what the gateway sends now leaves once the
        // standby has every input before it (`standby`: output commit).
        let commit = self.standby[g].as_mut().map(|sb| {
            sb.mirror(now, Mirrored::Drain(now));
            sb.commit_at(now)
        });
        let mut scratch = std::mem::take(&mut self.scratch);
        let Some(site) = self.site_mut(node) else {
            self.scratch = scratch;
            return;
        };
        // `Site::transmit_dc`, as `Turn::send_dc` sends: the site lends
        // each packet where it lies (a request held by an egress half is
        // not copied out by the site). The copy that puts it on a simulated
        // link is the simulator's, as the daemon's is its backend's (into a
        // UMEM frame, a tun write). The destination is not needed: each
        // gateway has one host behind it (`hop`).
        let mut dc: Vec<Vec<u8>> = Vec::new();
        site.transmit_dc(|packet, _dst| {
            dc.push(packet.to_vec());
            DcSent::Sent
        });
        // The daemon's call too, but not its schedule: the daemon's turn,
        // at a datagram not yet due, waits for it (due within `turn::SPIN`)
        // or holds it and polls no more until then, so the datagrams after
        // it are polled at a later time; the simulator takes all the
        // transport hands out now and puts each on its link at its release
        // time. (The differential test runs on fast paths, where every
        // datagram is due at once.)
        let mut wan = Vec::new();
        while let Some(t) = site.poll_wan_transmit(now, &mut scratch) {
            wan.push((t.path, scratch[..t.len].to_vec(), t.release_at));
        }
        let mut events = Vec::new();
        while let Some(ev) = site.poll_event() {
            events.push((node, now, ev));
        }
        self.scratch = scratch;
        self.site_events.extend(events);
        if node == Node::GwA && self.trace_a.is_some() {
            self.emitted_a.dc.extend(dc.iter().cloned());
            self.emitted_a
                .wan
                .extend(wan.iter().map(|(p, d, _)| (*p, d.clone())));
        }
        let at = commit.unwrap_or(now);
        for p in dc {
            self.send_released(node, false, Payload::Ip(p), at, commit.map(|c| (g, c)));
        }
        for (path, d, release) in wan {
            let at = release.max(at);
            self.send_released(
                node,
                true,
                Payload::Wan(path, d),
                at,
                commit.map(|_| (g, at)),
            );
        }
    }

    /// Packet bytes each gateway (A, B) mirrored to its standby over the
    /// run (`None`: no standbys).
    pub fn mirrored_bytes(&self) -> Option<[u64; 2]> {
        let any = self.standby.iter().any(Option::is_some) || self.standby_stats.is_some();
        any.then(|| {
            let live = |g: usize| {
                self.standby[g]
                    .as_ref()
                    .map_or(0, |sb| sb.stats.mirrored_bytes)
            };
            [0, 1].map(|g| self.mirrored_bytes_before[g] + live(g))
        })
    }

    /// Gateway `node` dies at `now` (and does not come back); its standby
    /// takes over `takeover` later. What it sent but had not released dies
    /// with it.
    pub fn kill_gateway(&mut self, node: Node, takeover: Duration) {
        let (now, g) = (self.now, gateway_index(node).expect("a gateway"));
        self.dead[g] = Some((now, now + takeover));
        self.heap
            .retain(|e| e.released.is_none_or(|(from, r)| from != g || r <= now));
    }

    /// Gateway `g`'s standby becomes the gateway: it replays what was
    /// mirrored to it, then sends what the dead one made and had not let
    /// out.
    fn promote_standby(&mut self, g: usize) {
        let Some((died, _)) = self.dead[g].take() else {
            return;
        };
        let Some(sb) = self.standby[g].take() else {
            return;
        };
        let (site, owed, stats) = sb.take_over(died);
        self.mirrored_bytes_before[g] += stats.mirrored_bytes;
        let node = if g == 0 { Node::GwA } else { Node::GwB };
        *(if g == 0 {
            &mut self.gw_a
        } else {
            &mut self.gw_b
        }) = Some(site);
        self.standby_stats = Some(stats);
        let now = self.now;
        for (release, out) in owed {
            let (twin, payload) = match out {
                Output::Dc(p) => (false, Payload::Ip(p)),
                Output::Wan(path, d) => (true, Payload::Wan(path, d)),
            };
            self.send_at(node, twin, payload, release.max(now));
        }
    }

    /// The gateways alive now (a dead one's standby has not taken over).
    fn live_gateways(&mut self) -> impl Iterator<Item = &mut Site> {
        let [a, b] = self.dead;
        let a = self.gw_a.iter_mut().filter(move |_| a.is_none());
        a.chain(self.gw_b.iter_mut().filter(move |_| b.is_none()))
    }

    /// Earliest pending event or timer.
    pub fn next_time(&self) -> Option<Time> {
        let mut t = self.heap.peek().map(|e| e.at);
        let mut consider = |x: Option<Time>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        // (Its top is current: `rearm` drops stale ones after each flush.)
        consider(self.qp_timers.peek().map(|r| r.0 .0));
        consider(self.host_a.port_wake);
        consider(self.host_b.port_wake);
        for (g, gw) in [&self.gw_a, &self.gw_b].into_iter().enumerate() {
            match self.dead[g] {
                Some((_, promote)) => consider(Some(promote)),
                None => consider(gw.as_ref().and_then(|gw| gw.poll_timeout())),
            }
        }
        t
    }

    /// Advances to `t` and processes everything due then. A gateway takes
    /// what reached it at one instant the way its device loop's turn reads
    /// it: WAN datagrams first, then the DC side (in arrival order within
    /// each), then its timers, then it sends.
    pub fn step_to(&mut self, t: Time) {
        self.now = self.now.max(t);
        for g in 0..2 {
            if self.dead[g].is_some_and(|(_, promote)| promote <= self.now) {
                self.promote_standby(g);
            }
            if let Some(sb) = self.standby[g].as_mut().filter(|_| self.dead[g].is_none()) {
                sb.catch_up(self.now);
            }
        }
        let mut due = Vec::new();
        while self.heap.peek().is_some_and(|e| e.at <= self.now) {
            due.push(self.heap.pop().expect("peeked"));
        }
        due.sort_by_key(|e| {
            matches!(e.to, Node::GwA | Node::GwB) && matches!(e.payload, Payload::Ip(_))
        });
        for e in due {
            self.events += 1;
            self.deliver(e.to, e.payload);
        }
        let now = self.now;
        if let Some(tr) = self.trace_a.as_mut() {
            tr.push(TraceItem::Turn(now));
        }
        // QP timers due (a packet just delivered may have moved one: the
        // QP's own deadline decides, as it did when every QP was asked).
        while let Some(&Reverse((at, h, i))) = self.qp_timers.peek() {
            if at > now {
                break;
            }
            self.qp_timers.pop();
            let host = if h == 0 {
                &mut self.host_a
            } else {
                &mut self.host_b
            };
            if host.armed[i] != Some(at) {
                continue;
            }
            host.armed[i] = None;
            if host.qps[i].poll_timeout().is_some_and(|d| d <= now) {
                host.qps[i].handle_timeout(now);
            }
            host.mark(i);
        }
        for g in 0..2 {
            if let Some(sb) = self.standby[g].as_mut().filter(|_| self.dead[g].is_none()) {
                sb.mirror(now, Mirrored::Timers(now));
            }
        }
        for gw in self.live_gateways() {
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
        if let (Node::GwA, Some(tr)) = (to, self.trace_a.as_mut()) {
            tr.push(TraceItem::Input(match &payload {
                Payload::Ip(v) => Payload::Ip(v.clone()),
                Payload::Wan(p, v) => Payload::Wan(*p, v.clone()),
            }));
        }
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
                if qpn == Some(1) {
                    // QP1: an RDMA-CM MAD (the scenario's connection setup).
                    let msg = RocePacket::parse(&v).and_then(|p| cm::parse_packet(&p));
                    let rep = match msg {
                        Ok(CmMessage::Req(req)) => host.cm_answers.remove(&req.local_comm_id),
                        Ok(CmMessage::Rep(_)) => {
                            host.cm_established += 1;
                            None
                        }
                        _ => {
                            host.misaddressed += 1;
                            None
                        }
                    };
                    if let Some(rep) = rep {
                        self.send(to, false, Payload::Ip(rep));
                    }
                    return;
                }
                match qpn.and_then(|q| host.by_qpn.get(&q)).copied() {
                    Some(i) => {
                        host.qps[i].handle_packet(now, &v);
                        host.mark(i);
                    }
                    None => host.misaddressed += 1,
                }
            }
            (Node::GwA | Node::GwB, _)
                if gateway_index(to).is_some_and(|g| self.dead[g].is_some()) =>
            {
                self.lost_while_dead += 1
            }
            (Node::GwA | Node::GwB, payload) => {
                let g = gateway_index(to).expect("a gateway");
                if let Payload::Wan(_, d) = &payload {
                    self.note_sealed(g, d);
                }
                if let Some(sb) = self.standby[g].as_mut() {
                    sb.mirror(
                        now,
                        match &payload {
                            Payload::Ip(v) => Mirrored::Dc(now, v.clone()),
                            Payload::Wan(p, v) => Mirrored::Wan(now, *p, v.clone()),
                        },
                    );
                }
                let site = self.site_mut(to).expect("gateway exists when addressed");
                match payload {
                    Payload::Ip(v) => {
                        // As the daemon's default backend (tun) reads a DC
                        // packet (`Turn::recv_dc`): into a buffer the site
                        // lent (`Site::rx_buffer`), handed over with
                        // `handle_dc_owned`, so that a request is held in
                        // that buffer, uncopied. Copying it in is the
                        // simulator's part, as the kernel's read is tun's.
                        let mut buf = site.rx_buffer();
                        buf.extend_from_slice(&v);
                        site.handle_dc_owned(now, buf);
                    }
                    Payload::Wan(path, mut d) => site.handle_wan(now, path, &mut d),
                }
            }
            (node, p) => panic!("gateway traffic {p:?} delivered to host {node:?}"),
        }
    }

    /// Gateway `g` received `d` from its twin: a second datagram under one
    /// nonce with other bytes is counted (`nonces_reused`).
    fn note_sealed(&mut self, g: usize, d: &[u8]) {
        use std::hash::{Hash, Hasher};
        let (Some(seen), Some(head)) = (self.sealed.as_mut(), d.get(..HEADER_LEN)) else {
            return;
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        d.hash(&mut h);
        let digest = h.finish();
        let head: [u8; HEADER_LEN] = head.try_into().expect("HEADER_LEN bytes");
        if *seen.entry((g, head)).or_insert(digest) != digest {
            self.nonces_reused += 1;
        }
    }

    /// Events still queued.
    pub fn pending_events(&self) -> usize {
        self.heap.len()
    }
}

/// An RDMA-CM MAD as a host sends it: a UD SEND Only to QP1.
pub(crate) fn qp1_packet(from: std::net::Ipv4Addr, to: std::net::Ipv4Addr, mad: &[u8]) -> Vec<u8> {
    let op = Opcode::UD_SEND_ONLY;
    RoceRepr {
        ip: IpHeader::v4(from, to),
        src_port: 0xc000,
        bth: Bth::new(op, 1, Psn::new(0)),
        ext: ExtHeaders {
            present: op.info().expect("a known opcode").headers,
            deth: Deth {
                qkey: cm::GSI_QKEY,
                src_qp: 1,
            },
            ..Default::default()
        },
    }
    .to_vec(mad)
    .expect("a MAD fits a packet")
}
