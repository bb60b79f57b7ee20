//! Every named device counter moves by a known amount in a scenario made for it: hand-built
//! frames for the receive drops (each moves its one `rx_drop_*` reason and nothing else), the
//! test bed's filter for losses, NAKs, RNR and timeouts (each NAK scenario moves its NAK
//! counters by exactly one). The counters' names and meanings are rdma_rxe's and mlx5's (see
//! `Counters` in `rnic/device.rs`); where rxe counts by a rule of its own, the test says so.
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::inproc::{Cable, Impairments, Pair, IP_A, IP_B, MAC_A, MAC_B};
use rocemu_emulator::rnic::*;
use rocemu_wire::frame::IpRepr;
use rocemu_wire::{BthRepr, ExtHeaders, Opcode as O, PKey, Psn, Qpn, RethRepr};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

const PSN_A: u32 = 0x123;
const PSN_B: u32 = 0xabc;

/// What moved between two snapshots, by name (every name [`Counters::named`] gives).
fn delta(before: &Counters, after: &Counters) -> BTreeMap<&'static str, u64> {
    before
        .named()
        .into_iter()
        .zip(after.named())
        .filter(|(b, a)| a.1 != b.1)
        .map(|(b, a)| (a.0, a.1 - b.1))
        .collect()
}

/// The expected delta from a list.
fn want(v: &[(&'static str, u64)]) -> BTreeMap<&'static str, u64> {
    v.iter().copied().collect()
}

/// `c`'s value of counter `name`.
fn get(c: &Counters, name: &str) -> u64 {
    c.named()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no counter {name}"))
        .1
}

/// A valid SEND ONLY from A to B's QP at B's expected PSN.
fn send_only(t: &Bed) -> Vec<u8> {
    let bth = BthRepr::new(O::RC_SEND_ONLY, t.qpn(B), Psn::new(PSN_A));
    t.craft(A, bth, ExtHeaders::default(), &[1, 2, 3, 4])
}

/// Injects `frame` into B and asserts that exactly the drop reason `reason` moved, by one (and
/// the total; and the second name, for the ICRC).
fn drops_as(t: &mut Bed, frame: &[u8], reason: &'static str) {
    let before = t.p.b.counters();
    t.inject(B, frame);
    let mut w = want(&[(reason, 1), ("rx_drop_total", 1)]);
    if reason == "rx_drop_bad_icrc" {
        w.insert("rx_icrc_encapsulated", 1);
    }
    assert_eq!(delta(&before, &t.p.b.counters()), w, "{reason}");
}

/// As [`drops_as`], for a drop the QP makes: the packet passed the receive checks first, so
/// it is in `rcvd_pkts` (as in rxe, whose responder and completer drop after counting).
fn qp_drops_as(t: &mut Bed, frame: &[u8], reason: &'static str) {
    let before = t.p.b.counters();
    t.inject(B, frame);
    let w = want(&[
        (reason, 1),
        ("rx_drop_total", 1),
        ("rcvd_pkts", 1),
        ("rcvd_bytes", frame.len() as u64),
    ]);
    assert_eq!(delta(&before, &t.p.b.counters()), w, "{reason}");
}

// ---- the list itself ---------------------------------------------------------------------

#[test]
fn named_lists_every_field_once() {
    // The field names, from the derived Debug ("Counters { sent_pkts: 0, ... }").
    let dbg = format!("{:?}", Counters::default());
    let inner = dbg
        .trim_start_matches("Counters {")
        .trim_end_matches('}')
        .to_string();
    let fields: Vec<&str> = inner
        .split(',')
        .map(|f| f.split(':').next().unwrap().trim())
        .filter(|f| !f.is_empty())
        .collect();
    let named = Counters::default().named();
    let names: Vec<&str> = named.iter().map(|(n, _)| *n).collect();
    let mut seen = std::collections::BTreeSet::new();
    for n in &names {
        assert!(seen.insert(*n), "{n} listed twice");
    }
    for f in &fields {
        assert!(names.contains(f), "field {f} missing from Counters::named");
    }
    // Beyond the fields: the two second names and the drop total.
    let extra: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !fields.contains(n))
        .collect();
    assert_eq!(
        extra,
        vec!["rnr_nak_sent", "rx_drop_total", "rx_icrc_encapsulated"]
    );
    // The per-QP list has no duplicates either.
    let q = QpCounters::default().named();
    let qn: std::collections::BTreeSet<_> = q.iter().map(|(n, _)| *n).collect();
    assert_eq!(qn.len(), q.len());
}

// ---- receive drops, one reason each --------------------------------------------------------

#[test]
fn each_bad_frame_moves_its_own_drop_reason_and_nothing_else() {
    let mut t = Bed::rc();
    let good = send_only(&t);

    // Too short to be RoCE.
    drops_as(&mut t, &good[..30], "rx_drop_malformed");

    let mut icrc = good.clone();
    let n = icrc.len();
    icrc[n - 1] ^= 0xff;
    drops_as(&mut t, &icrc, "rx_drop_bad_icrc");
    // The in-place path counts it the same way.
    let before = t.p.b.counters();
    let now = t.p.now;
    t.p.b.handle_frame_mut(now, &mut icrc.clone());
    assert_eq!(
        delta(&before, &t.p.b.counters()),
        want(&[
            ("rx_drop_bad_icrc", 1),
            ("rx_icrc_encapsulated", 1),
            ("rx_drop_total", 1)
        ])
    );

    let mac = rebuild(&good, |r| r.eth.dst = Mac([0x02, 0, 0, 0, 0, 0x99]));
    drops_as(&mut t, &mac, "rx_drop_wrong_dst_mac");

    let ip = rebuild(&good, |r| {
        if let IpRepr::V4(v4) = &mut r.ip {
            v4.dst = Ipv4Addr::new(10, 0, 0, 99);
        }
    });
    drops_as(&mut t, &ip, "rx_drop_wrong_dst_ip");

    // The IPv4 header checksum (bytes 24..26 of the frame) is outside the ICRC.
    let mut csum = good.clone();
    csum[24] ^= 0x55;
    drops_as(&mut t, &csum, "rx_drop_bad_ip_checksum");

    let tver = rebuild(&good, |r| r.bth.tver = 1);
    drops_as(&mut t, &tver, "rx_drop_bad_tver");

    let pkey = rebuild(&good, |r| r.bth.pkey = PKey(0x1234));
    drops_as(&mut t, &pkey, "rx_drop_bad_pkey");

    let noqp = rebuild(&good, |r| r.bth.dqpn = Qpn::new(0x00ab_cdef));
    drops_as(&mut t, &noqp, "rx_drop_no_qp");

    // A UD opcode to an RC QP.
    let ud = t.craft(
        A,
        BthRepr::new(O::UD_SEND_ONLY, t.qpn(B), Psn::new(PSN_A)),
        ExtHeaders {
            deth: Some(rocemu_wire::DethRepr {
                qkey: rocemu_wire::QKey(0x11),
                src_qpn: t.qpn(A),
                resv: 0,
            }),
            ..Default::default()
        },
        &[0; 8],
    );
    drops_as(&mut t, &ud, "rx_drop_wrong_transport");

    // From an address that is not the QP's peer: a third host, or the peer's other GID.
    let src = rebuild(&good, |r| {
        if let IpRepr::V4(v4) = &mut r.ip {
            v4.src = Ipv4Addr::new(10, 0, 0, 77);
        }
    });
    drops_as(&mut t, &src, "rx_drop_wrong_src");

    // A response to B, which has sent nothing: a READ response with no READ waiting.
    let resp = t.craft(
        A,
        BthRepr::new(O::RC_RDMA_READ_RESPONSE_ONLY, t.qpn(B), Psn::new(PSN_B)),
        ExtHeaders {
            aeth: Some(rocemu_wire::headers::AethRepr {
                syndrome: rocemu_wire::Syndrome(0x1f),
                msn: rocemu_wire::Msn::new(0),
            }),
            ..Default::default()
        },
        &[0; 8],
    );
    qp_drops_as(&mut t, &resp, "rx_drop_unexpected_resp");

    // An ACK with a reserved AETH syndrome (type 0b10).
    let aeth = t.craft(
        A,
        BthRepr::new(O::RC_ACKNOWLEDGE, t.qpn(B), Psn::new(PSN_B)),
        ExtHeaders {
            aeth: Some(rocemu_wire::headers::AethRepr {
                syndrome: rocemu_wire::Syndrome(0x40),
                msn: rocemu_wire::Msn::new(0),
            }),
            ..Default::default()
        },
        &[],
    );
    qp_drops_as(&mut t, &aeth, "rx_drop_bad_aeth");

    // A QP in ERR takes nothing (its flushes counted before the snapshot).
    let qb = t.qpn(B);
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    t.p.b.modify_qp(qb, &attr, QpAttrMask::STATE).unwrap();
    drops_as(&mut t, &good, "rx_drop_qp_state");
}

#[test]
fn a_ce_marked_cnp_moves_the_ecn_and_cnp_counters() {
    let mut t = Bed::rc();
    let cnp = t.craft(
        A,
        BthRepr::new(O::CNP, t.qpn(B), Psn::new(0)),
        ExtHeaders::default(),
        &[],
    );
    let ce = rebuild(&cnp, |r| {
        if let IpRepr::V4(v4) = &mut r.ip {
            v4.ecn = 3;
        }
    });
    let before = t.p.b.counters();
    t.inject(B, &ce);
    assert_eq!(
        delta(&before, &t.p.b.counters()),
        want(&[("np_ecn_marked_roce_packets", 1), ("rp_cnp_ignored", 1)])
    );
}

#[test]
fn wrong_gid_index_is_rx_drop_wrong_src_then_retry_exceeded() {
    // A has two GIDs, 10.0.0.3 at index 0 and 10.0.0.1 at index 1; B's QP was told A is
    // 10.0.0.1, but A's QP sends from GID index 0: B drops every request as from the wrong
    // source, A sees nothing but timeouts (the interop mistake that looks like silent loss).
    let ip_a0 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
    let mut ca = RnicConfig::new(MAC_A, ip_a0, 7);
    ca.ips.push(IP_A);
    let mut a = Rnic::new(ca);
    let mut b = Rnic::new(RnicConfig::new(MAC_B, IP_B, 8));
    a.set_neighbor(IP_B, MAC_B);
    b.set_neighbor(IP_A, MAC_A);
    let mut p = Pair::with(a, b, Cable::new(Impairments::none(), 1));
    let cap = BedCfg::new(QpType::Rc).cap;
    let ea = end(&mut p.a, QpType::Rc, true, cap);
    let eb = end(&mut p.b, QpType::Rc, true, cap);
    let o = rocemu_emulator::connect::ConnectOpts {
        timeout: 8,
        retry_cnt: 2,
        ..Default::default()
    };
    let (pa, pb) = (o.psn_a, o.psn_b);
    rocemu_emulator::connect::bring_up(&mut p.a, ea.qp, eb.qp, IP_B, pa, pb, &o).unwrap();
    rocemu_emulator::connect::bring_up(&mut p.b, eb.qp, ea.qp, IP_A, pb, pa, &o).unwrap();
    let sge = Sge {
        addr: ea.mr.addr,
        length: 8,
        lkey: ea.mr.lkey,
    };
    p.a.post_send(ea.qp, wr(1, WrOpcode::Send, vec![sge]))
        .unwrap();
    p.drive(10_000_000).unwrap();
    let wcs = p.a.poll_cq(ea.cq, 8);
    assert_eq!(st(&wcs), vec![(1, WcStatus::RetryExcErr)]);
    let (ca, cb) = (p.a.counters(), p.b.counters());
    // The first try and two retries, each dropped by B.
    assert_eq!(cb.rx_drop_wrong_src, 3);
    assert_eq!(cb.rx_drop_total(), 3);
    assert_eq!(cb.rcvd_pkts, 0);
    assert_eq!(ca.local_ack_timeout_err, 2);
    assert_eq!(ca.retry_exceeded_err, 1);
    assert_eq!(ca.req_cqe_error, 1);
    // What a failing tool prints names the reason.
    assert!(cb.error_lines("").contains("rx_drop_wrong_src 3\n"));
    let info = p.a.qp_infos();
    let qa = info.iter().find(|q| q.qpn == ea.qp).unwrap();
    assert_eq!(qa.last_error, Some(WcStatus::RetryExcErr));
    assert_eq!(qa.counters.local_ack_timeout_err, 2);
    assert_eq!(qa.counters.retransmitted_pkts, 2);
}

#[test]
fn a_gid_of_the_other_ip_version_is_one_gid_type_mismatch_and_nothing_on_the_wire() {
    // rdma_rxe's GID 0 is its IPv6 link-local address: a peer whose tool was given index 0
    // sends that GID, and this RNIC's QP (source GID index 0, IPv4) is told to reach it. The RTR
    // is refused, counted once, and the message names the counter and the usual fix.
    let mut a = Rnic::new(RnicConfig::new(MAC_A, IP_A, 7));
    let v6: IpAddr = "fe80::5054:ff:fe99:1".parse().unwrap();
    a.set_neighbor(v6, MAC_B);
    let cap = BedCfg::new(QpType::Rc).cap;
    let ea = end(&mut a, QpType::Rc, true, cap);
    let o = rocemu_emulator::connect::ConnectOpts::default();
    let before = a.counters();
    let e =
        rocemu_emulator::connect::bring_up(&mut a, ea.qp, Qpn::new(0x12), v6, o.psn_a, o.psn_b, &o)
            .unwrap_err()
            .to_string();
    assert_eq!(
        delta(&before, &a.counters()),
        want(&[("gid_type_mismatch", 1)])
    );
    assert!(e.contains("source GID index 0 is 10.0.0.1 (IPv4) and the destination GID is fe80::5054:ff:fe99:1 (IPv6)"), "{e}");
    assert!(e.contains("gid_type_mismatch") && e.contains("-g 1"), "{e}");
    assert_eq!(a.qp_infos()[0].state, QpState::Init);
    assert!(a
        .counters()
        .error_lines("")
        .contains("gid_type_mismatch 1\n"));
    let mut buf = [0u8; 4096];
    assert_eq!(
        a.poll_transmit(rocemu_emulator::Nanos::ZERO, &mut buf),
        None,
        "nothing goes on the wire"
    );
}

// ---- traffic -------------------------------------------------------------------------------

#[test]
fn traffic_counters_match_across_the_cable() {
    let mut t = Bed::rc();
    t.post_recv(B, 1, 0x8000, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (ra, rk) = t.raddr(B, 0x1000);
    let write = WrOpcode::RdmaWrite {
        remote_addr: ra,
        rkey: rk,
    };
    t.post_send(A, wr(2, write, vec![t.sge(A, 0, 8)]));
    let read = WrOpcode::RdmaRead {
        remote_addr: ra,
        rkey: rk,
    };
    t.post_send(A, wr(3, read, vec![t.sge(A, 0x100, 8)]));
    let fadd = WrOpcode::AtomicFetchAdd {
        remote_addr: ra,
        rkey: rk,
        add: 1,
    };
    t.post_send(A, wr(4, fadd, vec![t.sge(A, 0x200, 8)]));
    let (wa, wb) = t.settle();
    assert_eq!(wa.len(), 4);
    assert_eq!(wb.len(), 1);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    assert_eq!(ca.sent_pkts, cb.rcvd_pkts);
    assert_eq!(cb.sent_pkts, ca.rcvd_pkts);
    assert_eq!(ca.sent_bytes, cb.rcvd_bytes);
    assert_eq!(cb.sent_bytes, ca.rcvd_bytes);
    assert_eq!(ca.sent_pkts, 4);
    assert_eq!((ca.rdma_sends, cb.rdma_recvs), (1, 1));
    assert_eq!(
        (
            cb.rx_write_requests,
            cb.rx_read_requests,
            cb.rx_atomic_requests
        ),
        (1, 1, 1)
    );
    assert!(ca.errors().is_empty(), "{:?}", ca.errors());
    assert!(cb.errors().is_empty(), "{:?}", cb.errors());
    // The per-QP counters are the device's for the one QP.
    let qa = t.p.a.qp_infos();
    let qa = qa.iter().find(|q| q.qpn == t.qpn(A)).unwrap();
    assert_eq!(qa.counters.sent_pkts, ca.sent_pkts);
    assert_eq!(qa.counters.rcvd_pkts, ca.rcvd_pkts);
    assert_eq!(qa.counters.sent_bytes, ca.sent_bytes);
    assert_eq!(qa.last_error, None);
}

// ---- sequence errors -------------------------------------------------------------------

/// A five-packet SEND (MTU 256) with packet `lost` (0-based) dropped once.
fn lose_one(lost: u32) -> Bed {
    let mut t = BedCfg::new(QpType::Rc).both(|o| o.mtu = Mtu::M256).build();
    t.post_recv(B, 7, 0x10000, 1280);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::AB && p.psn == PSN_A + lost && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 1280)]));
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::Success)]);
    assert_eq!(st(&wb), vec![(7, WcStatus::Success)]);
    t
}

#[test]
fn a_psn_sequence_error_moves_the_nak_counters_by_one() {
    let t = lose_one(2);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    // B: two packets after the gap, the first makes the one NAK.
    assert_eq!(cb.out_of_sequence, 2);
    assert_eq!(cb.out_of_seq_request, 1);
    assert_eq!(cb.nak_sent_seq_err, 1);
    assert_eq!(cb.nak_sent(), 1);
    assert_eq!(cb.send_rnr_err, 0);
    // A: one NAK, one retry, three packets sent again; rxe counts the NAK in rcvd_seq_err
    // because it acknowledges PSNs 0 and 1, which no ACK had.
    assert_eq!(ca.nak_rcvd_seq_err, 1);
    assert_eq!(ca.nak_rcvd(), 1);
    assert_eq!(ca.packet_seq_err, 1);
    assert_eq!(ca.rcvd_seq_err, 1);
    assert_eq!(ca.completer_retry_err, 1);
    assert_eq!(ca.retransmitted_pkts, 3);
    assert_eq!(ca.local_ack_timeout_err, 0);
    let qa = t.p.a.qp_infos();
    let qa = qa.iter().find(|q| q.qpn == t.qpn(A)).unwrap();
    assert_eq!(
        (qa.counters.nak_rcvd, qa.counters.retransmitted_pkts),
        (1, 3)
    );
    let qb = t.p.b.qp_infos();
    let qb = qb.iter().find(|q| q.qpn == t.qpn(B)).unwrap();
    assert_eq!((qb.counters.nak_sent, qb.counters.out_of_sequence), (1, 2));
}

#[test]
fn rcvd_seq_err_skips_a_nak_for_the_oldest_unacknowledged_psn_as_rxe_does() {
    // The first packet lost: the NAK names the PSN A waits for, and rxe's check_ack does not
    // count it in rcvd_seq_err (nothing newly acknowledged); the other counters do.
    let t = lose_one(0);
    let ca = t.p.a.counters();
    assert_eq!(ca.nak_rcvd_seq_err, 1);
    assert_eq!(ca.packet_seq_err, 1);
    assert_eq!(ca.rcvd_seq_err, 0);
    assert_eq!(t.p.b.counters().out_of_sequence, 4);
}

#[test]
fn rcvd_seq_err_skips_a_nak_for_the_first_psn_of_a_later_message_as_rxe_does() {
    // Three one-packet SENDs, the second lost once: B NAKs the second's PSN. The NAK
    // acknowledges the first SEND, which rxe's check_psn completes before check_ack looks at
    // the NAK, so its PSN is the one rxe's completer then expects: not in rcvd_seq_err (the
    // conformance scenario rdma.requester.seq-nak-go-back, where rxe's delta is 0).
    let mut t = Bed::rc();
    for i in 0..3 {
        t.post_recv(B, 10 + i, 0x8000 + 64 * i as usize, 64);
    }
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::AB && p.psn == PSN_A + 1 && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    for i in 0..3 {
        t.post_send(A, wr(i, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    }
    let (wa, wb) = t.settle();
    assert_eq!(wa.len(), 3);
    assert_eq!(wb.len(), 3);
    let ca = t.p.a.counters();
    assert_eq!(ca.nak_rcvd_seq_err, 1);
    assert_eq!(ca.packet_seq_err, 1);
    assert_eq!(ca.completer_retry_err, 1);
    assert_eq!(ca.rcvd_seq_err, 0);
    assert_eq!(ca.rdma_sends, 3);
}

#[test]
fn a_lost_ack_makes_one_duplicate_request() {
    let mut t = BedCfg::new(QpType::Rc).both(|o| o.timeout = 8).build();
    t.post_recv(B, 7, 0x8000, 64);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::BA && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::Success)]);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    assert_eq!(cb.duplicate_request, 1);
    assert_eq!(cb.rdma_recvs, 1, "executed once");
    assert_eq!(ca.local_ack_timeout_err, 1);
    assert_eq!(ca.completer_retry_err, 1);
    assert_eq!(ca.retransmitted_pkts, 1);
}

#[test]
fn a_lost_read_response_is_one_implied_nak() {
    let mut t = BedCfg::new(QpType::Rc).both(|o| o.mtu = Mtu::M256).build();
    let (ra, rk) = t.raddr(B, 0x1000);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::BA && p.psn == PSN_A + 2 && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    let read = WrOpcode::RdmaRead {
        remote_addr: ra,
        rkey: rk,
    };
    t.post_send(A, wr(1, read, vec![t.sge(A, 0, 1280)]));
    let w = t.wait_wcs(A, 1);
    assert_eq!(st(&w), vec![(1, WcStatus::Success)]);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    assert_eq!(ca.implied_nak_seq_err, 1);
    assert_eq!(ca.completer_retry_err, 1);
    assert_eq!(ca.nak_rcvd(), 0);
    // The response after the gap makes the one implied NAK; the next one finds the go-back
    // under way and spends no second retry. The resumed READ (at PSN +2) is a duplicate to B.
    assert_eq!(cb.rx_read_requests, 1);
    assert_eq!(
        cb.duplicate_request, 1,
        "the READ resumed from its third response"
    );
}

#[test]
fn a_response_older_than_the_one_awaited_is_rx_drop_duplicate_resp() {
    let mut t = BedCfg::new(QpType::Rc).both(|o| o.timeout = 0).build();
    let (ra, rk) = t.raddr(B, 0x1000);
    // Every response is lost, so the READ stays outstanding (no timer: timeout 0).
    t.filter = drop_dir(Dir::BA);
    let read = WrOpcode::RdmaRead {
        remote_addr: ra,
        rkey: rk,
    };
    t.post_send(A, wr(1, read, vec![t.sge(A, 0, 8)]));
    t.flush_now();
    let old = t.craft(
        B,
        BthRepr::new(O::RC_RDMA_READ_RESPONSE_ONLY, t.qpn(A), Psn::new(PSN_A - 1)),
        ExtHeaders {
            aeth: Some(rocemu_wire::headers::AethRepr {
                syndrome: rocemu_wire::Syndrome(0x1f),
                msn: rocemu_wire::Msn::new(0),
            }),
            ..Default::default()
        },
        &[0; 8],
    );
    let before = t.p.a.counters();
    t.inject(A, &old);
    let d = delta(&before, &t.p.a.counters());
    assert_eq!(d.get("rx_drop_duplicate_resp"), Some(&1), "{d:?}");
    assert_eq!(d.get("rx_drop_total"), Some(&1), "{d:?}");
    assert_eq!(d.get("rcvd_pkts"), Some(&1), "it passed the header checks");
}

// ---- class C / D NAKs --------------------------------------------------------------------

#[test]
fn a_remote_access_error_moves_its_counters_by_one() {
    let mut t = Bed::rc();
    let (ra, rk) = t.raddr(B, 0x1000);
    let write = WrOpcode::RdmaWrite {
        remote_addr: ra,
        rkey: rk ^ 0x100,
    };
    t.post_send(A, wr(1, write, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_recv(B, 9, 0x8000, 64);
    let (wa, wb) = t.settle();
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(st(&wb), vec![(9, WcStatus::WrFlushErr)]);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    assert_eq!(cb.resp_remote_access_errors, 1);
    assert_eq!(cb.nak_sent_rem_access, 1);
    assert_eq!(cb.nak_sent(), 1);
    assert_eq!(cb.resp_cqe_flush_error, 1);
    assert_eq!(ca.nak_rcvd_rem_access, 1);
    assert_eq!(ca.nak_rcvd(), 1);
    assert_eq!(ca.req_remote_access_errors, 1);
    assert_eq!((ca.req_cqe_error, ca.req_cqe_flush_error), (1, 1));
    let qa = t.p.a.qp_infos();
    let qa = qa.iter().find(|q| q.qpn == t.qpn(A)).unwrap();
    assert_eq!(
        qa.last_error,
        Some(WcStatus::RemAccessErr),
        "the flush does not hide the error"
    );
}

#[test]
fn a_send_longer_than_its_receive_is_an_invalid_request_and_a_local_length_error() {
    let mut t = Bed::rc();
    t.post_recv(B, 9, 0x8000, 4);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 64)]));
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(st(&wb), vec![(9, WcStatus::LocLenErr)]);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    assert_eq!(cb.nak_sent_inv_req, 1);
    assert_eq!(cb.resp_local_length_error, 1);
    assert_eq!(cb.resp_cqe_error, 1);
    assert_eq!(cb.rdma_recvs, 0);
    assert_eq!(ca.nak_rcvd_inv_req, 1);
    assert_eq!(ca.req_remote_invalid_request, 1);
    assert_eq!(ca.rdma_sends, 1, "rxe counts a SEND completed in error too");
    let qb = t.p.b.qp_infos();
    let qb = qb.iter().find(|q| q.qpn == t.qpn(B)).unwrap();
    assert_eq!(qb.last_error, Some(WcStatus::LocLenErr));
}

#[test]
fn a_bad_receive_buffer_is_one_remote_operational_error() {
    let mut t = Bed::rc();
    let mut bad = t.sge(B, 0, 64);
    bad.lkey ^= 0x0101_0101;
    t.post_recv_sges(B, 100, vec![bad]);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::RemOpErr)]);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    assert_eq!((cb.nak_sent_rem_op, cb.nak_sent()), (1, 1));
    assert_eq!((ca.nak_rcvd_rem_op, ca.nak_rcvd()), (1, 1));
    assert_eq!(ca.req_cqe_error, 1);
}

// ---- RNR and timeouts ----------------------------------------------------------------------

#[test]
fn rnr_naks_until_rnr_retry_is_spent() {
    // rnr_retry 1: the first RNR NAK starts a wait, the second exhausts it.
    let mut t = BedCfg::new(QpType::Rc)
        .both(|o| {
            o.rnr_retry = 1;
            o.min_rnr_timer = 1;
        })
        .build();
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::RnrRetryExcErr)]);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    assert_eq!(cb.send_rnr_err, 2);
    assert_eq!(
        get(&cb, "rnr_nak_sent"),
        2,
        "the second name, the same value"
    );
    assert_eq!(cb.out_of_buffer, 2);
    assert_eq!(cb.nak_sent(), 0, "RNR NAKs are not in the NAK counters");
    assert_eq!(ca.rcvd_rnr_err, 2);
    assert_eq!(ca.rnr_nak_retry_err, 1);
    assert_eq!(ca.retry_rnr_exceeded_err, 1);
    assert_eq!(
        ca.completer_retry_err, 0,
        "rxe does not count RNR waits there"
    );
    assert_eq!(ca.retransmitted_pkts, 1);
    let qa = t.p.a.qp_infos();
    let qa = qa.iter().find(|q| q.qpn == t.qpn(A)).unwrap();
    assert_eq!(qa.counters.rnr_nak_rcvd, 2);
    assert_eq!(qa.last_error, Some(WcStatus::RnrRetryExcErr));
    let qb = t.p.b.qp_infos();
    let qb = qb.iter().find(|q| q.qpn == t.qpn(B)).unwrap();
    assert_eq!(qb.counters.rnr_nak_sent, 2);
}

#[test]
fn ack_timeouts_until_retry_cnt_is_spent() {
    let mut t = BedCfg::new(QpType::Rc)
        .both(|o| {
            o.timeout = 8;
            o.retry_cnt = 2;
        })
        .build();
    t.filter = drop_dir(Dir::AB);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::RetryExcErr)]);
    let ca = t.p.a.counters();
    assert_eq!(ca.local_ack_timeout_err, 2);
    assert_eq!(ca.completer_retry_err, 2);
    assert_eq!(ca.retry_exceeded_err, 1);
    assert_eq!(ca.retransmitted_pkts, 2);
    assert_eq!(ca.sent_pkts, 3);
    assert_eq!(ca.rdma_sends, 1);
    assert_eq!(
        ca.error_lines("  "),
        "  retransmitted_pkts 2\n  completer_retry_err 2\n  local_ack_timeout_err 2\n  \
         retry_exceeded_err 1\n  req_cqe_error 1\n"
    );
}

/// rxe's `rdma_sends` counts every SEND its completer finishes, flushed ones too
/// (`do_complete()` in `rxe_comp.c`, reached for each WQE left when the completer drains a QP
/// in ERR): the SEND that exhausts `retry_cnt` counts, and so do the two SENDs behind it that
/// are flushed, and one posted to the QP in ERR; the flushed WRITE does not.
#[test]
fn flushed_sends_count_in_rdma_sends_as_rxe_counts_them() {
    let mut t = BedCfg::new(QpType::Rc)
        .both(|o| {
            o.timeout = 8;
            o.retry_cnt = 1;
        })
        .build();
    t.filter = drop_dir(Dir::AB);
    let (ra, rk) = t.raddr(B, 0x1000);
    let write = WrOpcode::RdmaWrite {
        remote_addr: ra,
        rkey: rk,
    };
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(3, write, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(4, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, _) = t.settle();
    assert_eq!(
        st(&wa),
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(t.p.a.counters().rdma_sends, 3);
    assert_eq!(t.state(A), QpState::Err);
    t.post_send(A, wr(5, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    assert_eq!(st(&t.wcs(A)), vec![(5, WcStatus::WrFlushErr)]);
    assert_eq!(t.p.a.counters().rdma_sends, 4);
}

// ---- UC and UD -----------------------------------------------------------------------------

fn uc() -> Bed {
    BedCfg::new(QpType::Uc).both(|o| o.mtu = Mtu::M256).build()
}

fn uc_pkt(t: &Bed, op: O, psn: u32, len: usize) -> Vec<u8> {
    t.craft(
        A,
        BthRepr::new(op, t.qpn(B), Psn::new(psn)),
        ExtHeaders::default(),
        &vec![0x5a; len],
    )
}

#[test]
fn uc_drops_have_their_own_reasons() {
    let mut t = uc();
    t.post_recv(B, 1, 0, 4096);
    // A MIDDLE with no message in progress, at the expected PSN.
    let mid = uc_pkt(&t, O::UC_SEND_MIDDLE, PSN_A, 256);
    qp_drops_as(&mut t, &mid, "rx_drop_opcode_seq");
    // A FIRST shorter than the MTU.
    let short = uc_pkt(&t, O::UC_SEND_FIRST, PSN_A + 1, 100);
    qp_drops_as(&mut t, &short, "rx_drop_bad_length");
    // A gap: the MIDDLE after it is out of sequence and the rest of a lost message.
    let before = t.p.b.counters();
    let gap = uc_pkt(&t, O::UC_SEND_MIDDLE, PSN_A + 5, 256);
    t.inject(B, &gap);
    let d = delta(&before, &t.p.b.counters());
    assert_eq!(d.get("out_of_sequence"), Some(&1), "{d:?}");
    assert_eq!(d.get("rx_drop_rest_of_msg"), Some(&1), "{d:?}");
    assert_eq!(d.get("rx_drop_total"), Some(&1), "{d:?}");
    assert_eq!(t.p.b.counters().out_of_seq_request, 0, "rxe counts RC only");
}

#[test]
fn uc_and_ud_without_a_receive_are_out_of_buffer() {
    let mut t = uc();
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.settle();
    assert_eq!(t.p.b.counters().out_of_buffer, 1);
    assert_eq!(t.p.b.counters().rdma_recvs, 0);

    let mut t = BedCfg::new(QpType::Ud).build();
    let mut w = wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]);
    w.ud = Some(UdDest {
        ah: AhAttr::to(IP_B, MAC_B),
        remote_qpn: t.b.qp,
        remote_qkey: rocemu_wire::QKey(0x8000_0000),
    });
    t.post_send(A, w);
    t.settle();
    let cb = t.p.b.counters();
    assert_eq!((cb.out_of_buffer, cb.rcvd_pkts), (1, 1));
    assert_eq!(cb.rx_drop_total(), 0);
}

#[test]
fn uc_write_outside_the_region_is_a_responder_access_error() {
    let mut t = uc();
    let (ra, rk) = t.raddr(B, 0x1000);
    let bad = t.craft(
        A,
        BthRepr::new(O::UC_RDMA_WRITE_ONLY, t.qpn(B), Psn::new(PSN_A)),
        ExtHeaders {
            reth: Some(RethRepr {
                va: ra,
                rkey: rocemu_wire::RKey(rk ^ 0x100),
                dma_len: 8,
            }),
            ..Default::default()
        },
        &[1; 8],
    );
    let before = t.p.b.counters();
    t.inject(B, &bad);
    let d = delta(&before, &t.p.b.counters());
    assert_eq!(d.get("resp_remote_access_errors"), Some(&1), "{d:?}");
    assert_eq!(d.get("rx_write_requests"), Some(&1), "{d:?}");
    assert_eq!(d.get("rcvd_pkts"), Some(&1), "{d:?}");
}

#[test]
fn a_datagram_with_the_wrong_qkey_is_rx_drop_bad_qkey() {
    let mut t = BedCfg::new(QpType::Ud).build();
    t.post_recv(B, 1, 0, 100);
    let bad = t.craft(
        A,
        BthRepr::new(O::UD_SEND_ONLY, t.qpn(B), Psn::new(0)),
        ExtHeaders {
            deth: Some(rocemu_wire::DethRepr {
                qkey: rocemu_wire::QKey(0x2222_2222),
                src_qpn: t.qpn(A),
                resv: 0,
            }),
            ..Default::default()
        },
        &[0; 8],
    );
    drops_as(&mut t, &bad, "rx_drop_bad_qkey");
}
