//! Naming one direction of requests on a QP pair.

use std::fmt;
use std::net::IpAddr;

use crate::roce::{IpHeader, Psn, RocePacket};

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

    /// The half and PSN of a request packet this gateway built or checked
    /// already, read from the IP header and the BTH alone (destination QP,
    /// PSN), without parsing it whole again. `None` when the bytes are too
    /// short for that.
    pub fn of_request_bytes(packet: &[u8]) -> Option<(HalfKey, Psn)> {
        const UDP_LEN: usize = 8;
        let s = IpHeader::split(packet).ok()?;
        // The BTH's bytes 5..8: the destination QP; 9..12: the PSN.
        let bth = s.header_len + UDP_LEN;
        let b = packet.get(bth..bth + 12)?;
        let key = HalfKey {
            requester: s.header.src(),
            responder: s.header.dst(),
            responder_qpn: u32::from_be_bytes([0, b[5], b[6], b[7]]),
        };
        Some((key, Psn::new(u32::from_be_bytes([0, b[9], b[10], b[11]]))))
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
