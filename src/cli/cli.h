/*
 * cli.h - subcommand registration and flag parsing for the kvkeep binary.
 *
 * A command file registers itself:
 *     static int cmd_mkmodel(int argc, char **argv);
 *     KV_COMMAND(mkmodel, "mkmodel", "write a synthetic model folder", cmd_mkmodel);
 * argv[0] is the command name. Commands with a sub-verb ("model info",
 * "bench engine") dispatch the verb themselves; names with a space
 * ("bench engine") are matched against the first two words.
 *
 * Flags: a table of struct kv_flag, parsed by kv_flags_parse, which
 * accepts "--name value" and "--name=value" (and an alias's spellings,
 * short ones such as "-c 4096" included), prints --help from the table
 * (with defaults), and rejects unknown flags and bad values with a clear
 * message: an unknown flag names the nearest known one. Positional
 * arguments are collected in order; a lone "-" is one.
 */
#ifndef KV_CLI_CLI_H
#define KV_CLI_CLI_H

#include <stddef.h>
#include <stdint.h>

struct kv_command {
	const char *name;
	const char *summary;
	int (*fn)(int argc, char **argv);
};

#define KV_COMMAND(id, name_str, summary_str, fnp) \
	static const struct kv_command kv_cmd_##id \
		__attribute__((used, section("kv_commands"), aligned(sizeof(void *)))) = {name_str, summary_str, fnp}

enum kv_flag_type {
	KV_FLAG_BOOL,   /* int*: set to 1; "--no-x" is not implied */
	KV_FLAG_STR,    /* const char**: borrowed from argv */
	KV_FLAG_INT,    /* int64_t* */
	KV_FLAG_DOUBLE, /* double* */
	KV_FLAG_CLEAR,  /* int*: set to 0 (for --disable-x pairs) */
};

struct kv_flag {
	const char *name;     /* without leading dashes */
	int type;             /* enum kv_flag_type */
	void *dst;
	const char *metavar;  /* "N", "DIR", NULL for bool */
	const char *help;     /* one line; say the default in it */
	int *seen;            /* optional: set to 1 when given */
	const char *aliases;  /* optional: other spellings, space-separated, dashes included ("-c --ctx-size") */
};

/* A flag another program has and this command answers with a sentence
 * instead of "unknown flag" (llama.cpp's -ngl on a CPU server). */
struct kv_flag_hint {
	const char *spellings; /* space-separated, dashes included */
	const char *text;      /* what to do instead */
};

/*
 * Parse argv[1..]. Returns 0 on success, 1 if --help was printed (caller
 * exits 0), 2 on a bad flag (message printed to stderr). Positionals go to
 * pos (up to max_pos; more is an error).
 */
int kv_flags_parse(const char *usage, const struct kv_flag *flags, int argc, char **argv,
		   char **pos, int max_pos, int *n_pos);
/* The same with hints for flags of other programs (NULL-terminated). */
int kv_flags_parse_hints(const char *usage, const struct kv_flag *flags, const struct kv_flag_hint *hints, int argc,
			 char **argv, char **pos, int max_pos, int *n_pos);
void kv_flags_help(const char *usage, const struct kv_flag *flags);

/* Parse "1,2,3" into a malloc'd int array. 0 or -1 with a message. */
int kv_parse_int_list(const char *s, int32_t **out, size_t *n);

#endif
