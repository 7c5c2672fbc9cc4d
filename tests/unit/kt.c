/*
 * kt.c - see kt.h.
 */
#include "kt.h"
#include "base/err.h"

#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

int kt_failed_checks;
static char g_first[1024];
static char g_tmp[512];
static const char *g_case;

void kt_fail(const char *file, int line, const char *fmt, ...)
{
	char msg[900];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (!kt_failed_checks)
		snprintf(g_first, sizeof g_first, "%s:%d: %s", file, line, msg);
	fprintf(stderr, "  %s:%d: [%s] %s\n", file, line, g_case ? g_case : "?", msg);
	kt_failed_checks++;
}

const char *kt_tmpdir(void)
{
	if (!g_tmp[0]) {
		const char *t = getenv("TMPDIR");
		snprintf(g_tmp, sizeof g_tmp, "%s/kt.XXXXXX", t && *t ? t : "/tmp");
		if (!mkdtemp(g_tmp)) {
			perror("mkdtemp");
			exit(2);
		}
	}
	return g_tmp;
}

uint64_t kt_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

int kt_sh(const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	int r = system(cmd);
	if (r == -1)
		return -1;
	return WIFEXITED(r) ? WEXITSTATUS(r) : 128 + WTERMSIG(r);
}

static char g_skip[512];

void kt_skip(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(g_skip, sizeof g_skip, fmt, ap);
	va_end(ap);
	if (!g_skip[0])
		snprintf(g_skip, sizeof g_skip, "skipped");
}

const char *kt_bin(void)
{
	const char *b = getenv("KT_BIN");
	return b && *b ? b : "build/kvkeep";
}

static void name_at(const char *names, int idx, char *out, size_t cap)
{
	const char *p = names;
	for (int i = 0; i < idx && p; i++) {
		p = strchr(p, ',');
		if (p)
			p++;
	}
	if (!p) {
		snprintf(out, cap, "case%d", idx);
		return;
	}
	while (*p == ' ' || *p == '\n' || *p == '\t')
		p++;
	size_t n = strcspn(p, ", \t\n");
	if (n >= cap)
		n = cap - 1;
	memcpy(out, p, n);
	out[n] = 0;
}

int kt_main_list(int argc, char **argv, const char *file, void (**fns)(void), int n, const char *names)
{
	const char *base = strrchr(file, '/');
	int failed = 0;
	base = base ? base + 1 : file;
	char stem[128];
	snprintf(stem, sizeof stem, "%.*s", (int)strcspn(base, "."), base);
	for (int i = 0; i < n; i++) {
		char name[128];
		name_at(names, i, name, sizeof name);
		if (argc > 1 && strcmp(argv[1], name))
			continue;
		g_case = name;
		kt_failed_checks = 0;
		g_first[0] = 0;
		g_tmp[0] = 0;
		g_skip[0] = 0;
		kv_errclear();
		fns[i]();
		if (kt_failed_checks) {
			printf("FAIL %s:%s: %s\n", stem, name, g_first);
			failed++;
		} else if (g_skip[0]) {
			printf("skip %s:%s: %s\n", stem, name, g_skip);
		} else {
			printf("ok %s:%s\n", stem, name);
			if (g_tmp[0])
				kt_sh("rm -rf '%s'", g_tmp);
		}
		fflush(stdout);
	}
	return failed ? 1 : 0;
}
