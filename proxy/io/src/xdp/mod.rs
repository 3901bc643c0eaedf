//! The `xdp` DC backend: AF_XDP sockets, one per shard, fed by an XDP
//! steering program. L3 in, L3 out, like `tun`: Ethernet is stripped on
//! receive and added on transmit.
//!
//! ```text
//!             NIC / veth RX queue 0
//!                     │ XDP program (proxy/io/xdp/steer.bpf.c)
//!        ┌────────────┼─────────────────────────┐
//!  src ∈ local_prefixes and dst ∈ remote_prefixes?   else XDP_PASS → kernel
//!        │ yes: XSKMAP[shard_of_pair(src, dst) % shards]   (ARP, ND, ssh, ...)
//!   ┌────┴────┬─────────┐
//!  xsk 0     xsk 1 ... xsk n-1     one AF_XDP socket per shard, each with
//!  (shard 0) (shard 1)             its own RX and TX ring, all bound to
//!                                  (interface, queue 0) on one shared UMEM
//! ```
//!
//! - **Steering.** The program reimplements `shard_of_pair` (the host-pair
//!   hash both sites use); prefixes reach it through LPM-trie maps filled
//!   at load. Each shard reads only its own socket, so there is no
//!   shard-to-shard handoff with this backend (`reads_dc` for every shard).
//! - **Several shards on one queue.** An AF_XDP socket receives only from
//!   the (interface, queue) it is bound to, and a veth has one RX queue
//!   (the queue a packet lands on is chosen by the sender, not by us).
//!   So every shard's socket binds to queue 0: the first registers the
//!   UMEM, the others bind with `XDP_SHARED_UMEM`. Sockets sharing a UMEM
//!   on the same queue share its fill and completion rings (the kernel
//!   keeps one buffer pool per queue); those two rings and the free-chunk
//!   list sit behind one mutex, taken once per batch. RX and TX rings are
//!   per socket, lock-free. A redirect into a socket bound to another queue
//!   than the packet's is dropped by the kernel, so the interface must have
//!   one RX queue: startup refuses one with more (`ethtool -L IF combined
//!   1`; a veth is made with `numrxqueues 1 numtxqueues 1` on both ends --
//!   by default a veth has one queue per CPU and the sender's flow hash
//!   picks the queue). One socket per (shard, queue) on a multi-queue NIC
//!   is future work.
//! - **4.2 KB frames.** The kernel takes UMEM chunks up to a page (4 KiB)
//!   unless the memory is HugeTLB. We use 4 KiB chunks and multi-buffer
//!   AF_XDP (`XDP_USE_SG`, Linux ≥ 6.6; the program is `xdp.frags`): a
//!   frame of a 4096-byte path MTU arrives as two descriptors, chained by
//!   `XDP_PKT_CONTD`. RX buffers sit on a "tape" ([`tape`]) where such a
//!   frame is usually contiguous and is lent to the site in place; else it
//!   is gathered into the caller's buffer. Single-buffer frames are handed
//!   over borrowed. On TX a long frame is written over two chunks.
//! - **L2 headers** come from the kernel's route and neighbour tables over
//!   rtnetlink ([`neigh`]).
//! - **Zero-copy** is asked for first; where the driver does not offer it
//!   (veth, most virtual devices) the socket is bound in copy mode. The
//!   program attaches in native (driver) mode, else generic. Both are in
//!   [`XdpDc::describe`] and [`XdpDc::mode`].
//! - **Failures** (no such interface, no privileges, old kernel, attach
//!   refused) fail startup with the cause and the `tun` alternative.
//!
//! Every `unsafe` of this backend is in [`xsk`] (rings, UMEM, socket
//! options, `Area::lend_run`: UMEM as the `&'static mut [u8]` runs the
//! protocol's packet buffers hold) and [`program`] (BPF_PROG_TEST_RUN),
//! but for the two calls of `lend_run` ([`lend`], [`tape`]), each with
//! the argument that makes it sound, and `if_nametoindex` here.

pub mod lend;
pub mod neigh;
pub mod program;
pub mod tape;
pub mod unresolved;
pub mod xsk;

use soya_proto::buffer::{LendSource, LenderRef, PacketBuf};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use soya_config::Prefix;

use crate::dcrx::DcRx;
use neigh::Neighbours;
use program::Steering;
use xsk::{Area, Ring, CHUNK};

/// Entries of each socket's RX and TX ring.
const RING: u32 = 2048;
/// Entries of the shared fill and completion rings.
const FILL: u32 = 4096;
/// Descriptors read per batch.
const RX_BATCH: u32 = 64;
/// TX descriptors staged before the kernel is kicked.
const TX_KICK: u32 = 64;
/// Chunks a shard takes from the shared free list at a time.
const TX_TAKE: usize = 256;
const ETH: usize = 14;
/// Most tape slots (3840 bytes each) that frames lent in place may hold,
/// on top of those the fill and RX rings need: 16384 slots, 60 MiB, 8192
/// 4.2 KB frames held at once (about the requests in flight over 300 km
/// at 100 Gb/s); past that frames are gathered (one copy each, counted).
/// With 8192, forward.py's two pairs of 128 outstanding 64 KiB WRITEs
/// found the budget spent for 3.6 % of their frames. See [`tape`] and
/// [`tape_hold_for`].
const TAPE_HOLD: usize = 16384;

/// Tape slots to hold for a site whose deep buffer has `slots` slots: the
/// requests held at gateway A are bounded by the slots (one each, two tape
/// slots per 4.2 KB frame), so a small buffer gets a small tape; capped at
/// [`TAPE_HOLD`] (the UMEM is committed memory).
pub fn tape_hold_for(slots: u64) -> usize {
    slots.saturating_mul(2).min(TAPE_HOLD as u64) as usize
}

/// What the shards share: the UMEM area and its fill/completion rings.
struct Shared {
    umem: Mutex<UmemRings>,
    /// The RX tape's slot states (also in every buffer lent from it).
    slots: Arc<tape::Slots>,
    steering: Mutex<Steering>,
    interface: String,
    zero_copy: bool,
    shards: usize,
    /// The runs of `area` lent to the site's pools (`lend`).
    lend: lend::Regions,
    /// Declared last: unmapped after everything that points into it (the
    /// buffers lent from the tape keep it mapped too).
    area: Arc<Area>,
}

struct UmemRings {
    fill: Ring<u64>,
    comp: Ring<u64>,
    /// Chunks owned by nobody (completed TX, never used).
    free: Vec<u64>,
    /// The RX side of the UMEM: the fill ring's addresses ([`tape`]).
    tape: tape::Tape,
}

impl UmemRings {
    /// Moves completed TX chunks to the free list; a lent region's
    /// completions go to its count (`lend`).
    fn reap(&mut self, lend: &lend::Regions) {
        let n = self.comp.ready();
        for k in 0..n {
            let addr = self.comp.peek(k);
            match lend.of_offset(addr) {
                Some(r) => lend.completed(r),
                None => self.free.push(chunk_of(addr)),
            }
        }
        if n > 0 {
            self.comp.release(n);
        }
    }
}

fn chunk_of(addr: u64) -> u64 {
    addr & !(CHUNK as u64 - 1)
}

/// Counters of one shard's socket.
#[derive(Clone, Copy, Debug, Default)]
pub struct XdpStats {
    pub rx_packets: u64,
    pub rx_multi_buffer: u64,
    /// Multi-buffer frames lent to the site where the kernel wrote them
    /// (contiguous on the tape): no copy.
    pub rx_in_place: u64,
    /// Multi-buffer frames gathered (one copy) because they straddle a
    /// break in the tape (a held slot skipped, or the wrap).
    pub rx_gathered_break: u64,
    /// Multi-buffer frames gathered (one copy) because the tape's budget
    /// of held slots was spent.
    pub rx_gathered_full: u64,
    /// Frames dropped: longer than the caller's buffer, or not IP.
    pub rx_dropped: u64,
    pub tx_packets: u64,
    /// Packets not sent: no free chunk or TX ring slot.
    pub tx_full: u64,
    /// Packets not sent for want of a neighbour entry: the hold queue was
    /// full, or the kernel found none within [`unresolved::WAIT`].
    pub tx_no_neighbour: u64,
    /// Packets held while the kernel resolved their host, then sent.
    pub tx_held: u64,
    /// Packets sent from where they were decoded (a lent UMEM run), by
    /// offset: no copy.
    pub tx_in_place: u64,
    /// Packets in a lent run sent by copying (the run was still being
    /// sent: a resend before the previous send completed).
    pub tx_busy_copied: u64,
}

/// One shard's AF_XDP socket.
pub struct XdpDc {
    shard: usize,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fd: OwnedFd,
    neigh: Neighbours,
    /// Chunks this shard owns for TX.
    tx_free: Vec<u64>,
    /// Tape slots read from RX and done with, to free.
    rx_done: Vec<usize>,
    /// Lends frames in place from the tape.
    lender: LenderRef,
    tx_unkicked: u32,
    /// Packets waiting for their host's neighbour entry.
    unresolved: unresolved::Unresolved,
    pub stats: XdpStats,
    /// Declared last: the sockets and rings above go first.
    shared: Arc<Shared>,
}

impl std::fmt::Debug for XdpDc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpDc")
            .field("shard", &self.shard)
            .field("interface", &self.shared.interface)
            .field("stats", &self.stats)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why the backend could not start, with the cause and the alternative.
fn failure(interface: &str, what: impl std::fmt::Display, kind: io::ErrorKind) -> io::Error {
    io::Error::new(
        kind,
        format!(
            "dc.backend = \"xdp\" on {interface}: {what}; fix that, or use dc.backend = \"tun\""
        ),
    )
}

/// The running kernel's (major, minor) version.
fn kernel_version() -> Option<(u32, u32)> {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut it = r.trim().split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// RX queues of interface `name` (sysfs); 1 when unknown.
fn rx_queues(name: &str) -> usize {
    std::fs::read_dir(format!("/sys/class/net/{name}/queues")).map_or(1, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
            .count()
            .max(1)
    })
}

fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string for the call's duration.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// Opens the backend: one socket per shard on `interface`, the steering
/// program loaded, its maps filled and attached; its UMEM sized for a deep
/// buffer of `buffer_slots` slots (the RX tape's held frames at gateway A,
/// the regions lent to the WAN decode at gateway B).
pub fn open_shards(
    interface: &str,
    shards: usize,
    local: &[Prefix],
    remote: &[Prefix],
    buffer_slots: u64,
) -> io::Result<Vec<XdpDc>> {
    let lend_regions = lend::regions_for(buffer_slots, shards);
    let hold = tape_hold_for(buffer_slots);
    open_with_hold(interface, shards, local, remote, lend_regions, hold)
}

/// [`open_shards`] with `hold` tape slots for frames lent in place (the
/// tests take a small tape through its wrap and past its budget).
fn open_with_hold(
    interface: &str,
    shards: usize,
    local: &[Prefix],
    remote: &[Prefix],
    lend_regions: usize,
    hold: usize,
) -> io::Result<Vec<XdpDc>> {
    let Some(ifindex) = ifindex(interface) else {
        return Err(failure(
            interface,
            "no such network interface",
            io::ErrorKind::NotFound,
        ));
    };
    let queues = rx_queues(interface);
    if queues > 1 {
        return Err(failure(
            interface,
            format!(
                "it has {queues} RX queues, and the AF_XDP sockets are bound to queue 0 only \
                 (packets the NIC or the veth peer puts on another queue would be lost): give \
                 it one (`ethtool -L {interface} combined 1`; a veth: create both ends with \
                 `numrxqueues 1 numtxqueues 1`)"
            ),
            io::ErrorKind::InvalidInput,
        ));
    }
    match kernel_version() {
        Some(v) if v >= (6, 6) => {}
        Some((a, b)) => {
            return Err(failure(
                interface,
                format!(
                    "Linux {a}.{b} is too old: multi-buffer AF_XDP (XDP_USE_SG, for RoCE \
                     frames above 4 KiB) needs Linux 6.6 or later"
                ),
                io::ErrorKind::Unsupported,
            ))
        }
        None => {}
    }
    let mut steering = Steering::load(local, remote, shards)
        .map_err(|e| failure(interface, e, io::ErrorKind::PermissionDenied))?;
    // The UMEM: the RX tape (enough slots for the fill and RX rings to be
    // full while TAPE_HOLD slots are held), then one TX chunk per TX ring
    // entry, then the regions lent to the site's pools (`lend`), each
    // starting on a 4 KiB boundary.
    let reserve = FILL as usize + shards * RING as usize;
    let tape_slots = reserve + hold;
    let tape_bytes = tape::bytes(tape_slots);
    let tx_chunks = shards * RING as usize;
    let lend_first = (tape_bytes + tx_chunks * CHUNK).next_multiple_of(CHUNK);
    let umem_bytes = lend_first + lend::Regions::bytes(lend_regions);
    let area = Area::new(umem_bytes).map_err(|e| {
        failure(
            interface,
            format!("UMEM of {} MiB: {e}", umem_bytes >> 20),
            io::ErrorKind::OutOfMemory,
        )
    })?;
    let area = Arc::new(area);
    let sock_err = |e: io::Error| {
        let why = match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => {
                "an AF_XDP socket needs root or CAP_NET_ADMIN (and CAP_BPF)".to_string()
            }
            Some(libc::EAFNOSUPPORT) => "this kernel has no AF_XDP (CONFIG_XDP_SOCKETS)".into(),
            _ => format!("AF_XDP socket: {e}"),
        };
        failure(interface, why, io::ErrorKind::PermissionDenied)
    };
    let mut fds = Vec::with_capacity(shards);
    let mut rings = Vec::with_capacity(shards);
    let first = xsk::socket().map_err(sock_err)?;
    xsk::register_umem(first.as_raw_fd(), &area).map_err(sock_err)?;
    xsk::set_ring_size(first.as_raw_fd(), libc::XDP_UMEM_FILL_RING, FILL).map_err(sock_err)?;
    xsk::set_ring_size(first.as_raw_fd(), libc::XDP_UMEM_COMPLETION_RING, FILL)
        .map_err(sock_err)?;
    let (mut fill, comp) = xsk::umem_rings(first.as_raw_fd(), FILL).map_err(sock_err)?;
    fds.push(first);
    for _ in 1..shards {
        fds.push(xsk::socket().map_err(sock_err)?);
    }
    for fd in &fds {
        xsk::set_ring_size(fd.as_raw_fd(), libc::XDP_RX_RING, RING).map_err(sock_err)?;
        xsk::set_ring_size(fd.as_raw_fd(), libc::XDP_TX_RING, RING).map_err(sock_err)?;
        rings.push(xsk::socket_rings(fd.as_raw_fd(), RING).map_err(sock_err)?);
    }
    // Zero-copy where the driver has it, copy mode otherwise.
    let base = libc::XDP_USE_SG | libc::XDP_USE_NEED_WAKEUP;
    let bound = xsk::bind(
        fds[0].as_raw_fd(),
        ifindex,
        0,
        base | libc::XDP_ZEROCOPY,
        None,
    );
    let zero_copy = match bound {
        Ok(()) => true,
        Err(e) => {
            tracing::info!(interface, error = %e, "xdp: no zero-copy on this driver; copy mode");
            xsk::bind(fds[0].as_raw_fd(), ifindex, 0, base | libc::XDP_COPY, None).map_err(
                |e| {
                    let why = match e.raw_os_error() {
                        Some(libc::EINVAL) => format!(
                            "binding the AF_XDP socket to queue 0 failed ({e}; a kernel without \
                         multi-buffer AF_XDP, Linux < 6.6?)"
                        ),
                        Some(libc::EBUSY) => format!(
                            "queue 0 already has an AF_XDP socket ({e}; another soya running?)"
                        ),
                        _ => format!("binding the AF_XDP socket to queue 0: {e}"),
                    };
                    failure(interface, why, io::ErrorKind::Other)
                },
            )?;
            false
        }
    };
    for fd in &fds[1..] {
        xsk::bind(
            fd.as_raw_fd(),
            ifindex,
            0,
            libc::XDP_SHARED_UMEM,
            Some(fds[0].as_raw_fd()),
        )
        .map_err(|e| {
            failure(
                interface,
                format!("binding a shard's socket (shared UMEM): {e}"),
                io::ErrorKind::Other,
            )
        })?;
    }
    // The fill ring gets the tape's first FILL slots; the chunks after the
    // tape are for TX.
    let free: Vec<u64> = (0..tx_chunks)
        .map(|i| (tape_bytes + i * CHUNK) as u64)
        .collect();
    let slots = Arc::new(tape::Slots::new(tape_slots, hold));
    let mut tape = tape::Tape::new(slots.clone());
    tape.refill(&mut fill);
    let lender = tape::lender(&slots, &area);
    for (i, fd) in fds.iter().enumerate() {
        steering
            .set_socket(i, fd)
            .map_err(|e| failure(interface, e, io::ErrorKind::Other))?;
    }
    steering
        .attach(interface)
        .map_err(|e| failure(interface, e, io::ErrorKind::Other))?;
    tracing::info!(
        interface,
        shards,
        attach = steering.attach_mode,
        mode = if zero_copy { "zero-copy" } else { "copy" },
        "xdp: steering program attached, AF_XDP sockets bound"
    );
    let shared = Arc::new(Shared {
        umem: Mutex::new(UmemRings {
            fill,
            comp,
            free,
            tape,
        }),
        slots,
        steering: Mutex::new(steering),
        interface: interface.to_string(),
        zero_copy,
        shards,
        lend: lend::Regions::new(lend_first as u64, lend_regions),
        area,
    });
    let mut out = Vec::with_capacity(shards);
    for (shard, (fd, (rx, tx))) in fds.into_iter().zip(rings).enumerate() {
        out.push(XdpDc {
            shard,
            rx,
            tx,
            fd,
            neigh: Neighbours::new(interface, ifindex)
                .map_err(|e| failure(interface, format!("rtnetlink: {e}"), io::ErrorKind::Other))?,
            tx_free: Vec::with_capacity(TX_TAKE * 2),
            rx_done: Vec::with_capacity(RX_BATCH as usize * 3),
            lender: lender.clone(),
            tx_unkicked: 0,
            unresolved: Default::default(),
            stats: XdpStats::default(),
            shared: shared.clone(),
        });
    }
    Ok(out)
}

impl XdpDc {
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Where the site's pools take buffers (`Site::set_lender`): runs of
    /// this UMEM, sent in place. `None` when none were sized.
    pub fn lend_source(&self) -> Option<Arc<dyn LendSource>> {
        (self.shared.lend.bytes_lent() > 0)
            .then(|| Arc::new(lend::UmemSource::new(self.shared.clone())) as Arc<dyn LendSource>)
    }

    /// The lent regions' counters (all shards) and how many are out.
    pub fn lend_counters(&self) -> (&lend::LendCounters, usize) {
        (&self.shared.lend.counters, self.shared.lend.out())
    }

    /// "zero-copy" or "copy": how the socket moves packets.
    pub fn mode(&self) -> &'static str {
        if self.shared.zero_copy {
            "zero-copy"
        } else {
            "copy"
        }
    }

    /// How the steering program is attached: "native" or "generic".
    pub fn attach_mode(&self) -> &'static str {
        lock(&self.shared.steering).attach_mode
    }

    pub fn describe(&self) -> String {
        format!(
            "xdp {} queue 0, socket {}/{}, {} mode, {} attach, {CHUNK}-byte chunks, multi-buffer",
            self.shared.interface,
            self.shard,
            self.shared.shards,
            self.mode(),
            self.attach_mode(),
        )
    }

    /// Packets the program steered to each shard (all shards' view).
    pub fn steered(&self) -> Vec<u64> {
        lock(&self.shared.steering).steered(self.shared.shards)
    }

    /// What the kernel dropped before this socket read it: RX ring full,
    /// no fill buffer, invalid descriptors (XDP_STATISTICS).
    pub fn kernel_drops(&self) -> u64 {
        xsk::statistics(self.fd.as_raw_fd()).map_or(0, |s| {
            s.rx_dropped + s.rx_ring_full + s.rx_fill_ring_empty_descs
        })
    }

    /// Reads up to one batch of frames; calls `f` with each IP packet.
    /// Returns the packets read and whether the RX ring was emptied.
    ///
    /// A frame in one buffer is handed over borrowed, its slot freed after
    /// the batch. A multi-buffer frame contiguous on the tape is handed over
    /// in place, lent ([`tape`]); one that is not (or past the tape's
    /// budget) is gathered into a buffer the site lent, else into `buf`.
    pub fn recv_batch(
        &mut self,
        buf: &mut [u8],
        lent: &mut Vec<PacketBuf>,
        mut f: impl FnMut(DcRx<'_>),
    ) -> (usize, bool) {
        let ready = self.rx.ready();
        let n = ready.min(RX_BATCH);
        let mut k = 0;
        let mut packets = 0;
        let area = &*self.shared.area;
        let slots = &*self.shared.slots;
        while k < n {
            let d = self.rx.peek(k);
            if d.options & libc::XDP_PKT_CONTD == 0 {
                // The whole frame in one buffer: hand it over in place.
                k += 1;
                self.rx_done.extend(slots.slot_of(d.addr));
                let frame = area.slice(tape::real(d.addr), d.len as usize);
                deliver(frame, &mut self.stats, &mut f);
                packets += 1;
                continue;
            }
            // A multi-buffer frame: its descriptors up to the one without
            // XDP_PKT_CONTD. Only whole frames are consumed.
            let mut end = k;
            while end < n && self.rx.peek(end).options & libc::XDP_PKT_CONTD != 0 {
                end += 1;
            }
            if end == n {
                break;
            }
            packets += 1;
            self.stats.rx_multi_buffer += 1;
            // On the tape, each buffer's data starts where the previous
            // one's ends, in consecutive slots.
            let head = self.rx.peek(k);
            let first = slots.slot_of(head.addr);
            let (mut contiguous, mut next, mut total) = (first.is_some(), tape::real(head.addr), 0);
            for j in k..=end {
                let d = self.rx.peek(j);
                let slot = first.map(|s| s + (j - k) as usize);
                contiguous &= tape::real(d.addr) == next && slots.slot_of(d.addr) == slot;
                next = tape::real(d.addr) + u64::from(d.len);
                total += d.len as usize;
            }
            let ip = is_ip_frame(area.slice(tape::real(head.addr), head.len as usize));
            if let (true, true, Some(first)) = (contiguous, ip, first) {
                let span = (first, (end - k + 1) as usize);
                let start = tape::real(head.addr);
                if let Some(b) = tape::lend(slots, area, &self.lender, span, start, total, ETH) {
                    k = end + 1;
                    self.stats.rx_in_place += 1;
                    self.stats.rx_packets += 1;
                    f(DcRx::Lent(b));
                    continue;
                }
                self.stats.rx_gathered_full += 1;
            } else if ip {
                self.stats.rx_gathered_break += 1;
            }
            // Gathered into a buffer the site lent (it keeps the packet
            // there: this is the one copy on the way in), else into `buf`.
            let mut into = lent.pop();
            let mut len = 0;
            let mut fits = ip;
            for j in k..=end {
                let d = self.rx.peek(j);
                self.rx_done.extend(slots.slot_of(d.addr));
                let part = area.slice(tape::real(d.addr), d.len as usize);
                // The Ethernet header stays behind (what `deliver` strips).
                let part = if j == k {
                    part.get(ETH..).unwrap_or(&[])
                } else {
                    part
                };
                match &mut into {
                    _ if !fits => {}
                    Some(v) => v.extend_from_slice(part),
                    None if len + part.len() <= buf.len() => {
                        buf[len..len + part.len()].copy_from_slice(part)
                    }
                    None => fits = false,
                }
                len += part.len();
            }
            k = end + 1;
            if !fits || len == 0 {
                self.stats.rx_dropped += 1;
                lent.extend(into.map(|mut v| {
                    v.clear();
                    v
                }));
                continue;
            }
            soya_proto::copies::note(len);
            self.stats.rx_packets += 1;
            match into {
                Some(v) => f(DcRx::Lent(v)),
                None => f(DcRx::Borrowed(&buf[..len])),
            }
        }
        if k > 0 {
            self.rx.release(k);
            for s in self.rx_done.drain(..) {
                slots.release(s);
            }
            let u = &mut *lock(&self.shared.umem);
            u.tape.refill(&mut u.fill);
            if u.fill.needs_wakeup() {
                xsk::kick_rx(&self.fd);
            }
        }
        (packets, k == ready)
    }

    /// Queues one IP packet toward local host `dst` (sent at the next
    /// [`flush`](Self::flush), or now when a batch is full). Toward a host
    /// the kernel has no neighbour entry for yet, a copy is held until it
    /// has one (`unresolved`); `NoNeighbour` only when no more can be held.
    pub fn send(&mut self, packet: &[u8], dst: IpAddr) -> Result<(), SendError> {
        self.send_at(packet, dst, Instant::now())
    }

    /// [`send`](Self::send) at `now` (the tests give the time).
    fn send_at(&mut self, packet: &[u8], dst: IpAddr, now: Instant) -> Result<(), SendError> {
        if !self.unresolved.is_empty() {
            // Before this packet: those of its host held earlier.
            self.send_held(now);
        }
        let Some(eth) = self.neigh.header(dst, now) else {
            if self.unresolved.hold(packet, dst, now) {
                return Ok(());
            }
            self.stats.tx_no_neighbour += 1;
            return Err(SendError::NoNeighbour);
        };
        self.send_with(packet, eth)
    }

    /// Sends the held packets whose host has an entry now, in order, and
    /// drops (counted) those that waited [`unresolved::WAIT`] in vain.
    fn send_held(&mut self, now: Instant) {
        let mut q = std::mem::take(&mut self.unresolved.queue);
        for _ in 0..q.len() {
            let Some(h) = q.pop_front() else { break };
            if now.duration_since(h.since) >= unresolved::WAIT {
                self.stats.tx_no_neighbour += 1;
                continue;
            }
            match self.neigh.header(h.dst, now) {
                Some(eth) => {
                    self.stats.tx_held += 1;
                    // (A full ring drops it, counted, as it would any packet.)
                    let _ = self.send_with(&h.packet, eth);
                }
                None => q.push_back(h),
            }
        }
        self.unresolved.queue = q;
    }

    /// Packets waiting for their host's neighbour entry.
    pub fn held(&self) -> usize {
        self.unresolved.len()
    }

    /// Queues `packet` behind Ethernet header `eth`.
    fn send_with(&mut self, packet: &[u8], eth: [u8; ETH]) -> Result<(), SendError> {
        let len = ETH + packet.len();
        let chunks = len.div_ceil(CHUNK);
        if let Some(r) = self.lent_region(packet) {
            if (self.tx.free() as usize) < chunks {
                self.kick();
            }
            if (self.tx.free() as usize) >= chunks {
                if self.shared.lend.begin_send(r, chunks as u16) {
                    self.send_in_place(r, &eth, len);
                    return Ok(());
                }
                // Still being sent: the copying send below.
                self.stats.tx_busy_copied += 1;
                self.shared
                    .lend
                    .counters
                    .busy_copied
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            // No ring slot: the copying send finds none either (`Full`).
        }
        if self.tx_free.len() < chunks {
            self.kick();
            self.take_chunks();
        }
        if self.tx_free.len() < chunks || (self.tx.free() as usize) < chunks {
            self.stats.tx_full += 1;
            if self.stats.tx_full.is_power_of_two() {
                tracing::warn!(
                    shard = self.shard,
                    chunks_owned = self.tx_free.len(),
                    ring_free = self.tx.free(),
                    not_sent = self.tx.outstanding(),
                    count = self.stats.tx_full,
                    "xdp: a packet toward the DC dropped: no free TX chunk or ring slot"
                );
            }
            return Err(SendError::Full);
        }
        let area = &self.shared.area;
        soya_proto::copies::note(packet.len());
        let mut off = 0;
        for i in 0..chunks {
            let c = self.tx_free.pop().expect("checked above");
            let part = (len - off).min(CHUNK);
            let dst = area.slice_mut(c, part);
            // Copy the slice of the frame [off, off + part) = header ++ packet.
            let mut w = 0;
            if off < ETH {
                let h = &eth[off..ETH.min(off + part)];
                dst[..h.len()].copy_from_slice(h);
                w = h.len();
            }
            let p0 = (off + w) - ETH;
            dst[w..].copy_from_slice(&packet[p0..p0 + (part - w)]);
            off += part;
            self.tx.push(libc::xdp_desc {
                addr: c,
                len: part as u32,
                options: if i + 1 < chunks {
                    libc::XDP_PKT_CONTD
                } else {
                    0
                },
            });
        }
        self.tx_unkicked += chunks as u32;
        self.stats.tx_packets += 1;
        if self.tx_unkicked >= TX_KICK {
            self.kick();
        }
        Ok(())
    }

    /// The lent region `packet` fills from its run's start, if it does
    /// and its frame fits the region (a pointer range check: the bytes
    /// were decoded into this UMEM).
    fn lent_region(&self, packet: &[u8]) -> Option<u32> {
        let base = self.shared.area.base() as usize;
        let off = (packet.as_ptr() as usize).checked_sub(base)? as u64;
        let r = self.shared.lend.of_run(off)?;
        (packet.len() <= lend::REGION - lend::HEADROOM).then_some(r)
    }

    /// Sends the `len`-byte frame of region `r` by offset: the Ethernet
    /// header into its headroom, then one descriptor per chunk, chained.
    /// `begin_send` counted the descriptors.
    fn send_in_place(&mut self, r: u32, eth: &[u8; ETH], len: usize) {
        let at = self.shared.lend.offset(r);
        // The headroom is the lender's, not the buffer's, and no
        // descriptor names the region (`begin_send`): ours to write.
        self.shared.area.slice_mut(at, ETH).copy_from_slice(eth);
        let mut off = 0;
        while off < len {
            let part = (len - off).min(CHUNK);
            self.tx.push(libc::xdp_desc {
                addr: at + off as u64,
                len: part as u32,
                options: if off + part < len {
                    libc::XDP_PKT_CONTD
                } else {
                    0
                },
            });
            off += part;
        }
        self.tx_unkicked += len.div_ceil(CHUNK) as u32;
        self.stats.tx_packets += 1;
        self.stats.tx_in_place += 1;
        self.shared
            .lend
            .counters
            .sent_in_place
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.tx_unkicked >= TX_KICK {
            self.kick();
        }
    }

    fn take_chunks(&mut self) {
        let mut u = lock(&self.shared.umem);
        u.reap(&self.shared.lend);
        let n = u.free.len().min(TX_TAKE);
        let at = u.free.len() - n;
        self.tx_free.extend(u.free.drain(at..));
    }

    /// Sends the held packets whose host was resolved since, then
    /// publishes staged TX descriptors and kicks the kernel.
    pub fn flush(&mut self) {
        self.flush_at(Instant::now());
    }

    /// [`flush`](Self::flush) at `now` (the tests give the time).
    fn flush_at(&mut self, now: Instant) {
        if !self.unresolved.is_empty() {
            self.send_held(now);
        }
        self.kick();
    }

    /// Publishes staged TX descriptors and kicks the kernel.
    fn kick(&mut self) {
        if self.tx_unkicked == 0 && self.tx.outstanding() == 0 {
            if self.shared.lend.bytes_lent() > 0 {
                // Regions whose sends completed since are freed here too.
                lock(&self.shared.umem).reap(&self.shared.lend);
            }
            return;
        }
        self.tx.submit();
        self.tx_unkicked = 0;
        if !self.shared.zero_copy || self.tx.needs_wakeup() {
            // Copy mode sends a bounded number of descriptors per call.
            for _ in 0..8 {
                if let Err(e) = xsk::kick_tx(&self.fd) {
                    tracing::debug!(error = %e, "xdp: TX kick failed");
                    break;
                }
                if self.tx.outstanding() == 0 {
                    break;
                }
            }
        }
        if self.tx_free.len() < TX_TAKE / 2 {
            self.take_chunks();
        } else if self.shared.lend.bytes_lent() > 0 {
            // Lent regions are freed by their completions only: reap them
            // at every flush, not just when this shard's chunks run low.
            lock(&self.shared.umem).reap(&self.shared.lend);
        }
    }
}

fn deliver(frame: &[u8], stats: &mut XdpStats, f: &mut impl FnMut(DcRx<'_>)) {
    if !is_ip_frame(frame) {
        stats.rx_dropped += 1;
        return;
    }
    stats.rx_packets += 1;
    f(DcRx::Borrowed(&frame[ETH..]));
}

/// The program redirects untagged IPv4 / IPv6 only.
fn is_ip_frame(frame: &[u8]) -> bool {
    frame.len() > ETH && matches!(&frame[12..14], [0x08, 0x00] | [0x86, 0xdd])
}

/// Why a packet was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    NoNeighbour,
    Full,
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_copies;
#[cfg(test)]
mod tests_neigh;
#[cfg(test)]
mod tests_tape;
