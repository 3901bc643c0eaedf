//! The soak's two sites in network namespaces (root only): hosts, real
//! gateways on the `tun` backend, three soya-wanem paths, and the knobs
//! the fault schedule turns (netem loss on a path, configurations to
//! reload, a gateway to kill and restart).
//!
//! ```text
//!  hA 10.1.0.1, .2 ── gA ══ soya-wanem tun a0/b0, a1/b1, a2/b2 ══ gB ── hB 10.2.0.1, .2
//! ```
//!
//! Namespaces are named `soak-<pid>-…` so that other netns tests can run
//! beside it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::demo_common::{demo_gateway_env, Binaries};
use crate::netns::{try_ip_in, Netns, Proc};

pub const PREFIX: [&str; 2] = ["10.1.0.0/16", "10.2.0.0/16"];
const WAN_PORT: u16 = 7400;
/// WAN paths built (a reload may use any subset).
pub const LINKS: u32 = 3;

fn wan_ip(site: usize, k: u32) -> String {
    format!("169.254.{}.{}", 10 + k, 1 + site)
}

/// One path of a configuration: which link, and its rate in Mb/s.
#[derive(Clone, Copy, Debug)]
pub struct PathSpec {
    pub link: u32,
    pub rate_mbps: u64,
}

pub struct Lab {
    pub host: [String; 2],
    pub gw: [String; 2],
    pub procs: Netns,
    gateways: [Option<Proc>; 2],
    dir: PathBuf,
    one_way_ms: f64,
    link_rate_mbps: u64,
    key: PathBuf,
    /// Gateway restarts so far (log file names).
    restarts: u32,
    /// When the first soya-wanem started: its outage schedule's origin.
    pub wanem_t0: Instant,
}

/// Burst loss on every link, both directions (soya-wanem's
/// Gilbert-Elliott model): a burst starts every ~5,000 packets and lasts
/// ~50 packets, losing 30 % of them.
pub const GE: [f64; 3] = [0.0002, 0.02, 0.3];
/// The cut schedule: every `CUT_EVERY_S` seconds (from `CUT_FIRST_S`) one
/// link, in turn, goes down for `CUT_FOR_S` seconds. Never two at once, and
/// every reload set keeps two links: a path always survives.
pub const CUT_FIRST_S: f64 = 20.0;
pub const CUT_EVERY_S: f64 = 10.0;
pub const CUT_FOR_S: f64 = 3.0;

/// Link `k`'s outages over `horizon_s` seconds (soya-wanem time).
pub fn cuts(k: u32, horizon_s: f64) -> Vec<[f64; 2]> {
    let mut v = Vec::new();
    let mut n = 0u32;
    loop {
        let at = CUT_FIRST_S + f64::from(n) * CUT_EVERY_S;
        if at > horizon_s {
            return v;
        }
        if n % LINKS == k {
            v.push([at, at + CUT_FOR_S]);
        }
        n += 1;
    }
}

impl Lab {
    pub fn build(
        bins: &Binaries,
        dir: &Path,
        one_way_ms: f64,
        link_rate_mbps: u64,
        paths: &[PathSpec],
        horizon_s: f64,
    ) -> Result<Lab, String> {
        let mut procs = Netns::new();
        let (host, gw, wan) = procs.add_two_sites(&format!("soak-{}", std::process::id()))?;
        let mut lab = Lab {
            host,
            gw,
            procs,
            gateways: [None, None],
            dir: dir.to_path_buf(),
            one_way_ms,
            link_rate_mbps,
            key: dir.join("psk.key"),
            restarts: 0,
            wanem_t0: Instant::now(),
        };
        for i in 0..2 {
            lab.wire_site(i)?;
        }
        lab.wanem_t0 = Instant::now();
        for k in 0..LINKS {
            lab.start_wanem(bins, &wan, k, horizon_s)?;
        }
        lab.write_key()?;
        lab.write_configs(paths)?;
        for i in 0..2 {
            lab.start_gateway(bins, i)?;
        }
        Ok(lab)
    }

    /// hostX (two addresses) ──veth── gwX; gwX forwards.
    fn wire_site(&mut self, i: usize) -> Result<(), String> {
        let net = 1 + i;
        let hosts = [format!("10.{net}.0.1"), format!("10.{net}.0.2")];
        let gw_ip = format!("10.{net}.0.254");
        let hosts = [hosts[0].as_str(), hosts[1].as_str()];
        crate::netns::wire_site(&self.host[i], &self.gw[i], &hosts, &gw_ip)
    }

    fn start_wanem(
        &mut self,
        bins: &Binaries,
        wan: &str,
        k: u32,
        horizon_s: f64,
    ) -> Result<(), String> {
        let (a, b) = (format!("a{k}"), format!("b{k}"));
        let logf = self.dir.join(format!("wanem{k}.log"));
        let log = std::fs::File::create(&logf).map_err(|e| format!("{}: {e}", logf.display()))?;
        let conf = self.dir.join(format!("wanem{k}.toml"));
        let down: Vec<String> = cuts(k, horizon_s)
            .iter()
            .map(|[a, b]| format!("[{a}, {b}]"))
            .collect();
        std::fs::write(
            &conf,
            format!(
                "[profile]\nge = [{}, {}, {}]\ndown = [{}]\n",
                GE[0],
                GE[1],
                GE[2],
                down.join(", ")
            ),
        )
        .map_err(|e| format!("{}: {e}", conf.display()))?;
        let args = format!(
            "tun --a-dev {a} --b-dev {b} --config {} --delay-ms {} --seed {} --stats-interval 0 \
             --rate {}mbit --slack-us 100 --spin-us 0",
            conf.display(),
            self.one_way_ms,
            k + 1,
            self.link_rate_mbps
        );
        let args: Vec<&str> = args.split_whitespace().collect();
        let p = self.procs.spawn(wan, &bins.wanem, &args, |c| {
            c.stdout(std::process::Stdio::null()).stderr(log);
        })?;
        let t0 = Instant::now();
        while !(crate::netns::ip(&["-n", wan, "link", "show", &a])
            && crate::netns::ip(&["-n", wan, "link", "show", &b]))
        {
            if !self.procs.running(p) || t0.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "soya-wanem ({a}/{b}) did not create its devices; see {}",
                    logf.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for (i, dev) in [&a, &b].into_iter().enumerate() {
            let g = self.gw[i].clone();
            try_ip_in(wan, &format!("link set {dev} netns {g}"))?;
            try_ip_in(&g, &format!("addr add {}/30 dev {dev}", wan_ip(i, k)))?;
            try_ip_in(&g, &format!("link set {dev} up mtu 9000"))?;
        }
        Ok(())
    }

    fn write_key(&self) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let k = soya_proto::rand::key().map_err(|e| format!("random key: {e}"))?;
        let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&self.key, hex + "\n")
            .and_then(|()| {
                std::fs::set_permissions(&self.key, std::fs::Permissions::from_mode(0o600))
            })
            .map_err(|e| format!("{}: {e}", self.key.display()))
    }

    pub fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(["a.sock", "b.sock"][i])
    }

    pub fn config(&self, i: usize) -> PathBuf {
        self.dir.join(["gateway-a.toml", "gateway-b.toml"][i])
    }

    /// Writes both gateways' configuration files for `paths` (every link's
    /// address is bound whatever the paths: a reload cannot bind new ones).
    pub fn write_configs(&self, paths: &[PathSpec]) -> Result<(), String> {
        let rtt_us = (2.0 * self.one_way_ms * 1000.0).round().max(1.0);
        for i in 0..2 {
            let binds: Vec<String> = (0..LINKS)
                .map(|k| format!("\"{}:{WAN_PORT}\"", wan_ip(i, k)))
                .collect();
            let mut text = format!(
                "site = \"soak-{}\"\n[dc]\nbackend = \"tun\"\ninterface = \"soya0\"\n\
                 local_prefixes = [\"{}\"]\nremote_prefixes = [\"{}\"]\n\
                 [buffer]\nsize = \"64MiB\"\nper_flow_quota = \"8MiB\"\n\
                 [pseudo_ack]\npolicy = \"edge\"\n\
                 [control]\nmetrics = \"\"\nsocket = \"{}\"\n[log]\nlevel = \"info\"\n\
                 [wan]\nbind = [{}]\nkey_file = \"{}\"\ntwin_timeout = \"5s\"\n",
                ["a", "b"][i],
                PREFIX[i],
                PREFIX[1 - i],
                self.socket(i).display(),
                binds.join(", "),
                self.key.display()
            );
            for p in paths {
                let k = p.link;
                text += &format!(
                    "[[wan.paths]]\nname = \"link{k}\"\nremote = \"{}:{WAN_PORT}\"\nbind = {k}\n\
                     rate = \"{}mbit\"\nrtt = \"{rtt_us}us\"\n",
                    wan_ip(1 - i, k),
                    p.rate_mbps,
                );
            }
            let f = self.config(i);
            std::fs::write(&f, text).map_err(|e| format!("{}: {e}", f.display()))?;
        }
        Ok(())
    }

    pub fn start_gateway(&mut self, bins: &Binaries, i: usize) -> Result<(), String> {
        let name = format!("gateway-{}-{}.log", ["a", "b"][i], self.restarts);
        let log = std::fs::File::create(self.dir.join(&name))
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let cfg = self.config(i).display().to_string();
        let gw = self.gw[i].clone();
        let p = self
            .procs
            .spawn(&gw, &bins.soya, &["gateway", "-c", &cfg], |c| {
                demo_gateway_env(c);
                c.stdout(std::process::Stdio::null()).stderr(log);
            })?;
        self.gateways[i] = Some(p);
        // soya0 exists once the gateway runs: route the other site into it.
        let t0 = Instant::now();
        loop {
            if try_ip_in(&gw, &format!("route replace {} dev soya0", PREFIX[1 - i])).is_ok() {
                return Ok(());
            }
            if !self.procs.running(p) || t0.elapsed() > Duration::from_secs(10) {
                return Err(format!("gateway {i} did not create soya0; see {name}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9` of gateway `i` (a crash), then a start.
    pub fn restart_gateway(&mut self, bins: &Binaries, i: usize) -> Result<(), String> {
        if let Some(p) = self.gateways[i].take() {
            self.procs.kill(p);
        }
        self.restarts += 1;
        self.start_gateway(bins, i)
    }

    pub fn gateway_pid(&self, i: usize) -> Option<u32> {
        self.procs.pid(self.gateways[i]?)
    }

    /// SIGHUP to both gateways, A first.
    pub fn reload(&self) {
        for i in 0..2 {
            if let Some(p) = self.gateways[i] {
                self.procs.signal(p, libc::SIGHUP);
            }
        }
    }

    /// An error if a gateway has exited.
    pub fn check(&mut self) -> Result<(), String> {
        for i in 0..2 {
            if let Some(p) = self.gateways[i] {
                if !self.procs.running(p) {
                    return Err(format!(
                        "gateway {} exited; logs in {}",
                        ["a", "b"][i],
                        self.dir.display()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Waits until both gateways have a session and a path up.
    pub fn wait_connected(&mut self, within: Duration) -> Result<Duration, String> {
        let t0 = Instant::now();
        loop {
            self.check()?;
            let up = (0..2).all(|i| {
                soya::client::query(&self.socket(i))
                    .is_ok_and(|s| s.connected && s.paths.iter().any(|p| p.state == "up"))
            });
            if up {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > within {
                return Err(format!(
                    "the gateways did not connect within {within:?}; logs in {}",
                    self.dir.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One request on a gateway's control socket, its JSON answer.
pub fn control(path: &Path, request: &str) -> Result<serde_json::Value, String> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("{request}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("bad answer {text:?}: {e}"))
}

/// Resident memory (KiB) and open file descriptors of process `pid`.
pub fn rss_and_fds(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}
