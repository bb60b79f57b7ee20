#!/usr/bin/env python3
"""Regenerate cm_expected.txt: the fields of every IB CM MAD in the captures of this folder and in
../rxe/rdmacm_*.pcap, derived independently of RoCEmu's Rust code (see PROVENANCE.md here).

  * Every value comes from Wireshark's InfiniBand dissector, read through `tshark -T json`, where
    tshark 4.0 dissects it: the common MAD header; REQ, REP, RTU, DREQ, DREP and REJ fields; the
    rdma_cm "IP CM" private-data header of a REQ.
  * Every value is also read by a small raw-bytes parser in this file, written from IBTA Vol. 1
    12.6 and Annex A11 (and Linux's include/rdma/ibta_vol1_c12.h). Where tshark and the bytes
    disagree, the bytes win and a NOTE is printed.
  * What tshark 4.0 does not dissect (MRA, SIDR_REQ, SIDR_REP bodies; reserved fields it folds
    away; private data beyond its hex dump) comes from the bytes alone.

Output: one line per CM MAD, `<capture> <frame> <MSG> key=value ...`, integers in hex, booleans
as 0x0/0x1, GIDs and addresses as 32 hex digits, and private data and ARI as hex with their
trailing zero bytes left out (empty when all zero). Keys are the field names of
rocemu_wire::cm's Repr structs; `p.`/`a.` prefix the primary/alternate path, `cma.` the
rdma_cm header, `mad.` the common MAD header.

Usage: python3 make_cm_expected.py   (needs tshark on PATH; deterministic)
"""
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from make_expected import read_frames  # noqa: E402  (the shared pcap reader)

ATTR = {0x10: 'REQ', 0x11: 'MRA', 0x12: 'REJ', 0x13: 'REP', 0x14: 'RTU', 0x15: 'DREQ',
        0x16: 'DREP', 0x17: 'SIDR_REQ', 0x18: 'SIDR_REP'}


def h(v):
    return '0x%x' % v


def z(b):
    """Private data, ARI: hex without the trailing zero bytes."""
    return bytes(b).rstrip(b'\0').hex()


def bits(word, size, msb, width):
    """IBTA bit numbering: `width` bits, `msb` bits below the most significant bit of a word."""
    return (word >> (size - msb - width)) & ((1 << width) - 1)


def mad_of(fr):
    """The 256-byte MAD of a UD SEND_ONLY to QP1, or None."""
    et = struct.unpack('>H', fr[12:14])[0]
    off = 14
    if et == 0x8100:
        et = struct.unpack('>H', fr[16:18])[0]
        off = 18
    if et == 0x0800:
        off += (fr[off] & 0x0f) * 4
    elif et == 0x86dd:
        off += 40
    else:
        return None
    if struct.unpack('>H', fr[off + 2:off + 4])[0] != 4791:
        return None
    bth = off + 8
    if fr[bth] != 0x64 or struct.unpack('>I', fr[bth + 4:bth + 8])[0] & 0xffffff != 1:
        return None
    return fr[bth + 20:bth + 20 + 256]


def path(d, o, pre, r):
    r[pre + 'local_lid'] = h(struct.unpack('>H', d[o:o + 2])[0])
    r[pre + 'remote_lid'] = h(struct.unpack('>H', d[o + 2:o + 4])[0])
    r[pre + 'local_gid'] = d[o + 4:o + 20].hex()
    r[pre + 'remote_gid'] = d[o + 20:o + 36].hex()
    w = struct.unpack('>I', d[o + 36:o + 40])[0]
    r[pre + 'flow_label'] = h(bits(w, 32, 0, 20))
    r[pre + 'resv_rate'] = h(bits(w, 32, 20, 6))
    r[pre + 'packet_rate'] = h(bits(w, 32, 26, 6))
    r[pre + 'traffic_class'] = h(d[o + 40])
    r[pre + 'hop_limit'] = h(d[o + 41])
    r[pre + 'sl'] = h(bits(d[o + 42], 8, 0, 4))
    r[pre + 'subnet_local'] = h(bits(d[o + 42], 8, 4, 1))
    r[pre + 'resv_sl'] = h(bits(d[o + 42], 8, 5, 3))
    r[pre + 'local_ack_timeout'] = h(bits(d[o + 43], 8, 0, 5))
    r[pre + 'resv_ack'] = h(bits(d[o + 43], 8, 5, 3))


def cma(pd, r):
    r['cma.cma_version'] = h(pd[0])
    r['cma.ip_version'] = h(pd[1] >> 4)
    r['cma.resv'] = h(pd[1] & 0x0f)
    r['cma.src_port'] = h(struct.unpack('>H', pd[2:4])[0])
    r['cma.src_addr'] = pd[4:20].hex()
    r['cma.dst_addr'] = pd[20:36].hex()


def from_bytes(mad):
    """Every field of a CM MAD, from the bytes (IBTA 13.4.2 and 12.6)."""
    r = {}
    (bv, cls, cv, meth, st, cs, tid, aid, resv, amod) = struct.unpack('>BBBBHHQHHI', mad[:24])
    for k, v in (('base_version', bv), ('mgmt_class', cls), ('class_version', cv), ('method', meth),
                 ('status', st), ('class_specific', cs), ('tid', tid), ('attr_id', aid),
                 ('resv', resv), ('attr_mod', amod)):
        r['mad.' + k] = h(v)
    d = mad[24:]
    u32 = lambda o: struct.unpack('>I', d[o:o + 4])[0]  # noqa: E731
    u16 = lambda o: struct.unpack('>H', d[o:o + 2])[0]  # noqa: E731
    u64 = lambda o: struct.unpack('>Q', d[o:o + 8])[0]  # noqa: E731
    name = ATTR[aid]
    if name == 'SIDR_REQ':
        r['request_id'] = h(u32(0))
        r['pkey'] = h(u16(4))
        r['resv6'] = h(u16(6))
        r['service_id'] = h(u64(8))
        r['private_data'] = z(d[16:232])
        cma(d[16:], r)
        return name, r
    if name == 'SIDR_REP':
        r['request_id'] = h(u32(0))
        r['status'] = h(d[4])
        r['additional_info_len'] = h(d[5])
        r['resv6'] = h(u16(6))
        r['qpn'] = h(bits(u32(8), 32, 0, 24))
        r['resv_qpn'] = h(bits(u32(8), 32, 24, 8))
        r['service_id'] = h(u64(12))
        r['qkey'] = h(u32(20))
        r['additional_info'] = z(d[24:96])
        r['private_data'] = z(d[96:232])
        return name, r
    r['local_comm_id'] = h(u32(0))
    if name == 'REQ':
        r['resv4'] = h(u32(4))
        r['service_id'] = h(u64(8))
        r['local_ca_guid'] = h(u64(16))
        r['resv24'] = h(u32(24))
        r['local_qkey'] = h(u32(28))
        r['local_qpn'] = h(bits(u32(32), 32, 0, 24))
        r['responder_resources'] = h(bits(u32(32), 32, 24, 8))
        r['local_eecn'] = h(bits(u32(36), 32, 0, 24))
        r['initiator_depth'] = h(bits(u32(36), 32, 24, 8))
        r['remote_eecn'] = h(bits(u32(40), 32, 0, 24))
        r['remote_cm_response_timeout'] = h(bits(u32(40), 32, 24, 5))
        r['transport_service_type'] = h(bits(u32(40), 32, 29, 2))
        r['end_to_end_flow_control'] = h(bits(u32(40), 32, 31, 1))
        r['starting_psn'] = h(bits(u32(44), 32, 0, 24))
        r['local_cm_response_timeout'] = h(bits(u32(44), 32, 24, 5))
        r['retry_count'] = h(bits(u32(44), 32, 29, 3))
        r['pkey'] = h(u16(48))
        r['path_mtu'] = h(bits(d[50], 8, 0, 4))
        r['rdc_exists'] = h(bits(d[50], 8, 4, 1))
        r['rnr_retry_count'] = h(bits(d[50], 8, 5, 3))
        r['max_cm_retries'] = h(bits(d[51], 8, 0, 4))
        r['srq'] = h(bits(d[51], 8, 4, 1))
        r['extended_transport_type'] = h(bits(d[51], 8, 5, 3))
        path(d, 52, 'p.', r)
        path(d, 96, 'a.', r)
        r['private_data'] = z(d[140:232])
        cma(d[140:], r)
        return name, r
    r['remote_comm_id'] = h(u32(4))
    if name in ('RTU', 'DREP'):
        r['private_data'] = z(d[8:232])
    elif name == 'DREQ':
        r['remote_qpn'] = h(bits(u32(8), 32, 0, 24))
        r['resv_qpn'] = h(bits(u32(8), 32, 24, 8))
        r['private_data'] = z(d[12:232])
    elif name == 'MRA':
        r['message_mraed'] = h(bits(d[8], 8, 0, 2))
        r['resv8'] = h(bits(d[8], 8, 2, 6))
        r['service_timeout'] = h(bits(d[9], 8, 0, 5))
        r['resv9'] = h(bits(d[9], 8, 5, 3))
        r['private_data'] = z(d[10:232])
    elif name == 'REJ':
        r['message_rejected'] = h(bits(d[8], 8, 0, 2))
        r['resv8'] = h(bits(d[8], 8, 2, 6))
        r['reject_info_len'] = h(bits(d[9], 8, 0, 7))
        r['resv9'] = h(bits(d[9], 8, 7, 1))
        r['reason'] = h(u16(10))
        r['ari'] = z(d[12:84])
        r['private_data'] = z(d[84:232])
    elif name == 'REP':
        r['local_qkey'] = h(u32(8))
        r['local_qpn'] = h(bits(u32(12), 32, 0, 24))
        r['resv_qpn'] = h(bits(u32(12), 32, 24, 8))
        r['local_eecn'] = h(bits(u32(16), 32, 0, 24))
        r['resv_eecn'] = h(bits(u32(16), 32, 24, 8))
        r['starting_psn'] = h(bits(u32(20), 32, 0, 24))
        r['resv_psn'] = h(bits(u32(20), 32, 24, 8))
        r['responder_resources'] = h(d[24])
        r['initiator_depth'] = h(d[25])
        r['target_ack_delay'] = h(bits(d[26], 8, 0, 5))
        r['failover_accepted'] = h(bits(d[26], 8, 5, 2))
        r['end_to_end_flow_control'] = h(bits(d[26], 8, 7, 1))
        r['rnr_retry_count'] = h(bits(d[27], 8, 0, 3))
        r['srq'] = h(bits(d[27], 8, 3, 1))
        r['resv27'] = h(bits(d[27], 8, 4, 4))
        r['local_ca_guid'] = h(u64(28))
        r['private_data'] = z(d[36:232])
    return name, r


# tshark 4.0 field -> (our key, converter). Converters turn tshark's display into our format.
def _int(s):
    return h(int(s, 0))


def _hexbytes(s):
    return s.replace(':', '')


def _zbytes(s):
    return z(bytes.fromhex(_hexbytes(s)))


def _v4gid(s):
    return (b'\0' * 10 + b'\xff\xff' + bytes(int(x) for x in s.split('.'))).hex()


def _v4cma(s):
    return (b'\0' * 12 + bytes(int(x) for x in s.split('.'))).hex()


def _v6(s):
    import ipaddress
    return ipaddress.IPv6Address(s).packed.hex()


MAD_FIELDS = {
    'infiniband.mad.baseversion': 'mad.base_version', 'infiniband.mad.mgmtclass': 'mad.mgmt_class',
    'infiniband.mad.classversion': 'mad.class_version', 'infiniband.mad.method': 'mad.method',
    'infiniband.mad.status': 'mad.status', 'infiniband.mad.classspecific': 'mad.class_specific',
    'infiniband.mad.transactionid': 'mad.tid', 'infiniband.mad.attributeid': 'mad.attr_id',
    'infiniband.mad.attributemodifier': 'mad.attr_mod',
}
REQ_FIELDS = {
    'infiniband.cm.req': 'local_comm_id', 'infiniband.cm.req.serviceid': 'service_id',
    'infiniband.cm.req.localcaguid': 'local_ca_guid', 'infiniband.cm.req.localqkey': 'local_qkey',
    'infiniband.cm.req.localqpn': 'local_qpn', 'infiniband.cm.req.responderres': 'responder_resources',
    'infiniband.cm.req.localeecn': 'local_eecn', 'infiniband.cm.req.initdepth': 'initiator_depth',
    'infiniband.cm.req.remoteeecn': 'remote_eecn',
    'infiniband.cm.req.remoteresptout': 'remote_cm_response_timeout',
    'infiniband.cm.req.transpsvctype': 'transport_service_type',
    'infiniband.cm.req.e2eflowctrl': 'end_to_end_flow_control',
    'infiniband.cm.req.startpsn': 'starting_psn',
    'infiniband.cm.req.localresptout': 'local_cm_response_timeout',
    'infiniband.cm.req.retrcount': 'retry_count', 'infiniband.cm.req.pkey': 'pkey',
    'infiniband.cm.req.pppmtu': 'path_mtu', 'infiniband.cm.req.rdcexist': 'rdc_exists',
    'infiniband.cm.req.rnrretrcount': 'rnr_retry_count', 'infiniband.cm.req.maxcmretr': 'max_cm_retries',
    'infiniband.cm.req.srq': 'srq', 'infiniband.cm.req.ext_transport': 'extended_transport_type',
    'infiniband.cm.req.ip_cm.majv': None, 'infiniband.cm.req.ip_cm.minv': None,
    'infiniband.cm.req.ip_cm.ipv': 'cma.ip_version', 'infiniband.cm.req.ip_cm.reserved': 'cma.resv',
    'infiniband.cm.req.ip_cm.sport': 'cma.src_port',
}
for side, pre in (('prim', 'p.'), ('alt', 'a.')):
    REQ_FIELDS.update({
        f'infiniband.cm.req.{side}_locallid': pre + 'local_lid',
        f'infiniband.cm.req.{side}_remotelid': pre + 'remote_lid',
        f'infiniband.cm.req.{side}_flowlabel': pre + 'flow_label',
        f'infiniband.cm.req.{side}_reserved0': pre + 'resv_rate',
        f'infiniband.cm.req.{side}_pktrate': pre + 'packet_rate',
        f'infiniband.cm.req.{side}_tfcclass': pre + 'traffic_class',
        f'infiniband.cm.req.{side}_hoplim': pre + 'hop_limit',
        f'infiniband.cm.req.{side}_sl': pre + 'sl',
        f'infiniband.cm.req.{side}_subnetlocal': pre + 'subnet_local',
        f'infiniband.cm.req.{side}_reserved1': pre + 'resv_sl',
        f'infiniband.cm.req.{side}_localacktout': pre + 'local_ack_timeout',
        f'infiniband.cm.req.{side}_reserved2': pre + 'resv_ack',
    })
SPECIAL = {  # fields whose display is not a plain integer
    'infiniband.cm.req.prim_localgid_ipv4': ('p.local_gid', _v4gid),
    'infiniband.cm.req.prim_remotegid_ipv4': ('p.remote_gid', _v4gid),
    'infiniband.cm.req.prim_localgid': ('p.local_gid', _v6),
    'infiniband.cm.req.prim_remotegid': ('p.remote_gid', _v6),
    'infiniband.cm.req.alt_localgid': ('a.local_gid', _hexbytes),
    'infiniband.cm.req.alt_remotegid': ('a.remote_gid', _hexbytes),
    'infiniband.cm.req.ip_cm.sip4': ('cma.src_addr', _v4cma),
    'infiniband.cm.req.ip_cm.dip4': ('cma.dst_addr', _v4cma),
    'infiniband.cm.req.ip_cm.sip6': ('cma.src_addr', _v6),
    'infiniband.cm.req.ip_cm.dip6': ('cma.dst_addr', _v6),
    'infiniband.cm.rep.private': ('private_data', _zbytes),
    'infiniband.cm.rtu.private': ('private_data', _zbytes),
    'infiniband.cm.dreq.private': ('private_data', _zbytes),
    'infiniband.cm.drsp.private': ('private_data', _zbytes),
    'infiniband.cm.rej.private': ('private_data', _zbytes),
    'infiniband.cm.rej.ari': ('ari', _zbytes),
}
OTHER_FIELDS = {
    'infiniband.cm.rep': 'local_comm_id', 'infiniband.cm.rep.remotecommid': 'remote_comm_id',
    'infiniband.cm.rep.localqkey': 'local_qkey', 'infiniband.cm.rep.localqpn': 'local_qpn',
    'infiniband.cm.rep.localeecn': 'local_eecn', 'infiniband.cm.rep.startpsn': 'starting_psn',
    'infiniband.cm.rep.respres': 'responder_resources', 'infiniband.cm.rep.initdepth': 'initiator_depth',
    'infiniband.cm.rep.tgtackdelay': 'target_ack_delay', 'infiniband.cm.rep.failoveracc': 'failover_accepted',
    'infiniband.cm.rep.e2eflowctrl': 'end_to_end_flow_control',
    'infiniband.cm.rep.rnrretrcount': 'rnr_retry_count', 'infiniband.cm.rep.srq': 'srq',
    'infiniband.cm.rep.reserved': 'resv27', 'infiniband.cm.rep.localcaguid': 'local_ca_guid',
    'infiniband.cm.rtu.localcommid': 'local_comm_id', 'infiniband.cm.rtu.remotecommid': 'remote_comm_id',
    'infiniband.cm.dreq.localcommid': 'local_comm_id', 'infiniband.cm.dreq.remotecommid': 'remote_comm_id',
    'infiniband.cm.req.remoteqpneecn': 'remote_qpn',
    'infiniband.cm.drsp.localcommid': 'local_comm_id', 'infiniband.cm.drsp.remotecommid': 'remote_comm_id',
    'infiniband.cm.rej.localcommid': 'local_comm_id', 'infiniband.cm.rej.remotecommid': 'remote_comm_id',
    'infiniband.cm.rej.msgrej': 'message_rejected', 'infiniband.cm.rej.reserved0': 'resv8',
    'infiniband.cm.rej.rejinfolen': 'reject_info_len', 'infiniband.cm.rej.reserved1': 'resv9',
    'infiniband.cm.rej.reason': 'reason',
}


def walk(o, out):
    if isinstance(o, dict):
        for k, v in o.items():
            if isinstance(v, dict):
                walk(v, out)
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                walk(v, out)
            else:
                out.append((k, v))
    elif isinstance(o, list):
        for x in o:
            walk(x, out)


def from_tshark(layers):
    """Our keys -> values, for every field tshark 4.0 dissects."""
    got = {}
    if 'infiniband' not in layers:
        return got
    out = []
    walk(layers['infiniband'], out)
    for k, v in out:
        if isinstance(v, list):
            v = v[0]
        if k in SPECIAL:
            key, conv = SPECIAL[k]
            got[key] = conv(v)
        else:
            key = MAD_FIELDS.get(k) or REQ_FIELDS.get(k) or OTHER_FIELDS.get(k)
            if key:
                got[key] = _int(v)
    return got


def process(path, rel, notes, lines):
    frames = read_frames(path)
    out = subprocess.run(['tshark', '-r', path, '-T', 'json'], capture_output=True, check=True).stdout
    layers = [p['_source']['layers'] for p in json.loads(out)]
    assert len(layers) == len(frames)
    count = 0
    for n, (fr, L) in enumerate(zip(frames, layers), 1):
        mad = mad_of(fr)
        if mad is None or mad[1] != 0x07:
            continue
        name, raw = from_bytes(mad)
        ts = from_tshark(L)
        for k, v in ts.items():
            if k not in raw:
                notes.append(f'{rel}#{n} {name}: tshark field {k}={v} has no byte counterpart')
            elif raw[k] != v:
                notes.append(f'{rel}#{n} {name}: tshark {k}={v} disagrees with the bytes {raw[k]}: bytes kept')
        missing = [k for k in raw if k not in ts]
        if missing and name in ('REQ', 'REP', 'RTU', 'DREQ', 'DREP', 'REJ'):
            notes.append(f'{rel}#{n} {name}: from the bytes alone: {" ".join(sorted(missing))}')
        lines.append(f'{rel} {n} {name} ' + ' '.join(f'{k}={v}' for k, v in raw.items()))
        count += 1
    return count


def main():
    caps = [(os.path.join(HERE, f), f) for f in sorted(os.listdir(HERE)) if f.endswith('.pcap')]
    rxe = os.path.join(os.path.dirname(HERE), 'rxe')
    caps += [(os.path.join(rxe, f), '../rxe/' + f) for f in sorted(os.listdir(rxe))
             if f.startswith('rdmacm_') and f.endswith('.pcap')]
    notes, lines = [], []
    for path, rel in caps:
        print(f'{rel}: {process(path, rel, notes, lines)} CM MADs')
    with open(os.path.join(HERE, 'cm_expected.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    seen = {}
    for x in notes:
        where, msg = x.split(' ', 1)
        msg = msg.split(': ', 1)[1] if msg.count(': ') else msg
        seen.setdefault(msg, []).append(where)
    for msg, ws in sorted(seen.items()):
        print(f'NOTE ({len(ws)} MAD(s), e.g. {ws[0]}): {msg}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
