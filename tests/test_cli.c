/*
 * test_cli.c - the pgjobq command: every command end to end, JSON-lines files (all or none), and a
 * table of bad input, each with a clear message, a sysexits.h status, and the database unchanged.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static long long count_jobs(void)
{
    PGconn *pg = t_pg();
    long long n = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs");
    PQfinish(pg);
    return n;
}

TEST(cli_enqueue_show_list_stats_cancel_retry)
{
    char *out, *err;
    char id[32], cmd_id[32];

    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "mail", "--kind", "send", "--priority", "-3",
                    "--max-attempts", "4", "{\"to\": \"ana\"}", NULL),
              0);
    snprintf(id, sizeof id, "%lld", atoll(out));
    CHECK(atoll(out) > 0);
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", id, "--json", NULL), 0);
    CHECK(strstr(out, "\"queue\":\"mail\"") && strstr(out, "\"kind\":\"send\"") && strstr(out, "\"priority\":-3"));
    CHECK(strstr(out, "\"max_attempts\":4") && strstr(out, "\"state\":\"queued\"") && strstr(out, "\"to\": \"ana\""));
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", id, NULL), 0);
    CHECK(strstr(out, "state:         queued") != NULL);
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "list", "--queue", "mail", "--state", "queued", NULL), 0);
    CHECK(strstr(out, "ID") && strstr(out, "mail") && strstr(out, "queued") && strstr(out, id));
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "list", "--json", "--limit", "1", NULL), 0);
    CHECK(out[0] == '[' && strstr(out, "\"id\":") != NULL);
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "{\"queue\":\"mail\",\"queued\":1,") != NULL, "stats: %s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", NULL), 0);
    CHECK(strstr(out, "QUEUE") && strstr(out, "mail"));
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "cancel", id, NULL), 0);
    CHECK(strstr(out, "cancelled") != NULL);
    free(out);
    free(err);
    /* Cancelling again: the job already finished. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cancel", id, NULL), EX_DATAERR);
    CHECK(strstr(err, "already finished") != NULL);
    free(out);
    free(err);

    snprintf(cmd_id, sizeof cmd_id, "%s", id);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", cmd_id, NULL), 0);
    free(out);
    free(err);
    PGconn *pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %s AND state = 'queued'", id), 1);

    /* retry --running: a running job's lease ends now; its holder's writes are refused (issue 36,
     * point 5); a job that is not running is an error. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "--running", id, NULL), EX_DATAERR);
    CHECK_MSG(strstr(err, "not running") != NULL, "stderr: %s", err);
    free(out);
    free(err);
    PGresult *r = t_exec(pg, "SELECT id, lease_token FROM pgjobq.claim('mail', 1, '1 hour', 'rogue')");
    CHECK_INT(PQntuples(r), 1);
    char token[32];
    snprintf(token, sizeof token, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "--running", id, NULL), 0);
    CHECK_MSG(strstr(out, "lease ended, queued to run again now") != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %s AND state = 'queued'", id), 1);
    r = t_exec(pg, "SELECT outcome FROM pgjobq.complete_many(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], NULL)", id,
               token);
    CHECK_STR(PQgetvalue(r, 0, 0), "lost");
    PQclear(r);
    PQfinish(pg);
}

TEST(cli_enqueue_unique_key_and_delay)
{
    char *out, *err, first[32];

    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--unique-key", "nightly", "--delay", "1.5h", NULL), 0);
    snprintf(first, sizeof first, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--unique-key", "nightly", NULL), 0);
    CHECK_STR(out, first);
    CHECK(strstr(err, "already holds unique key") != NULL);
    free(out);
    free(err);
    PGconn *pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 1);
    CHECK_INT(t_int(pg, "SELECT (run_at - created_at = interval '90 minutes')::int FROM pgjobq.all_jobs"), 1);
    PQfinish(pg);
}

/* What docs/sql.md and pgjobq(1) say of a key given twice: accepted, the last value kept. */
TEST(cli_enqueue_duplicate_keys_keep_the_last_value)
{
    char *out, *err, id[32];

    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "{\"to\": \"ana\", \"to\": \"bob\"}", NULL), 0);
    snprintf(id, sizeof id, "%lld", atoll(out));
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", id, "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"payload\":{\"to\": \"bob\"}") != NULL, "show: %s", out);
    free(out);
    free(err);
}

static char *lines(int n, int bad_line, const char *bad)
{
    size_t cap = (size_t)n * 32 + 64, len = 0;
    char *s = malloc(cap);
    CHECK(s != NULL);
    for (int i = 1; i <= n; i++) {
        if (i == bad_line)
            len += (size_t)snprintf(s + len, cap - len, "%s\n", bad);
        else
            len += (size_t)snprintf(s + len, cap - len, "{\"line\": %d}\n", i);
        if (i % 500 == 0)
            len += (size_t)snprintf(s + len, cap - len, "\n"); /* blank lines are skipped */
    }
    return s;
}

TEST(cli_enqueue_file_is_all_or_none)
{
    char *out, *err, *data;

    /* 2,500 lines are three batches of 1,000 in one transaction. */
    data = lines(2500, 0, NULL);
    CHECK_INT(t_cli(&out, &err, data, strlen(data), "enqueue", "--file", "-", "--queue", "bulk", NULL), 0);
    CHECK(strstr(err, "enqueued 2500 jobs") != NULL);
    free(out);
    free(err);
    free(data);
    CHECK_INT(count_jobs(), 2500);

    /* A bad line in the third batch: the first two batches, already sent, are rolled back too. */
    data = lines(2500, 2401, "{\"line\": oops}");
    CHECK_INT(t_cli(&out, &err, data, strlen(data), "enqueue", "--file", "-", NULL), EX_DATAERR);
    CHECK_MSG(strstr(err, "line 2405") != NULL && strstr(err, "nothing was enqueued") != NULL, "stderr: %s", err);
    free(out);
    free(err);
    free(data);
    CHECK_INT(count_jobs(), 2500);

    /* A NUL byte inside a line. */
    static const char nul[] = "{\"a\": 1}\n{\"b\": \"x\0y\"}\n";
    CHECK_INT(t_cli(&out, &err, nul, sizeof nul - 1, "enqueue", "--file", "-", NULL), EX_DATAERR);
    CHECK(strstr(err, "line 2") && strstr(err, "NUL"));
    free(out);
    free(err);

    /* A file the server refuses after the client accepted it (a run-at it cannot parse). */
    data = lines(10, 0, NULL);
    CHECK_INT(t_cli(&out, &err, data, strlen(data), "enqueue", "--file", "-", "--run-at", "soonish", NULL), EX_DATAERR);
    CHECK(strstr(err, "soonish") != NULL);
    free(out);
    free(err);
    free(data);
    CHECK_INT(count_jobs(), 2500);
}

/* A line of --file longer than a payload may be is refused as soon as it passes the limit: the rest
 * of it is never read (a 200 MB line cost 200 MB of memory before it was refused). */
TEST(cli_enqueue_file_refuses_a_long_line_without_reading_it)
{
    enum { TOTAL = 200 * 1024 * 1024 };
    int in[2], err[2], status;
    char chunk[65536], msg[4096];
    size_t written = 0;
    pid_t pid;

    CHECK(pipe(in) == 0 && pipe(err) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(err[1], 2);
        close(in[0]);
        close(in[1]);
        close(err[0]);
        close(err[1]);
        setenv("PGJOBQ_DATABASE_URL", t_conninfo(), 1);
        execl(getenv("PGJOBQ_CLI"), "pgjobq", "enqueue", "--file", "-", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(err[1]);
    signal(SIGPIPE, SIG_IGN);
    /* A good line, then one of 200 MB: written until the command stops reading (EPIPE). */
    CHECK(write(in[1], "{\"ok\": 1}\n{\"big\": \"", 19) == 19);
    memset(chunk, 'x', sizeof chunk);
    while (written < TOTAL) {
        ssize_t n = write(in[1], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        written += (size_t)n;
    }
    close(in[1]);
    size_t got = 0;
    for (ssize_t n; got + 1 < sizeof msg && (n = read(err[0], msg + got, sizeof msg - 1 - got)) != 0;)
        if (n > 0)
            got += (size_t)n;
        else if (errno != EINTR)
            break;
    msg[got] = '\0';
    close(err[0]);
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == EX_DATAERR, "status %d; stderr: %s", status, msg);
    CHECK_MSG(strstr(msg, "line 2: longer than the 1048576-byte payload limit; nothing was enqueued") != NULL,
              "stderr: %s", msg);
    /* Read: the limit, what the pipe and stdio buffer hold; far from the 200 MB. */
    CHECK_MSG(written < 8 * 1024 * 1024, "the command read %zu bytes of the line before refusing it", written);
    CHECK_INT(count_jobs(), 0);
}

/* The ids on stdout are those of jobs that exist: a file of several batches prints them only once
 * its transaction has committed, and none when a later line rolls everything back. */
TEST(cli_enqueue_file_prints_ids_only_after_commit)
{
    char *out, *err, *data;

    data = lines(1500, 1200, "{\"line\": oops}");
    CHECK_INT(t_cli(&out, &err, data, strlen(data), "enqueue", "--file", "-", NULL), EX_DATAERR);
    CHECK_MSG(out[0] == '\0', "ids of jobs that were rolled back: %.200s", out);
    CHECK_MSG(strstr(err, "nothing was enqueued") != NULL, "stderr: %s", err);
    free(out);
    free(err);
    free(data);
    CHECK_INT(count_jobs(), 0);

    /* 2,500 lines in batches of 1,000: every id, once, after the commit, each a job. */
    data = lines(2500, 0, NULL);
    CHECK_INT(t_cli(&out, &err, data, strlen(data), "enqueue", "--file", "-", NULL), 0);
    PGconn *pg = t_pg();
    size_t len = strlen(out);
    CHECK(len > 0 && out[len - 1] == '\n');
    out[len - 1] = '\0';
    for (char *p = out; (p = strchr(p, '\n')) != NULL;)
        *p = ',';
    char *array = malloc(len + 2);
    CHECK(array != NULL);
    snprintf(array, len + 2, "{%s}", out);
    const char *values[1] = {array};
    PGresult *r = PQexecParams(pg,
                               "SELECT count(DISTINCT i), count(j.id) FROM unnest($1::bigint[]) i"
                               " LEFT JOIN pgjobq.all_jobs j ON j.id = i",
                               1, NULL, values, NULL, NULL, 0);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(pg));
    CHECK_STR(PQgetvalue(r, 0, 0), "2500");
    CHECK_STR(PQgetvalue(r, 0, 1), "2500");
    PQclear(r);
    free(array);
    PQfinish(pg);
    free(out);
    free(err);
    free(data);

    /* --quiet prints nothing either way. */
    data = lines(1500, 0, NULL);
    CHECK_INT(t_cli(&out, &err, data, strlen(data), "enqueue", "--file", "-", "--quiet", NULL), 0);
    CHECK_STR(out, "");
    free(out);
    free(err);
    free(data);
    CHECK_INT(count_jobs(), 4000);
}

/* --run-at is held to the rule of every interface, judged by the database (within 100 years of now,
 * past or future: sql/functions/enqueue.sql), one job or a batch (COPY or not): nothing is written. */
TEST(cli_enqueue_run_at_is_within_a_hundred_years)
{
    char *out, *err, *data = lines(600, 0, NULL);
    pgjobq_client *c = t_client();
    pgjobq_job_spec specs[4];
    int64_t ids[4];

    CHECK_INT(t_cli(&out, &err, data, strlen(data), "enqueue", "--file", "-", "--run-at", "99999-01-01", NULL),
              EX_DATAERR);
    CHECK_MSG(strstr(err, "run_ats[1] is 99999-01-01") && strstr(err, "within 100 years of now") &&
                  strstr(err, "nothing") && out[0] == '\0',
              "stderr: %s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, data, strlen(data), "enqueue", "--file", "-", "--batch", "100", "--run-at",
                    "4713-01-01 BC", NULL),
              EX_DATAERR);
    free(out);
    free(err);
    free(data);
    CHECK_INT(count_jobs(), 0);

    /* The database names the job of a batch that is out of range as enqueue_many's element. */
    memset(specs, 0, sizeof specs);
    for (int i = 0; i < 4; i++)
        specs[i].opts.run_at = i == 2 ? "3000-01-01" : "2030-01-01";
    CHECK_RC(c, pgjobq_enqueue_many(c, specs, 4, ids, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "run_ats[3] is 3000-01-01") != NULL, "%s", pgjobq_errmsg(c));
    specs[2].opts.run_at = "now";
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 4, ids, NULL));
    CHECK_INT(count_jobs(), 4);
    pgjobq_client_close(c);
}

/* The bad-input table: arguments, expected status, a word the message must contain. */
TEST(cli_bad_input_gives_a_clear_error_and_changes_nothing)
{
    static const struct {
        const char *args[8];
        int status;
        const char *expect;
    } cases[] = {
        {{"enqueue", "{not json", NULL}, EX_DATAERR, "not valid JSON"},
        {{"enqueue", "", NULL}, EX_DATAERR, "empty"},
        {{"enqueue", "\"\\ud800\"", NULL}, EX_DATAERR, "surrogate"},
        {{"enqueue", "--queue", "it's", NULL}, EX_DATAERR, "queue"},
        {{"enqueue", "--queue", "a;b", NULL}, EX_DATAERR, "queue"},
        {{"enqueue", "--queue", "", NULL}, EX_DATAERR, "empty"},
        {{"enqueue", "--kind", "$$", NULL}, EX_DATAERR, "kind"},
        {{"enqueue", "--kind", "x--", NULL}, EX_OK, NULL}, /* a valid name: proves the table can pass */
        {{"enqueue", "--priority", "high", NULL}, EX_USAGE, "whole number"},
        {{"enqueue", "--priority", "101", NULL}, EX_USAGE, "out of range"},
        {{"enqueue", "--priority", "99999999999999999999", NULL}, EX_USAGE, "range"},
        {{"enqueue", "--max-attempts", "0", NULL}, EX_USAGE, "out of range"},
        {{"enqueue", "--max-attempts", "-2", NULL}, EX_USAGE, "out of range"},
        {{"enqueue", "--delay", "-5s", NULL}, EX_USAGE, "negative"},
        {{"enqueue", "--delay", "5 parsecs", NULL}, EX_USAGE, "unit"},
        {{"enqueue", "--delay", "1e5s", NULL}, EX_USAGE, "unit"},
        {{"enqueue", "--delay", "nan", NULL}, EX_USAGE, "not a duration"},
        {{"enqueue", "--delay", "1000000d", NULL}, EX_USAGE, "100 years"},
        {{"enqueue", "--delay", "5s", "--run-at", "2030-01-01", NULL}, EX_DATAERR, "not both"},
        {{"enqueue", "--run-at", "garbage", NULL}, EX_DATAERR, "garbage"},
        {{"enqueue", "--run-at", "infinity", NULL}, EX_DATAERR, "run_at"},
        {{"enqueue", "--run-at", "9999-12-31 23:59:59+00", NULL}, EX_DATAERR, "100 years"},
        {{"enqueue", "--run-at", "99999-01-01", NULL}, EX_DATAERR, "within 100 years"},
        {{"enqueue", "--run-at", "4713-01-01 00:00:00+00 BC", NULL}, EX_DATAERR, "within 100 years"},
        {{"enqueue", "--run-at", "-infinity", NULL}, EX_DATAERR, "run_at"},
        {{"enqueue", "--run-at", "1901-12-31 23:59:59+00", NULL}, EX_DATAERR, "within 100 years"},
        {{"enqueue", "--run-at", "1970-01-01 00:00:00+00", NULL}, EX_OK, NULL},
        {{"enqueue", "--run-at", "2030-01-01T09:00Z", NULL}, EX_OK, NULL},
        {{"enqueue", "--unique-key", "", NULL}, EX_DATAERR, "key has 1 to 255"},
        {{"enqueue", "--unique-key", "u", "--tag", "t", NULL}, EX_DATAERR, "cannot have a unique key"},
        {{"enqueue", "{}", "{}", NULL}, EX_USAGE, "unexpected argument"},
        {{"enqueue", "--file", "/nonexistent/jobs.jsonl", NULL}, EX_NOINPUT, "cannot read"},
        {{"enqueue", "--file", "-", "{}", NULL}, EX_USAGE, "not both"},
        {{"enqueue", "--queue", NULL}, EX_USAGE, "needs a value"},
        {{"show", "abc", NULL}, EX_USAGE, "whole number"},
        {{"show", "-1", NULL}, EX_USAGE, "option"},
        {{"show", "0", NULL}, EX_USAGE, "range"},
        {{"show", "987654321", NULL}, EX_DATAERR, "no job"},
        {{"show", NULL}, EX_USAGE, "expected ID"},
        /* An id past 2^63-1 is refused, never clamped to another job's. */
        {{"show", "12345678901234567890123456", NULL}, EX_USAGE, "range 1..9223372036854775807"},
        {{"graph", "12345678901234567890123456", NULL}, EX_USAGE, "range 1..9223372036854775807"},
        {{"cancel", "12345678901234567890123456", NULL}, EX_USAGE, "range 1..9223372036854775807"},
        {{"retry", "12345678901234567890123456", NULL}, EX_USAGE, "range 1..9223372036854775807"},
        {{"retry", "--running", "12345678901234567890123456", NULL}, EX_USAGE, "range 1..9223372036854775807"},
        {{"retry", "--running", "987654321", NULL}, EX_DATAERR, "no job"},
        {{"retry", "--running", "-qq", "-sfailed", NULL}, EX_USAGE, "--running goes with a job ID"},
        {{"enqueue", "--after", "12345678901234567890123456", NULL}, EX_USAGE, "not a list of job ids"},
        {{"enqueue", "--after", "7,9223372036854775808", NULL}, EX_USAGE, "not a list of job ids"},
        {{"cancel", "987654321", NULL}, EX_DATAERR, "no job"},
        {{"retry", "987654321", NULL}, EX_DATAERR, "no job"},
        {{"list", "--state", "done", NULL}, EX_USAGE, "unknown state"},
        {{"list", "--limit", "0", NULL}, EX_USAGE, "out of range"},
        {{"list", "--queue", "a b", NULL}, EX_USAGE, "invalid queue"},
        {{"list", "--bogus", NULL}, EX_USAGE, "unknown option"},
        {{"stats", "extra", NULL}, EX_USAGE, "unexpected argument"},
        {{"frobnicate", NULL}, EX_USAGE, "unknown command"},
        {{"--frobnicate", NULL}, EX_USAGE, "unknown option"},
        {{NULL}, EX_USAGE, "usage"},
    };
    long long before = count_jobs();
    int expected_new = 0;

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *a = cases[i].args;
        char *out, *err;
        int status = t_cli(&out, &err, NULL, 0, a[0], a[0] ? a[1] : NULL, a[0] && a[1] ? a[2] : NULL,
                           a[0] && a[1] && a[2] ? a[3] : NULL, a[0] && a[1] && a[2] && a[3] ? a[4] : NULL, NULL);
        CHECK_MSG(status == cases[i].status, "case %zu (%s %s): status %d, expected %d; stderr: %s", i,
                  a[0] ? a[0] : "", a[0] && a[1] ? a[1] : "", status, cases[i].status, err);
        if (cases[i].expect)
            CHECK_MSG(strstr(err, cases[i].expect) != NULL, "case %zu: stderr \"%s\" lacks \"%s\"", i, err,
                      cases[i].expect);
        expected_new += status == EX_OK;
        free(out);
        free(err);
    }
    CHECK_INT(count_jobs(), before + expected_new);
}

TEST(cli_without_a_database_says_how_to_configure_one)
{
    char *out, *err;

    /* --db '' would mean libpq's defaults; an unset configuration is an error with a way out. */
    unsetenv("DATABASE_URL");
    CHECK_INT(
        t_cli(&out, &err, NULL, 0, "--db", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", "stats", NULL),
        EX_UNAVAILABLE);
    CHECK(strstr(err, "connect") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", "postgresql://u:s3cret-pw@127.0.0.1:1/none?connect_timeout=2", "stats",
                    NULL),
              EX_UNAVAILABLE);
    CHECK_MSG(strstr(err, "s3cret-pw") == NULL, "the password leaked: %s", err);
    free(out);
    free(err);
}

TEST_FULL(cli_migrate_is_idempotent, 60, TEST_DB_EMPTY)
{
    char *out, *err;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", NULL), EX_CONFIG);
    CHECK(strstr(err, "pgjobq migrate") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "migrate", NULL), 0);
    CHECK(strstr(out, "migrated to version") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "migrate", NULL), 0);
    CHECK(strstr(out, "up to date") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", NULL), 0);
    free(out);
    free(err);
}

/* migrate --roles says which roles it made sure of: all four. */
TEST(cli_migrate_roles_names_every_role)
{
    static const char *const roles[] = {"pgjobq_producer", "pgjobq_worker", "pgjobq_admin", "pgjobq_monitor", "pgjobq_cross_queue"};
    char *out, *err;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "migrate", "--roles", NULL), 0);
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        CHECK_MSG(strstr(out, roles[i]) != NULL, "migrate --roles does not name %s: %s", roles[i], out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "migrate", "--help", NULL), 0);
    CHECK_MSG(strstr(out, "pgjobq_monitor") && strstr(out, "pgjobq_cross_queue"), "migrate --help: %s", out);
    free(out);
    free(err);
}

TEST(cli_help_and_version)
{
    char *out, *err;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "--version", NULL), 0);
    CHECK(strstr(out, PGJOBQ_VERSION) != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--help", NULL), 0);
    CHECK(strstr(out, "enqueue") && strstr(out, "migrate"));
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--help", NULL), 0);
    CHECK(strstr(out, "--unique-key") && strstr(out, "--file"));
    free(out);
    free(err);

    /* Every summary whole (none cut at its first line), no line wider than 100 columns, and the
     * hints name the program as it was run (a path here). */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--help", NULL), 0);
    CHECK_MSG(strstr(out, "all or none.") && strstr(out, "--allow-actions.") && strstr(out, "longest lease."),
              "--help: %s", out);
    for (const char *line = out; *line; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] != '\0'))
        CHECK_MSG(strcspn(line, "\n") <= 100, "--help line wider than 100 columns: %.*s", (int)strcspn(line, "\n"),
                  line);
    CHECK_MSG(strstr(out, "Run `pgjobq COMMAND") == NULL && strstr(out, "/pgjobq COMMAND --help`"), "--help: %s", out);
    free(out);
    free(err);
    /* `pgjobq help` and `pgjobq help COMMAND`. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "help", NULL), 0);
    CHECK(strstr(out, "Commands:") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "help", "work", NULL), 0);
    CHECK(strstr(out, "usage: pgjobq work") != NULL);
    /* A long option name gets its own line: every help text starts in the same column. */
    for (const char *l = strstr(out, "Options:"); l && *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0')) {
        size_t len = strcspn(l, "\n");
        if (strncmp(l, "  -", 3) != 0 && strncmp(l, "      --", 8) != 0)
            continue;
        /* The help starts after the first run of two or more spaces past the option; a line without
         * one is an option on a line of its own (its help is on the next). */
        size_t gap = 8;
        while (gap + 1 < len && !(l[gap] == ' ' && l[gap + 1] == ' '))
            gap++;
        if (gap + 1 >= len)
            gap = len;
        while (gap < len && l[gap] == ' ')
            gap++;
        if (gap < len && gap != 29)
            t_fail(__FILE__, __LINE__, "work --help: an option's help out of its column: %.*s", (int)len, l);
    }
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "help", "frobnicate", NULL), 64);
    free(out);
    free(err);
}

/* Every option `pgjobq CMD --help` lists is documented in that command's section of pgjobq(1), and
 * the man page documents no option the command lacks. */
static void options_in(const char *text, const char *end, char opts[][32], int *n)
{
    /* Work on a copy with roff's "\-" turned into "-". */
    size_t len = (size_t)(end - text), k = 0;
    char *plain = malloc(len + 1);
    CHECK(plain != NULL);
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\\' && i + 1 < len && text[i + 1] == '-')
            continue;
        plain[k++] = text[i];
    }
    plain[k] = '\0';
    for (const char *p = plain; (p = strstr(p, "--")) != NULL; p += 2) {
        char name[32];
        int m = 0;
        const char *q = p + 2;
        while (m < 31 && ((*q >= 'a' && *q <= 'z') || *q == '-'))
            name[m++] = *q++;
        name[m] = '\0';
        if (m == 0)
            continue;
        int seen = 0;
        for (int i = 0; i < *n; i++)
            seen |= strcmp(opts[i], name) == 0;
        if (!seen && *n < 64)
            snprintf(opts[(*n)++], 32, "%s", name);
    }
    free(plain);
}

/* `pgjobq work --print-defaults` prints the library's defaults (pgjobq_worker_opts_defaults, the one
 * source the Python package reads them from), with the options given on the line, and connects to
 * nothing. */
TEST(cli_work_print_defaults_are_the_librarys)
{
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    char want[512], *out = NULL, *err = NULL;

    pgjobq_worker_opts_defaults(&o);
    CHECK(o.lease_ms > 0 && o.timeout_ms > 0 && o.timeout_ms < o.lease_ms && o.heartbeat_ms < o.lease_ms);
    snprintf(want, sizeof want,
             "{\"lease_ms\":%lld,\"heartbeat_ms\":%lld,\"timeout_ms\":%lld,\"poll_ms\":%lld,"
             "\"shutdown_timeout_ms\":%lld,\"batch_max\":%d,\"concurrency\":%d}\n",
             (long long)o.lease_ms, (long long)o.heartbeat_ms, (long long)o.timeout_ms, (long long)o.poll_ms,
             (long long)o.shutdown_timeout_ms, o.batch_max, PGJOBQ_DEFAULT_CONCURRENCY);
    t_use_test_db = 0; /* no database is needed */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--print-defaults", NULL), 0);
    CHECK_STR(out, want);
    free(out);
    free(err);
    /* With a lease of two minutes, the heartbeat and the timeout follow it. */
    memset(&o, 0, sizeof o);
    o.lease_ms = 120000;
    pgjobq_worker_opts_defaults(&o);
    CHECK_INT(o.timeout_ms, 96000);
    CHECK_INT(o.heartbeat_ms, 40000);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--lease", "2m", "--print-defaults", NULL), 0);
    CHECK_MSG(strstr(out, "\"lease_ms\":120000,\"heartbeat_ms\":40000,\"timeout_ms\":96000,") != NULL, "%s", out);
    free(out);
    free(err);
    t_use_test_db = 1;
}

TEST(cli_help_and_man_page_list_the_same_options)
{
    static const char *const commands[] = {"migrate", "enqueue", "list", "show", "stats", "cancel", "retry", "skip", "queue", "cron", "work", "serve", "demo", "db", "cluster", "step", "send-event"};
    const char *src = getenv("PGJOBQ_SRCDIR") ? getenv("PGJOBQ_SRCDIR") : ".";
    char path[1024], *man;
    FILE *f;
    long size;

    snprintf(path, sizeof path, "%s/docs/pgjobq.1", src);
    f = fopen(path, "r");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    rewind(f);
    man = calloc(1, (size_t)size + 1);
    CHECK(man && fread(man, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    /* The common options are documented once, in their own section. */
    const char *common = strstr(man, ".SH COMMON OPTIONS");
    CHECK(common && strstr(common, "\\-\\-db") && strstr(common, "\\-\\-help"));

    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char heading[64], *out, *err, help[64][32], doc[64][32];
        int nh = 0, nd = 0;
        snprintf(heading, sizeof heading, ".SS \"pgjobq %s", commands[i]);
        const char *sec = strstr(man, heading);
        CHECK_MSG(sec != NULL, "pgjobq(1) has no section for %s", commands[i]);
        const char *end = strstr(sec + 4, ".SS ");
        if (end == NULL)
            end = strstr(sec, ".SH ");
        CHECK_INT(t_cli(&out, &err, NULL, 0, commands[i], "--help", NULL), 0);
        const char *opts = strstr(out, "Options:");
        CHECK(opts != NULL);
        options_in(opts, opts + strlen(opts), help, &nh);
        options_in(sec, end, doc, &nd);
        for (int h = 0; h < nh; h++) {
            if (strcmp(help[h], "db") == 0 || strcmp(help[h], "help") == 0)
                continue;
            int found = 0;
            for (int d = 0; d < nd; d++)
                found |= strcmp(help[h], doc[d]) == 0;
            CHECK_MSG(found, "pgjobq %s --%s is not in pgjobq(1)", commands[i], help[h]);
        }
        for (int d = 0; d < nd; d++) {
            int found = 0;
            for (int h = 0; h < nh; h++)
                found |= strcmp(help[h], doc[d]) == 0;
            CHECK_MSG(found, "pgjobq(1) documents --%s for %s, which --help lacks", doc[d], commands[i]);
        }
        free(out);
        free(err);
    }
    free(man);
}

/* What is not a PostgreSQL URL or conninfo is refused before any connection, naming where it came
 * from and never quoting it (it may hold a password); a connection that fails says where its URL
 * came from. */
TEST(cli_database_urls_that_are_not_postgresql_are_refused)
{
    char *out, *err;
    static const struct {
        const char *url, *says;
    } bad[] = {
        {"mysql://app:hunter2@db/app", "a mysql:// URL"},
        {"not a url", "neither a postgresql:// URL nor a conninfo"},
        {"", "empty"},
        {"   ", "empty"},
    };

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", bad[i].url, "stats", NULL), EX_CONFIG);
        CHECK_MSG(strstr(err, "the database URL (--db) is not usable") && strstr(err, bad[i].says) &&
                      strstr(err, "hunter2") == NULL,
                  "--db '%s': %s", bad[i].url, err);
        free(out);
        free(err);
    }
    setenv("DATABASE_URL", "mysql://app:hunter2@db/app", 1);
    t_use_test_db = 0; /* the harness would set $PGJOBQ_DATABASE_URL, which comes first */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", NULL), EX_CONFIG);
    CHECK_MSG(strstr(err, "the database URL ($DATABASE_URL)") && strstr(err, "hunter2") == NULL, "stderr: %s", err);
    free(out);
    free(err);
    unsetenv("DATABASE_URL");
    t_use_test_db = 1;
    /* A conninfo and a URL are taken; one that cannot connect says where it came from. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", "host=/nonexistent-dir dbname=x connect_timeout=2", "stats", NULL),
              EX_UNAVAILABLE);
    CHECK_MSG(strstr(err, "(the database URL came from --db)"), "stderr: %s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", "postgresql:///x?host=/nonexistent-dir", "stats", NULL),
              EX_UNAVAILABLE);
    free(out);
    free(err);
}

/* The file's text ("" while it does not exist yet). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *text = calloc(1, 1 << 20);
    CHECK(text != NULL);
    if (f) {
        size_t n = fread(text, 1, (1 << 20) - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    return text;
}

static int log_says(void *path)
{
    char *text = slurp(path);
    int found = strstr(text, "cannot connect the claim connection") != NULL;
    free(text);
    return found;
}

/* A URL libpq parses but cannot use (a "port" that was half the password): the worker retries, as it
 * does while a database is down, and logs each streak of failures without the password. */
static void worker_retries_without_the_password(const char *url, const char *secret)
{
    const char *log = t_log_path("retrying");
    pid_t w = t_spawn(log, NULL, "--db", url, "work", "--exec", "/bin/true", "--log-level", "debug", NULL);
    int ok = t_wait_until(log_says, (void *)log, 30000);
    kill(w, SIGTERM);
    CHECK_INT(t_wait_exit(w, 30000), 0);
    char *text = slurp(log);
    CHECK_MSG(ok, "the worker did not say it cannot connect:\n%s", text);
    CHECK_MSG(strstr(text, secret) == NULL, "the worker's log shows the password:\n%s", text);
    free(text);
}

/* A database URL libpq cannot parse (its error quotes the URL, or the token it choked on) makes every
 * command fail at once with a sysexits status, and its password appears in neither stdout nor
 * stderr: as --db and as $DATABASE_URL, in every form of tests/test_redact.c. */
TEST_FULL(cli_redacts_the_password_of_a_malformed_url_in_every_command, 180, 0)
{
    static const struct {
        const char *url, *secret;
    } urls[] = {
        {"postgresql://alice:Zq7Secret1@[::1/db", "Zq7Secret1"},
        {"postgres://alice:Zq7Secret2@[::1]x/db", "Zq7Secret2"},
        {"postgresql://alice:Zq7%zzSecret3@localhost/db", "Secret3"},
        {"postgresql://alice:Zq7%53ecret4%2F%40x@[::1/db", "ecret4"},
        {"postgresql://[::1/db?user=alice&password=Zq7Secret5", "Zq7Secret5"},
        {"postgresql://[::1]/db?password=pw&Zq7Secret6", "Zq7Secret6"},
        {"postgresql://alice:Zq7Secret7/x@[::1]/db", "Zq7Secret7"},
        {"host=/nonexistent password=pw Zq7Secret8", "Zq7Secret8"},
        {"host=/nonexistent password = 'pw Zq7Secret9' 'bogus", "Zq7Secret9"},
    };
    static const char *const commands[][5] = {
        {"stats"}, {"list"}, {"show", "1"}, {"graph", "1"}, {"health"}, {"migrate"}, {"migrate", "--roles"},
        {"enqueue", "{}"}, {"enqueue", "--file", "-"}, {"cancel", "1"}, {"retry", "1"}, {"queue", "ls"},
        {"queue", "pause", "q"}, {"cron", "ls"}, {"work", "--exec", "/bin/true"},
        {"serve", "--listen", "127.0.0.1:0"},
    };
    static const char lines[] = "{}\n{}\n";

    for (size_t u = 0; u < sizeof urls / sizeof urls[0]; u++) {
        for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++) {
            const char *const *a = commands[k];
            if (strcmp(a[0], "work") == 0 && pgjobq_conninfo_check(urls[u].url, NULL, 0) == PGJOBQ_OK) {
                worker_retries_without_the_password(urls[u].url, urls[u].secret);
                continue;
            }
            for (int via_env = 0; via_env < 2; via_env++) {
                char *out, *err;
                int status;
                /* Every command through --db; two of them through the environment too. */
                if (via_env && k > 1)
                    continue;
                t_use_test_db = !via_env;
                if (via_env)
                    setenv("DATABASE_URL", urls[u].url, 1);
                else
                    unsetenv("DATABASE_URL");
                if (via_env)
                    status = t_cli(&out, &err, lines, sizeof lines - 1, a[0], a[1], a[2], a[3], NULL);
                else
                    status = t_cli(&out, &err, lines, sizeof lines - 1, "--db", urls[u].url, a[0], a[1], a[2], a[3],
                                   NULL);
                CHECK_MSG(status >= EX__BASE && status <= EX__MAX, "pgjobq %s with %s: status %d; stderr: %s", a[0],
                          urls[u].url, status, err);
                CHECK_MSG(strstr(out, urls[u].secret) == NULL && strstr(err, urls[u].secret) == NULL,
                          "pgjobq %s %s with %s shows the password:\nstdout: %s\nstderr: %s", a[0], a[1] ? a[1] : "",
                          urls[u].url, out, err);
                CHECK_MSG(err[0] != '\0', "pgjobq %s with %s: no message", a[0], urls[u].url);
                free(out);
                free(err);
            }
        }
    }
    t_use_test_db = 1;
    unsetenv("DATABASE_URL");
}

/* Where text has a byte a terminal acts on (C0 other than the newlines of the layout, DEL, or the
 * start of a C1 control), or -1. */
static long control_at(const char *text)
{
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        if ((*p < 0x20 && *p != '\n') || *p == 0x7f || (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
            return (long)(p - (const unsigned char *)text);
    return -1;
}

static int lines_in(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++)
        n += *p == '\n';
    return n;
}

/* An --exec handler's stderr (the job's last_error) and a worker id can hold anything: what show and
 * list print of them has no byte that moves the cursor, retitles the window or starts a fake line. */
TEST(cli_show_and_list_escape_control_characters)
{
    static const char worker[] = "w\033]0;pwned\007\r\nFAKE \xc2\x9b" "2J";
    static const char error[] = "boom\033[2J\007\rcarriage\nfake line\ttab\x7f";
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    char id[32], *out, *err;
    long at;

    o.queue = "ctl";
    CHECK_OK(c, pgjobq_enqueue(c, "{\"x\": \"\\u001b[2J\"}", &o, NULL));
    CHECK_OK(c, pgjobq_claim(c, "ctl", 1, 60000, worker, &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_OK(c, pgjobq_job_fail(c, jobs[0].id, jobs[0].lease_token, error, 0, PGJOBQ_FAIL_PERMANENT, NULL));
    snprintf(id, sizeof id, "%lld", (long long)jobs[0].id);
    pgjobq_jobs_free(jobs);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", id, NULL), 0);
    CHECK_MSG((at = control_at(out)) < 0, "show prints a control byte at %ld:\n%s", at, out);
    CHECK_MSG(strstr(out, "worker_id:     w\\e]0;pwned\\a\\r\\nFAKE \\u009b2J\n") != NULL, "show:\n%s", out);
    CHECK_MSG(strstr(out, "last_error:    boom\\e[2J\\a\\rcarriage\\nfake line\\ttab\\x7f\n") != NULL, "show:\n%s",
              out);
    /* Every line is one of show's fields. */
    for (const char *line = out; *line; line = strchr(line, '\n') + 1)
        CHECK_MSG(line[0] >= 'a' && line[0] <= 'z' && strcspn(line, ":") < strcspn(line, " \n"),
                  "show prints a line that is no field: %.*s", (int)strcspn(line, "\n"), line);
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "list", "--queue", "ctl", NULL), 0);
    CHECK_MSG((at = control_at(out)) < 0, "list prints a control byte at %ld:\n%s", at, out);
    CHECK_MSG(lines_in(out) == 2 && strstr(out, "boom\\e[2J\\a\\rcarriage") != NULL, "list:\n%s", out);
    free(out);
    free(err);

    /* JSON escapes them its own way. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", id, "--json", NULL), 0);
    CHECK_MSG(control_at(out) < 0 && strstr(out, "\"worker_id\":\"w\\u001b]0;pwned\\u0007\\r\\nFAKE") != NULL,
              "show --json: %s", out);
    free(out);
    free(err);

    /* A pause reason in queue ls; a unique key quoted in a message. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "pause", "ctl", "--reason", "relay\033[2J\r\ndown", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", NULL), 0);
    CHECK_MSG(control_at(out) < 0 && strstr(out, "relay\\e[2J\\r\\ndown\n") != NULL, "queue ls:\n%s", out);
    free(out);
    free(err);
    for (int i = 0; i < 2; i++) {
        CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--unique-key", "k\033]0;x\007", NULL), 0);
        CHECK_MSG(control_at(err) < 0, "enqueue: %s", err);
        free(out);
        free(err);
    }
    pgjobq_client_close(c);
}

/* The worker's log lines carry a coprocess's stderr and the worker id: one line each, escaped. */
TEST(cli_work_log_escapes_control_characters)
{
    const char *handler = t_script("coproc.sh", "while IFS= read -r line; do\n"
                                                "  id=${line#*\\\"id\\\":}; id=${id%%,*}\n"
                                                "  printf 'handler says \\033]0;pwned\\007\\r\\n' >&2\n"
                                                "  printf '{\"id\":%s,\"status\":\"completed\"}\\n' \"$id\"\n"
                                                "done\n");
    const char *log = t_log_path("work");
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id = 0;
    PGconn *pg = t_pg();

    o.queue = "ctl";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    pid_t w = t_spawn(log, NULL, "work", "--queue", "ctl:1", "--coproc", handler, "--worker-id", "w\033[2J\r\nFAKE",
                      "--poll", "100ms", NULL);
    int64_t deadline = t_now_ms() + 30000;
    while (t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'", (long long)id) == 0 &&
           t_now_ms() < deadline)
        usleep(50000);
    kill(w, SIGTERM);
    CHECK_INT(t_wait_exit(w, 30000), 0);
    char *text = slurp(log);
    CHECK_MSG(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'", (long long)id) == 1,
              "the job did not complete:\n%s", text);
    CHECK_MSG(strstr(text, "handler says \\e]0;pwned\\a\\r") != NULL && strstr(text, "w\\e[2J\\r\\nFAKE") != NULL,
              "log:\n%s", text);
    CHECK_MSG(control_at(text) < 0, "the log has a control byte:\n%s", text);
    free(text);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* What an --exec or --coproc handler finds in its environment: the worker's, without any variable
 * libpq reads (the database, the user, the password, the TLS key, ...), any pgjobq setting (the URL,
 * the serve token) or DATABASE_URL; with its job's PGJOBQ_* variables, or a coprocess's protocol
 * version (PGJOBQ_COPROC_PROTOCOL, docs/coproc.md). */
static void check_handler_env(const char *path, int with_job_vars)
{
    static const char *const job_vars[] = {"PGJOBQ_JOB_ID=", "PGJOBQ_QUEUE=", "PGJOBQ_KIND=", "PGJOBQ_ATTEMPT=",
                                           "PGJOBQ_MAX_ATTEMPTS=", "PGJOBQ_LEASE_TOKEN=", NULL};
    char *text = slurp(path);
    int job_vars_seen = 0;

    CHECK_MSG(strstr(text, "\nKEEP_ME=yes\n") != NULL || strncmp(text, "KEEP_ME=yes\n", 12) == 0,
              "%s lacks the worker's own variables:\n%s", path, text);
    for (const char *line = text; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
        int job_var = 0;
        for (int i = 0; job_vars[i]; i++)
            job_var |= strncmp(line, job_vars[i], strlen(job_vars[i])) == 0;
        job_vars_seen += job_var;
        int protocol = !with_job_vars && strncmp(line, "PGJOBQ_COPROC_PROTOCOL=", 23) == 0;
        CHECK_MSG(job_var || protocol || (strncmp(line, "PG", 2) != 0 && strncmp(line, "DATABASE_URL=", 13) != 0),
                  "a handler inherited %.*s", (int)strcspn(line, "\n"), line);
    }
    CHECK_INT(job_vars_seen, with_job_vars ? 6 : 0);
    CHECK_MSG(strstr(text, "hunter2") == NULL && strstr(text, "leak") == NULL && strstr(text, "serve-token") == NULL,
              "a secret reached a handler:\n%s", text);
    free(text);
}

TEST_FULL(cli_work_handlers_inherit_no_database_settings_or_secrets, 120, 0)
{
    static const char *const vars[][2] = {
        {"PGHOST", "/nonexistent"}, {"PGPORT", "1"}, {"PGDATABASE", "nowhere"}, {"PGUSER", "nobody"},
        {"PGPASSWORD", "hunter2"}, {"PGPASSFILE", "/nonexistent/pgpass"}, {"PGSERVICEFILE", "/nonexistent/svc"},
        {"PGSSLKEY", "/secret/key.pem"}, {"PGSSLMODE", "disable"}, {"PGAPPNAME", "app"}, {"PGCONNECT_TIMEOUT", "10"},
        {"PGCLIENTENCODING", "UTF8"}, {"PGGSSENCMODE", "disable"}, {"PGKRBSRVNAME", "postgres"},
        {"PGTARGETSESSIONATTRS", "any"}, {"PGJOBQ_SERVE_TOKEN", "serve-token-0123456789"},
        {"PGJOBQ_HOME", "/secret/home"}, {"DATABASE_URL", "postgresql://u:leak@h/db"}, {"KEEP_ME", "yes"},
    };
    char body[1024], exec_env[512], coproc_env[512];
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    const char *handlers[2];

    snprintf(exec_env, sizeof exec_env, "%s/exec.env", t_tmpdir());
    snprintf(coproc_env, sizeof coproc_env, "%s/coproc.env", t_tmpdir());
    snprintf(body, sizeof body, "env > %s\ncat > /dev/null", exec_env);
    handlers[0] = strdup(t_script("exec.sh", body));
    snprintf(body, sizeof body,
             "env > %s\n"
             "while IFS= read -r line; do\n"
             "  id=${line#*\\\"id\\\":}; id=${id%%,*}\n"
             "  printf '{\"id\":%%s,\"status\":\"completed\"}\\n' \"$id\"\n"
             "done",
             coproc_env);
    handlers[1] = strdup(t_script("coproc.sh", body));
    o.queue = "envq";
    for (int k = 0; k < 2; k++) {
        int64_t id = 0;
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
        /* Set for the worker only: this process's own connections are open already. */
        for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
            setenv(vars[i][0], vars[i][1], 1);
        const char *log = t_log_path(k ? "coproc" : "exec");
        pid_t w = t_spawn(log, NULL, "work", "--queue", "envq:1", k ? "--coproc" : "--exec", handlers[k], "--poll",
                          "100ms", NULL);
        for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
            unsetenv(vars[i][0]);
        int64_t deadline = t_now_ms() + 30000;
        while (t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'",
                     (long long)id) == 0 &&
               t_now_ms() < deadline)
            usleep(50000);
        kill(w, SIGTERM);
        CHECK_INT(t_wait_exit(w, 30000), 0);
        if (t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'", (long long)id) == 0)
            t_show_log(log);
        CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'", (long long)id),
                  1);
    }
    check_handler_env(exec_env, 1);
    check_handler_env(coproc_env, 0);
    free((void *)handlers[0]);
    free((void *)handlers[1]);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Mistakes a new user makes, named: a queue given as an argument, a list cut at its limit, a job
 * enqueued to a paused queue. */
TEST(cli_first_hour_mistakes_are_named)
{
    char *out, *err;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "mail", "{\"a\":1}", NULL), EX_USAGE);
    CHECK_MSG(strstr(err, "give --queue mail PAYLOAD"), "stderr: %s", err);
    free(out);
    free(err);

    for (int i = 0; i < 5; i++) {
        CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "fh", "{}", NULL), 0);
        free(out);
        free(err);
    }
    CHECK_INT(t_cli(&out, &err, NULL, 0, "list", "--queue", "fh", "--limit", "3", NULL), 0);
    CHECK_MSG(strstr(err, "the newest 3 jobs shown; there are more"), "stderr: %s", err);
    int lines = 0;
    for (const char *p = out; (p = strchr(p, '\n')) != NULL; p++)
        lines++;
    CHECK_INT(lines, 4); /* the header and 3 jobs */
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "list", "--queue", "fh", "--limit", "5", NULL), 0);
    CHECK_MSG(strstr(err, "there are more") == NULL, "stderr: %s", err);
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "pause", "fh", "--reason", "relay down", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "fh", "{}", NULL), 0);
    CHECK_MSG(strstr(err, "note: queue fh is paused (relay down)") && strstr(err, "queue resume fh"), "stderr: %s", err);
    CHECK_MSG(atoll(out) > 0, "stdout: %s", out);
    free(out);
    free(err);
}

/* pgjobq bench refuses what it cannot run before it reaches a database (here: before it would create
 * the embedded one), and takes --rate 0, which soak documents as saturation. */
TEST(cli_bench_refuses_bad_scenarios_before_any_database_and_takes_rate_0)
{
    char *out, *err;
    const char *home = t_use_embedded_home();
    char data[4096];

    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "--rate", "0", "nosuch", NULL), 64);
    CHECK_MSG(strstr(err, "unknown scenario 'nosuch'") != NULL, "%s", err);
    CHECK_MSG(strstr(err, "--rate") == NULL, "%s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "drain-coproc", NULL), 64);
    CHECK_MSG(strstr(err, "drain-coproc needs --handler") != NULL, "%s", err);
    free(out);
    free(err);
    /* The queue's concurrency limit is a drain's, and at least 1. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "--limit", "5", "steady", NULL), 64);
    CHECK_MSG(strstr(err, "--limit goes with the drain scenarios") != NULL, "%s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "--limit", "0", "drain", NULL), 64);
    CHECK_MSG(strstr(err, "--limit") != NULL, "%s", err);
    free(out);
    free(err);
    snprintf(data, sizeof data, "%s/data", home);
    CHECK_MSG(access(data, F_OK) != 0, "%s exists: the embedded database was created", data);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "--rate", "-1", "soak", NULL), 64);
    CHECK_MSG(strstr(err, "--rate") != NULL, "%s", err);
    free(out);
    free(err);
}

/* The number after "key": in a line of JSON; -1 when the key is missing. */
static double json_field(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* bench mixed runs end to end against a real server: its producer offers at most what the schedule
 * asks, its workers complete jobs after the warm-up, and it reports the offer of the window it judges
 * (the last 3 s of 4: the warm-up is a quarter of a short run), which cannot hold more than was
 * enqueued. */
TEST(cli_bench_mixed_runs_and_reports_the_window_it_judges)
{
    char *out, *err;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "mixed", "--seconds", "4", "--rate", "400", "--processes", "1",
                    "--concurrency", "4", "--json", NULL),
              0);
    double enqueued = json_field(out, "enqueued"), offered = json_field(out, "offered_per_s"),
           window = json_field(out, "offered_steady_per_s"), done = json_field(out, "jobs_per_s"),
           depth = json_field(out, "depth_end");
    CHECK_MSG(enqueued >= 200 && enqueued <= 400 * 4 + 4, "stdout: %s\nstderr: %s", out, err);
    CHECK_MSG(offered > 0 && window > 0 && done > 0 && depth >= 0, "stdout: %s\nstderr: %s", out, err);
    CHECK_MSG(window * 2.9 <= enqueued, "stdout: %s", out);
    CHECK_MSG(strstr(out, "\"kept_up\":") != NULL, "stdout: %s", out);
    free(out);
    free(err);
}

/* pgjobq bench steady --floor: the minimal table driven by the same producers and NOTIFY-woken
 * minimal workers (bench/floor.sh compares pgjobq with it); what it offered, it completed, and the
 * pickup comes from its own rows. */
TEST(cli_bench_steady_floor_drives_the_minimal_table_and_measures_its_pickup)
{
    PGconn *pg = t_pg();
    char *out, *err;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "steady", "--floor", "--seconds", "4", "--window", "2", "--rate",
                    "1000", "--processes", "1", "--concurrency", "4", "--json", NULL),
              0);
    CHECK_MSG(strstr(out, "\"target\":\"floor\"") != NULL, "stdout: %s\nstderr: %s", out, err);
    double offered = json_field(out, "offered"), completed = json_field(out, "completed"),
           p99 = json_field(out, "pickup_p99_ms_last"), to_claim = json_field(out, "to_claim_p99_ms_last");
    CHECK_MSG(offered >= 1000 && completed >= 0.98 * offered, "stdout: %s\nstderr: %s", out, err);
    CHECK_MSG(p99 > 0 && to_claim > 0 && to_claim <= p99 * 1.1, "stdout: %s", out);
    /* The floor's rows, not pgjobq's: each batch the producers inserted, marked done by its workers. */
    CHECK(t_int(pg, "SELECT count(*) FROM bench_floor.jobs WHERE state = 'done'") >= (long long)completed);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'bench'"), 0);
    free(out);
    free(err);
    PQfinish(pg);
}

/* pgjobq work --burst: runs what is due, a child its parent released included, then exits 0 by
 * itself; a job due later stays queued. */
TEST_FULL(cli_work_burst_drains_what_is_due_then_exits_0, 120, 0)
{
    PGconn *pg = t_pg();
    const char *log = t_log_path("burst");

    long long parent = t_int(pg, "SELECT id FROM pgjobq.enqueue(queue => 'burst', payload => '{}')");
    PQclear(
        t_exec(pg, "SELECT pgjobq.enqueue(queue => 'burst', payload => '{}', after => ARRAY[%lld::bigint])", parent));
    for (int i = 0; i < 5; i++)
        PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'burst', payload => '{}')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'burst', payload => '{}', delay => interval '1 hour')"));
    pid_t w = t_spawn(log, NULL, "work", "--queue", "burst:2", "--exec", "/bin/true", "--burst", NULL);
    int rc = t_wait_exit(w, 60000);
    if (rc != 0)
        t_show_log(log);
    CHECK_INT(rc, 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'burst' AND state = 'completed'"), 7);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'burst' AND state = 'queued'"), 1);
    PQfinish(pg);
}
