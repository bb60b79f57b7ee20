//! What a scenario is, and the hands it gets: the agent, the peer, and helpers that set up a
//! connection between a QP on the device and the peer's fake QP.
use crate::agent::{
    Agent, AgentError, Ah, DeviceInfo, ModifyQp, MrInfo, QpInit, RecvWr, Sge, WorkCompletion,
};
use crate::cite::Cite;
use crate::peer::{Craft, Peer};
use rocemu_emulator::rnic::{Access, QpState, QpType};
use rocemu_wire::{Opcode, Psn, QKey, Qpn};
use std::time::Duration;

/// A scenario's verdict: `Err` says precisely what was expected and what came.
pub type Outcome = Result<(), String>;

/// How an `Err` that is not a failure starts: the device lacks an optional feature the scenario
/// is about (IBA 1.5 FLUSH, ATOMIC WRITE). The runner reports it as "unsupported", beside pass and
/// fail ([`unsupported`]).
pub const UNSUPPORTED: &str = "unsupported: ";

/// The verdict of a scenario whose feature the device does not have: neither pass nor fail.
pub fn unsupported(why: &str) -> Outcome {
    Err(format!("{UNSUPPORTED}{why}"))
}

/// Whether a scenario's `Err` text is the "unsupported" verdict.
pub fn is_unsupported(reason: &str) -> bool {
    reason.starts_with(UNSUPPORTED)
}

/// One entry of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Stable: reports, filters and the failing-device tests refer to it.
    pub id: &'static str,
    pub title: &'static str,
    /// Where the rules it checks are written, with release and source ([`crate::cite`]).
    pub cites: &'static [Cite],
    pub run: fn(&mut Ctx<'_>) -> Outcome,
}

impl Scenario {
    /// The citations in a few words: the reports' `spec` text.
    pub fn spec(&self) -> String {
        crate::cite::spec_text(self.cites)
    }

    /// The first component of the id (`hdr`, `psn`, `rdma`, …).
    pub fn category(&self) -> &'static str {
        self.id.split('.').next().unwrap_or(self.id)
    }
}

impl From<AgentError> for String {
    fn from(e: AgentError) -> String {
        e.0
    }
}

/// What a scenario works with.
pub struct Ctx<'a> {
    pub agent: &'a mut dyn Agent,
    pub peer: Peer,
    pub dev: DeviceInfo,
    /// Seeds the peer's QPNs and PSNs (deterministic per scenario).
    rng: u64,
}

impl std::fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

/// How [`Ctx::connect`] sets up the device's side.
#[derive(Debug, Clone, Copy)]
pub struct ConnOpts {
    pub qp_type: QpType,
    /// The QP's `qp_access_flags`.
    pub qp_access: Access,
    /// The MR's access flags.
    pub mr_access: Access,
    pub mr_len: u64,
    pub path_mtu: u32,
    pub min_rnr_timer: u8,
    /// The first PSN the peer sends (the device's `rq_psn`); random when `None`.
    pub peer_psn: Option<Psn>,
    /// The device's `sq_psn`; random when `None`.
    pub dut_psn: Option<Psn>,
    /// Receives to post, each over `recv_len` bytes of the MR from offset 0.
    pub recvs: u32,
    pub recv_len: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub qkey: QKey,
    /// Stop in this state instead of RTS (RESET, INIT or RTR).
    pub stop_at: QpState,
    /// The RC QP's `max_dest_rd_atomic` (its responder resources for READs and atomics).
    pub max_dest_rd_atomic: u8,
}

impl Default for ConnOpts {
    fn default() -> ConnOpts {
        ConnOpts {
            qp_type: QpType::Rc,
            qp_access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            mr_access: Access::ALL,
            mr_len: 4096,
            path_mtu: 1024,
            min_rnr_timer: 12,
            peer_psn: None,
            dut_psn: None,
            recvs: 0,
            recv_len: 1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            qkey: QKey(0x1111_1111),
            stop_at: QpState::Rts,
            max_dest_rd_atomic: 16,
        }
    }
}

impl ConnOpts {
    /// For scenarios where the device is the requester: a local ACK timeout of about a second
    /// (code 18: 4.096 µs × 2^18), so that no retransmission on timeout mixes with what the
    /// scenario waits for, even on a slow link.
    pub fn requester() -> ConnOpts {
        ConnOpts {
            timeout: 18,
            ..Default::default()
        }
    }
}

/// A QP on the device connected to the peer's fake QP.
#[derive(Debug, Clone, Copy)]
pub struct Conn {
    pub pd: u32,
    pub cq: u32,
    pub mr: MrInfo,
    /// The device's QP.
    pub qpn: Qpn,
    /// The peer's (fake) QP.
    pub peer_qpn: Qpn,
    /// The next PSN the peer sends: what the device expects.
    pub peer_psn: Psn,
    /// The first PSN the device sends.
    pub dut_psn: Psn,
    pub mtu: u32,
    pub qkey: QKey,
}

impl<'a> Ctx<'a> {
    pub fn new(agent: &'a mut dyn Agent, peer: Peer, dev: DeviceInfo, seed: u64) -> Ctx<'a> {
        Ctx {
            agent,
            peer,
            dev,
            rng: seed | 1,
        }
    }

    /// A pseudo-random number (xorshift; deterministic per scenario).
    pub fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// A random 24-bit PSN away from the wrap, so that scenarios that do not test the wrap do
    /// not meet it by chance.
    pub fn random_psn(&mut self) -> Psn {
        Psn::new(0x1000 + (self.random() % 0x7f_0000) as u32)
    }

    /// A QP on the device, brought to `o.stop_at` towards a fake peer QP, with a PD, a CQ and
    /// an MR, and `o.recvs` receives posted.
    pub fn connect(&mut self, o: ConnOpts) -> Result<Conn, String> {
        let pd = self.agent.alloc_pd()?;
        let cq = self.agent.create_cq(64)?;
        let mr = self.agent.reg_mr(pd, o.mr_len, o.mr_access)?;
        let qpn = self.agent.create_qp(QpInit::new(pd, o.qp_type, cq))?;
        let peer_qpn = Qpn::new(0x100 + (self.random() % 0xff_0000) as u32);
        let peer_psn = o.peer_psn.unwrap_or_else(|| self.random_psn());
        let dut_psn = o.dut_psn.unwrap_or_else(|| self.random_psn());
        let c = Conn {
            pd,
            cq,
            mr,
            qpn,
            peer_qpn,
            peer_psn,
            dut_psn,
            mtu: o.path_mtu,
            qkey: o.qkey,
        };
        self.bring_up(&c, &o)?;
        Ok(c)
    }

    /// Moves the connection's QP from RESET to `o.stop_at` (INIT, RTR or RTS) towards the peer,
    /// with `c.peer_psn` and `c.dut_psn`, posting `o.recvs` receives at INIT.
    pub fn bring_up(&mut self, c: &Conn, o: &ConnOpts) -> Outcome {
        if o.stop_at == QpState::Reset {
            return Ok(());
        }
        let qpn = c.qpn;
        let ud = o.qp_type == QpType::Ud;
        self.agent.modify_qp(
            qpn,
            ModifyQp {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                qp_access_flags: (!ud).then_some(o.qp_access),
                qkey: ud.then_some(o.qkey),
                ..Default::default()
            },
        )?;
        for i in 0..o.recvs {
            self.post_recv(c, 1000 + i as u64, 0, o.recv_len)?;
        }
        if o.stop_at == QpState::Init {
            return Ok(());
        }
        self.init_to(c, o)
    }

    /// Moves the connection's QP from INIT to `o.stop_at` (RTR or RTS), as [`Ctx::bring_up`]
    /// does after INIT.
    pub fn init_to(&mut self, c: &Conn, o: &ConnOpts) -> Outcome {
        let qpn = c.qpn;
        let ud = o.qp_type == QpType::Ud;
        let rc = o.qp_type == QpType::Rc;
        let rtr = if ud {
            ModifyQp {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            }
        } else {
            ModifyQp {
                qp_state: Some(QpState::Rtr),
                path_mtu: Some(o.path_mtu),
                dest_qp_num: Some(c.peer_qpn),
                rq_psn: Some(c.peer_psn),
                ah: Some(Ah {
                    sgid_index: self.sgid_index(),
                    ..Ah::to(self.peer.ip)
                }),
                max_dest_rd_atomic: rc.then_some(o.max_dest_rd_atomic),
                min_rnr_timer: rc.then_some(o.min_rnr_timer),
                ..Default::default()
            }
        };
        self.agent.modify_qp(qpn, rtr)?;
        if o.stop_at == QpState::Rtr {
            return Ok(());
        }
        self.agent.modify_qp(
            qpn,
            ModifyQp {
                qp_state: Some(QpState::Rts),
                sq_psn: Some(c.dut_psn),
                timeout: rc.then_some(o.timeout),
                retry_cnt: rc.then_some(o.retry_cnt),
                rnr_retry: rc.then_some(o.rnr_retry),
                max_rd_atomic: rc.then_some(16),
                ..Default::default()
            },
        )?;
        Ok(())
    }

    /// The GID index of the device's address under test (the peer's `dut_ip`): the source GID of
    /// the device's address handles. RoCEmu's address is its GID 0; rdma_rxe's IPv4 GID comes
    /// after its link-local one.
    pub fn sgid_index(&self) -> u8 {
        self.dev
            .gids
            .iter()
            .position(|g| *g == self.peer.dut_ip)
            .unwrap_or(0)
            .min(255) as u8
    }

    /// Moves the peer to IPv6 for the rest of the scenario: the device's address under test
    /// becomes its first IPv6 GID (not an IPv4-mapped one), the peer's the link-local address of
    /// its MAC ([`crate::dut::link_local`]). Connections made afterwards use them. The peer
    /// first sends the device a neighbor solicitation with its link-layer address (RFC 4861
    /// 7.2.3: the receiver keeps that address for the sender), so that a device that resolves
    /// the peer through its host's IPv6 stack (rdma_rxe, in `modify_qp` to RTR) finds it at
    /// once; RoCEmu's RNIC drops the frame.
    pub fn use_ipv6(&mut self) -> Outcome {
        let dut6 = self
            .dev
            .gids
            .iter()
            .copied()
            .find(|g| matches!(g, std::net::IpAddr::V6(a) if a.to_ipv4_mapped().is_none()))
            .ok_or_else(|| {
                format!(
                    "the device has no IPv6 GID (its GIDs: {:?}): RoCEv2 ports support both \
                     IPv4 and IPv6 (Annex A17, CA17-1)",
                    self.dev.gids
                )
            })?;
        let me = crate::dut::link_local(self.peer.mac);
        self.peer.ip = std::net::IpAddr::V6(me);
        self.peer.dut_ip = dut6;
        let std::net::IpAddr::V6(target) = dut6 else {
            return Ok(());
        };
        let ns = rocemu_wire::nd::NdRepr::Solicit {
            target,
            source_mac: Some(self.peer.mac),
        };
        let mut buf = [0u8; 128];
        let n = ns.emit_frame(self.peer.mac, self.peer.dut_mac, me, target, &mut buf);
        // Until the device advertises its address (a host whose link-local address is still
        // tentative, RFC 4862 5.4, answers nothing and cannot resolve the peer either: rxe's
        // first modify_qp after boot timed out so): at most 8 solicitations, a settle time
        // apart. A device that never answers (RoCEmu's RNIC has no IPv6 stack) goes on as is.
        for _ in 0..8 {
            self.peer.send_raw(&buf[..n]);
            let from = self.peer.capture.len();
            self.peer.collect(None);
            if self.peer.capture[from..]
                .iter()
                .any(|(_, f, sent)| !*sent && advertises(f, target))
            {
                break;
            }
        }
        Ok(())
    }

    /// Posts a receive over `len` bytes of the connection's MR at `offset`.
    pub fn post_recv(&mut self, c: &Conn, wr_id: u64, offset: u64, len: u32) -> Result<(), String> {
        self.agent.post_recv(
            c.qpn,
            RecvWr {
                wr_id,
                sg: vec![Sge {
                    addr: c.mr.addr + offset,
                    length: len,
                    lkey: c.mr.lkey,
                }],
            },
        )?;
        Ok(())
    }

    /// A request from the peer's QP to the device's, at `psn`.
    pub fn req(&self, c: &Conn, op: Opcode, psn: Psn) -> Craft {
        self.peer.craft(op, c.qpn, psn)
    }

    /// Completions on the connection's CQ: up to 16, waiting up to the settle time for `min`.
    pub fn wcs(&mut self, c: &Conn, min: u32) -> Result<Vec<WorkCompletion>, String> {
        let wait = if min == 0 {
            Duration::ZERO
        } else {
            self.peer.settle
        };
        Ok(self.agent.poll_cq(c.cq, 16, min, wait)?)
    }

    /// Fails unless the CQ holds no completion.
    pub fn expect_no_wc(&mut self, c: &Conn, why: &str) -> Outcome {
        let w = self.agent.poll_cq(c.cq, 16, 1, self.peer.settle)?;
        if w.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{why}: expected no completion, got {}",
                wcs_text(&w)
            ))
        }
    }

    /// The next completion, which must have `status` (and `opcode` when given).
    pub fn expect_wc(
        &mut self,
        c: &Conn,
        status: &str,
        opcode: Option<&str>,
        why: &str,
    ) -> Result<WorkCompletion, String> {
        let w = self.agent.poll_cq(c.cq, 1, 1, self.peer.settle)?;
        match w.first() {
            Some(wc) if wc.status == status && opcode.is_none_or(|o| wc.opcode == o) => {
                Ok(wc.clone())
            }
            Some(wc) => Err(format!(
                "{why}: expected a completion {status}{}, got {wc}",
                opcode.map(|o| format!(" {o}")).unwrap_or_default()
            )),
            None => Err(format!(
                "{why}: expected a completion {status}, got none within {} ms",
                self.peer.settle.as_millis()
            )),
        }
    }

    /// Fails unless the device's QP is in `state`.
    pub fn expect_state(&mut self, c: &Conn, state: QpState, why: &str) -> Outcome {
        let a = self.agent.query_qp(c.qpn)?;
        if a.qp_state == state {
            Ok(())
        } else {
            Err(format!(
                "{why}: expected the QP in {}, it is in {}",
                crate::agent::qp_state_name(state).to_uppercase(),
                crate::agent::qp_state_name(a.qp_state).to_uppercase()
            ))
        }
    }

    /// Bytes of the connection's MR.
    pub fn mr_bytes(&mut self, c: &Conn, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        Ok(self.agent.read_mr(c.mr.lkey, offset, len)?)
    }

    pub fn fill_mr(&mut self, c: &Conn, offset: u64, bytes: &[u8]) -> Outcome {
        Ok(self.agent.write_mr(c.mr.lkey, offset, bytes)?)
    }
}

/// Whether `frame` is an IPv6 neighbor advertisement for `target`.
fn advertises(frame: &[u8], target: std::net::Ipv6Addr) -> bool {
    use rocemu_wire::eth::{EthernetRepr, ETHERTYPE_IPV6};
    use rocemu_wire::ip::{Ipv6Repr, IPV6_HEADER_LEN};
    use rocemu_wire::nd::NdRepr;
    let Ok((eth, l3)) = EthernetRepr::parse(frame) else {
        return false;
    };
    if eth.ethertype != ETHERTYPE_IPV6 {
        return false;
    }
    let Ok((ip, dgram)) = Ipv6Repr::parse(&frame[l3..]) else {
        return false;
    };
    matches!(
        NdRepr::parse(&ip, &dgram[IPV6_HEADER_LEN..]),
        Ok(NdRepr::Advert { target: t, .. }) if t == target
    )
}

/// Completions, one after the other, for failure messages.
pub fn wcs_text(w: &[WorkCompletion]) -> String {
    if w.is_empty() {
        return "none".into();
    }
    w.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// `n` bytes of a recognisable pattern.
pub fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)))
        .collect()
}

/// The PSN as the reports write it.
pub fn psn_text(p: Psn) -> String {
    format!("0x{:06x}", p.value())
}
