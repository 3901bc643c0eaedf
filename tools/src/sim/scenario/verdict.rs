//! Judging a run's end state: every invariant a scenario must hold (nothing
//! acknowledged and lost, never silently; no gateway giving up with nothing
//! injected; no head of line behind a stalled QP; buffers back to zero),
//! and the figures the [`Outcome`] reports.

use soya_proto::site::Site;
use soya_proto::time::Time;

use super::super::world::World;
use super::{Op, Outcome, Scenario};
use crate::rc::hw::EndpointModel;

/// The QPs beside a stalled one must not wait behind it: their data lands
/// before the gateway gives up on the stalled one (its RNR budget takes
/// well over half a second; they need milliseconds). Waiting behind it,
/// they would land only once it failed, or never.
pub(super) fn check_no_head_of_line(
    landed: Option<Time>,
    stall_failed: Option<(Time, bool)>,
    out: &mut Outcome,
) {
    match (landed, stall_failed) {
        (Some(l), Some((f, true))) if l > f => out.violations.push(format!(
            "head of line: the QPs beside the stalled one landed at {l:?}, after it failed at {f:?}"
        )),
        (Some(_), _) => {}
        (None, _) => out
            .violations
            .push("head of line: the QPs beside the stalled one never landed".into()),
    }
}

/// `end`: when the workload ended, or `None` when it did not (stopped at
/// `stopped`).
/// The QPs share the WAN (`Scenario::fair_share`): while the gateway
/// pushed back (from when what it held as the buffer first filled had
/// crossed the WAN, to when the first QP's transfer was over), every QP
/// landed at least `min` of an equal share of what all of them landed
/// (`shares`: bytes per QP in that time; empty: no such time, the first
/// transfer ended before; `None`: no QP's transfer ever ended, which the
/// run's other verdicts report).
///
/// Judged only over a span in which an equal share is at least
/// [`FAIR_SPAN_WINDOWS`] requester windows (`window_bytes`): the gateway
/// shares the WAN in turns, each a pseudo-ACK that lets a requester send
/// its window, so what a QP lands in a span is whole windows give or take
/// one at either end of it. Over a shorter span that error alone is more
/// than half an equal share: a QP whose turn fell just outside it looks
/// starved, another's looks doubled. Such a run is counted apart
/// (`Outcome::fair_span_short`), not judged either way.
pub(super) fn check_fair_share(
    shares: Option<&[u64]>,
    min: f64,
    window_bytes: u64,
    out: &mut Outcome,
) {
    let Some(shares) = shares.filter(|s| !s.is_empty()) else {
        return;
    };
    let equal = shares.iter().sum::<u64>() as f64 / shares.len() as f64;
    if equal == 0.0 {
        return;
    }
    if equal < (FAIR_SPAN_WINDOWS * window_bytes) as f64 {
        out.fair_span_short = true;
        return;
    }
    let (worst, least) = shares
        .iter()
        .enumerate()
        .min_by_key(|(_, &b)| b)
        .map(|(i, &b)| (i, b))
        .unwrap_or((0, 0));
    let share = least as f64 / equal;
    out.min_share = Some(share);
    if share < min {
        out.unfair = Some(format!(
            "unfair: while the gateway pushed back, QP {worst} landed {least} B, {share:.2} \
             of an equal share ({equal:.0} B, {:.1} windows; at least {min} required); \
             per QP: {shares:?}",
            equal / window_bytes as f64
        ));
    }
}

/// The shortest span, in requester windows per QP, over which the QPs'
/// shares are judged ([`check_fair_share`]): with a window's error at
/// either end, four windows keep it within half an equal share.
pub const FAIR_SPAN_WINDOWS: u64 = 4;

pub(super) fn finish(
    s: &Scenario,
    w: &World,
    start: Time,
    end: Option<Time>,
    stopped: Time,
    out: &mut Outcome,
) {
    out.events = w.events;
    out.finished = end.is_some();
    out.standby_mirrored_bytes = w.mirrored_bytes();
    if let Some(st) = w.standby_stats {
        out.standby_mirrored = Some(st.mirrored);
        out.standby_resent = Some(st.resent_at_takeover);
        out.standby_lost_on_mirror = Some(st.lost_on_the_mirror);
        out.lost_while_taking_over = Some(w.lost_while_dead);
    }
    if w.nonces_reused > 0 {
        out.violations.push(format!(
            "gateway B received {} WAN packets whose nonce (key phase, path, packet number) \
             had come before over other bytes",
            w.nonces_reused
        ));
    }
    out.elapsed_s = (end.unwrap_or(stopped) - start).as_secs_f64();
    let mut completed_write_bytes = 0u64;
    let mut placed_bytes = 0u64;
    // Bytes landed in messages too short to carry the pattern's sequence
    // number (a 1-byte SEND): nothing to check them against.
    let mut too_short = 0u64;
    for (req_host, resp_host) in [(&w.host_a, &w.host_b), (&w.host_b, &w.host_a)] {
        for (qa, qb) in req_host.qps.iter().zip(resp_host.qps.iter()) {
            let st = qa.stats();
            out.requester_retransmissions += st.retransmitted_packets;
            out.requester_timeouts += st.timeouts;
            out.requester_timeouts_after_ack += st.timeouts_after_ack;
            out.implied_naks += st.implied_naks;
            out.data_errors += st.data_errors;
            let mem = qb.memory().stats();
            out.bytes_verified += mem.bytes_verified;
            too_short += mem.bytes_unverified;
            out.data_errors += mem.data_errors;
            placed_bytes += mem.bytes_placed + mem.send_bytes_received;
            completed_write_bytes += st.bytes_completed_writes_sends();
        }
    }
    // Verified bytes over the whole run, and only for a run that ended.
    out.goodput_gbps = (out.finished && out.elapsed_s > 0.0)
        .then(|| out.bytes_verified as f64 * 8.0 / out.elapsed_s / 1e9);
    let errors_injected: u64 = w
        .engines()
        .map(|g| g.ingress_totals().errors_injected)
        .sum();
    // A far gateway's restart is resumed (issue 35): it fails nothing,
    // unless a QP had requests both ways (documented unresumable: the far
    // gateway had pseudo-ACKed the other way's). A near one's fails its
    // flows, never silently.
    // A planned restart that drained clean fails nothing, on either side
    // (issue 35); one whose drain timed out said a final CLOSE and counts
    // as a crash of that gateway.
    let crash = s.twin_restart.is_some() && (!s.planned_restart || out.restart_clean != Some(true));
    // A gateway with a standby (issue 38) dies and its standby takes
    // over: nothing it pseudo-ACKed is lost, nothing may fail.
    let taken_over = crash && s.standby.is_some();
    let near_restart = crash && s.restart_near && !taken_over;
    let far_restart = crash && !s.restart_near && !taken_over;
    let planned_clean = s.twin_restart.is_some() && !crash;
    let expect_failures = s.responder_error
        || (s.recv_refill.is_none() && s.recv_credits.is_some_and(|r| r < s.iters))
        || near_restart
        || (far_restart && s.bidirectional)
        || s.stall_qp0;
    // Every byte the applications were told of checked against its
    // pattern (atomics carry none to check, nor do messages too short for
    // its sequence number).
    let verifiable = matches!(s.op, Op::Write | Op::Send | Op::Read);
    if (far_restart || planned_clean || taken_over)
        && !expect_failures
        && verifiable
        && out.finished
        && out.bytes_verified + too_short < out.bytes_completed
    {
        out.violations.push(format!(
            "a gateway restarted: {} bytes completed, only {} verified ({} too short to check)",
            out.bytes_completed, out.bytes_verified, too_short
        ));
    }
    if errors_injected > 0 && !expect_failures {
        out.violations.push(format!(
            "a gateway gave up on a flow ({errors_injected} errors injected) with no failure injected"
        ));
    }
    // With a failure injected, the documented path (an error NAK on a later
    // work request, or on the next one posted) may leave completed WRITEs
    // unplaced; docs/semantics.md. Without one, never.
    let poisoned = w
        .host_a
        .qps
        .iter()
        .chain(w.host_b.qps.iter())
        .filter(|q| q.is_error())
        .count();
    if out.finished {
        check_nothing_lost(
            w,
            completed_write_bytes,
            placed_bytes,
            errors_injected == 0 && poisoned == 0,
            out,
        );
    } else if completed_write_bytes > placed_bytes {
        // Cut at its time limit or event cap (already a violation): what
        // was pseudo-ACKed and had not landed is still in the gateways'
        // buffers, on its way, not lost. Said once, not as a loss per QP
        // (64 lines of "silent loss" for one over-subscribed run that hit
        // the event cap hid the one violation that counts).
        out.violations.push(format!(
            "cut before the end: applications had been told {completed_write_bytes} bytes \
             landed, {placed_bytes} had; the rest was still on its way (not judged as lost)"
        ));
    }
    if out.data_errors > 0 {
        out.violations.push(format!(
            "{} data errors (corrupt, misplaced, stale or duplicated data)",
            out.data_errors
        ));
        out.bytes_misordered = out.data_errors;
    }
    if out.messages_failed > 0 && !expect_failures {
        out.violations.push(format!(
            "{} work requests failed with nothing injected",
            out.messages_failed
        ));
    }
    // With loss inside the requester's DC, an implied NAK is what rxe does
    // when a READ response is lost and a later ACK arrives, gateway or not.
    // A hardware requester whose timer fired (a 2 ms step on a READ whose
    // response takes a longer RTT: no pseudo-ACK may answer it) resends the
    // READ and what follows; the responder's answers to the first copies
    // then arrive past the re-issued READ: implied NAKs of its own making.
    let own_retries = s.endpoint == EndpointModel::Hw && out.requester_timeouts > 0;
    // A standby's takeover loses what reached the dead gateway meanwhile,
    // its DC side's answers included: loss inside the DC too (seed 300728
    // of `--standby-deaths`: two atomic answers lost at the dead gateway,
    // the third answered again after the takeover and forwarded first).
    let dc_side_loss = s.dc_loss > 0.0 || w.lost_while_dead > 0;
    if s.accelerated && !dc_side_loss && !own_retries && out.implied_naks > 0 {
        out.violations.push(format!(
            "{} implied NAKs at the requester: a pseudo-ACK went past a READ or atomic",
            out.implied_naks
        ));
    }
    if std::env::var_os("SOYA_SIM_DEBUG").is_some() {
        for (name, gw) in [
            ("A", w.gw_a.as_ref().map(Site::engine)),
            ("B", w.gw_b.as_ref().map(Site::engine)),
        ] {
            let Some(gw) = gw else { continue };
            eprintln!("gw {name}: {:?} {:?}", gw.stats, gw.occupancy());
            let site = if name == "A" { &w.gw_a } else { &w.gw_b };
            if let Some(site) = site {
                eprintln!("  twin {:?}", site.twin_counters());
            }
            for h in gw.ingress_halves() {
                eprintln!("  ingress {} {:?} {:?}", h.key, h.mode, h.stats);
            }
            for h in gw.egress_halves() {
                eprintln!("  egress {} held {} {:?}", h.key, h.held(), h.stats);
            }
        }
        for (n, h) in [("A", &w.host_a), ("B", &w.host_b)] {
            for qp in &h.qps {
                eprintln!("host {n}: {:?} mem {:?}", qp.stats(), qp.memory().stats());
            }
        }
        for ((a, b), l) in &w.links {
            eprintln!("link {a:?}->{b:?}: {:?}", l.stats);
        }
    }
    let state: usize = w
        .gw_a
        .iter()
        .chain(w.gw_b.iter())
        .map(|g| g.engine().state_bytes() + g.wan().flow_state_bytes())
        .sum();
    out.state_bytes_per_qp = (state / s.qps.max(1) as usize) as u64;
    for gw in w.engines() {
        let occ = gw.occupancy();
        out.gw_buffer_high_water = out.gw_buffer_high_water.max(occ.high_water);
        out.gw_buffer_left += occ.slots_used;
        // Totals: halves forgotten once quiet (`qp::expiry`) count too.
        let t = gw.ingress_totals();
        out.pseudo_acks += t.pseudo_acks;
        out.pseudo_acks_withheld += t.withheld_acks;
        out.hold_acks += t.hold_acks;
        out.backpressure_drops += t.backpressure_drops;
        out.cnps_sent += t.cnps_sent;
    }
    // A message to the twin dropped at the bound of the site's pending
    // queue loses whatever it carried (a READ response, a Delivered): the
    // flow waits for it forever, or pseudo-ACKed data is gone.
    for g in [&w.gw_a, &w.gw_b].into_iter().flatten() {
        let st = g.wan().stats();
        out.wan_key_updates += st.tx_key_updates;
        out.wan_auth_failures += st.auth_failures;
        let t = g.twin_counters();
        out.read_replays_suppressed += t.read_replays_suppressed;
        out.stale_read_responses_dropped += t.stale_read_responses_dropped;
        out.twin_queue_high_water_bytes = out
            .twin_queue_high_water_bytes
            .max(t.pending_high_water_bytes);
    }
    let overflow: u64 = [&w.gw_a, &w.gw_b]
        .into_iter()
        .flatten()
        .map(|g| g.twin_counters().pending_overflow)
        .sum();
    if overflow > 0 {
        out.violations.push(format!(
            "{overflow} twin messages dropped at the pending queue's bound"
        ));
    }
    if out.gw_buffer_left > 0 {
        out.violations.push(format!(
            "{} buffer slots still held after the run",
            out.gw_buffer_left
        ));
    }
}

/// A run that ended: every byte an application was told landed did land
/// (unless a failure was injected: then only never silently). A requester
/// whose completed data did not land must have been told, its QP moved to
/// the error state (an error completion, or its receives flushed).
fn check_nothing_lost(
    w: &World,
    completed_write_bytes: u64,
    placed_bytes: u64,
    nothing_injected: bool,
    out: &mut Outcome,
) {
    if completed_write_bytes > placed_bytes && nothing_injected {
        out.bytes_lost = completed_write_bytes - placed_bytes;
        out.violations.push(format!(
            "applications were told {completed_write_bytes} bytes landed; {placed_bytes} did"
        ));
    }
    for (req_host, resp_host) in [(&w.host_a, &w.host_b), (&w.host_b, &w.host_a)] {
        for (i, (qa, qb)) in req_host.qps.iter().zip(resp_host.qps.iter()).enumerate() {
            let told = qa.stats().bytes_completed_writes_sends();
            let m = qb.memory().stats();
            let placed = m.bytes_placed + m.send_bytes_received;
            if told > placed && !qa.is_error() {
                out.bytes_lost += told - placed;
                out.violations.push(format!(
                    "silent loss: QP {i}'s application was told {told} bytes landed, {placed} \
                     did, and its QP is not in error"
                ));
            }
        }
    }
}
