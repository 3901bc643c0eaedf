//! Round trips and refusals of the WAN wire format, one test per thing on
//! the wire (header, HELLO, frames, varints), with the byte-level cases
//! that must be refused.

use super::super::cipher::CipherOffer;
use super::frames::{T_ACK, T_CLOSE, T_DATA, T_DATAGRAM, T_FIN};
use super::*;

/// Encoded size of a varint.
fn varint_len(v: u64) -> usize {
    if v < 1 << 6 {
        1
    } else if v < 1 << 14 {
        2
    } else if v < 1 << 30 {
        4
    } else {
        8
    }
}

fn roundtrip(f: Frame<'_>) {
    let mut buf = [0u8; 512];
    let mut w = Writer::new(&mut buf);
    assert!(f.encode(&mut w));
    let n = w.len();
    let parsed = parse_frames(&buf[..n]).expect("parses");
    assert_eq!(parsed, vec![f]);
}

#[test]
fn frames_round_trip() {
    roundtrip(Frame::Ping);
    let ranges = [(90, 100), (50, 80), (0, 0)];
    let mut buf = [0u8; 64];
    let mut w = Writer::new(&mut buf);
    assert!(encode_ack(&mut w, 3, 250, ranges.into_iter()));
    let n = w.len();
    match parse_frames(&buf[..n]).expect("parses")[..] {
        [Frame::Ack(a)] => {
            assert_eq!((a.path, a.delay_us, a.largest()), (3, 250, 100));
            assert_eq!(a.ranges().collect::<Vec<_>>(), ranges);
            roundtrip(Frame::Ack(a));
        }
        ref other => panic!("{other:?}"),
    }
    roundtrip(Frame::Data(DataFrame {
        flow: u64::MAX,
        seq: 7,
        offset: 1 << 40,
        total: 5000,
        frag_off: 1300,
        bytes: b"hello",
    }));
    roundtrip(Frame::Credit {
        flow: 9,
        max_offset: 1 << 33,
    });
    roundtrip(Frame::Datagram(DatagramFrame {
        id: 1,
        total: 3,
        frag_off: 0,
        bytes: b"abc",
    }));
    roundtrip(Frame::Close {
        code: 2,
        reason: b"bye",
    });
    roundtrip(Frame::Fin {
        flow: 1 << 40,
        seq: 1 << 35,
    });
    assert_eq!(
        parse_frames(&[T_FIN, 0, 0, 0, 0, 0, 0, 0, 9]),
        Err(FrameError::Truncated {
            frame: "FIN",
            field: "sequence number"
        })
    );
}

#[test]
fn header_round_trip_and_rejects() {
    let h = Header {
        kind: PacketKind::Protected,
        insecure: false,
        client: true,
        key_phase: true,
        path: 2,
        conn_id: 0xdead_beef,
        generation: 77,
        pn: MAX_PN,
    };
    let mut b = [0u8; HEADER_LEN];
    h.encode(&mut b);
    assert_eq!(Header::decode(&b), Ok(h));
    let mut bad = b;
    bad[0] = 1;
    assert_eq!(
        Header::decode(&bad),
        Err(HeaderError::Version(1)),
        "version 1 (no cipher offer)"
    );
    bad[0] = 2;
    assert_eq!(
        Header::decode(&bad),
        Err(HeaderError::Version(2)),
        "version 2 (flows never retired: DATA of a closed id would open a new flow)"
    );
    bad[0] = 3;
    assert_eq!(
        Header::decode(&bad),
        Err(HeaderError::Version(3)),
        "version 3 (no key phase: bit 2 was reserved)"
    );
    bad[0] = 4;
    assert_eq!(
        Header::decode(&bad),
        Err(HeaderError::Version(4)),
        "version 4 (no identity-key handshake)"
    );
    assert_eq!(b[1] & 0b100, 0b100, "key phase is bit 2");
    let mut phase0 = h;
    phase0.key_phase = false;
    let mut b0 = [0u8; HEADER_LEN];
    phase0.encode(&mut b0);
    assert_eq!(Header::decode(&b0), Ok(phase0));
    assert_eq!(b0[1] | 0b100, b[1], "only the phase bit differs");
    // A HELLO never has a key phase: encoding drops it, decoding refuses it.
    let hello = Header {
        kind: PacketKind::Hello,
        ..h
    };
    let mut hb = [0u8; HEADER_LEN];
    hello.encode(&mut hb);
    assert_eq!(hb[1] & 0b100, 0);
    hb[1] |= 0b100;
    assert_eq!(Header::decode(&hb), Err(HeaderError::HelloKeyPhase));
    let mut bad = b;
    bad[1] |= 0b0010_0000;
    assert_eq!(Header::decode(&bad), Err(HeaderError::ReservedFlags(0x20)));
    let mut bad = b;
    bad[1] |= 0b11;
    assert_eq!(Header::decode(&bad), Err(HeaderError::Kind(3)));
    let mut bad = b;
    bad[3] = 9;
    assert_eq!(Header::decode(&bad), Err(HeaderError::ReservedByte(9)));
    let mut bad = b;
    bad[16] |= 0x80;
    assert!(
        matches!(Header::decode(&bad), Err(HeaderError::PacketNumber(_))),
        "pn top bits"
    );
    assert_eq!(
        Header::decode(&b[..HEADER_LEN - 1]),
        Err(HeaderError::Truncated("packet number"))
    );
    assert_eq!(Header::decode(&[]), Err(HeaderError::Truncated("version")));
    assert_eq!(
        HeaderError::Truncated("generation").to_string(),
        "datagram truncated at the header's generation (24 bytes needed)"
    );
}

#[test]
fn hello_round_trip_with_offer() {
    let h = Hello {
        nonce: 5,
        echo: 6,
        flow_window: 1 << 23,
        max_datagram: 8952,
        committed: true,
        offer: CipherOffer {
            accept: 0b11,
            prefer: 2,
        },
    };
    let mut b = [0u8; HELLO_BODY_LEN];
    h.encode(&mut b);
    assert_eq!(&b[28..], &[0b11, 2]);
    assert_eq!(Hello::decode(&b), Ok(h));
    assert_eq!(
        Hello::decode(&b[..28]),
        Err(HelloError::Length(28)),
        "version 1 body"
    );
    let mut bad = b;
    bad[27] = 2;
    assert_eq!(Hello::decode(&bad), Err(HelloError::Flags(2)));
    let mut bad = b;
    bad[..8].fill(0);
    assert_eq!(Hello::decode(&bad), Err(HelloError::ZeroNonce));
    assert_eq!(HELLO_LEN, 70);
}

#[test]
fn malformed_frames_rejected() {
    use FrameError::*;
    // Unknown type, truncated varint, fragment beyond the message, ACK
    // range below zero, too many ranges.
    assert_eq!(parse_frames(&[0x7f]), Err(UnknownType(0x7f)));
    assert_eq!(
        parse_frames(&[T_DATA, 0, 0]),
        Err(Truncated {
            frame: "DATA",
            field: "flow id"
        })
    );
    let mut buf = [0u8; 64];
    let mut w = Writer::new(&mut buf);
    assert!(w.u8(T_DATA) && w.u64(1) && w.varint(0) && w.varint(0));
    assert!(w.varint(2) && w.varint(1) && w.varint(2) && w.bytes(b"xy"));
    let n = w.len();
    assert_eq!(
        parse_frames(&buf[..n]),
        Err(Fragment {
            frame: "DATA",
            frag_off: 1,
            len: 2,
            total: 2
        }),
        "fragment past total"
    );
    // A length that promises more than the packet holds.
    let lying = &buf[..n - 1];
    assert_eq!(
        parse_frames(lying),
        Err(LyingLength {
            frame: "DATA",
            len: 2,
            left: 1
        })
    );
    assert_eq!(parse_frames(&[T_ACK, 0, 5, 0, 0, 6]), Err(AckBelowZero(0)));
    assert_eq!(
        parse_frames(&[T_ACK, 0, 5, 0, 1, 1, 3, 0]),
        Err(AckBelowZero(1))
    );
    assert_eq!(
        parse_frames(&[T_ACK, 0, 5, 0, 40, 0]),
        Err(TooManyRanges(40))
    );
    let mut close = vec![T_CLOSE, 0, 0x41, 0x01];
    close.extend([b'x'; 257]);
    assert_eq!(parse_frames(&close), Err(ReasonTooLong(257)));
    // DATAGRAM total length past u32.
    let mut buf = [0u8; 64];
    let mut w = Writer::new(&mut buf);
    assert!(w.u8(T_DATAGRAM) && w.varint(1) && w.varint(1 << 33));
    let n = w.len();
    assert_eq!(
        parse_frames(&buf[..n]),
        Err(TooLarge {
            frame: "DATAGRAM",
            field: "total length",
            value: 1 << 33
        })
    );
    assert_eq!(parse_frames(&[0, 0, 0]), Ok(vec![]), "padding only");
    assert_eq!(UnknownType(0x7f).to_string(), "unknown frame type 0x7f");
    assert_eq!(
        LyingLength {
            frame: "DATA",
            len: 2,
            left: 1
        }
        .to_string(),
        "DATA frame says 2 bytes, 1 left in the packet"
    );
}

#[test]
fn varint_boundaries() {
    for v in [0, 63, 64, 16383, 16384, (1 << 30) - 1, 1 << 30, MAX_VARINT] {
        let mut buf = [0u8; 8];
        let mut w = Writer::new(&mut buf);
        assert!(w.varint(v));
        assert_eq!(w.len(), varint_len(v));
        let n = w.len();
        assert_eq!(Reader::new(&buf[..n]).varint(), Some(v));
    }
    let mut buf = [0u8; 8];
    assert!(!Writer::new(&mut buf).varint(MAX_VARINT + 1));
}
