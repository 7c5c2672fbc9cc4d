/*
 * metrics.c - see metrics.h.
 *
 * Families and series are small arrays searched linearly: a registry holds
 * a few dozen families and a family a handful of label sets, so a lookup
 * is a few string compares. One mutex guards every value.
 */
#include "server/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ksv_series {
	struct ksv_family *fam;
	char *labels;          /* rendered: k="v",k2="v2" ("" for none) */
	double value;          /* counter/gauge */
	double sum;            /* histogram */
	double count;
	double *buckets;       /* histogram: per-bucket counts (not cumulative) */
};

struct ksv_family {
	struct ksv_metrics *m;
	char *name, *help;
	int type;
	double *bounds;
	int n_bounds;
	struct ksv_series **series;
	size_t n_series, cap_series;
};

struct collector {
	void (*fn)(void *ctx, struct ksv_metrics *m);
	void *ctx;
};

struct ksv_metrics {
	pthread_mutex_t mu;
	struct ksv_family **fams;
	size_t n_fams, cap_fams;
	struct collector *colls;
	size_t n_colls;
};

struct ksv_metrics *ksv_metrics_create(void)
{
	struct ksv_metrics *m = calloc(1, sizeof *m);
	if (m)
		pthread_mutex_init(&m->mu, NULL);
	return m;
}

void ksv_metrics_destroy(struct ksv_metrics *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n_fams; i++) {
		struct ksv_family *f = m->fams[i];
		for (size_t j = 0; j < f->n_series; j++) {
			free(f->series[j]->labels);
			free(f->series[j]->buckets);
			free(f->series[j]);
		}
		free(f->series);
		free(f->bounds);
		free(f->name);
		free(f->help);
		free(f);
	}
	free(m->fams);
	free(m->colls);
	pthread_mutex_destroy(&m->mu);
	free(m);
}

static int valid_name(const char *s, int label)
{
	if (!s || !*s)
		return 0;
	for (const char *p = s; *p; p++) {
		char c = *p;
		int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':');
		if (!alpha && !(p > s && c >= '0' && c <= '9'))
			return 0;
	}
	return 1;
}

struct ksv_family *ksv_metrics_family(struct ksv_metrics *m, const char *name, const char *help, int type,
				      const double *buckets, int n_buckets)
{
	struct ksv_family *f = NULL;
	if (!m || !valid_name(name, 0) || type < KSV_COUNTER || type > KSV_HISTOGRAM || n_buckets < 0)
		return NULL;
	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; i < m->n_fams; i++)
		if (!strcmp(m->fams[i]->name, name)) {
			f = m->fams[i];
			goto out;
		}
	if (m->n_fams == m->cap_fams) {
		size_t nc = m->cap_fams ? m->cap_fams * 2 : 32;
		struct ksv_family **nf = realloc(m->fams, nc * sizeof *nf);
		if (!nf)
			goto out;
		m->fams = nf;
		m->cap_fams = nc;
	}
	f = calloc(1, sizeof *f);
	if (!f)
		goto out;
	f->m = m;
	f->type = type;
	f->name = strdup(name);
	f->help = strdup(help ? help : "");
	if (type == KSV_HISTOGRAM && n_buckets > 0) {
		f->bounds = malloc((size_t)n_buckets * sizeof *f->bounds);
		if (f->bounds)
			memcpy(f->bounds, buckets, (size_t)n_buckets * sizeof *f->bounds);
		f->n_bounds = n_buckets;
	}
	if (!f->name || !f->help || (type == KSV_HISTOGRAM && n_buckets > 0 && !f->bounds)) {
		free(f->name);
		free(f->help);
		free(f->bounds);
		free(f);
		f = NULL;
		goto out;
	}
	m->fams[m->n_fams++] = f;
out:
	pthread_mutex_unlock(&m->mu);
	return f;
}

static void add_escaped(char **p, size_t *len, size_t *cap, const char *s)
{
	for (; *s; s++) {
		char tmp[3];
		size_t n = 1;
		tmp[0] = *s;
		if (*s == '\\' || *s == '"') {
			tmp[0] = '\\';
			tmp[1] = *s;
			n = 2;
		} else if (*s == '\n') {
			tmp[0] = '\\';
			tmp[1] = 'n';
			n = 2;
		}
		if (*len + n + 1 > *cap) {
			size_t nc = (*cap + n + 1) * 2;
			char *np = realloc(*p, nc);
			if (!np)
				return;
			*p = np;
			*cap = nc;
		}
		memcpy(*p + *len, tmp, n);
		*len += n;
		(*p)[*len] = 0;
	}
}

struct ksv_series *ksv_series_get(struct ksv_family *f, ...)
{
	va_list ap;
	size_t len = 0, cap = 64;
	char *lab;
	struct ksv_series *s = NULL;

	if (!f)
		return NULL;
	lab = malloc(cap);
	if (!lab)
		return NULL;
	lab[0] = 0;
	va_start(ap, f);
	for (;;) {
		const char *k = va_arg(ap, const char *);
		if (!k)
			break;
		const char *v = va_arg(ap, const char *);
		if (!valid_name(k, 1)) {
			va_end(ap);
			free(lab);
			return NULL;
		}
		if (len)
			add_escaped(&lab, &len, &cap, ",");
		add_escaped(&lab, &len, &cap, k);
		/* '=' and the quotes are not escaped: append them raw */
		if (len + 3 > cap) {
			char *np = realloc(lab, cap * 2 + 3);
			if (!np) {
				va_end(ap);
				free(lab);
				return NULL;
			}
			lab = np;
			cap = cap * 2 + 3;
		}
		lab[len++] = '=';
		lab[len++] = '"';
		lab[len] = 0;
		add_escaped(&lab, &len, &cap, v ? v : "");
		if (len + 2 > cap) {
			char *np = realloc(lab, cap * 2 + 2);
			if (!np) {
				va_end(ap);
				free(lab);
				return NULL;
			}
			lab = np;
			cap = cap * 2 + 2;
		}
		lab[len++] = '"';
		lab[len] = 0;
	}
	va_end(ap);

	pthread_mutex_lock(&f->m->mu);
	for (size_t i = 0; i < f->n_series; i++)
		if (!strcmp(f->series[i]->labels, lab)) {
			s = f->series[i];
			goto out;
		}
	if (f->n_series == f->cap_series) {
		size_t nc = f->cap_series ? f->cap_series * 2 : 8;
		struct ksv_series **ns = realloc(f->series, nc * sizeof *ns);
		if (!ns)
			goto out;
		f->series = ns;
		f->cap_series = nc;
	}
	s = calloc(1, sizeof *s);
	if (!s)
		goto out;
	s->fam = f;
	if (f->type == KSV_HISTOGRAM) {
		s->buckets = calloc((size_t)f->n_bounds + 1, sizeof *s->buckets);
		if (!s->buckets) {
			free(s);
			s = NULL;
			goto out;
		}
	}
	s->labels = lab;
	lab = NULL;
	f->series[f->n_series++] = s;
out:
	pthread_mutex_unlock(&f->m->mu);
	free(lab);
	return s;
}

void ksv_series_add(struct ksv_series *s, double v)
{
	if (!s)
		return;
	if (s->fam->type == KSV_COUNTER && !(v >= 0))
		return;
	pthread_mutex_lock(&s->fam->m->mu);
	s->value += v;
	pthread_mutex_unlock(&s->fam->m->mu);
}

void ksv_series_set(struct ksv_series *s, double v)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->fam->m->mu);
	s->value = v;
	pthread_mutex_unlock(&s->fam->m->mu);
}

void ksv_series_observe(struct ksv_series *s, double v)
{
	if (!s || s->fam->type != KSV_HISTOGRAM)
		return;
	pthread_mutex_lock(&s->fam->m->mu);
	int b = 0;
	while (b < s->fam->n_bounds && !(v <= s->fam->bounds[b]))
		b++;
	s->buckets[b] += 1;
	s->sum += v;
	s->count += 1;
	pthread_mutex_unlock(&s->fam->m->mu);
}

void ksv_metrics_add(struct ksv_family *f, double v)
{
	ksv_series_add(ksv_series_get(f, NULL), v);
}

void ksv_metrics_set(struct ksv_family *f, double v)
{
	ksv_series_set(ksv_series_get(f, NULL), v);
}

void ksv_metrics_observe(struct ksv_family *f, double v)
{
	ksv_series_observe(ksv_series_get(f, NULL), v);
}

int ksv_metrics_on_scrape(struct ksv_metrics *m, void (*fn)(void *ctx, struct ksv_metrics *m), void *ctx)
{
	pthread_mutex_lock(&m->mu);
	struct collector *nc = realloc(m->colls, (m->n_colls + 1) * sizeof *nc);
	if (!nc) {
		pthread_mutex_unlock(&m->mu);
		return -1;
	}
	m->colls = nc;
	m->colls[m->n_colls].fn = fn;
	m->colls[m->n_colls].ctx = ctx;
	m->n_colls++;
	pthread_mutex_unlock(&m->mu);
	return 0;
}

static void put_num(struct kv_buf *out, double v)
{
	if (isnan(v))
		kv_buf_adds(out, "NaN");
	else if (isinf(v))
		kv_buf_adds(out, v > 0 ? "+Inf" : "-Inf");
	else if (v == (double)(long long)v && fabs(v) < 9.0e15)
		kv_buf_printf(out, "%lld", (long long)v);
	else
		kv_buf_printf(out, "%.17g", v);
}

static void put_help(struct kv_buf *out, const char *help)
{
	/* HELP text escapes only backslash and newline */
	for (const char *p = help; *p; p++) {
		if (*p == '\\')
			kv_buf_adds(out, "\\\\");
		else if (*p == '\n')
			kv_buf_adds(out, "\\n");
		else
			kv_buf_addc(out, *p);
	}
}

void ksv_metrics_render(struct ksv_metrics *m, struct kv_buf *out)
{
	static const char *tnames[] = {"counter", "gauge", "histogram"};
	size_t nc;
	struct collector *cs;

	/* collectors take the lock themselves through the setters */
	pthread_mutex_lock(&m->mu);
	nc = m->n_colls;
	cs = nc ? malloc(nc * sizeof *cs) : NULL;
	if (cs)
		memcpy(cs, m->colls, nc * sizeof *cs);
	pthread_mutex_unlock(&m->mu);
	for (size_t i = 0; cs && i < nc; i++)
		cs[i].fn(cs[i].ctx, m);
	free(cs);

	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; i < m->n_fams; i++) {
		struct ksv_family *f = m->fams[i];
		kv_buf_printf(out, "# HELP %s ", f->name);
		put_help(out, f->help);
		kv_buf_printf(out, "\n# TYPE %s %s\n", f->name, tnames[f->type]);
		for (size_t j = 0; j < f->n_series; j++) {
			struct ksv_series *s = f->series[j];
			if (f->type != KSV_HISTOGRAM) {
				kv_buf_adds(out, f->name);
				if (s->labels[0])
					kv_buf_printf(out, "{%s}", s->labels);
				kv_buf_addc(out, ' ');
				put_num(out, s->value);
				kv_buf_addc(out, '\n');
				continue;
			}
			double cum = 0;
			for (int b = 0; b <= f->n_bounds; b++) {
				cum += s->buckets[b];
				kv_buf_printf(out, "%s_bucket{%s%sle=\"", f->name, s->labels, s->labels[0] ? "," : "");
				if (b < f->n_bounds)
					put_num(out, f->bounds[b]);
				else
					kv_buf_adds(out, "+Inf");
				kv_buf_adds(out, "\"} ");
				put_num(out, cum);
				kv_buf_addc(out, '\n');
			}
			kv_buf_printf(out, "%s_sum%s%s%s ", f->name, s->labels[0] ? "{" : "", s->labels,
				      s->labels[0] ? "}" : "");
			put_num(out, s->sum);
			kv_buf_printf(out, "\n%s_count%s%s%s ", f->name, s->labels[0] ? "{" : "", s->labels,
				      s->labels[0] ? "}" : "");
			put_num(out, s->count);
			kv_buf_addc(out, '\n');
		}
	}
	pthread_mutex_unlock(&m->mu);
}
