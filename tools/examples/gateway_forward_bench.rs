//! Forwarding cost of a gateway: Gb/s per core through one gateway, on
//! loopback, with 4 KiB RoCE packets.
//!
//! ```text
//! cargo build --release --workspace
//! cargo run --release -p soya-tools --example gateway_forward_bench -- [--secs 4] [--keyed] [--io gso|mmsg|single|uring]
//! ```
//!
//! ```text
//! soya-perf client ─IP-in-UDP─ gateway A ─WAN/UDP─ gateway B ─IP-in-UDP─ soya-perf server
//! ```
//!
//! Real processes (the binaries next to this example's target directory):
//! soya-perf streams 64 KiB RDMA WRITEs (MTU 4096: 4 KiB RoCE packets)
//! through two gateways joined directly over loopback (no emulated
//! distance). Each gateway's CPU time (utime + stime from /proc/PID/stat,
//! all its threads) over the transfer gives its cost: bytes placed at the
//! responder × 8 / CPU seconds = Gb/s per core for the ingress (A) and the
//! egress (B) role. The machine may be shared: the per-core figure, not the
//! wall-clock rate, is the comparable one.

#![deny(unsafe_code)]

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_tcp() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// utime + stime of a process, seconds.
fn cpu_of(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let hz = soya_io::sys::clock_ticks_per_sec() as f64;
    if f.len() > 13 {
        (f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0)) / hz
    } else {
        0.0
    }
}

#[allow(clippy::too_many_arguments)]
fn config(
    dir: &Path,
    site: &str,
    dc: u16,
    local: &str,
    remote: &str,
    wan: u16,
    twin: u16,
    key: Option<&Path>,
) -> PathBuf {
    let security = key.map_or("insecure = true".to_string(), |k| {
        format!("key_file = \"{}\"", k.display())
    });
    let text = format!(
        "site = \"{site}\"\n[dc]\nbackend = \"udp\"\nlisten = \"127.0.0.1:{dc}\"\n\
         local_prefixes = [\"{local}\"]\nremote_prefixes = [\"{remote}\"]\n[wan]\n\
         bind = [\"127.0.0.1:{wan}\"]\n{security}\n[[wan.paths]]\nname = \"p0\"\n\
         remote = \"127.0.0.1:{twin}\"\nbind = 0\nrate = \"40gbit\"\nrtt = \"200us\"\n\
         [buffer]\nsize = \"256MiB\"\nper_flow_quota = \"64MiB\"\n[pseudo_ack]\npolicy = \"edge\"\n\
         [control]\nmetrics = \"\"\nsocket = \"{}\"\n[log]\nformat = \"human\"\nlevel = \"info\"\n",
        dir.join(format!("{site}.sock")).display()
    );
    let p = dir.join(format!("{site}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            // SIGTERM to a child we spawned (drain and exit); it may be gone.
            let _ = soya_io::sys::kill(c.id(), libc::SIGTERM);
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

#[derive(clap::Parser)]
struct Args {
    /// Length of the transfer, seconds.
    #[arg(long, default_value_t = 4.0)]
    secs: f64,
    /// Give the gateways a pre-shared key (an encrypted WAN), not `insecure`.
    #[arg(long)]
    keyed: bool,
    /// The gateways' `--io` mode (gso, mmsg, single, uring); theirs by default.
    #[arg(long)]
    io: Option<String>,
}

fn main() {
    let Args { secs, keyed, io } = clap::Parser::parse();
    let exe = std::env::current_exe().unwrap();
    // target/release/examples/<this> -> target/release
    let bin = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    for b in ["soya", "soya-perf"] {
        assert!(
            bin.join(b).exists(),
            "{} missing: cargo build --release --workspace first",
            bin.join(b).display()
        );
    }
    let dir = std::env::temp_dir().join(format!("soya-fwd-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = keyed.then(|| {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("psk.key");
        std::fs::write(&p, "7f".repeat(32)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    });
    let (wa, wb, dca, dcb) = (free_udp(), free_udp(), free_udp(), free_udp());
    let fa = config(
        &dir,
        "a",
        dca,
        "10.1.0.0/16",
        "10.2.0.0/16",
        wa,
        wb,
        key.as_deref(),
    );
    let fb = config(
        &dir,
        "b",
        dcb,
        "10.2.0.0/16",
        "10.1.0.0/16",
        wb,
        wa,
        key.as_deref(),
    );
    let log = |n: &str| Stdio::from(std::fs::File::create(dir.join(n)).unwrap());
    let mut gws = Kill(Vec::new());
    for (f, n) in [(&fa, "a.log"), (&fb, "b.log")] {
        let mut c = Command::new(bin.join("soya"));
        c.arg("gateway").arg("--config").arg(f);
        if let Some(io) = &io {
            c.args(["--io", io]);
        }
        gws.0
            .push(c.stdout(Stdio::null()).stderr(log(n)).spawn().unwrap());
    }
    std::thread::sleep(Duration::from_millis(800));
    let ctl = free_tcp();
    // soya-perf `words` on loopback, JSON out, control port `ctl`, its RoCE
    // port picked by the kernel.
    let perf = |words: &[&str]| {
        let mut c = Command::new(bin.join("soya-perf"));
        c.args(words)
            .args(["--json", "--quiet", "--bind-ip", "127.0.0.1"])
            .args(["--port", &ctl.to_string(), "--roce-port", "0"]);
        c
    };
    let mut kids = Kill(Vec::new());
    kids.0.push(
        perf(&["server", "--once"])
            .args(["--roce-ip", "10.2.0.1", "--accept-timeout", "20"])
            .args(["--gateway", &format!("127.0.0.1:{dcb}")])
            .stdout(Stdio::null())
            .stderr(log("server.log"))
            .spawn()
            .unwrap(),
    );
    let (pa, pb) = (gws.0[0].id(), gws.0[1].id());
    let client = perf(&["client", "127.0.0.1"])
        .args(["--roce-ip", "10.1.0.1", "--connect-timeout", "10"])
        .args(["--size", "65536", "--tx-depth", "128", "--mtu", "4096"])
        .args(["--duration", &format!("{secs}")])
        .args(["--gateway", &format!("127.0.0.1:{dca}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (ca0, cb0, t0) = (cpu_of(pa), cpu_of(pb), Instant::now());
    let out = client.wait_with_output().unwrap();
    let (ca, cb, wall) = (
        cpu_of(pa) - ca0,
        cpu_of(pb) - cb0,
        t0.elapsed().as_secs_f64(),
    );
    drop(kids);
    drop(gws);
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no soya-perf report; logs in {}", dir.display()));
    let gbps = v
        .pointer("/server/goodput_gbps")
        .and_then(serde_json::Value::as_f64)
        .or_else(|| v.get("goodput_gbps").and_then(serde_json::Value::as_f64))
        .unwrap_or(0.0);
    let bytes = v.get("bytes").and_then(serde_json::Value::as_f64);
    // Bits moved: the requester's completed bytes when reported, else the
    // goodput over the client's run time.
    let bits = bytes.map_or(gbps * 1e9 * secs, |b| b * 8.0);
    let per = |cpu: f64| if cpu > 0.0 { bits / cpu / 1e9 } else { 0.0 };
    println!(
        "through two gateways on loopback ({}, io {}): {gbps:.3} Gb/s goodput, {wall:.2} s",
        if keyed { "keyed" } else { "insecure" },
        io.as_deref().unwrap_or("default")
    );
    println!(
        "gateway A (ingress): {ca:.2} CPU-s = {:.2} Gb/s per core; gateway B (egress): {cb:.2} CPU-s = {:.2} Gb/s per core",
        per(ca),
        per(cb)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
