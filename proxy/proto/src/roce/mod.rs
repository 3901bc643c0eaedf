//! The RoCEv2 wire format: what a packet looks like on the DC side.
//!
//! Read in this order: [`psn`] (sequence numbers), [`opcode`] (the one table
//! of what follows each opcode), [`bth`] and [`ext`] (headers), [`ip`] (the
//! IP/UDP layers RoCEv2 rides on), [`icrc`], [`packet`] (parse and emit a
//! whole packet), [`builders`] (packets the gateway originates) and [`cm`]
//! (RDMA-CM on QP1, to learn flows).
//!
//! Facts come from the Linux rxe driver and the IBTA spec; see
//! `docs/roce-notes.md` for where the project's brief and the sources differ.

pub mod bth;
pub mod builders;
pub mod cm;
pub mod error;
pub mod ext;
pub mod icrc;
pub mod ip;
pub mod opcode;
pub mod packet;
pub mod psn;

pub use bth::Bth;
pub use error::WireError;
pub use ext::{Aeth, AtomicEth, Deth, ExtHeaders, NakCode, Reth, Syndrome};
pub use ip::{ethernet_payload, IpHeader};
pub use opcode::{Headers, OpKind, Opcode, OpcodeInfo, Position};
pub use packet::{is_roce, set_ack_req, RocePacket, RoceRepr};
pub use psn::Psn;

#[cfg(test)]
mod tests;
