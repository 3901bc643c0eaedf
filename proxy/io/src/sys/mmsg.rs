//! The parts of batched UDP that the gateway's stack ([`super::udpio`]) and
//! the tools' ([`super::batch`]) share, written once: how a run of
//! datagrams is cut into GSO messages, the `UDP_SEGMENT` control message
//! that says so, and reading the control messages of a received one
//! (`UDP_GRO` segment size, `SO_RXQ_OVFL` drop counter, `SCM_TIMESTAMPNS`).
//!
//! The two front ends stay apart because their callers hold memory
//! differently (see [`super::udpio`]'s header): the gateway hands over one
//! staging buffer with a destination per datagram and reads into buffers
//! the stack owns; the WAN emulator and soya-perf receive into buffers
//! they lend (the emulator's packet pool, no copy) with kernel receive
//! timestamps, and send to one destination, waiting for room.

use std::mem::size_of;

use super::{SO_RXQ_OVFL, SO_TIMESTAMPNS, UDP_GRO, UDP_SEGMENT};

/// Most datagrams per GSO message (the kernel's `UDP_MAX_SEGMENTS`).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes per GSO message (a UDP payload, with margin for IPv6).
pub const GSO_MAX_BYTES: usize = 65_000;
/// Room for the control messages either side asks for: `UDP_SEGMENT` on
/// send; `SCM_TIMESTAMPNS` (a timespec), `SO_RXQ_OVFL` (u32) and `UDP_GRO`
/// (int) on receive.
pub(crate) const CTRL_LEN: usize = 128;

/// A GSO message of a send run: datagrams `first..first + count`, all
/// `seg` bytes (the last may be shorter), to the same destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    pub first: usize,
    pub count: usize,
    pub seg: usize,
}

/// Cuts a run of `n` datagrams (`len(i)` bytes each) into GSO messages (or
/// one message per datagram without `gso`): consecutive datagrams of the
/// same size that `same_dest(first, i)` says go where the first goes, up to
/// [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`]; a shorter one (not empty)
/// ends its message, as the kernel requires.
pub(crate) fn group(
    n: usize,
    len: impl Fn(usize) -> usize,
    same_dest: impl Fn(usize, usize) -> bool,
    gso: bool,
    out: &mut Vec<Group>,
) {
    out.clear();
    let mut i = 0;
    while i < n {
        let seg = len(i);
        let mut count = 1;
        let mut bytes = seg;
        if gso && seg > 0 {
            while i + count < n && count < GSO_MAX_SEGMENTS {
                let (j, l) = (i + count, len(i + count));
                if !same_dest(i, j) || l > seg || l == 0 || bytes + l > GSO_MAX_BYTES {
                    break;
                }
                bytes += l;
                count += 1;
                if l < seg {
                    break;
                }
            }
        }
        out.push(Group {
            first: i,
            count,
            seg,
        });
        i += count;
    }
}

/// Points `m` at `ctrl` holding one `UDP_SEGMENT` control message of `seg`
/// when `count` > 1 (a GSO message), at no control data otherwise.
pub(crate) fn set_segment(
    m: &mut libc::msghdr,
    ctrl: &mut [u64; CTRL_LEN / 8],
    count: usize,
    seg: usize,
) {
    if count < 2 {
        m.msg_control = std::ptr::null_mut();
        m.msg_controllen = 0;
        return;
    }
    m.msg_control = ctrl.as_mut_ptr().cast();
    // SAFETY: CMSG_* on `ctrl`, CTRL_LEN bytes, u64-aligned, more than
    // CMSG_SPACE(2); `m` points at it with that length.
    unsafe {
        m.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as u32) as _;
        let cm = libc::CMSG_FIRSTHDR(m);
        (*cm).cmsg_level = libc::SOL_UDP;
        (*cm).cmsg_type = UDP_SEGMENT;
        (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), seg as u16);
    }
}

/// What the control messages of one received message said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RxCmsgs {
    /// `UDP_GRO`: the size of the datagrams coalesced into the message.
    pub gro_segment: Option<usize>,
    /// `SO_RXQ_OVFL`: the socket's cumulative drop counter.
    pub drops: Option<u32>,
    /// `SCM_TIMESTAMPNS`: the kernel's receive time, CLOCK_REALTIME ns.
    pub rx_real_ns: Option<u64>,
}

/// Reads the control messages of `m`, as `recvmsg`/`recvmmsg` left them.
///
/// # Safety
/// `m.msg_control` must point at `m.msg_controllen` bytes the kernel
/// filled in (or `msg_controllen` be 0).
pub(crate) unsafe fn rx_cmsgs(m: &libc::msghdr) -> RxCmsgs {
    let mut out = RxCmsgs::default();
    // SAFETY: the caller's promise; CMSG_* walk within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_UDP, UDP_GRO) => {
                    let g = std::ptr::read_unaligned(data.cast::<libc::c_int>());
                    if g > 0 {
                        out.gro_segment = Some(g as usize);
                    }
                }
                (libc::SOL_SOCKET, SO_RXQ_OVFL) => {
                    out.drops = Some(std::ptr::read_unaligned(data.cast::<u32>()));
                }
                (libc::SOL_SOCKET, SO_TIMESTAMPNS) => {
                    let ts = std::ptr::read_unaligned(data.cast::<libc::timespec>());
                    out.rx_real_ns = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(lens: &[usize], dests: &[u8], gso: bool) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        group(
            lens.len(),
            |i| lens[i],
            |a, b| dests[a] == dests[b],
            gso,
            &mut out,
        );
        out.iter().map(|g| (g.first, g.count, g.seg)).collect()
    }

    #[test]
    fn runs_of_equal_sizes_to_one_place_make_one_message() {
        // Equal sizes, a shorter last one closes the run; a new destination
        // or a larger datagram starts the next.
        assert_eq!(
            groups(&[100, 100, 40, 100, 100, 200], &[0, 0, 0, 0, 1, 1], true),
            vec![(0, 3, 100), (3, 1, 100), (4, 1, 100), (5, 1, 200)]
        );
        // Without GSO every datagram is its own message.
        assert_eq!(
            groups(&[100, 100], &[0, 0], false),
            vec![(0, 1, 100), (1, 1, 100)]
        );
        // Empty datagrams never join a message.
        assert_eq!(
            groups(&[0, 0, 10, 0], &[0; 4], true),
            vec![(0, 1, 0), (1, 1, 0), (2, 1, 10), (3, 1, 0)]
        );
    }

    #[test]
    fn messages_stay_within_the_kernels_limits() {
        // 1,500-byte datagrams: the byte limit binds (43 × 1,500 ≤ 65,000).
        let lens = vec![1500; 200];
        let g = groups(&lens, &[0; 200], true);
        assert!(g.iter().all(|&(_, n, s)| n * s <= GSO_MAX_BYTES));
        assert_eq!(g[0].1, GSO_MAX_BYTES / 1500);
        // 10-byte ones: the segment limit binds.
        let lens = vec![10; 200];
        let g = groups(&lens, &[0; 200], true);
        assert_eq!(g[0].1, GSO_MAX_SEGMENTS);
        assert_eq!(g.iter().map(|x| x.1).sum::<usize>(), 200);
    }

    #[test]
    fn the_segment_message_round_trips_through_the_parser() {
        // SAFETY: all-zero is a valid msghdr.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        let mut ctrl = [0u64; CTRL_LEN / 8];
        set_segment(&mut m, &mut ctrl, 1, 1200);
        assert_eq!(m.msg_controllen, 0);
        set_segment(&mut m, &mut ctrl, 3, 1200);
        assert!(m.msg_controllen > 0);
        // A UDP_SEGMENT message is not one the receive side reads: the
        // parser walks it and finds nothing it knows.
        // SAFETY: set_segment just wrote msg_controllen bytes of ctrl.
        let got = unsafe { rx_cmsgs(&m) };
        assert_eq!(got, RxCmsgs::default());
        // SAFETY: as above; the kind rewritten to UDP_GRO (an int, as the
        // kernel writes it: the value's low bytes are the u16 set above).
        unsafe {
            let cm = libc::CMSG_FIRSTHDR(&m);
            (*cm).cmsg_type = UDP_GRO;
            (*cm).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<libc::c_int>(), 1200);
        }
        // SAFETY: as above.
        let got = unsafe { rx_cmsgs(&m) };
        assert_eq!(got.gro_segment, Some(1200));
    }
}
