//! `soya-sim allreduce`'s report: the three cases (0 km, direct at the
//! distance, through Sōya) next to `soya plan`'s prediction.

use std::process::ExitCode;

use serde_json::json;
use soya_proto::plan::{self, JobArgs, PlanArgs};

use super::allreduce::{run_case, window_packets, AllreduceConfig, Case, RingOutcome};

/// What `soya plan` predicts for the same inputs: (through Sōya, direct)
/// communication ms per AllReduce, and the plan itself.
pub fn plan_for(c: &AllreduceConfig) -> Result<(f64, Option<f64>, plan::Plan), String> {
    let a = PlanArgs {
        distance_km: Some(c.distance_km),
        rtt_ms: None,
        link_gbps: c.link_gbps,
        paths: c.paths,
        loss: c.loss,
        mtu: c.mtu as u32,
        tx_depth: window_packets(c),
        qps: c.channels * c.nccl.qps_per_conn,
        dc_rtt_us: plan::DEFAULT_DC_RTT_US,
        safety_factor: soya_config::DEFAULT_SAFETY_FACTOR,
        requester_window: soya_config::DEFAULT_REQUESTER_WINDOW,
        requesters: soya_config::DEFAULT_REQUESTERS,
        json: false,
        job: Some(JobArgs {
            gpus: c.gpus(),
            // The gradient in bytes: one byte per "parameter".
            params: c.gradient_bytes as f64,
            bytes_per_param: 1,
            // Not simulated: only the communication time is compared.
            backward_ms: 1.0,
            nccl_buffsize: Some(u64::from(c.nccl.buffsize)),
            channels: Some(c.channels),
        }),
    };
    let p = plan::plan(&a).map_err(|e| format!("soya plan refused the inputs: {e}"))?;
    let w = p.workload.as_ref().ok_or("the plan has no workload")?;
    Ok((w.comm_ms, w.direct_comm_ms, p))
}

/// The three cases: direct at 0 km (lossless), direct at the distance,
/// through Sōya at the distance.
pub fn cases(c: &AllreduceConfig) -> [(&'static str, Case); 3] {
    [
        (
            "direct, 0 km",
            Case {
                distance_km: 0.0,
                accelerated: false,
                loss: 0.0,
            },
        ),
        (
            "direct",
            Case {
                distance_km: c.distance_km,
                accelerated: false,
                loss: c.loss,
            },
        ),
        (
            "through Sōya",
            Case {
                distance_km: c.distance_km,
                accelerated: true,
                loss: c.loss,
            },
        ),
    ]
}

/// Runs the three cases; returns their outcomes and the JSON object
/// `--json` prints (`comm_ms_0km`, `comm_ms_direct`, `comm_ms_soya`,
/// `plan_comm_ms`, ...; every violation of any case in `violations`).
/// With several collectives `comm_ms_*` are the steady state (the mean of
/// collectives 2..K), `first_comm_ms_*` the first, `collective_ms_*` each.
pub fn simulate(
    c: &AllreduceConfig,
    progress: bool,
) -> Result<(Vec<RingOutcome>, serde_json::Value), String> {
    let (plan_ms, plan_direct_ms, _plan) = plan_for(c)?;
    let mut res: Vec<RingOutcome> = Vec::new();
    for (name, case) in cases(c) {
        if progress {
            eprintln!("running {name} ...");
        }
        res.push(run_case(c, case)?);
    }
    let (zero, direct, soya) = (&res[0], &res[1], &res[2]);
    let violations: Vec<String> = cases(c)
        .iter()
        .zip(&res)
        .flat_map(|((name, _), o)| o.violations.iter().map(move |v| format!("{name}: {v}")))
        .collect();
    let v = json!({
        "gpus_per_site": c.gpus_per_site,
        "gpus": c.gpus(),
        "gradient_bytes": c.gradient_bytes,
        "distance_km": c.distance_km,
        "rtt_ms": 2.0 * c.distance_km * 4.9e-3,
        "link_gbps": c.link_gbps,
        "paths": c.paths,
        "loss": c.loss,
        "endpoint": c.endpoint,
        "channels": c.channels,
        "qps_per_connection": c.nccl.qps_per_conn,
        "nccl_buffsize": c.nccl.buffsize,
        "chunk_bytes": c.nccl.step_bytes(),
        "intra_gbps": c.intra_gbps,
        "intra_latency_us": c.intra_latency.as_secs_f64() * 1e6,
        "steps": c.steps(),
        "wan_bytes_per_direction": c.wan_bytes_per_direction(),
        "wire_bound_ms": c.wire_bound_ms(),
        "comm_ms_0km": zero.comm_ms,
        "comm_ms_direct": direct.comm_ms,
        "comm_ms_soya": soya.comm_ms,
        "soya_over_0km": soya.comm_ms / zero.comm_ms,
        "collectives": c.collectives,
        "grants_across_collectives": c.grants_across_collectives,
        "first_comm_ms_0km": zero.first_comm_ms,
        "first_comm_ms_direct": direct.first_comm_ms,
        "first_comm_ms_soya": soya.first_comm_ms,
        "first_soya_over_0km": soya.first_comm_ms / zero.first_comm_ms,
        "collective_ms_0km": zero.collective_ms,
        "collective_ms_direct": direct.collective_ms,
        "collective_ms_soya": soya.collective_ms,
        "plan_comm_ms": plan_ms,
        "plan_direct_comm_ms": plan_direct_ms,
        "plan_over_soya": plan_ms / soya.comm_ms,
        "events": res.iter().map(|o| o.events).sum::<u64>(),
        "wall_s": res.iter().map(|o| o.wall_s).sum::<f64>(),
        "violations": violations,
        "runs": { "0km": zero, "direct": direct, "soya": soya },
    });
    Ok((res, v))
}

/// Runs the three cases and prints them; the exit code says whether every
/// invariant held.
pub fn report(c: &AllreduceConfig, json_out: bool) -> ExitCode {
    let wall = std::time::Instant::now();
    let (res, v) = match simulate(c, !json_out) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soya-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let violations: Vec<String> = v["violations"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if json_out {
        println!("{v}");
    } else {
        let zero = &res[0];
        let rtt_ms = 2.0 * c.distance_km * 4.9e-3;
        println!(
            "ring AllReduce, 2 × {} GPUs, {} B of gradients ({} steps, {} B per WAN \
             direction), {} channel(s) × {} QP(s), NCCL_BUFFSIZE {} B ({} B chunks), \
             {} endpoints\nWAN {} × {} Gbit/s, {} km (RTT {:.2} ms), loss {}; intra-site \
             {} Gbit/s + {:.1} µs per hop (idealised)\n",
            c.gpus_per_site,
            c.gradient_bytes,
            c.steps(),
            c.wan_bytes_per_direction(),
            c.channels,
            c.nccl.qps_per_conn,
            c.nccl.buffsize,
            c.nccl.step_bytes(),
            format!("{:?}", c.endpoint).to_lowercase(),
            c.paths,
            c.link_gbps,
            c.distance_km,
            rtt_ms,
            c.loss,
            c.intra_gbps,
            c.intra_latency.as_secs_f64() * 1e6,
        );
        println!(
            "{:<16} {:>12} {:>10} {:>10} {:>10} {:>14} {:>11}",
            "", "comm ms", "× 0 km", "retrans", "timeouts", "verified B", "events/s"
        );
        for ((name, _), o) in cases(c).iter().zip(&res) {
            let (ms, x) = if o.finished && zero.finished {
                (
                    format!("{:.3}", o.comm_ms),
                    format!("{:.3}", o.comm_ms / zero.comm_ms),
                )
            } else if o.finished {
                (format!("{:.3}", o.comm_ms), "-".into())
            } else {
                ("unfinished".into(), "-".into())
            };
            println!(
                "{:<16} {:>12} {:>10} {:>10} {:>10} {:>14} {:>11.0}",
                name,
                ms,
                x,
                o.requester_retransmissions,
                o.requester_timeouts,
                o.wan_bytes_verified,
                o.events_per_wall_s
            );
        }
        if c.collectives > 1 {
            println!(
                "\n{} collectives back to back: comm ms above is the mean of collectives \
                 2..{}; the first alone, and each:",
                c.collectives, c.collectives
            );
            for ((name, _), o) in cases(c).iter().zip(&res) {
                let each: Vec<String> = o.collective_ms.iter().map(|m| format!("{m:.3}")).collect();
                println!(
                    "{:<16} first {:.3} ms ({:.3} × 0 km's first); each: {}",
                    name,
                    o.first_comm_ms,
                    o.first_comm_ms / zero.first_comm_ms,
                    each.join(" ")
                );
            }
        }
        let plan_ms = v["plan_comm_ms"].as_f64().unwrap_or(f64::NAN);
        println!(
            "\nsoya plan predicts {:.3} ms through Sōya ({:+.1} % of the simulation), {} \
             direct; the WAN's line rate alone needs {:.3} ms",
            plan_ms,
            (plan_ms / res[2].comm_ms - 1.0) * 100.0,
            v["plan_direct_comm_ms"]
                .as_f64()
                .map_or("nothing".into(), |d| format!("{d:.3} ms")),
            c.wire_bound_ms()
        );
    }
    super::conclude(json_out, wall, &violations)
}
