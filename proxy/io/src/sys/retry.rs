//! The one place that decides what a failed non-blocking call means.
//!
//! Every loop of the proxy and the tools reads and writes non-blocking
//! descriptors, and two errors there are not failures: `EAGAIN` /
//! `EWOULDBLOCK` (nothing waiting, or no room: try again at the next
//! readiness) and `EINTR` (a signal arrived during the call: simply call
//! again). This used to be spelled out at about a dozen call sites, not
//! always alike (some returned on `EINTR`, some looped); these helpers are
//! the single definition.

use std::io;

/// Whether `e` only says "not now": nothing to read or no room to write
/// (`WouldBlock`), or a signal interrupted the call (`Interrupted`).
/// For code that cannot simply call again (a result already in hand, a
/// raw errno from a ring): treat such an error as "no progress this turn".
pub fn not_now(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Runs the non-blocking call `f`: again at once while a signal interrupts
/// it, `Ok(None)` when it would block, its value or its real error
/// otherwise.
pub fn nonblocking<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<Option<T>> {
    loop {
        match f() {
            Ok(v) => return Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(k: io::ErrorKind) -> io::Error {
        io::Error::from(k)
    }

    #[test]
    fn interrupted_calls_run_again_and_would_block_is_none() {
        // Two interruptions, then a value: the caller sees the value.
        let mut left = 2;
        let r = nonblocking(|| {
            if left > 0 {
                left -= 1;
                Err(err(io::ErrorKind::Interrupted))
            } else {
                Ok(7)
            }
        });
        assert_eq!(r.unwrap(), Some(7));
        assert_eq!(left, 0);

        let mut calls = 0;
        let r: io::Result<Option<()>> = nonblocking(|| {
            calls += 1;
            Err(err(io::ErrorKind::WouldBlock))
        });
        assert_eq!(r.unwrap(), None);
        assert_eq!(calls, 1, "would-block must not spin");
    }

    #[test]
    fn real_errors_pass_through() {
        let r: io::Result<Option<()>> = nonblocking(|| Err(err(io::ErrorKind::ConnectionRefused)));
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
        assert!(not_now(&err(io::ErrorKind::WouldBlock)));
        assert!(not_now(&err(io::ErrorKind::Interrupted)));
        assert!(not_now(&io::Error::from_raw_os_error(libc::EAGAIN)));
        assert!(!not_now(&err(io::ErrorKind::ConnectionRefused)));
        assert!(!not_now(&err(io::ErrorKind::TimedOut)));
    }
}
