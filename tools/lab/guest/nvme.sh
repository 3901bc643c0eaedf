#!/bin/bash
# NVMe over Fabrics on RDMA (sourced by job.sh after lib.sh): the kernel's
# nvmet-rdma target at site B exports a RAM disk (brd, /dev/ram0); the
# kernel's nvme-rdma host at site A connects to it over rxe, through
# whatever gwA/gwB route (direct or the Sōya gateways); fio writes with
# crc32c verify headers, then reads everything back and verifies it.
#
#   nvme_test    one row per fio phase (nvme_write, nvme_read) in results.tsv:
#                rc, Gb/s, IOPS in the note, verify errors, host dmesg errors.
#
# Who is the RDMA requester: the host SENDs commands (64 B capsules, inline
# data up to 4 KiB... here fio's 64 KiB blocks are not inline); the target
# moves the data itself, RDMA READ of the host's buffer for a write and
# RDMA WRITE into it for a read, then SENDs the completion, with Invalidate
# of the host's rkey (SEND_ONLY_INV) when the host asked for it. So the
# bulk requester is site B's target; perftest never sends SEND with
# Invalidate, and never keeps this many READs outstanding on one QP.
# Every step is bounded (timeout -k): a hang is a FAIL row, not a stuck job.
NVME_NQN=soya-lab
NVME_SIZE=$(arg nvme_size); NVME_SIZE=${NVME_SIZE:-16M}   # per fio phase (TCG carries a few MB/s)
NVME_BS=${NVME_BS:-64k}
NVME_QD=${NVME_QD:-16}
NVME_CFG=/sys/kernel/config/nvmet

nvme_target() {  # once: brd RAM disk exported on 10.0.2.1:4420 over rdma
  [ -d $NVME_CFG/subsystems/$NVME_NQN ] && return 0
  modprobe brd rd_nr=1 rd_size=262144 || return 1     # 256 MiB, RAM-backed
  modprobe nvmet && modprobe nvmet-rdma && modprobe nvme-rdma || return 1
  mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
  mkdir $NVME_CFG/subsystems/$NVME_NQN || return 1
  echo 1 > $NVME_CFG/subsystems/$NVME_NQN/attr_allow_any_host
  mkdir $NVME_CFG/subsystems/$NVME_NQN/namespaces/1
  echo /dev/ram0 > $NVME_CFG/subsystems/$NVME_NQN/namespaces/1/device_path
  echo 1 > $NVME_CFG/subsystems/$NVME_NQN/namespaces/1/enable || return 1
  mkdir $NVME_CFG/ports/1
  echo rdma > $NVME_CFG/ports/1/addr_trtype
  echo ipv4 > $NVME_CFG/ports/1/addr_adrfam
  echo $B_IP > $NVME_CFG/ports/1/addr_traddr
  echo 4420 > $NVME_CFG/ports/1/addr_trsvcid
  ln -s $NVME_CFG/subsystems/$NVME_NQN $NVME_CFG/ports/1/subsystems/$NVME_NQN || return 1
}

nvme_dev() {  # the block device of our subsystem, if connected
  # With native NVMe multipath (Debian's kernels) the block device hangs off
  # the subsystem (nvme-subsys0/nvme0n1); the controller only has the hidden
  # path device (nvme0c0n1), which has no /dev node.
  local s
  for s in /sys/class/nvme-subsystem/nvme-subsys* /sys/class/nvme/nvme*; do
    [ "$(cat "$s/subsysnqn" 2>/dev/null)" = $NVME_NQN ] || continue
    for d in "$s"/nvme*n1; do
      [ -b "/dev/$(basename "$d")" ] && { basename "$d"; return; }
    done
  done
}

# fio phase -> "rc gbps iops verify_errors"
nvme_fio() {  # tag rw
  local tag=$1 rw=$2 log
  log=$OUT/perf/$tag.fio-$rw.json
  # --verify=crc32c: every block carries a header with its offset and a
  # crc32c of its data; the write phase only writes them (do_verify=0),
  # the read phase reads every block back and checks it.
  timeout -k 5 $((NVME_TIMEOUT)) fio --name=$rw --filename=/dev/$DEV --direct=1 --ioengine=libaio \
    --rw=$rw --bs=$NVME_BS --iodepth=$NVME_QD --size=$NVME_SIZE \
    --verify=crc32c --do_verify=$([ $rw = read ] && echo 1 || echo 0) --verify_fatal=1 \
    --verify_state_save=0 --output-format=json --output="$log" > "$log.stderr" 2>&1
  local rc=$? verr
  # verify failures as fio reports them (bad header, crc32c mismatch)
  verr=$(grep -ciE 'verify|crc32c|bad (magic|header)' "$log.stderr")
  python3 - "$log" "$rw" "$rc" "$verr" <<'PY'
import json, sys
path, rw, rc, verr = sys.argv[1:5]
try:
    j = json.load(open(path))["jobs"][0]
    side = j[rw]
    if rc == "0" and (j["error"] or verr != "0"):
        rc = "1"
    # fio's bw is in KiB/s
    print(rc, f'{side["bw"] * 1024 * 8 / 1e9:.4f}', f'{side["iops"]:.0f}', verr, f'fio_error={j["error"]}')
except Exception as e:
    print(rc if rc != "0" else "1", "FAIL", "-", verr, f"no_fio_json({type(e).__name__})")
PY
}

nvme_test() {
  local tag="$TAG.nvme" rc gbps iops verr ferr dm
  NVME_TIMEOUT=${NVME_TIMEOUT:-240}
  nvme_target || { row nvme_connect - 1 FAIL - - "nvmet-rdma target setup failed"; return; }
  dmesg -C
  snap_ctrs > /tmp/c0
  cap_start "$tag"
  # -Q 32: 32-deep I/O queues, 2 of them (one per guest CPU); a lost
  # controller is given up after 30 s instead of the default 600 s
  timeout -k 5 60 nvme connect -t rdma -a $B_IP -s 4420 -n $NVME_NQN -Q 32 -i 2 \
    --ctrl-loss-tmo=30 --reconnect-delay=2 > "$OUT/perf/$tag.connect.log" 2>&1
  rc=$?
  DEV=
  local t=0
  while [ -z "$DEV" ] && [ $t -lt 40 ]; do DEV=$(nvme_dev); [ -n "$DEV" ] || { sleep 0.5; t=$((t+1)); }; done
  if [ $rc != 0 ] || [ -z "$DEV" ] || [ ! -b /dev/$DEV ]; then
    snap_ctrs > /tmp/c1; cap_stop
    ls -l /sys/class/nvme* /sys/class/nvme*/* >> "$OUT/perf/$tag.connect.log" 2>&1
    timeout -k 5 60 nvme disconnect -n $NVME_NQN >> "$OUT/perf/$tag.connect.log" 2>&1
    row nvme_connect "-t rdma -Q 32 -i 2" "$([ $rc = 0 ] && echo 1 || echo $rc)" FAIL - - "connect rc=$rc, block device ${DEV:-not found}: $(head -1 "$OUT/perf/$tag.connect.log" | cut -c1-60)"
    return
  fi
  snap_ctrs > /tmp/c1
  row nvme_connect "-t rdma -Q 32 -i 2" 0 - - - "/dev/$DEV $(cat /sys/block/$DEV/size 2>/dev/null) sectors"
  for rw in write read; do
    snap_ctrs > /tmp/c0
    read -r rc gbps iops verr ferr <<< "$(nvme_fio "$tag" $rw)"
    snap_ctrs > /tmp/c1
    row nvme_$rw "bs=$NVME_BS qd=$NVME_QD size=$NVME_SIZE verify=crc32c" "$rc" "$gbps" - - "iops=$iops verify_errors=$verr $ferr"
  done
  cap_stop
  timeout -k 5 60 nvme disconnect -n $NVME_NQN > "$OUT/perf/$tag.disconnect.log" 2>&1 \
    || echo "disconnect rc=$?" >> "$OUT/perf/$tag.disconnect.log"
  dmesg > "$OUT/perf/$tag.dmesg.txt"
  # what the host's block layer and nvme driver call errors (a reconnect
  # is logged too: it means the fabric dropped the queue)
  dm=$(grep -ciE 'I/O error|blk_update_request|print_req_error|nvme.*(timeout|error|reconnect|abort)|rdma.*error' "$OUT/perf/$tag.dmesg.txt")
  snap_ctrs > /tmp/c0; snap_ctrs > /tmp/c1
  row nvme_dmesg - "$([ "$dm" = 0 ] && echo 0 || echo 1)" - - - "$dm error lines in the host dmesg"
}
