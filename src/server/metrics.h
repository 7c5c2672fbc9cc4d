/*
 * metrics.h - a small Prometheus registry: counters, gauges and histograms
 * with labels, rendered in the text exposition format 0.0.4.
 *
 * Output format (what GET /metrics returns, Content-Type
 * "text/plain; version=0.0.4; charset=utf-8"), one block per family in
 * registration order:
 *
 *     # HELP kvkeep_requests_total HTTP requests by route and status.
 *     # TYPE kvkeep_requests_total counter
 *     kvkeep_requests_total{route="/v1/chat/completions",status="200"} 3
 *     # HELP kvkeep_ttft_seconds Time to first token.
 *     # TYPE kvkeep_ttft_seconds histogram
 *     kvkeep_ttft_seconds_bucket{le="0.05"} 1
 *     ...
 *     kvkeep_ttft_seconds_bucket{le="+Inf"} 3
 *     kvkeep_ttft_seconds_sum 0.42
 *     kvkeep_ttft_seconds_count 3
 *
 * Names must match [a-zA-Z_:][a-zA-Z0-9_:]* (checked at registration;
 * counters should end in _total). Label values are escaped (\\, \", \n).
 * Values print with %.17g (integers exactly), +Inf/-Inf/NaN as Prometheus
 * spells them.
 *
 * Series are created on first use and never removed; a family's series
 * print in creation order. Values are doubles under one mutex per
 * registry: cheap enough for per-request and per-token updates, and it
 * keeps every scrape consistent.
 *
 * Collectors: a callback registered with ksv_metrics_on_scrape runs at the
 * start of every render, so values owned by other modules (the cache's
 * counter struct, kv_mem_used per category) are copied in at scrape time.
 */
#ifndef KV_SERVER_METRICS_H
#define KV_SERVER_METRICS_H

#include <stddef.h>

#include "base/buf.h"

enum ksv_metric_type { KSV_COUNTER = 0, KSV_GAUGE = 1, KSV_HISTOGRAM = 2 };

struct ksv_metrics;
struct ksv_family;
struct ksv_series;

struct ksv_metrics *ksv_metrics_create(void);
void ksv_metrics_destroy(struct ksv_metrics *m);

/*
 * Register a family. `buckets` (ascending upper bounds, +Inf implied) is
 * for histograms only and is copied. Registering the same name twice
 * returns the first family. NULL on a bad name or out of memory. The
 * family lives as long as the registry.
 */
struct ksv_family *ksv_metrics_family(struct ksv_metrics *m, const char *name, const char *help, int type,
				      const double *buckets, int n_buckets);

/*
 * The series of a family for a label set, created on first use. `labels`
 * is a list of name/value pairs ending with NULL:
 *     ksv_series_get(f, "route", "/v1/models", "status", "200", NULL)
 * Values are escaped here. NULL when out of memory. Lives as long as the
 * registry; callers may keep the pointer.
 */
struct ksv_series *ksv_series_get(struct ksv_family *f, ...) __attribute__((sentinel));

/* Counter: add v (>= 0). Gauge: add v (any sign). */
void ksv_series_add(struct ksv_series *s, double v);
/* Gauge or counter: set the value (counters copied from another module's
 * monotonic counter at scrape time). */
void ksv_series_set(struct ksv_series *s, double v);
/* Histogram: count one observation. */
void ksv_series_observe(struct ksv_series *s, double v);

/* Shortcuts for label-less series. */
void ksv_metrics_add(struct ksv_family *f, double v);
void ksv_metrics_set(struct ksv_family *f, double v);
void ksv_metrics_observe(struct ksv_family *f, double v);

/* Run fn(ctx, m) at the start of every render (several may be added). */
int ksv_metrics_on_scrape(struct ksv_metrics *m, void (*fn)(void *ctx, struct ksv_metrics *m), void *ctx);

/* Append the whole exposition text to out. */
void ksv_metrics_render(struct ksv_metrics *m, struct kv_buf *out);

#define KSV_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
