//! What an ingress half tells a restarted twin about the far QP it
//! served (`TwinMsg::Orphaned`, `qp::orphan`).

use crate::roce::Psn;

use super::super::poison::InProgress;
use super::super::twin::MAX_ORPHAN_CANDIDATES;
use super::PseudoAcker;

impl PseudoAcker {
    /// Where the far responder's expected PSN (ePSN) can be, for telling
    /// its gateway when that one restarted (`TwinMsg::Orphaned`): the PSN
    /// after the last one it acknowledged (delivered), with the message it
    /// has in progress there, then the PSN after each packet forwarded and
    /// not yet reported delivered (each may be the last it executed).
    /// Packets never forwarded cannot have been executed. Empty, with a
    /// hint for probing, when it cannot be known this way: a tunnel phase
    /// not yet acknowledged (its packets are not held here), or more than
    /// [`MAX_ORPHAN_CANDIDATES`] candidates.
    pub fn orphan_plan(&self) -> (Vec<(Psn, InProgress)>, Option<Psn>) {
        if self.raw_high.is_some() && !self.raw_acked {
            return (Vec::new(), self.raw_high.map(Psn::next));
        }
        let base = match (self.delivered, self.raw_high) {
            (Some(d), Some(r)) => Some(if d.after(r) { d } else { r }.next()),
            (d, r) => d.or(r).map(Psn::next),
        };
        let first_held = self.entries.iter().find(|e| e.slot.is_some());
        // Nothing delivered and no tunnel phase: the first packet ever
        // sent (or, learned from RDMA-CM with nothing sent, the first PSN).
        let Some(mut at) = base.or(first_held.map(|e| e.psn)).or(self.expected) else {
            return (Vec::new(), None);
        };
        let mut state = self.delivered_state;
        let mut plan = vec![(at, state)];
        for e in self.entries.iter().filter(|e| e.slot.is_some()) {
            if !e.forwarded || e.psn != at {
                break;
            }
            state = state.after(e.op);
            at = e.last().next();
            plan.push((at, state));
            if plan.len() > MAX_ORPHAN_CANDIDATES {
                return (Vec::new(), base);
            }
        }
        (plan, None)
    }
}
