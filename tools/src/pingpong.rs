//! One end of `ibv_rc_pingpong`, `ibv_uc_pingpong` or `ibv_ud_pingpong` on a real datapath
//! ([`pingpong`]), and of `imm_pingpong` (`testbed/rxevm/imm_pingpong.c`) with `--imm`: the
//! [`Endpoint`] faces a peer process, with `ibv_rc_pingpong`'s TCP exchange
//! ([`crate::oob::rc_pingpong`]), the same with a [`WriteKey`] after each address message
//! (`--imm --op write`), or rdma_cm (`--rdma-cm`).
//!
//! Invariants: the QP is in INIT with its receives posted before the exchange, as the real
//! tools do; a SEND goes when the previous one completed and a message arrived (the client
//! starts); the loop fails after 30 s without a completion instead of waiting forever.
use crate::oob::imm_pingpong::{self, WriteKey};
use crate::oob::{self, OobConfig, PingpongDest};
use crate::remote::{gid_bytes, gid_ip, random_psn, serve, verr, Endpoint, RESOLVE};
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::{Psn, Qpn};
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

/// `ibv_rc_pingpong`'s options.
#[derive(Debug, Clone)]
pub struct PingpongOpts {
    pub server: Option<String>,
    pub port: u16,
    pub size: usize,
    pub iters: u64,
    pub mtu: Mtu,
    pub rx_depth: usize,
    /// `-c`: the server checks that the client's bytes at each page start are 0.
    pub check: bool,
    /// RC (`ibv_rc_pingpong`), UC (`ibv_uc_pingpong`) or UD (`ibv_ud_pingpong`).
    pub transport: QpType,
    /// `--imm`: every message carries an immediate that the receiver checks, as
    /// `testbed/rxevm/imm_pingpong.c` does (its peer in the rxe guest); `None`: plain messages.
    pub imm: Option<ImmOp>,
    /// `--rdma-cm`: connect through rdma_cm (the IB CM over QP1, port `port` of its TCP port
    /// space) instead of the TCP exchange; RC only, and both ends must be RoCEmu (rdma-core's
    /// pingpong tools have no rdma_cm mode).
    pub rdma_cm: bool,
}

/// What carries the immediate with `--imm` (`imm_pingpong --op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImmOp {
    /// SEND with immediate: the payload lands in the receive buffer.
    Send,
    /// RDMA WRITE with immediate (RC and UC): the payload lands where the peer's
    /// [`WriteKey`] says; the immediate, in the last packet, consumes a receive whose buffer
    /// stays untouched (IBTA Vol. 1 ch. 9).
    Write,
}

/// `ibv_ud_pingpong`'s Q_Key.
pub const UD_PINGPONG_QKEY: u32 = 0x1111_1111;
/// Room for the GRH at the front of every UD receive buffer (IBTA 11.4.1.2; Annex A17.4.5.2).
const GRH: usize = 40;

/// What a pingpong did.
#[derive(Debug, Clone)]
pub struct PingpongResult {
    pub local: PingpongDest,
    pub remote: PingpongDest,
    pub bytes: u64,
    pub iters: u64,
    pub seconds: f64,
    /// With `--imm`: the transport, the operation and how many immediates were checked.
    pub imm: Option<(QpType, ImmOp, u64)>,
}

impl PingpongResult {
    /// The lines `ibv_rc_pingpong` prints (and `imm_pingpong`'s summary with `--imm`).
    pub fn lines(&self) -> Vec<String> {
        let show = |d: &PingpongDest| {
            format!(
                "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
                d.lid,
                d.qpn,
                d.psn,
                Ipv6Addr::from(d.gid)
            )
        };
        let usec = self.seconds * 1e6;
        let mut l = vec![
            format!("  local address:  {}", show(&self.local)),
            format!("  remote address: {}", show(&self.remote)),
            format!(
                "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
                self.bytes,
                self.seconds,
                self.bytes as f64 * 8.0 / usec
            ),
            format!(
                "{} iters in {:.2} seconds = {:.2} usec/iter",
                self.iters,
                self.seconds,
                usec / self.iters as f64
            ),
        ];
        if let Some((t, op, n)) = self.imm {
            let t = match t {
                QpType::Rc => "rc",
                QpType::Uc => "uc",
                QpType::Ud => "ud",
            };
            let op = match op {
                ImmOp::Send => "SEND_WITH_IMM",
                ImmOp::Write => "RDMA_WRITE_WITH_IMM",
            };
            l.push(format!(
                "{n} immediates checked ({t} {op}: wc_flags, opcode, imm_data, byte_len, payload)"
            ));
        }
        l
    }
}

/// One end's objects, made by [`pp_setup`]: the CQ (of both queues), the QP, the MR and the
/// QP's initial PSN.
#[derive(Debug, Clone, Copy)]
struct PpCtx {
    pd_cq: CqId,
    qpn: Qpn,
    mr: MrInfo,
    psn: Psn,
    ud: bool,
    /// Where in the MR messages are sent from (the receive area comes first).
    send_off: usize,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

fn pp_post_recv(r: &mut Rnic, c: &PpCtx, size: usize, n: usize) -> Result<(), String> {
    // UD receives take the GRH area in front of the payload.
    let len = if c.ud { size + GRH } else { size };
    for _ in 0..n {
        r.post_recv(
            c.qpn,
            RecvWr {
                wr_id: RECV_WRID,
                sg_list: [Sge {
                    addr: c.mr.addr,
                    length: len as u32,
                    lkey: c.mr.lkey,
                }]
                .into(),
            },
        )
        .map_err(verr)?;
    }
    Ok(())
}

fn pp_connect(ep: &mut Endpoint, c: &PpCtx, rem: &PingpongDest, mtu: Mtu) -> Result<(), String> {
    let peer = gid_ip(&rem.gid, "the peer")?;
    ep.engine.resolve(&mut ep.rnic, peer, RESOLVE)?;
    let o = ConnectOpts {
        mtu,
        // ibv_rc_pingpong's: one read in flight, one responder resource (it reads nothing).
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        qkey: rocemu_wire::QKey(UD_PINGPONG_QKEY),
        ..Default::default()
    };
    bring_up(
        &mut ep.rnic,
        c.qpn,
        Qpn::new(rem.qpn),
        peer,
        c.psn,
        Psn::new(rem.psn),
        &o,
    )
    .map_err(|e| format!("modify QP: {e}"))
}

/// The immediate `imm_pingpong` puts in message `k` (from 0) of one side: the side in the top
/// byte (0xc1 the client, 0x5e the server), so that a message from the wrong side or reflected
/// back is caught, and the message number below. On the wire the ImmDt field reads this value
/// (ibverbs' `imm_data` is in network order; RoCEmu's is the host-order value).
fn imm_value(from_client: bool, k: u64) -> u32 {
    (if from_client { 0xc1 } else { 0x5e }) << 24 | (k as u32 & 0x00ff_ffff)
}

/// Byte `i` of the message whose immediate is `v` (as `imm_pingpong`): differs from side to
/// side and from one message to the next.
fn imm_pattern(v: u32, i: usize) -> u8 {
    v.wrapping_add(v >> 24).wrapping_add(i as u32) as u8
}

/// What the receiver of a `--imm` message checks (`imm_pingpong`'s `check_recv`).
struct ImmCheck {
    op: ImmOp,
    /// The peer is the client (its immediates have the client's tag).
    peer_is_client: bool,
    peer_qpn: Qpn,
    size: usize,
    ud: bool,
}

impl ImmCheck {
    /// Checks the peer's message `k` on its receive completion; `buf` is the MR, whose start is
    /// the receive area and what the peer writes into.
    fn recv(&self, wc: &Wc, buf: &[u8], k: u64) -> Result<(), String> {
        let bad = |what: String| Err(format!("--imm: message {k}: {what}"));
        let want = imm_value(self.peer_is_client, k);
        let opcode = match self.op {
            ImmOp::Send => WcOpcode::Recv,
            ImmOp::Write => WcOpcode::RecvRdmaWithImm,
        };
        let grh = if self.ud { GRH } else { 0 };
        if !wc.wc_flags.contains(WcFlags::WITH_IMM) {
            return bad(format!(
                "no immediate (wc_flags {:#x} lacks WITH_IMM)",
                wc.wc_flags.0
            ));
        }
        if wc.opcode != opcode {
            return bad(format!(
                "completion opcode {:?}, expected {opcode:?}",
                wc.opcode
            ));
        }
        if wc.imm_data != want {
            return bad(format!(
                "immediate {:#010x}, expected {want:#010x}",
                wc.imm_data
            ));
        }
        if wc.byte_len as usize != self.size + grh {
            return bad(format!(
                "byte_len {}, expected {}",
                wc.byte_len,
                self.size + grh
            ));
        }
        if self.ud && !wc.wc_flags.contains(WcFlags::GRH) {
            return bad(format!(
                "a UD receive without the GRH flag (wc_flags {:#x})",
                wc.wc_flags.0
            ));
        }
        if self.ud && wc.src_qp != self.peer_qpn {
            return bad(format!(
                "src_qp {:#08x}, expected the peer's QPN {:#08x}",
                wc.src_qp.value(),
                self.peer_qpn.value()
            ));
        }
        let data = &buf[grh..grh + self.size];
        if let Some(i) = (0..self.size).find(|&i| data[i] != imm_pattern(want, i)) {
            return bad(format!(
                "payload byte {i} is {:#04x}, expected {:#04x}",
                data[i],
                imm_pattern(want, i)
            ));
        }
        Ok(())
    }
}

/// `--rdma-cm`: the QP (in INIT, receives posted) connected through rdma_cm, the client to the
/// server's `port`, the server accepting the first REQ there. Returns the CM (the connection
/// is ended through it) and the peer's address as the TCP exchange would have given it.
fn pp_rdma_cm(
    ep: &mut Endpoint,
    o: &PingpongOpts,
    c: &PpCtx,
) -> Result<(PpCm, PingpongDest), String> {
    use crate::rdmacm::{Cm, RcSide};
    if o.transport != QpType::Rc {
        return Err("--rdma-cm connects RC QPs: --transport rc".into());
    }
    if o.imm == Some(ImmOp::Write) {
        return Err(
            "--rdma-cm goes without --op write (its rkey travels in the TCP exchange)".into(),
        );
    }
    let mut cm = Cm::new(ep)?;
    let me = RcSide {
        qpn: c.qpn,
        psn: c.psn,
        path_mtu: oob::mtu_to_enum(o.mtu.bytes() as u32).unwrap_or(3),
        responder_resources: 1,
        initiator_depth: 1,
        timeout: 14,
    };
    let conn = match &o.server {
        Some(server) => {
            let ip = crate::rdmacm::server_ip(server, o.port, false)?;
            cm.connect_rc(ep, ip, o.port, &me, 0)?
        }
        None => {
            cm.listen(o.port);
            cm.accept_rc(ep, &me, Duration::MAX, |_| Ok(()))?
        }
    };
    let remote = PingpongDest {
        lid: 0,
        qpn: conn.remote_qpn.value(),
        psn: conn.remote_psn.value(),
        gid: gid_bytes(conn.peer),
    };
    Ok(((cm, conn), remote))
}

/// Runs one end of `ibv_rc_pingpong`, `ibv_uc_pingpong` or `ibv_ud_pingpong` (client when
/// `o.server` is set); with `o.imm`, of `imm_pingpong`.
pub fn pingpong(ep: &mut Endpoint, o: &PingpongOpts) -> Result<PingpongResult, String> {
    let c = pp_setup(ep, o)?;
    let r = &mut ep.rnic;
    let local = PingpongDest {
        lid: 0,
        qpn: c.qpn.value(),
        psn: c.psn.value(),
        gid: gid_bytes(r.ips()[0]),
    };
    let key = WriteKey {
        rkey: c.mr.rkey,
        vaddr: c.mr.addr,
    };
    let (remote, rem_key, cm) = pp_exchange(ep, o, &c, &local, key)?;
    let (seconds, received) = pp_loop(ep, o, &c, &remote, rem_key)?;
    pp_finish(ep, o, &c, cm)?;
    Ok(PingpongResult {
        local,
        remote,
        bytes: (o.size as u64) * o.iters * 2,
        iters: o.iters,
        seconds,
        imm: o.imm.map(|op| (o.transport, op, received)),
    })
}

/// The end's objects as the real tool makes them (`pp_init_ctx`): the MR filled with 0x7b, the
/// QP in INIT and its receives posted, before the exchange.
fn pp_setup(ep: &mut Endpoint, o: &PingpongOpts) -> Result<PpCtx, String> {
    if o.mtu.bytes() > ep.rnic.active_mtu().bytes() {
        return Err(format!(
            "-m {}: above the port's active MTU {} (interface MTU {})",
            o.mtu.bytes(),
            ep.rnic.active_mtu().bytes(),
            ep.engine.port().mtu()
        ));
    }
    let ud = o.transport == QpType::Ud;
    if ud && o.imm == Some(ImmOp::Write) {
        return Err("--op write needs a connected QP: --transport rc or uc".into());
    }
    let r = &mut ep.rnic;
    let pd = r.alloc_pd();
    let cq = r.create_cq(o.rx_depth + 1).map_err(verr)?;
    if ud && o.size > r.active_mtu().bytes() {
        return Err(format!(
            "-s {}: a UD message must fit the port's MTU ({})",
            o.size,
            r.active_mtu().bytes()
        ));
    }
    // The real tools send from the buffer they receive into; with --imm, as imm_pingpong, the
    // receive area (which is also what the peer writes into) comes first, then the send area.
    let recv_len = o.size + if ud { GRH } else { 0 };
    let send_off = match o.imm {
        None => recv_len - o.size,
        Some(_) => recv_len.next_multiple_of(64),
    };
    let access = match o.imm {
        Some(ImmOp::Write) => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        _ => Access::LOCAL_WRITE,
    };
    let mr = r
        .reg_mr(pd, (send_off + o.size).max(1), access)
        .map_err(verr)?;
    // Filled with 0x7b as the real tool does.
    r.mr_bytes_mut(mr.lkey).expect("just registered").fill(0x7b);
    if o.check && o.server.is_some() {
        // The client sends 0 at each page start; the server checks for it.
        for b in r
            .mr_bytes_mut(mr.lkey)
            .expect("just registered")
            .iter_mut()
            .step_by(4096)
        {
            *b = 0;
        }
    }
    let qpn = r
        .create_qp(
            pd,
            QpInitAttr {
                qp_type: o.transport,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: o.rx_depth as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .map_err(verr)?;
    // INIT, then the receives, before the exchange (as pp_init_ctx / main do).
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey: rocemu_wire::QKey(UD_PINGPONG_QKEY),
        ..Default::default()
    };
    let last = if ud {
        QpAttrMask::QKEY
    } else {
        QpAttrMask::ACCESS_FLAGS
    };
    r.modify_qp(
        qpn,
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | last,
    )
    .map_err(verr)?;
    let c = PpCtx {
        pd_cq: cq,
        qpn,
        mr,
        psn: random_psn(r),
        ud,
        send_off,
    };
    pp_post_recv(r, &c, o.size, o.rx_depth)?;
    Ok(c)
}

/// The CM and the connection of a `--rdma-cm` pingpong, ended through it by [`pp_finish`].
type PpCm = (crate::rdmacm::Cm, crate::rdmacm::RcConn);

/// The exchange of addresses, and the QP moved to RTR and RTS: over TCP (with `--op write`, the
/// [`WriteKey`]s with them), or rdma_cm. Returns the peer's address, its key (exactly with
/// `--op write`) and, with `--rdma-cm`, the connection.
fn pp_exchange(
    ep: &mut Endpoint,
    o: &PingpongOpts,
    c: &PpCtx,
    local: &PingpongDest,
    key: WriteKey,
) -> Result<(PingpongDest, Option<WriteKey>, Option<PpCm>), String> {
    let write = o.imm == Some(ImmOp::Write);
    let cfg = OobConfig::default();
    let mtu = o.mtu;
    if o.rdma_cm {
        let (cm, rem) = pp_rdma_cm(ep, o, c)?;
        return Ok((rem, None, Some(cm)));
    }
    let (remote, rem_key) = match &o.server {
        Some(server) => {
            let addr = (server.as_str(), o.port);
            let (rem, rem_key) = if write {
                let (d, k) = serve(ep, |_ctl| imm_pingpong::client(addr, local, key))?;
                (d, Some(k))
            } else {
                let d = serve(ep, |_ctl| oob::pingpong_client(addr, local, &cfg))
                    .map_err(|e| e.to_string())?;
                (d, None)
            };
            pp_connect(ep, c, &rem, mtu)?;
            (rem, rem_key)
        }
        None => {
            let listener = oob::listen(o.port).map_err(|e| e.to_string())?;
            let c = *c;
            serve(ep, move |ctl| {
                let connect = move |rem: &PingpongDest| {
                    let rem = *rem;
                    ctl.run(move |ep| pp_connect(ep, &c, &rem, mtu))
                };
                if write {
                    imm_pingpong::server(&listener, local, key, connect).map(|(d, k)| (d, Some(k)))
                } else {
                    oob::pingpong_server(&listener, local, &cfg, connect)
                        .map(|d| (d, None))
                        .map_err(|e| e.to_string())
                }
            })?
        }
    };
    Ok((remote, rem_key, None))
}

/// How this end's messages go out: from the send area; with `--imm`, message `k` with its
/// immediate and payload, as a SEND or (with the peer's key) an RDMA WRITE.
struct PpSender {
    c: PpCtx,
    imm: Option<ImmOp>,
    client: bool,
    size: usize,
    /// The peer's address on UD.
    dest: Option<UdDest>,
    rem_key: Option<WriteKey>,
}

impl PpSender {
    /// Posts message `k`: with --imm, its immediate and payload first.
    fn post(&self, r: &mut Rnic, k: u64) -> Result<(), String> {
        let (c, size, send_off) = (&self.c, self.size, self.c.send_off);
        let opcode = match self.imm {
            None => WrOpcode::Send,
            Some(_) => {
                let v = imm_value(self.client, k);
                let b = r.mr_bytes_mut(c.mr.lkey).expect("registered");
                for (i, x) in b[send_off..send_off + size].iter_mut().enumerate() {
                    *x = imm_pattern(v, i);
                }
                // The peer's key came with its address exactly when this is --op write.
                match self.rem_key {
                    Some(key) => WrOpcode::RdmaWriteWithImm {
                        remote_addr: key.vaddr,
                        rkey: key.rkey,
                        imm: v,
                    },
                    None => WrOpcode::SendWithImm { imm: v },
                }
            }
        };
        let mut wr = SendWr::new(
            SEND_WRID,
            opcode,
            vec![Sge {
                // From behind the GRH area on UD (as ibv_ud_pingpong); with --imm, from the
                // send area.
                addr: c.mr.addr + send_off as u64,
                length: size as u32,
                lkey: c.mr.lkey,
            }],
        );
        wr.ud = self.dest;
        r.post_send(c.qpn, wr).map_err(verr)
    }
}

/// The ping-pong (rc_pingpong.c's main loop): a SEND goes when the previous one completed and
/// a message arrived (the client starts). Returns its seconds and the messages received.
fn pp_loop(
    ep: &mut Endpoint,
    o: &PingpongOpts,
    c: &PpCtx,
    remote: &PingpongDest,
    rem_key: Option<WriteKey>,
) -> Result<(f64, u64), String> {
    let (ud, size) = (c.ud, o.size);
    let client = o.server.is_some();
    let start = Instant::now();
    let (mut scnt, mut rcnt, mut routs, mut posted) = (0u64, 0u64, o.rx_depth, 0u64);
    let mut pending = RECV_WRID;
    let peer = gid_ip(&remote.gid, "the peer")?;
    let dest = ud.then(|| UdDest {
        ah: AhAttr {
            dgid: Gid::from_ip(peer),
            hop_limit: 64,
            ..Default::default()
        },
        remote_qpn: Qpn::new(remote.qpn),
        remote_qkey: rocemu_wire::QKey(UD_PINGPONG_QKEY),
    });
    let imm_check = o.imm.map(|op| ImmCheck {
        op,
        peer_is_client: !client,
        peer_qpn: Qpn::new(remote.qpn),
        size,
        ud,
    });
    let sender = PpSender {
        c: *c,
        imm: o.imm,
        client,
        size,
        dest,
        rem_key,
    };
    if client {
        sender.post(&mut ep.rnic, posted)?;
        posted += 1;
        pending |= SEND_WRID;
    }
    let mut wcs = Vec::new();
    let mut last_progress = Instant::now();
    while rcnt < o.iters || scnt < o.iters {
        let w = ep.engine.poll(&mut ep.rnic);
        wcs.clear();
        let n = crate::poll_wcs(&mut ep.rnic, c.pd_cq, 16, &mut wcs)?;
        if n == 0 {
            ep.engine.idle(w);
            if last_progress.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "no progress for 30 s after {scnt} sends and {rcnt} receives"
                ));
            }
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({:?}) for wr_id {}",
                    wc.status.as_str(),
                    wc.status,
                    wc.wr_id
                ));
            }
            match wc.wr_id {
                SEND_WRID => {
                    let want = match o.imm {
                        Some(ImmOp::Write) => WcOpcode::RdmaWrite,
                        _ => WcOpcode::Send,
                    };
                    if wc.opcode != want {
                        return Err(format!(
                            "message {scnt} sent: completion opcode {:?}, expected {want:?}",
                            wc.opcode
                        ));
                    }
                    scnt += 1
                }
                RECV_WRID => {
                    // Before anything is posted: the peer's next message waits for ours.
                    if let Some(ic) = &imm_check {
                        let buf = ep.rnic.mr_bytes(c.mr.lkey).expect("registered");
                        ic.recv(wc, buf, rcnt)?;
                    }
                    routs -= 1;
                    if routs <= 1 {
                        let n = o.rx_depth - routs;
                        pp_post_recv(&mut ep.rnic, c, size, n)?;
                        routs += n;
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !wc.wr_id;
            if posted < o.iters && pending == 0 {
                sender.post(&mut ep.rnic, posted)?;
                posted += 1;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok((start.elapsed().as_secs_f64(), rcnt))
}

/// After the loop: `-c`'s check on the server, the rdma_cm connection ended, and the last ACK
/// let out before the port closes.
fn pp_finish(
    ep: &mut Endpoint,
    o: &PingpongOpts,
    c: &PpCtx,
    cm: Option<PpCm>,
) -> Result<(), String> {
    let client = o.server.is_some();
    if o.check && !client {
        let b = ep.rnic.mr_bytes(c.mr.lkey).expect("registered");
        if b.iter().step_by(4096).any(|&x| x != 0) {
            return Err("-c: the data the client sent is not what was expected".into());
        }
    }
    if let Some((mut cm, conn)) = cm {
        // The client ends the connection (DREQ); the server waits for that.
        if client {
            cm.disconnect_all(ep, &[conn.id], Duration::from_secs(3));
        } else {
            cm.linger(ep, &[conn.id], Duration::from_secs(3));
        }
    }
    // Let the last ACK leave.
    ep.engine
        .run_until(&mut ep.rnic, Duration::from_millis(100), |_| false);
    ep.engine.flush();
    Ok(())
}
