/*
 * serve.h - the parts of `pgjobq serve`: the metrics collector (serve_metrics.c) and the dashboard
 * (cmd_serve.c and the files of serve_dashboard.h), over the HTTP layer of http.h.  Both log through
 * serve_log.h.
 */
#ifndef PGJOBQ_CLI_SERVE_H
#define PGJOBQ_CLI_SERVE_H

#include <libpq-fe.h>

#include "cli.h"
#include "http.h"

typedef struct serve_metrics serve_metrics;

/* Starts the collector thread: it connects to each of the n conninfos (which must outlive it) and
 * collects from each every interval_ms.  shards NULL: one database (n is 1), series as they always
 * were; else the n shards' names (outliving it too): every series gets a label shard="NAME", and
 * pgjobq_shard_up says which shards answered.  NULL when the thread cannot start. */
serve_metrics *serve_metrics_start(const char *const *conninfos, const char *const *shards, size_t n,
                                   int64_t interval_ms);

/* A malloc'd copy of the latest Prometheus exposition; waits up to wait_first_ms for the first one.
 * NULL when there is none yet. */
char *serve_metrics_text(serve_metrics *m, int wait_first_ms);

/* Stops the collector and frees everything.  Accepts NULL. */
void serve_metrics_stop(serve_metrics *m);

#endif /* PGJOBQ_CLI_SERVE_H */
