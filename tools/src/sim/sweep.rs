//! Randomized scenarios: many small runs across the whole space of
//! operations, sizes, distances, impairments and policies, every invariant
//! checked on each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use soya_config::AckPolicy;

use super::link::GilbertElliott;
use super::oversub::oversubscribed_scenario;
use super::scenario::{run, Op, Scenario};

pub struct SweepConfig {
    pub scenarios: u64,
    pub seed: u64,
    /// A progress line on stderr.
    pub progress: bool,
    /// Print each failing scenario.
    pub verbose: bool,
    /// Include scenarios with packet loss inside the requester's DC.
    pub dc_loss: bool,
    /// The endpoints every scenario runs.
    pub endpoint: crate::rc::hw::EndpointModel,
    /// Every scenario's gateways replace their WAN keys this often.
    pub key_update_interval: Option<Duration>,
    /// Every this many scenarios, one is over-subscribed
    /// (`sim::oversub`): QPs offering 2–16× the WAN for the whole
    /// transfer, the QPs' shares of the WAN checked. 0: none; 1: all.
    pub oversub_every: u64,
    /// Every ordinary scenario through the gateways loses one gateway at a
    /// random point, and its standby takes over (`with_standby_death`).
    pub standby_deaths: bool,
    /// Worker threads running scenarios side by side; 0: one per core this
    /// process may use (`available_parallelism`, which honours cpusets and
    /// cgroup quotas).
    pub threads: usize,
}

/// The sweep's default: one scenario in four over-subscribed.
pub const OVERSUB_EVERY: u64 = 4;

/// Totals over a sweep (the keys scripts rely on are fixed).
#[derive(Clone, Debug, Default, Serialize)]
pub struct SweepTotals {
    pub scenarios: u64,
    pub bytes_verified: u64,
    pub bytes_lost: u64,
    pub bytes_duplicated: u64,
    pub bytes_misordered: u64,
    pub violations: u64,
    pub messages_ok: u64,
    pub messages_failed_as_injected: u64,
    pub events: u64,
    /// WAN sending-key updates of all gateways.
    #[serde(default)]
    pub wan_key_updates: u64,
    /// Planned restarts that happened (`Scenario::planned_restart`; a
    /// workload may end before its time), and those whose drain ended
    /// clean (CLOSE "restart", every flow kept) rather than timing out.
    #[serde(default)]
    pub planned_restarts: u64,
    #[serde(default)]
    pub planned_restarts_clean: u64,
    /// The first few scenarios whose drain timed out.
    #[serde(default)]
    pub drain_timeouts: Vec<String>,
    /// Gateways that died and whose standby took over
    /// (`Scenario::standby`, issue 38).
    #[serde(default)]
    pub standby_takeovers: u64,
    pub wall_s: f64,
    /// Over-subscribed scenarios run, and the least share of an equal share
    /// of the WAN any QP of them got (`Outcome::min_share`).
    pub oversubscribed: u64,
    pub min_share: Option<f64>,
    /// Over-subscribed runs in which a QP got less than
    /// `oversub::FAIR_SHARE` of an equal share (not counted in
    /// `violations`: see `Outcome::unfair`), and the first few.
    pub unfair: u64,
    pub unfair_runs: Vec<String>,
    /// Over-subscribed runs whose shares were not judged: the span over
    /// which the gateway pushed back was shorter than
    /// `verdict::FAIR_SPAN_WINDOWS` requester windows per QP.
    #[serde(default)]
    pub fair_span_short: u64,
    /// The first few failing scenarios, for reproduction.
    pub failures: Vec<String>,
}

impl SweepTotals {
    pub fn summary(&self) -> String {
        format!(
            "{} scenarios ({} over-subscribed, least share of an equal share {}, {} below {}, \
             {} too short to judge) in {:.1} s: \
             {} messages ok, {} failed as injected, {} bytes verified; \
             lost {} B, duplicated {} B, misordered {} B; {} WAN key updates; \
             {} planned restarts ({} drained clean, the rest timed out{}); \
             {} standby takeovers; {} violations{}",
            self.scenarios,
            self.oversubscribed,
            self.min_share.map_or("-".into(), |m| format!("{m:.2}")),
            self.unfair,
            super::oversub::FAIR_SHARE,
            self.fair_span_short,
            self.wall_s,
            self.messages_ok,
            self.messages_failed_as_injected,
            self.bytes_verified,
            self.bytes_lost,
            self.bytes_duplicated,
            self.bytes_misordered,
            self.wan_key_updates,
            self.planned_restarts,
            self.planned_restarts_clean,
            if self.drain_timeouts.is_empty() {
                String::new()
            } else {
                format!(": {}", self.drain_timeouts.join(", "))
            },
            self.standby_takeovers,
            self.violations,
            self.failures
                .iter()
                .map(|f| format!("\n  {f}"))
                .collect::<String>()
        )
    }
}

/// The scenario a seed stands for.
pub fn random_scenario(seed: u64) -> Scenario {
    let mut r = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let op = [Op::Write, Op::Read, Op::Send, Op::Atomic, Op::Mixed][r.random_range(0..5)];
    // Log-uniform sizes from 1 B to 256 KiB.
    let size = (2f64.powf(r.random_range(0.0..18.0)) as u32).max(1);
    let mtu = [1024, 2048, 4096][r.random_range(0..3)];
    let distance_km = [0.0, 10.0, 300.0, 1000.0, 3000.0][r.random_range(0..5)];
    let policy = [
        AckPolicy::Edge,
        AckPolicy::Edge,
        AckPolicy::Strict,
        AckPolicy::Off,
    ][r.random_range(0..4)];
    let accelerated = r.random_bool(0.85);
    let iters = r.random_range(1..=40);
    let mut s = Scenario {
        seed,
        distance_km,
        accelerated,
        policy,
        op,
        size,
        tx_depth: r.random_range(1..=64),
        qps: r.random_range(1..=3),
        iters,
        mtu,
        wan_gbps: [1.0, 10.0, 40.0][r.random_range(0..3)],
        dc_gbps: 100.0,
        bidirectional: r.random_bool(0.3),
        time_limit: Duration::from_secs(60),
        ..Scenario::default()
    };
    if r.random_bool(0.3) {
        s.dc_loss = [0.001, 0.01, 0.03][r.random_range(0..3)];
    }
    // WAN impairments: the direct path suffers them end to end; through
    // Sōya the WAN transport must hide them.
    if r.random_bool(0.3) {
        s.wan_loss = [0.0001, 0.001, 0.01][r.random_range(0..3)];
    }
    if r.random_bool(0.1) {
        s.wan_burst = Some(GilbertElliott {
            p_enter_bad: 0.001,
            p_leave_bad: 0.3,
            loss_in_bad: 0.5,
        });
    }
    if accelerated && r.random_bool(0.1) {
        s.wan_reorder = 0.01;
        s.wan_duplicate = 0.005;
        s.wan_jitter = Duration::from_micros(r.random_range(1..200));
    }
    if accelerated {
        s.paths = r.random_range(1..=3);
        if s.paths > 1 && r.random_bool(0.2) {
            s.cut_path = Some((
                Duration::from_micros(r.random_range(100..5000)),
                Duration::from_millis(r.random_range(1..200)),
            ));
        }
    }
    if s.op == Op::Send && r.random_bool(0.3) {
        // An RNR storm: fewer receives than messages. Mostly the rest trickle
        // in later (every SEND must then succeed); sometimes they never come,
        // and the SENDs must fail loudly (RNR retry exhausted), not succeed.
        s.recv_credits = Some(r.random_range(0..iters));
        if r.random_bool(0.8) {
            s.recv_refill = Some(Duration::from_micros(r.random_range(50..2000)));
        }
    }
    if matches!(s.op, Op::Write | Op::Mixed) && r.random_bool(0.05) {
        s.responder_error = true;
    }
    // Half the scenarios start the gateways together with the workload: the
    // first requests then wait for the WAN session (drawn last, so the
    // draws above stay what they were for every seed).
    s.warm_start = r.random_bool(0.5);
    // Drawn after everything above, for the same reason: a twin that
    // crashes and comes back mid-stream (flows must fail loudly, nothing
    // silently lost), and a stalled QP beside busy ones between the same
    // two hosts (they must not wait behind it).
    if accelerated && r.random_bool(0.05) {
        s.twin_restart = Some(Duration::from_micros(r.random_range(100..20_000)));
    }
    if accelerated && s.qps >= 2 && r.random_bool(0.05) {
        // Nothing else that slows the others down: the verdict compares
        // their landing with the stalled QP's failure (RNR budget, > 0.6 s).
        // The gateway owns the stall (pseudo-ACKs, its own RNR waits): the
        // requester of the stalled QP only learns of it when the gateway
        // gives up.
        s.policy = AckPolicy::Edge;
        s.op = Op::Send;
        s.stall_qp0 = true;
        s.recv_credits = None;
        s.recv_refill = None;
        s.dc_loss = 0.0;
        s.cut_path = None;
        s.twin_restart = None;
    }
    // Drawn last, for the same reason: which gateway restarts. The near
    // one (A, which pseudo-ACKed host A's requesters) must learn from B
    // which of its QPs were orphaned.
    if s.twin_restart.is_some() {
        s.restart_near = r.random_bool(0.5);
    }
    // Drawn last, for the same reason: a planned restart (`systemctl
    // restart`: a drain, CLOSE "restart", a new incarnation) of either
    // gateway in a scenario with no crash; nothing may fail (issue 35).
    if accelerated && s.twin_restart.is_none() && !s.stall_qp0 && r.random_bool(0.05) {
        s.twin_restart = Some(Duration::from_micros(r.random_range(100..20_000)));
        s.restart_near = r.random_bool(0.5);
        s.planned_restart = true;
    }
    // Drawn last, for the same reason: half the gateways that die have a
    // standby (issue 38), which takes over; nothing may fail. The mirror's
    // one-way delay and the takeover's length drawn.
    if s.twin_restart.is_some() && !s.planned_restart && r.random_bool(0.5) {
        s.standby = Some((
            Duration::from_micros(r.random_range(1..=100)),
            Duration::from_micros(r.random_range(0..=5_000)),
        ));
    }
    s
}

/// The gateways of `s` have standbys, and one of them (A or B, drawn) dies
/// at a random point (issue 38):
/// mid-message, mid-READ, during WAN loss or a path cut, as the scenario
/// has them. From its own stream of the seed, so that the rest of the
/// scenario is the ordinary one. Not for a direct run (no gateway) nor a
/// head-of-line one (its stall never clears: it must end by the timer).
pub fn with_standby_death(s: &mut Scenario, seed: u64) {
    if !s.accelerated || s.stall_qp0 {
        return;
    }
    let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0x57A2_DB11_DEAD_0001);
    s.twin_restart = Some(Duration::from_micros(r.random_range(100..20_000)));
    s.restart_near = r.random_bool(0.5);
    s.planned_restart = false;
    s.standby = Some((
        Duration::from_micros(r.random_range(1..=100)),
        Duration::from_micros(r.random_range(0..=5_000)),
    ));
}

/// The scenario a sweep of `endpoint` runs for `seed` (what `sim_debug`
/// reproduces): [`random_scenario`] with the endpoint's adjustments.
pub fn sweep_scenario(
    seed: u64,
    endpoint: crate::rc::hw::EndpointModel,
    dc_loss: bool,
) -> Scenario {
    let mut s = random_scenario(seed);
    if !dc_loss {
        s.dc_loss = 0.0;
    }
    s.endpoint = endpoint;
    // A hardware timer of 2 ms on a path whose ACKs take longer than
    // that (RTT > 2 ms: beyond ~200 km) with nothing to hide the RTT
    // (direct, a tunnel, `strict`) resends whole send-queue windows
    // every 2/4/8/16 ms: the endpoints' own storm (nccl#1555), which
    // can outlast any time limit on a 1 Gb/s WAN. Those scenarios check
    // Sōya's invariants with the timer's adaptive mode off; `edge`
    // ones keep it (pseudo-ACKs must keep it from firing).
    let rtt_over_2ms = 2.0 * s.distance_km * 4.9e-6 > 0.002;
    if rtt_over_2ms && !(s.accelerated && s.policy == AckPolicy::Edge) {
        s.adaptive_timer = false;
    }
    s
}

/// Runs the sweep on [`SweepConfig::threads`] worker threads. Every
/// scenario is its own deterministic world (virtual time, its own seed), so
/// the workers share nothing but the next index to run; their per-scenario
/// totals are folded in scenario order, so the result (its lists of the
/// first few failures included) is the same whatever the number of
/// threads — `sweep_is_the_same_on_one_thread_and_on_several` checks it.
pub fn sweep(cfg: &SweepConfig) -> SweepTotals {
    let start = Instant::now();
    let threads = match cfg.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .clamp(1, cfg.scenarios.max(1) as usize);
    let next = AtomicU64::new(0);
    let progress = Progress {
        done: AtomicU64::new(0),
        violations: AtomicU64::new(0),
        last: Mutex::new(Instant::now()),
        start,
    };
    let mut ran: Vec<(u64, SweepTotals)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= cfg.scenarios {
                            break mine;
                        }
                        let t = run_one(cfg, i);
                        progress.note(cfg, &t);
                        mine.push((i, t));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a sweep worker panicked"))
            .collect()
    });
    ran.sort_unstable_by_key(|(i, _)| *i);
    let mut t = SweepTotals::default();
    for (_, one) in &ran {
        t.absorb(one);
    }
    t.wall_s = start.elapsed().as_secs_f64();
    t
}

/// The sweep's progress line on stderr (every 2 s, from whichever worker
/// finishes a scenario then).
struct Progress {
    done: AtomicU64,
    violations: AtomicU64,
    last: Mutex<Instant>,
    start: Instant,
}

impl Progress {
    fn note(&self, cfg: &SweepConfig, one: &SweepTotals) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let violations =
            self.violations.fetch_add(one.violations, Ordering::Relaxed) + one.violations;
        if !cfg.progress {
            return;
        }
        let Ok(mut last) = self.last.try_lock() else {
            return;
        };
        if last.elapsed() > Duration::from_secs(2) {
            *last = Instant::now();
            eprintln!(
                "  {done}/{} scenarios, {violations} violations, {:.0} s",
                cfg.scenarios,
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

/// How many failing (and unfair) runs a sweep's totals keep for
/// reproduction.
const KEEP_RUNS: usize = 5;

impl SweepTotals {
    /// Adds the totals of scenarios run after these.
    fn absorb(&mut self, o: &SweepTotals) {
        self.scenarios += o.scenarios;
        self.bytes_verified += o.bytes_verified;
        self.bytes_lost += o.bytes_lost;
        self.bytes_duplicated += o.bytes_duplicated;
        self.bytes_misordered += o.bytes_misordered;
        self.violations += o.violations;
        self.messages_ok += o.messages_ok;
        self.messages_failed_as_injected += o.messages_failed_as_injected;
        self.events += o.events;
        self.wan_key_updates += o.wan_key_updates;
        self.planned_restarts += o.planned_restarts;
        self.planned_restarts_clean += o.planned_restarts_clean;
        self.standby_takeovers += o.standby_takeovers;
        self.oversubscribed += o.oversubscribed;
        self.min_share = match (self.min_share, o.min_share) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.unfair += o.unfair;
        self.fair_span_short += o.fair_span_short;
        for (mine, theirs) in [
            (&mut self.unfair_runs, &o.unfair_runs),
            (&mut self.failures, &o.failures),
            (&mut self.drain_timeouts, &o.drain_timeouts),
        ] {
            let room = KEEP_RUNS.saturating_sub(mine.len());
            mine.extend(theirs.iter().take(room).cloned());
        }
    }
}

/// Scenario `i` of the sweep, as totals of one scenario.
fn run_one(cfg: &SweepConfig, i: u64) -> SweepTotals {
    let seed = cfg.seed.wrapping_add(i);
    let mut t = SweepTotals {
        scenarios: 1,
        ..SweepTotals::default()
    };
    // Every `oversub_every`-th scenario: an over-subscribed one, from
    // its own stream of the seed (the ordinary scenario of a seed is
    // the same whatever the sweep's mix).
    let over = cfg.oversub_every > 0 && i % cfg.oversub_every == cfg.oversub_every - 1;
    let mut s = if over {
        t.oversubscribed = 1;
        oversubscribed_scenario(seed, cfg.endpoint)
    } else {
        sweep_scenario(seed, cfg.endpoint, cfg.dc_loss)
    };
    s.key_update_interval = cfg.key_update_interval;
    if cfg.standby_deaths && !over {
        with_standby_death(&mut s, seed);
    }
    let kind = if over { "over-subscribed seed" } else { "seed" };
    if cfg.verbose {
        eprintln!("seed {seed}: {s:?}");
    }
    match run(&s) {
        Ok(o) => {
            t.bytes_verified = o.bytes_verified;
            t.bytes_lost = o.bytes_lost;
            t.bytes_duplicated = o.bytes_duplicated;
            t.bytes_misordered = o.bytes_misordered;
            t.messages_ok = o.messages_ok;
            t.messages_failed_as_injected = o.messages_failed;
            t.events = o.events;
            t.wan_key_updates = o.wan_key_updates;
            t.planned_restarts = u64::from(o.restart_clean.is_some());
            t.planned_restarts_clean = u64::from(o.restart_clean == Some(true));
            t.standby_takeovers = u64::from(o.standby_lost_on_mirror.is_some());
            if o.restart_clean == Some(false) {
                t.drain_timeouts.push(format!("{kind} {seed}"));
            }
            t.min_share = o.min_share;
            t.fair_span_short = u64::from(o.fair_span_short);
            if let Some(u) = &o.unfair {
                t.unfair = 1;
                t.unfair_runs.push(format!("{kind} {seed}: {u}"));
            }
            if !o.violations.is_empty() {
                t.violations = o.violations.len() as u64;
                let line = format!("{kind} {seed}: {:?} -> {:?}", s, o.violations);
                if cfg.verbose {
                    eprintln!("{line}");
                }
                t.failures.push(line);
            }
        }
        Err(e) => {
            t.violations = 1;
            t.failures
                .push(format!("{kind} {seed}: could not build: {e}"));
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same scenarios on one worker and on three give the same totals,
    /// in the same order (the first failing and unfair runs included):
    /// a sweep's verdict must not depend on the machine's cores.
    #[test]
    fn sweep_is_the_same_on_one_thread_and_on_several() {
        let cfg = |threads| SweepConfig {
            scenarios: 24,
            seed: 7,
            progress: false,
            verbose: false,
            dc_loss: true,
            endpoint: Default::default(),
            key_update_interval: None,
            oversub_every: 6,
            standby_deaths: false,
            threads,
        };
        let mut one = sweep(&cfg(1));
        let mut three = sweep(&cfg(3));
        one.wall_s = 0.0;
        three.wall_s = 0.0;
        assert_eq!(one.oversubscribed, 4);
        assert!(one.messages_ok > 0);
        assert_eq!(format!("{one:?}"), format!("{three:?}"));
    }

    #[test]
    fn absorbing_keeps_the_first_few_runs_in_order() {
        let run = |n: u64| SweepTotals {
            scenarios: 1,
            violations: 1,
            min_share: Some(1.0 / n as f64),
            failures: vec![format!("seed {n}")],
            ..SweepTotals::default()
        };
        let mut t = SweepTotals::default();
        for n in 1..=7 {
            t.absorb(&run(n));
        }
        assert_eq!((t.scenarios, t.violations), (7, 7));
        assert_eq!(t.min_share, Some(1.0 / 7.0));
        let kept: Vec<_> = (1..=5).map(|n| format!("seed {n}")).collect();
        assert_eq!(t.failures, kept);
    }
}
