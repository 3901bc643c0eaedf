//! The egress lends the requests it holds (`Output::DcHeld`): the DC side
//! sends them from where they are held, so re-injection copies nothing.
//! These tests pin what the lending promises: the reference names exactly
//! the request (also across the 24-bit PSN wrap, never a PSN inside a
//! multi-PSN request), with the AckReq the egress decided on and a valid
//! ICRC, and it finds nothing once the request is released.

use crate::roce::{NakCode, Opcode, Psn, RocePacket, Syndrome};

use super::engine::{HeldRef, Output, QpEngine};
use super::tests::{edge_engine, egress_engine_with, key, request, response};
use super::tests_twin::twin_request;

/// The references the engine hands out, in order (nothing else expected).
fn lent(e: &mut QpEngine) -> Vec<HeldRef> {
    std::iter::from_fn(|| e.poll_output())
        .map(|o| match o {
            Output::DcHeld(r) => r,
            other => panic!("expected a held request, got {other:?}"),
        })
        .collect()
}

#[test]
fn a_held_request_is_lent_as_it_is_held_until_released() {
    let (mut e, t) = edge_engine();
    // Across the PSN wrap, with a 4-PSN READ in the middle.
    let psns = [0xFF_FFFE, 0xFF_FFFF, 0, 4];
    let sent = [
        request(Opcode::RC_SEND_ONLY, psns[0], false, 8, 0),
        request(Opcode::RC_SEND_ONLY, psns[1], false, 8, 0),
        request(Opcode::RC_READ_REQUEST, psns[2], true, 0, 4 * 4096),
        request(Opcode::RC_SEND_ONLY, psns[3], false, 8, 0),
    ];
    for p in &sent {
        twin_request(&mut e, t, p.clone());
    }
    let refs = lent(&mut e);
    assert_eq!(
        refs.iter().map(|r| r.psn.value()).collect::<Vec<_>>(),
        psns.to_vec()
    );
    assert!(refs.iter().all(|r| r.key == key()));
    // Each request is injected as it arrives. The first was then the last
    // one held with no AckReq outstanding: the egress set AckReq on it
    // (the requester did not). The READ asks by itself; the others are
    // covered by an AckReq in flight.
    let ack_req = [true, false, true, false];
    for ((r, want), ask) in refs.iter().zip(&sent).zip(ack_req) {
        let held = e.held_packet(r).expect("held until acknowledged");
        let p = RocePacket::parse_verified(held).expect("valid ICRC");
        assert_eq!(p.psn(), r.psn);
        assert_eq!(p.bth.ack_req, ask, "{:?}", r.psn);
        let orig = RocePacket::parse(want).unwrap();
        assert_eq!(p.bth.opcode, orig.bth.opcode);
        assert_eq!(p.payload(), orig.payload());
    }
    // A PSN inside the READ's span, or never sent, names nothing.
    for psn in [1, 2, 3, 5, 0xFF_FFFD] {
        let r = HeldRef {
            key: key(),
            psn: Psn::new(psn),
        };
        assert!(e.held_packet(&r).is_none(), "{psn:#x}");
    }
    // The responder acknowledges the two SENDs: they are released, the
    // READ and the last SEND are still held.
    e.handle_dc(
        t,
        &response(Opcode::RC_ACK, 0xFF_FFFF, Syndrome::ACK_UNLIMITED, 0),
    );
    while e.poll_output().is_some() {}
    assert!(e.held_packet(&refs[0]).is_none());
    assert!(e.held_packet(&refs[1]).is_none());
    assert!(e.held_packet(&refs[2]).is_some());
    assert!(e.held_packet(&refs[3]).is_some());
}

/// A reference taken before the half fails finds nothing after: the
/// failed half's requests are never sent (the site counts them in
/// `DcCounters::tx_released`).
#[test]
fn a_failed_half_lends_nothing_more() {
    let (mut e, t) = egress_engine_with(Opcode::RC_SEND_ONLY, 4, 8);
    let refs = lent(&mut e);
    assert_eq!(refs.len(), 4);
    assert!(refs.iter().all(|r| e.held_packet(r).is_some()));
    e.fail_all(t, NakCode::RemoteOperationalError);
    assert!(refs.iter().all(|r| e.held_packet(r).is_none()));
}
