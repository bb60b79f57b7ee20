//! Two RoCEmu RNICs on AF_PACKET ports in two network namespaces joined by a veth pair: ARP
//! resolution both ways (one side shares the kernel's address, the other has an address the
//! kernel does not know, so only RoCEmu can answer for it), then RC WRITE, READ, SEND and
//! FETCH_ADD across the kernel's veth, every byte checked. Needs root (scripts/test runs as root).
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::engine::Engine;
use rocemu_emulator::inproc::pattern;
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort, KernelGuard};
use rocemu_emulator::port::Port;
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_testbed::netns::VethPair;
use rocemu_wire::eth::Mac;
use rocemu_wire::{Psn, Qpn};
use std::net::IpAddr;
use std::sync::mpsc;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
struct Dest {
    qpn: Qpn,
    psn: Psn,
    addr: u64,
    rkey: u32,
}

const LEN: usize = 256 * 1024;
const T: Duration = Duration::from_secs(20);

/// One side's RNIC, engine and verbs objects. Fields drop in order: the engine (and its port)
/// and the RNIC before the kernel guard, as the locals of one function did.
struct Side {
    r: Rnic,
    e: Engine,
    cq: CqId,
    mr: MrInfo,
    qpn: Qpn,
    psn: Psn,
    active: bool,
    _guard: KernelGuard,
}

fn side(
    ns: String,
    ifname: String,
    me: IpAddr,
    peer: IpAddr,
    active: bool,
    tx: mpsc::Sender<Dest>,
    rx: mpsc::Receiver<Dest>,
) -> Result<String, String> {
    let mut s = Side::open(&ns, &ifname, me, active)?;
    let theirs = s.exchange(&tx, &rx)?;
    let mac = s.connect(peer, &theirs)?;
    if !active {
        return s.serve(mac);
    }
    let data = s.write_then_read(&theirs)?;
    s.fetch_add_then_send(&theirs, &data)?;
    Ok(format!("active ok, peer at {mac}, {:?}", s.e.port_stats()))
}

impl Side {
    /// Enters the namespace, opens the port and creates the PD, CQ, MR and QP.
    fn open(ns: &str, ifname: &str, me: IpAddr, active: bool) -> Result<Side, String> {
        rocemu_testbed::netns::enter(ns)?;
        // The filter for our own address only: what the engine and the RNIC need still comes in.
        let opts = AfPacketOptions {
            addrs: vec![me],
            ..Default::default()
        };
        let port = AfPacketPort::open(ifname, &opts).map_err(|e| e.0)?;
        let guard = KernelGuard::new();
        let mut cfg = RnicConfig::new(port.mac(), me, if active { 11 } else { 22 });
        cfg.eth_mtu = port.mtu();
        let mut r = Rnic::new(cfg);
        let e = Engine::new(Box::new(port));
        let pd = r.alloc_pd();
        let cq = r.create_cq(256).map_err(|e| e.to_string())?;
        let mr = r
            .reg_mr(
                pd,
                2 * LEN,
                Access::LOCAL_WRITE
                    | Access::REMOTE_WRITE
                    | Access::REMOTE_READ
                    | Access::REMOTE_ATOMIC,
            )
            .map_err(|e| e.to_string())?;
        let qpn = r
            .create_qp(pd, QpInitAttr::new(QpType::Rc, cq))
            .map_err(|e| e.to_string())?;
        let psn = Psn::new(if active { 0x10 } else { 0xfffff0 });
        Ok(Side {
            r,
            e,
            cq,
            mr,
            qpn,
            psn,
            active,
            _guard: guard,
        })
    }

    /// Sends our QP's coordinates and waits for the peer's.
    fn exchange(
        &mut self,
        tx: &mpsc::Sender<Dest>,
        rx: &mpsc::Receiver<Dest>,
    ) -> Result<Dest, String> {
        tx.send(Dest {
            qpn: self.qpn,
            psn: self.psn,
            addr: self.mr.addr,
            rkey: self.mr.rkey,
        })
        .unwrap();
        // Keep answering ARP while the peer gets ready.
        let mut theirs = None;
        while theirs.is_none() {
            theirs = match rx.try_recv() {
                Ok(d) => Some(d),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Err("the peer thread gave up".into())
                }
            };
            let w = self.e.poll(&mut self.r);
            self.e.idle(w);
        }
        Ok(theirs.unwrap())
    }

    /// Resolves the peer's MAC, brings the QP to RTS and, on the passive side, posts the
    /// receive for the final SEND.
    fn connect(&mut self, peer: IpAddr, theirs: &Dest) -> Result<Mac, String> {
        let (r, e) = (&mut self.r, &mut self.e);
        let mac = e.resolve(r, peer, Duration::from_secs(5))?;
        let mtu = r.active_mtu();
        bring_up(
            r,
            self.qpn,
            theirs.qpn,
            peer,
            self.psn,
            theirs.psn,
            &ConnectOpts {
                mtu,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        if !self.active {
            r.post_recv(
                self.qpn,
                RecvWr {
                    wr_id: 9,
                    sg_list: [Sge {
                        addr: self.mr.addr + LEN as u64,
                        length: LEN as u32,
                        lkey: self.mr.lkey,
                    }]
                    .into(),
                },
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(mac)
    }

    /// Passive: serve until the peer says it is done, then check what it sent.
    fn serve(mut self, mac: Mac) -> Result<String, String> {
        let (r, e, cq) = (&mut self.r, &mut self.e, self.cq);
        let mut wcs = Vec::new();
        if !e.run_until(r, T, |r| {
            r.poll_cq_into(cq, 4, &mut wcs);
            !wcs.is_empty()
        }) {
            return Err("passive side: no SEND arrived".into());
        }
        let want = pattern(3, 1000);
        let got = &r.mr_bytes(self.mr.lkey).unwrap()[LEN..LEN + 1000];
        if wcs[0].status != WcStatus::Success || got != &want[..] {
            return Err(format!(
                "passive side: SEND completion {:?} or bytes wrong",
                wcs[0]
            ));
        }
        // Let the last ACK go out before the port closes.
        e.run_until(r, Duration::from_millis(200), |_| false);
        Ok(format!("passive ok, peer at {mac}"))
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr + off as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    /// Active: WRITE a pattern to the peer, READ it back into the second half, compare.
    /// Returns the pattern.
    fn write_then_read(&mut self, theirs: &Dest) -> Result<Vec<u8>, String> {
        let data = pattern(1, LEN);
        self.r.mr_bytes_mut(self.mr.lkey).unwrap()[..LEN].copy_from_slice(&data);
        let ops = [
            SendWr::new(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: theirs.addr,
                    rkey: theirs.rkey,
                },
                vec![self.sge(0, LEN)],
            ),
            SendWr::new(
                2,
                WrOpcode::RdmaRead {
                    remote_addr: theirs.addr,
                    rkey: theirs.rkey,
                },
                vec![self.sge(LEN, LEN)],
            ),
        ];
        let (r, e, cq) = (&mut self.r, &mut self.e, self.cq);
        for wr in ops {
            let id = wr.wr_id;
            r.post_send(self.qpn, wr).map_err(|e| e.to_string())?;
            let mut wcs = Vec::new();
            if !e.run_until(r, T, |r| {
                r.poll_cq_into(cq, 4, &mut wcs);
                !wcs.is_empty()
            }) {
                return Err(format!("wr {id}: no completion; {:?}", r.counters()));
            }
            if wcs[0].status != WcStatus::Success {
                return Err(format!("wr {id}: {:?}", wcs[0]));
            }
        }
        if r.mr_bytes(self.mr.lkey).unwrap()[LEN..] != data[..] {
            return Err("READ did not bring back what WRITE put there".into());
        }
        Ok(data)
    }

    /// Active: FETCH_ADD on the first 8 bytes, then a SEND that tells the peer to check.
    fn fetch_add_then_send(&mut self, theirs: &Dest, data: &[u8]) -> Result<(), String> {
        let before = u64::from_le_bytes(data[..8].try_into().unwrap());
        let fetch_add = SendWr::new(
            3,
            WrOpcode::AtomicFetchAdd {
                remote_addr: theirs.addr,
                rkey: theirs.rkey,
                add: 5,
            },
            vec![self.sge(LEN, 8)],
        );
        let send = SendWr::new(4, WrOpcode::Send, vec![self.sge(2 * LEN - 1000, 1000)]);
        let (r, e, cq, lkey) = (&mut self.r, &mut self.e, self.cq, self.mr.lkey);
        r.post_send(self.qpn, fetch_add)
            .map_err(|e| e.to_string())?;
        r.mr_bytes_mut(lkey).unwrap()[2 * LEN - 1000..].copy_from_slice(&pattern(3, 1000));
        r.post_send(self.qpn, send).map_err(|e| e.to_string())?;
        let mut wcs = Vec::new();
        if !e.run_until(r, T, |r| {
            r.poll_cq_into(cq, 4, &mut wcs);
            wcs.len() >= 2
        }) {
            return Err(format!("atomic + send: {wcs:?}"));
        }
        if wcs.iter().any(|w| w.status != WcStatus::Success) {
            return Err(format!("atomic + send: {wcs:?}"));
        }
        let orig = u64::from_le_bytes(r.mr_bytes(lkey).unwrap()[LEN..LEN + 8].try_into().unwrap());
        if orig != before {
            return Err(format!(
                "FETCH_ADD returned {orig:#x}, expected {before:#x}"
            ));
        }
        Ok(())
    }
}

#[test]
fn rc_between_two_namespaces_over_af_packet() {
    // A uses the kernel's own address (as rdma_rxe does); B uses one the kernel does not have.
    let v = VethPair::new("rmafp", 1500, Some("10.77.0.1/24"), Some("10.77.0.2/24"))
        .expect("netns setup");
    let (a_ip, b_ip): (IpAddr, IpAddr) =
        ("10.77.0.1".parse().unwrap(), "10.77.0.12".parse().unwrap());
    let (ta, rb) = mpsc::channel();
    let (tb, ra) = mpsc::channel();
    let (nsa, ia) = (v.a.ns.clone(), v.a.ifname.clone());
    let (nsb, ib) = (v.b.ns.clone(), v.b.ifname.clone());
    let ha = std::thread::spawn(move || side(nsa, ia, a_ip, b_ip, true, ta, ra));
    let hb = std::thread::spawn(move || side(nsb, ib, b_ip, a_ip, false, tb, rb));
    let a = ha.join().unwrap();
    let b = hb.join().unwrap();
    println!("A: {a:?}\nB: {b:?}");
    a.unwrap();
    b.unwrap();
}
