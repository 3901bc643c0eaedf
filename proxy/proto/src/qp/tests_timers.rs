//! The engine's timers with many halves (`qp::timers`): a half's timer must
//! fire when due however the other halves' timers move meanwhile.

use std::time::Duration;

use soya_config::AckPolicy;

use super::engine::{EngineConfig, Output, QpEngine};
use super::tests::{cfg, drain, REQUESTER, RESPONDER};
use super::tests_twin_lost::ack_to;
use super::twin::{Carry, TwinMsg};
use crate::roce::builders;
use crate::roce::{IpHeader, Opcode, Psn, Reth, RocePacket, Syndrome};
use crate::time::Time;

/// The victim half: the local responder QP its requests go to.
const VICTIM_QPN: u32 = 0x1000;
const OTHERS: u32 = 63;

fn twin_request(responder_qpn: u32, psn: u32) -> TwinMsg {
    let reth = Reth {
        va: 0x1000,
        rkey: 7,
        len: 64,
    };
    let ip = IpHeader::v4(REQUESTER, RESPONDER);
    let packet = builders::request(
        ip,
        responder_qpn,
        Opcode::RC_SEND_ONLY,
        Psn::new(psn),
        true,
        reth,
    )
    .to_vec(&[0xab; 64])
    .unwrap();
    TwinMsg::Request {
        carry: Carry::Reliable,
        packet: packet.into(),
    }
}

/// The local responder's ACK of `psn` to the far requester `requester_qpn`.
fn dc_ack(requester_qpn: u32, psn: u32) -> Vec<u8> {
    ack_to(
        RESPONDER,
        REQUESTER,
        requester_qpn,
        psn,
        Syndrome::ACK_UNLIMITED,
    )
}

/// (responder QPN, PSN) of every request injected toward the DC.
fn injected_to(out: &[Output]) -> Vec<(u32, u32)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Dc(v) => {
                let p = RocePacket::parse_verified(v).expect("valid ICRC");
                p.info
                    .is_request()
                    .then(|| (p.bth.dest_qp, p.psn().value()))
            }
            _ => None,
        })
        .collect()
}

/// One egress half (the victim) injects a request its responder never
/// answers, while 63 other halves toward the same host have their
/// retransmission timers armed, disarmed and armed again every 100 µs
/// (each request ACKed, the next one injected). The victim's timer must
/// fire at its RTO and back off exactly as when it is alone, no other half
/// may time out, and once the others stop being answered each of them must
/// time out once. A timer table that loses a half's deadline when
/// others move (a dirty half never read again, a dead heap entry taken for
/// a live one, a wrong heap order) fails here.
#[test]
fn a_halfs_retransmission_timer_fires_while_many_other_halves_move_theirs() {
    let mut e = QpEngine::new(cfg(AckPolicy::Edge));
    let t0 = Time::from_micros(1);
    let other_qpn = |i: u32| 0x2000 + i;
    let requester_qpn = |i: u32| 0x100 + i;
    let base_psn = |i: u32| 100_000 * (i + 1);
    // The victim first, then the others: its entry is the oldest.
    e.handle_twin(t0, twin_request(VICTIM_QPN, 10));
    for i in 0..OTHERS {
        e.handle_twin(t0, twin_request(other_qpn(i), base_psn(i)));
    }
    let first = injected_to(&drain(&mut e));
    assert_eq!(first.len(), 1 + OTHERS as usize);
    assert_eq!(first[0], (VICTIM_QPN, 10));

    let tuning = EngineConfig::default().egress;
    let floor = tuning.min_rto;
    let horizon = t0 + floor * 7 + Duration::from_micros(50);
    let step = Duration::from_micros(100);
    let mut victim_resends = Vec::new();
    let mut others_resent = 0;
    let mut next_psn: Vec<u32> = (0..OTHERS).map(base_psn).collect();
    let mut now = t0;
    while now < horizon {
        now += step;
        // Timers due up to `now`, each fired at its own deadline.
        while let Some(d) = e.poll_timeout().filter(|&d| d <= now) {
            e.handle_timeout(d);
            for (qpn, psn) in injected_to(&drain(&mut e)) {
                if qpn == VICTIM_QPN {
                    victim_resends.push((d, psn));
                } else {
                    others_resent += 1;
                }
            }
        }
        // Every other half: its request answered, the next one injected.
        for i in 0..OTHERS {
            e.handle_dc(now, &dc_ack(requester_qpn(i), next_psn[i as usize]));
            next_psn[i as usize] += 1;
            e.handle_twin(now, twin_request(other_qpn(i), next_psn[i as usize]));
        }
        let out = drain(&mut e);
        assert!(
            injected_to(&out).iter().all(|&(q, _)| q != VICTIM_QPN),
            "the victim only resends on its timer"
        );
    }
    assert_eq!(
        victim_resends,
        vec![(t0 + floor, 10), (t0 + floor * 3, 10), (t0 + floor * 7, 10)],
        "the victim's RTO fires at the floor and backs off, as alone"
    );
    assert_eq!(others_resent, 0, "no other half timed out");
    // Now the others' last requests go unanswered: every one of them
    // resends once, one floor after it was injected.
    let last = now;
    let mut resent: Vec<(Time, u32, u32)> = Vec::new();
    while let Some(d) = e.poll_timeout().filter(|&d| d <= last + floor) {
        e.handle_timeout(d);
        resent.extend(
            injected_to(&drain(&mut e))
                .into_iter()
                .filter(|&(q, _)| q != VICTIM_QPN)
                .map(|(q, psn)| (d, q, psn)),
        );
    }
    resent.sort_unstable();
    let expected: Vec<(Time, u32, u32)> = (0..OTHERS)
        .map(|i| (last + floor, other_qpn(i), next_psn[i as usize]))
        .collect();
    assert_eq!(resent, expected, "each other half's timer fires once");
}
