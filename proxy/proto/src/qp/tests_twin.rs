//! What the twin tells the engine, as the packet-level tests say it: one
//! line a message instead of a struct literal each time.

use super::engine::QpEngine;
use super::half::HalfKey;
use super::twin::{Carry, TwinMsg};
use crate::roce::{NakCode, Psn};
use crate::time::Time;

/// The twin forwards a request it pseudo-ACKed at its site.
pub(super) fn twin_request(e: &mut QpEngine, t: Time, packet: Vec<u8>) {
    e.handle_twin(
        t,
        TwinMsg::Request {
            carry: Carry::Reliable,
            packet: packet.into(),
        },
    );
}

/// The twin forwards a response of its site's responder.
pub(super) fn twin_response(e: &mut QpEngine, t: Time, packet: Vec<u8>) {
    e.handle_twin(
        t,
        TwinMsg::Response {
            packet: packet.into(),
        },
    );
}

/// The far responder acknowledged `half`'s requests up to `psn`.
pub(super) fn twin_delivered(e: &mut QpEngine, t: Time, half: HalfKey, psn: u32) {
    twin_delivered_msn(e, t, half, psn, None);
}

/// The same, with the MSN of the responder's ACK when the twin knew it.
pub(super) fn twin_delivered_msn(
    e: &mut QpEngine,
    t: Time,
    half: HalfKey,
    psn: u32,
    msn: Option<u32>,
) {
    e.handle_twin(
        t,
        TwinMsg::Delivered {
            half,
            psn: Psn::new(psn),
            msn,
        },
    );
}

/// The far side refused `half`'s request at `psn` for good.
pub(super) fn twin_error(e: &mut QpEngine, t: Time, half: HalfKey, psn: u32, code: NakCode) {
    e.handle_twin(
        t,
        TwinMsg::Error {
            half,
            psn: Psn::new(psn),
            code,
        },
    );
}
