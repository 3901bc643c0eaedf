//! The packet I/O a shard needs, as small traits: the DC side
//! ([`DcPort`]: `udp` lab, `tun`, `xdp`; the per-packet path) with its
//! control half ([`DcControl`]: readiness, description, statistics), the
//! WAN side ([`WanPort`]: UDP sockets), plus the clock ([`Clock`]). The
//! shard's turn ([`super::turn::Turn`]) is written against these only, so
//! it does not know which backend runs, and a test can run it over memory
//! in virtual time (tests/differential.rs in the tools crate). The device
//! loop ([`super::device`]) adds [`DcControl`] and no more: it never looks
//! inside a backend.

use soya_proto::buffer::{LendSource, PacketBuf};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use soya_io::sys::udpio::IoStats;
use soya_io::xdp::XdpStats;
use soya_proto::time::Time;

/// What became of a packet written to the DC side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxOutcome {
    Sent,
    /// udp backend: the destination host's UDP address is not learned yet.
    NoPeer,
    Error,
}

pub use soya_io::dcrx::DcRx;

/// The local data center side of a shard.
pub trait DcPort {
    /// Reads one batch, calling `f(packet, from)` for each packet (`from`:
    /// the lab host's UDP address, if the backend has one). When `f`
    /// returns the packet's inner source address, the backend may learn
    /// where that host is. Returns the packets read and whether the source
    /// was emptied.
    ///
    /// `lent` holds empty pooled buffers the site lent for this batch: a
    /// backend that has to put a packet somewhere anyway (tun's `read`, the
    /// gather of an xdp frame that spans two UMEM chunks) takes one, reads
    /// into it and hands it over as [`DcRx::Lent`], so that the deep
    /// buffer keeps the packet where it landed instead of copying it
    /// again. `buf` is scratch for the rest.
    fn recv_batch(
        &mut self,
        buf: &mut [u8],
        lent: &mut Vec<PacketBuf>,
        f: impl FnMut(DcRx<'_>, Option<SocketAddr>) -> Option<IpAddr>,
    ) -> io::Result<(usize, bool)>;
    /// Sends (or stages until [`Self::flush`]) one IP packet toward local
    /// host `dst`.
    fn send(&mut self, packet: &[u8], dst: IpAddr) -> TxOutcome;
    /// Sends what was staged.
    fn flush(&mut self);
    /// A packet another shard read from `from` had inner source `src`.
    fn learn(&mut self, src: IpAddr, from: SocketAddr);
}

/// What a DC backend reports of itself for `soya status`, the metrics and
/// the shutdown log: one struct whichever backend runs, so the device loop
/// copies it into its snapshot without asking which one that is. A counter
/// a backend does not have is 0 (or empty, or `None`).
#[derive(Clone, Copy, Debug, Default)]
pub struct DcStats {
    /// udp lab: hosts whose UDP address was learned.
    pub lab_hosts: u64,
    /// udp lab: datagrams whose inner source is known under another UDP
    /// address that is still active (not learned from).
    pub lab_host_conflicts: u64,
    /// Packets for the gateway that the kernel dropped before the backend
    /// read them (a full tun queue, socket buffer or AF_XDP ring).
    /// Cumulative.
    pub kernel_drops: u64,
    /// Packets toward the DC that the backend took but the kernel then
    /// refused (udp lab: its `sendmmsg`). The site counted them as sent.
    pub send_refused: u64,
    /// How the backend moves packets, for the status: xdp `zero-copy` or
    /// `copy`; empty for the others.
    pub mode: &'static str,
    /// The system-call counters of the backend's own socket (udp lab), for
    /// the shutdown log.
    pub socket_io: Option<IoStats>,
    /// The AF_XDP socket's counters (all 0 on the other backends).
    pub xdp: XdpStats,
}

/// The rest of a DC backend, beside its per-packet path ([`DcPort`]): what
/// the device loop needs to wait on it, name it, lend it buffers and report
/// it. Called once per turn at most ([`Self::holds_unresolved`]), the rest
/// at start, on a snapshot or at shutdown.
pub trait DcControl: DcPort {
    /// The descriptor to wait on for packets from the DC.
    fn fd(&self) -> RawFd;
    /// Where it attaches, for logs and the status table.
    fn describe(&self) -> String;
    /// Where the site's pools should take packet buffers
    /// (`Site::set_lender`): the xdp backend's UMEM; `None` for the others.
    fn lend_source(&self) -> Option<Arc<dyn LendSource>> {
        None
    }
    /// Packets held for a host the kernel is resolving (xdp): the device
    /// loop then turns again within a millisecond to send them.
    fn holds_unresolved(&self) -> bool {
        false
    }
    /// The backend's counters ([`DcStats`]).
    fn stats(&self) -> DcStats;
}

/// The WAN side of a shard: one or more sockets, each carrying some paths.
pub trait WanPort {
    /// Sockets (each has its own readiness).
    fn sockets(&self) -> usize;
    /// Reads one batch from socket `sock`, calling `f(path, datagram)`.
    /// Returns the datagrams read and whether the socket was emptied.
    fn recv_batch(&mut self, sock: usize, f: impl FnMut(usize, &mut [u8])) -> (usize, bool);
    /// Stages `buf[off..off + len]` of the buffer later given to
    /// [`Self::flush`] for `path`.
    fn stage(&mut self, path: usize, off: usize, len: usize);
    /// Sends everything staged.
    fn flush(&mut self, buf: &[u8]);
}

/// The shard's time: the daemon's is the monotonic clock, a test's is
/// virtual.
pub trait Clock {
    fn now(&self) -> Time;
    /// Returns at `t` or later (a paced datagram due very soon).
    fn wait_until(&self, t: Time);
}

/// Monotonic time since the gateway started.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    pub epoch: Instant,
}

impl MonotonicClock {
    pub fn instant(&self, t: Time) -> Instant {
        self.epoch + Duration::from_nanos(t.as_nanos())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Time {
        Time::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn wait_until(&self, t: Time) {
        let due = self.instant(t);
        while Instant::now() < due {
            std::hint::spin_loop();
        }
    }
}

impl WanPort for super::wanio::WanSockets {
    fn sockets(&self) -> usize {
        self.len()
    }

    fn recv_batch(&mut self, sock: usize, f: impl FnMut(usize, &mut [u8])) -> (usize, bool) {
        super::wanio::WanSockets::recv_batch(self, sock, f)
    }

    fn stage(&mut self, path: usize, off: usize, len: usize) {
        super::wanio::WanSockets::stage(self, path, off, len)
    }

    fn flush(&mut self, buf: &[u8]) {
        super::wanio::WanSockets::flush(self, buf)
    }
}
