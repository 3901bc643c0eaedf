//! The copies the `xdp` backend itself makes per packet, counted (feature
//! `count-copies`) on real AF_XDP sockets: a veth pair in a network
//! namespace of its own (`ip netns exec`), 4.2 KB frames (a 4096-byte RoCE
//! path MTU) sent from the peer end through an AF_PACKET socket, read with
//! `recv_batch`; packets written with `send` and read back on the peer.
//!
//! `proxy/tests/steady_state_alloc.rs` counts the copies of the sites (the
//! engine and the WAN transport) in memory, where the DC backend is free;
//! this counts what the xdp backend adds on top of them, so that the two
//! together give an xdp gateway's copies per packet (docs/benchmarks.md
//! § "Copies per packet"). Needs root; skipped with a printed reason
//! otherwise, unless SOYA_REQUIRE_NETNS=1.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;

use super::{open_with_hold, XdpDc, TAPE_HOLD};
use crate::dcrx::DcRx;
use soya_proto::buffer::PacketBuf;
use soya_proto::copies;

/// Frames per direction.
const N: usize = 64;
/// The IP packet of a 4096-byte RoCE WRITE over IPv4 (IP 20, UDP 8, BTH
/// 12, RETH 16, payload 4096, ICRC 4 → 4156) and some: 4176 bytes, so the
/// frame (4190) spans two 4 KiB UMEM chunks.
pub(super) const PACKET: usize = 4176;
pub(super) const HOST: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
pub(super) const FAR: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);

/// Copies the backend makes per packet of a 4.2 KB frame read from the DC:
/// none. Its two buffers are contiguous on the RX tape (`xdp::tape`), and
/// it is lent to the site where the kernel wrote it. (Before the tape: 1,
/// the gather of the two UMEM chunks into a buffer the site lent.)
const MAX_RX_COPIES: f64 = 0.0;
/// Copies per packet written toward a host, for a packet the site decoded
/// into a buffer the backend lent (a run of its UMEM, `lend`): none, it is
/// sent by offset from where it lies. (A packet on the heap is still
/// copied into UMEM TX chunks: 1.00, the fallback when no region is free.)
const MAX_TX_COPIES: f64 = 0.0;

pub(super) fn required() -> bool {
    std::env::var("SOYA_REQUIRE_NETNS").is_ok_and(|v| v == "1")
}

pub(super) fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(super) fn mac(ifname: &str) -> [u8; 6] {
    let s = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address")).unwrap();
    let mut m = [0u8; 6];
    for (i, b) in s.trim().split(':').enumerate() {
        m[i] = u8::from_str_radix(b, 16).unwrap();
    }
    m
}

/// An IPv4 + UDP packet of `PACKET` bytes, its payload numbered by `n`.
fn packet(src: Ipv4Addr, dst: Ipv4Addr, n: usize) -> Vec<u8> {
    packet_of(src, dst, n, PACKET)
}

/// An IPv4 + UDP packet of `size` bytes (at least 28), its payload
/// numbered by `n`.
pub(super) fn packet_of(src: Ipv4Addr, dst: Ipv4Addr, n: usize, size: usize) -> Vec<u8> {
    let mut p = vec![0u8; size];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(size as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p[20..22].copy_from_slice(&5000u16.to_be_bytes());
    p[22..24].copy_from_slice(&4791u16.to_be_bytes());
    p[24..26].copy_from_slice(&((size - 20) as u16).to_be_bytes());
    for (i, b) in p[28..].iter_mut().enumerate() {
        *b = (i + n * 7) as u8;
    }
    p
}

/// An AF_PACKET socket on `ifname` (the peer end: it plays the hosts).
pub(super) struct Peer {
    fd: OwnedFd,
    ifindex: i32,
}

impl Peer {
    pub(super) fn open(ifname: &str) -> Peer {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2), checked, then owned.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ifindex = super::ifindex(ifname).unwrap() as i32;
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = proto;
        sa.sll_ifindex = ifindex;
        // SAFETY: a pointer to a live sockaddr_ll and its size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
        // Room for every frame of a direction (the default, about 200 KB,
        // holds 17 of them).
        let size: libc::c_int = 16 << 20;
        // SAFETY: a pointer to a live c_int and its size.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        assert_eq!(r, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
        Peer { fd, ifindex }
    }

    pub(super) fn send(&self, frame: &[u8]) {
        // SAFETY: the socket is bound; `frame` is live for the call.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            r,
            frame.len() as isize,
            "{}",
            std::io::Error::last_os_error()
        );
    }

    /// The next frame the peer end received (not one it sent), waiting at
    /// most 5 s for it (a safety net: the verdict is what arrives).
    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.recv_within(buf, 5000)
    }

    /// [`recv`](Self::recv), waiting at most `ms` milliseconds.
    pub(super) fn recv_within(&self, buf: &mut [u8], ms: i32) -> Option<usize> {
        loop {
            if !wait_readable_for(self.fd.as_raw_fd(), ms) {
                return None;
            }
            // SAFETY: all-zero is a valid sockaddr_ll.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: `buf` and `from` are live and their sizes given.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            assert!(n >= 0, "{}", std::io::Error::last_os_error());
            // PACKET_OUTGOING (4): a frame this end sent.
            if from.sll_pkttype != 4 && from.sll_ifindex == self.ifindex {
                return Some(n as usize);
            }
        }
    }
}

pub(super) fn wait_readable(fd: i32) -> bool {
    wait_readable_for(fd, 5000)
}

fn wait_readable_for(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// Runs the test `inner` of this binary in network namespace `ns`, under
/// `ip netns exec` (which also mounts that namespace's /sys, where the
/// backend reads the interface's queues and address).
pub(super) fn in_netns(ns: &str, inner: &str) {
    ip(&format!("netns add {ns}"));
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args([
            inner,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INNER, "1")
        .output()
        .expect("run the test in the namespace");
    ip(&format!("netns del {ns}"));
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{inner} in {ns}: {}", out.status);
    let ran = String::from_utf8_lossy(&out.stdout).contains("1 passed");
    assert!(ran, "{inner} did not run in {ns}");
}

/// Set in the child that runs the ignored half.
pub(super) const INNER: &str = "SOYA_XDP_COPIES_INNER";

/// xa (the gateway's DC interface, AF_XDP) ── veth ── xb (the hosts).
fn setup() -> Option<XdpDc> {
    setup_with_hold(TAPE_HOLD)
}

/// [`setup`] with `hold` tape slots for frames lent in place.
pub(super) fn setup_with_hold(hold: usize) -> Option<XdpDc> {
    ip("link set lo up");
    ip("link add xa numrxqueues 1 numtxqueues 1 type veth peer name xb numrxqueues 1 numtxqueues 1");
    ip("link set xa up mtu 9000");
    ip("link set xb up mtu 9000");
    ip("addr add 10.1.0.254/24 dev xa");
    let m = mac("xb");
    let lladdr = m.map(|b| format!("{b:02x}")).join(":");
    ip(&format!(
        "neigh replace {HOST} lladdr {lladdr} dev xa nud permanent"
    ));
    let p = |s: &str| s.parse().unwrap();
    match open_with_hold("xa", 1, &[p("10.1.0.0/16")], &[p("10.2.0.0/16")], 256, hold) {
        Ok(mut v) => Some(v.remove(0)),
        Err(e) if !required() && e.to_string().contains("not built") => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

pub(super) fn frame(dst: [u8; 6], src: [u8; 6], ip: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + ip.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(ip);
    f
}

#[test]
fn xdp_backend_copies_per_packet() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 && !required() {
        eprintln!("skipped: needs root (network namespace, AF_XDP)");
        return;
    }
    if !copies::COUNTED {
        eprintln!("copies not counted: build with --features count-copies");
    }
    let ns = format!("soya-xdp-copies-{}", std::process::id());
    in_netns(&ns, "xdp::tests_copies::copies_in_namespace");
}

/// The body of [`xdp_backend_copies_per_packet`], in its namespace.
#[test]
#[ignore = "run by xdp_backend_copies_per_packet inside a network namespace"]
fn copies_in_namespace() {
    if std::env::var_os(INNER).is_none() {
        return;
    }
    {
        let Some(mut dc) = setup() else { return };
        let peer = Peer::open("xb");
        let (xa, xb) = (mac("xa"), mac("xb"));

        // From the hosts: N frames of two UMEM chunks each.
        let sent: Vec<Vec<u8>> = (0..N).map(|n| packet(HOST, FAR, n)).collect();
        for p in &sent {
            peer.send(&frame(xa, xb, p));
        }
        let mut got = Vec::new();
        let mut lent_used = 0;
        let mut scratch = vec![0u8; 9000];
        let mut lent: Vec<soya_proto::buffer::PacketBuf> = Vec::new();
        let before = copies::so_far();
        while got.len() < N {
            while lent.len() < 64 {
                lent.push(soya_proto::buffer::PacketBuf::with_capacity(
                    soya_proto::buffer::pool::PACKET_BUF_BYTES,
                ));
            }
            let (n, _) = dc.recv_batch(&mut scratch, &mut lent, |rx| {
                if let DcRx::Lent(_) = rx {
                    lent_used += 1;
                }
                got.push(rx.bytes().to_vec());
            });
            if n == 0 {
                assert!(
                    wait_readable(dc.fd()),
                    "{} of {N} frames read: {:?}, kernel drops {}",
                    got.len(),
                    dc.stats,
                    dc.kernel_drops()
                );
            }
        }
        let rx = copies::so_far() - before;
        assert_eq!(got, sent, "the packets as sent");
        assert_eq!(dc.stats.rx_multi_buffer, N as u64, "two chunks per frame");
        // Each lent to the site in place (no site buffer used), which it
        // keeps.
        assert_eq!(lent_used, N);
        assert_eq!(dc.stats.rx_in_place, N as u64, "{:?}", dc.stats);

        // Toward the hosts: packets in buffers the backend lent to the
        // site's pool, as the WAN decode would have written them (that
        // write is the site's one copy, counted by steady_state_alloc).
        let source = dc.lend_source().expect("UMEM regions lent");
        let back: Vec<PacketBuf> = (0..N)
            .map(|n| {
                let mut b = source.lend().expect("a free region");
                b.extend_from_slice(&packet(FAR, HOST, n + 100));
                assert!(b.is_lent(), "fits its region");
                b
            })
            .collect();
        let before = copies::so_far();
        for p in &back {
            dc.send(p, IpAddr::V4(HOST)).expect("queued");
        }
        // What the daemon's next turns would do: kick until the kernel
        // took every descriptor (copy mode sends a bounded number per
        // kick).
        for _ in 0..1000 {
            dc.flush();
            if dc.tx.outstanding() == 0 {
                break;
            }
        }
        assert_eq!(dc.tx.outstanding(), 0, "TX descriptors left");
        let tx = copies::so_far() - before;
        let mut buf = vec![0u8; 9000];
        for (n, p) in back.iter().enumerate() {
            // Skip what the kernel itself sends on xa (IPv6 ND, ...).
            let len = loop {
                let len = peer.recv(&mut buf).unwrap_or_else(|| {
                    panic!("{n} of {N} packets reached the host: {:?}", dc.stats)
                });
                if len == 14 + PACKET {
                    break len;
                }
            };
            assert_eq!(&buf[..len], &frame(xb, xa, p)[..], "packet {n}");
        }
        let per = |bytes: u64| bytes as f64 / (N * PACKET) as f64;
        let (rx_per, tx_per) = (per(rx.bytes), per(tx.bytes));
        println!(
            "xdp backend copies per {PACKET}-byte packet: from the DC {rx_per:.2} \
             ({} copies), toward the DC {tx_per:.2} ({} copies)",
            rx.large, tx.large
        );
        if copies::COUNTED {
            assert!(rx_per <= MAX_RX_COPIES, "from the DC: {rx_per:.2}");
            assert!(tx_per <= MAX_TX_COPIES, "toward the DC: {tx_per:.2}");
        }
        assert_eq!(dc.stats.tx_in_place, N as u64, "{:?}", dc.stats);
        // Dropped by the site (the responder acknowledged them): each
        // region is free again once its descriptors completed. Waits for
        // that event (the kernel posts completions when it frees the
        // frames), failing only if it never comes.
        drop(back);
        let mut waited = 0;
        while dc.lend_counters().1 > 0 {
            dc.flush();
            waited += 1;
            assert!(
                waited < 10_000,
                "lent regions never came back: {:?}",
                dc.stats
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
