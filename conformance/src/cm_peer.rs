//! The peer as an rdma_cm client: the active side of the IB CM (IBTA Vol. 1 12.6, unverified: REQ,
//! REP, RTU, DREQ, DREP) crafted message by message with `rocemu-wire` and sent from the peer's own
//! address to the device's QP1, the way librdmacm's `rdma_connect` and `rdma_disconnect` on Linux
//! fill them (`wire/tests/data/cm/`, `rocemu_emulator::cm::CmAgent::connect`).
//!
//! The device answers on the wire; nothing here asks its agent. Waiting is bounded: each
//! message is sent again after [`Patience::wait`] without an answer, at most
//! [`Patience::tries`] times (the device's CM may be slow to accept, as `rdma_rxe` in a TCG
//! guest is). An MRA ("wait, an answer is coming") from the device is taken as a reason to
//! keep waiting, not as an answer; a DREQ from it gets its DREP, whichever connection it names,
//! so that a device's CM never keeps retransmitting to the peer.
use crate::peer::Peer;
use rocemu_wire::cm::{
    rdma_cm_flow_label, CmMadRepr, CmMessage, CmPath, CmaHdr, CommId, DreqRepr, Guid, PortSpace,
    RepRepr, ReqRepr, RtuRepr, ServiceId, ServiceType,
};
use rocemu_wire::mad::{Tid, MAD_LEN};
use rocemu_wire::{PKey, Psn, QKey, Qpn};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// How long to wait for each answer, and how often to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    pub wait: Duration,
    pub tries: u32,
}

impl Patience {
    /// From the peer's settle time: 5 settle times per try (at least 250 ms), 4 tries. With
    /// `--settle-ms 400` against a TCG guest that is 2 s per try, 8 s in all per message.
    pub fn for_settle(settle: Duration) -> Patience {
        Patience {
            wait: (settle * 5).max(Duration::from_millis(250)),
            tries: 4,
        }
    }
    fn total(&self) -> Duration {
        self.wait * self.tries
    }
}

/// What the active side offers in its REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    pub comm_id: CommId,
    /// The active side's CA GUID: with the communication ID it names the connection for the
    /// passive side's CM.
    pub guid: Guid,
    /// The active side's QP (a fake one: the peer plays it).
    pub qpn: Qpn,
    /// The REQ's Starting PSN: the PSN the device is to send from.
    pub psn: Psn,
    /// rdma_cm's source port (in the private data's header; the flow label derives from it).
    pub src_port: u16,
    /// `enum ibv_mtu`, 1 = 256 … 5 = 4096.
    pub path_mtu: u8,
    pub tid: Tid,
}

/// A connection the device accepted: the REQ's offer and the device's REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    pub offer: Offer,
    pub rep: RepRepr,
}

fn gid(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The REQ librdmacm's `rdma_connect` sends on RoCE for `o`, from the peer to the device's
/// `port` (rdma_cm's TCP port space).
pub fn req(peer: &Peer, port: u16, o: &Offer) -> Result<ReqRepr, String> {
    let mut private_data = [0u8; 92];
    CmaHdr::new(SocketAddr::new(peer.ip, o.src_port), peer.dut_ip)
        .and_then(|h| h.emit(&mut private_data))
        .map_err(|e| format!("rdma_cm header: {e}"))?;
    Ok(ReqRepr {
        local_comm_id: o.comm_id,
        service_id: ServiceId::rdma_cm(PortSpace::TCP, port),
        local_ca_guid: o.guid,
        local_qkey: QKey(0),
        local_qpn: o.qpn,
        responder_resources: 1,
        initiator_depth: 1,
        // 2^20 × 4.096 µs, about 4.3 s: what Linux's rdma_cm asks for (CMA_CM_RESPONSE_TIMEOUT).
        remote_cm_response_timeout: 20,
        transport_service_type: ServiceType::Rc,
        starting_psn: o.psn,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: PKey::DEFAULT,
        path_mtu: o.path_mtu,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        primary_path: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid(peer.ip),
            remote_gid: gid(peer.dut_ip),
            hop_limit: 64,
            local_ack_timeout: 19,
            flow_label: rdma_cm_flow_label(o.src_port, port),
            ..CmPath::default()
        },
        private_data,
        ..ReqRepr::default()
    })
}

fn bytes(m: &CmMadRepr) -> Result<[u8; MAD_LEN], String> {
    let mut b = [0u8; MAD_LEN];
    m.emit(&mut b)
        .map_err(|e| format!("cannot build a CM MAD: {e}"))?;
    Ok(b)
}

pub fn send(peer: &mut Peer, m: &CmMadRepr) -> Result<(), String> {
    let b = bytes(m)?;
    let c = peer.craft_mad(&b);
    peer.send(&c)
}

/// Answers a DREQ with a DREP (same transaction ID, the IDs swapped), whatever it names.
fn answer_dreq(peer: &mut Peer, tid: Tid, d: &DreqRepr) -> Result<(), String> {
    let drep = RtuRepr {
        local_comm_id: d.remote_comm_id,
        remote_comm_id: d.local_comm_id,
        ..RtuRepr::default()
    };
    send(peer, &CmMadRepr::new(tid, CmMessage::Drep(drep)))
}

/// Sends `req` and waits for the device's REP: `Err` says what came instead (a REJ, nothing).
pub fn connect(
    peer: &mut Peer,
    port: u16,
    o: &Offer,
    patience: Patience,
) -> Result<Accepted, String> {
    let r = req(peer, port, o)?;
    let m = CmMadRepr::new(o.tid, CmMessage::Req(r));
    let mut mra = false;
    for _ in 0..patience.tries {
        send(peer, &m)?;
        let deadline = peer.now() + patience.wait;
        while let Some((_, got)) = peer.recv_mad(deadline.saturating_sub(peer.now())) {
            match got.msg {
                CmMessage::Rep(rep) if rep.remote_comm_id == o.comm_id => {
                    if rep.local_comm_id == CommId(0) {
                        return Err(format!(
                            "the device's REP to a REQ for port {port} has Local Communication ID 0"
                        ));
                    }
                    return Ok(Accepted { offer: *o, rep });
                }
                CmMessage::Rej(rej) if rej.remote_comm_id == o.comm_id => {
                    return Err(format!(
                        "the device rejected a REQ for port {port}: {}",
                        rej.reason
                    ))
                }
                CmMessage::Mra(a) if a.remote_comm_id == o.comm_id => mra = true,
                CmMessage::Dreq(d) => answer_dreq(peer, got.mad.tid, &d)?,
                _ => {}
            }
        }
    }
    Err(format!(
        "no REP (nor REJ) to a REQ for port {port} within {} × {} ms{}",
        patience.tries,
        patience.wait.as_millis(),
        if mra {
            " (an MRA came: the device received it)"
        } else {
            ""
        }
    ))
}

/// The RTU that completes an accepted connection on the device (RDMA_CM_EVENT_ESTABLISHED).
pub fn rtu(peer: &mut Peer, a: &Accepted) -> Result<(), String> {
    let rtu = RtuRepr {
        local_comm_id: a.offer.comm_id,
        remote_comm_id: a.rep.local_comm_id,
        ..RtuRepr::default()
    };
    send(peer, &CmMadRepr::new(a.offer.tid, CmMessage::Rtu(rtu)))
}

/// `rdma_disconnect`: a DREQ (transaction `tid`), and waits for the device's DREP. A DREQ from the
/// device crossing ours ends the connection too (IBTA 12.9.6, unverified: both answer with a DREP);
/// a repeated REP (our RTU was lost) gets the RTU again.
pub fn disconnect(
    peer: &mut Peer,
    a: &Accepted,
    tid: Tid,
    patience: Patience,
) -> Result<(), String> {
    let dreq = DreqRepr {
        local_comm_id: a.offer.comm_id,
        remote_comm_id: a.rep.local_comm_id,
        remote_qpn: a.rep.local_qpn,
        ..DreqRepr::default()
    };
    let m = CmMadRepr::new(tid, CmMessage::Dreq(dreq));
    for _ in 0..patience.tries {
        send(peer, &m)?;
        let deadline = peer.now() + patience.wait;
        while let Some((_, got)) = peer.recv_mad(deadline.saturating_sub(peer.now())) {
            match got.msg {
                CmMessage::Drep(d)
                    if d.remote_comm_id == a.offer.comm_id
                        && d.local_comm_id == a.rep.local_comm_id =>
                {
                    return Ok(())
                }
                CmMessage::Dreq(d) => {
                    answer_dreq(peer, got.mad.tid, &d)?;
                    if d.remote_comm_id == a.offer.comm_id {
                        return Ok(());
                    }
                }
                CmMessage::Rep(r) if r.remote_comm_id == a.offer.comm_id => rtu(peer, a)?,
                _ => {}
            }
        }
    }
    Err(format!(
        "no DREP to a DREQ for the device's QP 0x{:06x} within {} ms",
        a.rep.local_qpn.value(),
        patience.total().as_millis()
    ))
}
