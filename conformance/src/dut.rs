//! The device under test and the link between it and the peer.
//!
//! * [`SelfDut`]: a RoCEmu RNIC driven directly in virtual time (`--target self`). The peer's
//!   frames go into `handle_frame` at the current instant; what the RNIC sends is collected with
//!   its timestamp; the clock jumps to the RNIC's next deadline only when someone waits. A run
//!   is therefore deterministic: the same scenario gives the same frames at the same instants.
//!   Frame filters on either side ([`Filter`]) break the device on purpose, without touching
//!   the RNIC, to show that a scenario fails when the behaviour it checks is broken.
//! * [`PortLink`]: a real port (AF_PACKET) facing a device elsewhere on the link, in real time,
//!   answering ARP for the peer's address.
use crate::agent::rnic::{execute, Objects};
use crate::agent::{Agent, AgentResult, Reply, Request};
use rocemu_emulator::port::Port;
use rocemu_emulator::rnic::{Rnic, RnicConfig};
use rocemu_emulator::Nanos;
use rocemu_wire::arp::{ArpRepr, OP_REPLY, OP_REQUEST};
use rocemu_wire::eth::{EthernetRepr, Mac, ETHERTYPE_ARP};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Where frames meet the device: the peer sends on it and receives what the device sent.
pub trait Link {
    /// Puts a frame on the wire towards the device.
    fn send(&mut self, frame: &[u8]);
    /// The next frame the device sent, waiting up to `wait` for one; with its timestamp.
    fn recv(&mut self, wait: Duration) -> Option<(Duration, Vec<u8>)>;
    /// The link's clock (virtual or real), for timestamps.
    fn now(&self) -> Duration;
}

/// A frame filter: takes a frame and returns the frames to pass on (none: dropped; the frame
/// itself, changed or not; or more than one).
pub type Filter = Box<dyn FnMut(Vec<u8>) -> Vec<Vec<u8>>>;

/// The device's addresses with `--target self`.
pub const DUT_MAC: Mac = Mac([0x02, 0x52, 0x4f, 0x43, 0x45, 0x10]);
pub const DUT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1));
/// The peer's, in both modes unless told otherwise.
pub const PEER_MAC: Mac = Mac([0x02, 0x52, 0x4f, 0x43, 0x45, 0x20]);
pub const PEER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2));
/// The device's IPv6 address with `--target self` (its second GID, after [`DUT_IP`]): the
/// link-local address of [`DUT_MAC`], as rdma_rxe's IPv6 GID is of its interface's MAC.
pub const DUT_IP6: IpAddr = IpAddr::V6(link_local(DUT_MAC));
/// The peer's IPv6 address in both modes: the link-local address of [`PEER_MAC`].
pub const PEER_IP6: IpAddr = IpAddr::V6(link_local(PEER_MAC));

/// The IPv6 link-local address (fe80::/64, modified EUI-64, RFC 4291 appendix A) of `mac`.
pub const fn link_local(mac: Mac) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        ((m[0] ^ 0x02) as u16) << 8 | m[1] as u16,
        (m[2] as u16) << 8 | 0xff,
        0xfe00 | m[3] as u16,
        (m[4] as u16) << 8 | m[5] as u16,
    )
}

/// Every virtual-time loop is bounded: an RNIC that keeps asking for the same instant must not
/// hang the run (the scenario then fails on what did not come).
const MAX_STEPS: usize = 1_000_000;

/// A RoCEmu RNIC in virtual time, with what the in-process agent created on it (its rdma_cm
/// service included, which turns with the RNIC).
pub struct SelfDut {
    pub rnic: Rnic,
    pub objs: Objects,
    now: Nanos,
    outbox: VecDeque<(Nanos, Vec<u8>)>,
    /// Applied to every frame the peer sends before the RNIC sees it.
    pub rx_filter: Option<Filter>,
    /// Applied to every frame the RNIC sends before the peer sees it.
    pub tx_filter: Option<Filter>,
    buf: Vec<u8>,
}

impl std::fmt::Debug for SelfDut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfDut")
            .field("now", &self.now)
            .field("outbox", &self.outbox.len())
            .finish_non_exhaustive()
    }
}

impl SelfDut {
    /// An RNIC at [`DUT_MAC`] / [`DUT_IP`], and [`DUT_IP6`] as its second GID (1500-byte
    /// Ethernet MTU, active MTU 1024, as rxe on a default interface) that knows the peer's MAC
    /// at both of the peer's addresses.
    pub fn new(seed: u64) -> SelfDut {
        let mut cfg = RnicConfig::new(DUT_MAC, DUT_IP, seed);
        cfg.eth_mtu = 1500;
        cfg.ips.push(DUT_IP6);
        let mut rnic = Rnic::new(cfg);
        rnic.set_neighbor(PEER_IP, PEER_MAC);
        rnic.set_neighbor(PEER_IP6, PEER_MAC);
        SelfDut {
            rnic,
            objs: Objects::default(),
            now: Nanos::ZERO,
            outbox: VecDeque::new(),
            rx_filter: None,
            tx_filter: None,
            buf: vec![0; 10_000],
        }
    }

    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Turns the agent's CM service and moves everything the RNIC wants to send now into the
    /// outbox, until neither has more.
    pub fn pump(&mut self) {
        let mut steps = 0;
        loop {
            // The peer is the only neighbour the RNIC knows.
            let now = self.now;
            self.objs.turn_cm(&mut self.rnic, now, &mut |_, ip| {
                if ip == PEER_IP {
                    Ok(())
                } else {
                    Err(format!("no neighbour {ip}"))
                }
            });
            let mut sent = 0;
            while let Some(n) = self.rnic.poll_transmit(self.now, &mut self.buf) {
                let f = self.buf[..n].to_vec();
                let out = match self.tx_filter.as_mut() {
                    Some(filter) => filter(f),
                    None => vec![f],
                };
                self.outbox.extend(out.into_iter().map(|f| (self.now, f)));
                sent += 1;
                steps += 1;
                if steps >= MAX_STEPS {
                    return;
                }
            }
            // Sends completed free QP1's send slots: the CM may have more to post.
            if sent == 0 {
                return;
            }
        }
    }

    /// The next instant the RNIC or the agent's CM has something to do.
    pub fn poll_timeout(&mut self) -> Option<Nanos> {
        match (self.rnic.poll_timeout(), self.objs.cm_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves the clock to `t` (never back) and runs what is due then.
    fn fire(&mut self, t: Nanos) {
        self.now = self.now.max(t);
        let now = self.now;
        self.rnic.handle_timeout(now);
        self.pump();
    }

    /// A frame from the peer, now.
    pub fn deliver(&mut self, frame: Vec<u8>) {
        let frames = match self.rx_filter.as_mut() {
            Some(filter) => filter(frame),
            None => vec![frame],
        };
        for mut f in frames {
            self.rnic.handle_frame_mut(self.now, &mut f);
        }
        self.pump();
    }

    /// Advances the clock through the RNIC's deadlines up to `deadline`; with `until_output`,
    /// stops as soon as the outbox holds a frame. Returns false if the loop did not settle.
    pub fn advance(&mut self, deadline: Nanos, until_output: bool) -> bool {
        for _ in 0..MAX_STEPS {
            self.pump();
            if until_output && !self.outbox.is_empty() {
                return true;
            }
            match self.poll_timeout() {
                Some(t) if t <= deadline => self.fire(t),
                _ => {
                    self.now = self.now.max(deadline);
                    self.pump();
                    return true;
                }
            }
        }
        false
    }

    fn pop(&mut self) -> Option<(Duration, Vec<u8>)> {
        self.outbox
            .pop_front()
            .map(|(t, f)| (Duration::from_nanos(t.0), f))
    }
}

/// A [`SelfDut`] shared by its agent and its link (one thread: the run is sequential).
pub type SharedDut = Rc<RefCell<SelfDut>>;

/// Two hands on one [`SelfDut`].
pub fn self_target(seed: u64) -> (SharedDut, SelfAgent, SelfLink) {
    let dut = Rc::new(RefCell::new(SelfDut::new(seed)));
    let agent = SelfAgent { dut: dut.clone() };
    let link = SelfLink { dut: dut.clone() };
    (dut, agent, link)
}

/// The in-process agent: requests run on the RNIC directly; `poll_cq` waits in virtual time.
#[derive(Debug)]
pub struct SelfAgent {
    dut: SharedDut,
}

impl Agent for SelfAgent {
    fn call(&mut self, req: Request) -> AgentResult<Reply> {
        let mut guard = self.dut.borrow_mut();
        let d = &mut *guard;
        let Request::PollCq {
            cq,
            max,
            min,
            wait_ms,
        } = req
        else {
            let r = execute(&mut d.rnic, &mut d.objs, req);
            d.pump();
            return r;
        };
        let deadline = d.now + Nanos::from_millis(wait_ms);
        let mut got = Vec::new();
        for _ in 0..MAX_STEPS {
            let left = max.saturating_sub(got.len() as u32);
            let poll = Request::PollCq {
                cq,
                max: left,
                min: 0,
                wait_ms: 0,
            };
            if let Reply::Wcs(w) = execute(&mut d.rnic, &mut d.objs, poll)? {
                got.extend(w);
            }
            if got.len() as u32 >= min.min(max) || d.now >= deadline {
                break;
            }
            // Completions appear only when a timer fires (the peer is not sending meanwhile).
            match d.poll_timeout() {
                Some(t) if t <= deadline => d.fire(t),
                _ => {
                    d.now = deadline;
                    d.pump();
                }
            }
        }
        Ok(Reply::Wcs(got))
    }
}

/// The peer's side of a [`SelfDut`].
#[derive(Debug)]
pub struct SelfLink {
    dut: SharedDut,
}

impl Link for SelfLink {
    fn send(&mut self, frame: &[u8]) {
        self.dut.borrow_mut().deliver(frame.to_vec());
    }

    fn recv(&mut self, wait: Duration) -> Option<(Duration, Vec<u8>)> {
        let mut d = self.dut.borrow_mut();
        if let Some(f) = d.pop() {
            return Some(f);
        }
        let deadline = d.now + Nanos(wait.as_nanos() as u64);
        d.advance(deadline, true);
        d.pop()
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.dut.borrow().now.0)
    }
}

/// A real port facing the device, in real time. A thread of its own turns the port, so that
/// ARP for the peer's IPv4 address is answered even while the runner waits on the agent (the
/// device resolves the peer when its QP gets an address handle); it hands on the frames
/// addressed to the peer's MAC with their arrival time.
pub struct PortLink {
    name: String,
    start: Instant,
    to_port: mpsc::Sender<Vec<u8>>,
    from_port: mpsc::Receiver<(Duration, Vec<u8>)>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for PortLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortLink")
            .field("port", &self.name)
            .finish_non_exhaustive()
    }
}

impl PortLink {
    pub fn new(port: Box<dyn Port + Send>, mac: Mac, ip: IpAddr) -> PortLink {
        let start = Instant::now();
        let (to_port, outgoing) = mpsc::channel::<Vec<u8>>();
        let (incoming, from_port) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let name = port.name();
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut port = port;
            while !s.load(Ordering::Relaxed) {
                let mut work = 0;
                while let Ok(f) = outgoing.try_recv() {
                    transmit(&mut *port, &f);
                    work += 1;
                }
                work += receive(&mut *port, mac, ip, start, &incoming);
                if work == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            port.flush();
        });
        PortLink {
            name,
            start,
            to_port,
            from_port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PortLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn transmit(port: &mut dyn Port, frame: &[u8]) {
    let mut sent = false;
    port.tx_burst(1, &mut |buf| {
        if sent || buf.len() < frame.len() {
            return None;
        }
        sent = true;
        buf[..frame.len()].copy_from_slice(frame);
        Some(frame.len())
    });
    port.flush();
}

/// The neighbor advertisement that answers `f` when it is a neighbor solicitation for the
/// link-local address of `mac` ([`link_local`], the peer's IPv6 address), as a frame.
fn nd_answer(f: &[u8], l3: usize, from: Mac, mac: Mac) -> Option<Vec<u8>> {
    use rocemu_wire::ip::{Ipv6Repr, IPV6_HEADER_LEN};
    use rocemu_wire::nd::NdRepr;
    let (ip, dgram) = Ipv6Repr::parse(&f[l3..]).ok()?;
    let me = link_local(mac);
    match NdRepr::parse(&ip, &dgram[IPV6_HEADER_LEN..]).ok()? {
        NdRepr::Solicit { target, .. } if target == me && !ip.src.is_unspecified() => {
            let na = NdRepr::Advert {
                router: false,
                solicited: true,
                override_: true,
                target: me,
                target_mac: Some(mac),
            };
            let mut buf = [0u8; 128];
            let n = na.emit_frame(mac, from, me, ip.src, &mut buf);
            Some(buf[..n].to_vec())
        }
        _ => None,
    }
}

/// One burst: answers ARP for `ip` and IPv6 neighbor solicitations for the link-local address of
/// `mac`, hands on what is addressed to `mac`. Returns the frames seen.
fn receive(
    port: &mut dyn Port,
    mac: Mac,
    ip: IpAddr,
    start: Instant,
    out: &mpsc::Sender<(Duration, Vec<u8>)>,
) -> usize {
    let mut replies = Vec::new();
    let mut adverts = Vec::new();
    let n = port.rx_burst(32, &mut |f| {
        let Ok((eth, l3)) = EthernetRepr::parse(f) else {
            return;
        };
        if eth.ethertype == rocemu_wire::eth::ETHERTYPE_IPV6 {
            if let Some(na) = nd_answer(f, l3, eth.src, mac) {
                adverts.push(na);
                return;
            }
        }
        if eth.ethertype == ETHERTYPE_ARP {
            if let (Ok(a), IpAddr::V4(me)) = (ArpRepr::parse(&f[l3..]), ip) {
                if a.op == OP_REQUEST && a.target_ip == me {
                    replies.push((eth.src, a, me));
                }
            }
            return;
        }
        if eth.dst == mac {
            let _ = out.send((start.elapsed(), f.to_vec()));
        }
    });
    for (to, a, me) in replies {
        let reply = ArpRepr {
            op: OP_REPLY,
            sender_mac: mac,
            sender_ip: me,
            target_mac: a.sender_mac,
            target_ip: a.sender_ip,
        };
        let mut buf = [0u8; 64];
        let len = reply.emit_frame(to, &mut buf);
        transmit(port, &buf[..len]);
    }
    for na in adverts {
        transmit(port, &na);
    }
    n
}

impl Link for PortLink {
    fn send(&mut self, frame: &[u8]) {
        let _ = self.to_port.send(frame.to_vec());
    }

    fn recv(&mut self, wait: Duration) -> Option<(Duration, Vec<u8>)> {
        self.from_port.recv_timeout(wait).ok()
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemu_wire::nd::{multicast_mac, solicited_node, NdRepr};

    #[test]
    fn link_local_is_the_modified_eui64_of_the_mac() {
        // RFC 4291 appendix A: 52:54:00:99:ff:02 → fe80::5054:ff:fe99:ff02 (rxevm's peer).
        let mac = Mac([0x52, 0x54, 0x00, 0x99, 0xff, 0x02]);
        assert_eq!(
            link_local(mac),
            "fe80::5054:ff:fe99:ff02".parse::<Ipv6Addr>().unwrap()
        );
    }

    /// A neighbor solicitation from `from` (at `src`) for `target`, multicast as hosts send it.
    fn solicit(from: Mac, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
        let ns = NdRepr::Solicit {
            target,
            source_mac: Some(from),
        };
        let mut buf = [0u8; 128];
        let dst = solicited_node(target);
        let n = ns.emit_frame(from, multicast_mac(dst), src, dst, &mut buf);
        buf[..n].to_vec()
    }

    #[test]
    fn the_port_answers_solicitations_for_the_peers_link_local_address_only() {
        let host = Mac([0x52, 0x54, 0x00, 0x99, 0x00, 0x01]);
        let host_ip = link_local(host);
        let me = link_local(PEER_MAC);
        let f = solicit(host, host_ip, me);
        let na = nd_answer(&f, 14, host, PEER_MAC).expect("an advertisement");
        let (eth, l3) = EthernetRepr::parse(&na).unwrap();
        assert_eq!((eth.src, eth.dst), (PEER_MAC, host));
        let (ip, dgram) = rocemu_wire::ip::Ipv6Repr::parse(&na[l3..]).unwrap();
        assert_eq!((ip.src, ip.dst), (me, host_ip));
        assert_eq!(
            NdRepr::parse(&ip, &dgram[40..]).unwrap(),
            NdRepr::Advert {
                router: false,
                solicited: true,
                override_: true,
                target: me,
                target_mac: Some(PEER_MAC),
            }
        );
        // Another target, or duplicate address detection (from ::), gets nothing.
        let other = solicit(host, host_ip, link_local(DUT_MAC));
        assert!(nd_answer(&other, 14, host, PEER_MAC).is_none());
        let dad = solicit(host, Ipv6Addr::UNSPECIFIED, me);
        assert!(nd_answer(&dad, 14, host, PEER_MAC).is_none());
    }
}
