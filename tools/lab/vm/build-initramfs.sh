#!/bin/bash
# Build a tiny initramfs: busybox-static + the modules needed to mount the
# host's root filesystem over virtio-9p, then overlay a tmpfs on top of it and
# switch_root into it.  usage: build-initramfs.sh OUT.cpio.gz
# (adapted from shared/lab/build-initramfs.sh)
set -euo pipefail
OUTF=${1:?output initramfs path}
KV=${KV:-$(find /lib/modules -mindepth 1 -maxdepth 1 -name '6.1.*' -printf '%f\n' | sort -V | tail -1)}
MODDIR=/lib/modules/$KV
W=$(mktemp -d)
rm -rf "$W"; mkdir -p "$W"/{bin,dev,proc,sys,mnt/lower,mnt/rw,newroot,modules}
cp /bin/busybox "$W/bin/busybox"
for a in sh mount umount mkdir insmod switch_root echo cat sleep poweroff ls sed; do ln -s busybox "$W/bin/$a"; done

# resolve module load order from modules.dep (deps first, no duplicates)
declare -A SEEN; ORDER=()
resolve() {   # $1 = path relative to $MODDIR
  local m=$1 deps d
  [[ -n ${SEEN[$m]:-} ]] && return; SEEN[$m]=1
  deps=$(grep -E "^${m}:" "$MODDIR/modules.dep" | cut -d: -f2)
  for d in $deps; do resolve "$d"; done
  ORDER+=("$m")
}
for name in virtio_pci 9pnet_virtio 9p overlay; do
  p=$(grep -E "/${name}\.ko(\.[a-z]+)?:" "$MODDIR/modules.dep" | cut -d: -f1)
  resolve "$p"
done
: > "$W/modules/order"
for m in "${ORDER[@]}"; do
  b=$(basename "$m")
  case $b in
    *.ko.xz) xz -dc "$MODDIR/$m" > "$W/modules/${b%.xz}"; b=${b%.xz};;
    *.ko.zst) zstd -qdc "$MODDIR/$m" > "$W/modules/${b%.zst}"; b=${b%.zst};;
    *) cp "$MODDIR/$m" "$W/modules/$b";;
  esac
  echo "$b" >> "$W/modules/order"
done

cat > "$W/init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod /modules/$m || echo "insmod $m failed"; done
# host root, read-only (qemu -virtfs ... mount_tag=hostroot,readonly=on)
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /mnt/lower || { echo "9p mount failed"; sh; }
mount -t tmpfs -o size=2g tmpfs /mnt/rw; mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work /newroot || { echo "overlay failed"; sh; }
mkdir -p /newroot/mnt/out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /newroot/mnt/out || echo "out share mount failed"
BOOT=$(sed -n "s/.*soya\.boot=\([^ ]*\).*/\1/p" /proc/cmdline)
umount /proc /sys /dev 2>/dev/null
exec switch_root /newroot /bin/sh "$BOOT"
EOF
chmod +x "$W/init"
( cd "$W" && find . | cpio -o -H newc --quiet | gzip -1 ) > "$OUTF"
echo "initramfs: $OUTF ($(du -h "$OUTF" | cut -f1)), kernel $KV, modules: $(tr '\n' ' ' < "$W/modules/order")"
rm -rf "$W"
