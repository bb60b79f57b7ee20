//! Every scenario passes against RoCEmu, and fails against a RoCEmu broken on purpose in the
//! way the scenario is about. The device is broken without touching the RNIC: frame filters
//! between the wire and the RNIC rewrite what it receives or sends (re-emitting the frame, so
//! that checksums and the ICRC stay right and only the broken behaviour differs), or an agent
//! wrapper misbehaves on the control side.
use rocemu_conformance::agent::{Agent, Reply, Request};
use rocemu_conformance::dut::{SelfAgent, SharedDut};
use rocemu_conformance::runner::run_self;
use rocemu_conformance::scenarios::catalogue;
use rocemu_emulator::rnic::Access;
use rocemu_wire::frame::IpRepr;
use rocemu_wire::{parse_frame, NakCode, Opcode, Psn, QKey, Qpn, RKey, Syndrome, SyndromeKind};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

mod breakers;
use breakers::*;

#[test]
fn every_scenario_passes_on_rocemu() {
    let mut failed = Vec::new();
    for sc in catalogue() {
        let r = run_self(&sc).result;
        // "Unsupported" (a feature RoCEmu does not offer) is not a failure.
        if !r.passed && !r.unsupported {
            failed.push(format!("{}: {}", sc.id, r.reason.unwrap_or_default()));
        }
    }
    assert!(
        failed.is_empty(),
        "failing on RoCEmu:\n{}",
        failed.join("\n")
    );
}

#[test]
fn catalogue_ids_are_unique_and_cited() {
    let all = catalogue();
    let mut ids: Vec<_> = all.iter().map(|s| s.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), all.len(), "duplicate scenario ids");
    for s in &all {
        assert!(
            !s.cites.is_empty() && !s.title.is_empty(),
            "{} lacks a title or citation",
            s.id
        );
        assert!(
            s.id.split('.').count() >= 2,
            "{}: ids are category.what",
            s.id
        );
    }
}

// ---- headers -----------------------------------------------------------------------------

#[test]
fn hdr_icrc_fails_when_the_icrc_is_not_checked() {
    // Re-emitting recomputes the ICRC: the RNIC never sees a wrong one.
    fails("hdr.icrc.bad-silent-drop", ignores(|_| {}));
}

#[test]
fn hdr_tver_fails_when_tver_is_ignored() {
    fails("hdr.tver.nonzero-silent-drop", ignores(|r| r.bth.tver = 0));
}

#[test]
fn hdr_pkey_fails_when_the_pkey_is_ignored() {
    fails(
        "hdr.pkey.mismatch-silent-drop",
        ignores(|r| r.bth.pkey = rocemu_wire::PKey::DEFAULT),
    );
}

#[test]
fn hdr_dqpn_fails_when_any_qpn_reaches_the_qp() {
    fails("hdr.dqpn.unknown-silent-drop", any_qpn_reaches_the_qp());
}

#[test]
fn hdr_uc_on_rc_fails_when_the_service_type_is_ignored() {
    fails(
        "hdr.opcode.uc-on-rc-silent-drop",
        ignores(|r| {
            if r.bth.opcode == Opcode::UC_SEND_ONLY {
                r.bth.opcode = Opcode::RC_SEND_ONLY;
            }
        }),
    );
}

#[test]
fn hdr_pad_fails_when_pad_bytes_are_delivered() {
    fails(
        "hdr.pad.stripped",
        rx(|r, p| {
            p.extend(std::iter::repeat_n(0, r.bth.pad as usize));
            r.bth.pad = 0;
        }),
    );
}

#[test]
fn hdr_first_short_fails_when_naks_are_muted() {
    fails("hdr.pad.first-short-nak", mute_naks());
}

// ---- PSNs and sequencing -------------------------------------------------------------------

/// Drops every NAK the RNIC sends.
fn mute_naks() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    |dut: &SharedDut, agent| {
        dut.borrow_mut().tx_filter = Some(Box::new(|f| {
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
        }));
        Box::new(agent)
    }
}

/// A device blind to PSNs: every request reaches the RNIC renumbered as the next in sequence
/// (the agent side tells the filter each QP's rq_psn), so gaps, duplicates and injected PSNs
/// all look new.
fn psn_blind() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let next: Rc<RefCell<HashMap<Qpn, Psn>>> = Rc::default();
    move |dut: &SharedDut, inner: SelfAgent| {
        let n = next.clone();
        dut.borrow_mut().rx_filter = Some(Box::new(move |f| {
            vec![rewrite(f, |r, _| {
                if !r.bth.opcode.info().is_request() {
                    return;
                }
                if let Some(p) = n.borrow_mut().get_mut(&r.bth.dqpn) {
                    r.bth.psn = *p;
                    *p = p.next();
                }
            })]
        }));
        Box::new(Wrapped {
            inner,
            f: Box::new(move |a, req| {
                if let Request::ModifyQp { qpn, attr } = &req {
                    if let Some(p) = attr.rq_psn {
                        next.borrow_mut().insert(*qpn, p);
                    }
                }
                a.call(req)
            }),
        })
    }
}

#[test]
fn psn_seq_error_fails_when_naks_come_twice() {
    fails("psn.seq-error.nak-once", |dut: &SharedDut, agent| {
        dut.borrow_mut().tx_filter = Some(Box::new(|f| {
            let nak = parse_frame(&f).is_ok_and(|p| {
                p.ext.aeth.is_some_and(|a| {
                    a.syndrome.kind() == SyndromeKind::Nak(NakCode::PsnSequenceError)
                })
            });
            if nak {
                vec![f.clone(), f]
            } else {
                vec![f]
            }
        }));
        Box::new(agent) as Box<dyn Agent>
    });
    fails("psn.seq-error.nak-once", psn_blind());
}

#[test]
fn psn_duplicates_fail_when_duplicates_are_executed_again() {
    for id in [
        "psn.dup.send-reacked-once-delivered",
        "psn.dup.write-reacked-not-reapplied",
        "psn.dup.read-reexecuted",
        "psn.dup.atomic-replayed-not-reapplied",
    ] {
        fails(id, psn_blind());
    }
}

#[test]
fn psn_dup_send_fails_when_duplicates_are_not_reacked() {
    // Every ACK after the first for a PSN is lost: a device that does not re-ACK.
    let mut acked: Vec<Psn> = Vec::new();
    fails(
        "psn.dup.send-reacked-once-delivered",
        move |dut: &SharedDut, agent| {
            dut.borrow_mut().tx_filter = Some(Box::new(move |f| {
                let Ok(p) = parse_frame(&f) else {
                    return vec![f];
                };
                if p.bth.opcode == Opcode::RC_ACKNOWLEDGE {
                    if acked.contains(&p.bth.psn) {
                        return vec![];
                    }
                    acked.push(p.bth.psn);
                }
                vec![f]
            }));
            Box::new(agent) as Box<dyn Agent>
        },
    );
}

#[test]
fn psn_dup_read_fails_when_the_response_is_stale() {
    // A device that replays the first response's bytes instead of reading memory again.
    let mut first: Option<Vec<u8>> = None;
    fails(
        "psn.dup.read-reexecuted",
        tx(move |r, p| {
            if r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY {
                match &first {
                    Some(old) => *p = old.clone(),
                    None => first = Some(p.clone()),
                }
            }
        }),
    );
}

#[test]
fn psn_wrap_responder_fails_when_the_wrap_is_not_followed() {
    // A responder that loses what comes after 0xffffff.
    fails("psn.wrap.responder", |dut: &SharedDut, agent| {
        dut.borrow_mut().rx_filter = Some(Box::new(|f| {
            let wrapped = parse_frame(&f).is_ok_and(|p| p.bth.psn.value() < 2);
            if wrapped {
                vec![]
            } else {
                vec![f]
            }
        }));
        Box::new(agent) as Box<dyn Agent>
    });
}

#[test]
fn psn_wrap_requester_fails_when_psn_0_is_skipped() {
    fails(
        "psn.wrap.requester",
        tx(|r, _| {
            if r.bth.opcode == Opcode::RC_RDMA_WRITE_LAST && r.bth.psn == Psn::new(0) {
                r.bth.psn = Psn::new(1);
            }
        }),
    );
}

#[test]
fn sequence_scenarios_fail_when_naks_are_muted_or_sequence_is_ignored() {
    for id in [
        "seq.middle-without-first-nak",
        "seq.write-inside-send-nak",
        "seq.write-last-without-first-nak",
    ] {
        fails(id, mute_naks());
    }
    // A device that takes any MIDDLE or LAST as the start of a message.
    fails(
        "seq.middle-without-first-nak",
        ignores(|r| {
            if r.bth.opcode == Opcode::RC_SEND_MIDDLE {
                r.bth.opcode = Opcode::RC_SEND_FIRST;
            }
        }),
    );
}

// ---- RDMA access -----------------------------------------------------------------------------

/// Rewrites the NAK code of every NAK the RNIC sends.
fn nak_code(from: NakCode, to: NakCode) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    tx(move |r, _| {
        if is_nak(r, from) {
            if let Some(a) = r.ext.aeth.as_mut() {
                a.syndrome = Syndrome::nak(to);
            }
        }
    })
}

/// A device whose every ACK goes out as a remote access NAK.
fn acks_become_access_naks() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    tx(|r, _| {
        if r.bth.opcode == Opcode::RC_ACKNOWLEDGE {
            if let Some(a) = r.ext.aeth.as_mut() {
                a.syndrome = Syndrome::nak(NakCode::RemoteAccessError);
            }
        }
    })
}

#[test]
fn access_scenarios_fail_on_the_wrong_nak_code() {
    for id in [
        "rdma.write.bad-rkey-nak",
        "rdma.write.out-of-bounds-nak",
        "rdma.write.mr-without-remote-write-nak",
        "rdma.read.bad-rkey-nak",
        "rdma.read.out-of-bounds-nak",
        "sec.access.other-pd-nak",
        "sec.access.deregistered-rkey-nak",
    ] {
        let why = fails(
            id,
            nak_code(NakCode::RemoteAccessError, NakCode::InvalidRequest),
        );
        assert!(why.contains("RemoteAccessError"), "{id}: {why}");
    }
    fails(
        "rdma.atomic.misaligned-nak",
        nak_code(NakCode::InvalidRequest, NakCode::RemoteAccessError),
    );
}

#[test]
fn access_scenarios_fail_when_access_is_granted() {
    // The control side grants more than asked.
    fails(
        "rdma.write.mr-without-remote-write-nak",
        agent(|a, req| match req {
            Request::RegMr { pd, length, .. } => a.call(Request::RegMr {
                pd,
                length,
                access: Access::ALL,
            }),
            r => a.call(r),
        }),
    );
    fails(
        "sec.access.qp-without-remote-write-nak",
        agent(|a, req| match req {
            Request::ModifyQp { qpn, mut attr } => {
                if let Some(f) = attr.qp_access_flags.as_mut() {
                    *f = *f | Access::REMOTE_WRITE;
                }
                a.call(Request::ModifyQp { qpn, attr })
            }
            r => a.call(r),
        }),
    );
    // Every PD is the first: an MR of "another" PD is the QP's.
    let mut first_pd = None;
    fails(
        "sec.access.other-pd-nak",
        agent(move |a, req| match req {
            Request::AllocPd => match first_pd {
                Some(p) => Ok(Reply::Pd(p)),
                None => {
                    let r = a.call(Request::AllocPd)?;
                    if let Reply::Pd(p) = r {
                        first_pd = Some(p);
                    }
                    Ok(r)
                }
            },
            r => a.call(r),
        }),
    );
    // dereg_mr that does nothing.
    fails(
        "sec.access.deregistered-rkey-nak",
        agent(|a, req| match req {
            Request::DeregMr { .. } => Ok(Reply::Done),
            r => a.call(r),
        }),
    );
}

#[test]
fn zero_length_write_fails_when_the_rkey_is_checked() {
    // A device that NAKs a zero-length WRITE (checking R_Key 0).
    fails("rdma.write.zero-length-acked", acks_become_access_naks());
}

#[test]
fn requester_scenarios_fail_when_responses_are_misread() {
    // The requester takes a remote access NAK for a remote operational one.
    fails(
        "rdma.requester.nak-rem-access-completes-error",
        rx(|r, _| {
            if is_nak(r, NakCode::RemoteAccessError) {
                if let Some(a) = r.ext.aeth.as_mut() {
                    a.syndrome = Syndrome::nak(NakCode::RemoteOperationalError);
                }
            }
        }),
    );
    // The READ request asks for one byte too many.
    fails(
        "rdma.read.requester-multi-packet",
        tx(|r, _| {
            if let Some(e) = r.ext.reth.as_mut() {
                e.dma_len += 1;
            }
        }),
    );
    // The retried READ starts over from the first byte.
    let mut first_va = None;
    fails(
        "rdma.read.partial-retry",
        tx(move |r, _| {
            if r.bth.opcode == Opcode::RC_RDMA_READ_REQUEST {
                if let Some(e) = r.ext.reth.as_mut() {
                    let va = *first_va.get_or_insert(e.va);
                    e.dma_len += (e.va - va) as u32;
                    e.va = va;
                }
            }
        }),
    );
}

// ---- RNR, ACKs, UD -----------------------------------------------------------------------------

#[test]
fn rnr_scenarios_fail_with_the_wrong_timer() {
    fails(
        "rnr.responder.nak-with-min-rnr-timer",
        tx(|r, _| {
            if let Some(a) = r.ext.aeth.as_mut() {
                if let SyndromeKind::RnrNak { .. } = a.syndrome.kind() {
                    a.syndrome = Syndrome::rnr_nak(0);
                }
            }
        }),
    );
    // The requester reads the timer as code 1 (10 µs) and comes back too early.
    fails(
        "rnr.requester.waits-timer",
        rx(|r, _| {
            if let Some(a) = r.ext.aeth.as_mut() {
                if let SyndromeKind::RnrNak { .. } = a.syndrome.kind() {
                    a.syndrome = Syndrome::rnr_nak(1);
                }
            }
        }),
    );
}

#[test]
fn ack_msn_fails_with_a_wrong_msn() {
    fails(
        "ack.msn.counts-messages",
        tx(|r, _| {
            if let Some(a) = r.ext.aeth.as_mut() {
                a.msn = rocemu_wire::Msn::new(a.msn.value() + 1);
            }
        }),
    );
}

#[test]
fn ud_qkey_fails_when_the_qkey_is_ignored() {
    fails(
        "ud.qkey.mismatch-silent-drop",
        ignores(|r| {
            if let Some(d) = r.ext.deth.as_mut() {
                d.qkey = QKey(0x1111_1111);
            }
        }),
    );
}

// ---- verbs and QP states ------------------------------------------------------------------------

/// An agent that reports success for `op` whatever the device said.
fn swallows(op: &'static str) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    agent(move |a, req| {
        let name = req.op();
        match a.call(req) {
            Err(_) if name == op => Ok(Reply::Done),
            r => r,
        }
    })
}

#[test]
fn verbs_scenarios_fail_when_errors_are_swallowed() {
    fails("verbs.post-send.before-rts-rejected", swallows("post_send"));
    fails("verbs.post-recv.reset-rejected", swallows("post_recv"));
    fails("verbs.modify.reset-to-rts-rejected", swallows("modify_qp"));
}

#[test]
fn err_scenarios_fail_when_flushes_or_resets_go_missing() {
    fails(
        "qp.err.flushes-work",
        agent(|a, req| match a.call(req)? {
            Reply::Wcs(w) => Ok(Reply::Wcs(
                w.into_iter()
                    .filter(|c| c.status != "IBV_WC_WR_FLUSH_ERR")
                    .collect(),
            )),
            r => Ok(r),
        }),
    );
    fails(
        "qp.err.reset-and-reconnect",
        agent(|a, req| match req {
            Request::ModifyQp { attr, .. }
                if attr.qp_state == Some(rocemu_emulator::rnic::QpState::Reset) =>
            {
                Ok(Reply::Done)
            }
            r => a.call(r),
        }),
    );
}

// ---- security -------------------------------------------------------------------------------

#[test]
fn predictability_scenarios_fail_on_sequential_values() {
    // rxe's scheme: an index in the upper bits, a random byte in the low 8.
    let mut n = 0u32;
    fails(
        "sec.rkey.unpredictable",
        agent(move |a, req| match a.call(req)? {
            Reply::Mr(mut m) => {
                n += 1;
                m.rkey = RKey(((0x40 + n) << 8) | (n.wrapping_mul(97) & 0xff));
                Ok(Reply::Mr(m))
            }
            r => Ok(r),
        }),
    );
    let mut k = 0u32;
    fails(
        "sec.qpn.unpredictable",
        agent(move |a, req| match a.call(req)? {
            Reply::Qp(_) => {
                k += 1;
                Ok(Reply::Qp(Qpn::new(0x11 + k)))
            }
            r => Ok(r),
        }),
    );
}

/// A device whose CM takes its starting PSNs from `f` (given the one it drew) instead of its
/// generator.
fn cm_psns(
    f: impl FnMut(Psn) -> Psn + 'static,
) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    move |dut: &SharedDut, agent| {
        dut.borrow_mut().objs.cm_psn_filter = Some(Box::new(f));
        Box::new(agent) as Box<dyn Agent>
    }
}

#[test]
fn psn_predictability_fails_on_sequential_or_constant_starting_psns() {
    // Counting up from a random start, as a CM with a per-boot offset and a counter would.
    let mut first: Option<Psn> = None;
    let mut k = 0;
    let why = fails(
        "sec.psn.unpredictable",
        cm_psns(move |drawn| {
            k += 1;
            first.get_or_insert(drawn).add(k)
        }),
    );
    assert!(why.contains("guessed"), "{why}");
    let why = fails("sec.psn.unpredictable", cm_psns(|_| Psn::new(0x5a5a5a)));
    assert!(why.contains("repeat"), "{why}");
    // A REP that announces one PSN while the QP expects another: the agent's listing betrays it.
    let why = fails(
        "sec.psn.unpredictable",
        tx(|r, p| {
            use rocemu_wire::cm::{CmMadRepr, CmMessage};
            if r.bth.dqpn != Qpn::GSI {
                return;
            }
            if let Ok(mut m) = CmMadRepr::parse(p) {
                if let CmMessage::Rep(rep) = &mut m.msg {
                    rep.starting_psn = rep.starting_psn.next();
                    let _ = m.emit(p);
                }
            }
        }),
    );
    assert!(why.contains("rq_psn"), "{why}");
}

#[test]
fn injection_scenarios_fail_when_injections_land() {
    fails("sec.inject.future-psn-not-applied", psn_blind());
    fails("sec.inject.past-psn-not-applied", psn_blind());
    // A device that does not check the source address of a connected QP's packets.
    fails(
        "sec.inject.foreign-source-dropped",
        ignores(|r| {
            if let IpRepr::V4(ip) = &mut r.ip {
                ip.src = std::net::Ipv4Addr::new(10, 77, 0, 2);
            }
        }),
    );
}

// ---- more headers, messages, the requester --------------------------------------------------

#[test]
fn more_header_scenarios_fail_when_the_check_is_missing() {
    // Re-emitting recomputes the IPv4 checksum: a device that does not check it.
    fails("hdr.ipv4.bad-checksum-silent-drop", ignores(|_| {}));
    // Any UDP port taken for RoCEv2: the port is patched in place (the parser would not take
    // the frame otherwise), then the frame re-emitted for its ICRC.
    fails("hdr.udp.other-port-ignored", |dut: &SharedDut, agent| {
        dut.borrow_mut().rx_filter = Some(Box::new(|mut f| {
            // Ethernet 14 + IPv4 20 + the UDP source port 2.
            if f.len() > 38 && f[12..14] == [0x08, 0x00] {
                f[36..38].copy_from_slice(&4791u16.to_be_bytes());
            }
            vec![rewrite(f, |_, _| {})]
        }));
        Box::new(agent) as Box<dyn Agent>
    });
    fails(
        "hdr.ip.other-destination-ignored",
        ignores(|r| {
            if let IpRepr::V4(ip) = &mut r.ip {
                ip.dst = std::net::Ipv4Addr::new(10, 77, 0, 1);
            }
        }),
    );
    // A device that takes only full-member P_Keys.
    fails(
        "hdr.pkey.limited-member-accepted",
        |dut: &SharedDut, agent| {
            dut.borrow_mut().rx_filter = Some(Box::new(|f| {
                let limited = parse_frame(&f).is_ok_and(|p| !p.bth.pkey.is_full_member());
                if limited {
                    vec![]
                } else {
                    vec![f]
                }
            }));
            Box::new(agent) as Box<dyn Agent>
        },
    );
}

#[test]
fn message_scenarios_fail_when_messages_are_mishandled() {
    // The MIDDLE's bytes go missing.
    fails(
        "seq.send.multi-packet-delivered",
        rx(|r, p| {
            if r.bth.opcode == Opcode::RC_SEND_MIDDLE {
                p.fill(0);
            }
        }),
    );
    // The RETH length is not compared with the payload.
    fails(
        "seq.write.length-mismatch-nak",
        rx(|r, p| {
            if let Some(e) = r.ext.reth.as_mut() {
                e.dma_len = p.len() as u32;
            }
        }),
    );
    // Receives are posted four times as long as asked.
    fails(
        "seq.send.longer-than-receive-nak",
        agent(|a, req| match req {
            Request::PostRecv { qpn, mut wr } => {
                for s in &mut wr.sg {
                    s.length *= 4;
                }
                a.call(Request::PostRecv { qpn, wr })
            }
            r => a.call(r),
        }),
    );
    fails("seq.middle.short-nak", mute_naks());
    // Only the first NAK of a QP's life goes out.
    let mut naked = false;
    fails(
        "psn.seq-error.nak-rearmed",
        move |dut: &SharedDut, agent| {
            dut.borrow_mut().tx_filter = Some(Box::new(move |f| {
                let nak = parse_frame(&f).is_ok_and(|p| {
                    p.ext
                        .aeth
                        .is_some_and(|a| matches!(a.syndrome.kind(), SyndromeKind::Nak(_)))
                });
                if nak && naked {
                    return vec![];
                }
                naked |= nak;
                vec![f]
            }));
            Box::new(agent) as Box<dyn Agent>
        },
    );
    for id in [
        "rdma.write-imm.consumes-receive",
        "rdma.send-imm.delivers-imm",
    ] {
        fails(
            id,
            rx(|r, _| {
                if let Some(i) = r.ext.imm.as_mut() {
                    *i ^= 1;
                }
            }),
        );
    }
    fails(
        "rdma.atomic.cmp-swap",
        tx(|r, _| {
            if let Some(a) = r.ext.atomic_ack.as_mut() {
                a.orig += 1;
            }
        }),
    );
    for (id, grant) in [
        (
            "rdma.atomic.qp-without-remote-atomic-nak",
            Access::REMOTE_ATOMIC,
        ),
        ("rdma.read.qp-without-remote-read-nak", Access::REMOTE_READ),
    ] {
        fails(
            id,
            agent(move |a, req| match req {
                Request::ModifyQp { qpn, mut attr } => {
                    if let Some(f) = attr.qp_access_flags.as_mut() {
                        *f = *f | grant;
                    }
                    a.call(Request::ModifyQp { qpn, attr })
                }
                r => a.call(r),
            }),
        );
    }
    fails(
        "rdma.read.multi-packet-responses",
        tx(|r, _| {
            if r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                r.bth.psn = r.bth.psn.next();
            }
        }),
    );
}

#[test]
fn more_requester_scenarios_fail_when_responses_are_misread() {
    fails(
        "rdma.requester.fetch-add",
        rx(|r, _| {
            if let Some(a) = r.ext.atomic_ack.as_mut() {
                a.orig += 1;
            }
        }),
    );
    // An ACK taken to cover only the first of the PSNs it acknowledges.
    fails(
        "rdma.requester.ack-coalesced",
        rx(|r, _| {
            if r.bth.opcode == Opcode::RC_ACKNOWLEDGE {
                r.bth.psn = r.bth.psn.sub(2);
            }
        }),
    );
    // A NAK taken one PSN too early: the device goes back too far.
    fails(
        "rdma.requester.seq-nak-go-back",
        rx(|r, _| {
            if is_nak(r, NakCode::PsnSequenceError) {
                r.bth.psn = r.bth.psn.sub(1);
            }
        }),
    );
    // Retry counters that are not honoured.
    fails(
        "rnr.requester.retry-exhausted",
        agent(|a, req| match req {
            Request::ModifyQp { qpn, mut attr } => {
                if attr.rnr_retry.is_some() {
                    attr.rnr_retry = Some(3);
                }
                a.call(Request::ModifyQp { qpn, attr })
            }
            r => a.call(r),
        }),
    );
    fails(
        "ack.timeout.retry-exhausted",
        agent(|a, req| match req {
            Request::ModifyQp { qpn, mut attr } => {
                if attr.retry_cnt.is_some() {
                    attr.retry_cnt = Some(3);
                }
                a.call(Request::ModifyQp { qpn, attr })
            }
            r => a.call(r),
        }),
    );
    fails("verbs.modify.rtr-needs-attributes", swallows("modify_qp"));
}

/// The scenarios no test breaks a device for, in this file or any `tests/broken_*.rs`. Keep this
/// list empty: a scenario that cannot be shown to fail proves nothing.
#[test]
fn every_scenario_has_a_failing_device_test() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut src = String::new();
    for e in std::fs::read_dir(&dir).expect("conformance/tests") {
        let p = e.expect("a directory entry").path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("broken") && name.ends_with(".rs") {
            src += &std::fs::read_to_string(&p).expect("a test file");
        }
    }
    let missing: Vec<&str> = catalogue()
        .iter()
        .map(|s| s.id)
        .filter(|id| !src.contains(&format!("\"{id}\"")))
        .collect();
    assert!(
        missing.is_empty(),
        "scenarios without a failing-device test: {missing:?}"
    );
}

// ---- more RC, UC and UD (issue 20, item 2) ----------------------------------------------------

/// Requests that reach the QP before it is in `ready` (RTR or RTS) are kept, not dropped, and
/// handed to the RNIC, first, with the first frame that comes after: a device that takes
/// requests in a state that must drop them (or, with RTS, one that will not take them in RTR).
fn kept_until(
    ready: rocemu_emulator::rnic::QpState,
) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let up: Rc<RefCell<bool>> = Rc::default();
    move |dut: &SharedDut, inner: SelfAgent| {
        let u = up.clone();
        let mut held: Vec<Vec<u8>> = Vec::new();
        dut.borrow_mut().rx_filter = Some(Box::new(move |f| {
            let req = parse_frame(&f).is_ok_and(|p| p.bth.opcode.info().is_request());
            if !*u.borrow() {
                if req {
                    held.push(f);
                    return vec![];
                }
                return vec![f];
            }
            let mut out = std::mem::take(&mut held);
            out.push(f);
            out
        }));
        Box::new(Wrapped {
            inner,
            f: Box::new(move |a, req| {
                if let Request::ModifyQp { attr, .. } = &req {
                    if attr.qp_state == Some(ready) {
                        *up.borrow_mut() = true;
                    }
                }
                a.call(req)
            }),
        })
    }
}

/// The requester takes every ACK for one of the newest PSN it sent: an ACK acknowledges all
/// that is outstanding, whatever PSN it names.
fn acks_cover_all() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let last: Rc<RefCell<Option<Psn>>> = Rc::default();
    move |dut: &SharedDut, agent| {
        let l = last.clone();
        let mut d = dut.borrow_mut();
        d.tx_filter = Some(Box::new(move |f| {
            if let Ok(p) = parse_frame(&f) {
                if p.bth.opcode.info().is_request() {
                    *l.borrow_mut() = Some(p.bth.psn);
                }
            }
            vec![f]
        }));
        d.rx_filter = Some(Box::new(move |f| {
            vec![rewrite(f, |r, _| {
                if r.bth.opcode == Opcode::RC_ACKNOWLEDGE {
                    if let Some(p) = *last.borrow() {
                        r.bth.psn = p;
                    }
                }
            })]
        }));
        Box::new(agent) as Box<dyn Agent>
    }
}

/// Rewrites the code of every NAK the RNIC receives.
fn nak_read_as(
    from: NakCode,
    to: Syndrome,
) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    rx(move |r, _| {
        if is_nak(r, from) {
            if let Some(a) = r.ext.aeth.as_mut() {
                a.syndrome = to;
            }
        }
    })
}

#[test]
fn zero_length_scenarios_fail_when_zero_length_is_refused() {
    // A device that drops SENDs without payload.
    fails(
        "rdma.send.zero-length-delivered",
        |dut: &SharedDut, agent| {
            dut.borrow_mut().rx_filter = Some(Box::new(|f| {
                let empty = parse_frame(&f)
                    .is_ok_and(|p| p.bth.opcode == Opcode::RC_SEND_ONLY && p.payload.is_empty());
                if empty {
                    vec![]
                } else {
                    vec![f]
                }
            }));
            Box::new(agent) as Box<dyn Agent>
        },
    );
    // A device that checks R_Key 0 of a zero-length READ: a NAK instead of the response.
    fails(
        "rdma.read.zero-length-acked",
        tx(|r, _| {
            if r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY {
                r.bth.opcode = Opcode::RC_ACKNOWLEDGE;
                if let Some(a) = r.ext.aeth.as_mut() {
                    a.syndrome = Syndrome::nak(NakCode::RemoteAccessError);
                }
            }
        }),
    );
    fails(
        "rdma.write-imm.zero-length-completes",
        acks_become_access_naks(),
    );
}

#[test]
fn more_responder_scenarios_fail_when_the_rule_is_broken() {
    // Every WRITE ONLY consumes a receive, as if it carried an immediate.
    fails(
        "rdma.write.no-imm-consumes-no-receive",
        rx(|r, _| {
            if r.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY {
                r.bth.opcode = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
                r.ext.imm = Some(0);
            }
        }),
    );
    fails(
        "rdma.atomic.mr-without-remote-atomic-nak",
        agent(|a, req| match req {
            Request::RegMr { pd, length, .. } => a.call(Request::RegMr {
                pd,
                length,
                access: Access::ALL,
            }),
            r => a.call(r),
        }),
    );
    use rocemu_emulator::rnic::QpState;
    fails("qp.state.reset-drops-requests", kept_until(QpState::Rtr));
    fails("qp.state.init-drops-requests", kept_until(QpState::Rtr));
    fails("qp.state.rtr-accepts-requests", kept_until(QpState::Rts));
    // modify_qp to ERR that does nothing.
    fails(
        "qp.state.err-drops-requests",
        agent(|a, req| match req {
            Request::ModifyQp { attr, .. } if attr.qp_state == Some(QpState::Err) => {
                Ok(Reply::Done)
            }
            r => a.call(r),
        }),
    );
    // Timer code 0 replaced by a default.
    fails(
        "rnr.responder.timer-code-0",
        tx(|r, _| {
            if let Some(a) = r.ext.aeth.as_mut() {
                if let SyndromeKind::RnrNak { timer: 0 } = a.syndrome.kind() {
                    a.syndrome = Syndrome::rnr_nak(14);
                }
            }
        }),
    );
    // A READ counted in the MSN only later.
    fails(
        "ack.msn.read-counts",
        tx(|r, _| {
            if r.bth.opcode.info().is_response() && r.bth.opcode != Opcode::RC_ACKNOWLEDGE {
                if let Some(a) = r.ext.aeth.as_mut() {
                    a.msn = rocemu_wire::Msn::new(a.msn.value().wrapping_sub(1));
                }
            }
        }),
    );
    fails("ack.msn.duplicate-not-counted", psn_blind());
    fails("seq.send.only-over-mtu-nak", mute_naks());
}

#[test]
fn more_requester_scenarios_fail_when_acks_and_naks_are_misread() {
    fails("rdma.requester.ghost-ack-ignored", acks_cover_all());
    fails("rdma.requester.ack-ahead-ignored", acks_cover_all());
    fails(
        "rdma.requester.nak-inv-req-completes-error",
        nak_read_as(
            NakCode::InvalidRequest,
            Syndrome::nak(NakCode::RemoteOperationalError),
        ),
    );
    fails(
        "rdma.requester.nak-rem-op-completes-error",
        nak_read_as(
            NakCode::RemoteOperationalError,
            Syndrome::nak(NakCode::InvalidRequest),
        ),
    );
    // An unknown NAK code taken for an ACK.
    fails(
        "rdma.requester.nak-reserved-code-completes-error",
        nak_read_as(
            NakCode::Reserved(0x1f),
            Syndrome::ack(Syndrome::CREDITS_INVALID),
        ),
    );
}

#[test]
fn uc_scenarios_fail_when_uc_acts_like_rc_or_checks_nothing() {
    fails("uc.send.never-acked", uc_as_rc());
    fails("uc.psn-gap.drops-rest-of-message", psn_blind());
    fails(
        "uc.middle-without-first-dropped",
        rx(|r, _| {
            if r.bth.opcode == Opcode::UC_SEND_MIDDLE {
                r.bth.opcode = Opcode::UC_SEND_ONLY;
            }
        }),
    );
    // The R_Key is not checked: every RETH reaches the RNIC with the last MR's key.
    let key: Rc<RefCell<Option<RKey>>> = Rc::default();
    let k = key.clone();
    fails(
        "uc.write.bad-rkey-silent-drop",
        move |dut: &SharedDut, inner: SelfAgent| {
            dut.borrow_mut().rx_filter = Some(Box::new(move |f| {
                vec![rewrite(f, |r, _| {
                    if let (Some(e), Some(k)) = (r.ext.reth.as_mut(), *k.borrow()) {
                        e.rkey = k;
                    }
                })]
            }));
            Box::new(Wrapped {
                inner,
                f: Box::new(move |a, req| {
                    let r = a.call(req)?;
                    if let Reply::Mr(m) = &r {
                        *key.borrow_mut() = Some(m.rkey);
                    }
                    Ok(r)
                }),
            })
        },
    );
}

#[test]
fn ud_scenarios_fail_when_datagrams_are_mishandled() {
    fails(
        "ud.send.deth-qkey-and-source-qp",
        tx(|r, _| {
            if let Some(d) = r.ext.deth.as_mut() {
                d.src_qpn = Qpn::new(d.src_qpn.value() ^ 1);
            }
        }),
    );
    // The WR's Q_Key sent as it is, high bit and all.
    fails(
        "ud.qkey.controlled-uses-qp-qkey",
        tx(|r, _| {
            if let Some(d) = r.ext.deth.as_mut() {
                d.qkey = QKey(0x8000_0000);
            }
        }),
    );
    fails(
        "ud.send-imm.delivers-imm",
        rx(|r, _| {
            if let Some(i) = r.ext.imm.as_mut() {
                *i ^= 1;
            }
        }),
    );
    // A device that leaves the GRH area empty.
    fails(
        "ud.recv.grh-ipv4-at-offset-20",
        agent(|a, req| {
            let head = matches!(req, Request::ReadMr { offset: 0, .. });
            match a.call(req)? {
                Reply::Data(mut d) if head => {
                    let n = d.len().min(40);
                    d[..n].fill(0);
                    Ok(Reply::Data(d))
                }
                r => Ok(r),
            }
        }),
    );
    // Receives posted four times as long as asked.
    fails(
        "ud.recv.too-short-loc-len-err",
        agent(|a, req| match req {
            Request::PostRecv { qpn, mut wr } => {
                for s in &mut wr.sg {
                    s.length *= 4;
                }
                a.call(Request::PostRecv { qpn, wr })
            }
            r => a.call(r),
        }),
    );
}
