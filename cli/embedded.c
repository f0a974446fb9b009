/*
 * embedded.c - the private PostgreSQL cluster every pgjobq command uses when no database is
 * configured, and `pgjobq db start|stop|status|url|psql` to manage it.
 *
 * It lives in $PGJOBQ_HOME (default $XDG_DATA_HOME/pgjobq, i.e. ~/.local/share/pgjobq; as root
 * /var/lib/pgjobq, because the server runs as the 'postgres' user, which cannot enter /root).  It is
 * created with initdb on first use, started on demand with pg_ctl, listens on a Unix socket in that
 * directory and nowhere else, and is migrated automatically.  All pgjobq processes of the user share
 * it.  A lock file serialises creating and starting it, so that two first runs at once neither
 * corrupt nor double-start it.
 */
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "pgserver.h"

typedef struct embedded {
    char home[1024];
    char data[1100];
    char log[1100];
    char bindir[1024];
    char conninfo[1200];
    uid_t uid;
    gid_t gid;
} embedded;

/* Socket paths are limited to 107 bytes: "<home>/.s.PGSQL.5432". */
#define SOCKET_PATH_MAX 107

static int locate(embedded *e, char *why, size_t why_size)
{
    const char *home = getenv("PGJOBQ_HOME"), *xdg = getenv("XDG_DATA_HOME"), *user_home = getenv("HOME");

    if (home && home[0])
        snprintf(e->home, sizeof e->home, "%s", home);
    else if (geteuid() == 0)
        snprintf(e->home, sizeof e->home, "/var/lib/pgjobq");
    else if (xdg && xdg[0])
        snprintf(e->home, sizeof e->home, "%s/pgjobq", xdg);
    else if (user_home && user_home[0])
        snprintf(e->home, sizeof e->home, "%s/.local/share/pgjobq", user_home);
    else {
        snprintf(why, why_size, "cannot tell where to keep the embedded database: set PGJOBQ_HOME or HOME");
        return -1;
    }
    if (e->home[0] != '/') {
        char cwd[512], tmp[1600];
        if (getcwd(cwd, sizeof cwd) == NULL) {
            snprintf(why, why_size, "getcwd: %s", strerror(errno));
            return -1;
        }
        snprintf(tmp, sizeof tmp, "%s/%s", cwd, e->home);
        if (strlen(tmp) >= sizeof e->home) {
            snprintf(why, why_size, "PGJOBQ_HOME is too long");
            return -1;
        }
        memcpy(e->home, tmp, strlen(tmp) + 1);
    }
    if (strlen(e->home) + strlen("/.s.PGSQL.5432") > SOCKET_PATH_MAX) {
        snprintf(why, why_size, "PGJOBQ_HOME %s is too long for a Unix socket path: set a shorter PGJOBQ_HOME",
                 e->home);
        return -1;
    }
    snprintf(e->data, sizeof e->data, "%s/data", e->home);
    snprintf(e->log, sizeof e->log, "%s/server.log", e->home);
    snprintf(e->conninfo, sizeof e->conninfo, "host=%s port=5432 user=pgjobq dbname=pgjobq connect_timeout=10",
             e->home);
    if (pgserver_owner(&e->uid, &e->gid) != 0) {
        snprintf(why, why_size, "running as root, but there is no 'postgres' (or 'nobody') user to run PostgreSQL as");
        return -1;
    }
    return 0;
}

/* mkdir -p for the parents of path, and path itself with mode 0700, owned by the server's account. */
static int make_home(const embedded *e, char *why, size_t why_size)
{
    char p[1024];
    snprintf(p, sizeof p, "%s", e->home);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            snprintf(why, why_size, "cannot create %s: %s", p, strerror(errno));
            return -1;
        }
        *s = '/';
    }
    if (mkdir(p, 0700) != 0 && errno != EEXIST) {
        snprintf(why, why_size, "cannot create %s: %s", p, strerror(errno));
        return -1;
    }
    if (geteuid() == 0 && chown(p, e->uid, e->gid) != 0) {
        snprintf(why, why_size, "cannot give %s to the server's account: %s", p, strerror(errno));
        return -1;
    }
    return 0;
}

/* As root, the server runs as another account, which must be able to enter every directory on the
 * way to PGJOBQ_HOME (under /root, mode 0700, it cannot).  0 when it can; -1 with why set when not. */
static int account_can_enter(const embedded *e, char *why, size_t why_size)
{
    char p[1024];
    int status;
    pid_t pid;

    if (geteuid() != 0 || e->uid == 0)
        return 0;
    if ((pid = fork()) < 0) {
        snprintf(why, why_size, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(e->gid) != 0 || setuid(e->uid) != 0)
            _exit(2);
        _exit(access(e->home, R_OK | W_OK | X_OK) == 0 ? 0 : 1);
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            snprintf(why, why_size, "waitpid: %s", strerror(errno));
            return -1;
        }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    /* Name the first directory on the way that the account cannot enter. */
    snprintf(p, sizeof p, "%s", e->home);
    const char *blocked = e->home;
    for (char *s = p + 1; *s; s++) {
        struct stat st;
        if (*s != '/')
            continue;
        *s = '\0';
        if (stat(p, &st) == 0 && (st.st_mode & S_IXOTH) == 0 && st.st_uid != e->uid) {
            blocked = p;
            break;
        }
        *s = '/';
    }
    const struct passwd *pw = getpwuid(e->uid);
    snprintf(why, why_size,
             "PostgreSQL runs as the user '%s' here (not as root), and that user cannot enter %s: set PGJOBQ_HOME "
             "to a directory it can reach (as root the default is /var/lib/pgjobq)",
             pw ? pw->pw_name : "postgres", blocked);
    return -1;
}

static int lock_home(const embedded *e)
{
    char path[1100];
    int fd;
    snprintf(path, sizeof path, "%s/lock", e->home);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            close(fd);
            return -1;
        }
    return fd;
}

static int running(const embedded *e)
{
    return PQping(e->conninfo) == PQPING_OK;
}

static int exists(const embedded *e)
{
    char path[1200];
    struct stat st;
    snprintf(path, sizeof path, "%s/PG_VERSION", e->data);
    return stat(path, &st) == 0;
}

static void show_log_tail(const char *path)
{
    FILE *f = fopen(path, "r");
    char lines[20][512];
    int n = 0;
    if (f == NULL)
        return;
    while (fgets(lines[n % 20], sizeof lines[0], f))
        n++;
    fclose(f);
    for (int i = n > 20 ? n - 20 : 0; i < n; i++)
        fprintf(stderr, "    %s", lines[i % 20]);
}

static int create_cluster(embedded *e, char *why, size_t why_size)
{
    char initdb[1100], conf[1200], initlog[1100];
    FILE *f;

    snprintf(initdb, sizeof initdb, "%s/initdb", e->bindir);
    snprintf(initlog, sizeof initlog, "%s/initdb.log", e->home);
    const char *argv[] = {initdb, "-D", e->data, "-A", "trust", "-U", "pgjobq", "-E", "UTF8", "--locale=C.UTF-8", NULL};
    if (pgserver_run(argv, initlog, e->uid, e->gid) != 0) {
        /* C.UTF-8 is not everywhere: fall back to the C locale. */
        const char *argv_c[] = {initdb, "-D", e->data, "-A", "trust", "-U", "pgjobq", "-E", "UTF8", "--locale=C", NULL};
        char rm[1200];
        snprintf(rm, sizeof rm, "rm -rf '%s'", e->data);
        if (system(rm) != 0 || pgserver_run(argv_c, initlog, e->uid, e->gid) != 0) {
            show_log_tail(initlog);
            snprintf(why, why_size, "initdb failed (its output is in %s)", initlog);
            return -1;
        }
    }
    /* Only the Unix socket in PGJOBQ_HOME; trust is safe because the directory is private (0700). */
    snprintf(conf, sizeof conf, "%s/postgresql.conf", e->data);
    f = fopen(conf, "a");
    if (f == NULL) {
        snprintf(why, why_size, "cannot configure %s: %s", conf, strerror(errno));
        return -1;
    }
    fprintf(f,
            "\n# pgjobq's embedded database: a private socket, no TCP.\n"
            "listen_addresses = ''\n"
            "unix_socket_directories = '%s'\n"
            "unix_socket_permissions = 0700\n"
            "port = 5432\n"
            "max_connections = 200\n"
            "shared_buffers = 128MB\n"
            "# A development database: a crash may lose the last few hundred milliseconds of commits,\n"
            "# never consistency.  Point pgjobq at your own server (--db) for anything you keep.\n"
            "synchronous_commit = off\n",
            e->home);
    fclose(f);
    return 0;
}

static int start_cluster(embedded *e, char *why, size_t why_size)
{
    char pg_ctl[1100];
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", e->bindir);
    const char *argv[] = {pg_ctl, "-D", e->data, "-l", e->log, "-w", "-t", "60", "start", NULL};
    if (pgserver_run(argv, NULL, e->uid, e->gid) != 0) {
        show_log_tail(e->log);
        snprintf(why, why_size, "the embedded PostgreSQL did not start (its log is %s)", e->log);
        return -1;
    }
    return 0;
}

/* Creates the database and the schema when they are missing. */
static int prepare_database(embedded *e, char *why, size_t why_size)
{
    char ci[1300];
    PGconn *c;
    pgjobq_client *cl = NULL;
    int rc;

    snprintf(ci, sizeof ci, "host=%s port=5432 user=pgjobq dbname=postgres", e->home);
    c = PQconnectdb(ci);
    if (PQstatus(c) != CONNECTION_OK) {
        snprintf(why, why_size, "cannot connect to the embedded PostgreSQL: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    PGresult *r = PQexec(c, "SELECT 1 FROM pg_database WHERE datname = 'pgjobq'");
    int have = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    PQclear(r);
    if (!have) {
        r = PQexec(c, "CREATE DATABASE pgjobq");
        if (PQresultStatus(r) != PGRES_COMMAND_OK && strcmp(PQresultErrorField(r, PG_DIAG_SQLSTATE) ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "", "42P04") != 0) {
            snprintf(why, why_size, "CREATE DATABASE pgjobq: %s", PQerrorMessage(c));
            PQclear(r);
            PQfinish(c);
            return -1;
        }
        PQclear(r);
    }
    PQfinish(c);
    rc = pgjobq_client_open(&cl, e->conninfo);
    if (rc == PGJOBQ_ESCHEMA || rc == PGJOBQ_OK)
        rc = pgjobq_migrate(cl, NULL);
    if (rc != PGJOBQ_OK) {
        snprintf(why, why_size, "preparing the embedded database: %s", pgjobq_errmsg(cl));
        pgjobq_client_close(cl);
        return -1;
    }
    pgjobq_client_close(cl);
    return 0;
}

/* Makes sure the embedded cluster exists, runs and is migrated; fills conninfo.  Returns 0, or an
 * exit status after printing why. */
static int ensure(embedded *e, int announce)
{
    char why[8192];
    int fd, created = 0, started = 0;

    if (locate(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CONFIG;
    }
    if (running(e) && exists(e))
        return 0;
    if (pgserver_bindir(e->bindir, sizeof e->bindir, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_UNAVAILABLE;
    }
    if (make_home(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CANTCREAT;
    }
    if (account_can_enter(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CONFIG;
    }
    fd = lock_home(e);
    if (fd < 0) {
        cli_err("cannot lock %s/lock: %s", e->home, strerror(errno));
        return EX_CANTCREAT;
    }
    /* Another process may have done the work while we waited for the lock. */
    if (!exists(e)) {
        if (create_cluster(e, why, sizeof why) != 0) {
            cli_err("%s", why);
            close(fd);
            return EX_UNAVAILABLE;
        }
        created = 1;
    }
    if (!running(e)) {
        if (start_cluster(e, why, sizeof why) != 0) {
            cli_err("%s", why);
            close(fd);
            return EX_UNAVAILABLE;
        }
        started = 1;
    }
    if ((created || started) && prepare_database(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        close(fd);
        return EX_UNAVAILABLE;
    }
    close(fd);
    if (announce && (created || started))
        fprintf(stderr, "pgjobq: %s the embedded PostgreSQL in %s (socket only; `pgjobq db stop` stops it)\n",
                created ? "created and started" : "started", e->home);
    return 0;
}

const char *cli_embedded_conninfo(int *status)
{
    static embedded e;
    *status = ensure(&e, 1);
    return *status == 0 ? e.conninfo : NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* pgjobq db                                                                                         */

const cli_opt db_opts[] = {{"help", 'h', NULL, "show this help and exit"}, {NULL, 0, NULL, NULL}};

int cmd_db(const cli_cmd *cmd, int argc, char **argv)
{
    static const char *const actions[] = {"start", "stop", "status", "url", "psql", NULL};
    embedded e;
    char why[8192];
    int first = 1, status, known = 0;

    /* Not cli_parse: everything after `psql` belongs to psql (pgjobq db psql -Atc 'SELECT 1'). */
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        cli_usage(cmd, stdout);
        return EX_OK;
    }
    if (first >= argc)
        return cli_usage_error(cmd, "expected start, stop, status, url or psql");
    const char *action = argv[first];
    for (int i = 0; actions[i]; i++)
        known |= strcmp(action, actions[i]) == 0;
    if (!known)
        return cli_usage_error(cmd, "unknown action '%s' (start, stop, status, url, psql)", action);
    if (strcmp(action, "psql") != 0 && argc - first > 1)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[first + 1]);
    if (locate(&e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CONFIG;
    }
    if (strcmp(action, "status") == 0) {
        int up = running(&e);
        printf("embedded PostgreSQL in %s: %s\n", e.home,
               up ? "running" : exists(&e) ? "stopped" : "not created yet (any pgjobq command creates it)");
        return up ? EX_OK : 3; /* like pg_ctl status: 3 when not running */
    }
    if (strcmp(action, "stop") == 0) {
        if (!exists(&e) || !running(&e)) {
            printf("embedded PostgreSQL in %s is not running\n", e.home);
            return EX_OK;
        }
        if (pgserver_bindir(e.bindir, sizeof e.bindir, why, sizeof why) != 0) {
            cli_err("%s", why);
            return EX_UNAVAILABLE;
        }
        char pg_ctl[1100];
        snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", e.bindir);
        const char *args[] = {pg_ctl, "-D", e.data, "-m", "fast", "-w", "-t", "60", "stop", NULL};
        int fd = lock_home(&e);
        int rc = pgserver_run(args, NULL, e.uid, e.gid);
        if (fd >= 0)
            close(fd);
        if (rc != 0) {
            cli_err("pg_ctl stop failed (status %d); the log is %s", rc, e.log);
            return EX_SOFTWARE;
        }
        printf("embedded PostgreSQL in %s stopped\n", e.home);
        return EX_OK;
    }
    if (strcmp(action, "start") == 0 || strcmp(action, "url") == 0 || strcmp(action, "psql") == 0) {
        if ((status = ensure(&e, strcmp(action, "start") == 0)) != 0)
            return status;
        if (strcmp(action, "start") == 0) {
            printf("embedded PostgreSQL in %s is running\n", e.home);
            return EX_OK;
        }
        if (strcmp(action, "url") == 0) {
            /* A URL other programs can use: the socket directory goes in the host parameter. */
            printf("postgresql://pgjobq@/pgjobq?host=");
            for (const char *p = e.home; *p; p++) {
                if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                    strchr("-._~", *p))
                    putchar(*p);
                else
                    printf("%%%02X", (unsigned char)*p);
            }
            printf("\n");
            return EX_OK;
        }
        /* psql [ARGS...] on the embedded database. */
        char psql[1100], bindir[1024];
        if (pgserver_bindir(bindir, sizeof bindir, why, sizeof why) != 0) {
            cli_err("%s", why);
            return EX_UNAVAILABLE;
        }
        snprintf(psql, sizeof psql, "%s/psql", bindir);
        if (access(psql, X_OK) != 0)
            snprintf(psql, sizeof psql, "psql");
        char **args = calloc((size_t)(argc - first) + 3, sizeof *args);
        if (args == NULL)
            return EX_OSERR;
        int n = 0;
        args[n++] = psql;
        args[n++] = e.conninfo;
        for (int i = first + 1; i < argc; i++)
            args[n++] = argv[i];
        execvp(psql, args);
        cli_err("cannot run psql: %s (install the postgresql-client package)", strerror(errno));
        free(args);
        return EX_UNAVAILABLE;
    }
    return EX_SOFTWARE; /* not reached: every known action returned above */
}
