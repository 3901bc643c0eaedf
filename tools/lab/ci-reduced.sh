#!/bin/bash
# The reduced interop case for CI: rping and one ib_write_bw (64 KiB) at
# 30 ms RTT through two Sōya gateways between two kernel Soft-RoCE
# endpoints, under qemu.  Exit 0 when both complete with no error and the
# endpoints' rxe counters show no sequence error or retry.
# Run from the repository root:  tools/lab/ci-reduced.sh
exec "$(dirname "$0")/interop.sh" --reduced "$@"
