/*
 * test_enqueue.c - enqueue, bulk enqueue, unique jobs, transactional enqueue, notifications, and bad
 * input (which must write nothing).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static long long count_jobs(PGconn *pg)
{
    return t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs");
}

TEST(enqueue_stores_every_field)
{
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job *j = NULL;
    int64_t id = 0;

    o.queue = "emails";
    o.kind = "welcome.send";
    o.priority = -5;
    o.max_attempts = 7;
    o.unique_key = "user:42";
    CHECK_OK(c, pgjobq_enqueue(c, "{\"to\": \"ana@example.org\", \"n\": [1, 2.5e3, true, null]}", &o, &id));
    CHECK(id > 0);
    CHECK_OK(c, pgjobq_job_get(c, id, &j));
    CHECK_INT(j->id, id);
    CHECK_STR(j->queue, "emails");
    CHECK_STR(j->kind, "welcome.send");
    CHECK_INT(j->priority, -5);
    CHECK_INT(j->max_attempts, 7);
    CHECK_INT(j->attempt, 0);
    CHECK_INT(j->state, PGJOBQ_QUEUED);
    CHECK_STR(j->unique_key, "user:42");
    CHECK(strstr(j->payload, "ana@example.org") != NULL);
    CHECK(j->started_at == PGJOBQ_TIME_NONE && j->finished_at == PGJOBQ_TIME_NONE);
    CHECK(j->lease_until == PGJOBQ_TIME_NONE && j->result == NULL && j->last_error == NULL);
    pgjobq_jobs_free(j);

    /* Defaults: NULL payload and options. */
    CHECK_OK(c, pgjobq_enqueue(c, NULL, NULL, &id));
    CHECK_OK(c, pgjobq_job_get(c, id, &j));
    CHECK_STR(j->queue, "default");
    CHECK_STR(j->kind, "default");
    CHECK_STR(j->payload, "{}");
    CHECK_INT(j->max_attempts, PGJOBQ_DEFAULT_MAX_ATTEMPTS);
    pgjobq_jobs_free(j);
    pgjobq_client_close(c);
}

TEST(enqueue_delay_is_computed_by_the_database_clock)
{
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    PGconn *pg = t_pg();
    int64_t id;

    /* run_at and created_at both come from the inserting statement's now(): if the library had sent a
     * client-side time, run_at - created_at would not be exactly the delay. */
    o.delay_ms = 3600 * 1000 + 250;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    CHECK_INT(t_int(pg,
                    "SELECT (run_at - created_at = interval '1 hour 250 milliseconds')::int FROM pgjobq.all_jobs"
                    " WHERE id = %lld",
                    (long long)id),
              1);
    /* An absolute run_at is the user's own time, parsed by the server. */
    o.delay_ms = 0;
    o.run_at = "2031-02-03 04:05:06+00";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    CHECK_INT(
        t_int(pg, "SELECT (run_at = '2031-02-03 04:05:06+00')::int FROM pgjobq.all_jobs WHERE id = %lld", (long long)id),
        1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(enqueue_batch_returns_ids_in_order)
{
    enum { N = 5000 };
    pgjobq_client *c = t_client();
    pgjobq_job_spec *specs = calloc(N, sizeof *specs);
    char(*payloads)[32] = calloc(N, sizeof *payloads);
    int64_t *ids = calloc(N, sizeof *ids);
    unsigned char *dups = calloc(N, 1);
    PGconn *pg = t_pg();

    CHECK(specs && payloads && ids && dups);
    for (int i = 0; i < N; i++) {
        snprintf(payloads[i], sizeof payloads[i], "{\"i\": %d}", i);
        specs[i].payload = payloads[i];
        specs[i].opts.queue = i % 2 ? "odd" : "even";
    }
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, ids, dups));
    CHECK_INT(count_jobs(pg), N);
    for (int i = 0; i < N; i++) {
        CHECK(dups[i] == 0);
        if (i > 0)
            CHECK(ids[i] > ids[i - 1]);
    }
    /* Spot-check that each id belongs to its payload. */
    for (int i = 0; i < N; i += 997)
        CHECK_INT(t_int(pg, "SELECT (payload->>'i')::int FROM pgjobq.all_jobs WHERE id = %lld", (long long)ids[i]), i);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'odd'"), N / 2);
    /* pgjobq_enqueue_batch, its former name, is the same function. */
    CHECK_OK(c, pgjobq_enqueue_batch(c, specs, 3, ids, dups));
    CHECK_INT(count_jobs(pg), N + 3);
    CHECK_INT(t_int(pg, "SELECT (payload->>'i')::int FROM pgjobq.all_jobs WHERE id = %lld", (long long)ids[2]), 2);
    PQfinish(pg);
    free(specs);
    free(payloads);
    free(ids);
    free(dups);
    pgjobq_client_close(c);
}

TEST(enqueue_batch_is_all_or_none)
{
    enum { N = 200 };
    pgjobq_client *c = t_client();
    pgjobq_job_spec specs[N];
    PGconn *pg = t_pg();

    memset(specs, 0, sizeof specs);
    for (int i = 0; i < N; i++)
        specs[i].payload = "{\"ok\": true}";
    /* Caught by the library before anything is sent: the message names the job. */
    specs[137].payload = "{\"ok\": tru}";
    CHECK_RC(c, pgjobq_enqueue_many(c, specs, N, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "job 137") != NULL, "message: %s", pgjobq_errmsg(c));
    CHECK_INT(count_jobs(pg), 0);
    /* Caught only by the server (the library does not parse times): still nothing is inserted. */
    specs[137].payload = "{}";
    specs[190].opts.run_at = "not a time";
    CHECK_RC(c, pgjobq_enqueue_many(c, specs, N, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_STR(pgjobq_sqlstate(c), "22007");
    CHECK_INT(count_jobs(pg), 0);
    specs[190].opts.run_at = NULL;
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, NULL, NULL));
    CHECK_INT(count_jobs(pg), N);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(enqueue_unique_key_returns_the_existing_job)
{
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job *claimed = NULL;
    size_t n = 0;
    int64_t first = 0, again = 0, later = 0;
    PGconn *pg = t_pg();

    o.unique_key = "report:2026-11";
    CHECK_OK(c, pgjobq_enqueue(c, "{\"v\": 1}", &o, &first));
    CHECK_RC(c, pgjobq_enqueue(c, "{\"v\": 2}", &o, &again), PGJOBQ_EDUPLICATE);
    CHECK_INT(again, first);
    CHECK_INT(count_jobs(pg), 1);
    /* Still held while running. */
    CHECK_OK(c, pgjobq_claim(c, "default", 1, 30000, "w", &claimed, &n));
    CHECK_INT(n, 1);
    CHECK_RC(c, pgjobq_enqueue(c, "{\"v\": 3}", &o, &again), PGJOBQ_EDUPLICATE);
    CHECK_INT(again, first);
    /* Free again once the holder finishes. */
    CHECK_OK(c, pgjobq_job_complete(c, claimed[0].id, claimed[0].lease_token, NULL));
    CHECK_OK(c, pgjobq_enqueue(c, "{\"v\": 4}", &o, &later));
    CHECK(later != first);
    CHECK_INT(count_jobs(pg), 2);
    pgjobq_jobs_free(claimed);

    /* Inside one batch, the second job with a key points at the first. */
    pgjobq_job_spec specs[3];
    int64_t ids[3];
    unsigned char dups[3];
    memset(specs, 0, sizeof specs);
    specs[0].opts.unique_key = "k-batch";
    specs[2].opts.unique_key = "k-batch";
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 3, ids, dups));
    CHECK(dups[0] == 0 && dups[1] == 0 && dups[2] == 1);
    CHECK_INT(ids[2], ids[0]);
    CHECK_INT(count_jobs(pg), 4);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(enqueue_unique_key_race_between_processes_inserts_one)
{
    enum { N = 8 };
    int fds[N][2];
    pid_t pids[N];
    int64_t ids[N];
    int inserted = 0;

    for (int i = 0; i < N; i++) {
        CHECK(pipe(fds[i]) == 0);
        pids[i] = fork();
        CHECK(pids[i] >= 0);
        if (pids[i] == 0) {
            pgjobq_client *c = t_client();
            pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
            int64_t id = 0;
            o.unique_key = "the-one";
            int rc = pgjobq_enqueue(c, "{}", &o, &id);
            int64_t msg[2] = {rc == PGJOBQ_OK ? 1 : rc == PGJOBQ_EDUPLICATE ? 0 : -1, id};
            if (write(fds[i][1], msg, sizeof msg) != sizeof msg)
                _exit(3);
            _exit(0);
        }
        close(fds[i][1]);
    }
    for (int i = 0; i < N; i++) {
        int64_t msg[2];
        CHECK(read(fds[i][0], msg, sizeof msg) == sizeof msg);
        CHECK_MSG(msg[0] >= 0, "process %d got an error", i);
        inserted += (int)msg[0];
        ids[i] = msg[1];
        waitpid(pids[i], NULL, 0);
    }
    CHECK_INT(inserted, 1);
    for (int i = 1; i < N; i++)
        CHECK_INT(ids[i], ids[0]);
    PGconn *pg = t_pg();
    CHECK_INT(count_jobs(pg), 1);
    PQfinish(pg);
}

/* Drains pending notifications on a listening connection, waiting up to wait_ms for the first. */
static int notifications(PGconn *listener, int wait_ms, char queues[][32], int max)
{
    int n = 0;
    int64_t deadline = t_now_ms() + wait_ms;

    for (;;) {
        PGnotify *note;
        CHECK(PQconsumeInput(listener));
        while ((note = PQnotifies(listener)) != NULL) {
            if (n < max)
                snprintf(queues[n], 32, "%s", note->extra);
            n++;
            PQfreemem(note);
        }
        int64_t left = deadline - t_now_ms();
        if (left <= 0)
            return n;
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(PQsocket(listener), &rd);
        struct timeval tv = {0, (suseconds_t)(left > 50 ? 50 : left) * 1000};
        select(PQsocket(listener) + 1, &rd, NULL, NULL, &tv);
    }
}

TEST(enqueue_in_callers_transaction_commits_or_rolls_back_with_it)
{
    PGconn *app = t_pg(), *other = t_pg(), *listener = t_pg();
    pgjobq_client *c = NULL;
    char queues[8][32];
    int64_t id;

    PQclear(t_exec(listener, "LISTEN pgjobq"));
    CHECK_OK(c, pgjobq_client_wrap(&c, app));

    /* Rollback: the job never existed, and nobody was woken. */
    PQclear(t_exec(app, "BEGIN"));
    PQclear(t_exec(app, "CREATE TABLE orders (id int)"));
    CHECK_OK(c, pgjobq_enqueue(c, "{\"order\": 1}", NULL, &id));
    CHECK_INT(PQtransactionStatus(app), PQTRANS_INTRANS); /* the library did not commit */
    CHECK_INT(t_int(other, "SELECT count(*) FROM pgjobq.all_jobs"), 0);
    PQclear(t_exec(app, "ROLLBACK"));
    CHECK_INT(t_int(other, "SELECT count(*) FROM pgjobq.all_jobs"), 0);
    CHECK_INT(notifications(listener, 200, queues, 8), 0);

    /* Commit: the job and the caller's data appear together, and workers are notified once. */
    PQclear(t_exec(app, "BEGIN"));
    PQclear(t_exec(app, "CREATE TABLE orders (id int)"));
    PQclear(t_exec(app, "INSERT INTO orders VALUES (1)"));
    CHECK_OK(c, pgjobq_enqueue(c, "{\"order\": 1}", NULL, &id));
    CHECK_INT(t_int(other, "SELECT count(*) FROM pgjobq.all_jobs"), 0);
    PQclear(t_exec(app, "COMMIT"));
    CHECK_INT(t_int(other, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld", (long long)id), 1);
    CHECK_INT(t_int(other, "SELECT count(*) FROM orders"), 1);
    CHECK_INT(notifications(listener, 2000, queues, 8), 1);
    CHECK_STR(queues[0], "default");

    pgjobq_client_close(c);
    CHECK_INT(PQstatus(app), CONNECTION_OK); /* borrowed: still open */
    PQfinish(app);
    PQfinish(other);
    PQfinish(listener);
}

TEST(enqueue_batch_sends_one_notification_per_queue)
{
    enum { N = 10000 };
    pgjobq_client *c = t_client();
    PGconn *listener = t_pg();
    pgjobq_job_spec *specs = calloc(N, sizeof *specs);
    char queues[16][32];

    CHECK(specs != NULL);
    PQclear(t_exec(listener, "LISTEN pgjobq"));
    for (int i = 0; i < N; i++)
        specs[i].opts.queue = i % 3 == 0 ? "alpha" : "beta";
    /* A scheduled job wakes nobody: it is not due. */
    specs[5].opts.queue = "gamma";
    specs[5].opts.delay_ms = 3600000;
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, NULL, NULL));
    int n = notifications(listener, 1000, queues, 16);
    CHECK_INT(n, 2);
    CHECK((strcmp(queues[0], "alpha") == 0 && strcmp(queues[1], "beta") == 0) ||
          (strcmp(queues[0], "beta") == 0 && strcmp(queues[1], "alpha") == 0));
    free(specs);
    PQfinish(listener);
    pgjobq_client_close(c);
}

/* A commit that carries a NOTIFY holds the server's notification lock through its WAL flush, so the
 * library's own transactions carry none: it wakes the workers after the commit, in a transaction of
 * its own (src/enqueue.c).  enqueue_many(notify => false) is how: the caller then notifies itself. */
TEST(enqueue_on_its_own_connection_notifies_after_its_commit)
{
    pgjobq_client *c = t_client();
    PGconn *listener = t_pg(), *app = t_pg();
    pgjobq_job_spec specs[3];
    char queues[8][32];
    int64_t id, ids[3];

    PQclear(t_exec(listener, "LISTEN pgjobq"));
    /* The SQL API: notify => false sends nothing, in a transaction or not; the default notifies. */
    PQclear(t_exec(app, "BEGIN"));
    PQclear(t_exec(app, "SELECT * FROM pgjobq.enqueue_many(ARRAY['quiet'], NULL, ARRAY['{}'::jsonb], notify => false)"));
    PQclear(t_exec(app, "COMMIT"));
    PQclear(t_exec(app, "SELECT * FROM pgjobq.enqueue_many(ARRAY['quiet'], NULL, ARRAY['{}'::jsonb], notify => false)"));
    CHECK_INT(t_int(app, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'quiet'"), 2);
    CHECK_INT(notifications(listener, 300, queues, 8), 0);
    PQclear(t_exec(app, "SELECT * FROM pgjobq.enqueue_many(ARRAY['loud'], NULL, ARRAY['{}'::jsonb])"));
    CHECK_INT(notifications(listener, 2000, queues, 8), 1);
    CHECK_STR(queues[0], "loud");

    /* The library on its own idle connection: one notification per enqueue, each once the job is
     * there to claim; a job that is not due wakes nobody. */
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.queue = "own";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    CHECK_INT(notifications(listener, 2000, queues, 8), 1);
    CHECK_STR(queues[0], "own");
    CHECK_INT(t_int(app, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued'", (long long)id), 1);
    memset(specs, 0, sizeof specs);
    specs[0].opts.queue = "own";
    specs[1].opts.queue = "own2";
    specs[2].opts.queue = "later";
    specs[2].opts.delay_ms = 3600000;
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 3, ids, NULL));
    int n = notifications(listener, 1000, queues, 8);
    CHECK_INT(n, 2);
    CHECK((strcmp(queues[0], "own") == 0 && strcmp(queues[1], "own2") == 0) ||
          (strcmp(queues[0], "own2") == 0 && strcmp(queues[1], "own") == 0));
    /* Inside the client's own pgjobq_begin transaction: at its commit, not before. */
    CHECK_OK(c, pgjobq_begin(c));
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    CHECK_INT(notifications(listener, 300, queues, 8), 0);
    CHECK_OK(c, pgjobq_commit(c));
    CHECK_INT(notifications(listener, 2000, queues, 8), 1);
    PQfinish(listener);
    PQfinish(app);
    pgjobq_client_close(c);
}

/* The library's own enqueue is pipelined with its notification (src/exec.c): the statement's rows
 * arrive before its transaction commits, so an enqueue is a success only once the commit is known to
 * have happened.  A deferred constraint that refuses at commit makes the commit fail after the rows
 * came back. */
TEST(enqueue_reports_a_failure_of_its_own_commit)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    int64_t id = 0;

    PQclear(t_exec(pg, "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN"
                       " IF NEW.payload ? 'refuse' THEN RAISE EXCEPTION 'refused at commit'; END IF; RETURN NULL;"
                       " END$$"));
    PQclear(t_exec(pg, "CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON pgjobq.jobs DEFERRABLE INITIALLY DEFERRED"
                       " FOR EACH ROW EXECUTE FUNCTION public.refuse()"));
    int rc = pgjobq_enqueue(c, "{\"refuse\": 1}", NULL, &id);
    CHECK_MSG(rc != PGJOBQ_OK, "an enqueue whose commit failed returned PGJOBQ_OK (id %lld)", (long long)id);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "refused at commit") != NULL, "%s", pgjobq_errmsg(c));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 0);
    /* The same client goes on. */
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld", (long long)id), 1);
    PQclear(t_exec(pg, "DROP TRIGGER refuse ON pgjobq.jobs"));
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(enqueue_bad_input_is_refused_and_writes_nothing)
{
    static char big[PGJOBQ_PAYLOAD_MAX + 64];
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    struct {
        const char *payload;
        const char *queue;
        const char *kind;
        int priority;
        int max_attempts;
        int64_t delay_ms;
        const char *run_at;
        const char *unique_key;
        const char *expect; /* a word the message must contain */
    } cases[] = {
        {"{bad", NULL, NULL, 0, 0, 0, NULL, NULL, "JSON"},
        {"", NULL, NULL, 0, 0, 0, NULL, NULL, "empty"},
        {"{\"a\": 1} trailing", NULL, NULL, 0, 0, 0, NULL, NULL, "trailing"},
        {"\"\\u0000\"", NULL, NULL, 0, 0, 0, NULL, NULL, "u0000"},
        {"\"\\ud800\"", NULL, NULL, 0, 0, 0, NULL, NULL, "surrogate"},
        {"\"\xff\xfe\"", NULL, NULL, 0, 0, 0, NULL, NULL, "UTF-8"},
        {big, NULL, NULL, 0, 0, 0, NULL, NULL, "limit"},
        {"{}", "it's", NULL, 0, 0, 0, NULL, NULL, "queue"},
        {"{}", "a;b", NULL, 0, 0, 0, NULL, NULL, "queue"},
        {"{}", "", NULL, 0, 0, 0, NULL, NULL, "empty"},
        {"{}", "0day", NULL, 0, 0, 0, NULL, NULL, "queue"},
        {"{}", "x--y; DROP TABLE pgjobq.jobs", NULL, 0, 0, 0, NULL, NULL, "queue"},
        {"{}", "naïve", NULL, 0, 0, 0, NULL, NULL, "queue"},
        {"{}", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", NULL, 0, 0, 0, NULL, NULL, "limit"},
        {"{}", NULL, "$$", 0, 0, 0, NULL, NULL, "kind"},
        {"{}", NULL, "a\\b", 0, 0, 0, NULL, NULL, "kind"},
        {"{}", NULL, NULL, 101, 0, 0, NULL, NULL, "priority"},
        {"{}", NULL, NULL, -101, 0, 0, NULL, NULL, "priority"},
        {"{}", NULL, NULL, 0, -1, 0, NULL, NULL, "max_attempts"},
        {"{}", NULL, NULL, 0, 1001, 0, NULL, NULL, "max_attempts"},
        {"{}", NULL, NULL, 0, 0, -1, NULL, NULL, "negative"},
        {"{}", NULL, NULL, 0, 0, 5, "2030-01-01", NULL, "not both"},
        {"{}", NULL, NULL, 0, 0, 0, "garbage", NULL, "garbage"},
        {"{}", NULL, NULL, 0, 0, 0, NULL, "", "a key has 1 to 255"},
    };

    memset(big, ' ', sizeof big - 1);
    big[0] = '"';
    big[sizeof big - 2] = '"';
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
        int64_t id = 12345;
        o.queue = cases[i].queue;
        o.kind = cases[i].kind;
        o.priority = cases[i].priority;
        o.max_attempts = cases[i].max_attempts;
        o.delay_ms = cases[i].delay_ms;
        o.run_at = cases[i].run_at;
        o.unique_key = cases[i].unique_key;
        int rc = pgjobq_enqueue(c, cases[i].payload, &o, &id);
        CHECK_MSG(rc == PGJOBQ_EINVAL, "case %zu: %s (%s)", i, pgjobq_errname(rc), pgjobq_errmsg(c));
        CHECK_MSG(strstr(pgjobq_errmsg(c), cases[i].expect) != NULL, "case %zu: message \"%s\" lacks \"%s\"", i,
                  pgjobq_errmsg(c), cases[i].expect);
        CHECK_INT(id, 0);
    }
    CHECK_INT(count_jobs(pg), 0);
    /* Unknown ids. */
    CHECK_RC(c, pgjobq_job_cancel(c, 999999, NULL), PGJOBQ_ENOTFOUND);
    CHECK_RC(c, pgjobq_job_retry(c, 999999), PGJOBQ_ENOTFOUND);
    pgjobq_job *j = NULL;
    CHECK_RC(c, pgjobq_job_get(c, 999999, &j), PGJOBQ_ENOTFOUND);
    CHECK(j == NULL);
    CHECK_INT(count_jobs(pg), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(enqueue_connection_loss_is_its_own_error)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t id;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    PQclear(t_exec(pg, "SELECT pg_terminate_backend(%d)", PQbackendPID(pgjobq_client_conn(c))));
    CHECK_RC(c, pgjobq_enqueue(c, "{}", NULL, &id), PGJOBQ_ECONN);
    /* The client reconnects on its next call. */
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    CHECK_INT(count_jobs(pg), 2);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Large batches go through COPY (src/enqueue.c): the same jobs, the same ids, the same all-or-none. */
TEST(enqueue_batch_with_copy_keeps_every_field_and_returns_the_ids)
{
    enum { N = 3000 };
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job_spec *specs = calloc(N, sizeof *specs);
    char (*payloads)[128] = calloc(N, sizeof *payloads);
    int64_t *ids = calloc(N, sizeof *ids);
    unsigned char *dups = calloc(N, 1);

    CHECK(specs && payloads && ids && dups);
    for (int i = 0; i < N; i++) {
        /* Characters COPY's text format must escape, and some it need not. */
        snprintf(payloads[i], sizeof payloads[i], "{\"n\": %d, \"s\": \"tab\\t nl\\n bs\\\\ q\\\" \\u00e9 é\"}\t\n", i);
        specs[i].payload = payloads[i];
        specs[i].opts.queue = i % 2 ? "odd" : "even";
        specs[i].opts.kind = i % 3 ? NULL : "third";
        specs[i].opts.priority = i % 7 - 3;
        specs[i].opts.max_attempts = i % 5;
    }
    memset(dups, 7, N);
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, ids, dups));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), N);
    for (int i = 0; i < N; i++)
        CHECK_INT(dups[i], 0);
    /* Each id is the job built from the same index, with every field as given. */
    PQclear(t_exec(pg, "CREATE TEMP TABLE given (i int, id bigint)"));
    char *array = malloc(N * 24 + 4);
    CHECK(array != NULL);
    size_t len = (size_t)sprintf(array, "{");
    for (int i = 0; i < N; i++)
        len += (size_t)sprintf(array + len, "%s%lld", i ? "," : "", (long long)ids[i]);
    sprintf(array + len, "}");
    const char *values[1] = {array};
    PGresult *r = PQexecParams(pg, "INSERT INTO given SELECT u.i - 1, u.id FROM unnest($1::bigint[])"
                                   " WITH ORDINALITY AS u(id, i)", 1, NULL, values, NULL, NULL, 0);
    CHECK_MSG(PQresultStatus(r) == PGRES_COMMAND_OK, "%s", PQerrorMessage(pg));
    PQclear(r);
    free(array);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM given g JOIN pgjobq.jobs j ON j.id = g.id"
                        " WHERE (j.payload->>'n')::int = g.i"
                        "   AND j.payload->>'s' = E'tab\\t nl\\n bs\\\\ q\" \\u00e9 \\u00e9'"
                        "   AND j.queue = CASE WHEN g.i %% 2 = 1 THEN 'odd' ELSE 'even' END"
                        "   AND j.kind = CASE WHEN g.i %% 3 = 0 THEN 'third' ELSE 'default' END"
                        "   AND j.priority = g.i %% 7 - 3"
                        "   AND j.max_attempts = CASE WHEN g.i %% 5 = 0 THEN 25 ELSE g.i %% 5 END"
                        "   AND j.state = 'queued' AND j.attempt = 0 AND j.run_at <= now()"),
              N);
    /* With run_at on every job, and without ids wanted. */
    for (int i = 0; i < N; i++)
        specs[i].opts.run_at = "2031-05-04 03:02:01+00";
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, NULL, NULL));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE run_at = '2031-05-04 03:02:01+00'"), N);
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT id) FROM pgjobq.jobs"), 2 * N);
    free(dups);
    free(ids);
    free(payloads);
    free(specs);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(enqueue_batch_with_copy_is_all_or_none_and_names_the_bad_job)
{
    enum { N = 1000 };
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job_spec *specs = calloc(N, sizeof *specs);
    int64_t *ids = calloc(N, sizeof *ids);

    CHECK(specs && ids);
    for (int i = 0; i < N; i++)
        specs[i].opts.run_at = "2030-01-01 00:00:00+00";
    /* Only the server can tell that this is not a time. */
    specs[700].opts.run_at = "soonish";
    CHECK_RC(c, pgjobq_enqueue_many(c, specs, N, ids, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "job 700") != NULL, "message: %s", pgjobq_errmsg(c));
    CHECK_INT(count_jobs(pg), 0);
    /* The client is usable afterwards (its transaction was rolled back). */
    specs[700].opts.run_at = "2030-01-01 00:00:00+00";
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, ids, NULL));
    CHECK_INT(count_jobs(pg), N);
    /* A batch that needs what COPY cannot do (a unique key) takes the other path, same answers. */
    specs[3].opts.unique_key = "only-one";
    specs[4].opts.unique_key = "only-one";
    unsigned char *dups = calloc(N, 1);
    CHECK(dups != NULL);
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, ids, dups));
    CHECK_INT(dups[3], 0);
    CHECK_INT(dups[4], 1);
    CHECK_INT(ids[4], ids[3]);
    CHECK_INT(count_jobs(pg), 2 * N - 1);
    free(dups);
    free(ids);
    free(specs);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(enqueue_batch_with_copy_joins_the_callers_transaction_and_notifies_at_commit)
{
    enum { N = 800 };
    PGconn *app = t_pg(), *other = t_pg(), *listener = t_pg();
    pgjobq_client *c = NULL;
    pgjobq_job_spec *specs = calloc(N, sizeof *specs);
    char queues[8][32];

    CHECK(specs != NULL);
    for (int i = 0; i < N; i++)
        specs[i].opts.queue = "bulk";
    PQclear(t_exec(listener, "LISTEN pgjobq"));
    CHECK_OK(c, pgjobq_client_wrap(&c, app));
    PQclear(t_exec(app, "BEGIN"));
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, NULL, NULL));
    CHECK_INT(PQtransactionStatus(app), PQTRANS_INTRANS);
    CHECK_INT(t_int(other, "SELECT count(*) FROM pgjobq.jobs"), 0);
    PQclear(t_exec(app, "ROLLBACK"));
    CHECK_INT(t_int(other, "SELECT count(*) FROM pgjobq.jobs"), 0);
    CHECK_INT(notifications(listener, 200, queues, 8), 0);
    PQclear(t_exec(app, "BEGIN"));
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, N, NULL, NULL));
    PQclear(t_exec(app, "COMMIT"));
    CHECK_INT(t_int(other, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'bulk'"), N);
    CHECK_INT(notifications(listener, 2000, queues, 8), 1);
    CHECK_STR(queues[0], "bulk");
    pgjobq_client_close(c);
    free(specs);
    PQfinish(app);
    PQfinish(other);
    PQfinish(listener);
}

/* Runs SQL that must fail with sqlstate, its message holding expect. */
static void sql_refused(PGconn *pg, const char *sql, const char *sqlstate, const char *expect)
{
    PGresult *r = PQexec(pg, sql);
    const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE), *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    CHECK_MSG(PQresultStatus(r) == PGRES_FATAL_ERROR, "accepted: %s", sql);
    CHECK_MSG(s && strcmp(s, sqlstate) == 0, "%s: SQLSTATE %s (%s), expected %s", sql, s ? s : "?", m ? m : "",
              sqlstate);
    CHECK_MSG(m && strstr(m, expect), "%s: message \"%s\" lacks \"%s\"", sql, m ? m : "", expect);
    PQclear(r);
}

/* A run_at far outside any sane range (year 99999, 4713 BC: a job due then made the queue's lag metric
 * 2e11 s) is refused by every SQL enqueue, naming the element, within 100 years of now as the
 * command's --delay; the schema's CHECK bounds what bypasses the functions (issue 23). */
TEST(enqueue_sql_refuses_a_run_at_far_outside_a_hundred_years)
{
    PGconn *pg = t_pg();

    sql_refused(pg, "SELECT pgjobq.enqueue(run_at => '99999-01-01 00:00:00+00')", "22023", "within 100 years");
    sql_refused(pg, "SELECT pgjobq.enqueue(run_at => '4713-01-01 00:00:00+00 BC')", "22023", "run_ats[1]");
    sql_refused(pg, "SELECT pgjobq.enqueue(run_at => now() + interval '101 years')", "22023", "within 100 years");
    sql_refused(pg, "SELECT pgjobq.enqueue(delay => interval '101 years')", "22023", "at most 100 years");
    sql_refused(pg, "SELECT pgjobq.enqueue(delay => interval '100000000 years')", "22023", "at most 100 years");
    sql_refused(pg,
                "SELECT * FROM pgjobq.enqueue_many(ARRAY['q', 'q'], NULL, NULL,"
                " run_ats => ARRAY[now(), '99999-01-01 00:00:00+00']::timestamptz[])",
                "22023", "run_ats[2]");
    sql_refused(pg,
                "SELECT * FROM pgjobq.enqueue_many(ARRAY['q', 'q'], NULL, NULL, delays => ARRAY[NULL, '200 "
                "years']::interval[])",
                "22023", "delays[2]");
    /* A job with tags or parents goes through the graph path. */
    sql_refused(pg, "SELECT pgjobq.enqueue(run_at => '4713-01-01 00:00:00+00 BC', tags => ARRAY['t'])", "22023",
                "within 100 years");
    sql_refused(pg, "SELECT pgjobq.enqueue(delay => interval '150 years', tags => ARRAY['t'])", "22023",
                "at most 100 years");
    /* Rows that bypass the functions (COPY, a graph, by hand): the schema's fixed range. */
    sql_refused(pg, "INSERT INTO pgjobq.jobs (run_at) VALUES ('99999-01-01 00:00:00+00')", "23514",
                "jobs_run_at_range");
    sql_refused(pg, "INSERT INTO pgjobq.jobs (run_at) VALUES ('4713-01-01 00:00:00+00 BC')", "23514",
                "jobs_run_at_range");
    CHECK_INT(count_jobs(pg), 0);
    /* Within the bounds: far, but accepted. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(run_at => now() + interval '99 years')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(run_at => now() - interval '99 years')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(delay => interval '99 years', tags => ARRAY['t'])"));
    PQclear(t_exec(
        pg, "SELECT * FROM pgjobq.enqueue_many(ARRAY['q'], NULL, NULL, delays => ARRAY['36500 days'::interval])"));
    CHECK_INT(count_jobs(pg), 4);
    PQfinish(pg);
}
