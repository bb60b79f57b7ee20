//! Property: random workloads (mixed opcodes, sizes 0 … 1 MiB, every MTU, several QPs) over a
//! wire that loses, reorders, duplicates and corrupts frames. Every message is delivered once,
//! in order, byte for byte; every atomic is applied exactly once — or the QP ends in ERR with
//! successes, then one error, then flushes. Replay a failure with PROPTEST seeds printed on
//! failure.
use proptest::prelude::*;
use rocemu_emulator::connect::ConnectOpts;
use rocemu_emulator::inproc::{pattern, Impairments, Pair};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_emulator::time::Nanos;
use rocemu_wire::Qpn;

#[derive(Debug, Clone)]
enum Op {
    Send(usize),
    Write(usize),
    Read(usize),
    FetchAdd(u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 0usize..5000,
        2 => 5000usize..70_000,
        1 => 70_000usize..(1 << 20),
    ];
    prop_oneof![
        3 => size.clone().prop_map(Op::Send),
        3 => size.clone().prop_map(Op::Write),
        2 => size.prop_map(Op::Read),
        2 => (1u64..1000).prop_map(Op::FetchAdd),
    ]
}

struct Q {
    qa: Qpn,
    qb: Qpn,
    cqa: CqId,
    cqb: CqId,
    mra: MrInfo,
    mrb: MrInfo,
}

/// One message: its id, operation, bytes and where they live.
type Planned = (u64, Op, Vec<u8>, Place);

/// Where one message's bytes live: its own buffers on both sides, so every message can be
/// checked byte for byte after the run.
#[derive(Debug, Clone, Copy)]
struct Place {
    a: usize,
    b: usize,
}

/// Per QP, what was posted and what must come back.
struct Expect {
    /// The sum of every FETCH_ADD: the counter's final value at B.
    sums: Vec<u64>,
    /// Every SEND as (id, length): the receives B must complete, in order.
    sends: Vec<Vec<(u64, u32)>>,
}

/// Per QP, the completions polled at A (`done`) and at B (`recv`).
struct Completions {
    done: Vec<Vec<Wc>>,
    recv: Vec<Vec<Wc>>,
}

fn run(
    seed: u64,
    mtu: Mtu,
    imp: Impairments,
    nqps: usize,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    if std::env::var("LOSSY_TRACE").is_ok() {
        eprintln!("RUN seed={seed} mtu={mtu:?} imp={imp:?} nqps={nqps} ops={ops:?}");
    }
    let mut p = Pair::new(seed, imp);
    if let Ok(path) = std::env::var("ROCEMU_TEST_PCAP") {
        p.capture = Some(rocemu_wire::capture::CaptureWriter::create(path).unwrap());
    }
    let opts = ConnectOpts {
        mtu,
        timeout: 8,
        retry_cnt: 7,
        rnr_retry: 7,
        ..Default::default()
    };
    let (plan, cursor) = plan_ops(seed, nqps, ops);
    let qs = set_up_qps(&mut p, &cursor, &opts);
    let expect = post_all(&mut p, &qs, &plan);
    let got = drive_to_completion(&mut p, &qs, &plan)?;
    for (qi, q) in qs.iter().enumerate() {
        check_qp(&p, q, qi, &plan, &got, &expect)?;
    }
    let _ = Nanos::ZERO;
    Ok(())
}

/// Deals the ops round robin to the QPs and gives each message its own buffers; returns the
/// plan per QP and each QP's buffer sizes (A, B) so far.
fn plan_ops(seed: u64, nqps: usize, ops: Vec<Op>) -> (Vec<Vec<Planned>>, Vec<(usize, usize)>) {
    let mut plan: Vec<Vec<Planned>> = vec![Vec::new(); nqps];
    let mut cursor = vec![(16usize, 16usize); nqps];
    for (i, op) in ops.into_iter().enumerate() {
        let q = i % nqps;
        let n = match &op {
            Op::Send(n) | Op::Write(n) | Op::Read(n) => *n,
            Op::FetchAdd(_) => 8,
        };
        let data = pattern(seed ^ i as u64, n);
        let place = Place {
            a: cursor[q].0,
            b: cursor[q].1,
        };
        cursor[q].0 += n + 8;
        cursor[q].1 += n + 8;
        plan[q].push((i as u64, op, data, place));
    }
    (plan, cursor)
}

/// One connected RC QP pair per cursor, with CQs and memory regions big enough for its plan.
fn set_up_qps(p: &mut Pair, cursor: &[(usize, usize)], opts: &ConnectOpts) -> Vec<Q> {
    let mut qs = Vec::new();
    for (qi, c) in cursor.iter().enumerate() {
        let _ = qi;
        let pda = p.a.alloc_pd();
        let pdb = p.b.alloc_pd();
        let cqa = p.a.create_cq(8192).unwrap();
        let cqb = p.b.create_cq(8192).unwrap();
        let cap = QpCap {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = |cq| QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: true,
        };
        let qa = p.a.create_qp(pda, init(cqa)).unwrap();
        let qb = p.b.create_qp(pdb, init(cqb)).unwrap();
        let mra = p.a.reg_mr(pda, c.0 + 64, Access::ALL).unwrap();
        let mrb = p.b.reg_mr(pdb, c.1 + 64, Access::ALL).unwrap();
        p.connect(qa, qb, opts).unwrap();
        qs.push(Q {
            qa,
            qb,
            cqa,
            cqb,
            mra,
            mrb,
        });
    }
    qs
}

/// Fills the source buffers, posts B's receives and A's sends, and notes what must come back.
fn post_all(p: &mut Pair, qs: &[Q], plan: &[Vec<Planned>]) -> Expect {
    let nqps = qs.len();
    let mut sums = vec![0u64; nqps];
    let mut sends = vec![Vec::new(); nqps];
    for (qi, q) in qs.iter().enumerate() {
        for (id, op, data, pl) in plan[qi].iter() {
            let sa = |len: usize| Sge {
                addr: q.mra.addr + pl.a as u64,
                length: len as u32,
                lkey: q.mra.lkey,
            };
            let rb = q.mrb.addr + pl.b as u64;
            let w = match op {
                Op::Send(n) => {
                    p.a.mr_bytes_mut(q.mra.lkey).unwrap()[pl.a..pl.a + n].copy_from_slice(data);
                    let rsge = Sge {
                        addr: rb,
                        length: *n as u32,
                        lkey: q.mrb.lkey,
                    };
                    p.b.post_recv(
                        q.qb,
                        RecvWr {
                            wr_id: *id,
                            sg_list: [rsge].into(),
                        },
                    )
                    .unwrap();
                    sends[qi].push((*id, *n as u32));
                    SendWr::new(*id, WrOpcode::Send, vec![sa(*n)])
                }
                Op::Write(n) => {
                    p.a.mr_bytes_mut(q.mra.lkey).unwrap()[pl.a..pl.a + n].copy_from_slice(data);
                    SendWr::new(
                        *id,
                        WrOpcode::RdmaWrite {
                            remote_addr: rb,
                            rkey: q.mrb.rkey,
                        },
                        vec![sa(*n)],
                    )
                }
                Op::Read(n) => {
                    p.b.mr_bytes_mut(q.mrb.lkey).unwrap()[pl.b..pl.b + n].copy_from_slice(data);
                    SendWr::new(
                        *id,
                        WrOpcode::RdmaRead {
                            remote_addr: rb,
                            rkey: q.mrb.rkey,
                        },
                        vec![sa(*n)],
                    )
                }
                Op::FetchAdd(v) => {
                    sums[qi] += v;
                    // Every add goes to the QP's one counter, at B's offset 8.
                    SendWr::new(
                        *id,
                        WrOpcode::AtomicFetchAdd {
                            remote_addr: q.mrb.addr + 8,
                            rkey: q.mrb.rkey,
                            add: *v,
                        },
                        vec![sa(8)],
                    )
                }
            };
            p.a.post_send(q.qa, w).unwrap();
        }
    }
    Expect { sums, sends }
}

/// Runs the wire until every send has completed at A, then a while longer so the last
/// acknowledgements settle.
fn drive_to_completion(
    p: &mut Pair,
    qs: &[Q],
    plan: &[Vec<Planned>],
) -> Result<Completions, TestCaseError> {
    let nqps = qs.len();
    let mut done = vec![Vec::new(); nqps];
    let mut recv = vec![Vec::new(); nqps];
    let total: usize = plan.iter().map(|v| v.len()).sum();
    let r = p.drive_until(2_000_000, |p| {
        for (qi, q) in qs.iter().enumerate() {
            p.a.poll_cq_into(q.cqa, 1 << 20, &mut done[qi]);
            p.b.poll_cq_into(q.cqb, 1 << 20, &mut recv[qi]);
        }
        done.iter().map(|d| d.len()).sum::<usize>() >= total
    });
    prop_assert!(
        r.is_ok(),
        "{:?} counters A {:?} B {:?} qps A {:?} B {:?}",
        r,
        p.a.counters(),
        p.b.counters(),
        qs.iter().map(|q| p.a.debug_qp(q.qa)).collect::<Vec<_>>(),
        qs.iter().map(|q| p.b.debug_qp(q.qb)).collect::<Vec<_>>()
    );
    p.drive(1_000_000).map_err(TestCaseError::fail)?;
    Ok(Completions { done, recv })
}

/// One QP's outcome: completions in plan order, and either the defined error state or every
/// message delivered once, byte for byte, and every atomic applied once.
fn check_qp(
    p: &Pair,
    q: &Q,
    qi: usize,
    plan: &[Vec<Planned>],
    got: &Completions,
    expect: &Expect,
) -> Result<(), TestCaseError> {
    // The same names as the assertions' text (`prop_assert!` prints it) had in one function.
    let (d, recv) = (&got.done[qi], &got.recv);
    let (sums, sends) = (&expect.sums, &expect.sends);
    let ids: Vec<u64> = d.iter().map(|w| w.wr_id).collect();
    let want: &Vec<u64> = &plan[qi].iter().map(|x| x.0).collect();
    prop_assert_eq!(&ids, want, "completions in order");
    let first_err = d.iter().position(|w| w.status != WcStatus::Success);
    if let Some(e) = first_err {
        // The defined error state: one transport error, then flushes, QP in ERR.
        prop_assert!(
            matches!(d[e].status, WcStatus::RetryExcErr),
            "unexpected error {:?} (counters A {:?})",
            d[e],
            p.a.counters()
        );
        prop_assert!(d[e + 1..].iter().all(|w| w.status == WcStatus::WrFlushErr));
        prop_assert_eq!(p.a.qp_state(q.qa).unwrap(), QpState::Err);
        return Ok(());
    }
    // Receives: exactly the sends, in order, once each.
    let got: Vec<(u64, u32)> = recv[qi].iter().map(|w| (w.wr_id, w.byte_len)).collect();
    prop_assert_eq!(&got, &sends[qi], "every send delivered once, in order");
    prop_assert!(recv[qi].iter().all(|w| w.status == WcStatus::Success));
    let ma = p.a.mr_bytes(q.mra.lkey).unwrap();
    let mb = p.b.mr_bytes(q.mrb.lkey).unwrap();
    let v = u64::from_le_bytes(mb[8..16].try_into().unwrap());
    prop_assert_eq!(v, sums[qi], "sum of every add, nothing twice, nothing lost");
    let mut acc = 0u64;
    for (id, op, data, pl) in plan[qi].iter() {
        match op {
            Op::Send(n) | Op::Write(n) => {
                prop_assert!(mb[pl.b..pl.b + n] == data[..], "message {} bytes at B", id)
            }
            Op::Read(n) => {
                prop_assert!(ma[pl.a..pl.a + n] == data[..], "read {} bytes at A", id)
            }
            Op::FetchAdd(add) => {
                // The fetched values are the running sums before each add, in order.
                let got = u64::from_le_bytes(ma[pl.a..pl.a + 8].try_into().unwrap());
                prop_assert_eq!(got, acc);
                acc += add;
            }
        }
    }
    Ok(())
}

fn arb_mtu() -> impl Strategy<Value = Mtu> {
    prop_oneof![
        Just(Mtu::M256),
        Just(Mtu::M512),
        Just(Mtu::M1024),
        Just(Mtu::M2048),
        Just(Mtu::M4096)
    ]
}

fn arb_imp() -> impl Strategy<Value = Impairments> {
    (0.0..0.05f64, 0.0..0.05f64, 0.0..0.05f64, 0.0..0.02f64).prop_map(
        |(loss, reorder, duplicate, corrupt)| Impairments {
            loss,
            reorder,
            duplicate,
            corrupt,
            delay: Nanos::from_micros(2),
            reorder_delay: Nanos::from_micros(5),
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("LOSSY_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24), ..ProptestConfig::default() })]

    #[test]
    fn rc_delivers_exactly_once_in_order_over_impairments(
        seed in any::<u64>(),
        mtu in arb_mtu(),
        imp in arb_imp(),
        nqps in 1usize..4,
        ops in proptest::collection::vec(arb_op(), 1..24),
    ) {
        run(seed, mtu, imp, nqps, ops)?;
    }
}

#[test]
fn one_mib_messages_over_five_percent_everything() {
    let imp = Impairments {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.05,
        corrupt: 0.01,
        delay: Nanos::from_micros(2),
        reorder_delay: Nanos::from_micros(5),
    };
    run(
        42,
        Mtu::M4096,
        imp,
        2,
        vec![
            Op::Write(1 << 20),
            Op::Read(1 << 20),
            Op::Send(1 << 20),
            Op::FetchAdd(3),
            Op::FetchAdd(4),
        ],
    )
    .unwrap();
}

#[test]
fn small_debug_case() {
    let imp = Impairments {
        loss: 0.05,
        delay: Nanos::from_micros(2),
        ..Default::default()
    };
    if std::env::var("LOSSY_MIN").is_ok() {
        let imp = Impairments {
            corrupt: 0.008361261115621013,
            delay: Nanos::from_micros(2),
            reorder_delay: Nanos::from_micros(5),
            ..Default::default()
        };
        run(
            0,
            Mtu::M256,
            imp,
            1,
            vec![Op::Write(212737), Op::Send(12033)],
        )
        .unwrap();
    }
    for (i, ops) in [
        vec![Op::Read(20_000)],
        vec![Op::Write(20_000)],
        vec![Op::Send(20_000)],
        vec![Op::FetchAdd(3), Op::FetchAdd(5)],
        vec![Op::Read(300_000)],
    ]
    .into_iter()
    .enumerate()
    {
        eprintln!("case {i}");
        run(1, Mtu::M1024, imp, 1, ops).unwrap();
    }
}

/// 200 back-to-back 3000-byte READs, 16 outstanding, over 5 % loss, reordering and duplication
/// (the demo's lossy READ row).
#[test]
fn many_reads_over_loss_reorder_duplication() {
    let imp = Impairments {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.05,
        corrupt: 0.0,
        delay: Nanos::from_micros(2),
        reorder_delay: Nanos::from_micros(6),
    };
    for seed in 0..20 {
        run(
            seed,
            Mtu::M1024,
            imp,
            1,
            (0..200).map(|_| Op::Read(3000)).collect(),
        )
        .unwrap();
        run(
            seed,
            Mtu::M1024,
            imp,
            1,
            (0..64).map(|i| Op::FetchAdd(i + 1)).collect(),
        )
        .unwrap();
        let mut mixed: Vec<Op> = (0..200).map(|_| Op::Send(3000)).collect();
        mixed.extend((0..200).map(|_| Op::Write(3000)));
        mixed.extend((0..200).map(|_| Op::Read(3000)));
        mixed.extend((0..64).map(|i| Op::FetchAdd(i + 1)));
        run(seed, Mtu::M1024, imp, 1, mixed).unwrap();
    }
}
