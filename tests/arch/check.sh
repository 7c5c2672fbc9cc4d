#!/usr/bin/env bash
# tests/arch/check.sh - the architecture check of docs/style.md in
# `make test` (tests/run.sh runs it with the other scripts).
#
# First a self-test: tests/arch/check.py runs on small synthetic trees
# with one fault of each kind (a layer crossing, a folder that is not a
# layer, a circle, a long file, a long function) and must report each one,
# and must not report what only looks like a fault (a call inside a
# comment or a string, static functions, a file
# or a function exactly at its limit). A rule that cannot fail checks
# nothing, so these cases keep each rule honest. Then the check itself on
# src/, whose lines (ok arch_<rule>_<folder> / FAIL ...: why) pass through.
# Prints one "ok NAME" / "FAIL NAME: why" line per case.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
CHECK="$ROOT/tests/arch/check.py"
T=$(mktemp -d "${TMPDIR:-/tmp}/kt-arch.XXXXXX")
trap 'rm -rf "$T"' EXIT

ok() { echo "ok arch_selftest:$1"; }
fail() { echo "FAIL arch_selftest:$1: $2"; }

# put FILE: write stdin to $T/bad/src/FILE (folders made)
put() { mkdir -p "$(dirname "$T/$1")" && cat >"$T/$1"; }

# --- a tree with one fault of each kind ---------------------------------------
put bad/src/base/a.c <<'C'
#include "base/a.h"
#include "cli/cli.h"
int kv_a(void) { return 1; }
C
put bad/src/server/s.c <<'C'
#include "client/c.h"
/* #include "cli/x.h" is only in a comment */
int ksv_s(void) { return 0; }
C
put bad/src/client/c.c <<'C'
#include "server/s.h"
int kcl_c(void) { return ksv_s(); }
C
put bad/src/zzz/z.c <<'C'
int z(void) { return 0; }
C
# store: x -> y -> x is a circle
put bad/src/store/x.c <<'C'
int ks_x(void) { return ks_y() + 1; }
C
put bad/src/store/y.c <<'C'
int ks_y(int d) { return d ? ks_x() : 0; }
C
# cache: p names q's function only in a comment and a string, q calls p;
# r and q both define a static helper of the same name: no circle
put bad/src/cache/p.c <<'C'
/* kc_q() would be a circle */
// kc_q();
static const char *s = "kc_q()";
int kc_p(void) { return s[0]; }
C
put bad/src/cache/q.c <<'C'
static int helper(void) { return 2; }
int kc_q(void) { return kc_p() + helper(); }
C
put bad/src/cache/r.c <<'C'
static int helper(void) { return 3; }
int kc_r(void) { return helper() + kc_q(); }
C
# text: two circles, both reported (no folder has an exception)
put bad/src/text/jinja_eval.c <<'C'
int kj_eval(void) { return kj_value(); }
C
put bad/src/text/jinja_value.c <<'C'
int kj_value(void) { return kj_call(); }
C
put bad/src/text/jinja_builtins.c <<'C'
int kj_call(void) { return kj_eval(); }
C
put bad/src/text/jinja_lex.c <<'C'
int kj_lex(void) { return kj_parse(); }
C
put bad/src/text/jinja_parse.c <<'C'
int kj_parse(void) { return kj_lex(); }
C
# model: 2001 lines (over), engine: 2000 lines (at the limit)
{ for i in $(seq 1 2001); do echo "int kv_big_$i;"; done; } | put bad/src/model/big.c
{ for i in $(seq 1 2000); do echo "int ke_fit_$i;"; done; } | put bad/src/engine/fit.c
# session: a 251-line function (over) and a 250-line one (at the limit)
{
	echo "int kss_long(void)"; echo "{"; echo "	int x = 0;"
	for i in $(seq 1 246); do echo "	x += $i;"; done
	echo "	return x;"; echo "}"
	echo "int kss_fits(void)"; echo "{"
	for i in $(seq 1 246); do echo "	;"; done
	echo "	return 0;"; echo "}"
} | put bad/src/session/f.c

"$PY" "$CHECK" --root "$T/bad" >"$T/bad.out" 2>"$T/bad.err"
rc=$?
line() { grep "^$1" "$T/bad.out"; }
expect_fail() { # case rule_folder pattern
	if line "FAIL arch_$2:" | grep -qF -- "$3"; then ok "$1"; else fail "$1" "no 'FAIL arch_$2' naming '$3' in: $(tr '\n' '|' <"$T/bad.out" | head -c 1500)"; fi
}
expect_ok() { # case rule_folder
	if line "ok arch_$2\$" >/dev/null; then ok "$1"; else fail "$1" "want 'ok arch_$2', got: $(line ".*arch_$2[:]* " ; line "ok arch_$2")"; fi
}
if [ "$rc" -eq 1 ]; then ok exit_status_on_faults; else fail exit_status_on_faults "want status 1, got $rc ($(head -c 300 "$T/bad.err"))"; fi
expect_fail layer_crossing layers_base "base/a.c includes cli/cli.h"
expect_fail client_above_server layers_server "server/s.c includes client/c.h"
expect_ok client_may_include_server layers_client
expect_fail unknown_folder layers_zzz "src/zzz/ is not a layer"
expect_fail circle circles_store "x.c -> y.c -> x.c"
expect_ok comments_strings_and_statics_are_not_calls circles_cache
expect_fail circle_of_two circles_text "jinja_lex.c -> jinja_parse.c -> jinja_lex.c"
expect_fail circle_of_three circles_text "jinja_builtins.c"

expect_fail long_file filesize_model "model/big.c: 2001 lines"
expect_ok file_at_the_limit filesize_engine
expect_fail long_function funcsize_session "kss_long: 251 lines"
if line "FAIL arch_funcsize_session:" | grep -q "kss_fits"; then
	fail function_at_the_limit "kss_fits (250 lines) was reported"
else
	ok function_at_the_limit
fi

# --- a clean tree passes --------------------------------------------------------
mkdir -p "$T/good/src/base" "$T/good/src/cache"
printf '#include "base/b.h"\nint kv_b(void) { return 0; }\n' >"$T/good/src/base/b.c"
printf '#include "base/b.h"\n#include "cache/c.h"\nint kc_c(void) { return kv_b() + kc_d(); }\n' >"$T/good/src/cache/c.c"
printf 'int kc_d(void) { return 1; }\n' >"$T/good/src/cache/d.c"
if "$PY" "$CHECK" --root "$T/good" >"$T/good.out" 2>&1 && ! grep -q '^FAIL' "$T/good.out" &&
	[ "$(grep -c '^ok arch_' "$T/good.out")" -eq 8 ]; then
	ok clean_tree_passes
else
	fail clean_tree_passes "$(tr '\n' '|' <"$T/good.out" | head -c 600)"
fi

# --- the check of src/ ----------------------------------------------------------
"$PY" "$CHECK" --root "$ROOT"
rc=$?
# 0: all ok, 1: FAIL lines printed; anything else is a tool error with no
# FAIL line, which tests/run.sh counts as a failure
[ "$rc" -le 1 ] || exit "$rc"
exit 0
