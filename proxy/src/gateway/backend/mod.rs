//! Data-center side backends: how IP packets from and to the local RoCE
//! hosts enter and leave the gateway. One file each:
//!
//! - [`udp`] (lab, no root): "IP-in-UDP", one datagram per IP packet, the
//!   hosts' UDP addresses learned from what they send;
//! - [`tun`]: raw IP packets on a tun device the gateway routes through;
//! - [`xdp`]: AF_XDP sockets, one per shard, fed by an XDP program.
//!
//! Each implements the two port traits ([`DcPort`]: the per-packet path;
//! [`DcControl`]: readiness, description, statistics). The device loop
//! holds a [`DcIo`] and calls those traits only, so it does not know which
//! backend runs; a new backend is a new file, a variant of [`DcIo`] and a
//! case in [`DcIo::open_shards`], and nothing in the device loop.
//!
//! # Why an enum (static dispatch), not `dyn`
//!
//! The data path (100–400 Gb/s targets) calls [`DcPort::send`] once per
//! packet toward the DC, and `recv_batch` / `flush` once per batch. Through
//! [`DcIo`] each is one `match` on a discriminant that never changes in a
//! process (the branch predictor learns it at once), and every arm is the
//! backend's own method, `#[inline]`, so the compiler can fold the chosen
//! backend's `send` into the closure `Site::transmit_dc` calls per packet,
//! as before the traits. `dyn` would put an indirect, never-inlined call
//! there and could not carry `recv_batch` at all as it stands: its
//! per-packet callback is a generic `impl FnMut`, which a trait object
//! cannot take without a second indirect call per packet read. A device
//! loop generic over the backend (`Device<D>`) would also avoid the
//! `match`, but would compile the device loop and the gateway's start-up
//! once per backend and carry the type through thread creation, for a
//! branch that costs next to nothing; the enum keeps one copy.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;

use soya_config::{DcBackend, Prefix};
use soya_io::sys::udpio::IoMode;
use soya_io::xdp::{self as xsk, XdpDc};
use soya_proto::buffer::{LendSource, PacketBuf};

pub use super::ports::TxOutcome;
use super::ports::{DcControl, DcPort, DcRx, DcStats};

pub mod tun;
pub mod udp;
pub mod xdp;

pub use tun::{Tun, TUN_MTU, TUN_TXQUEUELEN};
pub use udp::{UdpLab, PEER_STALE};

/// Largest packet on the DC side (the tun MTU; lab datagrams alike).
pub const DC_MAX_PACKET: usize = 9_216;

/// One shard's DC side: whichever backend the configuration names.
#[derive(Debug)]
pub enum DcIo {
    // Boxed: the variants differ a lot in size, and the device loop holds
    // one by value (one pointer to follow, the same for each).
    Udp(Box<UdpLab>),
    Tun(Box<Tun>),
    Xdp(Box<XdpDc>),
}

/// `each!(self, b => expr)`: `expr` with `b` bound to the running
/// backend's box, for whichever variant `self` is. Callers name the trait
/// method (`DcPort::send(&mut **b, ..)`): `XdpDc` has inherent methods of
/// the same names, which method syntax would pick first.
macro_rules! each {
    ($self:expr, $b:ident => $e:expr) => {
        match $self {
            DcIo::Udp($b) => $e,
            DcIo::Tun($b) => $e,
            DcIo::Xdp($b) => $e,
        }
    };
}

impl DcIo {
    /// The DC side of every shard, and whether that shard reads it. udp
    /// lab: one socket, read by shard 0 only (one reader keeps each QP's
    /// packets in order through the handoff queues); the other shards
    /// write through their own handle of it. tun: the same (one queue,
    /// read by shard 0, written through duplicated descriptors). xdp: one
    /// AF_XDP socket per shard, each read by its shard (the XDP program
    /// steers by the shards' hash), so every shard reads the DC side;
    /// `local` and `remote` are the prefixes the program steers on.
    pub fn open_shards(
        backend: &DcBackend,
        mode: IoMode,
        shards: usize,
        local: &[Prefix],
        remote: &[Prefix],
        buffer_slots: u64,
    ) -> io::Result<Vec<(DcIo, bool)>> {
        let shards = shards.max(1);
        match backend {
            DcBackend::Xdp { interface } => {
                Ok(
                    xsk::open_shards(interface, shards, local, remote, buffer_slots)?
                        .into_iter()
                        .map(|x| (DcIo::Xdp(Box::new(x)), true))
                        .collect(),
                )
            }
            DcBackend::Udp { listen } => {
                let first = UdpLab::open(*listen, mode)?;
                let mut out = Vec::with_capacity(shards);
                for i in 1..shards {
                    out.push((
                        DcIo::Udp(Box::new(first.try_clone(*listen, mode, i)?)),
                        false,
                    ));
                }
                out.insert(0, (DcIo::Udp(Box::new(first)), true));
                Ok(out)
            }
            DcBackend::Tun { interface } => {
                // One queue, read by shard 0, as with udp: with one queue per
                // shard (IFF_MULTI_QUEUE) the kernel picks the queue by its
                // own flow steering, so a QP's packets could reach two shards
                // and the handed-over ones be overtaken (a sequence NAK and a
                // go-back-N resend at the requester). Writes toward the DC go
                // through duplicated descriptors (one packet per write(2)).
                let first = Tun::open(interface)?;
                let mut out = Vec::with_capacity(shards);
                for _ in 1..shards {
                    out.push((DcIo::Tun(Box::new(first.try_clone()?)), false));
                }
                out.insert(0, (DcIo::Tun(Box::new(first)), true));
                Ok(out)
            }
        }
    }
}

/// The shard's turn sees the backends through [`DcPort`] only (see the
/// module docs for why each method is a `match`, inlined).
impl DcPort for DcIo {
    #[inline]
    fn recv_batch(
        &mut self,
        buf: &mut [u8],
        lent: &mut Vec<PacketBuf>,
        f: impl FnMut(DcRx<'_>, Option<SocketAddr>) -> Option<IpAddr>,
    ) -> io::Result<(usize, bool)> {
        each!(self, b => DcPort::recv_batch(&mut **b, buf, lent, f))
    }

    #[inline]
    fn send(&mut self, packet: &[u8], dst: IpAddr) -> TxOutcome {
        each!(self, b => DcPort::send(&mut **b, packet, dst))
    }

    #[inline]
    fn flush(&mut self) {
        each!(self, b => DcPort::flush(&mut **b))
    }

    fn learn(&mut self, src: IpAddr, from: SocketAddr) {
        each!(self, b => DcPort::learn(&mut **b, src, from))
    }
}

/// And the device loop through [`DcControl`] (off the per-packet path).
impl DcControl for DcIo {
    fn fd(&self) -> RawFd {
        each!(self, b => DcControl::fd(&**b))
    }

    fn describe(&self) -> String {
        each!(self, b => DcControl::describe(&**b))
    }

    fn lend_source(&self) -> Option<Arc<dyn LendSource>> {
        each!(self, b => DcControl::lend_source(&**b))
    }

    #[inline]
    fn holds_unresolved(&self) -> bool {
        each!(self, b => DcControl::holds_unresolved(&**b))
    }

    fn stats(&self) -> DcStats {
        each!(self, b => DcControl::stats(&**b))
    }
}
