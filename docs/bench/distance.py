#!/usr/bin/env python3
"""Goodput against distance, direct vs. through Sōya (the simulator).

    cargo build --release --workspace
    python3 docs/bench/distance.py            # writes docs/bench/distance.tsv and .svg

Runs `soya-sim run --json` (one QP, 64 KiB RDMA WRITEs, tx depth 128,
MTU 4096, one 10 Gbit/s WAN path, 1 GiB, seed 1) at each distance. The simulator
runs in virtual time, so the figures do not depend on the machine. Only the
standard library: the SVG is written by hand.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SIM = os.path.join(ROOT, "target", "release", "soya-sim")
DISTANCES = [0, 25, 50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 3000]
# 1 GiB per run: the fixed start-up cost (one RTT of tunnelling until the
# flow is learned, the last one-way delay) stays small against the transfer.
ARGS = ["--op", "write", "--size", "65536", "--tx-depth", "128", "--iters", "16384"]


def measure(km):
    out = subprocess.run([SIM, "run", "--distance-km", str(km), *ARGS, "--json"],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    if r.get("violations"):
        sys.exit(f"{km} km: violations {r['violations']}")
    return r


def svg(rows):
    w, h, left, right, top, bottom = 640, 400, 60, 20, 30, 50
    xmax = max(r[0] for r in rows)
    ymax = max(max(r[1], r[2], r[3]) for r in rows) * 1.1
    def x(v):
        return left + (w - left - right) * v / xmax
    def y(v):
        return h - bottom - (h - top - bottom) * v / ymax
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{w/2}" y="18" text-anchor="middle">RDMA WRITE 64 KiB, 1 QP, tx depth 128, '
         f'10 Gbit/s WAN, 1 GiB (soya-sim, virtual time)</text>']
    for g in range(0, int(ymax) + 1, 2):
        s.append(f'<line x1="{left}" x2="{w-right}" y1="{y(g):.1f}" y2="{y(g):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{left-6}" y="{y(g)+4:.1f}" text-anchor="end">{g}</text>')
    for d in range(0, xmax + 1, 500 if xmax > 1000 else 100):
        s.append(f'<text x="{x(d):.1f}" y="{h-bottom+16}" text-anchor="middle">{d}</text>')
    s.append(f'<text x="{w/2}" y="{h-12}" text-anchor="middle">distance (km of fibre, 4.9 µs/km one way)</text>')
    s.append(f'<text x="16" y="{h/2}" text-anchor="middle" transform="rotate(-90 16 {h/2})">goodput (Gbit/s)</text>')
    s.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{h-bottom}" stroke="black"/>')
    s.append(f'<line x1="{left}" x2="{w-right}" y1="{h-bottom}" y2="{h-bottom}" stroke="black"/>')
    series = [(3, "through Sōya", "#c0392b"), (2, "direct", "#2c3e50"), (1, "direct at 0 km", "#95a5a6")]
    for i, (col, name, color) in enumerate(series):
        pts = " ".join(f"{x(r[0]):.1f},{y(r[col]):.1f}" for r in rows)
        dash = ' stroke-dasharray="4 4"' if col == 1 else ""
        s.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for r in rows:
            s.append(f'<circle cx="{x(r[0]):.1f}" cy="{y(r[col]):.1f}" r="3" fill="{color}"/>')
        s.append(f'<text x="{w-right-150}" y="{top+20+16*i}" fill="{color}">{name}</text>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


def main():
    rows = []
    for km in DISTANCES:
        r = measure(km)
        rows.append((km, r["direct_0km_gbps"], r["direct_gbps"], r["accelerated_gbps"], r["rtt_ms"]))
        print(f"{km:5} km  rtt {r['rtt_ms']:.2f} ms  direct {r['direct_gbps']:.3f}  "
              f"through Sōya {r['accelerated_gbps']:.3f} Gbit/s "
              f"({r['accelerated_over_0km']:.3f} of 0 km)", flush=True)
    with open(os.path.join(HERE, "distance.tsv"), "w") as f:
        f.write("distance_km\trtt_ms\tdirect_0km_gbps\tdirect_gbps\tsoya_gbps\n")
        for km, d0, d, a, rtt in rows:
            f.write(f"{km}\t{rtt:.3f}\t{d0:.3f}\t{d:.3f}\t{a:.3f}\n")
    with open(os.path.join(HERE, "distance.svg"), "w") as f:
        f.write(svg(rows))


if __name__ == "__main__":
    main()
