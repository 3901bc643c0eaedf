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
        collectives: 1,
        grants_across_collectives: false,
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

/// One WAN crossing at 300 km (4.9 µs per km).
const ONE_WAY: Duration = Duration::from_micros(1470);

fn back_to_back(across: bool) -> (AllreduceConfig, soya_tools::sim::allreduce::RingOutcome) {
    let mut c = small();
    c.collectives = 3;
    c.grants_across_collectives = across;
    // 4 MiB per connection: NCCL's buffers (8 MiB per round trip over the
    // two channels, 22.8 Gbit/s) are no bound at 10 Gbit/s, so what is
    // left between collectives is the grant's crossing itself.
    c.nccl.buffsize = 4 << 20;
    let o = run_case(
        &c,
        Case {
            distance_km: 300.0,
            accelerated: true,
            loss: 0.0,
        },
    )
    .expect("runs");
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    // Every chunk of every step of all three collectives, verified.
    let chunks_per_step = c.channel_segment().div_ceil(u64::from(c.nccl.step_bytes()));
    assert_eq!(o.chunks_per_edge, 6 * chunks_per_step);
    assert_eq!(o.wan_bytes_verified, 3 * c.wan_bytes_per_direction());
    assert_eq!(o.collective_ms.len(), 3);
    // No collective beats the WAN's line rate.
    let bound = c.wire_bound_ms();
    for m in &o.collective_ms {
        assert!(*m >= bound, "a collective took {m} ms < {bound} ms: {o:?}");
    }
    assert!((o.first_comm_ms - o.collective_ms[0]).abs() < 1e-12);
    let mean = (o.collective_ms[1] + o.collective_ms[2]) / 2.0;
    assert!(
        (o.comm_ms - mean).abs() < 1e-9,
        "comm_ms is the steady state"
    );
    assert_eq!(o.wan_trace.len(), 2 * c.channels as usize);
    (c, o)
}

/// Back-to-back AllReduces as NCCL runs them: each collective is one proxy
/// operation per connection, and the proxy starts a connection's next one
/// only once the previous one is done. So on every WAN edge the receiver
/// grants collective j's first buffer at the very event its GPU consumed
/// collective j − 1's last chunk (not before: that would be a pre-grant
/// NCCL does not make; not after: a wait that is not there), the grant
/// crosses the WAN, and the sender posts the chunk at the first moment it
/// has both the grant and the data (its GPU started collective j).
#[test]
fn back_to_back_collectives_grant_as_nccl_does_one_operation_at_a_time() {
    let (_, o) = back_to_back(false);
    for t in &o.wan_trace {
        for j in 1..3 {
            assert_eq!(
                t.first_grant[j],
                t.last_arrival[j - 1],
                "collective {j}'s first grant, edge {t:?}"
            );
            assert!(
                t.first_grant_seen[j] >= t.first_grant[j] + ONE_WAY,
                "the grant crosses the WAN: {t:?}"
            );
            assert_eq!(
                t.first_post[j],
                t.first_grant_seen[j].max(t.gpu_start[j]),
                "collective {j}'s first chunk waited for nothing else: {t:?}"
            );
        }
    }
}

/// The what-if (`--grants-across-collectives`): receivers grant the next
/// collective's buffers as soon as they are free. Then collective 2 and 3
/// start their WAN data without waiting for any grant issued after they
/// started: every first grant was issued, and had crossed, before the
/// sending GPU started the collective, which posts its first chunk the
/// moment it starts; and the steady state gains at least one crossing over
/// NCCL's per-operation grants.
#[test]
fn grants_across_collectives_let_the_next_one_start_without_a_grant_round_trip() {
    let (_, nccl) = back_to_back(false);
    let (_, o) = back_to_back(true);
    for t in &o.wan_trace {
        for j in 1..3 {
            assert!(t.first_grant[j] < t.gpu_start[j], "{j}: {t:?}");
            assert!(t.first_grant_seen[j] <= t.gpu_start[j], "{j}: {t:?}");
            assert_eq!(t.first_post[j], t.gpu_start[j], "{j}: {t:?}");
        }
    }
    let one_way_ms = ONE_WAY.as_secs_f64() * 1e3;
    assert!(
        o.comm_ms + one_way_ms <= nccl.comm_ms,
        "what-if {} ms vs NCCL {} ms",
        o.comm_ms,
        nccl.comm_ms
    );
}
