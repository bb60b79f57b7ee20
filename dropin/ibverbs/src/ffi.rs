//! What every entry point needs: errno, a guard that keeps panics from unwinding into C, and
//! the errno a core error stands for.
use libc::c_int;
use rocemu_emulator::rnic::VerbsError;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, valid for the thread's
    // life.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`; if it panics, says so on stderr and returns `on_panic` (a panic must not unwind
/// into the C caller: since Rust 1.81 that aborts the program).
pub fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// The errno rdma-core's providers return for what the core refused.
pub fn errno_of(e: &VerbsError) -> c_int {
    match e {
        VerbsError::Invalid(_) => libc::EINVAL,
        VerbsError::NoSpace(_) => libc::ENOMEM,
        VerbsError::NotFound(_) => libc::EINVAL,
        VerbsError::Busy(_) => libc::EBUSY,
        VerbsError::CqOverrun { .. } => libc::EIO,
    }
}

/// Copies `s` into a fixed C char array, NUL-terminated, truncated if it must be.
pub fn copy_cstr(dst: &mut [libc::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as libc::c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}
