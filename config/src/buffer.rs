//! Sizing the deep buffer.
//!
//! The gateway pseudo-ACKs locally, so it owns every byte until the twin
//! confirms it: the buffer must hold at least one bandwidth-delay product of
//! the WAN. With several paths, data striped over a fast short path waits in
//! the buffer for its siblings on the slowest path, so the delay that matters
//! is the *largest* RTT, applied to the *sum* of the path rates:
//!
//! ```text
//! auto size = Σ rate_i × max_i(RTT_i) × safety_factor / 8   bytes, rounded up to a MiB
//! ```
//!
//! The safety factor covers retransmission of lost WAN packets (one more RTT)
//! and bursts. Computed in integers (safety factor to 1/1000) so the result is
//! reproducible bit-for-bit and testable by hand.

use std::time::Duration;

use crate::check::Checker;
use crate::model::{BufferConfig, BufferSizing, WanPath};
use crate::schema::{RawBuffer, StrOrInt};
use crate::units;

pub const DEFAULT_SLOT_BYTES: u32 = 4608;
pub const DEFAULT_SAFETY_FACTOR: f64 = 2.0;
/// The buffer must hold at least this many packet slots.
pub const MIN_SLOTS: u64 = 16;
/// Sanity ceiling: 1 TiB. Anything larger is a typo (or a unit mix-up).
pub const MAX_BYTES: u64 = 1 << 40;
const MIB: u64 = 1 << 20;

/// A byte size given as "4GiB"-style string or integer; `None` = reported.
fn byte_size(c: &mut Checker, path: &str, v: &StrOrInt) -> Option<u64> {
    match v {
        StrOrInt::Int(n) => match u64::try_from(*n) {
            Ok(n) => Some(n),
            Err(_) => {
                c.err(
                    path,
                    format!("must not be negative; expected {}", units::BYTES_ACCEPTED),
                );
                None
            }
        },
        StrOrInt::Str(s) => units::parse_bytes(s).map_err(|e| c.err(path, e.0)).ok(),
    }
}

/// `paths` is `None` when the WAN section had errors: auto sizing is then
/// skipped rather than piling follow-up errors on top.
/// Smallest `buffer.slot_bytes`.
const MIN_SLOT_BYTES: i64 = 1024;
/// Largest `buffer.slot_bytes`; the gateway's packet slab holds at most
/// 65535 bytes a slot (a 16-bit length) and refuses more.
const MAX_SLOT_BYTES: i64 = 16384;
const _: () = assert!(MAX_SLOT_BYTES <= u16::MAX as i64);

pub(crate) fn resolve(
    c: &mut Checker,
    b: &RawBuffer,
    paths: Option<&[WanPath]>,
) -> Option<BufferConfig> {
    let errors_before = c.problems.len();
    let slot_bytes = match b.slot_bytes {
        None => Some(DEFAULT_SLOT_BYTES),
        Some(n) if (MIN_SLOT_BYTES..=MAX_SLOT_BYTES).contains(&n) => u32::try_from(n).ok(),
        Some(_) => {
            c.err(
                "buffer.slot_bytes",
                "slot_bytes must be an integer 1024..=16384",
            );
            None
        }
    };
    let safety_factor = match b.safety_factor {
        None => Some(DEFAULT_SAFETY_FACTOR),
        Some(f) if (1.0..=16.0).contains(&f) => Some(f),
        Some(_) => {
            c.err(
                "buffer.safety_factor",
                "safety_factor must be a number 1.0..=16.0",
            );
            None
        }
    };
    let explicit = match &b.size {
        None => None,
        Some(StrOrInt::Str(s)) if s.trim().eq_ignore_ascii_case("auto") => None,
        Some(v) => Some(byte_size(c, "buffer.size", v)),
    };
    let quota = b
        .per_flow_quota
        .as_ref()
        .map(|q| byte_size(c, "buffer.per_flow_quota", q));
    let (Some(slot_bytes), Some(safety_factor)) = (slot_bytes, safety_factor) else {
        return None;
    };
    let min_bytes = MIN_SLOTS * u64::from(slot_bytes);

    let (bytes, sizing) = match explicit {
        Some(size) => {
            let size = size?;
            if size < min_bytes {
                c.err(
                    "buffer.size",
                    format!(
                        "{} is below the minimum of {MIN_SLOTS} slots x {slot_bytes} bytes \
                     = {min_bytes} bytes",
                        units::format_bytes(size)
                    ),
                );
            } else if size > MAX_BYTES {
                c.err(
                    "buffer.size",
                    format!("{} exceeds the maximum of 1 TiB", units::format_bytes(size)),
                );
            }
            (size, BufferSizing::Explicit)
        }
        None => auto_size(c, paths?, safety_factor, min_bytes)?,
    };
    let per_flow_quota = match quota {
        None => None,
        Some(q) => {
            let q = q?;
            if q < u64::from(slot_bytes) {
                c.err(
                    "buffer.per_flow_quota",
                    format!("per_flow_quota must hold at least one slot ({slot_bytes} bytes)"),
                );
            } else if q > bytes {
                let how = if sizing == BufferSizing::Explicit {
                    ""
                } else {
                    " (auto)"
                };
                c.err(
                    "buffer.per_flow_quota",
                    format!(
                        "per_flow_quota {} exceeds the buffer size {}{how}",
                        units::format_bytes(q),
                        units::format_bytes(bytes)
                    ),
                );
            }
            Some(q)
        }
    };
    if c.problems.len() != errors_before {
        return None;
    }
    Some(BufferConfig {
        bytes,
        sizing,
        safety_factor,
        per_flow_quota,
        slot_bytes,
        slots: bytes / u64::from(slot_bytes),
    })
}

/// Σ rate × max RTT × safety factor, rounded up to a MiB; see the module docs.
fn auto_size(
    c: &mut Checker,
    paths: &[WanPath],
    safety_factor: f64,
    min_bytes: u64,
) -> Option<(u64, BufferSizing)> {
    const WHY: &str = "buffer.size = \"auto\" (the default) needs rate and rtt (or distance_km) \
                       on every WAN path; set them, or give an explicit buffer.size like \"512MiB\"";
    let mut ok = true;
    for (i, p) in paths.iter().enumerate() {
        if p.rate_bps.is_none() {
            c.err(format!("wan.paths[{i}].rate"), format!("missing; {WHY}"));
            ok = false;
        }
        if p.rtt.is_none() {
            c.err(format!("wan.paths[{i}].rtt"), format!("missing; {WHY}"));
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    let total_rate_bps: u64 = paths.iter().filter_map(|p| p.rate_bps).sum();
    let max_rtt = paths
        .iter()
        .filter_map(|p| p.rtt)
        .max()
        .unwrap_or(Duration::ZERO);
    // bits = rate [bit/s] × rtt [ns] / 1e9; bytes = bits / 8; × factor/1000.
    let factor_milli = (safety_factor * 1000.0).round() as u128;
    let numerator = u128::from(total_rate_bps) * max_rtt.as_nanos() * factor_milli;
    let denominator: u128 = 8 * 1_000_000_000 * 1000;
    let unrounded = numerator.div_ceil(denominator);
    let rounded = unrounded.div_ceil(u128::from(MIB)) * u128::from(MIB);
    let bytes = rounded.max(u128::from(min_bytes));
    if bytes > u128::from(MAX_BYTES) {
        c.err(
            "buffer.size",
            format!(
            "auto size {} exceeds the maximum of 1 TiB; lower safety_factor or the path rates, \
             or set an explicit size",
            units::format_bytes(u64::try_from(bytes).unwrap_or(u64::MAX))
        ),
        );
        return None;
    }
    let bytes = u64::try_from(bytes).ok()?;
    Some((
        bytes,
        BufferSizing::Auto {
            total_rate_bps,
            max_rtt,
            unrounded_bytes: u64::try_from(unrounded).unwrap_or(u64::MAX),
        },
    ))
}
