#!/usr/bin/env python3
"""Seed the fuzz corpora from the shared captures and the example configs.

Usage: seed.py SHARED_DIR   (writes corpus/<target>/ beside this file)
"""
import os, struct, sys, glob, hashlib

here = os.path.dirname(os.path.abspath(__file__))
shared = sys.argv[1]

# The one pcap reader: the lab's DREQ script (its main runs only as a script).
sys.path.insert(0, os.path.join(here, '..', '..', 'tools', 'lab', 'guest'))
from dreq import frames  # noqa: E402

def put(target, blob):
    d = os.path.join(here, 'corpus', target)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, hashlib.sha1(blob).hexdigest()), 'wb').write(blob)

n = 0
for pcap in glob.glob(os.path.join(shared, 'lab', '*.pcap')) + [os.path.join(shared, 'protocol', 'vectors.pcap')]:
    for i, f in enumerate(frames(pcap)):
        if i % 10 and 'rping' not in pcap:   # a sample of bulk data, all of rping
            continue
        put('roce_packet', f[14:])            # as IP packet
        put('roce_packet', f)                 # as Ethernet frame
        if len(f) > 14 + 20 + 8 + 12 + 8 + 256 and f[14 + 28] == 0x64:
            put('cm_mad', f[14 + 20 + 8 + 12 + 8:][:256])
        n += 1
for toml in glob.glob(os.path.join(here, '..', '..', 'config', 'examples', '*.toml')):
    put('site_config', open(toml, 'rb').read())
print(f'seeded {n} frames')

# WAN FIN frames (0x07: flow u64, seq varint; protocol v3): alone, several in
# a row, and inside a lab-mode packet for `wan_connection` (mode 0, op 2 =
# fuzzed frames with a valid tag; its template flows are wire ids 1-4).
def varint(v):
    if v < 0x40:
        return bytes([v])
    if v < 0x4000:
        return struct.pack('>H', 0x4000 | v)
    return struct.pack('>I', 0x80000000 | v)

def fin(flow, seq):
    return b'\x07' + struct.pack('>Q', flow) + varint(seq)

for flow, seq in [(1, 0), (1, 1), (4, 2), (2**63, 0x3fff)]:
    put('wan_frames', fin(flow, seq))
    frames = fin(flow, seq) + fin(flow + 1, seq)
    put('wan_frames', frames)
    put('wan_connection', b'\x00\x02' + struct.pack('>H', len(frames)) + frames + b'\x03\x08')
