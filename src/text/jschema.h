/*
 * jschema.h - JSON Schema compiled into the grammar IR (gram.h): the
 * grammar of the JSON texts the schema accepts, in one fixed layout.
 *
 * Layout (the whitespace policy): compact JSON as models write it, with
 * one optional space after ',' and ':' and nothing else: no space after
 * '{' / '[' or before '}' / ']', no newlines, nothing before or after the
 * value. Object properties come in the schema's order ("properties"
 * order, then required names that "properties" lacks); an optional
 * property may be left out. Strings are written with the escapes JSON
 * needs and \uXXXX for any code point except surrogates; a value from
 * "enum" / "const" in one canonical form (json.dumps style: ", ", ": ").
 *
 * Keywords (docs/constrain.md has the full table):
 *   type (a name or a list), properties, required, additionalProperties
 *   (true, false or a schema; absent means none when "properties" is
 *   given, any when it is not), enum, const, anyOf, oneOf (as anyOf: the
 *   branches are not checked for overlap), allOf (merged into one schema:
 *   properties, required, types, and keywords with equal values), items,
 *   prefixItems, additionalItems, items as an array (older tuple form),
 *   minItems, maxItems, $ref to "#", "#/$defs/..", "#/definitions/.." or
 *   any JSON pointer in the document (recursion allowed), nullable: true,
 *   string formats date, time, date-time, uuid, email, hostname, ipv4, uri
 *   and uri-reference (each a subset of what the format allows), pattern
 *   (jsregex.h), minLength, maxLength, number and integer with minimum,
 *   maximum, exclusiveMinimum, exclusiveMaximum (integers exactly;
 *   numbers exactly for integer bounds, a bound with a fraction is
 *   rounded inward), multipleOf 1, and keywords whose value asks for
 *   nothing (uniqueItems false, minProperties 0, ...).
 *   Annotations (title, description, default, examples, $schema, $id,
 *   $comment, deprecated, readOnly, writeOnly, and any keyword that is
 *   not a validation keyword, such as x-... extensions) are ignored.
 *   Validation keywords that are not supported (not, if/then/else,
 *   patternProperties, propertyNames, dependentRequired,
 *   dependentSchemas, dependencies, unevaluatedProperties,
 *   unevaluatedItems, contains, minContains, maxContains, uniqueItems
 *   true, multipleOf other than 1, minProperties / maxProperties beyond
 *   what the required / listed properties give, $dynamicRef,
 *   $recursiveRef, a format not listed above, length bounds together with
 *   a pattern or format) are an error naming the keyword and where it is
 *   when strict is set, and are ignored otherwise (the output may then
 *   break that keyword).
 *
 * Numbers: at most 16 integer digits, 16 fraction digits and a two-digit
 * exponent (no exponent when the number has bounds).
 */
#ifndef KV_TEXT_JSCHEMA_H
#define KV_TEXT_JSCHEMA_H

#include <jansson.h>

#include "text/gram.h"

struct kv_js_opts {
	int strict;                 /* unsupported keyword -> KV_ERR_UNSUPPORTED */
	const char *const *forbid;  /* ASCII words no string may contain raw (the
				     * tool-call closing tags); NULL-terminated */
	int raw_strings;            /* top-level string values as raw text, not JSON
				     * (Qwen3.5 XML tool-call parameters) */
};

/* The value schema: an expression in g (*expr). Errors are
 * KV_ERR_INVALID (a schema that is wrong or can match nothing) or
 * KV_ERR_UNSUPPORTED (strict), the message naming the keyword and its
 * JSON pointer ("#/properties/path/pattern"). */
int kv_jschema_expr(struct kv_gram *g, const json_t *schema, const struct kv_js_opts *o, int *expr);
/* A new grammar whose root is the schema's value. */
int kv_jschema_compile(const json_t *schema, const struct kv_js_opts *o, struct kv_gram **out);
/* Raw text (valid UTF-8, newlines included) containing none of the
 * NULL-terminated ASCII words (each starting with '<'): the free text of
 * tool_choice auto / none, which must not open a tool call. */
int kv_jschema_text_without(struct kv_gram *g, const char *const *words, int *expr);
/* json_object mode: any JSON object. */
int kv_jschema_any_object(const struct kv_js_opts *o, struct kv_gram **out);

#endif
