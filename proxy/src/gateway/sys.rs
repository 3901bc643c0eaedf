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
/// non-blocking, sets its MTU and brings it up. Routes are the operator's.
pub fn open_tun(name: &str, mtu: u32) -> io::Result<File> {
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
    // SAFETY: SIOCGIFFLAGS fills the ifreq we own.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) })?;
    // SAFETY: the kernel just wrote the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads an ifreq we own.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &mut req) })?;
    Ok(file)
}

/// Sets interface `name`'s transmit queue length. For a tun device that is
/// the ring of packets waiting for the reader (the gateway): the kernel
/// drops what does not fit (`tx_dropped`), it never makes the sender wait.
pub fn set_txqueuelen(name: &str, qlen: u32) -> io::Result<()> {
    // SAFETY: plain syscall; the fd is owned right below.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    let mut req = ifreq_named(name)?;
    req.ifr_ifru.ifru_metric = libc::c_int::try_from(qlen).unwrap_or(libc::c_int::MAX);
    // SAFETY: SIOCSIFTXQLEN reads the ifreq we own (ifr_qlen aliases the
    // int member of the union).
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFTXQLEN as _, &mut req) })?;
    Ok(())
}

/// The index of interface `name` (in this network namespace).
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
    // SAFETY: c is a valid C string for the duration of the call.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// rtnetlink: replaces the root qdisc of interface `ifindex` by `pfifo`
/// holding `limit` packets (what `tc qdisc replace dev X root pfifo limit N`
/// does).
pub fn set_root_pfifo(ifindex: u32, limit: u32) -> io::Result<()> {
    let reply = rtnl_transact(&rtnl::pfifo_request(ifindex, limit, 1))?;
    rtnl::ack(&reply)
}

/// rtnetlink: the `tx_dropped` counter of interface `ifindex` (IFLA_STATS64).
pub fn link_tx_dropped(ifindex: u32) -> io::Result<u64> {
    let reply = rtnl_transact(&rtnl::getlink_request(ifindex, 1))?;
    rtnl::tx_dropped(&reply)
}

/// Sends one rtnetlink request and returns the first reply datagram.
fn rtnl_transact(msg: &[u8]) -> io::Result<Vec<u8>> {
    // SAFETY: plain syscall; the fd is owned right below.
    let s = cvt(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    // SAFETY: fresh descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    let tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: SO_RCVTIMEO reads a timeval we own.
    cvt(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    // SAFETY: sockaddr_nl is plain old data; all-zero addresses the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: sends msg.len() bytes from msg to an address we own.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 << 10];
    // SAFETY: receives at most buf.len() bytes into buf.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// rtnetlink messages, built and parsed in safe code (and unit-tested).
pub(crate) mod rtnl {
    use std::io;

    const NLMSG_HDRLEN: usize = 16;
    const NLMSG_ERROR: u16 = 2;
    const RTM_NEWLINK: u16 = 16;
    const RTM_GETLINK: u16 = 18;
    const RTM_NEWQDISC: u16 = 36;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_ACK: u16 = 0x4;
    const NLM_F_REPLACE: u16 = 0x100;
    const NLM_F_CREATE: u16 = 0x400;
    const TC_H_ROOT: u32 = 0xFFFF_FFFF;
    const TCA_KIND: u16 = 1;
    const TCA_OPTIONS: u16 = 2;
    const IFLA_STATS64: u16 = 23;
    /// `struct ifinfomsg` and `struct tcmsg`.
    const IFINFOMSG_LEN: usize = 16;
    /// `tx_dropped` in `struct rtnl_link_stats64` (the 8th u64).
    const TX_DROPPED_AT: usize = 7 * 8;

    fn align(n: usize) -> usize {
        (n + 3) & !3
    }

    fn attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
        buf.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(data);
        buf.resize(align(buf.len()), 0);
    }

    fn message(ty: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m
    }

    /// RTM_NEWQDISC, create or replace: root `pfifo` with `limit` packets.
    pub fn pfifo_request(ifindex: u32, limit: u32, seq: u32) -> Vec<u8> {
        // struct tcmsg: family, 3 pad bytes, ifindex, handle (the kernel
        // picks one), parent, info.
        let mut body = vec![libc::AF_UNSPEC as u8, 0, 0, 0];
        body.extend_from_slice(&ifindex.to_ne_bytes());
        body.extend_from_slice(&0u32.to_ne_bytes());
        body.extend_from_slice(&TC_H_ROOT.to_ne_bytes());
        body.extend_from_slice(&0u32.to_ne_bytes());
        attr(&mut body, TCA_KIND, b"pfifo\0");
        // struct tc_fifo_qopt { __u32 limit; }
        attr(&mut body, TCA_OPTIONS, &limit.to_ne_bytes());
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
        message(RTM_NEWQDISC, flags, seq, &body)
    }

    /// RTM_GETLINK of one interface.
    pub fn getlink_request(ifindex: u32, seq: u32) -> Vec<u8> {
        // struct ifinfomsg: family, pad, type, index, flags, change.
        let mut body = vec![libc::AF_UNSPEC as u8, 0, 0, 0];
        body.extend_from_slice(&ifindex.to_ne_bytes());
        body.extend_from_slice(&[0; 8]);
        message(RTM_GETLINK, NLM_F_REQUEST, seq, &body)
    }

    /// The (type, payload) of each netlink message in a datagram.
    fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
        std::iter::from_fn(move || {
            if buf.len() < NLMSG_HDRLEN {
                return None;
            }
            let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
            let ty = u16::from_ne_bytes(buf[4..6].try_into().ok()?);
            if len < NLMSG_HDRLEN || len > buf.len() {
                return None;
            }
            let payload = &buf[NLMSG_HDRLEN..len];
            buf = &buf[align(len).min(buf.len())..];
            Some((ty, payload))
        })
    }

    /// The errno of an NLMSG_ERROR message (0: an ACK).
    fn error_of(payload: &[u8]) -> Option<i32> {
        Some(i32::from_ne_bytes(payload.get(0..4)?.try_into().ok()?))
    }

    fn bad(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, format!("rtnetlink: {what}"))
    }

    /// The kernel's answer to a request with NLM_F_ACK.
    pub fn ack(reply: &[u8]) -> io::Result<()> {
        for (ty, payload) in messages(reply) {
            if ty == NLMSG_ERROR {
                return match error_of(payload) {
                    Some(0) => Ok(()),
                    Some(e) => Err(io::Error::from_raw_os_error(-e)),
                    None => Err(bad("short error message")),
                };
            }
        }
        Err(bad("no acknowledgement"))
    }

    /// `tx_dropped` from an RTM_NEWLINK answer.
    pub fn tx_dropped(reply: &[u8]) -> io::Result<u64> {
        for (ty, payload) in messages(reply) {
            match ty {
                NLMSG_ERROR => {
                    let e = error_of(payload).ok_or_else(|| bad("short error message"))?;
                    return Err(io::Error::from_raw_os_error(-e));
                }
                RTM_NEWLINK => {
                    let mut attrs = payload.get(IFINFOMSG_LEN..).unwrap_or_default();
                    while attrs.len() >= 4 {
                        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
                        let ty = u16::from_ne_bytes([attrs[2], attrs[3]]);
                        if len < 4 || len > attrs.len() {
                            break;
                        }
                        if ty == IFLA_STATS64 {
                            let v = attrs
                                .get(4 + TX_DROPPED_AT..4 + TX_DROPPED_AT + 8)
                                .ok_or_else(|| bad("short IFLA_STATS64"))?;
                            return Ok(u64::from_ne_bytes(v.try_into().expect("8 bytes")));
                        }
                        attrs = &attrs[align(len).min(attrs.len())..];
                    }
                    return Err(bad("no IFLA_STATS64"));
                }
                _ => {}
            }
        }
        Err(bad("no link message"))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn pfifo_request_is_what_tc_sends() {
            let m = pfifo_request(7, 10_000, 1);
            // header 16 + tcmsg 20 + kind (4 + "pfifo\0" = 10 -> 12) + options 8
            assert_eq!(m.len(), 56);
            assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 56);
            assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 36);
            assert_eq!(u16::from_ne_bytes(m[6..8].try_into().unwrap()), 0x505);
            assert_eq!(u32::from_ne_bytes(m[20..24].try_into().unwrap()), 7);
            assert_eq!(u32::from_ne_bytes(m[28..32].try_into().unwrap()), TC_H_ROOT);
            assert_eq!(u16::from_ne_bytes(m[36..38].try_into().unwrap()), 10);
            assert_eq!(u16::from_ne_bytes(m[38..40].try_into().unwrap()), TCA_KIND);
            assert_eq!(&m[40..46], b"pfifo\0");
            assert_eq!(u32::from_ne_bytes(m[52..56].try_into().unwrap()), 10_000);
        }

        #[test]
        fn acks_and_errors_are_read() {
            let ok = message(NLMSG_ERROR, 0, 1, &[0; 20]);
            assert!(ack(&ok).is_ok());
            let mut eperm = (-1i32).to_ne_bytes().to_vec();
            eperm.extend_from_slice(&[0; 16]);
            let e = ack(&message(NLMSG_ERROR, 0, 1, &eperm)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM));
            assert!(ack(&[]).is_err());
        }

        #[test]
        fn tx_dropped_is_found_among_the_link_attributes() {
            let mut body = vec![0u8; IFINFOMSG_LEN];
            attr(&mut body, 3, b"soya0\0"); // IFLA_IFNAME
            let mut stats = vec![0u8; 24 * 8];
            stats[TX_DROPPED_AT..TX_DROPPED_AT + 8].copy_from_slice(&2781u64.to_ne_bytes());
            attr(&mut body, IFLA_STATS64, &stats);
            let reply = message(RTM_NEWLINK, 0, 1, &body);
            assert_eq!(tx_dropped(&reply).unwrap(), 2781);
        }
    }
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
