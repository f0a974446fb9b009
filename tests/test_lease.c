/*
 * test_lease.c - leases on database time, expiry, re-claim, fencing of the old holder, heartbeats,
 * and the rescuer's guard.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static PGconn *cond_pg;
static long long cond_id;

static int lease_expired(void *arg)
{
    (void)arg;
    return t_int(cond_pg, "SELECT (lease_until < now())::int FROM pgjobq.all_jobs WHERE id = %lld", cond_id) == 1;
}

static void wait_expired(PGconn *pg, int64_t id)
{
    cond_pg = pg;
    cond_id = id;
    CHECK_MSG(t_wait_until(lease_expired, NULL, 10000), "lease of job %lld did not expire", (long long)id);
}

static pgjobq_job *claim_one(pgjobq_client *c, int64_t lease_ms, const char *worker)
{
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_claim(c, "default", 1, lease_ms, worker, &jobs, &n));
    CHECK_INT(n, 1);
    return jobs;
}

TEST(lease_is_database_now_plus_lease)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t id;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    pgjobq_job *j = claim_one(c, 45000, "w");
    /* started_at and lease_until come from the claim's own now(): exact, whatever the client's clock. */
    CHECK_INT(t_int(pg, "SELECT (lease_until = started_at + interval '45 s')::int FROM pgjobq.all_jobs WHERE id = %lld",
                    (long long)id),
              1);
    CHECK_INT(j->lease_until - j->started_at, 45000000);
    /* A heartbeat moves it to the heartbeat's own now() + lease. */
    CHECK_OK(c, pgjobq_job_extend(c, j->id, j->lease_token, 600000));
    CHECK_INT(t_int(pg, "SELECT (lease_until - started_at >= interval '600 s')::int FROM pgjobq.all_jobs WHERE id = %lld",
                    (long long)id),
              1);
    pgjobq_jobs_free(j);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(lease_expiry_lets_another_worker_claim_and_fences_the_old_one)
{
    pgjobq_client *old = t_client(), *fresh = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *j1, *j2;
    int rescued = 0;
    int64_t id;

    CHECK_OK(old, pgjobq_enqueue(old, "{\"x\": 1}", NULL, &id));
    j1 = claim_one(old, 300, "old-worker");
    CHECK_INT(j1->attempt, 1);
    wait_expired(pg, id);

    /* Expired but not yet rescued: the old holder already cannot write. */
    CHECK_RC(old, pgjobq_job_complete(old, id, j1->lease_token, "{\"late\": true}"), PGJOBQ_ELEASE);
    CHECK_RC(old, pgjobq_job_extend(old, id, j1->lease_token, 30000), PGJOBQ_ELEASE);

    CHECK_OK(fresh, pgjobq_rescue_expired(fresh, 100, &rescued));
    CHECK_INT(rescued, 1);
    j2 = claim_one(fresh, 60000, "new-worker");
    CHECK_INT(j2->id, id);
    CHECK_INT(j2->attempt, 2);
    CHECK(j2->lease_token != j1->lease_token);
    CHECK(j2->last_error != NULL && strstr(j2->last_error, "lease expired") != NULL);

    /* Every write by the old holder is refused with its own code and changes nothing. */
    CHECK_RC(old, pgjobq_job_complete(old, id, j1->lease_token, "{\"late\": true}"), PGJOBQ_ELEASE);
    CHECK_RC(old, pgjobq_job_fail(old, id, j1->lease_token, "late failure", 0, 0, NULL), PGJOBQ_ELEASE);
    CHECK_RC(old, pgjobq_job_fail(old, id, j1->lease_token, "late failure", 0, PGJOBQ_FAIL_PERMANENT, NULL),
             PGJOBQ_ELEASE);
    CHECK_RC(old, pgjobq_job_extend(old, id, j1->lease_token, 30000), PGJOBQ_ELEASE);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'running' AND attempt = 2"
                    " AND worker_id = 'new-worker' AND result IS NULL AND lease_token = %lld",
                    (long long)id, (long long)j2->lease_token),
              1);

    /* The new holder completes normally. */
    CHECK_OK(fresh, pgjobq_job_complete(fresh, id, j2->lease_token, "{\"ok\": true}"));
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'"
                    " AND result = '{\"ok\": true}'",
                    (long long)id),
              1);
    pgjobq_jobs_free(j1);
    pgjobq_jobs_free(j2);
    PQfinish(pg);
    pgjobq_client_close(old);
    pgjobq_client_close(fresh);
}

/* After a failover to an asynchronous standby the new primary may lack a claim the old one made (and
 * the old holder may still be running).  The row then looks as it did before that claim: the next claim
 * must not give out the same token, or the old holder would pass the fencing check of a lease it never
 * had.  The lost claim is reproduced by putting the row back as it was before it.  (Tokens are random:
 * the same one comes back with a chance of 2^-62.) */
TEST(lease_token_is_not_given_out_again_after_the_database_lost_a_claim)
{
    pgjobq_client *old = t_client(), *fresh = t_client();
    PGconn *pg = t_pg();
    int64_t id;

    CHECK_OK(old, pgjobq_enqueue(old, "{}", NULL, &id));
    pgjobq_job *j1 = claim_one(old, 60000, "old-primary-worker");
    PQclear(t_exec(pg,
                   "UPDATE pgjobq.jobs SET state = 'queued', attempt = 0, lease_token = 0, lease_until = NULL,"
                   " started_at = NULL, worker_id = NULL WHERE id = %lld",
                   (long long)id));
    pgjobq_job *j2 = claim_one(fresh, 60000, "new-primary-worker");
    CHECK_INT(j2->id, id);
    CHECK_INT(j2->attempt, 1);
    CHECK_MSG(j2->lease_token != j1->lease_token, "token %lld given out twice", (long long)j1->lease_token);
    CHECK_RC(old, pgjobq_job_complete(old, id, j1->lease_token, "{\"stale\": true}"), PGJOBQ_ELEASE);
    CHECK_RC(old, pgjobq_job_extend(old, id, j1->lease_token, 30000), PGJOBQ_ELEASE);
    CHECK_OK(fresh, pgjobq_job_complete(fresh, id, j2->lease_token, NULL));
    pgjobq_jobs_free(j1);
    pgjobq_jobs_free(j2);
    PQfinish(pg);
    pgjobq_client_close(old);
    pgjobq_client_close(fresh);
}

TEST(lease_rescue_never_touches_a_completed_job_and_respects_attempts)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int rescued = -1;
    int64_t done_id, last_id;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &done_id));
    pgjobq_job *j = claim_one(c, 300, "w");
    CHECK_OK(c, pgjobq_job_complete(c, j->id, j->lease_token, NULL));
    pgjobq_jobs_free(j);

    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &last_id));
    j = claim_one(c, 300, "w");
    wait_expired(pg, last_id);
    CHECK_OK(c, pgjobq_rescue_expired(c, 100, &rescued));
    CHECK_INT(rescued, 1);
    /* Its only attempt was used up by the lost run: failed, not queued. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'failed'", (long long)last_id),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'", (long long)done_id),
              1);
    CHECK_OK(c, pgjobq_rescue_expired(c, 100, &rescued));
    CHECK_INT(rescued, 0);
    pgjobq_jobs_free(j);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(lease_heartbeat_keeps_a_job_past_its_first_lease)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int rescued = -1;
    int64_t id;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    pgjobq_job *j = claim_one(c, 3000, "w");
    /* Heartbeats every 200 ms for 5 s: the job outlives its first 3 s lease and is never rescued. */
    int64_t end = t_now_ms() + 5000;
    while (t_now_ms() < end) {
        CHECK_OK(c, pgjobq_job_extend(c, j->id, j->lease_token, 3000));
        CHECK_OK(c, pgjobq_rescue_expired(c, 100, &rescued));
        CHECK_INT(rescued, 0);
        struct timespec pause = {0, 200 * 1000 * 1000};
        nanosleep(&pause, NULL); /* paces the heartbeat loop; nothing waits on it */
    }
    CHECK_OK(c, pgjobq_job_complete(c, j->id, j->lease_token, NULL));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed' AND attempt = 1",
                    (long long)id),
              1);
    pgjobq_jobs_free(j);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* The token is the holder's secret: whoever knows when a job was claimed (to the millisecond, here
 * from the database's own clock read just before and just after the claim) cannot make its token.
 * Until schema 11 it was the claim's time in microseconds, and one complete_many over the window
 * completed every job of the claim with a forged result. */
TEST(lease_token_cannot_be_guessed_from_the_time_of_the_claim)
{
    enum { N = 3 };
    pgjobq_client *holder = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t ids[N];

    for (int i = 0; i < N; i++)
        CHECK_OK(holder, pgjobq_enqueue(holder, "{}", NULL, &ids[i]));
    long long before = t_int(pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint");
    CHECK_OK(holder, pgjobq_claim(holder, "default", N, 60000, "holder", &jobs, &n));
    long long after = t_int(pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint");
    CHECK_INT(n, N);
    CHECK_MSG(after - before < 2000000, "the claim took %lld us: no window to test", after - before);
    /* Jobs claimed together do not share a token, and none is made of the claim's time. */
    for (size_t i = 0; i < n; i++) {
        CHECK(jobs[i].lease_token > 0);
        CHECK(jobs[i].lease_token < before || jobs[i].lease_token > after);
        for (size_t k = 0; k < i; k++)
            CHECK(jobs[i].lease_token != jobs[k].lease_token);
    }
    /* Every microsecond of the window, and a millisecond either side, for every job: all lost. */
    PQclear(t_exec(pg,
                   "CREATE TEMP TABLE guess AS SELECT i, t FROM unnest(ARRAY[%lld, %lld, %lld]::bigint[]) i"
                   " CROSS JOIN generate_series(%lld::bigint - 1000, %lld::bigint + 1000) t",
                   (long long)ids[0], (long long)ids[1], (long long)ids[2], before, after));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.complete_many(ARRAY(SELECT i FROM guess ORDER BY i, t),"
                        " ARRAY(SELECT t FROM guess ORDER BY i, t),"
                        " ARRAY(SELECT '{\"forged\": true}'::jsonb FROM guess ORDER BY i, t))"
                        " WHERE outcome <> 'lost'"),
              0);
    /* The holder's writes are unaffected. */
    for (size_t i = 0; i < n; i++)
        CHECK_OK(holder, pgjobq_job_complete(holder, jobs[i].id, jobs[i].lease_token, "{\"by\": \"holder\"}"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE result = '{\"by\": \"holder\"}'"), N);
    pgjobq_jobs_free(jobs);
    PQfinish(pg);
    pgjobq_client_close(holder);
}

/* The chaos and failover suites' audit of double claims (t_audit_claims_in_valid_lease) counts a job
 * taken from a valid lease, and nothing of a job's ordinary life: a claim, heartbeats, an expiry, the
 * rescue, a new claim, a completion. */
TEST(lease_audit_counts_a_job_taken_from_a_valid_lease_only)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *j, *k;
    int rescued = 0;
    int64_t id, b, d;

    t_audit_install(pg);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    j = claim_one(c, 300, "w1");
    CHECK_OK(c, pgjobq_job_extend(c, id, j->lease_token, 300));
    wait_expired(pg, id);
    CHECK_OK(c, pgjobq_rescue_expired(c, 100, &rescued));
    CHECK_INT(rescued, 1);
    k = claim_one(c, 60000, "w2");
    CHECK_INT(k->id, id);
    CHECK_OK(c, pgjobq_job_extend(c, id, k->lease_token, 60000));
    CHECK_OK(c, pgjobq_job_complete(c, id, k->lease_token, NULL));
    CHECK_INT(t_audit_claims_in_valid_lease(pg), 0);
    pgjobq_jobs_free(j);
    pgjobq_jobs_free(k);

    /* A job given another token while its lease runs (what a double claim writes), and one put back
     * by a rescue before its lease ended: both counted. */
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &b));
    j = claim_one(c, 60000, "w3");
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_token = lease_token + 1 WHERE id = %lld", (long long)b));
    CHECK_INT(t_audit_claims_in_valid_lease(pg), 1);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &d));
    k = claim_one(c, 60000, "w4");
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET state = 'queued', lease_until = NULL WHERE id = %lld"
                       " /* as rescue_expired would */",
                   (long long)d));
    CHECK_INT(t_audit_claims_in_valid_lease(pg), 2);
    pgjobq_jobs_free(j);
    pgjobq_jobs_free(k);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* A worker cannot hold a job for ever (issue 36, point 5): a claim may not ask for a lease longer than
 * the queue's max lease (a day by default), a heartbeat's longer lease is cut to it; SQL and C API. */
TEST(lease_is_capped_by_the_queues_max_lease)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_queue_info *queues = NULL;
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t id;

    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.queue = "cq";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    /* The rogue claim: refused, and the job stays queued for an honest worker. */
    PGresult *r = PQexec(pg, "SELECT * FROM pgjobq.claim('cq', 1, '1000 years', 'rogue')");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    CHECK_MSG(strstr(PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY), "max_lease 1 day") != NULL, "%s",
              PQresultErrorMessage(r));
    PQclear(r);
    CHECK_RC(c, pgjobq_claim(c, "cq", 1, INT64_C(2) * 86400000, "rogue", &jobs, &n), PGJOBQ_EINVAL);
    CHECK(strstr(pgjobq_errmsg(c), "max_lease") != NULL);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued'", (long long)id), 1);

    /* The queue's own max lease, in queue_list and in force. */
    CHECK_OK(c, pgjobq_queue_set_max_lease(c, "cq", 600000));
    CHECK_OK(c, pgjobq_queue_list(c, &queues, &n));
    CHECK_INT(n, 1);
    CHECK_INT(queues[0].max_lease_ms, 600000);
    pgjobq_queue_list_free(queues);
    CHECK_RC(c, pgjobq_claim(c, "cq", 1, 601000, "w", &jobs, &n), PGJOBQ_EINVAL);
    CHECK_OK(c, pgjobq_claim(c, "cq", 1, 600000, "w", &jobs, &n));
    CHECK_INT(n, 1);
    /* A heartbeat that asks for more gets the queue's max. */
    CHECK_OK(c, pgjobq_job_extend(c, id, jobs[0].lease_token, INT64_C(31536000000)));
    CHECK_INT(t_int(pg,
                    "SELECT (lease_until <= now() + interval '10 minutes' AND lease_until > now())::int"
                    " FROM pgjobq.jobs WHERE id = %lld",
                    (long long)id),
              1);
    r = PQexec(pg, "SELECT * FROM pgjobq.extend_many(ARRAY[(SELECT id FROM pgjobq.jobs WHERE queue = 'cq')],"
                   " ARRAY[(SELECT lease_token FROM pgjobq.jobs WHERE queue = 'cq')], '1000 years')");
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 1), "extended") == 0, "%s",
              PQresultErrorMessage(r));
    PQclear(r);
    CHECK_INT(t_int(pg, "SELECT (lease_until <= now() + interval '10 minutes')::int FROM pgjobq.jobs WHERE id = %lld",
                    (long long)id),
              1);
    /* Back to the default; out of range refused. */
    CHECK_OK(c, pgjobq_queue_set_max_lease(c, "cq", 0));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'cq' AND max_lease IS NULL"), 1);
    CHECK_RC(c, pgjobq_queue_set_max_lease(c, "cq", 999), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_queue_set_max_lease(c, "cq", INT64_C(31536000001)), PGJOBQ_EINVAL);
    r = PQexec(pg, "SELECT pgjobq.queue_set('cq', '{\"max_lease\": \"400 days\"}')");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
    pgjobq_jobs_free(jobs);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* An operator ends a running job's lease now (pgjobq_job_retry_running, pgjobq.retry_running): the job
 * is queued to run again at once, the attempt counted and one more allowed, and every write of the old
 * holder is refused by the fence; a job whose cancel was requested ends cancelled. */
TEST(lease_ended_by_an_operator_fences_the_holder_and_runs_the_job_again)
{
    pgjobq_client *c = t_client(), *rogue = t_client();
    PGconn *pg = t_pg();
    pgjobq_state st = PGJOBQ_RUNNING;
    int64_t id;

    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    pgjobq_job *held = claim_one(rogue, 3600000, "rogue");
    CHECK_OK(c, pgjobq_job_retry_running(c, id, &st));
    CHECK_INT(st, PGJOBQ_QUEUED);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND attempt = 1"
                    " AND max_attempts = 2 AND lease_until IS NULL AND last_error LIKE '%%ended%%rogue%%'",
                    (long long)id),
              1);
    CHECK_RC(rogue, pgjobq_job_extend(rogue, id, held->lease_token, 60000), PGJOBQ_ELEASE);
    CHECK_RC(rogue, pgjobq_job_complete(rogue, id, held->lease_token, "{\"late\": true}"), PGJOBQ_ELEASE);
    CHECK_RC(rogue, pgjobq_job_fail(rogue, id, held->lease_token, "late", 0, 0, NULL), PGJOBQ_ELEASE);
    /* It runs again at once, for its one more attempt. */
    pgjobq_job *again = claim_one(c, 60000, "honest");
    CHECK_INT(again->id, id);
    CHECK_INT(again->attempt, 2);
    CHECK_RC(rogue, pgjobq_job_complete(rogue, id, held->lease_token, "{\"late\": true}"), PGJOBQ_ELEASE);
    CHECK_OK(c, pgjobq_job_complete(c, id, again->lease_token, "{\"ok\": true}"));
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'completed'"
                    " AND result = '{\"ok\": true}'",
                    (long long)id),
              1);
    /* Not running: finished, queued, missing. */
    CHECK_RC(c, pgjobq_job_retry_running(c, id, &st), PGJOBQ_ESTATE);
    CHECK_RC(c, pgjobq_job_retry_running(c, INT64_C(987654321), &st), PGJOBQ_ENOTFOUND);
    int64_t queued;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &queued));
    CHECK_RC(c, pgjobq_job_retry_running(c, queued, &st), PGJOBQ_ESTATE);
    /* A cancel requested: it ends cancelled. */
    pgjobq_job *third = claim_one(rogue, 60000, "rogue");
    CHECK_OK(c, pgjobq_job_cancel(c, third->id, NULL));
    CHECK_OK(c, pgjobq_job_retry_running(c, third->id, &st));
    CHECK_INT(st, PGJOBQ_CANCELLED);
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'cancelled'", (long long)third->id),
        1);
    CHECK_RC(rogue, pgjobq_job_complete(rogue, third->id, third->lease_token, NULL), PGJOBQ_ELEASE);
    pgjobq_jobs_free(held);
    pgjobq_jobs_free(again);
    pgjobq_jobs_free(third);
    PQfinish(pg);
    pgjobq_client_close(c);
    pgjobq_client_close(rogue);
}

static const char *held_log;
static PGconn *held_pg;

static int held_running(void *arg)
{
    (void)arg;
    return t_int(held_pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'held' AND state = 'running'") == 1;
}

static int held_told(void *arg)
{
    (void)arg;
    FILE *f = fopen(held_log, "r");
    char line[2048];
    int found = 0;
    if (f == NULL)
        return 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, "lease lost; its handler is asked to stop") != NULL;
    fclose(f);
    return found;
}

static pid_t held_worker;

static void stop_held_worker(void)
{
    if (held_worker > 0) {
        kill(held_worker, SIGTERM);
        if (t_wait_exit(held_worker, 20000) == -1)
            kill(held_worker, SIGKILL);
        held_worker = 0;
    }
}

/* `pgjobq retry --running` against a real worker whose handler runs long: the worker is told at once
 * (it renews its leases when notified, not at its next heartbeat, minutes away here), finds the lease
 * gone and asks its handler to stop; the job runs again. */
TEST_FULL(lease_ended_by_an_operator_stops_the_workers_handler_at_once, 120, 0)
{
    PGconn *pg = t_pg();
    char *out, *err, id[32];

    snprintf(id, sizeof id, "%lld", t_int(pg, "SELECT id FROM pgjobq.enqueue('held')"));
    const char *sleeper = t_script("sleeper", "exec sleep 300");
    held_log = t_log_path("held");
    held_pg = pg;
    held_worker = t_spawn(held_log, NULL, "work", "--queue", "held:1", "--exec", sleeper, "--lease", "10m",
                          "--heartbeat", "9m", "--timeout", "9m", NULL);
    t_defer(stop_held_worker);
    CHECK_MSG(t_wait_until(held_running, NULL, 30000), "the worker did not start the job");
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "--running", id, NULL), 0);
    free(out);
    free(err);
    if (!t_wait_until(held_told, NULL, 60000)) {
        t_show_log(held_log);
        t_fail(__FILE__, __LINE__, "the worker did not learn that its lease was ended");
    }
    /* The job runs again, its second attempt (this same worker may take it). */
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.jobs WHERE id = %s AND state IN ('queued', 'running')"
                    " AND attempt <= 2 AND max_attempts >= 2",
                    id),
              1);
    stop_held_worker();
    PQfinish(pg);
}
