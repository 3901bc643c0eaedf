//! NCCL-style traffic: one direction of an NCCL network connection the way
//! NCCL's IB transport (`net_ib`) drives its RC queue pairs.
//!
//! What NCCL does, and what is modelled here (NVIDIA/nccl
//! `src/transport/net_ib.cc`, `ncclIbIrecv`, `ncclIbPostFifo`,
//! `ncclIbIsend`, `ncclIbMultiSend`; docs/roce-notes.md):
//!
//! - The QPs are connected with QPNs exchanged over a TCP socket (no
//!   RDMA-CM): the responders' `min_rnr_timer` is NCCL's 12, not 0.
//! - A connection has `NCCL_IB_QPS_PER_CONNECTION` QPs. Each send (one
//!   *step* of `NCCL_BUFFSIZE / NCCL_STEPS` bytes, 512 KiB by default) is
//!   split evenly over them, 128-byte aligned, and every QP carries its part
//!   as one RDMA WRITE_WITH_IMM (immediate = bytes): the receiver learns of
//!   the data by the receive completion each WRITE_WITH_IMM consumes, never
//!   by polling memory.
//! - **Receiver-driven flow control.** The receiver posts one receive on
//!   every QP per step and tells the sender where to write by an RDMA WRITE
//!   into the sender's FIFO (the "clear to send", on the connection's first
//!   QP, in the reverse direction); the sender may not send a step before
//!   its FIFO entry arrived. The receiver has `NCCL_STEPS` (8) buffers and
//!   reposts one only when the GPU has consumed the step in it. So at most
//!   `NCCL_BUFFSIZE` bytes per connection are in flight per *end-to-end*
//!   round trip (the CTS crosses the WAN one way, the data the other): a
//!   gateway's pseudo-ACK shortens the requester's ACK loop, not this one.
//! - The sender's own buffer also has `NCCL_STEPS` slots; a slot is free
//!   again when its WRITEs completed (which pseudo-ACKs do speed up).
//! - **One operation at a time per connection.** Every collective is a
//!   proxy operation of its own (its own `opCount`), and NCCL's proxy runs
//!   the operations of one connection one after the other: `ProxyAppend`
//!   chains a later one as the `nextPeer` of the one under way, and
//!   `removeOp` activates it only once that one is done (receiver: the GPU
//!   consumed its last step; sender: its last send completed; `src/proxy.cc`,
//!   `sendProxyProgress`/`recvProxyProgress` in `src/transport/net.cc`).
//!   So the receiver's grants for collective k + 1 leave only when
//!   collective k's last step on that connection was consumed, and cross the
//!   WAN before k + 1's first byte can. [`Conn::extend`] queues one
//!   operation; [`Conn::grants_across_ops`] lifts the rule (a what-if: no
//!   NCCL does it) to measure what it costs.
//!
//! Idealised: the GPU consumes a received step at once (no reduction time,
//! no back-pressure from the next hop's buffer), and the FIFO write is
//! counted by the sender's memory statistics (`writes_placed`), which is
//! what polling the FIFO in host memory amounts to.

use soya_proto::time::Time;

use super::scenario::{qp_config, Scenario};
use super::world::{Host, Node, World};
use crate::rc::{CompletionStatus, QpAddr, RcQp, WorkRequest};

/// NCCL's `NCCL_STEPS`: buffers per connection.
pub const NCCL_STEPS: u32 = 8;
/// NCCL's default `NCCL_BUFFSIZE` (Simple protocol): 4 MiB, so 512 KiB
/// steps.
pub const DEFAULT_BUFFSIZE: u32 = 4 << 20;
/// Multi-QP writes are multiples of 128 bytes (`ncclIbMultiSend`).
const ALIGN: u32 = 128;
/// Bytes of one FIFO entry the receiver writes (NCCL's `ncclIbSendFifo`
/// is 32 bytes; one pattern block here so the data check covers it).
const FIFO_ENTRY: u32 = 64;
/// Largest simulated receive region per QP (see [`NcclParams::region_bytes`]).
const MAX_REGION: u64 = 8 << 20;

/// The NCCL settings of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclParams {
    /// `NCCL_BUFFSIZE`: bytes per connection in `NCCL_STEPS` buffers.
    pub buffsize: u32,
    /// `NCCL_IB_QPS_PER_CONNECTION`.
    pub qps_per_conn: u32,
}

impl Default for NcclParams {
    fn default() -> NcclParams {
        NcclParams {
            buffsize: DEFAULT_BUFFSIZE,
            qps_per_conn: 2,
        }
    }
}

impl NcclParams {
    /// Bytes of one step (one buffer).
    pub fn step_bytes(&self) -> u32 {
        (self.buffsize / NCCL_STEPS).max(ALIGN)
    }

    /// Bytes of a receiver QP's region. NCCL_STEPS buffers of one part
    /// each, capped at [`MAX_REGION`]: past it, buffers share addresses.
    /// The data check does not mind (every packet is checked against the
    /// pattern of its own address and message when it is placed), and a
    /// 1 GB AllReduce over 8 channels does not need 1 GiB of simulated
    /// GPU memory.
    pub fn region_bytes(&self) -> u64 {
        let part = u64::from(self.slice_bytes());
        let all = u64::from(NCCL_STEPS) * part;
        (all.min(MAX_REGION) / part).max(1) * part
    }

    /// Where buffer `slot` of a QP's part starts, from its region's base.
    pub fn offset(&self, slot: u64) -> u64 {
        slot * u64::from(self.slice_bytes()) % self.region_bytes()
    }

    /// Largest part of a step one QP carries.
    pub fn slice_bytes(&self) -> u32 {
        self.step_bytes()
            .div_ceil(self.qps_per_conn)
            .next_multiple_of(ALIGN)
    }
}

/// The part of an `len`-byte message QP `q` of `n` carries (NCCL: each QP
/// takes `ceil(ceil(len / n) / 128) × 128` bytes until none are left; a QP
/// with nothing left still posts a zero-length WRITE_WITH_IMM).
pub fn split(len: u32, n: u32, q: u32) -> u32 {
    let part = len.div_ceil(n).next_multiple_of(ALIGN);
    len.saturating_sub(part.saturating_mul(q)).min(part)
}

/// One direction of one connection: the sender's QPs on one host, the
/// receiver's on the other, and the chunks (NCCL steps) to move.
pub struct Conn {
    pub sender: Node,
    pub receiver: Node,
    /// Indices in the sender's and the receiver's `Host::qps`, pairwise
    /// connected.
    send_qps: Vec<usize>,
    recv_qps: Vec<usize>,
    p: NcclParams,
    /// Length of every chunk to send, in order.
    lens: Vec<u32>,
    /// Where each queued operation (collective) ends in `lens`.
    op_ends: Vec<usize>,
    /// What-if, not NCCL: the receiver grants the next operation's buffers
    /// as soon as they are free, the sender sends as soon as granted,
    /// across operation boundaries (see the module's notes).
    pub grants_across_ops: bool,
    /// Chunks the application made available to send (in order).
    available: usize,
    /// Chunks posted to the QPs.
    posted: usize,
    /// Per sender QP: WRITE completions seen.
    send_done: Vec<usize>,
    /// Clear-to-sends granted by the receiver (posted) and seen by the
    /// sender (FIFO entries placed in its memory).
    granted: usize,
    /// Clear-to-send writes completed at the receiver.
    cts_done: usize,
    /// Per receiver QP: receive completions seen.
    recv_done: Vec<usize>,
    /// When each chunk was received whole (every QP's part).
    pub received_at: Vec<Time>,
    /// When the receiver granted each chunk's buffer (posted its FIFO
    /// entry), and when the sender posted each chunk's WRITEs.
    pub granted_at: Vec<Time>,
    pub posted_at: Vec<Time>,
    /// When the sender saw each grant (its FIFO entry placed).
    pub grant_seen_at: Vec<Time>,
    /// Failed work requests or receives (any: the run is invalid).
    pub failures: u64,
    /// Receive completions that were not a WRITE_WITH_IMM of the expected
    /// length and immediate.
    pub bad_completions: u64,
}

fn host_mut(w: &mut World, n: Node) -> &mut Host {
    match n {
        Node::HostA => &mut w.host_a,
        Node::HostB => &mut w.host_b,
        _ => panic!("{n:?} is not a host"),
    }
}

fn host(w: &World, n: Node) -> &Host {
    match n {
        Node::HostA => &w.host_a,
        Node::HostB => &w.host_b,
        _ => panic!("{n:?} is not a host"),
    }
}

/// A free QPN on a host: QPNs are exchanged out of band, so any unique
/// 24-bit value will do.
fn next_qpn(w: &World, n: Node) -> u32 {
    let base = if n == Node::HostA { 0x100 } else { 0x20_0000 };
    base + host(w, n).qps.len() as u32
}

impl Conn {
    /// Adds the connection's QPs to the world (`s` gives the endpoint model
    /// and MTU) and queues `lens` chunks, none available yet.
    pub fn new(
        w: &mut World,
        s: &Scenario,
        sender: Node,
        receiver: Node,
        p: NcclParams,
        lens: Vec<u32>,
        psn_seed: u32,
    ) -> Result<Conn, String> {
        let ip = |n: Node| {
            if n == Node::HostA {
                super::scenario::HOST_A
            } else {
                super::scenario::HOST_B
            }
        };
        let mut send_qps = Vec::new();
        let mut recv_qps = Vec::new();
        for q in 0..p.qps_per_conn {
            let a = QpAddr {
                ip: ip(sender).into(),
                qpn: next_qpn(w, sender),
            };
            let b = QpAddr {
                ip: ip(receiver).into(),
                qpn: next_qpn(w, receiver),
            };
            let psn_a =
                soya_proto::roce::Psn::new(psn_seed.wrapping_mul(7919).wrapping_add(q * 104_729));
            let psn_b = soya_proto::roce::Psn::new(
                psn_seed.wrapping_mul(6007).wrapping_add(q * 15_485_863),
            );
            // The sender's memory is its FIFO (first QP only); the
            // receiver's, NCCL_STEPS buffers of this QP's part.
            let fifo = (NCCL_STEPS * FIFO_ENTRY) as usize;
            let bufs = p.region_bytes() as usize;
            let qa = RcQp::new(qp_config(s, fifo), a, b, psn_a, psn_b)?;
            let qb = RcQp::new(qp_config(s, bufs), b, a, psn_b, psn_a)?;
            send_qps.push(host_mut(w, sender).add(a.qpn, qa));
            recv_qps.push(host_mut(w, receiver).add(b.qpn, qb));
        }
        let n = p.qps_per_conn as usize;
        Ok(Conn {
            sender,
            receiver,
            send_qps,
            recv_qps,
            p,
            op_ends: if lens.is_empty() {
                Vec::new()
            } else {
                vec![lens.len()]
            },
            grants_across_ops: false,
            lens,
            available: 0,
            posted: 0,
            send_done: vec![0; n],
            granted: 0,
            cts_done: 0,
            recv_done: vec![0; n],
            received_at: Vec::new(),
            granted_at: Vec::new(),
            posted_at: Vec::new(),
            grant_seen_at: Vec::new(),
            failures: 0,
            bad_completions: 0,
        })
    }

    /// Chunks to move in all.
    pub fn total(&self) -> usize {
        self.lens.len()
    }

    /// Chunks received whole so far.
    pub fn received(&self) -> usize {
        self.received_at.len()
    }

    pub fn done(&self) -> bool {
        self.received() == self.total()
    }

    /// Queues more chunks: the next collective on the same connection,
    /// one proxy operation.
    pub fn extend(&mut self, lens: &[u32]) {
        self.lens.extend_from_slice(lens);
        if !lens.is_empty() {
            self.op_ends.push(self.lens.len());
        }
    }

    /// Chunks whose every WRITE completed (the sender's `done`).
    pub fn sent(&self) -> usize {
        self.send_done.iter().copied().min().unwrap_or(0)
    }

    /// Where the operation under way ends, once the first `done` chunks
    /// are done: NCCL's proxy does not start an operation's steps before
    /// the previous operation on the connection is done.
    fn op_end(&self, done: usize) -> usize {
        if self.grants_across_ops {
            return self.total();
        }
        self.op_ends
            .iter()
            .copied()
            .find(|&e| e > done)
            .unwrap_or(self.total())
    }

    /// The application made the first `n` chunks available to send.
    pub fn make_available(&mut self, n: usize) {
        self.available = self.available.max(n.min(self.total()));
    }

    /// Every WRITE posted, data and clear-to-send, completed: the
    /// requesters have nothing outstanding (and no timer armed).
    pub fn idle(&self) -> bool {
        self.send_done.iter().all(|&d| d == self.posted) && self.cts_done == self.granted
    }

    /// Bytes of all chunks.
    pub fn bytes(&self) -> u64 {
        self.lens.iter().map(|&l| u64::from(l)).sum()
    }

    /// Reaps completions, grants receive buffers and posts what flow
    /// control allows. Returns whether a chunk arrived.
    pub fn pump(&mut self, w: &mut World) -> bool {
        let before = self.received();
        // Receiver: receive completions, one per QP per chunk, in order.
        let n = self.p.qps_per_conn;
        let rh = host_mut(w, self.receiver);
        for (q, &i) in self.recv_qps.iter().enumerate() {
            while let Some(c) = rh.qp_mut(i).poll_recv_completion() {
                let k = self.recv_done[q];
                let want = self.lens.get(k).map(|&l| split(l, n, q as u32));
                if c.status != CompletionStatus::Success {
                    self.failures += 1;
                } else if !c.rdma_write || Some(c.bytes) != want || c.imm != want {
                    self.bad_completions += 1;
                }
                self.recv_done[q] += 1;
                let whole = self.recv_done.iter().copied().min().unwrap_or(0);
                while self.received_at.len() < whole.min(self.total()) {
                    self.received_at.push(c.at);
                }
            }
            // The CTS writes the receiver posted complete here too.
            while let Some(c) = rh.qp_mut(i).poll_completion() {
                if c.status != CompletionStatus::Success {
                    self.failures += 1;
                }
                self.cts_done += 1;
            }
        }
        // The GPU consumed what arrived: repost its buffers, each with a
        // receive on every QP and a FIFO entry for the sender.
        let target = (self.received() + NCCL_STEPS as usize).min(self.op_end(self.received()));
        while self.granted < target {
            let slot = (self.granted % NCCL_STEPS as usize) as u64;
            let sh = host(w, self.sender);
            let fifo = &sh.qps[self.send_qps[0]];
            let (va, rkey) = (
                fifo.memory().base() + slot * u64::from(FIFO_ENTRY),
                fifo.memory().rkey(),
            );
            let rh = host_mut(w, self.receiver);
            for &i in &self.recv_qps {
                rh.qp_mut(i).post_recv(1);
            }
            let cts = WorkRequest::Write {
                remote_va: va,
                rkey,
                len: FIFO_ENTRY,
                imm: None,
            };
            if rh.qp_mut(self.recv_qps[0]).post_send(cts).is_err() {
                self.failures += 1;
                break;
            }
            self.granted += 1;
            self.granted_at.push(w.now);
        }
        // Sender: its WRITE completions free its buffers.
        let sh = host_mut(w, self.sender);
        for (q, &i) in self.send_qps.iter().enumerate() {
            while let Some(c) = sh.qp_mut(i).poll_completion() {
                if c.status != CompletionStatus::Success {
                    self.failures += 1;
                }
                self.send_done[q] += 1;
            }
            while sh.qp_mut(i).poll_recv_completion().is_some() {
                self.bad_completions += 1;
            }
        }
        let sent = self.sent();
        let op_end = self.op_end(sent);
        let cts_seen = sh.qps[self.send_qps[0]].memory().stats().writes_placed as usize;
        while self.grant_seen_at.len() < cts_seen {
            self.grant_seen_at.push(w.now);
        }
        // A chunk goes when the application has it, the receiver's FIFO
        // entry for it arrived, and the sender has a free buffer.
        while self.posted < self.available
            && self.posted < cts_seen
            && self.posted < sent + NCCL_STEPS as usize
            && self.posted < op_end
        {
            let k = self.posted;
            let len = self.lens[k];
            let slot = (k % NCCL_STEPS as usize) as u64;
            let rh = host(w, self.receiver);
            let dest: Vec<(u64, u32)> = self
                .recv_qps
                .iter()
                .map(|&i| {
                    let m = rh.qps[i].memory();
                    (m.base() + self.p.offset(slot), m.rkey())
                })
                .collect();
            let sh = host_mut(w, self.sender);
            for (q, (&i, (va, rkey))) in self.send_qps.iter().zip(dest).enumerate() {
                let part = split(len, n, q as u32);
                let wr = WorkRequest::Write {
                    remote_va: va,
                    rkey,
                    len: part,
                    imm: Some(part),
                };
                if sh.qp_mut(i).post_send(wr).is_err() {
                    self.failures += 1;
                }
            }
            self.posted += 1;
            self.posted_at.push(w.now);
        }
        self.received() > before
    }

    /// Receiver-side data statistics: bytes verified against the pattern,
    /// bytes placed, data errors (receiver and sender QPs).
    pub fn data(&self, w: &World) -> (u64, u64, u64) {
        let (mut verified, mut placed, mut errors) = (0, 0, 0);
        let rh = host(w, self.receiver);
        for &i in &self.recv_qps {
            let m = rh.qps[i].memory().stats();
            verified += m.bytes_verified;
            placed += m.bytes_placed;
            errors += m.data_errors + rh.qps[i].stats().data_errors;
        }
        let sh = host(w, self.sender);
        for &i in &self.send_qps {
            errors += sh.qps[i].stats().data_errors;
        }
        (verified, placed, errors)
    }

    /// Requester retransmissions and timer expiries of the data QPs.
    pub fn retransmissions(&self, w: &World) -> (u64, u64) {
        let sh = host(w, self.sender);
        self.send_qps.iter().fold((0, 0), |(r, t), &i| {
            let st = sh.qps[i].stats();
            (r + st.retransmitted_packets, t + st.timeouts)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_splits_over_the_qps_in_128_byte_parts() {
        assert_eq!(split(512 << 10, 2, 0), 256 << 10);
        assert_eq!(split(512 << 10, 2, 1), 256 << 10);
        // 1000 B over 4 QPs: 256, 256, 256, 232.
        let parts: Vec<u32> = (0..4).map(|q| split(1000, 4, q)).collect();
        assert_eq!(parts, [256, 256, 256, 232]);
        // 200 B over 4: 128, 72, then zero-length writes.
        let parts: Vec<u32> = (0..4).map(|q| split(200, 4, q)).collect();
        assert_eq!(parts, [128, 72, 0, 0]);
        for len in [0u32, 1, 127, 128, 4097, 524_288, 1_000_001] {
            for n in 1..=8 {
                let sum: u32 = (0..n).map(|q| split(len, n, q)).sum();
                assert_eq!(sum, len, "len {len} over {n}");
            }
        }
        let p = NcclParams::default();
        assert_eq!(p.step_bytes(), 512 << 10);
        assert_eq!(p.slice_bytes(), 256 << 10);
    }
}
