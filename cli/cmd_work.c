/*
 * cmd_work.c - pgjobq work: a worker whose handler runs a command given on the worker's own command
 * line (never one taken from a job row), once per job (--exec, work_exec.c) or as long-lived
 * coprocesses (--coproc, coproc.c).  This file reads the options and runs the worker until a signal
 * stops it: one engine on this thread, or with --cluster one per shard (work_engine.c, which also
 * holds the signal handler); its log is work_log.c's, --metrics-listen work_metrics.c's, and
 * starting a handler process spawn.c's.
 *
 * The exec contract: the command runs without a shell (unless --shell), in its own process group,
 * with the payload on stdin and PGJOBQ_JOB_ID, PGJOBQ_QUEUE, PGJOBQ_KIND, PGJOBQ_ATTEMPT,
 * PGJOBQ_MAX_ATTEMPTS and PGJOBQ_LEASE_TOKEN in its environment (and TRACEPARENT, the job's trace context, when it
 * has one), and without any variable of the worker's that
 * begins with PG (libpq's and pgjobq's: the database and its credentials, the serve token) or is DATABASE_URL,
 * unless named with --pass-env (or all kept with --keep-env: a handler that is the application's own).  Exit 0
 * completes the job with stdout as its result; exit 75 (EX_TEMPFAIL) asks for a retry with backoff;
 * exit 99 (WORK_EXIT_SNOOZE) snoozes the job, using no attempt, for the duration on stdout; exit 98
 * (WORK_EXIT_PARKED) says `pgjobq step --sleep` or --wait-event parked the job: nothing is written;
 * any other exit, a signal, or the job timeout is a failed attempt, retried until max_attempts, with
 * the tail of stderr as the error.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "spawn.h"
#include "work.h"

#define OPT_QUEUE 'q'
#define OPT_EXEC 'e'
#define OPT_SHELL 2001
#define OPT_LEASE 2002
#define OPT_HEARTBEAT 2003
#define OPT_TIMEOUT 2004
#define OPT_POLL 2005
#define OPT_POLL_ONLY 2006
#define OPT_SHUTDOWN 2007
#define OPT_WORKER_ID 2008
#define OPT_LOG_FORMAT 2009
#define OPT_LOG_LEVEL 2010
#define OPT_BATCH 2011
#define OPT_MAX_OUTPUT 2012
#define OPT_RETAIN_COMPLETED 2013
#define OPT_RETAIN_FAILED 2014
#define OPT_NO_MAINTENANCE 2015
#define OPT_METRICS_LISTEN 2016
#define OPT_COPROC 2017
#define OPT_COPROCS 2018
#define OPT_BURST 2019
#define OPT_PRINT_DEFAULTS 2020
#define OPT_PASS_ENV 2021
#define OPT_KEEP_ENV 2022
#define OPT_MAP_RELOAD 2023
#define OPT_FORWARD_TO 2024

#define PASS_ENV_MAX 64

const cli_opt work_opts[] = {
    {"queue", OPT_QUEUE, "QUEUE[:N]", "serve QUEUE with N jobs at a time (repeatable; default default:10)"},
    {"exec", OPT_EXEC, "'CMD ARGS'", "the command to run for each job (this or --coproc)"},
    {"coproc", OPT_COPROC, "'CMD ARGS'",
     "a long-lived handler: started once, it takes jobs as JSON lines on stdin and answers on stdout "
     "(docs/coproc.md)"},
    {"coprocs", OPT_COPROCS, "K", "with --coproc: run K copies, each taking its share of the slots (default 1)"},
    {"shell", OPT_SHELL, NULL, "run --exec through /bin/sh -c instead of splitting it into words"},
    {"pass-env", OPT_PASS_ENV, "NAME[,NAME...]",
     "give the handler these variables of the worker's environment, which it does not get by default (PG*, "
     "DATABASE_URL; repeatable)"},
    {"keep-env", OPT_KEEP_ENV, NULL,
     "give the handler the worker's whole environment, database credentials included (a handler that is the "
     "application's own)"},
    {"lease", OPT_LEASE, "DURATION", "lease per claim and heartbeat (default 60s)"},
    {"heartbeat", OPT_HEARTBEAT, "DURATION", "lease renewal interval (default lease/3)"},
    {"timeout", OPT_TIMEOUT, "DURATION", "job timeout, shorter than the lease (default 80% of the lease)"},
    {"poll", OPT_POLL, "DURATION", "claim at least this often without a notification (default 1s)"},
    {"poll-only", OPT_POLL_ONLY, NULL, "do not LISTEN (for PgBouncer in transaction mode)"},
    {"shutdown-timeout", OPT_SHUTDOWN, "DURATION", "on SIGTERM, wait this long for running jobs (default 30s)"},
    {"worker-id", OPT_WORKER_ID, "ID", "recorded on claimed jobs (default hostname:pid)"},
    {"batch", OPT_BATCH, "N", "most jobs per claim, 1..10000 (default 1000)"},
    {"max-output", OPT_MAX_OUTPUT, "BYTES", "stdout kept as the result, at most (default 1048576)"},
    {"retain-completed", OPT_RETAIN_COMPLETED, "DURATION",
     "prune completed jobs after this (default: the database's retention, 24h unless changed)"},
    {"retain-failed", OPT_RETAIN_FAILED, "DURATION",
     "prune failed jobs after this (default: the database's retention, 7d unless changed)"},
    {"no-maintenance", OPT_NO_MAINTENANCE, NULL, "do not rescue expired leases or prune in this process"},
    {"burst", OPT_BURST, NULL, "run what is due, then exit 0 once nothing due is left (tests, cron)"},
    {"metrics-listen", OPT_METRICS_LISTEN, "ADDR",
     "serve this worker's counters at http://ADDR/metrics (e.g. 127.0.0.1:9465; off loopback, "
     "$PGJOBQ_SERVE_TOKEN is required)"},
    {"log-format", OPT_LOG_FORMAT, "FORMAT", "text or json (default text)"},
    {"log-level", OPT_LOG_LEVEL, "LEVEL", "debug, info, warn or error (default info)"},
    {"print-defaults", OPT_PRINT_DEFAULTS, NULL,
     "print the worker's settings as JSON (the library's defaults, with the options given) and exit"},
    CLI_CLUSTER_OPT,
    {"forward-to", OPT_FORWARD_TO, "SPEC",
     "also serve this database's outbox (the queue pgjobq.outbox: jobs of pgjobq.forward()), writing each "
     "job to its shard of the cluster SPEC exactly once (docs/shards.md, \"The outbox\")"},
    {"map-reload", OPT_MAP_RELOAD, "DURATION",
     "with --cluster: read the map again this often, starting an engine for a shard that joined it and "
     "draining the engine of one that left (default 30s)"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

typedef struct work_args {
    const cli_cmd *cmd;
    work_engine_cfg eng;
    const char *exec;
    int shell;
    long long max_output;
    const char *metrics_listen;
    const char *coproc;
    const char *forward_to;
    int print_defaults;
    int keep_env;
    int64_t map_reload_ms;
    char *pass_env[PASS_ENV_MAX]; /* --pass-env names, each malloc'd */
    size_t npass_env;
} work_args;

/* ------------------------------------------------------------------------------------------------ */
/* Options                                                                                           */

static int duration_opt(work_args *a, const char *name, const char *arg, int64_t *out)
{
    char why[160];
    if (cli_parse_duration_ms(arg, out, why, sizeof why) != 0) {
        cli_usage_error(a->cmd, "--%s: %s", name, why);
        return -1;
    }
    if (*out == 0) {
        cli_usage_error(a->cmd, "--%s must be more than 0", name);
        return -1;
    }
    return 0;
}

static int work_opt(int key, const char *arg, void *ctx)
{
    work_args *a = ctx;
    char why[160];
    long long v;

    switch (key) {
    case OPT_QUEUE: {
        work_queue *q = &a->eng.queues[a->eng.nqueues];
        /* The concurrency is what follows the last ':'. */
        const char *colon = strrchr(arg, ':');
        if (a->eng.nqueues == 64) {
            cli_usage_error(a->cmd, "at most 64 --queue options");
            return -1;
        }
        q->concurrency = PGJOBQ_DEFAULT_CONCURRENCY;
        /* Queue names may hold ':', so "mail:abc" could be a name; far more often it is a mistyped
         * concurrency.  A queue whose name has ':' is served as NAME:N. */
        if (colon && (colon[1] == '\0' || strspn(colon + 1, "0123456789") != strlen(colon + 1))) {
            cli_usage_error(a->cmd,
                            "--queue %s: the concurrency after ':' must be a number from 1 to 1024 (for a queue "
                            "named %s, give --queue %s:N)",
                            arg, arg, arg);
            return -1;
        }
        if (colon) {
            if (cli_parse_int(colon + 1, 1, 1024, &v, why, sizeof why) != 0) {
                cli_usage_error(a->cmd, "--queue %s: concurrency %s", arg, why);
                return -1;
            }
            q->concurrency = (int)v;
            snprintf(q->name, sizeof q->name, "%.*s", (int)(colon - arg), arg);
            if ((size_t)(colon - arg) > PGJOBQ_NAME_MAX)
                q->name[0] = '\0';
        } else {
            snprintf(q->name, sizeof q->name, "%s", strlen(arg) <= PGJOBQ_NAME_MAX ? arg : "");
        }
        if (pgjobq_name_check(q->name) != PGJOBQ_OK) {
            cli_usage_error(a->cmd, "--queue: invalid queue name in '%s'", arg);
            return -1;
        }
        a->eng.nqueues++;
        return 0;
    }
    case OPT_EXEC: a->exec = arg; return 0;
    case OPT_COPROC: a->coproc = arg; return 0;
    case OPT_FORWARD_TO: a->forward_to = arg; return 0;
    case OPT_COPROCS:
        if (cli_parse_int(arg, 1, 256, &v, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--coprocs: %s", why);
            return -1;
        }
        a->eng.coprocs = (int)v;
        return 0;
    case OPT_SHELL: a->shell = 1; return 0;
    case OPT_PRINT_DEFAULTS: a->print_defaults = 1; return 0;
    case OPT_KEEP_ENV: a->keep_env = 1; return 0;
    case OPT_PASS_ENV:
        for (const char *p = arg;;) {
            size_t len = strcspn(p, ",");
            char *name = strndup(p, len);
            if (name == NULL || !spawn_env_name_ok(name) || a->npass_env == PASS_ENV_MAX) {
                if (name == NULL)
                    cli_usage_error(a->cmd, "--pass-env: out of memory");
                else if (a->npass_env == PASS_ENV_MAX)
                    cli_usage_error(a->cmd, "--pass-env: at most %d names", PASS_ENV_MAX);
                else
                    cli_usage_error(a->cmd, "--pass-env: '%s' is not a variable name (letters, digits and _)", name);
                free(name);
                return -1;
            }
            a->pass_env[a->npass_env++] = name;
            if (p[len] == '\0')
                return 0;
            p += len + 1;
        }
    case OPT_LEASE: return duration_opt(a, "lease", arg, &a->eng.opts.lease_ms);
    case OPT_HEARTBEAT: return duration_opt(a, "heartbeat", arg, &a->eng.opts.heartbeat_ms);
    case OPT_TIMEOUT: return duration_opt(a, "timeout", arg, &a->eng.opts.timeout_ms);
    case OPT_POLL: return duration_opt(a, "poll", arg, &a->eng.opts.poll_ms);
    case OPT_SHUTDOWN: return duration_opt(a, "shutdown-timeout", arg, &a->eng.opts.shutdown_timeout_ms);
    case OPT_RETAIN_COMPLETED: return duration_opt(a, "retain-completed", arg, &a->eng.opts.retain_completed_ms);
    case OPT_MAP_RELOAD: return duration_opt(a, "map-reload", arg, &a->map_reload_ms);
    case OPT_RETAIN_FAILED: return duration_opt(a, "retain-failed", arg, &a->eng.opts.retain_failed_ms);
    case OPT_POLL_ONLY: a->eng.opts.poll_only = 1; return 0;
    case OPT_NO_MAINTENANCE: a->eng.opts.no_maintenance = 1; return 0;
    case OPT_BURST: a->eng.opts.burst = 1; return 0;
    case OPT_METRICS_LISTEN: a->metrics_listen = arg; return 0;
    case OPT_WORKER_ID: a->eng.opts.worker_id = arg; return 0;
    case OPT_BATCH:
        if (cli_parse_int(arg, 1, PGJOBQ_BATCH_MAX, &v, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--batch: %s", why);
            return -1;
        }
        a->eng.opts.batch_max = (int)v;
        return 0;
    case OPT_MAX_OUTPUT:
        if (cli_parse_int(arg, 0, PGJOBQ_PAYLOAD_MAX, &v, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--max-output: %s", why);
            return -1;
        }
        a->max_output = v;
        return 0;
    case OPT_LOG_FORMAT:
        if (strcmp(arg, "text") != 0 && strcmp(arg, "json") != 0) {
            cli_usage_error(a->cmd, "--log-format must be text or json, not '%s'", arg);
            return -1;
        }
        a->eng.log.json = strcmp(arg, "json") == 0;
        return 0;
    case OPT_LOG_LEVEL: {
        static const char *const names[] = {"debug", "info", "warn", "error"};
        for (int i = 0; i < 4; i++)
            if (strcmp(arg, names[i]) == 0) {
                a->eng.log.level = i;
                return 0;
            }
        cli_usage_error(a->cmd, "--log-level must be debug, info, warn or error, not '%s'", arg);
        return -1;
    }
    }
    return -1;
}

/* --print-defaults: the worker's settings, the library's defaults filled in (pgjobq_worker_opts_defaults),
 * as one line of JSON, for programs that build a worker command (the Python package). */
static int print_defaults(const pgjobq_worker_opts *given)
{
    pgjobq_worker_opts o = *given;

    pgjobq_worker_opts_defaults(&o);
    printf("{\"lease_ms\":%lld,\"heartbeat_ms\":%lld,\"timeout_ms\":%lld,\"poll_ms\":%lld,"
           "\"shutdown_timeout_ms\":%lld,\"batch_max\":%d,\"concurrency\":%d}\n",
           (long long)o.lease_ms, (long long)o.heartbeat_ms, (long long)o.timeout_ms, (long long)o.poll_ms,
           (long long)o.shutdown_timeout_ms, o.batch_max, PGJOBQ_DEFAULT_CONCURRENCY);
    return fflush(stdout) == 0 && !ferror(stdout) ? EX_OK : EX_IOERR;
}

/* ------------------------------------------------------------------------------------------------ */

int cmd_work(const cli_cmd *cmd, int argc, char **argv)
{
    work_args a;
    exec_cfg *cfg;
    work_engine e;
    const char *url, *cluster;
    char why[160];
    int first, status = EX_OK;
    work_metrics metrics = {NULL, NULL, 0, NULL, NULL, 0, NULL};

    memset(&a, 0, sizeof a);
    memset(&e, 0, sizeof e);
    a.cmd = cmd;
    a.max_output = -1;
    a.map_reload_ms = 30000;
    a.eng.log.level = PGJOBQ_LOG_INFO;
    cfg = &a.eng.exec;
    cfg->max_output = 1048576;
    cfg->kill_grace_ms = 5000;
    first = cli_parse(cmd, argc, argv, work_opt, &a);
    if (first == -2)
        goto out;
    if (first < 0) {
        status = EX_USAGE;
        goto out;
    }
    cluster = cli_cluster_spec();
    if (first < argc)
        status = cli_usage_error(cmd, "unexpected argument '%s'", argv[first]);
    else if (a.print_defaults) {
        status = print_defaults(&a.eng.opts);
        goto out;
    } else if (a.exec == NULL && a.coproc == NULL && a.forward_to == NULL)
        status = cli_usage_error(cmd, "--exec 'CMD ARGS' (a command per job) or --coproc 'CMD ARGS' (a long-lived "
                                      "handler) is required (or --forward-to alone: a forwarder)");
    else if (a.exec == NULL && a.coproc == NULL && a.eng.nqueues > 0)
        status = cli_usage_error(cmd, "--queue needs --exec or --coproc to run its jobs");
    else if (a.exec && a.coproc)
        status = cli_usage_error(cmd, "give --exec or --coproc, not both");
    else if (a.eng.coprocs && !a.coproc)
        status = cli_usage_error(cmd, "--coprocs goes with --coproc");
    if (status != EX_OK)
        goto out;
    if (a.forward_to) {
        int rc = pgjobq_forwarder_new(&a.eng.forwarder, a.forward_to);
        if (rc != PGJOBQ_OK) {
            status = rc == PGJOBQ_ENOMEM ? EX_OSERR : cli_usage_error(cmd, "--forward-to: a cluster is needed");
            goto out;
        }
        if (a.exec == NULL && a.coproc == NULL)
            goto engines; /* a forwarder only: no command to run */
    }
    const char *command = a.exec ? a.exec : a.coproc;
    if (a.eng.nqueues == 0) {
        snprintf(a.eng.queues[0].name, sizeof a.eng.queues[0].name, "default");
        a.eng.queues[0].concurrency = PGJOBQ_DEFAULT_CONCURRENCY;
        a.eng.nqueues = 1;
    }
    a.eng.coproc = a.coproc != NULL;
    if (a.max_output >= 0)
        cfg->max_output = (size_t)a.max_output;
    if (a.shell) {
        cfg->argv = calloc(4, sizeof *cfg->argv);
        if (cfg->argv) {
            cfg->argv[0] = strdup("/bin/sh");
            cfg->argv[1] = strdup("-c");
            cfg->argv[2] = strdup(command);
        }
    } else {
        cfg->argv = spawn_split_words(command, why, sizeof why);
        if (cfg->argv == NULL) {
            status = cli_usage_error(cmd, "--%s: %s", a.exec ? "exec" : "coproc", why);
            goto out;
        }
    }
    /* A coprocess is told which protocol the worker speaks. */
    static const char *const coproc_vars[] = {SPAWN_PROTOCOL_VAR "=3", NULL};
    cfg->env =
        spawn_environment(a.keep_env, (const char *const *)a.pass_env, a.npass_env, a.coproc ? coproc_vars : NULL);
    if (cfg->argv == NULL || cfg->env == NULL || (a.shell && (!cfg->argv[0] || !cfg->argv[1] || !cfg->argv[2]))) {
        cli_err("out of memory");
        status = EX_OSERR;
        goto out;
    }
    /* A handler that cannot be run would fail every job: say so now, not once per attempt. */
    if (!a.shell && !spawn_runnable(cfg->argv[0])) {
        status = cli_usage_error(cmd, "--%s: %s is not an executable file%s", a.exec ? "exec" : "coproc", cfg->argv[0],
                                 strchr(cfg->argv[0], '/') ? "" : " on PATH");
        goto out;
    }
    {
        /* The grace between SIGTERM and SIGKILL must fit in the time the lease leaves after the timeout. */
        pgjobq_worker_opts eff = a.eng.opts;
        pgjobq_worker_opts_defaults(&eff);
        int64_t room = (eff.lease_ms - eff.timeout_ms) / 2;
        cfg->kill_grace_ms = room < 5000 ? (room > 100 ? room : 100) : 5000;
    }
engines:
    if (cluster) {
        status = work_cluster_run(&a.eng, cluster, a.map_reload_ms, cmd, a.metrics_listen);
        goto out;
    }
    if ((url = cli_resolve_db(&status)) == NULL)
        goto out;
    if ((status = work_engine_new(&e, &a.eng, NULL, url, NULL)) != EX_OK)
        goto out;
    if (a.metrics_listen) {
        metrics.w = e.w;
        metrics.queues = a.eng.queues;
        metrics.nqueues = a.eng.nqueues;
        if ((status = work_metrics_start(&metrics, cmd, a.metrics_listen, &a.eng.log)) != EX_OK)
            goto out;
    }
    work_signals_set(0, &e);
    if ((status = work_signals_install()) != EX_OK) {
        work_signals_set(0, NULL);
        goto out;
    }
    e.rc = pgjobq_worker_run(e.w);
    work_signals_set(0, NULL);
    status = work_engine_status(&e);
out:
    work_metrics_stop(&metrics);
    work_engine_free(&e);
    pgjobq_forwarder_free(a.eng.forwarder); /* (after every engine that used it) */
    for (char **p = cfg->argv; p && *p; p++)
        free(*p);
    free(cfg->argv);
    free(cfg->env);
    for (size_t i = 0; i < a.npass_env; i++)
        free(a.pass_env[i]);
    return status;
}
