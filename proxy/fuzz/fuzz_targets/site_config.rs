//! Any text as a site configuration: an error or a config, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../entries/site_config.rs"]
mod entry;

fuzz_target!(|data: &[u8]| entry::run(data));
