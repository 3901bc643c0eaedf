//! AF_XDP sockets on one shared UMEM, written against the kernel's UAPI
//! (`linux/if_xdp.h`, through the `libc` crate's definitions): the UMEM
//! area, the four single-producer / single-consumer rings, bind, wakeup.
//!
//! Every `unsafe` of the backend's socket side is in this file. The rings
//! are memory shared with the kernel: the producer and consumer indices are
//! 32-bit counters the two sides read and write concurrently, so they are
//! accessed only as atomics (acquire loads of the other side's index,
//! release stores of ours), and descriptor slots are touched only in the
//! range the protocol gives us (between the consumer and producer index
//! for a consumer ring, our reserved free space for a producer ring).
//!
//! Layout of the UMEM: the RX tape (`xdp::tape`: slots 3840 bytes apart),
//! then TX chunks of [`CHUNK`] bytes, no headroom. Addresses are offsets
//! into the area; the UMEM is registered unaligned, so an RX descriptor's
//! address carries the data's offset in its top 16 bits.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes of one UMEM chunk: a page, the largest the kernel accepts without
/// HugeTLB memory. Larger frames span several chunks (multi-buffer,
/// `XDP_USE_SG`, Linux ≥ 6.6).
pub const CHUNK: usize = 4096;

/// An anonymous, page-aligned memory area registered as the UMEM.
pub struct Area {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the area is plain memory owned by this value; which parts are
// read or written is coordinated by the ring protocol (a chunk is owned by
// exactly one side, or one shard, at a time), and shards reach it only
// through the `Shared` mutex or chunks they own.
unsafe impl Send for Area {}
unsafe impl Sync for Area {}

impl Area {
    pub fn new(len: usize) -> io::Result<Area> {
        // SAFETY: an anonymous private mapping with no address hint; the
        // result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Area {
            ptr: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
        })
    }

    pub fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn size(&self) -> usize {
        self.len
    }

    /// The bytes `addr..addr + len` of the area.
    ///
    /// The caller must own the chunk(s) in that range (received from the RX
    /// ring, or taken from the free list and not yet put on a ring).
    pub fn slice(&self, addr: u64, len: usize) -> &[u8] {
        let addr = addr as usize;
        assert!(addr.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds (checked above); the kernel does not write a
        // chunk that userspace owns (it was handed to us on the RX ring and
        // not given back yet).
        unsafe { std::slice::from_raw_parts(self.base().add(addr), len) }
    }

    /// Mutable view of one owned chunk range (see [`slice`](Self::slice)).
    #[allow(clippy::mut_from_ref)]
    pub fn slice_mut(&self, addr: u64, len: usize) -> &mut [u8] {
        let addr = addr as usize;
        assert!(addr.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds; the chunk is owned by the calling shard alone
        // (taken from the free list, not on any ring), so nobody else reads
        // or writes it until it is put on the TX ring.
        unsafe { std::slice::from_raw_parts_mut(self.base().add(addr), len) }
    }

    /// The bytes `addr..addr + len` as a run to lend to the protocol's
    /// packet buffers (a `&'static mut [u8]` in a `soya_proto::buffer::Lease`:
    /// `lend::UmemSource`, `tape::lend`).
    ///
    /// # Safety
    /// `'static` stands for "while the area is mapped": the caller puts the
    /// run in a lease whose lender holds an `Arc` of this area (so the
    /// mapping outlives every lease naming it) and clears the lease
    /// (`Lease::clear`) when it comes back. And the run is exclusive: no
    /// chunk of it is on a ring the kernel writes, and nothing else reads
    /// or writes it until the lease comes back (the kernel's TX reads the
    /// lender tracks: `Lender::in_flight`).
    pub unsafe fn lend_run(&self, addr: usize, len: usize) -> &'static mut [u8] {
        assert!(addr.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds (checked above); lifetime and exclusivity: the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.base().add(addr), len) }
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; every socket
        // using it was closed before (the owner drops sockets first).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One mmapped ring: producer and consumer indices, flags, descriptors.
pub struct Ring<T> {
    map: NonNull<u8>,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut T,
    mask: u32,
    size: u32,
    /// Our copy of our own index (the producer index on a producer ring,
    /// the consumer index on a consumer ring).
    local: u32,
    /// Last seen value of the other side's index.
    cached: u32,
}

// SAFETY: the ring is used by one thread at a time (a shard owns its RX/TX
// rings; the fill and completion rings sit behind a mutex); the pointers
// point into a mapping this value owns.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Maps ring `pgoff` of socket `fd` with `size` entries at `off`.
    fn map(fd: RawFd, off: &libc::xdp_ring_offset, size: u32, pgoff: i64) -> io::Result<Ring<T>> {
        let map_len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: a shared mapping of the socket's ring region, the length
        // the kernel's offsets give; checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p.cast::<u8>();
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS for this very
        // mapping and lie within map_len; the kernel aligns the indices
        // (u32) and descriptors.
        unsafe {
            Ok(Ring {
                map: NonNull::new(base).expect("mmap returned null"),
                map_len,
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: base.add(off.flags as usize).cast(),
                desc: base.add(off.desc as usize).cast(),
                mask: size - 1,
                size,
                local: 0,
                cached: 0,
            })
        }
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points into our live mapping; the kernel only ever
        // accesses it atomically too.
        unsafe { &*self.producer }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as `prod`.
        unsafe { &*self.consumer }
    }

    /// Whether the kernel asked for a wakeup (XDP_USE_NEED_WAKEUP).
    pub fn needs_wakeup(&self) -> bool {
        // SAFETY: as `prod`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    // ---- producer side (fill, TX) -------------------------------------

    /// Free slots we may fill.
    pub fn free(&mut self) -> u32 {
        self.cached = self.cons().load(Ordering::Acquire);
        self.cached.wrapping_add(self.size).wrapping_sub(self.local)
    }

    /// Writes one entry (the caller checked [`free`](Self::free)).
    pub fn push(&mut self, v: T) {
        debug_assert!(self.cached.wrapping_add(self.size).wrapping_sub(self.local) > 0);
        let i = (self.local & self.mask) as usize;
        // SAFETY: slot i is free (between the kernel's consumer index and
        // our producer index + size), i < size.
        unsafe { self.desc.add(i).write(v) };
        self.local = self.local.wrapping_add(1);
    }

    /// Publishes what was pushed.
    pub fn submit(&mut self) {
        self.prod().store(self.local, Ordering::Release);
    }

    /// Entries pushed and not yet consumed by the kernel.
    pub fn outstanding(&self) -> u32 {
        self.local.wrapping_sub(self.cons().load(Ordering::Acquire))
    }

    // ---- consumer side (RX, completion) -------------------------------

    /// Entries ready to read.
    pub fn ready(&mut self) -> u32 {
        self.cached = self.prod().load(Ordering::Acquire);
        self.cached.wrapping_sub(self.local)
    }

    /// Entry `k` after our consumer index (k < [`ready`](Self::ready)).
    pub fn peek(&self, k: u32) -> T {
        let i = (self.local.wrapping_add(k) & self.mask) as usize;
        // SAFETY: the kernel published entries up to `cached`; k is below
        // that count, and i < size.
        unsafe { self.desc.add(i).read() }
    }

    /// Gives `n` read entries back to the kernel.
    pub fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.cons().store(self.local, Ordering::Release);
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: passes a pointer to a live T and its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads SOL_XDP option `opt` into a `T`: the value and how many bytes the
/// kernel wrote (an older kernel may write a shorter struct).
///
/// # Safety
/// `T` is plain integers (all-zero is a valid `T`) and the kernel's type
/// for `opt`.
unsafe fn getsockopt<T>(fd: RawFd, opt: libc::c_int) -> io::Result<(T, usize)> {
    // SAFETY: all-zero is valid for T (the caller's promise).
    let mut v: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `v`.
    let r =
        unsafe { libc::getsockopt(fd, libc::SOL_XDP, opt, (&mut v as *mut T).cast(), &mut len) };
    if r == 0 {
        Ok((v, len as usize))
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A new AF_XDP socket.
pub fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked and then owned.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Registers `area` as the UMEM of `fd`, unaligned: fill ring addresses
/// need not be chunk multiples (the RX tape puts them 3840 bytes apart,
/// see `xdp::tape`); a chunk is still the most one buffer holds.
pub fn register_umem(fd: RawFd, area: &Area) -> io::Result<()> {
    let reg = libc::xdp_umem_reg {
        addr: area.base() as u64,
        len: area.size() as u64,
        chunk_size: CHUNK as u32,
        headroom: 0,
        flags: libc::XDP_UMEM_UNALIGNED_CHUNK_FLAG,
        tx_metadata_len: 0,
    };
    setsockopt(fd, libc::XDP_UMEM_REG, &reg)
}

pub fn set_ring_size(fd: RawFd, opt: libc::c_int, size: u32) -> io::Result<()> {
    setsockopt(fd, opt, &size)
}

fn mmap_offsets(fd: RawFd) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: xdp_mmap_offsets is plain integers, XDP_MMAP_OFFSETS's type.
    let (off, len) = unsafe { getsockopt::<libc::xdp_mmap_offsets>(fd, libc::XDP_MMAP_OFFSETS)? };
    if len != std::mem::size_of::<libc::xdp_mmap_offsets>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "XDP_MMAP_OFFSETS without ring flags (kernel older than 5.4)",
        ));
    }
    Ok(off)
}

/// The fill and completion rings of the socket that registered the UMEM.
pub fn umem_rings(fd: RawFd, size: u32) -> io::Result<(Ring<u64>, Ring<u64>)> {
    let off = mmap_offsets(fd)?;
    let fill = Ring::map(fd, &off.fr, size, libc::XDP_UMEM_PGOFF_FILL_RING as i64)?;
    let comp = Ring::map(
        fd,
        &off.cr,
        size,
        libc::XDP_UMEM_PGOFF_COMPLETION_RING as i64,
    )?;
    Ok((fill, comp))
}

/// The RX and TX rings of a socket.
pub fn socket_rings(
    fd: RawFd,
    size: u32,
) -> io::Result<(Ring<libc::xdp_desc>, Ring<libc::xdp_desc>)> {
    let off = mmap_offsets(fd)?;
    let rx = Ring::map(fd, &off.rx, size, libc::XDP_PGOFF_RX_RING)?;
    let tx = Ring::map(fd, &off.tx, size, libc::XDP_PGOFF_TX_RING)?;
    Ok((rx, tx))
}

/// bind(2) to queue `queue` of interface `ifindex`.
pub fn bind(
    fd: RawFd,
    ifindex: u32,
    queue: u32,
    flags: u16,
    shared: Option<RawFd>,
) -> io::Result<()> {
    let sa = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: flags,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: shared.map_or(0, |f| f as u32),
    };
    // SAFETY: a pointer to a live sockaddr_xdp and its size.
    let r = unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_xdp).cast(),
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the bound socket runs in zero-copy mode (XDP_OPTIONS).
pub fn zero_copy(fd: RawFd) -> bool {
    // SAFETY: xdp_options is one u32, XDP_OPTIONS's type.
    unsafe { getsockopt::<libc::xdp_options>(fd, libc::XDP_OPTIONS) }
        .is_ok_and(|(o, _)| o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0)
}

/// Kernel drop counters of a socket (XDP_STATISTICS): RX dropped (no
/// fill buffers / invalid), RX ring full, fill ring empty.
pub fn statistics(fd: RawFd) -> Option<libc::xdp_statistics> {
    // SAFETY: xdp_statistics is plain integers, XDP_STATISTICS's type.
    unsafe { getsockopt::<libc::xdp_statistics>(fd, libc::XDP_STATISTICS) }
        .ok()
        .map(|(s, _)| s)
}

/// Kicks the kernel to send what is on the TX ring (copy mode, or when
/// the driver asked for a wakeup).
pub fn kick_tx(fd: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: sendto with no data and no address, as the AF_XDP ABI asks.
    let r = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null(),
            0,
        )
    };
    if r >= 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // Busy / no buffers right now: the next flush kicks again.
        Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => Ok(()),
        _ => Err(e),
    }
}

/// Kicks the kernel to refill RX (zero-copy drivers that asked for it).
pub fn kick_rx(fd: &impl AsRawFd) {
    // SAFETY: recvfrom with no buffer, as the AF_XDP ABI asks.
    unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
}
