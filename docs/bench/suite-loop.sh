#!/bin/bash
# Runs the README's test command N times in a row (default 20) and stops at
# the first failure: issue 17's "20 of 20 consecutive runs". Each run's
# log goes to $OUT/run-K.log; one summary line per run is printed (start
# time UTC, wall seconds, load average at the start, passed / failed /
# ignored counts summed over every test binary).
#
#   docs/bench/suite-loop.sh [N] [OUT]      # as root, like .ci/run
set -u
cd "$(dirname "$0")/../.."
n=${1:-20}
out=${2:-/tmp/soya-suite-loop}
mkdir -p "$out"
export SOYA_REQUIRE_TSHARK=1 SOYA_REQUIRE_NETNS=1 SOYA_REQUIRE_BPF=1 SOYA_REQUIRE_PYTHON=1
echo "commit $(git rev-parse --short HEAD), $n runs, logs in $out"
cargo test --workspace --release --no-run -q || exit 2
for k in $(seq 1 "$n"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date -u +%H:%M:%S)
  t0=$(date +%s)
  cargo test --workspace --release >"$out/run-$k.log" 2>&1
  rc=$?
  t=$(( $(date +%s) - t0 ))
  sums=$(awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d ignored", p, f, i }' "$out/run-$k.log")
  echo "run $k: $start UTC, ${t} s, load $load, exit $rc, $sums"
  if [ "$rc" -ne 0 ]; then
    grep -E "^(test .* FAILED|failures:|---- )" "$out/run-$k.log" | head -20
    echo "stopped: run $k failed ($((k - 1)) consecutive passes before it)"
    exit 1
  fi
done
echo "$n of $n consecutive runs passed"
