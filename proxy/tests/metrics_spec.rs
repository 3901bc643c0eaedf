//! The metric table is the one source of the metric list: the checked-in
//! spec (packaging/metrics-spec.json), the Grafana dashboard generated from
//! it and the Prometheus examples must agree with it.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::Command;

use soya::gateway::metrics::{spec_json, METRICS};

fn packaging(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging")
        .join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(packaging(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn the_checked_in_spec_is_the_table() {
    assert!(
        read("metrics-spec.json") == spec_json(),
        "packaging/metrics-spec.json is out of date: \
         soya metrics-spec --json > packaging/metrics-spec.json, \
         then python3 packaging/gen-grafana-dashboard.py > packaging/grafana/soya-dashboard.json"
    );
}

#[test]
fn the_checked_in_dashboard_is_generated_from_the_spec() {
    let out = match Command::new("python3")
        .arg(packaging("gen-grafana-dashboard.py"))
        .output()
    {
        Ok(o) => o,
        Err(e) if std::env::var_os("SOYA_REQUIRE_PYTHON").is_none() => {
            eprintln!("SKIP: python3 not runnable ({e})");
            return;
        }
        Err(e) => panic!("python3: {e}"),
    };
    assert!(
        out.status.success(),
        "the generator refused the dashboard: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout) == read("grafana/soya-dashboard.json"),
        "packaging/grafana/soya-dashboard.json is out of date: \
         python3 packaging/gen-grafana-dashboard.py > packaging/grafana/soya-dashboard.json"
    );
}

#[test]
fn the_prometheus_examples_use_only_exported_metrics() {
    for file in ["prometheus/soya-alerts.yml", "prometheus/soya-scrape.yml"] {
        let text = read(file);
        let mut n = 0;
        for (i, _) in text.match_indices("soya_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // Rule group and job names are not metrics.
            if text[..i].ends_with("name: ") || text[..i].ends_with("job_name: ") {
                continue;
            }
            n += 1;
            assert!(
                METRICS.iter().any(|m| m.name == name),
                "{file}: {name} is not a metric the gateway exports"
            );
        }
        eprintln!("{file}: {n} metric references, all exported");
    }
}
