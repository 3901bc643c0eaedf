#!/bin/bash
# Boot Debian's stock 6.1 kernel under qemu (TCG) with the host's / shared
# read-only over 9p and OUTDIR shared read-write, and run a guest job.
# usage: boot-vm.sh JOB OUTDIR   (extra kernel arguments in $EXTRA_APPEND)
# KVM is not used: /dev/kvm here is kvm-pvm, which aborts or hangs the boot
# (see docs/interop.md, pitfalls).
set -uo pipefail
VM=$(cd "$(dirname "$0")" && pwd)
JOB=${1:?job script}
OUTDIR=${2:?out dir}
MEM=${MEM:-4096}
SMP=${SMP:-2}
KERNEL=${KERNEL:-$(ls /boot/vmlinuz-6.1.* | sort -V | tail -1)}
INITRD=${INITRD:-$OUTDIR/initramfs.cpio.gz}
mkdir -p "$OUTDIR"
echo "[boot-vm] kernel=$KERNEL job=$JOB out=$OUTDIR smp=$SMP mem=$MEM"
exec qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$MEM" -smp "$SMP" \
  -nographic -nodefaults -no-reboot -serial stdio -nic none \
  -kernel "$KERNEL" -initrd "$INITRD" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 soya.boot=$VM/guest-init.sh soya.job=$JOB ${EXTRA_APPEND:-}" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$OUTDIR",mount_tag=out,security_model=none,multidevs=remap
