//! A cheap hasher for tables keyed by flow ids this side allocates.
//!
//! The send side looks a flow up several times per message (room, push,
//! each fragment written, each fragment acknowledged). Its wire ids are
//! sequential numbers this side hands out (`SendFlows::next_id`), which
//! nobody outside picks, so a fixed mix suffices: MurmurHash3's 64-bit
//! finalizer, a bijection whose every output bit depends on every input
//! bit (hashbrown takes its bucket index from the low bits and its tag from
//! the top 7). Being fixed, it also keeps the order `SendFlows` walks its
//! flows in the same from run to run.
//!
//! Tables keyed by anything someone else picks (the peer's ids, the site's
//! hashes of what the data center sends) are keyed: `crate::keyed`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by locally chosen `u64` ids.
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write_u64(&mut self, v: u64) {
        let mut x = v;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 33;
        self.0 = x;
    }

    /// Only `u64` keys are meant; anything else is folded in bytewise
    /// (correct, merely slower).
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn mixes_low_and_high_bits() {
        let h = |v: u64| BuildHasherDefault::<IdHasher>::default().hash_one(v);
        // Ids that differ only in their top bits land in different buckets.
        let low: std::collections::HashSet<u64> = (0..1024u64).map(|i| h(i << 54) & 1023).collect();
        assert!(low.len() > 600, "{} distinct low-bit buckets", low.len());
        let mut m: IdMap<u32> = IdMap::default();
        for i in 0..1000u64 {
            m.insert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), i as u32);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m[&7u64.wrapping_mul(0x9E37_79B9_7F4A_7C15)], 7);
    }
}
