//! The ingress role: the gateway at the requester's site.
//!
//! [`PseudoAcker`] behaves toward the requester as its responder would
//! (rxe_resp.c): in-order requests are accepted, duplicates re-acknowledged,
//! a gap gets one PSN-sequence-error NAK. But it acknowledges as soon as a
//! packet is safely in the deep buffer, so the requester's window of 128
//! PSNs never waits a WAN round trip. What it must never do:
//!
//! - acknowledge at or past an outstanding READ or atomic (rxe treats that
//!   as an implied NAK, and the answer must come from the real responder);
//! - acknowledge a packet it then loses: buffered packets are kept until the
//!   twin reports them delivered (acknowledged by the real responder);
//! - let a far-end failure look like success: it injects a NAK instead.

use crate::buffer::PacketBuf;
use std::collections::VecDeque;

use soya_config::AckPolicy;

use crate::buffer::{DeepBuffer, SlotHandle};
use crate::roce::builders::ReplyTo;
use crate::roce::{NakCode, OpKind, Position, Psn, RocePacket};
use crate::time::Time;

mod acking;
mod gap;
mod pacing;
mod resend;
mod resume;
mod tunnel;

pub use acking::{AckTuning, HOLD_ACK_FOR, HOLD_ACK_INTERVAL};
pub use pacing::{PACED_WINDOW, PACE_WHEN_WAITING};

use super::half::HalfKey;
use super::outbox::{Outbox, Output};
use super::poison::InProgress;
use super::quiet::Quiet;
use super::twin::{Carry, TwinMsg, MAX_ORPHAN_CANDIDATES};

/// How far this half has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Requester QPN unknown (or policy `off`): a plain tunnel.
    Raw,
    /// Requester QPN learned; waiting for the real ACK that covers every
    /// packet forwarded raw (`raw_high`) before pseudo-ACKing anything.
    Switching,
    /// Pseudo-ACKing.
    Accelerated,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IngressStats {
    pub packets: u64,
    pub bytes: u64,
    pub raw_packets: u64,
    /// Tunnel-phase resends of WRITE/SEND packets not forwarded: the
    /// original was forwarded and is unanswered, so it is still on its
    /// reliable way to the responder (`tunnel::TunnelResends`).
    pub raw_resends_dropped: u64,
    pub pseudo_acks: u64,
    pub duplicate_acks: u64,
    pub duplicates_dropped: u64,
    pub seq_naks: u64,
    /// Gap NAKs held back until the READ/atomic responses before them had
    /// reached the requester (`PseudoAcker::nak_gap`).
    pub seq_naks_deferred: u64,
    /// Of `seq_naks`: sent once the buffer had room again after requests
    /// were dropped at its hard limit (`acking`, "An owed NAK").
    pub seq_naks_owed: u64,
    pub out_of_order_dropped: u64,
    pub backpressure_drops: u64,
    pub withheld_acks: u64,
    /// Last pseudo-ACK repeated while withholding (see [`HOLD_ACK_INTERVAL`]).
    pub hold_acks: u64,
    pub cnps_sent: u64,
    pub responses_delivered: u64,
    pub errors_injected: u64,
}

/// One accepted request packet, kept until delivered and acknowledged.
/// A request the ingress accepted, waiting for its bytes
/// ([`PseudoAcker::hold`]).
#[derive(Debug)]
#[must_use = "an admitted request must be held"]
pub struct Admitted(Entry);

#[derive(Debug)]
struct Entry {
    psn: Psn,
    /// PSNs it occupies (a READ of n MTUs occupies n; see [`span_of`]).
    span: u32,
    /// Upper bound of `span` while the path MTU is unknown (READ only).
    span_max: u32,
    /// Messages completed up to and including this packet.
    msgs_after: u64,
    ack_req: bool,
    ends_message: bool,
    /// A READ or atomic: only the real response may acknowledge it.
    needs_response: bool,
    answered: bool,
    /// Its place in the deep buffer's quotas, until delivered.
    slot: Option<SlotHandle>,
    /// The packet itself, in a pooled buffer (the one the DC backend read
    /// it into, or a copy made once on arrival), until forwarded: then it
    /// moves, uncopied, into the message for the twin, and the WAN
    /// transport holds it until the twin has it. The transport then hands
    /// the same buffer back ([`PseudoAcker::take_back`]), and it is kept
    /// here again until the twin reports it delivered: what a new
    /// incarnation of the twin is sent again (`resume`; issue 35). One
    /// buffer per packet, never a second copy.
    bytes: Option<PacketBuf>,
    forwarded: bool,
    accepted_at: Time,
    /// Its opcode: what the responder has in progress once it executed it
    /// ([`PseudoAcker::orphan_plan`]).
    op: crate::roce::Opcode,
}

impl Entry {
    fn last(&self) -> Psn {
        self.psn.add(self.span - 1)
    }
}

/// Ingress state of one half.
#[derive(Debug)]
pub struct PseudoAcker {
    pub key: HalfKey,
    /// `key.id()`, the deep buffer's quota key, computed once (it hashes
    /// the key: not worth redoing on every packet).
    flow_id: u64,
    pub mode: Mode,
    reply: Option<ReplyTo>,
    tuning: AckTuning,
    /// Next PSN expected from the requester.
    expected: Option<Psn>,
    nak_sent: bool,
    entries: VecDeque<Entry>,
    /// Index of the first entry not yet acknowledged to the requester.
    first_unacked: usize,
    /// Index of the first entry not yet forwarded to the twin.
    next_forward: usize,
    /// Messages completed through the newest accepted packet.
    msgs: u64,
    /// The responder's MSN = `msn_base + msgs_after` (wrapping, 24 bits).
    msn_base: Option<u32>,
    /// Last PSN (and MSN) the requester was told is done.
    acked: Option<(Psn, u32)>,
    delivered: Option<Psn>,
    in_flight: u32,
    /// Highest PSN forwarded raw (before switching), and whether the
    /// responder has acknowledged it.
    raw_high: Option<Psn>,
    /// First PSN forwarded raw.
    raw_low: Option<Psn>,
    raw_acked: bool,
    /// Highest PSN the responder has answered (an ACK, the last packet
    /// of a READ response, an atomic ACK) since the tunnel phase began,
    /// or `raw_high` once a fatal NAK ended the QP. Unlike `raw_acked` it
    /// keeps up with `raw_high` for a half that stays a tunnel (policy
    /// `off`, or a QP not yet learned): a drain before a planned restart
    /// waits until it covers `raw_high` ([`Self::owes_requester`]), since
    /// a tunnel keeps no copy of what it forwarded and the answers on
    /// their way would die with the old session.
    raw_answered: Option<Psn>,
    /// Which resends of the tunnel phase go to the responder (`tunnel`).
    raw_resends: tunnel::TunnelResends,
    ack_deadline: Option<Time>,
    /// While pseudo-ACKs are withheld: when to repeat the last one, and
    /// since when they are withheld.
    hold_deadline: Option<Time>,
    hold_since: Option<Time>,
    failed: Option<NakCode>,
    /// The first unacknowledged PSN when the half failed (its entries are
    /// gone after that).
    failed_at: Option<Psn>,
    /// The message in progress at the responder once it executed every
    /// packet forwarded raw, and once it executed everything delivered.
    raw_state: InProgress,
    delivered_state: InProgress,
    last_cnp: Option<Time>,
    /// Paced by CNPs while a queue stands in the buffer (`pacing`).
    pacing: pacing::Pacing,
    /// Path MTU, from RDMA-CM or from the payload of First/Middle packets.
    pmtu: Option<u32>,
    /// The newest request was a READ whose span is a guess: (PSN, most PSNs
    /// it may occupy).
    read_slack: Option<(Psn, u32, u32)>,
    /// Packets beyond that guess were dropped: NAK once the span is known.
    nak_after_read: bool,
    /// A gap NAK is due but would pass a READ/atomic still waiting for its
    /// response: it goes out once that response has (`nak_gap`).
    nak_deferred: bool,
    /// The request at `expected` was dropped at the buffer's hard limit:
    /// a NAK for it is owed once there is room (`acking::pay_owed_nak`).
    nak_owed: bool,
    /// Most packets the requester was seen to send past our last
    /// pseudo-ACK: its window, as far as we know it (`acking`).
    window: usize,
    /// The requester was seen stopped at `window` (withheld, and nothing
    /// more came for a hold interval): from then on `window` is its
    /// window, not a lower bound under the assumed one (`acking`).
    window_seen: bool,
    /// Packets past the last pseudo-ACK at the previous hold check.
    past_ack_at_hold: usize,
    /// The requester's go-back-N round of resends under way (`resend`).
    resend_round: Option<resend::Round>,
    /// Activity, for forgetting the half once it is quiet (`qp::engine::expiry`).
    pub quiet: Quiet,
    pub stats: IngressStats,
}

impl PseudoAcker {
    /// Bytes of this half's own bookkeeping on the heap: its per-packet
    /// entries as allocated (the packets they hold are buffers, not
    /// counted). See `QpEngine::state_bytes`.
    pub fn bookkeeping_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    /// A half first seen in traffic: starts as a tunnel.
    pub fn new_raw(key: HalfKey, tuning: AckTuning) -> PseudoAcker {
        PseudoAcker {
            raw_state: InProgress::Nothing,
            delivered_state: InProgress::Nothing,
            key,
            flow_id: key.id(),
            mode: Mode::Raw,
            reply: None,
            tuning,
            expected: None,
            nak_sent: false,
            entries: VecDeque::new(),
            first_unacked: 0,
            next_forward: 0,
            msgs: 0,
            msn_base: None,
            acked: None,
            delivered: None,
            in_flight: 0,
            raw_high: None,
            raw_low: None,
            raw_acked: false,
            raw_answered: None,
            raw_resends: tunnel::TunnelResends::default(),
            ack_deadline: None,
            hold_deadline: None,
            hold_since: None,
            failed: None,
            failed_at: None,
            last_cnp: None,
            pacing: pacing::Pacing::default(),
            pmtu: None,
            read_slack: None,
            nak_after_read: false,
            nak_deferred: false,
            nak_owed: false,
            window: 0,
            window_seen: false,
            past_ack_at_hold: 0,
            resend_round: None,
            quiet: Quiet::default(),
            stats: IngressStats::default(),
        }
    }

    /// A half learned from RDMA-CM before its first packet: pseudo-ACKs from
    /// the start (MSN starts at 0, as in rxe_resp.c).
    pub fn new_learned(
        key: HalfKey,
        tuning: AckTuning,
        reply: ReplyTo,
        first_psn: Psn,
    ) -> PseudoAcker {
        let mut a = PseudoAcker::new_raw(key, tuning);
        a.reply = Some(reply);
        a.expected = Some(first_psn);
        a.msn_base = Some(0);
        a.mode = if tuning.policy == AckPolicy::Off {
            Mode::Raw
        } else {
            Mode::Accelerated
        };
        a
    }

    /// The deep buffer's key for this half's quota and promise.
    pub fn flow_id(&self) -> u64 {
        self.flow_id
    }

    /// The engine offers this half the room in the deep buffer it waits
    /// for (`qp::engine::room`): the withheld pseudo-ACK goes out if it
    /// fits now. A failed half needs no room.
    pub fn offer_room(&mut self, now: Time, buf: &mut DeepBuffer, out: &mut Outbox) {
        if self.failed.is_some() {
            buf.stop_waiting(self.flow_id);
            return;
        }
        self.maybe_ack(now, buf, out);
    }

    pub fn is_learned(&self) -> bool {
        self.reply.is_some()
    }

    /// Packets held in the deep buffer for this half.
    pub fn buffered(&self) -> usize {
        self.entries.iter().filter(|e| e.slot.is_some()).count()
    }

    /// Nothing held, nothing owed: the half can be forgotten.
    pub fn is_idle(&self) -> bool {
        self.entries.is_empty()
    }

    /// Did this half already take `psn` from its requester (forwarded or
    /// held)? Then a request packet at `psn` is the requester's resend,
    /// not a new request.
    pub fn has_seen(&self, psn: Psn) -> bool {
        let next = self.expected.or(self.raw_high.map(Psn::next));
        next.is_some_and(|n| psn.before(n))
    }

    /// The requester still waits for something through this gateway: a
    /// request held here (not yet delivered, or its answer or `strict`
    /// ACK not yet sent), or one forwarded as a tunnel whose answer has
    /// not come back. A gateway drains to none of these before it closes
    /// to restart (`QpEngine::halves_owing_requesters`).
    pub fn owes_requester(&self) -> bool {
        if self.failed.is_some() {
            return false;
        }
        let tunnel_unanswered = self
            .raw_high
            .is_some_and(|h| self.raw_answered.is_none_or(|a| a.before(h)));
        !self.entries.is_empty() || tunnel_unanswered
    }

    /// Earliest timer.
    pub fn poll_timeout(&self) -> Option<Time> {
        match (self.ack_deadline, self.hold_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn msn_at(&self, msgs_after: u64) -> u32 {
        self.msn_base.unwrap_or(0).wrapping_add(msgs_after as u32) & 0xFF_FFFF
    }

    /// A request packet from the requester. When the packet is accepted
    /// into the deep buffer the answer is [`Admitted`]: the caller then
    /// hands its bytes to [`Self::hold`], either a pooled copy or, when the
    /// DC backend read it into a pooled buffer, that buffer itself (no
    /// copy). The split exists because `p` borrows those bytes: they can
    /// only move once the parse is done with them.
    pub fn on_request(
        &mut self,
        now: Time,
        p: &RocePacket<'_>,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) -> Option<Admitted> {
        self.quiet.touch();
        if self.failed.is_some() {
            self.nak_failed(p, out);
            return None;
        }
        match self.mode {
            Mode::Raw => {
                self.forward_raw(p, out);
                None
            }
            Mode::Switching | Mode::Accelerated => self.on_reliable(now, p, buf, out),
        }
    }

    /// Holds an admitted request's bytes (`bytes`: the whole packet that
    /// [`Self::on_request`] parsed), forwards what the window allows and
    /// pseudo-ACKs what policy allows.
    pub fn hold(
        &mut self,
        now: Time,
        admitted: Admitted,
        bytes: PacketBuf,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) {
        self.quiet.touch();
        let mut e = admitted.0;
        self.stats.packets += 1;
        self.stats.bytes += bytes.len() as u64;
        e.bytes = Some(bytes);
        self.entries.push_back(e);
        self.pacing.last_arrival = Some(now);
        self.forward(out);
        self.maybe_ack(now, buf, out);
    }

    /// Could a response with this PSN answer one of our requests? Used to
    /// tell apart several QPs between the same two hosts before their
    /// requester QPNs are known (PSN spaces start at random 24-bit values).
    pub fn claims(&self, psn: Psn) -> bool {
        let in_raw = match (self.raw_low, self.raw_high) {
            (Some(lo), Some(hi)) => psn.in_range(lo.sub(1), hi),
            _ => false,
        };
        let in_entries = match (self.entries.front(), self.entries.back()) {
            (Some(f), Some(b)) => psn.in_range(f.psn.sub(1), b.last()),
            _ => false,
        };
        in_raw || in_entries
    }

    fn forward_raw(&mut self, p: &RocePacket<'_>, out: &mut Outbox) {
        if !self.raw_resend_goes(p) {
            self.stats.raw_resends_dropped += 1;
            return;
        }
        self.raw_low.get_or_insert(p.psn());
        self.learn_pmtu(p);
        let (span, span_max) = read_span(p, self.pmtu);
        let last = p.psn().add(span - 1);
        // A replay (a resent READ/atomic already answered, or a resend of
        // the tunnel phase) is not the requester's newest request: it must
        // not move the tunnel's frontier nor become the READ whose span we
        // guess — that guess would later pull `expected` back behind
        // packets already accepted.
        let replay = self.mode != Mode::Raw && self.expected.is_some_and(|e| p.psn().before(e));
        if !replay && self.raw_high.is_none_or(|h| last.after(h)) {
            self.raw_resends
                .forwarded(self.raw_high, p.psn(), last, p.bth.ack_req);
            self.raw_high = Some(last);
            self.raw_state = self.raw_state.after(p.bth.opcode);
            self.read_slack = (span < span_max).then_some((p.psn(), span_max, p.ext.reth.len));
        }
        self.stats.raw_packets += 1;
        self.stats.packets += 1;
        self.stats.bytes += p.as_bytes().len() as u64;
        out.twin(p.as_bytes(), |packet| TwinMsg::Request {
            carry: Carry::Raw,
            packet,
        });
    }

    fn on_reliable(
        &mut self,
        now: Time,
        p: &RocePacket<'_>,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) -> Option<Admitted> {
        let psn = p.psn();
        let Some(expected) = self.expected else {
            // Learned without a starting PSN: take the first packet's.
            self.expected = Some(psn);
            return self.on_reliable(now, p, buf, out);
        };
        if psn.before(expected) {
            self.on_duplicate(p, out);
            return None;
        }
        if psn.after(expected) {
            // Dropped below (a gap before it), but sent: the requester's
            // window reaches at least this far.
            self.note_dropped(psn, expected, now, buf);
        }
        if psn.after(expected) && self.read_slack.is_some() {
            // Beyond our guess of a READ's span: the READ was longer, or a
            // packet after it was lost; until its span is known we cannot
            // tell which, nor which PSN to NAK. Drop without a NAK and,
            // once the span is known, NAK the true expected PSN.
            self.stats.out_of_order_dropped += 1;
            self.nak_after_read = true;
            return None;
        }
        if psn.after(expected) {
            // Loss inside the DC: one NAK with the expected PSN, then
            // silence until the gap fills (rxe_resp.c `check_psn`).
            self.stats.out_of_order_dropped += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                self.nak_gap(expected, out);
            }
            return None;
        }
        let slot = match buf.reserve(self.flow_id, p.as_bytes().len()) {
            Ok(s) => s,
            Err(_) => {
                // Hard limit: drop unacknowledged. What the requester sends
                // after it is dropped too (out of order) and, the buffer
                // being full, a NAK now would only have the resend dropped
                // again, after which a responder says nothing more until
                // the expected PSN comes (rxe `sent_psn_nak`): the
                // requester would wait for its ACK timeout. So the NAK is
                // owed, and goes out once the buffer has room for this
                // flow (`acking::pay_owed_nak`), which also makes the flow
                // wait for room in turn, woken by whatever frees it: a
                // flow holding nothing has no event of its own to look
                // at the debt again, and its requester would hear nothing
                // until its ACK timeout (sweep seed 334).
                self.stats.backpressure_drops += 1;
                self.note_dropped(psn, expected, now, buf);
                self.nak_sent = true;
                self.nak_owed = true;
                self.maybe_cnp(now, out);
                self.maybe_ack(now, buf, out);
                return None;
            }
        };
        self.nak_sent = false;
        self.nak_deferred = false;
        self.nak_owed = false;
        self.note_window(
            self.entries.len().saturating_sub(self.first_unacked) + 1,
            now,
            buf,
        );
        self.learn_pmtu(p);
        let (span, span_max) = read_span(p, self.pmtu);
        self.read_slack = (span < span_max).then_some((psn, span_max, p.ext.reth.len));
        if p.info.completes_message() {
            self.msgs += 1;
        }
        self.expected = Some(psn.add(span));
        // Its bytes come with `hold`.
        Some(Admitted(Entry {
            psn,
            span,
            span_max,
            msgs_after: self.msgs,
            ack_req: p.bth.ack_req,
            ends_message: p.info.completes_message(),
            needs_response: p.info.needs_real_response(),
            answered: false,
            slot: Some(slot),
            bytes: None,
            forwarded: false,
            accepted_at: now,
            op: p.bth.opcode,
        }))
    }

    /// First and Middle packets (requests and READ responses alike) carry
    /// exactly one PMTU of payload (rxe_resp.c `check_length`).
    /// Returns whether the PMTU became known just now.
    fn learn_pmtu(&mut self, p: &RocePacket<'_>) -> bool {
        if self.pmtu.is_none() && matches!(p.info.position, Position::First | Position::Middle) {
            let n = p.payload().len() as u32;
            if [256, 512, 1024, 2048, 4096].contains(&n) {
                self.pmtu = Some(n);
                return true;
            }
        }
        false
    }

    /// With the PMTU known, a guessed READ span can be computed exactly.
    fn resolve_read_by_pmtu(&mut self, out: &mut Outbox) {
        if let (Some((start, _, len)), Some(pmtu)) = (self.read_slack, self.pmtu) {
            let span = len.div_ceil(pmtu).max(1);
            self.resolve_read(start.add(span - 1), out);
        }
    }

    /// The last response of the READ whose span we had to guess: now we
    /// know where the next request starts.
    fn resolve_read(&mut self, last: Psn, out: &mut Outbox) {
        let Some((start, max, _)) = self.read_slack else {
            return;
        };
        if !last.in_window(start, max) {
            return;
        }
        self.read_slack = None;
        if let Some(e) = self.entries.back_mut().filter(|e| e.psn == start) {
            let span = last.diff(start) as u32 + 1;
            if e.forwarded {
                self.in_flight = (self.in_flight + span).saturating_sub(e.span);
            }
            e.span = span;
        }
        if self
            .raw_high
            .is_some_and(|h| !h.before(start) && h.before(last))
        {
            self.raw_high = Some(last);
        }
        let newest = self.expected.is_none_or(|e| !last.next().before(e));
        if self.mode != Mode::Raw && newest {
            // Nothing was accepted after the READ (that would have resolved
            // it), so the next expected PSN follows its true last PSN.
            let expected = last.next();
            self.expected = Some(expected);
            if std::mem::take(&mut self.nak_after_read) {
                self.nak_sent = true;
                self.nak_gap(expected, out);
            }
        }
    }

    /// Sets the path MTU learned from RDMA-CM.
    pub fn set_pmtu(&mut self, pmtu: u32) {
        if pmtu > 0 {
            self.pmtu = Some(pmtu);
        }
    }

    /// Forwards accepted packets to the twin while the egress window allows.
    fn forward(&mut self, out: &mut Outbox) {
        // Entries before `next_forward` are all forwarded: start there, so
        // a deep buffer costs nothing per packet.
        while let Some(e) = self.entries.get_mut(self.next_forward) {
            if self.in_flight >= self.tuning.egress_window {
                break;
            }
            self.next_forward += 1;
            if e.forwarded {
                continue;
            }
            let Some(packet) = e.bytes.take() else {
                continue;
            };
            e.forwarded = true;
            self.in_flight += e.span;
            out.push_back(Output::Twin(TwinMsg::Request {
                carry: Carry::Reliable,
                packet,
            }));
        }
    }

    /// Coalescing timer, and the repeated ACK while withholding.
    pub fn on_timeout(&mut self, now: Time, buf: &mut DeepBuffer, out: &mut Outbox) {
        if self.ack_deadline.is_some_and(|d| now >= d) {
            self.maybe_ack(now, buf, out);
        }
        if self.hold_deadline.is_some_and(|d| now >= d) {
            self.hold_deadline = None;
            self.note_stopped(now, buf);
            let before = self.acked;
            self.maybe_ack(now, buf, out);
            // Still withholding: repeat the last ACK, which moves nothing
            // but tells the requester its responder is alive (rxe restarts
            // its retransmission timer on every response it processes), so
            // that backpressure longer than its ACK timeout does not make
            // it resend its whole window.
            if let (Some((psn, msn)), true) = (self.acked, self.hold_deadline.is_some()) {
                if before == self.acked && self.failed.is_none() {
                    self.stats.hold_acks += 1;
                    self.send_ack(psn, msn, out);
                }
            }
        }
    }

    /// The twin reports the real responder acknowledged up to `psn`.
    pub fn on_delivered(
        &mut self,
        now: Time,
        psn: Psn,
        msn: Option<u32>,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) {
        self.quiet.touch();
        if let Some(m) = msn {
            self.note_msn(psn, m);
        }
        if self.delivered.is_some_and(|d| !psn.after(d)) {
            return;
        }
        self.release_delivered(now, psn, buf, out);
        self.forward(out);
        self.maybe_ack(now, buf, out);
    }

    /// Frees every entry up to and including `psn` (the responder has
    /// it): its slot, and its buffer, back to the pool.
    fn release_delivered(&mut self, now: Time, psn: Psn, buf: &mut DeepBuffer, out: &mut Outbox) {
        self.delivered = Some(psn);
        self.note_real_progress(psn);
        for e in self.entries.iter_mut() {
            if e.last().after(psn) {
                break;
            }
            if let Some(slot) = e.slot.take() {
                buf.note_transit(e.accepted_at, now);
                buf.release(self.flow_id, slot);
                self.delivered_state = self.delivered_state.after(e.op);
            }
            if let Some(b) = e.bytes.take() {
                out.pool.put(b);
            }
            if e.forwarded {
                self.in_flight = self.in_flight.saturating_sub(e.span);
            }
        }
        self.pop_done();
        if buf.flow_slots(self.flow_id) == 0 {
            // Its last slot went with its promise: what its requester may
            // still send is promised again, for a while (a requester
            // sharing its host's link may take longer to use its window
            // than the WAN takes to deliver what it sent).
            self.renew_promise(now, buf);
        }
    }

    /// The buffer of the request at `psn`, handed back by the WAN
    /// transport once it is done with it (the twin acknowledged the
    /// message, or restarted): kept until the twin reports the request
    /// delivered. Given back to the caller when nothing here waits for it
    /// (delivered already, or never held: a packet forwarded raw).
    pub fn take_back(&mut self, psn: Psn, bytes: PacketBuf) -> Option<PacketBuf> {
        // Entries are in PSN order.
        let i = self.entries.partition_point(|e| e.psn.before(psn));
        match self.entries.get_mut(i) {
            Some(e) if e.psn == psn && e.forwarded && e.slot.is_some() && e.bytes.is_none() => {
                e.bytes = Some(bytes);
                None
            }
            _ => Some(bytes),
        }
    }

    /// Drops entries that are both delivered and acknowledged.
    fn pop_done(&mut self) {
        while self.first_unacked > 0 {
            match self.entries.front() {
                Some(e) if e.slot.is_none() => {
                    self.entries.pop_front();
                    self.first_unacked -= 1;
                    self.next_forward = self.next_forward.saturating_sub(1);
                }
                _ => break,
            }
        }
    }

    /// Learns the responder's MSN base from a real answer: its MSN `msn`
    /// at `psn` (an ACK, a NAK, a READ response's AETH).
    fn note_msn(&mut self, psn: Psn, msn: u32) {
        if self.msn_base.is_some() {
            return;
        }
        if self.raw_high == Some(psn) {
            // Entries count messages from zero after the raw phase.
            self.msn_base = Some(msn);
        } else if let Some(e) = self.entries.iter().find(|e| e.last() == psn) {
            self.msn_base = Some(msn.wrapping_sub(e.msgs_after as u32) & 0xFF_FFFF);
        }
        self.finish_switch();
    }

    /// The responder really got everything up to `psn`.
    fn note_real_progress(&mut self, psn: Psn) {
        self.note_raw_answered(psn);
        if self.raw_high.is_none_or(|h| !psn.before(h)) {
            if !self.raw_acked {
                // Entries start after the tunnel phase.
                self.delivered_state = self.raw_state;
            }
            self.raw_acked = true;
        }
        self.finish_switch();
    }

    /// Pseudo-ACKs may start once every raw packet is really acknowledged
    /// and the MSN is known.
    fn finish_switch(&mut self) {
        if self.mode == Mode::Switching && self.raw_acked && self.msn_base.is_some() {
            self.mode = Mode::Accelerated;
        }
    }

    /// A packet from the far responder for this half's requester: READ
    /// response or atomic ACK (always), or an ACK/NAK of the raw phase.
    /// Returns the packet to deliver, if it should be delivered.
    pub fn on_response(
        &mut self,
        now: Time,
        p: &RocePacket<'_>,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) -> bool {
        self.quiet.touch();
        let was_accelerated = self.mode == Mode::Accelerated;
        if !self.is_learned() {
            self.learn_from_response(p);
        }
        let psn = p.psn();
        match p.info.kind {
            OpKind::ReadResponse | OpKind::AtomicAck => {
                self.stats.responses_delivered += 1;
                // Deliver first: anything we send after it (a NAK for the
                // PSN after a READ) must not overtake it, or the requester
                // would see a NAK past a pending READ (an implied NAK).
                out.dc(p.as_bytes());
                if self.learn_pmtu(p) {
                    self.resolve_read_by_pmtu(out);
                }
                if p.info.position.ends() {
                    if let Some(e) = self
                        .entries
                        .iter_mut()
                        .find(|e| e.needs_response && psn.in_window(e.psn, e.span_max))
                    {
                        // The last response tells the READ's true span.
                        e.span = psn.diff(e.psn) as u32 + 1;
                        e.answered = true;
                    }
                    if p.info.kind == OpKind::ReadResponse {
                        self.resolve_read(psn, out);
                    }
                    if let Some(aeth) = p.ext.aeth {
                        self.note_msn(psn, aeth.msn);
                        self.note_real_progress(psn);
                    }
                    let msn = self
                        .entries
                        .iter()
                        .find(|e| e.last() == psn)
                        .map_or(self.acked.map_or(0, |(_, m)| m), |e| {
                            self.msn_at(e.msgs_after)
                        });
                    // The response acknowledges everything up to it.
                    self.set_acked(psn, msn);
                    self.renew_promise(now, buf);
                    // After the response, never before it.
                    if let (true, Some(expected)) = (self.nak_deferred, self.expected) {
                        self.nak_gap(expected, out);
                    }
                }
                self.maybe_ack(now, buf, out);
                true
            }
            // Once pseudo-ACKing, the requester hears only from us.
            _ if was_accelerated => false,
            _ => {
                if let Some(aeth) = p.ext.aeth {
                    match aeth.syndrome {
                        crate::roce::Syndrome::Ack { .. } => self.on_raw_ack(psn, aeth.msn),
                        // The responder got everything before `psn`; the
                        // requester resends from there.
                        crate::roce::Syndrome::Nak(NakCode::PsnSequenceError) => {
                            self.note_raw_answered(psn.sub(1));
                            self.raw_resends.nak(psn);
                        }
                        // A fatal NAK: the requester's QP goes to error and
                        // sends nothing more; nothing is owed.
                        crate::roce::Syndrome::Nak(_) => {
                            if let Some(h) = self.raw_high {
                                self.note_raw_answered(h);
                            }
                        }
                        // RNR: the requester resends after its timer,
                        // from `psn`: the responder dropped what followed.
                        _ => self.raw_resends.nak(psn),
                    }
                }
                out.dc(p.as_bytes());
                true
            }
        }
    }

    fn note_raw_answered(&mut self, psn: Psn) {
        if self.raw_answered.is_none_or(|a| psn.after(a)) {
            self.raw_answered = Some(psn);
        }
    }

    /// A real ACK during the raw phase, delivered to the requester.
    fn on_raw_ack(&mut self, psn: Psn, msn: u32) {
        self.note_msn(psn, msn);
        // The requester has it: what it covers is acknowledged (entries
        // taken while switching, too), and done once delivered.
        self.set_acked(psn, msn);
        self.note_real_progress(psn);
    }

    /// The first response tells us the requester's QPN (the BTH carries only
    /// the destination): switch from tunnel to pseudo-ACKing.
    fn learn_from_response(&mut self, p: &RocePacket<'_>) {
        if self.tuning.policy == AckPolicy::Off {
            return;
        }
        self.reply = Some(ReplyTo {
            ip: p.ip,
            src_port: p.udp.src_port,
            dest_qp: p.bth.dest_qp,
        });
        self.mode = Mode::Switching;
        self.expected = self.raw_high.map(Psn::next);
    }

    /// The far side failed: surface it to the requester.
    pub fn on_error(&mut self, psn: Psn, code: NakCode, out: &mut Outbox) {
        self.quiet.touch();
        self.failed = Some(code);
        // The requester's oldest unacknowledged PSN is the one after our
        // last ACK; a NAK there lands on its head WQE (rxe_comp.c).
        let at = self.first_unacked_psn().unwrap_or(psn);
        self.failed_at = self.failed_at.or(Some(at));
        self.stats.errors_injected += 1;
        self.send_nak(at, code, out);
    }

    /// The requester's QPN, once learned (RDMA-CM or its first response).
    pub fn requester_qpn(&self) -> Option<u32> {
        self.reply.map(|r| r.dest_qp)
    }

    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Where the far responder's expected PSN (ePSN) can be, for telling
    /// its gateway when that one restarted (`TwinMsg::Orphaned`): the PSN
    /// after the last one it acknowledged (delivered), with the message it
    /// has in progress there, then the PSN after each packet forwarded and
    /// not yet reported delivered (each may be the last it executed).
    /// Packets never forwarded cannot have been executed. Empty, with a
    /// hint for probing, when it cannot be known this way: a tunnel phase
    /// not yet acknowledged (its packets are not held here), or more than
    /// [`MAX_ORPHAN_CANDIDATES`] candidates.
    pub fn orphan_plan(&self) -> (Vec<(Psn, InProgress)>, Option<Psn>) {
        if self.raw_high.is_some() && !self.raw_acked {
            return (Vec::new(), self.raw_high.map(Psn::next));
        }
        let base = match (self.delivered, self.raw_high) {
            (Some(d), Some(r)) => Some(if d.after(r) { d } else { r }.next()),
            (d, r) => d.or(r).map(Psn::next),
        };
        let first_held = self.entries.iter().find(|e| e.slot.is_some());
        // Nothing delivered and no tunnel phase: the first packet ever
        // sent (or, learned from RDMA-CM with nothing sent, the first PSN).
        let Some(mut at) = base.or(first_held.map(|e| e.psn)).or(self.expected) else {
            return (Vec::new(), None);
        };
        let mut state = self.delivered_state;
        let mut plan = vec![(at, state)];
        for e in self.entries.iter().filter(|e| e.slot.is_some()) {
            if !e.forwarded || e.psn != at {
                break;
            }
            state = state.after(e.op);
            at = e.last().next();
            plan.push((at, state));
            if plan.len() > MAX_ORPHAN_CANDIDATES {
                return (Vec::new(), base);
            }
        }
        (plan, None)
    }

    /// Was the requester told that a request is done which the responder
    /// has not acknowledged (pseudo-ACKed, not yet delivered)? If such a
    /// request fails now, the requester believes in data that never
    /// landed.
    pub fn told_undelivered(&self) -> bool {
        self.entries
            .iter()
            .take(self.first_unacked)
            .any(|e| e.slot.is_some())
    }

    /// The first PSN the requester has not been told is done (rxe's
    /// `comp.psn` as far as this half knows): the one after the last ACK
    /// (pseudo or real), or, before any, the first PSN it sent (or will
    /// send, when learned from RDMA-CM).
    fn first_unacked_psn(&self) -> Option<Psn> {
        match self.acked {
            Some((a, _)) => Some(a.next()),
            None => self
                .raw_low
                .or(self.entries.front().map(|e| e.psn))
                .or(self.failed_at)
                .or(self.expected),
        }
    }

    /// The requester's oldest outstanding PSN: the first one not
    /// acknowledged, if the requester has sent it (it is before the next
    /// PSN expected from it). `None`: everything it sent is acknowledged
    /// (pseudo-ACKed or really), so a NAK would find no work request to
    /// land on (rxe_comp.c drops it).
    pub fn next_outstanding(&self) -> Option<Psn> {
        let first = self.first_unacked_psn()?;
        let end = match (self.expected, self.raw_high) {
            (Some(e), _) => e,
            (None, Some(h)) => h.next(),
            (None, None) => return None,
        };
        first.before(end).then_some(first)
    }

    /// The twin is lost for good: fail this half. The requester's oldest
    /// outstanding PSN (if it has one) gets a NAK with `code`, exactly
    /// there; every buffered packet is released; every later request is
    /// answered with the same NAK. Returns the PSN NAKed, or `None` when
    /// the requester has nothing outstanding (or the half cannot answer:
    /// requester QPN unknown), for the caller to move the QP to error
    /// another way (`qp::poison`).
    pub fn fail_twin_lost(
        &mut self,
        code: NakCode,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) -> Option<Psn> {
        self.quiet.touch();
        if self.failed.is_none() {
            self.failed = Some(code);
        }
        let code = self.failed.unwrap_or(code);
        let at = self.next_outstanding();
        self.failed_at = self.failed_at.or(self.first_unacked_psn());
        self.release_all(buf);
        self.ack_deadline = None;
        self.hold_deadline = None;
        self.hold_since = None;
        let at = at.filter(|_| self.reply.is_some())?;
        self.stats.errors_injected += 1;
        self.send_nak(at, code, out);
        Some(at)
    }

    /// A request while the twin is unreachable: refused with `code` at
    /// the requester's first unacknowledged PSN (never past the request's
    /// own), nothing buffered, nothing pseudo-ACKed; the half is failed so
    /// that everything later is refused the same way. Returns whether a NAK
    /// could be sent (the requester QPN is known).
    pub fn refuse(&mut self, p: &RocePacket<'_>, code: NakCode, out: &mut Outbox) -> bool {
        self.quiet.touch();
        if self.failed.is_none() {
            self.failed = Some(code);
        }
        if self.reply.is_none() {
            return false;
        }
        let before = self.stats.errors_injected;
        self.nak_failed(p, out);
        self.stats.errors_injected > before
    }

    /// A request on a failed half: answered with the error so the
    /// requester's QP goes to error (never success). The NAK goes to the
    /// first PSN not acknowledged, never past it: a NAK implicitly
    /// acknowledges every PSN before its own (rxe_comp.c), which must not
    /// complete a request accepted before the failure but not acknowledged.
    fn nak_failed(&mut self, p: &RocePacket<'_>, out: &mut Outbox) {
        let Some(code) = self.failed else { return };
        if self.expected.is_none_or(|e| !p.psn().before(e)) {
            let at = self.first_unacked_psn().unwrap_or(p.psn());
            let at = if at.after(p.psn()) { p.psn() } else { at };
            self.send_nak(at, code, out);
            self.stats.errors_injected += 1;
        }
    }

    /// Releases every buffered packet (the flow is being torn down).
    pub fn release_all(&mut self, buf: &mut DeepBuffer) {
        buf.stop_waiting(self.flow_id);
        for e in self.entries.iter_mut() {
            if let Some(slot) = e.slot.take() {
                buf.release(self.flow_id, slot);
            }
        }
        self.entries.clear();
        self.next_forward = 0;
        self.first_unacked = 0;
    }
}

/// PSNs a request occupies: a READ of L bytes takes max(1, ceil(L / PMTU))
/// (rxe_req.c `update_wqe_psn`), everything else one.
pub fn span_of(p: &RocePacket<'_>) -> u32 {
    read_span(p, None).0
}

/// `(span, span_max)`: with the PMTU unknown, a READ's span is guessed with
/// the largest RoCE MTU (4096, the fewest PSNs) and may turn out longer, up
/// to the count for the smallest (256). Guessing short is the safe side: the
/// READ blocks acknowledgements until its real response, whose last PSN
/// tells the truth, and a following request beyond the guess widens it.
fn read_span(p: &RocePacket<'_>, pmtu: Option<u32>) -> (u32, u32) {
    if p.info.kind != OpKind::ReadRequest {
        return (1, 1);
    }
    let len = p.ext.reth.len;
    match pmtu {
        Some(m) if m > 0 => {
            let n = len.div_ceil(m).max(1);
            (n, n)
        }
        _ => (len.div_ceil(4096).max(1), len.div_ceil(256).max(1)),
    }
}
