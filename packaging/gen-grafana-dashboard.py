#!/usr/bin/env python3
# Generates packaging/grafana/soya-dashboard.json (Grafana 10+, Prometheus data
# source):  python3 packaging/gen-grafana-dashboard.py > packaging/grafana/soya-dashboard.json
# Metric names must exist in proxy/src/gateway/metrics.rs (packaging/test-deb.sh checks).
import json
ds = {"type": "prometheus", "uid": "${datasource}"}
panels = []
pid = [0]
def panel(title, targets, unit, x, y, w=12, h=8, desc="", kind="timeseries", stack=False, minv=None, maxv=None):
    pid[0] += 1
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
def sel(extra=""):
    inner = 'instance=~"$instance"' + ("," + extra if extra else "")
    return "{" + inner + "}"

S_dir_received = sel('dir="received"')
S_dir_sent = sel('dir="sent"')
S_role_ingress = sel('role="ingress"')
S_state_up = sel('state="up"')
y = 0
panels.append(row("Gateway", y)); y += 1
st = panel("Twin connected", [(f"soya_wan_connected{I}", "{{instance}}")], "none", 0, y, w=6, h=4, kind="stat",
           desc="soya_wan_connected: 1 while a WAN session with the twin is up.")
st["fieldConfig"]["defaults"]["mappings"] = [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"}, "1": {"text": "up", "color": "green"}}}]
st["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}]}
panels.append(st)
st = panel("Paths up", [(f'sum by (instance) (soya_path_state{S_state_up})', "{{instance}}")], "none", 6, y, w=6, h=4, kind="stat",
           desc="Paths in state up (soya_path_state{state=\"up\"}).")
panels.append(st)
panels.append(panel("Uptime", [(f"soya_uptime_seconds{I}", "{{instance}}")], "s", 12, y, w=6, h=4, kind="stat"))
st = panel("Draining", [(f"soya_draining{I}", "{{instance}}")], "none", 18, y, w=6, h=4, kind="stat",
           desc="1 after SIGTERM while the gateway flushes to its twin.")
panels.append(st)
y += 4

panels.append(row("WAN paths", y)); y += 1
panels.append(panel("Path RTT (smoothed, and minimum)", [
    (f"soya_path_rtt_seconds{I}", "{{instance}} {{path}} srtt"),
    (f"soya_path_min_rtt_seconds{I}", "{{instance}} {{path}} min")], "s", 0, y,
    desc="soya_path_rtt_seconds and soya_path_min_rtt_seconds per path. Fibre: 2 x 4.9 us per km."))
panels.append(panel("Path loss", [
    (f"soya_path_loss_ratio{I}", "{{instance}} {{path}} recent"),
    (f'rate(soya_path_packets_lost_total{I}[$__rate_interval]) / ignoring(dir) rate(soya_path_packets_total{S_dir_sent}[$__rate_interval])', "{{instance}} {{path}} lost/sent")],
    "percentunit", 12, y, minv=0,
    desc="soya_path_loss_ratio (the transport's recent estimate) and lost / sent packets over the interval."))
y += 8
panels.append(panel("Path rate (bits/s)", [
    (f'8 * rate(soya_path_bytes_total{S_dir_sent}[$__rate_interval])', "{{instance}} {{path}} sent"),
    (f'8 * rate(soya_path_bytes_total{S_dir_received}[$__rate_interval])', "{{instance}} {{path}} received"),
    (f"soya_path_pacing_rate_bits_per_second{I}", "{{instance}} {{path}} pacing")], "bps", 0, y,
    desc="Bytes on each path (soya_path_bytes_total, WAN datagrams) and the congestion controller's pacing rate."))
panels.append(panel("Path retransmissions and state changes", [
    (f"rate(soya_path_packets_retransmitted_total{I}[$__rate_interval])", "{{instance}} {{path}} retransmitted"),
    (f"increase(soya_path_down_total{I}[$__rate_interval])", "{{instance}} {{path}} went down")], "pps", 12, y,
    desc="soya_path_packets_retransmitted_total (packets carrying resent data) and soya_path_down_total."))
y += 8

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
panels.append(panel("Flows known", [
    (f"soya_flows{I}", "{{instance}}")], "none", 12, y,
    desc="soya_flows: halves the engine knows, both roles."))
y += 8

panels.append(row("Deep buffer and engine-to-WAN queue", y)); y += 1
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

panels.append(row("Security and errors", y)); y += 1
panels.append(panel("WAN datagrams rejected", [
    (f"rate(soya_wan_auth_failures_total{I}[$__rate_interval])", "{{instance}} auth failures"),
    (f"rate(soya_wan_replays_dropped_total{I}[$__rate_interval])", "{{instance}} replays"),
    (f"rate(soya_wan_malformed_total{I}[$__rate_interval])", "{{instance}} malformed"),
    (f"rate(soya_wan_unknown_source_total{I}[$__rate_interval])", "{{instance}} unknown source")], "pps", 0, y))
panels.append(panel("Twin restarts and failed flows", [
    (f"increase(soya_wan_peer_restarts_total{I}[$__rate_interval])", "{{instance}} peer restarts"),
    (f"increase(soya_flows_failed_on_restart_total{I}[$__rate_interval])", "{{instance}} flows failed"),
    (f"soya_twin_pending_overflow_total{I}", "{{instance}} pending overflow (must be 0)")], "none", 12, y))
y += 8

dash = {
    "title": "Sōya gateways",
    "uid": "soya-gateways",
    "description": "Sōya RoCEv2 WAN gateways: paths, flows, deep buffer, pseudo-ACKs. Metrics: proxy/src/gateway/mod.rs.",
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
