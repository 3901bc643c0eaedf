//! Network namespaces and the processes in them (root only): what the
//! namespace integration tests (`tools/tests/netns.rs`) and `soya demo
//! --netns` build their sites from. Every failure is an `Err` naming the
//! command, never a panic: the demo is a user-facing command.

use std::fs::File;

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Runs a command quietly; true when it ran and succeeded.
pub fn run(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `ip` with `args`; true on success.
pub fn ip(args: &[&str]) -> bool {
    let mut all = vec!["ip"];
    all.extend_from_slice(args);
    run(&all)
}

/// Runs `ip` with `args`; on failure the error says which command and what
/// `ip` printed.
pub fn try_ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `ip -n NS WORDS...` (the words split at whitespace).
pub fn try_ip_in(ns: &str, words: &str) -> Result<(), String> {
    let mut args = vec!["-n", ns];
    args.extend(words.split_whitespace());
    try_ip(&args)
}

/// What namespace work needs that this machine may lack: `None` when root,
/// `/dev/net/tun`, `ip netns` and every command in `commands` are there,
/// else what is missing.
pub fn netns_missing(commands: &[&str]) -> Option<String> {
    let mut missing = Vec::new();
    if !soya_io::sys::is_root() {
        missing.push("root".to_string());
    }
    if !Path::new("/dev/net/tun").exists() {
        missing.push("/dev/net/tun".into());
    }
    if !run(&["ip", "-V"]) {
        missing.push("ip (iproute2)".into());
    }
    for c in commands {
        if !run(&["sh", "-c", &format!("command -v {c}")]) {
            missing.push((*c).to_string());
        }
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// Network namespaces and the processes started in them: when dropped,
/// however the caller ends, the processes are killed (SIGKILL) and reaped,
/// then the namespaces deleted (their devices go with them).
#[derive(Default)]
pub struct Netns {
    names: Vec<String>,
    children: Vec<Option<Child>>,
}

/// A process started by [`Netns::spawn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc(usize);

impl Netns {
    pub fn new() -> Netns {
        Netns::default()
    }

    /// Creates namespace `name` (loopback up) and takes charge of it.
    pub fn add(&mut self, name: &str) -> Result<String, String> {
        try_ip(&["netns", "add", name])?;
        self.names.push(name.to_string());
        try_ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(name.to_string())
    }

    /// Creates the five namespaces of a two-site lab, `<prefix>-` then hA,
    /// hB (the hosts), gA, gB (their gateways) and wan (between the
    /// gateways): returns (hosts, gateways, wan).
    pub fn add_two_sites(
        &mut self,
        prefix: &str,
    ) -> Result<([String; 2], [String; 2], String), String> {
        let mut add = |r: &str| self.add(&format!("{prefix}-{r}"));
        let host = [add("hA")?, add("hB")?];
        let gw = [add("gA")?, add("gB")?];
        Ok((host, gw, add("wan")?))
    }

    /// Starts `program args` inside namespace `ns` (`ip netns exec`, which
    /// execs it: the child's pid is the program's). `setup` adjusts the
    /// command (environment, redirections) first.
    pub fn spawn(
        &mut self,
        ns: &str,
        program: &Path,
        args: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> Result<Proc, String> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program).args(args);
        c.stdin(Stdio::null());
        setup(&mut c);
        let child = c
            .spawn()
            .map_err(|e| format!("ip netns exec {ns} {}: {e}", program.display()))?;
        self.children.push(Some(child));
        Ok(Proc(self.children.len() - 1))
    }

    pub fn pid(&self, p: Proc) -> Option<u32> {
        self.children[p.0].as_ref().map(Child::id)
    }

    /// Sends `sig` to a process still running.
    pub fn signal(&self, p: Proc, sig: i32) {
        if let Some(c) = &self.children[p.0] {
            // Our own, not yet reaped, child: the pid is still its.
            let _ = soya_io::sys::kill(c.id(), sig);
        }
    }

    /// `kill -9`, and reaps it.
    pub fn kill(&mut self, p: Proc) -> Option<ExitStatus> {
        let mut c = self.children[p.0].take()?;
        let _ = c.kill();
        c.wait().ok()
    }

    /// Waits up to `within` for the process to exit; `None` if it is still
    /// running (or cannot be waited for).
    pub fn wait(&mut self, p: Proc, within: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        loop {
            let c = self.children[p.0].as_mut()?;
            if let Ok(Some(s)) = c.try_wait() {
                self.children[p.0] = None;
                return Some(s);
            }
            if t0.elapsed() >= within {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self, p: Proc) -> bool {
        self.children[p.0]
            .as_mut()
            .is_some_and(|c| c.try_wait().is_ok_and(|s| s.is_none()))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.names {
            ip(&["netns", "del", n]);
        }
    }
}

/// Runs `f` on a fresh thread that entered network namespace `ns`:
/// sockets made there belong to `ns` for good, whichever thread uses them
/// afterwards; files under `/proc/sys/net` opened there are `ns`'s.
pub fn try_in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        soya_io::sys::enter_netns(&fd).map_err(|e| format!("setns {path}: {e}"))?;
        Ok(f())
    })
    .join()
    .map_err(|_| format!("the thread in namespace {ns} panicked"))?
}

/// Writes a sysctl under `/proc/sys/net` of namespace `ns` (e.g.
/// `ipv4/ip_forward`); false if the knob does not exist.
pub fn net_sysctl(ns: &str, key: &str, value: &str) -> bool {
    let path = format!("/proc/sys/net/{key}");
    let value = value.to_string();
    try_in_netns(ns, move || std::fs::write(path, value).is_ok()).unwrap_or(false)
}

/// A site's DC link: `host` (device `dc`, addresses `host_ips`, default
/// route via `gw_ip`) ──veth── `gw` (device `host`, address `gw_ip`, all
/// /24), both up at MTU 9000; `gw` forwards; no IPv6 in either namespace
/// (its chatter into soya0 would count as ACL drops).
pub fn wire_site(host: &str, gw: &str, host_ips: &[&str], gw_ip: &str) -> Result<(), String> {
    for n in [host, gw] {
        for k in ["all", "default"] {
            net_sysctl(n, &format!("ipv6/conf/{k}/disable_ipv6"), "1");
        }
    }
    if !net_sysctl(gw, "ipv4/ip_forward", "1") {
        return Err(format!("cannot enable ip_forward in {gw}"));
    }
    try_ip(&[
        "link", "add", "dc", "netns", host, "type", "veth", "peer", "name", "host", "netns", gw,
    ])?;
    for a in host_ips {
        try_ip_in(host, &format!("addr add {a}/24 dev dc"))?;
    }
    try_ip_in(gw, &format!("addr add {gw_ip}/24 dev host"))?;
    try_ip_in(host, "link set dc up mtu 9000")?;
    try_ip_in(gw, "link set host up mtu 9000")?;
    try_ip_in(host, &format!("route add default via {gw_ip}"))
}
