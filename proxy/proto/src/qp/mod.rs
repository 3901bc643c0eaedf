//! Per-QP state machines: the heart of Sōya (sans-IO).
//!
//! One RC connection usually carries requests in both directions, so every
//! gateway plays two roles on the same QP pair, one per *half* (a requester,
//! a responder and the PSN space of the requests between them, [`HalfKey`]):
//!
//! - [`ingress::PseudoAcker`], at the requester's site: accepts in-order
//!   requests into the deep buffer, pseudo-ACKs them toward the requester and
//!   forwards them to the twin; delivers READ responses coming back.
//! - [`egress::Reinjector`], at the responder's site: re-injects the requests
//!   in PSN order, acts as the requester toward the responder (go-back-N,
//!   RNR waits), absorbs its ACKs and reports a *delivered* watermark back.
//!
//! [`engine::QpEngine`] owns both kinds for one gateway, classifies packets,
//! learns flows from RDMA-CM or from traffic, and talks to the twin with
//! [`twin::TwinMsg`]. When the twin is lost for good,
//! [`engine::QpEngine::fail_all`] fails every half and moves every local QP
//! with nothing outstanding to the error state ([`poison`], probing its
//! expected PSN first when nothing else tells it), and
//! [`engine::QpEngine::set_twin_reachable`] refuses new requests meanwhile.
//! Nothing here reads a clock or touches a socket.

mod cm_conns;
pub mod egress;
pub mod engine;
mod fail;
pub mod half;
pub mod ingress;
mod orphan;
pub mod outbox;
pub mod poison;
mod quiet;
mod resume;
mod timers;
pub mod twin;

pub use engine::{EngineConfig, EngineStats, HeldRef, Outbox, Output, QpEngine, TwinLostSummary};
pub use half::HalfKey;
pub use resume::RestartSummary;
pub use twin::TwinMsg;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_asks;
#[cfg(test)]
mod tests_egress;
#[cfg(test)]
mod tests_egress_timeouts;
#[cfg(test)]
mod tests_expiry;
#[cfg(test)]
mod tests_far_error;
#[cfg(test)]
mod tests_held;
#[cfg(test)]
mod tests_hw;
#[cfg(test)]
mod tests_ingress;
#[cfg(test)]
mod tests_orphan;
#[cfg(test)]
mod tests_pacer;
#[cfg(test)]
mod tests_reserve;
#[cfg(test)]
mod tests_room;
#[cfg(test)]
mod tests_stall;
#[cfg(test)]
mod tests_timers;
#[cfg(test)]
mod tests_tunnel;
#[cfg(test)]
mod tests_twin;
#[cfg(test)]
mod tests_twin_lost;
