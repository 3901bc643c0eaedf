//! Between the engine and the WAN transport: which WAN flow carries a
//! [`TwinMsg`], and the bounded queues ([`Pending`]) that hold messages
//! while the transport pushes back. [`super::Site`] moves traffic through
//! them.
//!
//! # Packet buffers
//!
//! The packets that cross here are pooled vectors (`buffer::pool`): the
//! engine's outputs come from its pool and go back to it after the DC send;
//! a `Request` the engine built travels inside the transport until the twin
//! acknowledges it, then lands in the transport's pool, which the transport
//! draws from for the packets it decodes; those go back to the engine's pool
//! once the engine copied them. The two pools fill in opposite directions
//! (the requester's site sends the packets, the responder's site receives
//! them), so the site evens them out: in steady state no packet buffer is
//! allocated.
//!
//! # Flow keys
//!
//! The transport keeps order within a flow and never across flows; a lost
//! packet stalls only its own flow. The site names a flow by a *key*; the
//! transport maps each key to a wire id of its own and retires the flow
//! once it has been idle (everything acknowledged) for
//! `wan::Tuning::flow_idle_timeout`: the key's next message starts a new
//! flow, ordered after the old one (`wan::flow` has the argument). So a
//! key may be reused forever (a NIC recycling a QPN maps the new QP to the
//! old key) and flows never pile up over QP churn. What must stay in order:
//!
//! - the Requests of one half (its PSN stream): flow
//!   `H("req", requester, responder, responder QPN)`, the [`HalfKey`] parsed
//!   from the request packet;
//! - in the other direction, everything the egress side tells the ingress
//!   side about one half: its Responses (READ responses, atomic ACKs, raw
//!   phase ACK/NAKs), `Delivered` and `Error`. The ingress side relies on a
//!   READ response arriving before a `Delivered` or `Error` past it (it
//!   delivers the response first so that a NAK it then injects does not
//!   overtake it). A Response packet names the requester's QPN, not the
//!   responder's, so its half cannot be told from the packet alone; all of
//!   them therefore use flow `H("rsp", requester address, responder
//!   address)`: the halves between one pair of hosts share a flow in this
//!   direction (a loss on one QP delays the answers of the others between
//!   the same two hosts, never anything else). A finer split needs the
//!   engine to name the half of a Response (see the report: an engine API
//!   giving the flow of each `Output::Twin`).
//! - Datagrams (non-RoCE traffic, RDMA-CM MADs) go as unreliable WAN
//!   datagrams and need no flow.
//!
//! `H` is FNV-1a 64 over a tag and the fields, stable across builds and
//! restarts (a hash of 0 maps to 1). Two halves whose keys collide share
//! one ordered flow: harmless, merely ordered together. Messages whose
//! packet does not parse use key 1 (the engine never produces those).

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::keyed::KeyedMap;
use crate::qp::twin::Carry;
use crate::qp::{HalfKey, TwinMsg};
use crate::roce::{IpHeader, OpKind, Psn, RocePacket};
use crate::time::Time;
use crate::wan::{SendError, WanConnection};

use super::replays::{ReadReplays, Tag};

/// At most this many messages wait per flow (a flow's share of the engine's
/// egress window is far below it).
pub const PENDING_PER_FLOW: usize = 65_536;
/// At most this many bytes wait in all flows together.
pub const PENDING_BYTES: usize = 512 << 20;
/// Above this many waiting bytes the gateway stops reading new requests from
/// the DC side (backpressure instead of overflow).
pub const PENDING_HIGH_WATER: usize = 64 << 20;

struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn ip(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => {
                self.bytes(&[4]);
                self.bytes(&a.octets());
            }
            IpAddr::V6(a) => {
                self.bytes(&[6]);
                self.bytes(&a.octets());
            }
        }
    }
    fn finish(self) -> u64 {
        self.0.max(1)
    }
}

/// The flow of a half's requests.
pub fn request_flow(h: &HalfKey) -> u64 {
    let mut f = Fnv::new();
    f.bytes(b"req");
    f.ip(h.requester);
    f.ip(h.responder);
    f.bytes(&h.responder_qpn.to_be_bytes());
    f.finish()
}

/// The flow of everything answering the requests between two hosts.
pub fn response_flow(requester: IpAddr, responder: IpAddr) -> u64 {
    let mut f = Fnv::new();
    f.bytes(b"rsp");
    f.ip(requester);
    f.ip(responder);
    f.finish()
}

/// The half of a request packet the engine built ([`HalfKey::of_request`]
/// of its parse), read from the IP header and the BTH's destination QP
/// alone: the engine parsed and checked the packet already, and parsing it
/// whole again here cost 1–1.5 % of a gateway's turns.
fn request_half(packet: &[u8]) -> Option<HalfKey> {
    const UDP_LEN: usize = 8;
    let s = IpHeader::split(packet).ok()?;
    // The BTH's bytes 5..8: the destination QP.
    let qp_at = s.header_len + UDP_LEN + 5;
    let qp = packet.get(qp_at..qp_at + 3)?;
    Some(HalfKey {
        requester: s.header.src(),
        responder: s.header.dst(),
        responder_qpn: u32::from_be_bytes([0, qp[0], qp[1], qp[2]]),
    })
}

/// The WAN flow of a reliable message; `None` for datagrams.
pub fn flow_of(msg: &TwinMsg) -> Option<u64> {
    Some(match msg {
        TwinMsg::Request { packet, .. } => match request_half(packet) {
            Some(h) => request_flow(&h),
            None => 1,
        },
        TwinMsg::Response { packet } => match IpHeader::split(packet) {
            // The response goes from the responder (src) to the requester.
            Ok(s) => response_flow(s.header.dst(), s.header.src()),
            Err(_) => 1,
        },
        TwinMsg::Delivered { half, .. } | TwinMsg::Error { half, .. } => {
            response_flow(half.requester, half.responder)
        }
        // As the requests of that half would travel.
        TwinMsg::Orphaned { qp, .. } => request_flow(qp),
        TwinMsg::Datagram { .. } => return None,
    })
}

/// The half and PSN of a raw request (a tunnel's).
fn raw_key(msg: &TwinMsg) -> Option<(HalfKey, Psn)> {
    match msg {
        TwinMsg::Request {
            carry: Carry::Raw,
            packet,
        } => HalfKey::of_request_bytes(packet),
        _ => None,
    }
}

/// A message waiting for room in the transport.
struct Waiting {
    msg: TwinMsg,
    len: usize,
    /// Order of queuing ([`ReadReplays::next_seq`]).
    seq: u64,
    /// A READ response's requester QPN and PSN ([`super::replays`]).
    tag: Option<Tag>,
}

/// The requester's QPN and the PSN of a READ response.
fn read_response_tag(msg: &TwinMsg) -> Option<Tag> {
    let TwinMsg::Response { packet } = msg else {
        return None;
    };
    let p = RocePacket::parse(packet).ok()?;
    (p.info.kind == OpKind::ReadResponse).then(|| Tag {
        qpn: p.bth.dest_qp,
        psn: p.psn(),
    })
}

/// Messages waiting for room in the transport, per flow, in order.
#[derive(Default)]
pub struct Pending {
    /// Keyed (`crate::keyed`): flow keys are hashes of what the data center
    /// sends. Only looked up, never walked.
    flows: KeyedMap<u64, VecDeque<Waiting>>,
    /// Flows with something waiting, in the order they started waiting.
    order: VecDeque<u64>,
    pub messages: usize,
    pub bytes: usize,
    pub high_water_bytes: usize,
    /// Messages refused because a bound was reached (a bug or an overload:
    /// pseudo-ACKed data may be lost; logged at error level).
    pub overflow: u64,
    /// Times a message had to wait.
    pub blocked: u64,
    /// Messages the transport refused for good (too large, too many flows,
    /// closed).
    pub send_errors: u64,
    /// Messages dropped because the twin restarted while they waited.
    pub discarded: u64,
    /// The READ responses waiting, and what resent READs make of them.
    pub replays: ReadReplays,
    /// Raw requests (a tunnel's) dropped here, at a bound or refused by
    /// the transport: their halves must hear the requester's resends of
    /// them (`QpEngine::raw_left`, `qp::ingress::tunnel`).
    pub raw_dropped: Vec<(HalfKey, Psn)>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.messages == 0
    }

    /// Sends `msg` on `flow`, or queues it behind what already waits there.
    pub fn submit(&mut self, wan: &mut WanConnection, now: Time, flow: u64, msg: TwinMsg) {
        let waiting = self.flows.get(&flow).is_some_and(|q| !q.is_empty());
        let len = WanConnection::wire_len(&msg) as usize;
        if !waiting && wan.send_room(flow) >= len as u64 {
            self.send(wan, now, flow, msg);
            return;
        }
        // `Delivered`, `Error` and `Orphaned` are a few dozen bytes and
        // nothing resends them: one dropped leaves a buffer slot held, or a
        // requester never told, for good (issue 18, seed 3408). Only
        // packets count against the bounds.
        let control = matches!(
            msg,
            TwinMsg::Delivered { .. } | TwinMsg::Error { .. } | TwinMsg::Orphaned { .. }
        );
        let full = self.bytes + len > PENDING_BYTES
            || self
                .flows
                .get(&flow)
                .is_some_and(|q| q.len() >= PENDING_PER_FLOW);
        if full && !control {
            self.overflow += 1;
            self.note_raw_drop(&msg);
            tracing::error!(
                flow = format_args!("{flow:#018x}"),
                pending_bytes = self.bytes,
                "twin queue overflow: message dropped (pseudo-ACKed data may be lost; overload or bug)"
            );
            return;
        }
        self.blocked += 1;
        let seq = self.replays.next_seq();
        let tag = read_response_tag(&msg);
        if let Some(t) = tag {
            self.replays.queue(flow, t, seq);
        }
        let q = self.flows.entry(flow).or_default();
        if q.is_empty() {
            self.order.push_back(flow);
        }
        q.push_back(Waiting { msg, len, seq, tag });
        self.messages += 1;
        self.bytes += len;
        self.high_water_bytes = self.high_water_bytes.max(self.bytes);
    }

    /// A raw request that will not reach the twin: its half is told.
    fn note_raw_drop(&mut self, msg: &TwinMsg) {
        self.raw_dropped.extend(raw_key(msg));
    }

    fn send(&mut self, wan: &mut WanConnection, now: Time, flow: u64, msg: TwinMsg) {
        let raw = raw_key(&msg);
        if let Err(e) = wan.send(now, flow, msg) {
            self.raw_dropped.extend(raw);
            self.send_errors += 1;
            let level_error = !matches!(e, SendError::Closed);
            if level_error {
                tracing::error!(flow = format_args!("{flow:#018x}"), error = %e, "twin message refused by the WAN transport");
            }
        }
    }

    /// Moves waiting messages into the transport while it has room.
    /// Returns whether anything moved.
    pub fn flush(&mut self, wan: &mut WanConnection, now: Time) -> bool {
        let mut moved = false;
        for _ in 0..self.order.len() {
            let Some(flow) = self.order.pop_front() else {
                break;
            };
            let Some(q) = self.flows.get_mut(&flow) else {
                continue;
            };
            while let Some(w) = q.front() {
                let dead = w.tag.is_some_and(|t| self.replays.is_dead(flow, &t, w.seq));
                if !dead && wan.send_room(flow) < w.len as u64 {
                    break;
                }
                let w = q.pop_front().expect("front exists");
                self.messages -= 1;
                self.bytes -= w.len;
                moved = true;
                if let Some(t) = w.tag {
                    self.replays.dequeue(flow, &t);
                }
                if dead {
                    // A replay behind it brings it again (`replays`).
                    self.replays.stale += 1;
                    continue;
                }
                let raw = raw_key(&w.msg);
                if let Err(e) = wan.send(now, flow, w.msg) {
                    self.raw_dropped.extend(raw);
                    self.send_errors += 1;
                    tracing::error!(flow = format_args!("{flow:#018x}"), error = %e, "twin message refused by the WAN transport");
                }
            }
            self.replays.advanced(flow, q.front().map(|w| w.seq));
            if q.is_empty() {
                self.flows.remove(&flow);
            } else {
                self.order.push_back(flow);
            }
        }
        moved
    }

    /// Forgets everything (the twin restarted: its session is gone),
    /// handing each waiting message to `each`, in no particular order (its
    /// packet may be one to keep: `Site::drop_twin_output`).
    pub fn drain(&mut self, mut each: impl FnMut(TwinMsg)) {
        for (_, q) in self.flows.iter_mut() {
            for w in q.drain(..) {
                each(w.msg);
            }
        }
        self.clear();
    }

    /// Forgets everything (the twin restarted: its session is gone).
    pub fn clear(&mut self) {
        self.discarded += self.messages as u64;
        self.flows.clear();
        self.order.clear();
        self.messages = 0;
        self.bytes = 0;
        self.replays.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roce::{NakCode, Psn};

    /// The half both tests speak of.
    fn half() -> HalfKey {
        HalfKey {
            requester: "10.1.0.1".parse().unwrap(),
            responder: "10.2.0.1".parse().unwrap(),
            responder_qpn: 0x22,
        }
    }

    /// What the far side reports about `h`'s request at `psn`: delivered,
    /// and refused for good.
    fn delivered_and_error(h: HalfKey, psn: u32) -> (TwinMsg, TwinMsg) {
        let delivered = TwinMsg::Delivered {
            half: h,
            psn: Psn::new(psn),
            msn: None,
        };
        let error = TwinMsg::Error {
            half: h,
            psn: Psn::new(psn),
            code: NakCode::RemoteOperationalError,
        };
        (delivered, error)
    }

    /// The light read of a request's half gives what the full parse
    /// gives, over IPv4 and IPv6 and QPNs using all 24 bits.
    #[test]
    fn request_half_matches_the_parse() {
        use crate::roce::{builders, Opcode, Reth};
        let hosts: [(IpAddr, IpAddr); 2] = [
            ("10.1.0.1".parse().unwrap(), "10.2.0.1".parse().unwrap()),
            ("fd00::1".parse().unwrap(), "fd00:2::7".parse().unwrap()),
        ];
        for (src, dst) in hosts {
            for qpn in [0x11, 0xAB_CDEF, 0xFF_FFFF] {
                let ip = IpHeader::between(src, dst).unwrap();
                let pkt = builders::request(
                    ip,
                    qpn,
                    Opcode::RC_SEND_ONLY,
                    Psn::new(9),
                    true,
                    Reth::default(),
                )
                .to_vec(&[1, 2, 3])
                .unwrap();
                let parsed = HalfKey::of_request(&RocePacket::parse(&pkt).unwrap());
                assert_eq!(request_half(&pkt), Some(parsed));
                assert_eq!(parsed.responder_qpn, qpn);
            }
        }
        assert_eq!(request_half(&[0x45, 0, 0]), None);
    }

    #[test]
    fn delivered_and_error_share_the_response_flow() {
        let h = half();
        let (d, e) = delivered_and_error(h, 5);
        assert_eq!(flow_of(&d), flow_of(&e));
        assert_eq!(flow_of(&d), Some(response_flow(h.requester, h.responder)));
        assert_ne!(request_flow(&h), response_flow(h.requester, h.responder));
        assert_eq!(
            flow_of(&TwinMsg::Datagram {
                packet: vec![].into()
            }),
            None
        );
        assert_ne!(request_flow(&h), 0);
    }

    /// Issue 18, sweep seed 3408: a response flow at its bound dropped the
    /// `Delivered` behind the READ responses it dropped; the ingress kept a
    /// buffer slot for it forever. Packets may be refused at the bound
    /// (READ responses are asked for again); `Delivered` and `Error` never.
    #[test]
    fn the_bound_refuses_packets_never_delivered_or_error() {
        use crate::wan::{PathConfig, WanConfig};
        let h = half();
        // No twin yet: once the transport's flow window is full (nothing
        // is ever acknowledged), messages wait here, up to the bound.
        let cfg = WanConfig::new(vec![PathConfig::new("p")], Some([1; 32]), true);
        let mut wan = WanConnection::new(cfg, Time::ZERO, 1);
        let flow = response_flow(h.requester, h.responder);
        let mut p = Pending::default();
        let response = || TwinMsg::Response {
            packet: vec![0x45; 64].into(),
        };
        for _ in 0..10 * PENDING_PER_FLOW {
            if p.messages == PENDING_PER_FLOW {
                break;
            }
            p.submit(&mut wan, Time::ZERO, flow, response());
        }
        assert_eq!((p.messages, p.overflow), (PENDING_PER_FLOW, 0));
        p.submit(&mut wan, Time::ZERO, flow, response());
        assert_eq!(p.overflow, 1, "a packet beyond the bound is refused");
        let (delivered, error) = delivered_and_error(h, 5);
        p.submit(&mut wan, Time::ZERO, flow, delivered);
        p.submit(&mut wan, Time::ZERO, flow, error);
        assert_eq!(p.overflow, 1, "Delivered and Error are never dropped");
        assert_eq!(p.messages, PENDING_PER_FLOW + 2);
    }

    /// A tunnel's request dropped here never reaches the twin: its half
    /// must hear the requester's resend of it (`qp::ingress::tunnel`), so
    /// the drop is reported with the request's half and PSN. The transport
    /// refusing one (closed) is reported the same way.
    #[test]
    fn a_raw_request_dropped_here_is_reported_to_its_half() {
        use crate::qp::twin::Carry;
        use crate::roce::{builders, Opcode, Reth};
        use crate::wan::{PathConfig, WanConfig};
        let h = half();
        let raw = |psn: u32| TwinMsg::Request {
            carry: Carry::Raw,
            packet: builders::request(
                IpHeader::between(h.requester, h.responder).unwrap(),
                h.responder_qpn,
                Opcode::RC_WRITE_ONLY,
                Psn::new(psn),
                true,
                Reth::default(),
            )
            .to_vec(&[7; 64])
            .unwrap()
            .into(),
        };
        let cfg = WanConfig::new(vec![PathConfig::new("p")], Some([1; 32]), true);
        let mut wan = WanConnection::new(cfg, Time::ZERO, 1);
        let flow = request_flow(&h);
        let mut p = Pending::default();
        let mut psn = 0;
        while p.messages < PENDING_PER_FLOW {
            p.submit(&mut wan, Time::ZERO, flow, raw(psn));
            psn += 1;
        }
        assert!(p.raw_dropped.is_empty(), "{:?}", p.raw_dropped);
        p.submit(&mut wan, Time::ZERO, flow, raw(psn));
        assert_eq!(p.overflow, 1);
        assert_eq!(p.raw_dropped, vec![(h, Psn::new(psn))]);
    }
}
