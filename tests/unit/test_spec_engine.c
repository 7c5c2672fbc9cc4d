/*
 * test_spec_engine.c - speculative forwards and taking rows back
 * (engine/seq.h ke_seq_accept), on tiny-dense, tiny-hybrid, tiny-moe,
 * tiny-next (fused DeltaNet projections) and the Mamba-2 hybrids
 * tiny-granite-h and tiny-nemotron-h.
 *
 * A speculative forward verifies a draft: its rows are the last sampled
 * token and the draft tokens, and the caller keeps the rows up to the
 * first draft token the model did not choose. The property checked here
 * is the one speculative decoding stands on: every kept row's logits, and
 * the sequence after ke_seq_accept (KV rows, recurrent state, and every
 * logit of what follows), are bit for bit those of decoding the kept
 * tokens one at a time, whichever row the draft goes wrong at, alone or
 * batched with other sequences, on every CPU path.
 */
#include "kt.h"
#include "base/err.h"
#include "engine/isa.h"
#include "engine/model.h"
#include "engine/seq.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[512];
static uint64_t g_seed = 31;

static void cleanup(void)
{
	if (g_dir[0])
		kt_sh("rm -rf '%s'", g_dir);
}

static const char *models(void)
{
	if (g_dir[0])
		return g_dir;
	const char *t = getenv("TMPDIR");
	snprintf(g_dir, sizeof g_dir, "%s/kt-spec.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(g_dir)) {
		g_dir[0] = 0;
		return NULL;
	}
	atexit(cleanup);
	const char *presets[] = {"tiny-dense", "tiny-hybrid", "tiny-moe", "tiny-next", "tiny-gemma3", "tiny-gpt-oss",
				 "tiny-granite-h", "tiny-nemotron-h"};
	for (int i = 0; i < 8; i++)
		if (kt_sh("'%s' mkmodel --preset %s --out '%s/%s' --no-sync >/dev/null 2>&1", kt_bin(), presets[i], g_dir,
			  presets[i]))
			return NULL;
	return g_dir;
}

static struct ke_model *load(const char *name)
{
	char path[1024];
	struct ke_model *m = NULL;
	const char *d = models();
	if (!d) {
		kt_fail(__FILE__, __LINE__, "cannot build models with %s mkmodel", kt_bin());
		return NULL;
	}
	snprintf(path, sizeof path, "%s/%s", d, name);
	struct ke_model_params p = {.page_tokens = 16};
	if (ke_model_load(path, &p, &m))
		kt_fail(__FILE__, __LINE__, "load %s: %s", name, kv_errmsg());
	return m;
}

static int32_t *rand_tokens(int n, int vocab)
{
	int32_t *t = malloc((size_t)n * sizeof *t);
	for (int i = 0; i < n; i++)
		t[i] = (int32_t)(kt_rand(&g_seed) % (uint64_t)vocab);
	return t;
}

static struct ke_seq *seq_new(struct ke_model *m, int chunk)
{
	struct ke_seq *s = NULL;
	struct ke_seq_params p = {.chunk = chunk};
	if (ke_seq_create(m, &p, &s))
		kt_fail(__FILE__, __LINE__, "seq: %s", kv_errmsg());
	return s;
}

/* Logits of every position of tok[0..n), decoded one token at a time. */
static float *plain_logits(struct ke_model *m, const int32_t *tok, int n)
{
	int V = ke_model_config(m)->vocab;
	float *all = malloc((size_t)n * V * sizeof *all);
	struct ke_seq *s = seq_new(m, 1);
	for (int i = 0; s && i < n; i++)
		if (ke_seq_decode(s, tok[i], all + (size_t)i * V))
			kt_fail(__FILE__, __LINE__, "decode: %s", kv_errmsg());
	ke_seq_destroy(s);
	return all;
}

static int same_kv(const struct ke_seq *a, const struct ke_seq *b)
{
	const struct ke_layout *l = ke_model_layout(ke_seq_model(a));
	int pos = ke_seq_pos(a), B = l->page_tokens;
	if (pos != ke_seq_pos(b) || ke_seq_n_pages(a) != ke_seq_n_pages(b))
		return 0;
	if (memcmp(ke_seq_tokens(a), ke_seq_tokens(b), (size_t)pos * 4))
		return 0;
	for (int i = 0; i < ke_seq_n_pages(a); i++) {
		int rows = pos - i * B < B ? pos - i * B : B;
		for (int s = 0; s < l->n_segments; s++) {
			size_t off = ke_layout_row_off(l, s, 0, B);
			if (memcmp((char *)ke_seq_page(a, i)->data + off, (char *)ke_seq_page(b, i)->data + off,
				   (size_t)rows * l->row_bytes))
				return 0;
		}
	}
	return 1;
}

static int same_state(const struct ke_seq *a, const struct ke_seq *b)
{
	size_t n = ke_seq_snapshot_bytes(a);
	if (!n)
		return 1;
	char *x = malloc(n), *y = malloc(n);
	ke_seq_snapshot(a, x, n);
	ke_seq_snapshot(b, y, n);
	int r = !memcmp(x, y, n);
	free(x);
	free(y);
	return r;
}

/*
 * A prompt of P tokens, then a speculative forward of R rows whose first
 * `keep` rows are the true continuation and the rest other tokens; keep
 * them, then decode the rest of the true sequence (through a second
 * speculative forward that keeps everything, and single decodes). Every
 * logit on the way and the final KV and state must equal plain decoding.
 * Returns the number of mismatches.
 */
static int rollback_once(struct ke_model *m, const int32_t *tok, int N, const float *ref, int P, int R, int keep)
{
	int V = ke_model_config(m)->vocab, D = ke_model_config(m)->hidden, bad = 0;
	struct ke_seq *s = seq_new(m, 32), *whole = seq_new(m, 256);
	float *rows = malloc((size_t)KE_SPEC_MAX_ROWS * V * 4), *lg = malloc((size_t)V * 4);
	float *hid = malloc((size_t)KE_SPEC_MAX_ROWS * D * 4);
	int32_t draft[KE_SPEC_MAX_ROWS];
	if (!s || !whole)
		return 1;
	if (ke_seq_prefill(s, tok, P, NULL, NULL) || ke_seq_prefill(whole, tok, N, NULL, NULL))
		return 1;
	for (int i = 0; i < R; i++)
		draft[i] = i < keep ? tok[P + i] : (tok[P + i] + 1 + i) % V;
	struct ke_prefill_opts o = {.logits_all = rows, .hidden_all = hid, .spec = 1};
	if (ke_seq_prefill(s, draft, R, &o, NULL))
		return kt_fail(__FILE__, __LINE__, "spec: %s", kv_errmsg()), 1;
	for (int i = 0; i < keep; i++)
		bad += memcmp(rows + (size_t)i * V, ref + (size_t)(P + i) * V, (size_t)V * 4) != 0;
	if (ke_seq_accept(s, keep))
		return kt_fail(__FILE__, __LINE__, "accept: %s", kv_errmsg()), 1;
	bad += ke_seq_pos(s) != P + keep;
	/* a second speculative forward, all of it kept */
	int at = P + keep, n2 = N - at < 5 ? N - at : 5;
	o.spec = 1;
	if (ke_seq_prefill(s, tok + at, n2, &o, NULL) || ke_seq_accept(s, n2))
		return kt_fail(__FILE__, __LINE__, "spec 2: %s", kv_errmsg()), 1;
	for (int i = 0; i < n2; i++)
		bad += memcmp(rows + (size_t)i * V, ref + (size_t)(at + i) * V, (size_t)V * 4) != 0;
	for (at += n2; at < N; at++) {
		if (ke_seq_decode(s, tok[at], lg))
			return 1;
		bad += memcmp(lg, ref + (size_t)at * V, (size_t)V * 4) != 0;
	}
	bad += !same_kv(s, whole) || !same_state(s, whole);
	ke_seq_destroy(s);
	ke_seq_destroy(whole);
	free(rows);
	free(hid);
	free(lg);
	return bad;
}

static void rollback_every_position(const char *name)
{
	struct ke_model *m = load(name);
	KT_REQUIRE(m);
	int N = 60, V = ke_model_config(m)->vocab, R = 9;
	int32_t *tok = rand_tokens(N, V);
	float *ref = plain_logits(m, tok, N);
	/* P = 14: the draft crosses the 16-token page boundary */
	for (int keep = 1; keep <= R; keep++) {
		int bad = rollback_once(m, tok, N, ref, 14, R, keep);
		KT_CHECKF(bad == 0, "%s: keeping %d of %d rows: %d mismatches against plain decoding", name, keep, R, bad);
	}
	free(ref);
	free(tok);
	ke_model_destroy(m);
}

KT_CASE(rollback_at_every_draft_position_hybrid)
{
	rollback_every_position("tiny-hybrid");
}

KT_CASE(rollback_at_every_draft_position_next)
{
	rollback_every_position("tiny-next");
}

KT_CASE(rollback_at_every_draft_position_moe)
{
	rollback_every_position("tiny-moe");
}

/* conv and SSM state out of place, the kept rows replayed (mamba.c) */
KT_CASE(rollback_at_every_draft_position_mamba)
{
	rollback_every_position("tiny-granite-h");
	rollback_every_position("tiny-nemotron-h");
}

KT_CASE(rollback_at_every_draft_position_dense)
{
	rollback_every_position("tiny-dense");
}

/*
 * Sliding-window layers (windows of 16 keys, pages of 16; window pages are
 * dropped a 64-key block at a time). From P = 72 a 9-row draft ends at 81,
 * whose window starts in the second block: a forward that trimmed would
 * drop the first block's pages, which position 73 still reads. The kept
 * rows' logits, the global KV and the window rows (in the snapshot) must
 * equal plain decoding at every keep.
 */
static void rollback_window(const char *name)
{
	struct ke_model *m = load(name);
	KT_REQUIRE(m);
	KT_REQUIRE(ke_model_layout(m)->n_win_layers > 0);
	int N = 100, V = ke_model_config(m)->vocab, R = 9;
	int32_t *tok = rand_tokens(N, V);
	float *ref = plain_logits(m, tok, N);
	const int P[] = {14, 60, 72};
	for (int k = 0; k < 3; k++)
		for (int keep = 1; keep <= R; keep++) {
			int bad = rollback_once(m, tok, N, ref, P[k], R, keep);
			KT_CHECKF(bad == 0, "%s: from %d keeping %d of %d rows: %d mismatches against plain decoding", name,
				  P[k], keep, R, bad);
		}
	free(ref);
	free(tok);
	ke_model_destroy(m);
}

KT_CASE(rollback_at_every_draft_position_window)
{
	rollback_window("tiny-gemma3");
	rollback_window("tiny-gpt-oss");
}

/* The same on every CPU path (scalar, AVX2, AVX-512), each against plain
 * decoding on the scalar path. */
KT_CASE(rollback_on_every_cpu_path)
{
	if (ke_isa_best() == KE_ISA_SCALAR) {
		kt_skip("this CPU has only the scalar path");
		return;
	}
	int saved = ke_isa();
	const char *names[] = {"tiny-hybrid", "tiny-dense", "tiny-granite-h", "tiny-nemotron-h"};
	for (int k = 0; k < 4; k++) {
		struct ke_model *m = load(names[k]);
		KT_REQUIRE(m);
		int N = 40, V = ke_model_config(m)->vocab;
		int32_t *tok = rand_tokens(N, V);
		ke_isa_set(KE_ISA_SCALAR);
		float *ref = plain_logits(m, tok, N);
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
			ke_isa_set(isa);
			for (int keep = 1; keep <= 6; keep += 2) {
				int bad = rollback_once(m, tok, N, ref, 10, 6, keep);
				KT_CHECKF(bad == 0, "%s, %s: keeping %d of 6: %d mismatches", names[k], ke_isa_name(isa), keep,
					  bad);
			}
		}
		ke_isa_set(saved);
		free(ref);
		free(tok);
		ke_model_destroy(m);
	}
}

/*
 * Verification inside continuous batching: K sequences advance through
 * ke_batch_run, each step giving some a speculative item (draft rows of
 * which a random prefix is right), others a plain decode, some nothing;
 * after each step the speculative ones keep their right rows. Every row
 * that is kept has the logits of plain decoding, and each sequence ends
 * with the KV and state of decoding its tokens one by one.
 */
static void batched_verification(const char *name, int N)
{
	enum { K = 4 };
	struct ke_model *m = load(name);
	KT_REQUIRE(m);
	int V = ke_model_config(m)->vocab, bad = 0, spec_steps = 0, multi = 0;
	int32_t *tok[K], draft[K][KE_SPEC_MAX_ROWS];
	float *ref[K], *rows[K], *lg = malloc((size_t)K * V * 4);
	int keep[K];
	struct ke_seq *s[K], *whole[K];
	struct ke_batch *b = NULL;
	KT_OK(ke_batch_create(m, K * KE_SPEC_MAX_ROWS, K, &b));
	for (int i = 0; i < K; i++) {
		tok[i] = rand_tokens(N, V);
		ref[i] = plain_logits(m, tok[i], N);
		rows[i] = malloc((size_t)KE_SPEC_MAX_ROWS * V * 4);
		s[i] = seq_new(m, 1);
		whole[i] = seq_new(m, 256);
		KT_OK(ke_seq_prefill(whole[i], tok[i], N, NULL, NULL));
		KT_OK(ke_seq_prefill(s[i], tok[i], 5 + i, NULL, NULL));
	}
	for (;;) {
		struct ke_batch_item it[K];
		int n_it = 0, live = 0;
		for (int i = 0; i < K; i++) {
			int at = ke_seq_pos(s[i]), left = N - at;
			if (!left)
				continue;
			live++;
			if (kt_rand(&g_seed) % 5 == 0)
				continue;
			keep[i] = 0;
			if (kt_rand(&g_seed) % 3 == 0) { /* plain decode */
				it[n_it++] = (struct ke_batch_item){.s = s[i], .tokens = tok[i] + at, .n = 1,
								    .logits = lg + (size_t)i * V};
				continue;
			}
			int r = 1 + (int)(kt_rand(&g_seed) % 8), k;
			if (r > left)
				r = left;
			k = 1 + (int)(kt_rand(&g_seed) % (uint64_t)r);
			for (int j = 0; j < r; j++)
				draft[i][j] = j < k ? tok[i][at + j] : (tok[i][at + j] + 3) % V;
			keep[i] = k;
			it[n_it++] = (struct ke_batch_item){.s = s[i], .tokens = draft[i], .n = r, .logits_all = rows[i],
							    .spec = 1};
		}
		if (!live)
			break;
		if (!n_it)
			continue;
		multi += n_it > 1;
		KT_OK(ke_batch_run(b, it, n_it));
		for (int j = 0; j < n_it; j++) {
			KT_OK(it[j].rc);
			int i = 0;
			while (s[i] != it[j].s)
				i++;
			if (!it[j].spec) {
				bad += memcmp(it[j].logits, ref[i] + (size_t)(ke_seq_pos(s[i]) - 1) * V, (size_t)V * 4) != 0;
				continue;
			}
			spec_steps++;
			int at = ke_seq_pos(s[i]) - it[j].n;
			for (int r = 0; r < keep[i]; r++)
				bad += memcmp(rows[i] + (size_t)r * V, ref[i] + (size_t)(at + r) * V, (size_t)V * 4) != 0;
			KT_OK(ke_seq_accept(s[i], keep[i]));
		}
	}
	KT_CHECKF(bad == 0, "%s: %d kept rows differ from plain decoding", name, bad);
	KT_CHECKF(spec_steps > 20 && multi > 10, "%s: %d speculative items, %d batched steps", name, spec_steps, multi);
	for (int i = 0; i < K; i++) {
		KT_CHECKF(same_kv(whole[i], s[i]) && same_state(whole[i], s[i]), "%s: sequence %d ends elsewhere", name, i);
		ke_seq_destroy(s[i]);
		ke_seq_destroy(whole[i]);
		free(tok[i]);
		free(ref[i]);
		free(rows[i]);
	}
	ke_batch_destroy(b);
	free(lg);
	ke_model_destroy(m);
}

KT_CASE(verification_inside_continuous_batching_hybrid)
{
	batched_verification("tiny-hybrid", 70);
	batched_verification("tiny-next", 70);
	batched_verification("tiny-granite-h", 70);
	batched_verification("tiny-nemotron-h", 70);
}

KT_CASE(verification_inside_continuous_batching_dense_moe)
{
	batched_verification("tiny-dense", 70);
	batched_verification("tiny-moe", 70);
}

/* Sliding windows of 16 keys (pages of 16): the sequences run well past
 * the first 64-key block, where a forward drops window pages, so the
 * rejected rows of a speculative item would have evicted keys the kept
 * position still reads. */
KT_CASE(verification_inside_continuous_batching_window)
{
	batched_verification("tiny-gemma3", 150);
	batched_verification("tiny-gpt-oss", 150);
}

/* What ke_seq_accept refuses, and the limits of a speculative forward. */
KT_CASE(accept_refuses_what_it_cannot_undo)
{
	struct ke_model *m = load("tiny-hybrid");
	KT_REQUIRE(m);
	int V = ke_model_config(m)->vocab;
	int32_t *tok = rand_tokens(40, V);
	struct ke_seq *s = seq_new(m, 32);
	KT_REQUIRE(s);
	KT_OK(ke_seq_prefill(s, tok, 10, NULL, NULL));
	KT_EQ_INT(ke_seq_accept(s, 1), KV_ERR_INVALID); /* nothing speculative yet */
	struct ke_prefill_opts o = {.spec = 1};
	KT_OK(ke_seq_prefill(s, tok + 10, 4, &o, NULL));
	KT_EQ_INT(ke_seq_accept(s, 0), KV_ERR_INVALID);
	KT_EQ_INT(ke_seq_accept(s, 5), KV_ERR_INVALID);
	KT_OK(ke_seq_prefill(s, tok + 14, 1, NULL, NULL)); /* another forward ends the undo */
	KT_EQ_INT(ke_seq_accept(s, 2), KV_ERR_INVALID);
	KT_EQ_INT(ke_seq_pos(s), 15);
	KT_EQ_INT(ke_seq_prefill(s, tok + 15, KE_SPEC_MAX_ROWS + 1, &o, NULL), KV_ERR_INVALID);
	int st = 16;
	struct ke_prefill_opts os = {.spec = 1, .stops = &st, .n_stops = 1};
	KT_EQ_INT(ke_seq_prefill(s, tok + 15, 2, &os, NULL), KV_ERR_INVALID);
	KT_EQ_INT(ke_seq_pos(s), 15);
	struct ke_batch *b = NULL;
	KT_OK(ke_batch_create(m, 64, 2, &b));
	struct ke_batch_item it = {.s = s, .tokens = tok, .n = KE_SPEC_MAX_ROWS + 1, .spec = 1};
	KT_EQ_INT(ke_batch_run(b, &it, 1), KV_ERR_INVALID);
	KT_EQ_INT(ke_seq_pos(s), 15);
	/* the undo memory is counted with the sequence */
	KT_CHECK(ke_model_spec_bytes(m) > ke_seq_snapshot_bytes(s));
	ke_batch_destroy(b);
	ke_seq_destroy(s);
	free(tok);
	ke_model_destroy(m);
}

KT_MAIN(rollback_at_every_draft_position_hybrid, rollback_at_every_draft_position_next,
	rollback_at_every_draft_position_moe, rollback_at_every_draft_position_mamba, rollback_at_every_draft_position_dense,
	rollback_at_every_draft_position_window, rollback_on_every_cpu_path,
	verification_inside_continuous_batching_hybrid, verification_inside_continuous_batching_dense_moe,
	verification_inside_continuous_batching_window,
	accept_refuses_what_it_cannot_undo)
