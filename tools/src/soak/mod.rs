//! `soya-soak`: the gateways under a long run of churn and faults, with
//! every byte accounted for (root only; see [`lab`] for the sites).
//!
//! Two workers (one per direction) run soya-perf client sessions back to
//! back, each opening 4 QPs for about a second with one of WRITE, SEND,
//! READ, atomic (sizes varying), all data verified by soya-perf, then
//! closing them. Meanwhile the fault schedule turns: WAN loss bursts
//! (netem), path cuts and restores, SIGHUP reloads that change the paths
//! and their rates, DC-side forgeries, and once, in the middle, a crash
//! and restart of gateway B (`kill -9`).
//!
//! Verdict (exit 1 on any violation):
//! - `bytes_lost`: bytes a client was told completed that never landed,
//!   outside the crash window (the documented gateway-crash case, counted
//!   apart in `bytes_lost_gateway_crash`): must be 0;
//! - `bytes_duplicated`: bytes the server took beyond what the client
//!   completed, in clean sessions: must be 0;
//! - `silent_failures`: a session that said it was clean but found data
//!   errors or lost bytes: must be 0;
//! - `sessions_failed_outside_crash`: a flow failed by a reload, a cut or
//!   a loss burst: must be 0 (reloads drop no flow);
//! - `rss_growth_pct`, `fd_growth` (per gateway, after warm-up against the
//!   end): RSS < 5 % growth, fds < 5 % growth. The warm-up lasts a
//!   quarter of the run (at least the 85 s the first QPs closed take to be
//!   forgotten by `qp::expiry` with the default `dc.give_up_after`), and
//!   RSS is judged only from a sample taken once the gateway's engine has
//!   forgotten QP halves (steady state: an event, not a time). A gateway
//!   that never got there (in a short run, B restarted at half time, and
//!   A whose halves that restart reset) has its RSS printed, not judged
//!   (`rss_judged`).
//!
//!   What is judged is the growth *beyond the deep buffer's high water*
//!   (`rss_growth_beyond_buffer_pct`); the raw figure is reported as
//!   `rss_growth_pct`. The gateway keeps freed heap on purpose
//!   (`soya_io::sys::keep_heap`: trimming cost page faults on every burst), and
//!   it holds each buffered packet in its own pooled buffer, so its RSS is
//!   the largest burst of packets it has held so far: a path cut under load
//!   after the warm-up sample, which drives the buffer's high water to a new
//!   peak, raises RSS for good (a 30-minute run at load 6–10: gateway A
//!   +27.1 %, a step of 21 MiB at 330 s while its high water rose by about
//!   4,700 slots, then +2 MiB over the next 1,450 s). That memory is
//!   bounded by `buffer.size` and is not a leak; anything else that grows
//!   is. So RSS minus (high water × slot bytes) must stay within 5 %.

pub mod lab;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

pub use crate::demo_common::Binaries;
use crate::netns::{netns_missing, try_in_netns};
use crate::perf::report::PerfReport;
use lab::{Lab, PathSpec};

/// Soak settings.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    pub duration: Duration,
    /// Each emulated link's rate and one-way delay.
    pub link_rate_mbps: u64,
    pub one_way_ms: f64,
    /// Where logs and configurations go (kept).
    pub dir: PathBuf,
    pub bins: Binaries,
    pub progress: bool,
}

/// How a failed session reached its application.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub at_s: f64,
    pub direction: &'static str,
    pub op: String,
    /// "error completion", "stall reported", "connection refused or timed out", ...
    pub how: String,
    pub error: String,
    pub in_crash_window: bool,
    /// Bytes its client was told completed that never landed (counted in
    /// `bytes_lost` or `bytes_lost_gateway_crash`): which session lost them.
    pub bytes_lost: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Usage {
    pub rss_kib: u64,
    pub fds: u64,
    pub buffer_slots_used: u64,
    /// The deep buffer's high water since the gateway started, in slots,
    /// and the bytes of a slot: the packets RSS has had to hold at once.
    pub buffer_high_water: u64,
    pub slot_bytes: u64,
    /// QP halves the engine knows (ingress + egress), and those it forgot
    /// once quiet (`qp::expiry`): what RSS follows under QP churn.
    pub halves: u64,
    pub halves_expired: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct GatewayUsage {
    pub site: String,
    pub warm: Usage,
    pub end: Usage,
    pub rss_growth_pct: f64,
    /// RSS growth not explained by the deep buffer's new high water (what
    /// is judged, see the module docs).
    pub rss_growth_beyond_buffer_pct: f64,
    pub fd_growth: i64,
    /// Its warm-up sample was taken once its engine had forgotten QP
    /// halves (`qp::expiry`): only then is RSS growth judged (a short run
    /// may never get there, see the module docs).
    pub rss_judged: bool,
}

/// The soak's outcome (`--json`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct SoakReport {
    pub duration_s: f64,
    pub sessions: u64,
    pub qps_opened: u64,
    pub ops_verified: u64,
    pub bytes_verified: u64,
    pub ops_by_kind: std::collections::BTreeMap<String, u64>,
    pub sessions_failed: u64,
    pub sessions_failed_outside_crash: u64,
    pub failures: Vec<Failure>,
    pub bytes_lost: u64,
    pub bytes_lost_gateway_crash: u64,
    pub bytes_duplicated: u64,
    pub silent_failures: u64,
    /// soya-wanem's Gilbert-Elliott burst loss on every link, both ways.
    pub loss_model: String,
    pub path_cuts: u64,
    pub reloads: u64,
    pub reload_summaries: Vec<String>,
    pub reload_errors: u64,
    pub twin_restarts: u64,
    pub forgeries_sent: u64,
    pub forgeries_counted: u64,
    /// Sent to gateway B before its crash and not counted by it (not
    /// judged: the crash window).
    pub forgeries_lost_in_crash: u64,
    /// Worst of the two gateways.
    pub rss_growth_pct: f64,
    /// Worst of the two gateways (judged: below 5 %).
    pub rss_growth_beyond_buffer_pct: f64,
    pub fd_growth: i64,
    pub gateways: Vec<GatewayUsage>,
    pub violations: Vec<String>,
}

const OPS: [&str; 4] = ["write", "send", "read", "atomic"];
const SIZES: [&str; 4] = ["4096", "65536", "16384", "1048576"];
const QPS_PER_SESSION: u64 = 4;

/// The path sets the reloads cycle through (link, rate as a fraction of
/// the link's): all three; one removed and a rate halved; two.
fn reload_sets(rate: u64) -> Vec<Vec<PathSpec>> {
    let p = |link, rate_mbps| PathSpec { link, rate_mbps };
    vec![
        vec![p(0, rate), p(1, rate), p(2, rate)],
        vec![p(0, rate), p(1, rate / 2)],
        vec![p(0, rate / 2), p(2, rate)],
        vec![p(0, rate), p(1, rate)],
    ]
}

struct Shared {
    report: Mutex<SoakReport>,
    stop: AtomicBool,
    /// Sessions whose client exited with a failure (evidence numbering).
    failures_seen: std::sync::atomic::AtomicU64,
    /// Crash windows, seconds since the start (the restart of gateway B).
    crash: Mutex<Vec<(f64, f64)>>,
    t0: Instant,
}

impl Shared {
    fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
    fn overlaps_crash(&self, from: f64, to: f64) -> bool {
        self.crash
            .lock()
            .map(|w| w.iter().any(|&(a, b)| from < b && to > a))
            .unwrap_or(false)
    }
}

/// Runs the soak; `Err` only when the lab cannot be built or breaks.
pub fn run(o: &SoakOptions) -> Result<SoakReport, String> {
    if let Some(missing) = netns_missing(&[]) {
        return Err(format!("soya-soak needs {missing}"));
    }
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let sets = reload_sets(o.link_rate_mbps);
    let horizon = o.duration.as_secs_f64() + 120.0;
    let mut lab = Lab::build(
        &o.bins,
        &o.dir,
        o.one_way_ms,
        o.link_rate_mbps,
        &sets[0],
        horizon,
    )?;
    lab.wait_connected(Duration::from_secs(20))?;
    let shared = Arc::new(Shared {
        report: Mutex::new(SoakReport::default()),
        stop: AtomicBool::new(false),
        failures_seen: Default::default(),
        crash: Mutex::new(Vec::new()),
        t0: Instant::now(),
    });
    // soya-perf servers: hB 10.2.0.1 (A→B sessions), hA 10.1.0.2 (B→A).
    for (ns, ip) in [(&lab.host[1], "10.2.0.1"), (&lab.host[0], "10.1.0.2")] {
        let log = std::fs::File::create(o.dir.join(format!("server-{ip}.log")))
            .map_err(|e| e.to_string())?;
        let ns = ns.clone();
        lab.procs.spawn(
            &ns,
            &o.bins.perf,
            &["server", "--bind-ip", ip, "--quiet"],
            |c| {
                c.stdout(std::process::Stdio::null()).stderr(log);
            },
        )?;
    }
    std::thread::sleep(Duration::from_millis(300));
    let workers: Vec<_> = [
        ("A→B", lab.host[0].clone(), "10.1.0.1", "10.2.0.1"),
        ("B→A", lab.host[1].clone(), "10.2.0.2", "10.1.0.2"),
    ]
    .into_iter()
    .map(|(dir, ns, me, server)| {
        let sh = shared.clone();
        let perf = o.bins.perf.clone();
        let at = Evidence {
            sockets: [lab.socket(0), lab.socket(1)],
            dir: o.dir.clone(),
        };
        std::thread::spawn(move || worker(&sh, dir, &ns, me, server, &perf, &at))
    })
    .collect();
    bump(&shared, |r| {
        r.loss_model = format!(
            "Gilbert-Elliott p_enter {} p_leave {} loss_in_bad {} on every link, both ways",
            lab::GE[0],
            lab::GE[1],
            lab::GE[2]
        );
    });
    let result = schedule(o, &mut lab, &shared, &sets);
    shared.stop.store(true, Ordering::Release);
    for w in workers {
        let _ = w.join();
    }
    let forgery = result?;
    // The traffic has stopped: every forgery sent is counted now or never.
    let (sent, counted) = forgery.settle(&lab);
    bump(&shared, |r| {
        r.forgeries_sent = sent;
        r.forgeries_counted = counted;
        r.forgeries_lost_in_crash = forgery.lost_in_crash;
    });
    // Quiet: let the buffers empty, then the end figures.
    std::thread::sleep(Duration::from_secs(2));
    let end: Vec<Usage> = (0..2).map(|i| usage(&lab, i)).collect();
    let mut r = shared.report.lock().map_err(|_| "poisoned")?.clone();
    r.duration_s = shared.now_s();
    for (g, e) in r.gateways.iter_mut().zip(end) {
        g.end = e;
        g.rss_growth_pct = growth_pct(g.warm.rss_kib, g.end.rss_kib);
        g.rss_growth_beyond_buffer_pct = growth_beyond_buffer_pct(&g.warm, &g.end);
        g.fd_growth = g.end.fds as i64 - g.warm.fds as i64;
    }
    r.rss_growth_pct = r
        .gateways
        .iter()
        .map(|g| g.rss_growth_pct)
        .fold(0.0, f64::max);
    r.rss_growth_beyond_buffer_pct = r
        .gateways
        .iter()
        .map(|g| g.rss_growth_beyond_buffer_pct)
        .fold(0.0, f64::max);
    r.fd_growth = r.gateways.iter().map(|g| g.fd_growth).max().unwrap_or(0);
    judge(&mut r);
    Ok(r)
}

fn growth_pct(from: u64, to: u64) -> f64 {
    if from == 0 {
        return 0.0;
    }
    (to as f64 - from as f64) * 100.0 / from as f64
}

/// RSS growth from `warm` to `end` less the memory of the packets the deep
/// buffer's high water rose by, as a share of the warm RSS.
fn growth_beyond_buffer_pct(warm: &Usage, end: &Usage) -> f64 {
    if warm.rss_kib == 0 {
        return 0.0;
    }
    let peak_kib = |u: &Usage| (u.buffer_high_water * u.slot_bytes) as f64 / 1024.0;
    let grown = end.rss_kib as f64 - warm.rss_kib as f64;
    let packets = (peak_kib(end) - peak_kib(warm)).max(0.0);
    (grown - packets) * 100.0 / warm.rss_kib as f64
}

fn judge(r: &mut SoakReport) {
    let mut v = Vec::new();
    if r.bytes_lost > 0 {
        v.push(format!(
            "{} bytes lost outside the gateway crash",
            r.bytes_lost
        ));
    }
    if r.bytes_duplicated > 0 {
        v.push(format!("{} bytes duplicated", r.bytes_duplicated));
    }
    if r.silent_failures > 0 {
        v.push(format!("{} silent failures", r.silent_failures));
    }
    if r.sessions_failed_outside_crash > 0 {
        v.push(format!(
            "{} sessions failed outside the gateway crash (a reload, cut or loss burst dropped a flow)",
            r.sessions_failed_outside_crash
        ));
    }
    if r.ops_verified == 0 {
        v.push("no operation verified".into());
    }
    if r.reload_errors > 0 {
        v.push(format!("{} reloads reported errors", r.reload_errors));
    }
    for g in &r.gateways {
        if g.rss_judged && g.rss_growth_beyond_buffer_pct >= 5.0 {
            v.push(format!(
                "gateway {}: RSS grew {:.1} % after warm-up, {:.1} % beyond the deep buffer's new high water",
                g.site, g.rss_growth_pct, g.rss_growth_beyond_buffer_pct
            ));
        }
        if g.warm.fds > 0 && g.fd_growth as f64 >= 0.05 * g.warm.fds as f64 && g.fd_growth > 0 {
            v.push(format!(
                "gateway {}: {} more fds after warm-up",
                g.site, g.fd_growth
            ));
        }
    }
    if r.forgeries_counted + r.forgeries_lost_in_crash < r.forgeries_sent {
        v.push(format!(
            "{} forgeries sent, {} counted by the gateways ({} lost in the crash)",
            r.forgeries_sent, r.forgeries_counted, r.forgeries_lost_in_crash
        ));
    }
    r.violations = v;
}

/// A gateway is in steady state once its engine has forgotten QP halves
/// (`qp::expiry`): from then on it holds as many halves as the churn keeps
/// alive, and RSS growth means a leak. Before, every QP closed still adds
/// a half, and how many a run piles up depends on the machine's speed (a
/// 2-minute run on a quiet machine grew gateway A 5.8 % this way, with 0
/// halves forgotten: B's restart at half time had reset A's halves).
fn in_steady_state(u: &Usage) -> bool {
    u.halves_expired > 0
}

fn usage(lab: &Lab, i: usize) -> Usage {
    let (rss_kib, fds) = lab
        .gateway_pid(i)
        .and_then(lab::rss_and_fds)
        .unwrap_or((0, 0));
    let status = soya::client::query(&lab.socket(i)).ok();
    let e = status.as_ref().map(|s| &s.engine);
    Usage {
        rss_kib,
        fds,
        buffer_slots_used: status.as_ref().map_or(0, |s| s.buffer.slots_used),
        buffer_high_water: status.as_ref().map_or(0, |s| s.buffer.high_water),
        slot_bytes: status.as_ref().map_or(0, |s| s.buffer.slot_bytes),
        halves: e.map_or(0, |e| e.halves_ingress + e.halves_egress),
        halves_expired: e.map_or(0, |e| e.halves_expired_ingress + e.halves_expired_egress),
    }
}

/// Where a failed session's evidence goes: both gateways' status (paths,
/// flows, counters) taken as the failure is seen, so that a stall can be
/// told from a cut, a full buffer or a transport that stopped.
struct Evidence {
    sockets: [PathBuf; 2],
    dir: PathBuf,
}

impl Evidence {
    fn save(&self, n: u64, direction: &str, op: &str) {
        for (i, sock) in self.sockets.iter().enumerate() {
            let v =
                lab::control(sock, "status").unwrap_or_else(|e| serde_json::json!({ "error": e }));
            let f = self.dir.join(format!(
                "failure-{n}-{}-{op}-gateway-{}.json",
                direction.replace('→', "-"),
                ["a", "b"][i]
            ));
            let _ = std::fs::write(f, v.to_string());
        }
    }
}

/// Client sessions back to back until told to stop.
fn worker(
    sh: &Shared,
    direction: &'static str,
    ns: &str,
    me: &str,
    server: &str,
    perf: &std::path::Path,
    evidence: &Evidence,
) {
    let mut n: usize = if direction == "A→B" { 0 } else { 2 };
    while !sh.stop.load(Ordering::Acquire) {
        let op = OPS[n % OPS.len()];
        let size = if op == "atomic" {
            "8"
        } else {
            SIZES[(n / OPS.len()) % SIZES.len()]
        };
        n += 1;
        let from = sh.now_s();
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(perf)
            .args([
                "client",
                "--bind-ip",
                me,
                "--op",
                op,
                "--size",
                size,
                "--qps",
                "4",
                "--tx-depth",
                "16",
                "--duration",
                "1",
                "--stall-timeout",
                "8",
                "--connect-timeout",
                "10",
                "--json",
                "--quiet",
                server,
            ])
            .stdin(std::process::Stdio::null())
            .output();
        let to = sh.now_s();
        let crash = sh.overlaps_crash(from, to);
        let failed = !matches!(&out, Ok(o) if o.status.success());
        if failed {
            let n = sh.failures_seen.fetch_add(1, Ordering::AcqRel);
            if n < 20 {
                evidence.save(n, direction, op);
            }
        }
        // This session's failure, whatever the cause.
        let failure = |how: &str, error: String, bytes_lost: u64| Failure {
            at_s: from,
            direction,
            op: op.into(),
            how: how.into(),
            error,
            in_crash_window: crash,
            bytes_lost,
        };
        let Ok(mut r) = sh.report.lock() else { return };
        r.sessions += 1;
        r.qps_opened += QPS_PER_SESSION;
        let report: Option<PerfReport> = out.as_ref().ok().and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout);
            text.lines()
                .rev()
                .find_map(|l| serde_json::from_str(l).ok())
        });
        let Some(p) = report else {
            let err = match &out {
                Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                Err(e) => e.to_string(),
            };
            fail(&mut r, failure("no report (client failed)", err, 0));
            continue;
        };
        if p.ok {
            r.ops_verified += p.messages;
            r.bytes_verified += p.bytes_verified;
            *r.ops_by_kind.entry(op.to_string()).or_default() += p.messages;
            if p.data_errors > 0 || p.bytes_lost > 0 {
                r.silent_failures += 1;
            }
            if let Some(s) = &p.server {
                if matches!(op, "write" | "send") {
                    r.bytes_duplicated += s.bytes.saturating_sub(p.bytes);
                }
            }
        } else {
            let how = if p.failed_completions > 0 {
                "error completion"
            } else if p.errors.iter().any(|e| e.contains("stall")) {
                "stall reported"
            } else if p.messages == 0 {
                "connection refused or timed out"
            } else {
                "error reported"
            };
            let error = p.error.clone().unwrap_or_default();
            fail(&mut r, failure(how, error, p.bytes_lost));
        }
        if crash {
            r.bytes_lost_gateway_crash += p.bytes_lost;
        } else {
            r.bytes_lost += p.bytes_lost;
        }
    }
}

fn fail(r: &mut SoakReport, f: Failure) {
    r.sessions_failed += 1;
    if !f.in_crash_window {
        r.sessions_failed_outside_crash += 1;
    }
    if r.failures.len() < 200 {
        r.failures.push(f);
    }
}

/// The fault schedule, on the main thread, until the duration is over.
fn schedule(
    o: &SoakOptions,
    lab: &mut Lab,
    sh: &Shared,
    sets: &[Vec<PathSpec>],
) -> Result<Forgery, String> {
    let total = o.duration.as_secs_f64();
    // Warm-up: every op and size has run (a size cycle is ~20 s), the deep
    // buffer's slots and the pools were touched, and the QPs closed first
    // have been forgotten (`qp::expiry`: quiet for 15 x dc.give_up_after,
    // swept every quarter of that), so the engine holds as many QP halves
    // as it will in steady state; a quarter of the run, at least that
    // long, at most 5 minutes.
    let forgotten = soya_proto::qp::engine::expiry::idle_after(soya_config::DEFAULT_GIVE_UP_AFTER)
        .as_secs_f64()
        * 1.25
        + 10.0;
    let warm_at = (total * 0.25).clamp(forgotten.min(300.0), 300.0);
    let mut b_warm_at: Option<f64> = None;
    let crash_at = total * 0.5;
    let mut warm_done = false;
    let mut awaiting_steady = [false; 2];
    let mut crashed = false;
    let mut set = 0usize;
    let mut tick = 0u64;
    let mut forgery = Forgery::new(lab)?;
    let mut next_progress = 10.0;
    loop {
        let t = sh.now_s();
        if t >= total {
            return Ok(forgery);
        }
        lab.check()?;
        tick += 1;
        // Every second something; the phases are offsets in a 30 s cycle.
        // Cuts are scheduled in soya-wanem (lab::cuts): count those begun.
        let wt = lab.wanem_t0.elapsed().as_secs_f64();
        let cuts = (0..lab::LINKS)
            .map(|k| lab::cuts(k, wt).len() as u64)
            .sum::<u64>();
        bump(sh, |r| r.path_cuts = cuts);
        // A reload every 15 s, offset from the cuts.
        if tick % 15 == 7 {
            set = (set + 1) % sets.len();
            lab.write_configs(&sets[set])?;
            lab.reload();
            std::thread::sleep(Duration::from_millis(300));
            for i in 0..2 {
                let ans = lab::control(&lab.socket(i), "last-reload");
                let (summary, errors) = match &ans {
                    Ok(v) => (
                        v["summary"].as_str().unwrap_or("").to_string(),
                        v["errors"].as_array().map_or(0, |a| a.len()),
                    ),
                    Err(e) => (format!("no answer: {e}"), 1),
                };
                bump(sh, |r| {
                    r.reloads += 1;
                    r.reload_errors += errors as u64;
                    if r.reload_summaries.len() < 20 {
                        r.reload_summaries
                            .push(format!("{:.0}s gw{i}: {summary}", sh.now_s()));
                    }
                });
            }
        }
        if tick % 5 == 0 {
            let (sent, counted) = forgery.round(lab)?;
            bump(sh, |r| {
                r.forgeries_sent = sent;
                r.forgeries_counted = counted;
            });
        }
        if !warm_done && t >= warm_at {
            warm_done = true;
            let u: Vec<GatewayUsage> = (0..2)
                .map(|i| {
                    let warm = usage(lab, i);
                    let rss_judged = in_steady_state(&warm);
                    awaiting_steady[i] = !rss_judged;
                    GatewayUsage {
                        site: ["a", "b"][i].into(),
                        warm,
                        rss_judged,
                        ..Default::default()
                    }
                })
                .collect();
            bump(sh, |r| r.gateways = u);
        }
        // A gateway not yet in steady state at its warm-up takes its warm
        // sample again once it is (an event, not a time: how many QP halves
        // a run piles up before the first expiry depends on the machine).
        for (i, awaiting) in awaiting_steady.iter_mut().enumerate() {
            if !*awaiting || (i == 1 && b_warm_at.is_some()) {
                continue;
            }
            let warm = usage(lab, i);
            if in_steady_state(&warm) {
                *awaiting = false;
                bump(sh, |r| {
                    if let Some(g) = r.gateways.get_mut(i) {
                        g.warm = warm;
                        g.rss_judged = true;
                    }
                });
            }
        }
        if !crashed && t >= crash_at {
            crashed = true;
            forgery.restarting(lab, 1);
            let from = sh.now_s();
            // Sessions that began before the crash and end within the
            // twin timeout after the session is back may be failed by it.
            // The window opens before the kill, with no end yet: a session
            // failed by the crash may end (and be judged) while B is still
            // restarting (the 2-minute test once counted such a READ as a
            // failure outside the crash).
            let window = sh.crash.lock().map(|mut c| {
                c.push((from - 12.0, f64::INFINITY));
                c.len() - 1
            });
            lab.restart_gateway(&o.bins, 1)?;
            lab.wait_connected(Duration::from_secs(30))?;
            let to = sh.now_s() + 10.0;
            if let (Ok(mut c), Ok(i)) = (sh.crash.lock(), window) {
                c[i].1 = to;
            }
            forgery.restarted(lab, 1);
            bump(sh, |r| r.twin_restarts += 1);
            b_warm_at = Some(sh.now_s() + warm_at.min((total - sh.now_s()) / 2.0));
        }
        if b_warm_at.is_some_and(|w| sh.now_s() >= w) {
            b_warm_at = None;
            // Gateway B's figures after its restart's warm-up (once; again
            // below once it reaches steady state, if it had not).
            let b = usage(lab, 1);
            awaiting_steady[1] = !in_steady_state(&b);
            bump(sh, |r| {
                if let Some(g) = r.gateways.get_mut(1) {
                    if g.site == "b" {
                        g.site = "b (after restart)".into();
                        g.rss_judged = in_steady_state(&b);
                        g.warm = b;
                    }
                }
            });
        }
        if o.progress && t >= next_progress {
            next_progress += 10.0;
            if let Ok(r) = sh.report.lock() {
                let rss: Vec<String> = (0..2)
                    .map(|i| {
                        let u = usage(lab, i);
                        format!(
                            "{} MiB/{} fds/{} halves ({} forgotten)",
                            u.rss_kib >> 10,
                            u.fds,
                            u.halves,
                            u.halves_expired
                        )
                    })
                    .collect();
                eprintln!(
                    "soak {:>5.0}/{total:.0} s: {} sessions ({} QPs), {} ops verified, {} failed ({} outside crash), lost {} B, reloads {}, cuts {}, gateways {}",
                    t,
                    r.sessions,
                    r.qps_opened,
                    r.ops_verified,
                    r.sessions_failed,
                    r.sessions_failed_outside_crash,
                    r.bytes_lost,
                    r.reloads,
                    r.path_cuts,
                    rss.join(", ")
                );
            }
        }
        let next = Duration::from_secs(tick);
        let el = sh.t0.elapsed();
        if next > el {
            std::thread::sleep(next - el);
        }
    }
}

fn bump(sh: &Shared, f: impl FnOnce(&mut SoakReport)) {
    if let Ok(mut r) = sh.report.lock() {
        f(&mut r);
    }
}

/// DC-side forgeries from each host toward the other site: a RoCE packet
/// with a wrong ICRC and one cut short. The gateways must count every one.
///
/// Accounted per gateway (host A's go through gateway A, host B's through
/// B). A forgery is counted when the gateway's counters show it; nothing
/// is judged on how soon: the rounds during the run only report progress,
/// and the verdict is taken after the traffic stopped, waiting for each
/// gateway's count to reach what was sent to it ([`Forgery::settle`]).
struct Forgery {
    socks: Vec<(std::net::UdpSocket, &'static str)>,
    /// Per gateway: sent in all, counted by its earlier incarnations (or
    /// credited at its restart, see [`Forgery::restarting`]), and its
    /// counter when its present incarnation was first read.
    sent: [u64; 2],
    before_restart: [u64; 2],
    base: [u64; 2],
    /// Sent to a gateway that was killed before it counted them.
    lost_in_crash: u64,
}

impl Forgery {
    fn new(lab: &Lab) -> Result<Forgery, String> {
        let mut socks = Vec::new();
        for (i, (me, peer)) in [("10.1.0.1", "10.2.0.1"), ("10.2.0.2", "10.1.0.2")]
            .into_iter()
            .enumerate()
        {
            let me = me.to_string();
            let s = try_in_netns(&lab.host[i], move || {
                std::net::UdpSocket::bind((me.as_str(), 0))
            })?
            .map_err(|e| format!("forgery socket: {e}"))?;
            socks.push((s, peer));
        }
        let base = [0, 1].map(|i| Self::counted_by(lab, i).unwrap_or(0));
        Ok(Forgery {
            socks,
            sent: [0; 2],
            before_restart: [0; 2],
            base,
            lost_in_crash: 0,
        })
    }

    /// What gateway `i` counted as bad ICRC or malformed (None: it did
    /// not answer).
    fn counted_by(lab: &Lab, i: usize) -> Option<u64> {
        soya::client::query(&lab.socket(i))
            .ok()
            .map(|s| s.engine.dc_bad_icrc + s.engine.dc_malformed)
    }

    /// Forgeries gateway `i` has counted (a gateway that does not answer
    /// now is taken at what it had counted at its start).
    fn counted(&self, lab: &Lab, i: usize) -> u64 {
        let now = Self::counted_by(lab, i).unwrap_or(self.base[i]);
        (now.saturating_sub(self.base[i]) + self.before_restart[i]).min(self.sent[i])
    }

    fn totals(&self, lab: &Lab) -> (u64, u64) {
        (
            self.sent.iter().sum(),
            (0..2).map(|i| self.counted(lab, i)).sum(),
        )
    }

    /// Gateway `i` is about to be killed: waits (a bounded while) for it
    /// to count what was sent to it; what it has not counted then goes
    /// with it (`lost_in_crash`, reported, in the crash window).
    fn restarting(&mut self, lab: &Lab, i: usize) {
        let counted = self.wait_counted(lab, i);
        self.lost_in_crash += self.sent[i] - counted;
        self.before_restart[i] = self.sent[i];
    }

    /// Gateway `i` runs again: its counters begin again.
    fn restarted(&mut self, lab: &Lab, i: usize) {
        self.base[i] = Self::counted_by(lab, i).unwrap_or(0);
    }

    /// Waits until gateway `i` has counted every forgery sent to it, or
    /// its count stopped moving for a long while (a forgery it will never
    /// count: the verdict shows it). Returns its count.
    fn wait_counted(&self, lab: &Lab, i: usize) -> u64 {
        let mut last = self.counted(lab, i);
        let mut still_since = Instant::now();
        while last < self.sent[i] && still_since.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(100));
            let c = self.counted(lab, i);
            if c != last {
                last = c;
                still_since = Instant::now();
            }
        }
        last
    }

    /// The final count, once the traffic has stopped: (sent, counted).
    fn settle(&self, lab: &Lab) -> (u64, u64) {
        let counted = (0..2).map(|i| self.wait_counted(lab, i)).sum();
        (self.sent.iter().sum(), counted)
    }

    /// Sends a round; returns (sent, counted so far) for progress.
    fn round(&mut self, lab: &Lab) -> Result<(u64, u64), String> {
        // A BTH (RC SEND ONLY to QPN 0x123456) with an 8-byte payload and a
        // wrong ICRC; and the same BTH cut to 7 bytes.
        let mut bth = vec![
            0x04, 0x40, 0xff, 0xff, 0x00, 0x12, 0x34, 0x56, 0x80, 0, 0, 1,
        ];
        bth.extend_from_slice(&[0xab; 8]);
        bth.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        for (i, (s, peer)) in self.socks.iter().enumerate() {
            for pkt in [&bth[..], &bth[..7]] {
                if s.send_to(pkt, (*peer, 4791)).is_ok() {
                    self.sent[i] += 1;
                }
            }
        }
        Ok(self.totals(lab))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(rss_mib: u64, high_water: u64) -> Usage {
        Usage {
            rss_kib: rss_mib * 1024,
            fds: 17,
            buffer_high_water: high_water,
            slot_bytes: 4608,
            halves_expired: 1,
            ..Usage::default()
        }
    }

    fn judged(warm: Usage, end: Usage) -> Vec<String> {
        let mut g = GatewayUsage {
            site: "a".into(),
            rss_judged: true,
            ..GatewayUsage::default()
        };
        g.rss_growth_pct = growth_pct(warm.rss_kib, end.rss_kib);
        g.rss_growth_beyond_buffer_pct = growth_beyond_buffer_pct(&warm, &end);
        (g.warm, g.end) = (warm, end);
        let mut r = SoakReport {
            ops_verified: 1,
            gateways: vec![g],
            ..SoakReport::default()
        };
        judge(&mut r);
        r.violations
    }

    /// The 30-minute run's gateway A: +21 MiB while the high water rose by
    /// 4,800 slots of 4,608 bytes (21.1 MiB) is the buffer, not a leak.
    #[test]
    fn rss_that_follows_the_buffers_high_water_is_not_a_leak() {
        assert_eq!(
            judged(usage(88, 5_000), usage(110, 9_800)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn rss_that_grows_without_the_buffer_is_a_leak() {
        let v = judged(usage(88, 9_800), usage(110, 9_800));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("25.0 % after warm-up, 25.0 % beyond"),
            "{v:?}"
        );
        // Growth larger than the buffer's new peak explains is still judged.
        let v = judged(usage(88, 5_000), usage(130, 9_800));
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn without_a_new_high_water_nothing_is_excused() {
        // The high water never falls; the figures used are the high water,
        // not the slots in use, so a sample at a busy moment cannot excuse
        // growth either way.
        assert!(growth_beyond_buffer_pct(&usage(100, 9_000), &usage(110, 9_000)) >= 9.9);
    }
}
