#!/usr/bin/env python3
"""Independent cross-check of `rocemu decode --json` against Scapy-built RoCEv2 frames.

Usage:
    python3 crosscheck.py --rocemu PATH [--count N] [--seed S] [--keep DIR]
                          [--mode all|frames|formats] [--max-report K]
    python3 crosscheck.py --selftest [--count N] [--seed S]

What it does (see /work/shared/contracts.md, `rocemu decode`):

* Builds random RoCEv2 frames with Scapy (`scapy.contrib.roce`): Ether / optional Dot1Q / IPv4 or IPv6 /
  UDP(dport=4791) / BTH / extension headers / payload / pad / ICRC, for every RC opcode of the IBTA table
  (0x00-0x14, 0x16, 0x17, plus IBA 1.5's 0x1C FLUSH and 0x1D ATOMIC_WRITE), the twelve UC opcodes, UD
  SEND_ONLY(_WITH_IMMEDIATE) and the RoCEv2 CNP (0x81). Scapy provides BTH, AETH, the CNP padding layer
  and the ICRC; the other extension headers (FETH, RETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH) are
  built here as big-endian bytes in the order of the IBTA opcode table.
* Every frame's ICRC, computed by Scapy, is re-verified by an independent implementation (zlib.crc32 over
  the RoCEv2 Annex A17 pseudo-packet); the two must agree or the script aborts.
* Variants: masked-field changes after the ICRC was computed (ICRC must still verify); single covered-bit
  flips (ICRC must fail; structure-changing flips are judged by an independent parser of the mutated bytes);
  Ethernet padding after the IP datagram (ignored); truncation inside the IP datagram (not ok); non-RoCE
  frames; reserved opcodes; IPv4 header options; a wrong IPv4 header checksum.
* Expected objects come from the generator's own parameters; an independent byte parser written from the
  contract must reproduce them exactly (a disagreement is a bug in this script and aborts the run).
* Runs `ROCEMU decode --json FILE` and compares every key the contract defines, with exact JSON types.
* Format mode: the same frames as pcap (LE/BE x usec/nsec), pcapng (LE, BE, with extra blocks and a
  second interface) must decode identically; missing, empty and non-capture files must fail with a
  message on stderr.

Ends with `crosscheck: N passed, M failed`; exit status 1 if anything failed, 77 if Scapy is missing.
"""

import argparse
import ipaddress
import json
import logging
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

DEFAULT_SEED = 4791
DEFAULT_COUNT = 3000
SKIP_STATUS = 77  # automake's "skipped": Scapy is not installed
ROCE_PORT = 4791

# --------------------------------------------------------------------------------------------
# The opcode table (IBTA Vol. 1 Table 38 "OpCode field"; IBA 1.5 for FLUSH / ATOMIC_WRITE;
# Annex A17 for CNP). layout = extension headers after the BTH, in wire order.
# payload: "any" (SEND/WRITE/READ-response data), "none", or "atomic_write" (exactly 8 bytes).
# --------------------------------------------------------------------------------------------

EXT_LEN = {
    "FETH": 4, "RETH": 16, "AETH": 4, "ATOMIC": 28, "ATOMIC_ACK": 8,
    "IMM": 4, "IETH": 4, "DETH": 8, "CNP": 16,
}

_COMMON = [  # RC and UC share 0x00-0x0B (UC adds 0x20)
    (0x00, "SEND_FIRST", (), "any"),
    (0x01, "SEND_MIDDLE", (), "any"),
    (0x02, "SEND_LAST", (), "any"),
    (0x03, "SEND_LAST_WITH_IMMEDIATE", ("IMM",), "any"),
    (0x04, "SEND_ONLY", (), "any"),
    (0x05, "SEND_ONLY_WITH_IMMEDIATE", ("IMM",), "any"),
    (0x06, "RDMA_WRITE_FIRST", ("RETH",), "any"),
    (0x07, "RDMA_WRITE_MIDDLE", (), "any"),
    (0x08, "RDMA_WRITE_LAST", (), "any"),
    (0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", ("IMM",), "any"),
    (0x0A, "RDMA_WRITE_ONLY", ("RETH",), "any"),
    (0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", ("RETH", "IMM"), "any"),
]
_RC_ONLY = [
    (0x0C, "RDMA_READ_REQUEST", ("RETH",), "none"),
    (0x0D, "RDMA_READ_RESPONSE_FIRST", ("AETH",), "any"),
    (0x0E, "RDMA_READ_RESPONSE_MIDDLE", (), "any"),
    (0x0F, "RDMA_READ_RESPONSE_LAST", ("AETH",), "any"),
    (0x10, "RDMA_READ_RESPONSE_ONLY", ("AETH",), "any"),
    (0x11, "ACKNOWLEDGE", ("AETH",), "none"),
    (0x12, "ATOMIC_ACKNOWLEDGE", ("AETH", "ATOMIC_ACK"), "none"),
    (0x13, "COMPARE_SWAP", ("ATOMIC",), "none"),
    (0x14, "FETCH_ADD", ("ATOMIC",), "none"),
    (0x16, "SEND_LAST_WITH_INVALIDATE", ("IETH",), "any"),
    (0x17, "SEND_ONLY_WITH_INVALIDATE", ("IETH",), "any"),
    (0x1C, "FLUSH", ("FETH", "RETH"), "none"),
    (0x1D, "ATOMIC_WRITE", ("RETH",), "atomic_write"),
]

OPCODES = {}
for _c, _n, _l, _p in _COMMON + _RC_ONLY:
    OPCODES[_c] = ("RC_" + _n, _l, _p)
for _c, _n, _l, _p in _COMMON:
    OPCODES[0x20 + _c] = ("UC_" + _n, _l, _p)
OPCODES[0x64] = ("UD_SEND_ONLY", ("DETH",), "any")
OPCODES[0x65] = ("UD_SEND_ONLY_WITH_IMMEDIATE", ("DETH", "IMM"), "any")
OPCODES[0x81] = ("CNP", ("CNP",), "none")

# Opcodes that are reserved in their transport's table and not defined by IBA 1.5: "unknown".
CLEARLY_UNKNOWN = sorted(
    {0x15, 0x18, 0x19, 0x1A, 0x1B, 0x1F}
    | set(range(0x2C, 0x40))
    | set(range(0x60, 0x64)) | set(range(0x66, 0x80)))


def ambiguous_opcode(op):
    """Opcodes whose verdict the contract leaves open (RD, XRC, CNP class, vendor): never expected."""
    return op not in OPCODES and op not in CLEARLY_UNKNOWN


# --------------------------------------------------------------------------------------------
# Independent ICRC (RoCEv2 Annex A17) and an independent parser written from the contract.
# --------------------------------------------------------------------------------------------

def icrc_of(ip_hdr, ipv, udp_hdr, bth_and_rest):
    """ICRC over 8 x 0xFF | masked IP header | UDP (checksum 0xFFFF) | BTH (byte 4 0xFF) | rest."""
    ip = bytearray(ip_hdr)
    if ipv == 4:
        ip[1] = 0xFF            # TOS
        ip[8] = 0xFF            # TTL
        ip[10:12] = b"\xff\xff"  # header checksum
    else:
        ip[0] |= 0x0F           # traffic class, high nibble
        ip[1:4] = b"\xff\xff\xff"  # traffic class low nibble + flow label
        ip[7] = 0xFF            # hop limit
    udp = bytearray(udp_hdr)
    udp[6:8] = b"\xff\xff"
    body = bytearray(bth_and_rest)
    body[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(body)) & 0xFFFFFFFF


def ipv4_checksum(hdr):
    hdr = bytearray(hdr)
    hdr[10:12] = b"\0\0"
    s = 0
    for i in range(0, len(hdr), 2):
        s += (hdr[i] << 8) | hdr[i + 1]
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def fmt_ipv6(b):
    """What Rust's `Ipv6Addr` Display prints: RFC 5952, and `::ffff:a.b.c.d` for IPv4-mapped."""
    seg = struct.unpack("!8H", b)
    if seg[:5] == (0, 0, 0, 0, 0) and seg[5] == 0xFFFF:
        return "::ffff:%d.%d.%d.%d" % tuple(b[12:16])
    best_s, best_n, cur_s, cur_n = 0, 0, 0, 0
    for i, v in enumerate(seg):
        if v == 0:
            if cur_n == 0:
                cur_s = i
            cur_n += 1
            if cur_n > best_n:
                best_s, best_n = cur_s, cur_n
        else:
            cur_n = 0
    if best_n > 1:
        left = ":".join("%x" % v for v in seg[:best_s])
        right = ":".join("%x" % v for v in seg[best_s + best_n:])
        return left + "::" + right
    return ":".join("%x" % v for v in seg)


class Bad(Exception):
    pass


def parse(frame):
    """Decode one Ethernet frame per the contract. Returns (object-without-frame, layout offsets)."""
    lay = {}
    try:
        if len(frame) < 14:
            raise Bad("truncated: Ethernet header")
        et = struct.unpack_from("!H", frame, 12)[0]
        off = 14
        vlan = None
        if et == 0x8100:
            if len(frame) < 18:
                raise Bad("truncated: 802.1Q tag")
            vlan = struct.unpack_from("!H", frame, 14)[0] & 0x0FFF
            et = struct.unpack_from("!H", frame, 16)[0]
            off = 18
        lay["ip"] = off
        if et == 0x0800:
            if len(frame) < off + 20:
                raise Bad("truncated: IPv4 header")
            if frame[off] >> 4 != 4:
                raise Bad("IPv4 version")
            ihl = (frame[off] & 0x0F) * 4
            if ihl < 20 or len(frame) < off + ihl:
                raise Bad("IPv4 IHL")
            tot = struct.unpack_from("!H", frame, off + 2)[0]
            if tot < ihl:
                raise Bad("IPv4 total length")
            if off + tot > len(frame):
                raise Bad("truncated: IPv4 total length")
            if struct.unpack_from("!H", frame, off + 6)[0] & 0x3FFF:
                raise Bad("IPv4 fragment")
            if frame[off + 9] != 17:
                raise Bad("not UDP")
            ipv, ip_hdr = 4, frame[off:off + ihl]
            ecn = frame[off + 1] & 3
            src = "%d.%d.%d.%d" % tuple(frame[off + 12:off + 16])
            dst = "%d.%d.%d.%d" % tuple(frame[off + 16:off + 20])
            udp_off, ip_end = off + ihl, off + tot
        elif et == 0x86DD:
            if len(frame) < off + 40:
                raise Bad("truncated: IPv6 header")
            if frame[off] >> 4 != 6:
                raise Bad("IPv6 version")
            plen = struct.unpack_from("!H", frame, off + 4)[0]
            if off + 40 + plen > len(frame):
                raise Bad("truncated: IPv6 payload length")
            if frame[off + 6] != 17:
                raise Bad("not UDP")
            ipv, ip_hdr = 6, frame[off:off + 40]
            ecn = (struct.unpack_from("!I", frame, off)[0] >> 20) & 3
            src, dst = fmt_ipv6(frame[off + 8:off + 24]), fmt_ipv6(frame[off + 24:off + 40])
            udp_off, ip_end = off + 40, off + 40 + plen
        else:
            raise Bad("not IP")
        lay["udp"] = udp_off
        if udp_off + 8 > ip_end:
            raise Bad("truncated: UDP header")
        sport, dport, ulen = struct.unpack_from("!HHH", frame, udp_off)
        if ulen < 8 or udp_off + ulen > ip_end:
            raise Bad("UDP length")
        if dport != ROCE_PORT:
            raise Bad("not UDP 4791")
        bth_off = udp_off + 8
        lay["bth"] = bth_off
        area = frame[bth_off:udp_off + ulen]
        if len(area) < 12 + 4:
            raise Bad("truncated: BTH")
        opcode = area[0]
        if opcode not in OPCODES:
            raise Bad("unknown opcode 0x%02x" % opcode)
        name, layout, _ = OPCODES[opcode]
        hdr = sum(EXT_LEN[h] for h in layout)
        rest = len(area) - 12 - hdr - 4
        if rest < 0:
            raise Bad("truncated: extension headers")
        pad = (area[1] >> 4) & 3
        if pad > rest:
            raise Bad("pad count")
        o = {
            "ok": True, "ip": "v%d" % ipv, "src": src, "dst": dst, "sport": sport, "dport": dport,
            "vlan": vlan, "ecn": ecn, "opcode": opcode, "op": name,
            "se": bool(area[1] & 0x80), "m": bool(area[1] & 0x40), "pad": pad, "tver": area[1] & 0x0F,
            "pkey": struct.unpack_from("!H", area, 2)[0],
            "fecn": bool(area[4] & 0x80), "becn": bool(area[4] & 0x40),
            "dqpn": struct.unpack_from("!I", area, 4)[0] & 0xFFFFFF,
            "ackreq": bool(area[8] & 0x80),
            "psn": struct.unpack_from("!I", area, 8)[0] & 0xFFFFFF,
            "payload_len": rest - pad,
            "icrc": area[-4:].hex(),
            "icrc_ok": icrc_of(ip_hdr, ipv, frame[udp_off:udp_off + 8], area[:-4])
            == struct.unpack("<I", area[-4:])[0],
        }
        p = 12
        lay["ext"] = bth_off + 12
        for h in layout:
            b = area[p:p + EXT_LEN[h]]
            if h == "RETH":
                va, rkey, ln = struct.unpack("!QII", b)
                o["reth"] = {"va": va, "rkey": rkey, "len": ln}
            elif h == "AETH":
                w = struct.unpack("!I", b)[0]
                o["aeth"] = {"syndrome": w >> 24, "msn": w & 0xFFFFFF}
            elif h == "ATOMIC":
                va, rkey, sa, cmp_ = struct.unpack("!QIQQ", b)
                o["atomic"] = {"va": va, "rkey": rkey, "swap_add": sa, "compare": cmp_}
            elif h == "ATOMIC_ACK":
                o["atomic_ack"] = {"orig": struct.unpack("!Q", b)[0]}
            elif h == "IMM":
                o["imm"] = struct.unpack("!I", b)[0]
            elif h == "IETH":
                o["ieth"] = struct.unpack("!I", b)[0]
            elif h == "DETH":
                qkey, w = struct.unpack("!II", b)
                o["deth"] = {"qkey": qkey, "sqpn": w & 0xFFFFFF}
            p += EXT_LEN[h]
        lay["payload"] = bth_off + p
        lay["pad"] = bth_off + p + rest - pad
        lay["icrc"] = udp_off + ulen - 4
        lay["end"] = udp_off + ulen
        return o, lay
    except Bad as e:
        return {"ok": False, "error": str(e)}, lay


# --------------------------------------------------------------------------------------------
# Generation with Scapy.
# --------------------------------------------------------------------------------------------

def load_scapy():
    try:
        logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
        from scapy.layers.l2 import Ether, Dot1Q, ARP
        from scapy.layers.inet import IP, UDP, TCP, IPOption
        from scapy.layers.inet6 import IPv6
        from scapy.packet import Raw
        from scapy.contrib.roce import BTH, AETH, CNPPadding
        from scapy.utils import wrpcap
        from scapy.compat import raw
        import scapy.config
        scapy.config.conf.logLevel = logging.ERROR
    except ImportError as e:
        print("crosscheck: SKIP: needs scapy (pip install scapy): %s" % e, file=sys.stderr)
        sys.exit(SKIP_STATUS)
    return dict(Ether=Ether, Dot1Q=Dot1Q, ARP=ARP, IP=IP, UDP=UDP, TCP=TCP, IPOption=IPOption,
                IPv6=IPv6, Raw=Raw, BTH=BTH, AETH=AETH, CNPPadding=CNPPadding, wrpcap=wrpcap, raw=raw)


def rand_mac(rng):
    b = bytearray(rng.randbytes(6))
    b[0] = (b[0] & 0xFE) | 0x02
    return ":".join("%02x" % x for x in b)


def rand_v6(rng):
    r = rng.random()
    if r < 0.05:
        return bytes(16)
    if r < 0.10:
        return bytes(15) + b"\x01"
    if r < 0.20:
        return bytes(10) + b"\xff\xff" + rng.randbytes(4)  # IPv4-mapped, as RoCEv2 GIDs are
    if r < 0.30:
        return b"\xfe\x80" + bytes(6) + rng.randbytes(8)   # link-local GID 0
    segs = [0 if rng.random() < 0.35 else rng.choice([rng.randrange(1, 0x10),
                                                      rng.randrange(0x10000)]) for _ in range(8)]
    return struct.pack("!8H", *segs)


def rand_payload_len(rng):
    r = rng.random()
    if r < 0.3:
        return rng.randrange(0, 9)
    if r < 0.45:
        return rng.choice([256, 512, 1024, 1024, 2048 - 64])
    return rng.randrange(0, 2001)


def ext_bytes(rng, h, truth):
    """Random extension header `h` as wire bytes; records the expected JSON value in `truth`."""
    if h == "RETH":
        va, rkey, ln = rng.getrandbits(64), rng.getrandbits(32), rng.choice(
            [rng.getrandbits(32), rng.randrange(0, 1 << 16)])
        truth["reth"] = {"va": va, "rkey": rkey, "len": ln}
        return struct.pack("!QII", va, rkey, ln)
    if h == "FETH":
        w = rng.choice([rng.randrange(0, 0x40), rng.getrandbits(32)])
        return struct.pack("!I", w)
    if h == "ATOMIC":
        va, rkey, sa, c = (rng.getrandbits(64), rng.getrandbits(32), rng.getrandbits(64),
                           rng.getrandbits(64))
        truth["atomic"] = {"va": va, "rkey": rkey, "swap_add": sa, "compare": c}
        return struct.pack("!QIQQ", va, rkey, sa, c)
    if h == "ATOMIC_ACK":
        orig = rng.getrandbits(64)
        truth["atomic_ack"] = {"orig": orig}
        return struct.pack("!Q", orig)
    if h == "IMM":
        truth["imm"] = rng.getrandbits(32)
        return struct.pack("!I", truth["imm"])
    if h == "IETH":
        truth["ieth"] = rng.getrandbits(32)
        return struct.pack("!I", truth["ieth"])
    if h == "DETH":
        qkey, resv, sqpn = (rng.choice([0x11111111, 0x80010000, rng.getrandbits(32)]),
                            rng.choice([0, rng.getrandbits(8)]), rng.getrandbits(24))
        truth["deth"] = {"qkey": qkey, "sqpn": sqpn}
        return struct.pack("!II", qkey, (resv << 24) | sqpn)
    raise AssertionError(h)


def build_roce(S, rng, opcode, ipv4_options=False):
    """One well-formed RoCEv2 frame. Returns (bytes, expected object without `frame`)."""
    name, layout, pkind = OPCODES.get(opcode, ("?", (), "any"))
    t = {"ok": True}
    eth = S["Ether"](src=rand_mac(rng), dst=rand_mac(rng))
    pkt = eth
    t["vlan"] = None
    if rng.random() < 0.3:
        vid = rng.choice([0, 1, 4095, rng.randrange(4096)])
        pkt = pkt / S["Dot1Q"](prio=rng.randrange(8), id=rng.randrange(2), vlan=vid)
        t["vlan"] = vid
    ecn, dscp = rng.randrange(4), rng.choice([0, 26, 46, rng.randrange(64)])
    t["ecn"] = ecn
    if ipv4_options or rng.random() < 0.5:
        src, dst = rng.randbytes(4), rng.randbytes(4)
        opts = []
        if ipv4_options:
            opts = [S["IPOption"](rng.choice([b"\x94\x04\x00\x00", b"\x01\x01\x01\x00",
                                              b"\x01" * 7 + b"\x00"]))]
        ip = S["IP"](src=".".join(map(str, src)), dst=".".join(map(str, dst)),
                     tos=(dscp << 2) | ecn, ttl=rng.choice([64, 255, 1, rng.randrange(256)]),
                     id=rng.randrange(65536), flags=rng.choice([0, 2]), options=opts)
        t["ip"], t["src"], t["dst"] = "v4", "%d.%d.%d.%d" % tuple(src), "%d.%d.%d.%d" % tuple(dst)
    else:
        src, dst = rand_v6(rng), rand_v6(rng)
        ip = S["IPv6"](src=str(ipaddress.IPv6Address(src)), dst=str(ipaddress.IPv6Address(dst)),
                       tc=(dscp << 2) | ecn, fl=rng.choice([0, rng.getrandbits(20)]),
                       hlim=rng.choice([64, 255, rng.randrange(256)]))
        t["ip"], t["src"], t["dst"] = "v6", fmt_ipv6(src), fmt_ipv6(dst)
        # independent formatter vs Python's for everything but IPv4-mapped (Rust prints those dotted)
        for a in (src, dst):
            if a[:12] != bytes(10) + b"\xff\xff":
                assert fmt_ipv6(a) == str(ipaddress.IPv6Address(a)), a.hex()
    sport = rng.choice([0xC000 | rng.randrange(0x4000), rng.randrange(65536), ROCE_PORT])
    udp = S["UDP"](sport=sport, dport=ROCE_PORT,
                   chksum=rng.choice([0, 0, None, rng.randrange(65536)]))
    t["sport"], t["dport"] = sport, ROCE_PORT

    if pkind == "any":
        plen = rand_payload_len(rng)
        pad = (-plen) & 3 if rng.random() < 0.7 else rng.randrange(4)
    elif pkind == "atomic_write":
        plen, pad = 8, 0
    else:
        plen, pad = 0, 0
    f = dict(opcode=opcode, solicited=rng.randrange(2), migreq=rng.randrange(2), padcount=pad,
             version=0 if rng.random() < 0.85 else rng.randrange(16),
             pkey=rng.choice([0xFFFF, 0x7FFF, rng.randrange(65536)]),
             fecn=rng.randrange(2), becn=rng.randrange(2),
             resv6=0 if rng.random() < 0.7 else rng.randrange(64),
             dqpn=rng.choice([1, rng.getrandbits(24)]), ackreq=rng.randrange(2),
             resv7=0 if rng.random() < 0.7 else rng.randrange(128), psn=rng.getrandbits(24))
    t.update(opcode=opcode, op=name, se=bool(f["solicited"]), m=bool(f["migreq"]), pad=pad,
             tver=f["version"], pkey=f["pkey"], fecn=bool(f["fecn"]), becn=bool(f["becn"]),
             dqpn=f["dqpn"], psn=f["psn"], ackreq=bool(f["ackreq"]), payload_len=plen)
    roce = S["BTH"](**f)
    raw_ext = b""
    for h in layout:
        if h == "AETH" and not raw_ext:          # Scapy's own AETH layer right after the BTH
            syn, msn = rng.choice([0x1F, 0x00, 0x60, rng.randrange(256)]), rng.getrandbits(24)
            t["aeth"] = {"syndrome": syn, "msn": msn}
            roce = roce / S["AETH"](syndrome=syn, msn=msn)
        elif h == "CNP":                         # Scapy's CNP padding layer (16 reserved bytes)
            r1, r2 = (0, 0) if rng.random() < 0.7 else (rng.getrandbits(64), rng.getrandbits(64))
            roce = roce / S["CNPPadding"](reserved1=r1, reserved2=r2)
        else:
            raw_ext += ext_bytes(rng, h, t)
    tail = raw_ext + rng.randbytes(plen) + bytes(pad)
    if tail:
        roce = roce / S["Raw"](tail)
    pkt = pkt / ip / udp / roce
    b = S["raw"](pkt)
    t["icrc"] = b[-4:].hex()
    t["icrc_ok"] = True
    return b, t


def build_other(S, rng):
    """A frame that is not a RoCEv2 packet."""
    k = rng.randrange(6)
    e = S["Ether"](src=rand_mac(rng), dst=rand_mac(rng))
    if k == 0:
        p = e / S["ARP"](psrc="10.0.0.%d" % rng.randrange(1, 255), pdst="10.0.0.1")
        return S["raw"](p), "ARP"
    if k == 1:
        p = e / S["IP"](src="10.0.0.1", dst="10.0.0.2") / S["UDP"](
            sport=rng.randrange(1024, 65536), dport=rng.choice([53, 4790, 4792, 4789])) / S["Raw"](
            rng.randbytes(rng.randrange(0, 64)))
        return S["raw"](p), "UDP not 4791"
    if k == 2:
        p = e / S["IP"](src="10.0.0.1", dst="10.0.0.2") / S["TCP"](sport=40000, dport=ROCE_PORT) / \
            S["Raw"](rng.randbytes(32))
        return S["raw"](p), "TCP to 4791"
    if k == 3:
        p = e / S["IPv6"](src="fd00::1", dst="fd00::2") / S["UDP"](sport=50000, dport=5000) / \
            S["Raw"](rng.randbytes(20))
        return S["raw"](p), "IPv6 UDP not 4791"
    if k == 4:
        return rng.randbytes(rng.randrange(0, 14)), "runt frame"
    # UDP 4791 carrying fewer bytes than a BTH + ICRC
    p = e / S["IP"](src="10.0.0.1", dst="10.0.0.2") / S["UDP"](sport=49152, dport=ROCE_PORT) / \
        S["Raw"](rng.randbytes(rng.randrange(0, 16)))
    return S["raw"](p), "UDP 4791 shorter than BTH+ICRC"


class Frame:
    def __init__(self, data, exp, tag, wirelen=None):
        self.data, self.exp, self.tag, self.wirelen = data, exp, tag, wirelen


def same_ignoring(a, b, keys):
    return {k: v for k, v in a.items() if k not in keys} == {k: v for k, v in b.items() if k not in keys}


def fix_v4_csum(b, lay):
    ip = lay["ip"]
    if b[ip] >> 4 == 4:
        ihl = (b[ip] & 0x0F) * 4
        struct.pack_into("!H", b, ip + 10, ipv4_checksum(b[ip:ip + ihl]))


def mutate_masked(rng, data, lay):
    """(a) change fields the ICRC masks; the IPv4 header checksum is fixed up."""
    b = bytearray(data)
    ip, udp, bth = lay["ip"], lay["udp"], lay["bth"]
    what = []
    while not what:
        if b[ip] >> 4 == 4:
            if rng.random() < 0.5:
                b[ip + 1] = rng.randrange(256); what.append("IPv4 TOS")
            if rng.random() < 0.5:
                b[ip + 8] = rng.randrange(256); what.append("IPv4 TTL")
        else:
            if rng.random() < 0.5:
                tc = rng.randrange(256)
                b[ip] = (b[ip] & 0xF0) | (tc >> 4)
                b[ip + 1] = ((tc & 0x0F) << 4) | (b[ip + 1] & 0x0F); what.append("IPv6 TC")
            if rng.random() < 0.5:
                fl = rng.getrandbits(20)
                b[ip + 1] = (b[ip + 1] & 0xF0) | (fl >> 16)
                b[ip + 2:ip + 4] = struct.pack("!H", fl & 0xFFFF); what.append("IPv6 flow label")
            if rng.random() < 0.5:
                b[ip + 7] = rng.randrange(256); what.append("IPv6 hop limit")
        if rng.random() < 0.4:
            b[udp + 6:udp + 8] = rng.randbytes(2); what.append("UDP checksum")
        if rng.random() < 0.5:
            b[bth + 4] = rng.randrange(256); what.append("BTH FECN/BECN/resv6")
    fix_v4_csum(b, lay)
    return bytes(b), "masked: " + ", ".join(what)


def mutate_flip(rng, data, lay):
    """(b) flip one bit the ICRC covers. Returns (bytes, tag) or None if no acceptable flip."""
    ip, udp, bth = lay["ip"], lay["udp"], lay["bth"]
    v4 = data[ip] >> 4 == 4
    regions = []
    if v4:
        regions += [("IPv4 ID", ip + 4, ip + 6), ("IPv4 addresses", ip + 12, ip + 20)]
    else:
        regions += [("IPv6 addresses", ip + 8, ip + 40)]
    regions += [("UDP sport", udp, udp + 2), ("UDP dport", udp + 2, udp + 4),
                ("BTH opcode", bth, bth + 1), ("BTH SE/M/Pad/TVer", bth + 1, bth + 2),
                ("BTH P_Key", bth + 2, bth + 4), ("BTH DestQP", bth + 5, bth + 8),
                ("BTH A/PSN", bth + 8, bth + 12)]
    if lay["payload"] > lay["ext"]:
        regions.append(("extension headers", lay["ext"], lay["payload"]))
    if lay["pad"] > lay["payload"]:
        regions.append(("payload", lay["payload"], lay["pad"]))
    if lay["icrc"] > lay["pad"]:
        regions.append(("pad bytes", lay["pad"], lay["icrc"]))
    regions.append(("ICRC", lay["icrc"], lay["end"]))
    for _ in range(30):
        name, lo, hi = rng.choice(regions)
        pos, bit = rng.randrange(lo, hi), rng.randrange(8)
        b = bytearray(data)
        b[pos] ^= 1 << bit
        if v4 and pos < udp:
            fix_v4_csum(b, lay)
        exp, _ = parse(bytes(b))
        new_op = b[bth]
        if name in ("BTH opcode", "BTH SE/M/Pad/TVer"):
            if ambiguous_opcode(new_op):
                continue
            # payload size rules of FLUSH/ATOMIC_WRITE are not pinned down by the contract
            layout_changed = new_op != data[bth] or (b[bth + 1] ^ data[bth + 1]) & 0x30
            if layout_changed and exp["ok"] and (new_op in (0x1C, 0x1D) or data[bth] in (0x1C, 0x1D)):
                continue
        tag = "flip: %s byte %d bit %d" % (name, pos, bit)
        if exp["ok"]:
            assert not exp["icrc_ok"], tag
            if OPCODES[exp["opcode"]][2] == "none" and exp["payload_len"] > 0:
                tag += " [bytes after a payload-less layout]"
        return bytes(b), tag
    return None


def generate(S, rng, count):
    frames = []
    order = list(OPCODES)  # every opcode at least once (twice: IPv4/IPv6 chosen at random)
    for i in range(count):
        opcode = order[i % len(order)] if i < 2 * len(order) else rng.choice(order)
        r = rng.random() if i >= 2 * len(order) else 0.0
        if r < 0.55:
            data, exp = build_roce(S, rng, opcode)
            if len(data) < 60 and rng.random() < 0.5:      # what a NIC would put on the wire
                data += bytes(60 - len(data))
                frames.append(Frame(data, exp, "plain, Ethernet-padded to 60"))
            else:
                frames.append(Frame(data, exp, "plain"))
        elif r < 0.65:
            data, exp = build_roce(S, rng, opcode)
            _, lay = parse(data)
            mdata, tag = mutate_masked(rng, data, lay)
            mexp, _ = parse(mdata)
            assert mexp["ok"] and mexp["icrc_ok"], tag
            assert same_ignoring(mexp, exp, {"ecn", "fecn", "becn"}), tag
            frames.append(Frame(mdata, mexp, tag))
        elif r < 0.78:
            data, exp = build_roce(S, rng, opcode)
            _, lay = parse(data)
            m = mutate_flip(rng, data, lay)
            if m is None:
                frames.append(Frame(data, exp, "plain"))
            else:
                mexp, _ = parse(m[0])
                frames.append(Frame(m[0], mexp, m[1]))
        elif r < 0.84:
            data, exp = build_roce(S, rng, opcode)
            n = rng.choice([1, 2, 3, 4, rng.randrange(1, 65)])
            extra = bytes(n) if rng.random() < 0.5 else rng.randbytes(n)
            frames.append(Frame(data + extra, exp, "Ethernet padding %d bytes" % n))
        elif r < 0.90:
            data, exp = build_roce(S, rng, opcode)
            _, lay = parse(data)
            ip = lay["ip"]
            if data[ip] >> 4 == 4:
                ip_end = ip + struct.unpack_from("!H", data, ip + 2)[0]
            else:
                ip_end = ip + 40 + struct.unpack_from("!H", data, ip + 4)[0]
            cut = rng.randrange(ip, ip_end)
            snap = rng.random() < 0.5
            frames.append(Frame(data[:cut], {"ok": False}, "truncated at %d of %d%s" % (
                cut, len(data), " (snaplen: orig_len kept)" if snap else " (orig_len = cut)"),
                wirelen=len(data) if snap else None))
        elif r < 0.93:
            data, tag = build_other(S, rng)
            frames.append(Frame(data, {"ok": False}, "not RoCEv2: " + tag))
        elif r < 0.96:
            op = rng.choice(CLEARLY_UNKNOWN)
            data, _ = build_roce(S, rng, op)
            frames.append(Frame(data, {"ok": False}, "reserved opcode 0x%02x" % op))
        elif r < 0.98:
            data, exp = build_roce(S, rng, opcode, ipv4_options=True)
            frames.append(Frame(data, exp, "IPv4 with header options"))
        else:
            data, exp = build_roce(S, rng, opcode)
            _, lay = parse(data)
            if data[lay["ip"]] >> 4 == 4:
                b = bytearray(data)
                b[lay["ip"] + 10] ^= 0x5A   # masked by the ICRC; ok judges structure only
                frames.append(Frame(bytes(b), exp, "IPv4 header checksum wrong"))
            else:
                frames.append(Frame(data, exp, "plain"))
    # self-test: the independent parser must reproduce every expectation
    for n, fr in enumerate(frames, 1):
        got, _ = parse(fr.data)
        if fr.exp["ok"] != got["ok"] or (fr.exp["ok"] and got != fr.exp):
            sys.exit("crosscheck: INTERNAL: frame %d (%s): generator %s vs parser %s\n%s" % (
                n, fr.tag, fr.exp, got, fr.data.hex()))
        if fr.exp["ok"] and fr.tag.startswith(("plain", "IPv4 with", "Ethernet padding")):
            assert got["icrc_ok"], "scapy ICRC disagrees with zlib ICRC on frame %d" % n
    return frames


# --------------------------------------------------------------------------------------------
# Capture writers (by hand; independent of Scapy) and comparison.
# --------------------------------------------------------------------------------------------

def frame_time(i):
    return 1700000000 + i // 7, (i * 123457) % 1000000000  # seconds, nanoseconds


def write_pcap(path, frames, endian="<", nsec=False):
    magic = 0xA1B23C4D if nsec else 0xA1B2C3D4
    with open(path, "wb") as f:
        f.write(struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, 262144, 1))
        for i, fr in enumerate(frames):
            s, ns = frame_time(i)
            f.write(struct.pack(endian + "IIII", s, ns if nsec else ns // 1000, len(fr.data),
                                fr.wirelen or len(fr.data)))
            f.write(fr.data)


def _pad4(b):
    return b + bytes((-len(b)) & 3)


def _opt(e, code, val):
    return struct.pack(e + "HH", code, len(val)) + _pad4(val)


def _block(e, btype, body):
    ln = 12 + len(body)
    return struct.pack(e + "II", btype, ln) + body + struct.pack(e + "I", ln)


def write_pcapng(path, frames, endian="<", extras=False):
    e = endian
    out = []
    shb_opts = b""
    if extras:
        shb_opts = _opt(e, 1, b"crosscheck with comments") + _opt(e, 4, b"crosscheck.py") + \
            _opt(e, 0, b"")
    out.append(_block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1) + shb_opts))
    idb_opts = _opt(e, 9, b"\x06") + _opt(e, 0, b"")  # if_tsresol = 10^-6 (the default, stated)
    if extras:
        idb_opts = _opt(e, 2, b"eth0") + _opt(e, 9, b"\x09") + _opt(e, 0, b"")  # nanoseconds
    out.append(_block(e, 1, struct.pack(e + "HHI", 1, 0, 0) + idb_opts))
    if extras:
        out.append(_block(e, 1, struct.pack(e + "HHI", 1, 0, 0) + _opt(e, 2, b"eth1") +
                          _opt(e, 9, b"\x09") + _opt(e, 0, b"")))
        # A Name Resolution Block and an Interface Statistics Block: not packets, a reader skips them
        nrb = struct.pack(e + "HH", 1, 10) + _pad4(b"\x0a\x00\x00\x01host1\x00")
        out.append(_block(e, 4, nrb + struct.pack(e + "HH", 0, 0)))
        out.append(_block(e, 5, struct.pack(e + "III", 0, 0, 0) + _opt(e, 4, struct.pack(e + "Q", 0)) +
                          _opt(e, 0, b"")))
    for i, fr in enumerate(frames):
        s, ns = frame_time(i)
        ts = s * 10 ** 9 + ns if extras else s * 10 ** 6 + ns // 1000
        iface = (i & 1) if extras else 0
        body = struct.pack(e + "IIIII", iface, ts >> 32, ts & 0xFFFFFFFF, len(fr.data),
                           fr.wirelen or len(fr.data)) + _pad4(fr.data)
        if extras and i % 3 == 0:
            body += _opt(e, 1, b"frame comment %d" % i) + _opt(e, 0, b"")
        out.append(_block(e, 6, body))
    with open(path, "wb") as f:
        f.write(b"".join(out))


def strict_eq(a, b):
    """JSON equality with exact types (true != 1, 1 != 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(strict_eq(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b))
    return a == b


OPTIONAL_KEYS = {"reth", "aeth", "atomic", "atomic_ack", "imm", "ieth", "deth"}
CONTRACT_KEYS = {"frame", "ok", "error", "ip", "src", "dst", "sport", "dport", "vlan", "ecn", "opcode",
                 "op", "se", "m", "pad", "tver", "pkey", "fecn", "becn", "dqpn", "psn", "ackreq",
                 "payload_len", "icrc", "icrc_ok"} | OPTIONAL_KEYS


KEY_ORDER = ["frame", "ok", "error", "ip", "src", "dst", "sport", "dport", "vlan", "ecn", "opcode", "op",
             "se", "m", "pad", "tver", "pkey", "fecn", "becn", "dqpn", "psn", "ackreq", "payload_len",
             "reth", "aeth", "atomic", "atomic_ack", "imm", "ieth", "deth", "icrc", "icrc_ok"]


def ordered(o):
    """`o` with the contract's keys first, in the contract's order (for printing)."""
    if not isinstance(o, dict):
        return o
    keys = [k for k in KEY_ORDER if k in o] + sorted(k for k in o if k not in KEY_ORDER)
    return {k: o[k] for k in keys}


def compare(n, exp, got):
    """Differences between the expected object for frame n and the decoder's, as strings."""
    diffs = []
    if not isinstance(got, dict):
        return ["not a JSON object"]
    if not strict_eq(got.get("frame"), n):
        diffs.append("frame: expected %d, got %r" % (n, got.get("frame")))
    if not strict_eq(got.get("ok"), exp["ok"]):
        diffs.append("ok: expected %r, got %r" % (exp["ok"], got.get("ok", "<missing>")))
        if not exp["ok"]:
            return diffs
    if not exp["ok"]:
        if not isinstance(got.get("error"), str) or not got["error"]:
            diffs.append("error: expected a non-empty string, got %r" % got.get("error", "<missing>"))
        return diffs
    if "error" in got:
        diffs.append("error: present although ok is true (%r)" % got["error"])
    for k, v in exp.items():
        if k == "ok":
            continue
        if k not in got:
            diffs.append("%s: missing (expected %r)" % (k, v))
        elif not strict_eq(got[k], v):
            diffs.append("%s: expected %s, got %s" % (k, json.dumps(v), json.dumps(got[k])))
    for k in OPTIONAL_KEYS - exp.keys():
        if k in got:
            diffs.append("%s: present (%s) but opcode %s's layout has no such header" % (
                k, json.dumps(got[k]), exp["op"]))
    return diffs


def run_decoder(rocemu, path, json_mode=True, timeout=300):
    cmd = [rocemu, "decode"] + (["--json"] if json_mode else []) + [path]
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p, time.time() - t0


def parse_lines(stdout):
    objs = []
    for ln in stdout.decode("utf-8", "replace").splitlines():
        try:
            objs.append(json.loads(ln))
        except ValueError:
            objs.append(("unparsable line", ln))
    return objs


KINDS = ("plain, Ethernet-padded to 60", "plain", "masked", "flip", "Ethernet padding", "truncated",
         "not RoCEv2", "reserved opcode", "IPv4 with header options", "IPv4 header checksum wrong")


def tag_kind(tag):
    """The variant a frame's tag names, without its particulars."""
    for k in KINDS:
        if tag.startswith(k):
            return k
    return tag


class Tally:
    def __init__(self, max_report):
        self.passed = self.failed = 0
        self.max_report = max_report
        self.reported = 0
        self.by_tag = {}
        self.extra_keys = {}
        self.by_field = {}

    def ok(self):
        self.passed += 1

    def fail(self, text, tag="check"):
        self.failed += 1
        kind = tag_kind(tag)
        self.by_tag[kind] = self.by_tag.get(kind, 0) + 1
        if self.reported < self.max_report:
            print(text)
            self.reported += 1
        elif self.reported == self.max_report:
            print("... (more mismatches not shown; --max-report)")
            self.reported += 1


def check_frames(rocemu, frames, path, tally):
    p, dt = run_decoder(rocemu, path)
    print("decoder: %d frames in %.2fs, exit status %d" % (len(frames), dt, p.returncode))
    if p.returncode != 0:
        tally.fail("FAIL decoder exit status %d on a valid capture; stderr: %s" % (
            p.returncode, p.stderr.decode(errors="replace")[:2000]))
    objs = parse_lines(p.stdout)
    if len(objs) != len(frames):
        tally.fail("FAIL decoder printed %d lines for %d frames" % (len(objs), len(frames)))
    for n, fr in enumerate(frames, 1):
        got = objs[n - 1] if n <= len(objs) else "<no line>"
        diffs = compare(n, fr.exp, got) if isinstance(got, dict) else ["not a JSON object: %r" % (got,)]
        if isinstance(got, dict):
            for k in got.keys() - CONTRACT_KEYS:
                tally.extra_keys[k] = tally.extra_keys.get(k, 0) + 1
        if diffs:
            tally.fail("MISMATCH frame %d [%s]\n  %s\n  expected: %s\n  got:      %s\n  hex: %s" % (
                n, fr.tag, "\n  ".join(diffs), json.dumps(ordered(dict(fr.exp, frame=n))),
                json.dumps(got), fr.data.hex()), fr.tag)
            for d in diffs:
                field = d.split(":")[0]
                tally.by_field[field] = tally.by_field.get(field, 0) + 1
        else:
            tally.ok()
    return objs


def check_formats(rocemu, frames, workdir, tally):
    """Same frames in every capture format must give identical JSON; bad files must fail."""
    sel = frames[:60]
    variants = [
        ("pcap LE usec", lambda p: write_pcap(p, sel, "<", False)),
        ("pcap BE usec", lambda p: write_pcap(p, sel, ">", False)),
        ("pcap LE nsec", lambda p: write_pcap(p, sel, "<", True)),
        ("pcap BE nsec", lambda p: write_pcap(p, sel, ">", True)),
        ("pcapng LE", lambda p: write_pcapng(p, sel, "<")),
        ("pcapng BE", lambda p: write_pcapng(p, sel, ">")),
        ("pcapng LE, two interfaces, nsec, comments, NRB, ISB",
         lambda p: write_pcapng(p, sel, "<", True)),
        ("pcapng BE, two interfaces, nsec, comments, NRB, ISB",
         lambda p: write_pcapng(p, sel, ">", True)),
    ]
    reference = None
    for i, (name, writer) in enumerate(variants):
        path = os.path.join(workdir, "format%d.%s" % (i, "pcapng" if "pcapng" in name else "pcap"))
        writer(path)
        p, _ = run_decoder(rocemu, path)
        objs = parse_lines(p.stdout)
        problems = []
        if p.returncode != 0:
            problems.append("exit status %d, stderr %r" % (p.returncode, p.stderr[:500]))
        if len(objs) != len(sel):
            problems.append("%d lines for %d frames" % (len(objs), len(sel)))
        for n, fr in enumerate(sel, 1):
            if n <= len(objs) and compare(n, fr.exp, objs[n - 1]):
                problems.append("frame %d differs from expectation: %s" % (
                    n, "; ".join(compare(n, fr.exp, objs[n - 1]))))
                break
        if reference is None:
            reference = objs
        elif not strict_eq(objs, reference):
            problems.append("output differs from the %s output" % variants[0][0])
        if problems:
            tally.fail("FAIL format %s (%s): %s" % (name, path, "; ".join(problems)), "format")
        else:
            tally.ok()
            print("format %-62s identical JSON for %d frames" % (name, len(sel)))

    p, _ = run_decoder(rocemu, os.path.join(workdir, "format0.pcap"), json_mode=False)
    lines = p.stdout.decode(errors="replace").splitlines()
    if p.returncode != 0 or len(lines) != len(sel):
        tally.fail("FAIL human mode: exit status %d, %d lines for %d frames" % (
            p.returncode, len(lines), len(sel)), "format")
    else:
        tally.ok()
        print("human mode: %d lines for %d frames, e.g. %s" % (len(lines), len(sel), lines[0]))

    bad = {"missing file": os.path.join(workdir, "does-not-exist.pcap")}
    for name, content in [("empty file", b""), ("text file", b"this is not a capture file\n" * 4),
                          ("random bytes", random.Random(7).randbytes(200)),
                          ("ELF header", b"\x7fELF\x02\x01\x01" + bytes(57))]:
        path = os.path.join(workdir, name.replace(" ", "_") + ".bin")
        with open(path, "wb") as f:
            f.write(content)
        bad[name] = path
    for name, path in bad.items():
        for json_mode in (True, False):
            p, _ = run_decoder(rocemu, path, json_mode)
            mode = "--json" if json_mode else "human"
            if p.returncode == 0 or not p.stderr.strip():
                tally.fail("FAIL %s (%s): expected non-zero exit and a message on stderr, got exit %d, "
                           "stderr %r, stdout %r" % (name, mode, p.returncode, p.stderr[:200],
                                                     p.stdout[:200]), "format")
            else:
                tally.ok()
                if json_mode:
                    print("%-14s exit %d: %s" % (name, p.returncode,
                                                 p.stderr.decode(errors="replace").strip()[:100]))
    # informational: a capture whose last record is cut short (contract is silent)
    path = os.path.join(workdir, "cut_record.pcap")
    write_pcap(path, sel[:3])
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 5)
    p, _ = run_decoder(rocemu, path)
    print("info: pcap with its last record cut short: exit %d, %d lines, stderr %r" % (
        p.returncode, len(p.stdout.splitlines()), p.stderr.decode(errors="replace").strip()[:120]))


def selftest_reference(frames):
    """Check this script's frames with the rxe-peer reference verifier, when it is around."""
    ref = "/work/shared/reference/rxe-peer/icrc_check.py"
    if not os.path.exists(ref):
        print("selftest: %s not present, skipped" % ref)
        return True
    src = open(ref).read().split("\ntot = bad = 0")[0]
    ns = {}
    exec(compile(src, ref, "exec"), ns)
    good = bad = 0
    for fr in frames:
        if not fr.exp["ok"]:
            continue
        r = ns["check"](fr.data)
        if r is None:
            continue
        _, wire, calc = r
        if (wire == calc) == fr.exp["icrc_ok"]:
            good += 1
        else:
            bad += 1
    print("selftest: reference icrc_check agrees on %d frames, disagrees on %d" % (good, bad))
    return bad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rocemu", help="path to the rocemu binary")
    ap.add_argument("--count", type=int, default=DEFAULT_COUNT)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("CROSSCHECK_SEED", DEFAULT_SEED)))
    ap.add_argument("--keep", metavar="DIR", help="keep the captures and JSON here")
    ap.add_argument("--mode", choices=["all", "frames", "formats"], default="all")
    ap.add_argument("--max-report", type=int, default=20)
    ap.add_argument("--selftest", action="store_true",
                    help="only generate and verify the generator (no decoder needed)")
    a = ap.parse_args()
    if not a.selftest and not a.rocemu:
        ap.error("--rocemu is required (or --selftest)")
    if a.rocemu and not (os.path.isfile(a.rocemu) and os.access(a.rocemu, os.X_OK)):
        sys.exit("crosscheck: %s is not an executable" % a.rocemu)

    print("crosscheck: seed %d, %d frames (replay: --seed %d --count %d)" % (a.seed, a.count, a.seed,
                                                                            a.count))
    S = load_scapy()
    t0 = time.time()
    frames = generate(S, random.Random(a.seed), a.count)
    kinds = {}
    for fr in frames:
        k = tag_kind(fr.tag)
        kinds[k] = kinds.get(k, 0) + 1
    ops = {fr.exp["op"] for fr in frames if fr.exp["ok"]}
    print("generated in %.1fs: %s; %d/%d opcodes" % (
        time.time() - t0, ", ".join("%s %d" % kv for kv in sorted(kinds.items())), len(ops),
        len(OPCODES)))
    if a.selftest:
        ok = selftest_reference(frames)
        print("selftest: %s" % ("ok" if ok else "FAILED"))
        return 0 if ok else 1

    workdir = a.keep or tempfile.mkdtemp(prefix="crosscheck.")
    os.makedirs(workdir, exist_ok=True)
    tally = Tally(a.max_report)
    try:
        pcap = os.path.join(workdir, "frames.pcap")
        pkts = []
        for i, fr in enumerate(frames):
            r = S["Raw"](fr.data)
            s, ns = frame_time(i)
            r.time = s + (ns // 1000) / 1e6
            r.wirelen = fr.wirelen or len(fr.data)
            pkts.append(r)
        S["wrpcap"](pcap, pkts, linktype=1)
        with open(os.path.join(workdir, "expected.jsonl"), "w") as f:
            for n, fr in enumerate(frames, 1):
                f.write(json.dumps(ordered(dict(fr.exp, frame=n, tag=fr.tag))) + "\n")
        if a.mode in ("all", "frames"):
            objs = check_frames(a.rocemu, frames, pcap, tally)
            with open(os.path.join(workdir, "decoded.jsonl"), "w") as f:
                for o in objs:
                    f.write(json.dumps(o) + "\n")
        if a.mode in ("all", "formats"):
            check_formats(a.rocemu, frames, workdir, tally)
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if tally.by_tag:
        print("failures by kind: " + ", ".join("%s %d" % kv for kv in sorted(tally.by_tag.items())))
    if tally.by_field:
        print("frame mismatches by key: " + ", ".join(
            "%s %d" % kv for kv in sorted(tally.by_field.items(), key=lambda kv: -kv[1])))
    if tally.extra_keys:
        print("note: keys outside the contract: " + ", ".join(
            "%s (%d frames)" % kv for kv in sorted(tally.extra_keys.items())))
    print("crosscheck: seed %d, %.1fs" % (a.seed, time.time() - t0))
    print("crosscheck: %d passed, %d failed" % (tally.passed, tally.failed))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
