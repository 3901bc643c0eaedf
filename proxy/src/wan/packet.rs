//! The WAN wire format, version 3: packet header, HELLO body and frames.
//! (Version 2 added the cipher offer to HELLO; version 3 the FIN frame and
//! flow retirement, see `flow` and docs/wan-protocol.md.)
//!
//! Byte layouts are documented in `docs/wan-protocol.md`; keep the two in
//! step. Everything here is pure parsing and emitting: no crypto, no state.
//! Parsers return a typed error on anything malformed ([`HeaderError`],
//! [`HelloError`], [`FrameError`]: plain enums, nothing allocated) instead of
//! panicking, and never index a slice without checking its length first (all
//! reads go through [`Reader`]).

use thiserror::Error;

use super::cipher::CipherOffer;

/// Protocol version carried in byte 0 of every datagram.
pub const VERSION: u8 = 3;
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

const FLAG_KIND_MASK: u8 = 0b0000_0011;
const FLAG_CLIENT: u8 = 0b0100_0000;
const FLAG_INSECURE: u8 = 0b1000_0000;
const FLAG_RESERVED: u8 = !(FLAG_KIND_MASK | FLAG_CLIENT | FLAG_INSECURE);

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
    #[error("reserved byte is {0:#04x}, not 0")]
    ReservedByte(u8),
    #[error("packet number {0:#x} has its top two bits set")]
    PacketNumber(u64),
}

/// Why a HELLO body was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum HelloError {
    #[error("HELLO body of {0} bytes, not {HELLO_BODY_LEN}")]
    Length(usize),
    #[error("unknown HELLO flags {0:#06x}")]
    Flags(u16),
    #[error("HELLO nonce is 0")]
    ZeroNonce,
}

/// Why a decrypted payload's frames were refused (the first fault found).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    #[error("{frame} frame truncated at its {field}")]
    Truncated {
        frame: &'static str,
        field: &'static str,
    },
    #[error("{frame} frame: {field} {value} does not fit in 32 bits")]
    TooLarge {
        frame: &'static str,
        field: &'static str,
        value: u64,
    },
    #[error("{frame} frame says {len} bytes, {left} left in the packet")]
    LyingLength {
        frame: &'static str,
        len: u64,
        left: usize,
    },
    #[error("{frame} frame: fragment of {len} bytes at {frag_off} outside a message of {total}")]
    Fragment {
        frame: &'static str,
        frag_off: u32,
        len: u64,
        total: u32,
    },
    #[error("CLOSE reason of {0} bytes (at most {MAX_REASON})")]
    ReasonTooLong(u64),
    #[error("ACK frame with {0} extra ranges (fewer than {MAX_ACK_RANGES} allowed)")]
    TooManyRanges(u64),
    #[error("ACK frame's largest packet number {0:#x} is past 2^62")]
    AckLargest(u64),
    #[error("ACK frame range {0} reaches below packet number 0")]
    AckBelowZero(usize),
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
        out[0] = VERSION;
        out[1] = flags;
        out[2] = self.path;
        out[3] = 0;
        out[4..8].copy_from_slice(&self.conn_id.to_be_bytes());
        out[8..16].copy_from_slice(&self.generation.to_be_bytes());
        out[16..24].copy_from_slice(&(self.pn & MAX_PN).to_be_bytes());
    }

    /// Parses the header; refuses a short datagram, another version,
    /// reserved bits set or a packet number with its top bits set.
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
            path,
            conn_id,
            generation,
            pn,
        })
    }
}

/// The cleartext body of a HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Sender's session nonce (never 0).
    pub nonce: u64,
    /// The peer nonce the sender saw last (0: none yet). Echoing the
    /// receiver's current nonce proves the HELLO is fresh.
    pub echo: u64,
    /// Initial per-flow credit the sender grants (bytes).
    pub flow_window: u64,
    /// Largest datagram the sender sends.
    pub max_datagram: u16,
    /// The sender has committed to the session of (its nonce, `echo`): it
    /// only needs a protected packet from the receiver, not another HELLO.
    pub committed: bool,
    /// The ciphers the sender accepts and prefers ([`CipherOffer::NONE`] in
    /// lab mode). Not checked here: bits unknown to this version are allowed
    /// (see [`super::cipher::agree`]).
    pub offer: CipherOffer,
}

impl Hello {
    pub fn encode(&self, out: &mut [u8; HELLO_BODY_LEN]) {
        out[0..8].copy_from_slice(&self.nonce.to_be_bytes());
        out[8..16].copy_from_slice(&self.echo.to_be_bytes());
        out[16..24].copy_from_slice(&self.flow_window.to_be_bytes());
        out[24..26].copy_from_slice(&self.max_datagram.to_be_bytes());
        out[26..28].copy_from_slice(&u16::from(self.committed).to_be_bytes());
        out[28] = self.offer.accept;
        out[29] = self.offer.prefer;
    }

    pub fn decode(b: &[u8]) -> Result<Hello, HelloError> {
        let bytes: &[u8; HELLO_BODY_LEN] = b.try_into().map_err(|_| HelloError::Length(b.len()))?;
        let u64_at = |i: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&bytes[i..i + 8]);
            u64::from_be_bytes(v)
        };
        let (nonce, echo, flow_window) = (u64_at(0), u64_at(8), u64_at(16));
        let max_datagram = u16::from_be_bytes([bytes[24], bytes[25]]);
        let flags = u16::from_be_bytes([bytes[26], bytes[27]]);
        let (accept, prefer) = (bytes[28], bytes[29]);
        if flags > 1 {
            return Err(HelloError::Flags(flags));
        }
        if nonce == 0 {
            return Err(HelloError::ZeroNonce);
        }
        Ok(Hello {
            nonce,
            echo,
            flow_window,
            max_datagram,
            committed: flags == 1,
            offer: CipherOffer { accept, prefer },
        })
    }
}

/// An ACK frame as received: which packets of one path's number space
/// arrived. A view of the frame's bytes (checked when the packet was
/// parsed), whose ranges are decoded as they are iterated: no vector, and
/// nothing larger than a few words to move around, for a frame that comes
/// with nearly every packet. Built with [`encode_ack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckFrame<'a> {
    /// Path whose packet numbers are acknowledged.
    pub path: u8,
    /// Time the receiver held the largest packet before acknowledging (µs).
    pub delay_us: u64,
    largest: u64,
    /// Ranges after the first.
    extra: usize,
    /// The first range's length, then (gap, length) per extra range.
    body: &'a [u8],
}

impl<'a> AckFrame<'a> {
    pub fn largest(&self) -> u64 {
        self.largest
    }

    /// Inclusive ranges `(smallest, largest)`, strictly descending and
    /// disjoint (non-adjacent); never empty.
    pub fn ranges(&self) -> AckRanges<'a> {
        AckRanges {
            r: Reader::new(self.body),
            hi: Some(self.largest),
            left: self.extra + 1,
            lo: 0,
        }
    }
}

/// The ranges of an [`AckFrame`], decoded one by one.
pub struct AckRanges<'a> {
    r: Reader<'a>,
    /// The next range's largest packet number (`None` before a gap is read).
    hi: Option<u64>,
    left: usize,
    lo: u64,
}

impl Iterator for AckRanges<'_> {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let hi = match self.hi.take() {
            Some(hi) => hi,
            None => {
                let gap = self.r.varint()?;
                self.lo.checked_sub(gap)?.checked_sub(2)?
            }
        };
        let len = self.r.varint()?;
        self.lo = hi.checked_sub(len)?;
        Some((self.lo, hi))
    }

    /// Exact: the frame was checked when parsed.
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for AckRanges<'_> {}

/// Appends an ACK frame for `path` with `ranges` (strictly descending,
/// disjoint, at most [`MAX_ACK_RANGES`]) to `w`; `false` (and `w`
/// unchanged) if it does not fit or the ranges are not like that.
pub fn encode_ack(
    w: &mut Writer<'_>,
    path: u8,
    delay_us: u64,
    ranges: impl ExactSizeIterator<Item = (u64, u64)>,
) -> bool {
    let mark = w.len();
    let ok = encode_ack_inner(w, path, delay_us, ranges);
    if !ok {
        w.truncate(mark);
    }
    ok
}

fn encode_ack_inner(
    w: &mut Writer<'_>,
    path: u8,
    delay_us: u64,
    mut ranges: impl ExactSizeIterator<Item = (u64, u64)>,
) -> bool {
    let n = ranges.len();
    if n == 0 || n > MAX_ACK_RANGES {
        return false;
    }
    let Some((lo0, hi0)) = ranges.next() else {
        return false;
    };
    if lo0 > hi0 {
        return false;
    }
    let mut ok = w.u8(T_ACK)
        && w.u8(path)
        && w.varint(hi0)
        && w.varint(delay_us.min(MAX_VARINT))
        && w.varint((n - 1) as u64)
        && w.varint(hi0 - lo0);
    let mut prev_lo = lo0;
    for (lo, hi) in ranges {
        // gap: packets strictly between this range and the previous
        // one, minus one (a zero gap still means one missing packet).
        let Some(gap) = prev_lo.checked_sub(hi).and_then(|g| g.checked_sub(2)) else {
            return false;
        };
        ok = ok && lo <= hi && w.varint(gap) && w.varint(hi - lo);
        prev_lo = lo;
    }
    ok
}

/// A piece (or all) of one reliable message of one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataFrame<'a> {
    pub flow: u64,
    /// Message index within the flow (0, 1, 2, ...).
    pub seq: u64,
    /// Flow byte offset of the message's first byte (for credit checks).
    pub offset: u64,
    /// Whole message length.
    pub total: u32,
    /// Where `bytes` start inside the message.
    pub frag_off: u32,
    pub bytes: &'a [u8],
}

impl DataFrame<'_> {
    /// Appends this DATA frame with `tail` after `bytes`: a fragment that
    /// spans the two parts of a message held as header and packet
    /// (`msg::Encoded`), written without first joining them. `false` (and
    /// `w` unchanged) if it does not fit.
    pub fn encode_with_tail(&self, tail: &[u8], w: &mut Writer<'_>) -> bool {
        let mark = w.len();
        let ok = w.u8(T_DATA)
            && w.u64(self.flow)
            && w.varint(self.seq)
            && w.varint(self.offset)
            && w.varint(u64::from(self.total))
            && w.varint(u64::from(self.frag_off))
            && w.varint((self.bytes.len() + tail.len()) as u64)
            && w.bytes(self.bytes)
            && w.bytes(tail);
        if ok {
            crate::copies::note(self.bytes.len() + tail.len());
        } else {
            w.truncate(mark);
        }
        ok
    }
}

/// A piece (or all) of one unreliable datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramFrame<'a> {
    pub id: u64,
    pub total: u32,
    pub frag_off: u32,
    pub bytes: &'a [u8],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Ping,
    /// Received only (built with [`encode_ack`]).
    Ack(AckFrame<'a>),
    Data(DataFrame<'a>),
    /// The sender of this frame lets its peer send flow bytes up to
    /// `max_offset` (exclusive) on `flow`.
    Credit {
        flow: u64,
        max_offset: u64,
    },
    Datagram(DatagramFrame<'a>),
    Close {
        code: u64,
        reason: &'a [u8],
    },
    /// The sender of this frame closes `flow`: its messages were numbered
    /// `0..seq`, and the id is never used again in this connection.
    Fin {
        flow: u64,
        seq: u64,
    },
}

const T_PADDING: u8 = 0x00;
const T_PING: u8 = 0x01;
const T_ACK: u8 = 0x02;
const T_DATA: u8 = 0x03;
const T_CREDIT: u8 = 0x04;
const T_DATAGRAM: u8 = 0x05;
const T_CLOSE: u8 = 0x06;
const T_FIN: u8 = 0x07;

impl Frame<'_> {
    /// Whether receiving this frame obliges the peer to acknowledge the packet.
    pub fn ack_eliciting(&self) -> bool {
        !matches!(self, Frame::Ack(_))
    }

    /// Appends the frame to `w`; `false` (and `w` unchanged) if it does not fit.
    pub fn encode(&self, w: &mut Writer<'_>) -> bool {
        let mark = w.len();
        let ok = self.encode_inner(w);
        if !ok {
            w.truncate(mark);
        }
        ok
    }

    fn encode_inner(&self, w: &mut Writer<'_>) -> bool {
        match self {
            Frame::Ping => w.u8(T_PING),
            Frame::Ack(a) => encode_ack(w, a.path, a.delay_us, a.ranges()),
            Frame::Data(d) => d.encode_with_tail(&[], w),
            Frame::Credit { flow, max_offset } => {
                w.u8(T_CREDIT) && w.u64(*flow) && w.varint(*max_offset)
            }
            Frame::Datagram(d) => {
                crate::copies::note(d.bytes.len());
                w.u8(T_DATAGRAM)
                    && w.varint(d.id)
                    && w.varint(u64::from(d.total))
                    && w.varint(u64::from(d.frag_off))
                    && w.varint(d.bytes.len() as u64)
                    && w.bytes(d.bytes)
            }
            Frame::Close { code, reason } => {
                let reason = &reason[..reason.len().min(MAX_REASON)];
                w.u8(T_CLOSE) && w.varint(*code) && w.varint(reason.len() as u64) && w.bytes(reason)
            }
            Frame::Fin { flow, seq } => w.u8(T_FIN) && w.u64(*flow) && w.varint(*seq),
        }
    }
}

/// Checks a whole decrypted payload. All or nothing: a single malformed
/// frame rejects the packet, so a half-understood packet never changes any
/// state. Returns its frames (parsed again as they are taken: cheaper than
/// collecting them into a vector for every packet) and whether any of them
/// is ack-eliciting. PADDING bytes are skipped.
pub fn check_frames(payload: &[u8]) -> Result<(Frames<'_>, bool), FrameError> {
    let mut r = Reader::new(payload);
    let mut eliciting = false;
    while let Some(f) = next_frame(&mut r)? {
        eliciting |= f.ack_eliciting();
    }
    Ok((
        Frames {
            r: Reader::new(payload),
        },
        eliciting,
    ))
}

/// The frames of a payload [`check_frames`] accepted.
pub struct Frames<'a> {
    r: Reader<'a>,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Frame<'a>;
    fn next(&mut self) -> Option<Frame<'a>> {
        next_frame(&mut self.r).ok().flatten()
    }
}

/// [`check_frames`], collected (tests).
#[cfg(test)]
pub fn parse_frames(payload: &[u8]) -> Result<Vec<Frame<'_>>, FrameError> {
    Ok(check_frames(payload)?.0.collect())
}

/// Reads the fields of one frame, each fault named after the frame and the
/// field.
struct FrameReader<'r, 'a> {
    r: &'r mut Reader<'a>,
    frame: &'static str,
}

impl<'a> FrameReader<'_, 'a> {
    fn truncated(&self, field: &'static str) -> FrameError {
        FrameError::Truncated {
            frame: self.frame,
            field,
        }
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, FrameError> {
        self.r.u8().ok_or_else(|| self.truncated(field))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, FrameError> {
        self.r.u64().ok_or_else(|| self.truncated(field))
    }
    fn varint(&mut self, field: &'static str) -> Result<u64, FrameError> {
        self.r.varint().ok_or_else(|| self.truncated(field))
    }
    fn varint_u32(&mut self, field: &'static str) -> Result<u32, FrameError> {
        let v = self.varint(field)?;
        u32::try_from(v).map_err(|_| FrameError::TooLarge {
            frame: self.frame,
            field,
            value: v,
        })
    }
    /// A length, then that many bytes.
    fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let len = self.varint("length")?;
        let left = self.r.remaining().len();
        usize::try_from(len)
            .ok()
            .and_then(|n| self.r.take(n))
            .ok_or(FrameError::LyingLength {
                frame: self.frame,
                len,
                left,
            })
    }
    /// The fragment fields that end a DATA or DATAGRAM frame: the message's
    /// total length, the fragment's offset in it, and its bytes. A fragment
    /// must lie inside its message; an empty fragment of a non-empty
    /// message is pointless and refused.
    fn fragment(&mut self) -> Result<(u32, u32, &'a [u8]), FrameError> {
        let total = self.varint_u32("total length")?;
        let frag_off = self.varint_u32("fragment offset")?;
        let bytes = self.bytes()?;
        let len = bytes.len();
        let end = u64::from(frag_off) + len as u64;
        if end > u64::from(total) || (len == 0 && total != 0) {
            return Err(FrameError::Fragment {
                frame: self.frame,
                frag_off,
                len: len as u64,
                total,
            });
        }
        Ok((total, frag_off, bytes))
    }
}

/// The next frame: `Ok(None)` at the end of the payload.
fn next_frame<'a>(r: &mut Reader<'a>) -> Result<Option<Frame<'a>>, FrameError> {
    loop {
        let Some(t) = r.u8() else {
            return Ok(None);
        };
        if t == T_PADDING {
            continue;
        }
        let f = match t {
            T_PING => Frame::Ping,
            T_ACK => Frame::Ack(parse_ack(r)?),
            T_DATA => {
                let mut f = FrameReader { r, frame: "DATA" };
                let flow = f.u64("flow id")?;
                let seq = f.varint("sequence number")?;
                let offset = f.varint("offset")?;
                let (total, frag_off, bytes) = f.fragment()?;
                Frame::Data(DataFrame {
                    flow,
                    seq,
                    offset,
                    total,
                    frag_off,
                    bytes,
                })
            }
            T_CREDIT => {
                let mut f = FrameReader { r, frame: "CREDIT" };
                Frame::Credit {
                    flow: f.u64("flow id")?,
                    max_offset: f.varint("max offset")?,
                }
            }
            T_DATAGRAM => {
                let mut f = FrameReader {
                    r,
                    frame: "DATAGRAM",
                };
                let id = f.varint("id")?;
                let (total, frag_off, bytes) = f.fragment()?;
                Frame::Datagram(DatagramFrame {
                    id,
                    total,
                    frag_off,
                    bytes,
                })
            }
            T_CLOSE => {
                let mut f = FrameReader { r, frame: "CLOSE" };
                let code = f.varint("code")?;
                let len = f.varint("reason length")?;
                if len > MAX_REASON as u64 {
                    return Err(FrameError::ReasonTooLong(len));
                }
                let left = f.r.remaining().len();
                let reason = f.r.take(len as usize).ok_or(FrameError::LyingLength {
                    frame: "CLOSE",
                    len,
                    left,
                })?;
                Frame::Close { code, reason }
            }
            T_FIN => {
                let mut f = FrameReader { r, frame: "FIN" };
                Frame::Fin {
                    flow: f.u64("flow id")?,
                    seq: f.varint("sequence number")?,
                }
            }
            t => return Err(FrameError::UnknownType(t)),
        };
        return Ok(Some(f));
    }
}

fn parse_ack<'a>(r: &mut Reader<'a>) -> Result<AckFrame<'a>, FrameError> {
    let mut f = FrameReader { r, frame: "ACK" };
    let path = f.u8("path")?;
    let largest = f.varint("largest")?;
    let delay_us = f.varint("delay")?;
    let extra = f.varint("range count")?;
    if extra >= MAX_ACK_RANGES as u64 {
        return Err(FrameError::TooManyRanges(extra));
    }
    if largest > MAX_PN {
        return Err(FrameError::AckLargest(largest));
    }
    let extra = extra as usize;
    let body = f.r.remaining();
    // Every range is decoded once here, so that iterating them later
    // cannot fail.
    let mut lo = largest
        .checked_sub(f.varint("first range")?)
        .ok_or(FrameError::AckBelowZero(0))?;
    for i in 1..=extra {
        let gap = f.varint("gap")?;
        let len = f.varint("range length")?;
        lo = lo
            .checked_sub(gap)
            .and_then(|hi| hi.checked_sub(2))
            .and_then(|hi| hi.checked_sub(len))
            .ok_or(FrameError::AckBelowZero(i))?;
    }
    let r = f.r;
    Ok(AckFrame {
        path,
        delay_us,
        largest,
        extra,
        body: &body[..body.len() - r.remaining().len()],
    })
}

/// Largest value a QUIC-style varint holds.
pub const MAX_VARINT: u64 = (1 << 62) - 1;

/// Bounds-checked big-endian reader.
pub struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b }
    }
    /// What is left to read, without consuming it.
    pub fn remaining(&self) -> &'a [u8] {
        self.b
    }

    pub fn peek(&self) -> Option<u8> {
        self.b.first().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.array()?))
    }
    /// QUIC variable-length integer: the top two bits of the first byte give
    /// the length (1, 2, 4 or 8 bytes). Non-minimal encodings are accepted.
    pub fn varint(&mut self) -> Option<u64> {
        let first = *self.b.first()?;
        let len = 1usize << (first >> 6);
        let raw = self.take(len)?;
        let mut v = u64::from(raw[0] & 0x3f);
        for &x in &raw[1..] {
            v = (v << 8) | u64::from(x);
        }
        Some(v)
    }
}

/// Bounds-checked writer into a caller's buffer; every method returns `false`
/// (writing nothing) when the value does not fit.
pub struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut [u8]) -> Writer<'a> {
        Writer { buf, len: 0 }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.len
    }
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    pub fn bytes(&mut self, b: &[u8]) -> bool {
        if b.len() > self.remaining() {
            return false;
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        true
    }
    pub fn u8(&mut self, v: u8) -> bool {
        self.bytes(&[v])
    }
    pub fn u64(&mut self, v: u64) -> bool {
        self.bytes(&v.to_be_bytes())
    }
    pub fn varint(&mut self, v: u64) -> bool {
        if v < 1 << 6 {
            self.u8(v as u8)
        } else if v < 1 << 14 {
            self.bytes(&((v as u16) | 0x4000).to_be_bytes())
        } else if v < 1 << 30 {
            self.bytes(&((v as u32) | 0x8000_0000).to_be_bytes())
        } else if v <= MAX_VARINT {
            self.bytes(&(v | 0xC000_0000_0000_0000).to_be_bytes())
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encoded size of a varint.
    fn varint_len(v: u64) -> usize {
        if v < 1 << 6 {
            1
        } else if v < 1 << 14 {
            2
        } else if v < 1 << 30 {
            4
        } else {
            8
        }
    }

    fn roundtrip(f: Frame<'_>) {
        let mut buf = [0u8; 512];
        let mut w = Writer::new(&mut buf);
        assert!(f.encode(&mut w));
        let n = w.len();
        let parsed = parse_frames(&buf[..n]).expect("parses");
        assert_eq!(parsed, vec![f]);
    }

    #[test]
    fn frames_round_trip() {
        roundtrip(Frame::Ping);
        let ranges = [(90, 100), (50, 80), (0, 0)];
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        assert!(encode_ack(&mut w, 3, 250, ranges.into_iter()));
        let n = w.len();
        match parse_frames(&buf[..n]).expect("parses")[..] {
            [Frame::Ack(a)] => {
                assert_eq!((a.path, a.delay_us, a.largest()), (3, 250, 100));
                assert_eq!(a.ranges().collect::<Vec<_>>(), ranges);
                roundtrip(Frame::Ack(a));
            }
            ref other => panic!("{other:?}"),
        }
        roundtrip(Frame::Data(DataFrame {
            flow: u64::MAX,
            seq: 7,
            offset: 1 << 40,
            total: 5000,
            frag_off: 1300,
            bytes: b"hello",
        }));
        roundtrip(Frame::Credit {
            flow: 9,
            max_offset: 1 << 33,
        });
        roundtrip(Frame::Datagram(DatagramFrame {
            id: 1,
            total: 3,
            frag_off: 0,
            bytes: b"abc",
        }));
        roundtrip(Frame::Close {
            code: 2,
            reason: b"bye",
        });
        roundtrip(Frame::Fin {
            flow: 1 << 40,
            seq: 1 << 35,
        });
        assert_eq!(
            parse_frames(&[T_FIN, 0, 0, 0, 0, 0, 0, 0, 9]),
            Err(FrameError::Truncated {
                frame: "FIN",
                field: "sequence number"
            })
        );
    }

    #[test]
    fn header_round_trip_and_rejects() {
        let h = Header {
            kind: PacketKind::Protected,
            insecure: false,
            client: true,
            path: 2,
            conn_id: 0xdead_beef,
            generation: 77,
            pn: MAX_PN,
        };
        let mut b = [0u8; HEADER_LEN];
        h.encode(&mut b);
        assert_eq!(Header::decode(&b), Ok(h));
        let mut bad = b;
        bad[0] = 1;
        assert_eq!(
            Header::decode(&bad),
            Err(HeaderError::Version(1)),
            "version 1 (no cipher offer)"
        );
        bad[0] = 2;
        assert_eq!(
            Header::decode(&bad),
            Err(HeaderError::Version(2)),
            "version 2 (flows never retired: DATA of a closed id would open a new flow)"
        );
        let mut bad = b;
        bad[1] |= 0b0010_0000;
        assert_eq!(Header::decode(&bad), Err(HeaderError::ReservedFlags(0x20)));
        let mut bad = b;
        bad[1] |= 0b11;
        assert_eq!(Header::decode(&bad), Err(HeaderError::Kind(3)));
        let mut bad = b;
        bad[3] = 9;
        assert_eq!(Header::decode(&bad), Err(HeaderError::ReservedByte(9)));
        let mut bad = b;
        bad[16] |= 0x80;
        assert!(
            matches!(Header::decode(&bad), Err(HeaderError::PacketNumber(_))),
            "pn top bits"
        );
        assert_eq!(
            Header::decode(&b[..HEADER_LEN - 1]),
            Err(HeaderError::Truncated("packet number"))
        );
        assert_eq!(Header::decode(&[]), Err(HeaderError::Truncated("version")));
        assert_eq!(
            HeaderError::Truncated("generation").to_string(),
            "datagram truncated at the header's generation (24 bytes needed)"
        );
    }

    #[test]
    fn hello_round_trip_with_offer() {
        let h = Hello {
            nonce: 5,
            echo: 6,
            flow_window: 1 << 23,
            max_datagram: 8952,
            committed: true,
            offer: CipherOffer {
                accept: 0b11,
                prefer: 2,
            },
        };
        let mut b = [0u8; HELLO_BODY_LEN];
        h.encode(&mut b);
        assert_eq!(&b[28..], &[0b11, 2]);
        assert_eq!(Hello::decode(&b), Ok(h));
        assert_eq!(
            Hello::decode(&b[..28]),
            Err(HelloError::Length(28)),
            "version 1 body"
        );
        let mut bad = b;
        bad[27] = 2;
        assert_eq!(Hello::decode(&bad), Err(HelloError::Flags(2)));
        let mut bad = b;
        bad[..8].fill(0);
        assert_eq!(Hello::decode(&bad), Err(HelloError::ZeroNonce));
        assert_eq!(HELLO_LEN, 70);
    }

    #[test]
    fn malformed_frames_rejected() {
        use FrameError::*;
        // Unknown type, truncated varint, fragment beyond the message, ACK
        // range below zero, too many ranges.
        assert_eq!(parse_frames(&[0x7f]), Err(UnknownType(0x7f)));
        assert_eq!(
            parse_frames(&[T_DATA, 0, 0]),
            Err(Truncated {
                frame: "DATA",
                field: "flow id"
            })
        );
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        assert!(w.u8(T_DATA) && w.u64(1) && w.varint(0) && w.varint(0));
        assert!(w.varint(2) && w.varint(1) && w.varint(2) && w.bytes(b"xy"));
        let n = w.len();
        assert_eq!(
            parse_frames(&buf[..n]),
            Err(Fragment {
                frame: "DATA",
                frag_off: 1,
                len: 2,
                total: 2
            }),
            "fragment past total"
        );
        // A length that promises more than the packet holds.
        let lying = &buf[..n - 1];
        assert_eq!(
            parse_frames(lying),
            Err(LyingLength {
                frame: "DATA",
                len: 2,
                left: 1
            })
        );
        assert_eq!(parse_frames(&[T_ACK, 0, 5, 0, 0, 6]), Err(AckBelowZero(0)));
        assert_eq!(
            parse_frames(&[T_ACK, 0, 5, 0, 1, 1, 3, 0]),
            Err(AckBelowZero(1))
        );
        assert_eq!(
            parse_frames(&[T_ACK, 0, 5, 0, 40, 0]),
            Err(TooManyRanges(40))
        );
        let mut close = vec![T_CLOSE, 0, 0x41, 0x01];
        close.extend([b'x'; 257]);
        assert_eq!(parse_frames(&close), Err(ReasonTooLong(257)));
        // DATAGRAM total length past u32.
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        assert!(w.u8(T_DATAGRAM) && w.varint(1) && w.varint(1 << 33));
        let n = w.len();
        assert_eq!(
            parse_frames(&buf[..n]),
            Err(TooLarge {
                frame: "DATAGRAM",
                field: "total length",
                value: 1 << 33
            })
        );
        assert_eq!(parse_frames(&[0, 0, 0]), Ok(vec![]), "padding only");
        assert_eq!(UnknownType(0x7f).to_string(), "unknown frame type 0x7f");
        assert_eq!(
            LyingLength {
                frame: "DATA",
                len: 2,
                left: 1
            }
            .to_string(),
            "DATA frame says 2 bytes, 1 left in the packet"
        );
    }

    #[test]
    fn varint_boundaries() {
        for v in [0, 63, 64, 16383, 16384, (1 << 30) - 1, 1 << 30, MAX_VARINT] {
            let mut buf = [0u8; 8];
            let mut w = Writer::new(&mut buf);
            assert!(w.varint(v));
            assert_eq!(w.len(), varint_len(v));
            let n = w.len();
            assert_eq!(Reader::new(&buf[..n]).varint(), Some(v));
        }
        let mut buf = [0u8; 8];
        assert!(!Writer::new(&mut buf).varint(MAX_VARINT + 1));
    }
}
