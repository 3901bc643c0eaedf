//! READ responses waiting in the response flows ([`super::flows::Pending`]),
//! and what a resent READ does to them (issue 18, sweep seed 3408).
//!
//! A READ's answer is big (up to 2 GiB for one small request) and the
//! responder sends it at DC speed; behind a slower WAN it waits here.
//! The requester is go-back-N and its (hardware) timer is short (2 ms):
//! once the answer waits longer than that, or one response is lost in
//! its datacenter, it re-issues the READ from the PSN it expects, and
//! every READ after it. Forwarded as is, each re-issue made the
//! responder replay data that was already queued, behind the queued
//! copy: seed 3408 sent ~85 responses per one needed and filled the
//! queue's bound. So, for a READ the egress is about to inject toward
//! the responder (`Site::pump`), with `q` its requester's QPN:
//!
//! - **its first response (q, PSN) is queued here**: the re-issue is
//!   redundant. The requester expects that PSN (it re-issues from its
//!   expected one), everything of `q` queued behind it follows in order,
//!   and the queued copy reaches it first. The request is not injected
//!   (counted in `redundant`); should that copy still be lost, the
//!   requester asks again and finds it gone from here.
//! - **otherwise** the responder must replay it, and the responses of `q`
//!   past that PSN queued *before* now are dead: a go-back-N requester
//!   drops every response past its expected PSN until the replay comes,
//!   and the replay comes behind them. They are dropped from the queue
//!   when they reach its head instead of crossing the WAN (counted in
//!   `stale`). Safe because READ is idempotent and the replay regenerates
//!   them: the requester resends every READ after `psn` too, and its
//!   gateway forwards each of those once one READ of the round was
//!   forwarded, though it would otherwise drop them as "answered on its
//!   way" (`qp::ingress::resend`). Should one still be dropped, the
//!   `Delivered` past it, which is never dropped, makes the next resend
//!   reach the responder.
//!
//! Only READ responses are tracked; atomic ACKs (not idempotent), ACKs
//! and control messages are never dropped here.

use std::collections::VecDeque;

use crate::keyed::KeyedMap;
use crate::roce::Psn;

/// Most stale ranges remembered per flow; older ones are forgotten (their
/// responses are then sent, merely wasted: never wrong).
const MAX_RULES_PER_FLOW: usize = 256;

/// A queued READ response: its requester's QPN and PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub qpn: u32,
    pub psn: Psn,
}

/// Responses of `qpn` past `from` that were queued before `before` are
/// dead (a replay from `from` follows them).
#[derive(Clone, Copy, Debug)]
struct Stale {
    qpn: u32,
    from: Psn,
    before: u64,
}

#[derive(Default)]
pub struct ReadReplays {
    seq: u64,
    /// (flow, requester QPN, PSN) → (copies queued, newest copy's seq).
    /// (Keyed tables, `crate::keyed`: QPNs and PSNs come from the hosts.)
    queued: KeyedMap<(u64, u32, u32), (u32, u64)>,
    /// (flow, requester QPN) → (responses queued, highest PSN queued).
    per_qp: KeyedMap<(u64, u32), (u32, Psn)>,
    stale_rules: KeyedMap<u64, VecDeque<Stale>>,
    /// Resent READs not injected: their answer was queued here.
    pub redundant: u64,
    /// Queued READ responses dropped: a replay made them dead.
    pub stale: u64,
}

impl ReadReplays {
    /// The sequence number of the next message queued (any message: the
    /// order of queuing across all flows).
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// A READ response `tag` queued on `flow` as message `seq`.
    pub fn queue(&mut self, flow: u64, tag: Tag, seq: u64) {
        let Tag { qpn, psn } = tag;
        let e = self.queued.entry((flow, qpn, psn.value())).or_default();
        *e = (e.0 + 1, seq);
        let q = self.per_qp.entry((flow, qpn)).or_insert((0, psn));
        q.0 += 1;
        if psn.after(q.1) {
            q.1 = psn;
        }
    }

    /// READ response `tag` leaves `flow`'s queue (sent, or dropped).
    pub fn dequeue(&mut self, flow: u64, tag: &Tag) {
        let k = (flow, tag.qpn, tag.psn.value());
        if let Some(e) = self.queued.get_mut(&k) {
            e.0 -= 1;
            if e.0 == 0 {
                self.queued.remove(&k);
            }
        }
        if let Some(q) = self.per_qp.get_mut(&(flow, tag.qpn)) {
            q.0 -= 1;
            if q.0 == 0 {
                self.per_qp.remove(&(flow, tag.qpn));
            }
        }
    }

    /// Is message `seq`, READ response `tag`, dead (to drop rather than
    /// send)?
    pub fn is_dead(&self, flow: u64, tag: &Tag, seq: u64) -> bool {
        self.is_stale(flow, tag.qpn, tag.psn, seq)
    }

    fn is_stale(&self, flow: u64, qpn: u32, psn: Psn, seq: u64) -> bool {
        self.stale_rules.get(&flow).is_some_and(|rules| {
            rules
                .iter()
                .any(|r| r.qpn == qpn && seq < r.before && psn.after(r.from))
        })
    }

    /// A READ of `qpn` starting at `psn` is about to be injected toward
    /// its responder; its answers travel on `flow`. Returns whether it is
    /// redundant (not to be injected).
    pub fn on_read(&mut self, flow: u64, qpn: u32, psn: Psn) -> bool {
        let copy = self.queued.get(&(flow, qpn, psn.value()));
        if copy.is_some_and(|&(_, seq)| !self.is_stale(flow, qpn, psn, seq)) {
            self.redundant += 1;
            return true;
        }
        // Anything of `qpn` queued past `psn` is dead once the replay
        // follows it. (A new READ finds only lower PSNs queued: no rule.)
        if self
            .per_qp
            .get(&(flow, qpn))
            .is_some_and(|&(_, high)| high.after(psn))
        {
            let rules = self.stale_rules.entry(flow).or_default();
            if rules.len() == MAX_RULES_PER_FLOW {
                rules.pop_front();
            }
            rules.push_back(Stale {
                qpn,
                from: psn,
                before: self.seq + 1,
            });
        }
        false
    }

    /// The head of `flow`'s queue is now `front` (`None`: empty): rules
    /// about messages queued before it have done their work.
    pub fn advanced(&mut self, flow: u64, front: Option<u64>) {
        let Some(rules) = self.stale_rules.get_mut(&flow) else {
            return;
        };
        match front {
            Some(seq) => rules.retain(|r| r.before > seq),
            None => rules.clear(),
        }
        if rules.is_empty() {
            self.stale_rules.remove(&flow);
        }
    }

    /// Everything queued was dropped (the twin restarted).
    pub fn clear(&mut self) {
        self.queued.clear();
        self.per_qp.clear();
        self.stale_rules.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOW: u64 = 7;
    const QP: u32 = 0x11;

    fn queue(r: &mut ReadReplays, psn: u32) -> u64 {
        let seq = r.next_seq();
        r.queue(
            FLOW,
            Tag {
                qpn: QP,
                psn: Psn::new(psn),
            },
            seq,
        );
        seq
    }

    fn tag(psn: u32) -> Tag {
        Tag {
            qpn: QP,
            psn: Psn::new(psn),
        }
    }

    /// A new READ (its PSNs past everything waiting) kills nothing; a
    /// replay from 101 kills what waits past 101 and nothing before it,
    /// nor its own answer queued after it; a re-issue at 102 then finds
    /// only a dead copy: not redundant.
    #[test]
    fn a_replay_kills_only_older_answers_past_its_psn() {
        let mut r = ReadReplays::default();
        let old: Vec<(u32, u64)> = (100..104).map(|p| (p, queue(&mut r, p))).collect();
        assert!(!r.on_read(FLOW, QP, Psn::new(200)), "a new READ");
        assert!(old.iter().all(|&(p, s)| !r.is_dead(FLOW, &tag(p), s)));
        assert!(r.on_read(FLOW, QP, Psn::new(101)), "101 still waits");
        assert_eq!(r.redundant, 1);
        // 101 left and was lost downstream: the re-issue is replayed.
        r.dequeue(FLOW, &tag(101));
        assert!(!r.on_read(FLOW, QP, Psn::new(101)));
        let replayed = queue(&mut r, 102);
        let dead: Vec<u32> = old
            .iter()
            .filter(|&&(p, s)| r.is_dead(FLOW, &tag(p), s))
            .map(|&(p, _)| p)
            .collect();
        assert_eq!(dead, vec![102, 103]);
        assert!(!r.is_dead(FLOW, &tag(102), replayed), "the replay's own");
        assert!(
            !r.is_dead(
                FLOW,
                &Tag {
                    qpn: 0x12,
                    ..tag(103)
                },
                old[3].1
            ),
            "another QP's"
        );
        // The replay's 102 waits: a re-issue at 102 is redundant again.
        assert!(r.on_read(FLOW, QP, Psn::new(102)));
        // Once the queue's head is past the rule, it is forgotten.
        r.advanced(FLOW, Some(replayed));
        assert!(r.stale_rules.is_empty());
    }
}
