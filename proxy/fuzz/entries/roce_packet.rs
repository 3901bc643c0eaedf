//! Any bytes as an IP packet or Ethernet frame: parsing must never panic, and
//! whatever parses must re-emit to a packet that parses to the same thing.
//!
//! The body of the fuzz target `roce_packet`, shared with the corpus smoke test
//! (`proxy/tests/fuzz_corpus.rs`), so both run the same code.

use soya_proto::roce::{cm, ethernet_payload, icrc, is_roce, RocePacket};

pub fn run(data: &[u8]) {
    let _ = is_roce(data);
    let _ = icrc::compute(data);
    let _ = icrc::verify(data);
    for input in [Some(data), ethernet_payload(data).ok()]
        .into_iter()
        .flatten()
    {
        if let Ok(p) = RocePacket::parse(input) {
            let _ = p.verify_icrc();
            let _ = cm::parse_packet(&p);
            let repr = p.repr();
            let again = repr.to_vec(p.payload()).expect("a parsed packet re-emits");
            let q = RocePacket::parse_verified(&again).expect("re-emitted packet verifies");
            assert_eq!(q.repr(), repr);
            assert_eq!(q.payload(), p.payload());
        }
    }
}
