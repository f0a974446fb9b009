/*
 * main.c - the pgjobq command: global options, the command table, option parsing and the shared
 * connection and exit-status rules.
 */
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char *cli_db_url;
const char *cli_self = "pgjobq";

static const cli_cmd commands[] = {
    {"migrate", "", "Create or upgrade the pgjobq schema (safe to run again, and from many hosts at once).",
     migrate_opts, cmd_migrate},
    {"enqueue", "[PAYLOAD]",
     "Add a job whose payload is the JSON document PAYLOAD ({} when omitted) and print its id;\n"
     "with --file, add one job per line of a JSON-lines file, all or none; with --graph, the jobs of a\n"
     "JSON graph (jobs that wait for others), all or none.",
     enqueue_opts, cmd_enqueue},
    {"list", "", "List jobs, newest first.", list_opts, cmd_list},
    {"show", "ID", "Show every field of one job, its parents (with their results) and its children.", show_opts,
     cmd_show},
    {"graph", "ID", "Print the workflow a job belongs to: every job connected to it, by depth, with its parents.",
     graph_opts, cmd_graph},
    {"stats", "", "Count jobs per queue and state.", stats_opts, cmd_stats},
    {"health", "",
     "Show pgjobq.jobs' size and dead rows, and what holds vacuum back (the oldest open snapshot: a\n"
     "pg_dump, a report, a session idle in a transaction, a replication slot), with its age.",
     health_opts, cmd_health},
    {"cancel", "ID | --queue QUEUE --state STATE",
     "Cancel a job, or every job a filter matches: queued jobs at once, running ones at their worker's next "
     "heartbeat.",
     cancel_opts, cmd_cancel},
    {"retry", "ID | --queue QUEUE --state STATE",
     "Run a finished or scheduled job, or every job a filter matches, again now.", retry_opts, cmd_retry},
    {"queue", "ls|pause|resume|drain|set [QUEUE]",
     "Show queues and their settings, pause and resume a queue on every worker, wait until a paused\n"
     "queue has nothing running (drain), set a queue's concurrency and rate limits.",
     queue_opts, cmd_queue},
    {"cron", "add|ls|rm|enable|disable|trigger|sync [NAME|FILE]",
     "Cron schedules in the database: every worker ticks them, and each fire time enqueues its job once.\n"
     "sync FILE makes the schedules exactly those of FILE (one JSON object per line).",
     schedule_opts, cmd_schedule},
    {"work", "",
     "Run jobs: claim them, run --exec CMD once per job, record the outcome; stop cleanly on SIGTERM.",
     work_opts, cmd_work},
    {"serve", "",
     "Serve Prometheus metrics (/metrics) and a web dashboard (/) over HTTP; read-only unless\n"
     "--allow-actions.",
     serve_opts, cmd_serve},
    {"demo", "",
     "Enqueue many jobs and run them with an in-process worker pool, live, then summarise.", demo_opts,
     cmd_demo},
    {"bench", "SCENARIO",
     "Measure: enqueue, drain, drain-exec, drain-coproc, latency, mixed, steady or soak (see bench/README.md).", bench_opts,
     cmd_bench},
    {"db", "start|stop|status|url|psql [PSQL ARGS]",
     "Manage the embedded PostgreSQL that pgjobq uses when no database is configured.", db_opts, cmd_db},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

/* Every message for a person goes through here: the database's password, and anything shaped like
 * one, redacted (libpq's errors quote the URL they could not parse, and arguments are echoed), and
 * control characters escaped (a database error can quote a job's data).  libpq's messages can span
 * lines: newlines and tabs are kept. */
static void say(const char *prefix, const char *fmt, va_list ap, const char *suffix)
{
    char *msg = NULL, *safe = NULL;

    if (vasprintf(&msg, fmt, ap) >= 0)
        safe = cli_redact(msg);
    fputs(prefix, stderr);
    tty_put(stderr, safe ? safe : "(message lost: out of memory)", 1);
    fputs(suffix, stderr);
    free(msg);
    free(safe);
}

void cli_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say("pgjobq: ", fmt, ap, "\n");
    va_end(ap);
}

/* Writes text to f, reflowed at 100 columns (its own line breaks count as spaces); lines after the
 * first start with indent spaces (the first is assumed to start there already). */
static void print_wrapped(FILE *f, const char *text, int indent)
{
    const int width = 100;
    int col = indent;

    while (*text == ' ' || *text == '\n')
        text++;
    while (*text) {
        size_t word = strcspn(text, " \n");
        if (col > indent && col + 1 + (int)word > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(text, 1, word, f);
        col += (int)word;
        text += word;
        while (*text == ' ' || *text == '\n')
            text++;
    }
    fputc('\n', f);
}

/* `man pgjobq` once installed; from a source tree, the page itself. */
static const char *man_hint(void)
{
    FILE *f = fopen("docs/pgjobq.1", "r");
    if (f) {
        fclose(f);
        return "`man -l docs/pgjobq.1` (`man pgjobq` once installed)";
    }
    return "`man pgjobq`";
}

static void main_usage(FILE *to)
{
    fprintf(to, "usage: %s [--db URL] COMMAND [OPTIONS] [ARGS]\n"
                "       %s COMMAND --help | help [COMMAND] | --help | --version\n\n"
                "A job queue that lives in PostgreSQL.\n\nCommands:\n",
            cli_self, cli_self);
    for (size_t i = 0; i < NCOMMANDS; i++) {
        fprintf(to, "  %-10s ", commands[i].name);
        print_wrapped(to, commands[i].summary, 13);
    }
    fprintf(to, "\nThe database is --db URL, else $PGJOBQ_DATABASE_URL, else $DATABASE_URL, else an\n"
                "embedded PostgreSQL in $PGJOBQ_HOME, created and started on first use.\n"
                "Run `%s COMMAND --help` for a command's options;\n%s for everything.\n",
            cli_self, man_hint());
}

void cli_usage(const cli_cmd *cmd, FILE *to)
{
    fprintf(to, "usage: pgjobq %s [OPTIONS]%s%s\n\n%s\n\nOptions:\n", cmd->name, cmd->args[0] ? " " : "", cmd->args,
            cmd->summary);
    for (const cli_opt *o = cmd->opts; o->name; o++) {
        char left[64];
        if (o->key < 256 && o->key != OPT_HELP)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->key, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        /* A long option name gets a line of its own; the help is wrapped under its column. */
        if (strlen(left) > 26)
            fprintf(to, "  %s\n%29s", left, "");
        else
            fprintf(to, "  %-26s ", left);
        print_wrapped(to, o->help, 29);
    }
}

int cli_usage_error(const cli_cmd *cmd, const char *fmt, ...)
{
    char prefix[64], suffix[96];
    va_list ap;

    snprintf(prefix, sizeof prefix, "pgjobq %s: ", cmd->name);
    snprintf(suffix, sizeof suffix, "\nTry 'pgjobq %s --help'.\n", cmd->name);
    va_start(ap, fmt);
    say(prefix, fmt, ap, suffix);
    va_end(ap);
    return EX_USAGE;
}

int cli_parse(const cli_cmd *cmd, int argc, char **argv, int (*on_opt)(int key, const char *arg, void *ctx), void *ctx)
{
    struct option longopts[64];
    char shortopts[128];
    size_t n = 0, s = 0;
    int key;

    /* Options may follow operands (GNU style; `--` ends them); ':' reports a missing value as ':'. */
    shortopts[s++] = ':';
    for (const cli_opt *o = cmd->opts; o->name && n < 63; o++, n++) {
        longopts[n].name = o->name;
        longopts[n].has_arg = o->arg ? required_argument : no_argument;
        longopts[n].flag = NULL;
        longopts[n].val = o->key;
        if (o->key < 256 && s < sizeof shortopts - 3) {
            shortopts[s++] = (char)o->key;
            if (o->arg)
                shortopts[s++] = ':';
        }
    }
    memset(&longopts[n], 0, sizeof longopts[n]);
    shortopts[s] = '\0';

    opterr = 0;
    optind = 1;
    while ((key = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (key == '?') {
            if (optopt && optopt < 256)
                cli_usage_error(cmd, "unknown option '-%c'", optopt);
            else
                cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
            return -1;
        }
        if (key == ':') {
            cli_usage_error(cmd, "option '%s' needs a value", argv[optind - 1]);
            return -1;
        }
        if (key == OPT_HELP) {
            cli_usage(cmd, stdout);
            return -2;
        }
        if (key == OPT_DB) {
            cli_db_url = optarg;
            continue;
        }
        if (on_opt && on_opt(key, optarg, ctx) != 0)
            return -1;
    }
    return optind;
}

int cli_exit_status(int code)
{
    switch (code) {
    case PGJOBQ_OK: return EX_OK;
    case PGJOBQ_EINVAL:
    case PGJOBQ_ENOTFOUND:
    case PGJOBQ_ESTATE:
    case PGJOBQ_EDUPLICATE: return EX_DATAERR;
    case PGJOBQ_ECONN: return EX_UNAVAILABLE;
    case PGJOBQ_ESCHEMA: return EX_CONFIG;
    case PGJOBQ_EPERM: return EX_NOPERM;
    case PGJOBQ_ECONFLICT:
    case PGJOBQ_ETIMEOUT: return EX_TEMPFAIL;
    default: return EX_SOFTWARE;
    }
}

int cli_fail(pgjobq_client *c, int code)
{
    const char *msg = pgjobq_errmsg(c);
    cli_err("%s", msg && msg[0] ? msg : pgjobq_strerror(code));
    return cli_exit_status(code);
}

/* Which database: --db, then $PGJOBQ_DATABASE_URL, then $DATABASE_URL. */
const char *cli_database_url(void)
{
    const char *v;
    if (cli_db_url)
        return cli_db_url;
    if ((v = getenv("PGJOBQ_DATABASE_URL")) != NULL && v[0])
        return v;
    if ((v = getenv("DATABASE_URL")) != NULL && v[0])
        return v;
    return NULL;
}

/* Where cli_database_url() found its value, for messages. */
static const char *db_source(void)
{
    const char *v;
    if (cli_db_url)
        return "--db";
    if ((v = getenv("PGJOBQ_DATABASE_URL")) != NULL && v[0])
        return "$PGJOBQ_DATABASE_URL";
    return "$DATABASE_URL";
}

/* 0 when url reads as a PostgreSQL URL (postgresql:// or postgres://) or a conninfo (key=value
 * pairs); -1 with why set otherwise.  The value itself is never quoted: it may hold a password. */
static int db_url_check(const char *url, char *why, size_t why_size)
{
    const char *scheme_end = strstr(url, "://");
    size_t key = strspn(url, " \t");

    if (url[key] == '\0') {
        snprintf(why, why_size, "it is empty");
        return -1;
    }
    if (strncmp(url, "postgresql://", 13) == 0 || strncmp(url, "postgres://", 11) == 0)
        return 0;
    const char *eq = strchr(url, '=');
    if (scheme_end != NULL && (eq == NULL || eq > scheme_end)) {
        snprintf(why, why_size, "it is a %.*s:// URL, not postgresql://",
                 (int)(scheme_end - url < 20 ? scheme_end - url : 20), url);
        return -1;
    }
    /* conninfo: the first word is key=value with a known-looking key. */
    size_t klen = strspn(url + key, "abcdefghijklmnopqrstuvwxyz_");
    if (klen > 0 && url[key + klen + strspn(url + key + klen, " \t")] == '=')
        return 0;
    snprintf(why, why_size, "it is neither a postgresql:// URL nor a conninfo (host=... dbname=...)");
    return -1;
}

char *cli_redact(const char *msg)
{
    const char *url = cli_database_url();
    size_t n = pgjobq_conninfo_redact(NULL, 0, msg, url);
    char *safe = malloc(n + 1);

    if (safe)
        pgjobq_conninfo_redact(safe, n + 1, msg, url);
    return safe;
}

/* A URL libpq cannot parse is a configuration error, said before anything connects (a worker would
 * retry it forever) and without its password. */
/* A URL that is not PostgreSQL's, or that libpq cannot parse, is a configuration error, said before
 * anything connects (a worker would retry it forever), naming where it came from but not its value
 * (it may hold a password). */
const char *cli_resolve_db(int *status)
{
    const char *url = cli_database_url();
    char why[512];
    int rc;

    *status = EX_OK;
    if (url == NULL)
        return cli_embedded_conninfo(status);
    if (db_url_check(url, why, sizeof why) != 0) {
        cli_err("the database URL (%s) is not usable: %s", db_source(), why);
        *status = EX_CONFIG;
        return NULL;
    }
    if ((rc = pgjobq_conninfo_check(url, why, sizeof why)) != PGJOBQ_OK) {
        cli_err("the database URL (%s) is not valid: %s", db_source(), why);
        *status = rc == PGJOBQ_ENOMEM ? EX_OSERR : EX_CONFIG;
        return NULL;
    }
    return url;
}

pgjobq_client *cli_connect(int allow_unmigrated, int *status)
{
    const char *url = cli_resolve_db(status);
    pgjobq_client *c = NULL;
    int rc;

    if (url == NULL)
        return NULL;
    rc = pgjobq_client_open(&c, url);
    if (rc == PGJOBQ_OK || (allow_unmigrated && rc == PGJOBQ_ESCHEMA && c != NULL)) {
        *status = EX_OK;
        return c;
    }
    *status = cli_fail(c, rc);
    if (rc == PGJOBQ_ECONN && cli_database_url() != NULL)
        cli_err("(the database URL came from %s)", db_source());
    pgjobq_client_close(c);
    return NULL;
}

int main(int argc, char **argv)
{
    int i = 1;

    /* How to name this program in hints: as it was run when that was a path (build/pgjobq), so that
     * the hints work from where the user stands. */
    if (argc > 0 && argv[0] && strchr(argv[0], '/') != NULL)
        cli_self = argv[0];
    /* Global options before the command. */
    while (i < argc && argv[i][0] == '-') {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            main_usage(stdout);
            return EX_OK;
        }
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            printf("pgjobq %s (library %s, schema version %d)\n", PGJOBQ_VERSION, pgjobq_version(),
                   PGJOBQ_SCHEMA_VERSION);
            return EX_OK;
        }
        if (strcmp(argv[i], "--db") == 0 && i + 1 < argc) {
            cli_db_url = argv[i + 1];
            i += 2;
            continue;
        }
        if (strncmp(argv[i], "--db=", 5) == 0) {
            cli_db_url = argv[i] + 5;
            i++;
            continue;
        }
        cli_err("unknown option '%s'\nTry 'pgjobq --help'.", argv[i]);
        return EX_USAGE;
    }
    if (i >= argc) {
        main_usage(stderr);
        return EX_USAGE;
    }
    /* `pgjobq help` and `pgjobq help COMMAND`, as --help. */
    if (strcmp(argv[i], "help") == 0) {
        if (i + 1 >= argc) {
            main_usage(stdout);
            return EX_OK;
        }
        for (size_t k = 0; k < NCOMMANDS; k++)
            if (strcmp(argv[i + 1], commands[k].name) == 0) {
                cli_usage(&commands[k], stdout);
                return EX_OK;
            }
        fprintf(stderr, "pgjobq: unknown command '%s'\nTry '%s --help'.\n", argv[i + 1], cli_self);
        return EX_USAGE;
    }
    for (size_t k = 0; k < NCOMMANDS; k++)
        if (strcmp(argv[i], commands[k].name) == 0)
            return commands[k].run(&commands[k], argc - i, argv + i);
    cli_err("unknown command '%s'\nTry 'pgjobq --help'.", argv[i]);
    return EX_USAGE;
}
