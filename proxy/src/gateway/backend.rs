//! Data-center side backends: how IP packets from and to the local RoCE
//! hosts enter and leave the gateway.
//!
//! - `udp` (lab, no root): "IP-in-UDP". A host sends each full IP packet
//!   (the exact RoCEv2 IP packet, ICRC included) as the payload of one UDP
//!   datagram to `dc.listen`; the gateway answers the same way, to the UDP
//!   address it learned from datagrams whose inner IP source is that host.
//!   Until learned, packets for that inner address are dropped and counted.
//!   A learned address changes only after the old one was silent for
//!   [`PEER_STALE`] (a restarted host), so a stray sender on the loopback
//!   cannot steal a host's traffic.
//! - `tun`: the gateway is the router for the remote site's prefixes; it
//!   reads and writes raw IP packets on a tun device (IFF_TUN | IFF_NO_PI).
//!   The device is brought up with MTU [`TUN_MTU`] and a transmit queue of
//!   [`TUN_TXQUEUELEN`] packets (see [`tune_tun_queue`]); routes are the
//!   operator's.
//! - `afpacket`: not implemented; refused at startup.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use soya_config::DcBackend;

use super::sys;
use super::udpio::{IoMode, IoStats, TxDatagram, UdpIo};

/// MTU set on the tun device (jumbo: RoCE packets of a 4096-byte path MTU
/// are about 4.2 KB).
pub const TUN_MTU: u32 = 9000;
/// Packets the kernel may hold for the gateway on its tun device: the
/// device's ring (txqueuelen) and the root qdisc (pfifo). The default ring
/// of 500 overflows whenever the gateway falls a few ms behind a burst of
/// requests (tun drops, it never makes the sender wait); RC requesters
/// bound what can be in flight (rxe: 128 PSNs per QP), so this is memory
/// only while the gateway is behind.
pub const TUN_TXQUEUELEN: u32 = 10_000;
/// A learned lab host address may be replaced after this much silence.
pub const PEER_STALE: Duration = Duration::from_secs(2);
/// Socket buffers asked for on the lab DC socket.
const DC_SOCKET_BUFFER: usize = 32 << 20;
/// Messages per recvmmsg / sendmmsg on the lab DC socket.
const DC_IO_BATCH: usize = 64;
/// Largest packet on the DC side (the tun MTU; lab datagrams alike).
pub const DC_MAX_PACKET: usize = 9_216;
/// Bytes of DC packets staged before a flush.
const DC_STAGE_BYTES: usize = 512 << 10;
/// Packets read from the tun device per batch.
const TUN_BATCH: usize = 64;

/// What became of a packet written to the DC side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxOutcome {
    Sent,
    /// udp backend: the destination host's UDP address is not learned yet.
    NoPeer,
    Error,
}

#[derive(Debug)]
struct Peer {
    addr: SocketAddr,
    last_seen: Instant,
}

impl UdpLab {
    fn flush(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        let sent = self.io.send(&self.stage, &self.staged);
        if sent < self.staged.len() {
            tracing::debug!(failed = self.staged.len() - sent, "dc: sends refused");
        }
        self.staged.clear();
    }
}

/// Notes that `from` sent a packet whose inner source is `inner_src` (the
/// packet passed the ACL).
fn learn(
    peers: &mut HashMap<IpAddr, Peer>,
    peer_conflicts: &mut u64,
    peers_learned: &mut u64,
    inner_src: IpAddr,
    from: SocketAddr,
    now: Instant,
) {
    match peers.get_mut(&inner_src) {
        Some(p) if p.addr == from => p.last_seen = now,
        Some(p) if now.duration_since(p.last_seen) >= PEER_STALE => {
            tracing::info!(host = %inner_src, old = %p.addr, new = %from, "dc: lab host moved");
            p.addr = from;
            p.last_seen = now;
            *peers_learned += 1;
        }
        Some(_) => *peer_conflicts += 1,
        None => {
            tracing::info!(host = %inner_src, udp = %from, "dc: learned lab host");
            peers.insert(
                inner_src,
                Peer {
                    addr: from,
                    last_seen: now,
                },
            );
            *peers_learned += 1;
        }
    }
}

/// The lab backend: IP packets in UDP datagrams.
#[derive(Debug)]
pub struct UdpLab {
    sock: UdpSocket,
    io: UdpIo,
    /// Packets staged for the next flush (slices of `stage`).
    stage: Vec<u8>,
    staged: Vec<TxDatagram>,
    peers: HashMap<IpAddr, Peer>,
    /// Datagrams whose inner source is known under another UDP address that
    /// is still active (not learned from).
    pub peer_conflicts: u64,
    pub peers_learned: u64,
}

#[derive(Debug)]
pub struct Tun {
    file: File,
    name: String,
    /// For the kernel's drop counter (None: unknown index).
    ifindex: Option<u32>,
}

/// Gives tun device `name` a deep transmit queue: its ring (txqueuelen)
/// and a root `pfifo` qdisc of [`TUN_TXQUEUELEN`] packets. The default,
/// fq_codel over a ring of 500, dropped RoCE requests before the gateway
/// read them in the interop lab (docs/interop.md, pitfall 10): in Linux
/// 6.1 tun never stops its queue, so packets beyond the ring are dropped
/// (`tx_dropped`); kernels whose tun does stop it would leave them to the
/// qdisc, where CoDel drops what waits longer than 5 ms. A failure is
/// logged, not fatal (the gateway still works, with drops under load).
pub fn tune_tun_queue(name: &str) -> Option<u32> {
    let ring = sys::set_txqueuelen(name, TUN_TXQUEUELEN);
    let index = sys::ifindex(name);
    let qdisc = match &index {
        Ok(i) => sys::set_root_pfifo(*i, TUN_TXQUEUELEN),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    };
    match (&ring, &qdisc) {
        (Ok(()), Ok(())) => tracing::info!(
            device = name,
            txqueuelen = TUN_TXQUEUELEN,
            qdisc = "pfifo",
            "dc: tun transmit queue set"
        ),
        _ => tracing::warn!(
            device = name,
            txqueuelen = ?ring.as_ref().err().map(ToString::to_string),
            qdisc = ?qdisc.as_ref().err().map(ToString::to_string),
            "dc: could not deepen the tun device's transmit queue; the kernel may drop RoCE \
             requests before the gateway reads them when it falls behind. Set it by hand: \
             ip link set {name} txqueuelen {TUN_TXQUEUELEN}; \
             tc qdisc replace dev {name} root pfifo limit {TUN_TXQUEUELEN}"
        ),
    }
    index.ok()
}

#[derive(Debug)]
pub enum DcIo {
    Udp(Box<UdpLab>),
    Tun(Tun),
}

impl DcIo {
    pub fn open(backend: &DcBackend, mode: IoMode) -> io::Result<DcIo> {
        match backend {
            DcBackend::Udp { listen } => {
                let s = socket2::Socket::new(
                    socket2::Domain::for_address(*listen),
                    socket2::Type::DGRAM,
                    Some(socket2::Protocol::UDP),
                )?;
                let _ = s.set_recv_buffer_size(DC_SOCKET_BUFFER);
                let _ = s.set_send_buffer_size(DC_SOCKET_BUFFER);
                let _ = sys::force_buffers(s.as_raw_fd(), DC_SOCKET_BUFFER);
                s.bind(&(*listen).into())?;
                s.set_nonblocking(true)?;
                let mut io = UdpIo::new(
                    s.as_raw_fd(),
                    mode,
                    DC_IO_BATCH,
                    DC_MAX_PACKET,
                    &format!("dc {listen}"),
                );
                // No GSO toward lab hosts: with it, the e2e test's hosts
                // (plain recv_from, no GRO) stall into egress timeouts and
                // fatal NAKs (cause not found yet; sendmmsg works).
                io.disable_gso();
                Ok(DcIo::Udp(Box::new(UdpLab {
                    sock: s.into(),
                    io,
                    stage: vec![0; DC_STAGE_BYTES],
                    staged: Vec::with_capacity(DC_IO_BATCH),
                    peers: HashMap::new(),
                    peer_conflicts: 0,
                    peers_learned: 0,
                })))
            }
            DcBackend::Tun { interface } => {
                let file = sys::open_tun(interface, TUN_MTU)?;
                Ok(DcIo::Tun(Tun {
                    file,
                    name: interface.clone(),
                    ifindex: tune_tun_queue(interface),
                }))
            }
            DcBackend::AfPacket { interface } => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "dc.backend = \"afpacket\" (interface {interface}) is not implemented in \
                     this build; use \"tun\" (route the remote prefixes to it) or \"udp\" (lab)"
                ),
            )),
        }
    }

    pub fn fd(&self) -> RawFd {
        match self {
            DcIo::Udp(u) => u.sock.as_raw_fd(),
            DcIo::Tun(t) => t.file.as_raw_fd(),
        }
    }

    /// Where it attaches, for logs and the status table.
    pub fn describe(&self) -> String {
        match self {
            DcIo::Udp(u) => format!(
                "udp {}",
                u.sock
                    .local_addr()
                    .map_or_else(|_| "?".into(), |a| a.to_string())
            ),
            DcIo::Tun(t) => format!("tun {}", t.name),
        }
    }

    /// Reads one batch and calls `f(packet, from)` for each packet (`from`:
    /// the lab host's UDP address). When `f` returns an inner source
    /// address (the packet passed the ACL), the lab backend learns the
    /// host's UDP address from it. Returns the packets read (0: none) and
    /// whether the socket was emptied.
    pub fn recv_batch(
        &mut self,
        buf: &mut [u8],
        now: Instant,
        mut f: impl FnMut(&[u8]) -> Option<IpAddr>,
    ) -> io::Result<(usize, bool)> {
        match self {
            DcIo::Udp(u) => {
                let UdpLab {
                    io,
                    peers,
                    peer_conflicts,
                    peers_learned,
                    ..
                } = &mut **u;
                let n = io.recv(|pkt, from| {
                    if let (Some(src), Some(from)) = (f(pkt), from) {
                        learn(peers, peer_conflicts, peers_learned, src, from, now);
                    }
                });
                Ok((n, io.drained()))
            }
            DcIo::Tun(t) => {
                let mut n = 0;
                while n < TUN_BATCH {
                    match t.file.read(buf) {
                        Ok(len) => {
                            n += 1;
                            f(&buf[..len]);
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                            ) =>
                        {
                            return Ok((n, true));
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok((n, false))
            }
        }
    }

    /// tun: packets the kernel dropped on their way to the gateway (the
    /// device's `tx_dropped`: its queue was full). None for the lab socket
    /// (its kernel drops are in [`io_stats`](Self::io_stats)) or if unknown.
    pub fn kernel_tx_dropped(&self) -> Option<u64> {
        match self {
            DcIo::Tun(Tun {
                ifindex: Some(i), ..
            }) => sys::link_tx_dropped(*i).ok(),
            _ => None,
        }
    }

    /// I/O counters of the lab socket.
    pub fn io_stats(&self) -> Option<IoStats> {
        match self {
            DcIo::Udp(u) => Some(u.io.stats),
            DcIo::Tun(_) => None,
        }
    }

    /// Writes one IP packet toward local host `dst`: the lab backend stages
    /// it for the next [`flush`](Self::flush) (flushing first when the
    /// stage is full); tun writes it at once.
    pub fn send(&mut self, packet: &[u8], dst: IpAddr) -> TxOutcome {
        match self {
            DcIo::Udp(u) => {
                let Some(p) = u.peers.get(&dst) else {
                    return TxOutcome::NoPeer;
                };
                let dest = p.addr;
                let used = u.staged.last().map_or(0, |d| d.off + d.len);
                let mut off = used;
                if used + packet.len() > u.stage.len() || u.staged.len() >= DC_IO_BATCH {
                    u.flush();
                    off = 0;
                }
                if packet.len() > u.stage.len() {
                    return TxOutcome::Error;
                }
                u.stage[off..off + packet.len()].copy_from_slice(packet);
                u.staged.push(TxDatagram {
                    off,
                    len: packet.len(),
                    dest,
                });
                TxOutcome::Sent
            }
            DcIo::Tun(t) => match t.file.write(packet) {
                Ok(_) => TxOutcome::Sent,
                Err(e) => {
                    tracing::debug!(error = %e, "dc: write failed");
                    TxOutcome::Error
                }
            },
        }
    }

    /// Sends what the lab backend staged (packets the kernel refuses are
    /// counted in [`io_stats`](Self::io_stats)).
    pub fn flush(&mut self) {
        if let DcIo::Udp(u) = self {
            u.flush();
        }
    }

    /// Lab hosts learned (udp backend).
    pub fn peers(&self) -> usize {
        match self {
            DcIo::Udp(u) => u.peers.len(),
            DcIo::Tun(_) => 0,
        }
    }
}
