//! Sizing the deep buffer.
//!
//! The gateway pseudo-ACKs locally, so it owns every byte until the twin
//! confirms it: the buffer must hold at least one bandwidth-delay product of
//! the WAN. With several paths, data striped over a fast short path waits in
//! the buffer for its siblings on the slowest path, so the delay that matters
//! is the *largest* RTT, applied to the *sum* of the path rates:
//!
//! ```text
//! auto size = Σ rate_i × max_i(RTT_i) × safety_factor / 8           (the BDP part)
//!           + requesters × ⌈requester_window / MTU⌉ × slot_bytes     (the reserve)
//!             bytes, rounded up to a MiB
//! ```
//!
//! The safety factor covers retransmission of lost WAN packets and what
//! waits behind them (see [`DEFAULT_SAFETY_FACTOR`]), and bursts. The reserve is the room the ingress keeps free before it
//! pseudo-ACKs (`soya::qp::ingress::acking`): an ACK lets a requester send
//! its whole window (a hardware send queue: depth × message size, 128 ×
//! 64 KiB = 8 MiB), so with the reserve inside a 2 × BDP buffer, 16 such
//! QPs at 400 Gb/s × 300 km took half of it and pseudo-ACKs were withheld
//! all along (0.33 of the lossless goodput at 0.1 % loss,
//! docs/benchmarks.md §8). Each packet takes a whole slot, so the window
//! counts in packets of the largest RoCE MTU a slot holds. Computed in
//! integers (safety factor to 1/1000) so the result is reproducible
//! bit-for-bit and testable by hand.

use std::time::Duration;

use crate::check::Checker;
use crate::model::{BufferConfig, BufferSizing, WanPath};
use crate::schema::{RawBuffer, StrOrInt};
use crate::units;

pub const DEFAULT_SLOT_BYTES: u32 = 4608;
/// Three WAN round trips of data: one for the data in flight and its
/// `Delivered`, one for the retransmission of a WAN loss, and one more
/// because at high rates a loss is nearly always outstanding and each
/// blocks what follows it for a round trip (in-order delivery to the
/// responder, and the `Delivered` of every QP between two hosts on one
/// ordered WAN flow). 16 hardware QPs at 400 Gb/s × 300 km with 0.1 % WAN
/// loss held up to ~105,000 slots (3.3 × BDP) with room to spare; at 2 ×
/// BDP plus the reserve they got 0.80 of the lossless goodput, at 3 × 0.90–0.91
/// over five seeds (docs/benchmarks.md §8). Memory is touched only as it
/// is used (the slab's pages, lazily), so an idle gateway does not pay.
pub const DEFAULT_SAFETY_FACTOR: f64 = 3.0;
/// A ConnectX-class requester's send queue: 128 WQEs × 64 KiB messages
/// (perftest's default tx depth with the message size NCCL-like traffic
/// uses). Over-reserving for rxe (128 PSNs) costs memory, not drops.
pub const DEFAULT_REQUESTER_WINDOW: u64 = 8 * MIB;
/// QPs expected at their full window at once: issue 18's operating point
/// (16 QPs, as an 8-GPU ring's channels or perftest `-q 16`).
pub const DEFAULT_REQUESTERS: u32 = 16;
/// Largest `buffer.requester_window`: 1 GiB (128 × 8 MiB messages).
pub const MAX_REQUESTER_WINDOW: u64 = 1 << 30;
/// Largest `buffer.requesters`.
pub const MAX_REQUESTERS: u32 = 65_536;
/// Headers a slot holds besides the RoCE payload: IPv6 40 + UDP 8 + BTH 12
/// + RETH 16 + ImmDt 4 + ICRC 4 = 84, rounded up.
const SLOT_HEADER_BYTES: u32 = 128;
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

/// Smallest `buffer.slot_bytes`.
const MIN_SLOT_BYTES: i64 = 1024;
/// Largest `buffer.slot_bytes`; the gateway's packet slab holds at most
/// 65535 bytes a slot (a 16-bit length) and refuses more.
const MAX_SLOT_BYTES: i64 = 16384;
const _: () = assert!(MAX_SLOT_BYTES <= u16::MAX as i64);

/// The largest RoCE path MTU (256..=4096) whose packets fit a slot of
/// `slot_bytes`: 4096 for the default 4,608.
pub fn slot_mtu(slot_bytes: u32) -> u32 {
    let room = slot_bytes.saturating_sub(SLOT_HEADER_BYTES);
    [4096, 2048, 1024, 512]
        .into_iter()
        .find(|&m| m <= room)
        .unwrap_or(256)
}

/// A requester window of `window_bytes`, in packets (= slots): the unit the
/// ingress reserves in (`AckTuning::assumed_window_slots`).
pub fn window_slots(window_bytes: u64, slot_bytes: u32) -> u64 {
    window_bytes.div_ceil(u64::from(slot_mtu(slot_bytes)))
}

/// What `buffer.size = "auto"` works out to, part by part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoSize {
    /// Σ rate × max RTT × safety factor / 8, not rounded.
    pub bdp_part_bytes: u64,
    /// requesters × window in slots × slot_bytes.
    pub reserve_bytes: u64,
    /// The sum, not rounded.
    pub unrounded_bytes: u64,
    /// Rounded up to a MiB and to at least [`MIN_SLOTS`] slots; may exceed
    /// [`MAX_BYTES`] (the caller refuses it).
    pub bytes: u64,
}

/// The automatic buffer size (module docs), in integers. The daemon's
/// config and the simulator both size with it, and `soya plan` prints it.
/// Saturates at `u64::MAX` instead of overflowing.
pub fn auto_size_of(
    total_rate_bps: u64,
    max_rtt: Duration,
    safety_factor: f64,
    slot_bytes: u32,
    requester_window: u64,
    requesters: u32,
) -> AutoSize {
    let sat = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    // bits = rate [bit/s] × rtt [ns] / 1e9; bytes = bits / 8; × factor/1000.
    let factor_milli = (safety_factor * 1000.0).round() as u128;
    let numerator = u128::from(total_rate_bps) * max_rtt.as_nanos() * factor_milli;
    let bdp_part = numerator.div_ceil(8 * 1_000_000_000 * 1000);
    let reserve = u128::from(requesters)
        * u128::from(window_slots(requester_window, slot_bytes))
        * u128::from(slot_bytes);
    let unrounded = bdp_part + reserve;
    let rounded = unrounded.div_ceil(u128::from(MIB)) * u128::from(MIB);
    let min_bytes = u128::from(MIN_SLOTS) * u128::from(slot_bytes);
    AutoSize {
        bdp_part_bytes: sat(bdp_part),
        reserve_bytes: sat(reserve),
        unrounded_bytes: sat(unrounded),
        bytes: sat(rounded.max(min_bytes)),
    }
}

/// `paths` is `None` when the WAN section had errors: auto sizing is then
/// skipped rather than piling follow-up errors on top.
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
    let requester_window = match &b.requester_window {
        None => Some(DEFAULT_REQUESTER_WINDOW),
        Some(v) => match byte_size(c, "buffer.requester_window", v) {
            Some(w) if (1..=MAX_REQUESTER_WINDOW).contains(&w) => Some(w),
            Some(w) => {
                c.err(
                    "buffer.requester_window",
                    format!(
                        "{} is out of range: a requester's window (send-queue depth x message \
                         size, e.g. \"8MiB\") must be 1 byte to 1 GiB",
                        units::format_bytes(w)
                    ),
                );
                None
            }
            None => None,
        },
    };
    let requesters = match b.requesters {
        None => Some(DEFAULT_REQUESTERS),
        Some(n) if (0..=i64::from(MAX_REQUESTERS)).contains(&n) => u32::try_from(n).ok(),
        Some(_) => {
            c.err(
                "buffer.requesters",
                format!(
                    "requesters must be an integer 0..={MAX_REQUESTERS} (the QPs expected at \
                     their full window at once)"
                ),
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
    let (Some(slot_bytes), Some(safety_factor), Some(requester_window), Some(requesters)) =
        (slot_bytes, safety_factor, requester_window, requesters)
    else {
        return None;
    };
    let reserve = Reserve {
        slot_bytes,
        requester_window,
        requesters,
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
        None => auto_size(c, paths?, safety_factor, reserve)?,
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
        requester_window,
        requester_window_slots: window_slots(requester_window, slot_bytes),
        requesters,
    })
}

/// The `[buffer]` keys the reserve is sized from.
#[derive(Clone, Copy)]
struct Reserve {
    slot_bytes: u32,
    requester_window: u64,
    requesters: u32,
}

/// [`auto_size_of`] for the configured paths, with errors for what is
/// missing or too large.
fn auto_size(
    c: &mut Checker,
    paths: &[WanPath],
    safety_factor: f64,
    r: Reserve,
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
    let a = auto_size_of(
        total_rate_bps,
        max_rtt,
        safety_factor,
        r.slot_bytes,
        r.requester_window,
        r.requesters,
    );
    if a.bytes > MAX_BYTES {
        c.err(
            "buffer.size",
            format!(
                "auto size {} exceeds the maximum of 1 TiB; lower safety_factor, the path \
                 rates or buffer.requesters x requester_window, or set an explicit size",
                units::format_bytes(a.bytes)
            ),
        );
        return None;
    }
    Some((
        a.bytes,
        BufferSizing::Auto {
            total_rate_bps,
            max_rtt,
            bdp_part_bytes: a.bdp_part_bytes,
            reserve_bytes: a.reserve_bytes,
            unrounded_bytes: a.unrounded_bytes,
        },
    ))
}
