//! Sōya: a long-distance RoCEv2 WAN accelerator.
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
//! ([`gateway`], sockets and threads) and the simulator both drive a
//! [`site::Site`].
//!
//! [`plan`] is the capacity planner behind `soya plan`.
//!
//! Protocol logic is sans-IO: state machines take `(packet or event, now)` and
//! return packets and timers; sockets and clocks live only in the I/O layers.
//!
//! [`sys`] holds every Linux system call the gateway and the lab tools make
//! (AF_XDP's aside, in `gateway::xdp`); nothing else may use `unsafe`, but
//! for [`buffer::PacketBuf`], which may name bytes an I/O backend lent.

#![deny(unsafe_code)]

pub mod buffer;
pub mod copies;
pub mod demo_args;
pub mod gateway;
/// Keyed hash tables for everything the data center or the WAN can name
/// (QPs, flows, peers): below `qp`, `buffer`, `wan` and `site`, which all use it.
pub mod keyed;
pub mod plan;
pub mod qp;
pub mod rand;
pub mod roce;
pub mod site;
#[allow(unsafe_code)]
pub mod sys;
pub mod time;
pub mod wan;
