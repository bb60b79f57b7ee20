/*
 * cm_check: what librdmacm promises that rping and perftest never check. Against any librdmacm
 * (RoCEmu's drop-in library under `rocemu exec`, or rdma-core's over rdma_rxe). Built by
 * scripts/rdmacm-tests against the system's <rdma/rdma_cma.h>:
 *
 *     gcc -O2 -Wall -Wextra -Werror -o cm_check tests/c/cm_check.c -lrdmacm -libverbs
 *     cm_check -s [-b ADDR] [-p PORT]                 server
 *     cm_check -c SERVER -u UNANSWERED [-p PORT] [-g] client
 *
 * The client, in order (the server serves (a), (b) and the closing "bye" on PORT):
 *   (e) the event channel's fd is a real descriptor: with O_NONBLOCK, rdma_get_cm_event fails
 *       with EAGAIN while no event is ready, poll() says nothing is ready, then wakes (POLLIN)
 *       once rdma_resolve_addr's ADDR_RESOLVED is, and that event is the one read;
 *   (a) private data both ways: rdma_connect with 57 bytes of it is refused (EINVAL: PS_TCP's
 *       REQ has room for 92 - 36 bytes after the CMA header); with 56 bytes, they arrive intact
 *       in the server's CONNECT_REQUEST (private_data_len >= 56), and the server's rdma_accept
 *       private data (196 bytes, all a REP holds) arrives intact in the client's ESTABLISHED;
 *   (b) a second connection, rdma_connect(id, NULL) (no parameters: the server's CONNECT_REQUEST
 *       offers the device's maximum initiator depth and responder resources, not 0), which the
 *       server rdma_reject()s with 148 bytes of private data (all a REJ holds):
 *       RDMA_CM_EVENT_REJECTED with status 28 (IB_CM_REJ_CONSUMER_DEFINED) and them;
 *   (c) a connect to PORT + 1, where nobody listens on the live server: REJECTED with status 8
 *       (IB_CM_REJ_INVALID_SERVICE_ID: Linux's IB CM answers a REQ without a listener so,
 *       drivers/infiniband/core/cm.c cm_match_req, and cma.c hands the REJ's reason on as the
 *       event's status);
 *   (d) rdma_resolve_addr to UNANSWERED (an address nobody answers ARP/ND for) with a 500 ms
 *       timeout: RDMA_CM_EVENT_ADDR_ERROR with status -ETIMEDOUT (Linux's addr.c
 *       process_one_req once the deadline passes), not before 400 ms nor after 2000 ms;
 * and last a connection whose private data says "bye", which the server rejects and exits.
 * With -g (RoCEmu's drop-in only: with rdma-core's librdmacm this is a use after free):
 *   (g) rdma_get_cm_event on a channel just destroyed waits (after 300 ms its thread is still in
 *       it) instead of failing: Debian's rping (rdma-core before f3ae6534a) destroys the channel
 *       while its CM thread may be between two calls, and exits 255 after a good run if the
 *       call fails.
 * Every event waited for has a deadline. Prints "ok [side] ..." per check; "FAILED [side] ..."
 * and exit status 1 on the first failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 20000
#define REQ_PDATA 56  /* IB_CM_REQ_PRIVATE_DATA_SIZE (92) - the CMA header (36) */
#define REP_PDATA 196 /* IB_CM_REP_PRIVATE_DATA_SIZE */
#define REJ_PDATA 148 /* IB_CM_REJ_PRIVATE_DATA_SIZE */
#define REJ_CONSUMER_DEFINED 28
#define REJ_INVALID_SERVICE_ID 8
#define RESOLVE_MS 500

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
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static uint8_t pat(size_t i, int salt) { return (uint8_t)(i * 13 + salt * 71 + 5); }

static void fill(uint8_t *p, size_t n, int salt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pat(i, salt);
}

/* Whether `got` (len bytes) begins with the n bytes of pattern `salt`; says where not. */
static void expect_pdata(const void *got, uint8_t len, size_t n, int salt, const char *what)
{
	if (!got)
		fail("%s: no private data (NULL), want %zu bytes", what, n);
	if (len < n)
		fail("%s: private_data_len %u, want at least %zu", what, len, n);
	const uint8_t *g = got;
	for (size_t i = 0; i < n; i++)
		if (g[i] != pat(i, salt))
			fail("%s: private data byte %zu is 0x%02x, want 0x%02x", what, i, g[i],
			     pat(i, salt));
}

/* The next event, within WAIT_MS, which must be `want` (its status is the caller's to judge). */
static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch,
					enum rdma_cm_event_type want, const char *what)
{
	for (;;) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		int r = poll(&p, 1, WAIT_MS);
		if (r < 0)
			fail("%s: poll on the event channel: %s", what, strerror(errno));
		if (r == 0)
			fail("%s: no event within %d ms (want %s)", what, WAIT_MS, rdma_event_str(want));
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev)) {
			if (errno == EAGAIN)
				continue; /* a wake-up without an event: poll again */
			fail("%s: rdma_get_cm_event: %s", what, strerror(errno));
		}
		if (ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT && want != RDMA_CM_EVENT_TIMEWAIT_EXIT) {
			rdma_ack_cm_event(ev);
			continue;
		}
		if (ev->event != want)
			fail("%s: got %s (status %d), want %s", what, rdma_event_str(ev->event),
			     ev->status, rdma_event_str(want));
		return ev;
	}
}

static void expect_ok_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
			    const char *what)
{
	struct rdma_cm_event *ev = wait_event(ch, want, what);
	if (ev->status)
		fail("%s: %s with status %d", what, rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
}

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

/* A PD, a CQ and an RC QP on `id` (torn down by destroy_qp_objs). */
struct qp_objs {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
};

static struct qp_objs make_qp(struct rdma_cm_id *id)
{
	struct qp_objs o;
	o.pd = ibv_alloc_pd(id->verbs);
	if (!o.pd)
		fail("ibv_alloc_pd: %s", strerror(errno));
	o.cq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
	if (!o.cq)
		fail("ibv_create_cq: %s", strerror(errno));
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = a.recv_cq = o.cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 2;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, o.pd, &a))
		fail("rdma_create_qp: %s", strerror(errno));
	return o;
}

static void destroy_all(struct rdma_cm_id *id, struct qp_objs *o)
{
	if (id->qp)
		rdma_destroy_qp(id);
	if (o) {
		ibv_destroy_cq(o->cq);
		ibv_dealloc_pd(o->pd);
	}
	if (rdma_destroy_id(id))
		fail("rdma_destroy_id: %s", strerror(errno));
}

static struct rdma_conn_param param(const void *pdata, uint8_t len)
{
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.responder_resources = 1;
	p.initiator_depth = 1;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	p.private_data = pdata;
	p.private_data_len = len;
	return p;
}

/* ---- server */

static int server(const char *bind_to, const char *port)
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
	if (rdma_listen(listener, 4))
		fail("rdma_listen: %s", strerror(errno));
	printf("cm_check server: listening on port %s\n", port);

	/* (a) */
	struct rdma_cm_event *ev = wait_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, "(a) connect request");
	if (ev->listen_id != listener || ev->id == listener || !ev->id || !ev->id->verbs)
		fail("(a) CONNECT_REQUEST: listen_id %p (the listener is %p), id %p, verbs %p",
		     (void *)ev->listen_id, (void *)listener, (void *)ev->id,
		     ev->id ? (void *)ev->id->verbs : NULL);
	expect_pdata(ev->param.conn.private_data, ev->param.conn.private_data_len, REQ_PDATA, 1,
		     "(a) CONNECT_REQUEST");
	ok("(a) CONNECT_REQUEST carries the client's %d bytes of private data intact "
	   "(private_data_len %u)",
	   REQ_PDATA, ev->param.conn.private_data_len);
	struct rdma_cm_id *id = ev->id;
	rdma_ack_cm_event(ev);
	struct qp_objs o = make_qp(id);
	uint8_t rep[REP_PDATA];
	fill(rep, sizeof rep, 2);
	struct rdma_conn_param p = param(rep, sizeof rep);
	if (rdma_accept(id, &p))
		fail("(a) rdma_accept with %d bytes of private data: %s", REP_PDATA, strerror(errno));
	expect_ok_event(ch, RDMA_CM_EVENT_ESTABLISHED, "(a) accept");
	rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_DISCONNECTED, "(a) the client's disconnect"));
	(void)rdma_disconnect(id);
	destroy_all(id, &o);
	ok("(a) accepted with %d bytes of private data; ESTABLISHED; DISCONNECTED", REP_PDATA);

	/* (b) */
	ev = wait_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, "(b) connect request");
	/* rdma_connect(id, NULL) offers the device's maximum (librdmacm: RDMA_MAX_RESP_RES and
	 * RDMA_MAX_INIT_DEPTH stand for it), never 0: 0 responder resources refuse every READ. */
	if (!ev->param.conn.initiator_depth || !ev->param.conn.responder_resources)
		fail("(b) CONNECT_REQUEST of rdma_connect(id, NULL): initiator_depth %u, "
		     "responder_resources %u, want the device's maximum (not 0)",
		     ev->param.conn.initiator_depth, ev->param.conn.responder_resources);
	ok("(b) rdma_connect(id, NULL) offers initiator_depth %u, responder_resources %u",
	   ev->param.conn.initiator_depth, ev->param.conn.responder_resources);
	id = ev->id;
	rdma_ack_cm_event(ev);
	uint8_t rej[REJ_PDATA];
	fill(rej, sizeof rej, 3);
	if (rdma_reject(id, rej, sizeof rej))
		fail("(b) rdma_reject with %d bytes of private data: %s", REJ_PDATA, strerror(errno));
	destroy_all(id, NULL);
	ok("(b) rejected the second connection with %d bytes of private data", REJ_PDATA);

	/* the client's last connection says it is done */
	ev = wait_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, "the closing connect request");
	if (ev->param.conn.private_data_len < 3 || memcmp(ev->param.conn.private_data, "bye", 3))
		fail("the closing connect request does not say bye");
	id = ev->id;
	rdma_ack_cm_event(ev);
	if (rdma_reject(id, NULL, 0))
		fail("rdma_reject of the closing connection: %s", strerror(errno));
	destroy_all(id, NULL);
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(ch);
	ok("done");
	return 0;
}

/* ---- client */

/* A fresh id on `ch`, address and route resolved to `dst`. */
static struct rdma_cm_id *resolved(struct rdma_event_channel *ch, struct sockaddr *dst,
				   const char *what)
{
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("%s: rdma_create_id: %s", what, strerror(errno));
	if (rdma_resolve_addr(id, NULL, dst, 2000))
		fail("%s: rdma_resolve_addr: %s", what, strerror(errno));
	expect_ok_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, what);
	if (rdma_resolve_route(id, 2000))
		fail("%s: rdma_resolve_route: %s", what, strerror(errno));
	expect_ok_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, what);
	return id;
}

/* Connects `id` with `pdata` and expects REJECTED with `status` and, if `want_len`, the
 * pattern `salt` in its first want_len bytes of private data. */
static void expect_reject(struct rdma_event_channel *ch, struct rdma_cm_id *id, const char *pdata,
			  int status, size_t want_len, int salt, const char *what)
{
	struct rdma_conn_param p = param(pdata, pdata ? (uint8_t)strlen(pdata) : 0);
	/* No private data: no parameters at all (rdma_connect(id, NULL), valid with a QP). */
	if (rdma_connect(id, pdata ? &p : NULL))
		fail("%s: rdma_connect: %s", what, strerror(errno));
	struct rdma_cm_event *ev = wait_event(ch, RDMA_CM_EVENT_REJECTED, what);
	if (ev->status != status)
		fail("%s: REJECTED with status %d, want %d", what, ev->status, status);
	if (want_len)
		expect_pdata(ev->param.conn.private_data, ev->param.conn.private_data_len, want_len,
			     salt, what);
	ok("%s: RDMA_CM_EVENT_REJECTED, status %d%s (private_data_len %u)", what, ev->status,
	   want_len ? ", the server's private data intact" : "", ev->param.conn.private_data_len);
	rdma_ack_cm_event(ev);
}

static volatile int gone_returned, gone_errno;

static void *gone_waiter(void *ch)
{
	struct rdma_cm_event *ev;
	rdma_get_cm_event(ch, &ev);
	gone_errno = errno;
	gone_returned = 1;
	return NULL;
}

static void check_gone_channel(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		fail("(g) rdma_create_event_channel: %s", strerror(errno));
	rdma_destroy_event_channel(ch);
	pthread_t t;
	if (pthread_create(&t, NULL, gone_waiter, ch))
		fail("(g) pthread_create");
	struct timespec d = {0, 300 * 1000 * 1000};
	nanosleep(&d, NULL);
	if (gone_returned)
		fail("(g) rdma_get_cm_event on a destroyed channel returned (errno %d): want a wait",
		     gone_errno);
	pthread_detach(t);
	ok("(g) rdma_get_cm_event on a destroyed channel: still waiting after 300 ms");
}

static int client(const char *server_addr, const char *unanswered, const char *port, int gone_check)
{
	struct addrinfo *srv = address(server_addr, port, 0);

	/* (e) */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		fail("rdma_create_event_channel: %s", strerror(errno));
	struct stat st;
	if (fstat(ch->fd, &st))
		fail("(e) fstat of the channel's fd %d: %s", ch->fd, strerror(errno));
	int fl = fcntl(ch->fd, F_GETFL);
	if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK))
		fail("(e) fcntl O_NONBLOCK on fd %d: %s", ch->fd, strerror(errno));
	struct rdma_cm_event *ev;
	errno = 0;
	if (rdma_get_cm_event(ch, &ev) != -1 || errno != EAGAIN)
		fail("(e) rdma_get_cm_event with nothing ready: errno %d (%s), want EAGAIN", errno,
		     strerror(errno));
	struct pollfd pf = { .fd = ch->fd, .events = POLLIN };
	int r = poll(&pf, 1, 0);
	if (r != 0)
		fail("(e) poll with nothing ready: %d (revents 0x%x), want 0", r, pf.revents);
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("(e) rdma_create_id: %s", strerror(errno));
	double t0 = now();
	if (rdma_resolve_addr(id, NULL, srv->ai_addr, 2000))
		fail("(e) rdma_resolve_addr: %s", strerror(errno));
	r = poll(&pf, 1, 5000);
	double waited = now() - t0;
	if (r != 1 || !(pf.revents & POLLIN))
		fail("(e) poll after rdma_resolve_addr: %d (revents 0x%x) after %.0f ms, want POLLIN",
		     r, pf.revents, waited * 1e3);
	if (rdma_get_cm_event(ch, &ev))
		fail("(e) rdma_get_cm_event after POLLIN: %s", strerror(errno));
	if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED || ev->status || ev->id != id)
		fail("(e) after POLLIN: %s status %d, want ADDR_RESOLVED of our id",
		     rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
	errno = 0;
	if (rdma_get_cm_event(ch, &ev) != -1 || errno != EAGAIN)
		fail("(e) rdma_get_cm_event after the only event: errno %d (%s), want EAGAIN", errno,
		     strerror(errno));
	ok("(e) the channel's fd %d: EAGAIN when empty (O_NONBLOCK), poll() woke with POLLIN "
	   "after %.1f ms for ADDR_RESOLVED, EAGAIN again once it was read",
	   ch->fd, waited * 1e3);

	/* (a) */
	if (rdma_resolve_route(id, 2000))
		fail("(a) rdma_resolve_route: %s", strerror(errno));
	expect_ok_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "(a) rdma_resolve_route");
	struct qp_objs o = make_qp(id);
	uint8_t req[REQ_PDATA + 1];
	fill(req, sizeof req, 1);
	struct rdma_conn_param p = param(req, REQ_PDATA + 1);
	errno = 0;
	if (rdma_connect(id, &p) != -1 || errno != EINVAL)
		fail("(a) rdma_connect with %d bytes of private data: errno %d (%s), want EINVAL",
		     REQ_PDATA + 1, errno, strerror(errno));
	ok("(a) rdma_connect with %d bytes of private data (one too many for PS_TCP): EINVAL",
	   REQ_PDATA + 1);
	p = param(req, REQ_PDATA);
	if (rdma_connect(id, &p))
		fail("(a) rdma_connect with %d bytes of private data: %s", REQ_PDATA, strerror(errno));
	ev = wait_event(ch, RDMA_CM_EVENT_ESTABLISHED, "(a) rdma_connect");
	if (ev->status)
		fail("(a) ESTABLISHED with status %d", ev->status);
	expect_pdata(ev->param.conn.private_data, ev->param.conn.private_data_len, REP_PDATA, 2,
		     "(a) ESTABLISHED");
	ok("(a) ESTABLISHED carries the server's %d bytes of private data intact (private_data_len %u)",
	   REP_PDATA, ev->param.conn.private_data_len);
	rdma_ack_cm_event(ev);
	if (rdma_disconnect(id))
		fail("(a) rdma_disconnect: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_DISCONNECTED, "(a) rdma_disconnect"));
	destroy_all(id, &o);

	/* (b) */
	id = resolved(ch, srv->ai_addr, "(b)");
	o = make_qp(id);
	expect_reject(ch, id, NULL, REJ_CONSUMER_DEFINED, REJ_PDATA, 3,
		      "(b) a connection (rdma_connect(id, NULL)) the server rdma_reject()s");
	destroy_all(id, &o);

	/* (c) */
	char other[16];
	snprintf(other, sizeof other, "%d", atoi(port) + 1);
	struct addrinfo *nobody = address(server_addr, other, 0);
	id = resolved(ch, nobody->ai_addr, "(c)");
	o = make_qp(id);
	expect_reject(ch, id, NULL, REJ_INVALID_SERVICE_ID, 0, 0,
		      "(c) a connection to a port nobody listens on");
	destroy_all(id, &o);
	freeaddrinfo(nobody);

	/* (d) */
	struct addrinfo *gone = address(unanswered, port, 0);
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("(d) rdma_create_id: %s", strerror(errno));
	t0 = now();
	if (rdma_resolve_addr(id, NULL, gone->ai_addr, RESOLVE_MS))
		fail("(d) rdma_resolve_addr: %s", strerror(errno));
	ev = wait_event(ch, RDMA_CM_EVENT_ADDR_ERROR, "(d) rdma_resolve_addr to an unanswered address");
	double ms = (now() - t0) * 1e3;
	if (ev->status != -ETIMEDOUT)
		fail("(d) ADDR_ERROR with status %d, want %d (-ETIMEDOUT)", ev->status, -ETIMEDOUT);
	if (ms < 0.8 * RESOLVE_MS || ms > RESOLVE_MS + 1500)
		fail("(d) ADDR_ERROR after %.0f ms, want within %d ms + 1500 ms and not before %.0f ms",
		     ms, RESOLVE_MS, 0.8 * RESOLVE_MS);
	ok("(d) rdma_resolve_addr(%s, %d ms): RDMA_CM_EVENT_ADDR_ERROR, status %d, after %.0f ms",
	   unanswered, RESOLVE_MS, ev->status, ms);
	rdma_ack_cm_event(ev);
	destroy_all(id, NULL);
	freeaddrinfo(gone);

	/* done */
	id = resolved(ch, srv->ai_addr, "the closing connection");
	o = make_qp(id);
	expect_reject(ch, id, "bye", REJ_CONSUMER_DEFINED, 0, 0, "the closing connection");
	destroy_all(id, &o);
	freeaddrinfo(srv);
	rdma_destroy_event_channel(ch);
	if (gone_check)
		check_gone_channel();
	ok("done");
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: cm_check -s [-b ADDR] [-p PORT]\n"
			"       cm_check -c SERVER -u UNANSWERED [-p PORT] [-g]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *addr = NULL, *unanswered = NULL, *port = "7472";
	int srv = -1, op, gone = 0;
	while ((op = getopt(argc, argv, "sc:b:u:p:g")) != -1) {
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
		case 'u':
			unanswered = optarg;
			break;
		case 'p':
			port = optarg;
			break;
		case 'g':
			gone = 1;
			break;
		default:
			usage();
		}
	}
	if (srv < 0 || (!srv && !unanswered) || optind != argc)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);
	role = srv ? "server" : "client";
	return srv ? server(addr, port) : client(addr, unanswered, port, gone);
}
