/*
 * serve_metrics.c - the numbers behind `pgjobq serve`'s /metrics: one collector thread reads the
 * database every few seconds, in one read-only REPEATABLE READ transaction under a statement
 * timeout, and renders the Prometheus text that every scrape then gets as is.  So scrapes cost the
 * database nothing, and however many Prometheus servers scrape, the queries run once per interval.
 *
 * Everything is read through the monitor functions of sql/functions/monitor.sql.  Gauges come from
 * the live jobs (monitor_queue_counts), the queues' settings and the workers, and what an autoscaler
 * reads (queue_ready: jobs ready now, the oldest one's age, the limit and the workers' slots).  Counters and histograms
 * count what happened since this process started: jobs that reached the history (monitor_finished)
 * and retries and lost leases (monitor_tallies), each over (last watermark, now() - 2 s] (at most a
 * minute of it per collection); the settle time lets the transactions that wrote those rows commit
 * before the window closes.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"
#include "serve_log.h"

/* Histogram bounds (seconds) of the wait and duration histograms. */
static const double bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600};
#define NB ((int)(sizeof bounds / sizeof bounds[0]))
/* The same bounds negated, ascending, as width_bucket wants them (pgjobq.monitor_finished). */
#define NEG_BOUNDS "{-3600,-900,-300,-60,-30,-10,-5,-2.5,-1,-0.5,-0.25,-0.1,-0.05,-0.025,-0.01,-0.005}"

#define SETTLE "interval '2 seconds'"
#define FINISHED_EVERY 12 /* collections between counts of the history per state (a scan): a minute at 5 s */
/* The count of the history is a scan of every row it holds (a second per million or so): it runs under
 * a timeout of its own, longer than the collection's 2 s, and once it is slow, at most 1/HELD_SHARE of
 * the time, so that a big history neither loses its gauges nor keeps a core busy. */
#define HELD_TIMEOUT "60s"
#define HELD_TIMEOUT_MS 60000
#define HELD_SHARE 20

enum { F_COMPLETED, F_FAILED, F_CANCELLED, NFIN };
static const char *const fin_names[NFIN] = {"completed", "failed", "cancelled"};

typedef struct hist {
    int64_t b[NB + 1]; /* non-cumulative; b[NB] is above every bound */
    double sum;
    int64_t n;
} hist;

typedef struct qm {
    char name[80];
    int live;                       /* seen in this collection's live counts or settings */
    int64_t queued, scheduled, running, waiting;
    int64_t sleeping, awaiting_event; /* queued jobs parked: a durable sleep, a wait for an event */
    double lag;
    int paused;
    int64_t ready, slots;           /* queue_ready(): claimable now; the live workers' slots */
    double oldest_ready;            /* seconds; 0 when none is ready */
    int concurrency;                /* the queue's limit; 0: none */
    int64_t held[NFIN];             /* rows in history, refreshed every FINISHED_EVERY collections */
    int held_known;
    int64_t fin[NFIN];              /* counters */
    int64_t retried, lost;
    hist wait, dur;
} qm;

typedef struct wm {
    char *id, *host;
    int alive;
    int64_t jobs;
} wm;

/* What is collected from one database: the one of --db, or one shard of --cluster. */
typedef struct dbm {
    const char *conninfo;
    const char *shard; /* the shard's name (label shard="..."); NULL without --cluster */
    int64_t interval_ms;
    pgjobq_client *c;
    char watermark[64];
    int64_t held_due_ms; /* when the next count of the history is due (cli_mono_ms; 0: at once) */
    int held_failed;     /* the last count of the history failed (said once) */
    qm *q;
    size_t nq, capq;
    wm *w;
    size_t nw;
    /* pgjobq.health(): the live table's size and what holds vacuum back. */
    int64_t jobs_bytes, jobs_dead, vacuums;
    double horizon_age_s; /* 0: nothing holds */
    int autovacuum_paused; /* pgjobq paused autovacuum of pgjobq.jobs under the holder */
    char holder_kind[16], holder_app[64];
    int holder_pid;
    int up;
    double collect_s;
    int64_t errors;
    int64_t collections;
} dbm;

struct serve_metrics {
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int64_t interval_ms;
    char *text; /* the rendered exposition, under mu */
    dbm *db;    /* collector-only state, one per database (one without --cluster) */
    size_t ndb;
    int cluster; /* --cluster: every series has a shard label, and pgjobq_shard_up is given */
};

static qm *queue_of(dbm *m, const char *name)
{
    for (size_t i = 0; i < m->nq; i++)
        if (strcmp(m->q[i].name, name) == 0)
            return &m->q[i];
    if (m->nq == m->capq) {
        size_t cap = m->capq ? m->capq * 2 : 16;
        qm *p = realloc(m->q, cap * sizeof *p);
        if (p == NULL)
            return NULL;
        m->q = p;
        m->capq = cap;
    }
    qm *q = &m->q[m->nq++];
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name);
    return q;
}

static void workers_free(dbm *m)
{
    for (size_t i = 0; i < m->nw; i++) {
        free(m->w[i].id);
        free(m->w[i].host);
    }
    free(m->w);
    m->w = NULL;
    m->nw = 0;
}

/* Runs one statement of the collection; NULL after logging why. */
static PGresult *run(dbm *m, const char *sql, int n, const char *const *values)
{
    PGresult *r = PQexecParams(pgjobq_client_conn(m->c), sql, n, NULL, values, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        serve_log("metrics%s%s: %s", m->shard ? " of shard " : "", m->shard ? m->shard : "", PQresultErrorMessage(r));
        PQclear(r);
        return NULL;
    }
    return r;
}

/* The history and tallies of (watermark, upto]: added to the counters only when the whole
 * collection commits, so a window is never counted twice or lost. */
typedef struct delta {
    PGresult *hist, *tallies;
} delta;

static void apply_delta(dbm *m, const delta *d)
{
    for (int i = 0; i < PQntuples(d->hist); i++) {
        qm *q = queue_of(m, PQgetvalue(d->hist, i, 0));
        if (q == NULL)
            continue;
        const char *state = PQgetvalue(d->hist, i, 1);
        int64_t n = atoll(PQgetvalue(d->hist, i, 4));
        for (int f = 0; f < NFIN; f++)
            if (strcmp(state, fin_names[f]) == 0)
                q->fin[f] += n;
        /* Bucket columns: how many bounds hold the value (width_bucket of the negated value over the
         * negated bounds), or NULL for jobs that never started. */
        int64_t started = atoll(PQgetvalue(d->hist, i, 5));
        if (started > 0 && !PQgetisnull(d->hist, i, 2)) {
            int holding = atoi(PQgetvalue(d->hist, i, 2));
            q->wait.b[NB - holding] += started;
            q->wait.sum += atof(PQgetvalue(d->hist, i, 6));
            q->wait.n += started;
        }
        if (started > 0 && !PQgetisnull(d->hist, i, 3)) {
            int holding = atoi(PQgetvalue(d->hist, i, 3));
            q->dur.b[NB - holding] += started;
            q->dur.sum += atof(PQgetvalue(d->hist, i, 7));
            q->dur.n += started;
        }
    }
    for (int i = 0; i < PQntuples(d->tallies); i++) {
        qm *q = queue_of(m, PQgetvalue(d->tallies, i, 0));
        if (q == NULL)
            continue;
        int64_t n = atoll(PQgetvalue(d->tallies, i, 2));
        if (strcmp(PQgetvalue(d->tallies, i, 1), "retried") == 0)
            q->retried += n;
        else
            q->lost += n;
    }
}

static int collect(dbm *m)
{
    PGresult *r, *live = NULL, *paused = NULL, *parked = NULL, *ready = NULL, *held = NULL, *workers = NULL,
             *upto = NULL, *health = NULL;
    delta d = {NULL, NULL};
    int ok = 0, want_held = cli_mono_ms() >= m->held_due_ms;
    int64_t held_ms = 0;

    if (m->c == NULL || PQstatus(pgjobq_client_conn(m->c)) != CONNECTION_OK) {
        pgjobq_client_close(m->c);
        m->c = NULL;
        int rc = pgjobq_client_open(&m->c, m->conninfo);
        if (rc != PGJOBQ_OK) {
            serve_log("metrics%s%s: cannot connect: %s", m->shard ? " of shard " : "", m->shard ? m->shard : "",
                      m->c ? pgjobq_errmsg(m->c) : pgjobq_strerror(rc));
            pgjobq_client_close(m->c);
            m->c = NULL;
            return -1;
        }
        r = PQexec(pgjobq_client_conn(m->c), "SET statement_timeout = '2s'; SET application_name = 'pgjobq serve (metrics)'");
        PQclear(r);
    }
    if ((r = run(m, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL)) == NULL)
        return -1;
    PQclear(r);
    /* At most a minute of history per collection: after an outage the counters catch up over a few
     * collections instead of one query too big for the statement timeout. */
    const char *from[1] = {m->watermark[0] ? m->watermark : NULL};
    if ((upto = run(m, "SELECT least(now() - " SETTLE ", coalesce($1::timestamptz + interval '1 minute', now()))::text",
                    1, from)) == NULL)
        goto out;
    const char *win[2] = {m->watermark[0] ? m->watermark : PQgetvalue(upto, 0, 0), PQgetvalue(upto, 0, 0)};
    live = run(m, "SELECT queue, due, scheduled, running, coalesce(lag_s, 0), waiting FROM pgjobq.monitor_queue_counts()",
               0, NULL);
    paused = run(m, "SELECT queue, paused::int FROM pgjobq.monitor_queue_names()", 0, NULL);
    parked = run(m, "SELECT queue, sleeping, waiting FROM pgjobq.monitor_parked()", 0, NULL);
    ready = run(m,
                "SELECT queue, ready, coalesce(oldest_ready_s, 0), coalesce(concurrency, 0), worker_slots"
                " FROM pgjobq.queue_ready()",
                0, NULL);
    const char *hist_args[3] = {win[0], win[1], NEG_BOUNDS};
    d.hist = run(m,
                 "SELECT queue, state, wait_bucket, run_bucket, jobs, started, wait_s, run_s"
                 " FROM pgjobq.monitor_finished($1::timestamptz, $2::timestamptz, $3::float8[])",
                 3, hist_args);
    d.tallies = run(m, "SELECT queue, what, n FROM pgjobq.monitor_tallies($1::timestamptz, $2::timestamptz)", 2, win);
    workers =
        run(m, "SELECT id, host, alive::int, jobs FROM pgjobq.monitor_workers() WHERE state <> 'stopped'", 0, NULL);
    health = run(m,
                 "SELECT jobs_bytes, jobs_dead, vacuums, coalesce(horizon_age_s, 0), holder_kind,"
                 " coalesce(holder_pid, 0), holder_application, (autovacuum_paused_since IS NOT NULL)::int"
                 " FROM pgjobq.health()",
                 0, NULL);
    if (!live || !paused || !parked || !ready || !d.hist || !d.tallies || !workers || !health ||
        PQntuples(health) != 1)
        goto out;
    if (want_held) {
        /* Last: its failure (a timeout) leaves the rest of the collection as read. */
        int64_t t0 = cli_mono_ms();
        PGresult *set = run(m, "SET LOCAL statement_timeout = '" HELD_TIMEOUT "'", 0, NULL);
        int set_ok = set != NULL;
        PQclear(set);
        if (set_ok && (held = run(m, "SELECT queue, state, jobs FROM pgjobq.monitor_history_counts()", 0, NULL)) == NULL) {
            if (!m->held_failed)
                serve_log("metrics%s%s: counting the history failed (above); its gauges keep their last values, and"
                          " the count is tried again in %d minutes",
                          m->shard ? " of shard " : "", m->shard ? m->shard : "", HELD_SHARE * HELD_TIMEOUT_MS / 60000);
            m->held_failed = 1;
        } else if (held != NULL) {
            m->held_failed = 0;
        }
        held_ms = held ? cli_mono_ms() - t0 : HELD_TIMEOUT_MS;
    }
    /* (After a failed count of the history the transaction is aborted, and COMMIT rolls it back: all
     * that was read before it stands, the transaction wrote nothing.) */
    if ((r = run(m, "COMMIT", 0, NULL)) == NULL)
        goto out;
    PQclear(r);
    ok = 1;
    if (want_held) {
        int64_t every = FINISHED_EVERY * m->interval_ms, share = HELD_SHARE * held_ms;
        m->held_due_ms = cli_mono_ms() + (share > every ? share : every);
    }

    /* Everything read: apply it. */
    for (size_t i = 0; i < m->nq; i++) {
        m->q[i].live = 0;
        m->q[i].queued = m->q[i].scheduled = m->q[i].running = m->q[i].waiting = 0;
        m->q[i].sleeping = m->q[i].awaiting_event = 0;
        m->q[i].lag = 0;
        m->q[i].paused = 0;
        m->q[i].ready = m->q[i].slots = 0;
        m->q[i].oldest_ready = 0;
        m->q[i].concurrency = 0;
    }
    for (int i = 0; i < PQntuples(live); i++) {
        qm *q = queue_of(m, PQgetvalue(live, i, 0));
        if (q == NULL)
            continue;
        q->live = 1;
        q->queued = atoll(PQgetvalue(live, i, 1)) + atoll(PQgetvalue(live, i, 2));
        q->scheduled = atoll(PQgetvalue(live, i, 2));
        q->running = atoll(PQgetvalue(live, i, 3));
        q->lag = atof(PQgetvalue(live, i, 4));
        q->waiting = atoll(PQgetvalue(live, i, 5));
    }
    for (int i = 0; i < PQntuples(parked); i++) {
        qm *q = queue_of(m, PQgetvalue(parked, i, 0));
        if (q) {
            q->sleeping = atoll(PQgetvalue(parked, i, 1));
            q->awaiting_event = atoll(PQgetvalue(parked, i, 2));
        }
    }
    for (int i = 0; i < PQntuples(paused); i++) {
        qm *q = queue_of(m, PQgetvalue(paused, i, 0));
        if (q) {
            q->live = 1;
            q->paused = atoi(PQgetvalue(paused, i, 1));
        }
    }
    for (int i = 0; i < PQntuples(ready); i++) {
        qm *q = queue_of(m, PQgetvalue(ready, i, 0));
        if (q) {
            q->live = 1;
            q->ready = atoll(PQgetvalue(ready, i, 1));
            q->oldest_ready = atof(PQgetvalue(ready, i, 2));
            q->concurrency = atoi(PQgetvalue(ready, i, 3));
            q->slots = atoll(PQgetvalue(ready, i, 4));
        }
    }
    m->jobs_bytes = atoll(PQgetvalue(health, 0, 0));
    m->jobs_dead = atoll(PQgetvalue(health, 0, 1));
    m->vacuums = atoll(PQgetvalue(health, 0, 2));
    m->horizon_age_s = atof(PQgetvalue(health, 0, 3));
    snprintf(m->holder_kind, sizeof m->holder_kind, "%s", PQgetvalue(health, 0, 4));
    m->holder_pid = atoi(PQgetvalue(health, 0, 5));
    snprintf(m->holder_app, sizeof m->holder_app, "%s", PQgetvalue(health, 0, 6));
    m->autovacuum_paused = atoi(PQgetvalue(health, 0, 7));
    if (m->watermark[0])
        apply_delta(m, &d);
    snprintf(m->watermark, sizeof m->watermark, "%s", PQgetvalue(upto, 0, 0));
    if (held) {
        for (size_t i = 0; i < m->nq; i++) {
            memset(m->q[i].held, 0, sizeof m->q[i].held);
            m->q[i].held_known = 1;
        }
        for (int i = 0; i < PQntuples(held); i++) {
            qm *q = queue_of(m, PQgetvalue(held, i, 0));
            if (q == NULL)
                continue;
            q->held_known = 1;
            for (int f = 0; f < NFIN; f++)
                if (strcmp(PQgetvalue(held, i, 1), fin_names[f]) == 0)
                    q->held[f] = atoll(PQgetvalue(held, i, 2));
        }
    }
    workers_free(m);
    if (PQntuples(workers) > 0 && (m->w = calloc((size_t)PQntuples(workers), sizeof *m->w)) != NULL) {
        for (int i = 0; i < PQntuples(workers); i++) {
            m->w[m->nw].id = strdup(PQgetvalue(workers, i, 0));
            m->w[m->nw].host = strdup(PQgetvalue(workers, i, 1));
            m->w[m->nw].alive = atoi(PQgetvalue(workers, i, 2));
            m->w[m->nw].jobs = atoll(PQgetvalue(workers, i, 3));
            m->nw++;
            if (!m->w[m->nw - 1].id || !m->w[m->nw - 1].host)
                break;
        }
    }
out:
    if (!ok) {
        r = PQexec(pgjobq_client_conn(m->c), "ROLLBACK");
        PQclear(r);
    }
    PQclear(upto);
    PQclear(live);
    PQclear(paused);
    PQclear(parked);
    PQclear(ready);
    PQclear(held);
    PQclear(workers);
    PQclear(health);
    PQclear(d.hist);
    PQclear(d.tallies);
    return ok ? 0 : -1;
}

static void family(sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Begins a series of d: `name{` with d's shard label first when there is one, then the caller's
 * labels (begin them with lsep(d)) and `} value`. */
static void series(sbuf *b, const dbm *d, const char *name)
{
    sb_printf(b, "%s{", name);
    if (d->shard) {
        sb_puts(b, "shard=\"");
        sb_label(b, d->shard);
        sb_puts(b, "\"");
    }
}

/* What goes before the caller's first label. */
static const char *lsep(const dbm *d)
{
    return d->shard ? "," : "";
}

/* A series without labels of its own: `name value` alone, or `name{shard="..."} value`. */
static void plain(sbuf *b, const dbm *d, const char *name)
{
    if (d->shard) {
        series(b, d, name);
        sb_puts(b, "}");
    } else {
        sb_puts(b, name);
    }
}

/* With --cluster, a shard whose last collection failed shows only pgjobq_shard_up 0. */
static int shown(const serve_metrics *m, const dbm *d)
{
    return !m->cluster || d->up;
}

static void render_hist(sbuf *b, const serve_metrics *m, const char *name, int which)
{
    char bucket[128], sum[128], count[128];
    snprintf(bucket, sizeof bucket, "%s_bucket", name);
    snprintf(sum, sizeof sum, "%s_sum", name);
    snprintf(count, sizeof count, "%s_count", name);
    for (size_t s = 0; s < m->ndb; s++) {
        const dbm *d = &m->db[s];
        if (!shown(m, d))
            continue;
        for (size_t i = 0; i < d->nq; i++) {
            const hist *h = which ? &d->q[i].dur : &d->q[i].wait;
            int64_t cum = 0;
            for (int k = 0; k < NB; k++) {
                cum += h->b[k];
                series(b, d, bucket);
                sb_printf(b, "%squeue=\"", lsep(d));
                sb_label(b, d->q[i].name);
                sb_printf(b, "\",le=\"%g\"} %lld\n", bounds[k], (long long)cum);
            }
            series(b, d, bucket);
            sb_printf(b, "%squeue=\"", lsep(d));
            sb_label(b, d->q[i].name);
            sb_printf(b, "\",le=\"+Inf\"} %lld\n", (long long)h->n);
            series(b, d, sum);
            sb_printf(b, "%squeue=\"", lsep(d));
            sb_label(b, d->q[i].name);
            sb_printf(b, "\"} %.6f\n", h->sum);
            series(b, d, count);
            sb_printf(b, "%squeue=\"", lsep(d));
            sb_label(b, d->q[i].name);
            sb_printf(b, "\"} %lld\n", (long long)h->n);
        }
    }
}

/* Kinds of per-queue series, for render_queue. */
enum {
    Q_FIN0, Q_RETRIED = NFIN, Q_LOST, Q_SCHEDULED, Q_LAG, Q_PAUSED, Q_SLEEPING, Q_AWAITING,
    Q_READY, Q_OLDEST_READY, Q_SLOTS, Q_LIMIT
};

static void render_queue(sbuf *b, const serve_metrics *m, const char *name, int what)
{
    for (size_t s = 0; s < m->ndb; s++) {
        const dbm *d = &m->db[s];
        if (!shown(m, d))
            continue;
        for (size_t i = 0; i < d->nq; i++) {
            const qm *q = &d->q[i];
            if (what == Q_LIMIT && q->concurrency == 0)
                continue; /* no limit: no series */
            series(b, d, name);
            sb_printf(b, "%squeue=\"", lsep(d));
            sb_label(b, q->name);
            sb_puts(b, "\"} ");
            if (what < NFIN)
                sb_printf(b, "%lld\n", (long long)q->fin[what]);
            else if (what == Q_RETRIED || what == Q_LOST || what == Q_SCHEDULED)
                sb_printf(b, "%lld\n",
                          (long long)(what == Q_RETRIED ? q->retried
                                      : what == Q_LOST  ? q->lost
                                                        : q->scheduled));
            else if (what == Q_SLEEPING || what == Q_AWAITING)
                sb_printf(b, "%lld\n", (long long)(what == Q_SLEEPING ? q->sleeping : q->awaiting_event));
            else if (what == Q_LAG)
                sb_printf(b, "%.3f\n", q->lag);
            else if (what == Q_OLDEST_READY)
                sb_printf(b, "%.3f\n", q->oldest_ready);
            else if (what == Q_READY || what == Q_SLOTS)
                sb_printf(b, "%lld\n", (long long)(what == Q_READY ? q->ready : q->slots));
            else if (what == Q_LIMIT)
                sb_printf(b, "%d\n", q->concurrency);
            else
                sb_printf(b, "%d\n", q->paused);
        }
    }
}

static void render_counter(sbuf *b, const serve_metrics *m, const char *name, const char *help, int what)
{
    family(b, name, "counter", help);
    render_queue(b, m, name, what);
}

/* Kinds of per-database series without labels of their own, for render_db. */
enum { D_UP, D_COLLECT_S, D_ERRORS, D_BYTES, D_DEAD, D_VACUUMS, D_HORIZON, D_AV_PAUSED };

static void render_db(sbuf *b, const serve_metrics *m, const char *name, const char *type, const char *help, int what)
{
    family(b, name, type, help);
    for (size_t s = 0; s < m->ndb; s++) {
        const dbm *d = &m->db[s];
        if (!shown(m, d))
            continue;
        plain(b, d, name);
        switch (what) {
        case D_UP: sb_printf(b, " %d\n", d->up); break;
        case D_COLLECT_S: sb_printf(b, " %.6f\n", d->collect_s); break;
        case D_ERRORS: sb_printf(b, " %lld\n", (long long)d->errors); break;
        case D_BYTES: sb_printf(b, " %lld\n", (long long)d->jobs_bytes); break;
        case D_DEAD: sb_printf(b, " %lld\n", (long long)d->jobs_dead); break;
        case D_VACUUMS: sb_printf(b, " %lld\n", (long long)d->vacuums); break;
        case D_HORIZON: sb_printf(b, " %.3f\n", d->horizon_age_s); break;
        default: sb_printf(b, " %d\n", d->autovacuum_paused); break;
        }
    }
}

static char *render(const serve_metrics *m)
{
    sbuf b;

    sb_init(&b);
    if (m->cluster) {
        family(&b, "pgjobq_shard_up", "gauge",
               "1 when the last collection from the shard succeeded; 0: the shard is down, and its other series "
               "are absent.");
        for (size_t s = 0; s < m->ndb; s++) {
            plain(&b, &m->db[s], "pgjobq_shard_up");
            sb_printf(&b, " %d\n", m->db[s].up);
        }
    }
    render_db(&b, m, "pgjobq_up", "gauge", "1 when the last collection from the database succeeded.", D_UP);
    render_db(&b, m, "pgjobq_collect_duration_seconds", "gauge", "How long the last collection took.", D_COLLECT_S);
    render_db(&b, m, "pgjobq_collect_errors_total", "counter", "Collections that failed.", D_ERRORS);
    render_db(&b, m, "pgjobq_jobs_table_bytes", "gauge", "Size of pgjobq.jobs with its indexes and TOAST.", D_BYTES);
    render_db(&b, m, "pgjobq_jobs_table_dead_rows", "gauge",
              "Dead rows in pgjobq.jobs (the statistics' estimate): what vacuum has yet to remove.", D_DEAD);
    render_db(&b, m, "pgjobq_jobs_table_vacuums_total", "counter", "Vacuums and autovacuums of pgjobq.jobs.",
              D_VACUUMS);
    render_db(&b, m, "pgjobq_vacuum_horizon_age_seconds", "gauge",
              "How long the oldest snapshot, slot or prepared transaction has held vacuum back (0: none).", D_HORIZON);
    render_db(&b, m, "pgjobq_jobs_table_autovacuum_paused", "gauge",
              "1 while pgjobq has autovacuum of pgjobq.jobs off: a pass could remove nothing while the oldest "
              "snapshot holds (docs/deploy.md).",
              D_AV_PAUSED);
    family(&b, "pgjobq_vacuum_horizon_holder", "gauge",
           "1 for what holds vacuum back the longest: kind session, standby, slot or prepared.");
    for (size_t s = 0; s < m->ndb; s++) {
        const dbm *d = &m->db[s];
        if (shown(m, d) && d->holder_kind[0]) {
            series(&b, d, "pgjobq_vacuum_horizon_holder");
            sb_printf(&b, "%skind=\"%s\",pid=\"%d\",application=\"", lsep(d), d->holder_kind, d->holder_pid);
            sb_label(&b, d->holder_app);
            sb_puts(&b, "\"} 1\n");
        }
    }

    family(&b, "pgjobq_jobs", "gauge",
           "Jobs by queue and state: waiting, queued and running now; completed, failed and cancelled jobs held "
           "in the history (counted every 12 collections, or less often when that is slow).");
    for (size_t s = 0; s < m->ndb; s++) {
        const dbm *d = &m->db[s];
        for (size_t i = 0; i < d->nq && shown(m, d); i++) {
            const qm *q = &d->q[i];
            const char *st[3] = {"queued", "running", "waiting"};
            int64_t v[3] = {q->queued, q->running, q->waiting};
            for (int k = 0; k < 3; k++) {
                series(&b, d, "pgjobq_jobs");
                sb_printf(&b, "%squeue=\"", lsep(d));
                sb_label(&b, q->name);
                sb_printf(&b, "\",state=\"%s\"} %lld\n", st[k], (long long)v[k]);
            }
            for (int f = 0; f < NFIN && q->held_known; f++) {
                series(&b, d, "pgjobq_jobs");
                sb_printf(&b, "%squeue=\"", lsep(d));
                sb_label(&b, q->name);
                sb_printf(&b, "\",state=\"%s\"} %lld\n", fin_names[f], (long long)q->held[f]);
            }
        }
    }
    family(&b, "pgjobq_jobs_scheduled", "gauge", "Queued jobs whose run_at is still ahead (part of state=queued).");
    render_queue(&b, m, "pgjobq_jobs_scheduled", Q_SCHEDULED);
    family(&b, "pgjobq_jobs_sleeping", "gauge",
           "Queued jobs parked by a durable sleep, until its end (part of state=queued: docs/durable.md).");
    render_queue(&b, m, "pgjobq_jobs_sleeping", Q_SLEEPING);
    family(&b, "pgjobq_jobs_awaiting_event", "gauge",
           "Queued jobs parked waiting for an event, until it comes or their timeout (part of state=queued).");
    render_queue(&b, m, "pgjobq_jobs_awaiting_event", Q_AWAITING);
    family(&b, "pgjobq_queue_lag_seconds", "gauge", "Age of the oldest job that is due and not running (0: none).");
    render_queue(&b, m, "pgjobq_queue_lag_seconds", Q_LAG);
    family(&b, "pgjobq_queue_paused", "gauge", "1 when the queue is paused.");
    render_queue(&b, m, "pgjobq_queue_paused", Q_PAUSED);
    family(&b, "pgjobq_queue_ready_jobs", "gauge",
           "Queued jobs a worker could claim now (due, their parents done), a paused queue's too: what to scale "
           "workers on.");
    render_queue(&b, m, "pgjobq_queue_ready_jobs", Q_READY);
    family(&b, "pgjobq_queue_oldest_ready_age_seconds", "gauge",
           "How long the oldest ready job has been claimable (0: none is ready).");
    render_queue(&b, m, "pgjobq_queue_oldest_ready_age_seconds", Q_OLDEST_READY);
    family(&b, "pgjobq_queue_concurrency_limit", "gauge",
           "The queue's concurrency limit, for queues that have one: at most this many of its jobs run at once.");
    render_queue(&b, m, "pgjobq_queue_concurrency_limit", Q_LIMIT);
    family(&b, "pgjobq_queue_worker_slots", "gauge",
           "Slots of the live workers that serve the queue (what each says in its beat).");
    render_queue(&b, m, "pgjobq_queue_worker_slots", Q_SLOTS);
    render_counter(&b, m, "pgjobq_jobs_completed_total", "Jobs that completed, since this server started.",
                   F_COMPLETED);
    render_counter(&b, m, "pgjobq_jobs_failed_total", "Jobs that ended failed, since this server started.", F_FAILED);
    render_counter(&b, m, "pgjobq_jobs_cancelled_total", "Jobs that ended cancelled, since this server started.",
                   F_CANCELLED);
    render_counter(&b, m, "pgjobq_jobs_retried_total",
                   "Failed attempts queued again for a retry, since this server started.", Q_RETRIED);
    render_counter(&b, m, "pgjobq_jobs_lost_total",
                   "Leases that expired and were rescued (the worker crashed, stalled or was cut off), since this "
                   "server started.",
                   Q_LOST);
    family(&b, "pgjobq_job_wait_seconds", "histogram",
           "From when a finished job was due (run_at) to its last start, since this server started.");
    render_hist(&b, m, "pgjobq_job_wait_seconds", 0);
    family(&b, "pgjobq_job_duration_seconds", "histogram",
           "From a finished job's last start to its end, since this server started.");
    render_hist(&b, m, "pgjobq_job_duration_seconds", 1);
    family(&b, "pgjobq_worker_up", "gauge",
           "1 for a worker seen in the last 15 seconds, 0 for one seen in the last hour that did not stop cleanly.");
    for (size_t s = 0; s < m->ndb; s++) {
        const dbm *d = &m->db[s];
        for (size_t i = 0; i < d->nw && shown(m, d); i++) {
            series(&b, d, "pgjobq_worker_up");
            sb_printf(&b, "%sworker=\"", lsep(d));
            sb_label(&b, d->w[i].id);
            sb_puts(&b, "\",host=\"");
            sb_label(&b, d->w[i].host);
            sb_printf(&b, "\"} %d\n", d->w[i].alive);
        }
    }
    family(&b, "pgjobq_worker_jobs", "gauge", "Jobs a worker holds (running, under its lease).");
    for (size_t s = 0; s < m->ndb; s++) {
        const dbm *d = &m->db[s];
        for (size_t i = 0; i < d->nw && shown(m, d); i++) {
            series(&b, d, "pgjobq_worker_jobs");
            sb_printf(&b, "%sworker=\"", lsep(d));
            sb_label(&b, d->w[i].id);
            sb_printf(&b, "\"} %lld\n", (long long)d->w[i].jobs);
        }
    }
    if (b.failed) {
        sb_free(&b);
        return NULL;
    }
    return b.data;
}

static void *collector(void *arg)
{
    serve_metrics *m = arg;

    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        pthread_mutex_unlock(&m->mu);
        for (size_t s = 0; s < m->ndb; s++) {
            dbm *d = &m->db[s];
            int64_t t0 = cli_mono_ms();
            int rc = collect(d);
            d->up = rc == 0;
            if (rc != 0)
                d->errors++;
            else
                d->collections++;
            d->collect_s = (double)(cli_mono_ms() - t0) / 1000.0;
        }
        char *text = render(m);
        pthread_mutex_lock(&m->mu);
        if (text) {
            free(m->text);
            m->text = text;
        }
        pthread_cond_broadcast(&m->cv);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        int64_t ns = (int64_t)until.tv_nsec + (m->interval_ms % 1000) * 1000000;
        until.tv_sec += (time_t)(m->interval_ms / 1000 + ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
        while (!m->stop && pthread_cond_timedwait(&m->cv, &m->mu, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

serve_metrics *serve_metrics_start(const char *const *conninfos, const char *const *shards, size_t n,
                                   int64_t interval_ms)
{
    serve_metrics *m = calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    if ((m->db = calloc(n ? n : 1, sizeof *m->db)) == NULL) {
        free(m);
        return NULL;
    }
    m->ndb = n;
    m->cluster = shards != NULL;
    m->interval_ms = interval_ms;
    for (size_t i = 0; i < n; i++) {
        m->db[i].conninfo = conninfos[i];
        m->db[i].shard = shards ? shards[i] : NULL;
        m->db[i].interval_ms = interval_ms;
    }
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m->db);
        free(m);
        return NULL;
    }
    if (pthread_cond_init(&m->cv, NULL) != 0) {
        pthread_mutex_destroy(&m->mu);
        free(m->db);
        free(m);
        return NULL;
    }
    if (pthread_create(&m->thread, NULL, collector, m) != 0) {
        serve_metrics_stop(m);
        return NULL;
    }
    m->started = 1;
    return m;
}

char *serve_metrics_text(serve_metrics *m, int wait_first_ms)
{
    char *copy = NULL;

    pthread_mutex_lock(&m->mu);
    if (m->text == NULL && wait_first_ms > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += wait_first_ms / 1000 + 1;
        while (m->text == NULL && pthread_cond_timedwait(&m->cv, &m->mu, &until) == 0) {
        }
    }
    if (m->text)
        copy = strdup(m->text);
    pthread_mutex_unlock(&m->mu);
    return copy;
}

void serve_metrics_stop(serve_metrics *m)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (m->started)
        pthread_join(m->thread, NULL);
    for (size_t i = 0; i < m->ndb; i++) {
        pgjobq_client_close(m->db[i].c);
        workers_free(&m->db[i]);
        free(m->db[i].q);
    }
    free(m->db);
    free(m->text);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}
