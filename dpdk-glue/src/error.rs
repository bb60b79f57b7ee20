//! One error type for the crate: which DPDK function failed and why, in DPDK's words
//! (`rte_strerror`), with what the caller can do about it.
use rocemu_dpdk_sys as sys;
use std::ffi::CStr;
use std::fmt;

/// A DPDK call (or a check made before one) that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    func: &'static str,
    errno: Option<i32>,
    msg: String,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

// Linux errno values DPDK returns (negated) or leaves in rte_errno.
pub(crate) const EINVAL: i32 = 22;
pub(crate) const EALREADY: i32 = 114;
pub(crate) const ENOTSUP: i32 = 95;
pub(crate) const ENODEV: i32 = 19;
pub(crate) const ENOMEM: i32 = 12;
pub(crate) const EACCES: i32 = 13;

impl Error {
    /// `func` failed with `errno` (positive); `context` says what was being done.
    pub(crate) fn dpdk(func: &'static str, errno: i32, context: impl fmt::Display) -> Error {
        let context = context.to_string();
        let mut msg = strerror(errno);
        if !context.is_empty() {
            msg = format!("{msg} ({context})");
        }
        Error {
            func,
            errno: Some(errno),
            msg,
        }
    }

    /// A failure found before (or instead of) calling `func`.
    pub(crate) fn other(func: &'static str, msg: impl Into<String>) -> Error {
        Error {
            func,
            errno: None,
            msg: msg.into(),
        }
    }

    /// The DPDK function that failed, or was about to be called (`rte_eal_init`, …).
    pub fn function(&self) -> &'static str {
        self.func
    }

    /// The errno DPDK gave (positive), if it gave one.
    pub fn errno(&self) -> Option<i32> {
        self.errno
    }

    /// The message without the function name.
    pub fn message(&self) -> &str {
        &self.msg
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.func, self.msg)
    }
}

impl std::error::Error for Error {}

impl From<Error> for rocemu_emulator::port::PortError {
    fn from(e: Error) -> Self {
        rocemu_emulator::port::PortError(format!("dpdk: {e}"))
    }
}

/// `rte_strerror(errno)`: DPDK's text for its own codes and the C library's for the others.
pub(crate) fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror takes any int and returns a NUL-terminated string, either static or
    // in a thread-local buffer that stays valid until the next call on this thread; it is
    // copied out before anything else runs here. It needs no EAL.
    let text = unsafe { CStr::from_ptr(sys::rte_strerror(errno)) };
    text.to_string_lossy().into_owned()
}

/// rte_errno of the calling thread.
pub(crate) fn rte_errno() -> i32 {
    // SAFETY: reads a thread-local int; no preconditions.
    unsafe { sys::rocemu_rte_errno() }
}

/// Turns DPDK's "negative errno on failure" convention into a `Result`; `context` is only
/// evaluated on failure.
pub(crate) fn check(func: &'static str, ret: i32, context: impl FnOnce() -> String) -> Result<i32> {
    if ret < 0 {
        Err(Error::dpdk(func, -ret, context()))
    } else {
        Ok(ret)
    }
}
