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

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use super::engine::{self, DirectionFn, Emulator, EngineOptions, PacketIo};
use crate::sim::link::LinkProfile;
use soya::sys;
use soya::sys::batch::{RxMeta, SendOutcome};

struct TunIo {
    rx: Arc<OwnedFd>,
    tx: Arc<OwnedFd>,
}

impl PacketIo for TunIo {
    fn rx_fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    fn recv(&mut self, bufs: &mut [&mut [u8]], meta: &mut [RxMeta]) -> io::Result<usize> {
        let mut n = 0;
        while n < bufs.len().min(meta.len()) {
            let buf_len = bufs[n].len();
            match sys::read_packet(self.rx.as_raw_fd(), bufs[n])? {
                Some(len) => {
                    meta[n] = RxMeta {
                        len,
                        // A packet filling the buffer may have been cut.
                        truncated: len >= buf_len,
                        rx_real_ns: None,
                        segment: None,
                    };
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    fn send(&mut self, pkts: &[&[u8]]) -> SendOutcome {
        let mut o = SendOutcome::default();
        for p in pkts {
            match sys::write_packet(self.tx.as_raw_fd(), p) {
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

fn direction(rx: Arc<OwnedFd>, tx: Arc<OwnedFd>) -> DirectionFn {
    engine::direction(move || TunIo { rx, tx })
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
    let a = Arc::new(sys::open_tun_fd(a_dev, tap)?);
    let b = Arc::new(sys::open_tun_fd(b_dev, tap)?);
    let mut emu = Emulator::new();
    emu.add_path(
        if tap { "tap" } else { "tun" },
        a_dev.to_string(),
        b_dev.to_string(),
        [
            (a_to_b, direction(a.clone(), b.clone())),
            (b_to_a, direction(b, a)),
        ],
        opts,
        0,
    )?;
    Ok(emu)
}
