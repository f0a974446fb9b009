/*
 * runner.c - starts a throwaway PostgreSQL cluster and runs every registered test in its own process.
 *
 *   runner [-j N] [-v] [-l] [-x WORD]... [NAME...]
 *
 * NAMEs select tests whose name contains one of them; -x leaves out those whose name contains WORD.
 * -j runs N tests at once (default 2, or $PGJOBQ_TEST_JOBS), -v prints every test's output, -l lists
 * the tests.  The last line is
 * "N passed, N failed".
 *
 * The cluster lives in a temporary directory with its Unix socket and no TCP listener.  A reaper
 * process, forked before the server starts, stops the server and removes the directory when the
 * runner exits for any reason, including a crash or SIGKILL: it waits for EOF on a pipe that only the
 * runner holds open.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "pgserver.h"

#define MAX_TESTS 512

typedef struct test {
    const char *name;
    void (*fn)(void);
    int timeout_s;
    int flags;
    /* run state */
    pid_t pid;
    int64_t started_ms;
    int64_t ended_ms;
    int status; /* 0 pass, 1 fail */
    int timed_out;
    char out_path[1400];
} test;

static test tests[MAX_TESTS];
static int ntests;

void harness_register(const char *name, void (*fn)(void), int timeout_s, int flags)
{
    if (ntests == MAX_TESTS) {
        fprintf(stderr, "runner: too many tests\n");
        exit(2);
    }
    tests[ntests].name = name;
    tests[ntests].fn = fn;
    tests[ntests].timeout_s = timeout_s;
    tests[ntests].flags = flags;
    ntests++;
}

static char dir[1024]; /* the cluster's temporary directory (socket directory too) */
static char pgdata[1100];
static char bindir[4096];
static int reaper_fd = -1; /* write end of the reaper's pipe */

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "runner: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static void find_bindir(void)
{
    char why[512];
    if (pgserver_bindir(bindir, sizeof bindir, why, sizeof why) != 0)
        die("%s", why);
}

static void rm_rf(const char *path)
{
    const char *argv[] = {"/bin/rm", "-rf", path, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

static void stop_server(void)
{
    char pg_ctl[4200];
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", bindir);
    const char *argv[] = {pg_ctl, "-D", pgdata, "-m", "immediate", "-w", "stop", NULL};
    struct stat st;
    char pid_file[4200];

    snprintf(pid_file, sizeof pid_file, "%s/postmaster.pid", pgdata);
    if (stat(pid_file, &st) == 0)
        harness_run_as_owner(argv, NULL);
}

/* The reaper: waits until the runner is gone (EOF on the pipe), then stops the server and removes
 * the directory.  It ignores the terminal's signals so that Ctrl-C cannot kill it before it cleans. */
static void start_reaper(void)
{
    int p[2];
    pid_t pid;

    if (pipe(p) != 0)
        die("pipe: %s", strerror(errno));
    pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        char c;
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        setsid();
        close(p[1]);
        while (read(p[0], &c, 1) != 0 && errno == EINTR)
            ;
        stop_server();
        if (!getenv("PGJOBQ_TEST_KEEP"))
            rm_rf(dir);
        _exit(0);
    }
    close(p[0]);
    fcntl(p[1], F_SETFD, FD_CLOEXEC);
    reaper_fd = p[1];
}

static void setup_owner(void)
{
    uid_t uid;
    gid_t gid;
    char u[32], g[32];

    if (geteuid() != 0)
        return;
    if (pgserver_owner(&uid, &gid) != 0)
        die("running as root, but there is neither a 'postgres' nor a 'nobody' user to run PostgreSQL as");
    snprintf(u, sizeof u, "%d", (int)uid);
    snprintf(g, sizeof g, "%d", (int)gid);
    setenv("PGJOBQ_TEST_OWNER_UID", u, 1);
    setenv("PGJOBQ_TEST_OWNER_GID", g, 1);
    if (chown(dir, uid, gid) != 0)
        die("chown %s: %s", dir, strerror(errno));
}

static void start_cluster(void)
{
    const char *tmp = getenv("TMPDIR");
    char initdb[4200], pg_ctl[4200], log[4200], conf[4200];
    FILE *f;

    snprintf(dir, sizeof dir, "%s/pgjobq-test-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL)
        die("mkdtemp %s: %s", dir, strerror(errno));
    /* Everything the reaper needs to stop the server must be known before it is forked: the data
     * directory, and the owner (pg_ctl refuses to stop a server as root). */
    snprintf(pgdata, sizeof pgdata, "%s/data", dir);
    setup_owner();
    start_reaper();
    snprintf(initdb, sizeof initdb, "%s/initdb", bindir);
    snprintf(log, sizeof log, "%s/initdb.log", dir);
    const char *init_argv[] = {initdb,     "-D", pgdata, "-A",         "trust",     "-U",
                               "postgres", "-E", "UTF8", "--locale=C", "--no-sync", NULL};
    if (harness_run_as_owner(init_argv, log) != 0) {
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "cat %s >&2", log);
        if (system(cmd) != 0)
            fprintf(stderr, "runner: (could not show %s)\n", log);
        die("initdb failed");
    }
    /* Settings go into the configuration file, so that a test's `pg_ctl restart` keeps them. */
    snprintf(conf, sizeof conf, "%s/postgresql.conf", pgdata);
    f = fopen(conf, "a");
    if (f == NULL)
        die("open %s: %s", conf, strerror(errno));
    fprintf(f,
            "\n# pgjobq test harness\n"
            "listen_addresses = ''\n"
            "unix_socket_directories = '%s'\n"
            "port = 5432\n"
            "max_connections = 300\n"
            "fsync = off\n"
            "synchronous_commit = off\n"
            "full_page_writes = off\n"
            "shared_buffers = 128MB\n"
            "log_min_messages = warning\n"
            "log_line_prefix = '%%m [%%p] %%d '\n",
            dir);
    fclose(f);
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", bindir);
    snprintf(log, sizeof log, "%s/server.log", dir);
    const char *start_argv[] = {pg_ctl, "-D", pgdata, "-l", log, "-w", "-t", "60", "start", NULL};
    if (harness_run_as_owner(start_argv, NULL) != 0) {
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "tail -n 30 %s >&2", log);
        if (system(cmd) != 0)
            fprintf(stderr, "runner: (could not show %s)\n", log);
        die("the PostgreSQL server did not start");
    }
    setenv("PGJOBQ_TEST_PGDATA", pgdata, 1);
    setenv("PGJOBQ_TEST_BINDIR", bindir, 1);
    setenv("PGJOBQ_TEST_SOCKDIR", dir, 1);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static PGconn *admin_connect(const char *db)
{
    char ci[4400];
    snprintf(ci, sizeof ci, "host=%s port=5432 user=postgres dbname=%s", dir, db);
    PGconn *c = PQconnectdb(ci);
    if (PQstatus(c) != CONNECTION_OK)
        die("connect to %s: %s", db, PQerrorMessage(c));
    return c;
}

static void admin_exec(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        die("%s: %s", sql, PQerrorMessage(c));
    PQclear(r);
}

/* The admin connection breaks when a test restarts the server: reconnect, waiting for the server. */
static PGconn *admin_alive(PGconn *c)
{
    int64_t deadline = now_ms() + 60000;

    if (PQstatus(c) == CONNECTION_OK) {
        PGresult *r = PQexec(c, "SELECT 1");
        int ok = PQresultStatus(r) == PGRES_TUPLES_OK;
        PQclear(r);
        if (ok)
            return c;
    }
    PQfinish(c);
    for (;;) {
        char ci[4400];
        snprintf(ci, sizeof ci, "host=%s port=5432 user=postgres dbname=postgres", dir);
        c = PQconnectdb(ci);
        if (PQstatus(c) == CONNECTION_OK)
            return c;
        if (now_ms() > deadline)
            die("the server is gone: %s", PQerrorMessage(c));
        PQfinish(c);
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* Creates the migrated template, using the library's own migration path. */
static void make_template(PGconn *admin)
{
    char ci[4400];
    pgjobq_client *c = NULL;
    int rc;

    admin_exec(admin, "CREATE DATABASE tmpl_migrated");
    admin_exec(admin, "CREATE DATABASE tmpl_empty");
    snprintf(ci, sizeof ci, "host=%s port=5432 user=postgres dbname=tmpl_migrated", dir);
    rc = pgjobq_client_open(&c, ci);
    if (rc != PGJOBQ_ESCHEMA)
        die("opening an empty database: expected PGJOBQ_ESCHEMA, got %s: %s", pgjobq_errname(rc), pgjobq_errmsg(c));
    rc = pgjobq_migrate(c, NULL);
    if (rc != PGJOBQ_OK)
        die("migrate: %s: %s", pgjobq_errname(rc), pgjobq_errmsg(c));
    pgjobq_client_close(c);
}

static void run_child(test *t, int index)
{
    char db[64], ci[4400];
    int fd;

    close(reaper_fd);
    setpgid(0, 0);
#ifdef __linux__
    /* A test in a process group of its own does not get the terminal's or timeout(1)'s signal: it
     * dies with the runner instead of running on, orphaned, with its servers. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1)
        _exit(1);
#endif
    fd = open(t->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    snprintf(db, sizeof db, "t%d", index);
    snprintf(ci, sizeof ci, "host=%s port=5432 user=postgres dbname=%s", dir, db);
    setenv("PGJOBQ_TEST_CONNINFO", ci, 1);
    setenv("PGJOBQ_TEST_DB", db, 1);
    setvbuf(stdout, NULL, _IOLBF, 0);
    t->fn();
    /* exit, not _exit: LeakSanitizer checks for leaks at exit in `make sanitize`. */
    exit(0);
}

#define MAX_EXCLUDED 16
static const char *excluded[MAX_EXCLUDED];
static int nexcluded;

static int selected(const char *name, int argc, char **argv, int first)
{
    for (int i = 0; i < nexcluded; i++)
        if (strstr(name, excluded[i]))
            return 0;
    if (first >= argc)
        return 1;
    for (int i = first; i < argc; i++)
        if (strstr(name, argv[i]))
            return 1;
    return 0;
}

static void print_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    if (f == NULL)
        return;
    while (fgets(line, sizeof line, f))
        printf("    %s", line);
    fclose(f);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const test *)a)->name, ((const test *)b)->name);
}

int main(int argc, char **argv)
{
    int jobs = 2, verbose = 0, list = 0, first = 1;
    int passed = 0, failed = 0, running = 0, next = 0;
    int order[MAX_TESTS], nsel = 0, exclusive_running = 0;
    PGconn *admin;

    if (getenv("PGJOBQ_TEST_JOBS"))
        jobs = atoi(getenv("PGJOBQ_TEST_JOBS"));
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (strcmp(argv[first], "-v") == 0)
            verbose = 1;
        else if (strcmp(argv[first], "-l") == 0)
            list = 1;
        else if (strcmp(argv[first], "-j") == 0 && first + 1 < argc)
            jobs = atoi(argv[++first]);
        else if (strcmp(argv[first], "-x") == 0 && first + 1 < argc && nexcluded < MAX_EXCLUDED)
            excluded[nexcluded++] = argv[++first];
        else
            die("usage: runner [-j N] [-v] [-l] [-x WORD]... [NAME...]");
    }
    if (jobs < 1)
        jobs = 1;
    qsort(tests, (size_t)ntests, sizeof tests[0], by_name);
    for (int i = 0; i < ntests; i++)
        if (selected(tests[i].name, argc, argv, first))
            order[nsel++] = i;
    if (list) {
        for (int i = 0; i < nsel; i++)
            printf("%s\n", tests[order[i]].name);
        return 0;
    }
    if (nsel == 0)
        die("no test matches");

    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    find_bindir();
    start_cluster();
    printf("# PostgreSQL from %s, cluster in %s, %d tests, %d at a time\n", bindir, dir, nsel, jobs);
    admin = admin_connect("postgres");
    make_template(admin);

    while (next < nsel || running > 0) {
        while (running < jobs && next < nsel && !exclusive_running) {
            int idx = order[next];
            test *t = &tests[idx];
            char sql[256];

            if ((t->flags & TEST_EXCLUSIVE) && running > 0)
                break; /* wait until the others are done */
            next++;
            exclusive_running = (t->flags & TEST_EXCLUSIVE) != 0;
            admin = admin_alive(admin);

            snprintf(sql, sizeof sql, "CREATE DATABASE t%d TEMPLATE %s", idx,
                     (t->flags & TEST_DB_EMPTY) ? "tmpl_empty" : "tmpl_migrated");
            admin_exec(admin, sql);
            snprintf(t->out_path, sizeof t->out_path, "%s/%s.out", dir, t->name);
            t->started_ms = now_ms();
            t->pid = fork();
            if (t->pid < 0)
                die("fork: %s", strerror(errno));
            if (t->pid == 0)
                run_child(t, idx);
            running++;
        }
        /* Reap finished tests; kill the process group of any over its time. */
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid == 0) {
            struct timespec pause = {0, 10 * 1000 * 1000};
            for (int i = 0; i < nsel; i++) {
                test *t = &tests[order[i]];
                if (t->pid > 0 && !t->timed_out && now_ms() - t->started_ms > (int64_t)t->timeout_s * 1000) {
                    t->timed_out = 1;
                    kill(-t->pid, SIGKILL);
                }
            }
            nanosleep(&pause, NULL);
            continue;
        }
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            die("waitpid: %s", strerror(errno));
        }
        for (int i = 0; i < nsel; i++) {
            test *t = &tests[order[i]];
            if (t->pid != pid)
                continue;
            int ok = !t->timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
            /* Anything the test left running in its process group goes with it. */
            kill(-pid, SIGKILL);
            t->pid = 0;
            running--;
            if (t->flags & TEST_EXCLUSIVE)
                exclusive_running = 0;
            double secs = (double)(now_ms() - t->started_ms) / 1000.0;
            if (ok) {
                passed++;
                printf("ok      %-44s %6.2fs\n", t->name, secs);
            } else {
                failed++;
                if (t->timed_out)
                    printf("FAIL    %-44s %6.2fs  (timed out after %d s)\n", t->name, secs, t->timeout_s);
                else if (WIFSIGNALED(status))
                    printf("FAIL    %-44s %6.2fs  (killed by signal %d)\n", t->name, secs, WTERMSIG(status));
                else
                    printf("FAIL    %-44s %6.2fs\n", t->name, secs);
            }
            if (!ok || verbose)
                print_file(t->out_path);
            {
                char sql[128];
                snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS t%d WITH (FORCE)", order[i]);
                admin = admin_alive(admin);
                PGresult *r = PQexec(admin, sql);
                PQclear(r);
            }
            break;
        }
    }
    PQfinish(admin);
    if (failed && getenv("PGJOBQ_TEST_KEEP") == NULL) {
        char cmd[4300];
        printf("# last lines of the server log:\n");
        fflush(stdout);
        snprintf(cmd, sizeof cmd, "tail -n 20 %s/server.log | sed 's/^/    /'", dir);
        if (system(cmd) != 0)
            printf("    (no server log)\n");
    }
    printf("%d passed, %d failed\n", passed, failed);
    fflush(stdout);
    /* Closing the pipe lets the reaper stop the server and remove the directory; wait for it, so that
     * nothing is left behind when make returns. */
    close(reaper_fd);
    while (wait(NULL) > 0 || errno == EINTR)
        ;
    return failed ? 1 : 0;
}
