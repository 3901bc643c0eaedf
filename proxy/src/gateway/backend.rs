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
//!   The device is brought up with MTU [`TUN_MTU`] and a queue of
//!   [`TUN_TXQUEUELEN`] packets; routes are the operator's. What the
//!   kernel drops because that queue was full is read from
//!   `/proc/thread-self/net/dev` ([`DcIo::kernel_drops`]).
//! - `xdp`: AF_XDP sockets on a NIC or veth, one per shard, fed by an XDP
//!   program that steers the local hosts' packets for the remote prefixes
//!   by the shards' host-pair hash (everything else goes on to the kernel).
//!   Every shard reads its own socket: no handoff. See [`soya_io::xdp`].

use soya_proto::buffer::PacketBuf;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use soya_config::{DcBackend, Prefix};

pub use super::ports::TxOutcome;
use super::ports::{DcPort, DcRx};
use soya_io::sys;
use soya_io::sys::udpio::{IoMode, IoStats, TxDatagram, UdpIo};
use soya_io::xdp::{self, SendError, XdpDc};
use soya_proto::keyed::KeyedMap;

/// MTU set on the tun device (jumbo: RoCE packets of a 4096-byte path MTU
/// are about 4.2 KB).
pub const TUN_MTU: u32 = 9000;
/// Queue length of the tun device: packets the kernel holds for the device
/// loop to read. The tun default (500) is less than the full windows of
/// four rxe QPs (128 unacknowledged PSNs each); a burst beyond it is
/// dropped by the kernel, and the requester goes back N. 16384 holds the
/// windows of 128 QPs; the kernel allocates packets only as they queue.
pub const TUN_TXQUEUELEN: u32 = 16_384;
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
    peers: &mut KeyedMap<IpAddr, Peer>,
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
    /// Looked up for every packet both ways, by addresses from the DC:
    /// a keyed table (`soya_proto::keyed`).
    peers: KeyedMap<IpAddr, Peer>,
    /// Datagrams whose inner source is known under another UDP address that
    /// is still active (not learned from).
    pub peer_conflicts: u64,
    pub peers_learned: u64,
}

impl UdpLab {
    fn new(sock: UdpSocket, io: UdpIo) -> UdpLab {
        UdpLab {
            sock,
            io,
            stage: vec![0; DC_STAGE_BYTES],
            staged: Vec::with_capacity(DC_IO_BATCH),
            peers: KeyedMap::default(),
            peer_conflicts: 0,
            peers_learned: 0,
        }
    }
}

#[derive(Debug)]
pub struct Tun {
    file: File,
    name: String,
}

#[derive(Debug)]
pub enum DcIo {
    Udp(Box<UdpLab>),
    Tun(Tun),
    Xdp(Box<XdpDc>),
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
                Ok(DcIo::Udp(Box::new(UdpLab::new(s.into(), io))))
            }
            DcBackend::Tun { interface } => Ok(DcIo::Tun(Tun {
                file: sys::open_tun(interface, TUN_MTU, TUN_TXQUEUELEN)?,
                name: interface.clone(),
            })),
            DcBackend::Xdp { interface } => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "dc.backend = \"xdp\" (interface {interface}) opens through \
                     DcIo::open_shards (its program needs the prefixes)"
                ),
            )),
        }
    }

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
        if let DcBackend::Xdp { interface } = backend {
            return Ok(
                xdp::open_shards(interface, shards.max(1), local, remote, buffer_slots)?
                    .into_iter()
                    .map(|x| (DcIo::Xdp(Box::new(x)), true))
                    .collect(),
            );
        }
        if shards <= 1 {
            return Ok(vec![(DcIo::open(backend, mode)?, true)]);
        }
        match backend {
            DcBackend::Udp { listen } => {
                let first = DcIo::open(backend, mode)?;
                let DcIo::Udp(u) = &first else {
                    unreachable!("udp backend opens a udp socket")
                };
                let mut out = Vec::with_capacity(shards);
                for i in 1..shards {
                    let sock = u.sock.try_clone()?;
                    let mut io = UdpIo::new(
                        sock.as_raw_fd(),
                        mode,
                        DC_IO_BATCH,
                        DC_MAX_PACKET,
                        &format!("dc {listen} (shard {i})"),
                    );
                    io.disable_gso();
                    out.push((DcIo::Udp(Box::new(UdpLab::new(sock, io))), false));
                }
                out.insert(0, (first, true));
                Ok(out)
            }
            DcBackend::Tun { interface } => {
                // One queue, read by shard 0, as with udp: with one queue per
                // shard (IFF_MULTI_QUEUE) the kernel picks the queue by its
                // own flow steering, so a QP's packets could reach two shards
                // and the handed-over ones be overtaken (a sequence NAK and a
                // go-back-N resend at the requester). Writes toward the DC go
                // through duplicated descriptors (one packet per write(2)).
                let file = sys::open_tun(interface, TUN_MTU, TUN_TXQUEUELEN)?;
                let mut out = Vec::with_capacity(shards);
                for _ in 1..shards {
                    out.push((
                        DcIo::Tun(Tun {
                            file: file.try_clone()?,
                            name: interface.clone(),
                        }),
                        false,
                    ));
                }
                out.insert(
                    0,
                    (
                        DcIo::Tun(Tun {
                            file,
                            name: interface.clone(),
                        }),
                        true,
                    ),
                );
                Ok(out)
            }
            DcBackend::Xdp { .. } => unreachable!("opened above"),
        }
    }

    /// Notes that lab host `from` sent a packet whose inner source is
    /// `inner_src` (a packet another shard read and handed over).
    pub fn learn(&mut self, inner_src: IpAddr, from: SocketAddr, now: Instant) {
        if let DcIo::Udp(u) = self {
            let UdpLab {
                peers,
                peer_conflicts,
                peers_learned,
                ..
            } = &mut **u;
            learn(peers, peer_conflicts, peers_learned, inner_src, from, now);
        }
    }

    pub fn fd(&self) -> RawFd {
        match self {
            DcIo::Udp(u) => u.sock.as_raw_fd(),
            DcIo::Tun(t) => t.file.as_raw_fd(),
            DcIo::Xdp(x) => x.fd(),
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
            DcIo::Xdp(x) => x.describe(),
        }
    }

    /// xdp: "zero-copy" or "copy" (how the AF_XDP socket moves packets);
    /// `None` on the other backends. For the status and metrics.
    pub fn xdp_mode(&self) -> Option<&'static str> {
        match self {
            DcIo::Xdp(x) => Some(x.mode()),
            _ => None,
        }
    }

    /// xdp: the socket's counters (packets, multi-buffer frames, drops).
    /// Where the site's pools should take packet buffers: the xdp
    /// backend's UMEM (`Site::set_lender`); `None` for the others.
    pub fn lend_source(&self) -> Option<std::sync::Arc<dyn soya_proto::buffer::LendSource>> {
        match self {
            DcIo::Xdp(x) => x.lend_source(),
            _ => None,
        }
    }

    /// Packets held for a host the kernel is resolving (xdp): the device
    /// loop then turns again within a millisecond to send them.
    pub fn holds_unresolved(&self) -> bool {
        match self {
            DcIo::Xdp(x) => x.held() > 0,
            _ => false,
        }
    }

    pub fn xdp_stats(&self) -> Option<xdp::XdpStats> {
        match self {
            DcIo::Xdp(x) => Some(x.stats),
            _ => None,
        }
    }

    /// Reads one batch and calls `f(packet, from)` for each packet (`from`:
    /// the lab host's UDP address, `None` on tun). When `f` returns an inner source
    /// address (the packet passed the ACL), the lab backend learns the
    /// host's UDP address from it. Returns the packets read (0: none) and
    /// whether the socket was emptied.
    pub fn recv_batch(
        &mut self,
        buf: &mut [u8],
        lent: &mut Vec<PacketBuf>,
        now: Instant,
        mut f: impl FnMut(DcRx<'_>, Option<SocketAddr>) -> Option<IpAddr>,
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
                    if let (Some(src), Some(from)) = (f(DcRx::Borrowed(pkt), from), from) {
                        learn(peers, peer_conflicts, peers_learned, src, from, now);
                    }
                });
                Ok((n, io.drained()))
            }
            DcIo::Tun(t) => {
                let mut n = 0;
                while n < TUN_BATCH {
                    // Straight into a buffer the site lent: the deep buffer
                    // keeps the packet there (the kernel's copy is the
                    // only one on the way in).
                    let Some(mut v) = lent.pop() else {
                        match t.file.read(buf) {
                            Ok(len) => {
                                n += 1;
                                f(DcRx::Borrowed(&buf[..len]), None);
                                continue;
                            }
                            Err(e) if would_block(&e) => return Ok((n, true)),
                            Err(e) => return Err(e),
                        }
                    };
                    match soya_io::sys::read_packet_into(t.file.as_raw_fd(), &mut v, buf) {
                        Ok(true) => {
                            n += 1;
                            f(DcRx::Lent(v), None);
                        }
                        Ok(false) => {
                            lent.push(v);
                            return Ok((n, true));
                        }
                        Err(e) => {
                            lent.push(v);
                            return Err(e);
                        }
                    }
                }
                Ok((n, false))
            }
            DcIo::Xdp(x) => Ok(x.recv_batch(buf, lent, |pkt| {
                f(pkt, None);
            })),
        }
    }

    /// I/O counters of the lab socket.
    pub fn io_stats(&self) -> Option<IoStats> {
        match self {
            DcIo::Udp(u) => Some(u.io.stats),
            DcIo::Tun(_) | DcIo::Xdp(_) => None,
        }
    }

    /// Writes one IP packet toward local host `dst`: the lab backend stages
    /// it for the next [`flush`](Self::flush) (flushing first when the
    /// stage is full); tun writes it at once; xdp puts it on the shard's
    /// TX ring (kicked at the next flush, or when a batch is full).
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
                soya_proto::copies::note(packet.len());
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
            DcIo::Xdp(x) => match x.send(packet, dst) {
                Ok(()) => TxOutcome::Sent,
                // The kernel has no neighbour entry yet (it was asked to
                // resolve one): like an unlearned lab host.
                Err(SendError::NoNeighbour) => TxOutcome::NoPeer,
                Err(SendError::Full) => TxOutcome::Error,
            },
        }
    }

    /// Sends what the lab backend staged (packets the kernel refuses are
    /// counted in [`io_stats`](Self::io_stats)).
    pub fn flush(&mut self) {
        match self {
            DcIo::Udp(u) => u.flush(),
            DcIo::Xdp(x) => x.flush(),
            DcIo::Tun(_) => {}
        }
    }

    /// Packets for the gateway that the kernel dropped before it read them:
    /// the tun device's queue was full (its `tx_dropped`, from
    /// `/proc/thread-self/net/dev`), or the lab socket's receive buffer
    /// (`SO_RXQ_OVFL`), or the AF_XDP socket's RX ring / fill ring
    /// (`XDP_STATISTICS`). Cumulative; 0 if unknown.
    pub fn kernel_drops(&self) -> u64 {
        match self {
            DcIo::Udp(u) => u.io.stats.kernel_drops,
            DcIo::Tun(t) => std::fs::read_to_string("/proc/thread-self/net/dev")
                .ok()
                .and_then(|text| tun_tx_dropped(&text, &t.name))
                .unwrap_or(0),
            DcIo::Xdp(x) => x.kernel_drops(),
        }
    }

    /// Lab hosts learned (udp backend).
    pub fn peers(&self) -> usize {
        match self {
            DcIo::Udp(u) => u.peers.len(),
            DcIo::Tun(_) | DcIo::Xdp(_) => 0,
        }
    }
}

/// The transmit drop count of interface `name` in the text of
/// `/proc/net/dev` (for a tun device: packets routed to it that its reader
/// did not take in time).
pub fn tun_tx_dropped(proc_net_dev: &str, name: &str) -> Option<u64> {
    proc_net_dev.lines().find_map(|l| {
        let (dev, counters) = l.split_once(':')?;
        if dev.trim() != name {
            return None;
        }
        // rx: bytes packets errs drop fifo frame compressed multicast;
        // tx: bytes packets errs drop ...
        counters.split_whitespace().nth(11)?.parse().ok()
    })
}

/// No packet waiting (or a signal): try again at the next readiness.
fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// The shard's turn sees the backends through [`DcPort`] only.
impl DcPort for DcIo {
    fn recv_batch(
        &mut self,
        buf: &mut [u8],
        lent: &mut Vec<PacketBuf>,
        f: impl FnMut(DcRx<'_>, Option<SocketAddr>) -> Option<IpAddr>,
    ) -> io::Result<(usize, bool)> {
        DcIo::recv_batch(self, buf, lent, Instant::now(), f)
    }

    fn send(&mut self, packet: &[u8], dst: IpAddr) -> TxOutcome {
        DcIo::send(self, packet, dst)
    }

    fn flush(&mut self) {
        DcIo::flush(self)
    }

    fn learn(&mut self, src: IpAddr, from: SocketAddr) {
        DcIo::learn(self, src, from, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tx_drops_of_a_device_from_proc_net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n  \
soya0:   31882     633    0    0    0     0          0         0 38988443    9423    0  685    0     0       0          0\n \
soya01:      1       2    3    4    5     6          7         8        9      10   11   12   13    14      15         16\n";
        assert_eq!(tun_tx_dropped(text, "soya0"), Some(685));
        assert_eq!(tun_tx_dropped(text, "soya01"), Some(12));
        assert_eq!(tun_tx_dropped(text, "lo"), Some(0));
        assert_eq!(tun_tx_dropped(text, "eth0"), None);
        assert_eq!(tun_tx_dropped("soya0: 1 2 3", "soya0"), None);
    }
}
