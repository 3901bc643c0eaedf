//! A preallocated slab of fixed-size packet slots.
//!
//! One allocation at start-up (lazily backed by the OS, so a multi-gigabyte
//! buffer costs only what is touched); a free list of slot indices; no
//! allocation per packet. A [`SlotHandle`] is 4 bytes, cheap to pass through
//! rings between stages.

use thiserror::Error;

/// Largest slot: a slot's length is held in 16 bits.
pub const MAX_SLOT_BYTES: usize = u16::MAX as usize;
/// Most slots: a [`SlotHandle`] is 32 bits.
pub const MAX_SLOTS: usize = u32::MAX as usize;

/// A slab that cannot be built as asked (never silently shrunk).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum SlabError {
    #[error("slot size {0} bytes is above the largest a slot can hold ({MAX_SLOT_BYTES} bytes)")]
    SlotTooLarge(usize),
    #[error("slot size must be at least 1 byte")]
    EmptySlot,
    #[error("{0} slots is more than a slot handle can address ({MAX_SLOTS})")]
    TooManySlots(usize),
}

/// Index of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotHandle(u32);

impl SlotHandle {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

pub struct PacketSlab {
    data: Vec<u8>,
    slot_bytes: usize,
    lens: Vec<u16>,
    free: Vec<u32>,
    in_use: Vec<bool>,
    high_water: usize,
}

impl PacketSlab {
    /// `slots` slots of `slot_bytes` each.
    ///
    /// # Panics
    ///
    /// If [`Self::try_new`] refuses the sizes (the site configuration
    /// refuses such a `buffer.slot_bytes` long before: 1024..=16384).
    pub fn new(slots: usize, slot_bytes: usize) -> PacketSlab {
        match PacketSlab::try_new(slots, slot_bytes) {
            Ok(s) => s,
            Err(e) => panic!("packet slab: {e}"),
        }
    }

    /// `slots` slots of `slot_bytes` (1..=[`MAX_SLOT_BYTES`]) each, at most
    /// [`MAX_SLOTS`] of them.
    pub fn try_new(slots: usize, slot_bytes: usize) -> Result<PacketSlab, SlabError> {
        if slot_bytes > MAX_SLOT_BYTES {
            return Err(SlabError::SlotTooLarge(slot_bytes));
        }
        if slot_bytes == 0 {
            return Err(SlabError::EmptySlot);
        }
        if slots > MAX_SLOTS {
            return Err(SlabError::TooManySlots(slots));
        }
        Ok(PacketSlab {
            data: vec![0; slots * slot_bytes],
            slot_bytes,
            lens: vec![0; slots],
            // Pop from the end: hand out low indices first (warm pages).
            free: (0..slots as u32).rev().collect(),
            in_use: vec![false; slots],
            high_water: 0,
        })
    }

    /// Copies `bytes` into a free slot; `None` when full or too large.
    pub fn alloc(&mut self, bytes: &[u8]) -> Option<SlotHandle> {
        if bytes.len() > self.slot_bytes {
            return None;
        }
        let i = self.free.pop()? as usize;
        let at = i * self.slot_bytes;
        if !bytes.is_empty() {
            crate::copies::note(bytes.len());
            self.data[at..at + bytes.len()].copy_from_slice(bytes);
        }
        self.lens[i] = bytes.len() as u16;
        self.in_use[i] = true;
        self.high_water = self.high_water.max(self.used_slots());
        Some(SlotHandle(i as u32))
    }

    /// Returns a slot to the free list. Freeing a free slot is a bug in the
    /// caller; it is ignored (debug builds assert) rather than corrupting the list.
    pub fn free(&mut self, h: SlotHandle) {
        let i = h.index();
        debug_assert!(self.in_use[i], "double free of slot {i}");
        if std::mem::replace(&mut self.in_use[i], false) {
            self.free.push(i as u32);
        }
    }

    pub fn get(&self, h: SlotHandle) -> &[u8] {
        let i = h.index();
        let at = i * self.slot_bytes;
        &self.data[at..at + self.lens[i] as usize]
    }

    pub fn get_mut(&mut self, h: SlotHandle) -> &mut [u8] {
        let i = h.index();
        let at = i * self.slot_bytes;
        &mut self.data[at..at + self.lens[i] as usize]
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }
    pub fn capacity(&self) -> usize {
        self.lens.len()
    }
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }
    pub fn used_slots(&self) -> usize {
        self.capacity() - self.free.len()
    }
    pub fn high_water(&self) -> usize {
        self.high_water
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_get_free_cycle() {
        let mut s = PacketSlab::new(2, 8);
        let a = s.alloc(b"abc").unwrap();
        let b = s.alloc(b"12345678").unwrap();
        assert!(s.alloc(b"x").is_none());
        assert!(s.alloc(b"123456789").is_none() || s.free_slots() == 0);
        assert_eq!(s.get(a), b"abc");
        assert_eq!(s.get(b), b"12345678");
        s.get_mut(a)[0] = b'X';
        assert_eq!(s.get(a), b"Xbc");
        s.free(a);
        assert_eq!(s.free_slots(), 1);
        let c = s.alloc(b"zz").unwrap();
        assert_eq!(s.get(c), b"zz");
        assert_eq!(s.high_water(), 2);
    }

    #[test]
    fn sizes_are_checked_not_capped() {
        assert_eq!(
            PacketSlab::try_new(4, MAX_SLOT_BYTES).map(|s| s.slot_bytes()),
            Ok(65_535)
        );
        assert_eq!(
            PacketSlab::try_new(4, 65_536).err(),
            Some(SlabError::SlotTooLarge(65_536))
        );
        assert_eq!(PacketSlab::try_new(4, 0).err(), Some(SlabError::EmptySlot));
        assert_eq!(
            SlabError::SlotTooLarge(70_000).to_string(),
            "slot size 70000 bytes is above the largest a slot can hold (65535 bytes)"
        );
        if usize::BITS > 32 {
            assert_eq!(
                PacketSlab::try_new(MAX_SLOTS + 1, 8).err(),
                Some(SlabError::TooManySlots(MAX_SLOTS + 1))
            );
        }
    }

    #[test]
    #[should_panic(expected = "packet slab: slot size 100000 bytes is above")]
    fn new_refuses_a_slot_too_large() {
        PacketSlab::new(1, 100_000);
    }
}
