//! The perftest-like workload, shared by `soya-perf` (real time, real
//! sockets) and usable by the simulator (virtual time): the memory layout
//! every QP uses, the work request of the n-th message, and a per-QP driver
//! that keeps `tx_depth` work requests outstanding and accounts for their
//! completions.
//!
//! The layout is the simulator's too (`sim::scenario` builds its work
//! requests and sizes its memory with [`Layout`]): two slots WRITEs cycle
//! through, one slot READs fetch (never written, so a READ racing a WRITE
//! cannot see a torn message), and 4 KiB of atomic counters. Both ends of a
//! connection use the same layout, so READ data lands in the requester's own
//! memory at the VA it came from (as perftest reads into its own buffer).
//!
//! [`QpDriver::pump`] could replace the per-QP `Progress` loop of
//! `scenario::run` too, but not to the letter: that loop keeps the first
//! completion it handles (not the earliest of all QPs) as the start of the
//! measured time, and counts a QP in error as failed without a failed
//! completion.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use soya_proto::time::Time;

use crate::rc::{Completion, CompletionStatus, RcQp, WorkRequest};

/// The RDMA operation of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Write,
    Read,
    Send,
    /// 8-byte fetch-and-add.
    Atomic,
    /// The client posts receives and nothing else (nothing outstanding as a
    /// requester) and waits for the server's SENDs: the application a lost
    /// gateway must not leave hanging (docs/semantics.md, "When the twin is
    /// lost"). The server sends one SEND at once, then one more after the
    /// client's `send_after`.
    #[serde(rename = "wait-send")]
    WaitSend,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
            Op::WaitSend => "wait-send",
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Op, String> {
        Ok(match s {
            "write" => Op::Write,
            "read" => Op::Read,
            "send" => Op::Send,
            "atomic" => Op::Atomic,
            "wait-send" => Op::WaitSend,
            _ => {
                return Err(format!(
                    "unknown op {s:?}: write, read, send, atomic or wait-send"
                ))
            }
        })
    }
}

/// Memory layout of one QP for messages of `size` bytes at `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub base: u64,
    pub size: u32,
}

impl Layout {
    pub const fn new(base: u64, size: u32) -> Layout {
        Layout { base, size }
    }

    /// Bytes one message slot takes (whole 64-byte pattern blocks).
    pub fn slot(&self) -> u64 {
        u64::from(self.size).next_multiple_of(64).max(64)
    }

    /// Bytes of registered memory a QP needs.
    pub fn mem_size(&self) -> usize {
        (3 * self.slot() + 4096) as usize
    }

    /// The work request of message `n` (0, 1, 2, ...) of `op`.
    pub fn wr(&self, op: Op, n: u64, rkey: u32) -> WorkRequest {
        match op {
            Op::Write => WorkRequest::Write {
                remote_va: self.base + (n % 2) * self.slot(),
                rkey,
                len: self.size,
                imm: None,
            },
            Op::Read => WorkRequest::Read {
                remote_va: self.base + 2 * self.slot(),
                rkey,
                len: self.size,
            },
            // wait-send: the server's SENDs.
            Op::Send | Op::WaitSend => WorkRequest::Send {
                len: self.size,
                imm: None,
            },
            Op::Atomic => WorkRequest::FetchAdd {
                remote_va: self.base + 3 * self.slot() + (n % 64) * 8,
                rkey,
                add: 1,
            },
        }
    }
}

/// Per-QP workload state: what was posted and how it completed.
#[derive(Clone, Debug, Default)]
pub struct QpDriver {
    /// Work requests posted.
    pub posted: u64,
    /// Completed successfully, and their bytes.
    pub ok: u64,
    pub bytes: u64,
    /// Completed with an error status.
    pub failed: u64,
    /// The first failed completion.
    pub first_error: Option<Completion>,
    pub first_completion: Option<Time>,
    pub last_completion: Time,
    /// (wr_id, posted at) of outstanding WRs, when latency is tracked.
    inflight: VecDeque<(u64, Time)>,
    track_latency: bool,
}

impl QpDriver {
    /// A driver; with `track_latency`, [`Self::pump`] reports the time from
    /// posting to completion of every successful work request.
    pub fn new(track_latency: bool) -> QpDriver {
        QpDriver {
            track_latency,
            ..QpDriver::default()
        }
    }

    /// Completions seen (successful or not).
    pub fn done(&self) -> u64 {
        self.ok + self.failed
    }

    /// Posted and not completed.
    pub fn outstanding(&self) -> u64 {
        self.posted.saturating_sub(self.done())
    }

    pub fn has_failed(&self) -> bool {
        self.failed > 0
    }

    /// Takes `qp`'s completions (pushing latencies in ns into `lat`), then
    /// posts work requests from `next(n)` while fewer than `depth` are
    /// outstanding, fewer than `limit` were posted in all, and nothing
    /// failed. Returns whether anything happened.
    pub fn pump(
        &mut self,
        qp: &mut RcQp,
        now: Time,
        depth: u64,
        limit: u64,
        mut next: impl FnMut(u64) -> WorkRequest,
        lat: &mut Vec<u64>,
    ) -> bool {
        let mut moved = false;
        while let Some(c) = qp.poll_completion() {
            moved = true;
            let posted_at = if self.track_latency {
                // RC completes in posting order; be robust anyway.
                let mut at = None;
                while let Some((id, t)) = self.inflight.pop_front() {
                    if id == c.wr_id {
                        at = Some(t);
                        break;
                    }
                }
                at
            } else {
                None
            };
            if c.status == CompletionStatus::Success {
                self.ok += 1;
                self.bytes += u64::from(c.bytes);
                self.first_completion.get_or_insert(c.at);
                self.last_completion = self.last_completion.max(c.at);
                if let Some(t) = posted_at {
                    lat.push((c.at - t).as_nanos() as u64);
                }
            } else {
                self.failed += 1;
                self.first_error.get_or_insert(c);
            }
        }
        while !self.has_failed()
            && !qp.is_error()
            && self.posted < limit
            && self.outstanding() < depth
        {
            let Ok(id) = qp.post_send(next(self.posted)) else {
                break;
            };
            if self.track_latency {
                self.inflight.push_back((id, now));
            }
            self.posted += 1;
            moved = true;
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rc::{QpAddr, QpConfig};
    use soya_proto::roce::Psn;

    #[test]
    fn layout_matches_the_simulator() {
        let l = Layout::new(0x10_0000, 65_536);
        assert_eq!(l.slot(), 65_536);
        assert_eq!(l.mem_size(), 3 * 65_536 + 4096);
        assert_eq!(Layout::new(0, 1).slot(), 64);
        let WorkRequest::Write { remote_va, .. } = l.wr(Op::Write, 3, 7) else {
            panic!()
        };
        assert_eq!(remote_va, 0x10_0000 + 65_536);
        let WorkRequest::Read { remote_va, .. } = l.wr(Op::Read, 3, 7) else {
            panic!()
        };
        assert_eq!(remote_va, 0x10_0000 + 2 * 65_536);
    }

    /// Two QPs wired back to back: the driver posts exactly `limit` WRs,
    /// never more than `depth` at once, and accounts for every completion.
    #[test]
    fn driver_keeps_depth_and_limit() {
        let l = Layout::new(0x10_0000, 8192);
        let cfg = QpConfig {
            mem_base: l.base,
            mem_size: l.mem_size(),
            rkey: Some(0x77),
            ..QpConfig::default()
        };
        let a = QpAddr {
            ip: "10.0.0.1".parse().unwrap(),
            qpn: 0x11,
        };
        let b = QpAddr {
            ip: "10.0.0.2".parse().unwrap(),
            qpn: 0x12,
        };
        let mut qa = RcQp::new(cfg.clone(), a, b, Psn::new(5), Psn::new(9)).unwrap();
        let mut qb = RcQp::new(cfg, b, a, Psn::new(9), Psn::new(5)).unwrap();
        let mut d = QpDriver::new(true);
        let mut lat = Vec::new();
        let mut buf = vec![0u8; qa.max_packet_len()];
        let mut now = Time::ZERO;
        for _ in 0..10_000 {
            now += std::time::Duration::from_micros(1);
            d.pump(&mut qa, now, 4, 25, |n| l.wr(Op::Write, n, 0x77), &mut lat);
            assert!(d.outstanding() <= 4);
            while let Some(n) = qa.poll_transmit(now, &mut buf) {
                qb.handle_packet(now, &buf[..n]);
            }
            while let Some(n) = qb.poll_transmit(now, &mut buf) {
                qa.handle_packet(now, &buf[..n]);
            }
            if d.done() == 25 {
                break;
            }
        }
        assert_eq!((d.posted, d.ok, d.failed), (25, 25, 0));
        assert_eq!(d.bytes, 25 * 8192);
        assert_eq!(lat.len(), 25);
        assert_eq!(qb.memory().stats().writes_placed, 25);
        assert_eq!(qb.stats().data_errors, 0);
    }
}
