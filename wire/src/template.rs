//! Header templates: the bytes every packet of one flow shares, emitted once.
//!
//! A connected QP (RC, UC) sends every packet to one peer, so its Ethernet header, its IP header
//! but for the lengths (and IPv4's identification and checksum) and its UDP header but for the
//! length are the same from packet to packet. A [`HeaderTemplate`] holds those bytes;
//! [`HeaderTemplate::emit`] copies them, patches what varies — the IPv4 checksum incrementally
//! (RFC 1071's sum, taken once over the fixed words) — and writes the BTH, the extension
//! headers, the payload, the pad and the ICRC.
//!
//! Invariant: the frame is byte for byte what [`FrameRepr::emit`] builds from the same values
//! (the property test `template_matches_frame_repr` holds it to that), so a template is a cache
//! of values, never a second encoding of the wire format; but for a template made
//! [`HeaderTemplate::without_icrc`], whose frames carry a zero ICRC.
use crate::error::BuildError;
use crate::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::frame::{emit_payload, emit_transport, FrameRepr, IpRepr};
use crate::headers::{BthRepr, ExtHeaders, RethRepr};
use crate::icrc;
use crate::ip::{word_sum, IPV4_MIN_HEADER_LEN, IPV6_HEADER_LEN, PROTO_UDP};
use crate::opcode::{hdr, len};

const UDP_LEN: usize = 8;
/// Ethernet with an 802.1Q tag, IPv6, UDP.
const MAX_HEAD: usize = 18 + IPV6_HEADER_LEN + UDP_LEN;
/// The usual heads: untagged Ethernet with IPv4 or IPv6, then UDP.
const HEAD_V4: usize = 14 + IPV4_MIN_HEADER_LEN + UDP_LEN;
const HEAD_V6: usize = 14 + IPV6_HEADER_LEN + UDP_LEN;

/// The Ethernet, IP and UDP headers of one flow as bytes, ready to be stamped on each packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTemplate {
    head: [u8; MAX_HEAD],
    /// Bytes of `head` in use: Ethernet + IP + UDP.
    len: u8,
    /// Where the IP header starts.
    l3: u8,
    v6: bool,
    /// IPv4: the sum of the header's 16-bit words with total length, identification and checksum
    /// taken as zero; each packet adds its two and folds.
    csum_base: u32,
    /// Compute each packet's ICRC (else it is left zero).
    icrc: bool,
}

impl HeaderTemplate {
    /// The template of the flow `repr` describes: its Ethernet header, IP header (built without
    /// options, as `FrameRepr::emit` builds it) and UDP ports. Its BTH and extension headers are
    /// not part of it: each packet brings its own.
    pub fn new(repr: &FrameRepr) -> HeaderTemplate {
        let mut head = [0u8; MAX_HEAD];
        let mut eth = repr.eth;
        eth.ethertype = if repr.ip.is_v6() {
            ETHERTYPE_IPV6
        } else {
            ETHERTYPE_IPV4
        };
        eth.emit(&mut head);
        let l3 = eth.header_len();
        let (ihl, csum_base) = match repr.ip {
            IpRepr::V4(mut r) => {
                r.total_len = 0;
                r.ident = 0;
                r.protocol = PROTO_UDP;
                r.emit(&mut head[l3..]);
                head[l3 + 10..l3 + 12].fill(0);
                (
                    IPV4_MIN_HEADER_LEN,
                    word_sum(&head[l3..l3 + IPV4_MIN_HEADER_LEN]),
                )
            }
            IpRepr::V6(mut r) => {
                r.payload_len = 0;
                r.next_header = PROTO_UDP;
                r.emit(&mut head[l3..]);
                (IPV6_HEADER_LEN, 0)
            }
        };
        let u = l3 + ihl;
        head[u..u + 2].copy_from_slice(&repr.sport.to_be_bytes());
        head[u + 2..u + 4].copy_from_slice(&repr.dport.to_be_bytes());
        HeaderTemplate {
            head,
            len: (u + UDP_LEN) as u8,
            l3: l3 as u8,
            v6: repr.ip.is_v6(),
            csum_base,
            icrc: true,
        }
    }

    /// The same template, its packets' ICRC left zero instead of computed: for a simulation
    /// whose links corrupt nothing and whose receivers do not check ICRCs, never for a wire (a
    /// peer that checks drops every such packet).
    pub fn without_icrc(mut self) -> HeaderTemplate {
        self.icrc = false;
        self
    }

    /// True for an IPv6 flow (no identification to give).
    pub fn is_v6(&self) -> bool {
        self.v6
    }

    /// Bytes of the frame for this BTH's opcode and pad and `payload_len` payload bytes.
    pub fn frame_len(&self, bth: &BthRepr, payload_len: usize) -> usize {
        self.len as usize + transport_len(bth, payload_len)
    }

    /// Writes one packet of the flow at the front of `buf`: the template's headers with every
    /// length filled in, `ident` as the IPv4 identification (ignored for IPv6) and the IPv4
    /// checksum, then `bth`, `ext`, `payload_len` payload bytes written by `fill`, `bth.pad`
    /// zero pad bytes and the ICRC. Returns the frame length. The same checks as
    /// [`FrameRepr::emit`]: the headers must be the ones the opcode's layout has.
    #[inline]
    pub fn emit(
        &self,
        buf: &mut [u8],
        ident: u16,
        bth: &BthRepr,
        ext: &ExtHeaders,
        payload_len: usize,
        fill: impl FnOnce(&mut icrc::Payload<'_>),
    ) -> Result<usize, BuildError> {
        let info = bth.opcode.info();
        ext.check_layout(info)?;
        let (total, ip) = self.head(buf, ident, bth, info.ext_len, payload_len)?;
        emit_transport(
            &mut buf[..total],
            self.len as usize,
            ip,
            bth,
            ext,
            payload_len,
            fill,
            self.icrc,
        );
        Ok(total)
    }

    /// [`emit`](Self::emit) for a packet whose only extension headers are a RETH and immediate
    /// data, either, both or neither — a SEND or RDMA WRITE that fits one packet, what a
    /// connected QP sends most — written by a path that knows that layout instead of asking
    /// for each of the eight headers. The same bytes and the same checks (the property test
    /// `emit_only_matches_emit` holds it to that).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn emit_only(
        &self,
        buf: &mut [u8],
        ident: u16,
        bth: &BthRepr,
        reth: Option<&RethRepr>,
        imm: Option<u32>,
        payload_len: usize,
        fill: impl FnOnce(&mut icrc::Payload<'_>),
    ) -> Result<usize, BuildError> {
        let info = bth.opcode.info();
        let has = (if reth.is_some() { hdr::RETH } else { 0 })
            | (if imm.is_some() { hdr::IMM } else { 0 });
        if info.headers & hdr::EXT != has {
            let ext = ExtHeaders {
                reth: reth.copied(),
                imm,
                ..ExtHeaders::default()
            };
            return Err(match ext.check_layout(info) {
                Err(e) => e,
                Ok(()) => BuildError::Invalid("extension headers of another layout"),
            });
        }
        let (total, ip) = self.head(buf, ident, bth, info.ext_len, payload_len)?;
        let buf = &mut buf[..total];
        let b = self.len as usize;
        bth.emit(&mut buf[b..]);
        let mut p = b + len::BTH;
        if let Some(r) = reth {
            r.emit(&mut buf[p..p + len::RETH]);
            p += len::RETH;
        }
        if let Some(i) = imm {
            buf[p..p + len::IMM].copy_from_slice(&i.to_be_bytes());
            p += len::IMM;
        }
        emit_payload(buf, p, payload_len, bth.pad, ip, fill, self.icrc);
        Ok(total)
    }

    /// The checks both emitters make, then the head: the template's headers copied to the
    /// front of `buf` with the lengths, the identification and the IPv4 checksum filled in.
    /// Returns the frame length and the IP header's place (offset, length, IPv6).
    #[inline(always)]
    fn head(
        &self,
        buf: &mut [u8],
        ident: u16,
        bth: &BthRepr,
        ext_len: usize,
        payload_len: usize,
    ) -> Result<(usize, (usize, usize, bool)), BuildError> {
        if bth.pad > 3 {
            return Err(BuildError::Invalid("pad count above 3"));
        }
        let hl = self.len as usize;
        let total = hl + len::BTH + ext_len + payload_len + bth.pad as usize + len::ICRC;
        if buf.len() < total {
            return Err(BuildError::BufferTooSmall {
                need: total,
                have: buf.len(),
            });
        }
        let (l3, v6) = (self.l3 as usize, self.v6);
        let ihl = if v6 {
            IPV6_HEADER_LEN
        } else {
            IPV4_MIN_HEADER_LEN
        };
        let udp_len = total - l3 - ihl;
        if ihl + udp_len > u16::MAX as usize {
            return Err(BuildError::TooLong { len: ihl + udp_len });
        }
        let buf = &mut buf[..total];
        // Fixed-size copies for the usual heads: a few vector moves instead of a memcpy call.
        match hl {
            HEAD_V4 => buf[..HEAD_V4].copy_from_slice(&self.head[..HEAD_V4]),
            HEAD_V6 => buf[..HEAD_V6].copy_from_slice(&self.head[..HEAD_V6]),
            _ => buf[..hl].copy_from_slice(&self.head[..hl]),
        }
        if v6 {
            buf[l3 + 4..l3 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        } else {
            let total_len = (ihl + udp_len) as u16;
            buf[l3 + 2..l3 + 4].copy_from_slice(&total_len.to_be_bytes());
            buf[l3 + 4..l3 + 6].copy_from_slice(&ident.to_be_bytes());
            let mut sum = self.csum_base + total_len as u32 + ident as u32;
            sum = (sum & 0xffff) + (sum >> 16);
            sum = (sum & 0xffff) + (sum >> 16);
            buf[l3 + 10..l3 + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        let u = l3 + ihl;
        buf[u + 4..u + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        Ok((total, (l3, ihl, v6)))
    }
}

#[inline]
fn transport_len(bth: &BthRepr, payload_len: usize) -> usize {
    len::BTH + bth.opcode.info().ext_len + payload_len + bth.pad as usize + len::ICRC
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eth::{EthernetRepr, Mac, VlanTag};
    use crate::frame::pad_for;
    use crate::headers::{AethRepr, DethRepr, RethRepr};
    use crate::{Msn, Opcode, PKey, Psn, QKey, Qpn, RKey, Syndrome, ROCEV2_UDP_PORT};
    use proptest::prelude::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    fn repr(src: IpAddr, dst: IpAddr, vlan: Option<u16>, tc: u8, ttl: u8, fl: u32) -> FrameRepr {
        let mut ip = IpRepr::roce(src, dst, tc, ttl, fl);
        if let IpRepr::V4(r) = &mut ip {
            r.ident = 0x1234;
        }
        FrameRepr {
            eth: EthernetRepr {
                dst: Mac([2, 0, 0, 0, 0, 2]),
                src: Mac([2, 0, 0, 0, 0, 1]),
                vlan: vlan.map(|vid| VlanTag {
                    pcp: 3,
                    dei: false,
                    vid,
                }),
                ethertype: 0,
            },
            ip,
            sport: 0xc123,
            dport: ROCEV2_UDP_PORT,
            bth: BthRepr::new(Opcode::RC_ACKNOWLEDGE, Qpn::new(0x11), Psn::new(5)),
            ext: ExtHeaders {
                aeth: Some(AethRepr {
                    syndrome: Syndrome(0x1f),
                    msn: Msn::new(3),
                }),
                ..Default::default()
            },
        }
    }

    /// Emits `r` both ways into buffers pre-filled with different junk; both must agree.
    fn both(r: &FrameRepr, payload: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let ident = match r.ip {
            IpRepr::V4(v) => v.ident,
            IpRepr::V6(_) => 0,
        };
        let mut a = vec![0xa5u8; 9100];
        let n = r.emit_with_payload(&mut a, payload).unwrap();
        a.truncate(n);
        let t = HeaderTemplate::new(r);
        let mut b = vec![0x5au8; 9100];
        let m = t
            .emit(&mut b, ident, &r.bth, &r.ext, payload.len(), |d| {
                d.copy_from_slice(payload)
            })
            .unwrap();
        b.truncate(m);
        assert_eq!(t.frame_len(&r.bth, payload.len()), m);
        (a, b)
    }

    #[test]
    fn ack_v4_and_v6_match_frame_repr() {
        let v4 = repr(
            Ipv4Addr::new(10, 0, 0, 1).into(),
            Ipv4Addr::new(10, 0, 0, 2).into(),
            None,
            0,
            64,
            0,
        );
        let (a, b) = both(&v4, &[]);
        assert_eq!(a, b);
        let v6 = repr(
            "fd00::1".parse::<Ipv6Addr>().unwrap().into(),
            "fd00::2".parse::<Ipv6Addr>().unwrap().into(),
            Some(7),
            0x8a,
            3,
            0xabcde,
        );
        let (a, b) = both(&v6, &[]);
        assert_eq!(a, b);
        assert!(crate::parse_frame(&b).unwrap().icrc_ok());
    }

    #[test]
    fn wrong_layout_and_small_buffer_are_errors() {
        let r = repr(
            Ipv4Addr::new(10, 0, 0, 1).into(),
            Ipv4Addr::new(10, 0, 0, 2).into(),
            None,
            0,
            64,
            0,
        );
        let t = HeaderTemplate::new(&r);
        let mut buf = [0u8; 256];
        let bad = ExtHeaders::default();
        assert!(matches!(
            t.emit(&mut buf, 0, &r.bth, &bad, 0, |_| {}),
            Err(BuildError::LayoutMismatch { .. })
        ));
        let mut small = [0u8; 40];
        assert!(matches!(
            t.emit(&mut small, 0, &r.bth, &r.ext, 0, |_| {}),
            Err(BuildError::BufferTooSmall { need: 62, have: 40 })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Any flow, any WRITE packet: the template builds the same bytes as `FrameRepr::emit`.
        #[test]
        fn template_matches_frame_repr(
            v6 in any::<bool>(), vlan in proptest::option::of(0u16..4095),
            a in any::<[u8; 16]>(), b in any::<[u8; 16]>(),
            tc in any::<u8>(), ttl in any::<u8>(), fl in 0u32..1 << 20, ident in any::<u16>(),
            op in prop::sample::select(vec![Opcode::RC_RDMA_WRITE_FIRST, Opcode::RC_RDMA_WRITE_ONLY, Opcode::UC_RDMA_WRITE_ONLY]),
            psn in 0u32..1 << 24, ack_req in any::<bool>(), va in any::<u64>(), rkey in any::<u32>(),
            payload in proptest::collection::vec(any::<u8>(), 0..1100),
        ) {
            let (src, dst): (IpAddr, IpAddr) = if v6 {
                (Ipv6Addr::from(a).into(), Ipv6Addr::from(b).into())
            } else {
                (Ipv4Addr::new(a[0], a[1], a[2], a[3]).into(), Ipv4Addr::new(b[0], b[1], b[2], b[3]).into())
            };
            let mut r = repr(src, dst, vlan, tc, ttl, fl);
            if let IpRepr::V4(v) = &mut r.ip {
                v.ident = ident;
            }
            r.bth = BthRepr::new(op, Qpn::new(0xabcdef), Psn::new(psn));
            r.bth.pkey = PKey::DEFAULT;
            r.bth.ack_req = ack_req;
            r.bth.pad = pad_for(payload.len());
            r.ext = ExtHeaders {
                reth: Some(RethRepr { va, rkey: RKey(rkey), dma_len: payload.len() as u32 }),
                ..Default::default()
            };
            let (x, y) = both(&r, &payload);
            prop_assert_eq!(x, y);
        }

        /// Any flow, any SEND or WRITE that fits one packet, with immediate data or not, SE
        /// or not: `emit_only` builds what `emit` builds, into buffers of different junk.
        #[test]
        fn emit_only_matches_emit(
            v6 in any::<bool>(), vlan in proptest::option::of(0u16..4095),
            tc in any::<u8>(), ident in any::<u16>(), icrc in any::<bool>(),
            op in prop::sample::select(vec![
                Opcode::RC_SEND_ONLY, Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                Opcode::RC_RDMA_WRITE_ONLY, Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                Opcode::UC_SEND_ONLY, Opcode::UC_SEND_ONLY_WITH_IMMEDIATE,
                Opcode::UC_RDMA_WRITE_ONLY, Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            ]),
            psn in 0u32..1 << 24, ack_req in any::<bool>(), se in any::<bool>(),
            va in any::<u64>(), rkey in any::<u32>(), imm in any::<u32>(),
            payload in proptest::collection::vec(any::<u8>(), 0..1100),
        ) {
            let (src, dst): (IpAddr, IpAddr) = if v6 {
                ("fd00::1".parse::<Ipv6Addr>().unwrap().into(), "fd00::2".parse::<Ipv6Addr>().unwrap().into())
            } else {
                (Ipv4Addr::new(10, 0, 0, 1).into(), Ipv4Addr::new(10, 0, 0, 2).into())
            };
            let r = repr(src, dst, vlan, tc, 64, 0);
            let mut t = HeaderTemplate::new(&r);
            if !icrc {
                t = t.without_icrc();
            }
            let mut bth = BthRepr::new(op, Qpn::new(0x12345), Psn::new(psn));
            bth.ack_req = ack_req;
            bth.solicited = se;
            bth.pad = pad_for(payload.len());
            let info = op.info();
            let reth = info.has(crate::opcode::hdr::RETH)
                .then_some(RethRepr { va, rkey: RKey(rkey), dma_len: payload.len() as u32 });
            let imm = info.has(crate::opcode::hdr::IMM).then_some(imm);
            let ext = ExtHeaders { reth, imm, ..Default::default() };
            let mut x = vec![0xa5u8; 1300];
            let n = t.emit(&mut x, ident, &bth, &ext, payload.len(), |d| d.copy_from_slice(&payload)).unwrap();
            let mut y = vec![0x5au8; 1300];
            let m = t.emit_only(&mut y, ident, &bth, reth.as_ref(), imm, payload.len(), |d| d.copy_from_slice(&payload)).unwrap();
            prop_assert_eq!(&x[..n], &y[..m]);
            // A layout the opcode does not have is the same error both ways.
            let wrong = if reth.is_some() { None } else { Some(RethRepr::default()) };
            let bad = ExtHeaders { reth: wrong, imm, ..Default::default() };
            prop_assert_eq!(
                t.emit(&mut x, ident, &bth, &bad, 0, |_| {}).unwrap_err(),
                t.emit_only(&mut y, ident, &bth, wrong.as_ref(), imm, 0, |_| {}).unwrap_err()
            );
        }

        /// A payload copied in pieces through `CopyIn` (hashed as it is copied, from
        /// `icrc::FUSE_MIN` bytes on a CPU with the wide kernel) gives the frame a payload
        /// written directly gives (hashed with the frame after the fill), by both emitters, for
        /// any flow and any split; pieces copied out of order fall back and agree too.
        #[test]
        fn hashed_as_copied_matches_written(
            v6 in any::<bool>(), vlan in proptest::option::of(0u16..4095),
            kind in 0usize..5, ident in any::<u16>(), psn in 0u32..1 << 24,
            payload in proptest::collection::vec(any::<u8>(), 0..4300),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
            reversed in any::<bool>(),
        ) {
            let (src, dst): (IpAddr, IpAddr) = if v6 {
                ("fd00::1".parse::<Ipv6Addr>().unwrap().into(), "fd00::2".parse::<Ipv6Addr>().unwrap().into())
            } else {
                (Ipv4Addr::new(10, 0, 0, 1).into(), Ipv4Addr::new(10, 0, 0, 2).into())
            };
            let t = HeaderTemplate::new(&repr(src, dst, vlan, 0x68, 64, 0));
            // Headers after the BTH of 16, 0, 20, 4 and 12 bytes: heads up to the payload (LRH
            // stand-in included) of 64, 48, 68, 52 and 60 bytes over IPv4 and 84, 68, 88, 72 and
            // 80 over IPv6, so every length a head can have modulo 16 (0, 4, 8, 12) on both.
            let (op, with_reth, imm, ud) = [
                (Opcode::RC_RDMA_WRITE_FIRST, true, None, false),
                (Opcode::RC_RDMA_WRITE_MIDDLE, false, None, false),
                (Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, true, Some(0x1234_5678), false),
                (Opcode::RC_SEND_LAST_WITH_IMMEDIATE, false, Some(0x9abc_def0), false),
                (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, false, Some(0x0bad_cafe), true),
            ][kind];
            let mut bth = BthRepr::new(op, Qpn::new(0x4321), Psn::new(psn));
            bth.pad = pad_for(payload.len());
            let reth = with_reth.then_some(RethRepr { va: 0x1000, rkey: RKey(7), dma_len: 1 << 16 });
            let deth = ud.then_some(DethRepr { qkey: QKey(0x1111_0000), src_qpn: Qpn::new(0x77), resv: 0 });
            let ext = ExtHeaders { reth, imm, deth, ..Default::default() };
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(payload.len() + 1)).collect();
            at.extend([0, payload.len()]);
            at.sort_unstable();
            let mut pieces: Vec<(usize, usize)> = at.windows(2).map(|w| (w[0], w[1])).collect();
            if reversed {
                pieces.reverse();
            }
            let copy = |d: &mut icrc::Payload<'_>| {
                for &(a, b) in &pieces {
                    icrc::CopyIn::copy_in(d, a, &payload[a..b]);
                }
            };
            let mut want = vec![0xa5u8; 4500];
            let n = t.emit(&mut want, ident, &bth, &ext, payload.len(), |d| d.copy_from_slice(&payload)).unwrap();
            let mut x = vec![0x5au8; 4500];
            let m = t.emit(&mut x, ident, &bth, &ext, payload.len(), copy).unwrap();
            prop_assert_eq!(&want[..n], &x[..m]);
            prop_assert!(crate::parse_frame(&x[..m]).unwrap().icrc_ok());
            if !ud {
                // `emit_only` takes a RETH and immediate data only (it refuses a DETH).
                let mut y = vec![0x3cu8; 4500];
                let k = t.emit_only(&mut y, ident, &bth, reth.as_ref(), imm, payload.len(), copy).unwrap();
                prop_assert_eq!(&want[..n], &y[..k]);
                prop_assert!(crate::parse_frame(&y[..k]).unwrap().icrc_ok());
            }
        }
    }
}
