//! `soya plan`'s command line: the binary's (`main.rs`), so that the `soya`
//! library has no argument parser. The checks themselves are the library's
//! (`soya::plan::check_*`), so the messages are the same whether a value
//! comes from the command line or from a `PlanArgs` built in code.
//! (`tests/plan.rs` includes this file too.)

use clap::ArgGroup;
use soya::plan::{self, PlanArgs};

/// `--help` headings of the argument groups.
const RDMA: &str = "RDMA and gateway";
const WORKLOAD: &str = "Data-parallel training step (give all of --gpus, --params, --backward-ms)";

/// `soya plan`: WAN delay, BDP, deep-buffer size, goodput direct vs. through
/// Sōya, and a data-parallel job's AllReduce time vs. its backward pass.
#[derive(clap::Args, Debug, Clone)]
#[command(
    group(ArgGroup::new("delay").required(true).args(["distance_km", "rtt_ms"])),
    after_help = "Example: soya plan --distance-km 300 --link-gbps 100 --paths 2 --loss 0.001 \
                  --gpus 16 --params 1e9 --bytes-per-param 4 --backward-ms 250\n\
                  The model and its formulas are printed under \"Notes\" (and in --json)."
)]
pub struct PlanCli {
    /// Fibre route length between the two sites, in km; RTT = 2 × 4.9 µs/km × km
    #[arg(long, value_name = "KM", value_parser = plan::number_in(plan::check_distance_km),
          allow_negative_numbers = true, help_heading = "WAN")]
    pub distance_km: Option<f64>,

    /// Measured WAN round-trip time in ms, instead of --distance-km
    #[arg(long, value_name = "MS", value_parser = plan::number_in(plan::check_rtt_ms),
          conflicts_with = "distance_km", allow_negative_numbers = true, help_heading = "WAN")]
    pub rtt_ms: Option<f64>,

    /// Line rate of each WAN path, in Gbit/s (before header overhead)
    #[arg(long, value_name = "GBPS", value_parser = plan::number_in(plan::check_link_gbps),
          allow_negative_numbers = true, help_heading = "WAN")]
    pub link_gbps: f64,

    /// Number of WAN paths of --link-gbps each; Sōya stripes over all of them
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=soya_config::MAX_PATHS as i64),
          help_heading = "WAN")]
    pub paths: u32,

    /// WAN packet loss probability per packet, 0 <= P < 1 (0.001 = 0.1 %)
    #[arg(long, value_name = "P", default_value_t = 0.0,
          value_parser = plan::number_in(plan::check_loss), allow_negative_numbers = true,
          help_heading = "WAN")]
    pub loss: f64,

    /// RoCE path MTU in bytes of payload per packet: 1024, 2048 or 4096
    #[arg(long, value_name = "BYTES", default_value_t = 4096, value_parser = plan::parse_mtu,
          allow_negative_numbers = true, help_heading = RDMA)]
    pub mtu: u32,

    /// Requester window per QP, in packets (unacknowledged PSNs; rxe: 128)
    #[arg(long, value_name = "PACKETS", default_value_t = plan::DEFAULT_TX_DEPTH,
          value_parser = clap::value_parser!(u32).range(1..=plan::MAX_TX_DEPTH as i64),
          help_heading = RDMA)]
    pub tx_depth: u32,

    /// Parallel QPs carrying the traffic, a count (e.g. NCCL channels)
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=plan::MAX_QPS as i64),
          help_heading = RDMA)]
    pub qps: u32,

    /// In-DC RTT between requester and gateway, in µs (the pseudo-ACK loop)
    #[arg(long, value_name = "US", default_value_t = plan::DEFAULT_DC_RTT_US,
          value_parser = plan::number_in(plan::check_dc_rtt_us), allow_negative_numbers = true,
          help_heading = RDMA)]
    pub dc_rtt_us: f64,

    /// Deep-buffer size as a multiple of the BDP, 1..=16 (as buffer.safety_factor)
    #[arg(long, value_name = "FACTOR", default_value_t = soya_config::DEFAULT_SAFETY_FACTOR,
          value_parser = plan::number_in(plan::check_safety_factor), allow_negative_numbers = true,
          help_heading = RDMA)]
    pub safety_factor: f64,

    /// Bytes one requester may send past the last pseudo-ACK: send-queue
    /// depth × message size (as buffer.requester_window; 128 × 64 KiB)
    #[arg(long, value_name = "BYTES", default_value_t = soya_config::DEFAULT_REQUESTER_WINDOW,
          value_parser = plan::bytes_in(plan::check_requester_window),
          help_heading = RDMA)]
    pub requester_window: u64,

    /// QPs expected at their full window at once: the buffer keeps room for
    /// their windows (as buffer.requesters)
    #[arg(long, value_name = "N", default_value_t = soya_config::DEFAULT_REQUESTERS,
          value_parser = clap::value_parser!(u32).range(0..=plan::MAX_REQUESTERS as i64),
          help_heading = RDMA)]
    pub requesters: u32,

    /// GPUs in the data-parallel job, a count, split over the two sites
    #[arg(long, value_name = "N", requires_all = ["params", "backward_ms"],
          value_parser = clap::value_parser!(u32).range(2..=plan::MAX_GPUS as i64),
          help_heading = WORKLOAD)]
    pub gpus: Option<u32>,

    /// Model parameters, a count (e.g. 1e9 or 70e9)
    #[arg(long, value_name = "COUNT", requires_all = ["gpus", "backward_ms"],
          value_parser = plan::number_in(plan::check_params), allow_negative_numbers = true,
          help_heading = WORKLOAD)]
    pub params: Option<f64>,

    /// Gradient bytes per parameter, in bytes (4 = fp32, 2 = bf16/fp16)
    #[arg(long, value_name = "BYTES", default_value_t = 4, requires = "gpus",
          value_parser = clap::value_parser!(u32).range(1..=16),
          help_heading = WORKLOAD)]
    pub bytes_per_param: u32,

    /// Backward-pass compute time per step, in ms
    #[arg(long, value_name = "MS", requires_all = ["gpus", "params"],
          value_parser = plan::number_in(plan::check_backward_ms), allow_negative_numbers = true,
          help_heading = WORKLOAD)]
    pub backward_ms: Option<f64>,

    /// NCCL_BUFFSIZE, in bytes (NCCL's default is 4194304): a connection's
    /// receiver grants that much per end-to-end round trip, which no
    /// pseudo-ACK shortens
    #[arg(long, value_name = "BYTES", requires = "gpus", help_heading = WORKLOAD)]
    pub nccl_buffsize: Option<u64>,

    /// NCCL channels: connections per WAN direction, each with its own buffer
    #[arg(long, value_name = "N", requires = "nccl_buffsize", help_heading = WORKLOAD)]
    pub channels: Option<u32>,

    /// Print one JSON object instead of the table
    #[arg(long)]
    pub json: bool,
}

/// clap already refuses part of the workload options (`requires_all`); the
/// library says so too, for a `PlanCli` built otherwise.
impl TryFrom<PlanCli> for PlanArgs {
    type Error = plan::PlanError;
    fn try_from(c: PlanCli) -> Result<PlanArgs, plan::PlanError> {
        Ok(PlanArgs {
            distance_km: c.distance_km,
            rtt_ms: c.rtt_ms,
            link_gbps: c.link_gbps,
            paths: c.paths,
            loss: c.loss,
            mtu: c.mtu,
            tx_depth: c.tx_depth,
            qps: c.qps,
            dc_rtt_us: c.dc_rtt_us,
            safety_factor: c.safety_factor,
            requester_window: c.requester_window,
            requesters: c.requesters,
            json: c.json,
            job: plan::JobArgs::from_flags(
                c.gpus,
                c.params,
                c.bytes_per_param,
                c.backward_ms,
                c.nccl_buffsize,
                c.channels,
            )?,
        })
    }
}
