#!/usr/bin/env bash
# Checks the Debian package built by packaging/build-deb.sh:
#   1. contents (dpkg-deb -c): binaries, configs, unit, sysctl, examples,
#      docs, and no WAN key;
#   2. control (dpkg-deb -I/-e): fields, conffiles, maintainer scripts;
#   3. the systemd unit (systemd-analyze verify, when systemd-analyze exists);
#   4. the Prometheus and Grafana examples use only metric names the gateway
#      exports (packaging/metrics-spec.json, from proxy/src/gateway/metrics/table.rs);
#   4b. the routing examples (packaging/routing): scripts parse, BIRD 2
#      parses every bird-*.conf (`bird -p`; skipped without bird), FRR
#      checks every frr-*.conf and the commands frr-slices sends
#      (`vtysh --dryrun`, `bgpd -C`; skipped without frr), and
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
# FRR (Debian's frr package) checks a config offline two ways, and each
# catches what the other lets through, so both are run:
#  - `vtysh --dryrun --inputfile F` parses every line against the grammar of
#    all FRR daemons and exits 2 on an unknown command or a malformed
#    argument (a misspelt keyword, a /33 prefix);
#  - `bgpd -C -f F` makes bgpd read and apply the file and exit; it catches
#    what the grammar allows but bgpd refuses (`set local-preference banana`,
#    a second `router bgp` with another ASN). It exits 0 even then, only
#    logging the failed lines, so any output at all is the failure.
# frr-slices is checked as it is used: its vtysh commands (taken from a
# stand-in vtysh that prints them) for `up` and then `down`, appended to the
# gateway config they are for, must pass both checks too (right ASN, a
# `network` statement bgpd accepts in that address family).
# Last, a copy with one keyword misspelt must fail both checks: if a later
# FRR stopped checking offline, this test says so instead of passing.
# bgpd started as root reads its config only after dropping to the user frr,
# so what it checks is copied where that user can read it ($tmp is 0700).
# bgpd_check FILE: `bgpd -C -f FILE`, what it said of the config in
# $tmp/out. Each bgpd makes a crash-log directory /var/tmp/frr/bgpd.PID and
# leaves it; a later bgpd that gets the same PID says "failed to mkdir" and
# "crashlog … unavailable", which is about the directory, not the config:
# those two lines are dropped, and the directories this check made removed.
bgpd_check() {
  local before rc=0
  before=$(ls /var/tmp/frr 2>/dev/null)
  "$bgpd" -C -f "$1" > "$tmp/out.raw" 2>&1 || rc=$?
  for d in $(ls /var/tmp/frr 2>/dev/null); do
    case $d in bgpd.*) printf '%s\n' "$before" | grep -qx "$d" || rm -rf "/var/tmp/frr/$d" ;; esac
  done
  grep -v -e 'failed to mkdir "/var/tmp/frr/bgpd\.' -e 'crashlog and per-thread log buffering unavailable' \
    "$tmp/out.raw" > "$tmp/out" || true
  return $rc
}
frr_check() { # frr_check FILE NAME: fails unless both FRR checks accept FILE
  local c="$tmp/frr/check.conf" name=$2
  install -m 644 "$1" "$c"
  vtysh --dryrun --inputfile "$c" > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; fail "vtysh --dryrun: $name"; return; }
  if ! bgpd_check "$c" || grep -q . "$tmp/out"; then
    cat "$tmp/out" >&2
    fail "bgpd -C: $name"
  fi
}
bgpd=/usr/lib/frr/bgpd
if [ "$(id -u)" != 0 ]; then
  echo "test-deb: not root: the FRR examples were not checked (bgpd -C must switch to the user frr)"
elif command -v vtysh >/dev/null && [ -x "$bgpd" ]; then
  chmod 711 "$tmp"
  install -d -m 755 "$tmp/frr"
  n_frr=0
  for c in "$routing"/frr-*.conf; do
    frr_check "$c" "$(basename "$c")"
    n_frr=$((n_frr + 1))
  done
  mkdir -p "$tmp/fakebin"
  cat > "$tmp/fakebin/vtysh" <<'FAKE'
#!/bin/sh
# Prints the -c commands it is given, one a line.
while [ $# -gt 0 ]; do
  if [ "$1" = -c ]; then printf '%s\n' "$2"; shift; fi
  shift
done
FAKE
  chmod +x "$tmp/fakebin/vtysh"
  # The gateway configs and the frr-slices arguments their comments give.
  while read -r conf asn prefixes; do
    {
      cat "$routing/$conf"
      # shellcheck disable=SC2086 # the prefixes are separate arguments
      for what in up down; do
        PATH="$tmp/fakebin:$PATH" "$routing/frr-slices" "$what" "$asn" $prefixes | grep -vx 'configure terminal'
      done
    } > "$tmp/slices.conf"
    grep -q "^network " "$tmp/slices.conf" || fail "frr-slices printed no network statement"
    frr_check "$tmp/slices.conf" "frr-slices up/down $asn on $conf"
  done <<'SLICES'
frr-sapporo-1.conf 65001 10.2.0.0/17 10.2.128.0/17
frr-wakkanai-1.conf 65002 10.1.0.0/16
SLICES
  sed 's/ remote-as / remote-az /' "$routing/frr-sapporo-1.conf" > "$tmp/frr/broken.conf"
  chmod 644 "$tmp/frr/broken.conf"
  if vtysh --dryrun --inputfile "$tmp/frr/broken.conf" > "$tmp/out" 2>&1; then
    fail "vtysh --dryrun accepted a misspelt keyword (remote-az)"
  fi
  bgpd_check "$tmp/frr/broken.conf" || true
  grep -q . "$tmp/out" || fail "bgpd -C said nothing of a misspelt keyword (remote-az)"
  [ "$errors" = 0 ] && ok "FRR (vtysh --dryrun, bgpd -C) accepts $n_frr example configs and frr-slices' commands, refuses a broken copy"
else
  echo "test-deb: FRR (vtysh, $bgpd) not found: the FRR examples were not checked"
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
