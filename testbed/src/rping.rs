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
use crate::remote::Endpoint;
use rocemu_emulator::cm::{CmAgent, CmEvent, ConnParams};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::cm::{CmaHdr, CommId, PortSpace, RejReason, ServiceId};
use rocemu_wire::mad::MAD_LEN;
use rocemu_wire::{Psn, QKey, Qpn};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

/// The GSI Q_Key (IBTA 13.5.1).
const GSI_QKEY: u32 = 0x8001_0000;
const GRH: usize = 40;
const MAD_RECVS: usize = 16;
const TIMEOUT: Duration = Duration::from_secs(30);

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
const ID_MAD_RECV: u64 = 10;
const ID_MAD_SEND: u64 = 11;

struct Gsi {
    qpn: Qpn,
    cq: CqId,
    mr: MrInfo,
}

/// QP1 and the CM agent, driven by the engine's turns.
struct Cm {
    gsi: Gsi,
    agent: CmAgent,
}

impl Cm {
    fn new(ep: &mut Endpoint) -> Result<Cm, String> {
        let r = &mut ep.rnic;
        let pd = r.alloc_pd();
        let cq = r.create_cq(2 * MAD_RECVS + 8).map_err(|e| e.to_string())?;
        let mr = r
            .reg_mr(pd, (MAD_RECVS + 1) * (GRH + MAD_LEN), Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: MAD_RECVS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        };
        let qpn = r.create_gsi_qp(pd, init).map_err(|e| e.to_string())?;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qkey: QKey(GSI_QKEY),
            port_num: 1,
            ..Default::default()
        };
        use QpAttrMask as M;
        r.modify_qp(qpn, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
            .map_err(|e| e.to_string())?;
        a.qp_state = QpState::Rtr;
        r.modify_qp(qpn, &a, M::STATE).map_err(|e| e.to_string())?;
        a.qp_state = QpState::Rts;
        r.modify_qp(qpn, &a, M::STATE | M::SQ_PSN)
            .map_err(|e| e.to_string())?;
        let gsi = Gsi { qpn, cq, mr };
        for i in 0..MAD_RECVS {
            post_mad_recv(r, &gsi, i)?;
        }
        let ip = r.ips()[0];
        let mac = r.mac().0;
        let guid = u64::from_be_bytes([
            mac[0] ^ 2,
            mac[1],
            mac[2],
            0xff,
            0xfe,
            mac[3],
            mac[4],
            mac[5],
        ]);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Ok(Cm {
            gsi,
            agent: CmAgent::new(ip, guid, seed),
        })
    }

    /// One turn: the engine, MADs in, timers, MADs out. Returns the agent's next event.
    fn turn(&mut self, ep: &mut Endpoint) -> Result<Option<CmEvent>, String> {
        let w = ep.engine.poll(&mut ep.rnic);
        let now = ep.engine.now();
        let mut wcs = Vec::new();
        ep.rnic.poll_cq_into(self.gsi.cq, 8, &mut wcs);
        for wc in &wcs {
            if wc.wr_id < ID_MAD_RECV * 1000 {
                continue; // a send completion
            }
            let i = (wc.wr_id - ID_MAD_RECV * 1000) as usize;
            if wc.status == WcStatus::Success && wc.byte_len as usize >= GRH + MAD_LEN {
                let b = ep.rnic.mr_bytes(self.gsi.mr.lkey).expect("registered");
                let buf = &b[i * (GRH + MAD_LEN)..(i + 1) * (GRH + MAD_LEN)];
                if let Some(from) = grh_source(&buf[..GRH]) {
                    let mad: [u8; MAD_LEN] = buf[GRH..].try_into().expect("MAD_LEN bytes");
                    self.agent.handle_mad(now, from, &mad);
                }
            }
            post_mad_recv(&mut ep.rnic, &self.gsi, i)?;
        }
        if self.agent.poll_timeout().is_some_and(|t| t <= now) {
            self.agent.handle_timeout(now);
        }
        while let Some((to, mad)) = self.agent.poll_transmit() {
            self.send_mad(ep, to, &mad)?;
        }
        let ev = self.agent.poll_event();
        if ev.is_none() && w == 0 && wcs.is_empty() {
            ep.engine.idle(0);
        }
        Ok(ev)
    }

    fn send_mad(
        &mut self,
        ep: &mut Endpoint,
        to: IpAddr,
        mad: &[u8; MAD_LEN],
    ) -> Result<(), String> {
        let mac = ep
            .engine
            .resolve(&mut ep.rnic, to, Duration::from_secs(5))?;
        let off = MAD_RECVS * (GRH + MAD_LEN);
        ep.rnic.mr_bytes_mut(self.gsi.mr.lkey).expect("registered")[off..off + MAD_LEN]
            .copy_from_slice(mad);
        let mut wr = SendWr::new(
            ID_MAD_SEND,
            WrOpcode::Send,
            vec![Sge {
                addr: self.gsi.mr.addr + off as u64,
                length: MAD_LEN as u32,
                lkey: self.gsi.mr.lkey,
            }],
        );
        wr.ud = Some(UdDest {
            ah: AhAttr::to(to, mac),
            remote_qpn: Qpn::new(1),
            remote_qkey: QKey(GSI_QKEY),
        });
        ep.rnic
            .post_send(self.gsi.qpn, wr)
            .map_err(|e| e.to_string())?;
        // One send buffer: let it leave before the next MAD is copied in.
        let t = Instant::now();
        while ep.rnic.poll_cq(self.gsi.cq, 0).is_empty() && ep.rnic.wants_transmit() {
            ep.engine.poll(&mut ep.rnic);
            if t.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
        Ok(())
    }

    fn wait_event(&mut self, ep: &mut Endpoint, what: &str) -> Result<CmEvent, String> {
        let t = Instant::now();
        loop {
            if let Some(e) = self.turn(ep)? {
                return Ok(e);
            }
            if t.elapsed() > TIMEOUT {
                return Err(format!("rping: no {what} within {} s", TIMEOUT.as_secs()));
            }
        }
    }
}

fn post_mad_recv(r: &mut Rnic, g: &Gsi, i: usize) -> Result<(), String> {
    r.post_recv(
        g.qpn,
        RecvWr {
            wr_id: ID_MAD_RECV * 1000 + i as u64,
            sg_list: vec![Sge {
                addr: g.mr.addr + (i * (GRH + MAD_LEN)) as u64,
                length: (GRH + MAD_LEN) as u32,
                lkey: g.mr.lkey,
            }],
        },
    )
    .map_err(|e| e.to_string())
}

/// The sender's address from a UD receive's GRH area (IPv4: 20 zero bytes, then its header).
fn grh_source(g: &[u8]) -> Option<IpAddr> {
    if g[..20].iter().all(|&b| b == 0) && g[20] >> 4 == 4 {
        Some(IpAddr::V4(Ipv4Addr::new(g[32], g[33], g[34], g[35])))
    } else if g[0] >> 4 == 6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&g[8..24]);
        Some(IpAddr::V6(Ipv6Addr::from(a)))
    } else {
        None
    }
}

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
                sg_list: vec![Sge {
                    addr: self.mr.addr + self.recv_off() as u64,
                    length: 16,
                    lkey: self.mr.lkey,
                }],
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
        for wc in r.poll_cq(d.cq, 8) {
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

fn rtr_rts(
    ep: &mut Endpoint,
    d: &Data,
    peer: IpAddr,
    remote_qpn: Qpn,
    remote_psn: Psn,
    my_psn: Psn,
    mtu: u8,
) -> Result<(), String> {
    ep.engine
        .resolve(&mut ep.rnic, peer, Duration::from_secs(5))?;
    // The path MTU asked for, no larger than the port's (an unknown value: the port's).
    let active = ep.rnic.active_mtu();
    let mtu = crate::oob::mtu_from_enum(mtu as i64)
        .and_then(|b| Mtu::from_bytes(b as usize))
        .filter(|m| m.bytes() <= active.bytes())
        .unwrap_or(active);
    let o = rocemu_emulator::sim::ConnectOpts {
        mtu,
        max_rd_atomic: 1,
        ..Default::default()
    };
    // Each end's Starting PSN (REQ, REP) is the PSN it expects to receive: the peer sends from
    // it (what Linux does; see wire/tests/data/cm/rping.pcap).
    rocemu_emulator::sim::bring_up(
        &mut ep.rnic,
        d.qpn,
        remote_qpn,
        peer,
        remote_psn,
        my_psn,
        &o,
    )
    .map_err(|e| format!("modify QP: {e}"))
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
    if o.size < 16 {
        return Err(format!("-S {}: at least 16 bytes, as rping", o.size));
    }
    let mut cm = Cm::new(ep)?;
    let d = Data::new(ep, o.size)?;
    let my_psn = crate::remote::random_psn();
    let service = ServiceId::rdma_cm(PortSpace::TCP, o.port);
    let mut lines = Vec::new();
    let (id, peer): (CommId, IpAddr) = match o.server {
        Some(server) => {
            let me = ep.rnic.ips()[0];
            let src_port = 32768 + (ep.engine.now().0 % 28000) as u16;
            let mut pd = [0u8; 92];
            CmaHdr::new(SocketAddr::new(me, src_port), server)
                .and_then(|h| h.emit(&mut pd))
                .map_err(|e| format!("rping: {e}"))?;
            ep.engine
                .resolve(&mut ep.rnic, server, Duration::from_secs(5))?;
            let p = ConnParams {
                qpn: d.qpn,
                psn: my_psn,
                path_mtu: crate::oob::mtu_to_enum(ep.rnic.active_mtu().bytes() as u32).unwrap_or(5),
                private_data: pd,
                ..ConnParams::default()
            };
            let now = ep.engine.now();
            let id = cm.agent.connect(now, server, service, &p);
            match cm.wait_event(ep, "REP")? {
                CmEvent::Established {
                    remote_qpn,
                    remote_psn,
                    ..
                } => {
                    rtr_rts(ep, &d, server, remote_qpn, remote_psn, my_psn, p.path_mtu)?;
                }
                e => return Err(format!("rping: connect failed: {e:?}")),
            }
            (id, server)
        }
        None => {
            cm.agent.listen(service);
            let (id, from, req) = loop {
                match cm.wait_event(ep, "connection request")? {
                    CmEvent::ConnectRequest { id, from, req } => break (id, from, req),
                    _ => continue,
                }
            };
            rtr_rts(
                ep,
                &d,
                from,
                req.local_qpn,
                req.starting_psn,
                my_psn,
                req.path_mtu,
            )?;
            d.post_recv(&mut ep.rnic)?;
            let p = ConnParams {
                qpn: d.qpn,
                psn: my_psn,
                path_mtu: req.path_mtu,
                ..ConnParams::default()
            };
            let now = ep.engine.now();
            cm.agent.accept(now, id, &p)?;
            match cm.wait_event(ep, "RTU")? {
                CmEvent::Established { .. } => {}
                e => {
                    cm.agent.reject(id, RejReason::CONSUMER_DEFINED);
                    return Err(format!("rping: accept failed: {e:?}"));
                }
            }
            (id, from)
        }
    };
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
            need(wait_for(ep, &mut cm, &d, &mut seen, ID_RECV, 2 * i + 1)?)?; // go ahead
            d.post_recv(&mut ep.rnic)?;
            d.send_info(&mut ep.rnic, sink, d.mr.rkey, o.size as u32)?;
            need(wait_for(ep, &mut cm, &d, &mut seen, ID_RECV, 2 * i + 2)?)?; // done
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
            need(wait_for(ep, &mut cm, &d, &mut seen, ID_RDMA, 2 * i + 1)?)?;
            if o.verbose {
                let b = &ep.rnic.mr_bytes(d.mr.lkey).expect("registered")[..len];
                lines.push(format!(
                    "server ping data: {}",
                    String::from_utf8_lossy(b).trim_end_matches('\0')
                ));
            }
            d.post_recv(&mut ep.rnic)?;
            d.send_info(&mut ep.rnic, 0, 0, 0)?;
            need(wait_for(ep, &mut cm, &d, &mut seen, ID_RECV, 2 * i + 2)?)?; // the sink
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
            need(wait_for(ep, &mut cm, &d, &mut seen, ID_RDMA, 2 * i + 2)?)?;
            d.post_recv(&mut ep.rnic)?;
            d.send_info(&mut ep.rnic, 0, 0, 0)?;
            // The client may take "done" and disconnect before our SEND's ACK is in: also fine.
            let acked = wait_for(ep, &mut cm, &d, &mut seen, ID_SEND, 2 * i + 2)?;
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
