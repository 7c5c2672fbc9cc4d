/*
 * gbnf.h - llama.cpp's grammar syntax (GBNF) parsed into the grammar IR
 * (gram.h). The syntax, as llama.cpp's grammars/README.md describes it:
 *
 *   rule     ::= NAME "::=" alts (newline | end)
 *   alts     ::= seq ("|" seq)*            a newline may follow "|" and "::="
 *   seq      ::= item*                     newlines only inside ( )
 *   item     ::= atom ("*" | "+" | "?" | "{" m "}" | "{" m ",}" | "{" m "," n "}" | "{," n "}")*
 *   atom     ::= "\"" chars "\"" | "[" "^"? (char ("-" char)?)* "]" | "." | NAME | "(" alts ")"
 *   comment  ::= "#" to the end of the line
 * NAME is [A-Za-z0-9_-]+ (llama.cpp: letters, digits and "-"; "_" is also
 * accepted here). Terminals are Unicode code points, matched as their
 * UTF-8 bytes; escapes in literals and classes: \n \r \t \\ \" \[ \] \-
 * \xHH \uHHHH \UHHHHHHHH (a code point, as in llama.cpp: \xFF is U+00FF).
 * "." is any code point. The start rule is "root".
 *
 * Not supported (a clear error): llama.cpp's token references <[id]> and
 * <token> (they match token ids, not text).
 *
 * Errors are KV_ERR_INVALID with "line L column C: what" (columns count
 * code points from 1): a bad escape, an unclosed literal, class or group,
 * a repetition bound over KV_GRAM_MAX_REP, a rule defined twice, a rule
 * used but never defined (named with where it is first used), no root
 * rule. Left recursion and other problems of the grammar as a whole are
 * found when it is compiled (gpda.h). The work is linear in the input;
 * groups nest at most KV_GBNF_MAX_NEST deep.
 */
#ifndef KV_TEXT_GBNF_H
#define KV_TEXT_GBNF_H

#include <stddef.h>

#include "text/gram.h"

#define KV_GBNF_MAX_NEST 200

/* Parse text[0..len) into a new grammar (*out, kv_gram_free). */
int kv_gbnf_parse(const char *text, size_t len, struct kv_gram **out);

#endif
