//! [`PacketBuf`]: the bytes of one packet, wherever they live.
//!
//! The engine, the WAN transport and the site hold and move packets as
//! `PacketBuf`s. Most are heap vectors (from a [`PacketPool`]); some are a
//! run of bytes *lent* by an I/O backend (the AF_XDP backend's UMEM), so
//! that a packet can stay where the kernel put it, or where it will be sent
//! from, instead of being copied in or out (issue 16: at most one user-space
//! copy per packet per gateway).
//!
//! No raw pointers here (this crate forbids them). A lent run reaches a buffer as
//! a `&'static mut [u8]` inside a [`Lease`]: exclusive, initialised memory
//! by its type, so every access is plain safe slicing. Making that
//! reference out of raw memory (UMEM) is the I/O crate's part, and its
//! soundness argument is written there (soya-io's `xdp::lend`,
//! `xdp::tape`): the lender keeps the memory mapped while any lease names
//! it. A lent buffer goes back to its lender when dropped, through the
//! small [`Lender`] trait (as a [`LenderRef`]), lease and all: the lender
//! keeps the boxed lease to lend again, so lending allocates nothing in
//! steady state, and the sans-IO core never learns what the memory is.
//!
//! A lent buffer has a fixed capacity. Growing it past that moves its bytes
//! to the heap (a copy, counted by [`crate::copies::note`]) and returns the
//! lent run at once: never undefined behaviour, never lost data.
//!
//! The API is the part of `Vec<u8>`'s that the code needs, so that the
//! change from `Vec<u8>` was mechanical (tests build theirs with `.into()`).
//!
//! [`PacketPool`]: super::PacketPool

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// Someone who lends runs of bytes to [`PacketBuf`]s and takes them back.
///
/// `give_back` is called exactly once per lent buffer, with its [`Lease`]
/// (still naming the run, see [`Lease::addr`]), when the buffer is dropped
/// (or moved to the heap). It may be called from whichever thread dropped
/// the buffer. A lender keeps the box to lend again (no allocation), after
/// [`Lease::clear`] if the run's memory may go away before the lease does.
pub trait Lender: Send + Sync {
    fn give_back(&self, lease: Box<Lease>);

    /// Whether someone still reads the run of `lease` without the buffer
    /// knowing (an AF_XDP TX descriptor naming it): its bytes must not be
    /// rewritten in place until that is over (see
    /// [`PacketBuf::make_writable`]).
    fn in_flight(&self, _lease: &Lease) -> bool {
        false
    }
}

/// A [`Lender`] as lent buffers refer to it.
#[derive(Clone)]
pub struct LenderRef(Arc<dyn Lender>);

impl LenderRef {
    pub fn new(lender: Box<dyn Lender>) -> LenderRef {
        LenderRef(Arc::from(lender))
    }
}

impl<L: Lender + ?Sized> Lender for Arc<L> {
    fn give_back(&self, lease: Box<Lease>) {
        (**self).give_back(lease)
    }
    fn in_flight(&self, lease: &Lease) -> bool {
        (**self).in_flight(lease)
    }
}

/// One run of lent bytes, as a lender hands it to [`PacketBuf::lent`] and
/// gets it back in [`Lender::give_back`]. Boxed, so that a lent
/// `PacketBuf` stays three words (see [`PacketBuf`]); the lender recycles
/// the boxes.
pub struct Lease {
    /// The run: its length is the buffer's capacity.
    run: &'static mut [u8],
    /// Set while a buffer holds the lease (so that a lender keeping its
    /// idle leases does not keep itself alive through them).
    lender: Option<LenderRef>,
}

impl Lease {
    /// A lease of `run` (allocates the box: lenders make them up front or
    /// keep the ones given back).
    pub fn new(run: &'static mut [u8]) -> Box<Lease> {
        Box::new(Lease { run, lender: None })
    }

    /// Makes the lease name `run` instead (forgetting the one it named).
    pub fn set_run(&mut self, run: &'static mut [u8]) {
        self.run = run;
    }

    /// Forgets the run: the lease names no memory.
    #[inline]
    pub fn clear(&mut self) {
        self.run = Default::default();
    }

    /// The run, leaving the lease naming none.
    pub fn take_run(&mut self) -> &'static mut [u8] {
        std::mem::take(&mut self.run)
    }

    /// The address of the run's first byte (for its lender to recognise it).
    pub fn addr(&self) -> usize {
        self.run.as_ptr() as usize
    }

    /// Bytes in the run.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.run.len()
    }
}

/// A packet's bytes: a heap vector or a run lent by a [`Lender`].
///
/// Three words, as a `Vec<u8>` is (a lent buffer: its boxed lease and its
/// length, beside the vector's niche): the engine's and the transport's
/// per-packet tables hold one each, and their size is part of the per-QP
/// state the simulator reports (`state_bytes_per_qp`); a wider buffer would
/// grow it by a third.
pub struct PacketBuf(Bytes);

enum Bytes {
    Heap(Vec<u8>),
    /// The first `len` bytes of the lease's run are the packet.
    Lent {
        lease: Box<Lease>,
        len: u32,
    },
}

impl Drop for PacketBuf {
    #[inline]
    fn drop(&mut self) {
        if let Bytes::Lent { mut lease, .. } =
            std::mem::replace(&mut self.0, Bytes::Heap(Vec::new()))
        {
            if let Some(lender) = lease.lender.take() {
                lender.0.give_back(lease);
            }
        }
    }
}

impl PacketBuf {
    /// An empty heap buffer (allocates nothing).
    #[inline]
    pub const fn new() -> PacketBuf {
        PacketBuf(Bytes::Heap(Vec::new()))
    }

    /// An empty heap buffer with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> PacketBuf {
        Vec::with_capacity(cap).into()
    }

    /// A buffer over `lease`'s run whose first `len` bytes are the packet
    /// (0: an empty buffer to write into; a backend that received a packet
    /// in place lends it whole), given back to `lender` when dropped.
    ///
    /// # Panics
    /// When `len` is past the run, or the run is 4 GiB or more.
    pub fn lent(mut lease: Box<Lease>, len: usize, lender: &LenderRef) -> PacketBuf {
        assert!(
            len <= lease.capacity() && u32::try_from(lease.capacity()).is_ok(),
            "a lent packet fits its run, and a run is less than 4 GiB"
        );
        lease.lender = Some(lender.clone());
        PacketBuf(Bytes::Lent {
            lease,
            len: len as u32,
        })
    }

    /// Before rewriting bytes already handed to an I/O backend (the
    /// egress sets AckReq on a held request it resends): a lent run the
    /// backend may still be reading is left to it and the bytes move to
    /// the heap (a copy, counted; `true`). Writing in place instead would
    /// race with the NIC or the kernel sending the previous version.
    pub fn make_writable(&mut self) -> bool {
        let busy = match &self.0 {
            Bytes::Lent { lease, .. } => {
                lease.lender.as_ref().is_some_and(|l| l.0.in_flight(lease))
            }
            Bytes::Heap(_) => false,
        };
        if busy {
            crate::copies::note(self.len());
            *self = self.as_slice().to_vec().into();
        }
        busy
    }

    /// Whether the bytes are lent (not on the heap).
    #[inline]
    pub fn is_lent(&self) -> bool {
        matches!(self.0, Bytes::Lent { .. })
    }

    #[inline]
    pub fn len(&self) -> usize {
        match &self.0 {
            Bytes::Heap(v) => v.len(),
            Bytes::Lent { len, .. } => *len as usize,
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        match &self.0 {
            Bytes::Heap(v) => v.capacity(),
            Bytes::Lent { lease, .. } => lease.capacity(),
        }
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    #[inline]
    pub fn truncate(&mut self, new_len: usize) {
        match &mut self.0 {
            Bytes::Heap(v) => v.truncate(new_len),
            Bytes::Lent { len, .. } => {
                if new_len < *len as usize {
                    *len = new_len as u32;
                }
            }
        }
    }

    /// Makes room for `extra` more bytes. A lent buffer too small moves its
    /// bytes to the heap (counted as a copy) and goes back to its lender.
    pub fn reserve(&mut self, extra: usize) {
        match &mut self.0 {
            Bytes::Heap(v) => v.reserve(extra),
            Bytes::Lent { lease, len } => {
                let len = *len as usize;
                if lease.capacity() - len < extra {
                    let mut v = Vec::with_capacity(len + extra);
                    crate::copies::note(len);
                    v.extend_from_slice(&lease.run[..len]);
                    // Gives the run back, and `self` becomes the heap buffer.
                    *self = v.into();
                }
            }
        }
    }

    #[inline]
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        if let Bytes::Heap(v) = &mut self.0 {
            return v.extend_from_slice(bytes);
        }
        self.reserve(bytes.len());
        match &mut self.0 {
            Bytes::Heap(v) => v.extend_from_slice(bytes),
            Bytes::Lent { lease, len } => {
                let at = *len as usize;
                lease.run[at..at + bytes.len()].copy_from_slice(bytes);
                *len += bytes.len() as u32;
            }
        }
    }

    #[inline]
    pub fn push(&mut self, b: u8) {
        match &mut self.0 {
            Bytes::Heap(v) => v.push(b),
            Bytes::Lent { .. } => self.extend_from_slice(&[b]),
        }
    }

    /// Resizes to `len` bytes, new ones set to `value`.
    pub fn resize(&mut self, new_len: usize, value: u8) {
        let cur = self.len();
        if new_len <= cur {
            self.truncate(new_len);
            return;
        }
        self.reserve(new_len - cur);
        match &mut self.0 {
            Bytes::Heap(v) => v.resize(new_len, value),
            Bytes::Lent { lease, len } => {
                lease.run[cur..new_len].fill(value);
                *len = new_len as u32;
            }
        }
    }

    /// Forgets the first `n` bytes (at most all of them), moving the rest
    /// to the front: a copy (counted). For a message reassembled with its
    /// header in the wrong place (see `wan::flow::recv`), which is rare.
    pub fn remove_front(&mut self, n: usize) {
        let n = n.min(self.len());
        if n == 0 {
            return;
        }
        let len = self.len();
        crate::copies::note(len - n);
        self.as_mut_slice().copy_within(n.., 0);
        self.truncate(len - n);
    }

    /// Puts `bytes` before the bytes this buffer holds, moving them up: a
    /// copy (counted), the rare converse of [`remove_front`](Self::remove_front).
    pub fn insert_front(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let len = self.len();
        crate::copies::note(len);
        self.resize(len + bytes.len(), 0);
        let s = self.as_mut_slice();
        s.copy_within(..len, bytes.len());
        s[..bytes.len()].copy_from_slice(bytes);
    }

    /// A heap buffer's vector, for an I/O backend to read a packet into
    /// its spare capacity (soya-io's `sys::read_packet_into`); `None` for a
    /// lent buffer (see [`lent_spare_mut`](Self::lent_spare_mut)).
    pub fn heap_vec_mut(&mut self) -> Option<&mut Vec<u8>> {
        match &mut self.0 {
            Bytes::Heap(v) => Some(v),
            Bytes::Lent { .. } => None,
        }
    }

    /// A lent buffer's room after its bytes (initialised memory: whatever
    /// the run held), to read a packet into; [`commit_lent`](Self::commit_lent)
    /// then counts what was written. `None` for a heap buffer.
    pub fn lent_spare_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.0 {
            Bytes::Heap(_) => None,
            Bytes::Lent { lease, len } => Some(&mut lease.run[*len as usize..]),
        }
    }

    /// Takes the first `n` bytes of [`lent_spare_mut`](Self::lent_spare_mut)
    /// into the packet.
    ///
    /// # Panics
    /// For a heap buffer, or when `n` is more than the room.
    pub fn commit_lent(&mut self, n: usize) {
        match &mut self.0 {
            Bytes::Lent { lease, len } => {
                assert!(n <= lease.capacity() - *len as usize, "past the lent run");
                *len += n as u32;
            }
            Bytes::Heap(_) => panic!("commit_lent on a heap buffer"),
        }
    }

    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Bytes::Heap(v) => v,
            Bytes::Lent { lease, len } => &lease.run[..*len as usize],
        }
    }

    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Bytes::Heap(v) => v,
            Bytes::Lent { lease, len } => &mut lease.run[..*len as usize],
        }
    }

    /// The bytes as a vector: free for a heap buffer, a copy (counted) for
    /// a lent one, which goes back to its lender.
    pub fn into_vec(mut self) -> Vec<u8> {
        match &mut self.0 {
            Bytes::Heap(v) => std::mem::take(v),
            Bytes::Lent { .. } => {
                crate::copies::note(self.len());
                self.as_slice().to_vec()
            }
        }
    }
}

impl Default for PacketBuf {
    fn default() -> PacketBuf {
        PacketBuf::new()
    }
}

impl From<Vec<u8>> for PacketBuf {
    #[inline]
    fn from(v: Vec<u8>) -> PacketBuf {
        PacketBuf(Bytes::Heap(v))
    }
}

impl From<&[u8]> for PacketBuf {
    fn from(b: &[u8]) -> PacketBuf {
        b.to_vec().into()
    }
}

impl<const N: usize> From<[u8; N]> for PacketBuf {
    fn from(b: [u8; N]) -> PacketBuf {
        b.to_vec().into()
    }
}

impl<const N: usize> From<&[u8; N]> for PacketBuf {
    fn from(b: &[u8; N]) -> PacketBuf {
        b.to_vec().into()
    }
}

impl Deref for PacketBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for PacketBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl AsRef<[u8]> for PacketBuf {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for PacketBuf {
    #[inline]
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// A clone is a heap copy, as a `Vec`'s clone is (not counted, like it).
impl Clone for PacketBuf {
    fn clone(&self) -> PacketBuf {
        self.as_slice().to_vec().into()
    }
}

impl fmt::Debug for PacketBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_slice(), f)
    }
}

impl PartialEq for PacketBuf {
    fn eq(&self, o: &PacketBuf) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl Eq for PacketBuf {}

impl std::hash::Hash for PacketBuf {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_slice().hash(h)
    }
}

impl PartialEq<[u8]> for PacketBuf {
    fn eq(&self, o: &[u8]) -> bool {
        self.as_slice() == o
    }
}

impl PartialEq<&[u8]> for PacketBuf {
    fn eq(&self, o: &&[u8]) -> bool {
        self.as_slice() == *o
    }
}

impl PartialEq<Vec<u8>> for PacketBuf {
    fn eq(&self, o: &Vec<u8>) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl PartialEq<PacketBuf> for Vec<u8> {
    fn eq(&self, o: &PacketBuf) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl PartialEq<PacketBuf> for [u8] {
    fn eq(&self, o: &PacketBuf) -> bool {
        self == o.as_slice()
    }
}

impl PartialEq<PacketBuf> for &[u8] {
    fn eq(&self, o: &PacketBuf) -> bool {
        *self == o.as_slice()
    }
}

impl<const N: usize> PartialEq<[u8; N]> for PacketBuf {
    fn eq(&self, o: &[u8; N]) -> bool {
        self.as_slice() == o
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for PacketBuf {
    fn eq(&self, o: &&[u8; N]) -> bool {
        self.as_slice() == *o
    }
}

impl Extend<u8> for PacketBuf {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, it: I) {
        for b in it {
            self.push(b);
        }
    }
}

impl<'a> Extend<&'a u8> for PacketBuf {
    fn extend<I: IntoIterator<Item = &'a u8>>(&mut self, it: I) {
        for b in it {
            self.push(*b);
        }
    }
}

impl FromIterator<u8> for PacketBuf {
    fn from_iter<I: IntoIterator<Item = u8>>(it: I) -> PacketBuf {
        it.into_iter().collect::<Vec<u8>>().into()
    }
}

impl std::io::Write for PacketBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    // The leases stay boxed: a kept box is lent again as it is.
    #![allow(clippy::vec_box)]

    use super::*;
    use std::sync::Mutex;

    /// A lender over one leaked heap block (so `'static`), recording the
    /// offsets given back and keeping the leases.
    struct Block {
        base: usize,
        back: Mutex<Vec<usize>>,
        kept: Mutex<Vec<Box<Lease>>>,
    }

    impl Lender for Block {
        fn give_back(&self, lease: Box<Lease>) {
            self.back.lock().unwrap().push(lease.addr() - self.base);
            self.kept.lock().unwrap().push(lease);
        }
    }

    /// A block of 64 bytes, lent as runs of `cap` bytes.
    fn block(cap: usize) -> (Arc<Block>, LenderRef, Vec<Box<Lease>>) {
        let mem: &'static mut [u8] = Box::leak(vec![0u8; 64].into_boxed_slice());
        let b = Arc::new(Block {
            base: mem.as_ptr() as usize,
            back: Mutex::new(Vec::new()),
            kept: Mutex::new(Vec::new()),
        });
        let r = LenderRef::new(Box::new(b.clone()));
        let runs = mem.chunks_mut(cap).map(Lease::new).collect();
        (b, r, runs)
    }

    /// What a kept lease's run holds (its lender's view, once back).
    fn kept_bytes(block: &Block, i: usize) -> Vec<u8> {
        let mut l = block.kept.lock().unwrap();
        l[i].take_run().to_vec()
    }

    #[test]
    fn is_as_small_as_a_vec_and_send() {
        fn check<T: Send + Sync>() {}
        check::<PacketBuf>();
        assert_eq!(
            std::mem::size_of::<PacketBuf>(),
            std::mem::size_of::<Vec<u8>>()
        );
        assert_eq!(
            std::mem::size_of::<Option<PacketBuf>>(),
            std::mem::size_of::<Vec<u8>>()
        );
    }

    #[test]
    fn a_heap_buffer_behaves_as_a_vec() {
        let mut b = PacketBuf::with_capacity(4);
        b.extend_from_slice(b"abc");
        b.push(b'd');
        b.extend_from_slice(b"efgh"); // grows
        assert!(b.capacity() >= 8 && !b.is_lent());
        b.resize(10, b'z');
        b[0] = b'A';
        assert_eq!(b, b"Abcdefghzz");
        b.truncate(2);
        assert_eq!(b.clone().into_vec(), b"Ab");
        b.clear();
        assert!(b.is_empty() && b.capacity() >= 8);
        let v: Vec<u8> = PacketBuf::from(vec![1, 2]).into_vec();
        assert_eq!(v, [1, 2]);
    }

    #[test]
    fn a_lent_buffer_writes_in_place_and_goes_back_on_drop() {
        let (block, r, mut runs) = block(8);
        let mut b = PacketBuf::lent(runs.remove(2), 0, &r);
        assert!(b.is_lent() && b.is_empty() && b.capacity() == 8);
        b.extend_from_slice(b"abcd");
        b[0] = b'A';
        b.truncate(3);
        assert_eq!(b, b"Abc");
        drop(b);
        assert_eq!(*block.back.lock().unwrap(), [16]);
        assert_eq!(&kept_bytes(&block, 0)[..4], b"Abcd");
    }

    #[test]
    fn a_lent_buffer_can_hold_a_packet_already_there_and_be_read_into() {
        let (block, r, mut runs) = block(8);
        runs[0].run[..3].copy_from_slice(b"xyz");
        let mut b = PacketBuf::lent(runs.remove(0), 3, &r);
        assert_eq!(b, b"xyz");
        assert!(b.heap_vec_mut().is_none());
        let room = b.lent_spare_mut().unwrap();
        assert_eq!(room.len(), 5);
        room[..2].copy_from_slice(b"12");
        b.commit_lent(2);
        assert_eq!(b, b"xyz12");
        drop(b);
        assert_eq!(*block.back.lock().unwrap(), [0]);
    }

    #[test]
    fn growing_a_lent_buffer_past_its_run_moves_it_to_the_heap_intact() {
        let (block, r, mut runs) = block(4);
        let mut d = PacketBuf::lent(runs.remove(4), 0, &r);
        let mut c = PacketBuf::lent(runs.remove(2), 0, &r);
        let mut b = PacketBuf::lent(runs.remove(0), 0, &r);
        b.extend_from_slice(b"abc");
        b.extend_from_slice(b"defgh");
        assert!(!b.is_lent());
        assert_eq!(b, b"abcdefgh");
        assert_eq!(*block.back.lock().unwrap(), [0]);
        c.resize(6, b'x');
        assert_eq!((c.is_lent(), c.as_slice()), (false, &b"xxxxxx"[..]));
        d.extend_from_slice(b"ab");
        assert_eq!(d.into_vec(), b"ab");
        assert_eq!(*block.back.lock().unwrap(), [0, 8, 16]);
    }
}
