#!/usr/bin/env python3
"""soya-wanem's cost: Gb carried per CPU-second, in `soya demo`'s configuration.

    sudo python3 docs/bench/wanem_cost.py \
        --base /work/ci-s14/target/release/soya-wanem \
        --new target/release/soya-wanem --rounds 3 --duration 8 [--json]

What runs (root; three network namespaces of this script's own, wanem-h-*;
no traffic leaves them):

    wanem-h-a  whA 169.254.77.1/30 ==soya-wanem tun==  whB 169.254.77.2/30  wanem-h-b
               (sender: UDP 1.9 Gb/s of      (in wanem-h-w, then its
                4,200-byte datagrams, and     devices moved out, as
                the receiver of the small     `soya demo` does)
                reverse flow)

The relay is started as `soya demo --rate 2gbit` starts each WAN path's:
`tun --a-dev .. --b-dev .. --delay-ms 1.47 --loss 0 --seed 1
--stats-interval 0 --rate 2000000000bit --slack-us 100 --spin-us 0`
(300 km at 4.9 us/km), devices at MTU 9000. The traffic is shaped like
the demo's WAN: one paced flow of 4,200-byte UDP datagrams A->B (a WAN
packet carrying a 4 KiB RoCE payload) below the circuit's rate, and a
flow of 80-byte datagrams B->A, one per four (the gateways' WAN ACKs).
Each sender paces by its clock in 100 us steps (Python; its CPU is not
counted).

Each round runs the baseline binary, then the new one (then, in the next
round, the order is swapped so neither always runs first), each for
--duration seconds after a 1 s warm-up. Over that window:

    carried          = bytes the relay wrote into its two devices
                       (rx_bytes of whA and whB: a TUN device "receives"
                       what its reader writes)
    relay CPU-s      = sum over the relay's threads of their on-CPU time
                       (/proc/PID/task/*/schedstat; user + system)
    Gb per CPU-s     = 8 x carried / 1e9 / relay CPU-s
                       (= Gb/s per core: what one core would carry if it
                       did nothing else)

and per binary the spread (min-max) over the rounds, and the ratio
new / base of the medians. Also printed: the relay's voluntary context
switches per second (its sleeps, /proc/PID/task/*/status), the packets
written as the devices count them (a GSO packet once), and the load
average before and after.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

NS = ["wanem-h-a", "wanem-h-b", "wanem-h-w"]
DEV = ["whA", "whB"]
IP = ["169.254.77.1", "169.254.77.2"]
PORT = 47_000
FWD_SIZE = 4200
REV_SIZE = 80


def sh(*cmd, check=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def netns_clean():
    for n in NS:
        sh("ip", "netns", "del", n, check=False)


def netns_setup():
    netns_clean()
    for n in NS:
        sh("ip", "netns", "add", n)
        sh("ip", "-n", n, "link", "set", "lo", "up")


# ----- the senders (run inside a namespace: `wanem_cost.py _send ...`) -----

UDP_SEGMENT = 103
UDP_GRO = 104


def send_main(dst, size, bps, seconds, gso):
    """Paces `size`-byte datagrams to dst:PORT at `bps` for `seconds`; with
    `gso`, each step's datagrams go as one UDP GSO send (as the gateways
    send their WAN datagrams)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    if gso:
        s.setsockopt(socket.SOL_UDP, UDP_SEGMENT, size)
    s.setblocking(False)
    payload = b"\x5a" * size
    most = max(1, min(64, 65_000 // size)) if gso else 1
    runs = [payload * k for k in range(most + 1)]
    per_s = bps / 8.0 / size
    t0 = time.monotonic()
    sent = 0
    while True:
        now = time.monotonic() - t0
        if now >= seconds:
            break
        due = int(now * per_s)
        while sent < due:
            k = min(most, due - sent)
            try:
                s.sendto(runs[k], (dst, PORT))
            except (BlockingIOError, OSError):
                pass
            sent += k
        time.sleep(0.0001)


def sink_main(bind):
    """Binds the port (so no ICMP port-unreachable goes back) and never
    reads: the socket's queue fills and the kernel drops the rest, which
    costs the receiver next to nothing."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    s.bind((bind, PORT))
    signal.sigwait([signal.SIGTERM, signal.SIGINT])


# ----- measurement -----------------------------------------------------------

def relay_cpu_ns(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass
    return total


def relay_switches(pid):
    vol = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol += int(line.split()[1])
        except FileNotFoundError:
            pass
    return vol


def dev_counter(i, what):
    out = sh("ip", "netns", "exec", NS[i], "cat",
             f"/sys/class/net/{DEV[i]}/statistics/{what}").stdout
    return int(out)


def carried():
    """(bytes, packets) the relay wrote into its devices."""
    b = dev_counter(0, "rx_bytes") + dev_counter(1, "rx_bytes")
    p = dev_counter(0, "rx_packets") + dev_counter(1, "rx_packets")
    return b, p


def offered():
    return dev_counter(0, "tx_bytes") + dev_counter(1, "tx_bytes")


def device_drops():
    """Packets the kernel dropped at the devices: the relay read too late."""
    return dev_counter(0, "tx_dropped") + dev_counter(1, "tx_dropped")


def one_run(binary, args):
    """Starts the relay as the demo does, carries the traffic, returns the
    figures of the measured window."""
    w = NS[2]
    relay = subprocess.Popen(
        ["ip", "netns", "exec", w, binary, "tun", "--a-dev", DEV[0], "--b-dev", DEV[1],
         "--delay-ms", str(args.delay_ms), "--loss", "0", "--seed", "1",
         "--stats-interval", "0", "--rate", f"{args.rate}bit",
         "--slack-us", str(args.slack_us), "--spin-us", "0", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        # ip netns exec execs the binary: same pid.
        t0 = time.monotonic()
        while sh("ip", "-n", w, "link", "show", DEV[1], check=False).returncode != 0:
            if relay.poll() is not None or time.monotonic() - t0 > 10:
                raise SystemExit(f"{binary} did not create its devices")
            time.sleep(0.02)
        for i in range(2):
            sh("ip", "-n", w, "link", "set", DEV[i], "netns", NS[i])
            sh("ip", "-n", NS[i], "addr", "add", f"{IP[i]}/30", "dev", DEV[i])
            sh("ip", "-n", NS[i], "link", "set", DEV[i], "mtu", "9000", "up")
        me = os.path.abspath(__file__)
        secs = args.duration + 1.5
        sinks = [subprocess.Popen(["ip", "netns", "exec", NS[i], sys.executable, me,
                                   "_sink", IP[i]]) for i in range(2)]
        time.sleep(0.2)
        fwd_bps = args.offered
        gso = "0" if args.no_sender_gso else "1"
        rev_bps = fwd_bps / 4 * REV_SIZE / FWD_SIZE
        senders = [
            subprocess.Popen(["ip", "netns", "exec", NS[0], sys.executable, me, "_send",
                              IP[1], str(FWD_SIZE), str(fwd_bps), str(secs), gso]),
            subprocess.Popen(["ip", "netns", "exec", NS[1], sys.executable, me, "_send",
                              IP[0], str(REV_SIZE), str(rev_bps), str(secs), "0"]),
        ]
        time.sleep(1.0)  # warm-up: the delay line fills
        c0, b0, o0, s0, w0 = relay_cpu_ns(relay.pid), carried(), offered(), \
            relay_switches(relay.pid), time.monotonic()
        k0 = device_drops()
        time.sleep(args.duration)
        c1, b1, o1, s1, w1 = relay_cpu_ns(relay.pid), carried(), offered(), \
            relay_switches(relay.pid), time.monotonic()
        k1 = device_drops()
        for p in senders:
            p.wait()
        for p in sinks:
            p.send_signal(signal.SIGTERM)
            p.wait()
    finally:
        # Children first (also when a step above failed), then the relay.
        for p in locals().get("senders", []) + locals().get("sinks", []):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait()
        relay.send_signal(signal.SIGTERM)
        try:
            out, _ = relay.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            relay.kill()
            out, _ = relay.communicate()
    # The relay's own drop counters over the whole run (not the window),
    # and the kernel's at the devices (a relay too slow to read).
    drops = {}
    try:
        for path in json.loads(out)["paths"]:
            for d in ("a_to_b", "b_to_a"):
                for k, v in path[d].items():
                    if k.startswith("drop_") and v:
                        drops[k] = drops.get(k, 0) + v
    except (ValueError, KeyError):
        drops["summary"] = "unreadable"
    cpu_s = (c1 - c0) / 1e9
    window = w1 - w0
    by = b1[0] - b0[0]
    pk = b1[1] - b0[1]
    return {
        "window_s": round(window, 3),
        "carried_gbps": round(8 * by / 1e9 / window, 3),
        "offered_gbps": round(8 * (o1 - o0) / 1e9 / window, 3),
        "relay_cores": round(cpu_s / window, 3),
        "gb_per_cpu_s": round(8 * by / 1e9 / cpu_s, 3),
        # Packets as the receiving stacks count them: a GSO packet the
        # relay wrote whole counts once.
        "device_packets_per_s": round(pk / window),
        "sleeps_per_s": round((s1 - s0) / window),
        "relay_drops": drops,
        "device_drops": k1 - k0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="baseline soya-wanem binary")
    ap.add_argument("--new", required=True, help="soya-wanem binary under test")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--rate", type=int, default=2_000_000_000, help="circuit, bit/s")
    ap.add_argument("--offered", type=float, default=1.9e9, help="A->B load, bit/s")
    ap.add_argument("--delay-ms", type=float, default=300 * 4.9 / 1000)
    ap.add_argument("--slack-us", type=int, default=100)
    ap.add_argument("--no-sender-gso", action="store_true",
                    help="the A->B sender writes one datagram per send")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, TUN devices)")
    load0 = os.getloadavg()
    netns_setup()
    runs = {"base": [], "new": []}
    try:
        for r in range(args.rounds):
            order = ["base", "new"] if r % 2 == 0 else ["new", "base"]
            for which in order:
                res = one_run(getattr(args, which), args)
                res["round"] = r + 1
                runs[which].append(res)
                if not args.json:
                    print(f"round {r + 1} {which:4}: {json.dumps(res)}", flush=True)
    finally:
        netns_clean()
    load1 = os.getloadavg()
    summary = {}
    for which, rs in runs.items():
        g = [x["gb_per_cpu_s"] for x in rs]
        summary[which] = {
            "binary": getattr(args, which),
            "gb_per_cpu_s": g,
            "median": statistics.median(g),
            "min": min(g),
            "max": max(g),
            "relay_cores": [x["relay_cores"] for x in rs],
            "carried_gbps": [x["carried_gbps"] for x in rs],
            "sleeps_per_s": [x["sleeps_per_s"] for x in rs],
        }
    ratio = summary["new"]["median"] / summary["base"]["median"]
    out = {"runs": runs, "summary": summary, "ratio_new_over_base": round(ratio, 3),
           "load_before": load0, "load_after": load1}
    if args.json:
        print(json.dumps(out))
    else:
        for which in ("base", "new"):
            s = summary[which]
            print(f"{which:4}: Gb per relay CPU-second {s['min']:.2f}-{s['max']:.2f} "
                  f"(median {s['median']:.2f}); relay cores {s['relay_cores']}; "
                  f"carried Gb/s {s['carried_gbps']}")
        print(f"new / base (medians): {ratio:.2f}x; load {load0[0]:.2f} -> {load1[0]:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_send":
        send_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]),
                  sys.argv[6] == "1")
    elif len(sys.argv) > 1 and sys.argv[1] == "_sink":
        sink_main(sys.argv[2])
    else:
        main()
