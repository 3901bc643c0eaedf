//! The netns tests' lab: five namespaces (two hosts, two gateways, the
//! WAN), the WAN emulators, two `soya gateway` processes and a soya-perf
//! server, built and torn down per test; and the checks every run shares.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use soya::gateway::snapshot::ShardSnap;
use soya::gateway::{control, Snapshot};
use soya_tools::perf::PerfReport;

use crate::common::{
    in_netns, ip, ip_in, must_ip, net_sysctl, netns_missing, netns_required, skip, soya_binary,
    Netns, PerfClient, Proc,
};

const PERF: &str = env!("CARGO_BIN_EXE_soya-perf");
const WANEM: &str = env!("CARGO_BIN_EXE_soya-wanem");

pub const HOST: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 2, 0, 1)];
const PREFIX: [&str; 2] = ["10.1.0.0/16", "10.2.0.0/16"];
pub const WAN_PORT: u16 = 7400;

/// One lab at a time: each loads the machine's two cores. Every [`Lab`]
/// holds this turn until it is dropped.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    A,
    B,
}

impl Site {
    pub fn i(self) -> usize {
        self as usize
    }

    pub fn other(self) -> Site {
        match self {
            Site::A => Site::B,
            Site::B => Site::A,
        }
    }
}

/// The emulated WAN.
#[derive(Clone, Copy, Debug)]
pub struct Wan {
    pub paths: usize,
    /// One-way delay of path 0; path k adds k × 1.5 ms.
    pub delay_ms: f64,
    /// Random loss per packet and direction, on every path.
    pub loss: f64,
    /// Each gateway's rate per path (`wan.paths.rate`).
    pub rate: &'static str,
    /// Device threads per gateway (`gateway.shards`).
    pub shards: usize,
    /// DC backend of both gateways: `xdp` on their veth ("host") instead
    /// of `tun`.
    pub xdp: bool,
    /// `wan.twin_timeout` of both gateways (default when `None`).
    pub twin_timeout: Option<&'static str>,
    /// Identity keys (`soya genkey` per gateway, the PSK mixed in) instead
    /// of the PSK alone.
    pub identity: bool,
    /// `wan.rekey_interval` of both gateways (default when `None`).
    pub rekey_interval: Option<&'static str>,
}

/// Two paths, 0.5 % loss per direction.
pub const LOSSY: Wan = Wan {
    paths: 2,
    delay_ms: 3.0,
    loss: 0.005,
    rate: "1gbit",
    shards: 1,
    xdp: false,
    twin_timeout: None,
    identity: false,
    rekey_interval: None,
};
/// Two paths, no loss.
pub const CLEAN: Wan = Wan { loss: 0.0, ..LOSSY };
/// Two slow paths (100 Mbit/s each): the near gateway's buffer fills.
pub const SLOW: Wan = Wan {
    rate: "100mbit",
    ..CLEAN
};

impl Wan {
    pub fn delay(&self, k: usize) -> f64 {
        self.delay_ms + 1.5 * k as f64
    }
}

pub fn wan_ip(site: Site, k: usize) -> Ipv4Addr {
    Ipv4Addr::new(169, 254, 10 + k as u8, 1 + site as u8)
}

/// One topology: five namespaces, the WAN emulators, two gateways and a
/// soya-perf server at hostB.
pub struct Lab {
    pub test: &'static str,
    pub dir: PathBuf,
    pub soya: PathBuf,
    pub host: [String; 2],
    pub gw: [String; 2],
    pub wan_ns: String,
    pub wan: Wan,
    pub cfg: [PathBuf; 2],
    pub sock: [PathBuf; 2],
    pub gateway: [Option<Proc>; 2],
    pub generation: [u64; 2],
    pub wanem: Vec<Proc>,
    pub clients: u32,
    /// Killing the processes and deleting the namespaces.
    pub procs: Netns,
    /// Last: the next lab's turn comes once this one is gone.
    _turn: MutexGuard<'static, ()>,
}

impl Lab {
    /// Builds the lab, or prints why it cannot and returns `None`.
    pub fn new(test: &'static str, wan: Wan) -> Option<Lab> {
        Lab::needing(test, wan, &[])
    }

    /// [`Lab::new`] for a test that also runs `commands` (in the hosts'
    /// namespaces).
    pub fn needing(test: &'static str, wan: Wan, commands: &[&str]) -> Option<Lab> {
        if let Some(why) = netns_missing(commands) {
            skip(test, &why, netns_required());
            return None;
        }
        let Some(soya) = soya_binary() else {
            skip(
                test,
                "the soya binary next to soya-perf (cargo build --workspace)",
                netns_required(),
            );
            return None;
        };
        let turn = serial();
        static N: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(format!("soya-netns-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut procs = Netns::new();
        let (host, gw, wan_ns) = procs.add_two_sites(&format!("soya-{id}")).unwrap();
        let mut lab = Lab {
            test,
            sock: [dir.join("a.sock"), dir.join("b.sock")],
            cfg: [dir.join("a.toml"), dir.join("b.toml")],
            dir,
            soya,
            host,
            gw,
            wan_ns,
            wan,
            gateway: [None, None],
            generation: [0, 0],
            wanem: Vec::new(),
            clients: 0,
            procs,
            _turn: turn,
        };
        lab.wire_sites();
        for k in 0..wan.paths {
            lab.start_wanem(k);
        }
        if wan.identity {
            lab.make_keys();
        }
        lab.write_configs();
        lab.start_gateway(Site::A);
        lab.start_gateway(Site::B);
        for s in [Site::A, Site::B] {
            lab.wait_for(s, "connected, every path up", |s| {
                s.connected && s.paths.iter().all(|p| p.state == "up")
            });
        }
        lab.start_server();
        Some(lab)
    }

    /// hostX ──veth── gwX; gwX forwards.
    fn wire_sites(&mut self) {
        for s in [Site::A, Site::B] {
            let (h, g) = (&self.host[s.i()], &self.gw[s.i()]);
            for n in [h, g] {
                // Quiet namespaces: no IPv6 chatter into soya0 (it would be
                // counted as ACL drops), no reverse-path filter for the
                // forged sources.
                for k in ["all", "default"] {
                    net_sysctl(n, &format!("ipv6/conf/{k}/disable_ipv6"), "1");
                }
                for k in ["all", "default"] {
                    assert!(net_sysctl(n, &format!("ipv4/conf/{k}/rp_filter"), "0"));
                }
            }
            assert!(net_sysctl(g, "ipv4/ip_forward", "1"), "ip_forward in {g}");
            // One queue each way: the xdp backend's sockets read queue 0.
            must_ip(&[
                "link",
                "add",
                "dc",
                "netns",
                h,
                "numtxqueues",
                "1",
                "numrxqueues",
                "1",
                "type",
                "veth",
                "peer",
                "name",
                "host",
                "netns",
                g,
                "numtxqueues",
                "1",
                "numrxqueues",
                "1",
            ]);
            let gw_ip = Ipv4Addr::from(u32::from(HOST[s.i()]) + 253);
            ip_in(h, &format!("addr add {}/24 dev dc", HOST[s.i()]));
            ip_in(g, &format!("addr add {gw_ip}/24 dev host"));
            ip_in(h, "link set dc up mtu 9000");
            ip_in(g, "link set host up mtu 9000");
            ip_in(h, &format!("route add default via {gw_ip}"));
            if self.wan.xdp {
                // A veth hands frames over with the TCP/UDP checksum left
                // to "hardware" (CHECKSUM_PARTIAL); AF_XDP takes the bytes
                // as they are, so the host computes checksums itself (a
                // real NIC's frames are complete on the wire).
                let ok = Command::new("ip")
                    .args(["netns", "exec", h, "ethtool", "-K", "dc", "tx", "off"])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "ethtool -K dc tx off in {h}");
            }
            assert!(net_sysctl(g, "ipv4/conf/host/rp_filter", "0"));
        }
    }

    /// `soya-wanem tun` for path k in the wan namespace; its devices go to
    /// the gateways' namespaces.
    fn start_wanem(&mut self, k: usize) {
        let (a, b) = (format!("a{k}"), format!("b{k}"));
        let out = std::fs::File::create(self.dir.join(format!("wanem{k}.json"))).unwrap();
        let err = std::fs::File::create(self.dir.join(format!("wanem{k}.log"))).unwrap();
        let args = format!(
            "tun --a-dev {a} --b-dev {b} --delay-ms {} --loss {} --seed {} \
             --no-realtime --spin-us 0 --stats-interval 0 --json",
            self.wan.delay(k),
            self.wan.loss,
            k + 1
        );
        let args: Vec<&str> = args.split_whitespace().collect();
        let p = self
            .procs
            .spawn(&self.wan_ns, Path::new(WANEM), &args, |c| {
                c.stdout(out).stderr(err);
            })
            .unwrap();
        self.wanem.push(p);
        let t0 = Instant::now();
        while !(ip(&["-n", &self.wan_ns, "link", "show", &a])
            && ip(&["-n", &self.wan_ns, "link", "show", &b]))
        {
            assert!(
                self.procs.running(p) && t0.elapsed() < Duration::from_secs(10),
                "soya-wanem did not make its devices: {}",
                self.tail(&format!("wanem{k}.log"))
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        for (dev, s) in [(&a, Site::A), (&b, Site::B)] {
            let g = &self.gw[s.i()];
            ip_in(&self.wan_ns, &format!("link set {dev} netns {g}"));
            ip_in(g, &format!("addr add {}/30 dev {dev}", wan_ip(s, k)));
            ip_in(g, &format!("link set {dev} up mtu 9000"));
        }
    }

    /// Gateway `s`'s identity key file (`Wan::identity`).
    pub fn key_file(&self, s: Site) -> PathBuf {
        self.dir.join(format!("{}.key", ["a", "b"][s.i()]))
    }

    /// `soya pubkey` of gateway `s`'s key file.
    pub fn public_key(&self, s: Site) -> String {
        let out = Command::new(&self.soya)
            .arg("pubkey")
            .arg(self.key_file(s))
            .output()
            .unwrap();
        assert!(out.status.success(), "soya pubkey: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// A new key pair for gateway `s` written over its key file (same
    /// path: `soya genkey` to a new file, its content copied over).
    pub fn new_key_in_place(&self, s: Site) {
        let fresh = self.dir.join(format!("fresh-{}.key", ["a", "b"][s.i()]));
        let _ = std::fs::remove_file(&fresh);
        let ok = Command::new(&self.soya)
            .arg("genkey")
            .stdout(Stdio::null())
            .arg(&fresh)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "soya genkey {}", fresh.display());
        std::fs::write(self.key_file(s), std::fs::read(&fresh).unwrap()).unwrap();
        std::fs::remove_file(&fresh).unwrap();
    }

    /// The PSK file's name ([`Lab::write_configs`]).
    pub fn psk_file(&self) -> PathBuf {
        self.dir.join("psk.key")
    }

    /// Sends SIGHUP to gateway `s` (`kill -HUP <pid>`, as an operator does).
    pub fn sighup(&mut self, s: Site) {
        let p = self.gateway[s.i()].expect("gateway running");
        let pid = self.procs.pid(p).expect("gateway running");
        // The shell's own `kill`: no procps needed.
        let ok = Command::new("sh")
            .args(["-c", &format!("kill -HUP {pid}")])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -HUP {pid}");
    }

    /// The lines gateway `s` logged about a SIGHUP, in order.
    pub fn sighup_lines(&self, s: Site) -> Vec<String> {
        let f = format!("gw{}.log", ["a", "b"][s.i()]);
        std::fs::read_to_string(self.dir.join(f))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("SIGHUP: "))
            .map(str::to_string)
            .collect()
    }

    /// Waits (20 s at most) until gateway `s` logged its `n`th SIGHUP
    /// line; returns it.
    pub fn wait_for_sighup_line(&self, s: Site, n: usize) -> String {
        let t0 = Instant::now();
        loop {
            if let Some(l) = self.sighup_lines(s).get(n - 1) {
                return l.clone();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "gateway {s:?} logged no reload {n}:\n{}",
                self.gw_log(s)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `soya check-config --diff CFG CFG` for gateway `s`: the running
    /// file against itself, keys compared with what the gateway runs with.
    pub fn check_config_diff(&self, s: Site) -> (Option<i32>, String) {
        let cfg = &self.cfg[s.i()];
        let out = Command::new(&self.soya)
            .args(["check-config", "--diff"])
            .arg(cfg)
            .arg(cfg)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    }

    /// Both gateways' identity key files (`Wan::identity`).
    fn make_keys(&self) {
        for s in [Site::A, Site::B] {
            let ok = Command::new(&self.soya)
                .arg("genkey")
                .stdout(Stdio::null())
                .arg(self.key_file(s))
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "soya genkey");
        }
    }

    /// Writes both configurations (the PSK file too; identity mode: each
    /// names its twin's public key as its key file is now).
    pub fn write_configs(&self) {
        use std::os::unix::fs::PermissionsExt;
        // A throwaway key (the forgeries below do not know it either way).
        let key = self.psk_file();
        let seed = std::process::id().wrapping_mul(2_654_435_761);
        let hex: String = (0..32u32)
            .map(|i| format!("{:02x}", (seed.rotate_left(i) ^ (i * 37)) as u8))
            .collect();
        std::fs::write(&key, hex + "\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        for s in [Site::A, Site::B] {
            let binds: Vec<String> = (0..self.wan.paths)
                .map(|k| format!("\"{}:{WAN_PORT}\"", wan_ip(s, k)))
                .collect();
            let mut text = format!(
                "site = \"netns-{site}\"\n\
                 [dc]\n{backend}\n\
                 local_prefixes = [\"{local}\"]\nremote_prefixes = [\"{remote}\"]\n\
                 [buffer]\nsize = \"32MiB\"\n\
                 [pseudo_ack]\npolicy = \"edge\"\n\
                 [control]\nmetrics = \"\"\nsocket = \"{sock}\"\n\
                 [log]\nlevel = \"info\"\n\
                 [gateway]\nshards = {shards}\n\
                 [wan]\nbind = [{binds}]\nkey_file = \"{key}\"\n{twin_timeout}{rekey}{identity}",
                site = if s == Site::A { "a" } else { "b" },
                local = PREFIX[s.i()],
                remote = PREFIX[s.other().i()],
                sock = self.sock[s.i()].display(),
                binds = binds.join(", "),
                key = key.display(),
                twin_timeout = self
                    .wan
                    .twin_timeout
                    .map_or(String::new(), |t| format!("twin_timeout = \"{t}\"\n")),
                rekey = self
                    .wan
                    .rekey_interval
                    .map_or(String::new(), |t| format!("rekey_interval = \"{t}\"\n")),
                identity = if self.wan.identity {
                    let public = self.public_key(s.other());
                    format!(
                        "private_key_file = \"{}\"\ntwin_public_key = \"{public}\"\n",
                        self.key_file(s).display()
                    )
                } else {
                    String::new()
                },
                shards = self.wan.shards,
                backend = if self.wan.xdp {
                    "backend = \"xdp\"\ninterface = \"host\""
                } else {
                    "backend = \"tun\"\ninterface = \"soya0\""
                },
            );
            for k in 0..self.wan.paths {
                text += &format!(
                    "[[wan.paths]]\nname = \"p{k}\"\nremote = \"{}:{WAN_PORT}\"\nbind = {k}\n\
                     rate = \"{}\"\nrtt = \"{}ms\"\n",
                    wan_ip(s.other(), k),
                    self.wan.rate,
                    2.0 * self.wan.delay(k)
                );
            }
            std::fs::write(&self.cfg[s.i()], text).unwrap();
        }
    }

    /// Starts (or restarts) a gateway: waits until its control socket
    /// answers with a new generation, then routes the remote prefix into
    /// its soya0 (the device is the process's: a restart makes a new one).
    pub fn start_gateway(&mut self, s: Site) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("gw{}.log", ["a", "b"][s.i()])))
            .unwrap();
        let log2 = log.try_clone().unwrap();
        let cfg = self.cfg[s.i()].display().to_string();
        let p = self
            .procs
            .spawn(
                &self.gw[s.i()],
                &self.soya.clone(),
                &["gateway", "-c", &cfg],
                |c| {
                    // Keep the device thread at normal priority on a shared
                    // machine.
                    c.env("SOYA_NORMAL_PRIORITY", "1").stdout(log).stderr(log2);
                },
            )
            .unwrap();
        self.gateway[s.i()] = Some(p);
        let t0 = Instant::now();
        let snap = loop {
            if let Ok(snap) = control::query(&self.sock[s.i()]) {
                if snap.state == "running" && snap.generation != self.generation[s.i()] {
                    break snap;
                }
            }
            assert!(
                self.procs.running(p) && t0.elapsed() < Duration::from_secs(10),
                "gateway {s:?} did not start:\n{}",
                self.gw_log(s)
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.generation[s.i()] = snap.generation;
        if self.wan.xdp {
            // AF_XDP on the veth toward the host: no route, no device; the
            // XDP program steers the host's packets for the remote prefix.
            assert!(snap.backend.starts_with("xdp host"), "{}", snap.backend);
            return;
        }
        assert_eq!(snap.backend, "tun soya0");
        let route = format!("route replace {} dev soya0", PREFIX[s.other().i()]);
        ip_in(&self.gw[s.i()], &route);
    }

    /// `systemctl stop`: SIGTERM, then waits for the gateway to drain and
    /// exit (its drain is bounded at 5 s; 20 s here, whatever the
    /// machine's speed). Returns its last log lines (the summary).
    pub fn stop_gateway(&mut self, s: Site) -> String {
        let p = self.gateway[s.i()].take().expect("gateway running");
        self.procs.signal(p, 15); // SIGTERM
        let status = self.procs.wait(p, Duration::from_secs(20));
        let log = self.gw_log(s);
        assert!(
            status.is_some_and(|st| st.success()),
            "gateway {s:?} did not exit cleanly on SIGTERM ({status:?}):\n{log}"
        );
        log
    }

    /// `kill -9` of a gateway.
    pub fn kill_gateway(&mut self, s: Site) {
        let p = self.gateway[s.i()].take().expect("gateway running");
        self.procs.kill(p);
    }

    fn start_server(&mut self) {
        let out = std::fs::File::create(self.dir.join("server.json")).unwrap();
        let err = std::fs::File::create(self.dir.join("server.log")).unwrap();
        let bind = HOST[1].to_string();
        self.procs
            .spawn(
                &self.host[1],
                Path::new(PERF),
                &[
                    "server",
                    "--bind-ip",
                    &bind,
                    "--json",
                    "-q",
                    "--drain-timeout",
                    "2",
                ],
                |c| {
                    c.stdout(out).stderr(err);
                },
            )
            .unwrap();
    }

    /// Starts `soya-perf client` at hostA toward hostB's server.
    /// [`Self::spawn_client`] with `args`, posting until
    /// [`StopFile::stop`] (at most 600 s): a test ends the stream once
    /// what it waits for happened, whatever the machine's speed.
    pub fn spawn_client_until_stopped(&mut self, args: &[&str]) -> (PerfClient, StopFile) {
        let stop = StopFile(self.dir.join(format!("stop-{}", self.clients)));
        let path = stop.0.display().to_string();
        let mut all = args.to_vec();
        all.extend(["--duration", "600", "--stop-file", &path]);
        (self.spawn_client(&all), stop)
    }

    pub fn spawn_client(&mut self, args: &[&str]) -> PerfClient {
        self.clients += 1;
        let (a, b) = (HOST[0].to_string(), HOST[1].to_string());
        let (dir, ns) = (&self.dir, &self.host[0]);
        PerfClient::spawn(&mut self.procs, dir, self.clients, ns, (&a, &b), args)
    }

    /// Waits for a client's report (at most `within`).
    pub fn finish_client(&mut self, c: PerfClient, within: Duration) -> (PerfReport, ExitStatus) {
        c.finish(&mut self.procs, within).unwrap_or_else(|e| {
            panic!(
                "{e}\n{}\n{:#?}",
                self.gw_log(Site::A),
                self.snapshot(Site::A)
            )
        })
    }

    pub fn run_client(&mut self, args: &[&str]) -> (PerfReport, ExitStatus) {
        let c = self.spawn_client(args);
        self.finish_client(c, Duration::from_secs(60))
    }

    pub fn snapshot(&self, s: Site) -> Snapshot {
        control::query(&self.sock[s.i()]).expect("control socket")
    }

    /// What `soya status --json` prints, parsed.
    pub fn status(&self, s: Site) -> Snapshot {
        let out = Command::new(&self.soya)
            .args(["status", "--json", "--socket"])
            .arg(&self.sock[s.i()])
            .output()
            .unwrap();
        assert!(out.status.success(), "soya status: {out:?}");
        serde_json::from_slice(&out.stdout).expect("soya status --json")
    }

    /// Polls a gateway until `f` holds (20 s at most).
    pub fn wait_for(&self, s: Site, what: &str, f: impl Fn(&Snapshot) -> bool) -> Snapshot {
        let t0 = Instant::now();
        loop {
            if let Ok(snap) = control::query(&self.sock[s.i()]) {
                if f(&snap) {
                    return snap;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "gateway {s:?}: timed out waiting for {what}:\n{snap:#?}\n{}",
                    self.gw_log(s)
                );
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no gateway {s:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn tail(&self, file: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn gw_log(&self, s: Site) -> String {
        let f = format!("gw{}.log", ["a", "b"][s.i()]);
        format!("--- {f} ---\n{}", self.tail(&f))
    }

    /// Both gateways' `soya status --json`, with their names.
    pub fn statuses(&self) -> [(Snapshot, &'static str); 2] {
        [(self.status(Site::A), "gwA"), (self.status(Site::B), "gwB")]
    }

    /// ping, both ways between the hosts (the exit status is 0 when a
    /// reply came).
    pub fn ping_both_ways(&self) {
        for (from, to) in [(0, 1), (1, 0)] {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.host[from], "ping", "-c", "3"])
                .args(["-i", "0.2", "-W", "2", &HOST[to].to_string()])
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "ping {}: {text}", HOST[to]);
            println!(
                "ping {}: {}",
                HOST[to],
                text.lines().last().unwrap_or_default()
            );
        }
    }

    /// `data` sent over one TCP connection from hostA to an echo server at
    /// hostB must come back whole; returns the address the server saw.
    pub fn tcp_echo(&self, data: &[u8]) -> SocketAddr {
        let listener = in_netns(&self.host[1], || TcpListener::bind((HOST[1], 5001))).unwrap();
        listener.set_nonblocking(true).unwrap();
        let server = std::thread::spawn(move || -> std::io::Result<SocketAddr> {
            let t0 = Instant::now();
            let (mut s, peer) = loop {
                match listener.accept() {
                    Ok(x) => break x,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if t0.elapsed() > Duration::from_secs(20) {
                            return Err(e);
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(e),
                }
            };
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(Duration::from_secs(20)))?;
            let mut r = s.try_clone()?;
            std::io::copy(&mut r, &mut s)?;
            Ok(peer)
        });
        let mut c = in_netns(&self.host[0], || {
            TcpStream::connect_timeout(&SocketAddr::from((HOST[1], 5001)), Duration::from_secs(10))
        })
        .expect("TCP connect from hostA to hostB");
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = c.try_clone().unwrap();
        let sent = data.to_vec();
        let writer = std::thread::spawn(move || {
            w.write_all(&sent).unwrap();
            w.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let mut back = Vec::new();
        c.read_to_end(&mut back).expect("echo");
        writer.join().unwrap();
        let peer = server.join().unwrap().expect("TCP server");
        assert!(
            back == data,
            "TCP echo differs: {} of {} bytes",
            back.len(),
            data.len()
        );
        peer
    }

    /// Stops the emulators (SIGTERM) and returns their exit summaries.
    pub fn stop_wanem(&mut self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for (k, p) in std::mem::take(&mut self.wanem).into_iter().enumerate() {
            self.procs.signal(p, 15); // SIGTERM
            self.procs.wait(p, Duration::from_secs(5));
            let text = std::fs::read_to_string(self.dir.join(format!("wanem{k}.json")))
                .unwrap_or_default();
            out.push(serde_json::from_str(text.trim()).unwrap_or_default());
        }
        out
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{}: lab files kept in {}\n{}\n{}",
                self.test,
                self.dir.display(),
                self.gw_log(Site::A),
                self.gw_log(Site::B)
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A two-shard gateway's shards, both connected, shard 1 (the hosts'
/// pair's) talking to its twin (printed), and no DC packet dropped by the
/// kernel.
pub fn two_shards<'a>(s: &'a Snapshot, name: &str) -> (&'a ShardSnap, &'a ShardSnap) {
    assert_eq!(s.shards.len(), 2, "{name}: {:?}", s.shards);
    let (s0, s1) = (&s.shards[0], &s.shards[1]);
    assert!(s0.connected && s1.connected, "{name}: {:?}", s.shards);
    assert!(s1.twin_msgs_out > 0 && s1.twin_msgs_in > 0, "{name}");
    println!(
        "{name}: shard 1 twin msgs out/in {}/{}",
        s1.twin_msgs_out, s1.twin_msgs_in
    );
    assert_eq!(s.dc.rx_kernel_drops, 0, "{name}: {:?}", s.dc);
    (s0, s1)
}

pub fn pseudo_acks(s: &Snapshot) -> u64 {
    s.flows
        .iter()
        .filter(|f| f.role == "ingress")
        .map(|f| f.pseudo_acks)
        .sum()
}

pub fn assert_clean(r: &PerfReport, status: ExitStatus, what: &str) {
    let server = r.server.as_deref();
    assert!(
        r.ok && status.success(),
        "{what}: not clean ({status}): {:?}\n{r:#?}",
        r.errors
    );
    assert_eq!(r.data_errors, 0, "{what}");
    assert_eq!(r.bytes_lost, 0, "{what}");
    assert_eq!(r.failed_completions + r.incomplete, 0, "{what}");
    assert_eq!(r.remote_data_errors, Some(0), "{what}");
    // Every payload byte was checked against the pattern at its receiver
    // (the server for WRITE/SEND, this side for READ).
    assert!(r.bytes > 0 && r.bytes_verified >= r.bytes, "{what}: {r:#?}");
    let server = server.expect("server report");
    assert!(server.ok, "{what}: server: {:?}", server.errors);
    // Nothing malformed or misaddressed reached either host.
    for (side, rep) in [("client", r), ("server", server)] {
        assert_eq!(rep.io.bad_datagrams, 0, "{what}: {side} {:?}", rep.io);
        assert_eq!(rep.packets.malformed_dropped, 0, "{what}: {side}");
        assert_eq!(rep.packets.misaddressed_dropped, 0, "{what}: {side}");
    }
}

/// The file that tells a `soya-perf client --stop-file` to stop posting.
pub struct StopFile(PathBuf);

impl StopFile {
    pub fn stop(&self) {
        std::fs::write(&self.0, b"").unwrap();
    }
}

/// Seconds since the Unix epoch, as soya-perf's `failed_at_unix_s`.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
