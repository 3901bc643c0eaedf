#!/usr/bin/env bash
# Run every fuzz target for a while: proxy/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP lets the stable toolchain build them.
# Each target reads its checked-in seeds (fuzz/seeds/<target>, minimized corpora
# of earlier campaigns) and grows its working corpus (fuzz/corpus/<target>,
# not checked in; seeded from the shared captures and example configs).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}; shift || true
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(roce_packet cm_mad site_config wan_frames wan_connection wan_handshake)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
python3 fuzz/seed.py "${SOYA_SHARED:-$(pwd)/../../shared}"
for t in "${targets[@]}"; do
  echo "== fuzzing $t for ${secs}s"
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t"
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$secs" -max_len=4200 -print_final_stats=1 2>&1 | tail -n 8
done
