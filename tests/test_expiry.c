/*
 * test_expiry.c - jobs that expire while queued (issue 41; docs/queues.md, "Expiry") against the real
 * server: a job past its expires_at is never claimed and the sweep ends it cancelled ("expired: ..."),
 * its waiting children with it; a job that started in time is not touched, nor one retried by hand;
 * the queue's default applies to jobs without one (COPY batches too); the rules give the same answer
 * through SQL, C, the command and Python; `pgjobq show` and `queue ls` show it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Makes job `id` expired: its expiry moved into the past (as if the clock had run on). */
static void expire_now(PGconn *pg, int64_t id)
{
    PQclear(
        t_exec(pg, "UPDATE pgjobq.jobs SET expires_at = now() - interval '1 second' WHERE id = %lld", (long long)id));
}

TEST(expiry_a_job_not_started_in_time_is_never_claimed_and_ends_cancelled)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t late = 0, fresh = 0, kid = 0, started = 0;

    pgjobq_job_spec s = {.payload = "{\"otp\": 1}", .expire_after_ms = 600000};
    s.opts.queue = "otp";
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &late, NULL));
    /* expire_after counts from run_at. */
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND expires_at = run_at + interval '10 minutes'",
                    (long long)late),
              1);
    s.payload = "{\"otp\": 2}";
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &fresh, NULL));
    /* A child waiting for the late job is cancelled with it (its parent did not complete). */
    int64_t parents[] = {late, 0};
    pgjobq_enqueue_opts ko = {.queue = "otp", .after = parents};
    CHECK_OK(c, pgjobq_enqueue(c, "{\"child\": true}", &ko, &kid));
    expire_now(pg, late);

    /* The claim steps over it, though it is first in the queue's order. */
    CHECK_OK(c, pgjobq_claim(c, "otp", 10, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, fresh);
    started = jobs[0].id;
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued'", (long long)late), 1);

    /* The running job's expiry has passed too: it started in time, so it is left alone. */
    expire_now(pg, started);
    /* The sweep (every worker's rescue pass runs it) ends the late one cancelled, with the reason. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(1000)"), 0);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'cancelled'"
                    " AND last_error LIKE 'expired: %%' AND expires_at IS NOT NULL AND started_at IS NULL",
                    (long long)late),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'cancelled'", (long long)kid),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'running'", (long long)started),
              1);
    CHECK_INT(t_int(pg, "SELECT pgjobq.expire_queued(1000)"), 0);

    /* A retry by hand starts it again, its expiry gone. */
    char *outcome = t_str(pg, "SELECT pgjobq.retry(%lld)", (long long)late);
    CHECK_STR(outcome, "queued");
    free(outcome);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND expires_at IS NULL", (long long)late), 1);
    CHECK_OK(c, pgjobq_claim(c, "otp", 10, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, late);
    pgjobq_jobs_free(jobs);

    /* A retry after a failed attempt that comes due after the expiry does not start. */
    int64_t retried = 0;
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &retried, NULL));
    CHECK_OK(c, pgjobq_claim(c, "otp", 1, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, retried);
    pgjobq_jobs_free(jobs);
    PQclear(t_exec(pg,
                   "UPDATE pgjobq.jobs SET state = 'queued', lease_until = NULL, run_at = now() - interval '1 second',"
                   " expires_at = now() - interval '2 seconds' WHERE id = %lld",
                   (long long)retried));
    CHECK_OK(c, pgjobq_claim(c, "otp", 10, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 0);
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(pg, "SELECT pgjobq.expire_queued(1000)"), 1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(expiry_the_keyed_claim_steps_over_an_expired_job_too)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t a = 0, b = 0;

    CHECK_OK(c, pgjobq_queue_set_key_concurrency(c, "tenants", 1));
    pgjobq_job_spec s = {.payload = "{}", .expire_after_ms = 60000};
    s.opts.queue = "tenants";
    s.opts.concurrency_key = "t1";
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &a, NULL));
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &b, NULL));
    expire_now(pg, a);
    CHECK_OK(c, pgjobq_claim(c, "tenants", 10, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, b);
    pgjobq_jobs_free(jobs);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(expiry_a_queue_default_applies_to_jobs_without_one_on_every_path)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_queue_info *q = NULL;
    size_t nq = 0;
    int64_t id = 0;

    CHECK_OK(c, pgjobq_queue_set_expire_after(c, "mail", 3600000));
    CHECK_OK(c, pgjobq_queue_list(c, &q, &nq));
    CHECK_INT((long long)nq, 1);
    CHECK_INT(q[0].expire_after_ms, 3600000);
    pgjobq_queue_list_free(q);

    /* One job, a delayed one (counted from its run_at), one with its own, and one in a graph. */
    pgjobq_enqueue_opts o = {.queue = "mail"};
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 1}", &o, &id));
    o.delay_ms = 7200000;
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 2}", &o, &id));
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND expires_at = run_at + interval '1 hour'"
                    " AND run_at > now() + interval '1 hour'",
                    (long long)id),
              1);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('mail', expire_after => '5 minutes')"));
    const char *tags[] = {"t", NULL};
    pgjobq_enqueue_opts g = {.queue = "mail", .tags = tags};
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 4}", &g, &id));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND expires_at = run_at + interval '1 hour'",
                    (long long)id),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'mail'"), 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'mail' AND expires_at = run_at + interval "
                        "'1 hour'"),
              3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'mail' AND expires_at = run_at + interval "
                        "'5 minutes'"),
              1);

    /* A batch large enough for COPY, which cannot give the default: it goes through enqueue_many. */
    enum { N = 600 };
    pgjobq_job_spec *many = calloc(N, sizeof *many);
    CHECK(many != NULL);
    for (int i = 0; i < N; i++) {
        many[i].payload = "{}";
        many[i].opts.queue = "mail";
    }
    CHECK_OK(c, pgjobq_enqueue_many(c, many, N, NULL, NULL));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'mail' AND expires_at IS NULL"), 0);
    /* Without a default, the same batch goes through COPY and expires never. */
    CHECK_OK(c, pgjobq_queue_set_expire_after(c, "mail", 0));
    CHECK_OK(c, pgjobq_enqueue_many(c, many, N, NULL, NULL));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'mail' AND expires_at IS NULL"), N);
    free(many);

    /* A default out of range is refused. */
    CHECK_RC(c, pgjobq_queue_set_expire_after(c, "mail", 500), PGJOBQ_EINVAL);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(expiry_rules_give_the_same_answer_on_every_path)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t id = 0;
    char *out = NULL, *err = NULL;

    /* SQL: both given, an expiry not after run_at, a bad duration. */
    char *e = t_expect_error(pg, "22023",
                             "SELECT pgjobq.enqueue('r', expires_at => now() + interval '1 hour', expire_after => '1 "
                             "minute')");
    CHECK_MSG(strstr(e, "give expires_at or expire_after, not both") != NULL, "%s", e);
    free(e);
    e = t_expect_error(pg, "22023",
                       "SELECT pgjobq.enqueue('r', delay => '2 hours', expires_at => now() + interval '1 hour')");
    CHECK_MSG(strstr(e, "could never start") != NULL, "%s", e);
    free(e);
    e = t_expect_error(pg, "22023",
                       "SELECT pgjobq.enqueue_many(ARRAY['r','r'], NULL, NULL, expire_afters => "
                       "ARRAY[interval '1 minute', interval '0'])");
    CHECK_MSG(strstr(e, "expire_afters[2]") != NULL, "%s", e);
    free(e);
    e = t_expect_error(pg, "22023",
                       "SELECT pgjobq.enqueue_graph('[{\"queue\": \"r\", \"expires_at\": \"2001-01-01 00:00Z\"}]')");
    CHECK_MSG(strstr(e, "job 0") != NULL && strstr(e, "could never start") != NULL, "%s", e);
    free(e);
    e = t_expect_error(pg, "22023", "SELECT pgjobq.queue_set('r', '{\"expire_after\": \"0 seconds\"}')");
    free(e);

    /* C: the same rule, one job and many. */
    pgjobq_job_spec s = {.payload = "{}", .expires_at = "2001-01-01 00:00Z"};
    s.opts.queue = "r";
    CHECK_RC(c, pgjobq_enqueue_spec(c, &s, &id, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "could never start") != NULL, "%s", pgjobq_errmsg(c));
    s.expire_after_ms = 60000;
    CHECK_RC(c, pgjobq_enqueue_many(c, &s, 1, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "not both") != NULL, "%s", pgjobq_errmsg(c));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'r'"), 0);

    /* The command. */
    int status =
        t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "r", "--delay", "2h", "--expire-after", "1h", "{}", NULL);
    CHECK_INT(status, 0);
    free(out);
    free(err);
    status = t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "r", "--expires-at", "2001-01-01", "{}", NULL);
    CHECK_MSG(status == 65 && strstr(err, "could never start") != NULL, "%d %s", status, err);
    free(out);
    free(err);
    status = t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "r", "--expire-after", "0s", "{}", NULL);
    CHECK_MSG(status == 64 && strstr(err, "--expire-after") != NULL, "%d %s", status, err);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'r' AND expires_at = run_at + interval '1 "
                        "hour' AND run_at > now() + interval '1 hour'"),
              1);

    /* Python. */
    char cmd[4096], pyout[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && PYTHONPATH='%s/python' PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -W ignore -c '"
             "import pgjobq, psycopg\n"
             "with psycopg.connect(\"%s\", autocommit=True) as c:\n"
             "    e = pgjobq.enqueue(c, \"k\", {}, queue=\"r\", expire_after=\"30m\")\n"
             "    print(pgjobq.get(c, e.id).expires_at is not None)\n"
             "    try:\n"
             "        pgjobq.enqueue(c, \"k\", {}, queue=\"r\", expires_at=\"2001-01-01 00:00Z\")\n"
             "    except pgjobq.InvalidJob as x:\n"
             "        print(\"refused\", \"could never start\" in str(x))\n"
             "'",
             t_tmpdir(), t_srcdir(), t_conninfo());
    CHECK_MSG(t_shell(pyout, sizeof pyout, cmd) == 0, "python3: %s", pyout);
    CHECK_MSG(strcmp(pyout, "True\nrefused True\n") == 0, "python3 said: %s", pyout);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'r'"), 2);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(expiry_shown_by_show_and_queue_ls)
{
    PGconn *pg = t_pg();
    char *out = NULL, *err = NULL;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "shown", "--expire-after", "90m", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", NULL), 0);
    CHECK_MSG(strstr(out, "EXPIRE AFTER") != NULL && strstr(out, "90m") != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"expire_after_ms\":5400000") != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "shown", "--quiet", "{}", NULL), 0);
    free(out);
    free(err);
    long long id = t_int(pg, "SELECT max(id) FROM pgjobq.jobs WHERE queue = 'shown'");
    char ids[24];
    snprintf(ids, sizeof ids, "%lld", id);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids, NULL), 0);
    CHECK_MSG(strstr(out, "expires_at:") != NULL, "%s", out);
    free(out);
    free(err);
    expire_now(pg, id);
    CHECK_INT(t_int(pg, "SELECT pgjobq.expire_queued(10)"), 1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids, NULL), 0);
    CHECK_MSG(strstr(out, "cancelled") != NULL && strstr(out, "expired: it never started") != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--json", ids, NULL), 0);
    CHECK_MSG(strstr(out, "\"expires_at\":\"") != NULL, "%s", out);
    free(out);
    free(err);
    PQfinish(pg);
}
