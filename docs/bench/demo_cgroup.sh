#!/bin/bash
# Runs `soya demo --json` RUNS times inside a cgroup that gives it CPUS
# cores (1: one core to itself; 0.5: half of one core, by CFS quota; any
# other value: that quota spread over the machine), and prints one line
# per run: the time, the load, the circuit --rate auto chose, the bound,
# Sōya ÷ 0 km, Sōya ÷ direct and the three goodputs. Root (cgroups,
# network namespaces). cgroup v2 or v1 (cpu and cpuset controllers).
#   sudo docs/bench/demo_cgroup.sh 1 5            # a 1-core machine, 5 runs
#   sudo docs/bench/demo_cgroup.sh 0.5 5 --duration 10
#   sudo docs/bench/demo_cgroup.sh all 5          # no cgroup: the whole machine
# Extra arguments go to `soya demo`. SOYA=path/to/soya (default
# target/release/soya).
set -euo pipefail
cpus=${1:?usage: demo_cgroup.sh CPUS|all RUNS [soya demo args...]}
runs=${2:?usage: demo_cgroup.sh CPUS|all RUNS [soya demo args...]}
shift 2
soya=${SOYA:-target/release/soya}
period=${PERIOD_US:-100000}
name=soya-demo-$$

cleanup() {
  for d in /sys/fs/cgroup/$name /sys/fs/cgroup/cpu/$name /sys/fs/cgroup/cpuset/$name; do
    [ -d "$d" ] && rmdir "$d" 2>/dev/null || true
  done
}
trap cleanup EXIT

# Puts this shell (and so every process the demo starts) into the cgroup.
enter() {
  [ "$cpus" = all ] && return
  local quota cpuset=""
  quota=$(python3 -c "print(int($cpus * $period))")
  # A single core when it fits in one: the demo's five processes then
  # share it, as on a 1-core machine, instead of a quota over both.
  if python3 -c "import sys; sys.exit(0 if $cpus <= 1 else 1)"; then cpuset=0; fi
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    echo "+cpu +cpuset" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    mkdir /sys/fs/cgroup/$name
    echo "$quota $period" > /sys/fs/cgroup/$name/cpu.max
    [ -n "$cpuset" ] && echo $cpuset > /sys/fs/cgroup/$name/cpuset.cpus
    echo $BASHPID > /sys/fs/cgroup/$name/cgroup.procs
  else
    mkdir /sys/fs/cgroup/cpu/$name
    echo $period > /sys/fs/cgroup/cpu/$name/cpu.cfs_period_us
    echo "$quota" > /sys/fs/cgroup/cpu/$name/cpu.cfs_quota_us
    echo $BASHPID > /sys/fs/cgroup/cpu/$name/tasks
    if [ -n "$cpuset" ]; then
      mkdir /sys/fs/cgroup/cpuset/$name
      echo $cpuset > /sys/fs/cgroup/cpuset/$name/cpuset.cpus
      cat /sys/fs/cgroup/cpuset/cpuset.mems > /sys/fs/cgroup/cpuset/$name/cpuset.mems
      echo $BASHPID > /sys/fs/cgroup/cpuset/$name/tasks
    fi
  fi
}

# The runs go in a subshell that enters the cgroup, so that this shell,
# outside it, can remove the cgroup once they are over.
(
enter
for i in $(seq 1 "$runs"); do
  l=$(cut -d' ' -f1 /proc/loadavg); t=$(date -u +%H:%M:%S)
  "$soya" demo --json "$@" 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
r = d['soya_over_0km']
c = d.get('calibration') or {}
print(f\"$t load $l cpus $cpus run $i: circuit {d['rate_gbps']} Gb/s \"
      f\"(calibration {d['calibration_gbps'] or 0:.3f}, throttled periods \"
      f\"{c.get('cpu_throttled_periods', '-')}) window {d['window_packets']} \"
      f\"bound {d['bound']} soya/0km {'-' if r is None else f'{r:.3f}'} \"
      f\"x direct {d['speedup'] or 0:.2f} 0km {d['direct_0km_gbps']:.3f} \"
      f\"direct {d['direct_gbps']:.3f} soya {d['accelerated_gbps']:.3f} \"
      f\"errors {d['data_errors']} ok {d['ok']}\")"
done
)
