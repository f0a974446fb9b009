/*
 * work_engine.c - the engines of `pgjobq work`: a pgjobq_worker with the command's handler (--exec or
 * --coproc).  Without --cluster the command runs one on its own thread, exactly as before; with
 * --cluster, work_cluster_run runs one per shard of the map, each on a thread of its own and on its
 * own shard's connections (at most three: the worker's), so that each shard's engine claims, renews,
 * rescues, ticks schedules, prunes and adapts autovacuum on its shard alone, and a shard that is down
 * is retried (pgjobq_worker_run reconnects with backoff) while the others work.  A signal drains every
 * engine.  The map is read again every --map-reload: a shard that joined gets an engine, the engine
 * of one that left drains and stops.  With --coproc each engine runs its own coprocesses (K of them,
 * --coprocs), each told only its own shard's jobs.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>

#include "cli.h"
#include "coproc.h"
#include "work.h"

/* A map names at most 1024 shards (a job id's shard number is id % 1024). */
#define ENGINES_MAX 1024

/* What the signal handler drains, and the pipe that wakes work_cluster_run. */
static work_engine *volatile sig_engines[ENGINES_MAX];
static volatile sig_atomic_t sig_stopping;
static int wake_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    (void)sig;
    sig_stopping = 1;
    for (size_t i = 0; i < ENGINES_MAX; i++) {
        work_engine *e = sig_engines[i];
        if (e) {
            coproc_drain(e->pool);
            pgjobq_worker_stop(e->w);
        }
    }
    if (wake_pipe[1] >= 0 && write(wake_pipe[1], "s", 1) < 0) {
        /* full: the loop is awake already */
    }
    errno = saved;
}

void work_signals_set(size_t i, work_engine *e)
{
    if (i < ENGINES_MAX)
        sig_engines[i] = e;
}

int work_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 ||
        signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
        cli_err("cannot install the signal handlers: %s", strerror(errno));
        return EX_OSERR;
    }
    return EX_OK;
}

/* A coprocess cannot start (problem: why), or has started again (NULL): the engine claims nothing
 * meanwhile, and says why in its shard's pgjobq.workers. */
static void coproc_health(void *arg, const char *problem)
{
    if (pgjobq_worker_set_unhealthy(arg, problem) != PGJOBQ_OK)
        cli_err("out of memory: the worker could not be marked %s", problem ? "unhealthy" : "healthy again");
}

/* An engine's log: the command's, each line naming the engine's shard. */
static void engine_log(void *arg, pgjobq_log_level level, const char *msg)
{
    work_engine *e = arg;
    char line[2048];

    if (e->shard == NULL) {
        work_log((void *)&e->cfg->log, level, msg);
        return;
    }
    snprintf(line, sizeof line, "shard %s: %s", e->shard, msg);
    work_log((void *)&e->cfg->log, level, line);
}

int work_engine_new(work_engine *e, const work_engine_cfg *cfg, const char *shard, const char *conninfo,
                    const char *worker_id)
{
    pgjobq_worker_opts o = cfg->opts;
    int rc;

    e->cfg = cfg;
    if ((shard && (e->shard = strdup(shard)) == NULL) || (e->conninfo = strdup(conninfo)) == NULL) {
        cli_err("out of memory");
        return EX_OSERR;
    }
    o.log_fn = engine_log;
    o.log_arg = e;
    o.log_level = cfg->log.level;
    if (worker_id)
        o.worker_id = worker_id;
    rc = pgjobq_worker_new(&e->w, conninfo, &o);
    if (rc != PGJOBQ_OK) {
        if (shard)
            cli_err("shard %s: %s", shard, pgjobq_worker_errmsg(e->w));
        else
            cli_err("%s", pgjobq_worker_errmsg(e->w));
        return rc == PGJOBQ_EINVAL ? EX_USAGE : EX_OSERR;
    }
    if (cfg->coproc) {
        /* Each copy takes its share of all the slots. */
        int k = cfg->coprocs ? cfg->coprocs : 1, slots = 0;
        for (int i = 0; i < cfg->nqueues; i++)
            slots += cfg->queues[i].concurrency;
        e->pool =
            coproc_start(cfg->exec.argv, cfg->exec.env, k, (slots + k - 1) / k, engine_log, e, coproc_health, e->w);
        if (e->pool == NULL) {
            cli_err("cannot start the coprocesses' supervisor: out of memory");
            return EX_OSERR;
        }
    }
    for (int i = 0; i < cfg->nqueues; i++) {
        rc = pgjobq_worker_handle(e->w, cfg->queues[i].name, NULL, cfg->queues[i].concurrency,
                                  e->pool ? coproc_handler : exec_handler,
                                  e->pool ? (void *)e->pool : (void *)&cfg->exec);
        if (rc != PGJOBQ_OK) {
            cli_err("%s", pgjobq_worker_errmsg(e->w));
            return EX_USAGE;
        }
    }
    if (cfg->forwarder && pgjobq_worker_handle(e->w, PGJOBQ_OUTBOX_QUEUE, NULL, WORK_FORWARD_SLOTS,
                                               pgjobq_forward_handler, cfg->forwarder) != PGJOBQ_OK) {
        cli_err("%s", pgjobq_worker_errmsg(e->w));
        return EX_USAGE;
    }
    return EX_OK;
}

void work_engine_free(work_engine *e)
{
    if (e->threaded)
        pthread_join(e->thread, NULL);
    coproc_stop(e->pool, 5000);
    pgjobq_worker_free(e->w);
    free(e->shard);
    free(e->conninfo);
    memset(e, 0, sizeof *e);
}

int work_engine_status(const work_engine *e)
{
    const char *shard = e->shard ? e->shard : "";
    const char *sep = e->shard ? ": " : "";

    if (e->rc == PGJOBQ_OK || e->rc == PGJOBQ_ESTOPPED)
        return EX_OK; /* ESTOPPED: stopped by a signal before it started: nothing to do, nothing lost */
    cli_err("%s%s%s%s", e->shard ? "shard " : "", shard, sep, pgjobq_worker_errmsg(e->w));
    return e->rc == PGJOBQ_ETIMEOUT ? EX_TEMPFAIL : cli_exit_status(e->rc);
}

/* ------------------------------------------------------------------------------------------------ */
/* --cluster                                                                                          */

typedef struct cluster_run {
    const work_engine_cfg *cfg;
    const char *spec;
    char worker_id[300];
    work_engine *engines[ENGINES_MAX]; /* slot i: engine or NULL; set and cleared under mu */
    pthread_mutex_t mu;                /* against --metrics-listen's reads of engines */
} cluster_run;

/* Empties slot i (under r->mu, so that --metrics-listen no longer reads it) and frees its engine. */
static void engine_drop(cluster_run *r, size_t i)
{
    work_engine *e = r->engines[i];
    pthread_mutex_lock(&r->mu);
    r->engines[i] = NULL;
    pthread_mutex_unlock(&r->mu);
    work_engine_free(e);
    free(e);
}

static void *engine_thread(void *arg)
{
    work_engine *e = arg;
    e->rc = pgjobq_worker_run(e->w);
    atomic_store(&e->done, 1);
    if (write(wake_pipe[1], "d", 1) < 0) {
        /* full: the loop is awake already */
    }
    return NULL;
}

/* Starts an engine for a shard in a free slot.  Returns EX_OK or the exit status. */
static int engine_start(cluster_run *r, const char *name, const char *conninfo)
{
    size_t slot = 0;
    while (slot < ENGINES_MAX && r->engines[slot])
        slot++;
    if (slot == ENGINES_MAX) {
        cli_err("shard %s: more than %d shards", name, ENGINES_MAX);
        return EX_SOFTWARE;
    }
    work_engine *e = calloc(1, sizeof *e);
    if (e == NULL) {
        cli_err("out of memory");
        return EX_OSERR;
    }
    int status = work_engine_new(e, r->cfg, name, conninfo, r->worker_id);
    if (status == EX_OK) {
        int err = pthread_create(&e->thread, NULL, engine_thread, e);
        if (err != 0) {
            cli_err("shard %s: cannot start its engine's thread: %s", name, strerror(err));
            status = EX_OSERR;
        } else {
            e->threaded = 1;
        }
    }
    if (status != EX_OK) {
        work_engine_free(e);
        free(e);
        return status;
    }
    pthread_mutex_lock(&r->mu);
    r->engines[slot] = e;
    pthread_mutex_unlock(&r->mu);
    work_signals_set(slot, e);
    if (sig_stopping) /* a signal came while it started */
        pgjobq_worker_stop(e->w);
    char msg[600];
    snprintf(msg, sizeof msg, "serving shard %s", name);
    work_log((void *)&r->cfg->log, PGJOBQ_LOG_INFO, msg);
    return EX_OK;
}

/* Reads the map (spec) and makes the engines match it: an engine for each shard it names (by name and
 * conninfo), the engines of shards it no longer names stopped (they drain; reaped when done).
 * Returns EX_OK, or the exit status of a map that cannot be read (first: nothing was started). */
static int engines_sync(cluster_run *r, int first, int *rc_out)
{
    pgjobq_cluster *cl = NULL;
    int rc = pgjobq_cluster_open(&cl, r->spec);
    int status = EX_OK;

    *rc_out = rc;
    if (rc != PGJOBQ_OK) {
        const char *why = cl && pgjobq_cluster_errmsg(cl)[0] ? pgjobq_cluster_errmsg(cl) : pgjobq_strerror(rc);
        if (first && rc == PGJOBQ_ECONN) {
            char msg[1200];
            snprintf(msg, sizeof msg, "cannot read the cluster map yet (trying again): %s", why);
            work_log((void *)&r->cfg->log, PGJOBQ_LOG_WARN, msg);
            status = EX_UNAVAILABLE;
        } else if (first) {
            cli_err("the cluster (%s): %s", cli_cluster_arg ? "--cluster" : "$PGJOBQ_CLUSTER", why);
            status = rc == PGJOBQ_EINVAL ? EX_CONFIG : cli_exit_status(rc);
        } else {
            char msg[1200];
            snprintf(msg, sizeof msg, "reading the cluster map again failed (the engines go on as they are): %s", why);
            work_log((void *)&r->cfg->log, PGJOBQ_LOG_WARN, msg);
        }
        pgjobq_cluster_close(cl);
        return status;
    }
    size_t n = pgjobq_cluster_shards(cl);
    /* Engines whose shard left the map (or whose conninfo changed) drain and stop. */
    for (size_t i = 0; i < ENGINES_MAX; i++) {
        work_engine *e = r->engines[i];
        int kept = 0;
        if (e == NULL || e->leaving)
            continue;
        for (size_t j = 0; j < n && !kept; j++)
            kept = strcmp(e->shard, pgjobq_cluster_shard_name(cl, j)) == 0 &&
                   strcmp(e->conninfo, pgjobq_cluster_shard_conninfo(cl, j)) == 0;
        if (!kept) {
            char msg[600];
            snprintf(msg, sizeof msg, "shard %s left the cluster map: its engine drains and stops", e->shard);
            work_log((void *)&r->cfg->log, PGJOBQ_LOG_INFO, msg);
            e->leaving = 1;
            pgjobq_worker_stop(e->w);
        }
    }
    /* At start, the first engine that cannot be made stops the command; later, one that cannot (a
     * new shard's conninfo libpq cannot parse) is said and tried again at the next reading. */
    for (size_t j = 0; j < n && (status == EX_OK || !first); j++) {
        const char *name = pgjobq_cluster_shard_name(cl, j), *conninfo = pgjobq_cluster_shard_conninfo(cl, j);
        int have = 0;
        for (size_t i = 0; i < ENGINES_MAX && !have; i++)
            have = r->engines[i] && !r->engines[i]->leaving && strcmp(r->engines[i]->shard, name) == 0 &&
                   strcmp(r->engines[i]->conninfo, conninfo) == 0;
        if (!have)
            status = engine_start(r, name, conninfo);
    }
    pgjobq_cluster_close(cl);
    return status;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int work_cluster_run(const work_engine_cfg *cfg, const char *spec, int64_t reload_ms, const cli_cmd *cmd,
                     const char *metrics_listen)
{
    cluster_run *r = calloc(1, sizeof *r);
    int status = EX_OK, stopping = 0;
    char host[256] = "localhost";
    work_metrics metrics;

    memset(&metrics, 0, sizeof metrics);
    if (r == NULL) {
        cli_err("out of memory");
        return EX_OSERR;
    }
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        cli_err("cannot make a lock");
        free(r);
        return EX_OSERR;
    }
    r->cfg = cfg;
    r->spec = spec;
    if (metrics_listen) {
        /* Every engine's counters, each labelled with its shard. */
        metrics.queues = cfg->queues;
        metrics.nqueues = cfg->nqueues;
        metrics.engines = r->engines;
        metrics.nengines = ENGINES_MAX;
        metrics.mu = &r->mu;
        if ((status = work_metrics_start(&metrics, cmd, metrics_listen, (work_log_cfg *)&cfg->log)) != EX_OK) {
            pthread_mutex_destroy(&r->mu);
            free(r);
            return status;
        }
    }
    /* One id on every shard (each shard's pgjobq.workers is its own): the one given, else hostname:pid. */
    if (cfg->opts.worker_id) {
        snprintf(r->worker_id, sizeof r->worker_id, "%s", cfg->opts.worker_id);
    } else {
        if (gethostname(host, sizeof host) != 0)
            snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = '\0';
        snprintf(r->worker_id, sizeof r->worker_id, "%s:%d", host, (int)getpid());
    }
    if (pipe(wake_pipe) != 0 || fcntl(wake_pipe[0], F_SETFL, O_NONBLOCK) != 0 ||
        fcntl(wake_pipe[1], F_SETFL, O_NONBLOCK) != 0) {
        cli_err("cannot make a pipe: %s", strerror(errno));
        status = EX_OSERR;
        goto out;
    }
    if ((status = work_signals_install()) != EX_OK)
        goto out;
    /* The map's database may be down at start, as a database may be for a worker of one: read it
     * again with backoff (1 s doubling to 30 s) until it answers or a signal comes. */
    for (int64_t backoff = 1000;; backoff = backoff * 2 > 30000 ? 30000 : backoff * 2) {
        int rc;
        status = engines_sync(r, 1, &rc);
        if (status == EX_OK || rc != PGJOBQ_ECONN || sig_stopping)
            break;
        struct pollfd pfd = {wake_pipe[0], POLLIN, 0};
        if (poll(&pfd, 1, (int)backoff) < 0 && errno != EINTR) {
            cli_err("poll: %s", strerror(errno));
            break;
        }
        if (sig_stopping) {
            status = EX_OK; /* stopped before it started: nothing to do, nothing lost */
            break;
        }
    }
    if (status != EX_OK || sig_stopping)
        goto stop;

    int64_t next_reload = now_ms() + reload_ms;
    for (;;) {
        int64_t wait = next_reload - now_ms();
        struct pollfd pfd = {wake_pipe[0], POLLIN, 0};
        if (cfg->opts.burst || stopping)
            wait = -1; /* a burst runs the map it started with */
        int n = poll(&pfd, 1, wait < 0 ? -1 : (int)(wait > 60000 ? 60000 : wait));
        if (n < 0 && errno != EINTR) {
            cli_err("poll: %s", strerror(errno));
            status = EX_OSERR;
            break;
        }
        char buf[64];
        while (read(wake_pipe[0], buf, sizeof buf) > 0) {
        }
        if (sig_stopping)
            stopping = 1;
        /* Reap the engines that ended. */
        size_t live = 0;
        for (size_t i = 0; i < ENGINES_MAX; i++) {
            work_engine *e = r->engines[i];
            if (e == NULL)
                continue;
            if (!atomic_load(&e->done)) {
                live++;
                continue;
            }
            work_signals_set(i, NULL);
            pthread_join(e->thread, NULL);
            e->threaded = 0;
            int st = work_engine_status(e);
            /* An engine that cannot run at all (not a shard that is down: that one retries) stops the
             * whole worker, as it would stop a worker of one database. */
            if (st != EX_OK && status == EX_OK)
                status = st;
            if (st != EX_OK && st != EX_TEMPFAIL && !stopping) {
                stopping = 1;
                for (size_t k = 0; k < ENGINES_MAX; k++)
                    if (r->engines[k])
                        pgjobq_worker_stop(r->engines[k]->w);
            }
            engine_drop(r, i);
        }
        if (live == 0)
            break;
        if (!stopping && !cfg->opts.burst && now_ms() >= next_reload) {
            int rc;
            (void)engines_sync(r, 0, &rc); /* what failed is in the log; the engines go on */
            next_reload = now_ms() + reload_ms;
        }
    }
stop:
    for (size_t i = 0; i < ENGINES_MAX; i++) {
        work_engine *e = r->engines[i];
        if (e == NULL)
            continue;
        pgjobq_worker_stop(e->w);
        work_signals_set(i, NULL);
        engine_drop(r, i);
    }
out:
    work_metrics_stop(&metrics);
    pthread_mutex_destroy(&r->mu);
    for (int i = 0; i < 2; i++) {
        if (wake_pipe[i] >= 0)
            close(wake_pipe[i]);
        wake_pipe[i] = -1;
    }
    free(r);
    return status;
}
