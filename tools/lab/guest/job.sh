#!/bin/bash
# Guest job: builds the topology of lib.sh and runs the interop matrix,
# direct and through the Sōya gateways.  Parameters come from the kernel
# command line (soya.*=...), set by tools/lab/interop.sh:
#   soya.lab=DIR     this directory's parent (tools/lab)
#   soya.bin=DIR     where the soya binary is (target/release of the build)
#   soya.rtts=0,3,30 soya.losses=0,0.1 soya.modes=direct,soya
#   soya.tests=LIST  (see run_test)  soya.dur=5
# Results: $OUT/results.tsv, $OUT/perf/*.log, $OUT/gw/*, $OUT/dmesg.txt
arg() { sed -n "s/.*soya\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
LAB=$(arg lab); . "$LAB/guest/lib.sh"; . "$LAB/guest/twin.sh"; . "$LAB/guest/restart.sh"; . "$LAB/guest/nvme.sh"
BIN=$(arg bin); SOYA=$BIN/soya
RTTS=$(arg rtts); RTTS=${RTTS:-0,3,30}
LOSSES=$(arg losses); LOSSES=${LOSSES:-0,0.1}
MODES=$(arg modes); MODES=${MODES:-direct,soya}
TESTS=$(arg tests); TESTS=${TESTS:-rping,write4k,write64k,write1m,write64k_t16,send64k,read64k,qperf,pingpong}
DUR=$(arg dur); DUR=${DUR:-5}
RPING_SIZE=$(arg rping_size); RPING_SIZE=${RPING_SIZE:-1024}   # rping -S: > MTU (1024) spans several packets
CAPTURE=$(arg capture)   # >0: tcpdump that many RoCE frames on dcA and dcB per test (soya mode)
GW_POLICY=$(arg policy); GW_POLICY=${GW_POLICY:-edge}
GW_INSECURE=$(arg insecure)
GW_RT=$(arg rt); [ "$GW_RT" = 0 ] && GW_RT=
QPT=$(arg qpt)   # >0: perftest -u QPT (QP ACK timeout) for every perftest run
GW_TWIN_TIMEOUT=$(arg twin_timeout)   # wan.twin_timeout of the gateways (empty: the default)
export GW_POLICY GW_INSECURE GW_RT GW_TWIN_TIMEOUT
mkdir -p "$OUT/perf" "$OUT/gw"
RES=$OUT/results.tsv
printf 'mode\trtt_ms\tloss_pct\ttest\tparams\trc\tgbps\twire_gbps\tlat_us\tnote\trxe_ctrs_A/B\n' > "$RES"

wire_sample() {  # dev counter start_s window_s -> Gbit/s, sampled in the middle of a run
  local i=$1 c=$2 s=$3 w=$4 b0 b1 t0 t1
  sleep "$s"; b0=$(cat /sys/class/net/$i/statistics/$c); t0=$(date +%s.%N)
  sleep "$w"; b1=$(cat /sys/class/net/$i/statistics/$c); t1=$(date +%s.%N)
  awk -v b0="$b0" -v b1="$b1" -v t0="$t0" -v t1="$t1" 'BEGIN{printf "%.4f", (b1-b0)*8/(t1-t0)/1e9}'
}

row() {  # test params rc gbps wire lat note
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$MODE" "$RTT" "$LOSS" "$1" "$2" "$3" "$4" "$5" "$6" "$7" \
    "$(diff_ctrs /tmp/c0 /tmp/c1)" | tee -a "$RES"
}

cap_start() {  # tag
  CAP_PIDS=
  [ "${CAPTURE:-0}" -gt 0 ] && [ "$MODE" = soya ] || return 0
  mkdir -p "$OUT/pcap"
  ip netns exec gwA tcpdump -U -ni dcA -s 128 -c "$CAPTURE" -w "$OUT/pcap/$1.dcA.pcap" udp port 4791 2>/dev/null &
  CAP_PIDS="$!"
  ip netns exec gwB tcpdump -U -ni dcB -s 128 -c "$CAPTURE" -w "$OUT/pcap/$1.dcB.pcap" udp port 4791 2>/dev/null &
  CAP_PIDS="$CAP_PIDS $!"
  ip netns exec gwA tcpdump -U -ni soya0 -s 128 -c "$CAPTURE" -w "$OUT/pcap/$1.tunA.pcap" udp port 4791 2>/dev/null &
  CAP_PIDS="$CAP_PIDS $!"
  sleep 1
}
cap_stop() {
  [ -n "$CAP_PIDS" ] || return 0
  sleep 1; kill $CAP_PIDS 2>/dev/null; wait $CAP_PIDS 2>/dev/null; CAP_PIDS=
}

TAG=
perf_test() {  # tool size [extra...]  (client on hostA, server on hostB)
  local tool=$1 size=$2; shift 2
  [ "${QPT:-0}" != 0 ] && set -- "$@" -u "$QPT"
  local extra="$*" tag="$TAG.$tool.$size${*:+.$(echo "$*" | tr -d ' ')}" sp wp rc bw wire dir=tx_bytes
  [ "$tool" = ib_read_bw ] && dir=rx_bytes
  cap_start "$tag"
  snap_ctrs > /tmp/c0
  timeout -k 5 $((DUR+60)) $tool -d $B_DEV -x $B_GID -F --report_gbits -s "$size" -D "$DUR" "$@" \
    > "$OUT/perf/$tag.server.log" 2>&1 &
  sp=$!
  sleep 2
  wire_sample vethA $dir $((DUR/2+2)) $((DUR/2)) > /tmp/wire &
  wp=$!
  # who has the guest's CPUs in the middle of the run
  (sleep $((DUR/2+2)); top -b -n 1 -w 160 | head -25 > "$OUT/perf/$tag.top.txt" 2>&1) &
  timeout -k 5 $((DUR+50)) $tool -d $A_DEV -x $A_GID -F --report_gbits -s "$size" -D "$DUR" "$@" $B_IP \
    > "$OUT/perf/$tag.client.log" 2>&1
  rc=$?
  wait $sp; local src=$?; wait $wp
  [ $rc = 0 ] && rc=$src
  snap_ctrs > /tmp/c1
  cap_stop
  bw=$(awk '$1 ~ /^[0-9]+$/ && NF>=5 && $4 ~ /^[0-9.]+$/ {v=$4} END{print v}' "$OUT/perf/$tag.client.log")
  wire=$(cat /tmp/wire)
  row "$tool" "-s $size${extra:+ $extra}" "$rc" "${bw:-FAIL}" "$wire" - "$(grep -m1 -iE 'error|fail|status' "$OUT/perf/$tag.client.log" | tr '\t' ' ' | cut -c1-80)"
}

rping_test() {
  local tag="$TAG.rping" rc n
  snap_ctrs > /tmp/c0
  timeout -k 5 120 rping -s -a $B_IP -V -C 50 -S $RPING_SIZE > "$OUT/perf/$tag.server.log" 2>&1 &
  local sp=$!
  sleep 2
  timeout -k 5 110 rping -c -a $B_IP -V -v -C 50 -S $RPING_SIZE > "$OUT/perf/$tag.client.log" 2>&1
  rc=$?
  wait $sp; local src=$?
  [ $rc = 0 ] && rc=$src
  snap_ctrs > /tmp/c1
  n=$(grep -c 'ping data' "$OUT/perf/$tag.client.log")
  row rping "-C 50 -S $RPING_SIZE -V" "$rc" - - - "$n/50 pings verified$(grep -qiE 'mismatch|error' "$OUT/perf/$tag."*.log && echo ', ERRORS in log')"
}

pingpong_test() {  # ibv_rc_pingpong with buffer validation (SEND/RECV, 4 KiB)
  local tag="$TAG.pingpong" rc n=200 lat
  snap_ctrs > /tmp/c0
  timeout -k 5 120 ibv_rc_pingpong -d $B_DEV -g $B_GID -s 4096 -n $n -c > "$OUT/perf/$tag.server.log" 2>&1 &
  local sp=$!
  sleep 2
  timeout -k 5 110 ibv_rc_pingpong -d $A_DEV -g $A_GID -s 4096 -n $n -c $B_IP > "$OUT/perf/$tag.client.log" 2>&1
  rc=$?
  wait $sp; local src=$?
  [ $rc = 0 ] && rc=$src
  snap_ctrs > /tmp/c1
  lat=$(awk '/usec\/iter/ {print $(NF-1)}' "$OUT/perf/$tag.client.log")
  row ibv_rc_pingpong "-s 4096 -n $n -c" "$rc" - - "${lat:--}" "$(grep -m1 -iE 'error|fail|mismatch' "$OUT/perf/$tag."*.log | cut -c1-80)"
}

qperf_test() {
  local tag="$TAG.qperf" rc bw lat qs
  qperf > "$OUT/perf/$tag.server.log" 2>&1 &
  qs=$!
  sleep 2
  snap_ctrs > /tmp/c0
  timeout -k 5 $((DUR+80)) qperf -cm1 -t "$DUR" -m 65536 $B_IP rc_bw > "$OUT/perf/$tag.rc_bw.log" 2>&1
  rc=$?
  snap_ctrs > /tmp/c1
  bw=$(awk '/bw *=/ {v=$3; u=$4; if (u=="GB/sec") v*=8; else if (u=="MB/sec") v*=8/1000; else if (u=="KB/sec") v*=8/1e6; printf "%.4f", v}' "$OUT/perf/$tag.rc_bw.log")
  row qperf_rc_bw "-cm1 -m 65536" "$rc" "${bw:-FAIL}" - - "$(awk '/bw *=/{print $3, $4}' "$OUT/perf/$tag.rc_bw.log")"
  snap_ctrs > /tmp/c0
  timeout -k 5 $((DUR+80)) qperf -cm1 -t "$DUR" $B_IP rc_lat > "$OUT/perf/$tag.rc_lat.log" 2>&1
  rc=$?
  snap_ctrs > /tmp/c1
  lat=$(awk '/latency *=/ {v=$3; u=$4; if (u=="ms") v*=1000; else if (u=="sec") v*=1e6; else if (u=="ns") v/=1000; printf "%.1f", v}' "$OUT/perf/$tag.rc_lat.log")
  row qperf_rc_lat "-cm1" "$rc" - - "${lat:-FAIL}" "$(awk '/latency *=/{print $3, $4}' "$OUT/perf/$tag.rc_lat.log")"
  kill $qs 2>/dev/null; wait $qs 2>/dev/null
}

verbs_test() {  # op size: soya-perf --verbs, client on hostA's rxe0, server on hostB's rxe1
  local op=$1 size=$2 tag="$TAG.verbs_$1" rc src sp note gbps qpt=
  [ "${QPT:-0}" != 0 ] && qpt="--qp-timeout $QPT"
  snap_ctrs > /tmp/c0
  timeout -k 5 $((DUR+120)) "$BIN/soya-perf" server --verbs --device $B_DEV --gid-index $B_GID \
    --bind-ip 0.0.0.0 --once --accept-timeout 60 --drain-timeout 30 --json \
    > "$OUT/perf/$tag.server.json" 2> "$OUT/perf/$tag.server.log" &
  sp=$!
  sleep 2
  # shellcheck disable=SC2086
  timeout -k 5 $((DUR+100)) "$BIN/soya-perf" client $B_IP --verbs --device $A_DEV --gid-index $A_GID \
    --op $op --size $size --duration $DUR --tx-depth 16 --stall-timeout 30 --connect-timeout 20 $qpt --json \
    > "$OUT/perf/$tag.client.json" 2> "$OUT/perf/$tag.client.log"
  rc=$?
  wait $sp; src=$?
  [ $rc = 0 ] && rc=$src
  snap_ctrs > /tmp/c1
  read -r gbps note <<< "$(python3 - "$OUT/perf/$tag.client.json" <<'PY'
import json, sys
try:
    r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
    s = r.get("server") or {}
    print(f'{r["goodput_gbps"]:.4f}', f'ok={int(r["ok"])} data_errors={r["data_errors"]} verified={r["bytes_verified"]}'
          f' msgs={r["messages"]} server_msgs={s.get("messages", "-")} mtu={r["mtu"]} err={(r.get("error") or "-")[:60].replace(" ", "_")}')
except Exception as e:
    print("FAIL", f"no_client_json({type(e).__name__})")
PY
)"
  row "soya-perf_verbs_$op" "--size $size --tx-depth 16" "$rc" "$gbps" - - "$note"
}

run_test() {
  case $1 in
    rping) rping_test ;;
    write4k) perf_test ib_write_bw 4096 ;;
    write64k) perf_test ib_write_bw 65536 ;;
    write1m) perf_test ib_write_bw 1048576 ;;
    write64k_t16) perf_test ib_write_bw 65536 -t 16 ;;
    write64k_cm) perf_test ib_write_bw 65536 -R ;;
    write64k_ev) perf_test ib_write_bw 65536 -e ;;
    send64k) perf_test ib_send_bw 65536 ;;
    send4k) perf_test ib_send_bw 4096 ;;
    read64k) perf_test ib_read_bw 65536 ;;
    qperf) qperf_test ;;
    pingpong) pingpong_test ;;
    nvme) nvme_test ;;
    verbs_write) verbs_test write 65536 ;;
    verbs_send) verbs_test send 65536 ;;
    verbs_read) verbs_test read 65536 ;;
    verbs_atomic) verbs_test atomic 8 ;;
    *) log "unknown test $1" ;;
  esac
  sleep 1
}

log "modules"; load_modules || log "modprobe failed"
log "topology"; topo 1
{ echo "kernel $(uname -r)"; rdma link show; ibv_devinfo -d rxe0 | grep -E 'active_mtu|state'
  echo "A_GID=$A_GID B_GID=$B_GID"; ip rule; ip -n gwA route; ip -n gwB route
  $SOYA --version; } > "$OUT/info.txt" 2>&1
log "ready: A_GID=$A_GID B_GID=$B_GID soya=$($SOYA --version 2>&1)"

case $TESTS in
  twin_*)  # interop.sh --twin-lost: a gateway is killed in each case (twin.sh)
    MODE=soya RTT=${RTTS%%,*} LOSS=${LOSSES%%,*}
    wan "$RTT" "$LOSS"
    twin_run "$TESTS"
    MODES= ;;
  restart_*)  # interop.sh --restart: the far gateway killed and restarted (restart.sh)
    MODE=soya RTT=${RTTS%%,*} LOSS=${LOSSES%%,*}
    wan "$RTT" "$LOSS"
    restart_run "$TESTS"
    MODES= ;;
esac
for MODE in ${MODES//,/ }; do
  for RTT in ${RTTS//,/ }; do
    for LOSS in ${LOSSES//,/ }; do
      wan "$RTT" "$LOSS"
      TAG="$MODE.rtt$RTT.loss$LOSS"
      if [ "$MODE" = soya ]; then
        gw_start "$RTT" "$TAG" || { row gateway - 1 FAIL - - "gateways did not start"; continue; }
      fi
      snap_ctrs > /tmp/c0
      P=$(ping -q -c 3 -i 0.3 -W 3 $B_IP 2>&1 | awk -F/ '/rtt/ {print $5}')
      snap_ctrs > /tmp/c1
      row ping "-c 3" 0 - - "$(awk -v p="${P:-0}" 'BEGIN{printf "%.0f", p*1000}')" "ICMP avg rtt ${P:-none} ms"
      log "== $TAG"
      for t in ${TESTS//,/ }; do run_test "$t"; done
      if [ "$MODE" = soya ]; then gw_status "$TAG"; gw_stop; fi
    done
  done
done
wan 0 0
dmesg > "$OUT/dmesg.txt"
log "all done"
