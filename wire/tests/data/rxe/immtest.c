/* immtest: tiny RC/UC verbs program for golden captures of the *_WITH_IMMEDIATE and *_WITH_INVALIDATE opcodes.
 * server: immtest -t rc|uc -g GIDX          client: immtest -t rc|uc -g GIDX SERVER
 * TCP 18515 exchange (text): "qpn:psn:gid32hex" each way, then server sends "vaddr:rkey:mwrkey1:mwrkey2",
 * client runs its ops one at a time (each waits for its send completion), server counts receive completions,
 * then both exchange "done". */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <getopt.h>
#include <inttypes.h>
#define BUFSZ 65536
#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
static struct ibv_context *ctx; static struct ibv_pd *pd; static struct ibv_cq *cq; static struct ibv_qp *qp;
static struct ibv_mr *mr; static char *buf; static int uc, nak, pad, extra_flags;
static void xwrite(int fd, const char *s) { size_t n = strlen(s) + 1; if (write(fd, s, n) != (ssize_t)n) DIE("tcp write"); }
static void xread(int fd, char *s, size_t n) { size_t got = 0; while (got < n) { ssize_t r = read(fd, s + got, 1); if (r <= 0) DIE("tcp read"); got += r; if (s[got-1] == 0) break; } } /* one byte at a time: messages may arrive coalesced */
static int allow_err;
static struct ibv_wc wait_wc(void) {
	struct ibv_wc wc; int n;
	for (int i = 0; i < 20000000; i++) { n = ibv_poll_cq(cq, 1, &wc); if (n < 0) DIE("poll"); if (n) {
		if (wc.status && allow_err) { printf("expected error completion: %s\n", ibv_wc_status_str(wc.status)); return wc; }
		if (wc.status) DIE("wc status %s opcode %d wr_id %" PRIu64, ibv_wc_status_str(wc.status), wc.opcode, wc.wr_id);
		return wc; } usleep(50); }
	DIE("timeout waiting for completion");
}
static void post_recv(int n) { for (int i = 0; i < n; i++) {
	struct ibv_sge sge = { (uintptr_t)buf, BUFSZ / 2, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &wr, &bad)) DIE("post_recv"); } }
static void post(enum ibv_wr_opcode op, int len, uint32_t imm_or_inv, uint64_t raddr, uint32_t rkey, int wrid) {
	struct ibv_sge sge = { (uintptr_t)buf + BUFSZ / 2, len, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wrid, .sg_list = &sge, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED | extra_flags }, *bad;
	if (op == IBV_WR_SEND_WITH_INV) wr.invalidate_rkey = imm_or_inv; else wr.imm_data = htonl(imm_or_inv);
	wr.wr.rdma.remote_addr = raddr; wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad)) DIE("post_send op %d", op);
	struct ibv_wc wc = wait_wc(); printf("send wr %d done (opcode %d, %d bytes)\n", wrid, wc.opcode, len);
}
int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IONBF, 0);
	int gidx = 1, c, port = 18515; const char *type = "rc";
	while ((c = getopt(argc, argv, "t:g:p:")) != -1) switch (c) {
		case 't': type = optarg; break; case 'g': gidx = atoi(optarg); break; case 'p': port = atoi(optarg); break; default: DIE("usage"); }
	uc = !strcmp(type, "uc"); nak = !strcmp(type, "rcnak"); pad = !strcmp(type, "rcpad"); const char *server = optind < argc ? argv[optind] : NULL;
	struct ibv_device **dl = ibv_get_device_list(NULL); if (!dl || !dl[0]) DIE("no device");
	ctx = ibv_open_device(dl[0]); pd = ibv_alloc_pd(ctx); cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	buf = aligned_alloc(4096, BUFSZ); memset(buf, server ? 0xab : 0, BUFSZ);
	for (int i = 0; i < BUFSZ / 2; i++) buf[BUFSZ / 2 + i] = (char)(i * 7 + 1);
	mr = ibv_reg_mr(pd, buf, BUFSZ, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | (uc ? 0 : IBV_ACCESS_MW_BIND));
	if (!mr) DIE("reg_mr");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .cap = { 16, 16, 1, 1 }, .qp_type = uc ? IBV_QPT_UC : IBV_QPT_RC };
	qp = ibv_create_qp(pd, &ia); if (!qp) DIE("create_qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	if (!uc) a.qp_access_flags |= IBV_ACCESS_REMOTE_READ;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) DIE("INIT");
	if (!nak) post_recv(8);
	union ibv_gid gid; if (ibv_query_gid(ctx, 1, gidx, &gid)) DIE("query_gid");
	uint32_t psn = 0x123456 + (server ? 0x111 : 0);
	/* TCP */
	int fd;
	if (server) {
		struct addrinfo *res, hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }; char ps[8]; sprintf(ps, "%d", port);
		if (getaddrinfo(server, ps, &hints, &res)) DIE("getaddrinfo");
		fd = socket(AF_INET, SOCK_STREAM, 0); if (connect(fd, res->ai_addr, res->ai_addrlen)) DIE("connect");
	} else {
		int l = socket(AF_INET, SOCK_STREAM, 0), one = 1; setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
		if (bind(l, (void *)&sa, sizeof sa) || listen(l, 1)) DIE("listen"); fd = accept(l, NULL, NULL); close(l);
	}
	char msg[128], rmsg[128], gh[33];
	for (int i = 0; i < 16; i++) sprintf(gh + 2 * i, "%02x", gid.raw[i]);
	sprintf(msg, "%06x:%06x:%s", qp->qp_num, psn, gh);
	if (server) { xwrite(fd, msg); xread(fd, rmsg, sizeof rmsg); } else { xread(fd, rmsg, sizeof rmsg); xwrite(fd, msg); }
	uint32_t rqpn, rpsn; char rgh[33]; union ibv_gid rgid;
	if (sscanf(rmsg, "%x:%x:%32s", &rqpn, &rpsn, rgh) != 3) DIE("bad msg %s", rmsg);
	for (int i = 0; i < 16; i++) { unsigned v; sscanf(rgh + 2 * i, "%2x", &v); rgid.raw[i] = v; }
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = rqpn, .rq_psn = rpsn,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = rgid, .sgid_index = gidx, .hop_limit = 1 } } };
	if (ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		(uc ? 0 : IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))) DIE("RTR");
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .sq_psn = psn, .max_rd_atomic = 1 };
	if (ibv_modify_qp(qp, &s, IBV_QP_STATE | IBV_QP_SQ_PSN |
		(uc ? 0 : IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))) DIE("RTS");
	printf("local qpn %06x psn %06x, remote qpn %06x psn %06x\n", qp->qp_num, psn, rqpn, rpsn);
	if (!server) { /* responder */
		uint32_t mwk[2] = { 0, 0 };
		if (!uc) for (int i = 0; i < 2; i++) {
			struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2); if (!mw) DIE("alloc_mw");
			struct ibv_send_wr wr = { .wr_id = 900 + i, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED }, *bad;
			wr.bind_mw.mw = mw; wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
			wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ mr, (uintptr_t)buf, 4096, IBV_ACCESS_REMOTE_WRITE };
			if (ibv_post_send(qp, &wr, &bad)) DIE("bind_mw post"); wait_wc(); mwk[i] = wr.bind_mw.rkey;
			printf("bound MW type 2 rkey 0x%08x\n", mwk[i]);
		}
		sprintf(msg, "%016" PRIx64 ":%08x:%08x:%08x", (uint64_t)(uintptr_t)buf, mr->rkey, mwk[0], mwk[1]); xwrite(fd, msg);
		if (nak) { usleep(20000); post_recv(1); printf("posted the receive late (RNR NAK expected)\n"); }
		int expect = (nak || pad) ? (pad ? 2 : 1) : uc ? 4 : 6;
		for (int i = 0; i < expect; i++) { struct ibv_wc wc = wait_wc();
			printf("recv wc opcode %d len %u flags 0x%x imm/inv 0x%08x\n", wc.opcode, wc.byte_len, wc.wc_flags,
				(wc.wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc.imm_data) : wc.invalidated_rkey); }
		xread(fd, rmsg, sizeof rmsg); xwrite(fd, "done");
	} else {
		uint64_t raddr; uint32_t rkey, mwk[2];
		xread(fd, rmsg, sizeof rmsg);
		if (sscanf(rmsg, "%" SCNx64 ":%x:%x:%x", &raddr, &rkey, &mwk[0], &mwk[1]) != 4) DIE("bad msg2 %s", rmsg);
		if (pad) { /* sizes that are not multiples of 4 (pad count 1..3), and the solicited-event bit */
			extra_flags = IBV_SEND_SOLICITED;
			post(IBV_WR_SEND, 61, 0, 0, 0, 1);
			post(IBV_WR_SEND_WITH_IMM, 1027, 0x01020304, 0, 0, 2);
			extra_flags = 0;
			post(IBV_WR_RDMA_WRITE, 2047, 0, raddr, rkey, 3);
			post(IBV_WR_RDMA_READ, 30, 0, raddr, rkey, 4);
			post(IBV_WR_RDMA_READ, 1030, 0, raddr + 4096, rkey, 5);
			xwrite(fd, "done"); xread(fd, rmsg, sizeof rmsg); printf("ok\n"); return 0;
		}
		if (nak) {
			post(IBV_WR_SEND, 64, 0, 0, 0, 1);
			allow_err = 1; post(IBV_WR_RDMA_WRITE, 64, 0, raddr, rkey ^ 0x00ff0000, 2);
			xwrite(fd, "done"); xread(fd, rmsg, sizeof rmsg); printf("ok\n"); return 0;
		}
		post(IBV_WR_SEND_WITH_IMM, 64, 0x11223344, 0, 0, 1);
		post(IBV_WR_SEND_WITH_IMM, 3000, 0x55667788, 0, 0, 2);
		post(IBV_WR_RDMA_WRITE_WITH_IMM, 64, 0x99aabbcc, raddr, rkey, 3);
		post(IBV_WR_RDMA_WRITE_WITH_IMM, 3000, 0xddeeff00, raddr + 4096, rkey, 4);
		if (!uc) { post(IBV_WR_SEND_WITH_INV, 64, mwk[0], 0, 0, 5); post(IBV_WR_SEND_WITH_INV, 3000, mwk[1], 0, 0, 6); }
		xwrite(fd, "done"); xread(fd, rmsg, sizeof rmsg);
	}
	printf("ok\n");
	return 0;
}
