//! `soya plan`, the capacity planner: its arithmetic against hand-computed
//! cases, the JSON keys, the table, and argument validation.
//!
//! Every expected number below is worked out by hand in the comment above it
//! (to more digits than the 1e-6 relative tolerance needs).

#![deny(unsafe_code)]

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use soya::plan::{self, Plan, PlanArgs};

/// The binary's command line for `soya plan` (the library has none).
#[path = "../src/plan_cli.rs"]
mod plan_cli;

/// `soya plan` as a standalone command, the way `main.rs` embeds it.
#[derive(Parser, Debug)]
#[command(name = "soya-plan")]
struct Cli {
    #[command(flatten)]
    args: plan_cli::PlanCli,
}

fn args(argv: &str) -> PlanArgs {
    let argv = std::iter::once("soya-plan").chain(argv.split_whitespace());
    match Cli::try_parse_from(argv) {
        Ok(cli) => cli
            .args
            .try_into()
            .expect("clap refuses a partial workload"),
        Err(e) => panic!("rejected: {e}"),
    }
}

fn plan_of(argv: &str) -> Plan {
    plan::plan(&args(argv)).expect("valid arguments")
}

fn parse_err(argv: &str) -> clap::Error {
    let argv = std::iter::once("soya-plan").chain(argv.split_whitespace());
    Cli::try_parse_from(argv).expect_err("must be rejected")
}

#[track_caller]
fn close(actual: f64, expected: f64) {
    let rel = ((actual - expected) / expected).abs();
    assert!(
        rel <= 1e-6,
        "got {actual}, expected {expected} (relative error {rel:e})"
    );
}

#[track_caller]
fn has(text: &str, needle: &str) {
    assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
}

const SAPPORO: &str = "--distance-km 300 --link-gbps 100";
const SAPPORO_JOB: &str =
    "--distance-km 300 --link-gbps 100 --gpus 16 --params 1e9 --bytes-per-param 4 --backward-ms 250";

// ---------------------------------------------------------------------------
// Arithmetic

#[test]
fn delay_bdp_and_buffer_at_300_km() {
    let p = plan_of(SAPPORO);
    // 300 km × 4.9 µs/km = 1470 µs one way; RTT twice that.
    close(p.one_way_ms, 1.47);
    close(p.rtt_ms, 2.94);
    close(p.wan_gbps, 100.0);
    // 100e9 bit/s × 2.94e-3 s = 294e6 bit = 36_750_000 B.
    assert_eq!(p.bdp_bytes, 36_750_000);
    // × 3.0 = 110_250_000 B, + 16 requesters × 2048 packets × 4608 B =
    // 150_994_944 B: 261_244_944 B = 249.14 MiB → 250 MiB.
    assert_eq!(p.buffer_bdp_part_bytes, 110_250_000);
    assert_eq!(p.buffer_reserve_bytes, 150_994_944);
    assert_eq!(p.buffer_bytes, 262_144_000);
    // Without the reserve: 110_250_000 B = 105.14 MiB → 106 MiB.
    let p = plan_of(&format!("{SAPPORO} --requesters 0"));
    assert_eq!(p.buffer_bytes, 106 * 1_048_576);
    // One 1 MiB window: 256 packets of 4 KiB, a 4,608 B slot each.
    let p = plan_of(&format!("{SAPPORO} --requesters 1 --requester-window 1MiB"));
    assert_eq!(p.buffer_reserve_bytes, 256 * 4608);
}

#[test]
fn goodput_direct_vs_soya_lossless() {
    let p = plan_of(SAPPORO);
    // 4096 / (4096 + 82) = 4096 / 4178 = 0.98037338439...
    close(p.wire_efficiency, 0.980_373_384_394_447);
    close(p.line_goodput_gbps, 98.037_338_439_444_7);
    // Window: 128 × 4096 B × 8 = 4_194_304 bit per 2.94 ms = 1.42663401 Gbit/s.
    close(p.direct_window_gbps, 1.426_634_013_605_442);
    close(p.direct_gbps, 1.426_634_013_605_442);
    // Through Sōya: 4_194_304 bit per 10 µs = 419.4304 Gbit/s, capped at the
    // line goodput 98.0373 Gbit/s.
    close(p.dc_window_gbps, 419.4304);
    close(p.accelerated_gbps, 98.037_338_439_444_7);
    // 98.0373384 / 1.4266340 = 68.7193334.
    close(p.speedup.unwrap(), 68.719_333_413_116_32);
    assert_eq!(p.window_loss_probability, 0.0);
}

#[test]
fn loss_costs_go_back_n_a_window_and_soya_one_packet() {
    let p = plan_of(&format!("{SAPPORO} --loss 0.001"));
    // (1 − 0.001)^128 = e^(128 × ln 0.999) = e^(−0.128064043) = 0.879797033
    // q = 1 − 0.879797033 = 0.120202967
    close(p.window_loss_probability, 0.120_202_967_235_903_7);
    // Window-limited, so one window takes c = RTT:
    // direct = W·MTU·8·(1 − q) / (RTT + q·RTT) = 1.42663401 × 0.879797033 / 1.120202967
    //        = 1.12046514 Gbit/s.
    close(p.direct_gbps, 1.120_465_137_766_484);
    // Sōya: 98.0373384 × (1 − 0.001) = 97.9393011 Gbit/s.
    close(p.accelerated_gbps, 97.939_301_101_005_27);
    // Loss changes neither the delay nor the buffer.
    let lossless = plan_of(SAPPORO);
    assert_eq!(
        (p.rtt_ms, p.bdp_bytes, p.buffer_bytes),
        (lossless.rtt_ms, lossless.bdp_bytes, lossless.buffer_bytes)
    );
}

#[test]
fn ring_allreduce_of_a_1b_parameter_job() {
    let p = plan_of(SAPPORO_JOB);
    let w = p.workload.as_ref().expect("workload options given");
    // 1e9 params × 4 B = 4e9 B of gradients.
    close(w.gradient_bytes, 4e9);
    // Ring AllReduce: 2 × (16 − 1)/16 × 4e9 = 7.5e9 B per GPU per step,
    // and the same 7.5e9 B over the WAN in each direction.
    close(w.allreduce_bytes_per_gpu, 7.5e9);
    close(w.wan_bytes_per_direction, 7.5e9);
    // Through Sōya: 7.5e9 × 8 = 6e10 bit at 100e9 × 4096/4178 bit/s
    //   = 6e10 × 4178 / 4.096e14 s = 0.61201171875 s.
    close(w.comm_ms, 612.011_718_75);
    // 612.01 ms > 250 ms of backward: the GPUs idle 362.01171875 ms.
    assert!(!w.hidden_by_backward);
    close(w.idle_ms, 362.011_718_75);
    // Direct: 6e10 bit at 4_194_304 bit / 2.94 ms = 6e10 × 0.00294 / 4_194_304 s
    //   = 176_400_000 / 2^22 s = 42.057037353515625 s.
    close(w.direct_comm_ms.unwrap(), 42_057.037_353_515_625);
    close(w.direct_idle_ms.unwrap(), 41_807.037_353_515_625);
    assert!(!w.direct_hidden_by_backward);
}

#[test]
fn allreduce_under_loss() {
    let p = plan_of(&format!("{SAPPORO_JOB} --loss 0.001"));
    let w = p.workload.unwrap();
    // 6e10 bit / 97.9393011 Gbit/s = 0.612624343 s.
    close(w.comm_ms, 612.624_343_093_093);
    // 6e10 bit / 1.12046514 Gbit/s = 53.5491895 s.
    close(w.direct_comm_ms.unwrap(), 53_549.189_508_566_91);
}

#[test]
fn two_paths_hide_a_bf16_job_behind_backward() {
    let p = plan_of(
        "--distance-km 300 --link-gbps 100 --paths 2 \
         --gpus 8 --params 1e9 --bytes-per-param 2 --backward-ms 200",
    );
    // BDP over both paths: 200e9 × 2.94e-3 / 8 = 73_500_000 B.
    assert_eq!(p.bdp_bytes, 73_500_000);
    // × 3 = 220_500_000 B, + 150_994_944 B = 371_494_944 B = 354.28 MiB
    //   → 355 MiB.
    assert_eq!(p.buffer_bytes, 355 * 1_048_576);
    // Sōya stripes over both: 2 × 98.0373384 = 196.0746769 Gbit/s (the 419
    // Gbit/s DC window is not the limit).
    close(p.accelerated_gbps, 196.074_676_878_889_4);
    // One QP direct rides one path and is window-limited anyway.
    close(p.direct_gbps, 1.426_634_013_605_442);
    let w = p.workload.unwrap();
    // 2 × 7/8 × 2e9 B = 3.5e9 B; 2.8e10 bit × 4178 / (4096 × 2e11) s
    //   = 0.142802734375 s ≤ 0.2 s: hidden, no idle time.
    close(w.allreduce_bytes_per_gpu, 3.5e9);
    close(w.comm_ms, 142.802_734_375);
    assert!(w.hidden_by_backward);
    assert_eq!(w.idle_ms, 0.0);
    assert!(!w.direct_hidden_by_backward);
}

/// Short RTT, many QPs: the link, not the window, limits the direct path,
/// and go-back-N's window time c is the serialisation time, not the RTT.
#[test]
fn link_limited_direct_path_with_many_qps() {
    let p = plan_of(
        "--rtt-ms 0.1 --link-gbps 10 --paths 2 --qps 4 --mtu 1024 --tx-depth 64 --loss 0.01",
    );
    close(p.one_way_ms, 0.05);
    close(p.rtt_ms, 0.1);
    assert_eq!(p.inputs.distance_km, None);
    // 20e9 × 1e-4 / 8 = 250_000 B; × 3 = 750_000 B, + 150_994_944 B
    //   = 151_744_944 B → 145 MiB.
    assert_eq!(p.bdp_bytes, 250_000);
    assert_eq!(p.buffer_bytes, 145 * 1_048_576);
    // Window 64 × 1024 × 8 = 524_288 bit per 0.1 ms = 5.24288 Gbit/s per QP.
    close(p.direct_window_gbps, 5.242_88);
    // 4 QPs on 2 paths: share = 10 × 1024/1106 × 2/4 = 4.62929476 Gbit/s < window.
    // c = 524_288 / 4.62929476e9 = 113.2544 µs.
    // (1 − 0.01)^64 = 0.525596488, q = 0.474403512.
    // direct = 4 × 524_288 × 0.525596488 / (113.2544 µs + 0.474403512 × 100 µs)
    //        = 6.85931380 Gbit/s.
    close(p.window_loss_probability, 0.474_403_512_474_437_7);
    close(p.direct_gbps, 6.859_313_801_170_23);
    // Sōya: 4 × 524_288 / 10 µs = 209.7 Gbit/s ≥ line goodput
    //   2 × 10 × 1024/1106 = 18.5171790 Gbit/s; × 0.99 = 18.3320072 Gbit/s.
    close(p.line_goodput_gbps, 18.517_179_023_508_14);
    close(p.accelerated_gbps, 18.332_007_233_273_06);
}

#[test]
fn lossless_link_limited_direct_path_fills_the_link() {
    // Same, lossless: 4 QPs × 4.62929476 = 18.5171790 Gbit/s, the full line
    // goodput, and Sōya gains nothing (speedup 1).
    let p = plan_of("--rtt-ms 0.1 --link-gbps 10 --paths 2 --qps 4 --mtu 1024 --tx-depth 64");
    close(p.direct_gbps, 18.517_179_023_508_14);
    close(p.accelerated_gbps, 18.517_179_023_508_14);
    close(p.speedup.unwrap(), 1.0);
}

#[test]
fn rtt_ms_is_the_same_as_the_equivalent_distance() {
    let by_km = plan_of(SAPPORO_JOB);
    let by_rtt = plan_of(&SAPPORO_JOB.replace("--distance-km 300", "--rtt-ms 2.94"));
    assert_eq!(by_rtt.bdp_bytes, by_km.bdp_bytes);
    assert_eq!(by_rtt.buffer_bytes, by_km.buffer_bytes);
    assert_eq!(by_rtt.direct_gbps, by_km.direct_gbps);
    assert_eq!(by_rtt.workload, by_km.workload);
}

#[test]
fn safety_factor_scales_the_buffer() {
    // 36_750_000 B × 1.0 = 35.05 MiB → 36 MiB; × 4.5 = 165_375_000 B = 157.7 MiB → 158 MiB
    // (without the reserve).
    let bare = format!("{SAPPORO} --requesters 0");
    assert_eq!(
        plan_of(&format!("{bare} --safety-factor 1")).buffer_bytes,
        36 * 1_048_576
    );
    assert_eq!(
        plan_of(&format!("{bare} --safety-factor 4.5")).buffer_bytes,
        158 * 1_048_576
    );
    // With the default reserve of 150_994_944 B: 187_744_944 B → 180 MiB.
    assert_eq!(
        plan_of(&format!("{SAPPORO} --safety-factor 1")).buffer_bytes,
        180 * 1_048_576
    );
}

/// The planner and the site config size the buffer identically: the Sapporo
/// example with both paths at 100 Gbit/s over 300 km.
#[test]
fn buffer_matches_the_site_config_auto_size() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/examples/sapporo.toml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let text = text
        .replace("rate = \"10gbit\"", "rate = \"100gbit\"")
        .replace("distance_km = 380", "distance_km = 300");
    let cfg = soya_config::parse_str(&text, "sapporo.toml").unwrap();
    let p = plan_of("--distance-km 300 --link-gbps 100 --paths 2 --safety-factor 3");
    assert_eq!(cfg.buffer.bytes, p.buffer_bytes);
    // 200 Gbit/s × 2.94 ms × 3 / 8 = 220_500_000, + 150_994_944
    // = 371_494_944 B → 355 MiB.
    assert_eq!(p.buffer_bytes, 355 * 1_048_576);
    // And with the reserve's keys set otherwise.
    let cfg = soya_config::parse_str(
        &text
            .replace("requesters = 16", "requesters = 3")
            .replace("requester_window = \"8MiB\"", "requester_window = \"1MiB\""),
        "sapporo.toml",
    )
    .unwrap();
    let p = plan_of(
        "--distance-km 300 --link-gbps 100 --paths 2 --safety-factor 3 \
         --requesters 3 --requester-window 1MiB",
    );
    assert_eq!(cfg.buffer.bytes, p.buffer_bytes);
}

#[test]
fn heavy_loss_stalls_the_direct_path_completely() {
    // (1 − 0.9999)^128 = 1e-512 underflows to 0: go-back-N never delivers a
    // window; Sōya still gets 98.0373384 × 0.0001 = 0.00980373 Gbit/s.
    let p = plan_of(&format!("{SAPPORO_JOB} --loss 0.9999"));
    assert_eq!(p.direct_gbps, 0.0);
    assert_eq!(p.speedup, None);
    close(p.accelerated_gbps, 0.009_803_733_843_944_471);
    let w = p.workload.as_ref().unwrap();
    assert_eq!(w.direct_comm_ms, None);
    assert!(!w.direct_hidden_by_backward);
    let json: serde_json::Value = serde_json::to_value(&p).unwrap();
    assert!(json["speedup"].is_null());
    assert!(json["direct_comm_ms"].is_null());
    let table = p.table();
    has(&table, "never completes");
    has(&table, "unbounded");
}

// ---------------------------------------------------------------------------
// Output

/// The keys of every plan's JSON, with or without a workload.
const PLAN_KEYS: [&str; 6] = [
    "one_way_ms",
    "rtt_ms",
    "bdp_bytes",
    "buffer_bytes",
    "direct_gbps",
    "accelerated_gbps",
];

#[test]
fn json_has_the_documented_keys() {
    let v: serde_json::Value = serde_json::to_value(plan_of(SAPPORO_JOB)).unwrap();
    for key in PLAN_KEYS.into_iter().chain([
        "allreduce_bytes_per_gpu",
        "comm_ms",
        "idle_ms",
        "hidden_by_backward",
        "direct_comm_ms",
        "notes",
    ]) {
        assert!(v.get(key).is_some(), "{key} missing from {v:#}");
    }
    assert_eq!(v["bdp_bytes"], 36_750_000);
    assert_eq!(v["buffer_bytes"], 262_144_000);
    assert_eq!(v["buffer_bdp_part_bytes"], 110_250_000);
    assert_eq!(v["buffer_reserve_bytes"], 150_994_944);
    assert_eq!(v["hidden_by_backward"], false);
    assert_eq!(v["inputs"]["gpus"], 16);
    close(v["comm_ms"].as_f64().unwrap(), 612.011_718_75);
    close(v["allreduce_bytes_per_gpu"].as_f64().unwrap(), 7.5e9);
}

#[test]
fn json_without_workload_has_no_workload_keys() {
    let v: serde_json::Value = serde_json::to_value(plan_of(SAPPORO)).unwrap();
    for key in PLAN_KEYS {
        assert!(v.get(key).is_some(), "{key} missing from {v:#}");
    }
    for key in ["allreduce_bytes_per_gpu", "comm_ms", "hidden_by_backward"] {
        assert!(v.get(key).is_none(), "{key} present in {v:#}");
    }
    assert!(v["inputs"].get("gpus").is_none());
    assert!(v["inputs"].get("bytes_per_param").is_none());
}

#[test]
fn table_mentions_every_figure() {
    let t = plan_of(SAPPORO_JOB).table();
    for needle in [
        "300 km of fibre, 1 WAN path of 100 Gbit/s, no loss",
        "1.47 ms",                          // one way
        "2.94 ms",                          // RTT
        "36750000 bytes",                   // BDP
        "262144000 bytes",                  // buffer
        "250 MiB",                          // buffer, readable
        "110250000 bytes",                  // its BDP part
        "BDP × 3 safety factor",            //
        "150994944 bytes",                  // its reserve
        "16 requesters × 8 MiB",            //
        "98.037 Gbit/s",                    // line goodput, and through Sōya
        "1.427 Gbit/s",                     // direct
        "419.43 Gbit/s",                    // DC window
        "68.719×",                          // speedup
        "7500000000 bytes",                 // per GPU per step
        "2 × 15/16",                        // the ring formula
        "612.012 ms",                       // comm through Sōya
        "NOT hidden: GPUs idle 362.012 ms", // idle
        "42.057 s",                         // comm direct
        "250 ms",                           // backward
        "q = 1−(1−p)^W",                    // the go-back-N formula, in the notes
    ] {
        has(&t, needle);
    }
}

#[test]
fn table_says_when_communication_is_hidden() {
    let t = plan_of(
        "--distance-km 300 --link-gbps 100 --paths 2 \
         --gpus 8 --params 1e9 --bytes-per-param 2 --backward-ms 200",
    )
    .table();
    // 200 − 142.802734375 = 57.197 ms to spare.
    has(&t, "142.803 ms");
    has(&t, "hidden by backward (57.197 ms to spare)");
    has(&t, "2 WAN paths of 100 Gbit/s");
}

#[test]
fn table_without_workload_has_no_workload_section() {
    let t = plan_of(&format!("{SAPPORO} --loss 0.001")).table();
    has(&t, "loss 0.1 %");
    has(&t, "12.02 % of windows");
    has(&t, "1.12 Gbit/s"); // direct under loss
    has(&t, "97.939 Gbit/s"); // through Sōya under loss
    assert!(!t.contains("AllReduce"), "{t}");
}

#[test]
fn run_prints_and_succeeds() {
    assert_eq!(
        plan::run(&args(SAPPORO_JOB)),
        std::process::ExitCode::SUCCESS
    );
    assert_eq!(
        plan::run(&args(&format!("{SAPPORO_JOB} --json"))),
        std::process::ExitCode::SUCCESS
    );
    let mut bad = args(SAPPORO);
    bad.mtu = 1500;
    assert_eq!(plan::run(&bad), std::process::ExitCode::from(2));
}

// ---------------------------------------------------------------------------
// Argument validation

#[test]
fn help_gives_units_for_every_flag() {
    let help = Cli::command().render_long_help().to_string();
    for needle in [
        "--distance-km <KM>",
        "in km",
        "--rtt-ms <MS>",
        "--link-gbps <GBPS>",
        "Gbit/s",
        "--loss <P>",
        "--mtu <BYTES>",
        "--tx-depth <PACKETS>",
        "--dc-rtt-us <US>",
        "µs",
        "--safety-factor <FACTOR>",
        "--gpus <N>",
        "--params <COUNT>",
        "--bytes-per-param <BYTES>",
        "--backward-ms <MS>",
        "--json",
    ] {
        has(&help, needle);
    }
}

#[test]
fn a_delay_and_a_link_rate_are_required() {
    let e = parse_err("--link-gbps 100");
    assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    has(&e.to_string(), "--distance-km");
    has(&e.to_string(), "--rtt-ms");
    let e = parse_err("--distance-km 300");
    assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    has(&e.to_string(), "--link-gbps");
}

#[test]
fn distance_and_rtt_conflict() {
    let e = parse_err("--distance-km 300 --rtt-ms 3 --link-gbps 100");
    assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
    has(&e.to_string(), "cannot be used with");
}

#[test]
fn nonsense_values_are_rejected_with_the_rule() {
    for (extra, flag, rule) in [
        ("--link-gbps 0", "--link-gbps", "link rate must be"),
        ("--link-gbps -5", "--link-gbps", "link rate must be"),
        ("--link-gbps nan", "--link-gbps", "not a finite number"),
        ("--link-gbps fast", "--link-gbps", "not a number"),
        ("--mtu 1500", "--mtu", "use 1024, 2048 or 4096"),
        ("--mtu 9000", "--mtu", "use 1024, 2048 or 4096"),
        ("--loss 1", "--loss", "0 <= p < 1"),
        ("--loss 1.5", "--loss", "0 <= p < 1"),
        ("--loss -0.1", "--loss", "0 <= p < 1"),
        ("--paths 0", "--paths", "1..=16"),
        ("--paths 17", "--paths", "1..=16"),
        ("--qps 0", "--qps", "1..="),
        ("--tx-depth 0", "--tx-depth", "1..="),
        ("--dc-rtt-us 0", "--dc-rtt-us", "DC RTT must be"),
        ("--safety-factor 0.5", "--safety-factor", "1.0 to 16.0"),
    ] {
        let base = if flag == "--link-gbps" {
            "--distance-km 300"
        } else {
            SAPPORO
        };
        let e = parse_err(&format!("{base} {extra}"));
        assert_eq!(e.kind(), ErrorKind::ValueValidation, "{extra}: {e}");
        let msg = e.to_string();
        has(&msg, flag);
        has(&msg, rule);
    }
    for (argv, rule) in [
        ("--distance-km -300 --link-gbps 100", "0 < km <= 40000"),
        ("--distance-km 0 --link-gbps 100", "0 < km <= 40000"),
        ("--rtt-ms 0 --link-gbps 100", "RTT must be"),
        ("--rtt-ms -1 --link-gbps 100", "RTT must be"),
    ] {
        let e = parse_err(argv);
        assert_eq!(e.kind(), ErrorKind::ValueValidation, "{argv}: {e}");
        has(&e.to_string(), rule);
    }
}

#[test]
fn workload_options_are_all_or_none() {
    // --gpus alone names both missing flags.
    let e = parse_err(&format!("{SAPPORO} --gpus 16"));
    assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    has(&e.to_string(), "--params");
    has(&e.to_string(), "--backward-ms");
    let e = parse_err(&format!("{SAPPORO} --gpus 16 --params 1e9"));
    assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    has(&e.to_string(), "--backward-ms");
    let e = parse_err(&format!("{SAPPORO} --backward-ms 250"));
    assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    has(&e.to_string(), "--gpus");
    // --bytes-per-param has a default, but given alone it is still a mistake.
    let e = parse_err(&format!("{SAPPORO} --bytes-per-param 2"));
    assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    // Workload values are range-checked too.
    for (extra, rule) in [
        ("--gpus 1 --params 1e9 --backward-ms 250", "2..="),
        (
            "--gpus 16 --params 0 --backward-ms 250",
            "parameter count must be",
        ),
        (
            "--gpus 16 --params 1e9 --backward-ms 0",
            "backward time must be",
        ),
        (
            "--gpus 16 --params 1e9 --backward-ms 250 --bytes-per-param 0",
            "1..=16",
        ),
    ] {
        let e = parse_err(&format!("{SAPPORO} {extra}"));
        assert_eq!(e.kind(), ErrorKind::ValueValidation, "{extra}: {e}");
        has(&e.to_string(), rule);
    }
}

/// `plan()` re-checks a `PlanArgs` built in code and names the flag.
#[test]
fn plan_rejects_arguments_built_in_code() {
    type Break = fn(&mut PlanArgs);
    let cases: [(Break, &str); 7] = [
        (|a| a.mtu = 1500, "--mtu"),
        (|a| a.link_gbps = 0.0, "--link-gbps"),
        (|a| a.loss = 1.0, "--loss"),
        (|a| a.rtt_ms = Some(3.0), "not both"),
        (|a| a.distance_km = None, "--distance-km KM or --rtt-ms MS"),
        (|a| a.job.as_mut().unwrap().gpus = 1, "--gpus"),
        (|a| a.paths = 0, "--paths"),
    ];
    for (break_it, msg) in cases {
        let mut a = args(SAPPORO_JOB);
        break_it(&mut a);
        let e = plan::plan(&a).expect_err(msg);
        has(&e.to_string(), msg);
    }
}

/// The workload options make a job only all together: some of them alone
/// are refused, none of them is no job.
#[test]
fn a_job_needs_gpus_params_and_backward_together() {
    use plan::JobArgs;
    for (gpus, params, backward) in [
        (Some(16), None, None),
        (None, Some(1e9), None),
        (None, None, Some(250.0)),
        (Some(16), Some(1e9), None),
        (None, Some(1e9), Some(250.0)),
    ] {
        let e = JobArgs::from_flags(gpus, params, 4, backward, None, None).expect_err("partial");
        has(&e.to_string(), "go together");
    }
    assert_eq!(
        JobArgs::from_flags(None, None, 4, None, None, None),
        Ok(None)
    );
    let job = JobArgs::from_flags(Some(16), Some(1e9), 4, Some(250.0), None, None).unwrap();
    assert_eq!(args(SAPPORO_JOB).job, job);
}

/// NCCL's receiver-driven flow control (`--nccl-buffsize`, `--channels`):
/// channels × NCCL_BUFFSIZE per end-to-end round trip bounds the AllReduce
/// direct and through Sōya alike, and one RTT of ring latency is added.
/// `soya-sim allreduce` measured 170.0 ms through Sōya for this job
/// (docs/benchmarks.md §9).
#[test]
fn nccl_buffers_bound_the_allreduce_through_soya_too() {
    let job = "--distance-km 300 --link-gbps 400 --tx-depth 4096 --qps 16 --gpus 16 --params 1e9 \
               --bytes-per-param 1 --backward-ms 1";
    let bare = plan_of(job).workload.unwrap();
    let nccl = plan_of(&format!("{job} --nccl-buffsize 4194304 --channels 8"))
        .workload
        .unwrap();
    // 8 × 4 MiB × 8 bit / (2.94 ms + 10 µs) = 91.0 Gbit/s, far below the
    // 400 Gbit/s line the bare plan pipes the 1.875 GB through.
    let rate = 8.0 * 4_194_304.0 * 8.0 / (2.94e-3 + 10e-6);
    close(nccl.nccl_window_gbps.unwrap(), rate / 1e9);
    close(nccl.comm_ms, 1.875e9 * 8.0 / rate * 1e3 + 2.94);
    assert!(nccl.comm_ms > 4.0 * bare.comm_ms, "{nccl:?} vs {bare:?}");
    // Direct (a hardware window of 4,096 packets per QP: 730 Gbit/s) is
    // bounded by the same loop, over the WAN RTT alone.
    let direct = nccl.direct_comm_ms.unwrap();
    assert!((direct - nccl.comm_ms).abs() / direct < 0.01, "{direct}");
    assert_eq!(bare.nccl_window_gbps, None);
    // Large enough buffers: the line rate again, plus the RTT.
    let big = plan_of(&format!("{job} --nccl-buffsize 33554432 --channels 8"))
        .workload
        .unwrap();
    close(big.comm_ms, bare.comm_ms + 2.94);
}
