//! A scenario: topology, impairments and workload; running it gives an
//! [`Outcome`] with figures and every invariant violation found.
//!
//! Split by what a reader comes for: this file says what a scenario is and
//! what a run reports (the knobs a sweep draws, the figures it reads);
//! `build` turns a scenario into a world (links, gateways as a deployment
//! would configure them, endpoints and their QPs); `run` drives the
//! workload through it to the end; `verdict` judges the end state (every
//! invariant a run must hold, and the figures it reports). `run` uses
//! `build` and `verdict`, and they use only this file (no cycle);
//! everything is re-exported here so that callers keep writing
//! `scenario::run`.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Serialize;
use soya_config::AckPolicy;

use super::link::GilbertElliott;
use crate::rc::hw::EndpointModel;

mod build;
mod run;
mod verdict;

pub use build::{auto_buffer_slots, host_line_gbps, seeded_nonces, site_params};
pub(crate) use build::{build, qp_config};
pub(crate) use run::warm_up;
pub use run::{run, run_world};

pub const HOST_A: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
pub const HOST_B: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Write,
    Read,
    Send,
    Atomic,
    /// A random mix of all four.
    Mixed,
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Op, String> {
        Ok(match s {
            "write" => Op::Write,
            "read" => Op::Read,
            "send" => Op::Send,
            "atomic" => Op::Atomic,
            "mixed" => Op::Mixed,
            _ => {
                return Err(format!(
                    "unknown op {s:?}: write, read, send, atomic or mixed"
                ))
            }
        })
    }
}

/// Everything that defines one run. Same scenario, same seed: same result.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub distance_km: f64,
    /// Through Sōya gateways, or host to host.
    pub accelerated: bool,
    pub policy: AckPolicy,
    pub op: Op,
    pub size: u32,
    /// Outstanding work requests per QP (perftest's --tx-depth).
    pub tx_depth: u32,
    pub qps: u32,
    /// Messages per QP.
    pub iters: u32,
    pub mtu: usize,
    /// Capacity of the WAN and of each DC link.
    pub wan_gbps: f64,
    pub dc_gbps: f64,
    /// DC-side one-way delay (host to gateway).
    pub dc_delay: Duration,
    pub wan_loss: f64,
    pub wan_burst: Option<GilbertElliott>,
    pub wan_reorder: f64,
    pub wan_duplicate: f64,
    pub wan_jitter: Duration,
    /// Random loss on the requester's DC link, both directions.
    pub dc_loss: f64,
    /// Host B answers the same workload toward A at the same time.
    pub bidirectional: bool,
    /// Receive WQEs posted at B per QP for SENDs (fewer than messages → RNR).
    pub recv_credits: Option<u32>,
    /// Then one more receive per QP this often (an RNR storm that clears);
    /// `None` with `recv_credits` set: the missing receives never come.
    pub recv_refill: Option<Duration>,
    /// Host B's memory region is smaller than the target VA range: WRITEs
    /// beyond it fail with a remote access error (a responder error).
    pub responder_error: bool,
    /// Give up after this much virtual time.
    pub time_limit: Duration,
    /// `wan.twin_timeout` of both gateways.
    pub twin_timeout: Duration,
    /// Gateway B crashes at this time (from the start of the workload) and
    /// a new incarnation starts at once: whatever it held is gone, and
    /// gateway A resumes the flows toward it (issue 35: it sends again
    /// what B had not delivered), so every transfer must complete with
    /// every byte verified. A QP with requests both ways
    /// (`bidirectional`: B pseudo-ACKed host B's, which died with it) is
    /// not resumable and fails, never silently.
    pub twin_restart: Option<Duration>,
    /// With `twin_restart`: gateway A crashes and restarts instead, the
    /// *near* gateway of host A's requesters (it pseudo-ACKed them; its
    /// new incarnation knows nothing of them, and gateway B must tell it:
    /// `TwinMsg::Orphaned`).
    pub restart_near: bool,
    /// With `twin_restart`: a planned restart instead of a crash
    /// (`systemctl restart`: the gateway drains, says CLOSE "restart" and
    /// a new incarnation starts at once; issue 35). The twin keeps every
    /// flow for it: nothing may fail. A drain that does not end within the
    /// daemon's 5 s says a final CLOSE instead, and the flows fail loudly.
    pub planned_restart: bool,
    /// Each gateway has a standby (issue 38, `sim::standby`): the mirror
    /// link's one-way delay, and how long after its gateway dies a standby
    /// takes over (detection and moving the addresses; what reaches the
    /// gateway in between is lost). With `twin_restart`, the gateway that
    /// dies (B, or A with `restart_near`) does not come back: its standby
    /// takes over, and nothing may fail.
    pub standby: Option<(Duration, Duration)>,
    /// QP 0's responder at B posts no receive (an RNR stall that never
    /// clears) while the other QPs between the same two hosts run: they
    /// must not wait behind it (head of line).
    pub stall_qp0: bool,
    /// WAN paths (each of `wan_gbps`, each with the WAN impairments).
    pub paths: u32,
    /// Cut path 0 at this time (from the start of the workload), for this long.
    pub cut_path: Option<(Duration, Duration)>,
    /// The gateways' WAN session is up before the first request, as with
    /// deployed appliances: the handshake is not part of the measured
    /// transfer. `false`: gateways and workload start together.
    pub warm_start: bool,
    /// The endpoints: rxe-like, or hardware (ConnectX-class).
    pub endpoint: EndpointModel,
    /// Hardware endpoints: connected by RDMA-CM (min_rnr_timer 0, i.e.
    /// 655 ms RNR waits) rather than QPNs exchanged out of band (NCCL).
    pub rdma_cm: bool,
    /// Hardware endpoints: the adaptive 2/4/8/16 ms retransmission timer
    /// (field-observed); off, the configured timeout only (as with
    /// adaptive retransmission disabled in the firmware).
    pub adaptive_timer: bool,
    /// Through the gateways: each QP is connected by an RDMA-CM REQ/REP
    /// exchange through them before the workload starts (with a warm
    /// start), so they learn it as a deployed gateway learns an RDMA-CM
    /// connection, and pseudo-ACK its first packet. Off: they learn it
    /// from its first response (QPNs exchanged out of band, or a gateway
    /// started after the connection), and its first round trip is
    /// tunnelled.
    pub cm_handshake: bool,
    /// The gateways' deep buffer in slots of 4,608 B (`None`: the size a
    /// daemon picks with `buffer.size = "auto"` for this scenario's paths,
    /// [`auto_buffer_slots`]; `soya plan` prints it).
    pub buffer_slots: Option<usize>,
    /// The gateways replace their WAN sending keys this often (as soon as
    /// allowed: `soya_proto::wan` key updates); `None`: the daemon's default
    /// (every 2^22 packets or 2 minutes).
    pub key_update_interval: Option<Duration>,
    /// Check that the QPs share the WAN: when the first QP's transfer is
    /// over, each QP has landed at least this share of an equal share of
    /// what all landed (`sim::oversub::FAIR_SHARE`); `None`: not checked.
    pub fair_share: Option<f64>,
}

/// Packets a requester may have outstanding: rxe's 128 PSNs (or its send
/// queue, if less), a hardware requester's whole send queue.
pub fn requester_window(endpoint: EndpointModel, tx_depth: u32, size: u32, mtu: u32) -> usize {
    let queue = tx_depth as usize * size.div_ceil(mtu) as usize;
    match endpoint {
        EndpointModel::Rxe => queue.min(128),
        EndpointModel::Hw => queue,
    }
}

impl Scenario {
    /// Bytes of one requester window ([`requester_window`]).
    pub fn window_bytes(&self) -> u64 {
        let mtu = self.mtu as u32;
        requester_window(self.endpoint, self.tx_depth, self.size, mtu) as u64 * u64::from(mtu)
    }
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            seed: 1,
            distance_km: 300.0,
            accelerated: true,
            policy: AckPolicy::Edge,
            op: Op::Write,
            size: 65_536,
            tx_depth: 128,
            qps: 1,
            iters: 200,
            mtu: 4096,
            wan_gbps: 10.0,
            dc_gbps: 100.0,
            dc_delay: Duration::from_micros(2),
            wan_loss: 0.0,
            wan_burst: None,
            wan_reorder: 0.0,
            wan_duplicate: 0.0,
            wan_jitter: Duration::ZERO,
            dc_loss: 0.0,
            bidirectional: false,
            recv_credits: None,
            recv_refill: None,
            responder_error: false,
            time_limit: Duration::from_secs(20),
            twin_timeout: soya_config::DEFAULT_TWIN_TIMEOUT,
            twin_restart: None,
            restart_near: false,
            planned_restart: false,
            standby: None,
            stall_qp0: false,
            paths: 1,
            cut_path: None,
            warm_start: true,
            endpoint: EndpointModel::Rxe,
            rdma_cm: true,
            adaptive_timer: true,
            cm_handshake: false,
            buffer_slots: None,
            key_update_interval: None,
            fair_share: None,
        }
    }
}

/// What a run measured and what it found wrong.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    /// The workload ended within the time limit: every QP's work
    /// completed and its data landed, or a failure (as injected) ended it.
    pub finished: bool,
    /// Goodput in Gbit/s: the bytes that landed at their destination and
    /// passed the pattern check (`bytes_verified`) over the run's whole
    /// length (`elapsed_s`). Never what requesters were told (pseudo-ACKs
    /// complete work before the data crossed the WAN), never up to the last
    /// progress only. `None` (null in JSON) when the run did not finish:
    /// a rate of something that never ended means nothing.
    pub goodput_gbps: Option<f64>,
    /// From the start of the workload to its end: the data of every QP at
    /// its destination (or the failure that ended it); for a run that did
    /// not finish, to where it was stopped.
    pub elapsed_s: f64,
    /// With `Scenario::fair_share`: the least any QP landed, over an equal
    /// share, when the first QP's transfer was over.
    pub min_share: Option<f64>,
    /// That share was below `Scenario::fair_share`: what the QPs landed.
    /// Reported apart from `violations` for now: the stated fairness does
    /// not hold in every over-subscribed run yet (docs/benchmarks.md).
    pub unfair: Option<String>,
    /// With `Scenario::fair_share`: the span over which the shares would
    /// be judged was too short to judge them (`verdict::check_fair_share`).
    pub fair_span_short: bool,
    pub messages_ok: u64,
    pub messages_failed: u64,
    pub bytes_completed: u64,
    /// Bytes verified against the pattern at their destination.
    pub bytes_verified: u64,
    /// Bytes acknowledged to an application but never placed.
    pub bytes_lost: u64,
    pub bytes_duplicated: u64,
    pub bytes_misordered: u64,
    pub data_errors: u64,
    pub requester_retransmissions: u64,
    pub requester_timeouts: u64,
    /// Timer expiries after the connection's first ACK: with pseudo-ACKs,
    /// any of these is the gateway's doing (withheld ACKs).
    pub requester_timeouts_after_ack: u64,
    pub implied_naks: u64,
    pub pseudo_acks: u64,
    /// Times a gateway withheld a pseudo-ACK for backpressure, repeated
    /// its last one while withholding, dropped a request for want of
    /// buffer, and sent a CNP.
    pub pseudo_acks_withheld: u64,
    pub hold_acks: u64,
    pub backpressure_drops: u64,
    pub cnps_sent: u64,
    /// Both gateways: resent READs not passed to the responder (their
    /// answer still waited for the WAN), waiting READ responses dropped
    /// as dead (a replay followed them), and the most bytes ever waiting
    /// for the WAN transport at one gateway (`site::replays`).
    pub read_replays_suppressed: u64,
    pub stale_read_responses_dropped: u64,
    pub twin_queue_high_water_bytes: u64,
    pub gw_buffer_high_water: usize,
    pub gw_buffer_left: usize,
    /// Per-flow state of both gateways at the end of the run, besides
    /// buffers, per QP: the engines' half tables with their bookkeeping
    /// and the transports' flow tables, as allocated (so at their high
    /// water). See `QpEngine::state_bytes`, `WanConnection::flow_state_bytes`.
    pub state_bytes_per_qp: u64,
    pub events: u64,
    /// Wall-clock seconds the run took, and events (packet deliveries) per
    /// wall second: the simulator's speed, not a property of the system.
    pub wall_s: f64,
    pub events_per_wall_s: f64,
    /// Both gateways: WAN sending-key updates, and WAN datagrams that
    /// failed authentication (late packets of a key already dropped).
    pub wan_key_updates: u64,
    pub wan_auth_failures: u64,
    /// A planned restart (`Scenario::planned_restart`): whether the drain
    /// ended clean (CLOSE "restart") or timed out (a final CLOSE), and the
    /// seconds from the stop to the new incarnation.
    pub restart_clean: Option<bool>,
    pub restart_pause_s: Option<f64>,
    /// A standby took over (`Scenario::standby`): calls mirrored to it,
    /// sends it made again at takeover (the dead one had not let them
    /// out), and packets that reached gateway A while nobody was there.
    pub standby_mirrored: Option<u64>,
    pub standby_resent: Option<u64>,
    /// Calls to the standby still on the mirror when A died (lost).
    pub standby_lost_on_mirror: Option<u64>,
    /// With standbys: packet bytes gateways A and B mirrored to theirs
    /// over the run (what a mirror link carries besides its own headers).
    pub standby_mirrored_bytes: Option<[u64; 2]>,
    pub lost_while_taking_over: Option<u64>,
    pub violations: Vec<String>,
}
