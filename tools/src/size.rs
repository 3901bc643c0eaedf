//! Message sizes as the lab tools take them: the largest message a
//! `soya-perf` run moves, and the size syntax of their command lines.
//! A leaf both `perf` and `demo` use (the demo passes its `--size` on to
//! soya-perf and checks it first), so neither depends on the other for it.

/// Largest message size accepted.
pub const MAX_SIZE: u32 = 64 << 20;

/// Bytes with an optional binary suffix: 4096, 4K, 4KiB, 1M, 1MiB.
pub fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 64K, 1MiB)"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown size unit {unit:?}")),
    };
    n.checked_mul(mult)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert!(parse_size("4G").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("4Q").is_err());
    }
}
