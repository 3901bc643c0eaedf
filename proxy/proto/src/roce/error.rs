//! Why a packet was refused. Every parser in `roce` returns one of these
//! instead of panicking: the gateway counts them per reason and drops the packet.

use thiserror::Error;

/// A packet that is not a well-formed RoCEv2 packet, or not one we handle.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("truncated: {what} needs {need} bytes, {have} present")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("unsupported IP version {0}")]
    IpVersion(u8),
    #[error("bad IPv4 header length {0} (words)")]
    Ipv4HeaderLen(u8),
    #[error("IP length {ip_len} disagrees with the {have} bytes present")]
    IpLength { ip_len: usize, have: usize },
    #[error("IP fragment (RoCE packets are never fragmented)")]
    Fragmented,
    #[error("not UDP (IP protocol {0})")]
    NotUdp(u8),
    #[error("not RoCEv2 (UDP destination port {0}, expected 4791)")]
    NotRocePort(u16),
    #[error("UDP length {udp_len} disagrees with the IP payload length {ip_payload}")]
    UdpLength { udp_len: usize, ip_payload: usize },
    #[error("BTH transport version {0} (only 0 exists)")]
    BthVersion(u8),
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    #[error("opcode {opcode:#04x} carries no payload but {len} bytes follow its headers")]
    UnexpectedPayload { opcode: u8, len: usize },
    #[error("opcode {opcode:#04x} must carry {expected} payload bytes, found {len}")]
    PayloadLength {
        opcode: u8,
        expected: usize,
        len: usize,
    },
    #[error("pad count {pad} exceeds the {len} payload bytes")]
    PadCount { pad: u8, len: usize },
    #[error("bad ICRC: packet carries {found:#010x}, computed {computed:#010x}")]
    BadIcrc { found: u32, computed: u32 },
    #[error("headers given do not match opcode {opcode:#04x}: {detail}")]
    HeaderMismatch { opcode: u8, detail: &'static str },
    #[error("output buffer too small: need {need}, have {have}")]
    BufferTooSmall { need: usize, have: usize },
    #[error("packet too large for IPv4/UDP: {0} bytes")]
    TooLarge(usize),
    #[error("not IP (EtherType {0:#06x})")]
    NotIp(u16),
    #[error("not an RDMA-CM MAD: {0}")]
    NotCm(&'static str),
}

pub type Result<T> = std::result::Result<T, WireError>;

/// Checks that `buf` holds at least `need` bytes; names the header in the error.
pub(crate) fn need(buf: &[u8], need: usize, what: &'static str) -> Result<()> {
    if buf.len() < need {
        Err(WireError::Truncated {
            what,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Big-endian readers over slices whose length the caller has checked.
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
pub(crate) fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
