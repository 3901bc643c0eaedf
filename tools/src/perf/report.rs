//! What a run measured: [`PerfReport`] (the `--json` object and the value
//! `run_client` / `run_server` return), latency percentiles, and the human
//! summary.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::workload::Op;
use super::Shape;
use crate::rc::QpStats;

/// Latency of successful work requests, post to completion, in µs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyReport {
    pub samples: u64,
    pub min_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p99_9_us: f64,
    pub max_us: f64,
}

impl LatencyReport {
    /// From samples in ns (sorted in place); `None` when there are none.
    pub fn from_nanos(samples: &mut [u64]) -> Option<LatencyReport> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let n = samples.len();
        let at = |q: f64| {
            // Nearest rank.
            let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
            samples[i] as f64 / 1e3
        };
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        Some(LatencyReport {
            samples: n as u64,
            min_us: samples[0] as f64 / 1e3,
            mean_us: sum as f64 / n as f64 / 1e3,
            p50_us: at(0.50),
            p90_us: at(0.90),
            p99_us: at(0.99),
            p99_9_us: at(0.999),
            max_us: samples[n - 1] as f64 / 1e3,
        })
    }
}

/// Packet-level counters summed over a side's QPs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketCounters {
    pub packets_sent: u64,
    pub packets_received: u64,
    pub requests_sent: u64,
    pub acks_received: u64,
    pub acks_sent: u64,
    pub read_responses_received: u64,
    pub responses_sent: u64,
    pub duplicate_requests: u64,
    pub seq_naks_sent: u64,
    pub rnr_naks_sent: u64,
    pub error_naks_sent: u64,
    pub retry_sequences: u64,
    pub timeouts: u64,
    pub implied_naks: u64,
    pub malformed_dropped: u64,
    pub misaddressed_dropped: u64,
    pub dropped_in_error: u64,
}

impl PacketCounters {
    pub fn add(&mut self, s: &QpStats) {
        self.packets_sent += s.packets_sent;
        self.packets_received += s.packets_received;
        self.requests_sent += s.requests_sent;
        self.acks_received += s.acks_received;
        self.acks_sent += s.acks_sent;
        self.read_responses_received += s.read_responses_received;
        self.responses_sent += s.responses_sent;
        self.duplicate_requests += s.duplicate_requests;
        self.seq_naks_sent += s.seq_errors_sent;
        self.rnr_naks_sent += s.rnr_naks_sent;
        self.error_naks_sent += s.error_naks_sent;
        self.retry_sequences += s.retry_sequences;
        self.timeouts += s.timeouts;
        self.implied_naks += s.implied_naks;
        self.malformed_dropped += s.malformed_dropped;
        self.misaddressed_dropped += s.misaddressed_dropped;
        self.dropped_in_error += s.dropped_in_error;
    }
}

/// Socket-level counters of one endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoCounters {
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    /// Datagrams the kernel refused to send (after retrying).
    pub send_failures: u64,
    /// Datagrams the kernel dropped for want of receive buffer (SO_RXQ_OVFL).
    pub kernel_rx_drops: u64,
    /// Datagrams for a QP this session does not have (e.g. an earlier one's).
    pub unknown_qp: u64,
    /// Too short for a BTH, truncated, or from another address family.
    pub bad_datagrams: u64,
    /// Receive buffer granted by the kernel, bytes.
    pub rcvbuf_bytes: u64,
}

/// The result of one run, one side. Serialised as the `--json` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PerfReport {
    /// "client" or "server".
    pub role: String,
    pub transport: String,
    pub op: Option<Op>,
    pub size: u32,
    pub qps: u32,
    pub tx_depth: u32,
    pub mtu: usize,
    pub local: String,
    pub peer: String,
    /// From the first post (client) or the accept (server) to the last
    /// completion (client) or the client's end (server).
    pub elapsed_s: f64,
    /// Client: work requests completed successfully. Server: WRITEs
    /// placed, SENDs received, READs served (bytes / size), atomics executed.
    pub messages: u64,
    /// Payload bytes of those messages.
    pub bytes: u64,
    /// Verified payload bytes over the run's whole length, in Gb/s: the
    /// server's bytes placed (or served) and checked, over the time until
    /// the last of them landed. At the client, for WRITE/SEND, that is the
    /// server's count over the longer of the two clocks (its run ends when
    /// every completed byte arrived); with no server report, 0.
    pub goodput_gbps: f64,
    /// Client only: payload bytes of successful completions over the time
    /// to the last one. Through a gateway that pseudo-ACKs, a completion
    /// says the data is held, not landed: this may exceed `goodput_gbps`
    /// and is never a goodput.
    #[serde(default)]
    pub completed_gbps: f64,
    pub msg_rate_mpps: f64,
    /// Work requests that completed with an error status.
    pub failed_completions: u64,
    /// Work requests posted that never completed (run cut short).
    pub incomplete: u64,
    /// Request packets sent again (go-back-N).
    pub retransmissions: u64,
    /// NAKs received (sequence + RNR + fatal).
    pub naks: u64,
    pub seq_naks: u64,
    pub rnrs: u64,
    pub fatal_naks: u64,
    /// All data errors found: this side's checks plus the peer's (client).
    pub data_errors: u64,
    pub local_data_errors: u64,
    /// The server's count, as it reported it (client only).
    pub remote_data_errors: Option<u64>,
    /// Payload bytes checked against the pattern here (and at the peer).
    pub bytes_verified: u64,
    /// WRITE/SEND bytes completed at the client that the server never
    /// placed (client only; a data error).
    pub bytes_lost: u64,
    pub latency: Option<LatencyReport>,
    pub packets: PacketCounters,
    pub io: IoCounters,
    /// What went wrong, if anything (first failure first).
    pub errors: Vec<String>,
    /// The first of `errors` when the run was not clean (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `--op wait-send`: when the first receive completed in error (or the
    /// QP was seen in the error state), in seconds since the Unix epoch, so
    /// that a test can tell how long after an event the application learned
    /// of it, whatever the client did afterwards (its summary exchange with
    /// the server may wait much longer when the path is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at_unix_s: Option<f64>,
    /// No data errors, no failed or missing completions, no errors.
    pub ok: bool,
    /// The server's own report (client only).
    pub server: Option<Box<PerfReport>>,
}

impl PerfReport {
    /// One side's report of a run of `shape`, before any figure is in.
    pub fn of(role: &str, transport: &str, shape: Shape) -> PerfReport {
        PerfReport {
            role: role.into(),
            transport: transport.into(),
            op: Some(shape.op),
            size: shape.size,
            qps: shape.qps,
            tx_depth: shape.tx_depth,
            mtu: shape.mtu,
            ..PerfReport::default()
        }
    }

    /// A client's `completed_gbps` and `goodput_gbps`, once its counts and
    /// the server's report are in. A READ's or atomic's completion, and a
    /// SEND received (`wait-send`), come with the data itself, checked
    /// here; a WRITE's or SEND's completion may be a gateway's pseudo-ACK,
    /// so those bytes count as the server verified them, over the server's
    /// run if longer (it lasts until every completed byte arrived). With
    /// no server report nothing of them is known to have landed: 0.
    pub fn set_client_goodput(&mut self) {
        let rate = |bytes: u64, secs: f64| {
            if secs > 0.0 {
                bytes as f64 * 8.0 / secs / 1e9
            } else {
                0.0
            }
        };
        self.completed_gbps = rate(self.bytes, self.elapsed_s);
        self.goodput_gbps = match (self.op, self.server.as_deref()) {
            (Some(Op::Write | Op::Send), Some(s)) => rate(
                self.bytes.min(s.bytes_verified),
                self.elapsed_s.max(s.elapsed_s),
            ),
            (Some(Op::Write | Op::Send), None) => 0.0,
            _ => self.completed_gbps,
        };
    }

    /// The human summary (several lines).
    pub fn human(&self) -> String {
        let mut s = String::new();
        let op = self.op.map_or("-", Op::name);
        let _ = writeln!(
            s,
            "soya-perf {} summary: {} {} B x {} QP, tx-depth {}, MTU {}, {} -> {}",
            self.role, op, self.size, self.qps, self.tx_depth, self.mtu, self.local, self.peer
        );
        let _ = writeln!(
            s,
            "  goodput      {:.3} Gb/s  ({:.3} Mmsg/s), {} messages, {} bytes in {:.3} s",
            self.goodput_gbps, self.msg_rate_mpps, self.messages, self.bytes, self.elapsed_s
        );
        if self.role == "client" {
            let _ = writeln!(
                s,
                "  completed    {:.3} Gb/s  as the completions told it (a pseudo-ACK completes before the data lands)",
                self.completed_gbps
            );
        }
        let _ = writeln!(
            s,
            "  recovery     {} retransmitted packets, {} NAKs ({} seq, {} RNR, {} fatal), {} timeouts",
            self.retransmissions,
            self.naks,
            self.seq_naks,
            self.rnrs,
            self.fatal_naks,
            self.packets.timeouts
        );
        let remote = self
            .remote_data_errors
            .map_or(String::new(), |r| format!(" (server: {r})"));
        let _ = writeln!(
            s,
            "  data         {} errors{}, {} bytes verified, {} bytes lost",
            self.data_errors, remote, self.bytes_verified, self.bytes_lost
        );
        let _ = writeln!(
            s,
            "  completions  {} failed, {} incomplete",
            self.failed_completions, self.incomplete
        );
        let _ = writeln!(
            s,
            "  io           {} datagrams sent, {} received, {} send failures, {} kernel rx drops, rcvbuf {} KiB",
            self.io.datagrams_sent,
            self.io.datagrams_received,
            self.io.send_failures,
            self.io.kernel_rx_drops,
            self.io.rcvbuf_bytes / 1024
        );
        if let Some(l) = &self.latency {
            let _ = writeln!(
                s,
                "  latency µs   min {:.1}  mean {:.1}  p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  ({} samples, post to completion)",
                l.min_us, l.mean_us, l.p50_us, l.p90_us, l.p99_us, l.p99_9_us, l.max_us, l.samples
            );
        }
        for e in &self.errors {
            let _ = writeln!(s, "  error        {e}");
        }
        let _ = writeln!(
            s,
            "  result       {}",
            if self.ok { "OK" } else { "FAILED" }
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let mut v: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let l = LatencyReport::from_nanos(&mut v).unwrap();
        assert_eq!(l.samples, 1000);
        // min, p50, p99, p99.9, max (µs): the samples at those ranks.
        assert_eq!(
            (l.min_us, l.p50_us, l.p99_us, l.p99_9_us, l.max_us),
            (1.0, 500.0, 990.0, 999.0, 1000.0)
        );
        assert!(LatencyReport::from_nanos(&mut []).is_none());
    }

    /// A WRITE run through a gateway: the completions (pseudo-ACKs) said
    /// 1 GB in 1 s, the server verified 0.5 GB by the end of its 2 s run.
    /// The goodput is what landed over the whole run; the completions'
    /// figure is kept apart. Without the server's word nothing counts.
    #[test]
    fn client_goodput_counts_what_the_server_verified_over_the_whole_run() {
        let shape = |op| Shape {
            op,
            size: 65536,
            qps: 1,
            tx_depth: 128,
            mtu: 4096,
        };
        let mut c = PerfReport::of("client", "udp", shape(Op::Write));
        c.bytes = 1_000_000_000;
        c.elapsed_s = 1.0;
        let mut s = PerfReport::of("server", "udp", shape(Op::Write));
        s.bytes_verified = 500_000_000;
        s.elapsed_s = 2.0;
        c.server = Some(Box::new(s));
        c.set_client_goodput();
        assert_eq!(c.completed_gbps, 8.0);
        assert_eq!(c.goodput_gbps, 2.0);
        c.server = None;
        c.set_client_goodput();
        assert_eq!(c.goodput_gbps, 0.0, "nothing verified, nothing counted");
        // A READ's completion brings its data: what completed landed.
        let mut r = PerfReport::of("client", "udp", shape(Op::Read));
        r.bytes = 1_000_000_000;
        r.elapsed_s = 1.0;
        r.set_client_goodput();
        assert_eq!(r.goodput_gbps, 8.0);
    }
}
