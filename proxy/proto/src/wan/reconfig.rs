//! Changing the set of WAN paths of a live connection (a reload), without
//! losing a message.
//!
//! Path `i` here must be path `i` at the twin: the header's path number
//! says which path a packet went on, and (path, packet number) is the
//! AEAD nonce. So a path's number is its position in the configuration,
//! at start and at a reload alike, and what a reload does is slot by slot:
//!
//! - the same name at the same position: rate, weight and RTT hint follow
//!   the new configuration (a rate change restarts the path's congestion
//!   controller at the new rate: FixedRate paces at it at once);
//! - a position past the end: a new path, probed until the twin answers on
//!   it (it does once it reloads too);
//! - a position that disappeared, or now holds another path (removing a
//!   path renumbers those after it): the old path is **retired**. Whatever
//!   it had in flight goes back to the retransmission queue at once and
//!   leaves on the other paths; nothing more is sent or accepted on it.
//!
//! A slot keeps its packet numbers and its replay window whatever path
//! holds it, so that a path that takes a slot over in the same session
//! never reuses a nonce, and the twin's packets on it (its slot keeps its
//! numbers too) are not mistaken for replays. Retired slots past the end
//! are forgotten when the twin restarts (new keys, new numbers).
//!
//! Until both twins have reloaded, a new or renumbered path carries
//! nothing (its packets land on the wrong path at the twin and are
//! dropped, counted); the unchanged paths carry the traffic meanwhile.

use super::path::{Path, PathState};
use super::recovery::SentPacket;
use super::{new_path, Event, PathConfig, Time, WanConnection, MAX_PATHS};
use std::time::Duration;

/// What a reconfiguration did to one path slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathChange {
    /// A new path at `index` (probed until the twin answers on it).
    Added { index: usize, name: String },
    /// The path at `index` was removed; its in-flight packets were queued
    /// for retransmission on the others.
    Removed {
        index: usize,
        name: String,
        requeued_packets: usize,
    },
    /// Same path, new settings (`what`: "rate", "weight", "rtt").
    Retuned {
        index: usize,
        name: String,
        what: Vec<&'static str>,
    },
}

impl std::fmt::Display for PathChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathChange::Added { index, name } => write!(f, "path {index} ({name}) added"),
            PathChange::Removed {
                index,
                name,
                requeued_packets,
            } => write!(
                f,
                "path {index} ({name}) removed ({requeued_packets} packets in flight resent on the others)"
            ),
            PathChange::Retuned { index, name, what } => {
                write!(f, "path {index} ({name}): {} changed", what.join(", "))
            }
        }
    }
}

impl WanConnection {
    /// Makes the path set `paths` (at most [`MAX_PATHS`]; more are
    /// ignored), as the module documentation says. Loses nothing: what a
    /// removed path had in flight is resent on the others.
    pub fn reconfigure_paths(&mut self, now: Time, paths: &[PathConfig]) -> Vec<PathChange> {
        self.last_now = self.last_now.max(now);
        let paths = &paths[..paths.len().min(MAX_PATHS)];
        let mss = self.max_datagram as u64;
        let mut changes = Vec::new();
        for (i, pc) in paths.iter().enumerate() {
            if i >= self.paths.len() {
                let mut p = new_path(pc, self.cc_kind, mss, &self.tuning, now);
                self.start_probing(&mut p, now);
                self.paths.push(p);
                self.close_pending.push(false);
                changes.push(PathChange::Added {
                    index: i,
                    name: pc.name.clone(),
                });
                continue;
            }
            let same = self.paths[i].state != PathState::Retired && self.paths[i].name == pc.name;
            if same {
                let p = &mut self.paths[i];
                let mut what = Vec::new();
                if p.weight != pc.weight {
                    p.weight = pc.weight;
                    what.push("weight");
                }
                if p.rate_bps != pc.rate_bps {
                    p.rate_bps = pc.rate_bps;
                    p.cc = super::new_controller(
                        pc.rate_bps,
                        self.cc_kind,
                        mss,
                        p.rtt.smoothed(),
                        now,
                    );
                    what.push("rate");
                }
                if !what.is_empty() {
                    changes.push(PathChange::Retuned {
                        index: i,
                        name: pc.name.clone(),
                        what,
                    });
                }
                continue;
            }
            if let Some(c) = self.retire(i) {
                changes.push(c);
            }
            // The newcomer takes over the slot's packet numbers and replay
            // window (see the module documentation).
            let mut p = new_path(pc, self.cc_kind, mss, &self.tuning, now);
            let old = &mut self.paths[i];
            std::mem::swap(&mut p.recovery, &mut old.recovery);
            std::mem::swap(&mut p.replay, &mut old.replay);
            p.recovery.reset();
            self.start_probing(&mut p, now);
            self.paths[i] = p;
            changes.push(PathChange::Added {
                index: i,
                name: pc.name.clone(),
            });
        }
        for i in paths.len()..self.paths.len() {
            if let Some(c) = self.retire(i) {
                changes.push(c);
            }
        }
        changes
    }

    /// A new path in an open session: HELLO (if none yet) or PING at once.
    fn start_probing(&self, p: &mut Path, now: Time) {
        p.next_probe = now;
        p.last_ack_rx = now;
        if self.session.peer.is_some() {
            p.ping_due = true;
        } else {
            p.hello_due = true;
        }
    }

    /// Takes path `i` out of service; `None` if it already was.
    fn retire(&mut self, i: usize) -> Option<PathChange> {
        let p = &mut self.paths[i];
        if p.state == PathState::Retired {
            return None;
        }
        let was_up = p.state == PathState::Up;
        p.state = PathState::Retired;
        p.ping_due = false;
        p.hello_due = false;
        p.acks.reset();
        let lost = p.recovery.drain_all();
        let name = p.name.clone();
        self.close_pending[i] = false;
        let requeued_packets = lost.len();
        self.requeue(lost);
        if was_up {
            // The site's twin watch counts it out.
            self.push_event(Event::PathDown(i));
        }
        Some(PathChange::Removed {
            index: i,
            name,
            requeued_packets,
        })
    }

    /// Queues the data and credits of `packets` again (they are not lost:
    /// their path was removed, not found wanting).
    fn requeue(&mut self, packets: Vec<SentPacket>) {
        for sp in packets {
            self.requeue_frames(sp);
        }
    }

    /// After the twin restarted: retired slots at the end are gone for good.
    pub(super) fn drop_trailing_retired(&mut self) {
        while self
            .paths
            .last()
            .is_some_and(|p| p.state == PathState::Retired)
        {
            self.paths.pop();
            self.close_pending.pop();
        }
    }

    /// Paths in service (not retired).
    pub fn active_paths(&self) -> usize {
        self.paths
            .iter()
            .filter(|p| p.state != PathState::Retired)
            .count()
    }
}

impl WanConnection {
    /// Identity mode: new keys from a reload (`session::rotate`): used
    /// from the next handshake on (the client starts one at once), the
    /// keys before still accepted for [`ROTATION_WINDOW`](super::ROTATION_WINDOW).
    /// Returns false in PSK-only or lab mode (a restart is needed) and when
    /// nothing changed.
    pub fn rotate_keys(
        &mut self,
        now: Time,
        identity: super::Identity,
        psk: Option<[u8; 32]>,
    ) -> bool {
        self.last_now = self.last_now.max(now);
        if !self.session.rotate_keys(identity, psk, now) {
            return false;
        }
        if self.session.wants_hello() {
            self.hello_interval = self.tuning.hello_interval;
            self.hello_next = now;
        }
        true
    }

    /// `wan.rekey_interval` from a reload: the re-handshake planned next
    /// comes no later than `interval` from `now`, and each after it
    /// `interval` after the one before.
    pub fn set_rekey_interval(&mut self, now: Time, interval: Duration) {
        self.last_now = self.last_now.max(now);
        self.tuning.rekey_interval = interval;
        self.session.retime_rekey(interval, now);
    }
}
