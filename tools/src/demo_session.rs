//! One session of the demo: the child processes it starts, the ports it
//! picks, and a scenario run with `soya-perf` (a throughput run, then a
//! latency probe) over a [`Route`]: what the loopback lab
//! (`crate::demo_loopback`), the namespaces (`crate::demo_netns`) and the
//! orchestration (`crate::demo`) share.

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::demo_common::{Binaries, DemoOptions, RELAY_SLACK_US};
use crate::demo_report::Outcome;

pub(crate) const HOST_A: &str = "10.1.0.1";
pub(crate) const HOST_B: &str = "10.2.0.1";
pub(crate) const LO: &str = "127.0.0.1";

/// Child processes, killed (and reaped) when dropped.
#[derive(Default)]
pub(crate) struct Children(Vec<(String, Child)>);

impl Children {
    pub(crate) fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<(), String> {
        let c = soya_io::sys::die_with_parent(cmd)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        self.0.push((name.to_string(), c));
        Ok(())
    }

    /// Fails if a child exited already.
    pub(crate) fn check(&mut self) -> Result<(), String> {
        for (n, c) in &mut self.0 {
            if let Ok(Some(st)) = c.try_wait() {
                return Err(format!("{n} exited early ({st})"));
            }
        }
        Ok(())
    }

    pub(crate) fn stop(&mut self) {
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
pub(crate) fn free_port(free: impl Fn(u16) -> bool) -> Option<u16> {
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

pub(crate) fn free_udp() -> Result<u16, String> {
    free_port_or_any("UDP", |p| UdpSocket::bind((LO, p))?.local_addr())
}

pub(crate) fn free_tcp() -> Result<u16, String> {
    free_port_or_any("TCP", |p| TcpListener::bind((LO, p))?.local_addr())
}

/// A [`free_port`] that `bind` (a bind to loopback port `p`, giving the
/// address bound) can take, else the port the kernel picks for `bind(0)`.
pub(crate) fn free_port_or_any(
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

pub(crate) fn addr(port: u16) -> SocketAddr {
    SocketAddr::new(LO.parse().expect("loopback"), port)
}

pub(crate) fn log_file(dir: &Path, name: &str) -> Stdio {
    std::fs::File::create(dir.join(format!("{name}.log")))
        .map_or_else(|_| Stdio::null(), Stdio::from)
}

/// Where a scenario's two hosts send their datagrams.
#[derive(Clone)]
pub(crate) enum Route {
    /// Client to server's socket (or a relay in front of it); server answers
    /// the sender.
    Direct { client_to: SocketAddr },
    /// Each host to its gateway's `dc.listen`.
    Gateways { a: SocketAddr, b: SocketAddr },
    /// Real RoCEv2 between hosts in these network namespaces (`--netns`),
    /// routed by the namespaces in between.
    Netns { a: String, b: String },
}

pub(crate) struct Ctx<'a> {
    pub bins: &'a Binaries,
    pub dir: PathBuf,
    pub quiet: bool,
}

impl Ctx<'_> {
    /// Starts a [`wanem_cmd`] relay as `soya-wanem (<what>)`, its error
    /// output in the log `wanem-<what without spaces>`.
    pub(crate) fn spawn_wanem(
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

    pub(crate) fn say(&self, s: &str) {
        if !self.quiet {
            let mut o = std::io::stderr().lock();
            let _ = writeln!(o, "{s}");
        }
    }

    /// One soya-perf session: server child + client child; the client's
    /// JSON report.
    pub(crate) fn perf(
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
        let out = soya_io::sys::die_with_parent(&mut cli)
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
    pub(crate) fn scenario(
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
    pub(crate) fn throughput(
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
    pub(crate) fn latency(
        &self,
        n: u8,
        title: &str,
        route: &Route,
        ports: (u16, u16),
        out: &mut Outcome,
    ) {
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

/// Which of the demo's scenarios: calibration run `k`, or run `n` of 3.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    Calibration(u8),
    Run(u8),
}

impl Step {
    /// The name of its logs.
    pub(crate) fn tag(self) -> String {
        match self {
            Step::Calibration(k) => format!("calibration{k}"),
            Step::Run(n) => format!("run{n}"),
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Calibration(k) => write!(f, "calibration {k}"),
            Step::Run(n) => write!(f, "{n}/3"),
        }
    }
}

/// The client's and the server's UDP port of a scenario on loopback (the
/// same for both of its sessions: a gateway keeps a lab host's learned
/// address until it has been silent for 2 s); `server_port` 0 picks one.
pub(crate) fn scenario_ports(server_port: u16) -> Result<(u16, u16), String> {
    let c = free_udp()?;
    let s = if server_port == 0 {
        free_udp()?
    } else {
        server_port
    };
    Ok((c, s))
}

/// A `soya-wanem udp` relay for `pairs` (listen, forward): the WAN of the
/// demo, or (`zero_km`) the same link at no distance and without loss.
pub(crate) fn wanem_cmd(
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

pub(crate) fn settle(kids: &mut Children) -> Result<(), String> {
    std::thread::sleep(Duration::from_millis(600));
    kids.check()
}

/// Direct at 0 km, direct at the distance, through Sōya; and whether the
/// gateways stayed up throughout.
pub(crate) type Runs = ([Outcome; 3], Result<(), String>);
