//! Live counters: each worker publishes its own counters (one writer per
//! direction, relaxed atomics); anyone can take a [`DirStats`] snapshot.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use super::impair::DropReason;

macro_rules! counters {
    ($( $(#[$fm:meta])* $f:ident ),* $(,)?) => {
        /// Counters of one direction of one path.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct DirStats { $( $(#[$fm])* pub $f: u64, )* }

        /// The shared, atomically published form of [`DirStats`].
        #[derive(Debug, Default)]
        pub struct DirCounters { $($f: AtomicU64,)* }

        impl DirCounters {
            pub fn publish(&self, s: &DirStats) {
                $( self.$f.store(s.$f, Relaxed); )*
            }
            pub fn snapshot(&self) -> DirStats {
                DirStats { $($f: self.$f.load(Relaxed),)* }
            }
        }
    };
}

counters!(
    /// Datagrams read from the ingress side.
    received,
    received_bytes,
    /// Datagrams written to the egress side (duplicates included).
    forwarded,
    forwarded_bytes,
    drop_loss,
    drop_burst,
    drop_queue,
    drop_down,
    drop_overflow,
    /// Longer than `max_datagram`.
    drop_oversize,
    /// The egress refused it (e.g. nobody listening), or no client yet
    /// to send a reply to.
    drop_send,
    /// Dropped by the kernel before we could read them (socket buffer
    /// full), as the kernel counts them: a GSO batch counts once.
    drop_kernel,
    duplicated,
    reordered,
    /// Gauge: packets held (in flight in the emulated link).
    held,
    /// Gauge: bytes in the emulated bottleneck queue.
    queue_bytes,
    /// High-water mark of `held`.
    held_max,
    /// Packets sent more than 50 µs after their release time.
    late_over_50us,
    /// Largest lateness of a send, ns.
    late_max_ns,
    /// Times the thread left SCHED_FIFO because it was busy > 80 % of the
    /// time (the engine is near its capacity).
    rt_demotions,
    /// Waits that ended (a timer or an arrival): each costs a context
    /// switch, which `--slack-us` moderates.
    wakeups,
    /// Of those, sleeps of `--slack-us` after a wake-up that found work,
    /// to serve what gathers meanwhile together (never while idle).
    moderated,
);

impl DirStats {
    pub fn count_drop(&mut self, r: DropReason) {
        match r {
            DropReason::Loss => self.drop_loss += 1,
            DropReason::Burst => self.drop_burst += 1,
            DropReason::Queue => self.drop_queue += 1,
            DropReason::Down => self.drop_down += 1,
            DropReason::Overflow => self.drop_overflow += 1,
        }
    }

    pub fn dropped(&self) -> u64 {
        self.drop_loss
            + self.drop_burst
            + self.drop_queue
            + self.drop_down
            + self.drop_overflow
            + self.drop_oversize
            + self.drop_send
    }

    /// One human line; rates over `secs` relative to `prev`.
    pub fn line(&self, prev: &DirStats, secs: f64) -> String {
        let pps = (self.forwarded - prev.forwarded) as f64 / secs;
        let gbps = (self.forwarded_bytes - prev.forwarded_bytes) as f64 * 8.0 / secs / 1e9;
        let mut s = format!(
            "fwd {} ({:.0} pkt/s, {:.3} Gb/s) drop {}",
            self.forwarded,
            pps,
            gbps,
            self.dropped()
        );
        let reasons = [
            ("loss", self.drop_loss),
            ("burst", self.drop_burst),
            ("queue", self.drop_queue),
            ("down", self.drop_down),
            ("overflow", self.drop_overflow),
            ("oversize", self.drop_oversize),
            ("send", self.drop_send),
        ];
        let named: Vec<String> = reasons
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        if !named.is_empty() {
            let _ = write!(s, " [{}]", named.join(", "));
        }
        if self.drop_kernel > 0 {
            let _ = write!(s, " kernel-drop {}", self.drop_kernel);
        }
        let _ = write!(s, " held {} queue {} B", self.held, self.queue_bytes);
        if self.late_over_50us > 0 {
            let _ = write!(
                s,
                " late>50us {} (max {} us)",
                self.late_over_50us,
                self.late_max_ns / 1000
            );
        }
        s
    }
}
