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
        // Now and then a key the peer does not have, or an address past its region: the
        // responder NAKs and the QP goes to ERR (the rest of the work is flushed).
        let op = match (op, g.below(200)) {
            (WrOpcode::RdmaWrite { remote_addr, rkey }, 0) => WrOpcode::RdmaWrite {
                remote_addr,
                rkey: rkey ^ 0x100,
            },
            (WrOpcode::RdmaWrite { rkey, .. }, 1) => WrOpcode::RdmaWrite {
                remote_addr: peer.addr + MR as u64 - 8,
                rkey,
            },
            (op, _) => op,
        };
        // Now and then a long WRITE: past 64 packets, an ACK is asked for within the message.
        let len = match op {
            WrOpcode::RdmaWrite { .. } if g.chance(8) => 60 * 1024 + g.below(12 * 1024) as u32,
            _ => len,
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
    let mut errors = 0;
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
            errors += f.states.iter().filter(|s| **s == QpState::Err).count();
        }
    }
    assert!(fast_packets > 0);
    // The cable's losses made the RC runs go back N: retransmissions took both paths too.
    assert!(retransmitted > 0, "no retransmission in any run");
    // Some runs ended with a remote access error, some without.
    assert!(
        errors > 0 && errors < 40,
        "QPs in ERR at the end: {errors} of 40"
    );
}

/// Handmade RDMA WRITE packets (and a few SENDs), each with a good ICRC, that a requester in
/// its right mind would not send: PSNs around the expected one, every WRITE opcode in and out
/// of sequence, lengths at and around the path MTU and the RETH's length, pad counts that do not
/// match, wrong and right R_Keys, addresses at the region's edges, other P_Keys, TVer 1, CE
/// marks, another source address. One responder judges them with its fast path and one
/// without: the same answers on the wire, counters, region bytes and QP state. When the QP
/// goes to ERR, a new one takes its place, so that every seed keeps testing.
#[test]
fn hostile_writes_are_judged_alike() {
    for seed in 1..=150u64 {
        let f = hostile(seed, true);
        let g = hostile(seed, false);
        assert_eq!(f.0, g.0, "seed {seed}: counters");
        assert!(f.1 == g.1, "seed {seed}: the responses differ");
        assert!(f.2 == g.2, "seed {seed}: the region's bytes differ");
        assert!(f.3 > 0, "seed {seed}: nothing was answered");
    }
}

fn hostile(seed: u64, fast_path: bool) -> (String, Vec<Vec<u8>>, Vec<u8>, usize) {
    use rocemu_wire::eth::EthernetRepr;
    use rocemu_wire::frame::{pad_for, IpRepr};
    use rocemu_wire::ip::Ipv4Repr;
    use rocemu_wire::{BthRepr, ExtHeaders, FrameRepr, Opcode, PKey, Psn, RKey, RethRepr};
    let mut c = RnicConfig::new(MAC_B, IP_B, seed);
    c.fast_path = fast_path;
    let mut r = Rnic::new(c);
    r.set_neighbor(IP_A, MAC_A);
    let pd = r.alloc_pd();
    let cq = r.create_cq(4096).unwrap();
    let mr = r.reg_mr(pd, 64 * 1024, Access::ALL).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let opts = ConnectOpts::default(); // 1024-byte path MTU
    let mut g = Gen(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let new_qp = |r: &mut Rnic| {
        let qp = r
            .create_qp(
                pd,
                QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap,
                    sq_sig_all: false,
                },
            )
            .unwrap();
        rocemu_emulator::connect::bring_up(
            r,
            qp,
            rocemu_wire::Qpn::new(0x77),
            IP_A,
            Psn::new(100),
            Psn::new(5000),
            &opts,
        )
        .unwrap();
        // Receive buffers of 200 to 1023 bytes (SENDs longer than the buffer happen), one in
        // five with an L_Key the table does not have (checked when a SEND lands in it).
        for k in 0..32 {
            let sge = Sge {
                addr: mr.addr + k * 1024,
                length: 200 + (k as u32 * 131) % 824,
                lkey: if k % 5 == 1 { mr.lkey ^ 0x40 } else { mr.lkey },
            };
            r.post_recv(
                qp,
                RecvWr {
                    wr_id: k,
                    sg_list: vec![sge].into(),
                },
            )
            .unwrap();
        }
        qp
    };
    let mut qp = new_qp(&mut r);
    // The CQ armed for solicited completions: which packets fire it is compared too.
    r.req_notify_cq(cq, true).unwrap();
    let mut events = Vec::new();
    let mut wcs = Vec::new();
    let mut next = 5000u32; // the PSN a well-behaved requester would use next
    let mut out = Vec::new();
    let mut buf = vec![0u8; 10_000];
    let mut now = Nanos(0);
    // First the edges a random walk rarely finds, each on a fresh QP: (opcode, payload length,
    // RETH length, RETH address offset). A LAST with no payload after a FIRST that filled the
    // RETH's length; zero-length ONLYs with and without a RETH length; a FIRST whose message
    // runs past the region though its first packet fits; a MIDDLE with no write in progress.
    let script: [(Opcode, usize, u32, u64); 8] = [
        (Opcode::RC_RDMA_WRITE_FIRST, 1024, 1024, 0),
        (Opcode::RC_RDMA_WRITE_LAST, 0, 0, 0),
        (Opcode::RC_RDMA_WRITE_ONLY, 0, 0, 0),
        (Opcode::RC_RDMA_WRITE_ONLY, 0, 5, 0),
        (Opcode::RC_RDMA_WRITE_FIRST, 1024, 3000, 63 * 1024),
        (Opcode::RC_RDMA_WRITE_MIDDLE, 1024, 0, 0),
        (Opcode::RC_RDMA_WRITE_ONLY, 1024, 1024, 64 * 1024 - 1024),
        (Opcode::RC_RDMA_WRITE_ONLY, 1024, 1024, 64 * 1024 - 1023),
    ];
    for i in 0..400 {
        let scripted = script.get(i).copied();
        let op = match g.below(16) {
            0..=2 => Opcode::RC_RDMA_WRITE_ONLY,
            3..=4 => Opcode::RC_RDMA_WRITE_FIRST,
            5..=6 => Opcode::RC_RDMA_WRITE_MIDDLE,
            7..=8 => Opcode::RC_RDMA_WRITE_LAST,
            9 => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            10..=11 => Opcode::RC_SEND_ONLY,
            12 => Opcode::RC_SEND_FIRST,
            13 => Opcode::RC_SEND_MIDDLE,
            14 => Opcode::RC_SEND_LAST,
            _ => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
        };
        let psn = match g.below(10) {
            0 => next.wrapping_sub(1 + g.below(3) as u32),
            1 => next + 1 + g.below(3) as u32,
            _ => next,
        };
        let len = match g.below(7) {
            0 | 1 => 1024,
            2 => 1023 + g.below(3) as usize,
            3 => 0,
            _ => g.below(1100) as usize,
        };
        let (op, psn, len) = match scripted {
            Some((op, len, ..)) => (op, next, len),
            None => (op, psn, len),
        };
        let mut bth = BthRepr::new(op, qp, Psn::new(psn));
        bth.ack_req = g.chance(60);
        bth.solicited = g.chance(30);
        bth.pad = if g.chance(90) {
            pad_for(len)
        } else {
            g.below(4) as u8
        };
        if g.chance(3) {
            bth.pkey = PKey(0x7fff);
        }
        if g.chance(3) {
            bth.tver = 1;
        }
        let mut ext = ExtHeaders::default();
        let info = op.info();
        if info.has(rocemu_wire::opcode::hdr::RETH) {
            ext.reth = Some(RethRepr {
                va: match g.below(8) {
                    0 => mr.addr + 64 * 1024 - g.below(2048),
                    1 => mr.addr.wrapping_sub(g.below(64)),
                    _ => mr.addr + g.below(60 * 1024),
                },
                rkey: RKey(if g.chance(95) { mr.rkey } else { mr.rkey ^ 1 }),
                dma_len: match g.below(5) {
                    0 => len as u32,
                    1 => (len as u32).wrapping_add(g.below(3) as u32).wrapping_sub(1),
                    2 => 1024 * (1 + g.below(3) as u32),
                    _ => g.below(4000) as u32,
                },
            });
        }
        if info.has(rocemu_wire::opcode::hdr::IMM) {
            ext.imm = Some(7);
        }
        if let Some((_, len, dma_len, at)) = scripted {
            bth.ack_req = true;
            bth.pad = pad_for(len);
            bth.pkey = PKey::DEFAULT;
            bth.tver = 0;
            if let Some(r) = ext.reth.as_mut() {
                (r.va, r.rkey, r.dma_len) = (mr.addr + at, RKey(mr.rkey), dma_len);
            }
        }
        let payload: Vec<u8> = (0..len).map(|i| (i as u64 ^ seed) as u8).collect();
        let src = if g.chance(3) && scripted.is_none() {
            IP_B
        } else {
            IP_A
        };
        let (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) = (src, IP_B) else {
            unreachable!()
        };
        let fr = FrameRepr {
            eth: EthernetRepr {
                dst: MAC_B,
                src: MAC_A,
                vlan: None,
                ethertype: 0,
            },
            ip: IpRepr::V4(Ipv4Repr {
                src: s,
                dst: d,
                dscp: 0,
                ecn: if g.chance(5) && scripted.is_none() {
                    3
                } else {
                    2
                },
                ident: 9,
                dont_frag: true,
                ttl: 64,
                protocol: 17,
                checksum: 0,
                header_len: 20,
                total_len: 0,
            }),
            sport: 0xc000,
            dport: rocemu_wire::ROCEV2_UDP_PORT,
            bth,
            ext,
        };
        let mut frame = vec![0u8; 2048];
        let n = fr.emit_with_payload(&mut frame, &payload).unwrap();
        frame.truncate(n);
        if psn == next {
            next += 1;
        }
        r.handle_frame_mut(now, &mut frame);
        now = Nanos(now.0 + 1_000);
        r.handle_timeout(now);
        while let Some(n) = r.poll_transmit(now, &mut buf) {
            out.push(buf[..n].to_vec());
        }
        let mut ev = Vec::new();
        r.take_cq_events(&mut ev);
        if !ev.is_empty() {
            r.req_notify_cq(cq, true).unwrap();
        }
        events.push(ev.len());
        wcs.extend(r.poll_cq(cq, 64));
        if r.qp_state(qp).unwrap() == QpState::Err {
            r.destroy_qp(qp).unwrap_or(());
            qp = new_qp(&mut r);
            next = 5000;
        }
    }
    wcs.extend(r.poll_cq(cq, 100_000));
    let answered = out.len();
    (
        format!("{:?} {events:?} {wcs:?}", r.counters()),
        out,
        r.mr_bytes(mr.lkey).unwrap().to_vec(),
        answered,
    )
}
