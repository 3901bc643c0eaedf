//! Any bytes as what the WAN transport parses: the cleartext header and the
//! HELLO body (before authentication), the frames of a decrypted payload and
//! a twin message (after it). Never a panic; whatever parses re-encodes to
//! what parses to the same thing (header, HELLO and messages byte for byte:
//! their encodings are fixed-width).
//!
//! The body of the fuzz target `wan_frames`, shared with the corpus smoke test
//! (`proxy/tests/fuzz_corpus.rs`), so both run the same code.

use soya_proto::wan::msg;
use soya_proto::wan::packet::{
    check_frames, Frame, Header, Hello, Writer, HEADER_LEN, HELLO_BODY_LEN,
};

pub fn run(data: &[u8]) {
    if let Ok(h) = Header::decode(data) {
        let mut out = [0u8; HEADER_LEN];
        h.encode(&mut out);
        assert_eq!(&out[..], &data[..HEADER_LEN]);
    }
    if let Ok(h) = Hello::decode(data) {
        let mut out = [0u8; HELLO_BODY_LEN];
        h.encode(&mut out);
        assert_eq!(&out[..], data);
    }
    if let Ok(m) = msg::decode(data) {
        assert_eq!(msg::encode(&m), data);
        assert_eq!(msg::encoded_len(&m), data.len());
    }
    let Ok((frames, eliciting)) = check_frames(data) else {
        return;
    };
    let mut any = false;
    // Varints re-encode minimally: never longer than they came.
    let mut buf = vec![0u8; data.len() + 16];
    for f in frames {
        any |= f.ack_eliciting();
        let mut w = Writer::new(&mut buf);
        assert!(f.encode(&mut w), "a parsed frame re-encodes: {f:?}");
        let n = w.len();
        let (mut again, _) = check_frames(&buf[..n]).expect("a re-encoded frame parses");
        let g = again.next().expect("one frame");
        assert!(again.next().is_none());
        match (&f, &g) {
            // The ranges, not the bytes (non-minimal varints re-encode shorter).
            (Frame::Ack(a), Frame::Ack(b)) => {
                assert_eq!(
                    (a.path, a.delay_us, a.largest()),
                    (b.path, b.delay_us, b.largest())
                );
                assert!(a.ranges().eq(b.ranges()));
                let mut lo = u64::MAX;
                for (l, h) in a.ranges() {
                    assert!(l <= h && (lo == u64::MAX || h + 1 < lo));
                    lo = l;
                }
            }
            _ => assert_eq!(f, g),
        }
        if let Frame::Data(d) = f {
            if d.frag_off == 0 && d.bytes.len() == d.total as usize {
                let _ = msg::decode(d.bytes);
            }
        }
    }
    assert_eq!(any, eliciting);
}
