//! The Linux system calls std and socket2 do not wrap, for the gateway and
//! the lab tools alike (`soya_io::sys`, also `soya::sys`): ppoll, eventfd, the tun device, socket
//! options beyond socket2, scheduling and timer slack, signals, network
//! namespaces; batched UDP I/O with GSO / GRO ([`udpio`] for the gateway,
//! [`batch`] for the WAN emulator and the software RoCE endpoint) and its
//! io_uring variant. Every `unsafe` of the proxy but AF_XDP's
//! ([`crate::xdp`], beside it in this crate) lives under this module.
//!
//! System calls go through `rustix`'s safe wrappers where it has one; raw
//! `libc` remains only where rustix has no safe call (the `ifreq` ioctls,
//! `sigaction`, `sched_setattr`, `unshare`, generic int socket options,
//! `recvmmsg`/`sendmmsg`, `readv` into uninitialised memory) or where the
//! public signature hands us `libc` types (`ppoll` over `libc::pollfd`).
//! Non-blocking "not now" errors are classified in one place, [`retry`].

pub mod batch;
mod mmsg;
pub mod retry;
pub mod tun_vnet;
pub mod udpio;
#[cfg(feature = "io-uring")]
pub mod uring;

pub use retry::{nonblocking, not_now};

use std::fs::File;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::num::NonZeroU64;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `SO_TIMESTAMPNS` / its control message (asm-generic/socket.h).
const SO_TIMESTAMPNS: libc::c_int = 35;
/// `SO_RXQ_OVFL` (asm-generic/socket.h): the socket's drop counter as a
/// control message on every received message.
const SO_RXQ_OVFL: libc::c_int = 40;
/// `UDP_SEGMENT` / `UDP_GRO` (linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Plain C structs: all-zero bytes are a valid value of each (integers,
/// raw pointers and arrays of them), the state the batch I/O fills in.
///
/// # Safety
/// Implement only for types all of whose fields are integers, raw pointers
/// or arrays and structs of those.
unsafe trait PlainC: Copy {}
// SAFETY: integers, raw pointers and structs of those (sys/socket.h, sys/uio.h).
unsafe impl PlainC for libc::mmsghdr {}
// SAFETY: as above.
unsafe impl PlainC for libc::iovec {}
// SAFETY: as above.
unsafe impl PlainC for [libc::iovec; 2] {}
// SAFETY: as above.
unsafe impl PlainC for libc::sockaddr_storage {}

/// `n` all-zero `T`s.
fn zeroed_vec<T: PlainC>(n: usize) -> Vec<T> {
    // SAFETY: all-zero is a valid `T` (`PlainC`).
    vec![unsafe { zeroed() }; n]
}

/// Lends the descriptor `*fd` to a rustix call. The public functions here
/// take a `RawFd` (what their callers hold: `sock.as_raw_fd()`, the fds of
/// a poll set), and rustix wants a `BorrowedFd`; the borrow lives no longer
/// than the reference to the caller's number, i.e. the call.
fn borrow(fd: &RawFd) -> BorrowedFd<'_> {
    // SAFETY: every function of this module that takes a `RawFd` is called
    // with a descriptor its caller holds open for the call, as the libc
    // calls these replace required too. Were it closed, the system call
    // would fail with EBADF (or act on whatever file got the number), as
    // the libc call did; no memory is at stake either way.
    unsafe { BorrowedFd::borrow_raw(*fd) }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A wake-up handle for the device loop: other threads `wake()` it, the
/// loop polls its fd and `clear()`s it.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        use rustix::event::{eventfd, EventfdFlags};
        Ok(EventFd(eventfd(
            0,
            EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC,
        )?))
    }

    pub fn wake(&self) {
        // Errors (counter overflow: already woken) need no handling.
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    pub fn clear(&self) {
        // Nothing to read (not woken) is fine too.
        let _ = rustix::io::read(&self.0, &mut [0u8; 8]);
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until one of `fds` is ready or `timeout` passes (nanosecond
/// resolution, unlike poll(2)). Returns the number of ready descriptors;
/// EINTR counts as 0.
pub fn ppoll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` is a valid slice of pollfd; `tsp` is null or points to a
    // timespec that outlives the call; no signal mask is passed.
    let r = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

pub fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Waits until `fd` is readable or `timeout` passes (nanosecond timer).
pub fn wait_readable(fd: RawFd, timeout: Duration) {
    let _ = ppoll(&mut [pollfd(fd, libc::POLLIN)], Some(timeout));
}

/// Waits until `fd` is writable or `timeout` passes.
pub fn wait_writable(fd: RawFd, timeout: Duration) {
    let _ = ppoll(&mut [pollfd(fd, libc::POLLOUT)], Some(timeout));
}

/// Sleeps `d` on a nanosecond timer (`ppoll` without descriptors).
pub fn sleep_precise(d: Duration) {
    let _ = ppoll(&mut [], Some(d));
}

/// CLOCK_MONOTONIC in nanoseconds (the same clock as `std::time::Instant`).
pub fn mono_ns() -> u64 {
    clock_ns(rustix::time::ClockId::Monotonic)
}

/// CLOCK_REALTIME in nanoseconds (the clock of kernel socket timestamps).
pub fn real_ns() -> u64 {
    clock_ns(rustix::time::ClockId::Realtime)
}

/// CPU time of the calling thread in nanoseconds (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_ns() -> u64 {
    clock_ns(rustix::time::ClockId::ThreadCPUTime)
}

/// CPU time of the whole process, user + system of all its threads, in
/// seconds (CLOCK_PROCESS_CPUTIME_ID: the sum getrusage reports, at
/// nanosecond rather than tick resolution).
pub fn process_cpu_secs() -> f64 {
    clock_ns(rustix::time::ClockId::ProcessCPUTime) as f64 / 1e9
}

fn clock_ns(clock: rustix::time::ClockId) -> u64 {
    let ts = rustix::time::clock_gettime(clock);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Lets this thread's timed waits end within `ns` of their deadline (the
/// default slack is 50 µs, longer than the WAN's pacing granularity); 0
/// restores the default.
pub fn set_timer_slack(ns: u64) {
    let _ = rustix::thread::set_current_timer_slack(NonZeroU64::new(ns));
}

/// Keeps freed heap memory in the process instead of handing it back to the
/// kernel at every dip (glibc trims the top of a heap past 128 KiB by
/// default): packets are allocated and freed at line rate, and every trim
/// was paid again as page faults when the heap grew back (a quarter of the
/// egress gateway's CPU time in a profile). The gateway holds its deep
/// buffer anyway.
pub fn keep_heap() {
    // glibc's mallopt parameters (malloc.h).
    const M_TRIM_THRESHOLD: libc::c_int = -1;
    const M_TOP_PAD: libc::c_int = -2;
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        libc::mallopt(M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(M_TOP_PAD, 16 << 20);
    }
}

/// Raises the calling thread's priority: nice −10 and, on kernels with
/// EEVDF custom slices (6.12+), a 100 µs slice so that it preempts ordinary
/// work as soon as a packet wakes it. Returns false when refused (not
/// root): the loop then runs at normal priority.
pub fn raise_thread_priority() -> bool {
    set_short_slice(-10, Duration::from_micros(100)) || set_thread_nice(-10)
}

/// Raises the calling thread's CFS priority to `nice` (e.g. -20) if
/// permitted; it still shares the CPU, but wakes up ahead of ordinary work.
pub fn set_thread_nice(nice: i32) -> bool {
    // On Linux PRIO_PROCESS with a thread id sets that thread's nice only.
    rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice).is_ok()
}

#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Asks the (EEVDF, Linux 6.12+) scheduler for a short time slice for the
/// calling thread, at `nice`: a thread with a short slice preempts others
/// as soon as it wakes up instead of waiting for their slice to end.
/// Returns false if refused (older kernel, or not permitted).
pub fn set_short_slice(nice: i32, slice: Duration) -> bool {
    let attr = SchedAttr {
        size: size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: slice.as_nanos() as u64,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: sched_setattr on the calling thread (pid 0) with a valid,
    // fully initialised sched_attr of the size it declares.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) == 0 }
}

/// Puts the calling thread back on CFS, at nice −20 with a 100 µs slice
/// where the kernel allows it (at plain nice −20, or unchanged, otherwise).
pub fn set_normal_priority() {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; a valid sched_param.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) };
    if !set_short_slice(-20, Duration::from_micros(100)) {
        set_thread_nice(-20);
    }
}

/// Makes the calling thread SCHED_FIFO at `priority`.
pub fn set_realtime(priority: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 is the calling thread; a valid sched_param.
    cvt(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) }).map(|_| ())
}

/// setsockopt(2) with an int value.
pub fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// getsockopt(2) of an int value.
pub fn getsockopt_int(fd: RawFd, level: libc::c_int, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a c_int out value of the size given.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(v)
}

/// SO_RCVBUFFORCE / SO_SNDBUFFORCE (needs CAP_NET_ADMIN).
pub fn force_buffers(fd: RawFd, bytes: usize) -> io::Result<()> {
    use rustix::net::sockopt;
    let v = bytes.min(i32::MAX as usize);
    sockopt::set_socket_recv_buffer_size_force(borrow(&fd), v)?;
    Ok(sockopt::set_socket_send_buffer_size_force(borrow(&fd), v)?)
}

/// Large socket buffers (forced beyond `rmem_max` when we are root),
/// kernel receive timestamps and the kernel's drop counter.
pub fn tune_udp_socket(fd: RawFd, buf_bytes: usize) {
    use rustix::net::sockopt;
    let b = buf_bytes.min(i32::MAX as usize);
    let s = borrow(&fd);
    if sockopt::set_socket_recv_buffer_size_force(s, b).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(s, b);
    }
    if sockopt::set_socket_send_buffer_size_force(s, b).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(s, b);
    }
    // rustix has no setter for these two (nor for UDP_SEGMENT / UDP_GRO).
    let _ = setsockopt_int(fd, libc::SOL_SOCKET, SO_TIMESTAMPNS, 1);
    let _ = enable_rxq_ovfl(fd);
}

/// Whether the kernel knows `UDP_SEGMENT` on this socket (Linux ≥ 4.18).
/// Setting a socket-wide segment size of 0 is a no-op that fails only where
/// the option does not exist. Whether the *device* can do it shows at the
/// first send.
pub fn probe_gso(fd: RawFd) -> bool {
    setsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT, 0).is_ok()
}

/// Asks for coalesced receives (`UDP_GRO`, Linux ≥ 5.0): a sender using
/// GSO hands over up to 64 KiB per system call instead of one datagram.
pub fn enable_gro(fd: RawFd) -> bool {
    setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1).is_ok()
}

/// Asks for the socket's drop counter with every received message.
pub fn enable_rxq_ovfl(fd: RawFd) -> bool {
    setsockopt_int(fd, libc::SOL_SOCKET, SO_RXQ_OVFL, 1).is_ok()
}

/// IPv6 traffic class (socket2 covers IPv4 TOS only).
pub fn set_tclass_v6(fd: RawFd, tclass: u8) -> io::Result<()> {
    Ok(rustix::net::sockopt::set_ipv6_tclass(
        borrow(&fd),
        u32::from(tclass),
    )?)
}

fn ifreq_named(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "\"{name}\" is not a valid interface name (1 to 15 characters, no '/' or spaces)"
            ),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(ifr)
}

/// Creates (or attaches to) the TUN device `name` (`tap`: an Ethernet TAP
/// device instead, for L2 traffic such as rxe's), non-blocking, without
/// packet-information headers.
pub fn open_tun_fd(name: &str, tap: bool) -> io::Result<OwnedFd> {
    let kind = if tap { libc::IFF_TAP } else { libc::IFF_TUN };
    open_tun_with(name, kind | libc::IFF_NO_PI)
}

/// Opens `/dev/net/tun` non-blocking and attaches it to device `name`
/// (created if missing) with `flags` (`IFF_TUN`/`IFF_TAP`, `IFF_NO_PI`,
/// `IFF_VNET_HDR`, ...).
pub(crate) fn open_tun_with(name: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let mut ifr = ifreq_named(name)?;
    let owned = rustix::fs::open(
        "/dev/net/tun",
        OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("/dev/net/tun: {e}"))
    })?;
    ifr.ifr_ifru.ifru_flags = flags as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes an ifreq we own.
    if unsafe { libc::ioctl(owned.as_raw_fd(), libc::TUNSETIFF as _, &mut ifr) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("TUNSETIFF {name}: {e}")));
    }
    Ok(owned)
}

/// A UDP socket to address interface ioctls to (any socket will do).
fn ioctl_socket() -> io::Result<OwnedFd> {
    use rustix::net::{socket_with, AddressFamily, SocketFlags, SocketType};
    Ok(socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Opens (or creates) tun device `name` in IFF_TUN | IFF_NO_PI mode,
/// non-blocking, sets its MTU and queue length (packets the kernel holds
/// for us to read) and brings it up. Routes are the operator's.
pub fn open_tun(name: &str, mtu: u32, txqueuelen: u32) -> io::Result<File> {
    let file = File::from(open_tun_fd(name, false)?);

    // Interface configuration goes through any socket.
    let sock = ioctl_socket()?;
    let mut req = ifreq_named(name)?;
    req.ifr_ifru.ifru_mtu = mtu.min(65_535) as libc::c_int;
    // SAFETY: SIOCSIFMTU reads an ifreq we own.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFMTU as _, &mut req) })?;
    let mut req = ifreq_named(name)?;
    // ifr_qlen is the same int member of the union as ifr_mtu.
    req.ifr_ifru.ifru_mtu = txqueuelen.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: SIOCSIFTXQLEN reads an ifreq we own.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFTXQLEN as _, &mut req) })?;
    let mut req = ifreq_named(name)?;
    // SAFETY: SIOCGIFFLAGS fills the ifreq we own.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) })?;
    // SAFETY: the kernel just wrote the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads an ifreq we own.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &mut req) })?;
    Ok(file)
}

/// Turns the transmit checksum offload of interface `name` on or off, as
/// `ethtool -K name tx on|off` does (the legacy ETHTOOL_STXCSUM request,
/// which the kernel maps onto its checksum features), in the network
/// namespace of the calling thread. The demo's xdp hosts need it off: a
/// veth hands frames over with their UDP/TCP checksums left to "hardware",
/// and AF_XDP takes the bytes as they are.
pub fn set_tx_checksum(name: &str, on: bool) -> io::Result<()> {
    /// linux/ethtool.h `struct ethtool_value`.
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    const ETHTOOL_STXCSUM: u32 = 0x17;
    let sock = ioctl_socket()?;
    let mut value = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: u32::from(on),
    };
    let mut req = ifreq_named(name)?;
    req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    // SAFETY: SIOCETHTOOL reads the ifreq and the ethtool_value it points
    // to, both ours and alive for the call.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL as _, &mut req) })?;
    Ok(())
}

/// Reads one packet; `Ok(None)` when none is waiting.
pub fn read_packet(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    nonblocking(|| Ok(rustix::io::read(borrow(&fd), &mut *buf)?))
}

/// Reads one packet into the spare capacity of `v` (after its contents),
/// without initialising that memory first; a packet longer than the spare
/// capacity continues into `overflow` (one `readv`) and is then appended
/// to `v` (a copy, for such packets only). `Ok(false)` when none is
/// waiting.
pub fn read_packet_into(
    fd: RawFd,
    v: &mut soya_proto::buffer::PacketBuf,
    overflow: &mut [u8],
) -> io::Result<bool> {
    let (n, first) = if let Some(vec) = v.heap_vec_mut() {
        let len = vec.len();
        let spare = vec.spare_capacity_mut();
        let room = spare.len();
        let Some(n) = readv2(fd, spare.as_mut_ptr().cast(), room, overflow)? else {
            return Ok(false);
        };
        let first = n.min(room);
        // SAFETY: the kernel initialised the first `first` bytes of the
        // spare capacity (readv fills the iovecs in order).
        unsafe { vec.set_len(len + first) };
        (n, first)
    } else {
        // A lent buffer: its room is initialised memory already.
        let spare = v.lent_spare_mut().expect("a buffer is heap or lent");
        let room = spare.len();
        let Some(n) = readv2(fd, spare.as_mut_ptr(), room, overflow)? else {
            return Ok(false);
        };
        let first = n.min(room);
        v.commit_lent(first);
        (n, first)
    };
    if n > first {
        soya_proto::copies::note(n - first);
        v.extend_from_slice(&overflow[..n - first]);
    }
    Ok(true)
}

/// One `readv` into `room` bytes at `at`, then `overflow`; `Ok(None)` when
/// nothing is waiting.
fn readv2(fd: RawFd, at: *mut u8, room: usize, overflow: &mut [u8]) -> io::Result<Option<usize>> {
    let iov = [
        libc::iovec {
            iov_base: at.cast(),
            iov_len: room,
        },
        libc::iovec {
            iov_base: overflow.as_mut_ptr().cast(),
            iov_len: overflow.len(),
        },
    ];
    nonblocking(|| {
        // SAFETY: both iovecs describe memory the caller owns for the
        // call's duration (`room` writable bytes at `at`, possibly
        // uninitialised, and `overflow`).
        let r = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
        if r >= 0 {
            Ok(r as usize)
        } else {
            Err(io::Error::last_os_error())
        }
    })
}

fn write_once(fd: RawFd, buf: &[u8]) -> io::Result<()> {
    rustix::io::write(borrow(&fd), buf)?;
    Ok(())
}

/// Writes one packet (one retry after 1 ms when the device is full).
pub fn write_packet(fd: RawFd, buf: &[u8]) -> io::Result<()> {
    write_retrying(fd, || write_once(fd, buf))
}

/// Runs `write` (one packet's write to `fd`) until it is not interrupted;
/// when the device is full, waits up to 1 ms for room and tries once more,
/// then gives up on the packet (a tun device full for that long is
/// congested: the packet counts as dropped, the loop must not stall).
pub fn write_retrying(fd: RawFd, mut write: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    match nonblocking(&mut write)? {
        Some(()) => Ok(()),
        None => {
            wait_writable(fd, Duration::from_millis(1));
            write()
        }
    }
}

/// A socket address in the kernel's form.
#[derive(Clone, Copy)]
pub struct RawAddr {
    pub storage: libc::sockaddr_storage,
    pub len: libc::socklen_t,
}

impl RawAddr {
    pub fn from_std(a: SocketAddr) -> RawAddr {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = match a {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { *(&mut storage as *mut _ as *mut libc::sockaddr_in) = sin };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe { *(&mut storage as *mut _ as *mut libc::sockaddr_in6) = sin6 };
                size_of::<libc::sockaddr_in6>()
            }
        };
        RawAddr {
            storage,
            len: len as libc::socklen_t,
        }
    }

    pub fn to_std(&self) -> Option<SocketAddr> {
        storage_to_std(&self.storage)
    }

    /// Same address (compares only the bytes that matter).
    pub fn same(&self, other: &RawAddr) -> bool {
        self.len == other.len && self.to_std() == other.to_std()
    }
}

/// The address the kernel wrote into `s`.
pub fn storage_to_std(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    {
        match s.ss_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the family says it holds a sockaddr_in.
                let sin = unsafe { *(s as *const _ as *const libc::sockaddr_in) };
                Some(SocketAddr::V4(SocketAddrV4::new(
                    sin.sin_addr.s_addr.to_ne_bytes().into(),
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says it holds a sockaddr_in6.
                let s = unsafe { *(s as *const _ as *const libc::sockaddr_in6) };
                Some(SocketAddr::V6(SocketAddrV6::new(
                    s.sin6_addr.s6_addr.into(),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// Installs `handler` for `signals` (SA_RESTART).
pub fn install_signal_handler(
    signals: &[libc::c_int],
    handler: extern "C" fn(libc::c_int),
) -> io::Result<()> {
    for &sig in signals {
        // SAFETY: a zeroed sigaction with our handler and an empty mask is
        // valid; the handler only does async-signal-safe work.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            cvt(libc::sigaction(sig, &sa, std::ptr::null_mut()))?;
        }
    }
    Ok(())
}

static STOP_SIGNAL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP_SIGNAL.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to a flag read by [`stop_requested`].
pub fn install_stop_signals() {
    let _ = install_signal_handler(&[libc::SIGINT, libc::SIGTERM], on_stop_signal);
}

/// Whether SIGINT or SIGTERM arrived (after [`install_stop_signals`]).
pub fn stop_requested() -> bool {
    STOP_SIGNAL.load(Ordering::SeqCst)
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Clock ticks per second, the unit of the CPU times in `/proc/PID/stat`
/// (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_sec() -> u64 {
    // Linux reports USER_HZ, 100, everywhere; never below 1.
    rustix::param::clock_ticks_per_second().max(1)
}

/// kill(2): sends `sig` to process `pid`.
pub fn kill(pid: u32, sig: libc::c_int) -> io::Result<()> {
    use rustix::process::{kill_process, Pid, Signal};
    // Pid 0 or a negative one would address a process group, not a process.
    let pid = i32::try_from(pid).ok().and_then(Pid::from_raw);
    let (Some(pid), Some(sig)) = (pid, Signal::from_named_raw(sig)) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("kill: no process {pid:?} or no signal {sig}"),
        ));
    };
    Ok(kill_process(pid, sig)?)
}

/// A packet socket (AF_PACKET, SOCK_DGRAM: IP packets without their link
/// header) bound to device `dev` of the caller's network namespace, seeing
/// every packet the device sends or receives: a tap on a link (blocking).
pub fn open_link_tap(dev: &str) -> io::Result<OwnedFd> {
    use rustix::net::{socket_with, AddressFamily, Protocol, SocketFlags, SocketType};
    // ETH_P_ALL: only "all protocols" taps see outgoing packets.
    let proto = (libc::ETH_P_ALL as u16).to_be();
    let fd = socket_with(
        AddressFamily::PACKET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        std::num::NonZeroU32::new(u32::from(proto)).map(Protocol::from_raw),
    )?;
    let ifindex = rustix::net::netdevice::name_to_index(&fd, dev)?;
    // SAFETY: an all-zero sockaddr_ll is valid; its fields are set below.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: bind with a live sockaddr_ll of its size.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// Moves the calling thread into the network namespace `ns` (an open
/// `/var/run/netns/NAME` or `/proc/PID/ns/net`).
pub fn enter_netns(ns: &File) -> io::Result<()> {
    use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
    Ok(move_into_link_name_space(
        ns.as_fd(),
        Some(LinkNameSpaceType::Network),
    )?)
}

/// Moves the calling thread into a new network namespace of its own.
pub fn unshare_netns() -> io::Result<()> {
    // (rustix's unshare is `unshare_unsafe`: no gain over libc here.)
    // SAFETY: unshare affects only this thread's network namespace.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNET) }).map(|_| ())
}

/// The child gets SIGTERM when this process dies, however it dies (Ctrl-C
/// reaches the whole process group anyway; this covers `kill PID`).
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and the closure allocates
    // nothing; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let _ = rustix::process::set_parent_process_death_signal(Some(
                rustix::process::Signal::TERM,
            ));
            Ok(())
        })
    }
}

/// A change of the heap, as [`CountingAlloc`] reports it.
#[derive(Clone, Copy, Debug)]
pub enum HeapChange {
    /// Bytes allocated (`alloc` or `alloc_zeroed`).
    Alloc(usize),
    /// Bytes freed.
    Dealloc(usize),
    /// A block resized from `old` to `new` bytes.
    Realloc { old: usize, new: usize },
}

/// A global allocator for the tests and benches that count allocations:
/// the system allocator, telling `.0` of every change first. The hook runs
/// inside the allocator, so it must not allocate (a thread-local `Cell` or
/// an atomic is the way to count).
pub struct CountingAlloc(pub fn(HeapChange));

// SAFETY: every call goes to the system allocator unchanged; the hook only
// sees sizes.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        (self.0)(HeapChange::Alloc(l.size()));
        // SAFETY: the caller's contract, forwarded as is.
        unsafe { std::alloc::System.alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        (self.0)(HeapChange::Alloc(l.size()));
        // SAFETY: as for `alloc`.
        unsafe { std::alloc::System.alloc_zeroed(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        (self.0)(HeapChange::Dealloc(l.size()));
        // SAFETY: as for `alloc`.
        unsafe { std::alloc::System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        (self.0)(HeapChange::Realloc { old: l.size(), new });
        // SAFETY: as for `alloc`.
        unsafe { std::alloc::System.realloc(p, l, new) }
    }
}
