/*
 * kt.h - the unit-test harness.
 *
 * A test file defines cases with KT_CASE(name) { ... } and a table:
 *     KT_MAIN(case_a, case_b, ...)
 * Each case runs in order; KT_CHECK and friends record a failure with file
 * and line and let the case continue; KT_REQUIRE returns from the case.
 * Output, one line per case, read by tests/run.sh:
 *     ok <file>:<case>
 *     FAIL <file>:<case>: <first failed check>
 * The program exits 1 if any case failed. `./test_x case_b` runs one case.
 * KT_TMPDIR() gives a fresh empty folder per case under $TMPDIR, removed
 * when the case passes.
 */
#ifndef KV_TESTS_KT_H
#define KV_TESTS_KT_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern int kt_failed_checks;
void kt_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *kt_tmpdir(void);
/* Deterministic PRNG for tests (splitmix64). */
uint64_t kt_rand(uint64_t *state);
/* Run a shell command, return its exit status (-1 on failure to run). */
int kt_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Path of the kvkeep binary under test ($KT_BIN, else build/kvkeep). */
const char *kt_bin(void);
/* Mark the running case as not run here (e.g. the CPU lacks AVX2): unless
 * a check failed, it reports "skip <file>:<case>: why", never "ok". */
void kt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define KT_CASE(name) static void name(void)

#define KT_CHECK(cond) \
	do { if (!(cond)) kt_fail(__FILE__, __LINE__, "check failed: %s", #cond); } while (0)
#define KT_CHECKF(cond, ...) \
	do { if (!(cond)) kt_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)
#define KT_REQUIRE(cond) \
	do { if (!(cond)) { kt_fail(__FILE__, __LINE__, "required: %s", #cond); return; } } while (0)
#define KT_EQ_INT(a, b) \
	do { long long _a = (long long)(a), _b = (long long)(b); \
	     if (_a != _b) kt_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, _a, _b); } while (0)
#define KT_EQ_U64(a, b) \
	do { unsigned long long _a = (unsigned long long)(a), _b = (unsigned long long)(b); \
	     if (_a != _b) kt_fail(__FILE__, __LINE__, "%s == %s: %llu != %llu", #a, #b, _a, _b); } while (0)
#define KT_EQ_STR(a, b) \
	do { const char *_a = (a), *_b = (b); \
	     if (!_a || !_b || strcmp(_a, _b)) kt_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", \
	     #a, #b, _a ? _a : "(null)", _b ? _b : "(null)"); } while (0)
#define KT_OK(expr) \
	do { int _rc = (expr); if (_rc != 0) kt_fail(__FILE__, __LINE__, "%s returned %d: %s", #expr, _rc, \
	     kv_errmsg()); } while (0)

#define KT_MAIN(...) \
	int main(int argc, char **argv) \
	{ \
		static void (*fns[])(void) = {__VA_ARGS__}; \
		static const char names[] = #__VA_ARGS__; \
		return kt_main_list(argc, argv, __FILE__, fns, (int)(sizeof fns / sizeof fns[0]), names); \
	}
int kt_main_list(int argc, char **argv, const char *file, void (**fns)(void), int n, const char *names);

#endif
