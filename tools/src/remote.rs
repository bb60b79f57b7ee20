//! One end of a benchmark or a pingpong on a real datapath: an [`Endpoint`] (an RNIC and the
//! engine that binds it to a port) facing a peer process, with the out-of-band exchange of
//! `ibv_rc_pingpong` or perftest over TCP ([`crate::oob`]). perftest's bandwidth and latency
//! run on the perftest engine (`perftest.rs`), the [`Endpoint`] as its end; this file
//! holds the end's set-up, the exchange around the run and its `--verify`.
//!
//! The engine must keep turning while the out-of-band exchange waits on TCP: the peer resolves
//! our MAC while it moves its QPs to RTR, and a passive server's RNIC answers the client's
//! traffic while its TCP side waits for the end of the run. So the exchange runs on a thread of
//! its own and hands the work that touches the RNIC to the engine's thread as jobs
//! ([`Ctl::run`]); the engine's thread turns the engine between jobs ([`serve`]). A DPDK port
//! is thus only ever polled from the thread that opened it.
use crate::oob::{
    self, BwReport, OobConfig, PerftestConn, PerftestDest, PerftestTest, PerftestXchg,
    PingpongDest, SysData,
};
use crate::perf::{measure_limit, Report};
use crate::perftest::{
    self, BwPlan, BwQp, End, PingOp, PingPong, ReadBack, Receiver, RunShape, RxQp, Transport,
};
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::engine::Engine;
use rocemu_emulator::inproc::pattern;
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::{Psn, Qpn};
use std::net::{IpAddr, Ipv6Addr, TcpListener};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// An RNIC bound to a port.
#[derive(Debug)]
pub struct Endpoint {
    pub rnic: Rnic,
    pub engine: Engine,
}

type Job = Box<dyn FnOnce(&mut Endpoint) + Send>;

/// The out-of-band thread's handle on the engine's thread.
#[derive(Debug, Clone)]
pub struct Ctl {
    tx: mpsc::Sender<Job>,
}

impl Ctl {
    /// Runs `f` on the engine's thread and returns its result.
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce(&mut Endpoint) -> R + Send + 'static) -> R {
        let (rtx, rrx) = mpsc::channel();
        let job: Job = Box::new(move |ep| {
            let _ = rtx.send(f(ep));
        });
        self.tx
            .send(job)
            .expect("the engine thread outlives the control thread");
        rrx.recv().expect("the engine thread runs every job")
    }
}

/// Runs `control` on a thread of its own while this thread turns the engine and runs the jobs
/// `control` hands it; returns what `control` returned.
pub fn serve<T: Send>(ep: &mut Endpoint, control: impl FnOnce(Ctl) -> T + Send) -> T {
    serve_lingering(ep, LINGER, control)
}

/// How long [`serve`] keeps answering after `control` returned: the last ACKs and answers of a
/// process about to close its port.
const LINGER: Duration = Duration::from_millis(100);

/// [`serve`], answering for `linger` after `control` returned. Zero between the steps of one
/// exchange, whose next step turns the engine again at once.
pub fn serve_lingering<T: Send>(
    ep: &mut Endpoint,
    linger: Duration,
    control: impl FnOnce(Ctl) -> T + Send,
) -> T {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::scope(|s| {
        let h = s.spawn(move || control(Ctl { tx }));
        loop {
            match rx.try_recv() {
                Ok(job) => job(ep),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => break,
            }
            let w = ep.engine.poll(&mut ep.rnic);
            ep.engine.idle(w);
        }
        // Let the last ACKs and answers leave before the port closes.
        let until = Instant::now() + linger;
        while Instant::now() < until {
            let w = ep.engine.poll(&mut ep.rnic);
            ep.engine.idle(w);
        }
        ep.engine.flush();
        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// The GID of an address as it goes on the wire (IPv4-mapped for IPv4).
pub fn gid_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The address in a GID, or an error a user can act on.
pub fn gid_ip(gid: &[u8; 16], who: &str) -> Result<IpAddr, String> {
    if gid.iter().all(|&b| b == 0) {
        return Err(format!(
            "{who} sent an all-zero GID: on RoCE both ends need a GID index (-g for the pingpong tools, -x for perftest)"
        ));
    }
    let a = Ipv6Addr::from(*gid);
    Ok(match a.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(a),
    })
}

/// A random initial PSN (where perftest and rdma-core take `lrand48() & 0xffffff`), from the
/// RNIC's key generator: as hard to guess as its R_Keys, and replayed with its seed.
pub(crate) fn random_psn(r: &mut Rnic) -> Psn {
    Psn::new(r.random_u64() as u32 & 0x00ff_ffff)
}

fn verr(e: VerbsError) -> String {
    e.to_string()
}

const RESOLVE: Duration = Duration::from_secs(5);

// ---- pingpong --------------------------------------------------------------------------------

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
/// Room for the GRH at the front of every UD receive buffer (IBTA 11.4.1.1).
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

struct PpCtx {
    pd_cq: CqId,
    qpn: Qpn,
    mr: MrInfo,
    psn: Psn,
    ud: bool,
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
                sg_list: vec![Sge {
                    addr: c.mr.addr,
                    length: len as u32,
                    lkey: c.mr.lkey,
                }],
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

/// `imm_pingpong --op write`'s message (testbed/rxevm/imm_pingpong.c): `"%08x:%016llx"` of the
/// R_Key and address the peer may write into, and a NUL, 26 bytes. Each side sends it right
/// after its 52-byte `ibv_rc_pingpong` address message, in the same direction:
/// client → server 52 + 26 bytes, server → client 52 + 26, then the client's `"done\0"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteKey {
    pub rkey: u32,
    pub vaddr: u64,
}

impl WriteKey {
    pub const LEN: usize = 26;

    pub fn to_wire(self) -> [u8; Self::LEN] {
        let t = format!("{:08x}:{:016x}", self.rkey, self.vaddr);
        let mut out = [0u8; Self::LEN];
        out[..t.len()].copy_from_slice(t.as_bytes());
        out
    }

    pub fn from_wire(m: &[u8]) -> Result<Self, String> {
        let bad = || {
            format!(
                "the peer's rkey:vaddr message is not \"%08x:%016llx\" and a NUL: {:?}",
                String::from_utf8_lossy(m)
            )
        };
        let hex = |s: &[u8]| s.iter().all(u8::is_ascii_hexdigit);
        if m.len() != Self::LEN || m[8] != b':' || m[25] != 0 || !hex(&m[..8]) || !hex(&m[9..25]) {
            return Err(bad());
        }
        // Only hex digits: the conversions cannot fail.
        let text = std::str::from_utf8(&m[..25]).map_err(|_| bad())?;
        Ok(WriteKey {
            rkey: u32::from_str_radix(&text[..8], 16).map_err(|_| bad())?,
            vaddr: u64::from_str_radix(&text[9..], 16).map_err(|_| bad())?,
        })
    }
}

/// The sockets of the `--imm --op write` exchange: `ibv_rc_pingpong`'s, with a [`WriteKey`]
/// after each address message. (`oob`'s functions speak the plain exchange only.)
mod write_xchg {
    use super::WriteKey;
    use crate::oob::{PingpongDest, PINGPONG_DONE, PINGPONG_MSG_LEN};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    /// Per message, as `oob`'s default.
    const IO_TIMEOUT: Duration = Duration::from_secs(60);
    /// How long a client retries a refused connection (the server may be starting).
    const CONNECT_FOR: Duration = Duration::from_secs(10);

    fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
        move |e| format!("{what}: {e}")
    }

    fn prepare(s: &TcpStream) -> Result<(), String> {
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| s.set_write_timeout(Some(IO_TIMEOUT)))
            .map_err(io("setting the socket's timeouts"))
    }

    fn send(s: &mut TcpStream, my: &PingpongDest, key: WriteKey) -> Result<(), String> {
        let mut m = my.to_wire().to_vec();
        m.extend_from_slice(&key.to_wire());
        s.write_all(&m)
            .map_err(io("sending our address and rkey:vaddr"))
    }

    fn recv(s: &mut TcpStream) -> Result<(PingpongDest, WriteKey), String> {
        let mut m = [0u8; PINGPONG_MSG_LEN + WriteKey::LEN];
        s.read_exact(&mut m)
            .map_err(io("reading the peer's address and rkey:vaddr"))?;
        let dest = PingpongDest::from_wire(&m[..PINGPONG_MSG_LEN]).map_err(|e| e.to_string())?;
        Ok((dest, WriteKey::from_wire(&m[PINGPONG_MSG_LEN..])?))
    }

    pub fn client(
        addr: (&str, u16),
        my: &PingpongDest,
        key: WriteKey,
    ) -> Result<(PingpongDest, WriteKey), String> {
        let until = Instant::now() + CONNECT_FOR;
        let mut s = loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(e)
                    if Instant::now() < until
                        && e.kind() == std::io::ErrorKind::ConnectionRefused =>
                {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => return Err(format!("couldn't connect to {}:{}: {e}", addr.0, addr.1)),
            }
        };
        prepare(&s)?;
        send(&mut s, my, key)?;
        let rem = recv(&mut s)?;
        s.write_all(PINGPONG_DONE).map_err(io("sending \"done\""))?;
        Ok(rem)
    }

    /// As `oob::pingpong_server`: `connect` moves the QP to RTR and RTS before the answer.
    pub fn server(
        listener: &TcpListener,
        my: &PingpongDest,
        key: WriteKey,
        connect: impl FnOnce(&PingpongDest) -> Result<(), String>,
    ) -> Result<(PingpongDest, WriteKey), String> {
        let (mut s, _) = listener.accept().map_err(io("accept()"))?;
        prepare(&s)?;
        let rem = recv(&mut s)?;
        connect(&rem.0).map_err(|e| format!("couldn't connect to the remote QP: {e}"))?;
        send(&mut s, my, key)?;
        let mut done = [0u8; PINGPONG_DONE.len()];
        s.read_exact(&mut done)
            .map_err(io("reading the client's \"done\""))?;
        if &done != PINGPONG_DONE {
            return Err(format!(
                "expected \"done\\0\" from the client, got {:?}",
                String::from_utf8_lossy(&done)
            ));
        }
        Ok(rem)
    }
}

/// Runs one end of `ibv_rc_pingpong`, `ibv_uc_pingpong` or `ibv_ud_pingpong` (client when
/// `o.server` is set); with `o.imm`, of `imm_pingpong`.
/// `--rdma-cm`: the QP (in INIT, receives posted) connected through rdma_cm, the client to the
/// server's `port`, the server accepting the first REQ there. Returns the CM (the connection
/// is ended through it) and the peer's address as the TCP exchange would have given it.
fn pp_rdma_cm(
    ep: &mut Endpoint,
    o: &PingpongOpts,
    c: &PpCtx,
) -> Result<((crate::rdmacm::Cm, crate::rdmacm::RcConn), PingpongDest), String> {
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

pub fn pingpong(ep: &mut Endpoint, o: &PingpongOpts) -> Result<PingpongResult, String> {
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
    };
    pp_post_recv(r, &c, o.size, o.rx_depth)?;
    let local = PingpongDest {
        lid: 0,
        qpn: qpn.value(),
        psn: c.psn.value(),
        gid: gid_bytes(r.ips()[0]),
    };
    let key = WriteKey {
        rkey: mr.rkey,
        vaddr: mr.addr,
    };
    let write = o.imm == Some(ImmOp::Write);
    let cfg = OobConfig::default();
    let mtu = o.mtu;
    let mut cm = None;
    let (remote, rem_key) = match &o.server {
        _ if o.rdma_cm => {
            let (c2, rem) = pp_rdma_cm(ep, o, &c)?;
            cm = Some(c2);
            (rem, None)
        }
        Some(server) => {
            let addr = (server.as_str(), o.port);
            let (rem, rem_key) = if write {
                let (d, k) = serve(ep, |_ctl| write_xchg::client(addr, &local, key))?;
                (d, Some(k))
            } else {
                let d = serve(ep, |_ctl| oob::pingpong_client(addr, &local, &cfg))
                    .map_err(|e| e.to_string())?;
                (d, None)
            };
            pp_connect(ep, &c, &rem, mtu)?;
            (rem, rem_key)
        }
        None => {
            let listener = oob::listen(o.port).map_err(|e| e.to_string())?;
            let c_qpn = c.qpn;
            let c_psn = c.psn;
            let c_mr = c.mr;
            serve(ep, move |ctl| {
                let connect = move |rem: &PingpongDest| {
                    let rem = *rem;
                    ctl.run(move |ep| {
                        let c = PpCtx {
                            pd_cq: cq,
                            qpn: c_qpn,
                            mr: c_mr,
                            psn: c_psn,
                            ud,
                        };
                        pp_connect(ep, &c, &rem, mtu)
                    })
                };
                if write {
                    write_xchg::server(&listener, &local, key, connect).map(|(d, k)| (d, Some(k)))
                } else {
                    oob::pingpong_server(&listener, &local, &cfg, connect)
                        .map(|d| (d, None))
                        .map_err(|e| e.to_string())
                }
            })?
        }
    };
    let client = o.server.is_some();
    let size = o.size;
    // The ping-pong (rc_pingpong.c's main loop): a SEND goes when the previous one completed
    // and a message arrived (the client starts).
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
    // Posts message `k`: with --imm, its immediate and payload first.
    let post_send = |r: &mut Rnic, k: u64| -> Result<(), String> {
        let opcode = match o.imm {
            None => WrOpcode::Send,
            Some(_) => {
                let v = imm_value(client, k);
                let b = r.mr_bytes_mut(c.mr.lkey).expect("registered");
                for (i, x) in b[send_off..send_off + size].iter_mut().enumerate() {
                    *x = imm_pattern(v, i);
                }
                // The peer's key came with its address exactly when this is --op write.
                match rem_key {
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
        wr.ud = dest;
        r.post_send(c.qpn, wr).map_err(verr)
    };
    if client {
        post_send(&mut ep.rnic, posted)?;
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
                        pp_post_recv(&mut ep.rnic, &c, size, n)?;
                        routs += n;
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !wc.wr_id;
            if posted < o.iters && pending == 0 {
                post_send(&mut ep.rnic, posted)?;
                posted += 1;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
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
    Ok(PingpongResult {
        local,
        remote,
        bytes: (size as u64) * o.iters * 2,
        iters: o.iters,
        seconds,
        imm: o.imm.map(|op| (o.transport, op, rcnt)),
    })
}

// ---- perf ------------------------------------------------------------------------------------

/// Which perftest benchmark, and its options (both ends must agree on the ones perftest does
/// not exchange: size, iterations, QPs).
#[derive(Debug, Clone)]
pub struct PerfOpts {
    pub test: crate::perf::Test,
    pub server: Option<String>,
    pub port: u16,
    pub size: usize,
    /// Messages per QP.
    pub iters: u64,
    pub qps: usize,
    /// The path MTU asked for (the smaller of the two ends' is used).
    pub mtu: Mtu,
    pub tx_depth: usize,
    /// A completion every this many work requests (perftest's CQ moderation, -Q).
    pub cq_mod: usize,
    pub verify: bool,
    pub qp_timeout: u8,
    /// Latency instead of bandwidth (ib_*_lat): one QP, one message in flight.
    pub lat: bool,
    /// perftest's `-R`: connect through rdma_cm and run the exchange on an RC QP of its own.
    pub rdma_cm: bool,
    /// perftest's `-o`: the reads and atomics this end accepts as responder in the read and
    /// atomic tests, which it advertises as out_reads (None: 16, perftest's default; capped at the
    /// device's `max_qp_rd_atom`, as perftest does).
    pub out_reads: Option<u16>,
}

/// Outstanding reads and atomics per QP that RoCEmu advertises (perftest's out_reads).
pub(crate) const OUT_READS: u16 = 16;
/// Receives a send-test server keeps posted per QP (perftest's rx depth).
pub(crate) const RX_DEPTH: usize = 512;

impl PerfOpts {
    pub(crate) fn perftest(&self) -> PerftestTest {
        use crate::perf::Test;
        match (self.test, self.lat) {
            (Test::Write, false) => PerftestTest::WriteBw,
            (Test::Read, false) => PerftestTest::ReadBw,
            (Test::Send, false) => PerftestTest::SendBw,
            (Test::Atomic { .. }, false) => PerftestTest::AtomicBw,
            (Test::Write, true) => PerftestTest::WriteLat,
            (Test::Read, true) => PerftestTest::ReadLat,
            (Test::Send, true) => PerftestTest::SendLat,
            (Test::Atomic { .. }, true) => PerftestTest::AtomicLat,
        }
    }

    /// Bytes of one QP's region: the message, at least a page (perftest's rule).
    fn region(&self) -> usize {
        self.size.max(4096).next_multiple_of(64)
    }
}

/// One QP's side of the test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerfQp {
    pub(crate) qpn: Qpn,
    pub(crate) psn: Psn,
    /// The QP's region in the MR: `mr.addr + off`.
    pub(crate) off: usize,
}

pub(crate) struct PerfSetup {
    pub(crate) cq: CqId,
    pub(crate) mr: MrInfo,
    pub(crate) qps: Vec<PerfQp>,
}

fn access_for(server: bool, lat: bool) -> Access {
    // A RoCEmu server opens its regions to every remote access so that a RoCEmu client's
    // --verify can read back what it did (perftest's own server grants only what its test needs).
    // In the latency tests both ends write into each other (ib_write_lat).
    if server || lat {
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
    } else {
        Access::LOCAL_WRITE
    }
}

/// The bytes a RoCEmu server's region starts with: known to a verifying client from the
/// region's address alone.
fn server_pattern(vaddr: u64, n: usize) -> Vec<u8> {
    pattern(vaddr ^ 0x5eed, n)
}

pub(crate) fn perf_setup(r: &mut Rnic, o: &PerfOpts, server: bool) -> Result<PerfSetup, String> {
    let res = perf_resources(r, o, server)?;
    perf_qps(r, o, server, &res)
}

/// What a perf end keeps from one run to the next: the PD, the CQ and the MR (perftest makes
/// one of each per process).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerfResources {
    pd: PdId,
    cq: CqId,
    mr: MrInfo,
}

pub(crate) fn perf_resources(
    r: &mut Rnic,
    o: &PerfOpts,
    server: bool,
) -> Result<PerfResources, String> {
    let pd = r.alloc_pd();
    let depth = if server { RX_DEPTH } else { o.tx_depth };
    let cq = r.create_cq((depth + 8) * o.qps).map_err(verr)?;
    let region = o.region();
    // Client: each QP's source / destination region, then a read-back area for --verify.
    // Latency: the region the peer writes into, then the one this end sends from.
    let len = region * o.qps * if server && !o.lat { 1 } else { 2 };
    let mr = r.reg_mr(pd, len, access_for(server, o.lat)).map_err(verr)?;
    Ok(PerfResources { pd, cq, mr })
}

/// One run's QPs on `res`, and the regions filled afresh.
pub(crate) fn perf_qps(
    r: &mut Rnic,
    o: &PerfOpts,
    server: bool,
    res: &PerfResources,
) -> Result<PerfSetup, String> {
    let PerfResources { pd, cq, mr } = *res;
    let region = o.region();
    let mut qps = Vec::with_capacity(o.qps);
    for i in 0..o.qps {
        let qpn = r
            .create_qp(
                pd,
                QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: o.tx_depth.max(8) as u32,
                        max_recv_wr: RX_DEPTH as u32,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                },
            )
            .map_err(verr);
        let qpn = match qpn {
            Ok(q) => q,
            Err(e) => {
                destroy_qps(r, &qps);
                return Err(e);
            }
        };
        qps.push(PerfQp {
            qpn,
            psn: random_psn(r),
            off: i * region,
        });
    }
    let bytes = r.mr_bytes_mut(mr.lkey).expect("just registered");
    for q in &qps {
        let v = mr.addr + q.off as u64;
        let fill = if o.lat {
            // ib_write_lat polls the last byte of its region for the peer's counter: zeros.
            vec![0u8; region]
        } else if server {
            server_pattern(v, region)
        } else {
            pattern(v, region)
        };
        bytes[q.off..q.off + region].copy_from_slice(&fill);
    }
    Ok(PerfSetup { cq, mr, qps })
}

/// The out_reads this end advertises: its own responder resources (`max_dest_rd_atomic`),
/// which the peer takes as its initiator depth (perftest: 1 in the write and send tests).
pub(crate) fn own_out_reads(ep: &Endpoint, o: &PerfOpts) -> u16 {
    match o.test {
        crate::perf::Test::Read | crate::perf::Test::Atomic { .. } => {
            let cap = ep.rnic.query_device().max_qp_rd_atom.min(u8::MAX as u32) as u16;
            o.out_reads.unwrap_or(OUT_READS).clamp(1, cap)
        }
        _ => 1,
    }
}

/// Destroys a run's QPs; a completion of theirs still in the CQ is drained by the next run.
pub(crate) fn destroy_qps(r: &mut Rnic, qps: &[PerfQp]) {
    for q in qps {
        let _ = r.destroy_qp(q.qpn);
    }
}

pub(crate) fn dests(ep: &Endpoint, o: &PerfOpts, s: &PerfSetup) -> Vec<PerftestDest> {
    let out_reads = own_out_reads(ep, o);
    s.qps
        .iter()
        .map(|q| PerftestDest {
            lid: 0,
            out_reads,
            qpn: q.qpn.value(),
            psn: q.psn.value(),
            rkey: s.mr.rkey,
            vaddr: s.mr.addr + q.off as u64,
            gid: gid_bytes(ep.rnic.ips()[0]),
            srqn: 0,
        })
        .collect()
}

fn perf_connect(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
    mtu: Mtu,
) -> Result<(), String> {
    if rem.len() != s.qps.len() {
        return Err(format!(
            "the peer has {} QPs, this end {}: give both the same -q",
            rem.len(),
            s.qps.len()
        ));
    }
    let peer = gid_ip(&rem[0].gid, "the peer")?;
    ep.engine.resolve(&mut ep.rnic, peer, RESOLVE)?;
    // As perftest: this end's responder resources are its own out_reads, the ones it
    // advertised; its reads in flight are bounded by the peer's (oob.rs). Taking the peer's for
    // both left a server facing a peer that advertises 1 with one responder resource, so a
    // retransmitted READ older than the latest found nothing to re-execute from.
    let own = own_out_reads(ep, o) as u8;
    let init_cap = ep
        .rnic
        .query_device()
        .max_qp_init_rd_atom
        .min(u8::MAX as u32) as u16;
    for (q, d) in s.qps.iter().zip(rem) {
        let c = ConnectOpts {
            mtu,
            timeout: o.qp_timeout,
            max_rd_atomic: d.out_reads.clamp(1, init_cap) as u8,
            max_dest_rd_atomic: own,
            ..Default::default()
        };
        bring_up(
            &mut ep.rnic,
            q.qpn,
            Qpn::new(d.qpn),
            peer,
            q.psn,
            Psn::new(d.psn),
            &c,
        )
        .map_err(|e| format!("modify QP {:#x}: {e}", q.qpn.value()))?;
    }
    Ok(())
}

pub(crate) fn post_server_recvs(
    r: &mut Rnic,
    o: &PerfOpts,
    s: &PerfSetup,
    qi: usize,
    n: usize,
) -> Result<(), String> {
    let q = s.qps[qi];
    let buf = Sge {
        addr: s.mr.addr + q.off as u64,
        length: o.size as u32,
        lkey: s.mr.lkey,
    };
    perftest::post_receives(r, qi, q.qpn, buf, n)
}

/// What a perf end prints and returns.
#[derive(Debug, Clone)]
pub struct PerfOutcome {
    /// This end's figures (client), or the client's as it reported them (server, when the test
    /// exchanges reports).
    pub report: Option<Report>,
    pub peer_version: String,
    pub mtu: usize,
    pub lines: Vec<String>,
}

/// Runs one end of perftest's bandwidth test `o.test` (client when `o.server` is set).
pub fn perf(ep: &mut Endpoint, o: &PerfOpts) -> Result<PerfOutcome, String> {
    if o.rdma_cm {
        return crate::perftest_cm::perf(ep, o);
    }
    let server = o.server.is_none();
    let res = perf_resources(&mut ep.rnic, o, server)?;
    let listener = match server {
        true => Some(oob::listen(o.port).map_err(|e| e.to_string())?),
        false => None,
    };
    perf_run(ep, o, &res, listener.as_ref(), LINGER)
}

/// A perf server that answers `runs` clients one after another (None: until killed) on one
/// TCP listener, one PD, one CQ and one MR; each client gets QPs of its own, destroyed after
/// its run. `each` sees every run's outcome; a failed run does not end the server. Returns the
/// runs that failed.
pub fn perf_serve(
    ep: &mut Endpoint,
    o: &PerfOpts,
    runs: Option<u64>,
    mut each: impl FnMut(u64, &Result<PerfOutcome, String>),
) -> Result<u64, String> {
    if o.server.is_some() || o.rdma_cm {
        return Err("perf_serve: a TCP-exchange server (no SERVER, no -R)".into());
    }
    let res = perf_resources(&mut ep.rnic, o, true)?;
    let l = oob::listen(o.port).map_err(|e| e.to_string())?;
    let mut failed = 0;
    let mut n = 0;
    let mut wcs = Vec::new();
    while runs.is_none_or(|r| n < r) {
        // The engine keeps turning while the next client is awaited: no linger.
        let out = perf_run(ep, o, &res, Some(&l), Duration::ZERO);
        n += 1;
        if out.is_err() {
            failed += 1;
        }
        each(n, &out);
        // Completions of the destroyed QPs (a send test's receives, flushed or not).
        while ep.rnic.poll_cq_into(res.cq, 64, &mut wcs) > 0 {
            wcs.clear();
        }
    }
    Ok(failed)
}

/// One run of a perf end on resources made before; its QPs are destroyed when it ends, however
/// it ends. `linger`: how long the last exchange keeps answering before returning.
fn perf_run(
    ep: &mut Endpoint,
    o: &PerfOpts,
    res: &PerfResources,
    listener: Option<&TcpListener>,
    linger: Duration,
) -> Result<PerfOutcome, String> {
    let server = o.server.is_none();
    let setup = perf_qps(&mut ep.rnic, o, server, res)?;
    let out = perf_exchange(ep, o, &setup, listener, linger);
    destroy_qps(&mut ep.rnic, &setup.qps);
    out
}

fn perf_exchange(
    ep: &mut Endpoint,
    o: &PerfOpts,
    setup: &PerfSetup,
    listener: Option<&TcpListener>,
    linger: Duration,
) -> Result<PerfOutcome, String> {
    let server = o.server.is_none();
    let active = ep.rnic.active_mtu();
    let want = o.mtu.bytes().min(active.bytes());
    let my = dests(ep, o, setup);
    let test = o.perftest();
    let cfg = OobConfig::default();
    // Between the steps the engine is turned again at once: no linger.
    let mut conn = match (&o.server, listener) {
        (Some(addr), _) => {
            let a = (addr.as_str(), o.port);
            serve_lingering(ep, Duration::ZERO, |_| PerftestConn::connect(a, &cfg))
                .map_err(|e| e.to_string())?
        }
        (None, Some(l)) => serve_lingering(ep, Duration::ZERO, |_| PerftestConn::accept(l, &cfg))
            .map_err(|e| e.to_string())?,
        (None, None) => return Err("a perf server needs its listener".into()),
    };
    let neg = serve_lingering(ep, Duration::ZERO, |_| {
        conn.preamble(SysData::default(), want as u32)
    })
    .map_err(|e| e.to_string())?;
    let mtu = Mtu::from_bytes(neg.mtu as usize).unwrap_or(active);
    // Setup and connect on the out-of-band thread; the QPs are moved by the engine's thread.
    let setup_parts = (setup.cq, setup.mr, setup.qps.clone());
    let o2 = o.clone();
    let my2 = my.clone();
    let rem = serve_lingering(ep, Duration::ZERO, move |ctl| {
        conn.setup_qps(test, &my2, |rem| {
            let rem = rem.to_vec();
            let o3 = o2.clone();
            let (cq, mr, qps) = (setup_parts.0, setup_parts.1, setup_parts.2.clone());
            ctl.run(move |ep| {
                let s = PerfSetup { cq, mr, qps };
                perf_connect(ep, &o3, &s, &rem, mtu)?;
                if server && test == PerftestTest::SendBw {
                    for qi in 0..s.qps.len() {
                        post_server_recvs(&mut ep.rnic, &o3, &s, qi, RX_DEPTH)?;
                    }
                }
                if test == PerftestTest::SendLat {
                    // Both ends receive; posted before the sync so that no first SEND meets RNR.
                    post_server_recvs(&mut ep.rnic, &o3, &s, 0, 2)?;
                }
                Ok(())
            })
        })
        .map(|rem| (rem, conn))
    })
    .map_err(|e| e.to_string())?;
    let (rem, conn) = rem;
    let mut ex = TcpExchange(conn, linger);
    data_phase(ep, o, setup, &my, &rem, mtu, neg.remote_version, &mut ex)
}

/// The exchange steps after the QPs are connected.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step<'a> {
    /// [`PerftestXchg::sync`].
    Sync,
    /// [`PerftestXchg::close`].
    Close,
    /// [`PerftestXchg::finish`] with this end's report.
    Finish(PerftestTest, &'a BwReport),
}

impl Step<'_> {
    pub(crate) fn run(
        self,
        x: &mut impl PerftestXchg,
        my0: &PerftestDest,
    ) -> oob::OobResult<Option<BwReport>> {
        match self {
            Step::Sync => x.sync(my0).map(|_| None),
            Step::Close => x.close(my0).map(|_| None),
            Step::Finish(test, my) => x.finish(test, my0, my),
        }
    }
}

/// The carrier of perftest's exchange (TCP, or perftest `-R`'s rdma_cm QP): runs a [`Step`]
/// while the engine keeps turning. `patient`: no deadline (a passive server waits there for
/// the client's whole run).
pub(crate) trait Exchange {
    fn step(
        &mut self,
        ep: &mut Endpoint,
        my0: &PerftestDest,
        step: Step,
        patient: bool,
    ) -> Result<Option<BwReport>, String>;
}

/// perftest's exchange over TCP, on a thread of its own while the engine's thread turns.
/// The linger: after the last step only (the server's run, the client's report).
struct TcpExchange(PerftestConn, Duration);

impl Exchange for TcpExchange {
    fn step(
        &mut self,
        ep: &mut Endpoint,
        my0: &PerftestDest,
        step: Step,
        patient: bool,
    ) -> Result<Option<BwReport>, String> {
        if patient {
            self.0.set_io_timeout(None);
        }
        let linger = match step {
            Step::Sync => Duration::ZERO,
            Step::Close | Step::Finish(..) => self.1,
        };
        serve_lingering(ep, linger, |_| step.run(&mut self.0, my0)).map_err(|e| e.to_string())
    }
}

/// Everything from the last set-up exchange to the end: the run, `--verify`, the closing
/// exchanges.
#[allow(clippy::too_many_arguments)]
pub(crate) fn data_phase(
    ep: &mut Endpoint,
    o: &PerfOpts,
    setup: &PerfSetup,
    my: &[PerftestDest],
    rem: &[PerftestDest],
    mtu: Mtu,
    peer_version: String,
    ex: &mut dyn Exchange,
) -> Result<PerfOutcome, String> {
    let server = o.server.is_none();
    let test = o.perftest();
    let my0 = my[0];
    if matches!(test, PerftestTest::SendBw | PerftestTest::SendLat) {
        ex.step(ep, &my0, Step::Sync, false)?;
    }
    let mut lines = Vec::new();
    if o.lat {
        let rep = run_lat(ep, o, setup, rem, mtu, server)?;
        // A passive read/atomic latency server waits for the client's whole run in the
        // closing exchange.
        let patient = server && matches!(test, PerftestTest::ReadLat | PerftestTest::AtomicLat);
        ex.step(ep, &my0, Step::Finish(test, &BwReport::default()), patient)?;
        return Ok(PerfOutcome {
            report: rep,
            peer_version,
            mtu: mtu.bytes(),
            lines,
        });
    }
    if server {
        let report = if test == PerftestTest::SendBw {
            let got = serve_send(ep, o, setup)?;
            ex.step(ep, &my0, Step::Close, false)?;
            lines.push(format!(" server: {got} messages received"));
            None
        } else {
            // The server waits in the report exchange for the client's whole run.
            let rep = ex.step(ep, &my0, Step::Finish(test, &BwReport::default()), true)?;
            rep.map(|b| client_report(o, &b, mtu))
        };
        return Ok(PerfOutcome {
            report,
            peer_version,
            mtu: mtu.bytes(),
            lines,
        });
    }
    let mut rep = run_client(ep, o, setup, rem, mtu)?;
    if o.verify {
        let (ok, detail) = verify(ep, o, setup, rem)?;
        rep.verified = Some(ok);
        rep.verify_detail = detail;
    }
    let b = BwReport {
        size: o.size as u64,
        iters: rep.messages,
        bw_peak: rep.bw_peak_mbps * 1e6 / 1048576.0,
        bw_avg: rep.bytes as f64 / rep.seconds / 1048576.0,
        msg_rate_avg: rep.mpps,
        per_port: None,
    };
    ex.step(ep, &my0, Step::Finish(test, &b), false)?;
    Ok(PerfOutcome {
        report: Some(rep),
        peer_version,
        mtu: mtu.bytes(),
        lines,
    })
}

/// The client's figures as its report said them (what perftest's server prints).
pub(crate) fn client_report(o: &PerfOpts, b: &BwReport, mtu: Mtu) -> Report {
    let bytes = b.size * b.iters;
    let seconds = if b.bw_avg > 0.0 {
        bytes as f64 / (b.bw_avg * 1048576.0)
    } else {
        0.0
    };
    Report {
        test: o.test.name(),
        size: b.size as usize,
        iters: b.iters,
        qps: o.qps,
        mtu: mtu.bytes(),
        seconds,
        bytes,
        messages: b.iters,
        gbps: b.bw_avg * 1048576.0 * 8.0 / 1e9,
        mpps: b.msg_rate_avg,
        bw_peak_mbps: b.bw_peak * 1048576.0 / 1e6,
        ..Default::default()
    }
}

/// A send-test server: keeps receives posted (the [`RX_DEPTH`] posted before the run, then one
/// more per message until each QP has had its `iters`) until every QP got its `iters` messages.
pub(crate) fn serve_send(ep: &mut Endpoint, o: &PerfOpts, s: &PerfSetup) -> Result<u64, String> {
    let want = o.iters * o.qps as u64;
    let qps = s
        .qps
        .iter()
        .map(|q| RxQp {
            qpn: q.qpn,
            addr: s.mr.addr + q.off as u64,
            off: q.off,
            posted: RX_DEPTH as u64,
            done: 0,
        })
        .collect();
    let (len, ring) = (o.size as u32, RX_DEPTH as u64);
    let mut rx = Receiver::new(s.cq, s.mr.lkey, ring, Some(o.iters), len, 1, qps);
    let mut total = 0;
    let mut last = Instant::now();
    while total < want {
        let w = ep.progress();
        let n = rx.turn(&mut ep.rnic, 64, |wc, _, _, _| match wc.status {
            WcStatus::Success => Ok(()),
            st => Err(format!("receive completion {st:?}")),
        })?;
        if n == 0 {
            ep.idle(w);
            if last.elapsed() > Duration::from_secs(60) {
                return Err(format!("no message for 60 s after {total} of {want}"));
            }
            continue;
        }
        last = Instant::now();
        total += n as u64;
    }
    Ok(total)
}

/// The process's end of a run: its RNIC, turned by its engine; the peer is another process.
impl End for Endpoint {
    const PEAK_WINDOW: Duration = Duration::from_millis(100);
    const POLL_BATCH: usize = 64;
    const STOP_AT_FIRST_ERROR: bool = true;

    fn rnic(&mut self) -> &mut Rnic {
        &mut self.rnic
    }

    fn progress(&mut self) -> usize {
        self.engine.poll(&mut self.rnic)
    }

    fn idle(&mut self, work: usize) {
        self.engine.idle(work)
    }

    fn describe_error(&mut self, wc: &Wc) -> String {
        format!("{:?} on QP {:#x}", wc.status, wc.qp_num.value())
    }

    fn stalled(&mut self, completed: u64, total: u64) -> String {
        format!(
            "no completion for 30 s after {completed} of {total}; counters {:?}",
            self.rnic.counters()
        )
    }
}

/// The client's bandwidth run, on the engine ([`perftest::bandwidth`]).
pub(crate) fn run_client(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
    mtu: Mtu,
) -> Result<Report, String> {
    use crate::perf::Test;
    let c0 = ep.rnic.counters();
    let limit_gbps = measure_limit(o.size as u64 * o.iters * o.qps as u64, mtu.bytes());
    let len = match o.test {
        Test::Atomic { .. } => 8,
        _ => o.size as u32,
    };
    let mut qps: Vec<BwQp> = s
        .qps
        .iter()
        .zip(rem)
        .map(|(q, d)| {
            let local = Sge {
                addr: s.mr.addr + q.off as u64,
                length: len,
                lkey: s.mr.lkey,
            };
            BwQp::new(q.qpn, local, d.vaddr, d.rkey)
        })
        .collect();
    let plan = BwPlan {
        test: o.test,
        iters: o.iters,
        duration: None,
        tx_depth: o.tx_depth,
        cq_mod: o.cq_mod,
        cq: s.cq,
        msg_bytes: o.size as u64,
        cas_chain: false,
    };
    let run = perftest::bandwidth(ep, &plan, &mut qps)?;
    let shape = RunShape {
        test: o.test,
        size: o.size,
        qps: o.qps,
        mtu: mtu.bytes(),
        iters: o.iters * o.qps as u64,
        limit_gbps,
    };
    let t = Transport::since(&c0, &ep.rnic.counters());
    Ok(perftest::bw_report(&shape, o.size as u64, run, t))
}

/// Checks the run through the wire by reading back the server's regions (a RoCEmu server
/// grants that; perftest's own does not, so --verify needs a RoCEmu server).
pub(crate) fn verify(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
) -> Result<(bool, String), String> {
    use crate::perf::Test;
    let region = o.region();
    let back = o.qps * region;
    let n = match o.test {
        Test::Atomic { .. } => 8,
        _ => o.size,
    };
    for (qi, d) in rem.iter().enumerate() {
        let q = s.qps[qi];
        let b = ReadBack {
            qpn: q.qpn,
            into: Sge {
                addr: s.mr.addr + (back + q.off) as u64,
                length: n as u32,
                lkey: s.mr.lkey,
            },
            remote_addr: d.vaddr,
            rkey: d.rkey,
        };
        let Some(st) = perftest::read_back(ep, s.cq, &[b], Duration::from_secs(30))? else {
            return Ok((false, format!("QP {qi}: the read-back did not complete")));
        };
        if st[0] != WcStatus::Success {
            return Ok((
                false,
                format!("QP {qi}: the read-back failed ({:?}; a perftest server does not grant remote reads)", st[0]),
            ));
        }
        let b = ep.rnic.mr_bytes(s.mr.lkey).expect("registered");
        let remote_now = &b[back + q.off..back + q.off + n];
        let mine = &b[q.off..q.off + n];
        let theirs0 = server_pattern(d.vaddr, n);
        let (ok, what) = match o.test {
            // What was written or sent is what the server's region holds.
            Test::Write | Test::Send => (
                remote_now == mine,
                "the server's region differs from what was sent",
            ),
            // What was read is what the server's region held (and still holds).
            Test::Read => (
                mine == &theirs0[..] && remote_now == &theirs0[..],
                "what was read differs from the server's data",
            ),
            Test::Atomic { cmp_swap } => {
                let initial = u64::from_le_bytes(theirs0[..8].try_into().expect("8 bytes"));
                let now = u64::from_le_bytes(remote_now.try_into().expect("8 bytes"));
                let expect = if cmp_swap {
                    if initial == 0 {
                        0
                    } else {
                        initial
                    }
                } else {
                    initial.wrapping_add(o.iters)
                };
                if now != expect {
                    return Ok((
                        false,
                        format!("QP {qi}: the final value is {now:#x}, expected {expect:#x} (initial {initial:#x} + {} adds)", o.iters),
                    ));
                }
                (true, "")
            }
        };
        if !ok {
            return Ok((false, format!("QP {qi}: {what}")));
        }
    }
    Ok((true, String::new()))
}

/// perftest's latency tests, on the engine. WRITE: each end writes its counter into the last
/// byte of the peer's region and waits for the peer's counter in its own (ib_write_lat), the
/// server first; SEND: a ping-pong of SENDs, the client first (ib_send_lat); READ and atomics:
/// the client times each operation alone, the server is passive (ib_read_lat, ib_atomic_lat).
/// The client measures; the server returns no figures.
pub(crate) fn run_lat(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
    mtu: Mtu,
    server: bool,
) -> Result<Option<Report>, String> {
    use crate::perf::Test;
    let q = s.qps[0];
    let d = rem[0];
    let size = o.size as u32;
    let recv = Sge {
        addr: s.mr.addr + q.off as u64,
        length: size,
        lkey: s.mr.lkey,
    };
    let send = Sge {
        addr: s.mr.addr + (o.qps * o.region() + q.off) as u64,
        ..recv
    };
    let passive = server && matches!(o.test, Test::Read | Test::Atomic { .. });
    if passive {
        return Ok(None);
    }
    let c0 = ep.rnic.counters();
    let start = Instant::now();
    let lat = match o.test {
        Test::Write | Test::Send => {
            let (op, first) = match o.test {
                Test::Write => (PingOp::Write, server),
                _ => (PingOp::Send, !server),
            };
            let mut pp = PingPong::new(
                op,
                q.qpn,
                s.cq,
                s.mr.addr,
                recv,
                send,
                (d.vaddr, d.rkey),
                o.iters,
                first,
                !server,
            );
            perftest::ping_pong(ep, &mut pp)?;
            pp.lat
        }
        Test::Read | Test::Atomic { .. } => {
            let (remote_addr, rkey) = (d.vaddr, d.rkey);
            let (op, len) = match o.test {
                Test::Read => (WrOpcode::RdmaRead { remote_addr, rkey }, size),
                Test::Atomic { cmp_swap: false } => (
                    WrOpcode::AtomicFetchAdd {
                        remote_addr,
                        rkey,
                        add: 1,
                    },
                    8,
                ),
                _ => (
                    WrOpcode::AtomicCmpSwap {
                        remote_addr,
                        rkey,
                        compare: 0,
                        swap: 0,
                    },
                    8,
                ),
            };
            let local = Sge {
                length: len,
                ..recv
            };
            let stall = "read/atomic latency: no completion for 30 s";
            let wr = |_| SendWr::new(0, op, vec![local]);
            let (lat, _, first) = perftest::one_at_a_time(ep, q.qpn, s.cq, o.iters, wr, stall)?;
            if let Some(st) = first {
                return Err(format!("read/atomic latency: {st:?}"));
            }
            lat
        }
    };
    // Let the last ACK leave before the closing exchange.
    ep.engine
        .run_until(&mut ep.rnic, Duration::from_millis(20), |_| false);
    if server {
        return Ok(None);
    }
    let seconds = start.elapsed().as_secs_f64();
    let shape = RunShape {
        test: o.test,
        size: o.size,
        qps: 1,
        mtu: mtu.bytes(),
        iters: o.iters,
        limit_gbps: 0.0,
    };
    let t = Transport::since(&c0, &ep.rnic.counters());
    Ok(Some(perftest::lat_report(
        &shape,
        o.size as u64,
        seconds,
        lat,
        t,
    )))
}
