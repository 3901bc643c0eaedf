//! 24-bit packet sequence numbers.
//!
//! A PSN lives in a ring of 2^24 values, so "before" and "after" only make
//! sense for PSNs less than half the ring (2^23) apart. The comparison is the
//! one rxe uses (`psn_compare` in rxe_verbs.h): shift the 24-bit difference
//! into the top of an `i32` and read its sign. Deliberately no `Ord` impl: a
//! modular order is not transitive, and sorting PSNs with it would be a bug.

use std::cmp::Ordering;
use std::fmt;

/// A packet sequence number (24 bits, wraps at 2^24).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// Mask of the 24 significant bits.
    pub const MASK: u32 = Self::MODULUS - 1;

    /// A PSN from the low 24 bits of `v` (higher bits are dropped, as on the wire).
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[allow(clippy::should_implement_trait)]
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n` modulo 2^24.
    #[allow(clippy::should_implement_trait)]
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The next PSN.
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed distance `self - other` in (-2^23, 2^23], as rxe's `psn_compare`.
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0)) << 8) as i32 >> 8
    }

    /// Modular comparison: `Less` when `self` comes before `other`.
    pub fn cmp_mod(self, other: Psn) -> Ordering {
        self.diff(other).cmp(&0)
    }

    /// `self` comes strictly before `other`.
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// `self` comes strictly after `other`.
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// `self` lies in the inclusive range `[lo, hi]` (empty when `hi` comes
    /// before `lo`).
    pub const fn in_range(self, lo: Psn, hi: Psn) -> bool {
        !hi.before(lo) && self.in_window(lo, hi.diff(lo) as u32 + 1)
    }

    /// `self` lies in the half-open window `[start, start + len)`.
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        self.0.wrapping_sub(start.0) & Self::MASK < len
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_at_24_bits() {
        let top = Psn::new(Psn::MASK);
        assert_eq!(top.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert_eq!(Psn::new(0x1_000_005).value(), 5);
        assert!(top.before(Psn::new(3)));
        assert!(Psn::new(3).after(top));
        assert_eq!(Psn::new(3).diff(top), 4);
        assert_eq!(top.diff(Psn::new(3)), -4);
    }

    #[test]
    fn half_ring_boundary() {
        // 2^23 apart is the ambiguous point; rxe's arithmetic calls it "before".
        let a = Psn::new(0);
        let b = Psn::new(1 << 23);
        assert_eq!(b.diff(a), -(1 << 23));
        assert!(Psn::new((1 << 23) - 1).after(a));
    }

    #[test]
    fn window_membership_across_wrap() {
        let start = Psn::new(Psn::MASK - 1);
        assert!(start.in_window(start, 4));
        assert!(Psn::new(1).in_window(start, 4));
        assert!(!Psn::new(2).in_window(start, 4));
        assert!(!Psn::new(Psn::MASK - 2).in_window(start, 4));
        assert!(Psn::new(0).in_range(start, Psn::new(1)));
        assert!(!Psn::new(2).in_range(start, Psn::new(1)));
        assert!(
            !Psn::new(5).in_range(Psn::new(6), Psn::new(4)),
            "empty range"
        );
    }

    proptest! {
        #[test]
        fn add_then_diff(a in 0u32..Psn::MODULUS, n in 0u32..(1 << 23)) {
            let p = Psn::new(a);
            let q = p.add(n);
            prop_assert_eq!(q.diff(p), n as i32);
            prop_assert_eq!(p.diff(q), -(n as i32));
            prop_assert_eq!(q.sub(n), p);
            if n > 0 {
                prop_assert!(p.before(q));
                prop_assert!(q.after(p));
                prop_assert_eq!(p.cmp_mod(q), Ordering::Less);
            }
            prop_assert!(q.in_window(p, n + 1));
        }

        #[test]
        fn order_is_antisymmetric(a in 0u32..Psn::MODULUS, b in 0u32..Psn::MODULUS) {
            let (p, q) = (Psn::new(a), Psn::new(b));
            if p.diff(q).unsigned_abs() != 1 << 23 {
                prop_assert_eq!(p.cmp_mod(q), q.cmp_mod(p).reverse());
            }
        }
    }
}
