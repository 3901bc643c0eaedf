//! Handshake messages (identity keys, Noise IKpsk2) into a client or a
//! server: raw, mutated and replayed INITIATIONs, RESPONSEs and probes.
//! Never a panic; never a session with anyone but the genuine twin; the
//! genuine twins connect once left alone. Body: `../entries/wan_handshake.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../entries/wan_handshake.rs"]
mod entry;

fuzz_target!(|data: &[u8]| entry::run(data));
