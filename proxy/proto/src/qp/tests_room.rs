//! Packet-level tests of backpressure that must end on its own (issue 33):
//! room in the shared deep buffer goes in turn to the flows waiting for it,
//! and a flow waiting for room is woken by whatever frees it, with no
//! event of its own and after its hold timer stopped (`buffer::room`,
//! `qp::engine::room`).

use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::QpEngine;
use super::ingress::HOLD_ACK_FOR;
use super::tests::{cfg, drain, run_timers};
use super::tests_reserve::{drops, learn, Requester, WINDOW};
use super::tests_twin::twin_delivered;
use crate::roce::Opcode;
use crate::time::Time;

/// An engine with a buffer of `slots` (all of it one flow's quota), a
/// 4-slot reserve floor, 16-packet windows assumed, an ACK per packet, and
/// requesters A, B and C learned.
fn three_requesters(slots: usize) -> (QpEngine, Time, [Requester; 3]) {
    let mut c = cfg(AckPolicy::Edge);
    c.buffer_slots = slots;
    c.per_flow_slots = slots;
    c.ack.ack_reserve_slots = 4;
    c.ack.assumed_window_slots = WINDOW as usize;
    c.ack.coalesce_packets = 1;
    c.ack.coalesce = Duration::from_secs(1);
    let mut e = QpEngine::new(c);
    let t = Time::from_micros(1);
    let mut reqs = [0x22, 0x23, 0x24].map(|rs_qpn| Requester {
        rq_qpn: rs_qpn - 0x10,
        rs_qpn,
        next: 0,
        acked: 0,
    });
    learn(&mut e, t, &mut reqs);
    (e, t, reqs)
}

/// `r` sends `n` packets (or until its window stops it).
fn send(e: &mut QpEngine, t: Time, r: &mut Requester, n: usize) {
    for _ in 0..n {
        if !r.may_send() {
            break;
        }
        let p = r.send();
        e.handle_dc(t, &p);
        r.take_acks(&drain(e));
    }
}

/// The twin reports everything `r` sent delivered.
fn deliver_all(e: &mut QpEngine, t: Time, r: &Requester) -> Vec<super::engine::Output> {
    twin_delivered(e, t, r.key(), r.next - 1);
    drain(e)
}

/// Issue 33 at the scale of a test. C holds most of the buffer, its
/// packets not yet delivered (they wait behind a WAN loss, or behind the
/// other flows' packets on a slow WAN); A is withheld at its window, and
/// its own packets are delivered while C's still hold the room, so A's
/// own event finds no room. Nothing of A's happens after that: it waits
/// for room that only C's deliveries can free. Its hold timer repeats the
/// last ACK for `HOLD_ACK_FOR`, then stops. When C's packets are finally
/// delivered, A must get its pseudo-ACK at once. Before the fix it never
/// did: only A's own events and its stopped hold timer re-checked it, and
/// its requester's resends were answered with the old ACK forever (the
/// simulator's 4 rxe QPs over one 1 Gb/s path, never finished).
#[test]
fn a_withheld_requester_resumes_when_other_flows_free_the_room_after_its_hold_timer_stopped() {
    let (mut e, t, [mut a, _, mut c]) = three_requesters(64);
    // C: 48 packets, all acknowledged (room for its window beside them).
    send(&mut e, t, &mut c, 48);
    assert_eq!(c.acked, c.next, "C acknowledged");
    // A: held at its window: 16 free slots do not cover C's window and its own.
    send(&mut e, t, &mut a, WINDOW as usize);
    let held_at = a.acked;
    assert_eq!(a.next - held_at, WINDOW, "A withheld at its window");
    // A's packets are delivered: 16 slots free, still not enough.
    a.take_acks(&deliver_all(&mut e, t, &a));
    assert_eq!(
        a.acked, held_at,
        "C's window and A's do not fit in 16 slots"
    );
    // Longer than the hold's repeats: C's packets stay stuck.
    let later = t + HOLD_ACK_FOR + Duration::from_millis(100);
    a.take_acks(&run_timers(&mut e, later));
    assert_eq!(a.acked, held_at, "nothing freed room in the meantime");
    // A's requester times out and resends its window: duplicates.
    let resend = a.packet(Opcode::RC_WRITE_FIRST, held_at, false);
    e.handle_dc(later, &resend);
    a.take_acks(&drain(&mut e));
    // C's packets are delivered: the whole buffer is free.
    let at = later + Duration::from_millis(1);
    a.take_acks(&deliver_all(&mut e, at, &c));
    assert_eq!(e.occupancy().slots_used, 0);
    assert_eq!(
        a.acked, a.next,
        "A acknowledged as soon as C's deliveries freed the room"
    );
    assert_eq!(drops(&e), 0);
}

/// Room freed while several flows wait goes to the one waiting longest,
/// not to the one whose delivery freed it. C holds 40 slots of 80; A is
/// withheld first, then B; C's oldest 16 and all of B's packets are
/// delivered, freeing room for one window beside C's. Before the fix B
/// took it (its own `Delivered` re-checked it at once, A only on its hold
/// timer): with many QPs the flows whose packets were being delivered won
/// every such race and a flow with nothing left in flight starved.
#[test]
fn freed_room_goes_to_the_requester_waiting_longest() {
    let (mut e, t, [mut a, mut b, mut c]) = three_requesters(80);
    send(&mut e, t, &mut c, 40);
    assert_eq!(c.acked, c.next, "C acknowledged");
    send(&mut e, t, &mut a, 64);
    let a_held = a.acked;
    assert_eq!(a.next - a_held, WINDOW, "A withheld at its window");
    send(&mut e, t, &mut b, 64);
    let b_held = b.acked;
    assert_eq!(b.next - b_held, WINDOW, "B withheld at its window");
    assert_eq!(b_held, b.acked0() - 1 + 1, "B got no pseudo-ACK at all");
    // C's oldest 16, then B's 16: room for one window beside C's promise.
    twin_delivered(&mut e, t, c.key(), c.acked0() - 1 + 16);
    let out = drain(&mut e);
    a.take_acks(&out);
    b.take_acks(&out);
    assert_eq!((a.acked, b.acked), (a_held, b_held), "16 free: no room yet");
    let out = deliver_all(&mut e, t, &b);
    a.take_acks(&out);
    b.take_acks(&out);
    assert!(a.acked > a_held, "A, waiting longest, acknowledged");
    assert_eq!(b.acked, b_held, "B waits for its turn");
    // A uses its window; C's remaining packets are delivered: B's turn.
    send(&mut e, t, &mut a, 64);
    let out = deliver_all(&mut e, t, &c);
    b.take_acks(&out);
    assert!(b.acked > b_held, "B acknowledged in its turn");
    assert_eq!(drops(&e), 0);
}
