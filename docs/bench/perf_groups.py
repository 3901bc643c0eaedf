#!/usr/bin/env python3
"""Where a gateway's turns spend their time, from a perf profile of the pair bench.

    perf record -F 3999 --call-graph dwarf,16384 -o pair.data \\
        target/release/deps/pair-HASH --keyed --only-pair --burst 1 --rounds 1 --packets 300000
    perf script -i pair.data -F comm,tid,ip,sym > pair.txt
    python3 docs/bench/perf_groups.py pair.txt

Counts the samples with `Turn::run_all` on their stack (a gateway's turn;
the hosts' work and the bench's own loop are left out) and groups each by
its innermost frame that names a group (inlined frames included: perf
script shows them), so a SipHash round inlined into `Halves::settle` counts
as hash tables, not as `settle`. A sample whose innermost frames name no
group is charged to its innermost `soya::` function ("rest"). For the hash
tables it also prints which `soya::` function did the lookup.
"""
import collections
import re
import sys

GROUPS = [
    ("AES-GCM", re.compile(r"aes_gcm|gcm_ghash|ring::aead|ring_core|chacha|poly1305")),
    ("ICRC", re.compile(r"crc32fast|icrc")),
    ("hash tables", re.compile(
        r"siphasher|hash_one|make_hash|hashbrown|core::hash|Hash>::hash|hash::map"
        r"|foldhash|IdHasher|SipHasher|FoldHasher")),
    ("copies (memmove/memcpy)", re.compile(r"memmove|memcpy|copy_from_slice|clone_from_slice")),
    ("memset", re.compile(r"memset")),
    ("parsing", re.compile(
        r"RocePacket::parse|IpHeader::split|ExtHeaders::parse|Bth::parse|acl::|flow_of"
        r"|Prefix|::parse\b|::parse<")),
    ("B-trees", re.compile(r"btree|BTree")),
]
HASHING = re.compile(r"Hash|hash_one|HalfKey as")


def samples(lines):
    """Each sample's frames, innermost first (perf script's layout)."""
    frames = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if frames:
                yield frames
            frames = []
        elif line[0] in "\t ":
            parts = line.strip().split(None, 1)
            frames.append(parts[1] if len(parts) > 1 else "?")
        else:
            frames = []
    if frames:
        yield frames


def main():
    total = 0
    groups = collections.Counter()
    rest = collections.Counter()
    hashing = collections.Counter()
    with open(sys.argv[1], errors="replace") as f:
        for frames in samples(f):
            if not any("Turn::run_all" in fr for fr in frames):
                continue
            total += 1
            group = None
            for i, fr in enumerate(frames):
                group = next((name for name, rx in GROUPS if rx.search(fr)), None)
                if group == "hash tables":
                    caller = next((g for g in frames[i:] if "soya::" in g and not HASHING.search(g)), "?")
                    hashing[caller.replace(" (inlined)", "")[:100]] += 1
                if group:
                    break
                if "soya::" in fr:
                    group = "rest"
                    rest[fr.replace(" (inlined)", "")[:100]] += 1
                    break
            groups[group or "rest"] += 1
    if not total:
        sys.exit("no sample under Turn::run_all")
    print(f"samples under Turn::run_all: {total}")
    for name, n in groups.most_common():
        print(f"  {name:26s} {100 * n / total:5.1f} %")
    print("hash tables, by the function looking up:")
    for name, n in hashing.most_common(10):
        print(f"  {100 * n / total:5.1f} %  {name}")
    print("rest, by innermost soya:: function:")
    for name, n in rest.most_common(10):
        print(f"  {100 * n / total:5.1f} %  {name}")


if __name__ == "__main__":
    main()
