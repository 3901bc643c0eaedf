#!/usr/bin/env python3
"""Forwarding cost: goodput per gateway core through two Sōya gateways on loopback.

    cargo build --release --workspace
    python3 docs/bench/forward.py                     # 1 and 2 shards, 10 s each
    python3 docs/bench/forward.py --shards 1 --duration 20 --json
    sudo python3 docs/bench/forward.py --backend xdp --shards 1 --repeat 3 --json

What runs (all on 127.0.0.1, `udp` DC backend, no tun, no root needed):

    soya-perf client(s) --> gateway A ==WAN (loopback, 0 km)==> gateway B --> soya-perf server(s)
      lab hosts 10.1.0.k      (soya gateway, [gateway] shards = N)         lab hosts 10.2.0.k

Each host pair is one soya-perf client/server session (software RoCE RC, IP-in-UDP
to its gateway's `dc.listen`, as `soya demo` does) running RDMA WRITEs of
--size bytes with path MTU 4096, i.e. full 4 KiB RoCE payload packets, for
--duration seconds. The WAN is keyed (AEAD) unless --insecure; the WAN path
rate is set far above what loopback carries (--rate) so that the limiter
does not bound the figure. With --distance-km a `soya-wanem udp` relay adds
the fibre delay between the gateways (one more process on the same cores).

--backend tun|xdp (root) runs the same between network namespaces instead:

    hostA --veth-- gwA ==veth (WAN, 0 km)== gwB --veth-- hostB
    10.1.0.1       soya gateway            soya gateway    10.2.0.1

with the `tun` backend (routes into soya0) or the `xdp` backend (AF_XDP on
the gateway's veth toward its host; single-queue veths, TX checksum offload
off at the hosts, see docs/architecture.md). Real RoCEv2 on UDP 4791 of the
hosts' addresses (10.1.0.k on hostA, 10.2.0.k on hostB, one address per
host pair; --pairs defaults to 1 here). --strace attaches
`strace -c -f` to gateway A for half the run and reports its system calls
per DC packet (received + sent toward the hosts) over that time (strace
slows it: use a separate run for that figure).

A gateway shards by host pair (`shard_of_pair`, computed here the same way),
so the script picks host pairs 10.1.0.k <-> 10.2.0.k that spread evenly over
the shards; --pairs (default 2 on loopback, 1 between namespaces) is the
same for every shard count, so the
endpoints' work is the same and only the gateways differ.

How "per core" is computed: over the measured window (from just before the
clients start until the last one has exited and every server has its
bytes), each process's CPU seconds are read from /proc/PID/stat (utime +
stime, which include all of its threads) for the gateways, and from the
exit rusage for the soya-perf endpoints. Then

    goodput                = 8 x bytes placed at all servers / window seconds
    gateway cores in use   = gateway CPU seconds / window seconds
    Gb/s per gateway core  = goodput / gateway cores in use
                           = 8 x bytes / gateway CPU seconds

for gateway A (ingress: DC read, pseudo-ACK, buffer, WAN send), gateway B
(egress: WAN receive, injection toward the responder) and their mean. It is
a cost (what one core would move if it did nothing but this gateway's
work), not a throughput: the goodput itself is bounded by whatever runs out
first on the machine, and on a small machine that is the cores shared by
the two gateways, the soya-perf endpoints and anything else running. So the
script also prints, per run, the CPU of every process (gateway threads by
name), the machine's busy fraction over the window (/proc/stat) and how much
of it went to other processes, plus the load average before and after. The
kernel's loopback work (UDP send, and the receive side when the softirq runs
in the sender's context) is charged to the process that triggered it, so a
gateway's CPU includes its share of the kernel's packet work. Each run also
measures the gateways' idle CPU for 1 s before the clients start (printed
for reference, not subtracted).
"""
import argparse
import atexit
import ctypes
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LO = "127.0.0.1"
US_PER_KM = 4.9
CLK_TCK = os.sysconf("SC_CLK_TCK")

# ----- children -----------------------------------------------------------

_children = []  # (name, Popen) still to stop
_libc = None


def _die_with_parent():
    # PR_SET_PDEATHSIG(SIGKILL): a child never outlives this script, even
    # when the script itself is killed with SIGKILL.
    if _libc is not None:
        _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


def spawn(name, cmd, log_dir, env=None, stdout=None):
    out = stdout or open(os.path.join(log_dir, f"{name}.out"), "wb")
    err = open(os.path.join(log_dir, f"{name}.err"), "wb")
    try:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             env=env, preexec_fn=_die_with_parent)
    finally:
        err.close()
        if stdout is None:
            out.close()
    _children.append((name, p))
    return p


def stop(p, grace=5.0):
    """SIGTERM (a gateway drains and exits), then SIGKILL after `grace` s."""
    if p.poll() is None:
        try:
            p.send_signal(signal.SIGTERM)
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        except ProcessLookupError:
            pass
    for i, (_, q) in enumerate(_children):
        if q is p:
            del _children[i]
            break


def stop_all(grace=3.0):
    """SIGTERM to every child at once, SIGKILL to those left after `grace` s."""
    kids = [p for _, p in _children]
    _children.clear()
    for p in kids:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in kids:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def reap(p):
    """Waits for child `p`; returns its CPU seconds (user + system)."""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    for i, (_, q) in enumerate(_children):
        if q is p:
            del _children[i]
            break
    return ru.ru_utime + ru.ru_stime


# ----- measurements -------------------------------------------------------

def proc_cpu(pid):
    """CPU seconds (utime + stime, every thread) of a live process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_cpu_split(pid):
    """(user, system) CPU seconds (every thread) of a live process: the
    system part is the kernel's work done on the gateway's behalf (socket,
    tun, AF_XDP copy mode), which no user-space change can remove."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def thread_cpu(pid):
    """{thread name: CPU seconds} of a live process (same names summed)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        fields = s.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def machine_cpu():
    """(busy, total) jiffies of all cores from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    total = sum(v[:8])
    return total - idle, total


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


# ----- shards (proxy/src/gateway/shard.rs::shard_of_pair) -----------------

_M64 = (1 << 64) - 1


def _canonical(ip):
    a = ipaddress.ip_address(ip)
    return bytes(10) + b"\xff\xff" + a.packed if a.version == 4 else a.packed


def shard_of_pair(a, b, shards):
    if shards <= 1:
        return 0
    a, b = _canonical(a), _canonical(b)
    lo, hi = (a, b) if a <= b else (b, a)
    h = 0xCBF29CE484222325
    for byte in lo + hi:
        h ^= byte
        h = (h * 0x100000001B3) & _M64
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _M64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _M64
    h ^= h >> 31
    return h % shards


assert shard_of_pair("10.1.0.5", "10.2.0.7", 2) == 1  # shard.rs's fixed values
assert shard_of_pair("10.1.0.5", "10.2.0.8", 2) == 0
assert shard_of_pair("10.1.0.5", "10.2.0.7", 7) == 2


def host_pairs(n, shards):
    """n pairs (10.1.0.k, 10.2.0.k), round-robin over the shards."""
    per = [0] * shards
    want = [n // shards + (1 if s < n % shards else 0) for s in range(shards)]
    pairs = []
    for k in range(10, 250):
        x, y = f"10.1.0.{k}", f"10.2.0.{k}"
        s = shard_of_pair(x, y, shards)
        if per[s] < want[s]:
            per[s] += 1
            pairs.append((x, y, s))
        if len(pairs) == n:
            return pairs
    sys.exit(f"forward.py: cannot place {n} host pairs on {shards} shards")


# ----- ports and configs --------------------------------------------------

_taken = set()


def free_ports(kind, count=1):
    """A base port such that base .. base+count-1 are free (UDP or TCP) on LO."""
    st = socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM
    for _ in range(200):
        with socket.socket(socket.AF_INET, st) as s:
            s.bind((LO, 0))
            base = s.getsockname()[1]
        if base + count > 65535 or any(base + i in _taken for i in range(count)):
            continue
        ok = True
        for i in range(1, count):
            try:
                with socket.socket(socket.AF_INET, st) as s:
                    s.bind((LO, base + i))
            except OSError:
                ok = False
                break
        if ok:
            _taken.update(range(base, base + count))
            return base
    sys.exit(f"forward.py: no {count} free {kind} ports in a row on {LO}")


def gateway_config(site, dc, local, remote, wan, twin_wan, shards, rate, rtt_us, key, sock,
                   backend="udp", wan_ip=LO, twin_ip=LO):
    security = f'key_file = "{key}"' if key else "insecure = true"
    dc_lines = {"udp": f'backend = "udp"\nlisten = "{LO}:{dc}"',
                "tun": 'backend = "tun"\ninterface = "soya0"',
                "xdp": 'backend = "xdp"\ninterface = "host"'}[backend]
    return f"""site = "{site}"
[dc]
{dc_lines}
local_prefixes = ["{local}"]
remote_prefixes = ["{remote}"]
[wan]
bind = ["{wan_ip}:{wan}"]
{security}
[[wan.paths]]
name = "p0"
remote = "{twin_ip}:{twin_wan}"
bind = 0
rate = "{rate}"
rtt = "{max(1, round(rtt_us))}us"
[buffer]
size = "256MiB"
per_flow_quota = "64MiB"
[pseudo_ack]
policy = "edge"
[control]
metrics = ""
socket = "{sock}"
[log]
format = "human"
level = "warn"
[gateway]
shards = {shards}
"""


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def netns_lab(tag, backend, pairs):
    """Four namespaces wired as in the docstring, each host with the
    addresses of `pairs` (10.1.0.k on hostA, 10.2.0.k on hostB) besides
    .1; returns their names."""
    ns = {k: f"fwd-{os.getpid()}-{tag}-{k}" for k in ("hA", "gA", "gB", "hB")}
    for n in ns.values():
        sh("ip", "netns", "add", n)
        _netns.append(n)
        sh("ip", "-n", n, "link", "set", "lo", "up")
        for k in ("all", "default"):
            sh("ip", "netns", "exec", n, "sysctl", "-qw", f"net.ipv6.conf.{k}.disable_ipv6=1")
            sh("ip", "netns", "exec", n, "sysctl", "-qw", f"net.ipv4.conf.{k}.rp_filter=0")
    q = ["numtxqueues", "1", "numrxqueues", "1"]
    for h, g, host, gwip in (("hA", "gA", "10.1.0.1", "10.1.0.254"),
                             ("hB", "gB", "10.2.0.1", "10.2.0.254")):
        sh("ip", "netns", "exec", ns[g], "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("ip", "link", "add", "dc", "netns", ns[h], *q, "type", "veth", "peer", "name", "host",
           "netns", ns[g], *q)
        sh("ip", "-n", ns[h], "addr", "add", f"{host}/24", "dev", "dc")
        sh("ip", "-n", ns[g], "addr", "add", f"{gwip}/24", "dev", "host")
        sh("ip", "-n", ns[h], "link", "set", "dc", "up", "mtu", "9000")
        sh("ip", "-n", ns[g], "link", "set", "host", "up", "mtu", "9000")
        sh("ip", "-n", ns[h], "route", "add", "default", "via", gwip)
        for pair in pairs:
            addr = pair[0] if h == "hA" else pair[1]
            sh("ip", "-n", ns[h], "addr", "add", f"{addr}/24", "dev", "dc")
            # The gateway's kernel learns the host's MAC for this address
            # (its echo reply needs it) before the measured window: the xdp
            # backend reads its headers from that table, and would hold the
            # first packets toward an unknown host while the kernel resolves
            # it (xdp::unresolved).
            sh("ip", "netns", "exec", ns[h], "ping", "-c", "1", "-W", "2", "-I", addr, gwip)
        if backend == "xdp":
            sh("ip", "netns", "exec", ns[h], "ethtool", "-K", "dc", "tx", "off")
    sh("ip", "link", "add", "wan", "netns", ns["gA"], "type", "veth", "peer", "name", "wan",
       "netns", ns["gB"])
    for g, ip in (("gA", "169.254.10.1/30"), ("gB", "169.254.10.2/30")):
        sh("ip", "-n", ns[g], "addr", "add", ip, "dev", "wan")
        sh("ip", "-n", ns[g], "link", "set", "wan", "up", "mtu", "9000")
    return ns


_netns = []


def netns_cleanup():
    while _netns:
        subprocess.run(["ip", "netns", "del", _netns.pop()], stderr=subprocess.DEVNULL)


def in_ns(ns, cmd):
    return ["ip", "netns", "exec", ns] + cmd


def status(soya, sock):
    try:
        r = subprocess.run([soya, "status", "--socket", sock, "--json"],
                           capture_output=True, text=True, timeout=5)
        return json.loads(r.stdout) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


# ----- one run ------------------------------------------------------------

def run_once(args, bins, shards, key, tmp, tag):
    log = os.path.join(tmp, tag)
    os.makedirs(log)
    rtt_us = 2 * args.distance_km * US_PER_KM
    netns = args.backend != "udp"
    pairs = host_pairs(args.pairs, shards)
    if netns:
        ns = netns_lab(tag, args.backend, pairs)
        wa = wb = 7400
        dca = dcb = None
    else:
        ns = None
        wa, wb = free_ports("udp", shards), free_ports("udp", shards)
        dca, dcb = free_ports("udp"), free_ports("udp")
    kids = []
    if netns:
        ra, rb = wb, wa
    elif args.distance_km > 0:
        # Relay ports ra+i -> wb+i (A to B) and rb+i -> wa+i, one per shard.
        ra, rb = free_ports("udp", shards), free_ports("udp", shards)
        cmd = [bins["soya-wanem"], "udp", "--distance-km", str(args.distance_km),
               "--stats-interval", "0", "--no-realtime"]
        for i in range(shards):
            cmd += ["--listen", f"{LO}:{ra + i}", "--forward", f"{LO}:{wb + i}",
                    "--listen", f"{LO}:{rb + i}", "--forward", f"{LO}:{wa + i}"]
        kids.append(("wanem", spawn("wanem", cmd, log)))
    else:
        ra, rb = wb, wa
    gws = {}
    env = dict(os.environ, SOYA_NORMAL_PRIORITY="1")
    for side, dc, local, remote, wan, twin in (("a", dca, "10.1.0.0/16", "10.2.0.0/16", wa, ra),
                                               ("b", dcb, "10.2.0.0/16", "10.1.0.0/16", wb, rb)):
        sock = os.path.join(log, f"{side}.sock")
        cfg = os.path.join(log, f"gateway-{side}.toml")
        ips = (("169.254.10.1", "169.254.10.2") if side == "a" else
               ("169.254.10.2", "169.254.10.1")) if netns else (LO, LO)
        text = gateway_config(f"fwd-{side}", dc, local, remote, wan, twin, shards,
                              args.rate, rtt_us, key, sock, backend=args.backend,
                              wan_ip=ips[0], twin_ip=ips[1])
        if args.identity:
            private, _ = args.identity_keys[side]
            _, twin_public = args.identity_keys["b" if side == "a" else "a"]
            extra = f'private_key_file = "{private}"\ntwin_public_key = "{twin_public}"\n'
            if args.rekey_interval:
                extra += f'rekey_interval = "{args.rekey_interval}"\n'
            text = text.replace("[[wan.paths]]", extra + "[[wan.paths]]", 1)
        with open(cfg, "w") as f:
            f.write(text)
        cmd = [bins["soya"], "gateway", "--config", cfg]
        if netns:
            cmd = in_ns(ns["g" + side.upper()], cmd)
        p = spawn(f"gateway-{side}", cmd, log, env=env)
        gws[side] = (p, sock)

    def gw_dead():
        for side, (p, _) in gws.items():
            if p.poll() is not None:
                with open(os.path.join(log, f"gateway-{side}.err"), errors="replace") as f:
                    tail = f.read()[-2000:]
                return f"gateway {side.upper()} exited ({p.returncode}):\n{tail}"
        return None

    # Both gateways up and every shard's WAN session established.
    deadline = time.monotonic() + 20
    while True:
        if (e := gw_dead()):
            raise RuntimeError(e)
        snaps = [status(bins["soya"], s) for _, s in gws.values()]
        if all(s and s.get("connected") and len(s.get("shards", [])) == shards
               and all(x.get("connected") for x in s["shards"]) for s in snaps):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"gateways not connected after 20 s; logs in {log}")
        time.sleep(0.2)
    if netns and args.backend == "tun":
        for g, remote in (("gA", "10.2.0.0/16"), ("gB", "10.1.0.0/16")):
            sh("ip", "-n", ns[g], "route", "replace", remote, "dev", "soya0")

    # Servers behind B (answer through B), one per pair.
    sessions = []
    for i, (ha, hb, s) in enumerate(pairs):
        if netns:
            srv = spawn(f"server{i}", in_ns(ns["hB"], [
                bins["soya-perf"], "server", "--once", "--json", "--quiet", "--bind-ip", hb,
                "--accept-timeout", "20"]), log)
            sessions.append(dict(pair=(ha, hb), shard=s, server=srv))
            continue
        ctl, cport, sport = free_ports("tcp"), free_ports("udp"), free_ports("udp")
        srv = spawn(f"server{i}", [
            bins["soya-perf"], "server", "--once", "--json", "--quiet", "--bind-ip", LO,
            "--port", str(ctl), "--roce-port", str(sport), "--roce-ip", hb,
            "--accept-timeout", "20", "--gateway", f"{LO}:{dcb}"], log)
        sessions.append(dict(pair=(ha, hb), shard=s, ctl=ctl, cport=cport, server=srv))
    time.sleep(0.3)

    # Idle cost of the gateways (keepalives, timers), for reference.
    idle0 = {k: proc_cpu(p.pid) for k, (p, _) in gws.items()}
    t_idle = time.monotonic()
    time.sleep(1.0)
    idle_s = time.monotonic() - t_idle
    idle = {k: (proc_cpu(p.pid) - idle0[k]) / idle_s for k, (p, _) in gws.items()}

    # The measured window.
    thr0 = {k: thread_cpu(p.pid) for k, (p, _) in gws.items()}
    cpu0 = {k: proc_cpu(p.pid) for k, (p, _) in gws.items()}
    split0 = {k: proc_cpu_split(p.pid) for k, (p, _) in gws.items()}
    relay0 = sum(proc_cpu(p.pid) for _, p in kids)
    m0 = machine_cpu()
    t0 = time.monotonic()
    for i, s in enumerate(sessions):
        out = open(os.path.join(log, f"client{i}.json"), "wb")
        if netns:
            s["client"] = spawn(f"client{i}", in_ns(ns["hA"], [
                bins["soya-perf"], "client", s["pair"][1], "--json", "--quiet",
                "--bind-ip", s["pair"][0], "--connect-timeout", "10", "--op", "write",
                "--size", str(args.size), "--tx-depth", str(args.tx_depth),
                "--qps", str(args.qps), "--mtu", "4096", "--duration", str(args.duration)]),
                log, stdout=out)
            out.close()
            continue
        s["client"] = spawn(f"client{i}", [
            bins["soya-perf"], "client", LO, "--json", "--quiet", "--bind-ip", LO,
            "--roce-port", str(s["cport"]), "--port", str(s["ctl"]),
            "--roce-ip", s["pair"][0], "--connect-timeout", "10",
            "--gateway", f"{LO}:{dca}", "--op", "write", "--size", str(args.size),
            "--tx-depth", str(args.tx_depth), "--qps", str(args.qps), "--mtu", "4096",
            "--duration", str(args.duration)], log, stdout=out)
        out.close()
    strace_pkts = None
    if args.strace:
        # Attach to gateway A for most of the window; SIGINT makes strace
        # detach and write its summary.
        time.sleep(min(1.0, args.duration / 4))
        st0 = status(bins["soya"], gws["a"][1]) or {}
        tr = subprocess.run(["timeout", "-s", "INT", str(max(1.0, args.duration / 2)), "strace",
                             "-c", "-f", "-p", str(gws["a"][0].pid), "-o",
                             os.path.join(log, "strace-a.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        st1 = status(bins["soya"], gws["a"][1]) or {}
        strace_pkts = sum(st1.get("dc", {}).get(k, 0) - st0.get("dc", {}).get(k, 0)
                          for k in ("rx_packets", "tx_packets"))
    for s in sessions:
        s["client_cpu"] = reap(s["client"])
    for s in sessions:
        s["server_cpu"] = reap(s["server"])
    t1 = time.monotonic()
    cpu1 = {k: proc_cpu(p.pid) for k, (p, _) in gws.items()}
    split1 = {k: proc_cpu_split(p.pid) for k, (p, _) in gws.items()}
    relay_cpu = sum(proc_cpu(p.pid) for _, p in kids) - relay0
    thr1 = {k: thread_cpu(p.pid) for k, (p, _) in gws.items()}
    m1 = machine_cpu()
    if (e := gw_dead()):
        raise RuntimeError(e)
    snaps = {k: status(bins["soya"], s) for k, (_, s) in gws.items()}
    for _, p in kids:
        stop(p)
    for p, _ in gws.values():
        stop(p)
    syscalls = None
    if args.strace:
        try:
            with open(os.path.join(log, "strace-a.txt")) as f:
                for line in f:
                    parts = line.split()
                    if parts and parts[-1] == "total":
                        syscalls = int(parts[3])
        except (OSError, ValueError, IndexError):
            pass
    netns_cleanup()

    window = t1 - t0
    errors, byts, perf_gbps, retx = [], 0, 0.0, 0
    for i, s in enumerate(sessions):
        try:
            with open(os.path.join(log, f"client{i}.json")) as f:
                line = [l for l in f.read().splitlines() if l.lstrip().startswith("{")][-1]
            rep = json.loads(line)
        except (IndexError, ValueError, OSError):
            errors.append(f"pair {i}: no soya-perf report (exit {s['client'].returncode}); "
                          f"logs in {log}")
            continue
        srv = rep.get("server") or {}
        s["bytes"] = srv.get("bytes", 0)
        s["gbps"] = srv.get("goodput_gbps", 0.0)
        byts += s["bytes"]
        perf_gbps += s["gbps"]
        retx += rep.get("retransmissions", 0)
        if not rep.get("ok") or rep.get("data_errors", 0):
            errors.append(f"pair {i}: soya-perf not ok: {rep.get('errors')} "
                          f"data_errors={rep.get('data_errors')}")
    gw_cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    gw_user = {k: split1[k][0] - split0[k][0] for k in split0}
    gw_sys = {k: split1[k][1] - split0[k][1] for k in split0}
    goodput = 8 * byts / window / 1e9
    per_core = {k: (8 * byts / 1e9 / c if c > 0 else None) for k, c in gw_cpu.items()}
    vals = [v for v in per_core.values() if v]
    busy, total = m1[0] - m0[0], m1[1] - m0[1]
    shard_info, wan, dc_drops = {}, {}, {}
    for k, snap in snaps.items():
        if snap:
            w = snap.get("wan", {})
            wan[k] = dict(packets_sent=w.get("packets_sent"), packets_lost=w.get("packets_lost"),
                          packets_retransmitted=w.get("packets_retransmitted"),
                          rekeys=w.get("rekeys"),
                          path_down=sum(x.get("times_down", 0) for x in snap.get("paths", [])))
            shard_info[k] = [dict(index=x.get("index"), dc_rx=x.get("dc_rx_accepted"),
                                  handoff_in=x.get("handoff_in"), handoff_out=x.get("handoff_out"),
                                  turns=x.get("turns"),
                                  # xdp: packets toward the DC sent from lent UMEM
                                  # in place / copied (still being sent) / heap
                                  xdp_lent_tx=[x.get("xdp_tx_in_place"), x.get("xdp_tx_busy_copied"),
                                               x.get("xdp_lend_empty")],
                                  # 4.2 KB frames from the hosts: held in place on
                                  # the RX tape, gathered at a break, gathered (full)
                                  xdp_rx_frames=[x.get("xdp_rx_in_place"),
                                                 x.get("xdp_rx_gathered_break"),
                                                 x.get("xdp_rx_gathered_full")],
                                  # packets read (DC and WAN) per turn
                                  read_per_turn=(x.get("dc_rx_accepted", 0)
                                                 + x.get("wan_packets_received", 0)) / x["turns"]
                                  if x.get("turns") else None)
                             for x in snap.get("shards", [])]
            dc = snap.get("dc", {})
            # Packets the gateway could not take from or give to its DC:
            # dropped by the kernel before it read them (full ring), and
            # toward hosts with no neighbour entry yet (xdp) or no route.
            dc_drops[k] = dict(rx_kernel_drops=dc.get("rx_kernel_drops", 0),
                               tx_no_peer=dc.get("tx_no_peer", 0),
                               tx_errors=dc.get("tx_errors", 0))
            if snap.get("dc", {}).get("handoff_dropped"):
                errors.append(f"gateway {k.upper()}: {snap['dc']['handoff_dropped']} handoff drops")

    def threads(k):
        d = {n: thr1[k].get(n, 0.0) - thr0[k].get(n, 0.0) for n in thr1[k]}
        return {n: round(v, 2) for n, v in sorted(d.items(), key=lambda x: -x[1]) if v >= 0.01}

    return dict(
        shards=shards, pairs=[dict(a=s["pair"][0], b=s["pair"][1], shard=s["shard"],
                                   bytes=s.get("bytes", 0), gbps=s.get("gbps", 0.0),
                                   client_cpu_s=round(s["client_cpu"], 2),
                                   server_cpu_s=round(s["server_cpu"], 2)) for s in sessions],
        window_s=round(window, 3), bytes=byts, goodput_gbps=goodput,
        soya_perf_goodput_gbps=perf_gbps, retransmissions=retx,
        gw_cpu_s={k: round(v, 2) for k, v in gw_cpu.items()},
        gw_cores={k: v / window for k, v in gw_cpu.items()},
        gw_user_cpu_s={k: round(v, 2) for k, v in gw_user.items()},
        gw_sys_cpu_s={k: round(v, 2) for k, v in gw_sys.items()},
        # Gb/s per CPU-second of the kernel's share alone: the ceiling of
        # Gb/s per gateway core if user space cost nothing.
        gbps_per_gw_sys_core={k: (8 * byts / 1e9 / c if c > 0 else None)
                              for k, c in gw_sys.items()},
        gw_idle_cores={k: round(v, 4) for k, v in idle.items()},
        gbps_per_gw_core=per_core,
        gbps_per_gw_core_mean=(sum(vals) / len(vals)) if vals else None,
        gw_threads_cpu_s={k: threads(k) for k in gws},
        endpoints_cpu_s=round(sum(s["client_cpu"] + s["server_cpu"] for s in sessions), 2),
        wanem_cpu_s=round(relay_cpu, 2) if kids else None,
        machine_busy=(busy / total) if total else None,
        gw_shards=shard_info, gw_wan=wan, gw_dc_drops=dc_drops, errors=errors, logs=log,
        backend=args.backend, gbps_per_gateway_core=(sum(vals) / len(vals)) if vals else None,
        gw_backend={k: (v or {}).get("backend") for k, v in snaps.items()},
        dc_packets_a=(snaps.get("a") or {}).get("dc", {}).get("rx_packets", 0)
        + (snaps.get("a") or {}).get("dc", {}).get("tx_packets", 0),
        syscalls_a=syscalls,
        strace_dc_packets_a=strace_pkts,
        syscalls_per_dc_packet_a=(syscalls / strace_pkts) if syscalls and strace_pkts else None)


def print_run(r, cores):
    w = r["window_s"]
    print(f"\n== {r['shards']} shard(s), {len(r['pairs'])} host pair(s), window {w:.2f} s")
    print(f"   goodput {r['goodput_gbps']:.3f} Gb/s (8 x {r['bytes']} B placed / window; "
          f"soya-perf's own sum {r['soya_perf_goodput_gbps']:.3f}), "
          f"{r['retransmissions']} retransmissions")
    for k in ("a", "b"):
        pc = r["gbps_per_gw_core"][k]
        pcs = f"{pc:.3f} Gb/s per core" if pc else "no CPU measured"
        print(f"   gateway {k.upper()}: {r['gw_cpu_s'][k]:6.2f} CPU-s = {r['gw_cores'][k]:.2f} cores "
              f"(idle {r['gw_idle_cores'][k]:.3f})  -> {pcs}")
        ks = r["gbps_per_gw_sys_core"][k]
        print(f"      user {r['gw_user_cpu_s'][k]:.2f} CPU-s, kernel {r['gw_sys_cpu_s'][k]:.2f} CPU-s"
              + (f" (the kernel's share alone caps it at {ks:.2f} Gb/s per core)" if ks else ""))
        th = ", ".join(f"{n} {v:.2f}" for n, v in r["gw_threads_cpu_s"][k].items())
        print(f"      threads (CPU-s): {th}")
    m = r["gbps_per_gw_core_mean"]
    print(f"   Gb/s per gateway core, mean of A and B: {m:.3f}" if m else "   mean: -")
    for i, p in enumerate(r["pairs"]):
        print(f"   pair {i} {p['a']} -> {p['b']} (shard {p['shard']}): {p['gbps']:.3f} Gb/s, "
              f"client {p['client_cpu_s']:.2f} CPU-s, server {p['server_cpu_s']:.2f} CPU-s")
    gw = sum(r["gw_cpu_s"].values()) / w
    ep = r["endpoints_cpu_s"] / w
    rl = (r.get("wanem_cpu_s") or 0.0) / w
    mb = r["machine_busy"]
    line = f"   cores used over the window: gateways {gw:.2f}, soya-perf endpoints {ep:.2f}"
    if r.get("wanem_cpu_s") is not None:
        line += f", soya-wanem {rl:.2f}"
    if mb is not None:
        line += (f"; machine busy {100 * mb:.0f}% of {cores} cores, of which other "
                 f"processes {max(0.0, mb * cores - gw - ep - rl):.2f} cores")
    print(line)
    for k, sh in r["gw_shards"].items():
        # Packets per device-loop turn (over the gateway's life): a packet
        # costs about twice as much at one per turn as at 16
        # (docs/benchmarks.md §4, "The per-shard code without the kernel").
        per_turn = ", ".join(f"#{x['index']} {x['read_per_turn']:.2f}" for x in sh
                             if x.get("read_per_turn") is not None)
        if per_turn:
            print(f"   gateway {k.upper()} packets read (DC + WAN) per device-loop turn: {per_turn}")
        if len(sh) > 1:
            print(f"   gateway {k.upper()} shards: " + "; ".join(
                f"#{x['index']} dc_rx {x['dc_rx']} handoff in/out {x['handoff_in']}/{x['handoff_out']}"
                for x in sh))
    for k, w in r["gw_wan"].items():
        if w["packets_lost"] or w["path_down"]:
            print(f"   gateway {k.upper()} WAN: {w['packets_lost']} of {w['packets_sent']} packets lost, "
                  f"{w['packets_retransmitted']} retransmitted, path declared down {w['path_down']} time(s) "
                  f"(30 ms without an ACK)")
    for k, d in r.get("gw_dc_drops", {}).items():
        if any(d.values()):
            print(f"   gateway {k.upper()} DC drops: kernel (RX ring full) {d['rx_kernel_drops']}, "
                  f"toward hosts without a neighbour entry {d['tx_no_peer']}, "
                  f"send errors {d['tx_errors']}")
    for e in r["errors"]:
        print(f"   ERROR: {e}")


def main():
    ap = argparse.ArgumentParser(
        description="Forwarding cost of Sōya: goodput per gateway core through two gateways "
                    "on loopback (udp DC backend), RDMA WRITE with 4 KiB RoCE packets, "
                    "for each --shards count. Run from anywhere after "
                    "`cargo build --release --workspace`.",
        epilog="Gb/s per gateway core = goodput / (gateway CPU seconds / window seconds) "
               "= 8 x bytes placed / gateway CPU seconds; CPU from /proc/PID/stat (utime+stime, "
               "all threads). The gateways run with SOYA_NORMAL_PRIORITY=1 so that their device "
               "threads do not starve the soya-perf endpoints on small machines. "
               "See the header of this file.")
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2], metavar="N",
                    help="gateway.shards values to measure, in order (default: 1 2)")
    ap.add_argument("--pairs", type=int, default=None,
                    help="host pairs (soya-perf client/server sessions), spread over the shards; "
                         "the same for every shard count (default 2 with udp, 1 with tun/xdp)")
    ap.add_argument("--duration", type=float, default=10.0,
                    help="seconds each client posts WRITEs (default 10)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per shard count (default 1)")
    ap.add_argument("--size", default="64K", help="WRITE message size (default 64K = 16 packets)")
    ap.add_argument("--tx-depth", type=int, default=128, help="outstanding WRs per QP (default 128)")
    ap.add_argument("--qps", type=int, default=1, help="QPs per host pair (default 1)")
    ap.add_argument("--rate", default="40gbit",
                    help="WAN path rate in the gateways' configs, split over the shards; "
                         "keep it above what loopback carries (default 40gbit)")
    ap.add_argument("--distance-km", type=float, default=0.0,
                    help="put a soya-wanem relay between the gateways with this fibre delay "
                         "(default 0: the gateways talk directly)")
    ap.add_argument("--insecure", action="store_true",
                    help="plaintext WAN (default: keyed, authenticated and encrypted)")
    ap.add_argument("--identity", action="store_true",
                    help="identity keys (soya genkey per gateway, Noise IKpsk2, the PSK mixed "
                         "in) instead of the PSK alone")
    ap.add_argument("--rekey-interval", default=None,
                    help="with --identity: wan.rekey_interval, e.g. 1s (default: the "
                         "gateway's own, 120 s)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"),
                    help="where soya, soya-perf, soya-wanem are (default: target/release)")
    ap.add_argument("--json", action="store_true",
                    help="one JSON object on stdout instead of the table")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with configs and logs")
    ap.add_argument("--backend", choices=["udp", "tun", "xdp"], default="udp",
                    help="DC backend: udp on loopback (default), or tun / xdp between "
                         "network namespaces (root)")
    ap.add_argument("--strace", action="store_true",
                    help="run gateway A under strace -c -f; report syscalls per DC packet")
    args = ap.parse_args()
    if args.pairs is None:
        args.pairs = 2 if args.backend == "udp" else 1
    if any(n < 1 or n > 16 for n in args.shards):
        ap.error("--shards: 1..=16")
    if args.pairs < 1 or args.repeat < 1 or args.duration <= 0 or args.qps < 1:
        ap.error("--pairs, --repeat, --qps >= 1 and --duration > 0")
    if not 0 <= args.distance_km <= 40000:
        ap.error("--distance-km: 0..=40000")

    need = ["soya", "soya-perf"] + (["soya-wanem"] if args.distance_km > 0 else [])
    bins = {n: os.path.join(args.bin_dir, n) for n in ["soya", "soya-perf", "soya-wanem"]}
    missing = [bins[n] for n in need if not os.access(bins[n], os.X_OK)]
    if missing:
        sys.exit("forward.py: missing " + ", ".join(missing) +
                 "\n  build them first: cargo build --release --workspace (or pass --bin-dir)")

    global _libc
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        _libc = None
    tmp = tempfile.mkdtemp(prefix="soya-forward-")
    atexit.register(lambda: None if args.keep else shutil.rmtree(tmp, ignore_errors=True))
    atexit.register(netns_cleanup)
    atexit.register(stop_all)  # runs before the rmtree and the namespaces (LIFO)

    def on_signal(sig, _frame):
        raise SystemExit(128 + sig)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    key = None
    if not args.insecure:
        key = os.path.join(tmp, "psk.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())

    if args.identity:
        if args.insecure:
            sys.exit("forward.py: --identity needs a keyed WAN (not --insecure)")
        args.identity_keys = {}
        for side in ("a", "b"):
            f = os.path.join(tmp, f"{side}.key")
            subprocess.run([bins["soya"], "genkey", f], check=True, stdout=subprocess.DEVNULL)
            public = subprocess.run([bins["soya"], "pubkey", f], check=True,
                                    capture_output=True, text=True).stdout.strip()
            args.identity_keys[side] = (f, public)

    cores = os.cpu_count()
    load_before = loadavg()
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else \
        (lambda s: print(s, flush=True))
    log(f"forward.py: {cores} cores, load average before {' '.join(map(str, load_before))}; "
        f"WRITE {args.size} B, MTU 4096, tx-depth {args.tx_depth}, {args.qps} QP(s)/pair, "
        f"{args.pairs} pair(s), {args.duration:g} s, "
        f"{'insecure' if args.insecure else 'keyed'} WAN"
        f"{' (identity keys, rekey ' + (args.rekey_interval or 'default') + ')' if args.identity else ''}, "
        f"{args.distance_km:g} km, "
        f"{args.backend} DC backend")
    runs = []
    try:
        for rep in range(args.repeat):
            for n in args.shards:
                if not args.json:
                    print(f"-- run: {n} shard(s) (repeat {rep + 1}/{args.repeat})", flush=True)
                r = run_once(args, bins, n, key, tmp, f"s{n}-r{rep}")
                r["load_after"] = loadavg()
                runs.append(r)
                if not args.json:
                    print_run(r, cores)
    except KeyboardInterrupt:
        print("\nforward.py: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as e:
        print(f"forward.py: {e}", file=sys.stderr)
        return 1
    load_after = loadavg()

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None
    summary = {}
    for n in args.shards:
        rs = [r for r in runs if r["shards"] == n]
        gp = [r["goodput_gbps"] for r in rs]
        pc = [r["gbps_per_gw_core_mean"] for r in rs if r["gbps_per_gw_core_mean"]]
        summary[n] = dict(goodput_gbps=mean(r["goodput_gbps"] for r in rs),
                          gbps_per_gateway_core=mean(pc),
                          goodput_gbps_runs=gp, gbps_per_gateway_core_runs=pc,
                          goodput_gbps_min_max=[min(gp), max(gp)] if gp else None,
                          gbps_per_gateway_core_min_max=[min(pc), max(pc)] if pc else None,
                          gbps_per_gw_core=mean(r["gbps_per_gw_core_mean"] for r in rs),
                          gw_cores=mean((r["gw_cores"]["a"] + r["gw_cores"]["b"]) / 2 for r in rs))
    ratio = None
    if 1 in summary and 2 in summary and summary[1]["goodput_gbps"]:
        ratio = dict(goodput=summary[2]["goodput_gbps"] / summary[1]["goodput_gbps"],
                     gbps_per_gw_core=(summary[2]["gbps_per_gw_core"] / summary[1]["gbps_per_gw_core"]
                                       if summary[1]["gbps_per_gw_core"] else None))
    ok = all(not r["errors"] for r in runs)
    if args.json:
        print(json.dumps(dict(
            cores=cores, load_before=load_before, load_after=load_after,
            backend=args.backend,
            options=dict(shards=args.shards, pairs=args.pairs, duration_s=args.duration,
                         size=args.size, tx_depth=args.tx_depth, qps=args.qps, rate=args.rate,
                         distance_km=args.distance_km, keyed=not args.insecure,
                         identity=args.identity, rekey_interval=args.rekey_interval),
            runs=runs, summary={str(k): v for k, v in summary.items()},
            ratio_2_over_1=ratio, ok=ok)))
    else:
        print("\nshards  goodput Gb/s  gateway cores (mean A,B)  Gb/s per gateway core (mean A,B)")
        for n, s in summary.items():
            print(f"{n:>6}  {s['goodput_gbps']:>12.3f}  {s['gw_cores']:>24.2f}  "
                  f"{s['gbps_per_gw_core'] or 0:>33.3f}")
        if ratio:
            print(f"2 shards / 1 shard: goodput x{ratio['goodput']:.2f}, "
                  f"Gb/s per gateway core x{ratio['gbps_per_gw_core']:.2f}")
        print(f"load average before {' '.join(map(str, load_before))}, "
              f"after {' '.join(map(str, load_after))} ({cores} cores)")
        if not ok:
            print("some runs reported errors (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
