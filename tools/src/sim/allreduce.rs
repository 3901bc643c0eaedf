//! `soya-sim allreduce`: a ring AllReduce between two sites.
//!
//! N = 2 × `gpus_per_site` GPUs in one ring, each site's GPUs contiguous,
//! so exactly two ring edges cross the WAN, one each way:
//!
//! ```text
//! a0 → a1 → … → a(G−1) ══WAN══▶ b0 → b1 → … → b(G−1) ══WAN══▶ a0
//! ```
//!
//! A ring AllReduce is a reduce-scatter and an all-gather, 2(N − 1) steps;
//! in each step every GPU sends one segment (gradient / N bytes) to its
//! successor: in step s ≥ 1 the segment it received in step s − 1 (reduced
//! with its own, or, in the all-gather, as is). NCCL pipelines this at the
//! granularity of its buffer steps (chunks): chunk c of step s may leave as
//! soon as chunk c of step s − 1 arrived. NCCL also splits the data over
//! `channels` rings that run side by side; so does this model.
//!
//! The two WAN edges of every channel are carried by the real machinery:
//! [`super::nccl::Conn`] (NCCL-style WRITE_WITH_IMM over several RC QPs,
//! receiver-driven clear-to-send) between the simulator's two hosts, either
//! directly over the WAN or through the two gateways' real [`soya_proto::site::Site`]
//! (QP engine, pseudo-ACKs, WAN transport), as `soya-sim run` does.
//!
//! With `collectives` > 1, that many AllReduces run back to back on the
//! same connections: a GPU starts the next one when its kernel for the
//! previous one ended, and each connection runs them as NCCL's proxy does,
//! one operation at a time (see [`super::nccl`]).
//!
//! The intra-site hops are idealised: each is a FIFO link of
//! `intra_gbps / channels` per channel with a fixed one-way latency; a chunk
//! arrives `len × 8 / rate + latency` after it leaves, and leaves when both
//! its input arrived and the link is free. No loss, no flow control.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use serde::Serialize;
use soya_proto::time::Time;

use super::nccl::{Conn, NcclParams, NCCL_STEPS};
use super::scenario::{self, Scenario};
use super::world::{Node, World};
use crate::rc::hw::EndpointModel;

/// One AllReduce to simulate (the inputs common to its three cases).
#[derive(Clone, Debug)]
pub struct AllreduceConfig {
    pub gpus_per_site: u32,
    /// Gradient bytes per GPU (the AllReduce's size).
    pub gradient_bytes: u64,
    pub distance_km: f64,
    /// Rate of each WAN path.
    pub link_gbps: f64,
    pub paths: u32,
    pub loss: f64,
    pub endpoint: EndpointModel,
    /// NCCL channels (rings side by side, each with its own connections).
    pub channels: u32,
    pub nccl: NcclParams,
    /// Intra-site hop rate (shared by the channels) and one-way latency.
    pub intra_gbps: f64,
    pub intra_latency: Duration,
    /// Host NIC / DC link rate (through the gateways).
    pub dc_gbps: f64,
    pub mtu: usize,
    pub seed: u64,
    /// AllReduces run back to back on the same connections (a training
    /// job's steps, or its gradient buckets); 1: one, as before.
    pub collectives: u32,
    /// What-if, not NCCL: receivers grant the next collective's buffers
    /// while the previous one still runs ([`super::nccl::Conn::grants_across_ops`]).
    pub grants_across_collectives: bool,
}

impl AllreduceConfig {
    pub fn gpus(&self) -> u32 {
        2 * self.gpus_per_site
    }

    pub fn steps(&self) -> u32 {
        2 * (self.gpus() - 1)
    }

    /// Bytes of one channel's part of a GPU's segment: gradient / N split
    /// over the channels, rounded up to 4 KiB (so every packet of every
    /// part is checked whole against the data pattern).
    pub fn channel_segment(&self) -> u64 {
        let seg = self.gradient_bytes.div_ceil(u64::from(self.gpus()));
        seg.div_ceil(u64::from(self.channels))
            .next_multiple_of(4096)
    }

    /// Chunk lengths of one step of one channel.
    fn step_chunks(&self) -> Vec<u32> {
        let step = u64::from(self.nccl.step_bytes());
        let seg = self.channel_segment();
        let mut v = Vec::new();
        let mut off = 0;
        while off < seg {
            let len = step.min(seg - off);
            v.push(len as u32);
            off += len;
        }
        v
    }

    /// Bytes each WAN direction carries per AllReduce: 2(N − 1) segments.
    pub fn wan_bytes_per_direction(&self) -> u64 {
        u64::from(self.steps()) * self.channel_segment() * u64::from(self.channels)
    }

    /// The fastest the WAN can carry that: the payload alone at the line
    /// rate of all paths, in ms. No AllReduce can beat it, whatever the
    /// headers cost (`soya plan` counts 82 wire bytes per packet; the
    /// simulator's links carry IP packets).
    pub fn wire_bound_ms(&self) -> f64 {
        let line = self.link_gbps * 1e9 * f64::from(self.paths);
        self.wan_bytes_per_direction() as f64 * 8.0 / line * 1e3
    }
}

/// One of the three cases.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub distance_km: f64,
    pub accelerated: bool,
    pub loss: f64,
}

/// One WAN edge of one channel, per collective of the measured run, from
/// the run's start (virtual time): when the sending GPU started the
/// collective, when the receiver granted the buffer of its first chunk,
/// the sender saw that grant and posted that chunk, and when its last chunk arrived.
#[derive(Clone, Debug, Default)]
pub struct WanEdgeTrace {
    pub channel: usize,
    /// 0: A→B, 1: B→A.
    pub direction: usize,
    pub gpu_start: Vec<Duration>,
    pub first_grant: Vec<Duration>,
    pub first_grant_seen: Vec<Duration>,
    pub first_post: Vec<Duration>,
    pub last_arrival: Vec<Duration>,
}

/// What the measured AllReduces took and whether their data arrived.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RingOutcome {
    /// Every collective's every chunk arrived within the time limit. When
    /// not, the times below are NaN (null in JSON): a time cut off at the
    /// limit, or at the last chunk that did arrive, would flatter the run.
    pub finished: bool,
    /// One AllReduce: from the first chunk's start to the last chunk's
    /// arrival on every edge of every channel. Several back to back: the
    /// steady state, the mean of `collective_ms` after the first.
    pub comm_ms: f64,
    /// The first collective alone (= `comm_ms` for one).
    pub first_comm_ms: f64,
    /// Each collective's time: the first from the start, each later one
    /// from the previous one's end to its own.
    pub collective_ms: Vec<f64>,
    pub collectives: u32,
    pub steps: u32,
    /// Chunks each edge of each channel moved (all equal when complete).
    pub chunks_per_edge: u64,
    /// Bytes each WAN direction carried, and of them verified at the
    /// receiving QPs against the data pattern, placed, and found wrong.
    pub wan_bytes_per_direction: u64,
    pub wan_bytes_verified: u64,
    pub wan_bytes_placed: u64,
    pub data_errors: u64,
    pub failures: u64,
    pub requester_retransmissions: u64,
    pub requester_timeouts: u64,
    pub pseudo_acks: u64,
    pub pseudo_acks_withheld: u64,
    /// Packet deliveries simulated (every hop), wall time, and their rate.
    pub events: u64,
    pub wall_s: f64,
    pub events_per_wall_s: f64,
    pub violations: Vec<String>,
    #[serde(skip)]
    pub wan_trace: Vec<WanEdgeTrace>,
}

/// A chunk reaching the end of an intra-site hop.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Arrival {
    at: Time,
    ch: usize,
    /// The collective, the edge, the chunk.
    j: usize,
    edge: usize,
    k: usize,
}

/// Per channel: the WAN edges' connections (A→B, then B→A), and how far
/// each edge got in each collective of the run under way.
struct Ring {
    wan: [Conn; 2],
    /// Chunks of the connections before this run's.
    base: [usize; 2],
    /// Per GPU (the sender of the edge of the same index): collectives it
    /// started, and when it started each.
    started: Vec<usize>,
    started_at: Vec<Vec<Time>>,
    /// Per collective, per edge: chunks received in order; on intra edges,
    /// chunks sent; when the last chunk arrived.
    arrived: Vec<Vec<usize>>,
    sent: Vec<Vec<usize>>,
    last: Vec<Vec<Time>>,
    /// Per intra edge: when the hop is free again.
    free_at: Vec<Time>,
}

/// The idealised intra-site hop: per-channel rate and one-way latency.
#[derive(Clone, Copy)]
struct Intra {
    bps: f64,
    latency: Duration,
}

/// The ring's shape: edges 0..G−1 inside A, G−1 crosses A→B, G..2G−1
/// inside B, 2G−1 crosses B→A.
struct Shape {
    n: usize,
    wan: [usize; 2],
}

/// When a run of collectives started, when each ended (its last chunk's
/// arrival on every edge of every channel), and why it did not finish.
struct RunTimes {
    start: Time,
    ends: Vec<Time>,
    failure: Option<String>,
}

impl Ring {
    /// Chunks edge `e` may send in collective `j`: none before GPU `e`
    /// started it; then a step's worth (its own segment), and one more
    /// for each chunk that arrived on the edge before it.
    fn avail(&self, j: usize, e: usize, cps: usize, total: usize) -> usize {
        if self.started[e] <= j {
            return 0;
        }
        let n = self.arrived[j].len();
        (cps + self.arrived[j][(e + n - 1) % n]).min(total)
    }

    /// Whether GPU `e`'s kernel for collective `j` ended, so that it may
    /// start `j + 1` (one stream: collectives run in order on a GPU): it
    /// received all of `j` and handed all of `j` to its outgoing edge
    /// (on a WAN edge, every chunk had a send buffer, NCCL's head).
    fn kernel_done(&self, shape: &Shape, j: usize, e: usize, total: usize) -> bool {
        let n = shape.n;
        if self.arrived[j][(e + n - 1) % n] < total {
            return false;
        }
        match shape.wan.iter().position(|&x| x == e) {
            Some(i) => self.wan[i].sent() + NCCL_STEPS as usize >= self.base[i] + (j + 1) * total,
            None => self.sent[j][e] == total,
        }
    }
}

/// Runs `k` AllReduces back to back, each of `lens` chunks per edge (`cps`
/// per step), on the rings' connections, from `w.now`: each collective is
/// one NCCL proxy operation per connection, and each GPU starts
/// collective j + 1 as soon as its kernel for j ended, as a training step's
/// AllReduces queued on one stream do.
#[allow(clippy::too_many_arguments)]
fn ring(
    w: &mut World,
    rings: &mut [Ring],
    shape: &Shape,
    lens: &[u32],
    cps: usize,
    k: usize,
    intra: Intra,
    deadline: Time,
) -> RunTimes {
    let (n, total) = (shape.n, lens.len());
    let start = w.now;
    for r in rings.iter_mut() {
        for (i, c) in r.wan.iter_mut().enumerate() {
            r.base[i] = c.total();
            for _ in 0..k {
                c.extend(lens);
            }
        }
        r.started = vec![1; n];
        r.started_at = vec![vec![start; n]];
        r.arrived = vec![vec![0; n]; k];
        r.sent = vec![vec![0; n]; k];
        r.last = vec![vec![start; n]; k];
        r.free_at = vec![start; n];
    }
    let mut heap: BinaryHeap<Reverse<Arrival>> = BinaryHeap::new();
    let mut failure = None;
    loop {
        let mut moved = true;
        while moved {
            moved = false;
            for (ch, r) in rings.iter_mut().enumerate() {
                for e in 0..n {
                    let s = r.started[e];
                    if s < k && r.kernel_done(shape, s - 1, e, total) {
                        r.started[e] += 1;
                        if r.started_at.len() <= s {
                            r.started_at.push(vec![start; n]);
                        }
                        r.started_at[s][e] = w.now;
                        moved = true;
                    }
                }
                for (i, e) in shape.wan.into_iter().enumerate() {
                    let j = r.started[e] - 1;
                    let a = r.base[i] + j * total + r.avail(j, e, cps, total);
                    r.wan[i].make_available(a);
                    if r.wan[i].pump(w) {
                        moved = true;
                        let got = r.wan[i].received() - r.base[i];
                        for j in 0..k {
                            let now = got.saturating_sub(j * total).min(total);
                            if now > r.arrived[j][e] {
                                r.arrived[j][e] = now;
                                r.last[j][e] =
                                    r.wan[i].received_at[r.base[i] + j * total + now - 1];
                            }
                        }
                    }
                }
                for e in (0..n).filter(|e| !shape.wan.contains(e)) {
                    for j in 0..r.started[e] {
                        while r.sent[j][e] < r.avail(j, e, cps, total) {
                            let c = r.sent[j][e];
                            let leave = r.free_at[e].max(w.now);
                            let ser = Duration::from_nanos(
                                (f64::from(lens[c]) * 8.0 / intra.bps * 1e9).ceil() as u64,
                            );
                            r.free_at[e] = leave + ser;
                            heap.push(Reverse(Arrival {
                                at: r.free_at[e] + intra.latency,
                                ch,
                                j,
                                edge: e,
                                k: c,
                            }));
                            r.sent[j][e] += 1;
                        }
                    }
                }
            }
            while heap.peek().is_some_and(|a| a.0.at <= w.now) {
                let Reverse(a) = heap.pop().expect("peeked");
                let r = &mut rings[a.ch];
                debug_assert_eq!(r.arrived[a.j][a.edge], a.k, "an intra hop is FIFO");
                r.arrived[a.j][a.edge] = a.k + 1;
                r.last[a.j][a.edge] = a.at;
                moved = true;
            }
        }
        w.flush();
        if rings
            .iter()
            .all(|r| r.arrived.iter().flatten().all(|&a| a == total))
        {
            break;
        }
        let next = match (w.next_time(), heap.peek().map(|a| a.0.at)) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        match next {
            None => {
                failure = Some("nothing left to happen".to_string());
                break;
            }
            Some(t) if t > deadline => {
                failure = Some(format!(
                    "did not finish within {:?} of virtual time",
                    deadline - start
                ));
                break;
            }
            Some(t) => w.step_to(t),
        }
    }
    let ends = (0..k)
        .map(|j| {
            rings
                .iter()
                .flat_map(|r| r.last[j].iter().copied())
                .max()
                .unwrap_or(start)
                .max(start)
        })
        .collect();
    RunTimes {
        start,
        ends,
        failure,
    }
}

/// Runs one case of an AllReduce: a small AllReduce first, on the same
/// connections (a training job's connections carry thousands: the
/// gateways have learnt the QPs, as they would have long before), then
/// the measured one.
pub fn run_case(c: &AllreduceConfig, case: Case) -> Result<RingOutcome, String> {
    let wall = std::time::Instant::now();
    if c.gpus_per_site == 0 || c.channels == 0 || c.gradient_bytes == 0 || c.collectives == 0 {
        return Err(
            "need at least one GPU per site, one channel, one byte and one collective".into(),
        );
    }
    let k = c.collectives as usize;
    let n = c.gpus() as usize;
    let g = c.gpus_per_site as usize;
    let shape = Shape {
        n,
        wan: [g - 1, n - 1],
    };
    let step_lens = c.step_chunks();
    let cps = step_lens.len();
    let lens: Vec<u32> = (0..c.steps()).flat_map(|_| step_lens.clone()).collect();
    let total = lens.len();

    let s = scenario_for(c, case);
    let mut w = scenario::build(&s)?;
    let mut rings = Vec::new();
    for ch in 0..c.channels as usize {
        let seed = (c.seed as u32).wrapping_mul(31).wrapping_add(ch as u32 * 2);
        let mut conn = |from, to, seed| Conn::new(&mut w, &s, from, to, c.nccl, Vec::new(), seed);
        let mut ab = conn(Node::HostA, Node::HostB, seed)?;
        let mut ba = conn(Node::HostB, Node::HostA, seed + 1)?;
        ab.grants_across_ops = c.grants_across_collectives;
        ba.grants_across_ops = c.grants_across_collectives;
        rings.push(Ring {
            wan: [ab, ba],
            base: [0; 2],
            started: Vec::new(),
            started_at: Vec::new(),
            arrived: Vec::new(),
            sent: Vec::new(),
            last: Vec::new(),
            free_at: Vec::new(),
        });
    }
    let begin = scenario::warm_up(&s, &mut w);
    let intra = Intra {
        bps: c.intra_gbps * 1e9 / f64::from(c.channels),
        latency: c.intra_latency,
    };
    let mut out = RingOutcome {
        steps: c.steps(),
        collectives: c.collectives,
        wan_bytes_per_direction: c.wan_bytes_per_direction() * k as u64,
        ..RingOutcome::default()
    };
    // The warm-up: one 4 KiB chunk per step on every edge.
    let warm = vec![4096; c.steps() as usize];
    let limit = time_limit(c, case);
    let warm_run = ring(
        &mut w,
        &mut rings,
        &shape,
        &warm,
        1,
        1,
        intra,
        begin + limit,
    );
    if let Some(f) = warm_run.failure {
        out.violations.push(format!("warm-up: {f}"));
    }
    // ...and until every requester heard back for all of it, so that
    // none of the warm-up's start-up retransmissions (a flow's first round
    // trip is tunnelled, and a hardware timer of 2 ms fires in it) falls
    // into the measured AllReduce.
    loop {
        for r in rings.iter_mut() {
            for c in r.wan.iter_mut() {
                c.pump(&mut w);
            }
        }
        w.flush();
        if rings.iter().all(|r| r.wan.iter().all(Conn::idle)) {
            break;
        }
        match w.next_time() {
            Some(t) if t <= begin + limit => w.step_to(t),
            _ => {
                out.violations
                    .push("warm-up: requesters never heard back".into());
                break;
            }
        }
    }
    let before = data(&w, &rings);
    let retrans_before = retransmissions(&w, &rings);
    let run = ring(
        &mut w,
        &mut rings,
        &shape,
        &lens,
        cps,
        k,
        intra,
        begin + limit * c.collectives,
    );
    out.finished = run.failure.is_none();
    out.violations.extend(run.failure);
    let start = run.start;
    out.collective_ms = std::iter::once(start)
        .chain(run.ends.iter().copied())
        .zip(&run.ends)
        .map(|(a, &b)| (b.max(a) - a).as_secs_f64() * 1e3)
        .collect();
    if !out.finished {
        out.collective_ms.iter_mut().for_each(|m| *m = f64::NAN);
    }
    out.first_comm_ms = out.collective_ms[0];
    out.comm_ms = if k > 1 {
        out.collective_ms[1..].iter().sum::<f64>() / (k - 1) as f64
    } else {
        out.first_comm_ms
    };
    out.chunks_per_edge = rings
        .iter()
        .flat_map(|r| r.arrived.iter().flatten())
        .copied()
        .min()
        .unwrap_or(0) as u64;
    out.wan_trace = trace(&rings, &shape, total, start);
    let after = data(&w, &rings);
    // The CTS writes land on the senders: count only the data direction
    // (the receivers' QPs), the smaller of the two directions.
    out.wan_bytes_verified = (0..2).map(|i| after.0[i] - before.0[i]).min().unwrap_or(0);
    out.wan_bytes_placed = (0..2).map(|i| after.1[i] - before.1[i]).min().unwrap_or(0);
    out.data_errors = after.2;
    out.failures = rings
        .iter()
        .flat_map(|r| r.wan.iter())
        .map(|c| c.failures + c.bad_completions)
        .sum();
    let (re, to) = retransmissions(&w, &rings);
    out.requester_retransmissions = re - retrans_before.0;
    out.requester_timeouts = to - retrans_before.1;
    // (The engines' totals: a half forgotten once quiet, `qp::expiry`,
    // keeps its counts there.)
    for gw in w.engines() {
        let t = gw.ingress_totals();
        out.pseudo_acks += t.pseudo_acks;
        out.pseudo_acks_withheld += t.withheld_acks;
    }
    check(c, total, k, &mut out);
    out.events = w.events;
    out.wall_s = wall.elapsed().as_secs_f64();
    out.events_per_wall_s = out.events as f64 / out.wall_s.max(1e-9);
    Ok(out)
}

/// Requester retransmissions and timer expiries of the WAN connections.
fn retransmissions(w: &World, rings: &[Ring]) -> (u64, u64) {
    rings
        .iter()
        .flat_map(|r| r.wan.iter())
        .map(|c| c.retransmissions(w))
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
}

/// Per WAN direction: bytes verified and placed at the receivers; and
/// data errors anywhere.
fn data(w: &World, rings: &[Ring]) -> ([u64; 2], [u64; 2], u64) {
    let (mut v, mut p, mut e) = ([0; 2], [0; 2], 0);
    for r in rings {
        for (i, conn) in r.wan.iter().enumerate() {
            let (cv, cp, ce) = conn.data(w);
            v[i] += cv;
            p[i] += cp;
            e += ce;
        }
    }
    (v, p, e)
}

/// The WAN edges' events of a finished run (see [`WanEdgeTrace`]).
fn trace(rings: &[Ring], shape: &Shape, total: usize, start: Time) -> Vec<WanEdgeTrace> {
    let mut v = Vec::new();
    for (ch, r) in rings.iter().enumerate() {
        for (i, &e) in shape.wan.iter().enumerate() {
            let conn = &r.wan[i];
            let at = |ts: &Vec<Time>, j: usize| {
                ts.get(r.base[i] + j * total)
                    .map_or(Duration::MAX, |&t| t.max(start) - start)
            };
            let k = r.arrived.len();
            v.push(WanEdgeTrace {
                channel: ch,
                direction: i,
                gpu_start: r.started_at.iter().map(|s| s[e] - start).collect(),
                first_grant: (0..k).map(|j| at(&conn.granted_at, j)).collect(),
                first_grant_seen: (0..k).map(|j| at(&conn.grant_seen_at, j)).collect(),
                first_post: (0..k).map(|j| at(&conn.posted_at, j)).collect(),
                last_arrival: (0..k).map(|j| r.last[j][e].max(start) - start).collect(),
            });
        }
    }
    v
}

/// The invariants of a finished run of AllReduces.
fn check(c: &AllreduceConfig, total: usize, k: usize, out: &mut RingOutcome) {
    let v = &mut out.violations;
    if out.chunks_per_edge != total as u64 {
        v.push(format!(
            "an edge moved {} chunks of {total} ({} steps) in one of its {k} collectives",
            out.chunks_per_edge, out.steps
        ));
    }
    let want = c.wan_bytes_per_direction() * k as u64;
    if out.wan_bytes_verified != want || out.wan_bytes_placed != want {
        v.push(format!(
            "a WAN direction placed {} bytes and verified {} of {want}",
            out.wan_bytes_placed, out.wan_bytes_verified
        ));
    }
    if out.data_errors > 0 {
        v.push(format!("{} data errors", out.data_errors));
    }
    if out.failures > 0 {
        v.push(format!("{} failed or unexpected completions", out.failures));
    }
}

/// The scenario of one case: the world `soya-sim run` builds, with no QPs
/// of its own (the connections add theirs).
fn scenario_for(c: &AllreduceConfig, case: Case) -> Scenario {
    Scenario {
        seed: c.seed,
        distance_km: case.distance_km,
        accelerated: case.accelerated,
        qps: 0,
        iters: 0,
        mtu: c.mtu,
        wan_gbps: c.link_gbps,
        dc_gbps: c.dc_gbps,
        wan_loss: case.loss,
        paths: c.paths,
        endpoint: c.endpoint,
        // NCCL exchanges QPNs over a socket: no RDMA-CM.
        rdma_cm: false,
        ..Scenario::default()
    }
}

/// Generous virtual-time limit: the slowest plausible case is bound by
/// NCCL's buffers per end-to-end round trip, or rxe's 128-packet window.
fn time_limit(c: &AllreduceConfig, case: Case) -> Duration {
    let rtt = (2.0 * case.distance_km * 4.9e-6).max(1e-4);
    let conns = f64::from(c.channels);
    let window = f64::from(c.nccl.buffsize) * conns;
    let window = match c.endpoint {
        EndpointModel::Rxe => {
            window.min(128.0 * c.mtu as f64 * f64::from(c.nccl.qps_per_conn) * conns)
        }
        EndpointModel::Hw => window,
    };
    let rate = (window * 8.0 / rtt).min(c.link_gbps * 1e9);
    let s = c.wan_bytes_per_direction() as f64 * 8.0 / rate;
    Duration::from_secs_f64(20.0 * s / (1.0 - case.loss).powi(64).max(0.01) + 10.0)
}

/// The window (in MTU packets) each QP of a connection can have out, as
/// `soya plan`'s `--tx-depth` takes it: NCCL's buffers' worth of its part.
pub fn window_packets(c: &AllreduceConfig) -> u32 {
    let nccl = u64::from(NCCL_STEPS) * u64::from(c.nccl.slice_bytes());
    let pkts = nccl.div_ceil(c.mtu as u64) as u32;
    match c.endpoint {
        EndpointModel::Rxe => pkts.min(128),
        EndpointModel::Hw => pkts,
    }
}
