//! A memory region deregistered while a work request still uses it (issue 12, item 5): the work
//! request completes with LOC_PROT_ERR and its QP goes to ERR, as in rxe (its requester's
//! `fill_packet` failure and its completer's `do_read` / `do_atomic` copy failures set
//! IB_WC_LOC_PROT_ERR), and no packet whose payload could not be gathered goes on the wire.
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::Opcode as O;

const PSN_A: u32 = 0x123;

fn bed256() -> Bed {
    BedCfg::new(QpType::Rc)
        .both(|o| {
            o.mtu = Mtu::M256;
            o.timeout = 8;
            o.retry_cnt = 3;
        })
        .build()
}

/// A second region on side `s`, filled with `fill`, that the test deregisters.
fn extra_mr(t: &mut Bed, s: rocemu_emulator::inproc::Side, len: usize, fill: u8) -> MrInfo {
    let pd = t.end(s).pd;
    let mr = t.p.rnic(s).reg_mr(pd, len, Access::ALL).unwrap();
    t.p.rnic(s).mr_bytes_mut(mr.lkey).unwrap().fill(fill);
    mr
}

fn sge_of(mr: &MrInfo, off: u64, len: u32) -> Sge {
    Sge {
        addr: mr.addr + off,
        length: len,
        lkey: mr.lkey,
    }
}

/// One frame from side A's port, by hand (the bed's own driver sends everything at once).
fn one_frame_from_a(t: &mut Bed) -> Vec<u8> {
    let mut buf = vec![0u8; 10_000];
    let now = t.now();
    let n = t.p.a.poll_transmit(now, &mut buf).expect("A has a frame");
    buf.truncate(n);
    buf
}

#[test]
fn send_from_a_region_deregistered_mid_message_fails_with_loc_prot_err() {
    // A 1000-byte SEND takes four packets at MTU 256. The first one leaves; then the source
    // region goes away. The other three cannot be filled: none of them may leave (today's
    // code sent them with whatever bytes the transmit buffer held), and the SEND completes
    // LOC_PROT_ERR with A's QP in ERR.
    let mut t = bed256();
    t.post_recv(B, 7, 0, 4096);
    let src = extra_mr(&mut t, A, 4096, 0xa5);
    t.post_send(A, wr(1, WrOpcode::Send, vec![sge_of(&src, 0, 1000)]));
    let first = one_frame_from_a(&mut t);
    let p = Pkt::parse(t.now(), Dir::AB, &first);
    assert_eq!((p.op, p.psn), (O::RC_SEND_FIRST, PSN_A));
    assert!(p.payload.iter().all(|&b| b == 0xa5));
    t.inject(B, &first);
    t.p.a.dereg_mr(src.lkey).unwrap();
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::LocProtErr)]);
    assert_eq!(t.state(A), QpState::Err);
    let sent: Vec<_> = t.ops(Dir::AB);
    assert!(
        sent.is_empty(),
        "nothing of the SEND may leave once its region is gone: {sent:?}"
    );
    assert!(wb.is_empty(), "B never saw the message end: {wb:?}");
}

#[test]
fn write_retransmitted_after_its_region_went_away_fails_and_sends_nothing() {
    // Every packet of a WRITE is lost; the region is deregistered; the retransmission after the
    // ACK timeout cannot gather its payload. Nothing goes out, B's memory is untouched, the
    // WRITE completes LOC_PROT_ERR (not a success, not RETRY_EXC_ERR).
    let mut t = bed256();
    t.fill(B, 0x1000, &[0xee; 600]);
    let src = extra_mr(&mut t, A, 4096, 0x5a);
    t.filter = drop_dir(Dir::AB);
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![sge_of(&src, 0, 600)],
        ),
    );
    t.flush_now();
    assert_eq!(t.ops(Dir::AB).len(), 3);
    t.clear_log();
    t.filter = Box::new(|_| Verdict::Pass);
    t.p.a.dereg_mr(src.lkey).unwrap();
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::LocProtErr)]);
    assert_eq!(t.state(A), QpState::Err);
    assert_eq!(
        t.ops(Dir::AB),
        vec![],
        "no retransmission without its payload"
    );
    assert_eq!(t.bytes(B, 0x1000, 600), vec![0xee; 600]);
}

#[test]
fn read_into_a_sink_deregistered_before_the_response_fails_with_loc_prot_err() {
    // The READ request leaves; A's sink region is deregistered; the responses arrive and have
    // nowhere to land: LOC_PROT_ERR (rxe's do_read), not a success without data.
    let mut t = bed256();
    t.fill(B, 0x1000, &[0x33; 600]);
    let sink = extra_mr(&mut t, A, 4096, 0);
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![sge_of(&sink, 0, 600)],
        ),
    );
    let req = one_frame_from_a(&mut t);
    t.p.a.dereg_mr(sink.lkey).unwrap();
    t.inject(B, &req);
    let (wa, _) = t.settle();
    assert!(
        t.ops(Dir::BA)
            .iter()
            .any(|&(op, _)| op == O::RC_RDMA_READ_RESPONSE_FIRST),
        "B answered"
    );
    assert_eq!(st(&wa), vec![(1, WcStatus::LocProtErr)]);
    assert_eq!(t.state(A), QpState::Err);
}

#[test]
fn atomic_into_a_sink_deregistered_before_the_ack_fails_with_loc_prot_err() {
    let mut t = Bed::rc();
    t.fill(B, 0x100, &10u64.to_le_bytes());
    let sink = extra_mr(&mut t, A, 64, 0);
    let (ra, rk) = t.raddr(B, 0x100);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 1,
            },
            vec![sge_of(&sink, 0, 8)],
        ),
    );
    let req = one_frame_from_a(&mut t);
    t.p.a.dereg_mr(sink.lkey).unwrap();
    t.inject(B, &req);
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::LocProtErr)]);
    assert_eq!(t.state(A), QpState::Err);
}

#[test]
fn read_response_from_a_region_deregistered_after_the_rkey_check_is_a_remote_access_nak() {
    // B accepted the READ (R_Key checked), then its region went away before the responses left:
    // a remote access error NAK for the READ's PSN, and A completes REM_ACCESS_ERR. No response
    // packet carries data.
    let mut t = bed256();
    let src = extra_mr(&mut t, B, 4096, 0x77);
    let req_sge = t.sge(A, 0, 600);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: src.addr,
                rkey: src.rkey,
            },
            vec![req_sge],
        ),
    );
    let req = one_frame_from_a(&mut t);
    t.inject(B, &req);
    t.p.b.dereg_mr(src.lkey).unwrap();
    let (wa, _) = t.settle();
    assert_eq!(
        t.acks(Dir::BA),
        vec![(PSN_A, NAK_ACC, 0)],
        "MSN: the READ did not complete"
    );
    assert!(t.pkts(Dir::BA).iter().all(|p| p.payload.is_empty()));
    assert_eq!(st(&wa), vec![(1, WcStatus::RemAccessErr)]);
}

#[test]
fn rc_receive_whose_region_went_away_completes_loc_prot_err() {
    // The receive WQE's region is deregistered after post_recv: the SEND is NAKed (remote
    // operational error) and the receive completes LOC_PROT_ERR.
    let mut t = bed256();
    let dst = extra_mr(&mut t, B, 4096, 0);
    let qp = t.qpn(B);
    t.p.b
        .post_recv(
            qp,
            RecvWr {
                wr_id: 9,
                sg_list: [sge_of(&dst, 0, 4096)].into(),
            },
        )
        .unwrap();
    t.p.b.dereg_mr(dst.lkey).unwrap();
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 100)]));
    let (wa, wb) = t.settle();
    assert_eq!(st(&wb), vec![(9, WcStatus::LocProtErr)]);
    assert_eq!(st(&wa), vec![(1, WcStatus::RemOpErr)]);
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, NAK_OP, 0)]);
}

fn receive_into_a_deregistered_region(qp_type: QpType) -> Vec<Wc> {
    let mut t = BedCfg::new(qp_type).build();
    let dst = extra_mr(&mut t, B, 4096, 0);
    let qp = t.qpn(B);
    t.p.b
        .post_recv(
            qp,
            RecvWr {
                wr_id: 9,
                sg_list: [sge_of(&dst, 0, 4096)].into(),
            },
        )
        .unwrap();
    t.p.b.dereg_mr(dst.lkey).unwrap();
    let mut w = wr(1, WrOpcode::Send, vec![t.sge(A, 0, 100)]);
    if qp_type == QpType::Ud {
        w.ud = Some(UdDest {
            ah: AhAttr {
                dgid: Gid::from_ip(rocemu_emulator::inproc::IP_B),
                ..Default::default()
            },
            remote_qpn: qp,
            remote_qkey: rocemu_emulator::connect::ConnectOpts::default().qkey,
        });
    }
    t.post_send(A, w);
    let (_, wb) = t.settle();
    wb
}

#[test]
fn uc_and_ud_receive_whose_region_went_away_completes_loc_prot_err() {
    // Not a length error: the buffer is long enough, its key is gone.
    for ty in [QpType::Uc, QpType::Ud] {
        let wb = receive_into_a_deregistered_region(ty);
        assert_eq!(st(&wb), vec![(9, WcStatus::LocProtErr)], "{ty:?}");
    }
}

#[test]
fn read_nak_for_a_region_gone_goes_ahead_of_later_acks() {
    // A READ and a SEND behind it reach B in one burst; B's READ source is deregistered before
    // B sends anything. The remote access NAK takes the READ response's place, ahead of the
    // SEND's ACK: the ACK first would acknowledge the READ before its (never coming) data.
    let mut t = bed256();
    t.post_recv(B, 7, 0, 64);
    let src = extra_mr(&mut t, B, 4096, 0x77);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: src.addr,
                rkey: src.rkey,
            },
            vec![t.sge(A, 0, 100)],
        ),
    );
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0x100, 8)]));
    let read = one_frame_from_a(&mut t);
    let send = one_frame_from_a(&mut t);
    t.inject(B, &read);
    t.inject(B, &send);
    t.p.b.dereg_mr(src.lkey).unwrap();
    let (wa, _) = t.settle();
    assert_eq!(
        t.acks(Dir::BA)[..2],
        [(PSN_A, NAK_ACC, 0), (PSN_A + 1, ACK, 2)]
    );
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn earlier_unacknowledged_work_requests_are_flushed_not_completed() {
    // A WRITE leaves but its ACK is lost; then a SEND from a region deregistered before it
    // left fails locally. The WRITE was never acknowledged: it completes WR_FLUSH_ERR as the
    // QP enters ERR (rxe flushes every WQE still on the send queue), never SUCCESS, which would
    // tell the program its data arrived.
    let mut t = bed256();
    t.filter = drop_dir(Dir::BA);
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 100)],
        ),
    );
    t.flush_now();
    let src = extra_mr(&mut t, A, 4096, 0x5a);
    t.post_send(A, wr(2, WrOpcode::Send, vec![sge_of(&src, 0, 100)]));
    t.p.a.dereg_mr(src.lkey).unwrap();
    let (wa, _) = t.settle();
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::LocProtErr)]
    );
    assert_eq!(t.state(A), QpState::Err);
}
