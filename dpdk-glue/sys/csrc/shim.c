/* See shim.h. Compiled with the cflags pkg-config gives for libdpdk (rte_config.h first). */
/* rte_intr_instance_alloc and the handle setters are still experimental in DPDK 22.11. */
#define ALLOW_EXPERIMENTAL_API
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_interrupts.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

#include "shim.h"

int rocemu_rte_errno(void) { return rte_errno; }

unsigned int rocemu_lcore_id(void) { return rte_lcore_id(); }

uint16_t rocemu_eth_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts,
                             uint16_t nb_pkts) {
    return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t rocemu_eth_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts,
                             uint16_t nb_pkts) {
    return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
}

struct rte_mbuf *rocemu_pktmbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }

int rocemu_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count) {
    return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void rocemu_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }

void *rocemu_pktmbuf_data(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, void *); }

uint16_t rocemu_pktmbuf_data_len(const struct rte_mbuf *m) { return rte_pktmbuf_data_len(m); }

uint32_t rocemu_pktmbuf_pkt_len(const struct rte_mbuf *m) { return rte_pktmbuf_pkt_len(m); }

uint16_t rocemu_pktmbuf_nb_segs(const struct rte_mbuf *m) { return m->nb_segs; }

void rocemu_pktmbuf_set_len(struct rte_mbuf *m, uint16_t len) {
    m->data_len = len;
    m->pkt_len = len;
}

uint16_t rocemu_pktmbuf_headroom(const struct rte_mbuf *m) { return rte_pktmbuf_headroom(m); }

uint16_t rocemu_pktmbuf_tailroom(const struct rte_mbuf *m) { return rte_pktmbuf_tailroom(m); }

struct rte_mempool *rocemu_pktmbuf_pool(const struct rte_mbuf *m) { return m->pool; }

uint16_t rocemu_pktmbuf_data_room_size(struct rte_mempool *mp) {
    return rte_pktmbuf_data_room_size(mp);
}

int rocemu_intr_watch(int fd, void (*cb)(void *), void *arg) {
    struct rte_intr_handle *h = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
    if (h == NULL)
        return -rte_errno;
    if (rte_intr_fd_set(h, fd) != 0 || rte_intr_type_set(h, RTE_INTR_HANDLE_EXT) != 0) {
        int e = rte_errno;
        rte_intr_instance_free(h);
        return -e;
    }
    int ret = rte_intr_callback_register(h, cb, arg);
    if (ret < 0)
        rte_intr_instance_free(h);
    return ret;
}
