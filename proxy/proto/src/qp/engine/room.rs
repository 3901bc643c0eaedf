//! Offering freed room in the deep buffer to the flows waiting for it, in
//! turn (`buffer::room` says why a turn is needed at all).
//!
//! A flow whose pseudo-ACK must wait for room in the shared slab joins the
//! buffer's queue. Whatever frees room — a `Delivered` of any flow, an
//! egress half's packets acknowledged by the local responder, a failed or
//! forgotten flow's slots, a raised quota — the engine then asks the first
//! waiting flow whether its ACK fits now, and if it does lets it send it,
//! then the next, until one does not fit. So a held flow resumes as soon
//! as the room it waits for exists, whether or not anything of its own
//! happens, and whether or not its hold timer still runs
//! (`ingress::HOLD_ACK_FOR`): before this, a flow whose own packets had
//! all been delivered while others held the room re-checked only on that
//! timer, lost every race to the flows whose deliveries re-checked them
//! first, and once the timer stopped after 4 s nothing ever woke it again
//! (issue 33).

use crate::time::Time;

use super::QpEngine;

impl QpEngine {
    /// Called at the end of every entry point (`handle_dc`, `handle_twin`,
    /// `handle_timeout`): nothing to do unless room was freed while a flow
    /// waits. Each round either serves the first waiting flow (it leaves
    /// the queue) or stops, so this ends.
    pub(super) fn serve_room_waiters(&mut self, now: Time) {
        if !self.buffer.room_freed() {
            return;
        }
        while let Some(flow) = self.buffer.first_waiting() {
            let half = self
                .ingress_flows
                .get(&flow)
                .copied()
                .and_then(|k| self.ingress.get_mut(&k).map(|a| (k, a)));
            let Some((_, a)) = half.filter(|(_, a)| a.flow_id() == flow) else {
                // Its half is gone (forgotten, or replaced): not waiting.
                self.ingress_flows.remove(&flow);
                self.buffer.stop_waiting(flow);
                continue;
            };
            if !a.has_room_to_ack(&self.buffer) && !a.is_failed() {
                return; // the first waiting flow does not fit yet
            }
            a.offer_room(now, &mut self.buffer, &mut self.out);
            if self.buffer.first_waiting() == Some(flow) {
                // Still first (coalescing its ACK, or it found no room
                // after all): its own timer or the next freed slot goes on.
                return;
            }
        }
    }

    /// Flows waiting for room in the deep buffer (a gauge for tests and
    /// status).
    pub fn flows_waiting_for_room(&self) -> usize {
        self.buffer.waiting()
    }
}
