/*
 * spec.c - see spec.h.
 *
 * The numbers (priors, decays) were chosen on `kvkeep bench spec`
 * (docs/engine.md, "Speculative decoding"): they decide speed only, never
 * an output.
 */
#include "session/spec.h"
#include "session/lookup.h"
#include "base/err.h"
#include "engine/seq.h"

#include <stdlib.h>
#include <string.h>

#define N_LCLASS 4            /* lookup match classes: 1, 2-3, 4-7, 8+ tokens */
#define EST_MTP N_LCLASS
#define N_EST (N_LCLASS + 1)
#define OBS_DECAY 0.9         /* weight of older observations at each new one */
#define IDLE_DECAY 0.99       /* per step: evidence fades back toward the prior */
#define PRIOR_WEIGHT 1.0      /* the prior counts as this many draft positions */
#define WIN 16                /* cost observations kept */
#define FORGET 32             /* plain steps after which the oldest cost observation goes */
#define A_PRIOR 0.15
#define B_PRIOR 0.25

/* Prior acceptance per estimator: a one-token match says little, a long
 * one that the text is being copied; the MTP head's first tokens are
 * usually right on real models. */
static const double g_prior[N_EST] = {0.15, 0.35, 0.6, 0.8, 0.6};

struct est {
	double s, t;              /* decayed kept / tried draft positions */
};

/*
 * A window of cost observations. Step times on a shared machine are the
 * step's cost plus whatever other jobs took: the unit (a plain step) is
 * the smallest of the recent ones, a ratio is the median of the recent
 * ones, so a step that waited behind another process moves neither. A
 * window with fewer than 3 observations gives the prior, and observations
 * are forgotten while none come (FORGET), so an estimate that turned
 * drafting off cannot keep it off: it goes back to the prior.
 */
struct win {
	double v[WIN];
	int n, next;
};

static void win_push(struct win *w, double x)
{
	w->v[w->next] = x;
	w->next = (w->next + 1) % WIN;
	if (w->n < WIN)
		w->n++;
}

static void win_forget(struct win *w)
{
	if (w->n)
		w->n--; /* the oldest: the ring's entries before next - n are stale */
}

static double win_min(const struct win *w)
{
	double m = 0.0;
	for (int i = 0; i < w->n; i++) {
		double x = w->v[(w->next - 1 - i + WIN) % WIN];
		m = !i || x < m ? x : m;
	}
	return m;
}

static double win_median(const struct win *w, double prior)
{
	double t[WIN];
	if (w->n < 3)
		return prior;
	for (int i = 0; i < w->n; i++)
		t[i] = w->v[(w->next - 1 - i + WIN) % WIN];
	for (int i = 1; i < w->n; i++) /* insertion sort: 16 values */
		for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
			double x = t[j];
			t[j] = t[j - 1];
			t[j - 1] = x;
		}
	return w->n % 2 ? t[w->n / 2] : (t[w->n / 2 - 1] + t[w->n / 2]) / 2;
}

struct kss_spec {
	struct kss_spec_params p;
	struct kss_lookup *lk;    /* NULL when the mode has no lookup */
	struct est est[N_EST];
	struct win t1;            /* one-row decode steps, seconds (the unit: their minimum) */
	struct win a;             /* cost of each verified row beyond the first, in steps */
	struct win b;             /* MTP cost per draft token, in steps */
	int quiet;                /* plain steps since the last cost observation */
	struct kss_spec_stats st;
	int last_draft_src;       /* the estimator of the last draft */
};

int kss_spec_mode_parse(const char *s)
{
	static const char *const names[] = {"off", "lookup", "mtp", "auto"};
	for (int i = 0; s && i < 4; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

const char *kss_spec_mode_name(int mode)
{
	static const char *const names[] = {"off", "lookup", "mtp", "auto"};
	return mode >= 0 && mode < 4 ? names[mode] : "?";
}

int kss_spec_create(const struct kss_spec_params *p, const int32_t *prompt, uint32_t n, struct kss_spec **out)
{
	int rc;
	*out = NULL;
	if (p->mode == KSS_SPEC_OFF || (p->mode == KSS_SPEC_MTP && !p->mtp))
		return KV_OK;
	if (p->mode < 0 || p->mode > KSS_SPEC_AUTO || p->max_draft < 1 || p->max_draft > KE_SPEC_MAX_ROWS - 1)
		return kv_fail(KV_ERR_INVALID, "speculative decoding: mode %d, max_draft %d (1..%d)", p->mode, p->max_draft,
			       KE_SPEC_MAX_ROWS - 1);
	struct kss_spec *sp = calloc(1, sizeof *sp);
	if (!sp)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	sp->p = *p;
	if (p->mode != KSS_SPEC_AUTO && p->mode != KSS_SPEC_MTP)
		sp->p.mtp = NULL;
	if (p->mode != KSS_SPEC_MTP) {
		if ((rc = kss_lookup_create(n + 4096, &sp->lk)) || (rc = kss_lookup_append(sp->lk, prompt, n))) {
			kss_spec_destroy(sp);
			return rc;
		}
	}
	*out = sp;
	return KV_OK;
}

void kss_spec_destroy(struct kss_spec *sp)
{
	if (!sp)
		return;
	kss_lookup_destroy(sp->lk);
	free(sp);
}

int kss_spec_append(struct kss_spec *sp, int32_t tok)
{
	return sp->lk ? kss_lookup_append(sp->lk, &tok, 1) : KV_OK;
}

const struct kss_spec_stats *kss_spec_stats(const struct kss_spec *sp)
{
	return &sp->st;
}

static double est_p(const struct kss_spec *sp, int e)
{
	const struct est *x = &sp->est[e];
	return (x->s + g_prior[e] * PRIOR_WEIGHT) / (x->t + PRIOR_WEIGHT);
}

static int lclass(int match)
{
	return match >= 8 ? 3 : match >= 4 ? 2 : match >= 2 ? 1 : 0;
}

/* The k in [1, kmax] with the best expected tokens per unit of time for
 * acceptance p and costs a (per verified row) and b (per draft token);
 * *gain: that ratio against plain decoding (1). */
static int best_k(double p, double a, double b, int kmax, double *gain)
{
	double e = 1.0, pk = 1.0, best = 0.0;
	int k_best = 0;
	for (int k = 1; k <= kmax; k++) {
		pk *= p;
		e += pk;
		double g = e / (1.0 + (a + b) * k);
		if (g > best) {
			best = g;
			k_best = k;
		}
	}
	*gain = best;
	return k_best;
}

int kss_spec_draft(struct kss_spec *sp, int budget, int32_t *draft, int *src)
{
	int32_t buf[KE_SPEC_MAX_ROWS];
	double g_lk = 0.0, g_mtp = 0.0;
	int k_lk = 0, k_mtp = 0, match = 0, n_lk = 0;
	*src = -1;
	for (int e = 0; e < N_EST; e++) {
		sp->est[e].s *= IDLE_DECAY;
		sp->est[e].t *= IDLE_DECAY;
	}
	if (budget > sp->p.max_draft)
		budget = sp->p.max_draft;
	/* the first step of a sequence decodes plainly: its time is the unit
	 * the costs of verifications are measured in */
	if (budget < 1 || !sp->t1.n)
		return 0;
	double a = win_median(&sp->a, A_PRIOR), b = win_median(&sp->b, B_PRIOR);
	if (sp->lk && (n_lk = kss_lookup_draft(sp->lk, budget, buf, &match)) > 0)
		k_lk = best_k(est_p(sp, lclass(match)), a, 0.0, n_lk, &g_lk);
	if (sp->p.mtp)
		k_mtp = best_k(est_p(sp, EST_MTP), a, b, budget, &g_mtp);
	if (k_lk && g_lk >= KSS_SPEC_MIN_GAIN && g_lk >= g_mtp) {
		memcpy(draft, buf, (size_t)k_lk * sizeof *draft);
		*src = KSS_SRC_LOOKUP;
		sp->last_draft_src = lclass(match);
		return k_lk;
	}
	if (k_mtp && g_mtp >= KSS_SPEC_MIN_GAIN) {
		double secs = 0.0;
		int k = sp->p.mtp(sp->p.mtp_ctx, k_mtp, draft, &secs);
		sp->st.mtp_s_us += (uint64_t)(secs * 1e6);
		double t1 = win_min(&sp->t1);
		if (k > 0 && t1 > 0.0) {
			double bo = secs / t1 / k;
			win_push(&sp->b, bo < 0.001 ? 0.001 : bo > 5.0 ? 5.0 : bo);
		}
		if (k > 0) {
			*src = KSS_SRC_MTP;
			sp->last_draft_src = EST_MTP;
			return k;
		}
	}
	return 0;
}

void kss_spec_verified(struct kss_spec *sp, int src, int k, int accepted, double seconds)
{
	if (src < 0 || src >= KSS_SRC_N || k < 1)
		return;
	struct est *x = &sp->est[src == KSS_SRC_MTP ? EST_MTP : sp->last_draft_src];
	x->s = OBS_DECAY * x->s + accepted;
	x->t = OBS_DECAY * x->t + accepted + (accepted < k);
	sp->st.steps++;
	sp->st.drafted[src] += (uint64_t)k;
	sp->st.accepted[src] += (uint64_t)accepted;
	double t1 = win_min(&sp->t1);
	sp->quiet = 0;
	if (t1 > 0.0 && seconds > 0.0) {
		double ao = (seconds / t1 - 1.0) / k;
		win_push(&sp->a, ao < 0.005 ? 0.005 : ao > 3.0 ? 3.0 : ao);
	}
}

void kss_spec_plain(struct kss_spec *sp, double seconds)
{
	sp->st.plain_steps++;
	if (seconds > 0.0)
		win_push(&sp->t1, seconds);
	if (++sp->quiet % FORGET == 0) {
		win_forget(&sp->a);
		win_forget(&sp->b);
	}
}
