//! Base Transport Header (12 bytes), the first header of every RoCE packet.

use super::error::{be16, be24, need, Result, WireError};
use super::opcode::Opcode;
use super::psn::Psn;

pub const BTH_LEN: usize = 12;

/// The P_Key every rxe QP uses (rxe_recv.c `check_keys` enforces it).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// Decoded BTH fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq ("M") bit: copied from the peer, never interpreted.
    pub mig_req: bool,
    /// Bytes of pad after the payload (0..=3).
    pub pad: u8,
    pub pkey: u16,
    /// Forward ECN (byte 4, bit 7); masked out of the ICRC.
    pub fecn: bool,
    /// Backward ECN (byte 4, bit 6); masked out of the ICRC.
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: Psn,
}

impl Bth {
    /// A BTH with the defaults every RC sender uses.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & 0xFF_FFFF,
            ack_req: false,
            psn,
        }
    }

    /// Parses the first 12 bytes of `b`. The opcode is not checked here.
    pub fn parse(b: &[u8]) -> Result<Bth> {
        need(b, BTH_LEN, "BTH")?;
        let tver = b[1] & 0x0F;
        if tver != 0 {
            return Err(WireError::BthVersion(tver));
        }
        Ok(Bth {
            opcode: Opcode(b[0]),
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad: (b[1] >> 4) & 0x3,
            pkey: be16(b, 2),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: be24(b, 5),
            ack_req: b[8] & 0x80 != 0,
            psn: Psn::new(be24(b, 9)),
        })
    }

    /// Writes the 12 bytes into `b[..12]`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.opcode.0;
        b[1] =
            (u8::from(self.solicited) << 7) | (u8::from(self.mig_req) << 6) | ((self.pad & 3) << 4);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        b[5..8].copy_from_slice(&(self.dest_qp & 0xFF_FFFF).to_be_bytes()[1..]);
        b[8] = u8::from(self.ack_req) << 7;
        b[9..12].copy_from_slice(&self.psn.value().to_be_bytes()[1..]);
    }
}
