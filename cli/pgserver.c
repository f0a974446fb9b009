/*
 * pgserver.c - finding and running PostgreSQL's server programs.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pgserver.h"

static int has(const char *dir, const char *name)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, X_OK) == 0;
}

static int usable(const char *dir)
{
    return has(dir, "initdb") && has(dir, "postgres") && has(dir, "pg_ctl");
}

int pgserver_bindir(char *out, size_t size, char *why, size_t why_size)
{
    const char *env = getenv("PGJOBQ_PG_BINDIR");
    char line[4096] = "";
    FILE *f;
    DIR *d;
    int best = -1;

    if (env && env[0]) {
        if (usable(env)) {
            snprintf(out, size, "%s", env);
            return 0;
        }
        snprintf(why, why_size, "PGJOBQ_PG_BINDIR=%s holds no initdb, postgres and pg_ctl", env);
        return -1;
    }
    f = popen("pg_config --bindir 2>/dev/null", "r");
    if (f) {
        if (fgets(line, sizeof line, f))
            line[strcspn(line, "\n")] = '\0';
        pclose(f);
        if (line[0] && usable(line)) {
            snprintf(out, size, "%s", line);
            return 0;
        }
    }
    out[0] = '\0';
    d = opendir("/usr/lib/postgresql");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            char b[4096];
            int v = atoi(e->d_name);
            snprintf(b, sizeof b, "/usr/lib/postgresql/%s/bin", e->d_name);
            if (v > best && usable(b)) {
                best = v;
                snprintf(out, size, "%s", b);
            }
        }
        closedir(d);
    }
    if (out[0])
        return 0;
    if (usable("/usr/bin")) {
        snprintf(out, size, "/usr/bin");
        return 0;
    }
    snprintf(why, why_size,
             "the PostgreSQL server programs (initdb, pg_ctl, postgres) are not installed: install the "
             "'postgresql' package (Debian/Ubuntu: sudo apt-get install postgresql), or set PGJOBQ_PG_BINDIR, "
             "or give a database with --db URL");
    return -1;
}

int pgserver_owner(uid_t *uid, gid_t *gid)
{
    struct passwd *pw;

    if (geteuid() != 0) {
        *uid = geteuid();
        *gid = getegid();
        return 0;
    }
    pw = getpwnam("postgres");
    if (pw == NULL)
        pw = getpwnam("nobody");
    if (pw == NULL)
        return -1;
    *uid = pw->pw_uid;
    *gid = pw->pw_gid;
    return 0;
}

void pgserver_redirect(const char *log_path)
{
    /* O_NOFOLLOW: a symbolic link planted where a log goes is not written through. */
    int fd = open(log_path ? log_path : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
        dup2(fd, 0);
        close(fd);
    }
}

int pgserver_run(const char *const argv[], const char *log_path, uid_t uid, gid_t gid)
{
    int status;
    pid_t pid = fork();

    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* The account first, then the log: the log is opened with the account's rights, not root's. */
        if (geteuid() == 0 && uid != 0) {
            if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
                fprintf(stderr, "cannot switch to uid %d: %s\n", (int)uid, strerror(errno));
                _exit(126);
            }
        }
        pgserver_redirect(log_path);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
