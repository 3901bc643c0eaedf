#!/usr/bin/env python3
"""Endpoint cost: Gb/s per CPU-second of the two soya-perf endpoints, new
binary against a baseline, interleaved in one run (root: network namespaces).

    cargo build --release -p soya-tools --bin soya-perf
    sudo python3 docs/bench/perfcost.py --base /path/to/main/target/release
    sudo python3 docs/bench/perfcost.py --rate 2gbit --rounds 5 --json

What runs: the endpoints exactly as `soya demo` starts them in its netns
route (tools/src/demo.rs `perf`): a plain RoCEv2 socket on UDP 4791 of each
namespace's address, RDMA WRITE of --size (64 KiB) bytes, --tx-depth 128,
path MTU 4096, one QP, for --duration seconds:

    perfcost-h-a (10.251.0.1) --veth, MTU 9000-- perfcost-h-b (10.251.0.2)
    soya-perf client                              soya-perf server

No gateways: the figure is the endpoints' own cost. `--rate none` (the
default) joins the namespaces with a veth pair and lets the endpoints run
as fast as two shared cores allow. `--rate R` (e.g. 2gbit, the demo's
default) joins them through a `soya-wanem tun` relay in the root namespace
shaping to R the way the demo's relays do (`--slack-us 100 --spin-us 0`,
0 km; `--no-realtime`, so that it does not preempt others on a shared
machine): the responder is woken by packet trains at the link rate and the
requester by the ACKs, as behind the demo's gateways. The relay's own CPU
is not counted.

    perfcost-h-a (10.251.0.1) --TUN pch-a-- soya-wanem --TUN pch-b-- perfcost-h-b (10.251.0.2)

Each round runs the baseline and the new binary once each (the order
alternates between rounds); the CPU of each process is its rusage (user +
system) taken by wait4, so it includes the softirq work done in the
process's own context (the veth transmit), not what ksoftirqd does.
"Gb per CPU-second" = goodput bytes x 8 / (client CPU + server CPU).

Only loopback and the script's own namespaces are used; they are deleted at
the end (and at the start, if a previous run left them).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

NS_A, NS_B = "perfcost-h-a", "perfcost-h-b"
DEV_A, DEV_B = "pch-a", "pch-b"
IP_A, IP_B = "10.251.0.1", "10.251.0.2"
CTL_PORT = 18600


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def teardown():
    for ns in (NS_A, NS_B):
        sh("ip", "netns", "del", ns, check=False)


def setup(rate, wanem):
    """The namespaces and their link; returns the relay process, if any."""
    teardown()
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    relay = None
    if rate == "none":
        sh("ip", "link", "add", DEV_A, "type", "veth", "peer", "name", DEV_B)
    else:
        relay = subprocess.Popen(
            [wanem, "tun", "--a-dev", DEV_A, "--b-dev", DEV_B, "--distance-km", "0",
             "--rate", rate, "--slack-us", "100", "--spin-us", "0", "--no-realtime",
             "--stats-interval", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while sh("ip", "link", "show", DEV_B, check=False).returncode != 0:
            if relay.poll() is not None or time.time() - t0 > 10:
                raise SystemExit("soya-wanem did not create its TUN devices")
            time.sleep(0.05)
    for ns, dev, ip in ((NS_A, DEV_A, IP_A), (NS_B, DEV_B, IP_B)):
        sh("ip", "link", "set", dev, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up", "mtu", "9000")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    return relay


def reap(p):
    """wait4 the child: (exit status, CPU seconds, voluntary switches)."""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, ru.ru_utime + ru.ru_stime, ru.ru_nvcsw


def one_run(binary, a):
    perf = os.path.join(binary, "soya-perf")
    srv = subprocess.Popen(
        ["ip", "netns", "exec", NS_B, perf, "server", "--once", "--json", "--quiet",
         "--bind-ip", IP_B, "--port", str(CTL_PORT), "--accept-timeout", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.3)  # the server binds its control port (the client also retries)
    cli = subprocess.Popen(
        ["ip", "netns", "exec", NS_A, perf, "client", IP_B, "--json", "--quiet",
         "--bind-ip", IP_A, "--port", str(CTL_PORT), "--connect-timeout", "10",
         "--size", str(a.size), "--tx-depth", "128", "--mtu", "4096",
         "--duration", str(a.duration)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = cli.stdout.read()
    _, cpu_c, sw_c = reap(cli)
    srv.stdout.read()
    _, cpu_s, sw_s = reap(srv)
    line = [l for l in out.splitlines() if l.startswith("{")]
    if not line:
        raise SystemExit(f"{perf}: no report from the client")
    v = json.loads(line[-1])
    gbit = v["bytes"] * 8 / 1e9
    return {
        "ok": v["ok"],
        "data_errors": v["data_errors"],
        "retransmissions": v["retransmissions"],
        # A NAK-sequence (a gap at the responder) means a packet was lost on
        # the way (a starved relay); retransmissions without one, a timeout.
        "seq_naks": v["seq_naks"],
        "kernel_rx_drops": v.get("io", {}).get("kernel_rx_drops", 0),
        "goodput_gbps": v["goodput_gbps"],
        "cpu_client_s": cpu_c,
        "cpu_server_s": cpu_s,
        "switches_client": sw_c,
        "switches_server": sw_s,
        "gbit_per_cpu_s": gbit / (cpu_c + cpu_s),
        "client_gbit_per_cpu_s": gbit / cpu_c,
        "server_gbit_per_cpu_s": gbit / cpu_s,
    }


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="/work/ci-s14/target/release",
                    help="directory of the baseline soya-perf")
    ap.add_argument("--new", default=os.path.join(here, "..", "..", "target", "release"),
                    help="directory of the soya-perf under test")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=65536)
    ap.add_argument("--rate", default="none",
                    help="rate of a soya-wanem tun relay between the endpoints (e.g. 2gbit), "
                    "or none (a veth pair)")
    ap.add_argument("--wanem", default="/work/ci-s14/target/release/soya-wanem",
                    help="the soya-wanem for --rate (the same for both binaries)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    runs = {"base": [], "new": []}
    relay = None
    try:
        relay = setup(a.rate, a.wanem)
        for r in range(a.rounds):
            order = ("base", "new") if r % 2 == 0 else ("new", "base")
            for which in order:
                res = one_run(a.base if which == "base" else a.new, a)
                runs[which].append(res)
                if not a.json:
                    print(f"round {r + 1} {which:4}: {res['goodput_gbps']:6.3f} Gb/s, "
                          f"CPU client {res['cpu_client_s']:.2f} s server {res['cpu_server_s']:.2f} s, "
                          f"{res['gbit_per_cpu_s']:5.2f} Gb per CPU-s "
                          f"(client {res['client_gbit_per_cpu_s']:.2f}, server "
                          f"{res['server_gbit_per_cpu_s']:.2f}), ok={res['ok']} "
                          f"errors={res['data_errors']} retx={res['retransmissions']} "
                          f"seq-NAKs={res['seq_naks']}",
                          flush=True)
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait()
        teardown()
    ratios = [n["gbit_per_cpu_s"] / b["gbit_per_cpu_s"] for b, n in zip(runs["base"], runs["new"])]
    summary = {
        "config": {"size": a.size, "tx_depth": 128, "mtu": 4096, "duration_s": a.duration,
                   "rate": a.rate, "rounds": a.rounds},
        "load_average": os.getloadavg(),
        "base": {k: spread([x[k] for x in runs["base"]])
                 for k in ("goodput_gbps", "gbit_per_cpu_s", "client_gbit_per_cpu_s",
                           "server_gbit_per_cpu_s")},
        "new": {k: spread([x[k] for x in runs["new"]])
                for k in ("goodput_gbps", "gbit_per_cpu_s", "client_gbit_per_cpu_s",
                          "server_gbit_per_cpu_s")},
        "ratio_new_over_base": spread(ratios),
        "all_ok": all(x["ok"] and x["data_errors"] == 0 for v in runs.values() for x in v),
        "runs": runs,
    }
    if a.json:
        print(json.dumps(summary))
    else:
        for w in ("base", "new"):
            s = summary[w]
            print(f"{w:4}: {s['gbit_per_cpu_s']['median']:.2f} Gb per CPU-s "
                  f"[{s['gbit_per_cpu_s']['min']:.2f}-{s['gbit_per_cpu_s']['max']:.2f}], "
                  f"goodput {s['goodput_gbps']['median']:.3f} Gb/s")
        r = summary["ratio_new_over_base"]
        print(f"ratio new/base (per round): median {r['median']:.2f} "
              f"[{r['min']:.2f}-{r['max']:.2f}]; load average {summary['load_average']}")
        print("all runs ok, 0 data errors" if summary["all_ok"] else "SOME RUN FAILED")
    sys.exit(0 if summary["all_ok"] else 1)


if __name__ == "__main__":
    main()
