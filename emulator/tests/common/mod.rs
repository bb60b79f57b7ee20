//! A two-RNIC test bed in virtual time: one QP pair, one MR and one CQ per side.
#![allow(dead_code)]
use rocemu_emulator::port::wire::Impairments;
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_emulator::sim::{ConnectOpts, Pair, Side};
use rocemu_wire::Qpn;

pub struct End {
    pub pd: PdId,
    pub cq: CqId,
    pub qp: Qpn,
    pub mr: MrInfo,
}

pub struct Bed {
    pub p: Pair,
    pub a: End,
    pub b: End,
}

pub const MR_LEN: usize = 1 << 20;

fn end(r: &mut Rnic, t: QpType) -> End {
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
                cap: QpCap {
                    max_send_wr: 1024,
                    max_recv_wr: 1024,
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    max_inline_data: 256,
                },
                sq_sig_all: false,
            },
        )
        .unwrap();
    let mr = r.reg_mr(pd, MR_LEN, Access::ALL).unwrap();
    End { pd, cq, qp, mr }
}

impl Bed {
    pub fn new(t: QpType, seed: u64, imp: Impairments, o: &ConnectOpts) -> Bed {
        let mut p = Pair::new(seed, imp);
        let a = end(&mut p.a, t);
        let b = end(&mut p.b, t);
        p.connect(a.qp, b.qp, o).unwrap();
        Bed { p, a, b }
    }

    pub fn rc() -> Bed {
        Bed::new(QpType::Rc, 1, Impairments::none(), &ConnectOpts::default())
    }

    pub fn end(&self, s: Side) -> &End {
        match s {
            Side::A => &self.a,
            Side::B => &self.b,
        }
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

    pub fn post_recv(&mut self, s: Side, wr_id: u64, off: usize, len: usize) {
        let qp = self.end(s).qp;
        let sge = self.sge(s, off, len);
        self.p
            .rnic(s)
            .post_recv(
                qp,
                RecvWr {
                    wr_id,
                    sg_list: vec![sge],
                },
            )
            .unwrap();
    }

    /// Drives until `n` completions are on side `s`'s CQ (or fails), and returns them.
    pub fn wait_wcs(&mut self, s: Side, n: usize) -> Vec<Wc> {
        let cq = self.end(s).cq;
        let mut got = Vec::new();
        let r = self.p.drive_until(5_000_000, |p| {
            p.rnic(s).poll_cq_into(cq, 1 << 20, &mut got);
            got.len() >= n
        });
        r.unwrap_or_else(|e| panic!("waiting for {n} completions on {s:?}, got {got:?}: {e}"));
        got
    }

    /// Drives until nothing is left to happen; returns every completion on both sides.
    pub fn settle(&mut self) -> (Vec<Wc>, Vec<Wc>) {
        self.p.drive(5_000_000).unwrap();
        let (ca, cb) = (self.a.cq, self.b.cq);
        (self.p.a.poll_cq(ca, 1 << 20), self.p.b.poll_cq(cb, 1 << 20))
    }

    pub fn state(&mut self, s: Side) -> QpState {
        let qp = self.end(s).qp;
        self.p.rnic(s).qp_state(qp).unwrap()
    }
}

pub fn wr(id: u64, op: WrOpcode, sges: Vec<Sge>) -> SendWr {
    SendWr::new(id, op, sges)
}
