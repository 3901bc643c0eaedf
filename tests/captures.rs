//! Real kernel Soft-RoCE captures (shared/lab/sample*.pcap): every RoCE
//! packet must parse and verify, RDMA-CM must give the QPNs and PSNs that
//! the data packets then use, and the responder's MSN must follow the rule
//! the pseudo-ACK engine relies on.

#![deny(unsafe_code)]

use std::collections::HashMap;
use std::net::IpAddr;

use soya::roce::cm::{self, CmMessage};
use soya::roce::{is_roce, OpKind, Opcode, Psn, RocePacket};
use soya_integration_tests::{lab_captures, shared_dir};
use soya_tools::capture::read_frames;

/// All RoCE packets of a capture, parsed and verified.
fn packets(name: &str) -> Vec<Vec<u8>> {
    let path = shared_dir().join("lab").join(name);
    read_frames(&path)
        .unwrap()
        .into_iter()
        .filter_map(|f| f.ip.ok())
        .filter(|ip| is_roce(ip))
        .collect()
}

#[test]
fn every_roce_packet_parses_and_verifies() {
    let mut total = 0;
    for path in lab_captures() {
        let frames = read_frames(&path).unwrap();
        let mut n = 0;
        for f in &frames {
            let ip = f.ip.as_ref().expect("IP frame");
            if !is_roce(ip) {
                continue;
            }
            RocePacket::parse_verified(ip)
                .unwrap_or_else(|e| panic!("{} frame {}: {e}", path.display(), f.number));
            n += 1;
        }
        assert!(n > 50, "{}: only {n} RoCE packets", path.display());
        total += n;
    }
    assert!(total > 1000, "{total}");
}

#[test]
fn rping_cm_exchange_gives_the_qpns_and_psns_the_data_uses() {
    let pkts = packets("sample-rping.pcap");
    let mut req = None;
    let mut rep = None;
    let mut seen = Vec::new();
    let mut first_req_from: HashMap<IpAddr, (u32, Psn)> = HashMap::new();
    let mut ack_qpn_to: HashMap<IpAddr, u32> = HashMap::new();
    for ip in &pkts {
        let p = RocePacket::parse_verified(ip).unwrap();
        if cm::is_qp1_mad(&p) {
            let m = cm::parse_packet(&p).unwrap();
            seen.push(m);
            match m {
                CmMessage::Req(r) => req = Some((p.ip.src(), p.ip.dst(), r)),
                CmMessage::Rep(r) => rep = Some(r),
                _ => {}
            }
            continue;
        }
        if p.info.is_request() {
            first_req_from
                .entry(p.ip.src())
                .or_insert((p.bth.dest_qp, p.bth.psn));
        } else if p.bth.opcode == Opcode::RC_ACK {
            ack_qpn_to.entry(p.ip.dst()).or_insert(p.bth.dest_qp);
        }
    }
    let kinds: Vec<_> = seen
        .iter()
        .map(|m| match m {
            CmMessage::Req(_) => "REQ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu { .. } => "RTU",
            CmMessage::Dreq { .. } => "DREQ",
            CmMessage::Drep { .. } => "DREP",
            CmMessage::Rej { .. } => "REJ",
            CmMessage::Other { .. } => "other",
        })
        .collect();
    for k in ["REQ", "REP", "RTU", "DREQ"] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    let (active, passive, req) = req.expect("REQ");
    let rep = rep.expect("REP");
    assert_eq!(req.path_mtu, 1024);
    let cma = req.ip.expect("RDMA IP CM private data");
    assert_eq!((cma.src, cma.dst), (active, passive));

    // The active side sends to the QPN named in the REP, starting at the
    // REP's PSN; the passive side to the REQ's QPN, starting at the REQ's
    // PSN (Linux cm.c `cm_req_handler`: passive sq_psn = REQ StartingPSN).
    assert_eq!(first_req_from[&active], (rep.local_qpn, rep.starting_psn));
    assert_eq!(first_req_from[&passive], (req.local_qpn, req.starting_psn));
    assert_eq!(req.starting_psn, Psn::new(0x158a54));
    assert_eq!(rep.starting_psn, Psn::new(0x41b9eb));
    assert_eq!(ack_qpn_to[&active], req.local_qpn);
    assert_eq!(ack_qpn_to[&passive], rep.local_qpn);
    // The DREQ names the QP being torn down.
    assert!(seen
        .iter()
        .any(|m| matches!(m, CmMessage::Dreq { remote_qpn, .. }
        if *remote_qpn == req.local_qpn || *remote_qpn == rep.local_qpn)));
}

/// Per direction (destination address + QP): request PSNs advance by one per
/// packet, except where the requester went back (retransmission).
#[test]
fn request_psns_are_consecutive_per_qp() {
    for path in lab_captures() {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let mut next: HashMap<(IpAddr, u32), Psn> = HashMap::new();
        let mut checked = 0;
        for ip in packets(&name) {
            let p = RocePacket::parse_verified(&ip).unwrap();
            if !p.info.is_request() || !p.info.is_rc() {
                continue;
            }
            let key = (p.ip.dst(), p.bth.dest_qp);
            if let Some(&want) = next.get(&key) {
                assert!(
                    p.psn() == want || p.psn().before(want),
                    "{name}: PSN {} skips ahead of {}",
                    p.psn(),
                    want
                );
                checked += 1;
            }
            // A READ request consumes one PSN per response packet.
            let span = if p.info.kind == OpKind::ReadRequest {
                p.ext.reth.len.div_ceil(1024).max(1)
            } else {
                1
            };
            next.insert(key, p.psn().add(span));
        }
        assert!(checked > 20, "{name}: {checked}");
    }
}

/// The responder's MSN grows by one per completed message (last packet of a
/// SEND/WRITE, each READ and atomic): checked between consecutive ACKs in
/// the real captures. This is the rule pseudo-ACKs must follow.
#[test]
fn responder_msn_counts_completed_messages() {
    let mut pairs_checked = 0;
    for path in lab_captures() {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        // (requester addr, responder QPN) -> PSN -> completes a message?
        let mut completes: HashMap<(IpAddr, u32), HashMap<u32, bool>> = HashMap::new();
        // requester addr -> last (psn, msn) acked to it
        let mut last_ack: HashMap<IpAddr, (Psn, u32)> = HashMap::new();
        let mut responder_qp: HashMap<IpAddr, u32> = HashMap::new();
        for ip in packets(&name) {
            let p = RocePacket::parse_verified(&ip).unwrap();
            if !p.info.is_rc() {
                continue;
            }
            if p.info.is_request() {
                responder_qp.insert(p.ip.src(), p.bth.dest_qp);
                completes
                    .entry((p.ip.src(), p.bth.dest_qp))
                    .or_default()
                    .insert(p.psn().value(), p.info.completes_message());
                continue;
            }
            if p.bth.opcode != Opcode::RC_ACK {
                continue;
            }
            let requester = p.ip.dst();
            let msn = p.ext.aeth.unwrap().msn;
            let Some(&rqp) = responder_qp.get(&requester) else {
                continue;
            };
            if let Some((prev_psn, prev_msn)) = last_ack.get(&requester).copied() {
                let map = &completes[&(requester, rqp)];
                let span = p.psn().diff(prev_psn);
                let range: Option<u32> = (1..=span.max(0) as u32)
                    .map(|i| map.get(&prev_psn.add(i).value()).map(|c| u32::from(*c)))
                    .sum();
                if let Some(n) = range {
                    assert_eq!(
                        (msn.wrapping_sub(prev_msn)) & 0xFF_FFFF,
                        n,
                        "{name}: ACK psn {} msn {msn} after psn {prev_psn} msn {prev_msn}",
                        p.psn()
                    );
                    pairs_checked += 1;
                }
            }
            last_ack.insert(requester, (p.psn(), msn));
        }
    }
    assert!(pairs_checked > 30, "{pairs_checked}");
}
