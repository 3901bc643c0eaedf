//! BTH opcodes and the one table that says what follows each of them.
//!
//! Every decision that depends on the opcode (which extension headers, in
//! which order, whether a payload may follow, whether the packet is a request
//! or a response, where it sits in a message) is read from [`TABLE`], so the
//! parser, the builder and the gateway can never disagree. Source: the
//! `rxe_opcode[]` table in Linux drivers/infiniband/sw/rxe/rxe_opcode.c and
//! include/rdma/ib_pack.h.

use std::fmt;

/// Extension headers, as a small bit set. The wire order is the order of the
/// constants in [`Headers::WIRE_ORDER`].
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Headers(u16);

impl Headers {
    pub const NONE: Headers = Headers(0);
    /// Datagram ETH (UD only: Q_Key + source QP), 8 bytes.
    pub const DETH: Headers = Headers(1 << 0);
    /// Flush ETH, 4 bytes (precedes the RETH in FLUSH, as in rxe).
    pub const FETH: Headers = Headers(1 << 1);
    /// RDMA ETH: VA, R_Key, DMA length, 16 bytes.
    pub const RETH: Headers = Headers(1 << 2);
    /// Atomic ETH: VA, R_Key, swap/add, compare, 28 bytes.
    pub const ATOMIC_ETH: Headers = Headers(1 << 3);
    /// ACK ETH: syndrome + MSN, 4 bytes.
    pub const AETH: Headers = Headers(1 << 4);
    /// Atomic ACK ETH: original value, 8 bytes.
    pub const ATOMIC_ACK_ETH: Headers = Headers(1 << 5);
    /// Immediate data, 4 bytes.
    pub const IMM_DT: Headers = Headers(1 << 6);
    /// Invalidate ETH: R_Key, 4 bytes.
    pub const IETH: Headers = Headers(1 << 7);
    /// The 16 reserved bytes of a CNP (not an IBTA ETH, but fixed-size like one).
    pub const CNP_PAD: Headers = Headers(1 << 8);

    /// Wire order and size of each header.
    pub const WIRE_ORDER: [(Headers, usize); 9] = [
        (Headers::DETH, 8),
        (Headers::FETH, 4),
        (Headers::RETH, 16),
        (Headers::ATOMIC_ETH, 28),
        (Headers::AETH, 4),
        (Headers::ATOMIC_ACK_ETH, 8),
        (Headers::IMM_DT, 4),
        (Headers::IETH, 4),
        (Headers::CNP_PAD, 16),
    ];

    pub const fn union(self, other: Headers) -> Headers {
        Headers(self.0 | other.0)
    }

    pub const fn contains(self, other: Headers) -> bool {
        self.0 & other.0 == other.0
    }

    /// Total bytes of these headers.
    pub const fn len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < Self::WIRE_ORDER.len() {
            if self.contains(Self::WIRE_ORDER[i].0) {
                n += Self::WIRE_ORDER[i].1;
            }
            i += 1;
        }
        n
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 9] = [
            "DETH",
            "FETH",
            "RETH",
            "AtomicETH",
            "AETH",
            "AtomicAckETH",
            "ImmDt",
            "IETH",
            "CnpPad",
        ];
        let mut first = true;
        for (i, (h, _)) in Headers::WIRE_ORDER.iter().enumerate() {
            if self.contains(*h) {
                if !first {
                    f.write_str("+")?;
                }
                f.write_str(NAMES[i])?;
                first = false;
            }
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// What kind of operation a packet belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Send,
    Write,
    ReadRequest,
    ReadResponse,
    Ack,
    AtomicAck,
    /// Compare-and-swap or fetch-and-add request.
    Atomic,
    Flush,
    AtomicWrite,
    /// Congestion notification (not in the PSN space, never acknowledged).
    Cnp,
    /// Unreliable datagram SEND (RDMA-CM MADs on QP1 travel this way).
    UdSend,
}

/// Where a packet sits within its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl Position {
    /// The packet starts a message.
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// The packet ends a message.
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Whether and how much payload follows the headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// No payload may follow.
    None,
    /// Any length (0..=PMTU); First/Middle packets carry exactly PMTU, but the
    /// codec does not know the PMTU, so that is the endpoint's check.
    Data,
    /// Exactly this many bytes.
    Fixed(usize),
}

/// Everything the protocol says about one opcode.
#[derive(Debug)]
pub struct OpcodeInfo {
    pub code: u8,
    pub name: &'static str,
    pub kind: OpKind,
    pub position: Position,
    pub headers: Headers,
    pub payload: Payload,
}

impl OpcodeInfo {
    /// A request consumes PSNs in the requester's space and is acknowledged.
    pub const fn is_request(&self) -> bool {
        matches!(
            self.kind,
            OpKind::Send
                | OpKind::Write
                | OpKind::ReadRequest
                | OpKind::Atomic
                | OpKind::Flush
                | OpKind::AtomicWrite
        )
    }

    /// A response travels from responder to requester (ACK/NAK, READ
    /// response, atomic ACK).
    pub const fn is_response(&self) -> bool {
        matches!(
            self.kind,
            OpKind::Ack | OpKind::AtomicAck | OpKind::ReadResponse
        )
    }

    /// Reliable Connected opcodes (top three bits 000).
    pub const fn is_rc(&self) -> bool {
        self.code & 0xE0 == 0
    }

    /// The responder answers this request only with data (READ response or
    /// atomic ACK), never with a plain ACK, so nobody may ACK past it.
    pub const fn needs_real_response(&self) -> bool {
        matches!(self.kind, OpKind::ReadRequest | OpKind::Atomic)
    }

    /// The responder's MSN advances when it executes this packet
    /// (rxe_resp.c: last packet of SEND/WRITE, each READ request and atomic).
    pub const fn completes_message(&self) -> bool {
        self.is_request() && self.position.ends()
    }
}

/// A BTH opcode byte. Known opcodes have an entry in [`TABLE`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($( $name:ident = $code:literal, $text:literal, $kind:ident, $pos:ident, [$($h:ident),*], $payload:expr; )*) => {
        impl Opcode {
            $( pub const $name: Opcode = Opcode($code); )*
        }
        /// The opcode table: one row per opcode Sōya understands.
        pub static TABLE: &[OpcodeInfo] = &[
            $( OpcodeInfo {
                code: $code,
                name: $text,
                kind: OpKind::$kind,
                position: Position::$pos,
                headers: Headers::NONE $(.union(Headers::$h))*,
                payload: $payload,
            }, )*
        ];
    };
}

use Payload::{Data, Fixed, None as NoPayload};

opcodes! {
    RC_SEND_FIRST = 0x00, "SEND First", Send, First, [], Data;
    RC_SEND_MIDDLE = 0x01, "SEND Middle", Send, Middle, [], Data;
    RC_SEND_LAST = 0x02, "SEND Last", Send, Last, [], Data;
    RC_SEND_LAST_IMM = 0x03, "SEND Last with Immediate", Send, Last, [IMM_DT], Data;
    RC_SEND_ONLY = 0x04, "SEND Only", Send, Only, [], Data;
    RC_SEND_ONLY_IMM = 0x05, "SEND Only with Immediate", Send, Only, [IMM_DT], Data;
    RC_WRITE_FIRST = 0x06, "RDMA WRITE First", Write, First, [RETH], Data;
    RC_WRITE_MIDDLE = 0x07, "RDMA WRITE Middle", Write, Middle, [], Data;
    RC_WRITE_LAST = 0x08, "RDMA WRITE Last", Write, Last, [], Data;
    RC_WRITE_LAST_IMM = 0x09, "RDMA WRITE Last with Immediate", Write, Last, [IMM_DT], Data;
    RC_WRITE_ONLY = 0x0A, "RDMA WRITE Only", Write, Only, [RETH], Data;
    RC_WRITE_ONLY_IMM = 0x0B, "RDMA WRITE Only with Immediate", Write, Only, [RETH, IMM_DT], Data;
    RC_READ_REQUEST = 0x0C, "RDMA READ Request", ReadRequest, Only, [RETH], NoPayload;
    RC_READ_RESPONSE_FIRST = 0x0D, "RDMA READ Response First", ReadResponse, First, [AETH], Data;
    RC_READ_RESPONSE_MIDDLE = 0x0E, "RDMA READ Response Middle", ReadResponse, Middle, [], Data;
    RC_READ_RESPONSE_LAST = 0x0F, "RDMA READ Response Last", ReadResponse, Last, [AETH], Data;
    RC_READ_RESPONSE_ONLY = 0x10, "RDMA READ Response Only", ReadResponse, Only, [AETH], Data;
    RC_ACK = 0x11, "Acknowledge", Ack, Only, [AETH], NoPayload;
    RC_ATOMIC_ACK = 0x12, "ATOMIC Acknowledge", AtomicAck, Only, [AETH, ATOMIC_ACK_ETH], NoPayload;
    RC_COMPARE_SWAP = 0x13, "CmpSwap", Atomic, Only, [ATOMIC_ETH], NoPayload;
    RC_FETCH_ADD = 0x14, "FetchAdd", Atomic, Only, [ATOMIC_ETH], NoPayload;
    RC_SEND_LAST_INV = 0x16, "SEND Last with Invalidate", Send, Last, [IETH], Data;
    RC_SEND_ONLY_INV = 0x17, "SEND Only with Invalidate", Send, Only, [IETH], Data;
    RC_FLUSH = 0x1C, "FLUSH", Flush, Only, [FETH, RETH], NoPayload;
    RC_ATOMIC_WRITE = 0x1D, "ATOMIC WRITE", AtomicWrite, Only, [RETH], Fixed(8);
    UD_SEND_ONLY = 0x64, "UD SEND Only", UdSend, Only, [DETH], Data;
    UD_SEND_ONLY_IMM = 0x65, "UD SEND Only with Immediate", UdSend, Only, [DETH, IMM_DT], Data;
    CNP = 0x81, "CNP", Cnp, Only, [CNP_PAD], NoPayload;
}

/// Index into [`TABLE`] by opcode byte (+1; 0 = unknown), built at compile time.
static INDEX: [u8; 256] = {
    let mut idx = [0u8; 256];
    let mut i = 0;
    while i < TABLE.len() {
        idx[TABLE[i].code as usize] = (i + 1) as u8;
        i += 1;
    }
    idx
};

impl Opcode {
    /// The table row for this opcode, or `None` when Sōya does not know it.
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        match INDEX[self.0 as usize] {
            0 => None,
            i => Some(&TABLE[i as usize - 1]),
        }
    }

    pub fn name(self) -> &'static str {
        self.info().map_or("unknown", |i| i.name)
    }

    /// The opcode of a packet of an RC READ response: whether it is the
    /// response's first packet, its last, both (Only) or neither (Middle).
    pub const fn read_response(first: bool, last: bool) -> Opcode {
        match (first, last) {
            (true, true) => Opcode::RC_READ_RESPONSE_ONLY,
            (true, false) => Opcode::RC_READ_RESPONSE_FIRST,
            (false, false) => Opcode::RC_READ_RESPONSE_MIDDLE,
            (false, true) => Opcode::RC_READ_RESPONSE_LAST,
        }
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#04x} ({})", self.0, self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_unique_codes_and_index_finds_each() {
        for row in TABLE {
            let info = Opcode(row.code).info().expect("indexed");
            assert_eq!(info.code, row.code, "{}", row.name);
        }
        let known = (0..=255u8).filter(|c| Opcode(*c).info().is_some()).count();
        assert_eq!(known, TABLE.len(), "duplicate code in TABLE");
    }

    #[test]
    fn header_sizes_match_rxe() {
        assert_eq!(Opcode::RC_WRITE_ONLY_IMM.info().unwrap().headers.len(), 20);
        assert_eq!(Opcode::RC_ATOMIC_ACK.info().unwrap().headers.len(), 12);
        assert_eq!(Opcode::RC_COMPARE_SWAP.info().unwrap().headers.len(), 28);
        assert_eq!(Opcode::UD_SEND_ONLY.info().unwrap().headers.len(), 8);
        assert_eq!(Opcode::CNP.info().unwrap().headers.len(), 16);
        assert_eq!(Opcode::RC_FLUSH.info().unwrap().headers.len(), 20);
    }

    #[test]
    fn classification() {
        let read = Opcode::RC_READ_REQUEST.info().unwrap();
        assert!(read.is_request() && read.needs_real_response() && read.completes_message());
        let mid = Opcode::RC_WRITE_MIDDLE.info().unwrap();
        assert!(mid.is_request() && !mid.completes_message());
        let ack = Opcode::RC_ACK.info().unwrap();
        assert!(ack.is_response() && !ack.is_request());
        assert!(!Opcode::CNP.info().unwrap().is_rc());
        assert!(Opcode(0x15).info().is_none());
        assert!(Opcode(0x20).info().is_none(), "UC is not handled");
    }
}
