//! The invariant CRC that ends every RoCEv2 packet.
//!
//! rxe_icrc.c: a standard reflected CRC-32 (the zlib one) over a pseudo
//! packet: 8 bytes of 0xFF standing for the masked LRH, then the IP header,
//! UDP header, BTH and everything up to the ICRC, with the fields a router
//! may change set to all ones: IPv4 TOS, TTL and header checksum (IPv6
//! traffic class, flow label and hop limit), the UDP checksum, and BTH byte 4
//! (FECN/BECN). The result goes on the wire least-significant byte first.
//!
//! Consequence for the gateway: rewriting DSCP, ECN or TTL is free; changing
//! PSN, QPN, addresses, ports, lengths or AckReq needs a new ICRC.

use super::bth::BTH_LEN;
use super::error::{need, Result, WireError};
use super::ip::{IPV4_LEN, IPV6_LEN, UDP_LEN};

pub const ICRC_LEN: usize = 4;

/// Computes the ICRC of `pkt`, an IP packet *without* its trailing ICRC
/// (IP header, UDP, BTH, ext headers, payload, pad).
pub fn compute(pkt: &[u8]) -> Result<u32> {
    need(pkt, 1, "IP header")?;
    let ip_len = match pkt[0] >> 4 {
        4 => usize::from(pkt[0] & 0x0F) * 4,
        6 => IPV6_LEN,
        v => return Err(WireError::IpVersion(v)),
    };
    if ip_len < IPV4_LEN {
        return Err(WireError::Ipv4HeaderLen(pkt[0] & 0x0F));
    }
    let hdrs = ip_len + UDP_LEN + BTH_LEN;
    need(pkt, hdrs, "IP+UDP+BTH for ICRC")?;

    // The 8 bytes of 0xFF standing for the LRH, then a copy of the variant
    // headers (at most 60 + 8 + 12 bytes) to mask them: one short update
    // for both (a second short update cost as much as the copy). The rest
    // is hashed in place.
    const LRH: usize = 8;
    let mut masked = [0xFFu8; LRH + 60 + UDP_LEN + BTH_LEN];
    let m = &mut masked[LRH..LRH + hdrs];
    m.copy_from_slice(&pkt[..hdrs]);
    if ip_len == IPV6_LEN && pkt[0] >> 4 == 6 {
        m[0] |= 0x0F; // traffic class (low nibble here) ...
        m[1] = 0xFF; // ... and flow label
        m[2] = 0xFF;
        m[3] = 0xFF;
        m[7] = 0xFF; // hop limit
    } else {
        m[1] = 0xFF; // TOS
        m[8] = 0xFF; // TTL
        m[10] = 0xFF; // header checksum
        m[11] = 0xFF;
    }
    m[ip_len + 6] = 0xFF; // UDP checksum
    m[ip_len + 7] = 0xFF;
    m[ip_len + UDP_LEN + 4] = 0xFF; // BTH FECN/BECN/resv6

    let mut h = crc32fast::Hasher::new();
    h.update(&masked[..LRH + hdrs]);
    h.update(&pkt[hdrs..]);
    Ok(h.finalize())
}

/// Reads the ICRC carried in the last four bytes of `pkt` (little-endian on the wire).
pub fn carried(pkt: &[u8]) -> Result<u32> {
    need(pkt, ICRC_LEN, "ICRC")?;
    let n = pkt.len();
    Ok(u32::from_le_bytes([
        pkt[n - 4],
        pkt[n - 3],
        pkt[n - 2],
        pkt[n - 1],
    ]))
}

/// Checks the ICRC of `pkt`, an IP packet that ends with its ICRC.
pub fn verify(pkt: &[u8]) -> Result<()> {
    let found = carried(pkt)?;
    let computed = compute(&pkt[..pkt.len() - ICRC_LEN])?;
    if found == computed {
        Ok(())
    } else {
        Err(WireError::BadIcrc { found, computed })
    }
}

/// Recomputes and stores the ICRC of `pkt` in its last four bytes (after the
/// caller rewrote a covered field such as the PSN or an address).
pub fn seal(pkt: &mut [u8]) -> Result<()> {
    need(pkt, ICRC_LEN, "ICRC")?;
    let n = pkt.len() - ICRC_LEN;
    let c = compute(&pkt[..n])?;
    pkt[n..].copy_from_slice(&c.to_le_bytes());
    Ok(())
}
