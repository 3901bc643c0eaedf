//! Packet-level tests of backpressure that must end on its own (issue 33):
//! room in the shared deep buffer goes in turn to the flows waiting for it,
//! and a flow waiting for room is woken by whatever frees it, with no
//! event of its own and after its hold timer stopped (`buffer::room`,
//! `qp::engine::room`).

use std::time::Duration;

use super::engine::{Output, QpEngine};
use super::ingress::HOLD_ACK_FOR;
use super::tests::{drain, run_timers};
use super::tests_reserve::{drops, requesters, Requester, WINDOW};
use super::tests_twin::twin_delivered;
use crate::roce::Opcode;
use crate::time::Time;

/// An engine with a buffer of `slots` (all of it one flow's quota), a
/// 4-slot reserve floor, 16-packet windows assumed, an ACK per packet, and
/// requesters A, B and C learned.
fn three_requesters(slots: usize) -> (QpEngine, Time, [Requester; 3]) {
    requesters(slots, WINDOW as usize, 1)
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

/// `r` (named `name` in the message) sends `n` packets, all acknowledged.
fn send_acknowledged(e: &mut QpEngine, t: Time, r: &mut Requester, n: usize, name: &str) {
    send(e, t, r, n);
    assert_eq!(r.acked, r.next, "{name} acknowledged");
}

/// `r` (named `name` in the message) sends up to `n` packets and must be
/// stopped by its window, its pseudo-ACKs withheld; returns how far it was
/// acknowledged.
fn send_withheld(e: &mut QpEngine, t: Time, r: &mut Requester, n: usize, name: &str) -> u32 {
    send(e, t, r, n);
    assert_eq!(r.next - r.acked, WINDOW, "{name} withheld at its window");
    r.acked
}

/// The twin reports everything `r` sent delivered.
fn deliver_all(e: &mut QpEngine, t: Time, r: &Requester) -> Vec<Output> {
    twin_delivered(e, t, r.key(), r.next - 1);
    drain(e)
}

/// A and B both take the ACKs in `out`: room freed by one flow's delivery
/// may go to the other.
fn take_acks_both(out: &[Output], a: &mut Requester, b: &mut Requester) {
    a.take_acks(out);
    b.take_acks(out);
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
    send_acknowledged(&mut e, t, &mut c, 48, "C");
    // A: held at its window: 16 free slots do not cover C's window and its own.
    let held_at = send_withheld(&mut e, t, &mut a, WINDOW as usize, "A");
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
    send_acknowledged(&mut e, t, &mut c, 40, "C");
    let a_held = send_withheld(&mut e, t, &mut a, 64, "A");
    let b_held = send_withheld(&mut e, t, &mut b, 64, "B");
    assert_eq!(b_held, b.acked0() - 1 + 1, "B got no pseudo-ACK at all");
    // C's oldest 16, then B's 16: room for one window beside C's promise.
    twin_delivered(&mut e, t, c.key(), c.acked0() - 1 + 16);
    let out = drain(&mut e);
    take_acks_both(&out, &mut a, &mut b);
    assert_eq!((a.acked, b.acked), (a_held, b_held), "16 free: no room yet");
    let out = deliver_all(&mut e, t, &b);
    take_acks_both(&out, &mut a, &mut b);
    assert!(a.acked > a_held, "A, waiting longest, acknowledged");
    assert_eq!(b.acked, b_held, "B waits for its turn");
    // A uses its window; C's remaining packets are delivered: B's turn.
    send(&mut e, t, &mut a, 64);
    let out = deliver_all(&mut e, t, &c);
    b.take_acks(&out);
    assert!(b.acked > b_held, "B acknowledged in its turn");
    assert_eq!(drops(&e), 0);
}

/// Two flows whose packets have all been delivered wait for room; room
/// for one window frees up. The first is acknowledged, and its window,
/// which it holds no slot for yet, must count against the second's check:
/// before, a flow holding no slot could not be promised anything, so the
/// second saw the same free slots and was acknowledged too, and their
/// windows together overran the buffer (over-subscribed sweep seed 61:
/// seven owed NAKs sent in one round). A promise to a flow holding
/// nothing lapses if its requester sends nothing, so the second is not
/// kept waiting by a requester that is done.
#[test]
fn a_window_granted_to_a_flow_holding_nothing_counts_until_it_is_used() {
    let (mut e, t, [mut a, mut b, mut c]) = three_requesters(80);
    send_acknowledged(&mut e, t, &mut c, 40, "C");
    let a_held = send_withheld(&mut e, t, &mut a, 64, "A");
    let b_held = send_withheld(&mut e, t, &mut b, 64, "B");
    // A's and B's packets delivered: both hold nothing, 40 slots free,
    // room for C's window and one more.
    let out = deliver_all(&mut e, t, &a);
    take_acks_both(&out, &mut a, &mut b);
    let out = deliver_all(&mut e, t, &b);
    take_acks_both(&out, &mut a, &mut b);
    assert!(a.acked > a_held, "A, waiting longest, acknowledged");
    assert_eq!(b.acked, b_held, "A's window counts: B waits");
    // A's requester never sends again: its promise lapses, and B is
    // acknowledged on the engine's own timer.
    let later = t + Duration::from_millis(2);
    b.take_acks(&run_timers(&mut e, later));
    assert!(b.acked > b_held, "B acknowledged once A's grant lapsed");
    // Both use their windows, C too: it all fits.
    send(&mut e, later, &mut b, 64);
    send(&mut e, later, &mut c, 64);
    assert_eq!(drops(&e), 0);
}

/// A request dropped at the hard limit by a flow that holds nothing and
/// waits for nothing (its earlier NAK was paid, and its resend met a
/// buffer that others had filled meanwhile) owes a NAK again, and must
/// wait for room in turn like any held flow, woken by whatever frees it.
/// Before, the drop only noted the NAK as owed: with no packet of its own
/// held, no timer and no place in the queue, nothing looked at it again
/// until its requester's ACK timeout (67 ms for rxe) made it resend, twice
/// in over-subscribed sweep seed 334 (QPs left at 0.03 of an equal share).
#[test]
fn a_request_dropped_by_a_flow_holding_nothing_is_naked_when_room_frees() {
    let (mut e, t, [mut a, mut b, mut c]) = three_requesters(48);
    send_acknowledged(&mut e, t, &mut c, 32, "C");
    send_withheld(&mut e, t, &mut a, 64, "A");
    assert_eq!(e.occupancy().slots_used, 48, "the buffer is full");
    // B's request: dropped at the hard limit.
    let dropped_at = b.next;
    send(&mut e, t, &mut b, 1);
    assert_eq!(drops(&e), 1);
    // Room frees only through the other flows' deliveries; nothing of B's
    // happens. B's NAK must come without its requester resending.
    let mut naks = Vec::new();
    for r in [&c, &a] {
        let at = t + Duration::from_micros(10);
        for o in deliver_all(&mut e, at, r) {
            if let Output::Dc(v) = &o {
                let p = crate::roce::RocePacket::parse(v).unwrap();
                let nak = p
                    .ext
                    .aeth
                    .is_some_and(|x| x.syndrome != crate::roce::Syndrome::ACK_UNLIMITED);
                if p.bth.dest_qp == b.rq_qpn && nak {
                    naks.push(p.psn().value());
                }
            }
        }
    }
    assert_eq!(naks, vec![dropped_at], "B NAKed at its gap once room freed");
}

/// A flow acknowledged with its whole window ahead of it sends a packet
/// and sees it delivered before its requester sends the rest (it shares
/// its host's link with other QPs). Its last slot released, its promise
/// went with it, and another flow was acknowledged into the room its
/// requester was still entitled to: both windows then overran the buffer
/// (over-subscribed sweep seeds 75, 218 and 312: QPs at 0.19-0.25 of an
/// equal share). Its promise now lasts a while after its last delivery.
#[test]
fn a_flow_whose_packets_were_all_delivered_keeps_its_promise_a_while() {
    let (mut e, t, [mut a, mut b, mut c]) = three_requesters(80);
    send_acknowledged(&mut e, t, &mut c, 24, "C");
    send(&mut e, t, &mut a, 1);
    assert_eq!(a.acked, a.next, "A acknowledged: its window is ahead of it");
    let out = deliver_all(&mut e, t, &a);
    a.take_acks(&out);
    assert_eq!(e.occupancy().slots_used, 24, "A holds nothing");
    // B sends while it is acknowledged: the room it may take stops short
    // of C's window and A's, which their requesters may still send.
    let b_held = send_withheld(&mut e, t, &mut b, 64, "B");
    let free = 80 - e.occupancy().slots_used;
    assert!(
        free >= 2 * WINDOW as usize,
        "{free} slots free: C's window and A's must fit"
    );
    // A's requester sends nothing more: its promise lapses, B goes on.
    let later = t + Duration::from_millis(2);
    b.take_acks(&run_timers(&mut e, later));
    assert!(b.acked > b_held, "B acknowledged once A's promise lapsed");
    assert_eq!(drops(&e), 0);
}
