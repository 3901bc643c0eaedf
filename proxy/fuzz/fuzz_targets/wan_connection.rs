//! Raw datagrams into a `WanConnection` that has a session with its twin,
//! in lab mode (no key: CRC tags, so the fuzzer also reaches the frame
//! parsers through forged protected packets) and keyed (AES-GCM or
//! ChaCha20-Poly1305: forgeries stop at authentication, HELLOs at their MAC).
//! Never a panic; a keyed connection never accepts a datagram its twin did
//! not produce.
//!
//! Input: byte 0 picks the mode; then operations, each an opcode byte and
//! its arguments: a raw datagram, a mutated copy of one the twin sent, a
//! packet with a valid lab-mode tag around fuzzed frames, or time passing.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../entries/wan_connection.rs"]
mod entry;

fuzz_target!(|data: &[u8]| entry::run(data));
