//! The world a [`Scenario`] describes: its links (with the WAN's and the
//! DC's impairments), the two gateways configured as a deployment would
//! configure them, and the endpoints with their QPs (and their RDMA-CM
//! exchange when the scenario asks for one).

use std::net::Ipv4Addr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use soya_proto::qp::EngineConfig;
use soya_proto::roce::cm;
use soya_proto::roce::Psn;
use soya_proto::site::{Acl, NonceSource, Site, SiteParams};
use soya_proto::time::Time;

use super::super::link::{Link, LinkProfile};
use super::super::standby::Standby;
use super::super::world::{qp1_packet, Node, World};
use super::{Scenario, HOST_A, HOST_B};
use crate::perf::workload::Layout;
use crate::rc::hw::{hw_config, EndpointModel};
use crate::rc::{QpAddr, QpConfig, RcQp};

const MEM_BASE: u64 = 0x10_0000;
pub(super) const RKEY: u32 = 0x1234;

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
    // A near gateway that restarts before a requester's QPN was ever seen
    // (no ACK came back yet, no RDMA-CM) leaves it no way to address it
    // (docs/semantics.md): that requester recovers through its own retry
    // count, finite as on hardware (rxe takes 7 as "forever"). A far
    // gateway's restart is resumed (issue 35): nothing to recover from,
    // the requesters keep rxe's default (and a requester left waiting
    // shows as a run that does not finish).
    // A planned restart keeps every flow (the twin resumes them): nothing
    // to recover from either.
    // A standby that takes over keeps every requester reachable. But what
    // reached the dead gateway meanwhile is lost, as on a lossy link: a
    // responder's class C NAK among it is never sent again (the responder
    // went to the error state, and rxe is then silent), so its requester
    // ends by its own retry count, finite as on hardware (`--standby-deaths`
    // seed 502480: rxe's "forever" never finished). The same holds on a
    // direct path whose WAN loses packets (sweep seed 500829).
    let lossy_wan = s.wan_loss > 0.0 || s.wan_burst.is_some();
    let nak_may_be_lost = (s.standby.is_some() && s.twin_restart.is_some() && !s.planned_restart)
        || (!s.accelerated && lossy_wan);
    let silent_responder = s.responder_error && nak_may_be_lost;
    let unreachable_requester = silent_responder
        || (s.twin_restart.is_some()
            && !s.planned_restart
            && s.standby.is_none()
            && (s.restart_near || s.bidirectional));
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
pub(super) fn layout(s: &Scenario) -> Layout {
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
            // with, B's REP the PSN A sends with (see `soya_proto::roce::cm`).
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
    use soya_proto::wan::{CcKind, PathConfig, WanConfig};
    let paths: Vec<PathConfig> = (0..s.paths.max(1))
        .map(|i| {
            let mut p = PathConfig::new(format!("path{i}"));
            p.rate_bps = Some((s.wan_gbps * 1e9) as u64);
            p
        })
        .collect();
    let mut wan = WanConfig::new(paths, Some([0x5a; 32]), false);
    wan.cc = CcKind::FixedRate;
    if let Some(d) = s.key_update_interval {
        wan.tuning.key_update_interval = d;
    }
    let mut engine = EngineConfig::default();
    engine.ack.policy = s.policy;
    let slots = s.buffer_slots.unwrap_or_else(|| auto_buffer_slots(s));
    engine.buffer_slots = slots;
    engine.per_flow_slots = slots;
    let prefix = |a: Ipv4Addr| format!("{a}/32").parse().expect("a /32 prefix");
    let acl = Acl {
        local: vec![prefix(local)],
        remote: vec![prefix(remote)],
    };
    SiteParams::new(engine, wan, acl, s.twin_timeout)
}

/// The deep buffer a daemon deployed for this scenario would pick with
/// `buffer.size = "auto"` and the other `[buffer]` keys at their defaults
/// (no per-flow quota): its paths' summed rate × the fibre RTT, through the
/// config's own function, so the simulator's figures are the daemon's.
pub fn auto_buffer_slots(s: &Scenario) -> usize {
    let paths = u64::from(s.paths.max(1));
    let rate_bps = (s.wan_gbps * 1e9) as u64 * paths;
    let rtt = LinkProfile::fibre(s.distance_km) * 2;
    let slot_bytes = soya_config::DEFAULT_SLOT_BYTES;
    let a = soya_config::auto_size_of(
        rate_bps,
        rtt,
        soya_config::DEFAULT_SAFETY_FACTOR,
        slot_bytes,
        soya_config::DEFAULT_REQUESTER_WINDOW,
        soya_config::DEFAULT_REQUESTERS,
    );
    (a.bytes / u64::from(slot_bytes)) as usize
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
    // Each built as its gateway was (same parameters, same nonces): it
    // replays that gateway's calls.
    if let Some((mirror, _)) = s.standby {
        for (g, (local, remote)) in [(HOST_A, HOST_B), (HOST_B, HOST_A)].into_iter().enumerate() {
            let twin = Site::new(
                site_params(s, local, remote),
                Time::ZERO,
                seeded_nonces(w.nonce_seeds[g]),
            );
            w.standby[g] = Some(Standby::new(twin, mirror));
        }
        w.sealed = Some(Default::default());
    }
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
