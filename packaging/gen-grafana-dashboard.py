#!/usr/bin/env python3
# Generates packaging/grafana/soya-dashboard.json (Grafana 10+, Prometheus data
# source):  python3 packaging/gen-grafana-dashboard.py > packaging/grafana/soya-dashboard.json
#
# The metrics come from one table, the gateway's (proxy/src/gateway/metrics/table.rs),
# through packaging/metrics-spec.json (`soya metrics-spec --json`): every metric
# and label a panel uses must be in it (this script fails otherwise), and each
# panel's description ends with the table's help text of the metrics it shows.
# proxy/tests/metrics_spec.rs checks that the spec and this dashboard are up to date.
import json, os, re, sys
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "metrics-spec.json")) as f:
    SPEC = {m["name"]: m for m in json.load(f)}
# Labels Prometheus adds, and PromQL's own words inside label lists.
SCRAPE_LABELS = {"instance", "job"}
PROMQL_WORDS = {"by", "ignoring", "group_left", "on", "without", "sum", "min", "max", "topk", "rate", "increase"}

def metrics_of(targets):
    """The spec entries a panel's expressions use, in order; fails on a name or
    label that is not in the table."""
    used = []
    for expr, legend in targets:
        names = re.findall(r"soya_[a-z0-9_]+", expr)
        for n in names:
            if n not in SPEC:
                sys.exit(f"gen-grafana-dashboard: {n} is not a metric (packaging/metrics-spec.json)")
            if n not in used:
                used.append(n)
        declared = set(SCRAPE_LABELS).union(*(SPEC[n]["labels"] for n in names))
        selectors = re.findall(r"([a-z_]+)=~?\"", expr)
        groupings = [l.strip() for g in re.findall(r"(?:by|ignoring|on) \(([^)]*)\)", expr) for l in g.split(",")]
        for label in selectors + groupings + re.findall(r"\{\{(\w+)\}\}", legend):
            if label and label not in declared and label not in PROMQL_WORDS:
                sys.exit(f"gen-grafana-dashboard: label {label} is not one of {names}'s labels")
    return used

ds = {"type": "prometheus", "uid": "${datasource}"}
panels = []
pid = [0]
# Where the next panel goes: panels fill rows of the 24-unit wide grid left to
# right; one that does not fit starts the next row, below the tallest panel
# of this one.
at = {"x": 0, "y": 0, "h": 0}
def place(w, h):
    if at["x"] + w > 24:
        at.update(x=0, y=at["y"] + at["h"], h=0)
    pos = {"x": at["x"], "y": at["y"], "w": w, "h": h}
    at.update(x=at["x"] + w, h=max(at["h"], h))
    return pos

def panel(title, targets, unit, w=12, h=8, desc="", kind="timeseries", stack=False, minv=None, maxv=None):
    """Adds a panel at the next place of the grid and returns it. `targets`:
    (expression, legend) pairs; every legend starts with the instance."""
    pid[0] += 1
    targets = [(e, "{{instance}}" + (" " + l if l else "")) for e, l in targets]
    helps = "\n".join(f"- {n} ({SPEC[n]['type']}): {SPEC[n]['help']}" for n in metrics_of(targets))
    desc = (desc + "\n\n" if desc else "") + helps
    p = {
        "id": pid[0], "type": kind, "title": title, "description": desc,
        "datasource": ds,
        "gridPos": place(w, h),
        "targets": [dict(datasource=ds, refId=chr(65 + i), expr=e, legendFormat=l) for i, (e, l) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
    }
    if minv is not None: p["fieldConfig"]["defaults"]["min"] = minv
    if maxv is not None: p["fieldConfig"]["defaults"]["max"] = maxv
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stack else 0,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"}, "showPoints": "never"}
        p["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "background", "graphMode": "none", "textMode": "value_and_name"}
    panels.append(p)
    return p
def row(title):
    """Adds a row header across the grid, below everything placed so far."""
    pid[0] += 1
    panels.append({"id": pid[0], "type": "row", "title": title, "collapsed": False, "gridPos": place(24, 1), "panels": []})

# PromQL of one metric at the gateways chosen ($instance), with `extra` label
# matchers: its value, and its per-second rate or increase over the interval.
def series(metric, extra=""):
    return metric + "{" + 'instance=~"$instance"' + ("," + extra if extra else "") + "}"
def rate(metric, extra=""):
    return f"rate({series(metric, extra)}[$__rate_interval])"
def increase(metric, extra=""):
    return f"increase({series(metric, extra)}[$__rate_interval])"
def bits(byte_rate):
    return "8 * " + byte_rate
IL = ',instance=~"$instance"'

row("Gateway")
st = panel("Twin connected", [(series("soya_wan_connected"), "")], "none", w=4, h=4, kind="stat",
           desc="soya_wan_connected: 1 while a WAN session with the twin is up.")
st["fieldConfig"]["defaults"]["mappings"] = [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"}, "1": {"text": "up", "color": "green"}}}]
st["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}]}
panel("Shards connected", [
    ("sum by (instance) (" + series("soya_shard_connected") + ")", "connected"),
    (series("soya_shards"), "of")], "none", w=4, h=4, kind="stat",
    desc="soya_shard_connected summed over shards, and soya_shards: every shard must have its own session "
         "with the twin's shard of the same index (`soya status` says why one has none).")
panel("Paths up (worst shard)", [("min by (instance) (sum by (instance, shard) (" + series("soya_path_state", 'state="up"') + "))", "")],
      "none", w=4, h=4, kind="stat",
      desc="Paths in state up (soya_path_state{state=\"up\"}), in the shard with the fewest: with several shards "
           "each shard has its own connection over every path.")
panel("Uptime", [(series("soya_uptime_seconds"), "")], "s", w=4, h=4, kind="stat")
panel("Draining", [(series("soya_draining"), "")], "none", w=4, h=4, kind="stat",
      desc="1 after SIGTERM while the gateway flushes to its twin.")
st = panel("Lab hosts (udp backend)", [(series("soya_dc_lab_hosts"), "")], "none", w=4, h=4, kind="stat",
           desc="soya_dc_lab_hosts: lab hosts whose UDP address the udp backend has learned (0 with the tun backend).")
st["options"]["colorMode"] = "none"

row("WAN paths (legend: instance, path, shard when shards > 1)")
panel("Path RTT (smoothed, and minimum)", [
    (series("soya_path_rtt_seconds"), "{{path}} {{shard}} srtt"),
    (series("soya_path_min_rtt_seconds"), "{{path}} {{shard}} min")], "s",
    desc="soya_path_rtt_seconds and soya_path_min_rtt_seconds per path. Fibre: 2 x 4.9 us per km.")
panel("Path loss", [
    (series("soya_path_loss_ratio"), "{{path}} {{shard}} recent"),
    (rate("soya_path_packets_lost_total") + " / ignoring(dir) " + rate("soya_path_packets_total", 'dir="sent"'), "{{path}} {{shard}} lost/sent")],
    "percentunit", minv=0,
    desc="soya_path_loss_ratio (the transport's recent estimate) and lost / sent packets over the interval.")
panel("Path rate (bits/s)", [
    (bits(rate("soya_path_bytes_total", 'dir="sent"')), "{{path}} {{shard}} sent"),
    (bits(rate("soya_path_bytes_total", 'dir="received"')), "{{path}} {{shard}} received"),
    (series("soya_path_pacing_rate_bits_per_second"), "{{path}} {{shard}} pacing")], "bps",
    desc="Bytes on each path (soya_path_bytes_total, WAN datagrams) and the congestion controller's pacing rate.")
panel("Path retransmissions and state changes", [
    (rate("soya_path_packets_retransmitted_total"), "{{path}} {{shard}} retransmitted"),
    (increase("soya_path_down_total"), "{{path}} {{shard}} went down")], "pps",
    desc="soya_path_packets_retransmitted_total (packets carrying resent data) and soya_path_down_total.")
panel("Path congestion window and bytes in flight", [
    (series("soya_path_cwnd_bytes"), "{{path}} {{shard}} cwnd"),
    (series("soya_path_bytes_in_flight"), "{{path}} {{shard}} in flight")], "bytes",
    desc="soya_path_cwnd_bytes and soya_path_bytes_in_flight (unacknowledged). In flight pinned at cwnd: the path is "
         "window-limited; far below it: the sender (or its rate limit) is.")
panel("Path weight and datagrams rejected per path", [
    (series("soya_path_weight"), "{{path}} {{shard}} weight"),
    (rate("soya_path_auth_failures_total"), "{{path}} {{shard}} auth failures/s"),
    (rate("soya_path_malformed_total"), "{{path}} {{shard}} malformed/s")], "none",
    desc="soya_path_weight (configured scheduler share), soya_path_auth_failures_total and soya_path_malformed_total per path.")

row("Shards (device threads; one series per shard, shard 0 only with 1 shard)")
panel("DC packets per shard", [
    (rate("soya_shard_dc_packets_total"), "shard {{shard}} {{dir}}")], "pps",
    desc="soya_shard_dc_packets_total: DC packets each shard's engine accepted (rx, read itself or handed over) and "
         "wrote (tx). Host pairs are hashed to shards: one busy pair keeps one shard busy.")
panel("Share of DC packets per shard", [
    ("sum by (instance, shard) (" + rate("soya_shard_dc_packets_total", 'dir="rx"') + ") "
     "/ ignoring(shard) group_left sum by (instance) (" + rate("soya_shard_dc_packets_total", 'dir="rx"') + ")",
     "shard {{shard}}")], "percentunit", stack=True, minv=0, maxv=1,
    desc="Each shard's part of the accepted DC packets: how evenly the host pairs spread (even: 1/shards each). "
         "The shard with the largest part saturates first.")
panel("Shard handoff (DC packets read by one shard for another)", [
    (rate("soya_shard_handoff_packets_total"), "shard {{shard}} {{result}}"),
    (rate("soya_dc_handoff_packets_total", 'result="dropped"'), "all dropped")],
    "pps",
    desc="soya_shard_handoff_packets_total{result=out|in|dropped} per shard and soya_dc_handoff_packets_total in all "
         "(udp lab backend: shard 0 reads every packet). dropped above 0: the owning shard cannot keep up with its share.")
panel("WAN packets and twin messages per shard", [
    (rate("soya_shard_wan_packets_total"), "shard {{shard}} wan {{dir}}"),
    (rate("soya_shard_twin_messages_total"), "shard {{shard}} twin {{dir}}")],
    "pps",
    desc="soya_shard_wan_packets_total{dir=sent|received} (the shard's WAN connection) and "
         "soya_shard_twin_messages_total{dir=out|in} (engine messages to and from the twin's shard).")
panel("Shard sessions", [
    (series("soya_shard_connected"), "shard {{shard}}")], "none", w=24, h=6, minv=0, maxv=1,
    desc="soya_shard_connected: 1 while the shard has a session with the twin's shard of the same index. 0 with the "
         "twin up: another gateway.shards or key at the twin, or nothing at its ports + shard index.")

row("Flows (the busiest 64 halves per gateway)")
panel("Per-flow goodput (requests accepted from the requester)", [
    (bits(rate("soya_flow_bytes_total", 'role="ingress"')), "{{half}}")], "bps", stack=True,
    desc="soya_flow_bytes_total{role=\"ingress\"}: IP bytes of the requests of one QP half taken in (and pseudo-ACKed) at the requester's gateway. Only the 64 busiest halves per gateway are exported.")
panel("Per-flow buffered packets", [
    (series("soya_flow_buffered_packets"), "{{half}} {{role}}")], "none",
    desc="soya_flow_buffered_packets: packets held for the half (ingress: pseudo-ACKed, not yet delivered; egress: waiting to be injected).")
panel("Pseudo-ACK rate", [
    ("sum by (instance) (" + rate("soya_flow_pseudo_acks_total") + ")", "all flows"),
    ("topk(5, " + rate("soya_flow_pseudo_acks_total") + ")", "{{half}}")], "ops",
    desc="soya_flow_pseudo_acks_total: pseudo-ACKs sent to local requesters (coalesced: pseudo_ack.coalesce_packets / coalesce_us).")
panel("NAK rate", [
    ("sum by (instance, role) (" + rate("soya_flow_naks_total") + ")", "{{role}}")], "ops",
    desc="soya_flow_naks_total: ingress = NAKs sent to the local requester (gaps, errors); egress = NAKs received from the local responder.")
panel("Egress go-back-N retransmissions", [
    ("sum by (instance, role) (" + rate("soya_flow_retransmissions_total") + ")", "{{role}}")], "pps",
    desc="soya_flow_retransmissions_total: egress = re-sent toward the responder; ingress = duplicates from the requester.")
panel("Flows known and per-flow packet rate", [
    (series("soya_qp_halves"), "{{dir}} halves known"),
    ("sum by (instance, dir) (" + rate("soya_qp_halves_expired_total") + ")", "{{dir}} forgotten/s"),
    ("topk(5, " + rate("soya_flow_packets_total") + ")", "{{half}} {{role}} pkt/s")], "none",
    desc="soya_qp_halves: halves the engine knows, by role (flat under QP churn: quiet ones are forgotten, "
         "soya_qp_halves_expired_total); soya_flow_packets_total: request packets of the busiest "
         "halves (ingress: from the requester; egress: injected toward the responder).")

row("Deep buffer, DC side and engine-to-WAN queue")
panel("Deep buffer occupancy", [
    (series("soya_buffer_slots_used") + " / " + series("soya_buffer_slots_total"), "used"),
    (series("soya_buffer_high_water_slots") + " / " + series("soya_buffer_slots_total"), "high water")], "percentunit", minv=0, maxv=1,
    desc="soya_buffer_slots_used / soya_buffer_slots_total. Pseudo-ACKs are withheld when it fills.")
panel("Deep buffer bytes", [
    (series("soya_buffer_slots_used") + " * " + series("soya_buffer_slot_bytes"), "used"),
    (series("soya_buffer_slots_total") + " * " + series("soya_buffer_slot_bytes"), "size")], "bytes")
panel("Engine to WAN: pending bytes", [
    (series("soya_twin_pending_bytes"), "pending"),
    (series("soya_wan_buffered_bytes"), "transport {{dir}}")], "bytes",
    desc="soya_twin_pending_bytes: messages waiting for WAN credit (new requests are refused above 64 MiB); soya_wan_buffered_bytes: held by the transport.")
panel("DC side packets", [
    (rate("soya_dc_rx_packets_total"), "rx {{result}}"),
    (rate("soya_dc_tx_packets_total"), "tx {{result}}")], "pps",
    desc="soya_dc_rx_packets_total by result (accepted, acl_*, malformed, draining, backpressure) and soya_dc_tx_packets_total.")
panel("DC side throughput (bits/s)", [
    (bits(rate("soya_dc_rx_bytes_total")), "rx"),
    (bits(rate("soya_dc_tx_bytes_total")), "tx")], "bps",
    desc="soya_dc_rx_bytes_total and soya_dc_tx_bytes_total: IP bytes read from and written to the data-center side.")
panel("DC packets dropped before the gateway read them", [
    (rate("soya_dc_rx_kernel_drops_total"), "kernel drops"),
    (rate("soya_dc_rx_packets_total", 'result="backpressure"'), "backpressure"),
    (rate("soya_dc_lab_host_conflicts_total"), "lab host conflicts")], "pps", minv=0,
    desc="soya_dc_rx_kernel_drops_total: packets the kernel dropped before the gateway read them (tun queue or socket "
         "buffer full: the device loop is short of CPU; each drop makes a requester go back N). Backpressure: refused "
         "by the gateway itself. Lab host conflicts (udp backend): datagrams for a host bound to another "
         "active UDP address. All should stay 0.")
panel("Engine to WAN: messages and waits", [
    (rate("soya_twin_messages_total"), "{{dir}}"),
    (rate("soya_twin_blocked_total"), "waited for credit"),
    (series("soya_twin_pending_messages"), "pending (count)")], "none",
    desc="soya_twin_messages_total{dir} (reliable engine messages, /s), soya_twin_blocked_total (messages that had to "
         "wait for WAN flow credit or buffer room, /s) and soya_twin_pending_messages (waiting now).")
panel("Engine to WAN: pending high water", [
    (series("soya_twin_pending_high_water_bytes"), "high water")], "bytes",
    desc="soya_twin_pending_high_water_bytes: most bytes ever waiting for the WAN transport (new requests are refused "
         "above 64 MiB).")

row("QP engine and WAN transport")
panel("Engine intake by verdict", [
    (rate("soya_engine_dc_packets_total"), "dc {{kind}}"),
    (rate("soya_engine_twin_messages_total"), "twin {{kind}}"),
    (rate("soya_engine_unmatched_responses_total"), "unmatched responses")], "pps",
    desc="soya_engine_dc_packets_total{kind=all|malformed|bad_icrc|not_roce}, soya_engine_twin_messages_total"
         "{kind=all|malformed} and soya_engine_unmatched_responses_total (responses forwarded without a known half). "
         "Every kind but all should stay near 0; bad_icrc from a host sending with UDP GSO: see soya-perf --gso.")
panel("Engine events and WAN flows", [
    (increase("soya_engine_flows_learned_total"), "halves learned by {{how}}"),
    (increase("soya_engine_cm_messages_total"), "RDMA-CM MADs"),
    (rate("soya_engine_cnps_absorbed_total"), "CNPs absorbed/s"),
    (series("soya_wan_flows"), "WAN flows {{dir}}"),
    (increase("soya_wan_flows_retired_total"), "WAN flows retired")], "none",
    desc="soya_engine_flows_learned_total{how=cm|traffic}, soya_engine_cm_messages_total (per interval) and "
         "soya_engine_cnps_absorbed_total (CNPs from local responders, not forwarded). soya_wan_flows{dir}: WAN "
         "flows open now (idle ones retire, so under QP churn it stays near the halves recently active, far below "
         "65 536); soya_wan_flows_retired_total per interval.")
panel("WAN packets and datagrams", [
    (rate("soya_wan_packets_total"), "packets {{dir}}"),
    (rate("soya_wan_transport_datagrams_total"), "transport {{result}}"),
    (rate("soya_wan_datagrams_total"), "unreliable {{dir}}"),
    (rate("soya_wan_packets_lost_total"), "lost"),
    (rate("soya_wan_packets_retransmitted_total"), "retransmitted")], "pps",
    desc="All paths and shards: soya_wan_packets_total, soya_wan_transport_datagrams_total{result=sent|received|dropped}, "
         "soya_wan_datagrams_total (non-RoCE traffic and RDMA-CM, carried unreliably), soya_wan_packets_lost_total and "
         "soya_wan_packets_retransmitted_total.")
panel("WAN transport trouble (should stay 0)", [
    (rate("soya_wan_socket_errors_total"), "socket {{op}} errors"),
    (increase("soya_wan_events_dropped_total"), "events dropped"),
    (increase("soya_wan_messages_discarded_total"), "messages discarded"),
    (increase("soya_twin_discarded_on_restart_total"), "pending discarded on restart"),
    (increase("soya_twin_send_errors_total"), "send errors")], "none",
    desc="soya_wan_socket_errors_total{op} (/s); per interval: soya_wan_events_dropped_total, "
         "soya_wan_messages_discarded_total and soya_twin_discarded_on_restart_total (twin restarts), "
         "soya_twin_send_errors_total (refused for good).")

row("Security and errors")
panel("WAN datagrams rejected", [
    (rate("soya_wan_auth_failures_total"), "auth failures"),
    (rate("soya_wan_replays_dropped_total"), "replays"),
    (rate("soya_wan_malformed_total"), "malformed"),
    (rate("soya_wan_unknown_source_total"), "unknown source"),
    (rate("soya_wan_foreign_source_total"), "foreign source"),
    (rate("soya_wan_stale_generation_total"), "stale generation"),
    (rate("soya_wan_no_session_total"), "no session"),
    (rate("soya_wan_role_conflicts_total"), "role conflicts"),
    (rate("soya_wan_handshake_refusals_total"), "handshake refused: {{cause}}"),
    (rate("soya_wan_protocol_violations_total"), "protocol violations"),
    (rate("soya_wan_datagram_acl_drops_total"), "datagram ACL drops")], "pps",
    desc="WAN datagrams refused: authentication, replay window, parse, source address (unknown: no path's remote; "
         "foreign: unexpected on a single-path socket), an old twin session, before any session, a twin of the same "
         "role, protocol violations by an authentic twin, unreliable datagrams refused by the ACL, identity-key "
         "handshake messages refused (cause: auth, unknown_key, version).")
panel("WAN key updates", [
    (series("soya_wan_key_packets"), "packets under the current key"),
    (series("soya_wan_key_limit_packets"), "AEAD limit per key"),
    (increase("soya_wan_key_updates_total"), "updates {{dir}}"),
    (increase("soya_wan_key_limit_events_total"), "at the {{limit}} limit (must be 0)")], "none",
    desc="soya_wan_key_packets: packets sealed under the current WAN sending key (the most of any shard), far "
         "below soya_wan_key_limit_packets (the AEAD's confidentiality limit for the datagram size); "
         "soya_wan_key_updates_total{dir=send|recv} per interval (keys are replaced every 2^22 packets or 2 minutes); "
         "soya_wan_key_limit_events_total{limit}: sessions closed at the integrity limit, sends held at the "
         "confidentiality limit.")
panel("Twin restarts and failed flows", [
    (increase("soya_wan_peer_restarts_total"), "peer restarts"),
    (increase("soya_flows_failed_on_restart_total"), "flows failed"),
    (series("soya_twin_pending_overflow_total"), "pending overflow (must be 0)")], "none")
panel("Twin state (lost after wan.twin_timeout without a path)", [
    (f"soya_twin_state{{state=\"connected\"{IL}}}", "connected"),
    (f"soya_twin_state{{state=\"unreachable\"{IL}}}", "unreachable"),
    (f"soya_twin_state{{state=\"lost\"{IL}}}", "LOST"),
    (f"soya_twin_state{{state=\"connecting\"{IL}}}", "connecting"),
    (series("soya_twin_unreachable_seconds"), "seconds without a path")], "none",
    desc="soya_twin_state: connecting, connected, unreachable (every WAN path down) or lost (down for "
         "wan.twin_timeout: every flow through the twin failed toward its application, new requests refused). "
         "soya_twin_unreachable_seconds: how long no path has answered.")
panel("Twin losses and what they failed", [
    (increase("soya_twin_lost_total"), "twin lost"),
    (increase("soya_flows_failed_twin_lost_total"), "flows failed"),
    (rate("soya_twin_lost_requests_refused_total"), "requests refused"),
    (increase("soya_twin_failed_total"), "failed {{what}}")],
    "none")
panel("Failing QPs with nothing outstanding: probes and far errors", [
    (increase("soya_qp_probes_total"), "probes {{what}}"),
    (increase("soya_far_errors_total"), "far errors {{what}}")],
    "none",
    desc="A local QP whose expected PSN is unknown is probed before the poison that moves it to error: "
         "`unanswered` QPs stayed unfailed (also counted as unattributable). Far errors: requests the far "
         "side refused for good, and how a requester with nothing outstanding was failed.")
panel("Orphans of a gateway restart", [
    (increase("soya_orphans_total"), "{{what}}")],
    "none",
    desc="QPs orphaned by a gateway restart: told to the twin that came back; received from it and "
         "poisoned, probed, skipped or unattributable; requesters of this site watched for their "
         "retransmissions and failed with a NAK at their oldest outstanding PSN (docs/semantics.md).")

dash = {
    "title": "Sōya gateways",
    "uid": "soya-gateways",
    "description": "Sōya RoCEv2 WAN gateways: paths, shards, flows, deep buffer, pseudo-ACKs. Metrics: `soya metrics-spec --json` (proxy/src/gateway/metrics/table.rs), docs/operations.md.",
    "tags": ["soya", "rdma", "roce"],
    "timezone": "browser",
    "schemaVersion": 39,
    "version": 1,
    "editable": True,
    "refresh": "10s",
    "time": {"from": "now-1h", "to": "now"},
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0},
        {"name": "instance", "label": "Gateway", "type": "query", "datasource": ds,
         "query": {"query": "label_values(soya_info, instance)", "refId": "instance"},
         "definition": "label_values(soya_info, instance)", "includeAll": True, "multi": True,
         "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1, "hide": 0},
    ]},
    "annotations": {"list": []},
    "panels": panels,
}
print(json.dumps(dash, indent=2, ensure_ascii=False))
