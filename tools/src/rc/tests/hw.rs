//! The hardware endpoint model (`rc::hw`), packet by packet: send-queue
//! windows, the adaptive retransmission timer of perftest#251, the RNR
//! timer RDMA-CM leaves at 0, max_rd_atomic 16, and DCQCN pacing on CNPs.

use std::time::Duration;

use soya_proto::roce::builders::{self, ReplyTo};
use soya_proto::roce::{IpHeader, OpKind, Syndrome};
use soya_proto::time::Time;

use super::harness::*;
use crate::rc::hw::{hw_config, HW_MAX_UNACKED_PSNS};
use crate::rc::*;

fn hw(rdma_cm: bool) -> QpConfig {
    hw_config(cfg(), 100e9, rdma_cm)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Outstanding data is bounded by what the application posted, not by
/// 128 PSNs: 32 × 64 KiB WRITEs put all 512 packets on the wire before
/// the first ACK comes back; rxe stops at 128.
#[test]
fn hw_window_is_the_send_queue_not_128_psns() {
    for (c, expect) in [(hw(false), 512), (cfg(), 128)] {
        let mut h = Harness::new(c);
        h.delay = ms(1);
        for i in 0..32 {
            let wr = write(&h, (i % 8) * 65_536, 65_536);
            h.a.post_send(wr).unwrap();
        }
        h.run();
        assert_eq!(h.max_inflight[0], expect);
        assert_eq!(h.completions(Side::A).len(), 32);
        assert_eq!(h.a.stats().retransmitted_packets, 0);
    }
    const { assert!(HW_MAX_UNACKED_PSNS >= 1 << 21) };
}

/// perftest#251 (ConnectX-5, 40 ms link, `-u 18`): the requester resends
/// at 2, 4, 8 and 16 ms intervals whatever the configured timeout, then
/// waits the configured one; the ACK at 40 ms ends it. rxe-like endpoints
/// with the same settings wait the configured 1.07 s and send once.
#[test]
fn hw_adaptive_timer_resends_at_2_4_8_16_ms_on_a_long_link() {
    let c = QpConfig {
        timeout_code: 18,
        ..hw(false)
    };
    let mut h = Harness::new(c.clone());
    h.delay = ms(20);
    let wr = write(&h, 0, 4096);
    h.a.post_send(wr).unwrap();
    h.run();
    let times: Vec<Duration> = h
        .sent(Side::A, |s| s.is_request())
        .iter()
        .map(|s| s.at - Time::ZERO)
        .collect();
    // Sent at 0, then after 2, 4, 8, 16 ms (0, 2, 6, 14, 30 ms); the
    // first ACK is back at 40 ms.
    assert_eq!(times, vec![ms(0), ms(2), ms(6), ms(14), ms(30)]);
    assert_eq!(h.a.stats().timeouts, 4);
    assert_eq!(h.completions(Side::A).len(), 1);
    // Without an answer, the fifth wait is the configured timeout.
    let mut h = Harness::new(c.clone());
    h.delay = ms(20);
    h.fault_from(Side::B, None, Fault::Drop);
    let wr = write(&h, 0, 4096);
    h.a.post_send(wr).unwrap();
    h.run_for(ms(1200));
    let t: Vec<Duration> = h
        .sent(Side::A, |s| s.is_request())
        .iter()
        .map(|s| s.at - Time::ZERO)
        .collect();
    assert_eq!(t[5] - t[4], c.ack_timeout().unwrap());
    // rxe: one send, the ACK at 40 ms, no timeout.
    let mut h = Harness::new(QpConfig {
        timeout_code: 18,
        ..cfg()
    });
    h.delay = ms(20);
    let wr = write(&h, 0, 4096);
    h.a.post_send(wr).unwrap();
    h.run();
    assert_eq!(h.sent(Side::A, |s| s.is_request()).len(), 1);
}

/// RDMA-CM leaves the responder's min_rnr_timer at 0: its RNR NAK says
/// 655.36 ms, and the requester waits that long before resending.
/// Without RDMA-CM (NCCL sets 12): 0.64 ms.
#[test]
fn hw_rnr_nak_of_an_rdma_cm_connection_stalls_655_ms() {
    for (rdma_cm, wait) in [(true, 655_360u64), (false, 640)] {
        let mut h = Harness::new(hw(rdma_cm));
        h.delay = Duration::from_micros(10);
        h.a.post_send(WorkRequest::Send {
            len: 100,
            imm: None,
        })
        .unwrap();
        h.run_until(|h| h.b.stats().rnr_naks_sent == 1);
        h.b.post_recv(1);
        h.run();
        let sends = h.sent(Side::A, |s| s.is_request());
        assert_eq!(sends.len(), 2, "{rdma_cm}");
        let rnr = h.sent(Side::B, |s| {
            matches!(s.syndrome, Some(Syndrome::RnrNak { .. }))
        });
        let gap = sends[1].at - (rnr[0].at + h.delay);
        assert_eq!(gap, Duration::from_micros(wait), "rdma_cm {rdma_cm}");
    }
}

/// At most 16 READs outstanding (max_rd_atomic), whatever is posted.
#[test]
fn hw_reads_are_bounded_by_max_rd_atomic_16() {
    let mut h = Harness::new(hw(false));
    h.delay = ms(1);
    for i in 0..40 {
        h.a.post_send(WorkRequest::Read {
            remote_va: h.b.memory().base() + (i % 4) * 4096,
            rkey: h.b.memory().rkey(),
            len: 4096,
        })
        .unwrap();
    }
    h.run();
    assert_eq!(h.max_reads_out[0], 16);
    assert_eq!(h.completions(Side::A).len(), 40);
}

/// A CNP from B's side to A's QP, as a switch or B's NIC would send it.
fn inject_cnp(h: &mut Harness) {
    let cnp = builders::cnp(&ReplyTo {
        ip: IpHeader::v4(B_IP, A_IP),
        src_port: 0xC000,
        dest_qp: A_QPN,
    })
    .to_vec(&[])
    .unwrap();
    h.inject(Side::A, &cnp);
}

/// A CNP halves the rate (α starts at 1): the requests after it leave
/// spaced by their serialisation time at 50 Gb/s; without CNPs, back to
/// back.
#[test]
fn hw_dcqcn_paces_requests_after_a_cnp() {
    let mut h = Harness::new(hw(false));
    h.delay = Duration::from_micros(100);
    inject_cnp(&mut h);
    assert_eq!(h.a.stats().cnps_received, 1);
    let wr = write(&h, 0, 16 * 4096);
    h.a.post_send(wr).unwrap();
    h.run();
    let sent = h.sent(Side::A, |s| s.is_request() && s.payload_len == 4096);
    assert_eq!(sent.len(), 16);
    let gaps: Vec<u128> = sent
        .windows(2)
        .map(|w| (w[1].at - w[0].at).as_nanos())
        .collect();
    // (4096 + 78) B × 8 / 50 Gb/s = 667.8 ns (rate recovers a little over time).
    assert!(gaps.iter().all(|&g| (600..=700).contains(&g)), "{gaps:?}");
    // Without a CNP: all at once.
    let mut h = Harness::new(hw(false));
    h.delay = ms(1);
    let wr = write(&h, 0, 16 * 4096);
    h.a.post_send(wr).unwrap();
    h.run();
    let sent = h.sent(Side::A, |s| s.is_request());
    assert!(sent.iter().all(|s| s.at == Time::ZERO));
    assert_eq!(
        h.sent(Side::B, |s| s.kind == OpKind::Ack).len() as u64,
        h.b.stats().acks_sent
    );
}

/// A paced QP whose release time passes while its port is busy (the
/// simulator's line-rate port polls it only once free): the timer fires,
/// and the QP must not keep reporting that past deadline, or its driver
/// sees a timer due at every instant and virtual time stops (the lossy
/// 400 Gb/s run in docs/benchmarks.md §8 spun until the "time stuck" bound
/// and then settled for hours).
#[test]
fn hw_paced_deadline_that_passed_while_the_port_was_busy_is_not_due_again() {
    let mut h = Harness::new(hw(false));
    inject_cnp(&mut h);
    let wr = write(&h, 0, 16 * 4096);
    h.a.post_send(wr).unwrap();
    let mut buf = vec![0u8; 9000];
    let t0 = Time::ZERO;
    let mut sent = 0;
    while h.a.poll_transmit(t0, &mut buf).is_some() {
        sent += 1;
    }
    assert!(sent < 16, "the CNP paces the WRITE");
    let release = h.a.poll_timeout().expect("paced: wakes when it may send");
    assert!(release > t0);
    // The port is busy at `release`: the timer fires, nobody polls.
    h.a.handle_timeout(release);
    assert!(
        h.a.poll_timeout().is_none_or(|d| d > release),
        "a deadline at or before now after its timer fired: {:?} at {release:?}",
        h.a.poll_timeout()
    );
    // Once the port polls it, the held packet leaves.
    assert!(h.a.poll_transmit(release, &mut buf).is_some());
}
