#!/usr/bin/env python3
"""Which UMEM chunk sizes this kernel accepts (XDP_UMEM_REG), with and
without HugeTLB memory, aligned and unaligned. Run as root. HugeTLB cases
need huge pages reserved first (e.g. `echo 16 > /proc/sys/vm/nr_hugepages`,
and back to 0 after); otherwise their mmap fails. See docs/benchmarks.md
section "Copies per packet" for what Linux 6.18 answered."""
import ctypes, mmap, socket, struct, sys, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
MAP_HUGETLB = 0x40000
def try_reg(chunk, huge, unaligned=False, size=8<<20):
    flags = 0x02 | 0x20 | (MAP_HUGETLB if huge else 0)  # PRIVATE|ANON
    p = libc.mmap(None, size, 3, flags, -1, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        return "mmap failed: " + os.strerror(ctypes.get_errno())
    fd = libc.socket(44, 3, 0)
    reg = struct.pack("QQIIII", p, size, chunk, 0, 1 if unaligned else 0, 0)
    buf = ctypes.create_string_buffer(reg)
    r = libc.setsockopt(fd, 283, 4, buf, len(reg))
    e = ctypes.get_errno()
    os.close(fd)
    libc.munmap(ctypes.c_void_p(p), ctypes.c_size_t(size))
    return "ok" if r == 0 else "error: " + os.strerror(e)
for chunk in (4096, 8192, 16384):
    for huge in (False, True):
        for ua in (False, True):
            print(f"chunk {chunk} hugetlb {huge} unaligned {ua}: {try_reg(chunk, huge, ua)}")
