//! The packet I/O a shard needs, as two small traits: the DC side
//! ([`DcPort`]: `udp` lab, `tun`, …) and the WAN side ([`WanPort`]: UDP
//! sockets), plus the clock ([`Clock`]). The shard's turn
//! ([`super::turn::Turn`]) is written against these only, so it does not
//! know which backend runs, and a test can run it over memory in virtual
//! time (tests/differential.rs in the tools crate).

use soya_proto::buffer::PacketBuf;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

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
