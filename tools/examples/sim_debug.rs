//! Debug one sweep scenario: `cargo run --example sim_debug -- SEED [LIMIT_MS]`.
//!
//! SOYA_SIM_TRACE_PACKETS=1 prints every delivery; SOYA_SIM_DEBUG_STATE=1
//! prints each gateway's per-half ingress and egress state at the end
//! (and the draining gateway's ingress halves when a planned restart's
//! drain times out);
//! SOYA_SIM_ENDPOINT=hw runs the scenario `sweep --endpoint hw` runs;
//! SOYA_SIM_OVERSUB=1 the over-subscribed one (`sweep --oversub-every 1`).

#![deny(unsafe_code)]
use std::time::Duration;

fn main() {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let limit: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let endpoint = std::env::var("SOYA_SIM_ENDPOINT")
        .ok()
        .map(|e| e.parse().expect("SOYA_SIM_ENDPOINT: rxe or hw"))
        .unwrap_or_default();
    let mut s = if std::env::var_os("SOYA_SIM_OVERSUB").is_some() {
        soya_tools::sim::oversub::oversubscribed_scenario(seed, endpoint)
    } else {
        soya_tools::sim::sweep::sweep_scenario(seed, endpoint, true)
    };
    s.time_limit = Duration::from_millis(limit);
    eprintln!("{s:?}");
    let o = soya_tools::sim::scenario::run(&s).unwrap();
    eprintln!("{o:#?}");
}
