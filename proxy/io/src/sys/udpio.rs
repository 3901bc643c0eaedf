//! Batched UDP I/O for the WAN sockets (and the lab DC socket).
//!
//! Sending: [`UdpIo::send`] takes a run of datagrams (slices of one staging
//! buffer, each with its destination) and sends them with as few system
//! calls as it can:
//!
//! - **GSO** (`UDP_SEGMENT`): consecutive datagrams of the same size to the
//!   same destination (the last of a run may be shorter) go out as one
//!   message, which the kernel (or the NIC) cuts back into the original
//!   datagrams; up to [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`] per message.
//!   Several such messages go in one `sendmmsg(2)`.
//! - **sendmmsg** alone when GSO is unavailable: the kernel refused the
//!   option at start-up, or a GSO send failed with `EIO` / `EINVAL` /
//!   `EOPNOTSUPP` (a device without checksum offload): GSO is then switched
//!   off for that socket with a log line and the run is re-sent datagram by
//!   datagram. A GSO message refused with `EMSGSIZE` (segments larger than
//!   the route's MTU, which single datagrams may still cross fragmented) is
//!   re-sent datagram by datagram, GSO staying on.
//! - **single**: one `sendto(2)` per datagram (the old path; kept for
//!   comparison and as the last resort).
//!
//! Receiving: [`UdpIo::recv`] reads up to a batch of messages with one
//! `recvmmsg(2)`; with **GRO** (`UDP_GRO`) each message may hold several
//! datagrams coalesced by the kernel, and the `UDP_GRO` control message
//! gives the segment size (every segment that size, the last possibly
//! shorter). The caller sees one callback per original datagram.
//!
//! With the `io-uring` cargo feature, [`super::uring`] offers the
//! same send and receive through an io_uring instead.
//!
//! Errors never stop the loop: a datagram the kernel refuses (full socket
//! buffer, ICMP error of an earlier send) is counted and dropped; the WAN
//! transport's loss recovery handles it.
//!
//! **Why our own code and not `quinn-udp`** (evaluated 2026-11-29 against
//! quinn-udp 0.6.3, issue 37). quinn-udp's `UdpSocketState::send` takes one
//! `Transmit`: one destination, one contiguous buffer, optionally cut by
//! GSO, sent with one `sendmsg`. What this module does that it does not:
//!
//! - many GSO messages, to different paths and peers, in **one
//!   `sendmmsg`** (a shard's turn sends to every path it has data for;
//!   quinn-udp would make one system call per message);
//! - GSO messages **gathered from one iovec per datagram** where the
//!   sealed datagrams lie in the staging buffer (quinn-udp wants the
//!   segments contiguous);
//! - an `EMSGSIZE` GSO message re-sent datagram by datagram with GSO kept
//!   for the others (quinn-udp reports `EMSGSIZE` as sent: right for QUIC's
//!   MTU probes, a silent loss here);
//! - the socket's **drop counter** (`SO_RXQ_OVFL`) with every receive,
//!   which `soya status` reports;
//! - the **io_uring** mode (`sys::uring`, `SOYA_IO=uring`).
//!
//! What quinn-udp has that this does not: ECN and destination-address
//! (`IP_PKTINFO`) control messages, the error queue, other platforms —
//! none of which the gateway uses. It also needs Rust 1.88, above the
//! workspace's 1.85. A port of the WAN side was not measured (it would
//! have had to give up the first two points); the decision rests on the
//! features above. So this module stays, and the one copy of the
//! mechanics it shares with the tools' stack ([`super::batch`]: GSO
//! grouping, the `UDP_SEGMENT` control message, reading `UDP_GRO`,
//! `SO_RXQ_OVFL` and timestamps) is [`super::mmsg`].

use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::RawFd;

use super::mmsg::{self, Group, CTRL_LEN};
pub use super::mmsg::{GSO_MAX_BYTES, GSO_MAX_SEGMENTS};
pub use super::{enable_gro, enable_rxq_ovfl, probe_gso};
use super::{storage_to_std as to_std, zeroed_vec, RawAddr};

/// Largest UDP payload, and so the largest coalesced (GRO) message.
pub const MAX_UDP_PAYLOAD: usize = 65_535;

/// How a socket sends and receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// GSO and GRO where the kernel has them, sendmmsg / recvmmsg otherwise.
    Gso,
    /// sendmmsg / recvmmsg, no segmentation offload.
    Mmsg,
    /// One datagram per system call (`sendto` / `recvfrom`).
    Single,
    /// The GSO / GRO messages of `Gso`, submitted through an io_uring (one
    /// SENDMSG / RECVMSG entry per message, one `io_uring_enter` per
    /// batch). Only with the `io-uring` cargo feature.
    Uring,
}

impl IoMode {
    pub fn parse(s: &str) -> Option<IoMode> {
        Some(match s {
            "gso" | "auto" => IoMode::Gso,
            "mmsg" | "sendmmsg" => IoMode::Mmsg,
            "single" | "plain" => IoMode::Single,
            "uring" | "io-uring" | "io_uring" => IoMode::Uring,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            IoMode::Gso => "gso",
            IoMode::Mmsg => "mmsg",
            IoMode::Single => "single",
            IoMode::Uring => "uring",
        }
    }

    /// Whether this build can do it (`uring` needs the `io-uring` feature).
    pub fn available(self) -> bool {
        self != IoMode::Uring || cfg!(feature = "io-uring")
    }
}

/// One datagram of a send run: `buf[off..off + len]` to `dest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxDatagram {
    pub off: usize,
    pub len: usize,
    pub dest: SocketAddr,
}

/// Counters of one socket's I/O.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    pub send_calls: u64,
    pub datagrams_sent: u64,
    /// GSO messages (each carrying 2 or more datagrams).
    pub gso_messages: u64,
    pub send_errors: u64,
    pub recv_calls: u64,
    pub datagrams_received: u64,
    /// Messages that carried more than one datagram (GRO).
    pub gro_messages: u64,
    pub recv_errors: u64,
    /// Datagrams the kernel dropped on this socket for want of buffer
    /// (`SO_RXQ_OVFL`; cumulative, as last reported).
    pub kernel_drops: u64,
}

/// The ring takes the `msghdr` of each `mmsghdr` (it reports the lengths
/// itself, in its completions).
#[cfg(feature = "io-uring")]
fn msghdr_ptrs(hdrs: &mut [libc::mmsghdr]) -> Vec<*mut libc::msghdr> {
    hdrs.iter_mut()
        .map(|h| &mut h.msg_hdr as *mut libc::msghdr)
        .collect()
}

/// Cuts `pkts` into GSO groups (or one group per datagram without GSO).
fn group(pkts: &[TxDatagram], gso: bool, out: &mut Vec<Group>) {
    mmsg::group(
        pkts.len(),
        |i| pkts[i].len,
        |a, b| pkts[a].dest == pkts[b].dest,
        gso,
        out,
    );
}

/// One received datagram: `len` bytes at `off` of the receive buffer.
#[derive(Clone, Copy, Debug)]
struct RxDatagram {
    off: usize,
    len: usize,
    from: Option<SocketAddr>,
}

/// Batched I/O state of one (non-blocking) UDP socket. It does not own the
/// socket.
pub struct UdpIo {
    fd: RawFd,
    mode: IoMode,
    gso: bool,
    gro: bool,
    what: String,
    pub stats: IoStats,
    // send side
    groups: Vec<Group>,
    tx_hdrs: Vec<libc::mmsghdr>,
    tx_iovs: Vec<libc::iovec>,
    tx_ctrl: Vec<[u64; CTRL_LEN / 8]>,
    tx_names: Vec<RawAddr>,
    // receive side
    rx_slot: usize,
    rx_buf: Vec<u8>,
    rx_hdrs: Vec<libc::mmsghdr>,
    rx_iovs: Vec<libc::iovec>,
    rx_names: Vec<libc::sockaddr_storage>,
    rx_ctrl: Vec<[u64; CTRL_LEN / 8]>,
    rx_out: Vec<RxDatagram>,
    /// Per receive message: bytes received (None: nothing / an error).
    rx_got: Vec<Option<usize>>,
    /// Messages the last receive call returned.
    rx_last: usize,
    #[cfg(feature = "io-uring")]
    ring: Option<super::uring::Ring>,
}

// SAFETY: the raw pointers inside the mmsghdr / iovec arrays are scratch
// space, rewritten before every system call and never dereferenced outside
// one; UdpIo owns everything they point to.
unsafe impl Send for UdpIo {}

impl std::fmt::Debug for UdpIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpIo")
            .field("fd", &self.fd)
            .field("mode", &self.mode)
            .field("gso", &self.gso)
            .field("gro", &self.gro)
            .field("stats", &self.stats)
            .finish()
    }
}

impl UdpIo {
    /// Sets `fd` up for `mode`: probes GSO, enables GRO. `batch`: messages
    /// per `sendmmsg` / `recvmmsg`; `max_datagram`: the largest datagram
    /// expected (receive slots are that big without GRO, 64 KiB with it).
    /// `what` names the socket in log lines.
    pub fn new(fd: RawFd, mode: IoMode, batch: usize, max_datagram: usize, what: &str) -> UdpIo {
        let batch = batch.max(1);
        #[cfg(feature = "io-uring")]
        let ring = if mode == IoMode::Uring {
            match super::uring::Ring::new(batch.max(1) * 2) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(socket = what, error = %e, "io_uring unavailable: using sendmmsg / recvmmsg");
                    None
                }
            }
        } else {
            None
        };
        #[cfg(not(feature = "io-uring"))]
        let mode = if mode == IoMode::Uring {
            tracing::warn!(
                socket = what,
                "io_uring asked for but this build has no `io-uring` feature: using GSO / sendmmsg"
            );
            IoMode::Gso
        } else {
            mode
        };
        let (gso, gro) = if matches!(mode, IoMode::Gso | IoMode::Uring) {
            (probe_gso(fd), enable_gro(fd))
        } else {
            (false, false)
        };
        if mode == IoMode::Gso && !(gso && gro) {
            tracing::info!(
                socket = what,
                gso,
                gro,
                "udp segmentation offload not (fully) available: using sendmmsg / recvmmsg"
            );
        }
        enable_rxq_ovfl(fd);
        let rx_slot = if gro {
            MAX_UDP_PAYLOAD
        } else {
            max_datagram.clamp(1, MAX_UDP_PAYLOAD)
        };
        let rx_batch = if mode == IoMode::Single { 1 } else { batch };
        let tx_batch = if mode == IoMode::Single { 1 } else { batch };
        UdpIo {
            fd,
            mode,
            gso,
            gro,
            what: what.to_string(),
            stats: IoStats::default(),
            groups: Vec::with_capacity(tx_batch),
            tx_hdrs: zeroed_vec(tx_batch),
            tx_iovs: Vec::with_capacity(tx_batch * GSO_MAX_SEGMENTS),
            tx_ctrl: vec![[0; CTRL_LEN / 8]; tx_batch],
            tx_names: vec![RawAddr::from_std(SocketAddr::from(([0, 0, 0, 0], 0))); tx_batch],
            rx_slot,
            rx_buf: vec![0; rx_slot * rx_batch],
            rx_hdrs: zeroed_vec(rx_batch),
            rx_iovs: zeroed_vec(rx_batch),
            rx_names: zeroed_vec(rx_batch),
            rx_ctrl: vec![[0; CTRL_LEN / 8]; rx_batch],
            rx_out: Vec::with_capacity(rx_batch * GSO_MAX_SEGMENTS),
            rx_got: vec![None; rx_batch],
            rx_last: 0,
            #[cfg(feature = "io-uring")]
            ring,
        }
    }

    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// GSO in use (probed at start-up, switched off after a failed send).
    pub fn gso(&self) -> bool {
        self.gso
    }

    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Sends without GSO from now on (receiving is unchanged).
    pub fn disable_gso(&mut self) {
        self.gso = false;
    }

    /// Sends every datagram of `pkts` (slices of `buf`). Returns how many
    /// the kernel took; the rest were refused (counted in `send_errors`).
    pub fn send(&mut self, buf: &[u8], pkts: &[TxDatagram]) -> usize {
        if pkts.is_empty() {
            return 0;
        }
        if self.mode == IoMode::Single {
            return self.send_single(buf, pkts);
        }
        let mut sent = 0;
        let mut start = 0;
        while start < pkts.len() {
            // At most tx_hdrs.len() messages per sendmmsg.
            let chunk = &pkts[start..];
            let (n, done, gso_failed) = self.send_mmsg(buf, chunk);
            sent += n;
            start += done;
            if gso_failed {
                // Re-send what the failed GSO message held, one by one.
                continue;
            }
        }
        sent
    }

    fn send_single(&mut self, buf: &[u8], pkts: &[TxDatagram]) -> usize {
        let mut sent = 0;
        for p in pkts {
            let a = RawAddr::from_std(p.dest);
            self.stats.send_calls += 1;
            // SAFETY: buf[off..off + len] is in bounds (checked by the
            // slice below); the address is a valid sockaddr of `len` bytes.
            let d = &buf[p.off..p.off + p.len];
            let r = unsafe {
                libc::sendto(
                    self.fd,
                    d.as_ptr().cast(),
                    d.len(),
                    0,
                    (&a.storage as *const libc::sockaddr_storage).cast(),
                    a.len,
                )
            };
            if r >= 0 {
                sent += 1;
            } else {
                self.stats.send_errors += 1;
            }
        }
        self.stats.datagrams_sent += sent as u64;
        sent
    }

    /// One sendmmsg over a prefix of `pkts`. Returns (datagrams sent,
    /// datagrams consumed (sent or given up), whether GSO just failed).
    fn send_mmsg(&mut self, buf: &[u8], pkts: &[TxDatagram]) -> (usize, usize, bool) {
        group(pkts, self.gso, &mut self.groups);
        let nmsg = self.groups.len().min(self.tx_hdrs.len());
        self.tx_iovs.clear();
        for p in pkts {
            let d = &buf[p.off..p.off + p.len];
            self.tx_iovs.push(libc::iovec {
                iov_base: d.as_ptr() as *mut libc::c_void,
                iov_len: d.len(),
            });
        }
        for j in 0..nmsg {
            let g = self.groups[j];
            self.tx_names[j] = RawAddr::from_std(pkts[g.first].dest);
            let h = &mut self.tx_hdrs[j];
            h.msg_len = 0;
            let m = &mut h.msg_hdr;
            m.msg_name = (&mut self.tx_names[j].storage as *mut libc::sockaddr_storage).cast();
            m.msg_namelen = self.tx_names[j].len;
            // SAFETY: first < tx_iovs.len() (one iovec per datagram).
            m.msg_iov = unsafe { self.tx_iovs.as_mut_ptr().add(g.first) };
            m.msg_iovlen = g.count as _;
            m.msg_flags = 0;
            mmsg::set_segment(m, &mut self.tx_ctrl[j], g.count, g.seg);
        }
        self.stats.send_calls += 1;
        let r = self.submit_tx(nmsg);
        if r > 0 {
            let r = r as usize;
            let mut n = 0;
            for g in &self.groups[..r] {
                n += g.count;
                if g.count > 1 {
                    self.stats.gso_messages += 1;
                }
            }
            self.stats.datagrams_sent += n as u64;
            return (n, n, false);
        }
        let e = io::Error::from_raw_os_error(-r as i32);
        let g = self.groups[0];
        match e.raw_os_error() {
            Some(libc::EINTR) => (0, 0, false),
            Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP) if g.count > 1 => {
                tracing::warn!(
                    socket = %self.what,
                    error = %e,
                    "udp GSO send failed (no segmentation offload on this route): \
                     falling back to sendmmsg without GSO"
                );
                self.gso = false;
                (0, 0, true)
            }
            Some(libc::EMSGSIZE) if g.count > 1 => {
                // Segments larger than the route's MTU: the kernel will not
                // segment, but may fragment single datagrams. This group
                // goes one by one; GSO stays on for the others.
                let group = g;
                self.gso = false;
                let n = self.send(buf, &pkts[group.first..group.first + group.count]);
                self.gso = true;
                (n, group.count, false)
            }
            _ => {
                // ECONNREFUSED (ICMP from an earlier send), ENOBUFS, EAGAIN
                // (full buffer): these datagrams are lost.
                self.stats.send_errors += g.count as u64;
                (0, g.count, false)
            }
        }
    }

    /// Sends the first `nmsg` prepared headers: how many leading messages
    /// went (> 0), or −errno of the first one.
    fn submit_tx(&mut self, nmsg: usize) -> isize {
        #[cfg(feature = "io-uring")]
        if let Some(ring) = &mut self.ring {
            let hdrs = msghdr_ptrs(&mut self.tx_hdrs[..nmsg]);
            // SAFETY: every header points at live iovecs, addresses and
            // control buffers, which stay untouched until the ring has
            // completed them (send_msgs waits for all).
            return unsafe { ring.send_msgs(self.fd, &hdrs) };
        }
        // SAFETY: nmsg headers, each pointing at live iovecs (into `buf`,
        // borrowed by the caller for the call), a live address and control
        // buffer.
        let r = unsafe { libc::sendmmsg(self.fd, self.tx_hdrs.as_mut_ptr(), nmsg as _, 0) };
        if r < 0 {
            -(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO) as isize)
        } else {
            r as isize
        }
    }

    /// Receives into the first `nmsg` prepared headers: fills `rx_got`;
    /// returns −errno when nothing came because of an error.
    fn submit_rx(&mut self, nmsg: usize) -> isize {
        for g in &mut self.rx_got[..nmsg] {
            *g = None;
        }
        #[cfg(feature = "io-uring")]
        if let Some(ring) = &mut self.ring {
            let hdrs = msghdr_ptrs(&mut self.rx_hdrs[..nmsg]);
            // SAFETY: every header points at live slots, names and control
            // buffers, untouched until the ring completed them.
            return unsafe { ring.recv_msgs(self.fd, &hdrs, &mut self.rx_got[..nmsg]) };
        }
        // SAFETY: nmsg headers pointing at live slots, names and control
        // buffers of the sizes they declare.
        let r = unsafe {
            libc::recvmmsg(
                self.fd,
                self.rx_hdrs.as_mut_ptr(),
                nmsg as _,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return -(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO) as isize);
        }
        for i in 0..r as usize {
            self.rx_got[i] = Some(self.rx_hdrs[i].msg_len as usize);
        }
        r as isize
    }

    /// Reads one batch (one `recvmmsg`) and calls `f(datagram, source)` for
    /// every datagram in it, GRO messages cut back into their datagrams.
    /// Returns how many datagrams were delivered (0: nothing waiting).
    /// Fewer than [`batch`](Self::batch) *messages* means the socket was
    /// emptied: see [`drained`](Self::drained). The datagram is mutable
    /// (it lies in this reader's own buffer, overwritten by the next call):
    /// the WAN transport decrypts it in place.
    pub fn recv(&mut self, mut f: impl FnMut(&mut [u8], Option<SocketAddr>)) -> usize {
        self.recv_batch();
        let n = self.rx_out.len();
        for d in &self.rx_out {
            f(&mut self.rx_buf[d.off..d.off + d.len], d.from);
        }
        self.rx_out.clear();
        n
    }

    /// Messages per receive call.
    pub fn batch(&self) -> usize {
        self.rx_hdrs.len()
    }

    /// The last [`recv`](Self::recv) got fewer messages than it had room
    /// for: the socket was empty then, and another call would most likely
    /// find nothing (one system call saved per batch).
    pub fn drained(&self) -> bool {
        self.rx_last < self.rx_hdrs.len()
    }

    fn recv_batch(&mut self) {
        self.rx_out.clear();
        self.rx_last = 0;
        let nmsg = self.rx_hdrs.len();
        let base = self.rx_buf.as_mut_ptr();
        for i in 0..nmsg {
            self.rx_iovs[i] = libc::iovec {
                // SAFETY: slot i lies within rx_buf (nmsg slots of rx_slot).
                iov_base: unsafe { base.add(i * self.rx_slot) }.cast(),
                iov_len: self.rx_slot,
            };
            let m = &mut self.rx_hdrs[i].msg_hdr;
            m.msg_name = (&mut self.rx_names[i] as *mut libc::sockaddr_storage).cast();
            m.msg_namelen = size_of::<libc::sockaddr_storage>() as _;
            m.msg_iov = &mut self.rx_iovs[i];
            m.msg_iovlen = 1;
            m.msg_control = self.rx_ctrl[i].as_mut_ptr().cast();
            m.msg_controllen = CTRL_LEN as _;
            m.msg_flags = 0;
            self.rx_hdrs[i].msg_len = 0;
        }
        self.stats.recv_calls += 1;
        let r = self.submit_rx(nmsg);
        if r < 0 {
            if !super::not_now(&io::Error::from_raw_os_error(-r as i32)) {
                // ICMP errors for earlier sends (twin down) land here.
                self.stats.recv_errors += 1;
            }
            return;
        }
        self.rx_last = r as usize;
        for i in 0..nmsg {
            let Some(len) = self.rx_got[i] else {
                continue;
            };
            let m = &self.rx_hdrs[i].msg_hdr;
            if m.msg_flags & libc::MSG_TRUNC != 0 {
                // Larger than any datagram we send: not ours.
                self.stats.recv_errors += 1;
                continue;
            }
            // SAFETY: the kernel filled msg_controllen bytes of rx_ctrl[i].
            let cm = unsafe { mmsg::rx_cmsgs(m) };
            let seg = cm.gro_segment.unwrap_or(len);
            if let Some(d) = cm.drops {
                self.stats.kernel_drops = self.stats.kernel_drops.max(u64::from(d));
            }
            let from = to_std(&self.rx_names[i]);
            let slot = i * self.rx_slot;
            if seg < len {
                self.stats.gro_messages += 1;
            }
            let mut off = 0;
            while off < len || (len == 0 && off == 0) {
                let l = seg.min(len - off);
                self.rx_out.push(RxDatagram {
                    off: slot + off,
                    len: l,
                    from,
                });
                if l == 0 {
                    break;
                }
                off += l;
            }
        }
        self.stats.datagrams_received += self.rx_out.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    fn sock() -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    /// Datagram `i` of a test run: `len` bytes, each tagged with `i`.
    fn body(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|k| (i * 31 + k) as u8).collect()
    }

    /// Sends datagrams of `lens` from a `tx_mode` socket to a `rx_mode`
    /// socket (all to the same destination unless `split` is given: the
    /// indices that go to a second receiver) and returns what each
    /// receiver got, in order, plus the sender's stats.
    fn exchange(
        lens: &[usize],
        tx_mode: IoMode,
        rx_mode: IoMode,
    ) -> (Vec<Vec<u8>>, IoStats, IoStats) {
        let (a, b) = (sock(), sock());
        let mut tx = UdpIo::new(a.as_raw_fd(), tx_mode, 64, 9000, "test tx");
        let mut rx = UdpIo::new(b.as_raw_fd(), rx_mode, 64, 9000, "test rx");
        let dest = b.local_addr().unwrap();
        let mut buf = Vec::new();
        let mut pkts = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            pkts.push(TxDatagram {
                off: buf.len(),
                len,
                dest,
            });
            buf.extend(body(i, len));
        }
        assert_eq!(tx.send(&buf, &pkts), lens.len());
        let mut got = Vec::new();
        let t0 = Instant::now();
        while got.len() < lens.len() && t0.elapsed() < Duration::from_secs(5) {
            rx.recv(|d, from| {
                assert_eq!(from, Some(a.local_addr().unwrap()));
                got.push(d.to_vec());
            });
        }
        (got, tx.stats, rx.stats)
    }

    fn expect(lens: &[usize], got: &[Vec<u8>]) {
        assert_eq!(got.len(), lens.len(), "datagram count");
        for (i, (&len, g)) in lens.iter().zip(got).enumerate() {
            assert_eq!(g.len(), len, "datagram {i} length");
            assert_eq!(g, &body(i, len), "datagram {i} bytes");
        }
    }

    #[test]
    fn gso_to_gro_keeps_every_datagram_with_an_odd_last_segment() {
        let lens = [1200, 1200, 1200, 1200, 777];
        let (got, tx, rx) = exchange(&lens, IoMode::Gso, IoMode::Gso);
        expect(&lens, &got);
        if tx.gso_messages > 0 {
            // One GSO message; the receiver saw it coalesced (or not: GRO
            // is the kernel's choice), never merged across boundaries.
            assert_eq!(tx.send_calls, 1);
            assert!(rx.gro_messages <= 1);
        }
    }

    #[test]
    fn gso_with_mixed_sizes_and_a_receiver_without_gro() {
        let lens = [500, 1400, 1400, 300, 800, 800, 800, 8000, 8000, 1, 64, 64];
        let (got, tx, _) = exchange(&lens, IoMode::Gso, IoMode::Mmsg);
        expect(&lens, &got);
        if tx.gso_messages > 0 {
            // [500] [1400 1400 300] [800 800 800] [8000 8000 1] [64 64]
            assert_eq!(tx.gso_messages, 4);
            assert_eq!(tx.send_calls, 1);
        }
        let (got, _, _) = exchange(&lens, IoMode::Mmsg, IoMode::Gso);
        expect(&lens, &got);
        let (got, tx, rx) = exchange(&lens, IoMode::Single, IoMode::Single);
        expect(&lens, &got);
        assert_eq!(tx.send_calls, lens.len() as u64);
        assert_eq!(rx.datagrams_received, lens.len() as u64);
    }

    #[cfg(feature = "io-uring")]
    #[test]
    fn io_uring_sends_and_receives_gso_runs_and_mixed_sizes() {
        let lens = [500, 1400, 1400, 300, 800, 800, 800, 8000, 8000, 1, 64, 64];
        let (got, tx, rx) = exchange(&lens, IoMode::Uring, IoMode::Uring);
        expect(&lens, &got);
        assert_eq!(tx.datagrams_sent, lens.len() as u64);
        assert_eq!(rx.datagrams_received, lens.len() as u64);
        let (got, _, _) = exchange(&lens, IoMode::Uring, IoMode::Mmsg);
        expect(&lens, &got);
    }

    #[test]
    fn many_equal_datagrams_split_into_gso_messages_within_limits() {
        // 150 × 1000 B: 64 + 1 (65 000 B limit) ... 65, 65, 20 per message.
        let lens = vec![1000; 150];
        let (got, tx, rx) = exchange(&lens, IoMode::Gso, IoMode::Gso);
        expect(&lens, &got);
        assert_eq!(rx.datagrams_received, 150);
        if tx.gso_messages > 0 {
            assert_eq!(tx.gso_messages, 3);
        }
    }

    /// In a network namespace of its own whose loopback has a 1500-byte
    /// MTU, a GSO segment of 1600 bytes is refused by the kernel
    /// (EMSGSIZE): the group must go without GSO (fragmented) and still
    /// deliver everything, and GSO stays on for what fits.
    #[test]
    fn gso_refused_by_the_kernel_falls_back_to_sendmmsg() {
        let r = std::thread::spawn(|| {
            if crate::sys::unshare_netns().is_err() {
                eprintln!("skipped: no CAP_SYS_ADMIN for a network namespace");
                return None;
            }
            let ok = std::process::Command::new("ip")
                .args(["link", "set", "lo", "mtu", "1500", "up"])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("skipped: cannot configure lo in the namespace (no `ip`?)");
                return None;
            }
            let lens = [1600, 1600, 1600, 900];
            Some((
                lens,
                exchange(&lens, IoMode::Gso, IoMode::Gso),
                exchange(&[1000, 1000, 600], IoMode::Gso, IoMode::Gso),
            ))
        })
        .join()
        .unwrap();
        let Some((lens, (got, tx, _), (got2, tx2, _))) = r else {
            return;
        };
        expect(&lens, &got);
        assert_eq!(
            tx.gso_messages, 0,
            "the kernel took a GSO message it should refuse"
        );
        assert_eq!(tx.send_errors, 0);
        expect(&[1000, 1000, 600], &got2);
        assert!(tx2.gso_messages <= 1);
    }

    fn d(len: usize, port: u16) -> TxDatagram {
        TxDatagram {
            off: 0,
            len,
            dest: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    fn shape(pkts: &[TxDatagram], gso: bool) -> Vec<(usize, usize, usize)> {
        let mut g = Vec::new();
        group(pkts, gso, &mut g);
        g.iter().map(|g| (g.first, g.count, g.seg)).collect()
    }

    #[test]
    fn grouping_equal_sizes_then_a_shorter_last() {
        let p = [d(100, 1), d(100, 1), d(100, 1), d(40, 1), d(100, 1)];
        assert_eq!(shape(&p, true), vec![(0, 4, 100), (4, 1, 100)]);
        assert_eq!(shape(&p, false).len(), 5);
    }

    #[test]
    fn grouping_breaks_on_destination_growth_and_limits() {
        let p = [d(100, 1), d(100, 2), d(50, 2), d(60, 2)];
        assert_eq!(shape(&p, true), vec![(0, 1, 100), (1, 2, 100), (3, 1, 60)]);
        let many: Vec<_> = (0..70).map(|_| d(10, 1)).collect();
        assert_eq!(shape(&many, true), vec![(0, 64, 10), (64, 6, 10)]);
        let big: Vec<_> = (0..10).map(|_| d(9000, 1)).collect();
        assert_eq!(shape(&big, true), vec![(0, 7, 9000), (7, 3, 9000)]);
    }
}
