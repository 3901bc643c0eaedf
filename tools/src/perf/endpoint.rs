//! One RoCEv2 endpoint address: a nonblocking UDP socket bound to
//! `ip:4791`, the session's [`RcQp`]s (found by BTH destination QP), batched
//! receive and send (`recvmmsg` / `sendmmsg` via [`soya_io::sys::batch`]), and
//! a monotonic clock mapped onto [`Time`].
//!
//! The caller runs the loop, one turn at a time:
//!
//! ```text
//! now = ep.now()
//! ep.receive(now)      // datagrams -> rebuilt IP packets -> qp.handle_packet
//! ep.timers(now)       // qp.handle_timeout for every due deadline
//! ... post work, take completions ...
//! ep.transmit(now)     // qp.poll_transmit -> UDP payloads -> sendmmsg
//! if nothing moved: ep.wait(deadline)
//! ```

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use soya_proto::time::Time;

use super::report::IoCounters;
use super::wire::{announce_packet, dest_qp, ip_dest_qp, to_udp_payload, Rebuild, HEADROOM};
use crate::rc::RcQp;
use soya_io::sys::batch::{RecvBatch, RxMeta, SendBatch};
use soya_io::sys::{self, RawAddr};

/// Datagrams per `recvmmsg` / `sendmmsg`.
const BATCH: usize = 64;
/// Room for the largest IP packet an `RcQp` emits at MTU 4096 (4191 B).
const PKT_BUF: usize = 4096 + 256;
/// Receive batches per turn before the rest of the loop gets a go.
const RX_ROUNDS: usize = 8;
/// Packets sent per turn at most.
const TX_PER_TURN: usize = 4 * BATCH;
/// Socket buffers asked for (forced past rmem_max when root).
const SOCK_BUF: usize = 16 << 20;

/// IP-in-UDP ("tunnel") mode: every datagram carries one whole IP packet,
/// exactly as [`RcQp`] emits and consumes it (no header rewriting). This is
/// what a Sōya gateway's lab `udp` backend (`dc.listen`) speaks, and what two
/// soya-perf endpoints speak to each other through a `soya-wanem udp` relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tunnel {
    /// This side's RoCE address (only inside the datagrams; any address).
    pub roce_ip: IpAddr,
    /// Where datagrams go: a gateway's `dc.listen`, a relay, or the peer's
    /// socket. `None`: to wherever the last datagram came from.
    pub to: Option<SocketAddr>,
    /// Announce `roce_ip` to `to` periodically (a gateway learns its lab
    /// hosts' UDP addresses from their packets).
    pub announce: bool,
}

/// How often a tunnel endpoint announces itself to its gateway.
const ANNOUNCE_EVERY: Duration = Duration::from_millis(100);

/// A UDP socket speaking RoCEv2 for a set of QPs.
pub struct Endpoint {
    tunnel: Option<Tunnel>,
    tunnel_dest: Option<RawAddr>,
    announce: Option<(IpAddr, Option<Instant>)>,
    sock: UdpSocket,
    local: SocketAddr,
    peer: Option<(SocketAddr, RawAddr)>,
    /// The session's QPs; QPNs are `qpn_base + index`.
    pub qps: Vec<RcQp>,
    qpn_base: u32,
    rx: RecvBatch,
    rx_bufs: Vec<Vec<u8>>,
    rx_meta: Vec<RxMeta>,
    tx: SendBatch,
    tx_bufs: Vec<Vec<u8>>,
    tx_ranges: Vec<Range<usize>>,
    rebuild: Option<(SocketAddr, Rebuild)>,
    rr: usize,
    pub io: IoCounters,
    start: Instant,
    /// When the last datagram arrived.
    pub last_rx: Time,
    /// Keep polling this long after the last activity before sleeping.
    spin: std::time::Duration,
    idle_since: Option<Time>,
    /// The socket's drop counter when the session started.
    drops_before: u64,
    /// The last `recvmmsg` found the socket empty, and no wait has happened
    /// since: the next [`Endpoint::receive`] need not ask again (see there).
    rx_empty: bool,
    /// `recvmmsg` calls made (for tests).
    recv_calls: u64,
}

impl Endpoint {
    /// [`Endpoint::bind`] with the data-path options both soya-perf roles
    /// take (UDP GSO, busy polling, the lab's tunnel); the error says what
    /// to change.
    pub fn open(
        local: SocketAddr,
        gso: bool,
        busy_poll: Duration,
        tunnel: Option<Tunnel>,
    ) -> Result<Endpoint, super::PerfError> {
        let mut ep = Endpoint::bind(local).map_err(|e| {
            super::PerfError::Failed(format!(
                "cannot bind the RoCE socket {local}: {e} (another endpoint on this address? use --bind-ip)"
            ))
        })?;
        ep.set_gso(gso);
        ep.set_busy_poll(busy_poll);
        if let Some(t) = tunnel {
            ep.set_tunnel(t);
        }
        Ok(ep)
    }

    /// Binds `local` (an address on this host, normally port 4791).
    pub fn bind(local: SocketAddr) -> io::Result<Endpoint> {
        let sock = UdpSocket::bind(local)?;
        sock.set_nonblocking(true)?;
        sys::tune_udp_socket(sock.as_raw_fd(), SOCK_BUF);
        never_fragment(&sock, local.is_ipv4())?;
        if local.is_ipv4() {
            no_udp_checksum(&sock)?;
        }
        let local = sock.local_addr()?;
        let io = IoCounters {
            rcvbuf_bytes: rcvbuf(&sock),
            ..IoCounters::default()
        };
        Ok(Endpoint {
            tunnel: None,
            tunnel_dest: None,
            announce: None,
            sock,
            local,
            peer: None,
            qps: Vec::new(),
            qpn_base: 0,
            rx: RecvBatch::new(BATCH, 0),
            rx_bufs: (0..BATCH).map(|_| vec![0u8; HEADROOM + PKT_BUF]).collect(),
            rx_meta: vec![RxMeta::default(); BATCH],
            tx: SendBatch::new(BATCH, false),
            tx_bufs: (0..BATCH).map(|_| vec![0u8; PKT_BUF]).collect(),
            tx_ranges: vec![0..0; BATCH],
            rebuild: None,
            rr: 0,
            io,
            start: Instant::now(),
            last_rx: Time::ZERO,
            spin: Duration::ZERO,
            idle_since: None,
            drops_before: 0,
            rx_empty: false,
            recv_calls: 0,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn local_ip(&self) -> IpAddr {
        self.local.ip()
    }

    /// Switches to IP-in-UDP mode (before the first session).
    pub fn set_tunnel(&mut self, t: Tunnel) {
        self.tunnel = Some(t);
        self.tx.gso = false;
    }

    /// The RoCE address the QPs use: the tunnel's, else the socket's.
    pub fn roce_ip(&self) -> IpAddr {
        self.tunnel.map_or(self.local.ip(), |t| t.roce_ip)
    }

    /// Tunnel mode with announcements: sends one when due.
    fn maybe_announce(&mut self) {
        let (Some(t), Some((peer, last))) = (self.tunnel, self.announce.as_mut()) else {
            return;
        };
        let Some(to) = t.to else { return };
        if last.is_some_and(|l| l.elapsed() < ANNOUNCE_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        if let Some(p) = announce_packet(t.roce_ip, *peer) {
            let _ = self.sock.send_to(&p, to);
        }
    }

    /// Sends with UDP GSO (runs of equal-size datagrams in one system call).
    pub fn set_gso(&mut self, on: bool) {
        self.tx.gso = on;
    }

    /// Starts a session: traffic goes to `peer`, arrives for `qps`, whose
    /// QPNs must be `qpn_base`, `qpn_base + 1`, ... Counters start afresh.
    pub fn start_session(&mut self, peer: SocketAddr, qps: Vec<RcQp>, qpn_base: u32) {
        debug_assert!(qps
            .iter()
            .enumerate()
            .all(|(i, q)| q.local().qpn == qpn_base + i as u32));
        self.peer = Some((peer, RawAddr::from_std(peer)));
        if let Some(t) = self.tunnel {
            self.tunnel_dest = t.to.map(RawAddr::from_std);
            self.announce = t.announce.then_some((peer.ip(), None));
            self.maybe_announce();
        }
        self.qps = qps;
        self.qpn_base = qpn_base;
        self.rr = 0;
        self.rebuild = None;
        self.rx_empty = false;
        self.drops_before = self.rx.kernel_drops;
        self.io = IoCounters {
            rcvbuf_bytes: self.io.rcvbuf_bytes,
            ..IoCounters::default()
        };
    }

    /// Ends the session and hands its QPs back. Counters are kept until the
    /// next session starts.
    pub fn end_session(&mut self) -> Vec<RcQp> {
        self.peer = None;
        std::mem::take(&mut self.qps)
    }

    /// Now on the endpoint's clock (zero when it was bound).
    pub fn now(&self) -> Time {
        Time::from_nanos(self.start.elapsed().as_nanos() as u64)
    }

    /// Receives every datagram waiting (up to a bound) and hands each to its
    /// QP. Returns how many arrived.
    ///
    /// A batch shorter than [`BATCH`] means the socket was empty. A loop turn
    /// that moved something returns from [`Endpoint::idle`] without waiting,
    /// and the next turn's `recvmmsg` would nearly always find nothing: one
    /// system call per wake-up wasted. So that call is skipped; whatever came
    /// meanwhile is found by the wait in `idle` (poll is level-triggered and
    /// returns at once) and read on the turn after.
    pub fn receive(&mut self, now: Time) -> usize {
        if std::mem::take(&mut self.rx_empty) {
            return 0;
        }
        let mut total = 0;
        for _ in 0..RX_ROUNDS {
            let mut rx = self.rx_bufs.iter_mut();
            let mut bufs: [&mut [u8]; BATCH] =
                std::array::from_fn(|_| &mut rx.next().expect("BATCH buffers")[HEADROOM..]);
            // Errors other than "nothing waiting" (none expected on a bound
            // UDP socket) read as an empty batch.
            self.recv_calls += 1;
            let got = self
                .rx
                .recv_into(self.sock.as_raw_fd(), &mut bufs, &mut self.rx_meta)
                .unwrap_or_default();
            for i in 0..got {
                self.deliver(i, now);
            }
            total += got;
            if got < BATCH {
                self.rx_empty = true;
                break;
            }
        }
        if total > 0 {
            self.last_rx = now;
        }
        self.io.datagrams_received += total as u64;
        // The kernel's count is per socket; report the session's share.
        self.io.kernel_rx_drops = self.rx.kernel_drops.saturating_sub(self.drops_before);
        total
    }

    fn deliver(&mut self, i: usize, now: Time) {
        let meta = self.rx_meta[i];
        if self.tunnel.is_some() {
            self.deliver_ip(i, now);
            return;
        }
        let buf = &mut self.rx_bufs[i];
        let dgram = &buf[HEADROOM..HEADROOM + meta.len.min(PKT_BUF)];
        let qpn = dest_qp(dgram).filter(|_| !meta.truncated);
        let Some(qp) = qp_of(&mut self.qps, self.qpn_base, qpn, &mut self.io) else {
            return;
        };
        let Some(src) = self.rx.source(i).to_std() else {
            self.io.bad_datagrams += 1;
            return;
        };
        let rb = match self.rebuild {
            Some((a, rb)) if a == src => rb,
            _ => match Rebuild::new(src, self.local.ip()) {
                Some(rb) => {
                    self.rebuild = Some((src, rb));
                    rb
                }
                None => {
                    self.io.bad_datagrams += 1;
                    return;
                }
            },
        };
        let r = rb.apply(buf, meta.len);
        qp.handle_packet(now, &buf[r]);
    }

    /// Tunnel mode: the datagram is a whole IP packet.
    fn deliver_ip(&mut self, i: usize, now: Time) {
        let meta = self.rx_meta[i];
        let pkt = &self.rx_bufs[i][HEADROOM..HEADROOM + meta.len.min(PKT_BUF)];
        let qpn = ip_dest_qp(pkt).filter(|_| !meta.truncated);
        let Some(qp) = qp_of(&mut self.qps, self.qpn_base, qpn, &mut self.io) else {
            return;
        };
        if self.tunnel.is_some_and(|t| t.to.is_none()) {
            self.tunnel_dest = Some(self.rx.source(i));
        }
        qp.handle_packet(now, pkt);
    }

    /// Fires the QPs' due timers.
    pub fn timers(&mut self, now: Time) {
        for qp in &mut self.qps {
            if qp.poll_timeout().is_some_and(|t| t <= now) {
                qp.handle_timeout(now);
            }
        }
    }

    /// The QPs' earliest deadline.
    pub fn next_deadline(&self) -> Option<Time> {
        self.qps.iter().filter_map(RcQp::poll_timeout).min()
    }

    /// Sends what the QPs have to send (round robin, a bounded amount per
    /// turn). Returns how many datagrams went out.
    pub fn transmit(&mut self, now: Time) -> usize {
        let Some((_, mut dest)) = self.peer else {
            return 0;
        };
        let tunnel = self.tunnel.is_some();
        if tunnel {
            self.maybe_announce();
            match self.tunnel_dest {
                Some(d) => dest = d,
                None => return 0,
            }
        }
        let n = self.qps.len();
        if n == 0 {
            return 0;
        }
        let sport = self.local.port();
        let mut total = 0;
        while total < TX_PER_TURN {
            let mut k = 0;
            let mut idle = 0;
            while k < BATCH && idle < n {
                let qp = &mut self.qps[self.rr];
                match qp.poll_transmit(now, &mut self.tx_bufs[k]) {
                    Some(len) if tunnel => {
                        self.tx_ranges[k] = 0..len;
                        k += 1;
                        idle = 0;
                    }
                    Some(len) => {
                        if let Ok(r) = to_udp_payload(&mut self.tx_bufs[k][..len], sport) {
                            self.tx_ranges[k] = r;
                            k += 1;
                        }
                        idle = 0;
                    }
                    None => idle += 1,
                }
                self.rr = (self.rr + 1) % n;
            }
            if k == 0 {
                break;
            }
            let pkts: [&[u8]; BATCH] = std::array::from_fn(|j| {
                if j < k {
                    &self.tx_bufs[j][self.tx_ranges[j].clone()]
                } else {
                    &[]
                }
            });
            let out = self
                .tx
                .send_slices(self.sock.as_raw_fd(), &pkts[..k], Some(&dest));
            self.io.datagrams_sent += out.sent as u64;
            self.io.send_failures += out.failed as u64;
            total += k;
            if k < BATCH {
                break;
            }
        }
        total
    }

    /// Busy-polls this long after the last activity before sleeping in the
    /// kernel (lower latency, one core kept busy).
    pub fn set_busy_poll(&mut self, d: Duration) {
        self.spin = d;
    }

    /// Ends a loop turn: after a turn where something `moved`, returns at
    /// once; otherwise busy-polls for a while, then blocks until a datagram
    /// arrives or `until` (at most `cap` from now).
    pub fn idle(&mut self, now: Time, moved: bool, until: Option<Time>, cap: Duration) {
        if moved {
            self.idle_since = None;
            return;
        }
        // From here on the socket is polled again (spinning or waiting).
        self.rx_empty = false;
        let since = *self.idle_since.get_or_insert(now);
        if now.since(since) < self.spin {
            std::hint::spin_loop();
            return;
        }
        let d = until.map_or(cap, |t| t.since(now).min(cap));
        if !d.is_zero() {
            sys::wait_readable(self.sock.as_raw_fd(), d);
        }
    }
}

/// DF on every datagram, never fragmented (a too-large one fails with
/// EMSGSIZE), as RoCE requires. Also what makes the IPv4 ID on the wire
/// match `RcQp`'s header: with `IP_PMTUDISC_DO` an unconnected socket's DF
/// datagrams carry ID 0 (`ip_select_ident_segs`), while the default
/// (`IP_PMTUDISC_WANT`) gives them hashed IDs, which the ICRC covers.
/// The QP a received packet is for: `qpn` is its destination QP (`None`:
/// not RoCE or cut short, counted as a bad datagram), QP `qpn_base + k` is
/// `qps[k]` (another QPN is counted as unknown).
fn qp_of<'a>(
    qps: &'a mut [RcQp],
    qpn_base: u32,
    qpn: Option<u32>,
    io: &mut IoCounters,
) -> Option<&'a mut RcQp> {
    let Some(qpn) = qpn else {
        io.bad_datagrams += 1;
        return None;
    };
    let qp = qpn
        .checked_sub(qpn_base)
        .and_then(|k| qps.get_mut(k as usize));
    if qp.is_none() {
        io.unknown_qp += 1;
    }
    qp
}

fn never_fragment(sock: &UdpSocket, v4: bool) -> io::Result<()> {
    let (level, opt, val) = if v4 {
        (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    } else {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    };
    sys::setsockopt_int(sock.as_raw_fd(), level, opt, val)
}

/// IPv4 datagrams leave with UDP checksum 0, as rxe and RoCE NICs send
/// RoCEv2 and as `RcQp` builds its own packets: the ICRC (which masks the
/// UDP checksum) already covers every byte end to end, and `RcQp` verifies
/// it. A zero checksum is what lets the receiving kernel copy the payload
/// without summing it (`udp4_csum_init` marks it CHECKSUM_UNNECESSARY): on a
/// device without checksum offload (TUN, the demo's veths) the summing copy
/// was the responder's largest kernel cost. (IPv6 requires a UDP checksum:
/// unchanged there.)
fn no_udp_checksum(sock: &UdpSocket) -> io::Result<()> {
    sys::setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)
}

/// The receive buffer the kernel granted.
fn rcvbuf(sock: &UdpSocket) -> u64 {
    sys::getsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF)
        .map_or(0, |v| v.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Protocol, Socket, Type};

    /// After a receive that emptied the socket and a turn that moved (no
    /// wait), the next receive makes no system call; a datagram that came
    /// meanwhile is not lost: the wait returns at once and the turn after
    /// reads it.
    #[test]
    fn no_recvmmsg_straight_after_one_that_emptied_the_socket() {
        let mut ep = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let cap = Duration::from_secs(5);
        tx.send_to(b"one", ep.local).unwrap();
        ep.idle(ep.now(), false, None, cap); // until readable
        assert_eq!(ep.receive(ep.now()), 1);
        assert_eq!(ep.recv_calls, 1);
        ep.idle(ep.now(), true, None, cap); // moved: back at once
        tx.send_to(b"two", ep.local).unwrap();
        assert_eq!(
            ep.receive(ep.now()),
            0,
            "skipped: the socket was just found empty"
        );
        assert_eq!(ep.recv_calls, 1);
        ep.idle(ep.now(), false, None, cap); // readable: returns at once
        assert_eq!(ep.receive(ep.now()), 1);
        assert_eq!(ep.recv_calls, 2);
        // A turn that waited asks the socket at once.
        tx.send_to(b"three", ep.local).unwrap();
        ep.idle(ep.now(), false, None, cap);
        assert_eq!(ep.receive(ep.now()), 1, "read right after the wait");
        assert_eq!(ep.recv_calls, 3);
        assert_eq!(ep.io.datagrams_received, 3);
    }

    /// The RoCE socket sends IPv4 datagrams with UDP checksum 0 (see
    /// [`no_udp_checksum`]): asked of the socket, and, where a raw socket may
    /// be opened (root), seen on the wire.
    #[test]
    fn ipv4_datagrams_carry_no_udp_checksum() {
        let ep = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let fd = ep.sock.as_raw_fd();
        assert_eq!(
            sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_NO_CHECK).unwrap(),
            1
        );
        let Ok(raw) = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)) else {
            eprintln!("no raw socket (not root): the wire check is skipped");
            return;
        };
        let raw = UdpSocket::from(std::os::fd::OwnedFd::from(raw));
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = sink.local_addr().unwrap();
        ep.sock.send_to(b"roce?", to).unwrap();
        let mut b = [0u8; 2048];
        // Other UDP traffic on the host may come first: find ours (a
        // datagram from the endpoint's port to the sink's).
        loop {
            let n = raw.recv(&mut b).expect("our datagram within 5 s");
            let ihl = usize::from(b[0] & 0xF) * 4;
            let u = &b[ihl..n];
            let sport = u16::from_be_bytes([u[0], u[1]]);
            let dport = u16::from_be_bytes([u[2], u[3]]);
            if sport == ep.local.port() && dport == to.port() {
                assert_eq!(&u[6..8], &[0, 0], "UDP checksum field");
                assert_eq!(&u[8..], b"roce?");
                break;
            }
        }
    }
}
