//! The agent's rdma_cm service on a RoCEmu RNIC (`cm_listen`, `cm_connections`,
//! `cm_disconnect`, `cm_stop`): QP1 carrying the IB CM's MADs for a [`CmAgent`], and every
//! connection request on a listened port accepted with an RC QP of its own, the way a
//! librdmacm server does with `rdma_listen`, `rdma_create_qp` and `rdma_accept`.
//!
//! Invariants:
//! * The starting PSN a REP announces is drawn from the RNIC's seeded generator
//!   ([`Rnic::random_u64`]), and so are the CM's communication and transaction IDs (a
//!   generator seeded by [`Rnic::random_seed`]): no clock,
//!   no OS randomness (DESIGN.md). The QP is programmed with the PSN announced (`rq_psn`).
//! * Sans-IO, like the core: [`CmService::turn`] takes `now` and is called by whoever turns
//!   the RNIC (virtual time in `dut::SelfDut`, the engine's thread in `rocemu agent`);
//!   [`CmService::poll_timeout`] says when it next has to be.
//! * Nothing from the wire panics it: MADs that do not parse are dropped by the agent; a REQ
//!   that cannot be accepted (not RC, no QP to be had, a peer without a MAC, too many
//!   connections) is rejected with a REJ.
//! * A MAD is only posted when the RNIC can address it, and only into a send slot whose last
//!   send has completed; the rest wait their turn.
//!
//! The passive side's steps follow Linux (`drivers/infiniband/core/cma.c`, librdmacm's
//! `rdma_accept`): the QP goes to RTR and RTS with the REQ's values before the REP leaves.
use super::{AgentError, AgentResult, CmConn, CmConnState};
use rocemu_emulator::cm::{CmAgent, CmEvent, ConnParams};
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::{
    grh_source, Access, AhAttr, CqId, Gid, Mtu, PdId, QpAttr, QpAttrMask, QpCap, QpInitAttr,
    QpState, QpType, RecvWr, Rnic, SendWr, Sge, UdDest, WcStatus, WrOpcode,
};
use rocemu_emulator::Nanos;
use rocemu_wire::cm::{CommId, PortSpace, RejReason, ReqRepr, ServiceId, ServiceType};
use rocemu_wire::mad::MAD_LEN;
use rocemu_wire::{Psn, QKey, Qpn};
use std::collections::VecDeque;
use std::net::IpAddr;

/// The GSI Q_Key (IBTA 13.5.1, unverified).
/// A UD receive starts with the 40-byte GRH area.
const GRH: usize = 40;
const RECVS: usize = 32;
const SENDS: usize = 16;
/// Work request ids: receives `RECV_ID + slot`, sends `SEND_ID + slot`.
const RECV_ID: u64 = 1 << 32;
const SEND_ID: u64 = 2 << 32;
/// Connections kept at most; a REQ beyond is rejected (reason 3, no resources): a peer that
/// floods REQs must not take every QP of the device.
pub const MAX_CONNECTIONS: usize = 1024;
/// MADs waiting for a send slot at most (older ones are dropped first: the CM retransmits).
const MAX_QUEUED: usize = 256;

/// Rewrites the starting PSN drawn for a connection before it is used (tests break the
/// device with it).
pub type PsnFilter = Box<dyn FnMut(Psn) -> Psn>;

/// Makes sure the RNIC knows the MAC of an address before something is sent there (ibverbs
/// resolves it when an address handle is made); `Err` says why it cannot.
pub type Resolve<'a> = &'a mut dyn FnMut(&mut Rnic, IpAddr) -> Result<(), String>;

#[derive(Debug, Clone, Copy)]
struct Accepted {
    id: CommId,
    conn: CmConn,
}

/// QP1 and the CM agent of one RNIC, and the connections accepted through them.
pub struct CmService {
    gsi_qpn: Qpn,
    gsi_cq: CqId,
    mr: MrInfo,
    /// Send slots whose last send has not completed.
    busy: [bool; SENDS],
    agent: CmAgent,
    /// The PD and CQ of the accepted QPs.
    pd: PdId,
    cq: CqId,
    ports: Vec<u16>,
    conns: Vec<Accepted>,
    out: VecDeque<(IpAddr, [u8; MAD_LEN])>,
    psn_filter: Option<PsnFilter>,
}

impl std::fmt::Debug for CmService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmService")
            .field("ports", &self.ports)
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

fn verbs(what: &str) -> impl Fn(rocemu_emulator::rnic::VerbsError) -> AgentError + '_ {
    move |e| AgentError(format!("rdma_cm: {what}: {e}"))
}

impl CmService {
    /// QP1 on `rnic` (which must not have one yet), its receives posted, and a CM agent.
    pub fn new(rnic: &mut Rnic, psn_filter: Option<PsnFilter>) -> AgentResult<CmService> {
        let pd = rnic.alloc_pd();
        let gsi_cq = rnic
            .create_cq(RECVS + SENDS + 8)
            .map_err(verbs("QP1's CQ"))?;
        let mr = rnic
            .reg_mr(pd, (RECVS + SENDS) * (GRH + MAD_LEN), Access::LOCAL_WRITE)
            .map_err(verbs("QP1's buffers"))?;
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: gsi_cq,
            recv_cq: gsi_cq,
            srq: None,
            cap: QpCap {
                max_send_wr: SENDS as u32,
                max_recv_wr: RECVS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        };
        let gsi_qpn = rnic.create_gsi_qp(pd, init).map_err(verbs("QP1"))?;
        if let Err(e) = rnic.ready_gsi_qp(gsi_qpn) {
            let _ = rnic.destroy_qp(gsi_qpn);
            return Err(verbs("QP1 to RTS")(e));
        }
        let cq = rnic
            .create_cq(4 * MAX_CONNECTIONS)
            .map_err(verbs("the connections' CQ"))?;
        let guid = rnic.node_guid();
        let seed = rnic.random_seed();
        let ip = rnic.ips()[0];
        let s = CmService {
            gsi_qpn,
            gsi_cq,
            mr,
            busy: [false; SENDS],
            agent: {
                // This service accepts every REQ it can give a QP to and bounds those itself
                // (MAX_CONNECTIONS, REJ no resources): the agent's listen backlog must not be
                // the smaller bound, or a flood of REPs without RTU would shut it.
                let mut a = CmAgent::with_seed(ip, guid, &seed);
                a.max_half_open = MAX_CONNECTIONS;
                a
            },
            pd,
            cq,
            ports: Vec::new(),
            conns: Vec::new(),
            out: VecDeque::new(),
            psn_filter,
        };
        for i in 0..RECVS {
            s.post_recv(rnic, i).map_err(verbs("QP1's receives"))?;
        }
        Ok(s)
    }

    /// `rdma_listen` on rdma_cm's TCP port space: REQs for service 0x0000000001060000 | `port`
    /// are accepted from now on.
    pub fn listen(&mut self, port: u16) -> AgentResult<()> {
        if self.ports.contains(&port) {
            return Err(AgentError(format!(
                "cm_listen: already listening on port {port}"
            )));
        }
        self.ports.push(port);
        self.agent.listen(ServiceId::rdma_cm(PortSpace::TCP, port));
        Ok(())
    }

    /// Stops listening on `port` and ends its connections.
    pub fn stop(&mut self, rnic: &mut Rnic, port: u16) -> AgentResult<()> {
        if !self.ports.contains(&port) {
            return Err(AgentError(format!("cm_stop: not listening on port {port}")));
        }
        self.ports.retain(|p| *p != port);
        self.agent
            .unlisten(ServiceId::rdma_cm(PortSpace::TCP, port));
        let ids: Vec<Qpn> = self
            .conns
            .iter()
            .filter(|a| a.conn.port == port)
            .map(|a| a.conn.qpn)
            .collect();
        for q in ids {
            self.close(rnic, q);
        }
        Ok(())
    }

    /// Stops listening everywhere and ends every connection.
    pub fn reset(&mut self, rnic: &mut Rnic) {
        for port in std::mem::take(&mut self.ports) {
            self.agent
                .unlisten(ServiceId::rdma_cm(PortSpace::TCP, port));
        }
        while let Some(a) = self.conns.first() {
            let q = a.conn.qpn;
            self.close(rnic, q);
        }
    }

    /// The connections accepted so far, oldest first.
    pub fn connections(&self) -> Vec<CmConn> {
        self.conns.iter().map(|a| a.conn).collect()
    }

    /// Ends the connection of local QP `qpn` (`rdma_destroy_id`: a DREQ if it is established,
    /// a REJ while it is connecting) and destroys the QP.
    pub fn disconnect(&mut self, rnic: &mut Rnic, qpn: Qpn) -> AgentResult<()> {
        if !self.conns.iter().any(|a| a.conn.qpn == qpn) {
            return Err(AgentError(format!(
                "cm_disconnect: no connection with QP 0x{:x}",
                qpn.value()
            )));
        }
        self.close(rnic, qpn);
        Ok(())
    }

    fn close(&mut self, rnic: &mut Rnic, qpn: Qpn) {
        let Some(i) = self.conns.iter().position(|a| a.conn.qpn == qpn) else {
            return;
        };
        let a = self.conns.remove(i);
        self.agent.close(a.id);
        let _ = rnic.destroy_qp(qpn);
        self.collect();
    }

    /// When [`turn`](Self::turn) must run next for the CM's own timers (retransmissions).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.agent.poll_timeout()
    }

    /// One turn: MADs QP1 received go to the CM agent, its timers run, connection requests are
    /// accepted, what it wants sent is posted on QP1.
    pub fn turn(&mut self, rnic: &mut Rnic, now: Nanos, resolve: Resolve<'_>) {
        let mut wcs = Vec::new();
        rnic.poll_cq_into(self.gsi_cq, RECVS + SENDS, &mut wcs);
        for wc in &wcs {
            if wc.wr_id >= SEND_ID {
                if let Some(b) = self.busy.get_mut((wc.wr_id - SEND_ID) as usize) {
                    *b = false;
                }
                continue;
            }
            let Some(slot) = wc.wr_id.checked_sub(RECV_ID).map(|s| s as usize) else {
                continue;
            };
            if slot >= RECVS {
                continue;
            }
            if wc.status == WcStatus::Success && wc.byte_len as usize >= GRH + MAD_LEN {
                let off = slot * (GRH + MAD_LEN);
                let from = rnic
                    .mr_bytes(self.mr.lkey)
                    .and_then(|b| b.get(off..off + GRH + MAD_LEN))
                    .and_then(|b| grh_source(&b[..GRH]).map(|ip| (ip, b[GRH..].to_vec())));
                if let Some((ip, mad)) = from {
                    self.agent.handle_mad(now, ip, &mad);
                }
            }
            // A receive that cannot be posted again is one fewer; the QP still works.
            let _ = self.post_recv(rnic, slot);
        }
        if self.agent.poll_timeout().is_some_and(|t| t <= now) {
            self.agent.handle_timeout(now);
        }
        while let Some(e) = self.agent.poll_event() {
            self.on_event(rnic, now, e, resolve);
        }
        self.collect();
        self.flush(rnic, resolve);
    }

    fn on_event(&mut self, rnic: &mut Rnic, now: Nanos, e: CmEvent, resolve: Resolve<'_>) {
        let set = |conns: &mut Vec<Accepted>, id: CommId, s: CmConnState| {
            if let Some(a) = conns.iter_mut().find(|a| a.id == id) {
                a.conn.state = s;
            }
        };
        match e {
            CmEvent::ConnectRequest { id, from, req } => {
                if let Err(reason) = self.accept(rnic, now, id, from, &req, resolve) {
                    self.agent.reject(id, reason);
                    self.agent.close(id);
                }
            }
            CmEvent::Established { id, .. } => set(&mut self.conns, id, CmConnState::Established),
            CmEvent::Rejected { id, .. } => {
                self.end(rnic, id);
                set(&mut self.conns, id, CmConnState::Rejected)
            }
            CmEvent::Disconnected { id } => {
                self.end(rnic, id);
                set(&mut self.conns, id, CmConnState::Disconnected)
            }
            CmEvent::Timeout { id } => {
                self.end(rnic, id);
                set(&mut self.conns, id, CmConnState::Error)
            }
            // No UD services here: a SIDR_REP with status REJECT.
            CmEvent::SidrRequest { id, .. } => self.agent.close(id),
            // Never asked for: this agent neither defers RTUs nor resolves service IDs.
            CmEvent::RepReceived { .. } | CmEvent::SidrReply { .. } => {}
        }
    }

    /// A connection is over: its QP takes no more packets.
    fn end(&mut self, rnic: &mut Rnic, id: CommId) {
        if let Some(a) = self.conns.iter().find(|a| a.id == id) {
            let err = QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            };
            let _ = rnic.modify_qp(a.conn.qpn, &err, QpAttrMask::STATE);
        }
    }

    /// `rdma_create_qp` + `rdma_accept` for one REQ; the REJ reason when it cannot be.
    fn accept(
        &mut self,
        rnic: &mut Rnic,
        now: Nanos,
        id: CommId,
        from: IpAddr,
        req: &ReqRepr,
        resolve: Resolve<'_>,
    ) -> Result<(), RejReason> {
        let Some((PortSpace::TCP, port)) = req.service_id.rdma_cm_port() else {
            return Err(RejReason::INVALID_SERVICE_ID);
        };
        if req.transport_service_type != ServiceType::Rc {
            return Err(RejReason::INVALID_TRANSPORT_TYPE);
        }
        if self.conns.len() >= MAX_CONNECTIONS {
            return Err(RejReason::NO_RESOURCES);
        }
        // The QP's address handle needs the peer's MAC, as does the REP.
        resolve(rnic, from).map_err(|_| RejReason::CONSUMER_DEFINED)?;
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let qpn = rnic
            .create_qp(self.pd, init)
            .map_err(|_| RejReason::NO_QP)?;
        // The PSN this end expects first, which the REP announces: the device's choice.
        let drawn = Psn::new(rnic.random_u64() as u32 & 0x00ff_ffff);
        let psn = match self.psn_filter.as_mut() {
            Some(f) => f(drawn),
            None => drawn,
        };
        let active = rnic.active_mtu();
        let mtu = mtu_code_bytes(req.path_mtu)
            .and_then(Mtu::from_bytes)
            .filter(|m| m.bytes() <= active.bytes())
            .unwrap_or(active);
        // Reads and atomics: as responder no more than the peer will keep in flight, as
        // requester no more than it takes (IBTA 12.7.29, 12.7.31, unverified).
        let responder_resources = req.initiator_depth.clamp(1, 16);
        let initiator_depth = req.responder_resources.clamp(1, 16);
        let o = ConnectOpts {
            mtu,
            timeout: req.primary_path.local_ack_timeout.clamp(1, 31),
            retry_cnt: req.retry_count,
            rnr_retry: req.rnr_retry_count,
            // Separately: reads in flight bounded by the peer's responder resources, our
            // responder resources for as many as the peer keeps in flight.
            max_rd_atomic: initiator_depth,
            max_dest_rd_atomic: responder_resources,
            flow_label: req.primary_path.flow_label,
            ..Default::default()
        };
        let up = bring_up(rnic, qpn, req.local_qpn, from, req.starting_psn, psn, &o);
        let p = ConnParams {
            qpn,
            psn,
            path_mtu: mtu_code(mtu),
            responder_resources,
            initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            ..ConnParams::default()
        };
        if up.is_err() || self.agent.accept(now, id, &p).is_err() {
            let _ = rnic.destroy_qp(qpn);
            return Err(RejReason::NO_RESOURCES);
        }
        self.conns.push(Accepted {
            id,
            conn: CmConn {
                port,
                qpn,
                psn,
                sq_psn: req.starting_psn,
                remote_qpn: req.local_qpn,
                peer: from,
                state: CmConnState::Connecting,
            },
        });
        Ok(())
    }

    /// Moves what the agent wants sent into the queue.
    fn collect(&mut self) {
        while let Some(m) = self.agent.poll_transmit() {
            if self.out.len() >= MAX_QUEUED {
                self.out.pop_front();
            }
            self.out.push_back(m);
        }
    }

    /// Posts queued MADs into free send slots.
    fn flush(&mut self, rnic: &mut Rnic, resolve: Resolve<'_>) {
        while let Some(&(to, mad)) = self.out.front() {
            let Some(slot) = self.busy.iter().position(|b| !b) else {
                return;
            };
            self.out.pop_front();
            if resolve(rnic, to).is_err() {
                continue; // nowhere to send it; the CM retransmits what matters
            }
            let off = (RECVS + slot) * (GRH + MAD_LEN);
            let Some(buf) = rnic
                .mr_bytes_mut(self.mr.lkey)
                .and_then(|b| b.get_mut(off..off + MAD_LEN))
            else {
                return;
            };
            buf.copy_from_slice(&mad);
            let mut wr = SendWr::new(
                SEND_ID + slot as u64,
                WrOpcode::Send,
                vec![Sge {
                    addr: self.mr.addr + off as u64,
                    length: MAD_LEN as u32,
                    lkey: self.mr.lkey,
                }],
            );
            wr.ud = Some(UdDest {
                ah: AhAttr {
                    dgid: Gid::from_ip(to),
                    hop_limit: 64,
                    ..Default::default()
                },
                remote_qpn: Qpn::GSI,
                remote_qkey: QKey::GSI,
            });
            if rnic.post_send(self.gsi_qpn, wr).is_ok() {
                self.busy[slot] = true;
            }
        }
    }

    fn post_recv(
        &self,
        rnic: &mut Rnic,
        slot: usize,
    ) -> Result<(), rocemu_emulator::rnic::VerbsError> {
        rnic.post_recv(
            self.gsi_qpn,
            RecvWr {
                wr_id: RECV_ID + slot as u64,
                sg_list: [Sge {
                    addr: self.mr.addr + (slot * (GRH + MAD_LEN)) as u64,
                    length: (GRH + MAD_LEN) as u32,
                    lkey: self.mr.lkey,
                }]
                .into(),
            },
        )
    }
}

/// `enum ibv_mtu` (1 = 256 … 5 = 4096) in bytes.
fn mtu_code_bytes(code: u8) -> Option<usize> {
    (1..=5).contains(&code).then(|| 128usize << code)
}

fn mtu_code(m: Mtu) -> u8 {
    match m.bytes() {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}
