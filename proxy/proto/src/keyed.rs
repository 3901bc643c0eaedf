//! Keyed hash tables for keys that someone outside picks.
//!
//! The engine's tables are keyed by what the data center sends (addresses,
//! QPNs), the deep buffer's and the site's by hashes of those, the WAN's
//! receive side by ids the peer picks: whoever picks the keys could pick
//! ones that all land in one bucket (hash flooding) if the hash were
//! known. So every table on the per-packet path hashes with a secret
//! 128-bit key drawn from the operating system's CSPRNG (the daemon) or the
//! simulator's seeded generator.
//!
//! The hash is foldhash (the `foldhash` crate; its fast variant is
//! hashbrown's default hasher), not SipHash-1-3 as std's maps: hashing
//! `HalfKey`s with SipHash was 12–16 % of a gateway's turns
//! (docs/benchmarks.md §4), about 60 ns per key here against 2 ns. Its
//! *quality* variant, one multiply more than the fast one: the fast one's
//! low bits, which hashbrown takes the bucket from, follow QPNs that
//! differ in a few bits too closely for some keys (215–961 distinct
//! buckets of 1,024 for 1,024 consecutive QPNs, depending on the key;
//! `nearby_keys_spread` below fails with it), the quality one spreads them
//! as a random function would (about 647). Why it resists flooding
//! here: every multiply it folds takes the input XORed with secrets derived
//! from the key (foldhash's `SharedSeed` and its per-hasher seed, both from
//! our 128 bits, none of foldhash's own weak, address-derived seeding), so
//! no set of inputs collides for every key, and keys cannot be searched
//! offline: colliding `HalfKey`s must be found against this gateway's
//! secret. foldhash claims no more than that ("minimally DoS-resistant"):
//! an attacker who could watch hash values (iteration order, fine timing)
//! might in principle recover the key. Neither leaves the gateway: no
//! table's iteration order reaches the wire except the order of halves
//! whose timers fall due at the same instant, and the tables are bounded
//! (halves expire, quotas and `max_flows` cap the rest). An unkeyed hash
//! (FxHash and the like) would be broken offline, so it is not used on
//! keys from outside (`wan::idhash` is only for ids this side allocates).
//!
//! Unlike std's `RandomState` the engine's key is given, not drawn: the
//! site draws it from its random source (the daemon: the kernel; the
//! simulator: its seeded generator). Two engines given the same key and the
//! same input then iterate their halves in the same order and emit the same
//! packets in the same order, which is what lets the differential test
//! compare the simulator with the daemon packet for packet, and a simulated
//! run repeat exactly. Tables whose iteration order decides nothing may be
//! keyed at random ([`Keyed::random`]).

use std::collections::HashMap;
use std::hash::BuildHasher;

use foldhash::quality::FoldHasher;
use foldhash::SharedSeed;

/// A 128-bit table key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HashKey(pub [u64; 2]);

impl HashKey {
    /// The tables' hasher state for this key. Deriving foldhash's shared
    /// seed costs a dozen multiplies, so it is done once per table, here,
    /// not per hash.
    pub fn state(&self) -> Keyed {
        Keyed {
            seed: self.0[1],
            shared: SharedSeed::from_u64(self.0[0]),
        }
    }
}

/// The [`BuildHasher`] of a [`KeyedMap`]: foldhash keyed by a [`HashKey`].
#[derive(Clone, Debug)]
pub struct Keyed {
    seed: u64,
    shared: SharedSeed,
}

impl Keyed {
    /// A key from the operating system's CSPRNG, for tables whose
    /// iteration order decides nothing (they are only looked up), so that
    /// a randomly keyed one cannot make a simulated run differ. Falls back
    /// to a fixed key only if the kernel has no randomness to give (then
    /// the site reports `NoNonce` and refuses to start a session anyway).
    pub fn random() -> Keyed {
        let k = |_| crate::rand::session_nonce().unwrap_or(0x9E37_79B9_7F4A_7C15);
        HashKey([k(0), k(1)]).state()
    }
}

impl Default for Keyed {
    /// [`Keyed::random`], so that `KeyedMap::default()` is never unkeyed.
    fn default() -> Keyed {
        Keyed::random()
    }
}

impl BuildHasher for Keyed {
    type Hasher = FoldHasher;

    #[inline]
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher::with_seed(self.seed, &self.shared)
    }
}

/// A table keyed with a [`HashKey`] (or [`Keyed::random`]).
pub type KeyedMap<K, V> = HashMap<K, V, Keyed>;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::qp::HalfKey;

    /// The half of 10.1.0.1's QP to 10.2.0.1's QP `i`: keys that differ
    /// only in the QPN (also `qp::timers`' tests).
    pub(crate) fn half(i: u32) -> HalfKey {
        HalfKey {
            requester: [10, 1, 0, 1].into(),
            responder: [10, 2, 0, 1].into(),
            responder_qpn: i,
        }
    }

    /// The same key gives the same hashes, hence the same iteration order
    /// (what the simulator's repeatability rests on); another key gives
    /// other hashes (the key is really used: an attacker's collisions for
    /// one key are not collisions for another).
    #[test]
    fn the_key_decides_the_hashes_and_the_order() {
        let a = HashKey([1, 2]).state();
        let b = HashKey([1, 2]).state();
        let c = HashKey([1, 3]).state();
        let d = HashKey([4, 2]).state();
        let k = half(7);
        assert_eq!(a.hash_one(k), b.hash_one(k));
        assert_ne!(a.hash_one(k), c.hash_one(k), "the per-hasher seed");
        assert_ne!(a.hash_one(k), d.hash_one(k), "the shared seed");
        let order = |s: Keyed| {
            let mut m: KeyedMap<HalfKey, u32> = KeyedMap::with_hasher(s);
            for i in 0..1000 {
                m.insert(half(i), i);
            }
            m.keys().map(|k| k.responder_qpn).collect::<Vec<_>>()
        };
        assert_eq!(
            order(HashKey([1, 2]).state()),
            order(HashKey([1, 2]).state())
        );
        assert_ne!(
            order(HashKey([1, 2]).state()),
            order(HashKey([1, 3]).state())
        );
    }

    /// Keys that differ in a few bits (consecutive QPNs, as a NIC hands
    /// them out; QPNs apart by 2^8 or 2^14; consecutive requester
    /// addresses) spread over the buckets as a random function would: of a
    /// 1,024-bucket table's indexes (the low bits, as hashbrown takes
    /// them), 1,024 such keys take about 647 distinct ones (1,024 ×
    /// (1 − 1/e)); at least 600 for each of eight table keys. foldhash's
    /// fast variant gives 215–961 here.
    #[test]
    fn nearby_keys_spread() {
        let half_from = |r: u32, q: u32| HalfKey {
            requester: std::net::IpAddr::from((0x0a01_0001 + r).to_be_bytes()),
            responder: [10, 2, 0, 1].into(),
            responder_qpn: q,
        };
        let patterns: [(&str, &dyn Fn(u32) -> HalfKey); 4] = [
            ("consecutive QPNs", &|i| half_from(0, i)),
            ("QPNs 2^8 apart", &|i| half_from(0, i << 8)),
            ("QPNs 2^14 apart", &|i| half_from(0, i << 14)),
            ("consecutive requesters", &|i| half_from(i, 7)),
        ];
        for k in 1..=8u64 {
            let s = HashKey([
                k.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                k.wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
            ])
            .state();
            for (what, f) in &patterns {
                let buckets: std::collections::HashSet<u64> =
                    (0..1024u32).map(|i| s.hash_one(f(i)) & 1023).collect();
                assert!(
                    buckets.len() >= 600,
                    "key {k}, {what}: {} distinct buckets of 1024",
                    buckets.len()
                );
            }
        }
    }
}
