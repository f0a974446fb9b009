/*
 * test_schema.c - migrations, the schema version check, and the CHECK constraints that stop a raw
 * INSERT which bypasses the library; the function files (sql/functions) and upgrades from every
 * released schema version.
 */
#include <dirent.h>
#include <glob.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* The released migration of schema version v (tests/fixtures/released: the migrations as pgjobq
 * released them; up to version 9 each created its own functions, from version 10 on the release's
 * function files are beside it, in functions-NNN): 1 to RELEASED_VERSIONS. */
#define RELEASED_VERSIONS         10
#define FIRST_WITH_FUNCTION_FILES 10
static char *released_migration(int v)
{
    char pattern[4096];
    glob_t g;

    snprintf(pattern, sizeof pattern, "%s/tests/fixtures/released/%03d_*.sql", t_srcdir(), v);
    CHECK_MSG(glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc == 1, "no single file matches %s", pattern);
    char *sql = t_read_file(g.gl_pathv[0]);
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

static int cmp_names(const void *a, const void *b);

/* What the runner of a release with function files (version v) did after its last migration: the
 * files of tests/fixtures/released/functions-NNN in name order, the functions taken from PUBLIC, and
 * the files' checksum recorded (here a mark: no later library has these files). */
static void apply_released_functions(PGconn *pg, int v)
{
    char dirpath[4096], path[4400], *names[64];
    size_t n = 0;
    struct dirent *e;

    snprintf(dirpath, sizeof dirpath, "%s/tests/fixtures/released/functions-%03d", t_srcdir(), v);
    DIR *d = opendir(dirpath);
    CHECK_MSG(d != NULL, "cannot open %s", dirpath);
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".sql") != 0)
            continue;
        CHECK(n < sizeof names / sizeof names[0]);
        names[n] = strdup(e->d_name);
        CHECK(names[n] != NULL);
        n++;
    }
    CHECK(closedir(d) == 0);
    CHECK_MSG(n > 0, "no function files in %s", dirpath);
    qsort(names, n, sizeof names[0], cmp_names);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dirpath, names[i]);
        char *sql = t_read_file(path);
        run_script(pg, sql, "a released function file");
        free(sql);
        free(names[i]);
    }
    PQclear(t_exec(pg, "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjobq FROM PUBLIC"));
    PQclear(t_exec(pg, "CREATE TABLE IF NOT EXISTS pgjobq.function_files (checksum text NOT NULL,"
                       " library text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"));
    PQclear(t_exec(pg, "GRANT SELECT ON pgjobq.function_files TO PUBLIC"));
    PQclear(t_exec(pg, "DELETE FROM pgjobq.function_files"));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.function_files (checksum, library) VALUES ('released %d', 'released')", v));
}

/* Makes the database what an earlier pgjobq left at schema version k: the released migrations 1..k,
 * each recorded as that pgjobq's runner did (with its "-- needs: N" from version 7 on), and from
 * version 10 on the function files of version k after the last one. */
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
    if (k >= FIRST_WITH_FUNCTION_FILES)
        apply_released_functions(pg, k);
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

/* A database at version 10 with what migration 11 bounds: live jobs due in year 99999 and in 4713 BC
 * (which version 10 accepted) move to the nearer end of jobs_run_at_range, and every other job is
 * left as it was; a worker's row stays, and what a library of version 10 calls works. */
TEST_FULL(schema_upgrade_from_version_10_bounds_run_at_and_keeps_jobs_and_workers, 60, TEST_DB_EMPTY)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = NULL;
    int applied = -1;

    build_released(pg, 10);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": 1}')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": 2}',"
                       " run_at => '99999-01-01 00:00:00+00')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": 3}',"
                       " run_at => '4713-01-01 00:00:00+00 BC')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": 4}', delay => interval '1 hour')"));
    PQclear(t_exec(pg, "SELECT pgjobq.worker_beat('old-worker', 'host', 42, '0.1.0', 'q:1')"));
    char *kept = t_str(pg, "SELECT string_agg(ROW(id, run_at, ready_at, payload)::text, ',' ORDER BY id)"
                           " FROM pgjobq.jobs WHERE payload->>'n' IN ('1', '4')");

    CHECK_RC(c, pgjobq_client_open(&c, t_conninfo()), PGJOBQ_ESCHEMA);
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(applied, PGJOBQ_SCHEMA_VERSION - 10);

    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 4);
    CHECK_INT(t_int(pg, "SELECT (run_at = '9999-12-31 23:59:59+00')::int FROM pgjobq.jobs WHERE payload->>'n' = '2'"),
              1);
    CHECK_INT(t_int(pg, "SELECT (run_at = '1900-01-01 00:00:00+00')::int FROM pgjobq.jobs WHERE payload->>'n' = '3'"),
              1);
    char *after = t_str(pg, "SELECT string_agg(ROW(id, run_at, ready_at, payload)::text, ',' ORDER BY id)"
                            " FROM pgjobq.jobs WHERE payload->>'n' IN ('1', '4')");
    CHECK_STR(after, kept);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'old-worker' AND pid = 42"), 1);
    /* What a library of version 10 calls still works: its beat and goodbye (rows without a secret),
     * and its prune with its default ages, which the retention of migration 11 allows. */
    PQclear(t_exec(pg, "SELECT pgjobq.worker_beat('old-worker', 'host', 42, '0.1.0', 'q:1')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'old-worker' AND secret_hash IS NULL"), 1);
    /* A worker of schema 18 says it is unhealthy with its beat; one of 17 (six arguments) is healthy. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'old-worker' AND unhealthy IS NULL"
                        " AND unhealthy_since IS NULL"),
              1);
    PQclear(t_exec(pg, "SELECT pgjobq.worker_beat('old-worker', 'host', 42, '0.1.0', 'q:1', NULL, 'cannot start')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.monitor_unhealthy_workers() WHERE id = 'old-worker'"
                        " AND reason = 'cannot start' AND since IS NOT NULL"),
              1);
    PQclear(t_exec(pg, "SELECT pgjobq.worker_beat('old-worker', 'host', 42, '0.1.0', 'q:1', NULL)"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.monitor_unhealthy_workers()"), 0);
    PQclear(t_exec(pg, "SELECT pgjobq.worker_gone('old-worker')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE stopped_at IS NULL"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.retention WHERE completed = '24 hours' AND failed = '7 days'"), 1);
    PQclear(t_exec(pg, "SELECT pgjobq.prune('24 hours', '7 days', 1000)"));
    /* Due as before: the job of 4713 BC (now 1900) and the plain one; not those of 99999 and in an hour. */
    pgjobq_job *j = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_claim(c, "q", 10, 30000, "w", &j, &n));
    CHECK_INT(n, 2);
    pgjobq_jobs_free(j);
    free(kept);
    free(after);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* ---------------------------------------------------------------------------------------------- */
/* The function files and upgrades from the released versions */

/* What a database's pgjobq schema is, one line per object, in order: every function (its whole
 * definition, as pg_get_functiondef prints it, and its grants), every relation (kind, options,
 * grants, columns with their grants, index or view definition, partition bound), constraint, trigger
 * and type, the schema's grants.  The hourly history partitions, named after the hour they were made
 * in, count by number. */
static const char SCHEMA_DIGEST[] =
    "WITH lines(l) AS ("
    " SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(pg_get_functiondef(p.oid)) || ' grants '"
    "        || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(p.proacl) x), '-')"
    "   FROM pg_proc p WHERE p.pronamespace = 'pgjobq'::regnamespace"
    " UNION ALL"
    " SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(c.reloptions::text, '-')"
    "        || ' grants ' || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(c.relacl) x), '-')"
    "        || ' columns ' || coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)"
    "               || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END"
    "               || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')"
    "               || coalesce(' grants ' || a.attacl::text, ''), ', ' ORDER BY a.attnum)"
    "          FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
    "         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '-')"
    "        || ' ' || coalesce(pg_get_indexdef(c.oid), '') || coalesce(pg_get_viewdef(c.oid), '')"
    "        || coalesce(pg_get_expr(c.relpartbound, c.oid), '')"
    "   FROM pg_class c WHERE c.relnamespace = 'pgjobq'::regnamespace AND c.relname !~ '^history_p[0-9]{10}'"
    /* (One sequence per priority level a queue has had: data, like the hourly partitions.) */
    "    AND c.relname !~ '^frontier_[0-9]+$'"
    " UNION ALL"
    " SELECT 'constraint ' || r.conrelid::regclass::text || ' ' || r.conname || ' ' || pg_get_constraintdef(r.oid)"
    "        || CASE WHEN r.convalidated THEN '' ELSE ' not valid' END"
    "   FROM pg_constraint r WHERE r.connamespace = 'pgjobq'::regnamespace"
    "    AND r.conrelid::regclass::text !~ 'history_p[0-9]{10}'"
    " UNION ALL"
    " SELECT 'trigger ' || g.tgrelid::regclass::text || ' ' || pg_get_triggerdef(g.oid)"
    "   FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid"
    "  WHERE c.relnamespace = 'pgjobq'::regnamespace AND NOT g.tgisinternal"
    " UNION ALL"
    " SELECT 'type ' || t.typname || ' ' || t.typtype::text || ' ' || coalesce((SELECT string_agg(e.enumlabel, ','"
    "        ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid), '')"
    "   FROM pg_type t WHERE t.typnamespace = 'pgjobq'::regnamespace"
    " UNION ALL"
    " SELECT 'hourly partitions ' || count(*) FROM pg_class c"
    "  WHERE c.relnamespace = 'pgjobq'::regnamespace AND c.relname ~ '^history_p[0-9]{10}$'"
    " UNION ALL"
    " SELECT 'schema grants ' || (SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(n.nspacl) x)"
    "   FROM pg_namespace n WHERE n.nspname = 'pgjobq')"
    " SELECT string_agg(l, E'\\n' ORDER BY l) FROM lines";

static char *schema_digest(PGconn *pg)
{
    return t_str(pg, "%s", SCHEMA_DIGEST);
}

/* Fails, naming the first line that differs, unless the two digests are the same. */
static void check_same_schema(const char *want, const char *got, const char *what)
{
    size_t i = 0;

    if (strcmp(want, got) == 0)
        return;
    while (want[i] && want[i] == got[i])
        i++;
    while (i > 0 && want[i - 1] != '\n')
        i--;
    int wn = (int)strcspn(want + i, "\n"), gn = (int)strcspn(got + i, "\n");
    CHECK_MSG(0, "%s: not what a new database has; first difference:\n    new: %.*s\n    got: %.*s", what,
              wn > 400 ? 400 : wn, want + i, gn > 400 ? 400 : gn, got + i);
}

/* The roles of sql/roles.sql, made by another test at the same moment maybe (roles are cluster-wide):
 * a CREATE ROLE that loses that race is run again. */
static void migrate_roles(pgjobq_client *c)
{
    int rc = pgjobq_migrate_roles(c);
    if (rc != PGJOBQ_OK && (strcmp(pgjobq_sqlstate(c), "23505") == 0 || strcmp(pgjobq_sqlstate(c), "42710") == 0))
        rc = pgjobq_migrate_roles(c);
    CHECK_RC(c, rc, PGJOBQ_OK);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds to names[*n ..] the names of the functions the .sql files of dir (only the numbered ones:
 * numbered) define, adding their lengths and a comma's to *len. */
static void defined_names(const char *dir, int numbered, char **names, size_t max, size_t *n, size_t *len)
{
    char dirpath[4096], path[4400];
    struct dirent *e;

    snprintf(dirpath, sizeof dirpath, "%s/%s", t_srcdir(), dir);
    DIR *d = opendir(dirpath);
    CHECK_MSG(d != NULL, "cannot open %s", dirpath);
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".sql") != 0 || (numbered && strspn(e->d_name, "0123456789") != 3))
            continue;
        snprintf(path, sizeof path, "%s/%s", dirpath, e->d_name);
        char *text = t_read_file(path);
        for (char *p = text; (p = strstr(p, "FUNCTION pgjobq.")) != NULL; p++) {
            /* A definition: "CREATE FUNCTION" or "CREATE OR REPLACE FUNCTION", not a mention. */
            int created = (p - text >= 7 && strncmp(p - 7, "CREATE ", 7) == 0) ||
                          (p - text >= 18 && strncmp(p - 18, "CREATE OR REPLACE ", 18) == 0);
            if (!created)
                continue;
            const char *name = p + strlen("FUNCTION pgjobq.");
            size_t nl = strcspn(name, "(");
            CHECK(*n < max);
            names[*n] = strndup(name, nl);
            CHECK(names[*n] != NULL);
            *len += nl + 1;
            (*n)++;
        }
        free(text);
    }
    CHECK(closedir(d) == 0);
}

/* The names of the functions sql/functions defines, and the migrations of sql/ (the function of a
 * trigger lives with its trigger), sorted, comma-separated (malloc'd). */
static char *function_file_names(void)
{
    char *names[256], *out;
    size_t n = 0, len = 1;

    defined_names("sql/functions", 0, names, sizeof names / sizeof names[0], &n, &len);
    defined_names("sql", 1, names, sizeof names / sizeof names[0], &n, &len);
    qsort(names, n, sizeof names[0], cmp_names);
    out = calloc(1, len);
    CHECK(out != NULL);
    for (size_t i = 0; i < n; i++) {
        if (i)
            strcat(out, ",");
        strcat(out, names[i]);
        free(names[i]);
    }
    return out;
}

/* The names of the functions in schema pgjobq, sorted as function_file_names() sorts them. */
static char *database_function_names(PGconn *pg)
{
    return t_str(pg, "SELECT coalesce(string_agg(proname::text, ',' ORDER BY proname COLLATE \"C\"), '')"
                     " FROM pg_proc WHERE pronamespace = 'pgjobq'::regnamespace");
}

/* Migrates the database (missing or older) and checks that its functions are those named. */
static void migrate_and_check_functions(PGconn *pg, const char *files)
{
    pgjobq_client *c = NULL;

    CHECK_RC(c, pgjobq_client_open(&c, t_conninfo()), PGJOBQ_ESCHEMA);
    CHECK_OK(c, pgjobq_migrate(c, NULL));
    pgjobq_client_close(c);
    char *db = database_function_names(pg);
    CHECK_STR(db, files);
    free(db);
}

/* Every function of a migrated database is one that sql/functions (or, for a trigger's, a migration)
 * defines, and each file's function is there once: nothing an old migration made is left over, new
 * or upgraded from version 1. */
TEST_FULL(schema_functions_are_exactly_those_of_the_function_files, 60, TEST_DB_EMPTY)
{
    PGconn *pg = t_pg();
    char *files = function_file_names();

    CHECK(strlen(files) > 0 && strstr(files, "claim_batch") != NULL && strstr(files, "backoff") != NULL);
    migrate_and_check_functions(pg, files);
    PQclear(t_exec(pg, "SET client_min_messages = warning"));
    PQclear(t_exec(pg, "DROP SCHEMA pgjobq CASCADE"));
    build_released(pg, 1);
    migrate_and_check_functions(pg, files);
    free(files);
    PQfinish(pg);
}

/* The function files are applied when their checksum is not the one the database records (a library
 * with other files migrates), and not otherwise; a replaced pgjobq.backoff (its documented use) stays;
 * a database newer than the library keeps its functions. */
TEST(schema_function_files_are_applied_when_they_change_and_keep_a_replaced_backoff)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client(), *other = NULL;
    char ci[1024];
    int applied = -1;
    int64_t id;
    size_t n;
    pgjobq_job *j;
    pgjobq_state st;

    char *checksum = t_str(pg, "SELECT checksum FROM pgjobq.function_files");
    CHECK_INT(strlen(checksum), 64);
    PQclear(t_exec(pg, "CREATE OR REPLACE FUNCTION pgjobq.backoff(attempt integer) RETURNS interval"
                       " LANGUAGE sql AS $$ SELECT interval '7 minutes' $$"));
    /* A function the files define, changed behind their back: what applying them puts right. */
    PQclear(t_exec(pg, "CREATE OR REPLACE FUNCTION pgjobq.next_due(queue text) RETURNS double precision"
                       " LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
                       " AS $$ SELECT 12345::double precision $$"));

    /* The same files: nothing is applied. */
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(applied, 0);
    CHECK_INT(t_int(pg, "SELECT pgjobq.next_due('q')"), 12345);

    /* Other files (a library whose functions differ), but a database newer than this library: a rolling
     * deploy's newer schema keeps the functions of the library that migrated it. */
    PQclear(t_exec(pg, "UPDATE pgjobq.function_files SET checksum = 'another build'"));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.schema_version (version, needs) VALUES (%d, %d)", PGJOBQ_SCHEMA_VERSION + 1,
                   PGJOBQ_SCHEMA_VERSION));
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(t_int(pg, "SELECT pgjobq.next_due('q')"), 12345);
    PQclear(t_exec(pg, "DELETE FROM pgjobq.schema_version WHERE version > %d", PGJOBQ_SCHEMA_VERSION));

    /* Other files at this version: all applied again, and recorded, but the replaced backoff stays. */
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(applied, 0);
    CHECK_INT(t_int(pg, "SELECT (pgjobq.next_due('q') IS NULL)::int"), 1);
    char *now = t_str(pg, "SELECT checksum FROM pgjobq.function_files");
    CHECK_STR(now, checksum);
    free(now);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.function_files"), 1);
    CHECK_INT(t_int(pg, "SELECT (pgjobq.backoff(1) = interval '7 minutes')::int"), 1);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    CHECK_OK(c, pgjobq_claim(c, "default", 1, 30000, NULL, &j, &n));
    CHECK_INT(n, 1);
    CHECK_OK(c, pgjobq_job_fail(c, j->id, j->lease_token, "once", PGJOBQ_BACKOFF, 0, &st));
    CHECK_INT(st, PGJOBQ_QUEUED);
    pgjobq_jobs_free(j);
    CHECK_INT(t_int(pg,
                    "SELECT (run_at - now() BETWEEN interval '6 minutes 50 seconds' AND interval '7 minutes')::int"
                    " FROM pgjobq.jobs WHERE id = %lld",
                    (long long)id),
              1);
    /* Still nobody but the owner may run it. */
    CHECK_INT(t_int(pg, "SELECT has_function_privilege('public', 'pgjobq.backoff(integer)', 'EXECUTE')::int"), 0);

    /* A backoff that is gone comes back from the file, with the documented policy. */
    PQclear(t_exec(pg, "DROP FUNCTION pgjobq.backoff(integer)"));
    PQclear(t_exec(pg, "UPDATE pgjobq.function_files SET checksum = 'another build'"));
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    CHECK_INT(t_int(pg, "SELECT (pgjobq.backoff(1) BETWEEN interval '1.8 s' AND interval '2.2 s')::int"), 1);

    /* On an up-to-date database `pgjobq migrate` needs no privilege, as before the function files. */
    PQclear(t_exec(pg, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'schema_reader') THEN"
                       " CREATE ROLE schema_reader LOGIN; END IF; END $$"));
    snprintf(ci, sizeof ci, "%s user=schema_reader", t_conninfo());
    CHECK_OK(other, pgjobq_client_open(&other, ci));
    CHECK_OK(other, pgjobq_migrate(other, &applied));
    CHECK_INT(applied, 0);
    pgjobq_client_close(other);
    free(checksum);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* Every job of a database, with the columns all versions have, one line each. */
static char *jobs_snapshot(PGconn *pg, const char *table)
{
    return t_str(pg,
                 "SELECT string_agg(ROW(id, queue::text, kind::text, payload::jsonb, priority, state::text, attempt,"
                 " max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,"
                 " worker_id::text, result, last_error, unique_key::text, cancel_requested)::text, E'\\n' ORDER BY id)"
                 " FROM %s",
                 table);
}

/* The queues' settings, the schedules, and the live jobs' concurrency keys (from version 4).  The
 * queues' columns of version 4 (a later one, max_lease of version 20, starts NULL: checked apart). */
static char *settings_snapshot(PGconn *pg)
{
    return t_str(pg, "SELECT (SELECT string_agg(ROW(q.name, q.paused_at, q.pause_reason, q.concurrency,"
                     " q.key_concurrency, q.rate_limit, q.rate_period, q.recent_starts, q.updated_at)::text,"
                     " E'\\n' ORDER BY name) FROM pgjobq.queues q) || E'\\n'"
                     " || (SELECT string_agg(s::text, E'\\n' ORDER BY name) FROM pgjobq.schedules s) || E'\\n'"
                     " || (SELECT string_agg(ROW(id, concurrency_key)::text, ',' ORDER BY id) FROM pgjobq.jobs)");
}

/* Jobs in every state version k knows, made by that version's own functions, payload {"n": N}:
 *   1 queued, 2 scheduled an hour ahead, 3 running under a lease, 4 completed with a result, 5 failed
 *   for good, 6 cancelled while it ran, 7 failed once and queued again;
 *   from version 4: 10 with a concurrency key in a queue with limits, a paused queue, a schedule;
 *   from version 6: a worker's heartbeat (and 7's retry is tallied);
 *   from version 9: 8 a parent, 9 its child, waiting, with tags; 3 reports progress. */
static void released_jobs(PGconn *pg, int k)
{
    for (int i = 3; i <= 7; i++)
        PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": %d}')", i));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim('q', 5, '10 minutes', 'old-worker')"), 5);
    PQclear(t_exec(pg, "SELECT pgjobq.complete_many(ARRAY[id], ARRAY[lease_token], ARRAY['{\"r\": 4}'::jsonb])"
                       " FROM pgjobq.jobs WHERE payload->>'n' = '4'"));
    PQclear(t_exec(pg, "SELECT pgjobq.fail_many(ARRAY[id], ARRAY[lease_token], ARRAY['boom'], NULL, ARRAY[true])"
                       " FROM pgjobq.jobs WHERE payload->>'n' = '5'"));
    PQclear(t_exec(pg, "SELECT pgjobq.cancel(id) FROM pgjobq.jobs WHERE payload->>'n' = '6'"));
    PQclear(t_exec(pg, "SELECT pgjobq.complete_many(ARRAY[id], ARRAY[lease_token])"
                       " FROM pgjobq.jobs WHERE payload->>'n' = '6'"));
    PQclear(t_exec(pg, "SELECT pgjobq.fail_many(ARRAY[id], ARRAY[lease_token], ARRAY['try again'],"
                       " ARRAY[interval '0']) FROM pgjobq.jobs WHERE payload->>'n' = '7'"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": 1}')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": 2}', delay => interval '1 hour')"));
    if (k >= 4) {
        PQclear(t_exec(pg, "SELECT pgjobq.queue_set('limited', '{\"concurrency\": 2, \"key_concurrency\": 1,"
                           " \"rate_limit\": 10, \"rate_period\": \"1 minute\"}')"));
        PQclear(t_exec(pg, "SELECT pgjobq.queue_pause('paused', 'for the upgrade')"));
        PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'limited', payload => '{\"n\": 10}',"
                           " concurrency_key => 'tenant-a')"));
        PQclear(t_exec(pg, "SELECT pgjobq.schedule_set('nightly', '0 3 * * *', 'Europe/Paris')"));
    }
    if (k >= 6)
        PQclear(t_exec(pg, "SELECT pgjobq.worker_beat('old-worker', 'host', 42, '0.1.0', 'q:1')"));
    if (k >= 10) {
        /* What levels_add let any caller record (issue 36, point 4): a level of a name that is no
         * queue's, with its frontier. */
        PQclear(
            t_exec(pg, "SELECT pgjobq.levels_add(ARRAY[E'no\\nqueue', repeat('x', 2000)], ARRAY[1, 2]::smallint[])"));
        CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE NOT (length(queue) <= 64 AND queue ~ "
                            "'^[A-Za-z][A-Za-z0-9_.:-]*$')"),
                  2);
    }
    if (k >= 9) {
        PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": 8}')"));
        PQclear(t_exec(pg, "SELECT pgjobq.enqueue(queue => 'q', payload => '{\"n\": 9}', tags => ARRAY['t1', 't2'],"
                           " after => ARRAY[(SELECT id FROM pgjobq.jobs WHERE payload->>'n' = '8')])"));
        PQclear(t_exec(pg, "SELECT pgjobq.set_progress(id, lease_token, '{\"p\": 50}')"
                           " FROM pgjobq.jobs WHERE payload->>'n' = '3'"));
    }
}

static int64_t job_id(PGconn *pg, int n)
{
    return t_int(pg, "SELECT id FROM pgjobq.all_jobs WHERE payload->>'n' = '%d'", n);
}

/* The library's transitions on the upgraded database: the job the old version's worker holds completes
 * under its old token; enqueue, claim (random tokens now), complete, fail and retry, cancel;
 * a child waiting since the old version runs once its parent completes. */
static void upgraded_database_works(PGconn *pg, pgjobq_client *c, int k, int64_t token3)
{
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job *jobs = NULL;
    pgjobq_state st;
    size_t n = 0;
    int64_t id;

    CHECK_OK(c, pgjobq_job_complete(c, job_id(pg, 3), token3, "{\"done\": 3}"));
    o.queue = "q";
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 11}", &o, &id));
    CHECK_INT(id, job_id(pg, 11));
    CHECK_OK(c, pgjobq_claim(c, "q", 10, 30000, "new-worker", &jobs, &n));
    CHECK_INT(n, k >= 9 ? 4 : 3); /* 7, 1, (8 from version 9,) 11 */
    for (size_t i = 0; i < n; i++) {
        CHECK(jobs[i].lease_token > 0 && jobs[i].lease_token != token3);
        if (i == 0) {
            CHECK_OK(c, pgjobq_job_fail(c, jobs[i].id, jobs[i].lease_token, "again", 0, 0, &st));
            CHECK_INT(st, PGJOBQ_QUEUED);
            /* Claimable from the retry on: the trigger jobs_ready_stamp, the migration's, stamped it. */
            CHECK_INT(t_int(pg, "SELECT (ready_at > started_at)::int FROM pgjobq.jobs WHERE id = %lld",
                            (long long)jobs[i].id),
                      1);
        } else {
            CHECK_OK(c, pgjobq_job_complete(c, jobs[i].id, jobs[i].lease_token, NULL));
        }
    }
    pgjobq_jobs_free(jobs);
    if (k >= 9)
        CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE payload->>'n' = '9' AND state = 'queued'"), 1);
    CHECK_OK(c, pgjobq_job_cancel(c, job_id(pg, 2), &st));
    CHECK_INT(st, PGJOBQ_CANCELLED);
    CHECK_OK(c, pgjobq_job_retry(c, job_id(pg, 5)));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE payload->>'n' = '5' AND state = 'queued'"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE payload->>'n' IN ('2', '3', '11')"), 3);
    /* Schema 16: a running job's cancel notes when it was requested, and the holder's heartbeat when
     * it told the handler; the history keeps both. */
    o.queue = "q16";
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 12}", &o, &id));
    CHECK_OK(c, pgjobq_claim(c, "q16", 1, 30000, "new-worker", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_OK(c, pgjobq_job_cancel(c, id, &st));
    CHECK_INT(st, PGJOBQ_RUNNING);
    CHECK_RC(c, pgjobq_job_extend(c, id, jobs[0].lease_token, 30000), PGJOBQ_ECANCELLED);
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'cancelled'"
                    " AND cancel_told_at >= cancel_requested_at",
                    (long long)id),
              1);
    /* Schema 19: a worker that stops cleanly stays listed, as stopped, and the list pages. */
    PQclear(t_exec(pg, "SELECT pgjobq.worker_beat('w17', 'host', 17, 'v', 'q:1', 17)"));
    PQclear(t_exec(pg, "SELECT pgjobq.worker_gone('w17', 17)"));
    char *state = t_str(pg, "SELECT state FROM pgjobq.monitor_workers() WHERE id = 'w17'");
    CHECK_STR(state, "stopped");
    free(state);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.monitor_workers('running', 'zz', 10) WHERE id = 'w17'"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.monitor_workers('stopped', 'w17', 10) WHERE id = 'w17'"), 0);
    /* The cluster map's migration: a job's routing key, kept in the history; no map, so no guard and
     * ids that still step by one. */
    CHECK_INT(t_int(pg, "SELECT (pgjobq.cluster_map() IS NULL)::int"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_trigger WHERE tgname = 'jobs_cluster_guard'"), 0);
    int64_t before = t_int(pg, "SELECT pg_sequence_last_value(pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass)");
    id = t_int(pg, "SELECT id FROM pgjobq.enqueue(queue => 'q18', route_key => 'tenant-7')");
    CHECK_INT(id, before + 1);
    CHECK_OK(c, pgjobq_job_cancel(c, id, &st));
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND route_key = 'tenant-7'", (long long)id), 1);
    /* The snoozes' migration (23): every job upgraded has none, live or finished. */
    CHECK(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs") > 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE snoozes <> 0"), 0);
    /* The steps' migration (25): no job has steps or a park; a job claimed now stores one, fenced,
     * and a sleep parks it. */
    CHECK_INT(t_int(pg, "SELECT (SELECT count(*) FROM pgjobq.job_steps) + (SELECT count(*) FROM pgjobq.job_parks)"
                        " + (SELECT count(*) FROM pgjobq.events)"),
              0);
    o.queue = "q25";
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 25}", &o, &id));
    CHECK_OK(c, pgjobq_claim(c, "q25", 1, 30000, "new-worker", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_OK(c, pgjobq_step_put(c, id, jobs[0].lease_token, "one", "1", NULL));
    CHECK_RC(c, pgjobq_job_sleep(c, id, jobs[0].lease_token, "nap", 3600000, NULL), PGJOBQ_PARKED);
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_park_of(%lld) WHERE parked = 'sleeping'", (long long)id), 1);
    /* The dead letters' migration (26): no queue has a dead-letter queue until one is set; then a job
     * that fails for good leaves a copy there, linked to it, and a redrive sends it back. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE dead_letter IS NOT NULL"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.dead_letters"), 0);
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "q26", "q26.dead"));
    o.queue = "q26";
    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 26}", &o, &id));
    CHECK_OK(c, pgjobq_claim(c, "q26", 1, 30000, "new-worker", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_OK(c, pgjobq_job_fail(c, id, jobs[0].lease_token, "for good", 0, 0, &st));
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.dead_letters d JOIN pgjobq.jobs j ON j.id = d.id"
                    " WHERE d.original_id = %lld AND j.queue = 'q26.dead' AND j.payload = '{\"n\": 26}'",
                    (long long)id),
              1);
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    int64_t redriven = 0;
    f.queue = "q26.dead";
    f.state = PGJOBQ_QUEUED;
    CHECK_OK(c, pgjobq_retry_where(c, &f, PGJOBQ_REDRIVE, &redriven, NULL));
    CHECK_INT(redriven, 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'q26' AND payload = '{\"n\": 26}'"), 1);
    /* And unique keys that debounce (replace) and throttle (keep, a window): the same migration. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.unique_holds"), 0);
    id = t_int(pg, "SELECT id FROM pgjobq.enqueue('q26k', unique_key => 'k', on_conflict => 'replace')");
    CHECK_INT(t_int(pg, "SELECT id FROM pgjobq.enqueue('q26k', payload => '{\"v\": 2}', unique_key => 'k',"
                        " on_conflict => 'replace')"),
              id);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'q26k' AND payload = '{\"v\": 2}'"), 1);
    id = t_int(pg, "SELECT id FROM pgjobq.enqueue('q26k', unique_key => 't', unique_for => '1 hour')");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.unique_holds WHERE job_id = %lld", (long long)id), 1);
    /* The reads of 27: a job by its id, live or finished (what pgjobq_job_get reads), and a held job's
     * steps at once. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_get(%lld) WHERE queue = 'q26k'", (long long)id), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_get(-1)"), 0);
    o.queue = "q27";
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 27}", &o, &id));
    CHECK_OK(c, pgjobq_claim(c, "q27", 1, 30000, "new-worker", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_OK(c, pgjobq_step_put(c, id, jobs[0].lease_token, "one", "1", NULL));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.steps_of(%lld, %lld) WHERE held AND name = 'one'", (long long)id,
                    (long long)jobs[0].lease_token),
              1);
    pgjobq_jobs_free(jobs);

    /* Expiry (28): the jobs of before have none, and keep none (live or in the history); a queue's
     * default and a job's own apply from now on, and the sweep ends a job past its expiry. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE expires_at IS NOT NULL"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE expire_after IS NOT NULL"), 0);
    CHECK_OK(c, pgjobq_queue_set_expire_after(c, "q28", 60000));
    id = t_int(pg, "SELECT id FROM pgjobq.enqueue('q28')");
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND expires_at = run_at + interval '1 minute'",
                    (long long)id),
              1);
    PQclear(
        t_exec(pg, "UPDATE pgjobq.jobs SET expires_at = now() - interval '1 second' WHERE id = %lld", (long long)id));
    CHECK_INT(t_int(pg, "SELECT pgjobq.expire_queued(10)"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'cancelled'", (long long)id),
              1);

    /* Strict order (29): no queue of before is strict; one made strict runs a key's jobs one at a time,
     * and a failure blocks its key. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE strict_order"), 0);
    CHECK_OK(c, pgjobq_queue_set_strict_order(c, "q29", 1));
    o.queue = "q29";
    o.concurrency_key = "k";
    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    o.concurrency_key = NULL;
    CHECK_OK(c, pgjobq_claim(c, "q29", 10, 30000, "new-worker", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_INT(jobs[0].id, id);
    CHECK_OK(c, pgjobq_job_fail(c, id, jobs[0].lease_token, "no", PGJOBQ_BACKOFF, 0, NULL));
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.sequence_blocks WHERE job_id = %lld", (long long)id), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('q29', 10, '1 minute', 'w')"), 0);
    char *skipped = t_str(pg, "SELECT pgjobq.sequence_skip(%lld)", (long long)id);
    CHECK_STR(skipped, "skipped");
    free(skipped);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('q29', 10, '1 minute', 'w')"), 1);

    /* Priority aging (30): no job of before was aged and no queue ages; a queue's setting applies from
     * now on, to the jobs of before too (they are queued jobs like any other). */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE base_priority IS NOT NULL"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE priority_aging IS NOT NULL"), 0);
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(1000)"), 0);
    CHECK_OK(c, pgjobq_queue_set_priority_aging(c, "q30", 60000));
    id = t_int(pg, "SELECT id FROM pgjobq.enqueue('q30', priority => 3::smallint)");
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET run_at = run_at - interval '1 minute',"
                       " ready_at = ready_at - interval '1 minute' WHERE id = %lld",
                   (long long)id));
    CHECK_INT(t_int(pg, "SELECT pgjobq.age_priorities(1000)"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND priority = 2 AND base_priority = 3",
                    (long long)id),
              1);

    /* Trace context (31): the jobs of before have none (live or in the history); a job enqueued now
     * keeps its own, a claim hands it over, and the history keeps it; a bad one is refused. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE traceparent IS NOT NULL AND queue <> 'q31'"), 0);
    static const char tp[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    pgjobq_job_spec spec = {.payload = "{}", .traceparent = tp};
    spec.opts.queue = "q31";
    CHECK_OK(c, pgjobq_enqueue_spec(c, &spec, &id, NULL));
    CHECK_OK(c, pgjobq_claim(c, "q31", 1, 30000, "new-worker", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_STR(pgjobq_job_traceparent(&jobs[0]), tp);
    CHECK_OK(c, pgjobq_job_complete(c, id, jobs[0].lease_token, NULL));
    pgjobq_jobs_free(jobs);
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND traceparent = '%s'", (long long)id, tp), 1);
    spec.traceparent = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
    CHECK_RC(c, pgjobq_enqueue_spec(c, &spec, &id, NULL), PGJOBQ_EINVAL);
}

/* A database at each released schema version, with jobs in every state it knows, upgraded by this
 * library: the jobs are all there as they were, the functions, their definitions and the grants are
 * exactly those of a new database, and the transitions work.  Roles arrived with version 2: from there
 * on the database has the schema grants that `pgjobq migrate --roles` gave it (at versions 9 and 10,
 * the released roles.sql itself), so migrating grants the roles again what the function files re-created,
 * a claim_batch that migration 9 dropped included. */
TEST_FULL(schema_upgrade_from_each_released_version_matches_a_new_database, 120, TEST_DB_EMPTY)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = NULL;
    int applied = -1, rc;

    PQclear(t_exec(pg, "SET client_min_messages = warning"));
    CHECK_RC(c, pgjobq_client_open(&c, t_conninfo()), PGJOBQ_ESCHEMA);
    CHECK_OK(c, pgjobq_migrate(c, NULL));
    char *fresh_plain = schema_digest(pg);
    migrate_roles(c);
    pgjobq_client_close(c);
    char *fresh_roles = schema_digest(pg);
    char *checksum = t_str(pg, "SELECT checksum FROM pgjobq.function_files");

    for (int k = 1; k <= RELEASED_VERSIONS; k++) {
        char what[64], *before, *after, *extra_before = NULL, *extra_after, *got, *sum, *live, *finished;
        const char *jobs_table = k >= 3 ? "pgjobq.all_jobs" : "pgjobq.jobs";
        char want_live[128];

        snprintf(what, sizeof what, "upgraded from version %d", k);
        PQclear(t_exec(pg, "DROP SCHEMA pgjobq CASCADE"));
        build_released(pg, k);
        released_jobs(pg, k);
        int64_t token3 = t_int(pg, "SELECT lease_token FROM pgjobq.jobs WHERE payload->>'n' = '3'");
        before = jobs_snapshot(pg, jobs_table);
        if (k >= 4)
            extra_before = settings_snapshot(pg);
        if (k >= 9) {
            char path[4096];
            if (k == 9)
                snprintf(path, sizeof path, "%s/tests/fixtures/released/roles.sql", t_srcdir());
            else
                snprintf(path, sizeof path, "%s/tests/fixtures/released/roles-%03d.sql", t_srcdir(), k);
            char *roles = t_read_file(path);
            run_script(pg, roles, "the released roles.sql");
            free(roles);
        } else if (k >= 2) {
            PQclear(t_exec(pg, "GRANT USAGE ON SCHEMA pgjobq TO pgjobq_producer, pgjobq_worker, pgjobq_admin,"
                               " pgjobq_monitor"));
            if (k == 8)
                PQclear(t_exec(pg, "GRANT EXECUTE ON FUNCTION pgjobq.claim_batch(text, integer, interval, text,"
                                   " smallint, timestamptz, bigint) TO pgjobq_worker"));
        }

        rc = pgjobq_client_open(&c, t_conninfo());
        CHECK_MSG(rc == PGJOBQ_OK || rc == PGJOBQ_ESCHEMA, "%s: open: %s", what, pgjobq_errmsg(c));
        CHECK_OK(c, pgjobq_migrate(c, &applied));
        CHECK_INT(applied, PGJOBQ_SCHEMA_VERSION - k);
        /* One trigger jobs_ready_stamp, whether version k had one (from 10, made by its function files)
         * or not: a migration makes it (and the digest below holds it to a new database's). */
        CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pgjobq.jobs'::regclass"
                            " AND tgname = 'jobs_ready_stamp'"),
                  1);

        /* The jobs, as they were; finished ones in the history. */
        after = jobs_snapshot(pg, "pgjobq.all_jobs");
        CHECK_MSG(strcmp(before, after) == 0, "%s: the jobs changed:\n%s\n  became\n%s", what, before, after);
        live = t_str(pg, "SELECT string_agg((payload->>'n') || ' ' || state::text, ', ' ORDER BY (payload->>'n')::int)"
                         " FROM pgjobq.jobs");
        snprintf(want_live, sizeof want_live, "1 queued, 2 queued, 3 running, 7 queued%s%s",
                 k >= 9 ? ", 8 queued, 9 waiting" : "", k >= 4 ? ", 10 queued" : "");
        CHECK_STR(live, want_live);
        finished = t_str(pg, "SELECT string_agg((payload->>'n') || ' ' || state::text, ', '"
                             " ORDER BY (payload->>'n')::int) FROM pgjobq.history");
        CHECK_STR(finished, "4 completed, 5 failed, 6 cancelled");
        if (k >= 4) {
            extra_after = settings_snapshot(pg);
            CHECK_STR(extra_after, extra_before);
            free(extra_after);
            /* Version 19: every queue keeps the default max lease. */
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE max_lease IS NOT NULL"), 0);
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queue_list() WHERE max_lease = interval '1 day'"),
                      t_int(pg, "SELECT count(*) FROM pgjobq.queue_list()"));
        }
        if (k >= 6)
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'old-worker'"), 1);
        if (k >= 10) {
            /* Version 19: the levels of names that are no queue's are retired, their frontiers kept for
             * the reclaim to drop; the others stay. */
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'q'"), 1);
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE NOT (length(queue) <= 64 AND queue ~ "
                                "'^[A-Za-z][A-Za-z0-9_.:-]*$')"),
                      0);
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels_gone"), 2);
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels_gone g JOIN pg_class c ON c.relname = g.frontier"
                                " AND c.relkind = 'S'"),
                      2);
        }
        if (k >= 9) {
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.deps"), 1);
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE payload->>'n' = '9'"
                                " AND tags = '{t1,t2}' AND pending_parents = 1"),
                      1);
            CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE payload->>'n' = '3'"
                                " AND progress = '{\"p\": 50}'"),
                      1);
        }

        /* The schema, the functions and their grants: those of a new database. */
        got = schema_digest(pg);
        check_same_schema(k >= 2 ? fresh_roles : fresh_plain, got, what);
        free(got);
        sum = t_str(pg, "SELECT string_agg(checksum, ',') FROM pgjobq.function_files");
        CHECK_STR(sum, checksum);
        free(sum);
        if (k >= 2)
            CHECK_INT(t_int(pg, "SELECT has_function_privilege('pgjobq_worker', 'pgjobq.claim_batch(text, integer,"
                                " interval, text, smallint, timestamptz, bigint)', 'EXECUTE')::int"),
                      1);
        migrate_roles(c);
        got = schema_digest(pg);
        check_same_schema(fresh_roles, got, what);
        free(got);

        upgraded_database_works(pg, c, k, token3);
        pgjobq_client_close(c);
        free(before);
        free(after);
        free(extra_before);
        free(live);
        free(finished);
    }
    free(fresh_plain);
    free(fresh_roles);
    free(checksum);
    PQfinish(pg);
}

/* The schema's owner need not have CREATEROLE: when the function files re-create a function (here one
 * dropped behind their back, as a migration that changes a signature does), `pgjobq migrate` grants
 * the roles again as that owner, once the roles exist. */
TEST_FULL(schema_migrate_grants_the_roles_again_without_createrole, 60, TEST_DB_EMPTY)
{
    PGconn *pg = t_pg();
    pgjobq_client *owner = NULL, *super = NULL;
    char ci[1024];

    PQclear(t_exec(pg, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'plain_owner') THEN"
                       " CREATE ROLE plain_owner LOGIN NOCREATEROLE; END IF; END $$"));
    PQclear(t_exec(pg, "GRANT CREATE ON DATABASE %s TO plain_owner", t_dbname()));
    snprintf(ci, sizeof ci, "%s user=plain_owner", t_conninfo());
    CHECK_RC(owner, pgjobq_client_open(&owner, ci), PGJOBQ_ESCHEMA);
    CHECK_OK(owner, pgjobq_migrate(owner, NULL));
    /* The roles, made and granted once by someone who may (as `pgjobq migrate --roles` would be). */
    CHECK_OK(super, pgjobq_client_open(&super, t_conninfo()));
    migrate_roles(super);
    pgjobq_client_close(super);
    /* Once they exist, `pgjobq migrate --roles` needs no CREATEROLE either. */
    CHECK_OK(owner, pgjobq_migrate_roles(owner));

    PQclear(t_exec(pg, "DROP FUNCTION pgjobq.complete_many(bigint[], bigint[], jsonb[])"));
    PQclear(t_exec(pg, "UPDATE pgjobq.function_files SET checksum = 'another build'"));
    CHECK_OK(owner, pgjobq_migrate(owner, NULL));
    CHECK_INT(t_int(pg, "SELECT has_function_privilege('pgjobq_worker', 'pgjobq.complete_many(bigint[], bigint[],"
                        " jsonb[])', 'EXECUTE')::int"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgjobq'::regnamespace"
                        " AND pg_get_userbyid(proowner) <> 'plain_owner'"),
              0);
    pgjobq_client_close(owner);
    PQfinish(pg);
}
