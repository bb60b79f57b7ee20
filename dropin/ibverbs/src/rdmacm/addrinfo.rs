//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`: the system resolver's answer (`getaddrinfo(3)`)
//! in librdmacm's shape. Passive (`RAI_PASSIVE`): the address to bind, the unspecified one
//! without a node; active: the destination, and the source when the hints give one. One answer
//! (the resolver's first), port space TCP and an RC QP unless the hints say otherwise.
#![allow(clippy::missing_safety_doc, clippy::not_unsafe_ptr_arg_deref)]
use super::abi::*;
use crate::abi::{IBV_QPT_RC, IBV_QPT_UD};
use crate::ffi::{guard, set_errno};
use libc::{c_char, c_int, sockaddr, sockaddr_storage};
use std::mem::{size_of, zeroed};
use std::ptr::null_mut;

/// An answer and the storage its pointers point into (freed together).
#[repr(C)]
struct Rai {
    ai: rdma_addrinfo,
    src: sockaddr_storage,
    dst: sockaddr_storage,
}

fn len_of(family: c_int) -> u32 {
    if family == libc::AF_INET6 {
        size_of::<libc::sockaddr_in6>() as u32
    } else {
        size_of::<libc::sockaddr_in>() as u32
    }
}

pub extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's hints, or none.
        let h = unsafe { hints.as_ref() };
        let flags = h.map_or(0, |h| h.ai_flags);
        let ps = h.map_or(0, |h| h.ai_port_space);
        let ps = if ps == 0 { RDMA_PS_TCP } else { ps };
        let qp_type = match h.map_or(0, |h| h.ai_qp_type) {
            0 if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB => IBV_QPT_UD,
            0 => IBV_QPT_RC,
            t => t,
        };
        // SAFETY: addrinfo is plain data.
        let mut ah: libc::addrinfo = unsafe { zeroed() };
        ah.ai_family = h.map_or(0, |h| h.ai_family);
        ah.ai_socktype = if qp_type == IBV_QPT_UD {
            libc::SOCK_DGRAM
        } else {
            libc::SOCK_STREAM
        };
        if flags & RAI_PASSIVE != 0 {
            ah.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            ah.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut out: *mut libc::addrinfo = null_mut();
        // SAFETY: C strings of the caller's (or NULL), our hints, our out pointer.
        let r = unsafe { libc::getaddrinfo(node, service, &ah, &mut out) };
        if r != 0 || out.is_null() {
            // librdmacm returns getaddrinfo's error code as it is.
            set_errno(libc::ENOENT);
            return if r != 0 { r } else { -1 };
        }
        // SAFETY: getaddrinfo's first answer, freed right after the copy.
        let (family, addr, alen) = unsafe { ((*out).ai_family, (*out).ai_addr, (*out).ai_addrlen) };
        // SAFETY: Rai is plain data.
        let mut b: Box<Rai> = Box::new(unsafe { zeroed() });
        // SAFETY: copying at most the storage's size from getaddrinfo's address.
        unsafe {
            let n = (alen as usize).min(size_of::<sockaddr_storage>());
            if flags & RAI_PASSIVE != 0 {
                std::ptr::copy_nonoverlapping(
                    addr.cast::<u8>(),
                    (&mut b.src as *mut sockaddr_storage).cast::<u8>(),
                    n,
                );
            } else {
                std::ptr::copy_nonoverlapping(
                    addr.cast::<u8>(),
                    (&mut b.dst as *mut sockaddr_storage).cast::<u8>(),
                    n,
                );
            }
            libc::freeaddrinfo(out);
        }
        let mut src_given = false;
        if let Some(h) = h {
            if flags & RAI_PASSIVE == 0 && !h.ai_src_addr.is_null() && h.ai_src_len > 0 {
                let n = (h.ai_src_len as usize).min(size_of::<sockaddr_storage>());
                // SAFETY: the hints' source address of the length they give.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        h.ai_src_addr.cast::<u8>(),
                        (&mut b.src as *mut sockaddr_storage).cast::<u8>(),
                        n,
                    )
                };
                src_given = true;
            }
        }
        let p = Box::into_raw(b);
        // SAFETY: p was just leaked from a Box: valid; its pointers point into itself.
        unsafe {
            let ai = &mut (*p).ai;
            ai.ai_flags = flags;
            ai.ai_family = family;
            ai.ai_qp_type = qp_type;
            ai.ai_port_space = ps;
            if flags & RAI_PASSIVE != 0 {
                ai.ai_src_addr = (&mut (*p).src as *mut sockaddr_storage).cast::<sockaddr>();
                ai.ai_src_len = len_of(family);
            } else {
                ai.ai_dst_addr = (&mut (*p).dst as *mut sockaddr_storage).cast::<sockaddr>();
                ai.ai_dst_len = len_of(family);
                if src_given {
                    ai.ai_src_addr = (&mut (*p).src as *mut sockaddr_storage).cast::<sockaddr>();
                    ai.ai_src_len = len_of((*p).src.ss_family as c_int);
                }
            }
            *res = &mut (*p).ai;
        }
        0
    })
}

pub extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: an answer of rdma_getaddrinfo: the first field of a Box<Rai>.
            let b = unsafe { Box::from_raw(p as *mut Rai) };
            p = b.ai.ai_next;
        }
    })
}
