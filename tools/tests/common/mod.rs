//! Helpers shared by the tools' integration tests (`mod common;`): the
//! workspace's binaries, and network namespaces with the processes and
//! sockets in them (root only; the namespace primitives live in
//! `soya_tools::netns`, shared with `soya demo --netns`; the wrappers here
//! panic, as tests should). Not every test file uses every helper.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use soya_tools::perf::PerfReport;

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

/// A `soya-perf client` running in a network namespace, its `--json`
/// report and its log going to files.
pub struct PerfClient {
    proc: Proc,
    json: PathBuf,
    log: PathBuf,
    what: String,
}

impl PerfClient {
    /// Starts `soya-perf client TO --bind-ip FROM --json -q ARGS...` in
    /// `ns`, writing `dir/client{n}.json` and `dir/client{n}.log`.
    pub fn spawn(
        procs: &mut Netns,
        dir: &Path,
        n: u32,
        ns: &str,
        (from, to): (&str, &str),
        args: &[&str],
    ) -> PerfClient {
        let json = dir.join(format!("client{n}.json"));
        let log = dir.join(format!("client{n}.log"));
        let mut all = vec!["client", to, "--bind-ip", from, "--json", "-q"];
        all.extend_from_slice(args);
        let (out, err) = (
            std::fs::File::create(&json).unwrap(),
            std::fs::File::create(&log).unwrap(),
        );
        let perf = Path::new(env!("CARGO_BIN_EXE_soya-perf"));
        let proc = procs
            .spawn(ns, perf, &all, |c| {
                c.stdout(out).stderr(err);
            })
            .unwrap();
        PerfClient {
            proc,
            json,
            log,
            what: format!("{from} -> {to} {}", args.join(" ")),
        }
    }

    /// Waits for the client's exit and report; `Err` (the client killed,
    /// its log in the message) when it did not exit within `within`.
    /// Panics when it exited without a report.
    pub fn finish(
        self,
        procs: &mut Netns,
        within: Duration,
    ) -> Result<(PerfReport, ExitStatus), String> {
        let log = || std::fs::read_to_string(&self.log).unwrap_or_default();
        let Some(status) = procs.wait(self.proc, within) else {
            procs.kill(self.proc);
            return Err(format!(
                "soya-perf client {} did not finish within {within:?}:\n{}",
                self.what,
                log()
            ));
        };
        let text = std::fs::read_to_string(&self.json).unwrap();
        let report = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
            panic!(
                "soya-perf client {} printed no report ({e}, {status}): {text}\n{}",
                self.what,
                log()
            )
        });
        Ok((report, status))
    }
}

/// Starts `bin` with `args`, its stdout and stderr piped to this test.
pub fn spawn_piped(bin: &str, args: &[&str]) -> std::process::Child {
    std::process::Command::new(bin)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"))
}
