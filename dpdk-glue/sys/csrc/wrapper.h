/* What rocemu-dpdk-sys binds: the DPDK headers it needs and the shim over DPDK's inline
 * hot-path functions (which have no symbol in the shared libraries). */
#ifndef ROCEMU_DPDK_WRAPPER_H
#define ROCEMU_DPDK_WRAPPER_H

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

#include "shim.h"

#endif
