#!/bin/bash
# 5 interleaved pairs: soya demo (default: netns+xdp as root) and --loopback
cd "$(dirname "$0")/../.."
for i in 1 2 3 4 5; do
  for m in "" "--loopback"; do
    l=$(cut -d' ' -f1 /proc/loadavg)
    r=$(target/release/soya demo $m --json 2>/dev/null | python3 -c "import json,sys; v=json.load(sys.stdin); print('%s 0km %.3f direct %.3f soya %.3f ratio %.3f ok %s errs %d' % (v.get('backend'), v['direct_0km_gbps'], v['direct_gbps'], v['accelerated_gbps'], v['accelerated_gbps']/v['direct_0km_gbps'], v['ok'], v['data_errors']))")
    echo "$(date -u +%H:%M:%S) load $l [$m] $r"
  done
done
