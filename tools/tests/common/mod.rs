//! Helpers shared by the tools' integration tests (`mod common;`): the
//! workspace's binaries, and network namespaces with the processes and
//! sockets in them (root only; the namespace primitives live in
//! `soya_tools::netns`, shared with `soya demo --netns`; the wrappers here
//! panic, as tests should). Not every test file uses every helper.
#![allow(dead_code)]

use std::path::PathBuf;

#[allow(unused_imports)]
pub use soya_tools::netns::{ip, net_sysctl, netns_missing, run, Netns, Proc};

/// `soya` belongs to another package: it is looked up next to this
/// package's `soya-perf` (a workspace build puts them side by side).
pub fn soya_binary() -> Option<PathBuf> {
    let perf = PathBuf::from(env!("CARGO_BIN_EXE_soya-perf"));
    let soya = perf.parent()?.join("soya");
    soya.is_file().then_some(soya)
}

/// `SOYA_REQUIRE_NETNS=1` (`.ci/run` sets it: it runs as root): the tests
/// that need root and network namespaces must run, not skip.
pub fn netns_required() -> bool {
    std::env::var("SOYA_REQUIRE_NETNS").is_ok_and(|v| v == "1")
}

/// Prints `<test>: skipped: needs <why>`, or panics when `required`.
pub fn skip(test: &str, why: &str, required: bool) {
    assert!(!required, "{test}: cannot run here (needs {why})");
    eprintln!("{test}: skipped: needs {why}");
}

/// Runs `ip` with `args` and panics, with its error output, on failure.
pub fn must_ip(args: &[&str]) {
    soya_tools::netns::try_ip(args).unwrap_or_else(|e| panic!("{e}"));
}

/// `ip -n NS WORDS...` (the words split at whitespace); panics on failure.
pub fn ip_in(ns: &str, words: &str) {
    soya_tools::netns::try_ip_in(ns, words).unwrap_or_else(|e| panic!("{e}"));
}

/// [`soya_tools::netns::try_in_netns`], panicking if the namespace cannot
/// be entered.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    soya_tools::netns::try_in_netns(ns, f).unwrap_or_else(|e| panic!("{e}"))
}
