//! `soya-config`: the configuration of one Sōya site gateway.
//!
//! A Sōya deployment is two gateways — e.g. Sapporo and Wakkanai — each with
//! one TOML file describing its data-center side (`[dc]`), the WAN paths to
//! its twin (`[wan]`), the deep buffer (`[buffer]`), pseudo-ACK behaviour
//! (`[pseudo_ack]`), operator interfaces (`[control]`) and logging (`[log]`).
//! See `config/examples/*.toml` for fully commented files.
//!
//! ```no_run
//! let cfg = soya_config::load(std::path::Path::new("/etc/soya/sapporo.toml"))?;
//! println!("{}", cfg.explain());
//! # Ok::<(), soya_config::ConfigError>(())
//! ```
//!
//! Pipeline: TOML text → `schema` (serde, every key optional, unknown keys
//! rejected) → `validate` (defaults, units, ranges, cross-checks; collects
//! every problem) → [`SiteConfig`]. Problems carry key paths; `locate` maps
//! them to line:col so every [`ConfigError`] reads like
//! `sapporo.toml:14:8: wan.paths[1].dscp = 70: DSCP must be an integer 0..=63`.

#![deny(unsafe_code)]

mod buffer;
mod check;
pub mod error;
mod explain;
mod keyfile;
mod locate;
mod model;
pub mod prefix;
mod schema;
pub mod units;
mod validate;

use std::path::Path;

pub use buffer::{
    auto_size_of, slot_mtu, window_slots, AutoSize, DEFAULT_REQUESTERS, DEFAULT_REQUESTER_WINDOW,
    DEFAULT_SAFETY_FACTOR, DEFAULT_SLOT_BYTES, MAX_BYTES as MAX_BUFFER_BYTES, MAX_REQUESTERS,
    MAX_REQUESTER_WINDOW,
};
pub use error::{ConfigError, Diagnostic, Location};
pub use keyfile::{
    decode_key, decode_key_base64, encode_key_base64, read_key_file, read_private_key_file,
    MIN_KEY_BYTES,
};
pub use model::*;
pub use prefix::Prefix;
pub use validate::{DEFAULT_TUN, DEFAULT_WAN_PORT, MAX_PATHS};

use check::Problem;
use locate::SpanIndex;

/// Reads, parses and validates a site config file, then checks the WAN key
/// file (exists, not world-readable, ≥ 32 bytes of key material) and keeps
/// a digest of each key read ([`KeyDigests`]). A relative
/// `wan.key_file` is resolved against the config file's directory and stored
/// resolved in the result.
pub fn load(path: &Path) -> Result<SiteConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let origin = path.display().to_string();
    let mut cfg = parse_str(&text, &origin)?;
    if let Some(id) = &mut cfg.wan.identity {
        if id.private_key_file.is_relative() {
            let dir = path.parent().unwrap_or(Path::new(""));
            id.private_key_file = dir.join(&id.private_key_file);
        }
        match read_private_key_file(&id.private_key_file) {
            Ok(k) => cfg.wan.key_digests.private_key = Some(KeyDigests::of("private key", &k)),
            Err(e) => return Err(key_file_error(&text, &origin, "wan.private_key_file", e)),
        }
    }
    if let WanSecurity::PreSharedKey { key_file } = &mut cfg.wan.security {
        if key_file.is_relative() {
            let dir = path.parent().unwrap_or(Path::new(""));
            *key_file = dir.join(&*key_file);
        }
        match read_key_file(key_file) {
            // The 32 bytes the gateway uses (`gateway::wan_key`).
            Ok(k) => cfg.wan.key_digests.psk = Some(KeyDigests::of("psk", &k[..32.min(k.len())])),
            Err(e) => return Err(key_file_error(&text, &origin, "wan.key_file", e)),
        }
    }
    Ok(cfg)
}

/// Parses and validates config text without touching the filesystem (the key
/// file is not checked). `origin` is the file name used in messages.
/// Never panics, whatever the input.
pub fn parse_str(text: &str, origin: &str) -> Result<SiteConfig, ConfigError> {
    let index = SpanIndex::build(text);
    let raw: schema::RawConfig = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            return Err(ConfigError::Invalid(vec![from_toml_error(
                text,
                origin,
                index.as_ref(),
                &e,
            )]))
        }
    };
    let defaulted = explain::defaulted_keys(&raw);
    match validate::resolve(raw, origin) {
        Ok(mut cfg) => {
            cfg.defaulted = defaulted;
            Ok(cfg)
        }
        Err(problems) => Err(located(text, origin, index.as_ref(), problems)),
    }
}

/// The source text of a span, shortened to one readable line.
fn snippet(text: &str, span: &std::ops::Range<usize>) -> Option<String> {
    let s = text.get(span.clone())?.trim();
    let first_line = s.lines().next().unwrap_or("");
    if first_line.chars().count() > 60 || first_line.len() != s.len() {
        let short: String = first_line.chars().take(57).collect();
        Some(format!("{short}…"))
    } else {
        Some(s.to_string())
    }
}

/// Turns validation problems into located diagnostics, first in file first.
fn located(
    text: &str,
    origin: &str,
    index: Option<&SpanIndex>,
    problems: Vec<Problem>,
) -> ConfigError {
    let mut out: Vec<(usize, Diagnostic)> = problems
        .into_iter()
        .map(|p| {
            let found = index.and_then(|i| i.nearest(&p.path));
            let (offset, value) = match found {
                Some((entry, exact)) => {
                    let span = entry.value_span.as_ref().or(entry.key_span.as_ref());
                    let value = match (exact && !entry.is_table, &entry.value_span) {
                        (true, Some(v)) => snippet(text, v),
                        _ => None,
                    };
                    (span.map(|s| s.start), value)
                }
                None => (None, None),
            };
            let diagnostic = Diagnostic {
                origin: origin.to_string(),
                location: offset.map(|o| Location::from_offset(text, o)),
                key: Some(p.path),
                value,
                message: p.message,
            };
            (offset.unwrap_or(usize::MAX), diagnostic)
        })
        .collect();
    out.sort_by_key(|(offset, _)| *offset); // stable: same spot keeps rule order
    if out.is_empty() {
        // Defensive: resolve() never fails without a problem, but an empty
        // error would be useless to an operator.
        out.push((
            0,
            Diagnostic {
                origin: origin.to_string(),
                location: None,
                key: None,
                value: None,
                message: "invalid configuration".into(),
            },
        ));
    }
    ConfigError::Invalid(out.into_iter().map(|(_, d)| d).collect())
}

/// A syntax, type or unknown-key error from toml/serde, with the key path
/// recovered from its byte span and serde's Rust type names ("expected i64",
/// "expected struct RawDc") replaced by what the key accepts.
fn from_toml_error(
    text: &str,
    origin: &str,
    index: Option<&SpanIndex>,
    e: &toml::de::Error,
) -> Diagnostic {
    let span = e.span();
    let hit = span
        .as_ref()
        .and_then(|s| index.and_then(|i| i.path_at(s.start)));
    let mut message = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let (key, value) = match hit {
        Some((entry, on_key)) => {
            // serde sees a datetime as a map; say what the user wrote.
            if !entry.is_table {
                message = message.replace("invalid type: map", "invalid type: datetime");
            }
            if let Some(accepted) = schema::accepted(&entry.path) {
                match message.find(", expected ") {
                    Some(cut) if message.starts_with("invalid type") => {
                        message = format!("{}, expected {accepted}", &message[..cut]);
                    }
                    None if !message.contains("expected") => {
                        message = format!("{message}; expected {accepted}");
                    }
                    _ => {}
                }
            }
            let value = match (&entry.value_span, on_key || entry.is_table) {
                (Some(v), false) => snippet(text, v),
                _ => None,
            };
            (Some(entry.path.clone()), value)
        }
        None => (None, None),
    };
    Diagnostic {
        origin: origin.to_string(),
        location: span.map(|s| Location::from_offset(text, s.start)),
        key,
        value,
        message,
    }
}

/// A key file that cannot be used, reported at the config key naming it
/// (`key`), with the line of the file where it stands.
fn key_file_error(text: &str, origin: &str, key: &str, e: ConfigError) -> ConfigError {
    let reason = match e {
        ConfigError::KeyFile { reason, .. } => reason,
        other => other.to_string(),
    };
    let problem = Problem {
        path: key.into(),
        message: reason,
    };
    located(text, origin, SpanIndex::build(text).as_ref(), vec![problem])
}
