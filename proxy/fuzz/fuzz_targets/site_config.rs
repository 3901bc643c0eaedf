//! Any text as a site configuration: an error or a config, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(cfg) = soya_config::parse_str(text, "fuzz.toml") {
            let _ = cfg.explain();
        }
    }
});
