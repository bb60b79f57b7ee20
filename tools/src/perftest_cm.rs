//! perftest's `-R` (`--rdma_cm`) on RoCEmu: the connections go through rdma_cm (the IB CM over
//! QP1, [`crate::rdmacm`]) and perftest's exchange runs as SENDs on an RC QP of its own instead
//! of TCP. Either end works against `ib_*_bw -R` / `ib_*_lat -R` of perftest 4.5.
//!
//! Read from perftest 4.5-0.17 (`src/perftest_communication.c`: `create_comm_struct`,
//! `rdma_client_connect`, `rdma_server_connect`, `ctx_xchg_data_rdma`, `rdma_{read,write}_keys`,
//! `create_rdma_cm_connection`; `src/write_bw.c` and the other mains) and checked against
//! `wire/tests/data/cm/write_bw_rdma_cm.pcap` (two rxe peers); none of its code is used here.
//!
//! # The sequence (client C, server S)
//!
//! 1. **The exchange connection**: S listens on rdma_cm's TCP port space at `-p` (default 18515);
//!    C connects an RC QP to it (REQ/REP/RTU; `rnr_retry_count` 7). That QP carries every
//!    exchange message: `xchg(n)` is "C SENDs n bytes then waits for n; S waits for n then SENDs
//!    n", each side keeping one receive posted (perftest: `rx_depth` 1, re-posted before it
//!    answers). S then closes its listener.
//! 2. The preamble as over TCP: versions (16 bytes), page size and cache line (4 + 4), MTU (2).
//! 3. `create_rdma_cm_connection`: one address exchange, then C connects each test QP through
//!    rdma_cm to the same port (S listens again first — only after its answer in that exchange,
//!    so C's first REQ may find no listener; perftest's client retries 10 times 100 ms apart),
//!    then one more address exchange. Addresses are the 56-byte binary `struct pingpong_dest`
//!    ([`PerftestDest::to_binary`]).
//! 4. From here the sequence of the TCP exchange, minus `ctx_connect` (rdma_cm already moved the
//!    QPs to RTS), and the close is the address exchange alone (no `"done"`).
//! 5. At the end C disconnects the test QPs, then the exchange QP (DREQ/DREP); S's `rdma_destroy_id`
//!    sends its own DREQ for a connection still up.
//!
//! The QPs' PSNs come from the CM (each end's Starting PSN is the PSN it expects to receive); the
//! PSNs in the address messages are not used.
use crate::oob::{
    mtu_to_enum, DestForm, OobError, OobErrorKind, OobResult, PerftestDest, PerftestTest,
    PerftestXchg, Role, SysData,
};
use crate::perf_end::{dests, perf_setup, post_server_recvs, RX_DEPTH};
use crate::rdmacm::{server_ip, Cm, RcConn, RcSide, CM_TIMEOUT};
use crate::remote::{data_phase, random_psn, Endpoint, Exchange, PerfOpts, PerfOutcome, Step};
use rocemu_emulator::cm::CmEvent;
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::cm::CommId;
use rocemu_wire::Qpn;
use std::time::{Duration, Instant};

/// Receive slots on the exchange QP; each holds the largest message (56 bytes).
const SLOTS: usize = 4;
const SLOT: usize = 64;
const ID_SEND: u64 = u64::MAX;
/// Local ACK timeout exponent of the exchange QP: 4.096 µs × 2^17 ≈ 0.5 s, so that with its 7
/// retries it rides out a slow peer (a TCG guest stalls for tenths of a second) where `-u` may be
/// tuned short for the test QPs. (rdma_cm itself gives RoCE QPs the path's packet lifetime + 1,
/// about 2 s.)
const CTL_ACK_TIMEOUT: u8 = 17;
/// How long one exchange message may take unless a step says otherwise.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// REJ "no listener" answers to a test QP's REQ tolerated (100 ms apart): the server listens
/// again only after the address exchange before, and a TCG guest may take a while.
const REJ_RETRIES: u32 = 50;

/// perftest's exchange QP.
struct Control {
    qpn: Qpn,
    send_cq: CqId,
    recv_cq: CqId,
    mr: MrInfo,
    conn: Option<RcConn>,
    timeout: Option<Duration>,
}

impl Control {
    fn new(ep: &mut Endpoint) -> Result<Control, String> {
        let r = &mut ep.rnic;
        let pd = r.alloc_pd();
        let e = |e: VerbsError| e.to_string();
        let send_cq = r.create_cq(8).map_err(e)?;
        let recv_cq = r.create_cq(SLOTS + 4).map_err(e)?;
        let mr = r
            .reg_mr(pd, (SLOTS + 1) * SLOT, Access::LOCAL_WRITE)
            .map_err(e)?;
        let qpn = r
            .create_qp(
                pd,
                QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq,
                    recv_cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: 4,
                        max_recv_wr: SLOTS as u32,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: true,
                },
            )
            .map_err(e)?;
        Ok(Control {
            qpn,
            send_cq,
            recv_cq,
            mr,
            conn: None,
            timeout: Some(IO_TIMEOUT),
        })
    }

    fn post_recv(&self, r: &mut Rnic, slot: usize) -> Result<(), String> {
        r.post_recv(
            self.qpn,
            RecvWr {
                wr_id: slot as u64,
                sg_list: [Sge {
                    addr: self.mr.addr + (slot * SLOT) as u64,
                    length: SLOT as u32,
                    lkey: self.mr.lkey,
                }]
                .into(),
            },
        )
        .map_err(|e| e.to_string())
    }

    fn post_recvs(&self, r: &mut Rnic) -> Result<(), String> {
        (0..SLOTS).try_for_each(|i| self.post_recv(r, i))
    }

    fn id(&self) -> Option<CommId> {
        self.conn.map(|c| c.id)
    }
}

/// The exchange steps on the exchange QP, the engine and the CM turning while they wait.
struct CmXchg<'a> {
    ep: &'a mut Endpoint,
    cm: &'a mut Cm,
    ctl: &'a mut Control,
    role: Role,
}

fn oob_err(kind: OobErrorKind, m: String) -> OobError {
    OobError::new(kind, m)
}

impl CmXchg<'_> {
    /// One turn, and an error if the peer ended the exchange connection.
    fn turn(&mut self, what: &str, since: Instant) -> OobResult<()> {
        self.cm
            .pump(self.ep)
            .map_err(|e| oob_err(OobErrorKind::Io, e))?;
        let id = self.ctl.id();
        if self
            .cm
            .take(|e| matches!(e, CmEvent::Disconnected { id: d } if Some(*d) == id))
            .is_some()
        {
            return Err(oob_err(
                OobErrorKind::Closed,
                format!("the peer disconnected the rdma_cm exchange connection while we waited for {what}"),
            ));
        }
        if self.ctl.timeout.is_some_and(|t| since.elapsed() > t) {
            return Err(oob_err(
                OobErrorKind::Timeout,
                format!(
                    "no {what} within {} s",
                    self.ctl.timeout.unwrap_or_default().as_secs()
                ),
            ));
        }
        Ok(())
    }

    fn send(&mut self, msg: &[u8], what: &str) -> OobResult<()> {
        let c = &*self.ctl;
        let off = SLOTS * SLOT;
        self.ep.rnic.mr_bytes_mut(c.mr.lkey).expect("registered")[off..off + msg.len()]
            .copy_from_slice(msg);
        let wr = SendWr::new(
            ID_SEND,
            WrOpcode::Send,
            vec![Sge {
                addr: c.mr.addr + off as u64,
                length: msg.len() as u32,
                lkey: c.mr.lkey,
            }],
        );
        self.ep
            .rnic
            .post_send(c.qpn, wr)
            .map_err(|e| oob_err(OobErrorKind::Io, format!("sending {what}: {e}")))?;
        let t = Instant::now();
        loop {
            if let Some(wc) = self.ep.rnic.poll_cq(self.ctl.send_cq, 1).pop() {
                return if wc.status == WcStatus::Success {
                    Ok(())
                } else {
                    Err(oob_err(
                        OobErrorKind::Io,
                        format!("sending {what}: completion {:?}", wc.status),
                    ))
                };
            }
            self.turn(&format!("the ACK of {what}"), t)?;
        }
    }

    fn recv(&mut self, len: usize, what: &str) -> OobResult<Vec<u8>> {
        let t = Instant::now();
        loop {
            if let Some(wc) = self.ep.rnic.poll_cq(self.ctl.recv_cq, 1).pop() {
                if wc.status != WcStatus::Success {
                    return Err(oob_err(
                        OobErrorKind::Io,
                        format!("receiving {what}: completion {:?}", wc.status),
                    ));
                }
                let slot = wc.wr_id as usize;
                let off = slot * SLOT;
                let got = self.ep.rnic.mr_bytes(self.ctl.mr.lkey).expect("registered")
                    [off..off + SLOT.min(wc.byte_len as usize)]
                    .to_vec();
                self.ctl
                    .post_recv(&mut self.ep.rnic, slot)
                    .map_err(|e| oob_err(OobErrorKind::Io, e))?;
                if got.len() != len {
                    return Err(oob_err(
                        OobErrorKind::Malformed,
                        format!("{what}: {} bytes came, {len} expected", wc.byte_len),
                    ));
                }
                return Ok(got);
            }
            self.turn(what, t)?;
        }
    }
}

impl PerftestXchg for CmXchg<'_> {
    fn xchg(&mut self, mine: &[u8], what: &str) -> OobResult<Vec<u8>> {
        match self.role {
            Role::Client => {
                self.send(mine, &format!("our {what}"))?;
                self.recv(mine.len(), &format!("the server's {what}"))
            }
            Role::Server => {
                let theirs = self.recv(mine.len(), &format!("the client's {what}"))?;
                self.send(mine, &format!("our {what}"))?;
                Ok(theirs)
            }
        }
    }

    fn dest_form(&self) -> DestForm {
        DestForm::Binary
    }
}

/// The exchange after set-up, for [`data_phase`].
struct CmExchange<'a> {
    cm: &'a mut Cm,
    ctl: &'a mut Control,
    role: Role,
}

impl CmExchange<'_> {
    fn with<T>(
        &mut self,
        ep: &mut Endpoint,
        patient: bool,
        f: impl FnOnce(&mut CmXchg) -> OobResult<T>,
    ) -> Result<T, String> {
        self.ctl.timeout = if patient { None } else { Some(IO_TIMEOUT) };
        let mut x = CmXchg {
            ep,
            cm: self.cm,
            ctl: self.ctl,
            role: self.role,
        };
        f(&mut x).map_err(|e| e.to_string())
    }
}

impl Exchange for CmExchange<'_> {
    fn step(
        &mut self,
        ep: &mut Endpoint,
        my0: &PerftestDest,
        step: Step,
        patient: bool,
    ) -> Result<Option<crate::oob::BwReport>, String> {
        self.with(ep, patient, |x| step.run(x, my0))
    }
}

/// Runs one end of a perftest benchmark with `-R` (client when `o.server` is set).
pub(crate) fn perf(ep: &mut Endpoint, o: &PerfOpts) -> Result<PerfOutcome, String> {
    let role = if o.server.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let server = role == Role::Server;
    let test = o.perftest();
    let peer = o
        .server
        .as_deref()
        .map(|s| server_ip(s, o.port, true))
        .transpose()?;
    let active = ep.rnic.active_mtu();
    let want = o.mtu.bytes().min(active.bytes());
    let setup = perf_setup(&mut ep.rnic, o, server)?;
    let my = dests(ep, o, &setup);
    let mut cm = Cm::new(ep)?;
    let mut ctl = Control::new(ep)?;
    // perftest asks for reads/atomics in flight only in the tests that use them.
    // Both are this end's out_reads (-o), as perftest fills rdma_conn_param; the CM settles
    // each side's responder resources and initiator depth from them.
    let reads = match o.test {
        crate::perf::Test::Read | crate::perf::Test::Atomic { .. } => {
            crate::perf_end::own_out_reads(ep, o) as u8
        }
        _ => 0,
    };
    let side = |qpn, path_mtu, psn| RcSide {
        qpn,
        psn,
        path_mtu,
        responder_resources: reads,
        initiator_depth: reads,
        timeout: o.qp_timeout,
    };
    let want_enum = mtu_to_enum(want as u32).unwrap_or(3);
    // 1. The exchange connection.
    let ctl_side = RcSide {
        timeout: CTL_ACK_TIMEOUT,
        ..side(ctl.qpn, want_enum, random_psn(&mut ep.rnic))
    };
    ctl.conn = Some(match peer {
        Some(ip) => {
            let c = cm.connect_rc(ep, ip, o.port, &ctl_side, REJ_RETRIES)?;
            ctl.post_recvs(&mut ep.rnic)?;
            c
        }
        None => {
            cm.listen(o.port);
            cm.accept_rc(ep, &ctl_side, Duration::MAX, |ep| {
                ctl.post_recvs(&mut ep.rnic)
            })?
        }
    });
    let mut conns: Vec<CommId> = ctl.id().into_iter().collect();
    let result = (|| {
        // 2. The preamble.
        let mut x = CmXchg {
            ep,
            cm: &mut cm,
            ctl: &mut ctl,
            role,
        };
        let neg = x
            .preamble(SysData::default(), want as u32)
            .map_err(|e| e.to_string())?;
        let mtu = Mtu::from_bytes(neg.mtu as usize).unwrap_or(active);
        // 3. The test QPs, through rdma_cm between two address exchanges.
        x.hand_shake(&my[0]).map_err(|e| e.to_string())?;
        let mtu_enum = mtu_to_enum(mtu.bytes() as u32).unwrap_or(want_enum);
        for (qi, q) in setup.qps.iter().enumerate() {
            let mut me = side(q.qpn, mtu_enum, random_psn(&mut ep.rnic));
            me.psn = q.psn;
            let c = match peer {
                Some(ip) => {
                    let c = cm.connect_rc(ep, ip, o.port, &me, REJ_RETRIES)?;
                    if test == PerftestTest::SendLat {
                        post_server_recvs(&mut ep.rnic, o, &setup, qi, 2)?;
                    }
                    c
                }
                None => cm.accept_rc(ep, &me, CM_TIMEOUT, |ep| match test {
                    // Receives before the REP: the client may send as soon as it has it.
                    PerftestTest::SendBw => {
                        post_server_recvs(&mut ep.rnic, o, &setup, qi, RX_DEPTH)
                    }
                    PerftestTest::SendLat => post_server_recvs(&mut ep.rnic, o, &setup, qi, 2),
                    _ => Ok(()),
                })?,
            };
            conns.push(c.id);
        }
        let mut x = CmXchg {
            ep,
            cm: &mut cm,
            ctl: &mut ctl,
            role,
        };
        x.hand_shake(&my[0]).map_err(|e| e.to_string())?;
        // 4. The rest of the set-up exchanges, with nothing to do where TCP connects the QPs.
        let rem = x
            .setup_qps(test, &my, |_| Ok(()))
            .map_err(|e| e.to_string())?;
        let mut ex = CmExchange {
            cm: &mut cm,
            ctl: &mut ctl,
            role,
        };
        data_phase(ep, o, &setup, &my, &rem, mtu, neg.remote_version, &mut ex)
    })();
    // 5. Disconnect: the client ends the test QPs, then the exchange QP; the server waits for
    //    that, and disconnects what is still up after a while.
    let (ctl_ids, test_ids) = conns.split_at(1.min(conns.len()));
    if server {
        cm.linger(ep, &conns, Duration::from_secs(3));
        cm.disconnect_all(ep, &conns, Duration::from_secs(2));
    } else {
        cm.disconnect_all(ep, test_ids, Duration::from_secs(3));
        cm.disconnect_all(ep, ctl_ids, Duration::from_secs(3));
    }
    result
}
