//! The requester: rxe_req.c (send WQEs into packets) and rxe_comp.c (what
//! comes back: ACKs, NAKs, READ responses, atomic ACKs, and the timers).
//!
//! PSN bookkeeping follows rxe: `req_psn` is the next PSN to send
//! (`qp->req.psn`), `comp_psn` the oldest not yet acknowledged
//! (`qp->comp.psn`). A WQE gets `first_psn`/`last_psn` when its first packet
//! goes out (`update_wqe_psn`). Go-back-N (`req_retry`) rewinds `req_psn` to
//! `comp_psn` and re-walks the send queue from its head.

use std::collections::VecDeque;
use std::time::Duration;

use soya_proto::roce::ext::RNR_TIMER_US;
use soya_proto::roce::{
    AtomicEth, ExtHeaders, NakCode, OpKind, Opcode, Psn, Reth, RocePacket, Syndrome,
};
use soya_proto::time::Time;

use super::hw::{Dcqcn, RetransmitTimer, TimerMode};
use super::memory::pattern_check_mixed;
use super::{
    Completion, CompletionStatus, Flow, OutPacket, OutPayload, QpConfig, Shared, WorkRequest,
};

/// rxe `enum wqe_state` (without `done`/`error`: completed WQEs leave the queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WqeState {
    /// Not (re)sent yet.
    Posted,
    /// Some packets sent.
    Processing,
    /// All packets sent; waiting for the ACK or response.
    Pending,
}

struct SendWqe {
    wr_id: u64,
    wr: WorkRequest,
    state: WqeState,
    first_psn: Psn,
    last_psn: Psn,
    /// WRITE/SEND: payload bytes already put into packets of the current
    /// (re)transmission (rxe: `dma.length - dma.resid` on the request side).
    sent: u32,
    /// READ: response bytes received (rxe: the completer's `dma.resid`).
    read_done: u32,
    /// Pattern sequence number of a WRITE/SEND payload.
    msg_seq: u32,
    /// Holds one of the `max_rd_atomic` credits (rxe `has_rd_atomic`).
    has_rd_atomic: bool,
}

impl SendWqe {
    /// The next packet of this WRITE or SEND of `len` bytes: its opcode
    /// (from the kind's `ops`), payload (the pattern at `va_base` plus the
    /// offset), whether it is the first and the last, and the packets left
    /// with it. The immediate rides on the last packet.
    fn next_segment(
        &mut self,
        ops: [Opcode; 6],
        len: u32,
        imm: Option<u32>,
        va_base: u64,
        mtu: u32,
        ext: &mut ExtHeaders,
    ) -> (Opcode, OutPayload, bool, bool, u32) {
        let (n, start, end, npkts) = segment(len, self.sent, mtu);
        if end {
            ext.imm = imm.unwrap_or(0);
        }
        let payload = OutPayload::Pattern {
            va: va_base.wrapping_add(u64::from(self.sent)),
            len: n as usize,
            seq: self.msg_seq,
        };
        self.sent += n;
        let opcode = segment_opcode(ops, start, end, imm.is_some());
        (opcode, payload, start, end, npkts)
    }

    /// READ and atomics are answered by data, never by a plain ACK
    /// (rxe `WR_ATOMIC_OR_READ_MASK`).
    fn needs_response(&self) -> bool {
        matches!(
            self.wr,
            WorkRequest::Read { .. } | WorkRequest::FetchAdd { .. } | WorkRequest::CmpSwap { .. }
        )
    }
}

pub(super) struct Requester {
    sq: VecDeque<SendWqe>,
    /// Index in `sq` of the WQE to send next (rxe `req.wqe_index`).
    req_idx: usize,
    req_psn: Psn,
    /// One past the highest PSN ever sent, to count retransmissions.
    psn_high: Psn,
    comp_psn: Psn,
    /// Opcode of the last READ response First/Middle taken (rxe
    /// `comp.opcode`); `None` when between messages.
    comp_opcode: Option<Opcode>,
    /// Packets sent since the last AckReq (rxe `req.noack_pkts`).
    noack_pkts: u32,
    /// Free READ/atomic credits (rxe `req.rd_atomic`).
    rd_atomic_free: u32,
    retry_left: u8,
    rnr_left: u8,
    /// A retry sequence is under way; further NAKs do not start another
    /// until progress is made (rxe `comp.started_retry`).
    started_retry: bool,
    /// Go back to `comp_psn` before sending anything (rxe `req.need_retry`).
    need_retry: bool,
    /// Retransmit timer (rxe `retrans_timer`).
    retrans_at: Option<Time>,
    /// RNR wait (rxe `rnr_nak_timer`): nothing is sent until it expires.
    rnr_at: Option<Time>,
    next_wr_id: u64,
    next_msg_seq: u32,
    /// How long the retransmit timer runs (hardware: adaptive steps).
    timer: RetransmitTimer,
    /// Hardware rate control: requests leave no faster than its rate.
    dcqcn: Option<Dcqcn>,
    /// The last poll found a request DCQCN held back until then.
    paced_until: Option<Time>,
}

impl Requester {
    pub fn new(cfg: &QpConfig, send_psn: Psn) -> Requester {
        Requester {
            sq: VecDeque::new(),
            req_idx: 0,
            req_psn: send_psn,
            psn_high: send_psn,
            comp_psn: send_psn,
            comp_opcode: None,
            noack_pkts: 0,
            rd_atomic_free: cfg.rd_atomic_depth(),
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            started_retry: false,
            need_retry: false,
            retrans_at: None,
            rnr_at: None,
            next_wr_id: 1,
            next_msg_seq: 1,
            timer: RetransmitTimer::new(cfg.timer),
            dcqcn: cfg.dcqcn.map(Dcqcn::new),
            paced_until: None,
        }
    }

    pub fn outstanding(&self) -> usize {
        self.sq.len()
    }

    pub fn send_psn(&self) -> Psn {
        self.req_psn
    }

    pub fn unacked_psn(&self) -> Psn {
        self.comp_psn
    }

    /// Queues a WQE. WRITE/SEND payloads get the next pattern sequence number
    /// (1, 2, 3, ... per QP, in posting order = execution order).
    pub fn post(&mut self, wr: WorkRequest) -> u64 {
        let id = self.next_wr_id;
        self.next_wr_id += 1;
        let msg_seq = match wr {
            WorkRequest::Write { .. } | WorkRequest::Send { .. } => {
                let s = self.next_msg_seq;
                self.next_msg_seq = self.next_msg_seq.wrapping_add(1);
                s
            }
            _ => 0,
        };
        self.sq.push_back(SendWqe {
            wr_id: id,
            wr,
            state: WqeState::Posted,
            first_psn: self.req_psn,
            last_psn: self.req_psn,
            sent: 0,
            read_done: 0,
            msg_seq,
            has_rd_atomic: false,
        });
        id
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        let t = match (self.retrans_at, self.rnr_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Paced by DCQCN with a request waiting: wake when it may leave.
        match self.paced_until() {
            Some(p) => Some(t.map_or(p, |t| t.min(p))),
            None => t,
        }
    }

    /// When DCQCN lets the request it held back leave.
    fn paced_until(&self) -> Option<Time> {
        self.paced_until
    }

    /// A CNP for this QP: DCQCN cuts the rate (hardware).
    pub fn on_cnp(&mut self, now: Time) {
        if let Some(d) = self.dcqcn.as_mut() {
            d.on_cnp(now);
        }
    }

    // ---------------------------------------------------------------------
    // Sending (rxe_req.c: rxe_requester)
    // ---------------------------------------------------------------------

    /// The next request packet, if the window, the READ/atomic depth and the
    /// RNR wait allow one.
    pub fn next_packet(&mut self, now: Time, cfg: &QpConfig) -> Option<OutPacket> {
        self.paced_until = None;
        if self.rnr_at.is_some() {
            return None; // rxe `wait_for_rnr_timer`
        }
        if let Some(d) = self.dcqcn.as_mut() {
            let at = d.release_at(now);
            if at > now && (self.need_retry || self.req_idx < self.sq.len()) {
                self.paced_until = Some(at);
                return None; // hardware: the rate limiter holds it back
            }
        }
        if self.need_retry {
            self.retry(cfg);
            self.need_retry = false;
        }
        let wqe = self.sq.get_mut(self.req_idx)?;
        // rxe: `psn_compare(req.psn, comp.psn + RXE_MAX_UNACKED_PSNS) > 0`
        // waits, which lets 129 PSNs be outstanding; we stop at exactly
        // `max_unacked_psns`.
        if self.req_psn.diff(self.comp_psn) >= cfg.max_unacked_psns as i32 {
            return None;
        }
        // rxe check_init_depth: a READ/atomic needs a credit, kept across retries.
        if wqe.needs_response() && !wqe.has_rd_atomic {
            if self.rd_atomic_free == 0 {
                return None;
            }
            self.rd_atomic_free -= 1;
            wqe.has_rd_atomic = true;
        }

        let mtu = cfg.mtu as u32;
        let psn = self.req_psn;
        let mut ext = ExtHeaders::default();
        let (opcode, payload, start, end, npkts);
        match wqe.wr {
            WorkRequest::Write {
                remote_va,
                rkey,
                len,
                imm,
            } => {
                (opcode, payload, start, end, npkts) =
                    wqe.next_segment(WRITE_OPCODES, len, imm, remote_va, mtu, &mut ext);
                if start {
                    ext.reth = Reth {
                        va: remote_va,
                        rkey,
                        len,
                    };
                }
            }
            // A SEND has no VA: the pattern is keyed on the offset in the message.
            WorkRequest::Send { len, imm } => {
                (opcode, payload, start, end, npkts) =
                    wqe.next_segment(SEND_OPCODES, len, imm, 0, mtu, &mut ext);
            }
            WorkRequest::Read {
                remote_va,
                rkey,
                len,
            } => {
                // After a partial answer, `read_done` bytes are in: the
                // request asks for the rest only (rxe req_retry adjusts iova
                // and dma.resid).
                let resid = len - wqe.read_done;
                start = true;
                end = true;
                npkts = resid.div_ceil(mtu).max(1);
                opcode = Opcode::RC_READ_REQUEST;
                ext.reth = Reth {
                    va: remote_va.wrapping_add(u64::from(wqe.read_done)),
                    rkey,
                    len: resid,
                };
                payload = OutPayload::None;
            }
            WorkRequest::FetchAdd {
                remote_va,
                rkey,
                add,
            } => {
                (opcode, ext.atomic) = atomic(Opcode::RC_FETCH_ADD, remote_va, rkey, add, 0);
                (start, end, npkts, payload) = (true, true, 1, OutPayload::None);
            }
            WorkRequest::CmpSwap {
                remote_va,
                rkey,
                compare,
                swap,
            } => {
                (opcode, ext.atomic) =
                    atomic(Opcode::RC_COMPARE_SWAP, remote_va, rkey, swap, compare);
                (start, end, npkts, payload) = (true, true, 1, OutPayload::None);
            }
        }

        // init_req_packet: AckReq on the last packet of a message and every
        // `ack_req_every`-th packet. (rxe: `noack_pkts++ > RXE_MAX_PKT_PER_ACK`,
        // i.e. every 66th; we use the configured count exactly.)
        let ack_req = end || self.noack_pkts + 1 >= cfg.ack_req_every;
        self.noack_pkts = if ack_req { 0 } else { self.noack_pkts + 1 };

        // update_wqe_psn: a READ takes all its response PSNs at once.
        if start {
            wqe.first_psn = psn;
            wqe.last_psn = psn.add(npkts - 1);
        }
        self.req_psn = if opcode == Opcode::RC_READ_REQUEST {
            wqe.first_psn.add(npkts)
        } else {
            psn.next()
        };
        // update_wqe_state / update_state.
        wqe.state = if end {
            WqeState::Pending
        } else {
            WqeState::Processing
        };
        if end {
            self.req_idx += 1;
        }
        let retransmission = psn.before(self.psn_high);
        if self.req_psn.after(self.psn_high) {
            self.psn_high = self.req_psn;
        }
        // update_state: arm the retransmit timer unless it is pending.
        if self.retrans_at.is_none() {
            self.retrans_at = self.timer.timeout(cfg).map(|t| now + t);
        }
        if let Some(d) = self.dcqcn.as_mut() {
            let bytes = match payload {
                OutPayload::Pattern { len, .. } | OutPayload::Memory { len, .. } => len,
                OutPayload::None => 0,
            };
            // Payload plus IP, UDP, BTH, RETH and ICRC.
            d.sent(now, bytes + 78);
        }
        Some(OutPacket {
            opcode,
            psn,
            ack_req,
            ext,
            payload,
            retransmission,
        })
    }

    /// rxe req_retry: go back to `comp_psn` and resend every WQE from the
    /// head; packets of the first SEND/WRITE that were acknowledged are
    /// skipped, a partly answered first READ asks for the rest only.
    fn retry(&mut self, cfg: &QpConfig) {
        self.req_idx = 0;
        self.req_psn = self.comp_psn;
        let mut first = true;
        for w in self.sq.iter_mut() {
            if w.state == WqeState::Posted {
                break;
            }
            let is_read = matches!(w.wr, WorkRequest::Read { .. });
            if !first || !is_read {
                w.sent = 0;
                w.read_done = 0;
            }
            if first {
                first = false;
                if matches!(w.wr, WorkRequest::Write { .. } | WorkRequest::Send { .. }) {
                    let npsn = self.comp_psn.diff(w.first_psn).max(0) as u64;
                    w.sent = (npsn * cfg.mtu as u64).min(u64::from(w.wr.len())) as u32;
                }
            }
            w.state = WqeState::Posted;
        }
    }

    // ---------------------------------------------------------------------
    // Completing (rxe_comp.c: rxe_completer)
    // ---------------------------------------------------------------------

    /// Handles one response packet (ACK/NAK, READ response, atomic ACK).
    pub fn on_response(
        &mut self,
        now: Time,
        pkt: &RocePacket<'_>,
        cfg: &QpConfig,
        sh: &mut Shared,
    ) -> Flow {
        let syndrome = pkt.ext.aeth.map(|a| a.syndrome);
        let st = &mut sh.stats;
        match pkt.info.kind {
            OpKind::Ack => match syndrome {
                Some(Syndrome::Ack { .. }) => st.acks_received += 1,
                Some(Syndrome::RnrNak { .. }) => st.rnr_naks_received += 1,
                Some(Syndrome::Nak(NakCode::PsnSequenceError)) => st.seq_naks_received += 1,
                _ => st.fatal_naks_received += 1,
            },
            OpKind::ReadResponse => st.read_responses_received += 1,
            OpKind::AtomicAck => st.atomic_acks_received += 1,
            _ => {}
        }
        if pkt.info.kind == OpKind::Ack && !matches!(syndrome, Some(Syndrome::Ack { .. })) {
            st.naks_received += 1;
        }
        let before = (self.comp_psn, self.sq.len());
        let flow = self.complete(now, pkt, cfg, sh);
        // rxe restarts the timer on every response. Hardware (IBTA: the
        // timer restarts when a response acknowledges outstanding
        // requests, as we read it) only on progress: a repeated ACK does
        // not hold it off.
        let progress = before != (self.comp_psn, self.sq.len());
        if flow == Flow::Continue && (progress || cfg.timer == TimerMode::Configured) {
            self.rearm(now, cfg);
        }
        flow
    }

    /// COMPST_EXIT: every response "kicks the timer down the road" while
    /// anything is unacknowledged (rxe re-arms it with mod_timer).
    fn rearm(&mut self, now: Time, cfg: &QpConfig) {
        self.retrans_at = if self.rnr_at.is_none() && self.req_psn.after(self.comp_psn) {
            self.timer.timeout(cfg).map(|t| now + t)
        } else {
            None
        };
    }

    /// The completer loop for one packet: get_wqe -> check_psn -> ...
    fn complete(
        &mut self,
        now: Time,
        pkt: &RocePacket<'_>,
        cfg: &QpConfig,
        sh: &mut Shared,
    ) -> Flow {
        let psn = pkt.psn();
        let positive_ack = pkt.info.kind == OpKind::Ack
            && matches!(pkt.ext.aeth.map(|a| a.syndrome), Some(Syndrome::Ack { .. }));
        loop {
            // get_wqe: nothing sent, nothing to complete.
            let Some(wqe) = self.sq.front() else {
                return Flow::Continue;
            };
            if wqe.state == WqeState::Posted {
                return Flow::Continue;
            }
            // check_psn: a response past the head WQE completes a SEND/WRITE
            // (coalesced ACK) and loops to the next WQE; past a READ/atomic
            // still waiting for its data it is an implied NAK.
            if psn.after(wqe.last_psn) {
                if wqe.state != WqeState::Pending {
                    return Flow::Continue;
                }
                if wqe.needs_response() {
                    sh.stats.implied_naks += 1;
                    return self.error_retry(false, sh, now);
                }
                self.reset_retry_counters(cfg);
                self.complete_head(now, sh);
                continue;
            }
            // The brief's rule "an ACK *at* the last PSN of a pending READ/
            // atomic is an implied NAK too" (rxe would instead complete a
            // one-packet READ without data, or drop the ACK).
            if positive_ack && psn == wqe.last_psn && wqe.needs_response() {
                sh.stats.implied_naks += 1;
                return self.error_retry(false, sh, now);
            }
            let diff = psn.diff(self.comp_psn);
            if diff < 0 {
                // A retried response for the head's last PSN completes it,
                // anything else older is stale.
                if psn == wqe.last_psn && !wqe.needs_response() {
                    return self.comp_ack(now, pkt, None, sh);
                }
                return Flow::Continue;
            }
            if diff > 0 && wqe.needs_response() {
                // A READ response beyond the next expected one: an earlier one
                // was lost; drop and let the timer re-request the rest.
                return Flow::Continue;
            }
            return self.check_ack(now, pkt, cfg, sh);
        }
    }

    /// rxe check_ack: response sequence, then by opcode and syndrome.
    fn check_ack(
        &mut self,
        now: Time,
        pkt: &RocePacket<'_>,
        cfg: &QpConfig,
        sh: &mut Shared,
    ) -> Flow {
        let op = pkt.bth.opcode;
        let psn = pkt.psn();
        let wqe = self.sq.front().expect("caller checked the head");
        let in_sequence = match self.comp_opcode {
            None => pkt.info.position.starts(),
            Some(_) => {
                op == Opcode::RC_READ_RESPONSE_MIDDLE
                    || op == Opcode::RC_READ_RESPONSE_LAST
                    // A re-issued READ restarts with First/Only at its new first PSN.
                    || (psn == wqe.first_psn && op == Opcode::RC_READ_RESPONSE_FIRST)
                    || (wqe.first_psn == wqe.last_psn && op == Opcode::RC_READ_RESPONSE_ONLY)
            }
        };
        // rxe: COMPST_ERROR (the QP dies with a bogus status). A broken
        // response stream is the peer's bug; we drop and count it instead.
        if !in_sequence {
            sh.stats.unexpected_responses += 1;
            return Flow::Continue;
        }
        let syndrome = pkt.ext.aeth.map(|a| a.syndrome);
        let ack_syndrome = matches!(syndrome, None | Some(Syndrome::Ack { .. }));
        match pkt.info.kind {
            OpKind::ReadResponse => {
                if !ack_syndrome || !matches!(wqe.wr, WorkRequest::Read { .. }) {
                    sh.stats.unexpected_responses += 1;
                    return Flow::Continue;
                }
                self.reset_retry_counters(cfg);
                self.do_read(now, pkt, cfg, sh)
            }
            OpKind::AtomicAck => {
                let atomic = matches!(
                    wqe.wr,
                    WorkRequest::FetchAdd { .. } | WorkRequest::CmpSwap { .. }
                );
                if !ack_syndrome || !atomic {
                    sh.stats.unexpected_responses += 1;
                    return Flow::Continue;
                }
                self.reset_retry_counters(cfg);
                self.comp_ack(now, pkt, Some(pkt.ext.atomic_ack), sh)
            }
            OpKind::Ack => match syndrome {
                Some(Syndrome::Ack { .. }) => {
                    if wqe.needs_response() {
                        // Inside a READ's PSN range (the last PSN was handled
                        // as an implied NAK): not an acknowledgement of anything.
                        return Flow::Continue;
                    }
                    let done = wqe.state == WqeState::Pending && wqe.last_psn == psn;
                    self.reset_retry_counters(cfg);
                    if done {
                        self.comp_ack(now, pkt, None, sh)
                    } else {
                        self.update_comp(now, psn, true, op, sh);
                        Flow::Continue
                    }
                }
                Some(Syndrome::RnrNak { timer }) => self.rnr_retry(now, timer, sh),
                Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                    // "A NAK implicitly acks all packets with PSNs before."
                    if psn.after(self.comp_psn) {
                        self.comp_psn = psn;
                    }
                    self.error_retry(false, sh, now)
                }
                Some(Syndrome::Nak(NakCode::InvalidRequest)) => {
                    self.fail_head(now, CompletionStatus::RemoteInvalidRequest, sh)
                }
                Some(Syndrome::Nak(NakCode::RemoteAccessError)) => {
                    self.fail_head(now, CompletionStatus::RemoteAccessError, sh)
                }
                _ => self.fail_head(now, CompletionStatus::RemoteOperationalError, sh),
            },
            _ => {
                sh.stats.unexpected_responses += 1;
                Flow::Continue
            }
        }
    }

    /// rxe do_read: place one READ response; complete the READ at its end.
    fn do_read(
        &mut self,
        now: Time,
        pkt: &RocePacket<'_>,
        cfg: &QpConfig,
        sh: &mut Shared,
    ) -> Flow {
        let wqe = self.sq.front_mut().expect("caller checked the head");
        let WorkRequest::Read { remote_va, len, .. } = wqe.wr else {
            unreachable!("caller checked the WQE is a READ");
        };
        let data = pkt.payload();
        let remaining = len - wqe.read_done;
        let ends = pkt.info.position.ends();
        // Each response carries min(MTU, rest) bytes and only the last one
        // ends the message (rxe copy_data would fail on excess data).
        if data.len() as u32 != remaining.min(cfg.mtu as u32)
            || ends != (remaining <= cfg.mtu as u32)
        {
            sh.data_error();
            return Flow::Continue;
        }
        let va = remote_va.wrapping_add(u64::from(wqe.read_done));
        if cfg.verify_data && !data.is_empty() {
            sh.verified(pattern_check_mixed(data, va).map(|_| ()), data.len());
        }
        sh.mem.write(va, data);
        sh.mem.stats_mut().read_bytes_received += data.len() as u64;
        wqe.read_done += data.len() as u32;
        if wqe.read_done == len && ends {
            self.comp_ack(now, pkt, None, sh)
        } else {
            self.update_comp(now, pkt.psn(), ends, pkt.bth.opcode, sh);
            Flow::Continue
        }
    }

    /// rxe complete_ack: the head WQE is done; then update_comp if the
    /// response is not older than `comp_psn`.
    fn comp_ack(
        &mut self,
        now: Time,
        pkt: &RocePacket<'_>,
        atomic_orig: Option<u64>,
        sh: &mut Shared,
    ) -> Flow {
        self.pop_head(now, CompletionStatus::Success, atomic_orig, sh);
        let psn = pkt.psn();
        if psn.diff(self.comp_psn) >= 0 {
            self.update_comp(now, psn, pkt.info.position.ends(), pkt.bth.opcode, sh);
        }
        Flow::Continue
    }

    /// rxe complete_wqe (COMPST_COMP_WQE): a coalesced ACK beyond the head.
    fn complete_head(&mut self, now: Time, sh: &mut Shared) {
        let last = self.sq.front().expect("head").last_psn;
        if last.diff(self.comp_psn) >= 0 {
            self.comp_psn = last.next();
            self.comp_opcode = None;
        }
        self.pop_head(now, CompletionStatus::Success, None, sh);
    }

    /// COMPST_UPDATE_COMP: `comp_psn` moves past `psn`.
    fn update_comp(&mut self, now: Time, psn: Psn, ends: bool, op: Opcode, sh: &mut Shared) {
        self.comp_opcode = (!ends).then_some(op);
        if psn.diff(self.comp_psn) >= 0 {
            self.comp_psn = psn.next();
        }
        // rxe waits for a later response to complete a SEND/WRITE whose last
        // PSN got acknowledged while it was being retransmitted, and a retry
        // in that window makes it resend a bogus zero-length packet at the
        // next WQE's PSN. Completing it right away is the brief's coalesced
        // ACK rule and avoids that race.
        while let Some(w) = self.sq.front() {
            if w.needs_response() || w.state == WqeState::Posted || !self.comp_psn.after(w.last_psn)
            {
                break;
            }
            self.pop_head(now, CompletionStatus::Success, None, sh);
        }
    }

    /// Removes the head WQE and reports its completion.
    fn pop_head(
        &mut self,
        now: Time,
        status: CompletionStatus,
        atomic_orig: Option<u64>,
        sh: &mut Shared,
    ) {
        let Some(w) = self.sq.pop_front() else {
            return;
        };
        if w.has_rd_atomic {
            self.rd_atomic_free += 1;
        }
        if self.req_idx > 0 {
            self.req_idx -= 1;
        } else {
            // The head was still being (re)sent: the next WQE starts after it.
            self.req_psn = self.comp_psn;
        }
        let ok = status == CompletionStatus::Success;
        if ok {
            sh.stats.messages_completed += 1;
            sh.stats.bytes_completed += u64::from(w.wr.len());
            if matches!(w.wr, WorkRequest::Write { .. } | WorkRequest::Send { .. }) {
                sh.stats.write_send_bytes_completed += u64::from(w.wr.len());
            }
        }
        sh.completions.push_back(Completion {
            wr_id: w.wr_id,
            status,
            bytes: if ok { w.wr.len() } else { 0 },
            at: now,
            opcode: w.wr.opcode(),
            atomic_orig: if ok { atomic_orig } else { None },
        });
    }

    /// rxe reset_retry_counters: progress was made.
    fn reset_retry_counters(&mut self, cfg: &QpConfig) {
        self.retry_left = cfg.retry_cnt;
        self.rnr_left = cfg.rnr_retry;
        self.started_retry = false;
        self.timer.progress();
    }

    /// COMPST_ERROR_RETRY: start a go-back-N sequence, or give up.
    fn error_retry(&mut self, timeout: bool, sh: &mut Shared, now: Time) -> Flow {
        match self.sq.front() {
            None => return Flow::Continue,
            Some(w) if w.state == WqeState::Posted => return Flow::Continue,
            _ => {}
        }
        // One retry sequence at a time unless the timer fired. (rxe: only
        // `started_retry`; a retry already scheduled by an RNR NAK counts too
        // here, so a NAK-seq that trails an RNR NAK does not burn retry_cnt.)
        if (self.started_retry || self.need_retry) && !timeout {
            return Flow::Continue;
        }
        if self.retry_left > 0 {
            if self.retry_left != 7 {
                self.retry_left -= 1;
            }
            // "No point in retrying if we have already seen the last ack
            // that the requester could have caused."
            if self.req_psn.after(self.comp_psn) {
                self.need_retry = true;
                self.started_retry = true;
                sh.stats.retry_sequences += 1;
            }
            Flow::Continue
        } else {
            self.fail_head(now, CompletionStatus::RetryExceeded, sh)
        }
    }

    /// COMPST_RNR_RETRY: wait the peer's RNR timer, then go back to `comp_psn`.
    fn rnr_retry(&mut self, now: Time, timer: u8, sh: &mut Shared) -> Flow {
        if self.rnr_left > 0 {
            if self.rnr_left != 7 {
                self.rnr_left -= 1;
            }
            self.need_retry = true;
            let wait = Duration::from_micros(u64::from(RNR_TIMER_US[usize::from(timer & 0x1F)]));
            self.rnr_at = Some(now + wait);
            // rxe leaves the retransmit timer running; with the default
            // codes the RNR wait (0.64 ms) is far shorter. We suspend it so a
            // long RNR wait cannot also count as a timeout.
            self.retrans_at = None;
            Flow::Continue
        } else {
            self.fail_head(now, CompletionStatus::RnrRetryExceeded, sh)
        }
    }

    /// COMPST_ERROR: the head completes with `status`; the caller moves the
    /// QP to the error state, which flushes the rest.
    fn fail_head(&mut self, now: Time, status: CompletionStatus, sh: &mut Shared) -> Flow {
        self.pop_head(now, status, None, sh);
        Flow::Fatal
    }

    /// Error state: every WQE left completes as flushed; timers stop.
    pub fn flush(&mut self, now: Time, sh: &mut Shared) {
        while !self.sq.is_empty() {
            self.req_idx = 0;
            self.pop_head(now, CompletionStatus::Flushed, None, sh);
        }
        self.retrans_at = None;
        self.rnr_at = None;
        self.need_retry = false;
        self.paced_until = None;
    }

    /// Fires the RNR wait and the retransmit timer if due.
    pub fn handle_timeout(&mut self, now: Time, cfg: &QpConfig, sh: &mut Shared) -> Flow {
        // The rate limiter let the held request go: the QP is ready to send
        // and the port decides when (a busy port polls it once free). Kept,
        // the past deadline would be reported due at every instant until
        // the port polls — the driver spins at `now` and never advances
        // (docs/benchmarks.md §8, the lossy 400 Gb/s run that never ended).
        if self.paced_until.is_some_and(|t| t <= now) {
            self.paced_until = None;
        }
        if self.rnr_at.is_some_and(|t| t <= now) {
            self.rnr_at = None; // need_retry is set: the next poll goes back
        }
        if self.retrans_at.is_some_and(|t| t <= now) {
            self.retrans_at = None;
            sh.stats.timeouts += 1;
            if sh.stats.acks_received > 0 {
                sh.stats.timeouts_after_ack += 1;
            }
            self.timer.expired();
            if self.error_retry(true, sh, now) == Flow::Fatal {
                return Flow::Fatal;
            }
            self.rearm(now, cfg);
        }
        Flow::Continue
    }
}

/// The next packet of a WRITE or SEND of `len` bytes of which `sent` went
/// out already: (its payload bytes, whether it is the first, whether it is
/// the last, the packets left with it).
fn segment(len: u32, sent: u32, mtu: u32) -> (u32, bool, bool, u32) {
    let resid = len - sent;
    (
        resid.min(mtu),
        sent == 0,
        resid <= mtu,
        resid.div_ceil(mtu).max(1),
    )
}

/// An atomic's opcode and AtomicETH (one packet, no payload).
fn atomic(op: Opcode, va: u64, rkey: u32, swap_add: u64, compare: u64) -> (Opcode, AtomicEth) {
    let eth = AtomicEth {
        va,
        rkey,
        swap_add,
        compare,
    };
    (op, eth)
}

/// A WRITE's opcodes, in [`segment_opcode`]'s order.
const WRITE_OPCODES: [Opcode; 6] = [
    Opcode::RC_WRITE_ONLY,
    Opcode::RC_WRITE_ONLY_IMM,
    Opcode::RC_WRITE_FIRST,
    Opcode::RC_WRITE_MIDDLE,
    Opcode::RC_WRITE_LAST,
    Opcode::RC_WRITE_LAST_IMM,
];

/// A SEND's opcodes, in [`segment_opcode`]'s order.
const SEND_OPCODES: [Opcode; 6] = [
    Opcode::RC_SEND_ONLY,
    Opcode::RC_SEND_ONLY_IMM,
    Opcode::RC_SEND_FIRST,
    Opcode::RC_SEND_MIDDLE,
    Opcode::RC_SEND_LAST,
    Opcode::RC_SEND_LAST_IMM,
];

/// The opcode of a packet of a message from its kind's `[ONLY, ONLY_IMM,
/// FIRST, MIDDLE, LAST, LAST_IMM]` (an immediate rides on the last packet).
fn segment_opcode(ops: [Opcode; 6], start: bool, end: bool, imm: bool) -> Opcode {
    match (start, end, imm) {
        (true, true, false) => ops[0],
        (true, true, true) => ops[1],
        (true, false, _) => ops[2],
        (false, false, _) => ops[3],
        (false, true, false) => ops[4],
        (false, true, true) => ops[5],
    }
}
