/* What Debian's tools never do, against the system's verbs.h on RoCEmu's libibverbs:
 * impossible arguments (each must return the errno rdma-core's providers return, never crash),
 * then several threads posting RDMA WRITEs (two SGEs each) and polling at once, into the regions
 * of a second RNIC (a forked child with PEER_IP / PEER_MAC), which checks the bytes; and an
 * R_Key that was never valid. One of the threads waits for its completions on a completion
 * channel's fd with poll(2). Then ibv_resize_cq around completions waiting in a CQ, and
 * ibv_rereg_mr: its error codes, a new translation, a new PD. Prints "ok" and exits 0 when
 * everything held. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <poll.h>
#include <time.h>
#include <infiniband/verbs.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); failures++; } } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;

static struct ibv_qp *rc_qp(struct ibv_cq *cq) {
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 2 } };
	return ibv_create_qp(pd, &a);
}

static int connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return 1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = dest; a.rq_psn = 0;
	a.max_dest_rd_atomic = 1; a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = *gid; a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64; a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return 3;
	return 0;
}

#define THREADS 4
#define WRITES 500
#define LEN 4096

/* What each process tells the other. */
struct info { uint32_t qpn[THREADS]; uint32_t rkey[THREADS]; uint64_t addr[THREADS]; union ibv_gid gid; };

static struct info peer;
static struct ibv_cq *cqs[THREADS];
/* Thread 0 of the requester waits on a completion channel (poll(2) on its fd, then
 * ibv_get_cq_event) instead of spinning. */
static struct ibv_comp_channel *chan;
static struct ibv_qp *qps[THREADS];
static struct ibv_mr *mrs[THREADS];
static char *bufs[THREADS];

static int pattern(int id, int i) { return (id * 31 + i) & 0xff; }

/* Creates this process's QPs and regions and says them in `me`. */
static int setup(struct info *me, int access) {
	if (ibv_query_gid(ctx, 1, 1, &me->gid)) return 1;
	for (int t = 0; t < THREADS; t++) {
		cqs[t] = ibv_create_cq(ctx, 128, &cqs[t], t == 0 ? chan : NULL, 0);
		qps[t] = cqs[t] ? rc_qp(cqs[t]) : NULL;
		bufs[t] = calloc(1, LEN);
		mrs[t] = ibv_reg_mr(pd, bufs[t], LEN, access);
		if (!qps[t] || !mrs[t]) return 2;
		me->qpn[t] = qps[t]->qp_num; me->rkey[t] = mrs[t]->rkey; me->addr[t] = (uintptr_t)bufs[t];
	}
	return 0;
}

static int connect_all(void) {
	for (int t = 0; t < THREADS; t++)
		if (connect_qp(qps[t], peer.qpn[t], &peer.gid)) return 1;
	return 0;
}

struct job { int id; int ok; };

static void *worker(void *p) {
	struct job *j = p;
	int t = j->id;
	char *src = bufs[t];
	for (int i = 0; i < WRITES; i++) {
		memset(src, pattern(t, i), LEN);
		/* Two SGEs: the halves of the buffer. */
		struct ibv_sge sge[2] = { { (uintptr_t)src, LEN / 2, mrs[t]->lkey },
					  { (uintptr_t)src + LEN / 2, LEN / 2, mrs[t]->lkey } };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = sge, .num_sge = 2,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.wr.rdma.remote_addr = peer.addr[t]; wr.wr.rdma.rkey = peer.rkey[t];
		if (chan && t == 0 && ibv_req_notify_cq(cqs[t], 0)) { fprintf(stderr, "req_notify failed\n"); return NULL; }
		if (ibv_post_send(qps[t], &wr, &bad)) { fprintf(stderr, "thread %d: post %d failed\n", t, i); return NULL; }
		struct ibv_wc wc; int n;
		if (chan && t == 0) {
			struct pollfd pfd = { .fd = chan->fd, .events = POLLIN };
			if (poll(&pfd, 1, 5000) != 1) { fprintf(stderr, "thread 0: no event on the channel fd (%d)\n", i); return NULL; }
			struct ibv_cq *ecq; void *ectx;
			if (ibv_get_cq_event(chan, &ecq, &ectx) || ecq != cqs[0] || ectx != &cqs[0]) {
				fprintf(stderr, "thread 0: get_cq_event\n"); return NULL;
			}
			ibv_ack_cq_events(ecq, 1);
		}
		do { n = ibv_poll_cq(cqs[t], 1, &wc); } while (n == 0);
		if (n < 0 || wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)i || wc.opcode != IBV_WC_RDMA_WRITE) {
			fprintf(stderr, "thread %d: completion %d: n %d status %s\n", t, i, n, ibv_wc_status_str(wc.status));
			return NULL;
		}
	}
	j->ok = 1;
	return NULL;
}

/* The responder: its regions take the writes; it checks them when told the writes are done. */
static int child(int in, int out) {
	struct info me;
	if (setup(&me, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) return 10;
	if (write(out, &me, sizeof me) != sizeof me || read(in, &peer, sizeof peer) != sizeof peer) return 11;
	if (connect_all()) return 12;
	char c = 'r';
	if (write(out, &c, 1) != 1 || read(in, &c, 1) != 1) return 13;
	for (int t = 0; t < THREADS; t++)
		for (int k = 0; k < LEN; k++)
			if ((unsigned char)bufs[t][k] != pattern(t, WRITES - 1)) {
				fprintf(stderr, "child: region %d byte %d is %d\n", t, k, bufs[t][k]);
				return 14;
			}
	return 0;
}

/* One completion from `cq`, polled for at most `ms` milliseconds: 1, or 0 when none came. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, int ms) {
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int k = ibv_poll_cq(cq, 1, wc);
		if (k != 0) return k;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > ms) return 0;
	}
}

static int open_dev(void) {
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || n != 1) { fprintf(stderr, "no device\n"); return 2; }
	ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	if (!ctx) { fprintf(stderr, "open failed\n"); return 2; }
	pd = ibv_alloc_pd(ctx);
	return pd ? 0 : 2;
}

int main(void) {
	int p2c[2], c2p[2];
	if (pipe(p2c) || pipe(c2p)) return 2;
	pid_t pid = fork();
	if (pid == 0) {
		/* The child is the other RNIC: its own address and MAC, set before the library reads
		 * its configuration (at the first ibv_get_device_list). */
		setenv("ROCEMU_IP", getenv("PEER_IP"), 1);
		setenv("ROCEMU_MAC", getenv("PEER_MAC"), 1);
		if (open_dev()) _exit(2);
		_exit(child(p2c[0], c2p[1]));
	}
	if (open_dev()) return 2;

	/* Impossible arguments. */
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "query_port(2)");
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET, "query_port(1)");
	union ibv_gid g;
	errno = 0;
	CHECK(ibv_query_gid(ctx, 1, 7, &g) == -1 && errno == EINVAL, "query_gid(7): errno %d", errno);
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(ctx, 1, 1, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2, "query_gid_ex");
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "create_cq(0): errno %d", errno);
	errno = 0;
	CHECK(ibv_create_cq(ctx, 1 << 30, NULL, NULL, 0) == NULL && errno == EINVAL, "create_cq(huge): errno %d", errno);
	errno = 0;
	CHECK(ibv_reg_mr(pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL, "reg_mr(NULL, 0): errno %d", errno);
	char buf[256];
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL, "reg_mr(remote write without local write): errno %d", errno);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	CHECK(mr != NULL, "reg_mr with relaxed ordering: errno %d", errno);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = 77, .cap = { 4, 4, 1, 1, 0 } };
	errno = 0;
	CHECK(ibv_create_qp(pd, &qa) == NULL && errno != 0, "create_qp(type 77)");
	qa.qp_type = IBV_QPT_RC;
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	CHECK(qp != NULL, "create_qp: errno %d", errno);
	struct ibv_qp_attr at = { .qp_state = 42 };
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == EINVAL, "modify_qp(state 42)");
	at.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == EINVAL, "modify_qp(RESET->RTS)");
	struct ibv_sge sge = { (uintptr_t)buf, 16, mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = -1, .opcode = IBV_WR_SEND }, *bad = NULL;
	CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL && bad == &wr, "post_send(num_sge -1)");
	wr.num_sge = 1; wr.opcode = 99;
	CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL, "post_send(opcode 99)");
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, -1, &wc) < 0, "poll_cq(-1)");
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "poll_cq on an empty CQ");
	CHECK(strcmp(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error") == 0, "wc_status_str");
	CHECK(ibv_fork_init() == 0, "fork_init");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_dereg_mr(mr) == 0, "destroy");

	/* Several threads at once, writing into the child's regions. */
	struct pollfd apfd = { .fd = ctx->async_fd, .events = POLLIN };
	CHECK(poll(&apfd, 1, 0) == 0, "async fd: readable with no event");
	chan = ibv_create_comp_channel(ctx);
	CHECK(chan != NULL, "create_comp_channel");
	struct info me;
	CHECK(setup(&me, IBV_ACCESS_LOCAL_WRITE) == 0, "setup");
	CHECK(read(c2p[0], &peer, sizeof peer) == sizeof peer && write(p2c[1], &me, sizeof me) == sizeof me, "exchange");
	CHECK(connect_all() == 0, "connect: errno %d", errno);
	char c;
	CHECK(read(c2p[0], &c, 1) == 1, "child ready");
	pthread_t th[THREADS];
	struct job jobs[THREADS];
	for (int i = 0; i < THREADS; i++) { jobs[i] = (struct job){ i, 0 }; pthread_create(&th[i], NULL, worker, &jobs[i]); }
	for (int i = 0; i < THREADS; i++) { pthread_join(th[i], NULL); CHECK(jobs[i].ok, "thread %d", i); }
	/* ibv_resize_cq: eight receives flushed into cqs[1] (its QP moved to ERR, which flushes at
	 * once) wait there; the CQ cannot shrink below them, can to them, and keeps them in order. */
	CHECK(ibv_resize_cq(cqs[1], 0) == EINVAL && ibv_resize_cq(cqs[1], 1 << 30) == EINVAL, "resize_cq(0), resize_cq(huge)");
	CHECK(ibv_resize_cq(cqs[1], 16) == 0 && cqs[1]->cqe == 16, "resize_cq(16): cqe %d", cqs[1]->cqe);
	for (int i = 0; i < 8; i++) {
		struct ibv_sge rs = { (uintptr_t)bufs[1], 64, mrs[1]->lkey };
		struct ibv_recv_wr rw = { .wr_id = 100 + i, .sg_list = &rs, .num_sge = 1 }, *rbad;
		CHECK(ibv_post_recv(qps[1], &rw, &rbad) == 0, "post_recv %d", i);
	}
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(qps[1], &err, IBV_QP_STATE) == 0, "modify_qp(ERR)");
	CHECK(ibv_resize_cq(cqs[1], 7) == EINVAL && cqs[1]->cqe == 16, "resize_cq(7) with 8 waiting: cqe %d", cqs[1]->cqe);
	CHECK(ibv_resize_cq(cqs[1], 8) == 0 && cqs[1]->cqe == 8, "resize_cq(8) with 8 waiting: cqe %d", cqs[1]->cqe);
	struct ibv_wc fw[16];
	int nf = ibv_poll_cq(cqs[1], 16, fw);
	CHECK(nf == 8, "flushed receives after the resize: %d", nf);
	for (int i = 0; i < nf; i++)
		CHECK(fw[i].wr_id == (uint64_t)(100 + i) && fw[i].status == IBV_WC_WR_FLUSH_ERR, "flushed %d: wr_id %llu status %s",
		      i, (unsigned long long)fw[i].wr_id, ibv_wc_status_str(fw[i].status));
	/* ibv_rereg_mr: rdma-core's input checks (IBV_REREG_MR_ERR_INPUT) and the kernel's
	 * (IBV_REREG_MR_ERR_CMD), each with EINVAL and nothing changed. */
	struct { int flags; struct ibv_pd *pd; void *addr; size_t len; int access; int want; } rr[] = {
		{ 8, NULL, NULL, 0, 0, IBV_REREG_MR_ERR_INPUT },
		{ IBV_REREG_MR_CHANGE_TRANSLATION, NULL, bufs[3], 0, 0, IBV_REREG_MR_ERR_INPUT },
		{ IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE, IBV_REREG_MR_ERR_INPUT },
		{ 0, NULL, NULL, 0, 0, IBV_REREG_MR_ERR_CMD },
		{ IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 0, IBV_REREG_MR_ERR_CMD },
		{ IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE, IBV_REREG_MR_ERR_CMD },
	};
	for (unsigned i = 0; i < sizeof rr / sizeof rr[0]; i++) {
		errno = 0;
		int r = ibv_rereg_mr(mrs[3], rr[i].flags, rr[i].pd, rr[i].addr, rr[i].len, rr[i].access);
		CHECK(r == rr[i].want && errno == EINVAL, "rereg_mr case %u: %d errno %d", i, r, errno);
	}
	CHECK(mrs[3]->pd == pd && mrs[3]->addr == bufs[3] && mrs[3]->length == LEN, "rereg_mr: refused calls changed the MR");
	/* A new translation: region 2's last WRITE gathers from a new buffer (holding what the
	 * child expects) under the same L_Key, while the old buffer holds something else. */
	uint32_t lkey2 = mrs[2]->lkey;
	char *nb = malloc(LEN);
	memset(nb, pattern(2, WRITES - 1), LEN);
	CHECK(ibv_rereg_mr(mrs[2], IBV_REREG_MR_CHANGE_TRANSLATION, NULL, nb, LEN, 0) == 0, "rereg_mr(translation): errno %d", errno);
	CHECK(mrs[2]->addr == nb && mrs[2]->length == LEN && mrs[2]->lkey == lkey2, "rereg_mr(translation): the MR says %p %zu", mrs[2]->addr, mrs[2]->length);
	memset(bufs[2], 0xee, LEN);
	struct ibv_sge s2 = { (uintptr_t)nb, LEN, mrs[2]->lkey };
	struct ibv_send_wr w2 = { .wr_id = 7777, .sg_list = &s2, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *b2;
	w2.wr.rdma.remote_addr = peer.addr[2]; w2.wr.rdma.rkey = peer.rkey[2];
	CHECK(ibv_post_send(qps[2], &w2, &b2) == 0, "post from the re-registered region");
	int k2;
	do { k2 = ibv_poll_cq(cqs[2], 1, &wc); } while (k2 == 0);
	CHECK(k2 == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 7777, "from the re-registered region: %s", ibv_wc_status_str(wc.status));
	/* A new PD: region 3 no longer serves its QP's PD (LOC_PROT_ERR). */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	CHECK(ibv_rereg_mr(mrs[3], IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0 && mrs[3]->pd == pd2, "rereg_mr(pd): errno %d", errno);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "a PD with a re-registered region is busy");
	/* Twenty times (the QP reset and connected again in between): a work request that fails
	 * as its payload is gathered sends nothing, and its completion must still reach a program
	 * that polled the CQ empty just before (the drop-in's "still empty" shortcut once missed it,
	 * now and then, and the program spun forever: hence the bounded wait). */
	for (int i = 0; i < 20; i++) {
		struct ibv_qp_attr rst = { .qp_state = IBV_QPS_RESET };
		CHECK(i == 0 || (ibv_modify_qp(qps[3], &rst, IBV_QP_STATE) == 0 && connect_qp(qps[3], peer.qpn[3], &peer.gid) == 0), "reconnect %d", i);
		struct ibv_sge s3 = { (uintptr_t)bufs[3], 64, mrs[3]->lkey };
		struct ibv_send_wr w3 = { .wr_id = 8888 + i, .sg_list = &s3, .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *b3;
		w3.wr.rdma.remote_addr = peer.addr[3]; w3.wr.rdma.rkey = peer.rkey[3];
		CHECK(ibv_post_send(qps[3], &w3, &b3) == 0, "post from a region of another PD (%d)", i);
		int k3 = poll_one(cqs[3], &wc, 5000);
		CHECK(k3 == 1 && wc.status == IBV_WC_LOC_PROT_ERR && wc.wr_id == (uint64_t)(8888 + i),
		      "from a region of another PD (%d): %d %s", i, k3, k3 == 1 ? ibv_wc_status_str(wc.status) : "no completion in 5 s");
	}
	/* An R_Key that was never valid: REM_ACCESS_ERR at the requester. */
	struct ibv_sge s1 = { (uintptr_t)bufs[0], 64, mrs[0]->lkey };
	struct ibv_send_wr w1 = { .wr_id = 9999, .sg_list = &s1, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *b1;
	w1.wr.rdma.remote_addr = peer.addr[0]; w1.wr.rdma.rkey = peer.rkey[0] ^ 0x5a5a5a5a;
	CHECK(ibv_post_send(qps[0], &w1, &b1) == 0, "post with a bad rkey");
	int k;
	do { k = ibv_poll_cq(cqs[0], 1, &wc); } while (k == 0);
	CHECK(k == 1 && wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 9999, "bad rkey: %s", ibv_wc_status_str(wc.status));
	c = 'd';
	CHECK(write(p2c[1], &c, 1) == 1, "done");
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %d", st);
	CHECK(cqs[0]->comp_events_completed == WRITES, "acked events: %u", cqs[0]->comp_events_completed);
	CHECK(ibv_destroy_comp_channel(chan) == EBUSY, "destroying a channel with a CQ on it");
	if (failures) return 1;
	printf("ok\n");
	return 0;
}
