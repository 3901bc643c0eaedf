//! Reading RoCEv2 captures (pcap, Ethernet or raw-IP link types).
//!
//! Captures taken with a snap length (`tcpdump -s 128`, the usual way to
//! capture at high rates) keep only the first bytes of each frame: the
//! headers are there, the payload and the ICRC are not. Such a frame is
//! decoded as far as its bytes go ([`decode`]) and marked truncated; only a
//! whole frame has its ICRC checked.

use std::borrow::Cow;
use std::fs::File;
use std::path::Path;

use pcap_file::pcap::PcapReader;
use pcap_file::DataLink;
use serde::Serialize;
use soya_proto::roce::bth::BTH_LEN;
use soya_proto::roce::icrc::ICRC_LEN;
use soya_proto::roce::ip::UDP_LEN;
use soya_proto::roce::{ethernet_payload, RocePacket, WireError};

/// One frame of a capture: its number (1-based, as tshark counts) and IP bytes.
pub struct Frame {
    pub number: usize,
    /// The IP packet (link-layer header removed) as captured, or why there
    /// is none.
    pub ip: Result<Vec<u8>, WireError>,
    /// How many bytes of the frame the capture did not keep (its original
    /// length minus what the snap length kept); 0 for a whole frame.
    pub cut: usize,
}

impl Frame {
    /// The IP packet at its original length: what was captured, followed by
    /// `cut` zero bytes standing for what was not. Parsing this gives the
    /// lengths the packet had on the wire; only the first
    /// `ip.len()` bytes are real.
    pub fn restored(&self) -> Option<Cow<'_, [u8]>> {
        let ip = self.ip.as_ref().ok()?;
        if self.cut == 0 {
            return Some(Cow::Borrowed(ip));
        }
        let mut v = Vec::with_capacity(ip.len() + self.cut);
        v.extend_from_slice(ip);
        v.resize(ip.len() + self.cut, 0);
        Some(Cow::Owned(v))
    }
}

/// A captured RoCE frame decoded as far as its captured bytes go.
pub enum RoceFrame<'a> {
    /// Every header was captured. `kept_payload` is how much of the payload
    /// is real (the rest of `packet.payload()` is zero fill when
    /// `truncated`); the ICRC is checked only when nothing was cut.
    Decoded {
        packet: RocePacket<'a>,
        truncated: bool,
        kept_payload: usize,
    },
    /// The snap length cut into the headers themselves: `kept` of the
    /// `needed` header bytes (IP + UDP + BTH + extension headers) are there.
    HeadersCut { kept: usize, needed: usize },
    /// A whole frame (or the headers of a cut one) that does not parse.
    Malformed(WireError),
}

/// Decodes a frame restored with [`Frame::restored`]; `cut` is [`Frame::cut`].
/// (Judge whether it is RoCE at all with `is_roce` on the restored bytes: a
/// cut frame's IP length exceeds what was captured, so on the captured bytes
/// alone it does not even pass as an IP packet.)
pub fn decode(restored: &[u8], cut: usize) -> RoceFrame<'_> {
    let packet = match RocePacket::parse(restored) {
        Ok(p) => p,
        Err(e) if cut == 0 => return RoceFrame::Malformed(e),
        Err(e) => {
            // The zero fill may stand for headers the snap length cut
            // (a zero pad count or opcode reads differently): say which.
            let kept = restored.len().saturating_sub(cut);
            let needed = header_bytes_min(restored);
            if kept < needed {
                return RoceFrame::HeadersCut { kept, needed };
            }
            return RoceFrame::Malformed(e);
        }
    };
    let kept = restored.len() - cut;
    let headers = packet.as_bytes().len() - packet.payload().len() - trailer_len(&packet);
    if cut > 0 && kept < headers {
        return RoceFrame::HeadersCut {
            kept,
            needed: headers,
        };
    }
    let kept_payload = (kept - headers).min(packet.payload().len());
    RoceFrame::Decoded {
        packet,
        truncated: cut > 0,
        kept_payload,
    }
}

/// Pad and ICRC after the payload.
fn trailer_len(p: &RocePacket<'_>) -> usize {
    usize::from(p.bth.pad) + ICRC_LEN
}

/// The header bytes any RoCE packet has before its extension headers
/// (IP header as its first byte says, UDP, BTH): a lower bound when the
/// packet itself does not parse.
fn header_bytes_min(ip: &[u8]) -> usize {
    let ip_len = match ip.first().map(|b| b >> 4) {
        Some(4) => usize::from(ip[0] & 0x0F) * 4,
        _ => 40,
    };
    ip_len + UDP_LEN + BTH_LEN
}

/// Reads every frame of a pcap file.
pub fn read_frames(path: &Path) -> Result<Vec<Frame>, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut reader = PcapReader::new(file).map_err(|e| format!("{}: {e}", path.display()))?;
    let link = reader.header().datalink;
    let mut frames = Vec::new();
    // Raw packets: pcap_file's checked `next_packet` refuses every frame
    // whose original length exceeds the file's snap length ("orig_len >
    // snap_len"), which is exactly what a capture taken with `tcpdump -s N`
    // contains. The lengths are checked here instead.
    while let Some(pkt) = reader.next_raw_packet() {
        let pkt = pkt.map_err(|e| format!("{}: {e}", path.display()))?;
        if pkt.incl_len > pkt.orig_len || pkt.incl_len as usize != pkt.data.len() {
            return Err(format!(
                "{}: frame {}: captured length {} against original length {} ({} bytes present)",
                path.display(),
                frames.len() + 1,
                pkt.incl_len,
                pkt.orig_len,
                pkt.data.len()
            ));
        }
        let ip = match link {
            DataLink::ETHERNET => ethernet_payload(&pkt.data).map(<[u8]>::to_vec),
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => Ok(pkt.data.to_vec()),
            other => {
                return Err(format!(
                    "{}: unsupported link type {other:?}",
                    path.display()
                ))
            }
        };
        let cut = (pkt.orig_len - pkt.incl_len) as usize;
        frames.push(Frame {
            number: frames.len() + 1,
            ip,
            cut,
        });
    }
    Ok(frames)
}

/// The fields tshark also shows, for comparing decoders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decoded {
    pub frame: usize,
    pub opcode: u8,
    pub opcode_name: &'static str,
    pub dest_qp: u32,
    pub psn: u32,
    pub ack_req: bool,
    pub reth_len: Option<u32>,
    /// The payload length on the wire.
    pub payload_len: usize,
    /// The capture's snap length cut this frame (payload and/or ICRC).
    pub truncated: bool,
    /// How many payload bytes the capture kept (`payload_len` if whole).
    pub captured_payload_len: usize,
    /// The ICRC verified; `None` when it was not checked (a truncated frame:
    /// the bytes it covers are not all there).
    pub icrc_ok: Option<bool>,
}

impl Decoded {
    /// A whole frame: every byte is there, the ICRC is checked.
    pub fn of(frame: usize, p: &RocePacket<'_>) -> Decoded {
        Decoded::cut(frame, p, false, p.payload().len())
    }

    /// A frame whose payload may have been cut by the snap length.
    pub fn cut(frame: usize, p: &RocePacket<'_>, truncated: bool, kept_payload: usize) -> Decoded {
        Decoded {
            frame,
            opcode: p.bth.opcode.0,
            opcode_name: p.info.name,
            dest_qp: p.bth.dest_qp,
            psn: p.bth.psn.value(),
            ack_req: p.bth.ack_req,
            reth_len: p
                .ext
                .present
                .contains(soya_proto::roce::Headers::RETH)
                .then_some(p.ext.reth.len),
            payload_len: p.payload().len(),
            truncated,
            captured_payload_len: kept_payload,
            icrc_ok: (!truncated).then(|| p.verify_icrc().is_ok()),
        }
    }
}
