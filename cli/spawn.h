/*
 * spawn.h - how `pgjobq work` starts a handler process, for --exec (one per job) and --coproc (one per
 * copy) alike: the worker's environment without its credentials, and the process on three pipes in
 * a process group of its own.
 */
#ifndef PGJOBQ_CLI_SPAWN_H
#define PGJOBQ_CLI_SPAWN_H

#include <sys/types.h>

/* The worker's environment minus every variable that could reach its database or hold a secret
 * (each beginning with PG, and DATABASE_URL): a malloc'd array of pointers into environ, NULL
 * terminated, that the caller frees (not the strings).  NULL when out of memory. */
char **spawn_environment(void);

/* Starts argv[0] (looked up on PATH when it holds no '/') with argv and environment env, in its own
 * process group (so that a signal to -pid reaches all it starts), with every signal unblocked and
 * SIGPIPE, SIGTERM and SIGINT at their defaults, and its stdin, stdout and stderr on pipes.  Returns
 * 0 with *pid set and the ends that are ours in fds: fds[0] writes its stdin (non-blocking), fds[1]
 * reads its stdout, fds[2] its stderr; every one is close-on-exec.  Returns -1 when the pipes could
 * not be set up (errno says why), or the posix_spawn error (> 0) when the program could not be run;
 * then nothing is left open. */
int spawn_piped(char *const argv[], char *const env[], pid_t *pid, int fds[3]);

#endif /* PGJOBQ_CLI_SPAWN_H */
