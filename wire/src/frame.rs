//! Whole RoCEv2 frames: Ethernet [802.1Q] / IPv4 | IPv6 / UDP 4791 / BTH / extension headers /
//! payload / pad / ICRC (Annex A17.3, Figure 5; CA17-2), parsed in place and built in place.
//!
//! The IP datagram's own length delimits the packet: Ethernet padding after it is ignored. The
//! UDP length must equal the IP payload length.
use crate::error::{BuildError, Error, Layer};
use crate::eth::{EthernetRepr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::headers::{BthHeader, BthRepr, ExtHeaders};
use crate::icrc;
use crate::ip::{Ipv4Repr, Ipv6Repr, IPV6_HEADER_LEN, PROTO_UDP};
use crate::opcode::{len, Opcode};
use crate::types::Qpn;
use core::net::IpAddr;
use zerocopy::FromBytes;

/// The IANA port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
const UDP_HEADER_LEN: usize = 8;

/// The network layer of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    V4(Ipv4Repr),
    V6(Ipv6Repr),
}

impl IpRepr {
    /// The IP header of a RoCEv2 packet from `src` to `dst`: IPv4 when both addresses are, else
    /// IPv6 with any IPv4 address in its mapped form (`::ffff:a.b.c.d`, as a RoCEv2 GID holds it).
    /// DF set, `traffic_class` split into DSCP and ECN; lengths and checksum are the frame
    /// builder's, the IPv4 identification is 0 (set it afterwards where it counts).
    pub fn roce(
        src: IpAddr,
        dst: IpAddr,
        traffic_class: u8,
        hop_limit: u8,
        flow_label: u32,
    ) -> IpRepr {
        let (dscp, ecn) = (traffic_class >> 2, traffic_class & 3);
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
                src,
                dst,
                dscp,
                ecn,
                ident: 0,
                dont_frag: true,
                ttl: hop_limit,
                protocol: PROTO_UDP,
                checksum: 0,
                header_len: 20,
                total_len: 0,
            }),
            (s, d) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V6(a) => a,
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                };
                IpRepr::V6(Ipv6Repr {
                    src: v6(s),
                    dst: v6(d),
                    dscp,
                    ecn,
                    flow_label,
                    payload_len: 0,
                    next_header: PROTO_UDP,
                    hop_limit,
                })
            }
        }
    }

    pub fn src(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => IpAddr::V4(r.src),
            IpRepr::V6(r) => IpAddr::V6(r.src),
        }
    }
    pub fn dst(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => IpAddr::V4(r.dst),
            IpRepr::V6(r) => IpAddr::V6(r.dst),
        }
    }
    pub fn ecn(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.ecn,
            IpRepr::V6(r) => r.ecn,
        }
    }
    pub fn dscp(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.dscp,
            IpRepr::V6(r) => r.dscp,
        }
    }
    pub fn is_v6(&self) -> bool {
        matches!(self, IpRepr::V6(_))
    }
    pub fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.header_len,
            IpRepr::V6(_) => IPV6_HEADER_LEN,
        }
    }
}

/// The UDP header as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    pub sport: u16,
    pub dport: u16,
    pub len: u16,
    pub checksum: u16,
}

/// A well-formed RoCEv2 frame, parsed in place. Field values are as they stand on the wire:
/// checking them against each other (ICRC, IPv4 checksum, RETH length) is the caller's choice.
#[derive(Debug, Clone, Copy)]
pub struct ParsedFrame<'a> {
    pub eth: EthernetRepr,
    pub ip: IpRepr,
    pub udp: UdpRepr,
    pub bth: BthRepr,
    pub ext: ExtHeaders,
    /// The payload, without pad bytes and ICRC.
    pub payload: &'a [u8],
    /// The ICRC bytes as they stand on the wire.
    pub icrc: [u8; 4],
    /// IP header through the ICRC.
    datagram: &'a [u8],
    /// Offset of `payload` within the frame given to the parser.
    payload_offset: usize,
}

impl<'a> ParsedFrame<'a> {
    pub fn opcode(&self) -> Opcode {
        self.bth.opcode
    }
    /// The ICRC the packet should carry.
    pub fn computed_icrc(&self) -> u32 {
        let n = self.datagram.len() - len::ICRC;
        icrc::compute(&self.datagram[..n], self.ip.header_len(), self.ip.is_v6())
    }
    /// True when the ICRC on the wire verifies.
    pub fn icrc_ok(&self) -> bool {
        icrc::to_wire(self.computed_icrc()) == self.icrc
    }
    /// True for IPv6, and for IPv4 when the header checksum verifies.
    #[inline]
    pub fn ip_checksum_ok(&self) -> bool {
        match self.ip {
            IpRepr::V4(r) => crate::ip::ipv4_checksum_ok(&self.datagram[..r.header_len]),
            IpRepr::V6(_) => true,
        }
    }
    /// The pad bytes between the payload and the ICRC.
    pub fn pad_bytes(&self) -> &'a [u8] {
        let end = self.datagram.len() - len::ICRC;
        &self.datagram[end - self.bth.pad as usize..end]
    }
    /// Where the payload starts in the frame that was parsed.
    pub fn payload_offset(&self) -> usize {
        self.payload_offset
    }
    /// The IP datagram: IP header through ICRC (Ethernet padding excluded).
    pub fn datagram(&self) -> &'a [u8] {
        self.datagram
    }
}

/// Parses an Ethernet frame (with an optional 802.1Q tag) holding a RoCEv2 packet.
#[inline(always)]
pub fn parse_frame(frame: &[u8]) -> Result<ParsedFrame<'_>, Error> {
    let (eth, l3) = EthernetRepr::parse(frame)?;
    parse_l3(eth, frame, l3)
}

/// Verifies the ICRC of the RoCEv2 frame in `frame` in one pass over the frame itself (see
/// [`icrc::compute_in_place`]): what a receive path that owns its buffer uses. `None` when the
/// bytes are not a well-formed RoCEv2 frame. The frame is left as it was.
pub fn icrc_ok_in_place(frame: &mut [u8]) -> Option<bool> {
    parse_frame_in_place(frame).ok().map(|(_, ok)| ok)
}

/// Parses a frame in a buffer the caller owns and verifies its ICRC in the same call: one parse
/// and one CRC pass over the frame itself (its variant fields are masked in place and put
/// back, see [`icrc::compute_in_place`]). Returns the parsed frame and whether the ICRC on the
/// wire verifies. The frame is left as it was.
#[inline]
pub fn parse_frame_in_place(frame: &mut [u8]) -> Result<(ParsedFrame<'_>, bool), Error> {
    with_frame_in_place(frame, |r| r.map(|(p, ok)| (*p, ok)))
}

/// [`parse_frame_in_place`], the result handed to `f` (the parsed frame by reference) rather
/// than returned: a parsed frame is some 300 bytes, and returning it through a `Result` copies
/// it, which costs as much as a good part of the parse. What a receive path uses.
#[inline(always)]
pub fn with_frame_in_place<'f, R>(
    frame: &'f mut [u8],
    f: impl FnOnce(Result<(&ParsedFrame<'f>, bool), Error>) -> R,
) -> R {
    // The CRC needs only where the IP datagram starts and ends: found first, the frame hashed
    // in place, then parsed once, immutably, and the parsed frame handed over where it was
    // built (a parse before the CRC would have to copy its values out of the borrow).
    let Some((l3, ihl, v6, end)) = locate(frame) else {
        // Not a frame the parse accepts (`locate` accepts every frame it does).
        let frame: &'f [u8] = frame;
        return match parse_frame(frame) {
            Ok(p) => f(Ok((&p, p.icrc_ok()))),
            Err(e) => f(Err(e)),
        };
    };
    let c = icrc::compute_in_place(frame, l3, ihl, v6, end);
    let frame: &'f [u8] = frame;
    let eth = match EthernetRepr::parse(frame) {
        Ok((eth, _)) => eth,
        Err(e) => return f(Err(e)),
    };
    parse_l3_with(eth, frame, l3, |r| match r {
        Ok(p) => {
            debug_assert_eq!(p.eth.header_len() + p.datagram.len(), end);
            f(Ok((p, icrc::to_wire(c) == p.icrc)))
        }
        Err(e) => f(Err(e)),
    })
}

/// Where the IP datagram of a RoCEv2 frame lies: the IP header's offset and length, IPv6 or
/// not, and the end of the datagram (just past the ICRC), when the frame holds an Ethernet
/// header, an IP header whose length fields fit the frame, and room for the UDP header, a BTH
/// and an ICRC. Every frame [`parse_frame`] accepts passes, with the same values.
#[inline(always)]
fn locate(frame: &[u8]) -> Option<(usize, usize, bool, usize)> {
    let et = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let (l3, et) = if et == crate::eth::ETHERTYPE_VLAN {
        (18, u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]))
    } else {
        (14, et)
    };
    let ip = frame.get(l3..)?;
    let (ihl, v6, dg_len) = match et {
        ETHERTYPE_IPV4 => {
            let b0 = *ip.first()?;
            let hl = (b0 & 0x0f) as usize * 4;
            let total = u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]) as usize;
            (b0 >> 4 == 4 && hl >= 20 && total >= hl && total <= ip.len()).then_some(())?;
            (hl, false, total)
        }
        ETHERTYPE_IPV6 => {
            (ip.len() >= IPV6_HEADER_LEN && ip[0] >> 4 == 6).then_some(())?;
            let total = IPV6_HEADER_LEN + u16::from_be_bytes([ip[4], ip[5]]) as usize;
            (total <= ip.len()).then_some(())?;
            (IPV6_HEADER_LEN, true, total)
        }
        _ => return None,
    };
    (dg_len >= ihl + UDP_HEADER_LEN + len::BTH + len::ICRC).then_some((l3, ihl, v6, l3 + dg_len))
}

/// Parses a bare IP datagram (a capture with a raw-IP link type). `eth` in the result is all
/// zeros but for its EtherType.
pub fn parse_ip_packet(packet: &[u8]) -> Result<ParsedFrame<'_>, Error> {
    let ethertype = match packet.first().map(|b| b >> 4) {
        Some(6) => ETHERTYPE_IPV6,
        _ => ETHERTYPE_IPV4,
    };
    parse_l3(
        EthernetRepr {
            ethertype,
            ..Default::default()
        },
        packet,
        0,
    )
}

#[inline(always)]
fn parse_l3(eth: EthernetRepr, frame: &[u8], l3: usize) -> Result<ParsedFrame<'_>, Error> {
    parse_l3_with(eth, frame, l3, |r| r.copied())
}

/// The parse of everything after the Ethernet header, the result handed to `k`: a parsed frame
/// by reference from where it was built (a `Result` of one, moved out, is a copy of some 300
/// bytes).
#[inline(always)]
fn parse_l3_with<'a, R>(
    eth: EthernetRepr,
    frame: &'a [u8],
    l3: usize,
    k: impl FnOnce(Result<&ParsedFrame<'a>, Error>) -> R,
) -> R {
    let rest = &frame[l3..];
    let (ip, datagram, protocol) = match eth.ethertype {
        ETHERTYPE_IPV4 => {
            let (r, d) = match Ipv4Repr::parse(rest) {
                Ok(x) => x,
                Err(e) => return k(Err(e)),
            };
            (IpRepr::V4(r), d, r.protocol)
        }
        ETHERTYPE_IPV6 => {
            let (r, d) = match Ipv6Repr::parse(rest) {
                Ok(x) => x,
                Err(e) => return k(Err(e)),
            };
            (IpRepr::V6(r), d, r.next_header)
        }
        other => return k(Err(Error::NotIp { ethertype: other })),
    };
    if protocol != PROTO_UDP {
        return k(Err(Error::NotUdp { protocol }));
    }
    let l4 = ip.header_len();
    let ip_payload = datagram.len() - l4;
    if ip_payload < UDP_HEADER_LEN {
        return k(Err(Error::Truncated {
            layer: Layer::Udp,
            need: UDP_HEADER_LEN,
            have: ip_payload,
        }));
    }
    let u = &datagram[l4..];
    let udp = UdpRepr {
        sport: u16::from_be_bytes([u[0], u[1]]),
        dport: u16::from_be_bytes([u[2], u[3]]),
        len: u16::from_be_bytes([u[4], u[5]]),
        checksum: u16::from_be_bytes([u[6], u[7]]),
    };
    if udp.dport != ROCEV2_UDP_PORT {
        return k(Err(Error::NotRocePort { dport: udp.dport }));
    }
    if udp.len as usize != ip_payload {
        return k(Err(Error::UdpLength {
            udp_len: udp.len,
            ip_payload,
        }));
    }
    let t = &u[UDP_HEADER_LEN..];
    let Ok((bth_hdr, _)) = BthHeader::ref_from_prefix(t) else {
        return k(Err(Error::Truncated {
            layer: Layer::Bth,
            need: len::BTH,
            have: t.len(),
        }));
    };
    let opcode = match Opcode::new(bth_hdr.opcode_byte()) {
        Ok(o) => o,
        Err(e) => return k(Err(e)),
    };
    let info = opcode.info();
    let need = len::BTH + info.ext_len + len::ICRC;
    if t.len() < need {
        return k(Err(Error::Truncated {
            layer: Layer::Transport,
            need,
            have: t.len(),
        }));
    }
    let body = t.len() - need; // payload + pad
    let pad = bth_hdr.pad();
    if pad as usize > body {
        return k(Err(Error::PadExceedsPayload { pad, payload: body }));
    }
    let p0 = len::BTH + info.ext_len;
    let payload = &t[p0..p0 + body - pad as usize];
    let n = t.len();
    let icrc = [t[n - 4], t[n - 3], t[n - 2], t[n - 1]];
    // The BTH and extension headers are read straight into the parsed frame: built apart and
    // moved in, they were copied.
    k(Ok(&ParsedFrame {
        eth,
        ip,
        udp,
        bth: BthRepr::from_header(bth_hdr, opcode),
        ext: ExtHeaders::parse(info, &t[len::BTH..]),
        payload,
        icrc,
        datagram,
        payload_offset: l3 + l4 + UDP_HEADER_LEN + p0,
    }))
}

/// The destination QP of a RoCEv2 frame, read at fixed offsets as a NIC's flow steering reads
/// it (Ethernet, IPv4 with its IHL or IPv6 without extension headers, UDP to port 4791, the
/// BTH's DestQP), without parsing or checking the rest; `None` for anything else. A frame it
/// names a QP for may still be malformed: the receive path decides that.
pub fn dest_qpn(frame: &[u8]) -> Option<Qpn> {
    let mut l3 = 14;
    let mut ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if ethertype == crate::eth::ETHERTYPE_VLAN {
        ethertype = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        l3 = 18;
    }
    let (proto, l4) = match ethertype {
        ETHERTYPE_IPV4 => {
            let ihl = usize::from(frame.get(l3)? & 0x0f) * 4;
            (*frame.get(l3 + 9)?, l3 + ihl.max(20))
        }
        ETHERTYPE_IPV6 => (*frame.get(l3 + 6)?, l3 + 40),
        _ => return None,
    };
    if proto != 17 {
        return None;
    }
    let dport = u16::from_be_bytes([*frame.get(l4 + 2)?, *frame.get(l4 + 3)?]);
    if dport != ROCEV2_UDP_PORT {
        return None;
    }
    let b = l4 + 8;
    let q = frame.get(b + 5..b + 8)?;
    Some(Qpn::new(u32::from_be_bytes([0, q[0], q[1], q[2]])))
}

/// The UDP source port of a QP without a peer (UD, QP1), as rxe derives it: 0xC000 | the top 14
/// bits of `qpn × 0x61C88647` (the kernel's `hash_32`). Annex A17.3.2.1 and A17.9.4 only ask that
/// the port be fixed per flow and drawn from 0xC000..=0xFFFF, so that ECMP keeps a flow on one
/// path.
pub fn udp_sport_for_qpn(qpn: Qpn) -> u16 {
    0xc000 | (qpn.value().wrapping_mul(0x61c8_8647) >> 18) as u16
}

/// The RoCEv2 flow label of a connection when none was set: the kernel's
/// `rdma_calc_flow_label(lqpn, rqpn)`.
pub fn flow_label_for(lqpn: Qpn, rqpn: Qpn) -> u32 {
    let mut v = lqpn.value() as u64 * rqpn.value() as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xf_ffff) as u32
}

/// The UDP source port of a connected QP (RC, UC), as rxe and the kernel's
/// `rdma_get_udp_sport` derive it from the flow label (computed from both QPNs when 0): the low
/// 14 bits folded with the high 6, in 0xC000..=0xFFFF. Both ends of a QP pair use the same port.
pub fn udp_sport_for_flow(flow_label: u32, lqpn: Qpn, rqpn: Qpn) -> u16 {
    let fl = if flow_label & 0xf_ffff == 0 {
        flow_label_for(lqpn, rqpn)
    } else {
        flow_label & 0xf_ffff
    };
    let lo = (fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14);
    0xc000 | lo as u16
}

/// Everything needed to build one frame: the headers as values. The payload comes separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr {
    /// The EtherType is set by `emit` from the IP version.
    pub eth: EthernetRepr,
    /// Lengths, protocol and the IPv4 checksum are set by `emit`.
    pub ip: IpRepr,
    pub sport: u16,
    pub dport: u16,
    pub bth: BthRepr,
    pub ext: ExtHeaders,
}

impl FrameRepr {
    /// The values of a parsed frame, to rebuild it.
    pub fn from_parsed(p: &ParsedFrame<'_>) -> FrameRepr {
        FrameRepr {
            eth: p.eth,
            ip: p.ip,
            sport: p.udp.sport,
            dport: p.udp.dport,
            bth: p.bth,
            ext: p.ext,
        }
    }

    fn ip_emit_header_len(&self) -> usize {
        match self.ip {
            IpRepr::V4(_) => crate::ip::IPV4_MIN_HEADER_LEN,
            IpRepr::V6(_) => IPV6_HEADER_LEN,
        }
    }

    /// Bytes of the frame for a payload of `payload_len` bytes (with the BTH's pad count).
    pub fn frame_len(&self, payload_len: usize) -> usize {
        self.eth.header_len()
            + self.ip_emit_header_len()
            + UDP_HEADER_LEN
            + self.transport_len(payload_len)
    }

    fn transport_len(&self, payload_len: usize) -> usize {
        len::BTH + self.bth.opcode.info().ext_len + payload_len + self.bth.pad as usize + len::ICRC
    }

    /// Writes the frame at the front of `buf`: headers with every length, the IPv4 checksum
    /// (IPv4 headers are built without options), `payload_len` payload bytes written by
    /// `fill`, `bth.pad` zero pad bytes, and the ICRC. The UDP checksum is 0 (Annex A17.3.2.4
    /// allows it for IPv4; RoCE NICs send 0 on IPv6 too). Returns the frame length.
    pub fn emit(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill: impl FnOnce(&mut icrc::Payload<'_>),
    ) -> Result<usize, BuildError> {
        let info = self.bth.opcode.info();
        self.ext.check_layout(info)?;
        if self.bth.pad > 3 {
            return Err(BuildError::Invalid("pad count above 3"));
        }
        let total = self.frame_len(payload_len);
        if buf.len() < total {
            return Err(BuildError::BufferTooSmall {
                need: total,
                have: buf.len(),
            });
        }
        let l3 = self.eth.header_len();
        let ihl = self.ip_emit_header_len();
        let udp_len = UDP_HEADER_LEN + self.transport_len(payload_len);
        if ihl + udp_len > u16::MAX as usize {
            return Err(BuildError::TooLong { len: ihl + udp_len });
        }
        let buf = &mut buf[..total];
        let mut eth = self.eth;
        eth.ethertype = if self.ip.is_v6() {
            ETHERTYPE_IPV6
        } else {
            ETHERTYPE_IPV4
        };
        eth.emit(buf);
        match self.ip {
            IpRepr::V4(mut r) => {
                r.total_len = (ihl + udp_len) as u16;
                r.protocol = PROTO_UDP;
                r.emit(&mut buf[l3..]);
            }
            IpRepr::V6(mut r) => {
                r.payload_len = udp_len as u16;
                r.next_header = PROTO_UDP;
                r.emit(&mut buf[l3..]);
            }
        }
        let u = l3 + ihl;
        buf[u..u + 2].copy_from_slice(&self.sport.to_be_bytes());
        buf[u + 2..u + 4].copy_from_slice(&self.dport.to_be_bytes());
        buf[u + 4..u + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        buf[u + 6..u + 8].fill(0);
        let v6 = self.ip.is_v6();
        emit_transport(
            buf,
            u + UDP_HEADER_LEN,
            (l3, ihl, v6),
            &self.bth,
            &self.ext,
            payload_len,
            fill,
            true,
        );
        Ok(total)
    }

    /// Like [`FrameRepr::emit`], with the payload copied from a slice.
    pub fn emit_with_payload(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize, BuildError> {
        self.emit(buf, payload.len(), |dst| dst.copy_from_slice(payload))
    }
}

/// Writes what follows the UDP header at `b` in `buf` (which is exactly the frame): the BTH, the
/// extension headers, `payload_len` bytes from `fill`, the zero pad and the ICRC, computed in
/// place over the frame whose IP header is at `ip.0` (`ip.1` bytes long, IPv6 when `ip.2`), or
/// zero without `icrc`. The caller checked the layout and the lengths.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn emit_transport(
    buf: &mut [u8],
    b: usize,
    ip: (usize, usize, bool),
    bth: &BthRepr,
    ext: &ExtHeaders,
    payload_len: usize,
    fill: impl FnOnce(&mut icrc::Payload<'_>),
    icrc: bool,
) {
    let info = bth.opcode.info();
    bth.emit(&mut buf[b..]);
    let e = b + len::BTH;
    let p = e + ext.emit(info, &mut buf[e..]);
    emit_payload(buf, p, payload_len, bth.pad, ip, fill, icrc);
}

/// The end of a packet whose headers are written up to `p`: `payload_len` bytes from `fill`
/// (hashed as they are copied where they can be, see [`icrc::Payload`]), `pad` zero bytes and
/// the ICRC (zero without `icrc`). The tail of both builders, [`FrameRepr::emit`]'s and the
/// header template's.
#[inline(always)]
pub(crate) fn emit_payload(
    buf: &mut [u8],
    p: usize,
    payload_len: usize,
    pad: u8,
    ip: (usize, usize, bool),
    fill: impl FnOnce(&mut icrc::Payload<'_>),
    icrc: bool,
) {
    let mut payload = icrc::Payload::new(&mut buf[..p + payload_len], p, icrc.then_some(ip));
    fill(&mut payload);
    let hashed = payload.hashed();
    let pad_end = p + payload_len + pad as usize;
    // At most three bytes: a loop, not a memset call (most packets have none).
    for b in &mut buf[p + payload_len..pad_end] {
        *b = 0;
    }
    let c = if icrc {
        icrc::to_wire(icrc::finish(
            buf,
            ip,
            hashed,
            p + payload_len,
            pad_end + len::ICRC,
        ))
    } else {
        [0; 4]
    };
    buf[pad_end..pad_end + len::ICRC].copy_from_slice(&c);
}

/// The pad count that brings a payload to a multiple of four bytes (IBTA 9.2: PadCnt).
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - (payload_len & 3)) & 3) as u8
}
