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

static size_t edit_distance(const char *a, size_t n, const char *b, size_t m);

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
	fprintf(f, "\nstart here: kvkeep serve MODEL   (a .gguf file, a Hugging Face or MLX folder, or a name from\n"
		   "            `kvkeep models`; `kvkeep serve --help` has a quick start with agent clients)\n");
	fprintf(f, "\nenvironment: KVKEEP_LOG=debug|info|warn|error (default info), KVKEEP_THREADS=N\n");
}

/*
 * argv[1] (and argv[2]) name no command. A group's first word alone
 * ("kvkeep cache") prints the group's commands: to stdout with exit 0 for
 * --help, else as an error (exit 2). Anything else names the nearest
 * command.
 */
static int no_command(int argc, char **argv)
{
	size_t n1 = strlen(argv[1]);
	int in_group = 0;
	for (const struct kv_command *c = __start_kv_commands; c < __stop_kv_commands; c++)
		in_group |= !strncmp(c->name, argv[1], n1) && c->name[n1] == ' ';
	if (in_group) {
		int help = argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h") || !strcmp(argv[2], "help"));
		FILE *f = help ? stdout : stderr;
		if (argc >= 3 && !help)
			fprintf(f, "kvkeep: unknown command '%s %s'\n\n", argv[1], argv[2]);
		fprintf(f, "usage: kvkeep %s COMMAND [ARGS]   (kvkeep %s COMMAND --help for its flags)\n\ncommands:\n",
			argv[1], argv[1]);
		size_t n = (size_t)(__stop_kv_commands - __start_kv_commands), k = 0;
		struct kv_command *v = malloc(n * sizeof *v);
		for (const struct kv_command *c = __start_kv_commands; v && c < __stop_kv_commands; c++)
			if (!strncmp(c->name, argv[1], n1) && c->name[n1] == ' ')
				v[k++] = *c;
		if (v)
			qsort(v, k, sizeof *v, cmp_cmd);
		for (size_t i = 0; i < k; i++)
			fprintf(f, "  %-18s %s\n", v[i].name, v[i].summary);
		free(v);
		return help ? 0 : 2;
	}
	const struct kv_command *near = NULL;
	size_t best = (size_t)-1;
	for (const struct kv_command *c = __start_kv_commands; c < __stop_kv_commands; c++) {
		size_t w = strcspn(c->name, " ");
		size_t d = edit_distance(argv[1], n1, c->name, w);
		if (d < best) {
			best = d;
			near = c;
		}
	}
	if (near && best <= 2)
		fprintf(stderr, "kvkeep: unknown command '%s': did you mean '%.*s'?\n\n", argv[1],
			(int)strcspn(near->name, " "), near->name);
	else
		fprintf(stderr, "kvkeep: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return 2;
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
	if (!best)
		return no_command(argc, argv);
	return best->fn(argc - (int)best_words, argv + best_words);
}

/* --- flag parsing (cli.h) ------------------------------------------------ */

void kv_flags_help(const char *usage_line, const struct kv_flag *flags)
{
	printf("%s\n\nflags:\n", usage_line);
	for (const struct kv_flag *f = flags; f && f->name; f++) {
		char left[160];
		size_t at = 0;
		/* the alias spellings first ("-c, --ctx-size, --max-model-len N") */
		for (const char *p = f->aliases; p && *p;) {
			size_t n = strcspn(p, " ");
			if (n && at < sizeof left - 8)
				at += (size_t)snprintf(left + at, sizeof left - at, "%.*s, ", (int)n, p);
			p += n;
			p += *p == ' ';
		}
		snprintf(left + at, sizeof left - at, "--%s%s%s", f->name, f->metavar ? " " : "", f->metavar ? f->metavar : "");
		printf("  %-34s %s\n", left, f->help ? f->help : "");
	}
	printf("  %-34s %s\n", "-h, --help", "show this help");
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

/* 1 if a[0, n) is one of the space-separated spellings of list. */
static int spelled(const char *list, const char *a, size_t n)
{
	for (const char *p = list; p && *p;) {
		size_t k = strcspn(p, " ");
		if (k == n && !strncmp(p, a, n))
			return 1;
		p += k;
		p += *p == ' ';
	}
	return 0;
}

static const struct kv_flag *find_flag(const struct kv_flag *flags, const char *a, size_t n)
{
	for (const struct kv_flag *g = flags; g && g->name; g++) {
		if (n > 2 && a[1] == '-' && strlen(g->name) == n - 2 && !strncmp(g->name, a + 2, n - 2))
			return g;
		if (spelled(g->aliases, a, n))
			return g;
	}
	return NULL;
}

/* Edit distance between a[0, n) and b[0, m) (both short: flag names). */
static size_t edit_distance(const char *a, size_t n, const char *b, size_t m)
{
	size_t row[128];
	if (n >= 127 || m >= 127)
		return (size_t)-1;
	for (size_t j = 0; j <= m; j++)
		row[j] = j;
	for (size_t i = 1; i <= n; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= m; j++) {
			size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			diag = up;
			row[j] = best;
		}
	}
	return row[m];
}

/* The known spelling nearest to the unknown flag a[0, n): a flag it
 * begins, else the closest by edit distance if close enough. */
static void nearest(const struct kv_flag *flags, const char *a, size_t n, char *out, size_t cap)
{
	size_t best = (size_t)-1;
	*out = 0;
	for (const struct kv_flag *g = flags; g && g->name; g++) {
		char sp[512];
		snprintf(sp, sizeof sp, "--%s%s%s", g->name, g->aliases ? " " : "", g->aliases ? g->aliases : "");
		for (const char *p = sp; *p;) {
			size_t k = strcspn(p, " ");
			size_t d = n > 3 && k > n && !strncmp(p, a, n) ? 0 : edit_distance(a, n, p, k);
			if (d < best) {
				best = d;
				snprintf(out, cap, "%.*s", (int)k, p); /* the spelling it resembles */
			}
			p += k;
			p += *p == ' ';
		}
	}
	size_t limit = n / 3 > 2 ? n / 3 : 2;
	if (best > limit)
		*out = 0;
}

int kv_flags_parse_hints(const char *usage_line, const struct kv_flag *flags, const struct kv_flag_hint *hints,
			 int argc, char **argv, char **pos, int max_pos, int *n_pos)
{
	int np = 0;
	const char *extra = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		extra = a;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			kv_flags_help(usage_line, flags);
			return 1;
		}
		if (!strcmp(a, "--")) {
			for (i++; i < argc; i++) {
				extra = argv[i];
				if (np >= max_pos)
					goto too_many;
				pos[np++] = argv[i];
			}
			break;
		}
		/* "--name", and "-x" unless it is a negative number or "-" alone */
		int is_flag = a[0] == '-' && a[1] && (a[1] == '-' ? a[2] != 0 : !(a[1] >= '0' && a[1] <= '9'));
		if (!is_flag) {
			if (np >= max_pos)
				goto too_many;
			pos[np++] = argv[i];
			continue;
		}
		const char *eq = strchr(a, '=');
		size_t nl = eq ? (size_t)(eq - a) : strlen(a);
		const struct kv_flag *f = find_flag(flags, a, nl);
		if (!f) {
			for (const struct kv_flag_hint *h = hints; h && h->spellings; h++)
				if (spelled(h->spellings, a, nl)) {
					fprintf(stderr, "kvkeep: %.*s: %s\n", (int)nl, a, h->text);
					return 2;
				}
			char near[160];
			nearest(flags, a, nl, near, sizeof near);
			if (*near)
				fprintf(stderr, "kvkeep: unknown flag '%.*s': did you mean %s? (see --help)\n", (int)nl, a, near);
			else
				fprintf(stderr, "kvkeep: unknown flag '%.*s' (see --help)\n", (int)nl, a);
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
	fprintf(stderr, "kvkeep: unexpected argument '%s' (see --help)\n", extra ? extra : "?");
	return 2;
}

int kv_flags_parse(const char *usage_line, const struct kv_flag *flags, int argc, char **argv, char **pos, int max_pos,
		   int *n_pos)
{
	return kv_flags_parse_hints(usage_line, flags, NULL, argc, argv, pos, max_pos, n_pos);
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
