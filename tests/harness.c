/*
 * harness.c - helpers used inside tests, and running programs as the cluster's owner.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "pgserver.h"

static const char *env_or_die(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0') {
        fprintf(stderr, "harness: %s is not set (run tests through tests/runner)\n", name);
        exit(2);
    }
    return v;
}

const char *t_conninfo(void)
{
    return env_or_die("PGJOBQ_TEST_CONNINFO");
}

const char *t_dbname(void)
{
    return env_or_die("PGJOBQ_TEST_DB");
}

const char *t_pgdata(void)
{
    return env_or_die("PGJOBQ_TEST_PGDATA");
}

const char *t_bindir(void)
{
    return env_or_die("PGJOBQ_TEST_BINDIR");
}

int t_use_test_db = 1;

static void (*deferred[8])(void);
static int ndeferred;

static void run_deferred(void)
{
    while (ndeferred > 0)
        deferred[--ndeferred]();
}

void t_defer(void (*fn)(void))
{
    if (ndeferred == 0)
        atexit(run_deferred);
    if (ndeferred < 8)
        deferred[ndeferred++] = fn;
}

static void show_logs(void);

void t_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "  FAILED at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    show_logs();
    run_deferred();
    _exit(1);
}

pgjobq_client *t_client(void)
{
    pgjobq_client *c = NULL;
    int rc = pgjobq_client_open(&c, t_conninfo());
    if (rc != PGJOBQ_OK)
        t_fail(__FILE__, __LINE__, "pgjobq_client_open: %s: %s", pgjobq_errname(rc), pgjobq_errmsg(c));
    return c;
}

PGconn *t_pg(void)
{
    PGconn *conn = PQconnectdb(t_conninfo());
    if (PQstatus(conn) != CONNECTION_OK)
        t_fail(__FILE__, __LINE__, "connect: %s", PQerrorMessage(conn));
    return conn;
}

char *t_extra_db(const char *suffix, int migrated)
{
    PQconninfoOption *opts = PQconninfoParse(t_conninfo(), NULL);
    char name[128], *out;
    size_t len = 64;

    if (opts == NULL)
        t_fail(__FILE__, __LINE__, "cannot parse the test's conninfo");
    snprintf(name, sizeof name, "%s_%s", t_dbname(), suffix);
    PGconn *pg = t_pg();
    PQclear(t_exec(pg, "CREATE DATABASE %s TEMPLATE %s", name, migrated ? "tmpl_migrated" : "tmpl_empty"));
    PQfinish(pg);
    for (PQconninfoOption *o = opts; o->keyword; o++)
        if (o->val && o->val[0] && strcmp(o->keyword, "dbname") != 0)
            len += strlen(o->keyword) + strlen(o->val) + 2;
    out = malloc(len + strlen(name));
    if (out == NULL)
        t_fail(__FILE__, __LINE__, "out of memory");
    out[0] = '\0';
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        if (o->val && o->val[0] && strcmp(o->keyword, "dbname") != 0) {
            strcat(out, o->keyword);
            strcat(out, "=");
            strcat(out, o->val);
            strcat(out, " ");
        }
    }
    strcat(out, "dbname=");
    strcat(out, name);
    PQconninfoFree(opts);
    return out;
}

static PGresult *vexec(PGconn *conn, const char *fmt, va_list ap)
{
    char sql[8192];
    PGresult *r;

    int n = vsnprintf(sql, sizeof sql, fmt, ap);
    if (n < 0 || (size_t)n >= sizeof sql)
        t_fail(__FILE__, __LINE__, "SQL longer than %zu bytes (t_exec and t_int are for short statements)", sizeof sql);
    r = PQexec(conn, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
        t_fail(__FILE__, __LINE__, "SQL failed: %s\n  %s", sql, PQerrorMessage(conn));
    return r;
}

PGresult *t_exec(PGconn *conn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PGresult *r = vexec(conn, fmt, ap);
    va_end(ap);
    return r;
}

long long t_int(PGconn *conn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PGresult *r = vexec(conn, fmt, ap);
    va_end(ap);
    if (PQntuples(r) < 1)
        t_fail(__FILE__, __LINE__, "query returned no row");
    long long v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

char *t_str(PGconn *conn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PGresult *r = vexec(conn, fmt, ap);
    va_end(ap);
    if (PQntuples(r) < 1)
        t_fail(__FILE__, __LINE__, "query returned no row");
    char *s = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return s;
}

int64_t t_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int t_wait_until(int (*cond)(void *), void *arg, int timeout_ms)
{
    int64_t deadline = t_now_ms() + timeout_ms;
    struct timespec pause = {0, 5 * 1000 * 1000};

    for (;;) {
        if (cond(arg))
            return 1;
        if (t_now_ms() >= deadline)
            return 0;
        nanosleep(&pause, NULL);
    }
}

/* Appends what is readable on fd to *buf; returns 0 at EOF. */
static int drain(int fd, char **buf, size_t *len)
{
    char chunk[65536];
    ssize_t n = read(fd, chunk, sizeof chunk);

    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 1 : 0;
    if (n == 0)
        return 0;
    char *p = realloc(*buf, *len + (size_t)n + 1);
    if (p == NULL)
        t_fail(__FILE__, __LINE__, "out of memory");
    memcpy(p + *len, chunk, (size_t)n);
    *len += (size_t)n;
    p[*len] = '\0';
    *buf = p;
    return 1;
}

int t_cli(char **out, char **err, const char *stdin_data, size_t stdin_len, ...)
{
    const char *argv[64];
    int in[2], o[2], e[2], argc = 0, status;
    char *obuf = NULL, *ebuf = NULL;
    size_t olen = 0, elen = 0, written = 0;
    va_list ap;
    pid_t pid;

    argv[argc++] = env_or_die("PGJOBQ_CLI");
    va_start(ap, stdin_len);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && argc < 63;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;

    if (pipe(in) != 0 || pipe(o) != 0 || pipe(e) != 0)
        t_fail(__FILE__, __LINE__, "pipe: %s", strerror(errno));
    pid = fork();
    if (pid < 0)
        t_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(o[1], 1);
        dup2(e[1], 2);
        close(in[0]);
        close(in[1]);
        close(o[0]);
        close(o[1]);
        close(e[0]);
        close(e[1]);
        if (t_use_test_db)
            setenv("PGJOBQ_DATABASE_URL", t_conninfo(), 1);
        else
            unsetenv("PGJOBQ_DATABASE_URL");
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(o[1]);
    close(e[1]);
    if (stdin_data == NULL || stdin_len == 0) {
        close(in[1]);
        in[1] = -1;
    } else {
        fcntl(in[1], F_SETFL, O_NONBLOCK);
    }
    signal(SIGPIPE, SIG_IGN);

    int64_t deadline = t_now_ms() + 60000;
    int open_o = 1, open_e = 1;
    while (open_o || open_e) {
        struct pollfd p[3] = {{o[0], POLLIN, 0}, {e[0], POLLIN, 0}, {in[1], POLLOUT, 0}};
        int wait = (int)(deadline - t_now_ms());
        if (wait <= 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            t_fail(__FILE__, __LINE__, "pgjobq %s did not finish within 60 s", argc > 1 ? argv[1] : "");
        }
        if (!open_o)
            p[0].fd = -1;
        if (!open_e)
            p[1].fd = -1;
        if (poll(p, 3, wait) < 0 && errno != EINTR)
            t_fail(__FILE__, __LINE__, "poll: %s", strerror(errno));
        if (p[0].revents)
            open_o = drain(o[0], &obuf, &olen);
        if (p[1].revents)
            open_e = drain(e[0], &ebuf, &elen);
        if (in[1] >= 0 && p[2].revents) {
            ssize_t n = write(in[1], stdin_data + written, stdin_len - written);
            if (n > 0)
                written += (size_t)n;
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                written = stdin_len; /* the command stopped reading */
            if (written == stdin_len) {
                close(in[1]);
                in[1] = -1;
            }
        }
    }
    if (in[1] >= 0)
        close(in[1]);
    close(o[0]);
    close(e[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (out)
        *out = obuf ? obuf : strdup("");
    else
        free(obuf);
    if (err)
        *err = ebuf ? ebuf : strdup("");
    else
        free(ebuf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int harness_run_as_owner(const char *const argv[], const char *log_path)
{
    const char *uid_s = getenv("PGJOBQ_TEST_OWNER_UID");
    const char *gid_s = getenv("PGJOBQ_TEST_OWNER_GID");
    uid_t uid = uid_s ? (uid_t)atoi(uid_s) : geteuid();
    gid_t gid = gid_s ? (gid_t)atoi(gid_s) : getegid();

    /* pgserver_run opens the log as the owner, who may not create files where the test keeps its
     * logs (its directory is root's as root): the log is made here, and given to the owner. */
    if (log_path && geteuid() == 0 && uid != 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0644);
        if (fd >= 0) {
            if (fchown(fd, uid, gid) != 0)
                fprintf(stderr, "harness: cannot give %s to uid %d: %s\n", log_path, (int)uid, strerror(errno));
            close(fd);
        }
    }
    return pgserver_run(argv, log_path, uid, gid);
}

int t_pg_ctl(const char *arg, ...)
{
    char pg_ctl[4096], log[4096];
    const char *argv[32];
    int argc = 0;
    va_list ap;

    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", t_bindir());
    snprintf(log, sizeof log, "%s/../server.log", t_pgdata());
    argv[argc++] = pg_ctl;
    argv[argc++] = "-D";
    argv[argc++] = t_pgdata();
    argv[argc++] = "-l";
    argv[argc++] = log;
    va_start(ap, arg);
    for (const char *a = arg; a != NULL && argc < 31; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    return harness_run_as_owner(argv, NULL);
}

pid_t t_spawn(const char *log_path, const char *extra_env, ...)
{
    const char *argv[64];
    int argc = 0;
    va_list ap;
    pid_t pid;

    argv[argc++] = env_or_die("PGJOBQ_CLI");
    va_start(ap, extra_env);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && argc < 63;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    pid = fork();
    if (pid < 0)
        t_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        pgserver_redirect(log_path);
        if (t_use_test_db)
            setenv("PGJOBQ_DATABASE_URL", t_conninfo(), 1);
        else
            unsetenv("PGJOBQ_DATABASE_URL");
        if (extra_env)
            putenv(strdup(extra_env));
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int t_wait_exit(pid_t pid, int timeout_ms)
{
    int64_t deadline = t_now_ms() + timeout_ms;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0 && errno != EINTR)
            return -1;
        if (t_now_ms() >= deadline)
            return -1;
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

static char tmpdir[256];

static void remove_tmpdir(void)
{
    char cmd[300];
    if (tmpdir[0] == '\0')
        return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}

const char *t_tmpdir(void)
{
    if (tmpdir[0] == '\0') {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/pgjobq-t-XXXXXX");
        if (mkdtemp(tmpdir) == NULL)
            t_fail(__FILE__, __LINE__, "mkdtemp: %s", strerror(errno));
        chmod(tmpdir, 0755); /* the server may read files here (COPY FROM) */
        atexit(remove_tmpdir);
    }
    return tmpdir;
}

const char *t_script(const char *name, const char *body)
{
    static char path[512];
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", t_tmpdir(), name);
    f = fopen(path, "w");
    if (f == NULL)
        t_fail(__FILE__, __LINE__, "cannot write %s", path);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    chmod(path, 0755);
    return path;
}

static char embedded_home[512];

static void stop_embedded(void)
{
    char *out = NULL, *err = NULL;
    if (embedded_home[0] && t_cli(&out, &err, NULL, 0, "db", "stop", NULL) != 0)
        fprintf(stderr, "db stop: %s\n", err ? err : "");
    free(out);
    free(err);
}

const char *t_use_embedded_home(void)
{
    snprintf(embedded_home, sizeof embedded_home, "%s/home", t_tmpdir());
    setenv("PGJOBQ_HOME", embedded_home, 1);
    unsetenv("PGJOBQ_DATABASE_URL");
    unsetenv("DATABASE_URL");
    t_use_test_db = 0;
    t_defer(stop_embedded);
    return embedded_home;
}

/* The logs this test named, so that a failure can show their ends. */
static char log_paths[64][512];
static int nlog_paths;

const char *t_log_path(const char *name)
{
    char p[512];
    int i;

    snprintf(p, sizeof p, "%s/%s.log", t_tmpdir(), name);
    for (i = 0; i < nlog_paths; i++)
        if (strcmp(log_paths[i], p) == 0)
            return log_paths[i];
    if (nlog_paths == 64)
        t_fail(__FILE__, __LINE__, "t_log_path: more than 64 logs in one test");
    snprintf(log_paths[nlog_paths], sizeof log_paths[0], "%s", p);
    return log_paths[nlog_paths++];
}

/* On a failure: the last lines of each log the test named that exists (a spawned worker's log says
 * what it did; a CI run shows nothing else of it). */
static void show_logs(void)
{
    for (int i = 0; i < nlog_paths; i++) {
        if (access(log_paths[i], F_OK) != 0)
            continue;
        fprintf(stderr, "  --- last lines of %s\n", log_paths[i]);
        fflush(stderr);
        t_show_log(log_paths[i]);
    }
}

const char *t_srcdir(void)
{
    const char *dir = getenv("PGJOBQ_SRCDIR");
    CHECK_MSG(dir != NULL && dir[0], "PGJOBQ_SRCDIR is not set (make check sets it)");
    return dir;
}

char *t_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
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

int t_shell(char *out, size_t size, const char *cmd)
{
    char path[600], *line;
    static int calls;

    snprintf(path, sizeof path, "%s/shell-%d.out", t_tmpdir(), calls++);
    size_t len = strlen(cmd) + strlen(path) + 16;
    line = malloc(len);
    CHECK(line != NULL);
    snprintf(line, len, "(%s) > '%s' 2>&1", cmd, path);
    int rc = system(line);
    free(line);
    char *text = t_read_file(path);
    snprintf(out, size, "%s", text);
    free(text);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

void t_show_log(const char *path)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "tail -n 60 '%s' >&2", path);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log at %s)\n", path);
}

void t_audit_install(PGconn *conn)
{
    PQclear(t_exec(conn, "CREATE TABLE public.job_audit (job_id bigint, old_state text, new_state text,"
                         " old_token bigint, new_token bigint, old_lease_until timestamptz,"
                         " new_lease_until timestamptz, at timestamptz, query text)"));
    /* A job that finishes is deleted from pgjobq.jobs and inserted into pgjobq.history by one statement:
     * its deletion is audited as the holder's write (new_state 'moved'). */
    PQclear(t_exec(conn, "CREATE FUNCTION public.job_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                         " IF TG_OP = 'DELETE' THEN"
                         "  INSERT INTO public.job_audit VALUES (OLD.id, OLD.state, 'moved', OLD.lease_token,"
                         "  NULL, OLD.lease_until, NULL, now(), left(current_query(), 120));"
                         " ELSE"
                         "  INSERT INTO public.job_audit VALUES (OLD.id, OLD.state, NEW.state, OLD.lease_token,"
                         "  NEW.lease_token, OLD.lease_until, NEW.lease_until, now(), left(current_query(), 120));"
                         " END IF;"
                         " RETURN NULL; END $$"));
    /* The audit runs inside pgjobq's SECURITY DEFINER functions, owned by the test's superuser. */
    PQclear(t_exec(conn, "CREATE TRIGGER job_audit AFTER UPDATE OR DELETE ON pgjobq.jobs FOR EACH ROW"
                         " EXECUTE FUNCTION public.job_audit_row()"));
}

long long t_audit_claims_in_valid_lease(PGconn *conn)
{
    /* A job taken from its holder while the holder's lease was still valid: claimed again under
     * another token (running to running), or put back by the rescue, whose business is expired leases
     * only.  (The holder ending or handing back its own job is not taking it.)  Tokens are random
     * since schema 11, so a lease is told from the next by its token changing, not by token + 1. */
    return t_int(conn, "SELECT count(*) FROM public.job_audit"
                       " WHERE old_state = 'running' AND old_lease_until > at"
                       "   AND ((new_state = 'running' AND new_token IS DISTINCT FROM old_token)"
                       "        OR (new_state = 'queued' AND query LIKE '%%rescue_expired%%'))");
}

long long t_audit_stale_writes(PGconn *conn)
{
    return t_int(conn, "SELECT count(*) FROM public.job_audit WHERE old_state = 'running'"
                       " AND old_lease_until <= at AND query NOT LIKE '%%rescue_expired%%'");
}

void t_auto_explain(PGconn *pg, PQnoticeProcessor collect, int analyze)
{
    PQsetNoticeProcessor(pg, collect, NULL);
    PQclear(t_exec(pg, "LOAD 'auto_explain'"));
    PQclear(t_exec(pg, "SET auto_explain.log_min_duration = 0"));
    PQclear(t_exec(pg, "SET auto_explain.log_nested_statements = on"));
    if (analyze) {
        PQclear(t_exec(pg, "SET auto_explain.log_analyze = on"));
        PQclear(t_exec(pg, "SET auto_explain.log_buffers = on"));
    }
    PQclear(t_exec(pg, "SET auto_explain.log_level = 'notice'"));
    PQclear(t_exec(pg, "SET client_min_messages = 'notice'"));
}

PGconn *t_connect(const char *conninfo)
{
    PGconn *pg = PQconnectdb(conninfo);
    CHECK_MSG(PQstatus(pg) == CONNECTION_OK, "connect: %s", PQerrorMessage(pg));
    PQclear(t_exec(pg, "SET client_min_messages = warning"));
    return pg;
}

void t_cluster_install(PGconn *pg, const char *map, const char *self)
{
    const char *values[2] = {map, self};
    PGresult *r = PQexecParams(pg, "SELECT pgjobq.cluster_set($1::jsonb, $2)", 2, NULL, values, NULL, NULL, 0);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "cluster_set(%s): %s", self ? self : "NULL", PQerrorMessage(pg));
    PQclear(r);
}

long long t_acked_found(PGconn *pg, const int64_t *id, const int64_t *mark, int n)
{
    char *ids = malloc((size_t)n * 24 + 3), *marks = malloc((size_t)n * 24 + 3);
    size_t li = 0, lm = 0;
    CHECK(ids != NULL && marks != NULL);
    ids[li++] = '{';
    marks[lm++] = '{';
    for (int k = 0; k < n; k++) {
        li += (size_t)sprintf(ids + li, "%s%lld", k ? "," : "", (long long)id[k]);
        lm += (size_t)sprintf(marks + lm, "%s%lld", k ? "," : "", (long long)mark[k]);
    }
    strcpy(ids + li, "}");
    strcpy(marks + lm, "}");
    const char *params[2] = {ids, marks};
    PGresult *r = PQexecParams(pg,
                               "SELECT count(*) FROM unnest($1::bigint[], $2::bigint[]) u(id, mark)"
                               " JOIN pgjobq.all_jobs j ON j.id = u.id AND j.payload->>'mark' = u.mark::text",
                               2, NULL, params, NULL, NULL, 0);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "counting the acknowledged: %s", PQerrorMessage(pg));
    long long found = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    free(ids);
    free(marks);
    return found;
}

char *t_expect_error(PGconn *pg, const char *want, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    CHECK_MSG(PQresultStatus(r) == PGRES_FATAL_ERROR && state && strcmp(state, want) == 0,
              "%s: expected SQLSTATE %s, got %s: %s", sql, want, state ? state : "none", PQerrorMessage(pg));
    char *msg = strdup(PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY));
    PQclear(r);
    return msg;
}

/* ---- a second server ------------------------------------------------------------------------------ */

static char server2_dir[600], server2_data[700];

int t_server2_ctl(const char *a1, const char *a2, const char *a3)
{
    char pg_ctl[700], log[700];
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", t_bindir());
    snprintf(log, sizeof log, "%s/server.log", server2_dir);
    const char *argv[] = {pg_ctl, "-D", server2_data, "-l", log, "-w", "-t", "60", a1, a2, a3, NULL};
    int rc = harness_run_as_owner(argv, NULL);
    if (rc != 0 && strcmp(a1, "start") == 0)
        t_show_log(log);
    return rc;
}

static void server2_stop(void)
{
    t_server2_ctl("-m", "immediate", "stop");
}

void t_server2_start(char *ci, size_t size)
{
    char initdb[700], conf[800], cmd[900];
    const char *uid = getenv("PGJOBQ_TEST_OWNER_UID"), *gid = getenv("PGJOBQ_TEST_OWNER_GID");

    snprintf(server2_dir, sizeof server2_dir, "%s/server2", t_tmpdir());
    snprintf(server2_data, sizeof server2_data, "%s/data", server2_dir);
    CHECK(mkdir(server2_dir, 0755) == 0);
    if (geteuid() == 0 && uid && gid) {
        snprintf(cmd, sizeof cmd, "chown %s:%s '%s'", uid, gid, server2_dir);
        CHECK(system(cmd) == 0);
    }
    snprintf(initdb, sizeof initdb, "%s/initdb", t_bindir());
    const char *init_argv[] = {initdb, "-D", server2_data, "-A", "trust", "-U", "postgres", "--no-sync", NULL};
    CHECK_INT(harness_run_as_owner(init_argv, NULL), 0);
    t_defer(server2_stop);
    snprintf(conf, sizeof conf, "%s/postgresql.conf", server2_data);
    FILE *f = fopen(conf, "a");
    CHECK(f != NULL);
    fprintf(f, "listen_addresses = ''\nport = 5432\nunix_socket_directories = '%s'\nfsync = off\n", server2_dir);
    fclose(f);
    CHECK_INT(t_server2_ctl("start", NULL, NULL), 0);
    snprintf(ci, size, "host=%s port=5432 user=postgres dbname=postgres", server2_dir);
    pgjobq_client *c = NULL;
    int rc = pgjobq_client_open(&c, ci), applied = 0;
    CHECK_MSG(c != NULL && (rc == PGJOBQ_OK || rc == PGJOBQ_ESCHEMA), "open: %s", pgjobq_errmsg(c));
    CHECK_OK(c, pgjobq_migrate(c, &applied));
    pgjobq_client_close(c);
}

/* The state letter and parent of process p from /proc (0 when it does not exist). */
static char proc_state(pid_t p, int *parent)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    const char *close_paren = strrchr(buf, ')');
    char state = 0;
    if (close_paren == NULL || sscanf(close_paren + 1, " %c %d", &state, parent) != 2)
        return 0;
    return state;
}

/* The pids whose parent is ppid, at most max; returns how many. */
static int children_of(pid_t ppid, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0, parent;

    CHECK(d != NULL);
    while ((e = readdir(d)) != NULL && n < max) {
        char *end;
        long p = strtol(e->d_name, &end, 10);
        if (*end == '\0' && p > 1 && proc_state((pid_t)p, &parent) && parent == ppid)
            out[n++] = (pid_t)p;
    }
    closedir(d);
    return n;
}

void t_server2_crash(void)
{
    char path[800];
    snprintf(path, sizeof path, "%s/postmaster.pid", server2_data);
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "the second server is not running (%s)", path);
    int pm = 0;
    CHECK(fscanf(f, "%d", &pm) == 1 && pm > 1);
    fclose(f);
    pid_t kids[256];
    int n = children_of(pm, kids, 256);
    CHECK(kill(pm, SIGKILL) == 0);
    for (int i = 0; i < n; i++)
        kill(kids[i], SIGKILL); /* (one may have ended meanwhile) */
    /* Gone, every one: a new postmaster refuses shared memory that an old process still holds. */
    int64_t deadline = t_now_ms() + 30000;
    for (int i = -1; i < n; i++) {
        pid_t p = i < 0 ? pm : kids[i];
        int parent;
        char st;
        while ((st = proc_state(p, &parent)) != 0 && st != 'Z' && t_now_ms() < deadline) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        CHECK_MSG(st == 0 || st == 'Z', "process %d of the second server outlived SIGKILL", (int)p);
    }
    /* A dead postmaster that nobody has reaped yet (an init that does not reap, as in some containers)
     * still answers kill(pid, 0), which a new postmaster takes for a live one: its lock files go. */
    int parent;
    if (proc_state(pm, &parent) == 'Z') {
        char sock[800];
        snprintf(sock, sizeof sock, "%s/.s.PGSQL.5432.lock", server2_dir);
        CHECK(unlink(path) == 0 || errno == ENOENT);
        CHECK(unlink(sock) == 0 || errno == ENOENT); /* (its socket's lock file names it too) */
    }
}
