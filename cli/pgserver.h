/*
 * pgserver.h - finding and running PostgreSQL's server programs (initdb, pg_ctl, postgres, psql).
 * Shared by the pgjobq command's embedded cluster and the test harness.
 */
#ifndef PGJOBQ_PGSERVER_H
#define PGJOBQ_PGSERVER_H

#include <stddef.h>
#include <sys/types.h>

/* Finds the directory holding initdb and postgres: $PGJOBQ_PG_BINDIR, `pg_config --bindir`, the newest
 * /usr/lib/postgresql/N/bin, or /usr/bin.  Returns 0, or -1 with a message naming what to install. */
int pgserver_bindir(char *out, size_t size, char *why, size_t why_size);

/* The account the server must run as: the caller itself, or (as root, since initdb and postgres refuse
 * root) the 'postgres' user, else 'nobody'.  Returns 0, or -1 when root has no such account. */
int pgserver_owner(uid_t *uid, gid_t *gid);

/* In a child process about to exec: stdin from /dev/null, stdout and stderr appended to log_path
 * (NULL: /dev/null; a symbolic link there is not followed: the output is then not redirected). */
void pgserver_redirect(const char *log_path);

/* Runs argv (argv[0] a path) as uid/gid (when the caller is root and they differ from it), with
 * stdin from /dev/null and stdout and stderr appended to log_path (NULL: /dev/null), which is opened
 * as uid, without following a symbolic link.  Waits for it
 * and returns its exit status, 128 + signal, or -1 when it could not be started. */
int pgserver_run(const char *const argv[], const char *log_path, uid_t uid, gid_t gid);

#endif /* PGJOBQ_PGSERVER_H */
