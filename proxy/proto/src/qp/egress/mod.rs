//! The egress role: the gateway at the responder's site.
//!
//! [`Reinjector`] plays the requester toward the real responder for requests
//! that were pseudo-ACKed at the twin: it injects them strictly in PSN order,
//! keeps each until the responder's ACK covers it, goes back N on a PSN
//! sequence NAK or a local timeout, waits out RNR NAKs, and reports how far
//! the responder got (`Delivered`) so the twin can free its copy. The
//! responder's ACKs stop here; READ responses and atomic ACKs travel back to
//! the requester.
//!
//! Timers (all from the `now` the caller passes in):
//!
//! - **Retransmission timeout**: RFC 6298 on the measured local RTT, but never
//!   below [`EgressTuning::min_rto`]. The data center is lossless, so a
//!   timeout is nearly always a responder that stalled (a software
//!   responder's scheduling, a PFC pause, an on-demand-paging fault), not a
//!   loss; resending into a stall only adds duplicates. The floor keeps the
//!   gateway about as patient as the requester it replaces (rxe and perftest
//!   wait 67 ms); a real loss mid-stream is still repaired at once by the
//!   responder's sequence NAK. Consecutive timeouts double the wait, up to
//!   [`EgressTuning::max_rto`], and each resends only the oldest packet
//!   (asking for an ACK): a stalled responder answers it with its true
//!   position, a lossy one gets the rest resent as ACKs return.
//! - **Give-up** is a time, not a count: the flow fails (an error NAK to the
//!   requester) only when the responder has shown no progress for
//!   [`EgressTuning::give_up`].
//! - **Tail probe**: rxe's responder acknowledges only packets with AckReq
//!   set. Packets sent while a request for an ACK was outstanding are covered
//!   by none once that ACK is in, and a tail in the middle of a message asks
//!   for nothing (`pump`); the twin's next packets (a WAN round trip away,
//!   at worst) will ask. Only if none come within
//!   [`EgressTuning::tail_probe`] is the last one resent with AckReq. (Timing
//!   those packets out at the local RTO was the cause of most resends seen
//!   against rxe: docs/interop.md.)
//! - **Queue at the responder**: the window grows with ACKs (slow start) but
//!   halves, down to the responder's ACK spacing, when an RTT sample exceeds
//!   the smallest seen by more than a quarter of the RTO floor: the
//!   responder is draining slower than we inject (a software responder on a
//!   busy CPU), and a queue as long as the RTO would time out packets it
//!   merely has not reached yet. A hardware responder answers in
//!   microseconds and never triggers this.

use crate::buffer::PacketBuf;
use std::collections::VecDeque;
use std::time::Duration;

use crate::buffer::{DeepBuffer, SlotHandle};
use crate::roce::ext::RNR_TIMER_US;
use crate::roce::{set_ack_req, NakCode, OpKind, Opcode, Psn, RocePacket, Syndrome};
use crate::time::Time;

use super::half::HalfKey;
use super::ingress::span_of;
use super::outbox::{HeldRef, Outbox, Output};
use super::poison::InProgress;
use super::quiet::Quiet;
use super::twin::TwinMsg;

mod timers;

/// Does this (valid) request packet carry AckReq?
/// Injection window at the start (PSNs).
const INITIAL_CWND: u32 = 64;
/// Floor of the window after a sequence NAK halves it.
const MIN_CWND: u32 = 16;
/// Window after a timeout: the oldest packet alone (TCP's loss window).
const RTO_CWND: u32 = 1;
/// Floor of the window when the responder's queue grows (see
/// `Reinjector::rtt_sample`): its ACK spacing (rxe asks every 64 packets).
const QUEUE_MIN_CWND: u32 = 64;
/// READs remembered per half while their answer has not begun
/// (`Reinjector::on_raw_request`): a requester's `max_rd_atomic` is at most
/// 16.
const MAX_RAW_READS: usize = 16;

/// How long the tunnel phase may wait, without progress, for the
/// requester's own recovery of raw packets lost in its datacenter. That
/// recovery takes the requester's ACK timeout (67 ms by default in rxe,
/// more over several losses) plus a WAN round trip, so this must be well
/// above it; a requester that has not recovered by then has failed itself.
pub const RAW_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Default floor of the retransmission timeout toward the local responder
/// (`dc.retransmit_floor`; why this value: `soya_config::DEFAULT_RETRANSMIT_FLOOR`).
pub const DEFAULT_MIN_RTO: Duration = soya_config::DEFAULT_RETRANSMIT_FLOOR;
/// Default time without progress from the responder before giving up
/// (`dc.give_up_after`).
pub const DEFAULT_GIVE_UP: Duration = soya_config::DEFAULT_GIVE_UP_AFTER;
/// Default wait for the twin's next packet before probing an unacknowledged
/// tail (raised to a few WAN round trips by `EngineConfig::from_site`).
pub const DEFAULT_TAIL_PROBE: Duration = Duration::from_millis(100);

/// Default [`EgressTuning::rnr_give_up`] (`dc.rnr_give_up`; why 20 s is
/// in `soya_config::DEFAULT_RNR_GIVE_UP`, docs/semantics.md).
pub const DEFAULT_RNR_GIVE_UP: Duration = soya_config::DEFAULT_RNR_GIVE_UP;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EgressTuning {
    /// Most PSNs injected and not yet acknowledged by the responder.
    pub window: u32,
    /// Floor of the retransmission timeout (also the timeout before the
    /// first RTT sample).
    pub min_rto: Duration,
    /// Ceiling of the backed-off retransmission timeout (at least `min_rto`).
    pub max_rto: Duration,
    /// Give up on the flow when the responder has made no progress for this
    /// long (while something is outstanding).
    pub give_up: Duration,
    /// How long packets no outstanding AckReq covers may wait for the twin's
    /// next packet (which would ask for their ACK) before being probed.
    pub tail_probe: Duration,
    /// Give up on the flow when the responder has answered with nothing but
    /// RNR NAKs for this long (its receive queue stays empty). A time, not
    /// a count: a count of NAKs lasts as long as their timers, and at the
    /// 655 ms that RDMA-CM's `min_rnr_timer` of 0 asks for, the old budget
    /// of 1,000 NAKs held the buffer for 11 minutes while the requester,
    /// already pseudo-ACKed, was never told (issue 18, sweep seed 289).
    pub rnr_give_up: Duration,
}

impl Default for EgressTuning {
    fn default() -> EgressTuning {
        EgressTuning {
            window: 1024,
            min_rto: DEFAULT_MIN_RTO,
            max_rto: Duration::from_millis(250),
            give_up: DEFAULT_GIVE_UP,
            tail_probe: DEFAULT_TAIL_PROBE,
            rnr_give_up: DEFAULT_RNR_GIVE_UP,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressStats {
    pub injected: u64,
    pub retransmitted: u64,
    pub raw_injected: u64,
    /// Copies of a READ forwarded raw not injected: one injected less than
    /// an RTO before was not answered yet (`on_raw_request`).
    pub raw_read_copies_dropped: u64,
    pub acks_absorbed: u64,
    pub acks_forwarded: u64,
    pub seq_naks: u64,
    pub rnr_naks: u64,
    pub fatal_naks: u64,
    pub timeouts: u64,
    pub responses_forwarded: u64,
    pub duplicates_dropped: u64,
    pub overflow_held: u64,
    /// ACKs past a READ/atomic whose response was lost: asked again.
    pub implied_naks: u64,
    /// Packets injected with AckReq set by us (at a window edge or after a
    /// resend) so that the responder acknowledges them.
    pub ack_reqs_added: u64,
    /// Unacknowledged tails resent with AckReq after `tail_probe`.
    pub tail_probes: u64,
    /// The flow was failed after `give_up` without progress.
    pub gave_up: u64,
    /// Window halvings for a queue building up at the responder.
    pub queue_cuts: u64,
}

/// After a timeout: what was in flight before it. If the responder's answer
/// to the resent oldest packet shows it had more than that packet, it had
/// stalled or queued, not lost, and what was in flight stays in flight
/// instead of being resent (a software responder working through its queue
/// would see every resend as a duplicate).
#[derive(Clone, Copy, Debug)]
struct RtoRecovery {
    /// The resent packet's last PSN.
    probe: Psn,
    /// The highest PSN sent before the timeout.
    high: Psn,
    /// The request for an ACK outstanding before the timeout.
    asked: Option<Psn>,
}

/// A held packet: the pooled buffer the WAN transport decoded it into,
/// kept in place (no copy into the deep buffer's slab), and the slot that
/// stands for it in the deep buffer's quotas (`DeepBuffer::reserve`).
#[derive(Debug)]
struct Held {
    /// `None` when the site buffer was full (the twin's credit should
    /// prevent this): held anyway rather than lost, counted in
    /// `overflow_held`.
    slot: Option<SlotHandle>,
    bytes: PacketBuf,
}

/// What the reinjector needs to know of a request from the twin, read
/// before its buffer moves into the queue.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo {
    pub psn: Psn,
    pub span: u32,
    pub needs_response: bool,
    pub op: Opcode,
    /// The requester set AckReq on it.
    pub ack_req: bool,
}

impl RequestInfo {
    pub fn of(p: &RocePacket<'_>) -> RequestInfo {
        RequestInfo {
            psn: p.psn(),
            span: span_of(p),
            needs_response: p.info.needs_real_response(),
            op: p.bth.opcode,
            ack_req: p.bth.ack_req,
        }
    }
}

#[derive(Debug)]
struct Pending {
    psn: Psn,
    span: u32,
    held: Held,
    /// A READ or atomic: done only when its (last) response arrives.
    needs_response: bool,
    /// Its opcode (what it leaves in progress at the responder).
    op: Opcode,
    /// The held packet has AckReq set (by the requester, or by us: see
    /// `pump`); kept here so that no (re)send parses the packet for it.
    ack_req: bool,
    sent_at: Option<Time>,
    retransmitted: bool,
}

impl Pending {
    fn last(&self) -> Psn {
        self.psn.add(self.span - 1)
    }
}

#[derive(Debug)]
pub struct Reinjector {
    pub key: HalfKey,
    /// The requester's QPN, from the responder's answers (the site finds
    /// a READ's queued answers by it: `site::replays`).
    pub requester_qpn: Option<u32>,
    /// `key.id()`, the deep buffer's quota key, computed once (it hashes
    /// the key: not worth redoing on every packet).
    flow_id: u64,
    queue: VecDeque<Pending>,
    /// How many of `queue` need a response (READs, atomics): every ACK
    /// looks for one it passed, and a scan of a deep queue of WRITEs per
    /// ACK cost 6 % of a re-injecting gateway's CPU; with none held it is
    /// skipped.
    awaiting_response: usize,
    /// Index of the next packet to (re)send.
    next: usize,
    /// Last PSN the responder acknowledged or answered.
    acked: Option<Psn>,
    /// Highest PSN injected raw (the tunnel phase) and whether the
    /// responder has acknowledged it yet.
    raw_high: Option<Psn>,
    raw_low: Option<Psn>,
    raw_done: bool,
    /// READs injected raw whose answer has not begun, and when
    /// (`on_raw_request`: copies of them are not injected again within an
    /// RTO). At most [`MAX_RAW_READS`]: a requester has at most
    /// `max_rd_atomic` (16) READs outstanding.
    raw_reads: Vec<(Psn, Time)>,
    srtt: Option<Duration>,
    rttvar: Duration,
    rto_deadline: Option<Time>,
    /// The armed `rto_deadline` is a tail probe's (no AckReq outstanding).
    probing: bool,
    rnr_until: Option<Time>,
    /// PSN of the last RNR NAK (its trailing sequence NAK is expected).
    last_rnr: Option<Psn>,
    /// When the responder last showed progress (an ACK or response that
    /// moved, an RNR NAK), or when work arrived with nothing outstanding.
    progress_at: Time,
    /// Consecutive timeouts: the RTO doubles with each (RFC 6298 5.5).
    backoff: u32,
    /// PSNs we let ourselves have in flight toward the responder: starts
    /// small and grows with ACKs (slow start), collapses on a timeout. A
    /// local responder is fast, but its socket buffer (or NIC queue) is not
    /// infinite: resending a whole 1024-packet window at once after a
    /// timeout overflows it again and again.
    cwnd: u32,
    /// Smallest RTT sample: the responder with an empty queue.
    min_rtt: Option<Duration>,
    /// When the window was last cut for a growing queue (once per srtt).
    queue_cut_at: Option<Time>,
    /// Start of the current run of RNR NAKs without progress.
    rnr_since: Option<Time>,
    /// Highest PSN sent with AckReq set (by the requester or by us).
    ack_req_out: Option<Psn>,
    rto_recovery: Option<RtoRecovery>,
    /// When the last retransmission timeout resent the head. A packet sent
    /// before it and acknowledged after it gives no RTT sample (Karn): the
    /// ACK may be the responder's answer to the resend (its re-ACK of a
    /// duplicate covers everything it had), and its wait includes the
    /// whole timeout episode.
    rto_at: Option<Time>,
    /// The message in progress at the responder once it has executed
    /// everything up to `acked` (or, in the tunnel phase, up to `raw_high`):
    /// what [`Self::poison_plan`] needs.
    resp_state: InProgress,
    failed: bool,
    /// [`Self::poison_plan`] as it was when the half failed (its queue is
    /// released then, and the responder may still need moving to error).
    plan_at_failure: Option<Vec<(Psn, InProgress)>>,
    /// The responder's last answer was a NAK (RNR or sequence error): its
    /// PSN is the responder's expected PSN as of then (rxe keeps `resp.psn`
    /// on both), the best first probe when the plan is unknown.
    last_nak_epsn: Option<Psn>,
    tuning: EgressTuning,
    /// Activity, for forgetting the half once it is quiet (`qp::engine::expiry`).
    pub quiet: Quiet,
    pub stats: EgressStats,
}

impl Reinjector {
    /// Bytes of this half's own bookkeeping on the heap: its per-packet
    /// queue as allocated (the packets it holds are buffers, not counted).
    /// See `QpEngine::state_bytes`.
    pub fn bookkeeping_bytes(&self) -> usize {
        self.queue.capacity() * std::mem::size_of::<Pending>()
            + self.plan_at_failure.as_ref().map_or(0, |p| {
                p.capacity() * std::mem::size_of::<(Psn, InProgress)>()
            })
    }

    pub fn new(key: HalfKey, tuning: EgressTuning) -> Reinjector {
        Reinjector {
            key,
            requester_qpn: None,
            flow_id: key.id(),
            queue: VecDeque::new(),
            awaiting_response: 0,
            next: 0,
            acked: None,
            raw_high: None,
            raw_low: None,
            raw_reads: Vec::new(),
            raw_done: false,
            srtt: None,
            rttvar: Duration::ZERO,
            rto_deadline: None,
            probing: false,
            rnr_until: None,
            last_rnr: None,
            progress_at: Time::ZERO,
            backoff: 0,
            cwnd: INITIAL_CWND,
            min_rtt: None,
            queue_cut_at: None,
            rnr_since: None,
            ack_req_out: None,
            rto_recovery: None,
            rto_at: None,
            resp_state: InProgress::Nothing,
            failed: false,
            plan_at_failure: None,
            last_nak_epsn: None,
            tuning,
            quiet: Quiet::default(),
            stats: EgressStats::default(),
        }
    }

    /// Could a response with this PSN answer one of the requests we
    /// injected? (See `PseudoAcker::claims`.)
    pub fn claims(&self, psn: Psn) -> bool {
        let in_raw = match (self.raw_low, self.raw_high) {
            (Some(lo), Some(hi)) => psn.in_range(lo.sub(1), hi),
            _ => false,
        };
        let in_queue = match (self.queue.front(), self.queue.back()) {
            (Some(f), Some(b)) => psn.in_range(f.psn.sub(1), b.last()),
            _ => false,
        };
        in_raw || in_queue || self.acked == Some(psn)
    }

    /// Packets held for the responder.
    /// Injection window state, for status: (window in PSNs, PSNs in
    /// flight, smoothed and smallest responder RTT).
    pub fn window(&self) -> (u32, usize, Option<Duration>, Option<Duration>) {
        (self.cwnd, self.next, self.srtt, self.min_rtt)
    }

    pub fn held(&self) -> usize {
        self.queue.len()
    }

    /// The responder refused a request fatally (or we gave up on it).
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// The responder's most likely expected PSN when [`Self::poison_plan`]
    /// cannot tell it: the PSN after the last tunnel-phase packet seen
    /// (where a responder that executed all of them expects the next).
    /// The engine's first ePSN probe goes there (`qp::poison`, probing).
    ///
    /// When the responder's last answer was an RNR NAK or a NAK-seq, its
    /// PSN is better: the responder was stuck there (a receiver out of
    /// receive WQEs), and after its NAK-seq rxe stays silent toward any
    /// later PSN (`sent_psn_nak`) while its re-ACK of an earlier one can
    /// lag far behind (`ack_psn` is 0 until a SEND/WRITE executes), so a
    /// probe anywhere else could never tell the ePSN.
    pub fn probe_hint(&self) -> Option<Psn> {
        self.last_nak_epsn.or(self.raw_high.map(Psn::next))
    }

    /// Where the responder's expected PSN (ePSN) can be, each with the
    /// message it then has in progress, in increasing PSN order; `None`
    /// when it cannot be known (see `qp::poison`).
    ///
    /// Everything injected and acknowledged: one candidate, the PSN after
    /// the last acknowledged one. Injected packets not yet acknowledged:
    /// also the PSN after each of them (each may be the last the responder
    /// executed). Packets never injected cannot have been executed. A
    /// tunnel phase whose last packet the responder has not acknowledged
    /// (`raw_done`) is unknown ground: the requester's own packets, which
    /// this half saw only in part, may be anywhere in it.
    pub fn poison_plan(&self) -> Option<Vec<(Psn, InProgress)>> {
        if self.failed {
            return self.plan_at_failure.clone();
        }
        if self.raw_high.is_some() && !self.raw_done {
            return None;
        }
        let high = match (self.acked, self.raw_high) {
            (Some(a), Some(r)) => Some(if a.after(r) { a } else { r }),
            (a, r) => a.or(r),
        };
        // Nothing acknowledged, no tunnel phase: the first reliable packet
        // is the connection's first (pseudo-ACKing starts only on a flow
        // learned before its first packet).
        let mut at = match (high, self.queue.front()) {
            (Some(h), _) => h.next(),
            (None, Some(f)) => f.psn,
            (None, None) => return None,
        };
        let mut state = self.resp_state;
        let mut plan = vec![(at, state)];
        for p in self.queue.iter().take_while(|p| p.sent_at.is_some()) {
            if p.psn != at {
                // A gap in what we hold: nothing past it was executed.
                break;
            }
            state = state.after(p.op);
            at = p.last().next();
            plan.push((at, state));
        }
        Some(plan)
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        match (self.rto_deadline, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A request the twin forwarded raw (tunnel phase, or a duplicate READ
    /// to be replayed by the responder): inject as is.
    ///
    /// **A READ's copies.** A requester re-issues an unanswered READ each
    /// time its timer fires. While the WAN is slow or a path is down, the
    /// copies queue behind one another and then cross together, and each
    /// one injected makes the responder replay the whole answer: with a
    /// hardware requester's 2 ms timer and a 0.7 s path cut, 29 copies of
    /// each READ and 30 times the answer queued for the WAN, past the
    /// twin queue's bound (over-subscribed hw sweep seeds 100104,
    /// 100989). So a READ whose copy was injected less than an RTO ago
    /// (the time this half measured the responder takes to answer) and
    /// whose answer has not begun is not injected again: the responder
    /// answers the copy it has, and its first response ends the wait, so
    /// that a copy after it (the answer lost in the requester's data
    /// center) is replayed. Should the injected copy itself be lost, the
    /// requester's next copy after the RTO goes: a delay, never a loss
    /// (READ is idempotent, and the requester retries).
    pub fn on_raw_request(&mut self, now: Time, p: &RocePacket<'_>, out: &mut Outbox) {
        self.quiet.touch();
        if p.info.kind == OpKind::ReadRequest && self.read_copy_in_hand(now, p.psn()) {
            self.stats.raw_read_copies_dropped += 1;
            return;
        }
        // A tunnel phase that starts anew after everything was answered
        // (the twin's ingress forgot the half and learns it again,
        // `qp::engine::expiry`): the old phase's bounds are history, and compared
        // with PSNs far past them (24 bits, modular) they would say
        // nothing true.
        if self.queue.is_empty() && self.raw_done && self.acked.is_some_and(|a| p.psn().after(a)) {
            self.raw_low = None;
            self.raw_high = None;
        }
        self.raw_low.get_or_insert(p.psn());
        let last = p.psn().add(span_of(p) - 1);
        if self.raw_high.is_none_or(|h| last.after(h)) {
            self.raw_high = Some(last);
            // A new packet (not a resend): what the responder will have in
            // progress once it executed it.
            self.resp_state = self.resp_state.after(p.bth.opcode);
        }
        // Even a resent SEND/WRITE re-arms: the requester resends one only
        // when the ACK it waits for (possibly forwarded already, then lost
        // in its datacenter) never came, so the responder's re-ACK of the
        // duplicate must reach it too. (A replayed READ or atomic needs no
        // re-arming: its responses are always forwarded.)
        if !p.info.needs_real_response() {
            self.raw_done = false;
        }
        self.stats.raw_injected += 1;
        out.dc(p.as_bytes());
    }

    /// Whether a copy of the READ at `psn` was injected raw less than an
    /// RTO ago and its answer has not begun (`on_raw_request`); if not,
    /// the copy about to be injected is noted.
    fn read_copy_in_hand(&mut self, now: Time, psn: Psn) -> bool {
        let rto = self.rto();
        if let Some(e) = self.raw_reads.iter_mut().find(|e| e.0 == psn) {
            if now.since(e.1) < rto {
                return true;
            }
            e.1 = now;
            return false;
        }
        if self.raw_reads.len() >= MAX_RAW_READS {
            self.raw_reads.remove(0);
        }
        self.raw_reads.push((psn, now));
        false
    }

    /// A pseudo-ACKed request from the twin, `packet` (its bytes exactly,
    /// in a pooled buffer), which `info` describes: hold it in place and
    /// inject in order. A buffer not kept goes back to the pool.
    pub fn on_request(
        &mut self,
        now: Time,
        info: RequestInfo,
        packet: PacketBuf,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) {
        self.quiet.touch();
        if self.failed {
            out.pool.put(packet);
            return;
        }
        let psn = info.psn;
        if let Some(last) = self.queue.back().map(Pending::last).or(self.acked) {
            if !psn.after(last) {
                // The twin never repeats itself; a restart or a bug might.
                self.stats.duplicates_dropped += 1;
                out.pool.put(packet);
                return;
            }
        }
        if self.queue.is_empty() {
            // Nothing was outstanding: the responder owes us nothing yet.
            self.progress_at = now;
        }
        let slot = match buf.reserve(self.flow_id, packet.len()) {
            Ok(s) => Some(s),
            Err(_) => {
                self.stats.overflow_held += 1;
                None
            }
        };
        self.awaiting_response += usize::from(info.needs_response);
        self.queue.push_back(Pending {
            psn,
            span: info.span,
            held: Held {
                slot,
                bytes: packet,
            },
            needs_response: info.needs_response,
            op: info.op,
            ack_req: info.ack_req,
            sent_at: None,
            retransmitted: false,
        });
        self.pump(now, out);
    }

    /// Injects what the window and any RNR wait allow.
    fn pump(&mut self, now: Time, out: &mut Outbox) {
        if self.failed || self.rnr_until.is_some_and(|t| now < t) {
            return;
        }
        self.rnr_until = None;
        // The responder acknowledges only packets with AckReq set (the
        // requester sets it on the last packet of a message and on every
        // 64th). A packet that fills our window would otherwise leave
        // nothing to acknowledge until our timeout, and so would the last
        // packet of a message that we hold last: ask for an ACK on them.
        let limit = self.cwnd.min(self.tuning.window);
        while self.next < self.queue.len() {
            // The window limits where a packet *starts*: a READ spanning
            // more PSNs than the window must still go out at the head.
            let first = self.queue[0].psn;
            if self.queue[self.next].psn.diff(first) as u32 >= limit {
                break;
            }
            let p = &mut self.queue[self.next];
            if p.sent_at.is_some() {
                p.retransmitted = true;
                self.stats.retransmitted += 1;
            } else {
                self.stats.injected += 1;
            }
            p.sent_at = Some(now);
            let used = p.last().diff(first) as u32 + 1;
            let psn = p.psn;
            // Fills the window: the next packet (queued or still to come)
            // does not fit until an ACK moves it.
            let fills = self
                .queue
                .get(self.next + 1)
                .map_or(used >= limit, |n| n.psn.diff(first) as u32 >= limit);
            // The last packet we hold, with no request for an ACK in
            // flight, asks only where it ends a message (Last/Only, so also
            // a READ request or an atomic): after it the requester may
            // send nothing for a long time. In the middle of a message the
            // requester must send the rest, so the twin's next packets
            // follow and the one that ends the message asks; asking on
            // every mid-message tail made the responder ACK every packet
            // whenever the gateway is faster than the traffic, each ACK a
            // `Delivered` over the WAN (docs/benchmarks.md §4). A huge
            // message whose requester never asks mid-message still asks at
            // our window edge (`fills`), and a mid-message tail that stalls
            // (a WAN hiccup) is resent with AckReq after `tail_probe`
            // (`arm`): its `Delivered` comes that much later, the twin
            // holds its copy that much longer. (One outstanding request is
            // enough: when its ACK comes, whatever follows is sent and
            // asks in turn.)
            let asking = self
                .ack_req_out
                .is_some_and(|r| self.acked.is_none_or(|a| r.after(a)));
            let tail = self.next + 1 == self.queue.len()
                && !asking
                && self.queue[self.next]
                    .op
                    .info()
                    .is_some_and(|i| i.completes_message());
            // AckReq is set on the held packet itself, not on a copy: the
            // DC side sends the held bytes in place (`Output::DcHeld`), and
            // a retransmission that asks for an ACK does no harm.
            // Bytes the DC backend may still be sending (an AF_XDP TX
            // descriptor naming a lent UMEM run) move to the heap first.
            let p = &mut self.queue[self.next];
            if (fills || tail) && !p.ack_req {
                p.held.bytes.make_writable();
                if set_ack_req(&mut p.held.bytes).unwrap_or(false) {
                    self.stats.ack_reqs_added += 1;
                    p.ack_req = true;
                }
            }
            let asks = p.ack_req;
            if asks {
                self.ack_req_out = Some(self.queue[self.next].last());
            }
            out.push_back(Output::DcHeld(HeldRef { key: self.key, psn }));
            self.next += 1;
        }
        self.arm(now, false);
    }

    /// Frees everything up to and including `psn` and reports it delivered.
    fn advance(
        &mut self,
        now: Time,
        psn: Psn,
        msn: Option<u32>,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) {
        if self.acked.is_some_and(|a| !psn.after(a)) {
            return;
        }
        let mut progressed = false;
        let (mut grow, mut queued, mut sampled) = (0, false, false);
        // The answer is for a packet last sent before the latest timeout.
        let mut from_before_rto = false;
        while let Some(front) = self.queue.front() {
            if front.last().after(psn) {
                break;
            }
            let p = self.queue.pop_front().expect("front exists");
            self.awaiting_response -= usize::from(p.needs_response);
            // Karn: only a packet sent once, and only the one this answer is
            // for: the others waited for a later packet's AckReq, and that
            // wait is not the responder's round trip.
            if p.last() == psn {
                from_before_rto = p
                    .sent_at
                    .is_some_and(|t| self.rto_at.is_some_and(|r| t < r));
            }
            if let (Some(t), false, true) = (p.sent_at, p.retransmitted, p.last() == psn) {
                if self.rto_at.is_none_or(|r| t >= r) {
                    queued = self.rtt_sample(now, now - t);
                    sampled = true;
                }
            }
            if let Some(s) = p.held.slot {
                buf.release(self.flow_id, s);
            }
            out.pool.put(p.held.bytes);
            self.resp_state = self.resp_state.after(p.op);
            self.next = self.next.saturating_sub(1);
            progressed = true;
            grow += p.span;
        }
        if !queued {
            self.cwnd = (self.cwnd + grow).min(self.tuning.window);
        }
        self.acked = Some(psn);
        // Only an answer to a packet sent before the timeout (and not
        // since) is evidence: one to the packets resent after it (the
        // head, then what the reopening window let out) says nothing of
        // the rest, which a loss burst may have taken. Taking it for
        // evidence left those "in flight" until the next timeout, three
        // PSNs per RTO (sim seed 261 with DC burst loss).
        let evidence = |r: &RtoRecovery| from_before_rto || !psn.before(r.high);
        if let Some(r) = self
            .rto_recovery
            .filter(|r| psn.after(r.probe) && evidence(r))
        {
            // The responder had more than the packet resent after the
            // timeout: it was slow, not lossy. Keep the rest in flight.
            let skip = self
                .queue
                .iter()
                .position(|p| p.last().after(r.high))
                .unwrap_or(self.queue.len());
            self.next = self.next.max(skip);
            self.ack_req_out = r.asked.filter(|a| a.after(psn));
            self.rto_recovery = None;
        }
        // The responder's acknowledged PSN moved (we returned above if it
        // did not): it is alive and executing, even when what it covered
        // was the tunnel phase's and ours still wait behind it. Only the
        // packets it acknowledged count, though, for the timer and backoff.
        // (Counting only ours, a tunnel phase slower than `give_up`, a
        // requester's own recovery of DC losses, failed a healthy flow
        // the moment it was all acknowledged: issue 18, seed 4259.)
        self.progress_at = now;
        if progressed || self.queue.is_empty() {
            self.rnr_since = None;
            // Karn: a backed-off RTO stays until an answer gives a valid
            // RTT sample (RFC 6298 section 5): an answer to packets sent
            // before the timeout tells nothing of the responder's pace.
            if sampled || self.rto_at.is_none() || self.queue.is_empty() {
                self.backoff = 0;
            }
            self.arm(now, true);
        }
        out.push_back(Output::Twin(TwinMsg::Delivered {
            half: self.key,
            psn,
            msn,
        }));
    }

    /// Goes back to `psn` and resends from there.
    fn go_back(&mut self, psn: Psn) {
        self.ack_req_out = None;
        self.rto_recovery = None;
        self.next = self
            .queue
            .iter()
            .position(|p| !p.last().before(psn))
            .unwrap_or(self.queue.len());
    }

    /// A packet from the responder to this half's requester.
    pub fn on_response(
        &mut self,
        now: Time,
        p: &RocePacket<'_>,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) {
        self.quiet.touch();
        let psn = p.psn();
        // While raw PSNs are unacknowledged the requester still waits for
        // the responder's own answers to them.
        let raw_pending = self.raw_high.is_some() && !self.raw_done;
        match p.info.kind {
            OpKind::ReadResponse | OpKind::AtomicAck => {
                self.last_nak_epsn = None;
                // The answer to every READ up to here has begun.
                self.raw_reads.retain(|e| e.0.after(psn));
                self.stats.responses_forwarded += 1;
                out.twin(p.as_bytes(), |packet| TwinMsg::Response { packet });
                // A response implicitly acknowledges everything before its
                // READ; the last one completes the READ (and tells its true
                // span, which the request alone cannot when the PMTU is
                // unknown here).
                let read_at = self
                    .queue
                    .iter()
                    .rposition(|q| q.needs_response && !psn.before(q.psn));
                if p.info.position.ends() {
                    if let Some(i) = read_at {
                        let q = &mut self.queue[i];
                        q.span = psn.diff(q.psn) as u32 + 1;
                    }
                    self.note_raw_acked(psn);
                    let msn = p.ext.aeth.map(|a| a.msn);
                    self.advance(now, psn, msn, buf, out);
                } else if let Some(i) = read_at {
                    if i > 0 {
                        let before = self.queue[i].psn.sub(1);
                        self.advance(now, before, None, buf, out);
                    }
                    // The responder is streaming this READ's answer: that is
                    // progress (rxe's requester restarts its retransmission
                    // timer on every response packet too). A long READ whose
                    // response takes longer than our RTO must not be
                    // re-requested and, after the give-up time, failed.
                    self.progress_at = now;
                    self.backoff = 0;
                    self.arm(now, true);
                }
                self.pump(now, out);
            }
            OpKind::Ack => {
                let Some(aeth) = p.ext.aeth else { return };
                self.last_nak_epsn = match aeth.syndrome {
                    Syndrome::RnrNak { .. } | Syndrome::Nak(NakCode::PsnSequenceError) => Some(psn),
                    _ => None,
                };
                if raw_pending {
                    self.stats.acks_forwarded += 1;
                    out.twin(p.as_bytes(), |packet| TwinMsg::Response { packet });
                }
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        self.stats.acks_absorbed += 1;
                        self.note_raw_acked(psn);
                        // An ACK at or past a READ or atomic whose response
                        // never came: the response was lost on its way to us.
                        // rxe's requester calls this an implied NAK and asks
                        // again; so do we (the responder replays it).
                        let unanswered = if self.awaiting_response == 0 {
                            None
                        } else {
                            self.queue
                                .iter()
                                .position(|q| q.needs_response && !q.last().after(psn))
                        };
                        if let Some(i) = unanswered {
                            let at = self.queue[i].psn;
                            if i > 0 {
                                self.advance(now, at.sub(1), None, buf, out);
                            }
                            self.stats.implied_naks += 1;
                            self.go_back(at);
                        } else {
                            self.advance(now, psn, Some(aeth.msn), buf, out);
                        }
                        self.pump(now, out);
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) if self.last_rnr == Some(psn) => {
                        // The responder dropped the RNR'd packet and NAKs the
                        // ones we had already sent behind it: the RNR wait
                        // covers it, and it is no failure to count.
                        self.stats.seq_naks += 1;
                        self.go_back(psn);
                        // (Sends nothing while the RNR wait lasts; if it is
                        // over already, resend now: no timer is armed for
                        // packets not in flight.)
                        self.pump(now, out);
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.stats.seq_naks += 1;
                        // Everything before the expected PSN arrived.
                        if self.acked.is_none_or(|a| psn.sub(1).after(a)) {
                            // A NAK carries the MSN of the last executed PSN.
                            self.advance(now, psn.sub(1), Some(aeth.msn), buf, out);
                        }
                        // NAKs that never let the responder move on (a gap
                        // in the raw phase is the requester's to fill, and
                        // is waited for longer).
                        if self.stalled_out(now) {
                            return self.give_up(
                                now,
                                psn,
                                "sequence NAKs without progress",
                                buf,
                                out,
                            );
                        }
                        self.cwnd = (self.cwnd / 2).max(MIN_CWND);
                        self.go_back(psn);
                        self.pump(now, out);
                    }
                    Syndrome::RnrNak { timer } => {
                        self.stats.rnr_naks += 1;
                        // Not ready, but alive: its own budget applies.
                        self.progress_at = now;
                        let since = *self.rnr_since.get_or_insert(now);
                        if now.since(since) >= self.tuning.rnr_give_up {
                            return self.give_up(now, psn, "RNR NAKs for dc.rnr_give_up", buf, out);
                        }
                        self.go_back(psn);
                        self.last_rnr = Some(psn);
                        let wait = RNR_TIMER_US[usize::from(timer & 0x1F)];
                        self.rnr_until = Some(now + Duration::from_micros(u64::from(wait)));
                    }
                    Syndrome::Nak(code) => {
                        // The responder's QP is in the error state now: nothing
                        // held here can be delivered any more. (During the raw
                        // phase the NAK also went to the requester above.)
                        self.stats.fatal_naks += 1;
                        self.fail(psn, code, buf, out);
                    }
                    Syndrome::Reserved(_) => {}
                }
            }
            _ => {}
        }
    }

    fn note_raw_acked(&mut self, psn: Psn) {
        if self.raw_high.is_some_and(|h| !psn.before(h)) {
            self.raw_done = true;
        }
    }

    /// Gives up on this half and tells the twin.
    /// Fails the half because the local responder made no progress for
    /// as long as we wait (`dc.give_up_after`, `dc.rnr_give_up`): the
    /// requester gets an error completion through the twin. Logged, with
    /// what the responder last showed: the one event of a flow's life an
    /// operator must be able to find without counters.
    pub(super) fn give_up(
        &mut self,
        now: Time,
        psn: Psn,
        why: &'static str,
        buf: &mut DeepBuffer,
        out: &mut Outbox,
    ) {
        self.stats.gave_up += 1;
        tracing::warn!(
            half = %self.key,
            psn = psn.value(),
            why,
            since_progress_ms = now.since(self.progress_at).as_millis() as u64,
            timeouts = self.stats.timeouts,
            srtt_us = self.srtt.map_or(0, |d| d.as_micros() as u64),
            queued = self.queue.len(),
            "the local responder made no progress: failing the flow toward its requester"
        );
        self.fail(psn, NakCode::RemoteOperationalError, buf, out);
    }

    fn fail(&mut self, psn: Psn, code: NakCode, buf: &mut DeepBuffer, out: &mut Outbox) {
        if !self.failed {
            self.plan_at_failure = self.poison_plan();
        }
        self.failed = true;
        self.release_all(buf);
        out.push_back(Output::Twin(TwinMsg::Error {
            half: self.key,
            psn,
            code,
        }));
    }

    /// The local responder QP is being moved to the error state (its own
    /// requests were refused at the far side: `QpEngine::on_far_error`).
    /// It will execute nothing more, so nothing held here or sent later by
    /// the twin can land: fail the half and tell the twin, whose requester
    /// learns it as from a responder that went away. False if the half had
    /// failed already.
    pub fn fail_responder_gone(&mut self, buf: &mut DeepBuffer, out: &mut Outbox) -> bool {
        self.quiet.touch();
        if self.failed {
            return false;
        }
        let psn = self
            .queue
            .front()
            .map(|p| p.psn)
            .or(self.acked.map(Psn::next))
            .or(self.raw_high.map(Psn::next))
            .unwrap_or(Psn::new(0));
        self.stats.gave_up += 1;
        self.fail(psn, NakCode::RemoteOperationalError, buf, out);
        true
    }

    /// The held request that starts at `psn`, as it is to be (re)sent:
    /// what an [`Output::DcHeld`] names. `None` once it is released (the
    /// responder acknowledged it, or the half failed).
    pub fn held_request(&self, psn: Psn) -> Option<&[u8]> {
        let first = self.queue.front()?.psn;
        // The queue is in PSN order and a request's PSNs are contiguous
        // with the next one's: search by distance from the head (which
        // also holds across the 24-bit wrap).
        let d = psn.diff(first);
        if d < 0 {
            return None;
        }
        let i = self.queue.partition_point(|p| p.psn.diff(first) < d);
        self.queue
            .get(i)
            .filter(|p| p.psn == psn)
            .map(|p| &p.held.bytes[..])
    }

    pub fn release_all(&mut self, buf: &mut DeepBuffer) {
        for p in self.queue.drain(..) {
            if let Some(s) = p.held.slot {
                buf.release(self.flow_id, s);
            }
        }
        self.awaiting_response = 0;
        self.next = 0;
        self.rto_deadline = None;
    }
}
