//! The `tun` backend: the gateway is the router for the remote site's
//! prefixes; it reads and writes raw IP packets on a tun device
//! (IFF_TUN | IFF_NO_PI). The device is brought up with MTU [`TUN_MTU`] and
//! a queue of [`TUN_TXQUEUELEN`] packets; routes are the operator's. What
//! the kernel drops because that queue was full is read from
//! `/proc/thread-self/net/dev` ([`DcStats::kernel_drops`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};

use soya_io::sys;
use soya_proto::buffer::PacketBuf;

use crate::gateway::ports::{DcControl, DcPort, DcRx, DcStats, TxOutcome};

/// MTU set on the tun device (jumbo: RoCE packets of a 4096-byte path MTU
/// are about 4.2 KB).
pub const TUN_MTU: u32 = 9000;
/// Queue length of the tun device: packets the kernel holds for the device
/// loop to read. The tun default (500) is less than the full windows of
/// four rxe QPs (128 unacknowledged PSNs each); a burst beyond it is
/// dropped by the kernel, and the requester goes back N. 16384 holds the
/// windows of 128 QPs; the kernel allocates packets only as they queue.
pub const TUN_TXQUEUELEN: u32 = 16_384;
/// Packets read from the tun device per batch.
const TUN_BATCH: usize = 64;

#[derive(Debug)]
pub struct Tun {
    file: File,
    name: String,
}

impl Tun {
    /// Opens (creating it if need be) and brings up tun device `interface`.
    pub fn open(interface: &str) -> io::Result<Tun> {
        Ok(Tun {
            file: sys::open_tun(interface, TUN_MTU, TUN_TXQUEUELEN)?,
            name: interface.to_string(),
        })
    }

    /// Another descriptor of the same queue (another shard writes through
    /// it).
    pub fn try_clone(&self) -> io::Result<Tun> {
        Ok(Tun {
            file: self.file.try_clone()?,
            name: self.name.clone(),
        })
    }
}

impl DcPort for Tun {
    /// Up to [`TUN_BATCH`] reads, each into a buffer the site lent when
    /// there is one.
    #[inline]
    fn recv_batch(
        &mut self,
        buf: &mut [u8],
        lent: &mut Vec<PacketBuf>,
        mut f: impl FnMut(DcRx<'_>, Option<SocketAddr>) -> Option<IpAddr>,
    ) -> io::Result<(usize, bool)> {
        let mut n = 0;
        while n < TUN_BATCH {
            // Straight into a buffer the site lent: the deep buffer
            // keeps the packet there (the kernel's copy is the
            // only one on the way in).
            let Some(mut v) = lent.pop() else {
                match self.file.read(buf) {
                    Ok(len) => {
                        n += 1;
                        f(DcRx::Borrowed(&buf[..len]), None);
                        continue;
                    }
                    Err(e) if sys::not_now(&e) => return Ok((n, true)),
                    Err(e) => return Err(e),
                }
            };
            match sys::read_packet_into(self.file.as_raw_fd(), &mut v, buf) {
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

    /// Writes the packet at once (one `write(2)`).
    // A tun write takes the whole packet or fails: there is no partial
    // write to handle (the count is the packet's length).
    #[allow(clippy::unused_io_amount)]
    #[inline]
    fn send(&mut self, packet: &[u8], _dst: IpAddr) -> TxOutcome {
        match self.file.write(packet) {
            Ok(_) => TxOutcome::Sent,
            Err(e) => {
                tracing::debug!(error = %e, "dc: write failed");
                TxOutcome::Error
            }
        }
    }

    /// Nothing is staged.
    #[inline]
    fn flush(&mut self) {}

    /// The kernel routes by IP: nothing to learn.
    fn learn(&mut self, _src: IpAddr, _from: SocketAddr) {}
}

impl DcControl for Tun {
    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn describe(&self) -> String {
        format!("tun {}", self.name)
    }

    /// Kernel drops: the device's `tx_dropped` (its queue was full).
    fn stats(&self) -> DcStats {
        DcStats {
            kernel_drops: std::fs::read_to_string("/proc/thread-self/net/dev")
                .ok()
                .and_then(|text| tun_tx_dropped(&text, &self.name))
                .unwrap_or(0),
            ..DcStats::default()
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
