//! The `xdp` backend: AF_XDP sockets on a NIC or veth, one per shard, fed
//! by an XDP program that steers the local hosts' packets for the remote
//! prefixes by the shards' host-pair hash (everything else goes on to the
//! kernel). Every shard reads its own socket: no handoff. The socket itself
//! ([`XdpDc`]) lives in the I/O crate ([`soya_io::xdp`]: it holds raw
//! memory); this file only fits it to the gateway's port traits.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;

use soya_io::xdp::{SendError, XdpDc};
use soya_proto::buffer::{LendSource, PacketBuf};

use crate::gateway::ports::{DcControl, DcPort, DcRx, DcStats, TxOutcome};

impl DcPort for XdpDc {
    /// One batch of the RX ring (multi-buffer frames gathered into lent
    /// buffers when they are not contiguous).
    #[inline]
    fn recv_batch(
        &mut self,
        buf: &mut [u8],
        lent: &mut Vec<PacketBuf>,
        mut f: impl FnMut(DcRx<'_>, Option<SocketAddr>) -> Option<IpAddr>,
    ) -> io::Result<(usize, bool)> {
        Ok(XdpDc::recv_batch(self, buf, lent, |pkt| {
            f(pkt, None);
        }))
    }

    /// Puts the packet on the shard's TX ring (kicked at the next flush,
    /// or when a batch is full).
    #[inline]
    fn send(&mut self, packet: &[u8], dst: IpAddr) -> TxOutcome {
        match XdpDc::send(self, packet, dst) {
            Ok(()) => TxOutcome::Sent,
            // The kernel has no neighbour entry yet (it was asked to
            // resolve one): like an unlearned lab host.
            Err(SendError::NoNeighbour) => TxOutcome::NoPeer,
            Err(SendError::Full) => TxOutcome::Error,
        }
    }

    #[inline]
    fn flush(&mut self) {
        XdpDc::flush(self)
    }

    /// The kernel's neighbour table says where hosts are: nothing to learn.
    fn learn(&mut self, _src: IpAddr, _from: SocketAddr) {}
}

impl DcControl for XdpDc {
    fn fd(&self) -> RawFd {
        XdpDc::fd(self)
    }

    fn describe(&self) -> String {
        XdpDc::describe(self)
    }

    fn lend_source(&self) -> Option<Arc<dyn LendSource>> {
        XdpDc::lend_source(self)
    }

    fn holds_unresolved(&self) -> bool {
        self.held() > 0
    }

    /// Kernel drops: the RX ring or fill ring (`XDP_STATISTICS`).
    fn stats(&self) -> DcStats {
        DcStats {
            kernel_drops: XdpDc::kernel_drops(self),
            mode: self.mode(),
            xdp: self.stats,
            ..DcStats::default()
        }
    }
}
