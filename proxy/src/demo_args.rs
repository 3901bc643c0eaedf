//! The two-site demo's arguments, declared once: `soya demo` parses them
//! and hands them on to `soya-perf demo` (the demo lives with the lab tools,
//! in their own crate), which parses the same struct.

/// The gateways' DC backend in the namespace demo.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoBackend {
    Tun,
    Xdp,
}

impl DemoBackend {
    pub fn name(self) -> &'static str {
        match self {
            DemoBackend::Tun => "tun",
            DemoBackend::Xdp => "xdp",
        }
    }
}

#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct DemoArgs {
    /// Fibre length between the two sites (4.9 µs one way per km).
    #[arg(long, default_value_t = 300.0)]
    pub distance_km: f64,
    /// Random loss probability on each WAN direction (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// WAN paths between the gateways.
    #[arg(long, default_value_t = 1)]
    pub paths: u32,
    /// Seconds of each throughput run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// RDMA WRITE size in bytes (K/M suffixes accepted).
    #[arg(long, default_value = "65536")]
    pub size: String,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Run between network namespaces: real RoCEv2 on UDP 4791, soya-wanem
    /// tun paths, kernel routing for the direct runs (needs root,
    /// /dev/net/tun, iproute2). The default when those are there.
    #[arg(long, conflicts_with = "loopback")]
    pub netns: bool,
    /// Run on loopback (the gateways' `udp` lab backend, no root): the
    /// default without root or iproute2.
    #[arg(long)]
    pub loopback: bool,
    /// The gateways' DC backend between namespaces: "xdp" (their XDP
    /// program takes the other site's traffic at the veth toward each
    /// host; the default) or "tun" (a routed tun device).
    #[arg(long, value_enum, conflicts_with = "loopback")]
    pub backend: Option<DemoBackend>,
    /// Rate of each emulated WAN path, a provisioned circuit: the gateways'
    /// paths are configured with it, and the 0 km run crosses a relay of the
    /// same rate, so only the distance differs. "auto" (the default) finds
    /// the circuit this machine carries: a run with no bottleneck, then
    /// short trials through Sōya (at most 2 Gb/s; the last line of the
    /// demo's set-up says what it measured), so that the circuit, not the
    /// CPU, bounds every run. "unlimited": no bottleneck, and every run
    /// measures this machine's CPU instead (through Sōya five processes
    /// share it).
    #[arg(long, default_value = "auto")]
    pub rate: String,
    /// The RDMA requester's window in packets (RXE_MAX_UNACKED_PSNS, 128
    /// in rxe): without Sōya it carries at most window x 4 KiB per round
    /// trip. "auto" (the default): 128 against a 2 Gb/s circuit, scaled
    /// down with a slower one, so that direct is bound by its window on
    /// any machine.
    #[arg(long, default_value = "auto")]
    pub window: String,
}

impl DemoArgs {
    /// The command line that parses back into these arguments.
    pub fn to_args(&self) -> Vec<String> {
        let valued = [
            ("--distance-km", self.distance_km.to_string()),
            ("--loss", self.loss.to_string()),
            ("--paths", self.paths.to_string()),
            ("--duration", self.duration.to_string()),
            ("--size", self.size.clone()),
            ("--rate", self.rate.clone()),
            ("--window", self.window.clone()),
        ];
        let mut v: Vec<String> = valued
            .into_iter()
            .flat_map(|(flag, value)| [flag.to_string(), value])
            .collect();
        if self.json {
            v.push("--json".into());
        }
        if self.netns {
            v.push("--netns".into());
        }
        if self.loopback {
            v.push("--loopback".into());
        }
        if let Some(b) = self.backend {
            v.push("--backend".into());
            v.push(b.name().into());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::DemoArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    #[test]
    fn to_args_parses_back() {
        let a = Cli::parse_from([
            "x",
            "--distance-km",
            "120.5",
            "--loss",
            "0.01",
            "--netns",
            "--backend",
            "xdp",
            "--rate",
            "1gbit",
            "--window",
            "32",
        ])
        .demo;
        let mut argv = vec!["x".to_string()];
        argv.extend(a.to_args());
        assert_eq!(Cli::parse_from(argv).demo, a);
    }
}
