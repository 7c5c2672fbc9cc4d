/*
 * clock.c - see clock.h.
 */
#include "base/clock.h"

#include <errno.h>
#include <time.h>

uint64_t kv_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double kv_now_s(void)
{
	return (double)kv_now_ns() / 1e9;
}

int64_t kv_wall_s(void)
{
	return (int64_t)time(NULL);
}

int64_t kv_wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void kv_sleep_ms(uint64_t ms)
{
	struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}
