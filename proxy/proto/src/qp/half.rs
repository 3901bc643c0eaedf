//! Naming one direction of requests on a QP pair.

use std::fmt;
use std::net::IpAddr;

use crate::roce::RocePacket;

/// One half of an RC connection: the requests a requester sends to one
/// responder QP, in their own PSN space.
///
/// Both gateways can compute it from any request packet (source address,
/// destination address, destination QP), so it names the half on the WAN
/// too. The requester's own QPN is not in request packets: it is learned
/// (RDMA-CM, or the first response) and kept beside the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HalfKey {
    pub requester: IpAddr,
    pub responder: IpAddr,
    pub responder_qpn: u32,
}

impl HalfKey {
    /// The half a request packet belongs to.
    pub fn of_request(p: &RocePacket<'_>) -> HalfKey {
        HalfKey {
            requester: p.ip.src(),
            responder: p.ip.dst(),
            responder_qpn: p.bth.dest_qp,
        }
    }

    /// A stable 64-bit id for buffer quotas and metrics labels.
    pub fn id(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

impl fmt::Debug for HalfKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}->{}/qp{:#x}",
            self.requester, self.responder, self.responder_qpn
        )
    }
}

impl fmt::Display for HalfKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
