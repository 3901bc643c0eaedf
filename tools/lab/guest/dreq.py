#!/usr/bin/env python3
"""Lab experiment for the lost-twin fix (docs/interop.md, "What would make
rping exit"): send hostA's RDMA-CM a DREQ as if from its lost peer, the
packet a gateway could send on fail_all for a connection it learned from
RDMA-CM.

  dreq.py --check PCAP                verify this script's ICRC on captured RoCEv2 frames
  dreq.py PCAP IFACE DST_MAC [WHEN_FILE DELAY]
                                      read REQ/REP from PCAP (capture of the connection
                                      set-up on the site-A DC link), send a DREQ from the
                                      REP's sender to the REQ's sender out of IFACE; with
                                      WHEN_FILE, wait for it (it holds an epoch time, the
                                      kill) and send at that time + DELAY seconds (python
                                      starts slowly under TCG: start it early)

Ethernet pcaps only; IPv4 RoCEv2 only. Lab use only (no guessing: every
field comes from the captured REQ/REP).
"""
import socket
import struct
import sys
import zlib

CM_CLASS = 0x07
ATTR_REQ, ATTR_REP, ATTR_DREQ = 0x0010, 0x0013, 0x0015


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(end + "IIII", data[off:off + 16])
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def roce(frame):
    """(ip header bytes, udp header bytes, udp payload) of an IPv4 RoCEv2 frame, or None."""
    if len(frame) < 14 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0xF) * 4
    if ip[9] != 17:
        return None
    tot = struct.unpack("!H", ip[2:4])[0]
    udp = ip[ihl:ihl + 8]
    if struct.unpack("!H", udp[2:4])[0] != 4791:
        return None
    return ip[:ihl], udp, ip[ihl + 8:tot]


def icrc(iph, udph, payload_wo_icrc):
    """RoCEv2 ICRC: CRC-32 over 8 bytes of 1s, the IP header with TOS, TTL and
    checksum masked, the UDP header with its checksum masked, the BTH with
    resv8a masked, and the rest."""
    ip = bytearray(iph)
    ip[1] = 0xFF           # TOS (DSCP/ECN)
    ip[8] = 0xFF           # TTL
    ip[10:12] = b"\xff\xff"
    udp = bytearray(udph)
    udp[6:8] = b"\xff\xff"
    bth = bytearray(payload_wo_icrc)
    bth[4] = 0xFF          # resv8a
    crc = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth)) & 0xFFFFFFFF
    return struct.pack("<I", crc)


def check(path):
    ok = bad = 0
    for fr in frames(path):
        r = roce(fr)
        if not r:
            continue
        iph, udph, pl = r
        if icrc(iph, udph, pl[:-4]) == pl[-4:]:
            ok += 1
        else:
            bad += 1
    print(f"icrc ok {ok} bad {bad}")
    return 0 if ok and not bad else 1


def mads(path):
    for fr in frames(path):
        r = roce(fr)
        if not r:
            continue
        iph, udph, pl = r
        opcode = pl[0]
        dqp = struct.unpack("!I", b"\x00" + pl[5:8])[0]
        if opcode != 0x64 or dqp != 1:
            continue
        mad = pl[12 + 8:-4]
        if len(mad) < 24 or mad[1] != CM_CLASS:
            continue
        attr = struct.unpack("!H", mad[16:18])[0]
        yield iph, attr, mad


def main():
    if sys.argv[1] == "--check":
        return check(sys.argv[2])
    path, iface, dst_mac = sys.argv[1], sys.argv[2], sys.argv[3]
    req = rep = None
    for iph, attr, mad in mads(path):
        if attr == ATTR_REQ and req is None:
            req = (iph, mad)
        elif attr == ATTR_REP and rep is None:
            rep = (iph, mad)
    if not req or not rep:
        print("no REQ/REP in the capture", file=sys.stderr)
        return 1
    a_ip, b_ip = req[0][12:16], req[0][16:20]     # REQ: A -> B
    d = req[1][24:]
    a_comm = d[0:4]
    a_qpn = d[32:35]
    r = rep[1][24:]
    b_comm, rep_remote = r[0:4], r[4:8]
    if rep_remote != a_comm:
        print("REP does not answer the REQ", file=sys.stderr)
        return 1
    # MAD: base version 1, class CM, class version 2, method Send
    tid = struct.pack("!Q", 0x50A7A000_00000001)
    mad = bytes([1, CM_CLASS, 2, 0x03]) + b"\x00" * 4 + tid + struct.pack("!HHI", ATTR_DREQ, 0, 0)
    dreq = b_comm + a_comm + a_qpn + b"\x00"        # local comm id (sender B), remote (A), remote QPN (A)
    mad += dreq + b"\x00" * (232 - len(dreq))
    assert len(mad) == 256
    bth = bytes([0x64, 0x00]) + b"\xff\xff" + b"\x00" + b"\x00\x00\x01" + b"\x00" + b"\x00\x00\x00"
    deth = struct.pack("!I", 0x80010000) + b"\x00\x00\x00\x01"
    body = bth + deth + mad
    ulen = 8 + len(body) + 4
    udp = struct.pack("!HHHH", 0xC001, 4791, ulen, 0)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + ulen, 0, 0x4000, 64, 17, 0, b_ip, a_ip))
    s = 0
    for i in range(0, 20, 2):
        s += (ip[i] << 8) | ip[i + 1]
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    ip[10:12] = struct.pack("!H", ~s & 0xFFFF)
    pkt = bytes(ip) + udp + body + icrc(bytes(ip), udp, body)
    src_mac = open(f"/sys/class/net/{iface}/address").read().strip()
    eth = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00"
    sk = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sk.bind((iface, 0))
    if len(sys.argv) > 5:
        import os
        import time
        when_file, delay = sys.argv[4], float(sys.argv[5])
        while not os.path.exists(when_file):
            time.sleep(0.05)
        time.sleep(0.05)
        t = float(open(when_file).read().strip()) + delay
        time.sleep(max(0.0, t - time.time()))
    sk.send(eth + pkt)
    qpn = int.from_bytes(a_qpn, "big")
    import time as _t
    print(f"DREQ sent at {_t.time():.3f}: {socket.inet_ntoa(b_ip)} -> {socket.inet_ntoa(a_ip)} local_comm_id {int.from_bytes(b_comm, 'big')}"
          f" remote_comm_id {int.from_bytes(a_comm, 'big')} remote_qpn {qpn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
