/*
 * cmd_bench.c - pgjobq bench SCENARIO: the benchmark scenarios behind `make bench`, runnable alone
 * against any database.  Each prints one JSON object (or a line of text).
 *
 *   enqueue     N jobs through pgjobq_enqueue_many (COPY for large batches)              jobs_per_s
 *               (--cluster SPEC: through pgjobq_cluster_enqueue_many, routed by the client)
 *   drain       N preloaded no-op jobs, P worker processes x C threads (in-process)      jobs_per_s
 *   drain-exec  the same with `pgjobq work --exec /bin/true` (or --handler)               jobs_per_s
 *   drain-coproc the same with `pgjobq work --coproc HANDLER`                            jobs_per_s
 *   latency     an idle worker; N jobs enqueued one at a time at R/s                      p50/p95/p99/max
 *   await       an idle worker; N jobs one after another, each awaited (pgjobq_job_wait)   wake p50/p95/p99/max
 *   mixed       producers at R jobs/s while P x C workers run, for S seconds              throughput, depth, p99
 *   steady      the same in windows, for minutes, optionally while a snapshot is held     per window: rates, pickup
 *               open (--pin) (bench_steady.c)                                              p99, table, claim time
 *   soak        P x C workers on a standing backlog of N (refilled), over --noise history,  per-minute throughput,
 *               for S seconds (`make soak`)                                                 RSS, table, dead tuples
 *
 * The ceilings these are compared with (a minimal queue table driven by pgbench) are in bench/ceiling
 * and bench/run.sh: they do not go through this program, so that nothing of pgjobq is in them.
 *
 * Drains are timed from the moment their jobs become due with every worker already connected: the
 * jobs are preloaded scheduled a few seconds ahead (--lead), the workers start, claim nothing and
 * sleep until then.  That is a fleet draining a backlog, not a fleet starting up (40 processes take a
 * second or two to open their 120 connections; pgbench's figures exclude connection time too).
 *
 * The benchmark's jobs live in queue "bench" (and "bench_noise" for --noise); those queues are
 * emptied before each run, nothing else is touched.  Worker processes are forked children, so that
 * their connections and peak RSS are their own, and they die with the benchmark.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define OPT_JOBS 'n'
#define OPT_CONCURRENCY 'c'
#define OPT_PROCESSES 'p'
#define OPT_BATCH 'b'
#define OPT_RATE 'r'
#define OPT_SECONDS 's'
#define OPT_NOISE 4001
#define OPT_JSON 4002
#define OPT_LEAD 4003
#define OPT_HANDLER 4004
#define OPT_PIN 4005
#define OPT_WINDOW 4006
#define OPT_PRODUCERS 4007
#define OPT_STEPS 4008
#define OPT_PARKED 4009
#define OPT_CHAIN 4010
#define OPT_KEYS 4011
#define OPT_STRICT 4012
#define OPT_FLOOR 4013
#define OPT_LIMIT 4014

const cli_opt bench_opts[] = {
    {"jobs", OPT_JOBS, "N", "jobs (default 100000; latency: 1000)"},
    {"concurrency", OPT_CONCURRENCY, "C", "worker threads per process (default 32)"},
    {"processes", OPT_PROCESSES, "P", "worker processes, at most 64 (default 1)"},
    {"batch", OPT_BATCH, "B", "enqueue: jobs per batch (default 10000); workers: most jobs per claim (default 1000)"},
    {"rate", OPT_RATE, "R", "latency, mixed, soak: jobs enqueued per second (default 200; mixed 10000; soak 0: refill what drains)"},
    {"seconds", OPT_SECONDS, "S", "mixed, soak: how long to run (default 60)"},
    {"noise", OPT_NOISE, "N", "drain: also hold N completed jobs and N queued jobs of another queue; soak: N finished jobs"},
    {"lead", OPT_LEAD, "MS", "drain: schedule the jobs this long ahead (default 3000 + 100 per process)"},
    {"handler", OPT_HANDLER, "'CMD ARGS'",
     "drain-exec: the command per job (default /bin/true); drain-coproc: the coprocess (required)"},
    {"pin", OPT_PIN, "snapshot|dump",
     "steady: hold a snapshot open in another session for the whole run (dump: and ACCESS SHARE on every pgjobq table, as pg_dump does)"},
    {"floor", OPT_FLOOR, NULL,
     "steady: drive the floor instead of pgjobq: a minimal queue table (schema bench_floor), the same producers "
     "(one INSERT of 100 and a NOTIFY a transaction) and as many NOTIFY-woken minimal workers, measured the same way"},
    {"window", OPT_WINDOW, "S", "steady: seconds per measurement window (default 60; a third of the run when shorter than 3 minutes)"},
    {"producers", OPT_PRODUCERS, "N", "steady: producer connections sharing the rate; soak: refilling (default 2)"},
    {"steps", OPT_STEPS, "N",
     "drain: each job runs N no-op durable steps (pgjobq_ctx_step) before it completes (default 0)"},
    {"chain", OPT_CHAIN, "N",
     "drain: each job is the first of a chain of N: a job's handler enqueues the next (on its own connection) "
     "and completes; jobs counts the chains (default 1)"},
    {"parked", OPT_PARKED, "N",
     "drain: also hold N jobs of the queue parked in a durable sleep of a day (as ctx.sleep leaves them)"},
    {"keys", OPT_KEYS, "K", "drain: spread the jobs over K concurrency keys, round-robin (default: none)"},
    {"strict", OPT_STRICT, NULL,
     "drain: the queue in strict order per key (queue set --strict-order on; with --keys)"},
    {"limit", OPT_LIMIT, "N",
     "drain: at most N jobs of the queue running at once (queue set --concurrency N; default: no limit)"},
    {"json", OPT_JSON, NULL, "print one JSON object"},
    {"cluster", OPT_CLUSTER, "SPEC",
     "enqueue: route the jobs through the cluster SPEC (pgjobq_cluster_enqueue_many), to compare with the "
     "direct path: on a cluster of one shard, --db that shard (not read from $PGJOBQ_CLUSTER)"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};


static int bench_opt(int key, const char *arg, void *ctx)
{
    bench_args *a = ctx;
    char why[160];
    long long v;
    long long max = key == OPT_JOBS || key == OPT_NOISE || key == OPT_PARKED ? 100000000 : key == OPT_RATE ? 10000000 : 100000;

    if (key == OPT_JSON) {
        a->json = 1;
        return 0;
    }
    if (key == OPT_STRICT) {
        a->strict = 1;
        return 0;
    }
    if (key == OPT_FLOOR) {
        a->floor = 1;
        return 0;
    }
    if (key == OPT_HANDLER) {
        a->handler = arg;
        return 0;
    }
    if (key == OPT_PIN) {
        if (strcmp(arg, "snapshot") != 0 && strcmp(arg, "dump") != 0) {
            cli_usage_error(a->cmd, "--pin: expected snapshot or dump, not '%s'", arg);
            return -1;
        }
        a->pin = arg;
        return 0;
    }
    /* --rate 0: soak saturates; the other scenarios take their default, as without the option. */
    if (cli_parse_int(arg, key == OPT_NOISE || key == OPT_RATE || key == OPT_PARKED || key == OPT_STEPS ? 0 : 1, max,
                      &v, why, sizeof why) != 0) {
        for (const cli_opt *o = bench_opts; o->name; o++)
            if (o->key == key)
                cli_usage_error(a->cmd, "--%s: %s", o->name, why);
        return -1;
    }
    switch (key) {
    case OPT_JOBS: a->jobs = v; a->jobs_given = 1; return 0;
    case OPT_CONCURRENCY: a->concurrency = (int)v; return 0;
    case OPT_PROCESSES: a->processes = (int)v; return 0;
    case OPT_BATCH: a->batch = (int)v; return 0;
    case OPT_RATE: a->rate = (int)v; return 0;
    case OPT_SECONDS: a->seconds = (int)v; return 0;
    case OPT_NOISE: a->noise = v; return 0;
    case OPT_LEAD: a->lead_ms = (int)v; return 0;
    case OPT_WINDOW: a->window = (int)v; return 0;
    case OPT_PRODUCERS: a->producers = (int)v; return 0;
    case OPT_STEPS: a->steps = (int)v; return 0;
    case OPT_PARKED: a->parked = v; return 0;
    case OPT_CHAIN: a->chain = (int)v; return 0;
    case OPT_KEYS: a->keys = (int)v; return 0;
    case OPT_LIMIT: a->limit = (int)v; return 0;
    }
    return -1;
}

static const char *const mode_name[] = {"drain", "drain-exec", "drain-coproc"};

/* --steps: a step that does nothing but store its result. */
static int noop_step(pgjobq_ctx *ctx, pgjobq_client *c, void *arg, char **result_out)
{
    (void)ctx;
    (void)c;
    (void)arg;
    *result_out = strdup("1");
    return *result_out ? PGJOBQ_OK : PGJOBQ_ENOMEM;
}

/* --chain: the job enqueues the next of its chain ({"left": k}: k more after it; the first jobs, preloaded,
 * have a->chain - 1 more), then completes. */
static pgjobq_outcome chain_handler(pgjobq_ctx *ctx, void *arg)
{
    const bench_args *a = arg;
    const pgjobq_job *j = pgjobq_ctx_job(ctx);
    const char *p = j->payload ? strstr(j->payload, "\"left\":") : NULL;
    long left = p ? strtol(p + 7, NULL, 10) : a->chain - 1;
    if (left > 0) {
        pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
        pgjobq_client *c;
        char next[32];
        snprintf(next, sizeof next, "{\"left\": %ld}", left - 1);
        o.queue = "bench";
        if (pgjobq_ctx_client(ctx, &c) != PGJOBQ_OK || pgjobq_enqueue(c, next, &o, NULL) != PGJOBQ_OK)
            return PGJOBQ_OUTCOME_RETRY;
    }
    return PGJOBQ_OUTCOME_COMPLETE;
}

/* --steps: the job's a->steps steps, "s0", "s1", ..., then its completion. */
static pgjobq_outcome steps_handler(pgjobq_ctx *ctx, void *arg)
{
    const bench_args *a = arg;
    char name[16], *result = NULL;
    for (int i = 0; i < a->steps; i++) {
        snprintf(name, sizeof name, "s%d", i);
        if (pgjobq_ctx_step(ctx, name, noop_step, NULL, &result) != PGJOBQ_OK) {
            pgjobq_ctx_set_error(ctx, pgjobq_ctx_errmsg(ctx));
            return PGJOBQ_OUTCOME_RETRY;
        }
        pgjobq_free(result);
    }
    return PGJOBQ_OUTCOME_COMPLETE;
}

static int bench_drain(const char *url, bench_args *a, int exec_mode, PGconn *ctl, pgjobq_client *c)
{
    bench_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pids[BENCH_MAX_PROCESSES] = {0};
    int conns_max = 0, rc, status = EX_OK;
    char run_at[64], sql[600];
    double due, ready_at = -1, t1;

    if (sh == MAP_FAILED)
        return EX_OSERR;
    if (a->processes > BENCH_MAX_PROCESSES) {
        munmap(sh, sizeof *sh);
        return cli_usage_error(a->cmd, "--processes: at most %d", BENCH_MAX_PROCESSES);
    }
    memset(sh, 0, sizeof *sh);
    if (a->steps > 0 && exec_mode == 0) {
        a->fn = steps_handler;
        a->fn_arg = a;
    } else if (a->chain > 1 && exec_mode == 0) {
        a->fn = chain_handler;
        a->fn_arg = a;
    }
    long long total = a->jobs * (a->chain > 1 ? a->chain : 1); /* jobs to complete */
    if (bench_sql(ctl, BENCH_RESET_SQL) != 0)
        goto soft_fail;
    /* Strict order per key, or not: the queue's setting for this run (docs/queues.md). */
    if ((rc = pgjobq_queue_set_strict_order(c, "bench", a->strict)) != PGJOBQ_OK) {
        munmap(sh, sizeof *sh);
        return cli_fail(c, rc);
    }
    /* The concurrency limit likewise (0: none). */
    if ((rc = pgjobq_queue_set_concurrency(c, "bench", a->limit)) != PGJOBQ_OK) {
        munmap(sh, sizeof *sh);
        return cli_fail(c, rc);
    }
    if (a->parked > 0) {
        /* Jobs of the queue in a durable sleep of a day: queued for later, each with its park row, as
         * pgjobq.sleep leaves them (untimed). */
        char n_s[24];
        snprintf(n_s, sizeof n_s, "%lld", a->parked);
        const char *pv[1] = {n_s};
        PGresult *pr = PQexecParams(ctl,
                                    "WITH e AS (SELECT e.id FROM pgjobq.enqueue_many(array_fill('bench'::text, ARRAY[$1::int]),"
                                    "  array_fill('sleeper'::text, ARRAY[$1::int]), NULL,"
                                    "  run_ats => array_fill(now() + interval '1 day', ARRAY[$1::int]), notify => false) e)"
                                    " INSERT INTO pgjobq.job_parks (job_id, token, why, step, until)"
                                    " SELECT e.id, 0, 'sleep', 'nap', now() + interval '1 day' FROM e",
                                    1, NULL, pv, NULL, NULL, 0);
        int ok = PQresultStatus(pr) == PGRES_COMMAND_OK;
        if (!ok)
            cli_err("bench: parking jobs: %s", PQerrorMessage(ctl));
        PQclear(pr);
        if (!ok)
            goto soft_fail;
    }
    if (a->noise > 0) {
        /* History and another queue's backlog: what a busy production table holds. */
        if (bench_insert_finished(ctl, "bench_noise", a->noise) != 0)
            goto soft_fail;
        if ((rc = bench_preload(c, "bench_noise", a->noise, NULL)) != PGJOBQ_OK) {
            munmap(sh, sizeof *sh);
            return cli_fail(c, rc);
        }
    }
    /* The jobs come due a little later, by the database's clock; until then the workers start. */
    int lead_ms = a->lead_ms ? a->lead_ms : 3000 + 100 * a->processes + (int)(a->jobs / 100);
    snprintf(sql, sizeof sql, "%d", lead_ms);
    const char *lead_v[1] = {sql};
    PGresult *r = PQexecParams(ctl,
                               "SELECT to_char((now() + make_interval(secs => $1::int / 1000.0)) AT TIME ZONE 'UTC',"
                               " 'YYYY-MM-DD HH24:MI:SS.US') || '+00'",
                               1, NULL, lead_v, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        PQclear(r);
        goto soft_fail;
    }
    snprintf(run_at, sizeof run_at, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    /* Exec workers: the first id the benchmark's jobs can have, where the poll for the first live
     * one starts. */
    double first_live = bench_number(ctl, "SELECT pgjobq.monitor_last_id() + 1");
    if (first_live < 0)
        goto soft_fail;
    if ((rc = bench_preload_keyed(c, "bench", a->jobs, run_at, a->keys)) != PGJOBQ_OK) {
        munmap(sh, sizeof *sh);
        return cli_fail(c, rc);
    }
    if (bench_sql(ctl, BENCH_VACUUM_SQL) != 0 || bench_sql(ctl, "CHECKPOINT") != 0)
        goto soft_fail;
    if (bench_start_workers(url, a, sh, exec_mode, pids) != 0) {
        status = EX_OSERR;
        goto out;
    }
    /* Wait for the workers, then for the moment the jobs are due (local clock from the database's). */
    due = bench_now() + bench_number1(ctl, "SELECT extract(epoch FROM $1::timestamptz - clock_timestamp())", run_at);
    while (bench_now() < due) {
        if (ready_at < 0 && bench_ready_workers(ctl) >= a->processes)
            ready_at = bench_now();
        bench_pause_ms(10);
    }
    /* Claims made while waiting (polls of a queue with nothing due) do not count. */
    long long claims0 = bench_total(sh->claims, a->processes), claimed0 = bench_total(sh->claimed, a->processes);
    double next_conn_sample = bench_now();
    /* Until every job is completed: in-process workers report through shared memory; for exec workers
     * the database says when the queue has no live job left, cheaply: each poll starts from the first
     * live job the previous one found (monitor_queue_first_live). */
    for (;;) {
        long long done = 0;
        if (exec_mode) {
            char from[32];
            snprintf(from, sizeof from, "%.0f", first_live);
            double v = bench_number1(ctl, "SELECT pgjobq.monitor_queue_first_live('bench', $1::bigint)", from);
            if (v == 0)
                done = a->jobs;
            else if (v > 0)
                first_live = v;
        } else
            done = bench_total(sh->completed, a->processes);
        /* Sampled every 200 ms: the sampling query must not load the database it measures. */
        if (bench_now() >= next_conn_sample) {
            int conns = bench_worker_connections(ctl, c);
            if (conns > conns_max)
                conns_max = conns;
            next_conn_sample = bench_now() + 0.2;
        }
        if (done >= total)
            break;
        bench_pause_ms(exec_mode ? 20 : 5);
    }
    t1 = bench_now();
    bench_stop_workers(a, pids);
    double secs = t1 - due;
    long long claims = bench_total(sh->claims, a->processes) - claims0, claimed = bench_total(sh->claimed, a->processes) - claimed0;
    long long writes = bench_total(sh->writes, a->processes);
    long rss = 0;
    for (int i = 0; i < a->processes; i++)
        if (atomic_load(&sh->rss_kb[i]) > rss)
            rss = atomic_load(&sh->rss_kb[i]);
    double completed = bench_number(ctl, "SELECT coalesce(sum(jobs), 0) FROM pgjobq.monitor_history_counts()"
                                         " WHERE queue = 'bench' AND state = 'completed'");
    double ready_ms = ready_at < 0 ? -1 : (due - ready_at) * 1000; /* how long the fleet waited, ready */
    if (a->json)
        printf("{\"scenario\":\"%s\",\"jobs\":%lld,\"processes\":%d,\"concurrency\":%d,\"batch_max\":%d,"
               "\"noise\":%lld,\"seconds\":%.3f,\"jobs_per_s\":%.1f,\"claims\":%lld,\"avg_claim_batch\":%.1f,"
               "\"avg_write_batch\":%.1f,\"connections_max\":%d,\"rss_kb_max\":%ld,\"completed\":%.0f,"
               "\"ready_before_due_ms\":%.0f,\"steps\":%d,\"parked\":%lld,\"chain\":%d,\"keys\":%d,\"strict\":%d,"
               "\"limit\":%d}\n",
               mode_name[exec_mode], total, a->processes, a->concurrency, a->batch, a->noise, secs,
               (double)total / secs, claims, claims ? (double)claimed / (double)claims : 0.0,
               writes ? (double)total / (double)writes : 0.0, conns_max, rss, completed, ready_ms, a->steps, a->parked,
               a->chain > 1 ? a->chain : 1, a->keys, a->strict, a->limit);
    else
        printf("%s: %lld jobs, %d x %d threads: %.0f jobs/s (%.2f s from due), avg claim batch %.1f, %d connections, "
               "peak RSS %ld KiB%s\n",
               mode_name[exec_mode], total, a->processes, a->concurrency, (double)total / secs, secs,
               claims ? (double)claimed / (double)claims : 0.0, conns_max, rss,
               ready_ms < 0 ? " (workers were not all ready when the jobs came due)" : "");
    status = completed >= (double)total ? EX_OK : EX_SOFTWARE;
    goto out;
soft_fail:
    status = EX_SOFTWARE;
out:
    bench_stop_workers(a, pids);
    munmap(sh, sizeof *sh);
    return status;
}

/* ------------------------------------------------------------------------------------------------ */
/* Enqueue, latency, mixed                                                                           */

/* enqueue: through the client c, or routed by the cluster cl (not NULL: --cluster). */
static int bench_enqueue(bench_args *a, PGconn *ctl, pgjobq_client *c, pgjobq_cluster *cl)
{
    enum { MAXB = 100000 };
    int b = a->batch ? (a->batch > MAXB ? MAXB : a->batch) : 10000;
    pgjobq_job_spec *specs = calloc((size_t)b, sizeof *specs);
    int rc = PGJOBQ_OK;

    if (specs == NULL)
        return EX_OSERR;
    if (bench_sql(ctl, BENCH_RESET_SQL) != 0 || bench_sql(ctl, "VACUUM") != 0 ||
        bench_sql(ctl, "CHECKPOINT") != 0) {
        free(specs);
        return EX_SOFTWARE;
    }
    for (int i = 0; i < b; i++) {
        specs[i].payload = "{\"to\": \"someone@example.org\", \"n\": 12345}";
        specs[i].opts.queue = "bench";
    }
    double t0 = bench_now();
    for (long long done = 0; done < a->jobs && rc == PGJOBQ_OK;) {
        size_t k = (size_t)(a->jobs - done < b ? a->jobs - done : b);
        rc = cl ? pgjobq_cluster_enqueue_many(cl, specs, k, NULL, NULL) : pgjobq_enqueue_many(c, specs, k, NULL, NULL);
        done += (long long)k;
    }
    double secs = bench_now() - t0;
    free(specs);
    if (rc != PGJOBQ_OK)
        return cl ? cli_cluster_fail(cl, rc) : cli_fail(c, rc);
    if (a->json)
        printf("{\"scenario\":\"enqueue\",\"jobs\":%lld,\"batch\":%d,\"seconds\":%.3f,\"jobs_per_s\":%.1f,"
               "\"path\":\"%s\",\"shards\":%zu}\n",
               a->jobs, b, secs, (double)a->jobs / secs, cl ? "cluster" : "direct", cl ? pgjobq_cluster_shards(cl) : 1);
    else
        printf("enqueue: %lld jobs in batches of %d%s: %.0f jobs/s (%.2f s)\n", a->jobs, b,
               cl ? ", routed by the cluster client" : "", (double)a->jobs / secs, secs);
    return EX_OK;
}

/* Latency percentiles of jobs created since `since_id`, from the database clock: created_at is the
 * enqueuing statement's now(), started_at the claim's now(); the handler starts right after. */
static void latency_stats(PGconn *ctl, long long since_id, double out[4])
{
    char since[24];
    const char *values[1] = {since};

    snprintf(since, sizeof since, "%lld", since_id);
    for (int i = 0; i < 4; i++)
        out[i] = -1;
    PGresult *r = PQexecParams(ctl, "SELECT p50_ms, p95_ms, p99_ms, max_ms FROM pgjobq.monitor_latency('bench', $1::bigint)",
                               1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
        for (int i = 0; i < 4; i++)
            if (!PQgetisnull(r, 0, i))
                out[i] = atof(PQgetvalue(r, 0, i));
    PQclear(r);
}

static int bench_latency(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    bench_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    long long n = a->jobs_given ? a->jobs : 1000, since;
    pid_t pids[BENCH_MAX_PROCESSES] = {0};
    double lat[4];
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int status = EX_OK;

    if (sh == MAP_FAILED)
        return EX_OSERR;
    memset(sh, 0, sizeof *sh);
    a->processes = 1;
    if (bench_sql(ctl, BENCH_RESET_SQL) != 0) {
        munmap(sh, sizeof *sh);
        return EX_SOFTWARE;
    }
    since = (long long)bench_number(ctl, "SELECT pgjobq.monitor_last_id()");
    if (bench_start_ready_workers(url, a, sh, pids, ctl) != 0) {
        status = EX_SOFTWARE;
        goto out;
    }
    bench_pause_ms(500); /* idle: its first claim found nothing */
    o.queue = "bench";
    double t0 = bench_now(), interval = 1.0 / (a->rate > 0 ? a->rate : 200);
    for (long long i = 0; i < n; i++) {
        /* Paced on an absolute schedule, so that a slow call does not shift the next ones. */
        double due = t0 + (double)i * interval, wait = due - bench_now();
        if (wait > 0)
            bench_pause_ms((long)(wait * 1000));
        int rc = pgjobq_enqueue(c, "{\"ping\": true}", &o, NULL);
        if (rc != PGJOBQ_OK) {
            status = cli_fail(c, rc);
            goto out;
        }
    }
    while (atomic_load(&sh->completed[0]) < n)
        bench_pause_ms(5);
    bench_stop_workers(a, pids);
    latency_stats(ctl, since, lat);
    if (a->json)
        printf("{\"scenario\":\"latency\",\"jobs\":%lld,\"rate\":%d,\"concurrency\":%d,\"p50_ms\":%.2f,"
               "\"p95_ms\":%.2f,\"p99_ms\":%.2f,\"max_ms\":%.2f,\"jobs_per_s\":%.1f}\n",
               n, a->rate, a->concurrency, lat[0], lat[1], lat[2], lat[3], (double)n / (bench_now() - t0));
    else
        printf("latency: %lld jobs at %d/s: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms\n", n, a->rate, lat[0],
               lat[1], lat[2], lat[3]);
out:
    bench_stop_workers(a, pids);
    munmap(sh, sizeof *sh);
    return status;
}

/* await: the worker's handler takes 20 ms (so that the wait is registered before the job ends), then
 * completes the job itself, on its own connection, and publishes when that completion returned
 * (committed and flushed: the job is complete from then on), CLOCK_MONOTONIC in ns, into *arg. */
static pgjobq_outcome await_handler(pgjobq_ctx *ctx, void *arg)
{
    _Atomic long long *done_ns = arg;
    const pgjobq_job *j = pgjobq_ctx_job(ctx);
    pgjobq_client *c;
    struct timespec ts;

    bench_pause_ms(20);
    if (pgjobq_ctx_client(ctx, &c) != PGJOBQ_OK || pgjobq_job_complete(c, j->id, j->lease_token, NULL) != PGJOBQ_OK)
        return PGJOBQ_OUTCOME_RETRY;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    atomic_store(done_ns, (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    return PGJOBQ_OUTCOME_DONE;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* await: N jobs one after another, each enqueued and then awaited (pgjobq_job_wait) while an idle
 * worker runs it; the wake is timed from the moment the worker's completion returned (committed) to
 * the moment pgjobq_job_wait returned with the job, both by CLOCK_MONOTONIC (one machine). */
static int bench_await(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    bench_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    long long n = a->jobs_given ? a->jobs : 200;
    pid_t pids[BENCH_MAX_PROCESSES] = {0};
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    double *ms = calloc((size_t)n, sizeof *ms);
    _Atomic long long *done_ns = mmap(NULL, sizeof *done_ns, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int status = EX_OK;

    if (sh == MAP_FAILED || ms == NULL || done_ns == MAP_FAILED) {
        free(ms);
        if (sh != MAP_FAILED)
            munmap(sh, sizeof *sh);
        if (done_ns != MAP_FAILED)
            munmap((void *)done_ns, sizeof *done_ns);
        return EX_OSERR;
    }
    memset(sh, 0, sizeof *sh);
    a->processes = 1;
    a->fn = await_handler;
    a->fn_arg = (void *)done_ns;
    if (bench_sql(ctl, BENCH_RESET_SQL) != 0 || bench_start_ready_workers(url, a, sh, pids, ctl) != 0) {
        status = EX_SOFTWARE;
        goto out;
    }
    bench_pause_ms(500);
    o.queue = "bench";
    for (long long i = 0; i < n; i++) {
        int64_t id = 0;
        pgjobq_job *j = NULL;
        struct timespec ts;
        atomic_store(done_ns, 0);
        int rc = pgjobq_enqueue(c, "{\"await\": true}", &o, &id);
        if (rc == PGJOBQ_OK)
            rc = pgjobq_job_wait(c, id, 30000, &j);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (rc != PGJOBQ_OK) {
            pgjobq_jobs_free(j);
            status = cli_fail(c, rc);
            goto out;
        }
        if (j->state != PGJOBQ_COMPLETED) {
            cli_err("bench await: job %lld ended %s", (long long)id, pgjobq_state_name(j->state));
            pgjobq_jobs_free(j);
            status = EX_SOFTWARE;
            goto out;
        }
        pgjobq_jobs_free(j);
        /* (The worker's store of its clock may come a moment after the waiter woke: wait for it.) */
        while (atomic_load(done_ns) == 0)
            bench_pause_ms(1);
        ms[i] = (double)((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec - atomic_load(done_ns)) / 1e6;
    }
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    double p50 = ms[n / 2], p95 = ms[(n * 95) / 100], p99 = ms[(n * 99) / 100], max = ms[n - 1];
    if (a->json)
        printf("{\"scenario\":\"await\",\"jobs\":%lld,\"p50_ms\":%.2f,\"p95_ms\":%.2f,\"p99_ms\":%.2f,"
               "\"max_ms\":%.2f}\n",
               n, p50, p95, p99, max);
    else
        printf("await: %lld jobs, woken after their completion: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms\n",
               n, p50, p95, p99, max);
out:
    bench_stop_workers(a, pids);
    munmap(sh, sizeof *sh);
    munmap((void *)done_ns, sizeof *done_ns);
    free(ms);
    return status;
}

static int bench_mixed(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    bench_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    /* A batch every 10 ms; at high rates batches of 500 (COPY), less often, so that one producer can
     * offer more than the workers take. */
    int per_tick = a->rate / 100 > 0 ? a->rate / 100 : 1;
    if (per_tick < 500 && a->rate >= 10000)
        per_tick = 500;
    double tick_s = (double)per_tick / a->rate;
    pgjobq_job_spec *specs = calloc((size_t)per_tick, sizeof *specs);
    long long enqueued = 0, since, depth_max = 0, depth_sum = 0, depth_n = 0, depth_end = 0;
    pid_t pids[BENCH_MAX_PROCESSES] = {0};
    double lat[4];
    int status = EX_OK;

    if (sh == MAP_FAILED || specs == NULL || a->processes > BENCH_MAX_PROCESSES) {
        free(specs);
        if (sh != MAP_FAILED)
            munmap(sh, sizeof *sh);
        return a->processes > BENCH_MAX_PROCESSES ? cli_usage_error(a->cmd, "--processes: at most %d", BENCH_MAX_PROCESSES)
                                            : EX_OSERR;
    }
    memset(sh, 0, sizeof *sh);
    if (bench_sql(ctl, BENCH_RESET_SQL) != 0) {
        status = EX_SOFTWARE;
        goto out;
    }
    since = (long long)bench_number(ctl, "SELECT pgjobq.monitor_last_id()");
    for (int i = 0; i < per_tick; i++) {
        specs[i].payload = "{\"mixed\": true}";
        specs[i].opts.queue = "bench";
    }
    if (bench_start_ready_workers(url, a, sh, pids, ctl) != 0) {
        status = EX_SOFTWARE;
        goto out;
    }
    double t0 = bench_now(), next_sample = t0 + 1;
    long long done_at_warm = 0, enqueued_at_warm = 0;
    double warm = t0 + (a->seconds > 20 ? 10 : a->seconds / 4.0);
    int warmed = 0;
    for (long long tick = 0;; tick++) {
        double due = t0 + (double)tick * tick_s, now = bench_now();
        /* A tick due at the end or later is not the run's, even when the producer is ahead of its
         * schedule and would wait for it (it offered a tick or two past the end: 1,608 jobs for
         * 4 s at 400/s). */
        if (now - t0 >= a->seconds || due - t0 >= a->seconds)
            break;
        if (due > now)
            bench_pause_ms((long)((due - now) * 1000));
        int rc = pgjobq_enqueue_many(c, specs, (size_t)per_tick, NULL, NULL);
        if (rc != PGJOBQ_OK) {
            status = cli_fail(c, rc);
            goto out;
        }
        enqueued += per_tick;
        if (!warmed && bench_now() >= warm) {
            warmed = 1;
            done_at_warm = bench_total(sh->completed, a->processes);
            enqueued_at_warm = enqueued;
            warm = bench_now();
        }
        if (bench_now() >= next_sample) {
            long long depth = enqueued - bench_total(sh->completed, a->processes);
            depth_max = depth > depth_max ? depth : depth_max;
            depth_sum += depth;
            depth_n++;
            depth_end = depth;
            next_sample += 1;
        }
    }
    double t_end = bench_now();
    long long done_at_end = bench_total(sh->completed, a->processes);
    bench_stop_workers(a, pids);
    latency_stats(ctl, since, lat);
    double steady = (double)(done_at_end - done_at_warm) / (t_end - warm);
    double offered = (double)enqueued / (t_end - t0);
    /* What was offered over the same window as `steady`: a producer that runs behind its schedule
     * (the rate asked is more than it manages beside the workers) offers more in the warm-up, before
     * the workers take their share of the two cores, than after it. */
    double offered_steady = (double)(enqueued - enqueued_at_warm) / (t_end - warm);
    /* Kept up: completed about what was offered after the warm-up, and the backlog did not grow. */
    int kept_up = steady >= 0.95 * offered_steady && depth_end <= (long long)(offered * 2) + per_tick;
    if (a->json)
        printf("{\"scenario\":\"mixed\",\"seconds\":%d,\"rate\":%d,\"offered_per_s\":%.1f,"
               "\"offered_steady_per_s\":%.1f,\"processes\":%d,\"concurrency\":%d,\"enqueued\":%lld,"
               "\"jobs_per_s\":%.1f,\"depth_avg\":%.1f,\"depth_max\":%lld,\"depth_end\":%lld,\"p50_ms\":%.2f,"
               "\"p99_ms\":%.2f,\"kept_up\":%s}\n",
               a->seconds, a->rate, offered, offered_steady, a->processes, a->concurrency, enqueued, steady,
               depth_n ? (double)depth_sum / (double)depth_n : 0.0, depth_max, depth_end, lat[0], lat[2],
               kept_up ? "true" : "false");
    else
        printf("mixed: %d s at %.0f/s offered (%.0f/s after the warm-up), %d x %d workers: %.0f jobs/s completed "
               "(after the warm-up), queue depth avg %.0f max %lld end %lld, pickup p50 %.2f ms p99 %.2f ms: %s\n",
               a->seconds, offered, offered_steady, a->processes, a->concurrency, steady,
               depth_n ? (double)depth_sum / (double)depth_n : 0.0, depth_max, depth_end, lat[0], lat[2],
               kept_up ? "kept up" : "fell behind");
out:
    bench_stop_workers(a, pids);
    free(specs);
    munmap(sh, sizeof *sh);
    return status;
}

/* ------------------------------------------------------------------------------------------------ */
/* Soak: the seed thread's deployment, for a long time                                               */

enum { SOAK_SAMPLE_S = 10, SOAK_MAX_SAMPLES = 8640 };

typedef struct soak_sample {
    double t;                  /* seconds since the workers were ready */
    long long completed;       /* completions so far */
    long long dead, live;      /* the live table: dead and live tuples (statistics, approximate) */
    long long jobs_bytes;      /* the live table with its indexes and TOAST */
    long long history_bytes;   /* every partition of the history */
    long long conns;           /* the workers' connections */
    long long vacuums;         /* autovacuum runs on the live table so far */
    long rss_kb_max, rss_kb_sum;
} soak_sample;

/* Resident set of a process, KiB (0 when unknown). */
static long rss_kb(pid_t pid)
{
    char path[64];
    long pages = 0, resident = 0;
    snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = 0;
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int soak_measure(PGconn *ctl, const bench_args *a, bench_shared *sh, const pid_t *pids, double t, soak_sample *s)
{
    PGresult *r = PQexec(ctl,
                         "SELECT jobs_dead, jobs_live, jobs_bytes, history_bytes,"
                         " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                         "   AND application_name IN ('pgjobq-claim', 'pgjobq-write', 'pgjobq-maintenance')),"
                         " jobs_autovacuums"
                         " FROM pgjobq.monitor_storage()");
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        cli_err("bench: soak statistics: %s", PQerrorMessage(ctl));
        PQclear(r);
        return -1;
    }
    memset(s, 0, sizeof *s);
    s->t = t;
    s->completed = bench_total(sh->completed, a->processes);
    s->dead = atoll(PQgetvalue(r, 0, 0));
    s->live = atoll(PQgetvalue(r, 0, 1));
    s->jobs_bytes = atoll(PQgetvalue(r, 0, 2));
    s->history_bytes = atoll(PQgetvalue(r, 0, 3));
    s->conns = atoll(PQgetvalue(r, 0, 4));
    s->vacuums = atoll(PQgetvalue(r, 0, 5));
    PQclear(r);
    for (int i = 0; i < a->processes; i++) {
        long kb = rss_kb(pids[i]);
        s->rss_kb_sum += kb;
        if (kb > s->rss_kb_max)
            s->rss_kb_max = kb;
    }
    return 0;
}

/* Completions per second between two samples. */
static double soak_rate(const soak_sample *from, const soak_sample *to)
{
    return to->t > from->t ? (double)(to->completed - from->completed) / (to->t - from->t) : 0.0;
}

/* The soak's producers: threads, each on a connection of its own, that put back what the workers
 * drained (--rate 0) or enqueue what is due by now (--rate R), in batches of at most REFILL_MAX taken
 * from a shared count.  They run beside the sampling loop, so that a refill that takes long (one
 * producer gets a small share of two cores beside 40 worker processes) neither delays the samples
 * nor leaves the backlog to run dry unseen. */
enum { REFILL_MAX = 10000, SOAK_MAX_PRODUCERS = 16 };

typedef struct soak_refill {
    const char *url;
    bench_shared *sh;
    const bench_args *a;
    double t0;
    _Atomic long long *refilled; /* jobs taken to enqueue, by all producers */
    _Atomic int *stop;
    _Atomic int failed;
    pthread_t th;
    char err[300];
} soak_refill;

static void *soak_refill_main(void *arg)
{
    soak_refill *r = arg;
    pgjobq_client *c = NULL;
    pgjobq_job_spec *specs = calloc(REFILL_MAX, sizeof *specs);
    int rc = specs ? pgjobq_client_open(&c, r->url) : PGJOBQ_ENOMEM;

    if (rc != PGJOBQ_OK) {
        snprintf(r->err, sizeof r->err, "%s", c ? pgjobq_errmsg(c) : pgjobq_strerror(rc));
        atomic_store(&r->failed, 1);
        pgjobq_client_close(c);
        free(specs);
        return NULL;
    }
    for (int i = 0; i < REFILL_MAX; i++) {
        specs[i].payload = "{\"noop\": true}";
        specs[i].opts.queue = "bench";
    }
    while (!atomic_load(r->stop)) {
        long long want = r->a->rate > 0 ? (long long)((bench_now() - r->t0) * r->a->rate)
                                        : bench_total(r->sh->completed, r->a->processes);
        long long have = atomic_load(r->refilled), k = want - have;
        if (k <= 0) {
            bench_pause_ms(100);
            continue;
        }
        k = k < REFILL_MAX ? k : REFILL_MAX;
        if (!atomic_compare_exchange_strong(r->refilled, &have, have + k))
            continue; /* another producer took this share first */
        if ((rc = pgjobq_enqueue_many(c, specs, (size_t)k, NULL, NULL)) != PGJOBQ_OK) {
            snprintf(r->err, sizeof r->err, "%s", pgjobq_errmsg(c));
            atomic_store(&r->failed, 1);
            break;
        }
    }
    pgjobq_client_close(c);
    free(specs);
    return NULL;
}

/* The sample furthest from `from` but no more than 60 s after it (step +1), or before it (step -1):
 * the ends of the first and the last minute. */
static int soak_minute(const soak_sample *smp, int n, int from, int step)
{
    int i = from;
    while (i + step >= 0 && i + step < n && (smp[i + step].t - smp[from].t) * step <= 60.0 + 0.5)
        i += step;
    return i;
}

/* P worker processes (C threads each) over --noise finished jobs and N queued ones, for S seconds.
 * With --rate 0 the N jobs are due and refilled as fast as they drain (saturation); with --rate R they
 * are scheduled a day ahead (a table that holds millions of queued jobs) while a producer offers R
 * due jobs a second.  Checks that the last minute's throughput is at least 0.9 of the first's (and,
 * with a rate, of R), that worker RSS, the hot table and its dead tuples stay bounded, and that no
 * connection leaks; reports the pickup lag of the last minute. */
static int bench_soak(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    bench_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    soak_sample *smp = calloc(SOAK_MAX_SAMPLES, sizeof *smp);
    soak_refill prod[SOAK_MAX_PRODUCERS];
    pid_t pids[BENCH_MAX_PROCESSES] = {0};
    int n = 0, status = EX_OK, nprod = a->producers ? a->producers : 2, started = 0;
    _Atomic long long refilled = 0;
    _Atomic int stop = 0;
    char sql[800];

    memset(prod, 0, sizeof prod);
    if (sh == MAP_FAILED || smp == NULL) {
        status = EX_OSERR;
        goto out;
    }
    if (a->processes > BENCH_MAX_PROCESSES || a->seconds < 120 || a->seconds / SOAK_SAMPLE_S >= SOAK_MAX_SAMPLES ||
        nprod < 1 || nprod > SOAK_MAX_PRODUCERS) {
        status = cli_usage_error(a->cmd, "soak: --processes at most %d, --seconds from 120 to %d, --producers 1 to %d",
                                 BENCH_MAX_PROCESSES, SOAK_SAMPLE_S * (SOAK_MAX_SAMPLES - 1), SOAK_MAX_PRODUCERS);
        goto out;
    }
    memset(sh, 0, sizeof *sh);
    fprintf(stderr, "soak: loading %lld finished and %lld queued jobs\n", a->noise, a->jobs);
    if (bench_sql(ctl, BENCH_RESET_SQL) != 0)
        goto soft_fail;
    if (a->noise > 0 && bench_insert_finished(ctl, "bench", a->noise) != 0)
        goto soft_fail;
    char later[64] = "";
    if (a->rate > 0) {
        PGresult *lr = PQexec(ctl, "SELECT to_char((now() + interval '1 day') AT TIME ZONE 'UTC',"
                                   " 'YYYY-MM-DD HH24:MI:SS.US') || '+00'");
        if (PQresultStatus(lr) == PGRES_TUPLES_OK && PQntuples(lr) == 1)
            snprintf(later, sizeof later, "%s", PQgetvalue(lr, 0, 0));
        PQclear(lr);
        if (later[0] == '\0')
            goto soft_fail;
    }
    int rc = bench_preload(c, "bench", a->jobs, later[0] ? later : NULL);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        goto out;
    }
    if (bench_sql(ctl, BENCH_VACUUM_SQL) != 0 || bench_sql(ctl, "CHECKPOINT") != 0)
        goto soft_fail;
    if (bench_start_ready_workers(url, a, sh, pids, ctl) != 0)
        goto soft_fail;
    double t0 = bench_now(), next = t0;
    long long since = (long long)bench_number(ctl, "SELECT pgjobq.monitor_last_id()");
    /* (With --rate 0 the producers put back what the workers complete from now on.) */
    for (; started < nprod; started++) {
        prod[started] = (soak_refill){.url = url, .sh = sh, .a = a, .t0 = t0, .refilled = &refilled, .stop = &stop};
        if (pthread_create(&prod[started].th, NULL, soak_refill_main, &prod[started]) != 0) {
            cli_err("bench: soak: cannot start a producer thread");
            goto soft_fail;
        }
    }
    for (;;) {
        double now = bench_now();
        for (int i = 0; i < started; i++)
            if (atomic_load(&prod[i].failed)) {
                cli_err("bench: soak: a producer failed: %s", prod[i].err);
                goto soft_fail;
            }
        if (now >= next) {
            if (soak_measure(ctl, a, sh, pids, now - t0, &smp[n]) != 0)
                goto soft_fail;
            const soak_sample *s = &smp[n];
            fprintf(stderr,
                    "soak: %4.0f s  %7.0f jobs/s  jobs table %6.1f MiB (%lld live, %lld dead, %lld autovacuums)"
                    "  history %6.1f MiB  %lld connections  worker RSS max %ld KiB\n",
                    s->t, n > 0 ? soak_rate(&smp[n - 1], s) : 0.0, (double)s->jobs_bytes / 1048576.0, s->live, s->dead,
                    s->vacuums, (double)s->history_bytes / 1048576.0, s->conns, s->rss_kb_max);
            n++;
            if (now - t0 >= a->seconds)
                break;
            next += SOAK_SAMPLE_S;
        }
        bench_pause_ms(100);
    }
    atomic_store(&stop, 1);
    for (; started > 0; started--)
        pthread_join(prod[started - 1].th, NULL);
    bench_stop_workers(a, pids);

    /* Minutes, by the samples' times: the first one after the workers were ready, and the last. */
    int last = n - 1;
    double first_rate = soak_rate(&smp[0], &smp[soak_minute(smp, n, 0, 1)]);
    double last_rate = soak_rate(&smp[soak_minute(smp, n, last, -1)], &smp[last]);
    /* RSS, the hot table and its dead tuples: the second half may not exceed the first half's peak by
     * more than a margin (a leak or a vacuum that falls behind grows without bound). */
    long rss_first = 0, rss_second = 0;
    long long bytes_first = 0, bytes_second = 0, dead_first = 0, dead_second = 0, conns_min = -1, conns_max = 0;
    for (int i = 1; i < n; i++) {
        int second = i > n / 2;
        soak_sample *s = &smp[i];
        long *rss = second ? &rss_second : &rss_first;
        long long *bytes = second ? &bytes_second : &bytes_first, *dead = second ? &dead_second : &dead_first;
        *rss = s->rss_kb_max > *rss ? s->rss_kb_max : *rss;
        *bytes = s->jobs_bytes > *bytes ? s->jobs_bytes : *bytes;
        *dead = s->dead > *dead ? s->dead : *dead;
        conns_min = conns_min < 0 || s->conns < conns_min ? s->conns : conns_min;
        conns_max = s->conns > conns_max ? s->conns : conns_max;
    }
    snprintf(sql, sizeof sql, "%lld", since);
    const char *since_v[1] = {sql};
    PGresult *r = PQexecParams(ctl, "SELECT p50_ms, p99_ms FROM pgjobq.monitor_pickup_lag('bench', $1::bigint)", 1, NULL,
                               since_v, NULL, NULL, 0);
    double lag50 = -1, lag99 = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) && !PQgetisnull(r, 0, 1)) {
        lag50 = atof(PQgetvalue(r, 0, 0));
        lag99 = atof(PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    int steady = last_rate >= 0.9 * first_rate && (a->rate == 0 || last_rate >= 0.9 * a->rate);
    int rss_flat = rss_second <= rss_first + rss_first / 5 + 1024;
    int table_bounded = bytes_second <= bytes_first + bytes_first / 2;
    int dead_bounded = dead_second <= 2 * dead_first + 100000;
    /* Two connections per process, and the maintenance connection of the one process that maintains. */
    int no_leak = conns_max == conns_min && conns_max == 2LL * a->processes + 1;
    printf("{\"scenario\":\"soak\",\"seconds\":%d,\"rate\":%d,\"processes\":%d,\"concurrency\":%d,\"queued\":%lld,"
           "\"finished_before\":%lld,\"completed\":%lld,\"first_minute_jobs_per_s\":%.1f,"
           "\"last_minute_jobs_per_s\":%.1f,\"last_over_first\":%.3f,\"rss_kb_max_first_half\":%ld,"
           "\"rss_kb_max_second_half\":%ld,\"jobs_bytes_max_first_half\":%lld,\"jobs_bytes_max_second_half\":%lld,"
           "\"dead_max_first_half\":%lld,\"dead_max_second_half\":%lld,\"history_bytes_start\":%lld,"
           "\"history_bytes_end\":%lld,\"autovacuums\":%lld,\"connections_min\":%lld,\"connections_max\":%lld,"
           "\"pickup_lag_p50_ms\":%.1f,\"pickup_lag_p99_ms\":%.1f,\"steady\":%s,\"rss_flat\":%s,"
           "\"table_bounded\":%s,\"dead_bounded\":%s,\"no_connection_leak\":%s}\n",
           a->seconds, a->rate, a->processes, a->concurrency, a->jobs, a->noise, smp[last].completed, first_rate, last_rate,
           first_rate > 0 ? last_rate / first_rate : 0.0, rss_first, rss_second, bytes_first, bytes_second,
           dead_first, dead_second, smp[0].history_bytes, smp[last].history_bytes,
           smp[last].vacuums - smp[0].vacuums, conns_min, conns_max, lag50, lag99, steady ? "true" : "false",
           rss_flat ? "true" : "false", table_bounded ? "true" : "false", dead_bounded ? "true" : "false",
           no_leak ? "true" : "false");
    status = steady && rss_flat && table_bounded && dead_bounded && no_leak ? EX_OK : EX_SOFTWARE;
    goto out;
soft_fail:
    status = EX_SOFTWARE;
out:
    atomic_store(&stop, 1);
    for (; started > 0; started--)
        pthread_join(prod[started - 1].th, NULL);
    if (sh != MAP_FAILED) {
        bench_stop_workers(a, pids);
        munmap(sh, sizeof *sh);
    }
    free(smp);
    return status;
}

int cmd_bench(const cli_cmd *cmd, int argc, char **argv)
{
    bench_args a = {.cmd = cmd, .jobs = 100000, .concurrency = 32, .processes = 1, .seconds = 60};
    const char *url;
    pgjobq_client *c = NULL;
    PGconn *ctl;
    int first, status, rc;

    first = cli_parse(cmd, argc, argv, bench_opt, &a);
    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (argc - first != 1)
        return cli_usage_error(cmd, "expected one scenario: enqueue, drain, drain-exec, drain-coproc, latency, mixed, "
                                    "steady, soak, await");
    const char *scenario = argv[first];
    static const char *const scenarios[] = {"enqueue", "drain",  "drain-exec", "drain-coproc", "latency",
                                            "mixed",   "steady", "soak",       "await",        NULL};
    int known = 0;
    for (int i = 0; scenarios[i]; i++)
        known |= strcmp(scenario, scenarios[i]) == 0;
    if (!known) /* before any database is reached, or the embedded one started */
        return cli_usage_error(cmd, "unknown scenario '%s'", scenario);
    if (cli_cluster_arg && strcmp(scenario, "enqueue") != 0)
        return cli_usage_error(cmd, "--cluster goes with the enqueue scenario");
    if ((a.parked > 0 || a.steps > 0 || a.chain > 1) && strcmp(scenario, "drain") != 0)
        return cli_usage_error(cmd, "--steps, --chain and --parked go with the drain scenario (in-process workers)");
    if ((a.keys > 0 || a.strict) && strcmp(scenario, "drain") != 0)
        return cli_usage_error(cmd, "--keys and --strict go with the drain scenario");
    if (a.limit > 0 && strncmp(scenario, "drain", 5) != 0)
        return cli_usage_error(cmd, "--limit goes with the drain scenarios");
    if (a.strict && a.keys == 0)
        return cli_usage_error(cmd, "--strict needs --keys (a strict queue's jobs each have a key)");
    if (a.steps > 0 && a.chain > 1)
        return cli_usage_error(cmd, "--steps and --chain: one or the other");
    if (strcmp(scenario, "drain-coproc") == 0 && a.handler == NULL)
        return cli_usage_error(cmd, "drain-coproc needs --handler 'CMD ARGS' (e.g. 'python3 examples/coproc.py')");
    if ((strcmp(scenario, "mixed") == 0 || strcmp(scenario, "steady") == 0) && a.rate == 0)
        a.rate = strcmp(scenario, "steady") == 0 ? 15000 : 10000;
    if (strcmp(scenario, "latency") == 0 && a.rate == 0)
        a.rate = 200;
    if ((url = cli_resolve_db(&status)) == NULL)
        return status;
    rc = pgjobq_client_open(&c, url);
    if (rc == PGJOBQ_ESCHEMA && c)
        rc = pgjobq_migrate(c, NULL);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_client_close(c);
        return status;
    }
    if ((ctl = bench_control(url)) == NULL) {
        pgjobq_client_close(c);
        return EX_UNAVAILABLE;
    }
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(scenario, "enqueue") == 0 && cli_cluster_arg) {
        pgjobq_cluster *cl = cli_cluster_open(&status);
        if (cl)
            status = bench_enqueue(&a, ctl, c, cl);
        pgjobq_cluster_close(cl);
    } else if (strcmp(scenario, "enqueue") == 0)
        status = bench_enqueue(&a, ctl, c, NULL);
    else if (strcmp(scenario, "drain") == 0)
        status = bench_drain(url, &a, 0, ctl, c);
    else if (strcmp(scenario, "drain-exec") == 0)
        status = bench_drain(url, &a, 1, ctl, c);
    else if (strcmp(scenario, "drain-coproc") == 0)
        status = bench_drain(url, &a, 2, ctl, c);
    else if (strcmp(scenario, "latency") == 0)
        status = bench_latency(url, &a, ctl, c);
    else if (strcmp(scenario, "await") == 0)
        status = bench_await(url, &a, ctl, c);
    else if (strcmp(scenario, "mixed") == 0)
        status = bench_mixed(url, &a, ctl, c);
    else if (strcmp(scenario, "steady") == 0)
        status = bench_steady(url, &a, ctl, c);
    else
        status = bench_soak(url, &a, ctl, c);
    PQfinish(ctl);
    pgjobq_client_close(c);
    return status;
}
