/*
 * work.h - what the files of `pgjobq work` share: cmd_work.c (its options and the worker's life),
 * work_log.c (its log lines), work_metrics.c (--metrics-listen) and work_exec.c (the --exec
 * handler).  The --coproc handler is coproc.h's; starting a handler process is spawn.h's.
 */
#ifndef PGJOBQ_CLI_WORK_H
#define PGJOBQ_CLI_WORK_H

#include "cli.h"
#include "http.h"

/* One --queue: a queue and how many of its jobs run at once. */
typedef struct work_queue {
    char name[PGJOBQ_NAME_MAX + 1];
    int concurrency;
} work_queue;

/* --log-format and --log-level. */
typedef struct work_log_cfg {
    int json;  /* one JSON object per line rather than text */
    int level; /* the least pgjobq_log_level written */
} work_log_cfg;

/* The worker's log (pgjobq_worker_opts.log_fn, and the coprocesses'; arg: a work_log_cfg): one line
 * on stderr per record, timestamped, redacted, with its control characters escaped. */
void work_log(void *arg, pgjobq_log_level level, const char *msg);

/* --metrics-listen: the worker's own counters over HTTP. */
typedef struct work_metrics {
    pgjobq_worker *w;
    const work_queue *queues; /* for the slots per queue */
    int nqueues;
    http_server *http; /* NULL until started */
} work_metrics;

/* Serves m->w's counters at http://listen/metrics (and /healthz), logging where; off loopback only
 * with $PGJOBQ_SERVE_TOKEN (16+ characters) as credentials.  m must outlive the server.  Returns
 * EX_OK, or the exit status after printing why. */
int work_metrics_start(work_metrics *m, const cli_cmd *cmd, const char *listen, work_log_cfg *log);
/* Stops the server, if it was started. */
void work_metrics_stop(work_metrics *m);

/* --exec: how each job's command is run. */
typedef struct exec_cfg {
    char **argv; /* the command, split (or sh -c) */
    char **env;  /* the worker's environment without credentials (spawn_environment) */
    size_t max_output;
    int64_t kill_grace_ms;
} exec_cfg;

/* The worker's handler for --exec (arg: an exec_cfg): runs the command for the job and judges its
 * exit (the contract is at the top of cmd_work.c). */
pgjobq_outcome exec_handler(pgjobq_ctx *ctx, void *arg);

#endif /* PGJOBQ_CLI_WORK_H */
