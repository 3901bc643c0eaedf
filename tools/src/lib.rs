//! Lab and test tools for Sōya.
//!
//! - [`capture`]: read pcap files of RoCEv2 traffic into parsed packets
//!   (used by `soya-decode` and by the capture tests).

#![deny(unsafe_code)]

pub mod capture;
mod cgroup;
pub mod demo;
pub mod demo_circuit;
mod demo_common;
mod demo_loopback;
mod demo_netns;
mod demo_report;
mod demo_session;
pub mod netns;
pub mod perf;
/// The `soya-perf` command line: its server and client, and the demo that
/// `soya demo` runs through it (so it sits above `perf` and `demo`).
pub mod perf_cli;
pub mod rc;
pub mod sim;
pub mod size;
pub mod soak;
pub mod wanem;
