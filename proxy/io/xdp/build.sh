#!/bin/sh
# Rebuilds proxy/io/xdp/steer.bpf.o, the checked-in object of the XDP
# steering program, from proxy/io/xdp/steer.bpf.c, with the flags and the
# working directory of proxy/io/build.rs, so that both give the same bytes
# (Debian 12's clang 14; apt-get install clang llvm libbpf-dev). Run it
# after editing steer.bpf.c, and commit both files: a machine without
# clang builds the gateway with the object, and CI checks that it is the
# source's build (xdp::program's tests).
set -eu
cd "$(dirname "$0")/.."
triple=$(gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")
clang -target bpf -O2 -g -Wall -Werror "-fdebug-prefix-map=$(pwd)=." \
    "-I/usr/include/$triple" -c xdp/steer.bpf.c -o xdp/steer.bpf.o
echo "proxy/io/xdp/steer.bpf.o: $(sha256sum xdp/steer.bpf.o | cut -d' ' -f1)"
