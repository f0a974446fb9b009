/*
 * test_first_run.c - the embedded default: no database configured, a private cluster created in
 * $PGJOBQ_HOME on first use, shared by later commands, managed with `pgjobq db`; and `pgjobq demo`.
 */
#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include "harness.h"
#include "pgserver.h"

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

/* ------------------------------------------------------------------------------------------------ */
/* A home pgjobq can trust (issue 36, point 3)                                                       */

static void no_database_configured(void)
{
    t_use_test_db = 0;
    unsetenv("DATABASE_URL");
    unsetenv("PGJOBQ_DATABASE_URL");
}

/* A directory at path with mode, owned by uid (as root; otherwise by this user). */
static void make_dir(const char *path, mode_t mode, uid_t uid, gid_t gid)
{
    CHECK_MSG(mkdir(path, mode) == 0, "mkdir %s: %s", path, strerror(errno));
    CHECK(chmod(path, mode) == 0); /* past the umask */
    if (geteuid() == 0)
        CHECK(chown(path, uid, gid) == 0);
}

static int path_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* `pgjobq stats` with PGJOBQ_HOME=where: refused with EX_CONFIG, stderr holding each of w1, w2 and
 * w3 (NULL: none), before any cluster was made. */
static void refused(const char *where, const char *w1, const char *w2, const char *w3)
{
    char *out, *err;
    setenv("PGJOBQ_HOME", where, 1);
    CHECK_MSG(t_cli(&out, &err, NULL, 0, "stats", NULL) == EX_CONFIG, "PGJOBQ_HOME=%s was not refused: %s", where, err);
    const char *want[] = {w1, w2, w3};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(want[i] == NULL || strstr(err, want[i]) != NULL, "PGJOBQ_HOME=%s: no '%s' in: %s", where, want[i],
                  err);
    free(out);
    free(err);
    char data[700];
    snprintf(data, sizeof data, "%s/data", where);
    CHECK_MSG(!path_exists(data), "PGJOBQ_HOME=%s was refused after initdb made %s", where, data);
}

/* A home another user could have put something in is refused, with the fix in the message, before
 * anything is made or run in it: the directory open to others (0777, and 0755), a directory above
 * it that others may write to, a home of another user (as root: the server runs as 'postgres', so
 * a home of 'nobody' is another user's), and a symbolic link planted where pgjobq keeps a file,
 * which is not followed (as root it used to be: the lock and initdb's log written through it). */
TEST_FULL(first_run_untrusted_homes_are_refused, 120, 0)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    char path[600], victim[600], link[700];

    no_database_configured();
    CHECK(pgserver_owner(&uid, &gid) == 0); /* the server's account: this user, or 'postgres' as root */

    snprintf(path, sizeof path, "%s/open", t_tmpdir());
    make_dir(path, 0777, uid, gid);
    refused(path, "open to other users", "mode 0777", "chmod 700");
    snprintf(link, sizeof link, "%s/lock", path);
    CHECK_MSG(!path_exists(link), "%s was made in a home refused", link);
    CHECK(chmod(path, 0755) == 0);
    refused(path, "mode 0755", "chmod 700", NULL);

    snprintf(path, sizeof path, "%s/shared", t_tmpdir());
    make_dir(path, 0777, uid, gid);
    snprintf(link, sizeof link, "%s/home", path);
    refused(link, "is writable by other users", "chmod go-w", NULL);
    CHECK_MSG(!path_exists(link), "%s was made under a directory others may write to", link);

    if (geteuid() == 0) {
        const struct passwd *nobody = getpwnam("nobody");
        CHECK(nobody != NULL);
        snprintf(path, sizeof path, "%s/theirs", t_tmpdir());
        make_dir(path, 0700, nobody->pw_uid, nobody->pw_gid);
        refused(path, "belongs to nobody", "chown postgres", NULL);
        snprintf(link, sizeof link, "%s/lock", path);
        CHECK_MSG(!path_exists(link), "%s was made in another user's home", link);
    } else {
        fprintf(stderr, "not root: cannot make a directory of another user; that case is left out\n");
    }

    static const char *const planted[] = {"lock", "initdb.log", "server.log"};
    snprintf(path, sizeof path, "%s/planted", t_tmpdir());
    make_dir(path, 0700, uid, gid);
    for (size_t i = 0; i < sizeof planted / sizeof planted[0]; i++) {
        snprintf(link, sizeof link, "%s/%s", path, planted[i]);
        snprintf(victim, sizeof victim, "%s/victim-%s", t_tmpdir(), planted[i]);
        CHECK(symlink(victim, link) == 0);
        refused(path, link, "symbolic link", NULL);
        CHECK_MSG(!path_exists(victim), "the symbolic link %s was followed: %s exists", link, victim);
        CHECK(unlink(link) == 0);
    }
}

/* The test's own PostgreSQL programs, with an initdb that fails its first try (C.UTF-8) after
 * leaving a file in the data directory, as a missing locale does: pgjobq then removes the data
 * directory and tries the C locale (the real initdb). */
static const char *failing_first_initdb(void)
{
    static char bin[600];
    char path[700], body[1500];

    snprintf(bin, sizeof bin, "%s/bin", t_tmpdir());
    CHECK(mkdir(bin, 0755) == 0);
    static const char *const progs[] = {"postgres", "pg_ctl", "psql"};
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
        char real[700];
        snprintf(real, sizeof real, "%s/%s", t_bindir(), progs[i]);
        snprintf(path, sizeof path, "%s/%s", bin, progs[i]);
        CHECK(symlink(real, path) == 0);
    }
    snprintf(body, sizeof body,
             "for a in \"$@\"; do case $a in --locale=C.UTF-8) mkdir -p \"$2\" && : > \"$2/left-over\"; exit 1;; "
             "esac; done\nexec '%s/initdb' \"$@\"",
             t_bindir());
    snprintf(path, sizeof path, "%s/bin/initdb", t_tmpdir());
    const char *script = t_script("bin/initdb", body);
    CHECK(strcmp(script, path) == 0);
    return bin;
}

/* A home whose path holds a quote, spaces and what a shell would run: the cluster is made (after a
 * first initdb failed, whose data directory is removed without a shell), configured, started and
 * used; nothing of the path is run (issue 36, point 3: `rm -rf '%s'` went through system()). */
TEST_FULL(first_run_home_with_a_quote_in_its_path, 180, 0)
{
    char dir[800], pwned[600], path[900], *out, *err;

    t_use_embedded_home(); /* stops the server at the end, whatever PGJOBQ_HOME is then */
    snprintf(pwned, sizeof pwned, "%s/pwned", t_tmpdir());
    snprintf(dir, sizeof dir, "%s/it's a;touch %s;'dir", t_tmpdir(), pwned);
    setenv("PGJOBQ_HOME", dir, 1);
    setenv("PGJOBQ_PG_BINDIR", failing_first_initdb(), 1);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "q", "{}", NULL), 0);
    CHECK_MSG(strstr(err, "created and started the embedded PostgreSQL in") && strstr(err, dir), "stderr: %s", err);
    free(out);
    free(err);
    CHECK_MSG(!path_exists(pwned), "a shell ran part of PGJOBQ_HOME: %s exists", pwned);
    snprintf(path, sizeof path, "%s/data/left-over", dir);
    CHECK_MSG(!path_exists(path), "the failed initdb's data directory was not removed: %s", path);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "psql", "-X", "-Atc", "SHOW unix_socket_directories", NULL), 0);
    out[strcspn(out, "\n")] = '\0';
    CHECK_STR(out, dir);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "url", NULL), 0);
    out[strcspn(out, "\n")] = '\0';
    PGconn *pg = PQconnectdb(out);
    CHECK_MSG(PQstatus(pg) == CONNECTION_OK, "connect to %s: %s", out, PQerrorMessage(pg));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'q'"), 1);
    PQfinish(pg);
    free(out);
    free(err);
}

static char other_data[600];

static void stop_other_server(void)
{
    char pg_ctl[700];
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", t_bindir());
    const char *argv[] = {pg_ctl, "-D", other_data, "-m", "immediate", "-w", "stop", NULL};
    if (other_data[0])
        harness_run_as_owner(argv, NULL);
    other_data[0] = '\0';
}

/* A server that answers on the dir's socket but serves another data directory (another dir's
 * cluster; as the issue found it, another user's) is refused, not used: the enqueue must not land
 * in it (issue 36, point 3). */
TEST_FULL(first_run_a_server_of_another_data_directory_is_refused, 180, 0)
{
    char dir[600], data[700], path[800], log[700], opts[700], pg_ctl[700], *out, *err;
    uid_t uid;
    gid_t gid;

    /* A cluster of one dir, made by pgjobq and stopped... */
    const char *first = t_use_embedded_home();
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "start", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "stop", NULL), 0);
    free(out);
    free(err);
    /* ...started again with its socket in another dir, whose data directory looks made. */
    CHECK(pgserver_owner(&uid, &gid) == 0);
    snprintf(dir, sizeof dir, "%s/other", t_tmpdir());
    make_dir(dir, 0700, uid, gid);
    snprintf(data, sizeof data, "%s/data", dir);
    make_dir(data, 0700, uid, gid);
    snprintf(path, sizeof path, "%s/PG_VERSION", data);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("15\n", f);
    fclose(f);
    snprintf(other_data, sizeof other_data, "%s/data", first);
    t_defer(stop_other_server);
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", t_bindir());
    snprintf(log, sizeof log, "%s/other.log", dir);
    snprintf(opts, sizeof opts, "-k %s", dir);
    const char *argv[] = {pg_ctl, "-D", other_data, "-l", log, "-o", opts, "-w", "-t", "60", "start", NULL};
    CHECK_INT(harness_run_as_owner(argv, NULL), 0);

    setenv("PGJOBQ_HOME", dir, 1);
    CHECK_MSG(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "billing", "{\"card\": 1}", NULL) == EX_CONFIG,
              "a server of another data directory was used: %s", err);
    CHECK_MSG(strstr(err, "serves the data directory") && strstr(err, other_data), "stderr: %s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "status", NULL), EX_CONFIG);
    free(out);
    free(err);
    stop_other_server();
    setenv("PGJOBQ_HOME", first, 1);
}

/* The embedded database's login role is pgjobq, so the default search_path "$user", public found
 * pgjobq's schema first: an application's unqualified CREATE TABLE (the README's orders,
 * SQLAlchemy's create_all) landed in it.  The role's search_path is public, in a new database and,
 * at the next command, in one made before (issue 37, point 4). */
TEST_FULL(first_run_application_tables_land_in_public, 180, 0)
{
    char *out, *err;

    t_use_embedded_home();
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "psql", "-X", "-Atc",
                    "CREATE TABLE app_orders (id int); SELECT table_schema FROM information_schema.tables"
                    " WHERE table_name = 'app_orders'",
                    NULL),
              0);
    CHECK_MSG(strcmp(out, "CREATE TABLE\npublic\n") == 0 || strcmp(out, "public\n") == 0, "psql: %s", out);
    free(out);
    free(err);
    /* Through the URL other programs use (an ORM's engine). */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "url", NULL), 0);
    out[strcspn(out, "\n")] = '\0';
    PGconn *pg = PQconnectdb(out);
    CHECK_MSG(PQstatus(pg) == CONNECTION_OK, "connect to %s: %s", out, PQerrorMessage(pg));
    PQclear(t_exec(pg, "CREATE TABLE app_users (id int)"));
    char *schema = t_str(pg, "SELECT table_schema FROM information_schema.tables WHERE table_name = 'app_users'");
    CHECK_STR(schema, "public");
    free(schema);
    /* A database made before: the role without the setting gets it at the next command. */
    PQclear(t_exec(pg, "ALTER ROLE pgjobq RESET search_path"));
    PQfinish(pg);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "db", "psql", "-X", "-Atc", "SHOW search_path", NULL), 0);
    CHECK_STR(out, "public\n");
    free(out);
    free(err);
}
