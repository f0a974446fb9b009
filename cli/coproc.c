/*
 * coproc.c - long-lived handler processes for `pgjobq work --coproc CMD` (protocol: docs/coproc.md).
 *
 * Each coprocess has one supervising thread: it starts the process (own process group, the worker's
 * environment without its PG* variables and DATABASE_URL unless told otherwise, stdin/stdout/stderr on
 * pipes), reads its stdout replies and stderr lines (logged at the level each says, at most
 * STDERR_LINES_MAX a STDERR_WINDOW_MS), and when the process exits or writes a line that is not a
 * valid reply, fails the jobs it held (each counts a failed attempt and is retried) and starts it again
 * after a backoff.  A process that exits before it said anything valid (its {"ready": true}, an answer,
 * a progress line) could not start: a broken deployment, not failed jobs.  Its jobs are handed back
 * without using an attempt (PGJOBQ_OUTCOME_HAND_BACK), its last stderr lines (a traceback) are the
 * reason, and the worker is told it is unhealthy (it claims nothing) until a copy starts.
 * The handler queues a job line and returns at once (PGJOBQ_OUTCOME_PENDING); the supervisor ends
 * the jobs when their replies come (those of one read together), so no thread waits per job, and in
 * the same call (pgjobq_ctx_finish_many_and_run) starts on its own thread the jobs that were waiting
 * for the slots it freed, then writes their lines in one go.  A handler thread (when a claim finds
 * slots free) wakes the supervisor once through its kick pipe instead.  At most `share` jobs are in
 * flight on one coprocess (a few more for a moment while another is restarted).  A job
 * that must stop (timeout, cancel, lost lease, shutdown) is given up by the supervisor, which tells the
 * coprocess with a {"cancel": ID} line.
 *
 * Durable execution (protocol 3, docs/durable.md): a coprocess asks for a job's stored step, stores
 * one, sleeps or waits for an event with a request line; the supervisor queues it for the pool's step
 * threads (started when the first request comes), which run it on the connection the worker lends
 * to the job (pgjobq_ctx_client) and write the answer.  A job whose request is being served is busy:
 * nothing else ends it meanwhile (its context must outlive the request); one given up or left by
 * its coprocess meanwhile is ended by the step thread when the request is done.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coproc.h"
#include "sbuf.h"
#include "spawn.h"

#define BACKOFF_MIN_MS        100
#define BACKOFF_MAX_MS        5000
#define BROKEN_BACKOFF_MAX_MS 30000 /* a copy that cannot start is tried again at most this often */
#define QUOTE_MAX             200   /* how much of a bad line the log quotes */
#define STOP_SCAN_MS          50    /* how often the supervisor looks for jobs that must stop */
#define STDERR_LINES_MAX      1000  /* stderr lines logged per coprocess per window; the others counted */
#define STDERR_WINDOW_MS      10000
#define TAIL_MAX              3000 /* the last stderr lines kept, for the reason of a copy that cannot start */
#define START_GRACE_MS        2000 /* a copy that never says it is ready counts as started after this */
#define STRIKES_MAX           3    /* (such a copy) a job handed back this often is a failed attempt */
#define STRIKE_SLOTS          256
#define DELAY_MAX_MS          INT64_C(3155760000000) /* 100 years: the longest delay_ms of a snooze */
#define STEP_THREADS_MAX      4     /* threads that serve the coprocesses' step requests, at most */

/* One job waiting for its reply (its handler returned PENDING): whoever unlinks it from `held`
 * (under the pool's mutex) ends the job and frees it. */
typedef struct pending {
    struct pending *next;
    int64_t id;
    pgjobq_ctx *ctx;
    int struck_out; /* handed back by copies that could not start too often: a failed attempt */
    int busy;       /* a step thread serves a request of the job: only it may end the job */
    int orphan;     /* its coprocess ended while it was busy: the step thread ends it (a failed attempt) */
} pending;

/* A request of a coprocess about a job's steps (protocol 3): a step asked for or stored, a sleep, a
 * wait for an event. */
enum { REQ_STEP, REQ_SLEEP, REQ_WAIT };
typedef struct step_req {
    struct step_req *next;
    struct coproc *c;
    int64_t id;
    int kind;
    char *name;
    char *result;       /* REQ_STEP: the result to store (JSON text); NULL: a question */
    int64_t delay_ms;   /* REQ_SLEEP */
    char *event, *key;  /* REQ_WAIT */
    int64_t timeout_ms; /* REQ_WAIT: -1 for none */
} step_req;

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
    int broke; /* (the supervisor's) its last life ended before it started */
    /* The supervisor's own (this life): */
    int answered;            /* wrote a valid line: it has started */
    char tail[TAIL_MAX + 1]; /* its last stderr lines */
    size_t tail_len;
    int64_t err_window_ms; /* stderr lines in this window, and those not logged */
    int err_lines;
    long long err_dropped;
} coproc;

/* The coprocess whose supervisor runs on this thread (NULL on the worker's threads): the handler,
 * when the supervisor starts jobs itself, must neither wait for room nor kick its own supervisor. */
static _Thread_local coproc *on_supervisor;

struct coproc_pool {
    char **argv, **env;
    int k, share;
    void (*log)(void *, pgjobq_log_level, const char *);
    void *log_arg;
    void (*health)(void *, const char *);
    void *health_arg;
    pthread_mutex_t mu; /* held, inflight, pid, in_fd, stopping, broken, broken_why, ready_seen, strikes */
    pthread_cond_t cv;
    int stopping;
    _Atomic int draining; /* the worker is stopping (a signal): no copy is started again */
    int broken;           /* the last copy to end could not start, and none has started since */
    char *broken_why;     /* why (malloc'd), for the jobs handed back meanwhile */
    int ready_seen;       /* a copy said {"ready": true}: copies are judged by it */
    struct {
        int64_t id;
        int n;
    } strikes[STRIKE_SLOTS]; /* jobs handed back by copies that could not start, and how often */
    int next_strike;
    coproc *cp;
    /* Step requests (protocol 3), served by up to STEP_THREADS_MAX threads, under mu. */
    step_req *steps;
    pthread_cond_t step_cv;
    pthread_t step_threads[STEP_THREADS_MAX];
    int nstep_threads, step_idle, steps_stop;
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
    int ready;      /* {"ready": true}: the coprocess has started (protocol 2); no job named */
    step_req *req;  /* a step request (protocol 3): not an answer */
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

static void req_free(step_req *q)
{
    if (q == NULL)
        return;
    free(q->name);
    free(q->result);
    free(q->event);
    free(q->key);
    free(q);
}

/* A member that must be a string of 1 to PGJOBQ_STEP_NAME_MAX characters (may_be_empty: 0 to), or
 * absent when optional: 0 with *out (malloc'd, NULL when absent), else -1 with why. */
static int name_member(const char *line, const char *key, int optional, int may_be_empty, char **out, char *why,
                       size_t why_size)
{
    size_t n;
    const char *v = json_member(line, key, &n);

    *out = NULL;
    if (v == NULL && optional)
        return 0;
    if (v == NULL || v[0] != '"' || (*out = json_unquote(v, n)) == NULL || (!may_be_empty && (*out)[0] == '\0') ||
        strlen(*out) > 4 * PGJOBQ_STEP_NAME_MAX) {
        free(*out);
        *out = NULL;
        snprintf(why, why_size, "\"%s\" must be a string of %d to %d characters", key, may_be_empty ? 0 : 1,
                 PGJOBQ_STEP_NAME_MAX);
        return -1;
    }
    return 0;
}

/* A step request (protocol 3, docs/coproc.md): {"id", "step"[, "result"]}, {"id", "sleep", "delay_ms"}
 * or {"id", "wait", "event"[, "key"][, "timeout_ms"]}. */
static int parse_request(const char *line, reply *r, char *why, size_t why_size)
{
    step_req *q = calloc(1, sizeof *q);
    const char *v;
    size_t n;
    int ok = 1;

    if (q == NULL) {
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    q->id = r->id;
    q->timeout_ms = -1;
    if (json_member(line, "step", &n)) {
        q->kind = REQ_STEP;
        if (name_member(line, "step", 0, 0, &q->name, why, why_size) != 0)
            goto bad;
        if ((v = json_member(line, "result", &n)) != NULL && (q->result = strndup(v, n)) == NULL) {
            snprintf(why, why_size, "out of memory");
            goto bad;
        }
    } else if (json_member(line, "sleep", &n)) {
        q->kind = REQ_SLEEP;
        if (name_member(line, "sleep", 0, 0, &q->name, why, why_size) != 0)
            goto bad;
        v = json_member(line, "delay_ms", &n);
        q->delay_ms = json_integer(v, n, &ok);
        if (!ok || q->delay_ms < 0 || q->delay_ms > DELAY_MAX_MS) {
            snprintf(why, why_size, "a sleep's \"delay_ms\" must be an integer from 0 to 100 years");
            goto bad;
        }
    } else {
        q->kind = REQ_WAIT;
        if (name_member(line, "wait", 0, 0, &q->name, why, why_size) != 0 ||
            name_member(line, "event", 0, 0, &q->event, why, why_size) != 0 ||
            name_member(line, "key", 1, 1, &q->key, why, why_size) != 0)
            goto bad;
        if ((v = json_member(line, "timeout_ms", &n)) != NULL && !(n == 4 && memcmp(v, "null", 4) == 0)) {
            q->timeout_ms = json_integer(v, n, &ok);
            if (!ok || q->timeout_ms < 0 || q->timeout_ms > DELAY_MAX_MS) {
                snprintf(why, why_size, "a wait's \"timeout_ms\" must be an integer from 0 to 100 years");
                goto bad;
            }
        }
    }
    r->req = q;
    return 0;
bad:
    req_free(q);
    return -1;
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
    if (pgjobq_json_check_limit(line, len, COPROC_LINE_MAX, why, why_size) != PGJOBQ_OK)
        return -1;
    if (line[strspn(line, " \t")] != '{') {
        snprintf(why, why_size, "not a JSON object");
        return -1;
    }
    if (json_member(line, "id", &n) == NULL && (v = json_member(line, "ready", &n)) != NULL) {
        if (!(n == 4 && memcmp(v, "true", 4) == 0)) {
            snprintf(why, why_size, "\"ready\" must be true");
            return -1;
        }
        r->ready = 1;
        return 0;
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
    if (json_member(line, "status", &n) == NULL &&
        (json_member(line, "step", &n) || json_member(line, "sleep", &n) || json_member(line, "wait", &n)))
        return parse_request(line, r, why, why_size);
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
    } else if (strcmp(status, "snooze") == 0) {
        /* Handed back untouched: not an attempt (protocol 2); with "hand_back": true, not run at all (a
         * kind the coprocess does not know), which counts no snooze. */
        r->outcome = PGJOBQ_OUTCOME_SNOOZE;
        if ((v = json_member(line, "hand_back", &n)) != NULL) {
            if (n == 4 && memcmp(v, "true", 4) == 0)
                r->outcome = PGJOBQ_OUTCOME_HAND_BACK;
            else if (!(n == 5 && memcmp(v, "false", 5) == 0)) {
                snprintf(why, why_size, "a snooze's \"hand_back\" must be true or false");
                free(status);
                return -1;
            }
        }
        if ((v = json_member(line, "reason", &n)) != NULL)
            r->error = v[0] == '"' ? json_unquote(v, n) : strndup(v, n);
        if ((v = json_member(line, "delay_ms", &n)) != NULL) {
            r->delay_ms = json_integer(v, n, &ok);
            if (!ok || r->delay_ms < 0 || r->delay_ms > DELAY_MAX_MS) {
                snprintf(why, why_size, "a snooze's \"delay_ms\" must be an integer from 0 to 100 years");
                free(status);
                free(r->error);
                r->error = NULL;
                return -1;
            }
        }
    } else {
        snprintf(why, why_size, "unknown status \"%.40s\" (completed, retry, failed or snooze)", status);
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
        char why[160];
        size_t len = strlen(result);
        if (len > PGJOBQ_PAYLOAD_MAX)
            snprintf(why, sizeof why, "the coprocess's result is %zu bytes of JSON: at most %d are stored", len,
                     PGJOBQ_PAYLOAD_MAX);
        else
            snprintf(why, sizeof why, "the coprocess's result is not storable JSON");
        pgjobq_ctx_set_error(ctx, why);
        out = PGJOBQ_OUTCOME_RETRY;
    } else if (out == PGJOBQ_OUTCOME_SNOOZE || out == PGJOBQ_OUTCOME_HAND_BACK) {
        if (error)
            pgjobq_ctx_set_error(ctx, error);
        if (delay_ms >= 0)
            pgjobq_ctx_set_retry_delay(ctx, delay_ms);
    } else if (out != PGJOBQ_OUTCOME_COMPLETE && out != PGJOBQ_OUTCOME_PARKED) {
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

/* Takes every job the coprocess holds (to end each with a failed attempt, retried): under p->mu.  A
 * busy one is left to its step thread, which ends it. */
static pending *take_held(coproc *c)
{
    pending *list = NULL;
    for (pending *pe = c->held, *next; pe; pe = next) {
        next = pe->next;
        if (pe->busy) {
            pe->orphan = 1;
            pe->next = NULL;
            continue;
        }
        pe->next = list;
        list = pe;
    }
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
        if (pe->busy)
            return NULL; /* an answer while its request is served: ignored (the job is its step thread's) */
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
        if (pe->busy || !pgjobq_ctx_should_stop(pe->ctx)) {
            pp = &pe->next; /* (a busy one is given up once its request is done) */
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

/* ------------------------------------------------------------------------------------------------ */
/* Step requests (protocol 3)                                                                        */

/* The job a coprocess holds under id: under p->mu. */
static pending *find_held(coproc *c, int64_t id)
{
    for (pending *pe = c->held; pe; pe = pe->next)
        if (pe->id == id)
            return pe;
    return NULL;
}

/* Runs a request on the job's lent connection and writes the answer into ans (without the final
 * newline).  Returns 1 when the job was parked there (or ended cancelled): its attempt is over. */
static int serve(step_req *q, pgjobq_ctx *ctx, sbuf *ans, int *cancelled)
{
    char *value = NULL;
    const char *err = NULL;
    int rc;

    *cancelled = 0;
    sb_puts(ans, "{\"id\":");
    sb_int(ans, q->id);
    sb_puts(ans, q->kind == REQ_STEP ? ",\"step\":" : q->kind == REQ_SLEEP ? ",\"sleep\":" : ",\"wait\":");
    sb_json(ans, q->name);
    if (q->kind == REQ_STEP) {
        /* The job's steps are read once per attempt (pgjobq_ctx_step_get), then each new one is stored
         * in one round trip. */
        if (q->result == NULL) {
            rc = pgjobq_ctx_step_get(ctx, q->name, &value);
            if (rc == PGJOBQ_OK) {
                sb_puts(ans, ",\"stored\":true,\"result\":");
                sb_puts(ans, value);
            } else if (rc == PGJOBQ_ENOTFOUND) {
                sb_puts(ans, ",\"stored\":false");
            } else {
                err = pgjobq_ctx_errmsg(ctx);
            }
        } else {
            rc = pgjobq_ctx_step_put(ctx, q->name, q->result, &value);
            if (rc == PGJOBQ_OK || rc == PGJOBQ_EDUPLICATE) {
                /* The result stored: this one, or the one another holder stored first (it stands). */
                sb_puts(ans, ",\"stored\":true,\"result\":");
                sb_puts(ans, rc == PGJOBQ_OK ? q->result : value);
            } else {
                err = pgjobq_ctx_errmsg(ctx);
            }
        }
    } else {
        rc = q->kind == REQ_SLEEP ? pgjobq_ctx_sleep(ctx, q->name, q->delay_ms)
                                  : pgjobq_ctx_wait_event(ctx, q->name, q->event, q->key, q->timeout_ms, &value);
        if (rc == PGJOBQ_PARKED || rc == PGJOBQ_ECANCELLED) {
            *cancelled = rc == PGJOBQ_ECANCELLED;
            pgjobq_free(value);
            return 1;
        }
        if (rc == PGJOBQ_OK && q->kind == REQ_SLEEP) {
            sb_puts(ans, ",\"over\":true");
        } else if (rc == PGJOBQ_OK) {
            sb_puts(ans, ",\"event\":");
            sb_puts(ans, value);
        } else if (rc == PGJOBQ_ETIMEOUT) {
            sb_puts(ans, ",\"timeout\":true");
        } else {
            err = pgjobq_ctx_errmsg(ctx);
        }
    }
    if (err) {
        sb_puts(ans, ",\"error\":");
        sb_json(ans, err);
    }
    pgjobq_free(value);
    return 0;
}

/* A request served: answers the coprocess, or ends the job when it was parked (the coprocess is told
 * {"parked": ID}, or {"cancel": ID} when it ended cancelled) or left meanwhile. */
static void served(coproc *c, pending *pe, int parked, int cancelled, sbuf *ans)
{
    coproc_pool *p = c->pool;
    char line[64];

    pthread_mutex_lock(&p->mu);
    pe->busy = 0;
    pthread_cond_broadcast(&p->step_cv); /* its next request may be served now */
    int orphan = pe->orphan;
    if (!orphan && parked) {
        pending *taken = take_reply(c, pe->id);
        (void)taken; /* pe itself: it was held and is no longer busy */
    }
    pthread_mutex_unlock(&p->mu);
    if (orphan) {
        finish(pe, PGJOBQ_OUTCOME_RETRY, NULL, "the coprocess ended while a request of the job was being served", -1);
        return;
    }
    if (parked) {
        int n = snprintf(line, sizeof line, cancelled ? "{\"cancel\":%lld}\n" : "{\"parked\":%lld}\n",
                         (long long)pe->id);
        (void)send_line(c, line, (size_t)n);
        finish(pe, PGJOBQ_OUTCOME_PARKED, NULL, NULL, -1);
        return;
    }
    sb_puts(ans, "}\n");
    if (ans->failed || send_line(c, ans->data, ans->len) != 0)
        plog(p, PGJOBQ_LOG_WARN, "coprocess %d: the answer to a request of job %lld could not be sent", c->index,
             (long long)pe->id);
}

static void *step_thread(void *arg)
{
    coproc_pool *p = arg;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        step_req *q = NULL, **pp = &p->steps;
        pending *pe = NULL;
        /* The first request whose job is not busy (a job's requests are served one at a time, in
         * order); one whose job is gone (answered, given up) is dropped. */
        while (*pp) {
            pending *x = find_held((*pp)->c, (*pp)->id);
            if (x == NULL) {
                step_req *gone = *pp;
                *pp = gone->next;
                req_free(gone);
                continue;
            }
            if (!x->busy) {
                q = *pp;
                *pp = q->next;
                pe = x;
                break;
            }
            pp = &(*pp)->next;
        }
        if (q == NULL) {
            if (p->steps_stop)
                break;
            p->step_idle++;
            pthread_cond_wait(&p->step_cv, &p->mu);
            p->step_idle--;
            continue;
        }
        pe->busy = 1;
        pthread_mutex_unlock(&p->mu);
        sbuf ans;
        int cancelled;
        sb_init(&ans);
        int parked = serve(q, pe->ctx, &ans, &cancelled);
        served(q->c, pe, parked, cancelled, &ans);
        sb_free(&ans);
        req_free(q);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Queues a request for the step threads, starting one more when none is idle. */
static void steps_enqueue(coproc_pool *p, step_req *q)
{
    pthread_mutex_lock(&p->mu);
    step_req **pp = &p->steps;
    while (*pp)
        pp = &(*pp)->next;
    *pp = q;
    if (p->step_idle == 0 && p->nstep_threads < STEP_THREADS_MAX && !p->steps_stop) {
        if (pthread_create(&p->step_threads[p->nstep_threads], NULL, step_thread, p) == 0)
            p->nstep_threads++;
        else if (p->nstep_threads == 0)
            plog(p, PGJOBQ_LOG_ERROR, "cannot start a thread for the coprocesses' step requests");
    }
    pthread_cond_signal(&p->step_cv);
    pthread_mutex_unlock(&p->mu);
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

/* ------------------------------------------------------------------------------------------------ */
/* Standard error, and a copy that cannot start                                                      */

/* The level a line of a coprocess's stderr says it is at: a leading word (debug, trace, info, notice,
 * warn, warning, error, err, critical, crit, fatal; any case; followed by ':' or in brackets: "ERROR:",
 * "WARNING:root:", "[warn]"), after a "job N: " prefix if there is one; or the "level" ("levelname",
 * "severity") of a line that is a JSON object, a word or pino's number.  Info when it says none.
 * *at: where the level word starts, *skip: how many bytes it takes with what follows it up to the
 * message, both 0 when it is left in the line. */
static int level_word(const char *w, size_t n, pgjobq_log_level *level)
{
    static const struct {
        const char *word;
        pgjobq_log_level level;
    } words[] = {{"debug", PGJOBQ_LOG_DEBUG}, {"trace", PGJOBQ_LOG_DEBUG}, {"info", PGJOBQ_LOG_INFO},
                 {"notice", PGJOBQ_LOG_INFO}, {"warn", PGJOBQ_LOG_WARN},   {"warning", PGJOBQ_LOG_WARN},
                 {"error", PGJOBQ_LOG_ERROR}, {"err", PGJOBQ_LOG_ERROR},   {"critical", PGJOBQ_LOG_ERROR},
                 {"crit", PGJOBQ_LOG_ERROR},  {"fatal", PGJOBQ_LOG_ERROR}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strlen(words[i].word) == n && strncasecmp(w, words[i].word, n) == 0) {
            *level = words[i].level;
            return 1;
        }
    return 0;
}

static pgjobq_log_level line_level(const char *line, size_t len, size_t *at, size_t *skip)
{
    pgjobq_log_level level = PGJOBQ_LOG_INFO;
    const char *v;
    size_t n, k = 0;

    *at = *skip = 0;
    if (line[0] == '{' && len <= 65536 && pgjobq_json_check_limit(line, len, len, NULL, 0) == PGJOBQ_OK) {
        if ((v = json_member(line, "level", &n)) == NULL && (v = json_member(line, "levelname", &n)) == NULL)
            v = json_member(line, "severity", &n);
        if (v && n >= 2 && v[0] == '"')
            (void)level_word(v + 1, n - 2, &level);
        else if (v && n > 0 && v[0] >= '0' && v[0] <= '9') { /* pino: 10 trace ... 60 fatal */
            int num = atoi(v);
            level = num <= 20   ? PGJOBQ_LOG_DEBUG
                    : num <= 30 ? PGJOBQ_LOG_INFO
                    : num <= 40 ? PGJOBQ_LOG_WARN
                                : PGJOBQ_LOG_ERROR;
        }
        return level;
    }
    if (strncmp(line, "job ", 4) == 0 && line[4] >= '0' && line[4] <= '9') {
        k = 4 + strspn(line + 4, "0123456789");
        if (line[k] != ':' || line[k + 1] != ' ')
            return level;
        k += 2;
    }
    size_t w = k + (line[k] == '[');
    size_t wn = strspn(line + w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ");
    char after = line[w + wn];
    if (wn == 0 || !(line[k] == '[' ? after == ']' : after == ':') || !level_word(line + w, wn, &level))
        return PGJOBQ_LOG_INFO;
    *at = k;
    *skip = w + wn + 1 - k;
    *skip += strspn(line + k + *skip, " \t");
    return level;
}

/* Keeps a stderr line among the last ones (cut to 500 bytes), for the reason of a copy that cannot
 * start. */
static void tail_add(coproc *c, const char *line, size_t len)
{
    if (len > 500)
        len = 500;
    if (c->tail_len + len + 1 > TAIL_MAX) {
        size_t drop = c->tail_len + len + 1 - TAIL_MAX;
        const char *nl = drop < c->tail_len ? memchr(c->tail + drop, '\n', c->tail_len - drop) : NULL;
        drop = nl ? (size_t)(nl - c->tail) + 1 : c->tail_len;
        memmove(c->tail, c->tail + drop, c->tail_len - drop);
        c->tail_len -= drop;
    }
    memcpy(c->tail + c->tail_len, line, len);
    c->tail_len += len;
    c->tail[c->tail_len++] = '\n';
    c->tail[c->tail_len] = '\0';
}

/* Says how many stderr lines of the window were not logged, if any. */
static void stderr_dropped(coproc *c)
{
    if (c->err_dropped > 0)
        plog(c->pool, PGJOBQ_LOG_WARN,
             "coprocess %d: %lld more lines of its standard error in %d s were not logged (at most %d are)", c->index,
             c->err_dropped, STDERR_WINDOW_MS / 1000, STDERR_LINES_MAX);
    c->err_dropped = 0;
}

/* A line of the coprocess's stderr: kept among the last ones, and logged at the level it says (at
 * most STDERR_LINES_MAX a window: a coprocess that floods its stderr must not flood the log). */
static void stderr_line(coproc *c, const char *line, size_t len, int64_t now)
{
    size_t at, skip;

    tail_add(c, line, len);
    if (now - c->err_window_ms >= STDERR_WINDOW_MS) {
        stderr_dropped(c);
        c->err_window_ms = now;
        c->err_lines = 0;
    }
    if (c->err_lines >= STDERR_LINES_MAX) {
        c->err_dropped++;
        return;
    }
    c->err_lines++;
    pgjobq_log_level level = line_level(line, len, &at, &skip);
    plog(c->pool, level, "coprocess %d: %.*s%s", c->index, (int)at, line, line + at + skip);
}

/* How often this job was handed back by copies that could not start (this one included): under
 * p->mu. */
static int strike(coproc_pool *p, int64_t id)
{
    for (int i = 0; i < STRIKE_SLOTS; i++)
        if (p->strikes[i].id == id && p->strikes[i].n > 0)
            return ++p->strikes[i].n;
    int i = p->next_strike;
    p->next_strike = (i + 1) % STRIKE_SLOTS;
    p->strikes[i].id = id;
    p->strikes[i].n = 1;
    return 1;
}

/* A copy started (it said something valid, or, for a coprocess that never says it is ready, it has
 * lived START_GRACE_MS): if the pool could not start one before, the worker claims again. */
static void started(coproc *c, pid_t pid, const char *how)
{
    coproc_pool *p = c->pool;

    pthread_mutex_lock(&p->mu);
    int was = p->broken;
    p->broken = 0;
    free(p->broken_why);
    p->broken_why = NULL;
    pthread_mutex_unlock(&p->mu);
    if (!was)
        return;
    if (p->health)
        p->health(p->health_arg, NULL);
    plog(p, PGJOBQ_LOG_INFO, "coprocess %d (pid %d) %s: the worker claims again", c->index, (int)pid, how);
}

/* A copy that ended before it said anything valid could not start: a broken deployment (a module
 * that cannot be imported, a setting missing), not failed jobs.  The jobs it held go back without
 * using an attempt, its last stderr lines (the traceback) are the reason (theirs, the worker's row in
 * pgjobq.workers, the log's), and the worker claims nothing until a copy starts.  A coprocess that
 * never says it is ready could also have been killed by its first job: a job handed back so
 * STRIKES_MAX times counts a failed attempt, so that it cannot come back for ever. */
static void cannot_start(coproc *c, pid_t pid, const char *how, pending *held)
{
    coproc_pool *p = c->pool;
    char why[TAIL_MAX + 400], job_why[TAIL_MAX + 500];
    int n = 0, counted = 0;

    pthread_mutex_lock(&p->mu);
    int ready_seen = p->ready_seen;
    snprintf(why, sizeof why, "the coprocess could not start: it %s before %s%s%s", how,
             ready_seen ? "it was ready" : "answering anything",
             c->tail_len ? "; the last lines of its standard error:\n" : " (and wrote nothing on standard error)",
             c->tail);
    p->broken = 1;
    free(p->broken_why);
    p->broken_why = strdup(why);
    for (pending *pe = held; pe; pe = pe->next)
        pe->struck_out = !ready_seen && strike(p, pe->id) >= STRIKES_MAX;
    pthread_mutex_unlock(&p->mu);
    snprintf(job_why, sizeof job_why, "not run: %s", why);
    while (held) {
        pending *next = held->next;
        n++;
        if (held->struck_out) {
            char msg[sizeof job_why + 160];
            snprintf(msg, sizeof msg,
                     "%s\n(handed back %d times by a coprocess that could not start: this time "
                     "counted as a failed attempt)",
                     job_why, STRIKES_MAX);
            counted++;
            finish(held, PGJOBQ_OUTCOME_RETRY, NULL, msg, -1);
        } else {
            finish(held, PGJOBQ_OUTCOME_HAND_BACK, NULL, job_why, 0);
        }
        held = next;
    }
    if (p->health)
        p->health(p->health_arg, why);
    /* Its stderr lines are in the log already (unless there were too many): the last one says most. */
    const char *last = c->tail;
    for (const char *q = c->tail; c->tail_len && q < c->tail + c->tail_len - 1; q++)
        if (*q == '\n')
            last = q + 1;
    plog(p, PGJOBQ_LOG_ERROR,
         "coprocess %d (pid %d) %s before %s: it cannot start (%.*s); %d jobs it held handed back without using an "
         "attempt%s; the worker claims nothing until a copy starts%s",
         c->index, (int)pid, how, ready_seen ? "it was ready" : "answering anything",
         c->tail_len ? (int)strcspn(last, "\n") : 14, c->tail_len ? last : "no stderr line", n - counted,
         counted ? " (and some counted: handed back too often)" : "",
         atomic_load(&p->draining) ? "" : " (started again with backoff)");
}

/* What one life of a coprocess holds: its pipes, what it wrote that is not a whole line yet, and
 * the answers of one read (delivered together: one wakeup of the worker per read, not per job). */
typedef struct life {
    coproc *c;
    pid_t pid;
    int out_fd, err_fd;
    int64_t born, next_scan;
    int bad;    /* it broke the protocol: it is being killed, and what it writes now is ignored */
    int graced; /* judged started for having lived a while without saying it is ready */
    sbuf out, err;
    reply *batch;
    pending **taken;
    size_t nbatch, capbatch;
    /* The jobs one read ends, for pgjobq_ctx_finish_many: each was in flight, so at most `share`. */
    pgjobq_ctx **ended;
    pgjobq_outcome *outcomes;
} life;

/* Starts a copy and makes it the one jobs go to: 0, or -1 when it could not start (nothing to undo). */
static int life_start(coproc *c, life *L)
{
    coproc_pool *p = c->pool;
    int in_fd = -1;

    memset(L, 0, sizeof *L);
    L->c = c;
    L->out_fd = L->err_fd = -1;
    L->born = cli_mono_ms();
    L->ended = malloc((size_t)p->share * sizeof *L->ended);
    L->outcomes = malloc((size_t)p->share * sizeof *L->outcomes);
    if (L->ended == NULL || L->outcomes == NULL) {
        plog(p, PGJOBQ_LOG_ERROR, "coprocess %d: out of memory before starting it", c->index);
        free(L->ended);
        free(L->outcomes);
        return -1;
    }
    L->pid = start(c, &in_fd, &L->out_fd, &L->err_fd);
    if (L->pid < 0) {
        free(L->ended);
        free(L->outcomes);
        return -1;
    }
    pthread_mutex_lock(&p->mu);
    c->pid = L->pid;
    c->in_fd = in_fd;
    c->retiring = 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    plog(p, PGJOBQ_LOG_INFO, "coprocess %d started (pid %d)", c->index, (int)L->pid);
    c->broke = 0;
    c->answered = 0;
    c->tail_len = 0;
    c->tail[0] = '\0';
    c->err_window_ms = L->born;
    c->err_lines = 0;
    c->err_dropped = 0;
    sb_init(&L->out);
    sb_init(&L->err);
    return 0;
}

/* The copy broke the protocol: it is killed, and restarted after it is reaped. */
static void life_break(life *L)
{
    coproc_pool *p = L->c->pool;

    pthread_mutex_lock(&p->mu);
    L->c->retiring = 1;
    pthread_mutex_unlock(&p->mu);
    L->bad = 1;
    kill(-L->pid, SIGKILL);
}

/* One line the copy wrote on its standard output: an answer (kept for life_deliver), a progress
 * report, the ready line, or a line that breaks the protocol. */
static void life_line(life *L, const char *line, size_t len)
{
    coproc *c = L->c;
    coproc_pool *p = c->pool;
    char why[300];
    reply r;

    if (len == 0 || L->bad)
        return;
    if (parse_reply(line, len, &r, why, sizeof why) != 0) {
        char q[QUOTE_MAX + 8], msg[600];
        quote(q, sizeof q, line, len);
        plog(p, PGJOBQ_LOG_ERROR, "coprocess %d wrote a line that is not a valid reply (%s): '%s'; restarting it",
             c->index, why, q);
        snprintf(msg, sizeof msg, "the coprocess wrote a malformed reply (%s): '%s'", why, q);
        /* Retiring before the job it named ends, so that no job goes to it meanwhile. */
        pthread_mutex_lock(&p->mu);
        c->retiring = 1;
        pending *pe = r.have_id ? take_reply(c, r.id) : NULL;
        pthread_mutex_unlock(&p->mu);
        if (pe)
            finish(pe, PGJOBQ_OUTCOME_RETRY, NULL, msg, -1);
        free(r.result);
        free(r.error);
        life_break(L);
        return;
    }
    if (!c->answered) {
        c->answered = 1;
        if (r.ready) {
            pthread_mutex_lock(&p->mu);
            p->ready_seen = 1;
            pthread_mutex_unlock(&p->mu);
        }
        started(c, L->pid, r.ready ? "is ready" : "answered");
    }
    if (r.ready)
        return;
    if (r.progress) {
        /* Now, before the answers of this read are delivered (one may end the job). */
        set_progress(c, r.id, r.progress);
        free(r.progress);
        return;
    }
    if (r.req) {
        r.req->c = c;
        steps_enqueue(p, r.req);
        return;
    }
    if (L->nbatch == L->capbatch) {
        size_t cap = L->capbatch ? L->capbatch * 2 : 64;
        reply *nb = realloc(L->batch, cap * sizeof *nb);
        if (nb != NULL)
            L->batch = nb;
        pending **nt = nb ? realloc(L->taken, cap * sizeof *nt) : NULL;
        if (nt == NULL) {
            free(r.result);
            free(r.error);
            return; /* its job times out, as if the reply were lost */
        }
        L->taken = nt;
        L->capbatch = cap;
    }
    L->batch[L->nbatch++] = r;
}

/* Ends the jobs the answers of one read name: taken under one lock, then all ended at once without
 * it (one wakeup of the worker for the read, not one per job). */
static void life_deliver(life *L)
{
    coproc *c = L->c;
    coproc_pool *p = c->pool;
    size_t nended = 0;

    if (L->nbatch == 0)
        return;
    pthread_mutex_lock(&p->mu);
    for (size_t k = 0; k < L->nbatch; k++)
        L->taken[k] = take_reply(c, L->batch[k].id);
    pthread_mutex_unlock(&p->mu);
    for (size_t k = 0; k < L->nbatch; k++) {
        reply *r = &L->batch[k];
        if (L->taken[k]) {
            L->ended[nended] = L->taken[k]->ctx;
            L->outcomes[nended++] = answer(L->taken[k]->ctx, r->outcome, r->result, r->error, r->delay_ms);
            free(L->taken[k]);
        } else {
            plog(p, PGJOBQ_LOG_DEBUG, "coprocess %d answered job %lld, which no longer waits (ignored)", c->index,
                 (long long)r->id);
        }
        free(r->result);
        free(r->error);
    }
    L->nbatch = 0;
    if (L->bad || c->retiring) {
        pgjobq_ctx_finish_many(L->ended, L->outcomes, nended);
        return;
    }
    /* The jobs waiting for the slots these free start here, with no handler thread woken; the lines
     * they queued for this coprocess go out in one write. */
    (void)pgjobq_ctx_finish_many_and_run(L->ended, L->outcomes, nended, nended);
    pthread_mutex_lock(&p->mu);
    if (c->outq.len > 0 && !c->flushing)
        flush_locked(c);
    pthread_mutex_unlock(&p->mu);
}

/* Reads what the copy wrote on its standard output (f 0) or error (f 1), and handles every whole
 * line of it; a line longer than the protocol allows breaks it. */
static void life_read(life *L, int f, int64_t now)
{
    coproc *c = L->c;
    int *fd = f ? &L->err_fd : &L->out_fd;
    sbuf *b = f ? &L->err : &L->out;
    char buf[65536];
    ssize_t n = read(*fd, buf, sizeof buf);

    if (n <= 0) {
        if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
            close(*fd);
            *fd = -1;
        }
        return;
    }
    sb_putn(b, buf, (size_t)n);
    size_t start = 0;
    for (size_t i = 0; i < b->len; i++) {
        if (b->data[i] != '\n')
            continue;
        b->data[i] = '\0';
        if (f)
            stderr_line(c, b->data + start, i - start, now);
        else
            life_line(L, b->data + start, i - start);
        start = i + 1;
    }
    life_deliver(L);
    if (start > 0) {
        memmove(b->data, b->data + start, b->len - start);
        b->len -= start;
        b->data[b->len] = '\0';
    }
    if (b->len > COPROC_LINE_MAX || b->failed) {
        if (!f && !L->bad) {
            plog(c->pool, PGJOBQ_LOG_ERROR, "coprocess %d wrote a line longer than %d bytes; restarting it", c->index,
                 COPROC_LINE_MAX);
            life_break(L);
        }
        b->len = 0;
        b->failed = 0;
    }
}

/* Carries the copy's pipes until it closes both: its input written as the pipe takes it (and closed
 * at a stop once all is written), its output read, jobs past a stop given up. */
static void life_pump(life *L)
{
    coproc *c = L->c;
    coproc_pool *p = c->pool;
    char buf[64];

    while (L->out_fd >= 0 || L->err_fd >= 0) {
        pthread_mutex_lock(&p->mu);
        if (p->stopping && c->in_fd >= 0 && c->outq.len == 0 && !c->flushing) {
            close(c->in_fd);
            c->in_fd = -1;
        }
        int want_out = c->in_fd >= 0 && c->outq.len > 0 && !c->flushing ? c->in_fd : -1;
        pthread_mutex_unlock(&p->mu);
        struct pollfd fds[4] = {
            {L->out_fd, POLLIN, 0}, {L->err_fd, POLLIN, 0}, {want_out, POLLOUT, 0}, {c->kick[0], POLLIN, 0}};
        if (poll(fds, 4, STOP_SCAN_MS) < 0 && errno != EINTR)
            break;
        int64_t now = cli_mono_ms();
        if (now >= L->next_scan) {
            give_up_stopped(c);
            L->next_scan = now + STOP_SCAN_MS;
        }
        /* A coprocess that never says it is ready has started once it has lived a while. */
        if (!c->answered && !L->graced && now - L->born >= START_GRACE_MS) {
            L->graced = 1;
            pthread_mutex_lock(&p->mu);
            int judge_by_ready = p->ready_seen;
            pthread_mutex_unlock(&p->mu);
            if (!judge_by_ready)
                started(c, L->pid, "has run for a while without saying it is ready");
        }
        if (fds[3].revents) {
            while (read(c->kick[0], buf, sizeof buf) == (ssize_t)sizeof buf) {
            }
        }
        if (fds[2].revents || fds[3].revents) {
            pthread_mutex_lock(&p->mu);
            c->kicked = 0;
            if (!c->flushing)
                flush_locked(c);
            pthread_mutex_unlock(&p->mu);
        }
        for (int f = 0; f < 2; f++)
            if ((f ? L->err_fd : L->out_fd) >= 0 && fds[f].revents)
                life_read(L, f, now);
    }
}

/* Closes what is left of the copy, reaps it, and ends the jobs it held: handed back when it never
 * started, else retried.  Frees the life. */
static void life_reap(life *L)
{
    coproc *c = L->c;
    coproc_pool *p = c->pool;
    int status = 0, in_fd;
    char why[300], how[64];

    if (L->out_fd >= 0)
        close(L->out_fd);
    if (L->err_fd >= 0)
        close(L->err_fd);
    sb_free(&L->out);
    sb_free(&L->err);
    free(L->batch);
    free(L->taken);
    free(L->ended);
    free(L->outcomes);
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
    kill(-L->pid, SIGKILL); /* whatever it left in its group */
    while (waitpid(L->pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status))
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(status));
    else
        snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(status));
    snprintf(why, sizeof why, "the coprocess (pid %d) %s before answering", (int)L->pid, how);
    stderr_dropped(c);
    pthread_mutex_lock(&p->mu);
    c->pid = 0;
    pending *held = take_held(c);
    int stopping = p->stopping;
    pthread_mutex_unlock(&p->mu);
    if (!c->answered && !L->bad && !stopping) {
        c->broke = 1;
        cannot_start(c, L->pid, how, held);
    } else {
        finish_all(held, L->bad ? "the coprocess was restarted after a malformed reply before answering" : why);
        if (!stopping)
            plog(p, PGJOBQ_LOG_WARN, "%s; %s", why + 4,
                 atomic_load(&p->draining) ? "not started again: the worker is stopping" : "restarting it");
    }
}

/* Runs one life of the coprocess: until it exits, breaks the protocol, or the pool stops.  Returns
 * how long it lived (ms); c->broke says whether it ended before it started. */
static int64_t one_life(coproc *c)
{
    life L;

    if (life_start(c, &L) != 0)
        return 0;
    life_pump(&L);
    life_reap(&L);
    return cli_mono_ms() - L.born;
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
        /* Draining (a signal came, perhaps during the backoff below, which only a stop cuts short):
         * no copy is started again. */
        if (stopping || atomic_load(&p->draining))
            break;
        int64_t lived = one_life(c);
        if (atomic_load(&p->draining))
            break; /* the worker is stopping: a copy started now would only take jobs to lose */
        int64_t most = c->broke ? BROKEN_BACKOFF_MAX_MS : BACKOFF_MAX_MS;
        backoff = lived > 10000 && !c->broke ? BACKOFF_MIN_MS : backoff * 2 > most ? most : backoff * 2;
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
                          void (*log)(void *arg, pgjobq_log_level level, const char *msg), void *log_arg,
                          void (*health)(void *arg, const char *problem), void *health_arg)
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
    p->health = health;
    p->health_arg = health_arg;
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
    if (pthread_cond_init(&p->step_cv, NULL) != 0) {
        pthread_cond_destroy(&p->cv);
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
    for (int i = 0; i < p->k; i++)
        if (p->cp[i].thread)
            pthread_join(p->cp[i].thread, NULL);
    /* The step threads end once they have served what they started (the requests left go nowhere). */
    pthread_mutex_lock(&p->mu);
    p->steps_stop = 1;
    pthread_cond_broadcast(&p->step_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nstep_threads; i++)
        pthread_join(p->step_threads[i], NULL);
    while (p->steps) {
        step_req *next = p->steps->next;
        req_free(p->steps);
        p->steps = next;
    }
    for (int i = 0; i < p->k; i++) {
        sb_free(&p->cp[i].outq);
        for (int e = 0; e < 2; e++)
            if (p->cp[i].kick[e] >= 0)
                close(p->cp[i].kick[e]);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->step_cv);
    free(p->broken_why);
    free(p->cp);
    free(p);
}

void coproc_drain(coproc_pool *p)
{
    if (p)
        atomic_store(&p->draining, 1);
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
    /* Protocol 3: the lease token, for a step whose effects commit with its result in a transaction
     * of the coprocess's own (pgjobq.step_put: docs/durable.md). */
    sb_puts(&line, ",\"lease_token\":");
    sb_int(&line, job->lease_token);
    sb_puts(&line, ",\"payload\":");
    sb_puts(&line, job->payload);
    if (job->parents) { /* a job that waited for others: their states and results */
        sb_puts(&line, ",\"parents\":");
        sb_puts(&line, job->parents);
    }
    if (pgjobq_job_traceparent(job)) { /* the job's trace context (docs/queues.md, "Trace context") */
        sb_puts(&line, ",\"traceparent\":");
        sb_json(&line, pgjobq_job_traceparent(job));
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
        if (c || p->stopping || p->broken || atomic_load(&p->draining) || pgjobq_ctx_should_stop(ctx))
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
        /* While no copy can start, or the worker is stopping: the job goes back untouched, at once
         * (another worker may run it). */
        int broken = p->broken;
        char *why = broken && p->broken_why ? strdup(p->broken_why) : NULL;
        int hand_back = broken || atomic_load(&p->draining);
        pthread_mutex_unlock(&p->mu);
        sb_free(&line);
        free(pe);
        if (hand_back) {
            char msg[TAIL_MAX + 500];
            snprintf(msg, sizeof msg, "not run: %s",
                     why      ? why
                     : broken ? "the coprocess could not start (see the worker's log)"
                              : "the worker is stopping");
            free(why);
            pgjobq_ctx_set_error(ctx, msg);
            pgjobq_ctx_set_retry_delay(ctx, 0);
            return PGJOBQ_OUTCOME_HAND_BACK;
        }
        /* Otherwise no copy was running before the job's timeout (one is being started again after
         * the last one died): the job never reached a coprocess, and goes back untouched too. */
        pgjobq_ctx_set_error(ctx, "not run: no coprocess was running to take the job (see the worker's log)");
        pgjobq_ctx_set_retry_delay(ctx, 0);
        return PGJOBQ_OUTCOME_HAND_BACK;
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
