//! `soya-perf`: a RoCEv2 RC endpoint in software, driven like perftest.
//!
//! It speaks real RoCEv2 (UDP port 4791, ICRC-correct) through the
//! project's one RC endpoint, [`crate::rc::RcQp`], over plain UDP sockets:
//! no privileges, no RDMA device. Each endpoint binds its own address on port
//! 4791 (loopback aliases such as 127.0.0.2 / 127.0.0.3, or network
//! namespaces). QP details go over TCP (default port 18515) as JSON lines;
//! every payload carries the verifiable pattern of [`crate::rc::memory`], so
//! loss, duplication, corruption or misplacement shows up as data errors.
//!
//! Modules:
//! - [`workload`]: memory layout, the n-th work request, the per-QP driver
//!   (shared with the simulator's workload).
//! - [`wire`]: IP packet <-> UDP payload, keeping the ICRC right.
//! - [`endpoint`]: the socket, batched I/O, demultiplexing by destination QP.
//! - [`exchange`]: the TCP control protocol.
//! - [`client`] / [`server`]: one session each ([`run_client`], [`run_server`]).
//! - [`report`]: [`PerfReport`] (the `--json` object) and the human summary.
//! - [`cli`]: the `soya-perf` command line.
//! - `verbs` (feature `verbs`): the same workloads and checks run by a real
//!   RDMA device through libibverbs (`soya-perf --verbs`).
//!
//! Library use (e.g. `soya demo`): start [`run_server`] (or
//! [`server::Server::bind`] + [`server::Server::serve_one`]) on one thread or
//! process, [`run_client`] on another; each returns its [`PerfReport`]:
//!
//! ```no_run
//! use soya_tools::perf::{run_client, server::Server, ClientConfig, RunLimit, ServerConfig};
//! let mut srv = Server::bind(ServerConfig {
//!     bind_ip: "127.0.0.3".parse().unwrap(),
//!     port: 0, // any free control port
//!     ..ServerConfig::default()
//! })
//! .unwrap();
//! let ctl = srv.control_addr();
//! let server = std::thread::spawn(move || srv.serve_one());
//! let report = run_client(&ClientConfig {
//!     server: ctl,
//!     bind_ip: "127.0.0.2".parse().unwrap(),
//!     limit: RunLimit::Iters(1000),
//!     ..ClientConfig::default()
//! })
//! .unwrap();
//! assert!(report.ok && server.join().unwrap().unwrap().ok);
//! ```
//!
//! Through `soya-wanem` (a WAN between the endpoints): its TUN mode carries
//! the IP packets unchanged, so the ICRC holds; its UDP relay mode would not
//! (the relay's addresses replace the endpoints', which the ICRC and rxe's
//! address check cover). Two namespaces (root):
//!
//! ```text
//! soya-wanem tun --a-dev pwA --b-dev pwB --distance-km 300 &
//! ip netns add perfA; ip netns add perfB
//! ip link set pwA netns perfA; ip link set pwB netns perfB
//! ip -n perfA addr add 10.201.7.1/24 dev pwA; ip -n perfA link set pwA up mtu 9000
//! ip -n perfB addr add 10.201.7.2/24 dev pwB; ip -n perfB link set pwB up mtu 9000
//! ip netns exec perfB soya-perf server --bind-ip 10.201.7.2 &
//! ip netns exec perfA soya-perf client 10.201.7.2 --bind-ip 10.201.7.1 --size 64K
//! ```
//!
//! (MTU 9000 on the TUN devices: RoCE packets of MTU 4096 are 4.2 KB IP
//! packets, sent with DF.)

pub mod client;
pub mod endpoint;
pub mod exchange;
pub mod report;
pub mod server;
#[cfg(feature = "verbs")]
pub mod verbs;
pub mod wire;
pub mod workload;

use std::fmt;
use std::io::Write;

use serde::{Deserialize, Serialize};
use soya_proto::roce::Psn;

pub use client::{run_client, ClientConfig, RunLimit};
pub use report::{LatencyReport, PerfReport};
pub use server::{run_server, ServerConfig};
pub use workload::{Layout, Op, QpDriver};

use crate::rc::QpConfig;

/// VA of every QP's registered memory (any value works; perftest-like).
pub const MEM_BASE: u64 = 0x7f00_0000_0000;
pub use crate::size::MAX_SIZE;
/// Most QPs per session.
pub const MAX_QPS: u32 = 64;
/// Most registered memory per side (all QPs), bytes.
pub const MAX_MEMORY: u64 = 1 << 30;

/// Why a run could not be done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PerfError {
    /// Bad parameters (exit status 2).
    Usage(String),
    /// Setup or protocol failure: cannot bind, connect, or the peer refused.
    Failed(String),
}

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerfError::Usage(m) | PerfError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for PerfError {}

/// Where the once-a-second progress lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ProgressTo {
    #[default]
    Off,
    Stdout,
    Stderr,
}

impl ProgressTo {
    pub(crate) fn line(self, s: &str) {
        match self {
            ProgressTo::Off => {}
            ProgressTo::Stdout => {
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{s}");
                let _ = o.flush();
            }
            ProgressTo::Stderr => eprintln!("{s}"),
        }
    }
}

/// Transports `--transport` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    /// RoCEv2 over a UDP socket (this crate).
    #[default]
    Udp,
    /// A real RDMA device through libibverbs (`--verbs`; the `verbs`
    /// feature, [`verbs`]).
    Verbs,
}

/// What `--transport verbs` answers in this build.
pub const VERBS_UNAVAILABLE: &str = "the verbs transport needs soya-perf built with the `verbs` \
     cargo feature (cargo build -p soya-tools --features verbs) and an RDMA device; this build \
     has only --transport udp";

/// The shape of a run, which both sides must agree on: the client's hello
/// carries it (flattened, so its fields are the hello's own keys) and the
/// server checks it before accepting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub op: Op,
    pub size: u32,
    pub qps: u32,
    pub tx_depth: u32,
    pub mtu: usize,
}

impl Shape {
    /// The limits every transport shares.
    pub fn validate(&self) -> Result<(), String> {
        let Shape {
            op,
            size,
            qps,
            tx_depth,
            mtu,
        } = *self;
        if ![1024, 2048, 4096].contains(&mtu) {
            return Err(format!("--mtu {mtu}: must be 1024, 2048 or 4096"));
        }
        if size == 0 || size > MAX_SIZE {
            return Err(format!("--size {size}: must be 1..={MAX_SIZE} bytes"));
        }
        if op == Op::Atomic && size != 8 {
            return Err(format!(
                "--size {size}: atomics move 8 bytes (use --size 8)"
            ));
        }
        if qps == 0 || qps > MAX_QPS {
            return Err(format!("--qps {qps}: must be 1..={MAX_QPS}"));
        }
        if tx_depth == 0 || tx_depth as usize > crate::rc::DEFAULT_MAX_SEND_WQES {
            return Err(format!(
                "--tx-depth {tx_depth}: must be 1..={}",
                crate::rc::DEFAULT_MAX_SEND_WQES
            ));
        }
        let mem = Layout::new(MEM_BASE, size).mem_size() as u64 * u64::from(qps);
        if mem > MAX_MEMORY {
            return Err(format!(
                "--size {size} x --qps {qps} needs {} MiB of registered memory per side (limit {} MiB)",
                mem >> 20,
                MAX_MEMORY >> 20
            ));
        }
        Ok(())
    }
}

/// The QP attributes both sides use.
pub(crate) fn qp_config(mtu: usize, layout: Layout, rkey: u32) -> QpConfig {
    QpConfig {
        mtu,
        mem_base: layout.base,
        mem_size: layout.mem_size(),
        rkey: Some(rkey),
        ..QpConfig::default()
    }
}

/// The requester's window unless told: rxe's `RXE_MAX_UNACKED_PSNS`.
pub const DEFAULT_WINDOW: u32 = 128;
/// The largest window: half the PSN space, as every RC requester.
pub const MAX_WINDOW: u32 = (1 << 22) - 1;

/// `c` with a requester window of `window` PSNs. The AckReq cadence
/// (every 64 packets by default) is kept at half the window or less, so a
/// small window still asks for ACKs before it closes.
pub(crate) fn with_window(mut c: QpConfig, window: u32) -> QpConfig {
    c.max_unacked_psns = window;
    c.ack_req_every = c.ack_req_every.min((window / 2).max(1));
    c
}

/// A random first PSN, QPN base (room for `n` QPs) and R_Key.
pub(crate) fn random_psn() -> Psn {
    Psn::new(rand::random::<u32>())
}

pub(crate) fn random_qpn_base(n: u32) -> u32 {
    // Away from the reserved QPs 0 and 1, below 2^24.
    0x100 + rand::random::<u32>() % (0xF0_0000 - n)
}

pub(crate) fn random_rkey() -> u32 {
    rand::random::<u32>() | 1
}
