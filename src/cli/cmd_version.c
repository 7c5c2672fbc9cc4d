/*
 * cmd_version.c - `kvkeep version`.
 */
#include "cli/cli.h"

#include <stdio.h>

static int cmd_version(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("kvkeep %s\n", KVKEEP_VERSION);
	return 0;
}
KV_COMMAND(version, "version", "print the version", cmd_version);
