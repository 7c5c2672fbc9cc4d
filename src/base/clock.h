/*
 * clock.h - monotonic and wall clocks.
 */
#ifndef KV_BASE_CLOCK_H
#define KV_BASE_CLOCK_H

#include <stdint.h>

/* Monotonic nanoseconds since an arbitrary origin. */
uint64_t kv_now_ns(void);
/* Monotonic seconds as a double. */
double kv_now_s(void);
/* Wall clock, seconds since the epoch. */
int64_t kv_wall_s(void);
/* Wall clock, milliseconds since the epoch. */
int64_t kv_wall_ms(void);
/* Sleep (restarts on EINTR). */
void kv_sleep_ms(uint64_t ms);

#endif
