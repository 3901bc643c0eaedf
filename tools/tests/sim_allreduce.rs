//! `soya-sim allreduce`: a small ring AllReduce (2 × 2 GPUs, a few MB)
//! whose two WAN edges are NCCL-style connections carried by the real RC
//! endpoints and, in the third case, the real gateways. Virtual time: the
//! figures are deterministic, and no check depends on the machine's speed.

use std::process::Command;
use std::time::Duration;

use soya_tools::rc::hw::EndpointModel;
use soya_tools::sim::allreduce::{run_case, AllreduceConfig, Case};
use soya_tools::sim::allreduce_cli::simulate;
use soya_tools::sim::nccl::NcclParams;

fn small() -> AllreduceConfig {
    AllreduceConfig {
        gpus_per_site: 2,
        gradient_bytes: 4 << 20,
        distance_km: 300.0,
        link_gbps: 10.0,
        paths: 1,
        loss: 0.0,
        endpoint: EndpointModel::Hw,
        channels: 2,
        nccl: NcclParams {
            buffsize: 1 << 20,
            qps_per_conn: 2,
        },
        intra_gbps: 10.0,
        intra_latency: Duration::from_micros(5),
        dc_gbps: 100.0,
        mtu: 4096,
        seed: 7,
    }
}

#[test]
fn a_small_allreduce_moves_every_step_verified_and_its_figures_are_consistent() {
    let c = small();
    let (runs, v) = simulate(&c, false).expect("runs");
    assert_eq!(v["violations"].as_array().map(Vec::len), Some(0), "{v:#}");
    // 2(N − 1) steps of gradient/N per channel, every chunk on every edge,
    // and every WAN byte placed and checked against the pattern.
    assert_eq!(c.steps(), 6);
    let seg = c.channel_segment();
    let chunks_per_step = seg.div_ceil(u64::from(c.nccl.step_bytes()));
    let want = 6 * seg * u64::from(c.channels);
    assert_eq!(want, c.wan_bytes_per_direction());
    assert!(
        want >= 6 * (4 << 20) / 4,
        "at least 2(N−1)/N of the gradient"
    );
    for o in &runs {
        assert_eq!(o.steps, 6);
        assert_eq!(o.chunks_per_edge, 6 * chunks_per_step);
        assert_eq!(o.wan_bytes_verified, want);
        assert_eq!(o.wan_bytes_placed, want);
        assert_eq!((o.data_errors, o.failures), (0, 0));
    }
    // The figures: every key, and what must hold between them.
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing: {v:#}"))
    };
    let (zero, direct, soya, plan) = (
        f("comm_ms_0km"),
        f("comm_ms_direct"),
        f("comm_ms_soya"),
        f("plan_comm_ms"),
    );
    let bound = c.wire_bound_ms();
    assert!((f("wire_bound_ms") - bound).abs() < 1e-9);
    // No case beats the WAN's line rate; distance only adds.
    assert!(zero >= bound, "0 km {zero} ms < line-rate bound {bound} ms");
    assert!(soya >= bound, "Sōya {soya} ms < line-rate bound {bound} ms");
    assert!(direct >= zero, "direct {direct} ms < 0 km {zero} ms");
    assert!(soya >= zero, "Sōya {soya} ms < 0 km {zero} ms");
    // At 300 km one WAN crossing (1.47 ms) at least is added to the 0 km
    // time: the last chunk crosses after the first.
    assert!(direct >= zero + 1.4 && soya >= zero + 1.4, "{v:#}");
    assert!(plan > 0.0 && plan.is_finite());
    assert!(runs[2].pseudo_acks > 0, "the gateways pseudo-ACKed");
    assert_eq!(runs[1].pseudo_acks, 0, "no gateway on the direct path");
}

/// A WAN edge that loses data for good must not pass: the RC endpoints
/// recover loss, so the way to lose data is to sever the WAN for longer
/// than the hardware requester's retry budget; the AllReduce then cannot
/// complete, and the run says so instead of reporting a time.
#[test]
fn a_wan_edge_that_never_delivers_is_a_violation_not_a_figure() {
    let mut c = small();
    c.loss = 0.999_999;
    c.gradient_bytes = 1 << 20;
    let o = run_case(
        &c,
        Case {
            distance_km: 300.0,
            accelerated: false,
            loss: c.loss,
        },
    )
    .expect("runs");
    assert!(!o.violations.is_empty(), "{o:?}");
    assert!(o.wan_bytes_verified < c.wan_bytes_per_direction());
}

#[test]
fn the_cli_prints_the_json_keys() {
    let out = Command::new(env!("CARGO_BIN_EXE_soya-sim"))
        .args([
            "allreduce",
            "--gpus-per-site",
            "1",
            "--gradient-bytes",
            "1e6",
            "--link-gbps",
            "10",
            "--channels",
            "1",
            "--nccl-buffsize",
            "262144",
            "--json",
        ])
        .output()
        .expect("soya-sim runs");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for k in [
        "comm_ms_0km",
        "comm_ms_direct",
        "comm_ms_soya",
        "plan_comm_ms",
        "wire_bound_ms",
        "steps",
    ] {
        assert!(v[k].as_f64().is_some(), "{k} missing: {v:#}");
    }
    assert_eq!(v["steps"], 2, "2 GPUs: 2(N − 1) = 2 steps");
}
