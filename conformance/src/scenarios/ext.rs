//! IBA 1.5 extensions at the responder (issue 20): FLUSH and ATOMIC WRITE. A device that does not
//! say it has them (`query_device`'s `caps`) gets the verdict "unsupported", not a failure.
use crate::cite;
use crate::peer::describe;
use crate::scenario::{pattern, psn_text, unsupported, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_wire::{FethRepr, Opcode, Psn};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "ext.flush.responder-acks",
        title: "IBA 1.5 FLUSH of a registered range (global visibility) is answered at its PSN, positively (unsupported where the device does not offer FLUSH)",
        cites: &[cite::FLUSH_OP],
        run: flush,
    },
    Scenario {
        id: "ext.atomic-write.responder-writes",
        title: "IBA 1.5 ATOMIC WRITE of 8 bytes is answered at its PSN and writes the 8 bytes (unsupported where the device does not offer ATOMIC WRITE)",
        cites: &[cite::ATOMIC_WRITE_OP],
        run: atomic_write,
    },
];

/// The first answer to a request at `psn`: a positive ACK or a zero-length RDMA READ response
/// ONLY (how 1.5 answers FLUSH and ATOMIC WRITE is read in no public source: either is taken).
fn expect_positive(ctx: &mut Ctx<'_>, psn: Psn, why: &str) -> Outcome {
    let got = ctx.peer.collect(None);
    let ok = got.first().is_some_and(|p| {
        p.psn() == psn
            && (p.is_ack()
                || (p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY && p.payload.is_empty()))
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{why} at PSN {}: expected an ACK (or an empty READ response) at that PSN, got {}",
            psn_text(psn),
            describe(&got)
        ))
    }
}

fn flush(ctx: &mut Ctx<'_>) -> Outcome {
    if !ctx.dev.has("flush") {
        return unsupported(
            "the device does not offer IBA 1.5 FLUSH (no \"flush\" in query_device's caps)",
        );
    }
    let c = ctx.connect(ConnOpts::default())?;
    let mut r = ctx
        .req(&c, Opcode::RC_FLUSH, c.peer_psn)
        .reth(c.mr.addr, c.mr.rkey, 64)
        .ack_req(true);
    // Selectivity level 0 (the memory region range), placement type 1 (global visibility).
    r.repr.ext.feth = Some(FethRepr { raw: 0x01 });
    ctx.peer.send(&r)?;
    expect_positive(ctx, c.peer_psn, "a FLUSH of 64 registered bytes")
}

fn atomic_write(ctx: &mut Ctx<'_>) -> Outcome {
    if !ctx.dev.has("atomic_write") {
        return unsupported(
            "the device does not offer IBA 1.5 ATOMIC WRITE (no \"atomic_write\" in query_device's caps)",
        );
    }
    let c = ctx.connect(ConnOpts::default())?;
    ctx.fill_mr(&c, 0, &[0u8; 24])?;
    let data = pattern(0x41, 8);
    let r = ctx
        .req(&c, Opcode::RC_ATOMIC_WRITE, c.peer_psn)
        .reth(c.mr.addr + 8, c.mr.rkey, 8)
        .payload(&data)
        .ack_req(true);
    ctx.peer.send(&r)?;
    expect_positive(ctx, c.peer_psn, "an ATOMIC WRITE of 8 bytes")?;
    let got = ctx.mr_bytes(&c, 8, 8)?;
    if got != data {
        return Err(format!(
            "an ATOMIC WRITE of {data:02x?} at offset 8: the MR holds {got:02x?}"
        ));
    }
    Ok(())
}
