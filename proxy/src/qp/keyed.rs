//! The engine's tables are keyed by what the data center sends (addresses,
//! QPNs), so they hash with a secret key (SipHash-1-3, as std's own maps)
//! against hash flooding; but unlike std's `RandomState` the key is given,
//! not drawn: the site draws it from its random source (the daemon: the
//! kernel; the simulator: its seeded generator). Two engines given the same
//! key and the same input then iterate their halves in the same order and
//! emit the same packets in the same order, which is what lets the
//! differential test compare the simulator with the daemon packet for
//! packet, and a simulated run repeat exactly.

use std::collections::HashMap;
use std::hash::BuildHasher;

use siphasher::sip::SipHasher13;

/// A SipHash-1-3 key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HashKey(pub [u64; 2]);

impl BuildHasher for HashKey {
    type Hasher = SipHasher13;

    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0[0], self.0[1])
    }
}

/// A table keyed with a [`HashKey`].
pub type KeyedMap<K, V> = HashMap<K, V, HashKey>;
