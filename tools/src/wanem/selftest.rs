//! `soya-wanem selftest`: measures, on loopback, what the emulator promises.
//!
//! - Added-delay accuracy at 3 ms: probes are timestamped when sent
//!   (CLOCK_REALTIME) and by the receiver's kernel on arrival
//!   (`SO_TIMESTAMPNS`), once directly and once through a relay with
//!   `delay_ms = 3`; added delay = through-relay latency − median direct
//!   latency; error = added delay − 3 ms.
//! - Loss accuracy: datagrams through `loss = 0.1` and through a
//!   Gilbert-Elliott profile; measured loss against the expected rate, in
//!   binomial standard deviations.
//! - Capacity: back-to-back datagrams (4 KiB by default) from one sender
//!   thread, received by another; direct loopback first (baseline), then
//!   through the relay with a 3 ms delay, in the same run; then runs paced
//!   at 2.5, 5, 7.5 and 10 Gb/s through the relay, up to the first loss
//!   (>= 0.1 %) or the first rate the sender cannot reach. Once with a
//!   plain `sendmmsg` sender, once with a GSO sender and a GRO receiver.
//!
//! All traffic is on 127.0.0.1.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::engine::EngineOptions;
use super::profile::ProfileSpec;
use super::udp::{self, PathSpec};
use crate::sim::link::LinkProfile;
use soya_io::sys;
use soya_io::sys::batch::{RecvBatch, RxMeta, SendBatch};

/// What to measure.
#[derive(Clone, Debug)]
pub struct Options {
    /// Probe packets for the delay measurement (twice as many for loss).
    pub packets: usize,
    /// Spacing of delay probes.
    pub probe_interval: Duration,
    pub probe_size: usize,
    /// Length of each capacity run.
    pub capacity_time: Duration,
    /// Datagram size of the capacity runs.
    pub size: usize,
    /// Paced runs through the relay, bits per second, in increasing
    /// order; the sweep stops at the first rate not carried cleanly.
    pub paced_bps: Vec<u64>,
    /// Also measure the delay with the engine kept on CFS.
    pub compare_cfs: bool,
    /// Which measurements: delay, loss, capacity (all if empty).
    pub only: Vec<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            packets: 10_000,
            probe_interval: Duration::from_micros(100),
            probe_size: 512,
            capacity_time: Duration::from_secs(2),
            size: 4096,
            paced_bps: vec![2_500_000_000, 5_000_000_000, 7_500_000_000, 10_000_000_000],
            compare_cfs: true,
            only: Vec::new(),
        }
    }
}

/// Error statistics of a delay measurement, µs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DelayAccuracy {
    /// Engine (while it keeps up) and probe sender SCHED_FIFO.
    pub realtime: bool,
    pub target_us: f64,
    pub probes_sent: usize,
    pub probes_received: usize,
    /// Median one-way latency without the emulator.
    pub direct_p50_us: f64,
    /// Signed error of the added delay (measured − target).
    pub error_mean_us: f64,
    pub error_p50_us: f64,
    pub error_p1_us: f64,
    pub error_p99_us: f64,
    /// Largest |error|.
    pub error_max_abs_us: f64,
    /// Share of probes within ±50 µs of the target.
    pub within_50us: f64,
    /// The engine's own view: sends more than 50 µs after their release
    /// time, and the worst lateness.
    pub engine_late_over_50us: u64,
    pub engine_late_max_us: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LossAccuracy {
    pub profile: String,
    pub sent: u64,
    pub received: u64,
    pub measured_loss: f64,
    pub expected_loss: f64,
    /// (lost − expected) / sd of the loss count under the model.
    pub z: f64,
    /// Drops the relay counted (by reason), and by the kernel.
    pub relay_drop_loss: u64,
    pub relay_drop_burst: u64,
    pub kernel_drops: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Throughput {
    pub sent: u64,
    pub received: u64,
    pub gbps: f64,
    pub loss: f64,
    /// Drops of the receiving socket (it was not read fast enough), as the
    /// kernel counts them: a GSO batch of datagrams counts once.
    pub receiver_drops: u64,
    /// The relay's drops, its socket's included (counted as above).
    pub relay_drops: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PacedRun {
    pub target_gbps: f64,
    #[serde(flatten)]
    pub got: Throughput,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CapacityRun {
    pub sender: String,
    pub direct: Throughput,
    pub relay: Throughput,
    /// relay.gbps / direct.gbps
    pub ratio: f64,
    /// Sender paced at increasing rates through the relay.
    pub paced: Vec<PacedRun>,
    /// Highest rate delivered with < 0.1 % loss in the paced runs.
    pub lossless_gbps: f64,
    pub relay_kernel_drops: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Capacity {
    pub datagram_bytes: usize,
    pub seconds: f64,
    pub runs: Vec<CapacityRun>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub cores: usize,
    pub delay: Option<DelayAccuracy>,
    /// The same with the engine on CFS only (`--no-realtime`), if the
    /// default could use SCHED_FIFO.
    pub delay_cfs: Option<DelayAccuracy>,
    pub loss: Option<LossAccuracy>,
    pub burst_loss: Option<LossAccuracy>,
    pub capacity: Option<Capacity>,
}

impl Report {
    pub fn human(&self) -> String {
        let mut s = format!("soya-wanem selftest ({} cores, loopback)\n", self.cores);
        for d in self.delay.iter().chain(&self.delay_cfs) {
            s += &format!(
                "added delay{}, target {:.0} us, {} of {} probes: error mean {:+.1} us, p50 {:+.1} us, \
                 p1 {:+.1} us, p99 {:+.1} us, max |error| {:.1} us; {:.2} % within ±50 us \
                 (direct one-way latency p50 {:.1} us; engine: {} sends > 50 us late, worst {:.0} us)\n",
                if d.realtime {
                    " (default: engine SCHED_FIFO while it keeps up)"
                } else {
                    " (engine on CFS only)"
                },
                d.target_us,
                d.probes_received,
                d.probes_sent,
                d.error_mean_us,
                d.error_p50_us,
                d.error_p1_us,
                d.error_p99_us,
                d.error_max_abs_us,
                d.within_50us * 100.0,
                d.direct_p50_us,
                d.engine_late_over_50us,
                d.engine_late_max_us
            );
        }
        for l in self.loss.iter().chain(&self.burst_loss) {
            s += &format!(
                "loss [{}]: {} of {} lost = {:.4} (expected {:.4}, z = {:+.2}; relay counted loss {} burst {}, kernel drops {})\n",
                l.profile,
                l.sent - l.received,
                l.sent,
                l.measured_loss,
                l.expected_loss,
                l.z,
                l.relay_drop_loss,
                l.relay_drop_burst,
                l.kernel_drops
            );
        }
        let Some(c) = &self.capacity else {
            return s;
        };
        s += &format!(
            "capacity, {} B datagrams, {:.1} s per run, relay delay 3 ms:\n",
            c.datagram_bytes, c.seconds
        );
        for r in &c.runs {
            s += &format!(
                "  sender {}: direct {:.2} Gb/s (loss {:.2} %{}), through relay {:.2} Gb/s (loss {:.2} %{}), \
                 ratio {:.2}; relay socket drops {}\n    paced through relay:",
                r.sender,
                r.direct.gbps,
                r.direct.loss * 100.0,
                drops(&r.direct),
                r.relay.gbps,
                r.relay.loss * 100.0,
                drops(&r.relay),
                r.ratio,
                r.relay_kernel_drops
            );
            for p in &r.paced {
                s += &format!(
                    " {:.1} -> {:.2} Gb/s (loss {:.3} %{});",
                    p.target_gbps,
                    p.got.gbps,
                    p.got.loss * 100.0,
                    drops(&p.got)
                );
            }
            s += &format!(
                " carried without loss: {:.2} Gb/s{}\n",
                r.lossless_gbps,
                match r.paced.last() {
                    Some(p) if p.got.loss < 0.001 && p.got.gbps < 0.95 * p.target_gbps =>
                        " (the sender could go no faster)",
                    _ => "",
                }
            );
        }
        s
    }
}

/// Where the losses of a run were seen, if any.
fn drops(t: &Throughput) -> String {
    if t.receiver_drops + t.relay_drops == 0 {
        return String::new();
    }
    format!(
        ": receiver socket dropped {}, relay {}",
        t.receiver_drops, t.relay_drops
    )
}

fn loopback_socket() -> std::io::Result<UdpSocket> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.set_nonblocking(true)?;
    sys::tune_udp_socket(s.as_raw_fd(), 32 << 20);
    Ok(s)
}

/// A relay with the default engine options (SCHED_FIFO while it keeps
/// up, if permitted).
fn relay_to(forward: SocketAddr, spec: ProfileSpec) -> std::io::Result<super::engine::Emulator> {
    relay_with(forward, spec, true)
}

fn relay_with(
    forward: SocketAddr,
    spec: ProfileSpec,
    realtime: bool,
) -> std::io::Result<super::engine::Emulator> {
    let p: LinkProfile = spec.to_link();
    udp::start(
        vec![PathSpec {
            name: "selftest".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            forward,
            a_to_b: p.clone(),
            b_to_a: p,
        }],
        &EngineOptions {
            realtime,
            ..EngineOptions::default()
        },
    )
}

/// Sleeps until CLOCK_MONOTONIC reaches `t` (timer slack must be small).
fn sleep_until(t: u64) {
    let now = sys::mono_ns();
    if t > now {
        std::thread::sleep(Duration::from_nanos(t - now));
    }
}

/// One received probe: its send time (bytes 8..16) and the kernel's
/// receive timestamp.
#[derive(Clone, Copy)]
struct Rx {
    tx_real: u64,
    rx_real: u64,
}

/// Receives until `done` is set and nothing arrived for `idle`, or
/// `expect` datagrams arrived. Returns the records (if `keep`) and
/// (count, bytes, first rx mono ns, last rx mono ns).
fn receive(
    sock: UdpSocket,
    done: Arc<AtomicBool>,
    expect: u64,
    keep: bool,
    gro: bool,
) -> (Vec<Rx>, u64, u64, u64, u64, u64) {
    const B: usize = 64;
    let slot = if gro {
        sys::enable_gro(sock.as_raw_fd());
        65_536
    } else {
        9216
    };
    let mut bufs = vec![0u8; B * slot];
    let mut rb = RecvBatch::new(B, 0);
    let mut meta = vec![RxMeta::default(); B];
    let mut out = Vec::new();
    let (mut n, mut bytes, mut first, mut last) = (0u64, 0u64, 0u64, 0u64);
    let idle = 300_000_000u64;
    let mut last_seen = sys::mono_ns();
    loop {
        let mut slots: Vec<&mut [u8]> = bufs.chunks_mut(slot).collect();
        let got = rb
            .recv_into(sock.as_raw_fd(), &mut slots, &mut meta)
            .unwrap_or(0);
        let now = sys::mono_ns();
        if got > 0 {
            if n == 0 {
                first = now;
            }
            last = now;
            last_seen = now;
            for (i, m) in meta[..got].iter().enumerate() {
                n += m.segment.map_or(1, |g| m.len.div_ceil(g)) as u64;
                bytes += m.len as u64;
                if keep && m.len >= 16 {
                    let b = &bufs[i * slot..i * slot + 16];
                    out.push(Rx {
                        tx_real: u64::from_le_bytes(b[8..16].try_into().unwrap()),
                        rx_real: m.rx_real_ns.unwrap_or_else(sys::real_ns),
                    });
                }
            }
            if n >= expect {
                break;
            }
            continue;
        }
        if done.load(Ordering::Relaxed) && now - last_seen > idle {
            break;
        }
        sys::wait_readable(sock.as_raw_fd(), Duration::from_millis(20));
    }
    (out, n, bytes, first, last, rb.kernel_drops)
}

/// Sends `count` probes of `size` bytes, one every `interval`, each
/// carrying its sequence number and send time (CLOCK_REALTIME).
fn send_probes(
    to: SocketAddr,
    count: usize,
    size: usize,
    interval: Duration,
    realtime: bool,
) -> std::io::Result<()> {
    sys::set_timer_slack(1);
    if realtime {
        let _ = sys::set_realtime(super::engine::REALTIME_PRIORITY);
    }
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.connect(to)?;
    let mut buf = vec![0u8; size.max(16)];
    let t0 = sys::mono_ns();
    for i in 0..count {
        sleep_until(t0 + i as u64 * interval.as_nanos() as u64);
        buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
        buf[8..16].copy_from_slice(&sys::real_ns().to_le_bytes());
        let _ = s.send(&buf);
    }
    Ok(())
}

fn probe_latencies(
    to: SocketAddr,
    rx: UdpSocket,
    o: &Options,
    realtime: bool,
) -> std::io::Result<(Vec<f64>, usize)> {
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let expect = o.packets as u64;
    let h = std::thread::spawn(move || receive(rx, d2, expect, true, false));
    let (n, size, iv) = (o.packets, o.probe_size, o.probe_interval);
    // On its own thread, so a SCHED_FIFO policy does not stick to the caller.
    let r = std::thread::spawn(move || send_probes(to, n, size, iv, realtime))
        .join()
        .expect("sender");
    done.store(true, Ordering::Relaxed);
    let (recs, ..) = h.join().expect("receiver");
    r?;
    let lat: Vec<f64> = recs
        .iter()
        .map(|r| (r.rx_real as f64 - r.tx_real as f64) / 1e3)
        .collect();
    Ok((lat, recs.len()))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Delay accuracy at `target`.
pub fn measure_delay(
    o: &Options,
    target: Duration,
    realtime: bool,
) -> std::io::Result<DelayAccuracy> {
    let rx = loopback_socket()?;
    let (mut direct, _) = probe_latencies(rx.local_addr()?, rx, o, realtime)?;
    direct.sort_by(|a, b| a.total_cmp(b));
    let base = percentile(&direct, 0.5);

    let rx = loopback_socket()?;
    let relay = relay_with(
        rx.local_addr()?,
        ProfileSpec {
            delay_ms: Some(target.as_secs_f64() * 1e3),
            ..Default::default()
        },
        realtime,
    )?;
    let (lat, got) = probe_latencies(relay.listen_addr(0), rx, o, realtime)?;
    let engine = relay.stop().paths[0].a_to_b;
    let target_us = target.as_secs_f64() * 1e6;
    let mut err: Vec<f64> = lat.iter().map(|l| l - base - target_us).collect();
    err.sort_by(|a, b| a.total_cmp(b));
    let n = err.len().max(1) as f64;
    Ok(DelayAccuracy {
        realtime,
        target_us,
        probes_sent: o.packets,
        probes_received: got,
        direct_p50_us: base,
        error_mean_us: err.iter().sum::<f64>() / n,
        error_p50_us: percentile(&err, 0.5),
        error_p1_us: percentile(&err, 0.01),
        error_p99_us: percentile(&err, 0.99),
        error_max_abs_us: err.iter().fold(0.0, |m, e| m.max(e.abs())),
        within_50us: err.iter().filter(|e| e.abs() <= 50.0).count() as f64 / n,
        engine_late_over_50us: engine.late_over_50us,
        engine_late_max_us: engine.late_max_ns as f64 / 1e3,
    })
}

/// Expected loss rate and variance per packet of the loss count: random
/// loss `q` (binomial) or Gilbert-Elliott `[p, r, h]`, whose losses are
/// correlated: with π = p/(p+r) and λ = 1−p−r,
/// Var/n = πh(1−πh) + h²·π(1−π)·2λ/(1−λ).
pub fn expected_loss(spec: &ProfileSpec) -> (f64, f64) {
    if let Some([p, r, h]) = spec.ge {
        let pi = p / (p + r);
        let lambda = 1.0 - p - r;
        let m = pi * h;
        let corr = if lambda < 1.0 {
            2.0 * lambda / (1.0 - lambda)
        } else {
            0.0
        };
        (m, m * (1.0 - m) + h * h * pi * (1.0 - pi) * corr)
    } else {
        let q = spec.loss.unwrap_or(0.0);
        (q, q * (1.0 - q))
    }
}

/// Sends `count` datagrams through a relay with `spec` (random loss or
/// Gilbert-Elliott), paced so that no socket overflows, and compares the
/// loss with the model's expectation.
pub fn measure_loss(count: usize, spec: ProfileSpec, label: &str) -> std::io::Result<LossAccuracy> {
    let (expected, var) = expected_loss(&spec);
    let rx = loopback_socket()?;
    let relay = relay_to(rx.local_addr()?, spec)?;
    let to = relay.listen_addr(0);
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let h = std::thread::spawn(move || receive(rx, d2, u64::MAX, false, false));
    let r = send_probes(to, count, 256, Duration::from_micros(20), false);
    done.store(true, Ordering::Relaxed);
    let (_, got, ..) = h.join().expect("receiver");
    r?;
    let snap = relay.stop();
    let st = &snap.paths[0].a_to_b;
    let n = count as f64;
    let lost = n - got as f64;
    let sd = (n * var).sqrt().max(1e-9);
    Ok(LossAccuracy {
        profile: label.into(),
        sent: count as u64,
        received: got,
        measured_loss: lost / n,
        expected_loss: expected,
        z: (lost - n * expected) / sd,
        relay_drop_loss: st.drop_loss,
        relay_drop_burst: st.drop_burst,
        kernel_drops: st.drop_kernel,
    })
}

/// How the capacity runs' sender sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// `sendmmsg`, one datagram per message; receiver without GRO.
    Plain,
    /// `sendmmsg` with UDP GSO (15 datagrams of 4 KiB per message);
    /// receiver with UDP GRO.
    Gso,
}

/// Blasts (or, with `pace_bps`, paces) `size`-byte datagrams at `to` for
/// `time`, from one thread; `rx` counts what arrives.
pub fn blast(
    to: SocketAddr,
    rx: UdpSocket,
    size: usize,
    time: Duration,
    pace_bps: Option<u64>,
    sender: Sender,
) -> std::io::Result<Throughput> {
    let gso = sender == Sender::Gso;
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let h = std::thread::spawn(move || receive(rx, d2, u64::MAX, false, gso));
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.connect(to)?;
    sys::tune_udp_socket(s.as_raw_fd(), 32 << 20);
    sys::set_timer_slack(1);
    const B: usize = 60;
    let buf = vec![0x5au8; size];
    let pkts: Vec<&[u8]> = (0..B).map(|_| &buf[..]).collect();
    let mut sb = SendBatch::new(B, gso);
    let t0 = sys::mono_ns();
    let end = t0 + time.as_nanos() as u64;
    let mut n = 0u64;
    // Per batch, at the paced rate.
    let batch_ns = pace_bps.map(|r| (B * size) as u64 * 8 * 1_000_000_000 / r);
    let mut k = 0u64;
    while sys::mono_ns() < end {
        if let Some(b) = batch_ns {
            sleep_until(t0 + k * b);
            k += 1;
        }
        n += sb.send_slices(s.as_raw_fd(), &pkts, None).sent as u64;
    }
    done.store(true, Ordering::Relaxed);
    let (_, got, bytes, first, last, receiver_drops) = h.join().expect("receiver");
    let secs = (last.saturating_sub(first)).max(1) as f64 / 1e9;
    Ok(Throughput {
        sent: n,
        received: got,
        gbps: bytes as f64 * 8.0 / secs / 1e9,
        loss: if n > 0 {
            1.0 - got as f64 / n as f64
        } else {
            0.0
        },
        receiver_drops,
        relay_drops: 0,
    })
}

/// Direct, through the relay (3 ms), and paced through the relay.
pub fn measure_capacity(o: &Options, sender: Sender) -> std::io::Result<CapacityRun> {
    let rx = loopback_socket()?;
    let direct = blast(rx.local_addr()?, rx, o.size, o.capacity_time, None, sender)?;
    let three_ms = ProfileSpec {
        delay_ms: Some(3.0),
        ..Default::default()
    };
    let rx = loopback_socket()?;
    let relay = relay_to(rx.local_addr()?, three_ms.clone())?;
    let through = blast(
        relay.listen_addr(0),
        rx,
        o.size,
        o.capacity_time,
        None,
        sender,
    )?;
    let st = relay.stop().paths[0].a_to_b;
    let k1 = st.drop_kernel;
    let mut paced = Vec::new();
    let mut lossless_gbps = 0.0;
    let mut k2 = 0;
    for &bps in &o.paced_bps {
        let rx = loopback_socket()?;
        let relay = relay_to(rx.local_addr()?, three_ms.clone())?;
        let mut got = blast(
            relay.listen_addr(0),
            rx,
            o.size,
            o.capacity_time,
            Some(bps),
            sender,
        )?;
        let st = relay.stop().paths[0].a_to_b;
        got.relay_drops = st.dropped() + st.drop_kernel;
        k2 += st.drop_kernel;
        let target_gbps = bps as f64 / 1e9;
        let lossless = got.loss < 0.001;
        if lossless {
            lossless_gbps = f64::max(lossless_gbps, got.gbps);
        }
        // Stop at the first loss, or when the sender cannot go faster.
        let sender_limited = got.gbps < 0.95 * target_gbps;
        paced.push(PacedRun { target_gbps, got });
        if !lossless || sender_limited {
            break;
        }
    }
    Ok(CapacityRun {
        sender: match sender {
            Sender::Plain => "sendmmsg".into(),
            Sender::Gso => "sendmmsg+GSO, receiver GRO".into(),
        },
        ratio: through.gbps / direct.gbps.max(1e-9),
        direct,
        relay: through,
        paced,
        lossless_gbps,
        relay_kernel_drops: k1 + k2,
    })
}

/// Runs every measurement asked for.
pub fn run(o: &Options) -> std::io::Result<Report> {
    let want = |m: &str| o.only.is_empty() || o.only.iter().any(|x| x == m);
    let mut r = Report {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ..Report::default()
    };
    if want("delay") {
        // Whether this process may use SCHED_FIFO at all.
        let may = std::thread::spawn(|| sys::set_realtime(1).is_ok())
            .join()
            .unwrap_or(false);
        r.delay = Some(measure_delay(o, Duration::from_millis(3), may)?);
        if may && o.compare_cfs {
            r.delay_cfs = Some(measure_delay(o, Duration::from_millis(3), false)?);
        }
    }
    if want("loss") {
        let n = o.packets * 2;
        r.loss = Some(measure_loss(
            n,
            ProfileSpec {
                loss: Some(0.1),
                ..Default::default()
            },
            "loss 0.1",
        )?);
        r.burst_loss = Some(measure_loss(
            n,
            ProfileSpec {
                ge: Some([0.01, 0.25, 0.5]),
                ..Default::default()
            },
            "ge 0.01,0.25,0.5",
        )?);
    }
    if want("capacity") {
        r.capacity = Some(Capacity {
            datagram_bytes: o.size,
            seconds: o.capacity_time.as_secs_f64(),
            runs: vec![
                measure_capacity(o, Sender::Plain)?,
                measure_capacity(o, Sender::Gso)?,
            ],
        });
    }
    Ok(r)
}
