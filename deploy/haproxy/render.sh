#!/usr/bin/env bash
# deploy/haproxy/render.sh - the HAProxy 2.6 configuration that puts N
# kvkeep servers behind one address (docs/cluster.md), on stdout.
#
#   bash deploy/haproxy/render.sh [--bind ADDR:PORT] [--header NAME]
#        [--check-inter MS] [--quiet] HOST:PORT [HOST:PORT ...]
#
# Sessions stick to a server: the first of x-claude-code-session-id (Claude
# Code), session-id (Codex) and --header NAME (default x-session-id) that a
# request carries is hashed on a consistent-hash ring, so adding or removing
# a server moves only the sessions that hashed to it. A request with none
# of them goes to the server with the fewest connections. /health is
# checked; a server that fails it leaves both the ring and the pool, and its
# sessions land on the next server of the ring, which finds their prefixes
# in the shared remote tier (--remote-cache). Answers carry x-kvkeep-server
# (the server's name here: k1, k2, ...). deploy/haproxy/kvkeep.cfg is this
# script's output for two local servers; tests/e2e/remote_tier.sh checks
# both.
set -eu
bind="127.0.0.1:8000"
header="x-session-id"
inter=1000
quiet=0
servers=()
while [ $# -gt 0 ]; do
	case "$1" in
	--bind) bind=$2; shift 2 ;;
	--header) header=$2; shift 2 ;;
	--check-inter) inter=$2; shift 2 ;;
	--quiet) quiet=1; shift ;;
	-h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "render.sh: unknown flag $1" >&2; exit 2 ;;
	*) servers+=("$1"); shift ;;
	esac
done
[ ${#servers[@]} -gt 0 ] || { echo "render.sh: name at least one kvkeep server (HOST:PORT)" >&2; exit 2; }
case "$header" in *[!A-Za-z0-9_-]*|"") echo "render.sh: --header must be a header name" >&2; exit 2 ;; esac
for s in "${servers[@]}"; do
	case "$s" in *:[0-9]*) ;; *) echo "render.sh: '$s' is not HOST:PORT" >&2; exit 2 ;; esac
done

cat <<CFG
# kvkeep behind HAProxy 2.6 - rendered by deploy/haproxy/render.sh
# (docs/cluster.md explains every line).
global
    maxconn 4096
CFG
[ "$quiet" = 1 ] || echo "    log stderr format short local0 notice"
cat <<CFG

defaults
    mode http
    log global
    option httplog
    # an agent's request can prefill for minutes and stream for minutes
    timeout connect 5s
    timeout client 15m
    timeout server 15m
    timeout http-request 30s
    timeout queue 60s
    # a connection refused by one server is retried on another
    retries 2
    option redispatch

frontend kvkeep
    bind ${bind}
    # the session key: the first of these headers the request carries
    http-request del-header x-kvkeep-session
    http-request set-var(txn.session) req.fhdr(x-claude-code-session-id)
    http-request set-var(txn.session) req.fhdr(session-id) if !{ var(txn.session) -m len gt 0 }
    http-request set-var(txn.session) req.fhdr(${header}) if !{ var(txn.session) -m len gt 0 }
    http-request set-header x-kvkeep-session %[var(txn.session)] if { var(txn.session) -m len gt 0 }
    use_backend kvkeep_sessions if { var(txn.session) -m len gt 0 }
    default_backend kvkeep_any

# sessions: consistent hashing of the session key
backend kvkeep_sessions
    balance hdr(x-kvkeep-session)
    hash-type consistent
    option httpchk GET /health
    http-check expect status 200
    default-server check inter ${inter} fall 2 rise 2
    http-response set-header x-kvkeep-server %s
CFG
i=0
for s in "${servers[@]}"; do i=$((i + 1)); echo "    server k$i $s"; done
cat <<CFG

# requests without a session key: the least busy server (same health)
backend kvkeep_any
    balance leastconn
    http-response set-header x-kvkeep-server %s
CFG
i=0
for s in "${servers[@]}"; do i=$((i + 1)); echo "    server k$i $s track kvkeep_sessions/k$i"; done
