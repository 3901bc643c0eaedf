//! QP churn through one connection (issue 17: an appliance runs for months
//! through QP churn): 100 000 distinct halves, some coming back after
//! their flow retired, over a lossy, reordering, duplicating path. Every
//! message arrives once and in order per half, the flow tables on both
//! sides stay near the halves active in the last idle timeout (far below
//! `max_flows`, which the halves seen in total exceed 25 times), and once
//! traffic stops every flow is retired on both sides.

use super::*;

/// The half's key (what the site would hash a `HalfKey` into).
fn key(half: u64) -> u64 {
    (half + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn message(half: u64, n: u64) -> TwinMsg {
    let mut packet = vec![0u8; 40];
    packet[..8].copy_from_slice(&half.to_be_bytes());
    packet[8..16].copy_from_slice(&n.to_be_bytes());
    TwinMsg::Request {
        carry: Carry::Reliable,
        packet: packet.into(),
    }
}

#[test]
fn qp_churn_of_100k_halves_keeps_flows_bounded_and_delivers_exactly_once() {
    const HALVES: u64 = 100_000;
    const MAX_FLOWS: usize = 4096;
    let idle = ms(5);
    let mut cfg = wan_cfg(&[(GBPS, ms(3))], CcKind::FixedRate, None);
    cfg.tuning.max_flows = MAX_FLOWS;
    cfg.tuning.flow_idle_timeout = idle;
    let mut sim = Sim::symmetric(
        cfg,
        vec![{
            let mut l = LinkCfg::new(us(1500), GBPS);
            l.loss = 0.01;
            l.reorder = 0.02;
            l.reorder_delay = us(800);
            l.duplicate = 0.01;
            l
        }],
        17,
    );
    // A new half every 10 µs sends two messages; every tenth comes back
    // 40 ms later (its flow retired meanwhile) with two more.
    let start = |h: u64| Time::from_millis(20) + us(10 * h);
    let mut next_new = 0u64;
    let mut returns: std::collections::VecDeque<(Time, u64)> = Default::default();
    let mut sent = vec![0u64; HALVES as usize];
    let mut got = vec![0u64; HALVES as usize];
    let (mut peak_a, mut peak_b) = (0usize, 0usize);
    let end = start(HALVES) + ms(100);
    let mut quiet_since = None;
    while sim.now < end + ms(200) {
        let now = sim.now;
        let mut send = |sim: &mut Sim, h: u64| {
            for _ in 0..2 {
                let n = sent[h as usize];
                sim.ends[0]
                    .send(now, key(h), message(h, n))
                    .unwrap_or_else(|e| panic!("half {h} message {n} at {now:?}: {e}"));
                sent[h as usize] += 1;
            }
        };
        while next_new < HALVES && start(next_new) <= now {
            send(&mut sim, next_new);
            if next_new % 10 == 0 {
                returns.push_back((start(next_new) + ms(40), next_new));
            }
            next_new += 1;
        }
        while returns.front().is_some_and(|&(t, _)| t <= now) {
            let (_, h) = returns.pop_front().unwrap();
            send(&mut sim, h);
        }
        for side in [1, 0] {
            while let Some(e) = sim.ends[side].poll_event() {
                match e {
                    Event::Message(TwinMsg::Request { packet, .. }) => {
                        assert_eq!(side, 1);
                        let h = u64::from_be_bytes(packet[..8].try_into().unwrap());
                        let n = u64::from_be_bytes(packet[8..16].try_into().unwrap());
                        assert_eq!(n, got[h as usize], "half {h}: order or duplicate");
                        got[h as usize] += 1;
                    }
                    other => sim.log[side].push((now, other)),
                }
            }
        }
        let (a, b) = (sim.ends[0].stats(), sim.ends[1].stats());
        peak_a = peak_a.max(a.flows);
        peak_b = peak_b.max(b.recv_flows);
        if next_new == HALVES && returns.is_empty() && a.flows == 0 && b.recv_flows == 0 {
            // Everything retired on both sides: done.
            quiet_since.get_or_insert(now);
            break;
        }
        if !sim.step() {
            break;
        }
    }
    let (a, b) = (sim.ends[0].stats(), sim.ends[1].stats());
    println!(
        "churn: {HALVES} halves, {} messages by {:?}; peak flows A {peak_a} B {peak_b} (max {MAX_FLOWS}); \
         retired A {} closed B {}, closed ranges B {}; A lost {} rtx {}; B violations {}",
        got.iter().sum::<u64>(),
        sim.now,
        a.flows_retired,
        b.recv_flows_closed,
        b.recv_closed_ranges,
        a.packets_lost,
        a.packets_retransmitted,
        b.protocol_violations,
    );
    assert_eq!(got, sent, "every message delivered once");
    assert!(
        quiet_since.is_some(),
        "flows left: A {} B {}",
        a.flows,
        b.recv_flows
    );
    assert_eq!(b.protocol_violations, 0);
    assert!(a.packets_lost > 0, "the path lost packets");
    // Every half retired once, the returning ones twice.
    assert_eq!(a.flows_retired, HALVES + HALVES / 10);
    assert_eq!(b.recv_flows_closed, a.flows_retired);
    assert!(b.recv_closed_ranges <= 2, "{}", b.recv_closed_ranges);
    // About 100 halves start per millisecond and each lives some 3 ms of
    // transfer plus 1-2 idle timeouts: ~1 500, a third of the bound.
    assert!(peak_a < MAX_FLOWS / 2, "sender flows peaked at {peak_a}");
    assert!(peak_b < MAX_FLOWS / 2, "receiver flows peaked at {peak_b}");
}
