//! The `soya-wanem` command line.
//!
//! ```text
//! soya-wanem udp --listen ADDR --forward ADDR [--listen .. --forward ..]
//!                [PROFILE FLAGS] [--a2b-FLAG ..] [--b2a-FLAG ..] [--config wan.toml]
//!                [--stats-interval S] [--duration S] [--json] [--seed N]
//! soya-wanem tun --a-dev wanA --b-dev wanB [--tap] [PROFILE FLAGS] ...
//! soya-wanem selftest [--json] [--packets N] [--seconds S] [--size BYTES]
//!
//! PROFILE FLAGS: --distance-km KM | --delay-ms MS, --jitter-us US, --loss P,
//!   --ge P_ENTER,P_LEAVE,LOSS_BAD, --reorder P --reorder-delay-us US,
//!   --duplicate P, --rate 10gbit, --queue 4MiB, --down-at S --up-at S
//! ```
//!
//! Exit status: 0 done, 1 runtime failure (e.g. address in use), 2 bad
//! arguments or configuration (the message names the flag or key).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Arg, ArgAction, ArgMatches, Command};
use serde::Serialize;

use super::config::{self, CliInput, FileConfig, RunConfig};
use super::engine::{Emulator, Snapshot};
use super::profile::{ProfileSpec, Quantity};
use super::stats::DirStats;
use super::{selftest, tun, udp};
use soya_io::sys;

/// (flag without prefix, value name, help).
const PROFILE_FLAGS: &[(&str, &str, &str)] = &[
    ("distance-km", "KM", "One-way delay as fibre length, 4.9 µs per km (or --delay-ms)"),
    ("delay-ms", "MS", "One-way delay in milliseconds (or --distance-km)"),
    ("jitter-us", "US", "Uniform extra delay in [0, US) µs; FIFO order is kept"),
    ("loss", "P", "Random loss probability, 0 to 1"),
    ("ge", "P_ENTER,P_LEAVE,LOSS_BAD", "Gilbert-Elliott burst loss: per-packet probabilities of entering and leaving the bad state, loss probability while bad"),
    ("reorder", "P", "Probability a packet is held back by --reorder-delay-us (later packets overtake it)"),
    ("reorder-delay-us", "US", "How long a reordered packet is held back"),
    ("duplicate", "P", "Duplication probability"),
    ("rate", "RATE", "Bottleneck rate, e.g. 10gbit, 800mbit (default: unlimited)"),
    ("queue", "SIZE", "Bottleneck queue bound, e.g. 4MiB (default 4MiB when --rate is set); tail drop beyond"),
    ("down-at", "S", "The link goes down S seconds after start (repeatable; pairs with --up-at)"),
    ("up-at", "S", "The link comes back up S seconds after start"),
];

const TUN_RECIPE: &str = "\
Both devices are created by soya-wanem and vanish when it exits. Example, two sites in namespaces:
  soya-wanem tun --a-dev wanA --b-dev wanB --distance-km 300 &
  ip netns add siteA; ip netns add siteB
  ip link set wanA netns siteA; ip link set wanB netns siteB
  ip -n siteA addr add 10.201.0.1/24 dev wanA; ip -n siteA link set wanA up
  ip -n siteB addr add 10.201.0.2/24 dev wanB; ip -n siteB link set wanB up
With --tap the devices are Ethernet (ARP crosses too), e.g. for Soft-RoCE:
  ip netns exec siteA rdma link add rxeA type rxe netdev wanA";

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn profile_args(prefix: &'static str, heading: &'static str, dir: &str) -> Vec<Arg> {
    PROFILE_FLAGS
        .iter()
        .map(|&(flag, value, help)| {
            let id = leak(format!("{prefix}{flag}"));
            let mut a = Arg::new(id)
                .long(id)
                .value_name(value)
                .allow_negative_numbers(true)
                .help_heading(heading);
            a = if prefix.is_empty() {
                a.help(help)
            } else {
                a.help(leak(format!("{dir} only: like --{flag}")))
                    .hide_short_help(true)
            };
            if flag.ends_with("-at") {
                a = a.action(ArgAction::Append);
            }
            a
        })
        .collect()
}

fn run_args() -> Vec<Arg> {
    vec![
        Arg::new("config")
            .long("config")
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .help("TOML file: paths, [profile], [a_to_b], [b_to_a] (flags override it)"),
        Arg::new("seed")
            .long("seed")
            .value_name("N")
            .help("Seed of the impairment randomness (default 1)"),
        Arg::new("stats-interval")
            .long("stats-interval")
            .value_name("S")
            .help("Seconds between stats lines on stderr (default 1; 0 = none)"),
        Arg::new("duration")
            .long("duration")
            .value_name("S")
            .help("Stop after S seconds (default: at SIGINT/SIGTERM)"),
        Arg::new("json")
            .long("json")
            .action(ArgAction::SetTrue)
            .help("Print the exit summary as one JSON object on stdout"),
        Arg::new("max-held").long("max-held").value_name("N").help(
            "Hard cap on packets held per direction (default 32768); beyond: dropped as overflow",
        ),
        Arg::new("max-datagram")
            .long("max-datagram")
            .value_name("BYTES")
            .help("Largest packet forwarded (default 9216); longer: dropped as oversize"),
        Arg::new("no-realtime")
            .long("no-realtime")
            .action(ArgAction::SetTrue)
            .help("Keep the engine threads on CFS (by default they run SCHED_FIFO while they keep up, if permitted, so other load cannot delay releases)"),
        Arg::new("no-offload")
            .long("no-offload")
            .action(ArgAction::SetTrue)
            .help(
                "UDP: no GRO on receive and no GSO on send; TUN: no virtio-net headers (no UDP segmentation offload read or written). Datagrams are kept whole and impaired one by one either way",
            ),
        Arg::new("one-thread")
            .long("one-thread")
            .action(ArgAction::SetTrue)
            .help(
                "TUN with --slack-us: one thread serves both directions of a path (fewer wake-ups, about 1.5x less CPU per Gb/s); a packet arriving while the thread sleeps out its slack is stamped late, so the RTT grows by up to twice the slack",
            ),
        Arg::new("spin-us")
            .long("spin-us")
            .value_name("US")
            .help("Busy-wait the last US µs before a release (default 50); 0 = sleep only"),
        Arg::new("slack-us")
            .long("slack-us")
            .value_name("US")
            .help(
                "Let a packet leave up to US µs early when others are leaving, and wake at most \
                 about once per US µs (default 0: each on time, a wake-up per packet). Behind a \
                 rate, packets are due a few µs apart and would each cost a send and a wake-up; \
                 with slack they leave in batches, as after a NIC's interrupt coalescing",
            ),
    ]
}

fn with_profile_and_run(c: Command) -> Command {
    c.args(run_args())
        .args(profile_args("", "Impairments (both directions)", ""))
        .args(profile_args(
            "a2b-",
            "A→B overrides (--help lists them)",
            "A→B",
        ))
        .args(profile_args(
            "b2a-",
            "B→A overrides (--help lists them)",
            "B→A",
        ))
}

pub fn command() -> Command {
    Command::new("soya-wanem")
        .about("WAN emulator in user space: delay, jitter, loss, burst loss, reordering, duplication, a rate-limited bounded queue and outages, per path and direction")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(with_profile_and_run(
            Command::new("udp")
                .about("Relay UDP: datagrams to --listen go (impaired) to --forward; replies go back to the latest client")
                .arg(
                    Arg::new("listen")
                        .long("listen")
                        .value_name("ADDR")
                        .action(ArgAction::Append)
                        .help("Address clients send to (repeat for more paths, each with its --forward)"),
                )
                .arg(
                    Arg::new("forward")
                        .long("forward")
                        .value_name("ADDR")
                        .action(ArgAction::Append)
                        .help("Where the path's datagrams go"),
                ),
        ))
        .subcommand(with_profile_and_run(
            Command::new("tun")
                .about("Forward IP packets between two TUN devices (Ethernet frames between TAP devices with --tap)")
                .after_help(TUN_RECIPE)
                .arg(Arg::new("a-dev").long("a-dev").value_name("NAME").required(true).help("Device of side A (created)"))
                .arg(Arg::new("b-dev").long("b-dev").value_name("NAME").required(true).help("Device of side B (created)"))
                .arg(Arg::new("tap").long("tap").action(ArgAction::SetTrue).help("TAP (Ethernet) devices, e.g. for Soft-RoCE")),
        ))
        .subcommand(
            Command::new("selftest")
                .about("Measure delay accuracy, loss accuracy and capacity on loopback, and print them")
                .arg(Arg::new("json").long("json").action(ArgAction::SetTrue).help("One JSON object on stdout"))
                .arg(Arg::new("packets").long("packets").value_name("N").help("Probe packets for the delay and loss measurements (default 10000)"))
                .arg(Arg::new("seconds").long("seconds").value_name("S").help("Length of each capacity run (default 2)"))
                .arg(Arg::new("size").long("size").value_name("BYTES").help("Datagram size of the capacity runs (default 4096)"))
                .arg(Arg::new("only").long("only").value_name("WHAT").action(ArgAction::Append).value_parser(["delay", "loss", "capacity"]).help("Run only this measurement (repeatable)"))
                .arg(Arg::new("no-compare").long("no-compare").action(ArgAction::SetTrue).help("Skip the second delay measurement, with the engine kept on CFS")),
        )
}

fn num<T: std::str::FromStr>(m: &ArgMatches, id: &str) -> Result<Option<T>, String> {
    match m.get_one::<String>(id) {
        None => Ok(None),
        Some(s) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("--{id}: \"{s}\" is not a valid number")),
    }
}

fn nums(m: &ArgMatches, id: &str) -> Result<Vec<f64>, String> {
    m.get_many::<String>(id)
        .into_iter()
        .flatten()
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| format!("--{id}: \"{s}\" is not a number of seconds"))
        })
        .collect()
}

fn read_profile(m: &ArgMatches, prefix: &str) -> Result<ProfileSpec, String> {
    let id = |f: &str| format!("{prefix}{f}");
    let text = |f: &str| m.get_one::<String>(&id(f)).cloned();
    let ge = match text("ge") {
        None => None,
        Some(s) => {
            let v: Vec<f64> = s
                .split(',')
                .map(|x| x.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .map_err(|_| {
                    format!(
                        "--{}: \"{s}\" is not P_ENTER,P_LEAVE,LOSS_BAD (three numbers)",
                        id("ge")
                    )
                })?;
            match v[..] {
                [a, b, c] => Some([a, b, c]),
                _ => {
                    return Err(format!(
                        "--{}: \"{s}\" is not P_ENTER,P_LEAVE,LOSS_BAD (three numbers)",
                        id("ge")
                    ))
                }
            }
        }
    };
    let downs = nums(m, &id("down-at"))?;
    let ups = nums(m, &id("up-at"))?;
    if downs.len() != ups.len() {
        return Err(format!(
            "--{}: given {} time(s) but --{} {} time(s): give them in pairs",
            id("down-at"),
            downs.len(),
            id("up-at"),
            ups.len()
        ));
    }
    Ok(ProfileSpec {
        distance_km: num(m, &id("distance-km"))?,
        delay_ms: num(m, &id("delay-ms"))?,
        jitter_us: num(m, &id("jitter-us"))?,
        loss: num(m, &id("loss"))?,
        ge,
        reorder: num(m, &id("reorder"))?,
        reorder_delay_us: num(m, &id("reorder-delay-us"))?,
        duplicate: num(m, &id("duplicate"))?,
        rate: text("rate").map(Quantity::Text),
        queue: text("queue").map(Quantity::Text),
        down: (!downs.is_empty())
            .then(|| downs.into_iter().zip(ups).map(|(a, b)| [a, b]).collect()),
    })
}

fn read_cli(m: &ArgMatches, udp: bool) -> Result<CliInput, String> {
    let list = |id: &str| -> Vec<String> {
        m.get_many::<String>(id)
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    };
    // A flag that is not given leaves the file's value: `--no-realtime`
    // can only turn realtime off.
    let off = |id: &str| m.get_flag(id).then_some(false);
    Ok(CliInput {
        config: m.get_one::<PathBuf>("config").cloned(),
        listen: if udp { list("listen") } else { Vec::new() },
        forward: if udp { list("forward") } else { Vec::new() },
        keys: FileConfig {
            seed: num(m, "seed")?,
            stats_interval: num(m, "stats-interval")?,
            duration: num(m, "duration")?,
            max_held: num(m, "max-held")?,
            max_datagram: num(m, "max-datagram")?,
            spin_us: num(m, "spin-us")?,
            slack_us: num(m, "slack-us")?,
            realtime: off("no-realtime"),
            offload: off("no-offload"),
            one_thread: m.get_flag("one-thread").then_some(true),
            profile: Some(read_profile(m, "")?),
            a_to_b: Some(read_profile(m, "a2b-")?),
            b_to_a: Some(read_profile(m, "b2a-")?),
            path: Vec::new(),
        },
        json: m.get_flag("json"),
    })
}

#[derive(Serialize)]
struct Summary<'a> {
    mode: &'a str,
    #[serde(flatten)]
    snapshot: &'a Snapshot,
}

fn print_lines(snap: &Snapshot, prev: &Snapshot, secs: f64) {
    let mut err = std::io::stderr().lock();
    for (p, q) in snap.paths.iter().zip(&prev.paths) {
        for (dir, s, o) in [
            ("a->b", &p.a_to_b, &q.a_to_b),
            ("b->a", &p.b_to_a, &q.b_to_a),
        ] {
            let _ = writeln!(
                err,
                "[{:8.1}s] {} {dir}: {}",
                snap.elapsed_s,
                p.name,
                s.line(o, secs)
            );
        }
    }
}

fn human_summary(mode: &str, snap: &Snapshot) -> String {
    let mut s = format!("soya-wanem {mode}: ran {:.1} s\n", snap.elapsed_s);
    let zero = DirStats::default();
    for p in &snap.paths {
        s += &format!("path {} ({} <-> {})\n", p.name, p.a, p.b);
        for (dir, st, prof) in [
            ("a->b", &p.a_to_b, &p.a_to_b_profile),
            ("b->a", &p.b_to_a, &p.b_to_a_profile),
        ] {
            s += &format!(
                "  {dir} [{prof}]\n    received {} ({} B), {}, held at most {}\n",
                st.received,
                st.received_bytes,
                st.line(&zero, snap.elapsed_s.max(1e-9)),
                st.held_max
            );
        }
    }
    s
}

/// Serves until SIGINT/SIGTERM or the duration; prints stats and a summary.
fn serve(mode: &str, emu: Emulator, run: &RunConfig) -> i32 {
    sys::install_stop_signals();
    {
        let snap = emu.snapshot();
        let mut err = std::io::stderr().lock();
        for p in &snap.paths {
            let _ = writeln!(
                err,
                "soya-wanem {mode}: path {}: {} <-> {}",
                p.name, p.a, p.b
            );
            let _ = writeln!(err, "  a->b: {}", p.a_to_b_profile);
            let _ = writeln!(err, "  b->a: {}", p.b_to_a_profile);
        }
    }
    let start = Instant::now();
    let mut prev = emu.snapshot();
    let mut last = start;
    loop {
        std::thread::sleep(Duration::from_millis(5));
        let now = Instant::now();
        if sys::stop_requested() || run.duration.is_some_and(|d| now - start >= d) {
            break;
        }
        if let Some(iv) = run.stats_interval {
            if now - last >= iv {
                let snap = emu.snapshot();
                print_lines(&snap, &prev, (now - last).as_secs_f64());
                prev = snap;
                last = now;
            }
        }
    }
    let snap = emu.stop();
    if run.json {
        let s = Summary {
            mode,
            snapshot: &snap,
        };
        println!("{}", serde_json::to_string(&s).unwrap());
    } else {
        print!("{}", human_summary(mode, &snap));
    }
    0
}

fn usage_error(msg: &str) -> i32 {
    eprintln!("soya-wanem: error: {msg}");
    2
}

/// Runs the command line; returns the exit status.
pub fn main_with_args(args: Vec<String>) -> i32 {
    let m = match command().try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match m.subcommand() {
        Some(("udp", m)) => {
            let run = match read_cli(m, true).and_then(|c| config::build_udp(&c)) {
                Ok(r) => r,
                Err(e) => return usage_error(&e),
            };
            match udp::start(run.paths.clone(), &run.engine) {
                Ok(emu) => serve("udp", emu, &run),
                Err(e) => {
                    eprintln!("soya-wanem: {e}");
                    1
                }
            }
        }
        Some(("tun", m)) => {
            let (a2b, b2a, run) = match read_cli(m, false).and_then(|c| config::build_tun(&c)) {
                Ok(r) => r,
                Err(e) => return usage_error(&e),
            };
            let a = m.get_one::<String>("a-dev").unwrap();
            let b = m.get_one::<String>("b-dev").unwrap();
            match tun::start(a, b, m.get_flag("tap"), a2b, b2a, &run.engine) {
                Ok(emu) => serve(if m.get_flag("tap") { "tap" } else { "tun" }, emu, &run),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                    usage_error(&e.to_string())
                }
                Err(e) => {
                    eprintln!("soya-wanem: {e}");
                    1
                }
            }
        }
        Some(("selftest", m)) => {
            let opts = (|| -> Result<selftest::Options, String> {
                let mut o = selftest::Options::default();
                if let Some(n) = num::<usize>(m, "packets")? {
                    if n == 0 {
                        return Err("--packets: must be at least 1".into());
                    }
                    o.packets = n;
                }
                if let Some(s) = num::<f64>(m, "seconds")? {
                    if !(s > 0.0 && s <= 3600.0) {
                        return Err(format!("--seconds: must be between 0 and 3600, got {s}"));
                    }
                    o.capacity_time = Duration::from_secs_f64(s);
                }
                if let Some(b) = num::<usize>(m, "size")? {
                    if !(16..=9000).contains(&b) {
                        return Err(format!("--size: must be 16 to 9000 bytes, got {b}"));
                    }
                    o.size = b;
                }
                o.compare_cfs = !m.get_flag("no-compare");
                o.only = m
                    .get_many::<String>("only")
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                Ok(o)
            })();
            let opts = match opts {
                Ok(o) => o,
                Err(e) => return usage_error(&e),
            };
            match selftest::run(&opts) {
                Ok(report) => {
                    if m.get_flag("json") {
                        println!("{}", serde_json::to_string(&report).unwrap());
                    } else {
                        print!("{}", report.human());
                    }
                    0
                }
                Err(e) => {
                    eprintln!("soya-wanem selftest: {e}");
                    1
                }
            }
        }
        _ => usage_error("unknown subcommand"),
    }
}
