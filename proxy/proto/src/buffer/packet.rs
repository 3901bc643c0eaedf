//! [`PacketBuf`]: the bytes of one packet, wherever they live.
//!
//! The engine, the WAN transport and the site hold and move packets as
//! `PacketBuf`s. Most are heap vectors (from a [`PacketPool`]); some are a
//! run of bytes *lent* by an I/O backend (the AF_XDP backend's UMEM), so
//! that a packet can stay where the kernel put it, or where it will be sent
//! from, instead of being copied in or out (issue 16: at most one user-space
//! copy per packet per gateway). A lent buffer goes back to its lender when
//! dropped, through the small [`Lender`] trait (as a [`LenderRef`]): the sans-IO core never learns
//! what the memory is.
//!
//! A lent buffer has a fixed capacity. Growing it past that moves its bytes
//! to the heap (a copy, counted by [`crate::copies::note`]) and returns the
//! lent run at once: never undefined behaviour, never lost data.
//!
//! The API is the part of `Vec<u8>`'s that the code needs, so that the
//! change from `Vec<u8>` was mechanical (tests build theirs with `.into()`).
//!
//! [`PacketPool`]: super::PacketPool
#![allow(unsafe_code)]

use std::fmt;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Someone who lends runs of bytes to [`PacketBuf`]s and takes them back.
///
/// `give_back` is called exactly once per lent buffer, with the address of
/// the run it lent (as given to [`PacketBuf::lent`]), when the buffer is
/// dropped (or moved to the heap). It may be called from whichever thread
/// dropped the buffer.
pub trait Lender: Send + Sync {
    fn give_back(&self, run: NonNull<u8>);

    /// Whether someone still reads the run lent at `run` without the
    /// buffer knowing (an AF_XDP TX descriptor naming it): its bytes must
    /// not be rewritten in place until that is over (see
    /// [`PacketBuf::make_writable`]).
    fn in_flight(&self, _run: NonNull<u8>) -> bool {
        false
    }
}

/// A [`Lender`] as lent buffers refer to it: one pointer wide, so that a
/// `PacketBuf` stays the size of a `Vec<u8>` (see [`PacketBuf`]).
#[derive(Clone)]
pub struct LenderRef(Arc<Box<dyn Lender>>);

impl LenderRef {
    pub fn new(lender: Box<dyn Lender>) -> LenderRef {
        LenderRef(Arc::new(lender))
    }
}

impl<L: Lender + ?Sized> Lender for Arc<L> {
    fn give_back(&self, run: NonNull<u8>) {
        (**self).give_back(run)
    }
    fn in_flight(&self, run: NonNull<u8>) -> bool {
        (**self).in_flight(run)
    }
}

/// A packet's bytes: a heap vector or a run lent by a [`Lender`].
///
/// Laid out in three words, as a `Vec<u8>` is: the engine's and the
/// transport's per-packet tables hold one each, and their size is part of
/// the per-QP state the simulator reports (`state_bytes_per_qp`); a wider
/// buffer would grow it by a third. So the length and the capacity are
/// `u32` (a packet buffer holds less than 4 GiB) and the third word is the
/// lender, `None` for a heap buffer.
pub struct PacketBuf {
    /// Heap: the vector's pointer. Lent: the start of the run.
    ptr: NonNull<u8>,
    len: u32,
    cap: u32,
    lender: Option<LenderRef>,
}

// SAFETY: a heap buffer owns its allocation as a `Vec<u8>` does; a lent run
// is owned exclusively by its buffer (the contract of `PacketBuf::lent`),
// and the lender is `Send + Sync`. Moving a buffer to another thread, or
// sharing `&` to it, is as safe as for a `Vec<u8>`.
unsafe impl Send for PacketBuf {}
unsafe impl Sync for PacketBuf {}

impl Drop for PacketBuf {
    fn drop(&mut self) {
        match &self.lender {
            Some(l) => l.0.give_back(self.ptr),
            // SAFETY: a heap buffer's fields are its vector's raw parts.
            None => drop(unsafe { self.vec_parts() }),
        }
    }
}

impl PacketBuf {
    /// An empty heap buffer (allocates nothing).
    pub const fn new() -> PacketBuf {
        PacketBuf {
            ptr: NonNull::dangling(),
            len: 0,
            cap: 0,
            lender: None,
        }
    }

    /// An empty heap buffer with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> PacketBuf {
        Vec::with_capacity(cap).into()
    }

    /// An empty buffer over `cap` bytes at `run`, given back to `lender`
    /// when dropped.
    ///
    /// # Safety
    /// `run` must be valid for reads and writes of `cap` bytes, and nothing
    /// else may read or write them, until `lender` is given `run` back
    /// (which this buffer does exactly once).
    pub unsafe fn lent(run: NonNull<u8>, cap: u32, lender: &LenderRef) -> PacketBuf {
        PacketBuf {
            ptr: run,
            len: 0,
            cap,
            lender: Some(lender.clone()),
        }
    }

    /// The vector a heap buffer's fields describe.
    ///
    /// # Safety
    /// Only for a heap buffer, and the result must not be dropped while
    /// `self` still names it (see `with_vec`, `drop`).
    unsafe fn vec_parts(&mut self) -> Vec<u8> {
        // SAFETY: a heap buffer's fields were taken from a `Vec<u8>`
        // (`set_vec`) and are changed only through one (`with_vec`).
        unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), self.len as usize, self.cap as usize) }
    }

    /// Makes `self` (heap, owning nothing) the owner of `v`.
    fn set_vec(&mut self, v: Vec<u8>) {
        let mut v = std::mem::ManuallyDrop::new(v);
        let (Ok(len), Ok(cap)) = (u32::try_from(v.len()), u32::try_from(v.capacity())) else {
            // Leaks `v` rather than naming memory `self` cannot describe;
            // `self` stays a valid empty buffer.
            panic!("a packet buffer holds less than 4 GiB");
        };
        self.ptr = NonNull::new(v.as_mut_ptr()).expect("a Vec's pointer is never null");
        self.len = len;
        self.cap = cap;
    }

    /// Runs `f` on a heap buffer's vector. While `f` runs `self` owns
    /// nothing, so a panic in it leaks the vector instead of freeing it
    /// twice.
    fn with_vec<R>(&mut self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        debug_assert!(self.lender.is_none());
        // SAFETY: a heap buffer; `self` is emptied before `v` could drop.
        let mut v = std::mem::ManuallyDrop::new(unsafe { self.vec_parts() });
        self.ptr = NonNull::dangling();
        self.len = 0;
        self.cap = 0;
        let r = f(&mut v);
        self.set_vec(std::mem::ManuallyDrop::into_inner(v));
        r
    }

    /// Before rewriting bytes already handed to an I/O backend (the
    /// egress sets AckReq on a held request it resends): a lent run the
    /// backend may still be reading is left to it and the bytes move to
    /// the heap (a copy, counted; `true`). Writing in place instead would
    /// race with the NIC or the kernel sending the previous version.
    pub fn make_writable(&mut self) -> bool {
        match &self.lender {
            Some(l) if l.0.in_flight(self.ptr) => {
                crate::copies::note(self.len());
                *self = self.as_slice().to_vec().into();
                true
            }
            _ => false,
        }
    }

    /// The start of a lent buffer's run (for its lender to recognise it).
    pub fn lent_run(&self) -> Option<NonNull<u8>> {
        self.lender.as_ref().map(|_| self.ptr)
    }

    /// Whether the bytes are lent (not on the heap).
    pub fn is_lent(&self) -> bool {
        self.lender.is_some()
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.cap as usize
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    pub fn truncate(&mut self, len: usize) {
        // Both kinds: shortening only forgets bytes (u8 has no drop).
        if len < self.len() {
            self.len = len as u32;
        }
    }

    /// Makes room for `extra` more bytes. A lent buffer too small moves its
    /// bytes to the heap (counted as a copy) and goes back to its lender.
    pub fn reserve(&mut self, extra: usize) {
        if self.lender.is_none() {
            self.with_vec(|v| v.reserve(extra));
        } else if self.capacity() - self.len() < extra {
            let mut v = Vec::with_capacity(self.len() + extra);
            crate::copies::note(self.len());
            v.extend_from_slice(self);
            // Gives the run back, and `self` becomes the heap buffer.
            *self = v.into();
        }
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        if self.lender.is_none() {
            return self.with_vec(|v| v.extend_from_slice(bytes));
        }
        self.reserve(bytes.len());
        if self.lender.is_none() {
            return self.with_vec(|v| v.extend_from_slice(bytes));
        }
        // SAFETY: `reserve` left room for `bytes` in the run; `bytes`
        // cannot overlap the spare part of a run this buffer owns
        // exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(self.len()),
                bytes.len(),
            )
        };
        self.len += bytes.len() as u32;
    }

    pub fn push(&mut self, b: u8) {
        if self.lender.is_none() {
            self.with_vec(|v| v.push(b));
        } else {
            self.extend_from_slice(&[b]);
        }
    }

    /// Resizes to `len` bytes, new ones set to `value`.
    pub fn resize(&mut self, len: usize, value: u8) {
        let cur = self.len();
        if len <= cur {
            self.truncate(len);
            return;
        }
        self.reserve(len - cur);
        if self.lender.is_none() {
            return self.with_vec(|v| v.resize(len, value));
        }
        // SAFETY: `reserve` left room for `len` bytes in the run.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(cur), value, len - cur) };
        self.len = len as u32;
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

    /// The uninitialised room after the bytes (for a `readv` into it).
    pub fn spare_capacity_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: both kinds own `cap` bytes at `ptr` exclusively (a
        // vector's allocation, a lent run); the part past `len` is handed
        // out as possibly uninitialised, as `Vec::spare_capacity_mut` does.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.as_ptr().add(self.len()).cast::<MaybeUninit<u8>>(),
                self.capacity() - self.len(),
            )
        }
    }

    /// Sets the length after bytes were written into the spare capacity.
    ///
    /// # Safety
    /// As `Vec::set_len`: `len <= capacity()` and the first `len` bytes
    /// initialised.
    pub unsafe fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity());
        self.len = len as u32;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len` of the `cap` bytes this buffer owns are
        // initialised (written through it); `ptr` is dangling only with
        // `len` 0, which `from_raw_parts` allows.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and the bytes are exclusively ours.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }

    /// The bytes as a vector: free for a heap buffer, a copy (counted) for
    /// a lent one, which goes back to its lender.
    pub fn into_vec(mut self) -> Vec<u8> {
        if self.lender.is_some() {
            crate::copies::note(self.len());
            return self.as_slice().to_vec();
        }
        self.with_vec(std::mem::take)
    }
}

impl Default for PacketBuf {
    fn default() -> PacketBuf {
        PacketBuf::new()
    }
}

impl From<Vec<u8>> for PacketBuf {
    fn from(v: Vec<u8>) -> PacketBuf {
        let mut b = PacketBuf::new();
        b.set_vec(v);
        b
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
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for PacketBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl AsRef<[u8]> for PacketBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for PacketBuf {
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
    use super::*;
    use std::sync::Mutex;

    /// A lender over one heap block, recording the offsets given back.
    struct Block {
        mem: Mutex<Vec<u8>>,
        back: Mutex<Vec<usize>>,
    }

    impl Lender for Block {
        fn give_back(&self, run: NonNull<u8>) {
            let base = self.mem.lock().unwrap().as_ptr() as usize;
            self.back.lock().unwrap().push(run.as_ptr() as usize - base);
        }
    }

    fn block() -> (Arc<Block>, LenderRef) {
        let b = Arc::new(Block {
            mem: Mutex::new(vec![0; 64]),
            back: Mutex::new(Vec::new()),
        });
        let r = LenderRef::new(Box::new(b.clone()));
        (b, r)
    }

    fn lend(block: &Block, r: &LenderRef, off: usize, cap: u32) -> PacketBuf {
        let ptr = NonNull::new(block.mem.lock().unwrap()[off..].as_mut_ptr()).unwrap();
        // SAFETY: the tests lend disjoint runs of a block that outlives
        // every buffer, and read it only once the run is given back.
        unsafe { PacketBuf::lent(ptr, cap, r) }
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
        let (block, r) = block();
        let mut b = lend(&block, &r, 16, 8);
        assert!(b.is_lent() && b.is_empty() && b.capacity() == 8);
        b.extend_from_slice(b"abcd");
        b[0] = b'A';
        b.truncate(3);
        assert_eq!(b, b"Abc");
        drop(b);
        assert_eq!(*block.back.lock().unwrap(), [16]);
        assert_eq!(&block.mem.lock().unwrap()[16..20], b"Abcd");
    }

    #[test]
    fn growing_a_lent_buffer_past_its_run_moves_it_to_the_heap_intact() {
        let (block, r) = block();
        let mut b = lend(&block, &r, 0, 4);
        b.extend_from_slice(b"abc");
        b.extend_from_slice(b"defgh");
        assert!(!b.is_lent());
        assert_eq!(b, b"abcdefgh");
        assert_eq!(*block.back.lock().unwrap(), [0]);
        let mut c = lend(&block, &r, 8, 4);
        c.resize(6, b'x');
        assert_eq!((c.is_lent(), c.as_slice()), (false, &b"xxxxxx"[..]));
        let mut d = lend(&block, &r, 16, 4);
        d.extend_from_slice(b"ab");
        assert_eq!(d.into_vec(), b"ab");
        assert_eq!(*block.back.lock().unwrap(), [0, 8, 16]);
    }
}
