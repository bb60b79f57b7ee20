#!/usr/bin/env python3
"""Regenerate NAME.expected.jsonl for every capture in this folder (and its subfolders).

The expected values follow the `rocemu decode --json` contract (/work/shared/contracts.md at the time
of writing; see PROVENANCE.md). They are derived independently of RoCEmu's Rust code:

  * header fields come from Wireshark's own dissectors, read through `tshark -T json`
    (ip/ipv6, udp, vlan, and the infiniband BTH/RETH/AETH/AtomicETH/AtomicAckETH/ImmDt/IETH/DETH trees);
  * every one of those values is cross-checked against a small raw-bytes parser in this file; where the
    two disagree the raw bytes win and the disagreement is printed (NOTE lines on stdout);
  * what tshark 4.0 does not show is taken from the bytes: the FECN/BECN bits (tshark prints the
    whole BTH byte as `infiniband.reserved`, which is used where present), the layout of opcodes it does
    not know (0x81 CNP), and the ICRC verdict (tshark displays the ICRC but does not check it);
  * icrc_ok uses the RoCEv2 masking algorithm (zlib CRC-32 over 8 x 0xFF, the IP header with
    TOS/TTL/checksum or traffic class/flow label/hop limit set to ones, the UDP header with checksum set to
    ones, the BTH with its FECN/BECN byte set to ones, and the rest of the packet up to the ICRC; the four
    ICRC bytes are that value little-endian).
  * `ok`/`error` (structure only) are decided by the raw-bytes parser: not IP, not UDP 4791, truncated,
    unknown opcode, missing headers, pad larger than the payload. For non-RoCE frames only `ok` is meant
    to be compared; the error text is a short reason.

Usage: python3 make_expected.py            (needs tshark on PATH; deterministic; rewrites all *.expected.jsonl)
"""
import ipaddress
import json
import os
import struct
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------- opcode table (IBTA Vol 1, ch. 9, table 38)
# layout = extension headers after the BTH, in wire order. CNP's 16 reserved bytes are part of its layout.
HDR_LEN = {'RETH': 16, 'AETH': 4, 'ATOMIC': 28, 'ATOMIC_ACK': 8, 'IMM': 4, 'IETH': 4, 'DETH': 8,
           'FETH': 4, 'CNP_RSVD': 16}
_COMMON = {  # low 5 bits of the opcode -> (name, layout) for RC (0x00) and UC (0x20)
    0x00: ('SEND_FIRST', []), 0x01: ('SEND_MIDDLE', []), 0x02: ('SEND_LAST', []),
    0x03: ('SEND_LAST_WITH_IMMEDIATE', ['IMM']), 0x04: ('SEND_ONLY', []),
    0x05: ('SEND_ONLY_WITH_IMMEDIATE', ['IMM']),
    0x06: ('RDMA_WRITE_FIRST', ['RETH']), 0x07: ('RDMA_WRITE_MIDDLE', []), 0x08: ('RDMA_WRITE_LAST', []),
    0x09: ('RDMA_WRITE_LAST_WITH_IMMEDIATE', ['IMM']), 0x0A: ('RDMA_WRITE_ONLY', ['RETH']),
    0x0B: ('RDMA_WRITE_ONLY_WITH_IMMEDIATE', ['RETH', 'IMM']),
}
_RC_ONLY = {
    0x0C: ('RDMA_READ_REQUEST', ['RETH']), 0x0D: ('RDMA_READ_RESPONSE_FIRST', ['AETH']),
    0x0E: ('RDMA_READ_RESPONSE_MIDDLE', []), 0x0F: ('RDMA_READ_RESPONSE_LAST', ['AETH']),
    0x10: ('RDMA_READ_RESPONSE_ONLY', ['AETH']), 0x11: ('ACKNOWLEDGE', ['AETH']),
    0x12: ('ATOMIC_ACKNOWLEDGE', ['AETH', 'ATOMIC_ACK']), 0x13: ('COMPARE_SWAP', ['ATOMIC']),
    0x14: ('FETCH_ADD', ['ATOMIC']), 0x16: ('SEND_LAST_WITH_INVALIDATE', ['IETH']),
    0x17: ('SEND_ONLY_WITH_INVALIDATE', ['IETH']),
    0x1C: ('FLUSH', ['FETH', 'RETH']),            # IBA 1.5 (Linux ib_pack.h IB_OPCODE_FLUSH)
    0x1D: ('ATOMIC_WRITE', ['RETH']),             # IBA 1.5; its 8 data bytes are payload
}
OPCODES = {}
for k, v in _COMMON.items():
    OPCODES[0x00 | k] = ('RC_' + v[0], v[1])
    OPCODES[0x20 | k] = ('UC_' + v[0], v[1])
for k, v in _RC_ONLY.items():
    OPCODES[k] = ('RC_' + v[0], v[1])
OPCODES[0x64] = ('UD_SEND_ONLY', ['DETH'])
OPCODES[0x65] = ('UD_SEND_ONLY_WITH_IMMEDIATE', ['DETH', 'IMM'])
OPCODES[0x81] = ('CNP', ['CNP_RSVD'])

ROCE_PORT = 4791


# ---------------------------------------------------------------- pcap / pcapng reader
def read_frames(path):
    d = open(path, 'rb').read()
    magic = d[:4]
    if magic in (b'\xd4\xc3\xb2\xa1', b'\x4d\x3c\xb2\xa1', b'\xa1\xb2\xc3\xd4', b'\xa1\xb2\x3c\x4d'):
        e = '<' if magic[0] in (0xd4, 0x4d) else '>'
        linktype = struct.unpack(e + 'I', d[20:24])[0]
        assert linktype == 1, f'{path}: link type {linktype}, only Ethernet supported here'
        off, out = 24, []
        while off + 16 <= len(d):
            _, _, incl, _ = struct.unpack(e + 'IIII', d[off:off + 16])
            off += 16
            out.append(d[off:off + incl])
            off += incl
        return out
    raise SystemExit(f'{path}: not a classic pcap (this script only writes expectations for pcap)')


# ---------------------------------------------------------------- raw-bytes parser (independent check)
def parse_bytes(fr):
    """Return (result dict, ctx) for one Ethernet frame following the contract; ctx carries offsets."""
    if len(fr) < 14:
        return {'ok': False, 'error': 'truncated: Ethernet header'}, None
    off, vlan = 12, None
    et = struct.unpack('!H', fr[off:off + 2])[0]
    if et == 0x8100:
        if len(fr) < 18:
            return {'ok': False, 'error': 'truncated: VLAN tag'}, None
        vlan = struct.unpack('!H', fr[14:16])[0] & 0x0FFF
        et = struct.unpack('!H', fr[16:18])[0]
        off = 18
    else:
        off = 14
    ip_off = off
    if et == 0x0800:
        if len(fr) < off + 20:
            return {'ok': False, 'error': 'truncated: IPv4 header'}, None
        ihl = (fr[off] & 0x0F) * 4
        tot = struct.unpack('!H', fr[off + 2:off + 4])[0]
        if fr[off] >> 4 != 4 or ihl < 20:
            return {'ok': False, 'error': 'bad IPv4 header'}, None
        if tot > len(fr) - off:
            return {'ok': False, 'error': f'truncated: IPv4 total length {tot} > {len(fr) - off} captured'}, None
        frag = struct.unpack('!H', fr[off + 6:off + 8])[0]
        if fr[off + 9] != 17:
            return {'ok': False, 'error': 'not UDP 4791'}, None
        if frag & 0x3FFF:
            return {'ok': False, 'error': 'IPv4 fragment'}, None
        ipv, ecn = 'v4', fr[off + 1] & 3
        src, dst = str(ipaddress.IPv4Address(fr[off + 12:off + 16])), str(ipaddress.IPv4Address(fr[off + 16:off + 20]))
        udp_off, ip_end, iphdr_len = off + ihl, off + tot, ihl
    elif et == 0x86DD:
        if len(fr) < off + 40:
            return {'ok': False, 'error': 'truncated: IPv6 header'}, None
        plen = struct.unpack('!H', fr[off + 4:off + 6])[0]
        if 40 + plen > len(fr) - off:
            return {'ok': False, 'error': f'truncated: IPv6 payload length {plen} > {len(fr) - off - 40} captured'}, None
        if fr[off + 6] != 17:
            return {'ok': False, 'error': 'not UDP 4791'}, None
        ipv, ecn = 'v6', (fr[off + 1] >> 4) & 3
        src, dst = str(ipaddress.IPv6Address(fr[off + 8:off + 24])), str(ipaddress.IPv6Address(fr[off + 24:off + 40]))
        udp_off, ip_end, iphdr_len = off + 40, off + 40 + plen, 40
    else:
        return {'ok': False, 'error': 'not IP'}, None
    if ip_end - udp_off < 8:
        return {'ok': False, 'error': 'truncated: UDP header'}, None
    sport, dport, ulen = struct.unpack('!HHH', fr[udp_off:udp_off + 6])
    if dport != ROCE_PORT:
        return {'ok': False, 'error': 'not UDP 4791'}, None
    if ulen < 8 or udp_off + ulen > ip_end:
        return {'ok': False, 'error': f'truncated: UDP length {ulen} > {ip_end - udp_off} in IP'}, None
    bth = udp_off + 8
    end = udp_off + ulen                       # end of the RoCE packet (incl. ICRC)
    if end - bth < 12 + 4:
        return {'ok': False, 'error': 'truncated: BTH + ICRC'}, None
    opcode = fr[bth]
    if opcode not in OPCODES:
        return {'ok': False, 'error': f'unknown opcode 0x{opcode:02x}'}, None
    name, layout = OPCODES[opcode]
    hl = sum(HDR_LEN[h] for h in layout)
    if end - bth < 12 + hl + 4:
        return {'ok': False, 'error': f'truncated: {name} needs {12 + hl + 4} bytes after UDP, has {end - bth}'}, None
    b1 = fr[bth + 1]
    pad = (b1 >> 4) & 3
    payload_len = (end - bth) - 12 - hl - 4 - pad
    if payload_len < 0:
        return {'ok': False, 'error': f'pad count {pad} larger than the payload'}, None
    r = {'ok': True, 'ip': ipv, 'src': src, 'dst': dst, 'sport': sport, 'dport': dport, 'vlan': vlan,
         'ecn': ecn, 'opcode': opcode, 'op': name,
         'se': bool(b1 & 0x80), 'm': bool(b1 & 0x40), 'pad': pad, 'tver': b1 & 0x0F,
         'pkey': struct.unpack('!H', fr[bth + 2:bth + 4])[0],
         'fecn': bool(fr[bth + 4] & 0x80), 'becn': bool(fr[bth + 4] & 0x40),
         'dqpn': int.from_bytes(fr[bth + 5:bth + 8], 'big'),
         'psn': int.from_bytes(fr[bth + 9:bth + 12], 'big') & 0xFFFFFF,
         'ackreq': bool(fr[bth + 8] & 0x80),
         'payload_len': payload_len,
         'icrc': fr[end - 4:end].hex()}
    # ICRC (masked)
    ip = bytearray(fr[ip_off:ip_off + iphdr_len])
    if ipv == 'v4':
        ip[1] = 0xFF; ip[8] = 0xFF; ip[10:12] = b'\xff\xff'
    else:
        ip[0] |= 0x0F; ip[1:4] = b'\xff\xff\xff'; ip[7] = 0xFF
    udp = bytearray(fr[udp_off:udp_off + 8]); udp[6:8] = b'\xff\xff'
    body = bytearray(fr[bth:end - 4]); body[4] = 0xFF
    calc = zlib.crc32(b'\xff' * 8 + bytes(ip) + bytes(udp) + bytes(body)) & 0xFFFFFFFF
    r['icrc_ok'] = struct.pack('<I', calc) == fr[end - 4:end]
    # extension headers
    p = bth + 12
    for h in layout:
        b = fr[p:p + HDR_LEN[h]]
        if h == 'RETH':
            r['reth'] = {'va': int.from_bytes(b[0:8], 'big'), 'rkey': int.from_bytes(b[8:12], 'big'),
                         'len': int.from_bytes(b[12:16], 'big')}
        elif h == 'AETH':
            r['aeth'] = {'syndrome': b[0], 'msn': int.from_bytes(b[1:4], 'big')}
        elif h == 'ATOMIC':
            r['atomic'] = {'va': int.from_bytes(b[0:8], 'big'), 'rkey': int.from_bytes(b[8:12], 'big'),
                           'swap_add': int.from_bytes(b[12:20], 'big'), 'compare': int.from_bytes(b[20:28], 'big')}
        elif h == 'ATOMIC_ACK':
            r['atomic_ack'] = {'orig': int.from_bytes(b[0:8], 'big')}
        elif h == 'IMM':
            r['imm'] = int.from_bytes(b, 'big')
        elif h == 'IETH':
            r['ieth'] = int.from_bytes(b, 'big')
        elif h == 'DETH':
            r['deth'] = {'qkey': int.from_bytes(b[0:4], 'big'), 'sqpn': int.from_bytes(b[5:8], 'big')}
        p += HDR_LEN[h]
    return r, {'layout': layout}


# ---------------------------------------------------------------- tshark side
def tshark_json(path):
    out = subprocess.run(['tshark', '-n', '-r', path, '-T', 'json', '--no-duplicate-keys'],
                         check=True, capture_output=True).stdout
    return [p['_source']['layers'] for p in json.loads(out)]


def _i(s):
    return int(s, 0) if isinstance(s, str) else int(s)


def _b(s):
    return s in ('1', 'True', 'true', True)


def _hexbytes(s):
    return int(s.replace(':', ''), 16)


def _first(x):
    return x[0] if isinstance(x, list) else x


def from_tshark(L, raw, notes, tag):
    """Build the ok=true object from tshark's layers; fall back to/compare with the raw-bytes values."""
    r = {'frame': None, 'ok': True}
    got = {}
    if 'ip' in L:
        ipl = L['ip']
        got['ip'] = 'v4'
        got['src'], got['dst'] = ipl['ip.src'], ipl['ip.dst']
        got['ecn'] = _i(ipl['ip.dsfield_tree']['ip.dsfield.ecn'])
    elif 'ipv6' in L:
        ipl = L['ipv6']
        got['ip'] = 'v6'
        got['src'] = str(ipaddress.IPv6Address(ipl['ipv6.src']))   # RFC 5952 normal form
        got['dst'] = str(ipaddress.IPv6Address(ipl['ipv6.dst']))
        got['ecn'] = _i(ipl['ipv6.tclass_tree']['ipv6.tclass.ecn'])
    got['sport'] = _i(L['udp']['udp.srcport'])
    got['dport'] = _i(L['udp']['udp.dstport'])
    got['vlan'] = _i(_first(L['vlan']['vlan.id'])) if 'vlan' in L else None
    ib = L.get('infiniband', {})
    bt = ib.get('infiniband.bth_tree', {})
    if bt:
        got['opcode'] = _i(bt['infiniband.bth.opcode'])
        got['se'] = _b(bt['infiniband.bth.se'])
        got['m'] = _b(bt['infiniband.bth.m'])
        got['pad'] = _i(bt['infiniband.bth.padcnt'])
        got['tver'] = _i(bt['infiniband.bth.tver'])
        got['pkey'] = _i(bt['infiniband.bth.p_key'])
        if 'infiniband.reserved' in bt:        # tshark 4.0: the FECN/BECN/resv6 byte, shown as hex
            rb = int(_first(bt['infiniband.reserved']), 16)
            got['fecn'], got['becn'] = bool(rb & 0x80), bool(rb & 0x40)
        got['dqpn'] = _i(bt['infiniband.bth.destqp'])
        got['psn'] = _i(bt['infiniband.bth.psn'])
        got['ackreq'] = _b(bt['infiniband.bth.a'])
    # payload length from tshark's UDP length, tshark's pad count and the opcode's layout
    if 'opcode' in got and got['opcode'] in OPCODES:
        hl = sum(HDR_LEN[h] for h in OPCODES[got['opcode']][1])
        got['payload_len'] = _i(L['udp']['udp.length']) - 8 - 12 - hl - 4 - got['pad']
        got['op'] = OPCODES[got['opcode']][0]
    if 'infiniband.invariant.crc' in ib:
        got['icrc'] = '%08x' % _i(ib['infiniband.invariant.crc'])
    t = ib.get('infiniband.reth_tree')
    if t:
        got['reth'] = {'va': _i(t['infiniband.reth.va']), 'rkey': _i(t['infiniband.reth.r_key']),
                       'len': _i(t['infiniband.reth.dmalen'])}
    t = ib.get('infiniband.aeth_tree')
    if t:
        got['aeth'] = {'syndrome': _i(t['infiniband.aeth.syndrome']), 'msn': _i(t['infiniband.aeth.msn'])}
    t = ib.get('infiniband.atomiceth_tree')
    if t:
        got['atomic'] = {'va': _i(t['infiniband.reth.va']), 'rkey': _i(t['infiniband.reth.r_key']),
                         'swap_add': _i(t['infiniband.atomiceth.swapdt']),
                         'compare': _i(t['infiniband.atomiceth.cmpdt'])}
    t = ib.get('infiniband.atomicacketh_tree')
    if t:
        got['atomic_ack'] = {'orig': _i(t['infiniband.atomicacketh.origremdt'])}
    if 'infiniband.immdt' in ib:
        got['imm'] = _hexbytes(_first(ib['infiniband.immdt']))
    if 'infiniband.ieth' in ib:
        got['ieth'] = _hexbytes(_first(ib['infiniband.ieth']))
    t = ib.get('infiniband.deth_tree')
    if t:
        got['deth'] = {'qkey': _i(t['infiniband.deth.q_key']), 'sqpn': _i(t['infiniband.deth.srcqp'])}

    keys = ['ip', 'src', 'dst', 'sport', 'dport', 'vlan', 'ecn', 'opcode', 'op', 'se', 'm', 'pad', 'tver',
            'pkey', 'fecn', 'becn', 'dqpn', 'psn', 'ackreq', 'payload_len', 'icrc', 'icrc_ok',
            'reth', 'aeth', 'atomic', 'atomic_ack', 'imm', 'ieth', 'deth']
    for k in keys:
        if k not in raw:
            if k in got:
                notes.append(f'{tag}: tshark shows {k}={got[k]!r} but the opcode layout has no such header (dropped)')
            continue
        if k == 'icrc_ok':                       # tshark does not verify the ICRC: bytes only
            r[k] = raw[k]
            continue
        if k not in got:
            notes.append(f'{tag}: {k} not dissected by tshark, taken from the bytes ({raw[k]!r})')
            r[k] = raw[k]
        elif got[k] != raw[k]:
            notes.append(f'{tag}: tshark {k}={got[k]!r} disagrees with the bytes {raw[k]!r}: bytes kept')
            r[k] = raw[k]
        else:
            r[k] = got[k]
    return r


def process(path):
    frames = read_frames(path)
    layers = tshark_json(path)
    assert len(layers) == len(frames), f'{path}: tshark saw {len(layers)} frames, pcap has {len(frames)}'
    notes, lines = [], []
    rel = os.path.relpath(path, HERE)
    for n, (fr, L) in enumerate(zip(frames, layers), 1):
        raw, _ = parse_bytes(fr)
        tag = f'{rel}#{n}'
        if not raw['ok']:
            if 'infiniband' in L and raw['error'] != 'not UDP 4791':
                notes.append(f'{tag}: tshark dissects InfiniBand but the bytes say: {raw["error"]}')
            obj = {'frame': n, 'ok': False, 'error': raw['error']}
        else:
            if 'infiniband' not in L:
                notes.append(f'{tag}: tshark has no infiniband layer; every field from the bytes')
            obj = from_tshark(L, raw, notes, tag)
            obj['frame'] = n
        lines.append(json.dumps(obj, separators=(', ', ': ')))
    out = os.path.splitext(path)[0] + '.expected.jsonl'
    with open(out, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return rel, len(frames), sum(1 for l in lines if '"ok": true' in l), notes


def main():
    caps = []
    for root, dirs, files in os.walk(HERE):
        dirs.sort()
        caps += [os.path.join(root, f) for f in sorted(files) if f.endswith('.pcap')]
    allnotes = []
    for c in sorted(caps):
        rel, n, nroce, notes = process(c)
        print(f'{rel}: {n} frames, {nroce} RoCEv2')
        allnotes += notes
    # summarise repeated notes (same message, different frames)
    seen = {}
    for x in allnotes:
        f, msg = x.split(': ', 1)
        seen.setdefault(msg, []).append(f)
    for msg, fs in sorted(seen.items()):
        print(f'NOTE ({len(fs)} frame(s), e.g. {fs[0]}): {msg}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
