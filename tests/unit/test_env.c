/*
 * test_env.c - the environment table (base/env.h): read once, unset and
 * empty kept apart, and docs/operations.md shows exactly the table the
 * code has.
 */
#include "kt.h"

#include "base/buf.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs first: nothing in this program reads the table before it. */
KT_CASE(read_once)
{
	KT_OK(setenv("KVKEEP_BENCH_BATCH_DEBUG", "", 1));
	KT_OK(unsetenv("KVKEEP_ISA"));
	KT_OK(setenv("KVKEEP_THREADS", "3", 1));
	const char *e = kv_env(KV_ENV_BENCH_BATCH_DEBUG);
	KT_CHECK(e != NULL && *e == 0); /* set to nothing is not unset */
	KT_CHECK(kv_env(KV_ENV_ISA) == NULL);
	KT_EQ_STR(kv_env(KV_ENV_THREADS), "3");
	/* later changes are not seen: every reader sees one value */
	KT_OK(setenv("KVKEEP_THREADS", "5", 1));
	KT_OK(setenv("KVKEEP_ISA", "scalar", 1));
	KT_EQ_STR(kv_env(KV_ENV_THREADS), "3");
	KT_CHECK(kv_env(KV_ENV_ISA) == NULL);
	KT_CHECK(kv_env(-1) == NULL && kv_env(KV_ENV__COUNT) == NULL);
}

KT_CASE(table_complete)
{
	for (int i = 0; i < KV_ENV__COUNT; i++) {
		const struct kv_env_info *in = kv_env_info(i);
		KT_REQUIRE(in != NULL);
		KT_CHECKF(in->name && *in->name && in->kind && *in->kind && in->def && *in->def && in->doc && *in->doc,
			  "entry %d has an empty field", i);
		for (int j = 0; j < i; j++)
			KT_CHECKF(strcmp(in->name, kv_env_info(j)->name), "%s twice", in->name);
	}
	KT_CHECK(kv_env_info(KV_ENV__COUNT) == NULL);
	KT_EQ_STR(kv_env_info(KV_ENV_LOG)->name, "KVKEEP_LOG");
}

/* docs/operations.md holds the generated table verbatim. */
KT_CASE(docs_match_the_table)
{
	struct kv_buf b = KV_BUF_INIT;
	char *doc = NULL;
	KT_OK(kv_env_markdown(&b));
	KT_REQUIRE(b.p != NULL);
	KT_OK(kv_io_read_file("docs/operations.md", 4u << 20, &doc, NULL));
	if (doc)
		KT_CHECKF(strstr(doc, b.p) != NULL,
			  "docs/operations.md (Environment) is not the table of src/base/env.c; it should read:\n%s", b.p);
	free(doc);
	kv_buf_free(&b);
}

KT_MAIN(read_once, table_complete, docs_match_the_table)
