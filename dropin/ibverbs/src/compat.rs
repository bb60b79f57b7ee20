//! rdma-core's compatibility entry points for programs linked before libibverbs 1.1 (2006):
//! `name@IBVERBS_1.0`, taking the old `ibv_*_1_0` structs. Nothing built since links to them;
//! they answer ENOSYS in the shape of their C signature (NULL, an errno, -1, nothing).
#![allow(clippy::missing_safety_doc)]
use crate::ffi::set_errno;
use libc::{c_int, c_void, ENOSYS};

macro_rules! null {
    ($($n:ident),* $(,)?) => { $(pub extern "C" fn $n() -> *mut c_void { set_errno(ENOSYS); std::ptr::null_mut() })* };
}
macro_rules! errno {
    ($($n:ident),* $(,)?) => { $(pub extern "C" fn $n() -> c_int { set_errno(ENOSYS); ENOSYS })* };
}
macro_rules! minus1 {
    ($($n:ident),* $(,)?) => { $(pub extern "C" fn $n() -> c_int { set_errno(ENOSYS); -1 })* };
}
macro_rules! nothing {
    ($($n:ident),* $(,)?) => { $(pub extern "C" fn $n() {})* };
}
pub(crate) use {errno, minus1, nothing, null};

null!(
    ibv_alloc_pd,
    ibv_create_ah,
    ibv_create_cq,
    ibv_create_qp,
    ibv_create_srq,
    ibv_get_device_list,
    ibv_get_device_name,
    ibv_open_device,
    ibv_reg_mr,
);
errno!(
    ibv_attach_mcast,
    ibv_close_device,
    ibv_dealloc_pd,
    ibv_dereg_mr,
    ibv_destroy_ah,
    ibv_destroy_cq,
    ibv_destroy_qp,
    ibv_destroy_srq,
    ibv_detach_mcast,
    ibv_modify_qp,
    ibv_modify_srq,
    ibv_query_device,
    ibv_query_gid,
    ibv_query_pkey,
    ibv_query_port,
    ibv_query_qp,
    ibv_query_srq,
    ibv_resize_cq,
);
minus1!(ibv_get_async_event, ibv_get_cq_event);
nothing!(
    ibv_ack_async_event,
    ibv_ack_cq_events,
    ibv_free_device_list,
    ibv_register_driver
);

/// `__be64 ibv_get_device_guid(struct ibv_device_1_0 *)`: 0.
pub extern "C" fn ibv_get_device_guid() -> u64 {
    set_errno(ENOSYS);
    0
}
