//! Sōya's packet I/O: every system call the gateway and the lab tools
//! make, and every `unsafe` of the proxy.
//!
//! - [`sys`]: sockets, batched UDP (`recvmmsg`/`sendmmsg`, GSO/GRO), TUN,
//!   io_uring (feature `io-uring`), poll, signals, namespaces, scheduling.
//! - [`xdp`]: the AF_XDP DC backend: UMEM, rings, the XDP steering program
//!   (built from `xdp/steer.bpf.c` by `build.rs`, loaded with aya) and the
//!   neighbour table it reads over netlink.
//! - [`dcrx`]: a packet a DC backend read.
//!
//! The protocol (`soya_proto`) has no `unsafe` at all: where a backend lends
//! it packet memory without a copy (AF_XDP UMEM), this crate makes the
//! `&'static mut [u8]` the protocol's `PacketBuf` holds, and says why that
//! is sound where it does (`xdp::lend`, `xdp::tape`).

pub mod dcrx;
pub mod sys;
pub mod xdp;
