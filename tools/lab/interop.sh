#!/bin/bash
# Sōya against the Linux kernel's RoCE stack (Soft-RoCE, rxe) under qemu.
#
#   tools/lab/interop.sh [--quick | --reduced] [options]
#
# One command: installs the Debian packages it needs (if missing), builds
# this tree's binaries, builds a small initramfs, boots Debian's stock 6.1
# kernel under qemu (TCG) with the host's / read-only over 9p, and inside it
# builds  hostA (rxe0) - gwA (soya gateway, tun) - wan (netem) - gwB (soya
# gateway, tun) - hostB (rxe1), then runs rping, ib_write_bw, ib_send_bw,
# ib_read_bw, qperf rc_bw/rc_lat and ibv_rc_pingpong, direct (kernel
# forwarding over the same netem'd wan link) and through the gateways, at
# every RTT and loss setting.  Writes OUT/results.tsv, results.json,
# goodput.png, summary.md and the verdict of the "must hold" checks.
#
# Matrices (per-run duration: --dur seconds, default 5):
#   full (default)  RTT 0,3,30 ms x loss 0,0.1 % x direct,soya; tests
#                   rping write4k write64k write1m write64k_t16 send64k read64k qperf pingpong
#   --quick         RTT 0,30 x loss 0,0.1 x direct,soya; rping write64k send64k read64k qperf pingpong
#   --reduced       the CI case (tools/lab/ci-reduced.sh, .ci/run): RTT 30 ms, loss 0.1 %, direct and
#                   through Sōya: rping -V of 8 KiB (8 packets at MTU 1024), ib_write_bw, ib_read_bw,
#                   ib_send_bw (64 KiB, 4 s each), soya-perf --verbs SEND (64 KiB, 4 s, every
#                   message's pattern checked at the receiver). Verdict: correctness only (report.py --verdict
#                   correctness); goodput printed as figures. The VM is bounded (--limit, default 540 s).
#   --twin-lost     RTT 30, loss 0, through Sōya only: rping -V and ibv_rc_pingpong (client at site A,
#                   server at site B); once traffic flows, kill -9 the far gateway (gwB), or in the
#                   *_near cases the near one (gwA), never restarted; measures kill -> client exit.
#                   Tests twin_{rping,pingpong}_{far,near}; twin_rpingdreq_far (not in the default
#                   list): rping plus an RDMA-CM DREQ sent to hostA as if from hostB after the
#                   twin timeout (guest/dreq.py, the experiment for a gateway-side fix).
#                   Writes OUT/twin.tsv and OUT/twin/
#                   (logs, status before/after, rxe counters, QP states, a dcA capture).
#                   Exit 0 when every *_far client (rpingdreq aside) exited with an error (no hang).
# Options:
#   --out DIR       output directory (default target/interop/<matrix>)
#   --rtts L --losses L --modes L --tests L --dur S   override the matrix
#   --policy P      pseudo_ack.policy of the gateways (edge, strict, off)
#   --restart       RTT 30, loss 0, through Sōya only: ib_write_bw (3,000 x 64 KiB WRITEs) and
#                   rping -V (400 pings) from site A; once traffic flows, kill -9 the far gateway
#                   (gwB) and restart it at once with the same config (issue 35). Tests
#                   restart_write, restart_rping; restart_write_planned and restart_rping_planned
#                   (not in the default list) restart gwA then gwB the planned way instead (SIGTERM:
#                   a drain and CLOSE "restart", then a new process), as `systemctl restart` does.
#                   Writes OUT/restart.tsv and OUT/restart/.
#                   Exit 0 when every client and server ended with status 0 (rping: all pings
#                   verified, no disconnect).
#   --twin-timeout D  wan.twin_timeout of the gateways (default with --twin-lost: 3s; else the config default)
#   --qp-timeout N  perftest -u N (QP ACK timeout 4.096 us x 2^N; perftest's default 14 = 67 ms
#                   is shorter than RTTs above ~60 ms: use 18 = 1.07 s there)
#   --insecure      plaintext WAN between the gateways (wan.insecure = true; default: a PSK)
#   --rt N          SCHED_FIFO priority of the gateways in the guest (default 10; 0: normal)
#   --capture N     tcpdump the first N RoCE frames of each bandwidth run through
#                   the gateways on both DC links (OUT/pcap/; decode: target/release/soya-decode)
#   --publish       copy the results and the plot into docs/ (interop-results.*)
#   --rping-size B  rping -S B (default 1024; --reduced 8192)
#   --nvme-size S   fio --size per phase of the nvme test (default 16M)
#   --limit S       kill the VM after S seconds (default: from the matrix size), and the guest
#                   job 30 s before that (it powers off with partial results)
#   Tests verbs_write, verbs_send, verbs_read, verbs_atomic: soya-perf --verbs (rxe0 -> rxe1,
#                   64 KiB or 8 B fetch-and-add, data verified; built with the verbs feature)
#   --no-install    do not apt-get install     --no-build   do not cargo build
# Exit status: 0 when every "must hold" check passed.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TWIN_TIMEOUT='' RT=10 INSECURE=0 CAPTURE=0 MATRIX=full RTTS='' LOSSES='' MODES='' TESTS='' DUR='' POLICY=edge OUT='' PUBLISH=0 INSTALL=1 BUILD=1 QPT=0 RPING_SIZE='' LIMIT='' NVME_SIZE=16M
while [ $# -gt 0 ]; do
  case $1 in
    --quick) MATRIX=quick ;;
    --reduced) MATRIX=reduced ;;
    --twin-lost) MATRIX=twin ;;
    --restart) MATRIX=restart ;;
    --twin-timeout) TWIN_TIMEOUT=$2; shift ;;
    --full) MATRIX=full ;;
    --out) OUT=$2; shift ;;
    --rtts) RTTS=$2; shift ;;
    --losses) LOSSES=$2; shift ;;
    --modes) MODES=$2; shift ;;
    --tests) TESTS=$2; shift ;;
    --dur) DUR=$2; shift ;;
    --policy) POLICY=$2; shift ;;
    --qp-timeout) QPT=$2; shift ;;
    --capture) CAPTURE=$2; shift ;;
    --insecure) INSECURE=1 ;;
    --rt) RT=$2; shift ;;
    --publish) PUBLISH=1 ;;
    --rping-size) RPING_SIZE=$2; shift ;;
    --nvme-size) NVME_SIZE=$2; shift ;;
    --limit) LIMIT=$2; shift ;;
    --no-install) INSTALL=0 ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "interop.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $MATRIX in
  full)    d_rtts=0,3,30; d_losses=0,0.1; d_modes=direct,soya
           d_tests=rping,write4k,write64k,write1m,write64k_t16,send64k,read64k,qperf,pingpong ;;
  quick)   d_rtts=0,30; d_losses=0,0.1; d_modes=direct,soya
           d_tests=rping,write64k,send64k,read64k,qperf,pingpong ;;
  reduced) d_rtts=30; d_losses=0.1; d_modes=direct,soya; d_tests=rping,write64k,read64k,send64k,verbs_send
           DUR=${DUR:-4}; RPING_SIZE=${RPING_SIZE:-8192}; LIMIT=${LIMIT:-540}
           # perftest's ACK timeout 268 ms (-u 16) instead of 67 ms: a round
           # trip through two gateways in an emulated guest can exceed 67 ms
           # at 30 ms netem (ICMP 38-90 ms measured), and every such timeout
           # would count as a retry the gateways did not cause
           [ "$QPT" = 0 ] && QPT=16 ;;
  twin)    d_rtts=30; d_losses=0; d_modes=soya
           d_tests=twin_rping_far,twin_pingpong_far,twin_rping_near,twin_pingpong_near
           TWIN_TIMEOUT=${TWIN_TIMEOUT:-3s} ;;
  restart) d_rtts=30; d_losses=0; d_modes=soya; d_tests=restart_write,restart_rping
           RPING_SIZE=${RPING_SIZE:-8192}
           [ "$QPT" = 0 ] && QPT=16 ;;
esac
RTTS=${RTTS:-$d_rtts}; LOSSES=${LOSSES:-$d_losses}; MODES=${MODES:-$d_modes}
TESTS=${TESTS:-$d_tests}; DUR=${DUR:-5}; RPING_SIZE=${RPING_SIZE:-1024}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
OUT=${OUT:-$TARGET/interop/$MATRIX}
T0=$(date +%s)
stamp() { echo "[interop $(( $(date +%s) - T0 ))s] $*"; }

if [ $INSTALL = 1 ]; then
  PKGS="qemu-system-x86 linux-image-amd64 rdma-core ibverbs-utils rdmacm-utils perftest
        busybox-static iproute2 ethtool tcpdump iputils-ping cpio python3"
  # the CI case needs neither qperf nor the plot (matplotlib is large)
  [ $MATRIX = reduced ] || PKGS="$PKGS qperf python3-matplotlib"
  case ",$TESTS," in *,nvme,*) PKGS="$PKGS fio nvme-cli" ;; esac
  # soya-perf --verbs: ibverbs-sys configures its vendored rdma-core (cmake,
  # libnl) and runs bindgen (libclang)
  case ",$TESTS," in *,verbs_*) PKGS="$PKGS cmake pkg-config libnl-3-dev libnl-route-3-dev clang libibverbs-dev" ;; esac
  missing=$(for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ]; then
    stamp "apt-get install:" $missing
    apt-get update -qq >/dev/null 2>&1
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null \
      || { echo "interop.sh: apt-get install failed" >&2; exit 1; }
  fi
  stamp "packages ok"
fi
ls /boot/vmlinuz-6.1.* >/dev/null 2>&1 || { echo "interop.sh: no /boot/vmlinuz-6.1.* (apt-get install linux-image-amd64)" >&2; exit 1; }

if [ $BUILD = 1 ]; then
  stamp "cargo build --release -p soya"
  (cd "$ROOT" && cargo build --release -q -p soya --bin soya) || { echo "interop.sh: build failed" >&2; exit 1; }
fi
VERBS=0; case ",$TESTS," in *,verbs_*) VERBS=1 ;; esac
if [ $BUILD = 1 ] && [ $VERBS = 1 ]; then
  stamp "cargo build --release -p soya-tools --features verbs --bin soya-perf"
  (cd "$ROOT" && cargo build --release -q -p soya-tools --features verbs --bin soya-perf) \
    || { echo "interop.sh: build of soya-perf --features verbs failed" >&2; exit 1; }
fi
[ -x "$TARGET/release/soya" ] || { echo "interop.sh: $TARGET/release/soya missing (build first)" >&2; exit 1; }

rm -rf "$OUT"; mkdir -p "$OUT/bin"
# what was measured: the commit the binary was built from (+ "-dirty")
git -C "$ROOT" describe --always --dirty > "$OUT/commit.txt" 2>/dev/null || echo unknown > "$OUT/commit.txt"
# the guest runs a private copy: a rebuild during the run must not change it
cp "$TARGET/release/soya" "$OUT/bin/soya"
[ $VERBS = 1 ] && cp "$TARGET/release/soya-perf" "$OUT/bin/soya-perf"
SOYA_BIN=/mnt/out/bin   # OUT as the guest mounts it
bash "$HERE/vm/build-initramfs.sh" "$OUT/initramfs.cpio.gz" > "$OUT/initramfs.log" 2>&1 \
  || { cat "$OUT/initramfs.log"; exit 1; }
stamp "initramfs built; booting (matrix $MATRIX: modes $MODES, RTT $RTTS ms, loss $LOSSES %, tests $TESTS, ${DUR}s runs)"

# rough upper bound on the VM's run time, for the watchdog
n=$(( $(echo "$MODES" | tr , '\n' | wc -l) * $(echo "$RTTS" | tr , '\n' | wc -l) \
      * $(echo "$LOSSES" | tr , '\n' | wc -l) * $(echo "$TESTS" | tr , '\n' | wc -l) ))
LIMIT=${LIMIT:-${TIMEOUT:-$(( 300 + n * (DUR + 150) ))}}
# The guest job gets 120 s less than the VM: boot and power-off take ~20 s
# each under TCG, and on a loaded host the guest's clock falls behind the
# host's (a run at load 28 lost more than 30 s): a tool stuck in the kernel (D
# state, deaf to timeout's SIGKILL) is abandoned, the guest powers off and
# the results so far are kept; if even that fails, the host kills qemu.
EXTRA_APPEND="soya.job_limit=$(( LIMIT > 240 ? LIMIT - 120 : LIMIT / 2 )) soya.rping_size=$RPING_SIZE soya.nvme_size=$NVME_SIZE soya.lab=$HERE soya.bin=$SOYA_BIN soya.rtts=$RTTS soya.losses=$LOSSES soya.modes=$MODES soya.tests=$TESTS soya.dur=$DUR soya.policy=$POLICY soya.capture=$CAPTURE soya.insecure=$INSECURE soya.rt=$RT soya.qpt=$QPT${TWIN_TIMEOUT:+ soya.twin_timeout=$TWIN_TIMEOUT}" \
  timeout -k 10 "$LIMIT" "$HERE/vm/boot-vm.sh" "$HERE/guest/job.sh" "$OUT" > "$OUT/serial.log" 2>&1
rc=$?
VM_OK=1
grep -q GUEST-DONE "$OUT/serial.log" || { VM_OK=0; echo "interop.sh: FAIL: the VM did not finish (qemu rc=$rc, limit ${LIMIT}s); see $OUT/serial.log" >&2; tail -20 "$OUT/serial.log" >&2; }
grep -q 'GUEST-JOB-TIMEOUT' "$OUT/serial.log" && { VM_OK=0; echo "interop.sh: FAIL: the guest job exceeded its limit (a tool hung); the last steps:" >&2; grep '^###' "$OUT/serial.log" | tail -5 >&2; }
stamp "VM finished (qemu rc=$rc)"
if [ $MATRIX = twin ]; then
  [ -s "$OUT/twin.tsv" ] || { echo "interop.sh: no twin.tsv" >&2; exit 1; }
  column -t -s "$(printf '\t')" "$OUT/twin.tsv" 2>/dev/null || cat "$OUT/twin.tsv"
  # every far-kill case must end with the client told, not a hang: an error
  # exit, or for rping (which exits 0 on a disconnect) its DISCONNECT event
  vrc=0
  awk -F'\t' 'NR>1 && $3=="far" && $2!="rpingdreq" && $7!="ERROR-EXIT" && !($2=="rping" && $7=="EXIT-OK" && $8 ~ /DISCONNECT/) {bad=1} END{exit bad}' "$OUT/twin.tsv" || vrc=1
  stamp "done: $OUT (twin-lost verdict rc=$vrc)"
  exit $vrc
fi
if [ $MATRIX = restart ]; then
  [ -s "$OUT/restart.tsv" ] || { echo "interop.sh: no restart.tsv" >&2; exit 1; }
  column -t -s "$(printf '\t')" "$OUT/restart.tsv" 2>/dev/null || cat "$OUT/restart.tsv"
  vrc=0
  awk -F'\t' 'NR>1 && $7!="OK" {bad=1} END{exit bad || NR<2}' "$OUT/restart.tsv" || vrc=1
  [ $VM_OK = 1 ] || vrc=1
  # CI keeps only what is printed: on a failure, the guest's own account
  [ $vrc = 0 ] || { echo "the guest's steps (serial.log):"; grep -E '^(###|\[gw|error|Error)' "$OUT/serial.log" | tail -40; }
  stamp "done: $OUT (restart verdict rc=$vrc)"
  exit $vrc
fi
[ -s "$OUT/results.tsv" ] || { echo "interop.sh: no results" >&2; exit 1; }

args=(--out "$OUT")
[ $MATRIX = reduced ] && args+=(--verdict correctness)
[ $PUBLISH = 1 ] && args+=(--publish "$ROOT/docs")
# Debian's python3 (it has python3-matplotlib), not whatever python3 is first on PATH
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
$PY "$HERE/report.py" "${args[@]}"
vrc=$?
[ $VM_OK = 1 ] || vrc=1
stamp "done: $OUT (verdict rc=$vrc)"
exit $vrc
