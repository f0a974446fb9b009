/*
 * cmd_bench.c - pgjobq bench SCENARIO: the benchmark scenarios behind `make bench`, runnable alone
 * against any database.  Each prints one JSON object (or a line of text).
 *
 *   enqueue     N jobs through pgjobq_enqueue_batch                                   jobs_per_s
 *   drain       N preloaded no-op jobs, P worker processes x C threads (in-process)     jobs_per_s
 *   drain-exec  the same with `pgjobq work --exec /bin/true`                             jobs_per_s
 *   ceiling     the raw claim and complete statements, K clients, batch B, no library    jobs_per_s
 *   latency     an idle worker; N jobs enqueued one at a time at R/s                     p50/p95/p99/max
 *   mixed       producers at R jobs/s while workers drain, for S seconds                 throughput, depth, p99
 *
 * The benchmark's jobs live in queue "bench" (and "bench_noise" for --noise); those queues are
 * emptied before each run, nothing else is touched.  Worker processes are forked children, so that
 * their connections and peak RSS are theirs alone.
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

#include <libpq-fe.h>

#include "cli.h"

#define OPT_JOBS 'n'
#define OPT_CONCURRENCY 'c'
#define OPT_PROCESSES 'p'
#define OPT_BATCH 'b'
#define OPT_CLIENTS 'k'
#define OPT_RATE 'r'
#define OPT_SECONDS 's'
#define OPT_NOISE 4001
#define OPT_JSON 4002
#define OPT_BARE 4003

const cli_opt bench_opts[] = {
    {"jobs", OPT_JOBS, "N", "jobs (default 100000; latency: 1000)"},
    {"concurrency", OPT_CONCURRENCY, "C", "worker threads per process (default 32)"},
    {"processes", OPT_PROCESSES, "P", "worker processes (default 1)"},
    {"batch", OPT_BATCH, "B", "most jobs per claim (default 1000; ceiling: jobs per statement)"},
    {"clients", OPT_CLIENTS, "K", "ceiling: client connections (default 1)"},
    {"rate", OPT_RATE, "R", "latency, mixed: jobs enqueued per second (default 200; mixed 10000)"},
    {"seconds", OPT_SECONDS, "S", "mixed: how long to run (default 60)"},
    {"noise", OPT_NOISE, "N", "drain: also hold N completed jobs and N queued jobs of another queue"},
    {"bare", OPT_BARE, NULL, "ceiling: inline the statements instead of calling pgjobq's functions"},
    {"json", OPT_JSON, NULL, "print one JSON object"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

typedef struct bench_args {
    const cli_cmd *cmd;
    long long jobs, noise;
    int concurrency, processes, batch, clients, rate, seconds, json, jobs_given, bare;
} bench_args;

static int bench_opt(int key, const char *arg, void *ctx)
{
    bench_args *a = ctx;
    char why[160];
    long long v;
    long long max = key == OPT_JOBS || key == OPT_NOISE ? 100000000 : key == OPT_RATE ? 10000000 : 100000;

    if (key == OPT_JSON || key == OPT_BARE) {
        *(key == OPT_JSON ? &a->json : &a->bare) = 1;
        return 0;
    }
    if (cli_parse_int(arg, key == OPT_NOISE ? 0 : 1, max, &v, why, sizeof why) != 0) {
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
    case OPT_CLIENTS: a->clients = (int)v; return 0;
    case OPT_RATE: a->rate = (int)v; return 0;
    case OPT_SECONDS: a->seconds = (int)v; return 0;
    case OPT_NOISE: a->noise = v; return 0;
    }
    return -1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A control connection for setup and measurements (not counted as the worker's). */
static PGconn *control(const char *url)
{
    const char *const keys[] = {"dbname", "application_name", NULL};
    const char *const vals[] = {url, "pgjobq-bench", NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(c) != CONNECTION_OK) {
        cli_err("bench: %s", PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    return c;
}

static int run_sql(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok)
        cli_err("bench: %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

static double sql_number(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    double v = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
        v = atof(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

/* Removes the benchmark's jobs, live and finished (and nothing else). */
#define BENCH_RESET_SQL                                                      \
    "DELETE FROM pgjobq.jobs WHERE queue IN ('bench', 'bench_noise');"       \
    "DELETE FROM pgjobq.history WHERE queue IN ('bench', 'bench_noise')"

/* Empties the benchmark's queues and loads n no-op jobs into queue (untimed). */
static int preload(pgjobq_client *c, const char *queue, long long n, int delete_first)
{
    enum { BATCH = 10000 };
    pgjobq_job_spec *specs = calloc(BATCH, sizeof *specs);
    int rc = PGJOBQ_OK;

    if (specs == NULL)
        return PGJOBQ_ENOMEM;
    if (delete_first && run_sql(pgjobq_client_conn(c), BENCH_RESET_SQL) != 0) {
        free(specs);
        return PGJOBQ_EDB;
    }
    for (long long done = 0; done < n && rc == PGJOBQ_OK;) {
        size_t k = (size_t)(n - done < BATCH ? n - done : BATCH);
        for (size_t i = 0; i < k; i++) {
            specs[i].payload = "{\"noop\": true}";
            specs[i].opts.queue = queue;
        }
        rc = pgjobq_enqueue_batch(c, specs, k, NULL, NULL);
        done += (long long)k;
    }
    free(specs);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* Worker children                                                                                   */

typedef struct shared {
    _Atomic long long completed[64];
    _Atomic long long claims[64];
    _Atomic long long claimed[64];
    _Atomic long long writes[64];
    _Atomic long rss_kb[64];
    _Atomic int ready;
} shared;

static pgjobq_outcome noop(pgjobq_ctx *ctx, void *arg)
{
    (void)ctx;
    (void)arg;
    return PGJOBQ_OUTCOME_COMPLETE;
}

typedef struct child_watch {
    pgjobq_worker *w;
    shared *sh;
    int slot;
    _Atomic int done;
} child_watch;

static void *child_watcher(void *arg)
{
    child_watch *cw = arg;
    while (!atomic_load(&cw->done)) {
        pgjobq_worker_stats s;
        pgjobq_worker_get_stats(cw->w, &s);
        atomic_store(&cw->sh->completed[cw->slot], s.completed);
        atomic_store(&cw->sh->claims[cw->slot], s.claims);
        atomic_store(&cw->sh->claimed[cw->slot], s.claimed);
        atomic_store(&cw->sh->writes[cw->slot], s.writes);
        /* Often enough to time a drain to 20 ms, seldom enough not to load the machine it measures
         * (every 2 ms, 40 processes woke 20,000 times a second). */
        pause_ms(20);
    }
    return NULL;
}

static pgjobq_worker *child_worker;

static void child_stop(int sig)
{
    (void)sig;
    if (child_worker)
        pgjobq_worker_stop(child_worker);
}

/* A worker process: runs until SIGTERM, publishing its counters in shared memory. */
static void worker_child(const char *url, const bench_args *a, shared *sh, int slot)
{
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    child_watch cw;
    pthread_t th;
    struct rusage ru;

    /* A worker never outlives the benchmark that started it (killed or not, it would hold jobs and
     * load the database forever). */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() == 1)
        _exit(1);
    o.batch_max = a->batch;
    o.poll_ms = 100;
    o.no_maintenance = slot != 0; /* one process maintains, as a fleet would */
    if (pgjobq_worker_new(&child_worker, url, &o) != PGJOBQ_OK ||
        pgjobq_worker_handle(child_worker, "bench", NULL, a->concurrency, noop, NULL) != PGJOBQ_OK) {
        fprintf(stderr, "bench worker: %s\n", pgjobq_worker_errmsg(child_worker));
        _exit(1);
    }
    signal(SIGTERM, child_stop);
    cw.w = child_worker;
    cw.sh = sh;
    cw.slot = slot;
    atomic_store(&cw.done, 0);
    pthread_create(&th, NULL, child_watcher, &cw);
    atomic_fetch_add(&sh->ready, 1);
    int rc = pgjobq_worker_run(child_worker);
    atomic_store(&cw.done, 1);
    pthread_join(th, NULL);
    pgjobq_worker_stats s;
    pgjobq_worker_get_stats(child_worker, &s);
    atomic_store(&sh->completed[slot], s.completed);
    atomic_store(&sh->claims[slot], s.claims);
    atomic_store(&sh->claimed[slot], s.claimed);
    getrusage(RUSAGE_SELF, &ru);
    atomic_store(&sh->rss_kb[slot], ru.ru_maxrss);
    pgjobq_worker_free(child_worker);
    _exit(rc == PGJOBQ_OK ? 0 : 1);
}

static long long total(_Atomic long long *v, int n)
{
    long long t = 0;
    for (int i = 0; i < n; i++)
        t += atomic_load(&v[i]);
    return t;
}

/* Counts the worker processes' connections: pgjobq's, but neither the control connection nor the
 * benchmark's own client (which loaded the jobs). */
static int worker_connections(PGconn *ctl, pgjobq_client *mine)
{
    char sql[400];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
             " AND backend_type = 'client backend' AND application_name LIKE 'pgjobq%%'"
             " AND application_name <> 'pgjobq-bench' AND pid <> pg_backend_pid() AND pid <> %d",
             PQbackendPID(pgjobq_client_conn(mine)));
    return (int)sql_number(ctl, sql);
}

static int bench_drain(const char *url, bench_args *a, int exec_mode, PGconn *ctl, pgjobq_client *c)
{
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pids[64];
    int conns_max = 0, rc;
    double t0, t1;
    char exe[4096];

    if (sh == MAP_FAILED || a->processes > 64) {
        cli_err("bench: at most 64 processes");
        return EX_USAGE;
    }
    memset(sh, 0, sizeof *sh);
    if (a->noise > 0) {
        /* History and another queue's backlog: what a busy production table holds. */
        char sql[512];
        if (run_sql(ctl, BENCH_RESET_SQL) != 0)
            return EX_SOFTWARE;
        snprintf(sql, sizeof sql,
                 "INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts,"
                 " run_at, created_at, started_at, finished_at, lease_token)"
                 " SELECT nextval(pg_get_serial_sequence('pgjobq.jobs', 'id')), 'bench_noise', 'default', '{}', 0,"
                 " 'completed', 1, 25, now(), now(), now(), now(), 1 FROM generate_series(1, %lld)",
                 a->noise);
        if (run_sql(ctl, sql) != 0)
            return EX_SOFTWARE;
        snprintf(sql, sizeof sql,
                 "INSERT INTO pgjobq.jobs (queue, payload) SELECT 'bench_noise', '{}' FROM generate_series(1, %lld)",
                 a->noise);
        if (run_sql(ctl, sql) != 0)
            return EX_SOFTWARE;
    }
    if ((rc = preload(c, "bench", a->jobs, a->noise == 0)) != PGJOBQ_OK)
        return cli_fail(c, rc);
    if (run_sql(ctl, "VACUUM ANALYZE pgjobq.jobs") != 0 || run_sql(ctl, "CHECKPOINT") != 0)
        return EX_SOFTWARE;

    if (exec_mode && readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) {
        cli_err("bench: cannot find my own executable");
        return EX_SOFTWARE;
    }
    if (exec_mode)
        exe[readlink("/proc/self/exe", exe, sizeof exe - 1)] = '\0';
    t0 = now_s();
    for (int i = 0; i < a->processes; i++) {
        pids[i] = fork();
        if (pids[i] < 0) {
            cli_err("bench: fork: %s", strerror(errno));
            return EX_OSERR;
        }
        if (pids[i] == 0) {
            if (exec_mode) {
                char q[32], b[16];
                snprintf(q, sizeof q, "bench:%d", a->concurrency);
                snprintf(b, sizeof b, "%d", a->batch);
                setenv("PGJOBQ_DATABASE_URL", url, 1);
                execl(exe, exe, "work", "--queue", q, "--exec", "/bin/true", "--batch", b, "--poll", "100ms",
                      "--log-level", "warn", (char *)NULL);
                _exit(127);
            }
            worker_child(url, a, sh, i);
        }
    }
    double next_conn_sample = now_s() + 0.05;
    /* Wait until every job is completed: in-process workers report through shared memory; exec
     * workers are counted in the database (cheaply: the claim index holds only queued jobs). */
    for (;;) {
        long long done;
        if (exec_mode)
            done = a->jobs - (long long)sql_number(ctl, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'bench'"
                                                        " AND state IN ('queued', 'running')");
        else
            done = total(sh->completed, a->processes);
        /* Sampled every 200 ms: the sampling query must not load the database it measures. */
        if (now_s() >= next_conn_sample) {
            int conns = worker_connections(ctl, c);
            if (conns > conns_max)
                conns_max = conns;
            next_conn_sample = now_s() + 0.2;
        }
        if (done >= a->jobs)
            break;
        pause_ms(exec_mode ? 50 : 5);
    }
    t1 = now_s();
    for (int i = 0; i < a->processes; i++)
        kill(pids[i], SIGTERM);
    for (int i = 0; i < a->processes; i++)
        waitpid(pids[i], NULL, 0);
    double secs = t1 - t0;
    long long claims = total(sh->claims, a->processes), claimed = total(sh->claimed, a->processes);
    long long writes = total(sh->writes, a->processes);
    long rss = 0;
    for (int i = 0; i < a->processes; i++)
        if (atomic_load(&sh->rss_kb[i]) > rss)
            rss = atomic_load(&sh->rss_kb[i]);
    double completed = sql_number(ctl, "SELECT count(*) FROM pgjobq.history WHERE queue = 'bench' AND state = 'completed'");
    if (a->json)
        printf("{\"scenario\":\"%s\",\"jobs\":%lld,\"processes\":%d,\"concurrency\":%d,\"batch_max\":%d,"
               "\"noise\":%lld,\"seconds\":%.3f,\"jobs_per_s\":%.1f,\"claims\":%lld,\"avg_claim_batch\":%.1f,"
               "\"avg_write_batch\":%.1f,\"connections_max\":%d,\"rss_kb_max\":%ld,\"completed\":%.0f}\n",
               exec_mode ? "drain-exec" : "drain", a->jobs, a->processes, a->concurrency, a->batch, a->noise, secs,
               (double)a->jobs / secs, claims, claims ? (double)claimed / (double)claims : 0.0,
               writes ? (double)a->jobs / (double)writes : 0.0, conns_max, rss, completed);
    else
        printf("%s: %lld jobs, %d x %d threads: %.0f jobs/s (%.2f s), avg claim batch %.1f, %d connections, "
               "peak RSS %ld KiB\n",
               exec_mode ? "drain-exec" : "drain", a->jobs, a->processes, a->concurrency, (double)a->jobs / secs, secs,
               claims ? (double)claimed / (double)claims : 0.0, conns_max, rss);
    munmap(sh, sizeof *sh);
    return completed >= (double)a->jobs ? EX_OK : EX_SOFTWARE;
}

/* ------------------------------------------------------------------------------------------------ */
/* The raw-SQL ceiling: the claim and completion statements themselves, no library around them.      */

/* The statements the library sends, called directly (B3): the same SQL text, select lists included
 * (they must match JOB_COLUMNS in src/jobs.c and the worker's write in src/worker.c); only the
 * encoding of the parameters is this driver's own. */
static const char fn_claim[] =
    "SELECT id, queue::pg_catalog.text, kind::pg_catalog.text, payload::pg_catalog.jsonb, priority,"
    " state::pg_catalog.text, attempt, max_attempts, lease_token, run_at, created_at, started_at,"
    " finished_at, lease_until, worker_id::pg_catalog.text, result, last_error,"
    " unique_key::pg_catalog.text, cancel_requested"
    " FROM pgjobq.claim('bench', $1, '60 s', 'ceiling')";
static const char fn_complete[] = "SELECT id, outcome FROM pgjobq.complete_many($1::bigint[], $2::bigint[], NULL)";

/* The bare statements inside those functions, inlined (--bare): what the function wrappers cost. */
static const char ceiling_claim[] =
    "WITH picked AS MATERIALIZED ("
    "  SELECT id FROM pgjobq.jobs WHERE state = 'queued' AND queue = 'bench' AND run_at <= now()"
    "  ORDER BY priority, run_at, id LIMIT $1 FOR UPDATE SKIP LOCKED)"
    " UPDATE pgjobq.jobs j SET state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,"
    "  lease_until = now() + interval '60 s', started_at = now(), worker_id = 'ceiling'"
    " WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked)) RETURNING j.id, j.lease_token, j.payload";

static const char ceiling_complete[] =
    "WITH gone AS (DELETE FROM pgjobq.jobs j USING unnest($1::bigint[], $2::bigint[]) AS u(id, token)"
    "  WHERE j.id = u.id AND j.lease_token = u.token AND j.lease_until > now() RETURNING j.*)"
    " INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,"
    "  created_at, started_at, finished_at, lease_token, worker_id)"
    " SELECT id, queue, kind, payload, priority, 'completed', attempt, max_attempts, run_at, created_at,"
    "  started_at, now(), lease_token, worker_id FROM gone";

typedef struct ceiling_arg {
    const char *url;
    int batch;
    int bare;
    _Atomic long long done;
    _Atomic int errors;
} ceiling_arg;

static void *ceiling_client(void *arg)
{
    ceiling_arg *ca = arg;
    PGconn *c = PQconnectdb(ca->url);
    char batch[16];
    const char *params[1] = {batch};
    size_t cap = 1 << 16;
    char *ids = malloc(cap), *tokens = malloc(cap);

    snprintf(batch, sizeof batch, "%d", ca->batch);
    if (PQstatus(c) != CONNECTION_OK || ids == NULL || tokens == NULL) {
        atomic_fetch_add(&ca->errors, 1);
        goto out;
    }
    for (;;) {
        PGresult *r = PQexecParams(c, ca->bare ? ceiling_claim : fn_claim, 1, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            atomic_fetch_add(&ca->errors, 1);
            PQclear(r);
            break;
        }
        int n = PQntuples(r);
        int id_col = ca->bare ? 0 : PQfnumber(r, "id"), token_col = ca->bare ? 1 : PQfnumber(r, "lease_token");
        if (n == 0) {
            PQclear(r);
            break;
        }
        /* Text array literals of ids and tokens. */
        size_t need = (size_t)n * 24 + 8;
        if (need > cap) {
            cap = need;
            ids = realloc(ids, cap);
            tokens = realloc(tokens, cap);
        }
        size_t li = 0, lt = 0;
        ids[li++] = '{';
        tokens[lt++] = '{';
        for (int i = 0; i < n; i++) {
            li += (size_t)snprintf(ids + li, cap - li, "%s%s", i ? "," : "", PQgetvalue(r, i, id_col));
            lt += (size_t)snprintf(tokens + lt, cap - lt, "%s%s", i ? "," : "", PQgetvalue(r, i, token_col));
        }
        ids[li++] = '}';
        ids[li] = '\0';
        tokens[lt++] = '}';
        tokens[lt] = '\0';
        PQclear(r);
        const char *cp[2] = {ids, tokens};
        r = PQexecParams(c, ca->bare ? ceiling_complete : fn_complete, 2, NULL, cp, NULL, NULL, 0);
        if (PQresultStatus(r) == PGRES_COMMAND_OK) {
            atomic_fetch_add(&ca->done, atoll(PQcmdTuples(r)));
        } else if (PQresultStatus(r) == PGRES_TUPLES_OK) {
            long long ok = 0;
            for (int i = 0; i < PQntuples(r); i++)
                ok += strcmp(PQgetvalue(r, i, 1), "completed") == 0;
            atomic_fetch_add(&ca->done, ok);
        } else {
            atomic_fetch_add(&ca->errors, 1);
        }
        PQclear(r);
    }
out:
    free(ids);
    free(tokens);
    PQfinish(c);
    return NULL;
}

static int bench_ceiling(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    pthread_t th[256];
    ceiling_arg ca;
    int rc;

    if (a->clients > 256)
        return cli_usage_error(a->cmd, "--clients: at most 256");
    if ((rc = preload(c, "bench", a->jobs, 1)) != PGJOBQ_OK)
        return cli_fail(c, rc);
    if (run_sql(ctl, "VACUUM ANALYZE pgjobq.jobs") != 0 || run_sql(ctl, "CHECKPOINT") != 0)
        return EX_SOFTWARE;
    ca.url = url;
    ca.batch = a->batch;
    ca.bare = a->bare;
    atomic_store(&ca.done, 0);
    atomic_store(&ca.errors, 0);
    double t0 = now_s();
    for (int i = 0; i < a->clients; i++)
        pthread_create(&th[i], NULL, ceiling_client, &ca);
    for (int i = 0; i < a->clients; i++)
        pthread_join(th[i], NULL);
    double secs = now_s() - t0;
    long long done = atomic_load(&ca.done);
    if (a->json)
        printf("{\"scenario\":\"ceiling\",\"bare\":%s,\"jobs\":%lld,\"clients\":%d,\"batch\":%d,\"seconds\":%.3f,"
               "\"jobs_per_s\":%.1f,\"errors\":%d}\n",
               a->bare ? "true" : "false", a->jobs, a->clients, a->batch, secs, (double)done / secs,
               atomic_load(&ca.errors));
    else
        printf("ceiling: %lld jobs, %d clients, batch %d: %.0f jobs/s (%.2f s)\n", a->jobs, a->clients, a->batch,
               (double)done / secs, secs);
    return done == a->jobs && atomic_load(&ca.errors) == 0 ? EX_OK : EX_SOFTWARE;
}

/* ------------------------------------------------------------------------------------------------ */
/* Enqueue, latency, mixed                                                                           */

static int bench_enqueue(bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    enum { MAXB = 100000 };
    int b = a->batch > MAXB ? MAXB : a->batch;
    pgjobq_job_spec *specs = calloc((size_t)b, sizeof *specs);
    int rc = PGJOBQ_OK;

    if (specs == NULL)
        return EX_OSERR;
    if (run_sql(ctl, BENCH_RESET_SQL) != 0 ||
        run_sql(ctl, "VACUUM pgjobq.jobs") != 0 || run_sql(ctl, "CHECKPOINT") != 0) {
        free(specs);
        return EX_SOFTWARE;
    }
    for (int i = 0; i < b; i++) {
        specs[i].payload = "{\"to\": \"someone@example.org\", \"n\": 12345}";
        specs[i].opts.queue = "bench";
    }
    double t0 = now_s();
    for (long long done = 0; done < a->jobs && rc == PGJOBQ_OK;) {
        size_t k = (size_t)(a->jobs - done < b ? a->jobs - done : b);
        rc = pgjobq_enqueue_batch(c, specs, k, NULL, NULL);
        done += (long long)k;
    }
    double secs = now_s() - t0;
    free(specs);
    if (rc != PGJOBQ_OK)
        return cli_fail(c, rc);
    if (a->json)
        printf("{\"scenario\":\"enqueue\",\"jobs\":%lld,\"batch\":%d,\"seconds\":%.3f,\"jobs_per_s\":%.1f}\n",
               a->jobs, b, secs, (double)a->jobs / secs);
    else
        printf("enqueue: %lld jobs in batches of %d: %.0f jobs/s (%.2f s)\n", a->jobs, b, (double)a->jobs / secs, secs);
    return EX_OK;
}

/* Latency percentiles of jobs created since `since_id`, from the database clock: created_at is the
 * enqueuing statement's now(), started_at the claim's now(); the handler starts right after. */
static void latency_stats(PGconn *ctl, long long since_id, double out[4])
{
    char sql[512];
    static const char *const q[4] = {"percentile_cont(0.5)", "percentile_cont(0.95)", "percentile_cont(0.99)", "max"};
    for (int i = 0; i < 4; i++) {
        if (i < 3)
            snprintf(sql, sizeof sql,
                     "SELECT %s WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) * 1000"
                     " FROM pgjobq.jobs WHERE queue = 'bench' AND id > %lld AND started_at IS NOT NULL",
                     q[i], since_id);
        else
            snprintf(sql, sizeof sql,
                     "SELECT max(extract(epoch FROM started_at - created_at)) * 1000"
                     " FROM pgjobq.jobs WHERE queue = 'bench' AND id > %lld AND started_at IS NOT NULL",
                     since_id);
        out[i] = sql_number(ctl, sql);
    }
}

static pid_t start_worker_child(const char *url, bench_args *a, shared *sh)
{
    pid_t pid = fork();
    if (pid == 0)
        worker_child(url, a, sh, 0);
    while (atomic_load(&sh->ready) == 0)
        pause_ms(1);
    return pid;
}

static int bench_latency(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    long long n = a->jobs_given ? a->jobs : 1000, since;
    double lat[4];
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;

    if (sh == MAP_FAILED)
        return EX_OSERR;
    memset(sh, 0, sizeof *sh);
    if (run_sql(ctl, BENCH_RESET_SQL) != 0)
        return EX_SOFTWARE;
    since = (long long)sql_number(ctl, "SELECT coalesce(max(id), 0) FROM pgjobq.jobs");
    pid_t pid = start_worker_child(url, a, sh);
    pause_ms(1000); /* let it connect, listen and go idle */
    o.queue = "bench";
    double t0 = now_s(), interval = 1.0 / (a->rate > 0 ? a->rate : 200);
    for (long long i = 0; i < n; i++) {
        /* Paced on an absolute schedule, so that a slow call does not shift the next ones. */
        double due = t0 + (double)i * interval, wait = due - now_s();
        if (wait > 0)
            pause_ms((long)(wait * 1000));
        int rc = pgjobq_enqueue(c, "{\"ping\": true}", &o, NULL);
        if (rc != PGJOBQ_OK) {
            kill(pid, SIGTERM);
            waitpid(pid, NULL, 0);
            return cli_fail(c, rc);
        }
    }
    while (atomic_load(&sh->completed[0]) < n)
        pause_ms(5);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    latency_stats(ctl, since, lat);
    if (a->json)
        printf("{\"scenario\":\"latency\",\"jobs\":%lld,\"rate\":%d,\"concurrency\":%d,\"p50_ms\":%.2f,"
               "\"p95_ms\":%.2f,\"p99_ms\":%.2f,\"max_ms\":%.2f,\"jobs_per_s\":%.1f}\n",
               n, a->rate, a->concurrency, lat[0], lat[1], lat[2], lat[3], (double)n / (now_s() - t0));
    else
        printf("latency: %lld jobs at %d/s: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms\n", n, a->rate, lat[0],
               lat[1], lat[2], lat[3]);
    munmap(sh, sizeof *sh);
    return EX_OK;
}

static int bench_mixed(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int per_tick = a->rate / 100 > 0 ? a->rate / 100 : 1; /* a batch every 10 ms */
    pgjobq_job_spec *specs = calloc((size_t)per_tick, sizeof *specs);
    long long enqueued = 0, since, depth_max = 0, depth_sum = 0, depth_n = 0;
    double lat[4];

    if (sh == MAP_FAILED || specs == NULL)
        return EX_OSERR;
    memset(sh, 0, sizeof *sh);
    if (run_sql(ctl, BENCH_RESET_SQL) != 0)
        return EX_SOFTWARE;
    since = (long long)sql_number(ctl, "SELECT coalesce(max(id), 0) FROM pgjobq.jobs");
    for (int i = 0; i < per_tick; i++) {
        specs[i].payload = "{\"mixed\": true}";
        specs[i].opts.queue = "bench";
    }
    pid_t pid = start_worker_child(url, a, sh);
    double t0 = now_s(), next_sample = t0 + 1;
    long long done_at_warm = 0;
    double warm = t0 + (a->seconds > 20 ? 10 : a->seconds / 4.0);
    int warmed = 0;
    for (long long tick = 0;; tick++) {
        double due = t0 + (double)tick * 0.01, now = now_s();
        if (now - t0 >= a->seconds)
            break;
        if (due > now)
            pause_ms((long)((due - now) * 1000));
        int rc = pgjobq_enqueue_batch(c, specs, (size_t)per_tick, NULL, NULL);
        if (rc != PGJOBQ_OK) {
            kill(pid, SIGTERM);
            waitpid(pid, NULL, 0);
            return cli_fail(c, rc);
        }
        enqueued += per_tick;
        if (!warmed && now_s() >= warm) {
            warmed = 1;
            done_at_warm = atomic_load(&sh->completed[0]);
            warm = now_s();
        }
        if (now_s() >= next_sample) {
            long long depth = enqueued - atomic_load(&sh->completed[0]);
            depth_max = depth > depth_max ? depth : depth_max;
            depth_sum += depth;
            depth_n++;
            next_sample += 1;
        }
    }
    double t_end = now_s();
    long long done_at_end = atomic_load(&sh->completed[0]);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    latency_stats(ctl, since, lat);
    double steady = (double)(done_at_end - done_at_warm) / (t_end - warm);
    if (a->json)
        printf("{\"scenario\":\"mixed\",\"seconds\":%d,\"rate\":%d,\"concurrency\":%d,\"enqueued\":%lld,"
               "\"jobs_per_s\":%.1f,\"depth_avg\":%.1f,\"depth_max\":%lld,\"p50_ms\":%.2f,\"p99_ms\":%.2f}\n",
               a->seconds, a->rate, a->concurrency, enqueued, steady, depth_n ? (double)depth_sum / (double)depth_n : 0.0,
               depth_max, lat[0], lat[2]);
    else
        printf("mixed: %d s at %d/s enqueued: %.0f jobs/s completed (steady state), queue depth avg %.0f max %lld, "
               "pickup p50 %.2f ms p99 %.2f ms\n",
               a->seconds, a->rate, steady, depth_n ? (double)depth_sum / (double)depth_n : 0.0, depth_max, lat[0],
               lat[2]);
    free(specs);
    munmap(sh, sizeof *sh);
    return EX_OK;
}

int cmd_bench(const cli_cmd *cmd, int argc, char **argv)
{
    bench_args a = {cmd, 100000, 0, 32, 1, 1000, 1, 0, 60, 0, 0, 0};
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
        return cli_usage_error(cmd, "expected one scenario: enqueue, drain, drain-exec, ceiling, latency, mixed");
    const char *scenario = argv[first];
    if (strcmp(scenario, "mixed") == 0 && a.rate == 0)
        a.rate = 10000;
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
    if ((ctl = control(url)) == NULL) {
        pgjobq_client_close(c);
        return EX_UNAVAILABLE;
    }
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(scenario, "enqueue") == 0)
        status = bench_enqueue(&a, ctl, c);
    else if (strcmp(scenario, "drain") == 0)
        status = bench_drain(url, &a, 0, ctl, c);
    else if (strcmp(scenario, "drain-exec") == 0)
        status = bench_drain(url, &a, 1, ctl, c);
    else if (strcmp(scenario, "ceiling") == 0)
        status = bench_ceiling(url, &a, ctl, c);
    else if (strcmp(scenario, "latency") == 0)
        status = bench_latency(url, &a, ctl, c);
    else if (strcmp(scenario, "mixed") == 0)
        status = bench_mixed(url, &a, ctl, c);
    else
        status = cli_usage_error(cmd, "unknown scenario '%s'", scenario);
    PQfinish(ctl);
    pgjobq_client_close(c);
    return status;
}
