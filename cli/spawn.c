/*
 * spawn.c - starting a handler process (--exec and --coproc): its command split into words and
 * checked, the environment it gets, and the posix_spawn set-up, written once for both.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spawn.h"

extern char **environ;

/* Splits a command into words: blanks separate, '...' and "..." quote, \ escapes (outside '...'). */
char **spawn_split_words(const char *s, char *why, size_t why_size)
{
    size_t cap = strlen(s) + 1, n = 0, len = 0;
    char **argv = calloc(cap + 1, sizeof *argv);
    char *word = malloc(cap);
    int in_word = 0;

    if (argv == NULL || word == NULL) {
        free(argv);
        free(word);
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    for (const char *p = s;; p++) {
        if (*p == '\0' || *p == ' ' || *p == '\t' || *p == '\n') {
            if (in_word) {
                word[len] = '\0';
                argv[n++] = strdup(word);
                len = 0;
                in_word = 0;
            }
            if (*p == '\0')
                break;
            continue;
        }
        in_word = 1;
        if (*p == '\'' || *p == '"') {
            char quote = *p++;
            while (*p && *p != quote) {
                if (quote == '"' && *p == '\\' && p[1])
                    p++;
                word[len++] = *p++;
            }
            if (*p != quote) {
                snprintf(why, why_size, "unterminated %c quote", quote);
                goto fail;
            }
        } else if (*p == '\\' && p[1]) {
            word[len++] = *++p;
        } else {
            word[len++] = *p;
        }
    }
    free(word);
    if (n == 0) {
        snprintf(why, why_size, "the command is empty");
        free(argv);
        return NULL;
    }
    return argv;
fail:
    for (size_t i = 0; i < n; i++)
        free(argv[i]);
    free(argv);
    free(word);
    return NULL;
}

/* 1 when file names an executable regular file: as a path when it holds '/', else on $PATH, as
 * execvp() would look for it. */
int spawn_runnable(const char *file)
{
    struct stat st;
    char path[4096];

    if (strchr(file, '/'))
        return stat(file, &st) == 0 && S_ISREG(st.st_mode) && access(file, X_OK) == 0;
    const char *p = getenv("PATH");
    if (p == NULL || p[0] == '\0')
        p = "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        size_t len = strcspn(p, ":");
        snprintf(path, sizeof path, "%.*s/%s", (int)len, len ? p : ".", file);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0)
            return 1;
        p += len + (p[len] == ':');
    }
    return 0;
}

/* Whether a variable of the worker's environment stays out of a handler's by default: every variable
 * libpq reads (PGHOST, PGUSER, PGPASSWORD, PGPASSFILE, PGSERVICE, PGSSLKEY, PGSSL*, PGGSS*, PGOPTIONS,
 * ...: all begin with PG, and so do the ones a later libpq adds), every pgjobq setting
 * (PGJOBQ_DATABASE_URL, PGJOBQ_SERVE_TOKEN, ...) and DATABASE_URL.  A rule by prefix rather than a
 * list: a list misses the variable added next year.  --pass-env NAME and --keep-env let them through. */
static int withheld_from_handlers(const char *var)
{
    return strncmp(var, "PG", 2) == 0 || strncmp(var, "DATABASE_URL=", 13) == 0;
}

/* The variables pgjobq itself gives a handler (an exec handler's job, a coprocess's protocol): the
 * worker's own of those names never pass, so that the handler reads pgjobq's.  TRACEPARENT too: a job
 * without a trace context must not run in the worker's (a coprocess reads each job's from its message). */
static const char *const given_by_pgjobq[] = {
    "PGJOBQ_JOB_ID",      "PGJOBQ_QUEUE",   "PGJOBQ_KIND",      "PGJOBQ_ATTEMPT", "PGJOBQ_MAX_ATTEMPTS",
    "PGJOBQ_LEASE_TOKEN", "PGJOBQ_PARENTS", SPAWN_PROTOCOL_VAR, "TRACEPARENT",    NULL};

/* Whether var ("NAME=value") is named name. */
static int named(const char *var, const char *name)
{
    size_t n = strlen(name);
    return strncmp(var, name, n) == 0 && var[n] == '=';
}

int spawn_env_name_ok(const char *name)
{
    if (!((*name >= 'A' && *name <= 'Z') || (*name >= 'a' && *name <= 'z') || *name == '_'))
        return 0;
    for (const char *p = name + 1; *p; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return 0;
    return 1;
}

char **spawn_environment(int keep_all, const char *const *pass, size_t npass, const char *const *extra)
{
    size_t n = 0, k = 0, nextra = 0;
    char **env;

    while (environ[n])
        n++;
    while (extra && extra[nextra])
        nextra++;
    env = calloc(n + nextra + 1, sizeof *env);
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        int given = 0, passed = keep_all;
        for (int g = 0; given_by_pgjobq[g] && !given; g++)
            given = named(environ[i], given_by_pgjobq[g]);
        for (size_t p = 0; p < npass && !passed; p++)
            passed = named(environ[i], pass[p]);
        if (!given && (passed || !withheld_from_handlers(environ[i])))
            env[k++] = environ[i];
    }
    for (size_t i = 0; i < nextra; i++)
        env[k++] = (char *)extra[i];
    return env;
}

static void close_pair(int p[2])
{
    if (p[0] >= 0)
        close(p[0]);
    if (p[1] >= 0)
        close(p[1]);
}

/* The three pipes, close-on-exec, with our end of stdin non-blocking (a handler that does not read
 * its input must not stall the thread that writes it; the child's end stays blocking).  0, or -1
 * with errno set and nothing open. */
static int make_pipes(int in[2], int out[2], int err[2])
{
    in[0] = in[1] = out[0] = out[1] = err[0] = err[1] = -1;
    if (pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0 &&
        fcntl(in[1], F_SETFL, O_NONBLOCK) == 0)
        return 0;
    int saved = errno;
    close_pair(in);
    close_pair(out);
    close_pair(err);
    errno = saved;
    return -1;
}

/* posix_spawnp with the pipes as stdin, stdout and stderr, in a new process group, with a clean
 * signal state: 0 or the error. */
static int spawn_on(char *const argv[], char *const env[], pid_t *pid, int in, int out, int err)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, defaults;
    int rc;

    if ((rc = posix_spawn_file_actions_init(&fa)) != 0)
        return rc;
    if ((rc = posix_spawnattr_init(&attr)) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        return rc;
    }
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGINT);
    if ((rc = posix_spawn_file_actions_adddup2(&fa, in, 0)) == 0 &&
        (rc = posix_spawn_file_actions_adddup2(&fa, out, 1)) == 0 &&
        (rc = posix_spawn_file_actions_adddup2(&fa, err, 2)) == 0 &&
        (rc = posix_spawnattr_setsigmask(&attr, &none)) == 0 &&
        (rc = posix_spawnattr_setsigdefault(&attr, &defaults)) == 0 &&
        (rc = posix_spawnattr_setpgroup(&attr, 0)) == 0 && /* its own group: a timeout kills all of it */
        (rc = posix_spawnattr_setflags(&attr,
                                       POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)) == 0)
        rc = posix_spawnp(pid, argv[0], &fa, &attr, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    return rc;
}

int spawn_piped(char *const argv[], char *const env[], pid_t *pid, int fds[3])
{
    int in[2], out[2], err[2];

    if (make_pipes(in, out, err) != 0)
        return -1;
    int rc = spawn_on(argv, env, pid, in[0], out[1], err[1]);
    /* The child's ends are the child's now (or nobody's). */
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
        close(in[1]);
        close(out[0]);
        close(err[0]);
        return rc;
    }
    fds[0] = in[1];
    fds[1] = out[0];
    fds[2] = err[0];
    return 0;
}
