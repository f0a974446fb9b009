/*
 * test_cli.c - the pgjobq command: every command end to end, JSON-lines files (all or none), and a
 * table of bad input, each with a clear message, a sysexits.h status, and the database unchanged.
 */
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
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
        {{"enqueue", "--delay", "5s", "--run-at", "2030-01-01", NULL}, EX_USAGE, "not both"},
        {{"enqueue", "--run-at", "garbage", NULL}, EX_DATAERR, "garbage"},
        {{"enqueue", "--run-at", "infinity", NULL}, EX_DATAERR, "run_at"},
        {{"enqueue", "--run-at", "9999-12-31 23:59:59+00", NULL}, EX_OK, NULL},
        {{"enqueue", "--run-at", "1970-01-01 00:00:00+00", NULL}, EX_OK, NULL},
        {{"enqueue", "--unique-key", "", NULL}, EX_DATAERR, "unique key"},
        {{"enqueue", "{}", "{}", NULL}, EX_USAGE, "unexpected argument"},
        {{"enqueue", "--file", "/nonexistent/jobs.jsonl", NULL}, EX_NOINPUT, "cannot read"},
        {{"enqueue", "--file", "-", "{}", NULL}, EX_USAGE, "not both"},
        {{"enqueue", "--queue", NULL}, EX_USAGE, "needs a value"},
        {{"show", "abc", NULL}, EX_USAGE, "whole number"},
        {{"show", "-1", NULL}, EX_USAGE, "option"},
        {{"show", "0", NULL}, EX_USAGE, "range"},
        {{"show", "987654321", NULL}, EX_DATAERR, "no job"},
        {{"show", NULL}, EX_USAGE, "expected ID"},
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
    CHECK_MSG(strstr(out, "all or none.") && strstr(out, "--allow-actions.") && strstr(out, "rate limits."),
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

TEST(cli_help_and_man_page_list_the_same_options)
{
    static const char *const commands[] = {"migrate", "enqueue", "list", "show", "stats", "cancel", "retry", "queue", "cron", "work", "serve", "demo", "db"};
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
        CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", bad[i].url, "stats", NULL), EX_USAGE);
        CHECK_MSG(strstr(err, "the database given by --db is not usable") && strstr(err, bad[i].says) &&
                      strstr(err, "hunter2") == NULL,
                  "--db '%s': %s", bad[i].url, err);
        free(out);
        free(err);
    }
    setenv("DATABASE_URL", "mysql://app:hunter2@db/app", 1);
    t_use_test_db = 0; /* the harness would set $PGJOBQ_DATABASE_URL, which comes first */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", NULL), EX_CONFIG);
    CHECK_MSG(strstr(err, "given by $DATABASE_URL") && strstr(err, "hunter2") == NULL, "stderr: %s", err);
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
