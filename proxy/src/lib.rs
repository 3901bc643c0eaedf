//! Sōya: a long-distance RoCEv2 WAN accelerator. This crate is the daemon:
//! the gateway ([`gateway`]: threads, device loops, the control plane), and
//! the `soya` command line (src/main.rs, src/plan_cli.rs, [`demo_args`]).
//!
//! It sits on two crates (proxy/proto and proxy/io):
//!
//! - `soya_proto`, the protocol, sans-IO and without `unsafe`: [`roce`]
//!   parses the RoCEv2 packet, [`qp`] pseudo-ACKs it, holds it in the deep
//!   [`buffer`] and re-injects it in order at the twin, [`wan`] carries it
//!   between the twin gateways, [`site`] puts those together for one
//!   gateway, [`plan`] is the capacity planner's arithmetic.
//! - `soya_io`, the I/O: [`sys`] (every system call the gateway and the lab
//!   tools make) and the AF_XDP backend (`soya_io::xdp`, also `gateway::xdp`). Every
//!   `unsafe` of the proxy is there.
//!
//! The protocol modules are re-exported under their old names (`soya::roce`,
//! `soya::site`, ...) for the tools and tests that use the daemon too; code
//! that needs the protocol alone depends on `soya-proto`.

#![forbid(unsafe_code)]

pub mod client;
pub mod demo_args;
pub mod gateway;

pub use soya_io::sys;
pub use soya_proto::{buffer, copies, keyed, plan, qp, rand, roce, shard, site, time, wan};
