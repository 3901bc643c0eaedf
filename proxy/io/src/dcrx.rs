//! [`DcRx`]: a packet a DC backend read, as the daemon's device loop
//! (`soya::gateway::ports::DcPort`) and the AF_XDP backend ([`crate::xdp`])
//! both name it.

use soya_proto::buffer::PacketBuf;

/// A packet a DC backend read.
pub enum DcRx<'a> {
    /// In the backend's own memory (a socket batch, a UMEM chunk).
    Borrowed(&'a [u8]),
    /// In a buffer the site lent the backend (`DcPort::recv_batch`): the
    /// site takes it back, with the packet in it.
    Lent(PacketBuf),
}

impl DcRx<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            DcRx::Borrowed(b) => b,
            DcRx::Lent(v) => v,
        }
    }
}
