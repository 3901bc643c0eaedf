//! Batched UDP I/O of the lab tools (the WAN emulator, the software RoCE
//! endpoint): `recvmmsg` / `sendmmsg` into caller-owned slots, with kernel
//! receive timestamps, GRO and GSO.
//!
//! The GSO grouping and the control messages are [`super::mmsg`]'s, the
//! same code as the gateway's [`super::udpio`]. What stays here is the
//! front end the tools need and udpio does not offer: receiving into
//! buffers the caller lends (the WAN emulator's packet pool, no copy) with
//! a landing area per message for GRO overflow and the kernel's receive
//! time, and sending a run to one destination (or a connected peer),
//! waiting up to 100 ms for room instead of dropping.

use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::time::Duration;

use super::mmsg::{self, Group, CTRL_LEN};
use super::{wait_writable, zeroed_vec, RawAddr};

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
    /// Scratch for [`recv_into`](Self::recv_into).
    ptrs: Vec<*mut u8>,
}

// SAFETY: the raw pointers inside the headers and scratch vectors are
// rewritten before every system call and never used outside one.
unsafe impl Send for RecvBatch {}
// SAFETY: as for RecvBatch.
unsafe impl Send for SendBatch {}

impl RecvBatch {
    /// `landing`: bytes per message beyond its buffer (0 = none), for
    /// GRO batches and oversize datagrams.
    pub fn new(cap: usize, landing: usize) -> RecvBatch {
        RecvBatch {
            hdrs: zeroed_vec(cap),
            iovs: zeroed_vec(cap),
            addrs: zeroed_vec(cap),
            ctrl: vec![[0; CTRL_LEN / 8]; cap],
            landing: vec![0; cap * landing],
            landing_len: landing,
            kernel_drops: 0,
            ptrs: Vec::with_capacity(cap),
        }
    }

    /// [`recv`](Self::recv) into `bufs`, each buffer as long as the
    /// shortest of them.
    pub fn recv_into(
        &mut self,
        fd: RawFd,
        bufs: &mut [&mut [u8]],
        meta: &mut [RxMeta],
    ) -> io::Result<usize> {
        let len = bufs.iter().map(|b| b.len()).min().unwrap_or(0);
        self.ptrs.clear();
        self.ptrs.extend(bufs.iter_mut().map(|b| b.as_mut_ptr()));
        let ptrs = std::mem::take(&mut self.ptrs);
        // SAFETY: every pointer comes from a distinct `&mut [u8]` of at
        // least `len` bytes, borrowed for the whole call.
        let r = unsafe { self.recv(fd, &ptrs, len, meta) };
        self.ptrs = ptrs;
        r
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
        let hdrs = self.hdrs.as_mut_ptr();
        let got = super::nonblocking(|| {
            let r = libc::recvmmsg(
                fd,
                hdrs,
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            );
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        })?
        .unwrap_or(0);
        for (i, m) in meta.iter_mut().enumerate().take(got) {
            let len = self.hdrs[i].msg_len as usize;
            let h = &mut self.hdrs[i].msg_hdr;
            *m = RxMeta {
                len,
                truncated: h.msg_flags & libc::MSG_TRUNC != 0,
                rx_real_ns: None,
                segment: None,
            };
            // The kernel filled msg_controllen bytes of ctrl[i].
            let cm = mmsg::rx_cmsgs(h);
            m.rx_real_ns = cm.rx_real_ns;
            m.segment = cm.gro_segment.filter(|&g| g < len);
            if let Some(d) = cm.drops {
                self.kernel_drops = self.kernel_drops.max(u64::from(d));
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

/// Reusable `sendmmsg` state; with `gso`, runs of equal-size datagrams to
/// the same place go out as one message each (`UDP_SEGMENT`), which the
/// kernel splits back into the original datagrams.
pub struct SendBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<[u64; CTRL_LEN / 8]>,
    /// The GSO messages of the run being sent.
    groups: Vec<Group>,
    pub gso: bool,
    /// Scratch for [`send_slices`](Self::send_slices).
    pkts: Vec<(*const u8, usize)>,
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
        SendBatch {
            hdrs: zeroed_vec(cap),
            iovs: zeroed_vec(cap),
            ctrl: vec![[0; CTRL_LEN / 8]; cap],
            groups: Vec::with_capacity(cap),
            gso,
            pkts: Vec::with_capacity(cap),
        }
    }

    /// One destination for the whole run: only sizes split it.
    fn group(&mut self, pkts: &[(*const u8, usize)]) {
        mmsg::group(
            pkts.len(),
            |i| pkts[i].1,
            |_, _| true,
            self.gso,
            &mut self.groups,
        );
    }

    /// [`send`](Self::send) of `pkts`.
    pub fn send_slices(
        &mut self,
        fd: RawFd,
        pkts: &[&[u8]],
        dest: Option<&RawAddr>,
    ) -> SendOutcome {
        let mut raw = std::mem::take(&mut self.pkts);
        raw.clear();
        raw.extend(pkts.iter().map(|p| (p.as_ptr(), p.len())));
        // SAFETY: every (pointer, length) is a live slice borrowed for the
        // whole call.
        let out = unsafe { self.send(fd, &raw, dest) };
        self.pkts = raw;
        out
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
                let Group { first, count, seg } = self.groups[g0 + j];
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
                mmsg::set_segment(h, &mut self.ctrl[j], count, seg);
            }
            let r = libc::sendmmsg(fd, self.hdrs.as_mut_ptr(), n as libc::c_uint, 0);
            if r > 0 {
                for &Group { first, count, .. } in &self.groups[g0..g0 + r as usize] {
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
            let Group { first, count, .. } = self.groups[g0];
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
