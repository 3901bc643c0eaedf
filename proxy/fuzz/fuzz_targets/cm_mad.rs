//! Any bytes as an RDMA-CM MAD: never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = soya::roce::cm::parse_mad(data);
});
