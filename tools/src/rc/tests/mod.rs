//! Two QPs back to back through a scripted wire (`harness`), and what must
//! hold: every operation and size completes with its data verified
//! (`ops`), every loss/duplication/error path recovers or fails the way rxe
//! does (`recovery`), and the data pattern catches what the transport
//! cannot (`verification`).

mod harness;
mod hw;
mod imm;
mod ops;
mod recovery;
mod twin_lost;
mod verification;
