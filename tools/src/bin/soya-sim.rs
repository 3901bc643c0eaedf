//! `soya-sim`: drive the real gateway state machines through a simulated
//! 300 km WAN in virtual time.

#![deny(unsafe_code)]

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use serde_json::json;
use soya_config::AckPolicy;
use soya_tools::rc::hw::EndpointModel;
use soya_tools::sim::scenario::{self, Op, Scenario};
use soya_tools::sim::sweep::{self, SweepConfig};

/// Deterministic simulator for Sōya: RC endpoints modelled on Linux rxe,
/// the real pseudo-ACK engine, and a WAN with delay, loss and reordering,
/// all in virtual time.
#[derive(Parser)]
#[command(name = "soya-sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure one workload three ways in one run: direct at 0 km, direct at
    /// the distance, and through the gateways at the distance.
    Run(RunArgs),
    /// Run many randomized scenarios and check every invariant.
    Sweep(SweepArgs),
    /// A ring AllReduce between two sites (NCCL-style traffic on the two
    /// ring edges that cross the WAN): communication time at 0 km, direct
    /// at the distance and through Sōya, next to `soya plan`'s prediction.
    Allreduce(AllreduceArgs),
}

#[derive(clap::Args)]
struct AllreduceArgs {
    /// GPUs at each of the two sites (the ring has twice as many).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=512))]
    gpus_per_site: u32,
    /// Gradient bytes per GPU: the AllReduce's size (1e9 or 1000000000).
    #[arg(long, default_value = "1e9", value_parser = parse_bytes)]
    gradient_bytes: u64,
    /// Fibre distance between the sites (4.9 µs per km one way).
    #[arg(long, default_value_t = 300.0, value_parser = parse_km)]
    distance_km: f64,
    /// Rate of each WAN path, Gbit/s.
    #[arg(long, default_value_t = 400.0, value_parser = parse_gbps)]
    link_gbps: f64,
    /// WAN paths between the gateways.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    paths: u32,
    /// Random loss on the WAN (direct and through Sōya alike).
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    loss: f64,
    /// RC endpoints: hw (ConnectX-class) or rxe.
    #[arg(long, default_value = "hw")]
    endpoint: EndpointModel,
    /// NCCL channels: rings side by side, each with its own connection
    /// (and buffer) per WAN edge.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    channels: u32,
    /// NCCL_IB_QPS_PER_CONNECTION.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    qps_per_connection: u32,
    /// NCCL_BUFFSIZE in bytes (NCCL's default 4 MiB: 512 KiB chunks).
    #[arg(long, default_value_t = soya_tools::sim::nccl::DEFAULT_BUFFSIZE,
          value_parser = clap::value_parser!(u32).range(8192..=(1 << 30)))]
    nccl_buffsize: u32,
    /// Intra-site hop rate, Gbit/s, shared by the channels (default: the
    /// WAN's, paths × link).
    #[arg(long, value_parser = parse_gbps)]
    intra_gbps: Option<f64>,
    /// Intra-site hop one-way latency, µs.
    #[arg(long, default_value_t = 5.0)]
    intra_latency_us: f64,
    /// Host NIC / DC link rate, Gbit/s (default: the WAN's, at least 100).
    #[arg(long, value_parser = parse_gbps)]
    dc_gbps: Option<f64>,
    /// Path MTU in bytes.
    #[arg(long, default_value_t = 4096, value_parser = parse_mtu)]
    mtu: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// AllReduces run back to back on the same connections, as a training
    /// job's steps (or gradient buckets) are: each GPU starts the next as
    /// soon as its kernel for the previous one ended, and each connection
    /// runs them one after the other, as NCCL's proxy does. With K > 1,
    /// comm_ms_0km, comm_ms_direct, comm_ms_soya (and soya_over_0km,
    /// plan_over_soya) are the steady state, the mean time per collective
    /// of collectives 2..K; first_comm_ms_* is the first one alone and
    /// collective_ms_* every one.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    collectives: u32,
    /// What-if, not NCCL's behaviour: receivers grant the next collective's
    /// buffers while the previous one still runs (NCCL's proxy starts a
    /// connection's next operation only once the previous one is done).
    #[arg(long)]
    grants_across_collectives: bool,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    match s.parse::<f64>() {
        Ok(v) if (1.0..=1e13).contains(&v) && v.fract() == 0.0 => Ok(v as u64),
        _ => Err("bytes must be a whole number from 1 to 1e13 (e.g. 1e9)".into()),
    }
}

fn allreduce(a: AllreduceArgs) -> ExitCode {
    use soya_tools::sim::allreduce::AllreduceConfig;
    use soya_tools::sim::nccl::NcclParams;
    let wan = a.link_gbps * f64::from(a.paths);
    let c = AllreduceConfig {
        gpus_per_site: a.gpus_per_site,
        gradient_bytes: a.gradient_bytes,
        distance_km: a.distance_km,
        link_gbps: a.link_gbps,
        paths: a.paths,
        loss: a.loss,
        endpoint: a.endpoint,
        channels: a.channels,
        nccl: NcclParams {
            buffsize: a.nccl_buffsize,
            qps_per_conn: a.qps_per_connection,
        },
        intra_gbps: a.intra_gbps.unwrap_or(wan),
        intra_latency: std::time::Duration::from_secs_f64(a.intra_latency_us.max(0.0) * 1e-6),
        dc_gbps: a.dc_gbps.unwrap_or(wan.max(100.0)),
        mtu: a.mtu,
        seed: a.seed,
        collectives: a.collectives,
        grants_across_collectives: a.grants_across_collectives,
    };
    soya_tools::sim::allreduce_cli::report(&c, a.json)
}

#[derive(clap::Args)]
struct RunArgs {
    /// Fibre distance between the sites (4.9 µs per km one way).
    #[arg(long, default_value_t = 300.0, value_parser = parse_km)]
    distance_km: f64,
    /// RDMA operation.
    #[arg(long, default_value = "write")]
    op: Op,
    /// Message size in bytes.
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1..=(1 << 30)))]
    size: u32,
    /// Outstanding work requests per QP.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=4096))]
    tx_depth: u32,
    /// Parallel QPs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    qps: u32,
    /// RC endpoints: `rxe` (Linux Soft-RoCE: 128-PSN window) or `hw`
    /// (ConnectX-class: send-queue windows, adaptive retransmission timer,
    /// DCQCN, line-rate port; docs/roce-notes.md).
    #[arg(long, default_value = "rxe")]
    endpoint: EndpointModel,
    /// Hardware endpoints connect without RDMA-CM (QPNs exchanged out of
    /// band, as NCCL does): min_rnr_timer 12 instead of RDMA-CM's 0 (655 ms).
    #[arg(long)]
    no_rdma_cm: bool,
    /// The gateways' deep buffer in slots of 4,608 B (default: the size a
    /// daemon picks with `buffer.size = "auto"` for the scenario's paths,
    /// 2 × BDP + 16 requester windows of 8 MiB, as `soya plan` prints).
    #[arg(long)]
    buffer_slots: Option<usize>,
    /// Host NIC / datacenter link rate in Gbit/s (default: the larger of
    /// 100 and the sum of the WAN paths).
    #[arg(long, value_parser = parse_gbps)]
    dc_gbps: Option<f64>,
    /// Messages per QP (default: enough for 256 MiB per QP).
    #[arg(long)]
    iters: Option<u32>,
    /// Path MTU in bytes (1024, 2048 or 4096).
    #[arg(long, default_value_t = 4096, value_parser = parse_mtu)]
    mtu: usize,
    /// WAN capacity in Gbit/s.
    #[arg(long = "path-gbps", default_value_t = 10.0, value_parser = parse_gbps)]
    path_gbps: f64,
    /// Random loss probability on every WAN path (0..1), for the direct
    /// path and through Sōya alike.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    loss: f64,
    /// WAN paths between the gateways, each of --path-gbps.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    paths: u32,
    /// Cut path 0 at this many seconds into the run...
    #[arg(long)]
    cut_path_at: Option<f64>,
    /// ...for this many seconds.
    #[arg(long, default_value_t = 1.0)]
    cut_for: f64,
    /// Crash gateway B this many seconds into the run and start a new one
    /// at once: gateway A resends what B had not delivered, and nothing may
    /// fail (issue 35). With --restart-near, A crashes instead: its flows
    /// fail, never silently. With --standby, the gateway does not come back
    /// and its standby takes over (issue 38).
    #[arg(long)]
    twin_restart_at: Option<f64>,
    /// With --twin-restart-at: restart the requester's own (near) gateway
    /// instead of the far one; its new incarnation must learn from the
    /// twin which of its requesters it had pseudo-ACKed.
    #[arg(long, requires = "twin_restart_at")]
    restart_near: bool,
    /// With --twin-restart-at: a planned restart (`systemctl restart`:
    /// SIGTERM, a drain, CLOSE "restart", a new process at once) instead of
    /// a crash; nothing may fail. Reports the drain's outcome and the pause.
    #[arg(long, requires = "twin_restart_at")]
    planned: bool,
    /// Give each gateway a standby that replays every call it is given
    /// (issue 38). With --twin-restart-at T, the gateway that dies at T
    /// (B, or A with --restart-near) does not come back: its standby takes
    /// over, and nothing may fail.
    #[arg(long, conflicts_with = "planned")]
    standby: bool,
    /// With --standby: one-way delay of the mirror link, microseconds (what
    /// A sends waits twice this: the standby must have its inputs first).
    #[arg(long, default_value_t = 5.0, requires = "standby")]
    mirror_us: f64,
    /// With --standby: from a gateway's death to its standby receiving in
    /// its place (detection and moving the addresses), milliseconds.
    #[arg(long, default_value_t = 1.0, requires = "standby")]
    takeover_ms: f64,
    /// Pseudo-ACK policy of the gateways.
    #[arg(long, default_value = "edge", value_parser = parse_policy)]
    policy: AckPolicy,
    /// The gateways replace their WAN sending keys every this many
    /// milliseconds of virtual time, as soon as allowed (default: the
    /// daemon's, every 2^22 packets or 2 minutes).
    #[arg(long, value_parser = parse_key_update_ms)]
    key_update_ms: Option<f64>,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct SweepArgs {
    /// How many randomized scenarios.
    #[arg(long, default_value_t = 1000)]
    scenarios: u64,
    /// First seed; scenario i uses seed + i.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One JSON object instead of a summary.
    #[arg(long)]
    json: bool,
    /// Print every scenario's parameters as it starts, and each failure.
    #[arg(long)]
    verbose: bool,
    /// Leave out packet loss inside the requester's datacenter (to tell
    /// a WAN-side failure from a DC-side one).
    #[arg(long)]
    no_dc_loss: bool,
    /// RC endpoints: rxe or hw.
    #[arg(long, default_value = "rxe")]
    endpoint: EndpointModel,
    /// Every scenario's gateways replace their WAN sending keys every this
    /// many milliseconds of virtual time, as soon as allowed.
    #[arg(long, value_parser = parse_key_update_ms)]
    key_update_ms: Option<f64>,
    /// Every this many scenarios, one is over-subscribed: 2-16 QPs whose
    /// hosts offer 2-16x the WAN for the whole transfer, with a small deep
    /// buffer; their shares of the WAN are checked too (each QP at least
    /// half an equal share). 0: none; 1: only those.
    #[arg(long, default_value_t = sweep::OVERSUB_EVERY)]
    oversub_every: u64,
    /// Every ordinary scenario through the gateways gives each gateway a
    /// standby and kills one at a random point (issue 38): nothing may
    /// fail.
    #[arg(long)]
    standby_deaths: bool,
    /// Scenarios run side by side on this many threads (each is its own
    /// deterministic world: the totals are the same whatever the number).
    /// 0: one per core this process may use.
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

fn parse_km(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=40_000.0).contains(&v) {
        Ok(v)
    } else {
        Err("distance must be 0..=40000 km".into())
    }
}
fn parse_mtu(s: &str) -> Result<usize, String> {
    match s.parse() {
        Ok(m @ (1024 | 2048 | 4096)) => Ok(m),
        _ => Err("MTU must be 1024, 2048 or 4096".into()),
    }
}
fn parse_gbps(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1000.0 => Ok(v),
        _ => Err("Gbit/s must be in (0, 1000]".into()),
    }
}
fn parse_prob(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..1.0).contains(&v) => Ok(v),
        _ => Err("probability must be in [0, 1)".into()),
    }
}
fn parse_key_update_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.001..=3_600_000.0).contains(&v) => Ok(v),
        _ => Err("milliseconds must be in [0.001, 3600000]".into()),
    }
}
fn key_update_interval(ms: Option<f64>) -> Option<std::time::Duration> {
    ms.map(|ms| std::time::Duration::from_secs_f64(ms / 1000.0))
}
fn parse_policy(s: &str) -> Result<AckPolicy, String> {
    match s {
        "edge" => Ok(AckPolicy::Edge),
        "strict" => Ok(AckPolicy::Strict),
        "off" => Ok(AckPolicy::Off),
        _ => Err("policy must be edge, strict or off".into()),
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(a) => run(a),
        Command::Sweep(a) => sweep_cmd(a),
        Command::Allreduce(a) => allreduce(a),
    }
}

fn run(a: RunArgs) -> ExitCode {
    let iters = a
        .iters
        .unwrap_or_else(|| ((256u64 << 20) / u64::from(a.size)).clamp(16, 1_000_000) as u32);
    // Virtual-time limit: generous against the slowest of the three runs,
    // the direct one, which rxe's 128-packet window bounds to
    // 128 × MTU per RTT (a 1 GiB transfer at 3,000 km takes ~60 s).
    let rtt_s = (2.0 * a.distance_km * 4.9e-6).max(1e-4);
    let window_bytes = match a.endpoint {
        EndpointModel::Rxe => 128.0 * a.mtu as f64,
        EndpointModel::Hw => f64::from(a.tx_depth) * f64::from(a.size),
    };
    // READs: at most max_rd_atomic (16) outstanding, whatever the model.
    let window_bytes = if a.op == Op::Read {
        window_bytes.min(16.0 * f64::from(a.size))
    } else {
        window_bytes
    };
    let window_bps = window_bytes * 8.0 / rtt_s;
    let bytes = f64::from(iters) * f64::from(a.size) * f64::from(a.qps.max(1));
    let slowest_s = bytes * 8.0 / window_bps.min(a.path_gbps * 1e9).max(1.0);
    let time_limit = std::time::Duration::from_secs_f64((4.0 * slowest_s + 10.0).max(20.0));
    let base = Scenario {
        seed: a.seed,
        time_limit,
        distance_km: a.distance_km,
        op: a.op,
        size: a.size,
        tx_depth: a.tx_depth,
        qps: a.qps,
        iters,
        mtu: a.mtu,
        wan_gbps: a.path_gbps,
        wan_loss: a.loss,
        policy: a.policy,
        paths: a.paths,
        endpoint: a.endpoint,
        rdma_cm: !a.no_rdma_cm,
        // RDMA-CM connects each QP through the gateways, which learn it
        // from the REQ/REP before its first packet (docs/roce-notes.md).
        cm_handshake: !a.no_rdma_cm,
        buffer_slots: a.buffer_slots,
        dc_gbps: a
            .dc_gbps
            .unwrap_or((a.path_gbps * f64::from(a.paths)).max(100.0)),
        twin_restart: a
            .twin_restart_at
            .map(|t| std::time::Duration::from_secs_f64(t.max(0.0))),
        restart_near: a.restart_near,
        planned_restart: a.planned,
        standby: a.standby.then(|| {
            (
                std::time::Duration::from_secs_f64(a.mirror_us.max(0.0) / 1e6),
                std::time::Duration::from_secs_f64(a.takeover_ms.max(0.0) / 1e3),
            )
        }),
        key_update_interval: key_update_interval(a.key_update_ms),
        cut_path: a.cut_path_at.map(|at| {
            (
                std::time::Duration::from_secs_f64(at.max(0.0)),
                std::time::Duration::from_secs_f64(a.cut_for.max(0.0)),
            )
        }),
        ..Scenario::default()
    };
    let cases = [
        (
            "direct, 0 km",
            Scenario {
                distance_km: 0.0,
                accelerated: false,
                wan_loss: 0.0,
                ..base.clone()
            },
        ),
        (
            "direct",
            Scenario {
                accelerated: false,
                ..base.clone()
            },
        ),
        (
            "through Sōya",
            Scenario {
                accelerated: true,
                ..base.clone()
            },
        ),
    ];
    let wall = Instant::now();
    let mut results = Vec::new();
    for (name, s) in &cases {
        if !a.json {
            eprintln!("running {name} ...");
        }
        match scenario::run(s) {
            Ok(o) => results.push(o),
            Err(e) => {
                eprintln!("soya-sim: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let rtt_ms = 2.0 * a.distance_km * 4.9e-3;
    let (zero, direct, accel) = (&results[0], &results[1], &results[2]);
    let violations: Vec<&String> = results.iter().flat_map(|o| o.violations.iter()).collect();
    if a.json {
        println!(
            "{}",
            json!({
                "distance_km": a.distance_km,
                "rtt_ms": rtt_ms,
                "op": a.op,
                "size": a.size,
                "tx_depth": a.tx_depth,
                "qps": a.qps,
                "endpoint": a.endpoint,
                // Verified bytes over each run's whole length; null for a
                // run that did not finish (`Outcome::goodput_gbps`).
                "direct_0km_gbps": zero.goodput_gbps,
                "direct_gbps": direct.goodput_gbps,
                "accelerated_gbps": accel.goodput_gbps,
                "accelerated_over_0km": ratio(accel, zero),
                "accelerated_over_direct": ratio(accel, direct),
                "paths": a.paths,
                "loss": a.loss,
                // Through Sōya: both gateways' per-flow state besides
                // buffers (`Outcome::state_bytes_per_qp`).
                "state_bytes_per_qp": accel.state_bytes_per_qp,
                "data_errors": results.iter().map(|o| o.data_errors).sum::<u64>(),
                "violations": violations,
                "runs": results,
            })
        );
    } else {
        println!(
            "{} of {} B, tx depth {}, {} QP(s), MTU {}, WAN {} Gbit/s, {} km (RTT {:.2} ms)\n",
            format!("{:?}", a.op).to_uppercase(),
            a.size,
            a.tx_depth,
            a.qps,
            a.mtu,
            a.path_gbps,
            a.distance_km,
            rtt_ms
        );
        println!(
            "{:<16} {:>10} {:>10} {:>12} {:>9} {:>9} {:>8} {:>7} {:>11}",
            "",
            "Gbit/s",
            "messages",
            "retransmits",
            "timeouts",
            "after ack",
            "withheld",
            "CNPs",
            "events/s"
        );
        for ((name, _), o) in cases.iter().zip(&results) {
            println!(
                "{:<16} {:>10} {:>10} {:>12} {:>9} {:>9} {:>8} {:>7} {:>11.0}",
                name,
                o.goodput_gbps
                    .map_or("unfinished".into(), |g| format!("{g:.3}")),
                o.messages_ok,
                o.requester_retransmissions,
                o.requester_timeouts,
                o.requester_timeouts_after_ack,
                o.pseudo_acks_withheld,
                o.cnps_sent,
                o.events_per_wall_s
            );
        }
        let shown = |r: Option<f64>, digits: usize| {
            r.map_or("- (a run did not finish)".into(), |r| {
                format!("{r:.digits$}")
            })
        };
        println!(
            "\nthrough Sōya ÷ direct at 0 km: {}   through Sōya ÷ direct at {} km: {}×",
            shown(ratio(accel, zero), 3),
            a.distance_km,
            shown(ratio(accel, direct), 2)
        );
        println!("(Gbit/s: bytes verified at their destination over each run's whole length)");
        for ((name, _), o) in cases.iter().zip(&results) {
            if !o.finished {
                println!(
                    "{name}: did not finish within {:.3} s of virtual time: no goodput",
                    o.elapsed_s
                );
            }
        }
        println!(
            "gateway state per QP, besides buffers: {} bytes (both gateways)",
            accel.state_bytes_per_qp
        );
        println!(
            "WAN key updates through Sōya: {} (both gateways), {} datagrams failed authentication",
            accel.wan_key_updates, accel.wan_auth_failures
        );
        if let Some([a, b]) = accel.standby_mirrored_bytes {
            let per = |x: u64| x as f64 / accel.bytes_verified.max(1) as f64;
            println!(
                "standbys: gateway A mirrored {a} bytes ({:.3} per byte verified), B {b} ({:.3}); \
                 each send held twice the mirror's one-way delay",
                per(a),
                per(b)
            );
        }
        if let Some(lost) = accel.standby_lost_on_mirror {
            println!(
                "gateway {} died; its standby took over: {lost} calls still on the mirror were \
                 lost, {} sends the dead one had not let out were made again, {} packets \
                 reached it while nobody was there",
                if a.restart_near { "A" } else { "B" },
                accel.standby_resent.unwrap_or(0),
                accel.lost_while_taking_over.unwrap_or(0)
            );
        }
    }
    soya_tools::sim::conclude(a.json, wall, &violations)
}

/// `a`'s goodput over `b`'s, when both finished.
fn ratio(a: &scenario::Outcome, b: &scenario::Outcome) -> Option<f64> {
    Some(a.goodput_gbps? / b.goodput_gbps?)
}

fn sweep_cmd(a: SweepArgs) -> ExitCode {
    let cfg = SweepConfig {
        scenarios: a.scenarios,
        seed: a.seed,
        progress: !a.json,
        verbose: a.verbose,
        dc_loss: !a.no_dc_loss,
        endpoint: a.endpoint,
        key_update_interval: key_update_interval(a.key_update_ms),
        oversub_every: a.oversub_every,
        standby_deaths: a.standby_deaths,
        threads: a.threads,
    };
    let t = sweep::sweep(&cfg);
    if a.json {
        println!("{}", serde_json::to_string(&t).expect("serializable"));
    } else {
        println!("{}", t.summary());
    }
    if t.violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
