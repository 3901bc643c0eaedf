//! Counting the user-space copies of packet bytes (feature `count-copies`).
//!
//! Moving bytes, not protocol work, is what a gateway's core spends most on
//! (issue 16: about a fifth of its CPU in `memmove`). So every place in the
//! data path that copies a packet's bytes from one buffer to another calls
//! [`note`] with the length copied: the DC backends (an AF_XDP frame
//! gathered or written to UMEM, a `udp` datagram staged), the engine
//! (a packet into a pooled buffer or the deep buffer), the WAN transport
//! (a message into a datagram, reassembly, decoding) and the device loop's
//! staging. `proxy/tests/steady_state_alloc.rs` drives two gateways and
//! checks the copies per packet at each of them.
//!
//! Without the feature [`note`] is an empty inline function: the daemon
//! pays nothing. With it, a thread-local counter (the test's gateways run
//! on its thread; other tests run in parallel on theirs).
//!
//! Copies the kernel makes (`read`/`write` on a tun, `recvmmsg`/`sendmmsg`)
//! are not counted here: those are system calls, counted by `perf stat`.

/// Copies noted on this thread so far (feature `count-copies`; all zero
/// without it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copies {
    /// Copies of at least [`LARGE`] bytes (a packet's payload, not a
    /// header).
    pub large: u64,
    /// Every copy noted, whatever its length.
    pub all: u64,
    /// Bytes copied.
    pub bytes: u64,
}

/// A copy this long moves a payload, not a header.
pub const LARGE: usize = 512;

impl std::ops::Sub for Copies {
    type Output = Copies;
    fn sub(self, o: Copies) -> Copies {
        Copies {
            large: self.large - o.large,
            all: self.all - o.all,
            bytes: self.bytes - o.bytes,
        }
    }
}

impl std::ops::AddAssign for Copies {
    fn add_assign(&mut self, o: Copies) {
        self.large += o.large;
        self.all += o.all;
        self.bytes += o.bytes;
    }
}

/// Whether this build counts copies.
pub const COUNTED: bool = cfg!(feature = "count-copies");

#[cfg(feature = "count-copies")]
thread_local! {
    static COPIES: std::cell::Cell<Copies> = const {
        std::cell::Cell::new(Copies { large: 0, all: 0, bytes: 0 })
    };
}

/// `len` bytes of a packet were copied from one buffer to another.
#[inline(always)]
pub fn note(len: usize) {
    #[cfg(feature = "count-copies")]
    COPIES.with(|c| {
        let mut n = c.get();
        n.all += 1;
        n.large += u64::from(len >= LARGE);
        n.bytes += len as u64;
        c.set(n);
    });
    #[cfg(not(feature = "count-copies"))]
    let _ = len;
}

/// The copies noted on this thread so far.
pub fn so_far() -> Copies {
    #[cfg(feature = "count-copies")]
    return COPIES.with(std::cell::Cell::get);
    #[cfg(not(feature = "count-copies"))]
    Copies::default()
}
