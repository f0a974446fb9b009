/*
 * cmd_jobs.c - pgjobq migrate, list, show, stats, health, cancel and retry (of one job, or of every job a filter
 * matches).
 */
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "cli.h"

#define OPT_JSON  'j'
#define OPT_STATE 's'
#define OPT_QUEUE 'q'
#define OPT_LIMIT 'n'
#define OPT_TAG   't'

#define OPT_ROLES  'r'
#define OPT_ROUTER 1003
const cli_opt migrate_opts[] = {
    {"roles", OPT_ROLES, NULL,
     "also create the roles pgjobq_producer, pgjobq_worker, pgjobq_admin, pgjobq_monitor and pgjobq_cross_queue"},
    {"router", OPT_ROUTER, NULL, "make the database a router of a cluster of shards (PL/Proxy), not a shard"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};
const cli_opt list_opts[] = {
    {"state", OPT_STATE, "STATE", "only jobs in STATE: waiting, queued, running, completed, failed or cancelled"},
    {"queue", OPT_QUEUE, "QUEUE", "only jobs of QUEUE"},
    {"tag", OPT_TAG, "TAG", "only jobs tagged TAG"},
    {"limit", OPT_LIMIT, "N", "at most N jobs (1..100000, default 100)"},
    {"json", OPT_JSON, NULL, "print a JSON array of job objects"},
    CLI_CLUSTER_OPT,
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};
const cli_opt show_opts[] = {{"json", OPT_JSON, NULL, "print the job as a JSON object"},
                             CLI_CLUSTER_OPT,
                             CLI_COMMON_OPTS,
                             {NULL, 0, NULL, NULL}};
#define OPT_WAIT_TIMEOUT 1130
const cli_opt wait_opts[] = {{"timeout", OPT_WAIT_TIMEOUT, "DURATION",
                              "give up after DURATION (e.g. 30s, 5m) with exit status 75 (default: wait)"},
                             {"json", OPT_JSON, NULL, "print the finished job as a JSON object (as show --json does)"},
                             CLI_CLUSTER_OPT,
                             CLI_COMMON_OPTS,
                             {NULL, 0, NULL, NULL}};
const cli_opt graph_opts[] = {{"json", OPT_JSON, NULL, "print a JSON array: id, depth, state, queue, kind, parents"},
                              CLI_CLUSTER_OPT,
                              CLI_COMMON_OPTS,
                              {NULL, 0, NULL, NULL}};
const cli_opt skip_opts[] = {CLI_CLUSTER_OPT, CLI_COMMON_OPTS, {NULL, 0, NULL, NULL}};
const cli_opt stats_opts[] = {
    {"json", OPT_JSON, NULL, "print a JSON object"}, CLI_CLUSTER_OPT, CLI_COMMON_OPTS, {NULL, 0, NULL, NULL}};
const cli_opt health_opts[] = {
    {"json", OPT_JSON, NULL, "print a JSON object"}, CLI_CLUSTER_OPT, CLI_COMMON_OPTS, {NULL, 0, NULL, NULL}};
#define OPT_KIND    'k'
#define OPT_SINCE   1001
#define OPT_DRY_RUN 1002
#define OPT_RUNNING 1003
#define OPT_REDRIVE 1004
const cli_opt cancel_opts[] = {
    {"queue", OPT_QUEUE, "QUEUE", "without ID: cancel the jobs of QUEUE (with --state)"},
    {"state", OPT_STATE, "STATE", "without ID: queued (cancel them now) or running (request a cancel)"},
    {"kind", OPT_KIND, "KIND", "without ID: only jobs of KIND"},
    {"since", OPT_SINCE, "DURATION", "without ID: only jobs created within the last DURATION (30s, 10m, 2h, 1d)"},
    {"dry-run", OPT_DRY_RUN, NULL, "count the jobs, change nothing"},
    {"json", OPT_JSON, NULL, "print the count as a JSON object"},
    CLI_CLUSTER_OPT,
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};
const cli_opt retry_opts[] = {{"queue", OPT_QUEUE, "QUEUE", "without ID: retry the jobs of QUEUE (with --state)"},
                              {"state", OPT_STATE, "STATE",
                               "without ID: failed, cancelled or completed (finished jobs), or queued (make "
                               "scheduled jobs due now)"},
                              {"kind", OPT_KIND, "KIND", "without ID: only jobs of KIND"},
                              {"since", OPT_SINCE, "DURATION",
                               "without ID: only jobs that finished (queued: were created) within the last "
                               "DURATION"},
                              {"dry-run", OPT_DRY_RUN, NULL, "count the jobs, change nothing"},
                              {"running", OPT_RUNNING, NULL,
                               "with ID: end a running job's lease now and queue it to run again (its "
                               "worker's writes are then refused; the attempt counts)"},
                              {"redrive", OPT_REDRIVE, NULL,
                               "without ID: QUEUE is a dead-letter queue; send its dead letters back to the "
                               "queues they came from (--state queued: all of them)"},
                              {"json", OPT_JSON, NULL, "print the counts as a JSON object"},
                              CLI_CLUSTER_OPT,
                              CLI_COMMON_OPTS,
                              {NULL, 0, NULL, NULL}};

typedef struct list_args {
    const cli_cmd *cmd;
    pgjobq_list_opts opts;
    int json;
} list_args;

/* Parses options and exactly `want` operands; returns the operand index, or -1 with *status set. */
static int parse_simple(const cli_cmd *cmd, int argc, char **argv, int want, int (*on_opt)(int, const char *, void *),
                        void *ctx, int *status)
{
    int first = cli_parse(cmd, argc, argv, on_opt, ctx);

    if (first == -2) {
        *status = EX_OK;
        return -1;
    }
    if (first < 0) {
        *status = EX_USAGE;
        return -1;
    }
    if (argc - first != want) {
        *status = want == 0 ? cli_usage_error(cmd, "unexpected argument '%s'", argv[first])
                            : cli_usage_error(cmd, "expected %s", cmd->args);
        return -1;
    }
    return first;
}

static int parse_id(const cli_cmd *cmd, const char *s, int64_t *id)
{
    long long v;
    char why[128];
    if (cli_parse_int(s, 1, INT64_MAX, &v, why, sizeof why) != 0)
        return cli_usage_error(cmd, "job id: %s", why);
    *id = v;
    return EX_OK;
}

/* The preamble of the commands that act on one job (show, cancel, retry): options, the ID operand,
 * a connection.  Returns the client, or NULL with *status set (EX_OK after --help). */
static pgjobq_client *open_for_id(const cli_cmd *cmd, int argc, char **argv, int (*on_opt)(int, const char *, void *),
                                  void *ctx, int64_t *id, int *status)
{
    int first = parse_simple(cmd, argc, argv, 1, on_opt, ctx, status);

    if (first < 0)
        return NULL;
    if ((*status = parse_id(cmd, argv[first], id)) != EX_OK)
        return NULL;
    return cli_connect_for_id(*id, status);
}

/* For commands whose only option of their own is one flag: sets *ctx. */
static int flag_opt(int key, const char *arg, void *ctx)
{
    (void)key;
    (void)arg;
    *(int *)ctx = 1;
    return 0;
}

#define MIGRATE_ROLES  1
#define MIGRATE_ROUTER 2

/* migrate's options: flags of MIGRATE_*. */
static int migrate_opt(int key, const char *arg, void *ctx)
{
    (void)arg;
    *(int *)ctx |= key == OPT_ROUTER ? MIGRATE_ROUTER : MIGRATE_ROLES;
    return 0;
}

int cmd_migrate(const cli_cmd *cmd, int argc, char **argv)
{
    int status, applied = 0, version = 0, rc, flags = 0;
    pgjobq_client *c;

    if (parse_simple(cmd, argc, argv, 0, migrate_opt, &flags, &status) < 0)
        return status;
    if (flags == (MIGRATE_ROLES | MIGRATE_ROUTER))
        return cli_usage_error(cmd, "--roles is for a shard: a router grants its functions to the roles that exist");
    if ((c = cli_connect(1, &status)) == NULL)
        return status;
    if (flags & MIGRATE_ROUTER) {
        rc = pgjobq_migrate_router(c, &applied);
        if (rc != PGJOBQ_OK) {
            status = cli_fail(c, rc);
            pgjobq_client_close(c);
            return status;
        }
        if (applied)
            printf("pgjobq router migrated (%d migration%s applied); install the cluster map with"
                   " pgjobq.cluster_set(map, NULL)\n",
                   applied, applied == 1 ? "" : "s");
        else
            printf("pgjobq router is up to date\n");
        pgjobq_client_close(c);
        return EX_OK;
    }
    int roles = (flags & MIGRATE_ROLES) != 0;
    rc = pgjobq_migrate(c, &applied);
    if (rc == PGJOBQ_OK)
        rc = pgjobq_schema_version(c, &version);
    if (rc == PGJOBQ_OK && roles)
        rc = pgjobq_migrate_roles(c);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_client_close(c);
        return status;
    }
    if (applied)
        printf("pgjobq schema migrated to version %d (%d migration%s applied)\n", version, applied,
               applied == 1 ? "" : "s");
    else
        printf("pgjobq schema is up to date (version %d)\n", version);
    if (roles)
        printf(
            "roles pgjobq_producer, pgjobq_worker, pgjobq_admin, pgjobq_monitor and pgjobq_cross_queue are in place\n");
    pgjobq_client_close(c);
    return EX_OK;
}

static int list_opt(int key, const char *arg, void *ctx)
{
    list_args *a = ctx;
    char why[128];
    long long v;
    pgjobq_state st;

    switch (key) {
    case OPT_STATE:
        if (pgjobq_state_parse(arg, &st) != PGJOBQ_OK) {
            cli_usage_error(a->cmd, "unknown state '%s' (waiting, queued, running, completed, failed, cancelled)", arg);
            return -1;
        }
        a->opts.state = (int)st;
        return 0;
    case OPT_QUEUE:
        if (pgjobq_name_check(arg) != PGJOBQ_OK) {
            cli_usage_error(a->cmd, "invalid queue name '%s'", arg);
            return -1;
        }
        a->opts.queue = arg;
        return 0;
    case OPT_LIMIT:
        if (cli_parse_int(arg, 1, 100000, &v, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--limit: %s", why);
            return -1;
        }
        a->opts.limit = (int)v;
        return 0;
    case OPT_TAG:
        if (arg[0] == '\0' || strlen(arg) > 256) {
            cli_usage_error(a->cmd, "--tag: a tag has 1 to 64 characters");
            return -1;
        }
        a->opts.tag = arg;
        return 0;
    case OPT_JSON: a->json = 1; return 0;
    }
    return -1;
}

/* A job as a JSON object, without its closing brace (show adds fields). */
static void print_job_fields(FILE *f, const pgjobq_job *j)
{
    fprintf(f, "{\"id\":%lld,\"queue\":", (long long)j->id);
    json_str(f, j->queue);
    fputs(",\"kind\":", f);
    json_str(f, j->kind);
    fprintf(f, ",\"state\":\"%s\",\"priority\":%d,\"attempt\":%d,\"max_attempts\":%d", pgjobq_state_name(j->state),
            j->priority, j->attempt, j->max_attempts);
    fputs(",\"run_at\":", f);
    json_time(f, j->run_at);
    fputs(",\"created_at\":", f);
    json_time(f, j->created_at);
    fputs(",\"started_at\":", f);
    json_time(f, j->started_at);
    fputs(",\"finished_at\":", f);
    json_time(f, j->finished_at);
    fputs(",\"lease_until\":", f);
    json_time(f, j->lease_until);
    fputs(",\"worker_id\":", f);
    json_str(f, j->worker_id);
    fputs(",\"unique_key\":", f);
    json_str(f, j->unique_key);
    fprintf(f, ",\"cancel_requested\":%s", j->cancel_requested ? "true" : "false");
    fputs(",\"cancel_requested_at\":", f);
    json_time(f, j->cancel_requested ? j->cancel_requested_at : PGJOBQ_TIME_NONE);
    /* payload and result are JSON already (checked by the database): embed them as they are. */
    fprintf(f, ",\"payload\":%s,\"result\":%s,\"tags\":%s,\"progress\":%s,\"last_error\":",
            j->payload ? j->payload : "null", j->result ? j->result : "null", j->tags ? j->tags : "null",
            j->progress ? j->progress : "null");
    json_str(f, j->last_error);
}

/* What `pgjobq show` prints of a job that pgjobq_job has no field for, read in one statement from
 * pgjobq.job_get and pgjobq.sequence_blocks: the times in microseconds (PGJOBQ_TIME_NONE: NULL), the
 * priority it was enqueued with when priority aging raised it (PGJOBQ_TIME_NONE: never raised), its
 * concurrency key and the key it blocks in its strict-order queue (NULL: none; they live in r). */
typedef struct job_extra {
    PGresult *r;
    int64_t cancel_told_at; /* when its holder told the handler to stop (schema 16) */
    int64_t expires_at;     /* docs/queues.md, "Expiry" */
    int64_t base_priority;  /* docs/queues.md, "Priority aging" */
    const char *concurrency_key;
    const char *blocks_key; /* docs/queues.md, "Strict order per key" */
} job_extra;

/* Reads *x for job id: EX_OK, or EX_SOFTWARE with the error printed.  Release with PQclear(x->r). */
static int job_extra_read(pgjobq_client *c, int64_t id, job_extra *x)
{
    char id_s[24];
    const char *values[1] = {id_s};

    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    x->r = PQexecParams(pgjobq_client_conn(c),
                        "SELECT (pg_catalog.date_part('epoch', g.cancel_told_at) * 1000000)::pg_catalog.int8,"
                        " (pg_catalog.date_part('epoch', g.expires_at) * 1000000)::pg_catalog.int8,"
                        " g.base_priority::pg_catalog.int8, g.concurrency_key,"
                        " (SELECT b.key FROM pgjobq.sequence_blocks b WHERE b.job_id = $1::pg_catalog.int8)"
                        " FROM pgjobq.job_get($1::pg_catalog.int8) g",
                        1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(x->r) != PGRES_TUPLES_OK) {
        cli_err("reading job %lld: %s", (long long)id, PQresultErrorMessage(x->r));
        PQclear(x->r);
        x->r = NULL;
        return EX_SOFTWARE;
    }
    int n = PQntuples(x->r);
#define EXTRA_INT(col) (n > 0 && !PQgetisnull(x->r, 0, col) ? strtoll(PQgetvalue(x->r, 0, col), NULL, 10) : PGJOBQ_TIME_NONE)
#define EXTRA_TEXT(col) (n > 0 && !PQgetisnull(x->r, 0, col) ? PQgetvalue(x->r, 0, col) : NULL)
    x->cancel_told_at = EXTRA_INT(0);
    x->expires_at = EXTRA_INT(1);
    x->base_priority = EXTRA_INT(2);
    x->concurrency_key = EXTRA_TEXT(3);
    x->blocks_key = EXTRA_TEXT(4);
#undef EXTRA_INT
#undef EXTRA_TEXT
    return EX_OK;
}

/* When a running job's cancel was requested, and when its holder told the handler to stop (or how it
 * ended otherwise). */
static void print_cancel(const pgjobq_job *j, int64_t at)
{
    char asked[48], told[48];

    if (j->cancel_requested_at == PGJOBQ_TIME_NONE) {
        printf("cancel:        requested (when was not recorded)\n");
        return;
    }
    format_time(asked, sizeof asked, j->cancel_requested_at);
    if (at != PGJOBQ_TIME_NONE) {
        format_time(told, sizeof told, at);
        printf("cancel:        requested %s; its handler told %s (%.3f s later)\n", asked, told,
               (double)(at - j->cancel_requested_at) / 1e6);
    } else if (j->state == PGJOBQ_RUNNING)
        printf("cancel:        requested %s; its holder has not been told yet\n", asked);
    else
        printf("cancel:        requested %s; the job ended before its holder was told\n", asked);
}

static void print_job_json(FILE *f, const pgjobq_job *j)
{
    print_job_fields(f, j);
    fputc('}', f);
}

/* One line of a table cell: the text up to the first newline, cut to width characters, its control
 * characters escaped. */
static void cell(char *buf, size_t size, const char *s, size_t width)
{
    char *line = strndup(s ? s : "", s ? strcspn(s, "\n") : 0);
    tty_cell(buf, size, line ? line : "", width);
    free(line);
}

/* A "name:  value" line of show, the value's control characters escaped. */
static void field(const char *name, const char *value)
{
    printf("%-15s", name);
    tty_put(stdout, value, 0);
    putchar('\n');
}

/* A cluster's shards, each asked in turn (list, stats): a shard that does not answer is reported as
 * down ("pgjobq: shard b: down (why)" on stderr, and in --json) and the others' answers printed.  Exit
 * status EX_OK when at least one shard answered, else EX_UNAVAILABLE. */
typedef struct shard_answer {
    const char *name;
    pgjobq_client *client; /* NULL: down */
    char why[1024];
} shard_answer;

/* Opens the cluster and connects to every shard, into *out (malloc'd, *n of them); NULL with *status
 * set when the cluster cannot be opened. */
static pgjobq_cluster *cluster_shards(shard_answer **out, size_t *n, int *status)
{
    pgjobq_cluster *cl = cli_cluster_open(status);
    if (cl == NULL)
        return NULL;
    *n = pgjobq_cluster_shards(cl);
    if ((*out = calloc(*n, sizeof **out)) == NULL) {
        cli_err("out of memory");
        pgjobq_cluster_close(cl);
        *status = EX_OSERR;
        return NULL;
    }
    for (size_t s = 0; s < *n; s++) {
        shard_answer *a = &(*out)[s];
        a->name = pgjobq_cluster_shard_name(cl, s);
        if (pgjobq_cluster_client(cl, s, &a->client) != PGJOBQ_OK)
            snprintf(a->why, sizeof a->why, "%s", pgjobq_cluster_errmsg(cl));
    }
    return cl;
}

/* A shard whose call failed: down, with why (its client's message). */
static void shard_down(shard_answer *a, const char *why)
{
    snprintf(a->why, sizeof a->why, "shard %s: %s", a->name, why);
    a->client = NULL;
}

/* Reports the shards that are down; returns the exit status (EX_UNAVAILABLE when none answered). */
static int report_down(const shard_answer *sh, size_t n, int json)
{
    size_t down = 0;
    for (size_t s = 0; s < n; s++) {
        if (sh[s].client)
            continue;
        down++;
        cli_shard_down(sh[s].name, sh[s].why);
    }
    if (json)
        return down == n ? EX_UNAVAILABLE : EX_OK;
    if (down == n)
        cli_err("no shard of the cluster answered");
    return down == n ? EX_UNAVAILABLE : EX_OK;
}

/* --json: ,"shards":[{"shard":NAME,"up":BOOL[,"error":WHY]}...] */
static void print_shards_json(const shard_answer *sh, size_t n)
{
    fputs("\"shards\":[", stdout);
    for (size_t s = 0; s < n; s++) {
        printf("%s{\"shard\":", s ? "," : "");
        json_str(stdout, sh[s].name);
        printf(",\"up\":%s", sh[s].client ? "true" : "false");
        if (!sh[s].client) {
            fputs(",\"error\":", stdout);
            json_str(stdout, sh[s].why);
        }
        fputc('}', stdout);
    }
    fputc(']', stdout);
}

typedef struct shard_job {
    const pgjobq_job *job;
    const char *shard;
} shard_job;

/* Newest first across shards: by created_at, then id. */
static int shard_job_cmp(const void *x, const void *y)
{
    const pgjobq_job *a = ((const shard_job *)x)->job, *b = ((const shard_job *)y)->job;
    if (a->created_at != b->created_at)
        return a->created_at < b->created_at ? 1 : -1;
    return a->id < b->id ? 1 : a->id > b->id ? -1 : 0;
}

/* list over a cluster: each shard's newest jobs, merged newest first, with a SHARD column ("shard" in
 * --json). */
static int list_cluster(list_args *a)
{
    shard_answer *sh = NULL;
    size_t nsh = 0, total = 0, k = 0;
    int status;
    pgjobq_cluster *cl = cluster_shards(&sh, &nsh, &status);
    if (cl == NULL)
        return status;
    int limit = a->opts.limit ? a->opts.limit : 100, more = 0;
    if (limit < 100000)
        a->opts.limit = limit + 1;
    pgjobq_job **jobs = calloc(nsh, sizeof *jobs);
    size_t *njobs = calloc(nsh, sizeof *njobs);
    if (jobs == NULL || njobs == NULL) {
        cli_err("out of memory");
        status = EX_OSERR;
        goto out;
    }
    for (size_t s = 0; s < nsh; s++) {
        int rc;
        if (sh[s].client && (rc = pgjobq_job_list(sh[s].client, &a->opts, &jobs[s], &njobs[s])) != PGJOBQ_OK) {
            if (rc != PGJOBQ_ECONN) {
                status = cli_fail(sh[s].client, rc);
                goto out;
            }
            shard_down(&sh[s], pgjobq_errmsg(sh[s].client));
        }
        total += njobs[s];
    }
    shard_job *all = calloc(total ? total : 1, sizeof *all);
    if (all == NULL) {
        cli_err("out of memory");
        status = EX_OSERR;
        goto out;
    }
    for (size_t s = 0; s < nsh; s++)
        for (size_t i = 0; i < njobs[s]; i++)
            all[k++] = (shard_job){&jobs[s][i], sh[s].name};
    qsort(all, total, sizeof *all, shard_job_cmp);
    if (total > (size_t)limit || (limit == 100000 && total == (size_t)limit)) {
        more = 1;
        total = (size_t)limit;
    }
    if (a->json) {
        fputc('[', stdout);
        for (size_t i = 0; i < total; i++) {
            if (i)
                fputc(',', stdout);
            print_job_fields(stdout, all[i].job);
            fputs(",\"shard\":", stdout);
            json_str(stdout, all[i].shard);
            fputc('}', stdout);
        }
        fputs("]\n", stdout);
    } else if (total > 0) {
        printf("%-10s %-10s %-10s %-16s %-16s %4s %8s  %-24s %s\n", "SHARD", "ID", "STATE", "QUEUE", "KIND", "PRIO",
               "ATTEMPT", "RUN_AT", "LAST_ERROR");
        for (size_t i = 0; i < total; i++) {
            char run_at[48], err[200], attempts[24], queue[300], kind[300], shard[300];
            const pgjobq_job *j = all[i].job;
            format_time(run_at, sizeof run_at, j->run_at);
            cell(err, sizeof err, j->last_error, 40);
            tty_cell(queue, sizeof queue, j->queue, 64);
            tty_cell(kind, sizeof kind, j->kind, 64);
            tty_cell(shard, sizeof shard, all[i].shard, 64);
            snprintf(attempts, sizeof attempts, "%d/%d", j->attempt, j->max_attempts);
            printf("%-10s %-10lld %-10s %-16s %-16s %4d %8s  %-24s %s\n", shard, (long long)j->id,
                   pgjobq_state_name(j->state), queue, kind, j->priority, attempts, run_at, err);
        }
    } else {
        fprintf(stderr, "no jobs\n");
    }
    free(all);
    if (more)
        fprintf(stderr, "pgjobq: the newest %d jobs shown; there are more (--limit N shows up to 100000)\n", limit);
    status = report_down(sh, nsh, 0);
out:
    for (size_t s = 0; jobs && s < nsh; s++)
        pgjobq_jobs_free(jobs[s]);
    free(jobs);
    free(njobs);
    free(sh);
    pgjobq_cluster_close(cl);
    return status;
}

int cmd_list(const cli_cmd *cmd, int argc, char **argv)
{
    list_args a = {cmd, PGJOBQ_LIST_OPTS_INIT, 0};
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int status, rc;
    pgjobq_client *c;

    if (parse_simple(cmd, argc, argv, 0, list_opt, &a, &status) < 0)
        return status;
    if (cli_cluster_spec() != NULL)
        return list_cluster(&a);
    if ((c = cli_connect(0, &status)) == NULL)
        return status;
    /* One more than asked, to know whether the limit cut the list short (and say so). */
    int limit = a.opts.limit ? a.opts.limit : 100, more = 0;
    if (limit < 100000)
        a.opts.limit = limit + 1;
    rc = pgjobq_job_list(c, &a.opts, &jobs, &n);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_client_close(c);
        return status;
    }
    if (n > (size_t)limit || (limit == 100000 && n == (size_t)limit)) {
        more = 1;
        n = (size_t)limit;
    }
    if (a.json) {
        fputc('[', stdout);
        for (size_t i = 0; i < n; i++) {
            if (i)
                fputc(',', stdout);
            print_job_json(stdout, &jobs[i]);
        }
        fputs("]\n", stdout);
    } else if (n > 0) {
        printf("%-10s %-10s %-16s %-16s %4s %8s  %-24s %s\n", "ID", "STATE", "QUEUE", "KIND", "PRIO", "ATTEMPT",
               "RUN_AT", "LAST_ERROR");
        for (size_t i = 0; i < n; i++) {
            char run_at[48], err[200], attempts[24], queue[300], kind[300];
            const pgjobq_job *j = &jobs[i];
            format_time(run_at, sizeof run_at, j->run_at);
            cell(err, sizeof err, j->last_error, 40);
            tty_cell(queue, sizeof queue, j->queue, 64);
            tty_cell(kind, sizeof kind, j->kind, 64);
            snprintf(attempts, sizeof attempts, "%d/%d", j->attempt, j->max_attempts);
            printf("%-10lld %-10s %-16s %-16s %4d %8s  %-24s %s\n", (long long)j->id, pgjobq_state_name(j->state),
                   queue, kind, j->priority, attempts, run_at, err);
        }
    } else {
        fprintf(stderr, "no jobs\n");
    }
    if (more)
        fprintf(stderr, "pgjobq: the newest %d jobs shown; there are more (--limit N shows up to 100000)\n", limit);
    pgjobq_jobs_free(jobs);
    pgjobq_client_close(c);
    return EX_OK;
}

/* The jobs that wait (or waited) for `id`: id, state and kind, from the SQL API. */
static PGresult *children_of(pgjobq_client *c, int64_t id)
{
    char id_s[24];
    const char *values[1] = {id_s};
    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    PGresult *r = PQexecParams(pgjobq_client_conn(c), "SELECT id, state, coalesce(kind, '-') FROM pgjobq.children($1)",
                               1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        cli_err("reading the children of job %lld: %s", (long long)id, PQresultErrorMessage(r));
        PQclear(r);
        return NULL;
    }
    return r;
}

/* show: the job's stored steps (name, the attempt that stored it, when, its result's size) and its
 * park (a durable sleep, a wait for an event: docs/durable.md), when it has any. */
static int show_durable(pgjobq_client *c, const pgjobq_job *j, int json)
{
    pgjobq_step_info *steps = NULL;
    pgjobq_park_info park;
    size_t n = 0;
    char t[2][48];
    int rc;

    if ((rc = pgjobq_job_steps(c, j->id, &steps, &n)) != PGJOBQ_OK || (rc = pgjobq_job_park(c, j->id, &park)) != PGJOBQ_OK) {
        pgjobq_steps_free(steps);
        return cli_fail(c, rc);
    }
    const char *why = park.parked == PGJOBQ_PARK_SLEEP ? "sleeping" : "waiting";
    if (json) {
        fputs(",\"steps\":[", stdout);
        for (size_t i = 0; i < n; i++) {
            fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
            json_str(stdout, steps[i].name);
            printf(",\"attempt\":%d,\"stored_at\":", steps[i].attempt);
            json_time(stdout, steps[i].stored_at);
            printf(",\"bytes\":%lld}", (long long)steps[i].result_bytes);
        }
        fputs("],\"parked\":", stdout);
        if (park.parked == PGJOBQ_PARK_NONE) {
            fputs("null", stdout);
        } else {
            fputs("{\"why\":", stdout);
            json_str(stdout, why);
            fputs(",\"step\":", stdout);
            json_str(stdout, park.step);
            fputs(",\"until\":", stdout);
            json_time(stdout, park.until);
            fputs(",\"since\":", stdout);
            json_time(stdout, park.since);
            fputs(",\"event\":", stdout);
            json_str(stdout, park.parked == PGJOBQ_PARK_EVENT ? park.event_name : NULL);
            fputs(",\"key\":", stdout);
            json_str(stdout, park.parked == PGJOBQ_PARK_EVENT ? park.event_key : NULL);
            fputc('}', stdout);
        }
    } else {
        if (park.parked != PGJOBQ_PARK_NONE) {
            format_time(t[0], sizeof t[0], park.until);
            format_time(t[1], sizeof t[1], park.since);
            printf("%-15s%s in ", "parked:", why);
            tty_put(stdout, park.step, 0);
            if (park.parked == PGJOBQ_PARK_EVENT) {
                fputs(" for the event ", stdout);
                tty_put(stdout, park.event_name, 0);
                fputs(" key ", stdout);
                tty_put(stdout, park.event_key[0] ? park.event_key : "\"\"", 0);
            }
            printf(", until %s (since %s)\n", t[0], t[1]);
        }
        for (size_t i = 0; i < n; i++) {
            format_time(t[0], sizeof t[0], steps[i].stored_at);
            printf("%-15s", i == 0 ? "steps:" : "");
            tty_put(stdout, steps[i].name, 0);
            printf("  (attempt %d, %s, %lld bytes)\n", steps[i].attempt, t[0], (long long)steps[i].result_bytes);
        }
    }
    pgjobq_steps_free(steps);
    return EX_OK;
}

/* show: the job's place in a workflow (parents with their results, children), if it has one. */
static int show_relatives(pgjobq_client *c, const pgjobq_job *j, int json)
{
    pgjobq_job *parents = NULL;
    size_t np = 0;
    int rc = pgjobq_job_parents(c, j->id, &parents, &np);
    if (rc != PGJOBQ_OK)
        return cli_fail(c, rc);
    PGresult *kids = children_of(c, j->id);
    if (kids == NULL) {
        pgjobq_jobs_free(parents);
        return EX_SOFTWARE;
    }
    int nk = PQntuples(kids);
    if (json) {
        fputs(",\"parents\":[", stdout);
        for (size_t i = 0; i < np; i++)
            printf("%s{\"id\":%lld,\"state\":\"%s\",\"result\":%s}", i ? "," : "", (long long)parents[i].id,
                   pgjobq_state_name(parents[i].state), parents[i].result ? parents[i].result : "null");
        fputs("],\"children\":[", stdout);
        for (int i = 0; i < nk; i++) {
            printf("%s{\"id\":%s,\"state\":", i ? "," : "", PQgetvalue(kids, i, 0));
            json_str(stdout, PQgetvalue(kids, i, 1));
            fputs(",\"kind\":", stdout);
            json_str(stdout, PQgetvalue(kids, i, 2));
            fputc('}', stdout);
        }
        fputc(']', stdout);
    } else {
        for (size_t i = 0; i < np; i++) {
            printf("%-15s%lld %s%s", i ? "" : "parents:", (long long)parents[i].id, pgjobq_state_name(parents[i].state),
                   parents[i].result ? " result " : "");
            tty_put(stdout, parents[i].result, 0);
            putchar('\n');
        }
        for (int i = 0; i < nk; i++) {
            printf("%-15s%s ", i ? "" : "children:", PQgetvalue(kids, i, 0));
            tty_put(stdout, PQgetvalue(kids, i, 1), 0);
            putchar(' ');
            tty_put(stdout, PQgetvalue(kids, i, 2), 0);
            putchar('\n');
        }
    }
    PQclear(kids);
    pgjobq_jobs_free(parents);
    return EX_OK;
}

/* show: the job's dead-letter links (docs/queues.md, "Dead letters"): the job it is the dead letter of,
 * and the dead letters it left, each with its queue, when, and when it was redriven. */
static void dead_letter_json(const PGresult *r, int i, int64_t at, int64_t redriven)
{
    printf("{\"id\":%s,\"queue\":", PQgetvalue(r, i, 1));
    json_str(stdout, PQgetvalue(r, i, 2));
    fputs(",\"at\":", stdout);
    json_time(stdout, at);
    fputs(",\"redriven_at\":", stdout);
    json_time(stdout, redriven);
    fputc('}', stdout);
}

static int show_dead_letters(pgjobq_client *c, const pgjobq_job *j, int json)
{
    char id_s[24], t[2][48];
    const char *values[1] = {id_s};
    snprintf(id_s, sizeof id_s, "%lld", (long long)j->id);
    /* "of" sorts before "to": the job it came from first, then those it left. */
    PGresult *r = PQexecParams(pgjobq_client_conn(c),
                               "SELECT relation, id, queue, (extract(epoch FROM at) * 1e6)::bigint,"
                               " (extract(epoch FROM redriven_at) * 1e6)::bigint"
                               " FROM pgjobq.monitor_dead_letters($1::bigint) ORDER BY relation, id",
                               1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        cli_err("reading the dead letters of job %lld: %s", (long long)j->id, PQresultErrorMessage(r));
        PQclear(r);
        return EX_SOFTWARE;
    }
    int n = PQntuples(r), nto = 0, of = n > 0 && strcmp(PQgetvalue(r, 0, 0), "of") == 0;
    if (json)
        fputs(",\"dead_letter_of\":", stdout);
    if (json && !of)
        fputs("null", stdout);
    for (int i = 0; i < n; i++) {
        int64_t at = strtoll(PQgetvalue(r, i, 3), NULL, 10);
        int64_t redriven = PQgetisnull(r, i, 4) ? PGJOBQ_TIME_NONE : strtoll(PQgetvalue(r, i, 4), NULL, 10);
        if (json) {
            if (i == (of ? 1 : 0))
                fputs(",\"dead_letters\":[", stdout);
            else if (i > 0)
                fputc(',', stdout);
            dead_letter_json(r, i, at, redriven);
            continue;
        }
        format_time(t[0], sizeof t[0], at);
        format_time(t[1], sizeof t[1], redriven);
        printf("%-14s %s in ", i == 0 && of ? "dead letter of:" : nto++ ? "" : "dead letters:", PQgetvalue(r, i, 1));
        tty_put(stdout, PQgetvalue(r, i, 2), 0);
        printf(" (%s%s%s)\n", t[0], redriven == PGJOBQ_TIME_NONE ? "" : ", redriven ",
               redriven == PGJOBQ_TIME_NONE ? "" : t[1]);
    }
    if (json)
        fputs(n > (of ? 1 : 0) ? "]" : ",\"dead_letters\":[]", stdout);
    PQclear(r);
    return EX_OK;
}

/* The job's concurrency key, and the key it blocks in its strict-order queue when it failed for good
 * there (docs/queues.md, "Strict order per key"): text lines, or JSON's "concurrency_key" and
 * "blocks_key" (null: none). */
static void show_keys(const pgjobq_job *j, const job_extra *x, int json)
{
    if (json) {
        fputs(",\"concurrency_key\":", stdout);
        json_str(stdout, x->concurrency_key);
        fputs(",\"blocks_key\":", stdout);
        json_str(stdout, x->blocks_key);
        return;
    }
    if (x->concurrency_key) {
        fputs("concurrency_key: ", stdout);
        tty_put(stdout, x->concurrency_key, 0);
        putchar('\n');
    }
    if (x->blocks_key) {
        fputs("blocks key:    ", stdout);
        tty_put(stdout, x->blocks_key, 0);
        printf(" (strict order: nothing more of it starts until `pgjobq retry %lld` or `pgjobq skip %lld`)\n",
               (long long)j->id, (long long)j->id);
    }
}

/* wait's options. */
typedef struct wait_args {
    int json;
    int64_t timeout_ms; /* -1: no limit */
    const cli_cmd *cmd;
} wait_args;

static int wait_opt(int key, const char *arg, void *ctx)
{
    wait_args *a = ctx;
    char why[160];

    if (key == OPT_JSON) {
        a->json = 1;
        return 0;
    }
    if (cli_parse_duration_ms(arg, &a->timeout_ms, why, sizeof why) != 0) {
        cli_usage_error(a->cmd, "--timeout: %s", why);
        return -1;
    }
    return 0;
}

int cmd_wait(const cli_cmd *cmd, int argc, char **argv)
{
    wait_args a = {0, -1, cmd};
    int status, rc;
    pgjobq_job *j = NULL;
    pgjobq_client *c;
    int64_t id = 0;

    if ((c = open_for_id(cmd, argc, argv, wait_opt, &a, &id, &status)) == NULL)
        return status;
    rc = pgjobq_job_wait(c, id, a.timeout_ms, &j);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_jobs_free(j);
        cli_close(c);
        return status;
    }
    if (a.json) {
        print_job_fields(stdout, j);
        fputs("}\n", stdout);
    } else if (j->state == PGJOBQ_COMPLETED && j->result) {
        printf("%s\n", j->result);
    }
    if (j->state != PGJOBQ_COMPLETED)
        cli_err("job %lld %s (attempt %d of %d)%s%s", (long long)id,
                j->state == PGJOBQ_FAILED ? "failed" : "was cancelled", j->attempt, j->max_attempts,
                j->last_error ? ": " : "", j->last_error ? j->last_error : "");
    status = j->state == PGJOBQ_COMPLETED ? EX_OK : j->state == PGJOBQ_FAILED ? 1 : 2;
    pgjobq_jobs_free(j);
    cli_close(c);
    return status;
}

int cmd_show(const cli_cmd *cmd, int argc, char **argv)
{
    int json = 0, status, rc;
    pgjobq_job *j = NULL;
    pgjobq_client *c;
    int64_t id = 0;
    job_extra x;

    if ((c = open_for_id(cmd, argc, argv, flag_opt, &json, &id, &status)) == NULL)
        return status;
    rc = pgjobq_job_get(c, id, &j);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        cli_close(c);
        return status;
    }
    if ((status = job_extra_read(c, j->id, &x)) != EX_OK) {
        pgjobq_jobs_free(j);
        cli_close(c);
        return status;
    }
    if (json) {
        print_job_fields(stdout, j);
        fputs(",\"cancel_told_at\":", stdout);
        json_time(stdout, j->cancel_requested ? x.cancel_told_at : PGJOBQ_TIME_NONE);
        fputs(",\"expires_at\":", stdout);
        json_time(stdout, x.expires_at);
        if (x.base_priority != PGJOBQ_TIME_NONE)
            printf(",\"base_priority\":%lld", (long long)x.base_priority);
        else
            fputs(",\"base_priority\":null", stdout);
        fputs(",\"traceparent\":", stdout);
        json_str(stdout, pgjobq_job_traceparent(j));
        if (cli_shard_of(c)) {
            fputs(",\"shard\":", stdout);
            json_str(stdout, cli_shard_of(c));
        }
    } else {
        char t[5][48];
        format_time(t[0], sizeof t[0], j->run_at);
        format_time(t[1], sizeof t[1], j->created_at);
        format_time(t[2], sizeof t[2], j->started_at);
        format_time(t[3], sizeof t[3], j->finished_at);
        format_time(t[4], sizeof t[4], j->lease_until);
        printf("id:            %lld\n", (long long)j->id);
        if (cli_shard_of(c))
            field("shard:", cli_shard_of(c));
        field("queue:", j->queue);
        field("kind:", j->kind);
        printf("state:         %s%s\n", pgjobq_state_name(j->state), j->cancel_requested ? " (cancel requested)" : "");
        if (x.base_priority != PGJOBQ_TIME_NONE)
            printf("priority:      %d (enqueued at %lld, raised by priority aging)\n", j->priority,
                   (long long)x.base_priority);
        else
            printf("priority:      %d\n", j->priority);
        printf("attempt:       %d of %d\n", j->attempt, j->max_attempts);
        printf("run_at:        %s\ncreated_at:    %s\nstarted_at:    %s\nfinished_at:   %s\nlease_until:   %s\n", t[0],
               t[1], t[2], t[3], t[4]);
        field("worker_id:", j->worker_id ? j->worker_id : "-");
        if (x.expires_at != PGJOBQ_TIME_NONE) {
            char when[48];
            format_time(when, sizeof when, x.expires_at);
            printf("expires_at:    %s%s\n", when,
                   j->last_error && strncmp(j->last_error, "expired:", 8) == 0 && j->state == PGJOBQ_CANCELLED
                       ? " (expired: it never started)"
                       : "");
        }
        if (j->cancel_requested)
            print_cancel(j, x.cancel_told_at);
        field("unique_key:", j->unique_key ? j->unique_key : "-");
        field("payload:", j->payload);
        field("result:", j->result ? j->result : "-");
        field("last_error:", j->last_error ? j->last_error : "-");
        if (j->tags)
            field("tags:", j->tags);
        if (pgjobq_job_traceparent(j))
            field("traceparent:", pgjobq_job_traceparent(j));
        if (j->progress)
            field("progress:", j->progress);
    }
    status = show_durable(c, j, json);
    if (status == EX_OK)
        status = show_relatives(c, j, json);
    if (status == EX_OK)
        status = show_dead_letters(c, j, json);
    if (status == EX_OK)
        show_keys(j, &x, json);
    if (json && status == EX_OK)
        fputs("}\n", stdout);
    PQclear(x.r);
    pgjobq_jobs_free(j);
    if (status != EX_OK) {
        cli_close(c);
        return status;
    }
    cli_close(c);
    return EX_OK;
}

int cmd_graph(const cli_cmd *cmd, int argc, char **argv)
{
    int json = 0, status;
    pgjobq_client *c;
    int64_t id = 0;
    char id_s[24];
    const char *values[1] = {id_s};

    if ((c = open_for_id(cmd, argc, argv, flag_opt, &json, &id, &status)) == NULL)
        return status;
    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    PGresult *r = PQexecParams(pgjobq_client_conn(c),
                               "SELECT id, depth, state, coalesce(queue, '-'), coalesce(kind, '-'),"
                               " array_to_string(parents, ',') FROM pgjobq.graph($1)",
                               1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        cli_err("graph: %s", PQresultErrorMessage(r));
        PQclear(r);
        cli_close(c);
        return EX_SOFTWARE;
    }
    int n = PQntuples(r);
    /* graph(ID) always holds ID; a job that is nowhere is unknown. */
    if (n == 1 && strcmp(PQgetvalue(r, 0, 2), "pruned") == 0) {
        cli_err("no job %lld", (long long)id);
        PQclear(r);
        cli_close(c);
        return EX_DATAERR; /* as show: an unknown id is bad input */
    }
    if (json)
        fputc('[', stdout);
    for (int i = 0; i < n; i++) {
        const char *parents = PQgetvalue(r, i, 5);
        int depth = atoi(PQgetvalue(r, i, 1));
        if (json) {
            printf("%s{\"id\":%s,\"depth\":%d,\"state\":", i ? "," : "", PQgetvalue(r, i, 0), depth);
            json_str(stdout, PQgetvalue(r, i, 2));
            fputs(",\"queue\":", stdout);
            json_str(stdout, PQgetvalue(r, i, 3));
            fputs(",\"kind\":", stdout);
            json_str(stdout, PQgetvalue(r, i, 4));
            printf(",\"parents\":[%s]}", parents);
        } else {
            printf("%*s#%s ", depth * 2, "", PQgetvalue(r, i, 0));
            tty_put(stdout, PQgetvalue(r, i, 2), 0);
            putchar(' ');
            tty_put(stdout, PQgetvalue(r, i, 3), 0);
            putchar('/');
            tty_put(stdout, PQgetvalue(r, i, 4), 0);
            if (parents[0]) {
                fputs("  after", stdout);
                for (const char *p = parents; *p;) {
                    size_t len = strcspn(p, ",");
                    printf(" #%.*s", (int)len, p);
                    p += len + (p[len] == ',');
                }
            }
            if (strtoll(PQgetvalue(r, i, 0), NULL, 10) == id)
                fputs("  <", stdout);
            fputc('\n', stdout);
        }
    }
    if (json)
        fputs("]\n", stdout);
    PQclear(r);
    cli_close(c);
    return EX_OK;
}

/* What an autoscaler reads of a queue, beside stats' counts (pgjobq_queue_ready): a line's, or the
 * total's (oldest: the oldest of all; no limit). */
typedef struct depth {
    int64_t ready, oldest_ms, slots; /* oldest_ms -1: none ready */
    int concurrency;                 /* 0: none */
} depth;

/* Adds queue's readiness from rd (n rows) to *d. */
static void depth_add(depth *d, const pgjobq_queue_ready_info *rd, size_t n, const char *queue)
{
    for (size_t i = 0; i < n; i++) {
        if (queue != NULL && strcmp(rd[i].name, queue) != 0)
            continue;
        d->ready += rd[i].ready;
        d->slots += rd[i].worker_slots;
        if (rd[i].oldest_ready_ms > d->oldest_ms)
            d->oldest_ms = rd[i].oldest_ready_ms;
        if (queue != NULL)
            d->concurrency = rd[i].concurrency;
    }
}

/* --json: a line's readiness, after its counts (the total has no limit). */
static void depth_json(const depth *d, int total)
{
    printf(",\"ready\":%lld,\"oldest_ready_s\":", (long long)d->ready);
    if (d->oldest_ms < 0)
        fputs("null", stdout);
    else
        printf("%.3f", (double)d->oldest_ms / 1000.0);
    if (!total) {
        fputs(",\"concurrency\":", stdout);
        if (d->concurrency > 0)
            printf("%d", d->concurrency);
        else
            fputs("null", stdout);
    }
    printf(",\"worker_slots\":%lld", (long long)d->slots);
}

/* The text's READY and OLDEST columns. */
static void depth_text(const depth *d)
{
    char oldest[32] = "-";
    if (d->oldest_ms >= 0)
        snprintf(oldest, sizeof oldest, "%.1fs", (double)d->oldest_ms / 1000.0);
    printf(" %10lld %10s\n", (long long)d->ready, oldest);
}

/* stats over a cluster: a line per shard and queue (SHARD column; "shard" in --json), and the total
 * of the shards that answered. */
static int stats_cluster(int json)
{
    shard_answer *sh = NULL;
    size_t nsh = 0, nl = 0;
    int status;
    pgjobq_cluster *cl = cluster_shards(&sh, &nsh, &status);
    if (cl == NULL)
        return status;
    pgjobq_stat **rows = calloc(nsh, sizeof *rows);
    pgjobq_queue_ready_info **rd = calloc(nsh, sizeof *rd);
    size_t *nrows = calloc(nsh, sizeof *nrows), *nrd = calloc(nsh, sizeof *nrd), cap = 0;
    struct line {
        const char *shard, *queue;
        int64_t k[6];
        depth d;
    } *lines = NULL;
    int64_t total[6] = {0};
    depth dtotal = {0, -1, 0, 0};
    if (rows == NULL || nrows == NULL || rd == NULL || nrd == NULL) {
        cli_err("out of memory");
        status = EX_OSERR;
        goto out;
    }
    for (size_t s = 0; s < nsh; s++) {
        int rc;
        if (sh[s].client && ((rc = pgjobq_stats(sh[s].client, &rows[s], &nrows[s])) != PGJOBQ_OK ||
                             (rc = pgjobq_queue_ready(sh[s].client, &rd[s], &nrd[s])) != PGJOBQ_OK)) {
            if (rc != PGJOBQ_ECONN) {
                status = cli_fail(sh[s].client, rc);
                goto out;
            }
            shard_down(&sh[s], pgjobq_errmsg(sh[s].client));
        }
        cap += nrows[s];
    }
    if ((lines = calloc(cap ? cap : 1, sizeof *lines)) == NULL) {
        cli_err("out of memory");
        status = EX_OSERR;
        goto out;
    }
    for (size_t s = 0; s < nsh; s++) {
        depth_add(&dtotal, rd[s], nrd[s], NULL);
        for (size_t i = 0; i < nrows[s]; i++) {
            const pgjobq_stat *r = &rows[s][i];
            if ((unsigned)r->state > PGJOBQ_WAITING)
                continue;
            if (nl == 0 || lines[nl - 1].shard != sh[s].name || strcmp(lines[nl - 1].queue, r->queue) != 0) {
                lines[nl++] = (struct line){sh[s].name, r->queue, {0}, {0, -1, 0, 0}};
                depth_add(&lines[nl - 1].d, rd[s], nrd[s], r->queue);
            }
            lines[nl - 1].k[r->state] += r->jobs;
            total[r->state] += r->jobs;
        }
    }
    if (json) {
        fputs("{\"queues\":[", stdout);
        for (size_t q = 0; q <= nl; q++) {
            const int64_t *k = q < nl ? lines[q].k : total;
            if (q == nl)
                fputs("],\"total\":", stdout);
            else if (q)
                fputc(',', stdout);
            fputc('{', stdout);
            if (q < nl) {
                fputs("\"shard\":", stdout);
                json_str(stdout, lines[q].shard);
                fputs(",\"queue\":", stdout);
                json_str(stdout, lines[q].queue);
                fputc(',', stdout);
            }
            printf("\"queued\":%lld,\"running\":%lld,\"completed\":%lld,\"failed\":%lld,\"cancelled\":%lld,"
                   "\"waiting\":%lld",
                   (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3], (long long)k[4],
                   (long long)k[5]);
            depth_json(q < nl ? &lines[q].d : &dtotal, q == nl);
            fputc('}', stdout);
        }
        fputc(',', stdout);
        print_shards_json(sh, nsh);
        fputs("}\n", stdout);
    } else {
        printf("%-10s %-24s %10s %10s %10s %10s %10s %10s %10s %10s\n", "SHARD", "QUEUE", "QUEUED", "RUNNING",
               "COMPLETED", "FAILED", "CANCELLED", "WAITING", "READY", "OLDEST");
        for (size_t q = 0; q <= nl; q++) {
            const int64_t *k = q < nl ? lines[q].k : total;
            char name[300], shard[300];
            tty_cell(name, sizeof name, q < nl ? lines[q].queue : "(all)", 64);
            tty_cell(shard, sizeof shard, q < nl ? lines[q].shard : "(all)", 64);
            printf("%-10s %-24s %10lld %10lld %10lld %10lld %10lld %10lld", shard, name, (long long)k[0],
                   (long long)k[1], (long long)k[2], (long long)k[3], (long long)k[4], (long long)k[5]);
            depth_text(q < nl ? &lines[q].d : &dtotal);
        }
    }
    status = report_down(sh, nsh, json);
out:
    for (size_t s = 0; rows && s < nsh; s++)
        pgjobq_stats_free(rows[s]);
    for (size_t s = 0; rd && s < nsh; s++)
        pgjobq_queue_ready_free(rd[s]);
    free(rows);
    free(nrows);
    free(rd);
    free(nrd);
    free(lines);
    free(sh);
    pgjobq_cluster_close(cl);
    return status;
}

int cmd_stats(const cli_cmd *cmd, int argc, char **argv)
{
    int json = 0, status, rc;
    pgjobq_stat *rows = NULL;
    size_t n = 0, nq = 0;
    pgjobq_client *c;

    if (parse_simple(cmd, argc, argv, 0, flag_opt, &json, &status) < 0)
        return status;
    if (cli_cluster_spec() != NULL)
        return stats_cluster(json);
    if ((c = cli_connect(0, &status)) == NULL)
        return status;
    pgjobq_queue_ready_info *rd = NULL;
    size_t nrd = 0;
    if ((rc = pgjobq_stats(c, &rows, &n)) != PGJOBQ_OK || (rc = pgjobq_queue_ready(c, &rd, &nrd)) != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_stats_free(rows);
        pgjobq_client_close(c);
        return status;
    }
    /* Rows come ordered by queue: fold them into one line per queue. */
    const char **queues = calloc(n ? n : 1, sizeof *queues);
    int64_t(*counts)[6] = calloc(n ? n : 1, sizeof *counts);
    depth *depths = calloc(n ? n : 1, sizeof *depths), dtotal = {0, -1, 0, 0};
    int64_t total[6] = {0};
    if (queues == NULL || counts == NULL || depths == NULL) {
        cli_err("out of memory");
        free(queues);
        free(counts);
        free(depths);
        pgjobq_queue_ready_free(rd);
        pgjobq_stats_free(rows);
        pgjobq_client_close(c);
        return EX_OSERR;
    }
    depth_add(&dtotal, rd, nrd, NULL);
    for (size_t i = 0; i < n; i++) {
        if ((unsigned)rows[i].state > PGJOBQ_WAITING)
            continue;
        if (nq == 0 || strcmp(queues[nq - 1], rows[i].queue) != 0) {
            queues[nq++] = rows[i].queue;
            depths[nq - 1] = (depth){0, -1, 0, 0};
            depth_add(&depths[nq - 1], rd, nrd, rows[i].queue);
        }
        counts[nq - 1][rows[i].state] += rows[i].jobs;
        total[rows[i].state] += rows[i].jobs;
    }
    if (json) {
        fputs("{\"queues\":[", stdout);
        for (size_t q = 0; q <= nq; q++) {
            const int64_t *k = q < nq ? counts[q] : total;
            if (q == nq)
                fputs("],\"total\":", stdout);
            else if (q)
                fputc(',', stdout);
            fputc('{', stdout);
            if (q < nq) {
                fputs("\"queue\":", stdout);
                json_str(stdout, queues[q]);
                fputc(',', stdout);
            }
            printf("\"queued\":%lld,\"running\":%lld,\"completed\":%lld,\"failed\":%lld,\"cancelled\":%lld,"
                   "\"waiting\":%lld",
                   (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3], (long long)k[4],
                   (long long)k[5]);
            depth_json(q < nq ? &depths[q] : &dtotal, q == nq);
            fputc('}', stdout);
        }
        fputs("}\n", stdout);
    } else {
        printf("%-24s %10s %10s %10s %10s %10s %10s %10s %10s\n", "QUEUE", "QUEUED", "RUNNING", "COMPLETED", "FAILED",
               "CANCELLED", "WAITING", "READY", "OLDEST");
        for (size_t q = 0; q <= nq; q++) {
            const int64_t *k = q < nq ? counts[q] : total;
            char name[300];
            tty_cell(name, sizeof name, q < nq ? queues[q] : "(all)", 64);
            printf("%-24s %10lld %10lld %10lld %10lld %10lld %10lld", name, (long long)k[0], (long long)k[1],
                   (long long)k[2], (long long)k[3], (long long)k[4], (long long)k[5]);
            depth_text(q < nq ? &depths[q] : &dtotal);
        }
    }
    free(queues);
    free(counts);
    free(depths);
    pgjobq_queue_ready_free(rd);
    pgjobq_stats_free(rows);
    pgjobq_client_close(c);
    return EX_OK;
}

/* Bytes as "12.3 MB" (powers of 1024, as pg_size_pretty). */
static void format_bytes(char *buf, size_t size, int64_t bytes)
{
    static const char *const units[] = {"bytes", "kB", "MB", "GB", "TB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 10240 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* The live workers that claim nothing because they cannot run jobs (pgjobq_worker_set_unhealthy: a
 * coprocess that cannot start): id, host, pid, reason, seconds since.  NULL, said on stderr, when they
 * cannot be read (the report goes on without them). */
static PGresult *unhealthy_workers(pgjobq_client *c)
{
    PGresult *r =
        PQexec(pgjobq_client_conn(c), "SELECT id, host, pid, reason, round(extract(epoch FROM now() - since))::bigint"
                                      " FROM pgjobq.monitor_unhealthy_workers()");
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        return r;
    cli_err("cannot read which workers are unhealthy: %s", PQresultErrorMessage(r));
    PQclear(r);
    return NULL;
}

static void print_unhealthy_json(const PGresult *u)
{
    fputs(",\"unhealthy_workers\":[", stdout);
    for (int i = 0; u && i < PQntuples(u); i++) {
        fputs(i ? ",{\"id\":" : "{\"id\":", stdout);
        json_str(stdout, PQgetvalue(u, i, 0));
        fputs(",\"host\":", stdout);
        json_str(stdout, PQgetvalue(u, i, 1));
        printf(",\"pid\":%s,\"since_s\":%s,\"reason\":", PQgetvalue(u, i, 2), PQgetvalue(u, i, 4));
        json_str(stdout, PQgetvalue(u, i, 3));
        fputc('}', stdout);
    }
    fputc(']', stdout);
}

/* Each unhealthy worker, with the lines of its reason indented (a traceback's last lines). */
static void print_unhealthy(const PGresult *u)
{
    int n = u ? PQntuples(u) : 0;
    if (n == 0) {
        printf("workers        none unhealthy\n");
        return;
    }
    printf("workers        %d unhealthy, claiming nothing until it is over:\n", n);
    for (int i = 0; i < n; i++) {
        fputs("  ", stdout);
        tty_put(stdout, PQgetvalue(u, i, 0), 0);
        printf(" (pid %s on ", PQgetvalue(u, i, 2));
        tty_put(stdout, PQgetvalue(u, i, 1), 0);
        printf("), for %s s:\n", PQgetvalue(u, i, 4));
        for (const char *l = PQgetvalue(u, i, 3); *l;) {
            size_t len = strcspn(l, "\n");
            char *line = strndup(l, len);
            fputs("    ", stdout);
            tty_put(stdout, line ? line : "", 0);
            fputc('\n', stdout);
            free(line);
            l += len + (l[len] == '\n');
        }
    }
}

/* One database's health, printed (shard: its name in a cluster, printed first; NULL: none). */
static void health_print(const pgjobq_health *hp, PGresult *unhealthy, int json, const char *shard)
{
    pgjobq_health h = *hp;
    char t1[48], t2[48], size[32];

    if (json) {
        fputc('{', stdout);
        if (shard) {
            fputs("\"shard\":", stdout);
            json_str(stdout, shard);
            fputs(",\"up\":true,", stdout);
        }
        printf("\"jobs_bytes\":%lld,\"jobs_live\":%lld,\"jobs_dead\":%lld,\"vacuums\":%lld,\"last_vacuum\":",
               (long long)h.jobs_bytes, (long long)h.jobs_live, (long long)h.jobs_dead, (long long)h.vacuums);
        json_time(stdout, h.last_vacuum);
        fputs(",\"autovacuum_paused_since\":", stdout);
        json_time(stdout, h.autovacuum_paused_since);
        fputs(",\"holder\":", stdout);
        if (h.holder_kind[0] == '\0') {
            fputs("null", stdout);
            goto json_end;
        }
        printf("{\"kind\":");
        json_str(stdout, h.holder_kind);
        printf(",\"age_s\":%.3f,\"xids\":%lld,\"pid\":", (double)h.horizon_age_ms / 1000, (long long)h.horizon_xids);
        if (h.holder_pid)
            printf("%d", (int)h.holder_pid);
        else
            fputs("null", stdout);
        fputs(",\"role\":", stdout);
        json_str(stdout, h.holder_role[0] ? h.holder_role : NULL);
        fputs(",\"application\":", stdout);
        json_str(stdout, h.holder_application[0] ? h.holder_application : NULL);
        fputs(",\"state\":", stdout);
        json_str(stdout, h.holder_state[0] ? h.holder_state : NULL);
        fputs(",\"since\":", stdout);
        json_time(stdout, h.holder_since);
        fputs(",\"query\":", stdout);
        json_str(stdout, h.holder_query[0] ? h.holder_query : NULL);
        fputc('}', stdout);
    json_end:
        print_unhealthy_json(unhealthy);
        fputs(shard ? "}" : "}\n", stdout);
        return;
    }
    if (shard)
        printf("shard          %s\n", shard);
    format_bytes(size, sizeof size, h.jobs_bytes);
    format_time(t1, sizeof t1, h.last_vacuum);
    printf("pgjobq.jobs    %s, %lld live rows, %lld dead rows (estimates)\n", size, (long long)h.jobs_live,
           (long long)h.jobs_dead);
    printf("vacuums        %lld, last %s\n", (long long)h.vacuums, t1);
    if (h.autovacuum_paused_since != PGJOBQ_TIME_NONE) {
        format_time(t2, sizeof t2, h.autovacuum_paused_since);
        printf("autovacuum     paused by pgjobq since %s: a pass could remove nothing while the holder\n"
               "               below holds; it resumes when that ends\n",
               t2);
    }
    if (h.holder_kind[0] == '\0') {
        printf("oldest holder  none: vacuum can remove every dead row\n");
        goto text_end;
    }
    format_time(t2, sizeof t2, h.holder_since);
    /* The holder's application name and query are another session's: anything can be in them. */
    printf("oldest holder  ");
    tty_put(stdout, h.holder_kind, 0);
    if (h.holder_pid)
        printf(" pid %d", (int)h.holder_pid);
    if (h.holder_role[0]) {
        fputs(" of role ", stdout);
        tty_put(stdout, h.holder_role, 0);
    }
    if (h.holder_application[0]) {
        fputs(" \"", stdout);
        tty_put(stdout, h.holder_application, 0);
        fputc('"', stdout);
    }
    if (h.holder_state[0]) {
        fputs(" (", stdout);
        tty_put(stdout, h.holder_state, 0);
        fputc(')', stdout);
    }
    printf(", for %.1f s (xid age %lld), since %s\n", (double)h.horizon_age_ms / 1000, (long long)h.horizon_xids, t2);
    if (h.holder_query[0])
        field("  query", h.holder_query);
    else if (strcmp(h.holder_kind, "session") == 0)
        printf("  query        not shown: pg_stat_activity shows it only to a superuser, pg_read_all_stats\n"
               "               and the holder's own role\n");
    if (h.horizon_age_ms >= 300000)
        printf("While it holds, finished jobs leave dead rows that nothing can remove: end it, or see\n"
               "docs/deploy.md, \"Snapshots held open\".\n");
text_end:
    print_unhealthy(unhealthy);
}

/* --cluster: each shard's health, one after another (text: a block per shard; --json: {"shards":[...]}
 * with "up" and, for a shard that is down, "error"); a shard that does not answer is reported as down. */
static int health_cluster(int json)
{
    shard_answer *sh = NULL;
    size_t n = 0;
    int status;
    pgjobq_cluster *cl = cluster_shards(&sh, &n, &status);

    if (cl == NULL)
        return status;
    if (json)
        fputs("{\"shards\":[", stdout);
    for (size_t s = 0; s < n; s++) {
        pgjobq_health h;
        int rc = sh[s].client ? pgjobq_health_get(sh[s].client, &h) : PGJOBQ_ECONN;
        if (sh[s].client && rc != PGJOBQ_OK)
            shard_down(&sh[s], pgjobq_errmsg(sh[s].client));
        if (json && s)
            fputc(',', stdout);
        else if (!json && s)
            fputc('\n', stdout);
        if (sh[s].client == NULL) {
            if (json) {
                fputs("{\"shard\":", stdout);
                json_str(stdout, sh[s].name);
                fputs(",\"up\":false,\"error\":", stdout);
                json_str(stdout, sh[s].why);
                fputc('}', stdout);
            } else {
                printf("shard          %s\ndown           ", sh[s].name);
                tty_put(stdout, sh[s].why, 0);
                fputc('\n', stdout);
            }
            continue;
        }
        PGresult *unhealthy = unhealthy_workers(sh[s].client);
        health_print(&h, unhealthy, json, sh[s].name);
        PQclear(unhealthy);
    }
    if (json)
        fputs("]}\n", stdout);
    status = report_down(sh, n, json);
    free(sh);
    pgjobq_cluster_close(cl);
    return status;
}

int cmd_health(const cli_cmd *cmd, int argc, char **argv)
{
    int json = 0, status, rc;
    pgjobq_health h;
    pgjobq_client *c;

    if (parse_simple(cmd, argc, argv, 0, flag_opt, &json, &status) < 0)
        return status;
    if (cli_cluster_spec())
        return health_cluster(json);
    if ((c = cli_connect(0, &status)) == NULL)
        return status;
    if ((rc = pgjobq_health_get(c, &h)) != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_client_close(c);
        return status;
    }
    PGresult *unhealthy = unhealthy_workers(c);
    pgjobq_client_close(c);
    health_print(&h, unhealthy, json, NULL);
    PQclear(unhealthy);
    return EX_OK;
}

/* The options of cancel and retry: one job by ID, or every job a filter matches. */
typedef struct bulk_args {
    const cli_cmd *cmd;
    pgjobq_filter filter;
    int have_state, dry_run, json, running, redrive;
} bulk_args;

static int bulk_opt(int key, const char *arg, void *ctx)
{
    bulk_args *a = ctx;
    char why[128];

    switch (key) {
    case OPT_QUEUE:
    case OPT_KIND:
        if (pgjobq_name_check(arg) != PGJOBQ_OK) {
            cli_usage_error(a->cmd, "invalid %s '%s' (a letter, then letters, digits and _ . : -, at most 64)",
                            key == OPT_QUEUE ? "queue name" : "kind", arg);
            return -1;
        }
        if (key == OPT_QUEUE)
            a->filter.queue = arg;
        else
            a->filter.kind = arg;
        return 0;
    case OPT_STATE:
        if (pgjobq_state_parse(arg, &a->filter.state) != PGJOBQ_OK) {
            cli_usage_error(a->cmd, "unknown state '%s' (queued, running, completed, failed, cancelled)", arg);
            return -1;
        }
        a->have_state = 1;
        return 0;
    case OPT_SINCE:
        if (cli_parse_duration_ms(arg, &a->filter.since_ms, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--since: %s", why);
            return -1;
        }
        if (a->filter.since_ms <= 0) {
            cli_usage_error(a->cmd, "--since: must be longer than zero");
            return -1;
        }
        return 0;
    case OPT_DRY_RUN: a->dry_run = 1; return 0;
    case OPT_RUNNING: a->running = 1; return 0;
    case OPT_REDRIVE: a->redrive = 1; return 0;
    case OPT_JSON: a->json = 1; return 0;
    }
    return -1;
}

/* Parses cancel's or retry's options and operands.  Returns 1 for one job (*id set), 0 for a filter
 * (a->filter complete), or -1 with *status set. */
static int parse_bulk(const cli_cmd *cmd, int argc, char **argv, bulk_args *a, int64_t *id, int *status)
{
    const pgjobq_filter init = PGJOBQ_FILTER_INIT;
    int first, filtering;

    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->filter = init;
    first = cli_parse(cmd, argc, argv, bulk_opt, a);
    if (first == -2) {
        *status = EX_OK;
        return -1;
    }
    if (first < 0) {
        *status = EX_USAGE;
        return -1;
    }
    filtering = a->filter.queue || a->have_state || a->filter.kind || a->filter.since_ms;
    if (argc - first > 1) {
        *status = cli_usage_error(cmd, "unexpected argument '%s'", argv[first + 1]);
        return -1;
    }
    if (argc - first == 1) {
        if (filtering) {
            *status = cli_usage_error(cmd, "give a job ID or a filter (--queue, --state, ...), not both");
            return -1;
        }
        if (a->dry_run) {
            *status = cli_usage_error(cmd, "--dry-run goes with a filter (--queue and --state), not a job ID");
            return -1;
        }
        if ((*status = parse_id(cmd, argv[first], id)) != EX_OK)
            return -1;
        return 1;
    }
    if (!a->filter.queue || !a->have_state) {
        *status = cli_usage_error(cmd, "expected a job ID, or --queue QUEUE and --state STATE");
        return -1;
    }
    return 0;
}

/* cancel's and retry's client: the job's shard (one job, with a cluster), or the database; NULL with
 * *status EX_OK for a filter over a cluster (run_where connects to the shards). */
static pgjobq_client *connect_bulk(int one, int64_t id, int *status)
{
    if (one)
        return cli_connect_for_id(id, status);
    if (cli_cluster_spec() != NULL) {
        *status = EX_OK;
        return NULL;
    }
    return cli_connect(0, status);
}

/* The filter's cancel (retry 0) or retry (1) on c; over a cluster (c NULL), on every shard, each
 * shard's jobs in one statement there (all or none per shard, nothing more across shards), the counts
 * summed.  Over a cluster, *cl_status is set, errors are printed here naming their shard, and a shard
 * that does not answer makes it EX_UNAVAILABLE after the others' counts (the command prints them: the
 * return is PGJOBQ_OK when at least one shard answered); else *cl_status is -1. */
static int run_where(pgjobq_client *c, const bulk_args *a, int retry, int64_t *n, int64_t *skipped, int *cl_status)
{
    int flags = (a->dry_run ? PGJOBQ_DRY_RUN : 0) | (a->redrive ? PGJOBQ_REDRIVE : 0), answered = 0;

    *cl_status = -1;
    if (c)
        return retry ? pgjobq_retry_where(c, &a->filter, flags, n, skipped)
                     : pgjobq_cancel_where(c, &a->filter, flags, n);
    shard_answer *sh = NULL;
    size_t nsh = 0;
    pgjobq_cluster *cl = cluster_shards(&sh, &nsh, cl_status);
    if (cl == NULL)
        return PGJOBQ_ECONN;
    *n = 0;
    if (skipped)
        *skipped = 0;
    for (size_t s = 0; s < nsh; s++) {
        int64_t k = 0, sk = 0;
        int rc;
        if (sh[s].client == NULL)
            continue;
        rc = retry ? pgjobq_retry_where(sh[s].client, &a->filter, flags, &k, &sk)
                   : pgjobq_cancel_where(sh[s].client, &a->filter, flags, &k);
        if (rc == PGJOBQ_ECONN) {
            shard_down(&sh[s], pgjobq_errmsg(sh[s].client));
        } else if (rc != PGJOBQ_OK) {
            cli_err("shard %s: %s", sh[s].name, pgjobq_errmsg(sh[s].client));
            *cl_status = cli_exit_status(rc);
        } else {
            answered++;
            *n += k;
            if (skipped)
                *skipped += sk;
        }
    }
    int down = report_down(sh, nsh, 0);
    size_t ndown = 0;
    for (size_t s = 0; s < nsh; s++)
        ndown += sh[s].client == NULL;
    if (*cl_status == EX_OK)
        *cl_status = ndown ? EX_UNAVAILABLE : down;
    free(sh);
    pgjobq_cluster_close(cl);
    return answered ? PGJOBQ_OK : PGJOBQ_ECONN;
}

int cmd_cancel(const cli_cmd *cmd, int argc, char **argv)
{
    int status, rc, one;
    pgjobq_state st = PGJOBQ_QUEUED;
    pgjobq_client *c;
    int64_t id = 0, n = 0;
    bulk_args a;

    if ((one = parse_bulk(cmd, argc, argv, &a, &id, &status)) < 0)
        return status;
    if (!one && a.filter.state != PGJOBQ_QUEUED && a.filter.state != PGJOBQ_RUNNING)
        return cli_usage_error(cmd, "--state %s: only queued or running jobs can be cancelled",
                               pgjobq_state_name(a.filter.state));
    int cl_status = -1;
    if ((c = connect_bulk(one, id, &status)) == NULL && status != EX_OK)
        return status;
    if (one) {
        rc = pgjobq_job_cancel(c, id, &st);
        if (rc == PGJOBQ_OK && st == PGJOBQ_RUNNING)
            printf("job %lld is running: cancel requested; its worker is told at once and stops it (pgjobq show "
                   "says when)\n",
                   (long long)id);
        else if (rc == PGJOBQ_OK)
            printf("job %lld cancelled\n", (long long)id);
    } else {
        rc = run_where(c, &a, 0, &n, NULL, &cl_status);
        if (rc == PGJOBQ_OK && a.json)
            printf("{\"%s\":%lld,\"dry_run\":%s}\n",
                   a.filter.state == PGJOBQ_RUNNING ? "cancel_requested" : "cancelled", (long long)n,
                   a.dry_run ? "true" : "false");
        else if (rc == PGJOBQ_OK && a.filter.state == PGJOBQ_RUNNING)
            printf("%s a cancel of %lld running job%s of queue %s%s\n", a.dry_run ? "would request" : "requested",
                   (long long)n, n == 1 ? "" : "s", a.filter.queue,
                   a.dry_run ? "" : ": their workers are told at once and stop them");
        else if (rc == PGJOBQ_OK)
            printf("%s %lld queued job%s of queue %s\n", a.dry_run ? "would cancel" : "cancelled", (long long)n,
                   n == 1 ? "" : "s", a.filter.queue);
    }
    status = cl_status >= 0 ? cl_status : rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
    cli_close(c);
    return status;
}

/* pgjobq skip ID: the key the job blocks in its strict-order queue moves on (docs/queues.md, "Strict
 * order per key"). */
int cmd_skip(const cli_cmd *cmd, int argc, char **argv)
{
    int status, rc, unused = 0;
    pgjobq_client *c;
    int64_t id = 0;

    if ((c = open_for_id(cmd, argc, argv, flag_opt, &unused, &id, &status)) == NULL)
        return status;
    rc = pgjobq_job_skip(c, id);
    if (rc == PGJOBQ_OK)
        printf("job %lld stays failed; the next job of its key may start\n", (long long)id);
    status = rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
    cli_close(c);
    return status;
}

int cmd_retry(const cli_cmd *cmd, int argc, char **argv)
{
    int status, rc, one;
    pgjobq_client *c;
    int64_t id = 0, n = 0, skipped = 0;
    bulk_args a;

    if ((one = parse_bulk(cmd, argc, argv, &a, &id, &status)) < 0)
        return status;
    if (!one && a.filter.state == PGJOBQ_RUNNING)
        return cli_usage_error(cmd, "--state running: a running job is retried by its worker, or when its lease "
                                    "expires (retry --running ID ends one job's lease now)");
    if (!one && a.running)
        return cli_usage_error(cmd, "--running goes with a job ID");
    if (one && a.redrive)
        return cli_usage_error(cmd, "--redrive goes with a filter (--queue and --state), not a job ID");
    int cl_status = -1;
    if ((c = connect_bulk(one, id, &status)) == NULL && status != EX_OK)
        return status;
    if (one && a.running) {
        pgjobq_state st = PGJOBQ_QUEUED;
        rc = pgjobq_job_retry_running(c, id, &st);
        if (rc == PGJOBQ_OK && st == PGJOBQ_CANCELLED)
            printf("job %lld: lease ended; a cancel had been requested, so it ended cancelled\n", (long long)id);
        else if (rc == PGJOBQ_OK)
            printf("job %lld: lease ended, queued to run again now (the attempt it was running counts); its "
                   "worker's writes are refused\n",
                   (long long)id);
    } else if (one) {
        rc = pgjobq_job_retry(c, id);
        if (rc == PGJOBQ_OK)
            printf("job %lld queued to run again now\n", (long long)id);
    } else {
        rc = run_where(c, &a, 1, &n, &skipped, &cl_status);
        if (rc == PGJOBQ_OK && a.json) {
            printf("{\"retried\":%lld,\"skipped\":%lld,\"dry_run\":%s}\n", (long long)n, (long long)skipped,
                   a.dry_run ? "true" : "false");
        } else if (rc == PGJOBQ_OK && a.redrive) {
            printf("%s %lld dead letter%s of queue %s to the queue%s %s came from%s\n",
                   a.dry_run ? "would send" : "sent", (long long)n, n == 1 ? "" : "s", a.filter.queue,
                   n == 1 ? "" : "s", n == 1 ? "it" : "they", a.dry_run || n == 0 ? "" : ": queued to run now");
            if (skipped)
                printf("%s %lld job%s of queue %s: no dead letter%s\n", a.dry_run ? "would skip" : "skipped",
                       (long long)skipped, skipped == 1 ? "" : "s", a.filter.queue, skipped == 1 ? "" : "s");
        } else if (rc == PGJOBQ_OK && a.filter.state == PGJOBQ_QUEUED) {
            printf("%s %lld scheduled job%s of queue %s due now\n", a.dry_run ? "would make" : "made", (long long)n,
                   n == 1 ? "" : "s", a.filter.queue);
        } else if (rc == PGJOBQ_OK) {
            printf("%s %lld %s job%s of queue %s%s\n", a.dry_run ? "would retry" : "retried", (long long)n,
                   pgjobq_state_name(a.filter.state), n == 1 ? "" : "s", a.filter.queue,
                   a.dry_run || n == 0 ? "" : ": queued to run again now");
            if (skipped)
                printf("%s %lld: a queued or running job holds %s unique key\n", a.dry_run ? "would skip" : "skipped",
                       (long long)skipped, skipped == 1 ? "its" : "their");
        }
    }
    status = cl_status >= 0 ? cl_status : rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
    cli_close(c);
    return status;
}
