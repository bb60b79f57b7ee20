/*
 * verbs_torture: what perftest and ibverbs-utils never do, against any libibverbs (RoCEmu's
 * drop-in library under `rocemu exec`, or rdma-core's own over rdma_rxe). Built by
 * scripts/dropin-tests against the system's <infiniband/verbs.h>:
 *
 *     gcc -O2 -Wall -Wextra -Werror -pthread -o verbs_torture tests/c/verbs_torture.c -libverbs
 *     verbs_torture [-d DEV] [-g GID_INDEX] [-p PORT]             server
 *     verbs_torture [-d DEV] [-g GID_INDEX] [-p PORT] SERVER      client
 *
 * Both ends first check, alone, that impossible verbs fail with rdma-core's errno and that a QP
 * moved to ERR flushes its receives. Then they exchange QP numbers, PSNs, GIDs and the server's
 * R_Keys over TCP (host byte order: both ends run on one kind of machine) and the client drives:
 *   A. NTHR threads at once, each on its own QP and CQ: RDMA WRITE, READ back and FETCH_ADD on
 *      one shared counter, into a 1 GiB mmap'ed region of the server (up to its last page);
 *      the server then checks every byte and the counter (no add lost or applied twice).
 *   B. On one QP: a SEND gathered from three SGEs (stack, heap, a MAP_SHARED memfd) scattered
 *      into two (the server's stack and its 1 GiB region); SEND with immediate; an inline SEND
 *      whose buffer is overwritten as soon as ibv_post_send returns; SEND with invalidate; a
 *      WRITE and READ of a region on the server's stack.
 *   C. An R_Key that was never valid, and the one just invalidated: the requester's completion
 *      is IBV_WC_REM_ACCESS_ERR and the QP's next WR is flushed; then the RNIC still serves.
 *   D. Both move a connected QP with posted receives to ERR: every receive flushed, in order.
 * It prints each check and exits 1 on the first failure.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NTHR 4
#define ITERS 64
#define PAGE 4096
#define BIG_LEN (1UL << 30)
#define SLICE (BIG_LEN / NTHR)
#define SCATTER_OFF (512UL << 20) /* where B1's second scatter SGE lands in the 1 GiB region */
#define SMALL_LEN (64 * 1024)
#define IMM 0x12345678u
#define WAIT_S 30

enum { QP_MAIN = NTHR, QP_BAD, QP_INV, NQP };

static int checks;
/* Every R_Key this end's regions ever had, so the server can name one that never was valid. */
static uint32_t seen_rkeys[16];
static int nseen;
static const char *role = "?";

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("FAILED [%s] ", role);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	exit(1);
}

static void ok(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("ok [%s] ", role);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	__atomic_add_fetch(&checks, 1, __ATOMIC_RELAXED);
}

#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

/* What each end tells the other. */
struct info {
	uint32_t qpn[NQP], psn[NQP];
	uint8_t gid[16];
	uint64_t big_addr, stack_addr, inv_addr;
	uint32_t big_rkey, stack_rkey, inv_rkey, bad_rkey;
};

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr dattr;
	struct ibv_port_attr pattr;
	int gid_idx;
	struct ibv_cq *cq[NQP];
	struct ibv_qp *qp[NQP];
	uint32_t max_inline;
	struct info me, peer;
};

static uint8_t pat(uint64_t j, unsigned salt) { return (uint8_t)(j * 7 + salt * 13 + 3); }

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Polls exactly n completions from cq within WAIT_S seconds; returns how many it got. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	double end = now() + WAIT_S;
	while (got < n && now() < end) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			return -1;
		got += r;
	}
	return got;
}

static void expect_wc(struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_status st, const char *what)
{
	CHECK(wc->wr_id == wr_id, "%s: completion of wr_id %llu, expected %llu", what,
	      (unsigned long long)wc->wr_id, (unsigned long long)wr_id);
	CHECK(wc->status == st, "%s: status %s (%d), expected %s", what, ibv_wc_status_str(wc->status),
	      wc->status, ibv_wc_status_str(st));
}

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t len, const char *what)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(mr, "ibv_reg_mr(%s, %zu bytes): %s", what, len, strerror(errno));
	if (nseen < 16)
		seen_rkeys[nseen++] = mr->rkey;
	return mr;
}

static struct ibv_qp *rc_qp(struct end *e, struct ibv_cq *cq, uint32_t *max_inline)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 4, .max_recv_sge = 4,
			 .max_inline_data = 64 },
	};
	struct ibv_qp *qp = ibv_create_qp(e->pd, &a);
	CHECK(qp, "ibv_create_qp(RC): %s", strerror(errno));
	if (max_inline)
		*max_inline = a.cap.max_inline_data;
	return qp;
}

static int to_init(struct ibv_qp *qp, int port)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = port,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
	};
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static const int rts_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

static void connect_qp(struct end *e, int i)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = e->pattr.active_mtu,
		.dest_qp_num = e->peer.qpn[i], .rq_psn = e->peer.psn[i],
		.max_dest_rd_atomic = 4, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .sgid_index = e->gid_idx, .hop_limit = 64 } },
	};
	memcpy(a.ah_attr.grh.dgid.raw, e->peer.gid, 16);
	int r = ibv_modify_qp(e->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
						  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	CHECK(r == 0, "QP %d to RTR: %s", i, strerror(r));
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .sq_psn = e->me.psn[i], .max_rd_atomic = 4 };
	r = ibv_modify_qp(e->qp[i], &s, rts_mask);
	CHECK(r == 0, "QP %d to RTS: %s", i, strerror(r));
}

/* ---- alone: impossible verbs return rdma-core's errno ------------------------------------ */

static void impossible_verbs(struct end *e)
{
	struct ibv_cq *cq;

	errno = 0;
	cq = ibv_create_cq(e->ctx, 0, NULL, NULL, 0);
	CHECK(!cq && errno == EINVAL, "ibv_create_cq(cqe=0): %p, errno %d (%s), expected NULL/EINVAL",
	      (void *)cq, errno, strerror(errno));
	ok("ibv_create_cq(cqe=0) -> NULL, EINVAL");

	errno = 0;
	int huge = e->dattr.max_cqe == INT_MAX ? INT_MAX : e->dattr.max_cqe + 1;
	cq = ibv_create_cq(e->ctx, huge, NULL, NULL, 0);
	CHECK(!cq && (errno == EINVAL || errno == ENOMEM),
	      "ibv_create_cq(cqe=%d > max_cqe %d): %p, errno %d (%s)", huge, e->dattr.max_cqe, (void *)cq,
	      errno, strerror(errno));
	ok("ibv_create_cq(cqe=max_cqe+1=%d) -> NULL, %s", huge, errno == EINVAL ? "EINVAL" : "ENOMEM");

	cq = ibv_create_cq(e->ctx, 16, NULL, NULL, 0);
	CHECK(cq, "ibv_create_cq(16): %s", strerror(errno));

	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = (uint32_t)e->dattr.max_qp_wr + 1, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp(e->pd, &qa);
	CHECK(!qp && errno == EINVAL, "ibv_create_qp(max_send_wr=%u > max_qp_wr): %p, errno %d (%s)",
	      (uint32_t)e->dattr.max_qp_wr + 1, (void *)qp, errno, strerror(errno));
	ok("ibv_create_qp(max_send_wr=max_qp_wr+1) -> NULL, EINVAL");

	qp = rc_qp(e, cq, NULL);
	char buf[64];
	struct ibv_mr *mr = reg(e->pd, buf, sizeof buf, "stack");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	int r = ibv_post_send(qp, &wr, &bad);
	CHECK(r == EINVAL && bad == &wr, "ibv_post_send on a RESET QP: %d (%s), bad_wr %s", r, strerror(r),
	      bad == &wr ? "= wr" : "not wr");
	ok("ibv_post_send on a RESET QP -> EINVAL, bad_wr = the WR");

	struct ibv_qp_attr rts = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				   .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1 };
	r = ibv_modify_qp(qp, &rts, rts_mask);
	CHECK(r == EINVAL, "ibv_modify_qp RESET -> RTS: %d (%s), expected EINVAL", r, strerror(r));
	ok("ibv_modify_qp(RESET -> RTS) -> EINVAL");

	r = to_init(qp, e->dattr.phys_port_cnt + 1);
	CHECK(r == EINVAL, "ibv_modify_qp(INIT, port %d): %d (%s), expected EINVAL",
	      e->dattr.phys_port_cnt + 1, r, strerror(r));
	ok("ibv_modify_qp(RESET -> INIT, port_num %d) -> EINVAL", e->dattr.phys_port_cnt + 1);

	r = to_init(qp, 1);
	CHECK(r == 0, "ibv_modify_qp(RESET -> INIT): %s", strerror(r));
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	r = ibv_query_qp(qp, &qattr, IBV_QP_STATE | IBV_QP_CAP, &qinit);
	CHECK(r == 0 && qattr.qp_state == IBV_QPS_INIT, "ibv_query_qp after INIT: %d, state %d", r,
	      qattr.qp_state);
	int nsge = qinit.cap.max_recv_sge + 1;
	struct ibv_sge *sges = calloc(nsge, sizeof *sges);
	for (int i = 0; i < nsge; i++)
		sges[i] = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 1, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = sges, .num_sge = nsge }, *rbad = NULL;
	r = ibv_post_recv(qp, &rwr, &rbad);
	CHECK(r == EINVAL && rbad == &rwr, "ibv_post_recv(num_sge=%d > max_recv_sge): %d (%s)", nsge, r,
	      strerror(r));
	free(sges);
	ok("ibv_post_recv(num_sge=max_recv_sge+1=%d) -> EINVAL", nsge);

	r = ibv_destroy_cq(cq);
	CHECK(r == EBUSY, "ibv_destroy_cq of a CQ a QP uses: %d (%s), expected EBUSY", r, strerror(r));
	ok("ibv_destroy_cq(CQ with a QP) -> EBUSY");
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq once its QP is gone");

	errno = 0;
	struct ibv_mr *bad_mr = ibv_reg_mr(e->pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE);
	CHECK(!bad_mr && errno == EINVAL, "ibv_reg_mr(REMOTE_WRITE without LOCAL_WRITE): %p, errno %d (%s)",
	      (void *)bad_mr, errno, strerror(errno));
	ok("ibv_reg_mr(REMOTE_WRITE without LOCAL_WRITE) -> NULL, EINVAL");

	struct ibv_pd *pd2 = ibv_alloc_pd(e->ctx);
	CHECK(pd2, "ibv_alloc_pd: %s", strerror(errno));
	struct ibv_mr *mr2 = reg(pd2, buf, sizeof buf, "stack, second PD");
	r = ibv_dealloc_pd(pd2);
	CHECK(r == EBUSY, "ibv_dealloc_pd of a PD with a region: %d (%s), expected EBUSY", r, strerror(r));
	ok("ibv_dealloc_pd(PD with an MR) -> EBUSY");
	CHECK(ibv_dereg_mr(mr2) == 0, "ibv_dereg_mr after EBUSY");
	/* An address handle holds its PD too (rdma-core counts it in the kernel's usecnt). */
	union ibv_gid own;
	CHECK(ibv_query_gid(e->ctx, 1, 1, &own) == 0, "ibv_query_gid(1): %s", strerror(errno));
	struct ibv_ah_attr aha = { .is_global = 1, .port_num = 1, .grh = { .sgid_index = 1, .hop_limit = 64 } };
	aha.grh.dgid = own;
	struct ibv_ah *ah2 = ibv_create_ah(pd2, &aha);
	CHECK(ah2, "ibv_create_ah on the second PD: %s", strerror(errno));
	r = ibv_dealloc_pd(pd2);
	CHECK(r == EBUSY, "ibv_dealloc_pd of a PD with an AH: %d (%s), expected EBUSY", r, strerror(r));
	ok("ibv_dealloc_pd(PD with an AH) -> EBUSY");
	CHECK(ibv_destroy_ah(ah2) == 0 && ibv_dealloc_pd(pd2) == 0, "destroy_ah/dealloc after EBUSY");
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	struct ibv_port_attr pa;
	r = ibv_query_port(e->ctx, e->dattr.phys_port_cnt + 1, &pa);
	CHECK(r != 0, "ibv_query_port(port %d) of a device with %d port(s) succeeded",
	      e->dattr.phys_port_cnt + 1, e->dattr.phys_port_cnt);
	ok("ibv_query_port(port %d) -> %d (%s)", e->dattr.phys_port_cnt + 1, r, strerror(r));

	union ibv_gid g;
	r = ibv_query_gid(e->ctx, 1, e->pattr.gid_tbl_len, &g);
	CHECK(r != 0, "ibv_query_gid(index %d = gid_tbl_len) succeeded", e->pattr.gid_tbl_len);
	ok("ibv_query_gid(index gid_tbl_len=%d) fails", e->pattr.gid_tbl_len);
}

/* Posts n receives (wr_id base..base+n-1) on qp, moves it to ERR, and expects every receive
 * flushed in order, then one posted in ERR flushed too. */
static void flush_receives(struct end *e, struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *mr,
			   int n, uint64_t base, const char *what)
{
	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)mr->addr + i * 64, .length = 64, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = base + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		int r = ibv_post_recv(qp, &wr, &bad);
		CHECK(r == 0, "%s: ibv_post_recv %d: %s", what, i, strerror(r));
	}
	int r = to_err(qp);
	CHECK(r == 0, "%s: ibv_modify_qp(ERR): %s", what, strerror(r));
	struct ibv_wc wc[64];
	int got = poll_n(cq, wc, n);
	CHECK(got == n, "%s: %d of %d receives completed after ERR", what, got, n);
	for (int i = 0; i < n; i++) {
		expect_wc(&wc[i], base + i, IBV_WC_WR_FLUSH_ERR, what);
	}
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = base + n, .sg_list = &sge, .num_sge = 1 }, *bad;
	r = ibv_post_recv(qp, &wr, &bad);
	CHECK(r == 0, "%s: ibv_post_recv in ERR: %s", what, strerror(r));
	got = poll_n(cq, wc, 1);
	CHECK(got == 1, "%s: a receive posted in ERR never completed", what);
	expect_wc(&wc[0], base + n, IBV_WC_WR_FLUSH_ERR, what);
	(void)e;
	ok("%s: %d posted receives and one posted in ERR flushed (IBV_WC_WR_FLUSH_ERR), in order", what, n);
}

static void flush_alone(struct end *e, struct ibv_mr *mr)
{
	struct ibv_cq *cq = ibv_create_cq(e->ctx, 64, NULL, NULL, 0);
	CHECK(cq, "ibv_create_cq: %s", strerror(errno));
	struct ibv_qp *qp = rc_qp(e, cq, NULL);
	CHECK(to_init(qp, 1) == 0, "to INIT");
	flush_receives(e, qp, cq, mr, 8, 100, "QP in INIT moved to ERR");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(cq) == 0, "destroy QP and CQ");
}

/* ---- TCP ---------------------------------------------------------------------------------- */

static void xfer(int fd, void *p, size_t n, int out)
{
	char *c = p;
	while (n) {
		ssize_t r = out ? write(fd, c, n) : read(fd, c, n);
		CHECK(r > 0, "TCP %s: %s", out ? "write" : "read", r == 0 ? "peer closed" : strerror(errno));
		c += r;
		n -= r;
	}
}

static void sync_peer(int fd, char tag)
{
	char t;
	xfer(fd, &tag, 1, 1);
	xfer(fd, &t, 1, 0);
	CHECK(t == tag, "out of step with the peer: got '%c', expected '%c'", t, tag);
}

static int tcp_connect(const char *host, int port)
{
	int fd = -1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(inet_pton(AF_INET, host, &a.sin_addr) == 1, "%s: not an IPv4 address", host);
	for (int i = 0; i < 100; i++) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
			return fd;
		close(fd);
		usleep(100000);
	}
	fail("cannot connect to %s:%d: %s", host, port, strerror(errno));
	return -1;
}

static int tcp_accept(int port)
{
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0, "listen on %d: %s", port,
	      strerror(errno));
	int fd = accept(l, NULL, NULL);
	CHECK(fd >= 0, "accept: %s", strerror(errno));
	close(l);
	return fd;
}

/* ---- A: threads ---------------------------------------------------------------------------- */

struct thr {
	struct end *e;
	int i;
	struct ibv_mr *mr; /* the client's MAP_SHARED region */
	uint64_t max_fetch; /* every FETCH_ADD of the run must return less than this */
	char err[256];
};

static void *thread_main(void *p)
{
	struct thr *t = p;
	struct end *e = t->e;
	uint8_t *src = (uint8_t *)t->mr->addr + t->i * 2 * PAGE, *dst = src + PAGE;
	uint64_t *fetched = (uint64_t *)((uint8_t *)t->mr->addr + NTHR * 2 * PAGE) + t->i;
	for (int k = 0; k < ITERS; k++) {
		uint64_t off = (uint64_t)(t->i + 1) * SLICE - (uint64_t)(k + 1) * PAGE;
		for (int j = 0; j < PAGE; j++)
			src[j] = pat(off + j, 1);
		memset(dst, 0, PAGE);
		struct ibv_sge s0 = { .addr = (uintptr_t)src, .length = PAGE, .lkey = t->mr->lkey };
		struct ibv_sge s1 = { .addr = (uintptr_t)dst, .length = PAGE, .lkey = t->mr->lkey };
		struct ibv_sge s2 = { .addr = (uintptr_t)fetched, .length = 8, .lkey = t->mr->lkey };
		struct ibv_send_wr fa = { .wr_id = 3, .sg_list = &s2, .num_sge = 1,
					  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD, .send_flags = IBV_SEND_SIGNALED,
					  .wr.atomic = { .remote_addr = e->peer.big_addr, .compare_add = 1,
							 .rkey = e->peer.big_rkey } };
		struct ibv_send_wr rd = { .wr_id = 2, .next = &fa, .sg_list = &s1, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
					  .wr.rdma = { .remote_addr = e->peer.big_addr + off, .rkey = e->peer.big_rkey } };
		struct ibv_send_wr wr = { .wr_id = 1, .next = &rd, .sg_list = &s0, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
					  .wr.rdma = { .remote_addr = e->peer.big_addr + off, .rkey = e->peer.big_rkey } };
		struct ibv_send_wr *bad;
		int r = ibv_post_send(e->qp[t->i], &wr, &bad);
		if (r) {
			snprintf(t->err, sizeof t->err, "thread %d: ibv_post_send: %s", t->i, strerror(r));
			return t;
		}
		struct ibv_wc wc[3];
		int got = poll_n(e->cq[t->i], wc, 3);
		if (got != 3) {
			snprintf(t->err, sizeof t->err, "thread %d iteration %d: %d of 3 completions", t->i, k, got);
			return t;
		}
		for (int c = 0; c < 3; c++)
			if (wc[c].status != IBV_WC_SUCCESS || wc[c].wr_id != (uint64_t)c + 1) {
				snprintf(t->err, sizeof t->err, "thread %d iteration %d: completion %d: wr_id %llu %s",
					 t->i, k, c, (unsigned long long)wc[c].wr_id, ibv_wc_status_str(wc[c].status));
				return t;
			}
		if (wc[0].opcode != IBV_WC_RDMA_WRITE || wc[1].opcode != IBV_WC_RDMA_READ ||
		    wc[2].opcode != IBV_WC_FETCH_ADD || wc[1].byte_len != PAGE) {
			snprintf(t->err, sizeof t->err, "thread %d: opcodes %d %d %d, read byte_len %u", t->i,
				 wc[0].opcode, wc[1].opcode, wc[2].opcode, wc[1].byte_len);
			return t;
		}
		if (memcmp(src, dst, PAGE)) {
			snprintf(t->err, sizeof t->err, "thread %d iteration %d: READ at offset %llu returned other bytes than the WRITE",
				 t->i, k, (unsigned long long)off);
			return t;
		}
		if (*fetched >= t->max_fetch) {
			snprintf(t->err, sizeof t->err, "thread %d: FETCH_ADD returned %llu", t->i,
				 (unsigned long long)*fetched);
			return t;
		}
	}
	return NULL;
}

/* ---- the two ends ---------------------------------------------------------------------------- */

static void post_recv1(struct ibv_qp *qp, uint64_t id, struct ibv_sge *sge, int n)
{
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = sge, .num_sge = n }, *bad;
	int r = ibv_post_recv(qp, &wr, &bad);
	CHECK(r == 0, "ibv_post_recv %llu: %s", (unsigned long long)id, strerror(r));
}

static void post_send1(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	int r = ibv_post_send(qp, wr, &bad);
	CHECK(r == 0, "ibv_post_send wr_id %llu: %s", (unsigned long long)wr->wr_id, strerror(r));
}

static void check_bytes(const uint8_t *p, uint64_t from, size_t n, unsigned salt, const char *what)
{
	for (size_t j = 0; j < n; j++)
		CHECK(p[j] == pat(from + j, salt), "%s: byte %zu is %u, expected %u", what, j, p[j],
		      pat(from + j, salt));
}

static void server(struct end *e, int fd)
{
	uint8_t stackbuf[8192]; /* a region on the stack: lives until server() returns */
	memset(stackbuf, 0, sizeof stackbuf);
	uint8_t *big = mmap(NULL, BIG_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			    -1, 0);
	CHECK(big != MAP_FAILED, "mmap 1 GiB: %s", strerror(errno));
	struct ibv_mr *bigmr = reg(e->pd, big, BIG_LEN, "1 GiB mmap'ed");
	ok("ibv_reg_mr of a 1 GiB anonymous mapping: lkey %#x rkey %#x", bigmr->lkey, bigmr->rkey);
	struct ibv_mr *smr = reg(e->pd, stackbuf, sizeof stackbuf, "stack");
	uint8_t *heap = calloc(1, SMALL_LEN), *invbuf = calloc(1, PAGE);
	struct ibv_mr *hmr = reg(e->pd, heap, SMALL_LEN, "heap");
	struct ibv_mr *imr = reg(e->pd, invbuf, PAGE, "to be invalidated");

	e->me.big_addr = (uintptr_t)big;
	e->me.big_rkey = bigmr->rkey;
	e->me.stack_addr = (uintptr_t)stackbuf;
	e->me.stack_rkey = smr->rkey;
	e->me.inv_addr = (uintptr_t)invbuf;
	e->me.inv_rkey = imr->rkey;
	/* An R_Key none of our regions ever had, for the client's C1. */
	e->me.bad_rkey = 0x5a5a5a5a;
	for (int again = 1; again;) {
		again = 0;
		for (int i = 0; i < nseen; i++)
			if (seen_rkeys[i] == e->me.bad_rkey)
				again = 1;
		if (again)
			e->me.bad_rkey = e->me.bad_rkey * 2654435761u + 1;
	}

	/* B's receives, posted before the client learns our QPNs. */
	struct ibv_qp *qp = e->qp[QP_MAIN];
	struct ibv_sge r0[2] = { { (uintptr_t)stackbuf, 2000, smr->lkey },
				 { (uintptr_t)big + SCATTER_OFF, PAGE, bigmr->lkey } };
	post_recv1(qp, 1, r0, 2);
	struct ibv_sge r1 = { (uintptr_t)heap, 256, hmr->lkey };
	post_recv1(qp, 2, &r1, 1);
	struct ibv_sge r2 = { (uintptr_t)heap + 1024, 64, hmr->lkey };
	post_recv1(qp, 3, &r2, 1);
	struct ibv_sge r3 = { (uintptr_t)heap + 2048, 64, hmr->lkey };
	post_recv1(qp, 4, &r3, 1);

	xfer(fd, &e->me, sizeof e->me, 1);
	xfer(fd, &e->peer, sizeof e->peer, 0);
	for (int i = 0; i < NQP; i++)
		connect_qp(e, i);
	ok("%d RC QPs connected", NQP);
	sync_peer(fd, 'R');

	/* A */
	sync_peer(fd, 'A');
	for (int i = 0; i < NTHR; i++)
		for (int k = 0; k < ITERS; k++) {
			uint64_t off = (uint64_t)(i + 1) * SLICE - (uint64_t)(k + 1) * PAGE;
			check_bytes(big + off, off, PAGE, 1, "A: a thread's WRITE into the 1 GiB region");
		}
	uint64_t counter;
	memcpy(&counter, big, 8);
	CHECK(counter == (uint64_t)NTHR * ITERS, "A: the shared counter is %llu after %d FETCH_ADDs of 1",
	      (unsigned long long)counter, NTHR * ITERS);
	ok("A: %d threads' WRITEs landed in the 1 GiB region (last page included); counter %llu = every FETCH_ADD once",
	   NTHR, (unsigned long long)counter);

	/* B */
	struct ibv_wc wc[4];
	int got = poll_n(e->cq[QP_MAIN], wc, 4);
	CHECK(got == 4, "B: %d of 4 receives completed", got);
	for (int i = 0; i < 4; i++) {
		expect_wc(&wc[i], i + 1, IBV_WC_SUCCESS, "B: receive");
		CHECK(wc[i].opcode == IBV_WC_RECV, "B: receive %d has opcode %d", i + 1, wc[i].opcode);
	}
	CHECK(wc[0].byte_len == 4100, "B1: byte_len %u, expected 4100", wc[0].byte_len);
	check_bytes(stackbuf, 0, 2000, 2, "B1: first scatter SGE (stack)");
	check_bytes(big + SCATTER_OFF, 2000, 2100, 2, "B1: second scatter SGE (1 GiB region)");
	ok("B1: a SEND gathered from 3 SGEs (stack, heap, memfd) scattered into 2 (stack, 1 GiB mmap), 4100 bytes");
	CHECK(wc[1].wc_flags & IBV_WC_WITH_IMM, "B2: no IBV_WC_WITH_IMM");
	CHECK(be32toh(wc[1].imm_data) == IMM, "B2: immediate %#x, expected %#x", be32toh(wc[1].imm_data), IMM);
	CHECK(wc[1].byte_len == 200, "B2: byte_len %u", wc[1].byte_len);
	check_bytes(heap, 0, 200, 3, "B2: SEND with immediate's payload");
	ok("B2: SEND with immediate %#x, 200 bytes", IMM);
	CHECK(wc[2].byte_len == 48, "B3: byte_len %u", wc[2].byte_len);
	check_bytes(heap + 1024, 0, 48, 4, "B3: inline SEND (the buffer was overwritten after posting)");
	ok("B3: inline SEND carried the bytes as they were at ibv_post_send");
	CHECK(wc[3].wc_flags & IBV_WC_WITH_INV, "B4: no IBV_WC_WITH_INV (flags %#x)", wc[3].wc_flags);
	CHECK(wc[3].invalidated_rkey == imr->rkey, "B4: invalidated R_Key %#x, expected %#x",
	      wc[3].invalidated_rkey, imr->rkey);
	ok("B4: SEND with invalidate of R_Key %#x", imr->rkey);
	sync_peer(fd, 'B');
	check_bytes(stackbuf + 4096, 0, 256, 5, "B5: the client's WRITE into our stack region");
	ok("B5: WRITE into a region on the stack");

	/* C: the client sees its errors; we only stay up. */
	sync_peer(fd, 'C');

	/* D */
	flush_receives(e, qp, e->cq[QP_MAIN], hmr, 8, 200, "D: a connected QP moved to ERR");
	sync_peer(fd, 'D');

	for (int i = 0; i < NQP; i++)
		CHECK(ibv_destroy_qp(e->qp[i]) == 0, "ibv_destroy_qp %d", i);
	CHECK(ibv_dereg_mr(bigmr) == 0 && ibv_dereg_mr(smr) == 0 && ibv_dereg_mr(hmr) == 0 &&
		      ibv_dereg_mr(imr) == 0,
	      "ibv_dereg_mr");
	munmap(big, BIG_LEN);
	free(heap);
	free(invbuf);
}

static void client(struct end *e, int fd)
{
	uint8_t stackbuf[4096]; /* a region on the stack */
	struct ibv_mr *smr = reg(e->pd, stackbuf, sizeof stackbuf, "stack");
	uint8_t *heap = calloc(1, SMALL_LEN);
	struct ibv_mr *hmr = reg(e->pd, heap, SMALL_LEN, "heap");
	int mfd = memfd_create("verbs_torture", 0);
	CHECK(mfd >= 0 && ftruncate(mfd, SMALL_LEN) == 0, "memfd: %s", strerror(errno));
	uint8_t *shm = mmap(NULL, SMALL_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	CHECK(shm != MAP_FAILED, "mmap memfd: %s", strerror(errno));
	struct ibv_mr *mmr = reg(e->pd, shm, SMALL_LEN, "MAP_SHARED memfd");

	xfer(fd, &e->me, sizeof e->me, 1);
	xfer(fd, &e->peer, sizeof e->peer, 0);
	for (int i = 0; i < NQP; i++)
		connect_qp(e, i);
	ok("%d RC QPs connected", NQP);
	sync_peer(fd, 'R');

	/* A */
	pthread_t th[NTHR];
	struct thr t[NTHR];
	for (int i = 0; i < NTHR; i++) {
		t[i] = (struct thr){ .e = e, .i = i, .mr = mmr, .max_fetch = (uint64_t)NTHR * ITERS };
		CHECK(pthread_create(&th[i], NULL, thread_main, &t[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < NTHR; i++) {
		void *r;
		pthread_join(th[i], &r);
		CHECK(!r, "A: %s", t[i].err);
	}
	ok("A: %d threads x %d iterations of WRITE + READ back + FETCH_ADD, each on its own QP and CQ, at once",
	   NTHR, ITERS);
	sync_peer(fd, 'A');

	/* B */
	struct ibv_qp *qp = e->qp[QP_MAIN];
	for (int j = 0; j < 100; j++)
		stackbuf[j] = pat(j, 2);
	for (int j = 0; j < 1000; j++)
		heap[j] = pat(100 + j, 2);
	for (int j = 0; j < 3000; j++)
		shm[40960 + j] = pat(1100 + j, 2);
	struct ibv_sge g[3] = { { (uintptr_t)stackbuf, 100, smr->lkey },
				{ (uintptr_t)heap, 1000, hmr->lkey },
				{ (uintptr_t)shm + 40960, 3000, mmr->lkey } };
	struct ibv_send_wr w1 = { .wr_id = 1, .sg_list = g, .num_sge = 3, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	post_send1(qp, &w1);

	for (int j = 0; j < 200; j++)
		heap[4096 + j] = pat(j, 3);
	struct ibv_sge s2 = { (uintptr_t)heap + 4096, 200, hmr->lkey };
	struct ibv_send_wr w2 = { .wr_id = 2, .sg_list = &s2, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = htobe32(IMM) };
	post_send1(qp, &w2);

	CHECK(e->max_inline >= 48, "B3: the QP's max_inline_data is %u, asked for 64", e->max_inline);
	uint8_t inl[48]; /* not registered: inline data needs no L_Key */
	for (int j = 0; j < 48; j++)
		inl[j] = pat(j, 4);
	struct ibv_sge s3 = { (uintptr_t)inl, 48, 0 };
	struct ibv_send_wr w3 = { .wr_id = 3, .sg_list = &s3, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
	post_send1(qp, &w3);
	memset(inl, 0xee, sizeof inl); /* the WR owns no buffer once posted inline */

	for (int j = 0; j < 64; j++)
		heap[8192 + j] = (uint8_t)j;
	struct ibv_sge s4 = { (uintptr_t)heap + 8192, 64, hmr->lkey };
	struct ibv_send_wr w4 = { .wr_id = 4, .sg_list = &s4, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
				  .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = e->peer.inv_rkey };
	post_send1(qp, &w4);

	/* B5: WRITE then READ back a region on the server's stack. */
	for (int j = 0; j < 256; j++)
		heap[12288 + j] = pat(j, 5);
	memset(heap + 16384, 0, 256);
	struct ibv_sge s5 = { (uintptr_t)heap + 12288, 256, hmr->lkey };
	struct ibv_sge s6 = { (uintptr_t)heap + 16384, 256, hmr->lkey };
	struct ibv_send_wr w6 = { .wr_id = 6, .sg_list = &s6, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = e->peer.stack_addr + 4096, .rkey = e->peer.stack_rkey } };
	struct ibv_send_wr w5 = { .wr_id = 5, .next = &w6, .sg_list = &s5, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = e->peer.stack_addr + 4096, .rkey = e->peer.stack_rkey } };
	post_send1(qp, &w5);

	struct ibv_wc wc[8];
	int got = poll_n(e->cq[QP_MAIN], wc, 6);
	CHECK(got == 6, "B: %d of 6 send completions", got);
	static const int ops[6] = { IBV_WC_SEND, IBV_WC_SEND, IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE,
				    IBV_WC_RDMA_READ };
	for (int i = 0; i < 6; i++) {
		expect_wc(&wc[i], i + 1, IBV_WC_SUCCESS, "B: send queue");
		CHECK(wc[i].opcode == (enum ibv_wc_opcode)ops[i], "B: completion %d has opcode %d, expected %d",
		      i + 1, wc[i].opcode, ops[i]);
	}
	CHECK(memcmp(heap + 12288, heap + 16384, 256) == 0, "B5: READ of the server's stack region differs");
	ok("B: gathered SEND, SEND with immediate, inline SEND, SEND with invalidate, WRITE + READ of a stack region: all completed");
	sync_peer(fd, 'B');

	/* C1: never valid R_Key */
	struct ibv_sge s7 = { (uintptr_t)heap, 64, hmr->lkey };
	struct ibv_send_wr w7 = { .wr_id = 7, .sg_list = &s7, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = e->peer.big_addr, .rkey = e->peer.bad_rkey } };
	post_send1(e->qp[QP_BAD], &w7);
	got = poll_n(e->cq[QP_BAD], wc, 1);
	CHECK(got == 1, "C1: the WRITE with a bad R_Key never completed");
	expect_wc(&wc[0], 7, IBV_WC_REM_ACCESS_ERR, "C1: WRITE with an R_Key never valid");
	ok("C1: WRITE with R_Key %#x (never valid) -> IBV_WC_REM_ACCESS_ERR", e->peer.bad_rkey);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(e->qp[QP_BAD], &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR,
	      "C1: the QP is in state %d after the access error, not ERR", qa.qp_state);
	w7.wr_id = 8;
	post_send1(e->qp[QP_BAD], &w7);
	got = poll_n(e->cq[QP_BAD], wc, 1);
	CHECK(got == 1, "C1: a WR posted on the QP in ERR never completed");
	expect_wc(&wc[0], 8, IBV_WC_WR_FLUSH_ERR, "C1: WR posted in ERR");
	ok("C1: the QP is in ERR and the next WR is flushed");

	/* C2: the R_Key B4 invalidated */
	struct ibv_send_wr w9 = { .wr_id = 9, .sg_list = &s7, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = e->peer.inv_addr, .rkey = e->peer.inv_rkey } };
	post_send1(e->qp[QP_INV], &w9);
	got = poll_n(e->cq[QP_INV], wc, 1);
	CHECK(got == 1, "C2: the WRITE with an invalidated R_Key never completed");
	expect_wc(&wc[0], 9, IBV_WC_REM_ACCESS_ERR, "C2: WRITE with the R_Key SEND with invalidate invalidated");
	ok("C2: WRITE with the invalidated R_Key %#x -> IBV_WC_REM_ACCESS_ERR", e->peer.inv_rkey);

	/* C3: both RNICs still serve. */
	t[0] = (struct thr){ .e = e, .i = 0, .mr = mmr, .max_fetch = (uint64_t)(NTHR + 1) * ITERS };
	CHECK(!thread_main(&t[0]), "C3: after the errors: %s", t[0].err);
	ok("C3: after the errors, WRITE + READ + FETCH_ADD on another QP still work");
	sync_peer(fd, 'C');

	/* D */
	flush_receives(e, qp, e->cq[QP_MAIN], hmr, 8, 200, "D: a connected QP moved to ERR");
	sync_peer(fd, 'D');

	for (int i = 0; i < NQP; i++)
		CHECK(ibv_destroy_qp(e->qp[i]) == 0, "ibv_destroy_qp %d", i);
	CHECK(ibv_dereg_mr(smr) == 0 && ibv_dereg_mr(hmr) == 0 && ibv_dereg_mr(mmr) == 0, "ibv_dereg_mr");
	munmap(shm, SMALL_LEN);
	close(mfd);
	free(heap);
}

int main(int argc, char **argv)
{
	const char *devname = NULL, *host = NULL;
	int port = 18515, opt;
	struct end e = { .gid_idx = 1 };
	while ((opt = getopt(argc, argv, "d:g:p:")) != -1) {
		switch (opt) {
		case 'd': devname = optarg; break;
		case 'g': e.gid_idx = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-d DEV] [-g GID_INDEX] [-p PORT] [SERVER]\n", argv[0]);
			return 2;
		}
	}
	if (optind < argc)
		host = argv[optind];
	role = host ? "client" : "server";
	setvbuf(stdout, NULL, _IOLBF, 0);

	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no RDMA device (%s)", list ? "empty list" : strerror(errno));
	struct ibv_device *dev = NULL;
	for (int i = 0; i < n; i++)
		if (!devname || !strcmp(ibv_get_device_name(list[i]), devname))
			dev = dev ? dev : list[i];
	CHECK(dev, "no device %s", devname);
	e.ctx = ibv_open_device(dev);
	CHECK(e.ctx, "ibv_open_device(%s): %s", ibv_get_device_name(dev), strerror(errno));
	CHECK(ibv_query_device(e.ctx, &e.dattr) == 0, "ibv_query_device");
	CHECK(ibv_query_port(e.ctx, 1, &e.pattr) == 0, "ibv_query_port(1)");
	CHECK(e.pattr.state == IBV_PORT_ACTIVE && e.pattr.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "port 1: state %d, link layer %d", e.pattr.state, e.pattr.link_layer);
	union ibv_gid gid;
	CHECK(ibv_query_gid(e.ctx, 1, e.gid_idx, &gid) == 0, "ibv_query_gid(%d)", e.gid_idx);
	memcpy(e.me.gid, gid.raw, 16);
	char gs[INET6_ADDRSTRLEN];
	inet_ntop(AF_INET6, gid.raw, gs, sizeof gs);
	ok("%s: port ACTIVE, active_mtu %d, GID[%d] %s", ibv_get_device_name(dev), 128 << e.pattr.active_mtu,
	   e.gid_idx, gs);
	e.pd = ibv_alloc_pd(e.ctx);
	CHECK(e.pd, "ibv_alloc_pd: %s", strerror(errno));

	impossible_verbs(&e);
	void *fb = calloc(1, PAGE);
	struct ibv_mr *fmr = reg(e.pd, fb, PAGE, "heap");
	flush_alone(&e, fmr);

	for (int i = 0; i < NQP; i++) {
		e.cq[i] = ibv_create_cq(e.ctx, 128, NULL, NULL, 0);
		CHECK(e.cq[i], "ibv_create_cq: %s", strerror(errno));
		e.qp[i] = rc_qp(&e, e.cq[i], i == QP_MAIN ? &e.max_inline : NULL);
		CHECK(to_init(e.qp[i], 1) == 0, "QP %d to INIT", i);
		e.me.qpn[i] = e.qp[i]->qp_num;
		e.me.psn[i] = (uint32_t)(rand() ^ (i * 0x10101)) & 0xffffff;
	}

	int fd;
	if (host) {
		fd = tcp_connect(host, port);
		client(&e, fd);
	} else {
		fd = tcp_accept(port);
		server(&e, fd);
	}
	close(fd);
	for (int i = 0; i < NQP; i++)
		CHECK(ibv_destroy_cq(e.cq[i]) == 0, "ibv_destroy_cq %d", i);
	CHECK(ibv_dereg_mr(fmr) == 0 && ibv_dealloc_pd(e.pd) == 0, "dereg / dealloc_pd at the end");
	CHECK(ibv_close_device(e.ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	printf("verbs_torture [%s]: all %d checks passed\n", role, checks);
	return 0;
}
