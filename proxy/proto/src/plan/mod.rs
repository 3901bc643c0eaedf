//! `soya plan`: the capacity planner.
//!
//! Pure arithmetic, no I/O except in [`run`]: from the WAN's length and rate
//! it derives the delay, the bandwidth-delay product, the deep buffer each
//! gateway needs, the goodput an RDMA RC requester gets directly over the WAN
//! versus through Sōya, and — for a data-parallel training job — how long the
//! ring AllReduce of one step takes and whether it hides behind the backward
//! pass.
//!
//! # The model
//!
//! **Delay.** Light in fibre covers ~204 km per ms, i.e. 4.9 µs per km one way
//! (the same constant the site config uses for `distance_km`):
//! one-way = 4.9 µs × km, RTT = 2 × one-way. 300 km → 1.47 ms, 2.94 ms.
//! Propagation only (no queueing or equipment delay): use `--rtt-ms` for a
//! measured RTT.
//!
//! **BDP and buffer.** BDP = WAN rate × RTT, with the WAN rate the sum of the
//! paths (`--paths` × `--link-gbps`). The buffer is the config's `auto` size,
//! per site (each gateway holds its outbound direction until the twin
//! confirms it): BDP × safety factor, plus a reserve for the requesters'
//! windows (`--requesters` × `--requester-window`, in 4,608-byte slots of one
//! packet each; the gateway pseudo-ACKs only while that much is free),
//! rounded up to a MiB. Computed by `soya_config::auto_size_of`, the
//! config's own function, so the two agree to the byte.
//!
//! **Wire overhead.** A RoCEv2 packet carries MTU bytes of payload in
//! MTU + 82 bytes of wire time: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 +
//! ICRC 4 + FCS 4 + preamble and inter-frame gap 20. RETH (first packet of a
//! WRITE only) and Sōya's own tunnel header are ignored. So payload at line
//! rate ("line goodput") = rate × MTU / (MTU + 82).
//!
//! **Direct (no Sōya).** The requester may have at most W = `--tx-depth`
//! unacknowledged PSNs in flight per QP, so one QP delivers at most
//! W × MTU per RTT. Each QP is one flow, so it rides one WAN path; at best
//! ECMP spreads N = `--qps` QPs evenly, giving each QP a share
//! s = line goodput per path × min(1, paths / N). Lossless per-QP rate
//! r₀ = min(s, W·MTU·8 / RTT); the time to send one window is
//! c = W·MTU·8 / r₀ (= RTT when window-limited).
//!
//! Under independent per-packet loss p, RC's go-back-N throws away the rest
//! of the window after a loss. Simple model: a window of W packets is lost
//! with probability q = 1 − (1 − p)^W; a lost window costs its own sending
//! time c plus one RTT until the NAK (or timeout) restarts it, and is then
//! sent again whole. The expected time per delivered window is
//! (c + q·RTT) / (1 − q), hence
//!
//! ```text
//! direct per QP = W·MTU·8 · (1 − q) / (c + q·RTT),   q = 1 − (1 − p)^W
//! direct        = N × direct per QP
//! ```
//!
//! This is optimistic for the direct path: a lost *last* packet gets no NAK
//! and waits for the local ACK timeout (milliseconds to seconds).
//!
//! **Through Sōya.** The gateway pseudo-ACKs at the site edge, so the
//! requester's window turns over in the DC RTT (`--dc-rtt-us`) instead of the
//! WAN RTT; Sōya stripes over all paths and retransmits selectively, so a loss
//! costs only the lost packet (expected transmissions per packet 1/(1 − p)):
//!
//! ```text
//! through Sōya = min(N × W·MTU·8 / DC RTT,  line goodput of all paths × (1 − p))
//! ```
//!
//! The host NIC is assumed not to be the bottleneck.
//!
//! **Ring AllReduce.** N GPUs, gradients of G = params × bytes-per-param
//! bytes. In a ring AllReduce every GPU sends 2(N − 1)/N × G bytes per step.
//! The GPUs are split over the two sites, each site's GPUs contiguous in the
//! ring, so exactly two ring edges cross the WAN, one in each direction, and
//! each carries the per-GPU volume: the WAN carries 2(N − 1)/N × G bytes *in
//! each direction* per step (several rings/channels split the data, not
//! multiply it). Intra-site hops (NVLink, local fabric) are assumed faster, so
//! the WAN edge sets the pace:
//!
//! ```text
//! comm = 2(N − 1)/N × G × 8 / goodput      (goodput over `--qps` QPs)
//! idle = max(0, comm − backward)
//! ```
//!
//! With `--nccl-buffsize` (and `--channels`), NCCL's own flow control bounds
//! the rate too: a connection's receiver grants `NCCL_BUFFSIZE` bytes and
//! grants a buffer again only once its data arrived, by an RDMA WRITE that
//! crosses the WAN back to the sender; so at most channels × NCCL_BUFFSIZE
//! per end-to-end RTT (+ DC RTT through Sōya) per direction, whatever the
//! gateways do:
//!
//! ```text
//! rate = min(goodput, channels × NCCL_BUFFSIZE × 8 / RTT)
//! comm = 2(N − 1)/N × G × 8 / rate + RTT
//! ```
//!
//! and the ring's latency is counted: the receivers' first grants cross the
//! WAN one way before the first byte can, and the last chunk one way after
//! it left. `soya-sim allreduce` checks this against the real engines
//! (docs/benchmarks.md).
//!
//! Communication overlaps the backward pass bucket by bucket, so the GPUs only
//! idle when communication outlasts it. Bandwidth term only: the ring's
//! latency (a few WAN one-way delays when pipelined) is not counted.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use soya_config::units::{format_bytes, format_rate};
use thiserror::Error;

/// Light in fibre, one way: 4.9 µs per km (~204 km per ms), as the site
/// config's `distance_km` uses.
pub const FIBRE_NS_PER_KM_ONE_WAY: f64 = 4_900.0;
/// Per-packet RoCEv2 bytes on the wire besides the payload: Ethernet 14 +
/// IPv4 20 + UDP 8 + BTH 12 + ICRC 4 + FCS 4 + preamble/IFG 20.
pub const ROCE_OVERHEAD_BYTES: u32 = 82;
/// The RoCE path MTUs the planner accepts (payload bytes per packet).
pub const MTUS: [u32; 3] = [1024, 2048, 4096];
/// Default requester window in packets: Soft-RoCE (rxe) allows 128
/// unacknowledged PSNs per QP.
pub const DEFAULT_TX_DEPTH: u32 = 128;
/// Default in-DC RTT, microseconds: what the gateway's local ACK loop sees.
pub const DEFAULT_DC_RTT_US: f64 = 10.0;

/// Largest PSN window RC allows: half the 24-bit PSN space.
pub const MAX_TX_DEPTH: u32 = 1 << 23;
/// Most parallel QPs the planner accepts.
pub const MAX_QPS: u32 = 65_536;
/// Most requesters the planner accepts, as `buffer.requesters`.
pub const MAX_REQUESTERS: u32 = soya_config::MAX_REQUESTERS;
/// Most GPUs the planner accepts.
pub const MAX_GPUS: u32 = 1_000_000;
/// Most NCCL channels the planner accepts.
pub const MAX_CHANNELS: u32 = 1024;

/// `soya plan`'s arguments: WAN delay, BDP, deep-buffer size, goodput
/// direct vs. through Sōya, and a data-parallel job's AllReduce time vs. its
/// backward pass. The command line (`soya plan --help`) is the binary's
/// (`src/plan_cli.rs`): this library has no argument parser.
///
/// The plan echoes them as its `inputs` (JSON): the WAN delay as
/// `distance_km` (`null` with `rtt_ms`, which the plan gives itself), and
/// the job's fields only with a job.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct PlanArgs {
    /// Fibre route length between the two sites, in km; RTT = 2 × 4.9 µs/km × km
    pub distance_km: Option<f64>,
    /// Measured WAN round-trip time in ms, instead of `distance_km`
    #[serde(skip)]
    pub rtt_ms: Option<f64>,
    /// Line rate of each WAN path, in Gbit/s (before header overhead)
    pub link_gbps: f64,
    /// Number of WAN paths of `link_gbps` each
    pub paths: u32,
    /// WAN packet loss probability per packet, 0 <= P < 1
    pub loss: f64,
    /// RoCE path MTU in bytes of payload per packet: 1024, 2048 or 4096
    pub mtu: u32,
    /// Requester window per QP, in packets
    pub tx_depth: u32,
    /// Parallel QPs carrying the traffic
    pub qps: u32,
    /// In-DC RTT between requester and gateway, in µs
    pub dc_rtt_us: f64,
    /// Deep-buffer size as a multiple of the BDP, 1..=16
    pub safety_factor: f64,
    /// Bytes one requester may send past the last pseudo-ACK (send-queue
    /// depth × message size), as `buffer.requester_window`
    pub requester_window: u64,
    /// QPs expected at their full window at once, as `buffer.requesters`
    pub requesters: u32,
    /// Print one JSON object instead of the table
    #[serde(skip)]
    pub json: bool,
    /// The data-parallel job, if one is planned for
    #[serde(flatten)]
    pub job: Option<JobArgs>,
}

/// A data-parallel training job: its GPUs, gradients and backward pass
/// (`--gpus`, `--params` and `--backward-ms` go together), and NCCL's
/// buffers if given.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct JobArgs {
    /// GPUs in the data-parallel job
    pub gpus: u32,
    /// Model parameters, a count
    pub params: f64,
    /// Gradient bytes per parameter
    pub bytes_per_param: u32,
    /// Backward-pass compute time per step, in ms
    pub backward_ms: f64,
    /// NCCL's buffer per connection (`NCCL_BUFFSIZE`), bytes: the receiver
    /// grants that much, and no more, per end-to-end round trip
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_buffsize: Option<u64>,
    /// NCCL channels: connections per WAN direction (1 if not given)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<u32>,
}

impl JobArgs {
    /// The job the workload flags describe: none without `gpus`, `params`
    /// and `backward_ms`, an error with only some of them.
    pub fn from_flags(
        gpus: Option<u32>,
        params: Option<f64>,
        bytes_per_param: u32,
        backward_ms: Option<f64>,
        nccl_buffsize: Option<u64>,
        channels: Option<u32>,
    ) -> Result<Option<JobArgs>, PlanError> {
        match (gpus, params, backward_ms) {
            (None, None, None) => Ok(None),
            (Some(gpus), Some(params), Some(backward_ms)) => Ok(Some(JobArgs {
                gpus,
                params,
                bytes_per_param,
                backward_ms,
                nccl_buffsize,
                channels,
            })),
            _ => Err(PlanError::PartialWorkload),
        }
    }
}

/// Why a plan's arguments were refused: the text `soya plan` prints.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PlanError {
    #[error("\"{0}\" is not a number")]
    NotANumber(String),
    #[error("\"{0}\" is not a finite number")]
    NotFinite(String),
    /// Not a byte size; the text says what is accepted.
    #[error("{0}")]
    Bytes(String),
    /// `what` states the rule.
    #[error("{value} is out of range: {what}")]
    OutOfRange { value: f64, what: &'static str },
    #[error("{value} is out of range: {what} must be {lo} to {hi}")]
    IntOutOfRange {
        value: u32,
        what: &'static str,
        lo: u32,
        hi: u32,
    },
    #[error("{0} is not a RoCE path MTU: use 1024, 2048 or 4096 (payload bytes per packet)")]
    Mtu(u32),
    #[error("\"{0}\" is not a RoCE path MTU: use 1024, 2048 or 4096 (payload bytes per packet)")]
    MtuText(String),
    /// A range check, with the flag it is about.
    #[error("--{flag}: {source}")]
    Flag {
        flag: &'static str,
        source: Box<PlanError>,
    },
    #[error("give either --distance-km or --rtt-ms, not both")]
    BothDelays,
    #[error("the WAN delay is missing: give --distance-km KM or --rtt-ms MS")]
    NoDelay,
    #[error(
        "the workload options go together: give all of --gpus, --params and --backward-ms, or none"
    )]
    PartialWorkload,
    /// "BDP" or "buffer".
    #[error("{0} overflows 64 bits")]
    Overflow(&'static str),
}

/// The result of [`plan`]. Rates are payload (goodput) unless named `wan_gbps`.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Plan {
    /// The arguments it was computed from.
    pub inputs: PlanArgs,
    /// One-way propagation delay, ms.
    pub one_way_ms: f64,
    /// WAN round-trip time, ms.
    pub rtt_ms: f64,
    /// Sum of the path line rates, Gbit/s.
    pub wan_gbps: f64,
    /// MTU / (MTU + 82): payload share of the wire.
    pub wire_efficiency: f64,
    /// Payload at line rate over all paths, Gbit/s.
    pub line_goodput_gbps: f64,
    /// Bandwidth-delay product of the WAN (all paths × RTT), bytes, rounded up.
    pub bdp_bytes: u64,
    /// Deep buffer per site: the two parts below, rounded up to a MiB, bytes.
    pub buffer_bytes: u64,
    /// BDP × safety factor, bytes, not rounded.
    pub buffer_bdp_part_bytes: u64,
    /// Room for the requesters' windows: requesters × window in slots ×
    /// slot bytes, not rounded.
    pub buffer_reserve_bytes: u64,
    /// One QP's window over the WAN RTT, W × MTU / RTT, uncapped, Gbit/s.
    pub direct_window_gbps: f64,
    /// One QP's window over the DC RTT, W × MTU / DC RTT, uncapped, Gbit/s.
    pub dc_window_gbps: f64,
    /// q = 1 − (1 − p)^W: probability that a window sees at least one loss.
    pub window_loss_probability: f64,
    /// Goodput of `--qps` QPs directly over the WAN (window-limited,
    /// go-back-N under loss), Gbit/s.
    pub direct_gbps: f64,
    /// Goodput of `--qps` QPs through Sōya, Gbit/s.
    pub accelerated_gbps: f64,
    /// accelerated / direct; `None` (null) when the direct path delivers nothing.
    pub speedup: Option<f64>,
    /// Present with the workload options.
    #[serde(flatten)]
    pub workload: Option<Workload>,
    /// The model, one formula per line.
    pub notes: Vec<String>,
}

/// A data-parallel training step's ring AllReduce over the WAN.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Workload {
    /// params × bytes-per-param, bytes.
    pub gradient_bytes: f64,
    /// 2(N − 1)/N × gradient bytes: what each GPU sends per step, bytes.
    pub allreduce_bytes_per_gpu: f64,
    /// Bytes the WAN carries in each direction per step (one ring edge each way).
    pub wan_bytes_per_direction: f64,
    /// Communication time per step through Sōya, ms.
    pub comm_ms: f64,
    /// max(0, comm − backward), ms.
    pub idle_ms: f64,
    /// comm_ms ≤ backward_ms.
    pub hidden_by_backward: bool,
    /// Communication time per step directly over the WAN, ms; `None` when the
    /// direct path delivers nothing.
    pub direct_comm_ms: Option<f64>,
    pub direct_idle_ms: Option<f64>,
    pub direct_hidden_by_backward: bool,
    /// With `nccl_buffsize`: what NCCL's receiver-driven flow control
    /// allows, channels × NCCL_BUFFSIZE per end-to-end round trip, Gbit/s
    /// (through Sōya; direct it is the same over the WAN RTT alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_window_gbps: Option<f64>,
}

mod validate;

use validate::validate;
pub use validate::{
    bytes_in, check_backward_ms, check_dc_rtt_us, check_distance_km, check_link_gbps, check_loss,
    check_params, check_requester_window, check_rtt_ms, check_safety_factor, number_in, parse_mtu,
};

// ---------------------------------------------------------------------------
// The arithmetic.

/// Computes the plan; see the module docs for the model. Errors name the
/// offending flag (only reachable for a `PlanArgs` built in code: the
/// command line's parsers reject the same values).
pub fn plan(a: &PlanArgs) -> Result<Plan, PlanError> {
    validate(a)?;

    // Delay, in whole nanoseconds like the site config.
    let rtt_ns: u64 = match (a.distance_km, a.rtt_ms) {
        (Some(km), _) => (2.0 * FIBRE_NS_PER_KM_ONE_WAY * km).round() as u64,
        (None, Some(ms)) => (ms * 1e6).round() as u64,
        (None, None) => unreachable!("validated"),
    };
    let rtt_s = rtt_ns as f64 / 1e9;

    // BDP and buffer, in integers (bit/s × ns / 8e9 = bytes).
    let link_bps = (a.link_gbps * 1e9).round() as u64;
    let wan_bps = u128::from(link_bps) * u128::from(a.paths);
    let bits_ns = wan_bps * u128::from(rtt_ns);
    let bdp_bytes = bits_ns.div_ceil(8_000_000_000);
    let buffer = soya_config::auto_size_of(
        u64::try_from(wan_bps).map_err(|_| PlanError::Overflow("buffer"))?,
        Duration::from_nanos(rtt_ns),
        a.safety_factor,
        soya_config::DEFAULT_SLOT_BYTES,
        a.requester_window,
        a.requesters,
    );
    if buffer.bytes == u64::MAX {
        return Err(PlanError::Overflow("buffer"));
    }

    // Goodput, bit/s.
    let mtu = f64::from(a.mtu);
    let w = f64::from(a.tx_depth);
    let n_qps = f64::from(a.qps);
    let paths = f64::from(a.paths);
    let wire_efficiency = mtu / (mtu + f64::from(ROCE_OVERHEAD_BYTES));
    let path_goodput = link_bps as f64 * wire_efficiency;
    let line_goodput = path_goodput * paths;
    let window_bits = w * mtu * 8.0;
    let direct_window = window_bits / rtt_s;
    let dc_window = window_bits / (a.dc_rtt_us * 1e-6);

    // Direct: each QP on one path, QPs spread evenly (best case for ECMP).
    let share = path_goodput * (paths / n_qps).min(1.0);
    let r0 = direct_window.min(share);
    let cycle_s = window_bits / r0;
    // (1 − p)^W and its complement, accurate for small p and large W.
    let log_delivered = w * (-a.loss).ln_1p();
    let delivered = log_delivered.exp();
    let q = -log_delivered.exp_m1();
    let direct = n_qps * window_bits * delivered / (cycle_s + q * rtt_s);

    // Through Sōya.
    let accelerated = (n_qps * dc_window).min(line_goodput * (1.0 - a.loss));

    let speedup = (direct > 0.0).then(|| accelerated / direct);

    let workload = match &a.job {
        Some(j) => {
            let backward_ms = j.backward_ms;
            let n = f64::from(j.gpus);
            let gradient_bytes = j.params * f64::from(j.bytes_per_param);
            let per_gpu = 2.0 * (n - 1.0) / n * gradient_bytes;
            // NCCL's receiver grants its buffers across the WAN: a
            // pseudo-ACK cannot shorten that loop (module docs).
            let nccl = |loop_s: f64| {
                j.nccl_buffsize
                    .map(|b| b as f64 * 8.0 * f64::from(j.channels.unwrap_or(1)) / loop_s)
            };
            let nccl_soya = nccl(rtt_s + a.dc_rtt_us * 1e-6);
            let soya_rate = nccl_soya.map_or(accelerated, |r| r.min(accelerated));
            let direct_rate = nccl(rtt_s).map_or(direct, |r| r.min(direct));
            // With NCCL's flow control modelled, its latency too: the
            // receivers' first grants cross the WAN before the first byte
            // can, and the last chunk crosses after it left (one RTT).
            let latency_ms = if j.nccl_buffsize.is_some() {
                rtt_s * 1e3
            } else {
                0.0
            };
            let comm_ms = per_gpu * 8.0 / soya_rate * 1e3 + latency_ms;
            let direct_comm_ms =
                (direct_rate > 0.0).then(|| per_gpu * 8.0 / direct_rate * 1e3 + latency_ms);
            Some(Workload {
                gradient_bytes,
                allreduce_bytes_per_gpu: per_gpu,
                wan_bytes_per_direction: per_gpu,
                comm_ms,
                idle_ms: (comm_ms - backward_ms).max(0.0),
                hidden_by_backward: comm_ms <= backward_ms,
                direct_comm_ms,
                direct_idle_ms: direct_comm_ms.map(|c| (c - backward_ms).max(0.0)),
                direct_hidden_by_backward: direct_comm_ms.is_some_and(|c| c <= backward_ms),
                nccl_window_gbps: nccl_soya.map(|r| r / 1e9),
            })
        }
        None => None,
    };

    let mut plan = Plan {
        inputs: a.clone(),
        one_way_ms: rtt_ns as f64 / 2e6,
        rtt_ms: rtt_ns as f64 / 1e6,
        wan_gbps: wan_bps as f64 / 1e9,
        wire_efficiency,
        line_goodput_gbps: line_goodput / 1e9,
        bdp_bytes: u64::try_from(bdp_bytes).map_err(|_| PlanError::Overflow("BDP"))?,
        buffer_bytes: buffer.bytes,
        buffer_bdp_part_bytes: buffer.bdp_part_bytes,
        buffer_reserve_bytes: buffer.reserve_bytes,
        direct_window_gbps: direct_window / 1e9,
        dc_window_gbps: dc_window / 1e9,
        window_loss_probability: q,
        direct_gbps: direct / 1e9,
        accelerated_gbps: accelerated / 1e9,
        speedup,
        workload,
        notes: Vec::new(),
    };
    plan.notes = notes(&plan);
    Ok(plan)
}

fn notes(p: &Plan) -> Vec<String> {
    let i = &p.inputs;
    let mut n = Vec::new();
    if i.distance_km.is_some() {
        n.push(
            "delay: light in fibre, 4.9 µs/km one way, propagation only (no queueing or \
             equipment delay); use --rtt-ms for a measured RTT"
                .to_string(),
        );
    }
    n.push(
        "BDP = WAN rate (all paths) × RTT; buffer = BDP × safety factor + requesters × their \
         window (in 4,608 B slots of one packet each) rounded up to a MiB, per site, as the site \
         config's buffer.size = \"auto\": the gateway pseudo-ACKs only while the requesters' \
         windows fit in what is free"
            .to_string(),
    );
    if p.buffer_bytes > soya_config::MAX_BUFFER_BYTES {
        n.push(format!(
            "WARNING: the buffer exceeds the gateway's maximum of {}",
            format_bytes(soya_config::MAX_BUFFER_BYTES)
        ));
    }
    n.push(
        "goodput counts payload only: MTU bytes per MTU + 82 wire bytes (Ethernet 14 + IPv4 20 \
         + UDP 8 + BTH 12 + ICRC 4 + FCS 4 + preamble/IFG 20; RETH and Sōya's tunnel header \
         ignored)"
            .to_string(),
    );
    n.push(
        "direct: window-limited, per QP min(line-rate share, W·MTU/RTT), W = tx depth; one \
         path per QP, QPs spread evenly over the paths (best case)"
            .to_string(),
    );
    n.push(
        "direct under loss p (go-back-N): per QP W·MTU·(1−q)/(c + q·RTT), q = 1−(1−p)^W, \
         c = time to send one window: a window with a loss costs its sending time plus one \
         RTT (NAK) and is resent whole; optimistic, a lost last packet waits for the ACK \
         timeout"
            .to_string(),
    );
    n.push(
        "through Sōya: min(QPs × W·MTU/DC RTT, line rate of all paths × (1−p)); pseudo-ACKs \
         make the requester see only the DC RTT, selective retransmission resends only lost \
         packets; host NIC assumed not the bottleneck"
            .to_string(),
    );
    if p.workload.is_some() {
        n.push(
            "ring AllReduce: each GPU sends 2(N−1)/N × gradient bytes per step; the GPUs of \
             each site are contiguous in the ring, so two ring edges cross the WAN, one each \
             way, each carrying that volume; comm = that volume / goodput (bandwidth term only: \
             intra-site hops assumed faster, ring latency of a few one-way delays not counted)"
                .to_string(),
        );
        n.push(
            "communication overlaps the backward pass bucket by bucket: hidden if comm <= \
             backward, else the GPUs idle max(0, comm − backward) per step"
                .to_string(),
        );
        if i.job.as_ref().is_some_and(|j| j.nccl_buffsize.is_some()) {
            n.push(
                "NCCL: each connection's receiver grants NCCL_BUFFSIZE bytes (8 buffers) and \
                 grants a buffer again only once its data arrived, by a write that crosses the \
                 WAN: at most channels × NCCL_BUFFSIZE per end-to-end RTT, direct or through \
                 Sōya alike (a pseudo-ACK cannot shorten that loop); raise NCCL_BUFFSIZE or \
                 the channels until channels × NCCL_BUFFSIZE ≥ WAN rate × RTT; comm also counts one \
                 RTT of ring latency (the first grants cross the WAN before the first byte, the \
                 last chunk after it left); not counted, so optimistic: small AllReduces \
                 (a step per channel shorter than a WAN crossing: the ring's dependent steps \
                 cross the WAN up to 4 times), and WAN loss, which delays the chunk a lost \
                 packet belongs to by about an RTT on the ring's critical path"
                    .to_string(),
            );
        }
    }
    n
}

// ---------------------------------------------------------------------------
// Presentation.

/// At most three decimals, trailing zeros dropped: 2.940 → "2.94", 98.0 → "98".
fn num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// "1.47 ms", "612.012 ms", "42.057 s".
fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{} s", num(v / 1e3))
    } else {
        format!("{} ms", num(v))
    }
}

/// "1.427 Gbit/s", as `soya check-config` prints rates.
fn gbps(v: f64) -> String {
    format_rate((v * 1e9).round() as u64)
}

/// "0.1 %".
fn percent(v: f64) -> String {
    let p = v * 100.0;
    if p != 0.0 && p < 0.001 {
        format!("{p:.1e} %")
    } else {
        format!("{} %", num(p))
    }
}

/// Parameter counts as typed: 1e9 → "1e9", 1.5e9 → "1.5e9", 350 → "350".
fn count(v: f64) -> String {
    if v >= 1e6 {
        format!("{v:e}")
    } else {
        num(v)
    }
}

/// One table line: label, value, and the formula or reason behind it.
fn row(out: &mut String, label: &str, value: String, why: String) {
    let _ = if why.is_empty() {
        writeln!(out, "  {label:<21} {value}")
    } else {
        writeln!(out, "  {label:<21} {value:<34} {why}")
    };
}

impl Plan {
    /// The human-readable report: figures, the formula behind each, notes.
    pub fn table(&self) -> String {
        let i = &self.inputs;
        let link = gbps(i.link_gbps);
        let wan = match i.distance_km {
            Some(km) => format!("{} km of fibre", num(km)),
            None => format!("{} RTT", ms(self.rtt_ms)),
        };
        let paths = if i.paths == 1 {
            format!("1 WAN path of {link}")
        } else {
            format!("{} WAN paths of {link}", i.paths)
        };
        let loss = if i.loss > 0.0 {
            format!("loss {}", percent(i.loss))
        } else {
            "no loss".to_string()
        };
        let mut out = format!("Sōya capacity plan: {wan}, {paths}, {loss}\n\nWAN\n");
        let one_way_why = match i.distance_km {
            Some(km) => format!("{} km × 4.9 µs/km", num(km)),
            None => "RTT / 2".into(),
        };
        row(&mut out, "one-way delay", ms(self.one_way_ms), one_way_why);
        row(&mut out, "RTT", ms(self.rtt_ms), "2 × one-way".into());
        row(
            &mut out,
            "BDP",
            format_bytes(self.bdp_bytes),
            format!("{} × {}", gbps(self.wan_gbps), ms(self.rtt_ms)),
        );
        row(
            &mut out,
            "deep buffer",
            format_bytes(self.buffer_bytes),
            "per site: the two parts below, rounded up to a MiB".into(),
        );
        row(
            &mut out,
            "  for data in flight",
            format_bytes(self.buffer_bdp_part_bytes),
            format!("BDP × {} safety factor", num(i.safety_factor)),
        );
        row(
            &mut out,
            "  reserve",
            format_bytes(self.buffer_reserve_bytes),
            format!(
                "{} requesters × {} window ({} packets of {} B, a slot each)",
                i.requesters,
                format_bytes(i.requester_window),
                soya_config::window_slots(i.requester_window, soya_config::DEFAULT_SLOT_BYTES),
                soya_config::slot_mtu(soya_config::DEFAULT_SLOT_BYTES),
            ),
        );

        let qps = if i.qps == 1 {
            "1 QP".to_string()
        } else {
            format!("{} QPs", i.qps)
        };
        let _ = writeln!(
            out,
            "\nGoodput, {qps}, MTU {} B, tx depth {} packets",
            i.mtu, i.tx_depth
        );
        row(
            &mut out,
            "payload at line rate",
            gbps(self.line_goodput_gbps),
            format!(
                "{} × {}/({} + {}) payload per wire byte",
                gbps(self.wan_gbps),
                i.mtu,
                i.mtu,
                ROCE_OVERHEAD_BYTES
            ),
        );
        let mut direct_why = format!(
            "window {} × {} B per {} RTT = {} per QP",
            i.tx_depth,
            i.mtu,
            ms(self.rtt_ms),
            gbps(self.direct_window_gbps)
        );
        if i.loss > 0.0 {
            let _ = write!(
                direct_why,
                "; go-back-N: {} of windows hit a loss",
                percent(self.window_loss_probability)
            );
        }
        row(&mut out, "direct", gbps(self.direct_gbps), direct_why);
        let capped = if i.loss > 0.0 {
            "line rate × (1 − loss)"
        } else {
            "line rate"
        };
        row(
            &mut out,
            "through Sōya",
            gbps(self.accelerated_gbps),
            format!(
                "window per {} µs DC RTT = {} per QP, capped at {capped}",
                num(i.dc_rtt_us),
                gbps(self.dc_window_gbps)
            ),
        );
        row(
            &mut out,
            "speedup",
            match self.speedup {
                Some(s) => format!("{}×", num(s)),
                None => "unbounded (direct delivers nothing)".into(),
            },
            String::new(),
        );

        if let (Some(w), Some(j)) = (&self.workload, &i.job) {
            let (gpus, params, bpp, backward) =
                (j.gpus, j.params, j.bytes_per_param, j.backward_ms);
            let _ = writeln!(
                out,
                "\nData-parallel step: {gpus} GPUs over the two sites, {} params × {bpp} B, \
                 ring AllReduce",
                count(params)
            );
            row(
                &mut out,
                "sent per GPU",
                format_bytes(w.allreduce_bytes_per_gpu.round() as u64),
                format!(
                    "2 × {}/{gpus} × {} B of gradients",
                    gpus - 1,
                    num(w.gradient_bytes)
                ),
            );
            row(
                &mut out,
                "over the WAN",
                format_bytes(w.wan_bytes_per_direction.round() as u64),
                "each way: two ring edges cross the WAN, one in each direction".into(),
            );
            if let Some(g) = w.nccl_window_gbps {
                row(
                    &mut out,
                    "NCCL window",
                    gbps(g),
                    format!(
                        "{} channel(s) × {} per end-to-end RTT",
                        j.channels.unwrap_or(1),
                        format_bytes(j.nccl_buffsize.unwrap_or(0))
                    ),
                );
            }
            row(
                &mut out,
                "backward pass",
                ms(backward),
                "communication overlaps it bucket by bucket".into(),
            );
            let verdict = |comm: f64, idle: f64, hidden: bool| {
                if hidden {
                    format!("hidden by backward ({} to spare)", ms(backward - comm))
                } else {
                    format!("NOT hidden: GPUs idle {} per step", ms(idle))
                }
            };
            row(
                &mut out,
                "comm through Sōya",
                ms(w.comm_ms),
                verdict(w.comm_ms, w.idle_ms, w.hidden_by_backward),
            );
            match (w.direct_comm_ms, w.direct_idle_ms) {
                (Some(c), Some(idle)) => row(
                    &mut out,
                    "comm direct",
                    ms(c),
                    verdict(c, idle, w.direct_hidden_by_backward),
                ),
                _ => row(
                    &mut out,
                    "comm direct",
                    "never completes".into(),
                    "direct goodput is 0".into(),
                ),
            }
        }

        out.push_str("\nNotes\n");
        for n in &self.notes {
            let _ = writeln!(out, "  - {n}");
        }
        out
    }
}

/// `soya plan`: prints the table (or JSON with `--json`) to stdout.
pub fn run(args: &PlanArgs) -> ExitCode {
    let plan = match plan(args) {
        Ok(p) => p,
        Err(e) => return refused(&e),
    };
    let text = if args.json {
        match serde_json::to_string_pretty(&plan) {
            Ok(s) => s + "\n",
            Err(e) => {
                eprintln!("soya plan: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        plan.table()
    };
    // A closed pipe (`| head`) ends the output quietly.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

/// `soya plan` refusing its arguments: the reason on stderr, status 2.
pub fn refused(e: &PlanError) -> ExitCode {
    eprintln!("soya plan: {e}");
    ExitCode::from(2)
}
