//! Thin, Linux-only system-call wrappers: batched UDP I/O (`recvmmsg` /
//! `sendmmsg`) with kernel receive timestamps, precise waiting, TUN devices
//! and signals. Every `unsafe` of the emulator lives here.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// Socket options, x86_64 / generic values (stable Linux ABI).
const SO_RCVBUFFORCE: libc::c_int = 33;
const SO_SNDBUFFORCE: libc::c_int = 32;
const SO_TIMESTAMPNS: libc::c_int = 35;
const SCM_TIMESTAMPNS: libc::c_int = SO_TIMESTAMPNS;
const SO_RXQ_OVFL: libc::c_int = 40;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Room for `SCM_TIMESTAMPNS` (timespec), `SO_RXQ_OVFL` (u32) and
/// `UDP_GRO` (int) control messages.
const CTRL_LEN: usize = 128;

/// CLOCK_MONOTONIC in nanoseconds (the same clock as `std::time::Instant`).
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in nanoseconds (the clock of kernel socket timestamps).
pub fn real_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Makes this thread's timers fire when asked, not up to 50 µs later
/// (the default timer slack).
pub fn set_timer_slack_1ns() {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Raises the calling thread's CFS priority to `nice` (e.g. -20) if
/// permitted; it still shares the CPU, but wakes up ahead of ordinary work.
pub fn set_thread_nice(nice: i32) -> bool {
    // SAFETY: plain system calls on the calling thread.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0
    }
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
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Waits until `fd` is readable or `timeout` passes (nanosecond timer).
pub fn wait_readable(fd: RawFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd; null sigmask.
    unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
}

/// Sleeps `d` on a nanosecond timer (`ppoll` without descriptors).
pub fn sleep_precise(d: Duration) {
    let ts = libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    // SAFETY: no descriptors; a valid timespec; null sigmask.
    unsafe { libc::ppoll(std::ptr::null_mut(), 0, &ts, std::ptr::null()) };
}

/// Waits until `fd` is writable or `timeout` passes.
pub fn wait_writable(fd: RawFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd; null sigmask.
    unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: a c_int option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Large socket buffers (forced beyond `rmem_max` when we are root),
/// kernel receive timestamps and the kernel's drop counter.
pub fn tune_udp_socket(fd: RawFd, buf_bytes: usize) {
    let b = buf_bytes.min(i32::MAX as usize) as libc::c_int;
    if setsockopt_int(fd, libc::SOL_SOCKET, SO_RCVBUFFORCE, b).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, b);
    }
    if setsockopt_int(fd, libc::SOL_SOCKET, SO_SNDBUFFORCE, b).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, b);
    }
    let _ = setsockopt_int(fd, libc::SOL_SOCKET, SO_TIMESTAMPNS, 1);
    let _ = setsockopt_int(fd, libc::SOL_SOCKET, SO_RXQ_OVFL, 1);
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
        match self.storage.ss_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the family says it holds a sockaddr_in.
                let sin = unsafe { *(&self.storage as *const _ as *const libc::sockaddr_in) };
                Some(SocketAddr::V4(SocketAddrV4::new(
                    sin.sin_addr.s_addr.to_ne_bytes().into(),
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says it holds a sockaddr_in6.
                let s = unsafe { *(&self.storage as *const _ as *const libc::sockaddr_in6) };
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

    /// Same address (compares only the bytes that matter).
    pub fn same(&self, other: &RawAddr) -> bool {
        self.len == other.len && self.to_std() == other.to_std()
    }
}

/// What the kernel said about one received datagram.
#[derive(Clone, Copy, Default, Debug)]
pub struct RxMeta {
    pub len: usize,
    /// Longer than the buffers: the tail was cut off.
    pub truncated: bool,
    /// Kernel receive time, CLOCK_REALTIME ns.
    pub rx_real_ns: Option<u64>,
    /// With UDP GRO: several datagrams of this size (the last may be
    /// shorter) coalesced into one buffer of `len` bytes.
    pub segment: Option<usize>,
}

/// Receives coalesced datagrams (`UDP_GRO`): a sender using GSO hands
/// over up to 64 KiB per system call instead of one datagram.
pub fn enable_gro(fd: RawFd) -> bool {
    setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1).is_ok()
}

/// Largest UDP payload, and so the largest GRO buffer.
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// Reusable `recvmmsg` state for batches of up to `cap` datagrams.
pub struct RecvBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<[libc::iovec; 2]>,
    addrs: Vec<libc::sockaddr_storage>,
    ctrl: Vec<[u64; CTRL_LEN / 8]>,
    /// Per message, where bytes beyond its buffer land (GRO batches).
    landing: Vec<u8>,
    landing_len: usize,
    /// Kernel drop counter seen last (`SO_RXQ_OVFL`, cumulative per socket).
    pub kernel_drops: u64,
}

impl RecvBatch {
    /// `landing`: bytes per message beyond its buffer (0 = none), for
    /// GRO batches and oversize datagrams.
    pub fn new(cap: usize, landing: usize) -> RecvBatch {
        // SAFETY: all-zero is valid for these plain C structs.
        unsafe {
            RecvBatch {
                hdrs: vec![zeroed(); cap],
                iovs: vec![zeroed(); cap],
                addrs: vec![zeroed(); cap],
                ctrl: vec![[0; CTRL_LEN / 8]; cap],
                landing: vec![0; cap * landing],
                landing_len: landing,
                kernel_drops: 0,
            }
        }
    }

    /// The bytes of message `i` that went past its buffer.
    pub fn landing(&self, i: usize) -> &[u8] {
        &self.landing[i * self.landing_len..(i + 1) * self.landing_len]
    }

    /// Receives up to `bufs.len()` datagrams without blocking, each into
    /// its buffer of `buf_len` bytes (then its landing area). Returns how
    /// many arrived (0 if none).
    ///
    /// # Safety
    /// Every pointer in `bufs` must be valid for writes of `buf_len` bytes.
    pub unsafe fn recv(
        &mut self,
        fd: RawFd,
        bufs: &[*mut u8],
        buf_len: usize,
        meta: &mut [RxMeta],
    ) -> io::Result<usize> {
        let n = bufs.len().min(self.hdrs.len()).min(meta.len());
        let ll = self.landing_len;
        let land = self.landing.as_mut_ptr();
        for (i, &buf) in bufs.iter().enumerate().take(n) {
            self.iovs[i] = [
                libc::iovec {
                    iov_base: buf as *mut libc::c_void,
                    iov_len: buf_len,
                },
                libc::iovec {
                    iov_base: land.add(i * ll) as *mut libc::c_void,
                    iov_len: ll,
                },
            ];
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = self.iovs[i].as_mut_ptr();
            h.msg_iovlen = if ll > 0 { 2 } else { 1 };
            h.msg_control = self.ctrl[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = CTRL_LEN as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        let r = libc::recvmmsg(
            fd,
            self.hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        );
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let got = r as usize;
        for (i, m) in meta.iter_mut().enumerate().take(got) {
            let len = self.hdrs[i].msg_len as usize;
            let h = &mut self.hdrs[i].msg_hdr;
            *m = RxMeta {
                len,
                truncated: h.msg_flags & libc::MSG_TRUNC != 0,
                rx_real_ns: None,
                segment: None,
            };
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                let (level, kind) = ((*c).cmsg_level, (*c).cmsg_type);
                if level == libc::SOL_SOCKET && kind == SCM_TIMESTAMPNS {
                    let ts = std::ptr::read_unaligned(data as *const libc::timespec);
                    m.rx_real_ns = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                } else if level == libc::SOL_SOCKET && kind == SO_RXQ_OVFL {
                    let d = std::ptr::read_unaligned(data as *const u32);
                    self.kernel_drops = self.kernel_drops.max(u64::from(d));
                } else if level == libc::SOL_UDP && kind == UDP_GRO {
                    let g = std::ptr::read_unaligned(data as *const libc::c_int);
                    if g > 0 && (g as usize) < len {
                        m.segment = Some(g as usize);
                    }
                }
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
        Ok(got)
    }

    /// Source address of datagram `i` of the last batch.
    pub fn source(&self, i: usize) -> RawAddr {
        RawAddr {
            storage: self.addrs[i],
            len: self.hdrs[i].msg_hdr.msg_namelen,
        }
    }
}

/// Most datagrams per GSO send (the kernel's UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes per GSO send (a UDP/IPv6 datagram's payload, with margin).
const GSO_MAX_BYTES: usize = 65_000;

/// Reusable `sendmmsg` state; with `gso`, runs of equal-size datagrams to
/// the same place go out as one message each (`UDP_SEGMENT`), which the
/// kernel splits back into the original datagrams.
pub struct SendBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<[u64; CTRL_LEN / 8]>,
    /// (first packet, packets, segment size) of each message.
    groups: Vec<(usize, usize, usize)>,
    pub gso: bool,
}

/// How a send went.
#[derive(Clone, Copy, Default, Debug)]
pub struct SendOutcome {
    pub sent: usize,
    pub sent_bytes: usize,
    /// Datagrams given up on because of a send error.
    pub failed: usize,
}

impl SendBatch {
    pub fn new(cap: usize, gso: bool) -> SendBatch {
        // SAFETY: all-zero is valid for these plain C structs.
        unsafe {
            SendBatch {
                hdrs: vec![zeroed(); cap],
                iovs: vec![zeroed(); cap],
                ctrl: vec![[0; CTRL_LEN / 8]; cap],
                groups: Vec::with_capacity(cap),
                gso,
            }
        }
    }

    fn group(&mut self, pkts: &[(*const u8, usize)]) {
        self.groups.clear();
        let mut i = 0;
        while i < pkts.len() {
            let seg = pkts[i].1;
            let mut n = 1;
            let mut bytes = seg;
            if self.gso && seg > 0 {
                // Equal sizes; only the last of a run may be shorter.
                while i + n < pkts.len()
                    && n < GSO_MAX_SEGMENTS
                    && pkts[i + n].1 <= seg
                    && pkts[i + n].1 > 0
                    && bytes + pkts[i + n].1 <= GSO_MAX_BYTES
                {
                    bytes += pkts[i + n].1;
                    n += 1;
                    if pkts[i + n - 1].1 < seg {
                        break;
                    }
                }
            }
            self.groups.push((i, n, seg));
            i += n;
        }
    }

    /// Sends every datagram (to `dest`, or to the connected peer if
    /// `None`), retrying partial sends, waiting briefly for room when the
    /// socket is full, and skipping what the kernel refuses.
    ///
    /// # Safety
    /// Every `(ptr, len)` must be valid for reads of `len` bytes.
    pub unsafe fn send(
        &mut self,
        fd: RawFd,
        pkts: &[(*const u8, usize)],
        dest: Option<&RawAddr>,
    ) -> SendOutcome {
        let pkts = &pkts[..pkts.len().min(self.iovs.len())];
        self.group(pkts);
        for (k, &(p, l)) in pkts.iter().enumerate() {
            self.iovs[k] = libc::iovec {
                iov_base: p as *mut libc::c_void,
                iov_len: l,
            };
        }
        let mut out = SendOutcome::default();
        let mut g0 = 0;
        let mut stalls = 0;
        while g0 < self.groups.len() {
            let n = self.groups.len() - g0;
            for j in 0..n {
                let (first, count, seg) = self.groups[g0 + j];
                let h = &mut self.hdrs[j].msg_hdr;
                match dest {
                    Some(d) => {
                        h.msg_name = &d.storage as *const _ as *mut libc::c_void;
                        h.msg_namelen = d.len;
                    }
                    None => {
                        h.msg_name = std::ptr::null_mut();
                        h.msg_namelen = 0;
                    }
                }
                h.msg_iov = self.iovs[first..].as_mut_ptr();
                h.msg_iovlen = count as _;
                h.msg_flags = 0;
                if count > 1 {
                    let c = self.ctrl[j].as_mut_ptr() as *mut u8;
                    h.msg_control = c as *mut libc::c_void;
                    h.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as u32) as _;
                    let cm = libc::CMSG_FIRSTHDR(h);
                    (*cm).cmsg_level = libc::SOL_UDP;
                    (*cm).cmsg_type = UDP_SEGMENT;
                    (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm) as *mut u16, seg as u16);
                } else {
                    h.msg_control = std::ptr::null_mut();
                    h.msg_controllen = 0;
                }
            }
            let r = libc::sendmmsg(fd, self.hdrs.as_mut_ptr(), n as libc::c_uint, 0);
            if r > 0 {
                for &(first, count, _) in &self.groups[g0..g0 + r as usize] {
                    out.sent += count;
                    out.sent_bytes += pkts[first..first + count]
                        .iter()
                        .map(|p| p.1)
                        .sum::<usize>();
                }
                g0 += r as usize;
                stalls = 0;
                continue;
            }
            let e = io::Error::last_os_error();
            let (first, count, _) = self.groups[g0];
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN) if stalls < 100 => {
                    stalls += 1;
                    wait_writable(fd, Duration::from_millis(1));
                }
                Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP) if count > 1 => {
                    // No GSO on this path (e.g. a device without checksum
                    // offload): send one by one from now on.
                    self.gso = false;
                    let rest = out;
                    let more = self.send(fd, &pkts[first..], dest);
                    return SendOutcome {
                        sent: rest.sent + more.sent,
                        sent_bytes: rest.sent_bytes + more.sent_bytes,
                        failed: rest.failed + more.failed,
                    };
                }
                _ => {
                    // ECONNREFUSED (nobody listening yet), or stalled for
                    // 100 ms: drop this message's datagrams and go on.
                    out.failed += count;
                    g0 += 1;
                    stalls = 0;
                }
            }
        }
        out
    }
}

/// Reads one packet; `Ok(None)` when none is waiting.
pub fn read_packet(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: a valid buffer of the given length.
    let r = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    if r >= 0 {
        return Ok(Some(r as usize));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
        _ => Err(e),
    }
}

/// Writes one packet.
pub fn write_packet(fd: RawFd, buf: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: a valid buffer of the given length.
        let r = unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {
                wait_writable(fd, Duration::from_millis(1));
                // One retry, then give up on the packet.
                // SAFETY: as above.
                let r = unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) };
                return if r >= 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                };
            }
            _ => return Err(e),
        }
    }
}

#[repr(C)]
struct IfReqFlags {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates (or attaches to) the TUN device `name` (`tap`: an Ethernet TAP
/// device instead, for L2 traffic such as rxe's), non-blocking, without
/// packet-information headers.
pub fn open_tun(name: &str, tap: bool) -> io::Result<OwnedFd> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "\"{name}\" is not a valid interface name (1 to 15 characters, no '/' or spaces)"
            ),
        ));
    }
    // SAFETY: a C string path and flags.
    let fd = unsafe {
        libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("/dev/net/tun: {e}")));
    }
    // SAFETY: a freshly opened descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: ((if tap { libc::IFF_TAP } else { libc::IFF_TUN }) | libc::IFF_NO_PI)
            as libc::c_short,
        _pad: [0; 22],
    };
    for (d, s) in req.name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: TUNSETIFF takes a pointer to an ifreq, which IfReqFlags lays out.
    let r = unsafe { libc::ioctl(owned.as_raw_fd(), libc::TUNSETIFF as _, &mut req) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("TUNSETIFF {name}: {e}")));
    }
    Ok(owned)
}

static STOP_SIGNAL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP_SIGNAL.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to a flag read by [`stop_requested`].
pub fn install_stop_signals() {
    // SAFETY: installing an async-signal-safe handler (one atomic store).
    unsafe {
        let mut sa: libc::sigaction = zeroed();
        sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

/// Whether SIGINT or SIGTERM arrived.
pub fn stop_requested() -> bool {
    STOP_SIGNAL.load(Ordering::SeqCst)
}
