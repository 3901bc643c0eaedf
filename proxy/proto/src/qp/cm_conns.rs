//! The RDMA-CM connections an engine remembers (`QpEngine::cm_conns`):
//! what a DREQ in a host's name needs when its twin is lost or its far
//! responder fails.
//!
//! Every operation is O(log n) in the connections remembered (plus the
//! connections it hands back): a gateway under QP churn learns one on
//! every REP and forgets one on every DREQ, DREP or REJ, and with up to
//! [`MAX_CM_CONNS`] remembered a linear scan per CM message (the `Vec`
//! this replaces: `remove(0)` to evict the oldest, `retain` to forget)
//! cost up to 65,536 steps per packet. Ordered maps rather than hash maps:
//! comm IDs and addresses come from DC hosts, and a B-tree cannot be
//! flooded into its worst case.
//!
//! Behaviour is that of the `Vec`: insertion order is kept (DREQs go out
//! oldest first), the same connection may be remembered twice (a REP seen
//! twice), and at the bound the oldest is forgotten.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// An RDMA-CM connection with one end here and one at the twin's site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CmConn {
    pub(super) local: IpAddr,
    pub(super) far: IpAddr,
    pub(super) local_comm_id: u32,
    pub(super) far_comm_id: u32,
    pub(super) local_qpn: u32,
    /// The far end's QP (the DREQ toward it names it).
    pub(super) far_qpn: u32,
}

/// At most this many RDMA-CM connections are remembered (the oldest go).
pub(super) const MAX_CM_CONNS: usize = 65_536;

#[derive(Debug, Default)]
pub(super) struct CmConns {
    /// Insertion sequence → connection: the order, and the oldest first.
    by_seq: BTreeMap<u64, CmConn>,
    /// (lower comm ID, higher comm ID, seq): a DREQ/DREP/REJ names both.
    by_pair: BTreeSet<(u32, u32, u64)>,
    /// (comm ID, seq) for each of a connection's two IDs (once when they
    /// are equal): a message whose two IDs are equal matches every
    /// connection that has it on either side.
    by_id: BTreeSet<(u32, u64)>,
    /// (local address, far address, local QPN, seq): a far responder's
    /// error names the local requester's QP.
    by_local_qp: BTreeSet<(IpAddr, IpAddr, u32, u64)>,
    next_seq: u64,
}

fn pair(c: &CmConn) -> (u32, u32) {
    let (a, b) = (c.local_comm_id, c.far_comm_id);
    (a.min(b), a.max(b))
}

impl CmConns {
    pub(super) fn len(&self) -> usize {
        self.by_seq.len()
    }

    /// Remembers `c` (after the others); at the bound, the oldest goes.
    pub(super) fn push(&mut self, c: CmConn) {
        if self.len() >= MAX_CM_CONNS {
            if let Some((&seq, _)) = self.by_seq.first_key_value() {
                self.remove(seq);
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let (lo, hi) = pair(&c);
        self.by_pair.insert((lo, hi, seq));
        self.by_id.insert((lo, seq));
        self.by_id.insert((hi, seq));
        self.by_local_qp.insert((c.local, c.far, c.local_qpn, seq));
        self.by_seq.insert(seq, c);
    }

    fn remove(&mut self, seq: u64) -> Option<CmConn> {
        let c = self.by_seq.remove(&seq)?;
        let (lo, hi) = pair(&c);
        self.by_pair.remove(&(lo, hi, seq));
        self.by_id.remove(&(lo, seq));
        self.by_id.remove(&(hi, seq));
        self.by_local_qp.remove(&(c.local, c.far, c.local_qpn, seq));
        Some(c)
    }

    fn take(&mut self, mut seqs: Vec<u64>) -> Vec<CmConn> {
        seqs.sort_unstable();
        seqs.into_iter().filter_map(|s| self.remove(s)).collect()
    }

    /// Forgets the connections a DREQ, DREP or REJ with these two comm IDs
    /// names: those whose two IDs include both (a connection torn down or
    /// refused normally needs no DREQ later). Returns how many.
    pub(super) fn forget_comm_ids(&mut self, a: u32, b: u32) -> usize {
        let seqs: Vec<u64> = if a == b {
            self.by_id
                .range((a, 0)..=(a, u64::MAX))
                .map(|&(_, s)| s)
                .collect()
        } else {
            let (lo, hi) = (a.min(b), a.max(b));
            self.by_pair
                .range((lo, hi, 0)..=(lo, hi, u64::MAX))
                .map(|&(_, _, s)| s)
                .collect()
        };
        self.take(seqs).len()
    }

    /// Takes (forgets and returns, oldest first) the connections between
    /// `local` and `far` whose local end is QP `local_qpn`.
    pub(super) fn take_local_qp(
        &mut self,
        local: IpAddr,
        far: IpAddr,
        local_qpn: u32,
    ) -> Vec<CmConn> {
        let seqs = self
            .by_local_qp
            .range((local, far, local_qpn, 0)..=(local, far, local_qpn, u64::MAX))
            .map(|&(_, _, _, s)| s)
            .collect();
        self.take(seqs)
    }

    /// Takes every connection, oldest first.
    pub(super) fn take_all(&mut self) -> Vec<CmConn> {
        let all = std::mem::take(&mut self.by_seq);
        *self = CmConns {
            next_seq: self.next_seq,
            ..CmConns::default()
        };
        all.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn conn(n: u32, local_comm_id: u32, far_comm_id: u32) -> CmConn {
        CmConn {
            local: IpAddr::from([10, 1, 0, (n % 250) as u8 + 1]),
            far: IpAddr::from([10, 2, 0, 1]),
            local_comm_id,
            far_comm_id,
            local_qpn: 0x100 + n,
            far_qpn: 0x900 + n,
        }
    }

    /// The `Vec` this replaces, as the engine used it: the reference.
    #[derive(Default)]
    struct Model(Vec<CmConn>);
    impl Model {
        fn push(&mut self, c: CmConn) {
            if self.0.len() >= MAX_CM_CONNS {
                self.0.remove(0);
            }
            self.0.push(c);
        }
        fn forget_comm_ids(&mut self, a: u32, b: u32) -> usize {
            let before = self.0.len();
            self.0.retain(|c| {
                let ids = [c.local_comm_id, c.far_comm_id];
                !(ids.contains(&a) && ids.contains(&b))
            });
            before - self.0.len()
        }
        fn take_local_qp(&mut self, local: IpAddr, far: IpAddr, qpn: u32) -> Vec<CmConn> {
            let (chosen, kept) = std::mem::take(&mut self.0)
                .into_iter()
                .partition(|c| c.local == local && c.far == far && c.local_qpn == qpn);
            self.0 = kept;
            chosen
        }
    }

    #[test]
    fn behaves_as_the_vec_it_replaces() {
        // A deterministic mix: learn, tear down by either ID order, equal
        // IDs, duplicates, far errors, and a take of everything.
        let mut m = Model::default();
        let mut s = CmConns::default();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let mut rnd = |n: u64| rng.random_range(0..n);
        for i in 0..20_000u32 {
            match rnd(10) {
                0..=4 => {
                    let (a, b) = (rnd(64) as u32, rnd(64) as u32);
                    let c = conn(rnd(16) as u32, a, b);
                    m.push(c);
                    s.push(c);
                }
                5 | 6 => {
                    let (a, b) = (rnd(64) as u32, rnd(64) as u32);
                    assert_eq!(s.forget_comm_ids(a, b), m.forget_comm_ids(a, b), "step {i}");
                }
                7 => {
                    let a = rnd(64) as u32;
                    assert_eq!(s.forget_comm_ids(a, a), m.forget_comm_ids(a, a), "step {i}");
                }
                8 => {
                    let c = conn(rnd(16) as u32, 0, 0);
                    assert_eq!(
                        s.take_local_qp(c.local, c.far, c.local_qpn),
                        m.take_local_qp(c.local, c.far, c.local_qpn),
                        "step {i}"
                    );
                }
                _ if rnd(50) == 0 => {
                    assert_eq!(s.take_all(), std::mem::take(&mut m.0), "step {i}");
                }
                _ => {}
            }
            assert_eq!(s.len(), m.0.len(), "step {i}");
        }
        assert_eq!(s.take_all(), m.0);
    }

    #[test]
    fn at_the_bound_the_oldest_goes() {
        let mut s = CmConns::default();
        for i in 0..=MAX_CM_CONNS as u32 {
            s.push(conn(i, i, i.wrapping_add(1 << 20)));
        }
        assert_eq!(s.len(), MAX_CM_CONNS);
        // The first is gone, the second is the oldest now.
        assert_eq!(s.forget_comm_ids(0, 1 << 20), 0);
        let all = s.take_all();
        assert_eq!(all.len(), MAX_CM_CONNS);
        assert_eq!(all[0].local_comm_id, 1);
        assert_eq!(all.last().unwrap().local_comm_id, MAX_CM_CONNS as u32);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_teardown_among_many_forgets_only_its_own() {
        let mut s = CmConns::default();
        for i in 0..1000u32 {
            s.push(conn(i, 2 * i, 2 * i + 1));
        }
        // Either order of the IDs (a DREQ from either end).
        assert_eq!(s.forget_comm_ids(501, 500), 1);
        assert_eq!(s.forget_comm_ids(500, 501), 0);
        assert_eq!(s.len(), 999);
        let c = conn(7, 0, 0);
        let got = s.take_local_qp(c.local, c.far, c.local_qpn);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].local_comm_id, 14);
        assert_eq!(s.len(), 998);
    }
}
