/*
 * test_unique.c - unique keys that debounce and throttle (issue 41; docs/queues.md, "Debounce and
 * throttle") against the real server: on_conflict skip (as ever), replace (a queued holder takes the
 * new job's payload and run_at; a running one is left alone) and keep (the key held for a window from
 * the enqueue that took it, finished jobs too); 16 producers racing on one key, each on its own
 * connection and thread, leave one queued job with the payload of the last to commit; the rules of
 * the modes give the same answer through SQL, C, the command and Python.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int enqueue_keyed(pgjobq_client *c, const char *queue, const char *key, int mode, int64_t unique_for_ms,
                         const char *payload, int64_t delay_ms, int64_t *id, int *outcome)
{
    pgjobq_job_spec s = {.payload = payload};
    s.opts.queue = queue;
    s.opts.unique_key = key;
    s.opts.on_conflict = mode;
    s.opts.delay_ms = delay_ms;
    s.unique_for_ms = unique_for_ms;
    return pgjobq_enqueue_spec(c, &s, id, outcome);
}

TEST(unique_key_replace_debounces_a_queued_job_and_leaves_a_running_one)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t id = 0, again = 0;
    int outcome = -1;
    pgjobq_job *jobs = NULL;
    size_t n = 0;

    CHECK_OK(
        c, enqueue_keyed(c, "search", "reindex:7", PGJOBQ_ON_CONFLICT_REPLACE, 0, "{\"v\": 1}", 60000, &id, &outcome));
    CHECK_INT(outcome, PGJOBQ_ENQUEUED);
    /* It has failed once meanwhile (a retry waits): the replacement starts afresh. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET attempt = 1, last_error = 'boom' WHERE id = %lld", (long long)id));
    long long due_before =
        t_int(pg, "SELECT extract(epoch FROM run_at)::bigint FROM pgjobq.jobs WHERE id = %lld", (long long)id);
    pgjobq_job_spec s = {.payload = "{\"v\": 2}"};
    s.opts.queue = "search";
    s.opts.kind = "reindex";
    s.opts.priority = -5;
    s.opts.max_attempts = 3;
    s.opts.unique_key = "reindex:7";
    s.opts.on_conflict = PGJOBQ_ON_CONFLICT_REPLACE;
    s.opts.delay_ms = 3600000; /* pushed: runs after a quiet hour */
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &again, &outcome));
    CHECK_INT(outcome, PGJOBQ_REPLACED);
    CHECK_INT(again, id);
    CHECK_INT(
        t_int(pg,
              "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND payload = '{\"v\": 2}'"
              " AND kind = 'reindex' AND priority = -5 AND max_attempts = 3 AND attempt = 0 AND last_error IS NULL"
              " AND extract(epoch FROM run_at) > %lld + 3000",
              (long long)id, due_before),
        1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'search'"), 1);
    /* Its new level is recorded: the claim finds it there once due. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'search' AND priority = -5"), 1);
    /* pgjobq_enqueue says OK for a replacement, with the holder's id. */
    pgjobq_enqueue_opts o = s.opts;
    o.delay_ms = 0;
    CHECK_OK(c, pgjobq_enqueue(c, "{\"v\": 3}", &o, &again));
    CHECK_INT(again, id);

    /* Running: not touched; the new job is not enqueued, and the running one is returned. */
    CHECK_OK(c, pgjobq_claim(c, "search", 1, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, id);
    int64_t token = jobs[0].lease_token;
    pgjobq_jobs_free(jobs);
    long long xmin = t_int(pg, "SELECT xmin::text::bigint FROM pgjobq.jobs WHERE id = %lld", (long long)id);
    CHECK_RC(c,
             enqueue_keyed(c, "search", "reindex:7", PGJOBQ_ON_CONFLICT_REPLACE, 0, "{\"v\": 4}", 0, &again, &outcome),
             PGJOBQ_EDUPLICATE);
    CHECK_INT(outcome, PGJOBQ_HELD);
    CHECK_INT(again, id);
    CHECK_INT(t_int(pg, "SELECT xmin::text::bigint FROM pgjobq.jobs WHERE id = %lld", (long long)id), xmin);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND payload = '{\"v\": 3}'", (long long)id),
              1);
    /* Once it has finished, the key is free: a new job. */
    CHECK_OK(c, pgjobq_job_complete(c, id, token, NULL));
    CHECK_OK(c,
             enqueue_keyed(c, "search", "reindex:7", PGJOBQ_ON_CONFLICT_REPLACE, 0, "{\"v\": 5}", 0, &again, &outcome));
    CHECK_INT(outcome, PGJOBQ_ENQUEUED);
    CHECK(again != id);

    /* skip, as ever: the holder stays as it was. */
    CHECK_RC(c, enqueue_keyed(c, "search", "reindex:7", PGJOBQ_ON_CONFLICT_SKIP, 0, "{\"v\": 6}", 0, &id, &outcome),
             PGJOBQ_EDUPLICATE);
    CHECK_INT(id, again);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND payload = '{\"v\": 5}'", (long long)id),
              1);

    /* A batch: replaced and held jobs are told apart. */
    pgjobq_job_spec b[3];
    memset(b, 0, sizeof b);
    for (int i = 0; i < 3; i++) {
        b[i].payload = i == 2 ? "{\"last\": true}" : "{}";
        b[i].opts.queue = "search";
        b[i].opts.unique_key = i == 1 ? "other" : "reindex:7";
        b[i].opts.on_conflict = i == 1 ? PGJOBQ_ON_CONFLICT_SKIP : PGJOBQ_ON_CONFLICT_REPLACE;
    }
    int64_t ids[3];
    unsigned char dup[3];
    CHECK_OK(c, pgjobq_enqueue_many(c, b, 3, ids, dup));
    CHECK_INT(dup[0], PGJOBQ_REPLACED);
    CHECK_INT(dup[1], PGJOBQ_ENQUEUED);
    CHECK_INT(dup[2], PGJOBQ_REPLACED);
    CHECK_INT(ids[0], id);
    CHECK_INT(ids[2], id);
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND payload = '{\"last\": true}'", (long long)id),
        1);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(unique_key_keep_holds_the_key_for_a_window_after_the_job_ran)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t id = 0, again = 0;
    int outcome = -1;
    pgjobq_job *jobs = NULL;
    size_t n = 0;

    CHECK_OK(c, enqueue_keyed(c, "digest", "user:1", PGJOBQ_ON_CONFLICT_KEEP, 600000, "{\"v\": 1}", 0, &id, &outcome));
    CHECK_INT(outcome, PGJOBQ_ENQUEUED);
    /* Queued: the new one is dropped, the queued one keeps its payload and run_at. */
    CHECK_RC(c,
             enqueue_keyed(c, "digest", "user:1", PGJOBQ_ON_CONFLICT_KEEP, 600000, "{\"v\": 2}", 0, &again, &outcome),
             PGJOBQ_EDUPLICATE);
    CHECK_INT(again, id);
    CHECK_INT(outcome, PGJOBQ_HELD);
    /* Ran and completed: the key is still held for the window; skip would have taken a new job. */
    CHECK_OK(c, pgjobq_claim(c, "digest", 1, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_OK(c, pgjobq_job_complete(c, jobs[0].id, jobs[0].lease_token, NULL));
    pgjobq_jobs_free(jobs);
    CHECK_RC(c,
             enqueue_keyed(c, "digest", "user:1", PGJOBQ_ON_CONFLICT_KEEP, 600000, "{\"v\": 3}", 0, &again, &outcome),
             PGJOBQ_EDUPLICATE);
    CHECK_INT(again, id);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'digest'"), 0);
    CHECK_OK(c, enqueue_keyed(c, "digest", "user:1", PGJOBQ_ON_CONFLICT_SKIP, 0, "{\"v\": 4}", 0, &again, &outcome));
    CHECK_INT(outcome, PGJOBQ_ENQUEUED); /* skip: the key is free once its job finished */
    PQclear(t_exec(pg, "DELETE FROM pgjobq.jobs WHERE id = %lld", (long long)again));
    /* The window passed (moved back by hand: no sleeping): a new job takes the key and a new window. */
    PQclear(
        t_exec(pg, "UPDATE pgjobq.unique_holds SET until = now() - interval '1 second' WHERE unique_key = 'user:1'"));
    CHECK_OK(c,
             enqueue_keyed(c, "digest", "user:1", PGJOBQ_ON_CONFLICT_KEEP, 600000, "{\"v\": 5}", 0, &again, &outcome));
    CHECK_INT(outcome, PGJOBQ_ENQUEUED);
    CHECK(again != id);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.unique_holds WHERE unique_key = 'user:1' AND job_id = %lld"
                    " AND until > now() + interval '9 minutes'",
                    (long long)again),
              1);
    /* Keys are per queue, windows too. */
    CHECK_OK(c, enqueue_keyed(c, "digest2", "user:1", PGJOBQ_ON_CONFLICT_KEEP, 600000, "{}", 0, &id, &outcome));
    CHECK_INT(outcome, PGJOBQ_ENQUEUED);
    /* prune removes the windows that have passed, and only those. */
    PQclear(t_exec(pg, "UPDATE pgjobq.unique_holds SET until = now() - interval '1 second' WHERE queue = 'digest2'"));
    PQclear(t_exec(pg, "SELECT pgjobq.prune()"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.unique_holds WHERE queue = 'digest2'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.unique_holds WHERE queue = 'digest'"), 1);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* The rules of the modes, one answer on every way in: SQL enqueue and enqueue_keyed, C (one job, a
 * batch), the command and Python.  Each refusal names the rule, and writes nothing. */
typedef struct mode_case {
    const char *name;
    const char *sql;    /* the arguments of pgjobq.enqueue('rules', ...) after the queue */
    int mode;           /* C */
    int64_t window_ms;  /* C */
    int key, tags;      /* C: a unique key; tags */
    const char *cli[6]; /* the command's options, NULL-ended */
    const char *py;     /* JobSpec's keyword arguments */
    const char *refused;
    int cli_status;
} mode_case;

static const mode_case mode_cases[] = {
    {"keep without a window",
     "unique_key => 'k', on_conflict => 'keep'",
     PGJOBQ_ON_CONFLICT_KEEP,
     0,
     1,
     0,
     {"--unique-key", "k", "--on-conflict", "keep", NULL},
     "unique_key=\"k\", on_conflict=\"keep\"",
     "window",
     65},
    {"replace with a window",
     "unique_key => 'k', on_conflict => 'replace', unique_for => '1 minute'",
     PGJOBQ_ON_CONFLICT_REPLACE,
     60000,
     1,
     0,
     {"--unique-key", "k", "--on-conflict", "replace", "--unique-for", "1m"},
     "unique_key=\"k\", on_conflict=\"replace\", unique_for=60",
     "keep's",
     65},
    {"a mode without a key",
     "on_conflict => 'replace'",
     PGJOBQ_ON_CONFLICT_REPLACE,
     0,
     0,
     0,
     {"--on-conflict", "replace", NULL},
     "on_conflict=\"replace\"",
     "unique key",
     65},
    {"a window without a key",
     "unique_for => '1 minute'",
     PGJOBQ_ON_CONFLICT_SKIP,
     60000,
     0,
     0,
     {"--unique-for", "1m", NULL},
     "unique_for=60",
     "unique key",
     65},
    {"a window of 400 days",
     "unique_key => 'k', unique_for => '400 days'",
     PGJOBQ_ON_CONFLICT_SKIP,
     INT64_C(34560000000),
     1,
     0,
     {"--unique-key", "k", "--unique-for", "400d", NULL},
     "unique_key=\"k\", unique_for=\"400d\"",
     "365 days",
     65},
    {"a mode with tags",
     "on_conflict => 'replace', tags => ARRAY['t']",
     PGJOBQ_ON_CONFLICT_REPLACE,
     0,
     0,
     1,
     {"--on-conflict", "replace", "--tag", "t", NULL},
     "on_conflict=\"replace\", tags=[\"t\"]",
     "parents or tags",
     65},
    {"keep with a window",
     "unique_key => 'ok', unique_for => '1 minute'",
     PGJOBQ_ON_CONFLICT_KEEP,
     60000,
     1,
     0,
     {"--unique-key", "ok", "--unique-for", "1m", NULL},
     "unique_key=\"ok\", unique_for=60",
     NULL,
     0},
};

TEST_FULL(unique_key_modes_give_the_same_answer_on_every_path, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char *out = NULL, *err = NULL;

    for (size_t k = 0; k < sizeof mode_cases / sizeof mode_cases[0]; k++) {
        const mode_case *m = &mode_cases[k];
        PQclear(t_exec(pg, "DELETE FROM pgjobq.jobs; DELETE FROM pgjobq.unique_holds"));
        /* SQL */
        char sql[512];
        snprintf(sql, sizeof sql, "SELECT * FROM pgjobq.enqueue('rules', %s)", m->sql);
        PGresult *r = PQexec(pg, sql);
        if (m->refused) {
            CHECK_MSG(PQresultStatus(r) == PGRES_FATAL_ERROR && strstr(PQresultErrorMessage(r), m->refused),
                      "%s: SQL said %s", m->name, PQresultErrorMessage(r));
            CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
        } else {
            CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "%s: SQL said %s", m->name, PQresultErrorMessage(r));
        }
        PQclear(r);
        PQclear(t_exec(pg, "DELETE FROM pgjobq.jobs; DELETE FROM pgjobq.unique_holds"));
        /* C: one job, and a batch */
        const char *tags[] = {"t", NULL};
        pgjobq_job_spec s = {.payload = "{}", .unique_for_ms = m->window_ms};
        s.opts.queue = "rules";
        s.opts.unique_key = m->key ? (m->refused ? "k" : "ok") : NULL;
        s.opts.on_conflict = m->mode;
        s.opts.tags = m->tags ? tags : NULL;
        int64_t id = 0;
        unsigned char dup = 0;
        int rc = pgjobq_enqueue_spec(c, &s, &id, NULL);
        if (m->refused) {
            CHECK_MSG(rc == PGJOBQ_EINVAL && strstr(pgjobq_errmsg(c), m->refused), "%s: C said %s", m->name,
                      pgjobq_errmsg(c));
            CHECK_RC(c, pgjobq_enqueue_many(c, &s, 1, &id, &dup), PGJOBQ_EINVAL);
            CHECK_MSG(strstr(pgjobq_errmsg(c), m->refused), "%s: C (many) said %s", m->name, pgjobq_errmsg(c));
        } else {
            CHECK_OK(c, rc);
        }
        PQclear(t_exec(pg, "DELETE FROM pgjobq.jobs; DELETE FROM pgjobq.unique_holds"));
        /* the command */
        const char *const *o = m->cli;
        int status = !o[2] ? t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "rules", o[0], o[1], "{}", NULL)
                     : !o[4]
                         ? t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "rules", o[0], o[1], o[2], o[3], "{}", NULL)
                         : t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "rules", o[0], o[1], o[2], o[3], o[4], o[5],
                                 "{}", NULL);
        if (m->refused)
            CHECK_MSG(status == m->cli_status && strstr(err, m->refused), "%s: the command said (%d) %s", m->name,
                      status, err);
        else
            CHECK_MSG(status == 0, "%s: the command said (%d) %s", m->name, status, err);
        free(out);
        free(err);
        PQclear(t_exec(pg, "DELETE FROM pgjobq.jobs; DELETE FROM pgjobq.unique_holds"));
        /* Python */
        char cmd[2048], said[4096];
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && PYTHONPATH='%s/python' PYTHONDONTWRITEBYTECODE=1 RULES_URL='%s' /usr/bin/python3 -c '"
                 "import os, pgjobq\n"
                 "app = pgjobq.App(os.environ[\"RULES_URL\"], queue=\"rules\")\n"
                 "try:\n"
                 "    app.enqueue(\"k\", {}, %s)\n"
                 "    print(\"accepted\")\n"
                 "except pgjobq.PgjobqError as e:\n"
                 "    print(\"refused:\", e)\n"
                 "' 2>&1",
                 t_tmpdir(), t_srcdir(), t_conninfo(), m->py);
        int py = t_shell(said, sizeof said, cmd);
        CHECK_MSG(py == 0, "%s: python3 (%d): %s", m->name, py, said);
        if (m->refused)
            CHECK_MSG(strncmp(said, "refused:", 8) == 0 && strstr(said, m->refused), "%s: Python said %s", m->name,
                      said);
        else
            CHECK_MSG(strncmp(said, "accepted", 8) == 0, "%s: Python said %s", m->name, said);
        /* A refusal wrote nothing. */
        if (m->refused)
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs") +
                          t_int(pg, "SELECT count(*) FROM pgjobq.unique_holds"),
                      0);
    }
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* 16 producers, each on its own connection and thread, replace (or keep) a key, round after round, a
 * fresh key each round, all released at once by a barrier so that they race to insert it; each writes
 * down, in its transaction after its enqueue, that it did (a sequence: the enqueues of one key are
 * ordered by its row's lock, or by the unique index while it is being inserted, so the log's order is
 * theirs). */
#define PRODUCERS 16
#define ROUNDS    25

static pthread_barrier_t start_line;

typedef struct producer {
    int n, mode;
    int64_t ids[ROUNDS];
    int outcomes[ROUNDS];
    char err[256];
} producer;

static void *produce(void *arg)
{
    producer *p = arg;
    pgjobq_client *c = NULL;
    if (pgjobq_client_open(&c, t_conninfo()) != PGJOBQ_OK)
        snprintf(p->err, sizeof p->err, "connect: %s", c ? pgjobq_errmsg(c) : "?");
    for (int r = 0; r < ROUNDS; r++) {
        char payload[64], key[32], sql[160];
        pthread_barrier_wait(&start_line); /* (every thread waits each round, even after an error) */
        if (p->err[0])
            continue;
        snprintf(payload, sizeof payload, "{\"producer\": %d, \"round\": %d}", p->n, r);
        snprintf(key, sizeof key, "key-%d", r);
        int rc = pgjobq_begin(c);
        if (rc == PGJOBQ_OK)
            rc = enqueue_keyed(c, "race", key, p->mode, p->mode == PGJOBQ_ON_CONFLICT_KEEP ? 600000 : 0, payload, 0,
                               &p->ids[r], &p->outcomes[r]);
        if (rc == PGJOBQ_EDUPLICATE)
            rc = PGJOBQ_OK;
        if (rc == PGJOBQ_OK) {
            snprintf(sql, sizeof sql, "INSERT INTO race_log (producer, round) VALUES (%d, %d)", p->n, r);
            PGresult *res = PQexec(pgjobq_client_conn(c), sql);
            if (PQresultStatus(res) != PGRES_COMMAND_OK)
                snprintf(p->err, sizeof p->err, "log: %s", PQresultErrorMessage(res));
            PQclear(res);
        }
        if (rc == PGJOBQ_OK && !p->err[0])
            rc = pgjobq_commit(c);
        if (rc != PGJOBQ_OK && !p->err[0])
            snprintf(p->err, sizeof p->err, "round %d: %s", r, pgjobq_errmsg(c));
    }
    pgjobq_client_close(c);
    return NULL;
}

static void race(int mode, producer *ps)
{
    pthread_t th[PRODUCERS];
    CHECK(pthread_barrier_init(&start_line, NULL, PRODUCERS) == 0);
    for (int i = 0; i < PRODUCERS; i++) {
        memset(&ps[i], 0, sizeof ps[i]);
        ps[i].n = i;
        ps[i].mode = mode;
        CHECK(pthread_create(&th[i], NULL, produce, &ps[i]) == 0);
    }
    for (int i = 0; i < PRODUCERS; i++)
        CHECK(pthread_join(th[i], NULL) == 0);
    pthread_barrier_destroy(&start_line);
    for (int i = 0; i < PRODUCERS; i++)
        CHECK_MSG(ps[i].err[0] == '\0', "producer %d: %s", i, ps[i].err);
}

TEST_FULL(unique_key_replace_and_keep_hold_under_16_racing_producers, 180, 0)
{
    PGconn *pg = t_pg();
    static producer ps[PRODUCERS];

    PQclear(t_exec(pg, "CREATE TABLE race_log (seq bigserial PRIMARY KEY, producer int, round int)"));
    for (int mode = PGJOBQ_ON_CONFLICT_REPLACE; mode <= PGJOBQ_ON_CONFLICT_KEEP; mode++) {
        PQclear(t_exec(pg, "TRUNCATE race_log; DELETE FROM pgjobq.jobs WHERE queue = 'race'"));
        race(mode, ps);
        CHECK_INT(t_int(pg, "SELECT count(*) FROM race_log"), PRODUCERS * ROUNDS);
        for (int r = 0; r < ROUNDS; r++) {
            /* One job per key, queued, every producer's answer; one producer inserted it. */
            CHECK_INT(
                t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'race' AND unique_key = 'key-%d'", r), 1);
            long long id = t_int(pg,
                                 "SELECT id FROM pgjobq.jobs WHERE queue = 'race' AND unique_key = 'key-%d'"
                                 " AND state = 'queued'",
                                 r);
            int inserted = 0;
            for (int i = 0; i < PRODUCERS; i++) {
                CHECK_MSG(ps[i].ids[r] == id, "round %d: producer %d got job %lld, not %lld", r, i,
                          (long long)ps[i].ids[r], id);
                /* replace: every one of them replaced it or inserted it, none was turned away */
                CHECK_MSG(mode == PGJOBQ_ON_CONFLICT_KEEP || ps[i].outcomes[r] != PGJOBQ_HELD,
                          "round %d: producer %d was turned away", r, i);
                inserted += ps[i].outcomes[r] == PGJOBQ_ENQUEUED;
            }
            CHECK_INT(inserted, 1);
            /* replace: the payload of the last to commit; keep: of the first, which took the window. */
            char *want = t_str(pg,
                               "SELECT format('{\"round\": %%s, \"producer\": %%s}', round, producer)"
                               " FROM race_log WHERE round = %d ORDER BY seq %s LIMIT 1",
                               r, mode == PGJOBQ_ON_CONFLICT_REPLACE ? "DESC" : "ASC");
            char *got = t_str(pg, "SELECT payload::text FROM pgjobq.jobs WHERE id = %lld", id);
            CHECK_MSG(strcmp(got, want) == 0, "%s, round %d: the job has %s, the %s to commit sent %s",
                      mode == PGJOBQ_ON_CONFLICT_REPLACE ? "replace" : "keep", r, got,
                      mode == PGJOBQ_ON_CONFLICT_REPLACE ? "last" : "first", want);
            free(want);
            free(got);
            if (mode == PGJOBQ_ON_CONFLICT_KEEP)
                CHECK_INT(t_int(pg,
                                "SELECT job_id FROM pgjobq.unique_holds WHERE queue = 'race'"
                                " AND unique_key = 'key-%d'",
                                r),
                          id);
        }
    }
    PQfinish(pg);
}
