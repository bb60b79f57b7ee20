//! The RoCEv2 scenarios (`scenarios/roce.rs`: IPv6 twins, IP/UDP headers both ways, ECN and
//! CNP) against devices broken the way each is about: every one must fail.
mod breakers;
use breakers::*;

use rocemu_conformance::agent::Agent;
use rocemu_conformance::dut::{SelfAgent, SharedDut, DUT_IP, DUT_IP6, PEER_IP};
use rocemu_wire::frame::IpRepr;
use rocemu_wire::{parse_frame, Opcode, PKey, Psn, Qpn, SyndromeKind};
use std::cell::Cell;
use std::net::IpAddr;
use std::rc::Rc;

type Breaker = Box<dyn FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent>>;

/// A raw filter on the frames the RNIC receives.
fn rx_raw(f: impl FnMut(Vec<u8>) -> Vec<Vec<u8>> + 'static) -> Breaker {
    Box::new(move |dut: &SharedDut, agent| {
        dut.borrow_mut().rx_filter = Some(Box::new(f));
        Box::new(agent) as Box<dyn Agent>
    })
}

/// A raw filter on the frames the RNIC sends.
fn tx_raw(f: impl FnMut(Vec<u8>) -> Vec<Vec<u8>> + 'static) -> Breaker {
    Box::new(move |dut: &SharedDut, agent| {
        dut.borrow_mut().tx_filter = Some(Box::new(f));
        Box::new(agent) as Box<dyn Agent>
    })
}

/// Drops the frames the RNIC receives for which `which` holds.
fn rx_drops(which: impl Fn(&[u8]) -> bool + 'static) -> Breaker {
    rx_raw(move |f| if which(&f) { vec![] } else { vec![f] })
}

fn is_v4(f: &[u8]) -> bool {
    f.len() > 34 && f[12..14] == [0x08, 0x00]
}

fn is_v6(f: &[u8]) -> bool {
    f.len() > 54 && f[12..14] == [0x86, 0xdd]
}

/// Every NAK the RNIC sends is dropped.
fn mute_naks() -> Breaker {
    tx_raw(|f| {
        let nak = parse_frame(&f).is_ok_and(|p| {
            p.ext
                .aeth
                .is_some_and(|a| matches!(a.syndrome.kind(), SyndromeKind::Nak(_)))
        });
        if nak {
            vec![]
        } else {
            vec![f]
        }
    })
}

// ---- the IPv6 twins -------------------------------------------------------------------------

#[test]
fn ipv6_twins_fail_when_the_check_is_missing() {
    // Re-emitting recomputes the ICRC: the RNIC never sees a wrong one.
    fails("hdr.ipv6.icrc.bad-silent-drop", ignores(|_| {}));
    fails(
        "hdr.ipv6.tver.nonzero-silent-drop",
        ignores(|r| r.bth.tver = 0),
    );
    fails(
        "hdr.ipv6.pkey.mismatch-silent-drop",
        ignores(|r| r.bth.pkey = PKey::DEFAULT),
    );
    fails(
        "hdr.ipv6.dqpn.unknown-silent-drop",
        any_qpn_reaches_the_qp(),
    );
    fails(
        "hdr.ipv6.opcode.uc-on-rc-silent-drop",
        ignores(|r| {
            if r.bth.opcode == Opcode::UC_SEND_ONLY {
                r.bth.opcode = Opcode::RC_SEND_ONLY;
            }
        }),
    );
    fails(
        "hdr.ipv6.pad.stripped",
        rx(|r, p| {
            p.extend(std::iter::repeat_n(0, r.bth.pad as usize));
            r.bth.pad = 0;
        }),
    );
    fails("hdr.ipv6.pad.first-short-nak", mute_naks());
    // Any UDP port taken for RoCEv2: patched in place (Ethernet 14 + IPv6 40 + the source port
    // 2), then the frame re-emitted for its ICRC.
    fails(
        "hdr.ipv6.udp.other-port-ignored",
        rx_raw(|mut f| {
            if is_v6(&f) {
                f[56..58].copy_from_slice(&4791u16.to_be_bytes());
            }
            vec![rewrite(f, |_, _| {})]
        }),
    );
    fails(
        "hdr.ipv6.ip.other-destination-ignored",
        ignores(|r| {
            if let (IpRepr::V6(ip), IpAddr::V6(me)) = (&mut r.ip, DUT_IP6) {
                ip.dst = me;
            }
        }),
    );
    // A device that takes only full-member P_Keys.
    fails(
        "hdr.ipv6.pkey.limited-member-accepted",
        rx_drops(|f| parse_frame(f).is_ok_and(|p| !p.bth.pkey.is_full_member())),
    );
}

// ---- inbound headers ------------------------------------------------------------------------

#[test]
fn inbound_header_scenarios_fail_when_the_check_is_missing() {
    // The IP version nibble not read: patched back to the Ethertype's, then re-emitted (the
    // ICRC covers the version).
    fails(
        "hdr.ip.version-mismatch-silent-drop",
        rx_raw(|mut f| {
            if is_v4(&f) && f[14] >> 4 != 4 {
                f[14] = 0x45;
            }
            vec![rewrite(f, |_, _| {})]
        }),
    );
    fails(
        "hdr.ipv6.version-mismatch-silent-drop",
        rx_raw(|mut f| {
            if is_v6(&f) && f[14] >> 4 != 6 {
                f[14] = 0x60 | (f[14] & 0x0f);
            }
            vec![rewrite(f, |_, _| {})]
        }),
    );
    // A device that does not check where a connected QP's packets come from: IPv6 ones reach
    // it as if they came over the QP's IPv4 path.
    fails(
        "hdr.ip.ipv6-to-ipv4-qp-silent-drop",
        ignores(|r| {
            if let IpRepr::V6(_) = r.ip {
                r.ip = IpRepr::roce(PEER_IP, DUT_IP, 0, 64, 0);
            }
        }),
    );
    // A device that ignores the fragment fields (takes a fragment for a whole datagram).
    let unfragment = || {
        rx_raw(|mut f| {
            if is_v4(&f) {
                f[20] = 0x40;
                f[21] = 0;
            }
            vec![rewrite(f, |_, _| {})]
        })
    };
    fails("hdr.ipv4.fragment-more-silent-drop", unfragment());
    fails("hdr.ipv4.fragment-offset-silent-drop", unfragment());
    // A device with a QP0 on its RoCEv2 port: what is sent to QP0 reaches the QP the last
    // request went to.
    let last = Rc::new(Cell::new(None::<Qpn>));
    fails(
        "hdr.dqpn.zero-silent-drop",
        rx(move |r, _| {
            if r.bth.dqpn == Qpn::new(0) {
                if let Some(q) = last.get() {
                    r.bth.dqpn = q;
                }
            } else {
                last.set(Some(r.bth.dqpn));
            }
        }),
    );
    // Devices whose ICRC covers what it must mask: a packet whose variant fields are not the
    // sender's (TTL 64, TOS 0; traffic class 0, flow label 0, hop limit 64; UDP checksum 0)
    // fails their check.
    fails(
        "hdr.transit.ipv4-ttl-tos-rewritten-accepted",
        rx_drops(|f| is_v4(f) && (f[15] != 0 || f[22] != 64)),
    );
    fails(
        "hdr.transit.ipv6-tclass-flow-hop-rewritten-accepted",
        rx_drops(|f| is_v6(f) && (f[14..18] != [0x60, 0, 0, 0] || f[21] != 64)),
    );
    fails(
        "hdr.transit.udp-checksum-accepted",
        rx_drops(|f| is_v4(f) && f[40..42] != [0, 0]),
    );
    // A device that drops requests with FECN or BECN set.
    fails(
        "hdr.bth.fecn-becn-request-accepted",
        rx_drops(|f| parse_frame(f).is_ok_and(|p| p.bth.fecn || p.bth.becn)),
    );
}

// ---- outbound headers -----------------------------------------------------------------------

#[test]
fn outbound_header_scenarios_fail_when_the_device_sends_them_wrong() {
    fails(
        "hdr.out.ipv4-ihl-df-no-fragment",
        tx(|r, _| {
            if let IpRepr::V4(ip) = &mut r.ip {
                ip.dont_frag = false;
            }
        }),
    );
    // The hop limit and traffic class of the address vector not used: TTL 64, DSCP 0.
    fails(
        "hdr.out.ipv4-ttl-dscp-from-av",
        tx(|r, _| {
            if let IpRepr::V4(ip) = &mut r.ip {
                ip.ttl = 64;
            }
        }),
    );
    fails(
        "hdr.out.ipv4-ttl-dscp-from-av",
        tx(|r, _| {
            if let IpRepr::V4(ip) = &mut r.ip {
                ip.dscp = 0;
            }
        }),
    );
    fails(
        "hdr.out.ecn-never-ce",
        tx(|r, _| match &mut r.ip {
            IpRepr::V4(ip) => ip.ecn = 3,
            IpRepr::V6(ip) => ip.ecn = 3,
        }),
    );
    // A UDP length that counts the ICRC twice (the ICRC does not cover the length's bytes
    // differently: the frame is patched after it was sealed).
    fails(
        "hdr.out.ipv4-udp-lengths",
        tx_raw(|mut f| {
            if is_v4(&f) {
                let l = u16::from_be_bytes([f[38], f[39]]) + 4;
                f[38..40].copy_from_slice(&l.to_be_bytes());
            }
            vec![f]
        }),
    );
    // A UDP checksum filled in (the ICRC masks it: the frame stays valid otherwise).
    fails(
        "hdr.out.udp-checksum-zero",
        tx_raw(|mut f| {
            if is_v4(&f) {
                f[40..42].copy_from_slice(&0x1234u16.to_be_bytes());
            }
            vec![f]
        }),
    );
    // A new UDP source port for every packet.
    let n = Cell::new(0xd000u16);
    fails(
        "hdr.out.udp-sport-fixed-per-qp",
        tx(move |r, _| {
            r.sport = n.get();
            n.set(n.get().wrapping_add(1));
        }),
    );
    fails(
        "hdr.out.ipv6-header",
        tx(|r, _| {
            if let IpRepr::V6(ip) = &mut r.ip {
                ip.hop_limit = 64;
            }
        }),
    );
    fails(
        "hdr.out.ipv6-header",
        tx(|r, _| {
            if let IpRepr::V6(ip) = &mut r.ip {
                ip.dscp = 0;
            }
        }),
    );
}

// ---- ECN and CNP ----------------------------------------------------------------------------

fn is_cnp(f: &[u8]) -> bool {
    parse_frame(f).is_ok_and(|p| p.bth.opcode == Opcode::CNP)
}

/// A device without a notification point: its CNPs never leave.
fn no_cnps() -> Breaker {
    tx_raw(|f| if is_cnp(&f) { vec![] } else { vec![f] })
}

/// A device that takes a CNP for a request: it reaches the RNIC as a copy of the last RC
/// SEND_ONLY the peer sent (same QP, same PSN: a duplicate the RNIC acknowledges again).
fn cnp_taken_for_a_request() -> Breaker {
    let last: Rc<Cell<Option<(Qpn, Psn)>>> = Rc::default();
    Box::new(rx(move |r, p| {
        if r.bth.opcode == Opcode::RC_SEND_ONLY {
            last.set(Some((r.bth.dqpn, r.bth.psn)));
        } else if r.bth.opcode == Opcode::CNP {
            if let Some((q, psn)) = last.get() {
                r.bth.opcode = Opcode::RC_SEND_ONLY;
                r.bth.dqpn = q;
                r.bth.psn = psn;
                r.bth.ack_req = true;
                r.bth.becn = false;
                *p = vec![0; 32];
            }
        }
    }))
}

#[test]
fn cnp_scenarios_fail_without_a_notification_point_or_with_a_wrong_one() {
    fails("cnp.ce-marked-answered", no_cnps());
    fails("cnp.ipv6.ce-marked-answered", no_cnps());
    fails("cnp.pkey-of-marked-packet", no_cnps());
    fails("cnp.ce-burst-bounded", no_cnps());
    fails("cnp.ud.ce-marked-answered", no_cnps());
    // A UD CNP sent to the destination QP of the datagram (the device's own) instead of the
    // DETH's source QP.
    fails(
        "cnp.ud.ce-marked-answered",
        tx(|r, _| {
            if r.bth.opcode == Opcode::CNP {
                r.bth.dqpn = Qpn::new(r.bth.dqpn.value() ^ 0x10);
            }
        }),
    );
    // The Figure 6 fields, one at a time.
    let cnp_edit = |edit: fn(&mut rocemu_wire::FrameRepr)| {
        tx(move |r, _| {
            if r.bth.opcode == Opcode::CNP {
                edit(r)
            }
        })
    };
    fails(
        "cnp.ce-marked-answered",
        cnp_edit(|r| r.bth.psn = Psn::new(1)),
    );
    fails(
        "cnp.ce-marked-answered",
        cnp_edit(|r| r.bth.dqpn = Qpn::new(r.bth.dqpn.value() ^ 1)),
    );
    fails(
        "cnp.ce-marked-answered",
        cnp_edit(|r| r.bth.solicited = true),
    );
    fails(
        "cnp.ipv6.ce-marked-answered",
        cnp_edit(|r| r.bth.mig_req = true),
    );
    // Non-zero reserved bytes (patched after the ICRC: the ICRC is redone).
    fails(
        "cnp.ce-marked-answered",
        tx_raw(|mut f| {
            if is_cnp(&f) && is_v4(&f) {
                f[54] = 0xa5;
                let l = f.len();
                let crc = rocemu_wire::icrc::compute(&f[14..l - 4], 20, false);
                f[l - 4..].copy_from_slice(&rocemu_wire::icrc::to_wire(crc));
            }
            vec![f]
        }),
    );
    // RoCEmu's CNP before it followed Figure 6: P_Key 0xFFFF whatever the marked packet's.
    fails(
        "cnp.pkey-of-marked-packet",
        cnp_edit(|r| r.bth.pkey = PKey::DEFAULT),
    );
    // A CNP flood: five for every one.
    fails(
        "cnp.ce-burst-bounded",
        tx_raw(|f| if is_cnp(&f) { vec![f; 5] } else { vec![f] }),
    );
    // A device that reads ECT(0) and ECT(1) as CE.
    fails(
        "ecn.ect-not-answered",
        ignores(|r| match &mut r.ip {
            IpRepr::V4(ip) if ip.ecn != 0 => ip.ecn = 3,
            IpRepr::V6(ip) if ip.ecn != 0 => ip.ecn = 3,
            _ => {}
        }),
    );
    fails("cnp.unknown-qp-ignored", cnp_taken_for_a_request());
    fails("cnp.to-qp-no-answer", cnp_taken_for_a_request());
}
