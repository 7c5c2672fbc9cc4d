/*
 * dashboard.h - the live cache dashboard: GET /dashboard (and GET / from
 * a browser) serves one self-contained page (src/server/dashboard.html,
 * built into the binary: no file is read at run time, nothing is fetched
 * from elsewhere), which polls GET /v1/dashboard/state once a second.
 * docs/api.md documents the state object.
 */
#ifndef KV_SERVER_DASHBOARD_H
#define KV_SERVER_DASHBOARD_H

#include <stddef.h>

#include "server/httpd.h"

struct ksv_server;

/* The page's bytes (valid for the process's life). */
const char *ksv_dashboard_page(size_t *len);
/* GET /dashboard. */
void ksv_dashboard_handle_page(struct ksv_server *s, struct ksv_conn *c);
/* GET /v1/dashboard/state. */
void ksv_dashboard_handle_state(struct ksv_server *s, struct ksv_conn *c);

#endif
