//! `SiteConfig::explain()`: what the gateway will actually do, in words.
//!
//! Operators read this (`soya config explain`) to check a file before a
//! maintenance window, so it shows effective values, marks the ones that came
//! from defaults, and shows derived numbers *with their derivation* (the auto
//! buffer size, RTTs from fibre distance) so they can be checked by hand.

use std::fmt::Write as _;

use crate::model::*;
use crate::schema::RawConfig;
use crate::units::{format_bytes, format_duration, format_rate};

/// Key paths absent from the file that take a default value.
pub(crate) fn defaulted_keys(raw: &RawConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut note = |absent: bool, path: &str| {
        if absent {
            out.push(path.to_string());
        }
    };
    note(raw.dc.backend.is_none(), "dc.backend");
    note(raw.dc.interface.is_none(), "dc.interface");
    note(raw.dc.retransmit_floor.is_none(), "dc.retransmit_floor");
    note(raw.dc.give_up_after.is_none(), "dc.give_up_after");
    note(raw.dc.rnr_give_up.is_none(), "dc.rnr_give_up");
    note(raw.wan.bind.is_none(), "wan.bind");
    note(raw.wan.insecure.is_none(), "wan.insecure");
    note(raw.wan.cipher.is_none(), "wan.cipher");
    note(raw.wan.twin_timeout.is_none(), "wan.twin_timeout");
    note(raw.wan.rekey_interval.is_none(), "wan.rekey_interval");
    note(raw.wan.mtu.is_none(), "wan.mtu");
    for (i, p) in raw.wan.paths.iter().flatten().enumerate() {
        note(p.bind.is_none(), &format!("wan.paths[{i}].bind"));
        note(p.weight.is_none(), &format!("wan.paths[{i}].weight"));
        note(p.dscp.is_none(), &format!("wan.paths[{i}].dscp"));
    }
    note(raw.buffer.size.is_none(), "buffer.size");
    note(raw.buffer.safety_factor.is_none(), "buffer.safety_factor");
    note(raw.buffer.slot_bytes.is_none(), "buffer.slot_bytes");
    note(
        raw.buffer.requester_window.is_none(),
        "buffer.requester_window",
    );
    note(raw.buffer.requesters.is_none(), "buffer.requesters");
    note(raw.pseudo_ack.policy.is_none(), "pseudo_ack.policy");
    note(
        raw.pseudo_ack.coalesce_packets.is_none(),
        "pseudo_ack.coalesce_packets",
    );
    note(
        raw.pseudo_ack.coalesce_us.is_none(),
        "pseudo_ack.coalesce_us",
    );
    note(
        raw.pseudo_ack.cnp_on_backpressure.is_none(),
        "pseudo_ack.cnp_on_backpressure",
    );
    note(raw.control.metrics.is_none(), "control.metrics");
    note(raw.control.socket.is_none(), "control.socket");
    note(raw.log.format.is_none(), "log.format");
    note(raw.log.level.is_none(), "log.level");
    note(raw.gateway.shards.is_none(), "gateway.shards");
    out
}

/// Common DSCP names, so "46" reads as "EF (expedited forwarding)".
fn dscp_name(dscp: u8) -> &'static str {
    match dscp {
        0 => " (best effort)",
        8 => " (CS1)",
        10 => " (AF11)",
        18 => " (AF21)",
        26 => " (AF31)",
        34 => " (AF41)",
        46 => " (EF, expedited forwarding)",
        48 => " (CS6)",
        _ => "",
    }
}

fn join<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

const BANNER: &str = "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!";

impl SiteConfig {
    /// A human summary of the effective configuration: every value (defaults
    /// marked), derived values with their derivation, and warnings — an
    /// insecure WAN is announced in a banner at the top and bottom.
    pub fn explain(&self) -> String {
        let mut s = String::new();
        let d = |path: &str| {
            if self.defaulted.iter().any(|k| k == path) {
                "  (default)"
            } else {
                ""
            }
        };
        let insecure = matches!(self.wan.security, WanSecurity::Insecure { .. });
        let banner = |s: &mut String| {
            let _ = writeln!(s, "{BANNER}");
            let _ = writeln!(
                s,
                "!!! WARNING: INSECURE WAN (wan.insecure = true): traffic between the"
            );
            let _ = writeln!(
                s,
                "!!! gateways is PLAINTEXT and UNAUTHENTICATED. LAB USE ONLY."
            );
            let _ = writeln!(s, "{BANNER}");
        };
        if insecure {
            banner(&mut s);
        }
        let _ = writeln!(s, "Sōya site \"{}\" (from {})", self.site, self.origin);

        let _ = writeln!(s, "\n[dc]");
        let backend = match &self.dc.backend {
            DcBackend::Tun { interface } => format!("tun device {interface}{}", d("dc.interface")),
            DcBackend::Xdp { interface } => format!("AF_XDP on NIC {interface}"),
            DcBackend::Udp { listen } => format!("udp lab mode, lab hosts talk to {listen}"),
        };
        let _ = writeln!(s, "  backend          {backend}{}", d("dc.backend"));
        let _ = writeln!(s, "  local_prefixes   {}", join(&self.dc.local_prefixes));
        let _ = writeln!(s, "  remote_prefixes  {}", join(&self.dc.remote_prefixes));
        let _ = writeln!(
            s,
            "  retransmit       toward local responders: RTO from the measured RTT, at least {}{}",
            format_duration(self.dc.retransmit_floor),
            d("dc.retransmit_floor")
        );
        let _ = writeln!(
            s,
            "  give_up_after    {} without progress from a responder fails its flow{}",
            format_duration(self.dc.give_up_after),
            d("dc.give_up_after")
        );
        let _ = writeln!(
            s,
            "  rnr_give_up      {} of nothing but RNR NAKs from a responder fails its flow{}",
            format_duration(self.dc.rnr_give_up),
            d("dc.rnr_give_up")
        );

        let _ = writeln!(s, "\n[wan]");
        match &self.wan.security {
            WanSecurity::PreSharedKey { .. } | WanSecurity::Identity => {
                let psk = match &self.wan.security {
                    WanSecurity::PreSharedKey { key_file } => Some(key_file),
                    _ => None,
                };
                match (&self.wan.identity, psk) {
                    (Some(id), psk) => {
                        let _ = writeln!(
                            s,
                            "  security         identity keys: Noise IKpsk2 handshake \
                             (forward secrecy), private key {}, twin {}{}",
                            id.private_key_file.display(),
                            crate::encode_key_base64(&id.twin_public_key),
                            psk.map_or(String::new(), |k| format!(
                                ", pre-shared key from {} mixed in",
                                k.display()
                            ))
                        );
                    }
                    (None, Some(key_file)) => {
                        let _ = writeln!(
                            s,
                            "  security         pre-shared key from {} (PSK-only: no forward \
                             secrecy)",
                            key_file.display()
                        );
                    }
                    (None, None) => {}
                }
                let what = match self.wan.cipher {
                    WanCipher::Auto => {
                        "auto: AES-256-GCM when both twins' CPUs have AES hardware, \
                         else ChaCha20-Poly1305"
                    }
                    WanCipher::Aes256Gcm => "AES-256-GCM only (a twin without it is refused)",
                    WanCipher::ChaCha20Poly1305 => {
                        "ChaCha20-Poly1305 only (a twin without it is refused)"
                    }
                };
                let _ = writeln!(s, "  cipher           {what}{}", d("wan.cipher"));
            }
            WanSecurity::Insecure { .. } => {
                let _ = writeln!(s, "  security         NONE (insecure = true)");
                if self.wan.cipher != WanCipher::Auto {
                    let _ = writeln!(
                        s,
                        "  cipher           {} is ignored: nothing is encrypted",
                        self.wan.cipher
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            "  twin_timeout     {} with every path down and the twin is lost: its flows fail{}",
            format_duration(self.wan.twin_timeout),
            d("wan.twin_timeout")
        );
        let rekey = if self.wan.identity.is_some()
            && !matches!(self.wan.security, WanSecurity::Insecure { .. })
        {
            "a fresh handshake (ephemeral DH) inside the session every"
        } else {
            "unused (identity keys only; this mode has no re-handshake):"
        };
        let _ = writeln!(
            s,
            "  rekey_interval   {rekey} {}{}",
            format_duration(self.wan.rekey_interval),
            d("wan.rekey_interval")
        );
        let _ = writeln!(
            s,
            "  mtu              {} (WAN datagrams up to {} bytes; larger messages are fragmented){}",
            self.wan.mtu,
            self.wan.max_datagram(),
            d("wan.mtu")
        );
        for (i, b) in self.wan.bind.iter().enumerate() {
            let _ = writeln!(s, "  bind[{i}]          {b}{}", d("wan.bind"));
        }
        for (i, p) in self.wan.paths.iter().enumerate() {
            let _ = writeln!(s, "  path {:?}", p.name);
            let _ = writeln!(
                s,
                "    {} -> {}{}",
                p.bind,
                p.remote,
                d(&format!("wan.paths[{i}].bind"))
            );
            let rate = p
                .rate_bps
                .map_or("unlimited (no rate set)".to_string(), format_rate);
            let _ = writeln!(
                s,
                "    rate {rate}, weight {}{}",
                p.weight,
                d(&format!("wan.paths[{i}].weight"))
            );
            let _ = writeln!(
                s,
                "    dscp {}{}{}",
                p.dscp,
                dscp_name(p.dscp),
                d(&format!("wan.paths[{i}].dscp"))
            );
            let rtt = match (p.rtt, p.distance_km) {
                (Some(r), Some(km)) => {
                    format!("{} (2 x 4.9 us/km x {km} km of fibre)", format_duration(r))
                }
                (Some(r), None) => format_duration(r),
                (None, _) => "unknown (no rtt or distance_km)".to_string(),
            };
            let _ = writeln!(s, "    rtt  {rtt}");
        }

        let b = &self.buffer;
        let _ = writeln!(s, "\n[buffer]");
        let _ = writeln!(s, "  size             {}", format_bytes(b.bytes));
        match &b.sizing {
            BufferSizing::Explicit => {
                let _ = writeln!(s, "                   (explicit)");
            }
            BufferSizing::Auto {
                total_rate_bps,
                max_rtt,
                bdp_part_bytes,
                reserve_bytes,
                unrounded_bytes,
            } => {
                let _ = writeln!(
                    s,
                    "                   (auto{}: {} total rate x {} max RTT x safety factor {:?} / 8\n\
                     \x20                    = {bdp_part_bytes} bytes\n\
                     \x20                    + {} requesters x {} slots x {} bytes (their windows)\n\
                     \x20                    = {reserve_bytes} bytes\n\
                     \x20                   = {unrounded_bytes} bytes, rounded up to a whole MiB)",
                    d("buffer.size"),
                    format_rate(*total_rate_bps),
                    format_duration(*max_rtt),
                    b.safety_factor,
                    b.requesters,
                    b.requester_window_slots,
                    b.slot_bytes,
                );
            }
        }
        let _ = writeln!(
            s,
            "  safety_factor    {:?}{}",
            b.safety_factor,
            d("buffer.safety_factor")
        );
        let _ = writeln!(
            s,
            "  slots            {} x {} bytes{}",
            b.slots,
            b.slot_bytes,
            d("buffer.slot_bytes")
        );
        let _ = writeln!(
            s,
            "  requester_window {} = {} packets of {} B{}",
            format_bytes(b.requester_window),
            b.requester_window_slots,
            crate::buffer::slot_mtu(b.slot_bytes),
            d("buffer.requester_window")
        );
        let _ = writeln!(
            s,
            "  requesters       {}{}",
            b.requesters,
            d("buffer.requesters")
        );
        let quota = b.per_flow_quota.map_or(
            "none (one flow may fill the whole buffer)".to_string(),
            format_bytes,
        );
        let _ = writeln!(s, "  per_flow_quota   {quota}");

        let a = &self.pseudo_ack;
        let _ = writeln!(s, "\n[pseudo_ack]");
        let policy = match a.policy {
            AckPolicy::Edge => "edge: ACK locally once buffered",
            AckPolicy::Strict => "strict: ACK locally once the twin has the data",
            AckPolicy::Off => "off: end-to-end ACKs only",
        };
        let _ = writeln!(s, "  policy           {policy}{}", d("pseudo_ack.policy"));
        let _ = writeln!(
            s,
            "  coalesce         every {} packets or {} us, whichever first{}",
            a.coalesce_packets,
            a.coalesce.as_micros(),
            if d("pseudo_ack.coalesce_packets").is_empty() && d("pseudo_ack.coalesce_us").is_empty()
            {
                ""
            } else {
                "  (default)"
            }
        );
        let cnp = if a.cnp_on_backpressure {
            "send CNPs to local senders"
        } else {
            "drop (no CNPs)"
        };
        let _ = writeln!(
            s,
            "  on backpressure  {cnp}{}",
            d("pseudo_ack.cnp_on_backpressure")
        );

        let _ = writeln!(s, "\n[control]");
        let metrics = self
            .control
            .metrics
            .map_or("disabled".to_string(), |m| format!("http://{m}/metrics"));
        let _ = writeln!(s, "  metrics          {metrics}{}", d("control.metrics"));
        let _ = writeln!(
            s,
            "  socket           {}{}",
            self.control.socket.display(),
            d("control.socket")
        );

        let _ = writeln!(s, "\n[log]");
        let _ = writeln!(
            s,
            "  format           {}{}",
            self.log.format,
            d("log.format")
        );
        let _ = writeln!(s, "  level            {}{}", self.log.level, d("log.level"));

        let _ = writeln!(s, "\n[gateway]");
        let n = self.gateway.shards.resolve_here();
        let ports = if n == 1 {
            "wan ports as configured".to_string()
        } else {
            format!("shard i uses wan ports + i, i = 0..{}", n - 1)
        };
        let _ = writeln!(
            s,
            "  shards           {} = {n} on this machine ({ports}; the twin must run {n}){}",
            self.gateway.shards,
            d("gateway.shards")
        );

        let warnings = self.warnings();
        if !warnings.is_empty() {
            let _ = writeln!(s, "\nWarnings:");
            for w in &warnings {
                let _ = writeln!(s, "  - {w}");
            }
        }
        if insecure {
            s.push('\n');
            banner(&mut s);
        }
        s
    }
}
