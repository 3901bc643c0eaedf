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

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::demo_circuit;
use crate::demo_common::{
    demo_gateway_env, flow_quota, path_rate, DemoBackend, RELAY_SLACK_US, US_PER_KM,
};
pub use crate::demo_common::{Binaries, DemoOptions, DEFAULT_RATE_BPS};
use crate::demo_report::{self, Calibration, Outcome};
use crate::size::{parse_size, MAX_SIZE};

const HOST_A: &str = "10.1.0.1";
const HOST_B: &str = "10.2.0.1";
const LO: &str = "127.0.0.1";

/// Child processes, killed (and reaped) when dropped.
#[derive(Default)]
struct Children(Vec<(String, Child)>);

impl Children {
    fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<(), String> {
        let c = soya::sys::die_with_parent(cmd)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        self.0.push((name.to_string(), c));
        Ok(())
    }

    /// Fails if a child exited already.
    fn check(&mut self) -> Result<(), String> {
        for (n, c) in &mut self.0 {
            if let Ok(Some(st)) = c.try_wait() {
                return Err(format!("{n} exited early ({st})"));
            }
        }
        Ok(())
    }

    fn stop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.0.clear();
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port for a process the demo starts, free when picked. Picked below
/// the kernel's ephemeral range: a port found with `bind(0)` and then
/// released could be handed to another socket's `bind(0)` before the
/// gateway or relay binds it (seen in CI: "Address already in use" with
/// the demo tests running side by side), while the kernel never hands out
/// ports below that range on its own. A counter shared by the process
/// keeps its demos (tests run them in parallel threads) off each other's
/// picks.
fn free_port(free: impl Fn(u16) -> bool) -> Option<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    const SPAN: u32 = 8_192;
    if lo > SPAN + 1_024 {
        let base = lo - SPAN;
        let start = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
        for _ in 0..SPAN {
            let p = base + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
            if free(p as u16) {
                return Some(p as u16);
            }
        }
    }
    None
}

fn free_udp() -> Result<u16, String> {
    free_port_or_any("UDP", |p| UdpSocket::bind((LO, p))?.local_addr())
}

fn free_tcp() -> Result<u16, String> {
    free_port_or_any("TCP", |p| TcpListener::bind((LO, p))?.local_addr())
}

/// A [`free_port`] that `bind` (a bind to loopback port `p`, giving the
/// address bound) can take, else the port the kernel picks for `bind(0)`.
fn free_port_or_any(
    proto: &str,
    bind: impl Fn(u16) -> std::io::Result<SocketAddr>,
) -> Result<u16, String> {
    if let Some(p) = free_port(|p| bind(p).is_ok()) {
        return Ok(p);
    }
    bind(0)
        .map(|a| a.port())
        .map_err(|e| format!("no free {proto} port: {e}"))
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::new(LO.parse().expect("loopback"), port)
}

fn log_file(dir: &Path, name: &str) -> Stdio {
    std::fs::File::create(dir.join(format!("{name}.log")))
        .map_or_else(|_| Stdio::null(), Stdio::from)
}

/// Where a scenario's two hosts send their datagrams.
#[derive(Clone)]
enum Route {
    /// Client to server's socket (or a relay in front of it); server answers
    /// the sender.
    Direct { client_to: SocketAddr },
    /// Each host to its gateway's `dc.listen`.
    Gateways { a: SocketAddr, b: SocketAddr },
    /// Real RoCEv2 between hosts in these network namespaces (`--netns`),
    /// routed by the namespaces in between.
    Netns { a: String, b: String },
}

struct Ctx<'a> {
    bins: &'a Binaries,
    dir: PathBuf,
    quiet: bool,
}

impl Ctx<'_> {
    /// Starts a [`wanem_cmd`] relay as `soya-wanem (<what>)`, its error
    /// output in the log `wanem-<what without spaces>`.
    fn spawn_wanem(
        &self,
        kids: &mut Children,
        o: &DemoOptions,
        what: &str,
        zero_km: bool,
        pairs: &[(u16, u16)],
    ) -> Result<(), String> {
        let log = log_file(&self.dir, &format!("wanem-{}", what.replace(' ', "")));
        let mut c = wanem_cmd(self.bins, o, zero_km, pairs, log);
        kids.spawn(&format!("soya-wanem ({what})"), &mut c)
    }

    fn say(&self, s: &str) {
        if !self.quiet {
            let mut o = std::io::stderr().lock();
            let _ = writeln!(o, "{s}");
        }
    }

    /// One soya-perf session: server child + client child; the client's
    /// JSON report.
    fn perf(
        &self,
        tag: &str,
        route: &Route,
        ports: (u16, u16),
        args: &[String],
    ) -> Result<Value, String> {
        let (client_port, server_port) = ports;
        let ctl = free_tcp()?;
        let mut kids = Children::default();
        // A soya-perf command, run inside `ns` when there is one.
        let perf_in = |ns: Option<&str>| match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bins.perf);
                c
            }
            None => Command::new(&self.bins.perf),
        };
        let mut srv;
        if let Route::Netns { b, .. } = route {
            srv = perf_in(Some(b));
            srv.args(["server", "--once", "--json", "--quiet", "--bind-ip", HOST_B])
                .args(["--port", &ctl.to_string(), "--accept-timeout", "20"]);
        } else {
            srv = perf_in(None);
            srv.args(["server", "--once", "--json", "--quiet", "--bind-ip", LO])
                .args(["--port", &ctl.to_string()])
                .args(["--roce-port", &server_port.to_string()])
                .args(["--roce-ip", HOST_B, "--accept-timeout", "20"]);
            if let Route::Gateways { b, .. } = route {
                srv.args(["--gateway", &b.to_string()]);
            } else {
                srv.arg("--ip-in-udp");
            }
        }
        srv.stdout(log_file(&self.dir, &format!("{tag}-server")))
            .stderr(log_file(&self.dir, &format!("{tag}-server.err")));
        kids.spawn("soya-perf server", &mut srv)?;

        let mut cli;
        if let Route::Netns { a, .. } = route {
            cli = perf_in(Some(a));
            cli.args(["client", HOST_B, "--json", "--bind-ip", HOST_A])
                .args(["--port", &ctl.to_string(), "--connect-timeout", "10"]);
        } else {
            cli = perf_in(None);
            cli.args(["client", LO, "--json", "--bind-ip", LO])
                .args(["--roce-port", &client_port.to_string()])
                .args(["--port", &ctl.to_string(), "--roce-ip", HOST_A])
                .args(["--connect-timeout", "10"]);
        }
        cli.args(args);
        match route {
            Route::Direct { client_to } => {
                cli.args(["--peer", &client_to.to_string()]);
            }
            Route::Gateways { a, .. } => {
                cli.args(["--gateway", &a.to_string()]);
            }
            Route::Netns { .. } => {}
        }
        if self.quiet {
            cli.arg("--quiet").stderr(Stdio::null());
        } else {
            cli.stderr(Stdio::inherit());
        }
        let out = soya::sys::die_with_parent(&mut cli)
            .stdout(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run soya-perf client: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().rev().find(|l| l.trim_start().starts_with('{'));
        let v: Value = line
            .and_then(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| {
                format!(
                    "{tag}: soya-perf client gave no report ({}); logs in {}",
                    out.status,
                    self.dir.display()
                )
            })?;
        // The server exits after its session (--once); give it a moment.
        if let Some((_, c)) = kids.0.first_mut() {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(3) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(v)
    }

    /// A scenario: its throughput run, and for the demo's runs (not the
    /// calibration's) the latency probe.
    fn scenario(
        &self,
        step: Step,
        title: &str,
        route: &Route,
        server_port: u16,
        o: &DemoOptions,
    ) -> Outcome {
        let ports = match scenario_ports(server_port) {
            Ok(p) => p,
            Err(e) => {
                return Outcome {
                    errors: vec![e],
                    ..Outcome::default()
                }
            }
        };
        let mut out = self.throughput(step, title, route, ports, o);
        if let Step::Run(n) = step {
            self.latency(n, title, route, ports, &mut out);
        }
        out
    }

    /// The WRITE throughput run of a scenario, with the requester's window
    /// of `o`.
    fn throughput(
        &self,
        step: Step,
        title: &str,
        route: &Route,
        ports: (u16, u16),
        o: &DemoOptions,
    ) -> Outcome {
        let mut out = Outcome::default();
        let window = o.window_packets();
        self.say(&format!(
            "[{step}] {title}: RDMA WRITE {} B, tx-depth 128, window {window} x 4 KiB, {} s",
            o.size, o.duration
        ));
        let tag = step.tag();
        let bw = [
            "--size".to_string(),
            o.size.to_string(),
            "--tx-depth".into(),
            "128".into(),
            "--window".into(),
            window.to_string(),
            "--mtu".into(),
            "4096".into(),
            "--duration".into(),
            format!("{}", o.duration),
        ];
        match self.perf(&tag, route, ports, &bw) {
            Ok(v) => {
                let u = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
                out.requester_gbps = v.get("goodput_gbps").and_then(Value::as_f64).unwrap_or(0.0);
                out.gbps = v
                    .pointer("/server/goodput_gbps")
                    .and_then(Value::as_f64)
                    .unwrap_or(out.requester_gbps);
                out.retransmissions = u("retransmissions");
                out.data_errors = u("data_errors");
                out.ok = v.get("ok").and_then(Value::as_bool).unwrap_or(false);
                if let Some(e) = v.get("errors").and_then(Value::as_array) {
                    out.errors
                        .extend(e.iter().filter_map(|x| x.as_str().map(String::from)));
                }
                if !out.ok && out.errors.is_empty() {
                    out.errors.push("soya-perf reported a failed run".into());
                }
            }
            Err(e) => out.errors.push(e),
        }
        self.say(&format!(
            "[{step}] {title}: {:.3} Gb/s end to end ({:.3} Gb/s completed at the requester), \
             {} retransmissions, {} data errors{}",
            out.gbps,
            out.requester_gbps,
            out.retransmissions,
            out.data_errors,
            if out.ok { "" } else { " (FAILED)" }
        ));
        out
    }

    /// The latency probe of scenario `n`: the RTT the requester sees.
    fn latency(&self, n: u8, title: &str, route: &Route, ports: (u16, u16), out: &mut Outcome) {
        let lat = [
            "--size".to_string(),
            "64".into(),
            "--lat".into(),
            "--duration".into(),
            "1".into(),
        ];
        self.say(&format!(
            "[{n}/3] {title}: latency probe (64 B WRITEs, 1 s)"
        ));
        match self.perf(&format!("run{n}-lat"), route, ports, &lat) {
            Ok(v) => {
                out.rtt_ms = v
                    .pointer("/latency/p50_us")
                    .and_then(Value::as_f64)
                    .map(|us| us / 1000.0);
                let e = v.get("data_errors").and_then(Value::as_u64).unwrap_or(0);
                out.data_errors += e;
                if e > 0 {
                    out.ok = false;
                    out.errors.push(format!("latency probe: {e} data errors"));
                }
            }
            Err(e) => out.errors.push(format!("latency probe: {e}")),
        }
    }
}

/// Which of the demo's scenarios: calibration `k` of 2, or run `n` of 3.
#[derive(Clone, Copy, Debug)]
enum Step {
    Calibration(u8),
    Run(u8),
}

impl Step {
    /// The name of its logs.
    fn tag(self) -> String {
        match self {
            Step::Calibration(k) => format!("calibration{k}"),
            Step::Run(n) => format!("run{n}"),
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Calibration(k) => write!(f, "calibration {k}/2"),
            Step::Run(n) => write!(f, "{n}/3"),
        }
    }
}

/// The client's and the server's UDP port of a scenario on loopback (the
/// same for both of its sessions: a gateway keeps a lab host's learned
/// address until it has been silent for 2 s); `server_port` 0 picks one.
fn scenario_ports(server_port: u16) -> Result<(u16, u16), String> {
    let c = free_udp()?;
    let s = if server_port == 0 {
        free_udp()?
    } else {
        server_port
    };
    Ok((c, s))
}

/// One gateway's part of the lab.
struct GwSide<'a> {
    site: &'a str,
    dc: u16,
    local: &'a str,
    remote: &'a str,
    binds: &'a [u16],
    remotes: &'a [u16],
    socket: PathBuf,
}

fn gateway_config(g: &GwSide, rtt_us: f64, o: &DemoOptions) -> String {
    let rate = path_rate(o);
    let quota = flow_quota(o);
    let GwSide {
        site,
        dc,
        local,
        remote,
        binds,
        remotes,
        socket,
    } = g;
    let mut s = format!(
        "site = \"{site}\"\n[dc]\nbackend = \"udp\"\nlisten = \"{LO}:{dc}\"\n\
         local_prefixes = [\"{local}\"]\nremote_prefixes = [\"{remote}\"]\n[wan]\nbind = [{}]\n\
         insecure = true\n",
        binds
            .iter()
            .map(|p| format!("\"{LO}:{p}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (i, r) in remotes.iter().enumerate() {
        let _ = write!(
            s,
            "[[wan.paths]]\nname = \"p{i}\"\nremote = \"{LO}:{r}\"\nbind = {i}\nweight = 1\n\
             rate = \"{rate}\"\nrtt = \"{}us\"\n",
            rtt_us.max(1.0).round() as u64
        );
    }
    let _ = write!(
        s,
        "[buffer]\nsize = \"256MiB\"\nper_flow_quota = \"{quota}\"\n[pseudo_ack]\npolicy = \"edge\"\n\
         [control]\nmetrics = \"\"\nsocket = \"{}\"\n[log]\nformat = \"human\"\nlevel = \"warn\"\n",
        socket.display()
    );
    s
}

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
    // Every build has the XDP program (proxy/build.rs), and the demo sets
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

/// A `soya-wanem udp` relay for `pairs` (listen, forward): the WAN of the
/// demo, or (`zero_km`) the same link at no distance and without loss.
fn wanem_cmd(
    bins: &Binaries,
    o: &DemoOptions,
    zero_km: bool,
    pairs: &[(u16, u16)],
    log: Stdio,
) -> Command {
    let mut c = Command::new(&bins.wanem);
    c.arg("udp");
    for (l, f) in pairs {
        c.args(["--listen", &addr(*l).to_string()])
            .args(["--forward", &addr(*f).to_string()]);
    }
    let km = if zero_km { 0.0 } else { o.distance_km };
    c.args(["--distance-km", &format!("{km}")]);
    if o.loss > 0.0 && !zero_km {
        c.args(["--loss", &format!("{}", o.loss)]);
    }
    if let Some(r) = o.rate_bps {
        c.args(["--rate", &format!("{r}bit")]);
        c.args(["--slack-us", &format!("{}", RELAY_SLACK_US)]);
        c.args(["--spin-us", "0"]);
    }
    c.stdout(Stdio::null()).stderr(log);
    c
}

fn settle(kids: &mut Children) -> Result<(), String> {
    std::thread::sleep(Duration::from_millis(600));
    kids.check()
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
            rate_bps: Some(demo_circuit::auto_rate(c.carried_gbps() * 1e9)),
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

/// Seconds of the calibration run of `--rate auto`.
const CALIBRATION_S: f64 = 3.0;

/// The circuit of the calibration runs: relays in place, as in the runs,
/// but far above what this machine carries.
const CALIBRATION_RATE_BPS: u64 = 100_000_000_000;

/// `--rate auto`: what this machine carries with no bottleneck, Gb/s
/// (bytes placed at the responder), through the two set-ups whose CPU
/// bounds them: direct at 0 km (requester, relay, responder and the
/// kernel's forwarding of every packet) and through Sōya at the demo's
/// distance (five processes, the relay's delay line as in the run). The
/// direct run at the distance carries less than either (its window).
/// Logs go to the subdirectory `calibration`.
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
    let cal_ctx = Ctx {
        bins: ctx.bins,
        dir,
        quiet: ctx.quiet,
    };
    let titles = [
        "direct, 0 km, no bottleneck".to_string(),
        format!("through Sōya, {} km, no bottleneck", cal.distance_km),
    ];
    let ([zero, soya], gw_alive) = if o.netns {
        calibrate_netns(&cal, &cal_ctx, &titles)?
    } else {
        let zero = direct_0km_loopback(&cal, &cal_ctx, Step::Calibration(1), &titles[0])?;
        let (soya, gw_alive) = soya_loopback(&cal, &cal_ctx, Step::Calibration(2), &titles[1])?;
        ([zero, soya], gw_alive)
    };
    gw_alive?;
    for (r, t) in [(&zero, &titles[0]), (&soya, &titles[1])] {
        if !r.ok || r.gbps <= 0.0 || r.data_errors > 0 {
            return Err(format!(
                "the calibration run {t} failed ({}); give the circuit with --rate",
                r.errors.join("; ")
            ));
        }
    }
    Ok(Calibration {
        direct_0km_gbps: zero.gbps,
        accelerated_gbps: soya.gbps,
    })
}

/// The calibration between network namespaces: the same sites as the
/// runs, with relays far faster than the machine.
fn calibrate_netns(
    cal: &DemoOptions,
    ctx: &Ctx,
    titles: &[String; 2],
) -> Result<([Outcome; 2], Result<(), String>), String> {
    use crate::demo_netns::{Sites, Via};
    let mut sites = Sites::build(cal, ctx.bins, &ctx.dir, "c")?;
    let route = Route::Netns {
        a: sites.host[0].clone(),
        b: sites.host[1].clone(),
    };
    sites.route(Via::Zero)?;
    let zero = ctx.scenario(Step::Calibration(1), &titles[0], &route, 0, cal);
    sites.start_gateways(ctx.bins, &ctx.dir)?;
    sites.route(Via::Soya)?;
    let soya = ctx.scenario(Step::Calibration(2), &titles[1], &route, 0, cal);
    Ok(([zero, soya], sites.check()))
}

/// Direct at 0 km, direct at the distance, through Sōya; and whether the
/// gateways stayed up throughout.
type Runs = ([Outcome; 3], Result<(), String>);

/// The three runs on loopback (udp backend, IP-in-UDP hosts).
fn run_loopback(o: &DemoOptions, ctx: &Ctx) -> Result<Runs, String> {
    let r0 = direct_0km_loopback(o, ctx, Step::Run(1), "direct, 0 km")?;
    let mut kids = Children::default();

    // 2. Direct through a relay.
    let s2 = free_udp()?;
    let relay = free_udp()?;
    ctx.spawn_wanem(&mut kids, o, "direct", false, &[(relay, s2)])?;
    settle(&mut kids)?;
    let rd = ctx.scenario(
        Step::Run(2),
        &format!("direct, {} km", o.distance_km),
        &Route::Direct {
            client_to: addr(relay),
        },
        s2,
        o,
    );
    kids.stop();

    let (ra_, gw_alive) = soya_loopback(
        o,
        ctx,
        Step::Run(3),
        &format!("through Sōya, {} km", o.distance_km),
    )?;
    Ok(([r0, rd, ra_], gw_alive))
}

/// Direct on loopback at 0 km: no relay; or with a rate, through a relay
/// of that rate at 0 km (the same link, no distance).
fn direct_0km_loopback(
    o: &DemoOptions,
    ctx: &Ctx,
    step: Step,
    title: &str,
) -> Result<Outcome, String> {
    let s1 = free_udp()?;
    let mut kids = Children::default();
    let to = match o.rate_bps {
        None => s1,
        Some(_) => {
            let relay = free_udp()?;
            ctx.spawn_wanem(&mut kids, o, "0 km", true, &[(relay, s1)])?;
            settle(&mut kids)?;
            relay
        }
    };
    let client_to = addr(to);
    Ok(ctx.scenario(step, title, &Route::Direct { client_to }, s1, o))
}

/// Through two gateways and one relay process per path on loopback (both
/// directions: A's path remote is relay a->b, B's is relay b->a): run
/// run 3/3 or calibration 2/2.
fn soya_loopback(
    o: &DemoOptions,
    ctx: &Ctx,
    step: Step,
    title: &str,
) -> Result<(Outcome, Result<(), String>), String> {
    let mut kids = Children::default();
    let n = o.paths as usize;
    let ports = |k| {
        (0..k)
            .map(|_| free_udp())
            .collect::<Result<Vec<u16>, String>>()
    };
    let (wa, wb, ra, rb) = (ports(n)?, ports(n)?, ports(n)?, ports(n)?);
    let (dca, dcb) = (free_udp()?, free_udp()?);
    let rtt_us = 2.0 * o.distance_km * US_PER_KM;
    let fa = ctx.dir.join("gateway-a.toml");
    let fb = ctx.dir.join("gateway-b.toml");
    let write = |f: &Path, s: String| {
        std::fs::write(f, s).map_err(|e| format!("cannot write {}: {e}", f.display()))
    };
    write(
        &fa,
        gateway_config(
            &GwSide {
                site: "demo-a",
                dc: dca,
                local: "10.1.0.0/16",
                remote: "10.2.0.0/16",
                binds: &wa,
                remotes: &ra,
                socket: ctx.dir.join("a.sock"),
            },
            rtt_us,
            o,
        ),
    )?;
    write(
        &fb,
        gateway_config(
            &GwSide {
                site: "demo-b",
                dc: dcb,
                local: "10.2.0.0/16",
                remote: "10.1.0.0/16",
                binds: &wb,
                remotes: &rb,
                socket: ctx.dir.join("b.sock"),
            },
            rtt_us,
            o,
        ),
    )?;
    for i in 0..n {
        let pairs = [(ra[i], wb[i]), (rb[i], wa[i])];
        ctx.spawn_wanem(&mut kids, o, &format!("path {i}"), false, &pairs)?;
    }
    for (name, f) in [("gateway-a", &fa), ("gateway-b", &fb)] {
        let mut c = Command::new(&ctx.bins.soya);
        c.arg("gateway")
            .arg("--config")
            .arg(f)
            .stdout(log_file(&ctx.dir, &format!("{name}.out")))
            .stderr(log_file(&ctx.dir, name));
        demo_gateway_env(&mut c);
        kids.spawn(name, &mut c)?;
    }
    settle(&mut kids)?;
    let route = Route::Gateways {
        a: addr(dca),
        b: addr(dcb),
    };
    let out = ctx.scenario(step, title, &route, 0, o);
    let gw_alive = kids.check();
    kids.stop();
    Ok((out, gw_alive))
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
