//! Goodput ratios in virtual time (loss, two paths) for both controllers.

use super::*;

/// Goodput of 16 flows of 4 KB messages over `paths` 10 Gb/s links at 3 ms
/// RTT with `loss`, measured from 30 ms to `end` (virtual time).
fn goodput_10g(paths: usize, loss: f64, cc: CcKind, end: Time) -> f64 {
    let rate = 10 * GBPS;
    let mut cfg = wan_cfg(&vec![(rate, ms(3)); paths], cc, None);
    cfg.flow_window_bytes = 4 << 20;
    cfg.tuning.flow_queue_bytes = 64 << 10;
    let mut l = LinkCfg::new(us(1500), rate);
    l.loss = loss;
    let mut sim = Sim::symmetric(cfg, vec![l; paths], 1000 + paths as u64);
    let mut w = Workload::new(16, None, (4000, 4000));
    w.full_check = false;
    run_until(&mut sim, &mut w, end);
    w.goodput(Time::from_millis(30), end)
}

#[test]
fn bench_goodput_ratios() {
    // Virtual time: the figures do not depend on the machine, only on the
    // measured span, shortened in debug builds to keep them quick.
    let end = Time::from_millis(if cfg!(debug_assertions) { 80 } else { 200 });
    for cc in [CcKind::FixedRate, CcKind::Bbr] {
        let clean = goodput_10g(1, 0.0, cc, end);
        let lossy = goodput_10g(1, 0.001, cc, end);
        let lossier = goodput_10g(1, 0.01, cc, end);
        let two = goodput_10g(2, 0.0, cc, end);
        println!(
            "bench {cc:?} ({end:?} of virtual time): 10 Gb/s, 3 ms RTT: lossless {:.2} Gb/s, \
             0.1 % loss {:.2} Gb/s (ratio {:.3}), 1 % loss {:.2} Gb/s (ratio {:.3}), \
             two paths {:.2} Gb/s (ratio {:.3})",
            clean / 1e9,
            lossy / 1e9,
            lossy / clean,
            lossier / 1e9,
            lossier / clean,
            two / 1e9,
            two / clean
        );
        assert!(
            lossy / clean >= 0.90,
            "{cc:?}: 0.1 % loss ratio {}",
            lossy / clean
        );
        assert!(
            lossier / clean >= 0.90,
            "{cc:?}: 1 % loss ratio {}",
            lossier / clean
        );
        assert!(two / clean >= 1.8, "{cc:?}: two-path ratio {}", two / clean);
    }
}
