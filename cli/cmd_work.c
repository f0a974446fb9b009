/*
 * cmd_work.c - pgjobq work: a worker whose handler runs a command given on the worker's own command
 * line (never one taken from a job row), once per job.
 *
 * The exec contract: the command runs without a shell (unless --shell), in its own process group,
 * with the payload on stdin and PGJOBQ_JOB_ID, PGJOBQ_QUEUE, PGJOBQ_KIND, PGJOBQ_ATTEMPT,
 * PGJOBQ_MAX_ATTEMPTS and PGJOBQ_LEASE_TOKEN in its environment, and without any variable of the worker's that
 * begins with PG (libpq's and pgjobq's: the database and its credentials, the serve token) or is DATABASE_URL.  Exit 0
 * completes the job with stdout as its result; exit 75 (EX_TEMPFAIL) asks for a retry with backoff;
 * any other exit, a signal, or the job timeout is a failed attempt, retried until max_attempts, with
 * the tail of stderr as the error.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "coproc.h"
#include "http.h"
#include "spawn.h"

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

const cli_opt work_opts[] = {
    {"queue", OPT_QUEUE, "QUEUE[:N]", "serve QUEUE with N jobs at a time (repeatable; default default:10)"},
    {"exec", OPT_EXEC, "'CMD ARGS'", "the command to run for each job (this or --coproc)"},
    {"coproc", OPT_COPROC, "'CMD ARGS'",
     "a long-lived handler: started once, it takes jobs as JSON lines on stdin and answers on stdout "
     "(docs/coproc.md)"},
    {"coprocs", OPT_COPROCS, "K", "with --coproc: run K copies, each taking its share of the slots (default 1)"},
    {"shell", OPT_SHELL, NULL, "run --exec through /bin/sh -c instead of splitting it into words"},
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
    {"metrics-listen", OPT_METRICS_LISTEN, "ADDR",
     "serve this worker's counters at http://ADDR/metrics (e.g. 127.0.0.1:9465; off loopback, "
     "$PGJOBQ_SERVE_TOKEN is required)"},
    {"log-format", OPT_LOG_FORMAT, "FORMAT", "text or json (default text)"},
    {"log-level", OPT_LOG_LEVEL, "LEVEL", "debug, info, warn or error (default info)"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

typedef struct queue_arg {
    char name[PGJOBQ_NAME_MAX + 1];
    int concurrency;
} queue_arg;

typedef struct exec_cfg {
    char **argv;      /* the command, split (or sh -c) */
    char **env;       /* the worker's environment without credentials */
    size_t max_output;
    int64_t kill_grace_ms;
} exec_cfg;

typedef struct work_args {
    const cli_cmd *cmd;
    pgjobq_worker_opts opts;
    queue_arg queues[64];
    int nqueues;
    const char *exec;
    int shell;
    long long max_output;
    int json_log;
    int log_level;
    const char *metrics_listen;
    const char *coproc;
    int coprocs;
} work_args;

static pgjobq_worker *volatile the_worker;

static void on_signal(int sig)
{
    (void)sig;
    if (the_worker)
        pgjobq_worker_stop(the_worker);
}

/* ------------------------------------------------------------------------------------------------ */
/* Logging                                                                                           */

static void log_line(void *arg, pgjobq_log_level level, const char *msg)
{
    const work_args *a = arg;
    char ts[96], *safe;
    struct timespec now;
    struct tm tm;

    if ((int)level < a->log_level)
        return;
    /* The library redacts what it logs; this covers the lines of the coprocesses too. */
    if ((safe = cli_redact(msg)) == NULL)
        return;
    msg = safe;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, now.tv_nsec / 1000000);
    flockfile(stderr);
    if (a->json_log) {
        fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":", ts, pgjobq_log_level_name(level));
        json_str(stderr, msg);
        fputs("}\n", stderr);
    } else {
        /* One line per record, whatever a handler or the database put in it. */
        fprintf(stderr, "%s %-5s ", ts, pgjobq_log_level_name(level));
        tty_put(stderr, msg, 0);
        fputc('\n', stderr);
    }
    funlockfile(stderr);
    free(safe);
}

/* ------------------------------------------------------------------------------------------------ */
/* --metrics-listen                                                                                  */

typedef struct metrics_ctx {
    pgjobq_worker *w;
    const work_args *a;
} metrics_ctx;

static void counter(sbuf *b, const char *name, const char *help, int64_t v)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %lld\n", name, help, name, name, (long long)v);
}

/* This process's own counters, in the Prometheus text format (the queue's are `pgjobq serve`'s). */
static void worker_metrics(void *arg, const http_req *req, http_resp *out)
{
    metrics_ctx *m = arg;
    pgjobq_worker_stats st;
    sbuf *b = &out->body;

    out->content_type = "text/plain; charset=utf-8";
    if (strcmp(req->path, "/healthz") == 0) {
        sb_puts(b, "ok\n");
        return;
    }
    if (strcmp(req->path, "/metrics") != 0) {
        out->status = 404;
        sb_puts(b, "not found: this worker serves /metrics and /healthz\n");
        return;
    }
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
    pgjobq_worker_get_stats(m->w, &st);
    sb_printf(b, "# HELP pgjobq_worker_running Jobs this worker holds now.\n# TYPE pgjobq_worker_running gauge\n"
                 "pgjobq_worker_running %lld\n",
              (long long)st.running);
    sb_puts(b, "# HELP pgjobq_worker_slots Jobs this worker runs at once, per queue.\n"
               "# TYPE pgjobq_worker_slots gauge\n");
    for (int i = 0; i < m->a->nqueues; i++) {
        sb_puts(b, "pgjobq_worker_slots{queue=\"");
        sb_label(b, m->a->queues[i].name);
        sb_printf(b, "\"} %d\n", m->a->queues[i].concurrency);
    }
    sb_printf(b, "# HELP pgjobq_worker_connections Database connections connected and set up (of 3).\n"
                 "# TYPE pgjobq_worker_connections gauge\npgjobq_worker_connections %d\n",
              pgjobq_worker_connections(m->w));
    counter(b, "pgjobq_worker_claimed_total", "Jobs claimed.", st.claimed);
    counter(b, "pgjobq_worker_claims_total", "Claim statements (claimed_total / claims_total is the mean batch).",
            st.claims);
    counter(b, "pgjobq_worker_completed_total", "Completions written.", st.completed);
    counter(b, "pgjobq_worker_retried_total", "Failed attempts queued again.", st.retried);
    counter(b, "pgjobq_worker_failed_total", "Jobs that ended failed.", st.failed);
    counter(b, "pgjobq_worker_cancelled_total", "Jobs that ended cancelled.", st.cancelled);
    counter(b, "pgjobq_worker_lost_total", "Jobs whose lease this worker lost (their outcome was not written).",
            st.lost);
    counter(b, "pgjobq_worker_released_total", "Jobs handed back unstarted at shutdown.", st.released);
    counter(b, "pgjobq_worker_rescued_total", "Expired leases of other workers rescued by this one.", st.rescued);
    counter(b, "pgjobq_worker_writes_total", "Statements that wrote outcomes.", st.writes);
}

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
        queue_arg *q = &a->queues[a->nqueues];
        /* The concurrency is what follows the last ':'. */
        const char *colon = strrchr(arg, ':');
        if (a->nqueues == 64) {
            cli_usage_error(a->cmd, "at most 64 --queue options");
            return -1;
        }
        q->concurrency = 10;
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
        a->nqueues++;
        return 0;
    }
    case OPT_EXEC: a->exec = arg; return 0;
    case OPT_COPROC: a->coproc = arg; return 0;
    case OPT_COPROCS:
        if (cli_parse_int(arg, 1, 256, &v, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--coprocs: %s", why);
            return -1;
        }
        a->coprocs = (int)v;
        return 0;
    case OPT_SHELL: a->shell = 1; return 0;
    case OPT_LEASE: return duration_opt(a, "lease", arg, &a->opts.lease_ms);
    case OPT_HEARTBEAT: return duration_opt(a, "heartbeat", arg, &a->opts.heartbeat_ms);
    case OPT_TIMEOUT: return duration_opt(a, "timeout", arg, &a->opts.timeout_ms);
    case OPT_POLL: return duration_opt(a, "poll", arg, &a->opts.poll_ms);
    case OPT_SHUTDOWN: return duration_opt(a, "shutdown-timeout", arg, &a->opts.shutdown_timeout_ms);
    case OPT_RETAIN_COMPLETED: return duration_opt(a, "retain-completed", arg, &a->opts.retain_completed_ms);
    case OPT_RETAIN_FAILED: return duration_opt(a, "retain-failed", arg, &a->opts.retain_failed_ms);
    case OPT_POLL_ONLY: a->opts.poll_only = 1; return 0;
    case OPT_NO_MAINTENANCE: a->opts.no_maintenance = 1; return 0;
    case OPT_METRICS_LISTEN: a->metrics_listen = arg; return 0;
    case OPT_WORKER_ID: a->opts.worker_id = arg; return 0;
    case OPT_BATCH:
        if (cli_parse_int(arg, 1, PGJOBQ_BATCH_MAX, &v, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--batch: %s", why);
            return -1;
        }
        a->opts.batch_max = (int)v;
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
        a->json_log = strcmp(arg, "json") == 0;
        return 0;
    case OPT_LOG_LEVEL: {
        static const char *const names[] = {"debug", "info", "warn", "error"};
        for (int i = 0; i < 4; i++)
            if (strcmp(arg, names[i]) == 0) {
                a->log_level = i;
                return 0;
            }
        cli_usage_error(a->cmd, "--log-level must be debug, info, warn or error, not '%s'", arg);
        return -1;
    }
    }
    return -1;
}

/* Splits a command into words: blanks separate, '...' and "..." quote, \ escapes (outside '...'). */
static char **split_words(const char *s, char *why, size_t why_size)
{
    size_t cap = strlen(s) + 1, n = 0, len = 0;
    char **argv = calloc(cap + 1, sizeof *argv);
    char *word = malloc(cap);
    int in_word = 0;

    if (argv == NULL || word == NULL) {
        free(argv);
        free(word);
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    for (const char *p = s;; p++) {
        if (*p == '\0' || *p == ' ' || *p == '\t' || *p == '\n') {
            if (in_word) {
                word[len] = '\0';
                argv[n++] = strdup(word);
                len = 0;
                in_word = 0;
            }
            if (*p == '\0')
                break;
            continue;
        }
        in_word = 1;
        if (*p == '\'' || *p == '"') {
            char quote = *p++;
            while (*p && *p != quote) {
                if (quote == '"' && *p == '\\' && p[1])
                    p++;
                word[len++] = *p++;
            }
            if (*p != quote) {
                snprintf(why, why_size, "unterminated %c quote", quote);
                goto fail;
            }
        } else if (*p == '\\' && p[1]) {
            word[len++] = *++p;
        } else {
            word[len++] = *p;
        }
    }
    free(word);
    if (n == 0) {
        snprintf(why, why_size, "the command is empty");
        free(argv);
        return NULL;
    }
    return argv;
fail:
    for (size_t i = 0; i < n; i++)
        free(argv[i]);
    free(argv);
    free(word);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* The exec handler                                                                                  */

typedef struct output {
    char *data;
    size_t len, cap;
    size_t total;    /* bytes seen */
    int keep_tail;   /* keep the last cap bytes rather than the first */
} output;

static void output_add(output *o, const char *p, size_t n)
{
    o->total += n;
    if (!o->keep_tail) {
        size_t room = o->cap - o->len;
        if (n > room)
            n = room;
        memcpy(o->data + o->len, p, n);
        o->len += n;
        return;
    }
    if (n >= o->cap) {
        memcpy(o->data, p + n - o->cap, o->cap);
        o->len = o->cap;
    } else if (o->len + n <= o->cap) {
        memcpy(o->data + o->len, p, n);
        o->len += n;
    } else {
        size_t drop = o->len + n - o->cap;
        memmove(o->data, o->data + drop, o->len - drop);
        o->len -= drop;
        memcpy(o->data + o->len, p, n);
        o->len += n;
    }
}


/* Encodes text as a JSON string (malloc'd; NULL when out of memory). */
static char *json_string(const char *s)
{
    sbuf b;
    sb_init(&b);
    sb_json(&b, s);
    if (b.failed) {
        sb_free(&b);
        return NULL;
    }
    return b.data;
}

/* The result to store from the command's stdout: the JSON itself, else the text as a JSON string. */
static void set_result(pgjobq_ctx *ctx, output *out)
{
    size_t len = out->len;
    while (len > 0 && (out->data[len - 1] == '\n' || out->data[len - 1] == '\r' || out->data[len - 1] == ' '))
        len--;
    if (len == 0)
        return;
    out->data[len] = '\0';
    if (out->total == out->len && memchr(out->data, '\0', len) == NULL && pgjobq_ctx_set_result(ctx, out->data) == PGJOBQ_OK)
        return;
    /* Not JSON (or cut at --max-output): keep it as text, cut so that the encoded form fits. */
    char *clean = NULL;
    size_t keep = len;
    for (;;) {
        char *tmp = malloc(keep + 1);
        if (tmp == NULL)
            return;
        for (size_t i = 0; i < keep; i++)
            tmp[i] = out->data[i] ? out->data[i] : ' ';
        tmp[keep] = '\0';
        free(clean);
        clean = tmp;
        char *enc = json_string(clean);
        if (enc && pgjobq_ctx_set_result(ctx, enc) == PGJOBQ_OK) {
            free(enc);
            break;
        }
        free(enc);
        if (keep < 16)
            break;
        keep = keep / 2; /* too long once escaped, or not valid UTF-8: try a shorter cut */
    }
    free(clean);
}

static pgjobq_outcome exec_handler(pgjobq_ctx *ctx, void *arg)
{
    const exec_cfg *cfg = arg;
    const pgjobq_job *job = pgjobq_ctx_job(ctx);
    int fds[3] = {-1, -1, -1}; /* the command's stdin, stdout and stderr: our ends */
    int status = 0, exited = 0, src;
    char vars[6][96], **env = NULL, *parents_var = NULL;
    output out = {NULL, 0, cfg->max_output, 0, 0}, err = {NULL, 0, 8192, 0, 1};
    size_t nenv = 0, written = 0, plen = strlen(job->payload);
    int64_t term_sent = 0, kill_sent = 0;
    pgjobq_stop_reason stopped = PGJOBQ_STOP_NONE;
    pid_t pid = -1;
    char msg[PGJOBQ_ERROR_MAX];

    out.data = malloc(cfg->max_output + 1);
    err.data = malloc(err.cap + 1);
    while (cfg->env[nenv])
        nenv++;
    env = calloc(nenv + 8, sizeof *env);
    if (out.data == NULL || err.data == NULL || env == NULL)
        goto cannot_set_up;
    memcpy(env, cfg->env, nenv * sizeof *env);
    snprintf(vars[0], sizeof vars[0], "PGJOBQ_JOB_ID=%lld", (long long)job->id);
    snprintf(vars[1], sizeof vars[1], "PGJOBQ_QUEUE=%s", job->queue);
    snprintf(vars[2], sizeof vars[2], "PGJOBQ_KIND=%s", job->kind);
    snprintf(vars[3], sizeof vars[3], "PGJOBQ_ATTEMPT=%d", job->attempt);
    snprintf(vars[4], sizeof vars[4], "PGJOBQ_MAX_ATTEMPTS=%d", job->max_attempts);
    snprintf(vars[5], sizeof vars[5], "PGJOBQ_LEASE_TOKEN=%lld", (long long)job->lease_token);
    for (int i = 0; i < 6; i++)
        env[nenv + (size_t)i] = vars[i];
    if (job->parents) { /* a job that waited for others: their states and results, as JSON */
        size_t parents_len = strlen(job->parents);
        if (parents_len > 65536 || (parents_var = malloc(parents_len + sizeof "PGJOBQ_PARENTS=")) == NULL) {
            pgjobq_ctx_set_error(ctx, "the parents' results are too large for the environment (more than 64 KiB)");
            goto cleanup_retry;
        }
        memcpy(parents_var, "PGJOBQ_PARENTS=", sizeof "PGJOBQ_PARENTS=" - 1);
        memcpy(parents_var + sizeof "PGJOBQ_PARENTS=" - 1, job->parents, parents_len + 1);
        env[nenv + 6] = parents_var;
    }

    if ((src = spawn_piped(cfg->argv, env, &pid, fds)) < 0)
        goto cannot_set_up;
    if (src != 0) {
        snprintf(msg, sizeof msg, "cannot run %s: %s", cfg->argv[0], strerror(src));
        pgjobq_ctx_set_error(ctx, msg);
        goto cleanup_retry;
    }
    if (plen == 0) {
        close(fds[0]);
        fds[0] = -1;
    }

    /* Until the command has exited and both pipes are at EOF: a command that has exited may still
     * have output waiting in the pipes, which must be read before its result is judged. */
    while (!(exited && fds[1] < 0 && fds[2] < 0)) {
        struct pollfd p[3] = {{fds[1], POLLIN, 0}, {fds[2], POLLIN, 0}, {fds[0], POLLOUT, 0}};
        char buf[65536];

        /* With both pipes closed only the exit is left to wait for: look again soon. */
        poll(p, 3, fds[1] < 0 && fds[2] < 0 ? 1 : 100);
        if (p[0].revents) {
            ssize_t n = read(fds[1], buf, sizeof buf);
            if (n > 0)
                output_add(&out, buf, (size_t)n);
            else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                close(fds[1]);
                fds[1] = -1;
            }
        }
        if (p[1].revents) {
            ssize_t n = read(fds[2], buf, sizeof buf);
            if (n > 0)
                output_add(&err, buf, (size_t)n);
            else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                close(fds[2]);
                fds[2] = -1;
            }
        }
        if (fds[0] >= 0 && (p[2].revents || exited)) {
            ssize_t n = exited ? -1 : write(fds[0], job->payload + written, plen - written);
            if (n > 0)
                written += (size_t)n;
            if (exited || (n < 0 && errno != EAGAIN && errno != EINTR) || written == plen) {
                close(fds[0]); /* done, or the command does not read its input */
                fds[0] = -1;
            }
        }
        if (exited)
            continue;
        /* Told to stop (timeout, cancel, lost lease, shutdown): TERM the group, then KILL it. */
        if (stopped == PGJOBQ_STOP_NONE && pgjobq_ctx_should_stop(ctx)) {
            stopped = pgjobq_ctx_stop_reason(ctx);
            kill(-pid, SIGTERM);
            term_sent = cli_mono_ms();
        }
        if (term_sent && !kill_sent && cli_mono_ms() - term_sent >= cfg->kill_grace_ms) {
            kill(-pid, SIGKILL);
            kill_sent = 1;
        }
        if (waitpid(pid, &status, WNOHANG) == pid) {
            exited = 1;
            /* Anything it left behind in its group holding the pipes goes too, so that EOF comes. */
            kill(-pid, SIGKILL);
        }
    }

    /* The stderr tail, made storable. */
    err.data[err.len] = '\0';
    for (size_t i = 0; i < err.len; i++)
        if (err.data[i] == '\0')
            err.data[i] = ' ';
    if (stopped == PGJOBQ_STOP_TIMEOUT) {
        snprintf(msg, sizeof msg, "timed out after %lld ms and was killed; stderr: %s",
                 (long long)(cli_mono_ms() - term_sent), err.data);
        pgjobq_ctx_set_error(ctx, msg);
        goto cleanup_retry;
    }
    if (stopped != PGJOBQ_STOP_NONE) {
        snprintf(msg, sizeof msg, "stopped by the worker (%s)",
                 stopped == PGJOBQ_STOP_SHUTDOWN ? "shutdown" : stopped == PGJOBQ_STOP_CANCELLED ? "cancelled" : "lease lost");
        pgjobq_ctx_set_error(ctx, msg);
        goto cleanup_retry;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        set_result(ctx, &out);
        free(out.data);
        free(err.data);
        free(env);
        free(parents_var);
        return PGJOBQ_OUTCOME_COMPLETE;
    }
    if (WIFEXITED(status))
        snprintf(msg, sizeof msg, "%s (exit status %d); stderr: %s",
                 WEXITSTATUS(status) == EX_TEMPFAIL ? "temporary failure" : "failed", WEXITSTATUS(status), err.data);
    else
        snprintf(msg, sizeof msg, "killed by signal %d; stderr: %s", WTERMSIG(status), err.data);
    pgjobq_ctx_set_error(ctx, msg);

    goto cleanup_retry;
cannot_set_up:
    pgjobq_ctx_set_error(ctx, "the worker could not set up the command (out of memory or file descriptors)");
cleanup_retry:
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(out.data);
    free(err.data);
    free(env);
    free(parents_var);
    return PGJOBQ_OUTCOME_RETRY;
}

/* ------------------------------------------------------------------------------------------------ */

/* 1 when file names an executable regular file: as a path when it holds '/', else on $PATH, as
 * execvp() would look for it. */
static int runnable(const char *file)
{
    struct stat st;
    char path[4096];

    if (strchr(file, '/'))
        return stat(file, &st) == 0 && S_ISREG(st.st_mode) && access(file, X_OK) == 0;
    const char *p = getenv("PATH");
    if (p == NULL || p[0] == '\0')
        p = "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        size_t len = strcspn(p, ":");
        snprintf(path, sizeof path, "%.*s/%s", (int)len, len ? p : ".", file);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0)
            return 1;
        p += len + (p[len] == ':');
    }
    return 0;
}

int cmd_work(const cli_cmd *cmd, int argc, char **argv)
{
    work_args a;
    exec_cfg cfg = {NULL, NULL, 1048576, 5000};
    pgjobq_worker *w = NULL;
    const char *url;
    char why[160];
    int first, rc, status = EX_OK;
    metrics_ctx mctx;
    http_server *metrics = NULL;
    coproc_pool *pool = NULL;

    memset(&a, 0, sizeof a);
    a.cmd = cmd;
    a.max_output = -1;
    a.log_level = PGJOBQ_LOG_INFO;
    first = cli_parse(cmd, argc, argv, work_opt, &a);
    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (first < argc)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[first]);
    if (a.exec == NULL && a.coproc == NULL)
        return cli_usage_error(cmd, "--exec 'CMD ARGS' (a command per job) or --coproc 'CMD ARGS' (a long-lived "
                                    "handler) is required");
    if (a.exec && a.coproc)
        return cli_usage_error(cmd, "give --exec or --coproc, not both");
    if (a.coprocs && !a.coproc)
        return cli_usage_error(cmd, "--coprocs goes with --coproc");
    const char *command = a.exec ? a.exec : a.coproc;
    if (a.nqueues == 0) {
        snprintf(a.queues[0].name, sizeof a.queues[0].name, "default");
        a.queues[0].concurrency = 10;
        a.nqueues = 1;
    }
    if (a.max_output >= 0)
        cfg.max_output = (size_t)a.max_output;
    if (a.shell) {
        cfg.argv = calloc(4, sizeof *cfg.argv);
        if (cfg.argv) {
            cfg.argv[0] = strdup("/bin/sh");
            cfg.argv[1] = strdup("-c");
            cfg.argv[2] = strdup(command);
        }
    } else {
        cfg.argv = split_words(command, why, sizeof why);
        if (cfg.argv == NULL)
            return cli_usage_error(cmd, "--%s: %s", a.exec ? "exec" : "coproc", why);
    }
    cfg.env = spawn_environment();
    if (cfg.argv == NULL || cfg.env == NULL) {
        cli_err("out of memory");
        return EX_OSERR;
    }
    /* A handler that cannot be run would fail every job: say so now, not once per attempt. */
    if (!a.shell && !runnable(cfg.argv[0])) {
        status = cli_usage_error(cmd, "--%s: %s is not an executable file%s", a.exec ? "exec" : "coproc", cfg.argv[0],
                                 strchr(cfg.argv[0], '/') ? "" : " on PATH");
        goto out;
    }
    if ((url = cli_resolve_db(&status)) == NULL)
        goto out;
    a.opts.log_fn = log_line;
    a.opts.log_arg = &a;
    rc = pgjobq_worker_new(&w, url, &a.opts);
    if (rc != PGJOBQ_OK) {
        cli_err("%s", pgjobq_worker_errmsg(w));
        status = rc == PGJOBQ_EINVAL ? EX_USAGE : EX_OSERR;
        goto out;
    }
    {
        /* The grace between SIGTERM and SIGKILL must fit in the time the lease leaves after the timeout. */
        pgjobq_worker_opts eff = a.opts;
        int64_t lease = eff.lease_ms ? eff.lease_ms : 60000;
        int64_t timeout = eff.timeout_ms ? eff.timeout_ms : lease * 4 / 5;
        int64_t room = (lease - timeout) / 2;
        cfg.kill_grace_ms = room < 5000 ? (room > 100 ? room : 100) : 5000;
    }
    if (a.coproc) {
        /* Each copy takes its share of all the slots. */
        int k = a.coprocs ? a.coprocs : 1, slots = 0;
        for (int i = 0; i < a.nqueues; i++)
            slots += a.queues[i].concurrency;
        if ((pool = coproc_start(cfg.argv, cfg.env, k, (slots + k - 1) / k, log_line, &a)) == NULL) {
            cli_err("out of memory");
            status = EX_OSERR;
            goto out;
        }
    }
    for (int i = 0; i < a.nqueues; i++) {
        rc = pgjobq_worker_handle(w, a.queues[i].name, NULL, a.queues[i].concurrency,
                                  pool ? coproc_handler : exec_handler, pool ? (void *)pool : (void *)&cfg);
        if (rc != PGJOBQ_OK) {
            cli_err("%s", pgjobq_worker_errmsg(w));
            status = EX_USAGE;
            goto out;
        }
    }
    if (a.metrics_listen) {
        char mwhy[256], line[300];
        http_addr addr;
        const char *token = getenv("PGJOBQ_SERVE_TOKEN");
        if (token && !token[0])
            token = NULL;
        if (http_addr_parse(a.metrics_listen, &addr, mwhy, sizeof mwhy) != 0) {
            status = cli_usage_error(cmd, "--metrics-listen: %s", mwhy);
            goto out;
        }
        if (!addr.loopback && (token == NULL || strlen(token) < 16)) {
            cli_err("--metrics-listen %s is not a loopback address: set $PGJOBQ_SERVE_TOKEN (16+ characters) to "
                    "require it as credentials, or listen on 127.0.0.1",
                    a.metrics_listen);
            status = EX_USAGE;
            goto out;
        }
        mctx.w = w;
        mctx.a = &a;
        if ((metrics = http_start(&addr, token, worker_metrics, &mctx, mwhy, sizeof mwhy)) == NULL) {
            cli_err("--metrics-listen: %s", mwhy);
            status = EX_UNAVAILABLE;
            goto out;
        }
        snprintf(line, sizeof line, "metrics at http://%s%s%s:%d/metrics", strchr(addr.host, ':') ? "[" : "",
                 addr.host, strchr(addr.host, ':') ? "]" : "", http_port(metrics));
        log_line(&a, PGJOBQ_LOG_INFO, line);
    }
    the_worker = w;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    rc = pgjobq_worker_run(w);
    the_worker = NULL;
    if (rc == PGJOBQ_ESTOPPED) {
        status = EX_OK; /* stopped by a signal before it started: nothing to do, nothing lost */
    } else if (rc == PGJOBQ_ETIMEOUT) {
        cli_err("%s", pgjobq_worker_errmsg(w));
        status = EX_TEMPFAIL;
    } else if (rc != PGJOBQ_OK) {
        cli_err("%s", pgjobq_worker_errmsg(w));
        status = cli_exit_status(rc);
    }
out:
    http_stop(metrics);
    coproc_stop(pool, 5000);
    pgjobq_worker_free(w);
    for (char **p = cfg.argv; p && *p; p++)
        free(*p);
    free(cfg.argv);
    free(cfg.env);
    return status;
}
