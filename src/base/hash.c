/*
 * hash.c - see hash.h.
 */
#include "base/hash.h"
#include "base/utf8.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t kv_xxh3_64(const void *p, size_t n, uint64_t seed)
{
	return XXH3_64bits_withSeed(p, n, seed);
}

struct kv_h128 kv_xxh3_128(const void *p, size_t n, uint64_t seed)
{
	XXH128_hash_t h = XXH3_128bits_withSeed(p, n, seed);
	return (struct kv_h128){h.low64, h.high64};
}

struct kv_h128 kv_xxh3_128_cat(const void *a, size_t an, const void *b, size_t bn)
{
	XXH3_state_t st;
	XXH128_hash_t h;
	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, a, an);
	XXH3_128bits_update(&st, b, bn);
	h = XXH3_128bits_digest(&st);
	return (struct kv_h128){h.low64, h.high64};
}

struct kv_xxh3_stream *kv_xxh3_stream_create(void)
{
	XXH3_state_t *st = XXH3_createState();
	if (st)
		XXH3_128bits_reset(st);
	return (struct kv_xxh3_stream *)st;
}

void kv_xxh3_stream_update(struct kv_xxh3_stream *st, const void *p, size_t n)
{
	XXH3_128bits_update((XXH3_state_t *)st, p, n);
}

struct kv_h128 kv_xxh3_stream_digest(const struct kv_xxh3_stream *st)
{
	XXH128_hash_t h = XXH3_128bits_digest((const XXH3_state_t *)st);
	return (struct kv_h128){h.low64, h.high64};
}

void kv_xxh3_stream_free(struct kv_xxh3_stream *st)
{
	XXH3_freeState((XXH3_state_t *)st);
}

int kv_h128_eq(struct kv_h128 a, struct kv_h128 b)
{
	return a.lo == b.lo && a.hi == b.hi;
}

void kv_h128_hex(struct kv_h128 h, char out[33])
{
	snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
}

int kv_h128_parse(const char *s, struct kv_h128 *out)
{
	uint64_t v[2] = {0, 0};
	for (int i = 0; i < 32; i++) {
		int d = kv_hex_digit((unsigned char)s[i]);
		if (d < 0)
			return -1;
		v[i / 16] = (v[i / 16] << 4) | (uint64_t)d;
	}
	if (s[32] != 0)
		return -1;
	out->hi = v[0];
	out->lo = v[1];
	return 0;
}

/* --- CRC32C ------------------------------------------------------------ */

static uint32_t g_tab[8][256];
static pthread_once_t g_tab_once = PTHREAD_ONCE_INIT;

static void make_tab(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		g_tab[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			g_tab[t][i] = (g_tab[t - 1][i] >> 8) ^ g_tab[0][g_tab[t - 1][i] & 0xff];
}

uint32_t kv_crc32c_sw(uint32_t crc, const void *p, size_t n)
{
	const uint8_t *b = p;
	pthread_once(&g_tab_once, make_tab);
	crc = ~crc;
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, b, 8);
		w ^= crc;
		crc = g_tab[7][w & 0xff] ^ g_tab[6][(w >> 8) & 0xff] ^ g_tab[5][(w >> 16) & 0xff] ^
		      g_tab[4][(w >> 24) & 0xff] ^ g_tab[3][(w >> 32) & 0xff] ^ g_tab[2][(w >> 40) & 0xff] ^
		      g_tab[1][(w >> 48) & 0xff] ^ g_tab[0][w >> 56];
		b += 8;
		n -= 8;
	}
	while (n--)
		crc = (crc >> 8) ^ g_tab[0][(crc ^ *b++) & 0xff];
	return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t c = ~crc;
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, b, 8);
		c = __builtin_ia32_crc32di(c, w);
		b += 8;
		n -= 8;
	}
	uint32_t c32 = (uint32_t)c;
	while (n--)
		c32 = __builtin_ia32_crc32qi(c32, *b++);
	return ~c32;
}
#endif

uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n)
{
#if defined(__x86_64__)
	static int have = -1;
	if (have < 0)
		have = __builtin_cpu_supports("sse4.2") ? 1 : 0;
	if (have)
		return crc_hw(crc, p, n);
#endif
	return kv_crc32c_sw(crc, p, n);
}
