//! The 2-minute soak (`soya-soak --duration 120`): real gateways in network
//! namespaces under QP churn, burst loss, path cuts, SIGHUP reloads that
//! change paths and rates, a crash and restart of one gateway, and DC-side
//! forgeries. The verdict is the soak's own (nothing lost, duplicated or
//! failed silently; no flow failed outside the crash; RSS and fds flat),
//! plus that every fault actually happened.
//!
//! Needs root, /dev/net/tun and `ip`; skips without them unless
//! `SOYA_REQUIRE_NETNS=1` (`.ci/run`), where it fails. No timing is
//! asserted: the run lasts as long as it lasts on a loaded machine, and
//! only the accounting is checked.

#![deny(unsafe_code)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{netns_missing, netns_required, skip, soya_binary};

#[test]
fn two_minute_soak_loses_nothing_and_drops_no_flow() {
    const NAME: &str = "two_minute_soak_loses_nothing_and_drops_no_flow";
    let required = netns_required();
    if let Some(missing) = netns_missing(&[]) {
        return skip(NAME, &missing, required);
    }
    let Some(soya) = soya_binary() else {
        return skip(
            NAME,
            "the soya binary beside soya-perf (cargo build --workspace)",
            required,
        );
    };
    let bin_dir = soya.parent().unwrap().to_path_buf();
    let dir = std::env::temp_dir().join(format!("soya-soak-test-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_soya-soak"))
        .args(["--duration", "120", "--json", "--dir"])
        .arg(&dir)
        .arg("--bin-dir")
        .arg(&bin_dir)
        .output()
        .expect("run soya-soak");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("soya-soak printed no JSON ({e}); logs in {}", dir.display()));
    println!("{}", serde_json::to_string_pretty(&v).unwrap());
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k}"));
    assert_eq!(n("bytes_lost"), 0, "bytes lost outside the crash");
    assert_eq!(n("bytes_duplicated"), 0);
    assert_eq!(n("silent_failures"), 0);
    assert_eq!(
        n("sessions_failed_outside_crash"),
        0,
        "a reload or a cut dropped a flow"
    );
    assert!(n("ops_verified") > 0);
    // How many QPs a 2-minute run churns through depends on the machine's
    // speed (about 400 at load 20 here; hundreds over a long soak): printed,
    // and only "QPs were opened and closed" is asserted.
    println!("QPs opened and closed: {}", n("qps_opened"));
    assert!(n("qps_opened") > 0, "no QP was opened");
    for k in ["reloads", "path_cuts", "forgeries_sent"] {
        assert!(n(k) > 0, "{k}: the fault did not happen");
    }
    assert_eq!(n("twin_restarts"), 1);
    for f in v["failures"].as_array().unwrap() {
        assert!(
            !f["how"].as_str().unwrap_or("").is_empty()
                && !f["error"].as_str().unwrap_or("").is_empty(),
            "a failure that did not say how it reached the application: {f}"
        );
    }
    // Every violation fails the test, RSS growth included (issue 17: quiet
    // QP halves are forgotten, `qp::expiry`). A gateway whose engine had
    // forgotten no half by the end (B, restarted at 60 s of 120, and A,
    // whose halves that restart reset) is printed and not judged by
    // soya-soak (`rss_judged`): before the first expiry RSS follows the
    // halves piled up, which depends on the machine's speed.
    for g in v["gateways"].as_array().unwrap() {
        println!(
            "gateway {}: RSS {} -> {} KiB ({:.1} %, judged: {}), halves {} -> {} ({} forgotten)",
            g["site"],
            g["warm"]["rss_kib"],
            g["end"]["rss_kib"],
            g["rss_growth_pct"].as_f64().unwrap_or(0.0),
            g["rss_judged"],
            g["warm"]["halves"],
            g["end"]["halves"],
            g["end"]["halves_expired"],
        );
    }
    let violations: Vec<&str> = v["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x.as_str())
        .collect();
    assert!(
        violations.is_empty(),
        "soya-soak found violations: {violations:?}; logs in {}",
        dir.display()
    );
    let _ = std::fs::remove_dir_all(PathBuf::from(&dir));
}
