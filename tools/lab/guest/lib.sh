#!/bin/bash
# Guest-side helpers (sourced inside the VM): topology, WAN emulation,
# gateways, counters.  See docs/interop.md for the picture.
#
#   init_net "hostA"            netns gwA                      netns gwB                init_net "hostB"
#   rxe0 on vethA 10.0.1.1 --- dcA 10.0.1.254   wanA 192.168.77.1 === wanB 192.168.77.2   dcB 10.0.2.254 --- vethB 10.0.2.1 rxe1
#                              soya0 (tun, soya gateway)    netem both ways       soya0 (tun, soya gateway)
#
# rxe in 6.1 works only in init_net (its UDP/4791 socket and route lookups),
# so both endpoints live there and policy routing sends everything between
# 10.0.1.1 and 10.0.2.1 out through the gateway namespaces.
# Mode "direct": gwA/gwB route the site prefixes over the wan veth (kernel
# forwarding, same netem).  Mode "soya": the site prefixes are routed into
# each gateway's tun device and the gateways carry them over the wan veth.
# shellcheck disable=SC2034  # variables used by job.sh
OUT=${OUT:-/mnt/out}
A_IP=10.0.1.1; DCA_IP=10.0.1.254; B_IP=10.0.2.1; DCB_IP=10.0.2.254
A_NET=10.0.1.0/24; B_NET=10.0.2.0/24
WANA_IP=192.168.77.1; WANB_IP=192.168.77.2
A_DEV=rxe0; B_DEV=rxe1
WAN_MTU=9000          # the gateways' WAN datagrams are up to 8952 B (wan::DEFAULT_MAX_DATAGRAM)

log() { echo "### [$(cut -d' ' -f1 /proc/uptime)] $*"; }

load_modules() {
  modprobe rdma_rxe && modprobe sch_netem && modprobe veth && modprobe ib_uverbs && modprobe rdma_ucm && modprobe tun
}

# GID index of the IPv4-mapped GID (::ffff:a.b.c.d) of an rxe device
gid_index() {  # dev ip
  local dev=$1 a b c d hex f
  IFS=. read -r a b c d <<< "$2"
  hex=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
  for f in /sys/class/infiniband/$dev/ports/1/gids/*; do
    [ "$(cat "$f" 2>/dev/null)" = "$hex" ] && { basename "$f"; return; }
  done
  echo 1
}

noofl() { ethtool -K "$1" tso off gso off gro off tx off rx off >/dev/null 2>&1; }

topo() {
  local rps=${1:-1}
  ip netns add gwA; ip netns add gwB
  ip -n gwA link set lo up; ip -n gwB link set lo up
  ip link add vethA type veth peer name dcA
  ip link add vethB type veth peer name dcB
  ip link set dcA netns gwA; ip link set dcB netns gwB
  ip link add wanA netns gwA type veth peer name wanB netns gwB
  ip addr add $A_IP/24 dev vethA; ip link set vethA up
  ip addr add $B_IP/24 dev vethB; ip link set vethB up
  ip -n gwA addr add $DCA_IP/24 dev dcA; ip -n gwA link set dcA up
  ip -n gwB addr add $DCB_IP/24 dev dcB; ip -n gwB link set dcB up
  ip -n gwA link set wanA mtu $WAN_MTU; ip -n gwB link set wanB mtu $WAN_MTU
  ip -n gwA addr add $WANA_IP/30 dev wanA; ip -n gwA link set wanA up
  ip -n gwB addr add $WANB_IP/30 dev wanB; ip -n gwB link set wanB up
  local n
  for n in gwA gwB; do
    ip netns exec $n sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
      net.ipv4.conf.default.rp_filter=0
  done
  # no offloads: every hop sees real wire-sized frames
  noofl vethA; noofl vethB
  ip netns exec gwA bash -c "$(declare -f noofl); noofl dcA; noofl wanA"
  ip netns exec gwB bash -c "$(declare -f noofl); noofl dcB; noofl wanB"
  # the endpoints accept packets whose source is the other (local) address
  sysctl -qw net.ipv4.conf.all.accept_local=1 net.ipv4.conf.all.rp_filter=0 \
    net.ipv4.conf.vethA.rp_filter=0 net.ipv4.conf.vethB.rp_filter=0 \
    net.ipv4.conf.default.rp_filter=0
  # global (init_net only): the default backlog of 1000 overflows under TCG
  # ("rdma_rxe: Failed sending ACK" and go-back-N); room for the gateways'
  # 32 MiB socket buffers
  sysctl -qw net.core.netdev_max_backlog=100000 net.core.rmem_max=67108864 net.core.wmem_max=67108864
  # locally generated traffic to the other host leaves through its gateway
  ip route add $B_IP/32 via $DCA_IP dev vethA src $A_IP onlink table 101
  ip route add $A_IP/32 via $DCB_IP dev vethB src $B_IP onlink table 102
  ip rule add pref 10 iif lo to $B_IP lookup 101
  ip rule add pref 11 iif lo to $A_IP lookup 102
  # rdma_cm's passive side checks the netdev with a bare fib_lookup (oif set, iif 0)
  ip rule add pref 12 oif vethA to $B_IP lookup 101
  ip rule add pref 13 oif vethB to $A_IP lookup 102
  ip rule add pref 100 lookup local
  ip rule del pref 0
  # one CPU per receive path: no reordering of one QP's frames across backlogs
  if [ "$rps" != 0 ]; then
    echo "$rps" > /sys/class/net/vethA/queues/rx-0/rps_cpus
    echo "$rps" > /sys/class/net/vethB/queues/rx-0/rps_cpus
    ip netns exec gwA sh -c "echo $rps > /sys/class/net/dcA/queues/rx-0/rps_cpus; echo $rps > /sys/class/net/wanA/queues/rx-0/rps_cpus"
    ip netns exec gwB sh -c "echo $rps > /sys/class/net/dcB/queues/rx-0/rps_cpus; echo $rps > /sys/class/net/wanB/queues/rx-0/rps_cpus"
  fi
  rdma link add rxe0 type rxe netdev vethA
  rdma link add rxe1 type rxe netdev vethB
  # shellcheck disable=SC2034
  A_GID=$(gid_index rxe0 $A_IP); B_GID=$(gid_index rxe1 $B_IP)
  routes_direct
}

# kernel forwarding over the wan veth (the gateways' tun routes removed)
routes_direct() {
  ip -n gwA route replace $B_NET via $WANB_IP dev wanA
  ip -n gwB route replace $A_NET via $WANA_IP dev wanB
}

# WAN emulation on both directions of the wan veth
wan() {  # wan <rtt_ms> <loss_pct>
  local rtt=$1 loss=$2 half args
  half=$(awk -v r="$rtt" 'BEGIN{printf "%gms", r/2}')
  args="limit 100000"
  [ "$rtt" != 0 ] && args="$args delay $half"
  [ "$loss" != 0 ] && args="$args loss ${loss}%"
  ip netns exec gwA tc qdisc del dev wanA root 2>/dev/null
  ip netns exec gwB tc qdisc del dev wanB root 2>/dev/null
  if [ "$args" != "limit 100000" ]; then
    ip netns exec gwA tc qdisc add dev wanA root netem $args
    ip netns exec gwB tc qdisc add dev wanB root netem $args
  fi
}

# ---- the gateways ----
GW_DIR=/run/soya
SOYA=${SOYA:-soya}

gw_conf() {  # site local remote bind twin rtt_ms
  local rtt=$6 quota
  [ "$rtt" = 0 ] && rtt=1
  # per-flow quota ~ the bandwidth-delay product, as soya plan sizes it: a
  # 1 KiB RoCE packet takes a whole 4.5 KiB slot here, and a flow may have
  # half its quota in flight to the twin (4 MiB: 455 packets, 124 Mb/s at
  # 30 ms; 300 ms needs 20 MiB for the same)
  quota=$(( rtt / 15 )); [ $quota -lt 4 ] && quota=4
  cat <<CONF
site = "$1"
[dc]
backend = "tun"
interface = "soya0"
local_prefixes = ["$2"]
remote_prefixes = ["$3"]
[wan]
bind = ["$4:7400"]
${GW_TWIN_TIMEOUT:+twin_timeout = \"$GW_TWIN_TIMEOUT\"}
$(if [ "${GW_INSECURE:-0}" = 1 ]; then echo 'insecure = true'; else printf 'insecure = false\nkey_file = "psk.key"'; fi)
[[wan.paths]]
name = "lab-wan"
remote = "$5:7400"
rate = "${GW_RATE:-1gbit}"
rtt = "${rtt}ms"
[buffer]
size = "${GW_BUFFER:-64MiB}"
per_flow_quota = "${GW_FLOW_QUOTA:-${quota}MiB}"
[pseudo_ack]
policy = "${GW_POLICY:-edge}"
[control]
metrics = ""
socket = "$GW_DIR/$1.sock"
[log]
level = "${GW_LOG:-info}"
CONF
}

# start both gateways and route the site prefixes into their tun devices
gw_start() {  # rtt_ms tag
  local rtt=$1 tag=$2 n site t
  mkdir -p $GW_DIR
  [ -f $GW_DIR/psk.key ] || { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > $GW_DIR/psk.key; chmod 600 $GW_DIR/psk.key; }
  gw_conf site-a $A_NET $B_NET $WANA_IP $WANB_IP "$rtt" > $GW_DIR/site-a.toml
  gw_conf site-b $B_NET $A_NET $WANB_IP $WANA_IP "$rtt" > $GW_DIR/site-b.toml
  for site in site-a site-b; do
    n=gwA; [ $site = site-b ] && n=gwB
    rm -f $GW_DIR/$site.sock
    # A gateway is an appliance with its own cores; here it shares two
    # emulated CPUs with busy-polling perftest clients and the kernel's rxe
    # work. Real-time priority (soya.rt=N) keeps its ACK latency below
    # rxe's ACK timeout (67 ms at perftest's default -u 14).
    ip netns exec $n ${GW_RT:+chrt -f $GW_RT} $SOYA gateway -c $GW_DIR/$site.toml > $OUT/gw/$tag.$site.log 2>&1 &
    eval "GWPID_$n=$!"
  done
  for site in site-a site-b; do
    t=0
    while [ ! -S $GW_DIR/$site.sock ]; do
      sleep 0.2; t=$((t+1))
      [ $t -gt 150 ] && { log "gateway $site did not start"; cat $OUT/gw/$tag.$site.log; return 1; }
    done
  done
  # soya0's queue (txqueuelen 16384) is the gateway's own doing: nothing
  # to set here (docs/interop.md pitfall 10, docs/operations.md).
  ip -n gwA route replace $B_NET dev soya0
  ip -n gwB route replace $A_NET dev soya0
  # wait until the WAN session is up. The explicit return matters: a loop's
  # status is its body's last command, so `[ $t -gt 60 ] && …` (false while
  # waiting) once made gw_start fail whenever the session needed a second
  # poll, and a CI run reported "gateways did not start" for two gateways
  # that were up.
  t=0
  until $SOYA status --json -s $GW_DIR/site-a.sock 2>/dev/null | grep -q '"connected": *true'; do
    sleep 0.5; t=$((t+1))
    if [ $t -gt 60 ]; then log "WAN session not up after 30 s"; break; fi
  done
  return 0
}

gw_status() {  # tag
  local site
  for site in site-a site-b; do
    $SOYA status --json -s $GW_DIR/$site.sock > $OUT/gw/$1.$site.status.json 2>&1
  done
  # the gateway namespaces' kernel counters (drops on the forwarding path)
  for n in gwA gwB; do
    { ip netns exec $n nstat -az; ip -n $n -s link; tc -n $n -s qdisc show dev soya0; } > $OUT/gw/$1.$n.kernel.txt 2>&1
  done
}

gw_stop() {
  local p
  for p in ${GWPID_gwA:-} ${GWPID_gwB:-}; do kill -TERM $p 2>/dev/null; done
  for p in ${GWPID_gwA:-} ${GWPID_gwB:-}; do wait $p 2>/dev/null; done
  GWPID_gwA=; GWPID_gwB=
  routes_direct
}

# ---- rxe hardware counters ----
CTRS="rcvd_seq_err out_of_seq_request duplicate_request completer_retry_err retry_exceeded_err rcvd_rnr_err rnr_nak_retry_err send_err retry_rnr_exceeded_err ack_deferred link_downed rdma_sends rdma_recvs"
# Waits until the counter the function COUNTER prints has grown by GOAL
# from BASE, the client has ended (DONE exists) or TRIES polls STEP seconds
# apart have passed; prints how much it grew. (restart.sh and twin.sh: the
# traffic that must flow before a gateway is killed.)
await_traffic() {  # counter base goal done step tries
  local i=0
  while [ $(( $($1) - $2 )) -lt "$3" ]; do
    sleep "$5"; i=$((i+1))
    [ -f "$4" ] && break
    [ $i -gt "$6" ] && break
  done
  echo $(( $($1) - $2 ))
}
ctr() { cat /sys/class/infiniband/$1/ports/1/hw_counters/$2 2>/dev/null || echo 0; }
snap_ctrs() { local c; for c in $CTRS; do echo "$c $(ctr rxe0 $c) $(ctr rxe1 $c)"; done; }
# "name=a/b,..." (rxe0 = hostA / rxe1 = hostB deltas; only nonzero, rdma_sends/recvs left out)
diff_ctrs() {
  paste "$1" "$2" | awk '$1!="rdma_sends" && $1!="rdma_recvs" {da=$5-$2; db=$6-$3; if (da||db) {printf "%s%s=%d/%d", sep, $1, da, db; sep=","}}'
}
