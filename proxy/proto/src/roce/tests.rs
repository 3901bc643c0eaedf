//! Packet-level tests of the codec: known vectors, build → parse round trips
//! for every opcode, and hostile input.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::builders::{self, ReplyTo};
use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// ConnectX-4 Lx CNP (scapy contrib/roce.uts): real hardware, ICRC 82fd002a.
const CNP_CX4: &str = "e41d2dab2bc27cfe90643b32080045c2003c718c400040119161 0a0011010a001201
    000012b700280000 8100ffff40000118 00000000 00000000000000000000000000000000 82fd002a";
/// Third-party driver capture, RC WRITE ONLY with 16 B payload, ICRC ca47470e.
const WRITE_ONLY: &str = "123456789abc7cb27d62c1ef0800 4500004c000100004011f54cc0a80201c0a80202
    01f412b70038ffa6 0a00ffff0000000200000000 00000000000012300000000000000010
    000102030405060708090a0b0c0d0e0f ca47470e";
/// ACK from a third-party example whose ICRC is a placeholder: must fail.
const BAD_ACK: &str = "241c04f325d7123456789abc0800 45000030000040004011b569c0a80202c0a80201
    12b71f40001c0000 1100ffff0000000200000000 00000000 392aa6c7";
/// vectors.pcap frame 2: a generated pseudo-ACK (mkpcap.py).
const PSEUDO_ACK: &str = "02000000000a02000000000b0800 4500003000004000401126bb0a0000020a000001
    c12312b7001c0000 1100ffff00000011 00123456 1f000007 28d60464";

#[test]
fn cnp_from_connectx4_verifies() {
    let f = hex(CNP_CX4);
    let p = RocePacket::parse_verified(ethernet_payload(&f).unwrap()).unwrap();
    assert_eq!(p.bth.opcode, Opcode::CNP);
    assert!(p.bth.becn);
    assert_eq!(p.bth.dest_qp, 0x118);
    assert_eq!(p.icrc.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
    assert_eq!(p.ip.tos(), 0xC2);
}

#[test]
fn write_only_capture_verifies_and_decodes() {
    let f = hex(WRITE_ONLY);
    let p = RocePacket::parse_verified(ethernet_payload(&f).unwrap()).unwrap();
    assert_eq!(p.bth.opcode, Opcode::RC_WRITE_ONLY);
    assert_eq!(p.bth.dest_qp, 2);
    assert_eq!(p.ext.reth.len, 16);
    assert_eq!(p.ext.reth.va, 0x1230);
    assert_eq!(p.payload(), &(0u8..16).collect::<Vec<_>>()[..]);
    assert_eq!(p.icrc.to_le_bytes(), [0xca, 0x47, 0x47, 0x0e]);
}

#[test]
fn known_bad_ack_fails_verification() {
    let f = hex(BAD_ACK);
    let ip = ethernet_payload(&f).unwrap();
    // Its ICRC is wrong ...
    assert!(matches!(
        icrc::verify(ip),
        Err(WireError::BadIcrc {
            found: 0xc7a62a39,
            ..
        })
    ));
    // ... and its UDP ports are swapped (source 4791, destination 8000), so a
    // receiver rejects it even before the ICRC check.
    assert_eq!(
        RocePacket::parse(ip).unwrap_err(),
        WireError::NotRocePort(8000)
    );
    // With the ports put right, the ICRC failure is what remains.
    let mut fixed = ip.to_vec();
    fixed[20..24].copy_from_slice(&[0x1f, 0x40, 0x12, 0xb7]);
    assert!(RocePacket::parse(&fixed).is_ok());
    assert!(matches!(
        RocePacket::parse_verified(&fixed),
        Err(WireError::BadIcrc { .. })
    ));
}

#[test]
fn builder_reproduces_the_generated_pseudo_ack_exactly() {
    let f = hex(PSEUDO_ACK);
    let to = ReplyTo {
        ip: IpHeader::v4(Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 1)),
        src_port: 0xc123,
        dest_qp: 0x11,
    };
    let built = builders::ack(&to, Psn::new(0x123456), 7)
        .to_vec(&[])
        .unwrap();
    assert_eq!(built, &f[14..]);
}

#[test]
fn every_bit_flip_in_covered_bytes_breaks_the_icrc() {
    let f = hex(WRITE_ONLY);
    let ip = ethernet_payload(&f).unwrap().to_vec();
    let masked = [1usize, 8, 10, 11, 26, 27, 32]; // TOS, TTL, IP csum, UDP csum, BTH byte 4
    for byte in 0..ip.len() - 4 {
        let mut m = ip.clone();
        m[byte] ^= 0x01;
        let r = icrc::verify(&m);
        if masked.contains(&byte) {
            assert!(r.is_ok(), "byte {byte} is masked");
        } else {
            assert!(r.is_err(), "byte {byte} is covered");
        }
    }
}

/// The one-line form traces and test failures print (`Display`): opcode,
/// addresses, QP, PSN, ` A` with AckReq, the AETH when there is one.
#[test]
fn a_packet_prints_as_one_trace_line() {
    let f = hex(WRITE_ONLY);
    let mut v = ethernet_payload(&f).unwrap().to_vec();
    let p = RocePacket::parse(&v).unwrap();
    let line = format!("{} 192.168.2.1->192.168.2.2 qp 0x2 psn 0", p.info.name);
    assert_eq!(p.to_string(), line);
    assert!(set_ack_req(&mut v).unwrap());
    assert_eq!(RocePacket::parse(&v).unwrap().to_string(), line + " A");
    let f = hex(PSEUDO_ACK);
    let p = RocePacket::parse(ethernet_payload(&f).unwrap()).unwrap();
    let syndrome = p.ext.aeth.unwrap().syndrome;
    assert_eq!(
        p.to_string(),
        format!(
            "{} 10.0.0.2->10.0.0.1 qp 0x11 psn 1193046 {syndrome:?} msn 7",
            p.info.name
        )
    );
}

#[test]
fn builders_make_valid_naks_rnrs_and_cnps() {
    let to = ReplyTo {
        ip: IpHeader::v4(Ipv4Addr::new(10, 0, 2, 1), Ipv4Addr::new(10, 0, 1, 1)),
        src_port: 0xd000,
        dest_qp: 0x11,
    };
    let cases = [
        (
            builders::nak(&to, Psn::new(5), NakCode::PsnSequenceError, 3),
            Syndrome::Nak(NakCode::PsnSequenceError),
        ),
        (
            builders::nak(&to, Psn::new(5), NakCode::RemoteAccessError, 3),
            Syndrome::Nak(NakCode::RemoteAccessError),
        ),
        (
            builders::nak(&to, Psn::new(5), NakCode::InvalidRequest, 3),
            Syndrome::Nak(NakCode::InvalidRequest),
        ),
        (
            builders::nak(&to, Psn::new(5), NakCode::RemoteOperationalError, 3),
            Syndrome::Nak(NakCode::RemoteOperationalError),
        ),
        (
            builders::rnr_nak(&to, Psn::new(5), 14, 3),
            Syndrome::RnrNak { timer: 14 },
        ),
    ];
    for (repr, syn) in cases {
        let v = repr.to_vec(&[]).unwrap();
        let p = RocePacket::parse_verified(&v).unwrap();
        assert_eq!(p.ext.aeth.unwrap().syndrome, syn);
        assert_eq!(p.ext.aeth.unwrap().msn, 3);
        assert_eq!(p.psn(), Psn::new(5));
        assert_eq!(p.ip.src(), Ipv4Addr::new(10, 0, 2, 1));
    }
    let v = builders::cnp(&to).to_vec(&[]).unwrap();
    let p = RocePacket::parse_verified(&v).unwrap();
    assert_eq!(p.bth.opcode, Opcode::CNP);
    assert!(p.bth.becn);
    assert_eq!(v.len(), 20 + 8 + 12 + 16 + 4);
}

#[test]
fn ipv6_packets_round_trip_and_carry_a_udp_checksum() {
    let mut ip = IpHeader::v6(
        "fd00::1".parse::<Ipv6Addr>().unwrap(),
        "fd00::2".parse().unwrap(),
    );
    if let IpHeader::V6(h) = &mut ip {
        h.traffic_class = 0x68;
        h.flow_label = 0x12345;
    }
    let repr = RoceRepr {
        ip,
        src_port: 0xc001,
        bth: Bth::new(Opcode::RC_SEND_ONLY, 0x77, Psn::new(9)),
        ext: ExtHeaders::default(),
    };
    let v = repr.to_vec(b"hello").unwrap();
    let p = RocePacket::parse_verified(&v).unwrap();
    assert_eq!(p.payload(), b"hello");
    assert_eq!(p.repr(), repr);
    assert_ne!(&v[46..48], &[0, 0], "UDP checksum filled in");
    // Rewriting traffic class / flow label / hop limit keeps the ICRC valid.
    let mut w = v.clone();
    w[0] = 0x6F;
    w[1] = 0xFF;
    w[7] = 1;
    assert!(icrc::verify(&w).is_ok());
    // The IPv6 UDP checksum must cover the ICRC.
    assert!(udp6_sum_ok(&v));
}

#[test]
fn emit_refuses_headers_that_disagree_with_the_table() {
    let repr = RoceRepr {
        ip: IpHeader::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST),
        src_port: 1,
        bth: Bth::new(Opcode::RC_WRITE_ONLY, 1, Psn::new(0)),
        ext: ExtHeaders::default(), // missing RETH
    };
    assert!(matches!(
        repr.to_vec(&[]),
        Err(WireError::HeaderMismatch { .. })
    ));
    let read = RoceRepr {
        bth: Bth::new(Opcode::RC_READ_REQUEST, 1, Psn::new(0)),
        ext: ExtHeaders {
            present: Headers::RETH,
            ..Default::default()
        },
        ..repr
    };
    assert!(matches!(
        read.to_vec(b"x"),
        Err(WireError::UnexpectedPayload { .. })
    ));
    let mut small = [0u8; 10];
    assert!(matches!(
        read.emit(&[], &mut small),
        Err(WireError::BufferTooSmall { .. })
    ));
}

#[test]
fn parse_rejects_bad_packets_with_typed_errors() {
    let to = ReplyTo {
        ip: IpHeader::v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)),
        src_port: 7,
        dest_qp: 3,
    };
    let good = builders::ack(&to, Psn::new(1), 1).to_vec(&[]).unwrap();

    let mut v = good.clone();
    v[28] = 0x15; // unassigned opcode
    assert_eq!(
        RocePacket::parse(&v).unwrap_err(),
        WireError::UnknownOpcode(0x15)
    );
    let mut v = good.clone();
    v[29] |= 0x01; // TVer 1
    assert_eq!(RocePacket::parse(&v).unwrap_err(), WireError::BthVersion(1));
    let mut v = good.clone();
    v[23] = 0xB8; // dst port 4792
    assert!(matches!(
        RocePacket::parse(&v),
        Err(WireError::NotRocePort(4792))
    ));
    let mut v = good.clone();
    v[25] += 4; // UDP length lies
    assert!(matches!(
        RocePacket::parse(&v),
        Err(WireError::UdpLength { .. })
    ));
    let mut v = good.clone();
    v[9] = 6; // TCP
    assert_eq!(RocePacket::parse(&v).unwrap_err(), WireError::NotUdp(6));
    let mut v = good.clone();
    v[29] |= 0x30; // pad 3 on a packet with no payload
    assert!(matches!(
        RocePacket::parse(&v),
        Err(WireError::PadCount { .. })
    ));
    let mut v = good.clone();
    v[40] ^= 1; // AETH syndrome changed, ICRC not
    assert!(RocePacket::parse(&v).is_ok());
    assert!(matches!(
        RocePacket::parse_verified(&v),
        Err(WireError::BadIcrc { .. })
    ));
    for n in 0..good.len() {
        assert!(RocePacket::parse(&good[..n]).is_err(), "truncated to {n}");
    }
    // Ethernet padding after the IP packet is ignored.
    let mut padded = good.clone();
    padded.extend_from_slice(&[0; 6]);
    assert_eq!(
        RocePacket::parse_verified(&padded).unwrap().as_bytes(),
        &good[..]
    );
}

/// A strategy for every opcode in the table with random header contents.
fn any_repr() -> impl Strategy<Value = (RoceRepr, Vec<u8>)> {
    let opcodes: Vec<Opcode> = opcode::TABLE.iter().map(|r| Opcode(r.code)).collect();
    (
        prop::sample::select(opcodes),
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        any::<(u16, u32, u32, bool, bool, bool, bool, bool)>(),
        any::<(u64, u32, u32, u64, u64, u32, u32, u8)>(),
        prop::collection::vec(any::<u8>(), 0..300),
        any::<bool>(),
    )
        .prop_map(|(op, s, d, b, e, payload, v6)| {
            let info = op.info().unwrap();
            let ip = if v6 {
                let mut src = [0u8; 16];
                src[12..].copy_from_slice(&s);
                let mut dst = [0u8; 16];
                dst[12..].copy_from_slice(&d);
                IpHeader::v6(src.into(), dst.into())
            } else {
                IpHeader::v4(s.into(), d.into())
            };
            let mut bth = Bth::new(op, b.1, Psn::new(b.2));
            bth.solicited = b.3;
            bth.mig_req = b.4;
            bth.fecn = b.5;
            bth.becn = b.6;
            bth.ack_req = b.7;
            let syn = Syndrome::from_byte(e.7 & 0x7F);
            let ext = ExtHeaders {
                present: info.headers,
                deth: Deth {
                    qkey: e.1,
                    src_qp: e.2 & 0xFF_FFFF,
                },
                feth: e.5,
                reth: Reth {
                    va: e.0,
                    rkey: e.1,
                    len: e.2,
                },
                atomic: AtomicEth {
                    va: e.0,
                    rkey: e.1,
                    swap_add: e.3,
                    compare: e.4,
                },
                aeth: info.headers.contains(Headers::AETH).then_some(Aeth {
                    syndrome: syn,
                    msn: e.6 & 0xFF_FFFF,
                }),
                atomic_ack: e.4,
                imm: e.5,
                ieth: e.6,
            };
            let keep = |h: Headers| info.headers.contains(h);
            let ext = ExtHeaders {
                deth: if keep(Headers::DETH) {
                    ext.deth
                } else {
                    Deth::default()
                },
                feth: if keep(Headers::FETH) { ext.feth } else { 0 },
                reth: if keep(Headers::RETH) {
                    ext.reth
                } else {
                    Reth::default()
                },
                atomic: if keep(Headers::ATOMIC_ETH) {
                    ext.atomic
                } else {
                    AtomicEth::default()
                },
                atomic_ack: if keep(Headers::ATOMIC_ACK_ETH) {
                    ext.atomic_ack
                } else {
                    0
                },
                imm: if keep(Headers::IMM_DT) { ext.imm } else { 0 },
                ieth: if keep(Headers::IETH) { ext.ieth } else { 0 },
                ..ext
            };
            let payload = match info.payload {
                opcode::Payload::None => Vec::new(),
                opcode::Payload::Fixed(n) => payload
                    .into_iter()
                    .chain(std::iter::repeat(7))
                    .take(n)
                    .collect(),
                opcode::Payload::Data => payload,
            };
            let repr = RoceRepr {
                ip,
                src_port: b.0,
                bth,
                ext,
            };
            (repr, payload)
        })
}

/// The UDP checksum of an IPv6 packet verifies (one's complement sum 0xFFFF).
fn udp6_sum_ok(v: &[u8]) -> bool {
    let mut acc: u32 = 0;
    for c in v[8..40].chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    acc += (v.len() - 40) as u32 + 17;
    for c in v[40..].chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc == 0xFFFF
}

#[test]
fn set_ack_req_asks_for_an_ack_and_keeps_the_packet_valid() {
    for ip in [
        IpHeader::v4(Ipv4Addr::new(10, 0, 1, 1), Ipv4Addr::new(10, 0, 2, 1)),
        IpHeader::v6("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()),
    ] {
        let repr = RoceRepr {
            ip,
            src_port: 0xc001,
            bth: Bth::new(Opcode::RC_WRITE_MIDDLE, 0x12, Psn::new(0xFF_FFFF)),
            ext: ExtHeaders::default(),
        };
        let mut v = repr.to_vec(&[7u8; 1024]).unwrap();
        let before = v.clone();
        assert!(set_ack_req(&mut v).unwrap());
        let p = RocePacket::parse_verified(&v).unwrap();
        assert!(p.bth.ack_req);
        let mut want = repr;
        want.bth.ack_req = true;
        assert_eq!(p.repr(), want);
        assert_eq!(p.payload(), &[7u8; 1024][..]);
        // Only the AckReq bit, the ICRC and (IPv6) the UDP checksum changed.
        let bth8 = v.len() - 4 - 1024 - 12 + 8;
        let changed: Vec<usize> = (0..v.len()).filter(|&i| v[i] != before[i]).collect();
        assert!(
            changed.iter().all(|&i| i == bth8
                || i >= v.len() - 4
                || (ip.len() + 6..ip.len() + 8).contains(&i)),
            "{changed:?}"
        );
        if let IpHeader::V6(_) = ip {
            assert!(udp6_sum_ok(&v));
        }
        // Already set: nothing to do.
        let again = v.clone();
        assert!(!set_ack_req(&mut v).unwrap());
        assert_eq!(v, again);
    }
    assert!(set_ack_req(&mut [0x45, 0, 0]).is_err());
}

proptest! {
    #[test]
    fn build_then_parse_round_trips_every_opcode((repr, payload) in any_repr()) {
        let v = repr.to_vec(&payload).unwrap();
        let p = RocePacket::parse_verified(&v).unwrap();
        prop_assert_eq!(p.repr(), repr);
        prop_assert_eq!(p.payload(), &payload[..]);
        prop_assert_eq!(v.len(), repr.buffer_len(payload.len()));
        prop_assert_eq!(v.len() % 4, (repr.ip.len() + 8) % 4);
    }

    #[test]
    fn parse_never_panics_on_mutations((repr, payload) in any_repr(), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let mut v = repr.to_vec(&payload).unwrap();
        for (at, x) in flips {
            let n = v.len();
            v[at % n] ^= x;
        }
        let n = v.len();
        v.truncate(n - cut % 8);
        if let Ok(p) = RocePacket::parse(&v) {
            let _ = p.verify_icrc();
            let _ = p.payload();
            let _ = cm::parse_packet(&p);
        }
        let _ = is_roce(&v);
    }

    #[test]
    fn parse_never_panics_on_noise(v in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = RocePacket::parse(&v);
        let _ = ethernet_payload(&v);
        let _ = cm::parse_mad(&v);
        let _ = icrc::compute(&v);
    }
}
