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
 *
 * The home is trusted only when nobody else could have put anything in it: it must belong to the
 * account the server runs as (the user, or 'postgres' as root) with mode 0700, and every directory
 * above it up to a root-owned one must be unchangeable by other users (or sticky, like /tmp).  The
 * files in it are opened without following symbolic links, and a server that answers on its socket
 * is used only when it runs as that account on this home's data directory (docs/deploy.md's threat
 * model).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <libpq-fe.h>
#include <limits.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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
    char conninfo[2600]; /* the pgjobq database, through the socket, from the server's account only */
    char check[2600];    /* the same for the database postgres (which exists before pgjobq does) */
    char account[256];   /* the server's account's name ("" when it has none) */
    uid_t uid;
    gid_t gid;
} embedded;

/* Socket paths are limited to 107 bytes: "<home>/.s.PGSQL.5432". */
#define SOCKET_PATH_MAX 107

/* Appends " key='value'" to out (size bytes), quoted as libpq's conninfo wants it: a home may hold
 * spaces and quotes.  0, or -1 when it does not fit. */
static int conninfo_add(char *out, size_t size, const char *key, const char *value)
{
    size_t n = strlen(out);
    int k = snprintf(out + n, size - n, "%s%s='", n ? " " : "", key);
    if (k < 0 || (size_t)k >= size - n)
        return -1;
    n += (size_t)k;
    for (const char *p = value; *p; p++) {
        if (n + 3 >= size)
            return -1;
        if (*p == '\\' || *p == '\'')
            out[n++] = '\\';
        out[n++] = *p;
    }
    if (n + 2 > size)
        return -1;
    out[n++] = '\'';
    out[n] = '\0';
    return 0;
}

/* The paths and the connection strings from e->home: -1 with why set when they do not fit. */
static int set_paths(embedded *e, char *why, size_t why_size)
{
    if (strlen(e->home) + strlen("/.s.PGSQL.5432") > SOCKET_PATH_MAX) {
        snprintf(why, why_size, "PGJOBQ_HOME %s is too long for a Unix socket path: set a shorter PGJOBQ_HOME",
                 e->home);
        return -1;
    }
    snprintf(e->data, sizeof e->data, "%s/data", e->home);
    snprintf(e->log, sizeof e->log, "%s/server.log", e->home);
    for (int i = 0; i < 2; i++) {
        char *ci = i == 0 ? e->conninfo : e->check;
        size_t size = i == 0 ? sizeof e->conninfo : sizeof e->check;
        ci[0] = '\0';
        /* requirepeer: libpq refuses a server on the socket that runs as another account. */
        if (conninfo_add(ci, size, "host", e->home) != 0 || conninfo_add(ci, size, "port", "5432") != 0 ||
            conninfo_add(ci, size, "user", "pgjobq") != 0 ||
            conninfo_add(ci, size, "dbname", i == 0 ? "pgjobq" : "postgres") != 0 ||
            conninfo_add(ci, size, "connect_timeout", "10") != 0 ||
            (e->account[0] && conninfo_add(ci, size, "requirepeer", e->account) != 0)) {
            snprintf(why, why_size, "PGJOBQ_HOME is too long");
            return -1;
        }
    }
    return 0;
}

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
    for (const char *p = e->home; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            snprintf(why, why_size, "PGJOBQ_HOME holds a control character: choose a plain directory name");
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
    if (pgserver_owner(&e->uid, &e->gid) != 0) {
        snprintf(why, why_size, "running as root, but there is no 'postgres' (or 'nobody') user to run PostgreSQL as");
        return -1;
    }
    const struct passwd *pw = getpwuid(e->uid);
    snprintf(e->account, sizeof e->account, "%s", pw && pw->pw_name ? pw->pw_name : "");
    return set_paths(e, why, why_size);
}

/* The name of a user, for messages. */
static const char *user_name(uid_t uid, char *buf, size_t size)
{
    const struct passwd *pw = getpwuid(uid);
    if (pw && pw->pw_name)
        snprintf(buf, size, "%s", pw->pw_name);
    else
        snprintf(buf, size, "uid %d", (int)uid);
    return buf;
}

/* mkdir -p for the parents of path, and path itself with mode 0700, owned by the server's account
 * when this made it (check_home judges a home that was there). */
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
    if (mkdir(p, 0700) != 0) {
        if (errno == EEXIST)
            return 0;
        snprintf(why, why_size, "cannot create %s: %s", p, strerror(errno));
        return -1;
    }
    if (geteuid() == 0 && chown(p, e->uid, e->gid) != 0) {
        snprintf(why, why_size, "cannot give %s to the server's account: %s", p, strerror(errno));
        return -1;
    }
    return 0;
}

/* The home as it really is (no symbolic link on the way), so that what check_home judges is what the
 * socket, the data directory and the files are reached through. */
static int resolve_home(embedded *e, char *why, size_t why_size)
{
    char real[PATH_MAX];
    if (realpath(e->home, real) == NULL) {
        snprintf(why, why_size, "PGJOBQ_HOME %s: %s", e->home, strerror(errno));
        return -1;
    }
    if (strlen(real) >= sizeof e->home) {
        snprintf(why, why_size, "PGJOBQ_HOME %s is too long", real);
        return -1;
    }
    memcpy(e->home, real, strlen(real) + 1);
    return set_paths(e, why, why_size);
}

/* dir (a real path) and every directory above it, up to one that root owns and nobody else may
 * change, can be changed only by root, the user or the server's account (or are sticky, like /tmp):
 * nobody else could replace what is below them.  0, or -1 with why set. */
static int check_dirs_from(const embedded *e, const char *dir, char *why, size_t why_size)
{
    char p[1024];
    struct stat st;

    snprintf(p, sizeof p, "%s", dir);
    for (;;) {
        if (stat(p, &st) != 0) {
            snprintf(why, why_size, "%s: %s", p, strerror(errno));
            return -1;
        }
        int others_write = (st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0;
        int mine = st.st_uid == 0 || st.st_uid == geteuid() || st.st_uid == e->uid;
        if (!mine || others_write) {
            char what[128], owner[64];
            if (!mine)
                snprintf(what, sizeof what, "belongs to %s", user_name(st.st_uid, owner, sizeof owner));
            else
                snprintf(what, sizeof what, "is writable by other users (mode %04o)", (unsigned)(st.st_mode & 07777));
            snprintf(why, why_size,
                     "%s, above PGJOBQ_HOME %s, %s: whoever can change it could replace the home. Choose a "
                     "home under directories only you and root can change (unset PGJOBQ_HOME for the default)%s%s%s",
                     p, e->home, what, mine ? ", or chmod go-w '" : "", mine ? p : "", mine ? "'" : "");
            return -1;
        }
        char *slash = strrchr(p, '/');
        if (st.st_uid == 0 || slash == NULL || strcmp(p, "/") == 0)
            return 0; /* root's, and unchangeable by others: nothing above can replace it */
        slash[slash == p ? 1 : 0] = '\0';
    }
}

/* Before anything is made: the deepest directory on the way to the home that exists already, and
 * those above it, are safe to make the rest in. */
static int check_before_making(const embedded *e, char *why, size_t why_size)
{
    char p[1024], real[PATH_MAX];
    struct stat st;

    snprintf(p, sizeof p, "%s", e->home);
    while (stat(p, &st) != 0) {
        char *slash = strrchr(p, '/');
        if (slash == NULL || slash == p) {
            snprintf(p, sizeof p, "/");
            break;
        }
        *slash = '\0';
    }
    if (strcmp(p, e->home) == 0)
        return 0; /* there already: check_home judges it */
    if (realpath(p, real) == NULL) {
        snprintf(why, why_size, "%s: %s", p, strerror(errno));
        return -1;
    }
    return check_dirs_from(e, real, why, why_size);
}

/* The home is trusted: a directory of the server's account, mode 0700, under directories nobody but
 * root, the user or that account can change (or sticky ones, like /tmp), with no symbolic link
 * where pgjobq keeps its files.  As root, a home root made is given to the server's account.  0, or
 * -1 with why saying what is wrong and how to fix it. */
static int check_home(embedded *e, char *why, size_t why_size)
{
    char name[64], p[1100];
    struct stat st;

    if (lstat(e->home, &st) != 0) {
        snprintf(why, why_size, "PGJOBQ_HOME %s: %s", e->home, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, why_size, "PGJOBQ_HOME %s is not a directory", e->home);
        return -1;
    }
    if ((st.st_mode & 077) != 0) {
        snprintf(why, why_size,
                 "PGJOBQ_HOME %s is open to other users (mode %04o, not 0700): the database, its socket and "
                 "its logs live there, and whoever can write there could plant a server of their own. Make it "
                 "private (chmod 700 '%s'), or choose another PGJOBQ_HOME",
                 e->home, (unsigned)(st.st_mode & 07777), e->home);
        return -1;
    }
    if (st.st_uid == 0 && e->uid != 0 && geteuid() == 0) {
        if (chown(e->home, e->uid, e->gid) != 0) {
            snprintf(why, why_size, "cannot give %s to the server's account: %s", e->home, strerror(errno));
            return -1;
        }
        st.st_uid = e->uid;
    }
    if (st.st_uid != e->uid) {
        char want[64];
        user_name(e->uid, want, sizeof want);
        if (geteuid() == 0)
            snprintf(why, why_size,
                     "PGJOBQ_HOME %s belongs to %s, not to %s, the user PostgreSQL runs as when pgjobq runs as "
                     "root: a home someone else controls could serve you their database. Give it to %s (chown %s "
                     "'%s'), or choose another PGJOBQ_HOME",
                     e->home, user_name(st.st_uid, name, sizeof name), want, want, want, e->home);
        else
            snprintf(why, why_size,
                     "PGJOBQ_HOME %s belongs to %s, not to you (%s): a home someone else controls could serve "
                     "you their database. Choose a directory of your own, or unset PGJOBQ_HOME for the default",
                     e->home, user_name(st.st_uid, name, sizeof name), want);
        return -1;
    }
    /* The directories above it. */
    snprintf(p, sizeof p, "%s", e->home);
    *strrchr(p, '/') = '\0';
    if (check_dirs_from(e, p[0] ? p : "/", why, why_size) != 0)
        return -1;
    /* pgjobq's own entries: never a symbolic link (the opens below do not follow one either). */
    static const char *const entries[] = {"lock", "initdb.log", "server.log", "data", NULL};
    for (int i = 0; entries[i]; i++) {
        snprintf(p, sizeof p, "%s/%s", e->home, entries[i]);
        if (lstat(p, &st) == 0 && S_ISLNK(st.st_mode)) {
            snprintf(why, why_size,
                     "%s is a symbolic link, which pgjobq never makes: refusing to follow it (remove it if you "
                     "know where it came from)",
                     p);
            return -1;
        }
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

/* Opens (creating it) and takes the lock that serialises creating and starting the cluster; -1 with
 * errno set when it cannot (ELOOP: a symbolic link, never followed). */
static int lock_home(const embedded *e)
{
    char path[1100];
    struct stat st;
    int fd;
    snprintf(path, sizeof path, "%s/lock", e->home);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            close(fd);
            return -1;
        }
    return fd;
}

/* The server on the home's socket: 0 when none answers, 1 when it is this home's (run by the server's
 * account, requirepeer in the connection string, on this home's data directory), -1 with why set when
 * another one answers there.  Also gives the pgjobq role, when it has none, the search_path public:
 * an application's unqualified CREATE TABLE must not land in pgjobq's schema (the role's name makes
 * the default "$user", public find it first). */
static int server_state(const embedded *e, char *why, size_t why_size)
{
    PGconn *c = PQconnectdb(e->check);
    PGresult *r;
    int state = -1;

    if (PQstatus(c) != CONNECTION_OK) {
        /* Nobody there, or a server that is not ours: a ping without requirepeer tells them apart. */
        char plain[2600];
        snprintf(plain, sizeof plain, "%s", e->check);
        char *peer = strstr(plain, " requirepeer=");
        if (peer)
            *peer = '\0';
        if (PQping(plain) != PQPING_OK) {
            PQfinish(c);
            return 0;
        }
        snprintf(why, why_size, "a server answers on %s/.s.PGSQL.5432 that is not this home's: %s", e->home,
                 PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    r = PQexec(c, "SELECT current_setting('data_directory'),"
                  " NOT EXISTS (SELECT 1 FROM pg_db_role_setting s"
                  "              WHERE s.setrole = (SELECT oid FROM pg_roles WHERE rolname = current_user)"
                  "                AND s.setdatabase = 0"
                  "                AND EXISTS (SELECT 1 FROM unnest(s.setconfig) c WHERE c LIKE 'search_path=%'))");
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        snprintf(why, why_size, "the server on %s/.s.PGSQL.5432 does not say where its data is: %s", e->home,
                 PQerrorMessage(c));
    } else {
        char have[PATH_MAX], want[PATH_MAX];
        const char *dir = PQgetvalue(r, 0, 0);
        int same = strcmp(dir, e->data) == 0 ||
                   (realpath(dir, have) != NULL && realpath(e->data, want) != NULL && strcmp(have, want) == 0);
        if (!same)
            snprintf(why, why_size,
                     "the server on %s/.s.PGSQL.5432 serves the data directory %s, not this home's %s: refusing "
                     "to use it (stop that server, or choose another PGJOBQ_HOME)",
                     e->home, dir, e->data);
        else {
            /* A failure here is another command setting it at the same moment (tuple concurrently
             * updated): the setting is there either way. */
            if (strcmp(PQgetvalue(r, 0, 1), "t") == 0)
                PQclear(PQexec(c, "ALTER ROLE CURRENT_USER SET search_path = public"));
            state = 1;
        }
    }
    PQclear(r);
    PQfinish(c);
    return state;
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
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    char lines[20][512];
    int n = 0;
    if (f == NULL) {
        if (fd >= 0)
            close(fd);
        return;
    }
    while (fgets(lines[n % 20], sizeof lines[0], f))
        n++;
    fclose(f);
    for (int i = n > 20 ? n - 20 : 0; i < n; i++)
        fprintf(stderr, "    %s", lines[i % 20]);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -rf without a shell: symbolic links removed, never followed.  0, or -1 with errno set. */
static int remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Appends to postgresql.conf (made by initdb just now) without following a symbolic link. */
static int configure(const embedded *e, char *why, size_t why_size)
{
    char conf[1200], dir[2100];
    size_t n = 0;
    int fd;
    FILE *f;

    /* A quoted value of the configuration file: ' doubled, \ escaped. */
    for (const char *p = e->home; *p && n + 2 < sizeof dir; p++) {
        if (*p == '\'' || *p == '\\')
            dir[n++] = *p;
        dir[n++] = *p;
    }
    dir[n] = '\0';
    snprintf(conf, sizeof conf, "%s/postgresql.conf", e->data);
    fd = open(conf, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 || (f = fdopen(fd, "a")) == NULL) {
        snprintf(why, why_size, "cannot configure %s: %s", conf, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    /* Only the Unix socket in PGJOBQ_HOME; trust is safe because the directory is private (0700). */
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
            dir);
    if (fclose(f) != 0) {
        snprintf(why, why_size, "cannot configure %s: %s", conf, strerror(errno));
        return -1;
    }
    return 0;
}

static int create_cluster(embedded *e, char *why, size_t why_size)
{
    char initdb[1100], initlog[1100];

    snprintf(initdb, sizeof initdb, "%s/initdb", e->bindir);
    snprintf(initlog, sizeof initlog, "%s/initdb.log", e->home);
    const char *argv[] = {initdb, "-D", e->data, "-A", "trust", "-U", "pgjobq", "-E", "UTF8", "--locale=C.UTF-8", NULL};
    if (pgserver_run(argv, initlog, e->uid, e->gid) != 0) {
        /* C.UTF-8 is not everywhere: fall back to the C locale, in an empty data directory. */
        const char *argv_c[] = {initdb, "-D", e->data, "-A", "trust", "-U", "pgjobq", "-E", "UTF8", "--locale=C", NULL};
        if (remove_tree(e->data) != 0) {
            snprintf(why, why_size, "initdb failed, and %s cannot be removed to try again: %s", e->data,
                     strerror(errno));
            return -1;
        }
        if (pgserver_run(argv_c, initlog, e->uid, e->gid) != 0) {
            show_log_tail(initlog);
            snprintf(why, why_size, "initdb failed (its output is in %s)", initlog);
            return -1;
        }
    }
    return configure(e, why, why_size);
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
    PGconn *c;
    pgjobq_client *cl = NULL;
    int rc;

    c = PQconnectdb(e->check);
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
        if (PQresultStatus(r) != PGRES_COMMAND_OK &&
            strcmp(PQresultErrorField(r, PG_DIAG_SQLSTATE) ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "", "42P04") !=
                0) {
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

/* The home found (made when missing, as it really is) and trusted: 0, or an exit status after
 * printing why.  With make 0, a home that does not exist is 0 with *missing set. */
static int open_home(embedded *e, int make, int *missing)
{
    char why[8192];
    struct stat st;

    *missing = 0;
    if (locate(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CONFIG;
    }
    if (!make && stat(e->home, &st) != 0 && errno == ENOENT) {
        *missing = 1;
        return 0;
    }
    if (make && check_before_making(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CONFIG;
    }
    if (make && make_home(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CANTCREAT;
    }
    if (resolve_home(e, why, sizeof why) != 0 || check_home(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CONFIG;
    }
    return 0;
}

/* Makes sure the embedded cluster exists, runs and is migrated; fills conninfo.  Returns 0, or an
 * exit status after printing why. */
static int ensure(embedded *e, int announce)
{
    char why[8192];
    int fd, created = 0, started = 0, missing, state;

    if ((state = open_home(e, 1, &missing)) != 0)
        return state;
    if ((state = server_state(e, why, sizeof why)) < 0) {
        cli_err("%s", why);
        return EX_CONFIG;
    }
    if (state == 1 && exists(e))
        return 0;
    if (pgserver_bindir(e->bindir, sizeof e->bindir, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_UNAVAILABLE;
    }
    if (account_can_enter(e, why, sizeof why) != 0) {
        cli_err("%s", why);
        return EX_CONFIG;
    }
    fd = lock_home(e);
    if (fd < 0) {
        cli_err("cannot lock %s/lock: %s", e->home,
                errno == ELOOP || errno == EINVAL ? "it is not a plain file (a symbolic link is never followed)"
                                                  : strerror(errno));
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
    if ((state = server_state(e, why, sizeof why)) == 0) {
        if (start_cluster(e, why, sizeof why) != 0) {
            cli_err("%s", why);
            close(fd);
            return EX_UNAVAILABLE;
        }
        started = 1;
    }
    if (state < 0 || ((created || started) && prepare_database(e, why, sizeof why) != 0)) {
        cli_err("%s", why);
        close(fd);
        return state < 0 ? EX_CONFIG : EX_UNAVAILABLE;
    }
    /* What was started is checked as a found one is (and its role gets its search_path). */
    if (started && (state = server_state(e, why, sizeof why)) != 1) {
        cli_err("%s", state < 0 ? why : "the embedded PostgreSQL stopped answering after it started");
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
    if (strcmp(action, "status") == 0 || strcmp(action, "stop") == 0) {
        int missing, state = 0;
        if ((status = open_home(&e, 0, &missing)) != 0)
            return status;
        if (!missing && (state = server_state(&e, why, sizeof why)) < 0) {
            cli_err("%s", why);
            return EX_CONFIG;
        }
        if (strcmp(action, "status") == 0) {
            printf("embedded PostgreSQL in %s: %s\n", e.home,
                   state == 1               ? "running"
                   : !missing && exists(&e) ? "stopped"
                                            : "not created yet (any pgjobq command creates it)");
            return state == 1 ? EX_OK : 3; /* like pg_ctl status: 3 when not running */
        }
        if (state == 0 || !exists(&e)) {
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
