//! DCQCN's notification point (NP): when to answer a CE-marked packet with a CNP
//! ([`CnpPacer`]), and the CNP frame itself ([`build_cnp`]).
//!
//! The pacer allows at most one CNP per QP per `min_time_between_cnps` (mlx5's NP parameter,
//! µs; the default 4 µs). Its memory is a fixed table chosen at creation, direct-mapped
//! by QPN: two QPs that share an entry evict each other, and a QP whose entry was taken gets its
//! CNP at once — a collision can only send *more* CNPs than one per period to those QPs, never
//! leave a CE mark unanswered for longer than the period. (The RNIC keeps the time of each QP's
//! last CNP in the QP instead, with no collisions; the table is for a QP-less caller such as a
//! fabric simulator's switch model.)
//!
//! The CNP is the ConnectX one of the project's capture `wire/tests/data/cx4lx_cnp.pcap`
//! (ConnectX-4 Lx, from Scapy's tests; see its `PROVENANCE.md`): BTH opcode 0x81, BECN set, P_Key
//! 0xFFFF (the marked packet's, as Annex A17.9.3's Figure 6 asks: [`CnpFields::pkey`]), the
//! destination QP the one being throttled, PSN 0, A=0, 16 reserved zero bytes, the ICRC; IPv4 DF set with the CNP DSCP (`cnp_dscp`, 48 there) and ECN ECT(0); UDP source port 0 and
//! checksum 0 in that capture. The 802.1p priority (`cnp_802p_prio`, 6 by default) is in the 802.1Q
//! tag when the CNP goes out on a VLAN; the capture has no tag, so that field is unverified against
//! ConnectX. Annex A17.9.3's Figure 6 (the CNP format) agrees on every BTH field it names
//! (opcode, DestQP, PSN 0, SE 0, M 0, P_Key, 16 reserved zero bytes); BECN is not among them.
use crate::time::Nanos;
use core::net::IpAddr;
use rocemu_wire::eth::{EthernetRepr, Mac, VlanTag};
use rocemu_wire::{BthRepr, BuildError, ExtHeaders, FrameRepr, IpRepr, Opcode, PKey, Psn, Qpn};

/// CNP pacing per QP in a fixed table.
#[derive(Debug, Clone)]
pub struct CnpPacer {
    slots: Box<[Option<(Qpn, Nanos)>]>,
    min_gap: Nanos,
}

impl CnpPacer {
    /// A pacer of `entries` (at least 1) QPs, one CNP per `min_time_between_cnps_us` each.
    pub fn new(entries: usize, min_time_between_cnps_us: u32) -> CnpPacer {
        CnpPacer {
            slots: vec![None; entries.max(1)].into_boxed_slice(),
            min_gap: Nanos::from_micros(u64::from(min_time_between_cnps_us)),
        }
    }

    /// The table's size.
    pub fn entries(&self) -> usize {
        self.slots.len()
    }

    /// A CE-marked packet for `qpn` arrived at `now`: whether to send a CNP for it now.
    pub fn on_ce(&mut self, qpn: Qpn, now: Nanos) -> bool {
        let i = qpn.value() as usize % self.slots.len();
        let slot = &mut self.slots[i];
        match *slot {
            Some((q, last)) if q == qpn && now.saturating_sub(last) < self.min_gap => false,
            _ => {
                *slot = Some((qpn, now));
                true
            }
        }
    }
}

/// The fields of a CNP: addresses, the throttled QP and the NP's marking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CnpFields {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    /// The QP being throttled (the sender's QP).
    pub dqpn: Qpn,
    /// The BTH P_Key of the CE-marked packet: Annex A17.9.3's Figure 6 has the CNP carry "the
    /// same value as in the BTH of the ECN packet marked" (0xFFFF in the ConnectX capture).
    pub pkey: PKey,
    /// `cnp_dscp`.
    pub dscp: u8,
    /// The ECN field (ConnectX's CNP carries ECT(0), 0b10).
    pub ecn: u8,
    /// The VLAN ID when the CNP goes out tagged; the tag's PCP is `prio`.
    pub vlan: Option<u16>,
    /// `cnp_802p_prio`.
    pub prio: u8,
    pub ttl: u8,
    /// The IPv4 identification (ignored on IPv6).
    pub ip_ident: u16,
    pub udp_sport: u16,
    /// IPv6 flow label (ignored on IPv4).
    pub flow_label: u32,
}

/// Writes the CNP at the front of `buf`; its length (74 bytes untagged on IPv4).
pub fn build_cnp(buf: &mut [u8], f: &CnpFields) -> Result<usize, BuildError> {
    let mut ip = IpRepr::roce(
        f.src_ip,
        f.dst_ip,
        (f.dscp & 0x3f) << 2 | (f.ecn & 3),
        f.ttl,
        f.flow_label,
    );
    if let IpRepr::V4(r) = &mut ip {
        r.ident = f.ip_ident;
    }
    let mut bth = BthRepr::new(Opcode::CNP, f.dqpn, Psn::new(0));
    bth.becn = true;
    bth.pkey = f.pkey;
    let repr = FrameRepr {
        eth: EthernetRepr {
            dst: f.dst_mac,
            src: f.src_mac,
            vlan: f.vlan.map(|vid| VlanTag {
                pcp: f.prio & 7,
                dei: false,
                vid: vid & 0xfff,
            }),
            ethertype: 0,
        },
        ip,
        sport: f.udp_sport,
        dport: rocemu_wire::ROCEV2_UDP_PORT,
        bth,
        ext: ExtHeaders::default(),
    };
    repr.emit(buf, 0, |_| {})
}
