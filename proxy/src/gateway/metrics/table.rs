//! Every metric the gateway exports, declared once: name, type, help, label
//! names and how its samples are read from a
//! [`Snapshot`](crate::gateway::snapshot::Snapshot) (with the helpers of
//! [`super::sample`]).
//!
//! This table is the single source of the metric list. The exposition
//! ([`super::exposition`]) walks it at each scrape; `soya metrics-spec --json`
//! prints it for the Grafana dashboard generator and the alert check
//! (packaging/metrics-spec.json, kept up to date by a test); the daemon's
//! documentation lists it from docs/operations.md.

use super::sample::{by, flows, one, path_dirs, paths, paths_by, shards_by, FLOW, PATH, PATH_DIR};
pub use super::sample::{Kind, Metric, Sample, Value};

/// The table as JSON (`soya metrics-spec --json`, packaging/metrics-spec.json).
pub fn spec_json() -> String {
    serde_json::to_string_pretty(METRICS).unwrap_or_default() + "\n"
}

use Kind::{Counter, Gauge};

/// Every metric, in exposition order.
pub static METRICS: &[Metric] = &[
    // The gateway.
    Metric {
        name: "soya_info",
        kind: Gauge,
        help: "Gateway identity (value 1).",
        labels: &["site", "version", "backend", "policy", "generation", "insecure"],
        samples: |s| {
            vec![Sample {
                labels: vec![
                    ("site", s.site.clone()),
                    ("version", s.version.clone()),
                    ("backend", s.backend.clone()),
                    ("policy", s.policy.clone()),
                    ("generation", format!("{:#018x}", s.generation)),
                    ("insecure", s.insecure.to_string()),
                ],
                value: Value::Int(1),
            }]
        },
    },
    Metric {
        name: "soya_uptime_seconds",
        kind: Gauge,
        help: "Seconds since the gateway started.",
        labels: &[],
        samples: |s| one((s.uptime_secs * 1e3).round() / 1e3),
    },
    Metric {
        name: "soya_draining",
        kind: Gauge,
        help: "1 while draining for shutdown.",
        labels: &[],
        samples: |s| one(s.state == "draining"),
    },
    Metric {
        name: "soya_wan_connected",
        kind: Gauge,
        help: "1 while a WAN path to the twin answers.",
        labels: &[],
        samples: |s| one(s.connected),
    },
    Metric {
        name: "soya_twin_state",
        kind: Gauge,
        help: "1 for the twin's current state: connecting, connected, unreachable (every path down) or lost (down for wan.twin_timeout: flows failed).",
        labels: &["state"],
        samples: |s| {
            let st = s.twin_status.state.as_str();
            by("state", &["connecting", "connected", "unreachable", "lost"].map(|n| (n, u64::from(st == n))))
        },
    },
    Metric {
        name: "soya_twin_unreachable_seconds",
        kind: Gauge,
        help: "Seconds since every WAN path went down (0 while a path answers).",
        labels: &[],
        samples: |s| one(s.twin_status.for_secs),
    },
    // The data-center side.
    Metric {
        name: "soya_dc_rx_packets_total",
        kind: Counter,
        help: "Packets read from the data-center side, by result.",
        labels: &["result"],
        samples: |s| {
            let d = &s.dc;
            by("result", &[
                ("accepted", d.rx_accepted),
                ("malformed", d.rx_malformed),
                ("acl_source", d.rx_acl_source),
                ("acl_destination", d.rx_acl_destination),
                ("draining", d.rx_draining),
                ("backpressure", d.rx_backpressure),
            ])
        },
    },
    Metric {
        name: "soya_dc_rx_kernel_drops_total",
        kind: Counter,
        help: "Packets for the gateway the kernel dropped before it read them (tun queue or socket buffer full).",
        labels: &[],
        samples: |s| one(s.dc.rx_kernel_drops),
    },
    Metric {
        name: "soya_dc_rx_bytes_total",
        kind: Counter,
        help: "Bytes read from the data-center side.",
        labels: &[],
        samples: |s| one(s.dc.rx_bytes),
    },
    Metric {
        name: "soya_dc_tx_packets_total",
        kind: Counter,
        help: "Packets for the data-center side, by result.",
        labels: &["result"],
        samples: |s| {
            let d = &s.dc;
            by("result", &[("sent", d.tx_packets), ("no_peer", d.tx_no_peer), ("acl", d.tx_acl), ("error", d.tx_errors)])
        },
    },
    Metric {
        name: "soya_dc_tx_bytes_total",
        kind: Counter,
        help: "Bytes written to the data-center side.",
        labels: &[],
        samples: |s| one(s.dc.tx_bytes),
    },
    Metric {
        name: "soya_dc_lab_hosts",
        kind: Gauge,
        help: "udp backend: lab hosts whose UDP address is learned.",
        labels: &[],
        samples: |s| one(s.dc.lab_hosts),
    },
    Metric {
        name: "soya_dc_lab_host_conflicts_total",
        kind: Counter,
        help: "udp backend: datagrams for a host bound to another active UDP address.",
        labels: &[],
        samples: |s| one(s.dc.lab_host_conflicts),
    },
    Metric {
        name: "soya_dc_handoff_packets_total",
        kind: Counter,
        help: "DC packets read by one shard for another: queued to it, dropped (its queue full), received by it.",
        labels: &["result"],
        samples: |s| {
            let d = &s.dc;
            by("result", &[("out", d.handoff_out), ("dropped", d.handoff_dropped), ("in", d.handoff_in)])
        },
    },
    // Shards (device threads).
    Metric {
        name: "soya_shards",
        kind: Gauge,
        help: "Shards (device threads) of the gateway.",
        labels: &[],
        samples: |s| one(s.shards.len().max(1)),
    },
    Metric {
        name: "soya_shard_connected",
        kind: Gauge,
        help: "1 when the shard has a session with the twin's shard of the same index.",
        labels: &["shard"],
        samples: |s| {
            s.shards
                .iter()
                .map(|sh| Sample {
                    labels: vec![("shard", sh.index.to_string())],
                    value: sh.connected.into(),
                })
                .collect()
        },
    },
    Metric {
        name: "soya_dc_xdp_mode",
        kind: Gauge,
        help: "xdp backend: 1 for the mode each shard's AF_XDP socket runs in (zero-copy where the driver offers it, copy otherwise).",
        labels: &["shard", "mode"],
        samples: |s| {
            s.shards
                .iter()
                .filter(|sh| !sh.dc_mode.is_empty())
                .map(|sh| Sample {
                    labels: vec![("shard", sh.index.to_string()), ("mode", sh.dc_mode.clone())],
                    value: Value::Int(1),
                })
                .collect()
        },
    },
    Metric {
        name: "soya_shard_dc_packets_total",
        kind: Counter,
        help: "DC packets of the shard: accepted into its engine (rx), written (tx).",
        labels: &["shard", "dir"],
        samples: |s| shards_by(s, "dir", |x| [("rx", x.dc_rx_accepted), ("tx", x.dc_tx_packets)]),
    },
    Metric {
        name: "soya_shard_twin_messages_total",
        kind: Counter,
        help: "Messages between the shard's engine and its twin.",
        labels: &["shard", "dir"],
        samples: |s| shards_by(s, "dir", |x| [("out", x.twin_msgs_out), ("in", x.twin_msgs_in)]),
    },
    Metric {
        name: "soya_shard_wan_packets_total",
        kind: Counter,
        help: "WAN packets of the shard's connection.",
        labels: &["shard", "dir"],
        samples: |s| shards_by(s, "dir", |x| [("sent", x.wan_packets_sent), ("received", x.wan_packets_received)]),
    },
    Metric {
        name: "soya_shard_handoff_packets_total",
        kind: Counter,
        help: "DC packets the shard handed to others (out, dropped) or received from them (in).",
        labels: &["shard", "result"],
        samples: |s| {
            let mut out = Vec::new();
            for sh in &s.shards {
                for (r, v) in [("out", sh.handoff_out), ("dropped", sh.handoff_dropped), ("in", sh.handoff_in)] {
                    out.push(Sample {
                        labels: vec![("shard", sh.index.to_string()), ("result", r.to_string())],
                        value: Value::Int(v),
                    });
                }
            }
            out
        },
    },
    Metric {
        name: "soya_shard_xdp_lent_tx_packets_total",
        kind: Counter,
        help: "xdp backend, packets toward the DC decoded into lent UMEM: sent in place (no copy), copied (their UMEM still being sent), heap (no UMEM was free: decoded to the heap, copied).",
        labels: &["shard", "result"],
        samples: |s| {
            let mut out = Vec::new();
            for sh in &s.shards {
                for (r, v) in [("in_place", sh.xdp_tx_in_place), ("copied", sh.xdp_tx_busy_copied), ("heap", sh.xdp_lend_empty)] {
                    out.push(Sample {
                        labels: vec![("shard", sh.index.to_string()), ("result", r.to_string())],
                        value: Value::Int(v),
                    });
                }
            }
            out
        },
    },
    Metric {
        name: "soya_shard_xdp_rx_frames_total",
        kind: Counter,
        help: "xdp backend, multi-buffer frames from the DC (a 4096-byte MTU's 4.2 KB frames): lent to the site in place on the RX tape (no copy), or gathered (one copy) because they straddled a break in the tape (break) or the tape's budget of held frames was spent (full).",
        labels: &["shard", "result"],
        samples: |s| {
            let mut out = Vec::new();
            for sh in &s.shards {
                for (r, v) in [("in_place", sh.xdp_rx_in_place), ("break", sh.xdp_rx_gathered_break), ("full", sh.xdp_rx_gathered_full)] {
                    out.push(Sample {
                        labels: vec![("shard", sh.index.to_string()), ("result", r.to_string())],
                        value: Value::Int(v),
                    });
                }
            }
            out
        },
    },
    Metric {
        name: "soya_shard_xdp_unresolved_tx_packets_total",
        kind: Counter,
        help: "xdp backend, packets toward a host the kernel had no neighbour entry for yet: held until it had one, then sent (held), or dropped (the hold queue full, or no entry within a second).",
        labels: &["shard", "result"],
        samples: |s| {
            let mut out = Vec::new();
            for sh in &s.shards {
                for (r, v) in [("held", sh.xdp_tx_held), ("dropped", sh.xdp_tx_unresolved_dropped)] {
                    out.push(Sample {
                        labels: vec![("shard", sh.index.to_string()), ("result", r.to_string())],
                        value: Value::Int(v),
                    });
                }
            }
            out
        },
    },
    // The QP engine.
    Metric {
        name: "soya_engine_dc_packets_total",
        kind: Counter,
        help: "Packets the QP engine took from the data-center side, by verdict.",
        labels: &["kind"],
        samples: |s| {
            let e = &s.engine;
            by("kind", &[("all", e.dc_packets), ("malformed", e.dc_malformed), ("bad_icrc", e.dc_bad_icrc), ("not_roce", e.dc_not_roce)])
        },
    },
    Metric {
        name: "soya_engine_twin_messages_total",
        kind: Counter,
        help: "Messages the QP engine took from the twin, by verdict.",
        labels: &["kind"],
        samples: |s| by("kind", &[("all", s.engine.twin_msgs), ("malformed", s.engine.twin_malformed)]),
    },
    Metric {
        name: "soya_engine_cm_messages_total",
        kind: Counter,
        help: "RDMA-CM MADs seen.",
        labels: &[],
        samples: |s| one(s.engine.cm_messages),
    },
    Metric {
        name: "soya_engine_flows_learned_total",
        kind: Counter,
        help: "Halves whose requester QPN was learned, by how.",
        labels: &["how"],
        samples: |s| by("how", &[("cm", s.engine.flows_learned_cm), ("traffic", s.engine.flows_learned_traffic)]),
    },
    Metric {
        name: "soya_engine_cnps_absorbed_total",
        kind: Counter,
        help: "CNPs from local responders absorbed.",
        labels: &[],
        samples: |s| one(s.engine.cnps_absorbed),
    },
    Metric {
        name: "soya_engine_unmatched_responses_total",
        kind: Counter,
        help: "Responses forwarded without a known half.",
        labels: &[],
        samples: |s| one(s.engine.unmatched_responses),
    },
    // The deep buffer.
    Metric {
        name: "soya_buffer_slots_used",
        kind: Gauge,
        help: "Deep-buffer slots in use.",
        labels: &[],
        samples: |s| one(s.buffer.slots_used),
    },
    Metric {
        name: "soya_buffer_slots_total",
        kind: Gauge,
        help: "Deep-buffer slots.",
        labels: &[],
        samples: |s| one(s.buffer.slots_total),
    },
    Metric {
        name: "soya_buffer_high_water_slots",
        kind: Gauge,
        help: "Most deep-buffer slots ever in use.",
        labels: &[],
        samples: |s| one(s.buffer.high_water),
    },
    Metric {
        name: "soya_buffer_slot_bytes",
        kind: Gauge,
        help: "Bytes per deep-buffer slot.",
        labels: &[],
        samples: |s| one(s.buffer.slot_bytes),
    },
    // Engine <-> WAN transport, and the twin.
    Metric {
        name: "soya_twin_messages_total",
        kind: Counter,
        help: "Reliable engine messages to and from the twin.",
        labels: &["dir"],
        samples: |s| by("dir", &[("out", s.twin.msgs_out), ("in", s.twin.msgs_in)]),
    },
    Metric {
        name: "soya_twin_pending_messages",
        kind: Gauge,
        help: "Messages waiting for room in the WAN transport.",
        labels: &[],
        samples: |s| one(s.twin.pending_messages),
    },
    Metric {
        name: "soya_twin_pending_bytes",
        kind: Gauge,
        help: "Bytes waiting for room in the WAN transport.",
        labels: &[],
        samples: |s| one(s.twin.pending_bytes),
    },
    Metric {
        name: "soya_twin_pending_high_water_bytes",
        kind: Gauge,
        help: "Most bytes ever waiting for the WAN transport.",
        labels: &[],
        samples: |s| one(s.twin.pending_high_water_bytes),
    },
    Metric {
        name: "soya_twin_pending_overflow_total",
        kind: Counter,
        help: "Messages dropped at the waiting-queue bound (must stay 0).",
        labels: &[],
        samples: |s| one(s.twin.pending_overflow),
    },
    Metric {
        name: "soya_twin_read_replays_suppressed_total",
        kind: Counter,
        help: "Resent READs not passed to the responder: their answer was still waiting for the WAN.",
        labels: &[],
        samples: |s| one(s.twin.read_replays_suppressed),
    },
    Metric {
        name: "soya_twin_stale_read_responses_dropped_total",
        kind: Counter,
        help: "Waiting READ responses dropped because the requester asked again from an earlier PSN (a replay follows).",
        labels: &[],
        samples: |s| one(s.twin.stale_read_responses_dropped),
    },
    Metric {
        name: "soya_twin_blocked_total",
        kind: Counter,
        help: "Messages that had to wait for WAN flow credit or buffer room.",
        labels: &[],
        samples: |s| one(s.twin.blocked),
    },
    Metric {
        name: "soya_twin_send_errors_total",
        kind: Counter,
        help: "Messages the WAN transport refused for good.",
        labels: &[],
        samples: |s| one(s.twin.send_errors),
    },
    Metric {
        name: "soya_twin_discarded_on_restart_total",
        kind: Counter,
        help: "Waiting messages dropped because the twin restarted.",
        labels: &[],
        samples: |s| one(s.twin.discarded_on_restart),
    },
    Metric {
        name: "soya_flows_failed_on_restart_total",
        kind: Counter,
        help: "Halves failed toward their requesters because the twin restarted mid-stream.",
        labels: &[],
        samples: |s| one(s.twin.flows_failed_on_restart),
    },
    Metric {
        name: "soya_twin_resumed_total",
        kind: Counter,
        help: "A twin that restarted (a new incarnation within wan.twin_timeout): restarts seen (crashes and planned ones), of which planned (it drained and said CLOSE \"restart\": nothing failed), flows (ingress halves) resumed toward it, request packets sent to it again (not yet delivered when it died), flows that could not be resumed and failed, and why: unresumable_two_way (their QP had requests the other way, which the twin had pseudo-ACKed and which died with it), unresumable_bytes_lost (the bytes of a request not yet delivered were lost before the WAN transport).",
        labels: &["what"],
        samples: |s| {
            let e = &s.engine;
            by("what", &[
                ("restarts", e.twin_restarts),
                ("planned", s.twin.twin_restarts_clean),
                ("halves", e.halves_resumed),
                ("packets_resent", e.packets_resent_on_resume),
                ("unresumable", e.halves_unresumable),
                ("unresumable_two_way", e.halves_unresumable_two_way),
                ("unresumable_bytes_lost", e.halves_unresumable_bytes_lost),
            ])
        },
    },
    Metric {
        name: "soya_twin_restart_pause_seconds",
        kind: Gauge,
        help: "The pause of the twin's planned restarts, seen here: from its CLOSE \"restart\" to its next incarnation's session; the last, the longest and the mean (0 before the first return).",
        labels: &["what"],
        samples: |s| {
            let t = &s.twin;
            let secs = |us: u64| Value::Float(us as f64 / 1e6);
            let mean = t.restart_pause_sum_us.checked_div(t.twin_returns).unwrap_or(0);
            [("last", t.restart_pause_last_us), ("max", t.restart_pause_max_us), ("mean", mean)]
                .into_iter()
                .map(|(what, us)| Sample {
                    labels: vec![("what", what.to_string())],
                    value: secs(us),
                })
                .collect()
        },
    },
    Metric {
        name: "soya_twin_failed_total",
        kind: Counter,
        help: "What lost or restarted twins failed: ingress halves, local QPs moved to error through their responder role (poisoned), QPs that could not be (expected PSN unknown), egress halves dropped, RDMA-CM connections disconnected (DREQ in the far host's name).",
        labels: &["what"],
        samples: |s| {
            let e = &s.engine;
            by("what", &[
                ("halves", e.halves_failed_twin_lost),
                ("qps_poisoned", e.qps_poisoned),
                ("unattributable", e.poison_unattributable),
                ("egress_halves", e.egress_halves_dropped),
                ("rdma_cm_dreqs", e.dreqs_sent),
            ])
        },
    },
    Metric {
        name: "soya_qp_probes_total",
        kind: Counter,
        help: "Learning a local QP's expected PSN by probing before moving it to error: QPs probed, probe packets sent, answers absorbed, QPs then in error, QPs given up with their probes unanswered (also counted as unattributable).",
        labels: &["what"],
        samples: |s| {
            let e = &s.engine;
            by("what", &[
                ("qps_probed", e.qps_probed),
                ("probes_sent", e.probes_sent),
                ("answers", e.probe_answers),
                ("qps_poisoned", e.qps_poisoned_after_probe),
                ("unanswered", e.probes_unanswered),
            ])
        },
    },
    Metric {
        name: "soya_far_errors_total",
        kind: Counter,
        help: "Requests the far side refused for good (fatal NAK, or its gateway gave up), and how a requester with nothing outstanding was failed: QPs poisoned, probed, unattributable, reverse halves failed, RDMA-CM DREQs sent.",
        labels: &["what"],
        samples: |s| {
            let e = &s.engine;
            by("what", &[
                ("errors", e.far_errors),
                ("qps_poisoned", e.far_error_qps_poisoned),
                ("qps_probed", e.far_error_qps_probed),
                ("unattributable", e.far_error_unattributable),
                ("reverse_failed", e.far_error_reverse_failed),
                ("rdma_cm_dreqs", e.far_error_dreqs),
            ])
        },
    },
    Metric {
        name: "soya_orphans_total",
        kind: Counter,
        help: "QPs orphaned by a gateway restart: told to the twin that came back; received from the twin and poisoned, probed, skipped (a live QP behind the number), unattributable; requesters of this site watched for their retransmissions, failed with a NAK at their oldest outstanding PSN, and the NAKs sent.",
        labels: &["what"],
        samples: |s| {
            let e = &s.engine;
            by("what", &[
                ("told", e.orphans_told),
                ("received", e.orphans_received),
                ("qps_poisoned", e.orphan_qps_poisoned),
                ("qps_probed", e.orphan_qps_probed),
                ("skipped", e.orphans_skipped),
                ("unattributable", e.orphans_unattributable),
                ("requesters_watched", e.orphan_requesters_watched),
                ("requesters_failed", e.orphan_requesters_failed),
                ("requester_naks", e.orphan_requester_naks),
            ])
        },
    },
    Metric {
        name: "soya_twin_lost_total",
        kind: Counter,
        help: "Times the twin was declared lost (no WAN path for wan.twin_timeout).",
        labels: &[],
        samples: |s| one(s.twin.twin_lost),
    },
    Metric {
        name: "soya_flows_failed_twin_lost_total",
        kind: Counter,
        help: "Halves failed toward their requesters because the twin was lost.",
        labels: &[],
        samples: |s| one(s.twin.flows_failed_twin_lost),
    },
    Metric {
        name: "soya_twin_lost_requests_refused_total",
        kind: Counter,
        help: "Requests from the DC side refused (error NAK, or dropped when their QP is unknown) while the twin was lost.",
        labels: &[],
        samples: |s| one(s.twin.rx_refused_twin_lost.max(s.engine.requests_refused_unreachable)),
    },
    Metric {
        name: "soya_wan_datagrams_total",
        kind: Counter,
        help: "Unreliable WAN datagrams (non-RoCE traffic, RDMA-CM), by direction.",
        labels: &["dir"],
        samples: |s| by("dir", &[("out", s.twin.datagrams_out), ("in", s.twin.datagrams_in)]),
    },
    Metric {
        name: "soya_wan_datagram_acl_drops_total",
        kind: Counter,
        help: "Datagrams from the twin refused by the ACL.",
        labels: &[],
        samples: |s| one(s.twin.datagram_acl_drops),
    },
    // The WAN transport (all paths and shards).
    Metric {
        name: "soya_wan_packets_total",
        kind: Counter,
        help: "WAN packets, by direction.",
        labels: &["dir"],
        samples: |s| by("dir", &[("sent", s.wan.packets_sent), ("received", s.wan.packets_received)]),
    },
    Metric {
        name: "soya_wan_packets_lost_total",
        kind: Counter,
        help: "WAN packets declared lost.",
        labels: &[],
        samples: |s| one(s.wan.packets_lost),
    },
    Metric {
        name: "soya_wan_packets_retransmitted_total",
        kind: Counter,
        help: "WAN packets carrying retransmitted data.",
        labels: &[],
        samples: |s| one(s.wan.packets_retransmitted),
    },
    Metric {
        name: "soya_wan_auth_failures_total",
        kind: Counter,
        help: "WAN datagrams that failed authentication.",
        labels: &[],
        samples: |s| one(s.wan.auth_failures),
    },
    Metric {
        name: "soya_wan_replays_dropped_total",
        kind: Counter,
        help: "WAN datagrams refused by the replay window.",
        labels: &[],
        samples: |s| one(s.wan.replays_dropped),
    },
    Metric {
        name: "soya_wan_key_packets",
        kind: Gauge,
        help: "Packets sealed under the current WAN sending key (the most of any shard).",
        labels: &[],
        samples: |s| one(s.wan.tx_key_packets),
    },
    Metric {
        name: "soya_wan_key_limit_packets",
        kind: Gauge,
        help: "Packets one WAN sending key may seal: the AEAD's limit for the datagram size (0: no session, or no key and no limit: wan.insecure).",
        labels: &[],
        // Lab mode has no limit (u64::MAX in the snapshot), which a gauge
        // cannot carry.
        samples: |s| one(if s.wan.tx_key_limit == u64::MAX { 0 } else { s.wan.tx_key_limit }),
    },
    Metric {
        name: "soya_wan_key_updates_total",
        kind: Counter,
        help: "WAN key updates: send (ours), recv (the twin's).",
        labels: &["dir"],
        samples: |s| by("dir", &[("send", s.wan.tx_key_updates), ("recv", s.wan.rx_key_updates)]),
    },
    Metric {
        name: "soya_wan_rehandshakes_total",
        kind: Counter,
        help: "WAN re-handshakes completed: a fresh ephemeral Diffie-Hellman inside the running session, every wan rekey interval (identity keys; 0 in PSK-only mode).",
        labels: &[],
        samples: |s| one(s.wan.rekeys),
    },
    Metric {
        name: "soya_wan_key_limit_events_total",
        kind: Counter,
        help: "Sessions closed at the AEAD integrity limit (integrity), sends held back at the confidentiality limit (confidentiality).",
        labels: &["limit"],
        samples: |s| by("limit", &[("integrity", s.wan.integrity_limit_closes), ("confidentiality", s.wan.key_exhausted)]),
    },
    Metric {
        name: "soya_wan_handshake_refusals_total",
        kind: Counter,
        help: "Identity-key handshake messages refused: not authentic (auth: another twin key, another PSK, a PSK-only twin, forged), from a static key other than the twin's (unknown_key); WAN datagrams of another protocol version (version).",
        labels: &["cause"],
        samples: |s| by("cause", &[("auth", s.wan.handshake_failures), ("unknown_key", s.wan.unknown_peer_keys), ("version", s.wan.wrong_version)]),
    },
    Metric {
        name: "soya_wan_malformed_total",
        kind: Counter,
        help: "WAN datagrams that did not parse.",
        labels: &[],
        samples: |s| one(s.wan.malformed),
    },
    Metric {
        name: "soya_wan_stale_generation_total",
        kind: Counter,
        help: "WAN packets of an old twin session.",
        labels: &[],
        samples: |s| one(s.wan.stale_generation),
    },
    Metric {
        name: "soya_wan_no_session_total",
        kind: Counter,
        help: "Protected WAN packets before any session existed.",
        labels: &[],
        samples: |s| one(s.wan.no_session),
    },
    Metric {
        name: "soya_wan_role_conflicts_total",
        kind: Counter,
        help: "HELLOs from a twin of the same role.",
        labels: &[],
        samples: |s| one(s.wan.role_conflicts),
    },
    Metric {
        name: "soya_wan_protocol_violations_total",
        kind: Counter,
        help: "Authentic frames that broke the protocol.",
        labels: &[],
        samples: |s| one(s.wan.protocol_violations),
    },
    Metric {
        name: "soya_wan_peer_restarts_total",
        kind: Counter,
        help: "Twin restarts seen (new session generation).",
        labels: &[],
        samples: |s| one(s.wan.peer_restarts),
    },
    Metric {
        name: "soya_wan_events_dropped_total",
        kind: Counter,
        help: "Transport events dropped at their bound.",
        labels: &[],
        samples: |s| one(s.wan.events_dropped),
    },
    Metric {
        name: "soya_wan_messages_discarded_total",
        kind: Counter,
        help: "Messages the transport dropped when the twin restarted.",
        labels: &[],
        samples: |s| one(s.wan.messages_discarded),
    },
    Metric {
        name: "soya_wan_unknown_source_total",
        kind: Counter,
        help: "WAN datagrams from an address that is no path's remote.",
        labels: &[],
        samples: |s| one(s.wan.unknown_source),
    },
    Metric {
        name: "soya_wan_foreign_source_total",
        kind: Counter,
        help: "WAN datagrams from an unexpected address on a single-path socket.",
        labels: &[],
        samples: |s| one(s.wan.foreign_source),
    },
    Metric {
        name: "soya_wan_socket_errors_total",
        kind: Counter,
        help: "WAN socket errors, by operation.",
        labels: &["op"],
        samples: |s| by("op", &[("send", s.wan.socket_send_errors), ("recv", s.wan.socket_recv_errors)]),
    },
    Metric {
        name: "soya_wan_transport_datagrams_total",
        kind: Counter,
        help: "Datagrams as the WAN transport counts them.",
        labels: &["result"],
        samples: |s| {
            let w = &s.wan;
            by("result", &[("sent", w.datagrams_sent), ("received", w.datagrams_received), ("dropped", w.datagrams_dropped)])
        },
    },
    Metric {
        name: "soya_wan_buffered_bytes",
        kind: Gauge,
        help: "Bytes held by the WAN transport.",
        labels: &["dir"],
        samples: |s| by("dir", &[("send", s.wan.send_buffered_bytes), ("recv", s.wan.recv_buffered_bytes)]),
    },
    Metric {
        name: "soya_wan_flows",
        kind: Gauge,
        help: "WAN flows open: send (live or closing), recv (the twin's, open here).",
        labels: &["dir"],
        samples: |s| by("dir", &[("send", s.wan.flows_live), ("recv", s.wan.recv_flows_live)]),
    },
    Metric {
        name: "soya_wan_flows_retired_total",
        kind: Counter,
        help: "WAN flows closed after idling (FIN acknowledged by the twin).",
        labels: &[],
        samples: |s| one(s.wan.flows_retired),
    },
    // Per path.
    Metric {
        name: "soya_path_state",
        kind: Gauge,
        help: "1 for the path's current state (probing, up, down).",
        labels: &["path", "shard", "state"],
        samples: |s| {
            paths_by(s, |p| {
                ["probing", "up", "down"]
                    .map(|st| (Some(("state", st)), (p.state == st).into()))
                    .to_vec()
            })
        },
    },
    Metric {
        name: "soya_path_rtt_seconds",
        kind: Gauge,
        help: "Smoothed RTT.",
        labels: PATH,
        samples: |s| paths(s, |p| (p.srtt_us as f64 / 1e6).into()),
    },
    Metric {
        name: "soya_path_min_rtt_seconds",
        kind: Gauge,
        help: "Minimum RTT.",
        labels: PATH,
        samples: |s| paths(s, |p| (p.min_rtt_us as f64 / 1e6).into()),
    },
    Metric {
        name: "soya_path_loss_ratio",
        kind: Gauge,
        help: "Recent fraction of packets lost.",
        labels: PATH,
        samples: |s| paths(s, |p| p.loss_rate.into()),
    },
    Metric {
        name: "soya_path_pacing_rate_bits_per_second",
        kind: Gauge,
        help: "Congestion controller pacing rate.",
        labels: PATH,
        samples: |s| paths(s, |p| p.pacing_rate_bps.into()),
    },
    Metric {
        name: "soya_path_cwnd_bytes",
        kind: Gauge,
        help: "Congestion window.",
        labels: PATH,
        samples: |s| paths(s, |p| p.cwnd_bytes.into()),
    },
    Metric {
        name: "soya_path_bytes_in_flight",
        kind: Gauge,
        help: "Unacknowledged bytes.",
        labels: PATH,
        samples: |s| paths(s, |p| p.bytes_in_flight.into()),
    },
    Metric {
        name: "soya_path_weight",
        kind: Gauge,
        help: "Configured scheduler weight.",
        labels: PATH,
        samples: |s| paths(s, |p| p.weight.into()),
    },
    Metric {
        name: "soya_path_packets_total",
        kind: Counter,
        help: "Packets on the path.",
        labels: PATH_DIR,
        samples: |s| path_dirs(s, |p| (p.packets_sent, p.packets_received)),
    },
    Metric {
        name: "soya_path_bytes_total",
        kind: Counter,
        help: "Bytes on the path.",
        labels: PATH_DIR,
        samples: |s| path_dirs(s, |p| (p.bytes_sent, p.bytes_received)),
    },
    Metric {
        name: "soya_path_packets_lost_total",
        kind: Counter,
        help: "Packets declared lost.",
        labels: PATH,
        samples: |s| paths(s, |p| p.packets_lost.into()),
    },
    Metric {
        name: "soya_path_packets_retransmitted_total",
        kind: Counter,
        help: "Packets carrying retransmitted data.",
        labels: PATH,
        samples: |s| paths(s, |p| p.packets_retransmitted.into()),
    },
    Metric {
        name: "soya_path_auth_failures_total",
        kind: Counter,
        help: "Datagrams that failed authentication.",
        labels: PATH,
        samples: |s| paths(s, |p| p.auth_failures.into()),
    },
    Metric {
        name: "soya_path_malformed_total",
        kind: Counter,
        help: "Datagrams that did not parse.",
        labels: PATH,
        samples: |s| paths(s, |p| p.malformed.into()),
    },
    Metric {
        name: "soya_path_down_total",
        kind: Counter,
        help: "Times the path went down.",
        labels: PATH,
        samples: |s| paths(s, |p| p.times_down.into()),
    },
    Metric {
        name: "soya_qp_halves",
        kind: Gauge,
        help: "Halves the engine knows now, by role (ingress: requests from a local requester; egress: requests re-injected toward a local responder). Flat under QP churn: quiet halves are forgotten (soya_qp_halves_expired_total).",
        labels: &["dir"],
        samples: |s| {
            let e = &s.engine;
            by("dir", &[("ingress", e.halves_ingress), ("egress", e.halves_egress)])
        },
    },
    Metric {
        name: "soya_qp_halves_expired_total",
        kind: Counter,
        help: "Halves forgotten after 15 x dc.give_up_after (60 s by default) with nothing held, no timer armed and no packet (failed halves too, once their fatal NAK was owed that long); the QP's next packet learns it again.",
        labels: &["dir"],
        samples: |s| {
            let e = &s.engine;
            by("dir", &[
                ("ingress", e.halves_expired_ingress),
                ("egress", e.halves_expired_egress),
            ])
        },
    },
    // Per flow (half), the busiest only (snapshot::MAX_FLOWS).
    Metric {
        name: "soya_flows",
        kind: Gauge,
        help: "Halves the engine knows (ingress and egress roles).",
        labels: &[],
        samples: |s| one(s.flows_total),
    },
    Metric {
        name: "soya_flow_packets_total",
        kind: Counter,
        help: "Request packets of the half (ingress: from the requester; egress: injected).",
        labels: FLOW,
        samples: |s| flows(s, |f| f.packets),
    },
    Metric {
        name: "soya_flow_bytes_total",
        kind: Counter,
        help: "IP bytes of the half's requests (ingress).",
        labels: FLOW,
        samples: |s| flows(s, |f| f.bytes),
    },
    Metric {
        name: "soya_flow_pseudo_acks_total",
        kind: Counter,
        help: "Pseudo-ACKs sent to the requester.",
        labels: FLOW,
        samples: |s| flows(s, |f| f.pseudo_acks),
    },
    Metric {
        name: "soya_flow_naks_total",
        kind: Counter,
        help: "NAKs (ingress: sent to the requester; egress: from the responder).",
        labels: FLOW,
        samples: |s| flows(s, |f| f.naks),
    },
    Metric {
        name: "soya_flow_retransmissions_total",
        kind: Counter,
        help: "Retransmissions (egress: go-back-N toward the responder; ingress: duplicates from the requester).",
        labels: FLOW,
        samples: |s| flows(s, |f| f.retransmissions),
    },
    Metric {
        name: "soya_flow_buffered_packets",
        kind: Gauge,
        help: "Packets held for the half.",
        labels: FLOW,
        samples: |s| flows(s, |f| f.buffered),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::snapshot::{FlowSnap, PathSnap, ShardSnap, Snapshot};

    #[test]
    fn names_are_unique_and_counters_end_in_total() {
        let mut seen = std::collections::HashSet::new();
        for m in METRICS {
            assert!(seen.insert(m.name), "{} twice", m.name);
            assert!(m.name.starts_with("soya_"), "{}", m.name);
            // (A gauge may end in _total: soya_buffer_slots_total.)
            if m.kind == Kind::Counter {
                assert!(m.name.ends_with("_total"), "{}", m.name);
            }
        }
    }

    #[test]
    fn samples_carry_only_declared_labels() {
        let s = Snapshot {
            shards: vec![
                ShardSnap::default(),
                ShardSnap {
                    index: 1,
                    dc_mode: "copy".into(),
                    ..Default::default()
                },
            ],
            paths: vec![PathSnap {
                name: "p0".into(),
                state: "up".into(),
                ..Default::default()
            }],
            flows: vec![FlowSnap::default()],
            ..Default::default()
        };
        for m in METRICS {
            let samples = (m.samples)(&s);
            assert!(!samples.is_empty(), "{} has no sample", m.name);
            for x in samples {
                let names: Vec<&str> = x.labels.iter().map(|l| l.0).collect();
                let declared: Vec<&str> = m
                    .labels
                    .iter()
                    .copied()
                    .filter(|l| names.contains(l))
                    .collect();
                assert_eq!(
                    names, declared,
                    "{}: labels out of the declared set or order",
                    m.name
                );
            }
        }
    }
}
