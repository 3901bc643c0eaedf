//! What the two-site demo's runs share: its options, the sibling
//! binaries, and the gateway and relay settings both the loopback
//! ([`crate::demo`]) and the network-namespace ([`crate::demo_netns`])
//! set-ups use.

use std::path::{Path, PathBuf};
use std::process::Command;

pub use soya::demo_args::DemoBackend;

/// What `soya demo` was asked to do.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoOptions {
    /// Fibre length between the sites (one-way delay 4.9 µs per km).
    pub distance_km: f64,
    /// Random loss probability per WAN direction (0..1).
    pub loss: f64,
    /// WAN paths between the gateways (one relay each).
    pub paths: u32,
    /// Seconds of each throughput run.
    pub duration: f64,
    /// Message size, bytes.
    pub size: u32,
    /// One JSON object on stdout instead of the table.
    pub json: bool,
    /// Between network namespaces (root).
    pub netns: bool,
    /// The gateways' DC backend there.
    pub backend: DemoBackend,
    /// Bottleneck rate of each emulated WAN path, bits per second (`None`:
    /// unlimited). With a rate, the 0 km run crosses a relay of the same
    /// rate too, so the three runs differ only in distance and in Sōya.
    pub rate_bps: Option<u64>,
    /// `rate_bps` is to be chosen for this machine (`--rate auto`) before
    /// the runs (`crate::demo_circuit`).
    pub rate_auto: bool,
    /// The requester's window in packets; `None`: chosen with the circuit
    /// (`crate::demo_circuit::auto_window`).
    pub window: Option<u32>,
}

/// The demo's WAN circuit with `--rate auto` on a fast machine: above what
/// a 128 x 4 KiB window carries over 300 km (1.4 Gb/s), so the distance
/// shows ([`crate::demo_circuit::MAX_AUTO_BPS`]).
pub const DEFAULT_RATE_BPS: u64 = crate::demo_circuit::MAX_AUTO_BPS;

impl Default for DemoOptions {
    fn default() -> DemoOptions {
        DemoOptions {
            distance_km: 300.0,
            loss: 0.0,
            paths: 1,
            duration: 10.0,
            size: 65_536,
            json: false,
            netns: false,
            backend: DemoBackend::Tun,
            rate_bps: Some(DEFAULT_RATE_BPS),
            rate_auto: false,
            window: None,
        }
    }
}

/// One-way fibre delay per km.
pub(crate) const US_PER_KM: f64 = 4.9;

/// The three sibling binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub soya: PathBuf,
    pub perf: PathBuf,
    pub wanem: PathBuf,
}

impl Binaries {
    /// The binaries next to `soya` (normally `std::env::current_exe()`).
    pub fn beside(soya: &Path) -> Result<Binaries, String> {
        let dir = soya
            .parent()
            .ok_or_else(|| format!("{} has no directory", soya.display()))?;
        let b = Binaries {
            soya: soya.to_path_buf(),
            perf: dir.join("soya-perf"),
            wanem: dir.join("soya-wanem"),
        };
        for p in [&b.perf, &b.wanem] {
            if !p.is_file() {
                return Err(format!(
                    "{} not found: the demo runs soya-perf and soya-wanem from the directory of \
                     the soya binary; build the whole workspace first: \
                     cargo build --release --workspace",
                    p.display()
                ));
            }
        }
        Ok(b)
    }
}

impl DemoOptions {
    /// The requester's window in the throughput runs.
    pub fn window_packets(&self) -> u32 {
        self.window
            .unwrap_or_else(|| crate::demo_circuit::auto_window(self.rate_bps))
    }
}

/// Behind a rate the relays let packets leave up to this early in batches
/// and wake at most about once per this long (`soya-wanem --slack-us`),
/// and do not spin before a release (`--spin-us 0`): one 4 KiB packet is
/// due every 16 µs at 2 Gb/s, and releasing each on time cost the relay a
/// core of a 2-core machine (measured at 1 Gb/s: 1.0 core with slack
/// alone, 0.59 without the spin; at 2 Gb/s and 300 km, 0.7 of a core with
/// a wake-up per release, 0.3 with one per 100 µs).
pub(crate) const RELAY_SLACK_US: u32 = 100;

/// The gateways' `rate` of each WAN path: the emulated bottleneck when
/// there is one (as an operator configures a leased circuit's rate), else
/// 10 Gb/s.
pub(crate) fn path_rate(o: &DemoOptions) -> String {
    o.rate_bps.map_or("10gbit".into(), |r| format!("{r}bit"))
}

/// A flow's share of the deep buffer: 64 MiB, or with a rate four times
/// the paths' bandwidth-delay product (at least 8 MiB). The buffer is a
/// standing queue whenever the requester outruns the link, and the end-to-
/// end figure includes draining it: 64 MiB behind a 0.2 Gb/s link is 2.7 s.
pub(crate) fn flow_quota(o: &DemoOptions) -> String {
    match o.rate_bps {
        None => "64MiB".into(),
        Some(r) => {
            let rtt_s = 2.0 * o.distance_km * US_PER_KM * 1e-6;
            let bdp = r as f64 / 8.0 * rtt_s * f64::from(o.paths);
            let mib = (4.0 * bdp / f64::from(1 << 20)).ceil().clamp(8.0, 64.0);
            format!("{mib}MiB")
        }
    }
}

/// Gateways in the demo run at normal priority: by default a gateway raises
/// its device threads to nice -10, right for an appliance with cores of its
/// own but not when it shares two cores with the RoCE endpoints, whose
/// responder it would starve (measured: 1.05 Gb/s at 300 km instead of 2.2,
/// the responder's queue 10-40 ms deep).
pub(crate) fn demo_gateway_env(c: &mut Command) {
    c.env(soya::client::NORMAL_PRIORITY_ENV, "1");
}
