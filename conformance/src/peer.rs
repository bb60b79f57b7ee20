//! The packet-level peer: plays the remote RNIC of a connection at the level of frames.
//!
//! It crafts requests and responses with `rocemu-wire`'s builder — and, on purpose, frames a
//! correct RNIC never sends (a wrong ICRC, transport version, P_Key, pad count, PSN or opcode
//! sequence) — puts them on the [`Link`], and receives what the device sends back, parsed into
//! owned [`Pkt`]s that scenarios judge field by field. Every frame, both ways, is kept with its
//! timestamp for the pcap a failing scenario leaves behind.
//!
//! Management datagrams (UD to QP1: the IB CM's) are a separate stream: [`Peer::recv`] and what
//! is built on it skip them, [`Peer::recv_mad`] returns them. A device's CM may still be
//! retransmitting to an earlier scenario's peer; that must not count as an answer to a data
//! packet.
use crate::dut::Link;
use rocemu_wire::capture::CaptureWriter;
use rocemu_wire::cm::CmMadRepr;
use rocemu_wire::eth::{EthernetRepr, Mac};
use rocemu_wire::frame::{pad_for, IpRepr};
use rocemu_wire::headers::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, ExtHeaders, RethRepr,
};
use rocemu_wire::mad::MAD_LEN;
use rocemu_wire::{parse_frame, BthRepr, FrameRepr, Opcode, PKey, Psn, QKey, Qpn, RKey, Syndrome};
use rocemu_wire::{Msn, SyndromeKind, ROCEV2_UDP_PORT};
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// The UDP source port of the peer's frames (any port fixed per flow will do: Annex A17.3.2.1,
/// A17.9.4).
const PEER_SPORT: u16 = 0xc0de;

/// A frame to send, as values; [`Craft::build`] turns it into bytes.
#[derive(Debug, Clone)]
pub struct Craft {
    pub repr: FrameRepr,
    pub payload: Vec<u8>,
    /// The pad count to send; by default the one the payload needs.
    pad: Option<u8>,
    bad_icrc: bool,
}

impl Craft {
    pub fn payload(mut self, p: &[u8]) -> Craft {
        self.payload = p.to_vec();
        self
    }
    pub fn ack_req(mut self, on: bool) -> Craft {
        self.repr.bth.ack_req = on;
        self
    }
    pub fn reth(mut self, va: u64, rkey: RKey, dma_len: u32) -> Craft {
        self.repr.ext.reth = Some(RethRepr { va, rkey, dma_len });
        self
    }
    pub fn atomic(mut self, va: u64, rkey: RKey, swap_add: u64, compare: u64) -> Craft {
        self.repr.ext.atomic = Some(AtomicEthRepr {
            va,
            rkey,
            swap_add,
            compare,
        });
        self
    }
    pub fn aeth(mut self, syndrome: Syndrome, msn: u32) -> Craft {
        self.repr.ext.aeth = Some(AethRepr {
            syndrome,
            msn: Msn::new(msn),
        });
        self
    }
    pub fn atomic_ack(mut self, orig: u64) -> Craft {
        self.repr.ext.atomic_ack = Some(AtomicAckEthRepr { orig });
        self
    }
    pub fn imm(mut self, v: u32) -> Craft {
        self.repr.ext.imm = Some(v);
        self
    }
    pub fn deth(mut self, qkey: QKey, src_qpn: Qpn) -> Craft {
        self.repr.ext.deth = Some(DethRepr {
            qkey,
            src_qpn,
            resv: 0,
        });
        self
    }
    /// The BTH transport header version (IBTA 9.2; 0, 9.6.1.1 unverified).
    pub fn tver(mut self, v: u8) -> Craft {
        self.repr.bth.tver = v;
        self
    }
    pub fn pkey(mut self, p: PKey) -> Craft {
        self.repr.bth.pkey = p;
        self
    }
    /// Sends this pad count (with as many zero pad bytes) instead of the one the payload needs.
    pub fn pad(mut self, n: u8) -> Craft {
        self.pad = Some(n & 3);
        self
    }
    /// Flips the ICRC's bits: everything else stays right.
    pub fn bad_icrc(mut self) -> Craft {
        self.bad_icrc = true;
        self
    }
    pub fn psn(&self) -> Psn {
        self.repr.bth.psn
    }

    /// The frame's bytes. A layout the opcode does not allow (a missing RETH) is a bug in the
    /// scenario, reported as a frame that cannot be built.
    pub fn build(&self) -> Result<Vec<u8>, String> {
        let mut r = self.repr;
        r.bth.pad = self.pad.unwrap_or_else(|| pad_for(self.payload.len()));
        let mut buf = vec![0u8; r.frame_len(self.payload.len())];
        let n = r
            .emit_with_payload(&mut buf, &self.payload)
            .map_err(|e| format!("cannot build {}: {e}", r.bth.opcode))?;
        buf.truncate(n);
        if self.bad_icrc {
            let l = buf.len();
            for b in &mut buf[l - 4..] {
                *b ^= 0xff;
            }
        }
        Ok(buf)
    }
}

/// A frame the device sent, parsed, owned.
#[derive(Debug, Clone)]
pub struct Pkt {
    pub at: Duration,
    pub bth: BthRepr,
    pub ext: ExtHeaders,
    pub payload: Vec<u8>,
    pub icrc_ok: bool,
    pub src: IpAddr,
    pub dst: IpAddr,
}

impl Pkt {
    pub fn opcode(&self) -> Opcode {
        self.bth.opcode
    }
    pub fn psn(&self) -> Psn {
        self.bth.psn
    }
    pub fn syndrome(&self) -> Option<Syndrome> {
        self.ext.aeth.map(|a| a.syndrome)
    }
    pub fn msn(&self) -> Option<u32> {
        self.ext.aeth.map(|a| a.msn.value())
    }
    /// A positive ACK (RC_ACKNOWLEDGE with an ACK syndrome).
    pub fn is_ack(&self) -> bool {
        self.opcode() == Opcode::RC_ACKNOWLEDGE && self.syndrome().is_some_and(|s| s.is_ack())
    }
    pub fn is_nak(&self, code: rocemu_wire::NakCode) -> bool {
        self.syndrome()
            .is_some_and(|s| s.kind() == SyndromeKind::Nak(code))
    }
    pub fn rnr_timer(&self) -> Option<u8> {
        match self.syndrome()?.kind() {
            SyndromeKind::RnrNak { timer } => Some(timer),
            _ => None,
        }
    }
}

impl fmt::Display for Pkt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} psn=0x{:06x}", self.bth.opcode, self.bth.psn.value())?;
        if let Some(r) = self.ext.reth {
            write!(
                f,
                " reth(va=0x{:x} rkey=0x{:08x} len={})",
                r.va, r.rkey.0, r.dma_len
            )?;
        }
        if let Some(a) = self.ext.aeth {
            write!(f, " {} msn={}", a.syndrome, a.msn.value())?;
        }
        if let Some(a) = self.ext.atomic_ack {
            write!(f, " orig=0x{:x}", a.orig)?;
        }
        if !self.payload.is_empty() {
            write!(f, " {}B", self.payload.len())?;
        }
        if !self.icrc_ok {
            f.write_str(" BAD-ICRC")?;
        }
        Ok(())
    }
}

/// Several packets, one per line, for failure messages.
pub fn describe(pkts: &[Pkt]) -> String {
    if pkts.is_empty() {
        return "nothing".into();
    }
    pkts.iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The remote end of the device's connections, at the level of frames.
pub struct Peer {
    link: Box<dyn Link>,
    pub mac: Mac,
    pub ip: IpAddr,
    pub dut_mac: Mac,
    pub dut_ip: IpAddr,
    /// How long to listen for frames that should, or should not, come.
    pub settle: Duration,
    /// Every frame both ways: (timestamp, bytes, sent by the peer).
    pub capture: Vec<(Duration, Vec<u8>, bool)>,
}

impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer")
            .field("ip", &self.ip)
            .field("dut_ip", &self.dut_ip)
            .field("frames", &self.capture.len())
            .finish_non_exhaustive()
    }
}

impl Peer {
    pub fn new(link: Box<dyn Link>, me: (Mac, IpAddr), dut: (Mac, IpAddr)) -> Peer {
        Peer {
            link,
            mac: me.0,
            ip: me.1,
            dut_mac: dut.0,
            dut_ip: dut.1,
            settle: Duration::from_millis(50),
            capture: Vec::new(),
        }
    }

    /// The link's clock.
    pub fn now(&self) -> Duration {
        self.link.now()
    }

    /// Gives the link back (an agent target keeps one port for the whole run).
    pub fn into_link(self) -> Box<dyn Link> {
        self.link
    }

    /// A frame of `opcode` to the device's QP `dqpn` at `psn`, with nothing else set.
    pub fn craft(&self, opcode: Opcode, dqpn: Qpn, psn: Psn) -> Craft {
        let ip = IpRepr::roce(self.ip, self.dut_ip, 0, 64, 0);
        Craft {
            repr: FrameRepr {
                eth: EthernetRepr {
                    dst: self.dut_mac,
                    src: self.mac,
                    vlan: None,
                    ethertype: 0,
                },
                ip,
                sport: PEER_SPORT,
                dport: ROCEV2_UDP_PORT,
                bth: BthRepr::new(opcode, dqpn, psn),
                ext: ExtHeaders::default(),
            },
            payload: Vec::new(),
            pad: None,
            bad_icrc: false,
        }
    }

    /// A management datagram for the device's QP1, from the peer's QP1 (a UD SEND_ONLY with the
    /// GSI Q_Key, IBTA 13.5.3.3, unverified).
    pub fn craft_mad(&self, mad: &[u8; MAD_LEN]) -> Craft {
        self.craft(Opcode::UD_SEND_ONLY, Qpn::GSI, Psn::new(0))
            .deth(QKey::GSI, Qpn::GSI)
            .payload(mad)
    }

    /// Sends a crafted frame.
    pub fn send(&mut self, c: &Craft) -> Result<(), String> {
        let f = c.build()?;
        self.send_raw(&f);
        Ok(())
    }

    /// Sends bytes as they are.
    pub fn send_raw(&mut self, frame: &[u8]) {
        self.capture.push((self.link.now(), frame.to_vec(), true));
        self.link.send(frame);
    }

    /// The next RoCEv2 frame the device sends within `wait`, management datagrams aside. Frames
    /// that are not RoCEv2, not for the peer, or for QP1 are recorded and skipped.
    pub fn recv(&mut self, wait: Duration) -> Option<Pkt> {
        self.recv_where(wait, |p| p.bth.dqpn != Qpn::GSI)
    }

    /// The next CM MAD the device's QP1 sends the peer's within `wait` (a UD SEND_ONLY to QP1
    /// whose payload parses as a CM message), with the frame it came in. Every other frame is
    /// recorded and skipped.
    pub fn recv_mad(&mut self, wait: Duration) -> Option<(Pkt, CmMadRepr)> {
        let deadline = self.link.now() + wait;
        loop {
            let left = deadline.saturating_sub(self.link.now());
            let p = self.recv_where(left, |p| {
                p.bth.dqpn == Qpn::GSI && p.bth.opcode == Opcode::UD_SEND_ONLY
            })?;
            if let Ok(m) = CmMadRepr::parse(&p.payload) {
                return Some((p, m));
            }
        }
    }

    fn recv_where(
        &mut self,
        wait: Duration,
        wanted: impl Fn(&rocemu_wire::frame::ParsedFrame<'_>) -> bool,
    ) -> Option<Pkt> {
        let deadline = self.link.now() + wait;
        loop {
            let left = deadline.saturating_sub(self.link.now());
            let (at, f) = self.link.recv(left)?;
            self.capture.push((at, f.clone(), false));
            let Ok(p) = parse_frame(&f) else { continue };
            if p.ip.dst() != self.ip || !wanted(&p) {
                continue;
            }
            return Some(Pkt {
                at,
                bth: p.bth,
                ext: p.ext,
                payload: p.payload.to_vec(),
                icrc_ok: p.icrc_ok(),
                src: p.ip.src(),
                dst: p.ip.dst(),
            });
        }
    }

    /// Everything the device sends within `window` (the settle time when `None`).
    pub fn collect(&mut self, window: Option<Duration>) -> Vec<Pkt> {
        let deadline = self.link.now() + window.unwrap_or(self.settle);
        let mut v = Vec::new();
        while let Some(p) = self.recv(deadline.saturating_sub(self.link.now())) {
            v.push(p);
            if v.len() > 10_000 {
                break;
            }
        }
        v
    }

    /// Fails unless the device stays silent for the settle time.
    pub fn expect_silence(&mut self, why: &str) -> Result<(), String> {
        let v = self.collect(None);
        if v.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{why}: expected no answer within {} ms, got {}",
                self.settle.as_millis(),
                describe(&v)
            ))
        }
    }

    /// The next frame, which must be a positive ACK of `psn`; returns it.
    pub fn expect_ack(&mut self, psn: Psn, why: &str) -> Result<Pkt, String> {
        match self.recv(self.settle) {
            Some(p) if p.is_ack() && p.psn() == psn => Ok(p),
            Some(p) => Err(format!(
                "{why}: expected ACK psn=0x{:06x}, got {p}",
                psn.value()
            )),
            None => Err(format!(
                "{why}: expected ACK psn=0x{:06x}, got nothing within {} ms",
                psn.value(),
                self.settle.as_millis()
            )),
        }
    }

    /// Writes the frames both ways into a pcap file.
    pub fn write_pcap(&self, path: &Path) -> Result<(), String> {
        let mut w = CaptureWriter::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for (t, f, _) in &self.capture {
            w.write(*t, f)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        use std::io::Write;
        w.into_inner()
            .flush()
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}
