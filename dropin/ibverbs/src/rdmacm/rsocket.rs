//! librdmacm's rsockets (`rsocket`, `rsend`, … : sockets over RDMA, RDMACM_1.0) are exported so
//! that programs linked against them load, and answer ENOSYS: RoCEmu does not implement them.
#![allow(clippy::missing_safety_doc)]
use crate::ffi::set_errno;
use libc::{c_int, c_void, size_t, ssize_t};

fn nosys() -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

macro_rules! nosys_int {
    ($($name:ident),* $(,)?) => {
        $(pub extern "C" fn $name() -> c_int { nosys() })*
    };
}

macro_rules! nosys_ssize {
    ($($name:ident),* $(,)?) => {
        $(pub extern "C" fn $name() -> ssize_t { nosys() as ssize_t })*
    };
}

nosys_int!(
    rsocket,
    rbind,
    rlisten,
    raccept,
    rconnect,
    rshutdown,
    rclose,
    rpoll,
    rselect,
    rgetpeername,
    rgetsockname,
    rsetsockopt,
    rgetsockopt,
    rfcntl,
    riounmap,
);
nosys_ssize!(
    rrecv, rrecvfrom, rrecvmsg, rsend, rsendto, rsendmsg, rread, rreadv, rwrite, rwritev, riowrite
);

/// `off_t riomap(int, void *, size_t, int, int, off_t)`: -1 as its error.
pub extern "C" fn riomap(
    _s: c_int,
    _buf: *mut c_void,
    _len: size_t,
    _prot: c_int,
    _flags: c_int,
    _off: libc::off_t,
) -> libc::off_t {
    nosys() as libc::off_t
}
