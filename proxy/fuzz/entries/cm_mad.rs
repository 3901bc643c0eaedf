//! Any bytes as an RDMA-CM MAD: never a panic.
//!
//! The body of the fuzz target `cm_mad`, shared with the corpus smoke test
//! (`proxy/tests/fuzz_corpus.rs`), so both run the same code.

pub fn run(data: &[u8]) {
    let _ = soya_proto::roce::cm::parse_mad(data);
}
