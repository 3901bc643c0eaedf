#!/usr/bin/env bash
# Checks the Debian package built by packaging/build-deb.sh:
#   1. contents (dpkg-deb -c): binaries, configs, unit, sysctl, examples,
#      docs, and no WAN key;
#   2. control (dpkg-deb -I/-e): fields, conffiles, maintainer scripts;
#   3. the systemd unit (systemd-analyze verify, when systemd-analyze exists);
#   4. the Prometheus and Grafana examples use only metric names the gateway
#      exports (packaging/metrics-spec.json, from proxy/src/gateway/metrics/table.rs);
#   4b. the routing examples (packaging/routing): scripts parse, BIRD 2
#      parses every bird-*.conf (`bird -p`; skipped without bird), and
#      `soya health` of a gateway that is not there exits 1 with a reason;
#   5. installs it into a throwaway root (dpkg -x: no maintainer scripts, no
#      dpkg database) and runs soya --version and soya check-config on the
#      installed /etc/soya/*.toml from there: refused without a key, refused
#      with a world-readable key, accepted with a key made as the docs say;
#   6. as root: a real `dpkg -i`, reinstall, `-r` and `--purge` inside a
#      private mount namespace whose /etc, /usr and /var are overlays that
#      are thrown away afterwards (the host is not changed): the postinst
#      creates the user soya and /etc/soya root:soya 0750, and the gateway's
#      user can read the configs and a key made as the docs say.
# Usage: packaging/test-deb.sh [path/to/soya_*.deb]
set -euo pipefail
cd "$(dirname "$0")/.."

deb=${1:-$(ls -t target/debian/soya_*.deb 2>/dev/null | head -n1)}
[ -n "$deb" ] && [ -f "$deb" ] || { echo "test-deb: no .deb (run packaging/build-deb.sh)" >&2; exit 1; }
errors=0
fail() { echo "test-deb: FAIL: $*" >&2; errors=$((errors + 1)); }
ok() { echo "test-deb: ok: $*"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== $deb ($(stat -c %s "$deb") bytes)"
version=$(dpkg-deb -f "$deb" Version)
upstream=${version%-*}

# 1. Contents.
dpkg-deb -c "$deb" > "$tmp/contents"
has() { # has MODE PATH: the path is in the package with that mode
  if awk -v p="./$2" -v m="$1" '$6 == p && $1 == m { f = 1 } END { exit !f }' "$tmp/contents"; then
    :
  else
    fail "missing or wrong mode (want $1): /$2"
  fi
}
for b in soya soya-perf soya-wanem soya-sim soya-decode; do
  has -rwxr-xr-x "usr/bin/$b"
done
for f in etc/soya/sapporo.toml etc/soya/wakkanai.toml \
  lib/systemd/system/soya@.service usr/lib/sysctl.d/60-soya.conf \
  usr/share/soya/examples/lab-udp-a.toml usr/share/soya/examples/lab-udp-b.toml \
  usr/share/soya/examples/xdp.conf \
  usr/share/soya/prometheus/soya-scrape.yml usr/share/soya/prometheus/soya-alerts.yml \
  usr/share/soya/grafana/soya-dashboard.json usr/share/doc/soya/README.md \
  usr/share/doc/soya/copyright usr/share/doc/soya/bench/distance.svg \
  lib/systemd/system/soya-announce@.service \
  usr/share/soya/routing/bird-sapporo-1.conf usr/share/soya/routing/bird-sapporo-2.conf \
  usr/share/soya/routing/bird-sapporo-router.conf usr/share/soya/routing/bird-wakkanai-1.conf \
  usr/share/soya/routing/bird-wakkanai-2.conf usr/share/soya/routing/bird-wakkanai-router.conf \
  usr/share/soya/routing/frr-sapporo-1.conf usr/share/soya/routing/frr-sapporo-router.conf \
  usr/share/soya/routing/frr-wakkanai-1.conf; do
  has -rw-r--r-- "$f"
done
for f in usr/share/soya/routing/soya-announce usr/share/soya/routing/frr-slices; do
  has -rwxr-xr-x "$f"
done
for d in docs/*.md; do
  has -rw-r--r-- "usr/share/doc/soya/$(basename "$d")"
done
if grep -q 'psk\.key' "$tmp/contents"; then
  fail "the package ships a WAN key file"
fi
[ "$errors" = 0 ] && ok "contents ($(grep -c '^-' "$tmp/contents") files)"

# 2. Control.
for field in Package Version Architecture Maintainer Depends Description; do
  [ -n "$(dpkg-deb -f "$deb" "$field")" ] || fail "control field $field is empty"
done
[ "$(dpkg-deb -f "$deb" Package)" = soya ] || fail "package name is not soya"
dpkg-deb -f "$deb" Depends | grep -q adduser || fail "Depends lacks adduser (postinst creates the user soya)"
dpkg-deb -e "$deb" "$tmp/DEBIAN"
printf '/etc/soya/sapporo.toml\n/etc/soya/wakkanai.toml\n' > "$tmp/want-conffiles"
if ! diff -u "$tmp/want-conffiles" <(sort "$tmp/DEBIAN/conffiles"); then
  fail "conffiles"
fi
for s in postinst prerm postrm; do
  if [ -x "$tmp/DEBIAN/$s" ]; then
    sh -n "$tmp/DEBIAN/$s" || fail "$s: syntax"
  else
    fail "maintainer script $s missing or not executable"
  fi
done
[ "$errors" = 0 ] && ok "control, conffiles, maintainer scripts"

# 5 (first part). Install into a throwaway root.
root="$tmp/root"
dpkg -x "$deb" "$root"
soya="$root/usr/bin/soya"

# 3. The unit, with its commands pointed into the throwaway root.
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$tmp/unit"
  sed -e "s|/usr/bin/soya|$soya|g" "$root/lib/systemd/system/soya@.service" \
    > "$tmp/unit/soya@sapporo.service"
  if systemd-analyze verify "$tmp/unit/soya@sapporo.service" > "$tmp/verify" 2>&1 \
    && ! grep -q . "$tmp/verify"; then
    ok "systemd-analyze verify soya@sapporo.service"
  else
    cat "$tmp/verify" >&2
    fail "systemd-analyze verify"
  fi
  grep -q '^ExecStart=/usr/bin/soya gateway --config /etc/soya/%i.toml$' \
    "$root/lib/systemd/system/soya@.service" || fail "unit ExecStart"
  grep -q '^CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW$' \
    "$root/lib/systemd/system/soya@.service" || fail "unit CapabilityBoundingSet"
else
  echo "test-deb: systemd-analyze not found: unit not verified"
fi

# 4. Metric names in the examples.
# packaging/metrics-spec.json is the gateway's metric table
# (`soya metrics-spec --json`; proxy/tests/metrics_spec.rs keeps it current).
exported=$(grep -o '"name": "soya_[a-z0-9_]*"' packaging/metrics-spec.json | cut -d'"' -f4 | sort -u)
used=$(cat "$root/usr/share/soya/grafana/soya-dashboard.json" \
  "$root/usr/share/soya/prometheus/soya-alerts.yml" | grep -o 'soya_[a-z0-9_]*' | sort -u)
n=0
for m in $used; do
  n=$((n + 1))
  grep -qx "$m" <<<"$exported" || fail "metric $m is used in the Grafana/Prometheus examples but not exported"
done
[ "$n" -gt 20 ] || fail "only $n metric names found in the examples"
[ "$errors" = 0 ] && ok "$n metric names in the dashboard and alerts are all exported"

# 4b. Health-driven routing examples.
routing="$root/usr/share/soya/routing"
for sc in soya-announce frr-slices; do
  sh -n "$routing/$sc" || fail "$sc: syntax"
done
"$routing/soya-announce" --help | grep -q 'soya health' || fail "soya-announce --help"
if command -v bird >/dev/null; then
  for c in "$routing"/bird-*.conf; do
    bird -p -c "$c" > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; fail "bird -p -c $(basename "$c")"; }
  done
  ok "BIRD 2 parses $(ls "$routing"/bird-*.conf | wc -l) example configs"
else
  echo "test-deb: bird not found: the BIRD examples were not parsed"
fi
if "$soya" health --socket "$tmp/no-gateway.sock" > "$tmp/out" 2>&1; then
  fail "soya health passed without a gateway"
elif ! grep -q '^unhealthy: no answer from' "$tmp/out"; then
  cat "$tmp/out" >&2
  fail "soya health without a gateway: unexpected message"
else
  ok "soya health without a gateway: exit 1, $(head -c 60 "$tmp/out")..."
fi
grep -q '^ExecStart=/usr/share/soya/routing/soya-announce --config /etc/soya/%i.toml' \
  "$root/lib/systemd/system/soya-announce@.service" || fail "soya-announce@.service ExecStart"

# 5. Run from the throwaway root.
out=$("$soya" --version) || fail "soya --version exited $?"
[ "$out" = "soya $upstream" ] || fail "soya --version printed '$out', want 'soya $upstream'"
for b in soya-perf soya-wanem soya-sim soya-decode; do
  "$root/usr/bin/$b" --help >/dev/null || fail "$b --help"
done
cfgs=("$root"/etc/soya/*.toml)
[ "${#cfgs[@]}" = 2 ] || fail "expected 2 site configs in /etc/soya, found ${#cfgs[@]}"
key="$root/etc/soya/psk.key"
# No key yet: refused, naming the file.
if "$soya" check-config "${cfgs[@]}" > "$tmp/out" 2>&1; then
  fail "check-config accepted the site configs without a key file"
elif ! grep -q "key file $key does not exist" "$tmp/out"; then
  cat "$tmp/out" >&2
  fail "check-config without a key: unexpected message"
fi
# The key as docs/deployment.md makes it.
(umask 027 && od -An -tx1 -N32 /dev/urandom > "$key")
chmod 644 "$key"
if "$soya" check-config --quiet "${cfgs[@]}" > "$tmp/out" 2>&1; then
  fail "check-config accepted a world-readable key"
fi
chmod 640 "$key"
if "$soya" check-config "${cfgs[@]}" > "$tmp/out" 2>&1; then
  ok "soya --version ($out) and soya check-config /etc/soya/*.toml from the installed root"
else
  cat "$tmp/out" >&2
  fail "check-config of the installed site configs"
fi
for c in "${cfgs[@]}"; do
  "$soya" gateway --config "$c" --check > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; fail "soya gateway --check $c"; }
done
"$soya" check-config --quiet "$root"/usr/share/soya/examples/*.toml || fail "lab examples"

# 6. A real installation, in a throwaway overlay of the host.
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && command -v findmnt >/dev/null; then
  mkdir -p "$tmp/ovl"
  cat > "$tmp/ovl/inside.sh" <<'INSIDE'
set -eu
ovl=$1 deb=$2
for d in etc usr var; do
  mkdir -p "$ovl/$d-up" "$ovl/$d-work"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$ovl/$d-up,workdir=$ovl/$d-work" "/$d"
  [ "$(findmnt -n -o FSTYPE "/$d")" = overlay ] || { echo "no overlay on /$d" >&2; exit 1; }
done
if getent passwd soya >/dev/null; then had_user=1; else had_user=0; fi
dpkg -i "$deb" > "$ovl/dpkg.log" 2>&1 || { cat "$ovl/dpkg.log" >&2; exit 1; }
getent passwd soya >/dev/null || { echo "postinst did not create the user soya" >&2; exit 1; }
[ "$(stat -c '%U:%G %a' /etc/soya)" = "root:soya 750" ] || { echo "/etc/soya is $(stat -c '%U:%G %a' /etc/soya)" >&2; exit 1; }
[ "$(soya --version)" = "$(/usr/bin/soya --version)" ]
if [ ! -e /etc/soya/psk.key ]; then
  (umask 027 && od -An -tx1 -N32 /dev/urandom > /etc/soya/psk.key)
  chgrp soya /etc/soya/psk.key
fi
setpriv --reuid=soya --regid=soya --init-groups /usr/bin/soya check-config --quiet /etc/soya/sapporo.toml /etc/soya/wakkanai.toml
dpkg -i "$deb" > "$ovl/dpkg.log" 2>&1 || { cat "$ovl/dpkg.log" >&2; exit 1; }
dpkg -r soya > "$ovl/dpkg.log" 2>&1 || { cat "$ovl/dpkg.log" >&2; exit 1; }
[ ! -e /usr/bin/soya ] && [ -e /etc/soya/sapporo.toml ] || { echo "dpkg -r: binary left or conffile removed" >&2; exit 1; }
dpkg --purge soya > "$ovl/dpkg.log" 2>&1 || { cat "$ovl/dpkg.log" >&2; exit 1; }
[ ! -e /etc/soya/sapporo.toml ] || { echo "dpkg --purge left the conffiles" >&2; exit 1; }
echo "installed as user $(getent passwd soya | cut -d: -f1) (existed before: $had_user)"
INSIDE
  if out=$(unshare -m bash "$tmp/ovl/inside.sh" "$tmp/ovl" "$(realpath "$deb")" 2>&1); then
    ok "dpkg -i / reinstall / -r / --purge in a throwaway overlay: $out"
  else
    echo "$out" >&2
    fail "real installation in an overlay"
  fi
else
  echo "test-deb: not root (or no unshare/findmnt): real dpkg installation not tried"
fi

if [ "$errors" != 0 ]; then
  echo "test-deb: $errors failure(s)" >&2
  exit 1
fi
echo "test-deb: all checks passed"
