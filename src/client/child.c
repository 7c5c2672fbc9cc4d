/*
 * child.c - see child.h.
 */
#include "client/child.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "client/http_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

int kcl_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	int port = -1;
	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

void kcl_child_status_text(int st, char *out, size_t cap)
{
	if (WIFEXITED(st))
		snprintf(out, cap, "exited %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(out, cap, "killed by signal %d", WTERMSIG(st));
	else
		snprintf(out, cap, "status 0x%x", st);
}

/* (Re)write the last argument, the port, and the URL. */
static int set_port(struct kcl_child *c, int port)
{
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	free(c->argv[c->argc - 1]);
	c->argv[c->argc - 1] = strdup(ps);
	if (!c->argv[c->argc - 1])
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	c->port = port;
	snprintf(c->url, sizeof c->url, "http://127.0.0.1:%d", port);
	return KV_OK;
}

int kcl_child_init(struct kcl_child *c, char *const *words, int n, int port)
{
	memset(c, 0, sizeof *c);
	if (n <= 0)
		return kv_fail(KV_ERR_INVALID, "no command to start");
	c->argv = calloc((size_t)n + 3, sizeof *c->argv);
	if (!c->argv)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (int i = 0; i < n; i++)
		c->argv[i] = strdup(words[i]);
	if (!strcmp(words[0], "kvkeep")) {
		char self[4096];
		ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
		if (l > 0) {
			self[l] = 0;
			free(c->argv[0]);
			c->argv[0] = strdup(self);
		}
	}
	c->argv[n] = strdup("--port");
	c->argc = n + 2;
	for (int i = 0; i < n + 1; i++)
		if (!c->argv[i])
			return kv_fail(KV_ERR_NOMEM, "out of memory");
	c->auto_port = port <= 0;
	if (c->auto_port && (port = kcl_free_port()) <= 0)
		return kv_fail(KV_ERR_IO, "no free loopback port");
	return set_port(c, port);
}

/* One start attempt. *died: the child exited before it was ready. */
static int start_once(struct kcl_child *c, double t0, int *died)
{
	int log_fd = -1;
	*died = 0;
	if (c->log_path) {
		log_fd = open(c->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (log_fd < 0)
			return kv_fail(KV_ERR_IO, "server log %s: %s", c->log_path, strerror(errno));
	}
	/* read before fork: the child only calls async-signal-safe things
	 * until exec, and the table's first read takes a lock */
	int set_log = c->log_level && !kv_env(KV_ENV_LOG);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0) {
		if (log_fd >= 0)
			close(log_fd);
		return kv_fail(KV_ERR_IO, "fork: %s", strerror(errno));
	}
	if (pid == 0) {
		/* the server must not outlive us, and must never write into our stdout */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (log_fd >= 0) {
			dup2(log_fd, 1);
			dup2(log_fd, 2);
		} else {
			dup2(2, 1);
		}
		signal(SIGINT, c->ignore_sigint ? SIG_IGN : SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		if (set_log)
			setenv("KVKEEP_LOG", c->log_level, 1);
		execvp(c->argv[0], c->argv);
		fprintf(stderr, "cannot run %s: %s\n", c->argv[0], strerror(errno));
		_exit(127);
	}
	if (log_fd >= 0)
		close(log_fd);
	c->pid = pid;
	double limit = c->ready_timeout_s > 0 ? c->ready_timeout_s : 120;
	char url[128];
	snprintf(url, sizeof url, "%s/health", c->url);
	for (;;) {
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			char d[64];
			kcl_child_status_text(st, d, sizeof d);
			c->pid = 0;
			*died = 1;
			return kv_fail(KV_ERR_IO, "the server (%s) %s before it was ready%s%s", c->argv[0], d,
				       c->log_path ? "; its log: " : "; its log is above", c->log_path ? c->log_path : "");
		}
		int status = 0;
		if (kcl_http_fetch(url, "GET", NULL, 0, 2000, &status, NULL, NULL) == KV_OK && status == 200)
			return KV_OK;
		if (kv_now_s() - t0 > limit) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			c->pid = 0;
			return kv_fail(KV_ERR_TIMEOUT, "the server did not answer /health with 200 within %.0f s", limit);
		}
		kv_sleep_ms(50);
	}
}

int kcl_child_start(struct kcl_child *c, double *ready_s)
{
	double t0 = kv_now_s();
	int rc = KV_OK, died = 0;
	for (int attempt = 0; attempt < 3; attempt++) {
		rc = start_once(c, t0, &died);
		if (rc == KV_OK || !died || !c->auto_port)
			break;
		/* maybe another process took the port: try a new one */
		int port = kcl_free_port();
		if (port <= 0 || set_port(c, port))
			break;
	}
	if (ready_s)
		*ready_s = kv_now_s() - t0;
	return rc;
}

int kcl_child_stop(struct kcl_child *c, double *stop_s, char *desc, size_t cap)
{
	double t0 = kv_now_s(), limit = c->stop_timeout_s > 0 ? c->stop_timeout_s : 30;
	int st = 0, rc = KV_OK;
	if (stop_s)
		*stop_s = 0;
	if (desc)
		snprintf(desc, cap, "not running");
	if (c->pid <= 0)
		return KV_OK;
	kill(c->pid, SIGTERM);
	for (;;) {
		pid_t w = waitpid(c->pid, &st, WNOHANG);
		if (w == c->pid)
			break;
		if (w < 0 && errno != EINTR) {
			st = 0;
			break;
		}
		if (kv_now_s() - t0 > limit) {
			kill(c->pid, SIGKILL);
			waitpid(c->pid, &st, 0);
			rc = kv_fail(KV_ERR_TIMEOUT, "the server did not exit within %.0f s of SIGTERM; killed", limit);
			break;
		}
		kv_sleep_ms(5);
	}
	if (stop_s)
		*stop_s = kv_now_s() - t0;
	if (desc)
		kcl_child_status_text(st, desc, cap);
	c->pid = 0;
	return rc;
}

void kcl_child_free(struct kcl_child *c)
{
	if (c->pid > 0)
		kcl_child_stop(c, NULL, NULL, 0);
	for (int i = 0; c->argv && i < c->argc; i++)
		free(c->argv[i]);
	free(c->argv);
	c->argv = NULL;
	c->argc = 0;
}
