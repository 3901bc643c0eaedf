//! L3 mode (TUN) and L2 mode (TAP): two devices, every packet read from one
//! is impaired and written to the other, so any IP traffic — or, with TAP,
//! any Ethernet traffic such as RoCEv2 from Soft-RoCE (rxe needs an
//! Ethernet device) — crosses the emulated WAN.
//!
//! The emulator creates both devices; the operator moves each into a
//! network namespace and addresses them, e.g. (TUN):
//!
//! ```text
//! soya-wanem tun --a-dev wanA --b-dev wanB --distance-km 300 &
//! ip netns add siteA; ip netns add siteB
//! ip link set wanA netns siteA; ip link set wanB netns siteB
//! ip -n siteA addr add 10.201.0.1/24 dev wanA; ip -n siteA link set wanA up
//! ip -n siteB addr add 10.201.0.2/24 dev wanB; ip -n siteB link set wanB up
//! ip netns exec siteA ping 10.201.0.2     # RTT ≈ 2 × 1.47 ms
//! ```
//!
//! With `--tap`, the devices are Ethernet: bridge them (or give them
//! addresses in the namespaces) and `rdma link add rxe0 type rxe netdev wanA`.
//!
//! TUN devices carry virtio-net headers unless `--no-offload`: a sender's
//! UDP GSO run is read whole and datagrams leaving together are written as
//! one GSO packet ([`super::vnet`]), each datagram still impaired on its
//! own. With `--slack-us`, one thread serves both directions.

use std::io;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use super::engine::{self, DirectionFn, Emulator, EngineOptions, PacketIo};
use super::vnet::{self, Splitter};
use crate::sim::link::LinkProfile;
use soya_io::sys;
use soya_io::sys::batch::{RxMeta, SendOutcome};

/// Largest packet a device with USO hands over: virtio header, IPv6
/// header, 64 KiB of UDP.
const STAGE: usize = vnet::HDR + 40 + 65_536;

/// A TUN device's descriptor, and whether it carries virtio-net headers.
#[derive(Clone)]
struct Dev {
    fd: Arc<OwnedFd>,
    vnet: bool,
}

struct TunIo {
    rx: Dev,
    tx: Dev,
    /// Virtio-net mode: where a packet longer than the engine's buffer
    /// lands (a GSO packet is cut into datagrams from here, over as many
    /// `recv` calls as it takes), after `front` bytes kept free.
    stage: Vec<u8>,
    front: usize,
    stage_start: usize,
    stage_len: usize,
    split: Option<Splitter>,
    /// Virtio-net mode: the headers of a GSO packet being written.
    gso_hdr: [u8; vnet::HDR + 48],
    /// Spare allocation for a write's slices (see [`recycle`]).
    iov: Vec<IoSlice<'static>>,
}

impl TunIo {
    fn new(rx: Dev, tx: Dev) -> TunIo {
        TunIo {
            stage: Vec::new(),
            front: 0,
            stage_start: 0,
            stage_len: 0,
            split: None,
            gso_hdr: [0; vnet::HDR + 48],
            iov: Vec::new(),
            rx,
            tx,
        }
    }

    /// Virtio-net mode: the next packet (a datagram cut from the staged
    /// GSO packet, or one read) into `buf`; `None` when none is waiting.
    ///
    /// A packet is read into `buf` and, past its end, into the stage
    /// (one `readv`), so a plain datagram is not copied. A GSO packet
    /// longer than `buf` is made whole in the stage by copying its head
    /// from `buf` to just before the part the kernel put there (the stage
    /// keeps `front` bytes free for it), then cut from there.
    fn recv_vnet(&mut self, buf: &mut [u8]) -> io::Result<Option<RxMeta>> {
        loop {
            if let Some(sp) = &mut self.split {
                let pkt = &self.stage[self.stage_start..self.stage_start + self.stage_len];
                let left = sp.left(pkt);
                match sp.next_into(pkt, buf) {
                    Some(len) => return Ok(Some(meta(len, false))),
                    None => {
                        self.split = None;
                        if left > 0 {
                            // `buf` cannot hold a datagram: the rest of
                            // the GSO packet is dropped as oversize.
                            return Ok(Some(meta(buf.len(), true)));
                        }
                    }
                }
            }
            if self.front < buf.len() {
                self.front = buf.len();
                self.stage = vec![0; self.front + STAGE];
            }
            let front = self.front;
            let Some(len) =
                sys::tun_vnet::read_split(self.rx.fd.as_raw_fd(), buf, &mut self.stage[front..])?
            else {
                return Ok(None);
            };
            if len < vnet::HDR {
                continue;
            }
            let head = len.min(buf.len());
            if len <= buf.len() && Splitter::of(&buf[..len]).is_none() {
                return Ok(Some(meta(len, false)));
            }
            self.stage[front - head..front].copy_from_slice(&buf[..head]);
            self.stage_start = front - head;
            self.stage_len = len;
            match Splitter::of(&self.stage[self.stage_start..self.stage_start + len]) {
                Some(Ok(sp)) => self.split = Some(sp),
                // A GSO packet that cannot be cut (the device advertises
                // only UDP segmentation), or a packet longer than `buf`:
                // dropped as oversize.
                _ => return Ok(Some(meta(buf.len(), true))),
            }
        }
    }

    /// Virtio-net mode: writes `pkts`, each run that may leave as one GSO
    /// packet in one `writev` (see [`vnet::run_len`]).
    fn send_vnet(&mut self, pkts: &[&[u8]]) -> SendOutcome {
        let mut o = SendOutcome::default();
        let mut i = 0;
        while i < pkts.len() {
            let n = vnet::run_len(&pkts[i..]).max(1);
            let run = &pkts[i..i + n];
            let r = if n == 1 {
                sys::write_packet(self.tx.fd.as_raw_fd(), run[0])
            } else {
                let hl = vnet::gso_header(run, &mut self.gso_hdr);
                let mut iov = recycle(std::mem::take(&mut self.iov));
                iov.push(IoSlice::new(&self.gso_hdr[..hl]));
                iov.extend(run.iter().map(|p| IoSlice::new(&p[hl..])));
                let r = sys::tun_vnet::writev_packet(self.tx.fd.as_raw_fd(), &iov);
                self.iov = recycle(iov);
                r
            };
            let wire: usize = run.iter().map(|p| p.len() - vnet::HDR).sum();
            match r {
                Ok(()) => {
                    o.sent += n;
                    o.sent_bytes += wire;
                }
                Err(_) => o.failed += n,
            }
            i += n;
        }
        o
    }
}

/// `v` emptied, its allocation kept for slices of another lifetime.
fn recycle<'a, 'b>(mut v: Vec<IoSlice<'a>>) -> Vec<IoSlice<'b>> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

fn meta(len: usize, truncated: bool) -> RxMeta {
    RxMeta {
        len,
        truncated,
        rx_real_ns: None,
        segment: None,
    }
}

impl PacketIo for TunIo {
    fn rx_fd(&self) -> RawFd {
        self.rx.fd.as_raw_fd()
    }

    fn overhead(&self) -> usize {
        if self.rx.vnet {
            vnet::HDR
        } else {
            0
        }
    }

    fn recv(&mut self, bufs: &mut [&mut [u8]], metas: &mut [RxMeta]) -> io::Result<usize> {
        let mut n = 0;
        while n < bufs.len().min(metas.len()) {
            let buf_len = bufs[n].len();
            let got = if self.rx.vnet {
                self.recv_vnet(bufs[n])?
            } else {
                // A packet filling the buffer may have been cut.
                sys::read_packet(self.rx.fd.as_raw_fd(), bufs[n])?
                    .map(|len| meta(len, len >= buf_len))
            };
            match got {
                Some(m) => {
                    metas[n] = m;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    fn send(&mut self, pkts: &[&[u8]]) -> SendOutcome {
        if self.tx.vnet {
            return self.send_vnet(pkts);
        }
        let mut o = SendOutcome::default();
        for p in pkts {
            match sys::write_packet(self.tx.fd.as_raw_fd(), p) {
                Ok(()) => {
                    o.sent += 1;
                    o.sent_bytes += p.len();
                }
                Err(_) => o.failed += 1,
            }
        }
        o
    }
}

fn direction(rx: Dev, tx: Dev) -> DirectionFn {
    engine::direction(move || TunIo::new(rx, tx))
}

/// Creates devices `a_dev` and `b_dev` (TAP if `tap`) and starts
/// forwarding between them: A→B with `a_to_b`, B→A with `b_to_a`.
pub fn start(
    a_dev: &str,
    b_dev: &str,
    tap: bool,
    a_to_b: LinkProfile,
    b_to_a: LinkProfile,
    opts: &EngineOptions,
) -> io::Result<Emulator> {
    if a_dev == b_dev {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--a-dev and --b-dev must be two different devices",
        ));
    }
    // TUN devices carry virtio-net headers (UDP segmentation offload, see
    // [`vnet`]) unless offloads are off; TAP devices never do.
    let vnet = !tap && opts.offload;
    let open = |name: &str| -> io::Result<Dev> {
        let fd = if vnet {
            sys::tun_vnet::open(name)?
        } else {
            sys::open_tun_fd(name, tap)?
        };
        Ok(Dev {
            fd: Arc::new(fd),
            vnet,
        })
    };
    let (a, b) = (open(a_dev)?, open(b_dev)?);
    let mut emu = Emulator::new();
    let name = if tap { "tap" } else { "tun" };
    if opts.slack.is_zero() || !opts.one_thread {
        emu.add_path(
            name,
            a_dev.to_string(),
            b_dev.to_string(),
            [
                (a_to_b, direction(a.clone(), b.clone())),
                (b_to_a, direction(b, a)),
            ],
            opts,
            0,
        )?;
    } else {
        // With slack and `one_thread`, one thread serves both directions,
        // so a wake-up serves both. Why: the wake-ups were then the relay's largest
        // cost (`soya demo`'s relay, 2 Gb/s, 100 µs: two threads each woke
        // ~10,000 times a second, ~22 % of its CPU in ppoll and the
        // scheduler). Without slack each direction keeps its own thread,
        // so a release waits for no other direction's work.
        emu.add_path_one_thread(
            name,
            a_dev.to_string(),
            b_dev.to_string(),
            (
                [a_to_b, b_to_a],
                engine::both_directions(move || {
                    [TunIo::new(a.clone(), b.clone()), TunIo::new(b, a)]
                }),
            ),
            opts,
            0,
        )?;
    }
    Ok(emu)
}
