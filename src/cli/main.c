/*
 * main.c - the kvkeep binary: finds the subcommand and runs it.
 *
 * Commands live in the other files of src/cli and register themselves in
 * the "kv_commands" section (see cli.h), so adding one touches no table.
 */
#include "cli/cli.h"
#include "base/err.h"
#include "base/log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct kv_command __start_kv_commands[];
extern const struct kv_command __stop_kv_commands[];

static int cmp_cmd(const void *a, const void *b)
{
	return strcmp(((const struct kv_command *)a)->name, ((const struct kv_command *)b)->name);
}

static void usage(FILE *f)
{
	size_t n = (size_t)(__stop_kv_commands - __start_kv_commands);
	struct kv_command *v = malloc(n * sizeof *v);
	fprintf(f, "kvkeep %s - a local LLM server whose prompt cache survives restarts\n\n"
		   "usage: kvkeep COMMAND [ARGS]   (kvkeep COMMAND --help for its flags)\n\ncommands:\n",
		KVKEEP_VERSION);
	if (v) {
		memcpy(v, __start_kv_commands, n * sizeof *v);
		qsort(v, n, sizeof *v, cmp_cmd);
		for (size_t i = 0; i < n; i++)
			fprintf(f, "  %-18s %s\n", v[i].name, v[i].summary);
		free(v);
	}
	fprintf(f, "\nenvironment: KVKEEP_LOG=debug|info|warn|error (default info), KVKEEP_THREADS=N\n");
}

int main(int argc, char **argv)
{
	const struct kv_command *best = NULL;
	size_t best_words = 0;

	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("kvkeep %s\n", KVKEEP_VERSION);
		return 0;
	}
	for (const struct kv_command *c = __start_kv_commands; c < __stop_kv_commands; c++) {
		const char *sp = strchr(c->name, ' ');
		if (!sp) {
			if (!strcmp(c->name, argv[1]) && best_words < 1) {
				best = c;
				best_words = 1;
			}
		} else if (argc >= 3 && !strncmp(c->name, argv[1], (size_t)(sp - c->name)) &&
			   argv[1][sp - c->name] == 0 && !strcmp(sp + 1, argv[2])) {
			best = c;
			best_words = 2;
		}
	}
	if (!best) {
		fprintf(stderr, "kvkeep: unknown command '%s'\n\n", argv[1]);
		usage(stderr);
		return 2;
	}
	return best->fn(argc - (int)best_words, argv + best_words);
}

/* --- flag parsing (cli.h) ------------------------------------------------ */

void kv_flags_help(const char *usage_line, const struct kv_flag *flags)
{
	printf("%s\n\nflags:\n", usage_line);
	for (const struct kv_flag *f = flags; f && f->name; f++) {
		char left[96];
		snprintf(left, sizeof left, "--%s%s%s", f->name, f->metavar ? " " : "", f->metavar ? f->metavar : "");
		printf("  %-34s %s\n", left, f->help ? f->help : "");
	}
	printf("  %-34s %s\n", "--help", "show this help");
}

static int set_value(const struct kv_flag *f, const char *v)
{
	char *end;
	switch (f->type) {
	case KV_FLAG_STR:
		*(const char **)f->dst = v;
		return 0;
	case KV_FLAG_INT: {
		errno = 0;
		long long x = strtoll(v, &end, 10);
		if (errno || end == v || *end) {
			fprintf(stderr, "kvkeep: --%s wants an integer, got '%s'\n", f->name, v);
			return 2;
		}
		*(int64_t *)f->dst = x;
		return 0;
	}
	case KV_FLAG_DOUBLE: {
		errno = 0;
		double x = strtod(v, &end);
		if (errno || end == v || *end || x != x) {
			fprintf(stderr, "kvkeep: --%s wants a number, got '%s'\n", f->name, v);
			return 2;
		}
		*(double *)f->dst = x;
		return 0;
	}
	}
	return 2;
}

int kv_flags_parse(const char *usage_line, const struct kv_flag *flags, int argc, char **argv,
		   char **pos, int max_pos, int *n_pos)
{
	int np = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			kv_flags_help(usage_line, flags);
			return 1;
		}
		if (a[0] != '-' || a[1] != '-' || a[2] == 0) {
			if (!strcmp(a, "--")) {
				for (i++; i < argc; i++) {
					if (np >= max_pos)
						goto too_many;
					pos[np++] = argv[i];
				}
				break;
			}
			if (np >= max_pos)
				goto too_many;
			pos[np++] = argv[i];
			continue;
		}
		const char *name = a + 2, *eq = strchr(name, '=');
		size_t nl = eq ? (size_t)(eq - name) : strlen(name);
		const struct kv_flag *f = NULL;
		for (const struct kv_flag *g = flags; g && g->name; g++)
			if (strlen(g->name) == nl && !strncmp(g->name, name, nl))
				f = g;
		if (!f) {
			fprintf(stderr, "kvkeep: unknown flag '%s' (see --help)\n", a);
			return 2;
		}
		if (f->seen)
			*f->seen = 1;
		if (f->type == KV_FLAG_BOOL || f->type == KV_FLAG_CLEAR) {
			if (eq) {
				fprintf(stderr, "kvkeep: --%s takes no value\n", f->name);
				return 2;
			}
			*(int *)f->dst = f->type == KV_FLAG_BOOL;
			continue;
		}
		const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
		if (!v) {
			fprintf(stderr, "kvkeep: --%s needs a value (%s)\n", f->name, f->metavar ? f->metavar : "VALUE");
			return 2;
		}
		if (set_value(f, v))
			return 2;
	}
	if (n_pos)
		*n_pos = np;
	return 0;
too_many:
	fprintf(stderr, "kvkeep: unexpected argument '%s' (see --help)\n", argv[argc - 1]);
	return 2;
}

int kv_parse_int_list(const char *s, int32_t **out, size_t *n)
{
	size_t cap = 16, k = 0;
	int32_t *v = malloc(cap * sizeof *v);
	const char *p = s;
	*out = NULL;
	*n = 0;
	if (!v)
		return -1;
	while (*p) {
		char *end;
		while (*p == ' ' || *p == ',' || *p == '\n' || *p == '[' || *p == ']')
			p++;
		if (!*p)
			break;
		errno = 0;
		long long x = strtoll(p, &end, 10);
		if (errno || end == p || x < INT32_MIN || x > INT32_MAX) {
			fprintf(stderr, "kvkeep: bad integer in list near '%.20s'\n", p);
			free(v);
			return -1;
		}
		if (k == cap) {
			int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
			if (!nv) {
				free(v);
				return -1;
			}
			v = nv;
		}
		v[k++] = (int32_t)x;
		p = end;
	}
	*out = v;
	*n = k;
	return 0;
}
