/*
 * test_clients.c - pgjobq from other languages and through a pooler, as users run it: the Python
 * example (SQLAlchemy for the application, a task of the pgjobq package run by `pgjobq work --coproc`;
 * its own table, python_orders) and the Node.js example (node-postgres from npm, completing through the
 * SQL API) enqueue inside the application's transaction; and PgBouncer in transaction pooling carries
 * migrate, enqueue and `pgjobq work --poll-only`.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* Runs a command line with PGJOBQ_DATABASE_URL set to url; returns its exit status, its output in
 * *out (malloc'd). */
static int run_with_url(const char *url, const char *cmd, char **out)
{
    char line[4096], path[600];
    snprintf(path, sizeof path, "%s/out.txt", t_tmpdir());
    snprintf(line, sizeof line, "PGJOBQ_DATABASE_URL='%s' %s > %s 2>&1", url, cmd, path);
    int rc = system(line);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    *out = calloc(1, (size_t)size + 1);
    CHECK(*out && fread(*out, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static const char *srcdir(void)
{
    const char *s = getenv("PGJOBQ_SRCDIR");
    return s && s[0] ? s : ".";
}

/* The job of order `ok` completed, the order `rolled_back` and its job absent. */
static void check_orders(PGconn *pg, const char *table, int ok, int rolled_back)
{
    CHECK_INT(t_int(pg, "SELECT count(*) FROM %s WHERE id = %d", table, ok), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM %s WHERE id = %d", table, rolled_back), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'completed' AND kind = 'order_confirmation'"
                        " AND payload = '{\"order\": %d}' AND result ? 'sent_to'",
                    ok),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE payload @> '{\"order\": %d}'", rolled_back), 0);
}

TEST_FULL(clients_python_enqueues_in_the_applications_transaction, 60, 0)
{
    PGconn *pg = t_pg();
    char cmd[1024], *out = NULL;

    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/examples/python/orders.py", srcdir());
    int rc = run_with_url(t_conninfo(), cmd, &out);
    CHECK_MSG(rc == 0, "orders.py: exit %d: %s", rc, out);
    CHECK(strstr(out, "order 1002 rolled back (payment declined)") != NULL);
    free(out);
    check_orders(pg, "python_orders", 1001, 1002);
    PQfinish(pg);
}

TEST_FULL(clients_node_enqueues_in_the_applications_transaction, 60, 0)
{
    PGconn *pg = t_pg();
    char cmd[1024], *out = NULL;

    snprintf(cmd, sizeof cmd, "node %s/examples/node/orders.js", srcdir());
    int rc = run_with_url(t_conninfo(), cmd, &out);
    CHECK_MSG(rc == 0, "orders.js: exit %d: %s", rc, out);
    CHECK(strstr(out, "order 2002 rolled back (payment declined)") != NULL);
    free(out);
    check_orders(pg, "orders", 2001, 2002);
    PQfinish(pg);
}

static char bouncer_pidfile[700];

static void stop_bouncer(void)
{
    FILE *f = fopen(bouncer_pidfile, "r");
    int pid = 0;
    if (f) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    if (pid > 0)
        kill(pid, SIGTERM);
}

static int free_port(void)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static pid_t worker;

static void stop_worker(void)
{
    if (worker > 0) {
        kill(worker, SIGTERM);
        t_wait_exit(worker, 20000);
        worker = 0;
    }
}

TEST_FULL(pgbouncer_transaction_pooling_carries_migrate_enqueue_and_work, 90, TEST_DB_EMPTY)
{
    char dir[600], path[700], sock[512] = "", url[800], *out = NULL, *err = NULL;
    const char *pgbouncer = access("/usr/sbin/pgbouncer", X_OK) == 0 ? "/usr/sbin/pgbouncer" : "pgbouncer";

    /* A directory the cluster's owner (who runs PgBouncer: it refuses root) can write. */
    snprintf(dir, sizeof dir, "%s/pgbouncer", t_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    const char *uid = getenv("PGJOBQ_TEST_OWNER_UID"), *gid = getenv("PGJOBQ_TEST_OWNER_GID");
    if (uid && gid)
        CHECK(chown(dir, (uid_t)atoi(uid), (gid_t)atoi(gid)) == 0);
    chmod(t_tmpdir(), 0755);
    CHECK(sscanf(t_conninfo(), "host=%511s", sock) == 1);
    int port = free_port();
    snprintf(path, sizeof path, "%s/users.txt", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL && fputs("\"postgres\" \"\"\n", f) >= 0 && fclose(f) == 0);
    snprintf(path, sizeof path, "%s/pgbouncer.ini", dir);
    f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f,
            "[databases]\n* = host=%s port=5432\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\n"
            "unix_socket_dir =\nauth_type = trust\nauth_file = %s/users.txt\npool_mode = transaction\n"
            "logfile = %s/pgbouncer.log\npidfile = %s/pgbouncer.pid\nmax_client_conn = 100\ndefault_pool_size = 4\n"
            "ignore_startup_parameters = extra_float_digits,options\n",
            sock, port, dir, dir, dir);
    CHECK(fclose(f) == 0);
    snprintf(bouncer_pidfile, sizeof bouncer_pidfile, "%s/pgbouncer.pid", dir);
    const char *argv[] = {pgbouncer, "-d", path, NULL};
    CHECK_INT(harness_run_as_owner(argv, NULL), 0);
    t_defer(stop_bouncer);
    snprintf(url, sizeof url, "host=127.0.0.1 port=%d user=postgres dbname=%s", port, t_dbname());

    /* Through the pooler: the schema, 100 jobs, and a polling worker that runs them all. */
    int64_t t0 = t_now_ms();
    int rc;
    while ((rc = t_cli(&out, &err, NULL, 0, "migrate", "--db", url, NULL)) != 0 && t_now_ms() - t0 < 10000) {
        free(out);
        free(err);
        usleep(100000);
    }
    CHECK_MSG(rc == 0, "migrate through PgBouncer: %s", err);
    free(out);
    free(err);
    char jobs[100 * 16] = "";
    for (int i = 0; i < 100; i++)
        snprintf(jobs + strlen(jobs), sizeof jobs - strlen(jobs), "{\"i\": %d}\n", i);
    CHECK_INT(t_cli(&out, &err, jobs, strlen(jobs), "enqueue", "--db", url, "--queue", "pooled", "--file", "-", NULL), 0);
    free(out);
    free(err);
    const char *log = t_log_path("pooled-worker");
    worker = t_spawn(log, NULL, "work", "--db", url, "--poll-only", "--poll", "100ms", "--queue", "pooled:4", "--exec",
                     "/bin/true", NULL);
    t_defer(stop_worker);
    PGconn *pg = t_pg();
    t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'pooled' AND state = 'completed'") < 100) {
        if (t_now_ms() - t0 > 60000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the jobs did not complete through PgBouncer");
        }
        usleep(100000);
    }
    stop_worker();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 0);
    PQfinish(pg);
}
