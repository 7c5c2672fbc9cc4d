/*
 * redis.h - a Redis Cluster client over hiredis.
 *
 * Debian's libhiredis 0.14 speaks RESP to one server and knows nothing of
 * a cluster, so this module does the cluster's part itself: the slot map
 * (CRC16 of the key, or of its {hash tag}, mod 16384), the MOVED and ASK
 * redirects, a refresh of the map from CLUSTER SLOTS when the topology
 * changes (a redirect, a node that stops answering, CLUSTERDOWN), a
 * deadline per call, and retries with backoff inside it. A server started
 * without cluster mode is one node that owns every slot. Generic: keys and
 * values, nothing of kvkeep (store/remote.c builds the cache tier on it).
 *
 * What hiredis does here: the connection (redisConnectNonBlock) and the
 * reply parser (its reader, fed by our own reads, with reply objects of
 * our own so a hostile or broken server can neither make it abort on a
 * huge array nor grow a reply past max_reply). What we do: the commands
 * (written with sendmsg straight from the caller's buffers: a value is
 * never copied on the way out) and every wait (poll with the call's
 * deadline, so a slow node costs at most the call's timeout, whatever
 * it trickles).
 *
 * A call (kv_redis_exec) takes a batch of operations, groups them by the
 * node that owns each key's slot, and pipelines each group on one pooled
 * connection. Per operation:
 *   MOVED s h:p   the slot's owner changed: the map is updated at once
 *                 (and refreshed whole, at most every 100 ms), retried
 *   ASK s h:p     a slot migrating: retried once on h:p after ASKING
 *   TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN, BUSY
 *                 transient: retried after a backoff (1, 2, 4 ... 32 ms)
 *   a lost connection, a node that does not accept one
 *                 the node is skipped for a backoff (50 ms doubling to
 *                 2 s), the map refreshed, retried; when no node can take
 *                 what is left the call ends early (KV_ERR_IO) rather
 *                 than spin to its deadline
 *   another error reply (OOM, NOAUTH, WRONGTYPE ...)
 *                 final: KV_ERR_INVALID, the server's text in kv_errmsg
 * At most 5 redirects per operation per call. What is not done at the
 * deadline ends with KV_ERR_TIMEOUT. Every operation here is idempotent
 * (GET, GETRANGE, STRLEN, SET, EXISTS, TOUCH, DEL), so a retry after a
 * lost reply is safe.
 *
 * Authentication: "AUTH user pass" (Redis ACL) or "AUTH pass" on every
 * new connection; a refusal is logged by the caller, counted, and the
 * node treated as unreachable.
 *
 * Threads: every function may be called from any thread. Connections are
 * pooled per node (up to idle_per_node kept idle); one call holds one
 * connection per node group while it runs. kv_redis_abort makes every
 * call in flight, and every later one, fail at once (shutdown).
 */
#ifndef KV_BASE_REDIS_H
#define KV_BASE_REDIS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KV_REDIS_SLOTS 16384
#define KV_REDIS_MAX_SEEDS 16
#define KV_REDIS_MAX_NODES 64        /* a map naming more is refused */
#define KV_REDIS_TIMEOUT_MS 200      /* default per call */

/* redis://[user:pass@]host:port[,host:port...] */
struct kv_redis_url {
	char user[128];
	char pass[256];
	int n_seeds;
	struct {
		char host[256];
		int port;
	} seed[KV_REDIS_MAX_SEEDS];
};
/* KV_OK, or KV_ERR_INVALID naming what is wrong (scheme, port, too many
 * hosts, a field too long). %XX escapes are decoded in user and pass. */
int kv_redis_url_parse(const char *url, struct kv_redis_url *out);

/* CRC16-CCITT (XModem): poly 0x1021, init 0, as Redis Cluster hashes keys. */
uint16_t kv_redis_crc16(const void *p, size_t n);
/* The key's slot: CRC16 of the whole key, or of the part between the
 * first '{' and the next '}' when that part is not empty. */
uint16_t kv_redis_slot(const char *key, size_t n);

struct kv_redis_params {
	const char *url;           /* required */
	const char *user;          /* overrides the URL's (NULL: the URL's) */
	const char *password;      /* overrides the URL's (NULL: the URL's) */
	int timeout_ms;            /* default per call; 0: KV_REDIS_TIMEOUT_MS */
	size_t max_reply;          /* largest string reply accepted; 0: 1 GiB */
	int idle_per_node;         /* idle connections kept per node; 0: 8 */
};

enum kv_redis_cmd {
	KV_REDIS_GET = 1,
	KV_REDIS_SET,
	KV_REDIS_EXISTS,
	KV_REDIS_TOUCH,
	KV_REDIS_DEL,
	KV_REDIS_PING,
	KV_REDIS_GETRANGE,         /* bytes [start, end] of a value ("" past its end or for a missing key) */
	KV_REDIS_STRLEN,           /* a value's length in n (0: missing) */
};

struct kv_redis_op {
	int cmd;                   /* enum kv_redis_cmd */
	const char *key;           /* borrowed for the call (PING: none) */
	size_t klen;
	const struct iovec *val;   /* SET: the value, in pieces (borrowed) */
	int nval;
	uint64_t start, end;       /* GETRANGE: the bytes asked for (inclusive) */
	void *buf;                 /* GET / GETRANGE: when set, the value lands here (a reply
				      longer than cap is KV_ERR_FULL) and data == buf: nothing
				      to free, no allocation and no copy per reply */
	size_t cap;
	/* results */
	int rc;                    /* KV_OK; KV_ERR_NOT_FOUND: GET of a missing key, or
				      EXISTS / TOUCH / DEL that counted 0; KV_ERR_TIMEOUT;
				      KV_ERR_IO: no node could take it; KV_ERR_FULL: the
				      reply was over max_reply; KV_ERR_INVALID: the
				      server refused it; KV_ERR_CANCELLED: aborted */
	void *data;                /* GET / GETRANGE: the value, malloc'd (the caller frees it) unless buf */
	size_t len;
	long long n;               /* EXISTS / TOUCH / DEL: the count; STRLEN: the length */
};

struct kv_redis;

/* Parse the URL and get ready; connects lazily (no error when no node
 * answers yet). KV_ERR_INVALID for a bad URL, KV_ERR_NOMEM. */
int kv_redis_create(const struct kv_redis_params *p, struct kv_redis **out);
void kv_redis_destroy(struct kv_redis *r);

/*
 * Run ops (see the top), within timeout_ms (0: the default). Every op gets
 * its rc; returns how many ended in a transport failure (KV_ERR_TIMEOUT,
 * KV_ERR_IO, KV_ERR_CANCELLED), so 0 means the cluster answered them all.
 * The message of the last failure is in kv_errmsg() and kv_redis_last_error.
 */
size_t kv_redis_exec(struct kv_redis *r, struct kv_redis_op *ops, size_t n, int timeout_ms);

/* Refresh the slot map now and PING every master. KV_OK when every slot
 * has a master that answers; else KV_ERR_IO (or KV_ERR_TIMEOUT) with the
 * reason in kv_errmsg(). */
int kv_redis_probe(struct kv_redis *r, int timeout_ms);

/* Every call in flight and every later one fails at once (KV_ERR_CANCELLED). */
void kv_redis_abort(struct kv_redis *r);

struct kv_redis_stats {
	uint64_t calls, ops;
	uint64_t timeouts, io_errors;  /* ops that ended so */
	uint64_t error_replies;        /* final error replies (OOM, NOAUTH ...) */
	uint64_t moved, ask, tryagain; /* redirects and transient replies seen */
	uint64_t refreshes;            /* slot maps read */
	uint64_t connects, connect_failures, auth_failures;
	uint64_t bytes_out, bytes_in;
	uint32_t nodes;                /* nodes known */
	uint32_t masters;              /* nodes owning slots in the map */
	uint32_t slots_covered;        /* slots with an owner in the map */
	int standalone;                /* 1: the server is not in cluster mode */
};
void kv_redis_stats(struct kv_redis *r, struct kv_redis_stats *out);
/* The text of the last failure any call saw ("" if none). */
void kv_redis_last_error(struct kv_redis *r, char *out, size_t cap);

#endif
