//! Any text as a site configuration: an error or a config, never a panic.
//!
//! The body of the fuzz target `site_config`, shared with the corpus smoke test
//! (`proxy/tests/fuzz_corpus.rs`), so both run the same code.

pub fn run(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(cfg) = soya_config::parse_str(text, "fuzz.toml") {
            let _ = cfg.explain();
        }
    }
}
