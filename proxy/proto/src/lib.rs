//! Sōya's protocol core: everything a gateway decides, nothing it does to
//! the operating system. No I/O, no threads, no raw memory (forbidden below),
//! and none of tokio, hyper, aya, netlink or clap in its dependency tree.
//!
//! A packet's journey, and the module that handles each step:
//!
//! 1. DC side in: [`roce`] parses and checks the RoCEv2 packet.
//! 2. Pseudo-ACK ([`qp::ingress`]) and the deep buffer ([`buffer`]).
//! 3. WAN paths to the twin gateway ([`wan`]: authenticated, multipath,
//!    selectively retransmitting, paced).
//! 4. The twin re-injects in order toward the responder ([`qp::egress`]).
//!
//! [`site`] puts steps 1-4 of one gateway together, sans-IO: the daemon
//! (crate `soya`, sockets and threads) and the simulator (soya-tools) both
//! drive a [`site::Site`].
//!
//! [`plan`] is the capacity planner's arithmetic behind `soya plan`.
//!
//! State machines take `(packet or event, now)` and return packets and
//! timers; sockets and clocks live in the I/O crate (`soya-io`) and the
//! daemon. Packet bytes an I/O backend lends (AF_XDP UMEM) reach this crate
//! as safe `&'static mut [u8]` runs inside a [`buffer::Lease`]: the raw
//! memory is the I/O crate's business.

#![forbid(unsafe_code)]

pub mod buffer;
pub mod copies;
/// Keyed hash tables for everything the data center or the WAN can name
/// (QPs, flows, peers): below `qp`, `buffer`, `wan` and `site`, which all use it.
pub mod keyed;
pub mod plan;
pub mod qp;
pub mod rand;
pub mod roce;
pub mod shard;
pub mod site;
pub mod time;
pub mod wan;
