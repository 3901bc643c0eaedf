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
def panel(title, targets, unit, x, y, w=12, h=8, desc="", kind="timeseries", stack=False, minv=None, maxv=None):
    pid[0] += 1
    helps = "\n".join(f"- {n} ({SPEC[n]['type']}): {SPEC[n]['help']}" for n in metrics_of(targets))
    desc = (desc + "\n\n" if desc else "") + helps
    p = {
        "id": pid[0], "type": kind, "title": title, "description": desc,
        "datasource": ds,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
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
    return p
def row(title, y):
    pid[0] += 1
    return {"id": pid[0], "type": "row", "title": title, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}

I = '{instance=~"$instance"}'
IL = ',instance=~"$instance"'
def sel(extra=""):
    inner = 'instance=~"$instance"' + ("," + extra if extra else "")
    return "{" + inner + "}"

S_dir_received = sel('dir="received"')
S_dir_sent = sel('dir="sent"')
S_role_ingress = sel('role="ingress"')
S_state_up = sel('state="up"')
S_dir_rx = sel('dir="rx"')
S_result_dropped = sel('result="dropped"')
S_result_backpressure = sel('result="backpressure"')
y = 0
panels.append(row("Gateway", y)); y += 1
st = panel("Twin connected", [(f"soya_wan_connected{I}", "{{instance}}")], "none", 0, y, w=4, h=4, kind="stat",
           desc="soya_wan_connected: 1 while a WAN session with the twin is up.")
st["fieldConfig"]["defaults"]["mappings"] = [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"}, "1": {"text": "up", "color": "green"}}}]
st["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}]}
panels.append(st)
st = panel("Shards connected", [
    (f"sum by (instance) (soya_shard_connected{I})", "{{instance}} connected"),
    (f"soya_shards{I}", "{{instance}} of")], "none", 4, y, w=4, h=4, kind="stat",
           desc="soya_shard_connected summed over shards, and soya_shards: every shard must have its own session "
                "with the twin's shard of the same index (`soya status` says why one has none).")
panels.append(st)
st = panel("Paths up (worst shard)", [(f'min by (instance) (sum by (instance, shard) (soya_path_state{S_state_up}))', "{{instance}}")],
           "none", 8, y, w=4, h=4, kind="stat",
           desc="Paths in state up (soya_path_state{state=\"up\"}), in the shard with the fewest: with several shards "
                "each shard has its own connection over every path.")
panels.append(st)
panels.append(panel("Uptime", [(f"soya_uptime_seconds{I}", "{{instance}}")], "s", 12, y, w=4, h=4, kind="stat"))
st = panel("Draining", [(f"soya_draining{I}", "{{instance}}")], "none", 16, y, w=4, h=4, kind="stat",
           desc="1 after SIGTERM while the gateway flushes to its twin.")
panels.append(st)
st = panel("Lab hosts (udp backend)", [(f"soya_dc_lab_hosts{I}", "{{instance}}")], "none", 20, y, w=4, h=4, kind="stat",
           desc="soya_dc_lab_hosts: lab hosts whose UDP address the udp backend has learned (0 with the tun backend).")
st["options"]["colorMode"] = "none"
panels.append(st)
y += 4

panels.append(row("WAN paths (legend: instance, path, shard when shards > 1)", y)); y += 1
panels.append(panel("Path RTT (smoothed, and minimum)", [
    (f"soya_path_rtt_seconds{I}", "{{instance}} {{path}} {{shard}} srtt"),
    (f"soya_path_min_rtt_seconds{I}", "{{instance}} {{path}} {{shard}} min")], "s", 0, y,
    desc="soya_path_rtt_seconds and soya_path_min_rtt_seconds per path. Fibre: 2 x 4.9 us per km."))
panels.append(panel("Path loss", [
    (f"soya_path_loss_ratio{I}", "{{instance}} {{path}} {{shard}} recent"),
    (f'rate(soya_path_packets_lost_total{I}[$__rate_interval]) / ignoring(dir) rate(soya_path_packets_total{S_dir_sent}[$__rate_interval])', "{{instance}} {{path}} {{shard}} lost/sent")],
    "percentunit", 12, y, minv=0,
    desc="soya_path_loss_ratio (the transport's recent estimate) and lost / sent packets over the interval."))
y += 8
panels.append(panel("Path rate (bits/s)", [
    (f'8 * rate(soya_path_bytes_total{S_dir_sent}[$__rate_interval])', "{{instance}} {{path}} {{shard}} sent"),
    (f'8 * rate(soya_path_bytes_total{S_dir_received}[$__rate_interval])', "{{instance}} {{path}} {{shard}} received"),
    (f"soya_path_pacing_rate_bits_per_second{I}", "{{instance}} {{path}} {{shard}} pacing")], "bps", 0, y,
    desc="Bytes on each path (soya_path_bytes_total, WAN datagrams) and the congestion controller's pacing rate."))
panels.append(panel("Path retransmissions and state changes", [
    (f"rate(soya_path_packets_retransmitted_total{I}[$__rate_interval])", "{{instance}} {{path}} {{shard}} retransmitted"),
    (f"increase(soya_path_down_total{I}[$__rate_interval])", "{{instance}} {{path}} {{shard}} went down")], "pps", 12, y,
    desc="soya_path_packets_retransmitted_total (packets carrying resent data) and soya_path_down_total."))
y += 8
panels.append(panel("Path congestion window and bytes in flight", [
    (f"soya_path_cwnd_bytes{I}", "{{instance}} {{path}} {{shard}} cwnd"),
    (f"soya_path_bytes_in_flight{I}", "{{instance}} {{path}} {{shard}} in flight")], "bytes", 0, y,
    desc="soya_path_cwnd_bytes and soya_path_bytes_in_flight (unacknowledged). In flight pinned at cwnd: the path is "
         "window-limited; far below it: the sender (or its rate limit) is."))
panels.append(panel("Path weight and datagrams rejected per path", [
    (f"soya_path_weight{I}", "{{instance}} {{path}} {{shard}} weight"),
    (f"rate(soya_path_auth_failures_total{I}[$__rate_interval])", "{{instance}} {{path}} {{shard}} auth failures/s"),
    (f"rate(soya_path_malformed_total{I}[$__rate_interval])", "{{instance}} {{path}} {{shard}} malformed/s")], "none", 12, y,
    desc="soya_path_weight (configured scheduler share), soya_path_auth_failures_total and soya_path_malformed_total per path."))
y += 8

panels.append(row("Shards (device threads; one series per shard, shard 0 only with 1 shard)", y)); y += 1
panels.append(panel("DC packets per shard", [
    (f"rate(soya_shard_dc_packets_total{I}[$__rate_interval])", "{{instance}} shard {{shard}} {{dir}}")], "pps", 0, y,
    desc="soya_shard_dc_packets_total: DC packets each shard's engine accepted (rx, read itself or handed over) and "
         "wrote (tx). Host pairs are hashed to shards: one busy pair keeps one shard busy."))
panels.append(panel("Share of DC packets per shard", [
    (f"sum by (instance, shard) (rate(soya_shard_dc_packets_total{S_dir_rx}[$__rate_interval])) "
     f"/ ignoring(shard) group_left sum by (instance) (rate(soya_shard_dc_packets_total{S_dir_rx}[$__rate_interval]))",
     "{{instance}} shard {{shard}}")], "percentunit", 12, y, stack=True, minv=0, maxv=1,
    desc="Each shard's part of the accepted DC packets: how evenly the host pairs spread (even: 1/shards each). "
         "The shard with the largest part saturates first."))
y += 8
panels.append(panel("Shard handoff (DC packets read by one shard for another)", [
    (f"rate(soya_shard_handoff_packets_total{I}[$__rate_interval])", "{{instance}} shard {{shard}} {{result}}"),
    (f'rate(soya_dc_handoff_packets_total{S_result_dropped}[$__rate_interval])', "{{instance}} all dropped")],
    "pps", 0, y,
    desc="soya_shard_handoff_packets_total{result=out|in|dropped} per shard and soya_dc_handoff_packets_total in all "
         "(udp lab backend: shard 0 reads every packet). dropped above 0: the owning shard cannot keep up with its share."))
panels.append(panel("WAN packets and twin messages per shard", [
    (f"rate(soya_shard_wan_packets_total{I}[$__rate_interval])", "{{instance}} shard {{shard}} wan {{dir}}"),
    (f"rate(soya_shard_twin_messages_total{I}[$__rate_interval])", "{{instance}} shard {{shard}} twin {{dir}}")],
    "pps", 12, y,
    desc="soya_shard_wan_packets_total{dir=sent|received} (the shard's WAN connection) and "
         "soya_shard_twin_messages_total{dir=out|in} (engine messages to and from the twin's shard)."))
y += 8
panels.append(panel("Shard sessions", [
    (f"soya_shard_connected{I}", "{{instance}} shard {{shard}}")], "none", 0, y, w=24, h=6, minv=0, maxv=1,
    desc="soya_shard_connected: 1 while the shard has a session with the twin's shard of the same index. 0 with the "
         "twin up: another gateway.shards or key at the twin, or nothing at its ports + shard index."))
y += 6

panels.append(row("Flows (the busiest 64 halves per gateway)", y)); y += 1
panels.append(panel("Per-flow goodput (requests accepted from the requester)", [
    (f'8 * rate(soya_flow_bytes_total{S_role_ingress}[$__rate_interval])', "{{instance}} {{half}}")], "bps", 0, y, stack=True,
    desc="soya_flow_bytes_total{role=\"ingress\"}: IP bytes of the requests of one QP half taken in (and pseudo-ACKed) at the requester's gateway. Only the 64 busiest halves per gateway are exported."))
panels.append(panel("Per-flow buffered packets", [
    (f"soya_flow_buffered_packets{I}", "{{instance}} {{half}} {{role}}")], "none", 12, y,
    desc="soya_flow_buffered_packets: packets held for the half (ingress: pseudo-ACKed, not yet delivered; egress: waiting to be injected)."))
y += 8
panels.append(panel("Pseudo-ACK rate", [
    (f'sum by (instance) (rate(soya_flow_pseudo_acks_total{I}[$__rate_interval]))', "{{instance}} all flows"),
    (f'topk(5, rate(soya_flow_pseudo_acks_total{I}[$__rate_interval]))', "{{instance}} {{half}}")], "ops", 0, y,
    desc="soya_flow_pseudo_acks_total: pseudo-ACKs sent to local requesters (coalesced: pseudo_ack.coalesce_packets / coalesce_us)."))
panels.append(panel("NAK rate", [
    (f'sum by (instance, role) (rate(soya_flow_naks_total{I}[$__rate_interval]))', "{{instance}} {{role}}")], "ops", 12, y,
    desc="soya_flow_naks_total: ingress = NAKs sent to the local requester (gaps, errors); egress = NAKs received from the local responder."))
y += 8
panels.append(panel("Egress go-back-N retransmissions", [
    (f'sum by (instance, role) (rate(soya_flow_retransmissions_total{I}[$__rate_interval]))', "{{instance}} {{role}}")], "pps", 0, y,
    desc="soya_flow_retransmissions_total: egress = re-sent toward the responder; ingress = duplicates from the requester."))
panels.append(panel("Flows known and per-flow packet rate", [
    (f"soya_qp_halves{I}", "{{instance}} {{dir}} halves known"),
    (f'sum by (instance, dir) (rate(soya_qp_halves_expired_total{I}[$__rate_interval]))', "{{instance}} {{dir}} forgotten/s"),
    (f'topk(5, rate(soya_flow_packets_total{I}[$__rate_interval]))', "{{instance}} {{half}} {{role}} pkt/s")], "none", 12, y,
    desc="soya_qp_halves: halves the engine knows, by role (flat under QP churn: quiet ones are forgotten, "
         "soya_qp_halves_expired_total); soya_flow_packets_total: request packets of the busiest "
         "halves (ingress: from the requester; egress: injected toward the responder)."))
y += 8

panels.append(row("Deep buffer, DC side and engine-to-WAN queue", y)); y += 1
panels.append(panel("Deep buffer occupancy", [
    (f"soya_buffer_slots_used{I} / soya_buffer_slots_total{I}", "{{instance}} used"),
    (f"soya_buffer_high_water_slots{I} / soya_buffer_slots_total{I}", "{{instance}} high water")], "percentunit", 0, y, minv=0, maxv=1,
    desc="soya_buffer_slots_used / soya_buffer_slots_total. Pseudo-ACKs are withheld when it fills."))
panels.append(panel("Deep buffer bytes", [
    (f"soya_buffer_slots_used{I} * soya_buffer_slot_bytes{I}", "{{instance}} used"),
    (f"soya_buffer_slots_total{I} * soya_buffer_slot_bytes{I}", "{{instance}} size")], "bytes", 12, y))
y += 8
panels.append(panel("Engine to WAN: pending bytes", [
    (f"soya_twin_pending_bytes{I}", "{{instance}} pending"),
    (f'soya_wan_buffered_bytes{I}', "{{instance}} transport {{dir}}")], "bytes", 0, y,
    desc="soya_twin_pending_bytes: messages waiting for WAN credit (new requests are refused above 64 MiB); soya_wan_buffered_bytes: held by the transport."))
panels.append(panel("DC side packets", [
    (f"rate(soya_dc_rx_packets_total{I}[$__rate_interval])", "{{instance}} rx {{result}}"),
    (f"rate(soya_dc_tx_packets_total{I}[$__rate_interval])", "{{instance}} tx {{result}}")], "pps", 12, y,
    desc="soya_dc_rx_packets_total by result (accepted, acl_*, malformed, draining, backpressure) and soya_dc_tx_packets_total."))
y += 8
panels.append(panel("DC side throughput (bits/s)", [
    (f"8 * rate(soya_dc_rx_bytes_total{I}[$__rate_interval])", "{{instance}} rx"),
    (f"8 * rate(soya_dc_tx_bytes_total{I}[$__rate_interval])", "{{instance}} tx")], "bps", 0, y,
    desc="soya_dc_rx_bytes_total and soya_dc_tx_bytes_total: IP bytes read from and written to the data-center side."))
panels.append(panel("DC packets dropped before the gateway read them", [
    (f"rate(soya_dc_rx_kernel_drops_total{I}[$__rate_interval])", "{{instance}} kernel drops"),
    (f'rate(soya_dc_rx_packets_total{S_result_backpressure}[$__rate_interval])', "{{instance}} backpressure"),
    (f"rate(soya_dc_lab_host_conflicts_total{I}[$__rate_interval])", "{{instance}} lab host conflicts")], "pps", 12, y, minv=0,
    desc="soya_dc_rx_kernel_drops_total: packets the kernel dropped before the gateway read them (tun queue or socket "
         "buffer full: the device loop is short of CPU; each drop makes a requester go back N). Backpressure: refused "
         "by the gateway itself. Lab host conflicts (udp backend): datagrams for a host bound to another "
         "active UDP address. All should stay 0."))
y += 8
panels.append(panel("Engine to WAN: messages and waits", [
    (f"rate(soya_twin_messages_total{I}[$__rate_interval])", "{{instance}} {{dir}}"),
    (f"rate(soya_twin_blocked_total{I}[$__rate_interval])", "{{instance}} waited for credit"),
    (f"soya_twin_pending_messages{I}", "{{instance}} pending (count)")], "none", 0, y,
    desc="soya_twin_messages_total{dir} (reliable engine messages, /s), soya_twin_blocked_total (messages that had to "
         "wait for WAN flow credit or buffer room, /s) and soya_twin_pending_messages (waiting now)."))
panels.append(panel("Engine to WAN: pending high water", [
    (f"soya_twin_pending_high_water_bytes{I}", "{{instance}} high water")], "bytes", 12, y,
    desc="soya_twin_pending_high_water_bytes: most bytes ever waiting for the WAN transport (new requests are refused "
         "above 64 MiB)."))
y += 8

panels.append(row("QP engine and WAN transport", y)); y += 1
panels.append(panel("Engine intake by verdict", [
    (f"rate(soya_engine_dc_packets_total{I}[$__rate_interval])", "{{instance}} dc {{kind}}"),
    (f"rate(soya_engine_twin_messages_total{I}[$__rate_interval])", "{{instance}} twin {{kind}}"),
    (f"rate(soya_engine_unmatched_responses_total{I}[$__rate_interval])", "{{instance}} unmatched responses")], "pps", 0, y,
    desc="soya_engine_dc_packets_total{kind=all|malformed|bad_icrc|not_roce}, soya_engine_twin_messages_total"
         "{kind=all|malformed} and soya_engine_unmatched_responses_total (responses forwarded without a known half). "
         "Every kind but all should stay near 0; bad_icrc from a host sending with UDP GSO: see soya-perf --gso."))
panels.append(panel("Engine events and WAN flows", [
    (f"increase(soya_engine_flows_learned_total{I}[$__rate_interval])", "{{instance}} halves learned by {{how}}"),
    (f"increase(soya_engine_cm_messages_total{I}[$__rate_interval])", "{{instance}} RDMA-CM MADs"),
    (f"rate(soya_engine_cnps_absorbed_total{I}[$__rate_interval])", "{{instance}} CNPs absorbed/s"),
    (f"soya_wan_flows{I}", "{{instance}} WAN flows {{dir}}"),
    (f"increase(soya_wan_flows_retired_total{I}[$__rate_interval])", "{{instance}} WAN flows retired")], "none", 12, y,
    desc="soya_engine_flows_learned_total{how=cm|traffic}, soya_engine_cm_messages_total (per interval) and "
         "soya_engine_cnps_absorbed_total (CNPs from local responders, not forwarded). soya_wan_flows{dir}: WAN "
         "flows open now (idle ones retire, so under QP churn it stays near the halves recently active, far below "
         "65 536); soya_wan_flows_retired_total per interval."))
y += 8
panels.append(panel("WAN packets and datagrams", [
    (f"rate(soya_wan_packets_total{I}[$__rate_interval])", "{{instance}} packets {{dir}}"),
    (f"rate(soya_wan_transport_datagrams_total{I}[$__rate_interval])", "{{instance}} transport {{result}}"),
    (f"rate(soya_wan_datagrams_total{I}[$__rate_interval])", "{{instance}} unreliable {{dir}}"),
    (f"rate(soya_wan_packets_lost_total{I}[$__rate_interval])", "{{instance}} lost"),
    (f"rate(soya_wan_packets_retransmitted_total{I}[$__rate_interval])", "{{instance}} retransmitted")], "pps", 0, y,
    desc="All paths and shards: soya_wan_packets_total, soya_wan_transport_datagrams_total{result=sent|received|dropped}, "
         "soya_wan_datagrams_total (non-RoCE traffic and RDMA-CM, carried unreliably), soya_wan_packets_lost_total and "
         "soya_wan_packets_retransmitted_total."))
panels.append(panel("WAN transport trouble (should stay 0)", [
    (f"rate(soya_wan_socket_errors_total{I}[$__rate_interval])", "{{instance}} socket {{op}} errors"),
    (f"increase(soya_wan_events_dropped_total{I}[$__rate_interval])", "{{instance}} events dropped"),
    (f"increase(soya_wan_messages_discarded_total{I}[$__rate_interval])", "{{instance}} messages discarded"),
    (f"increase(soya_twin_discarded_on_restart_total{I}[$__rate_interval])", "{{instance}} pending discarded on restart"),
    (f"increase(soya_twin_send_errors_total{I}[$__rate_interval])", "{{instance}} send errors")], "none", 12, y,
    desc="soya_wan_socket_errors_total{op} (/s); per interval: soya_wan_events_dropped_total, "
         "soya_wan_messages_discarded_total and soya_twin_discarded_on_restart_total (twin restarts), "
         "soya_twin_send_errors_total (refused for good)."))
y += 8

panels.append(row("Security and errors", y)); y += 1
panels.append(panel("WAN datagrams rejected", [
    (f"rate(soya_wan_auth_failures_total{I}[$__rate_interval])", "{{instance}} auth failures"),
    (f"rate(soya_wan_replays_dropped_total{I}[$__rate_interval])", "{{instance}} replays"),
    (f"rate(soya_wan_malformed_total{I}[$__rate_interval])", "{{instance}} malformed"),
    (f"rate(soya_wan_unknown_source_total{I}[$__rate_interval])", "{{instance}} unknown source"),
    (f"rate(soya_wan_foreign_source_total{I}[$__rate_interval])", "{{instance}} foreign source"),
    (f"rate(soya_wan_stale_generation_total{I}[$__rate_interval])", "{{instance}} stale generation"),
    (f"rate(soya_wan_no_session_total{I}[$__rate_interval])", "{{instance}} no session"),
    (f"rate(soya_wan_role_conflicts_total{I}[$__rate_interval])", "{{instance}} role conflicts"),
    (f"rate(soya_wan_protocol_violations_total{I}[$__rate_interval])", "{{instance}} protocol violations"),
    (f"rate(soya_wan_datagram_acl_drops_total{I}[$__rate_interval])", "{{instance}} datagram ACL drops")], "pps", 0, y,
    desc="WAN datagrams refused: authentication, replay window, parse, source address (unknown: no path's remote; "
         "foreign: unexpected on a single-path socket), an old twin session, before any session, a twin of the same "
         "role, protocol violations by an authentic twin, unreliable datagrams refused by the ACL."))
panels.append(panel("Twin restarts and failed flows", [
    (f"increase(soya_wan_peer_restarts_total{I}[$__rate_interval])", "{{instance}} peer restarts"),
    (f"increase(soya_flows_failed_on_restart_total{I}[$__rate_interval])", "{{instance}} flows failed"),
    (f"soya_twin_pending_overflow_total{I}", "{{instance}} pending overflow (must be 0)")], "none", 12, y))
y += 8
panels.append(panel("Twin state (lost after wan.twin_timeout without a path)", [
    (f"soya_twin_state{{state=\"connected\"{IL}}}", "{{instance}} connected"),
    (f"soya_twin_state{{state=\"unreachable\"{IL}}}", "{{instance}} unreachable"),
    (f"soya_twin_state{{state=\"lost\"{IL}}}", "{{instance}} LOST"),
    (f"soya_twin_state{{state=\"connecting\"{IL}}}", "{{instance}} connecting"),
    (f"soya_twin_unreachable_seconds{I}", "{{instance}} seconds without a path")], "none", 0, y,
    desc="soya_twin_state: connecting, connected, unreachable (every WAN path down) or lost (down for "
         "wan.twin_timeout: every flow through the twin failed toward its application, new requests refused). "
         "soya_twin_unreachable_seconds: how long no path has answered."))
panels.append(panel("Twin losses and what they failed", [
    (f"increase(soya_twin_lost_total{I}[$__rate_interval])", "{{instance}} twin lost"),
    (f"increase(soya_flows_failed_twin_lost_total{I}[$__rate_interval])", "{{instance}} flows failed"),
    (f"rate(soya_twin_lost_requests_refused_total{I}[$__rate_interval])", "{{instance}} requests refused"),
    (f"increase(soya_twin_failed_total{I}[$__rate_interval])", "{{instance}} failed {{what}}")],
    "none", 12, y))
y += 8
panels.append(panel("Failing QPs with nothing outstanding: probes and far errors", [
    (f"increase(soya_qp_probes_total{I}[$__rate_interval])", "{{instance}} probes {{what}}"),
    (f"increase(soya_far_errors_total{I}[$__rate_interval])", "{{instance}} far errors {{what}}")],
    "none", 0, y,
    desc="A local QP whose expected PSN is unknown is probed before the poison that moves it to error: "
         "`unanswered` QPs stayed unfailed (also counted as unattributable). Far errors: requests the far "
         "side refused for good, and how a requester with nothing outstanding was failed."))
panels.append(panel("Orphans of a gateway restart", [
    (f"increase(soya_orphans_total{I}[$__rate_interval])", "{{instance}} {{what}}")],
    "none", 12, y,
    desc="QPs orphaned by a gateway restart: told to the twin that came back; received from it and "
         "poisoned, probed, skipped or unattributable; requesters of this site watched for their "
         "retransmissions and failed with a NAK at their oldest outstanding PSN (docs/semantics.md)."))
y += 8

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
