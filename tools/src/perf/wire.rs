//! RoCEv2 over a plain UDP socket: converting between the IP packets
//! [`RcQp`](crate::rc::RcQp) emits and consumes and the UDP payloads (BTH
//! onward) a socket sends and receives.
//!
//! The ICRC covers the IP addresses, the IPv4 ID and flags, the IP and UDP
//! lengths and both UDP ports (it masks only TOS/TTL/checksums and the BTH
//! FECN/BECN byte). So:
//!
//! - **Send** ([`to_udp_payload`]): the socket is bound to `local_ip:4791`, so
//!   the datagram leaves with UDP source port 4791 — not the port `RcQp`
//!   wrote (rxe's `rxe_udp_sport(lqpn, rqpn)`, 0xC000 | hash). We rewrite the
//!   source port in the packet to the socket's port and recompute the ICRC,
//!   then send the bytes after the UDP header. What goes on the wire is then a
//!   RoCEv2 packet whose ICRC is right for its real headers (a capture on
//!   `lo`, a NIC or a Sōya gateway verify it). The extra CRC pass goes away
//!   when `RcQp` can be told its UDP source port (the check is skipped when
//!   the port already matches). The IPv4 header the kernel writes must also
//!   be `RcQp`'s: DF set and ID 0, which is what an unconnected socket with
//!   `IP_PMTUDISC_DO` sends ([`super::endpoint`] sets it; UDP GSO breaks it,
//!   numbering the segments' IDs).
//! - **Receive** ([`Rebuild`]): in front of the datagram we write the IP and
//!   UDP headers the sender's kernel sent: source = the address and port
//!   `recvfrom` reports, destination = our address and port 4791, and the
//!   fixed fields exactly as `RcQp` emits them (IPv4 ID 0, DF, TTL 64, UDP
//!   checksum 0). The ICRC then verifies iff the datagram is what the peer
//!   sent, which `RcQp::handle_packet` checks.

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

use soya_proto::roce::icrc::{self, ICRC_LEN};
use soya_proto::roce::ip::{IPV4_LEN, IPV6_LEN, ROCE_PORT, UDP_LEN};
use soya_proto::roce::{IpHeader, WireError};

/// Room in front of a received datagram for the largest rebuilt header.
pub const HEADROOM: usize = IPV6_LEN + UDP_LEN;

/// Length of the IP header of an IP packet `RcQp` emitted (no options).
fn ip_header_len(pkt: &[u8]) -> Result<usize, WireError> {
    match pkt.first().map(|b| b >> 4) {
        Some(4) => Ok(usize::from(pkt[0] & 0x0F) * 4),
        Some(6) => Ok(IPV6_LEN),
        Some(v) => Err(WireError::IpVersion(v)),
        None => Err(WireError::Truncated {
            what: "IP header",
            need: 1,
            have: 0,
        }),
    }
}

/// Prepares `pkt`, a whole IP packet `RcQp` emitted, to be sent from a UDP
/// socket bound to port `sport`: sets the UDP source port to `sport`,
/// recomputing the ICRC if it changed, and returns where the UDP payload
/// (BTH .. ICRC) lies in `pkt`.
pub fn to_udp_payload(pkt: &mut [u8], sport: u16) -> Result<Range<usize>, WireError> {
    let l4 = ip_header_len(pkt)?;
    let start = l4 + UDP_LEN;
    if pkt.len() < start + ICRC_LEN {
        return Err(WireError::Truncated {
            what: "RoCE packet",
            need: start + ICRC_LEN,
            have: pkt.len(),
        });
    }
    let port = sport.to_be_bytes();
    if pkt[l4..l4 + 2] != port {
        pkt[l4..l4 + 2].copy_from_slice(&port);
        let n = pkt.len();
        let crc = icrc::compute(&pkt[..n - ICRC_LEN])?;
        pkt[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    }
    Ok(start..pkt.len())
}

/// The IP + UDP header a peer's datagrams arrived with, to rebuild in front
/// of each one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rebuild {
    ip: IpHeader,
    sport: u16,
    /// Header length: 28 (IPv4) or 48 (IPv6).
    len: usize,
}

impl Rebuild {
    /// For datagrams from `peer` to `local_ip` (same address family).
    pub fn new(peer: SocketAddr, local_ip: IpAddr) -> Option<Rebuild> {
        let ip = IpHeader::between(peer.ip(), local_ip)?;
        let len = match ip {
            IpHeader::V4(_) => IPV4_LEN,
            IpHeader::V6(_) => IPV6_LEN,
        } + UDP_LEN;
        Some(Rebuild {
            ip,
            sport: peer.port(),
            len,
        })
    }

    /// `buf[HEADROOM..HEADROOM + len]` holds a datagram: writes the headers
    /// right before it and returns the IP packet's range in `buf`.
    pub fn apply(&self, buf: &mut [u8], len: usize) -> Range<usize> {
        let start = HEADROOM - self.len;
        let ip_len = self.ip.len();
        let udp_len = UDP_LEN + len;
        // Cannot fail: 48 bytes of headroom and datagrams under 64 KiB.
        let _ = self.ip.emit(udp_len, &mut buf[start..HEADROOM]);
        let u = &mut buf[start + ip_len..HEADROOM];
        u[0..2].copy_from_slice(&self.sport.to_be_bytes());
        u[2..4].copy_from_slice(&ROCE_PORT.to_be_bytes());
        u[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        u[6..8].fill(0);
        start..HEADROOM + len
    }
}

/// The BTH destination QP of a datagram (BTH bytes 5..8), if it has a BTH.
pub fn dest_qp(datagram: &[u8]) -> Option<u32> {
    let b = datagram.get(5..8)?;
    Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

/// The BTH destination QP of a whole RoCEv2 IP packet (UDP port 4791).
pub fn ip_dest_qp(pkt: &[u8]) -> Option<u32> {
    let l4 = ip_header_len(pkt).ok()?;
    let udp = pkt.get(l4..l4 + UDP_LEN)?;
    if u16::from_be_bytes([udp[2], udp[3]]) != ROCE_PORT {
        return None;
    }
    dest_qp(&pkt[l4 + UDP_LEN..])
}

/// A plain UDP packet from `src` to `dst`'s discard port (9): how a lab host
/// announces its UDP address to a Sōya gateway's `udp` backend. IPv4 only
/// (`None` otherwise).
pub fn announce_packet(src: IpAddr, dst: IpAddr) -> Option<Vec<u8>> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (src, dst) else {
        return None;
    };
    let mut p = vec![0u8; 28];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&28u16.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let ck = soya_proto::roce::ip::ipv4_checksum(&p[..20]);
    p[10..12].copy_from_slice(&ck.to_be_bytes());
    p[20..22].copy_from_slice(&9u16.to_be_bytes());
    p[22..24].copy_from_slice(&9u16.to_be_bytes());
    p[24..26].copy_from_slice(&8u16.to_be_bytes());
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rc::{QpAddr, QpConfig, RcQp, WorkRequest};
    use soya_proto::roce::{Psn, RocePacket};

    fn pair(a: &str, b: &str) -> (RcQp, RcQp) {
        let a = QpAddr {
            ip: a.parse().unwrap(),
            qpn: 0x123,
        };
        let b = QpAddr {
            ip: b.parse().unwrap(),
            qpn: 0x456,
        };
        let cfg = QpConfig {
            mem_size: 1 << 16,
            ..QpConfig::default()
        };
        (
            RcQp::new(cfg.clone(), a, b, Psn::new(1), Psn::new(2)).unwrap(),
            RcQp::new(cfg, b, a, Psn::new(2), Psn::new(1)).unwrap(),
        )
    }

    /// Strip on one side, rebuild on the other: the ICRC verifies, the
    /// packet is the original but for the UDP source port, and the peer
    /// accepts it.
    /// The IP packet of a 10-byte SEND from `a` to `b`, as it leaves `a`.
    fn a_small_send(a: &str, b: &str) -> Vec<u8> {
        let (mut qa, _) = pair(a, b);
        qa.post_send(WorkRequest::Send { len: 10, imm: None })
            .unwrap();
        let mut buf = vec![0u8; qa.max_packet_len()];
        let n = qa
            .poll_transmit(soya_proto::time::Time::ZERO, &mut buf)
            .unwrap();
        buf.truncate(n);
        buf
    }

    fn round_trip(a: &str, b: &str) {
        let (mut qa, mut qb) = pair(a, b);
        let rkey = qb.memory().rkey();
        let base = qb.memory().base();
        qa.post_send(WorkRequest::Write {
            remote_va: base,
            rkey,
            len: 6000,
            imm: None,
        })
        .unwrap();
        let mut buf = vec![0u8; qa.max_packet_len()];
        let mut rx = vec![0u8; HEADROOM + qa.max_packet_len()];
        let peer: SocketAddr = SocketAddr::new(a.parse().unwrap(), ROCE_PORT);
        let rb = Rebuild::new(peer, b.parse().unwrap()).unwrap();
        let mut sent = 0;
        while let Some(n) = qa.poll_transmit(soya_proto::time::Time::ZERO, &mut buf) {
            let orig = buf[..n].to_vec();
            assert!(RocePacket::parse_verified(&orig).is_ok());
            let r = to_udp_payload(&mut buf[..n], ROCE_PORT).unwrap();
            let dgram = &buf[r.clone()];
            assert_eq!(dest_qp(dgram), Some(0x456));
            rx[HEADROOM..HEADROOM + dgram.len()].copy_from_slice(dgram);
            let ip = rb.apply(&mut rx, dgram.len());
            let p = RocePacket::parse_verified(&rx[ip.clone()]).expect("ICRC verifies");
            assert_eq!(p.udp.src_port, ROCE_PORT);
            // Identical to what RcQp emitted except the source port, the
            // UDP checksum (IPv6; masked by the ICRC, checked by the
            // kernel) and the ICRC.
            let l4 = orig.len() - dgram.len() - UDP_LEN;
            let got = &rx[ip.clone()];
            assert_eq!(got[..l4], orig[..l4]);
            assert_eq!(got[l4 + 2..l4 + 6], orig[l4 + 2..l4 + 6]);
            assert_eq!(got[l4 + 8..got.len() - 4], orig[l4 + 8..orig.len() - 4]);
            qb.handle_packet(soya_proto::time::Time::ZERO, &rx[ip]);
            sent += 1;
        }
        assert_eq!(sent, 2);
        assert_eq!(qb.stats().malformed_dropped, 0);
        assert_eq!(qb.stats().misaddressed_dropped, 0);
        assert_eq!(qb.memory().stats().writes_placed, 1);
        assert_eq!(qb.stats().data_errors, 0);
    }

    #[test]
    fn ipv4_round_trip() {
        round_trip("127.0.0.2", "127.0.0.3");
    }

    #[test]
    fn ipv6_round_trip() {
        round_trip("fd00::1", "fd00::2");
    }

    #[test]
    fn ip_in_udp_helpers() {
        let buf = a_small_send("10.1.0.1", "10.2.0.1");
        assert_eq!(ip_dest_qp(&buf), Some(0x456));
        let a = announce_packet("10.1.0.1".parse().unwrap(), "10.2.0.1".parse().unwrap()).unwrap();
        assert_eq!(a.len(), 28);
        assert_eq!(ip_dest_qp(&a), None);
        assert!(announce_packet("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()).is_none());
    }

    #[test]
    fn wrong_source_port_fails_the_icrc() {
        let mut buf = a_small_send("127.0.0.2", "127.0.0.3");
        let r = to_udp_payload(&mut buf, ROCE_PORT).unwrap();
        let len = r.len();
        let mut rx = vec![0u8; HEADROOM + len];
        rx[HEADROOM..].copy_from_slice(&buf[r]);
        let peer = SocketAddr::new("127.0.0.2".parse().unwrap(), 5000);
        let ip = Rebuild::new(peer, "127.0.0.3".parse().unwrap())
            .unwrap()
            .apply(&mut rx, len);
        assert!(RocePacket::parse_verified(&rx[ip]).is_err());
    }
}
