//! A run's configuration: a TOML file and command-line flags, layered.
//!
//! ```toml
//! seed = 7                # optional, everything below too
//! stats_interval = 1.0    # seconds; 0 = no stats lines
//! duration = 60           # seconds; absent = until SIGINT/SIGTERM
//! max_held = 32768        # packets held per direction, hard cap
//! max_datagram = 9216     # bytes; longer datagrams are dropped
//! realtime = true         # SCHED_FIFO engine threads while they keep up
//! offload = true          # UDP: GRO in, GSO out; TUN: UDP GSO read and written (vnet headers)
//! one_thread = false      # TUN with slack: one thread for both directions (fewer wake-ups, RTT + up to 2 x slack)
//!
//! [profile]               # every path, both directions
//! distance_km = 300       # or delay_ms = 3
//! loss = 0.0001
//!
//! [a_to_b]                # every path, one direction
//! rate = "10gbit"
//! queue = "4MiB"
//!
//! [[path]]
//! name = "main"
//! listen = "127.0.0.1:7400"
//! forward = "127.0.0.2:7400"
//! [path.b_to_a]           # this path, one direction ([path.profile]: both)
//! ge = [0.001, 0.3, 0.5]  # p_enter_bad, p_leave_bad, loss_in_bad
//! down = [[10, 12.5]]     # seconds since start: link down, then up
//! ```
//!
//! Profile keys: `distance_km`, `delay_ms`, `jitter_us`, `loss`, `ge`,
//! `reorder`, `reorder_delay_us`, `duplicate`, `rate`, `queue`, `down`;
//! the same as CLI flags in kebab case (`--down-at`/`--up-at` for `down`).
//!
//! Layers, later wins, field by field: `[profile]`, `[a_to_b]`/`[b_to_a]`,
//! `[path.profile]`, `[path.a_to_b]`/`[path.b_to_a]`, CLI flags, CLI
//! `--a2b-*`/`--b2a-*` flags. The delay is one field however it is
//! written (`distance_km` or `delay_ms`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::engine::EngineOptions;
use super::profile::ProfileSpec;
use super::udp::PathSpec;
use crate::sim::link::LinkProfile;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub seed: Option<u64>,
    pub stats_interval: Option<f64>,
    pub duration: Option<f64>,
    pub max_held: Option<usize>,
    pub max_datagram: Option<usize>,
    pub spin_us: Option<f64>,
    pub slack_us: Option<f64>,
    pub realtime: Option<bool>,
    pub offload: Option<bool>,
    pub one_thread: Option<bool>,
    pub profile: Option<ProfileSpec>,
    pub a_to_b: Option<ProfileSpec>,
    pub b_to_a: Option<ProfileSpec>,
    #[serde(default)]
    pub path: Vec<FilePath>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilePath {
    pub name: Option<String>,
    pub listen: String,
    pub forward: String,
    pub profile: Option<ProfileSpec>,
    pub a_to_b: Option<ProfileSpec>,
    pub b_to_a: Option<ProfileSpec>,
}

/// What came from the command line, before layering.
#[derive(Debug, Default)]
pub struct CliInput {
    pub config: Option<PathBuf>,
    pub listen: Vec<String>,
    pub forward: Vec<String>,
    /// The file's keys given as flags (`--seed`, `--loss`, `--a2b-rate`;
    /// `--no-realtime` is `realtime = false`): the last layer, winning over
    /// the file's key by key. Its `path` stays empty: the command line's
    /// paths are `listen`/`forward`.
    pub keys: FileConfig,
    pub json: bool,
}

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub paths: Vec<PathSpec>,
    pub engine: EngineOptions,
    /// `None`: no periodic stats lines.
    pub stats_interval: Option<Duration>,
    /// `None`: until a signal.
    pub duration: Option<Duration>,
    pub json: bool,
}

/// The CLI's name for a profile key: `--a2b-loss`, `--down-at/--up-at`.
pub fn flag_name(prefix: &str, key: &str) -> String {
    if key == "down" {
        format!("--{prefix}down-at/--{prefix}up-at")
    } else {
        format!("--{prefix}{}", key.replace('_', "-"))
    }
}

fn load(path: &PathBuf) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--config {}: cannot read: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("--config {}: {e}", path.display()))
}

fn seconds(v: Option<f64>, name: &str) -> Result<Option<Duration>, String> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && (0.0..=1e9).contains(&s) => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        Some(s) => Err(format!("{name}: must be a number of seconds >= 0, got {s}")),
    }
}

pub fn parse_addr(s: &str, name: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    s.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("{name}: \"{s}\" is not an address like 127.0.0.1:7400"))
}

/// Profile layers of one direction, in order.
struct Layers<'a> {
    file: &'a FileConfig,
    fname: String,
    cli: &'a CliInput,
}

impl Layers<'_> {
    fn validate_file(&self) -> Result<(), String> {
        let f = self.file;
        let check = |spec: &Option<ProfileSpec>, section: &str| -> Result<(), String> {
            match spec {
                Some(s) => s.validate(&|k: &str| format!("--config {}: {section}.{k}", self.fname)),
                None => Ok(()),
            }
        };
        check(&f.profile, "profile")?;
        check(&f.a_to_b, "a_to_b")?;
        check(&f.b_to_a, "b_to_a")?;
        for (i, p) in f.path.iter().enumerate() {
            check(&p.profile, &format!("path[{i}].profile"))?;
            check(&p.a_to_b, &format!("path[{i}].a_to_b"))?;
            check(&p.b_to_a, &format!("path[{i}].b_to_a"))?;
        }
        Ok(())
    }

    fn validate_cli(&self) -> Result<(), String> {
        let c = &self.cli.keys;
        for (spec, prefix) in [(&c.profile, ""), (&c.a_to_b, "a2b-"), (&c.b_to_a, "b2a-")] {
            if let Some(s) = spec {
                s.validate(&|k: &str| flag_name(prefix, k))?;
            }
        }
        Ok(())
    }

    /// The merged profile of one direction (`a_to_b`: true for A→B).
    fn profile(&self, path: Option<&FilePath>, a_to_b: bool) -> LinkProfile {
        let f = self.file;
        let mut spec = ProfileSpec::default();
        let dir = |a: &Option<ProfileSpec>, b: &Option<ProfileSpec>| {
            if a_to_b {
                a.clone()
            } else {
                b.clone()
            }
        };
        let mut layers = vec![f.profile.clone(), dir(&f.a_to_b, &f.b_to_a)];
        if let Some(p) = path {
            layers.push(p.profile.clone());
            layers.push(dir(&p.a_to_b, &p.b_to_a));
        }
        let c = &self.cli.keys;
        layers.push(c.profile.clone());
        layers.push(dir(&c.a_to_b, &c.b_to_a));
        for l in layers.iter().flatten() {
            spec.overlay(l);
        }
        spec.to_link()
    }
}

fn engine_options(file: &FileConfig, cli: &FileConfig) -> Result<EngineOptions, String> {
    let mut e = EngineOptions::default();
    if let Some(s) = cli.seed.or(file.seed) {
        e.seed = s;
    }
    if let Some(m) = cli.max_held.or(file.max_held) {
        if m == 0 {
            return Err("--max-held: must be at least 1".into());
        }
        e.max_held = m;
    }
    if let Some(m) = cli.max_datagram.or(file.max_datagram) {
        if !(1..=65_535).contains(&m) {
            return Err(format!("--max-datagram: must be 1 to 65535 bytes, got {m}"));
        }
        e.max_datagram = m;
    }
    e.realtime = cli.realtime.or(file.realtime).unwrap_or(true);
    e.offload = cli.offload.or(file.offload).unwrap_or(true);
    e.one_thread = cli.one_thread.or(file.one_thread).unwrap_or(false);
    if let Some(s) = seconds(cli.spin_us.or(file.spin_us).map(|us| us / 1e6), "--spin-us")? {
        e.spin = s;
    }
    if let Some(s) = seconds(
        cli.slack_us.or(file.slack_us).map(|us| us / 1e6),
        "--slack-us",
    )? {
        e.slack = s;
    }
    Ok(e)
}

/// Shared part of both modes: file, engine options, timing.
/// What both modes start from: the file (and its name) and the run's
/// settings, its paths aside.
struct Common {
    file: FileConfig,
    fname: String,
    run: RunConfig,
}

impl Common {
    /// The file's and the command line's profile layers, each validated.
    fn layers<'a>(&'a self, cli: &'a CliInput) -> Result<Layers<'a>, String> {
        let layers = Layers {
            file: &self.file,
            fname: self.fname.clone(),
            cli,
        };
        layers.validate_file()?;
        layers.validate_cli()?;
        Ok(layers)
    }
}

fn common(cli: &CliInput) -> Result<Common, String> {
    let (file, fname) = match &cli.config {
        Some(p) => (load(p)?, p.display().to_string()),
        None => (FileConfig::default(), String::new()),
    };
    let keys = &cli.keys;
    let engine = engine_options(&file, keys)?;
    let stats_interval = seconds(
        keys.stats_interval.or(file.stats_interval),
        "--stats-interval",
    )?
    .or(Some(Duration::from_secs(1)))
    .filter(|d| !d.is_zero());
    let duration = seconds(keys.duration.or(file.duration), "--duration")?;
    Ok(Common {
        file,
        fname,
        run: RunConfig {
            paths: Vec::new(),
            engine,
            stats_interval,
            duration,
            json: cli.json,
        },
    })
}

/// UDP relay mode.
pub fn build_udp(cli: &CliInput) -> Result<RunConfig, String> {
    let c = common(cli)?;
    let file = &c.file;
    let layers = c.layers(cli)?;
    if cli.listen.len() != cli.forward.len() {
        return Err(format!(
            "--listen given {} time(s) but --forward {} time(s): give them in pairs, one pair per path",
            cli.listen.len(),
            cli.forward.len()
        ));
    }
    let mut paths = Vec::new();
    if !cli.listen.is_empty() && !file.path.is_empty() {
        return Err(format!(
            "--listen/--forward and [[path]] in --config {} both define paths: use one or the other",
            layers.fname
        ));
    }
    for (i, (l, f)) in cli.listen.iter().zip(&cli.forward).enumerate() {
        paths.push(PathSpec {
            name: if cli.listen.len() == 1 {
                "main".into()
            } else {
                format!("path{i}")
            },
            listen: parse_addr(l, "--listen")?,
            forward: parse_addr(f, "--forward")?,
            a_to_b: layers.profile(None, true),
            b_to_a: layers.profile(None, false),
        });
    }
    for (i, p) in file.path.iter().enumerate() {
        let at = |k: &str| format!("--config {}: path[{i}].{k}", layers.fname);
        paths.push(PathSpec {
            name: p.name.clone().unwrap_or_else(|| format!("path{i}")),
            listen: parse_addr(&p.listen, &at("listen"))?,
            forward: parse_addr(&p.forward, &at("forward"))?,
            a_to_b: layers.profile(Some(p), true),
            b_to_a: layers.profile(Some(p), false),
        });
    }
    if paths.is_empty() {
        return Err("no path: give --listen ADDR --forward ADDR (or [[path]] in --config)".into());
    }
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].iter().any(|q| q.listen == p.listen) {
            return Err(format!("--listen: {} is used by two paths", p.listen));
        }
    }
    Ok(RunConfig { paths, ..c.run })
}

/// TUN/TAP mode: the two directions' profiles (paths are ignored).
pub fn build_tun(cli: &CliInput) -> Result<(LinkProfile, LinkProfile, RunConfig), String> {
    let c = common(cli)?;
    let layers = c.layers(cli)?;
    if !c.file.path.is_empty() {
        return Err(format!(
            "--config {}: [[path]] is for udp mode; tun mode uses [profile], [a_to_b] and [b_to_a]",
            layers.fname
        ));
    }
    let (a_to_b, b_to_a) = (layers.profile(None, true), layers.profile(None, false));
    Ok((a_to_b, b_to_a, c.run))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_comes_from_the_command_line_or_the_file_and_is_checked() {
        let file = FileConfig::default();
        let mut cli = FileConfig::default();
        assert_eq!(engine_options(&file, &cli).unwrap().slack, Duration::ZERO);
        cli.slack_us = Some(100.0);
        assert_eq!(
            engine_options(&file, &cli).unwrap().slack,
            Duration::from_micros(100)
        );
        let file = FileConfig {
            slack_us: Some(20.0),
            ..FileConfig::default()
        };
        cli.slack_us = None;
        assert_eq!(
            engine_options(&file, &cli).unwrap().slack,
            Duration::from_micros(20)
        );
        cli.slack_us = Some(-1.0);
        let e = engine_options(&file, &cli).unwrap_err();
        assert!(e.contains("--slack-us"), "{e}");
    }

    #[test]
    fn the_command_line_layer_wins_key_by_key() {
        // Top-level keys: a flag given wins, one not given leaves the file's.
        let file = FileConfig {
            seed: Some(1),
            max_held: Some(5),
            realtime: Some(true),
            offload: Some(false),
            ..FileConfig::default()
        };
        let flags = FileConfig {
            seed: Some(2),
            realtime: Some(false), // --no-realtime
            ..FileConfig::default()
        };
        let e = engine_options(&file, &flags).unwrap();
        assert_eq!((e.seed, e.max_held), (2, 5));
        assert!(!e.realtime && !e.offload);
        let e = engine_options(&FileConfig::default(), &FileConfig::default()).unwrap();
        assert!(e.realtime && e.offload, "both on unless turned off");

        // Profiles: the flags' [profile] and [a_to_b] over the file's.
        let spec = |delay_ms, loss| {
            Some(ProfileSpec {
                delay_ms,
                loss,
                ..ProfileSpec::default()
            })
        };
        let file = FileConfig {
            profile: spec(Some(1.0), Some(0.1)),
            ..FileConfig::default()
        };
        let cli = CliInput {
            keys: FileConfig {
                profile: spec(Some(3.0), None),
                a_to_b: spec(None, Some(0.2)),
                ..FileConfig::default()
            },
            ..CliInput::default()
        };
        let layers = Layers {
            file: &file,
            fname: String::new(),
            cli: &cli,
        };
        let (a2b, b2a) = (layers.profile(None, true), layers.profile(None, false));
        assert_eq!((a2b.delay, a2b.loss), (Duration::from_millis(3), 0.2));
        assert_eq!((b2a.delay, b2a.loss), (Duration::from_millis(3), 0.1));
    }
}
