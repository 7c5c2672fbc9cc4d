/*
 * cmd_bench_mktrace.c - `kvkeep bench mktrace`: a synthetic coding-agent
 * trace for `kvkeep bench replay`.
 *
 * Output format: JSON Lines, one OpenAI chat-completions request body per
 * line, in the order a client sent them. Every body is
 *     {"model", "messages", "tools", "tool_choice": "auto",
 *      "parallel_tool_calls": true, "stream": true,
 *      "stream_options": {"include_usage": true}, "max_tokens", "user"}
 * and request k+1's messages are request k's messages followed by the
 * assistant reply to request k and then either the results of the tool
 * calls in that reply (role "tool", one per call, with tool_call_id) or,
 * after a plain-text answer, the user's next message. That is how a real
 * agent's history grows, so consecutive requests share a long prefix: the
 * system prompt, the tool schemas and every earlier turn.
 *
 * What the requests contain, and why:
 *   - a system prompt of about --system-tokens tokens of coding-agent
 *     instructions (sections, bullet lists, numbered steps, examples, an
 *     environment block), generated from sentence templates and word pools
 *     so the text is varied, tokenizes like prose, and is the same for the
 *     same seed;
 *   - --tools JSON-schema function tools (read_file, write_file, edit,
 *     grep, run_command, list_dir, git_diff, ...) with descriptions, enums,
 *     defaults, array parameters and required lists; past the 30 built in,
 *     MCP-style tools are derived;
 *   - user turns (sometimes as a list of text parts), assistant tool calls
 *     (content null, ids "call_" + 24 characters, arguments as JSON
 *     strings, sometimes several in parallel), tool results (string
 *     content, every fourth as a list of text parts) and plain-text
 *     assistant answers that end a task;
 *   - with --reasoning, every assistant message carries reasoning_content
 *     (planning text), as clients of thinking models send their history
 *     back; with --write-lines N, every change step writes an N-line file
 *     through write_file's "content" argument (coding agents write files
 *     through tool-call arguments). Without these flags the bytes are the
 *     same as before they existed.
 * The token count of the system prompt is estimated while generating (a
 * pre-tokenizer-like count of word, digit, punctuation and space pieces);
 * tests check it against the real Qwen3 tokenizer.
 *
 * Determinism: everything comes from one splitmix64 stream seeded with
 * --seed, so a (flags, seed) pair always gives the same bytes; the
 * fixtures in bench/traces/ are checked against a fresh run by the tests.
 */
#include "cli/cli.h"
#include "base/buf.h"
#include "base/durable.h"
#include "base/err.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- deterministic randomness -------------------------------------------- */

struct mt_rng {
	uint64_t s;
};

static uint64_t mt_next(struct mt_rng *r)
{
	uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* Uniform in [0, n); n > 0. The modulo bias is irrelevant here. */
static size_t mt_below(struct mt_rng *r, size_t n)
{
	return (size_t)(mt_next(r) % n);
}

/* 1 with probability num/den. */
static int mt_chance(struct mt_rng *r, unsigned num, unsigned den)
{
	return mt_below(r, den) < num;
}

#define MT_N(a) (sizeof(a) / sizeof((a)[0]))
#define MT_PICK(r, a) ((a)[mt_below((r), MT_N(a))])

/* --- token estimate -------------------------------------------------------- */

/*
 * Counts the pieces a byte-level BPE pre-tokenizer makes (words with their
 * leading space, single digits, punctuation runs, space and newline runs)
 * and takes 5% off for punctuation that merges with the newline after it.
 * Qwen3's vocabulary holds the pools' words whole, so for this text the
 * estimate lands within a few percent of the real count (measured against
 * the Qwen3 tokenizer over several seeds; the e2e test checks it).
 */
static int mt_is_letter(unsigned char c)
{
	return (c | 32) >= 'a' && (c | 32) <= 'z';
}

static size_t mt_est_tokens(const char *s, size_t n)
{
	size_t t = 0, i = 0;
	while (i < n) {
		unsigned char c = (unsigned char)s[i];
		if (c == ' ' && i + 1 < n && mt_is_letter((unsigned char)s[i + 1]))
			c = (unsigned char)s[++i]; /* a leading space joins the word */
		if (mt_is_letter(c) || c >= 0x80) {
			while (i < n && (mt_is_letter((unsigned char)s[i]) || (unsigned char)s[i] >= 0x80))
				i++;
		} else if (c >= '0' && c <= '9') {
			i++;
		} else if (c == '\n' || c == ' ') {
			while (i < n && s[i] == (char)c)
				i++;
		} else {
			while (i < n && s[i] != ' ' && s[i] != '\n' && !mt_is_letter((unsigned char)s[i]) &&
			       !(s[i] >= '0' && s[i] <= '9') && (unsigned char)s[i] < 0x80)
				i++;
		}
		t++;
	}
	return t - t / 20;
}

/* --- word pools for the system prompt ------------------------------------ */

static const char *const AGENT_NAMES[] = {"Forge", "Patchwork", "Quill", "Tessera", "Lathe", "Keel"};

/* Imperatives and actions come in two polarities so that the generated
 * rules make sense ("Never commit changes without an explicit request"). */
static const char *const IMPERATIVES[] = {
	"Always", "Prefer to", "Make sure to", "You must", "Try to", "Remember to", "It is important to",
	"Be careful to"};

static const char *const IMPERATIVES_NOT[] = {"Never", "Do not", "Avoid trying to", "You must not", "Refrain from trying to"};

static const char *const ACTIONS_NOT[] = {
	"create a new file when editing an existing one would do",
	"commit changes without an explicit request",
	"add comments that restate what the code already says",
	"introduce a new dependency without checking the lockfile",
	"print secrets, tokens or keys into the conversation",
	"guess file contents that you have not read",
	"rewrite working code only to match your own style",
	"push to a remote branch unless the user asks",
	"disable a failing test to make the suite pass",
	"run destructive commands such as rm -rf or git reset --hard without confirmation",
	"use interactive commands that wait for input",
	"leave debugging output in the final change"};

static const char *const ACTIONS[] = {
	"read the surrounding code before editing a function",
	"run the relevant tests after a change",
	"search the codebase for existing helpers",
	"check the project's lint configuration",
	"look at how neighbouring modules handle errors",
	"explain what a shell command does before running it",
	"keep edits as small as the task allows",
	"mention the file path and line number when you refer to code",
	"verify that a library is already used in the project",
	"update the documentation that describes a changed interface",
	"follow the naming conventions of the surrounding code",
	"write tests that exercise the failure path as well",
	"batch independent tool calls into one message",
	"read a file again after editing it if later steps depend on it",
	"use absolute paths in tool arguments",
	"stop and ask when the request is ambiguous",
	"summarise what changed once the task is complete",
	"track multi-step work with the todo list",
	"mark a todo item as completed as soon as it is done",
	"revert a change that breaks the build before trying something else",
	"look for a README, CONTRIBUTING or AGENTS file in the repository",
	"prefer the project's own scripts over ad-hoc commands",
	"leave generated files out of version control"};

static const char *const CONDITIONS[] = {
	"before you make any change", "when the user asks for a review", "if a command fails",
	"unless the user explicitly asks for it", "after every non-trivial edit", "when you are unsure",
	"while a long-running command is still producing output", "when a test is flaky",
	"if the working tree has uncommitted changes", "when the change touches a public interface",
	"before you open a pull request", "when the repository uses a monorepo layout",
	"if the user pasted a stack trace", "when two files disagree about a format",
	"if the linter and the formatter disagree", "when a migration is involved"};

static const char *const REASONS[] = {
	"because the user may be reviewing your work as it happens",
	"so that the history stays easy to review",
	"since unrelated changes make diffs hard to read",
	"because the user's environment may differ from yours",
	"so that nothing surprising happens to their files",
	"because a passing build is the only reliable signal that you are done",
	"since tool output can be long and costly to read twice",
	"so that the user can follow your reasoning without scrolling",
	"because conventions differ between projects and you should match this one",
	"since guessing at an API usually produces code that does not compile",
	"because the cache of earlier results may be stale",
	"so that a later reader understands why the code changed"};

static const char *const OBJECTS[] = {
	"configuration files", "unit tests", "the build script", "public interfaces", "error messages",
	"migration scripts", "log output", "the lockfile", "generated code", "CI workflows", "shell scripts",
	"database schemas", "environment variables", "feature flags", "API handlers", "integration tests",
	"vendored dependencies", "type definitions", "benchmarks", "release notes"};

static const char *const QUALITIES[] = {
	"short and focused", "consistent with the rest of the project", "free of debugging leftovers",
	"readable without extra context", "covered by at least one test", "backwards compatible",
	"deterministic", "easy to revert"};

/* Tool advice: {tool, what it is for, what not to do instead}. */
static const char *const TOOL_ADVICE[][3] = {
	{"read_file", "inspect a file before changing it", "running cat or head in a shell"},
	{"grep", "look up where a symbol is used", "running grep or rg through run_command"},
	{"glob", "find files by name", "running find through the shell"},
	{"list_dir", "see what a folder contains", "running ls through the shell"},
	{"edit", "replace an exact block of text", "rewriting the whole file"},
	{"git_diff", "see what changed since the last commit", "asking the user what they changed"},
	{"run_tests", "run the project's test command", "guessing which runner the project uses"},
	{"todo_write", "plan work with several steps", "keeping the plan only in your head"},
	{"find_references", "find every caller of a function", "reading every file in the folder"},
	{"web_fetch", "read documentation for an unfamiliar library", "guessing from memory"},
	{"task", "delegate a broad search across the codebase", "running dozens of searches yourself"},
	{"diagnostics", "check for type errors after an edit", "waiting for the full build"}};

/* Situations and what to do in them, pairwise. */
static const char *const SITUATIONS[][2] = {
	{"a test fails for a reason unrelated to your change", "say so plainly and continue with the task"},
	{"the user asks a question that only needs an answer", "answer it directly and do not edit any files"},
	{"the command you need is not installed", "tell the user which package provides it instead of installing it yourself"},
	{"you find a bug that is outside the scope of the task", "mention it in your final summary rather than fixing it silently"},
	{"an edit fails because the old text is not unique", "include more surrounding lines so the match is unique"},
	{"the repository has no tests", "describe how you verified the change by hand"},
	{"a hook rejects your commit", "read the hook's message, fix the cause and create a new commit"},
	{"the output of a command is truncated", "rerun it with a narrower filter or write the output to a file and read it in parts"},
	{"you need credentials that you do not have", "stop and ask the user how to proceed"},
	{"two instructions in this prompt conflict", "follow the more specific instruction"},
	{"a file is too long to read at once", "read it in ranges with offset and limit"},
	{"the build takes more than a few minutes", "run it in the background and keep working on what does not depend on it"}};

static const char *const HEADINGS[] = {
	"Tone and style", "Proactiveness", "Following conventions", "Code style", "Task management",
	"Doing tasks", "Tool usage policy", "Version control", "Testing", "Security", "Working with the shell",
	"Editing files", "Answering questions", "Long-running commands", "Dependencies", "Reviewing changes",
	"Documentation", "Performance work", "Debugging", "Communication"};

static const char *const LANGS[] = {"python", "typescript", "go", "rust"};

/* What the user is like, and what follows from it, pairwise. */
static const char *const USER_PREFS[][2] = {
	{"reads your replies in a terminal", "keep answers under four lines unless detail is asked for"},
	{"prefers small pull requests", "split large changes into steps they can review"},
	{"values working code over clever code", "check that the code runs before you call it done"},
	{"often works across several repositories", "state which repository a path belongs to"},
	{"may interrupt you to change direction", "keep your plan visible in the todo list"},
	{"expects you to respect the existing architecture", "do not move code between layers without asking"}};

/* --- the project the session works on ------------------------------------ */

static const char *const MODULES[] = {
	"parser", "lexer", "config", "cache", "server", "client", "auth", "storage", "scheduler", "metrics",
	"router", "session", "export", "importer", "queue", "retry", "render", "plugin", "worker", "index"};

static const char *const IDENTS[] = {
	"load_config", "parse_header", "retry_after", "flush_pending", "resolve_path", "open_session",
	"encode_frame", "validate_token", "build_index", "next_batch", "read_chunk", "apply_patch",
	"merge_ranges", "split_lines", "normalize_key", "emit_event", "close_writer", "schedule_job",
	"format_error", "compute_digest"};

static const char *const ERRORS[] = {
	"KeyError: 'timeout'", "TypeError: cannot read properties of undefined (reading 'length')",
	"panic: runtime error: index out of range [3] with length 3",
	"thread 'main' panicked at 'called `Option::unwrap()` on a `None` value'",
	"AssertionError: expected 200, got 503", "ValueError: invalid literal for int() with base 10: ''",
	"error[E0502]: cannot borrow `self.buf` as mutable because it is also borrowed as immutable",
	"FAIL: TestRetryAfter (0.02s): want 3 attempts, got 4"};

static const char *const TASKS[] = {
	"The test for {ident} in {file} started failing after yesterday's merge with `{err}`. Can you find out why and fix it?",
	"Add a `--dry-run` option to the {mod} command that prints what would change without writing anything.",
	"{ident} in {file} is slow on large inputs. Profile it and make it faster without changing its output.",
	"Refactor the {mod} module so that {ident} no longer reads global state; pass the config in explicitly.",
	"Write unit tests for {ident} covering the empty input, a single item and the error path.",
	"We get `{err}` in production when the {mod} queue is empty. Please make it handle that case and add a regression test.",
	"Rename {ident} to something clearer across the codebase and update the docs that mention it.",
	"Can you review the uncommitted changes in the {mod} package and tell me if anything looks wrong?"};

static const char *const ANSWER_FIXES[] = {
	"an empty input returns an empty result instead of raising", "the retry count is read from the config",
	"the error names the file it failed on", "the loop no longer re-reads the whole file per item",
	"the lock is released on the error path too"};

static const char *const FOLLOWUPS[] = {
	"Thanks. Now also update the changelog entry for this.",
	"Looks good. Can you run the full test suite to be sure nothing else broke?",
	"Hmm, I'd rather keep the old function name as an alias for one release. Can you add that?",
	"Great. Please also check whether the {mod} module has the same problem.",
	"That works. One more thing: the error message should include the file path.",
	"Can you squash that into a single commit with a clear message?"};

struct mt_project {
	const char *lang;
	const char *ext;
	char root[96];
	char files[24][96];
	int n_files;
};

static void mt_project_init(struct mt_project *p, struct mt_rng *r)
{
	static const char *const exts[] = {"py", "ts", "go", "rs"};
	static const char *const names[] = {"atlas", "brook", "cinder", "delta-sync", "ember", "fathom"};
	size_t li = mt_below(r, MT_N(LANGS));
	p->lang = LANGS[li];
	p->ext = exts[li];
	snprintf(p->root, sizeof p->root, "/home/dev/src/%s", MT_PICK(r, names));
	p->n_files = 0;
	for (int i = 0; i < 24; i++) {
		const char *m = MODULES[(size_t)i % MT_N(MODULES)];
		if (i < 16)
			snprintf(p->files[i], sizeof p->files[i], "src/%s/%s.%s", m, i % 3 ? "core" : "mod", p->ext);
		else
			snprintf(p->files[i], sizeof p->files[i], "tests/test_%s.%s", m, p->ext);
		p->n_files++;
	}
}

static const char *mt_file(const struct mt_project *p, struct mt_rng *r)
{
	return p->files[mt_below(r, (size_t)p->n_files)];
}

/* --- system prompt ------------------------------------------------------- */

static void mt_cap_first(struct kv_buf *b, size_t at)
{
	if (b->p && at < b->len && b->p[at] >= 'a' && b->p[at] <= 'z')
		b->p[at] = (char)(b->p[at] - 32);
}

static void mt_lower_first(char *s)
{
	if (s[0] >= 'A' && s[0] <= 'Z' && !(s[1] >= 'A' && s[1] <= 'Z'))
		s[0] = (char)(s[0] + 32);
}

static void mt_sentence(struct kv_buf *b, struct mt_rng *r)
{
	size_t at = b->len;
	char imp[64], act[160];
	if (mt_chance(r, 1, 3)) {
		snprintf(imp, sizeof imp, "%s", MT_PICK(r, IMPERATIVES_NOT));
		snprintf(act, sizeof act, "%s", MT_PICK(r, ACTIONS_NOT));
	} else {
		snprintf(imp, sizeof imp, "%s", MT_PICK(r, IMPERATIVES));
		snprintf(act, sizeof act, "%s", MT_PICK(r, ACTIONS));
	}
	switch (mt_below(r, 10)) {
	case 0:
		kv_buf_printf(b, "%s %s %s.", imp, act, MT_PICK(r, CONDITIONS));
		break;
	case 1:
		mt_lower_first(imp);
		kv_buf_printf(b, "%s, %s %s, %s.", MT_PICK(r, CONDITIONS), imp, act, MT_PICK(r, REASONS));
		break;
	case 2:
		mt_lower_first(imp);
		kv_buf_printf(b, "When working with %s, %s %s.", MT_PICK(r, OBJECTS), imp, act);
		break;
	case 3:
	{
		const char *const *t = TOOL_ADVICE[mt_below(r, MT_N(TOOL_ADVICE))];
		kv_buf_printf(b, "Use the `%s` tool to %s instead of %s.", t[0], t[1], t[2]);
	}
		break;
	case 4:
	{
		const char *const *t = SITUATIONS[mt_below(r, MT_N(SITUATIONS))];
		kv_buf_printf(b, "If %s, %s.", t[0], t[1]);
	}
		break;
	case 5:
	{
		const char *const *t = USER_PREFS[mt_below(r, MT_N(USER_PREFS))];
		kv_buf_printf(b, "The user %s; %s.", t[0], t[1]);
	}
		break;
	case 6:
		kv_buf_printf(b, "Keep %s %s, %s.", MT_PICK(r, OBJECTS), MT_PICK(r, QUALITIES), MT_PICK(r, REASONS));
		break;
	case 7:
		kv_buf_printf(b, "%s %s \xe2\x80\x94 %s.", imp, act, MT_PICK(r, REASONS));
		break;
	case 8:
		mt_lower_first(imp);
		kv_buf_printf(b, "Treat %s with care: %s %s %s.", MT_PICK(r, OBJECTS), imp, act, MT_PICK(r, CONDITIONS));
		break;
	default:
		kv_buf_printf(b, "Before touching %s, %s.", MT_PICK(r, OBJECTS), MT_PICK(r, ACTIONS));
		break;
	}
	mt_cap_first(b, at);
}

static void mt_example(struct kv_buf *b, struct mt_rng *r, const struct mt_project *p)
{
	static const char *const ASK_TESTS[] = {"what command runs the tests?", "how do I run the %s tests?",
						"which command checks the %s module?", "run the %s tests for me"};
	static const char *const ASK_WHERE[] = {"where is %s defined?", "who calls %s?", "find the definition of %s",
						"is %s still used anywhere?"};
	static const char *const STEPS[][3] = {
		{"Run the test and read the failure", "Find the cause in %s", "Fix it and rerun the test"},
		{"Reproduce the bug with a small input", "Read %s around the failing call", "Add a regression test"},
		{"List the callers of the function", "Change the signature in %s", "Update every caller and build"},
		{"Read the current behaviour", "Write the new option into %s", "Document it and add a test"}};
	const char *mod = MT_PICK(r, MODULES), *id = MT_PICK(r, IDENTS), *file = mt_file(p, r);
	kv_buf_adds(b, "<example>\n");
	switch (mt_below(r, 4)) {
	case 0: {
		const char *cmd = !strcmp(p->lang, "python") ? "pytest -q tests/test_%s.py"
				  : !strcmp(p->lang, "go")   ? "go test ./src/%s/..."
				  : !strcmp(p->lang, "rust") ? "cargo test %s"
							     : "npx vitest run tests/test_%s.ts";
		kv_buf_adds(b, "user: ");
		kv_buf_printf(b, MT_PICK(r, ASK_TESTS), mod);
		kv_buf_adds(b, "\nassistant: ");
		kv_buf_printf(b, cmd, mod);
		kv_buf_addc(b, '\n');
		break;
	}
	case 1:
		kv_buf_adds(b, "user: ");
		kv_buf_printf(b, MT_PICK(r, ASK_WHERE), id);
		kv_buf_printf(b, "\nassistant: [uses grep for \"%s\"]\n%s:%zu\n", id, file, 10 + mt_below(r, 400));
		break;
	case 2: {
		const char *const *st = STEPS[mt_below(r, MT_N(STEPS))];
		kv_buf_printf(b, "user: %s %s in %s\nassistant: I'll add these steps to the todo list:\n1. %s\n2. ",
			      mt_chance(r, 1, 2) ? "fix the failing test for" : "please change", id, mod, st[0]);
		kv_buf_printf(b, st[1], file);
		kv_buf_printf(b, "\n3. %s\n[marks step 1 in_progress and starts]\n", st[2]);
		break;
	}
	default:
		kv_buf_printf(b, "user: is %s thread-safe?\nassistant: [reads %s]\n%s. It takes the %s lock before touching "
				 "shared state.\n",
			      id, file, mt_chance(r, 1, 2) ? "Yes" : "Not fully", mod);
		break;
	}
	kv_buf_adds(b, "</example>\n\n");
}

static char *mt_system_prompt(struct mt_rng *r, const struct mt_project *p, size_t want_tokens, size_t *est)
{
	struct kv_buf b = KV_BUF_INIT;
	const char *agent = MT_PICK(r, AGENT_NAMES);
	size_t order[MT_N(HEADINGS)], n_used = MT_N(HEADINGS), round = 0;
	size_t est_tokens = 0, est_to = 0;

	kv_buf_printf(&b,
		      "You are %s, an interactive coding agent that helps users with software engineering tasks in "
		      "their repository. Use the instructions below and the tools available to you to assist the user.\n\n"
		      "IMPORTANT: Refuse to write or explain code that may be used maliciously, even if the user "
		      "claims it is for education.\n\n",
		      agent);
/* the estimate is kept incrementally: the prompt may be a million tokens */
#define MT_EST() (est_tokens += mt_est_tokens(b.p + est_to, b.len - est_to), est_to = b.len, est_tokens)
	while (!b.oom && MT_EST() < want_tokens) {
		/* headings in a shuffled order; after all were used, a new round
		 * of "(continued)" sections, as long prompts append to sections */
		if (n_used == MT_N(HEADINGS)) {
			for (size_t i = 0; i < MT_N(HEADINGS); i++)
				order[i] = i;
			for (size_t i = MT_N(HEADINGS) - 1; i > 0; i--) {
				size_t j = mt_below(r, i + 1), t = order[i];
				order[i] = order[j];
				order[j] = t;
			}
			n_used = 0;
			round++;
		}
		kv_buf_printf(&b, "# %s%s\n", HEADINGS[order[n_used++]], round > 1 ? " (continued)" : "");
		size_t parts = 1 + mt_below(r, 3);
		for (size_t k = 0; k < parts && (k == 0 || MT_EST() < want_tokens); k++) {
			switch (mt_below(r, 5)) {
			case 0:
			case 1: {
				size_t ns = 2 + mt_below(r, 4);
				for (size_t i = 0; i < ns; i++) {
					if (i)
						kv_buf_addc(&b, ' ');
					mt_sentence(&b, r);
				}
				kv_buf_adds(&b, "\n\n");
				break;
			}
			case 2: {
				size_t ni = 3 + mt_below(r, 4);
				for (size_t i = 0; i < ni; i++) {
					kv_buf_adds(&b, "- ");
					mt_sentence(&b, r);
					kv_buf_addc(&b, '\n');
				}
				kv_buf_addc(&b, '\n');
				break;
			}
			case 3: {
				size_t ni = 3 + mt_below(r, 3);
				kv_buf_printf(&b, "When you are asked to work on %s, follow these steps:\n", MT_PICK(r, OBJECTS));
				for (size_t i = 0; i < ni; i++) {
					kv_buf_printf(&b, "%zu. ", i + 1);
					mt_sentence(&b, r);
					kv_buf_addc(&b, '\n');
				}
				kv_buf_addc(&b, '\n');
				break;
			}
			default:
				mt_example(&b, r, p);
				break;
			}
		}
	}
	kv_buf_printf(&b,
		      "Here is useful information about the environment you are running in:\n<env>\n"
		      "Working directory: %s\nIs directory a git repo: yes\nPlatform: linux\nPrimary language: %s\n"
		      "Today's date: 2026-11-%02zu\n</env>\n",
		      p->root, p->lang, 1 + mt_below(r, 28));
	*est = b.oom ? 0 : MT_EST();
#undef MT_EST
	return kv_buf_take(&b);
}

/* --- tools --------------------------------------------------------------- */

/* A parameter: type is a JSON-schema type; enums is "a|b|c" or NULL;
 * items is the element type of an array; def a default (as JSON text). */
struct mt_param {
	const char *name, *type, *desc, *enums, *items, *def;
	int required;
};

struct mt_tool {
	const char *name, *desc;
	struct mt_param p[7];
};

#define P(n, t, d, req) {n, t, d, NULL, NULL, NULL, req}
#define PE(n, d, e, def, req) {n, "string", d, e, NULL, def, req}
#define PA(n, it, d, req) {n, "array", d, NULL, it, NULL, req}
#define PD(n, t, d, def) {n, t, d, NULL, NULL, def, 0}

static const struct mt_tool TOOLS[] = {
	{"read_file",
	 "Reads a file from the local filesystem. The path must be absolute. By default it reads up to 2000 lines from "
	 "the start of the file; use offset and limit for long files. Lines are returned with line numbers starting at "
	 "1, in the format `cat -n` uses. Reading a file you have not seen before is required before editing it.",
	 {P("file_path", "string", "Absolute path of the file to read.", 1),
	  PD("offset", "integer", "Line number to start reading from (1-based). Only for files too long to read at once.", "1"),
	  PD("limit", "integer", "Maximum number of lines to read.", "2000")}},
	{"write_file",
	 "Writes a file to the local filesystem, replacing it if it exists. Prefer `edit` for changes to an existing "
	 "file; this tool is for new files or complete rewrites the user asked for. Never create documentation files "
	 "unless explicitly requested.",
	 {P("file_path", "string", "Absolute path of the file to write.", 1),
	  P("content", "string", "The full content to write to the file.", 1)}},
	{"edit",
	 "Performs an exact string replacement in a file. The edit fails if old_string is not found or is not unique "
	 "in the file; include more surrounding context to make it unique, or set replace_all to change every "
	 "occurrence. Preserve the exact indentation of the text after the line-number prefix of read_file output.",
	 {P("file_path", "string", "Absolute path of the file to modify.", 1),
	  P("old_string", "string", "The text to replace; must match the file exactly.", 1),
	  P("new_string", "string", "The replacement text; must differ from old_string.", 1),
	  PD("replace_all", "boolean", "Replace every occurrence of old_string.", "false")}},
	{"multi_edit",
	 "Makes several exact string replacements in one file in a single atomic operation. Edits are applied in order, "
	 "each to the result of the previous one; if any edit fails, none is applied.",
	 {P("file_path", "string", "Absolute path of the file to modify.", 1),
	  PA("edits", "object", "List of {old_string, new_string, replace_all} objects applied in sequence.", 1)}},
	{"grep",
	 "A fast content search built on ripgrep. Supports full regular expression syntax, file filtering with a glob "
	 "or a file type, and three output modes. Use it instead of running grep or rg through run_command.",
	 {P("pattern", "string", "Regular expression to search for in file contents.", 1),
	  P("path", "string", "File or folder to search in; defaults to the working directory.", 0),
	  P("glob", "string", "Glob pattern to filter files, e.g. \"*.ts\" or \"src/**/*.py\".", 0),
	  PE("output_mode", "What to return: matching lines, file paths only, or match counts per file.",
	     "content|files_with_matches|count", "\"files_with_matches\"", 0),
	  PD("case_insensitive", "boolean", "Ignore case when matching.", "false"),
	  PD("context_lines", "integer", "Lines of context before and after each match (content mode only).", "0")}},
	{"glob",
	 "Fast file pattern matching that works with any codebase size. Returns matching paths sorted by modification "
	 "time, newest first. Use it to find files by name patterns.",
	 {P("pattern", "string", "Glob pattern, e.g. \"**/*.go\" or \"src/**/test_*.py\".", 1),
	  P("path", "string", "Folder to search in; defaults to the working directory.", 0)}},
	{"list_dir",
	 "Lists files and folders in a directory. The path must be absolute. Optionally ignores entries matching glob "
	 "patterns. Prefer glob or grep when you know what you are looking for.",
	 {P("path", "string", "Absolute path of the folder to list.", 1),
	  PA("ignore", "string", "Glob patterns of entries to leave out.", 0),
	  PD("max_depth", "integer", "How many folder levels to descend.", "1")}},
	{"run_command",
	 "Executes a shell command in a persistent session with an optional timeout. Quote paths that contain spaces. "
	 "Do not use it for reading, searching or listing files: use the dedicated tools. Output longer than 30000 "
	 "characters is truncated.",
	 {P("command", "string", "The command to execute.", 1),
	  P("description", "string", "A 5-10 word description of what the command does, shown to the user.", 0),
	  PD("timeout_ms", "integer", "Timeout in milliseconds, at most 600000.", "120000"),
	  PD("run_in_background", "boolean", "Start the command and return at once; read its output later.", "false")}},
	{"command_output",
	 "Retrieves new output from a command started with run_in_background. Returns only what was printed since the "
	 "last call, and the exit status once the command has finished.",
	 {P("command_id", "string", "The id returned when the command was started.", 1),
	  P("filter", "string", "Optional regular expression; only matching lines are returned.", 0)}},
	{"kill_command", "Stops a background command started with run_in_background.",
	 {P("command_id", "string", "The id of the command to stop.", 1),
	  PE("signal", "Signal to send.", "TERM|INT|KILL", "\"TERM\"", 0)}},
	{"git_status", "Shows the working tree status: staged, unstaged and untracked files, and the current branch.",
	 {PD("porcelain", "boolean", "Machine-readable output.", "true")}},
	{"git_diff",
	 "Shows changes between the working tree, the index and commits. With no arguments it shows unstaged changes. "
	 "Use it before committing to review exactly what will be recorded.",
	 {P("path", "string", "Limit the diff to this path.", 0),
	  PD("staged", "boolean", "Show staged changes instead of unstaged ones.", "false"),
	  P("base", "string", "Compare against this commit or branch instead of the index.", 0),
	  PD("context", "integer", "Lines of context around each change.", "3")}},
	{"git_log", "Shows the commit history, newest first.",
	 {PD("max_count", "integer", "Number of commits to show.", "10"), P("path", "string", "Only commits touching this path.", 0),
	  PE("format", "Output format.", "oneline|short|full", "\"oneline\"", 0)}},
	{"git_commit",
	 "Records staged changes with a message. Only commit when the user asked for it. Write a message that explains "
	 "why the change was made, not only what changed.",
	 {P("message", "string", "The commit message.", 1), PA("paths", "string", "Paths to stage before committing.", 0),
	  PD("amend", "boolean", "Amend the previous commit instead of creating a new one.", "false")}},
	{"git_blame", "Shows which commit last changed each line of a file.",
	 {P("file_path", "string", "Absolute path of the file.", 1), P("start_line", "integer", "First line to annotate.", 0),
	  P("end_line", "integer", "Last line to annotate.", 0)}},
	{"find_references",
	 "Finds every reference to a symbol using the language server. More precise than grep for identifiers that "
	 "appear in comments or strings.",
	 {P("symbol", "string", "The symbol name.", 1), P("file_path", "string", "A file where the symbol is visible.", 1),
	  PD("include_declaration", "boolean", "Also return the declaration.", "true")}},
	{"go_to_definition", "Returns the location where a symbol is defined, using the language server.",
	 {P("symbol", "string", "The symbol name.", 1), P("file_path", "string", "The file in which the symbol is used.", 1),
	  P("line", "integer", "Line of the usage (1-based).", 0)}},
	{"diagnostics",
	 "Returns compiler and linter diagnostics for a file or the whole workspace from the language server.",
	 {P("file_path", "string", "Limit diagnostics to this file.", 0),
	  PE("severity", "Minimum severity to report.", "error|warning|information|hint", "\"warning\"", 0)}},
	{"run_tests",
	 "Runs the project's test command, optionally limited to some tests, and returns a summary with failures "
	 "first. Prefer it over run_command for tests: it knows the project's runner.",
	 {PA("paths", "string", "Test files or folders to run.", 0), P("filter", "string", "Only tests whose name matches.", 0),
	  PD("fail_fast", "boolean", "Stop at the first failure.", "false"),
	  PD("timeout_ms", "integer", "Timeout in milliseconds.", "300000")}},
	{"format_code", "Formats files with the project's configured formatter.",
	 {PA("paths", "string", "Files to format.", 1), PD("check_only", "boolean", "Report without changing files.", "false")}},
	{"todo_write",
	 "Creates and updates a structured task list for the current session. Use it for tasks with three or more "
	 "steps. Exactly one item should be in_progress at a time; mark items completed as soon as they are done.",
	 {PA("todos", "object", "The full updated list of {id, content, status, priority} items.", 1)}},
	{"web_fetch",
	 "Fetches a URL and returns its content converted to markdown, then answers the prompt about it. Read-only; "
	 "results may be cached for 15 minutes.",
	 {P("url", "string", "The URL to fetch (https only).", 1),
	  P("prompt", "string", "What to extract from the page.", 1)}},
	{"web_search", "Searches the web and returns result titles, URLs and snippets.",
	 {P("query", "string", "The search query.", 1), PA("allowed_domains", "string", "Only return results from these domains.", 0),
	  PD("max_results", "integer", "How many results to return.", "5")}},
	{"ask_user",
	 "Asks the user a question and waits for the answer. Use it only when you cannot proceed without a decision "
	 "from them.",
	 {P("question", "string", "The question, one or two sentences.", 1),
	  PA("options", "string", "Suggested answers the user can pick from.", 0)}},
	{"create_dir", "Creates a folder and any missing parents.", {P("path", "string", "Absolute path of the folder.", 1)}},
	{"move_path", "Moves or renames a file or folder.",
	 {P("source", "string", "Absolute path to move.", 1), P("destination", "string", "Absolute target path.", 1),
	  PD("overwrite", "boolean", "Replace an existing destination.", "false")}},
	{"delete_path", "Deletes a file, or a folder with recursive set. Ask before deleting anything the user wrote.",
	 {P("path", "string", "Absolute path to delete.", 1), PD("recursive", "boolean", "Delete folders and their contents.", "false")}},
	{"apply_patch",
	 "Applies a unified diff to the working tree. Fails without changing anything if a hunk does not apply.",
	 {P("patch", "string", "The patch in unified diff format.", 1),
	  PD("strip", "integer", "Leading path components to strip, as in patch -p.", "1")}},
	{"task",
	 "Launches a sub-agent with its own context to handle a self-contained search or research task, and returns "
	 "its final report. Use it when a search may need many rounds of globbing and grepping.",
	 {P("description", "string", "A short (3-5 word) description of the task.", 1),
	  P("prompt", "string", "Detailed instructions for the sub-agent.", 1),
	  PE("agent_type", "Which kind of sub-agent to start.", "general|explore|review", "\"general\"", 0)}},
	{"notebook_edit", "Replaces, inserts or deletes a cell in a Jupyter notebook.",
	 {P("notebook_path", "string", "Absolute path of the .ipynb file.", 1), P("cell_id", "string", "Id of the cell to edit.", 1),
	  P("new_source", "string", "New source of the cell.", 1), PE("cell_type", "Type of the cell.", "code|markdown", NULL, 0),
	  PE("edit_mode", "What to do with the cell.", "replace|insert|delete", "\"replace\"", 0)}},
};

#undef P
#undef PE
#undef PA
#undef PD

static json_t *mt_param_schema(const struct mt_param *p)
{
	json_t *o = json_object();
	json_object_set_new(o, "type", json_string(p->type));
	json_object_set_new(o, "description", json_string(p->desc));
	if (p->enums) {
		json_t *e = json_array();
		char tmp[256];
		snprintf(tmp, sizeof tmp, "%s", p->enums);
		for (char *save = NULL, *t = strtok_r(tmp, "|", &save); t; t = strtok_r(NULL, "|", &save))
			json_array_append_new(e, json_string(t));
		json_object_set_new(o, "enum", e);
	}
	if (p->items) {
		json_t *it = json_object();
		json_object_set_new(it, "type", json_string(p->items));
		if (!strcmp(p->items, "object"))
			json_object_set_new(it, "additionalProperties", json_true());
		json_object_set_new(o, "items", it);
	}
	if (p->def) {
		json_t *d = json_loads(p->def, JSON_DECODE_ANY, NULL);
		if (d)
			json_object_set_new(o, "default", d);
	}
	return o;
}

static json_t *mt_tool_json(const struct mt_tool *t, const char *name_override, const char *desc_override)
{
	json_t *props = json_object(), *req = json_array();
	for (size_t i = 0; i < MT_N(t->p) && t->p[i].name; i++) {
		json_object_set_new(props, t->p[i].name, mt_param_schema(&t->p[i]));
		if (t->p[i].required)
			json_array_append_new(req, json_string(t->p[i].name));
	}
	json_t *params = json_pack("{s:s, s:o, s:o, s:b}", "type", "object", "properties", props, "required", req,
				   "additionalProperties", 0);
	return json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name",
			 name_override ? name_override : t->name, "description", desc_override ? desc_override : t->desc,
			 "parameters", params);
}

/* Past the built-in tools, derive MCP-style ones ("mcp__jira__read_file"),
 * as agents with MCP servers attached present them. */
static json_t *mt_tools(size_t n)
{
	static const char *const servers[] = {"jira", "sentry", "postgres", "figma", "linear", "k8s"};
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++) {
		const struct mt_tool *t = &TOOLS[i % MT_N(TOOLS)];
		if (i < MT_N(TOOLS)) {
			json_array_append_new(a, mt_tool_json(t, NULL, NULL));
		} else {
			char name[96], desc[700];
			const char *srv = servers[(i / MT_N(TOOLS) - 1) % MT_N(servers)];
			snprintf(name, sizeof name, "mcp__%s%zu__%s", srv, i / MT_N(TOOLS), t->name);
			snprintf(desc, sizeof desc, "[MCP server %s] %s", srv, t->desc);
			json_array_append_new(a, mt_tool_json(t, name, desc));
		}
	}
	return a;
}

/* --- the session: tool calls, results, turns ------------------------------ */

struct mt_session {
	struct mt_rng *r;
	const struct mt_project *p;
	json_t *tools;          /* borrowed */
	int cmd_seq;
	int n_results;          /* tool results so far: every 4th is sent as text parts */
	int reasoning;          /* --reasoning: assistant messages carry reasoning_content */
	size_t write_lines;     /* --write-lines: write_file content lines (0: 12, no forced writes) */
};

static void mt_code_lines(struct kv_buf *b, struct mt_session *s, size_t n, int numbered, size_t first)
{
	const char *lang = s->p->lang;
	int py = !strcmp(lang, "python");
	for (size_t i = 0; i < n; i++) {
		const char *id = MT_PICK(s->r, IDENTS), *id2 = MT_PICK(s->r, IDENTS);
		const char *m1 = MT_PICK(s->r, MODULES), *m2 = MT_PICK(s->r, MODULES);
		if (numbered)
			kv_buf_printf(b, "%6zu\t", first + i);
		switch (mt_below(s->r, 6)) {
		case 0:
			if (!strcmp(lang, "python"))
				kv_buf_printf(b, "def %s(self, %s, timeout=%zu):", id, MT_PICK(s->r, MODULES), mt_below(s->r, 60));
			else if (!strcmp(lang, "go"))
				kv_buf_printf(b, "func (s *%sState) %s(ctx context.Context, n int) error {", MT_PICK(s->r, MODULES), id);
			else if (!strcmp(lang, "rust"))
				kv_buf_printf(b, "pub fn %s(&mut self, %s: &[u8]) -> Result<usize, Error> {", id, MT_PICK(s->r, MODULES));
			else
				kv_buf_printf(b, "export async function %s(%s: Options): Promise<void> {", id, MT_PICK(s->r, MODULES));
			break;
		case 1:
			if (py)
				kv_buf_printf(b, "    %s = %s(%s, %zu)", m1, id, id2, mt_below(s->r, 1000));
			else if (!strcmp(lang, "go"))
				kv_buf_printf(b, "\t%s := %s(%s, %zu)", m1, id, id2, mt_below(s->r, 1000));
			else if (!strcmp(lang, "rust"))
				kv_buf_printf(b, "    let %s = self.%s(%s, %zu)?;", m1, id, id2, mt_below(s->r, 1000));
			else
				kv_buf_printf(b, "  const %s = await %s(%s, %zu);", m1, id, id2, mt_below(s->r, 1000));
			break;
		case 2:
			if (py)
				kv_buf_printf(b, "    if %s is None or len(%s) == 0:", m1, m2);
			else if (!strcmp(lang, "go"))
				kv_buf_printf(b, "\tif %s == nil || len(%s) == 0 {", m1, m2);
			else if (!strcmp(lang, "rust"))
				kv_buf_printf(b, "    if %s.is_empty() {", m1);
			else
				kv_buf_printf(b, "  if (!%s || %s.length === 0) {", m1, m2);
			break;
		case 3:
			kv_buf_printf(b, "    %s %s", py ? "#" : "//", MT_PICK(s->r, REASONS));
			break;
		case 4:
			kv_buf_printf(b, "        return %s(%s)%s", id, id2, py ? "" : ";");
			break;
		default:
			if (py)
				kv_buf_printf(b, "    log.debug(\"%s: %%s\", %s)", id, id2);
			else if (!strcmp(lang, "go"))
				kv_buf_printf(b, "\tlog.Printf(\"%s: %%v\", %s)", id, id2);
			else if (!strcmp(lang, "rust"))
				kv_buf_printf(b, "    debug!(\"%s: {:?}\", %s);", id, id2);
			else
				kv_buf_printf(b, "  logger.debug(`%s: ${%s}`);", id, id2);
			break;
		}
		kv_buf_addc(b, '\n');
	}
}

static void mt_abs(char *out, size_t n, const struct mt_session *s, const char *rel)
{
	snprintf(out, n, "%s/%s", s->p->root, rel);
}

static void mt_test_cmd(char *out, size_t n, const struct mt_session *s, const char *file)
{
	const char *l = s->p->lang;
	if (!strcmp(l, "python"))
		snprintf(out, n, "python -m pytest -q %s", file);
	else if (!strcmp(l, "go"))
		snprintf(out, n, "go test ./src/... -run Test -count=1");
	else if (!strcmp(l, "rust"))
		snprintf(out, n, "cargo test --quiet -- --nocapture");
	else
		snprintf(out, n, "npx vitest run %s", file);
}

/* Arguments for a call of `name`, built from its parameter list so every
 * tool can be called; values follow the parameter's name and type. */
static json_t *mt_args(struct mt_session *s, const struct mt_tool *t, const char *file)
{
	json_t *a = json_object();
	char path[256];
	mt_abs(path, sizeof path, s, file);
	for (size_t i = 0; i < MT_N(t->p) && t->p[i].name; i++) {
		const struct mt_param *p = &t->p[i];
		const char *n = p->name;
		if (!p->required && !mt_chance(s->r, 1, 3))
			continue;
		if (strstr(n, "path") || !strcmp(n, "source") || !strcmp(n, "destination")) {
			if (!strcmp(p->type, "array")) {
				json_object_set_new(a, n, json_pack("[s]", file));
			} else if (!strcmp(n, "path") && (!strcmp(t->name, "grep") || !strcmp(t->name, "glob"))) {
				json_object_set_new(a, n, json_string("src"));
			} else if (!strcmp(n, "path") && (!strcmp(t->name, "list_dir") || !strcmp(t->name, "create_dir"))) {
				char d[300];
				snprintf(d, sizeof d, "%s/%s", s->p->root, mt_chance(s->r, 1, 2) ? "src" : "tests");
				json_object_set_new(a, n, json_string(d));
			} else {
				json_object_set_new(a, n, json_string(path));
			}
		} else if (!strcmp(n, "pattern")) {
			json_object_set_new(a, n, json_string(!strcmp(t->name, "glob") ? "src/**/*.*" : MT_PICK(s->r, IDENTS)));
		} else if (!strcmp(n, "command")) {
			char cmd[300];
			mt_test_cmd(cmd, sizeof cmd, s, file);
			json_object_set_new(a, n, json_string(cmd));
		} else if (!strcmp(n, "old_string") || !strcmp(n, "new_string") || !strcmp(n, "content") ||
			   !strcmp(n, "patch") || !strcmp(n, "new_source")) {
			struct kv_buf b = KV_BUF_INIT;
			mt_code_lines(&b, s, !strcmp(n, "content") ? (s->write_lines ? s->write_lines : 12) : 2 + mt_below(s->r, 4), 0,
				      0);
			json_object_set_new(a, n, json_string(b.p ? b.p : ""));
			kv_buf_free(&b);
		} else if (!strcmp(n, "todos") || !strcmp(n, "edits")) {
			json_t *arr = json_array();
			size_t k = 2 + mt_below(s->r, 3);
			for (size_t j = 0; j < k; j++) {
				if (!strcmp(n, "todos"))
					json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:s}", "id", (char[]){(char)('1' + j), 0},
									      "content", MT_PICK(s->r, ACTIONS), "status",
									      j == 0 ? "in_progress" : "pending", "priority",
									      j < 2 ? "high" : "medium"));
				else
					json_array_append_new(arr, json_pack("{s:s, s:s}", "old_string", MT_PICK(s->r, IDENTS),
									      "new_string", MT_PICK(s->r, IDENTS)));
			}
			json_object_set_new(a, n, arr);
		} else if (p->enums) {
			char tmp[256], *v[8];
			size_t nv = 0;
			snprintf(tmp, sizeof tmp, "%s", p->enums);
			for (char *save = NULL, *tk = strtok_r(tmp, "|", &save); tk && nv < 8; tk = strtok_r(NULL, "|", &save))
				v[nv++] = tk;
			json_object_set_new(a, n, json_string(v[mt_below(s->r, nv)]));
		} else if (!strcmp(p->type, "integer")) {
			json_object_set_new(a, n, json_integer(!strcmp(n, "offset") || strstr(n, "line") ? 1 + (json_int_t)mt_below(s->r, 300)
											     : 5 + (json_int_t)mt_below(s->r, 200)));
		} else if (!strcmp(p->type, "boolean")) {
			json_object_set_new(a, n, json_boolean(mt_chance(s->r, 1, 2)));
		} else if (!strcmp(p->type, "array")) {
			json_object_set_new(a, n, json_pack("[s, s]", "node_modules", "*.lock"));
		} else if (!strcmp(n, "url")) {
			json_object_set_new(a, n, json_string("https://docs.example.org/api/retry.html"));
		} else if (!strcmp(n, "symbol")) {
			json_object_set_new(a, n, json_string(MT_PICK(s->r, IDENTS)));
		} else if (!strcmp(n, "message")) {
			char m[200];
			snprintf(m, sizeof m, "%s: handle the empty %s case", MT_PICK(s->r, MODULES), MT_PICK(s->r, MODULES));
			json_object_set_new(a, n, json_string(m));
		} else if (!strcmp(n, "command_id")) {
			char id[32];
			snprintf(id, sizeof id, "bg-%d", s->cmd_seq);
			json_object_set_new(a, n, json_string(id));
		} else {
			char m[300];
			snprintf(m, sizeof m, "%s %s", TOOL_ADVICE[mt_below(s->r, MT_N(TOOL_ADVICE))][1], MT_PICK(s->r, CONDITIONS));
			json_object_set_new(a, n, json_string(m));
		}
	}
	return a;
}

/* What a tool "returned": shaped like the real tool's output. */
static char *mt_result_text(struct mt_session *s, const char *tool, const char *file)
{
	struct kv_buf b = KV_BUF_INIT;
	if (!strcmp(tool, "read_file")) {
		size_t first = 1 + mt_below(s->r, 200);
		mt_code_lines(&b, s, 25 + mt_below(s->r, 40), 1, first);
	} else if (!strcmp(tool, "grep") || !strcmp(tool, "find_references")) {
		size_t n = 3 + mt_below(s->r, 10);
		for (size_t i = 0; i < n; i++) {
			kv_buf_printf(&b, "%s:%zu:", mt_file(s->p, s->r), 1 + mt_below(s->r, 500));
			mt_code_lines(&b, s, 1, 0, 0);
		}
	} else if (!strcmp(tool, "glob") || !strcmp(tool, "list_dir")) {
		for (int i = 0; i < s->p->n_files; i++)
			if (mt_chance(s->r, 2, 3))
				kv_buf_printf(&b, "%s/%s\n", s->p->root, s->p->files[i]);
	} else if (!strcmp(tool, "run_command") || !strcmp(tool, "run_tests")) {
		size_t n = 6 + mt_below(s->r, 10), fails = mt_below(s->r, 3);
		kv_buf_printf(&b, "collected %zu items\n\n", n * 4);
		for (size_t i = 0; i < n; i++)
			kv_buf_printf(&b, "%s %s\n", s->p->files[16 + mt_below(s->r, 8)], i < fails ? "F..." : "....");
		if (fails) {
			kv_buf_printf(&b, "\n=================================== FAILURES ===================================\n"
					  "___________________________ test_%s ___________________________\n",
				      MT_PICK(s->r, IDENTS));
			mt_code_lines(&b, s, 6, 0, 0);
			kv_buf_printf(&b, "E   %s\n\n%s:%zu: error\n", MT_PICK(s->r, ERRORS), file, 10 + mt_below(s->r, 300));
		}
		kv_buf_printf(&b, "%zu failed, %zu passed in %zu.%02zus\n", fails, n * 4 - fails, mt_below(s->r, 9),
			      mt_below(s->r, 100));
	} else if (!strcmp(tool, "git_diff") || !strcmp(tool, "apply_patch")) {
		kv_buf_printf(&b, "diff --git a/%s b/%s\nindex 3f2a91c..8e4b0d2 100644\n--- a/%s\n+++ b/%s\n@@ -%zu,7 +%zu,8 @@\n",
			      file, file, file, file, 10 + mt_below(s->r, 90), 10 + mt_below(s->r, 90));
		for (int i = 0; i < 8; i++) {
			kv_buf_addc(&b, i == 3 ? '-' : i == 4 || i == 5 ? '+' : ' ');
			mt_code_lines(&b, s, 1, 0, 0);
		}
	} else if (!strcmp(tool, "edit") || !strcmp(tool, "multi_edit") || !strcmp(tool, "write_file")) {
		kv_buf_printf(&b, "The file %s/%s has been updated. Here's the result of running `cat -n` on a snippet of the edited file:\n",
			      s->p->root, file);
		mt_code_lines(&b, s, 8, 1, 40 + mt_below(s->r, 100));
	} else if (!strcmp(tool, "todo_write")) {
		kv_buf_adds(&b, "Todos have been modified successfully. Ensure that you continue to use the todo list to "
				"track your progress. Please proceed with the current tasks if applicable");
	} else if (!strcmp(tool, "git_status")) {
		kv_buf_printf(&b, "## main...origin/main\n M %s\n M %s\n?? %s\n", file, mt_file(s->p, s->r), mt_file(s->p, s->r));
	} else if (!strcmp(tool, "diagnostics")) {
		kv_buf_printf(&b, "%s:%zu:%zu: warning: unused variable '%s'\n", file, 1 + mt_below(s->r, 300), 1 + mt_below(s->r, 40),
			      MT_PICK(s->r, MODULES));
	} else {
		kv_buf_printf(&b, "ok (%s)\n", tool);
	}
	return kv_buf_take(&b);
}

/* Tools a coding agent actually calls during a task, in rough order. */
static const char *const EXPLORE[] = {"grep", "read_file", "list_dir", "glob", "find_references", "git_status"};
static const char *const CHANGE[] = {"edit", "read_file", "edit", "multi_edit", "write_file", "todo_write"};
static const char *const VERIFY[] = {"run_tests", "run_command", "git_diff", "diagnostics"};

static const struct mt_tool *mt_find_tool(const char *name, json_t *tools)
{
	/* only tools the request offers may be called */
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t)
	{
		const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
		if (n && !strcmp(n, name)) {
			for (size_t k = 0; k < MT_N(TOOLS); k++)
				if (!strcmp(TOOLS[k].name, name))
					return &TOOLS[k];
		}
	}
	return NULL;
}

static void mt_random_id(struct mt_rng *r, char *out, size_t n_chars)
{
	static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
	for (size_t i = 0; i < n_chars; i++)
		out[i] = al[mt_below(r, sizeof al - 1)];
	out[n_chars] = 0;
}

/* Fill "{ident}", "{file}", "{err}", "{mod}" in a task template. */
static char *mt_fill(struct mt_session *s, const char *tpl)
{
	struct kv_buf b = KV_BUF_INIT;
	for (const char *p = tpl; *p; p++) {
		if (*p == '{') {
			const char *e = strchr(p, '}');
			if (e) {
				size_t n = (size_t)(e - p - 1);
				if (n == 5 && !strncmp(p + 1, "ident", 5))
					kv_buf_adds(&b, MT_PICK(s->r, IDENTS));
				else if (n == 4 && !strncmp(p + 1, "file", 4))
					kv_buf_adds(&b, mt_file(s->p, s->r));
				else if (n == 3 && !strncmp(p + 1, "err", 3))
					kv_buf_adds(&b, MT_PICK(s->r, ERRORS));
				else if (n == 3 && !strncmp(p + 1, "mod", 3))
					kv_buf_adds(&b, MT_PICK(s->r, MODULES));
				else
					kv_buf_add(&b, p, (size_t)(e - p + 1));
				p = e;
				continue;
			}
		}
		kv_buf_addc(&b, *p);
	}
	return kv_buf_take(&b);
}

/* A user message; about one in three uses a list of text parts, as
 * clients that attach context (file mentions, IDE selections) send. */
static json_t *mt_user_msg(struct mt_session *s, const char *text)
{
	if (mt_chance(s->r, 1, 3)) {
		char ctx[300];
		snprintf(ctx, sizeof ctx, "<context>\nOpen file: %s/%s\nCursor at line %zu\n</context>", s->p->root,
			 mt_file(s->p, s->r), 1 + mt_below(s->r, 300));
		return json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s}]}", "role", "user", "content", "type", "text", "text", ctx,
				 "type", "text", "text", text);
	}
	return json_pack("{s:s, s:s}", "role", "user", "content", text);
}

/* Planning text for reasoning_content (--reasoning): what a thinking
 * model writes before it acts, 2-4 sentences. */
static char *mt_reasoning(struct mt_session *s, int step, int task_len)
{
	struct kv_buf b = KV_BUF_INIT;
	const char *file = mt_file(s->p, s->r);
	if (step >= task_len)
		kv_buf_printf(&b, "The change is in and the tests pass, so I can report back. I should mention %s in %s, "
				  "since it has the same shape and the user may want it next.", MT_PICK(s->r, IDENTS), file);
	else if (step == 0)
		kv_buf_printf(&b, "Before changing anything I need to see how %s is used. The failure mentions %s, so %s is the "
				  "place to start; I will look for its callers too.", MT_PICK(s->r, IDENTS), MT_PICK(s->r, ERRORS),
			      file);
	else
		kv_buf_printf(&b, "Now I understand the flow: %s passes %s straight through. The fix belongs in %s, and it "
				  "must keep the existing behaviour for the other callers.", MT_PICK(s->r, MODULES),
			      MT_PICK(s->r, IDENTS), file);
	size_t extra = mt_below(s->r, 3);
	for (size_t i = 0; i < extra; i++) {
		kv_buf_addc(&b, ' ');
		mt_sentence(&b, s->r);
	}
	return kv_buf_take(&b);
}

/* The reasoning_content of an assistant message, when asked for. */
static int mt_add_reasoning(struct mt_session *s, json_t *msg, int step, int task_len)
{
	if (!s->reasoning)
		return 0;
	char *r = mt_reasoning(s, step, task_len);
	if (!r)
		return -1;
	json_object_set_new(msg, "reasoning_content", json_string(r));
	free(r);
	return 0;
}

/*
 * The assistant's reply at step `step` of a task: tool calls (appended to
 * msgs together with their results) or, when the task is done, a text
 * answer followed by the user's next message. Returns 0 or -1 on OOM.
 */
static int mt_step(struct mt_session *s, json_t *msgs, int step, int task_len)
{
	if (step >= task_len) {
		char *ans = NULL;
		struct kv_buf b = KV_BUF_INIT;
		kv_buf_printf(&b, "Done. I changed `%s` in %s so that %s, and added a test for it. ", MT_PICK(s->r, IDENTS),
			      mt_file(s->p, s->r), MT_PICK(s->r, ANSWER_FIXES));
		kv_buf_printf(&b, "The full suite passes (%zu tests). One thing to note: %s in %s has the same pattern; "
				  "I left it alone since it is outside this task.",
			      100 + mt_below(s->r, 400), MT_PICK(s->r, IDENTS), mt_file(s->p, s->r));
		ans = kv_buf_take(&b);
		if (!ans)
			return -1;
		json_t *am = json_pack("{s:s, s:s}", "role", "assistant", "content", ans);
		free(ans);
		if (mt_add_reasoning(s, am, step, task_len)) {
			json_decref(am);
			return -1;
		}
		json_array_append_new(msgs, am);
		char *u = mt_fill(s, mt_chance(s->r, 1, 2) ? MT_PICK(s->r, FOLLOWUPS) : MT_PICK(s->r, TASKS));
		if (!u)
			return -1;
		json_array_append_new(msgs, mt_user_msg(s, u));
		free(u);
		return 0;
	}
	const char *const *pool = step == 0 ? EXPLORE : step == task_len - 1 ? VERIFY : CHANGE;
	size_t pool_n = step == 0 ? MT_N(EXPLORE) : step == task_len - 1 ? MT_N(VERIFY) : MT_N(CHANGE);
	size_t n_calls = step == 0 && mt_chance(s->r, 1, 2) ? 2 + mt_below(s->r, 2) : 1;
	json_t *calls = json_array(), *results = json_array();
	for (size_t c = 0; c < n_calls; c++) {
		const struct mt_tool *t = mt_find_tool(pool[mt_below(s->r, pool_n)], s->tools);
		/* --write-lines: every change step writes a whole file through its arguments */
		if (s->write_lines && c == 0 && pool == CHANGE && mt_find_tool("write_file", s->tools))
			t = mt_find_tool("write_file", s->tools);
		if (!t)
			t = mt_find_tool("read_file", s->tools);
		if (!t) /* fewer tools than the basics: call the first one offered */
			t = &TOOLS[0];
		const char *file = mt_file(s->p, s->r);
		json_t *args = mt_args(s, t, file);
		char *args_s = json_dumps(args, JSON_COMPACT);
		json_decref(args);
		char id[40] = "call_";
		mt_random_id(s->r, id + 5, 24);
		if (!args_s) {
			json_decref(calls);
			json_decref(results);
			return -1;
		}
		json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
						       "name", t->name, "arguments", args_s));
		free(args_s);
		char *res = mt_result_text(s, t->name, file);
		if (!res) {
			json_decref(calls);
			json_decref(results);
			return -1;
		}
		/* a fixed share rather than a coin: every trace with four results has both forms */
		json_t *content = ++s->n_results % 4 == 0 ? json_pack("[{s:s, s:s}]", "type", "text", "text", res) : json_string(res);
		free(res);
		json_array_append_new(results, json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", id, "content", content));
	}
	json_t *am = json_pack("{s:s, s:n, s:o}", "role", "assistant", "content", "tool_calls", calls);
	if (mt_add_reasoning(s, am, step, task_len)) {
		json_decref(am);
		json_decref(results);
		return -1;
	}
	json_array_append_new(msgs, am);
	json_array_extend(msgs, results);
	json_decref(results);
	return 0;
}

/* --- command ------------------------------------------------------------- */

static int cmd_bench_mktrace(int argc, char **argv)
{
	int64_t n_tools = 30, sys_tokens = 8000, turns = 10, seed = 1, max_tokens = 4096, write_lines = 0;
	const char *out_path = NULL, *model = "kvkeep";
	int quiet = 0, reasoning = 0;
	const struct kv_flag flags[] = {
		{"tools", KV_FLAG_INT, &n_tools, "N", "number of function tools (default 30; past 30, MCP-style copies)"},
		{"system-tokens", KV_FLAG_INT, &sys_tokens, "N", "approximate system prompt size in tokens (default 8000)"},
		{"turns", KV_FLAG_INT, &turns, "T", "number of requests in the trace (default 10)"},
		{"seed", KV_FLAG_INT, &seed, "S", "seed of the generator; same flags + seed = same bytes (default 1)"},
		{"out", KV_FLAG_STR, &out_path, "FILE", "write the JSONL trace here (default: stdout)"},
		{"model", KV_FLAG_STR, &model, "NAME", "the \"model\" field of every request (default kvkeep)"},
		{"max-tokens", KV_FLAG_INT, &max_tokens, "N", "the \"max_tokens\" field of every request (default 4096)"},
		{"reasoning", KV_FLAG_BOOL, &reasoning, NULL,
		 "every assistant message carries reasoning_content, as clients of thinking models send it back"},
		{"write-lines", KV_FLAG_INT, &write_lines, "N",
		 "every change step writes a file of N lines through write_file's arguments (default 0: no forced writes)"},
		{"quiet", KV_FLAG_BOOL, &quiet, NULL, "do not print the summary line to stderr"},
		{0}};
	const char *usage = "usage: kvkeep bench mktrace [--tools N] [--system-tokens N] [--turns T] [--seed S] [--out FILE]\n\n"
			    "Writes a synthetic coding-agent trace (JSONL, one chat request body per line) for\n"
			    "`kvkeep bench replay`. Each request extends the previous one's messages.";
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (n_tools < 0 || n_tools > 1000 || sys_tokens < 0 || sys_tokens > 1000000 || turns < 1 || turns > 10000 ||
	    max_tokens < 1 || write_lines < 0 || write_lines > 100000) {
		fprintf(stderr, "kvkeep: bench mktrace: --tools must be 0..1000, --system-tokens 0..1000000, --turns "
				"1..10000, --max-tokens >= 1, --write-lines 0..100000\n");
		return 2;
	}

	struct mt_rng r = {(uint64_t)seed};
	struct mt_project proj;
	size_t est = 0;
	mt_project_init(&proj, &r);
	char *sys = mt_system_prompt(&r, &proj, (size_t)sys_tokens, &est);
	json_t *tools = mt_tools((size_t)n_tools);
	json_t *msgs = json_array();
	struct kv_buf out = KV_BUF_INIT;
	struct mt_session s = {&r, &proj, tools, 1, 0, reasoning, (size_t)write_lines};
	int err = sys == NULL || !tools || !msgs;
	char user_id[40] = "mktrace-";

	mt_random_id(&r, user_id + 8, 12);
	if (!err) {
		json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", sys));
		char *u = mt_fill(&s, MT_PICK(&r, TASKS));
		err = !u;
		if (u)
			json_array_append_new(msgs, mt_user_msg(&s, u));
		free(u);
	}
	int step = 0, task_len = 2 + (int)mt_below(&r, 3);
	for (int64_t k = 0; k < turns && !err; k++) {
		json_t *body = json_object();
		json_object_set_new(body, "model", json_string(model));
		json_object_set_new(body, "messages", json_deep_copy(msgs));
		if (n_tools > 0) {
			json_object_set(body, "tools", tools);
			json_object_set_new(body, "tool_choice", json_string("auto"));
			json_object_set_new(body, "parallel_tool_calls", json_true());
		}
		json_object_set_new(body, "stream", json_true());
		json_object_set_new(body, "stream_options", json_pack("{s:b}", "include_usage", 1));
		json_object_set_new(body, "max_tokens", json_integer(max_tokens));
		json_object_set_new(body, "user", json_string(user_id));
		char *line = json_dumps(body, JSON_COMPACT);
		json_decref(body);
		if (!line) {
			err = 1;
			break;
		}
		kv_buf_adds(&out, line);
		kv_buf_addc(&out, '\n');
		free(line);
		if (k + 1 < turns) {
			if (mt_step(&s, msgs, step, task_len)) {
				err = 1;
				break;
			}
			if (step >= task_len) {
				step = 0;
				task_len = 2 + (int)mt_below(&r, 3);
			} else {
				step++;
			}
		}
	}
	json_decref(msgs);
	json_decref(tools);
	free(sys);
	if (err || out.oom) {
		kv_buf_free(&out);
		fprintf(stderr, "kvkeep: bench mktrace: out of memory\n");
		return 1;
	}
	if (out_path) {
		rc = kv_durable_write(out_path, out.p, out.len, KV_DW_PUBLIC);
		if (rc) {
			fprintf(stderr, "kvkeep: bench mktrace: %s\n", kv_errmsg());
			kv_buf_free(&out);
			return 1;
		}
	} else if (fwrite(out.p, 1, out.len, stdout) != out.len || fflush(stdout)) {
		kv_buf_free(&out);
		return 1;
	}
	if (!quiet)
		fprintf(stderr, "mktrace: %lld requests, %lld tools, system prompt ~%zu tokens (estimate), %zu bytes%s%s\n",
			(long long)turns, (long long)n_tools, est, out.len, out_path ? " -> " : "", out_path ? out_path : "");
	kv_buf_free(&out);
	return 0;
}
KV_COMMAND(bench_mktrace, "bench mktrace", "write a synthetic coding-agent trace for bench replay", cmd_bench_mktrace);
