//! Any bytes as an IP packet or Ethernet frame: parsing must never panic, and
//! whatever parses must re-emit to a packet that parses to the same thing.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../entries/roce_packet.rs"]
mod entry;

fuzz_target!(|data: &[u8]| entry::run(data));
