/*
 * test_workflows.c - jobs that wait for other jobs, against the real server: the fan-in race (500
 * parents completed at once by 8 workers), children enqueued while their parents complete, what a
 * parent's failure, cancel or retry does to its children, graphs (cycles, refs, all or nothing),
 * batches with a callback, retention of parents, progress fenced by the lease, tags, and the command
 * line (enqueue --after/--tag/--graph, show, graph, list --tag).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int64_t put(pgjobq_client *c, const char *queue, const char *kind, const int64_t *after, int on_failure)
{
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id = 0;

    o.queue = queue;
    o.kind = kind;
    o.after = after;
    o.on_parent_failure = on_failure;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    return id;
}

/* Claims one job of the queue; its id, or 0 when none was due.  *token receives its lease token. */
static int64_t claim_one(pgjobq_client *c, const char *queue, int64_t *token)
{
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t id = 0;

    CHECK_OK(c, pgjobq_claim(c, queue, 1, 60000, "t", &jobs, &n));
    if (n == 1) {
        id = jobs[0].id;
        if (token)
            *token = jobs[0].lease_token;
    }
    pgjobq_jobs_free(jobs);
    return id;
}

static char *state_of(PGconn *pg, int64_t id)
{
    return t_str(pg, "SELECT state FROM pgjobq.all_jobs WHERE id = %lld", (long long)id);
}

#define CHECK_STATE(pg, id, want)                                                                    \
    do {                                                                                             \
        char *s_ = state_of(pg, id);                                                                 \
        CHECK_MSG(strcmp(s_, want) == 0, "job %lld is %s, expected %s", (long long)(id), s_, want); \
        free(s_);                                                                                    \
    } while (0)

TEST(workflow_child_waits_for_every_parent_and_reads_their_results)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t t1 = 0, t2 = 0;

    int64_t p1 = put(c, "etl", "extract", NULL, 0), p2 = put(c, "etl", "extract", NULL, 0);
    int64_t after[] = {p1, p2, 0};
    int64_t child = put(c, "etl", "merge", after, 0);
    CHECK_STATE(pg, child, "waiting");
    CHECK_INT(t_int(pg, "SELECT pending_parents FROM pgjobq.jobs WHERE id = %lld", (long long)child), 2);

    /* Only the parents can be claimed. */
    CHECK_INT(claim_one(c, "etl", &t1), p1);
    CHECK_INT(claim_one(c, "etl", &t2), p2);
    CHECK_INT(claim_one(c, "etl", NULL), 0);
    CHECK_OK(c, pgjobq_job_complete(c, p1, t1, "{\"rows\": 10}"));
    CHECK_STATE(pg, child, "waiting");
    CHECK_INT(claim_one(c, "etl", NULL), 0);
    CHECK_OK(c, pgjobq_job_complete(c, p2, t2, "{\"rows\": 32}"));
    CHECK_STATE(pg, child, "queued");

    /* The child reads its parents' results (C API and SQL). */
    pgjobq_job *parents = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_job_parents(c, child, &parents, &n));
    CHECK_INT(n, 2);
    CHECK_INT(parents[0].id, p1);
    CHECK(parents[0].state == PGJOBQ_COMPLETED);
    CHECK_MSG(strcmp(parents[0].result, "{\"rows\": 10}") == 0, "result %s", parents[0].result);
    CHECK_MSG(strcmp(parents[1].result, "{\"rows\": 32}") == 0, "result %s", parents[1].result);
    pgjobq_jobs_free(parents);
    CHECK_INT(t_int(pg, "SELECT sum((result->>'rows')::int) FROM pgjobq.parents(%lld)", (long long)child), 42);

    int64_t tc = 0;
    CHECK_INT(claim_one(c, "etl", &tc), child);
    CHECK_OK(c, pgjobq_job_complete(c, child, tc, NULL));
    CHECK_STATE(pg, child, "completed");
    /* A job without parents has none; an unknown job has none either. */
    CHECK_OK(c, pgjobq_job_parents(c, p1, &parents, &n));
    CHECK_INT(n, 0);
    CHECK(parents == NULL);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* The fan-in race: 8 workers complete 500 parents at once; producers add children of parents that
 * are being completed. */
enum { FAN_PARENTS = 500, FAN_WORKERS = 8, FAN_PRODUCERS = 2, FAN_LATE = 100 };
static int64_t fan_parent[FAN_PARENTS];
static atomic_int fan_done, fan_errors;

static void *fan_worker(void *arg)
{
    (void)arg;
    pgjobq_client *c = NULL;
    if (pgjobq_client_open(&c, t_conninfo()) != PGJOBQ_OK) {
        atomic_fetch_add(&fan_errors, 1);
        pgjobq_client_close(c);
        return NULL;
    }
    for (int idle = 0; idle < 50;) {
        pgjobq_job *jobs = NULL;
        size_t n = 0;
        if (pgjobq_claim(c, "fan", 7, 60000, "w", &jobs, &n) != PGJOBQ_OK) {
            atomic_fetch_add(&fan_errors, 1);
            break;
        }
        idle = n ? 0 : idle + 1;
        for (size_t i = 0; i < n; i++) {
            if (pgjobq_job_complete(c, jobs[i].id, jobs[i].lease_token, "{\"ok\": true}") != PGJOBQ_OK)
                atomic_fetch_add(&fan_errors, 1);
            else
                atomic_fetch_add(&fan_done, 1);
        }
        pgjobq_jobs_free(jobs);
        if (n == 0) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    pgjobq_client_close(c);
    return NULL;
}

static void *fan_producer(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    pgjobq_client *c = NULL;
    if (pgjobq_client_open(&c, t_conninfo()) != PGJOBQ_OK) {
        atomic_fetch_add(&fan_errors, 1);
        pgjobq_client_close(c);
        return NULL;
    }
    for (int i = 0; i < FAN_LATE; i++) {
        pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
        int64_t after[3] = {fan_parent[rand_r(&seed) % FAN_PARENTS], fan_parent[rand_r(&seed) % FAN_PARENTS], 0};
        o.queue = "fan_late";
        o.after = after;
        int rc = pgjobq_enqueue(c, "{}", &o, NULL);
        /* A deadlock with a completion is retried like any 40P01. */
        if (rc == PGJOBQ_ECONFLICT)
            i--;
        else if (rc != PGJOBQ_OK)
            atomic_fetch_add(&fan_errors, 1);
    }
    pgjobq_client_close(c);
    return NULL;
}

TEST_FULL(workflow_fan_in_500_parents_8_workers_queue_the_child_exactly_once, 180, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pthread_t w[FAN_WORKERS], p[FAN_PRODUCERS];
    static int64_t after[FAN_PARENTS + 1];

    t_audit_install(pg);
    for (int i = 0; i < FAN_PARENTS; i++)
        fan_parent[i] = after[i] = put(c, "fan", "part", NULL, 0);
    after[FAN_PARENTS] = 0;
    int64_t child = put(c, "fan_child", "join", after, 0);
    CHECK_INT(t_int(pg, "SELECT pending_parents FROM pgjobq.jobs WHERE id = %lld", (long long)child), FAN_PARENTS);

    atomic_store(&fan_done, 0);
    atomic_store(&fan_errors, 0);
    for (int i = 0; i < FAN_WORKERS; i++)
        CHECK(pthread_create(&w[i], NULL, fan_worker, NULL) == 0);
    for (int i = 0; i < FAN_PRODUCERS; i++)
        CHECK(pthread_create(&p[i], NULL, fan_producer, (void *)(uintptr_t)(i + 1)) == 0);
    for (int i = 0; i < FAN_PRODUCERS; i++)
        pthread_join(p[i], NULL);
    for (int i = 0; i < FAN_WORKERS; i++)
        pthread_join(w[i], NULL);
    CHECK_INT(atomic_load(&fan_errors), 0);
    CHECK_INT(atomic_load(&fan_done), FAN_PARENTS);

    /* The child became queued exactly once, with its count at zero, and runs once. */
    CHECK_STATE(pg, child, "queued");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM public.job_audit WHERE job_id = %lld AND old_state = 'waiting'"
                        " AND new_state = 'queued'",
                    (long long)child),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM public.job_audit WHERE job_id = %lld AND new_state = 'waiting'",
                    (long long)child),
              FAN_PARENTS - 1);
    int64_t token = 0;
    CHECK_INT(claim_one(c, "fan_child", &token), child);
    CHECK_INT(claim_one(c, "fan_child", NULL), 0);
    CHECK_OK(c, pgjobq_job_complete(c, child, token, NULL));
    CHECK_INT(t_int(pg, "SELECT attempt FROM pgjobq.all_jobs WHERE id = %lld", (long long)child), 1);

    /* Children enqueued while their parents completed: none is left waiting, each released once. */
    long long late = t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'fan_late'");
    printf("%d late children; waiting at the end: %lld\n", FAN_PRODUCERS * FAN_LATE,
           t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'fan_late' AND state = 'waiting'"));
    CHECK_INT(late, FAN_PRODUCERS * FAN_LATE);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'fan_late' AND state <> 'queued'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM public.job_audit a JOIN pgjobq.jobs j ON j.id = a.job_id"
                        " WHERE j.queue = 'fan_late' AND a.new_state = 'queued'"
                        " GROUP BY a.job_id ORDER BY count(*) DESC LIMIT 1"),
              1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(workflow_parent_failure_cancels_children_unless_they_run_anyway_and_a_retry_releases_nothing)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t tok = 0;
    pgjobq_state st;

    int64_t parent = put(c, "f", "p", NULL, 0);
    int64_t a1[] = {parent, 0};
    int64_t cancel_child = put(c, "f", "c", a1, PGJOBQ_PARENT_FAILURE_CANCEL);
    int64_t run_child = put(c, "f", "r", a1, PGJOBQ_PARENT_FAILURE_RUN);
    int64_t a2[] = {cancel_child, 0};
    int64_t grandchild = put(c, "f", "g", a2, PGJOBQ_PARENT_FAILURE_RUN);

    /* A failed attempt that will be retried releases nothing. */
    CHECK_INT(claim_one(c, "f", &tok), parent);
    CHECK_OK(c, pgjobq_job_fail(c, parent, tok, "transient", 0, 0, &st));
    CHECK(st == PGJOBQ_QUEUED);
    CHECK_STATE(pg, cancel_child, "waiting");
    CHECK_STATE(pg, run_child, "waiting");
    CHECK_INT(t_int(pg, "SELECT pending_parents FROM pgjobq.jobs WHERE id = %lld", (long long)run_child), 1);

    /* Failing for good: the default cancels the child, which finishes its own children as cancelled
     * parents do (the grandchild runs anyway); the other child runs. */
    CHECK_INT(claim_one(c, "f", &tok), parent);
    CHECK_OK(c, pgjobq_job_fail(c, parent, tok, "broken", 0, PGJOBQ_FAIL_PERMANENT, &st));
    CHECK(st == PGJOBQ_FAILED);
    CHECK_STATE(pg, cancel_child, "cancelled");
    char *why = t_str(pg, "SELECT last_error FROM pgjobq.all_jobs WHERE id = %lld", (long long)cancel_child);
    char want[64];
    snprintf(want, sizeof want, "parent job %lld failed", (long long)parent);
    CHECK_MSG(strstr(why, want) != NULL, "last_error: %s", why);
    free(why);
    CHECK_STATE(pg, run_child, "queued");
    CHECK_STATE(pg, grandchild, "queued");

    /* A cancelled parent (cancelled while queued, by an operator) cancels a chain of children. */
    int64_t q = put(c, "g", "p", NULL, 0);
    int64_t b1[] = {q, 0};
    int64_t k1 = put(c, "g", "c", b1, 0);
    int64_t b2[] = {k1, 0};
    int64_t k2 = put(c, "g", "c", b2, 0);
    CHECK_OK(c, pgjobq_job_cancel(c, q, &st));
    CHECK_STATE(pg, k1, "cancelled");
    CHECK_STATE(pg, k2, "cancelled");

    /* A waiting job can be cancelled itself; a running parent cancelled by its worker ends its
     * children too. */
    int64_t r = put(c, "h", "p", NULL, 0);
    int64_t c1[] = {r, 0};
    int64_t w1 = put(c, "h", "c", c1, 0);
    int64_t w2 = put(c, "h", "c", c1, 0);
    CHECK_OK(c, pgjobq_job_cancel(c, w1, &st));
    CHECK_STATE(pg, w1, "cancelled");
    CHECK_INT(claim_one(c, "h", &tok), r);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.cancel_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[])"
                        " WHERE outcome = 'cancelled'",
                    (long long)r, (long long)tok),
              1);
    CHECK_STATE(pg, w2, "cancelled");

    /* A parent whose lease expires with no attempt left fails, and its child is cancelled. */
    int64_t x = put(c, "i", "p", NULL, 0);
    int64_t d1[] = {x, 0};
    int64_t y = put(c, "i", "c", d1, 0);
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET max_attempts = 1 WHERE id = %lld", (long long)x));
    CHECK_INT(claim_one(c, "i", &tok), x);
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 s' WHERE id = %lld", (long long)x));
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(100)"), 1);
    CHECK_STATE(pg, x, "failed");
    CHECK_STATE(pg, y, "cancelled");
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(workflow_enqueue_graph_refuses_cycles_and_bad_refs_and_writes_all_or_nothing)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t ids[8];
    size_t n = 0;

    static const char *const bad[][2] = {
        {"[{\"ref\":\"a\",\"after\":[\"c\"]},{\"ref\":\"b\",\"after\":[\"a\"]},{\"ref\":\"c\",\"after\":[\"b\"]}]",
         "cycle"},
        {"[{\"ref\":\"a\",\"after\":[\"a\"]}]", "after itself"},
        {"[{\"ref\":\"a\"},{\"ref\":\"b\",\"after\":[\"nope\"]}]", "no job of the graph"},
        {"[{\"ref\":\"a\"},{\"ref\":\"a\"}]", "two jobs have the ref"},
        {"[{\"ref\":\"a\",\"after\":[987654321]}]", "job 987654321 cannot be a parent here"},
        {"[{\"queue\":\"ok\"},{\"queue\":\"1bad\"}]", "job 1: \"queue\""},
        {"[{\"unique_key\":\"k\"}]", "job 0: a job with parents or tags, or in a graph, cannot have a unique key"},
        {"[{\"unique_key\":null}]", "cannot have a unique key"},
        {"[{\"run_at\":\"infinity\"}]", "job 0: \"run_at\" is infinity: run_at must be within 100 years of now"},
        {"[{\"delay\":1e300}]", "job 0: \"delay\" is"},
        {"[{\"delay\":\"5s\"}]", "\"delay\" must be a number of seconds"},
        {"[{\"priority\":1000}]", "priority"},
        {"[{\"tags\":[]}]", "tags"},
        {"[{\"on_parent_failure\":\"maybe\"}]", "on_parent_failure"},
        {"{\"nodes\":[]}", "array of jobs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_RC(c, pgjobq_enqueue_graph(c, bad[i][0], ids, 8, &n), PGJOBQ_EINVAL);
        CHECK_MSG(strstr(pgjobq_errmsg(c), bad[i][1]) != NULL, "graph %zu: %s", i, pgjobq_errmsg(c));
    }
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.deps"), 0);

    /* A diamond: a -> (b, c) -> d, enqueued at once. */
    CHECK_OK(c, pgjobq_enqueue_graph(c,
                                     "{\"jobs\":[{\"ref\":\"d\",\"kind\":\"join\",\"after\":[\"b\",\"c\"]},"
                                     "{\"ref\":\"b\",\"after\":[\"a\"],\"tags\":[\"diamond\"]},"
                                     "{\"ref\":\"c\",\"after\":[\"a\"]},{\"ref\":\"a\",\"payload\":{\"n\":1}}]}",
                                     ids, 8, &n));
    CHECK_INT(n, 4);
    CHECK_STATE(pg, ids[3], "queued");
    CHECK_STATE(pg, ids[0], "waiting");
    CHECK_INT(t_int(pg, "SELECT pending_parents FROM pgjobq.jobs WHERE id = %lld", (long long)ids[0]), 2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.graph(%lld)", (long long)ids[3]), 4);
    CHECK_INT(t_int(pg, "SELECT depth FROM pgjobq.graph(%lld) WHERE id = %lld", (long long)ids[3], (long long)ids[0]),
              2);

    /* Inside the caller's transaction: rolled back, nothing of the graph remains. */
    long long before = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs");
    CHECK_OK(c, pgjobq_begin(c));
    int64_t after[] = {ids[0], 0};
    put(c, "default", "later", after, 0);
    CHECK_OK(c, pgjobq_enqueue_graph(c, "[{\"ref\":\"x\"},{\"after\":[\"x\"]}]", ids + 4, 4, &n));
    CHECK_OK(c, pgjobq_rollback(c));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), before);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.deps"), 4);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* A chain of n jobs in queue "long" (job i after job i - 1), as graph JSON; with `cycle`, the last two
 * jobs are each after the other as well.  The caller frees it. */
static char *chain_json(int n, int cycle)
{
    size_t cap = (size_t)n * 48 + 64, len = 0;
    char *s = malloc(cap);

    CHECK(s != NULL);
    len += (size_t)snprintf(s + len, cap - len, "[{\"queue\":\"long\"}");
    for (int i = 1; i < n; i++) {
        if (cycle && i == n - 2)
            len += (size_t)snprintf(s + len, cap - len, ",{\"queue\":\"long\",\"after\":[\"%d\",\"%d\"]}", i - 1, n - 1);
        else
            len += (size_t)snprintf(s + len, cap - len, ",{\"queue\":\"long\",\"after\":[\"%d\"]}", i - 1);
    }
    snprintf(s + len, cap - len, "]");
    return s;
}

/* The cycle check is linear (Kahn's algorithm over arrays): a chain of 10,000 jobs, the most a graph
 * may hold, is accepted (it took minutes with the check it replaced), and a cycle at the far end of
 * one is found.  No timing is asserted; the test's own timeout is the bound. */
TEST_FULL(workflow_enqueue_graph_takes_a_10000_job_chain_and_finds_a_cycle_at_its_end, 120, 0)
{
    enum { N = 10000 };
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t *ids = calloc(N, sizeof *ids);
    size_t n = 0;

    CHECK(ids != NULL);
    char *cyclic = chain_json(N, 1);
    CHECK_RC(c, pgjobq_enqueue_graph(c, cyclic, ids, N, &n), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "the graph has a cycle through job \"9998\"") != NULL, "%s", pgjobq_errmsg(c));
    free(cyclic);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.deps"), 0);

    char *chain = chain_json(N, 0);
    CHECK_OK(c, pgjobq_enqueue_graph(c, chain, ids, N, &n));
    free(chain);
    CHECK_INT(n, N);
    CHECK_STATE(pg, ids[0], "queued");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'long' AND state = 'waiting'"
                        " AND pending_parents = 1"),
              N - 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.deps d JOIN pgjobq.jobs p ON p.id = d.parent"
                        " JOIN pgjobq.jobs k ON k.id = d.child WHERE k.id = p.id + 1 AND p.has_children"),
              N - 1);
    CHECK_INT(ids[N - 1] - ids[0], N - 1);

    /* The bound on a graph's edges: more than 100,000 parents in all is refused, and writes nothing. */
    size_t cap = 11 * (N * 4 + 32) + 8, len = 0;
    char *wide = malloc(cap);
    CHECK(wide != NULL);
    len += (size_t)snprintf(wide + len, cap - len, "[{\"ref\":\"r\"}");
    for (int j = 0; j < 11; j++) {
        len += (size_t)snprintf(wide + len, cap - len, ",{\"after\":[\"r\"");
        for (int i = 1; i < N; i++)
            len += (size_t)snprintf(wide + len, cap - len, ",\"r\"");
        len += (size_t)snprintf(wide + len, cap - len, "]}");
    }
    snprintf(wide + len, cap - len, "]");
    CHECK_RC(c, pgjobq_enqueue_graph(c, wide, NULL, 0, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "more than 100000 parents") != NULL, "%s", pgjobq_errmsg(c));
    free(wide);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), N);
    free(ids);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(workflow_batch_callback_runs_once_with_the_counts)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t tok = 0;

    long long batch = t_int(pg, "SELECT batch_id FROM pgjobq.enqueue_batch("
                                "'[{\"queue\":\"b\"},{\"queue\":\"b\"},{\"queue\":\"b\"},{\"queue\":\"b\"},{\"queue\":\"b\"}]',"
                                " '{\"queue\":\"cb\",\"kind\":\"report\",\"payload\":{\"to\":\"ops\"}}')");
    CHECK_STATE(pg, batch, "waiting");
    for (int i = 0; i < 5; i++) {
        int64_t id = claim_one(c, "b", &tok);
        CHECK(id != 0);
        CHECK_INT(claim_one(c, "cb", NULL), 0);
        if (i < 3)
            CHECK_OK(c, pgjobq_job_complete(c, id, tok, NULL));
        else
            CHECK_OK(c, pgjobq_job_fail(c, id, tok, "no", 0, PGJOBQ_FAIL_PERMANENT, NULL));
    }
    CHECK_STATE(pg, batch, "queued");
    char *payload = t_str(pg, "SELECT payload::text FROM pgjobq.jobs WHERE id = %lld", batch);
    char want[160];
    snprintf(want, sizeof want,
             "{\"to\": \"ops\", \"batch\": {\"id\": %lld, \"jobs\": 5, \"failed\": 2, \"cancelled\": 0, \"completed\": 3}}",
             batch);
    CHECK_MSG(strcmp(payload, want) == 0, "payload %s", payload);
    free(payload);
    CHECK_INT(claim_one(c, "cb", &tok), batch);
    CHECK_INT(claim_one(c, "cb", NULL), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(workflow_retention_keeps_a_parent_while_a_child_waits_on_it)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t tok = 0;

    int64_t parent = put(c, "r", "p", NULL, 0), other = put(c, "r2", "p", NULL, 0), lone = put(c, "r", "x", NULL, 0);
    int64_t after[] = {parent, other, 0};
    int64_t child = put(c, "rc", "c", after, 0);
    for (int i = 0; i < 2; i++) {
        int64_t id = claim_one(c, "r", &tok);
        CHECK(id == parent || id == lone);
        CHECK_OK(c, pgjobq_job_complete(c, id, tok, "{\"kept\": true}"));
    }
    /* Both finished three hours ago, in an hour that has a partition of its own. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.history_partition_create(now() - interval '3 hours')::int"), 1);
    PQclear(t_exec(pg, "UPDATE pgjobq.history SET finished_at = now() - interval '3 hours' WHERE id IN (%lld, %lld)",
                   (long long)parent, (long long)lone));
    CHECK(t_int(pg, "SELECT pgjobq.prune('1 hour', '7 days', 1000)") >= 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld", (long long)lone), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld", (long long)parent), 1);
    t_int(pg, "SELECT pgjobq.prune('1 hour', '7 days', 1000)");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld", (long long)parent), 1);

    /* The other parent completes: the child no longer waits, and the parent may go. */
    int64_t id = claim_one(c, "r2", &tok);
    CHECK_INT(id, other);
    CHECK_OK(c, pgjobq_job_complete(c, id, tok, NULL));
    CHECK_STATE(pg, child, "queued");
    CHECK_INT(t_int(pg, "SELECT (result->>'kept' = 'true')::int FROM pgjobq.parents(%lld) WHERE id = %lld",
                    (long long)child, (long long)parent),
              1);
    t_int(pg, "SELECT pgjobq.prune('1 hour', '7 days', 1000)");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld", (long long)parent), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.parents(%lld) WHERE state = 'pruned'", (long long)child), 1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(workflow_progress_is_fenced_by_the_lease_token_and_kept_in_history)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t tok = 0, tok2 = 0;
    pgjobq_job *j = NULL;

    int64_t id = put(c, "p", "long", NULL, 0);
    CHECK_INT(claim_one(c, "p", &tok), id);
    CHECK_OK(c, pgjobq_job_progress(c, id, tok, "{\"done\": 40, \"of\": 100}"));
    CHECK_RC(c, pgjobq_job_progress(c, id, tok, "{not json"), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_job_progress(c, id, tok + 1, "{\"done\": 99}"), PGJOBQ_ELEASE);
    /* The lease expires and another worker takes the job: the first holder can no longer write. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 s' WHERE id = %lld", (long long)id));
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(100)"), 1);
    CHECK_INT(claim_one(c, "p", &tok2), id);
    CHECK_RC(c, pgjobq_job_progress(c, id, tok, "{\"done\": 41}"), PGJOBQ_ELEASE);
    CHECK_OK(c, pgjobq_job_get(c, id, &j));
    CHECK_MSG(strcmp(j->progress, "{\"of\": 100, \"done\": 40}") == 0, "progress %s", j->progress);
    pgjobq_jobs_free(j);
    CHECK_OK(c, pgjobq_job_progress(c, id, tok2, "{\"done\": 100, \"of\": 100}"));
    CHECK_OK(c, pgjobq_job_complete(c, id, tok2, NULL));
    CHECK_INT(t_int(pg, "SELECT (progress->>'done')::int FROM pgjobq.history WHERE id = %lld", (long long)id), 100);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(workflow_tags_find_jobs_live_and_finished_through_an_index)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    const char *tags[] = {"tenant:42", "import", NULL};
    pgjobq_job_spec specs[3];
    int64_t ids[3], tok = 0;

    o.queue = "t";
    o.tags = tags;
    o.concurrency_key = "tenant-42";
    memset(specs, 0, sizeof specs);
    for (int i = 0; i < 3; i++) {
        specs[i].payload = "{}";
        specs[i].opts = o;
    }
    specs[2].opts.tags = NULL; /* one untagged job in the batch */
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 3, ids, NULL));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue) SELECT 'bulk' FROM generate_series(1, 3000)"));
    PQclear(t_exec(pg, "ANALYZE pgjobq.jobs"));
    PGresult *r = t_exec(pg, "EXPLAIN SELECT id FROM pgjobq.jobs WHERE tags @> ARRAY['import']");
    int uses_index = 0;
    for (int i = 0; i < PQntuples(r); i++)
        uses_index |= strstr(PQgetvalue(r, i, 0), "jobs_tags_idx") != NULL;
    PQclear(r);
    CHECK_MSG(uses_index, "the tag lookup does not use jobs_tags_idx");

    /* One finishes (tags and concurrency key go to history with it, and come back on a retry). */
    CHECK_INT(claim_one(c, "t", &tok), ids[0]);
    CHECK_OK(c, pgjobq_job_complete(c, ids[0], tok, NULL));
    pgjobq_list_opts lo = PGJOBQ_LIST_OPTS_INIT;
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    lo.tag = "tenant:42";
    CHECK_OK(c, pgjobq_job_list(c, &lo, &jobs, &n));
    CHECK_INT(n, 2);
    CHECK_INT(jobs[0].id, ids[1]);
    CHECK_INT(jobs[1].id, ids[0]);
    CHECK(jobs[1].state == PGJOBQ_COMPLETED);
    CHECK_MSG(strcmp(jobs[1].tags, "[\"import\", \"tenant:42\"]") == 0, "tags %s", jobs[1].tags);
    pgjobq_jobs_free(jobs);
    CHECK_OK(c, pgjobq_job_retry(c, ids[0]));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND tags = '{import,tenant:42}'"
                        " AND concurrency_key = 'tenant-42'",
                    (long long)ids[0]),
              1);

    /* Bad tags write nothing. */
    const char *too_long[] = {"0123456789012345678901234567890123456789012345678901234567890123456789", NULL};
    o.tags = too_long;
    CHECK_RC(c, pgjobq_enqueue(c, "{}", &o, NULL), PGJOBQ_EINVAL);
    o.tags = tags;
    o.unique_key = "u";
    CHECK_RC(c, pgjobq_enqueue(c, "{}", &o, NULL), PGJOBQ_EINVAL);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'"), 3);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(workflow_cli_enqueue_after_show_graph_and_list_by_tag)
{
    char *out = NULL, *err = NULL;
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();

    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "cli", "--tag", "nightly", "{\"n\": 1}", NULL), 0);
    long long a = atoll(out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "cli", "{\"n\": 2}", NULL), 0);
    long long b = atoll(out);
    free(out);
    free(err);
    char after[64];
    snprintf(after, sizeof after, "%lld,%lld", a, b);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "cli", "--kind", "join", "--after", after,
                    "--on-parent-failure", "run", "--tag", "nightly", NULL),
              0);
    long long child = atoll(out);
    free(out);
    free(err);

    /* Bad input: a clear message, a usage exit status, nothing written. */
    long long jobs = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs");
    CHECK_INT(t_cli(NULL, &err, NULL, 0, "enqueue", "--after", "1,x", NULL), 64);
    CHECK_MSG(strstr(err, "not a list of job ids") != NULL, "%s", err);
    free(err);
    CHECK_INT(t_cli(NULL, &err, NULL, 0, "enqueue", "--on-parent-failure", "run", NULL), 64);
    free(err);
    CHECK_INT(t_cli(NULL, &err, NULL, 0, "enqueue", "--after", "987654321", NULL), 65);
    CHECK_MSG(strstr(err, "job 987654321 cannot be a parent here") != NULL, "%s", err);
    free(err);
    static const char cyclic[] = "[{\"ref\":\"a\",\"after\":[\"b\"]},{\"ref\":\"b\",\"after\":[\"a\"]}]";
    CHECK_INT(t_cli(NULL, &err, cyclic, strlen(cyclic), "enqueue", "--graph", "-", NULL), 65);
    CHECK_MSG(strstr(err, "cycle") != NULL && strstr(err, "nothing from - was enqueued") != NULL, "%s", err);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), jobs);

    /* A graph from stdin: ids in input order. */
    static const char graph[] = "[{\"ref\":\"x\",\"queue\":\"cli\"},{\"after\":[\"x\"],\"queue\":\"cli\"}]";
    CHECK_INT(t_cli(&out, &err, graph, strlen(graph), "enqueue", "--graph", "-", NULL), 0);
    long long gx = 0, gy = 0;
    CHECK(sscanf(out, "%lld\n%lld", &gx, &gy) == 2 && gy == gx + 1);
    free(out);
    free(err);
    CHECK_STATE(pg, gy, "waiting");

    /* Complete the first parent with a result; show lists parents (with results) and children. */
    int64_t tok = 0;
    CHECK_INT(claim_one(c, "cli", &tok), a);
    CHECK_OK(c, pgjobq_job_complete(c, a, tok, "{\"sum\": 7}"));
    char id_s[24];
    snprintf(id_s, sizeof id_s, "%lld", child);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", id_s, NULL), 0);
    char want[96];
    snprintf(want, sizeof want, "parents:       %lld completed result {\"sum\": 7}", a);
    CHECK_MSG(strstr(out, want) != NULL && strstr(out, "state:         waiting") != NULL &&
                  strstr(out, "tags:          [\"nightly\"]") != NULL,
              "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--json", id_s, NULL), 0);
    snprintf(want, sizeof want, "\"parents\":[{\"id\":%lld,\"state\":\"completed\",\"result\":{\"sum\": 7}}", a);
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    free(out);
    free(err);
    snprintf(id_s, sizeof id_s, "%lld", a);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", id_s, NULL), 0);
    snprintf(want, sizeof want, "children:      %lld waiting join", child);
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    free(out);
    free(err);

    /* graph: by depth, the child indented under its parents, with its parents named. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "graph", id_s, NULL), 0);
    char l1[64], l3[96];
    snprintf(l1, sizeof l1, "#%lld completed cli/default  <\n", a);
    snprintf(l3, sizeof l3, "  #%lld waiting cli/join  after #%lld #%lld\n", child, a, b);
    CHECK_MSG(strstr(out, l1) == out && strstr(out, l3) != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(NULL, &err, NULL, 0, "graph", "987654321", NULL), 65); /* as show: an unknown id is bad input */
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "list", "--tag", "nightly", NULL), 0);
    CHECK_MSG(strstr(out, "waiting") != NULL && strstr(out, "completed") != NULL, "%s", out);
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    CHECK_INT(lines, 3); /* the header and two jobs */
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"waiting\":2") != NULL, "%s", out);
    free(out);
    free(err);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* A child's claim carries its parents' states and results: in pgjobq_job.parents, in the
 * environment of an --exec command (PGJOBQ_PARENTS), and in the job line of a coprocess. */
static pid_t wf_worker;
static void stop_wf_worker(void)
{
    if (wf_worker > 0) {
        kill(wf_worker, SIGTERM);
        t_wait_exit(wf_worker, 10000);
        wf_worker = 0;
    }
}

static int64_t child_of_two(pgjobq_client *c, const char *queue, int64_t *p1, int64_t *p2)
{
    int64_t tok = 0;
    *p1 = put(c, "parents", "p", NULL, 0);
    *p2 = put(c, "parents", "p", NULL, 0);
    int64_t after[] = {*p1, *p2, 0};
    int64_t child = put(c, queue, "c", after, PGJOBQ_PARENT_FAILURE_RUN);
    CHECK_INT(claim_one(c, "parents", &tok), *p1);
    CHECK_OK(c, pgjobq_job_complete(c, *p1, tok, "{\"rows\": 5}"));
    CHECK_INT(claim_one(c, "parents", &tok), *p2);
    CHECK_OK(c, pgjobq_job_fail(c, *p2, tok, "no", 0, PGJOBQ_FAIL_PERMANENT, NULL));
    return child;
}

static long long wf_done_id;
static int wf_done(void *arg)
{
    return t_int((PGconn *)arg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'completed'",
                 wf_done_id) == 1;
}

TEST_FULL(workflow_claimed_child_gets_its_parents_results_in_c_exec_and_coproc, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t p1, p2, tok = 0;
    char want[160];
    pgjobq_job *jobs = NULL;
    size_t n = 0;

    /* C: the claimed job. */
    int64_t child = child_of_two(c, "kids", &p1, &p2);
    CHECK_OK(c, pgjobq_claim(c, "kids", 1, 60000, "t", &jobs, &n));
    CHECK_INT(n, 1);
    snprintf(want, sizeof want,
             "[{\"id\": %lld, \"state\": \"completed\", \"result\": {\"rows\": 5}}, {\"id\": %lld, \"state\": "
             "\"failed\", \"result\": null}]",
             (long long)p1, (long long)p2);
    CHECK_MSG(jobs[0].id == child && jobs[0].parents && strcmp(jobs[0].parents, want) == 0, "parents %s",
              jobs[0].parents ? jobs[0].parents : "(null)");
    tok = jobs[0].lease_token;
    pgjobq_jobs_free(jobs);
    CHECK_OK(c, pgjobq_job_complete(c, child, tok, NULL));
    /* A job without parents has none. */
    put(c, "plain", "x", NULL, 0);
    CHECK_OK(c, pgjobq_claim(c, "plain", 1, 60000, "t", &jobs, &n));
    CHECK(n == 1 && jobs[0].parents == NULL);
    pgjobq_jobs_free(jobs);

    /* --exec: $PGJOBQ_PARENTS; the command prints it, which makes it the job's result. */
    wf_done_id = child_of_two(c, "kids_exec", &p1, &p2);
    const char *script = t_script("echo_parents.sh", "printf '%s' \"$PGJOBQ_PARENTS\"");
    wf_worker = t_spawn(t_log_path("exec"), NULL, "work", "--queue", "kids_exec", "--exec", script, NULL);
    t_defer(stop_wf_worker);
    CHECK_MSG(t_wait_until(wf_done, pg, 20000), "the --exec child did not complete");
    stop_wf_worker();
    CHECK_INT(t_int(pg, "SELECT (result->0->'result'->>'rows')::int FROM pgjobq.history WHERE id = %lld", wf_done_id),
              5);

    /* --coproc: a "parents" field in the job line. */
    wf_done_id = child_of_two(c, "kids_coproc", &p1, &p2);
    const char *handler = t_script("coproc_parents.sh",
                                   "exec /usr/bin/python3 -c 'import json, sys\n"
                                   "for line in sys.stdin:\n"
                                   "    job = json.loads(line)\n"
                                   "    if \"id\" not in job:\n"
                                   "        continue\n"
                                   "    print(json.dumps({\"id\": job[\"id\"], \"status\": \"completed\",\n"
                                   "                      \"result\": {\"parents\": job.get(\"parents\")}}), flush=True)\n"
                                   "'");
    wf_worker = t_spawn(t_log_path("coproc"), NULL, "work", "--queue", "kids_coproc", "--coproc", handler, NULL);
    if (!t_wait_until(wf_done, pg, 20000)) {
        t_show_log(t_log_path("coproc"));
        t_fail(__FILE__, __LINE__, "the coprocess child did not complete");
    }
    stop_wf_worker();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld"
                        " AND result->'parents'->1->>'state' = 'failed' AND result->'parents'->0->>'id' = '%lld'",
                    wf_done_id, (long long)p1),
              1);
    PQfinish(pg);
    pgjobq_client_close(c);
}
