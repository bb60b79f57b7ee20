//! `rocemu demo`: two RoCEmu RNICs in one process, joined by an in-process cable. Runs every
//! verb the RNIC supports, then the same RC traffic over a lossy, reordering, duplicating cable
//! so that retransmission shows; checks every byte and every completion; prints a table.
use rocemu_emulator::connect::ConnectOpts;
use rocemu_emulator::inproc::{pattern, Cable, Impairments, Pair, IP_A, IP_B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_emulator::time::Nanos;
use rocemu_wire::{QKey, Qpn};

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub operation: String,
    pub messages: u64,
    pub bytes: u64,
    pub packets: u64,
    pub retransmissions: u64,
    pub ok: bool,
    pub detail: String,
    /// For a failed row, both RNICs' counters that point at the problem
    /// ([`crate::failure_counters`], counted since the demo started); empty otherwise.
    pub counters: String,
}

struct Side {
    qp: Qpn,
    cq: CqId,
    mr: MrInfo,
}

const MR_LEN: usize = 1 << 22;

fn make_side(r: &mut Rnic, t: QpType) -> Side {
    let pd = r.alloc_pd();
    let cq = r.create_cq(4096).expect("cq");
    let cap = QpCap {
        max_send_wr: 512,
        max_recv_wr: 512,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 128,
    };
    let qp = r
        .create_qp(
            pd,
            QpInitAttr {
                qp_type: t,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap,
                sq_sig_all: true,
            },
        )
        .expect("qp");
    let mr = r.reg_mr(pd, MR_LEN, Access::ALL).expect("mr");
    Side { qp, cq, mr }
}

struct Ctx {
    p: Pair,
}

impl Ctx {
    /// [`crate::failure_counters`] of both RNICs.
    fn failure_counters(&self) -> String {
        crate::failure_counters(&[("A", &self.p.a.counters()), ("B", &self.p.b.counters())])
    }

    fn drain(
        &mut self,
        cq_a: CqId,
        cq_b: CqId,
        want_a: usize,
        want_b: usize,
    ) -> Result<(Vec<Wc>, Vec<Wc>), String> {
        let (mut wa, mut wb) = (Vec::new(), Vec::new());
        self.p.drive_until(50_000_000, |p| {
            p.a.poll_cq_into(cq_a, 1 << 20, &mut wa);
            p.b.poll_cq_into(cq_b, 1 << 20, &mut wb);
            wa.len() >= want_a && wb.len() >= want_b
                || p.a.cq_overflowed(cq_a)
                || p.b.cq_overflowed(cq_b)
        })?;
        for (r, cq) in [(&self.p.a, cq_a), (&self.p.b, cq_b)] {
            if let Some(e) = r.cq_error(cq) {
                return Err(e.to_string());
            }
        }
        self.p.drive(1_000_000)?;
        self.p.a.poll_cq_into(cq_a, 1 << 20, &mut wa);
        self.p.b.poll_cq_into(cq_b, 1 << 20, &mut wb);
        Ok((wa, wb))
    }
}

fn check(cond: bool, what: impl Into<String>, errs: &mut Vec<String>) {
    if !cond {
        errs.push(what.into());
    }
}

/// The RC / UC operations of the demo on one connected pair. Returns rows.
fn run_connected(
    ctx: &mut Ctx,
    t: QpType,
    label: &str,
    ops: &[&str],
    count: usize,
    size: usize,
) -> Vec<Row> {
    let a = make_side(&mut ctx.p.a, t);
    let b = make_side(&mut ctx.p.b, t);
    let o = ConnectOpts {
        timeout: 10,
        ..ConnectOpts::default()
    };
    let mut rows = Vec::new();
    if let Err(e) = ctx.p.connect(a.qp, b.qp, &o) {
        rows.push(Row {
            operation: format!("{label} connect"),
            messages: 0,
            bytes: 0,
            packets: 0,
            retransmissions: 0,
            ok: false,
            detail: e.to_string(),
            counters: ctx.failure_counters(),
        });
        return rows;
    }
    for (k, op) in ops.iter().enumerate() {
        let n = if op.contains("ATOMIC") || op.contains("CMP") || op.contains("FETCH") {
            count.min(64)
        } else {
            count
        };
        let run = OpRun {
            k,
            op,
            n,
            size,
            stride: size.next_multiple_of(64).max(64),
        };
        rows.push(run_op(ctx, &a, &b, label, &run));
    }
    rows
}

/// One operation's run on a connected pair: `n` messages of `size` bytes, message `i` at
/// `i * stride` in both MRs.
struct OpRun<'a> {
    /// The operation's place in the list (its patterns differ from the others').
    k: usize,
    op: &'a str,
    n: usize,
    size: usize,
    stride: usize,
}

impl OpRun<'_> {
    /// Message `i`'s bytes.
    fn msg(&self, i: usize) -> Vec<u8> {
        pattern((self.k * 1000 + i) as u64, self.size)
    }
}

/// Runs one operation from A to B and checks it: fill, post, drain, check. Returns its row.
fn run_op(ctx: &mut Ctx, a: &Side, b: &Side, label: &str, run: &OpRun) -> Row {
    let mut errs = Vec::new();
    let frames0 = ctx.p.frames;
    let rt0 = ctx.p.a.counters().retransmitted_pkts + ctx.p.b.counters().retransmitted_pkts;
    fill_op(ctx, a, b, run);
    let (bytes, want_b) = post_op(ctx, a, b, run, &mut errs);
    match ctx.drain(a.cq, b.cq, run.n, want_b) {
        Err(e) => errs.push(e),
        Ok((wa, wb)) => {
            check_completions(run, &wa, &wb, want_b, &mut errs);
            check_bytes(ctx, a, b, run, &mut errs);
        }
    }
    if !errs.is_empty() && std::env::var("ROCEMU_DEMO_DEBUG").is_ok() {
        eprintln!(
            "A: {}\nB: {}\nA {:?}\nB {:?}",
            ctx.p.a.debug_qp(a.qp),
            ctx.p.b.debug_qp(b.qp),
            ctx.p.a.counters(),
            ctx.p.b.counters()
        );
    }
    let rt = ctx.p.a.counters().retransmitted_pkts + ctx.p.b.counters().retransmitted_pkts - rt0;
    Row {
        operation: format!("{label} {}", run.op),
        messages: run.n as u64,
        bytes,
        packets: ctx.p.frames - frames0,
        retransmissions: rt,
        ok: errs.is_empty(),
        counters: if errs.is_empty() {
            String::new()
        } else {
            ctx.failure_counters()
        },
        detail: errs.into_iter().take(3).collect::<Vec<_>>().join("; "),
    }
}

/// Fills A's source area and B's target/source areas with fresh patterns.
fn fill_op(ctx: &mut Ctx, a: &Side, b: &Side, run: &OpRun) {
    let size = run.size;
    for i in 0..run.n {
        let data = run.msg(i);
        let off = i * run.stride;
        ctx.p.a.mr_bytes_mut(a.mr.lkey).unwrap()[off..off + size].copy_from_slice(&data);
        if run.op == "RDMA_READ" {
            ctx.p.b.mr_bytes_mut(b.mr.lkey).unwrap()[off..off + size].copy_from_slice(&data);
            ctx.p.a.mr_bytes_mut(a.mr.lkey).unwrap()[off..off + size].fill(0);
        }
    }
    if run.op == "FETCH_ADD" || run.op == "CMP_SWAP" {
        ctx.p.b.mr_bytes_mut(b.mr.lkey).unwrap()[0..8].copy_from_slice(&0u64.to_le_bytes());
    }
}

/// Posts the run's `n` work requests on A (and, for what consumes a receive, B's receives).
/// Returns the bytes posted and the receive completions B is to see.
fn post_op(ctx: &mut Ctx, a: &Side, b: &Side, run: &OpRun, errs: &mut Vec<String>) -> (u64, usize) {
    let (size, stride) = (run.size, run.stride);
    let mut bytes = 0u64;
    let mut want_b = 0;
    for i in 0..run.n {
        let off = i * stride;
        let sge = Sge {
            addr: a.mr.addr + off as u64,
            length: size as u32,
            lkey: a.mr.lkey,
        };
        let remote = b.mr.addr + off as u64;
        let opcode = match run.op {
            "SEND" => WrOpcode::Send,
            "SEND_WITH_IMM" => WrOpcode::SendWithImm {
                imm: 0x1000 + i as u32,
            },
            "RDMA_WRITE" => WrOpcode::RdmaWrite {
                remote_addr: remote,
                rkey: b.mr.rkey,
            },
            "RDMA_WRITE_WITH_IMM" => WrOpcode::RdmaWriteWithImm {
                remote_addr: remote,
                rkey: b.mr.rkey,
                imm: 0x2000 + i as u32,
            },
            "RDMA_READ" => WrOpcode::RdmaRead {
                remote_addr: remote,
                rkey: b.mr.rkey,
            },
            "FETCH_ADD" => WrOpcode::AtomicFetchAdd {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
                add: i as u64 + 1,
            },
            _ => WrOpcode::AtomicCmpSwap {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
                compare: i as u64,
                swap: i as u64 + 1,
            },
        };
        let sg = if opcode.is_atomic() {
            Sge { length: 8, ..sge }
        } else {
            sge
        };
        if matches!(run.op, "SEND" | "SEND_WITH_IMM" | "RDMA_WRITE_WITH_IMM") {
            let r = Sge {
                addr: b.mr.addr + off as u64,
                length: stride as u32,
                lkey: b.mr.lkey,
            };
            if let Err(e) = ctx.p.b.post_recv(
                b.qp,
                RecvWr {
                    wr_id: i as u64,
                    sg_list: [r].into(),
                },
            ) {
                errs.push(format!("post_recv: {e}"));
            }
            want_b += 1;
        }
        if let Err(e) = ctx
            .p
            .a
            .post_send(a.qp, SendWr::new(i as u64, opcode, vec![sg]))
        {
            errs.push(format!("post_send: {e}"));
        }
        bytes += if opcode.is_atomic() { 8 } else { size as u64 };
    }
    (bytes, want_b)
}

/// Every completion on both sides: the count, the status, the order and, with an immediate,
/// its value.
fn check_completions(run: &OpRun, wa: &[Wc], wb: &[Wc], want_b: usize, errs: &mut Vec<String>) {
    let n = run.n;
    check(
        wa.len() == n,
        format!("{} send completions, want {n}", wa.len()),
        errs,
    );
    for (i, w) in wa.iter().enumerate() {
        check(
            w.status == WcStatus::Success && w.wr_id == i as u64,
            format!("send completion {i}: {:?} {}", w.status, w.wr_id),
            errs,
        );
    }
    check(
        wb.len() == want_b,
        format!("{} receive completions, want {want_b}", wb.len()),
        errs,
    );
    for (i, w) in wb.iter().enumerate() {
        let ok = w.status == WcStatus::Success && w.wr_id == i as u64;
        let imm_ok = match run.op {
            "SEND_WITH_IMM" => {
                w.imm_data == 0x1000 + i as u32 && w.wc_flags.contains(WcFlags::WITH_IMM)
            }
            "RDMA_WRITE_WITH_IMM" => {
                w.imm_data == 0x2000 + i as u32 && w.opcode == WcOpcode::RecvRdmaWithImm
            }
            _ => true,
        };
        check(ok && imm_ok, format!("receive completion {i}: {w:?}"), errs);
    }
}

/// The bytes where the operation left them: B's region after a SEND or WRITE, A's after a
/// READ, B's counter and A's fetched values after the atomics.
fn check_bytes(ctx: &Ctx, a: &Side, b: &Side, run: &OpRun, errs: &mut Vec<String>) {
    let (n, size, stride) = (run.n, run.size, run.stride);
    let bm = ctx.p.b.mr_bytes(b.mr.lkey).unwrap().to_vec();
    let am = ctx.p.a.mr_bytes(a.mr.lkey).unwrap().to_vec();
    match run.op {
        "SEND" | "SEND_WITH_IMM" | "RDMA_WRITE" | "RDMA_WRITE_WITH_IMM" => {
            for i in 0..n {
                let off = i * stride;
                check(
                    bm[off..off + size] == run.msg(i)[..],
                    format!("message {i} bytes differ"),
                    errs,
                );
            }
        }
        "RDMA_READ" => {
            for i in 0..n {
                let off = i * stride;
                check(
                    am[off..off + size] == run.msg(i)[..],
                    format!("read {i} bytes differ"),
                    errs,
                );
            }
        }
        "FETCH_ADD" => {
            let sum: u64 = (1..=n as u64).sum();
            let v = u64::from_le_bytes(bm[0..8].try_into().unwrap());
            check(
                v == sum,
                format!("counter {v}, want {sum}: an add lost or applied twice"),
                errs,
            );
            for i in 0..n {
                let got = u64::from_le_bytes(am[i * stride..i * stride + 8].try_into().unwrap());
                let want: u64 = (1..=i as u64).sum();
                check(
                    got == want,
                    format!("fetch {i} returned {got}, want {want}"),
                    errs,
                );
            }
        }
        _ => {
            let v = u64::from_le_bytes(bm[0..8].try_into().unwrap());
            check(
                v == n as u64,
                format!("cmp-swap chain ended at {v}, want {n}"),
                errs,
            );
        }
    }
}

fn run_ud(ctx: &mut Ctx, count: usize, size: usize) -> Row {
    let a = make_side(&mut ctx.p.a, QpType::Ud);
    let b = make_side(&mut ctx.p.b, QpType::Ud);
    let o = ConnectOpts::default();
    let mut errs = Vec::new();
    let frames0 = ctx.p.frames;
    for (r, q, ip) in [(&mut ctx.p.a, a.qp, IP_B), (&mut ctx.p.b, b.qp, IP_A)] {
        if let Err(e) =
            rocemu_emulator::connect::bring_up(r, q, Qpn::new(0), ip, o.psn_a, o.psn_b, &o)
        {
            errs.push(e.to_string());
        }
    }
    let stride = (size + 40).next_multiple_of(64);
    for i in 0..count {
        let data = pattern(90_000 + i as u64, size);
        ctx.p.a.mr_bytes_mut(a.mr.lkey).unwrap()[i * stride..i * stride + size]
            .copy_from_slice(&data);
        let r = Sge {
            addr: b.mr.addr + (i * stride) as u64,
            length: stride as u32,
            lkey: b.mr.lkey,
        };
        let _ = ctx.p.b.post_recv(
            b.qp,
            RecvWr {
                wr_id: i as u64,
                sg_list: [r].into(),
            },
        );
        let mut w = SendWr::new(
            i as u64,
            WrOpcode::Send,
            vec![Sge {
                addr: a.mr.addr + (i * stride) as u64,
                length: size as u32,
                lkey: a.mr.lkey,
            }],
        );
        w.ud = Some(UdDest {
            ah: AhAttr::to(IP_B, rocemu_emulator::inproc::MAC_B),
            remote_qpn: b.qp,
            remote_qkey: QKey(o.qkey.0),
        });
        if let Err(e) = ctx.p.a.post_send(a.qp, w) {
            errs.push(e.to_string());
        }
    }
    match ctx.drain(a.cq, b.cq, count, count) {
        Err(e) => errs.push(e),
        Ok((wa, wb)) => {
            check(
                wa.iter().all(|w| w.status == WcStatus::Success) && wa.len() == count,
                "UD send completions",
                &mut errs,
            );
            check(
                wb.len() == count,
                format!("{} UD receives, want {count}", wb.len()),
                &mut errs,
            );
            let bm = ctx.p.b.mr_bytes(b.mr.lkey).unwrap().to_vec();
            for (i, w) in wb.iter().enumerate() {
                let ok = w.status == WcStatus::Success
                    && w.byte_len as usize == size + 40
                    && w.src_qp == a.qp
                    && w.wc_flags.contains(WcFlags::GRH);
                check(ok, format!("UD receive {i}: {w:?}"), &mut errs);
                let off = w.wr_id as usize * stride;
                check(
                    bm[off + 40..off + 40 + size] == pattern(90_000 + w.wr_id, size)[..],
                    format!("UD datagram {i} bytes"),
                    &mut errs,
                );
            }
        }
    }
    Row {
        operation: "UD SEND".into(),
        messages: count as u64,
        bytes: (count * size) as u64,
        packets: ctx.p.frames - frames0,
        retransmissions: 0,
        ok: errs.is_empty(),
        counters: if errs.is_empty() {
            String::new()
        } else {
            ctx.failure_counters()
        },
        detail: errs.into_iter().take(3).collect::<Vec<_>>().join("; "),
    }
}

/// Runs the whole demo. `pcap`: write every frame put on the wire.
pub fn run(seed: u64, pcap: Option<&std::path::Path>) -> Result<Vec<Row>, String> {
    run_counted(seed, pcap).map(|r| r.rows)
}

/// What a run of the demo did: its table, and both RNICs' counters at its end (A requests,
/// B responds).
#[derive(Debug, Clone)]
pub struct Outcome {
    pub rows: Vec<Row>,
    pub a: Counters,
    pub b: Counters,
}

/// [`run`], also returning both RNICs' counters (to hold a capture's analysis against them).
pub fn run_counted(seed: u64, pcap: Option<&std::path::Path>) -> Result<Outcome, String> {
    let mut ctx = Ctx {
        p: Pair::new(seed, Impairments::none()),
    };
    if let Some(path) = pcap {
        ctx.p.capture =
            Some(rocemu_wire::capture::CaptureWriter::create(path).map_err(|e| e.to_string())?);
    }
    let mut rows = Vec::new();
    let rc_ops = [
        "SEND",
        "SEND_WITH_IMM",
        "RDMA_WRITE",
        "RDMA_WRITE_WITH_IMM",
        "RDMA_READ",
        "CMP_SWAP",
        "FETCH_ADD",
    ];
    rows.extend(run_connected(
        &mut ctx,
        QpType::Rc,
        "RC",
        &rc_ops,
        200,
        3000,
    ));
    rows.extend(run_connected(
        &mut ctx,
        QpType::Uc,
        "UC",
        &["SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM"],
        200,
        3000,
    ));
    rows.push(run_ud(&mut ctx, 200, 512));
    // The same RC traffic over a cable that loses, reorders and duplicates 5 % of frames.
    let imp = Impairments {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.05,
        corrupt: 0.0,
        delay: Nanos::from_micros(2),
        reorder_delay: Nanos::from_micros(6),
    };
    ctx.p.cable = Cable::new(imp, seed ^ 0x10557);
    let lossy = run_connected(&mut ctx, QpType::Rc, "RC lossy", &rc_ops, 200, 3000);
    rows.extend(lossy);
    if let Some(c) = ctx.p.capture.take() {
        let mut w = c.into_inner();
        std::io::Write::flush(&mut w).map_err(|e| e.to_string())?;
    }
    Ok(Outcome {
        rows,
        a: ctx.p.a.counters(),
        b: ctx.p.b.counters(),
    })
}

/// The table, one line per row.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<28} {:>9} {:>11} {:>9} {:>16}  {}\n",
        "operation", "messages", "bytes", "packets", "retransmissions", "result"
    );
    for r in rows {
        s += &format!(
            "{:<28} {:>9} {:>11} {:>9} {:>16}  {}\n",
            r.operation,
            r.messages,
            r.bytes,
            r.packets,
            r.retransmissions,
            if r.ok {
                "ok".to_string()
            } else {
                format!("FAILED: {}", r.detail)
            }
        );
    }
    s
}
