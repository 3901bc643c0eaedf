//! A software RoCEv2 RC endpoint modelled on Linux rxe, sans-IO.
//!
//! This is the project's one RC endpoint: the simulator drives it in virtual
//! time and `soya-perf` drives it over real UDP sockets. It never reads a
//! clock, opens a socket or draws a random number: inputs are
//! `(packet or event, now)`, outputs are IP packets ([`RcQp::poll_transmit`])
//! and deadlines ([`RcQp::poll_timeout`]).
//!
//! Layout, each half a transcription of one rxe state machine:
//!
//! - `requester.rs`: rxe_req.c (segmenting WQEs into
//!   packets, window, AckReq, go-back-N `req_retry`) and rxe_comp.c
//!   (`check_psn` / `check_ack`: coalesced ACKs, implied NAK, NAK-seq, RNR,
//!   fatal NAKs, retransmit timer, retry counters).
//! - `responder.rs`: rxe_resp.c (`check_psn`, `check_op_seq`,
//!   `check_resource`, `check_length`, `check_rkey`, `execute`,
//!   `read_reply`, `atomic_reply`, `acknowledge`, `duplicate_request`,
//!   class C errors).
//! - [`memory`]: the registered region and the verifiable data pattern by
//!   which tests (and soya-perf) catch loss, duplication, reordering and
//!   corruption end to end.
//!
//! Deliberate differences from rxe are marked "rxe:" in the comments.
//!
//! # Driving it
//!
//! ```text
//! qp.post_send(wr) / qp.post_recv(n)          // any time
//! on packet:   qp.handle_packet(now, bytes)
//! on deadline: qp.handle_timeout(now)         // deadline = qp.poll_timeout()
//! after each of the above: while let Some(n) = qp.poll_transmit(now, &mut buf) { send(&buf[..n]) }
//! then: qp.poll_completion() / qp.poll_recv_completion()
//! ```
//!
//! `buf` must hold [`RcQp::max_packet_len`] bytes. A go-back-N decided while
//! handling a packet or a timeout takes effect at the next `poll_transmit`.
//!
//! The data pattern ([`memory`]) is on by default: the n-th WRITE or SEND a
//! QP posts carries `msg_seq` n, and the peer's [`Memory`] counts every
//! payload byte it verified and every mismatch.

pub mod hw;
pub mod memory;
mod requester;
mod responder;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use soya_proto::roce::bth::DEFAULT_PKEY;
use soya_proto::roce::ip::{rxe_udp_sport, IPV6_LEN, UDP_LEN};
use soya_proto::roce::{Bth, ExtHeaders, IpHeader, OpKind, Opcode, Psn, RocePacket, RoceRepr};
use soya_proto::time::Time;

pub use memory::{
    pattern_check, pattern_check_as, pattern_check_mixed, pattern_fill, MemStats, Memory,
    PatternError, BLOCK,
};

use requester::Requester;
use responder::Responder;

/// Largest message rxe accepts (`RXE_MAX_MSG_SIZE`, 2 GiB).
pub const MAX_MSG_SIZE: u32 = 1 << 31;
/// Default bound on posted, not yet completed send WQEs.
pub const DEFAULT_MAX_SEND_WQES: usize = 4096;

/// QP attributes. `Default` gives the rxe / perftest defaults;
/// [`hw::hw_config`] a hardware endpoint's.
#[derive(Clone, Debug, PartialEq)]
pub struct QpConfig {
    /// Path MTU: 1024, 2048 or 4096.
    pub mtu: usize,
    /// PSNs the requester may have outstanding (rxe `RXE_MAX_UNACKED_PSNS`).
    pub max_unacked_psns: u32,
    /// AckReq on the last packet of each message and on every n-th packet.
    pub ack_req_every: u32,
    /// Local ACK timeout: 4.096 us << code; 0 = no retransmit timer.
    pub timeout_code: u8,
    /// Retries of a retry sequence (timeout, NAK-seq, implied NAK); 7 = infinite.
    pub retry_cnt: u8,
    /// Retries after RNR NAKs; 7 = infinite.
    pub rnr_retry: u8,
    /// Outstanding READ/atomic requests (rounded up to a power of two); also
    /// the number of responder resources kept for duplicate READ/atomics.
    pub max_rd_atomic: u32,
    /// Responder: timer code put in the RNR NAKs it sends (12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// IP TOS (IPv6 traffic class) of emitted packets.
    pub tos: u8,
    /// Bound of the send queue ([`PostError::QueueFull`] beyond it).
    pub max_send_wqes: usize,
    /// VA of this QP's registered memory.
    pub mem_base: u64,
    /// Size of this QP's registered memory in bytes.
    pub mem_size: usize,
    /// R_Key of that memory; `None` derives one from the QPN.
    pub rkey: Option<u32>,
    /// Fill outgoing payloads with the pattern and check incoming ones. Off,
    /// payloads are zeros and nothing is checked (for raw speed).
    pub verify_data: bool,
    /// The retransmission timer: the configured timeout, or a hardware's
    /// adaptive steps first.
    pub timer: hw::TimerMode,
    /// DCQCN rate control on CNPs (hardware); `None`: CNPs are counted only.
    pub dcqcn: Option<hw::DcqcnParams>,
}

impl Default for QpConfig {
    fn default() -> QpConfig {
        QpConfig {
            mtu: 4096,
            max_unacked_psns: 128,
            ack_req_every: 64,
            timeout_code: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            min_rnr_timer: 12,
            tos: 0,
            max_send_wqes: DEFAULT_MAX_SEND_WQES,
            mem_base: 0x1_0000_0000,
            mem_size: 64 << 20,
            rkey: None,
            verify_data: true,
            timer: hw::TimerMode::Configured,
            dcqcn: None,
        }
    }
}

impl QpConfig {
    /// The local ACK timeout (`qp_timeout_jiffies = 4096 ns << timeout`), or
    /// `None` when `timeout_code` is 0 (no retransmit timer).
    pub fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout_code != 0).then(|| Duration::from_nanos(4096u64 << self.timeout_code))
    }

    /// READ/atomic depth as rxe uses it: rounded up to a power of two.
    pub fn rd_atomic_depth(&self) -> u32 {
        self.max_rd_atomic.next_power_of_two()
    }

    fn validate(&self) -> Result<(), String> {
        if ![1024, 2048, 4096].contains(&self.mtu) {
            return Err(format!("mtu {} is not 1024, 2048 or 4096", self.mtu));
        }
        if self.max_unacked_psns == 0 || self.max_unacked_psns >= 1 << 22 {
            return Err(format!(
                "max_unacked_psns {} outside 1..2^22",
                self.max_unacked_psns
            ));
        }
        // With fewer PSNs allowed out than packets between AckReqs, a stream
        // of large messages stops at the window with nothing asking for an
        // ACK, and only the retransmit timer gets it going again.
        if self.ack_req_every == 0 || self.ack_req_every > self.max_unacked_psns {
            return Err(format!(
                "ack_req_every {} must be in 1..=max_unacked_psns ({})",
                self.ack_req_every, self.max_unacked_psns
            ));
        }
        if self.timeout_code > 31 || self.min_rnr_timer > 31 {
            return Err("timeout_code and min_rnr_timer are 5-bit codes".into());
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return Err("retry_cnt and rnr_retry are 3-bit counts".into());
        }
        if self.max_rd_atomic == 0 || self.max_rd_atomic > 128 {
            return Err(format!(
                "max_rd_atomic {} outside 1..=128",
                self.max_rd_atomic
            ));
        }
        if self.max_send_wqes == 0 {
            return Err("max_send_wqes must be at least 1".into());
        }
        if self.mem_base.checked_add(self.mem_size as u64).is_none() {
            return Err("memory region wraps the address space".into());
        }
        Ok(())
    }
}

/// One end of the connection: IP address and QP number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpAddr {
    pub ip: IpAddr,
    pub qpn: u32,
}

/// A send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkRequest {
    Write {
        remote_va: u64,
        rkey: u32,
        len: u32,
        imm: Option<u32>,
    },
    Send {
        len: u32,
        imm: Option<u32>,
    },
    /// The data lands in this QP's own [`Memory`] at the same VA (as perftest
    /// reads into its own buffer), if that range exists locally.
    Read {
        remote_va: u64,
        rkey: u32,
        len: u32,
    },
    FetchAdd {
        remote_va: u64,
        rkey: u32,
        add: u64,
    },
    CmpSwap {
        remote_va: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
}

impl WorkRequest {
    pub fn opcode(&self) -> WrOpcode {
        match self {
            WorkRequest::Write { .. } => WrOpcode::Write,
            WorkRequest::Send { .. } => WrOpcode::Send,
            WorkRequest::Read { .. } => WrOpcode::Read,
            WorkRequest::FetchAdd { .. } => WrOpcode::FetchAdd,
            WorkRequest::CmpSwap { .. } => WrOpcode::CmpSwap,
        }
    }

    /// Bytes the message moves (8 for atomics).
    pub fn len(&self) -> u32 {
        match *self {
            WorkRequest::Write { len, .. }
            | WorkRequest::Send { len, .. }
            | WorkRequest::Read { len, .. } => len,
            WorkRequest::FetchAdd { .. } | WorkRequest::CmpSwap { .. } => 8,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The kind of a completed work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOpcode {
    Write,
    Send,
    Read,
    FetchAdd,
    CmpSwap,
}

/// Work completion status (the `IB_WC_*` codes the endpoint can produce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionStatus {
    Success,
    /// `IB_WC_RETRY_EXC_ERR`: retry_cnt exhausted (timeouts, NAK-seq, implied NAK).
    RetryExceeded,
    /// `IB_WC_RNR_RETRY_EXC_ERR`.
    RnrRetryExceeded,
    /// NAK 0x62.
    RemoteAccessError,
    /// NAK 0x61.
    RemoteInvalidRequest,
    /// NAK 0x63 (and any other NAK code).
    RemoteOperationalError,
    /// `IB_WC_WR_FLUSH_ERR`: the QP was in (or entered) the error state.
    Flushed,
}

/// A send-queue completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: CompletionStatus,
    /// Message length on success, 0 otherwise.
    pub bytes: u32,
    pub at: Time,
    pub opcode: WrOpcode,
    /// The remote value before the atomic (atomics that succeeded).
    pub atomic_orig: Option<u64>,
}

/// A receive completion: an incoming SEND, or WRITE with immediate, consumed
/// one posted receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvCompletion {
    /// SEND: bytes received. WRITE with immediate: the RETH length.
    pub bytes: u32,
    pub imm: Option<u32>,
    /// True for WRITE with immediate (`IB_WC_RECV_RDMA_WITH_IMM`).
    pub rdma_write: bool,
    pub at: Time,
    /// `Success`; or, once the QP entered the error state, the class C
    /// error's status for the receive of the message in progress and
    /// [`CompletionStatus::Flushed`] for every other posted receive.
    pub status: CompletionStatus,
}

/// Why [`RcQp::post_send`] refused a work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// `max_send_wqes` WQEs are outstanding.
    QueueFull,
    /// Longer than [`MAX_MSG_SIZE`].
    TooLong,
}

/// Counters. Requester and responder counts of the same QP live together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Packets and IP bytes emitted (requests and responses).
    pub packets_sent: u64,
    pub bytes_sent: u64,
    /// Valid packets addressed to this QP that were processed.
    pub packets_received: u64,
    /// Request packets emitted, retransmissions included.
    pub requests_sent: u64,
    /// Request packets with a PSN that had been sent before.
    pub retransmitted_packets: u64,
    /// Go-back-N sequences started (NAK-seq, implied NAK, timeout).
    pub retry_sequences: u64,
    /// Positive ACKs (opcode ACKNOWLEDGE, syndrome ACK) received.
    pub acks_received: u64,
    /// All NAKs received (= seq + rnr + fatal).
    pub naks_received: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_received: u64,
    pub fatal_naks_received: u64,
    pub read_responses_received: u64,
    pub atomic_acks_received: u64,
    /// Retransmit timer expiries with something outstanding.
    pub timeouts: u64,
    /// Of those, the ones after the first positive ACK of the connection
    /// (the start-up one of a hardware timer shorter than the RTT is not).
    pub timeouts_after_ack: u64,
    /// Responses past a READ/atomic still waiting for its data, and positive
    /// ACKs at its last PSN: each starts a go-back-N (if none is under way).
    pub implied_naks: u64,
    /// Responses that break the response sequence (dropped).
    pub unexpected_responses: u64,
    /// Responder: requests with a PSN before the expected one.
    pub duplicate_requests: u64,
    /// Responder: NAK-seq sent.
    pub seq_errors_sent: u64,
    pub rnr_naks_sent: u64,
    /// Responder: class C NAKs (0x61/0x62) sent.
    pub error_naks_sent: u64,
    /// Responder: positive ACKs sent (re-ACKs of duplicates included).
    pub acks_sent: u64,
    /// Responder: READ response and atomic ACK packets sent.
    pub responses_sent: u64,
    /// Responder: responses dropped because the output queue was full.
    pub response_queue_overflows: u64,
    /// Send WQEs completed successfully, and their bytes.
    pub messages_completed: u64,
    pub bytes_completed: u64,
    /// The part of `bytes_completed` moved by WRITEs and SENDs (what the
    /// peer's memory statistics must account for).
    pub write_send_bytes_completed: u64,
    /// Receive WQEs consumed.
    pub recv_completed: u64,
    /// Receive WQEs completed in error when the QP entered the error state.
    pub recv_flushed: u64,
    /// Pattern mismatches, stale/mixed messages, wrong message lengths.
    pub data_errors: u64,
    /// Unparsable, bad ICRC, wrong P_Key or not RC.
    pub malformed_dropped: u64,
    /// Not for this QP (destination IP/QPN) or not from its peer (source IP).
    pub misaddressed_dropped: u64,
    /// Arrived while the QP was in the error state.
    pub dropped_in_error: u64,
    pub cnps_received: u64,
}

impl QpStats {
    /// Bytes of successfully completed WRITE and SEND WQEs.
    pub fn bytes_completed_writes_sends(&self) -> u64 {
        self.write_send_bytes_completed
    }
}

/// A packet the requester or responder wants sent, before encoding.
pub(crate) struct OutPacket {
    pub opcode: Opcode,
    pub psn: Psn,
    pub ack_req: bool,
    /// `present` is filled in from the opcode table.
    pub ext: ExtHeaders,
    pub payload: OutPayload,
    /// The PSN had been sent before.
    pub retransmission: bool,
}

pub(crate) enum OutPayload {
    None,
    /// `len` bytes of the pattern of `seq` meant for `va`.
    Pattern {
        va: u64,
        len: usize,
        seq: u32,
    },
    /// `len` bytes of local memory at `va` (READ responses).
    Memory {
        va: u64,
        len: usize,
    },
}

/// Whether processing may go on, or the QP must enter the error state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Flow {
    Continue,
    Fatal,
}

/// State both halves touch.
pub(crate) struct Shared {
    pub stats: QpStats,
    pub mem: Memory,
    pub completions: VecDeque<Completion>,
    pub recv_completions: VecDeque<RecvCompletion>,
}

impl Shared {
    pub fn data_error(&mut self) {
        self.stats.data_errors += 1;
        self.mem.stats_mut().data_errors += 1;
    }

    /// Records the outcome of a pattern check of `n` payload bytes.
    pub fn verified(&mut self, r: Result<(), PatternError>, n: usize) {
        match r {
            Ok(()) => self.mem.stats_mut().bytes_verified += n as u64,
            Err(PatternError::TooShort { .. }) | Err(PatternError::Empty) => {
                self.mem.stats_mut().bytes_unverified += n as u64
            }
            Err(_) => self.data_error(),
        }
    }
}

/// The R_Key of a QP's memory region: fixed per QP, learnt by the peer
/// out of band (from [`Memory::rkey`]).
fn rkey_for(qpn: u32) -> u32 {
    (qpn << 8) | 0x5a
}

/// One RC queue pair: requester, responder and registered memory.
pub struct RcQp {
    cfg: QpConfig,
    local: QpAddr,
    remote: QpAddr,
    ip: IpHeader,
    sport: u16,
    req: Requester,
    resp: Responder,
    sh: Shared,
    error: bool,
    /// The latest `now` seen (for completions of WQEs posted in error state).
    now: Time,
    /// Payload staging for requests (one MTU, allocated once).
    scratch: Vec<u8>,
}

impl RcQp {
    /// A QP in RTS: `send_psn` is the first PSN it sends, `recv_psn` the first
    /// it expects (the peer's `send_psn`).
    pub fn new(
        cfg: QpConfig,
        local: QpAddr,
        remote: QpAddr,
        send_psn: Psn,
        recv_psn: Psn,
    ) -> Result<RcQp, String> {
        cfg.validate()?;
        if local.qpn > Psn::MASK || remote.qpn > Psn::MASK {
            return Err("QP numbers are 24 bits".into());
        }
        let mut ip = IpHeader::between(local.ip, remote.ip)
            .ok_or("local and remote IP addresses are of different families")?;
        match &mut ip {
            IpHeader::V4(h) => h.tos = cfg.tos,
            IpHeader::V6(h) => h.traffic_class = cfg.tos,
        }
        let rkey = cfg.rkey.unwrap_or_else(|| rkey_for(local.qpn));
        let mem = Memory::new(cfg.mem_base, cfg.mem_size, rkey);
        Ok(RcQp {
            req: Requester::new(&cfg, send_psn),
            resp: Responder::new(recv_psn),
            sh: Shared {
                stats: QpStats::default(),
                mem,
                completions: VecDeque::new(),
                recv_completions: VecDeque::new(),
            },
            sport: rxe_udp_sport(local.qpn, remote.qpn),
            scratch: vec![0; cfg.mtu],
            cfg,
            local,
            remote,
            ip,
            error: false,
            now: Time::ZERO,
        })
    }

    /// Posts a send WQE and returns its `wr_id`. On a QP in the error state
    /// the WQE is accepted and completes at once as [`CompletionStatus::Flushed`].
    pub fn post_send(&mut self, wr: WorkRequest) -> Result<u64, PostError> {
        if wr.len() > MAX_MSG_SIZE {
            return Err(PostError::TooLong);
        }
        if self.req.outstanding() >= self.cfg.max_send_wqes {
            return Err(PostError::QueueFull);
        }
        let id = self.req.post(wr);
        if self.error {
            self.req.flush(self.now, &mut self.sh);
        }
        Ok(id)
    }

    /// Posts `n` receive WQEs, consumed by incoming SENDs and WRITEs with
    /// immediate (none posted: RNR NAK). On a QP in the error state they
    /// complete at once as [`CompletionStatus::Flushed`] (rxe runs the
    /// responder, which drains the receive queue in the error state).
    pub fn post_recv(&mut self, n: u32) {
        self.resp.post_recv(n);
        if self.error {
            self.resp.flush(self.now, &mut self.sh);
        }
    }

    /// Processes one received IP packet. Anything malformed, misaddressed or
    /// arriving in the error state is counted and dropped.
    pub fn handle_packet(&mut self, now: Time, ip_packet: &[u8]) {
        self.now = self.now.max(now);
        let Ok(pkt) = RocePacket::parse_verified(ip_packet) else {
            self.sh.stats.malformed_dropped += 1;
            return;
        };
        // rxe_recv.c check_addr / check_keys: the packet must come from the
        // peer's address, to ours, for our QPN.
        if pkt.ip.dst() != self.local.ip
            || pkt.ip.src() != self.remote.ip
            || pkt.bth.dest_qp != self.local.qpn
        {
            self.sh.stats.misaddressed_dropped += 1;
            return;
        }
        if pkt.info.kind == OpKind::Cnp {
            self.sh.stats.cnps_received += 1;
            self.req.on_cnp(now);
            return;
        }
        if !pkt.info.is_rc() || pkt.bth.pkey != DEFAULT_PKEY {
            self.sh.stats.malformed_dropped += 1;
            return;
        }
        if self.error {
            self.sh.stats.dropped_in_error += 1;
            return;
        }
        self.sh.stats.packets_received += 1;
        if pkt.info.is_request() {
            if self.resp.handle(now, &pkt, &self.cfg, &mut self.sh) == Flow::Fatal {
                self.enter_error(now);
            }
        } else if pkt.info.is_response()
            && self.req.on_response(now, &pkt, &self.cfg, &mut self.sh) == Flow::Fatal
        {
            self.enter_error(now);
        }
    }

    /// Writes the next packet to send into `buf` and returns its length:
    /// responses (ACK/NAK, READ responses, atomic ACKs) first, then requests
    /// within the window. `buf` must hold [`Self::max_packet_len`] bytes.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        self.now = self.now.max(now);
        if buf.len() < self.max_packet_len() {
            return None;
        }
        let p = match self.resp.next_packet(&self.cfg, &mut self.sh) {
            Some(p) => p,
            None if self.error => return None,
            None => {
                let p = self.req.next_packet(now, &self.cfg)?;
                self.sh.stats.requests_sent += 1;
                if p.retransmission {
                    self.sh.stats.retransmitted_packets += 1;
                }
                p
            }
        };
        let payload: &[u8] = match p.payload {
            OutPayload::None => &[],
            OutPayload::Pattern { va, len, seq } => {
                let s = &mut self.scratch[..len];
                if self.cfg.verify_data {
                    pattern_fill(s, va, seq);
                }
                s
            }
            OutPayload::Memory { va, len } => self.sh.mem.read(va, len).unwrap_or(&[]),
        };
        let mut bth = Bth::new(p.opcode, self.remote.qpn, p.psn);
        bth.ack_req = p.ack_req;
        let ext = ExtHeaders {
            present: p.opcode.info().map(|i| i.headers).unwrap_or_default(),
            ..p.ext
        };
        let repr = RoceRepr {
            ip: self.ip,
            src_port: self.sport,
            bth,
            ext,
        };
        // Cannot fail: headers come from the opcode table and `buf` is large
        // enough; a failure would lose the packet, which retransmission covers.
        let n = repr.emit(payload, buf).ok()?;
        self.sh.stats.packets_sent += 1;
        self.sh.stats.bytes_sent += n as u64;
        Some(n)
    }

    /// The earliest deadline (retransmit timer, RNR wait), if any.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.error {
            return None;
        }
        self.req.poll_timeout()
    }

    /// Fires every deadline at or before `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        self.now = self.now.max(now);
        if !self.error && self.req.handle_timeout(now, &self.cfg, &mut self.sh) == Flow::Fatal {
            self.enter_error(now);
        }
    }

    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.sh.completions.pop_front()
    }

    pub fn poll_recv_completion(&mut self) -> Option<RecvCompletion> {
        self.sh.recv_completions.pop_front()
    }

    pub fn stats(&self) -> &QpStats {
        &self.sh.stats
    }

    /// The QP is in the error state: it sends nothing but answers queued
    /// before (e.g. its final NAK) and drops everything it receives.
    pub fn is_error(&self) -> bool {
        self.error
    }

    pub fn memory(&self) -> &Memory {
        &self.sh.mem
    }

    /// For preparing data (e.g. atomic counters) before a run.
    pub fn memory_mut(&mut self) -> &mut Memory {
        &mut self.sh.mem
    }

    /// Posted send WQEs not yet completed.
    pub fn outstanding(&self) -> usize {
        self.req.outstanding()
    }

    /// The PSN the next new request packet will carry.
    pub fn send_psn(&self) -> Psn {
        self.req.send_psn()
    }

    /// The oldest PSN not yet acknowledged (rxe `comp.psn`).
    pub fn unacked_psn(&self) -> Psn {
        self.req.unacked_psn()
    }

    /// The PSN the responder expects next (rxe `resp.psn`).
    pub fn expected_psn(&self) -> Psn {
        self.resp.expected_psn()
    }

    /// The responder's message sequence number.
    pub fn msn(&self) -> u32 {
        self.resp.msn()
    }

    /// Receive WQEs posted and not consumed.
    pub fn posted_recvs(&self) -> u64 {
        self.resp.posted_recvs()
    }

    pub fn local(&self) -> QpAddr {
        self.local
    }

    pub fn remote(&self) -> QpAddr {
        self.remote
    }

    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// The largest packet this QP emits (IPv6, RETH + ImmDt or AtomicETH,
    /// one MTU of payload, ICRC), rounded up.
    pub fn max_packet_len(&self) -> usize {
        IPV6_LEN + UDP_LEN + 12 + 28 + self.cfg.mtu + 3 + 4
    }

    /// rxe_qp_error: requester and responder stop; outstanding send WQEs
    /// complete as flushed, and so do posted receives (see
    /// `Responder::flush`). Queued answers (a class C NAK, ACKs rxe would
    /// already have sent) still go out; nothing new is accepted.
    fn enter_error(&mut self, now: Time) {
        self.error = true;
        self.req.flush(now, &mut self.sh);
        self.resp.flush(now, &mut self.sh);
    }
}

impl std::fmt::Debug for RcQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcQp")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("send_psn", &self.send_psn())
            .field("unacked_psn", &self.unacked_psn())
            .field("expected_psn", &self.expected_psn())
            .field("outstanding", &self.outstanding())
            .field("error", &self.error)
            .finish()
    }
}
