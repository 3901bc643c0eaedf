//! Hardware endpoints through the gateways in the simulator (issue 18):
//! what the requesters see in the first round trip. Virtual time: no check
//! depends on the machine's speed.

use soya_tools::rc::hw::EndpointModel;
use soya_tools::sim::scenario::{run_world, Op, Scenario};

fn hw_write_300km(cm_handshake: bool) -> Scenario {
    Scenario {
        seed: 5,
        distance_km: 300.0,
        op: Op::Write,
        size: 65_536,
        tx_depth: 128,
        qps: 2,
        iters: 64,
        wan_gbps: 10.0,
        endpoint: EndpointModel::Hw,
        cm_handshake,
        ..Scenario::default()
    }
}

/// An RDMA-CM connection's REQ and REP cross the gateways before its first
/// packet: they learn the QP from them and pseudo-ACK from the first packet
/// on, so a hardware requester's 2 ms timer (the adaptive first step) never
/// fires on a 2.94 ms round trip. Without the exchange the first round trip
/// is tunnelled (the gateway cannot answer a requester whose QPN it has not
/// seen), and every QP's timer fired once in it (the 16 timeouts and 6,048
/// retransmissions of `soya-sim run --endpoint hw --path-gbps 100 --qps 16`).
#[test]
fn rdma_cm_learned_hw_requesters_never_time_out_in_the_first_round_trip() {
    let (o, w) = run_world(&hw_write_300km(true), false).expect("runs");
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    assert_eq!(o.messages_ok, 2 * 64);
    let learned: u64 = w.engines().map(|e| e.stats.flows_learned_cm).sum();
    assert_eq!(learned, 2 * 2, "both gateways learn both QPs from RDMA-CM");
    assert_eq!(
        (o.requester_timeouts, o.requester_retransmissions),
        (0, 0),
        "{o:#?}"
    );
}

/// The same QPs connected out of band (NCCL): learned from the first
/// response, after one tunnelled round trip in which each timer fires once.
/// Pins what the figures without RDMA-CM mean.
#[test]
fn out_of_band_hw_requesters_time_out_once_each_in_the_tunnelled_first_round_trip() {
    let (o, w) = run_world(&hw_write_300km(false), false).expect("runs");
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    let learned: u64 = w.engines().map(|e| e.stats.flows_learned_cm).sum();
    assert_eq!(learned, 0);
    assert_eq!(o.requester_timeouts, 2, "{o:#?}");
    assert_eq!(o.requester_timeouts_after_ack, 0, "{o:#?}");
}

/// `soya-sim run --endpoint hw --qps 16 --paths 1 --path-gbps 1 --iters
/// 256`: sixteen send queues of 128 × 64 KiB WRITEs (8 MiB, 2,048 packets
/// each) over one 1 Gb/s path at 300 km, far more than the WAN carries,
/// connected through RDMA-CM (as `soya-sim run` does by default).
fn hw_oversubscribed(qps: u32) -> Scenario {
    Scenario {
        distance_km: 300.0,
        op: Op::Write,
        size: 65_536,
        tx_depth: 128,
        qps,
        iters: 256,
        wan_gbps: 1.0,
        paths: 1,
        endpoint: EndpointModel::Hw,
        cm_handshake: true,
        ..Scenario::default()
    }
}

/// Issue 33: hardware requesters that offer more than the WAN carries are
/// paced, not timed out. The buffer frees room a window at a time, so
/// without the gateway's CNPs (`qp::engine::pacer`) each QP's pseudo-ACK
/// moved only once per sixteen windows of drain, far past the 2 ms first
/// step of its adaptive timer: the run kept the link full but its
/// requesters resent 10.8 packets per packet carried (708,768
/// retransmissions, 655 timeouts), 15 at 512 messages per QP, and with 64
/// QPs the run never ended. Paced: 3,837 resent (0.06 per packet), 169
/// timeouts, the link as full.
#[test]
fn hw_requesters_over_a_slow_wan_are_paced_instead_of_timing_out() {
    let s = hw_oversubscribed(16);
    let (o, _) = run_world(&s, false).expect("runs");
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    assert_eq!(o.messages_ok, 16 * 256);
    let goodput = o.goodput_gbps.expect("finished");
    let carried = 16 * 256 * 16; // packets of 4 KiB
    let per_packet = o.requester_retransmissions as f64 / carried as f64;
    eprintln!(
        "16 hw QPs over 1 Gb/s: {goodput:.3} Gb/s, {} resent ({per_packet:.4} per packet), {} timeouts",
        o.requester_retransmissions, o.requester_timeouts
    );
    assert!(goodput >= 0.95, "{goodput} Gb/s of a 1 Gb/s path");
    assert!(per_packet < 0.1, "{per_packet} resent per packet carried");
}

/// The same sixteen send queues connected out of band (NCCL): until the
/// gateway learns a QP from its first response it is a tunnel, and each
/// expiry of a requester's 2 ms timer resent its whole window. Forwarded,
/// those copies queued for the WAN in front of the answers that would end
/// them: 0.334 Gb/s through the gateways against 0.500 direct, 4.3 million
/// packets resent. The tunnel now drops resends whose originals it still
/// holds (`qp::ingress::tunnel`): never slower than the direct path.
#[test]
fn out_of_band_hw_requesters_over_a_slow_wan_are_not_slower_than_direct() {
    let s = Scenario {
        cm_handshake: false,
        ..hw_oversubscribed(16)
    };
    let (o, w) = run_world(&s, false).expect("runs");
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    assert_eq!(o.messages_ok, 16 * 256);
    let dropped: u64 = w
        .engines()
        .flat_map(|e| e.ingress_halves())
        .map(|h| h.stats.raw_resends_dropped)
        .sum();
    let (direct, _) = run_world(
        &Scenario {
            accelerated: false,
            ..s.clone()
        },
        false,
    )
    .expect("runs");
    let (through, direct) = (
        o.goodput_gbps.expect("finished"),
        direct.goodput_gbps.expect("finished"),
    );
    eprintln!(
        "16 out-of-band hw QPs over 1 Gb/s: {through:.3} Gb/s through the gateways, \
         {direct:.3} direct; {} resent, {dropped} tunnel resends dropped",
        o.requester_retransmissions
    );
    assert!(
        through >= direct,
        "{through} Gb/s through the gateways, {direct} direct"
    );
}
