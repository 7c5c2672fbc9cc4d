/*
 * dashboard.c - see dashboard.h.
 *
 * The page is embedded with the assembler's .incbin (the build runs from
 * the repository root; the Makefile makes this object depend on the HTML
 * file), so the binary serves exactly the file in the tree.
 */
#include "server/dashboard.h"
#include "server/server_int.h"
#include "server/recent.h"
#include "server/browser.h"
#include "base/buf.h"
#include "server/inflight.h"
#include "session/registry.h"
#include "session/sched.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/hash.h"
#include "base/mem.h"
#include "store/remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

__asm__(".section .rodata\n"
	".global ksv_dash_html\n"
	".type ksv_dash_html, @object\n"
	".balign 16\n"
	"ksv_dash_html:\n"
	".incbin \"src/server/dashboard.html\"\n"
	".global ksv_dash_html_end\n"
	"ksv_dash_html_end:\n"
	".byte 0\n"
	".previous\n");
extern const char ksv_dash_html[], ksv_dash_html_end[];

const char *ksv_dashboard_page(size_t *len)
{
	*len = (size_t)(ksv_dash_html_end - ksv_dash_html);
	return ksv_dash_html;
}

/*
 * The page with a fresh nonce on its <script> tags, and the
 * Content-Security-Policy that runs only those (server/browser.h): text
 * that reached the page from a prompt can never run as script.
 */
void ksv_dashboard_handle_page(struct ksv_server *s, struct ksv_conn *c)
{
	size_t n;
	const char *p = ksv_dashboard_page(&n);
	unsigned char raw[16];
	char nonce[33], csp[400], tag[64];
	if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
		ksv_reply_error(s, c, 500, NULL, "no random bytes for the page's nonce");
		return;
	}
	for (size_t i = 0; i < sizeof raw; i++)
		snprintf(nonce + 2 * i, 3, "%02x", raw[i]);
	snprintf(tag, sizeof tag, "<script nonce=\"%s\">", nonce);
	struct kv_buf b = KV_BUF_INIT;
	for (const char *q = p, *end = p + n; q < end;) {
		const char *t = memmem(q, (size_t)(end - q), "<script>", 8);
		if (!t) {
			kv_buf_add(&b, q, (size_t)(end - q));
			break;
		}
		kv_buf_add(&b, q, (size_t)(t - q));
		kv_buf_adds(&b, tag);
		q = t + 8;
	}
	if (b.oom) {
		kv_buf_free(&b);
		ksv_reply_error(s, c, 500, NULL, "out of memory");
		return;
	}
	ksv_browser_csp(nonce, csp, sizeof csp);
	ksv_conn_header(c, "Content-Security-Policy", csp);
	ksv_conn_header(c, "Cache-Control", "no-store");
	ksv_conn_reply(c, 200, "text/html; charset=utf-8", b.p, b.len);
	kv_buf_free(&b);
}

/* MemTotal and MemAvailable of /proc/meminfo, bytes (0 when unknown). */
static void meminfo(uint64_t *total, uint64_t *avail)
{
	*total = *avail = 0;
	FILE *f = fopen("/proc/meminfo", "r");
	if (!f)
		return;
	char line[128];
	unsigned long long kb;
	while (fgets(line, sizeof line, f)) {
		if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
			*total = kb * 1024;
		else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			*avail = kb * 1024;
	}
	fclose(f);
}

#define MAX_LIST 256

struct totals {
	uint64_t ram, disk, disk_cap, evictions, disk_writes, dirty;
	double write_bps;
	int have_disk;
};

/* One namespace's row and entries into the JSON; adds to the totals. */
static void add_ns(const char *name, const struct kss_tier *t, json_t *nss, json_t *ents,
		   struct totals *tot, struct kc_entry_info *ebuf, struct ks_entry_info *dbuf)
{
	struct kc_stats cs;
	kc_cache_stats(t->cache, &cs);
	tot->ram += cs.bytes_in_use;
	tot->evictions += cs.evictions;
	tot->dirty += kc_cache_dirty_count(t->cache);
	json_t *row = json_pack("{s:s, s:I, s:I, s:I}", "name", name, "entries", (json_int_t)cs.entries, "ram_bytes",
				(json_int_t)cs.bytes_in_use, "budget_bytes", (json_int_t)cs.cap_bytes);
	size_t n = kc_cache_list(t->cache, ebuf, MAX_LIST);
	for (size_t i = 0; i < n && i < MAX_LIST; i++) {
		json_t *ck = json_array();
		for (uint32_t k = 0; k < ebuf[i].n_ckpt; k++)
			json_array_append_new(ck, json_integer(ebuf[i].ckpt[k]));
		json_array_append_new(ents, json_pack("{s:s, s:I, s:I, s:I, s:o, s:I, s:s, s:I}", "ns", name, "id",
						      (json_int_t)ebuf[i].id, "tokens", (json_int_t)ebuf[i].tokens,
						      "anchor", (json_int_t)ebuf[i].anchor, "checkpoints", ck,
						      "last_use_ms", (json_int_t)ebuf[i].last_use_ms, "where",
						      t->store && !ebuf[i].dirty ? "ram+disk" : "ram", "bytes",
						      (json_int_t)ebuf[i].bytes));
	}
	if (t->store) {
		struct ks_stats ds;
		ks_store_stats(t->store, &ds);
		uint64_t db = ds.bytes[0] + ds.bytes[1];
		tot->disk += db;
		tot->disk_cap = ds.cap_bytes > tot->disk_cap ? ds.cap_bytes : tot->disk_cap;
		tot->have_disk = 1;
		for (int k = 0; k < KS_KIND__END; k++)
			tot->disk_writes += ds.written[k];
		if (ds.write_bps > tot->write_bps)
			tot->write_bps = ds.write_bps;
		json_object_set_new(row, "disk_bytes", json_integer((json_int_t)db));
		/* entries only on disk: not (or no longer) in RAM */
		size_t m = ks_store_list_entries(t->store, dbuf, MAX_LIST), disk_only = 0;
		for (size_t i = 0; i < m && i < MAX_LIST; i++) {
			int in_ram = 0;
			for (size_t j = 0; j < n && j < MAX_LIST && !in_ram; j++)
				in_ram = ebuf[j].tokens == dbuf[i].tokens && !ebuf[j].dirty;
			if (in_ram)
				continue;
			disk_only++;
			json_array_append_new(ents, json_pack("{s:s, s:n, s:I, s:I, s:[], s:I, s:s, s:I}", "ns", name, "id",
							      "tokens", (json_int_t)dbuf[i].tokens, "anchor",
							      (json_int_t)dbuf[i].anchor, "checkpoints", "last_use_ms",
							      (json_int_t)dbuf[i].last_use_ms, "where", "disk", "bytes",
							      (json_int_t)dbuf[i].bytes));
		}
		/* "entries" counts the RAM tier's; these are the other rows the
		 * entries list shows for the namespace */
		json_object_set_new(row, "disk_only_entries", json_integer((json_int_t)disk_only));
	} else {
		json_object_set_new(row, "disk_bytes", json_null());
		json_object_set_new(row, "disk_only_entries", json_integer(0));
	}
	json_array_append_new(nss, row);
}

struct each_ctx {
	json_t *nss, *ents;
	struct totals *tot;
	struct kc_entry_info *ebuf;
	struct ks_entry_info *dbuf;
};

/* kss_registry_each: one namespace (the registry is locked). A salted
 * namespace is named by a short hash of its namespace id: the salt is a
 * secret of its clients and never shown. */
static void each_ns(void *ctx, const struct kss_tier *t, struct kv_h128 ns, int salted)
{
	struct each_ctx *e = ctx;
	char name[32];
	if (salted)
		snprintf(name, sizeof name, "salt:%08llx", (unsigned long long)(ns.lo >> 32));
	else
		snprintf(name, sizeof name, "default");
	add_ns(name, t, e->nss, e->ents, e->tot, e->ebuf, e->dbuf);
}

/* The remote tier (store/remote.h) in the page's state; null without one. */
static json_t *remote_state(struct ksv_server *s)
{
	struct ks_remote_stats st;
	if (!s->remote)
		return json_null();
	ks_remote_stats(s->remote, &st);
	uint64_t dropped = 0;
	for (int w = 0; w < KS_RDROP__COUNT; w++)
		dropped += st.dropped[w];
	uint64_t refused = 0;
	for (int b = 1; b < KS_BAD__COUNT; b++)
		refused += st.bad[b];
	return json_pack("{s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I}", "url",
			 ks_remote_url_safe(s->remote), "up", st.up, "lookups", (json_int_t)st.lookups, "hits",
			 (json_int_t)st.hits, "skipped", (json_int_t)st.skipped, "read_bytes", (json_int_t)st.read_bytes,
			 "written_bytes", (json_int_t)st.written_bytes, "written_objects", (json_int_t)st.written_objects,
			 "dropped_objects", (json_int_t)dropped, "refused_values", (json_int_t)refused, "errors",
			 (json_int_t)(st.timeouts + st.io_errors + st.error_replies), "lookup_p99_ms", st.fetch_p99_ms,
			 "queue_bytes", (json_int_t)st.queue_bytes, "masters", (json_int_t)st.masters, "downs",
			 (json_int_t)st.downs);
}

void ksv_dashboard_handle_state(struct ksv_server *s, struct ksv_conn *c)
{
	struct kc_entry_info *ebuf = malloc(MAX_LIST * sizeof *ebuf);
	struct ks_entry_info *dbuf = malloc(MAX_LIST * sizeof *dbuf);
	if (!ebuf || !dbuf) {
		free(ebuf);
		free(dbuf);
		ksv_reply_error(s, c, 500, NULL, "out of memory");
		return;
	}
	json_t *j = json_object(), *nss = json_array(), *ents = json_array();
	struct totals tot = {0};
	struct each_ctx ec = {nss, ents, &tot, ebuf, dbuf};
	kss_registry_each(s->reg, each_ns, &ec);
	free(ebuf);
	free(dbuf);
	uint64_t mt, ma;
	meminfo(&mt, &ma);
	json_object_set_new(j, "model", json_string(s->model_name));
	json_object_set_new(j, "time_ms", json_integer(kv_wall_ms()));
	json_object_set_new(j, "uptime_s", json_integer(kv_wall_s() - s->created));
	json_t *m = json_object();
	json_object_set_new(m, "ram_cache_bytes", json_integer((json_int_t)tot.ram));
	json_object_set_new(m, "ram_budget_bytes", json_integer((json_int_t)s->budget_total));
	json_object_set_new(m, "disk_bytes", tot.have_disk ? json_integer((json_int_t)tot.disk) : json_null());
	json_object_set_new(m, "disk_cap_bytes", tot.have_disk ? json_integer((json_int_t)tot.disk_cap) : json_null());
	json_object_set_new(m, "weights_bytes", json_integer((json_int_t)kv_mem_used(KV_MEM_WEIGHTS)));
	json_object_set_new(m, "process_bytes", json_integer((json_int_t)kv_mem_total()));
	json_object_set_new(m, "mem_cap_bytes", json_integer((json_int_t)s->mem_cap));
	json_object_set_new(m, "ram_total_bytes", json_integer((json_int_t)mt));
	json_object_set_new(m, "free_bytes", json_integer((json_int_t)ma));
	json_object_set_new(j, "memory", m);
	json_object_set_new(j, "remote", remote_state(s));
	json_object_set_new(j, "namespaces", nss);
	json_object_set_new(j, "entries", ents);
	/*
	 * Prompt text of the recent misses: a salted namespace's only to the
	 * admin key; the default namespace's also to a trusted caller (no
	 * keys, loopback) while no salts are in use. With salts accepted the
	 * page shows numbers, since its callers are several tenants.
	 */
	int admin = ksv_server_admin(s, c);
	int text_default = admin || (ksv_server_trusted(s, c) && !s->o.allow_request_salt);
	json_object_set_new(j, "prompt_text", json_boolean(text_default));
	ksv_recent_json(s->recent, j, text_default, admin);
	json_t *cn = json_object_get(j, "counters");
	json_object_set_new(cn, "evictions", json_integer((json_int_t)tot.evictions));
	json_object_set_new(cn, "disk_writes", json_integer((json_int_t)tot.disk_writes));
	if (s->remote) {
		struct ks_remote_stats rs;
		ks_remote_stats(s->remote, &rs);
		json_object_set_new(cn, "remote_hits", json_integer((json_int_t)rs.hits));
		json_object_set_new(cn, "remote_writes", json_integer((json_int_t)rs.written_objects));
	}
	/* the shutdown flush's share of its budget if SIGTERM came now: what
	 * the write-behind has not taken yet, at the observed write rate */
	double avg = 0;
	if (tot.have_disk && tot.disk_writes)
		avg = (double)tot.disk / (double)tot.disk_writes;
	double budget = ks_store_budget_parse(kv_env(KV_ENV_SHUTDOWN_BUDGET));
	double use = tot.write_bps > 0 && budget > 0 ? (double)tot.dirty * avg / tot.write_bps / budget : 0;
	json_object_set_new(cn, "flush_budget_use", json_real(use));
	json_object_set_new(cn, "dirty_objects", json_integer((json_int_t)tot.dirty));
	/* the engine's own counters grow every step, not when a request ends:
	 * the page's prefill and decode rates come from these */
	struct kss_sched_stats es;
	kss_sched_stats(s->engine, &es);
	json_object_set_new(cn, "engine_steps", json_integer((json_int_t)es.steps));
	json_object_set_new(cn, "engine_prefill_tokens", json_integer((json_int_t)es.prefill_rows));
	json_object_set_new(cn, "engine_decode_tokens", json_integer((json_int_t)(es.rows - es.prefill_rows)));
	json_object_set_new(cn, "engine_step_ms", json_real(es.step_s * 1e3));
	/* the requests running now, with their progress; how many wait */
	json_object_set_new(j, "running", ksv_inflight_json(s->inflight));
	json_object_set_new(j, "queued", json_integer(ksv_queue_queued(s->queue)));
	ksv_reply_json(c, 200, j);
}
