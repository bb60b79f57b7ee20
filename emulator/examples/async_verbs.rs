//! The verbs API from an application's side: two devices on an in-process cable, an RC
//! connection set up with synchronous verbs, then a SEND, an RDMA WRITE with immediate and a
//! FETCH_ADD whose completions are awaited on tokio.
//!
//! `cargo run --release -p rocemu-emulator --example async_verbs`
use rocemu_emulator::api::Device;
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::{Loopback, IP_A, IP_B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::Qpn;

struct End {
    qp: Qpn,
    cq: CqId,
    mr: MrInfo,
}

fn open(dev: &Device) -> Result<End, VerbsError> {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64)?;
    let qp = dev.create_qp(pd, QpInitAttr::new(QpType::Rc, cq))?;
    let mr = dev.reg_mr(pd, 1 << 16, Access::ALL)?;
    Ok(End { qp, cq, mr })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lo = Loopback::start(7, Default::default());
    let (a, b) = (open(&lo.a)?, open(&lo.b)?);
    // The out-of-band exchange (QPN, PSN, GID) is implicit here: both ends are in this process.
    let o = ConnectOpts::default();
    lo.a.with(|r| bring_up(r, a.qp, b.qp, IP_B, o.psn_a, o.psn_b, &o))?;
    lo.b.with(|r| bring_up(r, b.qp, a.qp, IP_A, o.psn_b, o.psn_a, &o))?;

    // SEND: B posts a receive, A sends "hello, RoCE".
    let msg = b"hello, RoCE";
    lo.a.write_mr(a.mr.lkey, 0, msg)?;
    lo.b.post_recv(
        b.qp,
        RecvWr {
            wr_id: 100,
            sg_list: [Sge {
                addr: b.mr.addr,
                length: 4096,
                lkey: b.mr.lkey,
            }]
            .into(),
        },
    )?;
    let sge = Sge {
        addr: a.mr.addr,
        length: msg.len() as u32,
        lkey: a.mr.lkey,
    };
    lo.a.post_send(a.qp, SendWr::new(1, WrOpcode::Send, vec![sge]))?;
    let (sent, got) = tokio::join!(lo.a.next_wc(a.cq), lo.b.next_wc(b.cq));
    let (sent, got) = (sent?, got?);
    let mut text = vec![0u8; got.byte_len as usize];
    lo.b.read_mr(b.mr.lkey, 0, &mut text)?;
    println!(
        "SEND: sender {:?}, receiver {:?} {} bytes: {:?}",
        sent.status,
        got.status,
        got.byte_len,
        String::from_utf8_lossy(&text)
    );
    assert_eq!(text, msg);

    // RDMA WRITE with immediate into B's region at 8192.
    lo.b.post_recv(
        b.qp,
        RecvWr {
            wr_id: 101,
            sg_list: Default::default(),
        },
    )?;
    let w = WrOpcode::RdmaWriteWithImm {
        remote_addr: b.mr.addr + 8192,
        rkey: b.mr.rkey,
        imm: 0xc0ffee,
    };
    lo.a.post_send(a.qp, SendWr::new(2, w, vec![sge]))?;
    let (sent, got) = tokio::join!(lo.a.next_wc(a.cq), lo.b.next_wc(b.cq));
    let (sent, got) = (sent?, got?);
    let mut back = vec![0u8; msg.len()];
    lo.b.read_mr(b.mr.lkey, 8192, &mut back)?;
    println!(
        "WRITE_WITH_IMM: sender {:?}, receiver {:?} imm 0x{:x}",
        sent.status, got.opcode, got.imm_data
    );
    assert_eq!((back.as_slice(), got.imm_data), (&msg[..], 0xc0ffee));

    // FETCH_ADD ten times on B's counter at 16384, awaiting all ten completions.
    for i in 0..10 {
        let local = Sge {
            addr: a.mr.addr + 1024 + 8 * i,
            length: 8,
            lkey: a.mr.lkey,
        };
        let op = WrOpcode::AtomicFetchAdd {
            remote_addr: b.mr.addr + 16384,
            rkey: b.mr.rkey,
            add: 5,
        };
        lo.a.post_send(a.qp, SendWr::new(10 + i, op, vec![local]))?;
    }
    let wcs = lo.a.wait_wcs(a.cq, 10).await?;
    let mut counter = [0u8; 8];
    lo.b.read_mr(b.mr.lkey, 16384, &mut counter)?;
    let value = u64::from_le_bytes(counter);
    println!(
        "FETCH_ADD x10: {} completions, all {:?}; counter = {value}",
        wcs.len(),
        wcs.iter().all(|w| w.status == WcStatus::Success)
    );
    assert_eq!(value, 50);
    println!("async_verbs: ok");
    Ok(())
}
