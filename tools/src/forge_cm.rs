//! Forged IB CM MADs, for hostile-peer tests (`rocemu forge-cm`, `scripts/hostile-cm-test`,
//! `tests/rdma_cm.rs`): REQs, DREQs and REJs from made-up sources, each in a RoCEv2 UD SEND to
//! the target's QP1 with the GSI Q_Key, headers and ICRC right, so that they reach its CM
//! rather than being dropped as malformed. What an attacker on the link can send; nothing here
//! keeps state or waits for an answer. [`flood`] sends many of them through a port, paced.
use rocemu_emulator::port::{Port, BURST};
use rocemu_wire::cm::{
    CmMadRepr, CmMessage, CmPath, CmaHdr, CommId, DreqRepr, Guid, MsgKind, RejReason, RejRepr,
    ReqRepr, ServiceId, ServiceType,
};
use rocemu_wire::eth::{EthernetRepr, Mac};
use rocemu_wire::frame::{pad_for, IpRepr};
use rocemu_wire::headers::{DethRepr, ExtHeaders};
use rocemu_wire::mad::{Tid, MAD_LEN};
use rocemu_wire::{BthRepr, FrameRepr, Opcode, PKey, Psn, QKey, Qpn, ROCEV2_UDP_PORT};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

/// What to forge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forged {
    /// A REQ for rdma_cm's TCP port `port`.
    Req { port: u16 },
    /// A DREQ naming a connection (comm ids) the target may not have.
    Dreq,
    /// A REJ naming a connection the target may not have.
    Rej,
}

fn gid(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The 256-byte MAD of `kind` from `src` to `dst`, with comm id `comm_id` and transaction id
/// `tid` (the REQ's local QPN and starting PSN are taken from them too).
pub fn mad(kind: Forged, src: IpAddr, dst: IpAddr, comm_id: u32, tid: u64) -> [u8; MAD_LEN] {
    let msg = match kind {
        Forged::Req { port } => {
            let mut pd = [0u8; 92];
            if let Ok(h) = CmaHdr::new(SocketAddr::new(src, 40000 + (comm_id % 20000) as u16), dst)
            {
                let _ = h.emit(&mut pd);
            }
            CmMessage::Req(ReqRepr {
                local_comm_id: CommId(comm_id),
                service_id: ServiceId::rdma_cm(rocemu_wire::cm::PortSpace::TCP, port),
                local_ca_guid: Guid(u64::from(comm_id) | 0x0200_0000_0000_0000),
                local_qkey: QKey(0),
                local_qpn: Qpn::new(comm_id & 0xff_ffff),
                responder_resources: 1,
                initiator_depth: 1,
                remote_cm_response_timeout: 20,
                transport_service_type: ServiceType::Rc,
                starting_psn: Psn::new((tid as u32) & 0xff_ffff),
                local_cm_response_timeout: 20,
                retry_count: 7,
                pkey: PKey::DEFAULT,
                path_mtu: 3,
                rnr_retry_count: 7,
                max_cm_retries: 15,
                primary_path: CmPath {
                    local_lid: 0xffff,
                    remote_lid: 0xffff,
                    local_gid: gid(src),
                    remote_gid: gid(dst),
                    hop_limit: 64,
                    local_ack_timeout: 19,
                    ..CmPath::default()
                },
                private_data: pd,
                ..ReqRepr::default()
            })
        }
        Forged::Dreq => CmMessage::Dreq(DreqRepr {
            local_comm_id: CommId(comm_id),
            remote_comm_id: CommId(comm_id.rotate_left(16) | 1),
            remote_qpn: Qpn::new(comm_id & 0xff_ffff),
            ..DreqRepr::default()
        }),
        Forged::Rej => CmMessage::Rej(RejRepr {
            local_comm_id: CommId(comm_id),
            remote_comm_id: CommId(comm_id.rotate_left(16) | 1),
            message_rejected: MsgKind::Rep,
            reason: RejReason::CONSUMER_DEFINED,
            ..RejRepr::default()
        }),
    };
    let mut b = [0u8; MAD_LEN];
    CmMadRepr::new(Tid(tid), msg)
        .emit(&mut b)
        .expect("a CM MAD fits in 256 bytes");
    b
}

/// `mad` as a RoCEv2 UD SEND from (`src_mac`, `src`) QP1 to (`dst_mac`, `dst`) QP1, ICRC
/// computed: the frame's bytes.
pub fn frame(src_mac: Mac, src: IpAddr, dst_mac: Mac, dst: IpAddr, mad: &[u8; MAD_LEN]) -> Vec<u8> {
    let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, Qpn::GSI, Psn::new(0));
    bth.pad = pad_for(MAD_LEN);
    let r = FrameRepr {
        eth: EthernetRepr {
            dst: dst_mac,
            src: src_mac,
            vlan: None,
            ethertype: 0,
        },
        ip: IpRepr::roce(src, dst, 0, 64, 0),
        sport: 49152,
        dport: ROCEV2_UDP_PORT,
        bth,
        ext: ExtHeaders {
            deth: Some(DethRepr {
                qkey: QKey::GSI,
                src_qpn: Qpn::GSI,
                resv: 0,
            }),
            ..ExtHeaders::default()
        },
    };
    let mut buf = vec![0u8; r.frame_len(MAD_LEN)];
    let n = r
        .emit_with_payload(&mut buf, mad)
        .expect("a UD SEND of one MAD fits its buffer");
    buf.truncate(n);
    buf
}

/// A source address for forged frame `i`: 10.(200..=254).x.y in IPv4 (so never the target's
/// own subnet in the tests), or 2001:db8::/32 in IPv6 (documentation addresses), spread by a
/// multiplicative hash of `i` and `salt`.
pub fn source(i: u32, salt: u32, v6: bool) -> IpAddr {
    let h = (i ^ salt).wrapping_mul(0x9e37_79b9).rotate_left(13) ^ salt;
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            0xbad,
            0,
            0,
            0,
            (h >> 16) as u16,
            h as u16,
        ))
    } else {
        let b = h.to_be_bytes();
        IpAddr::from([10, 200 + b[0] % 55, b[1], b[2].max(1)])
    }
}

/// A flood of forged MADs: `reqs` REQs, then `dreqs` DREQs, then `rejs` REJs, each from its own
/// made-up source ([`source`]) and comm id, to `to` (at `to_mac`).
#[derive(Debug, Clone)]
pub struct Flood {
    pub to: IpAddr,
    pub to_mac: Mac,
    /// The rdma_cm port the REQs ask for.
    pub port: u16,
    pub reqs: u32,
    pub dreqs: u32,
    pub rejs: u32,
    /// Varies the source addresses and ids between runs.
    pub seed: u32,
    /// Frames per second at most (0: as fast as the port takes them).
    pub pps: u64,
}

/// The source MAC of every forged frame: locally administered, no one's.
pub const FORGED_MAC: Mac = Mac([0x02, 0x66, 0x6f, 0x72, 0x67, 0x65]);

/// Sends `f` through `port` in bursts, paced to `f.pps`, and flushes it. Fails when the port
/// takes no frame for 10,000 bursts in a row (about a second).
pub fn flood(port: &mut dyn Port, f: &Flood) -> Result<(), String> {
    let v6 = f.to.is_ipv6();
    let total = u64::from(f.reqs) + u64::from(f.dreqs) + u64::from(f.rejs);
    let kind = |i: u64| {
        if i < u64::from(f.reqs) {
            Forged::Req { port: f.port }
        } else if i < u64::from(f.reqs) + u64::from(f.dreqs) {
            Forged::Dreq
        } else {
            Forged::Rej
        }
    };
    let t = Instant::now();
    let (mut next, mut sent, mut stalls) = (0u64, 0u64, 0u32);
    while sent < total {
        if let Some(due) = (sent * 1_000_000_000).checked_div(f.pps) {
            let el = t.elapsed().as_nanos() as u64;
            if el < due {
                std::thread::sleep(Duration::from_nanos((due - el).min(1_000_000)));
                continue;
            }
        }
        let n = port.tx_burst(BURST, &mut |buf| {
            if next >= total {
                return None;
            }
            let i = next as u32;
            let src = source(i, f.seed, v6);
            let id = i.wrapping_mul(2_654_435_761) ^ f.seed | 1;
            let fr = frame(
                FORGED_MAC,
                src,
                f.to_mac,
                f.to,
                &mad(kind(next), src, f.to, id, u64::from(id)),
            );
            buf.get_mut(..fr.len())?.copy_from_slice(&fr);
            next += 1;
            Some(fr.len())
        });
        port.flush();
        sent = next;
        if n == 0 {
            stalls += 1;
            if stalls > 10_000 {
                return Err("the socket takes no more frames".into());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forged_req_parses_as_one_with_a_good_icrc() {
        let (s, d): (IpAddr, IpAddr) = ("10.201.3.4".parse().unwrap(), "10.8.0.1".parse().unwrap());
        let m = mad(Forged::Req { port: 7174 }, s, d, 77, 5);
        let f = frame(Mac([2, 9, 9, 9, 9, 9]), s, Mac([2, 0, 0, 0, 8, 1]), d, &m);
        let p = rocemu_wire::parse_frame(&f).unwrap();
        assert!(p.icrc_ok());
        assert_eq!(p.ip.src(), s);
        let g = rocemu_wire::mad::gsi_payload(&p).unwrap();
        let CmMessage::Req(r) = CmMadRepr::parse(g).unwrap().msg else {
            panic!("not a REQ");
        };
        assert_eq!(r.local_comm_id, CommId(77));
        for k in [Forged::Dreq, Forged::Rej] {
            assert!(CmMadRepr::parse(&mad(k, s, d, 9, 9)).is_ok());
        }
    }
}
