/*
 * server.h - `kvkeep serve`: the OpenAI-compatible server around one
 * model, its prefix cache and the engine.
 *
 * Parts (each its own module in src/server): httpd (transport, limits),
 * request (body validation), openai (response formats), output (stop
 * strings, reasoning, tool calls), sched (the engine queue), metrics
 * (Prometheus registry). This module wires them: it loads the model,
 * tokenizer and chat template, creates the cache, routes requests, runs
 * generations on the scheduler's worker and writes one log line per
 * request. docs/api.md lists the routes, docs/operations.md the flags,
 * variables and metrics.
 *
 * Life: create (listens: a busy port fails here, before anything loads;
 * /health answers 503 "loading") -> load (the model, tokenizer, caches:
 * /health answers 200 from then on) -> run (blocks until
 * ksv_server_request_stop, e.g. from a SIGTERM handler) -> destroy. On stop the server stops accepting,
 * cancels queued requests, ends running streams at the next token, and
 * closes every connection.
 */
#ifndef KV_SERVER_SERVER_H
#define KV_SERVER_SERVER_H

#include "server/options.h"

struct ksv_server;

/* Listen. *out owned by the caller (ksv_server_destroy). */
int ksv_server_create(const struct ksv_opts *o, struct ksv_server **out);
/* 1 once ksv_server_load is done (before serve.ready is logged).
 * Async-signal-safe. */
int ksv_server_ready(const struct ksv_server *s);
/* The bound port (--port 0 picks one). */
int ksv_server_port(const struct ksv_server *s);
/* Load the model and everything else, then answer requests. On an error
 * (kv_errmsg names the cause and the fix) the caller destroys s. */
int ksv_server_load(struct ksv_server *s);
/* Serve until a stop is requested; then shut down gracefully. */
int ksv_server_run(struct ksv_server *s);
/* Ask run() to return. Async-signal-safe. */
void ksv_server_request_stop(struct ksv_server *s);
void ksv_server_destroy(struct ksv_server *s);

#endif
