//! The `udp` lab backend: IP packets in UDP datagrams.
//!
//! A host sends each full IP packet (the exact RoCEv2 IP packet, ICRC
//! included) as the payload of one UDP datagram to `dc.listen`; the gateway
//! answers the same way, to the UDP address it learned from datagrams whose
//! inner IP source is that host. Until learned, packets for that inner
//! address are dropped and counted. A learned address changes only after
//! the old one was silent for [`PEER_STALE`] (a restarted host), so a stray
//! sender on the loopback cannot steal a host's traffic.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use soya_io::sys;
use soya_io::sys::udpio::{IoMode, TxDatagram, UdpIo};
use soya_proto::buffer::PacketBuf;
use soya_proto::keyed::KeyedMap;

use super::DC_MAX_PACKET;
use crate::gateway::ports::{DcControl, DcPort, DcRx, DcStats, TxOutcome};

/// A learned lab host address may be replaced after this much silence.
pub const PEER_STALE: Duration = Duration::from_secs(2);
/// Socket buffers asked for on the lab DC socket.
const DC_SOCKET_BUFFER: usize = 32 << 20;
/// Messages per recvmmsg / sendmmsg on the lab DC socket.
const DC_IO_BATCH: usize = 64;
/// Bytes of DC packets staged before a flush.
const DC_STAGE_BYTES: usize = 512 << 10;

#[derive(Debug)]
struct Peer {
    addr: SocketAddr,
    last_seen: Instant,
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
    peer_conflicts: u64,
    peers_learned: u64,
}

impl UdpLab {
    /// Binds the lab socket on `listen`.
    pub fn open(listen: SocketAddr, mode: IoMode) -> io::Result<UdpLab> {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(listen),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        let _ = s.set_recv_buffer_size(DC_SOCKET_BUFFER);
        let _ = s.set_send_buffer_size(DC_SOCKET_BUFFER);
        let _ = sys::force_buffers(s.as_raw_fd(), DC_SOCKET_BUFFER);
        s.bind(&listen.into())?;
        s.set_nonblocking(true)?;
        let io = Self::io(s.as_raw_fd(), mode, &format!("dc {listen}"));
        Ok(UdpLab::new(s.into(), io))
    }

    /// Another handle of the same socket (bound on `listen`), for shard
    /// `shard` (it writes through it; shard 0 reads).
    pub fn try_clone(&self, listen: SocketAddr, mode: IoMode, shard: usize) -> io::Result<UdpLab> {
        let sock = self.sock.try_clone()?;
        let io = Self::io(
            sock.as_raw_fd(),
            mode,
            &format!("dc {listen} (shard {shard})"),
        );
        Ok(UdpLab::new(sock, io))
    }

    fn io(fd: RawFd, mode: IoMode, name: &str) -> UdpIo {
        let mut io = UdpIo::new(fd, mode, DC_IO_BATCH, DC_MAX_PACKET, name);
        // No GSO toward lab hosts: with it, the e2e test's hosts
        // (plain recv_from, no GRO) stall into egress timeouts and
        // fatal NAKs (cause not found yet; sendmmsg works).
        io.disable_gso();
        io
    }

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

    fn flush_staged(&mut self) {
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

impl DcPort for UdpLab {
    /// One recvmmsg; for each datagram whose packet passed the ACL (`f`
    /// returns its inner source), learns the host's UDP address.
    #[inline]
    fn recv_batch(
        &mut self,
        _buf: &mut [u8],
        _lent: &mut Vec<PacketBuf>,
        mut f: impl FnMut(DcRx<'_>, Option<SocketAddr>) -> Option<IpAddr>,
    ) -> io::Result<(usize, bool)> {
        let now = Instant::now();
        let UdpLab {
            io,
            peers,
            peer_conflicts,
            peers_learned,
            ..
        } = self;
        let n = io.recv(|pkt, from| {
            if let (Some(src), Some(from)) = (f(DcRx::Borrowed(pkt), from), from) {
                learn(peers, peer_conflicts, peers_learned, src, from, now);
            }
        });
        Ok((n, io.drained()))
    }

    /// Stages the packet for the next [`flush`](DcPort::flush) (flushing
    /// first when the stage is full).
    #[inline]
    fn send(&mut self, packet: &[u8], dst: IpAddr) -> TxOutcome {
        let Some(p) = self.peers.get(&dst) else {
            return TxOutcome::NoPeer;
        };
        let dest = p.addr;
        let used = self.staged.last().map_or(0, |d| d.off + d.len);
        let mut off = used;
        if used + packet.len() > self.stage.len() || self.staged.len() >= DC_IO_BATCH {
            self.flush_staged();
            off = 0;
        }
        if packet.len() > self.stage.len() {
            return TxOutcome::Error;
        }
        soya_proto::copies::note(packet.len());
        self.stage[off..off + packet.len()].copy_from_slice(packet);
        self.staged.push(TxDatagram {
            off,
            len: packet.len(),
            dest,
        });
        TxOutcome::Sent
    }

    /// Sends what was staged (datagrams the kernel refuses are counted in
    /// the socket's I/O counters, [`DcStats::send_refused`]).
    #[inline]
    fn flush(&mut self) {
        self.flush_staged()
    }

    fn learn(&mut self, src: IpAddr, from: SocketAddr) {
        learn(
            &mut self.peers,
            &mut self.peer_conflicts,
            &mut self.peers_learned,
            src,
            from,
            Instant::now(),
        );
    }
}

impl DcControl for UdpLab {
    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn describe(&self) -> String {
        format!(
            "udp {}",
            self.sock
                .local_addr()
                .map_or_else(|_| "?".into(), |a| a.to_string())
        )
    }

    /// Kernel drops: the socket's receive buffer overflowed (`SO_RXQ_OVFL`).
    fn stats(&self) -> DcStats {
        DcStats {
            lab_hosts: self.peers.len() as u64,
            lab_host_conflicts: self.peer_conflicts,
            kernel_drops: self.io.stats.kernel_drops,
            send_refused: self.io.stats.send_errors,
            socket_io: Some(self.io.stats),
            ..DcStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the device loop used to read from the variant's fields (hosts
    /// learned, conflicting senders, refused sends) now comes through
    /// `DcControl::stats`, the same whichever backend runs.
    #[test]
    fn the_lab_backend_reports_its_hosts_and_conflicts_through_stats() {
        let mut lab = UdpLab::open("127.0.0.1:0".parse().unwrap(), IoMode::Mmsg).unwrap();
        assert!(lab.describe().starts_with("udp 127.0.0.1:"));
        let host: IpAddr = "10.1.0.5".parse().unwrap();
        let first: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let other: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        assert_eq!(DcPort::send(&mut lab, &[0x45; 40], host), TxOutcome::NoPeer);
        DcPort::learn(&mut lab, host, first);
        // Another UDP address for the same inner source while the first is
        // active: not learned, counted.
        DcPort::learn(&mut lab, host, other);
        DcPort::learn(&mut lab, host, other);
        DcPort::learn(&mut lab, "10.1.0.6".parse().unwrap(), other);
        let s = lab.stats();
        assert_eq!((s.lab_hosts, s.lab_host_conflicts), (2, 2));
        assert!(s.socket_io.is_some());
        assert_eq!((s.mode, s.xdp.tx_packets), ("", 0));
        // The learned address is where packets for the host go.
        assert_eq!(DcPort::send(&mut lab, &[0x45; 40], host), TxOutcome::Sent);
        assert_eq!(lab.staged.last().map(|d| d.dest), Some(first));
    }
}
