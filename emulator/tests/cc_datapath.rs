//! Congestion control in the datapath (issue 17, step 2): ECT(0) on transmit, CNPs for CE
//! marks (the notification point), DCQCN and TIMELY reacting per QP (the reaction point), and
//! the pacer in the transmit scheduler. Expected values come from the formulas, written here.
mod common;
use common::*;
use rocemu_emulator::inproc::{Cable, Impairments, Pair, Side, IP_A, IP_B, MAC_A, MAC_B};
use rocemu_emulator::rnic::cc::{build_cnp, CcAlgo, CcConfig, CnpFields};
use rocemu_emulator::rnic::*;
use rocemu_emulator::time::Nanos;
use rocemu_wire::capture::CaptureReader;
use rocemu_wire::ip::ipv4_checksum;
use rocemu_wire::{parse_frame, Opcode, Qpn};
use std::path::PathBuf;
use Side::{A, B};

const LINE: u32 = 10_000; // Mb/s

fn dcqcn() -> CcConfig {
    CcConfig {
        algo: CcAlgo::Dcqcn,
        ecn: true,
        line_rate_mbps: LINE,
        ..CcConfig::default()
    }
}

/// The frame with ECN CE set in its IPv4 header (and the checksum redone), as a router's
/// marking queue leaves it; the ICRC masks the TOS byte, so it still verifies.
fn mark_ce(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    assert_eq!(f[14] >> 4, 4, "IPv4");
    f[15] |= 3;
    f[24] = 0;
    f[25] = 0;
    let c = ipv4_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f
}

fn ecn_of(frame: &[u8]) -> u8 {
    frame[15] & 3
}

/// Marks every request packet from A (the data direction) CE, or only the first `n`.
fn ce_filter(n: usize) -> Filter {
    let mut left = n;
    Box::new(move |p| {
        if p.dir == Dir::AB && p.is_req() && left > 0 {
            left -= 1;
            Verdict::Replace(mark_ce(&p.frame))
        } else {
            Verdict::Pass
        }
    })
}

fn write(t: &mut Bed, id: u64, off: usize, len: usize) {
    let (ra, rk) = t.raddr(B, off);
    let sge = t.sge(A, off, len);
    t.post_send(
        A,
        wr(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![sge],
        ),
    );
}

fn qp_info(r: &Rnic, qpn: Qpn) -> QpInfo {
    r.qp_infos().into_iter().find(|q| q.qpn == qpn).unwrap()
}

/// DCQCN's first cut from the line rate with the initial alpha (1023/1024, held in 1/2^20):
/// `rc − min(rc·α/2^gd, rc·(1 − min_dec_fac))`.
fn first_cut_kbps(line_kbps: u64) -> u64 {
    let a_fine = 1023u64 << 10;
    let by_alpha = ((line_kbps as u128 * a_fine as u128) >> (11 + 10)) as u64;
    let by_fac = line_kbps * 50 / 100;
    line_kbps - by_alpha.min(by_fac)
}

#[test]
fn ect0_on_every_packet_only_where_ecn_is_on() {
    let on = CcConfig {
        ecn: true,
        ..CcConfig::default()
    };
    let mut t = Bed::with_cc(&BedCfg::new(QpType::Rc), on, CcConfig::default());
    write(&mut t, 1, 0, 10_000);
    assert_eq!(t.wait_wcs(A, 1)[0].status, WcStatus::Success);
    let ab = t.pkts(Dir::AB);
    let ba = t.pkts(Dir::BA);
    assert!(ab.len() >= 10 && !ba.is_empty());
    assert!(ab.iter().all(|p| ecn_of(&p.frame) == 2), "A marks ECT(0)");
    assert!(ba.iter().all(|p| ecn_of(&p.frame) == 0), "B does not");
    // The peer took them all (the ICRC masks the TOS byte): nothing dropped.
    assert_eq!(t.p.b.counters().rx_drop_total(), 0);
}

#[test]
fn ce_marks_get_one_cnp_per_qp_per_min_time_between_cnps() {
    let mut t = Bed::with_cc(
        &BedCfg::new(QpType::Rc),
        CcConfig::default(),
        CcConfig::default(),
    );
    t.filter = ce_filter(usize::MAX);
    // 64 KiB at path MTU 1024: 64 CE-marked packets at one instant, one CNP.
    write(&mut t, 1, 0, 65_536);
    t.wait_wcs(A, 1);
    let marked = t.pkts(Dir::AB).iter().filter(|p| p.is_req()).count() as u64;
    assert_eq!(marked, 64);
    let cnps = |t: &Bed| -> Vec<Nanos> {
        t.pkts(Dir::BA)
            .iter()
            .filter(|p| p.op == Opcode::CNP)
            .map(|p| p.t)
            .collect()
    };
    assert_eq!(cnps(&t).len(), 1);
    // 3 µs later, still inside min_time_between_cnps (4 µs): none; at 4.5 µs: one more.
    let t0 = cnps(&t)[0];
    t.run_to(t0 + Nanos::from_micros(3));
    write(&mut t, 2, 0, 4096);
    t.wait_wcs(A, 1);
    assert_eq!(cnps(&t).len(), 1);
    t.run_to(t0 + Nanos(4_500));
    write(&mut t, 3, 0, 4096);
    t.wait_wcs(A, 1);
    assert_eq!(cnps(&t).len(), 2);
    let c = t.p.b.counters();
    assert_eq!(c.np_ecn_marked_roce_packets, 64 + 4 + 4);
    assert_eq!(c.np_cnp_sent, 2);
    // A has no reaction point: it counts them as ignored.
    let ca = t.p.a.counters();
    assert_eq!((ca.rp_cnp_ignored, ca.rp_cnp_handled), (2, 0));

    // The CNP, field by field as ConnectX's: B → A, to A's QP, ECT(0) with DSCP 48, BECN,
    // PSN 0, 16 reserved bytes; byte for byte what build_cnp makes of these fields.
    let p = t
        .pkts(Dir::BA)
        .into_iter()
        .find(|p| p.op == Opcode::CNP)
        .unwrap()
        .clone();
    let f = parse_frame(&p.frame).unwrap();
    assert!(f.icrc_ok());
    assert_eq!((f.eth.src, f.eth.dst), (MAC_B, MAC_A));
    assert_eq!((f.ip.src(), f.ip.dst()), (IP_B, IP_A));
    assert_eq!(f.bth.dqpn, t.qpn(A));
    assert_eq!(f.bth.psn.value(), 0);
    assert!(f.bth.becn && !f.bth.fecn && !f.bth.ack_req);
    assert_eq!(p.frame[15], 48 << 2 | 2, "TOS: cnp_dscp 48, ECT(0)");
    assert_eq!(p.frame.len(), 74);
    assert_eq!(&p.frame[54..70], &[0u8; 16]);
    let ident = u16::from_be_bytes([p.frame[18], p.frame[19]]);
    let sport = u16::from_be_bytes([p.frame[34], p.frame[35]]);
    let mut want = [0u8; 128];
    let n = build_cnp(
        &mut want,
        &CnpFields {
            src_mac: MAC_B,
            dst_mac: MAC_A,
            src_ip: IP_B,
            dst_ip: IP_A,
            dqpn: t.qpn(A),
            pkey: rocemu_wire::PKey::DEFAULT,
            dscp: 48,
            ecn: 2,
            vlan: None,
            prio: 6,
            ttl: 64,
            ip_ident: ident,
            udp_sport: sport,
            flow_label: 0,
        },
    )
    .unwrap();
    assert_eq!(&want[..n], &p.frame[..]);
}

#[test]
fn np_off_sends_no_cnp() {
    let off = CcConfig {
        np: false,
        ..CcConfig::default()
    };
    let mut t = Bed::with_cc(&BedCfg::new(QpType::Rc), CcConfig::default(), off);
    t.filter = ce_filter(usize::MAX);
    write(&mut t, 1, 0, 8192);
    t.wait_wcs(A, 1);
    let c = t.p.b.counters();
    assert_eq!((c.np_ecn_marked_roce_packets, c.np_cnp_sent), (8, 0));
    assert!(t.pkts(Dir::BA).iter().all(|p| p.op != Opcode::CNP));
}

#[test]
fn the_cnp_carries_the_p_key_of_the_marked_packet() {
    // Annex A17.9.3, Figure 6: "P_Key set to the same value as in the BTH of the ECN packet
    // marked". Requests from A go out with P_Key 0x7fff (a limited member of the default
    // partition, which B accepts) and marked CE; the ICRC is redone since it covers the P_Key.
    let mut t = Bed::with_cc(
        &BedCfg::new(QpType::Rc),
        CcConfig::default(),
        CcConfig::default(),
    );
    t.filter = Box::new(|p| {
        if p.dir != Dir::AB || !p.is_req() {
            return Verdict::Pass;
        }
        let f = parse_frame(&p.frame).unwrap();
        let mut r = rocemu_wire::FrameRepr::from_parsed(&f);
        r.bth.pkey = rocemu_wire::PKey(0x7fff);
        let mut buf = vec![0u8; r.frame_len(f.payload.len()) + 64];
        let n = r.emit_with_payload(&mut buf, f.payload).unwrap();
        buf.truncate(n);
        Verdict::Replace(mark_ce(&buf))
    });
    write(&mut t, 1, 0, 4096);
    t.wait_wcs(A, 1);
    let cnp = t
        .pkts(Dir::BA)
        .into_iter()
        .find(|p| p.op == Opcode::CNP)
        .expect("a CNP for the CE marks")
        .clone();
    let f = parse_frame(&cnp.frame).unwrap();
    assert!(f.icrc_ok());
    assert_eq!(f.bth.pkey, rocemu_wire::PKey(0x7fff));
}

#[test]
fn a_cnp_cuts_a_dcqcn_qp_by_the_formula() {
    let mut t = Bed::with_cc(&BedCfg::new(QpType::Rc), dcqcn(), CcConfig::default());
    let qa = t.qpn(A);
    let info = qp_info(&t.p.a, qa);
    assert_eq!(info.rate_kbps, Some(10_000_000), "idle at line rate");
    assert_eq!(info.alpha, Some(1023));
    t.filter = ce_filter(1);
    write(&mut t, 1, 0, 4096);
    t.wait_wcs(A, 1);
    let c = t.p.a.counters();
    assert_eq!(
        (c.rp_cnp_handled, c.rp_rate_reductions, c.rp_cnp_ignored),
        (1, 1, 0)
    );
    assert_eq!(t.p.b.counters().np_cnp_sent, 1);
    let info = qp_info(&t.p.a, qa);
    assert_eq!(info.rate_kbps, Some(first_cut_kbps(10_000_000)));
    assert_eq!(info.rate_kbps, Some(5_004_883));
}

#[test]
fn the_connectx4_lx_cnp_replayed_at_rocemu_moves_rp_cnp_handled_by_one_and_cuts() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/data/cx4lx_cnp.pcap");
    let cx = CaptureReader::open(path)
        .unwrap()
        .next_frame()
        .unwrap()
        .unwrap()
        .data;
    let mut t = Bed::with_cc(&BedCfg::new(QpType::Rc), dcqcn(), CcConfig::default());
    let qa = t.qpn(A);
    // Rewritten to this bed's addresses and QP, as tcprewrite would (ICRC redone); every
    // other byte is ConnectX's: TOS 0xc2, BECN, PSN 0, the reserved bytes.
    let to = |dqpn: Qpn, src_ip: std::net::IpAddr| {
        rebuild(&cx, |r| {
            r.eth.dst = MAC_A;
            r.eth.src = MAC_B;
            if let rocemu_wire::IpRepr::V4(v4) = &mut r.ip {
                let (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) = (src_ip, IP_A) else {
                    unreachable!()
                };
                v4.src = s;
                v4.dst = d;
            }
            r.bth.dqpn = dqpn;
        })
    };
    let f = to(qa, IP_B);
    assert_eq!(f.len(), cx.len());
    assert_eq!(f[15], 0xc2);
    t.inject(A, &f);
    let c = t.p.a.counters();
    assert_eq!((c.rp_cnp_handled, c.rp_rate_reductions), (1, 1));
    assert_eq!(
        qp_info(&t.p.a, qa).rate_kbps,
        Some(first_cut_kbps(10_000_000))
    );
    // To no QP, or from an address that is not the QP's peer: ignored, the rate unchanged.
    t.inject(A, &to(Qpn::new(qa.value() ^ 0x5a5a), IP_B));
    t.inject(A, &to(qa, "10.0.0.99".parse().unwrap()));
    let c = t.p.a.counters();
    assert_eq!((c.rp_cnp_handled, c.rp_cnp_ignored), (1, 2));
    assert_eq!(
        c.rx_drop_total(),
        0,
        "a CNP is counted as handled or ignored only"
    );
    assert_eq!(
        qp_info(&t.p.a, qa).rate_kbps,
        Some(first_cut_kbps(10_000_000))
    );
}

#[test]
fn a_qp_cut_to_1_gbps_is_paced_at_1_gbps() {
    // The first CNP sets 1 Gb/s (rate_to_set_on_first_cnp); no increase events (the timer at
    // 131 ms, the byte counter off), so the rate stays 1 Gb/s for the 2 ms measured.
    let mut cc = dcqcn();
    cc.set("rate_to_set_on_first_cnp", 1000).unwrap();
    cc.set("rpg_time_reset", 131_071).unwrap();
    cc.set("rpg_byte_reset", 0).unwrap();
    let burst = u64::from(cc.burst_bytes);
    let mut t = Bed::with_cc(&BedCfg::new(QpType::Rc), cc, CcConfig::default());
    let qa = t.qpn(A);
    t.filter = ce_filter(1);
    write(&mut t, 1, 0, 1024);
    t.wait_wcs(A, 1);
    assert_eq!(qp_info(&t.p.a, qa).rate_kbps, Some(1_000_000));
    t.clear_log();
    // 1 MiB in 16 WRITEs of 64 KiB: at 1 Gb/s that is 8.4 ms of frames.
    let t0 = t.now();
    for i in 0..16 {
        write(&mut t, 10 + i, (i as usize) * 65_536, 65_536);
    }
    let t1 = t0 + Nanos::from_millis(2);
    t.run_to(t1);
    let sent: Vec<(Nanos, usize)> = t
        .pkts(Dir::AB)
        .iter()
        .filter(|p| p.is_req())
        .map(|p| (p.t, p.frame.len()))
        .collect();
    let max_frame = sent.iter().map(|s| s.1).max().unwrap() as u64;
    // Over [t0, t0 + T] the pacer lets out at most rate·T + burst + one packet, and (nothing
    // else limits the QP on a wire without latency) at least rate·T.
    for ms in [1u64, 2] {
        let end = t0 + Nanos::from_millis(ms);
        let bytes: u64 = sent.iter().filter(|s| s.0 <= end).map(|s| s.1 as u64).sum();
        let rate_t = 1_000_000_000 / 8 * ms / 1000; // bytes in `ms` at 1 Gb/s
        assert!(
            bytes >= rate_t && bytes <= rate_t + burst + max_frame,
            "{ms} ms: {bytes} bytes sent, {rate_t} at the rate (burst {burst}, frame {max_frame})"
        );
    }
    // Everything still arrives, and at the end the QP has sent at the rate all along.
    t.wait_wcs(A, 16);
    let done = t.now();
    let all: u64 = t
        .pkts(Dir::AB)
        .iter()
        .filter(|p| p.is_req())
        .map(|p| p.frame.len() as u64)
        .sum();
    let secs = (done.as_nanos() - t0.as_nanos()) as f64 / 1e9;
    let gbps = all as f64 * 8.0 / secs / 1e9;
    assert!((0.98..=1.02).contains(&gbps), "{gbps} Gb/s");
}

#[test]
fn an_uncongested_dcqcn_qp_is_not_paced() {
    let mut t = Bed::with_cc(&BedCfg::new(QpType::Rc), dcqcn(), CcConfig::default());
    let t0 = t.now();
    for i in 0..4 {
        write(&mut t, i, (i as usize) * 65_536, 65_536);
    }
    t.wait_wcs(A, 4);
    // No CNP: every packet left at the instant they were posted (a wire without latency).
    assert_eq!(t.now(), t0);
    let c = t.p.a.counters();
    assert_eq!((c.rp_cnp_handled, c.rp_cnp_ignored), (0, 0));
    assert_eq!(qp_info(&t.p.a, t.qpn(A)).rate_kbps, Some(10_000_000));
}

#[test]
fn under_persistent_marking_the_rate_stays_at_or_above_rpg_min_rate_and_nothing_is_lost() {
    let mut cc = dcqcn();
    cc.set("rpg_min_rate", 200).unwrap();
    let mut t = Bed::with_cc(&BedCfg::new(QpType::Rc), cc, CcConfig::default());
    let qa = t.qpn(A);
    t.filter = ce_filter(usize::MAX);
    // A first CNP (on a wire without latency a burst posted at once would all leave before
    // it), then 64 WRITEs of 64 KiB (4 MiB, over the MR's 1 MiB four times), paced.
    write(&mut t, 100, 0, 1024);
    t.wait_wcs(A, 1);
    let data = pattern(MR_LEN, 9);
    t.fill(A, 0, &data);
    for i in 0..64 {
        write(&mut t, i, (i as usize % 16) * 65_536, 65_536);
    }
    let mut low = u64::MAX;
    t.run_until(10_000_000, |t| {
        low = low.min(qp_info(&t.p.a, qa).rate_kbps.unwrap());
        let mut wc = Vec::new();
        let cq = t.a.cq;
        t.p.a.poll_cq_into(cq, 16, &mut wc);
        wc.iter()
            .for_each(|w| assert_eq!(w.status, WcStatus::Success));
        wc.iter().any(|w| w.wr_id == 63)
    })
    .unwrap();
    assert_eq!(low, 200_000, "cut down to rpg_min_rate and never below it");
    assert_eq!(t.bytes(B, 0, data.len()), data);
    let c = t.p.a.counters();
    assert!(c.rp_rate_reductions > 5, "{c:?}");
    assert_eq!(c.retransmitted_pkts, 0);
    assert_eq!(t.p.b.counters().np_cnp_sent, c.rp_cnp_handled);
}

#[test]
fn timely_cuts_by_the_formula_when_the_rtt_is_above_t_high() {
    // A 300 µs cable each way: a WRITE of one packet is acknowledged 600 µs after it left.
    let cc = CcConfig {
        algo: CcAlgo::Timely,
        line_rate_mbps: LINE,
        ..CcConfig::default()
    };
    let mut ca = RnicConfig::new(MAC_A, IP_A, 11);
    ca.cc = cc;
    let mut ra = Rnic::new(ca);
    let mut rb = Rnic::new(RnicConfig::new(MAC_B, IP_B, 12));
    ra.set_neighbor(IP_B, MAC_B);
    rb.set_neighbor(IP_A, MAC_A);
    let imp = Impairments {
        delay: Nanos::from_micros(300),
        ..Impairments::none()
    };
    let mut p = Pair::with(ra, rb, Cable::new(imp, 1));
    let cfg = BedCfg::new(QpType::Rc);
    let a = end(&mut p.a, QpType::Rc, true, cfg.cap);
    let b = end(&mut p.b, QpType::Rc, true, cfg.cap);
    p.connect(a.qp, b.qp, &cfg.a).unwrap();
    let post = |p: &mut Pair, id: u64| {
        let w = wr(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![Sge {
                addr: a.mr.addr,
                length: 8,
                lkey: a.mr.lkey,
            }],
        );
        p.a.post_send(a.qp, w).unwrap();
        let mut wc = Vec::new();
        p.drive_until(100_000, |p| {
            p.a.poll_cq_into(a.cq, 1, &mut wc);
            !wc.is_empty()
        })
        .unwrap();
        qp_info(&p.a, a.qp).rate_kbps.unwrap()
    };
    let line = u64::from(LINE) * 1000;
    // rtt > Thigh: rate·(1 − β·(1 − Thigh/rtt)), β 0.8, Thigh 500 µs, rtt 600 µs.
    let cut = |r: u64| r - (r as u128 * 800 * 100_000 / (600_000 * 1000)) as u64;
    let r1 = post(&mut p, 1);
    assert_eq!(r1, cut(line));
    assert_eq!(r1, 8_666_667);
    let r2 = post(&mut p, 2);
    assert_eq!(r2, cut(r1));
    // A CNP means nothing to TIMELY: ignored.
    assert_eq!(p.a.counters().rp_cnp_handled, 0);
}
