/*
 * fuzz_store.c - libFuzzer target for the disk tier's object loader
 * (store/obj.h), the code that reads files a crash, a bad disk or another
 * program may have left in the cache folder.
 *
 * Input: byte 0 picks the layout (bit 0: hybrid) and the kind the loader
 * is asked for (bits 1-2: block, tail, snapshot, entry); the rest is the
 * file. The loader must refuse it with an error or accept it; an accepted
 * object is written back with the writer, which must accept it, and read
 * again, which must give the same header and bytes. The namespace marker
 * parser (ns.h) gets the input as layout text too. A violated invariant
 * traps. `make fuzz` builds it with clang; `make test` replays
 * tests/fuzz/corpus/store (seeds: one valid object of each kind, written
 * by the writer, and a few broken ones).
 */
#include "base/durable.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "store/ns.h"
#include "model/safetensors.h"
#include "store/obj.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) __builtin_trap(); } while (0)

/* The layout the seeds were written with (tests/unit/test_store_util.h). */
static void layout(struct ke_layout *L, int hybrid)
{
	memset(L, 0, sizeof *L);
	L->page_tokens = 8;
	L->kv_dtype = KV_DT_F32;
	L->n_attn_layers = 2;
	L->n_kv_heads = 2;
	L->head_dim = 2;
	L->n_segments = 8;
	L->row_bytes = 8;
	L->page_bytes = 8 * 8 * 8;
	L->kv_bytes_per_token = 64;
	if (hybrid) {
		size_t off = 0;
		L->n_rec_layers = 2;
		for (int i = 0; i < 2; i++) {
			struct ke_rec_layer *r = &L->rec[i];
			r->layer = i * 2;
			r->conv_dims[0] = 3;
			r->conv_dims[1] = 2;
			r->conv_bytes = 24;
			r->conv_off = off;
			off += 24;
			r->state_dims[0] = r->state_dims[1] = r->state_dims[2] = 2;
			r->state_bytes = 32;
			r->state_off = off;
			off += 32;
		}
		L->snapshot_bytes = off;
	}
}

static const struct kv_h128 NS = {0xabcdef, 0x123456};

struct bufs {
	int32_t tok[1 << 16];
	uint8_t kv[4096];
	uint8_t snap[512];
	uint32_t ck[64];
};

static int load(const char *path, const struct ke_layout *L, int kind, struct ks_obj_info *info, struct bufs *b)
{
	struct ks_obj *o;
	int bad, rc = ks_obj_open(path, L, kind, &NS, &o, &bad);
	if (rc)
		return rc;
	*info = *ks_obj_info(o);
	CHECK(info->kind == kind);
	if (info->n_tokens > sizeof b->tok / sizeof b->tok[0]) {
		ks_obj_close(o);
		return KV_ERR_INVALID;
	}
	struct ks_obj_dst d = {.tokens = b->tok, .kv = b->kv, .snap = b->snap, .ckpt = b->ck};
	rc = ks_obj_read(o, &d, &bad);
	ks_obj_close(o);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct bufs a, b;
	static char path[64], path2[64];
	static int init;
	struct ke_layout L;
	if (!init) {
		kv_log_set_level(KV_LOG_OFF);
		snprintf(path, sizeof path, "/tmp/fuzz_store.%d.a", (int)getpid());
		snprintf(path2, sizeof path2, "/tmp/fuzz_store.%d.b", (int)getpid());
		init = 1;
	}
	if (size < 1)
		return 0;
	int hybrid = data[0] & 1, kind = 1 + ((data[0] >> 1) & 3);
	layout(&L, hybrid);

	/* the layout-text parser sees the bytes too */
	{
		char txt[512];
		size_t n = size - 1 < sizeof txt - 1 ? size - 1 : sizeof txt - 1;
		struct ke_layout back;
		memcpy(txt, data + 1, n);
		txt[n] = 0;
		if (ks_ns_layout_parse(txt, &back) == KV_OK)
			CHECK(back.page_bytes == (size_t)back.n_segments * (size_t)back.page_tokens * back.row_bytes);
	}

	if (kv_durable_write(path, data + 1, size - 1, KV_DW_NO_SYNC))
		return 0;
	struct ks_obj_info in, in2;
	if (load(path, &L, kind, &in, &a) != KV_OK)
		goto out;
	/* accepted: the writer must take it back and produce the same object */
	CHECK(kind != KS_SNAP || hybrid);
	struct ks_obj_src src = {.kind = kind,
				 .ns = in.ns,
				 .id = in.id,
				 .parent = in.parent,
				 .pos = in.pos,
				 .tokens = a.tok,
				 .n_tokens = in.n_tokens,
				 .kv = a.kv,
				 .snap = a.snap,
				 .anchor_flag = in.anchor_flag,
				 .ckpt = a.ck,
				 .n_ckpt = in.n_ckpt,
				 .anchor = in.anchor,
				 .created = in.created ? in.created : 1};
	CHECK(ks_obj_write(path2, &L, &src, KV_DW_NO_SYNC, 0, NULL) == KV_OK);
	CHECK(load(path2, &L, kind, &in2, &b) == KV_OK);
	CHECK(kv_h128_eq(in.id, in2.id) && kv_h128_eq(in.parent, in2.parent) && in.pos == in2.pos);
	CHECK(in.n_tokens == in2.n_tokens && in.n_ckpt == in2.n_ckpt && in.anchor == in2.anchor);
	CHECK(!memcmp(a.tok, b.tok, (size_t)in.n_tokens * 4));
	if (kind == KS_BLOCK)
		CHECK(!memcmp(a.kv, b.kv, L.page_bytes));
	if (kind == KS_TAIL)
		CHECK(!memcmp(a.kv, b.kv, (size_t)in.n_tokens * L.kv_bytes_per_token));
	if (kind == KS_SNAP)
		CHECK(!memcmp(a.snap, b.snap, L.snapshot_bytes));
	if (kind == KS_ENTRY)
		CHECK(!memcmp(a.ck, b.ck, (size_t)in.n_ckpt * 4));
	unlink(path2);
out:
	unlink(path);
	return 0;
}
