//! Any bytes as an RDMA-CM MAD: never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../entries/cm_mad.rs"]
mod entry;

fuzz_target!(|data: &[u8]| entry::run(data));
