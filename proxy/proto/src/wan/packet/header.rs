//! The cleartext header every WAN datagram starts with (authenticated as
//! AEAD associated data), and why one is refused.

use thiserror::Error;

use super::wire::Reader;
use super::{HEADER_LEN, MAX_PN, VERSION};

const FLAG_KIND_MASK: u8 = 0b0000_0011;
/// Which of the sender's keys sealed a PROTECTED packet (`keyphase`); 0 in
/// HELLO.
const FLAG_KEY_PHASE: u8 = 0b0000_0100;
const FLAG_CLIENT: u8 = 0b0100_0000;
const FLAG_INSECURE: u8 = 0b1000_0000;
const FLAG_RESERVED: u8 = !(FLAG_KIND_MASK | FLAG_KEY_PHASE | FLAG_CLIENT | FLAG_INSECURE);

/// Why a datagram's cleartext header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum HeaderError {
    #[error("datagram truncated at the header's {0} ({HEADER_LEN} bytes needed)")]
    Truncated(&'static str),
    #[error("protocol version {0}, not {VERSION}")]
    Version(u8),
    #[error("reserved flag bits set ({0:#04x})")]
    ReservedFlags(u8),
    #[error("unknown packet kind {0}")]
    Kind(u8),
    #[error("key phase bit set in a HELLO")]
    HelloKeyPhase,
    #[error("reserved byte is {0:#04x}, not 0")]
    ReservedByte(u8),
    #[error("packet number {0:#x} has its top two bits set")]
    PacketNumber(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// Frames, encrypted and authenticated with the session keys.
    Protected,
    /// Session setup; cleartext body, authenticated with the PSK-derived MAC.
    Hello,
}

/// The 24-byte cleartext header of every datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: PacketKind,
    /// Sender runs without a key (lab mode); keyed receivers refuse it.
    pub insecure: bool,
    /// Sender plays the client role (picks the key direction labels).
    pub client: bool,
    /// Key phase of a PROTECTED packet: flips at each of the sender's key
    /// updates (`wan::keyphase`). Always `false` in HELLO.
    pub key_phase: bool,
    /// Sender's path index; also part of the AEAD nonce.
    pub path: u8,
    /// Session id derived from both nonces (0 in HELLO).
    pub conn_id: u32,
    /// Sender's session generation.
    pub generation: u64,
    /// Per-path packet number (62-bit, never reused under one key).
    pub pn: u64,
}

impl Header {
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        let kind = match self.kind {
            PacketKind::Protected => 0,
            PacketKind::Hello => 1,
        };
        let mut flags = kind;
        if self.client {
            flags |= FLAG_CLIENT;
        }
        if self.insecure {
            flags |= FLAG_INSECURE;
        }
        if self.key_phase && self.kind == PacketKind::Protected {
            flags |= FLAG_KEY_PHASE;
        }
        out[0] = VERSION;
        out[1] = flags;
        out[2] = self.path;
        out[3] = 0;
        out[4..8].copy_from_slice(&self.conn_id.to_be_bytes());
        out[8..16].copy_from_slice(&self.generation.to_be_bytes());
        out[16..24].copy_from_slice(&(self.pn & MAX_PN).to_be_bytes());
    }

    /// Parses the header; refuses a short datagram, another version,
    /// reserved bits set (the key phase bit in a HELLO too) or a packet
    /// number with its top bits set.
    pub fn decode(b: &[u8]) -> Result<Header, HeaderError> {
        use HeaderError::Truncated;
        let mut r = Reader::new(b);
        let version = r.u8().ok_or(Truncated("version"))?;
        if version != VERSION {
            return Err(HeaderError::Version(version));
        }
        let flags = r.u8().ok_or(Truncated("flags"))?;
        if flags & FLAG_RESERVED != 0 {
            return Err(HeaderError::ReservedFlags(flags & FLAG_RESERVED));
        }
        let kind = match flags & FLAG_KIND_MASK {
            0 => PacketKind::Protected,
            1 => PacketKind::Hello,
            k => return Err(HeaderError::Kind(k)),
        };
        let key_phase = flags & FLAG_KEY_PHASE != 0;
        if key_phase && kind == PacketKind::Hello {
            return Err(HeaderError::HelloKeyPhase);
        }
        let path = r.u8().ok_or(Truncated("path"))?;
        let reserved = r.u8().ok_or(Truncated("reserved byte"))?;
        if reserved != 0 {
            return Err(HeaderError::ReservedByte(reserved));
        }
        let conn_id = r.u32().ok_or(Truncated("connection id"))?;
        let generation = r.u64().ok_or(Truncated("generation"))?;
        let pn = r.u64().ok_or(Truncated("packet number"))?;
        if pn > MAX_PN {
            return Err(HeaderError::PacketNumber(pn));
        }
        Ok(Header {
            kind,
            insecure: flags & FLAG_INSECURE != 0,
            client: flags & FLAG_CLIENT != 0,
            key_phase,
            path,
            conn_id,
            generation,
            pn,
        })
    }
}
