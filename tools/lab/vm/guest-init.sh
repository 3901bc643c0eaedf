#!/bin/sh
# PID 1 inside the guest after switch_root (root = host / read-only over 9p
# + tmpfs overlay).  Runs the job named on the kernel command line
# (soya.job=/path/script) and powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /dev/net; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /var/run 2>/dev/null
# A checkout under /tmp (a CI runner's, say) must stay visible: the host's
# /tmp is then left as the overlay shows it (writes stay in the guest).
case "$(sed -n 's/.*soya\.job=\([^ ]*\).*/\1/p' /proc/cmdline)" in
  /tmp/*) ;;
  *) mount -t tmpfs tmpfs /tmp ;;
esac
mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
mkdir -p /run/netns /var/log
hostname soya-lab
ip link set lo up
echo "GUEST-UP uptime=$(cut -d' ' -f1 /proc/uptime)"
JOB=$(sed -n 's/.*soya\.job=\([^ ]*\).*/\1/p' /proc/cmdline)
OUT=/mnt/out
if [ -n "$JOB" ] && [ -f "$JOB" ]; then
  # run a private copy: the host / is shared live over 9p, and editing the
  # script on the host mid-run must not shift bash's read offset
  cp "$JOB" /run/job.sh
  # bounded (soya.job_limit seconds): a hung step ends the job, not the VM's
  # watchdog on the host, and the guest still powers off with its results.
  # The job writes to a file that tail copies to the console: a pipe would
  # keep the console writer waiting for any background process the job
  # left behind.
  LIMIT=$(sed -n 's/.*soya\.job_limit=\([0-9]*\).*/\1/p' /proc/cmdline)
  : > "$OUT/guest-console.log"
  tail -f "$OUT/guest-console.log" &
  TAIL=$!
  timeout -k 10 "${LIMIT:-86400}" bash /run/job.sh >> "$OUT/guest-console.log" 2>&1
  rc=$?
  sleep 1; kill $TAIL 2>/dev/null
  case $rc in 124|137) echo "GUEST-JOB-TIMEOUT after ${LIMIT}s (a step hung)" ;; esac
else
  echo "no job ($JOB)"
fi
echo "GUEST-DONE uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
echo o > /proc/sysrq-trigger
sleep 5
