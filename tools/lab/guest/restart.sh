#!/bin/bash
# Guest side of `interop.sh --restart` (sourced by job.sh after lib.sh):
# kill -9 the far gateway (gwB, the one that re-injects site A's requests
# toward hostB) while an application at site A runs, restart it at once with
# the same config (as systemd's Restart= would), and see whether the
# application completes with no error (issue 35: the near gateway resends
# what was not yet delivered and the new far gateway re-learns each QP).
#
#   restart_case TOOL     TOOL: write (ib_write_bw, a fixed number of
#                         64 KiB WRITEs) | rping (rping -V: every ping's
#                         data verified by rping itself); TOOL_control
#                         (restart_write_control…): the same run with no
#                         kill, to tell the restart's effect from the lab's;
#                         TOOL_planned (restart_write_planned…): no kill but
#                         a planned restart of gwA, then of gwB (SIGTERM: a
#                         drain and CLOSE "restart", then a new process with
#                         the same config, as `systemctl restart` does)
#
# Client at hostA, server at hostB, through both gateways, netem RTT $RTT.
# Every step is bounded: a hang ends as "HANG" in $OUT/restart.tsv. Per
# case, $OUT/restart/<case>.*: client/server logs, both gateways' logs and
# `soya status` after the run (gwA's "twin restarts:" line says what became
# of its QPs), rxe counters before and after.
RS_TRAFFIC=${RS_TRAFFIC:-200}   # sent_pkts at hostA before the kill
RS_WAIT=${RS_WAIT:-120}         # s after the kill for the client to end

rs_sent() { ctr rxe0 sent_pkts; }

# A gateway (A or B) again, as gw_start starts it; its tun device (and so
# the route into it) died with the old process
rs_restart_gw() {  # A|B tag
  local x=$1 site=site-b net=$A_NET
  [ "$x" = A ] && { site=site-a; net=$B_NET; }
  rm -f $GW_DIR/$site.sock
  ip netns exec gw$x ${GW_RT:+chrt -f $GW_RT} $SOYA gateway -c $GW_DIR/$site.toml > "$OUT/restart/$2.$site.restarted.log" 2>&1 &
  eval "GWPID_gw$x=$!"
  local t=0
  while [ ! -S $GW_DIR/$site.sock ]; do
    sleep 0.1; t=$((t+1))
    [ $t -gt 300 ] && { log "restarted gateway $site did not start"; return 1; }
  done
  ip -n gw$x route replace $net dev soya0
}

# SIGTERM to a gateway (A or B) and waits for it to drain and exit, at most
# 20 s (its drain is bounded at 5 s); 1 if it did not (then kill -9).
rs_stop_gw() {  # A|B
  local p t=0
  eval "p=\$GWPID_gw$1"
  kill -TERM "$p" 2>/dev/null
  while kill -0 "$p" 2>/dev/null; do
    sleep 0.1; t=$((t+1))
    [ $t -gt 200 ] && { kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; return 1; }
  done
  wait "$p" 2>/dev/null
}

restart_case() {  # tool[_control]
  local tool=${1%_control} c="restart.$1" kill=1 s0 n t0 tk tr rc src dt verdict note cl x
  [ "$tool" != "$1" ] && kill=0
  if [ "${1%_planned}" != "$1" ]; then tool=${1%_planned}; kill=planned; fi
  mkdir -p "$OUT/restart"
  log "== $c (RTT $RTT ms)"
  gw_start "$RTT" "$c" || { printf '%s\t%s\t-\t-\t-\t-\tFAIL\tgateways did not start\t-\n' "$c" "$tool" >> "$OUT/restart.tsv"; return; }
  rm -f /tmp/rs.done /tmp/rs.sdone
  snap_ctrs > "$OUT/restart/$c.ctrs0.txt"
  s0=$(rs_sent)
  case $tool in
    write)
      # -n: a fixed amount of work (not -D), so that the run spans the restart and ends on its own
      ( timeout -k 5 300 ib_write_bw -d $B_DEV -x $B_GID -F --report_gbits -s 65536 -n 3000 ${QPT:+-u $QPT} \
          > "$OUT/restart/$c.server.log" 2>&1; echo "$?" > /tmp/rs.sdone ) &
      sleep 2
      ( timeout -k 5 300 ib_write_bw -d $A_DEV -x $A_GID -F --report_gbits -s 65536 -n 3000 ${QPT:+-u $QPT} $B_IP \
          > "$OUT/restart/$c.client.log" 2>&1; echo "$? $(date +%s.%N)" > /tmp/rs.done ) < /dev/null &
      ;;
    rping)
      ( timeout -k 5 300 rping -s -a $B_IP -V -C 400 -S $RPING_SIZE > "$OUT/restart/$c.server.log" 2>&1
        echo "$?" > /tmp/rs.sdone ) &
      sleep 2
      ( timeout -k 5 300 rping -c -a $B_IP -V -v -C 400 -S $RPING_SIZE > "$OUT/restart/$c.client.log" 2>&1
        echo "$? $(date +%s.%N)" > /tmp/rs.done ) < /dev/null &
      ;;
  esac
  # traffic must flow before the kill
  n=$(await_traffic rs_sent "$s0" "$RS_TRAFFIC" /tmp/rs.done 0.2 300)
  if [ -f /tmp/rs.done ] || [ "$n" -lt "$RS_TRAFFIC" ]; then
    note="no traffic before the kill, or the run ended first (sent_pkts +$n)"
    log "$c: $note"
    printf '%s\t%s\t%s\t-\t-\t-\tFAIL\t%s\t-\n' "$c" "$tool" "$n" "$note" >> "$OUT/restart.tsv"
  else
    # both DC links from just before the kill to the end, in a ring of
    # four files of 1 MB each (-s 128: about 7,000 frames a file), so that
    # the last frames before a stall are kept (decode: soya-decode; the
    # files are <case>.dcB.pcap0..3, oldest first by time stamps)
    local cap=""
    if [ "${RS_CAPTURE:-1}" != 0 ]; then
      ip netns exec gwB tcpdump -Z root -U -ni dcB -s 128 -C 1 -W 4 -w "$OUT/restart/$c.dcB.pcap" udp port 4791 > /dev/null 2>&1 &
      cap="$!"
      ip netns exec gwA tcpdump -Z root -U -ni dcA -s 128 -C 1 -W 4 -w "$OUT/restart/$c.dcA.pcap" udp port 4791 > /dev/null 2>&1 &
      cap="$cap $!"
      sleep 1
    fi
    tk=$(date +%s.%N)
    if [ $kill = 1 ]; then
      kill -9 "$GWPID_gwB"
      wait "$GWPID_gwB" 2>/dev/null
      rs_restart_gw B "$c" || note="restart failed"
      tr=$(awk -v a="$tk" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')
      log "$c: kill -9 of gwB after sent_pkts +$n; restarted and routed ${tr} s later"
    elif [ $kill = planned ]; then
      # gwA, then gwB once traffic flows through the new gwA again; tr:
      # each one's SIGTERM -> routed again, in seconds
      tr=""
      for x in A B; do
        tk=$(date +%s.%N)
        rs_stop_gw $x || note="gw$x did not drain and exit within 20 s"
        rs_restart_gw $x "$c" || note="gw$x restart failed"
        tr="$tr${tr:+/}$(awk -v a="$tk" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')"
        log "$c: planned restart of gw$x: SIGTERM -> routed again ${tr##*/} s"
        s0=$(rs_sent)
        [ $x = A ] && await_traffic rs_sent "$s0" "$RS_TRAFFIC" /tmp/rs.done 0.2 300 > /dev/null
      done
    else
      tr=-
      log "$c: control run, no kill (sent_pkts +$n)"
    fi
    t0=$(date +%s)
    while [ ! -f /tmp/rs.done ] && [ $(( $(date +%s) - t0 )) -lt "$RS_WAIT" ]; do sleep 0.5; done
    if [ -f /tmp/rs.done ]; then
      read -r rc dt < /tmp/rs.done
      dt=$(awk -v a="$tk" -v b="$dt" 'BEGIN{printf "%.2f", b-a}')
      # the server ends when the client does
      t0=$(date +%s)
      while [ ! -f /tmp/rs.sdone ] && [ $(( $(date +%s) - t0 )) -lt 30 ]; do sleep 0.5; done
      src=$(cat /tmp/rs.sdone 2>/dev/null || echo HANG)
      verdict=OK
      [ "$rc" = 0 ] && [ "$src" = 0 ] || verdict=ERROR
      # The applications' own output only: the gateways' logs name
      # failures that are none ("GSO send failed … falling back",
      # "flows failed on restart 0"), which once made every kill case
      # an ERROR whatever the applications saw.
      # rping exits 0 on a disconnect too: every ping must have been verified
      if [ "$tool" = rping ]; then
        cl=$(grep -c 'ping data' "$OUT/restart/$c.client.log")
        [ "$cl" = 400 ] || verdict=ERROR
        # Both sides print "DISCONNECT EVENT" at a normal end too (seen
        # after the 400th verified ping): a disconnect that cut the run
        # short shows as fewer than 400 pings.
        grep -qiE 'mismatch|error' "$OUT/restart/$c.client.log" "$OUT/restart/$c.server.log" && verdict=ERROR
        note="$cl/400 pings verified"
      else
        note=$(awk '$1 ~ /^[0-9]+$/ && NF>=5 && $4 ~ /^[0-9.]+$/ {v=$4" Gb/s average"} END{print v}' "$OUT/restart/$c.client.log")
        grep -qiE 'error|fail' "$OUT/restart/$c.client.log" "$OUT/restart/$c.server.log" && verdict=ERROR
      fi
    else
      rc=-; src=-; dt=">$RS_WAIT"; verdict=HANG
    fi
    log "$c: $verdict client rc=$rc server rc=$src, kill -> client end $dt s ($note)"
    cl=$(timeout 5 $SOYA status -s $GW_DIR/site-a.sock 2>&1 | grep -m1 -i 'twin restarts' | sed 's/^ *//' | tr '\t' ' ' | cut -c1-200)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$tool" "$n" "$tr" "$rc/$src" "$dt" "$verdict" "${note:--}" "${cl:--}" >> "$OUT/restart.tsv"
  fi
  snap_ctrs > "$OUT/restart/$c.ctrs1.txt"
  [ -n "${cap:-}" ] && kill $cap 2>/dev/null
  for site in site-a site-b; do
    timeout 5 $SOYA status -s $GW_DIR/$site.sock > "$OUT/restart/$c.$site.status.txt" 2>&1
  done
  # whatever still runs ends here (the timeout wrappers forward the signal)
  pkill -f ib_write_bw 2>/dev/null; pkill -f 'rping -' 2>/dev/null
  gw_stop
  cp "$OUT/gw/$c."*.log "$OUT/restart/" 2>/dev/null
  sleep 1
}

restart_run() {  # list of restart_<tool>
  local t
  printf 'case\ttool\tsent_before_kill\tkill_to_routed_s\trc_client/server\tkill_to_end_s\tverdict\tnote\tgwA_twin_restarts\n' > "$OUT/restart.tsv"
  for t in ${1//,/ }; do
    restart_case "${t#restart_}"
  done
}
