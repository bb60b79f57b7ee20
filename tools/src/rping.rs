//! `rocemu rping`: librdmacm's `rping` on RoCEmu — connection through the IB CM over QP1
//! ([`rocemu_emulator::cm`]), then rping's own exchange on the connected RC QP, so that either end
//! works against the real `rping`.
//!
//! rping's data path, per iteration (librdmacm/examples/rping.c, and the captures in
//! `wire/tests/data/cm/`): the client SENDs a 16-byte `{be64 buf, be32 rkey, be32 size}` naming
//! its source buffer; the server RDMA READs it, SENDs a 16-byte "go ahead"; the client SENDs the
//! same for its sink buffer; the server RDMA WRITEs what it read into it and SENDs "done". The
//! client then checks (with `-V`) that its sink holds what its source held. The client ends the
//! connection with a DREQ.
use crate::rdmacm::{Cm, GsiCounters, RcSide};
use crate::remote::Endpoint;
use rocemu_emulator::cm::CmCounters;
use rocemu_emulator::cm::CmEvent;
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::Qpn;
use std::net::IpAddr;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = crate::rdmacm::CM_TIMEOUT;

/// rping's options.
#[derive(Debug, Clone)]
pub struct RpingOpts {
    /// Client: the server's address; server: None.
    pub server: Option<IpAddr>,
    pub port: u16,
    /// Iterations (`-C`).
    pub count: u64,
    /// Buffer size (`-S`, at least 16 as rping wants).
    pub size: usize,
    /// `-v`: print each iteration's data.
    pub verbose: bool,
    /// `-V`: the client checks its sink against its source after each iteration.
    pub validate: bool,
}

/// Wr ids.
const ID_RECV: u64 = 1;
const ID_SEND: u64 = 2;
const ID_RDMA: u64 = 3;

/// The data QP and its buffers: [source/rdma | sink | recv | send], `size` each (16 for the
/// last two).
struct Data {
    qpn: Qpn,
    cq: CqId,
    mr: MrInfo,
    size: usize,
}

impl Data {
    fn new(ep: &mut Endpoint, size: usize) -> Result<Data, String> {
        let r = &mut ep.rnic;
        let pd = r.alloc_pd();
        let cq = r.create_cq(64).map_err(|e| e.to_string())?;
        let mr = r
            .reg_mr(
                pd,
                2 * size + 32,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .map_err(|e| e.to_string())?;
        let qpn = r
            .create_qp(
                pd,
                QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap::default(),
                    sq_sig_all: true,
                },
            )
            .map_err(|e| e.to_string())?;
        Ok(Data { qpn, cq, mr, size })
    }
    fn recv_off(&self) -> usize {
        2 * self.size
    }
    fn send_off(&self) -> usize {
        2 * self.size + 16
    }
    fn post_recv(&self, r: &mut Rnic) -> Result<(), String> {
        r.post_recv(
            self.qpn,
            RecvWr {
                wr_id: ID_RECV,
                sg_list: [Sge {
                    addr: self.mr.addr + self.recv_off() as u64,
                    length: 16,
                    lkey: self.mr.lkey,
                }]
                .into(),
            },
        )
        .map_err(|e| e.to_string())
    }
    /// SENDs `{buf, rkey, size}` (all zero for "go ahead" / "done").
    fn send_info(&self, r: &mut Rnic, buf: u64, rkey: u32, size: u32) -> Result<(), String> {
        let off = self.send_off();
        let b = &mut r.mr_bytes_mut(self.mr.lkey).expect("registered")[off..off + 16];
        b[..8].copy_from_slice(&buf.to_be_bytes());
        b[8..12].copy_from_slice(&rkey.to_be_bytes());
        b[12..16].copy_from_slice(&size.to_be_bytes());
        r.post_send(
            self.qpn,
            SendWr::new(
                ID_SEND,
                WrOpcode::Send,
                vec![Sge {
                    addr: self.mr.addr + off as u64,
                    length: 16,
                    lkey: self.mr.lkey,
                }],
            ),
        )
        .map_err(|e| e.to_string())
    }
    fn received_info(&self, r: &Rnic) -> (u64, u32, u32) {
        let off = self.recv_off();
        let b = &r.mr_bytes(self.mr.lkey).expect("registered")[off..off + 16];
        (
            u64::from_be_bytes(b[..8].try_into().expect("8")),
            u32::from_be_bytes(b[8..12].try_into().expect("4")),
            u32::from_be_bytes(b[12..16].try_into().expect("4")),
        )
    }
}

/// Completions of the data QP seen so far, by kind: a wait never loses one it was not
/// waiting for (a RECV may complete before the SEND ahead of it).
#[derive(Debug, Default)]
struct Seen {
    recv: u64,
    send: u64,
    rdma: u64,
}

impl Seen {
    /// Takes the data QP's completions; the first error ends the run.
    fn count(&mut self, r: &mut Rnic, d: &Data) -> Result<(), String> {
        let mut wcs = Vec::new();
        crate::poll_wcs(r, d.cq, 8, &mut wcs)?;
        for wc in wcs {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "rping: completion {:?} for wr_id {}",
                    wc.status, wc.wr_id
                ));
            }
            match wc.wr_id {
                ID_RECV => self.recv += 1,
                ID_SEND => self.send += 1,
                _ => self.rdma += 1,
            }
        }
        Ok(())
    }
}

/// Turns the engine and the CM until `kind`'s count reaches `want`: Ok(true); Ok(false) when
/// the peer disconnected first.
fn wait_for(
    ep: &mut Endpoint,
    cm: &mut Cm,
    d: &Data,
    seen: &mut Seen,
    kind: u64,
    want: u64,
) -> Result<bool, String> {
    let t = Instant::now();
    loop {
        seen.count(&mut ep.rnic, d)?;
        let have = match kind {
            ID_RECV => seen.recv,
            ID_SEND => seen.send,
            _ => seen.rdma,
        };
        if have >= want {
            return Ok(true);
        }
        match cm.turn(ep)? {
            Some(CmEvent::Disconnected { .. }) => return Ok(false),
            Some(e @ (CmEvent::Rejected { .. } | CmEvent::Timeout { .. })) => {
                return Err(format!("rping: the connection ended: {e:?}"));
            }
            _ => {}
        }
        if t.elapsed() > TIMEOUT {
            return Err(format!(
                "rping: no completion for wr_id {kind} within {} s",
                TIMEOUT.as_secs()
            ));
        }
    }
}

fn need(connected: bool) -> Result<(), String> {
    if connected {
        Ok(())
    } else {
        Err("rping: the peer disconnected in the middle of an iteration".into())
    }
}

fn pattern(start: &mut [u8], i: u64) {
    // rping's: "rdma-ping-%d: " then printable characters from 'A' + i, wrapping.
    let head = format!("rdma-ping-{i}: ");
    let n = head.len().min(start.len());
    start[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = (i % 94) as u8;
    for b in start[n..].iter_mut() {
        *b = b'A' + (c % 57);
        c = c.wrapping_add(1);
    }
    if let Some(last) = start.last_mut() {
        *last = 0;
    }
}

/// Runs one end of rping; returns the lines to print.
pub fn rping(ep: &mut Endpoint, o: &RpingOpts) -> Result<Vec<String>, String> {
    rping_counted(ep, o).0
}

/// What the CM and QP1 counted in a run: what peers sent that was refused, expired or dropped.
#[derive(Debug, Clone, Default)]
pub struct CmReport {
    pub cm: CmCounters,
    pub gsi: GsiCounters,
    /// Both on one line, for stderr.
    pub line: String,
}

/// [`rping`], and the CM's counters at its end (also when it failed).
pub fn rping_counted(ep: &mut Endpoint, o: &RpingOpts) -> (Result<Vec<String>, String>, CmReport) {
    if o.size < 16 {
        return (
            Err(format!("-S {}: at least 16 bytes, as rping", o.size)),
            CmReport::default(),
        );
    }
    let mut cm = match Cm::new(ep) {
        Ok(c) => c,
        Err(e) => return (Err(e), CmReport::default()),
    };
    let r = run(ep, o, &mut cm);
    let (c, g) = cm.counters();
    let report = CmReport {
        cm: c,
        gsi: g,
        line: cm.counters_line(),
    };
    (r, report)
}

fn run(ep: &mut Endpoint, o: &RpingOpts, cm: &mut Cm) -> Result<Vec<String>, String> {
    let d = Data::new(ep, o.size)?;
    let me = RcSide {
        qpn: d.qpn,
        psn: crate::remote::random_psn(&mut ep.rnic),
        path_mtu: crate::oob::mtu_to_enum(ep.rnic.active_mtu().bytes() as u32).unwrap_or(5),
        responder_resources: 1,
        initiator_depth: 1,
        timeout: 14,
    };
    let mut lines = Vec::new();
    let conn = match o.server {
        Some(server) => cm.connect_rc(ep, server, o.port, &me, 0)?,
        None => {
            cm.listen(o.port);
            cm.accept_rc(ep, &me, Duration::MAX, |ep| d.post_recv(&mut ep.rnic))?
        }
    };
    let (id, peer) = (conn.id, conn.peer);
    let src = d.mr.addr;
    let sink = d.mr.addr + o.size as u64;
    let mut seen = Seen::default();
    if o.server.is_some() {
        for i in 0..o.count {
            pattern(
                &mut ep.rnic.mr_bytes_mut(d.mr.lkey).expect("registered")[..o.size],
                i,
            );
            d.post_recv(&mut ep.rnic)?;
            d.send_info(&mut ep.rnic, src, d.mr.rkey, o.size as u32)?;
            need(wait_for(ep, cm, &d, &mut seen, ID_RECV, 2 * i + 1)?)?; // go ahead
            d.post_recv(&mut ep.rnic)?;
            d.send_info(&mut ep.rnic, sink, d.mr.rkey, o.size as u32)?;
            need(wait_for(ep, cm, &d, &mut seen, ID_RECV, 2 * i + 2)?)?; // done
            let b = ep.rnic.mr_bytes(d.mr.lkey).expect("registered");
            if o.validate && b[..o.size] != b[o.size..2 * o.size] {
                return Err(format!("rping: data mismatch in iteration {i}"));
            }
            if o.verbose {
                let s = String::from_utf8_lossy(&b[o.size..2 * o.size]);
                lines.push(format!("ping data: {}", s.trim_end_matches('\0')));
            }
            ep.rnic.mr_bytes_mut(d.mr.lkey).expect("registered")[o.size..2 * o.size].fill(0);
        }
        let now = ep.engine.now();
        cm.agent.disconnect(now, id)?;
        let _ = cm.wait_event(ep, "DREP");
        lines.push(format!(
            "client DISCONNECT EVENT... ({} iterations with {peer})",
            o.count
        ));
    } else {
        let mut i = 0u64;
        loop {
            // The client's source buffer, or a DREQ.
            let t = Instant::now();
            let got = loop {
                seen.count(&mut ep.rnic, &d)?;
                if seen.recv > 2 * i {
                    break true;
                }
                if let Some(CmEvent::Disconnected { .. }) = cm.turn(ep)? {
                    break false;
                }
                if t.elapsed() > TIMEOUT {
                    return Err("rping server: the client went quiet".into());
                }
            };
            if !got {
                break;
            }
            let (buf, rkey, len) = d.received_info(&ep.rnic);
            let len = (len as usize).min(o.size);
            ep.rnic
                .post_send(
                    d.qpn,
                    SendWr::new(
                        ID_RDMA,
                        WrOpcode::RdmaRead {
                            remote_addr: buf,
                            rkey,
                        },
                        vec![Sge {
                            addr: src,
                            length: len as u32,
                            lkey: d.mr.lkey,
                        }],
                    ),
                )
                .map_err(|e| e.to_string())?;
            need(wait_for(ep, cm, &d, &mut seen, ID_RDMA, 2 * i + 1)?)?;
            if o.verbose {
                let b = &ep.rnic.mr_bytes(d.mr.lkey).expect("registered")[..len];
                lines.push(format!(
                    "server ping data: {}",
                    String::from_utf8_lossy(b).trim_end_matches('\0')
                ));
            }
            d.post_recv(&mut ep.rnic)?;
            d.send_info(&mut ep.rnic, 0, 0, 0)?;
            need(wait_for(ep, cm, &d, &mut seen, ID_RECV, 2 * i + 2)?)?; // the sink
            let (buf, rkey, len2) = d.received_info(&ep.rnic);
            ep.rnic
                .post_send(
                    d.qpn,
                    SendWr::new(
                        ID_RDMA,
                        WrOpcode::RdmaWrite {
                            remote_addr: buf,
                            rkey,
                        },
                        vec![Sge {
                            addr: src,
                            length: (len2 as usize).min(len) as u32,
                            lkey: d.mr.lkey,
                        }],
                    ),
                )
                .map_err(|e| e.to_string())?;
            need(wait_for(ep, cm, &d, &mut seen, ID_RDMA, 2 * i + 2)?)?;
            d.post_recv(&mut ep.rnic)?;
            d.send_info(&mut ep.rnic, 0, 0, 0)?;
            // The client may take "done" and disconnect before our SEND's ACK is in: also fine.
            let acked = wait_for(ep, cm, &d, &mut seen, ID_SEND, 2 * i + 2)?;
            i += 1;
            if !acked {
                break;
            }
        }
        lines.push(format!(
            "server DISCONNECT EVENT... ({i} iterations with {peer})"
        ));
    }
    // Let the last answers (DREP, ACKs) leave.
    let end = Instant::now() + Duration::from_millis(100);
    while Instant::now() < end {
        let _ = cm.turn(ep)?;
    }
    Ok(lines)
}
