//! Compact, versioned encoding of [`TwinMsg`] inside reliable messages.
//!
//! Layout (all integers big-endian), see `docs/wan-protocol.md`:
//!
//! ```text
//! 0  codec version (1)
//! 1  kind: 1 Request, 2 Response, 3 Delivered, 4 Error, 5 Datagram,
//!    6 Orphaned
//! 2… Request:   carry (0 Raw, 1 Reliable), then the IP packet to the end
//!    Response:  the IP packet to the end
//!    Datagram:  the IP packet to the end
//!    Delivered: half key, PSN (u32, < 2^24), MSN flag (0 none, 1 present)
//!               then the MSN (u32) when present
//!    Error:     half key, PSN (u32, < 2^24), NAK code (u8)
//!    Orphaned:  half key, far QPN flag (0 none, 1 present) then the QPN
//!               (u32), hint flag then the hint PSN (u32), then to the end
//!               0 to 64 candidates: PSN (u32), message in progress (u8:
//!               0 none, 1 SEND, 2 RDMA WRITE)
//! half key: requester address, responder address, responder QPN (u32)
//! address:  family (4 or 6) then 4 or 16 bytes
//! ```
//!
//! The version byte lets a later codec change the layout without touching
//! the transport; a message of an unknown version is counted as malformed.

use crate::buffer::{PacketBuf, PacketPool};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

use crate::qp::half::HalfKey;
use crate::qp::poison::InProgress;
use crate::qp::twin::{Carry, TwinMsg, MAX_ORPHAN_CANDIDATES};
use crate::roce::{NakCode, Psn};

use super::packet::{Reader, Writer};

pub const CODEC_VERSION: u8 = 1;

/// Why a message was refused (a plain enum: decoding allocates nothing to
/// report it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum MsgError {
    #[error("message truncated at its {0}")]
    Truncated(&'static str),
    #[error("codec version {0}, not {CODEC_VERSION}")]
    Version(u8),
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("unknown carry {0}")]
    Carry(u8),
    #[error("unknown address family {0}")]
    AddressFamily(u8),
    #[error("PSN {0:#x} is past 24 bits")]
    Psn(u32),
    #[error("unknown MSN flag {0}")]
    MsnFlag(u8),
    #[error("unknown NAK code {0}")]
    NakCode(u8),
    #[error("{0} bytes after the end of the message")]
    Trailing(usize),
    #[error("unknown flag {0}")]
    Flag(u8),
    #[error("unknown message-in-progress state {0}")]
    InProgress(u8),
    #[error("{0} candidate PSNs, more than {MAX_ORPHAN_CANDIDATES}")]
    Candidates(usize),
}

const K_REQUEST: u8 = 1;
const K_RESPONSE: u8 = 2;
const K_DELIVERED: u8 = 3;
const K_ERROR: u8 = 4;
const K_DATAGRAM: u8 = 5;
const K_ORPHANED: u8 = 6;
/// Bytes per candidate of an Orphaned message.
const CANDIDATE_LEN: usize = 5;

/// Room for the codec header of any message: all of a Delivered or an
/// Error (at most 2 + 38 + 9 bytes with two IPv6 addresses), the first 2–3
/// bytes of a message carrying a packet.
const HEAD_CAP: usize = 56;

/// An encoded message in two parts: `head` (the codec header, or all of a
/// small message) and `body` (the IP packet of a Request, Response or
/// Datagram, *moved* out of the [`TwinMsg`]). Queuing a message to send
/// thus never copies its packet; the only copy is into the datagram being
/// built (see `flow`).
pub struct Encoded {
    head: [u8; HEAD_CAP],
    head_len: u8,
    body: PacketBuf,
}

impl Encoded {
    /// Encoded length: `head ‖ body`.
    pub fn len(&self) -> usize {
        usize::from(self.head_len) + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The packet moved in by [`encode_owned`] (empty for a message that
    /// carries none), for reuse once the message is acknowledged.
    pub fn into_body(self) -> PacketBuf {
        self.body
    }

    /// Is this a `Request` carried `Reliable`: a packet the sending
    /// gateway's ingress half keeps until the twin reports it delivered?
    /// The transport hands its buffer back rather than pooling it once
    /// acknowledged (`flow::SendFlows::handed_back`; issue 35: one buffer
    /// per request packet, moved between its owners, never copied).
    pub fn is_held_request(&self) -> bool {
        self.head_len == 3 && self.head[..3] == [CODEC_VERSION, K_REQUEST, 1]
    }

    /// Is this a `Request` carried `Raw` (a tunnel's)? Once acknowledged,
    /// the sending gateway's engine is told (`flow::SendFlows::raw_released`):
    /// the requester's resends of it may go on from then
    /// (`qp::ingress::tunnel`).
    pub fn is_raw_request(&self) -> bool {
        self.head_len == 3 && self.head[..3] == [CODEC_VERSION, K_REQUEST, 0]
    }

    /// Bytes `[start, end)` of `head ‖ body`, as the part in the head and the
    /// part in the body (either may be empty).
    pub fn range(&self, start: usize, end: usize) -> (&[u8], &[u8]) {
        let h = usize::from(self.head_len);
        let end = end.min(self.len());
        let start = start.min(end);
        let head = &self.head[start.min(h)..end.min(h)];
        let body = &self.body[start.saturating_sub(h)..end.saturating_sub(h)];
        (head, body)
    }
}

/// Already-encoded bytes, all in the body (tests, and callers that hold the
/// encoding).
impl From<Vec<u8>> for Encoded {
    fn from(body: Vec<u8>) -> Encoded {
        Encoded {
            head: [0; HEAD_CAP],
            head_len: 0,
            body: body.into(),
        }
    }
}

/// Writes the codec header of `msg` (everything but a carried packet) into
/// `buf`; returns its length.
fn head(msg: &TwinMsg, buf: &mut [u8; HEAD_CAP]) -> u8 {
    // Messages carrying a packet, by far the most frequent: two or three
    // bytes, written directly.
    let short = match msg {
        TwinMsg::Request { carry, .. } => Some([
            K_REQUEST,
            match carry {
                Carry::Raw => 0,
                Carry::Reliable => 1,
            },
        ]),
        TwinMsg::Response { .. } => Some([K_RESPONSE, 0]),
        TwinMsg::Datagram { .. } => Some([K_DATAGRAM, 0]),
        TwinMsg::Delivered { .. } | TwinMsg::Error { .. } | TwinMsg::Orphaned { .. } => None,
    };
    if let Some([kind, carry]) = short {
        buf[0] = CODEC_VERSION;
        buf[1] = kind;
        buf[2] = carry;
        return if kind == K_REQUEST { 3 } else { 2 };
    }
    let mut w = Writer::new(buf);
    // HEAD_CAP holds the largest header: none of these writes can fail
    // (`every_kind_round_trips` covers the largest, two IPv6 addresses).
    let ok = w.u8(CODEC_VERSION)
        && match msg {
            TwinMsg::Delivered { half, psn, msn } => {
                w.u8(K_DELIVERED)
                    && put_half(&mut w, half)
                    && w.bytes(&psn.value().to_be_bytes())
                    && match msn {
                        None => w.u8(0),
                        Some(m) => w.u8(1) && w.bytes(&m.to_be_bytes()),
                    }
            }
            TwinMsg::Error { half, psn, code } => {
                w.u8(K_ERROR)
                    && put_half(&mut w, half)
                    && w.bytes(&psn.value().to_be_bytes())
                    && w.u8(code.code())
            }
            TwinMsg::Orphaned {
                qp, far_qpn, hint, ..
            } => {
                w.u8(K_ORPHANED)
                    && put_half(&mut w, qp)
                    && put_opt(&mut w, *far_qpn)
                    && put_opt(&mut w, hint.map(Psn::value))
            }
            TwinMsg::Request { .. } | TwinMsg::Response { .. } | TwinMsg::Datagram { .. } => false,
        };
    debug_assert!(ok, "HEAD_CAP holds every header");
    w.len() as u8
}

/// Serializes `msg` into a fresh vector (copies its packet; the transport
/// uses [`encode_owned`]).
pub fn encode(msg: &TwinMsg) -> Vec<u8> {
    let mut h = [0u8; HEAD_CAP];
    let n = head(msg, &mut h);
    let mut out = Vec::with_capacity(encoded_len(msg));
    out.extend_from_slice(&h[..usize::from(n)]);
    match msg {
        TwinMsg::Request { packet, .. }
        | TwinMsg::Response { packet }
        | TwinMsg::Datagram { packet } => out.extend_from_slice(packet),
        TwinMsg::Orphaned { candidates, .. } => out.extend_from_slice(&candidate_bytes(candidates)),
        TwinMsg::Delivered { .. } | TwinMsg::Error { .. } => {}
    }
    out
}

/// Serializes `msg` without copying its packet: see [`Encoded`].
pub fn encode_owned(msg: TwinMsg) -> Encoded {
    let mut e = Encoded {
        head: [0; HEAD_CAP],
        head_len: 0,
        body: PacketBuf::new(),
    };
    e.head_len = head(&msg, &mut e.head);
    e.body = match msg {
        TwinMsg::Request { packet, .. }
        | TwinMsg::Response { packet }
        | TwinMsg::Datagram { packet } => packet,
        // Rare (a twin's restart): its candidates go in a fresh body.
        TwinMsg::Orphaned { candidates, .. } => candidate_bytes(&candidates).into(),
        TwinMsg::Delivered { .. } | TwinMsg::Error { .. } => PacketBuf::new(),
    };
    e
}

/// The candidates of an Orphaned message, as they go on the wire (at most
/// [`MAX_ORPHAN_CANDIDATES`]: the engine never makes more).
fn candidate_bytes(candidates: &[(Psn, InProgress)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(candidates.len().min(MAX_ORPHAN_CANDIDATES) * CANDIDATE_LEN);
    for (psn, state) in candidates.iter().take(MAX_ORPHAN_CANDIDATES) {
        v.extend_from_slice(&psn.value().to_be_bytes());
        v.push(match state {
            InProgress::Nothing => 0,
            InProgress::Send => 1,
            InProgress::Write => 2,
        });
    }
    v
}

/// Exact length [`encode`] produces.
pub fn encoded_len(msg: &TwinMsg) -> usize {
    fn addr(a: &IpAddr) -> usize {
        match a {
            IpAddr::V4(_) => 5,
            IpAddr::V6(_) => 17,
        }
    }
    fn half(h: &HalfKey) -> usize {
        addr(&h.requester) + addr(&h.responder) + 4
    }
    2 + match msg {
        TwinMsg::Request { packet, .. } => 1 + packet.len(),
        TwinMsg::Response { packet } | TwinMsg::Datagram { packet } => packet.len(),
        TwinMsg::Delivered { half: h, msn, .. } => {
            half(h) + 4 + 1 + if msn.is_some() { 4 } else { 0 }
        }
        TwinMsg::Error { half: h, .. } => half(h) + 5,
        TwinMsg::Orphaned {
            qp,
            far_qpn,
            hint,
            candidates,
        } => {
            half(qp)
                + 1
                + if far_qpn.is_some() { 4 } else { 0 }
                + 1
                + if hint.is_some() { 4 } else { 0 }
                + candidates.len().min(MAX_ORPHAN_CANDIDATES) * CANDIDATE_LEN
        }
    }
}

/// Parses a message; refuses anything that is off (unknown version or
/// kind, bad address family, PSN out of range, unknown NAK code, trailing
/// bytes).
pub fn decode(b: &[u8]) -> Result<TwinMsg, MsgError> {
    decode_with(b, |packet| packet.into())
}

/// Where the IP packet of an encoded message starts, judged from its first
/// bytes: after the codec header of a Request (3 bytes), a Response or a
/// Datagram (2). `None` for the other kinds (they carry no packet) and
/// when the bytes are too few or not of this codec. The WAN receiver
/// reassembles a fragmented message with the packet apart from this
/// header (`wan::flow::Message`), so that the packet is used where it was
/// reassembled: see [`decode_split`].
pub fn packet_at(first: &[u8]) -> Option<usize> {
    match first {
        [CODEC_VERSION, K_REQUEST, _, ..] => Some(3),
        [CODEC_VERSION, K_RESPONSE | K_DATAGRAM, ..] => Some(2),
        _ => None,
    }
}

/// Decodes a message reassembled as `head ‖ body`, where `head` is exactly
/// the codec header [`packet_at`] found (the packet is then `body` itself,
/// moved into the message: not copied) or empty (the message is decoded
/// from `body` as by [`decode_with`], a packet copied into a buffer of
/// `pool`, and `body` goes back to `pool`).
pub fn decode_split(
    head: &[u8],
    body: PacketBuf,
    pool: &mut PacketPool,
) -> Result<TwinMsg, MsgError> {
    if head.is_empty() {
        let msg = decode_with(&body, |b| pool.copy_of(b));
        pool.put(body);
        return msg;
    }
    // The header decodes to a packet-carrying kind whose packet is the
    // (empty) rest of `head`: the body stands in for it.
    decode_with(head, move |rest| {
        debug_assert!(rest.is_empty(), "the head is exactly the header");
        body
    })
}

/// [`decode`], the carried packet copied out by `copy` (the transport
/// copies into a pooled buffer: `buffer::pool`).
pub fn decode_with(b: &[u8], copy: impl FnOnce(&[u8]) -> PacketBuf) -> Result<TwinMsg, MsgError> {
    use MsgError::Truncated;
    let mut r = Reader::new(b);
    let version = r.u8().ok_or(Truncated("codec version"))?;
    if version != CODEC_VERSION {
        return Err(MsgError::Version(version));
    }
    let msg = match r.u8().ok_or(Truncated("kind"))? {
        K_REQUEST => {
            let carry = match r.u8().ok_or(Truncated("carry"))? {
                0 => Carry::Raw,
                1 => Carry::Reliable,
                c => return Err(MsgError::Carry(c)),
            };
            TwinMsg::Request {
                carry,
                packet: copy(r.rest()),
            }
        }
        K_RESPONSE => TwinMsg::Response {
            packet: copy(r.rest()),
        },
        K_DATAGRAM => TwinMsg::Datagram {
            packet: copy(r.rest()),
        },
        K_DELIVERED => TwinMsg::Delivered {
            half: get_half(&mut r)?,
            psn: get_psn(&mut r)?,
            msn: match r.u8().ok_or(Truncated("MSN flag"))? {
                0 => None,
                1 => Some(r.u32().ok_or(Truncated("MSN"))?),
                f => return Err(MsgError::MsnFlag(f)),
            },
        },
        K_ERROR => TwinMsg::Error {
            half: get_half(&mut r)?,
            psn: get_psn(&mut r)?,
            code: {
                let c = r.u8().ok_or(Truncated("NAK code"))?;
                NakCode::from_code(c).ok_or(MsgError::NakCode(c))?
            },
        },
        K_ORPHANED => {
            let qp = get_half(&mut r)?;
            let far_qpn = get_opt(&mut r, "far QPN")?;
            let hint = match get_opt(&mut r, "hint")? {
                None => None,
                Some(v) if v <= Psn::MASK => Some(Psn::new(v)),
                Some(v) => return Err(MsgError::Psn(v)),
            };
            let rest = r.rest();
            if rest.len() % CANDIDATE_LEN != 0 {
                return Err(Truncated("candidate"));
            }
            let n = rest.len() / CANDIDATE_LEN;
            if n > MAX_ORPHAN_CANDIDATES {
                return Err(MsgError::Candidates(n));
            }
            let mut candidates = Vec::with_capacity(n);
            for c in rest.chunks_exact(CANDIDATE_LEN) {
                let v = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
                if v > Psn::MASK {
                    return Err(MsgError::Psn(v));
                }
                let state = match c[4] {
                    0 => InProgress::Nothing,
                    1 => InProgress::Send,
                    2 => InProgress::Write,
                    s => return Err(MsgError::InProgress(s)),
                };
                candidates.push((Psn::new(v), state));
            }
            TwinMsg::Orphaned {
                qp,
                far_qpn,
                hint,
                candidates,
            }
        }
        k => return Err(MsgError::Kind(k)),
    };
    if !r.is_empty() {
        return Err(MsgError::Trailing(r.remaining().len()));
    }
    Ok(msg)
}

fn put_opt(w: &mut Writer<'_>, v: Option<u32>) -> bool {
    match v {
        None => w.u8(0),
        Some(v) => w.u8(1) && w.bytes(&v.to_be_bytes()),
    }
}

fn get_opt(r: &mut Reader<'_>, which: &'static str) -> Result<Option<u32>, MsgError> {
    match r.u8().ok_or(MsgError::Truncated(which))? {
        0 => Ok(None),
        1 => Ok(Some(r.u32().ok_or(MsgError::Truncated(which))?)),
        f => Err(MsgError::Flag(f)),
    }
}

fn put_addr(w: &mut Writer<'_>, a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => w.u8(4) && w.bytes(&v4.octets()),
        IpAddr::V6(v6) => w.u8(6) && w.bytes(&v6.octets()),
    }
}

fn put_half(w: &mut Writer<'_>, h: &HalfKey) -> bool {
    put_addr(w, &h.requester)
        && put_addr(w, &h.responder)
        && w.bytes(&h.responder_qpn.to_be_bytes())
}

fn get_addr(r: &mut Reader<'_>, which: &'static str) -> Result<IpAddr, MsgError> {
    let truncated = MsgError::Truncated(which);
    match r.u8().ok_or(truncated)? {
        4 => Ok(IpAddr::V4(Ipv4Addr::from(get_array(r).ok_or(truncated)?))),
        6 => Ok(IpAddr::V6(Ipv6Addr::from(get_array(r).ok_or(truncated)?))),
        f => Err(MsgError::AddressFamily(f)),
    }
}

/// The next `N` bytes, if there are that many.
fn get_array<const N: usize>(r: &mut Reader<'_>) -> Option<[u8; N]> {
    r.take(N)?.try_into().ok()
}

fn get_half(r: &mut Reader<'_>) -> Result<HalfKey, MsgError> {
    Ok(HalfKey {
        requester: get_addr(r, "requester address")?,
        responder: get_addr(r, "responder address")?,
        responder_qpn: r.u32().ok_or(MsgError::Truncated("responder QPN"))?,
    })
}

fn get_psn(r: &mut Reader<'_>) -> Result<Psn, MsgError> {
    let v = r.u32().ok_or(MsgError::Truncated("PSN"))?;
    if v > Psn::MASK {
        return Err(MsgError::Psn(v));
    }
    Ok(Psn::new(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half() -> HalfKey {
        HalfKey {
            requester: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            responder: IpAddr::V6(Ipv6Addr::LOCALHOST),
            responder_qpn: 0x11,
        }
    }

    #[test]
    fn an_orphaned_message_round_trips_and_refuses_what_is_off() {
        use crate::qp::poison::InProgress;
        let m = TwinMsg::Orphaned {
            qp: half(),
            far_qpn: Some(0x1234),
            hint: None,
            candidates: vec![
                (Psn::new(7), InProgress::Nothing),
                (Psn::new(0xff_ffff), InProgress::Send),
                (Psn::new(9), InProgress::Write),
            ],
        };
        let b = encode(&m);
        assert_eq!(b.len(), encoded_len(&m));
        assert_eq!(decode(&b), Ok(m.clone()));
        let owned = encode_owned(m.clone());
        let (h, body) = owned.range(0, owned.len());
        assert_eq!([h, body].concat(), b);
        let probe = TwinMsg::Orphaned {
            qp: half(),
            far_qpn: None,
            hint: Some(Psn::new(3)),
            candidates: Vec::new(),
        };
        assert_eq!(decode(&encode(&probe)), Ok(probe));
        // A partial candidate, a bad state, too many.
        assert_eq!(
            decode(&b[..b.len() - 1]),
            Err(MsgError::Truncated("candidate"))
        );
        let mut bad = b.clone();
        *bad.last_mut().unwrap() = 3;
        assert_eq!(decode(&bad), Err(MsgError::InProgress(3)));
        let head_len = b.len() - 15;
        let mut many = b[..head_len].to_vec();
        for _ in 0..=MAX_ORPHAN_CANDIDATES {
            many.extend_from_slice(&[0, 0, 0, 1, 0]);
        }
        assert_eq!(
            decode(&many),
            Err(MsgError::Candidates(MAX_ORPHAN_CANDIDATES + 1))
        );
    }

    #[test]
    fn every_kind_round_trips() {
        for m in every_kind() {
            let b = encode(&m);
            assert_eq!(b.len(), encoded_len(&m));
            assert_eq!(decode(&b).as_ref(), Ok(&m));
            // The two-part encoding holds the same bytes, cut anywhere.
            let e = encode_owned(m);
            assert_eq!(e.len(), b.len());
            for cut in [0, 1, 2, 3, 5, b.len() / 2, b.len()] {
                let cut = cut.min(b.len());
                let (h1, b1) = e.range(0, cut);
                let (h2, b2) = e.range(cut, b.len());
                assert_eq!([h1, b1, h2, b2].concat(), b, "cut at {cut}");
            }
        }
    }

    /// As the WAN receiver hands a reassembled message over: the header
    /// `packet_at` finds kept apart, the rest in a buffer. A packet
    /// message's packet is that buffer itself (no copy); the others decode
    /// from it, and it goes back to the pool.
    #[test]
    fn a_message_decodes_split_at_its_packet() {
        for m in every_kind() {
            let b = encode(&m);
            let carries = matches!(
                m,
                TwinMsg::Request { .. } | TwinMsg::Response { .. } | TwinMsg::Datagram { .. }
            );
            let at = packet_at(&b[..b.len().min(8)]);
            assert_eq!(at.is_some(), carries, "{m:?}");
            let h = at.unwrap_or(0);
            let body = PacketBuf::from(b[h..].to_vec());
            let body_ptr = body.as_ptr();
            let mut pool = PacketPool::new(4);
            let got = decode_split(&b[..h], body, &mut pool).unwrap();
            assert_eq!(got, m);
            match got {
                TwinMsg::Request { packet, .. }
                | TwinMsg::Response { packet }
                | TwinMsg::Datagram { packet } => {
                    assert_eq!(packet.as_ptr(), body_ptr, "the body is the packet")
                }
                _ => {}
            }
        }
        // Too few bytes to tell, another codec version: no packet split.
        assert_eq!(packet_at(&[CODEC_VERSION, K_REQUEST]), None);
        assert_eq!(packet_at(&[CODEC_VERSION]), None);
        assert_eq!(packet_at(&[2, K_RESPONSE, 0]), None);
        assert_eq!(packet_at(&[CODEC_VERSION, K_RESPONSE]), Some(2));
    }

    fn every_kind() -> Vec<TwinMsg> {
        vec![
            TwinMsg::Request {
                carry: Carry::Reliable,
                packet: vec![1, 2, 3].into(),
            },
            TwinMsg::Request {
                carry: Carry::Raw,
                packet: vec![].into(),
            },
            TwinMsg::Response {
                packet: vec![9; 4200].into(),
            },
            TwinMsg::Delivered {
                half: half(),
                psn: Psn::new(0xff_ffff),
                msn: None,
            },
            TwinMsg::Delivered {
                half: half(),
                psn: Psn::new(1),
                msn: Some(0x00ab_cdef),
            },
            TwinMsg::Error {
                half: half(),
                psn: Psn::new(5),
                code: NakCode::RemoteAccessError,
            },
            TwinMsg::Datagram {
                packet: vec![7; 60].into(),
            },
            // The largest header: two IPv6 addresses and an MSN.
            TwinMsg::Delivered {
                half: HalfKey {
                    requester: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                    responder: IpAddr::V6(Ipv6Addr::LOCALHOST),
                    responder_qpn: u32::MAX,
                },
                psn: Psn::new(0xff_ffff),
                msn: Some(u32::MAX),
            },
        ]
    }

    #[test]
    fn rejects_bad_input() {
        let good = encode(&TwinMsg::Error {
            half: half(),
            psn: Psn::new(5),
            code: NakCode::InvalidRequest,
        });
        use MsgError as E;
        assert_eq!(decode(&[]), Err(E::Truncated("codec version")));
        assert_eq!(decode(&[2, K_RESPONSE]), Err(E::Version(2)), "version");
        assert_eq!(decode(&[1, 99]), Err(E::Kind(99)), "kind");
        assert_eq!(decode(&[1, K_REQUEST, 2]), Err(E::Carry(2)), "carry");
        assert_eq!(decode(&[1, K_ERROR, 5]), Err(E::AddressFamily(5)));
        for n in 0..good.len() {
            assert!(
                matches!(decode(&good[..n]), Err(E::Truncated(_))),
                "truncated at {n}"
            );
        }
        assert_eq!(decode(&good[..3]), Err(E::Truncated("requester address")));
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(decode(&trailing), Err(E::Trailing(1)));
        let mut bad_code = good.clone();
        *bad_code.last_mut().unwrap() = 9;
        assert_eq!(decode(&bad_code), Err(E::NakCode(9)));
        let mut bad_psn = good.clone();
        let at = bad_psn.len() - 5;
        bad_psn[at] = 0x01;
        assert_eq!(decode(&bad_psn), Err(E::Psn(0x0100_0005)));
        assert_eq!(
            E::Truncated("PSN").to_string(),
            "message truncated at its PSN"
        );
    }
}
