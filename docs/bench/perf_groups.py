#!/usr/bin/env python3
"""Where a gateway's turns spend their time, from a perf profile of the pair bench.

    perf record -F 3999 --call-graph dwarf,16384 -o pair.data \\
        target/release/deps/pair-HASH --keyed --only-pair --burst 1 --rounds 1 --packets 300000
    perf script -i pair.data -F comm,tid,ip,sym > pair.txt
    python3 docs/bench/perf_groups.py pair.txt [--by-gateway]

Counts the samples with `Turn::run_all` on their stack (a gateway's turn;
the hosts' work and the bench's own loop are left out) and groups each by
its innermost frame that names a group (inlined frames included: perf
script shows them), so a SipHash round inlined into `Halves::settle` counts
as hash tables, not as `settle`. A sample whose innermost frames name no
group is charged to its innermost `soya::` function ("rest"). For the hash
tables it also prints which `soya::` function did the lookup.

Then the same samples by **stage** of a packet's way through the gateway
(issue 39): each sample goes to the innermost frame that names a stage.
Copies and hash lookups have no stage of their own: they count where they
are made (a memmove inside `SendFlows::write_frag` is WAN encoding, one
inside `MemDc::recv_batch` is the kernel's copy the memory port models).
With `--by-gateway`, the stages of each gateway apart (the pair bench runs
A's and B's turns under names of their own).
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

# A packet's way through a gateway: DC side in -> pseudo-ACK -> deep buffer
# -> WAN encode + seal | WAN open + decode -> re-injection. Innermost match
# wins, so the order only matters for a frame two patterns name.
STAGES = [
    ("ICRC (verify in, seal of own packets)", re.compile(r"crc32fast|icrc::")),
    ("WAN seal (AEAD)", re.compile(
        r"aes_gcm_enc|aes_gcm::seal|PacketKey::seal|SessionKeys::seal|seal_in_place|chacha20_poly1305_seal")),
    ("WAN open (AEAD)", re.compile(
        r"aes_gcm_dec|aes_gcm::open|PacketKey::open|SessionKeys::open|RxKeys::open|open_in_place|open_within"
        r"|chacha20_poly1305_open")),
    ("WAN encode (flows, frames, paths)", re.compile(
        r"wan::transmit|wan::flow::send|SendFlows|DataFrame::encode|wire::Writer|WanConnection::send"
        r"|choose_data_path|site::flows|wan::path|wan::cc")),
    ("WAN decode (frames, flows, ACKs)", re.compile(
        r"wan::receive|RecvFlows|wan::msg|frames::|Frames as|wan::recovery|wan::replay|wan::ack")),
    ("re-injection (egress)", re.compile(r"qp::egress|Reinjector|Site::transmit_dc|Turn::send_dc")),
    ("pseudo-ACK (ingress)", re.compile(r"qp::ingress|PseudoAcker|RoceRepr::emit|roce::builders")),
    ("deep buffer", re.compile(r"DeepBuffer|buffer::slab|buffer::room|buffer::pool::PacketPool::(put|get|take|balance)")),
    ("DC parse and ACL", re.compile(
        r"RocePacket::parse|IpHeader|ExtHeaders|Bth::parse|site::acl|Site::screen_dc|Site::handle_dc|Turn::recv_dc::")),
    ("QP engine (tables, twin messages, timers)", re.compile(
        r"qp::engine|qp::timers|qp::twin|QpEngine|Halves<|Site::pump|Site::handle_timeout|Site::poll|Turn::timers")),
    ("ports (the kernel's copies, modelled)", re.compile(r"gateway::memory|MemDc|MemWan|Turn::flush_wan")),
]


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


def gateway_of(frames):
    """A or B, from the pair bench's per-gateway turn functions."""
    for fr in frames:
        if "turn_of_gateway_a" in fr:
            return "A"
        if "turn_of_gateway_b" in fr:
            return "B"
    return None


def main():
    by_gateway = "--by-gateway" in sys.argv[2:]
    gw_stages = collections.defaultdict(collections.Counter)
    gw_total = collections.Counter()
    total = 0
    groups = collections.Counter()
    rest = collections.Counter()
    hashing = collections.Counter()
    stages = collections.Counter()
    with open(sys.argv[1], errors="replace") as f:
        for frames in samples(f):
            if not any("Turn::run_all" in fr for fr in frames):
                continue
            total += 1
            stage = next((name for fr in frames for name, rx in STAGES if rx.search(fr)), "other (the turn itself)")
            stages[stage] += 1
            gw = gateway_of(frames)
            if gw:
                gw_total[gw] += 1
                gw_stages[gw][stage] += 1
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
    print("by stage (copies and lookups where they are made):")
    for name, n in stages.most_common():
        print(f"  {name:44s} {100 * n / total:5.1f} %")
    if by_gateway:
        for gw in sorted(gw_total):
            n_gw = gw_total[gw]
            print(f"gateway {gw} by stage ({100 * n_gw / total:.1f} % of the samples; share of its own):")
            for name, n in gw_stages[gw].most_common():
                print(f"  {name:44s} {100 * n / n_gw:5.1f} %")


if __name__ == "__main__":
    main()
