//! The ICRC vectors of shared/protocol/vectors.pcap (mkpcap.py): a real
//! ConnectX-4 Lx CNP and three gateway-generated packets that our builders
//! must reproduce byte for byte.

#![deny(unsafe_code)]

use std::net::Ipv4Addr;

use soya::roce::builders::{self, ReplyTo};
use soya::roce::{IpHeader, NakCode, Opcode, Psn, RocePacket};
use soya_integration_tests::shared_dir;
use soya_tools::capture::read_frames;

fn frames() -> Vec<Vec<u8>> {
    read_frames(&shared_dir().join("protocol/vectors.pcap"))
        .unwrap()
        .into_iter()
        .map(|f| f.ip.unwrap())
        .collect()
}

#[test]
fn every_vector_verifies() {
    let f = frames();
    assert_eq!(f.len(), 4);
    for (i, ip) in f.iter().enumerate() {
        RocePacket::parse_verified(ip).unwrap_or_else(|e| panic!("frame {}: {e}", i + 1));
    }
    let cnp = RocePacket::parse_verified(&f[0]).unwrap();
    assert_eq!(cnp.bth.opcode, Opcode::CNP);
    assert_eq!(cnp.icrc.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
}

#[test]
fn builders_reproduce_ack_nak_and_rnr_frames() {
    let f = frames();
    let to = ReplyTo {
        ip: IpHeader::v4(Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 1)),
        src_port: 0xc123,
        dest_qp: 0x11,
    };
    let ack = builders::ack(&to, Psn::new(0x123456), 7);
    let nak = builders::nak(&to, Psn::new(0x123400), NakCode::PsnSequenceError, 7);
    let rnr = builders::rnr_nak(&to, Psn::new(0x123400), 14, 7);
    assert_eq!(ack.to_vec(&[]).unwrap(), f[1]);
    assert_eq!(nak.to_vec(&[]).unwrap(), f[2]);
    assert_eq!(rnr.to_vec(&[]).unwrap(), f[3]);
}
