/*
 * spawn.h - how `pgjobq work` starts a handler process, for --exec (one per job) and --coproc (one per
 * copy) alike: its command as words, the worker's environment without its credentials, and the
 * process on three pipes in a process group of its own.
 */
#ifndef PGJOBQ_CLI_SPAWN_H
#define PGJOBQ_CLI_SPAWN_H

#include <stddef.h>
#include <sys/types.h>

/* The command of --exec or --coproc split into words: blanks separate, '...' and "..." quote, \
 * escapes (outside '...').  A malloc'd NULL-terminated array of malloc'd words, or NULL with why set
 * (an unterminated quote, no word at all, out of memory). */
char **spawn_split_words(const char *s, char *why, size_t why_size);

/* 1 when file names an executable regular file: as a path when it holds '/', else on $PATH, as
 * posix_spawnp looks for it; else 0. */
int spawn_runnable(const char *file);

/* The variable that tells a coprocess which version of the protocol the worker speaks
 * (docs/coproc.md): 2 adds the "ready" line and the "snooze" status to the original (1); 3 the step
 * requests (steps, sleeps, waits for events: docs/durable.md). */
#define SPAWN_PROTOCOL_VAR "PGJOBQ_COPROC_PROTOCOL"

/* The environment a handler gets: the worker's, without (unless keep_all) every variable that could
 * reach its database or hold a secret (each beginning with PG, and DATABASE_URL) except the npass
 * names in pass, and without the worker's own variables of the names pgjobq gives a handler
 * (PGJOBQ_JOB_ID ..., PGJOBQ_COPROC_PROTOCOL); then the NULL-terminated extra ("NAME=value", may be
 * NULL).  A malloc'd array of pointers into environ and extra (which must outlive it), NULL
 * terminated, that the caller frees (not the strings).  NULL when out of memory. */
char **spawn_environment(int keep_all, const char *const *pass, size_t npass, const char *const *extra);

/* 1 when name can name an environment variable for --pass-env (a letter or _, then letters, digits
 * or _), else 0. */
int spawn_env_name_ok(const char *name);

/* Starts argv[0] (looked up on PATH when it holds no '/') with argv and environment env, in its own
 * process group (so that a signal to -pid reaches all it starts), with every signal unblocked and
 * SIGPIPE, SIGTERM and SIGINT at their defaults, and its stdin, stdout and stderr on pipes.  Returns
 * 0 with *pid set and the ends that are ours in fds: fds[0] writes its stdin (non-blocking), fds[1]
 * reads its stdout, fds[2] its stderr; every one is close-on-exec.  Returns -1 when the pipes could
 * not be set up (errno says why), or the posix_spawn error (> 0) when the program could not be run;
 * then nothing is left open. */
int spawn_piped(char *const argv[], char *const env[], pid_t *pid, int fds[3]);

#endif /* PGJOBQ_CLI_SPAWN_H */
