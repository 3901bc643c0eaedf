//! The egress role's timers: when silence from the responder is a loss and
//! when it is only a stall or a twin a WAN round trip away. RTO floor and
//! exponential back-off, the tail probe, give-up as a time without progress
//! (and for RNR NAKs alone), the site config that sets them, and what a
//! timeout may resend (the oldest packet, never the flight a later answer
//! shows received). Apart from `tests_egress` because these are the rules a
//! spurious-retransmission hunt reads, and they need their own time lines.

use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::{EngineConfig, Output, QpEngine};
use super::tests::{
    cfg, delivered, drain, edge_engine, errors, feed, injected, request, response, run_timers,
    sent_with_ack_req, InOrderResponder,
};
use super::tests_twin::twin_request;
use crate::roce::{Opcode, Syndrome};
use crate::time::Time;

/// A long READ's response may take longer than the egress RTO to stream
/// back; every response packet is progress (as for rxe's own requester), so
/// the READ is not re-requested, and the budget is not spent, while it flows.
#[test]
fn egress_does_not_time_out_a_read_whose_response_is_streaming() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let mut t = Time::from_micros(1);
    twin_request(
        &mut e,
        t,
        request(Opcode::RC_READ_REQUEST, 10, true, 0, 64 * 1024),
    );
    assert_eq!(drain(&mut e).len(), 1);
    let rto = e.poll_timeout().expect("the READ is timed").since(t);
    for i in 0..40u32 {
        // One response packet every half RTO: the whole answer takes 20 RTOs.
        t += rto / 2;
        let op = if i == 0 {
            Opcode::RC_READ_RESPONSE_FIRST
        } else {
            Opcode::RC_READ_RESPONSE_MIDDLE
        };
        e.handle_dc(t, &response(op, 10 + i, Syndrome::ACK_UNLIMITED, 1024));
        e.handle_timeout(t);
        let resent = drain(&mut e)
            .iter()
            .filter(|o| matches!(o, Output::Dc(_)))
            .count();
        assert_eq!(
            resent, 0,
            "READ re-requested while its response streams (packet {i})"
        );
    }
}

#[test]
fn egress_timeouts_back_off_exponentially_up_to_the_ceiling() {
    let (mut e, t) = edge_engine();
    twin_request(&mut e, t, request(Opcode::RC_SEND_ONLY, 10, true, 8, 0));
    drain(&mut e);
    let mut now = t;
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let next = e.poll_timeout().unwrap();
        gaps.push(next - now);
        now = next;
        e.handle_timeout(now);
        assert_eq!(injected(&drain(&mut e)), vec![10]);
    }
    let tuning = EngineConfig::default().egress;
    let floor = tuning.min_rto;
    assert_eq!(
        gaps,
        vec![floor, floor * 2, floor * 4, tuning.max_rto, tuning.max_rto],
        "each consecutive timeout doubles the wait, up to the ceiling"
    );
}

/// A WRITE's middle packets sent while the requester's AckReq (on the
/// previous message's end) was outstanding are covered by no request once
/// its ACK is in. The twin's next packets, a WAN round trip away, ask for
/// them: timing them out at the local RTO (µs) meant resending packets the
/// responder had (rxe: `duplicate_request` by the thousand).
#[test]
fn egress_does_not_resend_a_tail_while_the_twins_next_packet_is_a_wan_rtt_away() {
    let (mut e, t) = edge_engine();
    let sent = feed(
        &mut e,
        t,
        &[
            (10, Opcode::RC_SEND_ONLY, true),
            (11, Opcode::RC_WRITE_FIRST, false),
            (12, Opcode::RC_WRITE_MIDDLE, false),
            (13, Opcode::RC_WRITE_MIDDLE, false),
        ],
    );
    assert_eq!(
        sent,
        vec![(10, true), (11, false), (12, false), (13, false)],
        "one request for an ACK at a time"
    );
    // The responder (10 µs away) answers the only packet that asked.
    let t1 = t + Duration::from_micros(10);
    e.handle_dc(
        t1,
        &response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![10]);
    // A 30 ms WAN round trip later the rest of the WRITE arrives.
    let t2 = t1 + Duration::from_millis(30);
    let quiet = run_timers(&mut e, t2);
    assert!(
        injected(&quiet).is_empty(),
        "resent while waiting for the twin: {quiet:?}"
    );
    let sent = feed(&mut e, t2, &[(14, Opcode::RC_WRITE_LAST, true)]);
    assert_eq!(sent, vec![(14, true)]);
    e.handle_dc(
        t2 + Duration::from_micros(10),
        &response(Opcode::RC_ACK, 14, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![14]);
    let eg = e.egress_halves().next().unwrap();
    assert_eq!(
        (
            eg.stats.retransmitted,
            eg.stats.timeouts,
            eg.stats.tail_probes
        ),
        (0, 0, 0)
    );
}

/// ...and if the twin's next packet never comes, the last packet in flight
/// is resent once, asking for an ACK, after `tail_probe`: not the whole
/// tail at the local RTO.
#[test]
fn egress_probes_an_uncovered_tail_once_after_tail_probe() {
    let (mut e, t) = edge_engine();
    feed(
        &mut e,
        t,
        &[
            (10, Opcode::RC_SEND_ONLY, true),
            (11, Opcode::RC_WRITE_FIRST, false),
            (12, Opcode::RC_WRITE_MIDDLE, false),
        ],
    );
    let t1 = t + Duration::from_micros(10);
    e.handle_dc(
        t1,
        &response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0),
    );
    drain(&mut e);
    let probe_at = t1 + EngineConfig::default().egress.tail_probe;
    let before = run_timers(
        &mut e,
        t1 + (EngineConfig::default().egress.tail_probe - Duration::from_micros(1)),
    );
    assert!(injected(&before).is_empty(), "{before:?}");
    let out = run_timers(&mut e, probe_at);
    assert_eq!(sent_with_ack_req(&out), vec![(12, true)], "one probe");
    // The responder had both: its re-ACK says so.
    e.handle_dc(
        probe_at,
        &response(Opcode::RC_ACK, 12, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![12]);
    assert_eq!(e.occupancy().slots_used, 0);
    assert_eq!(e.egress_halves().next().unwrap().stats.tail_probes, 1);
}

/// The RTO comes from the measured local RTT but never below the floor: a
/// responder answering in 10 µs does not make a 40 µs stall a loss.
#[test]
fn egress_rto_has_a_floor_above_the_measured_local_rtt() {
    assert!(
        EngineConfig::default().egress.min_rto >= Duration::from_millis(10),
        "a lossless DC: the default floor is a responder stall, not a µs RTT"
    );
    for floor in [
        EngineConfig::default().egress.min_rto,
        Duration::from_millis(5),
    ] {
        let mut c = cfg(AckPolicy::Edge);
        c.egress.min_rto = floor;
        let mut e = QpEngine::new(c);
        let t = Time::from_micros(1);
        for i in 0..20u32 {
            let at = t + Duration::from_micros(u64::from(i) * 100);
            feed(&mut e, at, &[(10 + i, Opcode::RC_SEND_ONLY, true)]);
            let ack = response(Opcode::RC_ACK, 10 + i, Syndrome::ACK_UNLIMITED, 0);
            e.handle_dc(at + Duration::from_micros(10), &ack);
            drain(&mut e);
        }
        let at = t + Duration::from_millis(3);
        feed(&mut e, at, &[(30, Opcode::RC_SEND_ONLY, true)]);
        let rto = e.poll_timeout().expect("timed").since(at);
        assert_eq!(rto, floor, "RTO with a 10 µs measured RTT");
    }
}

/// A responder that stalls (a software responder descheduled, a PFC
/// storm) for longer than 16 back-offs is not dead: rxe's own requester
/// would still be waiting. Each timeout resends only the oldest packet, and
/// the flow continues when the responder does.
#[test]
fn egress_survives_a_responder_stall_of_two_seconds() {
    let (mut e, t) = edge_engine();
    let burst: Vec<(u32, Opcode, bool)> = (10..42)
        .map(|psn| (psn, Opcode::RC_SEND_ONLY, psn % 8 == 0))
        .collect();
    assert_eq!(feed(&mut e, t, &burst).len(), 32);
    let until = t + Duration::from_secs(2);
    let out = run_timers(&mut e, until);
    assert_eq!(errors(&out), 0, "gave up on a stalled responder");
    let resent = injected(&out);
    let eg = e.egress_halves().next().unwrap();
    assert!(eg.stats.timeouts >= 8, "{:?}", eg.stats);
    assert_eq!(
        resent,
        vec![10; eg.stats.timeouts as usize],
        "each timeout resends the oldest packet alone"
    );
    // The responder wakes up with everything received: its answer to the
    // resent packet (a duplicate) carries how far it got.
    e.handle_dc(
        until,
        &response(Opcode::RC_ACK, 41, Syndrome::ACK_UNLIMITED, 0),
    );
    let out = drain(&mut e);
    assert_eq!(delivered(&out), vec![41]);
    assert_eq!(e.occupancy().slots_used, 0);
}

/// Give-up is a time without progress, not a count of timeouts: a dead
/// responder fails the flow after `give_up`, not before.
#[test]
fn egress_gives_up_after_the_give_up_time_without_progress() {
    let mut c = cfg(AckPolicy::Edge);
    c.egress.give_up = Duration::from_secs(1);
    let mut e = QpEngine::new(c);
    let t = Time::from_micros(1);
    feed(&mut e, t, &[(10, Opcode::RC_SEND_ONLY, true)]);
    // Progress at 0.5 s restarts the clock.
    let half = t + Duration::from_millis(500);
    let out = run_timers(&mut e, half);
    assert_eq!(errors(&out), 0);
    e.handle_dc(
        half,
        &response(Opcode::RC_ACK, 10, Syndrome::ACK_UNLIMITED, 0),
    );
    feed(&mut e, half, &[(11, Opcode::RC_SEND_ONLY, true)]);
    let out = run_timers(&mut e, half + Duration::from_millis(999));
    assert_eq!(errors(&out), 0, "gave up before 1 s without progress");
    let out = run_timers(
        &mut e,
        half + Duration::from_millis(1000) + c.egress.max_rto,
    );
    assert_eq!(errors(&out), 1, "gave up within one RTO after 1 s");
    assert_eq!(e.egress_halves().next().unwrap().stats.gave_up, 1);
    assert_eq!(e.occupancy().slots_used, 0);
}

/// A responder whose receive queue stays empty answers every resend with an
/// RNR NAK. Under RDMA-CM's `min_rnr_timer` of 0 each NAK asks for 655 ms:
/// a budget counted in NAKs (1,000) held the buffer for 11 minutes and the
/// pseudo-ACKed requester never heard (issue 18, sweep seed 289). The
/// budget is a time: the flow fails once RNR NAKs alone have lasted
/// `rnr_give_up`, and not before.
#[test]
fn egress_gives_up_on_rnr_naks_after_rnr_give_up() {
    let c = cfg(AckPolicy::Edge);
    let give_up = c.egress.rnr_give_up;
    let mut e = QpEngine::new(c);
    let t0 = Time::from_micros(1);
    feed(&mut e, t0, &[(10, Opcode::RC_SEND_ONLY, true)]);
    let mut now = t0;
    let mut naks = 0u32;
    let failed_at = loop {
        // RNR NAK, timer 0 = 655.36 ms; then the engine resends when it ends.
        e.handle_dc(
            now,
            &response(Opcode::RC_ACK, 10, Syndrome::RnrNak { timer: 0 }, 0),
        );
        naks += 1;
        let out = drain(&mut e);
        if errors(&out) > 0 {
            break now;
        }
        assert!(naks < 1000, "still retrying after {naks} RNR NAKs");
        now = e.poll_timeout().expect("an RNR wait");
        e.handle_timeout(now);
        let out = drain(&mut e);
        assert_eq!(errors(&out), 0, "failed on a timer, not on an RNR NAK");
    };
    let lasted = failed_at.since(t0);
    assert!(
        lasted >= give_up,
        "gave up after {lasted:?} of RNR NAKs, before rnr_give_up {give_up:?}"
    );
    assert!(
        lasted < give_up + Duration::from_millis(700),
        "gave up after {lasted:?}: more than one RNR wait past {give_up:?}"
    );
    assert_eq!(e.egress_halves().next().unwrap().stats.gave_up, 1);
    assert_eq!(e.occupancy().slots_used, 0, "the buffer is freed");
}

#[test]
fn site_config_sets_the_egress_timers() {
    let text = r#"site = "t"
[dc]
local_prefixes = ["10.1.0.0/16"]
remote_prefixes = ["10.2.0.0/16"]
retransmit_floor = "5ms"
give_up_after = "2s"
[wan]
insecure = true
[[wan.paths]]
name = "p0"
remote = "192.0.2.1:7400"
rtt = "30ms"
[buffer]
size = "64MiB"
"#;
    let site = soya_config::parse_str(text, "t.toml").unwrap();
    let e = EngineConfig::from_site(&site).egress;
    assert_eq!(
        (e.min_rto, e.give_up, e.tail_probe),
        (
            Duration::from_millis(5),
            Duration::from_secs(2),
            Duration::from_millis(120)
        ),
        "the tail probe waits 4 WAN round trips"
    );
}

/// An egress engine whose injection window has grown to 128: a first
/// 64-packet WRITE (PSNs 936..=999) went out whole and was acknowledged at
/// once. Returns it and the time of all that.
fn warmed_egress() -> (QpEngine, Time) {
    let (mut e, t) = edge_engine();
    let warm: Vec<(u32, Opcode, bool)> = (936..1000u32)
        .map(|psn| (psn, Opcode::RC_WRITE_MIDDLE, psn == 999))
        .collect();
    assert_eq!(feed(&mut e, t, &warm).len(), 64);
    e.handle_dc(
        t,
        &response(Opcode::RC_ACK, 999, Syndrome::ACK_UNLIMITED, 0),
    );
    drain(&mut e);
    (e, t)
}

/// A responder that stalls with packets queued (not lost): the timeout
/// resends the oldest packet; the responder's next answers cover more than
/// that one, so what was in flight stays in flight. Going back N here
/// resent everything behind the first ACK, duplicates the responder had
/// queued all along (seen against rxe at 300 ms RTT).
#[test]
fn egress_does_not_go_back_n_after_a_timeout_on_a_responder_that_only_stalled() {
    let (mut e, t0) = warmed_egress();
    // Two 64-packet WRITEs, AckReq on each last packet.
    let burst: Vec<(u32, Opcode, bool)> = (0..128u32)
        .map(|i| {
            let op = match i % 64 {
                0 => Opcode::RC_WRITE_FIRST,
                63 => Opcode::RC_WRITE_LAST,
                _ => Opcode::RC_WRITE_MIDDLE,
            };
            (1000 + i, op, i % 64 == 63)
        })
        .collect();
    let mut r = InOrderResponder::new(1000);
    r.queue.extend(feed(&mut e, t0, &burst));
    assert_eq!(r.queue.len(), 128);
    // The responder stalls 60 ms (past the 50 ms RTO), then works through
    // its queue at one packet per ms: ACKs for 1063 and 1127, and for the
    // resent head, a duplicate, the re-ACK of the last it executed.
    for ms in 0..400u64 {
        let now = t0 + Duration::from_millis(ms);
        if e.poll_timeout().is_some_and(|d| d <= now) {
            e.handle_timeout(now);
        }
        r.receive(&mut e);
        if ms >= 60 {
            r.execute_one(&mut e, now);
        }
    }
    r.receive(&mut e);
    let eg = e.egress_halves().next().unwrap();
    assert_eq!(r.expected, 1128, "{:?}", eg.stats);
    // The resent head (twice: its original's ACK, alone, cannot tell a
    // stall from a loss) and what one ACK let out before the responder's
    // next answer showed it had everything; not the 64 packets behind it.
    assert!(
        r.duplicates <= 4 && eg.stats.retransmitted <= 4,
        "{} duplicates: {:?}",
        r.duplicates,
        eg.stats
    );
    assert_eq!(e.occupancy().slots_used, 0);
}

/// The discriminating step of the above: after a timeout resent the oldest
/// packet, an answer beyond it proves the responder has more than that
/// packet; the packets sent before the timeout behind the answer are still
/// in flight (queued at a slow responder), not lost, and are not resent.
#[test]
fn egress_keeps_in_flight_what_an_answer_past_the_resent_head_shows_received() {
    let (mut e, t0) = warmed_egress();
    let burst: Vec<(u32, Opcode, bool)> = (1000..1128u32)
        .map(|psn| (psn, Opcode::RC_WRITE_MIDDLE, psn == 1063 || psn == 1127))
        .collect();
    assert_eq!(feed(&mut e, t0, &burst).len(), 128);
    // Nothing for an RTO: the oldest packet goes again, asking.
    let rto = e.poll_timeout().unwrap();
    e.handle_timeout(rto);
    assert_eq!(sent_with_ack_req(&drain(&mut e)), vec![(1000, true)]);
    // The responder's answer to it: it had executed up to 1063 and is
    // still working through the rest.
    let t1 = rto + Duration::from_millis(5);
    e.handle_dc(
        t1,
        &response(Opcode::RC_ACK, 1063, Syndrome::ACK_UNLIMITED, 0),
    );
    let out = drain(&mut e);
    assert_eq!(delivered(&out), vec![1063]);
    assert!(
        injected(&out).is_empty(),
        "resent behind the answer: {:?}",
        injected(&out)
    );
    e.handle_dc(
        t1,
        &response(Opcode::RC_ACK, 1127, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![1127]);
    let eg = e.egress_halves().next().unwrap();
    assert_eq!((eg.stats.timeouts, eg.stats.retransmitted), (1, 1));
    assert_eq!(e.occupancy().slots_used, 0);
}
