//! The `soya-perf` command line.
//!
//! ```text
//! soya-perf server [--bind-ip IP] [--port P] [--once] [--json] [--quiet]
//!                  [--drain-timeout S]
//! soya-perf client [SERVER] [--port P] [--bind-ip IP]
//!                  [--op write|read|send|atomic|wait-send] [--size BYTES] [--tx-depth N]
//!                  [--qps N] [--duration S | --iters N] [--mtu M] [--lat] [--json]
//!                  [--stall-timeout S] [--send-after S]
//!
//! `--op wait-send`: the client posts receives only (nothing outstanding as
//! a requester) and waits for the server's SENDs: one at once, one
//! `--send-after` seconds later. Exit 0 when both arrived; 1, with the
//! error in the report (`"error"` in `--json`), when a receive completes in
//! error (its QP went to the error state, e.g. moved there by a gateway
//! whose twin was lost) or nothing happens within `--duration`.
//!
//! IP-in-UDP (each datagram one whole RoCEv2 IP packet, as a Sōya gateway's
//! lab `udp` backend speaks it; the RoCE address is --roce-ip, inside only):
//!   --gateway DC_LISTEN   through a gateway (announces --roce-ip to it)
//!   --peer UDP_ADDR       straight to a peer soya-perf or a soya-wanem relay
//!   --ip-in-udp           (server) answer wherever the datagrams came from
//! ```
//!
//! On an RDMA device (a build with the `verbs` feature; both sides):
//!   --verbs [--device DEV] [--gid-index N] [--qp-timeout N]
//!
//! Exit status: 0 when the run was clean (no data errors, every completion
//! successful), 1 when it was not or could not take place, 2 for usage
//! errors.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use soya_proto::roce::ip::ROCE_PORT;

use crate::perf::client::{run_client, ClientConfig, RunLimit};
use crate::perf::endpoint::Tunnel;
use crate::perf::exchange::DEFAULT_PORT;
use crate::perf::report::PerfReport;
use crate::perf::server::{Server, ServerConfig};
use crate::perf::workload::Op;
use crate::perf::{PerfError, ProgressTo, Transport};
use crate::size::parse_size;

/// A RoCEv2 RC endpoint in software (UDP port 4791, modelled on Linux rxe),
/// driven like perftest. Every payload carries a verifiable pattern, so loss,
/// duplication, corruption and misplacement are detected and reported.
#[derive(Parser, Debug)]
#[command(name = "soya-perf", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Wait for clients; serve one session at a time.
    Server(ServerArgs),
    /// Connect to a server and run a workload.
    Client(ClientArgs),
    /// The two-site demo (what `soya demo` runs; see `soya demo --help`).
    #[command(hide = true)]
    Demo(DemoArgs),
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// The `soya` binary (soya-perf and soya-wanem are looked up beside it).
    #[arg(long)]
    soya_bin: std::path::PathBuf,
    #[command(flatten)]
    demo: soya::demo_args::DemoArgs,
}

#[derive(Args, Debug)]
struct Common {
    /// This side's RoCE address: the UDP socket binds it on port 4791
    /// (any 127.x.y.z works on Linux loopback; one endpoint per address).
    #[arg(long)]
    bind_ip: Option<IpAddr>,
    /// TCP port of the out-of-band exchange.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// UDP port of the RoCE socket (4791 is RoCEv2; others only for tests).
    #[arg(long, default_value_t = ROCE_PORT, hide = true)]
    roce_port: u16,
    /// `udp` (RoCEv2 over a UDP socket) or `verbs` (an RDMA device; needs a
    /// build with the `verbs` feature).
    #[arg(long, default_value = "udp", value_parser = parse_transport)]
    transport: Transport,
    /// Run on an RDMA device through libibverbs (rxe, a ConnectX): the
    /// same as `--transport verbs`. Both sides need it; needs a build with
    /// the `verbs` cargo feature.
    #[arg(long)]
    verbs: bool,
    /// With --verbs: the RDMA device (default: the first; see `ibv_devices`).
    #[arg(long)]
    device: Option<String>,
    /// With --verbs: the GID index on port 1 (RoCEv2 over IPv4: the index of
    /// the IPv4-mapped RoCE v2 GID; see `ibv_devinfo -v` or `show_gids`).
    #[arg(long, default_value_t = 0)]
    gid_index: u8,
    /// With --verbs: the QP's ACK timeout exponent, 4.096 µs x 2^N
    /// (perftest's -u; 14 = 67 ms; use 18 above ~60 ms RTT).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    qp_timeout: u8,
    /// One JSON object (per session) on stdout; progress goes to stderr.
    #[arg(long)]
    json: bool,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
    /// Send with UDP GSO: runs of equal-size datagrams in one system call
    /// (faster on loopback). The kernel numbers the IPv4 IDs of the
    /// segments 0, 1, 2, ..., and the ICRC covers the ID, so a capture or a
    /// gateway may find bad ICRCs; soya-perf itself rebuilds the header.
    #[arg(long)]
    gso: bool,
    /// Busy-poll this many µs after the last activity before sleeping
    /// (lower latency; keeps a core busy meanwhile).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    busy_poll_us: u64,
    /// IP-in-UDP through a Sōya gateway: send every RoCEv2 IP packet as
    /// one UDP datagram to this `dc.listen` address (and announce there).
    /// The UDP socket binds --bind-ip (port --roce-port, 0 = any).
    #[arg(long, conflicts_with = "peer")]
    gateway: Option<SocketAddr>,
    /// IP-in-UDP straight to a peer soya-perf (or a `soya-wanem udp`
    /// relay) at this UDP address. A server in IP-in-UDP mode without
    /// --peer answers wherever the client's datagrams came from.
    #[arg(long)]
    peer: Option<SocketAddr>,
    /// IP-in-UDP mode without a fixed destination (servers: reply to the
    /// sender).
    #[arg(long)]
    ip_in_udp: bool,
    /// The RoCE address inside the datagrams in IP-in-UDP mode (e.g. a lab
    /// host 10.1.0.1); default: --bind-ip.
    #[arg(long)]
    roce_ip: Option<IpAddr>,
}

impl Common {
    fn transport(&self) -> Transport {
        if self.verbs {
            Transport::Verbs
        } else {
            self.transport
        }
    }

    #[cfg(feature = "verbs")]
    fn verbs_options(&self) -> crate::perf::verbs::VerbsOptions {
        crate::perf::verbs::VerbsOptions {
            device: self.device.clone(),
            gid_index: self.gid_index,
            qp_timeout: self.qp_timeout,
        }
    }

    fn tunnel(&self, bind_ip: IpAddr) -> Option<Tunnel> {
        let roce_ip = self.roce_ip.unwrap_or(bind_ip);
        match (self.gateway, self.peer) {
            (Some(g), _) => Some(Tunnel {
                roce_ip,
                to: Some(g),
                announce: true,
            }),
            (None, Some(p)) => Some(Tunnel {
                roce_ip,
                to: Some(p),
                announce: false,
            }),
            (None, None) if self.ip_in_udp || self.roce_ip.is_some() => Some(Tunnel {
                roce_ip,
                to: None,
                announce: false,
            }),
            (None, None) => None,
        }
    }
}

#[derive(Args, Debug)]
struct ServerArgs {
    #[command(flatten)]
    common: Common,
    /// Serve one session, then exit (status 0 if it was clean).
    #[arg(long)]
    once: bool,
    /// With --once: give up if no client comes within this many seconds.
    #[arg(long, value_parser = parse_secs)]
    accept_timeout: Option<Duration>,
    /// At the end of a WRITE/SEND session, wait at most this many seconds
    /// for the bytes the client completed to arrive (behind a gateway's
    /// pseudo-ACKs completion runs ahead of placement).
    #[arg(long, default_value = "10", value_parser = parse_secs)]
    drain_timeout: Duration,
    /// Testing aid: advertise a wrong R_Key so the client's WRITEs and
    /// READs fail with a remote access error.
    #[arg(long, hide = true)]
    wrong_rkey: bool,
}

#[derive(Args, Debug)]
struct ClientArgs {
    #[command(flatten)]
    common: Common,
    /// The server's control address (host or IP; port from --port).
    #[arg(default_value = "127.0.0.1")]
    server: String,
    /// RDMA operation: write, read, send or atomic (8-byte fetch-and-add);
    /// or wait-send: post receives only, nothing outstanding as a
    /// requester, and wait for the server's SENDs (one at once, one
    /// --send-after later). Succeeds when both arrive; fails with the error
    /// (exit 1, "error" in --json) when a receive completes in error
    /// because the QP went to the error state, or when --duration (default
    /// --send-after + 30 s) passes first.
    #[arg(long, default_value = "write")]
    op: Op,
    /// With --op wait-send: seconds between the server's first SEND and
    /// the second (the one the client waits for).
    #[arg(long, default_value = "1", value_parser = parse_secs)]
    send_after: Duration,
    /// Message size in bytes (suffixes K, KiB, M, MiB: powers of 1024).
    #[arg(long, default_value = "65536", value_parser = parse_size)]
    size: u32,
    /// Work requests outstanding per QP (default 128, 1 with --lat).
    #[arg(long)]
    tx_depth: Option<u32>,
    /// QPs in parallel.
    #[arg(long, default_value_t = 1)]
    qps: u32,
    /// PSNs the requester may have outstanding per QP: its window, in
    /// packets (rxe's RXE_MAX_UNACKED_PSNS, 128). Without a gateway that
    /// answers early, a window of W packets carries at most W x MTU per
    /// round trip, whatever the link's rate. Not for --transport verbs
    /// (the device decides).
    #[arg(long, default_value_t = crate::perf::DEFAULT_WINDOW,
          value_parser = clap::value_parser!(u32).range(1..=crate::perf::MAX_WINDOW as i64))]
    window: u32,
    /// Post new work for this many seconds (default 5 unless --iters).
    #[arg(long, value_parser = parse_secs, conflicts_with = "iters")]
    duration: Option<Duration>,
    /// Exactly this many messages per QP.
    #[arg(long)]
    iters: Option<u64>,
    /// Stop posting new work as soon as this file exists (a test ends a
    /// stream at an event), then finish what is outstanding, as at the end
    /// of --duration or --iters (whichever bound comes first).
    #[arg(long)]
    stop_file: Option<std::path::PathBuf>,
    /// Path MTU: 1024, 2048 or 4096.
    #[arg(long, default_value_t = 4096)]
    mtu: usize,
    /// Record post-to-completion latency of every message; report percentiles.
    #[arg(long)]
    lat: bool,
    /// Seconds to keep trying to reach the server.
    #[arg(long, default_value = "5", value_parser = parse_secs)]
    connect_timeout: Duration,
    /// Give up (and report a stall) when work is outstanding and nothing
    /// has completed for this many seconds.
    #[arg(long, default_value = "5", value_parser = parse_secs)]
    stall_timeout: Duration,
}

fn parse_transport(s: &str) -> Result<Transport, String> {
    match s {
        "udp" => Ok(Transport::Udp),
        "verbs" => Ok(Transport::Verbs),
        _ => Err(format!("unknown transport {s:?}: udp or verbs")),
    }
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
        return Err(format!("{s:?}: seconds must be in (0, 86400]"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn progress(c: &Common) -> ProgressTo {
    if c.quiet {
        ProgressTo::Off
    } else if c.json {
        ProgressTo::Stderr
    } else {
        ProgressTo::Stdout
    }
}

fn print_report(r: &PerfReport, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string(r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", r.human());
        if let Some(s) = &r.server {
            print!("{}", s.human());
        }
    }
}

fn fail(e: &PerfError) -> i32 {
    eprintln!("soya-perf: error: {e}");
    match e {
        PerfError::Usage(_) => 2,
        PerfError::Failed(_) => 1,
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, PerfError> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| PerfError::Usage(format!("server address {host:?}: {e}")))?
        .next()
        .ok_or_else(|| PerfError::Usage(format!("server address {host:?} resolves to nothing")))
}

fn client(a: ClientArgs) -> i32 {
    let c = &a.common;
    let server = match resolve(&a.server, c.port) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let bind_ip = c.bind_ip.unwrap_or_else(|| {
        // Next to a loopback server, take the next loopback address.
        match server.ip() {
            IpAddr::V4(v4) if v4.is_loopback() => {
                let o = v4.octets();
                let last = if o[3] == 2 { 3 } else { 2 };
                IpAddr::from([o[0], o[1], o[2], last])
            }
            ip => ip,
        }
    });
    let cfg = ClientConfig {
        server,
        bind_ip,
        roce_port: c.roce_port,
        transport: c.transport(),
        op: a.op,
        size: a.size,
        tx_depth: a.tx_depth.unwrap_or(if a.lat { 1 } else { 128 }),
        window: a.window,
        qps: a.qps,
        mtu: a.mtu,
        limit: match (a.iters, a.duration) {
            (Some(n), _) => RunLimit::Iters(n),
            (None, Some(d)) => RunLimit::Duration(d),
            (None, None) if a.op == Op::WaitSend => {
                RunLimit::Duration(a.send_after + Duration::from_secs(30))
            }
            (None, None) => RunLimit::Duration(Duration::from_secs(5)),
        },
        send_after: a.send_after,
        latency: a.lat,
        progress: progress(c),
        connect_timeout: a.connect_timeout,
        stall_timeout: a.stall_timeout,
        gso: c.gso,
        busy_poll: Duration::from_micros(c.busy_poll_us),
        tunnel: c.tunnel(bind_ip),
        stop_file: a.stop_file.clone(),
    };
    let run = if cfg.transport == Transport::Verbs {
        verbs_client(&cfg, c)
    } else {
        run_client(&cfg)
    };
    match run {
        Ok(r) => {
            print_report(&r, c.json);
            if r.ok {
                0
            } else {
                for e in &r.errors {
                    eprintln!("soya-perf: {e}");
                }
                1
            }
        }
        Err(e) => fail(&e),
    }
}

fn server(a: ServerArgs) -> i32 {
    let c = &a.common;
    let bind_ip = c.bind_ip.unwrap_or([127, 0, 0, 1].into());
    let cfg = ServerConfig {
        bind_ip,
        tunnel: c.tunnel(bind_ip),
        port: c.port,
        roce_port: c.roce_port,
        transport: c.transport(),
        progress: progress(c),
        accept_timeout: a.accept_timeout,
        drain_timeout: a.drain_timeout,
        wrong_rkey: a.wrong_rkey,
        gso: c.gso,
        busy_poll: Duration::from_micros(c.busy_poll_us),
        ..ServerConfig::default()
    };
    if cfg.transport == Transport::Verbs {
        return verbs_server(&cfg, c, a.once);
    }
    let mut srv = match Server::bind(cfg) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if !c.json {
        println!(
            "soya-perf server: control {} (TCP), RoCEv2 {} (UDP)",
            srv.control_addr(),
            srv.roce_addr()
        );
    }
    loop {
        let status = match srv.serve_one() {
            Ok(r) => {
                print_report(&r, c.json);
                i32::from(!r.ok)
            }
            Err(e) => fail(&e),
        };
        if a.once {
            return status;
        }
    }
}

#[cfg(feature = "verbs")]
fn verbs_client(cfg: &ClientConfig, c: &Common) -> Result<PerfReport, PerfError> {
    if cfg.window != crate::perf::DEFAULT_WINDOW {
        return Err(PerfError::Usage(
            "--window sets the software requester's window; with --transport verbs the device \
             decides its own"
                .into(),
        ));
    }
    crate::perf::verbs::run_client(cfg, &c.verbs_options())
}

#[cfg(not(feature = "verbs"))]
fn verbs_client(_: &ClientConfig, _: &Common) -> Result<PerfReport, PerfError> {
    Err(PerfError::Usage(crate::perf::VERBS_UNAVAILABLE.into()))
}

#[cfg(feature = "verbs")]
fn verbs_server(cfg: &ServerConfig, c: &Common, once: bool) -> i32 {
    let ctl = SocketAddr::new(cfg.bind_ip, cfg.port);
    let listener = match std::net::TcpListener::bind(ctl) {
        Ok(l) => l,
        Err(e) => {
            return fail(&PerfError::Failed(format!(
                "cannot listen on {ctl}: {e} (use --port)"
            )))
        }
    };
    let names = crate::perf::verbs::device_names();
    if names.is_empty() {
        return fail(&PerfError::Failed(
            "--verbs: no RDMA device found (for Soft-RoCE: modprobe rdma_rxe; \
             rdma link add rxe0 type rxe netdev ETH)"
                .into(),
        ));
    }
    if !c.json {
        println!(
            "soya-perf server: control {ctl} (TCP), verbs on {} (devices: {})",
            c.device.as_deref().unwrap_or(&names[0]),
            names.join(", ")
        );
    }
    loop {
        let status = match crate::perf::verbs::serve(cfg, &c.verbs_options(), &listener) {
            Ok(r) => {
                print_report(&r, c.json);
                i32::from(!r.ok)
            }
            Err(e) => fail(&e),
        };
        if once {
            return status;
        }
    }
}

#[cfg(not(feature = "verbs"))]
fn verbs_server(_: &ServerConfig, _: &Common, _: bool) -> i32 {
    fail(&PerfError::Usage(crate::perf::VERBS_UNAVAILABLE.into()))
}

/// Runs `soya-perf` with `args` (program name first); returns the exit status.
pub fn main_with_args(args: Vec<String>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match cli.command {
        Command::Server(a) => server(a),
        Command::Client(a) => client(a),
        Command::Demo(a) => crate::demo::main(&a.soya_bin, &a.demo),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_2() {
        let run = |a: &[&str]| {
            main_with_args(
                std::iter::once("soya-perf")
                    .chain(a.iter().copied())
                    .map(String::from)
                    .collect(),
            )
        };
        assert_eq!(run(&["client", "--op", "frob"]), 2);
        assert_eq!(run(&["client", "--op", "wait-send", "--iters", "2"]), 2);
        assert_eq!(
            run(&["client", "--op", "wait-send", "--send-after", "0"]),
            2
        );
        assert_eq!(run(&["client", "--iters", "5", "--duration", "1"]), 2);
        assert_eq!(
            run(&["client", "--mtu", "1500", "--connect-timeout", "0.1"]),
            2
        );
        if cfg!(not(feature = "verbs")) {
            assert_eq!(run(&["client", "--transport", "verbs"]), 2);
            assert_eq!(run(&["server", "--transport", "verbs"]), 2);
            assert_eq!(run(&["client", "--verbs"]), 2);
            assert_eq!(run(&["server", "--verbs", "--once"]), 2);
        }
        assert_eq!(run(&["client", "--verbs", "--qp-timeout", "0"]), 2);
        assert_eq!(run(&["client", "--stall-timeout", "0"]), 2);
        assert_eq!(run(&["server", "--drain-timeout", "x"]), 2);
        assert_eq!(run(&["--help"]), 0);
    }
}
