/*
 * hash.h - XXH3 (through libxxhash) and CRC32C (Castagnoli).
 *
 * XXH3-128 names blocks (chain hashes) and content-addressed files;
 * XXH3-64 keys hash tables; CRC32C guards file payloads. CRC32C uses the
 * SSE4.2 instruction when the CPU has it and a table otherwise; both give
 * crc32c("123456789") = 0xE3069283.
 */
#ifndef KV_BASE_HASH_H
#define KV_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

struct kv_h128 {
	uint64_t lo, hi;
};

uint64_t kv_xxh3_64(const void *p, size_t n, uint64_t seed);
struct kv_h128 kv_xxh3_128(const void *p, size_t n, uint64_t seed);
/* XXH3-128 of the concatenation a || b (no copy). */
struct kv_h128 kv_xxh3_128_cat(const void *a, size_t an, const void *b, size_t bn);
/* Streaming XXH3-128 (same value as kv_xxh3_128 with seed 0 over the
 * concatenation of every update). create returns NULL without memory;
 * digest does not free the state. */
struct kv_xxh3_stream;
struct kv_xxh3_stream *kv_xxh3_stream_create(void);
void kv_xxh3_stream_update(struct kv_xxh3_stream *st, const void *p, size_t n);
struct kv_h128 kv_xxh3_stream_digest(const struct kv_xxh3_stream *st);
void kv_xxh3_stream_free(struct kv_xxh3_stream *st);
int kv_h128_eq(struct kv_h128 a, struct kv_h128 b);
/* 32 lowercase hex chars + NUL: hi then lo, big-endian digits. */
void kv_h128_hex(struct kv_h128 h, char out[33]);
/* Parse 32 hex chars; returns 0 on success. */
int kv_h128_parse(const char *s, struct kv_h128 *out);

/* CRC32C with the usual init/final xor; crc = kv_crc32c(crc, p, n) chains
 * (start with 0). */
uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n);
/* The table version, kept as the reference the tests compare with. */
uint32_t kv_crc32c_sw(uint32_t crc, const void *p, size_t n);

#endif
