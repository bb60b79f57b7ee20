//! UC (IBTA 9.8.2.2, unverified: no ACKs, a PSN gap loses the message in progress and its receive
//! WQE is reused) and UD (9.8.3 and 10.2.4, unverified: DETH, Q_Key checks and the controlled Q_Key
//! rule, the 40-byte GRH area, src_qp, one-packet messages), with exact packets and completions.
mod common;
use common::*;
use rocemu_emulator::inproc::{
    Side::{A, B},
    IP_A, IP_B, MAC_A, MAC_B,
};
use rocemu_emulator::rnic::*;
use rocemu_wire::{Opcode as O, QKey};

const PSN_A: u32 = 0x123;

fn uc() -> Bed {
    BedCfg::new(QpType::Uc).both(|o| o.mtu = Mtu::M256).build()
}

// ---- UC ------------------------------------------------------------------------------------

#[test]
fn uc_send_and_write_with_imm_no_acks() {
    let mut t = uc();
    let data = pattern(600, 1);
    t.fill(A, 0, &data);
    t.post_recv(B, 1, 0x1000, 1000);
    t.post_recv(B, 2, 0x2000, 16);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::SendWithImm { imm: 0x55 },
            vec![t.sge(A, 0, 600)],
        ),
    );
    let (ra, rk) = t.raddr(B, 0x4000);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: ra,
                rkey: rk,
                imm: 0x66,
            },
            vec![t.sge(A, 0, 600)],
        ),
    );
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::RdmaWrite {
                remote_addr: ra + 1000,
                rkey: rk,
            },
            vec![t.sge(A, 0, 10)],
        ),
    );
    let (wa, wb) = t.settle();
    // The requester completes when the last packet is sent (IBTA 9.8.2, unverified: no ACK exists;
    // 9.8.4 is raw datagrams, A17.4.6).
    assert_eq!(
        st(&wa),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.opcode, w.byte_len, w.imm_data, w.wc_flags))
            .collect::<Vec<_>>(),
        vec![
            (1, WcOpcode::Recv, 600, 0x55, WcFlags::WITH_IMM),
            (2, WcOpcode::RecvRdmaWithImm, 600, 0x66, WcFlags::WITH_IMM)
        ]
    );
    assert_eq!(t.bytes(B, 0x1000, 600), data);
    assert_eq!(t.bytes(B, 0x4000, 600), data);
    assert_eq!(t.bytes(B, 0x4000 + 1000, 10), &data[..10]);
    let p = t.pkts(Dir::AB);
    assert_eq!(
        p.iter()
            .map(|p| (p.op, p.psn, p.ack_req, p.imm, p.reth.map(|r| r.dma_len)))
            .collect::<Vec<_>>(),
        vec![
            (O::UC_SEND_FIRST, PSN_A, false, None, None),
            (O::UC_SEND_MIDDLE, PSN_A + 1, false, None, None),
            (
                O::UC_SEND_LAST_WITH_IMMEDIATE,
                PSN_A + 2,
                false,
                Some(0x55),
                None
            ),
            (O::UC_RDMA_WRITE_FIRST, PSN_A + 3, false, None, Some(600)),
            (O::UC_RDMA_WRITE_MIDDLE, PSN_A + 4, false, None, None),
            (
                O::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                PSN_A + 5,
                false,
                Some(0x66),
                None
            ),
            (O::UC_RDMA_WRITE_ONLY, PSN_A + 6, false, None, Some(10)),
        ]
    );
    assert!(t.pkts(Dir::BA).is_empty(), "UC is unacknowledged");
    assert_eq!(t.p.a.poll_timeout(), None, "and has no ACK timer");
}

/// Message 1 (4 packets) loses packet `lost` (index); message 2 (2 packets) and message 3
/// (1 packet) follow.
fn uc_gap(lost: u32) {
    let mut t = uc();
    let m1 = pattern(1000, 1);
    let m2 = pattern(400, 2);
    let m3 = pattern(100, 3);
    t.fill(A, 0, &m1);
    t.fill(A, 0x1000, &m2);
    t.fill(A, 0x2000, &m3);
    t.post_recv(B, 1, 0x10000, 1024);
    t.post_recv(B, 2, 0x20000, 1024);
    t.filter = Box::new(move |p| {
        if p.dir == Dir::AB && p.psn == PSN_A + lost {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 1000)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0x1000, 400)]));
    t.post_send(A, wr(3, WrOpcode::Send, vec![t.sge(A, 0x2000, 100)]));
    let (wa, wb) = t.settle();
    assert_eq!(wa.len(), 3, "the requester knows nothing of the loss");
    // Message 1 is lost; its receive WQE (1) takes message 2, WQE 2 takes message 3.
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, 400), (2, WcStatus::Success, 100)],
        "lost packet {lost}"
    );
    assert_eq!(t.bytes(B, 0x10000, 400), m2, "lost packet {lost}");
    assert_eq!(t.bytes(B, 0x20000, 100), m3);
    assert!(t.pkts(Dir::BA).is_empty());
    assert_eq!(t.state(B), QpState::Rts);
}

#[test]
fn uc_psn_gap_loses_the_message_and_reuses_the_receive() {
    // IBTA 9.8.2.2 (unverified): the rest of the message is dropped; the next FIRST/ONLY starts
    // over.
    for lost in 0..4 {
        uc_gap(lost);
    }
}

#[test]
fn uc_write_gap_drops_the_rest_of_the_write() {
    let mut t = uc();
    let (ra, rk) = t.raddr(B, 0x4000);
    t.fill(A, 0, &[7; 1000]);
    t.filter = Box::new(|p| {
        if p.psn == PSN_A + 1 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 1000)],
        ),
    );
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: ra + 2000,
                rkey: rk,
            },
            vec![t.sge(A, 0, 300)],
        ),
    );
    t.settle();
    assert_eq!(t.bytes(B, 0x4000, 256), vec![7; 256], "the FIRST landed");
    assert_eq!(
        t.bytes(B, 0x4000 + 256, 744),
        vec![0; 744],
        "MIDDLE lost, LAST dropped"
    );
    assert_eq!(
        t.bytes(B, 0x4000 + 2000, 300),
        vec![7; 300],
        "the next WRITE lands"
    );
}

#[test]
fn uc_no_receive_and_bad_rkey_drop_silently() {
    let mut t = uc();
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0x1234,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    t.post_recv(B, 5, 0, 64);
    t.post_send(A, wr(3, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, wb) = t.settle();
    assert_eq!(wa.len(), 3);
    // No RNR on UC (9.8.2.2, unverified): SEND 1 is dropped; the bad WRITE too; SEND 3 takes
    // receive 5.
    assert_eq!(st(&wb), vec![(5, WcStatus::Success)]);
    assert!(t.pkts(Dir::BA).is_empty());
    assert_eq!(t.state(B), QpState::Rts);
}

// ---- UD ------------------------------------------------------------------------------------

fn ud() -> Bed {
    BedCfg::new(QpType::Ud).build()
}

fn to_b(t: &Bed, qkey: u32) -> UdDest {
    UdDest {
        ah: AhAttr::to(IP_B, MAC_B),
        remote_qpn: t.b.qp,
        remote_qkey: QKey(qkey),
    }
}

#[test]
fn ud_send_with_imm_deth_grh_and_src_qp() {
    let mut t = ud();
    let data = pattern(300, 4);
    t.fill(A, 0, &data);
    t.fill(B, 0x1000, &[0xee; 400]);
    t.post_recv(B, 1, 0x1000, 40 + 300);
    let mut w = wr(
        1,
        WrOpcode::SendWithImm { imm: 0xfeed },
        vec![t.sge(A, 0, 300)],
    );
    w.ud = Some(to_b(&t, 0x1111_1111));
    t.post_send(A, w);
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::Success)]);
    assert_eq!(wb.len(), 1);
    let c = wb[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len, c.imm_data, c.src_qp, c.qp_num),
        (
            1,
            WcStatus::Success,
            WcOpcode::Recv,
            340,
            0xfeed,
            t.a.qp,
            t.b.qp
        )
    );
    assert_eq!(c.wc_flags, WcFlags(WcFlags::GRH.0 | WcFlags::WITH_IMM.0));
    let p: Vec<Pkt> = t.pkts(Dir::AB).into_iter().cloned().collect();
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].op, p[0].dqpn, p[0].imm),
        (O::UD_SEND_ONLY_WITH_IMMEDIATE, t.b.qp, Some(0xfeed))
    );
    let d = p[0].deth.unwrap();
    assert_eq!((d.qkey, d.src_qpn), (QKey(0x1111_1111), t.a.qp));
    // The GRH area (rdma-core's RoCEv2 convention): IPv4 → 20 zero bytes, then the IPv4 header
    // as received.
    let grh = t.bytes(B, 0x1000, 40);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(&grh[20..], &p[0].frame[14..34]);
    assert_eq!(grh[20], 0x45);
    assert_eq!(&grh[32..36], &[10, 0, 0, 1]);
    assert_eq!(&grh[36..40], &[10, 0, 0, 2]);
    assert_eq!(t.bytes(B, 0x1000 + 40, 300), data);
    assert_eq!(t.bytes(B, 0x1000 + 340, 1), [0xee]);
    assert!(t.pkts(Dir::BA).is_empty());
}

#[test]
fn ud_qkey_mismatch_is_dropped_and_controlled_qkey_uses_the_qps() {
    let mut t = ud();
    t.post_recv(B, 1, 0, 100);
    // A wrong Q_Key: dropped silently (IBTA 10.2.4, unverified), the receive stays posted.
    let mut w = wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]);
    w.ud = Some(to_b(&t, 0x2222_2222));
    t.post_send(A, w);
    let (wa, wb) = t.settle();
    assert!(wb.is_empty());
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::Success)],
        "UD completes when sent"
    );
    assert_eq!(t.pkts(Dir::AB)[0].deth.unwrap().qkey, QKey(0x2222_2222));
    assert_eq!(t.p.b.counters().rx_drop_bad_qkey, 1);
    assert_eq!(t.p.b.counters().rx_drop_total(), 1);
    // A controlled Q_Key in the WR (high bit set): the QP's own Q_Key goes on the wire
    // (IBTA 3.5.3 in 1.2.1, as pib cites it; C10-15 per issue 20, unverified).
    t.clear_log();
    let mut w = wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]);
    w.ud = Some(to_b(&t, 0x8000_0000));
    t.post_send(A, w);
    let (wa, wb) = t.settle();
    assert_eq!(t.pkts(Dir::AB)[0].deth.unwrap().qkey, QKey(0x1111_1111));
    assert_eq!(st(&wb), vec![(1, WcStatus::Success)]);
    assert_eq!(st(&wa), vec![(2, WcStatus::Success)]);
}

#[test]
fn ud_message_sizes_up_to_and_over_the_mtu() {
    // The port MTU is 4096 (9000-byte Ethernet). A UD message is one packet: up to 4096 bytes
    // it goes as one UD SEND ONLY; 4097 sends nothing and completes without error
    // (C10-93.1.1).
    let mut t = ud();
    t.post_recv(B, 1, 0, 40 + 4096);
    t.post_recv(B, 2, 0x10000, 40 + 4096);
    let mut wb = Vec::new();
    for (i, len) in [2000usize, 4096].into_iter().enumerate() {
        let data = pattern(len, i as u8);
        t.fill(A, 0, &data);
        let mut w = wr(i as u64, WrOpcode::Send, vec![t.sge(A, 0, len)]);
        w.ud = Some(to_b(&t, 0x1111_1111));
        t.post_send(A, w);
        wb.extend(t.settle().1);
        assert!(
            t.bytes(B, 0x10000 * i + 40, len) == data,
            "len {len}: payload not delivered"
        );
    }
    assert_eq!(
        t.pkts(Dir::AB)
            .iter()
            .map(|p| (p.op, p.payload.len()))
            .collect::<Vec<_>>(),
        vec![(O::UD_SEND_ONLY, 2000), (O::UD_SEND_ONLY, 4096)]
    );

    assert_eq!(
        wb.iter().map(|w| w.byte_len).collect::<Vec<_>>(),
        vec![2040, 4136]
    );
    t.clear_log();
    // Over the port MTU: no packet and no error (C10-93.1.1, as rxe_req.c quotes it); the
    // QP goes on sending.
    let mut w = wr(9, WrOpcode::Send, vec![t.sge(A, 0, 4097)]);
    w.ud = Some(to_b(&t, 0x1111_1111));
    t.post_send(A, w);
    let mut next = wr(10, WrOpcode::Send, vec![t.sge(A, 0, 8)]);
    next.ud = Some(to_b(&t, 0x1111_1111));
    t.post_send(A, next);
    let (wa, _) = t.settle();
    assert_eq!(
        st(&wa),
        vec![(9, WcStatus::Success), (10, WcStatus::Success)]
    );
    assert_eq!(
        t.pkts(Dir::AB)
            .iter()
            .map(|p| (p.op, p.payload.len()))
            .collect::<Vec<_>>(),
        vec![(O::UD_SEND_ONLY, 8)]
    );
    assert_eq!(t.state(A), QpState::Rts);
}

#[test]
fn ud_receive_too_small_and_no_receive() {
    let mut t = ud();
    // No receive: dropped silently.
    let mut w = wr(1, WrOpcode::Send, vec![t.sge(A, 0, 100)]);
    w.ud = Some(to_b(&t, 0x1111_1111));
    t.post_send(A, w.clone());
    let wb0 = t.settle().1;
    assert!(wb0.is_empty());
    // A receive without room for the GRH area and the payload: LOC_LEN_ERR on it.
    t.post_recv(B, 7, 0, 40 + 99);
    w.wr_id = 2;
    t.post_send(A, w);
    let wb1 = t.settle().1;
    assert_eq!(st(&wb1), vec![(7, WcStatus::LocLenErr)]);
    assert_eq!(t.state(B), QpState::Rts);
}

#[test]
fn ud_reply_to_src_qp_from_the_completion() {
    let mut t = ud();
    t.post_recv(B, 1, 0, 100);
    t.post_recv(A, 2, 0, 100);
    let mut w = wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]);
    w.ud = Some(to_b(&t, 0x1111_1111));
    t.post_send(A, w);

    let got = t.settle().1;
    assert_eq!(got.len(), 1);
    let mut back = wr(3, WrOpcode::Send, vec![t.sge(B, 0, 8)]);
    back.ud = Some(UdDest {
        ah: AhAttr::to(IP_A, MAC_A),
        remote_qpn: got[0].src_qp,
        remote_qkey: QKey(0x1111_1111),
    });
    t.post_send(B, back);
    let wa = t.settle().0;
    assert_eq!(st(&wa), vec![(2, WcStatus::Success)]);
    assert_eq!(wa[0].src_qp, t.b.qp);
}
