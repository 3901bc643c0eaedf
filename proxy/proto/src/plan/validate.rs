//! `soya plan`'s validation: one checker per flag, shared by the command
//! line's value parsers ([`number_in`] of the checker, [`parse_mtu`]) and by
//! [`super::plan`] (which also accepts a [`PlanArgs`] built in code).

use super::{
    PlanArgs, PlanError, MAX_CHANNELS, MAX_GPUS, MAX_QPS, MAX_REQUESTERS, MAX_TX_DEPTH, MTUS,
};

fn number(s: &str) -> Result<f64, PlanError> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| PlanError::NotANumber(s.to_owned()))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(PlanError::NotFinite(s.to_owned()))
    }
}

/// A command-line value parser: a byte size ("8MiB", "65536") that `check`
/// accepts, in the site config's units.
pub fn bytes_in(
    check: fn(u64) -> Result<u64, PlanError>,
) -> impl Fn(&str) -> Result<u64, PlanError> + Clone + Send + Sync + 'static {
    move |s| check(soya_config::units::parse_bytes(s).map_err(|e| PlanError::Bytes(e.0))?)
}

/// A command-line value parser: a finite number that `check` accepts.
pub fn number_in(
    check: fn(f64) -> Result<f64, PlanError>,
) -> impl Fn(&str) -> Result<f64, PlanError> + Clone + Send + Sync + 'static {
    move |s| check(number(s)?)
}

fn in_range(
    v: f64,
    lo_exclusive: bool,
    lo: f64,
    hi: f64,
    what: &'static str,
) -> Result<f64, PlanError> {
    let lo_ok = if lo_exclusive { v > lo } else { v >= lo };
    if v.is_finite() && lo_ok && v <= hi {
        Ok(v)
    } else {
        Err(PlanError::OutOfRange { value: v, what })
    }
}

pub fn check_distance_km(v: f64) -> Result<f64, PlanError> {
    in_range(v, true, 0.0, 40_000.0, "distance must be 0 < km <= 40000")
}
pub fn check_rtt_ms(v: f64) -> Result<f64, PlanError> {
    in_range(
        v,
        false,
        0.001,
        10_000.0,
        "RTT must be 0.001 ms (1 µs) to 10000 ms",
    )
}
pub fn check_link_gbps(v: f64) -> Result<f64, PlanError> {
    in_range(
        v,
        false,
        1e-6,
        10_000.0,
        "link rate must be 0.000001 Gbit/s (1 kbit/s) to 10000 Gbit/s",
    )
}
pub fn check_loss(v: f64) -> Result<f64, PlanError> {
    if (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(PlanError::OutOfRange {
            value: v,
            what: "loss is a probability, 0 <= p < 1 (0.001 = 0.1 %)",
        })
    }
}
fn check_mtu(v: u32) -> Result<u32, PlanError> {
    if MTUS.contains(&v) {
        Ok(v)
    } else {
        Err(PlanError::Mtu(v))
    }
}
pub fn check_dc_rtt_us(v: f64) -> Result<f64, PlanError> {
    in_range(
        v,
        false,
        0.1,
        100_000.0,
        "DC RTT must be 0.1 µs to 100000 µs",
    )
}
/// `--requester-window`: as `buffer.requester_window`, 1 byte to 1 GiB.
pub fn check_requester_window(v: u64) -> Result<u64, PlanError> {
    if (1..=soya_config::MAX_REQUESTER_WINDOW).contains(&v) {
        Ok(v)
    } else {
        Err(PlanError::OutOfRange {
            value: v as f64,
            what: "requester window must be 1 byte to 1 GiB",
        })
    }
}

pub fn check_safety_factor(v: f64) -> Result<f64, PlanError> {
    in_range(v, false, 1.0, 16.0, "safety factor must be 1.0 to 16.0")
}
pub fn check_params(v: f64) -> Result<f64, PlanError> {
    in_range(v, false, 1.0, 1e15, "parameter count must be 1 to 1e15")
}
pub fn check_backward_ms(v: f64) -> Result<f64, PlanError> {
    in_range(v, true, 0.0, 1e9, "backward time must be > 0 ms")
}
fn check_nccl_buffsize(v: u64) -> Result<u64, PlanError> {
    in_range(
        v as f64,
        false,
        4096.0,
        (1u64 << 40) as f64,
        "NCCL buffer must be 4 KiB to 1 TiB",
    )
    .map(|_| v)
}
fn check_int(v: u32, lo: u32, hi: u32, what: &'static str) -> Result<u32, PlanError> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(PlanError::IntOutOfRange {
            value: v,
            what,
            lo,
            hi,
        })
    }
}

/// The `--mtu` value parser: a whole number that is a RoCE path MTU.
pub fn parse_mtu(s: &str) -> Result<u32, PlanError> {
    let v: u32 = s
        .trim()
        .parse()
        .map_err(|_| PlanError::MtuText(s.to_owned()))?;
    check_mtu(v)
}

/// Prefixes a range-check message with the flag it is about.
fn flag(name: &'static str) -> impl Fn(PlanError) -> PlanError {
    move |e| PlanError::Flag {
        flag: name,
        source: Box::new(e),
    }
}

/// Every range check, with the flag named, for a `PlanArgs` built in code.
pub(super) fn validate(a: &PlanArgs) -> Result<(), PlanError> {
    match (a.distance_km, a.rtt_ms) {
        (Some(_), Some(_)) => return Err(PlanError::BothDelays),
        (None, None) => return Err(PlanError::NoDelay),
        (Some(km), None) => {
            check_distance_km(km).map_err(flag("distance-km"))?;
        }
        (None, Some(ms)) => {
            check_rtt_ms(ms).map_err(flag("rtt-ms"))?;
        }
    }
    check_link_gbps(a.link_gbps).map_err(flag("link-gbps"))?;
    check_int(a.paths, 1, soya_config::MAX_PATHS as u32, "paths").map_err(flag("paths"))?;
    check_loss(a.loss).map_err(flag("loss"))?;
    check_mtu(a.mtu).map_err(flag("mtu"))?;
    check_int(a.tx_depth, 1, MAX_TX_DEPTH, "tx depth").map_err(flag("tx-depth"))?;
    check_int(a.qps, 1, MAX_QPS, "QP count").map_err(flag("qps"))?;
    check_dc_rtt_us(a.dc_rtt_us).map_err(flag("dc-rtt-us"))?;
    check_safety_factor(a.safety_factor).map_err(flag("safety-factor"))?;
    check_requester_window(a.requester_window).map_err(flag("requester-window"))?;
    check_int(a.requesters, 0, MAX_REQUESTERS, "requester count").map_err(flag("requesters"))?;
    if let Some(j) = &a.job {
        check_int(j.bytes_per_param, 1, 16, "bytes per parameter")
            .map_err(flag("bytes-per-param"))?;
        if let Some(b) = j.nccl_buffsize {
            check_nccl_buffsize(b).map_err(flag("nccl-buffsize"))?;
        }
        if let Some(c) = j.channels {
            check_int(c, 1, MAX_CHANNELS, "channel count").map_err(flag("channels"))?;
        }
        check_int(j.gpus, 2, MAX_GPUS, "GPU count").map_err(flag("gpus"))?;
        check_params(j.params).map_err(flag("params"))?;
        check_backward_ms(j.backward_ms).map_err(flag("backward-ms"))?;
    }
    Ok(())
}
