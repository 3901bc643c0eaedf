//! Raw TOML → resolved [`SiteConfig`]: defaults, unit parsing, range and
//! cross-field checks.
//!
//! Problems are collected (not returned at the first one) so an operator
//! fixes a whole file in one round. Each problem names the key path it is
//! about; [`crate::parse_str`] turns paths into line:col via the span index.
//! A problem about a *missing* key names the key that should be added — the
//! locator then points at the enclosing table.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use crate::buffer;
use crate::check::{Checker, Problem};
use crate::model::*;
use crate::prefix::Prefix;
use crate::schema::*;
use crate::units;

/// Most WAN paths one gateway supports (path ids are 4 bits on the wire).
pub const MAX_PATHS: usize = 16;
/// Default tun device name.
pub const DEFAULT_TUN: &str = "soya0";
/// Default WAN port; `wan.bind` defaults to `0.0.0.0:7400`.
pub const DEFAULT_WAN_PORT: u16 = 7400;
const DEFAULT_WAN_BIND: &str = "0.0.0.0:7400";
/// Fibre: light travels ~204 km per ms, i.e. 4.9 µs per km, each way.
pub const FIBRE_NS_PER_KM_ONE_WAY: f64 = 4_900.0;

/// Site and WAN path names: lowercase, digits and dashes, like DNS labels,
/// because they end up in file names, metric labels and log lines.
fn valid_name(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

const NAME_RULE: &str =
    "must be 1..=32 characters of a-z, 0-9 and '-', not starting or ending with '-'";

/// Resolves the whole file. Sections are resolved independently so one bad
/// section does not hide problems in another.
pub(crate) fn resolve(raw: RawConfig, origin: &str) -> Result<SiteConfig, Vec<Problem>> {
    let mut c = Checker::default();
    let site = resolve_site(&mut c, &raw.site);
    let dc = resolve_dc(&mut c, &raw.dc);
    let wan = resolve_wan(&mut c, &raw.wan);
    let buffer = buffer::resolve(&mut c, &raw.buffer, wan.as_ref().map(|w| &w.paths[..]));
    let pseudo_ack = resolve_pseudo_ack(&mut c, &raw.pseudo_ack);
    let control = resolve_control(&mut c, &raw.control, site.as_deref());
    let gateway = resolve_gateway(&mut c, &raw.gateway);
    let log = LogConfig {
        format: raw.log.format.unwrap_or_default(),
        level: raw.log.level.unwrap_or_default(),
    };
    match (site, dc, wan, buffer, pseudo_ack, control, gateway) {
        (
            Some(site),
            Some(dc),
            Some(wan),
            Some(buffer),
            Some(pseudo_ack),
            Some(control),
            Some(gateway),
        ) if c.problems.is_empty() => {
            Ok(SiteConfig {
                site,
                dc,
                wan,
                buffer,
                pseudo_ack,
                control,
                log,
                gateway,
                origin: origin.to_string(),
                defaulted: Vec::new(), // filled in by parse_str
            })
        }
        _ => Err(c.problems),
    }
}

fn resolve_site(c: &mut Checker, site: &Option<String>) -> Option<String> {
    let s = c.required(
        "site",
        site,
        "every site config starts with site = \"<name>\", e.g. site = \"sapporo\"",
    )?;
    if !valid_name(s) {
        c.err("site", format!("site name {NAME_RULE} (e.g. \"sapporo\")"));
        return None;
    }
    Some(s.clone())
}

/// Linux interface names: < IFNAMSIZ (16) bytes, no '/', ':' or whitespace.
fn valid_ifname(s: &str) -> bool {
    (1..=15).contains(&s.len())
        && s != "."
        && s != ".."
        && !s
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
}

fn resolve_dc(c: &mut Checker, dc: &RawDc) -> Option<DcConfig> {
    let kind = dc.backend.unwrap_or_default();
    let errors_before = c.problems.len();
    let interface = |c: &mut Checker, default: Option<&str>| -> Option<String> {
        let name = match (&dc.interface, default) {
            (Some(n), _) => n.as_str(),
            (None, Some(d)) => d,
            (None, None) => {
                c.err(
                    "dc.interface",
                    "missing; backend = \"xdp\" needs the NIC (or veth) name, \
                     e.g. interface = \"ens1f0\"",
                );
                return None;
            }
        };
        if !valid_ifname(name) {
            c.err(
                "dc.interface",
                "interface name must be 1..=15 characters without '/', ':' or whitespace \
                 (Linux IFNAMSIZ)",
            );
            return None;
        }
        Some(name.to_string())
    };
    // Keys that the chosen backend would silently ignore are errors: an
    // operator who set them believes they do something.
    if kind != BackendKind::Udp && dc.listen.is_some() {
        c.err(
            "dc.listen",
            "only used with backend = \"udp\" (loopback lab mode); \
             remove it or set backend = \"udp\"",
        );
    }
    let backend = match kind {
        BackendKind::Tun => {
            interface(c, Some(DEFAULT_TUN)).map(|interface| DcBackend::Tun { interface })
        }
        BackendKind::Xdp => interface(c, None).map(|interface| DcBackend::Xdp { interface }),
        BackendKind::Udp => {
            if dc.interface.is_some() {
                c.err(
                    "dc.interface",
                    "not used with backend = \"udp\" (the lab mode has no device); remove it",
                );
            }
            let listen = c.required(
                "dc.listen",
                &dc.listen,
                "backend = \"udp\" needs the lab hosts' address, e.g. listen = \"127.0.0.1:4791\"",
            );
            listen
                .and_then(|l| c.socket("dc.listen", l))
                .map(|listen| DcBackend::Udp { listen })
        }
    };
    let local = prefixes(
        c,
        "dc.local_prefixes",
        &dc.local_prefixes,
        "local data-center networks allowed to cross the WAN, \
         e.g. local_prefixes = [\"10.1.0.0/16\"]",
    );
    let remote = prefixes(
        c,
        "dc.remote_prefixes",
        &dc.remote_prefixes,
        "the twin site's networks, e.g. remote_prefixes = [\"10.2.0.0/16\"]",
    );
    if let (Some(local), Some(remote)) = (&local, &remote) {
        for (j, r) in remote.iter().enumerate() {
            if let Some((i, l)) = local.iter().enumerate().find(|(_, l)| l.overlaps(r)) {
                c.err(
                    format!("dc.remote_prefixes[{j}]"),
                    format!(
                        "{r} overlaps dc.local_prefixes[{i}] = {l}; local and remote prefixes \
                         must be disjoint, or traffic would be sent back over the WAN"
                    ),
                );
            }
        }
    }
    let floor = duration_in(
        c,
        "dc.retransmit_floor",
        dc.retransmit_floor.as_deref(),
        DEFAULT_RETRANSMIT_FLOOR,
        Duration::from_micros(100)..=Duration::from_secs(1),
        "retransmit_floor",
    );
    let give_up = duration_in(
        c,
        "dc.give_up_after",
        dc.give_up_after.as_deref(),
        DEFAULT_GIVE_UP_AFTER,
        Duration::from_millis(100)..=Duration::from_secs(60),
        "give_up_after",
    );
    let rnr_give_up = duration_in(
        c,
        "dc.rnr_give_up",
        dc.rnr_give_up.as_deref(),
        DEFAULT_RNR_GIVE_UP,
        Duration::from_secs(1)..=Duration::from_secs(600),
        "rnr_give_up",
    );
    if let (Some(f), Some(g)) = (floor, give_up) {
        if g < 4 * f {
            c.err(
                "dc.give_up_after",
                format!(
                    "give_up_after must be at least 4 x dc.retransmit_floor ({}), so the \
                     gateway retries a few times before it fails a flow",
                    units::format_duration(4 * f)
                ),
            );
        }
    }
    if c.problems.len() != errors_before {
        return None;
    }
    Some(DcConfig {
        backend: backend?,
        local_prefixes: local?,
        remote_prefixes: remote?,
        retransmit_floor: floor?,
        give_up_after: give_up?,
        rnr_give_up: rnr_give_up?,
    })
}

/// An optional duration with a default and an inclusive range.
fn duration_in(
    c: &mut Checker,
    path: &str,
    value: Option<&str>,
    default: Duration,
    range: RangeInclusive<Duration>,
    what: &str,
) -> Option<Duration> {
    let Some(s) = value else {
        return Some(default);
    };
    match units::parse_duration(s) {
        Ok(d) if range.contains(&d) => Some(d),
        Ok(_) => {
            c.err(
                path,
                format!(
                    "{what} must be between {} and {}",
                    units::format_duration(*range.start()),
                    units::format_duration(*range.end())
                ),
            );
            None
        }
        Err(e) => {
            c.err(path, e.0);
            None
        }
    }
}

fn prefixes(
    c: &mut Checker,
    path: &str,
    list: &Option<Vec<String>>,
    what: &str,
) -> Option<Vec<Prefix>> {
    let list = c.required(path, list, &format!("list the {what}"))?;
    if list.is_empty() {
        c.err(path, format!("must not be empty; list the {what}"));
        return None;
    }
    let mut out: Vec<(usize, Prefix)> = Vec::new();
    let mut ok = true;
    for (i, s) in list.iter().enumerate() {
        match s.parse::<Prefix>() {
            Ok(p) => {
                if let Some((first, _)) = out.iter().find(|(_, q)| *q == p) {
                    c.err(
                        format!("{path}[{i}]"),
                        format!("{p} is listed twice (also {path}[{first}])"),
                    );
                    ok = false;
                }
                out.push((i, p));
            }
            Err(e) => {
                c.err(format!("{path}[{i}]"), e.0);
                ok = false;
            }
        }
    }
    ok.then(|| out.into_iter().map(|(_, p)| p).collect())
}

fn resolve_wan(c: &mut Checker, wan: &RawWan) -> Option<WanConfig> {
    let errors_before = c.problems.len();
    let bind: Vec<SocketAddr> = match &wan.bind {
        None => vec![SocketAddr::from(([0, 0, 0, 0], DEFAULT_WAN_PORT))],
        Some(list) if list.is_empty() => {
            c.err(
                "wan.bind",
                format!(
                    "must not be empty; give at least one local address, \
                     e.g. [\"{DEFAULT_WAN_BIND}\"], or leave it out for that default"
                ),
            );
            Vec::new()
        }
        Some(list) => {
            let mut out: Vec<(usize, SocketAddr)> = Vec::new();
            for (i, s) in list.iter().enumerate() {
                let path = format!("wan.bind[{i}]");
                if let Some(a) = c.socket(&path, s) {
                    if let Some((first, _)) = out.iter().find(|(_, b)| *b == a) {
                        c.err(
                            &path,
                            format!("{a} is listed twice (also wan.bind[{first}])"),
                        );
                    }
                    out.push((i, a));
                }
            }
            out.into_iter().map(|(_, a)| a).collect()
        }
    };
    let insecure = wan.insecure.unwrap_or(false);
    let key_file = wan.key_file.as_ref().map(PathBuf::from);
    if wan.key_file.as_deref() == Some("") {
        c.err(
            "wan.key_file",
            "must not be empty; expected a path like \"/etc/soya/psk\"",
        );
    }
    let private_key_file = wan.private_key_file.as_ref().map(PathBuf::from);
    if wan.private_key_file.as_deref() == Some("") {
        c.err(
            "wan.private_key_file",
            "must not be empty; expected a path like \"/etc/soya/sapporo.key\"",
        );
    }
    let twin_public_key = match wan.twin_public_key.as_deref() {
        Some(t) => match crate::keyfile::decode_key_base64(t) {
            Ok(k) => Some(k),
            Err(e) => {
                c.err("wan.twin_public_key", e);
                None
            }
        },
        None => None,
    };
    let identity = match (private_key_file, &wan.twin_public_key) {
        (Some(f), Some(_)) => twin_public_key.map(|k| WanIdentity {
            private_key_file: f,
            twin_public_key: k,
        }),
        (Some(_), None) => {
            c.err(
                "wan.twin_public_key",
                "missing; with wan.private_key_file set, name the twin's public key \
                 (run `soya pubkey /etc/soya/<twin>.key` on the twin)",
            );
            None
        }
        (None, Some(_)) => {
            c.err(
                "wan.private_key_file",
                "missing; with wan.twin_public_key set, name this gateway's private key \
                 file (create it with `soya genkey /etc/soya/<site>.key`)",
            );
            None
        }
        (None, None) => None,
    };
    if insecure && (wan.private_key_file.is_some() || wan.twin_public_key.is_some()) {
        c.err(
            "wan.insecure",
            "true together with identity keys (wan.private_key_file, wan.twin_public_key): \
             remove insecure, or the keys",
        );
    }
    let has_identity = wan.private_key_file.is_some() || wan.twin_public_key.is_some();
    let security = if insecure {
        WanSecurity::Insecure {
            ignored_key_file: key_file,
        }
    } else {
        match key_file {
            Some(key_file) => WanSecurity::PreSharedKey { key_file },
            None if has_identity => WanSecurity::Identity,
            None => {
                c.err(
                    "wan.key_file",
                    "missing; set private_key_file and twin_public_key (identity keys: \
                     `soya genkey`, `soya pubkey`), or key_file = \"/etc/soya/psk\" (a \
                     pre-shared key file, the same on both sites), or, in a lab only, \
                     insecure = true",
                );
                WanSecurity::Insecure {
                    ignored_key_file: None,
                }
            }
        }
    };
    // With a broken wan.bind, path bind indices cannot be checked meaningfully.
    let bind_ok = c.problems.len() == errors_before;
    let paths = resolve_paths(c, wan.paths.as_deref(), bind_ok.then_some(&bind[..]));
    let twin_timeout = duration_in(
        c,
        "wan.twin_timeout",
        wan.twin_timeout.as_deref(),
        DEFAULT_TWIN_TIMEOUT,
        Duration::from_secs(1)..=Duration::from_secs(3600),
        "twin_timeout",
    );
    let rekey_interval = duration_in(
        c,
        "wan.rekey_interval",
        wan.rekey_interval.as_deref(),
        DEFAULT_REKEY_INTERVAL,
        REKEY_INTERVAL_RANGE,
        "rekey_interval",
    );
    let mtu = c.int("wan.mtu", wan.mtu, DEFAULT_WAN_MTU, 1280..=9216, "mtu");
    if c.problems.len() != errors_before {
        return None;
    }
    Some(WanConfig {
        bind,
        security,
        identity,
        cipher: wan.cipher.unwrap_or_default(),
        twin_timeout: twin_timeout?,
        rekey_interval: rekey_interval?,
        mtu: mtu?,
        paths: paths?,
        key_digests: KeyDigests::default(),
    })
}

fn resolve_paths(
    c: &mut Checker,
    raw: Option<&[RawPath]>,
    bind: Option<&[SocketAddr]>,
) -> Option<Vec<WanPath>> {
    let raw = match raw {
        Some(r) if !r.is_empty() => r,
        _ => {
            c.err(
                "wan.paths",
                "missing; add at least one [[wan.paths]] table with name and remote",
            );
            return None;
        }
    };
    if raw.len() > MAX_PATHS {
        c.err(
            format!("wan.paths[{MAX_PATHS}]"),
            format!(
                "too many paths: {} given, at most {MAX_PATHS} are supported",
                raw.len()
            ),
        );
        return None;
    }
    let mut paths: Vec<WanPath> = Vec::new();
    let mut ok = true;
    for (i, p) in raw.iter().enumerate() {
        match resolve_path(c, i, p, bind) {
            Some(path) => {
                let at = |field: &str| format!("wan.paths[{i}].{field}");
                if let Some(j) = paths.iter().position(|q| q.name == path.name) {
                    c.err(
                        at("name"),
                        format!(
                            "duplicate path name {:?} (also wan.paths[{j}].name); \
                             names must be unique",
                            path.name
                        ),
                    );
                    ok = false;
                } else if let Some(j) = paths
                    .iter()
                    .position(|q| (q.bind, q.remote) == (path.bind, path.remote))
                {
                    c.err(
                        at("remote"),
                        format!(
                            "wan.paths[{j}] already uses bind {} with remote {}; \
                             two paths must differ in local or remote address",
                            path.bind, path.remote
                        ),
                    );
                    ok = false;
                }
                paths.push(path);
            }
            None => ok = false,
        }
    }
    ok.then_some(paths)
}

fn resolve_path(
    c: &mut Checker,
    i: usize,
    p: &RawPath,
    bind: Option<&[SocketAddr]>,
) -> Option<WanPath> {
    let errors_before = c.problems.len();
    let at = |field: &str| format!("wan.paths[{i}].{field}");
    let name = c.required(
        &at("name"),
        &p.name,
        "every path needs a name, e.g. name = \"coast-dwdm\"",
    );
    if let Some(n) = name {
        if !valid_name(n) {
            c.err(
                at("name"),
                format!("path name {NAME_RULE} (e.g. \"coast-dwdm\")"),
            );
        }
    }
    let remote = c
        .required(
            &at("remote"),
            &p.remote,
            "the twin gateway's address, e.g. remote = \"203.0.113.7:7400\"",
        )
        .and_then(|r| c.socket(&at("remote"), r));
    if let Some(r) = remote {
        if r.ip().is_unspecified() || r.ip().is_multicast() {
            c.err(
                at("remote"),
                "must be the twin gateway's unicast address, not a wildcard or multicast address",
            );
        }
    }
    let local = match (&p.bind, bind) {
        (Some(StrOrInt::Str(s)), _) => c.socket(&at("bind"), s),
        (_, None) => None, // wan.bind itself is broken and already reported
        (None, Some(bind)) => bind.first().copied(),
        (Some(StrOrInt::Int(n)), Some(bind)) => {
            let found = usize::try_from(*n).ok().and_then(|n| bind.get(n)).copied();
            if found.is_none() {
                c.err(
                    at("bind"),
                    format!(
                        "index {n} is out of range: wan.bind has {} entr{} (0..={})",
                        bind.len(),
                        if bind.len() == 1 { "y" } else { "ies" },
                        bind.len().saturating_sub(1)
                    ),
                );
            }
            found
        }
    };
    if let (Some(l), Some(r)) = (local, remote) {
        if l.is_ipv4() != r.is_ipv4() {
            let (rf, lf) = if r.is_ipv4() {
                ("IPv4", "IPv6")
            } else {
                ("IPv6", "IPv4")
            };
            c.err(
                at("remote"),
                format!(
                "remote is {rf} but this path sends from {lf} address {l}; set the path's bind \
                 (or wan.bind) to an {rf} address"
            ),
            );
        }
    }
    let weight = c.int(&at("weight"), p.weight, 1u32, 1..=100, "weight");
    let dscp = c.int(&at("dscp"), p.dscp, 0u8, 0..=63, "DSCP");
    let rate_bps = match &p.rate {
        None => None,
        Some(s) => match units::parse_rate(s) {
            Ok(r) if (1_000..=10_000_000_000_000).contains(&r) => Some(r),
            Ok(_) => {
                c.err(at("rate"), "rate must be between 1kbit and 10tbit");
                None
            }
            Err(e) => {
                c.err(at("rate"), e.0);
                None
            }
        },
    };
    let rtt = path_rtt(c, i, p);
    if c.problems.len() != errors_before {
        return None;
    }
    Some(WanPath {
        name: name?.clone(),
        remote: remote?,
        bind: local?,
        weight: weight?,
        rate_bps,
        dscp: dscp?,
        rtt,
        distance_km: p.distance_km,
    })
}

/// `rtt` as given, or 2 × 4.9 µs × `distance_km`.
fn path_rtt(c: &mut Checker, i: usize, p: &RawPath) -> Option<Duration> {
    let at = |field: &str| format!("wan.paths[{i}].{field}");
    match (&p.rtt, p.distance_km) {
        (Some(_), Some(_)) => {
            c.err(
                at("distance_km"),
                "set either rtt or distance_km, not both (distance_km only derives the RTT)",
            );
            None
        }
        (Some(s), None) => match units::parse_duration(s) {
            Ok(d) if d >= Duration::from_micros(1) && d <= Duration::from_secs(10) => Some(d),
            Ok(_) => {
                c.err(at("rtt"), "rtt must be between 1us and 10s");
                None
            }
            Err(e) => {
                c.err(at("rtt"), e.0);
                None
            }
        },
        (None, Some(km)) => {
            if km > 0.0 && km <= 40_000.0 {
                let ns = (2.0 * FIBRE_NS_PER_KM_ONE_WAY * km).round() as u64;
                Some(Duration::from_nanos(ns))
            } else {
                c.err(
                    at("distance_km"),
                    "distance_km must be a number 0 < km <= 40000",
                );
                None
            }
        }
        (None, None) => None,
    }
}

fn resolve_pseudo_ack(c: &mut Checker, p: &RawPseudoAck) -> Option<PseudoAckConfig> {
    let packets = c.int(
        "pseudo_ack.coalesce_packets",
        p.coalesce_packets,
        16u32,
        1..=128,
        "coalesce_packets",
    );
    let us = c.int(
        "pseudo_ack.coalesce_us",
        p.coalesce_us,
        20u64,
        0..=10_000,
        "coalesce_us (microseconds)",
    );
    Some(PseudoAckConfig {
        policy: p.policy.unwrap_or_default(),
        coalesce_packets: packets?,
        coalesce: Duration::from_micros(us?),
        cnp_on_backpressure: p.cnp_on_backpressure.unwrap_or(true),
    })
}

fn resolve_gateway(c: &mut Checker, g: &RawGateway) -> Option<GatewayConfig> {
    let shards = match &g.shards {
        None => Shards::default(),
        Some(StrOrInt::Str(s)) if s.trim() == "auto" => Shards::Auto,
        Some(StrOrInt::Int(n)) if (1..=i64::from(MAX_SHARDS)).contains(n) => {
            Shards::Fixed(*n as u16)
        }
        Some(v) => {
            let got = match v {
                StrOrInt::Str(s) => format!("{s:?}"),
                StrOrInt::Int(n) => n.to_string(),
            };
            c.err(
                "gateway.shards",
                format!(
                    "must be \"auto\" or an integer 1..={MAX_SHARDS}, not {got} \
                     (both sites must run the same count)"
                ),
            );
            return None;
        }
    };
    Some(GatewayConfig { shards })
}

/// `sun_path` is 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

fn resolve_control(c: &mut Checker, ctl: &RawControl, site: Option<&str>) -> Option<ControlConfig> {
    let metrics = match ctl.metrics.as_deref().map(str::trim) {
        None | Some("") => Some(None),
        Some(s) => c.socket("control.metrics", s).map(Some),
    };
    let socket = match &ctl.socket {
        None => Some(PathBuf::from(format!(
            "/run/soya/{}.sock",
            site.unwrap_or("soya")
        ))),
        Some(s) if !s.starts_with('/') => {
            c.err(
                "control.socket",
                "must be an absolute path like \"/run/soya/sapporo.sock\" \
                 (a daemon's working directory is not reliable)",
            );
            None
        }
        Some(s) if s.len() > MAX_SOCKET_PATH || s.contains('\0') => {
            c.err(
                "control.socket",
                format!(
                    "must be at most {MAX_SOCKET_PATH} bytes without NUL \
                     (the Unix socket address limit)"
                ),
            );
            None
        }
        Some(s) => Some(PathBuf::from(s)),
    };
    Some(ControlConfig {
        metrics: metrics?,
        socket: socket?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["sapporo", "wakkanai", "a", "site-2", "0"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Sapporo",
            "-a",
            "a-",
            "a_b",
            "a b",
            "さっぽろ",
            &"x".repeat(33),
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn interface_names() {
        assert!(valid_ifname("soya0"));
        assert!(valid_ifname("ens1f0np0"));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("eth0:1"));
        assert!(!valid_ifname("sixteen-chars-xx"));
        assert!(!valid_ifname(""));
    }
}
