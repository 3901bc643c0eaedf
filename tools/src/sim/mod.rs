//! A deterministic simulator: virtual time, seeded randomness, an event heap
//! and links with delay, rate, loss, reordering, duplication and jitter.
//!
//! It drives the *real* gateway state machines ([`soya_proto::qp::QpEngine`]) and
//! the project's one RC endpoint ([`crate::rc::RcQp`]) through a 300 km WAN,
//! loss and failures, fast, in CI.

pub mod allreduce;
pub mod allreduce_cli;
pub mod link;
pub mod nccl;
pub mod oversub;
pub mod scenario;
pub mod standby;
pub mod sweep;
pub mod world;

/// The end of a `soya-sim` report. In text (`json` false): the wall time the
/// run took, then every violated invariant, one a line. The exit code fails
/// when any invariant was violated, in text and JSON alike.
pub fn conclude<V: std::fmt::Display>(
    json: bool,
    wall: std::time::Instant,
    violations: &[V],
) -> std::process::ExitCode {
    if !json {
        println!(
            "simulated in {:.2} s of wall time",
            wall.elapsed().as_secs_f64()
        );
        for v in violations {
            println!("VIOLATION: {v}");
        }
    }
    if violations.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
