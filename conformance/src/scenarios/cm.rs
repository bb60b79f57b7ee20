//! The device's communication manager as an rdma_cm client meets it (issue 20): a REQ for a
//! service nobody listens on, and a duplicate REQ. The peer is the active side
//! ([`crate::cm_peer`]); the agent listens.
use crate::cite;
use crate::cm_peer::{self, Accepted, Offer, Patience};
use crate::scenario::{Ctx, Outcome, Scenario};
use rocemu_wire::cm::{CmMadRepr, CmMessage, CommId, Guid, MsgKind, RejReason};
use rocemu_wire::mad::Tid;
use rocemu_wire::Qpn;

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "cm.rej.unknown-service-id",
        title: "A REQ for an rdma_cm port nobody listens on is answered by a REJ of that REQ with reason 8 (Invalid Service ID)",
        cites: &[cite::REJ_INVALID_SID],
        run: rej_unknown_service,
    },
    Scenario {
        id: "cm.req.duplicate-one-connection",
        title: "The same REQ sent twice makes one connection: no REJ, any REP again names the same communication ID and QP, and the agent lists one connection",
        cites: &[cite::CM_DUPLICATE_REQ],
        run: duplicate_req,
    },
];

fn offer(ctx: &mut Ctx<'_>) -> Offer {
    Offer {
        comm_id: CommId((ctx.random() as u32).max(1)),
        guid: Guid(ctx.random() | 1),
        qpn: Qpn::new(0x100 + (ctx.random() % 0xff_0000) as u32),
        psn: ctx.random_psn(),
        src_port: 32768 + (ctx.random() % 28000) as u16,
        path_mtu: 3,
        tid: Tid(ctx.random()),
    }
}

/// Listens on a random port, runs `f` with it, and stops listening whatever `f` gave.
fn listening(ctx: &mut Ctx<'_>, f: impl FnOnce(&mut Ctx<'_>, u16) -> Outcome) -> Outcome {
    let port = 0x4000 + (ctx.random() % 0x8000) as u16;
    ctx.agent.cm_listen(port)?;
    let r = f(ctx, port);
    let stopped = ctx.agent.cm_stop(port);
    r?;
    Ok(stopped?)
}

fn rej_unknown_service(ctx: &mut Ctx<'_>) -> Outcome {
    listening(ctx, |ctx, port| {
        // The port next to the one listened on: the device's CM runs, nobody listens there.
        let other = if port == u16::MAX { port - 1 } else { port + 1 };
        let o = offer(ctx);
        let req = cm_peer::req(&ctx.peer, other, &o)?;
        let m = CmMadRepr::new(o.tid, CmMessage::Req(req));
        let patience = Patience::for_settle(ctx.peer.settle);
        for _ in 0..patience.tries {
            cm_peer::send(&mut ctx.peer, &m)?;
            let deadline = ctx.peer.now() + patience.wait;
            while let Some((_, got)) = ctx.peer.recv_mad(deadline.saturating_sub(ctx.peer.now())) {
                match got.msg {
                    CmMessage::Rej(rej) if rej.remote_comm_id == o.comm_id => {
                        if rej.reason != RejReason::INVALID_SERVICE_ID
                            || rej.message_rejected != MsgKind::Req
                        {
                            return Err(format!(
                                "a REQ for port {other} (nobody listens): expected a REJ of the REQ with reason 8 (Invalid Service ID), got reason {} of {:?}",
                                rej.reason, rej.message_rejected
                            ));
                        }
                        return Ok(());
                    }
                    CmMessage::Rep(rep) if rep.remote_comm_id == o.comm_id => {
                        return Err(format!(
                            "a REQ for port {other}, where nobody listens, was accepted (REP from QP 0x{:06x})",
                            rep.local_qpn.value()
                        ));
                    }
                    _ => {}
                }
            }
        }
        Err(format!(
            "a REQ for port {other} (nobody listens): no REJ within {} × {} ms",
            patience.tries,
            patience.wait.as_millis()
        ))
    })
}

fn duplicate_req(ctx: &mut Ctx<'_>) -> Outcome {
    listening(ctx, |ctx, port| {
        let o = offer(ctx);
        let patience = Patience::for_settle(ctx.peer.settle);
        let a = cm_peer::connect(&mut ctx.peer, port, &o, patience)?;
        let r = again(ctx, port, &o, &a, patience);
        // End the connection whatever the duplicate did.
        cm_peer::rtu(&mut ctx.peer, &a)?;
        let listed = ctx.agent.cm_connections()?;
        let tid = Tid(ctx.random());
        let ended = cm_peer::disconnect(&mut ctx.peer, &a, tid, patience);
        r?;
        let mine: Vec<_> = listed.iter().filter(|c| c.port == port).collect();
        if mine.len() != 1 || mine[0].qpn != a.rep.local_qpn {
            return Err(format!(
                "after the same REQ twice, expected one connection on port {port} (QP 0x{:06x}); the agent lists {}",
                a.rep.local_qpn.value(),
                mine.iter()
                    .map(|c| format!("QP 0x{:06x}", c.qpn.value()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        ended
    })
}

/// Sends the REQ of `a` again and judges what comes within one wait.
fn again(ctx: &mut Ctx<'_>, port: u16, o: &Offer, a: &Accepted, p: Patience) -> Outcome {
    let req = cm_peer::req(&ctx.peer, port, o)?;
    cm_peer::send(&mut ctx.peer, &CmMadRepr::new(o.tid, CmMessage::Req(req)))?;
    let deadline = ctx.peer.now() + p.wait;
    while let Some((_, got)) = ctx.peer.recv_mad(deadline.saturating_sub(ctx.peer.now())) {
        match got.msg {
            CmMessage::Rep(rep)
                if rep.remote_comm_id == o.comm_id
                    && (rep.local_comm_id != a.rep.local_comm_id
                        || rep.local_qpn != a.rep.local_qpn) =>
            {
                return Err(format!(
                    "the same REQ again got a REP for another connection: communication ID 0x{:08x} QP 0x{:06x}, the first REP's were 0x{:08x} and 0x{:06x}",
                    rep.local_comm_id.0,
                    rep.local_qpn.value(),
                    a.rep.local_comm_id.0,
                    a.rep.local_qpn.value()
                ));
            }
            CmMessage::Rej(rej) if rej.remote_comm_id == o.comm_id => {
                return Err(format!(
                    "the same REQ again (the REP not yet answered by an RTU) was rejected: {}",
                    rej.reason
                ));
            }
            _ => {}
        }
    }
    Ok(())
}
