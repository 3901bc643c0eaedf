//! The receiver's memory of closed flow ids, as disjoint ranges.
//!
//! Ids are allocated sequentially by the sender and mostly retire in the
//! order they were opened, so a closed id usually extends the range before
//! it (no allocation) and the set holds about as many ranges as there are
//! long-lived flows interleaved with short ones.

use std::collections::BTreeMap;

/// A set of `u64` ids kept as inclusive, disjoint, non-adjacent ranges.
#[derive(Default)]
pub struct IdRanges {
    /// start → end (inclusive).
    ranges: BTreeMap<u64, u64>,
}

impl IdRanges {
    pub fn contains(&self, id: u64) -> bool {
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &end)| end >= id)
    }

    /// Ranges held (what the memory bound counts).
    pub fn ranges(&self) -> usize {
        self.ranges.len()
    }

    /// Adds `id`. `false` (and the set unchanged) if that would take more
    /// than `max_ranges` ranges.
    pub fn insert(&mut self, id: u64, max_ranges: usize) -> bool {
        let before = self.ranges.range(..=id).next_back().map(|(&s, &e)| (s, e));
        if before.is_some_and(|(_, e)| e >= id) {
            return true;
        }
        let joins_before = before.filter(|&(_, e)| e + 1 == id).map(|(s, _)| s);
        let after = id
            .checked_add(1)
            .and_then(|n| self.ranges.get(&n).map(|&e| (n, e)));
        match (joins_before, after) {
            (Some(s), Some((n, e))) => {
                self.ranges.remove(&n);
                self.ranges.insert(s, e);
            }
            (Some(s), None) => {
                self.ranges.insert(s, id);
            }
            (None, Some((n, e))) => {
                self.ranges.remove(&n);
                self.ranges.insert(id, e);
            }
            (None, None) => {
                if self.ranges.len() >= max_ranges {
                    return false;
                }
                self.ranges.insert(id, id);
            }
        }
        true
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_neighbours_and_respects_the_bound() {
        let mut s = IdRanges::default();
        for id in [1, 2, 3, 7, 5] {
            assert!(s.insert(id, 8));
        }
        assert_eq!(s.ranges(), 3, "[1,3] [5] [7]");
        assert!(s.insert(6, 8));
        assert_eq!(s.ranges(), 2, "[1,3] [5,7]");
        assert!(s.insert(4, 8));
        assert_eq!(s.ranges(), 1, "[1,7]");
        assert!((1..=7).all(|i| s.contains(i)));
        assert!(!s.contains(0) && !s.contains(8));
        assert!(s.insert(3, 1), "already in: no new range");
        assert!(s.insert(8, 1), "extends the range");
        assert!(!s.insert(10, 1), "a second range is over the bound");
        assert!(!s.contains(10));
        assert!(s.insert(u64::MAX, 2));
        assert!(s.contains(u64::MAX));
        // Sequential ids closing in order stay one range.
        let mut s = IdRanges::default();
        for id in 1..100_000 {
            assert!(s.insert(id, 1));
        }
        assert_eq!(s.ranges(), 1);
    }
}
