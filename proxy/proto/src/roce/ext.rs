//! Extension transport headers (RETH, AETH, AtomicETH, ...), decoded.
//!
//! Which of them a packet carries is decided by the opcode table alone
//! ([`super::opcode::TABLE`]); this module only knows their layouts.

use super::error::{be32, be64};
use super::opcode::Headers;

/// RDMA ETH: the target of a WRITE or READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    /// DMA length of the whole message (READ: bytes requested).
    pub len: u32,
}

/// Atomic ETH (CmpSwap / FetchAdd).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicEth {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

/// Datagram ETH (UD).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Deth {
    pub qkey: u32,
    pub src_qp: u32,
}

/// The NAK codes of an AETH (syndrome 0x60..=0x64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
}

impl NakCode {
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
        }
    }
    pub const fn from_code(c: u8) -> Option<NakCode> {
        Some(match c {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
}

/// What an AETH syndrome byte says (bits 6:5 give the type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syndrome {
    /// Positive ACK with a credit code (31 = unlimited/invalid, what rxe sends).
    Ack {
        credit: u8,
    },
    /// Receiver not ready: retry after the encoded timer.
    RnrNak {
        timer: u8,
    },
    Nak(NakCode),
    /// Type 0b10 (reserved) or a NAK code outside 0..=4.
    Reserved(u8),
}

impl Syndrome {
    /// The syndrome rxe puts in every positive ACK.
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack { credit: 0x1F };

    pub const fn from_byte(b: u8) -> Syndrome {
        match (b >> 5) & 3 {
            0 => Syndrome::Ack { credit: b & 0x1F },
            1 => Syndrome::RnrNak { timer: b & 0x1F },
            3 => match NakCode::from_code(b & 0x1F) {
                Some(c) => Syndrome::Nak(c),
                None => Syndrome::Reserved(b),
            },
            _ => Syndrome::Reserved(b),
        }
    }

    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit } => credit & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(c) => 0x60 | c.code(),
            Syndrome::Reserved(b) => b,
        }
    }
}

/// RNR NAK timer codes to microseconds (IBTA table; rxe_comp.c `rnrnak_usec`).
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

/// ACK ETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aeth {
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    pub fn ack(msn: u32) -> Aeth {
        Aeth {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: msn & 0xFF_FFFF,
        }
    }
}

/// All extension headers a packet may carry; `present` says which are valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ExtHeaders {
    pub present: Headers,
    pub deth: Deth,
    /// Flush ETH: selectivity level and placement type (raw 32 bits).
    pub feth: u32,
    pub reth: Reth,
    pub atomic: AtomicEth,
    pub aeth: Option<Aeth>,
    /// Original remote value returned by an atomic.
    pub atomic_ack: u64,
    pub imm: u32,
    /// R_Key to invalidate.
    pub ieth: u32,
}

impl ExtHeaders {
    /// Decodes the headers in `set` from `b` (which holds exactly `set.len()` bytes).
    pub(crate) fn parse(set: Headers, b: &[u8]) -> ExtHeaders {
        let mut e = ExtHeaders {
            present: set,
            ..Default::default()
        };
        let mut at = 0;
        for (h, len) in Headers::WIRE_ORDER {
            if !set.contains(h) {
                continue;
            }
            match h {
                Headers::DETH => {
                    e.deth = Deth {
                        qkey: be32(b, at),
                        src_qp: be32(b, at + 4) & 0xFF_FFFF,
                    }
                }
                Headers::FETH => e.feth = be32(b, at),
                Headers::RETH => {
                    e.reth = Reth {
                        va: be64(b, at),
                        rkey: be32(b, at + 8),
                        len: be32(b, at + 12),
                    }
                }
                Headers::ATOMIC_ETH => {
                    e.atomic = AtomicEth {
                        va: be64(b, at),
                        rkey: be32(b, at + 8),
                        swap_add: be64(b, at + 12),
                        compare: be64(b, at + 20),
                    }
                }
                Headers::AETH => {
                    let w = be32(b, at);
                    e.aeth = Some(Aeth {
                        syndrome: Syndrome::from_byte((w >> 24) as u8),
                        msn: w & 0xFF_FFFF,
                    })
                }
                Headers::ATOMIC_ACK_ETH => e.atomic_ack = be64(b, at),
                Headers::IMM_DT => e.imm = be32(b, at),
                Headers::IETH => e.ieth = be32(b, at),
                _ => {} // CNP_PAD: reserved bytes, ignored on receive.
            }
            at += len;
        }
        e
    }

    /// Encodes the headers in `self.present` into `b[..self.present.len()]`.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        let mut at = 0;
        for (h, len) in Headers::WIRE_ORDER {
            if !self.present.contains(h) {
                continue;
            }
            let out = &mut b[at..at + len];
            match h {
                Headers::DETH => {
                    out[..4].copy_from_slice(&self.deth.qkey.to_be_bytes());
                    out[4..].copy_from_slice(&(self.deth.src_qp & 0xFF_FFFF).to_be_bytes());
                }
                Headers::FETH => out.copy_from_slice(&self.feth.to_be_bytes()),
                Headers::RETH => {
                    out[..8].copy_from_slice(&self.reth.va.to_be_bytes());
                    out[8..12].copy_from_slice(&self.reth.rkey.to_be_bytes());
                    out[12..].copy_from_slice(&self.reth.len.to_be_bytes());
                }
                Headers::ATOMIC_ETH => {
                    out[..8].copy_from_slice(&self.atomic.va.to_be_bytes());
                    out[8..12].copy_from_slice(&self.atomic.rkey.to_be_bytes());
                    out[12..20].copy_from_slice(&self.atomic.swap_add.to_be_bytes());
                    out[20..].copy_from_slice(&self.atomic.compare.to_be_bytes());
                }
                Headers::AETH => {
                    let a = self.aeth.unwrap_or(Aeth::ack(0));
                    let w = (u32::from(a.syndrome.to_byte()) << 24) | (a.msn & 0xFF_FFFF);
                    out.copy_from_slice(&w.to_be_bytes());
                }
                Headers::ATOMIC_ACK_ETH => out.copy_from_slice(&self.atomic_ack.to_be_bytes()),
                Headers::IMM_DT => out.copy_from_slice(&self.imm.to_be_bytes()),
                Headers::IETH => out.copy_from_slice(&self.ieth.to_be_bytes()),
                _ => out.fill(0),
            }
            at += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_bytes_round_trip() {
        for b in 0..=255u8 {
            let s = Syndrome::from_byte(b);
            // Bit 7 is reserved and dropped by the known variants.
            if !matches!(s, Syndrome::Reserved(_)) {
                assert_eq!(s.to_byte(), b & 0x7F, "{b:#x}");
            }
        }
        assert_eq!(Syndrome::from_byte(0x1F), Syndrome::ACK_UNLIMITED);
        assert_eq!(Syndrome::from_byte(0x2E), Syndrome::RnrNak { timer: 14 });
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::from_byte(0x65), Syndrome::Reserved(0x65));
        assert_eq!(Syndrome::from_byte(0x40), Syndrome::Reserved(0x40));
    }

    #[test]
    fn rnr_timer_table_matches_brief() {
        assert_eq!(RNR_TIMER_US[0], 655_360);
        assert_eq!(RNR_TIMER_US[14], 1280);
        assert_eq!(RNR_TIMER_US[31], 491_520);
    }
}
