//! `soya demo`: the two-site demo, run as child processes: between network
//! namespaces where the machine allows it (`crate::demo_netns`), else on
//! loopback (below).
//!
//! ```text
//! 1. direct, 0 km:   perf client ─IP-in-UDP─▶ perf server
//! 2. direct, D km:   perf client ─▶ soya-wanem udp (D km) ─▶ perf server
//! 3. through Sōya:   perf client ─▶ gateway A ─▶ soya-wanem (D km, one per
//!                    path) ─▶ gateway B ─▶ perf server
//! ```
//!
//! Every emulated path is a circuit of `--rate` (default 2 Gb/s), and the
//! gateways' path `rate` is set to it, as an operator sets a circuit's
//! rate; run 1 crosses a soya-wanem relay of that rate at 0 km, so the
//! three runs differ only in distance and in Sōya. `--rate unlimited`
//! removes the bottleneck: every run is then bounded by the machine's CPU
//! instead, which the Sōya run shares among five processes.
//!
//! The gateways run at normal priority here ([`demo_gateway_env`]): on two
//! cores shared with the endpoints, their usual nice -10 starves the
//! responder.
//!
//! Every RoCE packet is a whole IP packet inside a UDP datagram (the
//! gateways' lab `udp` backend), so the ICRC is end to end in all three
//! runs. The RoCE hosts are 10.1.0.1 (site A) and 10.2.0.1 (site B); they
//! exist only inside the datagrams. Each run is an RDMA WRITE workload
//! (tx-depth 128, MTU 4096) followed by a short latency run (64-byte
//! WRITEs, one outstanding) for the RTT the requester sees.
//!
//! Between network namespaces (root; the default there, or `--netns`): the
//! same three runs with real RoCEv2 and the gateways' xdp backend (or tun:
//! `--backend`, and where xdp cannot run) (`crate::demo_netns`).
//! `--loopback` forces the loopback lab.
//!
//! The orchestration only spawns the `soya`, `soya-perf` and `soya-wanem`
//! binaries (found next to each other, as `cargo build --release
//! --workspace` leaves them) and reads soya-perf's `--json` reports.

use std::path::Path;

use crate::demo_circuit;
pub use crate::demo_common::{Binaries, DemoOptions, DEFAULT_RATE_BPS};
use crate::demo_common::{DemoBackend, US_PER_KM};
use crate::demo_loopback::{direct_0km_loopback, run_loopback, soya_loopback};
use crate::demo_report::{self, Calibration, Outcome};
use crate::demo_session::{Ctx, Route, Runs, Step};
use crate::size::{parse_size, MAX_SIZE};

/// A bottleneck rate ("2gbit", "800mbit"); "unlimited", "none" or 0: none.
fn parse_demo_rate(s: &str) -> Result<u64, String> {
    match crate::wanem::profile::rate_of(&crate::wanem::profile::Quantity::Text(s.into()))? {
        Some(r) => Ok(r),
        None => Ok(0),
    }
}

/// `soya-perf demo` (what `soya demo` runs): the demo's arguments as the
/// command line gave them; `soya_bin` is the `soya` binary (soya-perf and
/// soya-wanem are looked up beside it). Returns the exit status.
pub fn main(soya_bin: &Path, d: &soya::demo_args::DemoArgs) -> i32 {
    let rate_auto = d.rate == "auto";
    let rate = if rate_auto {
        Ok(0)
    } else {
        parse_demo_rate(&d.rate)
    };
    let window = match d.window.as_str() {
        "auto" => Ok(None),
        w => w
            .parse::<u32>()
            .ok()
            .filter(|w| (1..=crate::perf::MAX_WINDOW).contains(w))
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "\"auto\" or a number of packets, 1..={}",
                    crate::perf::MAX_WINDOW
                )
            }),
    };
    let (size, rate, window) = match (parse_size(&d.size), rate, window) {
        (Ok(s), Ok(r), Ok(w)) => (s, r, w),
        (Err(e), _, _) => {
            eprintln!("soya demo: --size {}: {e}", d.size);
            return 2;
        }
        (_, Err(e), _) => {
            eprintln!("soya demo: --rate {}: {e} (or \"auto\")", d.rate);
            return 2;
        }
        (_, _, Err(e)) => {
            eprintln!("soya demo: --window {}: {e}", d.window);
            return 2;
        }
    };
    let bins = match Binaries::beside(soya_bin) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("soya demo: {e}");
            return 1;
        }
    };
    let (netns, backend) = where_to_run(d);
    run(
        &DemoOptions {
            distance_km: d.distance_km,
            loss: d.loss,
            paths: d.paths,
            duration: d.duration,
            size,
            json: d.json,
            netns,
            backend,
            rate_bps: (rate > 0).then_some(rate),
            rate_auto,
            window,
        },
        &bins,
    )
}

/// The fastest set-up this machine allows unless told: between network
/// namespaces with the xdp backend as root, else tun there, else the
/// loopback lab, saying why on stderr.
fn where_to_run(d: &soya::demo_args::DemoArgs) -> (bool, DemoBackend) {
    // Every build has the XDP program (proxy/io/build.rs), and the demo sets
    // the hosts' veths up for it itself: between namespaces, xdp unless
    // told otherwise.
    let backend = |explicit: Option<DemoBackend>| explicit.unwrap_or(DemoBackend::Xdp);
    if d.loopback {
        return (false, DemoBackend::Tun);
    }
    if d.netns || d.backend.is_some() {
        return (true, backend(d.backend));
    }
    match crate::netns::netns_missing(&[]) {
        None => (true, backend(None)),
        Some(why) => {
            eprintln!(
                "soya demo: on loopback (the gateways' udp lab backend): network namespaces \
                 need {why}; as root the demo runs between namespaces on the xdp backend"
            );
            (false, DemoBackend::Tun)
        }
    }
}

fn validate(o: &DemoOptions) -> Result<(), String> {
    if !(o.distance_km.is_finite() && (0.0..=40_000.0).contains(&o.distance_km)) {
        return Err(format!("--distance-km {}: 0..=40000", o.distance_km));
    }
    if !(0.0..1.0).contains(&o.loss) {
        return Err(format!("--loss {}: a probability in [0, 1)", o.loss));
    }
    if !(1..=8).contains(&o.paths) {
        return Err(format!("--paths {}: 1..=8", o.paths));
    }
    if !(o.duration.is_finite() && o.duration > 0.0 && o.duration <= 3600.0) {
        return Err(format!("--duration {}: (0, 3600] seconds", o.duration));
    }
    if o.size == 0 || o.size > MAX_SIZE {
        return Err(format!("--size {}: 1..={}", o.size, MAX_SIZE));
    }
    Ok(())
}

/// Runs the demo; returns the exit status (0: every run clean).
pub fn run(o: &DemoOptions, bins: &Binaries) -> i32 {
    if let Err(e) = validate(o) {
        eprintln!("soya demo: {e}");
        return 2;
    }
    let dir = std::env::temp_dir().join(format!("soya-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("soya demo: cannot create {}: {e}", dir.display());
        return 1;
    }
    let ctx = Ctx {
        bins,
        dir: dir.clone(),
        quiet: false,
    };
    let r = run_in(o, &ctx);
    match r {
        Ok(code) => {
            if code == 0 {
                let _ = std::fs::remove_dir_all(&dir);
            } else {
                eprintln!("soya demo: logs kept in {}", dir.display());
            }
            code
        }
        Err(e) => {
            eprintln!("soya demo: {e} (logs in {})", dir.display());
            1
        }
    }
}

fn run_in(o: &DemoOptions, ctx: &Ctx) -> Result<i32, String> {
    let one_way_ms = o.distance_km * US_PER_KM / 1000.0;
    ctx.say(&format!(
        "soya demo: {} km ({:.2} ms one way, {:.2} ms RTT), loss {}, {} WAN path(s), {} B \
         WRITEs; {}",
        o.distance_km,
        one_way_ms,
        2.0 * one_way_ms,
        o.loss,
        o.paths,
        o.size,
        if o.netns {
            format!(
                "network namespaces, real RoCEv2, gateways on {}",
                o.backend.name()
            )
        } else {
            "loopback, gateways on udp".to_string()
        }
    ));
    let chosen;
    let (o, calibration) = if o.rate_auto {
        let c = calibrate(o, ctx)?;
        chosen = DemoOptions {
            rate_bps: Some(c.rate_bps()),
            ..o.clone()
        };
        (&chosen, Some(c))
    } else {
        (o, None)
    };
    ctx.say(&demo_report::circuit_text(o, calibration.as_ref()));

    let ([r0, rd, ra_], gw_alive) = if o.netns {
        run_netns(o, ctx)?
    } else {
        run_loopback(o, ctx)?
    };
    let report = demo_report::Report {
        o,
        calibration,
        bound: demo_circuit::bound(o.rate_bps, r0.gbps),
        runs: [r0, rd, ra_],
        gateways: gw_alive,
    };
    Ok(report.print())
}

/// Seconds of each calibration run of `--rate auto`.
const CALIBRATION_S: f64 = 2.0;

/// The circuit of the first calibration run: a relay in place, as in the
/// runs, but far above what this machine carries.
const CALIBRATION_RATE_BPS: u64 = 100_000_000_000;

/// Trials of a circuit through Sōya before the demo settles for the last.
const MAX_TRIALS: u8 = 3;

/// `--rate auto`: the circuit this machine carries in every run, found in
/// two steps (logs in the subdirectory `calibration`):
///
/// 1. direct at 0 km with no bottleneck (requester, relay, responder, and
///    the kernel's forwarding of every packet): the first circuit is
///    [`demo_circuit::auto_rate`] of what it carried;
/// 2. through Sōya at the demo's distance on that circuit, a trial: when
///    it does not carry [`demo_circuit::TRIAL_SHARE`] of the circuit, the
///    machine cannot pace five processes at that rate, and the next trial
///    takes [`demo_circuit::next_trial_rate`]. A run with no bottleneck
///    would not tell: paced at a circuit's rate the gateways and the relay
///    wake for every few packets, and on a slow machine that costs more
///    CPU than the same bytes carried flat out (measured on a 0.5-CPU
///    cgroup: 0.77 Gb/s carried flat out, 0.30 on a 0.5 Gb/s circuit).
///
/// The runs then take [`demo_circuit::run_rate`] of the circuit that held.
fn calibrate(o: &DemoOptions, ctx: &Ctx) -> Result<Calibration, String> {
    let cal = DemoOptions {
        loss: 0.0,
        duration: CALIBRATION_S.min(o.duration),
        rate_bps: Some(CALIBRATION_RATE_BPS),
        rate_auto: false,
        window: Some(demo_circuit::FULL_WINDOW),
        ..o.clone()
    };
    let dir = ctx.dir.join("calibration");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ctx = Ctx {
        bins: ctx.bins,
        dir,
        quiet: ctx.quiet,
    };
    let failed = |r: &Outcome, what: &str| {
        (!r.ok || r.gbps <= 0.0 || r.data_errors > 0).then(|| {
            format!(
                "the calibration run {what} failed ({}); give the circuit with --rate",
                r.errors.join("; ")
            )
        })
    };
    // The CPU quota's throttling over the whole calibration
    // (`demo_circuit::THROTTLED_RUN_MARGIN`).
    let throttled_before = crate::cgroup::throttled_periods();
    let title = "direct, 0 km, no bottleneck";
    let zero = if o.netns {
        calibrate_netns(&cal, &ctx, Step::Calibration(1), title)?.0
    } else {
        direct_0km_loopback(&cal, &ctx, Step::Calibration(1), title)?
    };
    if let Some(e) = failed(&zero, title) {
        return Err(e);
    }
    let mut c = Calibration {
        direct_0km_gbps: zero.gbps,
        trials: Vec::new(),
        throttled_periods: None,
    };
    let mut rate = demo_circuit::auto_rate(zero.gbps * 1e9);
    for k in 1..=MAX_TRIALS {
        let trial = DemoOptions {
            rate_bps: Some(rate),
            ..cal.clone()
        };
        let title = format!(
            "through Sōya, {} km, a {} Gb/s circuit",
            o.distance_km,
            rate as f64 / 1e9
        );
        let step = Step::Calibration(k + 1);
        let (soya, gw_alive) = if o.netns {
            calibrate_netns(&trial, &ctx, step, &title)?
        } else {
            soya_loopback(&trial, &ctx, step, &title)?
        };
        gw_alive?;
        if let Some(e) = failed(&soya, &title) {
            return Err(e);
        }
        c.trials.push((rate, soya.gbps));
        match demo_circuit::next_trial_rate(rate, soya.gbps) {
            Some(next) if k < MAX_TRIALS => rate = next,
            _ => break,
        }
    }
    c.throttled_periods = throttled_before
        .zip(crate::cgroup::throttled_periods())
        .map(|(a, b)| b.saturating_sub(a));
    Ok(c)
}

/// One calibration run between network namespaces, on sites of their own
/// (tag `c<k>`): direct at 0 km (`Step::Calibration(1)`), else through
/// Sōya.
fn calibrate_netns(
    cal: &DemoOptions,
    ctx: &Ctx,
    step: Step,
    title: &str,
) -> Result<(Outcome, Result<(), String>), String> {
    use crate::demo_netns::{Sites, Via};
    let Step::Calibration(k) = step else {
        return Err(format!("{step} is not a calibration step"));
    };
    let mut sites = Sites::build(cal, ctx.bins, &ctx.dir, &format!("c{k}"))?;
    let route = Route::Netns {
        a: sites.host[0].clone(),
        b: sites.host[1].clone(),
    };
    if k == 1 {
        sites.route(Via::Zero)?;
    } else {
        sites.start_gateways(ctx.bins, &ctx.dir)?;
        sites.route(Via::Soya)?;
    }
    let out = ctx.scenario(step, title, &route, 0, cal);
    Ok((out, sites.check()))
}

/// The three runs between network namespaces (real RoCEv2).
fn run_netns(o: &DemoOptions, ctx: &Ctx) -> Result<Runs, String> {
    use crate::demo_netns::{Sites, Via};
    ctx.say("setting up network namespaces and WAN emulators ...");
    let mut sites = Sites::build(o, ctx.bins, &ctx.dir, "")?;
    let route = Route::Netns {
        a: sites.host[0].clone(),
        b: sites.host[1].clone(),
    };
    sites.route(Via::Zero)?;
    let r0 = ctx.scenario(Step::Run(1), "direct, 0 km (kernel routing)", &route, 0, o);
    sites.route(Via::Wan)?;
    let rd = ctx.scenario(
        Step::Run(2),
        &format!("direct, {} km", o.distance_km),
        &route,
        0,
        o,
    );
    ctx.say(&format!(
        "starting the gateways ({} backend) ...",
        o.backend.name()
    ));
    sites.start_gateways(ctx.bins, &ctx.dir)?;
    sites.route(Via::Soya)?;
    let ra = ctx.scenario(
        Step::Run(3),
        &format!("through Sōya, {} km", o.distance_km),
        &route,
        0,
        o,
    );
    let gw_alive = sites.check();
    Ok(([r0, rd, ra], gw_alive))
}
