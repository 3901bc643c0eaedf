//! The TOML file as written: every key optional, nothing interpreted yet.
//!
//! Why everything is `Option`: serde stops at the first problem, and its
//! "missing field" message cannot say what the field is for. Keeping the raw
//! layer permissive moves every judgement into [`crate::validate`], which can
//! report several problems at once, each with a key path and an "accepted:"
//! text. `deny_unknown_fields` stays on every table, because a misspelt key
//! (`dsc = 46`) silently falling back to a default is the worst kind of
//! config bug.
//!
//! Enums (backend, policy, cipher, log format/level) are decoded by serde directly:
//! its "unknown variant `tap`, expected one of `tun`, `udp`, `xdp`"
//! already names what is accepted.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;

/// How the gateway attaches to the local data-center network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// A Linux tun device routed for the remote prefixes (default).
    #[default]
    Tun,
    /// Loopback lab mode: RoCEv2 packets carried in UDP on 127.0.0.x.
    Udp,
    /// Frames on a NIC (or veth) through AF_XDP sockets, one per shard,
    /// steered by an XDP program. (`afpacket`, never implemented, is gone:
    /// serde's "unknown variant" names `xdp` and `tun`.)
    Xdp,
}

/// When the gateway may acknowledge RoCE traffic on the far side's behalf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AckPolicy {
    /// Pseudo-ACK as soon as the packet is safely in the local buffer (default).
    #[default]
    Edge,
    /// Pseudo-ACK only once the twin gateway confirmed receipt.
    Strict,
    /// Never pseudo-ACK: end-to-end ACKs only (a plain tunnel).
    Off,
}

/// Which AEAD protects WAN packets (`wan.cipher`). The twins agree on one
/// in the HELLO exchange; see docs/wan-protocol.md § Cipher agreement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
pub enum WanCipher {
    /// Accept both; prefer AES-256-GCM when this CPU has AES and carry-less
    /// multiply instructions, ChaCha20-Poly1305 otherwise (default).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// AES-256-GCM only: a twin that cannot use it is refused.
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
    /// ChaCha20-Poly1305 only: a twin that cannot use it is refused.
    #[serde(rename = "chacha20-poly1305")]
    ChaCha20Poly1305,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

/// Minimum log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Trace,
    Debug,
    #[default]
    Info,
    Warn,
    Error,
}

/// Enums print as they are spelt in the file (`tun`, `edge`, `json`, `info`).
macro_rules! toml_spelling {
    ($ty:ty { $($variant:ident => $text:literal),* $(,)? }) => {
        impl $ty {
            pub fn as_str(self) -> &'static str {
                match self { $(<$ty>::$variant => $text),* }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

toml_spelling!(BackendKind { Tun => "tun", Udp => "udp", Xdp => "xdp" });
toml_spelling!(AckPolicy { Edge => "edge", Strict => "strict", Off => "off" });
toml_spelling!(WanCipher { Auto => "auto", Aes256Gcm => "aes-256-gcm", ChaCha20Poly1305 => "chacha20-poly1305" });
toml_spelling!(LogFormat { Human => "human", Json => "json" });
toml_spelling!(LogLevel { Trace => "trace", Debug => "debug", Info => "info", Warn => "warn", Error => "error" });

/// A value that may be written as a string or as an integer
/// (`size = "4GiB"` or `size = 65536`; `bind = 1` or `bind = "0.0.0.0:7401"`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StrOrInt {
    Str(String),
    Int(i64),
}

impl<'de> Deserialize<'de> for StrOrInt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = StrOrInt;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an integer")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StrOrInt, E> {
                Ok(StrOrInt::Str(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StrOrInt, E> {
                Ok(StrOrInt::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StrOrInt, E> {
                i64::try_from(v)
                    .map(StrOrInt::Int)
                    .map_err(|_| E::custom("integer too large"))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawConfig {
    pub site: Option<String>,
    pub dc: RawDc,
    pub wan: RawWan,
    pub buffer: RawBuffer,
    pub pseudo_ack: RawPseudoAck,
    pub control: RawControl,
    pub log: RawLog,
    pub gateway: RawGateway,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawGateway {
    pub shards: Option<StrOrInt>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawDc {
    pub backend: Option<BackendKind>,
    pub interface: Option<String>,
    pub listen: Option<String>,
    pub local_prefixes: Option<Vec<String>>,
    pub remote_prefixes: Option<Vec<String>>,
    pub retransmit_floor: Option<String>,
    pub give_up_after: Option<String>,
    pub rnr_give_up: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawWan {
    pub bind: Option<Vec<String>>,
    pub insecure: Option<bool>,
    pub key_file: Option<String>,
    pub private_key_file: Option<String>,
    pub twin_public_key: Option<String>,
    pub cipher: Option<WanCipher>,
    pub twin_timeout: Option<String>,
    pub rekey_interval: Option<String>,
    pub mtu: Option<i64>,
    pub paths: Option<Vec<RawPath>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawPath {
    pub name: Option<String>,
    pub remote: Option<String>,
    pub bind: Option<StrOrInt>,
    pub weight: Option<i64>,
    pub rate: Option<String>,
    pub dscp: Option<i64>,
    pub rtt: Option<String>,
    pub distance_km: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawBuffer {
    pub size: Option<StrOrInt>,
    pub safety_factor: Option<f64>,
    pub per_flow_quota: Option<StrOrInt>,
    pub slot_bytes: Option<i64>,
    pub requester_window: Option<StrOrInt>,
    pub requesters: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawPseudoAck {
    pub policy: Option<AckPolicy>,
    pub coalesce_packets: Option<i64>,
    pub coalesce_us: Option<i64>,
    pub cnp_on_backpressure: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawControl {
    pub metrics: Option<String>,
    pub socket: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawLog {
    pub format: Option<LogFormat>,
    pub level: Option<LogLevel>,
}

/// What each key accepts, by key path with array indices written `[]`.
///
/// Used to replace serde's Rust-flavoured "expected struct RawDc" / "expected
/// i64" with operator language when a value has the wrong TOML type. Kept next
/// to the structs so a new key gets its description in the same edit (a test
/// checks that every key used by the examples is listed here).
pub(crate) const ACCEPTED: &[(&str, &str)] = &[
    (
        "site",
        "a site name of 1..=32 characters a-z, 0-9 and '-', like \"sapporo\"",
    ),
    ("dc", "a table [dc]"),
    ("dc.backend", "one of \"tun\", \"udp\", \"xdp\""),
    (
        "dc.interface",
        "a network interface name of 1..=15 characters, like \"soya0\"",
    ),
    ("dc.listen", "a socket address like \"127.0.0.1:4791\""),
    (
        "dc.local_prefixes",
        "a non-empty array of CIDR prefixes like [\"10.1.0.0/16\"]",
    ),
    (
        "dc.local_prefixes[]",
        "a CIDR prefix string like \"10.1.0.0/16\"",
    ),
    (
        "dc.remote_prefixes",
        "a non-empty array of CIDR prefixes like [\"10.2.0.0/16\"]",
    ),
    (
        "dc.remote_prefixes[]",
        "a CIDR prefix string like \"10.2.0.0/16\"",
    ),
    (
        "dc.retransmit_floor",
        "a duration 100us..=1s like \"50ms\" (units: ns, us or µs, ms, s)",
    ),
    (
        "dc.give_up_after",
        "a duration 100ms..=60s like \"4s\", at least 4 x dc.retransmit_floor",
    ),
    ("dc.rnr_give_up", "a duration 1s..=600s like \"20s\""),
    ("wan", "a table [wan]"),
    (
        "wan.bind",
        "a non-empty array of socket addresses like [\"0.0.0.0:7400\"]",
    ),
    (
        "wan.bind[]",
        "a socket address string like \"0.0.0.0:7400\"",
    ),
    ("wan.insecure", "true or false"),
    ("wan.key_file", "a path string like \"/etc/soya/psk\""),
    (
        "wan.private_key_file",
        "a path string like \"/etc/soya/sapporo.key\" (written by `soya genkey`)",
    ),
    (
        "wan.twin_public_key",
        "the twin's public key: 44 base64 characters, as `soya pubkey` prints",
    ),
    (
        "wan.cipher",
        "one of \"auto\", \"aes-256-gcm\", \"chacha20-poly1305\"",
    ),
    (
        "wan.twin_timeout",
        "a duration 1s..=1h like \"5s\": every path down this long and the twin is lost",
    ),
    (
        "wan.rekey_interval",
        "a duration 1s..=1h like \"120s\": identity keys, how often the client runs a fresh handshake inside the session",
    ),
    (
        "wan.mtu",
        "an integer 1280..=9216: the IP MTU every WAN path carries (9000 jumbo, 1500 standard Ethernet)",
    ),
    ("wan.paths", "1..=16 [[wan.paths]] tables"),
    ("wan.paths[]", "a [[wan.paths]] table"),
    (
        "wan.paths[].name",
        "a unique path name of a-z, 0-9 and '-', like \"coast-dwdm\"",
    ),
    (
        "wan.paths[].remote",
        "the twin's socket address like \"203.0.113.7:7400\"",
    ),
    (
        "wan.paths[].bind",
        "an index into wan.bind (0, 1, ...) or a socket address string",
    ),
    ("wan.paths[].weight", "an integer 1..=100"),
    ("wan.paths[].rate", crate::units::RATE_ACCEPTED),
    ("wan.paths[].dscp", "an integer 0..=63"),
    ("wan.paths[].rtt", crate::units::DURATION_ACCEPTED),
    (
        "wan.paths[].distance_km",
        "a number of kilometres, 0 < km <= 40000",
    ),
    ("buffer", "a table [buffer]"),
    (
        "buffer.size",
        "\"auto\" or a byte size like \"4GiB\", \"512MiB\" or 65536",
    ),
    ("buffer.safety_factor", "a number 1.0..=16.0"),
    (
        "buffer.per_flow_quota",
        "a byte size like \"64MiB\" (at most buffer.size)",
    ),
    ("buffer.slot_bytes", "an integer 1024..=16384"),
    (
        "buffer.requester_window",
        "a byte size like \"8MiB\" (send-queue depth x message size), at most 1 GiB",
    ),
    ("buffer.requesters", "an integer 0..=65536"),
    ("pseudo_ack", "a table [pseudo_ack]"),
    ("pseudo_ack.policy", "one of \"edge\", \"strict\", \"off\""),
    ("pseudo_ack.coalesce_packets", "an integer 1..=128"),
    (
        "pseudo_ack.coalesce_us",
        "an integer 0..=10000 (microseconds)",
    ),
    ("pseudo_ack.cnp_on_backpressure", "true or false"),
    ("control", "a table [control]"),
    (
        "control.metrics",
        "a socket address like \"127.0.0.1:9464\", or \"\" to disable",
    ),
    (
        "control.socket",
        "an absolute path like \"/run/soya/sapporo.sock\"",
    ),
    ("log", "a table [log]"),
    ("gateway", "a table [gateway]"),
    (
        "gateway.shards",
        "\"auto\" or an integer 1..=16 (the same on both sites)",
    ),
    ("log.format", "one of \"human\", \"json\""),
    (
        "log.level",
        "one of \"trace\", \"debug\", \"info\", \"warn\", \"error\"",
    ),
];

/// `wan.paths[3].dscp` → `wan.paths[].dscp`.
pub(crate) fn generic_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push('[');
            }
            ']' => {
                in_index = false;
                out.push(']');
            }
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

/// The "accepted" text for a concrete key path, if it is a known key.
pub(crate) fn accepted(path: &str) -> Option<&'static str> {
    let generic = generic_path(path);
    ACCEPTED
        .iter()
        .find(|(k, _)| *k == generic)
        .map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key the examples use is documented in ACCEPTED (so type errors
    /// on it can say what is accepted), and every documented key exists in
    /// at least one example (so the examples show the whole schema).
    #[test]
    fn accepted_table_covers_the_examples() {
        let examples = [
            include_str!("../examples/sapporo.toml"),
            include_str!("../examples/wakkanai.toml"),
            include_str!("../examples/lab-udp-a.toml"),
            include_str!("../examples/lab-udp-b.toml"),
            include_str!("../examples/identity.toml"),
        ];
        let mut used = std::collections::BTreeSet::new();
        for text in examples {
            let index = crate::locate::SpanIndex::build(text).unwrap();
            for e in index.entries() {
                let generic = generic_path(&e.path);
                assert!(accepted(&e.path).is_some(), "{generic} is not in ACCEPTED");
                used.insert(generic);
            }
        }
        for (key, _) in ACCEPTED {
            // Section tables and interface/listen are each used somewhere.
            assert!(
                used.contains(*key),
                "{key} is in ACCEPTED but no example uses it"
            );
        }
    }

    #[test]
    fn generic_paths() {
        assert_eq!(generic_path("wan.paths[12].dscp"), "wan.paths[].dscp");
        assert_eq!(accepted("wan.paths[1].dscp"), Some("an integer 0..=63"));
        assert_eq!(accepted("nonsense"), None);
    }
}
