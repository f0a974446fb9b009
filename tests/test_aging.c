/*
 * test_aging.c - priority aging (issue 41; docs/queues.md, "Priority aging") against the real server:
 * with a queue's priority_aging set, a low-priority job under a steady stream of higher ones is
 * claimed within a bounded number of claims, and without it never; the pass never waits for a claim
 * nor makes one wait, never touches a running or finished job, stops at the best priority, and
 * changes nothing when the queue has no aging; a retry by hand starts the job again at its first
 * priority; the setting through SQL, C and the command; `pgjobq show` tells both priorities.
 *
 * Time is driven by the database, not by sleeping: "time passes" moves the keys of the queue's queued
 * jobs (run_at, ready_at) back by the interval and forgets the queue's low-water marks (a claim then
 * starts each level from its first row, which is always safe: docs/design.md, "The claim's cursor").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* As if `seconds` had passed for the queued jobs of `queue`. */
static void time_passes(PGconn *pg, const char *queue, int seconds)
{
    PQclear(t_exec(pg,
                   "UPDATE pgjobq.jobs SET run_at = run_at - make_interval(secs => %d),"
                   " ready_at = ready_at - make_interval(secs => %d) WHERE queue = '%s' AND state = 'queued'",
                   seconds, seconds, queue));
    PQclear(t_exec(pg, "DELETE FROM pgjobq.lows WHERE queue = '%s'", queue));
}

static long long priority_of(PGconn *pg, int64_t id)
{
    return t_int(pg, "SELECT priority FROM pgjobq.all_jobs WHERE id = %lld", (long long)id);
}

/* Rounds of a steady stream: each round a minute passes, the workers' maintenance pass runs, one job
 * of priority 0 arrives and one job is claimed and completed.  Returns the round in which job `low`
 * was claimed, or 0 if it was not claimed within `rounds`. */
static int stream_until_claimed(pgjobq_client *c, PGconn *pg, const char *queue, int64_t low, int rounds)
{
    pgjobq_enqueue_opts hi = {.queue = queue, .priority = 0};
    for (int round = 1; round <= rounds; round++) {
        pgjobq_job *jobs = NULL;
        size_t n = 0;
        int rescued = 0;
        time_passes(pg, queue, 60);
        CHECK_OK(c, pgjobq_rescue_expired(c, 1000, &rescued));
        CHECK_OK(c, pgjobq_enqueue(c, "{\"high\": true}", &hi, NULL));
        CHECK_OK(c, pgjobq_claim(c, queue, 1, 60000, "w1", &jobs, &n));
        CHECK_INT((long long)n, 1);
        int64_t got = jobs[0].id;
        CHECK_OK(c, pgjobq_job_complete(c, jobs[0].id, jobs[0].lease_token, NULL));
        pgjobq_jobs_free(jobs);
        if (got == low)
            return round;
    }
    return 0;
}

TEST(aging_a_low_priority_job_is_not_starved_by_a_stream_of_high_ones)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t low_off = 0, low_on = 0;

    /* Without aging: a job of priority 5 under a stream of priority 0 never runs. */
    pgjobq_enqueue_opts lo = {.queue = "plain", .priority = 5};
    CHECK_OK(c, pgjobq_enqueue(c, "{\"low\": true}", &lo, &low_off));
    CHECK_INT(stream_until_claimed(c, pg, "plain", low_off, 40), 0);
    CHECK_INT(priority_of(pg, low_off), 5);

    /* With aging of a minute: raised one step a minute, it reaches the stream's priority after five
     * minutes, where it is older than the next arrival: claimed at the sixth round at the latest. */
    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "aged", 60000));
    lo.queue = "aged";
    CHECK_OK(c, pgjobq_enqueue(c, "{\"low\": true}", &lo, &low_on));
    int round = stream_until_claimed(c, pg, "aged", low_on, 40);
    CHECK_MSG(round >= 1 && round <= 6, "claimed at round %d", round);
    /* It kept its first priority, into the history. */
    CHECK_INT(t_int(pg, "SELECT base_priority FROM pgjobq.history WHERE id = %lld AND state = 'completed'",
                    (long long)low_on),
              5);
    CHECK_INT(priority_of(pg, low_on), 0);
    /* The jobs of the stream, claimed as they came, were never raised. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'aged' AND base_priority IS NOT NULL"), 1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(aging_raises_one_step_per_interval_down_to_the_best_priority)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t a = 0, b = 0, later = 0;

    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "steps", 600000));
    pgjobq_enqueue_opts o = {.queue = "steps", .priority = 3};
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &a));
    o.priority = PGJOBQ_PRIORITY_MIN + 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &b));
    /* Not yet ready for the interval: nothing. */
    time_passes(pg, "steps", 599);
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(100)"), 0);
    time_passes(pg, "steps", 1);
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(100)"), 2);
    CHECK_INT(priority_of(pg, a), 2);
    CHECK_INT(priority_of(pg, b), PGJOBQ_PRIORITY_MIN);
    /* One step per interval: the wait starts again at the new priority. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(100)"), 0);
    time_passes(pg, "steps", 600);
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(100)"), 1);
    CHECK_INT(priority_of(pg, a), 1);
    /* Never below the best priority the jobs table allows. */
    CHECK_INT(priority_of(pg, b), PGJOBQ_PRIORITY_MIN);
    CHECK_INT(t_int(pg, "SELECT base_priority FROM pgjobq.jobs WHERE id = %lld", (long long)b),
              PGJOBQ_PRIORITY_MIN + 1);
    /* max_jobs bounds a pass. */
    o.priority = 7;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &later));
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    time_passes(pg, "steps", 600);
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(2)"), 2);
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(2)"), 1);
    char *e = t_expect_error(pg, "22023", "SELECT pgjobq.age_priorities(0)");
    free(e);

    /* A raised job is claimable at its new level (the level is recorded, its key is now). */
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_claim(c, "steps", 10, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 4);
    CHECK_INT(jobs[0].id, b);
    CHECK_INT(jobs[1].id, a);
    pgjobq_jobs_free(jobs);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(aging_never_waits_for_a_claim_nor_touches_running_or_finished_jobs)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg(), *other = t_pg();
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t held = 0, free_one = 0, running = 0, done = 0;

    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "busy", 60000));
    pgjobq_enqueue_opts o = {.queue = "busy", .priority = 10};
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 1}", &o, &running));
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 2}", &o, &done));
    CHECK_OK(c, pgjobq_claim(c, "busy", 2, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 2);
    CHECK_OK(c, pgjobq_job_complete(c, jobs[1].id, jobs[1].lease_token, NULL));
    pgjobq_jobs_free(jobs);
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 3}", &o, &held));
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 4}", &o, &free_one));
    time_passes(pg, "busy", 120);
    PQclear(t_exec(pg,
                   "UPDATE pgjobq.jobs SET run_at = run_at - interval '1 hour' WHERE id = %lld;"
                   "UPDATE pgjobq.history SET run_at = run_at - interval '1 hour' WHERE id = %lld",
                   (long long)running, (long long)done));

    /* A row locked by another transaction (as a claim holds one) is skipped, not waited for: the
     * statement timeout turns a wait into a failure. */
    PQclear(t_exec(other, "BEGIN"));
    PQclear(t_exec(other, "SELECT 1 FROM pgjobq.jobs WHERE id = %lld FOR UPDATE", (long long)held));
    PQclear(t_exec(pg, "SET statement_timeout = '10s'"));
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(100)"), 1);
    CHECK_INT(priority_of(pg, free_one), 9);
    CHECK_INT(priority_of(pg, held), 10);
    PQclear(t_exec(other, "ROLLBACK"));
    /* The running and the finished job kept theirs. */
    CHECK_INT(priority_of(pg, running), 10);
    CHECK_INT(priority_of(pg, done), 10);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id IN (%lld, %lld) AND base_priority IS NULL",
                    (long long)running, (long long)done),
              2);

    /* A pass that has not committed holds the rows it raised: a claim skips them and takes the
     * others without waiting for it. */
    time_passes(pg, "busy", 120);
    PQclear(t_exec(other, "BEGIN"));
    CHECK_INT(t_int(other, "SELECT pgjobq.age_priorities(1)"), 1);
    /* (The one it raised is the one whose key is now: the others' are two minutes old.) */
    int64_t raised = t_int(other, "SELECT id FROM pgjobq.jobs WHERE queue = 'busy' AND state = 'queued'"
                                  " ORDER BY ready_at DESC LIMIT 1");
    PQclear(t_exec(pg, "SET statement_timeout = '0'"));
    CHECK_OK(c, pgjobq_claim(c, "busy", 10, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_MSG(jobs[0].id != raised && (jobs[0].id == held || jobs[0].id == free_one), "claimed %lld (raised %lld)",
              (long long)jobs[0].id, (long long)raised);
    pgjobq_jobs_free(jobs);
    PQclear(t_exec(other, "COMMIT"));
    CHECK_OK(c, pgjobq_claim(c, "busy", 10, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, raised);
    pgjobq_jobs_free(jobs);
    PQfinish(other);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(aging_off_changes_nothing)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();

    pgjobq_enqueue_opts o = {.queue = "still", .priority = 4};
    for (int i = 0; i < 5; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    time_passes(pg, "still", 86400);
    /* No queue ages: the pass changes nothing, through either entry. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(1000)"), 0);
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(1000)"), 0);
    /* Another queue that ages does not reach this one's jobs. */
    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "other", 1000));
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(1000)"), 0);
    /* Turned off again, a queue's jobs stay where they are. */
    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "still", 1000));
    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "still", 0));
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(1000)"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'still' AND priority = 4"
                        " AND base_priority IS NULL"),
              5);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(aging_a_retry_by_hand_starts_again_at_the_first_priority)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t id = 0;

    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "again", 60000));
    pgjobq_enqueue_opts o = {.queue = "again", .priority = 6};
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    for (int i = 0; i < 3; i++) {
        time_passes(pg, "again", 60);
        CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(10)"), 1);
    }
    CHECK_INT(priority_of(pg, id), 3);
    /* A failed attempt's automatic retry keeps the priority its wait earned. */
    CHECK_OK(c, pgjobq_claim(c, "again", 1, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_OK(c, pgjobq_job_fail(c, jobs[0].id, jobs[0].lease_token, "boom", 0, 0, NULL));
    pgjobq_jobs_free(jobs);
    CHECK_INT(priority_of(pg, id), 3);
    /* Finished, then retried by hand: its first priority, its wait counted again. */
    CHECK_OK(c, pgjobq_claim(c, "again", 1, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_OK(c, pgjobq_job_complete(c, jobs[0].id, jobs[0].lease_token, NULL));
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(pg, "SELECT base_priority FROM pgjobq.history WHERE id = %lld", (long long)id), 6);
    char *said = t_str(pg, "SELECT pgjobq.retry(%lld)", (long long)id);
    CHECK_STR(said, "queued");
    free(said);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND priority = 6 AND base_priority IS NULL",
                    (long long)id),
              1);
    /* Aged again, then retried by hand while still queued: the same. */
    time_passes(pg, "again", 60);
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(10)"), 1);
    said = t_str(pg, "SELECT pgjobq.retry(%lld)", (long long)id);
    CHECK_STR(said, "queued");
    free(said);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND priority = 6 AND base_priority IS NULL",
                    (long long)id),
              1);
    CHECK_OK(c, pgjobq_claim(c, "again", 1, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, id);
    pgjobq_jobs_free(jobs);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(aging_the_setting_through_sql_c_and_the_command)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_queue_info *q = NULL;
    size_t n = 0;
    char *out = NULL, *err = NULL;

    /* SQL. */
    PQclear(t_exec(pg, "SELECT pgjobq.queue_set('s', '{\"priority_aging\": \"5 minutes\"}')"));
    CHECK_INT(t_int(pg, "SELECT extract(epoch FROM priority_aging)::int FROM pgjobq.queue_list() WHERE queue = 's'"),
              300);
    char *e = t_expect_error(pg, "22023", "SELECT pgjobq.queue_set('s', '{\"priority_aging\": \"0 seconds\"}')");
    CHECK_MSG(strstr(e, "priority_aging") != NULL, "%s", e);
    free(e);
    PQclear(t_exec(pg, "SELECT pgjobq.queue_set('s', '{\"priority_aging\": null}')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 's' AND priority_aging IS NULL"), 1);

    /* C. */
    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "s", 90000));
    CHECK_RC(c, pgjobq_queue_set_priority_aging(c, "s", 999), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_queue_set_priority_aging(c, "s", -1), PGJOBQ_EINVAL);
    CHECK_OK(c, pgjobq_queue_list(c, &q, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(q[0].priority_aging_s, 90);
    pgjobq_queue_list_free(q);

    /* The command. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "s", "--priority-aging", "10m", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", NULL), 0);
    CHECK_MSG(strstr(out, "AGING") != NULL && strstr(out, "10m") != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"priority_aging_ms\":600000") != NULL, "%s", out);
    free(out);
    free(err);
    int status = t_cli(&out, &err, NULL, 0, "queue", "set", "s", "--priority-aging", "0s", NULL);
    CHECK_MSG(status == 64 && strstr(err, "--priority-aging") != NULL, "%d %s", status, err);
    free(out);
    free(err);
    status = t_cli(&out, &err, NULL, 0, "queue", "pause", "s", "--priority-aging", "1m", NULL);
    CHECK_MSG(status == 64 && strstr(err, "go with set") != NULL, "%d %s", status, err);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT extract(epoch FROM priority_aging)::int FROM pgjobq.queues WHERE name = 's'"), 600);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "s", "--priority-aging", "none", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 's' AND priority_aging IS NULL"), 1);

    /* show tells both priorities of a raised job, and only one of another. */
    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "s", 60000));
    pgjobq_enqueue_opts o = {.queue = "s", .priority = 2};
    int64_t id = 0;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    char ids[24];
    snprintf(ids, sizeof ids, "%lld", (long long)id);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids, NULL), 0);
    CHECK_MSG(strstr(out, "priority:      2\n") != NULL, "%s", out);
    free(out);
    free(err);
    time_passes(pg, "s", 60);
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(10)"), 1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids, NULL), 0);
    CHECK_MSG(strstr(out, "priority:      1 (enqueued at 2, raised by priority aging)") != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--json", ids, NULL), 0);
    CHECK_MSG(strstr(out, "\"base_priority\":2") != NULL, "%s", out);
    free(out);
    free(err);
    PQfinish(pg);
    pgjobq_client_close(c);
}
