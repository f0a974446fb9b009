/*
 * coproc.h - `pgjobq work --coproc CMD`: long-lived handler processes that take jobs as JSON lines on
 * stdin and answer on stdout (docs/coproc.md), so a handler in any language pays no process start
 * per job.
 */
#ifndef PGJOBQ_CLI_COPROC_H
#define PGJOBQ_CLI_COPROC_H

#include "cli.h"

typedef struct coproc_pool coproc_pool;

/* The longest line a coprocess may write (a reply holds a result of at most PGJOBQ_PAYLOAD_MAX bytes,
 * an error, its id...; docs/coproc.md says 4 MiB): a longer one breaks the protocol. */
#define COPROC_LINE_MAX (4 * 1024 * 1024)

/* Starts k copies of argv (environment env, which must outlive the pool), each taking at most
 * `share` jobs at once.  log receives the coprocesses' stderr lines and the pool's own messages;
 * health (may be NULL) is told why no copy can start (problem: the reason, the last lines of its
 * stderr) and when one has started again (problem NULL), from a supervising thread.  NULL when out of
 * memory or its lock cannot be made (a copy that cannot start is retried with backoff, and logged). */
coproc_pool *coproc_start(char **argv, char **env, int k, int share,
                          void (*log)(void *arg, pgjobq_log_level level, const char *msg), void *log_arg,
                          void (*health)(void *arg, const char *problem), void *health_arg);

/* The worker is stopping: no copy that ends is started again, and a job that finds none running is
 * handed back.  Safe from a signal handler.  Accepts NULL. */
void coproc_drain(coproc_pool *p);

/* The worker's handler (arg: the pool): queues the job for a coprocess and returns
 * PGJOBQ_OUTCOME_PENDING; the pool ends the job (pgjobq_ctx_finish) with the coprocess's answer, or
 * when it gives the job up (timeout, cancel, lost lease, shutdown, a coprocess that died). */
pgjobq_outcome coproc_handler(pgjobq_ctx *ctx, void *arg);

/* Closes the coprocesses' input, waits up to grace_ms for them to exit, then kills them; frees the
 * pool.  Accepts NULL. */
void coproc_stop(coproc_pool *p, int64_t grace_ms);

#endif /* PGJOBQ_CLI_COPROC_H */
