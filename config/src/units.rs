//! Human units: link rates ("100gbit"), byte sizes ("4GiB"), durations ("3ms").
//!
//! All parsing is exact integer arithmetic on the decimal digits (no floats),
//! so "2.5Gbps" is exactly 2_500_000_000 bit/s and "1.5GiB" exactly
//! 1_610_612_736 bytes; a value that is not a whole number of the base unit
//! ("0.3KiB" = 307.2 bytes) is rejected rather than silently rounded.
//! Errors always say what is accepted, because they end up verbatim in the
//! operator-facing diagnostic.

use std::time::Duration;

/// What a rate string may look like (used in error messages).
pub const RATE_ACCEPTED: &str = "a rate like \"10gbit\", \"100Mbit\", \"2.5Gbps\" or \"800mbit\": \
     a number, an optional k/m/g/t prefix (x1000) and a bit, bps or b/s suffix";
/// What a byte size may look like (used in error messages).
pub const BYTES_ACCEPTED: &str = "a byte size like \"4GiB\", \"512MiB\" or \"65536\": \
     a number with no unit or B, KB/MB/GB/TB (x1000) or KiB/MiB/GiB/TiB (x1024)";
/// What a duration may look like (used in error messages).
pub const DURATION_ACCEPTED: &str =
    "a duration like \"3ms\", \"1500us\" or \"0.5s\" (units: ns, us or µs, ms, s)";

/// A unit string that could not be parsed; the message names what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(pub String);

/// A non-negative decimal number kept as `digits / 10^scale`.
struct Decimal {
    digits: u128,
    scale: u32,
}

/// Splits "2.5 Gbps" into the number 2.5 and the unit "Gbps".
fn split_number(s: &str, accepted: &str) -> Result<(Decimal, String), UnitError> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let bad = || UnitError(format!("cannot read \"{s}\"; expected {accepted}"));
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(bad());
    }
    let mut digits: u128 = 0;
    for c in int.chars().chain(frac.chars()) {
        let d = u128::from(c.to_digit(10).ok_or_else(bad)?);
        digits = digits
            .checked_mul(10)
            .and_then(|v| v.checked_add(d))
            .ok_or_else(|| UnitError(format!("\"{s}\" is too large")))?;
    }
    let scale = u32::try_from(frac.len()).map_err(|_| bad())?;
    if scale > 30 {
        return Err(UnitError(format!("\"{s}\" has too many decimals")));
    }
    Ok((Decimal { digits, scale }, unit.trim().to_string()))
}

/// `value × multiplier`, which must come out a whole number that fits a u64.
fn whole(s: &str, n: Decimal, multiplier: u128, base: &str) -> Result<u64, UnitError> {
    let divisor = 10u128.pow(n.scale);
    let product = n
        .digits
        .checked_mul(multiplier)
        .ok_or_else(|| UnitError(format!("\"{}\" is too large", s.trim())))?;
    if product % divisor != 0 {
        return Err(UnitError(format!(
            "\"{}\" is not a whole number of {base}",
            s.trim()
        )));
    }
    u64::try_from(product / divisor)
        .map_err(|_| UnitError(format!("\"{}\" is too large", s.trim())))
}

/// Parses a link rate into bits per second: "10gbit", "100Mbit", "2.5Gbps",
/// "800mbit", "1 Tb/s". Prefixes are decimal (k = 1000), as is universal for
/// link rates. Case-insensitive, except that a capital `B` followed by `ps` or
/// `/s` ("GBps", "GB/s") is rejected: by convention that means *bytes* per
/// second, and silently reading it as bits would size buffers 8× too small.
pub fn parse_rate(s: &str) -> Result<u64, UnitError> {
    let (n, unit) = split_number(s, RATE_ACCEPTED)?;
    if unit.ends_with("Bps") || unit.ends_with("B/s") {
        return Err(UnitError(format!(
            "\"{}\": a capital B means bytes per second; rates are in bits: \
             write e.g. \"10gbit\" (accepted: {RATE_ACCEPTED})",
            s.trim()
        )));
    }
    let lower = unit.to_ascii_lowercase();
    let prefix = ["bit/s", "bits", "bit", "bps", "b/s"]
        .iter()
        .find_map(|suffix| lower.strip_suffix(suffix));
    let multiplier: u128 = match prefix {
        Some("") => 1,
        Some("k") => 1_000,
        Some("m") => 1_000_000,
        Some("g") => 1_000_000_000,
        Some("t") => 1_000_000_000_000,
        _ if unit.is_empty() => return Err(no_unit(s, RATE_ACCEPTED)),
        _ => return Err(unknown_unit("rate", &unit, RATE_ACCEPTED)),
    };
    whole(s, n, multiplier, "bits per second")
}

/// Parses a byte size: "4GiB", "512MiB", "65536", "1.5 GB". Both decimal
/// (KB = 1000) and binary (KiB = 1024) units, case-insensitive; a bare number
/// is bytes.
pub fn parse_bytes(s: &str) -> Result<u64, UnitError> {
    let (n, unit) = split_number(s, BYTES_ACCEPTED)?;
    let multiplier: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(unknown_unit("size", &unit, BYTES_ACCEPTED)),
    };
    whole(s, n, multiplier, "bytes")
}

/// Parses a duration: "3ms", "1500us", "1500µs", "0.5s", "250ns". A unit is
/// required: a bare "3" could mean anything.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let (n, unit) = split_number(s, DURATION_ACCEPTED)?;
    let nanos_per_unit: u128 = match unit.to_lowercase().as_str() {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "" => return Err(no_unit(s, DURATION_ACCEPTED)),
        _ => return Err(unknown_unit("duration", &unit, DURATION_ACCEPTED)),
    };
    whole(s, n, nanos_per_unit, "nanoseconds").map(Duration::from_nanos)
}

fn no_unit(s: &str, accepted: &str) -> UnitError {
    UnitError(format!("\"{}\" has no unit; expected {accepted}", s.trim()))
}

/// `kind`: "rate", "size" or "duration".
fn unknown_unit(kind: &str, unit: &str, accepted: &str) -> UnitError {
    UnitError(format!(
        "unknown {kind} unit \"{unit}\"; expected {accepted}"
    ))
}

/// "100 Gbit/s", "2.5 Gbit/s", "800 Mbit/s", "1234 bit/s".
pub fn format_rate(bps: u64) -> String {
    for (div, name) in [
        (1_000_000_000_000u64, "Tbit/s"),
        (1_000_000_000, "Gbit/s"),
        (1_000_000, "Mbit/s"),
        (1_000, "kbit/s"),
    ] {
        if bps >= div {
            return format!("{} {name}", trim_float(bps as f64 / div as f64));
        }
    }
    format!("{bps} bit/s")
}

/// "98 MiB (102760448 bytes)": binary unit for the reader, exact count for grep.
pub fn format_bytes(bytes: u64) -> String {
    for (shift, name) in [(40u32, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        let div = 1u64 << shift;
        if bytes >= div {
            let v = trim_float(bytes as f64 / div as f64);
            return format!("{v} {name} ({bytes} bytes)");
        }
    }
    format!("{bytes} bytes")
}

/// "2.94 ms", "1.5 s", "750 µs".
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns >= 1e9 {
        format!("{} s", trim_float(ns / 1e9))
    } else if ns >= 1e6 {
        format!("{} ms", trim_float(ns / 1e6))
    } else if ns >= 1e3 {
        format!("{} µs", trim_float(ns / 1e3))
    } else {
        format!("{ns} ns")
    }
}

/// At most three decimals, trailing zeros dropped: 2.940 → "2.94", 98.0 → "98".
fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        for (text, want) in [
            ("10gbit", 10_000_000_000),
            ("100Mbit", 100_000_000),
            ("2.5Gbps", 2_500_000_000),
            ("800mbit", 800_000_000),
            ("100gbit", 100_000_000_000),
            ("1 Tb/s", 1_000_000_000_000),
            ("64kbit/s", 64_000),
            ("9600bps", 9_600),
            ("0.5kbit", 500),
        ] {
            assert_eq!(parse_rate(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rate_errors_name_what_is_accepted() {
        let e = parse_rate("10zbit").unwrap_err().0;
        assert!(e.contains("unknown rate unit \"zbit\""), "{e}");
        assert!(e.contains("k/m/g/t"), "{e}");
        let e = parse_rate("10").unwrap_err().0;
        assert!(e.contains("no unit"), "{e}");
        let e = parse_rate("12.5GBps").unwrap_err().0;
        assert!(e.contains("bytes per second"), "{e}");
        assert!(parse_rate("1.5bit").unwrap_err().0.contains("whole number"));
        assert!(parse_rate("gbit").is_err());
        assert!(parse_rate("-1gbit").is_err());
        assert!(parse_rate("1.2.3gbit").is_err());
        assert!(parse_rate("99999999999tbit")
            .unwrap_err()
            .0
            .contains("too large"));
        assert!(parse_rate("").is_err());
    }

    #[test]
    fn byte_sizes() {
        for (text, want) in [
            ("4GiB", 4 * 1024 * 1024 * 1024),
            ("512MiB", 536_870_912),
            ("65536", 65_536),
            ("1.5GiB", 1_610_612_736),
            ("2 KB", 2_000),
            ("1kib", 1_024),
            ("3TB", 3_000_000_000_000),
            ("1TiB", 1_099_511_627_776),
            ("100B", 100),
        ] {
            assert_eq!(parse_bytes(text), Ok(want), "{text}");
        }
        let e = parse_bytes("4G").unwrap_err().0;
        assert!(
            e.contains("unknown size unit \"G\"") && e.contains("KiB"),
            "{e}"
        );
        assert!(parse_bytes("0.3KiB")
            .unwrap_err()
            .0
            .contains("whole number of bytes"));
    }

    #[test]
    fn durations() {
        for (text, want) in [
            ("3ms", Duration::from_millis(3)),
            ("1500us", Duration::from_micros(1500)),
            ("1500µs", Duration::from_micros(1500)),
            ("0.5s", Duration::from_millis(500)),
            ("250ns", Duration::from_nanos(250)),
            ("2.94ms", Duration::from_micros(2940)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        assert!(parse_duration("3").unwrap_err().0.contains("no unit"));
        let e = parse_duration("3min").unwrap_err().0;
        assert!(
            e.contains("unknown duration unit \"min\"") && e.contains("ms"),
            "{e}"
        );
        assert!(parse_duration("0.5ns").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_rate(100_000_000_000), "100 Gbit/s");
        assert_eq!(format_rate(2_500_000_000), "2.5 Gbit/s");
        assert_eq!(format_rate(999), "999 bit/s");
        assert_eq!(format_bytes(102_760_448), "98 MiB (102760448 bytes)");
        assert_eq!(format_bytes(512), "512 bytes");
        assert_eq!(format_duration(Duration::from_micros(2940)), "2.94 ms");
        assert_eq!(format_duration(Duration::from_micros(3724)), "3.724 ms");
        assert_eq!(format_duration(Duration::from_nanos(20)), "20 ns");
    }
}
