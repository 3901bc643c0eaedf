//! Multipath scheduler: which path carries the next data packet.
//!
//! Earliest expected delivery: for every Up path with congestion-window room,
//! `wait for the pacer + serialization at the path's rate + srtt / 2`, divided
//! by the path's weight; the smallest wins. A fast path is used as long as its
//! queue keeps its delivery earliest; a slow path gets a packet only when that
//! packet would still arrive before the fast path could deliver it, so it
//! never holds a flow up for longer than its own latency advantage demands.
//!
//! Weight 0 marks a backup path: it gets data only while no weighted path
//! qualifies. Paths that are Down, Probing or out of window are not
//! candidates at all.

use std::time::Duration;

use crate::time::Time;

#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub index: usize,
    pub weight: u32,
    /// When the pacer would release a packet on this path.
    pub release_at: Time,
    /// When the pacer lets this path hand out its next packet.
    pub ready_at: Time,
    /// Serialization time of one packet at the path's pacing rate.
    pub tx_time: Duration,
    pub rate_bps: u64,
    pub srtt: Duration,
}

impl Candidate {
    /// A placeholder (fills unused slots of a stack buffer; never chosen).
    pub const NONE: Candidate = Candidate {
        index: usize::MAX,
        weight: 0,
        release_at: Time::ZERO,
        ready_at: Time::ZERO,
        tx_time: Duration::ZERO,
        rate_bps: 0,
        srtt: Duration::ZERO,
    };

    /// Expected one-way delivery delay from `now` of a packet sent next.
    pub fn expected_delay(&self, now: Time) -> Duration {
        self.release_at.since(now) + self.tx_time + self.srtt / 2
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Send the next packet on this path now.
    Now(usize),
    /// Wait for the best path's pacer.
    Wait(Time),
    /// No path can take data.
    Nothing,
}

/// Compares `delay_a / weight_a` with `delay_b / weight_b` without dividing.
fn weighted_cmp(now: Time, a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    let (wa, wb) = (u128::from(a.weight.max(1)), u128::from(b.weight.max(1)));
    let da = a.expected_delay(now).as_nanos() * wb;
    let db = b.expected_delay(now).as_nanos() * wa;
    da.cmp(&db).then(a.index.cmp(&b.index))
}

/// Index of the path with the earliest weighted expected delivery.
pub fn pick(now: Time, candidates: &[Candidate]) -> Option<&Candidate> {
    let weighted = candidates.iter().any(|c| c.weight > 0);
    candidates
        .iter()
        .filter(|c| !weighted || c.weight > 0)
        .min_by(|a, b| weighted_cmp(now, a, b))
}

/// Where the next data packet goes, given `backlog` bytes waiting.
///
/// The best path may be paced out for a moment. Waiting for it is right
/// unless another path, ready now, delivers no later than the best path
/// would deliver the last byte of the backlog: then the backlog drains
/// sooner over both, and nothing sent on the slower path arrives after data
/// that would have been queued behind it anyway.
pub fn choose(now: Time, candidates: &[Candidate], backlog: u64) -> Choice {
    let Some(best) = pick(now, candidates) else {
        return Choice::Nothing;
    };
    if best.ready_at <= now {
        return Choice::Now(best.index);
    }
    let drain = best.expected_delay(now) + super::path::tx_time(backlog, best.rate_bps);
    let weighted = candidates.iter().any(|c| c.weight > 0);
    candidates
        .iter()
        .filter(|c| !weighted || c.weight > 0)
        .filter(|c| c.ready_at <= now && c.expected_delay(now) <= drain)
        .min_by(|a, b| weighted_cmp(now, a, b))
        .map_or(Choice::Wait(best.ready_at), |c| Choice::Now(c.index))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(index: usize, weight: u32, wait_us: u64, srtt_ms: u64) -> Candidate {
        Candidate {
            index,
            weight,
            release_at: Time::from_micros(1000 + wait_us),
            ready_at: Time::from_micros(1000 + wait_us),
            tx_time: Duration::from_micros(1),
            rate_bps: 8_000_000_000, // 1000 B per µs
            srtt: Duration::from_millis(srtt_ms),
        }
    }

    fn pick_i(now: Time, c: &[Candidate]) -> Option<usize> {
        pick(now, c).map(|c| c.index)
    }

    #[test]
    fn earliest_delivery_wins() {
        let now = Time::from_micros(1000);
        // Fast path (3 ms) idle beats slow path (6 ms).
        assert_eq!(pick_i(now, &[c(0, 1, 0, 6), c(1, 1, 0, 3)]), Some(1));
        // Fast path's queue of 2 ms makes the slow path earlier.
        assert_eq!(pick_i(now, &[c(0, 1, 0, 6), c(1, 1, 2000, 3)]), Some(0));
        // Weight 2 halves the effective delay.
        assert_eq!(pick_i(now, &[c(0, 2, 0, 5), c(1, 1, 0, 3)]), Some(0));
        // Backup only when nothing else.
        assert_eq!(pick_i(now, &[c(0, 0, 0, 1), c(1, 1, 0, 30)]), Some(1));
        assert_eq!(pick_i(now, &[c(0, 0, 0, 1)]), Some(0));
        assert_eq!(pick_i(now, &[]), None);
    }

    #[test]
    fn slow_path_used_only_for_a_backlog() {
        let now = Time::from_micros(1000);
        // Fast path (3 ms RTT) paced out for 5 µs, slow path (6 ms) ready.
        let cands = [c(0, 1, 5, 3), c(1, 1, 0, 6)];
        // Small backlog: the fast path delivers it all before the slow path
        // would deliver one packet: wait.
        assert_eq!(
            choose(now, &cands, 100_000),
            Choice::Wait(Time::from_micros(1005))
        );
        // 2 MB backlog takes the fast path 2 ms: the slow path helps.
        assert_eq!(choose(now, &cands, 2_000_000), Choice::Now(1));
        assert_eq!(
            choose(now, &[c(0, 1, 0, 3), c(1, 1, 0, 6)], 1 << 30),
            Choice::Now(0)
        );
        assert_eq!(choose(now, &[], 1), Choice::Nothing);
    }
}
