//! The few system calls std does not wrap: ppoll, eventfd, the tun device,
//! socket options beyond socket2, timer slack. Every `unsafe` of the gateway
//! lives here.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `SO_SNDBUFFORCE` / `SO_RCVBUFFORCE` (asm-generic/socket.h; the same on
/// x86, arm and riscv): set the buffer beyond `net.core.*mem_max` with
/// CAP_NET_ADMIN.
const SO_SNDBUFFORCE: libc::c_int = 32;
const SO_RCVBUFFORCE: libc::c_int = 33;

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
        // SAFETY: plain syscall; the returned fd is owned by us from here on.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: fd is a fresh, valid descriptor nobody else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64. Errors (counter overflow:
        // already woken) need no handling.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    pub fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a valid u64.
        unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
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

/// Lets this thread's timed waits end within `ns` of their deadline (the
/// default slack is 50 µs, longer than the WAN's pacing granularity).
pub fn set_timer_slack(ns: u64) {
    // SAFETY: prctl with an integer argument; affects only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
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
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: -10,
        priority: 0,
        runtime: 100_000,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: sched_setattr / setpriority on the calling thread (pid 0 /
    // its tid) with a fully initialised sched_attr of the size it declares.
    unsafe {
        if libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) == 0 {
            return true;
        }
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, -10) == 0
    }
}

fn setsockopt_int(
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

/// SO_RCVBUFFORCE / SO_SNDBUFFORCE (needs CAP_NET_ADMIN).
pub fn force_buffers(fd: RawFd, bytes: usize) -> io::Result<()> {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    setsockopt_int(fd, libc::SOL_SOCKET, SO_RCVBUFFORCE, v)?;
    setsockopt_int(fd, libc::SOL_SOCKET, SO_SNDBUFFORCE, v)
}

/// IPv6 traffic class (socket2 covers IPv4 TOS only).
pub fn set_tclass_v6(fd: RawFd, tclass: u8) -> io::Result<()> {
    setsockopt_int(
        fd,
        libc::IPPROTO_IPV6,
        libc::IPV6_TCLASS,
        libc::c_int::from(tclass),
    )
}

fn ifreq_named(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?} (1..15 bytes)"),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(ifr)
}

/// Opens (or creates) tun device `name` in IFF_TUN | IFF_NO_PI mode,
/// non-blocking, sets its MTU and queue length (packets the kernel holds
/// for us to read) and brings it up. Routes are the operator's.
pub fn open_tun(name: &str, mtu: u32, txqueuelen: u32) -> io::Result<File> {
    let path = c"/dev/net/tun";
    // SAFETY: path is a valid C string; the fd is owned by the File below.
    let fd = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh descriptor, owned from here on (closed on error paths).
    let file = unsafe { File::from_raw_fd(fd) };
    let mut ifr = ifreq_named(name)?;
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes an ifreq we own.
    cvt(unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut ifr) })?;

    // Interface configuration goes through any socket.
    // SAFETY: plain syscall; the fd is owned right below.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
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

/// A pipe whose write end a signal handler may use (write(2) is
/// async-signal-safe).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both are fresh descriptors owned from here on.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
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

/// write(2) of one byte, for signal handlers.
pub fn write_byte(fd: RawFd, b: u8) {
    // SAFETY: writes one byte from a live stack value; async-signal-safe.
    unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
}
