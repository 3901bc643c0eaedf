#!/bin/bash
# The reduced interop case for CI: rping and one ib_write_bw (64 KiB) at
# 30 ms RTT, direct and through two Sōya gateways, between two kernel
# Soft-RoCE endpoints under qemu.  Exit 0 when everything completes with no
# error, the endpoints' rxe error/retry counters through Sōya are no higher
# than direct, and Sōya's goodput is >= 5x direct (docs/interop.md).
# Run from the repository root:  tools/lab/ci-reduced.sh
exec "$(dirname "$0")/interop.sh" --reduced "$@"
