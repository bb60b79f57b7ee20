//! Registering the program's own memory with the core (`ibv_reg_mr`): the one place in this
//! crate that makes a region over memory the RNIC does not own (the raw accesses themselves are
//! the emulator's `dma` module's).
use rocemu_emulator::dma::ForeignMem;
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::{Access, PdId, Rnic, VerbsError};

/// Registers `len` bytes at `addr` of the program's, addressed by the core as `iova…`: under
/// keys the RNIC picks (`keys` None: shard 0, or a device of one shard), or under the keys
/// (L_Key, R_Key) shard 0 gave the same memory (another shard of the device).
///
/// The caller checked that `[addr, addr + len)` does not wrap; that the range is mapped is the
/// program's promise to `ibv_reg_mr` (as to any NIC: a region over memory it does not have is
/// its own fault, and a real NIC's DMA to it would fault too).
pub fn register(
    rnic: &mut Rnic,
    pd: PdId,
    addr: *mut u8,
    len: usize,
    iova: u64,
    access: Access,
    keys: Option<(u32, u32)>,
) -> Result<MrInfo, VerbsError> {
    // SAFETY: ibv_reg_mr's contract (verbs: the memory stays allocated and mapped until
    // ibv_dereg_mr, which deregisters the region in every shard, each under its lock, dropping
    // the ForeignMem before it returns), as ForeignMem::new asks.
    let mem = unsafe { ForeignMem::new(addr, len) };
    match keys {
        None => rnic.reg_mr_foreign(pd, mem, iova, access),
        Some(keys) => rnic.reg_mr_foreign_keyed(pd, mem, iova, access, keys),
    }
}

/// `ibv_rereg_mr` in one shard: the region with L_Key `lkey` moves to `pd`, to the program's
/// `len` bytes at `addr` (addressed as `addr`'s value, as `ibv_rereg_mr` gives no iova) and to
/// `access`, each where given. The caller checked the whole change with
/// [`Rnic::check_rereg_mr`] in every shard, and that the range does not wrap.
pub fn reregister(
    rnic: &mut Rnic,
    lkey: u32,
    pd: Option<PdId>,
    translation: Option<(*mut u8, usize)>,
    access: Option<Access>,
) -> Result<MrInfo, VerbsError> {
    // SAFETY: as in `register`: ibv_rereg_mr's contract keeps the new memory allocated and
    // mapped until the region is deregistered or re-registered again.
    let mem = translation.map(|(addr, len)| (unsafe { ForeignMem::new(addr, len) }, addr as u64));
    rnic.rereg_mr(lkey, pd, mem, access)
}
