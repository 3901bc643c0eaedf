//! RDMA-CM connection management MADs, just enough to learn a flow.
//!
//! RDMA-CM runs over QP1 as UD SEND Only (opcode 0x64, DETH with Q_Key
//! 0x80010000) carrying a 256-byte MAD. The active side's REQ names its QPN,
//! the passive side's REP names its own; from the pair the gateway knows both
//! QPNs and both PSN spaces before the first data packet.
//!
//! Which PSN is which: Linux's CM sets the *passive* side's send PSN from the
//! REQ's StartingPSN (cm.c `cm_req_handler`: `sq_psn = CM_REQ_STARTING_PSN`)
//! and the active side's from the REP's. The rping capture in shared/lab
//! confirms it (REQ 0x158a54 is the first PSN 10.0.2.1 sends with; REP
//! 0x41b9eb the first 10.0.1.1 sends with). The project brief had this the
//! other way round.
//! Layouts: IBTA vol. 1 ch. 12 (Linux include/rdma/ibta_vol1_c12.h); byte
//! offsets below are from the start of the MAD (the CM message starts at 24).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::error::{be16, be24, be32, be64, need, Result, WireError};
use super::opcode::Opcode;
use super::packet::RocePacket;
use super::psn::Psn;

pub const MAD_LEN: usize = 256;
const MGMT_CLASS_CM: u8 = 0x07;
/// Q_Key of QP1 (GSI) traffic.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// CM attribute IDs.
pub mod attr {
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
}

/// Connection request (active side → passive side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmReq {
    pub local_comm_id: u32,
    pub service_id: u64,
    /// The active side's QPN.
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// The first PSN the *passive* side sends with (= the active side's
    /// expected receive PSN); see the module comment.
    pub starting_psn: Psn,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// Path MTU in bytes (256..=4096), 0 if the code is invalid.
    pub path_mtu: u16,
    /// Primary path local ACK timeout (4.096 µs × 2^t).
    pub local_ack_timeout: u8,
    pub local_gid: Ipv6Addr,
    pub remote_gid: Ipv6Addr,
    /// Addresses from the RDMA-CM private data header (`struct cma_hdr`),
    /// present when the ServiceID is in the RDMA IP CM range.
    pub ip: Option<CmaAddrs>,
}

/// IP addresses and port that librdmacm puts in the REQ private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaAddrs {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub port: u16,
}

/// Connection reply (passive side → active side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmRep {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// The passive side's QPN.
    pub local_qpn: u32,
    /// The first PSN the *active* side sends with; see the module comment.
    pub starting_psn: Psn,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry_count: u8,
}

/// A CM message as the gateway sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmMessage {
    Req(CmReq),
    Rep(CmRep),
    Rtu {
        local_comm_id: u32,
        remote_comm_id: u32,
    },
    Rej {
        local_comm_id: u32,
        remote_comm_id: u32,
        reason: u16,
    },
    /// Disconnect request: the teardown signal for the flow.
    Dreq {
        local_comm_id: u32,
        remote_comm_id: u32,
        remote_qpn: u32,
    },
    Drep {
        local_comm_id: u32,
        remote_comm_id: u32,
    },
    /// Another CM attribute (MRA, LAP, ...): carried, not interpreted.
    Other {
        attr_id: u16,
    },
}

/// IBTA path MTU code to bytes.
pub fn mtu_bytes(code: u8) -> u16 {
    match code {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        5 => 4096,
        _ => 0,
    }
}

/// Is this packet a MAD on QP1 (where CM lives)?
pub fn is_qp1_mad(pkt: &RocePacket<'_>) -> bool {
    pkt.bth.opcode == Opcode::UD_SEND_ONLY && pkt.bth.dest_qp == 1
}

/// Parses the CM message in a QP1 packet.
pub fn parse_packet(pkt: &RocePacket<'_>) -> Result<CmMessage> {
    if !is_qp1_mad(pkt) {
        return Err(WireError::NotCm("not a UD SEND Only to QP1"));
    }
    parse_mad(pkt.payload())
}

fn gid(b: &[u8], at: usize) -> Ipv6Addr {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(g)
}

/// `union cma_ip_addr`: IPv4 sits in the last 4 of 16 bytes.
fn cma_addr(b: &[u8], at: usize, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(be32(b, at + 12)))
    } else {
        IpAddr::V6(gid(b, at))
    }
}

/// Parses a 256-byte MAD of the CM class.
pub fn parse_mad(m: &[u8]) -> Result<CmMessage> {
    need(m, MAD_LEN, "CM MAD")?;
    if m[0] != 1 {
        return Err(WireError::NotCm("MAD base version is not 1"));
    }
    if m[1] != MGMT_CLASS_CM {
        return Err(WireError::NotCm("management class is not CM (0x07)"));
    }
    let attr_id = be16(m, 16);
    let ids = (be32(m, 24), be32(m, 28));
    Ok(match attr_id {
        attr::REQ => {
            let service_id = be64(m, 32);
            // ServiceIDs 0x00000000_01PP_PPPP are RDMA IP CM (cma.c: port space
            // in bits 16..24, port in 0..16), whose
            // private data starts with `struct cma_hdr`.
            let ip = if service_id >> 24 == 1 {
                let pd = 164;
                let v = m[pd + 1] >> 4;
                (v == 4 || v == 6).then(|| CmaAddrs {
                    port: be16(m, pd + 2),
                    src: cma_addr(m, pd + 4, v == 4),
                    dst: cma_addr(m, pd + 20, v == 4),
                })
            } else {
                None
            };
            CmMessage::Req(CmReq {
                local_comm_id: ids.0,
                service_id,
                local_qpn: be24(m, 56),
                responder_resources: m[59],
                initiator_depth: m[63],
                starting_psn: Psn::new(be24(m, 68)),
                retry_count: m[71] & 0x7,
                rnr_retry_count: m[74] & 0x7,
                path_mtu: mtu_bytes(m[74] >> 4),
                local_ack_timeout: m[119] >> 3,
                local_gid: gid(m, 80),
                remote_gid: gid(m, 96),
                ip,
            })
        }
        attr::REP => CmMessage::Rep(CmRep {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            local_qpn: be24(m, 36),
            starting_psn: Psn::new(be24(m, 44)),
            responder_resources: m[48],
            initiator_depth: m[49],
            rnr_retry_count: m[51] >> 5,
        }),
        attr::RTU => CmMessage::Rtu {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
        },
        attr::REJ => CmMessage::Rej {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            reason: be16(m, 34),
        },
        attr::DREQ => CmMessage::Dreq {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            remote_qpn: be24(m, 32),
        },
        attr::DREP => CmMessage::Drep {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
        },
        other => CmMessage::Other { attr_id: other },
    })
}

/// A DREQ (disconnect request) MAD as `sender` would send it for the
/// connection it knows as `local_comm_id`, toward its peer, which knows it
/// as `remote_comm_id` and whose QP is `remote_qpn` (IBA 12.6.9, DREQ
/// layout: local comm ID, remote comm ID, remote QPN, private data). The
/// gateway sends it in the name of a lost twin's host: RDMA-CM
/// applications (rping, librdmacm, NVMe-oF) watch for the DISCONNECTED
/// event, and some (rping) ignore flushed completions.
pub fn dreq_mad(local_comm_id: u32, remote_comm_id: u32, remote_qpn: u32, tid: u64) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[0] = 1; // base version
    m[1] = MGMT_CLASS_CM;
    m[2] = 2; // class version
    m[3] = 0x03; // method: Send
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&attr::DREQ.to_be_bytes());
    m[24..28].copy_from_slice(&local_comm_id.to_be_bytes());
    m[28..32].copy_from_slice(&remote_comm_id.to_be_bytes());
    m[32..35].copy_from_slice(&remote_qpn.to_be_bytes()[1..]);
    m
}

/// The first bytes of a CM MAD of attribute `attr` (method Send).
fn cm_header(attr: u16, tid: u64, local_comm_id: u32, remote_comm_id: u32) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    m[0] = 1; // base version
    m[1] = MGMT_CLASS_CM;
    m[2] = 2; // class version
    m[3] = 0x03; // method: Send
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[24..28].copy_from_slice(&local_comm_id.to_be_bytes());
    m[28..32].copy_from_slice(&remote_comm_id.to_be_bytes());
    m
}

/// A REQ MAD with the fields the gateway learns a flow from (IBA 12.6.5):
/// the active side's QPN, the passive side's starting PSN, the path MTU
/// (bytes). The simulator's endpoints connect with it, as RDMA-CM would.
pub fn req_mad(local_comm_id: u32, local_qpn: u32, starting_psn: Psn, path_mtu: u16) -> [u8; 256] {
    let mut m = cm_header(attr::REQ, u64::from(local_comm_id), local_comm_id, 0);
    m[56..59].copy_from_slice(&local_qpn.to_be_bytes()[1..]);
    m[68..71].copy_from_slice(&starting_psn.value().to_be_bytes()[1..]);
    let code = (1..=5u8).find(|&c| mtu_bytes(c) == path_mtu).unwrap_or(0);
    m[74] = code << 4;
    m
}

/// The REP answering the REQ `remote_comm_id` (IBA 12.6.8): the passive
/// side's QPN and the active side's starting PSN.
pub fn rep_mad(
    local_comm_id: u32,
    remote_comm_id: u32,
    local_qpn: u32,
    starting_psn: Psn,
) -> [u8; 256] {
    let mut m = cm_header(
        attr::REP,
        u64::from(remote_comm_id),
        local_comm_id,
        remote_comm_id,
    );
    m[36..39].copy_from_slice(&local_qpn.to_be_bytes()[1..]);
    m[44..47].copy_from_slice(&starting_psn.value().to_be_bytes()[1..]);
    m
}

#[cfg(test)]
mod build_tests {
    use super::*;

    #[test]
    fn req_and_rep_parse_back_to_their_fields() {
        let m = req_mad(7, 0x100, Psn::new(0xABCDEF), 4096);
        let CmMessage::Req(r) = parse_mad(&m).unwrap() else {
            panic!("not a REQ")
        };
        assert_eq!(
            (r.local_comm_id, r.local_qpn, r.starting_psn, r.path_mtu),
            (7, 0x100, Psn::new(0xABCDEF), 4096)
        );
        let m = rep_mad(9, 7, 0x200, Psn::new(0x123456));
        let CmMessage::Rep(r) = parse_mad(&m).unwrap() else {
            panic!("not a REP")
        };
        assert_eq!(
            (
                r.local_comm_id,
                r.remote_comm_id,
                r.local_qpn,
                r.starting_psn
            ),
            (9, 7, 0x200, Psn::new(0x123456))
        );
    }
}
