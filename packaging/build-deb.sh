#!/usr/bin/env bash
# Builds the Debian package: target/debian/soya_<version>-1_<arch>.deb.
#   packaging/build-deb.sh            # build the workspace, then the .deb
#   packaging/build-deb.sh --no-build # package what target/release holds
# Installs cargo-deb first if it is missing (`cargo install cargo-deb
# --locked`, about 4 minutes on 2 cores). The binaries are stripped (the
# release profile keeps line tables for backtraces; `cargo deb --dbgsym`
# would put them in a separate package instead).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

if ! cargo deb --version >/dev/null 2>&1; then
  echo "== installing cargo-deb"
  cargo install cargo-deb --locked
fi

if [ "${1:-}" != "--no-build" ]; then
  # The soya crate holds the package metadata, but its assets include the
  # soya-tools binaries: build every binary of the workspace.
  echo "== cargo build --release --workspace --bins"
  cargo build --release --workspace --bins
fi

echo "== cargo deb -p soya"
rm -f target/debian/soya_*.deb
cargo deb -p soya --no-build --strip --output target/debian/
ls -l target/debian/soya_*.deb
