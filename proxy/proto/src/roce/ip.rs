//! The IP and UDP layers under RoCEv2 (the IP header takes the place of the
//! InfiniBand GRH), plus Ethernet unwrapping for captures and AF_PACKET.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::error::{be16, be32, need, Result, WireError};

/// IANA UDP port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;
pub const UDP_LEN: usize = 8;
pub const IPV4_LEN: usize = 20;
pub const IPV6_LEN: usize = 40;
const PROTO_UDP: u8 = 17;

/// IPv4 header fields that matter to RoCE (no options are ever emitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Header {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// DSCP + ECN; masked out of the ICRC, so rewriting it is free.
    pub tos: u8,
    pub ttl: u8,
    pub id: u16,
    pub dont_frag: bool,
}

/// IPv6 header fields that matter to RoCE (no extension headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Header {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub hop_limit: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpHeader {
    V4(Ipv4Header),
    V6(Ipv6Header),
}

/// Where the UDP datagram sits inside an IP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpSplit {
    pub header: IpHeader,
    /// Length of the IP header, options included.
    pub header_len: usize,
    /// Total length the IP header claims (trailing Ethernet padding excluded).
    pub total_len: usize,
    pub protocol: u8,
}

impl IpHeader {
    /// RoCEv2 defaults (rxe: DF set, TTL from the GRH hop limit).
    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr) -> IpHeader {
        IpHeader::V4(Ipv4Header {
            src,
            dst,
            tos: 0,
            ttl: 64,
            id: 0,
            dont_frag: true,
        })
    }

    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr) -> IpHeader {
        IpHeader::V6(Ipv6Header {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        })
    }

    /// An IPv4 or IPv6 header between the two addresses (which must be of the same family).
    pub fn between(src: IpAddr, dst: IpAddr) -> Option<IpHeader> {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(IpHeader::v4(s, d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => Some(IpHeader::v6(s, d)),
            _ => None,
        }
    }

    pub fn src(&self) -> IpAddr {
        match self {
            IpHeader::V4(h) => h.src.into(),
            IpHeader::V6(h) => h.src.into(),
        }
    }

    pub fn dst(&self) -> IpAddr {
        match self {
            IpHeader::V4(h) => h.dst.into(),
            IpHeader::V6(h) => h.dst.into(),
        }
    }

    /// The DSCP/ECN byte (IPv4 TOS, IPv6 traffic class).
    pub fn tos(&self) -> u8 {
        match self {
            IpHeader::V4(h) => h.tos,
            IpHeader::V6(h) => h.traffic_class,
        }
    }

    /// Same header with source and destination swapped (for answering a packet).
    pub fn reversed(&self) -> IpHeader {
        match *self {
            IpHeader::V4(h) => IpHeader::V4(Ipv4Header {
                src: h.dst,
                dst: h.src,
                ..h
            }),
            IpHeader::V6(h) => IpHeader::V6(Ipv6Header {
                src: h.dst,
                dst: h.src,
                ..h
            }),
        }
    }

    /// Length of the header as emitted.
    pub fn len(&self) -> usize {
        match self {
            IpHeader::V4(_) => IPV4_LEN,
            IpHeader::V6(_) => IPV6_LEN,
        }
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Parses an IP header and checks the lengths agree with the buffer.
    pub fn split(b: &[u8]) -> Result<IpSplit> {
        need(b, 1, "IP header")?;
        match b[0] >> 4 {
            4 => {
                need(b, IPV4_LEN, "IPv4 header")?;
                let ihl = b[0] & 0x0F;
                if ihl < 5 {
                    return Err(WireError::Ipv4HeaderLen(ihl));
                }
                let header_len = usize::from(ihl) * 4;
                need(b, header_len, "IPv4 header with options")?;
                let total_len = usize::from(be16(b, 2));
                if total_len < header_len || total_len > b.len() {
                    return Err(WireError::IpLength {
                        ip_len: total_len,
                        have: b.len(),
                    });
                }
                let frag = be16(b, 6);
                if frag & 0x3FFF != 0 {
                    return Err(WireError::Fragmented);
                }
                Ok(IpSplit {
                    header: IpHeader::V4(Ipv4Header {
                        src: Ipv4Addr::from(be32(b, 12)),
                        dst: Ipv4Addr::from(be32(b, 16)),
                        tos: b[1],
                        ttl: b[8],
                        id: be16(b, 4),
                        dont_frag: frag & 0x4000 != 0,
                    }),
                    header_len,
                    total_len,
                    protocol: b[9],
                })
            }
            6 => {
                need(b, IPV6_LEN, "IPv6 header")?;
                let total_len = IPV6_LEN + usize::from(be16(b, 4));
                if total_len > b.len() {
                    return Err(WireError::IpLength {
                        ip_len: total_len,
                        have: b.len(),
                    });
                }
                let w = be32(b, 0);
                let mut src = [0u8; 16];
                let mut dst = [0u8; 16];
                src.copy_from_slice(&b[8..24]);
                dst.copy_from_slice(&b[24..40]);
                Ok(IpSplit {
                    header: IpHeader::V6(Ipv6Header {
                        src: src.into(),
                        dst: dst.into(),
                        traffic_class: (w >> 20) as u8,
                        flow_label: w & 0xF_FFFF,
                        hop_limit: b[7],
                    }),
                    header_len: IPV6_LEN,
                    total_len,
                    protocol: b[6],
                })
            }
            v => Err(WireError::IpVersion(v)),
        }
    }

    /// Writes the IP header for a packet whose IP payload is `payload_len`
    /// bytes, into `b[..self.len()]`; the IPv4 checksum is filled in.
    pub fn emit(&self, payload_len: usize, b: &mut [u8]) -> Result<()> {
        match self {
            IpHeader::V4(h) => {
                let total = IPV4_LEN + payload_len;
                let total16 = u16::try_from(total).map_err(|_| WireError::TooLarge(total))?;
                let b = &mut b[..IPV4_LEN];
                b[0] = 0x45;
                b[1] = h.tos;
                b[2..4].copy_from_slice(&total16.to_be_bytes());
                b[4..6].copy_from_slice(&h.id.to_be_bytes());
                b[6..8].copy_from_slice(&(if h.dont_frag { 0x4000u16 } else { 0 }).to_be_bytes());
                b[8] = h.ttl;
                b[9] = PROTO_UDP;
                b[10..12].fill(0);
                b[12..16].copy_from_slice(&h.src.octets());
                b[16..20].copy_from_slice(&h.dst.octets());
                let c = ipv4_checksum(b);
                b[10..12].copy_from_slice(&c.to_be_bytes());
            }
            IpHeader::V6(h) => {
                let plen =
                    u16::try_from(payload_len).map_err(|_| WireError::TooLarge(payload_len))?;
                let w =
                    (6u32 << 28) | (u32::from(h.traffic_class) << 20) | (h.flow_label & 0xF_FFFF);
                b[0..4].copy_from_slice(&w.to_be_bytes());
                b[4..6].copy_from_slice(&plen.to_be_bytes());
                b[6] = PROTO_UDP;
                b[7] = h.hop_limit;
                b[8..24].copy_from_slice(&h.src.octets());
                b[24..40].copy_from_slice(&h.dst.octets());
            }
        }
        Ok(())
    }
}

/// The Internet checksum of an IPv4 header whose checksum field is zero.
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    !fold(sum16(h, 0))
}

fn sum16(b: &[u8], mut acc: u32) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc as u16
}

/// UDP checksum over IPv6 (mandatory there; IPv4 RoCE leaves it 0 as rxe does).
/// ICRC masks this field, so filling it in never changes the ICRC.
pub fn udp6_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, udp: &[u8]) -> u16 {
    let mut acc = sum16(&src.octets(), 0);
    acc = sum16(&dst.octets(), acc);
    acc += udp.len() as u32;
    acc += u32::from(PROTO_UDP);
    let c = !fold(sum16(udp, acc));
    if c == 0 {
        0xFFFF
    } else {
        c
    }
}

/// UDP header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpHeader {
    pub src_port: u16,
    pub dst_port: u16,
    /// UDP length (header included).
    pub len: usize,
}

/// The UDP source port rxe picks for a QP pair (rdma_get_udp_sport with flow
/// label 0): the same in both directions. Receivers never check it.
pub fn rxe_udp_sport(lqpn: u32, rqpn: u32) -> u16 {
    let mut v = u64::from(lqpn) * u64::from(rqpn);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xF_FFFF) as u32;
    (((fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14)) | 0xC000) as u16
}

/// Strips Ethernet (and up to two VLAN tags) from a frame, returning the IP packet.
pub fn ethernet_payload(frame: &[u8]) -> Result<&[u8]> {
    need(frame, 14, "Ethernet header")?;
    let mut at = 12;
    let mut ty = be16(frame, at);
    let mut tags = 0;
    while (ty == 0x8100 || ty == 0x88A8) && tags < 2 {
        at += 4;
        need(frame, at + 2, "VLAN tag")?;
        ty = be16(frame, at);
        tags += 1;
    }
    match ty {
        0x0800 | 0x86DD => Ok(&frame[at + 2..]),
        _ => Err(WireError::NotIp(ty)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_sport_is_symmetric_and_in_range() {
        for (a, b) in [(17, 17), (0x11, 0x2a5), (0xFFFFFF, 3)] {
            let s = rxe_udp_sport(a, b);
            assert_eq!(s, rxe_udp_sport(b, a));
            assert!(s >= 0xC000);
        }
    }

    #[test]
    fn ipv4_checksum_known_header() {
        // Header of the ConnectX-4 Lx CNP capture (checksum 0x9161).
        let mut h = hex("45c2003c718c400040110000 0a0011010a001201");
        assert_eq!(ipv4_checksum(&h), 0x9161);
        h[10..12].copy_from_slice(&0x9161u16.to_be_bytes());
        assert_eq!(ipv4_checksum(&h), 0);
    }

    #[test]
    fn split_rejects_lies() {
        let mut h = hex("45000030000040004011 0000 0a000002 0a000001");
        h.resize(0x30, 0);
        assert!(IpHeader::split(&h).is_ok());
        assert!(matches!(
            IpHeader::split(&h[..0x2f]),
            Err(WireError::IpLength { .. })
        ));
        h[0] = 0x44;
        assert_eq!(IpHeader::split(&h), Err(WireError::Ipv4HeaderLen(4)));
        h[0] = 0x45;
        h[6] = 0x20; // MF
        assert_eq!(IpHeader::split(&h), Err(WireError::Fragmented));
        h[0] = 0x55;
        assert_eq!(IpHeader::split(&h), Err(WireError::IpVersion(5)));
    }

    pub(crate) fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
