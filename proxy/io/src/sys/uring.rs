//! io_uring submission of the messages [`super::udpio::UdpIo`] prepares
//! (the `io-uring` cargo feature; `SOYA_IO=uring`).
//!
//! The headers (addresses, iovecs, GSO / GRO control messages) are exactly
//! those of the sendmmsg / recvmmsg path; instead of one `sendmmsg(2)`, each
//! message becomes one `IORING_OP_SENDMSG` (or `RECVMSG` with
//! `MSG_DONTWAIT`) entry and the batch is submitted and reaped with one
//! `io_uring_enter(2)`. Completions are waited for before returning, so the
//! caller's buffers are never touched by the kernel afterwards.

use std::io;

use io_uring::{opcode, types, IoUring};

pub struct Ring {
    ring: IoUring,
}

impl Ring {
    pub fn new(entries: usize) -> io::Result<Ring> {
        let n = entries.clamp(8, 4096).next_power_of_two() as u32;
        Ok(Ring {
            ring: IoUring::new(n)?,
        })
    }

    /// Submits `msgs` (whose buffers and control data must stay valid and
    /// unmoved until this returns) and waits for all of them.
    ///
    /// # Safety
    /// Every pointer must point to a valid `msghdr` whose iovecs, name and
    /// control buffer are valid for the kernel to read (send) or write
    /// (receive) until the call returns.
    unsafe fn submit_all(
        &mut self,
        fd: i32,
        msgs: &[*mut libc::msghdr],
        recv: bool,
        mut done: impl FnMut(usize, i32),
    ) -> io::Result<()> {
        let cap = self.ring.params().sq_entries() as usize;
        for chunk_start in (0..msgs.len()).step_by(cap) {
            let chunk = &msgs[chunk_start..(chunk_start + cap).min(msgs.len())];
            {
                let mut sq = self.ring.submission();
                for (k, &m) in chunk.iter().enumerate() {
                    let e = if recv {
                        opcode::RecvMsg::new(types::Fd(fd), m)
                            .flags(libc::MSG_DONTWAIT as u32)
                            .build()
                    } else {
                        opcode::SendMsg::new(types::Fd(fd), m).build()
                    };
                    // Sends of one socket must stay in order.
                    let e = if recv || k + 1 == chunk.len() {
                        e
                    } else {
                        e.flags(io_uring::squeue::Flags::IO_LINK)
                    };
                    // SAFETY: the caller keeps the message valid until
                    // completion, which we wait for below.
                    sq.push(&e.user_data((chunk_start + k) as u64))
                        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
                }
            }
            let mut left = chunk.len();
            self.ring.submit_and_wait(left)?;
            while left > 0 {
                let mut got = 0;
                for c in self.ring.completion() {
                    done(c.user_data() as usize, c.result());
                    got += 1;
                }
                left = left.saturating_sub(got);
                if left > 0 {
                    self.ring.submit_and_wait(left)?;
                }
            }
        }
        Ok(())
    }

    /// Sends the messages in order: how many leading ones went (> 0), or
    /// −errno of the first.
    ///
    /// # Safety
    /// As [`submit_all`](Self::submit_all).
    pub unsafe fn send_msgs(&mut self, fd: i32, msgs: &[*mut libc::msghdr]) -> isize {
        let mut res = vec![0i32; msgs.len()];
        if let Err(e) = self.submit_all(fd, msgs, false, |i, r| res[i] = r) {
            return -(e.raw_os_error().unwrap_or(libc::EIO) as isize);
        }
        let ok = res.iter().take_while(|&&r| r >= 0).count();
        if ok > 0 {
            ok as isize
        } else {
            // A linked entry after a failed one completes with -ECANCELED;
            // the first one carries the cause.
            res[0] as isize
        }
    }

    /// Receives into the messages (non-blocking): `got[i]` = bytes of
    /// message `i`. Returns how many received, or −errno when none did and
    /// the first failed for another reason than "nothing waiting".
    ///
    /// # Safety
    /// As [`submit_all`](Self::submit_all).
    pub unsafe fn recv_msgs(
        &mut self,
        fd: i32,
        msgs: &[*mut libc::msghdr],
        got: &mut [Option<usize>],
    ) -> isize {
        let mut first_err = 0;
        let mut n = 0;
        let r = self.submit_all(fd, msgs, true, |i, r| {
            if r >= 0 {
                got[i] = Some(r as usize);
                n += 1;
            } else if i == 0 {
                first_err = r;
            }
        });
        if let Err(e) = r {
            return -(e.raw_os_error().unwrap_or(libc::EIO) as isize);
        }
        if n == 0 && first_err < 0 {
            first_err as isize
        } else {
            n as isize
        }
    }
}
