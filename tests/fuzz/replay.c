/*
 * replay.c - runs a libFuzzer target over a corpus folder with gcc, so
 * `make test` exercises every saved input (crashers included) without
 * clang. Usage: replay_<name> DIR [DIR...]. Prints one ok/FAIL line.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	uint8_t *buf;
	if (!f || fstat(fileno(f), &st) != 0) {
		if (f)
			fclose(f);
		return -1;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)st.st_size);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	int n = 0, bad = 0;
	const char *name = strrchr(argv[0], '/');
	name = name ? name + 1 : argv[0];
	for (int a = 1; a < argc; a++) {
		DIR *d = opendir(argv[a]);
		struct dirent *e;
		if (!d) {
			printf("FAIL %s: cannot open corpus %s\n", name, argv[a]);
			return 1;
		}
		while ((e = readdir(d))) {
			char p[4096];
			if (e->d_name[0] == '.')
				continue;
			snprintf(p, sizeof p, "%s/%s", argv[a], e->d_name);
			if (run_file(p) != 0)
				bad++;
			n++;
		}
		closedir(d);
	}
	if (n == 0 || bad) {
		printf("FAIL %s: %d inputs, %d unreadable\n", name, n, bad);
		return 1;
	}
	printf("ok %s: %d inputs\n", name, n);
	return 0;
}
