//! Any bytes as what the WAN transport parses: the cleartext header and the
//! HELLO body (before authentication), the frames of a decrypted payload and
//! a twin message (after it). Never a panic; whatever parses re-encodes to
//! what parses to the same thing (header, HELLO and messages byte for byte:
//! their encodings are fixed-width).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../entries/wan_frames.rs"]
mod entry;

fuzz_target!(|data: &[u8]| entry::run(data));
