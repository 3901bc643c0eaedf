//! The WAN wire format, version 5: packet header, HELLO body and frames.
//! (Version 2 added the cipher offer to HELLO; version 3 the FIN frame and
//! flow retirement, see `flow`; version 4 the key phase bit and key
//! updates, see `keyphase` and docs/wan-protocol.md; version 5 the
//! identity-key handshake's HELLOs, INITIATION and RESPONSE, see
//! `session::noise`.)
//!
//! Byte layouts are documented in `docs/wan-protocol.md`; keep the two in
//! step. Everything here is pure parsing and emitting: no crypto, no state.
//! Parsers return a typed error on anything malformed ([`HeaderError`],
//! [`HelloError`], [`FrameError`]: plain enums, nothing allocated) instead of
//! panicking, and never index a slice without checking its length first (all
//! reads go through [`Reader`]).
//!
//! One file per thing on the wire, in the order a datagram is read:
//! `header` (the cleartext 24 bytes every datagram starts with), `hello`
//! (the session-setup body), `frames` (what a decrypted payload carries),
//! each with the error its parser returns; `wire` holds the bounds-checked
//! reader and writer they all use (and `msg` too). The sizes below are here
//! because more than one of them (and the transport) needs them; everything
//! is re-exported so that callers keep writing `packet::Frame`.

/// Protocol version carried in byte 0 of every datagram.
pub const VERSION: u8 = 5;
/// Cleartext header (authenticated as AEAD associated data).
pub const HEADER_LEN: usize = 24;
pub use super::cipher::TAG_LEN;
/// Fixed part of a HELLO body.
pub const HELLO_BODY_LEN: usize = 30;
/// A whole HELLO datagram.
pub const HELLO_LEN: usize = HEADER_LEN + HELLO_BODY_LEN + TAG_LEN;
/// Packet numbers are 62-bit: the top two bits are always zero on the wire.
pub const MAX_PN: u64 = (1 << 62) - 1;
/// At most this many ACK ranges in one ACK frame (more is malformed): bounds
/// both the parser's allocation and the receiver's range bookkeeping.
pub const MAX_ACK_RANGES: usize = 32;
/// Worst-case bytes a DATA frame adds around its payload (type, fixed flow id,
/// four varints of at most 8 bytes except the 4-byte-bounded ones).
pub const DATA_OVERHEAD: usize = 1 + 8 + 8 + 8 + 4 + 4 + 4;
/// Worst-case bytes a DATAGRAM frame adds around its payload.
pub const DGRAM_OVERHEAD: usize = 1 + 8 + 4 + 4 + 4;
/// Longest CLOSE reason we emit or accept.
pub const MAX_REASON: usize = 256;

mod frames;
mod header;
mod hello;
#[cfg(test)]
mod tests;
mod wire;

#[cfg(test)]
pub use frames::parse_frames;
pub use frames::{
    check_frames, encode_ack, AckFrame, AckRanges, DataFrame, DatagramFrame, Frame, FrameError,
    Frames,
};
pub use header::{Header, HeaderError, PacketKind};
pub use hello::{Hello, HelloError};
pub use wire::{Reader, Writer, MAX_VARINT};
