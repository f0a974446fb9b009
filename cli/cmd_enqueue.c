/*
 * cmd_enqueue.c - pgjobq enqueue: one job from the command line, or a JSON-lines file of them.
 *
 * A file is read and checked line by line and sent in batches inside one transaction, so memory stays
 * bounded and a bad line anywhere in the file inserts nothing at all.  The rules of a job (when it may
 * run, a unique key with --after or --tag) are the database's to judge, as for every interface: the
 * command checks only what it parses (docs/sql.md, "The enqueue rules").  The ids of a file of several
 * batches wait in a temporary file until the transaction commits: an id is printed only for a job
 * that exists.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define OPT_QUEUE        'q'
#define OPT_KIND         'k'
#define OPT_PRIORITY     'p'
#define OPT_DELAY        'd'
#define OPT_RUN_AT       1001
#define OPT_MAX_ATTEMPTS 1002
#define OPT_UNIQUE_KEY   'u'
#define OPT_FILE         'f'
#define OPT_QUIET        1003
#define OPT_BATCH        1004
#define OPT_CONC_KEY     1005
#define OPT_AFTER        1006
#define OPT_TAG          1007
#define OPT_ON_PARENT    1008
#define OPT_GRAPH        1009
#define OPT_ROUTE_KEY    1010
#define OPT_ON_CONFLICT  1011
#define OPT_UNIQUE_FOR   1012
#define OPT_EXPIRE_AFTER 1013
#define OPT_EXPIRES_AT   1014
#define OPT_TRACEPARENT  1015

#define MAX_TAGS  20
#define MAX_AFTER 10000

const cli_opt enqueue_opts[] = {
    {"queue", OPT_QUEUE, "QUEUE", "queue name (default: default)"},
    {"kind", OPT_KIND, "KIND", "job kind, for handlers to dispatch on (default: default)"},
    {"priority", OPT_PRIORITY, "P", "-100..100, lower runs first (default 0)"},
    {"delay", OPT_DELAY, "DURATION", "run no sooner than DURATION from now (30s, 5m, 2h, 1d, 500ms)"},
    {"run-at", OPT_RUN_AT, "TIME", "run no sooner than TIME (a PostgreSQL timestamp, e.g. 2027-01-01T09:00Z)"},
    {"max-attempts", OPT_MAX_ATTEMPTS, "N", "attempts before the job fails for good, 1..1000 (default 25)"},
    {"unique-key", OPT_UNIQUE_KEY, "KEY", "skip the job if a queued or running job holds KEY"},
    {"on-conflict", OPT_ON_CONFLICT, "MODE",
     "with --unique-key, when KEY is held: skip (default), replace (debounce: the queued job takes this one's "
     "payload and run_at) or keep (throttle, with --unique-for)"},
    {"unique-for", OPT_UNIQUE_FOR, "DURATION",
     "with --unique-key: hold KEY for DURATION from this enqueue, whatever becomes of the job (a throttle's window; "
     "implies --on-conflict keep)"},
    {"expire-after", OPT_EXPIRE_AFTER, "DURATION",
     "expire if not started DURATION after it is due: it then ends cancelled, never run (default: the queue's)"},
    {"expires-at", OPT_EXPIRES_AT, "TIME", "expire if not started by TIME (a PostgreSQL timestamp, after its run_at)"},
    {"traceparent", OPT_TRACEPARENT, "TP",
     "the job's W3C trace context (00-<trace id>-<parent id>-<flags>), handed to its handler (TRACEPARENT)"},
    {"concurrency-key", OPT_CONC_KEY, "KEY", "limit running jobs per KEY (with `pgjobq queue set --key-concurrency`)"},
    {"route-key", OPT_ROUTE_KEY, "KEY",
     "the job's routing key: where a spread queue's job lives in a cluster of shards"},
    {"after", OPT_AFTER, "ID[,ID...]", "wait (state waiting) until these jobs have completed; repeatable"},
    {"on-parent-failure", OPT_ON_PARENT, "WHAT", "with --after: cancel (default) or run when a parent fails for good"},
    {"tag", OPT_TAG, "TAG", "tag the job (1 to 64 characters; repeatable, at most 20); `list --tag` finds it"},
    {"graph", OPT_GRAPH, "FILE", "enqueue the jobs of a JSON graph (docs/workflows.md; '-' for stdin); all or none"},
    {"file", OPT_FILE, "FILE", "one JSON payload per line of FILE ('-' for stdin); all or none"},
    {"batch", OPT_BATCH, "N", "with --file, jobs per round trip, 1..10000 (default 1000)"},
    {"quiet", OPT_QUIET, NULL, "print nothing on success"},
    CLI_CLUSTER_OPT,
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

typedef struct enqueue_args {
    const cli_cmd *cmd;
    pgjobq_enqueue_opts opts;
    int64_t unique_for_ms;   /* 0: none */
    int64_t expire_after_ms; /* 0: none (the queue's default) */
    const char *expires_at;  /* NULL: none */
    const char *traceparent; /* NULL: none */
    const char *file;
    const char *graph;
    int quiet;
    int batch;
    int64_t *after; /* ends with 0 */
    size_t n_after;
    const char *tags[MAX_TAGS + 1]; /* ends with NULL */
    size_t n_tags;
} enqueue_args;

/* --after 12,13 --after 14: each id positive, at most MAX_AFTER in all. */
static int add_after(enqueue_args *a, const char *arg, char *why, size_t why_size)
{
    const char *p = arg;
    for (;;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno != 0 || v < 1 || (*end != ',' && *end != '\0')) {
            snprintf(why, why_size, "'%s' is not a list of job ids (positive integers, separated by commas)", arg);
            return -1;
        }
        if (a->n_after >= MAX_AFTER) {
            snprintf(why, why_size, "more than %d parents", MAX_AFTER);
            return -1;
        }
        int64_t *grown = realloc(a->after, (a->n_after + 2) * sizeof *grown);
        if (grown == NULL) {
            snprintf(why, why_size, "out of memory");
            return -1;
        }
        a->after = grown;
        a->after[a->n_after++] = v;
        a->after[a->n_after] = 0;
        if (*end == '\0')
            return 0;
        p = end + 1;
    }
}

static int enqueue_opt(int key, const char *arg, void *ctx)
{
    enqueue_args *a = ctx;
    char why[160];
    long long v;
    int64_t ms;

    switch (key) {
    case OPT_QUEUE: a->opts.queue = arg; return 0;
    case OPT_KIND: a->opts.kind = arg; return 0;
    case OPT_RUN_AT: a->opts.run_at = arg; return 0;
    case OPT_UNIQUE_KEY: a->opts.unique_key = arg; return 0;
    case OPT_CONC_KEY: a->opts.concurrency_key = arg; return 0;
    case OPT_ROUTE_KEY: a->opts.route_key = arg; return 0;
    case OPT_FILE: a->file = arg; return 0;
    case OPT_GRAPH: a->graph = arg; return 0;
    case OPT_AFTER:
        if (add_after(a, arg, why, sizeof why) != 0)
            break;
        a->opts.after = a->after;
        return 0;
    case OPT_TAG:
        if (a->n_tags >= MAX_TAGS) {
            snprintf(why, sizeof why, "at most %d tags", MAX_TAGS);
            break;
        }
        a->tags[a->n_tags++] = arg;
        a->tags[a->n_tags] = NULL;
        a->opts.tags = a->tags;
        return 0;
    case OPT_ON_PARENT:
        if (strcmp(arg, "cancel") == 0)
            a->opts.on_parent_failure = PGJOBQ_PARENT_FAILURE_CANCEL;
        else if (strcmp(arg, "run") == 0)
            a->opts.on_parent_failure = PGJOBQ_PARENT_FAILURE_RUN;
        else {
            snprintf(why, sizeof why, "'%s' is neither cancel nor run", arg);
            break;
        }
        return 0;
    case OPT_QUIET: a->quiet = 1; return 0;
    case OPT_PRIORITY:
        if (cli_parse_int(arg, PGJOBQ_PRIORITY_MIN, PGJOBQ_PRIORITY_MAX, &v, why, sizeof why) != 0)
            break;
        a->opts.priority = (int)v;
        return 0;
    case OPT_MAX_ATTEMPTS:
        if (cli_parse_int(arg, 1, PGJOBQ_MAX_ATTEMPTS_MAX, &v, why, sizeof why) != 0)
            break;
        a->opts.max_attempts = (int)v;
        return 0;
    case OPT_BATCH:
        if (cli_parse_int(arg, 1, PGJOBQ_BATCH_MAX, &v, why, sizeof why) != 0)
            break;
        a->batch = (int)v;
        return 0;
    case OPT_DELAY:
        if (cli_parse_duration_ms(arg, &ms, why, sizeof why) != 0)
            break;
        a->opts.delay_ms = ms;
        return 0;
    case OPT_ON_CONFLICT:
        if (strcmp(arg, "skip") == 0)
            a->opts.on_conflict = PGJOBQ_ON_CONFLICT_SKIP;
        else if (strcmp(arg, "replace") == 0)
            a->opts.on_conflict = PGJOBQ_ON_CONFLICT_REPLACE;
        else if (strcmp(arg, "keep") == 0)
            a->opts.on_conflict = PGJOBQ_ON_CONFLICT_KEEP;
        else {
            snprintf(why, sizeof why, "'%s' is not skip, replace or keep", arg);
            break;
        }
        return 0;
    case OPT_UNIQUE_FOR:
        if (cli_parse_duration_ms(arg, &ms, why, sizeof why) != 0)
            break;
        if (ms <= 0) {
            snprintf(why, sizeof why, "must be longer than zero");
            break;
        }
        a->unique_for_ms = ms;
        return 0;
    case OPT_EXPIRE_AFTER:
        if (cli_parse_duration_ms(arg, &ms, why, sizeof why) != 0)
            break;
        if (ms <= 0) {
            snprintf(why, sizeof why, "must be longer than zero");
            break;
        }
        a->expire_after_ms = ms;
        return 0;
    case OPT_EXPIRES_AT: a->expires_at = arg; return 0;
    case OPT_TRACEPARENT: a->traceparent = arg; return 0;
    default: return -1;
    }
    for (const cli_opt *o = enqueue_opts; o->name; o++)
        if (o->key == key)
            cli_usage_error(a->cmd, "--%s: %s", o->name, why);
    return -1;
}

/* The lines of the current batch, owned here until the batch is sent. */
typedef struct batch {
    pgjobq_job_spec *specs;
    char **lines;
    long *line_no;
    size_t n;
} batch;

static void batch_clear(batch *b)
{
    for (size_t i = 0; i < b->n; i++)
        free(b->lines[i]);
    b->n = 0;
}

/* Sends a batch; its ids go to `ids_to` (stdout, or the spool of a transaction not yet committed),
 * or nowhere when NULL (--quiet). */
static int send_batch(pgjobq_client *c, batch *b, FILE *ids_to, long *done, long *dups)
{
    int quiet = ids_to == NULL;
    /* Quiet: no ids wanted, which spares the library reserving them. */
    int64_t *ids = quiet ? NULL : malloc(b->n * sizeof *ids);
    unsigned char *dup = malloc(b->n);
    int rc;

    if ((ids == NULL && !quiet) || dup == NULL) {
        free(ids);
        free(dup);
        return PGJOBQ_ENOMEM;
    }
    rc = pgjobq_enqueue_many(c, b->specs, b->n, ids, dup);
    if (rc == PGJOBQ_OK) {
        for (size_t i = 0; i < b->n; i++) {
            if (!quiet)
                fprintf(ids_to, "%lld\n", (long long)ids[i]);
            *dups += dup[i];
        }
        *done += (long)b->n;
    }
    free(ids);
    free(dup);
    return rc;
}

/* Copies the spooled ids to stdout, once the transaction that wrote them has committed. */
static int print_spool(FILE *spool)
{
    char buf[65536];
    size_t n;

    rewind(spool);
    while ((n = fread(buf, 1, sizeof buf, spool)) > 0)
        if (fwrite(buf, 1, n, stdout) != n)
            return -1;
    return ferror(spool) ? -1 : 0;
}

/* Reads one line of f into *line (grown as needed, NUL-terminated, its '\n' dropped), reading at most
 * `max` bytes of it.  Returns its length; -1 at the end of the file or on a read error (ferror says
 * which); -2 when the line goes on past max bytes: it is not read further, so a line of 200 MB costs
 * max bytes of memory, not 200 MB, before it is refused. */
static ssize_t read_line(FILE *f, char **line, size_t *cap, size_t max)
{
    size_t len = 0;
    int ch = EOF;

    flockfile(f);
    while ((ch = getc_unlocked(f)) != EOF && ch != '\n') {
        if (len == max) {
            funlockfile(f);
            return -2;
        }
        if (len + 1 >= *cap) {
            size_t grown = *cap ? *cap * 2 : 4096;
            char *p = realloc(*line, grown > max + 1 ? max + 1 : grown);
            if (p == NULL) {
                funlockfile(f);
                errno = ENOMEM;
                return -3;
            }
            *line = p;
            *cap = grown > max + 1 ? max + 1 : grown;
        }
        (*line)[len++] = (char)ch;
    }
    funlockfile(f);
    if (ch == EOF && len == 0)
        return -1;
    if (*line == NULL && (*line = malloc(*cap = 1)) == NULL) {
        errno = ENOMEM;
        return -3;
    }
    (*line)[len] = '\0';
    return (ssize_t)len;
}

static int enqueue_file(enqueue_args *a, pgjobq_client *c)
{
    FILE *f = strcmp(a->file, "-") == 0 ? stdin : fopen(a->file, "r"), *spool = NULL;
    batch b = {NULL, NULL, NULL, 0};
    char *line = NULL;
    size_t cap = 0;
    long line_no = 0, done = 0, dups = 0;
    int rc = PGJOBQ_OK, status = EX_OK, in_tx = 0;
    ssize_t len;

    if (f == NULL) {
        cli_err("cannot read %s: %s", a->file, strerror(errno));
        return EX_NOINPUT;
    }
    b.specs = calloc((size_t)a->batch, sizeof *b.specs);
    b.lines = calloc((size_t)a->batch, sizeof *b.lines);
    b.line_no = calloc((size_t)a->batch, sizeof *b.line_no);
    if (b.specs == NULL || b.lines == NULL || b.line_no == NULL) {
        cli_err("out of memory");
        status = EX_OSERR;
        goto out;
    }
    /* A line may hold a payload of PGJOBQ_PAYLOAD_MAX bytes and its "\r"; one longer is refused when
     * it passes that, unread beyond. */
    while ((len = read_line(f, &line, &cap, PGJOBQ_PAYLOAD_MAX + 1)) >= 0 || len == -2) {
        char why[160];
        line_no++;
        if (len == -2) {
            cli_err("%s, line %ld: longer than the %d-byte payload limit; nothing was enqueued", a->file, line_no,
                    PGJOBQ_PAYLOAD_MAX);
            status = EX_DATAERR;
            goto out;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (strspn(line, " \t") == (size_t)len && strlen(line) == (size_t)len)
            continue; /* blank line */
        if (strlen(line) != (size_t)len) {
            cli_err("%s, line %ld: the line contains a NUL byte; nothing was enqueued", a->file, line_no);
            status = EX_DATAERR;
            goto out;
        }
        if (pgjobq_json_check(line, (size_t)len, why, sizeof why) != PGJOBQ_OK) {
            cli_err("%s, line %ld: not valid JSON: %s; nothing was enqueued", a->file, line_no, why);
            status = EX_DATAERR;
            goto out;
        }
        if ((b.lines[b.n] = strdup(line)) == NULL) {
            cli_err("out of memory");
            status = EX_OSERR;
            goto out;
        }
        b.specs[b.n].payload = b.lines[b.n];
        b.specs[b.n].opts = a->opts;
        b.specs[b.n].unique_for_ms = a->unique_for_ms;
        b.specs[b.n].expire_after_ms = a->expire_after_ms;
        b.specs[b.n].expires_at = a->expires_at;
        b.specs[b.n].traceparent = a->traceparent;
        b.line_no[b.n] = line_no;
        b.n++;
        if (b.n == (size_t)a->batch) {
            if (!in_tx && !a->quiet && (spool = tmpfile()) == NULL) {
                cli_err("cannot create a temporary file for the ids: %s; nothing was enqueued", strerror(errno));
                status = EX_CANTCREAT;
                goto out;
            }
            if (!in_tx && (rc = pgjobq_begin(c)) != PGJOBQ_OK)
                break;
            in_tx = 1;
            if ((rc = send_batch(c, &b, spool, &done, &dups)) != PGJOBQ_OK)
                break;
            batch_clear(&b);
        }
    }
    if (rc == PGJOBQ_OK && len == -3) {
        cli_err("out of memory reading %s; nothing was enqueued", a->file);
        status = EX_OSERR;
        goto out;
    }
    if (rc == PGJOBQ_OK && ferror(f)) {
        cli_err("reading %s: %s; nothing was enqueued", a->file, strerror(errno));
        status = EX_IOERR;
        goto out;
    }
    if (rc == PGJOBQ_OK && b.n > 0) {
        /* A file that fits in one batch needs no explicit transaction: the statement is atomic, and
         * its ids can go straight to stdout. */
        rc = send_batch(c, &b, in_tx ? spool : a->quiet ? NULL : stdout, &done, &dups);
    }
    if (rc == PGJOBQ_OK && in_tx) {
        rc = pgjobq_commit(c);
        in_tx = 0;
    }
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        cli_err("nothing from %s was enqueued", a->file);
        goto out;
    }
    if (spool && print_spool(spool) != 0) {
        cli_err("writing the ids: %s (the %ld jobs were enqueued)", strerror(errno), done - dups);
        status = EX_IOERR;
        goto out;
    }
    if (!a->quiet)
        fprintf(stderr, "enqueued %ld job%s from %s%s", done - dups, done - dups == 1 ? "" : "s", a->file,
                dups ? "" : "\n");
    if (!a->quiet && dups)
        fprintf(stderr, " (%ld skipped: their unique key was held by another job)\n", dups);
out:
    if (in_tx && pgjobq_rollback(c) != PGJOBQ_OK)
        cli_err("rollback failed: %s", pgjobq_errmsg(c));
    if (spool)
        fclose(spool);
    batch_clear(&b);
    free(b.specs);
    free(b.lines);
    free(b.line_no);
    free(line);
    if (f != stdin)
        fclose(f);
    return status;
}

/* --graph FILE: the whole file is one JSON graph, sent in one statement. */
static int enqueue_graph_file(enqueue_args *a, pgjobq_client *c)
{
    FILE *f = strcmp(a->graph, "-") == 0 ? stdin : fopen(a->graph, "r");
    char *text = NULL, why[160];
    size_t len = 0, cap = 0, n = 0;
    int64_t *ids = NULL;
    int status = EX_OK, rc;

    if (f == NULL) {
        cli_err("cannot read %s: %s", a->graph, strerror(errno));
        return EX_NOINPUT;
    }
    for (;;) {
        if (len + 65536 + 1 > cap) {
            char *grown = realloc(text, cap = 2 * cap + 65536 + 1);
            if (grown == NULL) {
                cli_err("out of memory");
                status = EX_OSERR;
                goto out;
            }
            text = grown;
        }
        size_t got = fread(text + len, 1, 65536, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        cli_err("reading %s: %s; nothing was enqueued", a->graph, strerror(errno));
        status = EX_IOERR;
        goto out;
    }
    text[len] = '\0';
    if (strlen(text) != len || pgjobq_json_check(text, len, why, sizeof why) != PGJOBQ_OK) {
        cli_err("%s: not valid JSON: %s; nothing was enqueued", a->graph, strlen(text) != len ? "a NUL byte" : why);
        status = EX_DATAERR;
        goto out;
    }
    if ((ids = malloc(MAX_AFTER * sizeof *ids)) == NULL) {
        cli_err("out of memory");
        status = EX_OSERR;
        goto out;
    }
    rc = pgjobq_enqueue_graph(c, text, ids, MAX_AFTER, &n);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        cli_err("nothing from %s was enqueued", a->graph);
        goto out;
    }
    for (size_t i = 0; !a->quiet && i < n && i < MAX_AFTER; i++)
        printf("%lld\n", (long long)ids[i]);
    if (!a->quiet)
        fprintf(stderr, "enqueued %zu job%s from %s\n", n, n == 1 ? "" : "s", a->graph);
out:
    free(ids);
    free(text);
    if (f != stdin)
        fclose(f);
    return status;
}

/* A job enqueued to a paused queue waits until the queue is resumed: say so on stderr (when this
 * role may read the queues' settings; a producer may not, and is then told nothing). */
static void note_if_paused(pgjobq_client *c, const char *queue)
{
    pgjobq_queue_info *q = NULL;
    size_t n = 0;

    if (pgjobq_queue_list(c, &q, &n) != PGJOBQ_OK)
        return;
    for (size_t i = 0; i < n; i++)
        if (strcmp(q[i].name, queue) == 0 && q[i].paused_at != PGJOBQ_TIME_NONE)
            cli_err("note: queue %s is paused%s%s%s: its jobs wait until `%s queue resume %s`", queue,
                    q[i].pause_reason ? " (" : "", q[i].pause_reason ? q[i].pause_reason : "",
                    q[i].pause_reason ? ")" : "", cli_self, queue);
    pgjobq_queue_list_free(q);
}

/* enqueue over a cluster of shards: one job routed by the client (a stale map read again); a file's
 * jobs, which share their options (queue, routing key), to their one shard, all or none as without a
 * cluster. */
static int enqueue_cluster(enqueue_args *a, const char *payload)
{
    pgjobq_cluster *cl;
    pgjobq_client *c;
    int64_t id = 0;
    size_t s;
    int status, rc;

    if (a->graph)
        return cli_usage_error(a->cmd, "--graph with a cluster: a graph's jobs must share a shard; give --db that "
                                       "shard's URL");
    if ((cl = cli_cluster_open(&status)) == NULL)
        return status;
    if (a->file) {
        if ((rc = pgjobq_cluster_route(cl, a->opts.queue, a->opts.route_key, &s)) != PGJOBQ_OK ||
            (rc = pgjobq_cluster_client(cl, s, &c)) != PGJOBQ_OK) {
            status = cli_cluster_fail(cl, rc);
            pgjobq_cluster_close(cl);
            return status;
        }
        status = enqueue_file(a, c);
        if (status != EX_OK && strcmp(pgjobq_sqlstate(c), "PJQ01") == 0)
            cli_err("the cluster's map changed while %s was sent (its queue moved to another shard): run the "
                    "command again",
                    a->file);
        else if (status == EX_OK)
            note_if_paused(c, a->opts.queue ? a->opts.queue : "default");
        pgjobq_cluster_close(cl);
        return status;
    }
    if (a->unique_for_ms || a->expire_after_ms || a->expires_at || a->traceparent) {
        /* What pgjobq_enqueue_opts has no room for goes in a spec, to the job's shard. */
        pgjobq_job_spec spec = {.payload = payload,
                                .opts = a->opts,
                                .unique_for_ms = a->unique_for_ms,
                                .expire_after_ms = a->expire_after_ms,
                                .expires_at = a->expires_at,
                                .traceparent = a->traceparent};
        if ((rc = pgjobq_cluster_route(cl, a->opts.queue, a->opts.route_key, &s)) == PGJOBQ_OK &&
            (rc = pgjobq_cluster_client(cl, s, &c)) == PGJOBQ_OK)
            rc = pgjobq_enqueue_spec(c, &spec, &id, NULL);
    } else {
        rc = pgjobq_cluster_enqueue(cl, payload, &a->opts, &id);
    }
    if (rc == PGJOBQ_EDUPLICATE) {
        if (!a->quiet) {
            printf("%lld\n", (long long)id);
            cli_err("not enqueued: job %lld already holds unique key \"%s\"", (long long)id, a->opts.unique_key);
        }
        pgjobq_cluster_close(cl);
        return EX_OK;
    }
    if (rc != PGJOBQ_OK) {
        status = cli_cluster_fail(cl, rc);
        pgjobq_cluster_close(cl);
        return status;
    }
    if (!a->quiet)
        printf("%lld\n", (long long)id);
    if (pgjobq_cluster_route_job(cl, id, &s) == PGJOBQ_OK && s != PGJOBQ_SHARD_ANY &&
        pgjobq_cluster_client(cl, s, &c) == PGJOBQ_OK)
        note_if_paused(c, a->opts.queue ? a->opts.queue : "default");
    pgjobq_cluster_close(cl);
    return EX_OK;
}

/* Everything after the options are parsed; a->after is freed by the caller. */
static int enqueue_main(enqueue_args *a, int argc, int first, char **argv)
{
    const char *payload = NULL;
    pgjobq_client *c;
    int status, rc;
    int64_t id = 0;

    if (argc - first == 2 && a->opts.queue == NULL && pgjobq_name_check(argv[first]) == PGJOBQ_OK &&
        strchr("{[\"", argv[first + 1][0]) != NULL)
        return cli_usage_error(a->cmd, "two arguments: to enqueue to queue '%s', give --queue %s PAYLOAD", argv[first],
                               argv[first]);
    if (argc - first > 1)
        return cli_usage_error(a->cmd, "unexpected argument '%s' (quote the payload as one argument)",
                               argv[first + 1]);
    if (argc - first == 1)
        payload = argv[first];
    if ((payload != NULL) + (a->file != NULL) + (a->graph != NULL) > 1)
        return cli_usage_error(a->cmd, "give a PAYLOAD, --file or --graph, not both");
    if (a->graph && (a->opts.after || a->opts.tags || a->opts.queue || a->opts.kind || a->opts.unique_key ||
                     a->opts.concurrency_key || a->opts.route_key || a->opts.run_at || a->opts.delay_ms ||
                     a->opts.priority || a->opts.max_attempts || a->expire_after_ms || a->expires_at || a->traceparent))
        return cli_usage_error(a->cmd, "with --graph, give each job's options in the graph");
    if (a->opts.on_parent_failure != PGJOBQ_PARENT_FAILURE_CANCEL && a->opts.after == NULL)
        return cli_usage_error(a->cmd, "--on-parent-failure needs --after");
    if (cli_cluster_spec() != NULL)
        return enqueue_cluster(a, payload);
    if ((c = cli_connect(0, &status)) == NULL)
        return status;
    if (a->file || a->graph) {
        status = a->file ? enqueue_file(a, c) : enqueue_graph_file(a, c);
        if (status == EX_OK && a->file)
            note_if_paused(c, a->opts.queue ? a->opts.queue : "default");
        pgjobq_client_close(c);
        return status;
    }
    pgjobq_job_spec spec = {.payload = payload,
                            .opts = a->opts,
                            .unique_for_ms = a->unique_for_ms,
                            .expire_after_ms = a->expire_after_ms,
                            .expires_at = a->expires_at,
                            .traceparent = a->traceparent};
    int outcome = PGJOBQ_ENQUEUED;
    rc = pgjobq_enqueue_spec(c, &spec, &id, &outcome);
    if (rc == PGJOBQ_EDUPLICATE) {
        if (!a->quiet) {
            printf("%lld\n", (long long)id);
            cli_err("not enqueued: job %lld already holds unique key \"%s\"%s", (long long)id, a->opts.unique_key,
                    a->unique_for_ms ? " (or took its window)" : "");
        }
        pgjobq_client_close(c);
        return EX_OK;
    }
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_client_close(c);
        return status;
    }
    if (!a->quiet)
        printf("%lld\n", (long long)id);
    if (!a->quiet && outcome == PGJOBQ_REPLACED)
        cli_err("replaced: queued job %lld, which holds unique key \"%s\", now has this payload and run time",
                (long long)id, a->opts.unique_key);
    note_if_paused(c, a->opts.queue ? a->opts.queue : "default");
    pgjobq_client_close(c);
    return EX_OK;
}

int cmd_enqueue(const cli_cmd *cmd, int argc, char **argv)
{
    enqueue_args a = {.cmd = cmd, .opts = PGJOBQ_ENQUEUE_OPTS_INIT, .batch = 1000};
    int first = cli_parse(cmd, argc, argv, enqueue_opt, &a), status;

    if (first == -2)
        status = EX_OK;
    else if (first < 0)
        status = EX_USAGE;
    else
        status = enqueue_main(&a, argc, first, argv);
    free(a.after);
    return status;
}
