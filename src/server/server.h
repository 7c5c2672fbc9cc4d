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
 * Life: create (loads everything, starts listening: /health answers 200
 * from then on) -> run (blocks until ksv_server_request_stop, e.g. from a
 * SIGTERM handler) -> destroy. On stop the server stops accepting,
 * cancels queued requests, ends running streams at the next token, and
 * closes every connection.
 */
#ifndef KV_SERVER_SERVER_H
#define KV_SERVER_SERVER_H

#include "server/options.h"

struct ksv_server;

/* Load and listen. *out owned by the caller (ksv_server_destroy). */
int ksv_server_create(const struct ksv_opts *o, struct ksv_server **out);
/* Serve until a stop is requested; then shut down gracefully. */
int ksv_server_run(struct ksv_server *s);
/* Ask run() to return. Async-signal-safe. */
void ksv_server_request_stop(struct ksv_server *s);
void ksv_server_destroy(struct ksv_server *s);

#endif
