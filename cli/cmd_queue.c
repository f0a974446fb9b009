/*
 * cmd_queue.c - `pgjobq queue ls|pause|resume|drain|set`: queue settings, which every worker obeys
 * (pgjobq_queue_* in the library, pgjobq.queue_* in SQL).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "cli.h"

enum {
    OPT_REASON = 'r',
    OPT_WAIT = 'w',
    OPT_CONCURRENCY = 'c',
    OPT_KEY_CONCURRENCY = 'k',
    OPT_RATE = 1100,
    OPT_JSON = 1101,
    OPT_CREATE = 1102,
    OPT_MAX_LEASE = 1103,
    OPT_DEAD_LETTER = 1104,
    OPT_EXPIRE_AFTER = 1105,
    OPT_STRICT_ORDER = 1106,
    OPT_PRIORITY_AGING = 1107
};

const cli_opt queue_opts[] = {
    {"reason", OPT_REASON, "TEXT", "pause: why the queue is paused (shown by ls)"},
    {"wait", OPT_WAIT, "DURATION", "drain: give up after this long (default: wait as long as it takes)"},
    {"concurrency", OPT_CONCURRENCY, "N|none", "set: at most N jobs of the queue running at once, on all workers"},
    {"key-concurrency", OPT_KEY_CONCURRENCY, "N|none",
     "set: at most N jobs with the same concurrency key running at once"},
    {"rate", OPT_RATE, "N/DURATION|none", "set: at most N jobs started in any window of DURATION (e.g. 100/1m)"},
    {"max-lease", OPT_MAX_LEASE, "DURATION|default",
     "set: the longest lease a worker may take on a job of the queue, 1s..365d (default 1d)"},
    {"dead-letter", OPT_DEAD_LETTER, "QUEUE|none",
     "set: where a job of the queue that fails for good goes, as a new job (a cycle is refused)"},
    {"expire-after", OPT_EXPIRE_AFTER, "DURATION|none",
     "set: jobs enqueued without an expiry of their own expire if not started DURATION after they are due, 1s..365d"},
    {"strict-order", OPT_STRICT_ORDER, "on|off",
     "set: jobs with the same concurrency key run one at a time, in enqueue order; one that fails for good "
     "blocks its key until retried or skipped (pgjobq skip)"},
    {"priority-aging", OPT_PRIORITY_AGING, "DURATION|none",
     "set: a queued job ready DURATION at its priority is raised one step, again after each DURATION, 1s..365d"},
    {"json", OPT_JSON, NULL, "ls: print JSON"},
    {"create", OPT_CREATE, NULL, "pause, drain: also a queue that has no jobs or settings yet"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

typedef struct queue_args {
    const char *reason;
    int64_t wait_ms; /* -1: no limit */
    int set_concurrency, concurrency;
    int set_key_concurrency, key_concurrency;
    int set_rate, rate_limit;
    int64_t rate_period_ms;
    int set_max_lease;
    int64_t max_lease_ms; /* 0: the default */
    int set_dead_letter;
    const char *dead_letter; /* NULL: none */
    int set_expire_after;
    int64_t expire_after_ms; /* 0: none */
    int set_strict_order, strict_order;
    int set_priority_aging;
    int64_t priority_aging_ms; /* 0: off */
    int json;
    int create;
    const cli_cmd *cmd;
} queue_args;

/* N (1..1000000) or "none" (0); -1 after a usage error. */
static int parse_limit(const cli_cmd *cmd, const char *opt, const char *arg, int *out)
{
    char why[160];
    long long v;

    if (strcmp(arg, "none") == 0) {
        *out = 0;
        return 0;
    }
    if (cli_parse_int(arg, 1, 1000000, &v, why, sizeof why) != 0) {
        cli_usage_error(cmd, "%s: %s (or none)", opt, why);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int on_opt(int key, const char *arg, void *ctx)
{
    queue_args *a = ctx;
    char why[160];
    long long v;

    switch (key) {
    case OPT_REASON: a->reason = arg; return 0;
    case OPT_JSON: a->json = 1; return 0;
    case OPT_CREATE: a->create = 1; return 0;
    case OPT_WAIT:
        if (cli_parse_duration_ms(arg, &a->wait_ms, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--wait: %s", why), -1;
        return 0;
    case OPT_CONCURRENCY:
        a->set_concurrency = 1;
        return parse_limit(a->cmd, "--concurrency", arg, &a->concurrency);
    case OPT_KEY_CONCURRENCY:
        a->set_key_concurrency = 1;
        return parse_limit(a->cmd, "--key-concurrency", arg, &a->key_concurrency);
    case OPT_RATE: {
        a->set_rate = 1;
        if (strcmp(arg, "none") == 0) {
            a->rate_limit = 0;
            return 0;
        }
        const char *slash = strchr(arg, '/');
        char num[32];
        if (slash == NULL || (size_t)(slash - arg) >= sizeof num)
            return cli_usage_error(a->cmd, "--rate: '%.40s' is not N/DURATION (e.g. 100/1m) or none", arg), -1;
        memcpy(num, arg, (size_t)(slash - arg));
        num[slash - arg] = '\0';
        if (cli_parse_int(num, 1, 10000, &v, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--rate: jobs: %s", why), -1;
        a->rate_limit = (int)v;
        if (cli_parse_duration_ms(slash + 1, &a->rate_period_ms, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--rate: %s", why), -1;
        if (a->rate_period_ms < 1 || a->rate_period_ms > INT64_C(86400000))
            return cli_usage_error(a->cmd, "--rate: the window must be between 1ms and 1d"), -1;
        return 0;
    }
    case OPT_MAX_LEASE:
        a->set_max_lease = 1;
        if (strcmp(arg, "default") == 0) {
            a->max_lease_ms = 0;
            return 0;
        }
        if (cli_parse_duration_ms(arg, &a->max_lease_ms, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--max-lease: %s (or default)", why), -1;
        if (a->max_lease_ms < 1000 || a->max_lease_ms > INT64_C(31536000000))
            return cli_usage_error(a->cmd, "--max-lease: must be between 1s and 365d (or default)"), -1;
        return 0;
    case OPT_DEAD_LETTER:
        a->set_dead_letter = 1;
        a->dead_letter = strcmp(arg, "none") == 0 ? NULL : arg;
        if (a->dead_letter && pgjobq_name_check(a->dead_letter) != PGJOBQ_OK)
            return cli_usage_error(a->cmd,
                                   "--dead-letter: invalid queue name '%.80s' (a letter, then letters, digits"
                                   " and _ . : -, at most 64; or none)",
                                   arg),
                   -1;
        return 0;
    case OPT_EXPIRE_AFTER:
        a->set_expire_after = 1;
        if (strcmp(arg, "none") == 0) {
            a->expire_after_ms = 0;
            return 0;
        }
        if (cli_parse_duration_ms(arg, &a->expire_after_ms, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--expire-after: %s (or none)", why), -1;
        if (a->expire_after_ms < 1000 || a->expire_after_ms > INT64_C(31536000000))
            return cli_usage_error(a->cmd, "--expire-after: must be between 1s and 365d (or none)"), -1;
        return 0;
    case OPT_STRICT_ORDER:
        a->set_strict_order = 1;
        if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0)
            return cli_usage_error(a->cmd, "--strict-order: on or off, not '%.40s'", arg), -1;
        a->strict_order = strcmp(arg, "on") == 0;
        return 0;
    case OPT_PRIORITY_AGING:
        a->set_priority_aging = 1;
        if (strcmp(arg, "none") == 0) {
            a->priority_aging_ms = 0;
            return 0;
        }
        if (cli_parse_duration_ms(arg, &a->priority_aging_ms, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--priority-aging: %s (or none)", why), -1;
        if (a->priority_aging_ms < 1000 || a->priority_aging_ms > INT64_C(31536000000))
            return cli_usage_error(a->cmd, "--priority-aging: must be between 1s and 365d (or none)"), -1;
        return 0;
    default: return -1;
    }
}

/* The keys that failed jobs block, per strict-order queue (pgjobq.sequence_blocks; docs/queues.md,
 * "Strict order per key"), read once for the whole list: NULL when it cannot be read (a role that may
 * not read the table), or when no queue is strict. */
static PGresult *blocked_keys_read(pgjobq_client *c, const pgjobq_queue_info *q, size_t n)
{
    size_t strict = 0;

    for (size_t i = 0; i < n; i++)
        strict += q[i].strict_order != 0;
    if (strict == 0)
        return NULL;
    PGresult *r = PQexec(pgjobq_client_conn(c), "SELECT queue, count(*) FROM pgjobq.sequence_blocks GROUP BY 1");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        PQclear(r);
        return NULL;
    }
    return r;
}

/* How many keys of queue a failed job blocks, from blocked_keys_read's r: -1 when r is NULL. */
static long long blocked_keys(const PGresult *r, const char *queue)
{
    if (r == NULL)
        return -1;
    for (int i = 0; i < PQntuples(r); i++)
        if (strcmp(PQgetvalue(r, i, 0), queue) == 0)
            return atoll(PQgetvalue(r, i, 1));
    return 0;
}

static int list_queues(pgjobq_client *c, const queue_args *a)
{
    pgjobq_queue_info *q = NULL;
    size_t n = 0;
    int rc = pgjobq_queue_list(c, &q, &n);

    if (rc != PGJOBQ_OK)
        return cli_fail(c, rc);
    PGresult *blocked = blocked_keys_read(c, q, n);
    if (a->json) {
        fputs("{\"queues\":[", stdout);
        for (size_t i = 0; i < n; i++) {
            fputs(i ? ",{\"queue\":" : "{\"queue\":", stdout);
            json_str(stdout, q[i].name);
            fputs(",\"paused_at\":", stdout);
            json_time(stdout, q[i].paused_at);
            fputs(",\"pause_reason\":", stdout);
            json_str(stdout, q[i].pause_reason);
            if (q[i].concurrency)
                printf(",\"concurrency\":%d", q[i].concurrency);
            else
                fputs(",\"concurrency\":null", stdout);
            if (q[i].key_concurrency)
                printf(",\"key_concurrency\":%d", q[i].key_concurrency);
            else
                fputs(",\"key_concurrency\":null", stdout);
            if (q[i].rate_limit)
                printf(",\"rate_limit\":%d,\"rate_period_ms\":%lld", q[i].rate_limit, (long long)q[i].rate_period_ms);
            else
                fputs(",\"rate_limit\":null,\"rate_period_ms\":null", stdout);
            printf(",\"max_lease_ms\":%lld,\"queued\":%lld,\"scheduled\":%lld,\"running\":%lld,\"expired\":%lld",
                   (long long)q[i].max_lease_ms, (long long)q[i].queued, (long long)q[i].scheduled,
                   (long long)q[i].running, (long long)q[i].expired);
            if (q[i].expire_after_ms)
                printf(",\"expire_after_ms\":%lld", (long long)q[i].expire_after_ms);
            else
                fputs(",\"expire_after_ms\":null", stdout);
            if (q[i].priority_aging_s)
                printf(",\"priority_aging_ms\":%lld", (long long)q[i].priority_aging_s * 1000);
            else
                fputs(",\"priority_aging_ms\":null", stdout);
            fputs(",\"dead_letter\":", stdout);
            json_str(stdout, q[i].dead_letter);
            long long nblocked = q[i].strict_order ? blocked_keys(blocked, q[i].name) : 0;
            printf(",\"strict_order\":%s,\"blocked_keys\":", q[i].strict_order ? "true" : "false");
            if (nblocked >= 0)
                printf("%lld}", nblocked);
            else
                fputs("null}", stdout);
        }
        fputs("]}\n", stdout);
    } else {
        printf("%-24s %-7s %11s %7s %-18s %-12s %9s %12s %9s %9s %9s %9s %-24s  %s\n", "QUEUE", "STATE",
               "CONCURRENCY", "PER KEY", "ORDER", "RATE", "MAX LEASE", "EXPIRE AFTER", "AGING", "QUEUED", "SCHEDULED",
               "RUNNING", "DEAD LETTER", "PAUSED BECAUSE");
        for (size_t i = 0; i < n; i++) {
            char conc[16], per_key[16], order[32] = "-", rate[48] = "-", max_lease[24], expire_after[24] = "-",
                                                       aging[24] = "-";
            snprintf(conc, sizeof conc, q[i].concurrency ? "%d" : "-", q[i].concurrency);
            snprintf(per_key, sizeof per_key, q[i].key_concurrency ? "%d" : "-", q[i].key_concurrency);
            if (q[i].strict_order) {
                long long nblocked = blocked_keys(blocked, q[i].name);
                snprintf(order, sizeof order, nblocked > 0 ? "strict, %lld blocked" : "strict", nblocked);
            }
            if (q[i].rate_limit) {
                char period[24];
                snprintf(rate, sizeof rate, "%d/%s", q[i].rate_limit,
                         format_period(period, sizeof period, q[i].rate_period_ms));
            }
            if (q[i].expire_after_ms)
                format_period(expire_after, sizeof expire_after, q[i].expire_after_ms);
            if (q[i].priority_aging_s)
                format_period(aging, sizeof aging, (int64_t)q[i].priority_aging_s * 1000);
            char name[300], dead[300];
            tty_cell(name, sizeof name, q[i].name, 64);
            tty_cell(dead, sizeof dead, q[i].dead_letter ? q[i].dead_letter : "-", 64);
            printf("%-24s %-7s %11s %7s %-18s %-12s %9s %12s %9s %9lld %9lld %9lld %-24s  ", name,
                   q[i].paused_at != PGJOBQ_TIME_NONE ? "paused" : "active", conc, per_key, order, rate,
                   format_period(max_lease, sizeof max_lease, q[i].max_lease_ms), expire_after, aging,
                   (long long)q[i].queued,
                   (long long)q[i].scheduled, (long long)(q[i].running + q[i].expired), dead);
            tty_put(stdout, q[i].pause_reason, 0); /* anyone who may pause a queue wrote it */
            putchar('\n');
        }
    }
    PQclear(blocked);
    pgjobq_queue_list_free(q);
    return EX_OK;
}

/* 1 when the queue has settings or jobs, live or finished (pgjobq.queue_list, then the newest job of
 * the queue), 0 when not, -1 on error (*rc). */
static int queue_known(pgjobq_client *c, const char *queue, int *rc)
{
    pgjobq_queue_info *q = NULL;
    pgjobq_list_opts lo = PGJOBQ_LIST_OPTS_INIT;
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int known = 0;

    if ((*rc = pgjobq_queue_list(c, &q, &n)) != PGJOBQ_OK)
        return -1;
    for (size_t i = 0; i < n && !known; i++)
        known = strcmp(q[i].name, queue) == 0;
    pgjobq_queue_list_free(q);
    if (known)
        return 1;
    lo.queue = queue;
    lo.limit = 1;
    if ((*rc = pgjobq_job_list(c, &lo, &jobs, &n)) != PGJOBQ_OK)
        return -1;
    pgjobq_jobs_free(jobs);
    return n > 0;
}

/* Jobs of the queue running under a valid lease (an expired one can no longer write), or -1 on error. */
static int64_t running_in(pgjobq_client *c, const char *queue, int *rc)
{
    pgjobq_queue_info *q = NULL;
    size_t n = 0;
    int64_t running = 0;

    if ((*rc = pgjobq_queue_list(c, &q, &n)) != PGJOBQ_OK)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (strcmp(q[i].name, queue) == 0)
            running = q[i].running;
    pgjobq_queue_list_free(q);
    return running;
}


static int drain(pgjobq_client *c, const char *queue, const queue_args *a)
{
    int rc = pgjobq_queue_pause(c, queue, a->reason ? a->reason : "draining");
    int64_t start = cli_mono_ms(), running, last = -1;

    if (rc != PGJOBQ_OK)
        return cli_fail(c, rc);
    while ((running = running_in(c, queue, &rc)) != 0) {
        if (running < 0)
            return cli_fail(c, rc);
        if (running != last)
            fprintf(stderr, "pgjobq: queue %s paused; %lld jobs still running\n", queue, (long long)running);
        last = running;
        if (a->wait_ms >= 0 && cli_mono_ms() - start >= a->wait_ms) {
            cli_err("queue %s is paused, but %lld jobs were still running after %lld ms", queue, (long long)running,
                    (long long)a->wait_ms);
            return EX_TEMPFAIL;
        }
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
    }
    printf("queue %s paused and drained: nothing of it is running\n", queue);
    return EX_OK;
}

int cmd_queue(const cli_cmd *cmd, int argc, char **argv)
{
    queue_args a = {.wait_ms = -1, .cmd = cmd};
    int first = cli_parse(cmd, argc, argv, on_opt, &a), status, rc = PGJOBQ_OK;
    const char *sub, *queue = NULL;
    pgjobq_client *c;

    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (first >= argc)
        return cli_usage_error(cmd, "expected ls, pause, resume, drain or set");
    sub = argv[first];
    int is_ls = strcmp(sub, "ls") == 0, is_set = strcmp(sub, "set") == 0, is_drain = strcmp(sub, "drain") == 0,
        is_pause = strcmp(sub, "pause") == 0;
    if (!is_ls && !is_set && !is_drain && !is_pause && strcmp(sub, "resume") != 0)
        return cli_usage_error(cmd, "unknown subcommand '%s' (ls, pause, resume, drain or set)", sub);
    if (is_ls && argc - first != 1)
        return cli_usage_error(cmd, "queue ls takes no queue name");
    if (!is_ls) {
        if (argc - first != 2)
            return cli_usage_error(cmd, "queue %s takes one queue name", sub);
        queue = argv[first + 1];
        if (pgjobq_name_check(queue) != PGJOBQ_OK)
            return cli_usage_error(cmd, "invalid queue name '%.80s' (a letter, then letters, digits and _ . : -, "
                                        "at most 64)",
                                   queue);
    }
    if (a.reason && !is_pause && !is_drain)
        return cli_usage_error(cmd, "--reason goes with pause or drain");
    if (a.wait_ms >= 0 && !is_drain)
        return cli_usage_error(cmd, "--wait goes with drain");
    int any_setting = a.set_concurrency || a.set_key_concurrency || a.set_rate || a.set_max_lease ||
                      a.set_dead_letter || a.set_expire_after || a.set_strict_order || a.set_priority_aging;
    if (any_setting && !is_set)
        return cli_usage_error(cmd, "--concurrency, --key-concurrency, --rate, --max-lease, --dead-letter, "
                                    "--expire-after, --strict-order and --priority-aging go with set");
    if (is_set && !any_setting)
        return cli_usage_error(cmd, "queue set needs --concurrency, --key-concurrency, --rate, --max-lease, "
                                    "--dead-letter, --expire-after, --strict-order or --priority-aging");
    if (a.json && !is_ls)
        return cli_usage_error(cmd, "--json goes with ls");
    if (a.create && !is_pause && !is_drain)
        return cli_usage_error(cmd, "--create goes with pause or drain");

    if ((c = cli_connect(0, &status)) == NULL)
        return status;
    /* Pausing a queue nobody uses would create it (and show it everywhere): a typo, most likely;
     * --create says it is not.  Limits set ahead of a queue's first job are common (a deploy
     * script): those are only noted. */
    if ((is_pause || is_drain || is_set) && !a.create) {
        int known = queue_known(c, queue, &rc);
        if (known < 0 || (known == 0 && !is_set)) {
            status = known < 0 ? cli_fail(c, rc) : EX_DATAERR;
            if (known == 0)
                cli_err("queue %s has no jobs and no settings (a typo?); to %s it before its first job, add "
                        "--create",
                        queue, is_pause ? "pause" : "drain");
            pgjobq_client_close(c);
            return status;
        }
        if (known == 0)
            fprintf(stderr, "pgjobq: note: queue %s has no jobs yet; these settings create it\n", queue);
    }
    if (is_ls) {
        status = list_queues(c, &a);
    } else if (is_drain) {
        status = drain(c, queue, &a);
    } else if (is_set) {
        if (a.set_concurrency)
            rc = pgjobq_queue_set_concurrency(c, queue, a.concurrency);
        if (rc == PGJOBQ_OK && a.set_key_concurrency)
            rc = pgjobq_queue_set_key_concurrency(c, queue, a.key_concurrency);
        if (rc == PGJOBQ_OK && a.set_rate)
            rc = pgjobq_queue_set_rate(c, queue, a.rate_limit, a.rate_period_ms);
        if (rc == PGJOBQ_OK && a.set_max_lease)
            rc = pgjobq_queue_set_max_lease(c, queue, a.max_lease_ms);
        if (rc == PGJOBQ_OK && a.set_dead_letter)
            rc = pgjobq_queue_set_dead_letter(c, queue, a.dead_letter);
        if (rc == PGJOBQ_OK && a.set_expire_after)
            rc = pgjobq_queue_set_expire_after(c, queue, a.expire_after_ms);
        if (rc == PGJOBQ_OK && a.set_strict_order)
            rc = pgjobq_queue_set_strict_order(c, queue, a.strict_order);
        if (rc == PGJOBQ_OK && a.set_priority_aging)
            rc = pgjobq_queue_set_priority_aging(c, queue, a.priority_aging_ms);
        status = rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
        if (rc == PGJOBQ_OK)
            printf("queue %s updated\n", queue);
    } else {
        rc = is_pause ? pgjobq_queue_pause(c, queue, a.reason) : pgjobq_queue_resume(c, queue);
        status = rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
        if (rc == PGJOBQ_OK)
            printf("queue %s %s\n", queue, is_pause ? "paused" : "resumed");
    }
    pgjobq_client_close(c);
    return status;
}

/* ------------------------------------------------------------------------------------------------ */
/* pgjobq cron add|ls|rm|enable|disable|trigger|sync                                                */

enum { OPT_CRON = 1200, OPT_TZ, OPT_QUEUE, OPT_KIND, OPT_PAYLOAD, OPT_PRIORITY, OPT_MAX_ATTEMPTS, OPT_CATCH_UP,
       OPT_SJSON };

const cli_opt schedule_opts[] = {
    {"schedule", OPT_CRON, "EXPR", "add: when: 5 fields (minute hour day month weekday), 6 (second first), or @hourly, @daily, @weekly, @monthly, @yearly"},
    {"tz", OPT_TZ, "ZONE", "add: the IANA time zone of the expression, e.g. Europe/Berlin (default UTC; bare offsets such as +14 are refused)"},
    {"queue", OPT_QUEUE, "NAME", "add: the queue of the jobs (default: default)"},
    {"kind", OPT_KIND, "NAME", "add: the kind of the jobs (default: default)"},
    {"payload", OPT_PAYLOAD, "JSON", "add: the payload of each job (default {})"},
    {"priority", OPT_PRIORITY, "N", "add: the jobs' priority, -100..100, lower first (default 0)"},
    {"max-attempts", OPT_MAX_ATTEMPTS, "N", "add: the jobs' attempts, 1..1000 (default 25)"},
    {"catch-up", OPT_CATCH_UP, "POLICY", "add: fire times missed while no worker ran: latest (default), all, skip"},
    {"json", OPT_SJSON, NULL, "ls: print JSON"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

typedef struct schedule_args {
    const char *cron;
    pgjobq_schedule_opts o;
    int json;
    const cli_cmd *cmd;
} schedule_args;

static int on_schedule_opt(int key, const char *arg, void *ctx)
{
    schedule_args *a = ctx;
    char why[160];
    long long v;

    switch (key) {
    case OPT_CRON: a->cron = arg; return 0;
    case OPT_TZ: a->o.tz = arg; return 0;
    case OPT_QUEUE: a->o.queue = arg; return 0;
    case OPT_KIND: a->o.kind = arg; return 0;
    case OPT_PAYLOAD: a->o.payload = arg; return 0;
    case OPT_CATCH_UP: a->o.catch_up = arg; return 0;
    case OPT_SJSON: a->json = 1; return 0;
    case OPT_PRIORITY:
        if (cli_parse_int(arg, -100, 100, &v, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--priority: %s", why);
        a->o.priority = (int)v;
        return 0;
    case OPT_MAX_ATTEMPTS:
        if (cli_parse_int(arg, 1, 1000, &v, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--max-attempts: %s", why);
        a->o.max_attempts = (int)v;
        return 0;
    default: return -1;
    }
}

static int list_schedules(pgjobq_client *c, int json)
{
    pgjobq_schedule_info *s = NULL;
    size_t n = 0;
    int rc = pgjobq_schedule_list(c, &s, &n);

    if (rc != PGJOBQ_OK)
        return cli_fail(c, rc);
    if (json) {
        fputs("{\"schedules\":[", stdout);
        for (size_t i = 0; i < n; i++) {
            fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
            json_str(stdout, s[i].name);
            fputs(",\"cron\":", stdout);
            json_str(stdout, s[i].cron);
            fputs(",\"tz\":", stdout);
            json_str(stdout, s[i].tz);
            fputs(",\"queue\":", stdout);
            json_str(stdout, s[i].queue);
            fputs(",\"kind\":", stdout);
            json_str(stdout, s[i].kind);
            printf(",\"payload\":%s,\"priority\":%d,\"max_attempts\":%d,\"enabled\":%s,\"catch_up\":", s[i].payload,
                   s[i].priority, s[i].max_attempts, s[i].enabled ? "true" : "false");
            json_str(stdout, s[i].catch_up);
            fputs(",\"next_run\":", stdout);
            json_time(stdout, s[i].next_run);
            fputs(",\"last_run\":", stdout);
            json_time(stdout, s[i].last_run);
            fputc('}', stdout);
        }
        fputs("]}\n", stdout);
    } else {
        printf("%-20s %-8s %-20s %-16s %-16s %-24s %s\n", "SCHEDULE", "STATE", "CRON", "TZ", "QUEUE", "NEXT RUN",
               "LAST RUN");
        for (size_t i = 0; i < n; i++) {
            char next[40], last[40], name[300], cron[1100], tz[300], queue[300];
            format_time(next, sizeof next, s[i].next_run);
            format_time(last, sizeof last, s[i].last_run);
            tty_cell(name, sizeof name, s[i].name, 64);
            tty_cell(cron, sizeof cron, s[i].cron, 256);
            tty_cell(tz, sizeof tz, s[i].tz, 64);
            tty_cell(queue, sizeof queue, s[i].queue, 64);
            printf("%-20s %-8s %-20s %-16s %-16s %-24s %s\n", name, s[i].enabled ? "enabled" : "disabled", cron, tz,
                   queue, next, last);
        }
    }
    pgjobq_schedule_list_free(s);
    return EX_OK;
}

/* Reads a sync file (one JSON object per line; blank lines and lines starting with # are skipped) into
 * one JSON array; NULL after printing why. */
static char *read_sync_file(const char *path)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    char *line = NULL, *out = NULL;
    size_t cap = 0, len = 0;
    ssize_t n;
    FILE *m;

    if (f == NULL) {
        cli_err("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    if ((m = open_memstream(&out, &len)) == NULL) {
        cli_err("out of memory");
        if (f != stdin)
            fclose(f);
        return NULL;
    }
    int first = 1;
    fputc('[', m);
    while ((n = getline(&line, &cap, f)) > 0) {
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0')
            continue;
        if (!first)
            fputc(',', m);
        fputs(p, m);
        first = 0;
    }
    fputs("]", m);
    free(line);
    if (f != stdin)
        fclose(f);
    if (fclose(m) != 0) {
        free(out);
        cli_err("out of memory");
        return NULL;
    }
    return out;
}

int cmd_schedule(const cli_cmd *cmd, int argc, char **argv)
{
    schedule_args a = {.o = PGJOBQ_SCHEDULE_OPTS_INIT, .cmd = cmd};
    int first = cli_parse(cmd, argc, argv, on_schedule_opt, &a), status, rc;
    pgjobq_client *c;

    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (first >= argc)
        return cli_usage_error(cmd, "expected add, ls, rm, enable, disable, trigger or sync");
    const char *sub = argv[first], *name = argc - first >= 2 ? argv[first + 1] : NULL;
    int is_ls = strcmp(sub, "ls") == 0, is_add = strcmp(sub, "add") == 0, is_rm = strcmp(sub, "rm") == 0,
        is_enable = strcmp(sub, "enable") == 0, is_disable = strcmp(sub, "disable") == 0,
        is_trigger = strcmp(sub, "trigger") == 0, is_sync = strcmp(sub, "sync") == 0;
    if (!is_ls && !is_add && !is_rm && !is_enable && !is_disable && !is_trigger && !is_sync)
        return cli_usage_error(cmd, "unknown subcommand '%s' (add, ls, rm, enable, disable, trigger or sync)", sub);
    if (is_ls ? argc - first != 1 : argc - first != 2)
        return cli_usage_error(cmd, is_ls ? "cron ls takes no name" : is_sync ? "cron sync takes one FILE"
                                                                             : "cron %s takes one schedule name",
                               sub);
    if (name && !is_sync && pgjobq_name_check(name) != PGJOBQ_OK)
        return cli_usage_error(cmd, "invalid schedule name '%.80s' (a letter, then letters, digits and _ . : -, at "
                                    "most 64)",
                               name);
    int has_add_opts = a.cron || a.o.tz || a.o.queue || a.o.kind || a.o.payload || a.o.priority ||
                       a.o.max_attempts || a.o.catch_up;
    if (is_add && a.cron == NULL)
        return cli_usage_error(cmd, "cron add needs --schedule");
    if (!is_add && has_add_opts)
        return cli_usage_error(cmd, "--schedule, --tz, --queue, --kind, --payload, --priority, --max-attempts and "
                                    "--catch-up go with add");
    if (a.json && !is_ls)
        return cli_usage_error(cmd, "--json goes with ls");

    char *sync_json = NULL;
    if (is_sync && (sync_json = read_sync_file(name)) == NULL)
        return EX_NOINPUT;
    if ((c = cli_connect(0, &status)) == NULL) {
        free(sync_json);
        return status;
    }
    if (is_ls) {
        status = list_schedules(c, a.json);
    } else if (is_add) {
        int64_t next = PGJOBQ_TIME_NONE;
        rc = pgjobq_schedule_set(c, name, a.cron, &a.o, &next);
        status = rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
        if (rc == PGJOBQ_OK) {
            char when[40];
            format_time(when, sizeof when, next);
            printf("schedule %s added; next run %s\n", name, when);
        }
    } else if (is_trigger) {
        int64_t id = 0;
        rc = pgjobq_schedule_trigger(c, name, &id);
        status = rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
        if (rc == PGJOBQ_OK)
            printf("schedule %s triggered: job %lld\n", name, (long long)id);
    } else if (is_sync) {
        int changed = 0;
        rc = pgjobq_schedule_sync(c, sync_json, &changed);
        status = rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
        if (rc == PGJOBQ_OK)
            printf("schedules synced from %s: %d created, changed or removed\n", name, changed);
    } else {
        rc = is_rm ? pgjobq_schedule_delete(c, name) : pgjobq_schedule_enable(c, name, is_enable);
        status = rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
        if (rc == PGJOBQ_OK)
            printf("schedule %s %s\n", name, is_rm ? "removed" : is_enable ? "enabled" : "disabled");
    }
    free(sync_json);
    pgjobq_client_close(c);
    return status;
}
