/*
 * test_conflict.c - serialization failures and deadlocks (40001, 40P01) are retried a bounded number
 * of times inside the library's own transactions, and never inside a caller's.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A trigger that fails the next `times` updates or deletes (a completion moves the job to history) of
 * pgjobq.jobs with SQLSTATE `code`.  It counts with a
 * sequence because nextval() is not rolled back with the failed statement. */
static void inject(PGconn *pg, const char *code, int times)
{
    PQclear(t_exec(pg, "CREATE SEQUENCE IF NOT EXISTS inject_seq"));
    PQclear(t_exec(pg,
                   "CREATE OR REPLACE FUNCTION inject_failure() RETURNS trigger LANGUAGE plpgsql AS $$"
                   " BEGIN IF nextval('public.inject_seq') <= %d THEN"
                   "   RAISE EXCEPTION 'injected failure' USING ERRCODE = '%s'; END IF;"
                   " RETURN coalesce(NEW, OLD); END $$",
                   times, code));
    PQclear(t_exec(pg, "CREATE OR REPLACE TRIGGER inject BEFORE UPDATE OR DELETE ON pgjobq.jobs"
                       " FOR EACH ROW EXECUTE FUNCTION public.inject_failure()"));
}

TEST(conflict_serialization_failure_is_retried)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs;
    size_t n;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    inject(pg, "40001", 3);
    CHECK_OK(c, pgjobq_claim(c, "default", 1, 60000, NULL, &jobs, &n));
    CHECK_INT(n, 1);
    /* Three failed runs and the successful fourth. */
    CHECK_INT(t_int(pg, "SELECT last_value FROM inject_seq"), 4);
    PQclear(t_exec(pg, "ALTER SEQUENCE inject_seq RESTART"));
    inject(pg, "40P01", 2);
    CHECK_OK(c, pgjobq_job_complete(c, jobs[0].id, jobs[0].lease_token, NULL));
    CHECK_INT(t_int(pg, "SELECT last_value FROM inject_seq"), 3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'"), 1);
    pgjobq_jobs_free(jobs);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(conflict_retries_are_bounded_and_change_nothing)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs;
    size_t n;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    inject(pg, "40001", 1000000);
    CHECK_RC(c, pgjobq_claim(c, "default", 1, 60000, NULL, &jobs, &n), PGJOBQ_ECONFLICT);
    CHECK_STR(pgjobq_sqlstate(c), "40001");
    CHECK(t_int(pg, "SELECT last_value FROM inject_seq") <= 20);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'queued' AND attempt = 0"), 1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(conflict_inside_callers_transaction_is_not_retried)
{
    PGconn *app = t_pg(), *pg = t_pg();
    pgjobq_client *c = NULL;
    pgjobq_job *jobs;
    size_t n;

    CHECK_OK(c, pgjobq_client_wrap(&c, app));
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    inject(pg, "40001", 1);
    PQclear(t_exec(app, "BEGIN"));
    CHECK_RC(c, pgjobq_claim(c, "default", 1, 60000, NULL, &jobs, &n), PGJOBQ_ECONFLICT);
    /* One try only: the caller's transaction is aborted and only the caller can retry it. */
    CHECK_INT(t_int(pg, "SELECT last_value FROM inject_seq"), 1);
    CHECK_INT(PQtransactionStatus(app), PQTRANS_INERROR);
    PQclear(t_exec(app, "ROLLBACK"));
    CHECK_OK(c, pgjobq_claim(c, "default", 1, 60000, NULL, &jobs, &n));
    CHECK_INT(n, 1);
    pgjobq_jobs_free(jobs);
    pgjobq_client_close(c);
    PQfinish(app);
    PQfinish(pg);
}

enum { SER_JOBS = 2000, SER_THREADS = 10 };
static _Atomic int ser_claims[SER_JOBS + 1];
static _Atomic int ser_errors;

static void *ser_claimer(void *arg)
{
    pgjobq_client *c = NULL;
    (void)arg;
    if (pgjobq_client_open(&c, t_conninfo()) != PGJOBQ_OK) {
        atomic_fetch_add(&ser_errors, 1);
        pgjobq_client_close(c);
        return NULL;
    }
    for (;;) {
        pgjobq_job *jobs;
        size_t n;
        if (pgjobq_claim(c, "default", 5, 60000, NULL, &jobs, &n) != PGJOBQ_OK) {
            fprintf(stderr, "claim: %s\n", pgjobq_errmsg(c));
            atomic_fetch_add(&ser_errors, 1);
            break;
        }
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++) {
            int k = atoi(jobs[i].payload + 1);
            if (k >= 1 && k <= SER_JOBS)
                atomic_fetch_add(&ser_claims[k], 1);
            if (pgjobq_job_complete(c, jobs[i].id, jobs[i].lease_token, NULL) != PGJOBQ_OK) {
                fprintf(stderr, "complete: %s\n", pgjobq_errmsg(c));
                atomic_fetch_add(&ser_errors, 1);
            }
        }
        pgjobq_jobs_free(jobs);
    }
    pgjobq_client_close(c);
    return NULL;
}

TEST_FULL(conflict_concurrent_claims_under_serializable_isolation, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job_spec *specs = calloc(SER_JOBS, sizeof *specs);
    char(*payloads)[16] = calloc(SER_JOBS, sizeof *payloads);
    pthread_t th[SER_THREADS];

    CHECK(specs && payloads);
    PQclear(t_exec(pg, "ALTER DATABASE %s SET default_transaction_isolation = 'serializable'", t_dbname()));
    for (int i = 0; i < SER_JOBS; i++) {
        snprintf(payloads[i], sizeof payloads[i], "[%d]", i + 1);
        specs[i].payload = payloads[i];
    }
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, SER_JOBS, NULL, NULL));
    for (int i = 0; i < SER_THREADS; i++)
        CHECK(pthread_create(&th[i], NULL, ser_claimer, NULL) == 0);
    for (int i = 0; i < SER_THREADS; i++)
        pthread_join(th[i], NULL);
    CHECK_INT(atomic_load(&ser_errors), 0);
    for (int k = 1; k <= SER_JOBS; k++)
        CHECK_MSG(atomic_load(&ser_claims[k]) == 1, "job [%d] claimed %d times", k, atomic_load(&ser_claims[k]));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'"), SER_JOBS);
    /* The database default really is serializable; the library's own connections run READ COMMITTED,
     * which is what SKIP LOCKED claims are designed for (see pgjobq_client_open). */
    PGconn *check = t_pg();
    char *iso = t_str(check, "SHOW transaction_isolation");
    CHECK_STR(iso, "serializable");
    free(iso);
    PQfinish(check);
    pgjobq_client *fresh = t_client();
    iso = t_str(pgjobq_client_conn(fresh), "SHOW transaction_isolation");
    CHECK_STR(iso, "read committed");
    free(iso);
    pgjobq_client_close(fresh);
    free(specs);
    free(payloads);
    PQfinish(pg);
    pgjobq_client_close(c);
}
