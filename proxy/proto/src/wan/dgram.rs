//! Unreliable datagrams (non-RoCE IP traffic between the sites).
//!
//! Sent once, never retransmitted. A datagram larger than one packet is cut
//! into fragments sent back to back; the receiver reassembles them in a small
//! table. Losing any fragment loses the datagram, like IP fragmentation.
//!
//! Bounds: the send queue holds at most [`MAX_QUEUED`] datagrams or
//! [`MAX_QUEUED_BYTES`] bytes (the oldest is dropped, counted); the receiver
//! keeps at most [`MAX_PARTIAL`] incomplete datagrams (the oldest is evicted,
//! counted); datagrams above [`MAX_DATAGRAM`] bytes are refused.

use crate::buffer::PacketBuf;
use std::collections::VecDeque;

use super::packet::{DatagramFrame, Frame, Writer};
use crate::buffer::PacketPool;
use crate::keyed::KeyedMap;

pub const MAX_DATAGRAM: usize = 65_535;
pub const MAX_QUEUED: usize = 1024;
pub const MAX_QUEUED_BYTES: usize = 4 << 20;
pub const MAX_PARTIAL: usize = 32;
/// Do not start a fragment smaller than this unless it ends the datagram:
/// better to wait for the next packet than to send slivers.
const MIN_FRAGMENT: usize = 256;

#[derive(Default)]
pub struct DgramSend {
    /// `(id, bytes, bytes already sent)`.
    queue: VecDeque<(u64, PacketBuf, usize)>,
    queued_bytes: usize,
    next_id: u64,
    pub dropped: u64,
    pub sent: u64,
}

impl DgramSend {
    pub fn push(&mut self, bytes: PacketBuf) {
        if bytes.len() > MAX_DATAGRAM {
            self.dropped += 1;
            return;
        }
        while self.queue.len() >= MAX_QUEUED || self.queued_bytes + bytes.len() > MAX_QUEUED_BYTES {
            match self.queue.pop_front() {
                Some((_, b, _)) => {
                    self.queued_bytes -= b.len();
                    self.dropped += 1;
                }
                None => break,
            }
        }
        self.queued_bytes += bytes.len();
        self.queue.push_back((self.next_id, bytes, 0));
        self.next_id += 1;
    }

    pub fn has_pending(&self) -> bool {
        !self.queue.is_empty()
    }

    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes as u64
    }

    /// Writes datagram fragments while they fit; `true` if any was written.
    /// A datagram sent whole goes back to `pool` (it came from the engine's).
    pub fn write(&mut self, w: &mut Writer<'_>, pool: &mut PacketPool) -> bool {
        let mut wrote = false;
        while let Some((id, bytes, sent)) = self.queue.front_mut() {
            let left = bytes.len() - *sent;
            let room = w.remaining().saturating_sub(super::packet::DGRAM_OVERHEAD);
            let chunk = left.min(room);
            if (chunk < left && chunk < MIN_FRAGMENT) || (chunk == 0 && left > 0) {
                break;
            }
            let f = Frame::Datagram(DatagramFrame {
                id: *id,
                total: bytes.len() as u32,
                frag_off: *sent as u32,
                bytes: &bytes[*sent..*sent + chunk],
            });
            if !f.encode(w) {
                break;
            }
            wrote = true;
            *sent += chunk;
            if *sent == bytes.len() {
                self.queued_bytes -= bytes.len();
                if let Some((_, bytes, _)) = self.queue.pop_front() {
                    pool.put(bytes);
                }
                self.sent += 1;
            }
        }
        wrote
    }
}

struct Partial {
    data: Vec<u8>,
    frags: Vec<(u32, u32)>,
    received: usize,
}

#[derive(Default)]
pub struct DgramRecv {
    /// Keyed by ids the peer picks (`crate::keyed`); only looked up.
    partial: KeyedMap<u64, Partial>,
    order: VecDeque<u64>,
    pub evicted: u64,
    pub inconsistent: u64,
}

impl DgramRecv {
    /// Returns the whole datagram once its last fragment arrived (one that
    /// came whole, the usual case, in a buffer from `pool`).
    pub fn on_frame(&mut self, d: &DatagramFrame<'_>, pool: &mut PacketPool) -> Option<PacketBuf> {
        let total = d.total as usize;
        if d.frag_off == 0 && d.bytes.len() == total {
            return Some(pool.copy_of(d.bytes));
        }
        if total > MAX_DATAGRAM {
            self.inconsistent += 1;
            return None;
        }
        if !self.partial.contains_key(&d.id) {
            if self.partial.len() >= MAX_PARTIAL {
                if let Some(old) = self.order.pop_front() {
                    self.partial.remove(&old);
                    self.evicted += 1;
                }
            }
            self.partial.insert(
                d.id,
                Partial {
                    data: vec![0; total],
                    frags: Vec::new(),
                    received: 0,
                },
            );
            self.order.push_back(d.id);
        }
        let p = self.partial.get_mut(&d.id)?;
        let (start, len) = (d.frag_off, d.bytes.len() as u32);
        let overlaps = p
            .frags
            .iter()
            .any(|&(s, l)| start < s + l && s < start + len);
        if p.data.len() != total || overlaps || p.frags.len() >= 64 {
            self.inconsistent += 1;
            self.partial.remove(&d.id);
            self.order.retain(|&x| x != d.id);
            return None;
        }
        crate::copies::note(d.bytes.len());
        p.data[start as usize..start as usize + d.bytes.len()].copy_from_slice(d.bytes);
        p.frags.push((start, len));
        p.received += d.bytes.len();
        if p.received < total {
            return None;
        }
        self.order.retain(|&x| x != d.id);
        self.partial.remove(&d.id).map(|p| p.data.into())
    }

    pub fn clear(&mut self) {
        self.partial.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wan::packet::parse_frames;

    #[test]
    fn fragments_and_reassembles() {
        let mut s = DgramSend::default();
        let big: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        s.push(b"tiny".to_vec().into());
        s.push(big.clone().into());
        let mut r = DgramRecv::default();
        let mut got = Vec::new();
        while s.has_pending() {
            let mut buf = [0u8; 1200];
            let mut w = Writer::new(&mut buf);
            assert!(s.write(&mut w, &mut PacketPool::default()));
            let n = w.len();
            for f in parse_frames(&buf[..n]).unwrap() {
                if let Frame::Datagram(d) = f {
                    got.extend(r.on_frame(&d, &mut PacketPool::default()));
                }
            }
        }
        assert_eq!(got, vec![b"tiny".to_vec(), big]);
        s.push(vec![0; MAX_DATAGRAM + 1].into());
        assert_eq!(s.dropped, 1);
    }
}
