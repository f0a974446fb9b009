/*
 * bench.h - what the benchmark scenarios of `pgjobq bench` share (bench_common.c): the control
 * connection, worker processes forked from the benchmark with their counters in shared memory, and
 * small helpers.  The scenarios: cmd_bench.c (enqueue, drain, latency, mixed, soak) and bench_steady.c
 * (steady: sustained load, optionally while a snapshot is held open).
 */
#ifndef PGJOBQ_BENCH_H
#define PGJOBQ_BENCH_H

#include <libpq-fe.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "cli.h"

#define BENCH_MAX_PROCESSES 64

typedef struct bench_args {
    const cli_cmd *cmd;
    long long jobs, noise;
    int concurrency, processes, batch, rate, seconds, json, jobs_given, lead_ms, window, producers;
    int steps;          /* drain: no-op durable steps per job (in-process workers) */
    long long parked;   /* drain: jobs of the queue held parked in a durable sleep */
    int chain;          /* drain: chains of this many jobs, each enqueued by the one before */
    int keys;           /* drain: the jobs spread over this many concurrency keys, round-robin (0: none) */
    int strict;         /* drain: the queue in strict order per key (pgjobq_queue_set_strict_order) */
    int limit;          /* drain: the queue's concurrency limit (pgjobq_queue_set_concurrency; 0: none) */
    const char *handler; /* drain-exec, drain-coproc: the command */
    const char *pin;     /* steady: "snapshot" or "dump" */
    int floor;           /* steady: the minimal table and its NOTIFY-woken workers instead of pgjobq */
    /* In-process workers: the handler they run (NULL: a no-op that completes every job). */
    pgjobq_handler_fn fn;
    void *fn_arg;
} bench_args;

/* What the worker processes publish (an anonymous shared mapping). */
typedef struct bench_shared {
    _Atomic long long completed[BENCH_MAX_PROCESSES];
    _Atomic long long claims[BENCH_MAX_PROCESSES];
    _Atomic long long claimed[BENCH_MAX_PROCESSES];
    _Atomic long long writes[BENCH_MAX_PROCESSES];
    _Atomic long rss_kb[BENCH_MAX_PROCESSES];
    _Atomic int ready;
} bench_shared;

/* Removes the benchmark's jobs, live and finished (and nothing else): pgjobq.reset_queue, which needs
 * the admin role. */
#define BENCH_RESET_SQL "SELECT pgjobq.reset_queue('bench'), pgjobq.reset_queue('bench_noise')"

/* Vacuums and analyses the database before a timed run (untimed): the benchmark's own database, so
 * that is the queue's tables after BENCH_RESET_SQL removed the last run's jobs. */
#define BENCH_VACUUM_SQL "VACUUM ANALYZE"

/* A monotonic clock in seconds, and a sleep. */
double bench_now(void);
void bench_pause_ms(long ms);

/* A control connection for setup and measurements (not counted as the workers'); NULL after printing
 * why. */
PGconn *bench_control(const char *url);
/* A connection that names itself `application` (pg_stat_activity); NULL after printing why. */
PGconn *bench_connect(const char *url, const char *application);
/* Runs sql; 0, or -1 after printing the error. */
int bench_sql(PGconn *c, const char *sql);
/* The first column of the first row of sql as a number; -1 when there is none. */
double bench_number(PGconn *c, const char *sql);
/* The same, sql with one parameter, $1 (value, as text). */
double bench_number1(PGconn *c, const char *sql, const char *value);

/* Loads n no-op jobs into queue (untimed), due at run_at (NULL: now); a library result code. */
int bench_preload(pgjobq_client *c, const char *queue, long long n, const char *run_at);

/* The same, job i with the concurrency key "k<i % keys>" (keys 0: none). */
int bench_preload_keyed(pgjobq_client *c, const char *queue, long long n, const char *run_at, int keys);
/* Adds n completed jobs of queue to the history (untimed; pgjobq.load_history); 0 or -1. */
int bench_insert_finished(PGconn *ctl, const char *queue, long long n);

/* The sum of a per-process counter. */
long long bench_total(_Atomic long long *v, int n);
/* Starts a->processes worker processes: in-process workers (exec_mode 0, running a->fn), `pgjobq work
 * --exec` (1) or `--coproc` (2) with a->handler.  0, or -1 after printing why. */
int bench_start_workers(const char *url, const bench_args *a, bench_shared *sh, int exec_mode, pid_t *pids);
/* The same, then waits (at most 30 s) until every process has connected and listens. */
int bench_start_ready_workers(const char *url, const bench_args *a, bench_shared *sh, pid_t *pids, PGconn *ctl);
/* Stops and reaps the worker processes (accepts pids already reaped: 0). */
void bench_stop_workers(const bench_args *a, pid_t *pids);
/* The worker processes' connections (pgjobq's, but neither ctl nor mine). */
int bench_worker_connections(PGconn *ctl, pgjobq_client *mine);
/* Claim connections past their set-up: workers that are ready. */
int bench_ready_workers(PGconn *ctl);

/* The steady scenario (bench_steady.c). */
int bench_steady(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c);

#endif /* PGJOBQ_BENCH_H */
