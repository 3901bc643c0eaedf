//! Whose turn it is to take room in the shared slab: the flows waiting for
//! it, in the order they began to wait.
//!
//! The deep buffer is one slab shared by every flow of a gateway. When it
//! is short of room, the ingress withholds pseudo-ACKs (`qp::ingress`), and
//! whoever checks first after slots are freed would take the room they
//! free. That is always a flow with packets of its own being delivered
//! (each `Delivered` re-checks its flow at once), never a flow whose
//! packets were all delivered while it waited: that one only re-checks on
//! its hold timer, by which time the busy flows have taken the room
//! again. Four rxe QPs over one 1 Gb/s path starved one of them that way
//! until its requester timed out, for good (issue 33). So room goes in
//! turn: a flow that must wait for room joins this queue, and while anyone
//! waits, only the first in it may take room; the engine offers it the
//! room as soon as slots are freed ([`super::DeepBuffer::room_freed`]),
//! with no event of its own needed, and the next one after it.
//!
//! The queue holds only flows waiting for room in the *shared* slab: a
//! flow held by its own quota waits for its own deliveries, which re-check
//! it, and must not make everyone else wait behind it.

use std::collections::{HashSet, VecDeque};

use crate::keyed::Keyed;

/// The waiting flows, first come first served.
#[derive(Debug)]
pub(super) struct RoomQueue {
    order: VecDeque<u64>,
    /// The same flows, for a constant-time "already waiting?" (a hold
    /// re-checks each waiting flow every millisecond, and 1,024 QPs may
    /// wait at once).
    members: HashSet<u64, Keyed>,
    /// Slots were freed (or promises shrank, or the first waiter left)
    /// since the engine last offered the room: see
    /// [`super::DeepBuffer::room_freed`].
    freed: bool,
}

impl RoomQueue {
    pub(super) fn new() -> RoomQueue {
        RoomQueue {
            order: VecDeque::new(),
            members: HashSet::with_hasher(Keyed::random()),
            freed: false,
        }
    }

    /// May `flow` take room now: nobody waits, or it is the first waiting.
    pub(super) fn is_turn_of(&self, flow: u64) -> bool {
        self.order.front().is_none_or(|&f| f == flow)
    }

    /// `flow` waits for room (a no-op if it already does: it keeps its place).
    pub(super) fn wait(&mut self, flow: u64) {
        if self.members.insert(flow) {
            self.order.push_back(flow);
        }
    }

    /// `flow` no longer waits: it took the room, needs none any more, or
    /// is gone. If it was first, the next one may now be served.
    pub(super) fn leave(&mut self, flow: u64) {
        if !self.members.remove(&flow) {
            return;
        }
        if self.order.front() == Some(&flow) {
            self.order.pop_front();
            self.freed = true;
        } else if let Some(i) = self.order.iter().position(|&f| f == flow) {
            self.order.remove(i);
        }
    }

    pub(super) fn first(&self) -> Option<u64> {
        self.order.front().copied()
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    /// Something may have made room; only worth noting while anyone waits.
    pub(super) fn note_freed(&mut self) {
        if !self.order.is_empty() {
            self.freed = true;
        }
    }

    pub(super) fn take_freed(&mut self) -> bool {
        std::mem::take(&mut self.freed) && !self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_come_first_served_and_a_place_is_kept() {
        let mut q = RoomQueue::new();
        assert!(q.is_turn_of(7), "nobody waits: anyone may take room");
        q.wait(1);
        q.wait(2);
        q.wait(1);
        assert_eq!(q.len(), 2, "waiting again keeps the place");
        assert!(q.is_turn_of(1) && !q.is_turn_of(2) && !q.is_turn_of(7));
        q.leave(2);
        assert!(!q.take_freed(), "the second leaving frees no turn");
        q.wait(3);
        q.leave(1);
        assert!(q.take_freed(), "the first leaving: the next may be served");
        assert_eq!(q.first(), Some(3));
        q.leave(3);
        assert!(q.is_turn_of(9));
        q.note_freed();
        assert!(!q.take_freed(), "nobody to serve");
    }
}
