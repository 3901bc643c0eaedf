//! A deterministic simulator: virtual time, seeded randomness, an event heap
//! and links with delay, rate, loss, reordering, duplication and jitter.
//!
//! It drives the *real* gateway state machines ([`soya::qp::QpEngine`]) and
//! the project's one RC endpoint ([`crate::rc::RcQp`]) through a 300 km WAN,
//! loss and failures, fast, in CI.

pub mod allreduce;
pub mod allreduce_cli;
pub mod link;
pub mod nccl;
pub mod scenario;
pub mod sweep;
pub mod world;
