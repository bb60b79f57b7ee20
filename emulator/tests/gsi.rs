//! QP1, the general services interface (IBTA 13.5.1, unverified): where the IB CM's MADs arrive for
//! rdma_cm.
use rocemu_emulator::inproc::{Impairments, Pair, Side, IP_B, MAC_B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::{QKey, Qpn};

fn gsi(r: &mut Rnic) -> (Qpn, CqId, MrInfo) {
    let pd = r.alloc_pd();
    let cq = r.create_cq(16).unwrap();
    let mr = r.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Ud,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: true,
    };
    let q = r.create_gsi_qp(pd, init).unwrap();
    assert_eq!(q, Qpn::new(1));
    assert!(matches!(
        r.create_gsi_qp(pd, init),
        Err(VerbsError::NoSpace(_))
    ));
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey: QKey::GSI,
        port_num: 1,
        ..Default::default()
    };
    use QpAttrMask as M;
    r.modify_qp(q, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    a.qp_state = QpState::Rtr;
    r.modify_qp(q, &a, M::STATE).unwrap();
    a.qp_state = QpState::Rts;
    r.modify_qp(q, &a, M::STATE | M::SQ_PSN).unwrap();
    (q, cq, mr)
}

#[test]
fn a_mad_from_qp1_to_qp1() {
    let mut p = Pair::new(5, Impairments::none());
    let (qa, cqa, mra) = gsi(p.rnic(Side::A));
    let (qb, cqb, mrb) = gsi(p.rnic(Side::B));
    // Ordinary QPs are still numbered at random, never 1.
    let b = p.rnic(Side::B);
    b.post_recv(
        qb,
        RecvWr {
            wr_id: 7,
            sg_list: [Sge {
                addr: mrb.addr,
                length: 40 + 256,
                lkey: mrb.lkey,
            }]
            .into(),
        },
    )
    .unwrap();
    let a = p.rnic(Side::A);
    a.mr_bytes_mut(mra.lkey).unwrap()[..256].fill(0x07);
    let mut wr = SendWr::new(
        1,
        WrOpcode::Send,
        vec![Sge {
            addr: mra.addr,
            length: 256,
            lkey: mra.lkey,
        }],
    );
    wr.ud = Some(UdDest {
        ah: AhAttr::to(IP_B, MAC_B),
        remote_qpn: qb,
        // The high bit: the QP's own Q_Key goes out (the well-known GSI key).
        remote_qkey: QKey(0x8000_0000),
    });
    a.post_send(qa, wr).unwrap();
    p.drive(10_000).unwrap();
    let wa = p.rnic(Side::A).poll_cq(cqa, 4);
    assert_eq!(wa.len(), 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    let wb = p.rnic(Side::B).poll_cq(cqb, 4);
    assert_eq!(wb.len(), 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].src_qp, wb[0].byte_len),
        (7, WcStatus::Success, Qpn::new(1), 296)
    );
    assert_eq!(
        &p.rnic(Side::B).mr_bytes(mrb.lkey).unwrap()[40..296],
        &[0x07; 256][..]
    );
    // Destroyed, QP1 takes nothing more; created again, it is QP1 again.
    let b = p.rnic(Side::B);
    b.destroy_qp(qb).unwrap();
    assert!(b.query_qp(Qpn::new(1)).is_err());
    let (q2, _, _) = gsi(p.rnic(Side::B));
    assert_eq!(q2, Qpn::new(1));
}
