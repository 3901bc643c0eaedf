//! A whole RoCEv2 packet: a zero-copy parsed view ([`RocePacket`]) and an
//! owned description that can be emitted ([`RoceRepr`]).
//!
//! Input and output are IP packets (what a TUN device carries); use
//! [`super::ip::ethernet_payload`] first for Ethernet frames.

use super::bth::{Bth, BTH_LEN};
use super::error::{be16, need, Result, WireError};
use super::ext::ExtHeaders;
use super::icrc::{self, ICRC_LEN};
use super::ip::{udp6_checksum, IpHeader, UdpHeader, ROCE_PORT, UDP_LEN};
use super::opcode::{OpcodeInfo, Payload};
use super::psn::Psn;

/// A parsed RoCEv2 packet borrowing its bytes.
#[derive(Clone, Copy, Debug)]
pub struct RocePacket<'a> {
    /// The IP packet, trimmed to the length the IP header states.
    bytes: &'a [u8],
    pub ip: IpHeader,
    pub udp: UdpHeader,
    pub bth: Bth,
    pub info: &'static OpcodeInfo,
    pub ext: ExtHeaders,
    payload_at: usize,
    payload_len: usize,
    /// ICRC as carried (not checked by [`RocePacket::parse`]).
    pub icrc: u32,
}

/// Is this IP packet RoCEv2 at all (UDP to port 4791)? A cheap test for
/// classifying traffic before a full parse; malformed packets answer `false`.
pub fn is_roce(ip_packet: &[u8]) -> bool {
    let Ok(split) = IpHeader::split(ip_packet) else {
        return false;
    };
    split.protocol == 17
        && ip_packet.len() >= split.header_len + UDP_LEN
        && be16(ip_packet, split.header_len + 2) == ROCE_PORT
}

impl<'a> RocePacket<'a> {
    /// Parses the structure of an IP packet carrying RoCEv2 and checks every
    /// length; the ICRC is read but not verified (see [`Self::parse_verified`]).
    pub fn parse(ip_packet: &'a [u8]) -> Result<RocePacket<'a>> {
        let split = IpHeader::split(ip_packet)?;
        if split.protocol != 17 {
            return Err(WireError::NotUdp(split.protocol));
        }
        let bytes = &ip_packet[..split.total_len];
        let l4 = split.header_len;
        need(bytes, l4 + UDP_LEN, "UDP header")?;
        let udp = UdpHeader {
            src_port: be16(bytes, l4),
            dst_port: be16(bytes, l4 + 2),
            len: usize::from(be16(bytes, l4 + 4)),
        };
        if udp.dst_port != ROCE_PORT {
            return Err(WireError::NotRocePort(udp.dst_port));
        }
        let ip_payload = bytes.len() - l4;
        if udp.len != ip_payload {
            return Err(WireError::UdpLength {
                udp_len: udp.len,
                ip_payload,
            });
        }
        let bth_at = l4 + UDP_LEN;
        let bth = Bth::parse(&bytes[bth_at..])?;
        let info = bth
            .opcode
            .info()
            .ok_or(WireError::UnknownOpcode(bth.opcode.0))?;
        let ext_at = bth_at + BTH_LEN;
        let ext_len = info.headers.len();
        need(
            bytes,
            ext_at + ext_len + ICRC_LEN,
            "extension headers + ICRC",
        )?;
        let ext = ExtHeaders::parse(info.headers, &bytes[ext_at..ext_at + ext_len]);
        let payload_at = ext_at + ext_len;
        let padded = bytes.len() - ICRC_LEN - payload_at;
        let pad = usize::from(bth.pad);
        if pad > padded {
            return Err(WireError::PadCount {
                pad: bth.pad,
                len: padded,
            });
        }
        let payload_len = padded - pad;
        match info.payload {
            Payload::None if padded != 0 => {
                return Err(WireError::UnexpectedPayload {
                    opcode: info.code,
                    len: padded,
                })
            }
            Payload::Fixed(n) if payload_len != n => {
                return Err(WireError::PayloadLength {
                    opcode: info.code,
                    expected: n,
                    len: payload_len,
                })
            }
            _ => {}
        }
        let icrc = icrc::carried(bytes)?;
        Ok(RocePacket {
            bytes,
            ip: split.header,
            udp,
            bth,
            info,
            ext,
            payload_at,
            payload_len,
            icrc,
        })
    }

    /// [`Self::parse`] plus ICRC verification: what every receive path uses.
    pub fn parse_verified(ip_packet: &'a [u8]) -> Result<RocePacket<'a>> {
        let p = Self::parse(ip_packet)?;
        p.verify_icrc()?;
        Ok(p)
    }

    pub fn verify_icrc(&self) -> Result<()> {
        icrc::verify(self.bytes)
    }

    /// The whole IP packet (ICRC included).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The payload, without pad and ICRC.
    pub fn payload(&self) -> &'a [u8] {
        &self.bytes[self.payload_at..self.payload_at + self.payload_len]
    }

    pub fn psn(&self) -> Psn {
        self.bth.psn
    }

    /// The owned description of this packet (for re-emitting it changed).
    pub fn repr(&self) -> RoceRepr {
        RoceRepr {
            ip: self.ip,
            src_port: self.udp.src_port,
            bth: Bth {
                pad: 0, // recomputed from the payload on emit
                ..self.bth
            },
            ext: self.ext,
        }
    }
}

/// Everything needed to emit a RoCEv2 packet except the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoceRepr {
    pub ip: IpHeader,
    pub src_port: u16,
    /// `bth.pad` is ignored: emit computes it from the payload length.
    pub bth: Bth,
    /// Must carry exactly the headers the opcode table lists for `bth.opcode`.
    pub ext: ExtHeaders,
}

impl RoceRepr {
    /// Bytes [`Self::emit`] writes for a payload of `payload_len` bytes.
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        self.ip.len()
            + UDP_LEN
            + BTH_LEN
            + self.ext.present.len()
            + payload_len
            + pad_for(payload_len)
            + ICRC_LEN
    }

    fn check(&self, payload_len: usize) -> Result<&'static OpcodeInfo> {
        let opcode = self.bth.opcode;
        let info = opcode.info().ok_or(WireError::UnknownOpcode(opcode.0))?;
        if self.ext.present != info.headers {
            return Err(WireError::HeaderMismatch {
                opcode: opcode.0,
                detail: "extension headers differ from the opcode table",
            });
        }
        match info.payload {
            Payload::None if payload_len != 0 => Err(WireError::UnexpectedPayload {
                opcode: opcode.0,
                len: payload_len,
            }),
            Payload::Fixed(n) if payload_len != n => Err(WireError::PayloadLength {
                opcode: opcode.0,
                expected: n,
                len: payload_len,
            }),
            _ => Ok(info),
        }
    }

    /// Writes the complete packet (IP header to ICRC) into `out` and returns
    /// its length. Lengths, pad, checksums and the ICRC are all computed here.
    pub fn emit(&self, payload: &[u8], out: &mut [u8]) -> Result<usize> {
        self.check(payload.len())?;
        let total = self.buffer_len(payload.len());
        if out.len() < total {
            return Err(WireError::BufferTooSmall {
                need: total,
                have: out.len(),
            });
        }
        let out = &mut out[..total];
        let ip_len = self.ip.len();
        let udp_len = total - ip_len;
        let udp16 = u16::try_from(udp_len).map_err(|_| WireError::TooLarge(total))?;
        self.ip.emit(udp_len, out)?;

        let udp = &mut out[ip_len..ip_len + UDP_LEN];
        udp[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&ROCE_PORT.to_be_bytes());
        udp[4..6].copy_from_slice(&udp16.to_be_bytes());
        udp[6..8].fill(0);

        let pad = pad_for(payload.len());
        let bth_at = ip_len + UDP_LEN;
        Bth {
            pad: pad as u8,
            ..self.bth
        }
        .emit(&mut out[bth_at..bth_at + BTH_LEN]);
        let ext_at = bth_at + BTH_LEN;
        let ext_len = self.ext.present.len();
        self.ext.emit(&mut out[ext_at..ext_at + ext_len]);
        let pay_at = ext_at + ext_len;
        out[pay_at..pay_at + payload.len()].copy_from_slice(payload);
        out[pay_at + payload.len()..total - ICRC_LEN].fill(0);
        out[total - ICRC_LEN..].fill(0);

        // The ICRC masks the UDP checksum, but the IPv6 UDP checksum covers
        // the ICRC: seal first.
        icrc::seal(out)?;
        if let IpHeader::V6(h) = &self.ip {
            let c = udp6_checksum(&h.src, &h.dst, &out[ip_len..]);
            out[ip_len + 6..ip_len + 8].copy_from_slice(&c.to_be_bytes());
        }
        Ok(total)
    }

    /// [`Self::emit`] into a fresh vector.
    pub fn to_vec(&self, payload: &[u8]) -> Result<Vec<u8>> {
        let mut v = vec![0; self.buffer_len(payload.len())];
        let n = self.emit(payload, &mut v)?;
        v.truncate(n);
        Ok(v)
    }
}

/// Sets the AckReq bit of a RoCEv2 IP packet's BTH and re-seals it (ICRC,
/// and the UDP checksum where one is carried), so the receiving responder
/// acknowledges this packet. A responder (rxe_resp.c `acknowledge`) sends an
/// ACK for a request only when AckReq is set; a sender that stops at a
/// window edge must ask for one there. Returns whether the packet changed
/// (false if the bit was already set). The packet must parse.
pub fn set_ack_req(ip_packet: &mut [u8]) -> Result<bool> {
    let p = RocePacket::parse(ip_packet)?;
    if p.bth.ack_req {
        return Ok(false);
    }
    let split = IpHeader::split(ip_packet)?;
    let l4 = split.header_len;
    let total = split.total_len;
    ip_packet[l4 + UDP_LEN + 8] |= 0x80;
    icrc::seal(&mut ip_packet[..total])?;
    if be16(ip_packet, l4 + 6) != 0 {
        match split.header {
            IpHeader::V6(h) => {
                ip_packet[l4 + 6..l4 + 8].fill(0);
                let c = udp6_checksum(&h.src, &h.dst, &ip_packet[l4..total]);
                ip_packet[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
            }
            // Optional over IPv4 (rxe sends 0): drop a stale one.
            IpHeader::V4(_) => ip_packet[l4 + 6..l4 + 8].fill(0),
        }
    }
    Ok(true)
}

/// One line for traces and test failures: opcode, addresses, QP and PSN,
/// ` A` when AckReq is set, and the AETH if any.
impl std::fmt::Display for RocePacket<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}->{} qp {:#x} psn {}",
            self.info.name,
            self.ip.src(),
            self.ip.dst(),
            self.bth.dest_qp,
            self.psn()
        )?;
        if self.bth.ack_req {
            f.write_str(" A")?;
        }
        if let Some(a) = self.ext.aeth {
            write!(f, " {:?} msn {}", a.syndrome, a.msn)?;
        }
        Ok(())
    }
}

/// Pad bytes that bring a payload to a multiple of four.
pub const fn pad_for(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}
