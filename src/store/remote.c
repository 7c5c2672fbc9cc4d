/*
 * remote.c - see remote.h.
 *
 * The tier's state is `up` plus the probe schedule; `mu` guards them, the
 * counters and the latency ring. No Redis call runs under it. A transport
 * failure anywhere (a lookup, a write) takes the tier down; only the probe
 * (kv_redis_probe: the slot map read again, every master PINGed) brings it
 * back, so a request never waits on a cluster that just failed it.
 */
#include "store/remote.h"
#include "base/clock.h"
#include "base/corrupt.h"
#include "base/err.h"
#include "base/log.h"
#include "base/redis.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROBE_MIN_NS (100ull * 1000000)
#define PROBE_MAX_NS (5000ull * 1000000)
#define LAT_RING 1024
#define MIN_BPS 100e6 /* the slowest transfer rate a call's deadline allows for its bytes */
/* The writers' calls get this many times the timeout: no request waits on
 * them, and on a machine whose cores were all busy (2 cores, load 20, Redis
 * beside the servers) a 2 MiB SET missed 220 ms, which took the tier down
 * and dropped the queued views: the next server missed. Shutdown does not
 * wait on them either: ks_remote_abort cuts a call in flight. */
#define WRITE_MULT 5
/*
 * Big values are read in ranges (GETRANGE), RANGE_CHUNK bytes each, at
 * most RANGE_WINDOW of them pipelined per call. Why: Redis copies a GET's
 * whole value into one reply buffer, and its allocator (jemalloc) hands a
 * buffer of 8 MiB or more out of fresh pages and returns them at once, so
 * every GET of a block paid a page fault per 4 KiB plus the clearing of
 * the page on the server's only thread: perf showed page faults and page
 * clearing above 40% of the Redis processes' time during a restore, and
 * chunked reads cut their CPU time per restore about 3x (docs/cluster.md
 * "Restore"). 1 MiB replies come from reused memory; a window of 10 keeps
 * the server's reply memory per connection near 10 MiB while covering a
 * whole 8 MiB block in one round trip.
 */
#define RANGE_MIN (4u << 20)   /* objects expected at least this big are read in ranges */
#define RANGE_CHUNK (1u << 20)
#define RANGE_WINDOW 10
#define RANGE_WINDOW_MAX 32

struct ks_remote {
	struct ks_remote_params p;
	char url_safe[1024];
	char prefix[128];
	struct ke_layout L;
	struct kv_redis *rc;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_int up;
	atomic_int aborted;
	uint64_t next_probe, backoff;
	int stop;
	pthread_t th;
	int th_running;
	struct ks_remote_stats st;
	uint64_t lat[LAT_RING];
	uint32_t lat_n, lat_i;
	char last_err[256];
	size_t max_value;         /* the largest value a GET accepts */
};

static int transport(int rc)
{
	return rc == KV_ERR_TIMEOUT || rc == KV_ERR_IO || rc == KV_ERR_CANCELLED;
}

const char *ks_rdrop_name(int why)
{
	static const char *const n[KS_RDROP__COUNT] = {"down", "queue", "shutdown", "error"};
	return why >= 0 && why < KS_RDROP__COUNT ? n[why] : "?";
}

/* The URL with the password masked. */
static void mask_url(const char *url, char *out, size_t cap)
{
	const char *p = strstr(url, "://"), *at;
	if (!p) {
		snprintf(out, cap, "%s", url);
		return;
	}
	p += 3;
	at = strrchr(p, '@');
	if (!at) {
		snprintf(out, cap, "%s", url);
		return;
	}
	const char *colon = memchr(p, ':', (size_t)(at - p));
	if (colon)
		snprintf(out, cap, "%.*s:***%s", (int)(colon - url), url, at);
	else
		snprintf(out, cap, "%.*s***%s", (int)(p - url), url, at);
}

/* Caller holds mu. */
static void go_down_locked(struct ks_remote *r, const char *why)
{
	if (!atomic_load(&r->up))
		return;
	atomic_store(&r->up, 0);
	r->st.downs++;
	r->backoff = PROBE_MIN_NS;
	r->next_probe = kv_now_ns() + r->backoff;
	snprintf(r->last_err, sizeof r->last_err, "%s", why);
	pthread_cond_broadcast(&r->cv);
	KV_WARN("remote.down", "url=%s err=\"%s\" msg=\"remote cache tier unreachable: serving from the local tiers, "
			       "probing in the background (logged once until it is back)\"",
		r->url_safe, why);
}

/* A call failed: a transport failure takes the tier down. */
static void note_failure(struct ks_remote *r, int rc)
{
	if (!transport(rc) || atomic_load(&r->aborted))
		return;
	char why[256];
	snprintf(why, sizeof why, "%s", kv_errmsg());
	pthread_mutex_lock(&r->mu);
	go_down_locked(r, why);
	pthread_mutex_unlock(&r->mu);
}

static void note_call(struct ks_remote *r, uint64_t t0)
{
	pthread_mutex_lock(&r->mu);
	r->st.call_seconds += (double)(kv_now_ns() - t0) / 1e9;
	pthread_mutex_unlock(&r->mu);
}

/* One probe; marks the tier up on success. Returns ks_remote_up. */
static int probe(struct ks_remote *r)
{
	int rc = kv_redis_probe(r->rc, r->p.timeout_ms);
	char why[256];
	snprintf(why, sizeof why, "%s", kv_errmsg());
	pthread_mutex_lock(&r->mu);
	uint64_t now = kv_now_ns();
	if (rc == KV_OK) {
		if (!atomic_load(&r->up)) {
			atomic_store(&r->up, 1);
			r->st.ups++;
			struct kv_redis_stats cs;
			kv_redis_stats(r->rc, &cs);
			KV_INFO("remote.up", "url=%s masters=%u nodes=%u standalone=%d msg=\"remote cache tier reachable\"",
				r->url_safe, cs.masters, cs.nodes, cs.standalone);
		}
		r->backoff = PROBE_MIN_NS;
	} else {
		snprintf(r->last_err, sizeof r->last_err, "%s", why);
		r->backoff = r->backoff ? r->backoff * 2 : PROBE_MIN_NS;
		if (r->backoff > PROBE_MAX_NS)
			r->backoff = PROBE_MAX_NS;
		r->next_probe = now + r->backoff;
	}
	int up = atomic_load(&r->up);
	pthread_mutex_unlock(&r->mu);
	return up;
}

static void *probe_main(void *arg)
{
	struct ks_remote *r = arg;
	pthread_mutex_lock(&r->mu);
	while (!r->stop) {
		uint64_t now = kv_now_ns();
		if (!atomic_load(&r->up) && now >= r->next_probe && !atomic_load(&r->aborted)) {
			pthread_mutex_unlock(&r->mu);
			probe(r);
			pthread_mutex_lock(&r->mu);
			continue;
		}
		uint64_t wait = atomic_load(&r->up) ? 1000000000ull : (r->next_probe > now ? r->next_probe - now : 0);
		if (wait > 1000000000ull)
			wait = 1000000000ull;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec + wait;
		ts.tv_sec += (time_t)(ns / 1000000000ull);
		ts.tv_nsec = (long)(ns % 1000000000ull);
		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

int ks_remote_create(const struct ks_remote_params *p, struct ks_remote **out)
{
	int rc;
	*out = NULL;
	if (!p || !p->url || !p->layout)
		return kv_fail(KV_ERR_INVALID, "remote cache: no URL or layout");
	const char *prefix = p->prefix ? p->prefix : KS_REMOTE_PREFIX_DEFAULT;
	if (strlen(prefix) > 100)
		return kv_fail(KV_ERR_INVALID, "--remote-cache-prefix is longer than 100 bytes");
	for (const char *c = prefix; *c; c++)
		if ((unsigned char)*c <= ' ' || *c == '{' || *c == '}' || (unsigned char)*c >= 0x7f)
			return kv_fail(KV_ERR_INVALID, "--remote-cache-prefix: '%c' is not allowed (no spaces, control bytes "
						       "or braces: a {hash tag} would put every key on one node)",
				       *c > ' ' && *c < 0x7f ? *c : '?');
	struct ks_remote *r = calloc(1, sizeof *r);
	if (!r)
		return kv_fail(KV_ERR_NOMEM, "remote cache: out of memory");
	r->p = *p;
	r->L = *p->layout;
	r->p.layout = &r->L;
	snprintf(r->prefix, sizeof r->prefix, "%s", prefix);
	r->p.prefix = r->prefix;
	r->p.url = NULL;
	r->p.user = r->p.password = NULL;
	if (r->p.timeout_ms <= 0)
		r->p.timeout_ms = KV_REDIS_TIMEOUT_MS;
	if (!r->p.queue_bytes)
		r->p.queue_bytes = KS_REMOTE_QUEUE_DEFAULT;
	if (!r->p.range_min)
		r->p.range_min = RANGE_MIN;
	if (!r->p.range_chunk)
		r->p.range_chunk = RANGE_CHUNK;
	if (r->p.range_window <= 0)
		r->p.range_window = RANGE_WINDOW;
	if (r->p.range_window > RANGE_WINDOW_MAX)
		r->p.range_window = RANGE_WINDOW_MAX;
	mask_url(p->url, r->url_safe, sizeof r->url_safe);
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	/* the largest value: an entry manifest of the longest entry, or a
	 * block or snapshot, plus the header */
	size_t maxv = (size_t)KS_ENTRY_MAX_TOKENS * 4 + KS_MAX_CKPT * 4;
	size_t big = r->L.page_bytes > r->L.snapshot_bytes ? r->L.page_bytes : r->L.snapshot_bytes;
	big += (size_t)r->L.page_tokens * 4;
	if (big > maxv)
		maxv = big;
	r->max_value = maxv + 8 + KS_HEADER_MAX;
	struct kv_redis_params rp = {.url = p->url,
				     .user = p->user,
				     .password = p->password,
				     .timeout_ms = r->p.timeout_ms,
				     .max_reply = maxv + 8 + KS_HEADER_MAX};
	if ((rc = kv_redis_create(&rp, &r->rc))) {
		pthread_cond_destroy(&r->cv);
		pthread_mutex_destroy(&r->mu);
		free(r);
		return rc;
	}
	if (!probe(r)) {
		char why[256];
		snprintf(why, sizeof why, "%s", r->last_err);
		KV_WARN("remote.down", "url=%s err=\"%s\" msg=\"remote cache tier unreachable at start: serving from the "
				       "local tiers, probing in the background\"",
			r->url_safe, why);
	}
	if (!p->no_thread) {
		r->th_running = pthread_create(&r->th, NULL, probe_main, r) == 0;
		if (!r->th_running)
			KV_WARN("remote.probe", "msg=\"cannot start the probe thread: a remote tier that goes down stays down\"");
	}
	KV_INFO("remote.open", "url=%s prefix=%s timeout_ms=%d to_disk=%d queue_mb=%llu up=%d", r->url_safe, r->prefix,
		r->p.timeout_ms, r->p.to_disk, (unsigned long long)(r->p.queue_bytes >> 20), atomic_load(&r->up));
	*out = r;
	return KV_OK;
}

void ks_remote_destroy(struct ks_remote *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = 1;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	if (r->th_running)
		pthread_join(r->th, NULL);
	kv_redis_destroy(r->rc);
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

void ks_remote_abort(struct ks_remote *r)
{
	if (!r)
		return;
	atomic_store(&r->aborted, 1);
	kv_redis_abort(r->rc);
	pthread_mutex_lock(&r->mu);
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

int ks_remote_up(struct ks_remote *r)
{
	return r && atomic_load(&r->up) && !atomic_load(&r->aborted);
}

int ks_remote_probe_now(struct ks_remote *r)
{
	return probe(r);
}

int ks_remote_to_disk(const struct ks_remote *r)
{
	return r->p.to_disk;
}

uint64_t ks_remote_queue_cap(const struct ks_remote *r)
{
	return r->p.queue_bytes;
}

int ks_remote_timeout_ms(const struct ks_remote *r)
{
	return r->p.timeout_ms;
}

size_t ks_remote_key(const struct ks_remote *r, struct kv_h128 ns, int kind, struct kv_h128 id, char *out, size_t cap)
{
	char nsx[33], name[64];
	kv_h128_hex(ns, nsx);
	ks_obj_name(kind, id, name);
	int n = snprintf(out, cap, "%s%s:%s", r->prefix, nsx, name);
	return n > 0 && (size_t)n < cap ? (size_t)n : 0; /* cap >= 160 always fits: prefix <= 100 */
}

/* Delete a value that failed validation: the writer that has the right
 * bytes may put them back (it skips keys that exist). Best effort. */
static void delete_bad(struct ks_remote *r, const char *key, size_t klen)
{
	struct kv_redis_op op = {.cmd = KV_REDIS_DEL, .key = key, .klen = klen};
	uint64_t t0 = kv_now_ns();
	kv_redis_exec(r->rc, &op, 1, r->p.timeout_ms);
	note_call(r, t0);
	if (op.rc == KV_OK) {
		pthread_mutex_lock(&r->mu);
		r->st.deleted++;
		pthread_mutex_unlock(&r->mu);
	}
}

/*
 * Read a big value in ranges (range_chunk at a time, range_window per
 * call) into one buffer, with the semantics of one GET op: rc KV_OK and
 * op->data (malloc'd) / op->len; KV_ERR_NOT_FOUND for a missing key, or
 * one that shrank or vanished between two calls (evicted mid-read: a miss,
 * nothing wrong with it); KV_ERR_FULL for a value over max_value; an error
 * reply (KV_ERR_INVALID) or a transport error of any call. The first call
 * asks STRLEN with the first window, sized by `expect`, so an object of
 * the expected size costs one round trip per window. Whatever the ranges
 * assemble is validated whole by the caller, so a value rewritten between
 * two calls (with identical bytes: the keys are content-addressed) or
 * torn in any other way fails its checksum, never passes.
 */
static void get_ranged(struct ks_remote *r, const char *key, size_t kl, size_t expect, int timeout_ms,
		       struct kv_redis_op *out)
{
	struct kv_redis_op ops[RANGE_WINDOW_MAX + 1];
	size_t chunk = r->p.range_chunk;
	int window = r->p.range_window;
	uint64_t deadline = kv_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	size_t cap = expect < r->max_value ? expect : r->max_value, len = 0, off = 0;
	char *buf = malloc(cap);
	int first = 1;
	out->data = NULL;
	out->len = 0;
	if (!buf) {
		out->rc = kv_fail(KV_ERR_IO, "remote cache: out of memory for a value of %zu bytes", cap);
		return;
	}
	for (;;) {
		int n = 0;
		size_t lim = first ? cap : len;
		if (first)
			ops[n++] = (struct kv_redis_op){.cmd = KV_REDIS_STRLEN, .key = key, .klen = kl};
		for (; n < window + first && off < lim; off += chunk) {
			size_t c = lim - off < chunk ? lim - off : chunk;
			ops[n++] = (struct kv_redis_op){.cmd = KV_REDIS_GETRANGE, .key = key, .klen = kl, .start = off,
							.end = off + c - 1, .buf = buf + off, .cap = c};
		}
		uint64_t now = kv_now_ns();
		if (now >= deadline) {
			out->rc = kv_fail(KV_ERR_TIMEOUT, "remote cache: no answer within %d ms", timeout_ms);
			break;
		}
		kv_redis_exec(r->rc, ops, (size_t)n, (int)((deadline - now + 999999) / 1000000));
		int rc = KV_OK;
		for (int i = 0; i < n && !rc; i++)
			if (ops[i].rc && !(ops[i].cmd == KV_REDIS_STRLEN && ops[i].rc == KV_ERR_NOT_FOUND))
				rc = ops[i].rc;
		if (rc) {
			out->rc = rc;
			break;
		}
		if (first) {
			first = 0;
			if (ops[0].n <= 0) {
				out->rc = KV_ERR_NOT_FOUND;
				break;
			}
			len = (size_t)ops[0].n;
			if (len > r->max_value) {
				out->rc = kv_fail(KV_ERR_FULL, "remote cache: a value of %zu bytes is over %zu", len, r->max_value);
				break;
			}
			if (len > cap) {
				char *nb = realloc(buf, len);
				if (!nb) {
					out->rc = kv_fail(KV_ERR_IO, "remote cache: out of memory for a value of %zu bytes", len);
					break;
				}
				buf = nb;
				cap = len;
			}
		}
		/* every range must be whole up to the length STRLEN gave: a short
		 * one means the value shrank or went away in between */
		int shrank = 0;
		for (int i = 0; i < n; i++) {
			if (ops[i].cmd != KV_REDIS_GETRANGE)
				continue;
			size_t o = (size_t)ops[i].start, want = o >= len ? 0 : len - o < ops[i].cap ? len - o : ops[i].cap;
			if (ops[i].len != want)
				shrank = 1;
		}
		if (shrank) {
			out->rc = KV_ERR_NOT_FOUND;
			break;
		}
		if (off >= len) {
			out->rc = KV_OK;
			out->data = buf;
			out->len = len;
			return;
		}
	}
	free(buf);
}

int ks_remote_load(struct ks_remote *r, const struct ke_layout *L, struct kv_h128 ns, int kind, struct kv_h128 id,
		   struct kv_h128 parent, uint32_t pos, const struct ks_obj_dst *dst, struct ks_obj_info *info,
		   uint64_t *bytes)
{
	char key[200];
	size_t kl;
	int rc, bad = KS_BAD_NONE;
	if (!ks_remote_up(r))
		return kv_fail(KV_ERR_IO, "remote cache tier is down");
	if (!(kl = ks_remote_key(r, ns, kind, id, key, sizeof key)))
		return kv_fail(KV_ERR_INVALID, "remote key too long");
	/* the call may take the timeout plus its bytes at MIN_BPS: a 50 MiB
	 * snapshot is not cut by a deadline sized for a lookup, while a node
	 * that does not answer still fails about a timeout after the EXISTS
	 * batch that comes first */
	uint64_t expect = kind == KS_SNAP ? L->snapshot_bytes : kind == KS_ENTRY ? (1u << 20) : L->page_bytes;
	struct kv_redis_op op = {.cmd = KV_REDIS_GET, .key = key, .klen = kl};
	uint64_t t0 = kv_now_ns();
	int tmo = r->p.timeout_ms + (int)((double)expect / MIN_BPS * 1e3);
	if (kind != KS_ENTRY && expect >= r->p.range_min)
		get_ranged(r, key, kl, (size_t)expect + (size_t)L->page_tokens * 4 + KS_HEADER_MAX, tmo, &op);
	else
		kv_redis_exec(r->rc, &op, 1, tmo);
	note_call(r, t0);
	rc = op.rc;
	if (rc == KV_ERR_NOT_FOUND)
		return rc;
	if (transport(rc)) {
		note_failure(r, rc);
		return rc;
	}
	if (rc == KV_ERR_FULL) {
		bad = KS_BAD_SIZE;
		rc = KV_CORRUPT(key, 0, "value is larger than any object of this layout");
	} else if (rc) {
		bad = KS_BAD_HEADER; /* an error reply: the key holds no string */
		rc = KV_CORRUPT(key, 0, "the key holds no object: %s", kv_errmsg());
	} else {
		struct ks_obj *o = NULL;
		rc = ks_obj_open_mem(op.data, op.len, key, L, kind, &ns, &o, &bad);
		if (rc == KV_OK) {
			const struct ks_obj_info *in = ks_obj_info(o);
			if (!kv_h128_eq(in->id, id) || !kv_h128_eq(in->parent, parent) || in->pos != pos) {
				bad = KS_BAD_HEADER;
				rc = KV_CORRUPT(key, 0, "value names another object (id, parent or position differ)");
			} else if ((rc = ks_obj_read(o, dst, &bad)) == KV_OK) {
				if (info)
					*info = *in;
				if (bytes)
					*bytes += op.len;
			}
		}
		ks_obj_close(o);
	}
	free(op.data);
	pthread_mutex_lock(&r->mu);
	if (rc == KV_OK) {
		r->st.read_objects++;
		r->st.read_bytes += op.len;
	} else if (bad > 0 && bad < KS_BAD__COUNT) {
		r->st.bad[bad]++;
	}
	pthread_mutex_unlock(&r->mu);
	/* another format version is not ours to judge (a newer kvkeep may
	 * share the cluster): a miss, left alone */
	if (rc != KV_OK && bad != KS_BAD_NONE && bad != KS_BAD_IO && bad != KS_BAD_VERSION) {
		char msg[256];
		snprintf(msg, sizeof msg, "%s", kv_errmsg());
		delete_bad(r, key, kl);
		kv_fail(rc, "%s", msg);
	}
	return rc;
}

int ks_remote_have(struct ks_remote *r, struct kv_h128 ns, const int *kinds, const struct kv_h128 *ids, size_t n,
		   int for_write, uint8_t *have)
{
	memset(have, 0, n);
	if (!ks_remote_up(r))
		return kv_fail(KV_ERR_IO, "remote cache tier is down");
	if (!n)
		return KV_OK;
	struct kv_redis_op *ops = calloc(n, sizeof *ops);
	char *keys = malloc(n * 200);
	int rc = KV_OK;
	if (!ops || !keys) {
		free(ops);
		free(keys);
		return kv_fail(KV_ERR_NOMEM, "remote cache: out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		char *k = keys + i * 200;
		ops[i] = (struct kv_redis_op){.cmd = KV_REDIS_EXISTS, .key = k, .klen = ks_remote_key(r, ns, kinds[i], ids[i], k, 200)};
	}
	uint64_t t0 = kv_now_ns();
	size_t failed = kv_redis_exec(r->rc, ops, n, r->p.timeout_ms * (for_write ? WRITE_MULT : 1));
	note_call(r, t0);
	for (size_t i = 0; i < n; i++) {
		have[i] = ops[i].rc == KV_OK;
		if (transport(ops[i].rc) && !rc)
			rc = ops[i].rc;
	}
	if (failed) {
		memset(have, 0, n);
		note_failure(r, rc);
	}
	free(ops);
	free(keys);
	return failed ? rc : KV_OK;
}

int ks_remote_put(struct ks_remote *r, const struct ke_layout *L, const struct ks_obj_src *src, int *sent)
{
	struct iovec iov[KS_OBJ_MAX_IOV];
	void *owned = NULL;
	uint64_t total = 0;
	char key[200];
	size_t kl;
	int n, rc;
	*sent = 0;
	if (!ks_remote_up(r))
		return kv_fail(KV_ERR_IO, "remote cache tier is down");
	if (!(kl = ks_remote_key(r, src->ns, src->kind, src->id, key, sizeof key)))
		return kv_fail(KV_ERR_INVALID, "remote key too long");
	if ((n = ks_obj_iov(L, src, iov, &owned, &total)) < 0)
		return n;
	uint64_t t0 = kv_now_ns();
	if (total >= KS_REMOTE_BIG) {
		struct kv_redis_op t = {.cmd = KV_REDIS_TOUCH, .key = key, .klen = kl};
		kv_redis_exec(r->rc, &t, 1, r->p.timeout_ms * WRITE_MULT);
		if (t.rc == KV_OK) {
			note_call(r, t0);
			free(owned);
			pthread_mutex_lock(&r->mu);
			r->st.present_objects++;
			pthread_mutex_unlock(&r->mu);
			return KV_OK;
		}
		if (t.rc != KV_ERR_NOT_FOUND) {
			note_call(r, t0);
			free(owned);
			note_failure(r, t.rc);
			return t.rc;
		}
	}
	struct kv_redis_op op = {.cmd = KV_REDIS_SET, .key = key, .klen = kl, .val = iov, .nval = n};
	kv_redis_exec(r->rc, &op, 1, r->p.timeout_ms * WRITE_MULT + (int)((double)total / MIN_BPS * 1e3));
	note_call(r, t0);
	free(owned);
	rc = op.rc;
	if (rc) {
		note_failure(r, rc);
		return rc;
	}
	*sent = 1;
	pthread_mutex_lock(&r->mu);
	r->st.written_objects++;
	r->st.written_bytes += total;
	pthread_mutex_unlock(&r->mu);
	return KV_OK;
}

void ks_remote_note_fetch(struct ks_remote *r, uint32_t pos, uint64_t bytes, uint32_t files, double seconds)
{
	(void)bytes;
	(void)files;
	pthread_mutex_lock(&r->mu);
	r->st.lookups++;
	if (pos) {
		r->st.hits++;
		r->st.hit_tokens += pos;
	} else {
		r->st.misses++;
	}
	r->st.fetch_seconds += seconds;
	r->lat[r->lat_i] = (uint64_t)(seconds * 1e9);
	r->lat_i = (r->lat_i + 1) % LAT_RING;
	if (r->lat_n < LAT_RING)
		r->lat_n++;
	pthread_mutex_unlock(&r->mu);
}

void ks_remote_note_skip(struct ks_remote *r)
{
	pthread_mutex_lock(&r->mu);
	r->st.skipped++;
	pthread_mutex_unlock(&r->mu);
}

void ks_remote_note_drop(struct ks_remote *r, int why, uint64_t objects)
{
	if (why < 0 || why >= KS_RDROP__COUNT || !objects)
		return;
	pthread_mutex_lock(&r->mu);
	r->st.dropped[why] += objects;
	pthread_mutex_unlock(&r->mu);
}

void ks_remote_note_incomplete(struct ks_remote *r)
{
	pthread_mutex_lock(&r->mu);
	r->st.incomplete++;
	pthread_mutex_unlock(&r->mu);
}

void ks_remote_note_queue(struct ks_remote *r, int64_t d_len, int64_t d_bytes)
{
	pthread_mutex_lock(&r->mu);
	r->st.queue_len = (uint64_t)((int64_t)r->st.queue_len + d_len);
	r->st.queue_bytes = (uint64_t)((int64_t)r->st.queue_bytes + d_bytes);
	pthread_mutex_unlock(&r->mu);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

void ks_remote_stats(struct ks_remote *r, struct ks_remote_stats *out)
{
	uint64_t tmp[LAT_RING];
	uint32_t n;
	struct kv_redis_stats cs;
	kv_redis_stats(r->rc, &cs);
	pthread_mutex_lock(&r->mu);
	*out = r->st;
	n = r->lat_n;
	memcpy(tmp, r->lat, n * sizeof *tmp);
	pthread_mutex_unlock(&r->mu);
	out->up = ks_remote_up(r);
	if (n) {
		qsort(tmp, n, sizeof *tmp, cmp_u64);
		out->fetch_p50_ms = (double)tmp[(n - 1) / 2] / 1e6;
		out->fetch_p99_ms = (double)tmp[(uint32_t)((uint64_t)(n - 1) * 99 / 100)] / 1e6;
	}
	out->calls = cs.calls;
	out->timeouts = cs.timeouts;
	out->io_errors = cs.io_errors;
	out->error_replies = cs.error_replies;
	out->moved = cs.moved;
	out->ask = cs.ask;
	out->tryagain = cs.tryagain;
	out->refreshes = cs.refreshes;
	out->connects = cs.connects;
	out->nodes = cs.nodes;
	out->masters = cs.masters;
	out->slots_covered = cs.slots_covered;
	out->standalone = cs.standalone;
}

const char *ks_remote_url_safe(const struct ks_remote *r)
{
	return r->url_safe;
}

const char *ks_remote_prefix(const struct ks_remote *r)
{
	return r->prefix;
}

void ks_remote_last_error(struct ks_remote *r, char *out, size_t cap)
{
	pthread_mutex_lock(&r->mu);
	snprintf(out, cap, "%s", r->last_err);
	pthread_mutex_unlock(&r->mu);
}
