/*
 * test_trace.c - a job's trace context (issue 41; docs/queues.md, "Trace context") against the real
 * server: a W3C traceparent given at enqueue is stored on every way in (SQL enqueue, enqueue_many,
 * enqueue_keyed, a graph, C one job, C many, the command, Python), judged by one rule (a bad one is
 * refused with its name, and a batch that holds one is written not at all), kept through the history
 * and a retry, handed to the handler (the claim, TRACEPARENT in an --exec handler's environment, the
 * coprocess's message) and shown by `pgjobq show`.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define TP  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#define TP2 "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"

/* Values the W3C format (version 00) refuses, each for its own reason. */
static const char *const bad[] = {
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  /* uppercase */
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* another version */
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  /* trace id all zero */
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  /* parent id all zero */
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",   /* flags of one digit */
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", /* something after */
    "",
    "traceparent",
};
#define NBAD (sizeof bad / sizeof bad[0])

/* t_expect_error with the statement formatted from fmt and one value. */
static char *refused(PGconn *pg, const char *sqlstate, const char *fmt, const char *value)
{
    char sql[1024];
    snprintf(sql, sizeof sql, fmt, value);
    return t_expect_error(pg, sqlstate, sql);
}

/* The line of `text` (coprocess messages, one a line) about job id, copied into line (size bytes). */
static int message_of(const char *text, int64_t id, char *line, size_t size)
{
    char want[64];
    snprintf(want, sizeof want, "{\"id\":%lld,", (long long)id);
    const char *p = strstr(text, want), *end = p ? strchr(p, '\n') : NULL;
    if (p == NULL || end == NULL || (size_t)(end - p) >= size)
        return 0;
    memcpy(line, p, (size_t)(end - p));
    line[end - p] = '\0';
    return 1;
}

static long long count_tp(PGconn *pg, const char *queue, const char *tp)
{
    return t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = '%s' AND traceparent = '%s'", queue, tp);
}

TEST(trace_stored_on_every_enqueue_path_and_kept)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t id = 0, ids[600];

    /* SQL: one job, one in a graph of one (tags), many, keyed, a graph. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('t1', traceparent => '" TP "')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('t1', tags => ARRAY['x'], traceparent => '" TP "')"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.enqueue_many(ARRAY['t1', 't1'], NULL, NULL, traceparents => ARRAY['" TP
                       "', NULL])"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.enqueue_keyed(ARRAY['t1'], NULL, NULL, unique_keys => ARRAY['k'], "
                       "on_conflicts => ARRAY['replace'], traceparents => ARRAY['" TP "'])"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.enqueue_graph('[{\"queue\": \"t1\", \"traceparent\": \"" TP
                       "\"}, {\"queue\": \"t1\", \"after\": [\"0\"]}]')"));
    CHECK_INT(count_tp(pg, "t1", TP), 5);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't1' AND traceparent IS NULL"), 2);
    /* A debounce takes the new job's trace context, as it takes its payload. */
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.enqueue_keyed(ARRAY['t1'], NULL, NULL, unique_keys => ARRAY['k'], "
                       "on_conflicts => ARRAY['replace'], traceparents => ARRAY['" TP2 "'])"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE unique_key = 'k' AND traceparent = '" TP2 "'"), 1);

    /* C: one job, one with parents (the graph), a batch large enough for COPY (which has no room for
     * it: the batch goes through enqueue_many), and each job read back with it. */
    pgjobq_job_spec s = {.payload = "{}", .traceparent = TP};
    s.opts.queue = "t2";
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &id, NULL));
    int64_t parents[] = {id, 0};
    pgjobq_job_spec kid = s;
    kid.opts.after = parents;
    int64_t kid_id = 0;
    CHECK_OK(c, pgjobq_enqueue_spec(c, &kid, &kid_id, NULL));
    pgjobq_job_spec many[600];
    for (int i = 0; i < 600; i++) {
        many[i] = s;
        many[i].opts.queue = "t3";
        many[i].traceparent = i % 2 ? TP : NULL;
    }
    CHECK_OK(c, pgjobq_enqueue_many(c, many, 600, ids, NULL));
    CHECK_INT(count_tp(pg, "t2", TP), 2);
    CHECK_INT(count_tp(pg, "t3", TP), 300);
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND traceparent = '" TP "'", (long long)ids[1]), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND traceparent IS NULL", (long long)ids[0]),
              1);

    /* Read back: pgjobq_job_get, the claim, and a job without one. */
    pgjobq_job *j = NULL, *jobs = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_job_get(c, kid_id, &j));
    CHECK_STR(pgjobq_job_traceparent(j), TP);
    CHECK_STR(j->kind, "default");
    pgjobq_jobs_free(j);
    CHECK_OK(c, pgjobq_job_get(c, ids[0], &j));
    CHECK_MSG(pgjobq_job_traceparent(j) == NULL, "%s", pgjobq_job_traceparent(j));
    pgjobq_jobs_free(j);
    CHECK_MSG(pgjobq_job_traceparent(NULL) == NULL, "NULL job");
    CHECK_OK(c, pgjobq_claim(c, "t2", 10, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, id);
    CHECK_STR(pgjobq_job_traceparent(&jobs[0]), TP);
    CHECK_STR(jobs[0].kind, "default");
    /* Failed for good, it keeps it in the history; retried by hand, it comes back with it. */
    CHECK_OK(c, pgjobq_job_fail(c, id, jobs[0].lease_token, "no", 0, PGJOBQ_FAIL_PERMANENT, NULL));
    pgjobq_jobs_free(jobs);
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND traceparent = '" TP "'", (long long)id), 1);
    char *retried = t_str(pg, "SELECT pgjobq.retry(%lld)", (long long)id);
    CHECK_STR(retried, "queued");
    free(retried);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND traceparent = '" TP "'", (long long)id),
              1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(trace_a_bad_traceparent_is_refused_on_every_path_and_nothing_is_written)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t id = 0;
    char *e, *out = NULL, *err = NULL;

    for (size_t i = 0; i < NBAD; i++) {
        /* SQL, one job: named, with the format. */
        e = refused(pg, "23514", "SELECT pgjobq.enqueue('b', traceparent => '%s')", bad[i]);
        CHECK_MSG(strstr(e, "traceparents[1]") != NULL && strstr(e, "is not a W3C traceparent") != NULL, "%s: %s",
                  bad[i], e);
        free(e);
        /* In a graph: the job named. */
        e = refused(pg, "22023",
                    "SELECT pgjobq.enqueue_graph('[{\"queue\": \"b\"}, {\"queue\": \"b\", \"traceparent\": "
                    "\"%s\"}]')",
                    bad[i]);
        CHECK_MSG(strstr(e, "job 1") != NULL && strstr(e, "is not a W3C traceparent") != NULL, "%s: %s", bad[i], e);
        free(e);
        /* The command: exit 65, nothing enqueued. */
        int status = t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "b", "--traceparent", bad[i], "{}", NULL);
        CHECK_MSG(status == 65 && strstr(err, "is not a W3C traceparent") != NULL, "%s: %d %s", bad[i], status, err);
        free(out);
        free(err);
    }
    /* A batch: the bad one named, and the good ones before and after it not written. */
    e = refused(pg, "23514",
                "SELECT * FROM pgjobq.enqueue_many(ARRAY['b', 'b', 'b'], NULL, NULL, traceparents => "
                "ARRAY['" TP "', '%s', '" TP "'])",
                bad[0]);
    CHECK_MSG(strstr(e, "traceparents[2]") != NULL, "%s", e);
    free(e);
    e = refused(pg, "23514",
                "SELECT * FROM pgjobq.enqueue_keyed(ARRAY['b', 'b'], NULL, NULL, unique_keys => ARRAY['u', "
                "'v'], on_conflicts => ARRAY['replace', 'replace'], traceparents => ARRAY['" TP "', '%s'])",
                bad[2]);
    CHECK_MSG(strstr(e, "traceparents[2]") != NULL, "%s", e);
    free(e);
    e = t_expect_error(pg, "22023", "SELECT pgjobq.enqueue_graph('[{\"queue\": \"b\", \"traceparent\": 1}]')");
    CHECK_MSG(strstr(e, "\"traceparent\" must be a string") != NULL, "%s", e);
    free(e);
    /* A row written by hand: the domain is the one judge. */
    e = refused(pg, "23514", "INSERT INTO pgjobq.jobs (queue, traceparent) VALUES ('b', '%s')", bad[3]);
    free(e);

    /* C: one job, a batch of 600 (COPY's size) with one bad job among them. */
    pgjobq_job_spec s = {.payload = "{}", .traceparent = bad[1]};
    s.opts.queue = "b";
    CHECK_RC(c, pgjobq_enqueue_spec(c, &s, &id, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "is not a W3C traceparent") != NULL, "%s", pgjobq_errmsg(c));
    pgjobq_job_spec many[600];
    for (int i = 0; i < 600; i++) {
        many[i] = s;
        many[i].traceparent = i == 599 ? bad[4] : i % 2 ? TP : NULL;
    }
    CHECK_RC(c, pgjobq_enqueue_many(c, many, 600, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "traceparents[600]") != NULL, "%s", pgjobq_errmsg(c));
    many[599].traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-\xff\xfe";
    CHECK_RC(c, pgjobq_enqueue_many(c, many, 600, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "not valid UTF-8") != NULL, "%s", pgjobq_errmsg(c));

    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'b'"), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Waits until every job of the queue has completed (a deadline of 30 s). */
static int all_completed(PGconn *pg, const char *queue, int n)
{
    int64_t deadline = t_now_ms() + 30000;
    while (t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = '%s' AND state = 'completed'", queue) < n &&
           t_now_ms() < deadline)
        usleep(50000);
    return t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = '%s' AND state = 'completed'", queue) == n;
}

TEST(trace_handed_to_exec_and_coproc_handlers)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char body[1024], path[512], *text;
    int64_t with = 0, without = 0;

    /* --exec: each job writes what TRACEPARENT it got; the worker's own TRACEPARENT never passes. */
    snprintf(body, sizeof body, "cat > /dev/null\nprintf '%%s' \"${TRACEPARENT-none}\" > %s/exec.$PGJOBQ_JOB_ID",
             t_tmpdir());
    const char *exec_handler = strdup(t_script("exec.sh", body));
    pgjobq_job_spec s = {.payload = "{}", .traceparent = TP};
    s.opts.queue = "tx";
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &with, NULL));
    s.traceparent = NULL;
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &without, NULL));
    const char *log = t_log_path("exec");
    pid_t w =
        t_spawn(log, "TRACEPARENT=" TP2, "work", "--queue", "tx:1", "--exec", exec_handler, "--poll", "100ms", NULL);
    int done = all_completed(pg, "tx", 2);
    kill(w, SIGTERM);
    CHECK_INT(t_wait_exit(w, 30000), 0);
    if (!done)
        t_show_log(log);
    CHECK(done);
    snprintf(path, sizeof path, "%s/exec.%lld", t_tmpdir(), (long long)with);
    text = t_read_file(path);
    CHECK_STR(text, TP);
    free(text);
    snprintf(path, sizeof path, "%s/exec.%lld", t_tmpdir(), (long long)without);
    text = t_read_file(path);
    CHECK_STR(text, "none");
    free(text);

    /* --coproc: the message carries "traceparent" for a job that has one, none for the other. */
    snprintf(body, sizeof body,
             "while IFS= read -r line; do\n"
             "  printf '%%s\\n' \"$line\" >> %s/coproc.lines\n"
             "  id=${line#*\\\"id\\\":}; id=${id%%%%,*}\n"
             "  printf '{\"id\":%%s,\"status\":\"completed\"}\\n' \"$id\"\n"
             "done",
             t_tmpdir());
    const char *coproc_handler = strdup(t_script("coproc.sh", body));
    s.opts.queue = "tc";
    s.traceparent = TP;
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &with, NULL));
    s.traceparent = NULL;
    CHECK_OK(c, pgjobq_enqueue_spec(c, &s, &without, NULL));
    log = t_log_path("coproc");
    w = t_spawn(log, "TRACEPARENT=" TP2, "work", "--queue", "tc:1", "--coproc", coproc_handler, "--poll", "100ms",
                NULL);
    done = all_completed(pg, "tc", 2);
    kill(w, SIGTERM);
    CHECK_INT(t_wait_exit(w, 30000), 0);
    if (!done)
        t_show_log(log);
    CHECK(done);
    snprintf(path, sizeof path, "%s/coproc.lines", t_tmpdir());
    text = t_read_file(path);
    char line[1024];
    CHECK_MSG(message_of(text, with, line, sizeof line) && strstr(line, ",\"traceparent\":\"" TP "\"") != NULL, "%s",
              text);
    CHECK_MSG(message_of(text, without, line, sizeof line) && strstr(line, "traceparent") == NULL, "%s", text);
    CHECK_MSG(strstr(text, TP2) == NULL, "%s", text);
    free(text);
    free((void *)exec_handler);
    free((void *)coproc_handler);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(trace_shown_by_show)
{
    PGconn *pg = t_pg();
    char *out = NULL, *err = NULL, ids[24];

    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "sh", "--quiet", "--traceparent", TP, "{}", NULL), 0);
    free(out);
    free(err);
    snprintf(ids, sizeof ids, "%lld", t_int(pg, "SELECT max(id) FROM pgjobq.jobs WHERE queue = 'sh'"));
    CHECK_INT(count_tp(pg, "sh", TP), 1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids, NULL), 0);
    CHECK_MSG(strstr(out, "traceparent:   " TP "\n") != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--json", ids, NULL), 0);
    CHECK_MSG(strstr(out, "\"traceparent\":\"" TP "\"") != NULL, "%s", out);
    free(out);
    free(err);
    /* A job without one: no line, and null in JSON. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "sh", "--quiet", "{}", NULL), 0);
    free(out);
    free(err);
    snprintf(ids, sizeof ids, "%lld", t_int(pg, "SELECT max(id) FROM pgjobq.jobs WHERE queue = 'sh'"));
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids, NULL), 0);
    CHECK_MSG(strstr(out, "traceparent") == NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--json", ids, NULL), 0);
    CHECK_MSG(strstr(out, "\"traceparent\":null") != NULL, "%s", out);
    free(out);
    free(err);
    PQfinish(pg);
}
