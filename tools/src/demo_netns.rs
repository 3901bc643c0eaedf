//! `soya demo --netns`: the same three runs as the loopback demo, but
//! between network namespaces with real RoCEv2 (UDP port 4791), as a
//! deployment carries traffic (root only). The gateways run the `tun`
//! backend (the site routes the other site into their soya0) or `xdp`
//! (their XDP program on the veth toward the host steers the other site's
//! traffic into AF_XDP sockets before the kernel routes it).
//!
//! ```text
//!  hA 10.1.0.1 ── gA (kernel router) ══ soya-wanem tun, one per path ══ gB ── hB 10.2.0.1
//!                   └──── veth "zero": 0 km, kernel forwarding ────┘
//! 1. direct, 0 km:  gA and gB route the other site over the zero veth
//! 2. direct, D km:  ... over WAN path 0 (soya-wanem, D km)
//! 3. through Sōya:  tun: ... into soya0, the gateways' tun device;
//!                   xdp: taken at gX's veth "host" by the gateway's XDP
//!                   program (the kernel's route is a blackhole then, so a
//!                   packet the program missed is lost, never carried
//!                   direct); the gateways carry it over every WAN path
//!                   (authenticated, keyed)
//! ```
//!
//! The gateways start only for the third run: an xdp gateway takes the
//! other site's traffic from the moment its program is attached.
//!
//! With `--rate`, every path's soya-wanem has that bottleneck, and the
//! 0 km link is a soya-wanem tun pair of the same rate with no delay
//! (devices za / zb) instead of the plain veth.
//!
//! The soya-perf control connection (TCP 18515) takes the same route as
//! the RoCE packets: through Sōya it crosses as WAN datagrams.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::demo_common::{
    demo_gateway_env, flow_quota, path_rate, Binaries, DemoBackend, DemoOptions, RELAY_SLACK_US,
    US_PER_KM,
};
use crate::netns::{netns_missing, try_ip_in, Netns, Proc};

pub const HOST: [&str; 2] = ["10.1.0.1", "10.2.0.1"];
const PREFIX: [&str; 2] = ["10.1.0.0/16", "10.2.0.0/16"];
const WAN_PORT: u16 = 7400;

/// The two sites, the WAN namespace and everything running in them;
/// dropping it kills the processes and deletes the namespaces.
pub struct Sites {
    pub host: [String; 2],
    gw: [String; 2],
    procs: Netns,
    gateways: Vec<(String, Proc)>,
    paths: u32,
    /// The 0 km link's device in gA and gB: a plain veth ("zero"), or with
    /// a rate a soya-wanem tun pair of that rate and no delay.
    zero_dev: [String; 2],
    /// The gateways' `rate` of each path.
    path_rate: String,
    /// Their per-flow buffer quota.
    flow_quota: String,
    backend: DemoBackend,
}

/// One soya-wanem tun link between the gateway namespaces.
struct Link {
    /// Its devices, in gA and gB.
    devs: [String; 2],
    /// Their addresses (/30).
    ips: [String; 2],
    one_way_ms: f64,
    loss: f64,
    rate_bps: Option<u64>,
    seed: u32,
    log: String,
}

fn wan_ip(site: usize, k: u32) -> String {
    format!("169.254.{}.{}", 10 + k, 1 + site)
}

fn zero_ip(site: usize) -> String {
    format!("169.254.9.{}", 1 + site)
}

impl Sites {
    /// Builds the namespaces (named `soya-demo-<pid><tag>-...`), the WAN
    /// emulators and the zero-km link, and writes the gateways' configs.
    pub fn build(o: &DemoOptions, bins: &Binaries, dir: &Path, tag: &str) -> Result<Sites, String> {
        if let Some(missing) = netns_missing(&[]) {
            return Err(format!(
                "--netns --backend {} needs {missing}",
                o.backend.name()
            ));
        }
        let mut procs = Netns::new();
        let (host, gw, wan) =
            procs.add_two_sites(&format!("soya-demo-{}{tag}", std::process::id()))?;
        let mut s = Sites {
            host,
            gw,
            procs,
            gateways: Vec::new(),
            paths: o.paths,
            zero_dev: ["zero".into(), "zero".into()],
            path_rate: path_rate(o),
            flow_quota: flow_quota(o),
            backend: o.backend,
        };
        for i in 0..2 {
            s.wire_site(i)?;
        }
        if o.rate_bps.is_some() {
            // 0 km: the same link as the WAN's, without delay or loss.
            s.zero_dev = ["za".into(), "zb".into()];
            let zero = Link {
                devs: s.zero_dev.clone(),
                ips: [zero_ip(0), zero_ip(1)],
                one_way_ms: 0.0,
                loss: 0.0,
                rate_bps: o.rate_bps,
                seed: 99,
                log: "wanem-0km.log".into(),
            };
            s.start_wanem(bins, &wan, dir, &zero)?;
        } else {
            // 0 km: a plain veth between the gateway namespaces.
            let (ga, gb) = (&s.gw[0], &s.gw[1]);
            crate::netns::try_ip(&[
                "link", "add", "zero", "netns", ga, "type", "veth", "peer", "name", "zero",
                "netns", gb,
            ])?;
            for (i, g) in [ga, gb].into_iter().enumerate() {
                try_ip_in(g, &format!("addr add {}/30 dev zero", zero_ip(i)))?;
                try_ip_in(g, "link set zero up mtu 9000")?;
            }
        }
        let one_way_ms = o.distance_km * US_PER_KM / 1000.0;
        for k in 0..o.paths {
            let path = Link {
                devs: [format!("a{k}"), format!("b{k}")],
                ips: [wan_ip(0, k), wan_ip(1, k)],
                one_way_ms,
                loss: o.loss,
                rate_bps: o.rate_bps,
                seed: k + 1,
                log: format!("wanem{k}.log"),
            };
            s.start_wanem(bins, &wan, dir, &path)?;
        }
        s.write_key_and_configs(dir, 2.0 * one_way_ms)?;
        Ok(s)
    }

    /// Starts both gateways and waits until they have a session and every
    /// path is up.
    pub fn start_gateways(&mut self, bins: &Binaries, dir: &Path) -> Result<(), String> {
        for i in 0..2 {
            self.start_gateway(bins, dir, i)?;
        }
        self.wait_connected(dir)
    }

    /// hostX ──veth── gwX; gwX forwards.
    fn wire_site(&mut self, i: usize) -> Result<(), String> {
        let gw_ip = if i == 0 { "10.1.0.254" } else { "10.2.0.254" };
        crate::netns::wire_site(&self.host[i], &self.gw[i], &[HOST[i]], gw_ip)?;
        if self.backend == DemoBackend::Xdp {
            // A veth hands frames over with the UDP/TCP checksum left to
            // "hardware" (CHECKSUM_PARTIAL); AF_XDP takes the bytes as they
            // are, so the host computes its checksums itself, as a real
            // NIC's frames are complete on the wire.
            let host = self.host[i].clone();
            crate::netns::try_in_netns(&host, || soya_io::sys::set_tx_checksum("dc", false))?
                .map_err(|e| {
                    format!(
                        "turning off the transmit checksum offload of dc in {}: {e}",
                        self.host[i]
                    )
                })?;
        }
        Ok(())
    }

    fn start_wanem(
        &mut self,
        bins: &Binaries,
        wan: &str,
        dir: &Path,
        l: &Link,
    ) -> Result<(), String> {
        let [a, b] = &l.devs;
        let log = std::fs::File::create(dir.join(&l.log))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut args = format!(
            "tun --a-dev {a} --b-dev {b} --delay-ms {} --loss {} --seed {} --stats-interval 0",
            l.one_way_ms, l.loss, l.seed
        );
        if let Some(r) = l.rate_bps {
            args += &format!(" --rate {r}bit --slack-us {} --spin-us 0", RELAY_SLACK_US);
        }
        let args: Vec<&str> = args.split_whitespace().collect();
        let p = self.procs.spawn(wan, &bins.wanem, &args, |c| {
            c.stdout(std::process::Stdio::null()).stderr(log);
        })?;
        let t0 = Instant::now();
        while !(crate::netns::ip(&["-n", wan, "link", "show", a])
            && crate::netns::ip(&["-n", wan, "link", "show", b]))
        {
            if !self.procs.running(p) || t0.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "soya-wanem ({a}/{b}) did not create its devices; see {}",
                    dir.join(&l.log).display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for (i, dev) in [a, b].into_iter().enumerate() {
            let g = &self.gw[i];
            try_ip_in(wan, &format!("link set {dev} netns {g}"))?;
            try_ip_in(g, &format!("addr add {}/30 dev {dev}", l.ips[i]))?;
            try_ip_in(g, &format!("link set {dev} up mtu 9000"))?;
        }
        Ok(())
    }

    fn write_key_and_configs(&self, dir: &Path, rtt_ms: f64) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let k = soya_proto::rand::key().map_err(|e| format!("random key: {e}"))?;
        let key = dir.join("psk.key");
        let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&key, hex + "\n")
            .and_then(|()| std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)))
            .map_err(|e| format!("{}: {e}", key.display()))?;
        for i in 0..2 {
            let binds: Vec<String> = (0..self.paths)
                .map(|k| format!("\"{}:{WAN_PORT}\"", wan_ip(i, k)))
                .collect();
            let mut text = format!(
                "site = \"demo-{}\"\n[dc]\n{}\n\
                 local_prefixes = [\"{}\"]\nremote_prefixes = [\"{}\"]\n\
                 [buffer]\nsize = \"256MiB\"\nper_flow_quota = \"{}\"\n\
                 [pseudo_ack]\npolicy = \"edge\"\n\
                 [control]\nmetrics = \"\"\nsocket = \"{}\"\n[log]\nlevel = \"warn\"\n\
                 [wan]\nbind = [{}]\nkey_file = \"{}\"\n",
                if i == 0 { "a" } else { "b" },
                match self.backend {
                    DemoBackend::Tun => "backend = \"tun\"\ninterface = \"soya0\"",
                    DemoBackend::Xdp => "backend = \"xdp\"\ninterface = \"host\"",
                },
                PREFIX[i],
                PREFIX[1 - i],
                self.flow_quota,
                socket(dir, i).display(),
                binds.join(", "),
                key.display()
            );
            for k in 0..self.paths {
                text += &format!(
                    "[[wan.paths]]\nname = \"p{k}\"\nremote = \"{}:{WAN_PORT}\"\nbind = {k}\n\
                     rate = \"{}\"\nrtt = \"{}us\"\n",
                    wan_ip(1 - i, k),
                    self.path_rate,
                    (rtt_ms * 1000.0).round().max(1.0)
                );
            }
            let f = config(dir, i);
            std::fs::write(&f, text).map_err(|e| format!("{}: {e}", f.display()))?;
        }
        Ok(())
    }

    fn start_gateway(&mut self, bins: &Binaries, dir: &Path, i: usize) -> Result<(), String> {
        let name = if i == 0 { "gateway-a" } else { "gateway-b" };
        let log =
            std::fs::File::create(dir.join(name)).map_err(|e| format!("{}: {e}", dir.display()))?;
        let cfg = config(dir, i).display().to_string();
        let p = self.procs.spawn(
            &self.gw[i].clone(),
            &bins.soya,
            &["gateway", "-c", &cfg],
            |c| {
                demo_gateway_env(c);
                c.stdout(std::process::Stdio::null()).stderr(log);
            },
        )?;
        self.gateways.push((name.to_string(), p));
        Ok(())
    }

    /// Waits until both gateways have a session and every path is up.
    fn wait_connected(&mut self, dir: &Path) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            self.check()?;
            let up = (0..2).all(|i| {
                soya::client::query(&socket(dir, i))
                    .is_ok_and(|s| s.connected && s.paths.iter().all(|p| p.state == "up"))
            });
            if up {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(15) {
                return Err(format!(
                    "the gateways did not connect within 15 s; logs in {}",
                    dir.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An error if a gateway has exited.
    pub fn check(&mut self) -> Result<(), String> {
        for (name, p) in self.gateways.clone() {
            if !self.procs.running(p) {
                return Err(format!("{name} exited"));
            }
        }
        Ok(())
    }

    /// Routes each site's traffic for the other: over the zero veth, WAN
    /// path 0 (kernel forwarding), or into the gateway's soya0 (tun; with
    /// xdp the gateway takes it before the route, which is a blackhole).
    pub fn route(&self, via: Via) -> Result<(), String> {
        for i in 0..2 {
            let prefix = PREFIX[1 - i];
            let route = match (via, self.backend) {
                (Via::Zero, _) => format!(
                    "route replace {prefix} via {} dev {}",
                    zero_ip(1 - i),
                    self.zero_dev[i]
                ),
                (Via::Wan, _) => format!(
                    "route replace {prefix} via {} dev {}0",
                    wan_ip(1 - i, 0),
                    ["a", "b"][i]
                ),
                (Via::Soya, DemoBackend::Tun) => format!("route replace {prefix} dev soya0"),
                (Via::Soya, DemoBackend::Xdp) => format!("route replace blackhole {prefix}"),
            };
            try_ip_in(&self.gw[i], &route)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Via {
    Zero,
    Wan,
    Soya,
}

fn socket(dir: &Path, i: usize) -> PathBuf {
    dir.join(if i == 0 { "a.sock" } else { "b.sock" })
}

fn config(dir: &Path, i: usize) -> PathBuf {
    dir.join(if i == 0 {
        "gateway-a.toml"
    } else {
        "gateway-b.toml"
    })
}
