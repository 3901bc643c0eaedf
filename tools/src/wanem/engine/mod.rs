//! The forwarding engine: one thread per direction, or (TUN with slack)
//! one thread for both directions of a path, so that one wake-up serves
//! both (`run_dirs`; a direction's state and steps: `direction.rs`).
//!
//! Each loop: send every held packet whose release time has come (one
//! `sendmmsg`), read a batch of new packets (one `recvmmsg`) straight into
//! pooled buffers, run each through the [`Impairer`] to get its release
//! time, and hold it in a min-heap. When there is nothing to read, sleep
//! on the ingress socket with a nanosecond timer until the next release,
//! and busy-wait the last `spin` of it, so packets leave on time.
//!
//! Arrival times are the kernel's receive timestamps (`SO_TIMESTAMPNS`)
//! mapped onto the monotonic clock, so time a packet waited in the socket
//! while the thread was busy does not add to its delay.
//!
//! Engine threads run SCHED_FIFO while they keep up (when permitted; see
//! [`EngineOptions::realtime`]), else CFS at nice −20 with a short slice,
//! so that other work on the machine delays releases less. (On a kernel
//! without full preemption, only SCHED_FIFO preempts a running task at
//! once; a CFS wake-up may wait for the next tick.)
//!
//! Memory is bounded: at most `max_held` packet buffers of
//! `max_datagram` bytes, allocated as needed; a packet that finds none
//! free is dropped as `overflow`.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use soya_proto::time::Time;

mod direction;

use super::profile::describe;
use super::stats::{DirCounters, DirStats};
use crate::sim::link::LinkProfile;
use direction::Dir;
use soya_io::sys;
use soya_io::sys::batch::{RxMeta, SendOutcome};

/// Engine settings shared by every direction.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub seed: u64,
    /// Hard cap on packets held at once, per direction.
    pub max_held: usize,
    /// Largest datagram forwarded; longer ones are dropped as `oversize`.
    pub max_datagram: usize,
    /// Datagrams per `recvmmsg` / `sendmmsg`.
    pub batch: usize,
    /// Busy-wait this long before a release instead of sleeping.
    pub spin: Duration,
    /// A packet may leave this much before its release time, so that
    /// packets due close together (behind a rate: one every few µs) leave
    /// in one send after one wait instead of one each; and the engine
    /// wakes at most about once per `slack` (as a NIC's interrupt
    /// moderation does), reading what arrived meanwhile in one batch.
    /// Zero: on time, and a wake-up per arrival or release.
    pub slack: Duration,
    /// Socket send and receive buffer size.
    pub socket_buffer: usize,
    /// Run the engine threads SCHED_FIFO while they keep up (needs root
    /// or CAP_SYS_NICE; silently CFS otherwise), so other work on the
    /// machine cannot delay releases; a thread busy for more than 80 % of
    /// a 10 ms window drops to CFS (nice −20) until it is idle half the
    /// time again, so an overloaded engine cannot starve the machine.
    pub realtime: bool,
    /// UDP mode: receive coalesced datagrams (GRO) from senders that use
    /// GSO, and send runs of equal-size datagrams with GSO. Datagram
    /// boundaries are kept either way.
    pub offload: bool,
    /// TUN mode with slack: one thread serves both directions of a path,
    /// so one wake-up serves both (about 1.5x fewer CPU-seconds per Gb).
    /// Off by default: a TUN read has no kernel timestamp, so a packet
    /// that arrives while the thread sleeps out its slack after the other
    /// direction's work is stamped late, by up to the slack. Measured in
    /// `soya demo` (300 km, 100 µs slack): the direct run's RTT went from
    /// 2.93 to 3.03 ms and its goodput from 1.274 to 1.248 Gb/s.
    pub one_thread: bool,
}

impl Default for EngineOptions {
    fn default() -> EngineOptions {
        EngineOptions {
            seed: 1,
            max_held: 32_768,
            max_datagram: 9_216,
            batch: 64,
            spin: Duration::from_micros(50),
            slack: Duration::ZERO,
            socket_buffer: 16 << 20,
            realtime: true,
            offload: true,
            one_thread: false,
        }
    }
}

/// Emulator time: nanoseconds of CLOCK_MONOTONIC since the start.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch_mono: u64,
}

impl Clock {
    pub fn start() -> Clock {
        Clock {
            epoch_mono: sys::mono_ns(),
        }
    }

    pub fn now(&self) -> Time {
        Time::from_nanos(sys::mono_ns().saturating_sub(self.epoch_mono))
    }

    /// A CLOCK_REALTIME kernel timestamp on this clock, given a pair of
    /// readings of both clocks taken just now.
    pub(super) fn at_realtime(&self, rx_real: u64, real_now: u64, mono_now: u64) -> Time {
        let age = real_now.saturating_sub(rx_real);
        Time::from_nanos(mono_now.saturating_sub(age).saturating_sub(self.epoch_mono))
    }
}

/// One direction's packet source and sink.
pub trait PacketIo {
    /// Descriptor that becomes readable when packets arrive.
    fn rx_fd(&self) -> RawFd;

    /// Reads up to `bufs.len()` packets without blocking, packet `i` into
    /// `bufs[i]` (the buffers are all as long).
    fn recv(&mut self, bufs: &mut [&mut [u8]], meta: &mut [RxMeta]) -> io::Result<usize>;

    /// Bytes of packet `i` of the last batch beyond its buffer (UDP GRO
    /// batches); empty if the source has no landing area.
    fn landing(&self, _i: usize) -> &[u8] {
        &[]
    }

    /// Whether received packets carry kernel timestamps (then they may
    /// wait in the socket a little without losing their arrival time).
    fn kernel_timestamps(&self) -> bool {
        false
    }

    /// Packets the kernel dropped on the ingress side so far.
    fn kernel_drops(&self) -> u64 {
        0
    }

    /// Bytes in front of each packet that are not on the wire (a TUN
    /// device's virtio-net header): the buffers are this much longer, and
    /// neither the rate nor the counters see them.
    fn overhead(&self) -> usize {
        0
    }

    /// Writes packets to the egress side.
    fn send(&mut self, pkts: &[&[u8]]) -> SendOutcome;
}

/// SCHED_FIFO priority of engine threads with `realtime`.
pub const REALTIME_PRIORITY: i32 = 50;

/// Window over which an engine thread's busy share is judged.
const RT_WINDOW_NS: u64 = 10_000_000;

/// Packet buffers, allocated one by one as needed up to a cap and reused.
/// A buffer is owned by whoever holds it (the free list, the batch armed
/// for the next read, a held packet), so lending one to the I/O is a plain
/// borrow.
pub(super) struct Pool {
    slot: usize,
    free: Vec<Box<[u8]>>,
    allocated: usize,
    cap: usize,
}

impl Pool {
    pub(super) fn new(max_datagram: usize, cap: usize) -> Pool {
        Pool {
            slot: max_datagram.div_ceil(64) * 64,
            free: Vec::new(),
            allocated: 0,
            cap,
        }
    }

    pub(super) fn get(&mut self) -> Option<Box<[u8]>> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        if self.allocated >= self.cap {
            return None;
        }
        self.allocated += 1;
        Some(vec![0u8; self.slot].into_boxed_slice())
    }

    pub(super) fn put(&mut self, b: Box<[u8]>) {
        self.free.push(b);
    }
}

/// A packet waiting for its release time; the heap orders by `(release,
/// seq)` (`seq` is unique, so ties leave in arrival order).
pub(super) struct Held {
    pub release: Time,
    pub seq: u64,
    pub buf: Box<[u8]>,
    pub len: u32,
}

impl Held {
    fn key(&self) -> (Time, u64) {
        (self.release, self.seq)
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

impl PartialEq for Held {
    fn eq(&self, o: &Held) -> bool {
        self.key() == o.key()
    }
}

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Held) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Held {
    fn cmp(&self, o: &Held) -> std::cmp::Ordering {
        self.key().cmp(&o.key())
    }
}

/// `v` emptied, its allocation kept for elements of another type of the
/// same size (a vector of borrows for the next batch, whose lifetime
/// differs), so the loop allocates no vector per batch.
pub(super) fn recycle<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

/// Runs one direction until `stop` is set.
pub fn run<I: PacketIo>(
    io: I,
    profile: &LinkProfile,
    opts: &EngineOptions,
    clock: Clock,
    counters: &DirCounters,
    stop: &AtomicBool,
) {
    run_dirs(
        vec![Dir::new(io, profile, opts, counters)],
        opts,
        clock,
        stop,
    );
}

/// Runs `dirs` on this thread until `stop` is set: each turn releases
/// what is due and reads what arrived in every direction, and the wait
/// that follows serves them all (one wake-up, not one per direction).
fn run_dirs<I: PacketIo>(
    mut dirs: Vec<Dir<'_, I>>,
    opts: &EngineOptions,
    clock: Clock,
    stop: &AtomicBool,
) {
    sys::set_timer_slack(1);
    // Releases are only as punctual as the thread's wake-ups: ask for
    // priority over ordinary work (see `EngineOptions::realtime`).
    sys::set_normal_priority();
    let rt_capable = opts.realtime && sys::set_realtime(REALTIME_PRIORITY).is_ok();
    let mut rt_on = rt_capable;
    let mut window_start = sys::mono_ns();
    let mut slept = 0u64;
    let spin = opts.spin.as_nanos() as u64;
    // Wake-up moderation (see `EngineOptions::slack`). Why: on a virtual
    // machine a wake-up (timer programming, a context switch) costs far
    // more CPU than the datagrams it moves. Measured on this project's
    // 2-core VM, `soya demo` (300 km, 2 Gb/s): the relay's data thread
    // woke ~8,000 times a second and the relay took 0.7 of a core; with
    // one wake-up per 100-200 µs it took 0.3, and the run through Sōya,
    // which shares those cores, went from 0.70 to 0.94-0.98 of 0 km.
    let moderation = opts.slack.as_nanos() as u64;
    let mut last_wake = sys::mono_ns();
    // Whether anything was read or released since the last wake-up: only
    // then is there something to gather. An idle relay must block on its
    // socket; moderating with nothing to moderate woke it every `slack`
    // (measured: an idle 2 Gb/s relay with 100 µs slack took 15 % of a
    // core, the 0 km link of `soya demo` all through the runs at 300 km).
    let mut active = false;
    // While packets are held, a direction whose packets carry kernel
    // timestamps need not be watched (see step 4): the longest any may
    // wait, and the descriptors that must be watched.
    let defer = dirs.iter().map(|d| d.defer).min().unwrap_or(Duration::ZERO);
    let mut watch: Vec<libc::pollfd> = dirs
        .iter()
        .filter(|d| d.defer.is_zero())
        .map(|d| sys::pollfd(d.io.rx_fd(), libc::POLLIN))
        .collect();
    let mut all: Vec<libc::pollfd> = dirs
        .iter()
        .map(|d| sys::pollfd(d.io.rx_fd(), libc::POLLIN))
        .collect();

    while !stop.load(Ordering::Relaxed) {
        // 0. SCHED_FIFO only while the thread mostly waits.
        if rt_capable {
            let t = sys::mono_ns();
            let window = t - window_start;
            if window >= RT_WINDOW_NS {
                let busy = window.saturating_sub(slept) as f64 / window as f64;
                if rt_on && busy > 0.8 {
                    sys::set_normal_priority();
                    rt_on = false;
                    dirs[0].st.rt_demotions += 1;
                } else if !rt_on && busy < 0.5 {
                    rt_on = sys::set_realtime(REALTIME_PRIORITY).is_ok();
                }
                window_start = t;
                slept = 0;
            }
        }

        // 1. Release what is due (or within the slack of it), 2. read a
        //    batch, straight into free buffers, 3. publish counters.
        let mut n = 0;
        for d in &mut dirs {
            active |= d.release(&clock);
            n += d.read(&clock);
            d.publish(&clock);
        }
        if n > 0 {
            active = true;
            continue;
        }

        // 4. Nothing to read: wait for the next release. While packets are
        //    held, new ones need not be read the moment they arrive (their
        //    kernel timestamps keep their arrival time, and none can be due
        //    before `min_delay`): sleep without watching the socket and
        //    read what piled up on the next wake-up, so one wake-up serves
        //    many packets and a busy sender is not preempted per datagram.
        let wait_start = sys::mono_ns();
        let since_wake = wait_start.saturating_sub(last_wake);
        if let Some(rest) = moderated_wait(moderation, since_wake, active) {
            // Too soon after a wake-up that found work: let arrivals and
            // releases gather for the rest of the period, then serve them
            // together.
            sys::sleep_precise(rest);
            last_wake = sys::mono_ns();
            slept += last_wake - wait_start;
            for d in &mut dirs {
                d.st.wakeups += 1;
                d.st.moderated += 1;
            }
            active = false;
            continue;
        }
        active = false;
        let now = clock.now() + opts.slack;
        match dirs.iter().filter_map(|d| d.next_release()).min() {
            None => {
                let _ = sys::ppoll(&mut all, Some(Duration::from_millis(20)));
            }
            Some(release) if release > now => {
                let left = (release - now).as_nanos() as u64;
                if left > spin {
                    let sleep = Duration::from_nanos(left - spin).min(Duration::from_millis(20));
                    if defer.is_zero() {
                        let _ = sys::ppoll(&mut all, Some(sleep));
                    } else {
                        // Only the directions without kernel timestamps
                        // (none in practice: one thread, one kind of I/O).
                        let _ = sys::ppoll(&mut watch, Some(sleep.min(defer)));
                    }
                } else {
                    while clock.now() + opts.slack < release {
                        std::hint::spin_loop();
                    }
                    // Spinning is work, not waiting.
                    slept = slept.saturating_sub(sys::mono_ns() - wait_start);
                }
            }
            Some(_) => {}
        }
        last_wake = sys::mono_ns();
        slept += last_wake - wait_start;
        for d in &mut dirs {
            d.st.wakeups += 1;
        }
    }
    for d in &mut dirs {
        d.finish();
    }
}

/// Step 4's wake-up moderation: how long to sleep before looking again,
/// or `None` for the ordinary wait (on the socket, or until the next
/// release). Only a wake-up that found work (`active`: something read or
/// released since) is followed by a moderated sleep, for what is left of
/// the `moderation` period since it.
fn moderated_wait(moderation_ns: u64, since_wake_ns: u64, active: bool) -> Option<Duration> {
    (active && since_wake_ns < moderation_ns)
        .then(|| Duration::from_nanos(moderation_ns - since_wake_ns))
}

/// Direction `d` of path `index`: `opts` with a seed of its own.
fn dir_options(opts: &EngineOptions, index: usize, d: usize) -> EngineOptions {
    EngineOptions {
        seed: opts
            .seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(2 * index as u64 + d as u64),
        ..opts.clone()
    }
}

/// Runs one direction on its own thread: builds its I/O and calls [`run`].
pub type DirectionFn =
    Box<dyn FnOnce(&EngineOptions, Clock, &DirCounters, &AtomicBool, &LinkProfile) + Send>;

/// The direction that builds its I/O with `make_io` on its own thread (I/O
/// state such as batch headers stays with the thread that uses it) and
/// runs the engine over it.
pub fn direction<I: PacketIo>(make_io: impl FnOnce() -> I + Send + 'static) -> DirectionFn {
    Box::new(move |o, clock, counters, stop, prof| run(make_io(), prof, o, clock, counters, stop))
}

/// Runs both directions of a path on one thread (see `run_dirs`).
pub type PathFn = Box<
    dyn FnOnce([&EngineOptions; 2], Clock, [&DirCounters; 2], &AtomicBool, [&LinkProfile; 2])
        + Send,
>;

/// Both directions on one thread, their I/O (A→B, B→A) built by
/// `make_io` on it.
pub fn both_directions<I: PacketIo>(make_io: impl FnOnce() -> [I; 2] + Send + 'static) -> PathFn {
    Box::new(move |o, clock, c, stop, p| {
        let [a, b] = make_io();
        let dirs = vec![Dir::new(a, p[0], o[0], c[0]), Dir::new(b, p[1], o[1], c[1])];
        run_dirs(dirs, o[0], clock, stop)
    })
}

/// Counters of one path, both directions.
#[derive(Clone, Debug, Serialize)]
pub struct PathSnapshot {
    pub name: String,
    /// Side A (UDP: the listen address; TUN: the A device).
    pub a: String,
    /// Side B (UDP: the forward address; TUN: the B device).
    pub b: String,
    pub a_to_b_profile: String,
    pub b_to_a_profile: String,
    pub a_to_b: DirStats,
    pub b_to_a: DirStats,
}

/// Counters of every path.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub elapsed_s: f64,
    pub paths: Vec<PathSnapshot>,
}

struct RunningPath {
    name: String,
    a: String,
    b: String,
    profiles: [String; 2],
    counters: [Arc<DirCounters>; 2],
}

/// A running emulator: its paths' engine threads and counters. Stops (and
/// joins its threads) on [`Emulator::stop`] or when dropped.
pub struct Emulator {
    paths: Vec<RunningPath>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    clock: Clock,
    started: Instant,
}

impl Default for Emulator {
    fn default() -> Self {
        Self::new()
    }
}

impl Emulator {
    /// Starts the clock: times in profiles (link-down intervals) count
    /// from here.
    pub fn new() -> Emulator {
        Emulator {
            paths: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            clock: Clock::start(),
            started: Instant::now(),
        }
    }

    /// Starts a path's two directions (A→B, then B→A).
    pub fn add_path(
        &mut self,
        name: &str,
        a: String,
        b: String,
        dirs: [(LinkProfile, DirectionFn); 2],
        opts: &EngineOptions,
        index: usize,
    ) -> io::Result<()> {
        let counters = [
            Arc::new(DirCounters::default()),
            Arc::new(DirCounters::default()),
        ];
        let mut profiles = [String::new(), String::new()];
        for (d, (profile, f)) in dirs.into_iter().enumerate() {
            profiles[d] = describe(&profile);
            let o = dir_options(opts, index, d);
            let (c, stop, clock) = (counters[d].clone(), self.stop.clone(), self.clock);
            let t = std::thread::Builder::new()
                .name(format!("wanem-{name}-{}", ["a2b", "b2a"][d]))
                .spawn(move || f(&o, clock, &c, &stop, &profile))?;
            self.threads.push(t);
        }
        self.paths.push(RunningPath {
            name: name.to_string(),
            a,
            b,
            profiles,
            counters,
        });
        Ok(())
    }

    /// Starts a path's two directions on one thread (see `run_dirs`).
    pub fn add_path_one_thread(
        &mut self,
        name: &str,
        a: String,
        b: String,
        (profiles, f): ([LinkProfile; 2], PathFn),
        opts: &EngineOptions,
        index: usize,
    ) -> io::Result<()> {
        let counters = [
            Arc::new(DirCounters::default()),
            Arc::new(DirCounters::default()),
        ];
        let o = [dir_options(opts, index, 0), dir_options(opts, index, 1)];
        let described = [describe(&profiles[0]), describe(&profiles[1])];
        let (c, stop, clock) = (counters.clone(), self.stop.clone(), self.clock);
        let t = std::thread::Builder::new()
            .name(format!("wanem-{name}"))
            .spawn(move || {
                f(
                    [&o[0], &o[1]],
                    clock,
                    [&c[0], &c[1]],
                    &stop,
                    [&profiles[0], &profiles[1]],
                )
            })?;
        self.threads.push(t);
        self.paths.push(RunningPath {
            name: name.to_string(),
            a,
            b,
            profiles: described,
            counters,
        });
        Ok(())
    }

    /// UDP mode: the address clients of `path` send to (the real port if
    /// port 0 was asked for).
    pub fn listen_addr(&self, path: usize) -> SocketAddr {
        self.paths[path].a.parse().expect("a UDP path")
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            elapsed_s: self.started.elapsed().as_secs_f64(),
            paths: self
                .paths
                .iter()
                .map(|p| PathSnapshot {
                    name: p.name.clone(),
                    a: p.a.clone(),
                    b: p.b.clone(),
                    a_to_b_profile: p.profiles[0].clone(),
                    b_to_a_profile: p.profiles[1].clone(),
                    a_to_b: p.counters[0].snapshot(),
                    b_to_a: p.counters[1].snapshot(),
                })
                .collect(),
        }
    }

    /// Stops the engines and returns the final counters.
    pub fn stop(mut self) -> Snapshot {
        self.halt();
        self.snapshot()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::sync::Mutex;

    /// A source that hands out one GRO batch, once: `batch` holds datagrams
    /// of `seg` bytes (the last may be shorter); what does not fit the
    /// engine's buffer lands in the landing area, as with `RecvBatch`. The
    /// sink records every datagram sent.
    struct Fake {
        idle: UdpSocket,
        batch: Vec<u8>,
        seg: usize,
        land: Vec<u8>,
        given: bool,
        sent: Arc<Mutex<Vec<Vec<u8>>>>,
        /// Calls of `recv`: one per turn of the engine's loop.
        recvs: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl PacketIo for Fake {
        fn rx_fd(&self) -> RawFd {
            // Never readable: the engine's idle waits time out.
            self.idle.as_raw_fd()
        }

        fn recv(&mut self, bufs: &mut [&mut [u8]], meta: &mut [RxMeta]) -> io::Result<usize> {
            self.recvs.fetch_add(1, Ordering::Relaxed);
            if self.given {
                return Ok(0);
            }
            self.given = true;
            let head = bufs[0].len().min(self.batch.len());
            bufs[0][..head].copy_from_slice(&self.batch[..head]);
            self.land = self.batch[head..].to_vec();
            meta[0] = RxMeta {
                len: self.batch.len(),
                truncated: false,
                rx_real_ns: None,
                segment: Some(self.seg),
            };
            Ok(1)
        }

        fn landing(&self, _i: usize) -> &[u8] {
            &self.land
        }

        fn send(&mut self, pkts: &[&[u8]]) -> SendOutcome {
            let mut sent = self.sent.lock().unwrap();
            sent.extend(pkts.iter().map(|p| p.to_vec()));
            SendOutcome {
                sent: pkts.len(),
                sent_bytes: pkts.iter().map(|p| p.len()).sum(),
                failed: 0,
            }
        }
    }

    /// Runs one direction over `io` on its own thread until `done` (the
    /// 20 s bound only turns a hang into a failure), then stops it; its
    /// counters.
    fn run_until(
        io: Fake,
        profile: LinkProfile,
        opts: EngineOptions,
        done: impl Fn() -> bool,
    ) -> DirStats {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(DirCounters::default());
        let (s, c) = (stop.clone(), counters.clone());
        let t = std::thread::spawn(move || run(io, &profile, &opts, Clock::start(), &c, &s));
        let t0 = Instant::now();
        while !done() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        counters.snapshot()
    }

    /// Runs one direction over a [`Fake`] holding one 2,500-byte batch of
    /// 300-byte datagrams into 1,000-byte buffers (so datagrams lie in the
    /// buffer, across its end, and in the landing area) until `want`
    /// datagrams left; returns the batch and what left.
    fn forward_one_batch(profile: LinkProfile, want: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let batch: Vec<u8> = (0..2_500u32).map(|i| (i * 7 % 251) as u8).collect();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let io = Fake {
            idle: UdpSocket::bind("127.0.0.1:0").unwrap(),
            batch: batch.clone(),
            seg: 300,
            land: Vec::new(),
            given: false,
            sent: sent.clone(),
            recvs: Arc::default(),
        };
        let opts = EngineOptions {
            max_datagram: 1_000,
            realtime: false,
            ..EngineOptions::default()
        };
        // Wait for the datagrams (a correct engine sends them at once).
        run_until(io, profile, opts, || sent.lock().unwrap().len() >= want);
        let out = sent.lock().unwrap().clone();
        (batch, out)
    }

    #[test]
    fn moderation_follows_only_a_wake_up_that_found_work() {
        let us = |n| Duration::from_micros(n);
        assert_eq!(moderated_wait(100_000, 30_000, true), Some(us(70)));
        assert_eq!(moderated_wait(100_000, 30_000, false), None);
        assert_eq!(moderated_wait(100_000, 100_000, true), None);
        assert_eq!(moderated_wait(0, 0, true), None);
    }

    /// An idle relay blocks on its socket. Before, each moderated sleep
    /// was the wake-up the next one was measured from, so a relay with
    /// `--slack-us` and nothing to carry slept `slack` at a time forever
    /// (an idle 2 Gb/s relay with 100 µs: 15 % of a core). Here the engine
    /// idles behind a rate with 100 µs of slack until it has looked at its
    /// socket five times; none of those looks may follow a moderated sleep.
    #[test]
    fn an_idle_relay_does_not_moderate() {
        let recvs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let io = Fake {
            idle: UdpSocket::bind("127.0.0.1:0").unwrap(),
            batch: Vec::new(),
            seg: 1,
            land: Vec::new(),
            given: true,
            sent: Arc::default(),
            recvs: recvs.clone(),
        };
        let profile = LinkProfile::new(Duration::from_millis(1), Some(2_000_000_000));
        let opts = EngineOptions {
            realtime: false,
            slack: Duration::from_micros(100),
            spin: Duration::ZERO,
            ..EngineOptions::default()
        };
        let st = run_until(io, profile, opts, || recvs.load(Ordering::Relaxed) >= 5);
        assert!(
            recvs.load(Ordering::Relaxed) >= 5,
            "the engine never looked"
        );
        assert_eq!(st.moderated, 0, "{st:?}");
    }

    #[test]
    fn a_gro_batch_leaves_as_its_datagrams_in_order() {
        let (batch, out) = forward_one_batch(LinkProfile::new(Duration::ZERO, None), 9);
        let want: Vec<Vec<u8>> = batch.chunks(300).map(<[u8]>::to_vec).collect();
        assert_eq!(out.len(), want.len());
        for (i, (o, w)) in out.iter().zip(&want).enumerate() {
            assert!(o == w, "datagram {i} differs");
        }
    }

    #[test]
    fn a_duplicate_is_a_copy_of_its_datagram() {
        let profile = LinkProfile {
            duplicate: 1.0,
            ..LinkProfile::new(Duration::ZERO, None)
        };
        let (batch, mut out) = forward_one_batch(profile, 18);
        let mut want: Vec<Vec<u8>> = batch.chunks(300).map(<[u8]>::to_vec).collect();
        want.extend(want.clone());
        want.sort();
        out.sort();
        assert!(out == want, "{} datagrams, not each one twice", out.len());
    }
}
