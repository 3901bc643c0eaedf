//! The frames a protected packet's decrypted payload carries (PING, ACK,
//! DATA, CREDIT, DATAGRAM, CLOSE, FIN): emitting them, and checking a whole
//! payload before any of it is acted on, with the first fault named in a
//! [`FrameError`].

use thiserror::Error;

use super::wire::{Reader, Writer, MAX_VARINT};
use super::{MAX_ACK_RANGES, MAX_PN, MAX_REASON};

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

pub(super) const T_PADDING: u8 = 0x00;
pub(super) const T_PING: u8 = 0x01;
pub(super) const T_ACK: u8 = 0x02;
pub(super) const T_DATA: u8 = 0x03;
pub(super) const T_CREDIT: u8 = 0x04;
pub(super) const T_DATAGRAM: u8 = 0x05;
pub(super) const T_CLOSE: u8 = 0x06;
pub(super) const T_FIN: u8 = 0x07;

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
