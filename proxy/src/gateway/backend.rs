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
//!   The device is brought up with MTU [`TUN_MTU`]; routes are the
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

/// MTU set on the tun device (jumbo: RoCE packets of a 4096-byte path MTU
/// are about 4.2 KB).
pub const TUN_MTU: u32 = 9000;
/// A learned lab host address may be replaced after this much silence.
pub const PEER_STALE: Duration = Duration::from_secs(2);
/// Socket buffers asked for on the lab DC socket.
const DC_SOCKET_BUFFER: usize = 32 << 20;

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

/// The lab backend: IP packets in UDP datagrams.
#[derive(Debug)]
pub struct UdpLab {
    sock: UdpSocket,
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
}

#[derive(Debug)]
pub enum DcIo {
    Udp(UdpLab),
    Tun(Tun),
}

impl DcIo {
    pub fn open(backend: &DcBackend) -> io::Result<DcIo> {
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
                Ok(DcIo::Udp(UdpLab {
                    sock: s.into(),
                    peers: HashMap::new(),
                    peer_conflicts: 0,
                    peers_learned: 0,
                }))
            }
            DcBackend::Tun { interface } => Ok(DcIo::Tun(Tun {
                file: sys::open_tun(interface, TUN_MTU)?,
                name: interface.clone(),
            })),
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

    /// Reads one packet; `Ok(None)` when nothing is waiting. The lab
    /// backend also returns the UDP address it came from.
    pub fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, Option<SocketAddr>)>> {
        let r = match self {
            DcIo::Udp(u) => u.sock.recv_from(buf).map(|(n, a)| (n, Some(a))),
            DcIo::Tun(t) => t.file.read(buf).map(|n| (n, None)),
        };
        match r {
            Ok(x) => Ok(Some(x)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            // A lab host that went away: ICMP port unreachable surfaces here.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Notes that `from` sent a packet whose inner source is `inner_src`
    /// (the packet passed the ACL).
    pub fn learn(&mut self, inner_src: IpAddr, from: Option<SocketAddr>, now: Instant) {
        let (DcIo::Udp(u), Some(from)) = (self, from) else {
            return;
        };
        match u.peers.get_mut(&inner_src) {
            Some(p) if p.addr == from => p.last_seen = now,
            Some(p) if now.duration_since(p.last_seen) >= PEER_STALE => {
                tracing::info!(host = %inner_src, old = %p.addr, new = %from, "dc: lab host moved");
                p.addr = from;
                p.last_seen = now;
                u.peers_learned += 1;
            }
            Some(_) => u.peer_conflicts += 1,
            None => {
                tracing::info!(host = %inner_src, udp = %from, "dc: learned lab host");
                u.peers.insert(
                    inner_src,
                    Peer {
                        addr: from,
                        last_seen: now,
                    },
                );
                u.peers_learned += 1;
            }
        }
    }

    /// Writes one IP packet toward local host `dst`.
    pub fn send(&mut self, packet: &[u8], dst: IpAddr) -> TxOutcome {
        let r = match self {
            DcIo::Udp(u) => {
                let Some(p) = u.peers.get(&dst) else {
                    return TxOutcome::NoPeer;
                };
                u.sock.send_to(packet, p.addr).map(|_| ())
            }
            DcIo::Tun(t) => t.file.write(packet).map(|_| ()),
        };
        match r {
            Ok(()) => TxOutcome::Sent,
            Err(e) => {
                tracing::debug!(error = %e, "dc: write failed");
                TxOutcome::Error
            }
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
