//! The validated, resolved configuration the gateway runs with.
//!
//! Every default is filled in, every unit string is a number, and states the
//! validator rejected cannot be represented where that is cheap (e.g. the
//! data-center backend carries exactly the fields it needs). Consumers never
//! re-parse strings or re-apply defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::prefix::Prefix;
pub use crate::schema::{AckPolicy, BackendKind, LogFormat, LogLevel, WanCipher};

/// One site gateway (Sapporo or Wakkanai), fully resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteConfig {
    /// Site name: `[a-z0-9-]`, used in the default control socket path and logs.
    pub site: String,
    pub dc: DcConfig,
    pub wan: WanConfig,
    pub buffer: BufferConfig,
    pub pseudo_ack: PseudoAckConfig,
    pub control: ControlConfig,
    pub log: LogConfig,
    /// Threads of the data path.
    pub gateway: GatewayConfig,
    /// Where this config came from (file name given to `load` or `parse_str`).
    pub origin: String,
    /// Key paths that were absent from the file and took their default
    /// (e.g. `pseudo_ack.policy`, `wan.paths[0].weight`); `explain()` marks them.
    pub defaulted: Vec<String>,
}

/// The local data-center side: how RoCE traffic enters the gateway and
/// which of it may cross the WAN.
#[derive(Debug, Clone, PartialEq)]
pub struct DcConfig {
    pub backend: DcBackend,
    /// Local RoCE hosts (ACL: traffic must come from here). Never empty.
    pub local_prefixes: Vec<Prefix>,
    /// Hosts at the twin site (ACL: traffic must go there). Never empty, and
    /// disjoint from `local_prefixes`.
    pub remote_prefixes: Vec<Prefix>,
    /// Floor of the retransmission timeout toward local responders (the
    /// gateway re-injects pseudo-ACKed requests and recovers their loss).
    pub retransmit_floor: Duration,
    /// How long a local responder may show no progress before the gateway
    /// fails the flow (the requester gets an error completion).
    pub give_up_after: Duration,
    /// How long a local responder may answer nothing but RNR NAKs (its
    /// application posts no receive) before the gateway fails the flow.
    pub rnr_give_up: Duration,
}

/// Default `dc.retransmit_floor`. The data center is lossless: a missing
/// answer is nearly always a responder that stalled (scheduling, a PFC
/// pause, an on-demand-paging fault), so the gateway is about as patient as
/// the requesters it replaces (perftest's and rdma_cm's usual ACK timeout,
/// 4.096 µs x 2^14 = 67 ms); a loss mid-stream is repaired at once by the
/// responder's sequence NAK, whatever the floor.
pub const DEFAULT_RETRANSMIT_FLOOR: Duration = Duration::from_millis(50);
/// Default `dc.give_up_after`: several times the patience of a hardware
/// requester with perftest's defaults (8 x 67 ms), so a responder stall that
/// requester would have survived directly never fails a flow through the
/// gateway. (rxe's requester, with retry_cnt 7, never gives up at all.)
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(4);
/// A requester with perftest's defaults (timeout 14, retry_cnt 7) on
/// hardware gives up after about 7 x 67 ms; `dc.give_up_after` below this
/// draws a warning.
/// Default `dc.rnr_give_up`: a responder whose application posts no receive
/// for this long is taken as gone. A time, not a count of RNR NAKs: under
/// RDMA-CM (`min_rnr_timer` 0) each NAK asks for a 655 ms wait, so a count
/// of 1,000 held the buffer for 11 minutes while the pseudo-ACKed requester
/// was never told (issue 18, sweep seed 289). Long enough for any pause of
/// a live application (NCCL and storage targets post receives ahead, and a
/// hardware requester with a finite `rnr_retry` gives up far sooner).
pub const DEFAULT_RNR_GIVE_UP: Duration = Duration::from_secs(20);
pub const REQUESTER_PATIENCE: Duration = Duration::from_millis(7 * 67);

/// How the gateway attaches to the data center, with exactly the settings
/// that attachment needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DcBackend {
    /// Linux tun device (default `soya0`).
    Tun { interface: String },
    /// Loopback lab mode: RoCEv2 in UDP, listening on `listen`.
    Udp { listen: SocketAddr },
    /// AF_XDP on a NIC or veth: an XDP program steers the local hosts'
    /// packets for the remote prefixes into one AF_XDP socket per shard.
    Xdp { interface: String },
}

impl DcBackend {
    pub fn kind(&self) -> BackendKind {
        match self {
            DcBackend::Tun { .. } => BackendKind::Tun,
            DcBackend::Udp { .. } => BackendKind::Udp,
            DcBackend::Xdp { .. } => BackendKind::Xdp,
        }
    }
}

/// The WAN side: local sockets, the paths to the twin, and how it is secured.
#[derive(Debug, Clone, PartialEq)]
pub struct WanConfig {
    /// Local bind addresses, in file order (paths refer to them by index).
    pub bind: Vec<SocketAddr>,
    pub security: WanSecurity,
    /// Identity keys (`wan.private_key_file`, `wan.twin_public_key`): the
    /// sessions are set up by the Noise IKpsk2 handshake, with the
    /// pre-shared key, if any, mixed in. `None`: PSK-only mode (or
    /// insecure).
    pub identity: Option<WanIdentity>,
    /// Which AEAD the gateway offers its twin (ignored in insecure mode).
    pub cipher: WanCipher,
    /// Every path down this long and the twin is declared lost: every flow
    /// through it is failed toward its application, and new requests are
    /// refused until the twin answers again ([`DEFAULT_TWIN_TIMEOUT`]).
    pub twin_timeout: Duration,
    /// Identity keys: how often the client gateway runs the Noise handshake
    /// again inside the running session, a fresh ephemeral Diffie-Hellman
    /// that bounds what a stolen traffic secret exposes
    /// ([`DEFAULT_REKEY_INTERVAL`]; unused in PSK-only and lab mode).
    pub rekey_interval: Duration,
    /// The IP MTU every WAN path carries end to end ([`DEFAULT_WAN_MTU`]):
    /// the transport's datagrams are sized to fit it
    /// ([`WanConfig::max_datagram`]), and larger messages (a 4 KiB RoCE
    /// packet on a 1500-byte path) are cut into fragments it reassembles.
    pub mtu: u32,
    /// 1..=16 paths with unique names.
    pub paths: Vec<WanPath>,
    /// What the key files held when [`load`](crate::load) read them
    /// (empty from `parse_str`, which reads no file).
    pub key_digests: KeyDigests,
}

/// Digests of the WAN keys a configuration's key files held when it was
/// loaded: SHA-256 over a label and the key, never the key itself (nor
/// anything that helps find it: the keys are 32 random bytes). A reload
/// and `check-config --diff` compare them, so a key file rewritten in place
/// (same path, new key) is a change, as a new path is. `Debug` shows only
/// whether each is set.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyDigests {
    /// `wan.key_file`'s key (the 32 bytes used), if read.
    pub psk: Option<[u8; 32]>,
    /// `wan.private_key_file`'s key, if read.
    pub private_key: Option<[u8; 32]>,
}

impl KeyDigests {
    /// The digest of one key (`what`: `"psk"` or `"private key"`, so that
    /// the same bytes in the two roles differ).
    pub fn of(what: &str, key: &[u8]) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"soya key digest v1\0");
        h.update(what.as_bytes());
        h.update([0]);
        h.update(key);
        h.finalize().into()
    }

    /// Hex, for the control socket (`None`: not read).
    pub fn hex(d: &Option<[u8; 32]>) -> Option<String> {
        d.map(|d| d.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// From [`KeyDigests::hex`]; `None` for anything else.
    pub fn from_hex(s: &str) -> Option<[u8; 32]> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut d = [0u8; 32];
        for (i, b) in d.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(d)
    }
}

impl std::fmt::Debug for KeyDigests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |d: &Option<[u8; 32]>| if d.is_some() { "read" } else { "none" };
        f.debug_struct("KeyDigests")
            .field("psk", &set(&self.psk))
            .field("private_key", &set(&self.private_key))
            .finish()
    }
}

/// Default `wan.mtu`: jumbo frames, as a DC interconnect usually carries.
pub const DEFAULT_WAN_MTU: u32 = 9000;
/// Bytes of an IPv6 and a UDP header: what a WAN datagram leaves of the MTU
/// (IPv4 paths would leave 20 more; the same size serves both).
pub const WAN_IP_UDP_OVERHEAD: u32 = 48;

impl WanConfig {
    /// The largest UDP payload the transport sends: `mtu` less the IPv6
    /// and UDP headers (8952 at the default 9000, 1452 at 1500).
    pub fn max_datagram(&self) -> usize {
        (self.mtu - WAN_IP_UDP_OVERHEAD) as usize
    }
}

/// Default `wan.twin_timeout`. A path is declared down after
/// `max(3 x PTO, 30 ms)` of silence and is then probed every 25 ms, so a
/// cut path is seen within ~0.2 s even at 3,000 km. Five seconds rides out
/// what a WAN does without losing the twin (a fibre protection switch, 50 ms;
/// an IGP or BGP reconvergence, 1-3 s; a link flap), during which nothing is
/// failed or lost, while an application whose twin really died gets an error
/// within seconds, the order of what a direct RC connection takes to fail
/// (7 retries of a 0.5-2 s ACK timeout), instead of hanging for ever.
pub const DEFAULT_TWIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Default `wan.rekey_interval`: two minutes, as WireGuard's
/// `REKEY_AFTER_TIME`. A re-handshake costs a few DH operations and two
/// datagrams, nothing on the data path.
pub const DEFAULT_REKEY_INTERVAL: Duration = Duration::from_secs(120);
/// The range `wan.rekey_interval` accepts: below a second the re-handshakes
/// would chase each other across a long WAN's round trip; above an hour a
/// stolen traffic secret would read that long.
pub const REKEY_INTERVAL_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);

/// Whether WAN traffic is authenticated/encrypted with a pre-shared key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WanSecurity {
    /// Normal operation. The path is relative to the config file's directory
    /// if it was relative in the file and the config came from `load`; as
    /// written if it came from `parse_str`.
    PreSharedKey { key_file: PathBuf },
    /// Identity keys ([`WanConfig::identity`]) without a pre-shared key.
    Identity,
    /// Plaintext, lab only (`wan.insecure = true`). `ignored_key_file` keeps a
    /// `key_file` that was also set so `explain()` can point it out.
    Insecure { ignored_key_file: Option<PathBuf> },
}

/// This gateway's static X25519 key and its twin's public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WanIdentity {
    /// The private key file (`soya genkey`), resolved against the config
    /// file's directory as `key_file` is.
    pub private_key_file: PathBuf,
    /// The twin's public key (`soya pubkey` of the twin's private key).
    pub twin_public_key: [u8; 32],
}

/// One WAN path to the twin gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct WanPath {
    pub name: String,
    /// The twin gateway's endpoint for this path.
    pub remote: SocketAddr,
    /// The local address this path sends from (resolved from the path's
    /// `bind` index/address, default `wan.bind[0]`).
    pub bind: SocketAddr,
    /// Share of traffic relative to the other paths, 1..=100.
    pub weight: u32,
    /// Rate limit in bits per second, if configured.
    pub rate_bps: Option<u64>,
    /// DSCP codepoint for the outer packets, 0..=63.
    pub dscp: u8,
    /// Expected round-trip time: given as `rtt`, or derived from `distance_km`
    /// as 2 × 4.9 µs/km (light in fibre, both ways).
    pub rtt: Option<Duration>,
    /// The `distance_km` the RTT was derived from, if that is how it was set.
    pub distance_km: Option<f64>,
}

/// The deep buffer that holds pseudo-ACKed data until the twin confirms it.
#[derive(Debug, Clone, PartialEq)]
pub struct BufferConfig {
    /// Resolved buffer size in bytes (computed if `size = "auto"`).
    pub bytes: u64,
    /// How `bytes` was obtained (kept for `explain()` and metrics).
    pub sizing: BufferSizing,
    pub safety_factor: f64,
    /// Most bytes a single flow (QP) may occupy; `None` means no per-flow cap.
    pub per_flow_quota: Option<u64>,
    /// Bytes per packet slot.
    pub slot_bytes: u32,
    /// `bytes / slot_bytes`, at least 16.
    pub slots: u64,
    /// Bytes a requester may send past the last pseudo-ACK: its send
    /// queue, depth × message size (`buffer.requester_window`).
    pub requester_window: u64,
    /// ...in packets of the largest RoCE MTU a slot holds: the window the
    /// ingress assumes for a requester until it sees a larger one.
    pub requester_window_slots: u64,
    /// QPs expected at their full window at once (`buffer.requesters`):
    /// `auto` adds room for their windows.
    pub requesters: u32,
}

/// Where the buffer size came from.
#[derive(Debug, Clone, PartialEq)]
pub enum BufferSizing {
    /// Given explicitly.
    Explicit,
    /// `auto`: Σ rate × max RTT × safety_factor + requesters × window,
    /// rounded up to a MiB (and up to at least 16 slots). The inputs are
    /// kept so the number can be explained.
    Auto {
        total_rate_bps: u64,
        max_rtt: Duration,
        /// Σ rate × max RTT × safety_factor / 8, not rounded.
        bdp_part_bytes: u64,
        /// requesters × window in slots × slot_bytes.
        reserve_bytes: u64,
        /// Bytes before rounding up (the two parts' sum).
        unrounded_bytes: u64,
    },
}

/// Pseudo-ACK behaviour on the data-center side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PseudoAckConfig {
    pub policy: AckPolicy,
    /// Send at most one ACK per this many packets (1..=128).
    pub coalesce_packets: u32,
    /// …or after this long, whichever is first (0..=10 ms).
    pub coalesce: Duration,
    /// Send CNPs to local senders when the buffer fills, instead of dropping.
    pub cnp_on_backpressure: bool,
}

/// Local operator interfaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// Prometheus listen address; `None` when disabled.
    pub metrics: Option<SocketAddr>,
    /// Control socket path (default `/run/soya/<site>.sock`).
    pub socket: PathBuf,
}

/// How the data path uses the machine's cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayConfig {
    pub shards: Shards,
}

/// Most shards a gateway runs (`gateway.shards`).
pub const MAX_SHARDS: u16 = 16;

/// `gateway.shards`: independent device threads, each with its own QP
/// engine, WAN connection and WAN sockets (`wan.bind` port + shard index).
/// Both sites must run the same count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shards {
    /// 1 on machines with at most 2 cores, else cores − 1, at most 8.
    Auto,
    /// 1..=[`MAX_SHARDS`].
    Fixed(u16),
}

impl Default for Shards {
    fn default() -> Shards {
        Shards::Fixed(1)
    }
}

impl Shards {
    /// The count for a machine with `cores` cores.
    pub fn resolve(self, cores: usize) -> u16 {
        match self {
            Shards::Fixed(n) => n,
            Shards::Auto if cores <= 2 => 1,
            Shards::Auto => (cores - 1).min(8) as u16,
        }
    }

    /// The count on this machine (`available_parallelism`).
    pub fn resolve_here(self) -> u16 {
        self.resolve(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl std::fmt::Display for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shards::Auto => f.write_str("auto"),
            Shards::Fixed(n) => write!(f, "{n}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: LogLevel,
}

impl SiteConfig {
    /// Problems that are allowed but deserve attention, one sentence each
    /// (also printed by [`SiteConfig::explain`]). The gateway should log them
    /// at warn level on start-up.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if let WanSecurity::Insecure { ignored_key_file } = &self.wan.security {
            w.push(
                "wan.insecure = true: WAN traffic is PLAINTEXT and UNAUTHENTICATED; \
                 anyone on the path can read and inject RDMA writes. Lab use only."
                    .to_string(),
            );
            if let Some(k) = ignored_key_file {
                w.push(format!(
                    "wan.key_file = {:?} is ignored because wan.insecure = true",
                    k.display().to_string()
                ));
            }
        }
        if let (WanSecurity::PreSharedKey { .. }, None) = (&self.wan.security, &self.wan.identity) {
            w.push(
                "PSK-only WAN security (wan.key_file without wan.private_key_file and \
                 wan.twin_public_key): no forward secrecy, and anyone with the key file can \
                 decrypt every recorded session and impersonate either twin. Configure identity \
                 keys (soya genkey; docs/wan-protocol.md) on both twins; keep key_file to mix \
                 the PSK in."
                    .to_string(),
            );
        }
        if self.dc.give_up_after < REQUESTER_PATIENCE {
            w.push(format!(
                "dc.give_up_after = {} is less patient than a requester with perftest's \
                 defaults (7 x 67 ms): a responder stall the requester would survive directly \
                 fails the flow through the gateway",
                crate::units::format_duration(self.dc.give_up_after)
            ));
        }
        if self.pseudo_ack.policy == AckPolicy::Off {
            w.push(
                "pseudo_ack.policy = \"off\": the gateway only tunnels; RoCE senders \
                 will see the full WAN round trip"
                    .to_string(),
            );
        }
        w
    }
}
