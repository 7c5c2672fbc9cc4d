/*
 * test_spec.c - speculative decoding in the session layer: the prompt
 * lookup index, the draft policy, and the property everything rests on:
 * a request decodes to the same tokens and the same logprobs (memcmp)
 * with speculative decoding on and off, greedy and with seeded sampling
 * (temperature 0.8, top_p 0.9), on dense, hybrid and MoE presets, alone
 * and 4 at once through the scheduler, on every CPU path; and what the
 * cache keeps after speculative turns resumes a later turn exactly as a
 * cold prefill computes it.
 */
#include "kt.h"
#include "base/err.h"
#include "cache/cache.h"
#include "engine/isa.h"
#include "engine/model.h"
#include "engine/mtp.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "session/lookup.h"
#include "session/run.h"
#include "session/sched.h"
#include "session/spec.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_seed = 0x5bec;

static int rnd(int lo, int hi)
{
	return lo + (int)(kt_rand(&g_seed) % (uint64_t)(hi - lo + 1));
}

/* preset, or "preset+mtp" for mkmodel --mtp, "preset+q8" for 8-bit KV */
static struct ke_model *load_model(const char *name)
{
	char dir[1024], preset[64];
	struct ke_model *m = NULL;
	snprintf(preset, sizeof preset, "%s", name);
	int mtp = strstr(preset, "+mtp") != NULL, q8 = strstr(preset, "+q8") != NULL;
	if (mtp)
		*strstr(preset, "+mtp") = 0;
	if (q8)
		*strstr(preset, "+q8") = 0;
	snprintf(dir, sizeof dir, "%s/%s%s", kt_tmpdir(), preset, mtp ? "-mtp" : "");
	struct kv_synth_opts o = {.preset = preset, .out_dir = dir, .seed = 7, .dtype = KV_DT_BF16, .mtp = mtp};
	if (kv_synth_write(&o) != KV_OK) {
		kt_fail(__FILE__, __LINE__, "synth %s: %s", preset, kv_errmsg());
		return NULL;
	}
	struct ke_model_params mp = {.page_tokens = 16, .kv = q8 ? KE_KV_Q8_0 : KE_KV_BF16};
	if (ke_model_load(dir, &mp, &m) != KV_OK) {
		kt_fail(__FILE__, __LINE__, "load %s: %s", preset, kv_errmsg());
		return NULL;
	}
	return m;
}

/* --- the lookup index ------------------------------------------------------ */

KT_CASE(lookup_drafts_what_followed_the_longest_match)
{
	struct kss_lookup *l = NULL;
	int32_t out[16];
	int match = -1;
	KT_OK(kss_lookup_create(10, &l));
	/* 1 2 3 4 5 | 9 2 3 4 | 7 8 1 2 3 */
	int32_t a[] = {1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 1, 2, 3};
	KT_OK(kss_lookup_append(l, a, 14));
	/* suffix 1 2 3: the 3-gram's last occurrence is at 0..2, followed by 4 5 9 2 */
	KT_EQ_INT(kss_lookup_draft(l, 4, out, &match), 4);
	KT_EQ_INT(out[0], 4);
	KT_EQ_INT(out[1], 5);
	KT_EQ_INT(out[3], 2);
	KT_EQ_INT(match, 3);
	/* the draft stops at the history's end */
	KT_EQ_INT(kss_lookup_draft(l, 15, out, &match), 11);
	KT_EQ_INT(out[10], 3);
	/* ... 2 3 4 then 7: the 3-gram 3 4 7 is new, 4 7 too, 7 once before */
	int32_t b = 7;
	KT_OK(kss_lookup_append(l, a + 3, 1));
	KT_OK(kss_lookup_append(l, &b, 1));
	KT_EQ_INT(kss_lookup_draft(l, 2, out, &match), 2);
	KT_EQ_INT(out[0], 8);
	KT_EQ_INT(out[1], 1);
	KT_EQ_INT(match, 4); /* 2 3 4 7 at 6..9 */
	/* a token never seen: nothing */
	b = 77;
	KT_OK(kss_lookup_append(l, &b, 1));
	KT_EQ_INT(kss_lookup_draft(l, 4, out, &match), 0);
	KT_EQ_INT(match, 0);
	KT_EQ_INT(kss_lookup_len(l), 17);
	kss_lookup_destroy(l);

	/* a long repeated stretch: the match length saturates at the cap */
	KT_OK(kss_lookup_create(0, &l));
	int32_t r[300];
	for (int i = 0; i < 300; i++)
		r[i] = i < 150 ? 1000 + i : 1000 + i - 150;
	KT_OK(kss_lookup_append(l, r, 250));
	KT_EQ_INT(kss_lookup_draft(l, 8, out, &match), 8);
	KT_EQ_INT(out[0], 1100);
	KT_EQ_INT(out[7], 1107);
	KT_EQ_INT(match, KSS_LOOKUP_MAX_MATCH);
	kss_lookup_destroy(l);
}

/* A copy in progress stays on the copied text: the latest occurrence of
 * the current 3-gram is elsewhere in the file (code repeats short runs),
 * but the previous draft's source, moved on, matches further back. */
KT_CASE(lookup_follows_the_text_being_copied)
{
	struct kss_lookup *l = NULL;
	int32_t out[8];
	int match = -1;
	KT_OK(kss_lookup_create(0, &l));
	int32_t file[] = {10, 1, 2, 3, 11, 12, 1, 2, 3, 13, 14, 15}, copy[] = {10, 1, 2, 3};
	KT_OK(kss_lookup_append(l, file, 12));
	KT_OK(kss_lookup_append(l, copy, 2));
	KT_EQ_INT(kss_lookup_draft(l, 4, out, &match), 4); /* 10 1 at 0..1 */
	KT_EQ_INT(out[0], 2);
	KT_EQ_INT(out[2], 11);
	/* two kept: the 3-gram 1 2 3 last ended at 8 (then 13), the copy is at 3 */
	KT_OK(kss_lookup_append(l, copy + 2, 2));
	KT_EQ_INT(kss_lookup_draft(l, 4, out, &match), 4);
	KT_EQ_INT(out[0], 11);
	KT_EQ_INT(out[1], 12);
	KT_EQ_INT(out[2], 1);
	KT_EQ_INT(match, 4);
	/* the copy diverges (an edit): the source no longer matches, the
	 * table's candidate is taken */
	int32_t e = 13;
	KT_OK(kss_lookup_append(l, &e, 1));
	KT_EQ_INT(kss_lookup_draft(l, 2, out, &match), 2);
	KT_EQ_INT(out[0], 14);
	KT_EQ_INT(out[1], 15);
	kss_lookup_destroy(l);
}

/* The table is bounded: 100,000 random tokens in 4,096 slots per n-gram
 * size; every draft is what followed a real earlier occurrence of the
 * suffix it claims to match (a slot overwritten by another n-gram is
 * refused, never trusted). */
KT_CASE(lookup_index_is_bounded_and_checked)
{
	enum { N = 100000, Q = 300 };
	struct kss_lookup *l = NULL;
	KT_OK(kss_lookup_create(0, &l));
	int32_t *t = malloc((N + Q) * sizeof *t), out[8];
	for (int i = 0; i < N; i++)
		t[i] = (int32_t)(kt_rand(&g_seed) % 3000);
	KT_OK(kss_lookup_append(l, t, N));
	int wrong = 0, found = 0, len = N;
	for (int q = 0; q < Q; q++) {
		int32_t match;
		t[len] = (int32_t)(kt_rand(&g_seed) % 3000);
		KT_OK(kss_lookup_append(l, t + len, 1));
		len++;
		int n = kss_lookup_draft(l, 8, out, &match);
		if (!n)
			continue;
		found++;
		/* some j < end where the suffix's `match` tokens occur and `out` follows */
		int ok = 0, end = len - 1;
		for (int j = end - 1; j >= match - 1 && !ok; j--)
			ok = !memcmp(t + j - match + 1, t + end - match + 1, (size_t)match * 4) &&
			     !memcmp(t + j + 1, out, (size_t)n * 4) && (j - match < 0 || match == KSS_LOOKUP_MAX_MATCH ||
									t[j - match] != t[end - match]);
		wrong += !ok;
	}
	KT_CHECKF(wrong == 0, "%d of %d drafts are not what followed a match of their length", wrong, found);
	KT_CHECKF(found > Q / 2, "only %d of %d suffixes found a match", found, Q);
	free(t);
	kss_lookup_destroy(l);
}

/* The policy drafts a long match, stops drafting a source that fails, and
 * tries it again later. */
KT_CASE(policy_turns_off_and_comes_back)
{
	struct kss_spec *sp = NULL;
	int32_t pr[64], d[16];
	for (int i = 0; i < 64; i++)
		pr[i] = i < 32 ? 100 + i : 100 + i - 32; /* a 32-token stretch repeated */
	struct kss_spec_params p = {.mode = KSS_SPEC_LOOKUP, .max_draft = 8};
	KT_OK(kss_spec_create(&p, pr, 64, &sp));
	KT_REQUIRE(sp);
	int src = -1, k = kss_spec_draft(sp, 8, d, &src);
	KT_EQ_INT(k, 0); /* the first step measures a plain decode */
	kss_spec_plain(sp, 0.001);
	k = kss_spec_draft(sp, 8, d, &src);
	KT_CHECKF(k >= 4 && src == KSS_SRC_LOOKUP && d[0] == 100, "a long match drafts: k %d src %d", k, src);
	/* every draft fails: the policy stops drafting */
	int drafted = 0, steps = 0;
	for (; steps < 200; steps++) {
		k = kss_spec_draft(sp, 8, d, &src);
		if (k) {
			drafted++;
			kss_spec_verified(sp, src, k, 0, 0.0);
		} else {
			kss_spec_plain(sp, 0.001);
		}
	}
	KT_CHECKF(drafted > 0 && drafted < 40, "%d of 200 steps drafted although every draft failed", drafted);
	kss_spec_destroy(sp);

	/* costs: plain steps of 1 ms, verifications of 1.2 ms keeping all (a
	 * good source), and now and then one that took 40 ms (another job ran):
	 * drafting goes on */
	KT_OK(kss_spec_create(&(struct kss_spec_params){.mode = KSS_SPEC_LOOKUP, .max_draft = 8}, pr, 64, &sp));
	KT_REQUIRE(sp);
	drafted = 0;
	for (steps = 0; steps < 300; steps++) {
		k = kss_spec_draft(sp, 8, d, &src);
		if (!k) {
			kss_spec_plain(sp, 0.001);
			continue;
		}
		drafted++;
		kss_spec_verified(sp, src, k, k, steps % 10 == 3 ? 0.040 : 0.0012);
	}
	KT_CHECKF(drafted > 250, "only %d of 300 steps drafted with a source that is always right", drafted);
	/* and when drafts stop paying (every verification slow), the policy
	 * stops, then tries again */
	for (steps = drafted = 0; steps < 300; steps++) {
		k = kss_spec_draft(sp, 8, d, &src);
		if (!k) {
			kss_spec_plain(sp, 0.001);
			continue;
		}
		drafted++;
		kss_spec_verified(sp, src, k, k, 0.001 * (1 + 3 * k));
	}
	KT_CHECKF(drafted > 3 && drafted < 150, "%d of 300 steps drafted when verifying k rows costs 1 + 3k steps",
		  drafted);
	/* off when asked, or MTP without a head */
	struct kss_spec *off = (struct kss_spec *)1;
	p.mode = KSS_SPEC_OFF;
	KT_OK(kss_spec_create(&p, pr, 64, &off));
	KT_CHECK(off == NULL);
	p.mode = KSS_SPEC_MTP;
	KT_OK(kss_spec_create(&p, pr, 64, &off));
	KT_CHECK(off == NULL);
	p.mode = KSS_SPEC_AUTO;
	p.max_draft = KE_SPEC_MAX_ROWS;
	KT_EQ_INT(kss_spec_create(&p, pr, 64, &off), KV_ERR_INVALID);
	KT_EQ_INT(kss_spec_mode_parse("auto"), KSS_SPEC_AUTO);
	KT_EQ_INT(kss_spec_mode_parse("lookup"), KSS_SPEC_LOOKUP);
	KT_EQ_INT(kss_spec_mode_parse("Auto"), -1);
	kss_spec_destroy(sp);
}

/* --- identity: on == off --------------------------------------------------- */

#define GEN 64

struct pick {
	struct ke_sampler *smp;
	int V;
	int n;
	int32_t tok[GEN];
	float lp[GEN];
};

static int pick_fn(void *ctx, const float *logits, int vocab, int32_t *tok)
{
	struct pick *p = ctx;
	int32_t t = ke_sample(p->smp, logits);
	p->tok[p->n] = t;
	p->lp[p->n++] = ke_token_logprob(logits, vocab, t);
	*tok = t;
	return KV_OK;
}

/* The oracle draft source (in the MTP head's place): the tokens plain
 * decoding produced next, one of them changed now and then, so that drafts
 * are kept, cut at every position and refused whole. */
struct oracle {
	const struct pick *ref;   /* the plain run's tokens */
	const struct pick *now;   /* the run being drafted for: its picks so far */
	uint64_t rng;
};

static int oracle_draft(void *ctx, int max, int32_t *out, double *seconds)
{
	struct oracle *o = ctx;
	int at = o->now->n, k = 0;
	*seconds = 0.0;
	while (k < max && at + k < o->ref->n) {
		out[k] = o->ref->tok[at + k];
		k++;
	}
	if (k && kt_rand(&o->rng) % 4 == 0)
		out[kt_rand(&o->rng) % (uint64_t)k] ^= 1; /* wrong from there on */
	return k;
}

struct job {
	struct kc_cache *c;
	struct ke_model *m;
	struct kss_sched *s;
	int32_t prompt[300];
	uint32_t n;
	double temp;
	int spec;
	struct pick pk;
	struct kss_run_result r;
	int rc;
	struct oracle *orc;       /* NULL: no oracle */
};

static void *job_main(void *arg)
{
	struct job *j = arg;
	struct ke_sample_params sp = {.temperature = j->temp, .top_p = j->temp > 0 ? 0.9 : 1.0, .seed = 1234};
	j->pk.n = 0;
	if ((j->rc = ke_sampler_create(j->pk.V, &sp, &j->pk.smp)))
		return NULL;
	ke_sampler_prompt(j->pk.smp, j->prompt, j->n);
	struct kss_run_params p = {.prompt = j->prompt, .n = j->n, .max_new = GEN, .pick = pick_fn, .pick_ctx = &j->pk,
				   .sched = j->s, .speculative = j->spec};
	if (j->orc) {
		j->orc->now = &j->pk;
		p.spec_draft = oracle_draft;
		p.spec_draft_ctx = j->orc;
	}
	j->rc = kss_run(j->c, j->m, &p, &j->r);
	ke_sampler_destroy(j->pk.smp);
	return NULL;
}

/* A prompt with repeated stretches, so lookup drafts come up. */
static void make_prompt(struct job *j)
{
	int32_t unit[40];
	int u = rnd(12, 40);
	for (int i = 0; i < u; i++)
		unit[i] = rnd(20, 600);
	j->n = (uint32_t)rnd(90, 200);
	for (uint32_t i = 0; i < j->n; i++)
		j->prompt[i] = i % 3 == 2 && kt_rand(&g_seed) % 4 == 0 ? rnd(20, 600) : unit[i % (uint32_t)u];
}

struct tally {
	uint64_t drafted, accepted, steps, mtp_drafted;
};

/* K jobs run with speculation off one after another, then with `spec` K
 * at a time through a scheduler (or one after another without one); the
 * tokens and logprobs must be the same bytes. */
static int identity(struct ke_model *m, int K, double temp, int spec, int use_sched, struct tally *t)
{
	struct kc_policy pol;
	kc_policy_default(&pol, ke_model_layout(m)->snapshot_bytes > 0);
	struct kc_cache *c1 = NULL, *c2 = NULL;
	struct kc_params cp = {.layout = ke_model_layout(m), .policy = &pol, .ns = {5, 6}};
	struct kss_sched *s = NULL;
	struct kss_sched_params sp = {.model = m, .max_running = K, .chunk = 64, .spec_rows = 9};
	int bad = 0;
	if (kc_cache_create(&cp, &c1) || kc_cache_create(&cp, &c2) || (use_sched && kss_sched_create(&sp, &s)))
		return kt_fail(__FILE__, __LINE__, "setup: %s", kv_errmsg()), 1;
	struct job *off = calloc((size_t)K, sizeof *off), *on = calloc((size_t)K, sizeof *on);
	pthread_t th[8];
	for (int i = 0; i < K; i++) {
		make_prompt(&off[i]);
		off[i].m = m;
		off[i].c = c1;
		off[i].temp = temp;
		off[i].pk.V = ke_model_config(m)->vocab;
		on[i] = off[i];
		on[i].c = c2;
		on[i].s = s;
		on[i].spec = spec;
		job_main(&off[i]);
		if (off[i].rc)
			return kt_fail(__FILE__, __LINE__, "plain run: %s", kv_errmsg()), 1;
	}
	struct oracle orc[8];
	for (int i = 0; i < K; i++)
		if (spec == KSS_SPEC_MTP) {
			orc[i] = (struct oracle){.ref = &off[i].pk, .rng = 77 + (uint64_t)i};
			on[i].orc = &orc[i];
		}
	for (int i = 0; i < K; i++)
		pthread_create(&th[i], NULL, job_main, &on[i]);
	for (int i = 0; i < K; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < K; i++) {
		if (on[i].rc)
			return kt_fail(__FILE__, __LINE__, "speculative run: %s", kv_errmsg()), 1;
		bad += on[i].pk.n != off[i].pk.n || on[i].r.generated != off[i].r.generated ||
		       memcmp(on[i].pk.tok, off[i].pk.tok, sizeof on[i].pk.tok) ||
		       memcmp(on[i].pk.lp, off[i].pk.lp, (size_t)off[i].pk.n * sizeof(float));
		for (int k = 0; k < 2; k++) {
			t->drafted += on[i].r.spec.drafted[k];
			t->accepted += on[i].r.spec.accepted[k];
		}
		t->steps += on[i].r.spec.steps;
		t->mtp_drafted += on[i].r.spec.drafted[KSS_SRC_MTP];
		bad += off[i].r.spec.steps != 0;
	}
	free(off);
	free(on);
	kss_sched_destroy(s);
	kc_cache_destroy(c1);
	kc_cache_destroy(c2);
	return bad;
}

static void identity_case(const char *preset)
{
	struct ke_model *m = load_model(preset);
	KT_REQUIRE(m);
	struct tally t = {0};
	for (int k = 0; k < 2; k++) {
		double temp = k ? 0.8 : 0.0;
		int bad = identity(m, 1, temp, KSS_SPEC_AUTO, 0, &t);
		KT_CHECKF(bad == 0, "%s, temperature %.1f, alone: %d requests differ with speculation", preset, temp, bad);
		bad = identity(m, 1, temp, KSS_SPEC_LOOKUP, 1, &t);
		KT_CHECKF(bad == 0, "%s, temperature %.1f, 1 through the scheduler: %d differ", preset, temp, bad);
		bad = identity(m, 4, temp, KSS_SPEC_AUTO, 1, &t);
		KT_CHECKF(bad == 0, "%s, temperature %.1f, 4 at once: %d of 4 differ", preset, temp, bad);
		/* oracle drafts: kept, cut anywhere, refused */
		bad = identity(m, 1, temp, KSS_SPEC_MTP, 0, &t);
		KT_CHECKF(bad == 0, "%s, temperature %.1f, oracle drafts alone: %d differ", preset, temp, bad);
		bad = identity(m, 4, temp, KSS_SPEC_MTP, 1, &t);
		KT_CHECKF(bad == 0, "%s, temperature %.1f, oracle drafts, 4 at once: %d of 4 differ", preset, temp, bad);
	}
	/* the identity means something only if drafts were verified, kept and
	 * refused */
	KT_CHECKF(t.steps > 40 && t.accepted > 100 && t.drafted > t.accepted + 20,
		  "%s: %llu verifications, %llu of %llu draft tokens kept", preset, (unsigned long long)t.steps,
		  (unsigned long long)t.accepted, (unsigned long long)t.drafted);
	ke_model_destroy(m);
}

KT_CASE(on_equals_off_dense)
{
	identity_case("tiny-dense");
}

KT_CASE(on_equals_off_hybrid)
{
	identity_case("tiny-hybrid");
}

/* the rollback cuts q8_0 rows (34-byte blocks) as it cuts bf16 ones */
KT_CASE(on_equals_off_q8_kv)
{
	identity_case("tiny-dense+q8");
	identity_case("tiny-hybrid+q8");
}

KT_CASE(on_equals_off_moe)
{
	identity_case("tiny-moe");
	identity_case("tiny-next");
}

/* The model's own MTP head drafting (mkmodel --mtp): on == off. Its drafts
 * on random weights are mostly refused (the policy then drafts less), so
 * the oracle cases above carry the acceptance; here the head's path runs:
 * context from the prompt, drafts chained, context kept across steps. */
static void mtp_identity(const char *name)
{
	struct ke_model *m = load_model(name);
	KT_REQUIRE(m);
	KT_REQUIRE(ke_model_has_mtp(m));
	struct tally t = {0};
	uint64_t mtp_drafted = 0;
	for (int k = 0; k < 2; k++) {
		double temp = k ? 0.8 : 0.0;
		struct tally t0 = t;
		int bad = identity(m, 1, temp, KSS_SPEC_AUTO, 1, &t);
		bad += identity(m, 4, temp, KSS_SPEC_AUTO, 1, &t);
		KT_CHECKF(bad == 0, "%s, temperature %.1f: %d requests differ with the MTP head drafting", name, temp, bad);
		mtp_drafted += t.mtp_drafted - t0.mtp_drafted;
	}
	KT_CHECKF(mtp_drafted > 0, "%s: the MTP head drafted nothing", name);
	ke_model_destroy(m);
}

KT_CASE(on_equals_off_with_the_mtp_head)
{
	mtp_identity("tiny-hybrid+mtp");
	mtp_identity("tiny-moe+mtp");
	mtp_identity("tiny-next+mtp");
}

/* The head's drafts depend only on its context: drafting after a context
 * built in pieces equals drafting after it built at once, and a position
 * that does not continue the context starts it again. */
KT_CASE(mtp_head_context_pieces_equal_whole)
{
	struct ke_model *m = load_model("tiny-hybrid+mtp");
	KT_REQUIRE(m);
	int D = ke_model_config(m)->hidden, V = ke_model_config(m)->vocab;
	float *h = malloc(40 * (size_t)D * sizeof *h);
	int32_t next[40], a[8], b[8];
	for (int i = 0; i < 40 * D; i++)
		h[i] = (float)((int)(kt_rand(&g_seed) % 2001) - 1000) / 500.0f;
	for (int i = 0; i < 40; i++)
		next[i] = (int32_t)(kt_rand(&g_seed) % (uint64_t)V);
	struct ke_mtp_seq *x = NULL, *y = NULL;
	KT_OK(ke_mtp_seq_create(m, &x));
	KT_OK(ke_mtp_seq_create(m, &y));
	KT_EQ_INT(ke_mtp_seq_draft(x, 100, h, next, 40, 6, a), 6);
	KT_EQ_INT(ke_mtp_seq_context(x), 40);
	int at = 0;
	for (int piece = 7; at < 40; piece += 3) {
		int n = 40 - at < piece ? 40 - at : piece;
		KT_EQ_INT(ke_mtp_seq_draft(y, 100 + at, h + (size_t)at * D, next + at, n, at + n == 40 ? 6 : 2, b), at + n == 40 ? 6 : 2);
		at += n;
	}
	KT_CHECK(!memcmp(a, b, sizeof a[0] * 6));
	/* a jump back restarts the context */
	KT_EQ_INT(ke_mtp_seq_draft(y, 5, h, next, 3, 1, b), 1);
	KT_EQ_INT(ke_mtp_seq_context(y), 3);
	KT_EQ_INT(ke_mtp_seq_draft(x, 0, h, next, 0, 1, b), KV_ERR_INVALID);
	ke_mtp_seq_destroy(x);
	ke_mtp_seq_destroy(y);
	free(h);
	ke_model_destroy(m);
}

/* Every CPU path: speculative decoding on the path against plain decoding
 * on the scalar path. */
KT_CASE(on_equals_off_on_every_cpu_path)
{
	if (ke_isa_best() == KE_ISA_SCALAR) {
		kt_skip("this CPU has only the scalar path");
		return;
	}
	int saved = ke_isa();
	const char *presets[] = {"tiny-hybrid", "tiny-dense"};
	for (int k = 0; k < 2; k++) {
		struct ke_model *m = load_model(presets[k]);
		KT_REQUIRE(m);
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
			struct tally t = {0};
			uint64_t seed = g_seed;
			ke_isa_set(KE_ISA_SCALAR);
			struct job ref = {.m = m, .temp = 0.8, .pk.V = ke_model_config(m)->vocab};
			make_prompt(&ref);
			struct kc_policy pol;
			kc_policy_default(&pol, ke_model_layout(m)->snapshot_bytes > 0);
			struct kc_params cp = {.layout = ke_model_layout(m), .policy = &pol, .ns = {7, 8}};
			KT_OK(kc_cache_create(&cp, &ref.c));
			struct job got = ref;
			job_main(&ref);
			ke_isa_set(isa);
			got.spec = KSS_SPEC_AUTO;
			kc_cache_destroy(ref.c);
			KT_OK(kc_cache_create(&cp, &got.c));
			job_main(&got);
			KT_OK(ref.rc);
			KT_OK(got.rc);
			KT_CHECKF(ref.pk.n == got.pk.n && !memcmp(ref.pk.tok, got.pk.tok, sizeof ref.pk.tok) &&
					  !memcmp(ref.pk.lp, got.pk.lp, (size_t)ref.pk.n * 4),
				  "%s: speculative on %s differs from plain scalar", presets[k], ke_isa_name(isa));
			kc_cache_destroy(got.c);
			(void)seed;
			(void)t;
		}
		ke_isa_set(saved);
		ke_model_destroy(m);
	}
}

/* --- what the cache keeps ---------------------------------------------------- */

/*
 * Three turns of a session with speculative decoding: each turn's prompt
 * is the previous prompt + its answer + new tokens, run on a cache that
 * keeps the turns (it resumes each turn from the one before, answer
 * included). The same turns on a fresh cache each time (cold) with
 * speculation off give the same tokens and logprobs, and the prompt's
 * logits: the cache held only what plain decoding would have.
 */
static void cached_equals_cold(const char *preset)
{
	struct ke_model *m = load_model(preset);
	KT_REQUIRE(m);
	struct kc_policy pol;
	kc_policy_default(&pol, ke_model_layout(m)->snapshot_bytes > 0);
	struct kc_params cp = {.layout = ke_model_layout(m), .policy = &pol, .ns = {9, 10}};
	struct kc_cache *warm = NULL;
	KT_OK(kc_cache_create(&cp, &warm));
	int V = ke_model_config(m)->vocab;
	struct job a = {.m = m, .c = warm, .temp = 0.0, .spec = KSS_SPEC_AUTO, .pk.V = V};
	make_prompt(&a);
	a.n = 90;
	uint32_t resumed_max = 0;
	for (int turn = 0; turn < 3; turn++) {
		struct job b = a;
		b.spec = 0;
		KT_OK(kc_cache_create(&cp, &b.c));
		job_main(&a);
		job_main(&b);
		KT_OK(a.rc);
		KT_OK(b.rc);
		KT_CHECKF(a.pk.n == b.pk.n && !memcmp(a.pk.tok, b.pk.tok, (size_t)a.pk.n * 4) &&
				  !memcmp(a.pk.lp, b.pk.lp, (size_t)a.pk.n * 4),
			  "%s turn %d: cached speculative differs from cold plain", preset, turn);
		if (turn)
			KT_CHECKF(a.r.resumed >= a.n - (uint32_t)GEN - 12,
				  "%s turn %d resumed at %u of %u: the previous turn's answer was not reused", preset, turn,
				  a.r.resumed, a.n);
		resumed_max = a.r.resumed > resumed_max ? a.r.resumed : resumed_max;
		kc_cache_destroy(b.c);
		/* next turn: prompt + the answer + a few new tokens */
		uint32_t n = a.n;
		for (int i = 0; i < a.pk.n && n < 290; i++)
			a.prompt[n++] = a.pk.tok[i];
		for (int i = 0; i < 5; i++)
			a.prompt[n++] = rnd(20, 600);
		a.n = n;
	}
	KT_CHECK(resumed_max > 90);
	kc_cache_destroy(warm);
	ke_model_destroy(m);
}

KT_CASE(cached_equals_cold_after_speculative_turns)
{
	cached_equals_cold("tiny-dense");
	cached_equals_cold("tiny-hybrid");
}

/* The Mamba-2 hybrids: conv and SSM state out of place, rejected rows
 * taken back by replaying the kept ones (mamba.c ke_mamba_replay); q8_0
 * KV on a hybrid's attention layer too. */
KT_CASE(on_equals_off_mamba)
{
	identity_case("tiny-granite-h");
	identity_case("tiny-nemotron-h");
	identity_case("tiny-granite-h-q8kv+q8");
}

KT_MAIN(lookup_drafts_what_followed_the_longest_match, lookup_follows_the_text_being_copied, lookup_index_is_bounded_and_checked,
	policy_turns_off_and_comes_back, on_equals_off_dense, on_equals_off_hybrid, on_equals_off_q8_kv,
	on_equals_off_moe, on_equals_off_on_every_cpu_path, on_equals_off_with_the_mtp_head, mtp_head_context_pieces_equal_whole,
	cached_equals_cold_after_speculative_turns, on_equals_off_mamba)
