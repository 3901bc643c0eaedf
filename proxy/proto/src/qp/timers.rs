//! The engine's halves with their timers: a table of halves (ingress or
//! egress) that keeps a min-heap of their deadlines, so the engine's
//! `poll_timeout` is a heap peek and its `handle_timeout` touches only the
//! halves that are due, instead of scanning every half twice per turn (with
//! 1,024 QPs the scans were 47 % of the simulator's time, and the daemon's
//! shard loop asks on every turn too).
//!
//! Invalidation is lazy and cannot be forgotten: every mutable access to a
//! half ([`Halves::get_mut`], insertion, iteration by `&mut`) marks it
//! dirty, and the next question about timers reads the dirty halves'
//! deadlines again ([`Timed::timer`] depends on the half's own state only).
//! A heap entry is live only while it equals what its half is armed with; a
//! half removed from the table (an expired idle half) leaves dead entries
//! behind, which are dropped when they reach the top.
//!
//! Halves due at one instant fire in the table's iteration order, as the
//! scans did: with a seeded table order the engine emits the same packets in
//! the same order (`crate::keyed`), so simulated runs repeat byte for byte.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::BinaryHeap;

use crate::time::Time;

use super::egress::Reinjector;
use super::half::HalfKey;
use super::ingress::PseudoAcker;
use crate::keyed::{HashKey, KeyedMap};

/// A half's earliest timer, a function of the half's own state.
pub(super) trait Timed {
    fn timer(&self) -> Option<Time>;
}

impl Timed for PseudoAcker {
    fn timer(&self) -> Option<Time> {
        self.poll_timeout()
    }
}

impl Timed for Reinjector {
    fn timer(&self) -> Option<Time> {
        self.poll_timeout()
    }
}

/// A half and its timer bookkeeping. The cells are written from `&self`
/// questions (`Halves::next_deadline`), which settle the dirty halves.
pub(super) struct Slot<V> {
    half: V,
    /// The deadline the heap holds a live entry for.
    armed: Cell<Option<Time>>,
    /// In `Timers::dirty`: its deadline may have moved since.
    dirty: Cell<bool>,
}

#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(Time, HalfKey)>>,
    dirty: Vec<HalfKey>,
    /// `take_due`'s scratch: the due keys sorted, to put them in table order.
    sorted: Vec<HalfKey>,
    /// The heap's top was found live by the last `settle`, and nothing
    /// that could kill it happened since (a half changed, removed, or an
    /// entry popped): the next `settle` with no dirty half has nothing to
    /// do. The engine asks for its deadline several times per turn, and
    /// the check is a table lookup (about 1 % of a turn at one packet per
    /// turn, docs/benchmarks.md §4).
    top_live: bool,
}

/// A table of halves keyed by [`HalfKey`], with the `HashMap` methods the
/// engine uses, and their timers.
pub(super) struct Halves<V> {
    map: KeyedMap<HalfKey, Slot<V>>,
    timers: RefCell<Timers>,
}

impl<V: Timed> Halves<V> {
    pub(super) fn with_hasher(key: HashKey) -> Halves<V> {
        Halves {
            map: KeyedMap::with_hasher(key.state()),
            timers: RefCell::new(Timers::default()),
        }
    }

    /// Marks a half whose deadline may move (it is being handed out `&mut`).
    fn touch(timers: &mut Timers, key: HalfKey, slot: &Slot<V>) {
        if !slot.dirty.get() {
            slot.dirty.set(true);
            timers.dirty.push(key);
        }
    }

    fn new_slot(half: V) -> Slot<V> {
        Slot {
            half,
            armed: Cell::new(None),
            dirty: Cell::new(false),
        }
    }

    /// Gives back what a burst of halves grew the table and its timers to
    /// (`qp::engine::expiry`, after forgetting quiet halves).
    pub(super) fn shrink(&mut self) {
        fn loose(len: usize, capacity: usize) -> bool {
            capacity > 64 && len < capacity / 4
        }
        if loose(self.map.len(), self.map.capacity()) {
            self.map.shrink_to(self.map.len() * 2);
        }
        let t = self.timers.get_mut();
        if loose(t.heap.len(), t.heap.capacity()) {
            t.heap.shrink_to(t.heap.len() * 2);
        }
        if loose(t.dirty.len(), t.dirty.capacity()) {
            t.dirty.shrink_to(t.dirty.len() * 2);
        }
    }

    // The rest of `HashMap`'s API over halves, for code that drops idle
    // halves or walks them all (each `&mut` one is marked dirty).
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    #[allow(dead_code)]
    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub(super) fn contains_key(&self, key: &HalfKey) -> bool {
        self.map.contains_key(key)
    }

    pub(super) fn get(&self, key: &HalfKey) -> Option<&V> {
        self.map.get(key).map(|s| &s.half)
    }

    pub(super) fn get_mut(&mut self, key: &HalfKey) -> Option<&mut V> {
        let s = self.map.get_mut(key)?;
        Self::touch(self.timers.get_mut(), *key, s);
        Some(&mut s.half)
    }

    /// `entry(key).or_insert_with(f)`.
    #[cfg(test)]
    pub(super) fn get_or_insert_with(&mut self, key: HalfKey, f: impl FnOnce() -> V) -> &mut V {
        self.get_or_insert_new(key, f).0
    }

    /// [`Self::get_or_insert_with`], and whether the half is new: one
    /// lookup where `contains_key` and then an insertion would take two.
    pub(super) fn get_or_insert_new(
        &mut self,
        key: HalfKey,
        f: impl FnOnce() -> V,
    ) -> (&mut V, bool) {
        let (s, new) = match self.map.entry(key) {
            Entry::Occupied(o) => (o.into_mut(), false),
            Entry::Vacant(v) => (v.insert(Self::new_slot(f())), true),
        };
        Self::touch(self.timers.get_mut(), key, s);
        (&mut s.half, new)
    }

    pub(super) fn insert(&mut self, key: HalfKey, half: V) -> Option<V> {
        let (s, old) = match self.map.entry(key) {
            Entry::Occupied(o) => {
                let s = o.into_mut();
                let old = std::mem::replace(s, Self::new_slot(half));
                (s, Some(old.half))
            }
            Entry::Vacant(v) => (v.insert(Self::new_slot(half)), None),
        };
        Self::touch(self.timers.get_mut(), key, s);
        old
    }

    /// Its heap entries die with it (a later half under the same key is
    /// armed afresh).
    pub(super) fn remove(&mut self, key: &HalfKey) -> Option<V> {
        self.timers.get_mut().top_live = false;
        self.map.remove(key).map(|s| s.half)
    }

    /// `HashMap::retain`; the halves kept may have been changed by `f`.
    #[allow(dead_code)]
    pub(super) fn retain(&mut self, mut f: impl FnMut(&HalfKey, &mut V) -> bool) {
        let timers = self.timers.get_mut();
        timers.top_live = false;
        self.map.retain(|k, s| {
            let keep = f(k, &mut s.half);
            if keep {
                Self::touch(timers, *k, s);
            }
            keep
        });
    }

    pub(super) fn drain(&mut self) -> impl Iterator<Item = (HalfKey, V)> + '_ {
        let timers = self.timers.get_mut();
        timers.heap.clear();
        timers.dirty.clear();
        timers.top_live = false;
        self.map.drain().map(|(k, s)| (k, s.half))
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &HalfKey> {
        self.map.keys()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|s| &s.half)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&HalfKey, &V)> {
        self.map.iter().map(|(k, s)| (k, &s.half))
    }

    #[allow(dead_code)]
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&HalfKey, &mut V)> {
        let timers = self.timers.get_mut();
        self.map.iter_mut().map(move |(k, s)| {
            Self::touch(timers, *k, s);
            (k, &mut s.half)
        })
    }

    #[allow(dead_code)]
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.iter_mut().map(|(_, v)| v)
    }

    /// Bytes this table takes besides what the halves hold: its slots as
    /// allocated (a hashbrown table has about 8/7 buckets per unit of
    /// capacity and a control byte each; counted as `capacity` entries of
    /// key, slot and control byte) and its timer heap, plus `each` of every
    /// half (its own heap bookkeeping).
    pub(super) fn state_bytes(&self, each: impl Fn(&V) -> usize) -> usize {
        let slot = std::mem::size_of::<(HalfKey, Slot<V>)>() + 1;
        let t = self.timers.borrow();
        self.map.capacity() * slot
            + t.heap.capacity() * std::mem::size_of::<Reverse<(Time, HalfKey)>>()
            + t.dirty.capacity() * std::mem::size_of::<HalfKey>()
            + self.map.values().map(|s| each(&s.half)).sum::<usize>()
    }

    /// Reads the deadlines of the halves changed since the last question,
    /// and drops dead entries from the top of the heap.
    fn settle(&self) {
        let mut t = self.timers.borrow_mut();
        if t.top_live && t.dirty.is_empty() {
            return;
        }
        let Timers {
            heap,
            dirty,
            top_live,
            ..
        } = &mut *t;
        for k in dirty.drain(..) {
            let Some(s) = self.map.get(&k) else { continue };
            s.dirty.set(false);
            let d = s.half.timer();
            if d != s.armed.get() {
                s.armed.set(d);
                if let Some(d) = d {
                    heap.push(Reverse((d, k)));
                }
            }
        }
        // Dead entries pile up when deadlines move early, or halves go,
        // faster than the heap's top reaches them: rebuilt from the live
        // ones past a bound (amortised: at most once per `len` pushes).
        if heap.len() > 2 * self.map.len() + 64 {
            heap.clear();
            heap.extend(
                self.map
                    .iter()
                    .filter_map(|(k, s)| s.armed.get().map(|d| Reverse((d, *k)))),
            );
        }
        while let Some(&Reverse((d, k))) = heap.peek() {
            if self.map.get(&k).is_some_and(|s| s.armed.get() == Some(d)) {
                break;
            }
            heap.pop();
        }
        *top_live = true;
    }

    /// The earliest deadline of any half.
    pub(super) fn next_deadline(&self) -> Option<Time> {
        self.settle();
        self.timers.borrow().heap.peek().map(|r| r.0 .0)
    }

    /// Fills `due` with the halves whose deadline is at or before `now`,
    /// in the table's iteration order (the order the scans fired them in).
    /// Each is disarmed and marked dirty: the caller fires it through
    /// `get_mut`, and its next deadline is read at the next question. `due`
    /// is the caller's, reused from call to call: a timeout allocates
    /// nothing in the steady state (`proxy/tests/steady_state_alloc.rs`).
    pub(super) fn take_due(&mut self, now: Time, due: &mut Vec<HalfKey>) {
        due.clear();
        self.settle();
        let timers = self.timers.get_mut();
        while let Some(&Reverse((d, k))) = timers.heap.peek() {
            if d > now {
                break;
            }
            timers.top_live = false;
            timers.heap.pop();
            if let Some(s) = self.map.get(&k).filter(|s| s.armed.get() == Some(d)) {
                s.armed.set(None);
                Self::touch(timers, k, s);
                due.push(k);
            }
        }
        if due.len() > 1 {
            // Several at once: in table order, which only a walk of the
            // table gives (rare: deadlines are per half and fine-grained).
            due.sort_unstable();
            let n = due.len();
            std::mem::swap(due, &mut timers.sorted);
            due.clear();
            for k in self.map.keys() {
                if timers.sorted.binary_search(k).is_ok() {
                    due.push(*k);
                    if due.len() == n {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::tests::half;
    use rand::{Rng, SeedableRng};

    /// A half that is only a deadline.
    struct Fake(Option<Time>);

    impl Timed for Fake {
        fn timer(&self) -> Option<Time> {
            self.0
        }
    }

    /// Random inserts, removals, deadline moves (later, earlier, off) and
    /// firings over 64 keys against a scan of the table: the next deadline
    /// and the set due (in table order) always agree with the scan.
    #[test]
    fn the_heap_agrees_with_a_scan_through_moves_and_removals() {
        let mut h: Halves<Fake> = Halves::with_hasher(HashKey([3, 4]));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let mut rnd = |n: u64| rng.random_range(0..n);
        let mut now = Time::ZERO;
        for round in 0..20_000 {
            let k = half(rnd(64) as u32);
            let at = now + std::time::Duration::from_micros(rnd(1_000));
            match rnd(6) {
                0 => {
                    h.insert(k, Fake(Some(at)));
                }
                1 => {
                    h.remove(&k);
                }
                2 => {
                    if let Some(f) = h.get_mut(&k) {
                        f.0 = None;
                    }
                }
                3 => {
                    h.get_or_insert_with(k, || Fake(None)).0 = Some(at);
                }
                4 => {
                    for (_, f) in h.iter_mut().filter(|_| rnd(8) == 0) {
                        f.0 = Some(at);
                    }
                }
                _ => {
                    // Fire what is due, as the engine does: each due
                    // half's deadline moves (here: later, or off).
                    now += std::time::Duration::from_micros(rnd(300));
                    let scan: Vec<HalfKey> = h
                        .iter()
                        .filter(|(_, f)| f.0.is_some_and(|t| t <= now))
                        .map(|(k, _)| *k)
                        .collect();
                    // A list left over from the round before: cleared first.
                    let mut due = scan.iter().rev().copied().collect();
                    h.take_due(now, &mut due);
                    assert_eq!(due, scan, "round {round}: due set and order");
                    for k in due {
                        let later = now + std::time::Duration::from_micros(rnd(2_000));
                        h.get_mut(&k).unwrap().0 = (rnd(2) == 0).then_some(later);
                    }
                }
            }
            let scan = h.values().filter_map(|f| f.0).min();
            assert_eq!(h.next_deadline(), scan, "round {round}: next deadline");
            let t = h.timers.borrow();
            assert!(t.heap.len() <= 2 * h.len() + 64 + 1, "dead entries bounded");
        }
    }
}
