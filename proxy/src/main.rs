//! The `soya` command: gateway daemon and its status, config checker, planner and demo.

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand};

mod plan_cli;

/// Sōya — long-distance RoCEv2 WAN accelerator.
///
/// One gateway per site terminates the RoCE ACK loop at the edge (pseudo-ACKs),
/// buffers deeply and carries the traffic to its twin over several WAN paths.
#[derive(Parser)]
#[command(name = "soya", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a site configuration file and explain the effective settings.
    CheckConfig {
        /// Site configuration files (TOML) to check.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only report errors; print nothing for valid files.
        #[arg(short, long)]
        quiet: bool,
        /// Compare two files (RUNNING NEW): which changes a reload (SIGHUP)
        /// applies live and which need a restart. Exits 0 when everything
        /// applies live, 2 when something needs a restart. Keys are compared
        /// by content: with the gateway on RUNNING's control socket running,
        /// with the keys it runs with (a key file rewritten in place shows).
        #[arg(long)]
        diff: bool,
    },
    /// Generate this gateway's identity key: a fresh X25519 private key,
    /// written in base64 to FILE (created with mode 0600; an existing file
    /// is never overwritten), or to stdout with `-` (as `wg genkey`).
    /// Name it in `wan.private_key_file`; give the twin its public key
    /// (`soya pubkey FILE`) for its `wan.twin_public_key`.
    Genkey {
        /// Where to write the private key (`-`: stdout).
        file: PathBuf,
    },
    /// Print the base64 public key of a private key read from FILE, or
    /// from stdin without FILE or with `-` (as `wg pubkey`).
    Pubkey {
        /// The private key file (`soya genkey`); default stdin.
        file: Option<PathBuf>,
    },
    /// Plan capacity: WAN delay, BDP, deep-buffer size, goodput direct vs. through
    /// Sōya, and whether a data-parallel job's AllReduce hides behind backward.
    Plan(plan_cli::PlanCli),
    /// Run the two-site demo (direct vs. through Sōya at 300 km): between
    /// network namespaces on the xdp backend as root, else on loopback.
    ///
    /// Starts two gateways, soya-wanem relays and soya-perf endpoints as
    /// child processes and runs the same RDMA WRITE workload direct at 0 km,
    /// direct over the emulated WAN and through Sōya. As root (with
    /// iproute2 and /dev/net/tun) the hosts and gateways live in network
    /// namespaces and exchange real RoCEv2; otherwise, or with --loopback,
    /// everything runs on loopback without root. Needs soya-perf and soya-wanem next to this binary
    /// (`cargo build --release --workspace`).
    Demo(soya::demo_args::DemoArgs),
    /// Run the gateway daemon of one site (SIGTERM/SIGINT drain and exit,
    /// SIGHUP re-reads the configuration).
    Gateway {
        /// Site configuration file (TOML).
        #[arg(short, long)]
        config: PathBuf,
        /// Validate the configuration, print the startup summary and exit.
        #[arg(long)]
        check: bool,
        /// Packet I/O: gso (GSO/GRO, sendmmsg/recvmmsg fallback; default),
        /// mmsg, single (one datagram per system call), or uring (builds
        /// with the `io-uring` feature). Also the SOYA_IO environment
        /// variable.
        #[arg(long, value_name = "MODE")]
        io: Option<String>,
    },
    /// Show a running gateway's paths and busiest flows (read from its
    /// control socket).
    Status {
        /// The gateway's control socket (`control.socket`).
        #[arg(short, long)]
        socket: Option<PathBuf>,
        /// Take the control socket from this site configuration instead.
        #[arg(short, long, conflicts_with = "socket")]
        config: Option<PathBuf>,
        /// Print the raw snapshot as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print every metric the gateway exports (name, type, help, labels):
    /// the table packaging/metrics-spec.json is generated from, which the
    /// Grafana dashboard generator and the alert rules are checked against.
    MetricsSpec {
        /// Print JSON (the only format; kept explicit for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Check whether this gateway should carry traffic: exit 0 when it is
    /// running (not draining), its twin is connected and enough WAN paths
    /// are up; exit 1 otherwise, also when nothing answers on the control
    /// socket. Prints one line saying why.
    ///
    /// Made for routing daemons and their helpers: soya-announce (in
    /// /usr/share/soya/routing) runs it every interval and has BIRD or FRR
    /// announce this gateway's address slice only while it passes
    /// (docs/scale-out.md).
    Health {
        /// The gateway's control socket (`control.socket`).
        #[arg(short, long)]
        socket: Option<PathBuf>,
        /// Take the control socket from this site configuration instead.
        #[arg(short, long, conflicts_with = "socket")]
        config: Option<PathBuf>,
        /// WAN paths that must be up (in every shard) to pass.
        #[arg(long, default_value_t = 1, value_name = "N",
              value_parser = clap::value_parser!(u16).range(1..))]
        min_paths: u16,
        /// Seconds the twin may be unreachable (every path silent: a
        /// blip on a loaded host or link) and still pass; `lost` and
        /// `connecting` always fail. It adds to how long a dead twin's
        /// slice stays routed here.
        #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
        grace: f64,
        /// Print nothing; only the exit status tells.
        #[arg(short, long)]
        quiet: bool,
    },
}

/// `soya demo`: runs the orchestration in `soya-perf demo` (the lab tools
/// live in their own crate), found next to this executable.
fn demo(a: &soya::demo_args::DemoArgs) -> ExitCode {
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("soya demo: cannot find this executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = me
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let missing: Vec<&str> = ["soya-perf", "soya-wanem"]
        .into_iter()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "soya demo: {} not found in {}: the demo runs them from the directory of the soya \
             binary. Build the whole workspace first: cargo build --release --workspace",
            missing.join(" and "),
            dir.display()
        );
        return ExitCode::FAILURE;
    }
    let mut cmd = std::process::Command::new(dir.join("soya-perf"));
    cmd.arg("demo").arg("--soya-bin").arg(&me).args(a.to_args());
    soya::sys::die_with_parent(&mut cmd);
    match cmd.status() {
        Ok(st) => match st.code() {
            Some(0) => ExitCode::SUCCESS,
            Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
            None => ExitCode::FAILURE,
        },
        Err(e) => {
            eprintln!(
                "soya demo: cannot run {}: {e}",
                dir.join("soya-perf").display()
            );
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Genkey { file } => genkey(&file),
        Command::Pubkey { file } => pubkey(file.as_deref()),
        Command::CheckConfig { files, quiet, diff } => {
            if diff {
                check_config_diff(&files)
            } else {
                check_config(&files, quiet)
            }
        }
        Command::Plan(args) => match args.try_into() {
            Ok(a) => soya::plan::run(&a),
            Err(e) => soya::plan::refused(&e),
        },
        Command::Demo(args) => demo(&args),
        Command::Gateway { config, check, io } => {
            if let Some(io) = io {
                // Read once by Gateway::start, before any thread exists.
                std::env::set_var(soya::gateway::IO_ENV, io);
            }
            gateway(&config, check)
        }
        Command::Status {
            socket,
            config,
            json,
        } => status(socket, config, json),
        Command::MetricsSpec { json: _ } => {
            let _ = std::io::stdout()
                .lock()
                .write_all(soya::gateway::metrics::spec_json().as_bytes());
            ExitCode::SUCCESS
        }
        Command::Health {
            socket,
            config,
            min_paths,
            grace,
            quiet,
        } => health(socket, config, min_paths.into(), grace, quiet),
    }
}

fn gateway(path: &std::path::Path, check: bool) -> ExitCode {
    use soya::gateway::{self, logging, signals};
    let cfg = match soya_config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", gateway::startup_summary(&cfg));
    if check {
        if let Err(e) = gateway::wan_key(&cfg).and_then(|_| gateway::wan_identity(&cfg)) {
            eprintln!("soya gateway: {e}");
            return ExitCode::FAILURE;
        }
        println!("configuration OK");
        return ExitCode::SUCCESS;
    }
    logging::init(cfg.log.format, cfg.log.level);
    // SIGHUP runs `reload` on the control plane (gateway::signals); it
    // reaches the device loops through the gateway's Control, which exists
    // once the gateway has started. A SIGHUP that comes while it starts
    // (the control socket is up a moment before: an operator's reload right
    // after `systemctl start`, a test that waits for the socket) is
    // remembered and applied as soon as it has, never dropped.
    let path = path.to_path_buf();
    let reloads = Arc::new(Mutex::new(Reloads::default()));
    let (r, p) = (reloads.clone(), path.clone());
    let on_sighup: signals::Reload = Box::new(move || {
        let Ok(mut st) = r.lock() else { return };
        match st.control.clone() {
            Some(ctl) => reload(&p, &ctl),
            None => {
                st.pending = true;
                tracing::info!("SIGHUP: the gateway is still starting; reloading once it has");
            }
        }
    });
    let gw = match gateway::Gateway::start_with(&cfg, Some(on_sighup)) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("soya gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Ok(mut st) = reloads.lock() {
        // Under the lock: a SIGHUP either saw no control and left
        // `pending`, or sees this one.
        st.control = Some(gw.control());
        if std::mem::take(&mut st.pending) {
            reload(&path, &gw.control());
        }
    }
    let summary = gw.wait();
    println!("{summary}");
    match summary.outcome {
        gateway::RunOutcome::Failed(_) => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    }
}

/// What SIGHUP needs: the gateway's Control once it has started, and
/// whether a SIGHUP came before that.
#[derive(Default)]
struct Reloads {
    control: Option<soya::gateway::Control>,
    pending: bool,
}

/// SIGHUP: re-reads the configuration file and applies what it can live
/// (`gateway::reload::apply`); the log line says what needs a restart.
fn reload(path: &std::path::Path, ctl: &soya::gateway::Control) {
    match soya_config::load(path) {
        Ok(new) => {
            let r = ctl.reload(&new);
            if !r.errors.is_empty() {
                tracing::error!("SIGHUP: {}", r.summary());
            } else if !r.need_restart.is_empty() {
                tracing::warn!("SIGHUP: {}", r.summary());
            } else {
                tracing::info!("SIGHUP: {}", r.summary());
            }
        }
        Err(e) => tracing::error!("SIGHUP: configuration not reloaded: {e}"),
    }
}

/// The control socket from `--socket`, `--config`, or the one gateway's
/// socket in /run/soya; `Err` says why not (prefixed with `command`).
fn control_socket(
    command: &str,
    socket: Option<PathBuf>,
    config: Option<PathBuf>,
) -> Result<PathBuf, String> {
    match (socket, config) {
        (Some(s), _) => Ok(s),
        (None, Some(c)) => soya_config::load(&c)
            .map(|cfg| cfg.control.socket)
            .map_err(|e| e.to_string()),
        (None, None) => {
            let found: Vec<PathBuf> = std::fs::read_dir("/run/soya")
                .map(|d| {
                    d.filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                        .collect()
                })
                .unwrap_or_default();
            match found.as_slice() {
                [one] => Ok(one.clone()),
                [] => Err(format!(
                    "soya {command}: no gateway socket in /run/soya; give --socket PATH or --config FILE"
                )),
                many => Err(format!(
                    "soya {command}: several gateways in /run/soya ({}); give --socket PATH",
                    many.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
    }
}

fn status(socket: Option<PathBuf>, config: Option<PathBuf>, json: bool) -> ExitCode {
    let path = match control_socket("status", socket, config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match soya::gateway::control::query(&path) {
        Ok(s) => {
            let text = if json {
                serde_json::to_string_pretty(&s).unwrap_or_default() + "\n"
            } else {
                soya::gateway::control::render_status(&s)
            };
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "soya status: cannot read gateway status from {}: {e}",
                path.display()
            );
            ExitCode::FAILURE
        }
    }
}

/// `soya health`: exit 0 (healthy) or 1, one line on stdout (healthy) or
/// stderr (not). A gateway that does not answer is unhealthy: to a router,
/// a killed gateway and a hung one are the same.
fn health(
    socket: Option<PathBuf>,
    config: Option<PathBuf>,
    min_paths: usize,
    grace: f64,
    quiet: bool,
) -> ExitCode {
    use soya::gateway::health::{verdict, HealthRule};
    let result = control_socket("health", socket, config).and_then(|path| {
        let snap = soya::gateway::control::query(&path)
            .map_err(|e| format!("no answer from {}: {e}", path.display()))?;
        let rule = HealthRule {
            min_paths,
            unreachable_grace_secs: grace,
        };
        verdict(&snap, rule)
    });
    match result {
        Ok(why) => {
            if !quiet {
                println!("healthy: {why}");
            }
            ExitCode::SUCCESS
        }
        Err(why) => {
            if !quiet {
                eprintln!("unhealthy: {why}");
            }
            ExitCode::FAILURE
        }
    }
}

/// `soya check-config --diff RUNNING NEW`.
fn check_config_diff(files: &[PathBuf]) -> ExitCode {
    let [running, new] = files else {
        eprintln!("soya check-config --diff: give two files, RUNNING NEW");
        return ExitCode::FAILURE;
    };
    let load = |f: &PathBuf| soya_config::load(f).map_err(|e| eprintln!("{e}"));
    let (Ok(mut old), Ok(new_cfg)) = (load(running), load(new)) else {
        return ExitCode::FAILURE;
    };
    // The keys: what the running gateway loaded, when one answers on the
    // running file's control socket (a key file rewritten in place since
    // then is a change); else the key files as they are now.
    let keyed = !matches!(old.wan.security, soya_config::WanSecurity::Insecure { .. });
    if keyed {
        let socket = &old.control.socket;
        match soya::gateway::control::query_key_digests(socket) {
            Ok(d) => {
                old.wan.key_digests = d;
                println!(
                    "keys: compared with those the gateway on {} runs with",
                    socket.display()
                );
            }
            Err(e) => println!(
                "keys: no running gateway answers ({e}); compared as the key files are                  now (a key file rewritten in place is not seen)"
            ),
        }
    }
    let r = soya::gateway::reload::diff(&old, &new_cfg);
    if r.is_empty() {
        println!("no change");
        return ExitCode::SUCCESS;
    }
    for k in &r.applied {
        println!("live:    {k}");
    }
    for k in &r.need_restart {
        println!("restart: {k}");
    }
    if r.need_restart.is_empty() {
        println!("a reload (SIGHUP) applies every change without dropping a flow");
        ExitCode::SUCCESS
    } else {
        println!(
            "{} change(s) need a restart (a restart fails every flow through the gateway)",
            r.need_restart.len()
        );
        ExitCode::from(2)
    }
}

fn genkey(file: &std::path::Path) -> ExitCode {
    let key = match soya::rand::key() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("soya genkey: no randomness from the operating system: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = soya_config::encode_key_base64(&key) + "\n";
    if file.as_os_str() == "-" {
        print!("{text}");
        return ExitCode::SUCCESS;
    }
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file);
    let written = opened.and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    match written {
        Ok(()) => {
            let public = soya::wan::public_key(&key);
            eprintln!(
                "soya genkey: wrote a private key to {} (mode 0600); its public key, for the twin's \
                 wan.twin_public_key:",
                file.display()
            );
            println!("{}", soya_config::encode_key_base64(&public));
            ExitCode::SUCCESS
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            eprintln!(
                "soya genkey: {} exists; not overwriting a key (remove it first if you mean to \
                 replace this gateway's identity)",
                file.display()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("soya genkey: cannot write {}: {e}", file.display());
            ExitCode::FAILURE
        }
    }
}

fn pubkey(file: Option<&std::path::Path>) -> ExitCode {
    let (text, from) = match file.filter(|f| f.as_os_str() != "-") {
        Some(f) => match soya_config::read_private_key_file(f) {
            Ok(k) => (Ok(k), f.display().to_string()),
            Err(e) => {
                eprintln!("soya pubkey: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => {
            let mut t = String::new();
            let read = {
                use std::io::Read;
                std::io::stdin().take(1024).read_to_string(&mut t)
            };
            if let Err(e) = read {
                eprintln!("soya pubkey: cannot read stdin: {e}");
                return ExitCode::FAILURE;
            }
            (soya_config::decode_key_base64(&t), "stdin".to_string())
        }
    };
    match text {
        Ok(k) => {
            println!(
                "{}",
                soya_config::encode_key_base64(&soya::wan::public_key(&k))
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("soya pubkey: the private key on {from} {e}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(files: &[PathBuf], quiet: bool) -> ExitCode {
    let mut failed = 0;
    let mut out = std::io::stdout().lock();
    for f in files {
        match soya_config::load(f) {
            Ok(cfg) => {
                // A closed pipe (`| head`) ends the listing quietly.
                if !quiet && writeln!(out, "{}: OK\n{}", f.display(), cfg.explain()).is_err() {
                    return ExitCode::SUCCESS;
                }
            }
            Err(e) => {
                eprintln!("{e}");
                failed += 1;
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("{failed} of {} file(s) invalid", files.len());
        ExitCode::FAILURE
    }
}
