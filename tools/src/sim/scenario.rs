//! A scenario: topology, impairments and workload; running it gives an
//! [`Outcome`] with figures and every invariant violation found.

use std::net::Ipv4Addr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use soya::qp::EngineConfig;
use soya::roce::cm;
use soya::roce::Psn;
use soya::site::{Acl, NonceSource, Site, SiteParams};
use soya::time::Time;
use soya::wan::PathState;
use soya_config::AckPolicy;

use super::link::{GilbertElliott, Link, LinkProfile};
use super::world::{qp1_packet, Node, World};
use crate::perf::workload::{Layout, Op as WrOp};
use crate::rc::hw::{hw_config, EndpointModel};
use crate::rc::{CompletionStatus, QpAddr, QpConfig, RcQp, WorkRequest};

pub const HOST_A: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
pub const HOST_B: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Write,
    Read,
    Send,
    Atomic,
    /// A random mix of all four.
    Mixed,
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Op, String> {
        Ok(match s {
            "write" => Op::Write,
            "read" => Op::Read,
            "send" => Op::Send,
            "atomic" => Op::Atomic,
            "mixed" => Op::Mixed,
            _ => {
                return Err(format!(
                    "unknown op {s:?}: write, read, send, atomic or mixed"
                ))
            }
        })
    }
}

/// Everything that defines one run. Same scenario, same seed: same result.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub distance_km: f64,
    /// Through Sōya gateways, or host to host.
    pub accelerated: bool,
    pub policy: AckPolicy,
    pub op: Op,
    pub size: u32,
    /// Outstanding work requests per QP (perftest's --tx-depth).
    pub tx_depth: u32,
    pub qps: u32,
    /// Messages per QP.
    pub iters: u32,
    pub mtu: usize,
    /// Capacity of the WAN and of each DC link.
    pub wan_gbps: f64,
    pub dc_gbps: f64,
    /// DC-side one-way delay (host to gateway).
    pub dc_delay: Duration,
    pub wan_loss: f64,
    pub wan_burst: Option<GilbertElliott>,
    pub wan_reorder: f64,
    pub wan_duplicate: f64,
    pub wan_jitter: Duration,
    /// Random loss on the requester's DC link, both directions.
    pub dc_loss: f64,
    /// Host B answers the same workload toward A at the same time.
    pub bidirectional: bool,
    /// Receive WQEs posted at B per QP for SENDs (fewer than messages → RNR).
    pub recv_credits: Option<u32>,
    /// Then one more receive per QP this often (an RNR storm that clears);
    /// `None` with `recv_credits` set: the missing receives never come.
    pub recv_refill: Option<Duration>,
    /// Host B's memory region is smaller than the target VA range: WRITEs
    /// beyond it fail with a remote access error (a responder error).
    pub responder_error: bool,
    /// Give up after this much virtual time.
    pub time_limit: Duration,
    /// `wan.twin_timeout` of both gateways.
    pub twin_timeout: Duration,
    /// Gateway B crashes at this time (from the start of the workload) and
    /// a new incarnation starts at once: whatever it held is gone, and
    /// gateway A must fail the flows mid-stream toward their requesters.
    pub twin_restart: Option<Duration>,
    /// With `twin_restart`: gateway A crashes and restarts instead, the
    /// *near* gateway of host A's requesters (it pseudo-ACKed them; its
    /// new incarnation knows nothing of them, and gateway B must tell it:
    /// `TwinMsg::Orphaned`).
    pub restart_near: bool,
    /// QP 0's responder at B posts no receive (an RNR stall that never
    /// clears) while the other QPs between the same two hosts run: they
    /// must not wait behind it (head of line).
    pub stall_qp0: bool,
    /// WAN paths (each of `wan_gbps`, each with the WAN impairments).
    pub paths: u32,
    /// Cut path 0 at this time (from the start of the workload), for this long.
    pub cut_path: Option<(Duration, Duration)>,
    /// The gateways' WAN session is up before the first request, as with
    /// deployed appliances: the handshake is not part of the measured
    /// transfer. `false`: gateways and workload start together.
    pub warm_start: bool,
    /// The endpoints: rxe-like, or hardware (ConnectX-class).
    pub endpoint: EndpointModel,
    /// Hardware endpoints: connected by RDMA-CM (min_rnr_timer 0, i.e.
    /// 655 ms RNR waits) rather than QPNs exchanged out of band (NCCL).
    pub rdma_cm: bool,
    /// Hardware endpoints: the adaptive 2/4/8/16 ms retransmission timer
    /// (field-observed); off, the configured timeout only (as with
    /// adaptive retransmission disabled in the firmware).
    pub adaptive_timer: bool,
    /// Through the gateways: each QP is connected by an RDMA-CM REQ/REP
    /// exchange through them before the workload starts (with a warm
    /// start), so they learn it as a deployed gateway learns an RDMA-CM
    /// connection, and pseudo-ACK its first packet. Off: they learn it
    /// from its first response (QPNs exchanged out of band, or a gateway
    /// started after the connection), and its first round trip is
    /// tunnelled.
    pub cm_handshake: bool,
    /// The gateways' deep buffer in slots (`None`: the engine's default,
    /// 131,072 slots of 4,608 B). To run a point at the size a daemon
    /// would pick (`buffer.size = "auto"`: `soya plan` prints it).
    pub buffer_slots: Option<usize>,
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            seed: 1,
            distance_km: 300.0,
            accelerated: true,
            policy: AckPolicy::Edge,
            op: Op::Write,
            size: 65_536,
            tx_depth: 128,
            qps: 1,
            iters: 200,
            mtu: 4096,
            wan_gbps: 10.0,
            dc_gbps: 100.0,
            dc_delay: Duration::from_micros(2),
            wan_loss: 0.0,
            wan_burst: None,
            wan_reorder: 0.0,
            wan_duplicate: 0.0,
            wan_jitter: Duration::ZERO,
            dc_loss: 0.0,
            bidirectional: false,
            recv_credits: None,
            recv_refill: None,
            responder_error: false,
            time_limit: Duration::from_secs(20),
            twin_timeout: soya_config::DEFAULT_TWIN_TIMEOUT,
            twin_restart: None,
            restart_near: false,
            stall_qp0: false,
            paths: 1,
            cut_path: None,
            warm_start: true,
            endpoint: EndpointModel::Rxe,
            rdma_cm: true,
            adaptive_timer: true,
            cm_handshake: false,
            buffer_slots: None,
        }
    }
}

/// What a run measured and what it found wrong.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    pub goodput_gbps: f64,
    pub elapsed_s: f64,
    pub messages_ok: u64,
    pub messages_failed: u64,
    pub bytes_completed: u64,
    /// Bytes verified against the pattern at their destination.
    pub bytes_verified: u64,
    /// Bytes acknowledged to an application but never placed.
    pub bytes_lost: u64,
    pub bytes_duplicated: u64,
    pub bytes_misordered: u64,
    pub data_errors: u64,
    pub requester_retransmissions: u64,
    pub requester_timeouts: u64,
    /// Timer expiries after the connection's first ACK: with pseudo-ACKs,
    /// any of these is the gateway's doing (withheld ACKs).
    pub requester_timeouts_after_ack: u64,
    pub implied_naks: u64,
    pub pseudo_acks: u64,
    /// Times a gateway withheld a pseudo-ACK for backpressure, repeated
    /// its last one while withholding, dropped a request for want of
    /// buffer, and sent a CNP.
    pub pseudo_acks_withheld: u64,
    pub hold_acks: u64,
    pub backpressure_drops: u64,
    pub cnps_sent: u64,
    /// Both gateways: resent READs not passed to the responder (their
    /// answer still waited for the WAN), waiting READ responses dropped
    /// as dead (a replay followed them), and the most bytes ever waiting
    /// for the WAN transport at one gateway (`site::replays`).
    pub read_replays_suppressed: u64,
    pub stale_read_responses_dropped: u64,
    pub twin_queue_high_water_bytes: u64,
    pub gw_buffer_high_water: usize,
    pub gw_buffer_left: usize,
    /// Per-flow state of both gateways at the end of the run, besides
    /// buffers, per QP: the engines' half tables with their bookkeeping
    /// and the transports' flow tables, as allocated (so at their high
    /// water). See `QpEngine::state_bytes`, `WanConnection::flow_state_bytes`.
    pub state_bytes_per_qp: u64,
    pub events: u64,
    /// Wall-clock seconds the run took, and events (packet deliveries) per
    /// wall second: the simulator's speed, not a property of the system.
    pub wall_s: f64,
    pub events_per_wall_s: f64,
    pub violations: Vec<String>,
}

const MEM_BASE: u64 = 0x10_0000;
const RKEY: u32 = 0x1234;

pub(crate) fn qp_config(s: &Scenario, mem_size: usize) -> QpConfig {
    let base = rxe_qp_config(s, mem_size);
    match s.endpoint {
        EndpointModel::Rxe => base,
        EndpointModel::Hw => {
            let mut c = hw_config(base, host_line_gbps(s) * 1e9, s.rdma_cm);
            if !s.adaptive_timer {
                c.timer = crate::rc::hw::TimerMode::Configured;
            }
            c
        }
    }
}

/// A host's port rate: its DC link, or (direct) the WAN it sits on.
pub fn host_line_gbps(s: &Scenario) -> f64 {
    if s.accelerated {
        s.dc_gbps
    } else {
        s.wan_gbps
    }
}

fn rxe_qp_config(s: &Scenario, mem_size: usize) -> QpConfig {
    // A receiver that never posts enough receives must end in an RNR retry
    // error, not an endless wait: finite retry counts then. (rxe treats 7 as
    // "forever" for both counts; with both directions in use, the QP that
    // failed stops answering as a responder too, and its peer would time
    // out forever with retry_cnt 7.)
    let starved = (s.recv_credits.is_some() && s.recv_refill.is_none()) || s.stall_qp0;
    // A twin that restarts before a requester's QPN was ever seen (no ACK
    // came back yet, no RDMA-CM) leaves the gateway no way to address it
    // (docs/semantics.md): that requester recovers through its own retry
    // count, finite as on hardware (rxe takes 7 as "forever").
    let unreachable_requester = s.twin_restart.is_some();
    QpConfig {
        mtu: s.mtu,
        mem_base: MEM_BASE,
        mem_size,
        rkey: Some(RKEY),
        rnr_retry: if starved { 3 } else { 7 },
        retry_cnt: if starved || unreachable_requester {
            6
        } else {
            7
        },
        ..QpConfig::default()
    }
}

/// Memory layout of every QP, soya-perf's ([`Layout`]): two slots WRITEs
/// cycle through, one slot READs fetch (never written, so a READ racing a
/// WRITE cannot see a torn message), and 4 KiB of atomic counters (which
/// would break the pattern of any data block they hit).
fn layout(s: &Scenario) -> Layout {
    Layout::new(MEM_BASE, s.size)
}

fn mem_size(s: &Scenario) -> usize {
    layout(s).mem_size()
}

/// Builds the world a scenario describes (with `qps: 0`: links and
/// gateways only, for workloads that add their own QPs: `super::nccl`).
pub(crate) fn build(s: &Scenario) -> Result<World, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
    let wan_delay = LinkProfile::fibre(s.distance_km);
    let mut w = World::new(ChaCha8Rng::seed_from_u64(rng.random()));
    let gbps = |g: f64| Some((g * 1e9) as u64);
    let mut wan = LinkProfile::new(wan_delay, gbps(s.wan_gbps));
    wan.loss = s.wan_loss;
    wan.burst = s.wan_burst;
    wan.reorder = s.wan_reorder;
    wan.reorder_delay = Duration::from_micros(50);
    wan.duplicate = s.wan_duplicate;
    wan.jitter = s.wan_jitter;
    // A bottleneck queue of ~ one BDP, as a router would have.
    let bdp = (s.wan_gbps * 1e9 / 8.0 * 2.0 * wan_delay.as_secs_f64()) as usize;
    wan.queue_bytes = bdp.max(1 << 20);
    let mut dc = LinkProfile::new(s.dc_delay, gbps(s.dc_gbps));
    dc.loss = 0.0;
    let mut dc_req = dc.clone();
    dc_req.loss = s.dc_loss;
    if s.accelerated {
        for (a, b, p) in [
            (Node::HostA, Node::GwA, &dc_req),
            (Node::GwA, Node::HostA, &dc_req),
            (Node::GwB, Node::HostB, &dc),
            (Node::HostB, Node::GwB, &dc),
        ] {
            w.links.insert((a, b), Link::new(p.clone()));
        }
        add_gateways(s, &mut w, &wan, &mut rng);
    } else {
        // Host to host: the WAN plus both DC hops.
        let mut direct = wan.clone();
        direct.delay += 2 * s.dc_delay;
        direct.loss = 1.0 - (1.0 - s.wan_loss) * (1.0 - s.dc_loss);
        w.links
            .insert((Node::HostA, Node::HostB), Link::new(direct.clone()));
        w.links
            .insert((Node::HostB, Node::HostA), Link::new(direct));
    }
    let hw = s.endpoint == EndpointModel::Hw;
    w.host_a.port_scheduled = hw;
    w.host_b.port_scheduled = hw;
    for i in 0..s.qps {
        // (The first 256 keep the QPNs earlier runs had.)
        let (qa, qb) = if i < 0x100 {
            (0x100 + i, 0x200 + i)
        } else {
            (0x10_0000 + i, 0x20_0000 + i)
        };
        let psn_a = Psn::new(rng.random());
        let psn_b = Psn::new(rng.random());
        let a_addr = QpAddr {
            ip: HOST_A.into(),
            qpn: qa,
        };
        let b_addr = QpAddr {
            ip: HOST_B.into(),
            qpn: qb,
        };
        let b_mem = if s.responder_error {
            mem_size(s) / 2
        } else {
            mem_size(s)
        };
        let mut qp_a = RcQp::new(qp_config(s, mem_size(s)), a_addr, b_addr, psn_a, psn_b)?;
        let mut qp_b = RcQp::new(qp_config(s, b_mem), b_addr, a_addr, psn_b, psn_a)?;
        let recv = s.recv_credits.unwrap_or(s.iters.saturating_mul(2));
        qp_b.post_recv(if s.stall_qp0 && i == 0 { 0 } else { recv });
        qp_a.post_recv(recv);
        w.host_a.add(qa, qp_a);
        w.host_b.add(qb, qp_b);
        if s.cm_handshake && s.accelerated {
            // Host A is the active side: its REQ gives the PSN B sends
            // with, B's REP the PSN A sends with (see `soya::roce::cm`).
            let comm = 0x1000 + i;
            let mtu = s.mtu as u16;
            let req = cm::req_mad(comm, qa, psn_b, mtu);
            let rep = cm::rep_mad(0x8000_0000 | comm, comm, qb, psn_a);
            w.cm_requests.push(qp1_packet(HOST_A, HOST_B, &req));
            w.host_b
                .cm_answers
                .insert(comm, qp1_packet(HOST_B, HOST_A, &rep));
        }
    }
    Ok(w)
}

/// The settings of the gateway at `local`'s site, as a deployment would
/// write them: its hosts, the twin's hosts, one path per WAN path of the
/// scenario at its rate.
pub fn site_params(s: &Scenario, local: Ipv4Addr, remote: Ipv4Addr) -> SiteParams {
    use soya::wan::{CcKind, PathConfig, WanConfig};
    let paths: Vec<PathConfig> = (0..s.paths.max(1))
        .map(|i| {
            let mut p = PathConfig::new(format!("path{i}"));
            p.rate_bps = Some((s.wan_gbps * 1e9) as u64);
            p
        })
        .collect();
    let mut wan = WanConfig::new(paths, Some([0x5a; 32]), false);
    wan.cc = CcKind::FixedRate;
    let mut engine = EngineConfig::default();
    engine.ack.policy = s.policy;
    if let Some(slots) = s.buffer_slots {
        engine.buffer_slots = slots;
        engine.per_flow_slots = slots;
    }
    let prefix = |a: Ipv4Addr| format!("{a}/32").parse().expect("a /32 prefix");
    let acl = Acl {
        local: vec![prefix(local)],
        remote: vec![prefix(remote)],
    };
    SiteParams::new(engine, wan, acl, s.twin_timeout)
}

/// A session nonce source drawing from a seeded generator (runs repeat).
pub fn seeded_nonces(seed: u64) -> NonceSource {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Box::new(move || Some(rng.random::<u64>() | 1))
}

/// The two gateways and their WAN paths, each with the WAN's impairments
/// (path 0 may be cut for a while).
fn add_gateways(s: &Scenario, w: &mut World, wan: &LinkProfile, rng: &mut ChaCha8Rng) {
    w.nonce_seeds = [rng.random(), rng.random()];
    w.gw_a = Some(Site::new(
        site_params(s, HOST_A, HOST_B),
        Time::ZERO,
        seeded_nonces(w.nonce_seeds[0]),
    ));
    w.gw_b = Some(Site::new(
        site_params(s, HOST_B, HOST_A),
        Time::ZERO,
        seeded_nonces(w.nonce_seeds[1]),
    ));
    w.twin_b_seed = rng.random();
    for i in 0..s.paths.max(1) as usize {
        let mut p = wan.clone();
        if i == 0 {
            if let Some((at, dur)) = s.cut_path {
                p.down.push((Time::ZERO + at, Time::ZERO + at + dur));
            }
        }
        w.wan_links.insert((Node::GwA, i), Link::new(p.clone()));
        w.wan_links.insert((Node::GwB, i), Link::new(p));
    }
}

/// The next work request of a workload.
fn next_wr(s: &Scenario, n: u64, rng: &mut ChaCha8Rng) -> WorkRequest {
    let op = match s.op {
        Op::Write => WrOp::Write,
        Op::Read => WrOp::Read,
        Op::Send => WrOp::Send,
        Op::Atomic => WrOp::Atomic,
        Op::Mixed => [WrOp::Write, WrOp::Read, WrOp::Send, WrOp::Atomic][rng.random_range(0..4)],
    };
    layout(s).wr(op, n, RKEY)
}

/// Per-QP workload progress.
#[derive(Clone, Copy, Default)]
struct Progress {
    posted: u64,
    done: u64,
    failed: bool,
}

impl Progress {
    fn finished(&self, iters: u32) -> bool {
        self.failed || self.done >= u64::from(iters)
    }
}

/// What each QP's requester was told landed (WRITE/SEND bytes completed)
/// and what its responder placed, per host, kept up to date from the QPs
/// touched at each step, with their sums: whether everything completed
/// landed, without visiting every QP.
struct Tally {
    told: [Vec<u64>; 2],
    placed: [Vec<u64>; 2],
    told_sum: [u64; 2],
    placed_sum: [u64; 2],
}

impl Tally {
    fn new(qps: usize) -> Tally {
        Tally {
            told: [vec![0; qps], vec![0; qps]],
            placed: [vec![0; qps], vec![0; qps]],
            told_sum: [0; 2],
            placed_sum: [0; 2],
        }
    }

    fn update(&mut self, host: usize, qi: usize, qp: &RcQp) {
        let told = qp.stats().bytes_completed_writes_sends();
        let m = qp.memory().stats();
        let placed = m.bytes_placed + m.send_bytes_received;
        self.told_sum[host] = self.told_sum[host] - self.told[host][qi] + told;
        self.placed_sum[host] = self.placed_sum[host] - self.placed[host][qi] + placed;
        self.told[host][qi] = told;
        self.placed[host][qi] = placed;
    }

    /// Everything the requesters completed (WRITE/SEND) is placed: each
    /// side placed all the other was told landed.
    fn landed(&self) -> bool {
        self.placed_sum[1] >= self.told_sum[0] && self.placed_sum[0] >= self.told_sum[1]
    }
}

/// How long a world with a failure must stay calm (nothing held, no probe)
/// before its verdict: longer than a WAN crossing at the longest distance
/// drawn (3000 km, 15 ms one way) and a few probe timeouts.
const SETTLE_AFTER_FAILURE: Duration = Duration::from_millis(50);

/// Runs a scenario to completion (or its time limit) and checks invariants.
pub fn run(s: &Scenario) -> Result<Outcome, String> {
    run_world(s, false).map(|(o, _)| o)
}

/// [`run`], returning the world at the end too; with `trace_gateway_a`
/// the world records everything gateway A was given and sent
/// (`World::trace_a`, `World::emitted_a`).
pub fn run_world(s: &Scenario, trace_gateway_a: bool) -> Result<(Outcome, World), String> {
    let wall = std::time::Instant::now();
    let mut w = build(s)?;
    if trace_gateway_a {
        w.trace_a = Some(Vec::new());
    }
    let start = warm_up(s, &mut w);
    let mut wl_rng = ChaCha8Rng::seed_from_u64(s.seed ^ 0x5eed);
    let sides: &[Node] = if s.bidirectional {
        &[Node::HostA, Node::HostB]
    } else {
        &[Node::HostA]
    };
    let mut progress = vec![vec![Progress::default(); s.qps as usize]; 2];
    let mut out = Outcome::default();
    let mut first_done = None;
    let mut landed_at = None;
    let mut same_instant = 0u32;
    let mut iterations = 0u64;
    let trace = std::env::var_os("SOYA_SIM_TRACE").is_some();
    let mut last_done = start;
    let deadline = start + s.time_limit;
    let mut next_refill = s.recv_refill.map(|d| start + d);
    let mut restart_at = s.twin_restart.filter(|_| s.accelerated).map(|d| start + d);
    let mut others_landed_at = None;
    let mut stall_failed_at = None;
    // QPs whose workload is over (finished or failed), any failed, and
    // what their requesters were told landed against what did.
    let mut finished_qps = 0usize;
    let mut any_failed = false;
    let mut tally = Tally::new(s.qps as usize);
    const MAX_EVENTS: u64 = 200_000_000;
    loop {
        if restart_at.is_some_and(|t| w.now >= t) {
            // Gateway B (or A, the near one) dies and comes back with
            // nothing: a new site, a new generation.
            restart_at = None;
            if s.restart_near {
                w.gw_a = Some(Site::new(
                    site_params(s, HOST_A, HOST_B),
                    w.now,
                    seeded_nonces(w.twin_b_seed ^ 0x5EA5_0A0A),
                ));
            } else {
                w.gw_b = Some(Site::new(
                    site_params(s, HOST_B, HOST_A),
                    w.now,
                    seeded_nonces(w.twin_b_seed),
                ));
            }
        }
        // Keep tx_depth requests outstanding on every QP, perftest style.
        // Only QPs given a packet or a timer since the last turn can have
        // completed anything (the world lists them): with 1,024 QPs,
        // visiting all at every step cost more than the rest of the step.
        for node in [Node::HostA, Node::HostB] {
            let si = usize::from(node == Node::HostB);
            let host = if node == Node::HostA {
                &mut w.host_a
            } else {
                &mut w.host_b
            };
            let drives = sides.contains(&node);
            for qi in host.take_touched() {
                tally.update(si, qi, &host.qps[qi]);
                if !drives {
                    continue;
                }
                let pr = &mut progress[si][qi];
                let was_finished = pr.finished(s.iters);
                let qp = &mut host.qps[qi];
                while let Some(c) = qp.poll_completion() {
                    pr.done += 1;
                    if c.status == CompletionStatus::Success {
                        out.messages_ok += 1;
                        out.bytes_completed += u64::from(c.bytes);
                        first_done.get_or_insert(c.at);
                        last_done = last_done.max(c.at);
                    } else {
                        out.messages_failed += 1;
                        pr.failed = true;
                    }
                }
                if qp.is_error() {
                    pr.failed = true;
                }
                let mut posted = false;
                while !pr.failed
                    && !qp.is_error()
                    && pr.posted < u64::from(s.iters)
                    && pr.posted - pr.done < u64::from(s.tx_depth)
                {
                    let wr = next_wr(s, pr.posted, &mut wl_rng);
                    if qp.post_send(wr).is_err() {
                        break;
                    }
                    pr.posted += 1;
                    posted = true;
                }
                if posted {
                    host.qp_mut(qi);
                }
                any_failed |= pr.failed;
                if !was_finished && pr.finished(s.iters) {
                    finished_qps += 1;
                }
            }
        }
        if let (Some(t), Some(d)) = (next_refill, s.recv_refill) {
            if w.now >= t {
                for qp in w.host_a.qps_mut().iter_mut() {
                    qp.post_recv(1);
                }
                for qp in w.host_b.qps_mut().iter_mut() {
                    qp.post_recv(1);
                }
                next_refill = Some(w.now + d);
            }
        }
        w.flush();
        if s.stall_qp0 && others_landed_at.is_none() && others_landed(s, &w, &progress[0]) {
            others_landed_at = Some(w.now);
        }
        if s.stall_qp0 && stall_failed_at.is_none() && progress[0][0].failed {
            // Only a failure the gateway decided (its RNR budget, after
            // pseudo-ACKing) can show head of line blocking: a stalled QP
            // still in its tunnel phase fails by its own RNR retry count,
            // long before the others can land, and blocked nobody.
            let by_gateway = w.engines().any(|g| g.ingress_totals().errors_injected > 0);
            stall_failed_at = Some((w.now, by_gateway));
        }
        let all_done = finished_qps == sides.len() * s.qps as usize;
        // A transfer is over when the data is at the responder, not when
        // the requester was told so (pseudo-ACKs come early by design).
        if all_done && landed_at.is_none() && tally.landed() {
            landed_at = Some(w.now);
        }
        // Done when every request completed and its data is at the
        // responder (or a failure ended the flow).
        // A gateway that gave up on a flow (and told the requester) ends it
        // too, even when the requester had nothing left to fail. (Asked
        // only once all is done: it visits every half.)
        let failed =
            all_done && (any_failed || w.engines().any(|g| g.ingress_totals().errors_injected > 0));
        // With a stalled QP the verdict needs the others landed.
        let others_pending = s.stall_qp0 && others_landed_at.is_none();
        let finished = all_done && (landed_at.is_some() || failed) && !others_pending;
        // (The WAN transport's keepalives never go quiet: with it, the
        // bounded settle below drains what is left.)
        if finished && (w.pending_events() == 0 || w.accelerated()) {
            break;
        }
        let Some(mut t) = w.next_time().or(next_refill) else {
            break;
        };
        if let Some(r) = next_refill.filter(|_| !finished) {
            t = t.min(r);
        }
        if t > deadline || w.events > MAX_EVENTS {
            out.violations.push(format!(
                "did not finish within {:?} of virtual time ({} events)",
                s.time_limit, w.events
            ));
            break;
        }
        iterations += 1;
        if trace && iterations % 1_000 == 0 {
            eprintln!(
                "trace: iter {iterations} now {:?} next {:?} events {} pending {} stuck {:?}",
                w.now,
                t,
                w.events,
                w.pending_events(),
                w.stuck_timers()
            );
        }
        if t <= w.now {
            same_instant += 1;
            if same_instant > 100_000 {
                out.violations.push(format!(
                    "time stuck at {:?}: timers due but not moving: {:?}",
                    w.now,
                    w.stuck_timers()
                ));
                break;
            }
        } else {
            same_instant = 0;
        }
        w.step_to(t);
    }
    // Let gateways settle (delivered watermarks, coalescing timers). After a
    // failure, a gateway may still hold packets it is bound to give up on
    // (an egress waiting behind raw packets that never come frees them after
    // RAW_WAIT_LIMIT; one in an endless RNR storm after its RNR budget), so
    // it gets longer — the buffers must still come back to zero.
    let any_failure = progress.iter().flatten().any(|p| p.failed)
        || w.engines().any(|g| g.ingress_totals().errors_injected > 0);
    let settle = if any_failure {
        soya::qp::egress::RAW_WAIT_LIMIT.max(soya::qp::egress::DEFAULT_RNR_GIVE_UP)
            + Duration::from_secs(2)
    } else {
        Duration::from_secs(1)
    };
    let settle_until = w.now + settle;
    // After a failure, the gateways also move local QPs to the error state
    // (poison, probes: a few ms, and a WAN crossing when one side's
    // failure fails the reverse half at the other): settled once nothing
    // is held and no probe runs for a while, so that what they sent lands.
    let calm = |w: &World| {
        w.engines()
            .map(|g| g.occupancy().slots_used + g.probes_pending())
            .sum::<usize>()
            == 0
    };
    let mut calm_since: Option<Time> = None;
    while let Some(t) = w.next_time() {
        if t > settle_until || w.events > MAX_EVENTS {
            break;
        }
        if any_failure {
            if !calm(&w) {
                calm_since = None;
            } else if t.since(*calm_since.get_or_insert(w.now)) >= SETTLE_AFTER_FAILURE {
                break;
            }
        }
        w.step_to(t);
    }
    if std::env::var_os("SOYA_SIM_DEBUG_STATE").is_some() {
        for (name, gw) in [
            ("GwA", w.gw_a.as_ref().map(Site::engine)),
            ("GwB", w.gw_b.as_ref().map(Site::engine)),
        ] {
            for g in gw.iter() {
                g.ingress_halves()
                    .for_each(|h| eprintln!("{name} ingress {h:#?}"));
                g.egress_halves()
                    .for_each(|h| eprintln!("{name} egress {h:#?}"));
            }
        }
    }
    let end = landed_at.map_or(last_done, |l| l.max(last_done));
    if s.stall_qp0 {
        check_no_head_of_line(others_landed_at, stall_failed_at, &mut out);
    }
    finish(s, &w, start, end, &mut out);
    out.wall_s = wall.elapsed().as_secs_f64();
    out.events_per_wall_s = out.events as f64 / out.wall_s.max(1e-9);
    Ok((out, w))
}

/// Runs the world until both WAN endpoints have a session and live paths (at most a
/// second of virtual time) when the scenario asks for a warm start, and
/// returns when the workload starts. Link outages are relative to it.
pub(crate) fn warm_up(s: &Scenario, w: &mut World) -> Time {
    if s.warm_start && w.accelerated() {
        let limit = Time::ZERO + Duration::from_secs(1);
        // A session, and every path has seen a round trip (data only goes
        // on paths that are Up).
        let up = |w: &World| {
            w.gw_a.iter().chain(w.gw_b.iter()).all(|x| {
                let st = x.wan().stats();
                st.connected && st.paths.iter().all(|p| p.state == PathState::Up)
            })
        };
        while !up(w) {
            match w.next_time() {
                Some(t) if t <= limit => w.step_to(t),
                _ => break,
            }
        }
    }
    // RDMA-CM: every REQ out, and the world run until every REP is back
    // (a lost one leaves that QP to be learned from traffic).
    let requests = std::mem::take(&mut w.cm_requests);
    let wanted = w.host_a.cm_established + requests.len() as u64;
    if !requests.is_empty() {
        for r in requests {
            w.send_ip(Node::HostA, r);
        }
        w.flush();
        let limit = w.now + Duration::from_secs(1);
        while w.host_a.cm_established < wanted {
            match w.next_time() {
                Some(t) if t <= limit => w.step_to(t),
                _ => break,
            }
        }
    }
    let start = w.now;
    for link in w.wan_links.values_mut() {
        for d in &mut link.profile.down {
            *d = (d.0 + (start - Time::ZERO), d.1 + (start - Time::ZERO));
        }
    }
    start
}

/// With QP 0 stalled: every other QP finished its work and its data is at
/// the responder.
fn others_landed(s: &Scenario, w: &World, progress: &[Progress]) -> bool {
    let done = progress
        .iter()
        .skip(1)
        .all(|p| p.done >= u64::from(s.iters));
    done && w
        .host_a
        .qps
        .iter()
        .zip(w.host_b.qps.iter())
        .skip(1)
        .all(|(a, b)| {
            let m = b.memory().stats();
            m.bytes_placed + m.send_bytes_received >= a.stats().bytes_completed_writes_sends()
        })
}

/// The QPs beside a stalled one must not wait behind it: their data lands
/// before the gateway gives up on the stalled one (its RNR budget takes
/// well over half a second; they need milliseconds). Waiting behind it,
/// they would land only once it failed, or never.
fn check_no_head_of_line(
    landed: Option<Time>,
    stall_failed: Option<(Time, bool)>,
    out: &mut Outcome,
) {
    match (landed, stall_failed) {
        (Some(l), Some((f, true))) if l > f => out.violations.push(format!(
            "head of line: the QPs beside the stalled one landed at {l:?}, after it failed at {f:?}"
        )),
        (Some(_), _) => {}
        (None, _) => out
            .violations
            .push("head of line: the QPs beside the stalled one never landed".into()),
    }
}

fn finish(s: &Scenario, w: &World, start: Time, last: Time, out: &mut Outcome) {
    out.events = w.events;
    out.elapsed_s = (last - start).as_secs_f64();
    if out.elapsed_s > 0.0 {
        out.goodput_gbps = out.bytes_completed as f64 * 8.0 / out.elapsed_s / 1e9;
    }
    let mut completed_write_bytes = 0u64;
    let mut placed_bytes = 0u64;
    for (req_host, resp_host) in [(&w.host_a, &w.host_b), (&w.host_b, &w.host_a)] {
        for (qa, qb) in req_host.qps.iter().zip(resp_host.qps.iter()) {
            let st = qa.stats();
            out.requester_retransmissions += st.retransmitted_packets;
            out.requester_timeouts += st.timeouts;
            out.requester_timeouts_after_ack += st.timeouts_after_ack;
            out.implied_naks += st.implied_naks;
            out.data_errors += st.data_errors;
            let mem = qb.memory().stats();
            out.bytes_verified += mem.bytes_verified;
            out.data_errors += mem.data_errors;
            placed_bytes += mem.bytes_placed + mem.send_bytes_received;
            completed_write_bytes += st.bytes_completed_writes_sends();
        }
    }
    let errors_injected: u64 = w
        .engines()
        .map(|g| g.ingress_totals().errors_injected)
        .sum();
    let expect_failures = s.responder_error
        || (s.recv_refill.is_none() && s.recv_credits.is_some_and(|r| r < s.iters))
        || s.twin_restart.is_some()
        || s.stall_qp0;
    if errors_injected > 0 && !expect_failures {
        out.violations.push(format!(
            "a gateway gave up on a flow ({errors_injected} errors injected) with no failure injected"
        ));
    }
    // With a failure injected, the documented path (an error NAK on a later
    // work request, or on the next one posted) may leave completed WRITEs
    // unplaced; docs/semantics.md. Without one, never.
    let poisoned = w
        .host_a
        .qps
        .iter()
        .chain(w.host_b.qps.iter())
        .filter(|q| q.is_error())
        .count();
    if completed_write_bytes > placed_bytes && errors_injected == 0 && poisoned == 0 {
        out.bytes_lost = completed_write_bytes - placed_bytes;
        out.violations.push(format!(
            "applications were told {completed_write_bytes} bytes landed; {placed_bytes} did"
        ));
    }
    // Even then, never silently: a requester whose completed data did not
    // land must have been told, its QP moved to the error state (an error
    // completion, or its receives flushed).
    for (req_host, resp_host) in [(&w.host_a, &w.host_b), (&w.host_b, &w.host_a)] {
        for (i, (qa, qb)) in req_host.qps.iter().zip(resp_host.qps.iter()).enumerate() {
            let told = qa.stats().bytes_completed_writes_sends();
            let m = qb.memory().stats();
            let placed = m.bytes_placed + m.send_bytes_received;
            if told > placed && !qa.is_error() {
                out.bytes_lost += told - placed;
                out.violations.push(format!(
                    "silent loss: QP {i}'s application was told {told} bytes landed, {placed} \
                     did, and its QP is not in error"
                ));
            }
        }
    }
    if out.data_errors > 0 {
        out.violations.push(format!(
            "{} data errors (corrupt, misplaced, stale or duplicated data)",
            out.data_errors
        ));
        out.bytes_misordered = out.data_errors;
    }
    if out.messages_failed > 0 && !expect_failures {
        out.violations.push(format!(
            "{} work requests failed with nothing injected",
            out.messages_failed
        ));
    }
    // With loss inside the requester's DC, an implied NAK is what rxe does
    // when a READ response is lost and a later ACK arrives, gateway or not.
    // A hardware requester whose timer fired (a 2 ms step on a READ whose
    // response takes a longer RTT: no pseudo-ACK may answer it) resends the
    // READ and what follows; the responder's answers to the first copies
    // then arrive past the re-issued READ: implied NAKs of its own making.
    let own_retries = s.endpoint == EndpointModel::Hw && out.requester_timeouts > 0;
    if s.accelerated && s.dc_loss == 0.0 && !own_retries && out.implied_naks > 0 {
        out.violations.push(format!(
            "{} implied NAKs at the requester: a pseudo-ACK went past a READ or atomic",
            out.implied_naks
        ));
    }
    if std::env::var_os("SOYA_SIM_DEBUG").is_some() {
        for (name, gw) in [
            ("A", w.gw_a.as_ref().map(Site::engine)),
            ("B", w.gw_b.as_ref().map(Site::engine)),
        ] {
            let Some(gw) = gw else { continue };
            eprintln!("gw {name}: {:?} {:?}", gw.stats, gw.occupancy());
            let site = if name == "A" { &w.gw_a } else { &w.gw_b };
            if let Some(site) = site {
                eprintln!("  twin {:?}", site.twin_counters());
            }
            for h in gw.ingress_halves() {
                eprintln!("  ingress {} {:?} {:?}", h.key, h.mode, h.stats);
            }
            for h in gw.egress_halves() {
                eprintln!("  egress {} held {} {:?}", h.key, h.held(), h.stats);
            }
        }
        for (n, h) in [("A", &w.host_a), ("B", &w.host_b)] {
            for qp in &h.qps {
                eprintln!("host {n}: {:?} mem {:?}", qp.stats(), qp.memory().stats());
            }
        }
        for ((a, b), l) in &w.links {
            eprintln!("link {a:?}->{b:?}: {:?}", l.stats);
        }
    }
    let state: usize = w
        .gw_a
        .iter()
        .chain(w.gw_b.iter())
        .map(|g| g.engine().state_bytes() + g.wan().flow_state_bytes())
        .sum();
    out.state_bytes_per_qp = (state / s.qps.max(1) as usize) as u64;
    for gw in w.engines() {
        let occ = gw.occupancy();
        out.gw_buffer_high_water = out.gw_buffer_high_water.max(occ.high_water);
        out.gw_buffer_left += occ.slots_used;
        // Totals: halves forgotten once quiet (`qp::expiry`) count too.
        let t = gw.ingress_totals();
        out.pseudo_acks += t.pseudo_acks;
        out.pseudo_acks_withheld += t.withheld_acks;
        out.hold_acks += t.hold_acks;
        out.backpressure_drops += t.backpressure_drops;
        out.cnps_sent += t.cnps_sent;
    }
    // A message to the twin dropped at the bound of the site's pending
    // queue loses whatever it carried (a READ response, a Delivered): the
    // flow waits for it forever, or pseudo-ACKed data is gone.
    for g in [&w.gw_a, &w.gw_b].into_iter().flatten() {
        let t = g.twin_counters();
        out.read_replays_suppressed += t.read_replays_suppressed;
        out.stale_read_responses_dropped += t.stale_read_responses_dropped;
        out.twin_queue_high_water_bytes = out
            .twin_queue_high_water_bytes
            .max(t.pending_high_water_bytes);
    }
    let overflow: u64 = [&w.gw_a, &w.gw_b]
        .into_iter()
        .flatten()
        .map(|g| g.twin_counters().pending_overflow)
        .sum();
    if overflow > 0 {
        out.violations.push(format!(
            "{overflow} twin messages dropped at the pending queue's bound"
        ));
    }
    if out.gw_buffer_left > 0 {
        out.violations.push(format!(
            "{} buffer slots still held after the run",
            out.gw_buffer_left
        ));
    }
}
