/*
 * ibv_agent: the conformance suite's control agent over libibverbs and librdmacm. It serves the
 * JSON-lines protocol of docs/agent-protocol.md (versions 1 and 2) for one RDMA device, so that
 * `rocemu conformance --target agent:tcp:HOST:PORT` judges rdma_rxe, or a real RNIC, the way it
 * judges RoCEmu through `rocemu agent`. The rxe guest ships it (testbed/rxevm/build-guest.sh
 * compiles it); scripts/conformance-rxe runs the suite through it. Written for RoCEmu from the
 * verbs and rdma_cm APIs and the protocol document; no rdma-core code.
 *
 * Usage: ibv_agent [-d DEV] [-p PORT] [-i IB_PORT]
 *   -d DEV       device (the first one)
 *   -p PORT      TCP port, on 0.0.0.0 (18600)
 *   -i IB_PORT   port of the device (1)
 *
 * Clients are served one at a time. Everything a client created (QPs and their address
 * handles, MRs and their buffers, CQs, PDs) is destroyed on `reset` and when it disconnects.
 * A line that is not a request gets {"id":null|…,"ok":false,"error":"…"} and the connection
 * stays open; a line longer than 1 MiB is refused and the connection closed. The agent never
 * exits on input.
 *
 * Where ibverbs and RoCEmu's agent differ, this agent does what ibverbs does: it passes every
 * request to the device as given and reports the device's refusal (errno) as the error.
 *
 * rdma_cm (version 2): `cm_listen` listens on an rdma_cm port (RDMA_PS_TCP) of every address,
 * and every connection request that reaches this device is accepted with an RC QP made for it
 * (rdma_create_qp, rdma_accept: librdmacm moves it to RTR and RTS, the kernel's CM chooses the
 * starting PSN). The event channel is served whenever the agent waits: for the client's next
 * line, and inside poll_cq's wait.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PROTOCOL_VERSION 2
#define MIN_PROTOCOL_VERSION 1
#define MAX_CM_CONNS 1024
#define MAX_LINE (1u << 20)
#define MAX_DEPTH 16
#define MAX_SGE 64
#define MAX_MR_LEN (1ull << 30)
#define MAX_READ (1ull << 24)

/* ---- JSON values ---------------------------------------------------------------------------- */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jv {
	enum jtype t;
	int b;            /* J_BOOL */
	int neg, integer; /* J_NUM: a minus sign; no fraction or exponent and within 64 bits */
	uint64_t u;       /* J_NUM: the magnitude when integer */
	char *s;          /* J_STR: decoded, NUL-terminated (len excludes it); J_NUM: the text */
	size_t len;
	size_t n;         /* J_ARR, J_OBJ: members */
	struct jv *kids;
	char **keys;      /* J_OBJ */
	const char *raw0, *raw1; /* the value's text in the line */
};

static void jv_free(struct jv *v)
{
	size_t i;
	for (i = 0; i < v->n; i++) {
		jv_free(&v->kids[i]);
		if (v->keys)
			free(v->keys[i]);
	}
	free(v->kids);
	free(v->keys);
	free(v->s);
	memset(v, 0, sizeof(*v));
}

struct parser {
	const char *start, *p, *end;
	char err[160];
};

static int perr(struct parser *ps, const char *what)
{
	if (!ps->err[0])
		snprintf(ps->err, sizeof(ps->err), "%s at byte %zu", what, (size_t)(ps->p - ps->start));
	return -1;
}

static void ws(struct parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n'))
		ps->p++;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int utf8_put(char *o, uint32_t c)
{
	if (c < 0x80) {
		o[0] = (char)c;
		return 1;
	}
	if (c < 0x800) {
		o[0] = (char)(0xc0 | (c >> 6));
		o[1] = (char)(0x80 | (c & 0x3f));
		return 2;
	}
	if (c < 0x10000) {
		o[0] = (char)(0xe0 | (c >> 12));
		o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
		o[2] = (char)(0x80 | (c & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | (c >> 18));
	o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
	o[2] = (char)(0x80 | ((c >> 6) & 0x3f));
	o[3] = (char)(0x80 | (c & 0x3f));
	return 4;
}

static int read_u4(struct parser *ps, uint32_t *out)
{
	int i, h;
	uint32_t v = 0;
	if (ps->end - ps->p < 4)
		return perr(ps, "a short \\u escape");
	for (i = 0; i < 4; i++) {
		h = hexval((unsigned char)ps->p[i]);
		if (h < 0)
			return perr(ps, "a bad \\u escape");
		v = v << 4 | (uint32_t)h;
	}
	ps->p += 4;
	*out = v;
	return 0;
}

/* After the opening quote. The decoded string is never longer than its escaped text. */
static int parse_string(struct parser *ps, char **out, size_t *outlen)
{
	const char *q = ps->p;
	size_t cap = 0, n = 0;
	char *s;
	/* The closing quote bounds the output size. */
	while (q < ps->end && *q != '"') {
		if (*q == '\\')
			q++;
		q++;
	}
	if (q >= ps->end)
		return perr(ps, "an unterminated string");
	cap = (size_t)(q - ps->p) + 1;
	s = malloc(cap + 4);
	if (!s)
		return perr(ps, "out of memory");
	while (ps->p < ps->end && *ps->p != '"') {
		unsigned char c = (unsigned char)*ps->p++;
		if (c < 0x20) {
			free(s);
			return perr(ps, "a control character in a string");
		}
		if (c != '\\') {
			s[n++] = (char)c;
			continue;
		}
		if (ps->p >= ps->end) {
			free(s);
			return perr(ps, "an unterminated string");
		}
		c = (unsigned char)*ps->p++;
		switch (c) {
		case '"': s[n++] = '"'; break;
		case '\\': s[n++] = '\\'; break;
		case '/': s[n++] = '/'; break;
		case 'b': s[n++] = '\b'; break;
		case 'f': s[n++] = '\f'; break;
		case 'n': s[n++] = '\n'; break;
		case 'r': s[n++] = '\r'; break;
		case 't': s[n++] = '\t'; break;
		case 'u': {
			uint32_t cp, lo;
			if (read_u4(ps, &cp)) {
				free(s);
				return -1;
			}
			if (cp >= 0xd800 && cp < 0xdc00 && ps->end - ps->p >= 6 && ps->p[0] == '\\' &&
			    ps->p[1] == 'u') {
				const char *save = ps->p;
				ps->p += 2;
				if (read_u4(ps, &lo)) {
					free(s);
					return -1;
				}
				if (lo >= 0xdc00 && lo < 0xe000)
					cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
				else
					ps->p = save;
			}
			if (cp >= 0xd800 && cp < 0xe000)
				cp = 0xfffd;
			/* 6 escaped characters give at most 4 bytes: always room. */
			n += (size_t)utf8_put(s + n, cp);
			break;
		}
		default:
			free(s);
			return perr(ps, "a bad escape in a string");
		}
	}
	if (ps->p >= ps->end) {
		free(s);
		return perr(ps, "an unterminated string");
	}
	ps->p++; /* the closing quote */
	s[n] = 0;
	*out = s;
	*outlen = n;
	return 0;
}

static int parse_value(struct parser *ps, struct jv *v, int depth);

static int add_kid(struct parser *ps, struct jv *v, int with_key)
{
	struct jv *k = realloc(v->kids, (v->n + 1) * sizeof(*k));
	if (!k)
		return perr(ps, "out of memory");
	v->kids = k;
	memset(&v->kids[v->n], 0, sizeof(*k));
	if (with_key) {
		char **kk = realloc(v->keys, (v->n + 1) * sizeof(*kk));
		if (!kk)
			return perr(ps, "out of memory");
		v->keys = kk;
		v->keys[v->n] = NULL;
	}
	v->n++;
	return 0;
}

static int parse_value(struct parser *ps, struct jv *v, int depth)
{
	memset(v, 0, sizeof(*v));
	if (depth > MAX_DEPTH)
		return perr(ps, "nesting too deep");
	ws(ps);
	if (ps->p >= ps->end)
		return perr(ps, "a value missing");
	v->raw0 = ps->p;
	char c = *ps->p;
	if (c == '{' || c == '[') {
		int obj = c == '{';
		v->t = obj ? J_OBJ : J_ARR;
		ps->p++;
		ws(ps);
		if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) {
			ps->p++;
			v->raw1 = ps->p;
			return 0;
		}
		for (;;) {
			char *key = NULL;
			size_t klen;
			ws(ps);
			if (obj) {
				if (ps->p >= ps->end || *ps->p != '"')
					return perr(ps, "a key missing");
				ps->p++;
				if (parse_string(ps, &key, &klen))
					return -1;
				ws(ps);
				if (ps->p >= ps->end || *ps->p != ':') {
					free(key);
					return perr(ps, "a colon missing");
				}
				ps->p++;
			}
			if (add_kid(ps, v, obj)) {
				free(key);
				return -1;
			}
			if (obj)
				v->keys[v->n - 1] = key;
			if (parse_value(ps, &v->kids[v->n - 1], depth + 1))
				return -1;
			ws(ps);
			if (ps->p < ps->end && *ps->p == ',') {
				ps->p++;
				continue;
			}
			if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) {
				ps->p++;
				v->raw1 = ps->p;
				return 0;
			}
			return perr(ps, obj ? "a comma or } missing" : "a comma or ] missing");
		}
	}
	if (c == '"') {
		v->t = J_STR;
		ps->p++;
		if (parse_string(ps, &v->s, &v->len))
			return -1;
		v->raw1 = ps->p;
		return 0;
	}
	if (c == '-' || (c >= '0' && c <= '9')) {
		const char *s = ps->p;
		int digits = 0, ovf = 0;
		v->t = J_NUM;
		if (*ps->p == '-') {
			v->neg = 1;
			ps->p++;
		}
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
			unsigned d = (unsigned)(*ps->p - '0');
			if (v->u > (UINT64_MAX - d) / 10)
				ovf = 1;
			else
				v->u = v->u * 10 + d;
			ps->p++;
			digits++;
		}
		if (!digits)
			return perr(ps, "a bad number");
		v->integer = !ovf;
		if (ps->p < ps->end && *ps->p == '.') {
			ps->p++;
			v->integer = 0;
			digits = 0;
			while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
				ps->p++;
				digits++;
			}
			if (!digits)
				return perr(ps, "a bad number");
		}
		if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
			ps->p++;
			v->integer = 0;
			if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
				ps->p++;
			digits = 0;
			while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
				ps->p++;
				digits++;
			}
			if (!digits)
				return perr(ps, "a bad number");
		}
		v->raw1 = ps->p;
		v->len = (size_t)(ps->p - s);
		v->s = strndup(s, v->len > 40 ? 40 : v->len);
		if (!v->s)
			return perr(ps, "out of memory");
		return 0;
	}
	if (ps->end - ps->p >= 4 && !memcmp(ps->p, "true", 4)) {
		v->t = J_BOOL;
		v->b = 1;
		ps->p += 4;
	} else if (ps->end - ps->p >= 5 && !memcmp(ps->p, "false", 5)) {
		v->t = J_BOOL;
		ps->p += 5;
	} else if (ps->end - ps->p >= 4 && !memcmp(ps->p, "null", 4)) {
		v->t = J_NULL;
		ps->p += 4;
	} else {
		return perr(ps, "an unexpected character");
	}
	v->raw1 = ps->p;
	return 0;
}

/* ---- output ------------------------------------------------------------------------------- */

struct sb {
	char *p;
	size_t n, cap;
	int oom;
};

static void sb_grow(struct sb *b, size_t more)
{
	if (b->oom || b->n + more + 1 <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->n + more + 1)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p) {
		b->oom = 1;
		return;
	}
	b->p = p;
	b->cap = cap;
}

static void sb_mem(struct sb *b, const char *s, size_t n)
{
	sb_grow(b, n);
	if (b->oom)
		return;
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

__attribute__((format(printf, 2, 3))) static void sb_printf(struct sb *b, const char *fmt, ...)
{
	char tmp[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof(tmp)) {
		sb_mem(b, tmp, (size_t)n);
		return;
	}
	sb_grow(b, (size_t)n);
	if (b->oom)
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->n += (size_t)n;
}

/* A JSON string (quoted, escaped). Bytes that are not valid UTF-8 are not checked: errors
 * quote only our own text and names. */
static void sb_str(struct sb *b, const char *s)
{
	sb_mem(b, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			char e[2] = {'\\', (char)c};
			sb_mem(b, e, 2);
		} else if (c < 0x20 || c == 0x7f) {
			sb_printf(b, "\\u%04x", c);
		} else {
			sb_mem(b, (const char *)&c, 1);
		}
	}
	sb_mem(b, "\"", 1);
}

/* A field of the response: ,"key":… */
static void sb_key(struct sb *b, const char *k)
{
	sb_mem(b, ",", 1);
	sb_str(b, k);
	sb_mem(b, ":", 1);
}

static void put_u64(struct sb *b, const char *k, uint64_t v)
{
	sb_key(b, k);
	sb_printf(b, "%" PRIu64, v);
}

static void put_str(struct sb *b, const char *k, const char *v)
{
	sb_key(b, k);
	sb_str(b, v);
}

/* ---- request fields ----------------------------------------------------------------------- */

static char err[512];

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, sizeof(err), fmt, ap);
	va_end(ap);
	return -1;
}

static const struct jv *get(const struct jv *o, const char *k)
{
	size_t i;
	if (!o || o->t != J_OBJ)
		return NULL;
	/* The last of duplicate keys wins, as in most JSON libraries. */
	for (i = o->n; i-- > 0;)
		if (o->keys[i] && !strcmp(o->keys[i], k))
			return &o->kids[i];
	return NULL;
}

static int absent(const struct jv *v)
{
	return !v || v->t == J_NULL;
}

static int as_u64(const struct jv *v, const char *k, uint64_t *out)
{
	if (v->t == J_NUM) {
		if (v->neg && v->u == 0 && v->integer) {
			*out = 0;
			return 0;
		}
		if (v->neg || !v->integer)
			return fail("field \"%s\": %s is not an unsigned integer", k, v->s);
		*out = v->u;
		return 0;
	}
	if (v->t == J_STR) {
		const char *s = v->s;
		uint64_t x = 0;
		int hex = 0, n = 0;
		if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
			hex = 1;
			s += 2;
		}
		for (; *s; s++, n++) {
			int d = hex ? hexval((unsigned char)*s) : (*s >= '0' && *s <= '9' ? *s - '0' : -1);
			unsigned base = hex ? 16 : 10;
			if (d < 0 || x > (UINT64_MAX - (unsigned)d) / base)
				return fail("field \"%s\": \"%.40s\" is not an integer", k, v->s);
			x = x * base + (unsigned)d;
		}
		if (!n || (size_t)(s - v->s) != v->len)
			return fail("field \"%s\": \"%.40s\" is not an integer", k, v->s);
		*out = x;
		return 0;
	}
	return fail("field \"%s\": expected an integer", k);
}

/* A required integer at most max. */
static int u64_of(const struct jv *o, const char *k, uint64_t max, uint64_t *out)
{
	const struct jv *v = get(o, k);
	if (!v)
		return fail("missing field \"%s\"", k);
	if (as_u64(v, k, out))
		return -1;
	if (*out > max)
		return fail("field \"%s\": %" PRIu64 " is above %" PRIu64, k, *out, max);
	return 0;
}

/* An optional integer: 0 absent (out = def), 1 present, -1 bad. */
static int u64_opt(const struct jv *o, const char *k, uint64_t max, uint64_t def, uint64_t *out)
{
	const struct jv *v = get(o, k);
	if (absent(v)) {
		*out = def;
		return 0;
	}
	if (u64_of(o, k, max, out))
		return -1;
	return 1;
}

static int u32_of(const struct jv *o, const char *k, uint32_t *out)
{
	uint64_t x;
	if (u64_of(o, k, UINT32_MAX, &x))
		return -1;
	*out = (uint32_t)x;
	return 0;
}

static int str_of(const struct jv *o, const char *k, const char **out)
{
	const struct jv *v = get(o, k);
	if (!v)
		return fail("missing field \"%s\"", k);
	if (v->t != J_STR)
		return fail("field \"%s\": expected a string", k);
	*out = v->s;
	return 0;
}

static int bool_opt(const struct jv *o, const char *k, int def, int *out)
{
	const struct jv *v = get(o, k);
	if (absent(v)) {
		*out = def;
		return 0;
	}
	if (v->t != J_BOOL)
		return fail("field \"%s\": expected true or false", k);
	*out = v->b;
	return 0;
}

/* ---- the session's objects ---------------------------------------------------------------- */

struct pdo { uint32_t id; struct ibv_pd *pd; };
struct cqo { uint32_t id; struct ibv_cq *cq; };
struct mro { struct ibv_mr *mr; void *buf; size_t len; };
struct qpo { struct ibv_qp *qp; struct ibv_ah **ahs; size_t nah; };

struct vec { void **p; size_t n, cap; };

static int vec_push(struct vec *v, void *x)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? 2 * v->cap : 16;
		void **p = realloc(v->p, cap * sizeof(*p));
		if (!p)
			return fail("out of memory");
		v->p = p;
		v->cap = cap;
	}
	v->p[v->n++] = x;
	return 0;
}

static void vec_del(struct vec *v, size_t i)
{
	v->p[i] = v->p[--v->n];
}

static struct ibv_context *ctx;
static uint8_t ib_port = 1;
static const char *dev_name;
static struct vec pds, cqs, mrs, qps;
static uint32_t next_id = 1;

static long find_pd(uint32_t id)
{
	for (size_t i = 0; i < pds.n; i++)
		if (((struct pdo *)pds.p[i])->id == id)
			return (long)i;
	return fail("no protection domain %u", id);
}

static long find_cq(uint32_t id)
{
	for (size_t i = 0; i < cqs.n; i++)
		if (((struct cqo *)cqs.p[i])->id == id)
			return (long)i;
	return fail("no completion queue %u", id);
}

static long find_mr(uint32_t lkey)
{
	for (size_t i = 0; i < mrs.n; i++)
		if (((struct mro *)mrs.p[i])->mr->lkey == lkey)
			return (long)i;
	return fail("no memory region with lkey 0x%x", lkey);
}

static long find_qp(uint32_t qpn)
{
	for (size_t i = 0; i < qps.n; i++)
		if (((struct qpo *)qps.p[i])->qp->qp_num == qpn)
			return (long)i;
	return fail("no QP 0x%x", qpn);
}

static int verbs_err(const char *what, int e)
{
	if (e <= 0)
		e = errno ? errno : EINVAL;
	return fail("%s: %s (errno %d)", what, strerror(e), e);
}

static void qp_free(struct qpo *q)
{
	int e = ibv_destroy_qp(q->qp);
	if (e)
		fprintf(stderr, "ibv_agent: ibv_destroy_qp: %s\n", strerror(e));
	for (size_t i = 0; i < q->nah; i++)
		ibv_destroy_ah(q->ahs[i]);
	free(q->ahs);
	free(q);
}

static void mr_free(struct mro *m)
{
	int e = ibv_dereg_mr(m->mr);
	if (e)
		fprintf(stderr, "ibv_agent: ibv_dereg_mr: %s\n", strerror(e));
	free(m->buf);
	free(m);
}

static void cm_reset(void);

/* Destroys everything the session created, dependants first. */
static void reset_all(void)
{
	cm_reset();
	while (qps.n) {
		qp_free(qps.p[qps.n - 1]);
		qps.n--;
	}
	while (mrs.n) {
		mr_free(mrs.p[mrs.n - 1]);
		mrs.n--;
	}
	while (cqs.n) {
		struct cqo *c = cqs.p[--cqs.n];
		if (ibv_destroy_cq(c->cq))
			fprintf(stderr, "ibv_agent: ibv_destroy_cq failed\n");
		free(c);
	}
	while (pds.n) {
		struct pdo *p = pds.p[--pds.n];
		if (ibv_dealloc_pd(p->pd))
			fprintf(stderr, "ibv_agent: ibv_dealloc_pd failed\n");
		free(p);
	}
}

/* ---- names -------------------------------------------------------------------------------- */

static const char *const state_names[] = {
	[IBV_QPS_RESET] = "reset", [IBV_QPS_INIT] = "init", [IBV_QPS_RTR] = "rtr",
	[IBV_QPS_RTS] = "rts",     [IBV_QPS_SQD] = "sqd",   [IBV_QPS_SQE] = "sqe",
	[IBV_QPS_ERR] = "err",
};

static int state_of(const char *s, enum ibv_qp_state *out)
{
	for (size_t i = 0; i < sizeof(state_names) / sizeof(state_names[0]); i++)
		if (state_names[i] && !strcmp(state_names[i], s)) {
			*out = (enum ibv_qp_state)i;
			return 0;
		}
	return fail("field \"qp_state\": unknown QP state \"%.40s\"", s);
}

static const char *state_name(enum ibv_qp_state s)
{
	if ((size_t)s < sizeof(state_names) / sizeof(state_names[0]) && state_names[s])
		return state_names[s];
	return "unknown";
}

static const char *wc_status(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_SUCCESS: return "IBV_WC_SUCCESS";
	case IBV_WC_LOC_LEN_ERR: return "IBV_WC_LOC_LEN_ERR";
	case IBV_WC_LOC_QP_OP_ERR: return "IBV_WC_LOC_QP_OP_ERR";
	case IBV_WC_LOC_EEC_OP_ERR: return "IBV_WC_LOC_EEC_OP_ERR";
	case IBV_WC_LOC_PROT_ERR: return "IBV_WC_LOC_PROT_ERR";
	case IBV_WC_WR_FLUSH_ERR: return "IBV_WC_WR_FLUSH_ERR";
	case IBV_WC_MW_BIND_ERR: return "IBV_WC_MW_BIND_ERR";
	case IBV_WC_BAD_RESP_ERR: return "IBV_WC_BAD_RESP_ERR";
	case IBV_WC_LOC_ACCESS_ERR: return "IBV_WC_LOC_ACCESS_ERR";
	case IBV_WC_REM_INV_REQ_ERR: return "IBV_WC_REM_INV_REQ_ERR";
	case IBV_WC_REM_ACCESS_ERR: return "IBV_WC_REM_ACCESS_ERR";
	case IBV_WC_REM_OP_ERR: return "IBV_WC_REM_OP_ERR";
	case IBV_WC_RETRY_EXC_ERR: return "IBV_WC_RETRY_EXC_ERR";
	case IBV_WC_RNR_RETRY_EXC_ERR: return "IBV_WC_RNR_RETRY_EXC_ERR";
	case IBV_WC_LOC_RDD_VIOL_ERR: return "IBV_WC_LOC_RDD_VIOL_ERR";
	case IBV_WC_REM_INV_RD_REQ_ERR: return "IBV_WC_REM_INV_RD_REQ_ERR";
	case IBV_WC_REM_ABORT_ERR: return "IBV_WC_REM_ABORT_ERR";
	case IBV_WC_INV_EECN_ERR: return "IBV_WC_INV_EECN_ERR";
	case IBV_WC_INV_EEC_STATE_ERR: return "IBV_WC_INV_EEC_STATE_ERR";
	case IBV_WC_FATAL_ERR: return "IBV_WC_FATAL_ERR";
	case IBV_WC_RESP_TIMEOUT_ERR: return "IBV_WC_RESP_TIMEOUT_ERR";
	case IBV_WC_GENERAL_ERR: return "IBV_WC_GENERAL_ERR";
	case IBV_WC_TM_ERR: return "IBV_WC_TM_ERR";
	case IBV_WC_TM_RNDV_INCOMPLETE: return "IBV_WC_TM_RNDV_INCOMPLETE";
	}
	return "IBV_WC_UNKNOWN";
}

static const char *wc_opcode(enum ibv_wc_opcode o)
{
	switch (o) {
	case IBV_WC_SEND: return "IBV_WC_SEND";
	case IBV_WC_RDMA_WRITE: return "IBV_WC_RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "IBV_WC_RDMA_READ";
	case IBV_WC_COMP_SWAP: return "IBV_WC_COMP_SWAP";
	case IBV_WC_FETCH_ADD: return "IBV_WC_FETCH_ADD";
	case IBV_WC_BIND_MW: return "IBV_WC_BIND_MW";
	case IBV_WC_LOCAL_INV: return "IBV_WC_LOCAL_INV";
	case IBV_WC_TSO: return "IBV_WC_TSO";
	case IBV_WC_RECV: return "IBV_WC_RECV";
	case IBV_WC_RECV_RDMA_WITH_IMM: return "IBV_WC_RECV_RDMA_WITH_IMM";
	default: return "IBV_WC_UNKNOWN";
	}
}

static const struct { const char *name; enum ibv_wr_opcode op; } send_ops[] = {
	{"send", IBV_WR_SEND},
	{"send_with_imm", IBV_WR_SEND_WITH_IMM},
	{"rdma_write", IBV_WR_RDMA_WRITE},
	{"rdma_write_with_imm", IBV_WR_RDMA_WRITE_WITH_IMM},
	{"rdma_read", IBV_WR_RDMA_READ},
	{"atomic_cmp_and_swp", IBV_WR_ATOMIC_CMP_AND_SWP},
	{"atomic_cmp_swp", IBV_WR_ATOMIC_CMP_AND_SWP},
	{"atomic_fetch_and_add", IBV_WR_ATOMIC_FETCH_AND_ADD},
	{"atomic_fetch_add", IBV_WR_ATOMIC_FETCH_AND_ADD},
};

static int mtu_of(uint64_t bytes, enum ibv_mtu *out)
{
	switch (bytes) {
	case 256: *out = IBV_MTU_256; return 0;
	case 512: *out = IBV_MTU_512; return 0;
	case 1024: *out = IBV_MTU_1024; return 0;
	case 2048: *out = IBV_MTU_2048; return 0;
	case 4096: *out = IBV_MTU_4096; return 0;
	}
	return fail("path_mtu %" PRIu64 ": give 256, 512, 1024, 2048 or 4096", bytes);
}

static unsigned mtu_bytes(enum ibv_mtu m)
{
	return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128u << m : 0;
}

/* ---- helpers for requests ----------------------------------------------------------------- */

/* An IP address or GID in text: IPv4 becomes ::ffff:a.b.c.d. */
static int gid_of(const char *s, union ibv_gid *g)
{
	struct in_addr a4;
	memset(g, 0, sizeof(*g));
	if (inet_pton(AF_INET, s, &a4) == 1) {
		g->raw[10] = 0xff;
		g->raw[11] = 0xff;
		memcpy(&g->raw[12], &a4, 4);
		return 0;
	}
	if (inet_pton(AF_INET6, s, g->raw) == 1)
		return 0;
	return fail("field \"dgid\": \"%.40s\" is not an IP address or GID", s);
}

static void gid_text(const union ibv_gid *g, char *out, size_t n)
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (!memcmp(g->raw, mapped, 12))
		inet_ntop(AF_INET, &g->raw[12], out, (socklen_t)n);
	else
		inet_ntop(AF_INET6, g->raw, out, (socklen_t)n);
}

static int ah_of(const struct jv *a, struct ibv_ah_attr *ah)
{
	const char *dgid = NULL;
	uint64_t x;
	if (!a || a->t != J_OBJ)
		return fail("field \"ah\": expected an object");
	memset(ah, 0, sizeof(*ah));
	if (str_of(a, "dgid", &dgid) || gid_of(dgid, &ah->grh.dgid))
		return -1;
	ah->is_global = 1;
	ah->port_num = ib_port;
	if (u64_opt(a, "sgid_index", 255, 0, &x) < 0)
		return -1;
	ah->grh.sgid_index = (uint8_t)x;
	if (u64_opt(a, "hop_limit", 255, 64, &x) < 0)
		return -1;
	ah->grh.hop_limit = (uint8_t)x;
	if (u64_opt(a, "traffic_class", 255, 0, &x) < 0)
		return -1;
	ah->grh.traffic_class = (uint8_t)x;
	return 0;
}

static int sg_of(const struct jv *o, struct ibv_sge *sg, int *n)
{
	const struct jv *a = get(o, "sg");
	*n = 0;
	if (absent(a))
		return 0;
	if (a->t != J_ARR)
		return fail("field \"sg\": expected a list");
	if (a->n > MAX_SGE)
		return fail("field \"sg\": more than %d entries", MAX_SGE);
	for (size_t i = 0; i < a->n; i++) {
		const struct jv *e = &a->kids[i];
		uint64_t addr;
		if (e->t != J_OBJ)
			return fail("field \"sg\": expected objects");
		if (u64_of(e, "addr", UINT64_MAX, &addr) || u32_of(e, "length", &sg[i].length) ||
		    u32_of(e, "lkey", &sg[i].lkey))
			return -1;
		sg[i].addr = addr;
	}
	*n = (int)a->n;
	return 0;
}

static int range_of(struct mro *m, uint64_t off, uint64_t len)
{
	if (off > m->len || len > m->len - off)
		return fail("bytes %" PRIu64 "..+%" PRIu64 " are outside the region's %zu", off, len,
			    m->len);
	return 0;
}

/* ---- rdma_cm ------------------------------------------------------------------------------ */

enum cm_state { CM_CONNECTING, CM_ESTABLISHED, CM_DISCONNECTED, CM_REJECTED, CM_ERROR };
static const char *const cm_state_names[] = {"connecting", "established", "disconnected",
					      "rejected", "error"};

struct cm_listener { uint16_t port; struct rdma_cm_id *id; };
struct cm_conn {
	struct rdma_cm_id *id; /* its QP (id->qp) and CQs are librdmacm's, on the default PD */
	uint16_t port;
	uint32_t qpn, psn, sq_psn, remote_qpn;
	char peer[INET6_ADDRSTRLEN];
	enum cm_state state;
};

static struct rdma_event_channel *cm_ch;
static struct vec cm_listeners, cm_conns;

/* The event channel, made on first use; non-blocking, so that serving it never waits. */
static int cm_channel(void)
{
	if (cm_ch)
		return 0;
	cm_ch = rdma_create_event_channel();
	if (!cm_ch)
		return verbs_err("rdma_create_event_channel", errno);
	int fl = fcntl(cm_ch->fd, F_GETFL);
	if (fl < 0 || fcntl(cm_ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		int e = errno;
		rdma_destroy_event_channel(cm_ch);
		cm_ch = NULL;
		return verbs_err("fcntl on the rdma_cm event channel", e);
	}
	return 0;
}

static long find_cm_conn_id(const struct rdma_cm_id *id)
{
	for (size_t i = 0; i < cm_conns.n; i++)
		if (((struct cm_conn *)cm_conns.p[i])->id == id)
			return (long)i;
	return -1;
}

/* rdma_destroy_id on a connection the kernel's CM still holds sends what ib_destroy_cm_id
 * sends: a DREQ when it is established, a REJ while the REP awaits its RTU. */
static void cm_conn_free(struct cm_conn *c)
{
	if (c->id->qp)
		rdma_destroy_qp(c->id);
	if (rdma_destroy_id(c->id))
		fprintf(stderr, "ibv_agent: rdma_destroy_id: %s\n", strerror(errno));
	free(c);
}

static void cm_close_port(uint16_t port)
{
	for (size_t i = 0; i < cm_conns.n;) {
		struct cm_conn *c = cm_conns.p[i];
		if (c->port == port) {
			cm_conn_free(c);
			/* vec_del moves the last entry here: look at this index again. */
			vec_del(&cm_conns, i);
		} else {
			i++;
		}
	}
}

static void cm_reset(void)
{
	while (cm_conns.n)
		cm_conn_free(cm_conns.p[--cm_conns.n]);
	while (cm_listeners.n) {
		struct cm_listener *l = cm_listeners.p[--cm_listeners.n];
		rdma_destroy_id(l->id);
		free(l);
	}
	if (cm_ch) {
		rdma_destroy_event_channel(cm_ch);
		cm_ch = NULL;
	}
}

static void addr_text(const struct sockaddr *sa, char *out, size_t n)
{
	snprintf(out, n, "?");
	if (!sa)
		return;
	if (sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)n);
	else if (sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)n);
}

/* A connection request on listener `port`: an RC QP for it, then rdma_accept. 0 when accepted;
 * otherwise it was rejected and the caller destroys the id once the event is acknowledged. */
static int cm_accept(struct rdma_cm_id *id, uint16_t port, const struct rdma_conn_param *req)
{
	struct ibv_qp_init_attr qa;
	struct rdma_conn_param cp;
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	struct cm_conn *c = NULL;
	/* The listener hears every device; this agent speaks for one. */
	if (!id->verbs || strcmp(ibv_get_device_name(id->verbs->device), dev_name) ||
	    id->port_num != ib_port || cm_conns.n >= MAX_CM_CONNS)
		goto reject;
	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 4;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	/* The default PD of the device, and CQs librdmacm makes (and frees with the QP). */
	if (rdma_create_qp(id, NULL, &qa)) {
		fprintf(stderr, "ibv_agent: rdma_create_qp: %s\n", strerror(errno));
		goto reject;
	}
	memset(&cp, 0, sizeof(cp));
	/* The connections carry no traffic: one read or atomic each way is plenty. */
	cp.responder_resources = req && req->initiator_depth ? 1 : 0;
	cp.initiator_depth = req && req->responder_resources ? 1 : 0;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (rdma_accept(id, &cp)) {
		fprintf(stderr, "ibv_agent: rdma_accept: %s\n", strerror(errno));
		goto reject;
	}
	c = calloc(1, sizeof(*c));
	if (!c || vec_push(&cm_conns, c)) {
		free(c);
		goto reject;
	}
	c->id = id;
	c->port = port;
	c->qpn = id->qp->qp_num & 0xffffff;
	c->remote_qpn = req ? req->qp_num & 0xffffff : 0;
	/* rdma_accept took the QP through RTR, where the kernel gave it the CM's starting PSN. */
	memset(&a, 0, sizeof(a));
	if (!ibv_query_qp(id->qp, &a, IBV_QP_STATE | IBV_QP_RQ_PSN | IBV_QP_SQ_PSN, &ia)) {
		c->psn = a.rq_psn & 0xffffff;
		c->sq_psn = a.sq_psn & 0xffffff;
	}
	addr_text(rdma_get_peer_addr(id), c->peer, sizeof(c->peer));
	c->state = CM_CONNECTING;
	return 0;
reject:
	if (rdma_reject(id, NULL, 0))
		fprintf(stderr, "ibv_agent: rdma_reject: %s\n", strerror(errno));
	if (id->qp)
		rdma_destroy_qp(id);
	return -1;
}

/* One event: acted on, then acknowledged. */
static void cm_event(struct rdma_cm_event *ev)
{
	struct rdma_cm_id *id = ev->id;
	long i = find_cm_conn_id(id);
	struct cm_conn *c = i >= 0 ? cm_conns.p[i] : NULL;
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST: {
		int port = -1;
		for (size_t k = 0; k < cm_listeners.n; k++)
			if (((struct cm_listener *)cm_listeners.p[k])->id == ev->listen_id)
				port = ((struct cm_listener *)cm_listeners.p[k])->port;
		int ok = port >= 0 && !cm_accept(id, (uint16_t)port, &ev->param.conn);
		if (port < 0 && rdma_reject(id, NULL, 0))
			fprintf(stderr, "ibv_agent: rdma_reject: %s\n", strerror(errno));
		rdma_ack_cm_event(ev);
		/* A new id that was not kept is ours to destroy, once its event is acknowledged. */
		if (!ok)
			rdma_destroy_id(id);
		return;
	}
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c)
			c->state = CM_ESTABLISHED;
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		/* The peer's DREQ: the kernel's CM leaves the DREP to rdma_disconnect (which also
		 * moves the QP to ERR), as every librdmacm server calls it on this event. */
		if (c) {
			c->state = CM_DISCONNECTED;
			if (rdma_disconnect(id))
				fprintf(stderr, "ibv_agent: rdma_disconnect: %s\n", strerror(errno));
		}
		break;
	case RDMA_CM_EVENT_REJECTED:
		if (c)
			c->state = CM_REJECTED;
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		if (c)
			c->state = CM_ERROR;
		break;
	default:
		break;
	}
	rdma_ack_cm_event(ev);
}

/* Everything the event channel holds now. */
static void cm_service(void)
{
	struct rdma_cm_event *ev;
	while (cm_ch && !rdma_get_cm_event(cm_ch, &ev))
		cm_event(ev);
}

static int port_of(const struct jv *o, uint16_t *out)
{
	uint64_t p;
	if (u64_of(o, "port", 65535, &p))
		return -1;
	if (!p)
		return fail("field \"port\": 0 is not a port (1 … 65535)");
	*out = (uint16_t)p;
	return 0;
}

/* ---- operations --------------------------------------------------------------------------- */

static int op_hello(const struct jv *o, struct sb *r)
{
	uint64_t v;
	if (u64_of(o, "version", UINT64_MAX, &v))
		return -1;
	if (v < MIN_PROTOCOL_VERSION || v > PROTOCOL_VERSION)
		return fail("protocol version %" PRIu64 " not served (this agent speaks %d to %d)", v,
			    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION);
	put_u64(r, "version", v);
	char name[160];
	snprintf(name, sizeof(name), "ibv_agent %s (libibverbs, librdmacm)", dev_name);
	put_str(r, "agent", name);
	return 0;
}

/* The MAC of the port's netdev, from sysfs; else from a link-local EUI-64 GID. */
static void port_mac(const union ibv_gid *gid0, char *out, size_t n)
{
	char path[256], ndev[64] = "", mac[64] = "";
	FILE *f;
	snprintf(out, n, "00:00:00:00:00:00");
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%u/gid_attrs/ndevs/0", dev_name,
		 ib_port);
	f = fopen(path, "r");
	if (f) {
		if (!fgets(ndev, sizeof(ndev), f))
			ndev[0] = 0;
		fclose(f);
	}
	ndev[strcspn(ndev, "\n")] = 0;
	if (ndev[0] && !strchr(ndev, '/')) {
		snprintf(path, sizeof(path), "/sys/class/net/%s/address", ndev);
		f = fopen(path, "r");
		if (f) {
			if (!fgets(mac, sizeof(mac), f))
				mac[0] = 0;
			fclose(f);
		}
		mac[strcspn(mac, "\n")] = 0;
		if (strlen(mac) == 17) {
			snprintf(out, n, "%s", mac);
			return;
		}
	}
	if (gid0 && gid0->raw[0] == 0xfe && gid0->raw[1] == 0x80 && gid0->raw[11] == 0xff &&
	    gid0->raw[12] == 0xfe) {
		const uint8_t *g = gid0->raw;
		snprintf(out, n, "%02x:%02x:%02x:%02x:%02x:%02x", g[8] ^ 2, g[9], g[10], g[13], g[14],
			 g[15]);
	}
}

static int op_query_device(const struct jv *o, struct sb *r)
{
	struct ibv_port_attr pa;
	struct ibv_device_attr da;
	union ibv_gid gid0;
	int e, last = -1, have0 = 0;
	(void)o;
	e = ibv_query_port(ctx, ib_port, &pa);
	if (e)
		return verbs_err("ibv_query_port", e);
	e = ibv_query_device(ctx, &da);
	if (e)
		return verbs_err("ibv_query_device", e);
	int len = pa.gid_tbl_len > 1024 ? 1024 : pa.gid_tbl_len;
	union ibv_gid *g = calloc((size_t)(len > 0 ? len : 1), sizeof(*g));
	if (!g)
		return fail("out of memory");
	/* GID index i is gids[i]: the list ends at the last entry in use. */
	for (int i = 0; i < len; i++) {
		static const union ibv_gid zero;
		if (ibv_query_gid(ctx, ib_port, i, &g[i]))
			memset(&g[i], 0, sizeof(g[i]));
		if (memcmp(&g[i], &zero, sizeof(zero)))
			last = i;
	}
	if (len > 0) {
		gid0 = g[0];
		have0 = 1;
	}
	char mac[64], text[INET6_ADDRSTRLEN], name[200];
	port_mac(have0 ? &gid0 : NULL, mac, sizeof(mac));
	put_str(r, "mac", mac);
	sb_key(r, "gids");
	sb_mem(r, "[", 1);
	for (int i = 0; i <= last; i++) {
		if (i)
			sb_mem(r, ",", 1);
		gid_text(&g[i], text, sizeof(text));
		sb_str(r, text);
	}
	sb_mem(r, "]", 1);
	free(g);
	put_u64(r, "active_mtu", mtu_bytes(pa.active_mtu));
	snprintf(name, sizeof(name), "%s fw %s", dev_name, da.fw_ver);
	put_str(r, "name", name);
	/*
	 * Optional features, from the extended capability flags (Linux
	 * include/uapi/rdma/ib_user_verbs.h since 6.2: FLUSH_GLOBAL 1 << 38,
	 * FLUSH_PERSISTENT 1 << 39, ATOMIC_WRITE 1 << 40; by number, as older
	 * rdma-core headers lack them). A device that cannot say: none.
	 */
	struct ibv_device_attr_ex dx;
	memset(&dx, 0, sizeof(dx));
	uint64_t fx = 0;
	if (!ibv_query_device_ex(ctx, NULL, &dx))
		fx = dx.device_cap_flags_ex;
	sb_key(r, "caps");
	sb_mem(r, "[", 1);
	int ncap = 0;
	if (fx & ((1ULL << 38) | (1ULL << 39))) {
		sb_str(r, "flush");
		ncap++;
	}
	if (fx & (1ULL << 40)) {
		if (ncap)
			sb_mem(r, ",", 1);
		sb_str(r, "atomic_write");
	}
	sb_mem(r, "]", 1);
	return 0;
}

static int op_alloc_pd(const struct jv *o, struct sb *r)
{
	(void)o;
	struct pdo *p = calloc(1, sizeof(*p));
	if (!p)
		return fail("out of memory");
	p->pd = ibv_alloc_pd(ctx);
	if (!p->pd) {
		free(p);
		return verbs_err("ibv_alloc_pd", errno);
	}
	p->id = next_id++;
	if (vec_push(&pds, p)) {
		ibv_dealloc_pd(p->pd);
		free(p);
		return -1;
	}
	put_u64(r, "pd", p->id);
	return 0;
}

static int op_dealloc_pd(const struct jv *o, struct sb *r)
{
	uint32_t id;
	long i;
	(void)r;
	if (u32_of(o, "pd", &id) || (i = find_pd(id)) < 0)
		return -1;
	struct pdo *p = pds.p[i];
	int e = ibv_dealloc_pd(p->pd);
	if (e)
		return verbs_err("ibv_dealloc_pd", e);
	free(p);
	vec_del(&pds, (size_t)i);
	return 0;
}

static int op_reg_mr(const struct jv *o, struct sb *r)
{
	uint32_t pd, access;
	uint64_t len;
	long i;
	if (u32_of(o, "pd", &pd) || u64_of(o, "length", MAX_MR_LEN, &len) ||
	    u32_of(o, "access", &access) || (i = find_pd(pd)) < 0)
		return -1;
	long page = sysconf(_SC_PAGESIZE);
	size_t alloc = ((size_t)len + (size_t)page - 1) / (size_t)page * (size_t)page;
	if (!alloc)
		alloc = (size_t)page;
	struct mro *m = calloc(1, sizeof(*m));
	void *buf = NULL;
	if (!m || posix_memalign(&buf, (size_t)page, alloc)) {
		free(m);
		return fail("out of memory for %" PRIu64 " bytes", len);
	}
	memset(buf, 0, alloc);
	m->buf = buf;
	m->len = (size_t)len;
	m->mr = ibv_reg_mr(((struct pdo *)pds.p[i])->pd, buf, (size_t)len, (int)access);
	if (!m->mr) {
		int e = errno;
		free(buf);
		free(m);
		return verbs_err("ibv_reg_mr", e);
	}
	if (vec_push(&mrs, m)) {
		mr_free(m);
		return -1;
	}
	put_u64(r, "addr", (uint64_t)(uintptr_t)buf);
	put_u64(r, "length", len);
	put_u64(r, "lkey", m->mr->lkey);
	put_u64(r, "rkey", m->mr->rkey);
	return 0;
}

static int op_dereg_mr(const struct jv *o, struct sb *r)
{
	uint32_t lkey;
	long i;
	(void)r;
	if (u32_of(o, "lkey", &lkey) || (i = find_mr(lkey)) < 0)
		return -1;
	struct mro *m = mrs.p[i];
	int e = ibv_dereg_mr(m->mr);
	if (e)
		return verbs_err("ibv_dereg_mr", e);
	free(m->buf);
	free(m);
	vec_del(&mrs, (size_t)i);
	return 0;
}

static int op_write_mr(const struct jv *o, struct sb *r)
{
	uint32_t lkey;
	uint64_t off;
	const char *data = NULL;
	long i;
	(void)r;
	if (u32_of(o, "lkey", &lkey) || u64_opt(o, "offset", UINT64_MAX, 0, &off) < 0 ||
	    str_of(o, "data", &data))
		return -1;
	size_t n = strlen(data);
	if (n % 2 || n != get(o, "data")->len)
		return fail("field \"data\": not hex (two digits per byte)");
	for (size_t k = 0; k < n; k++)
		if (hexval((unsigned char)data[k]) < 0)
			return fail("field \"data\": not hex");
	if ((i = find_mr(lkey)) < 0)
		return -1;
	struct mro *m = mrs.p[i];
	if (range_of(m, off, n / 2))
		return -1;
	uint8_t *p = (uint8_t *)m->buf + off;
	for (size_t k = 0; k < n; k += 2)
		*p++ = (uint8_t)(hexval((unsigned char)data[k]) << 4 | hexval((unsigned char)data[k + 1]));
	return 0;
}

static int op_read_mr(const struct jv *o, struct sb *r)
{
	uint32_t lkey;
	uint64_t off, len;
	long i;
	if (u32_of(o, "lkey", &lkey) || u64_opt(o, "offset", UINT64_MAX, 0, &off) < 0 ||
	    u64_of(o, "length", UINT64_MAX, &len) || (i = find_mr(lkey)) < 0)
		return -1;
	if (len > MAX_READ)
		len = MAX_READ;
	struct mro *m = mrs.p[i];
	if (range_of(m, off, len))
		return -1;
	static const char digits[] = "0123456789abcdef";
	const uint8_t *p = (const uint8_t *)m->buf + off;
	sb_key(r, "data");
	sb_grow(r, 2 * len + 2);
	if (r->oom)
		return fail("out of memory");
	r->p[r->n++] = '"';
	for (uint64_t k = 0; k < len; k++) {
		r->p[r->n++] = digits[p[k] >> 4];
		r->p[r->n++] = digits[p[k] & 15];
	}
	r->p[r->n++] = '"';
	r->p[r->n] = 0;
	return 0;
}

static int op_create_cq(const struct jv *o, struct sb *r)
{
	uint64_t cqe;
	if (u64_of(o, "cqe", INT32_MAX, &cqe))
		return -1;
	struct cqo *c = calloc(1, sizeof(*c));
	if (!c)
		return fail("out of memory");
	c->cq = ibv_create_cq(ctx, (int)cqe, NULL, NULL, 0);
	if (!c->cq) {
		int e = errno;
		free(c);
		return verbs_err("ibv_create_cq", e);
	}
	c->id = next_id++;
	if (vec_push(&cqs, c)) {
		ibv_destroy_cq(c->cq);
		free(c);
		return -1;
	}
	put_u64(r, "cq", c->id);
	return 0;
}

static int op_destroy_cq(const struct jv *o, struct sb *r)
{
	uint32_t id;
	long i;
	(void)r;
	if (u32_of(o, "cq", &id) || (i = find_cq(id)) < 0)
		return -1;
	struct cqo *c = cqs.p[i];
	int e = ibv_destroy_cq(c->cq);
	if (e)
		return verbs_err("ibv_destroy_cq", e);
	free(c);
	vec_del(&cqs, (size_t)i);
	return 0;
}

static int op_create_qp(const struct jv *o, struct sb *r)
{
	uint32_t pd, scq;
	uint64_t rcq, x;
	const char *type = NULL;
	long ip, is, ir;
	struct ibv_qp_init_attr ia;
	int sig = 0;
	memset(&ia, 0, sizeof(ia));
	if (u32_of(o, "pd", &pd) || str_of(o, "type", &type) || u32_of(o, "send_cq", &scq) ||
	    u64_opt(o, "recv_cq", UINT32_MAX, scq, &rcq) < 0)
		return -1;
	if (!strcmp(type, "rc"))
		ia.qp_type = IBV_QPT_RC;
	else if (!strcmp(type, "uc"))
		ia.qp_type = IBV_QPT_UC;
	else if (!strcmp(type, "ud"))
		ia.qp_type = IBV_QPT_UD;
	else
		return fail("field \"type\": \"%.40s\" is not rc, uc or ud", type);
	if (u64_opt(o, "max_send_wr", UINT32_MAX, 16, &x) < 0)
		return -1;
	ia.cap.max_send_wr = (uint32_t)x;
	if (u64_opt(o, "max_recv_wr", UINT32_MAX, 16, &x) < 0)
		return -1;
	ia.cap.max_recv_wr = (uint32_t)x;
	if (u64_opt(o, "max_send_sge", UINT32_MAX, 1, &x) < 0)
		return -1;
	ia.cap.max_send_sge = (uint32_t)x;
	if (u64_opt(o, "max_recv_sge", UINT32_MAX, 1, &x) < 0)
		return -1;
	ia.cap.max_recv_sge = (uint32_t)x;
	if (u64_opt(o, "max_inline_data", UINT32_MAX, 0, &x) < 0)
		return -1;
	ia.cap.max_inline_data = (uint32_t)x;
	if (bool_opt(o, "sq_sig_all", 0, &sig))
		return -1;
	ia.sq_sig_all = sig;
	if ((ip = find_pd(pd)) < 0 || (is = find_cq(scq)) < 0 || (ir = find_cq((uint32_t)rcq)) < 0)
		return -1;
	ia.send_cq = ((struct cqo *)cqs.p[is])->cq;
	ia.recv_cq = ((struct cqo *)cqs.p[ir])->cq;
	struct qpo *q = calloc(1, sizeof(*q));
	if (!q)
		return fail("out of memory");
	q->qp = ibv_create_qp(((struct pdo *)pds.p[ip])->pd, &ia);
	if (!q->qp) {
		int e = errno;
		free(q);
		return verbs_err("ibv_create_qp", e);
	}
	if (vec_push(&qps, q)) {
		qp_free(q);
		return -1;
	}
	put_u64(r, "qpn", q->qp->qp_num);
	return 0;
}

static int op_modify_qp(const struct jv *o, struct sb *r)
{
	uint64_t qpn, x;
	long i;
	int mask = 0, p;
	struct ibv_qp_attr a;
	(void)r;
	memset(&a, 0, sizeof(a));
	if (u64_of(o, "qpn", 0xffffff, &qpn))
		return -1;
	const struct jv *s = get(o, "qp_state");
	if (!absent(s)) {
		if (s->t != J_STR)
			return fail("field \"qp_state\": expected a string");
		if (state_of(s->s, &a.qp_state))
			return -1;
		mask |= IBV_QP_STATE;
	}
#define OPT(key, max, bit, field)                                   \
	do {                                                        \
		if ((p = u64_opt(o, key, max, 0, &x)) < 0)          \
			return -1;                                  \
		if (p) {                                            \
			a.field = (__typeof__(a.field))x;           \
			mask |= bit;                                \
		}                                                   \
	} while (0)
	OPT("pkey_index", 0xffff, IBV_QP_PKEY_INDEX, pkey_index);
	OPT("port_num", 255, IBV_QP_PORT, port_num);
	OPT("qp_access_flags", UINT32_MAX, IBV_QP_ACCESS_FLAGS, qp_access_flags);
	OPT("qkey", UINT32_MAX, IBV_QP_QKEY, qkey);
	OPT("dest_qp_num", 0xffffff, IBV_QP_DEST_QPN, dest_qp_num);
	OPT("rq_psn", 0xffffff, IBV_QP_RQ_PSN, rq_psn);
	OPT("sq_psn", 0xffffff, IBV_QP_SQ_PSN, sq_psn);
	OPT("timeout", 255, IBV_QP_TIMEOUT, timeout);
	OPT("retry_cnt", 255, IBV_QP_RETRY_CNT, retry_cnt);
	OPT("rnr_retry", 255, IBV_QP_RNR_RETRY, rnr_retry);
	OPT("min_rnr_timer", 255, IBV_QP_MIN_RNR_TIMER, min_rnr_timer);
	OPT("max_rd_atomic", 255, IBV_QP_MAX_QP_RD_ATOMIC, max_rd_atomic);
	OPT("max_dest_rd_atomic", 255, IBV_QP_MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
#undef OPT
	if ((p = u64_opt(o, "path_mtu", UINT32_MAX, 0, &x)) < 0)
		return -1;
	if (p) {
		if (mtu_of(x, &a.path_mtu))
			return -1;
		mask |= IBV_QP_PATH_MTU;
	}
	const struct jv *ah = get(o, "ah");
	if (!absent(ah)) {
		if (ah_of(ah, &a.ah_attr))
			return -1;
		mask |= IBV_QP_AV;
	}
	if ((i = find_qp((uint32_t)qpn)) < 0)
		return -1;
	int e = ibv_modify_qp(((struct qpo *)qps.p[i])->qp, &a, mask);
	if (e)
		return verbs_err("ibv_modify_qp", e);
	return 0;
}

static int op_query_qp(const struct jv *o, struct sb *r)
{
	uint64_t qpn;
	long i;
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (u64_of(o, "qpn", 0xffffff, &qpn) || (i = find_qp((uint32_t)qpn)) < 0)
		return -1;
	memset(&a, 0, sizeof(a));
	int e = ibv_query_qp(((struct qpo *)qps.p[i])->qp, &a,
			     IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_SQ_PSN |
				     IBV_QP_PATH_MTU | IBV_QP_QKEY | IBV_QP_ACCESS_FLAGS |
				     IBV_QP_MIN_RNR_TIMER | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
				     IBV_QP_MAX_DEST_RD_ATOMIC,
			     &ia);
	if (e)
		return verbs_err("ibv_query_qp", e);
	put_str(r, "qp_state", state_name(a.qp_state));
	put_u64(r, "dest_qp_num", a.dest_qp_num & 0xffffff);
	put_u64(r, "rq_psn", a.rq_psn & 0xffffff);
	put_u64(r, "sq_psn", a.sq_psn & 0xffffff);
	put_u64(r, "path_mtu", mtu_bytes(a.path_mtu));
	put_u64(r, "qkey", a.qkey);
	put_u64(r, "qp_access_flags", a.qp_access_flags);
	put_u64(r, "min_rnr_timer", a.min_rnr_timer);
	put_u64(r, "timeout", a.timeout);
	put_u64(r, "retry_cnt", a.retry_cnt);
	put_u64(r, "rnr_retry", a.rnr_retry);
	put_u64(r, "max_rd_atomic", a.max_rd_atomic);
	put_u64(r, "max_dest_rd_atomic", a.max_dest_rd_atomic);
	return 0;
}

static int op_destroy_qp(const struct jv *o, struct sb *r)
{
	uint64_t qpn;
	long i;
	(void)r;
	if (u64_of(o, "qpn", 0xffffff, &qpn) || (i = find_qp((uint32_t)qpn)) < 0)
		return -1;
	struct qpo *q = qps.p[i];
	int e = ibv_destroy_qp(q->qp);
	if (e)
		return verbs_err("ibv_destroy_qp", e);
	for (size_t k = 0; k < q->nah; k++)
		ibv_destroy_ah(q->ahs[k]);
	free(q->ahs);
	free(q);
	vec_del(&qps, (size_t)i);
	return 0;
}

static int op_post_send(const struct jv *o, struct sb *r)
{
	uint64_t qpn;
	const char *name = NULL;
	long i;
	int n, sig = 1, sol = 0, fence = 0;
	struct ibv_sge sg[MAX_SGE];
	struct ibv_send_wr wr, *bad = NULL;
	(void)r;
	memset(&wr, 0, sizeof(wr));
	if (u64_of(o, "qpn", 0xffffff, &qpn) || str_of(o, "opcode", &name))
		return -1;
	size_t k;
	for (k = 0; k < sizeof(send_ops) / sizeof(send_ops[0]); k++)
		if (!strcmp(send_ops[k].name, name))
			break;
	if (k == sizeof(send_ops) / sizeof(send_ops[0]))
		return fail("field \"opcode\": unknown send opcode \"%.40s\"", name);
	wr.opcode = send_ops[k].op;
	if (u64_opt(o, "wr_id", UINT64_MAX, 0, &wr.wr_id) < 0 || sg_of(o, sg, &n) ||
	    bool_opt(o, "signaled", 1, &sig) || bool_opt(o, "solicited", 0, &sol) ||
	    bool_opt(o, "fence", 0, &fence))
		return -1;
	wr.sg_list = n ? sg : NULL;
	wr.num_sge = n;
	wr.send_flags = (sig ? IBV_SEND_SIGNALED : 0) | (sol ? IBV_SEND_SOLICITED : 0) |
			(fence ? IBV_SEND_FENCE : 0);
	uint64_t raddr, rkey, cmp, swp, imm;
	if (u64_opt(o, "remote_addr", UINT64_MAX, 0, &raddr) < 0 ||
	    u64_opt(o, "rkey", UINT64_MAX, 0, &rkey) < 0 ||
	    u64_opt(o, "imm_data", UINT64_MAX, 0, &imm) < 0 ||
	    u64_opt(o, "compare_add", UINT64_MAX, 0, &cmp) < 0 ||
	    u64_opt(o, "swap", UINT64_MAX, 0, &swp) < 0)
		return -1;
	if (rkey > UINT32_MAX)
		rkey = UINT32_MAX;
	if (imm > UINT32_MAX)
		imm = UINT32_MAX;
	switch (wr.opcode) {
	case IBV_WR_SEND_WITH_IMM:
		/* The protocol's immediate is the number the ImmDt field reads, big-endian. */
		wr.imm_data = htobe32((uint32_t)imm);
		break;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		wr.imm_data = htobe32((uint32_t)imm);
		/* fall through */
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_READ:
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = (uint32_t)rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = (uint32_t)rkey;
		wr.wr.atomic.compare_add = cmp;
		wr.wr.atomic.swap = swp;
		break;
	default:
		break;
	}
	if ((i = find_qp((uint32_t)qpn)) < 0)
		return -1;
	struct qpo *q = qps.p[i];
	const struct jv *ud = get(o, "ud");
	struct ibv_ah *ah = NULL;
	if (!absent(ud)) {
		struct ibv_ah_attr aa;
		uint64_t rq, qk;
		if (ud->t != J_OBJ)
			return fail("field \"ud\": expected an object");
		if (ah_of(get(ud, "ah"), &aa) || u64_of(ud, "remote_qpn", 0xffffff, &rq) ||
		    u64_of(ud, "remote_qkey", UINT32_MAX, &qk))
			return -1;
		struct ibv_ah **ahs = realloc(q->ahs, (q->nah + 1) * sizeof(*ahs));
		if (!ahs)
			return fail("out of memory");
		q->ahs = ahs;
		ah = ibv_create_ah(q->qp->pd, &aa);
		if (!ah)
			return verbs_err("ibv_create_ah", errno);
		/* Kept until the QP goes: the device may still use it after the post. */
		q->ahs[q->nah++] = ah;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = (uint32_t)rq;
		wr.wr.ud.remote_qkey = (uint32_t)qk;
	}
	int e = ibv_post_send(q->qp, &wr, &bad);
	if (e)
		return verbs_err("ibv_post_send", e);
	return 0;
}

static int op_post_recv(const struct jv *o, struct sb *r)
{
	uint64_t qpn;
	long i;
	int n;
	struct ibv_sge sg[MAX_SGE];
	struct ibv_recv_wr wr, *bad = NULL;
	(void)r;
	memset(&wr, 0, sizeof(wr));
	if (u64_of(o, "qpn", 0xffffff, &qpn) || u64_opt(o, "wr_id", UINT64_MAX, 0, &wr.wr_id) < 0 ||
	    sg_of(o, sg, &n) || (i = find_qp((uint32_t)qpn)) < 0)
		return -1;
	wr.sg_list = n ? sg : NULL;
	wr.num_sge = n;
	int e = ibv_post_recv(((struct qpo *)qps.p[i])->qp, &wr, &bad);
	if (e)
		return verbs_err("ibv_post_recv", e);
	return 0;
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static int op_poll_cq(const struct jv *o, struct sb *r)
{
	uint32_t id;
	uint64_t max, min, wait;
	long i;
	if (u32_of(o, "cq", &id) || u64_opt(o, "max", UINT64_MAX, 16, &max) < 0 ||
	    u64_opt(o, "min", UINT64_MAX, 1, &min) < 0 ||
	    u64_opt(o, "wait_ms", UINT64_MAX, 0, &wait) < 0 || (i = find_cq(id)) < 0)
		return -1;
	if (max < 1)
		max = 1;
	if (max > 4096)
		max = 4096;
	if (min > max)
		min = max;
	if (wait > 60000)
		wait = 60000;
	struct ibv_cq *cq = ((struct cqo *)cqs.p[i])->cq;
	struct ibv_wc *wc = calloc(max, sizeof(*wc));
	if (!wc)
		return fail("out of memory");
	uint64_t got = 0, deadline = now_ms() + wait;
	for (;;) {
		int n = ibv_poll_cq(cq, (int)(max - got), wc + got);
		if (n < 0) {
			free(wc);
			return fail("ibv_poll_cq failed (%d)", n);
		}
		got += (uint64_t)n;
		if (got >= min || got >= max || now_ms() >= deadline)
			break;
		cm_service();
		usleep(200);
	}
	sb_key(r, "wcs");
	sb_mem(r, "[", 1);
	for (uint64_t k = 0; k < got; k++) {
		struct ibv_wc *w = &wc[k];
		sb_printf(r, "%s{\"wr_id\":%" PRIu64, k ? "," : "", (uint64_t)w->wr_id);
		put_str(r, "status", wc_status(w->status));
		put_str(r, "opcode", wc_opcode(w->opcode));
		put_u64(r, "byte_len", w->byte_len);
		if (w->wc_flags & IBV_WC_WITH_IMM)
			put_u64(r, "imm_data", be32toh(w->imm_data));
		put_u64(r, "qp_num", w->qp_num & 0xffffff);
		put_u64(r, "src_qp", w->src_qp & 0xffffff);
		put_u64(r, "wc_flags", w->wc_flags);
		sb_mem(r, "}", 1);
	}
	sb_mem(r, "]", 1);
	free(wc);
	return 0;
}

static int op_reset(const struct jv *o, struct sb *r)
{
	(void)o;
	(void)r;
	reset_all();
	return 0;
}

static int op_cm_listen(const struct jv *o, struct sb *r)
{
	uint16_t port = 0;
	struct sockaddr_in sa;
	struct rdma_cm_id *id = NULL;
	(void)r;
	if (port_of(o, &port))
		return -1;
	for (size_t k = 0; k < cm_listeners.n; k++)
		if (((struct cm_listener *)cm_listeners.p[k])->port == port)
			return fail("cm_listen: already listening on port %u", port);
	if (cm_channel())
		return -1;
	if (rdma_create_id(cm_ch, &id, NULL, RDMA_PS_TCP))
		return verbs_err("rdma_create_id", errno);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons(port);
	sa.sin_addr.s_addr = htonl(INADDR_ANY);
	struct cm_listener *l = NULL;
	int e = 0;
	if (rdma_bind_addr(id, (struct sockaddr *)&sa))
		e = verbs_err("rdma_bind_addr", errno);
	else if (rdma_listen(id, 64))
		e = verbs_err("rdma_listen", errno);
	else if (!(l = calloc(1, sizeof(*l))))
		e = fail("out of memory");
	else if (vec_push(&cm_listeners, l))
		e = -1;
	if (e) {
		free(l);
		rdma_destroy_id(id);
		return -1;
	}
	l->port = port;
	l->id = id;
	return 0;
}

static int op_cm_connections(const struct jv *o, struct sb *r)
{
	(void)o;
	cm_service();
	sb_key(r, "connections");
	sb_mem(r, "[", 1);
	for (size_t k = 0; k < cm_conns.n; k++) {
		const struct cm_conn *c = cm_conns.p[k];
		sb_printf(r, "%s{\"port\":%u", k ? "," : "", c->port);
		put_u64(r, "qpn", c->qpn);
		put_u64(r, "psn", c->psn);
		put_u64(r, "sq_psn", c->sq_psn);
		put_u64(r, "remote_qpn", c->remote_qpn);
		put_str(r, "peer", c->peer);
		put_str(r, "state", cm_state_names[c->state]);
		sb_mem(r, "}", 1);
	}
	sb_mem(r, "]", 1);
	return 0;
}

static int op_cm_disconnect(const struct jv *o, struct sb *r)
{
	uint64_t qpn;
	(void)r;
	if (u64_of(o, "qpn", 0xffffff, &qpn))
		return -1;
	for (size_t k = 0; k < cm_conns.n; k++) {
		struct cm_conn *c = cm_conns.p[k];
		if (c->qpn == qpn) {
			cm_conn_free(c);
			vec_del(&cm_conns, k);
			return 0;
		}
	}
	return fail("cm_disconnect: no connection with QP 0x%" PRIx64, qpn);
}

static int op_cm_stop(const struct jv *o, struct sb *r)
{
	uint16_t port = 0;
	(void)r;
	if (port_of(o, &port))
		return -1;
	for (size_t k = 0; k < cm_listeners.n; k++) {
		struct cm_listener *l = cm_listeners.p[k];
		if (l->port == port) {
			cm_service();
			cm_close_port(port);
			rdma_destroy_id(l->id);
			free(l);
			vec_del(&cm_listeners, k);
			return 0;
		}
	}
	return fail("cm_stop: not listening on port %u", port);
}

static const struct {
	const char *name;
	int (*run)(const struct jv *, struct sb *);
} ops[] = {
	{"hello", op_hello},       {"query_device", op_query_device}, {"alloc_pd", op_alloc_pd},
	{"dealloc_pd", op_dealloc_pd}, {"reg_mr", op_reg_mr},        {"dereg_mr", op_dereg_mr},
	{"write_mr", op_write_mr}, {"read_mr", op_read_mr},           {"create_cq", op_create_cq},
	{"destroy_cq", op_destroy_cq}, {"create_qp", op_create_qp},  {"modify_qp", op_modify_qp},
	{"query_qp", op_query_qp}, {"destroy_qp", op_destroy_qp},     {"post_send", op_post_send},
	{"post_recv", op_post_recv}, {"poll_cq", op_poll_cq},         {"reset", op_reset},
	{"cm_listen", op_cm_listen}, {"cm_connections", op_cm_connections},
	{"cm_disconnect", op_cm_disconnect}, {"cm_stop", op_cm_stop},
};

/* One request line (without its newline) → one response line in out (with its newline). */
static void handle_line(const char *line, size_t len, struct sb *out)
{
	struct parser ps = {.start = line, .p = line, .end = line + len};
	struct jv v;
	struct sb r = {0};
	const char *id0 = "null", *id1 = id0 + 4;
	int rc = -1;
	err[0] = 0;
	if (parse_value(&ps, &v, 0) == 0) {
		ws(&ps);
		if (ps.p != ps.end) {
			jv_free(&v);
			snprintf(err, sizeof(err), "not a JSON object: trailing characters");
			goto done;
		}
	} else {
		jv_free(&v);
		snprintf(err, sizeof(err), "not a JSON object: %s", ps.err);
		goto done;
	}
	if (v.t != J_OBJ) {
		snprintf(err, sizeof(err), "a request is a JSON object");
		goto free;
	}
	const struct jv *id = get(&v, "id");
	if (id) {
		id0 = id->raw0;
		id1 = id->raw1;
	}
	const struct jv *op = get(&v, "op");
	if (!op || op->t != J_STR) {
		snprintf(err, sizeof(err), op ? "field \"op\": expected a string" : "missing field \"op\"");
		goto free;
	}
	size_t k;
	for (k = 0; k < sizeof(ops) / sizeof(ops[0]); k++)
		if (!strcmp(ops[k].name, op->s) && strlen(op->s) == op->len)
			break;
	if (k == sizeof(ops) / sizeof(ops[0])) {
		snprintf(err, sizeof(err), "unknown op \"%.40s\"", op->s);
		goto free;
	}
	errno = 0;
	rc = ops[k].run(&v, &r);
	if (!rc && r.oom) {
		rc = -1;
		snprintf(err, sizeof(err), "out of memory for the response");
	}
free:
	sb_mem(out, "{\"id\":", 6);
	sb_mem(out, id0, (size_t)(id1 - id0));
	jv_free(&v);
	goto tail;
done:
	sb_mem(out, "{\"id\":null", 10);
tail:
	if (rc == 0) {
		sb_mem(out, ",\"ok\":true", 10);
		if (r.n)
			sb_mem(out, r.p, r.n);
	} else {
		sb_mem(out, ",\"ok\":false", 11);
		put_str(out, "error", err[0] ? err : "failed");
	}
	sb_mem(out, "}\n", 2);
	free(r.p);
}

/* ---- the server --------------------------------------------------------------------------- */

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static void serve_client(int fd)
{
	size_t cap = MAX_LINE + 2, n = 0;
	char *buf = malloc(cap);
	if (!buf)
		return;
	for (;;) {
		char *nl = memchr(buf, '\n', n);
		if (!nl) {
			if (n > MAX_LINE) {
				struct sb out = {0};
				sb_printf(&out, "{\"id\":null,\"ok\":false,\"error\":\"request line longer "
						"than %u bytes\"}\n",
					  MAX_LINE);
				if (!out.oom)
					write_all(fd, out.p, out.n);
				free(out.p);
				break;
			}
			/* Wait for the client's next bytes, serving rdma_cm events meanwhile: a
			 * connection request must be accepted while the client thinks. */
			struct pollfd pf[2] = {{.fd = fd, .events = POLLIN},
					       {.fd = cm_ch ? cm_ch->fd : -1, .events = POLLIN}};
			if (poll(pf, 2, -1) < 0) {
				if (errno == EINTR)
					continue;
				break;
			}
			if (pf[1].revents)
				cm_service();
			if (!pf[0].revents)
				continue;
			ssize_t got = recv(fd, buf + n, cap - n, 0);
			if (got < 0 && errno == EINTR)
				continue;
			if (got <= 0)
				break;
			n += (size_t)got;
			continue;
		}
		size_t len = (size_t)(nl - buf);
		/* Blank lines get no answer (as rocemu agent). */
		int blank = 1;
		for (size_t k = 0; k < len; k++)
			if (buf[k] != ' ' && buf[k] != '\t' && buf[k] != '\r')
				blank = 0;
		if (!blank) {
			struct sb out = {0};
			handle_line(buf, len, &out);
			if (out.oom || write_all(fd, out.p, out.n)) {
				free(out.p);
				break;
			}
			free(out.p);
		}
		memmove(buf, nl + 1, n - len - 1);
		n -= len + 1;
	}
	free(buf);
}

static void usage(void)
{
	fprintf(stderr, "usage: ibv_agent [-d DEV] [-p PORT] [-i IB_PORT]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *want = NULL;
	int port = 18600, c;
	while ((c = getopt(argc, argv, "d:p:i:h")) != -1) {
		switch (c) {
		case 'd': want = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 'i': ib_port = (uint8_t)atoi(optarg); break;
		default: usage();
		}
	}
	if (optind != argc || port <= 0 || port > 65535 || !ib_port)
		usage();
	signal(SIGPIPE, SIG_IGN);
	int ndev = 0;
	struct ibv_device **list = ibv_get_device_list(&ndev);
	struct ibv_device *dev = NULL;
	for (int k = 0; list && k < ndev; k++)
		if (!want || !strcmp(ibv_get_device_name(list[k]), want)) {
			dev = list[k];
			break;
		}
	if (!dev) {
		fprintf(stderr, "ibv_agent: no RDMA device %s\n", want ? want : "at all");
		return 1;
	}
	dev_name = strdup(ibv_get_device_name(dev));
	ctx = ibv_open_device(dev);
	if (!ctx || !dev_name) {
		fprintf(stderr, "ibv_agent: cannot open %s: %s\n", ibv_get_device_name(dev), strerror(errno));
		return 1;
	}
	ibv_free_device_list(list);
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_ANY);
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 4)) {
		fprintf(stderr, "ibv_agent: listen on port %d: %s\n", port, strerror(errno));
		return 1;
	}
	fprintf(stderr, "ibv_agent: serving %s port %u on tcp:0.0.0.0:%d\n", dev_name, ib_port, port);
	for (;;) {
		int fd = accept(ls, NULL, NULL);
		if (fd < 0) {
			if (errno != EINTR)
				usleep(100000);
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		serve_client(fd);
		close(fd);
		reset_all();
	}
}
