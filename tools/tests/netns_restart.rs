//! Restarting a gateway under verified soya-perf streams, in network
//! namespaces with real processes (the lab of `netns.rs`): `kill -9` of
//! either gateway and a new start, and a planned restart (SIGTERM, the
//! drain, CLOSE "restart", a new start) of each in turn, for WRITE, SEND
//! and READ (issue 35; docs/semantics.md, "Failure cases").
//!
//! Needs root, /dev/net/tun, `ip` and the `soya` binary beside `soya-perf`;
//! without them each test prints `skipped: needs ...` and passes, unless
//! `SOYA_REQUIRE_NETNS=1` (`.ci/run` sets it). No timing is asserted: each
//! step waits for what it needs (a counter, a status line), whatever the
//! machine's speed.

#![deny(unsafe_code)]

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use soya::gateway::Snapshot;
use soya_tools::perf::PerfReport;

mod common;

#[allow(dead_code)] // the lab's helpers that only netns.rs uses
#[path = "netns/lab.rs"]
mod lab;
use lab::*;

/// What a stream from hostA looks like at gwA once it is well under way,
/// by operation: WRITE and SEND leave data pseudo-ACKed in gwA's deep
/// buffer (what a far restart must resume and a near one loses); a READ
/// has gwA re-inject the responses toward hostA (its requests wait there
/// for them, never pseudo-ACKed).
#[derive(Clone, Copy, Debug)]
enum Op {
    Write,
    Send,
    Read,
}

impl Op {
    fn arg(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Send => "send",
            Op::Read => "read",
        }
    }

    /// A measure of the stream's progress at gwA that only grows.
    fn progress(self, s: &Snapshot) -> u64 {
        match self {
            Op::Write | Op::Send => pseudo_acks(s),
            Op::Read => s.dc.tx_packets,
        }
    }

    /// gwA is in the middle of it, past `since`: for WRITE/SEND holding at
    /// least `n` slots and pseudo-ACKing; for a READ, `n` more response
    /// packets re-injected.
    fn under_way(self, s: &Snapshot, n: u64, since: u64) -> bool {
        match self {
            Op::Write | Op::Send => s.buffer.slots_used >= n && self.progress(s) > since,
            Op::Read => self.progress(s) >= since + n,
        }
    }
}

/// A stream from hostA over a slow WAN (2 × 100 Mbit/s), well under way at
/// gwA (for WRITE/SEND: ≥ 1024 slots held pseudo-ACKed); then `kill -9` of
/// `victim` and a restart of it. Returns the client's report once it
/// ended, and both gateways' status.
fn kill_mid_transfer(
    test: &'static str,
    op: Op,
    victim: Site,
    stall_timeout: &str,
) -> Option<(PerfReport, ExitStatus, [Snapshot; 2], KillTimes)> {
    let mut lab = Lab::new(test, SLOW)?;
    let client = lab.spawn_client(&[
        "--op",
        op.arg(),
        "--duration",
        "30",
        "--stall-timeout",
        stall_timeout,
    ]);
    let held = lab.wait_for(Site::A, "the stream under way at gwA", |s| {
        op.under_way(s, 1024, 0)
    });
    let killed = unix_now();
    lab.kill_gateway(victim);
    std::thread::sleep(Duration::from_millis(300));
    lab.start_gateway(victim);
    let running = unix_now();
    let (r, status) = lab.finish_client(client, Duration::from_secs(60));
    let snaps = [lab.status(Site::A), lab.status(Site::B)];
    println!(
        "{test}: gwA held {} slots, {} packets toward hostA, when gw{victim:?} was killed; \
         client: ok {} (exit {status}), {} B completed, {} B lost, {} failed / {} incomplete \
         work requests, errors {:?}",
        held.buffer.slots_used,
        held.dc.tx_packets,
        r.ok,
        r.bytes,
        r.bytes_lost,
        r.failed_completions,
        r.incomplete,
        r.errors
    );
    Some((r, status, snaps, KillTimes { killed, running }))
}

/// When a gateway was killed and when its new incarnation answered its
/// control socket as running (seconds since the Unix epoch, as soya-perf's
/// `failed_at_unix_s`).
struct KillTimes {
    killed: f64,
    running: f64,
}

/// `kill -9` of the far gateway (gwB, re-injecting toward the responder)
/// mid-stream, then a restart: gwA sees the new generation and, since
/// issue 35, resumes the flow instead of failing it: it sends the new gwB
/// every request not yet reported delivered, in PSN order, and the new gwB
/// re-learns the QP from them and re-injects them. What reaches the
/// responder twice is an RC duplicate: a WRITE or SEND is acknowledged
/// again and not placed again, a READ is executed again (idempotent). The
/// stream must end as if nothing happened: every byte verified at its
/// receiver, no error completion (docs/semantics.md, "When the far gateway
/// restarts: resume"). Before, the flow failed and the requester got a
/// remote operational error.
fn far_kill_resumes(test: &'static str, op: Op) {
    let Some((r, status, [a, _b], _)) = kill_mid_transfer(test, op, Site::B, "20") else {
        return;
    };
    println!("{test}: gwA engine {:?}\ngwA twin {:?}", a.engine, a.twin);
    assert_clean(&r, status, test);
    assert!(a.wan.peer_restarts >= 1, "{:?}", a.wan);
    assert_eq!(a.twin.flows_failed_on_restart, 0, "{:?}", a.twin);
    assert!(a.engine.halves_resumed >= 1, "{:?}", a.engine);
    println!(
        "{test}: {} B verified, {} packets sent again on resume",
        r.bytes_verified, a.engine.packets_resent_on_resume
    );
}

#[test]
fn killing_the_far_gateway_resumes_the_requester_qp() {
    far_kill_resumes(
        "killing_the_far_gateway_resumes_the_requester_qp",
        Op::Write,
    );
}

#[test]
fn killing_the_far_gateway_resumes_a_send_stream() {
    far_kill_resumes("killing_the_far_gateway_resumes_a_send_stream", Op::Send);
}

#[test]
fn killing_the_far_gateway_resumes_a_read_stream() {
    far_kill_resumes("killing_the_far_gateway_resumes_a_read_stream", Op::Read);
}

/// `kill -9` of the near gateway (gwA, which pseudo-ACKed) mid-transfer,
/// then a restart: what it held is gone (docs/semantics.md, "the near
/// gateway crashes"). gwB sees the new generation, fails its side, and tells
/// the new gwA which QPs at its site it had pseudo-ACKed
/// (`TwinMsg::Orphaned`). This client's QP has WRITEs outstanding and
/// retransmits them through the new gwA; its QP never received a request
/// (out-of-band setup, WRITEs one way), so gwB knows its number but not its
/// expected PSN. The new gwA moves it to error either way: a NAK at the
/// PSN its retries start from, once seen twice (`qp::orphan`), or a probe
/// of its responder role then the poison. The client must end with an
/// error completion, never a stall of its own: its stall timeout (20 s) is
/// far above the bound docs/semantics.md states (the restart, a WAN
/// handshake, then two of its 67 ms ACK timeouts). Never a silent success.
///
/// Before the orphaned-requester NAK the test accepted a stall: in ~1 run
/// of 6 the client (then with a 2 s stall timeout) stalled and gwA counted
/// the QP unattributable, its probes unanswered.
#[test]
fn killing_the_near_gateway_fails_the_requester_qp() {
    let test = "killing_the_near_gateway_fails_the_requester_qp";
    let Some((r, status, [a, b], t)) = kill_mid_transfer(test, Op::Write, Site::A, "20") else {
        return;
    };
    let failed_at = r.failed_at_unix_s;
    println!(
        "{test}: error completion {:?} s after the kill, {:?} s after the new gwA ran \
         (restart took {:.3} s); gwA engine after the restart {:?}",
        failed_at.map(|f| f - t.killed),
        failed_at.map(|f| f - t.running),
        t.running - t.killed,
        a.engine
    );
    assert!(!r.ok && !status.success(), "silent success: {r:#?}");
    assert!(r.bytes_lost > 0, "{r:#?}");
    assert!(
        r.failed_completions >= 1
            && r.errors.iter().any(|e| {
                e.contains("remote operational error")
                    || e.contains("error state")
                    || e.contains("flush")
            }),
        "an error completion, not a stall: {:?}",
        r.errors
    );
    assert!(
        !r.errors.iter().any(|e| e.contains("stalled")),
        "{:?}",
        r.errors
    );
    let failed_at = failed_at.expect("the client saw a failure");
    assert!(failed_at > t.killed, "{failed_at} <= {}", t.killed);
    assert!(
        a.engine.orphan_requesters_failed
            + a.engine.qps_poisoned_after_probe
            + a.engine.orphan_qps_poisoned
            >= 1,
        "{:?}",
        a.engine
    );
    assert_eq!(r.remote_data_errors, Some(0), "corrupt data at the server");
    assert!(b.wan.peer_restarts >= 1, "{:?}", b.wan);
}

/// A planned restart of each gateway in turn (`systemctl restart`:
/// SIGTERM, a drain, CLOSE "restart", a new process with the same config)
/// during a verified stream over a slow WAN, each time with the stream
/// under way through that incarnation (for WRITE/SEND: gwA holding
/// pseudo-ACKed data): the twin keeps every flow for the next start, and
/// the stream ends as if nothing happened: every byte verified at its
/// receiver, no error completion (docs/semantics.md, "A planned restart").
/// Before, the CLOSE made the twin fail the QP. Prints the pause the
/// survivor measured (docs/operations.md states its spread).
fn planned_restarts_fail_nothing(test: &'static str, op: Op) {
    let Some(mut lab) = Lab::new(test, SLOW) else {
        return;
    };
    // Posts until told to stop (once both restarts are done).
    let (client, stop) =
        lab.spawn_client_until_stopped(&["--op", op.arg(), "--stall-timeout", "20"]);
    let mut survivors = Vec::new();
    for victim in [Site::A, Site::B] {
        // The stream under way through this incarnation of gwA.
        let since = op.progress(&lab.status(Site::A));
        lab.wait_for(Site::A, "the stream under way at gwA", |s| {
            op.under_way(s, 256, since)
        });
        let t0 = Instant::now();
        let summary = lab.stop_gateway(victim);
        let stopped = t0.elapsed();
        assert!(summary.contains("drained cleanly"), "{summary}");
        let survivor = victim.other();
        let s = lab.wait_for(survivor, "the CLOSE \"restart\" heard", |s| {
            s.twin.twin_restarts_clean >= 1
        });
        lab.start_gateway(victim);
        let started = t0.elapsed();
        // The survivor measures the pause: its CLOSE "restart" to the next
        // incarnation's session.
        let back = lab.wait_for(survivor, "the next incarnation's session", |s| {
            s.twin.twin_returns >= 1
        });
        println!(
            "{test}: gw{victim:?} drained and exited {stopped:?} after SIGTERM, running again \
             {started:?} after it; gw{survivor:?} kept {} flows (failed {}), paused {:.1} ms",
            s.twin.flows_resumed_on_restart,
            s.twin.flows_failed_on_restart,
            back.twin.restart_pause_last_us as f64 / 1e3
        );
        assert!(back.twin.restart_pause_last_us > 0, "{:?}", back.twin);
        survivors.push(s);
    }
    // The stream through both new incarnations, then stop.
    let since = op.progress(&lab.status(Site::A));
    lab.wait_for(Site::A, "the stream through the new gateways", |s| {
        op.progress(s) > since
    });
    stop.stop();
    let (r, status) = lab.finish_client(client, Duration::from_secs(120));
    println!(
        "{test}: {} B verified, errors {:?}",
        r.bytes_verified, r.errors
    );
    assert_clean(&r, status, test);
    for s in &survivors {
        assert_eq!(s.twin.flows_failed_on_restart, 0, "{:?}", s.twin);
        assert_eq!(s.twin.twin_lost, 0, "{:?}", s.twin);
    }
    let a = lab.status(Site::A);
    assert!(
        a.twin.twin_restarts_clean >= 1 && a.twin.flows_resumed_on_restart >= 1,
        "the new gwA kept and resumed its flow when gwB restarted: {:?}",
        a.twin
    );
}

#[test]
fn a_planned_restart_of_either_gateway_fails_nothing() {
    planned_restarts_fail_nothing(
        "a_planned_restart_of_either_gateway_fails_nothing",
        Op::Write,
    );
}

#[test]
fn a_planned_restart_of_either_gateway_fails_no_send() {
    planned_restarts_fail_nothing(
        "a_planned_restart_of_either_gateway_fails_no_send",
        Op::Send,
    );
}

#[test]
fn a_planned_restart_of_either_gateway_fails_no_read() {
    planned_restarts_fail_nothing(
        "a_planned_restart_of_either_gateway_fails_no_read",
        Op::Read,
    );
}
