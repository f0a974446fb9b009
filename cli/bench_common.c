/*
 * bench_common.c - the parts of `pgjobq bench` that every scenario uses (see bench.h).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

double bench_now(void)
{
    return cli_mono_s();
}

void bench_pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

PGconn *bench_connect(const char *url, const char *application)
{
    const char *const keys[] = {"dbname", "application_name", NULL};
    const char *const vals[] = {url, application, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(c) != CONNECTION_OK) {
        cli_err("bench: %s", PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    return c;
}

/* A control connection for setup and measurements (not counted as the worker's). */
PGconn *bench_control(const char *url)
{
    return bench_connect(url, "pgjobq-bench");
}

int bench_sql(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok)
        cli_err("bench: %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

double bench_number(PGconn *c, const char *sql)
{
    return bench_number1(c, sql, NULL);
}

double bench_number1(PGconn *c, const char *sql, const char *value)
{
    const char *values[1] = {value};
    PGresult *r = value ? PQexecParams(c, sql, 1, NULL, values, NULL, NULL, 0) : PQexec(c, sql);
    double v = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
        v = atof(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

/* Loads n no-op jobs into queue (untimed), due at run_at (NULL: now). */
int bench_preload(pgjobq_client *c, const char *queue, long long n, const char *run_at)
{
    return bench_preload_keyed(c, queue, n, run_at, 0);
}

int bench_preload_keyed(pgjobq_client *c, const char *queue, long long n, const char *run_at, int keys)
{
    enum { BATCH = 10000 };
    pgjobq_job_spec *specs = calloc(BATCH, sizeof *specs);
    char(*names)[16] = keys > 0 ? calloc((size_t)keys, sizeof *names) : NULL;
    int rc = PGJOBQ_OK;

    if (specs == NULL || (keys > 0 && names == NULL)) {
        free(specs);
        free(names);
        return PGJOBQ_ENOMEM;
    }
    for (int k = 0; k < keys; k++)
        snprintf(names[k], sizeof names[k], "k%d", k);
    for (long long done = 0; done < n && rc == PGJOBQ_OK;) {
        size_t k = (size_t)(n - done < BATCH ? n - done : BATCH);
        for (size_t i = 0; i < k; i++) {
            specs[i].payload = "{\"noop\": true}";
            specs[i].opts.queue = queue;
            specs[i].opts.run_at = run_at;
            specs[i].opts.concurrency_key = keys > 0 ? names[(done + (long long)i) % keys] : NULL;
        }
        rc = pgjobq_enqueue_many(c, specs, k, NULL, NULL);
        done += (long long)k;
    }
    free(names);
    free(specs);
    return rc;
}

/* Adds n completed jobs of queue to the history (untimed): what a busy production table holds. */
int bench_insert_finished(PGconn *ctl, const char *queue, long long n)
{
    char count[24];
    const char *values[2] = {queue, count};

    snprintf(count, sizeof count, "%lld", n);
    PGresult *r = PQexecParams(ctl, "SELECT pgjobq.load_history($1, $2::bigint)", 2, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok)
        cli_err("bench: loading the history: %s", PQerrorMessage(ctl));
    PQclear(r);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------------ */
/* Worker children                                                                                   */


static pgjobq_outcome noop(pgjobq_ctx *ctx, void *arg)
{
    (void)ctx;
    (void)arg;
    return PGJOBQ_OUTCOME_COMPLETE;
}

typedef struct child_watch {
    pgjobq_worker *w;
    bench_shared *sh;
    int slot;
    _Atomic int done;
} child_watch;

static void publish(pgjobq_worker *w, bench_shared *sh, int slot)
{
    pgjobq_worker_stats s;
    pgjobq_worker_get_stats(w, &s);
    atomic_store(&sh->completed[slot], s.completed);
    atomic_store(&sh->claims[slot], s.claims);
    atomic_store(&sh->claimed[slot], s.claimed);
    atomic_store(&sh->writes[slot], s.writes);
}

static void *child_watcher(void *arg)
{
    child_watch *cw = arg;
    while (!atomic_load(&cw->done)) {
        publish(cw->w, cw->sh, cw->slot);
        /* Often enough to time a drain to 20 ms, seldom enough not to load the machine it measures
         * (every 2 ms, 40 processes woke 20,000 times a second). */
        bench_pause_ms(20);
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
static void worker_child(const char *url, const bench_args *a, bench_shared *sh, int slot)
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
    o.no_maintenance = slot != 0; /* one process maintains, as a fleet would */
    if (pgjobq_worker_new(&child_worker, url, &o) != PGJOBQ_OK ||
        pgjobq_worker_handle(child_worker, "bench", NULL, a->concurrency, a->fn ? a->fn : noop, a->fn_arg) != PGJOBQ_OK) {
        fprintf(stderr, "bench worker: %s\n", pgjobq_worker_errmsg(child_worker));
        _exit(1);
    }
    signal(SIGTERM, child_stop);
    cw.w = child_worker;
    cw.sh = sh;
    cw.slot = slot;
    atomic_store(&cw.done, 0);
    if (pthread_create(&th, NULL, child_watcher, &cw) != 0)
        _exit(1);
    int rc = pgjobq_worker_run(child_worker);
    atomic_store(&cw.done, 1);
    pthread_join(th, NULL);
    publish(child_worker, sh, slot);
    getrusage(RUSAGE_SELF, &ru);
    atomic_store(&sh->rss_kb[slot], ru.ru_maxrss);
    pgjobq_worker_free(child_worker);
    _exit(rc == PGJOBQ_OK ? 0 : 1);
}

long long bench_total(_Atomic long long *v, int n)
{
    long long t = 0;
    for (int i = 0; i < n; i++)
        t += atomic_load(&v[i]);
    return t;
}

/* Starts the worker processes: in-process workers (forked children), or `pgjobq work --exec` (exec_mode
 * 1) or `--coproc` (exec_mode 2) with the handler command. */
int bench_start_workers(const char *url, const bench_args *a, bench_shared *sh, int exec_mode, pid_t *pids)
{
    char exe[4096];
    ssize_t len = exec_mode ? readlink("/proc/self/exe", exe, sizeof exe - 1) : 0;

    if (len < 0) {
        cli_err("bench: cannot find my own executable");
        return -1;
    }
    exe[len] = '\0';
    for (int i = 0; i < a->processes; i++) {
        pids[i] = fork();
        if (pids[i] < 0) {
            cli_err("bench: fork: %s", strerror(errno));
            return -1;
        }
        if (pids[i] > 0)
            continue;
        if (!exec_mode)
            worker_child(url, a, sh, i);
        char q[32], b[16];
        snprintf(q, sizeof q, "bench:%d", a->concurrency);
        snprintf(b, sizeof b, "%d", a->batch ? a->batch : 1000);
        setenv("PGJOBQ_DATABASE_URL", url, 1);
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() == 1)
            _exit(1);
        execl(exe, exe, "work", "--queue", q, exec_mode == 2 ? "--coproc" : "--exec",
              a->handler ? a->handler : "/bin/true", "--batch", b, "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    return 0;
}

void bench_stop_workers(const bench_args *a, pid_t *pids)
{
    for (int i = 0; i < a->processes; i++)
        if (pids[i] > 0)
            kill(pids[i], SIGTERM);
    for (int i = 0; i < a->processes; i++)
        if (pids[i] > 0) {
            waitpid(pids[i], NULL, 0);
            pids[i] = 0;
        }
}

/* Counts the worker processes' connections: pgjobq's, but neither the control connection nor the
 * benchmark's own client (which loaded the jobs). */
int bench_worker_connections(PGconn *ctl, pgjobq_client *mine)
{
    char pid[16];
    snprintf(pid, sizeof pid, "%d", PQbackendPID(pgjobq_client_conn(mine)));
    return (int)bench_number1(ctl,
                              "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                              " AND backend_type = 'client backend' AND application_name LIKE 'pgjobq%'"
                              " AND application_name <> 'pgjobq-bench' AND pid <> pg_backend_pid() AND pid <> $1::int",
                              pid);
}

/* Claim connections past their set-up: workers that are ready. */
int bench_ready_workers(PGconn *ctl)
{
    return (int)bench_number(ctl, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND application_name = 'pgjobq-claim' AND query <> ''"
                                " AND query NOT LIKE '%schema_version%'");
}

/* Starts the worker processes and waits until each is connected and listening. */
int bench_start_ready_workers(const char *url, const bench_args *a, bench_shared *sh, pid_t *pids, PGconn *ctl)
{
    if (bench_start_workers(url, a, sh, 0, pids) != 0)
        return -1;
    for (double give_up = bench_now() + 30; bench_ready_workers(ctl) < a->processes;) {
        if (bench_now() > give_up) {
            cli_err("bench: the workers did not connect within 30 s");
            return -1;
        }
        bench_pause_ms(10);
    }
    return 0;
}

