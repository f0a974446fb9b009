/*
 * test_first_run.c - the embedded default: no database configured, a private cluster created in
 * $PGJOBQ_HOME on first use, shared by later commands, managed with `pgjobq db`; and `pgjobq demo`.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include "harness.h"

static const char *home;

static void use_fresh_home(void)
{
    home = t_use_embedded_home();
}

TEST_FULL(first_run_demo_creates_reuses_and_stops_the_embedded_database, 240, 0)
{
    char *out, *err;

    use_fresh_home();
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "status", NULL), 3);
    CHECK(strstr(out, "not created yet") != NULL);
    free(out);
    free(err);

    /* First run: creates the cluster, says where once, runs the demo, prints the summary. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "demo", "--jobs", "2000", "--concurrency", "16", NULL), 0);
    CHECK_MSG(strstr(err, "created and started the embedded PostgreSQL in") && strstr(err, home), "stderr: %s", err);
    CHECK_MSG(strstr(out, "pgjobq demo: 2000 jobs") && strstr(out, "throughput") && strstr(out, "pickup latency") &&
                  strstr(out, "attempts") && strstr(out, "pgjobq list --state failed"),
              "stdout: %s", out);
    /* Progress goes to stderr only when it is a terminal; here it is a pipe: plain lines, no escapes. */
    CHECK(strchr(err, '\r') == NULL && strstr(err, "\033[") == NULL);
    free(out);
    free(err);

    /* Second run: the same cluster, nothing created; --json is one JSON document. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "demo", "--jobs", "500", "--json", NULL), 0);
    CHECK(strstr(err, "created") == NULL);
    CHECK_MSG(out[0] == '{' && strstr(out, "\"jobs\":500") && strstr(out, "\"jobs_per_s\":"), "stdout: %s", out);
    free(out);
    free(err);

    /* Every job of both runs ended: completed, or failed after its 3 attempts. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"queued\":0,\"running\":0,") != NULL, "stats: %s", out);
    free(out);
    free(err);

    /* A paused demo queue would hold every job: the demo says so and enqueues nothing. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "pause", "demo", "--reason", "maintenance", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "demo", "--jobs", "10", NULL), EX_TEMPFAIL);
    CHECK_MSG(strstr(err, "queue demo is paused (maintenance)") && strstr(err, "queue resume demo"), "stderr: %s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "resume", "demo", NULL), 0);
    free(out);
    free(err);

    /* The URL works for other programs. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "url", NULL), 0);
    CHECK(strncmp(out, "postgresql://pgjobq@/pgjobq?host=", 33) == 0);
    out[strcspn(out, "\n")] = '\0';
    PGconn *pg = PQconnectdb(out);
    CHECK_MSG(PQstatus(pg) == CONNECTION_OK, "connect to %s: %s", out, PQerrorMessage(pg));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 2500);
    PQfinish(pg);
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "status", NULL), 0);
    CHECK(strstr(out, "running") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "stop", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "status", NULL), 3);
    CHECK(strstr(out, "stopped") != NULL);
    free(out);
    free(err);
    /* Any command starts it again on demand, with its data. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--json", NULL), 0);
    CHECK(strstr(err, "started the embedded PostgreSQL") != NULL && strstr(err, "created") == NULL);
    CHECK(strstr(out, "\"completed\":") != NULL);
    free(out);
    free(err);
}

TEST_FULL(first_run_two_processes_at_once_share_one_cluster, 180, 0)
{
    enum { N = 4 };
    pid_t pids[N];
    char *out, *err;

    static char log[600];

    use_fresh_home();
    snprintf(log, sizeof log, "%s/spawn.log", t_tmpdir());
    for (int i = 0; i < N; i++) {
        char payload[32];
        snprintf(payload, sizeof payload, "{\"p\": %d}", i);
        pids[i] = t_spawn(log, NULL, "enqueue", payload, NULL);
    }
    for (int i = 0; i < N; i++) {
        int status = t_wait_exit(pids[i], 120000);
        if (status != 0) {
            char cmd[700];
            snprintf(cmd, sizeof cmd, "cat %s/spawn.log >&2", t_tmpdir());
            if (system(cmd) != 0)
                fprintf(stderr, "(no log)\n");
        }
        CHECK_MSG(status == 0, "process %d exited with %d", i, status);
    }
    /* One cluster, one schema, every job there. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"total\":{\"queued\":4,") != NULL, "stats: %s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "psql", "-Atc", "SELECT count(*) FROM pgjobq.schema_version", NULL), 0);
    CHECK_INT(atoi(out), PGJOBQ_SCHEMA_VERSION);
    free(out);
    free(err);
}

TEST(first_run_bad_home_is_a_clear_error)
{
    char *out, *err, longhome[300];

    t_use_test_db = 0;
    unsetenv("DATABASE_URL");
    memset(longhome, 'x', sizeof longhome - 1);
    longhome[0] = '/';
    longhome[sizeof longhome - 1] = '\0';
    setenv("PGJOBQ_HOME", longhome, 1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", NULL), EX_CONFIG);
    CHECK(strstr(err, "too long") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "frobnicate", NULL), EX_USAGE);
    free(out);
    free(err);
}

/* As root the server runs as 'postgres', which cannot enter a private directory (PGJOBQ_HOME under
 * /root): say so before initdb, instead of initdb's own failure printed twice. */
TEST(first_run_home_the_server_account_cannot_enter_is_named)
{
    char *out, *err, locked[600], home_path[700];

    if (geteuid() != 0) {
        /* As an ordinary user the server runs as that user, who can enter any home it could create. */
        fprintf(stderr, "not root: the server runs as this user; nothing to check\n");
        return;
    }
    t_use_test_db = 0;
    unsetenv("DATABASE_URL");
    unsetenv("PGJOBQ_DATABASE_URL");
    snprintf(locked, sizeof locked, "%s/private", t_tmpdir());
    CHECK(mkdir(locked, 0700) == 0);
    snprintf(home_path, sizeof home_path, "%s/home", locked);
    setenv("PGJOBQ_HOME", home_path, 1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", NULL), EX_CONFIG);
    CHECK_MSG(strstr(err, "cannot enter") && strstr(err, locked) && strstr(err, "set PGJOBQ_HOME"), "stderr: %s", err);
    CHECK_MSG(strstr(err, "initdb") == NULL, "stderr: %s", err);
    free(out);
    free(err);
}
