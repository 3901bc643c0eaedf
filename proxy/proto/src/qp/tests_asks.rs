//! Packet-level tests of where the egress adds AckReq to a tail: only where
//! a message ends, never mid-message (docs/benchmarks.md §4: asking on
//! every tail made the responder ACK every packet whenever the gateway
//! outran the traffic, one `Delivered` over the WAN per packet).

use std::time::Duration;

use super::engine::EngineConfig;
use super::tests::{delivered, drain, edge_engine, feed, response, run_timers};
use crate::roce::{Opcode, Syndrome};

/// Packets of one WRITE arriving one by one, each the last the egress
/// holds with no request for an ACK outstanding: the First and Middle do
/// not ask (the requester must send the rest of its message), the Last
/// does even when its requester did not set AckReq, and so does a READ
/// request (an Only).
#[test]
fn egress_adds_ack_req_on_a_tail_only_where_a_message_ends() {
    let (mut e, t) = edge_engine();
    let mut sent = Vec::new();
    for (psn, op) in [
        (10, Opcode::RC_WRITE_FIRST),
        (11, Opcode::RC_WRITE_MIDDLE),
        (12, Opcode::RC_WRITE_LAST),
    ] {
        sent.extend(feed(&mut e, t, &[(psn, op, false)]));
    }
    assert_eq!(sent, vec![(10, false), (11, false), (12, true)]);
    e.handle_dc(
        t + Duration::from_micros(10),
        &response(Opcode::RC_ACK, 12, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![12]);
    let sent = feed(&mut e, t, &[(13, Opcode::RC_SEND_ONLY, false)]);
    assert_eq!(sent, vec![(13, true)], "a SEND Only ends its message");
    let eg = e.egress_halves().next().unwrap();
    assert_eq!(eg.stats.ack_reqs_added, 2);
}

/// A mid-message tail that asked for nothing, and whose message's next
/// packets never come (the twin's WAN stalls): the tail probe resends it
/// with AckReq after `tail_probe`, and the responder's ACK lets the
/// egress report it delivered.
#[test]
fn egress_probes_a_stalled_mid_message_tail_that_never_asked() {
    let (mut e, t) = edge_engine();
    let sent = feed(
        &mut e,
        t,
        &[
            (10, Opcode::RC_WRITE_FIRST, false),
            (11, Opcode::RC_WRITE_MIDDLE, false),
        ],
    );
    assert_eq!(sent, vec![(10, false), (11, false)]);
    let probe = EngineConfig::default().egress.tail_probe;
    let before = run_timers(&mut e, t + (probe - Duration::from_micros(1)));
    assert!(
        super::tests::injected(&before).is_empty(),
        "nothing resent before the tail probe: {before:?}"
    );
    let out = run_timers(&mut e, t + probe);
    assert_eq!(
        super::tests::sent_with_ack_req(&out),
        vec![(11, true)],
        "the tail alone, asking"
    );
    e.handle_dc(
        t + probe + Duration::from_micros(10),
        &response(Opcode::RC_ACK, 11, Syndrome::ACK_UNLIMITED, 0),
    );
    assert_eq!(delivered(&drain(&mut e)), vec![11]);
    assert_eq!(e.occupancy().slots_used, 0);
    let eg = e.egress_halves().next().unwrap();
    assert_eq!((eg.stats.tail_probes, eg.stats.timeouts), (1, 0));
}
