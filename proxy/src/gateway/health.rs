//! `soya health`: whether this gateway should attract traffic, as one
//! verdict a routing daemon (BIRD, FRR) or its helper acts on.
//!
//! A gateway pair carries a slice of the address space
//! (docs/scale-out.md); the DC routers must send the slice elsewhere as soon
//! as this gateway cannot carry it. It can carry it only when it is running
//! (not draining: a draining gateway refuses new requests) and its twin
//! answers on enough WAN paths. A gateway that does not answer on its
//! control socket at all (killed, crashed, hung) is unhealthy too: the
//! verdict is taken by the caller from the socket error.
//!
//! Pure: a [`Snapshot`] in, a verdict out, so that the rule is unit-tested
//! here and the command (`proxy/src/main.rs`) only does the I/O.

use super::snapshot::Snapshot;

/// What healthy requires beyond running and a connected twin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HealthRule {
    /// WAN paths that must be `up`, in every shard (each shard holds its
    /// own session over its own copy of the paths). At least 1.
    pub min_paths: usize,
    /// How long the twin may be `unreachable` (every path silent) and still
    /// pass. A path is declared down after `max(3 x PTO, 30 ms)` of
    /// silence, which a loaded host or a lossy second produces without
    /// anything being wrong; withdrawing the routes for that would move
    /// (and so fail) every flow of the slice. The grace adds to the time a
    /// dead twin's slice takes to leave this site's router. `lost` (after
    /// `wan.twin_timeout`) and `connecting` fail at once.
    pub unreachable_grace_secs: f64,
}

impl Default for HealthRule {
    fn default() -> Self {
        HealthRule {
            min_paths: 1,
            unreachable_grace_secs: 1.0,
        }
    }
}

/// The verdict: `Ok(reason)` when healthy, `Err(reason)` when not; the
/// reason is one line for a log or a routing daemon's check output.
pub fn verdict(s: &Snapshot, rule: HealthRule) -> Result<String, String> {
    let who = &s.site;
    if s.state != "running" {
        // `draining` (SIGTERM: new requests are refused) or `stopped`.
        return Err(format!("{who}: {}", s.state));
    }
    // The twin's own state machine is the authority: it says `lost` after
    // `wan.twin_timeout`, `unreachable` as soon as every path is down.
    let twin = s.twin_status.state.as_str();
    if twin == "unreachable" && s.twin_status.for_secs < rule.unreachable_grace_secs {
        return Ok(format!(
            "{who}: running, twin unreachable for {:.1} s (within the {} s grace)",
            s.twin_status.for_secs, rule.unreachable_grace_secs
        ));
    }
    if !s.connected || (!twin.is_empty() && twin != "connected") {
        let twin = if twin.is_empty() {
            "not connected"
        } else {
            twin
        };
        return Err(format!(
            "{who}: twin {twin} for {:.1} s",
            s.twin_status.for_secs
        ));
    }
    if let Some(sh) = s.shards.iter().find(|sh| !sh.connected) {
        return Err(format!("{who}: shard {} has no twin session", sh.index));
    }
    let shards = s.shards.len().max(1);
    let min = rule.min_paths.max(1);
    for shard in 0..shards {
        let mine: Vec<_> = s
            .paths
            .iter()
            .filter(|p| s.shards.is_empty() || p.shard == shard)
            .collect();
        let up = mine.iter().filter(|p| p.state == "up").count();
        if up < min {
            let shard = if s.shards.len() > 1 {
                format!(" (shard {shard})")
            } else {
                String::new()
            };
            return Err(format!(
                "{who}: {up} of {} WAN paths up{shard}, {min} required",
                mine.len()
            ));
        }
    }
    let up = s.paths.iter().filter(|p| p.state == "up").count();
    Ok(format!(
        "{who}: running, twin connected, {up} of {} WAN paths up",
        s.paths.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::snapshot::{PathSnap, ShardSnap, TwinStatus};

    fn healthy() -> Snapshot {
        Snapshot {
            site: "sapporo-1".into(),
            state: "running".into(),
            connected: true,
            twin_status: TwinStatus {
                state: "connected".into(),
                ..TwinStatus::default()
            },
            paths: ["p0", "p1"]
                .iter()
                .map(|n| PathSnap {
                    name: (*n).into(),
                    state: "up".into(),
                    ..PathSnap::default()
                })
                .collect(),
            shards: vec![ShardSnap {
                index: 0,
                connected: true,
                ..ShardSnap::default()
            }],
            ..Snapshot::default()
        }
    }

    #[test]
    fn running_with_a_connected_twin_and_its_paths_up_is_healthy() {
        let v = verdict(&healthy(), HealthRule::default());
        assert_eq!(
            v,
            Ok("sapporo-1: running, twin connected, 2 of 2 WAN paths up".into())
        );
    }

    #[test]
    fn draining_is_unhealthy() {
        let mut s = healthy();
        s.state = "draining".into();
        assert_eq!(
            verdict(&s, HealthRule::default()),
            Err("sapporo-1: draining".into())
        );
    }

    #[test]
    fn a_lost_or_unreachable_twin_is_unhealthy() {
        for state in ["lost", "unreachable", "connecting"] {
            let mut s = healthy();
            s.connected = false;
            s.twin_status.state = state.into();
            s.twin_status.for_secs = 2.5;
            assert_eq!(
                verdict(&s, HealthRule::default()),
                Err(format!("sapporo-1: twin {state} for 2.5 s"))
            );
        }
        let mut s = healthy();
        s.connected = false;
        assert!(verdict(&s, HealthRule::default()).is_err());
    }

    #[test]
    fn a_twin_unreachable_for_less_than_the_grace_still_passes() {
        let mut s = healthy();
        s.connected = false;
        s.twin_status.state = "unreachable".into();
        s.twin_status.for_secs = 0.6;
        for p in &mut s.paths {
            p.state = "down".into();
        }
        assert_eq!(
            verdict(&s, HealthRule::default()),
            Ok("sapporo-1: running, twin unreachable for 0.6 s (within the 1 s grace)".into())
        );
        s.twin_status.for_secs = 1.0;
        assert!(verdict(&s, HealthRule::default()).is_err());
        let strict = HealthRule {
            unreachable_grace_secs: 0.0,
            ..HealthRule::default()
        };
        s.twin_status.for_secs = 0.0;
        assert!(verdict(&s, strict).is_err());
        // Never for a lost twin, however young the loss.
        s.twin_status.state = "lost".into();
        assert!(verdict(&s, HealthRule::default()).is_err());
    }

    #[test]
    fn too_few_paths_up_is_unhealthy_only_past_the_minimum() {
        let mut s = healthy();
        s.paths[1].state = "down".into();
        assert!(verdict(
            &s,
            HealthRule {
                min_paths: 1,
                ..HealthRule::default()
            }
        )
        .is_ok());
        assert_eq!(
            verdict(
                &s,
                HealthRule {
                    min_paths: 2,
                    ..HealthRule::default()
                }
            ),
            Err("sapporo-1: 1 of 2 WAN paths up, 2 required".into())
        );
    }

    #[test]
    fn every_shard_needs_its_session_and_its_paths() {
        let mut s = healthy();
        s.shards.push(ShardSnap {
            index: 1,
            connected: false,
            ..ShardSnap::default()
        });
        assert_eq!(
            verdict(&s, HealthRule::default()),
            Err("sapporo-1: shard 1 has no twin session".into())
        );
        s.shards[1].connected = true;
        // Shard 1 owns no path that is up.
        assert_eq!(
            verdict(&s, HealthRule::default()),
            Err("sapporo-1: 0 of 0 WAN paths up (shard 1), 1 required".into())
        );
        s.paths.push(PathSnap {
            name: "p0".into(),
            state: "up".into(),
            shard: 1,
            ..PathSnap::default()
        });
        assert!(verdict(&s, HealthRule::default()).is_ok());
    }
}
