#!/bin/bash
# The reduced interop case, required in CI (.ci/run under CI=true): Debian's
# 6.1 kernel under qemu, two Soft-RoCE endpoints, two Sōya gateways (tun)
# and a netem WAN at 30 ms RTT with 0.1 % loss; direct and through Sōya:
# rping -V of 8 KiB (8 packets at MTU 1024), ib_write_bw, ib_read_bw and
# ib_send_bw (64 KiB, 4 s each), and soya-perf --verbs SEND (64 KiB, 4 s,
# every message's data pattern checked at the receiver).  Exit 0 when every tool completes, rping
# verifies, and the endpoints' rxe counters through Sōya stay within the
# bound report.py's retry_bound justifies from the direct path; goodput is
# printed, not judged (docs/interop.md).  The VM is killed after 540 s, the
# guest job 30 s before: a hang is a clear failure, not a CI timeout.
# Run from the repository root:  tools/lab/ci-reduced.sh [interop.sh options]
exec "$(dirname "$0")/interop.sh" --reduced "$@"
