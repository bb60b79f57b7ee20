//! The requester's fast path (`RnicConfig::fast_path`) against the general path: one random
//! workload per seed — SENDs and RDMA WRITEs of every size around the path MTU, with immediate
//! data or not, inline or from one or two SGEs, solicited, fenced, signaled or not, READs and
//! atomics between them, on RC and UC — over a cable that loses, duplicates and reorders
//! frames, run once with the fast path and once without. Every frame both ends send (the
//! capture, byte for byte, with its virtual time), every completion and every counter must be
//! the same.
use rocemu_emulator::connect::ConnectOpts;
use rocemu_emulator::inproc::{Cable, Impairments, Pair, IP_A, IP_B, MAC_A, MAC_B};
use rocemu_emulator::rnic::*;
use rocemu_emulator::time::Nanos;
use rocemu_wire::capture::CaptureWriter;

const MR: usize = 1 << 20;
const OPS: usize = 160;

/// A small deterministic generator (xorshift64*), so that both runs post the same work.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

struct Outcome {
    capture: Vec<u8>,
    wcs: Vec<Vec<Wc>>,
    counters: Vec<String>,
    states: Vec<QpState>,
    retransmitted: u64,
}

fn run(seed: u64, qp_type: QpType, fast_path: bool) -> Outcome {
    let mk = |mac, ip, s: u64| {
        let mut c = RnicConfig::new(mac, ip, s);
        c.fast_path = fast_path;
        Rnic::new(c)
    };
    let mut a = mk(MAC_A, IP_A, seed.wrapping_mul(3).wrapping_add(1));
    let mut b = mk(MAC_B, IP_B, seed.wrapping_mul(5).wrapping_add(2));
    a.set_neighbor(IP_B, MAC_B);
    b.set_neighbor(IP_A, MAC_A);
    let imp = Impairments {
        loss: 0.02,
        duplicate: 0.01,
        reorder: 0.02,
        delay: Nanos(2_000),
        ..Impairments::none()
    };
    let mut p = Pair::with(a, b, Cable::new(imp, seed));
    let path = std::env::temp_dir().join(format!(
        "rocemu-fast-path-{}-{seed}-{qp_type:?}-{fast_path}.pcap",
        std::process::id()
    ));
    p.capture = Some(CaptureWriter::create(&path).unwrap());
    let cap = QpCap {
        max_send_wr: OPS as u32 + 8,
        max_recv_wr: 2 * OPS as u32 + 8,
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 256,
    };
    let mut ends = Vec::new();
    for r in [&mut p.a, &mut p.b] {
        let pd = r.alloc_pd();
        let cq = r.create_cq(8192).unwrap();
        let qp = r
            .create_qp(
                pd,
                QpInitAttr {
                    qp_type,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap,
                    sq_sig_all: false,
                },
            )
            .unwrap();
        let mr = r.reg_mr(pd, MR, Access::ALL).unwrap();
        let pattern = rocemu_emulator::inproc::pattern(seed ^ mr.addr, MR);
        r.mr_bytes_mut(mr.lkey).unwrap().copy_from_slice(&pattern);
        ends.push((qp, cq, mr));
    }
    let opts = ConnectOpts {
        timeout: 8,
        ..ConnectOpts::default()
    };
    p.connect(ends[0].0, ends[1].0, &opts).unwrap();
    let mut g = Gen(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // Receives for every SEND the other end may post (4 KiB each, past the largest message).
    for (i, r) in [&mut p.a, &mut p.b].into_iter().enumerate() {
        let (qp, _, mr) = ends[i];
        for k in 0..2 * OPS {
            let sge = Sge {
                addr: mr.addr + (k % 64 * 4096) as u64,
                length: 4096,
                lkey: mr.lkey,
            };
            r.post_recv(
                qp,
                RecvWr {
                    wr_id: k as u64,
                    sg_list: vec![sge].into(),
                },
            )
            .unwrap();
        }
    }
    for k in 0..OPS {
        let side = g.below(2) as usize;
        let (qp, _, mr) = ends[side];
        let (_, _, peer) = ends[1 - side];
        // Sizes around the 1024-byte path MTU: one packet, exactly one, two or three.
        let len = match g.below(4) {
            0 => g.below(64),
            1 => 1020 + g.below(8),
            2 => g.below(1024),
            _ => g.below(3000),
        } as u32;
        let remote = peer.addr + 512 * 1024 + g.below(256 * 1024);
        let op = match (qp_type, g.below(10)) {
            (_, 0..=2) => WrOpcode::RdmaWrite {
                remote_addr: remote,
                rkey: peer.rkey,
            },
            (_, 3) => WrOpcode::RdmaWriteWithImm {
                remote_addr: remote,
                rkey: peer.rkey,
                imm: g.next() as u32,
            },
            (_, 4..=5) => WrOpcode::Send,
            (_, 6) => WrOpcode::SendWithImm {
                imm: g.next() as u32,
            },
            (QpType::Rc, 7) => WrOpcode::RdmaRead {
                remote_addr: remote,
                rkey: peer.rkey,
            },
            (QpType::Rc, 8) => WrOpcode::AtomicFetchAdd {
                remote_addr: remote & !7,
                rkey: peer.rkey,
                add: 1,
            },
            _ => WrOpcode::RdmaWrite {
                remote_addr: remote,
                rkey: peer.rkey,
            },
        };
        let atomic = matches!(op, WrOpcode::AtomicFetchAdd { .. });
        let len = if atomic { 8 } else { len };
        let local = mr.addr + g.below(256 * 1024);
        let local = if atomic { local & !7 } else { local };
        let mut flags = SendFlags::default();
        if g.chance(50) {
            flags = flags | SendFlags::SIGNALED;
        }
        if g.chance(20) {
            flags = flags | SendFlags::SOLICITED;
        }
        if g.chance(10) {
            flags = flags | SendFlags::FENCE;
        }
        let read_like = op.is_read_or_atomic();
        let inline = !read_like && len <= 256 && g.chance(30);
        let sges: Vec<Sge> = if len > 1 && !inline && g.chance(20) {
            let half = len / 2;
            vec![
                Sge {
                    addr: local,
                    length: half,
                    lkey: mr.lkey,
                },
                Sge {
                    addr: local + 300_000,
                    length: len - half,
                    lkey: mr.lkey,
                },
            ]
        } else if len == 0 && g.chance(50) {
            vec![]
        } else {
            vec![Sge {
                addr: local,
                length: len,
                lkey: mr.lkey,
            }]
        };
        let mut wr = SendWr::new(k as u64, op, sges);
        wr.flags = flags;
        if inline {
            wr.flags = flags | SendFlags::INLINE;
            let r = [&mut p.a, &mut p.b][side].mr_bytes(mr.lkey).unwrap();
            let at = (local - mr.addr) as usize;
            wr.inline_data = r[at..at + len as usize].to_vec();
            wr.sg_list = Vec::new().into();
        }
        [&mut p.a, &mut p.b][side].post_send(qp, wr).unwrap();
        // Now and then the clock moves on before the next post, so that posts meet traffic.
        if g.chance(25) {
            let until = p.now + Nanos(g.below(20_000));
            let _ = p.drive_until(1_000_000, |p| p.now >= until || p.next_event().is_none());
        }
    }
    p.drive(10_000_000).unwrap();
    let mut w = p.capture.take().unwrap().into_inner();
    std::io::Write::flush(&mut w).unwrap();
    drop(w);
    let capture = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let mut out = Outcome {
        capture,
        wcs: Vec::new(),
        counters: Vec::new(),
        states: Vec::new(),
        retransmitted: 0,
    };
    for (i, r) in [&mut p.a, &mut p.b].into_iter().enumerate() {
        let (qp, cq, _) = ends[i];
        out.wcs.push(r.poll_cq(cq, 100_000));
        let c = r.counters();
        out.retransmitted += c.retransmitted_pkts;
        out.counters.push(format!("{c:?}"));
        out.states.push(r.qp_state(qp).unwrap());
    }
    out
}

#[test]
fn fast_path_sends_what_the_general_path_sends() {
    let mut fast_packets = 0;
    let mut retransmitted = 0;
    for qp_type in [QpType::Rc, QpType::Uc] {
        for seed in 1..=10u64 {
            let f = run(seed, qp_type, true);
            let g = run(seed, qp_type, false);
            let what = format!("{qp_type:?}, seed {seed}");
            assert!(f.capture.len() > 10_000, "{what}: the workload sent little");
            assert_eq!(f.states, g.states, "{what}: QP states");
            assert_eq!(f.wcs, g.wcs, "{what}: completions");
            assert_eq!(f.counters, g.counters, "{what}: counters");
            assert!(f.capture == g.capture, "{what}: the frames differ");
            fast_packets += f.wcs.iter().map(Vec::len).sum::<usize>();
            retransmitted += f.retransmitted;
        }
    }
    assert!(fast_packets > 0);
    // The cable's losses made the RC runs go back N: retransmissions took both paths too.
    assert!(retransmitted > 0, "no retransmission in any run");
}
