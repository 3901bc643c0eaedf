//! What `soya demo` prints: the circuit it chose and why, the table (or
//! `--json`) of its three runs, and the summary line, which gives Sōya's
//! ratio to 0 km only when the circuit, not this machine, bounded the
//! runs (`crate::demo_circuit`).

use std::fmt::Write as _;

use serde_json::json;

use crate::demo_circuit::{self, Bound};
use crate::demo_common::{DemoOptions, US_PER_KM};

/// The result of one scenario.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outcome {
    /// End to end: bytes placed (and verified) at the responder over the
    /// time until the last one was (the server's goodput, which includes
    /// draining a gateway's buffer after the requester stopped).
    pub gbps: f64,
    /// What the requester saw complete (runs ahead of placement behind
    /// pseudo-ACKs, while the gateway buffers).
    pub requester_gbps: f64,
    pub rtt_ms: Option<f64>,
    pub retransmissions: u64,
    pub data_errors: u64,
    pub ok: bool,
    pub errors: Vec<String>,
}

/// What `--rate auto` measured: direct at 0 km with no bottleneck, then
/// the circuits it tried through Sōya.
#[derive(Clone, Debug)]
pub(crate) struct Calibration {
    /// Direct at 0 km, no bottleneck.
    pub direct_0km_gbps: f64,
    /// Each circuit tried (bits per second) and what Sōya carried on it.
    pub trials: Vec<(u64, f64)>,
    /// Periods in which the kernel throttled the demo's cgroup for its CPU
    /// quota during the calibration (`None`: not readable).
    pub throttled_periods: Option<u64>,
}

impl Calibration {
    /// The circuit chosen: the last one tried, less the run's margin
    /// ([`demo_circuit::run_rate`]).
    pub fn rate_bps(&self) -> u64 {
        demo_circuit::run_rate(
            self.trials
                .last()
                .map_or(demo_circuit::MIN_AUTO_BPS, |&(r, _)| r),
            self.throttled(),
        )
    }

    /// The kernel throttled the calibration for a CPU quota.
    pub fn throttled(&self) -> bool {
        self.throttled_periods.is_some_and(|n| n > 0)
    }
}

/// "2 Gb/s" or "unlimited rate".
fn rate_text(r: Option<u64>) -> String {
    r.map_or("unlimited rate".into(), |r| {
        format!("{} Gb/s", r as f64 / 1e9)
    })
}

fn rtt_ms(o: &DemoOptions) -> f64 {
    2.0 * o.distance_km * US_PER_KM / 1000.0
}

/// The circuit and the requester's window, and why (printed before the
/// runs).
pub(crate) fn circuit_text(o: &DemoOptions, calibration: Option<&Calibration>) -> String {
    let mut t = format!("circuit: {} per path", rate_text(o.rate_bps));
    if let Some(c) = calibration {
        let tried: Vec<String> = c
            .trials
            .iter()
            .map(|&(r, g)| format!("{g:.3} on {}", rate_text(Some(r))))
            .collect();
        let _ = write!(
            t,
            " (--rate auto: direct at 0 km this machine carried {:.3} Gb/s with no bottleneck, \
             through Sōya at {} km {}; the circuit is {:.0} % of the first that Sōya carried at \
             {:.0} % or more{}, trying {:.0} % of the direct figure first, at most {})",
            c.direct_0km_gbps,
            o.distance_km,
            tried.join(", then "),
            100.0
                * if c.throttled() {
                    demo_circuit::THROTTLED_RUN_MARGIN
                } else {
                    demo_circuit::RUN_MARGIN
                },
            100.0 * demo_circuit::TRIAL_SHARE,
            match c.throttled_periods {
                Some(n) if n > 0 => format!(
                    " (the kernel throttled this cgroup for its CPU quota in {n} periods: a \
                     quota freezes the gateways' pacers, whole cores do not)"
                ),
                _ => String::new(),
            },
            100.0 * demo_circuit::HEADROOM,
            rate_text(Some(demo_circuit::MAX_AUTO_BPS))
        );
    }
    let w = o.window_packets();
    let _ = write!(t, "; requester window {w} x 4 KiB");
    if o.window.is_none() && w != demo_circuit::FULL_WINDOW {
        let _ = write!(
            t,
            " (rxe's {} against {}, scaled to the circuit)",
            demo_circuit::FULL_WINDOW,
            rate_text(Some(demo_circuit::MAX_AUTO_BPS))
        );
    }
    if let Some(g) = demo_circuit::window_gbps(w, 4096, rtt_ms(o)) {
        let _ = write!(
            t,
            ": without Sōya at most {g:.3} Gb/s over the {:.2} ms round trip",
            rtt_ms(o)
        );
    }
    t
}

/// The demo's outcome: its options (with the circuit in force), the
/// calibration, the bound, the three runs and whether the gateways stayed
/// up.
pub(crate) struct Report<'a> {
    pub o: &'a DemoOptions,
    pub calibration: Option<Calibration>,
    pub bound: Bound,
    /// Direct at 0 km, direct at the distance, through Sōya.
    pub runs: [Outcome; 3],
    pub gateways: Result<(), String>,
}

impl Report<'_> {
    /// Every failure: runs that failed and gateways that exited.
    fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for (name, r) in ["direct 0 km", "direct", "Sōya"].iter().zip(&self.runs) {
            if !r.ok {
                failures.push(format!("{name}: {}", r.errors.join("; ")));
            }
        }
        if let Err(e) = &self.gateways {
            failures.push(e.clone());
        }
        failures
    }

    fn data_errors(&self) -> u64 {
        self.runs.iter().map(|r| r.data_errors).sum()
    }

    fn ratio(&self, g: f64) -> Option<f64> {
        let zero = self.runs[0].gbps;
        (zero > 0.0).then(|| g / zero)
    }

    /// Sōya's goodput over the 0 km run's, reported as Sōya's only when
    /// the circuit bounded the runs.
    fn soya_over_0km(&self) -> Option<f64> {
        (self.bound == Bound::Circuit)
            .then(|| self.ratio(self.runs[2].gbps))
            .flatten()
    }

    fn speedup(&self) -> Option<f64> {
        let [_, d, a] = &self.runs;
        (d.gbps > 0.0).then(|| a.gbps / d.gbps)
    }

    /// The one line that says what the demo showed.
    pub(crate) fn summary(&self) -> String {
        let o = self.o;
        let [zero, _, accel] = &self.runs;
        match (self.bound, self.soya_over_0km(), o.rate_bps) {
            (Bound::Circuit, Some(x), Some(r)) => format!(
                "summary: through Sōya at {} km, {:.1} % of the 0 km goodput and {} direct, \
                 on a {} circuit that bounded every run",
                o.distance_km,
                100.0 * x,
                self.speedup().map_or("-".into(), |s| format!("{s:.2}x")),
                rate_text(Some(r))
            ),
            (_, _, None) => format!(
                "summary: unlimited link, so every run is bounded by this machine's CPU, and \
                 through Sōya five processes share it instead of two: {:.3} against {:.3} Gb/s \
                 at 0 km is this machine's figure, not Sōya's (the default, --rate auto, \
                 emulates a circuit this machine carries)",
                accel.gbps, zero.gbps
            ),
            _ => format!(
                "summary: this machine, not the {} circuit, bounded the 0 km run ({:.3} Gb/s, \
                 under {:.0} % of it), so the runs measure its CPU and no ratio is reported as \
                 Sōya's; run it on an idle machine, or give a slower circuit with --rate",
                rate_text(o.rate_bps),
                zero.gbps,
                100.0 * demo_circuit::CIRCUIT_BOUND_SHARE
            ),
        }
    }

    /// Prints the table (or `--json`); returns the exit status (0: every
    /// run clean).
    pub(crate) fn print(&self) -> i32 {
        if self.o.json {
            println!("{}", self.json());
        } else {
            print!("{}", self.table());
        }
        let clean = self.failures().is_empty() && self.data_errors() == 0;
        i32::from(!clean)
    }

    fn json(&self) -> serde_json::Value {
        let o = self.o;
        let [r0, rd, ra] = &self.runs;
        let row = |r: &Outcome| {
            json!({
                "gbps": r.gbps,
                "requester_gbps": r.requester_gbps,
                "ratio_to_0km": self.ratio(r.gbps),
                "rtt_ms": r.rtt_ms,
                "retransmissions": r.retransmissions,
                "data_errors": r.data_errors,
                "ok": r.ok,
                "errors": r.errors,
            })
        };
        let failures = self.failures();
        json!({
            "distance_km": o.distance_km,
            "netns": o.netns,
            "backend": if o.netns { o.backend.name() } else { "udp" },
            "loss": o.loss,
            "paths": o.paths,
            "duration_s": o.duration,
            "size": o.size,
            "rtt_ms": rtt_ms(o),
            "rate_gbps": o.rate_bps.map(|r| r as f64 / 1e9),
            "rate_auto": o.rate_auto,
            "calibration_gbps": self.calibration.as_ref().map(|c| c.direct_0km_gbps),
            "calibration": self.calibration.as_ref().map(|c| json!({
                "direct_0km_gbps": c.direct_0km_gbps,
                "trials": c.trials.iter().map(|&(r, g)| json!({
                    "rate_gbps": r as f64 / 1e9,
                    "accelerated_gbps": g,
                })).collect::<Vec<_>>(),
                "cpu_throttled_periods": c.throttled_periods,
            })),
            "window_packets": o.window_packets(),
            "bound": self.bound.name(),
            "soya_over_0km": self.soya_over_0km(),
            "direct_0km_gbps": r0.gbps,
            "direct_gbps": rd.gbps,
            "accelerated_gbps": ra.gbps,
            "speedup": self.speedup(),
            "data_errors": self.data_errors(),
            "ok": failures.is_empty() && self.data_errors() == 0,
            "failures": failures,
            "summary": self.summary(),
            "runs": {
                "direct_0km": row(r0),
                "direct": row(rd),
                "accelerated": row(ra),
            },
        })
    }

    fn table(&self) -> String {
        let o = self.o;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\n{:<22} {:>10} {:>9} {:>10} {:>13} {:>8} {:>11}",
            "run", "Gb/s", "vs 0 km", "req Gb/s", "RTT p50 (ms)", "retx", "data errs"
        );
        let names = [
            "direct, 0 km".to_string(),
            format!("direct, {} km", o.distance_km),
            format!("Sōya, {} km", o.distance_km),
        ];
        for (name, r) in names.iter().zip(&self.runs) {
            let _ = writeln!(
                t,
                "{:<22} {:>10.3} {:>9} {:>10.3} {:>13} {:>8} {:>11}{}",
                name,
                r.gbps,
                self.ratio(r.gbps)
                    .map_or("-".into(), |x| format!("{:.1}%", 100.0 * x)),
                r.requester_gbps,
                r.rtt_ms.map_or("-".into(), |x| format!("{x:.3}")),
                r.retransmissions,
                r.data_errors,
                if r.ok { "" } else { "  FAILED" }
            );
        }
        let _ = writeln!(
            t,
            "Gb/s: bytes placed and verified at the responder, end to end (incl. draining the \
             gateways' buffers); req Gb/s: completions at the requester.\nemulated WAN: RTT \
             {:.2} ms, {} per path; requester window {} x 4 KiB; RTT column: p50 of 64 B WRITE \
             completion as the requester sees it",
            rtt_ms(o),
            rate_text(o.rate_bps),
            o.window_packets()
        );
        let _ = writeln!(t, "{}", self.summary());
        for f in &self.failures() {
            let _ = writeln!(t, "failure: {f}");
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(gbps: f64) -> Outcome {
        Outcome {
            gbps,
            requester_gbps: gbps,
            ok: true,
            ..Outcome::default()
        }
    }

    fn report(o: &DemoOptions, zero: f64, direct: f64, soya: f64) -> Report<'_> {
        Report {
            o,
            calibration: Some(Calibration {
                direct_0km_gbps: 1.8,
                trials: vec![(1_250_000_000, 1.0), (1_000_000_000, 0.95)],
                throttled_periods: Some(0),
            }),
            bound: demo_circuit::bound(o.rate_bps, zero),
            runs: [run(zero), run(direct), run(soya)],
            gateways: Ok(()),
        }
    }

    #[test]
    fn a_calibration_throttled_for_a_cpu_quota_says_so_and_leaves_more_headroom() {
        let mut c = Calibration {
            direct_0km_gbps: 0.8,
            trials: vec![(300_000_000, 0.29)],
            throttled_periods: Some(0),
        };
        assert_eq!(c.rate_bps(), 250_000_000);
        c.throttled_periods = Some(12);
        assert_eq!(c.rate_bps(), 150_000_000);
        let o = DemoOptions {
            rate_bps: Some(c.rate_bps()),
            ..DemoOptions::default()
        };
        let t = circuit_text(&o, Some(&c));
        assert!(t.contains("60 % of the first"), "{t}");
        assert!(
            t.contains("throttled this cgroup for its CPU quota in 12 periods"),
            "{t}"
        );
    }

    #[test]
    fn a_circuit_bound_run_reports_sōyas_ratio() {
        let o = DemoOptions {
            rate_bps: Some(1_000_000_000),
            ..DemoOptions::default()
        };
        let r = report(&o, 0.98, 0.66, 0.96);
        let v = r.json();
        assert_eq!(v["bound"], "circuit");
        let x = v["soya_over_0km"].as_f64().unwrap();
        assert!((x - 0.96 / 0.98).abs() < 1e-9, "{v}");
        assert!(
            r.summary().contains("98.0 % of the 0 km goodput"),
            "{}",
            r.summary()
        );
        assert!(r.summary().contains("1.45x direct"), "{}", r.summary());
        assert_eq!(r.print(), 0);
    }

    #[test]
    fn a_machine_bound_run_reports_no_ratio_as_sōyas() {
        let o = DemoOptions {
            rate_bps: Some(1_000_000_000),
            ..DemoOptions::default()
        };
        // The 0 km run fell short of the circuit.
        let r = report(&o, 0.70, 0.60, 0.69);
        let v = r.json();
        assert_eq!(v["bound"], "machine");
        assert!(v["soya_over_0km"].is_null(), "{v}");
        // The keys earlier versions printed are all still there.
        for k in [
            "direct_0km_gbps",
            "direct_gbps",
            "accelerated_gbps",
            "speedup",
        ] {
            assert!(v[k].is_number(), "{k}: {v}");
        }
        assert!(r.summary().contains("this machine"), "{}", r.summary());
        assert!(!r.summary().contains("% of the 0 km"), "{}", r.summary());
    }

    #[test]
    fn a_failed_run_fails_the_demo() {
        let o = DemoOptions::default();
        let mut r = report(&o, 1.9, 1.3, 1.9);
        r.runs[2].ok = false;
        r.runs[2].errors.push("stalled".into());
        assert_eq!(r.json()["ok"], false);
        assert_eq!(r.print(), 1);
        let mut r = report(&o, 1.9, 1.3, 1.9);
        r.runs[1].data_errors = 1;
        assert_eq!(r.print(), 1);
    }
}
