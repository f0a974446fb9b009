/*
 * cli.h - what the files of the pgjobq command share.  The command uses only include/pgjobq.h from the
 * library; it calls libpq directly only for what is not the queue's business: running the embedded
 * server (embedded.c), and reading what the library has no call for (the dashboard, the metrics, the
 * demo's summary, the benchmarks' measurements) through the pgjobq.monitor_* functions of
 * sql/functions/monitor.sql, never from the tables.
 */
#ifndef PGJOBQ_CLI_H
#define PGJOBQ_CLI_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sysexits.h>

#include "pgjobq.h"

/* One option of one command: the single definition behind parsing, --help and the man page test. */
typedef struct cli_opt {
    const char *name; /* long name without the dashes */
    int key;          /* short letter, or a value >= 256 for long-only options */
    const char *arg;  /* metavariable ("N", "URL"), or NULL for a flag */
    const char *help;
} cli_opt;

typedef struct cli_cmd {
    const char *name;
    const char *args;    /* what follows the options in the usage line */
    const char *summary;
    const cli_opt *opts; /* terminated by {NULL} */
    int (*run)(const struct cli_cmd *cmd, int argc, char **argv);
} cli_cmd;

/* Options every command accepts. */
#define OPT_DB 1000
#define OPT_HELP 'h'
#define CLI_COMMON_OPTS                                                                                    \
    {"db", OPT_DB, "URL", "database to use (else $PGJOBQ_DATABASE_URL, $DATABASE_URL, the embedded one)"},             \
        {"help", OPT_HELP, NULL, "show this help and exit"}

/* The cluster of shards to route over (docs/shards.md): the commands that take it list this option
 * and read it with cli_cluster_spec(); cli_parse sets cli_cluster_arg. */
#define OPT_CLUSTER 999 /* (below 1000, as OPT_DB: the commands number their own options from 1001) */
#define CLI_CLUSTER_OPT                                                                                 \
    {"cluster", OPT_CLUSTER, "SPEC",                                                                    \
     "a cluster of shards to route over: a shard's or the router's URL, or a JSON map file (else "      \
     "$PGJOBQ_CLUSTER; else --db's database alone)"}

/* config.c: what this run was told. */
extern const char *cli_db_url;       /* --db, when given */
extern const char *cli_cluster_arg;  /* --cluster, when given */
/* The cluster to route over: --cluster, else $PGJOBQ_CLUSTER; NULL: none (the database of --db). */
const char *cli_cluster_spec(void);
/* This program as hints should name it: argv[0] when it was run by a path (build/pgjobq), else
 * "pgjobq". */
extern const char *cli_self;
/* The configured database URL (--db, $PGJOBQ_DATABASE_URL, $DATABASE_URL), or NULL. */
const char *cli_database_url(void);
/* Where cli_database_url() found its value ("--db", "$PGJOBQ_DATABASE_URL", "$DATABASE_URL"), for
 * messages that must not quote the value itself. */
const char *cli_database_source(void);

/* usage.c: the command line.  Parses argv for cmd; calls on_opt(key, optarg) for each option that
 * is not a common one.  Returns the index of the first operand, or -1 after printing a usage error
 * (the caller exits EX_USAGE), or -2 when --help was printed (exit 0). */
int cli_parse(const cli_cmd *cmd, int argc, char **argv, int (*on_opt)(int key, const char *arg, void *ctx),
              void *ctx);
/* cmd's --help: its usage line, summary and options. */
void cli_usage(const cli_cmd *cmd, FILE *to);
/* Prints "pgjobq CMD: message" and a hint to run --help on stderr; returns EX_USAGE. */
int cli_usage_error(const cli_cmd *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* `pgjobq --help`: the global usage and a line for each of the n commands. */
void cli_main_usage(FILE *to, const cli_cmd *commands, size_t n);

/* msg.c: messages for a person.  Prints "pgjobq: message" on stderr, with passwords redacted
 * (cli_redact) and control characters escaped (tty_put). */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same with the prefix and suffix given: what cli_err and cli_usage_error share. */
void cli_vsay(const char *prefix, const char *fmt, va_list ap, const char *suffix);

/* msg with the configured database's password, $PGPASSWORD and anything shaped like a password
 * replaced by "***" (pgjobq_conninfo_redact): a malloc'd string, or NULL when out of memory. */
char *cli_redact(const char *msg);

/* connect.c: opening the configured database.  Opens a client on it; on failure prints why and
 * returns NULL with *status set to the exit status.  allow_unmigrated lets `migrate` through on an
 * empty database. */
pgjobq_client *cli_connect(int allow_unmigrated, int *status);

/* connect.c: a cluster of shards (cli_cluster_spec).  Opens it; on failure prints why and returns
 * NULL with *status set. */
pgjobq_cluster *cli_cluster_open(int *status);
/* The client of the shard that holds job id: with no cluster configured, cli_connect's; else the
 * id's shard's (pgjobq_cluster_route_job), or for an id from before the cluster the first shard that
 * has the job (any shard when none has it, for the command to say so).  On failure prints why and
 * returns NULL with *status set. */
pgjobq_client *cli_connect_for_id(int64_t id, int *status);
/* Closes a client cli_connect or cli_connect_for_id returned (a shard's client: its cluster). */
void cli_close(pgjobq_client *c);
/* The name of the shard whose client cli_connect_for_id returned; NULL without a cluster. */
const char *cli_shard_of(const pgjobq_client *c);
/* Prints the cluster's last error and returns the matching exit status. */
int cli_cluster_fail(pgjobq_cluster *cl, int code);
/* Prints "pgjobq: shard NAME: down (why)"; why may start with "shard NAME: " (a cluster's message). */
void cli_shard_down(const char *name, const char *why);

/* The sysexits.h status for a library result code. */
int cli_exit_status(int code);

/* Prints the client's last error and returns the matching exit status. */
int cli_fail(pgjobq_client *c, int code);

/* util.c: the monotonic clock, the command's one clock for intervals and deadlines, in milliseconds,
 * or in seconds to the nanosecond (benchmarks, the demo's timings). */
int64_t cli_mono_ms(void);
double cli_mono_s(void);

/* Parsers for option values; each returns 0, or -1 with a reason in why. */
int cli_parse_duration_ms(const char *s, int64_t *ms, char *why, size_t why_size);
int cli_parse_int(const char *s, long long min, long long max, long long *out, char *why, size_t why_size);

/* Text from the database or a job (an error text, a worker id, a pause reason, a query) for a
 * person: every control character (C0, DEL, C1), byte that is not UTF-8, line separator and
 * bidirectional override shown as an escape (\e \a \r \n \t ..., \xNN, \uNNNN), so that it cannot
 * move the cursor, retitle the window or fake a line.  The one way such text reaches a terminal or a
 * text log.  With keep_lines, newlines and tabs are printed as such (a message of several lines). */
void tty_put(FILE *f, const char *s, int keep_lines);
/* The same into buf, at most width characters (an escape counts as wide as it is printed) and size - 1
 * bytes, never cut inside a character or an escape; returns buf. */
const char *tty_cell(char *buf, size_t size, const char *s, size_t width);

/* Output helpers. */
void json_str(FILE *f, const char *s);            /* a JSON string literal, or null for NULL */
void json_time(FILE *f, int64_t us);              /* ISO 8601 UTC string, or null */
void format_time(char *buf, size_t size, int64_t us); /* "2026-11-30 09:30:00.123Z", or "-" */
/* A window as --rate and the duration options spell it ("1m", "90s", "1500ms"), into buf; returns buf.
 * `queue ls` and the dashboard's /queues both print a rate as N/ and this. */
const char *format_period(char *buf, size_t size, int64_t ms);

/* Reading JSON (json.c), from a document known to be valid (pgjobq_json_check, or jsonb's output). */
/* The top-level member `key` of the object obj: its raw text (a string with its quotes, an object
 * with its braces, a number, true, false, null) with *len set, or NULL when obj is not an object or
 * has no such member. */
const char *json_member(const char *obj, const char *key, size_t *len);
/* A string value as json_member returns it (quotes included), unescaped: malloc'd text (\u0000 as a
 * blank), or NULL when it is not a string or out of memory. */
char *json_unquote(const char *v, size_t len);
/* A value as json_member returns it as an integer; *ok is 0 when it is NULL, not an integer or out of
 * int64_t's range (then 0 is returned: never a clamped value). */
int64_t json_integer(const char *v, size_t len, int *ok);

/* Progress on stderr: a bar redrawn in place on a terminal, a line every few seconds otherwise. */
typedef struct progress {
    const char *label;
    int64_t total;
    int quiet;
    int tty;
    int64_t started_ms;
    int64_t last_ms;
} progress;

void progress_init(progress *p, const char *label, int64_t total, int quiet);
void progress_update(progress *p, int64_t done, const char *extra);
void progress_done(progress *p, int64_t done, const char *extra);

/* embedded.c: the embedded PostgreSQL's conninfo, creating, starting and migrating it as needed; NULL with
 * *status set (after printing why) when that fails. */
const char *cli_embedded_conninfo(int *status);

/* connect.c: the database to use: --db, $PGJOBQ_DATABASE_URL, $DATABASE_URL, else the embedded
 * one.  NULL with *status set after printing why; a URL libpq cannot parse is EX_CONFIG. */
const char *cli_resolve_db(int *status);

/* Commands. */
int cmd_migrate(const cli_cmd *cmd, int argc, char **argv);
int cmd_enqueue(const cli_cmd *cmd, int argc, char **argv);
int cmd_list(const cli_cmd *cmd, int argc, char **argv);
int cmd_show(const cli_cmd *cmd, int argc, char **argv);
int cmd_wait(const cli_cmd *cmd, int argc, char **argv);
/* cmd_durable.c */
int cmd_step(const cli_cmd *cmd, int argc, char **argv);
int cmd_send_event(const cli_cmd *cmd, int argc, char **argv);
extern const cli_opt step_opts[], send_event_opts[];
int cmd_graph(const cli_cmd *cmd, int argc, char **argv);
int cmd_stats(const cli_cmd *cmd, int argc, char **argv);
int cmd_health(const cli_cmd *cmd, int argc, char **argv);
int cmd_cancel(const cli_cmd *cmd, int argc, char **argv);
int cmd_retry(const cli_cmd *cmd, int argc, char **argv);
int cmd_skip(const cli_cmd *cmd, int argc, char **argv);
int cmd_queue(const cli_cmd *cmd, int argc, char **argv);
int cmd_schedule(const cli_cmd *cmd, int argc, char **argv);
int cmd_work(const cli_cmd *cmd, int argc, char **argv);
int cmd_db(const cli_cmd *cmd, int argc, char **argv);
int cmd_demo(const cli_cmd *cmd, int argc, char **argv);
int cmd_bench(const cli_cmd *cmd, int argc, char **argv);
int cmd_serve(const cli_cmd *cmd, int argc, char **argv);
int cmd_cluster(const cli_cmd *cmd, int argc, char **argv);

extern const cli_opt migrate_opts[], enqueue_opts[], list_opts[], show_opts[], wait_opts[], graph_opts[], stats_opts[], health_opts[], cancel_opts[],
    retry_opts[], skip_opts[], queue_opts[], schedule_opts[], work_opts[], db_opts[], demo_opts[], bench_opts[], serve_opts[],
    cluster_opts[];

#endif /* PGJOBQ_CLI_H */
