//! A reload, sans-IO: [`Site::reconfigure`] applies new [`SiteParams`] to a
//! running site without failing a flow, and says what it could not apply.
//!
//! What applies at once:
//!
//! - the WAN paths: added, removed, rate, weight ([`WanConnection::reconfigure_paths`]:
//!   a removed path's in-flight packets are resent on the others);
//! - the ACL (`dc.local_prefixes` / `remote_prefixes`): every packet from
//!   now on is checked against the new prefixes. New flows follow the new
//!   ACL; an existing flow whose hosts are no longer in it is **refused**
//!   (its packets are dropped at the ACL and counted, its requester's own
//!   retries end it with an error completion: never a silent loss). A
//!   narrower ACL is a decision to cut those hosts off; draining them
//!   would keep a door open the operator meant to close
//!   (docs/operations.md);
//! - the pseudo-ACK and re-injection tuning, for QP halves learned from
//!   now on ([`QpEngine::retune`](crate::qp::QpEngine::retune));
//! - the per-flow buffer quota, within the slots allocated at start, for
//!   every flow at once;
//! - `wan.twin_timeout`;
//! - `wan.rekey_interval`: the next re-handshake comes no later than the
//!   new interval from the reload, and each after it an interval later;
//! - with identity keys before and after: a new identity key pair, twin
//!   public key or PSK ([`WanConnection::rotate_keys`](crate::wan::WanConnection::rotate_keys):
//!   used from the next handshake on, the keys before accepted for
//!   [`ROTATION_WINDOW`](crate::wan::ROTATION_WINDOW)).
//!
//! What needs a restart is listed in [`ReconfigureReport::need_restart`]:
//! the buffer's size and slot size (allocated at start), the WAN key,
//! cipher and datagram size (bound into the session), a change of the
//! congestion controller family (FixedRate when every path has a rate, Bbr
//! otherwise), a WAN flow window the new quota would raise (advertised in
//! the HELLO), and a change of which twin is the client (the prefixes
//! decide it).

use crate::wan::{PathChange, PathState};

use super::{Site, SiteParams};
use crate::time::Time;

/// What [`Site::reconfigure`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconfigureReport {
    /// The path slots that changed.
    pub paths: Vec<PathChange>,
    /// Other settings applied (names of the configuration keys).
    pub applied: Vec<&'static str>,
    /// Settings that changed but apply only after a restart.
    pub need_restart: Vec<&'static str>,
}

impl Site {
    /// Applies `new` (built by [`SiteParams::from_config`] from the
    /// re-read configuration) at `now`. Fails no flow.
    pub fn reconfigure(&mut self, new: SiteParams, now: Time) -> ReconfigureReport {
        self.input(now);
        let mut r = ReconfigureReport::default();
        let old = &self.params;
        let (oe, ne) = (&old.engine, &new.engine);
        let (ow, nw) = (&old.wan, &new.wan);
        let mut restart = |changed: bool, key: &'static str| {
            if changed {
                r.need_restart.push(key);
            }
        };
        // Identity mode on both sides of the reload: new keys rotate live.
        let rotate = ow.identity.is_some()
            && nw.identity.is_some()
            && (ow.identity != nw.identity || ow.key != nw.key);
        restart(!rotate && ow.key != nw.key, "wan.key_file / wan.insecure");
        restart(
            !rotate && ow.identity != nw.identity,
            "wan.private_key_file / wan.twin_public_key",
        );
        restart(ow.cipher != nw.cipher, "wan.cipher");
        restart(ow.max_datagram != nw.max_datagram, "wan.mtu");
        restart(ow.hello_context != nw.hello_context, "gateway.shards");
        restart(
            ow.cc != nw.cc,
            "wan.paths[].rate (congestion control: FixedRate needs a rate on every path)",
        );
        restart(
            ow.is_client != nw.is_client,
            "dc prefixes (which twin is the client)",
        );
        restart(
            oe.buffer_slots != ne.buffer_slots || oe.slot_bytes != ne.slot_bytes,
            "buffer.size / buffer.slot_bytes",
        );
        restart(
            nw.flow_window_bytes > ow.flow_window_bytes,
            "buffer.per_flow_quota (raises the WAN flow window)",
        );

        // The engine: tuning for new halves, the quota for all.
        let mut engine = *ne;
        engine.hash_key = oe.hash_key;
        engine.buffer_slots = oe.buffer_slots;
        engine.slot_bytes = oe.slot_bytes;
        if engine.ack != oe.ack {
            r.applied.push("pseudo_ack");
        }
        if engine.egress != oe.egress {
            r.applied
                .push("dc.retransmit_floor / dc.give_up_after / dc.rnr_give_up");
        }
        if engine.per_flow_slots != oe.per_flow_slots {
            r.applied.push("buffer.per_flow_quota");
        }
        self.engine.retune(&engine);

        if old.acl.local != new.acl.local || old.acl.remote != new.acl.remote {
            r.applied.push("dc.local_prefixes / dc.remote_prefixes");
        }
        if old.twin_timeout != new.twin_timeout {
            r.applied.push("wan.twin_timeout");
        }

        // The WAN: what the session was built with stays; the paths follow,
        // and rotated keys.
        let mut wan = old.wan.clone();
        wan.paths = new.wan.paths.clone();
        if let (true, Some(id)) = (rotate, nw.identity.clone()) {
            if self.wan.rotate_keys(now, id, nw.key) {
                r.applied.push(
                    "wan.private_key_file / wan.twin_public_key / wan.key_file (next handshake)",
                );
            }
            wan.identity = nw.identity.clone();
            wan.key = nw.key;
        }
        if ow.tuning.rekey_interval != nw.tuning.rekey_interval {
            self.wan.set_rekey_interval(now, nw.tuning.rekey_interval);
            wan.tuning.rekey_interval = nw.tuning.rekey_interval;
            r.applied.push("wan.rekey_interval");
        }
        r.paths = self.wan.reconfigure_paths(now, &wan.paths);
        let stats = self.wan.stats();
        let retired: Vec<usize> = stats
            .paths
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state == PathState::Retired)
            .map(|(i, _)| i)
            .collect();
        self.twin
            .reconfigure(now, stats.paths.len(), &retired, new.twin_timeout);

        self.params = SiteParams {
            engine,
            wan,
            acl: new.acl,
            twin_timeout: new.twin_timeout,
        };
        self.dirty = true;
        r
    }
}
