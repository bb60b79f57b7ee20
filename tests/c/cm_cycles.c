/*
 * cm_cycles: N connect / transfer / disconnect cycles through librdmacm in one process, and
 * nothing may leak. Against any librdmacm (RoCEmu's drop-in library under `rocemu exec`, or
 * rdma-core's over rdma_rxe). Built by scripts/rdmacm-tests against the system's
 * <rdma/rdma_cma.h>:
 *
 *     gcc -O2 -Wall -Wextra -Werror -o cm_cycles tests/c/cm_cycles.c -lrdmacm -libverbs
 *     cm_cycles -s [-b ADDR] [-p PORT] [-n N] [-B BASE]   server: one listener, N connections
 *     cm_cycles -c ADDR [-p PORT] [-n N] [-B BASE]        client: N cycles (default 1000)
 *
 * A client cycle, all on objects of its own: an event channel and an RDMA_PS_TCP id,
 * rdma_resolve_addr, rdma_resolve_route, a PD, a CQ, an MR, rdma_create_qp (RC), a receive
 * posted, rdma_connect, ESTABLISHED, one SEND of SIZE bytes whose pattern depends on the cycle,
 * the server's answering SEND (checked), rdma_disconnect, DISCONNECTED, then every object
 * destroyed. The server accepts each connection on objects of its own in the same way, checks
 * the client's bytes, answers, and destroys them after DISCONNECTED.
 *
 * After cycle BASE (default 10) and after the last one, each end counts its open descriptors
 * (/proc/self/fd), its VmRSS (/proc/self/status) and, through rocemu_live_objects() (looked up
 * with dlsym: RoCEmu's library exports it, rdma-core's does not), the library's live objects. It
 * fails if the descriptors grew at all, if VmRSS grew by more than RSS_SLACK_KB, if any live
 * object count grew, if the counts after the last cycle are not exactly what is left (nothing;
 * on the server its listener id and event channel), or if the library does not export
 * rocemu_live_objects. Every event waited
 * for has a deadline: a lost one is a failure, never a hang.
 *
 * Prints "ok [side] ..." per check, "FAILED [side] ..." and exits 1 on a failure.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SIZE 4096
#define WAIT_MS 10000
#define RSS_SLACK_KB 2048

/* What RoCEmu's library counts (rocemu_live_objects fills min(len, sizeof) bytes of it). */
struct rocemu_objects {
	uint64_t pds, cqs, qps, srqs, mrs, ahs, comp_channels, cm_ids, cm_connections,
		event_channels;
};
static const char *const obj_names[] = { "pds", "cqs", "qps", "srqs", "mrs", "ahs",
					 "comp_channels", "cm_ids", "cm_connections",
					 "event_channels" };
#define NOBJ (sizeof(struct rocemu_objects) / sizeof(uint64_t))
typedef int (*live_objects_fn)(struct rocemu_objects *o, size_t len);

static const char *role = "?";
static int cycle;
/* The cycle after which the first count is taken (-B). */
static int base_cycle = 10;
static int failures;
static unsigned timewaits;

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("FAILED [%s] cycle %d: ", role, cycle);
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
}

/* A check that fails the run at the end but lets the other checks report. */
static void check(int good, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s [%s] ", good ? "ok" : "FAILED", role);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	failures += !good;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* ---- what the process holds */

struct snapshot {
	int fds;
	long rss_kb;
	int have_objs;
	struct rocemu_objects objs;
};

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		fail("opendir /proc/self/fd: %s", strerror(errno));
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own descriptor */
}

static long vm_rss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		fail("fopen /proc/self/status: %s", strerror(errno));
	char line[256];
	long kb = -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	fclose(f);
	if (kb < 0)
		fail("no VmRSS in /proc/self/status");
	return kb;
}

static live_objects_fn live_objects;

static struct snapshot snap(void)
{
	struct snapshot s;
	memset(&s, 0, sizeof s);
	s.fds = count_fds();
	s.rss_kb = vm_rss_kb();
	if (live_objects) {
		int r = live_objects(&s.objs, sizeof s.objs);
		if (r != 0)
			fail("rocemu_live_objects returned %d", r);
		s.have_objs = 1;
	}
	return s;
}

static void print_snap(const char *when, const struct snapshot *s)
{
	printf("%s [%s] %s: fds %d, VmRSS %ld kB", "--", role, when, s->fds, s->rss_kb);
	if (s->have_objs) {
		const uint64_t *v = (const uint64_t *)&s->objs;
		printf(", objects");
		for (size_t i = 0; i < NOBJ; i++)
			printf(" %s %llu", obj_names[i], (unsigned long long)v[i]);
	}
	printf("\n");
	fflush(stdout);
}

/* What must be live once every cycle's objects are gone: nothing but, on the server, its
 * listener id and its event channel (cm_connections is left out: a connection may linger in
 * time-wait). A count that disagrees is a counting bug, which would hide leaks. */
static void expect_exact(const struct snapshot *s, int server)
{
	if (!s->have_objs)
		return;
	const uint64_t *v = (const uint64_t *)&s->objs;
	for (size_t i = 0; i < NOBJ; i++) {
		if (!strcmp(obj_names[i], "cm_connections"))
			continue;
		uint64_t want = server && (!strcmp(obj_names[i], "cm_ids") ||
					   !strcmp(obj_names[i], "event_channels"));
		check(v[i] == want, "live %s after the last cycle: %llu, want %llu%s", obj_names[i],
		      (unsigned long long)v[i], (unsigned long long)want,
		      want ? " (the listener's)" : "");
	}
}

static void compare(const struct snapshot *a, const struct snapshot *b, int n)
{
	int base = n < base_cycle ? n : base_cycle;
	check(b->fds <= a->fds, "descriptors after cycle %d: %d, after cycle %d: %d", base, a->fds,
	      n, b->fds);
	check(b->rss_kb - a->rss_kb <= RSS_SLACK_KB,
	      "VmRSS after cycle %d: %ld kB, after cycle %d: %ld kB (%+ld kB; at most +%d)", base,
	      a->rss_kb, n, b->rss_kb, b->rss_kb - a->rss_kb, RSS_SLACK_KB);
	check(live_objects != NULL,
	      "the library exports rocemu_live_objects (dlsym(RTLD_DEFAULT) found %s)",
	      live_objects ? "it" : "nothing: not RoCEmu's librdmacm, or too old a one");
	if (!live_objects)
		return;
	const uint64_t *x = (const uint64_t *)&a->objs, *y = (const uint64_t *)&b->objs;
	for (size_t i = 0; i < NOBJ; i++)
		check(y[i] <= x[i], "live %s after cycle %d: %llu, after cycle %d: %llu",
		      obj_names[i], base, (unsigned long long)x[i], n, (unsigned long long)y[i]);
}

/* ---- events and completions, with deadlines */

static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch,
					enum rdma_cm_event_type want, const char *what)
{
	for (;;) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		int r = poll(&p, 1, WAIT_MS);
		if (r < 0)
			fail("%s: poll on the event channel: %s", what, strerror(errno));
		if (r == 0)
			fail("%s: no event within %d ms (waiting for %s)", what, WAIT_MS,
			     rdma_event_str(want));
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev))
			fail("%s: rdma_get_cm_event: %s", what, strerror(errno));
		/* A connection's time-wait may end while we wait for the next one's events. */
		if (ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT && want != RDMA_CM_EVENT_TIMEWAIT_EXIT) {
			timewaits++;
			rdma_ack_cm_event(ev);
			continue;
		}
		if (ev->event != want)
			fail("%s: got %s (status %d), want %s", what, rdma_event_str(ev->event),
			     ev->status, rdma_event_str(want));
		if (ev->status != 0 && want != RDMA_CM_EVENT_DISCONNECTED)
			fail("%s: %s with status %d", what, rdma_event_str(ev->event), ev->status);
		return ev;
	}
}

static void poll_one(struct ibv_cq *cq, uint64_t wr_id, const char *what)
{
	double deadline = now() + WAIT_MS / 1000.0;
	for (;;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			fail("%s: ibv_poll_cq: %d", what, n);
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS)
				fail("%s: completion %s", what, ibv_wc_status_str(wc.status));
			if (wc.wr_id != wr_id)
				fail("%s: completion of wr_id %llu, want %llu", what,
				     (unsigned long long)wc.wr_id, (unsigned long long)wr_id);
			return;
		}
		if (now() > deadline)
			fail("%s: no completion within %d ms", what, WAIT_MS);
	}
}

/* ---- one connection's objects */

static uint8_t pat(int c, size_t i, int salt) { return (uint8_t)(c * 31 + i * 7 + salt * 101); }

struct conn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf; /* [0, SIZE) sent, [SIZE, 2 SIZE) received */
};

static void setup(struct conn *c)
{
	c->pd = ibv_alloc_pd(c->id->verbs);
	if (!c->pd)
		fail("ibv_alloc_pd: %s", strerror(errno));
	c->cq = ibv_create_cq(c->id->verbs, 8, NULL, NULL, 0);
	if (!c->cq)
		fail("ibv_create_cq: %s", strerror(errno));
	c->buf = malloc(2 * SIZE);
	if (!c->buf)
		fail("malloc");
	c->mr = ibv_reg_mr(c->pd, c->buf, 2 * SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!c->mr)
		fail("ibv_reg_mr: %s", strerror(errno));
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = c->cq;
	a.recv_cq = c->cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 4;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (rdma_create_qp(c->id, c->pd, &a))
		fail("rdma_create_qp: %s", strerror(errno));
	struct ibv_sge sge = { .addr = (uintptr_t)(c->buf + SIZE), .length = SIZE,
			       .lkey = c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(c->id->qp, &wr, &bad))
		fail("ibv_post_recv: %s", strerror(errno));
}

static void send_buf(struct conn *c)
{
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf, .length = SIZE, .lkey = c->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	if (ibv_post_send(c->id->qp, &wr, &bad))
		fail("ibv_post_send: %s", strerror(errno));
}

static void check_received(struct conn *c, int salt, const char *from)
{
	for (size_t i = 0; i < SIZE; i++)
		if (c->buf[SIZE + i] != pat(cycle, i, salt))
			fail("byte %zu from the %s: 0x%02x, want 0x%02x", i, from, c->buf[SIZE + i],
			     pat(cycle, i, salt));
}

static void teardown(struct conn *c)
{
	rdma_destroy_qp(c->id);
	if (ibv_dereg_mr(c->mr))
		fail("ibv_dereg_mr: %s", strerror(errno));
	if (ibv_destroy_cq(c->cq))
		fail("ibv_destroy_cq: %s", strerror(errno));
	if (ibv_dealloc_pd(c->pd))
		fail("ibv_dealloc_pd: %s", strerror(errno));
	free(c->buf);
	if (rdma_destroy_id(c->id))
		fail("rdma_destroy_id: %s", strerror(errno));
}

static struct rdma_conn_param conn_param(void)
{
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.responder_resources = 1;
	p.initiator_depth = 1;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	return p;
}

/* ---- the two ends */

static struct addrinfo *address(const char *host, const char *port, int passive)
{
	struct addrinfo hints, *res;
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = AI_NUMERICHOST | (passive ? AI_PASSIVE : 0);
	hints.ai_socktype = SOCK_STREAM;
	int r = getaddrinfo(host, port, &hints, &res);
	if (r)
		fail("address %s port %s: %s", host ? host : "(any)", port, gai_strerror(r));
	return res;
}

static void measure(int n, struct snapshot *base)
{
	if (cycle == (n < base_cycle ? n : base_cycle)) {
		*base = snap();
		print_snap("after the base cycle", base);
	}
}

static int server(const char *bind_to, const char *port, int n)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		fail("rdma_create_event_channel: %s", strerror(errno));
	struct rdma_cm_id *listener;
	if (rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	struct addrinfo *ai = address(bind_to, port, 1);
	if (rdma_bind_addr(listener, ai->ai_addr))
		fail("rdma_bind_addr: %s", strerror(errno));
	freeaddrinfo(ai);
	if (rdma_listen(listener, 8))
		fail("rdma_listen: %s", strerror(errno));
	printf("cm_cycles server: listening on port %s\n", port);
	fflush(stdout);
	struct snapshot base, end;
	memset(&base, 0, sizeof base);
	double t0 = 0;
	for (cycle = 1; cycle <= n; cycle++) {
		struct conn c;
		memset(&c, 0, sizeof c);
		struct rdma_cm_event *ev = wait_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, "connect request");
		if (cycle == 1)
			t0 = now();
		c.id = ev->id;
		rdma_ack_cm_event(ev);
		setup(&c);
		struct rdma_conn_param p = conn_param();
		if (rdma_accept(c.id, &p))
			fail("rdma_accept: %s", strerror(errno));
		rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ESTABLISHED, "accept"));
		poll_one(c.cq, 2, "the client's SEND");
		check_received(&c, 1, "client");
		for (size_t i = 0; i < SIZE; i++)
			c.buf[i] = pat(cycle, i, 2);
		send_buf(&c);
		poll_one(c.cq, 1, "the answer's send completion");
		rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_DISCONNECTED, "the client's disconnect"));
		/* (Answers the DREQ if the library has not; its verdict does not matter here.) */
		(void)rdma_disconnect(c.id);
		teardown(&c);
		measure(n, &base);
	}
	double t = now() - t0;
	end = snap();
	print_snap("after the last cycle", &end);
	ok("%d connections accepted, checked and answered in %.2f s (%.1f/s); %u TIMEWAIT_EXIT events seen",
	   n, t, n / t, timewaits);
	compare(&base, &end, n);
	expect_exact(&end, 1);
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(ch);
	return failures ? 1 : 0;
}

static int client(const char *server_addr, const char *port, int n)
{
	struct addrinfo *ai = address(server_addr, port, 0);
	struct snapshot base, end;
	memset(&base, 0, sizeof base);
	double t0 = now();
	for (cycle = 1; cycle <= n; cycle++) {
		struct conn c;
		memset(&c, 0, sizeof c);
		struct rdma_event_channel *ch = rdma_create_event_channel();
		if (!ch)
			fail("rdma_create_event_channel: %s", strerror(errno));
		if (rdma_create_id(ch, &c.id, NULL, RDMA_PS_TCP))
			fail("rdma_create_id: %s", strerror(errno));
		if (rdma_resolve_addr(c.id, NULL, ai->ai_addr, 2000))
			fail("rdma_resolve_addr: %s", strerror(errno));
		rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "rdma_resolve_addr"));
		if (rdma_resolve_route(c.id, 2000))
			fail("rdma_resolve_route: %s", strerror(errno));
		rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "rdma_resolve_route"));
		setup(&c);
		struct rdma_conn_param p = conn_param();
		if (rdma_connect(c.id, &p))
			fail("rdma_connect: %s", strerror(errno));
		rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ESTABLISHED, "rdma_connect"));
		for (size_t i = 0; i < SIZE; i++)
			c.buf[i] = pat(cycle, i, 1);
		send_buf(&c);
		poll_one(c.cq, 1, "the SEND's completion");
		poll_one(c.cq, 2, "the server's answer");
		check_received(&c, 2, "server");
		if (rdma_disconnect(c.id))
			fail("rdma_disconnect: %s", strerror(errno));
		rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_DISCONNECTED, "rdma_disconnect"));
		teardown(&c);
		rdma_destroy_event_channel(ch);
		measure(n, &base);
	}
	double t = now() - t0;
	freeaddrinfo(ai);
	end = snap();
	print_snap("after the last cycle", &end);
	ok("%d cycles (connect, %d-byte SEND each way checked, disconnect) in %.2f s: %.1f connections/s",
	   n, SIZE, t, n / t);
	compare(&base, &end, n);
	expect_exact(&end, 0);
	return failures ? 1 : 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: cm_cycles -s [-b ADDR] [-p PORT] [-n N] [-B BASE]\n"
			"       cm_cycles -c ADDR [-p PORT] [-n N] [-B BASE]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *addr = NULL, *port = "7471";
	int n = 1000, srv = -1, op;
	while ((op = getopt(argc, argv, "sc:b:p:n:B:")) != -1) {
		switch (op) {
		case 's':
			srv = 1;
			break;
		case 'c':
			srv = 0;
			addr = optarg;
			break;
		case 'b':
			addr = optarg;
			break;
		case 'p':
			port = optarg;
			break;
		case 'n':
			n = atoi(optarg);
			break;
		case 'B':
			base_cycle = atoi(optarg);
			break;
		default:
			usage();
		}
	}
	if (srv < 0 || n < 1 || base_cycle < 1 || optind != argc)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);
	role = srv ? "server" : "client";
	live_objects = (live_objects_fn)dlsym(RTLD_DEFAULT, "rocemu_live_objects");
	if (!live_objects)
		printf("FAILED [%s] rocemu_live_objects not found (dlsym: %s): live objects cannot be "
		       "counted; the descriptor and RSS checks still run\n",
		       role, dlerror());
	return srv ? server(addr, port, n) : client(addr, port, n);
}
