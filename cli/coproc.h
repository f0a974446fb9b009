/*
 * coproc.h - `pgjobq work --coproc CMD`: long-lived handler processes that take jobs as JSON lines on
 * stdin and answer on stdout (docs/coproc.md), so a handler in any language pays no process start
 * per job.
 */
#ifndef PGJOBQ_CLI_COPROC_H
#define PGJOBQ_CLI_COPROC_H

#include "cli.h"

typedef struct coproc_pool coproc_pool;

/* Starts k copies of argv (environment env, which must outlive the pool), each taking at most
 * `share` jobs at once.  log receives the coprocesses' stderr lines and the pool's own messages.
 * NULL when out of memory or its lock cannot be made (a copy that cannot start is retried with
 * backoff, and logged). */
coproc_pool *coproc_start(char **argv, char **env, int k, int share,
                          void (*log)(void *arg, pgjobq_log_level level, const char *msg), void *log_arg);

/* The worker's handler (arg: the pool): queues the job for a coprocess and returns
 * PGJOBQ_OUTCOME_PENDING; the pool ends the job (pgjobq_ctx_finish) with the coprocess's answer, or
 * when it gives the job up (timeout, cancel, lost lease, shutdown, a coprocess that died). */
pgjobq_outcome coproc_handler(pgjobq_ctx *ctx, void *arg);

/* Closes the coprocesses' input, waits up to grace_ms for them to exit, then kills them; frees the
 * pool.  Accepts NULL. */
void coproc_stop(coproc_pool *p, int64_t grace_ms);

#endif /* PGJOBQ_CLI_COPROC_H */
