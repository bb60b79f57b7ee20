//! IBVERBS_PRIVATE_34: the interface between libibverbs and its providers (libmlx5, libefa…).
//! Providers are linked against it and must load (BIND_NOW), but on RoCEmu no provider drives
//! a device: their constructors' `verbs_register_driver_34` is accepted and ignored, the rest
//! answers ENOSYS in the shape of its C signature. `ibv_query_gid_type` (librdmacm asks it)
//! is real.
use crate::compat::{errno, minus1, nothing, null};
use crate::ffi::set_errno;
use libc::{c_int, c_void, ENOSYS};

nothing!(
    verbs_register_driver_34,
    __verbs_log,
    verbs_init_cq,
    verbs_set_ops,
    verbs_uninit_context,
);
null!(_verbs_init_and_alloc_context, verbs_open_device);
minus1!(ibv_read_ibdev_sysfs_file);
errno!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

/// `unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, …)`: what it was given.
pub extern "C" fn __ioctl_final_num_attrs(num_attrs: u32, _link: *mut c_void) -> u32 {
    num_attrs
}

/// `verbs_allow_disassociate_destroy(int ret)`: for providers whose device went away; RoCEmu's
/// never go, so `ret` stands.
pub extern "C" fn verbs_allow_disassociate_destroy(ret: c_int) -> c_int {
    ret
}

/// `int ibv_query_gid_type(struct ibv_context *, uint8_t port, unsigned int index,
/// enum ibv_gid_type_sysfs *type)`: every GID of RoCEmu is RoCE v2
/// (`IBV_GID_TYPE_SYSFS_ROCE_V2` = 1).
pub extern "C" fn ibv_query_gid_type(
    ctx: *mut crate::abi::ibv_context,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    crate::ffi::guard(-1, || {
        if ctx.is_null() || ty.is_null() || port != 1 || index >= crate::nic::GID_TBL_LEN {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller passes a writable enum (int) slot, checked non-NULL above.
        unsafe { *ty = 1 };
        0
    })
}
