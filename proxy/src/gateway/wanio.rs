//! WAN sockets: one UDP socket per `wan.bind`; paths map onto them.
//!
//! Sends and receives go through [`UdpIo`] (GSO / GRO, sendmmsg /
//! recvmmsg, or one datagram per system call; see [`super::udpio`]). The
//! device loop *stages* the datagrams the transport releases
//! ([`WanSockets::stage`], slices of its staging buffer) and *flushes*
//! them per socket ([`WanSockets::flush`]).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use soya_io::sys;
use soya_io::sys::udpio::{IoMode, IoStats, TxDatagram, UdpIo};

/// Messages per sendmmsg / recvmmsg on a WAN socket.
pub const WAN_IO_BATCH: usize = 64;

/// Socket buffers asked for on every WAN socket (SO_RCVBUFFORCE when
/// permitted; otherwise whatever `net.core.rmem_max` allows, with a warning).
pub const WAN_SOCKET_BUFFER: usize = 64 << 20;

#[derive(Debug)]
pub struct WanSockets {
    socks: Vec<UdpSocket>,
    io: Vec<UdpIo>,
    /// Per socket: datagrams staged for the next flush.
    staged: Vec<Vec<TxDatagram>>,
    pub binds: Vec<SocketAddr>,
    /// Per path: socket index and the twin's address.
    pub paths: Vec<(usize, SocketAddr)>,
    /// Per socket: the paths it carries.
    by_sock: Vec<Vec<usize>>,
    /// Datagrams from an address that is no path's remote, on a socket that
    /// carries several paths (dropped).
    pub unknown_source: u64,
    /// Datagrams from an unexpected address on a single-path socket: handed
    /// to the transport, which authenticates them (NAT may rewrite ports).
    pub foreign_source: u64,
    pub send_errors: u64,
}

impl WanSockets {
    /// Binds every `wan.bind` address. Returns the sockets and warnings for
    /// the operator (buffer sizes, DSCP conflicts).
    pub fn open(
        wan: &soya_config::WanConfig,
        mode: IoMode,
        max_datagram: usize,
    ) -> io::Result<(WanSockets, Vec<String>)> {
        let mut warnings = Vec::new();
        let mut socks = Vec::new();
        let mut by_sock = vec![Vec::new(); wan.bind.len()];
        let mut paths = Vec::new();
        for (i, p) in wan.paths.iter().enumerate() {
            let s = wan.bind.iter().position(|b| *b == p.bind).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("path {} binds {} which is not in wan.bind", p.name, p.bind),
                )
            })?;
            by_sock[s].push(i);
            paths.push((s, p.remote));
        }
        for (si, bind) in wan.bind.iter().enumerate() {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(*bind),
                socket2::Type::DGRAM,
                Some(socket2::Protocol::UDP),
            )?;
            if sys::force_buffers(s.as_raw_fd(), WAN_SOCKET_BUFFER).is_err() {
                let _ = s.set_recv_buffer_size(WAN_SOCKET_BUFFER);
                let _ = s.set_send_buffer_size(WAN_SOCKET_BUFFER);
                // Linux reports twice what it grants (bookkeeping overhead).
                let got = s.recv_buffer_size().unwrap_or(0) / 2;
                if got < WAN_SOCKET_BUFFER {
                    warnings.push(format!(
                        "wan socket {bind}: receive buffer {} KiB, wanted {} KiB \
                         (no CAP_NET_ADMIN for SO_RCVBUFFORCE; raise net.core.rmem_max \
                         and net.core.wmem_max)",
                        got >> 10,
                        WAN_SOCKET_BUFFER >> 10
                    ));
                }
            }
            // DSCP is per socket: the first path on it decides.
            let dscps: Vec<u8> = by_sock[si].iter().map(|&i| wan.paths[i].dscp).collect();
            if let Some(&d) = dscps.first() {
                if dscps.iter().any(|x| *x != d) {
                    warnings.push(format!(
                        "wan socket {bind} carries paths with different dscp; using {d} \
                         (the first path's) for all of them"
                    ));
                }
                let tos = u32::from(d) << 2;
                let r = if bind.is_ipv4() {
                    s.set_tos(tos)
                } else {
                    sys::set_tclass_v6(s.as_raw_fd(), (d) << 2)
                };
                if let Err(e) = r {
                    warnings.push(format!("wan socket {bind}: cannot set dscp {d}: {e}"));
                }
            }
            s.bind(&(*bind).into()).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot bind wan socket {bind}: {e}"))
            })?;
            s.set_nonblocking(true)?;
            socks.push(UdpSocket::from(s));
        }
        let io = socks
            .iter()
            .zip(&wan.bind)
            .map(|(s, b)| {
                UdpIo::new(
                    s.as_raw_fd(),
                    mode,
                    WAN_IO_BATCH,
                    max_datagram,
                    &format!("wan {b}"),
                )
            })
            .collect();
        Ok((
            WanSockets {
                staged: vec![Vec::new(); socks.len()],
                socks,
                io,
                binds: wan.bind.clone(),
                paths,
                by_sock,
                unknown_source: 0,
                foreign_source: 0,
                send_errors: 0,
            },
            warnings,
        ))
    }

    /// A reload's path set: paths onto the sockets already bound (a path
    /// on an address that is not in the running `wan.bind` needs a
    /// restart: the error says which), and each socket's DSCP from its first
    /// path. Returns warnings, like [`Self::open`].
    pub fn reconfigure(&mut self, wan: &soya_config::WanConfig) -> Result<Vec<String>, String> {
        let mut by_sock = vec![Vec::new(); self.socks.len()];
        let mut paths = Vec::new();
        for (i, p) in wan.paths.iter().enumerate() {
            let s = self
                .binds
                .iter()
                .position(|b| *b == p.bind)
                .ok_or_else(|| {
                    format!(
                        "path {} binds {}, which is not a running wan.bind (needs a restart)",
                        p.name, p.bind
                    )
                })?;
            by_sock[s].push(i);
            paths.push((s, p.remote));
        }
        let mut warnings = Vec::new();
        for (si, on) in by_sock.iter().enumerate() {
            let Some(&first) = on.first() else { continue };
            let d = wan.paths[first].dscp;
            let bind = self.binds[si];
            let fd = self.socks[si].as_raw_fd();
            let r = if bind.is_ipv4() {
                socket2::SockRef::from(&self.socks[si]).set_tos(u32::from(d) << 2)
            } else {
                sys::set_tclass_v6(fd, d << 2)
            };
            if let Err(e) = r {
                warnings.push(format!("wan socket {bind}: cannot set dscp {d}: {e}"));
            }
        }
        // Nothing staged refers to the old numbering: the device flushes
        // every turn before it takes a reload.
        self.paths = paths;
        self.by_sock = by_sock;
        Ok(warnings)
    }

    pub fn len(&self) -> usize {
        self.socks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.socks.is_empty()
    }

    pub fn fd(&self, sock: usize) -> RawFd {
        self.socks[sock].as_raw_fd()
    }

    /// Reads one batch from socket `sock` and hands every datagram to
    /// `f(path, bytes)`. Returns the datagrams read (0: none waiting) and
    /// whether the socket was emptied (see [`UdpIo::drained`]).
    pub fn recv_batch(
        &mut self,
        sock: usize,
        mut f: impl FnMut(usize, &mut [u8]),
    ) -> (usize, bool) {
        let WanSockets {
            io,
            paths,
            by_sock,
            unknown_source,
            foreign_source,
            ..
        } = self;
        let on = &by_sock[sock];
        let n = io[sock].recv(|bytes, from| {
            let path = match from {
                Some(from) => on.iter().copied().find(|&p| paths[p].1 == from),
                None => None,
            };
            let path = match path {
                Some(p) => p,
                None if on.len() == 1 => {
                    *foreign_source += 1;
                    on[0]
                }
                None => {
                    *unknown_source += 1;
                    return;
                }
            };
            f(path, bytes);
        });
        (n, io[sock].drained())
    }

    /// Receive errors (ICMP errors of earlier sends land here) and
    /// truncated datagrams, all sockets.
    pub fn recv_errors(&self) -> u64 {
        self.io.iter().map(|io| io.stats.recv_errors).sum()
    }

    /// I/O counters of socket `sock`.
    pub fn io_stats(&self, sock: usize) -> IoStats {
        self.io[sock].stats
    }

    /// How socket `sock` sends: its mode and whether GSO / GRO are on.
    pub fn io_describe(&self, sock: usize) -> (IoMode, bool, bool) {
        let io = &self.io[sock];
        (io.mode(), io.gso(), io.gro())
    }

    /// The path a datagram from `from` on socket `sock` belongs to.
    pub fn path_of(&mut self, sock: usize, from: SocketAddr) -> Option<usize> {
        let on = &self.by_sock[sock];
        if let Some(&p) = on.iter().find(|&&p| self.paths[p].1 == from) {
            return Some(p);
        }
        if on.len() == 1 {
            self.foreign_source += 1;
            return Some(on[0]);
        }
        self.unknown_source += 1;
        None
    }

    /// Stages `buf[off..off + len]` (of the buffer later passed to
    /// [`flush`](Self::flush)) for `path`.
    pub fn stage(&mut self, path: usize, off: usize, len: usize) {
        let (s, dest) = self.paths[path];
        self.staged[s].push(TxDatagram { off, len, dest });
    }

    /// Datagrams staged and not flushed yet.
    pub fn staged(&self) -> usize {
        self.staged.iter().map(Vec::len).sum()
    }

    /// Sends everything staged (slices of `buf`), socket by socket.
    pub fn flush(&mut self, buf: &[u8]) {
        for s in 0..self.socks.len() {
            if self.staged[s].is_empty() {
                continue;
            }
            let n = self.staged[s].len();
            let sent = self.io[s].send(buf, &self.staged[s]);
            // Full socket buffer or ICMP from the twin: a lost packet, which
            // the transport's loss recovery handles.
            self.send_errors += (n - sent) as u64;
            self.staged[s].clear();
        }
    }

    /// Sends one datagram on `path` to the twin at once.
    pub fn send(&mut self, path: usize, bytes: &[u8]) {
        self.stage(path, 0, bytes.len());
        self.flush(bytes);
    }
}
