/* Out-of-line copies of DPDK's static inline functions and macros, so that Rust can call them.
 * Each one is a one-line forward; see shim.c. */
#ifndef ROCEMU_DPDK_SHIM_H
#define ROCEMU_DPDK_SHIM_H

#include <stdint.h>

struct rte_mbuf;
struct rte_mempool;

/* rte_errno of the calling thread (a per-lcore TLS variable behind a macro). */
int rocemu_rte_errno(void);
/* rte_lcore_id(): the EAL lcore of the calling thread, or LCORE_ID_ANY. */
unsigned int rocemu_lcore_id(void);

uint16_t rocemu_eth_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts,
                             uint16_t nb_pkts);
uint16_t rocemu_eth_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts,
                             uint16_t nb_pkts);

struct rte_mbuf *rocemu_pktmbuf_alloc(struct rte_mempool *mp);
/* 0 on success (all `count` allocated), a negative errno otherwise (none allocated). */
int rocemu_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count);
void rocemu_pktmbuf_free(struct rte_mbuf *m);

/* rte_pktmbuf_mtod(m, void *): the first byte of the first segment's data. */
void *rocemu_pktmbuf_data(struct rte_mbuf *m);
uint16_t rocemu_pktmbuf_data_len(const struct rte_mbuf *m);
uint32_t rocemu_pktmbuf_pkt_len(const struct rte_mbuf *m);
uint16_t rocemu_pktmbuf_nb_segs(const struct rte_mbuf *m);
/* Makes a single-segment mbuf `len` bytes long: data_len = pkt_len = len. */
void rocemu_pktmbuf_set_len(struct rte_mbuf *m, uint16_t len);
uint16_t rocemu_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t rocemu_pktmbuf_tailroom(const struct rte_mbuf *m);
struct rte_mempool *rocemu_pktmbuf_pool(const struct rte_mbuf *m);
/* rte_pktmbuf_data_room_size(mp): data room of each mbuf of a pktmbuf pool, headroom included. */
uint16_t rocemu_pktmbuf_data_room_size(struct rte_mempool *mp);

/* Runs `cb(arg)` on the EAL's interrupt thread each time `fd` (an eventfd or pipe the caller
 * keeps open for the life of the process) is readable: rte_intr_instance_alloc, an EXT handle
 * on `fd`, rte_intr_callback_register. 0, or a negative errno. The handle is never freed. */
int rocemu_intr_watch(int fd, void (*cb)(void *), void *arg);

#endif
