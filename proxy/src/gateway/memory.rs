//! The I/O backend in memory: a DC port and a WAN port whose packets sit
//! in queues, and a clock that a driver moves. With them the shard's own
//! turn ([`super::turn::Turn`]) runs in virtual time, with no kernel and no
//! wall clock: the differential test (tools/tests/differential.rs) checks
//! it against the simulator's driving of the same `Site`, and the pair
//! benchmark (proxy/benches/pair.rs) measures what it costs per packet.
//!
//! The ports copy a packet once where the kernel would: into the buffer
//! the site lends the DC reader (tun's `read`), out of the WAN staging
//! buffer on flush (`sendmmsg`), out of the site toward a host (tun's
//! `write`). Their buffers are recycled through a [`BufPool`], so a driver
//! that returns what it takes allocates nothing in the steady state.

use soya_proto::buffer::PacketBuf;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use super::ports::{Clock, DcPort, DcRx, TxOutcome, WanPort};
use soya_proto::time::Time;

/// Packet buffers, recycled.
#[derive(Default)]
pub struct BufPool(Vec<Vec<u8>>);

impl BufPool {
    /// An empty buffer (one given back, or a new one with room for a jumbo
    /// frame).
    pub fn take(&mut self) -> Vec<u8> {
        self.0.pop().unwrap_or_else(|| Vec::with_capacity(9216))
    }

    pub fn put(&mut self, mut v: Vec<u8>) {
        v.clear();
        self.0.push(v);
    }
}

/// The most packets one `recv_batch` call reads unless told otherwise:
/// all there are.
pub const UNBOUNDED: usize = usize::MAX;

/// A gateway's DC side: packets from its hosts waiting to be read
/// (`rx`), packets it sent to them (`tx`).
pub struct MemDc {
    pub rx: VecDeque<Vec<u8>>,
    pub tx: VecDeque<Vec<u8>>,
    pub bufs: BufPool,
    /// The most packets one `recv_batch` reads (a kernel batch is 64).
    pub batch: usize,
}

impl Default for MemDc {
    fn default() -> MemDc {
        MemDc {
            rx: VecDeque::new(),
            tx: VecDeque::new(),
            bufs: BufPool::default(),
            batch: UNBOUNDED,
        }
    }
}

impl DcPort for MemDc {
    /// As tun does: into a buffer the site lent while there is one, then
    /// into the scratch buffer.
    fn recv_batch(
        &mut self,
        buf: &mut [u8],
        lent: &mut Vec<PacketBuf>,
        mut f: impl FnMut(DcRx<'_>, Option<SocketAddr>) -> Option<IpAddr>,
    ) -> io::Result<(usize, bool)> {
        let mut n = 0;
        while n < self.batch {
            let Some(p) = self.rx.pop_front() else {
                break;
            };
            match lent.pop() {
                Some(mut v) => {
                    v.extend_from_slice(&p);
                    f(DcRx::Lent(v), None);
                }
                None => {
                    buf[..p.len()].copy_from_slice(&p);
                    f(DcRx::Borrowed(&buf[..p.len()]), None);
                }
            }
            self.bufs.put(p);
            n += 1;
        }
        Ok((n, self.rx.is_empty()))
    }

    fn send(&mut self, packet: &[u8], _dst: IpAddr) -> TxOutcome {
        let mut v = self.bufs.take();
        v.extend_from_slice(packet);
        self.tx.push_back(v);
        TxOutcome::Sent
    }

    fn flush(&mut self) {}

    fn learn(&mut self, _src: IpAddr, _from: SocketAddr) {}
}

/// A gateway's WAN side, one socket carrying every path: datagrams from
/// the twin waiting to be read (`rx`), datagrams sent (`sent`), as (path
/// index, bytes). Two gateways may share one pool (most datagrams go one
/// way).
pub struct MemWan {
    pub rx: VecDeque<(usize, Vec<u8>)>,
    pub sent: VecDeque<(usize, Vec<u8>)>,
    pub bufs: Rc<RefCell<BufPool>>,
    /// The most datagrams one `recv_batch` reads.
    pub batch: usize,
    /// (path, offset, length) in the turn's staging buffer, until flush.
    pub staged: Vec<(usize, usize, usize)>,
}

impl Default for MemWan {
    fn default() -> MemWan {
        MemWan {
            rx: VecDeque::new(),
            sent: VecDeque::new(),
            bufs: Rc::default(),
            batch: UNBOUNDED,
            staged: Vec::new(),
        }
    }
}

impl WanPort for MemWan {
    fn sockets(&self) -> usize {
        1
    }

    fn recv_batch(&mut self, _sock: usize, mut f: impl FnMut(usize, &mut [u8])) -> (usize, bool) {
        let mut n = 0;
        while n < self.batch {
            let Some((path, mut d)) = self.rx.pop_front() else {
                break;
            };
            f(path, &mut d);
            self.bufs.borrow_mut().put(d);
            n += 1;
        }
        (n, self.rx.is_empty())
    }

    fn stage(&mut self, path: usize, off: usize, len: usize) {
        self.staged.push((path, off, len));
    }

    fn flush(&mut self, buf: &[u8]) {
        for (path, off, len) in self.staged.drain(..) {
            let mut v = self.bufs.borrow_mut().take();
            v.extend_from_slice(&buf[off..off + len]);
            self.sent.push_back((path, v));
        }
    }
}

/// Virtual time, set by the driver; a wait moves it forward.
pub struct VirtualClock(pub Cell<Time>);

impl Default for VirtualClock {
    fn default() -> VirtualClock {
        VirtualClock(Cell::new(Time::ZERO))
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Time {
        self.0.get()
    }

    fn wait_until(&self, t: Time) {
        self.0.set(self.0.get().max(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_reads_at_most_its_bound_and_says_whether_more_wait() {
        let mut dc = MemDc {
            batch: 2,
            ..MemDc::default()
        };
        for k in 0..3u8 {
            dc.rx.push_back(vec![k; 4]);
        }
        let mut buf = [0u8; 16];
        let mut seen = Vec::new();
        let mut read = |dc: &mut MemDc, seen: &mut Vec<u8>| {
            dc.recv_batch(&mut buf, &mut Vec::new(), |p, _| {
                let DcRx::Borrowed(b) = p else {
                    panic!("nothing was lent")
                };
                seen.push(b[0]);
                None
            })
            .unwrap()
        };
        assert_eq!(read(&mut dc, &mut seen), (2, false));
        assert_eq!(read(&mut dc, &mut seen), (1, true));
        assert_eq!(seen, [0, 1, 2]);
        // The read packets' buffers went back to the pool.
        assert_eq!(dc.bufs.0.len(), 3);
    }

    #[test]
    fn staged_datagrams_leave_on_flush_in_order() {
        let mut wan = MemWan::default();
        let buf: Vec<u8> = (0..10).collect();
        wan.stage(1, 0, 3);
        wan.stage(0, 5, 2);
        assert!(wan.sent.is_empty());
        wan.flush(&buf);
        let sent: Vec<_> = wan.sent.iter().cloned().collect();
        assert_eq!(sent, [(1, vec![0, 1, 2]), (0, vec![5, 6])]);
    }
}
