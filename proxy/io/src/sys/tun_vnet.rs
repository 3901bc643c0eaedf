//! TUN devices with virtio-net headers (`IFF_VNET_HDR`), for `soya-wanem`:
//! with UDP segmentation offload advertised, the kernel hands a UDP GSO
//! packet over whole (one `read`), and one is written back with one
//! `writev` (headers, then the datagrams' payloads where they lie).

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::write_retrying;

/// `_IOW('T', 208, unsigned int)`.
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;

/// Opens (or creates) TUN device `name` with virtio-net headers and
/// checksum and UDP segmentation offload (USO, Linux ≥ 6.2; checksum
/// offload alone on an older kernel), non-blocking, without PI headers.
pub fn open(name: &str) -> io::Result<OwnedFd> {
    let owned = super::open_tun_with(name, libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR)?;
    for flags in [
        libc::TUN_F_CSUM | libc::TUN_F_USO4 | libc::TUN_F_USO6,
        libc::TUN_F_CSUM,
    ] {
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        let r = unsafe {
            libc::ioctl(
                owned.as_raw_fd(),
                TUNSETOFFLOAD as _,
                flags as libc::c_ulong,
            )
        };
        if r == 0 {
            return Ok(owned);
        }
    }
    let e = io::Error::last_os_error();
    Err(io::Error::new(
        e.kind(),
        format!("TUNSETOFFLOAD {name}: {e}"),
    ))
}

fn writev_once(fd: RawFd, iov: &[IoSlice<'_>]) -> io::Result<()> {
    rustix::io::writev(super::borrow(&fd), iov)?;
    Ok(())
}

/// Writes one packet gathered from `iov` (one retry after 1 ms when the
/// device is full, as [`super::write_packet`]).
pub fn writev_packet(fd: RawFd, iov: &[IoSlice<'_>]) -> io::Result<()> {
    write_retrying(fd, || writev_once(fd, iov))
}

/// Reads one packet into `head`, continuing into `tail` (one `readv`): its
/// length, or `Ok(None)` when none is waiting.
pub fn read_split(fd: RawFd, head: &mut [u8], tail: &mut [u8]) -> io::Result<Option<usize>> {
    let mut iov = [IoSliceMut::new(head), IoSliceMut::new(tail)];
    super::nonblocking(|| Ok(rustix::io::readv(super::borrow(&fd), &mut iov)?))
}
