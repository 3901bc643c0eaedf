//! The responder: rxe_resp.c, one incoming request at a time.
//!
//! The checks run in rxe's order (`check_psn`, `check_op_seq`,
//! `check_resource`, `check_length`, `check_rkey`, `execute`), so an RNR
//! takes precedence over a length error as it does in rxe. Answers are
//! queued in arrival order and emitted by [`Responder::next_packet`]; READ
//! responses are generated lazily, one MTU per call, straight from memory.
//! The queue is FIFO on purpose: an ACK queued after a READ must not
//! overtake its responses, or the requester would see an implied NAK.

use std::collections::VecDeque;

use soya_proto::roce::opcode::Headers;
use soya_proto::roce::{
    Aeth, ExtHeaders, NakCode, OpKind, Opcode, Position, Psn, RocePacket, Syndrome,
};
use soya_proto::time::Time;

use super::memory::{pattern_check, pattern_check_as, pattern_check_as_into, PatternError};
use super::{CompletionStatus, Flow, OutPacket, OutPayload, QpConfig, RecvCompletion, Shared};

/// Most flush completions generated for posted receives when the QP enters
/// the error state (one per WQE, as rxe; beyond this they are only counted
/// in `QpStats::recv_flushed`).
const MAX_FLUSH_COMPLETIONS: u64 = 1 << 16;

/// Bound on queued answers; beyond it new ones are dropped and counted (a
/// lost answer is recovered by the requester's timer).
const MAX_QUEUED: usize = 16 * 1024;

/// A SEND or WRITE message being received (rxe `resp.va/resid/opcode`).
#[derive(Clone, Copy, Debug)]
struct InMsg {
    write: bool,
    /// WRITE: where the next packet lands.
    va: u64,
    /// WRITE: bytes still expected (RETH length minus bytes placed).
    resid: u32,
    /// WRITE: the RETH length.
    len: u32,
    /// Bytes received so far.
    offset: u32,
    /// Pattern sequence number of this message (from its first packet).
    seq: Option<u32>,
}

/// A saved READ/atomic, to answer duplicates (rxe `struct resp_res`).
#[derive(Clone, Copy, Debug)]
enum Resource {
    Read {
        first_psn: Psn,
        last_psn: Psn,
        va: u64,
        len: u32,
        rkey: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A queued answer.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        msn: u32,
        orig: u64,
    },
    /// READ responses still to send. `fresh`: the next one is the first of a
    /// response (First/Only) rather than a continuation (Middle/Last), as
    /// rxe's `rdatm_res_state_new` vs `_replay`.
    Read {
        psn: Psn,
        va: u64,
        resid: u32,
        fresh: bool,
        msn: u32,
    },
}

pub(super) struct Responder {
    /// Expected PSN (rxe `resp.psn`).
    psn: Psn,
    /// Message sequence number (24 bits).
    msn: u32,
    /// One NAK-seq per gap (rxe `resp.sent_psn_nak`).
    sent_psn_nak: bool,
    /// The PSN after the last SEND/WRITE/atomic executed (rxe
    /// `resp.ack_psn`): a duplicate SEND/WRITE is re-ACKed with the one
    /// before it. rxe sets it in `execute` and `atomic_reply`, not in
    /// `read_reply` (after a READ it lags behind the ePSN), nor when the
    /// QP's receive PSN is set (`rxe_qp_from_attr`): 0 until then, so a QP
    /// that never executed one re-ACKs with 0xffffff.
    ack_psn: Psn,
    cur: Option<InMsg>,
    recv_posted: u64,
    /// A receive WQE is taken by the SEND in progress (rxe `resp.wqe`).
    recv_held: bool,
    /// The last `max_rd_atomic` READ/atomic requests.
    res: VecDeque<Resource>,
    out: VecDeque<Answer>,
    /// Highest pattern sequence number of a completed message.
    last_seq: Option<u32>,
    /// The status a class C error gives the receive WQE of the message in
    /// progress (rxe `resp.status`, completed by `do_complete`).
    error_status: Option<CompletionStatus>,
}

impl Responder {
    pub fn new(recv_psn: Psn) -> Responder {
        Responder {
            psn: recv_psn,
            msn: 0,
            sent_psn_nak: false,
            ack_psn: Psn::new(0),
            cur: None,
            recv_posted: 0,
            recv_held: false,
            res: VecDeque::new(),
            out: VecDeque::new(),
            last_seq: None,
            error_status: None,
        }
    }

    pub fn expected_psn(&self) -> Psn {
        self.psn
    }

    pub fn msn(&self) -> u32 {
        self.msn
    }

    pub fn posted_recvs(&self) -> u64 {
        self.recv_posted
    }

    pub fn post_recv(&mut self, n: u32) {
        self.recv_posted += u64::from(n);
    }

    /// The QP entered the error state (rxe `rxe_qp_error`, then `get_req`
    /// → `check_resource` in `QP_STATE_ERROR`): the receive WQE of the
    /// message in progress completes with the class C error's status (rxe
    /// `do_complete` with `resp.status`), every other posted receive with
    /// `IB_WC_WR_FLUSH_ERR`. An application waiting for a SEND wakes up.
    pub fn flush(&mut self, now: Time, sh: &mut Shared) {
        let blank = |status| RecvCompletion {
            bytes: 0,
            imm: None,
            rdma_write: false,
            at: now,
            status,
        };
        if std::mem::take(&mut self.recv_held) {
            let status = self.error_status.unwrap_or(CompletionStatus::Flushed);
            sh.recv_completions.push_back(blank(status));
            sh.stats.recv_flushed += 1;
        }
        let n = std::mem::take(&mut self.recv_posted);
        for _ in 0..n.min(MAX_FLUSH_COMPLETIONS) {
            sh.recv_completions
                .push_back(blank(CompletionStatus::Flushed));
        }
        sh.stats.recv_flushed += n;
        self.cur = None;
    }

    fn queue(&mut self, a: Answer, sh: &mut Shared) {
        if self.out.len() >= MAX_QUEUED {
            sh.stats.response_queue_overflows += 1;
        } else {
            self.out.push_back(a);
        }
    }

    fn ack(&mut self, psn: Psn, syndrome: Syndrome, sh: &mut Shared) {
        let msn = self.msn;
        self.queue(Answer::Ack { psn, syndrome, msn }, sh);
    }

    /// Class C error (rxe do_class_ac_error + RESPST_ERROR): NAK the packet,
    /// then the QP goes to the error state. Answers already queued stand for
    /// packets rxe would already have sent, so they still go out.
    fn class_c(&mut self, psn: Psn, code: NakCode) -> Flow {
        self.error_status = Some(match code {
            NakCode::RemoteAccessError => CompletionStatus::RemoteAccessError,
            NakCode::RemoteOperationalError => CompletionStatus::RemoteOperationalError,
            _ => CompletionStatus::RemoteInvalidRequest,
        });
        self.out.push_back(Answer::Ack {
            psn,
            syndrome: Syndrome::Nak(code),
            msn: self.msn,
        });
        self.cur = None;
        Flow::Fatal
    }

    /// rxe_responder for one request packet.
    pub fn handle(
        &mut self,
        now: Time,
        pkt: &RocePacket<'_>,
        cfg: &QpConfig,
        sh: &mut Shared,
    ) -> Flow {
        let psn = pkt.psn();
        let info = pkt.info;

        // check_psn
        let diff = psn.diff(self.psn);
        if diff > 0 {
            if !self.sent_psn_nak {
                self.sent_psn_nak = true;
                self.ack(self.psn, Syndrome::Nak(NakCode::PsnSequenceError), sh);
            }
            return Flow::Continue;
        }
        if diff < 0 {
            self.duplicate(pkt, sh);
            return Flow::Continue;
        }
        self.sent_psn_nak = false;

        // check_op_valid: FLUSH and ATOMIC WRITE are not modelled.
        if matches!(info.kind, OpKind::Flush | OpKind::AtomicWrite) {
            return self.class_c(psn, NakCode::InvalidRequest);
        }

        // check_op_seq: Middle/Last continue the message in progress, of the
        // same kind; anything else needs no message in progress.
        let is_send = info.kind == OpKind::Send;
        let is_write = info.kind == OpKind::Write;
        let continues = matches!(info.position, Position::Middle | Position::Last);
        let seq_ok = match self.cur {
            Some(m) => continues && ((m.write && is_write) || (!m.write && is_send)),
            None => !(continues && (is_send || is_write)),
        };
        if !seq_ok {
            return self.class_c(psn, NakCode::InvalidRequest);
        }

        // check_resource: SEND First/Only and WRITE with immediate consume a
        // receive WQE; none posted -> RNR NAK, packet dropped, PSN kept.
        let needs_recv = (is_send && info.position.starts())
            || (is_write && info.headers.contains(Headers::IMM_DT));
        if needs_recv && !self.recv_held && self.recv_posted == 0 {
            self.ack(
                psn,
                Syndrome::RnrNak {
                    timer: cfg.min_rnr_timer,
                },
                sh,
            );
            return Flow::Continue;
        }

        // check_length (rxe_resp_check_length)
        let n = pkt.payload().len();
        let mtu = cfg.mtu;
        if is_send || is_write {
            let bad = match info.position {
                Position::Only => n > mtu,
                Position::First | Position::Middle => n != mtu,
                Position::Last => n == 0 || n > mtu,
            };
            if bad {
                return self.class_c(psn, NakCode::InvalidRequest);
            }
        }
        let reth = pkt.ext.reth;
        if info.headers.contains(Headers::RETH) && reth.len > super::MAX_MSG_SIZE {
            return self.class_c(psn, NakCode::InvalidRequest);
        }

        // check_rkey, then execute.
        match info.kind {
            OpKind::Write => {
                let (va, resid) = match self.cur {
                    Some(m) => (m.va, m.resid),
                    None => (reth.va, reth.len),
                };
                // A zero-length WRITE names no memory (C9-88).
                if self.cur.is_none()
                    && reth.len > 0
                    && (reth.rkey != sh.mem.rkey() || !sh.mem.contains(va, resid as usize))
                {
                    return self.class_c(psn, NakCode::RemoteAccessError);
                }
                // Every packet carries min(MTU, rest) and only the one that
                // exhausts the RETH length ends the message. (rxe checks the
                // size but lets a Last end the message short.)
                if n as u32 != resid.min(mtu as u32)
                    || info.position.ends() != (resid <= mtu as u32)
                {
                    return self.class_c(psn, NakCode::InvalidRequest);
                }
                self.execute_data(now, pkt, needs_recv, cfg, sh);
            }
            OpKind::Send => self.execute_data(now, pkt, needs_recv, cfg, sh),
            OpKind::ReadRequest => {
                if reth.len > 0
                    && (reth.rkey != sh.mem.rkey() || !sh.mem.contains(reth.va, reth.len as usize))
                {
                    return self.class_c(psn, NakCode::RemoteAccessError);
                }
                // C9-148: the MSN counts the READ before any response.
                self.msn = (self.msn + 1) & Psn::MASK;
                let npkts = reth.len.div_ceil(mtu as u32).max(1);
                self.save(
                    Resource::Read {
                        first_psn: psn,
                        last_psn: psn.add(npkts - 1),
                        va: reth.va,
                        len: reth.len,
                        rkey: reth.rkey,
                    },
                    cfg,
                );
                let msn = self.msn;
                self.queue(
                    Answer::Read {
                        psn,
                        va: reth.va,
                        resid: reth.len,
                        fresh: true,
                        msn,
                    },
                    sh,
                );
                self.psn = psn.add(npkts);
            }
            OpKind::Atomic => {
                let a = pkt.ext.atomic;
                if a.rkey != sh.mem.rkey() || !sh.mem.contains(a.va, 8) {
                    return self.class_c(psn, NakCode::RemoteAccessError);
                }
                let orig = if pkt.bth.opcode == Opcode::RC_COMPARE_SWAP {
                    sh.mem.cmp_swap(a.va, a.compare, a.swap_add)
                } else {
                    sh.mem.fetch_add(a.va, a.swap_add)
                };
                // rxe: RESPST_ERR_MISALIGNED_ATOMIC -> invalid request.
                let Some(orig) = orig else {
                    return self.class_c(psn, NakCode::InvalidRequest);
                };
                self.msn = (self.msn + 1) & Psn::MASK;
                self.save(Resource::Atomic { psn, orig }, cfg);
                let msn = self.msn;
                self.queue(Answer::AtomicAck { psn, msn, orig }, sh);
                self.psn = psn.next();
                self.ack_psn = self.psn;
            }
            _ => return self.class_c(psn, NakCode::InvalidRequest),
        }
        Flow::Continue
    }

    /// execute() for a SEND or WRITE packet, then acknowledge().
    fn execute_data(
        &mut self,
        now: Time,
        pkt: &RocePacket<'_>,
        needs_recv: bool,
        cfg: &QpConfig,
        sh: &mut Shared,
    ) {
        let info = pkt.info;
        let write = info.kind == OpKind::Write;
        let data = pkt.payload();
        let n = data.len() as u32;
        if info.position.starts() {
            let reth = pkt.ext.reth;
            self.cur = Some(InMsg {
                write,
                va: reth.va,
                resid: reth.len,
                len: reth.len,
                offset: 0,
                seq: None,
            });
        }
        if needs_recv && !self.recv_held {
            self.recv_posted -= 1;
            self.recv_held = true;
        }
        let mut m = self.cur.expect("set at the first packet");

        let placed = write
            && cfg.verify_data
            && n > 0
            && Self::check_and_place(data, &m, info.position.starts(), sh);
        if cfg.verify_data && n > 0 && !placed {
            self.check_data(data, &mut m, info.position.starts(), sh);
        }
        if write {
            if !placed {
                sh.mem.write(m.va, data);
            }
            sh.mem.stats_mut().bytes_placed += u64::from(n);
            m.va = m.va.wrapping_add(u64::from(n));
            m.resid -= n;
        } else {
            sh.mem.stats_mut().send_bytes_received += u64::from(n);
        }
        // Saturating: an endless hostile SEND must not overflow (rxe would
        // run out of receive buffer; we do not model its size).
        m.offset = m.offset.saturating_add(n);

        if info.position.ends() {
            self.msn = (self.msn + 1) & Psn::MASK;
            if write {
                sh.mem.stats_mut().writes_placed += 1;
                if m.offset != m.len {
                    sh.data_error();
                }
            } else {
                sh.mem.stats_mut().sends_received += 1;
            }
            if let Some(s) = m.seq {
                if self.last_seq.is_none_or(|l| s.wrapping_sub(l) as i32 > 0) {
                    self.last_seq = Some(s);
                }
            }
            if self.recv_held {
                self.recv_held = false;
                sh.stats.recv_completed += 1;
                sh.recv_completions.push_back(RecvCompletion {
                    bytes: if write { m.len } else { m.offset },
                    imm: info
                        .headers
                        .contains(Headers::IMM_DT)
                        .then_some(pkt.ext.imm),
                    rdma_write: write,
                    at: now,
                    status: CompletionStatus::Success,
                });
            }
            self.cur = None;
        } else {
            self.cur = Some(m);
        }
        self.psn = pkt.psn().next();
        self.ack_psn = self.psn;
        // acknowledge(): only when asked.
        if pkt.bth.ack_req {
            self.ack(pkt.psn(), Syndrome::ACK_UNLIMITED, sh);
        }
    }

    /// A WRITE packet after the first of its message: checked against the
    /// message's seq while it is placed, in one pass over the payload (what
    /// [`Self::check_data`] then `Memory::write` do in two). Returns false,
    /// having done nothing, where those apply instead (the first packet,
    /// which names the seq; a range outside the memory).
    fn check_and_place(data: &[u8], m: &InMsg, starts: bool, sh: &mut Shared) -> bool {
        let (false, Some(seq)) = (starts, m.seq) else {
            return false;
        };
        let Some(dst) = sh.mem.read_mut(m.va, data.len()) else {
            return false;
        };
        let r = pattern_check_as_into(data, dst, m.va, seq).map_err(|e| match e {
            PatternError::TooShort { .. } => PatternError::Corrupt { va: m.va },
            e => e,
        });
        sh.verified(r, data.len());
        true
    }

    /// Data verification. A WRITE payload is checked at the VA it lands on,
    /// a SEND payload at its offset in the message. The first packet names
    /// the message's seq, which must be newer than every earlier message's:
    /// an old packet replayed under a fresh PSN fails that. Later packets
    /// must carry the same seq (checked against it, so even a 1-byte Last is
    /// verified).
    fn check_data(&mut self, data: &[u8], m: &mut InMsg, starts: bool, sh: &mut Shared) {
        let at = if m.write { m.va } else { u64::from(m.offset) };
        match (starts, m.seq) {
            (false, Some(seq)) => {
                let r = pattern_check_as(data, at, seq).map_err(|e| match e {
                    PatternError::TooShort { .. } => PatternError::Corrupt { va: at },
                    e => e,
                });
                sh.verified(r, data.len());
            }
            _ => match pattern_check(data, at) {
                Ok(seq) => {
                    m.seq = Some(seq);
                    if self
                        .last_seq
                        .is_some_and(|last| seq.wrapping_sub(last) as i32 <= 0)
                    {
                        sh.data_error();
                    } else {
                        sh.verified(Ok(()), data.len());
                    }
                }
                Err(e) => sh.verified(Err(e), data.len()),
            },
        }
    }

    /// rxe duplicate_request.
    fn duplicate(&mut self, pkt: &RocePacket<'_>, sh: &mut Shared) {
        sh.stats.duplicate_requests += 1;
        let psn = pkt.psn();
        let msn = self.msn;
        match pkt.info.kind {
            // C9-105: re-ACK, AckReq or not, with rxe's `ack_psn - 1`: the
            // last SEND/WRITE/atomic executed (not a READ).
            OpKind::Send | OpKind::Write => {
                self.ack(self.ack_psn.sub(1), Syndrome::ACK_UNLIMITED, sh)
            }
            OpKind::ReadRequest => {
                let reth = pkt.ext.reth;
                let found = self.res.iter_mut().find_map(|r| match r {
                    Resource::Read {
                        first_psn,
                        last_psn,
                        va,
                        len,
                        rkey,
                    } if psn.diff(*first_psn) >= 0 && psn.diff(*last_psn) <= 0 => {
                        Some((*first_psn, va, *len, *rkey))
                    }
                    _ => None,
                });
                // Replay only a subset of the saved request (class D: drop).
                let Some((first_psn, va, len, rkey)) = found else {
                    return;
                };
                let end = u128::from(reth.va) + u128::from(reth.len);
                if reth.va < *va
                    || reth.len > len
                    || end > u128::from(*va) + u128::from(len)
                    || reth.rkey != rkey
                {
                    return;
                }
                *va = reth.va; // rxe: "reset the resource, except length"
                self.queue(
                    Answer::Read {
                        psn,
                        va: reth.va,
                        resid: reth.len,
                        fresh: psn == first_psn,
                        msn,
                    },
                    sh,
                );
            }
            OpKind::Atomic => {
                let orig = self.res.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                // The saved result, never a second execution.
                if let Some(orig) = orig {
                    self.queue(Answer::AtomicAck { psn, msn, orig }, sh);
                }
            }
            _ => {}
        }
    }

    /// rxe_prepare_res: a ring of `max_rd_atomic` resources.
    fn save(&mut self, r: Resource, cfg: &QpConfig) {
        if self.res.len() >= cfg.rd_atomic_depth() as usize {
            self.res.pop_front();
        }
        self.res.push_back(r);
    }

    /// The next answer to send, if any.
    pub fn next_packet(&mut self, cfg: &QpConfig, sh: &mut Shared) -> Option<OutPacket> {
        let mtu = cfg.mtu as u32;
        let mut ext = ExtHeaders::default();
        let front = self.out.front_mut()?;
        let (opcode, psn, payload) = match *front {
            Answer::Ack { psn, syndrome, msn } => {
                self.out.pop_front();
                let st = &mut sh.stats;
                match syndrome {
                    Syndrome::Ack { .. } => st.acks_sent += 1,
                    Syndrome::RnrNak { .. } => st.rnr_naks_sent += 1,
                    Syndrome::Nak(NakCode::PsnSequenceError) => st.seq_errors_sent += 1,
                    _ => st.error_naks_sent += 1,
                }
                ext.aeth = Some(Aeth { syndrome, msn });
                (Opcode::RC_ACK, psn, OutPayload::None)
            }
            Answer::AtomicAck { psn, msn, orig } => {
                self.out.pop_front();
                sh.stats.responses_sent += 1;
                ext.aeth = Some(Aeth::ack(msn));
                ext.atomic_ack = orig;
                (Opcode::RC_ATOMIC_ACK, psn, OutPayload::None)
            }
            Answer::Read {
                ref mut psn,
                ref mut va,
                ref mut resid,
                ref mut fresh,
                msn,
            } => {
                // read_reply: opcode from the state and the bytes left.
                let opcode = Opcode::read_response(*fresh, *resid <= mtu);
                let n = (*resid).min(mtu);
                let out = (
                    opcode,
                    *psn,
                    OutPayload::Memory {
                        va: *va,
                        len: n as usize,
                    },
                );
                if opcode != Opcode::RC_READ_RESPONSE_MIDDLE {
                    ext.aeth = Some(Aeth::ack(msn));
                }
                *fresh = false;
                *va = va.wrapping_add(u64::from(n));
                *resid -= n;
                *psn = psn.next();
                if *resid == 0 {
                    self.out.pop_front();
                }
                sh.stats.responses_sent += 1;
                sh.mem.stats_mut().read_bytes_served += u64::from(n);
                out
            }
        };
        Some(OutPacket {
            opcode,
            psn,
            ack_req: false,
            ext,
            payload,
            retransmission: false,
        })
    }
}
