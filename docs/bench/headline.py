#!/usr/bin/env python3
"""Prints Sōya's headline figures (the README's table), each with the
command that measures it.

The simulator rows run the real engines and transport in virtual time, so
they are the same on any machine. The demo rows (`--demo N`, root) run
`soya demo` N times in each setting (the whole machine, a 1-CPU cgroup, a
0.5-CPU cgroup, through docs/bench/demo_cgroup.sh) and print the spread.
`--allreduce` adds the two-site ring AllReduce (a few minutes), `--pair`
the pair bench's Gb/s per gateway core (cargo bench, a few minutes; a
machine-dependent figure, like the demo's).

    python3 docs/bench/headline.py
    sudo python3 docs/bench/headline.py --demo 5 --allreduce
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SIM = os.path.join(ROOT, "target", "release", "soya-sim")


def sim(args):
    out = subprocess.run([SIM] + args + ["--json"], capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("{")), None)
    if line is None:
        sys.exit(f"soya-sim {' '.join(args)} gave no JSON ({out.returncode}): {out.stderr[-500:]}")
    return json.loads(line)


TODAY = datetime.date.today().isoformat()


def row(figure, value, command):
    print(f"| {figure} | {value} | `{command}` | {TODAY} |", flush=True)


def ratio(x):
    return "unfinished" if x is None else f"{x:.3f}"


def div(a, b):
    return None if a is None or not b else a / b


def sim_rows():
    w = ["run", "--op", "write", "--size", "65536", "--tx-depth", "128"]
    for km in (300, 3000):
        d = sim(w + ["--distance-km", str(km)])
        row(f"one QP at {km} km, ÷ 0 km (simulator)",
            f"{ratio(d['accelerated_over_0km'])} through Sōya, "
            f"{ratio(div(d['direct_gbps'], d['direct_0km_gbps']))} direct",
            "soya-sim " + " ".join(w + ["--distance-km", str(km)]))
    big = w + ["--iters", "16384"]
    one = sim(big + ["--paths", "1"])
    two = sim(big + ["--paths", "2"])
    row("two 10 Gb/s WAN paths ÷ one (simulator, 300 km)",
        f"{ratio(div(two['accelerated_gbps'], one['accelerated_gbps']))}x",
        "soya-sim " + " ".join(big + ["--paths", "2|1"]))
    lossy = sim(big + ["--paths", "1", "--loss", "0.001"])
    row("0.1 % WAN loss ÷ lossless (simulator, 300 km)",
        f"{ratio(div(lossy['accelerated_gbps'], one['accelerated_gbps']))} through Sōya, "
        f"{ratio(div(lossy['direct_gbps'], one['direct_gbps']))} direct",
        "soya-sim " + " ".join(big + ["--loss", "0.001"]))
    hw = ["run", "--endpoint", "hw", "--distance-km", "300", "--path-gbps", "400",
          "--qps", "16", "--iters", "1200"]
    d = sim(hw)
    row("16 ConnectX-class QPs at 400 Gb/s, 300 km, ÷ 0 km (simulator)",
        ratio(d["accelerated_over_0km"]), "soya-sim " + " ".join(hw))
    worst = None
    # 64 QPs take about 15 minutes of one core each: run them by hand.
    for qps in (1, 2, 4, 8, 16):
        for ep in ("rxe", "hw"):
            a = ["run", "--distance-km", "300", "--op", "write", "--size", "65536",
                 "--qps", str(qps), "--paths", "1", "--path-gbps", "1", "--endpoint", ep]
            d = sim(a)
            g = d["accelerated_gbps"]
            frac = None if g is None or d["violations"] else g / 1.0
            if worst is None or frac is None or (worst[0] is not None and frac < worst[0]):
                worst = (frac, qps, ep)
    row("1-64 QPs offering more than one 1 Gb/s path carries, worst goodput ÷ link (simulator)",
        "did not finish" if worst[0] is None else f"{worst[0]:.3f} ({worst[1]} QPs, {worst[2]})",
        "soya-sim run --distance-km 300 --size 65536 --paths 1 --path-gbps 1 "
        "--qps 1|2|4|8|16 --endpoint rxe|hw")


def allreduce_row():
    a = ["allreduce", "--nccl-buffsize", "33554432"]
    out = subprocess.run([SIM] + a, capture_output=True, text=True)
    tail = " ".join(out.stdout.split()[-60:])
    row("ring AllReduce, 1 GB, 2 x 8 GPUs, 400 Gb/s, 300 km (simulator)", tail,
        "soya-sim " + " ".join(a))


def pair_row():
    """The pair bench (cargo bench, a few minutes): its summary lines give
    the spread of 5 rounds per mode, Gb/s per gateway core."""
    cmd = ["cargo", "bench", "-p", "soya", "--bench", "pair", "--", "--only-pair", "--rounds", "5"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    spread = {}
    for l in out.stdout.splitlines():
        m = re.match(r"(keyed|insecure), \d+ rounds .*?: A ([0-9.]+)-([0-9.]+) .*?B ([0-9.]+)-([0-9.]+)", l)
        if m:
            spread[m.group(1)] = m.groups()[1:]
    if "keyed" not in spread or "insecure" not in spread:
        sys.exit(f"the pair bench gave no summary ({out.returncode}): {out.stderr[-500:]}")
    k, i = spread["keyed"], spread["insecure"]
    row("per-shard code without the kernel, keyed AES-256-GCM, 16 packets per turn: "
        "Gb/s per gateway core, 5 rounds (pair bench)",
        f"{k[0]}-{k[1]} at A (DC to WAN), {k[2]}-{k[3]} at B (WAN to DC); "
        f"insecure {i[0]}-{i[1]} and {i[2]}-{i[3]}",
        " ".join(cmd))


def demo_rows(n):
    script = os.path.join(ROOT, "docs", "bench", "demo_cgroup.sh")
    for cpus, what in (("all", "whole machine (2 cores)"), ("1", "1-CPU cgroup"),
                       ("0.5", "0.5-CPU cgroup")):
        out = subprocess.run([script, cpus, str(n)], capture_output=True, text=True, cwd=ROOT)
        runs = [l for l in out.stdout.splitlines() if " run " in l]
        sys.stderr.write(out.stdout + out.stderr)
        r = [float(m.group(1)) for l in runs if (m := re.search(r"soya/0km ([0-9.]+)", l))]
        x = [float(m.group(1)) for l in runs if (m := re.search(r"x direct ([0-9.]+)", l))]
        c = [float(m.group(1)) for l in runs if (m := re.search(r"circuit ([0-9.]+) Gb/s", l))]
        machine = sum(1 for l in runs if "bound machine" in l)
        if not r:
            row(f"demo at 300 km, {what}", "no run reported a ratio", "soya demo")
            continue
        row(f"demo (real RoCEv2, xdp gateways) at 300 km, {what}: Sōya ÷ 0 km, {len(runs)} runs",
            f"{min(r):.3f}-{max(r):.3f} ({sum(v >= 0.95 for v in r)} of {len(runs)} ≥ 0.95"
            f"{f', {machine} machine-bound' if machine else ''}); "
            f"{min(x):.2f}-{max(x):.2f}x direct; circuits {min(c)}-{max(c)} Gb/s",
            f"sudo docs/bench/demo_cgroup.sh {cpus} {n}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=int, default=0, metavar="N", help="demo runs per setting (root)")
    p.add_argument("--allreduce", action="store_true", help="the AllReduce row (minutes)")
    p.add_argument("--no-sim", action="store_true", help="skip the simulator rows")
    p.add_argument("--pair", action="store_true", help="the pair bench's row (cargo bench, minutes)")
    a = p.parse_args()
    print("| figure | value | command | measured |\n| --- | --- | --- | --- |")
    if not a.no_sim:
        sim_rows()
    if a.allreduce:
        allreduce_row()
    if a.pair:
        pair_row()
    if a.demo:
        demo_rows(a.demo)


if __name__ == "__main__":
    main()
