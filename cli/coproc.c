/*
 * coproc.c - long-lived handler processes for `pgjobq work --coproc CMD` (protocol: docs/coproc.md).
 *
 * Each coprocess has one supervising thread: it starts the process (own process group, the worker's
 * environment without its PG* variables and DATABASE_URL, stdin/stdout/stderr on pipes), reads its stdout replies
 * and stderr lines, and when the process exits or writes a line that is not a valid reply, fails the
 * jobs it held (each counts a failed attempt and is retried) and starts it again after a backoff.
 * The handler queues a job line and returns at once (PGJOBQ_OUTCOME_PENDING); the supervisor ends
 * the jobs when their replies come (those of one read together), so no thread waits per job, and in
 * the same call (pgjobq_ctx_finish_many_and_run) starts on its own thread the jobs that were waiting
 * for the slots it freed, then writes their lines in one go.  A handler thread (when a claim finds
 * slots free) wakes the supervisor once through its kick pipe instead.  At most `share` jobs are in
 * flight on one coprocess (a few more for a moment while another is restarted).  A job
 * that must stop (timeout, cancel, lost lease, shutdown) is given up by the supervisor, which tells the
 * coprocess with a {"cancel": ID} line.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coproc.h"
#include "http.h" /* sbuf */
#include "spawn.h"

#define LINE_MAX_BYTES (4 * 1024 * 1024) /* a reply: a result of up to 1 MiB, escaped, and the rest */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define QUOTE_MAX 200 /* how much of a bad line the log quotes */
#define STOP_SCAN_MS 50 /* how often the supervisor looks for jobs that must stop */

/* One job waiting for its reply (its handler returned PENDING): whoever unlinks it from `held`
 * (under the pool's mutex) ends the job and frees it. */
typedef struct pending {
    struct pending *next;
    int64_t id;
    pgjobq_ctx *ctx;
} pending;

typedef struct coproc {
    struct coproc_pool *pool;
    int index;
    pthread_t thread;
    pid_t pid;        /* 0 while not running */
    int in_fd;        /* its stdin (ours to write), -1 while not running */
    sbuf outq;        /* lines not yet written to it */
    int flushing;     /* a thread is writing outq (without the pool's mutex) */
    int kick[2];      /* handlers wake the supervisor through it to write outq (non-blocking) */
    int kicked;       /* a wakeup is in the kick pipe and outq not yet written since */
    int retiring;     /* broke the protocol and is being killed: takes no new job */
    pending *held;
    int inflight;
} coproc;

/* The coprocess whose supervisor runs on this thread (NULL on the worker's threads): the handler,
 * when the supervisor starts jobs itself, must neither wait for room nor kick its own supervisor. */
static _Thread_local coproc *on_supervisor;

struct coproc_pool {
    char **argv, **env;
    int k, share;
    void (*log)(void *, pgjobq_log_level, const char *);
    void *log_arg;
    pthread_mutex_t mu; /* held, inflight, pid, in_fd, stopping */
    pthread_cond_t cv;
    int stopping;
    coproc *cp;
};

static void plog(coproc_pool *p, pgjobq_log_level level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void plog(coproc_pool *p, pgjobq_log_level level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (p->log)
        p->log(p->log_arg, level, line);
}


static void deadline_in(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    int64_t ns = ts->tv_nsec + (ms % 1000) * 1000000;
    ts->tv_sec += (time_t)(ms / 1000 + ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

/* ------------------------------------------------------------------------------------------------ */
/* Replies                                                                                           */

/* Parses a reply line into its parts.  Returns 0 for a valid reply, -1 with why set otherwise; *id
 * is set (and *have_id) whenever the line names a job, valid or not. */
typedef struct reply {
    int64_t id;
    int have_id;
    pgjobq_outcome outcome;
    char *result, *error;
    int64_t delay_ms;
    char *progress; /* a progress line ({"id": ..., "progress": ...}, no status): not an answer */
} reply;

/* The common answer, exactly {"id": N, "status": "completed"} with any blanks between the tokens (as
 * json.dumps or JSON.stringify write it): sets *id and returns 1 without the general JSON path, which
 * reads any other line (the same answer with its members swapped, for one). */
static int plain_completion(const char *s, size_t len, int64_t *id)
{
    const char *e = s + len;
    int64_t v = 0;
    int digits = 0;

#define BLANKS()                                                                   \
    while (s < e && (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n'))         \
    s++
#define LITERAL(x)                                                                 \
    do {                                                                           \
        if ((size_t)(e - s) < sizeof(x) - 1 || memcmp(s, x, sizeof(x) - 1) != 0)   \
            return 0;                                                              \
        s += sizeof(x) - 1;                                                        \
    } while (0)
    BLANKS();
    LITERAL("{");
    BLANKS();
    LITERAL("\"id\"");
    BLANKS();
    LITERAL(":");
    BLANKS();
    for (; s < e && *s >= '0' && *s <= '9'; s++, digits++)
        v = v * 10 + (*s - '0');
    if (digits == 0 || digits > 18 || (digits > 1 && s[-digits] == '0'))
        return 0; /* none, more than an int64 surely holds, or a leading zero (not JSON) */
    BLANKS();
    LITERAL(",");
    BLANKS();
    LITERAL("\"status\"");
    BLANKS();
    LITERAL(":");
    BLANKS();
    LITERAL("\"completed\"");
    BLANKS();
    LITERAL("}");
    BLANKS();
#undef BLANKS
#undef LITERAL
    if (s != e)
        return 0;
    *id = v;
    return 1;
}

static int parse_reply(const char *line, size_t len, reply *r, char *why, size_t why_size)
{
    size_t n;
    const char *v;
    int ok;

    memset(r, 0, sizeof *r);
    r->delay_ms = -1;
    if (plain_completion(line, len, &r->id)) {
        r->have_id = 1;
        r->outcome = PGJOBQ_OUTCOME_COMPLETE;
        return 0;
    }
    if (pgjobq_json_check(line, len, why, why_size) != PGJOBQ_OK)
        return -1;
    if (line[strspn(line, " \t")] != '{') {
        snprintf(why, why_size, "not a JSON object");
        return -1;
    }
    v = json_member(line, "id", &n);
    r->id = json_integer(v, n, &ok);
    if (!ok) {
        snprintf(why, why_size, "no integer \"id\"");
        return -1;
    }
    r->have_id = 1;
    if (json_member(line, "status", &n) == NULL && (v = json_member(line, "progress", &n)) != NULL) {
        if ((r->progress = strndup(v, n)) == NULL) {
            snprintf(why, why_size, "out of memory");
            return -1;
        }
        return 0;
    }
    char *status = (v = json_member(line, "status", &n)) ? json_unquote(v, n) : NULL;
    if (status == NULL) {
        snprintf(why, why_size, "no \"status\" string");
        return -1;
    }
    if (strcmp(status, "completed") == 0) {
        r->outcome = PGJOBQ_OUTCOME_COMPLETE;
        if ((v = json_member(line, "result", &n)) != NULL && !(n == 4 && memcmp(v, "null", 4) == 0)) {
            r->result = strndup(v, n);
        }
    } else if (strcmp(status, "retry") == 0 || strcmp(status, "failed") == 0) {
        r->outcome = status[0] == 'r' ? PGJOBQ_OUTCOME_RETRY : PGJOBQ_OUTCOME_FAIL;
        if ((v = json_member(line, "error", &n)) != NULL)
            r->error = v[0] == '"' ? json_unquote(v, n) : strndup(v, n);
        if (r->outcome == PGJOBQ_OUTCOME_RETRY && (v = json_member(line, "delay_ms", &n)) != NULL) {
            r->delay_ms = json_integer(v, n, &ok);
            if (!ok || r->delay_ms < 0) {
                snprintf(why, why_size, "\"delay_ms\" must be a non-negative integer");
                free(status);
                free(r->error);
                r->error = NULL;
                return -1;
            }
        }
    } else {
        snprintf(why, why_size, "unknown status \"%.40s\" (completed, retry or failed)", status);
        free(status);
        return -1;
    }
    free(status);
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Supervision                                                                                       */

/* Gives a job the coprocess's answer (or ours): its result or error set, the outcome to end it with. */
static pgjobq_outcome answer(pgjobq_ctx *ctx, pgjobq_outcome out, const char *result, const char *error,
                             int64_t delay_ms)
{
    if (out == PGJOBQ_OUTCOME_COMPLETE && result && pgjobq_ctx_set_result(ctx, result) != PGJOBQ_OK) {
        pgjobq_ctx_set_error(ctx, "the coprocess's result is not storable JSON");
        out = PGJOBQ_OUTCOME_RETRY;
    } else if (out != PGJOBQ_OUTCOME_COMPLETE) {
        pgjobq_ctx_set_error(ctx, error ? error : out == PGJOBQ_OUTCOME_FAIL ? "failed" : "retry");
        if (out == PGJOBQ_OUTCOME_RETRY && delay_ms >= 0)
            pgjobq_ctx_set_retry_delay(ctx, delay_ms);
    }
    return out;
}

/* Ends a job with the coprocess's answer (or ours) and frees its entry: without p->mu. */
static void finish(pending *pe, pgjobq_outcome out, const char *result, const char *error, int64_t delay_ms)
{
    pgjobq_ctx_finish(pe->ctx, answer(pe->ctx, out, result, error, delay_ms));
    free(pe);
}

/* Takes every job the coprocess holds (to end each with a failed attempt, retried): under p->mu. */
static pending *take_held(coproc *c)
{
    pending *list = c->held;
    c->held = NULL;
    c->inflight = 0;
    pthread_cond_broadcast(&c->pool->cv);
    return list;
}

static void finish_all(pending *list, const char *why)
{
    while (list) {
        pending *next = list->next;
        finish(list, PGJOBQ_OUTCOME_RETRY, NULL, why, -1);
        list = next;
    }
}

/* Unlinks the job a reply names: under p->mu.  NULL when no job of this coprocess waits for that id
 * (a late answer to a job given up: ignored). */
static pending *take_reply(coproc *c, int64_t id)
{
    for (pending **pp = &c->held; *pp; pp = &(*pp)->next) {
        pending *pe = *pp;
        if (pe->id != id)
            continue;
        *pp = pe->next;
        c->inflight--;
        if (c->inflight == c->pool->share - 1)
            pthread_cond_broadcast(&c->pool->cv); /* a slot opened on a full coprocess */
        return pe;
    }
    return NULL;
}

/* Gives up the jobs that must stop (timeout, cancel, lost lease, shutdown): tells the coprocess and
 * ends them.  Without p->mu. */
static int send_line(coproc *c, const char *line, size_t len);
static void give_up_stopped(coproc *c)
{
    coproc_pool *p = c->pool;
    pending *stopped = NULL;

    pthread_mutex_lock(&p->mu);
    for (pending **pp = &c->held; *pp;) {
        pending *pe = *pp;
        if (!pgjobq_ctx_should_stop(pe->ctx)) {
            pp = &pe->next;
            continue;
        }
        *pp = pe->next;
        c->inflight--;
        pe->next = stopped;
        stopped = pe;
    }
    if (stopped)
        pthread_cond_broadcast(&p->cv); /* their slots are free */
    pthread_mutex_unlock(&p->mu);
    while (stopped) {
        pending *next = stopped->next;
        char cancel[64];
        int n = snprintf(cancel, sizeof cancel, "{\"cancel\":%lld}\n", (long long)stopped->id);
        (void)send_line(c, cancel, (size_t)n);
        pgjobq_stop_reason why = pgjobq_ctx_stop_reason(stopped->ctx);
        const char *msg = why == PGJOBQ_STOP_TIMEOUT     ? "timed out: the coprocess was told to cancel it"
                          : why == PGJOBQ_STOP_CANCELLED ? "cancelled"
                          : why == PGJOBQ_STOP_SHUTDOWN  ? "stopped by the worker (shutdown)"
                                                         : "stopped by the worker (lease lost)";
        finish(stopped, why == PGJOBQ_STOP_CANCELLED ? PGJOBQ_OUTCOME_CANCEL : PGJOBQ_OUTCOME_RETRY, NULL, msg, -1);
        stopped = next;
    }
}

/* Starts the coprocess: its pid, with the ends of its pipes that are ours, or -1 (logged). */
static pid_t start(coproc *c, int *in_fd, int *out_fd, int *err_fd)
{
    coproc_pool *p = c->pool;
    int fds[3];
    pid_t pid = 0;

    int rc = spawn_piped(p->argv, p->env, &pid, fds);
    if (rc != 0) {
        if (rc > 0)
            plog(p, PGJOBQ_LOG_ERROR, "coprocess %d: cannot run %s: %s", c->index, p->argv[0], strerror(rc));
        return -1;
    }
    *in_fd = fds[0];
    *out_fd = fds[1];
    *err_fd = fds[2];
    return pid;
}

/* Writes the queued lines while the pipe takes them: called and returns under p->mu, which it drops
 * while writing.  What the pipe does not take now stays queued, for the supervisor to write when the
 * pipe has room.  (Lines queued while it writes go out in its next turn of the loop.) */
static void flush_locked(coproc *c)
{
    coproc_pool *p = c->pool;

    c->flushing = 1;
    while (c->outq.len > 0 && c->in_fd >= 0) {
        int fd = c->in_fd, full = 0;
        sbuf q = c->outq;
        size_t done = 0;
        sb_init(&c->outq);
        pthread_mutex_unlock(&p->mu);
        while (done < q.len) {
            ssize_t n = write(fd, q.data + done, q.len - done);
            if (n > 0)
                done += (size_t)n;
            else if (n < 0 && errno == EINTR)
                continue;
            else {
                full = n < 0 && errno == EAGAIN;
                break; /* full, or the coprocess is gone (its supervisor sees it exit) */
            }
        }
        pthread_mutex_lock(&p->mu);
        if (full) {
            sbuf rest;
            sb_init(&rest);
            sb_putn(&rest, q.data + done, q.len - done);
            if (c->outq.len)
                sb_putn(&rest, c->outq.data, c->outq.len);
            sb_free(&c->outq);
            c->outq = rest;
            sb_free(&q);
            break;
        }
        sb_free(&q);
    }
    c->flushing = 0;
    pthread_cond_broadcast(&p->cv);
}

/* Queues a line for the coprocess and writes what the pipe takes now.  -1 when it is not running. */
static int send_line(coproc *c, const char *line, size_t len)
{
    coproc_pool *p = c->pool;
    int rc = 0;

    pthread_mutex_lock(&p->mu);
    if (c->in_fd < 0) {
        rc = -1;
    } else {
        sb_putn(&c->outq, line, len);
        if (c->outq.failed) {
            sb_free(&c->outq);
            rc = -1;
        } else if (!c->flushing) {
            flush_locked(c);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Hands a progress line's value to its job, if the coprocess still holds it (a late line for a job
 * given up is ignored). */
static void set_progress(coproc *c, int64_t id, const char *json)
{
    coproc_pool *p = c->pool;
    int rc = PGJOBQ_OK, found = 0;

    pthread_mutex_lock(&p->mu);
    for (pending *pe = c->held; pe; pe = pe->next) {
        if (pe->id == id) {
            rc = pgjobq_ctx_set_progress(pe->ctx, json);
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (rc != PGJOBQ_OK)
        plog(p, PGJOBQ_LOG_WARN, "coprocess %d: the progress of job %lld is not JSON of at most %d bytes: ignored",
             c->index, (long long)id, PGJOBQ_PROGRESS_MAX);
    else if (!found)
        plog(p, PGJOBQ_LOG_DEBUG, "coprocess %d: progress of job %lld, which no longer waits (ignored)", c->index,
             (long long)id);
}

/* Quotes the start of a bad line for the log. */
static void quote(char *dst, size_t size, const char *line, size_t len)
{
    size_t n = len < QUOTE_MAX ? len : QUOTE_MAX;
    size_t k = 0;
    for (size_t i = 0; i < n && k + 2 < size; i++)
        dst[k++] = (line[i] >= 32 && line[i] < 127) ? line[i] : '?';
    dst[k] = '\0';
    if (len > n && k + 4 < size)
        strcat(dst, "...");
}

/* Runs one life of the coprocess: until it exits, breaks the protocol, or the pool stops.  Returns
 * how long it lived (ms). */
static int64_t one_life(coproc *c)
{
    coproc_pool *p = c->pool;
    int in_fd = -1, out_fd = -1, err_fd = -1;
    int64_t born = cli_mono_ms();
    sbuf out, err;
    char why[300];
    int status = 0, bad = 0;
    reply *batch = NULL;
    pending **taken = NULL;
    size_t nbatch = 0, capbatch = 0;
    int64_t next_scan = 0;
    /* The jobs one read ends, for pgjobq_ctx_finish_many: each was in flight, so at most `share`. */
    pgjobq_ctx **ended = malloc((size_t)p->share * sizeof *ended);
    pgjobq_outcome *outcomes = malloc((size_t)p->share * sizeof *outcomes);

    if (ended == NULL || outcomes == NULL) {
        plog(p, PGJOBQ_LOG_ERROR, "coprocess %d: out of memory before starting it", c->index);
        free(ended);
        free(outcomes);
        return 0;
    }
    pid_t pid = start(c, &in_fd, &out_fd, &err_fd);
    if (pid < 0) {
        free(ended);
        free(outcomes);
        return 0;
    }
    pthread_mutex_lock(&p->mu);
    c->pid = pid;
    c->in_fd = in_fd;
    c->retiring = 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    plog(p, PGJOBQ_LOG_INFO, "coprocess %d started (pid %d)", c->index, (int)pid);

    sb_init(&out);
    sb_init(&err);
    while (out_fd >= 0 || err_fd >= 0) {
        /* Input: lines the pipe could not take yet; at a stop, its end once all is written. */
        pthread_mutex_lock(&p->mu);
        if (p->stopping && c->in_fd >= 0 && c->outq.len == 0 && !c->flushing) {
            close(c->in_fd);
            c->in_fd = -1;
        }
        int want_out = c->in_fd >= 0 && c->outq.len > 0 && !c->flushing ? c->in_fd : -1;
        pthread_mutex_unlock(&p->mu);
        struct pollfd fds[4] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}, {want_out, POLLOUT, 0}, {c->kick[0], POLLIN, 0}};
        char buf[65536];
        if (poll(fds, 4, STOP_SCAN_MS) < 0 && errno != EINTR)
            break;
        int64_t now = cli_mono_ms();
        if (now >= next_scan) {
            give_up_stopped(c);
            next_scan = now + STOP_SCAN_MS;
        }
        if (fds[3].revents) {
            while (read(c->kick[0], buf, 64) == 64) {
            }
        }
        if (fds[2].revents || fds[3].revents) {
            pthread_mutex_lock(&p->mu);
            c->kicked = 0;
            if (!c->flushing)
                flush_locked(c);
            pthread_mutex_unlock(&p->mu);
        }
        for (int f = 0; f < 2; f++) {
            int *fd = f ? &err_fd : &out_fd;
            sbuf *b = f ? &err : &out;
            if (*fd < 0 || !fds[f].revents)
                continue;
            ssize_t n = read(*fd, buf, sizeof buf);
            if (n <= 0) {
                if (n < 0 && (errno == EINTR || errno == EAGAIN))
                    continue;
                close(*fd);
                *fd = -1;
                continue;
            }
            sb_putn(b, buf, (size_t)n);
            /* Every complete line. */
            size_t start = 0;
            for (size_t i = 0; i < b->len; i++) {
                if (b->data[i] != '\n')
                    continue;
                b->data[i] = '\0';
                const char *line = b->data + start;
                size_t len = i - start;
                start = i + 1;
                if (f) {
                    plog(p, PGJOBQ_LOG_WARN, "coprocess %d: %s", c->index, line);
                    continue;
                }
                if (len == 0 || bad)
                    continue;
                reply r;
                if (parse_reply(line, len, &r, why, sizeof why) != 0) {
                    char q[QUOTE_MAX + 8], msg[600];
                    quote(q, sizeof q, line, len);
                    plog(p, PGJOBQ_LOG_ERROR, "coprocess %d wrote a line that is not a valid reply (%s): '%s'; "
                                              "restarting it",
                         c->index, why, q);
                    snprintf(msg, sizeof msg, "the coprocess wrote a malformed reply (%s): '%s'", why, q);
                    pthread_mutex_lock(&p->mu);
                    c->retiring = 1;
                    pending *pe = r.have_id ? take_reply(c, r.id) : NULL;
                    pthread_mutex_unlock(&p->mu);
                    if (pe)
                        finish(pe, PGJOBQ_OUTCOME_RETRY, NULL, msg, -1);
                    free(r.result);
                    free(r.error);
                    bad = 1;
                    kill(-pid, SIGKILL);
                    continue;
                }
                if (r.progress) {
                    /* Now, before the answers of this read are delivered (one may end the job). */
                    set_progress(c, r.id, r.progress);
                    free(r.progress);
                    continue;
                }
                /* Kept, to be delivered with the rest of this read under one lock. */
                if (nbatch == capbatch) {
                    size_t cap = capbatch ? capbatch * 2 : 64;
                    reply *nb = realloc(batch, cap * sizeof *nb);
                    if (nb != NULL)
                        batch = nb;
                    pending **nt = nb ? realloc(taken, cap * sizeof *nt) : NULL;
                    if (nt == NULL) {
                        free(r.result);
                        free(r.error);
                        continue; /* its job times out, as if the reply were lost */
                    }
                    taken = nt;
                    capbatch = cap;
                }
                batch[nbatch++] = r;
            }
            if (nbatch) {
                /* The jobs under one lock; then all ended at once without it (one wakeup of the
                 * worker for the read, not one per job). */
                size_t nended = 0;
                pthread_mutex_lock(&p->mu);
                for (size_t k = 0; k < nbatch; k++)
                    taken[k] = take_reply(c, batch[k].id);
                pthread_mutex_unlock(&p->mu);
                for (size_t k = 0; k < nbatch; k++) {
                    if (taken[k]) {
                        ended[nended] = taken[k]->ctx;
                        outcomes[nended++] = answer(taken[k]->ctx, batch[k].outcome, batch[k].result, batch[k].error,
                                                    batch[k].delay_ms);
                        free(taken[k]);
                    } else {
                        plog(p, PGJOBQ_LOG_DEBUG, "coprocess %d answered job %lld, which no longer waits (ignored)",
                             c->index, (long long)batch[k].id);
                    }
                    free(batch[k].result);
                    free(batch[k].error);
                }
                if (bad || c->retiring) {
                    pgjobq_ctx_finish_many(ended, outcomes, nended);
                } else {
                    /* The jobs waiting for the slots these free start here, with no handler thread
                     * woken; the lines they queued for this coprocess go out in one write. */
                    (void)pgjobq_ctx_finish_many_and_run(ended, outcomes, nended, nended);
                    pthread_mutex_lock(&p->mu);
                    if (c->outq.len > 0 && !c->flushing)
                        flush_locked(c);
                    pthread_mutex_unlock(&p->mu);
                }
                nbatch = 0;
            }
            if (start > 0) {
                memmove(b->data, b->data + start, b->len - start);
                b->len -= start;
                b->data[b->len] = '\0';
            }
            if (b->len > LINE_MAX_BYTES || b->failed) {
                if (!f && !bad) {
                    plog(p, PGJOBQ_LOG_ERROR, "coprocess %d wrote a line longer than %d bytes; restarting it",
                         c->index, LINE_MAX_BYTES);
                    pthread_mutex_lock(&p->mu);
                    c->retiring = 1;
                    pthread_mutex_unlock(&p->mu);
                    bad = 1;
                    kill(-pid, SIGKILL);
                }
                b->len = 0;
                b->failed = 0;
            }
        }
    }
    if (out_fd >= 0)
        close(out_fd);
    if (err_fd >= 0)
        close(err_fd);
    sb_free(&out);
    sb_free(&err);
    free(batch);
    free(taken);
    free(ended);
    free(outcomes);
    /* Its input is closed once no thread is writing to it; lines still queued go nowhere. */
    pthread_mutex_lock(&p->mu);
    in_fd = c->in_fd;
    c->in_fd = -1;
    while (c->flushing)
        pthread_cond_wait(&p->cv, &p->mu);
    sb_free(&c->outq);
    pthread_mutex_unlock(&p->mu);
    if (in_fd >= 0)
        close(in_fd);
    kill(-pid, SIGKILL); /* whatever it left in its group */
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status))
        snprintf(why, sizeof why, "the coprocess (pid %d) exited with status %d before answering", (int)pid,
                 WEXITSTATUS(status));
    else
        snprintf(why, sizeof why, "the coprocess (pid %d) was killed by signal %d before answering", (int)pid,
                 WTERMSIG(status));
    pthread_mutex_lock(&p->mu);
    c->pid = 0;
    pending *held = take_held(c);
    int stopping = p->stopping;
    pthread_mutex_unlock(&p->mu);
    finish_all(held, bad ? "the coprocess was restarted after a malformed reply before answering" : why);
    if (!stopping)
        plog(p, PGJOBQ_LOG_WARN, "%s; restarting it", why + 4);
    return cli_mono_ms() - born;
}

static void *supervise(void *arg)
{
    coproc *c = arg;
    coproc_pool *p = c->pool;
    int64_t backoff = BACKOFF_MIN_MS;

    on_supervisor = c;

    for (;;) {
        pthread_mutex_lock(&p->mu);
        int stopping = p->stopping;
        pthread_mutex_unlock(&p->mu);
        if (stopping)
            break;
        int64_t lived = one_life(c);
        backoff = lived > 10000 ? BACKOFF_MIN_MS : backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
        struct timespec until;
        deadline_in(&until, backoff);
        pthread_mutex_lock(&p->mu);
        while (!p->stopping && pthread_cond_timedwait(&p->cv, &p->mu, &until) == 0) {
        }
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

coproc_pool *coproc_start(char **argv, char **env, int k, int share,
                          void (*log)(void *arg, pgjobq_log_level level, const char *msg), void *log_arg)
{
    coproc_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->cp = calloc((size_t)k, sizeof *p->cp);
    if (p->cp == NULL) {
        free(p);
        return NULL;
    }
    p->argv = argv;
    p->env = env;
    p->k = k;
    p->share = share < 1 ? 1 : share;
    p->log = log;
    p->log_arg = log_arg;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p->cp);
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p->cp);
        free(p);
        return NULL;
    }
    for (int i = 0; i < k; i++) {
        coproc *c = &p->cp[i];
        c->pool = p;
        c->index = i;
        c->in_fd = -1;
        c->kick[0] = c->kick[1] = -1;
        sb_init(&c->outq);
        if (pipe2(c->kick, O_CLOEXEC | O_NONBLOCK) != 0) {
            plog(p, PGJOBQ_LOG_ERROR, "cannot start coprocess %d: pipe: %s", i, strerror(errno));
            c->kick[0] = c->kick[1] = -1;
            c->thread = 0;
            continue;
        }
        if (pthread_create(&c->thread, NULL, supervise, c) != 0) {
            plog(p, PGJOBQ_LOG_ERROR, "cannot start the thread of coprocess %d", i);
            c->thread = 0;
        }
    }
    return p;
}

void coproc_stop(coproc_pool *p, int64_t grace_ms)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    /* Each supervisor now closes its coprocess's input (end of input: a well-behaved handler exits). */
    pthread_mutex_unlock(&p->mu);
    int64_t until = cli_mono_ms() + grace_ms;
    for (;;) {
        int running = 0;
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->k; i++)
            running += p->cp[i].pid > 0;
        pthread_mutex_unlock(&p->mu);
        if (!running || cli_mono_ms() >= until)
            break;
        usleep(20000);
    }
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->k; i++)
        if (p->cp[i].pid > 0)
            kill(-p->cp[i].pid, SIGKILL);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->k; i++) {
        if (p->cp[i].thread)
            pthread_join(p->cp[i].thread, NULL);
        sb_free(&p->cp[i].outq);
        for (int e = 0; e < 2; e++)
            if (p->cp[i].kick[e] >= 0)
                close(p->cp[i].kick[e]);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->cp);
    free(p);
}

/* ------------------------------------------------------------------------------------------------ */
/* The handler                                                                                       */

pgjobq_outcome coproc_handler(pgjobq_ctx *ctx, void *arg)
{
    coproc_pool *p = arg;
    const pgjobq_job *job = pgjobq_ctx_job(ctx);
    coproc *c = NULL;
    sbuf line;
    pending *pe = calloc(1, sizeof *pe);

    if (pe == NULL) {
        pgjobq_ctx_set_error(ctx, "the worker ran out of memory handing the job to the coprocess");
        return PGJOBQ_OUTCOME_RETRY;
    }
    pe->id = job->id;
    pe->ctx = ctx;

    /* The line first: once the job is linked, its reply may end it (and free ctx) at any moment. */
    sb_init(&line);
    sb_puts(&line, "{\"id\":");
    sb_int(&line, job->id);
    sb_puts(&line, ",\"queue\":");
    sb_json(&line, job->queue);
    sb_puts(&line, ",\"kind\":");
    sb_json(&line, job->kind);
    sb_puts(&line, ",\"attempt\":");
    sb_int(&line, job->attempt);
    sb_puts(&line, ",\"max_attempts\":");
    sb_int(&line, job->max_attempts);
    sb_puts(&line, ",\"deadline_ms\":");
    sb_int(&line, pgjobq_ctx_time_left_ms(ctx));
    sb_puts(&line, ",\"payload\":");
    sb_puts(&line, job->payload);
    if (job->parents) { /* a job that waited for others: their states and results */
        sb_puts(&line, ",\"parents\":");
        sb_puts(&line, job->parents);
    }
    sb_puts(&line, "}\n");
    if (line.failed) {
        sb_free(&line);
        free(pe);
        pgjobq_ctx_set_error(ctx, "the worker ran out of memory handing the job to the coprocess");
        return PGJOBQ_OUTCOME_RETRY;
    }

    /* A running coprocess with room (waiting for one while the job may still run); then, under the
     * same lock, the job is linked and its line queued, so that a coprocess that dies meanwhile ends
     * it with the rest of what it held. */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        c = NULL;
        for (int i = 0; i < p->k; i++) {
            coproc *x = &p->cp[i];
            if (x->pid > 0 && x->in_fd >= 0 && !x->retiring && x->inflight < p->share &&
                (c == NULL || x->inflight < c->inflight))
                c = x;
        }
        if (c || p->stopping || pgjobq_ctx_should_stop(ctx))
            break;
        if (on_supervisor) {
            /* Started by a supervisor, which must not wait (it reads the replies that make room): its
             * own coprocess takes the job, over its share if it must.  Only a coprocess dying as
             * another's supervisor starts jobs leaves no room while a slot is free. */
            coproc *own = on_supervisor;
            if (own->pool == p && own->pid > 0 && own->in_fd >= 0 && !own->retiring)
                c = own;
            break;
        }
        struct timespec until;
        deadline_in(&until, 100);
        pthread_cond_timedwait(&p->cv, &p->mu, &until);
    }
    if (c != NULL) {
        sb_putn(&c->outq, line.data, line.len);
        if (c->outq.failed) {
            sb_free(&c->outq);
            c = NULL;
        }
    }
    if (c == NULL) {
        pthread_mutex_unlock(&p->mu);
        sb_free(&line);
        free(pe);
        pgjobq_ctx_set_error(ctx, "no coprocess was running to take the job (see the worker's log)");
        return PGJOBQ_OUTCOME_RETRY;
    }
    pe->next = c->held;
    c->held = pe;
    c->inflight++;
    /* The supervisor writes the lines: woken once for all the lines queued until it runs, so that a
     * burst of jobs reaches the coprocess in one write (and wakes it once) rather than a line each. */
    int kick = !c->kicked && !c->flushing && c != on_supervisor; /* a supervisor flushes what it started */
    c->kicked |= kick;
    int kick_fd = c->kick[1];
    pthread_mutex_unlock(&p->mu);
    sb_free(&line);
    if (kick) {
        char one = 1;
        ssize_t n = write(kick_fd, &one, 1); /* a full pipe already holds a wakeup */
        (void)n;
    }
    return PGJOBQ_OUTCOME_PENDING;
}
