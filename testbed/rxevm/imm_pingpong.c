/*
 * imm_pingpong: an ibv_rc_pingpong-style ping-pong in which every message carries immediate
 * data, checked by the receiver. rdma-core 44 and perftest 4.5 (Debian 12) have no tool that
 * sends immediates, so RoCEmu's interop tests against rdma_rxe ship this one in the rxe guest
 * (testbed/rxevm/build-guest.sh compiles it); RoCEmu's side is `rocemu pingpong --imm`
 * (tools/src/remote.rs). Written for RoCEmu from the verbs API; no rdma-core code.
 *
 * Usage: imm_pingpong [options] [server]      (without a server name this end is the server)
 *   -p, --port PORT          TCP port of the exchange (18515)
 *   -d, --ib-dev DEV         device (the first one)
 *   -i, --ib-port N          port of the device (1)
 *   -g, --gid-idx N          GID index (none: an all-zero GID; RoCE needs one)
 *   -s, --size N             message size (4096; 1024 for UD)
 *   -m, --mtu N              path MTU, 256..4096 (1024; not exchanged: give both ends the same)
 *   -r, --rx-depth N         receives posted at once (500)
 *   -n, --iters N            messages each way (1000)
 *   -T, --transport rc|uc|ud
 *   -o, --op send|write      SEND_WITH_IMM, or RDMA_WRITE_WITH_IMM (rc and uc only)
 *
 * Out-of-band exchange: ibv_rc_pingpong's, over TCP.
 *   1. the client connects and writes its address, 52 bytes: "%04x:%06x:%06x:%s" of LID, QPN,
 *      PSN and the GID as 32 hex digits of its raw bytes in order, then a NUL;
 *   2. the server reads it, moves its QP to RTR and RTS, and writes its own 52 bytes;
 *   3. the client reads them, writes "done" and a NUL (5 bytes), and closes.
 * With --op write each side appends, right after its address message and in the same
 * direction, a 26-byte message of our own: "%08x:%016llx" of the R_Key and the address of the
 * buffer the peer is to write into, then a NUL. So: C→S 52+26 bytes, S→C 52+26, C→S "done\0".
 *
 * The data path (as ibv_rc_pingpong's main loop): the client sends first; each side posts its
 * next message when its previous one has completed and a message has arrived; each sends and
 * receives exactly `iters`. Message k (from 0) that a side sends carries the immediate value
 *     v = S << 24 | (k & 0xffffff),    S = 0xc1 from the client, 0x5e from the server,
 * in network byte order (wr.imm_data = htobe32(v), so the ImmDt field on the wire reads v),
 * and its payload byte i is (v + (v >> 24) + i) mod 256: a stale, reflected or misplaced
 * message differs. The receiver of message k checks, on its completion: IBV_WC_WITH_IMM in
 * wc_flags; the opcode (IBV_WC_RECV for a SEND, IBV_WC_RECV_RDMA_WITH_IMM for a WRITE); the
 * immediate; byte_len (the size, plus the 40-byte GRH area on UD, whose completions must also
 * have IBV_WC_GRH and the peer's QPN as src_qp); and the payload, in the receive buffer (SEND)
 * or in the buffer the peer wrote (WRITE). The sender checks its own completion's opcode
 * (IBV_WC_SEND or IBV_WC_RDMA_WRITE). The first mismatch ends the run with a message and exit
 * status 1; a run that completes prints "N immediates checked".
 *
 * Buffer: one MR; the receive area (size bytes, behind a 40-byte GRH area on UD) at its
 * start, which is also what the peer writes into, then the send area.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define PP_MSG_LEN 52   /* sizeof "0000:000000:000000:" + 32 hex digits */
#define KEY_MSG_LEN 26  /* sizeof "00000000:0000000000000000" */
#define DONE_MSG "done" /* written with its NUL */
#define GRH_LEN 40      /* the GRH area in front of every UD receive (IBTA 11.4.1.1) */
#define UD_QKEY 0x11111111
#define RECV_WRID 1
#define SEND_WRID 2
#define STALL_SECONDS 30

enum op { OP_SEND, OP_WRITE };

struct dest {
	unsigned lid, qpn, psn;
	union ibv_gid gid;
	uint32_t rkey; /* --op write: where the peer may write */
	uint64_t vaddr;
};

static struct {
	const char *server, *dev;
	int port, ib_port, gidx, rx_depth;
	size_t size;
	enum ibv_mtu mtu;
	long long iters;
	enum ibv_qp_type qpt;
	enum op op;
} o = { .port = 18515, .ib_port = 1, .gidx = -1, .rx_depth = 500, .mtu = IBV_MTU_1024,
	.iters = 1000, .qpt = IBV_QPT_RC, .op = OP_SEND };

static struct {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_ah *ah;
	uint8_t *buf;
	size_t recv_len, send_off;
} c;

static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
	va_list ap;

	fputs("imm_pingpong: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static uint32_t imm_value(int from_client, long long k)
{
	return (from_client ? 0xc1u : 0x5eu) << 24 | (uint32_t)(k & 0xffffff);
}

static uint8_t pattern(uint32_t v, size_t i)
{
	return (uint8_t)(v + (v >> 24) + i);
}

static const char *wc_opcode_name(enum ibv_wc_opcode op)
{
	switch (op) {
	case IBV_WC_SEND: return "IBV_WC_SEND";
	case IBV_WC_RDMA_WRITE: return "IBV_WC_RDMA_WRITE";
	case IBV_WC_RECV: return "IBV_WC_RECV";
	case IBV_WC_RECV_RDMA_WITH_IMM: return "IBV_WC_RECV_RDMA_WITH_IMM";
	default: return "another opcode";
	}
}

/* ---- the TCP exchange ------------------------------------------------------------------ */

static void write_all(int fd, const void *p, size_t n, const char *what)
{
	const char *b = p;

	while (n > 0) {
		ssize_t w = write(fd, b, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			die("couldn't send %s: %s", what, w < 0 ? strerror(errno) : "short write");
		b += w;
		n -= (size_t)w;
	}
}

/* Unlike ibv_rc_pingpong's single read(), accepts a message split across segments. */
static void read_all(int fd, void *p, size_t n, const char *what)
{
	char *b = p;
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, b + got, n - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("reading %s: %s", what,
			    errno == EAGAIN ? "timed out" : strerror(errno));
		if (r == 0)
			die("the peer closed the connection after %zu of the %zu bytes of %s",
			    got, n, what);
		got += (size_t)r;
	}
}

static void send_dest(int fd, const struct dest *d)
{
	char msg[PP_MSG_LEN] = { 0 };
	int n = snprintf(msg, sizeof msg, "%04x:%06x:%06x:", d->lid, d->qpn, d->psn);

	for (int i = 0; i < 16; i++)
		n += snprintf(msg + n, sizeof msg - (size_t)n, "%02x", d->gid.raw[i]);
	write_all(fd, msg, sizeof msg, "our address");
	if (o.op == OP_WRITE) {
		char key[KEY_MSG_LEN] = { 0 };

		snprintf(key, sizeof key, "%08x:%016" PRIx64, d->rkey, d->vaddr);
		write_all(fd, key, sizeof key, "our rkey:vaddr");
	}
}

static void recv_dest(int fd, struct dest *d)
{
	char msg[PP_MSG_LEN], gid[33];
	int end = 0;

	read_all(fd, msg, sizeof msg, "the peer's address");
	if (msg[sizeof msg - 1] != 0 ||
	    sscanf(msg, "%x:%x:%x:%32[0-9a-fA-F]%n", &d->lid, &d->qpn, &d->psn, gid, &end) != 4 ||
	    strlen(gid) != 32 || msg[end] != 0)
		die("malformed address message \"%.*s\" (want %%04x:%%06x:%%06x: and 32 hex digits)",
		    (int)sizeof msg - 1, msg);
	for (int i = 0; i < 16; i++)
		sscanf(gid + 2 * i, "%2hhx", &d->gid.raw[i]);
	if (o.op == OP_WRITE) {
		char key[KEY_MSG_LEN];

		read_all(fd, key, sizeof key, "the peer's rkey:vaddr");
		end = 0;
		if (key[sizeof key - 1] != 0 ||
		    sscanf(key, "%8" SCNx32 ":%16" SCNx64 "%n", &d->rkey, &d->vaddr, &end) != 2 ||
		    end != KEY_MSG_LEN - 1)
			die("malformed rkey:vaddr message \"%.*s\" (want %%08x:%%016llx)",
			    (int)sizeof key - 1, key);
	}
}

/* A dead peer must not hang the run: every read and write has a deadline. */
static void set_timeouts(int fd)
{
	struct timeval tv = { .tv_sec = 60 };

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static void client_exchange(const struct dest *my, struct dest *rem)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res, *t;
	char service[8], done[] = DONE_MSG;
	int fd = -1, e = ECONNREFUSED;

	snprintf(service, sizeof service, "%d", o.port);
	e = getaddrinfo(o.server, service, &hints, &res);
	if (e)
		die("%s: %s", o.server, gai_strerror(e));
	/* The server may still be starting: retry a refused connection for a few seconds. */
	for (int tries = 0; fd < 0 && tries < 100; tries++) {
		for (t = res; t && fd < 0; t = t->ai_next) {
			fd = socket(t->ai_family, t->ai_socktype, t->ai_protocol);
			if (fd < 0) {
				e = errno;
			} else if (connect(fd, t->ai_addr, t->ai_addrlen)) {
				e = errno;
				close(fd);
				fd = -1;
			}
		}
		if (fd < 0)
			usleep(100000);
	}
	freeaddrinfo(res);
	if (fd < 0)
		die("couldn't connect to %s:%d: %s", o.server, o.port, strerror(e));
	set_timeouts(fd);
	send_dest(fd, my);
	recv_dest(fd, rem);
	write_all(fd, done, sizeof done, "\"done\"");
	close(fd);
}

static void connect_qp(const struct dest *my, const struct dest *rem);

static void server_exchange(const struct dest *my, struct dest *rem)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)o.port),
				   .sin6_addr = IN6ADDR_ANY_INIT };
	int one = 1, zero = 0, lfd, fd;
	char done[sizeof DONE_MSG];

	/* Dual stack, so IPv4 clients (RoCEmu's and ibv_rc_pingpong's) and IPv6 ones connect. */
	lfd = socket(AF_INET6, SOCK_STREAM, 0);
	if (lfd < 0)
		die("socket: %s", strerror(errno));
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 1))
		die("couldn't listen on TCP port %d: %s", o.port, strerror(errno));
	fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		die("accept: %s", strerror(errno));
	close(lfd);
	set_timeouts(fd);
	recv_dest(fd, rem);
	/* As ibv_rc_pingpong: RTR and RTS before answering, so the client may send at once. */
	connect_qp(my, rem);
	send_dest(fd, my);
	read_all(fd, done, sizeof done, "the client's \"done\"");
	if (memcmp(done, DONE_MSG, sizeof done))
		die("expected \"done\" and a NUL from the client, got \"%.*s\"", (int)sizeof done, done);
	close(fd);
}

/* ---- verbs ----------------------------------------------------------------------------- */

static void modify(struct ibv_qp_attr *a, int mask, const char *state)
{
	int e = ibv_modify_qp(c.qp, a, mask);

	if (e)
		die("couldn't move the QP to %s: %s", state, strerror(e));
}

/* Has an interface id: ibv_rc_pingpong's test for a GID to put in a GRH (RoCE needs one). */
static int global(const union ibv_gid *g)
{
	return g->global.interface_id != 0;
}

static struct ibv_ah_attr ah_attr(const struct dest *rem)
{
	struct ibv_ah_attr a = { .dlid = (uint16_t)rem->lid, .port_num = (uint8_t)o.ib_port };

	if (global(&rem->gid)) {
		a.is_global = 1;
		a.grh.hop_limit = 64;
		a.grh.dgid = rem->gid;
		a.grh.sgid_index = (uint8_t)o.gidx;
	}
	return a;
}

static void connect_qp(const struct dest *my, const struct dest *rem)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };

	if (o.qpt == IBV_QPT_UD) {
		struct ibv_ah_attr aa = ah_attr(rem);

		modify(&a, IBV_QP_STATE, "RTR");
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = my->psn;
		modify(&a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");
		c.ah = ibv_create_ah(c.pd, &aa);
		if (!c.ah)
			die("couldn't create the address handle: %s", strerror(errno));
		return;
	}
	a.path_mtu = o.mtu;
	a.dest_qp_num = rem->qpn;
	a.rq_psn = rem->psn;
	a.ah_attr = ah_attr(rem);
	if (o.qpt == IBV_QPT_RC) {
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		modify(&a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, "RTR");
	} else {
		modify(&a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			   IBV_QP_RQ_PSN, "RTR");
	}
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = my->psn;
	if (o.qpt == IBV_QPT_RC) {
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		modify(&a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC, "RTS");
	} else {
		modify(&a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");
	}
}

static int post_recv(int n)
{
	struct ibv_sge sge = { (uintptr_t)c.buf, (uint32_t)c.recv_len, c.mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = RECV_WRID, .sg_list = &sge, .num_sge = 1 }, *bad;

	for (int i = 0; i < n; i++) {
		int e = ibv_post_recv(c.qp, &wr, &bad);

		if (e)
			die("couldn't post a receive: %s", strerror(e));
	}
	return n;
}

static void post_send(const struct dest *rem, long long k)
{
	uint32_t v = imm_value(o.server != NULL, k);
	uint8_t *p = c.buf + c.send_off;
	struct ibv_sge sge = { (uintptr_t)p, (uint32_t)o.size, c.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = SEND_WRID, .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = htobe32(v) }, *bad;
	int e;

	for (size_t i = 0; i < o.size; i++)
		p[i] = pattern(v, i);
	if (o.op == OP_WRITE) {
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.wr.rdma.remote_addr = rem->vaddr;
		wr.wr.rdma.rkey = rem->rkey;
	} else {
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		if (o.qpt == IBV_QPT_UD) {
			wr.wr.ud.ah = c.ah;
			wr.wr.ud.remote_qpn = rem->qpn;
			wr.wr.ud.remote_qkey = UD_QKEY;
		}
	}
	e = ibv_post_send(c.qp, &wr, &bad);
	if (e)
		die("couldn't post message %lld: %s", k, strerror(e));
}

/* Checks the peer's message k on its receive completion (see the header). */
static void check_recv(const struct ibv_wc *wc, const struct dest *rem, long long k)
{
	int ud = o.qpt == IBV_QPT_UD;
	uint32_t want = imm_value(o.server == NULL, k), got = be32toh(wc->imm_data);
	enum ibv_wc_opcode op = o.op == OP_WRITE ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
	size_t len = o.size + (ud ? GRH_LEN : 0);
	const uint8_t *data = c.buf + (ud ? GRH_LEN : 0);

	if (k == 0)
		printf("first receive: opcode %s, wc_flags 0x%x, byte_len %u, imm_data 0x%08x\n",
		       wc_opcode_name(wc->opcode), wc->wc_flags, wc->byte_len, got);
	if (!(wc->wc_flags & IBV_WC_WITH_IMM))
		die("message %lld: no immediate (wc_flags 0x%x lacks IBV_WC_WITH_IMM)", k,
		    wc->wc_flags);
	if (wc->opcode != op)
		die("message %lld: completion opcode %s (%d), expected %s", k,
		    wc_opcode_name(wc->opcode), wc->opcode, wc_opcode_name(op));
	if (got != want)
		die("message %lld: immediate 0x%08x, expected 0x%08x", k, got, want);
	if (wc->byte_len != len)
		die("message %lld: byte_len %u, expected %zu", k, wc->byte_len, len);
	if (ud && !(wc->wc_flags & IBV_WC_GRH))
		die("message %lld: a UD receive without IBV_WC_GRH (wc_flags 0x%x)", k, wc->wc_flags);
	if (ud && wc->src_qp != rem->qpn)
		die("message %lld: src_qp 0x%06x, expected the peer's QPN 0x%06x", k, wc->src_qp,
		    rem->qpn);
	for (size_t i = 0; i < o.size; i++)
		if (data[i] != pattern(want, i))
			die("message %lld: payload byte %zu is 0x%02x, expected 0x%02x", k, i,
			    data[i], pattern(want, i));
}

/* ---- main ------------------------------------------------------------------------------ */

static long long number(const char *s, long long lo, long long hi, const char *opt)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno || end == s || *end || v < lo || v > hi)
		die("%s %s: a number from %lld to %lld", opt, s, lo, hi);
	return v;
}

static void usage(void)
{
	fprintf(stderr, "usage: imm_pingpong [-p PORT] [-d DEV] [-i IB_PORT] [-g GID_IDX] [-s SIZE] "
			"[-m MTU] [-r RX_DEPTH] [-n ITERS] [-T rc|uc|ud] [-o send|write] [SERVER]\n");
	exit(1);
}

static void parse(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "port", 1, NULL, 'p' },     { "ib-dev", 1, NULL, 'd' },
		{ "ib-port", 1, NULL, 'i' },  { "gid-idx", 1, NULL, 'g' },
		{ "size", 1, NULL, 's' },     { "mtu", 1, NULL, 'm' },
		{ "rx-depth", 1, NULL, 'r' }, { "iters", 1, NULL, 'n' },
		{ "transport", 1, NULL, 'T' }, { "op", 1, NULL, 'o' },
		{ "help", 0, NULL, 'h' },     { 0 }
	};
	int ch, size_set = 0, mtu;

	while ((ch = getopt_long(argc, argv, "p:d:i:g:s:m:r:n:T:o:h", lo, NULL)) != -1) {
		switch (ch) {
		case 'p': o.port = (int)number(optarg, 1, 65535, "-p"); break;
		case 'd': o.dev = optarg; break;
		case 'i': o.ib_port = (int)number(optarg, 1, 255, "-i"); break;
		case 'g': o.gidx = (int)number(optarg, 0, 255, "-g"); break;
		case 's': o.size = (size_t)number(optarg, 1, 1 << 30, "-s"); size_set = 1; break;
		case 'r': o.rx_depth = (int)number(optarg, 2, 16384, "-r"); break;
		case 'n': o.iters = number(optarg, 1, 1LL << 40, "-n"); break;
		case 'm':
			mtu = (int)number(optarg, 256, 4096, "-m");
			switch (mtu) {
			case 256: o.mtu = IBV_MTU_256; break;
			case 512: o.mtu = IBV_MTU_512; break;
			case 1024: o.mtu = IBV_MTU_1024; break;
			case 2048: o.mtu = IBV_MTU_2048; break;
			case 4096: o.mtu = IBV_MTU_4096; break;
			default: die("-m %d: the path MTU is 256, 512, 1024, 2048 or 4096", mtu);
			}
			break;
		case 'T':
			if (!strcmp(optarg, "rc"))
				o.qpt = IBV_QPT_RC;
			else if (!strcmp(optarg, "uc"))
				o.qpt = IBV_QPT_UC;
			else if (!strcmp(optarg, "ud"))
				o.qpt = IBV_QPT_UD;
			else
				die("-T %s: rc, uc or ud", optarg);
			break;
		case 'o':
			if (!strcmp(optarg, "send"))
				o.op = OP_SEND;
			else if (!strcmp(optarg, "write"))
				o.op = OP_WRITE;
			else
				die("-o %s: send or write", optarg);
			break;
		default: usage();
		}
	}
	if (optind + 1 == argc)
		o.server = argv[optind];
	else if (optind < argc)
		usage();
	if (o.qpt == IBV_QPT_UD && o.op == OP_WRITE)
		die("--op write needs a connected QP: give --transport rc or uc");
	if (!size_set)
		o.size = o.qpt == IBV_QPT_UD ? 1024 : 4096;
}

static void show(const char *which, const struct dest *d)
{
	char gid[INET6_ADDRSTRLEN];

	inet_ntop(AF_INET6, d->gid.raw, gid, sizeof gid);
	printf("  %s LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", which, d->lid, d->qpn, d->psn,
	       gid);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_port_attr pa;
	struct dest my = { 0 }, rem = { 0 };
	int n, e, ud, routs, pending;
	long long scnt = 0, rcnt = 0, posted = 0, polls = 0;
	struct timespec t0, t1, last;
	const char *opname;

	parse(argc, argv);
	ud = o.qpt == IBV_QPT_UD;
	srand48(getpid() * time(NULL));
	list = ibv_get_device_list(&n);
	if (!list || n == 0)
		die("no RDMA device");
	for (int i = 0; i < n && !c.ctx; i++)
		if (!o.dev || !strcmp(ibv_get_device_name(list[i]), o.dev))
			c.ctx = ibv_open_device(list[i]);
	if (!c.ctx)
		die("couldn't open device %s", o.dev ? o.dev : "(the first)");
	ibv_free_device_list(list);
	if (ibv_query_port(c.ctx, (uint8_t)o.ib_port, &pa))
		die("couldn't query port %d", o.ib_port);
	if (ud && o.size > (size_t)(128 << pa.active_mtu))
		die("-s %zu: a UD message must fit the port's active MTU (%d)", o.size,
		    128 << pa.active_mtu);

	c.recv_len = o.size + (ud ? GRH_LEN : 0);
	c.send_off = (c.recv_len + 63) & ~(size_t)63;
	if (posix_memalign((void **)&c.buf, (size_t)sysconf(_SC_PAGESIZE), c.send_off + o.size))
		die("out of memory");
	memset(c.buf, 0x7b, c.send_off + o.size);
	c.pd = ibv_alloc_pd(c.ctx);
	if (!c.pd)
		die("couldn't allocate a PD");
	c.mr = ibv_reg_mr(c.pd, c.buf, c.send_off + o.size,
			  IBV_ACCESS_LOCAL_WRITE | (o.op == OP_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0));
	if (!c.mr)
		die("couldn't register the buffer: %s", strerror(errno));
	c.cq = ibv_create_cq(c.ctx, o.rx_depth + 1, NULL, NULL, 0);
	if (!c.cq)
		die("couldn't create the CQ");
	{
		struct ibv_qp_init_attr ia = {
			.send_cq = c.cq, .recv_cq = c.cq, .qp_type = o.qpt,
			.cap = { .max_send_wr = 1, .max_recv_wr = (uint32_t)o.rx_depth,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = (uint8_t)o.ib_port };

		c.qp = ibv_create_qp(c.pd, &ia);
		if (!c.qp)
			die("couldn't create the QP: %s", strerror(errno));
		if (ud) {
			a.qkey = UD_QKEY;
			modify(&a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, "INIT");
		} else {
			a.qp_access_flags = o.op == OP_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0;
			modify(&a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS, "INIT");
		}
	}
	/* Receives before the exchange: the peer may send as soon as it is connected. */
	routs = post_recv(o.rx_depth);

	my.lid = pa.lid;
	my.qpn = c.qp->qp_num;
	my.psn = (unsigned)(lrand48() & 0xffffff);
	if (o.gidx >= 0 && ibv_query_gid(c.ctx, (uint8_t)o.ib_port, o.gidx, &my.gid))
		die("couldn't read GID index %d", o.gidx);
	my.rkey = c.mr->rkey;
	my.vaddr = (uintptr_t)c.buf;
	show("local address: ", &my);
	fflush(stdout);
	if (o.server) {
		client_exchange(&my, &rem);
		connect_qp(&my, &rem);
	} else {
		server_exchange(&my, &rem);
	}
	show("remote address:", &rem);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	last = t0;
	pending = RECV_WRID;
	if (o.server) {
		post_send(&rem, posted++);
		pending |= SEND_WRID;
	}
	while (rcnt < o.iters || scnt < o.iters) {
		struct ibv_wc wc[2];
		int ne = ibv_poll_cq(c.cq, 2, wc);

		if (ne < 0)
			die("ibv_poll_cq: %d", ne);
		if (ne == 0) {
			if (++polls % 4096 == 0) {
				clock_gettime(CLOCK_MONOTONIC, &t1);
				if (t1.tv_sec - last.tv_sec > STALL_SECONDS)
					die("no completion for %d s after %lld sends and %lld receives",
					    STALL_SECONDS, scnt, rcnt);
			}
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &last);
		for (int i = 0; i < ne; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				die("completion with status %s (%d) for wr_id %" PRIu64,
				    ibv_wc_status_str(wc[i].status), wc[i].status, wc[i].wr_id);
			if (wc[i].wr_id == SEND_WRID) {
				enum ibv_wc_opcode want = o.op == OP_WRITE ? IBV_WC_RDMA_WRITE
									   : IBV_WC_SEND;

				if (wc[i].opcode != want)
					die("message %lld sent: completion opcode %s (%d), expected %s",
					    scnt, wc_opcode_name(wc[i].opcode), wc[i].opcode,
					    wc_opcode_name(want));
				scnt++;
			} else if (wc[i].wr_id == RECV_WRID) {
				check_recv(&wc[i], &rem, rcnt++);
				if (--routs <= 1)
					routs += post_recv(o.rx_depth - routs);
			} else {
				die("completion for unknown wr_id %" PRIu64, wc[i].wr_id);
			}
			pending &= ~(int)wc[i].wr_id;
			if (posted < o.iters && !pending) {
				post_send(&rem, posted++);
				pending = RECV_WRID | SEND_WRID;
			}
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	{
		double usec = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
		long long bytes = (long long)o.size * o.iters * 2;

		printf("%lld bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec / 1e6,
		       bytes * 8. / usec);
		printf("%lld iters in %.2f seconds = %.2f usec/iter\n", o.iters, usec / 1e6,
		       usec / o.iters);
	}
	opname = o.op == OP_WRITE ? "RDMA_WRITE_WITH_IMM" : "SEND_WITH_IMM";
	printf("%lld immediates checked (%s %s: wc_flags, opcode, imm_data, byte_len, payload)\n",
	       rcnt, o.qpt == IBV_QPT_RC ? "rc" : o.qpt == IBV_QPT_UC ? "uc" : "ud", opname);

	if (c.ah)
		ibv_destroy_ah(c.ah);
	e = ibv_destroy_qp(c.qp) || ibv_destroy_cq(c.cq) || ibv_dereg_mr(c.mr) ||
	    ibv_dealloc_pd(c.pd) || ibv_close_device(c.ctx);
	if (e)
		die("couldn't release the verbs resources");
	free(c.buf);
	return 0;
}
