/*
 * work.h - what the files of `pgjobq work` share: cmd_work.c (its options and the worker's life),
 * work_log.c (its log lines), work_metrics.c (--metrics-listen) and work_exec.c (the --exec
 * handler).  The --coproc handler is coproc.h's; starting a handler process is spawn.h's.
 */
#ifndef PGJOBQ_CLI_WORK_H
#define PGJOBQ_CLI_WORK_H

#include "cli.h"
#include "http.h"

#include <pthread.h>

typedef struct coproc_pool coproc_pool;

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
    /* With --cluster (w NULL): the engines' slots (NULL: none), read under mu; each engine's series
     * carry the label shard="NAME". */
    struct work_engine *const *engines;
    size_t nengines;
    pthread_mutex_t *mu;
} work_metrics;

/* Serves m->w's counters (or every engine's of m->engines) at http://listen/metrics (and /healthz), logging where; off
 * loopback only with $PGJOBQ_SERVE_TOKEN (16+ characters) as credentials.  m must outlive the server.  Returns EX_OK,
 * or the exit status after printing why. */
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

/* The --exec exit status that snoozes the job: handed back untouched, no attempt used, due after the
 * duration on the command's standard output ("30", "90s", "5m": cli_parse_duration_ms; nothing: the
 * backoff).  Outside sysexits.h's 64-78 and the shell's 126-255, as no tool's own status. */
#define WORK_EXIT_SNOOZE 99

/* The --exec exit status of a handler whose job was parked (`pgjobq step --sleep` or --wait-event
 * exited with it: a durable sleep or a wait, docs/durable.md): the database holds the job again,
 * the worker writes nothing. */
#define WORK_EXIT_PARKED 98

/* The worker's handler for --exec (arg: an exec_cfg): runs the command for the job and judges its
 * exit (the contract is at the top of cmd_work.c). */
pgjobq_outcome exec_handler(pgjobq_ctx *ctx, void *arg);

/* ------------------------------------------------------------------------------------------------ */
/* Engines (work_engine.c): a pgjobq_worker with the command's handler.  Without --cluster, one, run
 * on the command's thread; with it, one per shard of the map, each on a thread of its own and its
 * own shard's connections (at most three), so that a shard that is down is retried by its engine
 * alone while the others work. */

/* The outbox jobs a --forward-to engine forwards at once (its forwarder's connections are shared
 * under a mutex: a forward is one short statement on its shard). */
#define WORK_FORWARD_SLOTS 4

/* What every engine of the command is made from. */
typedef struct work_engine_cfg {
    pgjobq_worker_opts opts; /* log_fn and log_arg are the engine's own */
    work_queue queues[64];
    int nqueues;
    work_log_cfg log;
    int coproc;  /* nonzero: the handler is a coprocess pool (exec's argv and env), one per engine */
    int coprocs; /* --coprocs (0: 1) */
    exec_cfg exec;
    pgjobq_forwarder *forwarder; /* --forward-to: every engine also serves its database's outbox */
} work_engine_cfg;

/* One engine.  Zero it, then work_engine_new. */
typedef struct work_engine {
    const work_engine_cfg *cfg;
    char *shard;    /* the shard's name (NULL without --cluster): prefixed to its log lines */
    char *conninfo; /* the shard's (without --cluster, NULL: the worker was given the URL) */
    pgjobq_worker *w;
    coproc_pool *pool;
    pthread_t thread;
    int threaded; /* the thread was started (and is joined by work_engine_free) */
    int rc;       /* what pgjobq_worker_run returned */
    _Atomic int done;
    int leaving; /* its shard left the map: stopped on purpose */
} work_engine;

/* Makes e's worker for conninfo (worker_id: NULL for the library's), its coprocesses and its
 * handlers.  Returns EX_OK, or the exit status after printing why. */
int work_engine_new(work_engine *e, const work_engine_cfg *cfg, const char *shard, const char *conninfo,
                    const char *worker_id);
/* Joins its thread (if any), stops its coprocesses, frees its worker; e is zeroed. */
void work_engine_free(work_engine *e);
/* The exit status for what pgjobq_worker_run returned (printing the worker's error if any). */
int work_engine_status(const work_engine *e);

/* Installs the SIGTERM/SIGINT handler that drains every engine registered (and SIGPIPE ignored).
 * Returns EX_OK or the exit status after printing why. */
int work_signals_install(void);
/* Registers e with the signal handler (slot i), or unregisters the slot (e NULL). */
void work_signals_set(size_t i, work_engine *e);

/* `pgjobq work --cluster SPEC`: one engine per shard of SPEC's map, each on its own thread, until a
 * signal drains them all (or, with opts.burst, until every one found nothing due).  The map is read
 * again every reload_ms: an engine starts for a shard that joined it; the engine of a shard that
 * left drains and stops.  Returns the exit status: EX_OK after a clean drain, EX_TEMPFAIL when an
 * engine handed jobs back, else the first engine's error (which stops the others).  metrics_listen
 * (may be NULL): --metrics-listen, every engine's counters labelled by its shard. */
int work_cluster_run(const work_engine_cfg *cfg, const char *spec, int64_t reload_ms, const cli_cmd *cmd,
                     const char *metrics_listen);

#endif /* PGJOBQ_CLI_WORK_H */
