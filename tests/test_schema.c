/*
 * test_schema.c - migrations, the schema version check, and the CHECK constraints that stop a raw
 * INSERT which bypasses the library.
 */
#include <glob.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* A file of the source tree (PGJOBQ_SRCDIR, which make check sets), read whole into a malloc'd string. */
static char *src_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0 && fseek(f, 0, SEEK_SET) == 0);
    char *s = malloc((size_t)n + 1);
    CHECK(s != NULL);
    CHECK(fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = '\0';
    CHECK(fclose(f) == 0);
    return s;
}

static const char *srcdir(void)
{
    const char *dir = getenv("PGJOBQ_SRCDIR");
    CHECK_MSG(dir != NULL, "PGJOBQ_SRCDIR is not set (make check sets it)");
    return dir;
}

/* The released migration of schema version v (tests/fixtures/released: the migrations as pgjobq
 * released them, each creating its own functions, before sql/functions held them). */
static char *released_migration(int v)
{
    char pattern[4096];
    glob_t g;

    snprintf(pattern, sizeof pattern, "%s/tests/fixtures/released/%03d_*.sql", srcdir(), v);
    CHECK_MSG(glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc == 1, "no single file matches %s", pattern);
    char *sql = src_read(g.gl_pathv[0]);
    globfree(&g);
    return sql;
}

/* Runs a script of several statements (longer than t_exec takes). */
static void run_script(PGconn *pg, const char *sql, const char *what)
{
    PGresult *r = PQexec(pg, sql);
    CHECK_MSG(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s", what,
              PQerrorMessage(pg));
    PQclear(r);
}

/* Makes the database what an earlier pgjobq left at schema version k: the released migrations 1..k,
 * each recorded as that pgjobq's runner did (with its "-- needs: N" from version 7 on). */
static void build_released(PGconn *pg, int k)
{
    for (int v = 1; v <= k; v++) {
        char *sql = released_migration(v);
        run_script(pg, sql, "a released migration");
        if (v >= 7) {
            const char *needs = strstr(sql, "\n-- needs: ");
            PQclear(t_exec(pg, "INSERT INTO pgjobq.schema_version (version, needs) VALUES (%d, %d)", v,
                           needs ? atoi(needs + strlen("\n-- needs: ")) : v));
        } else {
            PQclear(t_exec(pg, "INSERT INTO pgjobq.schema_version (version) VALUES (%d)", v));
        }
        free(sql);
    }
}

TEST_FULL(schema_migrate_is_idempotent, 60, TEST_DB_EMPTY)
{
    pgjobq_client *c = NULL;
    int applied = -1, v = -1;

    /* An empty database: open says so, but the handle can migrate. */
    CHECK_RC(c, pgjobq_client_open(&c, t_conninfo()), PGJOBQ_ESCHEMA);
    CHECK(strstr(pgjobq_errmsg(c), "pgjobq migrate") != NULL);
    CHECK_RC(c, pgjobq_enqueue(c, "{}", NULL, NULL), PGJOBQ_ESCHEMA);
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(applied, PGJOBQ_SCHEMA_VERSION);
    CHECK_OK(c, pgjobq_schema_version(c, &v));
    CHECK_INT(v, PGJOBQ_SCHEMA_VERSION);
    /* The same handle is usable right after migrating. */
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    /* Again: nothing to do, nothing changes. */
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(applied, 0);
    PGconn *pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.schema_version"), PGJOBQ_SCHEMA_VERSION);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(schema_migrate_concurrently_from_many_processes, 60, TEST_DB_EMPTY)
{
    enum { N = 6 };
    int fds[N][2];
    pid_t pids[N];
    int total = 0;

    for (int i = 0; i < N; i++) {
        CHECK(pipe(fds[i]) == 0);
        pids[i] = fork();
        CHECK(pids[i] >= 0);
        if (pids[i] == 0) {
            pgjobq_client *c = NULL;
            int applied = 0, rc;
            rc = pgjobq_client_open(&c, t_conninfo());
            if (rc == PGJOBQ_OK || rc == PGJOBQ_ESCHEMA)
                rc = pgjobq_migrate(c, &applied);
            if (rc != PGJOBQ_OK)
                fprintf(stderr, "child %d: %s\n", i, pgjobq_errmsg(c));
            if (write(fds[i][1], &applied, sizeof applied) != sizeof applied)
                _exit(3);
            pgjobq_client_close(c);
            _exit(rc == PGJOBQ_OK ? 0 : 1);
        }
        close(fds[i][1]);
    }
    for (int i = 0; i < N; i++) {
        int status, applied = 0;
        CHECK(read(fds[i][0], &applied, sizeof applied) == sizeof applied);
        CHECK(waitpid(pids[i], &status, 0) == pids[i]);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "migrating process %d failed", i);
        total += applied;
    }
    /* Exactly one process did the work; the others waited on the lock and found it done. */
    CHECK_INT(total, PGJOBQ_SCHEMA_VERSION);
    PGconn *pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.schema_version"), PGJOBQ_SCHEMA_VERSION);
    PQfinish(pg);
}

TEST(schema_newer_than_library_is_a_clear_error)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = NULL;

    PQclear(t_exec(pg, "INSERT INTO pgjobq.schema_version (version) VALUES (%d)", PGJOBQ_SCHEMA_VERSION + 41));
    CHECK_RC(c, pgjobq_client_open(&c, t_conninfo()), PGJOBQ_ESCHEMA);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "newer") != NULL, "message: %s", pgjobq_errmsg(c));
    /* Nothing may be written through a library that does not know the schema. */
    CHECK_RC(c, pgjobq_enqueue(c, "{}", NULL, NULL), PGJOBQ_ESCHEMA);
    CHECK_RC(c, pgjobq_migrate(c, NULL), PGJOBQ_ESCHEMA);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 0);
    pgjobq_client_close(c);
    PQfinish(pg);
}

static PGconn *compat_pg;
static int compat_job_done(void *arg)
{
    (void)arg;
    return t_int(compat_pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'") == 1;
}

/* A rolling deploy migrates before every worker is upgraded: a newer schema whose migrations say this
 * library can still use it (schema_version.needs) is accepted by the client and by `pgjobq work`; one
 * that needs a newer library is refused by both, before anything is written. */
TEST(schema_newer_but_compatible_is_used_and_incompatible_is_refused)
{
    PGconn *pg = compat_pg = t_pg();
    pgjobq_client *c = NULL;
    int applied = -1;
    char *err = NULL;

    PQclear(t_exec(pg, "INSERT INTO pgjobq.schema_version (version, needs) VALUES (%d, %d)",
                   PGJOBQ_SCHEMA_VERSION + 1, PGJOBQ_SCHEMA_VERSION));
    CHECK_OK(c, pgjobq_client_open(&c, t_conninfo()));
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(applied, 0);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    pgjobq_client_close(c);
    c = NULL;
    pid_t w = t_spawn(t_log_path("compat"), NULL, "work", "--queue", "default", "--exec", "/bin/true", "--poll",
                      "100ms", NULL);
    int done = t_wait_until(compat_job_done, NULL, 20000);
    kill(w, SIGTERM);
    CHECK_INT(t_wait_exit(w, 20000), 0);
    if (!done)
        t_show_log(t_log_path("compat"));
    CHECK_MSG(done, "`pgjobq work` did not run the job on a compatible newer schema");

    /* A later migration that needs a library newer than this one. */
    PQclear(t_exec(pg, "INSERT INTO pgjobq.schema_version (version, needs) VALUES (%d, %d)",
                   PGJOBQ_SCHEMA_VERSION + 2, PGJOBQ_SCHEMA_VERSION + 1));
    CHECK_RC(c, pgjobq_client_open(&c, t_conninfo()), PGJOBQ_ESCHEMA);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "upgrade pgjobq") != NULL, "message: %s", pgjobq_errmsg(c));
    CHECK_RC(c, pgjobq_enqueue(c, "{}", NULL, NULL), PGJOBQ_ESCHEMA);
    CHECK_RC(c, pgjobq_migrate(c, NULL), PGJOBQ_ESCHEMA);
    pgjobq_client_close(c);
    int status = t_cli(NULL, &err, NULL, 0, "work", "--queue", "default", "--exec", "/bin/true", NULL);
    CHECK_MSG(status != 0 && strstr(err, "upgrade pgjobq") != NULL, "status %d, stderr: %s", status, err);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 1);
    PQfinish(pg);
}

/* Each raw INSERT below bypasses the library and must be refused by the schema itself. */
TEST(schema_check_constraints_stop_raw_inserts)
{
    static const struct {
        const char *columns;
        const char *values;
    } bad[] = {
        {"queue", "'a;b'"},
        {"queue", "'it''s'"},
        {"queue", "''"},
        {"queue", "'1abc'"},
        {"queue", "repeat('q', 65)"},
        {"queue", "'naïve'"},
        {"queue", "'x--y z'"},
        {"kind", "'$$'"},
        {"kind", "'a\\b'"},
        {"priority", "101"},
        {"priority", "-101"},
        {"max_attempts", "0"},
        {"max_attempts", "-3"},
        {"attempt, max_attempts", "5, 3"},
        {"attempt, max_attempts", "3, 3"}, /* queued with no attempt left */
        {"state", "'bogus'"},
        {"state", "'running'"},   /* running without a lease */
        {"state", "'completed'"}, /* finished without finished_at */
        {"run_at", "'infinity'"},
        {"payload", "(SELECT jsonb_build_object('x', repeat('y', 1048576)))"},
        {"payload", "'{bad json'"},
        {"unique_key", "''"},
        {"last_error", "repeat('e', 20000)"},
    };
    PGconn *pg = t_pg();

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char sql[512];
        snprintf(sql, sizeof sql, "INSERT INTO pgjobq.jobs (%s) VALUES (%s)", bad[i].columns, bad[i].values);
        PGresult *r = PQexec(pg, sql);
        CHECK_MSG(PQresultStatus(r) == PGRES_FATAL_ERROR, "accepted: %s", sql);
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        /* 23514 check_violation, 22P02 invalid text representation, 23502 not null. */
        CHECK_MSG(state && (strncmp(state, "23", 2) == 0 || strncmp(state, "22", 2) == 0), "%s: SQLSTATE %s", sql,
                  state ? state : "?");
        PQclear(r);
    }
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 0);
    /* And a good raw insert works, so the checks above are not refusing everything. */
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue, kind, payload) VALUES ('mail', 'send', '{}')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 1);
    PQfinish(pg);
}

TEST(schema_functions_are_not_executable_by_public)
{
    PGconn *pg = t_pg();

    /* A role with no grants cannot run the transitions, even though it can see the version. */
    PQclear(t_exec(pg, "CREATE ROLE nobody_in_particular LOGIN"));
    PQclear(t_exec(pg, "SET ROLE nobody_in_particular"));
    CHECK_INT(t_int(pg, "SELECT max(version) FROM pgjobq.schema_version"), PGJOBQ_SCHEMA_VERSION);
    PGresult *r = PQexec(pg, "SELECT * FROM pgjobq.claim('default', 1)");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42501");
    PQclear(r);
    r = PQexec(pg, "SELECT count(*) FROM pgjobq.all_jobs");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    PQclear(r);
    PQclear(t_exec(pg, "RESET ROLE"));
    PQfinish(pg);
}

TEST_FULL(schema_upgrade_from_version_2_moves_finished_jobs_to_history, 60, TEST_DB_EMPTY)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = NULL;
    int applied = -1;

    /* A database at version 2, as an earlier pgjobq left it, with live and finished jobs. */
    build_released(pg, 2);
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue, payload) VALUES ('q', '{\"live\": 1}')"));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue, payload, state, attempt, started_at, lease_until, lease_token)"
                       " VALUES ('q', '{\"live\": 2}', 'running', 1, now(), now() + interval '1 minute', 1)"));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue, payload, state, attempt, started_at, finished_at, result)"
                       " VALUES ('q', '{\"done\": 3}', 'completed', 1, now(), now() - interval '2 days', '{\"r\": 3}'),"
                       " ('q', '{\"done\": 4}', 'failed', 2, now(), now(), NULL),"
                       " ('q', '{\"done\": 5}', 'cancelled', 0, NULL, now(), NULL)"));
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET last_error = 'boom' WHERE state = 'failed'"));

    CHECK_RC(c, pgjobq_client_open(&c, t_conninfo()), PGJOBQ_ESCHEMA);
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(applied, PGJOBQ_SCHEMA_VERSION - 2);

    /* Live jobs stay; finished ones moved with everything they had. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE payload->>'live' IS NOT NULL"), 2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history"), 3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'completed' AND result = '{\"r\": 3}'"
                        " AND finished_at < now() - interval '1 day'"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'failed' AND last_error = 'boom'"
                        " AND attempt = 2"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history_done_default"), 1); /* the old one */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 5);
    /* The library reads them back, and the new ids do not collide with the moved ones. */
    pgjobq_job *j = NULL;
    CHECK_OK(c, pgjobq_job_get(c, 3, &j));
    CHECK_INT(j->state, PGJOBQ_COMPLETED);
    CHECK_STR(j->result, "{\"r\": 3}");
    pgjobq_jobs_free(j);
    int64_t id = 0;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    CHECK_INT(id, 6);
    /* A raw INSERT of a finished job into the hot table is refused now. */
    PGresult *r = PQexec(pg, "INSERT INTO pgjobq.jobs (state, finished_at) VALUES ('completed', now())");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "23514");
    PQclear(r);
    pgjobq_client_close(c);
    PQfinish(pg);
}
