#!/bin/bash
# Runs `soya demo --json` (as root: network namespaces, xdp) for each
# LABEL:BIN_DIR in the order given and prints one line per run: the time,
# the load, Sōya ÷ 0 km and the three goodputs. Interleave two builds to
# compare them on a machine whose speed drifts over hours, e.g.
#   sudo docs/bench/demo_ab.sh base:/tmp/base main:target/release base:/tmp/base main:target/release
for spec in "$@"; do
  label=${spec%%:*}; dir=${spec#*:}
  l=$(cut -d' ' -f1 /proc/loadavg); t=$(date -u +%H:%M:%S)
  "$dir/soya" demo --json 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
print(f\"$t load $l $label: {d['accelerated_gbps'] / d['direct_0km_gbps']:.3f} \"
      f\"acc {d['accelerated_gbps']:.3f} 0km {d['direct_0km_gbps']:.3f} \"
      f\"direct {d['direct_gbps']:.3f} errors {d['data_errors']}\")"
done
