//! The body of the `rnic` fuzz target, here so that its corpus also runs as a plain test
//! (`emulator/tests/fuzz_corpus.rs`): arbitrary frames and verbs calls against an RNIC with a
//! connected RC QP, a UC QP and a UD QP. Panics are the findings; so is any write outside a
//! memory region, which is checked with guard regions that nothing may change.
//!
//! Built only with the `fuzzing` feature: fuzz/ turns it on, and so do this crate's own tests
//! (through its dev-dependency on itself); a plain build of the library leaves it out.
use crate::connect::{bring_up, ConnectOpts};
use crate::inproc::{IP_A, IP_B, MAC_A, MAC_B};
use crate::rnic::mr::MrInfo;
use crate::rnic::*;
use crate::time::Nanos;
use rocemu_wire::eth::EthernetRepr;
use rocemu_wire::frame::{pad_for, IpRepr};
use rocemu_wire::{
    BthRepr, ExtHeaders, FrameRepr, Opcode, Psn, QKey, Qpn, RKey, RethRepr, ROCEV2_UDP_PORT,
};

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (b, r) = self.0.split_first()?;
        self.0 = r;
        Some(*b)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes([
            self.u8()?,
            self.u8()?,
            self.u8()?,
            self.u8()?,
        ]))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(self.u32()? as u64 | (self.u32()? as u64) << 32)
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// The guards' pattern: eight bytes nothing else produces, repeated.
const GUARD: [u8; 8] = [0x9d, 0x3c, 0xe1, 0x57, 0x08, 0xb2, 0x6f, 0xd4];

/// True when `p` holds eight consecutive guard bytes (at any phase of the pattern).
fn has_guard(p: &[u8]) -> bool {
    p.windows(8)
        .any(|w| (0..8).any(|k| (0..8).all(|i| w[i] == GUARD[(i + k) % 8])))
}

/// Sends everything the RNIC wants to send; no packet may carry guard bytes: that would be a
/// read outside the target region.
fn drain(r: &mut Rnic, now: Nanos, out: &mut [u8]) {
    while let Some(n) = r.poll_transmit(now, out) {
        if let Ok(p) = rocemu_wire::parse_frame(&out[..n]) {
            assert!(
                !has_guard(p.payload),
                "guard bytes left the RNIC in a {} packet",
                p.opcode()
            );
        }
    }
}

/// The RNIC under test: a connected RC QP, a UC QP and a UD QP, and a memory region open to
/// everything between two guard regions open to nothing remote.
struct Bench {
    r: Rnic,
    cq: CqId,
    qps: [Qpn; 3],
    mr: MrInfo,
    guards: [MrInfo; 2],
    /// The QPs' PD and another, for re-registering the target region into either.
    pds: [PdId; 2],
    peer: Qpn,
    o: ConnectOpts,
    now: Nanos,
}

impl Bench {
    fn new() -> Bench {
        let mut r = Rnic::new(RnicConfig::new(MAC_B, IP_B, 7));
        r.set_neighbor(IP_A, MAC_A);
        let pd = r.alloc_pd();
        let pd2 = r.alloc_pd();
        let cq = r.create_cq(256).unwrap();
        let cap = QpCap {
            max_send_wr: 32,
            max_recv_wr: 32,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        let mk = |r: &mut Rnic, t| {
            r.create_qp(
                pd,
                QpInitAttr {
                    qp_type: t,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap,
                    sq_sig_all: true,
                },
            )
            .unwrap()
        };
        let rc = mk(&mut r, QpType::Rc);
        let uc = mk(&mut r, QpType::Uc);
        let ud = mk(&mut r, QpType::Ud);
        // Guard, target, guard: the target is open to everything; the guards to nothing remote.
        let g1 = r.reg_mr_at(pd, 0x10000, 4096, Access::LOCAL_WRITE).unwrap();
        let mr = r.reg_mr_at(pd, 0x11000, 4096, Access::ALL).unwrap();
        let g2 = r.reg_mr_at(pd, 0x12000, 4096, Access::LOCAL_WRITE).unwrap();
        let o = ConnectOpts {
            timeout: 4,
            retry_cnt: 2,
            rnr_retry: 2,
            ..Default::default()
        };
        let peer = Qpn::new(0x123);
        for q in [rc, uc, ud] {
            let _ = bring_up(&mut r, q, peer, IP_A, o.psn_b, o.psn_a, &o);
        }
        Bench {
            r,
            cq,
            qps: [rc, uc, ud],
            mr,
            guards: [g1, g2],
            pds: [pd, pd2],
            peer,
            o,
            now: Nanos(0),
        }
    }

    /// A well-formed request to one of our QPs with fuzzed fields (commands 1–3; 3 also flips
    /// a byte).
    fn request(&mut self, c: &mut Cursor<'_>, cmd: u8, qp: Qpn) {
        let op = Opcode::new(c.u8().unwrap_or(4) % 0x30).unwrap_or(Opcode::RC_SEND_ONLY);
        let op = if cmd >> 4 == 2 {
            Opcode::new(0x64 + (op.value() & 1)).unwrap()
        } else {
            op
        };
        let psn = Psn::new(
            self.o
                .psn_a
                .value()
                .wrapping_add(c.u8().unwrap_or(0) as u32)
                .wrapping_sub(8),
        );
        let plen = c.u8().unwrap_or(0) as usize * 4;
        let info = op.info();
        let mut bth = BthRepr::new(op, qp, psn);
        bth.ack_req = true;
        let payload = if info.has_payload() { plen } else { 0 };
        bth.pad = pad_for(payload);
        let va = 0x10000 + (c.u32().unwrap_or(0) as u64 % 0x3000);
        let rkey = if c.u8().unwrap_or(0) & 1 == 0 {
            self.mr.rkey
        } else {
            c.u32().unwrap_or(0)
        };
        let len = c.u32().unwrap_or(0) % 9000;
        let h = rocemu_wire::opcode::hdr::RETH;
        let ext = ExtHeaders {
            reth: info.has(h).then_some(RethRepr {
                va,
                rkey: RKey(rkey),
                dma_len: len,
            }),
            atomic: info.has(rocemu_wire::opcode::hdr::ATOMIC_ETH).then_some(
                rocemu_wire::AtomicEthRepr {
                    va,
                    rkey: RKey(rkey),
                    swap_add: 1,
                    compare: 0,
                },
            ),
            aeth: info
                .has(rocemu_wire::opcode::hdr::AETH)
                .then_some(rocemu_wire::AethRepr {
                    syndrome: rocemu_wire::Syndrome(c.u8().unwrap_or(0)),
                    msn: rocemu_wire::Msn::new(0),
                }),
            atomic_ack: info
                .has(rocemu_wire::opcode::hdr::ATOMIC_ACK_ETH)
                .then_some(rocemu_wire::AtomicAckEthRepr { orig: 5 }),
            imm: info.has(rocemu_wire::opcode::hdr::IMM).then_some(1),
            ieth: info
                .has(rocemu_wire::opcode::hdr::IETH)
                .then_some(RKey(rkey)),
            deth: info
                .has(rocemu_wire::opcode::hdr::DETH)
                .then_some(rocemu_wire::DethRepr {
                    qkey: QKey(self.o.qkey.0 ^ (c.u8().unwrap_or(0) as u32 & 1)),
                    src_qpn: self.peer,
                    resv: 0,
                }),
            feth: None,
        };
        let f = FrameRepr {
            eth: EthernetRepr {
                dst: MAC_B,
                src: MAC_A,
                vlan: None,
                ethertype: 0,
            },
            ip: IpRepr::roce(IP_A, IP_B, 0, 64, 0),
            sport: 0xc000,
            dport: ROCEV2_UDP_PORT,
            bth,
            ext,
        };
        let mut buf = vec![0u8; f.frame_len(payload)];
        if f.emit(&mut buf, payload, |d| d.fill(0xab)).is_ok() {
            // Flip one byte now and then (the ICRC then drops it, or not if it was masked).
            if cmd & 0x0f == 3 && !buf.is_empty() {
                let i = c.u8().unwrap_or(0) as usize % buf.len();
                buf[i] ^= 0x5a;
            }
            // Through the receive path a port uses (the frame in a buffer the RNIC may mask
            // in place, the fast path first), and every other time through the immutable one.
            if cmd & 0x10 == 0 {
                self.r.handle_frame_mut(self.now, &mut buf);
            } else {
                self.r.handle_frame(self.now, &buf);
            }
        }
    }

    /// `post_send` with a fuzzed opcode, local and remote addresses.
    fn post_send(&mut self, c: &mut Cursor<'_>, qp: Qpn) {
        let k = c.u8().unwrap_or(0);
        let addr = 0x10000 + (c.u32().unwrap_or(0) as u64 % 0x3400);
        let length = c.u32().unwrap_or(0) % 5000;
        let lkey = if k & 0x80 == 0 {
            self.mr.lkey
        } else {
            c.u32().unwrap_or(0)
        };
        let remote = c.u64().unwrap_or(0);
        let opcode = match k % 8 {
            0 => WrOpcode::Send,
            1 => WrOpcode::SendWithImm { imm: 3 },
            2 => WrOpcode::SendWithInv {
                invalidate_rkey: self.mr.rkey,
            },
            3 => WrOpcode::RdmaWrite {
                remote_addr: remote,
                rkey: 9,
            },
            4 => WrOpcode::RdmaWriteWithImm {
                remote_addr: remote,
                rkey: 9,
                imm: 1,
            },
            5 => WrOpcode::RdmaRead {
                remote_addr: remote,
                rkey: 9,
            },
            6 => WrOpcode::AtomicCmpSwap {
                remote_addr: remote,
                rkey: 9,
                compare: 1,
                swap: 2,
            },
            _ => WrOpcode::AtomicFetchAdd {
                remote_addr: remote,
                rkey: 9,
                add: 1,
            },
        };
        let mut w = SendWr::new(k as u64, opcode, vec![Sge { addr, length, lkey }]);
        if k & 0x40 != 0 {
            w.flags = SendFlags::INLINE | SendFlags::SIGNALED;
            w.inline_data = vec![7; (length % 100) as usize];
        }
        w.ud = Some(UdDest {
            ah: AhAttr::to(IP_A, MAC_A),
            remote_qpn: self.peer,
            remote_qkey: QKey(c.u32().unwrap_or(0)),
        });
        let _ = self.r.post_send(qp, w);
    }

    fn post_recv(&mut self, c: &mut Cursor<'_>, qp: Qpn) {
        let addr = 0x10000 + (c.u32().unwrap_or(0) as u64 % 0x3400);
        let length = c.u32().unwrap_or(0) % 5000;
        let _ = self.r.post_recv(
            qp,
            RecvWr {
                wr_id: 1,
                sg_list: [Sge {
                    addr,
                    length,
                    lkey: self.mr.lkey,
                }]
                .into(),
            },
        );
    }

    /// `modify_qp` to a fuzzed state with a fuzzed mask.
    fn modify_qp(&mut self, c: &mut Cursor<'_>, qp: Qpn) {
        let st = [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Err,
        ][c.u8().unwrap_or(0) as usize % 7];
        let mask = QpAttrMask(c.u32().unwrap_or(1) & 0x1f_ffff);
        let attr = QpAttr {
            qp_state: st,
            ..Default::default()
        };
        let _ = self.r.modify_qp(qp, &attr, mask);
    }
}

/// Runs one fuzz input: a stream of commands, each a byte (the low nibble the command, the high
/// one the QP) and its operands: a raw frame (0), a request with fuzzed fields (1–3), a post
/// (4, 5), a modify (6), time passing (7), a CQ resized (9), the target region re-registered
/// (10), the transmit queue drained and the CQ polled (the rest).
pub fn rnic_target(data: &[u8]) {
    let mut b = Bench::new();
    let mut c = Cursor(data);
    let mut out = vec![0u8; 10_000];
    let mut steps = 0;
    while let Some(cmd) = c.u8() {
        steps += 1;
        if steps > 256 {
            break;
        }
        let qp = b.qps[(cmd >> 4) as usize % 3];
        match cmd & 0x0f {
            // A raw frame.
            0 => {
                let n = c.u8().unwrap_or(0) as usize * 8;
                let mut f = c.bytes(n).to_vec();
                b.r.handle_frame_mut(b.now, &mut f);
            }
            1..=3 => b.request(&mut c, cmd, qp),
            4 => b.post_send(&mut c, qp),
            5 => b.post_recv(&mut c, qp),
            6 => b.modify_qp(&mut c, qp),
            7 => {
                b.now = b.now + Nanos(c.u32().unwrap_or(0) as u64 * 64);
                b.r.handle_timeout(b.now);
            }
            // `ibv_resize_cq` to any depth, bigger or smaller than what the CQ holds.
            9 => {
                let _ = b.r.resize_cq(b.cq, c.u32().unwrap_or(0) as usize % 600);
            }
            // `ibv_rereg_mr` of the target region: its PD, its access (any bits), or both;
            // the guards keep theirs.
            10 => {
                let k = c.u8().unwrap_or(0);
                let pd = (k & 1 != 0).then_some(b.pds[(k >> 1) as usize & 1]);
                let access = (k & 4 != 0).then_some(Access(c.u8().unwrap_or(0) as u32 & 0x3f));
                let _ = b.r.rereg_mr(b.mr.lkey, pd, None, access);
            }
            _ => {
                drain(&mut b.r, b.now, &mut out);
                let _ = b.r.poll_cq(b.cq, 64);
            }
        }
    }
    drain(&mut b.r, b.now, &mut out);
    // Guards: no remote operation may have written them (they grant no remote access), and
    // local writes only happen through receive or read buffers inside the target region.
    for g in b.guards {
        assert!(
            b.r.mr_bytes(g.lkey).unwrap().iter().all(|&b| b == 0),
            "a guard region was written"
        );
    }
}

/// The `cm_agent` fuzz target: arbitrary MADs against a CM agent with a connection in every
/// state (`cm::fuzz`).
pub fn cm_agent_target(data: &[u8]) {
    crate::cm::fuzz::target(data)
}
