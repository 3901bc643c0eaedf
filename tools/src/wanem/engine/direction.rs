//! One direction's state and its two steps (release what is due, read a
//! batch), driven by [`super::run_dirs`]: one thread may drive one
//! direction, or both of a path, so that one wake-up serves both.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use soya_io::sys;
use soya_io::sys::batch::RxMeta;
use soya_proto::time::Time;

use super::{recycle, Clock, EngineOptions, Held, PacketIo, Pool};
use crate::sim::link::LinkProfile;
use crate::wanem::impair::Impairer;
use crate::wanem::stats::{DirCounters, DirStats};

pub(super) struct Dir<'c, I: PacketIo> {
    pub io: I,
    counters: &'c DirCounters,
    imp: Impairer,
    rng: ChaCha8Rng,
    pool: Pool,
    overhead: usize,
    slot_len: usize,
    batch: usize,
    slack: Duration,
    heap: BinaryHeap<Reverse<Held>>,
    pub st: DirStats,
    armed: Vec<Box<[u8]>>,
    bufs_spare: Vec<&'static mut [u8]>,
    meta: Vec<RxMeta>,
    scratch: Vec<u8>,
    times: Vec<Time>,
    segs: Vec<(Box<[u8]>, usize)>,
    due: Vec<Held>,
    out_spare: Vec<&'static [u8]>,
    seq: u64,
    /// Longest a new packet may wait in the socket (see `run_dirs`' wait).
    pub defer: Duration,
}

impl<'c, I: PacketIo> Dir<'c, I> {
    pub fn new(
        io: I,
        profile: &LinkProfile,
        opts: &EngineOptions,
        counters: &'c DirCounters,
    ) -> Dir<'c, I> {
        let batch = opts.batch.max(1);
        let overhead = io.overhead();
        let slot_len = opts.max_datagram.max(1) + overhead;
        let defer = if io.kernel_timestamps() && profile.delay >= Duration::from_micros(200) {
            (profile.delay / 2).min(Duration::from_millis(1))
        } else {
            Duration::ZERO
        };
        Dir {
            io,
            counters,
            imp: Impairer::new(profile),
            rng: ChaCha8Rng::seed_from_u64(opts.seed),
            pool: Pool::new(slot_len, opts.max_held.max(1)),
            overhead,
            slot_len,
            batch,
            slack: opts.slack,
            heap: BinaryHeap::new(),
            st: DirStats::default(),
            armed: Vec::with_capacity(batch),
            bufs_spare: Vec::with_capacity(batch),
            meta: vec![RxMeta::default(); batch],
            scratch: Vec::new(),
            times: Vec::with_capacity(2),
            segs: Vec::with_capacity(64),
            due: Vec::with_capacity(batch),
            out_spare: Vec::with_capacity(batch),
            seq: 0,
            defer,
        }
    }

    /// The next release time, if a packet is held.
    pub fn next_release(&self) -> Option<Time> {
        self.heap.peek().map(|h| h.0.release)
    }

    /// Step 1: sends what is due (or within the slack of it); whether
    /// anything was.
    pub fn release(&mut self, clock: &Clock) -> bool {
        let horizon = clock.now() + self.slack;
        let mut any = false;
        while self.heap.peek().is_some_and(|h| h.0.release <= horizon) {
            self.due.clear();
            while self.due.len() < self.batch {
                match self.heap.peek() {
                    Some(h) if h.0.release <= horizon => self.due.push(self.heap.pop().unwrap().0),
                    _ => break,
                }
            }
            let mut out = recycle(std::mem::take(&mut self.out_spare));
            out.extend(self.due.iter().map(Held::bytes));
            let o = self.io.send(&out);
            self.out_spare = recycle(out);
            let sent_at = clock.now();
            let st = &mut self.st;
            for h in &self.due {
                let late = sent_at.since(h.release).as_nanos() as u64;
                st.late_max_ns = st.late_max_ns.max(late);
                st.late_over_50us += u64::from(late > 50_000);
            }
            any = true;
            st.forwarded += o.sent as u64;
            st.forwarded_bytes += o.sent_bytes as u64;
            st.drop_send += o.failed as u64;
            for h in self.due.drain(..) {
                self.pool.put(h.buf);
            }
        }
        any
    }

    /// Step 2: reads a batch straight into free buffers and holds each
    /// packet until its release time; how many the I/O returned.
    pub fn read(&mut self, clock: &Clock) -> usize {
        let batch = self.batch;
        let slot_len = self.slot_len;
        while self.armed.len() < batch {
            match self.pool.get() {
                Some(s) => self.armed.push(s),
                None => break,
            }
        }
        let overflow = self.armed.is_empty();
        let mut bufs = recycle(std::mem::take(&mut self.bufs_spare));
        if overflow {
            // No buffer free: read into scratch and drop, so the socket
            // keeps draining and the drops are ours to count.
            if self.scratch.is_empty() {
                self.scratch = vec![0u8; slot_len * batch];
            }
            bufs.extend(self.scratch.chunks_exact_mut(slot_len));
        } else {
            bufs.extend(self.armed.iter_mut().map(|b| &mut b[..slot_len]));
        }
        let got = self.io.recv(&mut bufs, &mut self.meta);
        self.bufs_spare = recycle(bufs);
        let n = match got {
            Ok(n) => n,
            Err(e) => {
                if e.raw_os_error() != Some(libc::ECONNREFUSED) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                0
            }
        };
        if n > 0 {
            self.hold(n, overflow, clock);
        }
        n
    }

    fn hold(&mut self, n: usize, overflow: bool, clock: &Clock) {
        let (real_now, mono_now) = (sys::real_ns(), sys::mono_ns());
        let fallback = clock.now();
        let (slot_len, overhead) = (self.slot_len, self.overhead);
        let st = &mut self.st;
        // One armed buffer per packet read (none on overflow).
        let mut filled = self.armed.drain(..if overflow { 0 } else { n });
        for (i, m) in self.meta[..n].iter().enumerate() {
            // A GRO batch holds several datagrams of `seg` bytes.
            let seg = m.segment.unwrap_or(m.len).max(1);
            let count = m.len.div_ceil(seg).max(1) as u64;
            st.received += count;
            st.received_bytes += m.len.saturating_sub(overhead) as u64;
            if overflow {
                st.drop_overflow += count;
                continue;
            }
            let first = filled.next().expect("a buffer per packet read");
            if m.truncated || seg > slot_len {
                st.drop_oversize += count;
                self.pool.put(first);
                continue;
            }
            // The first datagram is in place; the others are copied
            // out of the buffer and its landing area.
            self.segs.clear();
            let mut off = seg;
            while off < m.len {
                let l = seg.min(m.len - off);
                match self.pool.get() {
                    Some(mut d) => {
                        let land = self.io.landing(i);
                        let head = slot_len.saturating_sub(off).min(l);
                        // [off, off+head) of the first buffer, the rest
                        // from its landing area.
                        let from = off.min(slot_len);
                        d[..head].copy_from_slice(&first[from..from + head]);
                        if l > head {
                            d[head..l]
                                .copy_from_slice(&land[off + head - slot_len..off + l - slot_len]);
                        }
                        self.segs.push((d, l));
                    }
                    None => st.drop_overflow += 1,
                }
                off += l;
            }
            let at = m
                .rx_real_ns
                .map(|r| clock.at_realtime(r, real_now, mono_now))
                .unwrap_or(fallback);
            let first_len = seg.min(m.len);
            for (buf, len) in std::iter::once((first, first_len)).chain(self.segs.drain(..)) {
                let times = &mut self.times;
                match self
                    .imp
                    .transmit(at, len.saturating_sub(overhead), &mut self.rng, times)
                {
                    Err(r) => {
                        st.count_drop(r);
                        self.pool.put(buf);
                    }
                    Ok(()) if times.is_empty() => self.pool.put(buf),
                    Ok(()) => {
                        // Release k gets sequence number base + 1 + k;
                        // a duplicate (k >= 1) gets its own copy.
                        let base = self.seq;
                        for (k, &release) in times.iter().enumerate().skip(1) {
                            match self.pool.get() {
                                Some(mut d) => {
                                    d[..len].copy_from_slice(&buf[..len]);
                                    self.heap.push(Reverse(Held {
                                        release,
                                        seq: base + 1 + k as u64,
                                        buf: d,
                                        len: len as u32,
                                    }));
                                }
                                None => st.drop_overflow += 1,
                            }
                        }
                        self.heap.push(Reverse(Held {
                            release: times[0],
                            seq: base + 1,
                            buf,
                            len: len as u32,
                        }));
                        self.seq = base + times.len() as u64;
                    }
                }
            }
        }
    }

    /// Step 3: publishes the counters.
    pub fn publish(&mut self, clock: &Clock) {
        let st = &mut self.st;
        st.held = self.heap.len() as u64;
        st.held_max = st.held_max.max(st.held);
        st.queue_bytes = self.imp.queue_bytes(clock.now());
        st.drop_kernel = self.io.kernel_drops();
        st.duplicated = self.imp.duplicated();
        st.reordered = self.imp.reordered();
        self.counters.publish(st);
    }

    /// At the end: whatever is still held is discarded with the engine.
    pub fn finish(&mut self) {
        self.st.held = self.heap.len() as u64;
        self.counters.publish(&self.st);
    }
}
