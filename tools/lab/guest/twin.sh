#!/bin/bash
# Guest side of `interop.sh --twin-lost` (sourced by job.sh after lib.sh):
# kill -9 one gateway mid-run, do not restart it, and see whether the
# application at site A ends with an error, and how long after the kill.
#
#   twin_case TOOL VICTIM     TOOL: rping | pingpong | rpingdreq   VICTIM: far (gwB) | near (gwA)
#
# rpingdreq: rping, plus an experiment for the fix of a hanging rping (the
# gateway's poison moves its QP to error, but rping ignores flushes): the
# connection set-up is captured on dcA, and wan.twin_timeout + 2 s after the
# kill dreq.py sends hostA an RDMA-CM DREQ as if from hostB (what a gateway
# could send on fail_all), from gwA's namespace.
#
# Client at hostA (site A), server at hostB (site B), through both gateways,
# netem RTT $RTT. Every step is bounded: a hang ends as "HANG" in
# $OUT/twin.tsv, never as a stuck job. Per case, $OUT/twin/<case>.*:
# client/server logs, the surviving gateway's `soya status` (text and
# --json) before the kill, after the twin timeout and at the end, rxe
# counters (`rdma statistic`, hw_counters), QP states (`rdma resource show
# qp`), and a full-size capture on the surviving gateway's DC link (dcA for
# far, dcB for near; RoCE only) from just before the kill (decode: soya-decode).
TW_SIZE=${TW_SIZE:-8192}      # several 1 KiB RoCE packets per message
TW_COUNT=${TW_COUNT:-1000000} # far more than a run can do: it must end by error
TW_TRAFFIC=${TW_TRAFFIC:-20}  # rdma_sends at hostA before the kill
TW_WAIT=${TW_WAIT:-60}        # s after the kill for the client to exit

now() { date +%s.%N; }
# each line of the client's stderr with the time it was read (rping prints
# its CM events there, unbuffered): when the application *learned* of the
# loss, apart from how long its own teardown took
stamp_lines() { while IFS= read -r l; do echo "$(now) $l"; done; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }

# surviving gateways' status + kernel RDMA state, tagged
tw_snap() {  # case label
  local c=$1 l=$2 site
  for site in site-a site-b; do
    [ -S $GW_DIR/$site.sock ] || continue
    timeout 5 $SOYA status -s $GW_DIR/$site.sock > "$OUT/twin/$c.$l.$site.status.txt" 2>&1
    timeout 5 $SOYA status --json -s $GW_DIR/$site.sock > "$OUT/twin/$c.$l.$site.status.json" 2>&1
  done
  { echo "== hw_counters"; snap_ctrs; echo "== rdma statistic"; rdma statistic show 2>&1
    echo "== rdma resource show qp"; rdma resource show qp 2>&1; } > "$OUT/twin/$c.$l.rdma.txt"
}

tw_sends() { ctr rxe0 rdma_sends; }

# the line of `soya status` about the twin
tw_twin_line() { grep -m1 -i 'twin' "$1" 2>/dev/null | sed 's/^ *//' | tr '\t' ' ' | cut -c1-160; }

twin_case() {  # tool victim
  local tool=$1 victim=$2 c="twin.$1.$2" spid cpid t0 tk rc dt verdict vpid s0 n note cl sl line
  mkdir -p "$OUT/twin"
  log "== $c (RTT $RTT ms, wan.twin_timeout ${GW_TWIN_TIMEOUT:-5s default})"
  gw_start "$RTT" "$c" || { printf '%s\t%s\t%s\t-\t-\t-\tFAIL\tgateways did not start\t-\t-\n' "$c" "$tool" "$victim" >> "$OUT/twin.tsv"; return; }
  rm -f /tmp/tw.done /tmp/tw.cpid /tmp/tw.spid /tmp/tw.client.err
  # Warm the 9p root's caches for what a client opens only when it ends:
  # rping's threads end in pthread_exit, which dlopens libgcc_s for the
  # unwinding; cold, over 9p under TCG, that read held rping's exit 1.7 s
  # after the DISCONNECTED event (strace, 2026-11-26), a delay of this VM,
  # not of the application or the gateways.
  cat /lib/x86_64-linux-gnu/libgcc_s.so.1 > /dev/null 2>&1
  s0=$(tw_sends)
  case $tool in
    rping|rpingdreq)
      if [ "$tool" = rpingdreq ]; then
        ip netns exec gwA tcpdump -U -ni dcA -s 0 -c 12 -w "$OUT/twin/$c.cm.pcap" udp port 4791 > /dev/null 2>&1 &
        sleep 1
      fi
      ( timeout 300 rping -s -a $B_IP -V -C $TW_COUNT -S $TW_SIZE > "$OUT/twin/$c.server.log" 2>&1 & echo $! > /tmp/tw.spid; wait $! ) &
      sleep 2
      ( timeout 300 rping -c -a $B_IP -V -C $TW_COUNT -S $TW_SIZE > /tmp/tw.client.log 2> >(stamp_lines > /tmp/tw.client.err) &
        echo $! > /tmp/tw.cpid; wait $!; echo "$? $(now)" > /tmp/tw.done ) < /dev/null &
      ;;
    pingpong)
      ( timeout 300 ibv_rc_pingpong -d $B_DEV -g $B_GID -s $TW_SIZE -n $TW_COUNT -e > "$OUT/twin/$c.server.log" 2>&1 & echo $! > /tmp/tw.spid; wait $! ) &
      sleep 2
      ( timeout 300 ibv_rc_pingpong -d $A_DEV -g $A_GID -s $TW_SIZE -n $TW_COUNT -e $B_IP > /tmp/tw.client.log 2> >(stamp_lines > /tmp/tw.client.err) &
        echo $! > /tmp/tw.cpid; wait $!; echo "$? $(now)" > /tmp/tw.done ) < /dev/null &
      ;;
  esac
  # traffic must flow before the kill
  t0=$(now)
  n=$(await_traffic tw_sends "$s0" "$TW_TRAFFIC" /tmp/tw.done 0.5 120)
  if [ -f /tmp/tw.done ] || [ "$n" -lt "$TW_TRAFFIC" ]; then
    note="no traffic before the kill (rdma_sends +$n, client $(cat /tmp/tw.done 2>/dev/null || echo running))"
    log "$c: $note"
    printf '%s\t%s\t%s\t%s\t-\t-\tFAIL\t%s\t-\t-\n' "$c" "$tool" "$victim" "$n" "$note" >> "$OUT/twin.tsv"
  else
    if [ "$tool" = rpingdreq ]; then
      # started before the kill (python's start-up over 9p takes seconds under
      # TCG); sends at kill + twin timeout + 1 s
      rm -f /tmp/tw.kill
      ip netns exec gwA python3 "$LAB/guest/dreq.py" "$OUT/twin/$c.cm.pcap" dcA "$(cat /sys/class/net/vethA/address)" \
        /tmp/tw.kill $(( ${GW_TWIN_TIMEOUT%s} + 1 )) > "$OUT/twin/$c.dreq.txt" 2>&1 &
      sleep 15
    fi
    tw_snap "$c" before
    # on the surviving gateway's DC link: what it sends to its host after the loss
    local sn_ns=gwA sn_if=dcA
    [ "$victim" = near ] && sn_ns=gwB sn_if=dcB
    ip netns exec $sn_ns tcpdump -U -ni $sn_if -s 0 -c 3000 -w "$OUT/twin/$c.$sn_if.pcap" udp port 4791 > /dev/null 2>&1 &
    local cap=$!
    sleep 1
    if [ "$victim" = far ]; then vpid=$GWPID_gwB; GWPID_gwB=; else vpid=$GWPID_gwA; GWPID_gwA=; fi
    n=$(( $(tw_sends) - s0 ))
    tk=$(now); kill -9 "$vpid"; echo "$tk" > /tmp/tw.kill
    log "$c: kill -9 $victim gateway (pid $vpid) at $tk after rdma_sends +$n"
    # the twin timeout plus a little: the survivor should say LOST by then
    (sleep $(( ${GW_TWIN_TIMEOUT%s} + 2 )); tw_snap "$c" lost) > /dev/null 2>&1 &
    local sn=$!
    while [ ! -f /tmp/tw.done ]; do
      sleep 0.2
      [ "$(since "$tk" | cut -d. -f1)" -ge "$TW_WAIT" ] && break
    done
    if [ -f /tmp/tw.done ]; then
      read -r rc dt < /tmp/tw.done
      dt=$(awk -v a="$tk" -v b="$dt" 'BEGIN{printf "%.2f", b-a}')
      if [ "$rc" = 0 ]; then verdict=EXIT-OK; else verdict=ERROR-EXIT; fi
    else
      rc=-; dt=">$TW_WAIT"; verdict=HANG
    fi
    log "$c: client $verdict rc=$rc, kill -> exit $dt s"
    wait $sn 2>/dev/null
    tw_snap "$c" after
    # end whatever still runs (the timeout wrappers forward the signal)
    kill "$(cat /tmp/tw.cpid 2>/dev/null)" "$(cat /tmp/tw.spid 2>/dev/null)" 2>/dev/null
    sleep 2
    kill -9 "$(cat /tmp/tw.cpid 2>/dev/null)" "$(cat /tmp/tw.spid 2>/dev/null)" 2>/dev/null
    kill $cap 2>/dev/null
    cat /tmp/tw.client.log /tmp/tw.client.err > "$OUT/twin/$c.client.log" 2>/dev/null
    cl=$(grep -v '^ *$' "$OUT/twin/$c.client.log" | grep -viE 'ping data|^ *local address|^ *remote address' | tail -3 | tr '\n\t' '  ' | cut -c1-200)
    sl=$(grep -v '^ *$' "$OUT/twin/$c.server.log" | grep -viE 'ping data|^ *local address|^ *remote address' | tail -2 | tr '\n\t' '  ' | cut -c1-160)
    line=$(tw_twin_line "$OUT/twin/$c.lost.site-a.status.txt"; tw_twin_line "$OUT/twin/$c.lost.site-b.status.txt")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$tool" "$victim" "$n" "$rc" "$dt" "$verdict" \
      "${cl:--}" "${sl:--}" "$(echo "$line" | tr '\n' ' ')" >> "$OUT/twin.tsv"
  fi
  kill "$(cat /tmp/tw.cpid 2>/dev/null)" "$(cat /tmp/tw.spid 2>/dev/null)" 2>/dev/null
  # the surviving gateway drains toward a dead twin: at most 5 s, then TERM again
  for p in ${GWPID_gwA:-} ${GWPID_gwB:-}; do kill -TERM "$p" 2>/dev/null; done
  sleep 7
  for p in ${GWPID_gwA:-} ${GWPID_gwB:-}; do kill -9 "$p" 2>/dev/null; done
  GWPID_gwA=; GWPID_gwB=
  routes_direct
  dmesg | tail -40 > "$OUT/twin/$c.dmesg.txt"
  sleep 1
}

twin_run() {  # list of twin_<tool>_<victim>
  local t
  # bash's process substitution (the stamped stderr) needs /dev/fd, which
  # the guest's devtmpfs lacks
  [ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
  printf 'case\ttool\tvictim\tsends_before_kill\trc\tkill_to_exit_s\tverdict\tclient_said\tserver_said\ttwin_status\n' > "$OUT/twin.tsv"
  for t in ${1//,/ }; do
    t=${t#twin_}
    twin_case "${t%_*}" "${t#*_}"
  done
}
