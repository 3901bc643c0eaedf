//! `soya demo --duration 2 --json`, run through the built binaries: two
//! gateways, soya-wanem relays and soya-perf endpoints on loopback.
//!
//! `soya` belongs to another package, so it is looked up next to this
//! package's `soya-perf` (a workspace build puts them side by side). When it
//! is missing the test is skipped with a printed reason, unless `CI=true`.

use std::process::Command;

use serde_json::Value;

mod common;
use common::{skip, soya_binary};

#[test]
fn demo_json_reports_a_clean_comparison() {
    let Some(soya) = soya_binary() else {
        skip(
            "demo_json_reports_a_clean_comparison",
            "the `soya` binary next to soya-perf (cargo build --workspace, or cargo test --workspace)",
            std::env::var("CI").is_ok_and(|v| v == "true"),
        );
        return;
    };
    let out = Command::new(&soya)
        .args(["demo", "--duration", "2", "--json"])
        .output()
        .expect("run soya demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    println!("{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON object from soya demo ({}): {stderr}", out.status));
    let v: Value = serde_json::from_str(line).expect("valid JSON");
    for k in [
        "distance_km",
        "rtt_ms",
        "direct_0km_gbps",
        "direct_gbps",
        "accelerated_gbps",
        "data_errors",
    ] {
        assert!(v.get(k).is_some(), "key {k} missing: {v}");
    }
    assert_eq!(v["distance_km"].as_f64(), Some(300.0));
    assert_eq!(v["data_errors"].as_u64(), Some(0), "{v}");
    assert!(v["direct_0km_gbps"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["direct_gbps"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["accelerated_gbps"].as_f64().unwrap() > 0.0, "{v}");
    // Exit status agrees with the report.
    assert_eq!(out.status.success(), v["ok"].as_bool() == Some(true), "{v}");
}
