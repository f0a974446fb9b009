/*
 * harness.h - pgjobq's test harness.
 *
 * tests/runner.c starts a throwaway PostgreSQL cluster (initdb into a temporary directory, a Unix socket
 * in that directory, no TCP), migrates a template database, and runs every TEST in its own process
 * with a timeout and a fresh database cloned from the template.  A test passes when its function
 * returns; a failed CHECK prints where and why and ends the test's process with status 1.
 *
 * Inside a test:
 *   t_conninfo()   the conninfo of this test's own database
 *   t_client()     a new pgjobq_client on it (close it yourself, or let the process exit)
 *   t_pg()         a new raw libpq connection on it
 *   t_exec()       run SQL on a PGconn, failing the test on error
 *   t_wait_until() poll a condition with a deadline (never sleep to synchronise)
 *   t_cli()        run the pgjobq command and capture its output and exit status
 */
#ifndef PGJOBQ_HARNESS_H
#define PGJOBQ_HARNESS_H

#include <libpq-fe.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "pgjobq.h"

#define TEST_DB_EMPTY  1 /* the test's database starts without the pgjobq schema */
#define TEST_EXCLUSIVE 2 /* no other test runs meanwhile (the test stops or restarts the server) */

void harness_register(const char *name, void (*fn)(void), int timeout_s, int flags);

#define TEST_FULL(name, timeout_s, flags)                          \
    static void test_##name(void);                                 \
    __attribute__((constructor)) static void register_##name(void) \
    {                                                              \
        harness_register(#name, test_##name, timeout_s, flags);    \
    }                                                              \
    static void test_##name(void)

#define TEST(name) TEST_FULL(name, 60, 0)

__attribute__((noreturn, format(printf, 3, 4))) void t_fail(const char *file, int line, const char *fmt, ...);

#define CHECK(cond)                                         \
    do {                                                    \
        if (!(cond))                                        \
            t_fail(__FILE__, __LINE__, "CHECK(%s)", #cond); \
    } while (0)

#define CHECK_MSG(cond, ...)                         \
    do {                                             \
        if (!(cond))                                 \
            t_fail(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#define CHECK_INT(a, b)                                                                    \
    do {                                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                                \
        if (a_ != b_)                                                                      \
            t_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", #a, a_, #b, b_); \
    } while (0)

#define CHECK_STR(a, b)                                                                                              \
    do {                                                                                                             \
        const char *a_ = (a), *b_ = (b);                                                                             \
        if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)                                                         \
            t_fail(__FILE__, __LINE__, "%s == \"%s\", expected \"%s\"", #a, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); \
    } while (0)

/* Checks a pgjobq result code, printing the client's message when it differs. */
#define CHECK_RC(client, call, expected)                                                               \
    do {                                                                                               \
        int rc_ = (call);                                                                              \
        if (rc_ != (expected))                                                                         \
            t_fail(__FILE__, __LINE__, "%s returned %s (%s), expected %s", #call, pgjobq_errname(rc_), \
                   pgjobq_errmsg(client), pgjobq_errname(expected));                                   \
    } while (0)

#define CHECK_OK(client, call) CHECK_RC(client, call, PGJOBQ_OK)

const char *t_conninfo(void);
const char *t_dbname(void);
pgjobq_client *t_client(void);
PGconn *t_pg(void);

/* Creates another database in the test's cluster, named after the test's with "_" suffix, migrated
 * (a copy of the migrated template) or empty, and returns its conninfo (malloc'd): for tests that need
 * several databases (the shards of tests/test_cluster.c).  (Values with spaces or quotes in the test's
 * conninfo are not expected: the harness's are a socket directory, a port, a user and a name.) */
char *t_extra_db(const char *suffix, int migrated);
/* A raw libpq connection to conninfo (another database: t_extra_db's), with warnings only; fails the
 * test when it cannot connect. */
PGconn *t_connect(const char *conninfo);
/* Installs a cluster map with pgjobq.cluster_set(map, self) (self NULL: a router), failing the test
 * with the server's message when it is refused. */
void t_cluster_install(PGconn *pg, const char *map, const char *self);
/* How many of the n acknowledged jobs (id[k], with {"mark": mark[k]} in its payload) pg's pgjobq.all_jobs
 * holds, both arrays bound as parameters: a chaos check's "nothing acknowledged lost". */
long long t_acked_found(PGconn *pg, const int64_t *id, const int64_t *mark, int n);
/* Runs sql expecting an error of SQLSTATE want; returns its primary message (malloc'd). */
char *t_expect_error(PGconn *pg, const char *want, const char *sql);

/* Runs SQL (no parameters) and returns the result, failing the test on an error. */
PGresult *t_exec(PGconn *conn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Runs SQL and returns the first column of the first row as an integer (fails if no row). */
long long t_int(PGconn *conn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Runs SQL and returns the first column of the first row as a malloc'd string ("" for NULL). */
char *t_str(PGconn *conn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Polls cond(arg) every few milliseconds until it returns nonzero (returns 1) or timeout_ms passes
 * (returns 0). */
int t_wait_until(int (*cond)(void *), void *arg, int timeout_ms);

/* Milliseconds on a monotonic clock. */
int64_t t_now_ms(void);

/* Runs the pgjobq command (PGJOBQ_CLI) with the given arguments (NULL-terminated), feeding stdin_data
 * (may be NULL: /dev/null) and capturing stdout and stderr into malloc'd strings (either out pointer
 * may be NULL).  PGJOBQ_DATABASE_URL is set to this test's database.  Returns the exit status, or
 * 128 + signal.  Fails the test if the command cannot be run or does not end within 60 s. */
int t_cli(char **out, char **err, const char *stdin_data, size_t stdin_len, ...);

/* When zero, t_cli and t_spawn leave PGJOBQ_DATABASE_URL unset (to test the embedded default). */
extern int t_use_test_db;

/* Makes the pgjobq command use the embedded default in a fresh PGJOBQ_HOME (returned) under this
 * test's temporary directory, with no database URL set; the embedded server is stopped when the test
 * process ends. */
const char *t_use_embedded_home(void);

/* Registers fn to run when the test process ends, passed or failed (at most 8). */
void t_defer(void (*fn)(void));

/* Starts the pgjobq command in the background with the given arguments (NULL-terminated), stdout and
 * stderr appended to log_path, PGJOBQ_DATABASE_URL set to this test's database, and extra_env
 * ("NAME=value", may be NULL) added.  Returns its pid. */
pid_t t_spawn(const char *log_path, const char *extra_env, ...);
/* Waits up to timeout_ms for pid to exit; returns its exit status (128 + signal), or -1 on timeout. */
int t_wait_exit(pid_t pid, int timeout_ms);
/* A new temporary directory for this test (removed when the test process exits normally). */
const char *t_tmpdir(void);
/* The source tree ($PGJOBQ_SRCDIR, which make check sets; fails the test when it is not set). */
const char *t_srcdir(void);
/* The whole text of a file (malloc'd); fails the test when it cannot be read. */
char *t_read_file(const char *path);
/* Runs a shell command line, its standard output and error together into out (at most size - 1
 * bytes, NUL-terminated); returns its exit status, or 128 + signal. */
int t_shell(char *out, size_t size, const char *cmd);
/* dir/NAME.log in this test's temporary directory, for t_spawn (the last 8 paths stay valid). */
const char *t_log_path(const char *name);
/* Prints the last 30 lines of a log on stderr, to explain a failure. */
void t_show_log(const char *path);

/* Has auto_explain report on pg, as notices to collect, the plan of every statement, the statements
 * inside pgjobq's functions included; analyze: with run times and buffers. */
void t_auto_explain(PGconn *pg, PQnoticeProcessor collect, int analyze);
/* Writes an executable shell script at dir/name with the given body; returns its path (static). */
const char *t_script(const char *name, const char *body);

/* An audit trail of every change to a row of pgjobq.jobs (table public.job_audit: job_id, old_state,
 * new_state, old_token, new_token, old_lease_until, new_lease_until, at, query), written by a trigger
 * in the changing statement's transaction.  A finished job's move to the history is audited as
 * new_state 'moved'. */
void t_audit_install(PGconn *conn);
/* From the audit: jobs taken from their holder while its lease (as last extended) was still valid:
 * claimed again under another token, or put back by the rescue.  Must be 0. */
long long t_audit_claims_in_valid_lease(PGconn *conn);
/* From the audit: writes by a holder (complete, fail, heartbeat, hand-back) accepted at or after its
 * lease ended, rescues excepted.  Must be 0. */
long long t_audit_stale_writes(PGconn *conn);

/* The cluster's facts, for tests that act on the server itself (restart, stop). */
const char *t_pgdata(void);
const char *t_bindir(void);
/* Runs pg_ctl with the given arguments (NULL-terminated) as the cluster's owner; returns its status. */
int t_pg_ctl(const char *arg, ...);

/* A second PostgreSQL server of this test (a shard that a test stops or crashes while another runs):
 * t_server2_start initialises and starts it on a Unix socket of its own (fsync off), stopped when the
 * test ends, and writes its conninfo (database postgres, migrated) into ci; t_server2_ctl runs pg_ctl
 * on it ("start", or "-m", "immediate", "stop"), returning pg_ctl's status; t_server2_crash kills its
 * postmaster and every process of it with SIGKILL (a crash: no shutdown, recovery at the next start)
 * and waits until they are gone. */
void t_server2_start(char *ci, size_t size);
int t_server2_ctl(const char *a1, const char *a2, const char *a3);
void t_server2_crash(void);

/* Shared with runner.c: run a program as the cluster owner (root drops to that user). */
int harness_run_as_owner(const char *const argv[], const char *log_path);

#endif /* PGJOBQ_HARNESS_H */
