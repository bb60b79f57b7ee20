//! The agent's operations on a RoCEmu [`Rnic`], for `--target self` and for `rocemu agent`.
//!
//! [`execute`] never waits: `poll_cq` returns what the CQ holds now, and whoever drives the
//! RNIC (virtual time in [`crate::dut::SelfDut`], the engine's thread in `rocemu agent`) turns
//! it between polls until the wait is over.
use super::cm::{CmService, PsnFilter, Resolve};
use super::*;
use rocemu_emulator::rnic::{self as r, Gid, QpAttrMask as M, Rnic, WcOpcode, WcStatus};
use rocemu_emulator::Nanos;

/// The objects a session created, so that `reset` can take them down again, and the agent's
/// rdma_cm service once a `cm_listen` started it (QP1 stays: a device's, not a session's).
#[derive(Default)]
pub struct Objects {
    qps: Vec<Qpn>,
    mrs: Vec<u32>,
    cm: Option<CmService>,
    /// Handed to the CM service when it starts: rewrites every starting PSN it draws (tests
    /// break the device with it).
    pub cm_psn_filter: Option<PsnFilter>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("qps", &self.qps.len())
            .field("mrs", &self.mrs.len())
            .field("cm", &self.cm)
            .finish_non_exhaustive()
    }
}

impl Objects {
    /// Runs the CM service's turn, when there is one (see [`CmService::turn`]).
    pub fn turn_cm(&mut self, rnic: &mut Rnic, now: Nanos, resolve: Resolve<'_>) {
        if let Some(cm) = self.cm.as_mut() {
            cm.turn(rnic, now, resolve);
        }
    }

    /// When the CM service next needs a turn for its own timers.
    pub fn cm_timeout(&self) -> Option<Nanos> {
        self.cm.as_ref().and_then(|c| c.poll_timeout())
    }

    fn cm_mut(&mut self, op: &str) -> AgentResult<&mut CmService> {
        self.cm
            .as_mut()
            .ok_or_else(|| AgentError(format!("{op}: no cm_listen yet")))
    }
}

fn verbs(e: r::VerbsError) -> AgentError {
    AgentError(e.to_string())
}

/// ibverbs' `enum ibv_wc_status` name.
pub fn wc_status_name(s: WcStatus) -> &'static str {
    match s {
        WcStatus::Success => "IBV_WC_SUCCESS",
        WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
        WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
        WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
        WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
        WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
        WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
        WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
        WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
        WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
        WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
        WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
        WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
        WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
    }
}

/// ibverbs' `enum ibv_wc_opcode` name.
pub fn wc_opcode_name(o: WcOpcode) -> &'static str {
    match o {
        WcOpcode::Send => "IBV_WC_SEND",
        WcOpcode::RdmaWrite => "IBV_WC_RDMA_WRITE",
        WcOpcode::RdmaRead => "IBV_WC_RDMA_READ",
        WcOpcode::CompSwap => "IBV_WC_COMP_SWAP",
        WcOpcode::FetchAdd => "IBV_WC_FETCH_ADD",
        WcOpcode::Recv => "IBV_WC_RECV",
        WcOpcode::RecvRdmaWithImm => "IBV_WC_RECV_RDMA_WITH_IMM",
    }
}

fn completion(w: &r::Wc) -> WorkCompletion {
    WorkCompletion {
        wr_id: w.wr_id,
        status: wc_status_name(w.status).into(),
        opcode: wc_opcode_name(w.opcode).into(),
        byte_len: w.byte_len,
        imm_data: w
            .wc_flags
            .contains(r::WcFlags::WITH_IMM)
            .then_some(w.imm_data),
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.0,
    }
}

fn ah_attr(a: &Ah) -> r::AhAttr {
    r::AhAttr {
        dgid: Gid::from_ip(a.dgid),
        sgid_index: a.sgid_index,
        dmac: None,
        hop_limit: a.hop_limit,
        traffic_class: a.traffic_class,
        ..Default::default()
    }
}

fn sges(sg: &[Sge]) -> Vec<r::Sge> {
    sg.iter()
        .map(|s| r::Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect()
}

/// The attributes and mask `ibv_modify_qp` gets for `m`, on top of the QP's current values.
fn qp_attr(cur: r::QpAttr, m: &ModifyQp) -> AgentResult<(r::QpAttr, M)> {
    let mut a = cur;
    let mut mask = M(0);
    let mut set = |bit: M| mask = mask.union(bit);
    if let Some(s) = m.qp_state {
        a.qp_state = s;
        set(M::STATE);
    }
    if let Some(v) = m.dest_qp_num {
        a.dest_qp_num = v;
        set(M::DEST_QPN);
    }
    if let Some(v) = m.rq_psn {
        a.rq_psn = v;
        set(M::RQ_PSN);
    }
    if let Some(v) = m.sq_psn {
        a.sq_psn = v;
        set(M::SQ_PSN);
    }
    if let Some(v) = m.path_mtu {
        a.path_mtu = r::Mtu::from_bytes(v as usize).ok_or_else(|| {
            AgentError(format!("path_mtu {v}: give 256, 512, 1024, 2048 or 4096"))
        })?;
        set(M::PATH_MTU);
    }
    macro_rules! byte {
        ($f:ident, $bit:expr) => {
            if let Some(v) = m.$f {
                a.$f = v;
                set($bit);
            }
        };
    }
    byte!(timeout, M::TIMEOUT);
    byte!(retry_cnt, M::RETRY_CNT);
    byte!(rnr_retry, M::RNR_RETRY);
    byte!(min_rnr_timer, M::MIN_RNR_TIMER);
    byte!(max_rd_atomic, M::MAX_QP_RD_ATOMIC);
    byte!(max_dest_rd_atomic, M::MAX_DEST_RD_ATOMIC);
    byte!(port_num, M::PORT);
    byte!(pkey_index, M::PKEY_INDEX);
    byte!(qkey, M::QKEY);
    byte!(qp_access_flags, M::ACCESS_FLAGS);
    if let Some(ah) = &m.ah {
        a.ah_attr = ah_attr(ah);
        set(M::AV);
    }
    Ok((a, mask))
}

fn wr_opcode(wr: &SendWr) -> r::WrOpcode {
    let (remote_addr, rkey) = (wr.remote_addr, wr.rkey.0);
    match wr.opcode {
        SendOpcode::Send => r::WrOpcode::Send,
        SendOpcode::SendWithImm => r::WrOpcode::SendWithImm { imm: wr.imm_data },
        SendOpcode::RdmaWrite => r::WrOpcode::RdmaWrite { remote_addr, rkey },
        SendOpcode::RdmaWriteWithImm => r::WrOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: wr.imm_data,
        },
        SendOpcode::RdmaRead => r::WrOpcode::RdmaRead { remote_addr, rkey },
        SendOpcode::AtomicCmpSwp => r::WrOpcode::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare: wr.compare_add,
            swap: wr.swap,
        },
        SendOpcode::AtomicFetchAdd => r::WrOpcode::AtomicFetchAdd {
            remote_addr,
            rkey,
            add: wr.compare_add,
        },
    }
}

fn mr_range(
    rnic: &Rnic,
    lkey: u32,
    offset: u64,
    length: u64,
) -> AgentResult<std::ops::Range<usize>> {
    let n = rnic
        .mr_bytes(lkey)
        .ok_or_else(|| AgentError(format!("no memory region with lkey 0x{lkey:x}")))?
        .len() as u64;
    match offset.checked_add(length) {
        Some(end) if end <= n => Ok(offset as usize..end as usize),
        _ => Err(AgentError(format!(
            "bytes {offset}..+{length} are outside the region's {n}"
        ))),
    }
}

/// Runs one request on `rnic` (`poll_cq` without waiting). One arm per operation of the agent
/// protocol; the arms longer than a line or two are the functions below, in the same order.
pub fn execute(rnic: &mut Rnic, objs: &mut Objects, req: Request) -> AgentResult<Reply> {
    Ok(match req {
        Request::Hello { version } => hello(version)?,
        Request::QueryDevice => query_device(rnic),
        Request::AllocPd => Reply::Pd(rnic.alloc_pd().0),
        // RoCEmu keeps PDs and CQs until the device goes away: nothing to release.
        Request::DeallocPd { .. } | Request::DestroyCq { .. } => Reply::Done,
        Request::RegMr { pd, length, access } => reg_mr(rnic, objs, pd, length, access)?,
        Request::DeregMr { lkey } => {
            rnic.dereg_mr(lkey).map_err(verbs)?;
            objs.mrs.retain(|k| *k != lkey);
            Reply::Done
        }
        Request::WriteMr { lkey, offset, data } => write_mr(rnic, lkey, offset, &data)?,
        Request::ReadMr {
            lkey,
            offset,
            length,
        } => read_mr(rnic, lkey, offset, length)?,
        Request::CreateCq { cqe } => Reply::Cq(rnic.create_cq(cqe as usize).map_err(verbs)?.0),
        Request::CreateQp(i) => create_qp(rnic, objs, &i)?,
        Request::ModifyQp { qpn, attr } => {
            let cur = rnic.query_qp(qpn).map_err(verbs)?;
            let (a, mask) = qp_attr(cur, &attr)?;
            rnic.modify_qp(qpn, &a, mask).map_err(verbs)?;
            Reply::Done
        }
        Request::QueryQp { qpn } => query_qp(rnic, qpn)?,
        Request::DestroyQp { qpn } => {
            rnic.destroy_qp(qpn).map_err(verbs)?;
            objs.qps.retain(|q| *q != qpn);
            Reply::Done
        }
        Request::PostSend { qpn, wr } => post_send(rnic, qpn, wr)?,
        Request::PostRecv { qpn, wr } => {
            let w = r::RecvWr {
                wr_id: wr.wr_id,
                sg_list: sges(&wr.sg).into(),
            };
            rnic.post_recv(qpn, w).map_err(verbs)?;
            Reply::Done
        }
        Request::PollCq { cq, max, .. } => Reply::Wcs(
            rnic.poll_cq(r::CqId(cq), max as usize)
                .iter()
                .map(completion)
                .collect(),
        ),
        Request::CmListen { port } => cm_listen(rnic, objs, port)?,
        Request::CmConnections => Reply::CmConns(
            objs.cm
                .as_ref()
                .map(|c| c.connections())
                .unwrap_or_default(),
        ),
        Request::CmDisconnect { qpn } => {
            objs.cm_mut("cm_disconnect")?.disconnect(rnic, qpn)?;
            Reply::Done
        }
        Request::CmStop { port } => {
            objs.cm_mut("cm_stop")?.stop(rnic, port)?;
            Reply::Done
        }
        Request::Reset => reset(rnic, objs),
    })
}

/// `hello`: the version is the client's, if this agent serves it.
fn hello(version: u32) -> AgentResult<Reply> {
    if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
        return Err(AgentError(format!(
            "protocol version {version} not served (this agent speaks {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION})"
        )));
    }
    Ok(Reply::Hello(Hello {
        version,
        agent: format!("rocemu {}", env!("CARGO_PKG_VERSION")),
    }))
}

fn query_device(rnic: &Rnic) -> Reply {
    Reply::Device(DeviceInfo {
        mac: rnic.mac(),
        gids: rnic.ips().to_vec(),
        active_mtu: rnic.active_mtu().bytes() as u32,
        name: format!("rocemu fw {}", rnic.query_device().fw_ver),
        // FLUSH and ATOMIC WRITE (IBA 1.5) are not implemented.
        caps: Vec::new(),
    })
}

/// `reg_mr`, at most 1 GiB; the region is the session's until `dereg_mr` or `reset`.
fn reg_mr(
    rnic: &mut Rnic,
    objs: &mut Objects,
    pd: u32,
    length: u64,
    access: Access,
) -> AgentResult<Reply> {
    let len = usize::try_from(length)
        .ok()
        .filter(|&l| l <= 1 << 30)
        .ok_or_else(|| AgentError(format!("length {length}: at most 1 GiB")))?;
    let m = rnic.reg_mr(r::PdId(pd), len, access).map_err(verbs)?;
    objs.mrs.push(m.lkey);
    Ok(Reply::Mr(MrInfo {
        addr: m.addr,
        length: m.length,
        lkey: m.lkey,
        rkey: RKey(m.rkey),
    }))
}

fn write_mr(rnic: &mut Rnic, lkey: u32, offset: u64, data: &[u8]) -> AgentResult<Reply> {
    let range = mr_range(rnic, lkey, offset, data.len() as u64)?;
    if let Some(b) = rnic.mr_bytes_mut(lkey) {
        b[range].copy_from_slice(data);
    }
    Ok(Reply::Done)
}

/// `read_mr`, at most 16 MiB of it.
fn read_mr(rnic: &Rnic, lkey: u32, offset: u64, length: u64) -> AgentResult<Reply> {
    let range = mr_range(rnic, lkey, offset, length.min(1 << 24))?;
    Ok(Reply::Data(
        rnic.mr_bytes(lkey)
            .map(|b| b[range].to_vec())
            .unwrap_or_default(),
    ))
}

/// `create_qp` without an SRQ; the QP is the session's until `destroy_qp` or `reset`.
fn create_qp(rnic: &mut Rnic, objs: &mut Objects, i: &QpInit) -> AgentResult<Reply> {
    let init = r::QpInitAttr {
        qp_type: i.qp_type,
        send_cq: r::CqId(i.send_cq),
        recv_cq: r::CqId(i.recv_cq),
        srq: None,
        cap: r::QpCap {
            max_send_wr: i.max_send_wr,
            max_recv_wr: i.max_recv_wr,
            max_send_sge: i.max_send_sge,
            max_recv_sge: i.max_recv_sge,
            max_inline_data: i.max_inline_data,
        },
        sq_sig_all: i.sq_sig_all,
    };
    let q = rnic.create_qp(r::PdId(i.pd), init).map_err(verbs)?;
    objs.qps.push(q);
    Ok(Reply::Qp(q))
}

fn query_qp(rnic: &Rnic, qpn: Qpn) -> AgentResult<Reply> {
    let a = rnic.query_qp(qpn).map_err(verbs)?;
    Ok(Reply::QpAttr(QpInfo {
        qp_state: a.qp_state,
        dest_qp_num: a.dest_qp_num,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        path_mtu: a.path_mtu.bytes() as u32,
        qkey: a.qkey,
        qp_access_flags: a.qp_access_flags,
        min_rnr_timer: a.min_rnr_timer,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
    }))
}

fn post_send(rnic: &mut Rnic, qpn: Qpn, wr: SendWr) -> AgentResult<Reply> {
    let mut w = r::SendWr::new(wr.wr_id, wr_opcode(&wr), sges(&wr.sg));
    w.flags = if wr.signaled {
        r::SendFlags::SIGNALED
    } else {
        r::SendFlags::default()
    };
    if wr.fence {
        w.flags = w.flags | r::SendFlags::FENCE;
    }
    if wr.solicited {
        w.flags = r::SendFlags(w.flags.0 | r::SendFlags::SOLICITED.0);
    }
    w.ud = wr.ud.map(|u| r::UdDest {
        ah: ah_attr(&u.ah),
        remote_qpn: u.remote_qpn,
        remote_qkey: u.remote_qkey,
    });
    rnic.post_send(qpn, w).map_err(verbs)?;
    Ok(Reply::Done)
}

/// `cm_listen`: the first one starts the CM service (with the PSN filter, if a test set one).
fn cm_listen(rnic: &mut Rnic, objs: &mut Objects, port: u16) -> AgentResult<Reply> {
    if objs.cm.is_none() {
        let filter = objs.cm_psn_filter.take();
        objs.cm = Some(CmService::new(rnic, filter)?);
    }
    objs.cm_mut("cm_listen")?.listen(port)?;
    Ok(Reply::Done)
}

/// `reset`: takes down what the session made (CM connections, QPs, MRs), ignoring failures.
fn reset(rnic: &mut Rnic, objs: &mut Objects) -> Reply {
    if let Some(cm) = objs.cm.as_mut() {
        cm.reset(rnic);
    }
    for q in std::mem::take(&mut objs.qps) {
        let _ = rnic.destroy_qp(q);
    }
    for k in std::mem::take(&mut objs.mrs) {
        let _ = rnic.dereg_mr(k);
    }
    Reply::Done
}
