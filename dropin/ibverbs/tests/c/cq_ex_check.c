/* ibv_create_cq_ex and the extended poll API, against the system's verbs.h on RoCEmu's
 * libibverbs: the same traffic (SEND with immediate, RDMA WRITE, RDMA WRITE with immediate) runs
 * twice between two RNICs (this process and a forked child with PEER_IP / PEER_MAC), once on QPs
 * whose CQs are plain (ibv_create_cq, ibv_poll_cq) and once on QPs whose CQs are extended
 * (ibv_create_cq_ex with the wc_flags perftest and UCX ask for, polled with start/next/end_poll
 * and the read_* ops, the last completions with ibv_poll_cq through ibv_cq_ex_to_cq). Every field
 * read through the ops must equal what ibv_poll_cq reported for the same work request, and both
 * must be what the traffic implies. Completion timestamps, in the device clock ibv_query_device_ex
 * announces, must not go back and must fall between the post and the poll that returned them
 * (CLOCK_MONOTONIC: the library's documented clock). The child's extended receive CQ is on a completion channel:
 * ibv_req_notify_cq, poll(2) on the fd, ibv_get_cq_event. Also: the errno of impossible
 * arguments. Prints "ok" and exits 0 when everything held. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); failures++; } } while (0)

#define N 30          /* work requests per QP: i % 3 is SEND_WITH_IMM, RDMA_WRITE, WRITE_WITH_IMM */
#define NRECV 20      /* the receives they consume */
#define REGION 16384
#define RECV_SLOT 256
#define WRITE_AT 6144   /* RDMA WRITE i lands at WRITE_AT + i * 256 */
#define WC_FLAGS (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | \
		  IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)

static struct ibv_context *ctx;
static struct ibv_pd *pd;

/* Pair 0: plain CQs; pair 1: extended CQs. */
static struct ibv_cq *cq[2];
static struct ibv_cq_ex *cqx;
static struct ibv_comp_channel *chan;
static struct ibv_qp *qp[2];
static struct ibv_mr *mr[2];
static char *buf[2];

struct info { uint32_t qpn[2]; uint32_t rkey[2]; uint64_t addr[2]; union ibv_gid gid; };
static struct info peer;

/* One completion as either API reported it. */
struct rec { uint64_t wr_id; int status, opcode; uint32_t byte_len, imm, qp_num, src_qp; unsigned flags; uint64_t ts; };

/* The device clock (kHz) and CLOCK_MONOTONIC now, in ns. */
static uint64_t clock_khz;
static uint64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
static uint64_t ts_ns(uint64_t ts) { return (uint64_t)((unsigned __int128)ts * 1000000u / clock_khz); }

static int len_of(int i) { return i % 3 == 0 ? 100 + i : i % 3 == 1 ? 200 + i : 50 + i; }
static uint32_t imm_of(int i) { return 0xabc000u + (uint32_t)i; }

static int connect_qp(struct ibv_qp *q, uint32_t dest, union ibv_gid *gid) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE };
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return 1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = dest; a.rq_psn = 0;
	a.max_dest_rd_atomic = 1; a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = *gid; a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64; a.ah_attr.port_num = 1;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return 3;
	return 0;
}

/* Both pairs' CQs, QPs and regions; the extended CQ on `channel` if given. */
static int setup(struct info *me, struct ibv_comp_channel *channel) {
	if (ibv_query_gid(ctx, 1, 1, &me->gid)) return 1;
	cq[0] = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .cq_context = &cqx, .channel = channel,
		.comp_vector = 0, .wc_flags = WC_FLAGS, .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
		.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED };
	cqx = ibv_create_cq_ex(ctx, &ca);
	if (!cq[0] || !cqx) { fprintf(stderr, "create_cq_ex: errno %d\n", errno); return 2; }
	cq[1] = ibv_cq_ex_to_cq(cqx);
	if ((void *)cq[1] != (void *)cqx || cq[1]->context != ctx || cq[1]->channel != channel ||
	    cq[1]->cq_context != &cqx || cq[1]->cqe < 64)
		return 3;
	for (int k = 0; k < 2; k++) {
		struct ibv_qp_init_attr a = { .send_cq = cq[k], .recv_cq = cq[k], .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 64, .max_recv_wr = 32, .max_send_sge = 1, .max_recv_sge = 1 } };
		qp[k] = ibv_create_qp(pd, &a);
		buf[k] = calloc(1, REGION);
		mr[k] = buf[k] ? ibv_reg_mr(pd, buf[k], REGION, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : NULL;
		if (!qp[k] || !mr[k]) return 4;
		me->qpn[k] = qp[k]->qp_num; me->rkey[k] = mr[k]->rkey; me->addr[k] = (uintptr_t)buf[k];
	}
	return 0;
}

static void from_wc(struct rec *r, const struct ibv_wc *wc) {
	*r = (struct rec){ wc->wr_id, wc->status, wc->opcode, wc->byte_len,
		(wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0, wc->qp_num, wc->src_qp, wc->wc_flags, 0 };
}

static void from_ops(struct rec *r, struct ibv_cq_ex *c) {
	unsigned flags = ibv_wc_read_wc_flags(c);
	*r = (struct rec){ c->wr_id, c->status, ibv_wc_read_opcode(c), ibv_wc_read_byte_len(c),
		(flags & IBV_WC_WITH_IMM) ? ntohl(ibv_wc_read_imm_data(c)) : 0, ibv_wc_read_qp_num(c),
		ibv_wc_read_src_qp(c), flags, ibv_wc_read_completion_ts(c) };
	CHECK(ibv_wc_read_vendor_err(c) == 0, "vendor_err");
}

static int poll_plain(struct ibv_cq *c, struct rec *out, int want) {
	int got = 0, spins = 0;
	while (got < want && spins++ < 50000000) {
		struct ibv_wc wc[4];
		int n = ibv_poll_cq(c, want - got < 4 ? want - got : 4, wc);
		if (n < 0) return -1;
		for (int j = 0; j < n; j++) from_wc(&out[got++], &wc[j]);
	}
	return got;
}

/* start/next/end_poll for the first `with_ops` completions, ibv_poll_cq for the rest. */
static int poll_ex(struct ibv_cq_ex *c, struct rec *out, int want, int with_ops) {
	struct ibv_poll_cq_attr pa = { 0 };
	int got = 0, spins = 0;
	while (got < with_ops && spins++ < 50000000) {
		int r = ibv_start_poll(c, &pa);
		if (r == ENOENT) continue;
		if (r) { fprintf(stderr, "start_poll: %d\n", r); return -1; }
		do {
			from_ops(&out[got++], c);
		} while (got < with_ops && (r = ibv_next_poll(c)) == 0);
		ibv_end_poll(c);
		if (r != 0 && r != ENOENT) { fprintf(stderr, "next_poll: %d\n", r); return -1; }
	}
	if (got < with_ops) return got;
	int n = poll_plain(ibv_cq_ex_to_cq(c), out + got, want - got);
	return n < 0 ? -1 : got + n;
}

/* The pair-1 record must be the pair-0 one with the pair's QP numbers; both what traffic i
 * implies (`recv`: the receiver's side). */
static void compare(const struct rec *p, const struct rec *x, int n, int recv, uint32_t my[2], uint32_t their[2]) {
	for (int j = 0; j < n; j++) {
		const struct rec *a = &p[j], *b = &x[j];
		/* Timestamps (those read through the ops: nonzero) never go back. */
		CHECK(j == 0 || !b->ts || !x[j - 1].ts || b->ts >= x[j - 1].ts, "%d: timestamp %lu after %lu", j,
		      (unsigned long)b->ts, (unsigned long)x[j - 1].ts);
		CHECK(a->wr_id == b->wr_id && a->status == b->status && a->opcode == b->opcode &&
		      a->byte_len == b->byte_len && a->imm == b->imm && a->flags == b->flags,
		      "%s %d: plain (wr_id %lu st %d op %d len %u imm %x fl %x) vs ops (wr_id %lu st %d op %d len %u imm %x fl %x)",
		      recv ? "recv" : "send", j, (unsigned long)a->wr_id, a->status, a->opcode, a->byte_len, a->imm, a->flags,
		      (unsigned long)b->wr_id, b->status, b->opcode, b->byte_len, b->imm, b->flags);
		CHECK(a->qp_num == my[0] && b->qp_num == my[1], "%d: qp_num %u %u, expected %u %u", j, a->qp_num, b->qp_num, my[0], my[1]);
		/* src_qp: 0, the peer's QP or (the core's requester completions) the QP's own. */
		CHECK((a->src_qp == 0 && b->src_qp == 0) || (a->src_qp == their[0] && b->src_qp == their[1]) ||
		      (a->src_qp == my[0] && b->src_qp == my[1]),
		      "%d: src_qp %u %u (peers %u %u, own %u %u)", j, a->src_qp, b->src_qp, their[0], their[1], my[0], my[1]);
		CHECK(a->status == IBV_WC_SUCCESS, "%d: status %s", j, ibv_wc_status_str(a->status));
		if (recv) {
			/* The receives complete in order: the j-th one is taken by the j-th SEND or
			 * WRITE_WITH_IMM, work request i. */
			int i = (j / 2) * 3 + (j % 2 ? 2 : 0);
			CHECK(a->wr_id == (uint64_t)(1000 + j), "recv %d: wr_id %lu", j, (unsigned long)a->wr_id);
			CHECK(a->opcode == (i % 3 == 0 ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM), "recv %d: opcode %d", j, a->opcode);
			CHECK((a->flags & IBV_WC_WITH_IMM) && a->imm == imm_of(i), "recv %d: imm %x flags %x", j, a->imm, a->flags);
			CHECK(i % 3 != 0 || a->byte_len == (uint32_t)len_of(i), "recv %d: byte_len %u", j, a->byte_len);
		} else {
			int i = j;
			CHECK(a->wr_id == (uint64_t)i, "send %d: wr_id %lu", j, (unsigned long)a->wr_id);
			CHECK(a->opcode == (i % 3 == 0 ? IBV_WC_SEND : IBV_WC_RDMA_WRITE), "send %d: opcode %d", j, a->opcode);
			CHECK(!(a->flags & IBV_WC_WITH_IMM), "send %d: flags %x", j, a->flags);
		}
	}
}

static uint32_t my_qpn[2];

static int child(int in, int out) {
	struct info me;
	chan = ibv_create_comp_channel(ctx);
	if (!chan || setup(&me, chan)) return 10;
	my_qpn[0] = me.qpn[0]; my_qpn[1] = me.qpn[1];
	if (write(out, &me, sizeof me) != sizeof me || read(in, &peer, sizeof peer) != sizeof peer) return 11;
	for (int k = 0; k < 2; k++) {
		if (connect_qp(qp[k], peer.qpn[k], &peer.gid)) return 12;
		for (int j = 0; j < NRECV; j++) {
			struct ibv_sge s = { (uintptr_t)buf[k] + j * RECV_SLOT, RECV_SLOT, mr[k]->lkey };
			struct ibv_recv_wr w = { .wr_id = 1000 + j, .sg_list = &s, .num_sge = 1 }, *bad;
			if (ibv_post_recv(qp[k], &w, &bad)) return 13;
		}
	}
	/* Armed before the traffic: its first completion is an event on the channel. */
	if (ibv_req_notify_cq(ibv_cq_ex_to_cq(cqx), 0)) return 14;
	char c = 'r';
	uint64_t t0 = now_ns();
	if (write(out, &c, 1) != 1) return 15;
	struct pollfd pfd = { .fd = chan->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 10000) == 1, "child: no event on the extended CQ's channel");
	struct ibv_cq *ecq; void *ectx;
	CHECK(ibv_get_cq_event(chan, &ecq, &ectx) == 0 && ecq == ibv_cq_ex_to_cq(cqx) && ectx == &cqx, "child: get_cq_event");
	ibv_ack_cq_events(ecq, 1);
	struct rec p[NRECV], x[NRECV];
	CHECK(poll_plain(cq[0], p, NRECV) == NRECV, "child: plain receives");
	CHECK(poll_ex(cqx, x, NRECV, NRECV - 4) == NRECV, "child: extended receives");
	uint64_t t1 = now_ns();
	for (int j = 0; j < NRECV - 4; j++)
		CHECK(ts_ns(x[j].ts) >= t0 && ts_ns(x[j].ts) <= t1, "child: receive %d stamped %lu ns, not in [%lu, %lu]",
		      j, (unsigned long)ts_ns(x[j].ts), (unsigned long)t0, (unsigned long)t1);
	compare(p, x, NRECV, 1, my_qpn, peer.qpn);
	/* The RDMA WRITEs (with immediate or not) landed, every byte. */
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < N; i++)
			for (int b = 0; i % 3 && b < len_of(i); b++)
				if (buf[k][WRITE_AT + i * 256 + b] != (char)(i & 0x7f)) {
					CHECK(0, "child: write %d on pair %d, byte %d", i, k, b);
					break;
				}
	struct ibv_poll_cq_attr pa = { 0 };
	CHECK(ibv_start_poll(cqx, &pa) == ENOENT, "child: start_poll on an empty CQ");
	if (read(in, &c, 1) != 1) return 16;
	for (int k = 0; k < 2; k++) CHECK(ibv_destroy_qp(qp[k]) == 0, "child: destroy_qp");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0 && ibv_destroy_cq(cq[0]) == 0, "child: destroy_cq");
	CHECK(ibv_destroy_comp_channel(chan) == 0, "child: destroy the channel after its CQ");
	return failures ? 17 : 0;
}

static int open_dev(void) {
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || n != 1) { fprintf(stderr, "no device\n"); return 2; }
	ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	if (!ctx) { fprintf(stderr, "open failed\n"); return 2; }
	pd = ibv_alloc_pd(ctx);
	/* The device clock the timestamps count in. */
	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(ctx, NULL, &dx) || !dx.hca_core_clock || !dx.completion_timestamp_mask) {
		fprintf(stderr, "no device clock: hca_core_clock %lu\n", (unsigned long)dx.hca_core_clock);
		return 2;
	}
	clock_khz = dx.hca_core_clock;
	return pd ? 0 : 2;
}

int main(void) {
	int p2c[2], c2p[2];
	if (pipe(p2c) || pipe(c2p)) return 2;
	pid_t pid = fork();
	if (pid == 0) {
		setenv("ROCEMU_IP", getenv("PEER_IP"), 1);
		setenv("ROCEMU_MAC", getenv("PEER_MAC"), 1);
		if (open_dev()) _exit(2);
		_exit(child(p2c[0], c2p[1]));
	}
	if (open_dev()) return 2;

	/* Impossible or unsupported arguments: rdma-core's errno. */
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = WC_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK };
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EOPNOTSUPP, "wallclock: errno %d", errno);
	ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EOPNOTSUPP, "flow tag: errno %d", errno);
	ca.wc_flags = WC_FLAGS; ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS; ca.flags = 1 << 7;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EOPNOTSUPP, "unknown create flag: errno %d", errno);
	ca.flags = 0; ca.comp_mask = 1 << 5;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EOPNOTSUPP, "unknown comp_mask: errno %d", errno);
	ca.comp_mask = 0; ca.cqe = 0;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EINVAL, "cqe 0: errno %d", errno);
	ca.cqe = 1u << 30;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EINVAL, "cqe 2^30: errno %d", errno);
	ca.cqe = 0xffffffffu;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EINVAL, "cqe 2^32-1: errno %d", errno);
	ca.cqe = 16; ca.comp_vector = 5;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EINVAL, "comp_vector 5: errno %d", errno);
	ca.comp_vector = 0;
	struct ibv_cq_ex *e = ibv_create_cq_ex(ctx, &ca);
	CHECK(e != NULL, "create_cq_ex: errno %d", errno);
	if (e) {
		struct ibv_poll_cq_attr pa = { .comp_mask = 1 };
		CHECK(ibv_start_poll(e, &pa) == EINVAL, "start_poll with comp_mask 1");
		pa.comp_mask = 0;
		CHECK(ibv_start_poll(e, &pa) == ENOENT, "start_poll on an empty CQ");
		/* ENOENT released the poll lock: a second start_poll does not wait. */
		CHECK(ibv_start_poll(e, &pa) == ENOENT, "start_poll again");
		struct ibv_wc wc;
		CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(e), 1, &wc) == 0, "poll_cq on an empty extended CQ");
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(e)) == 0, "destroy an extended CQ");
	}

	/* The traffic, on both pairs. */
	struct info me;
	CHECK(setup(&me, NULL) == 0, "setup");
	my_qpn[0] = me.qpn[0]; my_qpn[1] = me.qpn[1];
	CHECK(read(c2p[0], &peer, sizeof peer) == sizeof peer && write(p2c[1], &me, sizeof me) == sizeof me, "exchange");
	for (int k = 0; k < 2; k++) CHECK(connect_qp(qp[k], peer.qpn[k], &peer.gid) == 0, "connect %d: errno %d", k, errno);
	char c;
	CHECK(read(c2p[0], &c, 1) == 1, "child ready");
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < N; i++) {
			int len = len_of(i);
			char *src = buf[k] + 4096;
			memset(src, i & 0x7f, len);
			struct ibv_sge s = { (uintptr_t)src, len, mr[k]->lkey };
			struct ibv_send_wr w = { .wr_id = i, .sg_list = &s, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED }, *bad;
			w.opcode = i % 3 == 0 ? IBV_WR_SEND_WITH_IMM : i % 3 == 1 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_WRITE_WITH_IMM;
			w.imm_data = htonl(imm_of(i));
			w.wr.rdma.remote_addr = peer.addr[k] + WRITE_AT + i * 256; w.wr.rdma.rkey = peer.rkey[k];
			uint64_t t0 = now_ns();
			CHECK(ibv_post_send(qp[k], &w, &bad) == 0, "post %d on pair %d", i, k);
			/* One at a time: the source buffer is reused. */
			struct rec r;
			if (k == 0) {
				CHECK(poll_plain(cq[0], &r, 1) == 1, "plain send completion %d", i);
			} else {
				CHECK(poll_ex(cqx, &r, 1, i < N - 6 ? 1 : 0) == 1, "extended send completion %d", i);
				uint64_t t1 = now_ns();
				CHECK(i >= N - 6 || (ts_ns(r.ts) >= t0 && ts_ns(r.ts) <= t1),
				      "send %d stamped %lu ns, not in [%lu, %lu]", i, (unsigned long)ts_ns(r.ts), (unsigned long)t0, (unsigned long)t1);
			}
			static struct rec rec[2][N];
			rec[k][i] = r;
			if (k == 1 && i == N - 1) compare(rec[0], rec[1], N, 0, my_qpn, peer.qpn);
		}
	c = 'd';
	CHECK(write(p2c[1], &c, 1) == 1, "done");
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %d", st);
	if (failures) return 1;
	printf("ok\n");
	return 0;
}
