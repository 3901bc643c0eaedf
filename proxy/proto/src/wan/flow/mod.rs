//! Flows: reliable, in-order message streams, independent of each other.
//!
//! A flow is what must stay in order (one QP half). Each message gets the
//! flow's next sequence number and byte offset; the receiver reassembles
//! fragments, buffers out-of-order messages and hands them over strictly in
//! sequence. A lost fragment only stalls its own flow: there is no cross-flow
//! head-of-line blocking.
//!
//! Credit (QUIC-style flow control): the receiver lets the sender use flow
//! byte offsets below `granted = consumed + window`, where `consumed` counts
//! bytes the application has taken out of `poll_event`. So per flow the
//! receiver never holds more than `window` bytes (reorder buffer plus
//! undelivered events), and a slow consumer pushes back on the sender.
//!
//! # Keys, wire ids and retirement
//!
//! The application names a flow by a *key* (the site hashes a QP half into
//! one: `site::flows`). On the wire a flow has an *id* the sender allocates,
//! sequentially from 1, never twice in one connection ([`SendFlows`] keeps
//! key → live id). An appliance sees QPs come and go for months, and NICs
//! recycle QPNs; flows therefore end, or every QP ever seen would hold a
//! flow on both sides until `max_flows` refuses the next one.
//!
//! Retirement is decided by the sender, the one side that knows whether
//! more is coming, and travels in order:
//!
//! 1. A flow is *idle* once every message it carried is acknowledged and
//!    nothing is queued. After `idle_timeout` of idleness the sender closes
//!    it: the key forgets the id, and a FIN frame `(id, seq = next message
//!    number)` is queued. The FIN is retransmitted like data until a packet
//!    carrying it is acknowledged; then the sender forgets the flow.
//! 2. The receiver closes the flow when the FIN is in sequence: `seq` must
//!    equal its next expected message with nothing buffered (anything else
//!    is a protocol violation: the sender promised that every message was
//!    acknowledged). It drops the flow's state and adds the id to a set of
//!    closed ids ([`closed::IdRanges`]: ranges, small because ids are
//!    sequential).
//! 3. A frame of a closed id (a late duplicate, a spurious retransmission,
//!    a second FIN) is acknowledged with its packet and dropped: never
//!    taken for a new flow, since ids are not reused.
//! 4. The next message for the same key gets a fresh id and starts at
//!    sequence 0.
//!
//! Why nothing is lost, duplicated or reordered across incarnations:
//!
//! - *Acknowledged means delivered.* A packet is acknowledged once the
//!   receiver processed it; a fragment it accepted is never dropped
//!   afterwards (only frames refused as protocol violations are, and those
//!   mean a broken peer). A message is released by the sender only when all
//!   its fragments are acknowledged, and the receiver delivers message `k`
//!   as soon as `0..=k` are complete. So when the sender sees its flow idle,
//!   every message `0..N` is already delivered, in order, and the
//!   receiver's next expected number is `N`: the FIN `(id, N)` is in order
//!   the moment it arrives.
//! - *The new incarnation is ordered after the old one.* Its first message
//!   is queued after the close, which happened after every message of the
//!   old id was delivered (previous point); it is delivered only after it
//!   was sent. The receiver hands messages to the application through one
//!   FIFO, so the old messages come out first. Nothing needs to wait for the
//!   FIN's acknowledgement.
//! - *The old id stays dead.* Until the FIN arrives, the receiver's flow
//!   still exists with next number `N`: old frames are duplicates by
//!   number. After it, the id is in the closed set. A lost FIN is resent; a
//!   FIN acknowledged is known to have reached the receiver (step 2 has
//!   run), so the sender may forget the id.
//! - *A restart of either twin* (a new generation) resets both sides'
//!   flows, closed sets included; the old generation's packets are refused
//!   by the header check and fail to authenticate under the new keys.
//!
//! Bounds and what happens at them:
//! - sender, per flow: unsent bytes beyond the peer's credit ≤ `queue_limit`,
//!   else `send` fails with `FlowBlocked` (the caller holds back);
//! - sender, all flows: bytes held (unsent + unacknowledged) ≤ `max_buffered`,
//!   else `BufferFull`;
//! - both sides: at most `max_flows` flows (live plus closing), else
//!   `TooManyFlows` (sender) or the frame is refused as a protocol
//!   violation (receiver). With retirement, flows ≈ the halves active in
//!   the last `idle_timeout`, not every half ever seen;
//! - receiver, per flow: buffered bytes ≤ window (a peer exceeding its credit
//!   violates the protocol: the frame is dropped and counted);
//! - receiver, closed ids: at most `2 × max_flows + 1` ranges. Every gap
//!   between two ranges holds an id that is not closed: open here, or
//!   allocated by the sender and not seen yet, so live there; an honest
//!   peer never reaches the bound. Past it a FIN is refused (counted): the
//!   flow stays open here, which is safe, as its id is never used again.
//!   (A half retired and reopened while its old messages still wait
//!   unconsumed in the event queue can have one window per incarnation
//!   there: the site drains the queue on every pass, so this stays moot.)

mod closed;
mod recv;
mod send;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_reassembly;

pub use recv::{Message, RecvFlows};
pub use send::SendFlows;

/// Largest encoded message (a RoCE packet is at most ~4.2 KB; the margin
/// leaves room for later message kinds). Fragments per message ≤ 64.
pub const MAX_MESSAGE: usize = 65_536;
/// Fragments of one message are tracked in a `u64` bitmap.
pub const MAX_FRAGMENTS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    TooLarge,
    FlowBlocked,
    BufferFull,
    TooManyFlows,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOutcome {
    Accepted,
    /// Already delivered or already buffered, or of a closed flow: ignored.
    Duplicate,
    /// Beyond credit, inconsistent with earlier fragments, too many flows,
    /// a FIN out of sequence: the peer broke the protocol; the frame is
    /// dropped.
    Violation,
}
