//! `soya-perf --verbs`: the same workloads and data checks as the software
//! endpoint, run by a real RDMA device (rxe, a ConnectX) through libibverbs.
//!
//! QPs are connected through soya-perf's TCP exchange (JSON lines, port
//! 18515: QPN, PSN, GID, R_Key, address), as perftest does without `-R`,
//! not through RDMA-CM: the exchange already exists and carries the run's
//! shape and the server's summary, no librdmacm is needed, and rdma-sys (the
//! only crate binding librdmacm) could not share handles with ibverbs-sys.
//!
//! Memory, per QP, in one registered buffer: the target region of
//! [`Layout`] (two WRITE slots, the READ slot, 64 atomic counters), then a
//! ring of `tx_depth` message slots (sources of WRITEs and SENDs,
//! destinations of READs and fetched atomic values; the server receives
//! SENDs there). Patterns are those of [`crate::rc::memory`], addressed by
//! the layout's VAs (`MEM_BASE + offset`), so both sides agree whatever
//! address the buffer got.
//!
//! What is verified, where:
//! - WRITE: the device reports no placement at the responder, so the
//!   server checks at the end that each WRITE slot holds, intact, the last
//!   message the client completed for it (waiting up to `--drain-timeout`,
//!   since a gateway's pseudo-ACKs complete WRITEs before they are placed).
//! - SEND: every message received is checked, in order (its `msg_seq`).
//! - READ: every message read is checked at the client (the READ slot's
//!   pattern), into a ring slot zeroed before the READ is posted.
//! - Atomics (fetch-and-add 1 on counter `n % 64`): message `n` must fetch
//!   `n / 64` (RC executes them in order); the server checks every counter's
//!   final value.
//!
//! Only `device.rs` is unsafe.

mod device;
mod session;

pub use device::device_names;
pub use session::{run_client, serve};

/// What `--verbs` adds to a client's or server's configuration.
#[derive(Clone, Debug, Default)]
pub struct VerbsOptions {
    /// `--device`: the RDMA device (default: the first one).
    pub device: Option<String>,
    /// `--gid-index`: the GID (RoCEv2: an IPv4-mapped one) of port 1.
    pub gid_index: u8,
    /// `--qp-timeout`: the QP's local ACK timeout, 4.096 µs × 2^n (perftest
    /// `-u`; default 14 = 67 ms).
    pub qp_timeout: u8,
}

pub(crate) fn gid_hex(g: [u8; 16]) -> String {
    g.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn gid_parse(s: &str) -> Result<[u8; 16], String> {
    let mut g = [0u8; 16];
    if s.len() != 32 || !s.is_ascii() {
        return Err(format!("bad GID {s:?}"));
    }
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| format!("bad GID {s:?}"))?;
    }
    Ok(g)
}

/// A GID as people read it (an IPv4-mapped one as the address).
pub(crate) fn gid_show(g: [u8; 16]) -> String {
    if g[..10] == [0; 10] && g[10..12] == [0xff, 0xff] {
        format!("{}.{}.{}.{}", g[12], g[13], g[14], g[15])
    } else {
        std::net::Ipv6Addr::from(g).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_round_trip_and_bad_ones_are_refused() {
        let g = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 1];
        assert_eq!(gid_parse(&gid_hex(g)), Ok(g));
        assert_eq!(gid_show(g), "10.0.1.1");
        assert!(gid_parse("00").is_err());
        assert!(gid_parse(&"zz".repeat(16)).is_err());
        // 32 bytes whose 2-byte slices cut a character: refused, no panic
        assert!(gid_parse(&format!("0{}0", "é".repeat(15))).is_err());
    }
}
