/*
 * child.h - run a server (normally `kvkeep serve`) as a child process on a
 * loopback port, wait until GET /health answers 200, stop it with SIGTERM.
 *
 * Used by `kvkeep chat --model` and `kvkeep bench replay --spawn`
 * (including its restarts, which reuse the same port and arguments).
 *
 * The command is given as words; a first word "kvkeep" means this very
 * binary (/proc/self/exe). "--port P" is appended. The child dies with its
 * parent (PR_SET_PDEATHSIG), never writes into the parent's stdout (its
 * stdout and stderr go to log_path, or to the parent's stderr), and with
 * ignore_sigint leaves Ctrl-C to the parent. When the port was chosen here
 * and the child exits before it is ready (another process took the port),
 * start tries again on a new port, three times in all.
 */
#ifndef KV_CLIENT_CHILD_H
#define KV_CLIENT_CHILD_H

#include <stddef.h>
#include <sys/types.h>

struct kcl_child {
	char **argv;              /* malloc'd words, NULL-terminated, "--port P" last */
	int argc;
	pid_t pid;                /* 0 when not running */
	int port;
	int auto_port;            /* the port was picked here (may be re-picked) */
	char url[64];             /* http://127.0.0.1:PORT */
	/* options, set between init and start */
	const char *log_path;     /* append the child's output here; NULL: our stderr */
	const char *log_level;    /* KVKEEP_LOG for the child when it is unset; NULL: inherit */
	int ignore_sigint;        /* the child ignores SIGINT */
	double ready_timeout_s;   /* default 120 */
	double stop_timeout_s;    /* SIGTERM, then SIGKILL after this; default 30 */
};

/* A loopback port nobody listens on right now (the kernel's pick); -1 if none. */
int kcl_free_port(void);
/* Copy the command words, add "--port P" (port 0: a free one). */
int kcl_child_init(struct kcl_child *c, char *const *words, int n_words, int port);
/* Start and wait for /health == 200. *ready_s (may be NULL): seconds it
 * took. KV_ERR_IO (exited early: the message says how), KV_ERR_TIMEOUT
 * (killed after ready_timeout_s). */
int kcl_child_start(struct kcl_child *c, double *ready_s);
/* SIGTERM and wait; SIGKILL after stop_timeout_s (KV_ERR_TIMEOUT).
 * *stop_s and desc ("exited 0", "killed by signal 9") may be NULL. */
int kcl_child_stop(struct kcl_child *c, double *stop_s, char *desc, size_t cap);
/* Stop if running, then free the words. */
void kcl_child_free(struct kcl_child *c);
/* "exited N" / "killed by signal N" of a wait status. */
void kcl_child_status_text(int status, char *out, size_t cap);

#endif
