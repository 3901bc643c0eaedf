//! `soya-wanem`: a WAN emulator in user space, so tests and engineers can
//! rehearse a long link (300 km, loss, bursts, outages, a bottleneck) on a
//! host whose kernel has no netem.
//!
//! The impairment model is the simulator's ([`crate::sim::link`]), run in
//! real time: packets are timestamped by the kernel on arrival, given
//! release times by the model, held in a min-heap and sent when due.
//!
//! - [`profile`]: one direction's impairments as written (TOML / CLI),
//!   validated and turned into a [`LinkProfile`](crate::sim::link::LinkProfile).
//! - [`config`]: the whole run: paths, layered profiles, engine options.
//! - [`impair`]: the link model split into stages, drops by reason.
//! - [`engine`]: the per-direction forwarding loop (batched I/O, pool,
//!   heap, precise waiting).
//! - [`udp`]: UDP relay mode (listen/forward pairs).
//! - [`tun`]: L3 (TUN) or L2 (TAP) mode between two devices.
//! - [`vnet`]: TUN with virtio-net headers: UDP GSO read and written.
//! - [`stats`]: live counters.
//! - [`selftest`]: measures delay accuracy, loss accuracy and capacity.
//! - [`cli`]: the `soya-wanem` command line.
//! - The Linux system calls: [`soya_io::sys`] (shared with the gateway).

pub mod cli;
pub mod config;
pub mod engine;
pub mod impair;
pub mod profile;
pub mod selftest;
pub mod stats;
pub mod tun;
pub mod udp;
pub mod vnet;
