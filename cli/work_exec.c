/*
 * work_exec.c - `pgjobq work --exec CMD`: the handler that runs the command once per job (the contract
 * is at the top of cmd_work.c).  It feeds the payload to its stdin, keeps its stdout as the result
 * and the tail of its stderr as the error, stops its process group when the job must stop, and
 * turns its exit into the job's outcome.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spawn.h"
#include "work.h"

typedef struct output {
    char *data;
    size_t len, cap;
    size_t total;  /* bytes seen */
    int keep_tail; /* keep the last cap bytes rather than the first */
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

/* Reads what the pipe *fd holds into o; at its end (or on an error) closes it and sets *fd to -1. */
static void drain(int *fd, output *o)
{
    char buf[65536];
    ssize_t n = read(*fd, buf, sizeof buf);

    if (n > 0)
        output_add(o, buf, (size_t)n);
    else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(*fd);
        *fd = -1;
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
    if (out->total == out->len && memchr(out->data, '\0', len) == NULL &&
        pgjobq_ctx_set_result(ctx, out->data) == PGJOBQ_OK)
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

/* Exit WORK_EXIT_SNOOZE: the job is snoozed for the duration on standard output (none: the backoff),
 * with standard error's tail as the reason; a standard output that is no duration is a failed attempt
 * that says so (msg: the caller's buffer). */
static pgjobq_outcome snooze(pgjobq_ctx *ctx, output *out, const output *err, char *msg, size_t msg_size)
{
    size_t len = out->len, start = 0;
    int64_t ms;
    char why[160];

    while (len > 0 && (out->data[len - 1] == '\n' || out->data[len - 1] == '\r' || out->data[len - 1] == ' '))
        len--;
    while (start < len && (out->data[start] == ' ' || out->data[start] == '\n'))
        start++;
    out->data[len] = '\0';
    if (start < len) {
        if (out->total != out->len || memchr(out->data + start, '\0', len - start) != NULL ||
            cli_parse_duration_ms(out->data + start, &ms, why, sizeof why) != 0) {
            for (size_t i = start; i < len; i++)
                if (out->data[i] == '\0')
                    out->data[i] = ' ';
            snprintf(msg, msg_size,
                     "exit status %d asks for a snooze, but its standard output ('%.60s') is not a duration "
                     "(e.g. 30, 90s, 5m); stderr: %s",
                     WORK_EXIT_SNOOZE, out->data + start, err->data);
            pgjobq_ctx_set_error(ctx, msg);
            return PGJOBQ_OUTCOME_RETRY;
        }
        pgjobq_ctx_set_retry_delay(ctx, ms);
    }
    int elen = (int)strlen(err->data); /* (its tail, without the last line's end) */
    while (elen > 0 && (err->data[elen - 1] == '\n' || err->data[elen - 1] == '\r'))
        elen--;
    snprintf(msg, msg_size, "snoozed by the handler (exit status %d)%s%.*s", WORK_EXIT_SNOOZE, elen ? ": " : "", elen,
             err->data);
    pgjobq_ctx_set_error(ctx, msg);
    return PGJOBQ_OUTCOME_SNOOZE;
}

pgjobq_outcome exec_handler(pgjobq_ctx *ctx, void *arg)
{
    const exec_cfg *cfg = arg;
    const pgjobq_job *job = pgjobq_ctx_job(ctx);
    int fds[3] = {-1, -1, -1}; /* the command's stdin, stdout and stderr: our ends */
    int status = 0, exited = 0, src;
    char vars[7][96], **env = NULL, *parents_var = NULL;
    const char *traceparent = pgjobq_job_traceparent(job);
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
    env = calloc(nenv + 9, sizeof *env);
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
    nenv += 6;
    if (traceparent) { /* the job's trace context (docs/queues.md, "Trace context"): 55 characters */
        snprintf(vars[6], sizeof vars[6], "TRACEPARENT=%s", traceparent);
        env[nenv++] = vars[6];
    }
    if (job->parents) { /* a job that waited for others: their states and results, as JSON */
        size_t parents_len = strlen(job->parents);
        if (parents_len > 65536 || (parents_var = malloc(parents_len + sizeof "PGJOBQ_PARENTS=")) == NULL) {
            pgjobq_ctx_set_error(ctx, "the parents' results are too large for the environment (more than 64 KiB)");
            goto cleanup_retry;
        }
        memcpy(parents_var, "PGJOBQ_PARENTS=", sizeof "PGJOBQ_PARENTS=" - 1);
        memcpy(parents_var + sizeof "PGJOBQ_PARENTS=" - 1, job->parents, parents_len + 1);
        env[nenv] = parents_var;
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

        /* With both pipes closed only the exit is left to wait for: look again soon. */
        if (poll(p, 3, fds[1] < 0 && fds[2] < 0 ? 1 : 100) < 0) {
            /* A signal (EINTR), or no memory for the poll: nothing is ready this turn; the exit and
             * the stop are still checked below, and the pipes are looked at again. */
            p[0].revents = p[1].revents = p[2].revents = 0;
            if (errno != EINTR) {
                struct timespec ts = {0, 10 * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
        if (p[0].revents)
            drain(&fds[1], &out);
        if (p[1].revents)
            drain(&fds[2], &err);
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
                 stopped == PGJOBQ_STOP_SHUTDOWN    ? "shutdown"
                 : stopped == PGJOBQ_STOP_CANCELLED ? "cancelled"
                                                    : "lease lost");
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
    if (WIFEXITED(status) && WEXITSTATUS(status) == WORK_EXIT_PARKED) {
        free(out.data);
        free(err.data);
        free(env);
        free(parents_var);
        return PGJOBQ_OUTCOME_PARKED;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == WORK_EXIT_SNOOZE) {
        pgjobq_outcome o = snooze(ctx, &out, &err, msg, sizeof msg);
        free(out.data);
        free(err.data);
        free(env);
        free(parents_var);
        return o;
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
