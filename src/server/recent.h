/*
 * recent.h - the last requests and running totals, for the dashboard.
 *
 * A fixed ring of KSV_RECENT_MAX request records (the newest replace the
 * oldest) and counters that only grow; the dashboard's state route
 * (dashboard.h) turns them into JSON and the page computes rates from two
 * readings. Thread-safe; nothing is allocated after create, except the
 * JSON of a miss explanation kept with its record.
 */
#ifndef KV_SERVER_RECENT_H
#define KV_SERVER_RECENT_H

#include <jansson.h>
#include <stdint.h>

#define KSV_RECENT_MAX 64

struct ksv_recent_req {
	int64_t t_ms;               /* wall clock at the answer */
	char route[32];
	char resume[8];             /* miss / hit / snap / anchor */
	uint32_t prompt_tokens;
	uint32_t cached_ram;        /* prompt tokens the RAM tier served */
	uint32_t cached_disk;       /* ... loaded from the disk tier for this request */
	uint32_t cached_remote;     /* ... loaded from the remote tier beyond the disk's */
	uint32_t gen_tokens;
	double ttft_ms, prefill_ms, decode_ms;
	json_t *miss;               /* explain.h JSON, owned by the ring (NULL: none) */
	int salted;                 /* the request's namespace had a salt */
};

struct ksv_recent;

int ksv_recent_create(struct ksv_recent **out);
void ksv_recent_destroy(struct ksv_recent *r);
/* Copies *q; takes the reference in q->miss. */
void ksv_recent_add(struct ksv_recent *r, const struct ksv_recent_req *q);
/* {"requests": [... oldest first], "counters": {...}} merged into obj.
 * text_default / text_salted: whether a record's miss explanation keeps
 * its prompt text ("new", "cached") for records of the default namespace
 * and of salted ones; without, the positions, message, role and tool
 * remain. */
void ksv_recent_json(struct ksv_recent *r, json_t *obj, int text_default, int text_salted);

#endif
