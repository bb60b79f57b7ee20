//! Registering the program's own memory with the core (`ibv_reg_mr`): the one place that
//! makes a region over memory the RNIC does not own.
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::{Access, PdId, Rnic, VerbsError};

/// Registers `len` bytes at `addr` of the program's, addressed by the core as `iova…`.
pub fn register(
    _rnic: &mut Rnic,
    _pd: PdId,
    _addr: *mut u8,
    _len: usize,
    _iova: u64,
    _access: Access,
) -> Result<MrInfo, VerbsError> {
    Err(VerbsError::Invalid(
        "regions over the program's memory need the emulator's ForeignMem (not merged yet)".into(),
    ))
}
