//! `soya-soak`: two Sōya gateways in network namespaces under QP churn,
//! WAN faults, reloads, a twin crash and forgeries, with every byte
//! accounted for. See `soya_tools::soak`.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use soya_tools::soak::Binaries;
use soya_tools::soak::{self, SoakOptions};

/// Soak two Sōya gateways (root; network namespaces `soak-<pid>-*`).
///
/// Runs soya-perf sessions back to back in both directions (4 QPs each,
/// WRITE / SEND / READ / atomic, all data verified) through two gateways
/// on the tun backend and three soya-wanem paths, while it bursts loss,
/// cuts and restores paths, reloads the gateways (SIGHUP) with other paths
/// and rates, sends DC-side forgeries, and once, halfway, kills gateway B
/// (kill -9) and restarts it. Progress every 10 s on stderr.
///
/// Exits 0 when nothing was lost, duplicated or failed silently, no flow
/// failed outside the gateway crash, and RSS and fds stayed within 5 % of
/// their value after warm-up; 1 on a violation; 2 when the lab cannot run.
#[derive(Parser, Debug)]
#[command(name = "soya-soak", version)]
struct Args {
    /// How long to run, in seconds.
    #[arg(long)]
    duration: u64,
    /// One JSON object on stdout instead of the summary.
    #[arg(long)]
    json: bool,
    /// Rate of each emulated WAN link, Mb/s.
    #[arg(long, default_value_t = 200)]
    rate_mbps: u64,
    /// One-way delay of each link, ms (1 ms ≈ 200 km of fibre).
    #[arg(long, default_value_t = 1.0)]
    delay_ms: f64,
    /// Directory for logs and configurations (default: a fresh one in /tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Directory of the soya, soya-perf and soya-wanem binaries (default:
    /// this binary's).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let bin_dir = match a.bin_dir.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
    }) {
        Some(d) => d,
        None => {
            eprintln!("soya-soak: cannot tell where the binaries are; give --bin-dir");
            return ExitCode::from(2);
        }
    };
    let bins = match Binaries::beside(&bin_dir.join("soya")) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("soya-soak: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("soya-soak-{}", std::process::id())));
    let o = SoakOptions {
        duration: Duration::from_secs(a.duration),
        link_rate_mbps: a.rate_mbps,
        one_way_ms: a.delay_ms,
        dir: dir.clone(),
        bins,
        progress: true,
    };
    eprintln!("soya-soak: {} s; logs in {}", a.duration, dir.display());
    let r = match soak::run(&o) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soya-soak: {e}");
            return ExitCode::from(2);
        }
    };
    if a.json {
        match serde_json::to_string_pretty(&r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("soya-soak: {e}"),
        }
    } else {
        println!(
            "soak {:.0} s: {} sessions, {} QPs, {} ops verified ({} B), {} sessions failed ({} outside the crash)\n\
             bytes lost {} (crash window {}), duplicated {}, silent failures {}\n\
             faults: {}; {} path cuts, {} reloads, {} twin restart(s), {}/{} forgeries counted\n\
             RSS growth {:.1} % ({:.1} % beyond the deep buffer's new high water), fd growth {}",
            r.duration_s, r.sessions, r.qps_opened, r.ops_verified, r.bytes_verified,
            r.sessions_failed, r.sessions_failed_outside_crash, r.bytes_lost,
            r.bytes_lost_gateway_crash, r.bytes_duplicated, r.silent_failures, r.loss_model,
            r.path_cuts, r.reloads, r.twin_restarts, r.forgeries_counted, r.forgeries_sent,
            r.rss_growth_pct, r.rss_growth_beyond_buffer_pct, r.fd_growth
        );
        for f in &r.failures {
            println!(
                "  failed at {:.0} s {} {}: {} ({}){}",
                f.at_s,
                f.direction,
                f.op,
                f.how,
                f.error,
                if f.in_crash_window {
                    " [crash window]"
                } else {
                    ""
                }
            );
        }
    }
    if r.violations.is_empty() {
        eprintln!("soya-soak: PASS");
        ExitCode::SUCCESS
    } else {
        for v in &r.violations {
            eprintln!("soya-soak: VIOLATION: {v}");
        }
        ExitCode::FAILURE
    }
}
