//! Running a scenario: the workload kept at its depth on every QP (perftest
//! style), the failures the scenario injects (a gateway restart, receives
//! refilled), the world stepped until the data has landed or the time
//! limit, then a settle so that what the gateways still hold comes back.
//! The end state is judged in `verdict`.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use soya_proto::site::Site;
use soya_proto::time::Time;
use soya_proto::wan::PathState;

use super::super::world::{Node, World};
use super::build::{build, layout, seeded_nonces, site_params, RKEY};
use super::verdict::{check_fair_share, check_no_head_of_line, finish};
use super::{Op, Outcome, Scenario, HOST_A, HOST_B};
use crate::perf::workload::Op as WrOp;
use crate::rc::{CompletionStatus, RcQp, WorkRequest};

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
    let mut ended_at = None;
    // Bytes each QP landed when the first QP's transfer was over
    // (`Scenario::fair_share`), and the QPs touched in a step.
    let mut shares: Option<Vec<u64>> = None;
    let mut drain_target: Option<u64> = None;
    let mut window_from: Option<Vec<u64>> = None;
    let mut touched = Vec::new();
    let deadline = start + s.time_limit;
    let mut next_refill = s.recv_refill.map(|d| start + d);
    let mut restart_at = s.twin_restart.filter(|_| s.accelerated).map(|d| start + d);
    // A planned restart: draining since, then closed (the CLOSE went out
    // in a step, and the new incarnation starts).
    let mut planned: Option<Planned> = None;
    let mut others_landed_at = None;
    let mut stall_failed_at = None;
    // QPs whose workload is over (finished or failed), any failed, and
    // what their requesters were told landed against what did.
    let mut finished_qps = 0usize;
    let mut any_failed = false;
    let mut tally = Tally::new(s.qps as usize);
    const MAX_EVENTS: u64 = 200_000_000;
    loop {
        if restart_at.is_some_and(|t| w.now >= t) && s.planned_restart {
            // SIGTERM: new requests from its DC are refused, what it holds
            // is delivered.
            restart_at = None;
            if let Some(g) = victim(&mut w, s.restart_near) {
                g.start_drain();
            }
            planned = Some(Planned::Draining { since: w.now });
        }
        if let Some(p) = planned {
            let now = w.now;
            if let Some(g) = victim(&mut w, s.restart_near) {
                match p {
                    Planned::Draining { since } => {
                        // What a drain that times out still waits for.
                        if !g.is_restartable()
                            && now >= since + DRAIN_TIMEOUT
                            && std::env::var_os("SOYA_SIM_DEBUG_STATE").is_some()
                        {
                            g.engine()
                                .ingress_halves()
                                .for_each(|h| eprintln!("DRAIN TIMEOUT ingress {h:#?}"));
                        }
                        if g.is_restartable() || now >= since + DRAIN_TIMEOUT {
                            out.restart_clean = Some(g.close_for_restart(now));
                            planned = Some(Planned::Closing { since });
                        }
                    }
                    Planned::Closing { since } => {
                        if g.is_closed() {
                            out.restart_pause_s = Some(now.since(since).as_secs_f64());
                            planned = None;
                            // The process exits; the new one starts below.
                            restart_at = Some(now);
                        }
                    }
                }
            }
        }
        if restart_at.is_some_and(|t| w.now >= t) && planned.is_none() {
            // Gateway B (or A, the near one) dies and comes back with
            // nothing: a new site, a new generation.
            restart_at = None;
            if let Some((_, takeover)) = s.standby {
                // It does not come back: its standby takes over.
                let node = if s.restart_near { Node::GwA } else { Node::GwB };
                w.kill_gateway(node, takeover);
            } else if s.restart_near {
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
                if s.fair_share.is_some() && shares.is_none() {
                    touched.push(qi);
                }
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
        // Fairness, over the time the gateway pushed back and shared the
        // WAN: from the moment what gateway A held when a flow first had
        // to wait for room (the buffer full) has crossed the WAN, to the
        // first time a QP's transfer is over (all its work completed, its
        // data landed). What was admitted before the buffer filled came in
        // the order the hosts' links sent it, not in the gateway's turns.
        if s.fair_share.is_some() && shares.is_none() {
            let landed = tally.placed_sum[0] + tally.placed_sum[1];
            match drain_target {
                None => {
                    let gw = w.gw_a.as_ref().map(|g| g.engine());
                    if gw.is_some_and(|g| g.flows_waiting_for_room() > 0) {
                        let held = gw.map_or(0, |g| g.occupancy().slots_used) as u64;
                        drain_target = Some(landed + held * s.mtu as u64);
                    }
                }
                Some(target) if window_from.is_none() && landed >= target => {
                    window_from = Some(landed_per_qp(&w));
                }
                _ => {}
            }
        }
        for qi in touched.drain(..) {
            let pr = &progress[0][qi];
            if shares.is_none()
                && pr.finished(s.iters)
                && !pr.failed
                && tally.placed[1][qi] >= tally.told[0][qi]
            {
                shares = Some(match &window_from {
                    Some(from) => {
                        let now = landed_per_qp(&w);
                        now.iter().zip(from).map(|(n, f)| n - f).collect()
                    }
                    // Over before the gateway's turns ever decided it.
                    None => Vec::new(),
                });
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
            // Its data all landed, or a failure ended it: that is its end
            // (not the last completion: pseudo-ACKs complete work early).
            ended_at = Some(landed_at.map_or(w.now, |l| l.max(last_done)));
            break;
        }
        let Some(mut t) = w.next_time().or(next_refill) else {
            break;
        };
        if let Some(r) = next_refill.filter(|_| !finished) {
            t = t.min(r);
        }
        if t > deadline {
            out.violations.push(format!(
                "did not finish within {:?} of virtual time ({} events)",
                s.time_limit, w.events
            ));
            break;
        }
        if w.events > MAX_EVENTS {
            // Say which limit stopped it: the time limit it did not reach
            // told a user nothing about why a 48 s run stopped.
            out.violations.push(format!(
                "did not finish: stopped at the simulator's cap of {MAX_EVENTS} events after \
                 {:?} of virtual time (its time limit: {:?})",
                w.now - start,
                s.time_limit
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
    // Where a run that did not finish was stopped (before the settling).
    let stopped = w.now;
    // Let gateways settle (delivered watermarks, coalescing timers). After a
    // failure, a gateway may still hold packets it is bound to give up on
    // (an egress waiting behind raw packets that never come frees them after
    // RAW_WAIT_LIMIT; one in an endless RNR storm after its RNR budget), so
    // it gets longer — the buffers must still come back to zero.
    let any_failure = progress.iter().flatten().any(|p| p.failed)
        || w.engines().any(|g| g.ingress_totals().errors_injected > 0);
    let settle = if any_failure {
        soya_proto::qp::egress::RAW_WAIT_LIMIT.max(soya_proto::qp::egress::DEFAULT_RNR_GIVE_UP)
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
    if s.stall_qp0 {
        check_no_head_of_line(others_landed_at, stall_failed_at, &mut out);
    }
    if let Some(min) = s.fair_share {
        check_fair_share(shares.as_deref(), min, s.window_bytes(), &mut out);
    }
    finish(s, &w, start, ended_at, stopped, &mut out);
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

/// What each QP pair landed so far: the data its requester wrote or sent,
/// verified at the responder, and the data it read, verified at the
/// requester.
fn landed_per_qp(w: &World) -> Vec<u64> {
    w.host_a
        .qps
        .iter()
        .zip(w.host_b.qps.iter())
        .map(|(a, b)| a.memory().stats().bytes_verified + b.memory().stats().bytes_verified)
        .collect()
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

/// The daemon's bound on a drain (`soya::gateway::device::DRAIN_TIMEOUT`).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a planned restart is (`Scenario::planned_restart`).
#[derive(Clone, Copy, Debug)]
enum Planned {
    Draining { since: Time },
    Closing { since: Time },
}

/// The gateway a restart is about: A (`near`) or B.
fn victim(w: &mut World, near: bool) -> Option<&mut Site> {
    if near {
        w.gw_a.as_mut()
    } else {
        w.gw_b.as_mut()
    }
}
