//! A two-RNIC test bed in virtual time: one QP pair, one MR and one CQ per side.
//!
//! The bed drives the two RNICs itself (the quinn `Pair` shape, zero wire latency) so that every
//! frame passes through a filter the test controls and lands in a log of parsed packets: tests
//! assert exact packets (opcode, PSN, AETH syndrome and MSN, RETH, ...) and may drop, duplicate
//! or replace any frame, or inject a handmade one.
#![allow(dead_code)]
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::{Cable, Impairments, Pair, Side, IP_A, IP_B, MAC_A, MAC_B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_emulator::time::Nanos;
use rocemu_wire::eth::EthernetRepr;
use rocemu_wire::frame::{pad_for, IpRepr};
use rocemu_wire::ip::Ipv4Repr;
use rocemu_wire::{
    parse_frame, AethRepr, AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, FrameRepr, Opcode, Psn,
    Qpn, RethRepr, ROCEV2_UDP_PORT,
};
use std::net::IpAddr;

pub struct End {
    pub pd: PdId,
    pub cq: CqId,
    pub qp: Qpn,
    pub mr: MrInfo,
}

/// Which way a frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    AB,
    BA,
}

/// What the filter does with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    /// Deliver it twice.
    Dup,
    /// Deliver these bytes instead.
    Replace(Vec<u8>),
}

/// One frame as sent, parsed.
#[derive(Debug, Clone)]
pub struct Pkt {
    pub t: Nanos,
    pub dir: Dir,
    pub op: Opcode,
    pub psn: u32,
    pub dqpn: Qpn,
    pub ack_req: bool,
    pub se: bool,
    pub pad: u8,
    pub aeth: Option<AethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic: Option<AtomicEthRepr>,
    pub atomic_ack: Option<u64>,
    pub deth: Option<DethRepr>,
    pub imm: Option<u32>,
    pub ieth: Option<u32>,
    pub payload: Vec<u8>,
    pub frame: Vec<u8>,
    /// What the filter decided.
    pub verdict: Verdict,
}

impl Pkt {
    pub fn parse(t: Nanos, dir: Dir, frame: &[u8]) -> Pkt {
        let p = parse_frame(frame).unwrap_or_else(|e| panic!("the RNIC sent a bad frame: {e:?}"));
        assert!(p.icrc_ok(), "the RNIC sent a bad ICRC");
        assert!(p.ip_checksum_ok(), "the RNIC sent a bad IPv4 checksum");
        Pkt {
            t,
            dir,
            op: p.bth.opcode,
            psn: p.bth.psn.value(),
            dqpn: p.bth.dqpn,
            ack_req: p.bth.ack_req,
            se: p.bth.solicited,
            pad: p.bth.pad,
            aeth: p.ext.aeth,
            reth: p.ext.reth,
            atomic: p.ext.atomic,
            atomic_ack: p.ext.atomic_ack.map(|a| a.orig),
            deth: p.ext.deth,
            imm: p.ext.imm,
            ieth: p.ext.ieth.map(|k| k.0),
            payload: p.payload.to_vec(),
            frame: frame.to_vec(),
            verdict: Verdict::Pass,
        }
    }
    /// The AETH syndrome byte.
    pub fn syn(&self) -> Option<u8> {
        self.aeth.map(|a| a.syndrome.0)
    }
    pub fn msn(&self) -> Option<u32> {
        self.aeth.map(|a| a.msn.value())
    }
    pub fn is_req(&self) -> bool {
        self.op.info().is_request()
    }
}

pub type Filter = Box<dyn FnMut(&Pkt) -> Verdict>;

/// A filter that drops every frame going way `d` and passes the rest.
pub fn drop_dir(d: Dir) -> Filter {
    Box::new(move |p| {
        if p.dir == d {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    })
}

pub struct Bed {
    pub p: Pair,
    pub a: End,
    pub b: End,
    pub log: Vec<Pkt>,
    pub filter: Filter,
    buf: Vec<u8>,
}

pub const MR_LEN: usize = 1 << 20;

/// How a bed is built.
#[derive(Clone, Copy)]
pub struct BedCfg {
    pub qp_type: QpType,
    pub seed: u64,
    pub a: ConnectOpts,
    pub b: ConnectOpts,
    pub sq_sig_all: bool,
    pub cap: QpCap,
}

impl BedCfg {
    pub fn new(t: QpType) -> BedCfg {
        BedCfg {
            qp_type: t,
            seed: 1,
            a: ConnectOpts::default(),
            b: ConnectOpts::default(),
            sq_sig_all: false,
            cap: QpCap {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            },
        }
    }
    /// The same options on both sides.
    pub fn both(mut self, f: impl Fn(&mut ConnectOpts)) -> BedCfg {
        f(&mut self.a);
        f(&mut self.b);
        self
    }
    pub fn build(self) -> Bed {
        Bed::from_cfg(&self)
    }
}

pub fn end(r: &mut Rnic, t: QpType, sq_sig_all: bool, cap: QpCap) -> End {
    let pd = r.alloc_pd();
    let cq = r.create_cq(4096).unwrap();
    let qp = r
        .create_qp(
            pd,
            QpInitAttr {
                qp_type: t,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap,
                sq_sig_all,
            },
        )
        .unwrap();
    let mr = r.reg_mr(pd, MR_LEN, Access::ALL).unwrap();
    End { pd, cq, qp, mr }
}

impl Bed {
    pub fn new(t: QpType, seed: u64, imp: Impairments, o: &ConnectOpts) -> Bed {
        let mut p = Pair::new(seed, imp);
        let c = BedCfg::new(t);
        let a = end(&mut p.a, t, false, c.cap);
        let b = end(&mut p.b, t, false, c.cap);
        p.connect(a.qp, b.qp, o).unwrap();
        Bed::wrap(p, a, b)
    }

    fn wrap(p: Pair, a: End, b: End) -> Bed {
        Bed {
            p,
            a,
            b,
            log: Vec::new(),
            filter: Box::new(|_| Verdict::Pass),
            buf: vec![0; 10_000],
        }
    }

    /// Each side brought up with its own options (the PSNs come from `c.a`).
    pub fn from_cfg(c: &BedCfg) -> Bed {
        let mut p = Pair::new(c.seed, Impairments::none());
        let a = end(&mut p.a, c.qp_type, c.sq_sig_all, c.cap);
        let b = end(&mut p.b, c.qp_type, c.sq_sig_all, c.cap);
        let (pa, pb) = (c.a.psn_a, c.a.psn_b);
        bring_up(&mut p.a, a.qp, b.qp, IP_B, pa, pb, &c.a).unwrap();
        bring_up(&mut p.b, b.qp, a.qp, IP_A, pb, pa, &c.b).unwrap();
        Bed::wrap(p, a, b)
    }

    /// As [`Bed::from_cfg`], each RNIC with its own congestion control.
    pub fn with_cc(
        c: &BedCfg,
        cc_a: rocemu_emulator::rnic::cc::CcConfig,
        cc_b: rocemu_emulator::rnic::cc::CcConfig,
    ) -> Bed {
        let mut ca = RnicConfig::new(MAC_A, IP_A, c.seed.wrapping_mul(3).wrapping_add(1));
        let mut cb = RnicConfig::new(MAC_B, IP_B, c.seed.wrapping_mul(5).wrapping_add(2));
        ca.cc = cc_a;
        cb.cc = cc_b;
        let (mut ra, mut rb) = (Rnic::new(ca), Rnic::new(cb));
        ra.set_neighbor(IP_B, MAC_B);
        rb.set_neighbor(IP_A, MAC_A);
        let mut p = Pair::with(ra, rb, Cable::new(Impairments::none(), c.seed));
        let a = end(&mut p.a, c.qp_type, c.sq_sig_all, c.cap);
        let b = end(&mut p.b, c.qp_type, c.sq_sig_all, c.cap);
        let (pa, pb) = (c.a.psn_a, c.a.psn_b);
        bring_up(&mut p.a, a.qp, b.qp, IP_B, pa, pb, &c.a).unwrap();
        bring_up(&mut p.b, b.qp, a.qp, IP_A, pb, pa, &c.b).unwrap();
        Bed::wrap(p, a, b)
    }

    pub fn rc() -> Bed {
        BedCfg::new(QpType::Rc).build()
    }

    pub fn end(&self, s: Side) -> &End {
        match s {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    pub fn qpn(&self, s: Side) -> Qpn {
        self.end(s).qp
    }

    pub fn fill(&mut self, s: Side, off: usize, data: &[u8]) {
        let lkey = self.end(s).mr.lkey;
        self.p.rnic(s).mr_bytes_mut(lkey).unwrap()[off..off + data.len()].copy_from_slice(data);
    }

    pub fn bytes(&mut self, s: Side, off: usize, len: usize) -> Vec<u8> {
        let lkey = self.end(s).mr.lkey;
        self.p.rnic(s).mr_bytes(lkey).unwrap()[off..off + len].to_vec()
    }

    pub fn sge(&self, s: Side, off: usize, len: usize) -> Sge {
        let mr = self.end(s).mr;
        Sge {
            addr: mr.addr + off as u64,
            length: len as u32,
            lkey: mr.lkey,
        }
    }

    pub fn raddr(&self, s: Side, off: usize) -> (u64, u32) {
        let mr = self.end(s).mr;
        (mr.addr + off as u64, mr.rkey)
    }

    pub fn post_send(&mut self, s: Side, wr: SendWr) {
        let qp = self.end(s).qp;
        self.p.rnic(s).post_send(qp, wr).unwrap();
    }

    pub fn try_post_send(&mut self, s: Side, wr: SendWr) -> Result<(), VerbsError> {
        let qp = self.end(s).qp;
        self.p.rnic(s).post_send(qp, wr)
    }

    pub fn post_recv(&mut self, s: Side, wr_id: u64, off: usize, len: usize) {
        let sge = self.sge(s, off, len);
        self.post_recv_sges(s, wr_id, vec![sge]);
    }

    pub fn post_recv_sges(&mut self, s: Side, wr_id: u64, sg_list: Vec<Sge>) {
        let qp = self.end(s).qp;
        self.p
            .rnic(s)
            .post_recv(
                qp,
                RecvWr {
                    wr_id,
                    sg_list: sg_list.into(),
                },
            )
            .unwrap();
    }

    // ---- the driver ------------------------------------------------------------------------

    pub fn now(&self) -> Nanos {
        self.p.now
    }

    /// Moves every frame both sides want to send now through the filter (and into the log),
    /// delivers what passes, then serves the timers due. True when a frame moved.
    pub fn step(&mut self) -> bool {
        let now = self.p.now;
        let mut moved = false;
        let mut to_a: Vec<Vec<u8>> = Vec::new();
        let mut to_b: Vec<Vec<u8>> = Vec::new();
        for side in [Side::A, Side::B] {
            loop {
                let rnic = match side {
                    Side::A => &mut self.p.a,
                    Side::B => &mut self.p.b,
                };
                let Some(n) = rnic.poll_transmit(now, &mut self.buf) else {
                    break;
                };
                moved = true;
                let frame = self.buf[..n].to_vec();
                let dir = if side == Side::A { Dir::AB } else { Dir::BA };
                let mut pkt = Pkt::parse(now, dir, &frame);
                let v = (self.filter)(&pkt);
                let q = if side == Side::A {
                    &mut to_b
                } else {
                    &mut to_a
                };
                match &v {
                    Verdict::Pass => q.push(frame),
                    Verdict::Drop => {}
                    Verdict::Dup => {
                        q.push(frame.clone());
                        q.push(frame);
                    }
                    Verdict::Replace(f) => q.push(f.clone()),
                }
                pkt.verdict = v;
                self.log.push(pkt);
            }
        }
        for f in to_b {
            self.p.b.handle_frame(now, &f);
        }
        for f in to_a {
            self.p.a.handle_frame(now, &f);
        }
        self.p.a.handle_timeout(now);
        self.p.b.handle_timeout(now);
        // A timer that fired may have queued work for now (a retransmission): that is
        // progress too, or the clock would jump past it. (inproc::Pair::step misses this.)
        moved || self.p.a.wants_transmit() || self.p.b.wants_transmit()
    }

    pub fn next_timer(&mut self) -> Option<Nanos> {
        [self.p.a.poll_timeout(), self.p.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs until `done` holds, jumping the clock to the next timer when nothing moves.
    pub fn run_until(
        &mut self,
        max_steps: u64,
        mut done: impl FnMut(&mut Bed) -> bool,
    ) -> Result<(), String> {
        for _ in 0..max_steps {
            if done(self) {
                return Ok(());
            }
            if self.step() {
                continue;
            }
            match self.next_timer() {
                Some(t) if t > self.p.now => self.p.now = t,
                Some(_) => {}
                None => {
                    if done(self) {
                        return Ok(());
                    }
                    return Err(format!("stalled at {}", self.p.now));
                }
            }
        }
        Err(format!(
            "no end after {max_steps} steps (at {})",
            self.p.now
        ))
    }

    /// Runs until the clock reaches `t` (serving every event before it), then stops there.
    pub fn run_to(&mut self, t: Nanos) {
        for _ in 0..10_000_000u64 {
            if self.step() {
                continue;
            }
            match self.next_timer() {
                Some(n) if n <= t && n > self.p.now => self.p.now = n,
                Some(n) if n <= self.p.now => {}
                _ => {
                    if self.p.now < t {
                        self.p.now = t;
                        continue;
                    }
                    return;
                }
            }
        }
        panic!("run_to({t}) does not end");
    }

    /// Moves frames without advancing the clock until nothing moves.
    pub fn flush_now(&mut self) {
        let mut n = 0;
        while self.step() {
            n += 1;
            assert!(n < 1_000_000, "frames keep moving at {}", self.p.now);
        }
    }

    /// Drives until `n` completions are on side `s`'s CQ (or fails), and returns them.
    pub fn wait_wcs(&mut self, s: Side, n: usize) -> Vec<Wc> {
        let cq = self.end(s).cq;
        let mut got = Vec::new();
        let r = self.run_until(5_000_000, |t| {
            t.p.rnic(s).poll_cq_into(cq, 1 << 20, &mut got);
            got.len() >= n
        });
        r.unwrap_or_else(|e| panic!("waiting for {n} completions on {s:?}, got {got:?}: {e}"));
        got
    }

    /// Drives until nothing is left to happen; returns every completion on both sides.
    pub fn settle(&mut self) -> (Vec<Wc>, Vec<Wc>) {
        let r = self.run_until(5_000_000, |_| false);
        if let Err(e) = r {
            assert!(e.starts_with("stalled"), "{e}");
        }
        (self.wcs(Side::A), self.wcs(Side::B))
    }

    /// Every completion waiting on side `s`'s CQ.
    pub fn wcs(&mut self, s: Side) -> Vec<Wc> {
        let cq = self.end(s).cq;
        self.p.rnic(s).poll_cq(cq, 1 << 20)
    }

    pub fn state(&mut self, s: Side) -> QpState {
        let qp = self.end(s).qp;
        self.p.rnic(s).qp_state(qp).unwrap()
    }

    /// Hands a frame to side `to` now.
    pub fn inject(&mut self, to: Side, frame: &[u8]) {
        let now = self.p.now;
        self.p.rnic(to).handle_frame(now, frame);
    }

    // ---- the log ---------------------------------------------------------------------------

    pub fn pkts(&self, d: Dir) -> Vec<&Pkt> {
        self.log.iter().filter(|p| p.dir == d).collect()
    }

    /// (opcode, PSN) of every frame sent in direction `d`.
    pub fn ops(&self, d: Dir) -> Vec<(Opcode, u32)> {
        self.pkts(d).iter().map(|p| (p.op, p.psn)).collect()
    }

    /// (PSN, syndrome, MSN) of every ACK / NAK sent in direction `d`.
    pub fn acks(&self, d: Dir) -> Vec<(u32, u8, u32)> {
        self.pkts(d)
            .iter()
            .filter(|p| p.op == Opcode::RC_ACKNOWLEDGE)
            .map(|p| (p.psn, p.syn().unwrap(), p.msn().unwrap()))
            .collect()
    }

    pub fn clear_log(&mut self) {
        self.log.clear();
    }

    /// A frame from side `from` to the other side's QP, built from scratch.
    pub fn craft(&self, from: Side, bth: BthRepr, ext: ExtHeaders, payload: &[u8]) -> Vec<u8> {
        craft(from, bth, ext, payload)
    }
}

/// A frame from `from` to the other side of a `Pair`, built from scratch (pad computed).
pub fn craft(from: Side, mut bth: BthRepr, ext: ExtHeaders, payload: &[u8]) -> Vec<u8> {
    let (smac, dmac, sip, dip) = match from {
        Side::A => (MAC_A, MAC_B, IP_A, IP_B),
        Side::B => (MAC_B, MAC_A, IP_B, IP_A),
    };
    let (IpAddr::V4(s), IpAddr::V4(d)) = (sip, dip) else {
        unreachable!()
    };
    bth.pad = pad_for(payload.len());
    let r = FrameRepr {
        eth: EthernetRepr {
            dst: dmac,
            src: smac,
            vlan: None,
            ethertype: 0,
        },
        ip: IpRepr::V4(Ipv4Repr {
            src: s,
            dst: d,
            dscp: 0,
            ecn: 0,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            checksum: 0,
            header_len: 20,
            total_len: 0,
        }),
        sport: 0xc123,
        dport: ROCEV2_UDP_PORT,
        bth,
        ext,
    };
    let mut b = vec![0; 10_000];
    let n = r.emit_with_payload(&mut b, payload).unwrap();
    b.truncate(n);
    b
}

/// The frame rebuilt after `f` changed its headers (the payload kept, pad and ICRC redone).
pub fn rebuild(frame: &[u8], f: impl FnOnce(&mut FrameRepr)) -> Vec<u8> {
    let p = parse_frame(frame).unwrap();
    let payload = p.payload.to_vec();
    let mut r = FrameRepr::from_parsed(&p);
    f(&mut r);
    r.bth.pad = pad_for(payload.len());
    let mut b = vec![0; 10_000];
    let n = r.emit_with_payload(&mut b, &payload).unwrap();
    b.truncate(n);
    b
}

pub fn wr(id: u64, op: WrOpcode, sges: Vec<Sge>) -> SendWr {
    SendWr::new(id, op, sges)
}

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 8) as u8)
        })
        .collect()
}

pub fn psn(v: u32) -> Psn {
    Psn::new(v)
}

/// `n` PSNs from `first`, modulo 2^24.
pub fn psns(first: u32, n: u32) -> Vec<u32> {
    (0..n).map(|k| Psn::new(first).add(k).value()).collect()
}

/// The ACK syndrome RoCEmu sends (credits invalid).
pub const ACK: u8 = 0x1f;
pub const NAK_SEQ: u8 = 0x60;
pub const NAK_INV: u8 = 0x61;
pub const NAK_ACC: u8 = 0x62;
pub const NAK_OP: u8 = 0x63;
pub fn rnr(timer: u8) -> u8 {
    0x20 | timer
}

/// The local ACK timeout 4.096 µs × 2^t (IBTA 9.7.6.1.3, as pib numbers it).
pub fn ack_timeout(t: u8) -> Nanos {
    Nanos(4096u64 << t)
}

/// The compact form of a completion most tests compare.
pub fn st(w: &[Wc]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// Runs `f` on its own thread and fails the test when it has not finished after `secs` seconds
/// of wall time: a livelock in the core must fail its test, not hang the suite. (Virtual-time
/// tests take milliseconds; the bound is only a guard.)
pub fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    let (tx, rx) = channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(RecvTimeoutError::Disconnected) => {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e)
            }
        }
        Err(RecvTimeoutError::Timeout) => {
            panic!("still running after {secs} s of wall time: a livelock (the thread is left spinning)")
        }
    }
}
