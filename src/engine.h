/*
 * engine.h - what the worker's files share: the policy (policy.c), asynchronous connections
 * (aconn.c), the handler pool (pool.c), the worker's public functions (worker_api.c), its statements
 * (worker_sql.c) and the engine loop (worker.c).  Not installed, not API.
 *
 * The shape of a worker:
 *
 *   engine thread (pgjobq_worker_run)          handler threads (one pool per queue)
 *     claim connection:  claims, LISTEN  ──jobs──▶  list per queue ──▶ handler(ctx)
 *     write connection:  outcomes, heartbeats  ◀──outcomes── done list ◀───┘
 *     maintenance connection: rescue, prune
 *
 * The engine never blocks: every statement is sent with PQsendQuery* on a non-blocking connection
 * and its result read when the socket says so; connecting is PQconnectPoll with a deadline.  Each
 * connection carries one statement at a time, so outcomes that arrive while a write is in flight
 * form the next batch by themselves, and a claim overlaps the previous batch's completion.
 */
#ifndef PGJOBQ_ENGINE_H
#define PGJOBQ_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"

/* ------------------------------------------------------------------------------------------------ */
/* policy.c: decisions, as pure functions of the state and the clock (unit-tested without a database) */

/* A claim starts at the worker's cursor, except at least this often, when it starts at the queue's
 * published low-water marks instead (and moves them on): that claim finds the jobs a claim that rolled
 * back left behind every cursor. */
#define PGJOBQ__LOW_CLAIM_MS 1000

/* A job claimed ahead of a free handler waits, by the handlers' measured speed, at most about this
 * long before it starts; and the jobs claimed ahead hold at most about this much payload. */
#define PGJOBQ__PREFETCH_WAIT_NS INT64_C(20000000)
#define PGJOBQ__PREFETCH_BYTES (INT64_C(8) << 20)

/* What the engine knows about one queue when it decides whether to claim. */
typedef struct pgjobq__claim_view {
    int concurrency;      /* the queue's slots */
    int prefetch;         /* jobs that may be claimed beyond them, to wait for a free handler */
    int running;          /* jobs claimed and not yet returned by their handlers (waiting included) */
    int unwritten;        /* jobs returned whose outcome is not written yet */
    int batch_max;        /* most jobs per claim */
    int woken;            /* a notification, a reconnect, a freed slot of a limited queue: claim now */
    int limited;          /* the last claim was cut short by the queue's concurrency or rate limit */
    int empty_streak;     /* woken claims in a row that found nothing (another worker took the jobs) */
    int64_t hold_ms;      /* a woken claim waits until then (pgjobq__claim_hold_ms) */
    int last_full;        /* the last claim returned all it asked for: there is a backlog */
    int64_t next_poll_ms; /* claim by then even without a notification */
    int cursor_valid;     /* the worker has a cursor for the queue (cursor.c) */
    int64_t low_ms;       /* when the last claim from the low-water marks was sent */
    int64_t gate_ms;      /* the notification gate's promise: a claim is due then, woken or not (0: none;
                           * worker.c, "The notification gate") */
    int64_t yield_until_ms; /* until then, claim the queue's due jobs PGJOBQ__YIELD_MS late: the worker
                             * handed back a job of it that it could not run (a kind it does not know,
                             * a handler that could not start); 0: never */
} pgjobq__claim_view;

/* Whether to claim for a queue now: 0, or how many jobs to ask for.  *from_cursor (may be NULL) says
 * whether to start at the worker's cursor (else at the queue's low-water marks).  A notification or the poll claims whatever
 * slots are free; under a backlog the engine waits until half a batch of slots is free (or nothing
 * runs), so that claims do not fragment into one job each as handlers finish one by one.  A slot is
 * free as soon as its handler returns, so that the next claim overlaps the writing of the outcome;
 * but while more outcomes wait to be written than there are slots, nothing is claimed (a stalled
 * write connection must not let a worker hoard leases). */
int pgjobq__claim_decide(const pgjobq__claim_view *v, int64_t now_ms, int *from_cursor);

/* How long a worker whose last `streak` claims on a notification found nothing waits before the next
 * such claim: 1 ms, doubling, at most 256 ms.  Every listening worker is woken by every notification
 * and one claim takes what it announced: without this, W workers made W claims for each enqueue, and
 * all but one found nothing (with 8 workers at 15,000 jobs/s, 85% of the claims; with 40, the
 * database did little else).  The workers that win claim at once; the others soon claim only as
 * often as it pays, and a claim that finds jobs again ends the wait.  (The cost: when the workers that
 * have been winning are all busy, a job may wait up to the longest hold for one of the others.) */
int64_t pgjobq__claim_hold_ms(int streak);

/* The notification gate's entry rule (worker.c, "The notification gate").  pgjobq__gate_note records
 * a notification of a queue at now_us (a monotonic clock, microseconds): *last_us is the previous one
 * (0: none yet), *gap_us the moving average of the gaps between them (a quarter of each new gap; a gap
 * longer than twice the window counts as twice the window (a second while the window is not known,
 * window_us 0), so that the quiet of a shut gate, during which producers do not notify, does not
 * keep the gate from shutting again once they do).  pgjobq__gate_wanted says whether a claim may stamp
 * the gate: while a promise holds (state not PGJOBQ__GATE_NONE), so that a steady load keeps it shut;
 * else only when the queue's notifications come faster than one a window (gap_us below window_us).
 * Slower, skipping them would save producers next to nothing and add up to half a window to the
 * pickup of every job (bench/README.md, "The floor, and the gate under a sustained load"). */
void pgjobq__gate_note(int64_t *last_us, int64_t *gap_us, int64_t now_us, int64_t window_us);
int pgjobq__gate_wanted(int state, int64_t gap_us, int64_t window_us);

/* How many jobs beyond its concurrency a queue may claim ahead, so that the next batch is already here
 * when handlers free their slots: as many as `concurrency` handlers taking handler_ns each get through
 * in PGJOBQ__PREFETCH_WAIT_NS (so no job waits much longer than that for a handler), at most
 * batch_max, at most PGJOBQ__PREFETCH_BYTES of payload at payload_bytes (the average) a job, and none
 * until the handlers' speed is known (handled == 0).  Fast handlers thus claim in
 * large batches whatever their concurrency (fewer claims: less contention between claimers and less
 * work per job); slow handlers get none: a claim round trip is nothing beside them, and jobs held
 * ahead would wait while other workers could run them. */
int pgjobq__prefetch(int64_t handler_ns, int64_t handled, int concurrency, int batch_max, int64_t payload_bytes);

/* When a queue that is not ready to claim now should be looked at again (INT64_MAX: only when a
 * handler finishes or a notification arrives).  The gate's promise (gate_ms) counts only while a slot
 * is free: a full worker keeps it when a handler finishes, after handing it on (worker.c). */
int64_t pgjobq__claim_next_ms(const pgjobq__claim_view *v);

/* After a claim that found nothing: when to claim next, given the claim's answer of when the queue's
 * next queued job is due (seconds from the claim's start, sent_ms; NaN when nothing is queued) and
 * the next poll.  A job already due that the claim did not get is held by another claimer (or a
 * transaction): claiming again at once would only spin, so the poll and notifications cover it.
 * yield_ms claims that much after the job is due (never after the poll): 0, or PGJOBQ__YIELD_MS
 * while the worker has lately handed back a job of the queue it could not run (worker.c,
 * yield_until_ms), so that another worker (a newer release) claims it first. */
int64_t pgjobq__claim_after_due(double due_in_s, int64_t sent_ms, int64_t next_poll_ms, int64_t yield_ms);

/* How late a worker that handed back a job it could not run claims the queue's due jobs (above). */
#define PGJOBQ__YIELD_MS 50

/* Whether to write pending outcomes now: when no handler still runs (nothing more can join the
 * batch), when the oldest has waited linger_ms, or when stopping. */
int pgjobq__flush_decide(size_t pending, int64_t first_pending_ms, int outstanding, int stopping, int64_t now_ms,
                         int64_t linger_ms);

/* Whether a statement's error (its SQLSTATE; NULL when none came) is a refusal of the values it was
 * given, one row's perhaps, rather than of the statement: a data exception (class 22: a number
 * beyond numeric's range, \u0000 in jsonb, a time out of range), an integrity constraint (23: a
 * CHECK of the table) or a program limit (54: a value too large or too deep).  Only such a refusal is
 * worth writing a batch's rows again in parts. */
int pgjobq__refused_by_value(const char *sqlstate);

/* The parts a refused batch is written again in, to find the rows the database refuses (at most a
 * few per batch: a handler's result or retry delay) while the others are written.  The parts are
 * consecutive and come first in the pending list of their kind: the top of the stack is the next part
 * to write, a part refused is split in two halves (the first half written first), and a refused part
 * of one row is that row.  A batch of n rows with one refused row takes about 2 log2(n) writes. */
#define PGJOBQ__SPLIT_DEPTH 64
typedef struct pgjobq__split {
    size_t part[PGJOBQ__SPLIT_DEPTH]; /* rows in each part, the next part last */
    int depth;
} pgjobq__split;
/* How many of the `pending` rows the next write takes: the next part's, or all of them when no
 * part is left; the part is then off the stack (pgjobq__split_refused or _requeued put it back). */
size_t pgjobq__split_take(pgjobq__split *s, size_t pending);
/* A write of n rows (taken by pgjobq__split_take) was refused by value and its rows are back at the
 * front of the pending list: 1 when n is 1 (that row is the refused one: the caller deals with it and
 * does not put it back), else 0 after pushing its two halves. */
int pgjobq__split_refused(pgjobq__split *s, size_t n);
/* A write of n rows did not happen (a conflict to retry, a lost connection) and its rows are back at
 * the front of the pending list: while parts are being written, it becomes the next part again. */
void pgjobq__split_requeued(pgjobq__split *s, size_t n);

/* The next reconnect delay after `current` (0 for the first): doubling from min_ms, at most max_ms. */
int64_t pgjobq__backoff_next(int64_t current_ms, int64_t min_ms, int64_t max_ms);

/* A delay with jitter, uniformly in [d/2, d], from a caller-owned seed (never 0 after the call). */
int64_t pgjobq__jitter(int64_t d, unsigned *seed);

/* How long before its local lease deadline a job is given up as lost: a tenth of the lease, at most
 * 5 s, so that a stopping handler can end before another worker could claim the job. */
int64_t pgjobq__lease_margin(int64_t lease_ms);

/* The registry of live workers (pgjobq.workers): a worker beats every PGJOBQ__BEAT_MS, and a row
 * unseen for three beats is no longer alive (another worker may take its id over: worker_beat in
 * sql/functions/monitor.sql says 15 seconds, as the dashboard does). */
#define PGJOBQ__BEAT_MS     5000
#define PGJOBQ__ID_STALE_MS (3 * PGJOBQ__BEAT_MS)

/* What a worker does when a beat finds its id in use by another live worker. */
typedef enum pgjobq__id_verdict {
    PGJOBQ__ID_WAIT,    /* beat again soon: the row may be one a worker left without a word */
    PGJOBQ__ID_GIVE_UP, /* another worker runs under this id: do not start */
    PGJOBQ__ID_TAKEN    /* registered before: the id was taken over while this worker went unseen */
} pgjobq__id_verdict;
/* registered: whether a beat of this worker succeeded before; first_refused_ms: when the first refusal
 * came (now_ms for the first).  Before it registered, a worker waits for the row to go stale, which
 * takes at most ID_STALE_MS and a beat from that refusal, and then gives up. */
pgjobq__id_verdict pgjobq__id_in_use(int registered, int64_t first_refused_ms, int64_t now_ms);

/* ------------------------------------------------------------------------------------------------ */
/* cursor.c: where a claim starts (pure functions, unit-tested without a database)                   */

#define PGJOBQ__LEVELS 201 /* priorities -100 .. 100 */
#define PGJOBQ__TIERS 4
#define PGJOBQ__TIER_TICKS 16

/* A tick: a claim's moment on the database clock, read before its transaction id was assigned, and that
 * id.  Once no transaction older than the id runs, every row that is not yet visible has a claim key
 * later than the moment. */
typedef struct pgjobq__tick {
    int64_t at_us; /* microseconds since the Unix epoch */
    int64_t xid;
} pgjobq__tick;

/* A worker's recent ticks: the last few claims', and older ones thinned out (at least 100 ms, 1 s and
 * 10 s apart), so that a cap can still be found while some transaction runs for a while (the cap is
 * the latest tick older than every transaction running). */
typedef struct pgjobq__tick_tier {
    pgjobq__tick t[PGJOBQ__TIER_TICKS];
    int n, next;
} pgjobq__tick_tier;

typedef struct pgjobq__ticks {
    pgjobq__tick_tier tier[PGJOBQ__TIERS];
} pgjobq__ticks;

/* Calls fn(arg, tick) for every tick remembered (some may be repeated). */
void pgjobq__ticks_each(const pgjobq__ticks *t, void (*fn)(void *arg, const pgjobq__tick *tick), void *arg);

/* Per priority level, the key (claim key, id) after which the worker's next claim of the level starts. */
typedef struct pgjobq__cursor {
    int64_t key_us[PGJOBQ__LEVELS];
    int64_t id[PGJOBQ__LEVELS];
    unsigned char valid[PGJOBQ__LEVELS];
    int nvalid;
} pgjobq__cursor;

/* One claimed job, as the cursor needs it. */
typedef struct pgjobq__claimed {
    int16_t priority;
    int64_t key_us;
    int64_t id;
} pgjobq__claimed;

/* Remembers a tick, forgetting what the tiers no longer need. */
void pgjobq__ticks_add(pgjobq__ticks *t, int64_t at_us, int64_t xid);
/* Forgets every level's position. */
void pgjobq__cursor_reset(pgjobq__cursor *c);
/* Moves the cursor on after a claim: `jobs` are the n jobs it claimed, `exhausted` the levels it read to
 * the end of their due jobs, cap_us the claim's cap (PGJOBQ_TIME_NONE when none was known: the cursor
 * then stays where it was).  A level the claim read to the end moves to the cap; a level it filled its
 * batch from moves to the largest key it claimed there, or to the cap if that is earlier. */
void pgjobq__cursor_update(pgjobq__cursor *c, const pgjobq__claimed *jobs, int n, const int16_t *exhausted,
                           int nexhausted, int64_t cap_us);

/* ------------------------------------------------------------------------------------------------ */
/* aconn.c: one asynchronous connection                                                             */

/* A statement the engine sends, named when prepared. */
typedef struct pgjobq__stmtdef {
    const char *name; /* prepared statement name */
    const char *sql;
    int nparams;
    const Oid *types;
} pgjobq__stmtdef;

typedef enum pgjobq__ac_state {
    PGJOBQ__AC_DOWN = 0,   /* not connected; retry_at_ms says when to try */
    PGJOBQ__AC_CONNECTING, /* PQconnectPoll in progress */
    PGJOBQ__AC_SETUP,      /* session settings, schema check, prepares */
    PGJOBQ__AC_READY       /* idle or carrying one statement (busy) */
} pgjobq__ac_state;

/* What pgjobq__aconn_io() reports. */
enum {
    PGJOBQ__AC_EV_NONE = 0,
    PGJOBQ__AC_EV_READY,  /* setup finished: the connection takes statements */
    PGJOBQ__AC_EV_RESULT, /* the statement in flight finished: take its result */
    PGJOBQ__AC_EV_LOST,   /* the connection failed or broke (err says why); it retries by itself */
    PGJOBQ__AC_EV_SCHEMA  /* the schema is missing or of another version (err says which): fatal */
};

typedef struct pgjobq__aconn {
    /* Configuration (set once). */
    const char *name;               /* "claim", "write", "maintenance": for log lines */
    const char *conninfo;
    const char *setup_sql;          /* session setup: simple query, may hold several statements */
    const pgjobq__stmtdef *stmts;   /* statements, prepared at setup when `prepare` */
    int nstmts;
    int prepare;
    int64_t tcp_timeout_ms;
    int64_t connect_timeout_ms;
    PQnoticeProcessor notice;       /* the server's notices and warnings (NULL: libpq's, to stderr) */
    void *notice_arg;
    /* State. */
    PGconn *pg;
    pgjobq__ac_state state;
    int busy;                       /* a statement or setup step is in flight */
    int lost_pending;               /* a send broke the connection: report it at the next io */
    int flushing;                   /* libpq still holds output: wait for POLLOUT */
    int poll_write;                 /* connecting: PQconnectPoll wants to write */
    int step;                       /* setup: 0 the session query, then 1.. one prepare each */
    int64_t deadline_ms;            /* connecting and setup must end by then */
    int64_t retry_at_ms;
    int64_t retry_delay_ms;
    unsigned seed;
    PGresult *result;               /* the finished statement's first result, for the caller */
    char err[512];
} pgjobq__aconn;

/* Writes "host:port" (or the socket's path) of the server the connection reached into buf. */
const char *pgjobq__aconn_where(const pgjobq__aconn *ac, char *buf, size_t size);

/* Starts connecting if the connection is down and its retry time has come. */
void pgjobq__aconn_start(pgjobq__aconn *ac, int64_t now_ms);

/* Does the connection's work for the socket events in revents (0 when none): reads input, flushes
 * output, advances connecting and setup, checks deadlines.  Returns a PGJOBQ__AC_EV_* event. */
int pgjobq__aconn_io(pgjobq__aconn *ac, short revents, int64_t now_ms);

/* Sends statement `stmt` (an index into stmts) with binary or text parameters.  The connection must be
 * ready and idle.  Returns 0, or -1 after the connection broke (it retries by itself; err says why). */
int pgjobq__aconn_send(pgjobq__aconn *ac, int stmt, const char *const *values, const int *lengths,
                       const int *formats, int binary_result, int64_t now_ms);

/* Sends a simple query without parameters (LISTEN, a check).  Same rules as pgjobq__aconn_send. */
int pgjobq__aconn_send_simple(pgjobq__aconn *ac, const char *sql, int64_t now_ms);

/* After PGJOBQ__AC_EV_RESULT: the statement's result (the caller clears it). */
PGresult *pgjobq__aconn_take(pgjobq__aconn *ac);

/* Whether the connection takes a statement now. */
int pgjobq__aconn_idle(const pgjobq__aconn *ac);

/* The descriptor and events to poll for (fd -1 when there is nothing to watch). */
void pgjobq__aconn_pollfd(const pgjobq__aconn *ac, int *fd, short *events);

/* When the connection needs attention without I/O (a deadline or a retry); INT64_MAX for never. */
int64_t pgjobq__aconn_next_ms(const pgjobq__aconn *ac);

/* Drops the connection and schedules a retry with backoff and jitter. */
void pgjobq__aconn_fail(pgjobq__aconn *ac, const char *why, int64_t now_ms);

/* Closes the connection for good. */
void pgjobq__aconn_close(pgjobq__aconn *ac);

/* ------------------------------------------------------------------------------------------------ */
/* pool.c: handler threads                                                                          */

#define PGJOBQ__MAX_QUEUES 64
#define PGJOBQ__MAX_HANDLERS 64

typedef struct pgjobq__handler {
    char kind[PGJOBQ_NAME_MAX + 1]; /* "" for any kind */
    pgjobq_handler_fn fn;
    void *arg;
} pgjobq__handler;

/* steps.c: forgets the steps a job's context read (pgjobq.steps_of), when it ends or parks. */
void pgjobq__ctx_steps_forget(struct pgjobq_ctx *ctx);

struct pgjobq_ctx {
    pgjobq_job job;              /* its strings live in the same allocation, after the struct */
    struct pgjobq__queue *q;
    _Atomic int stop;            /* a pgjobq_stop_reason */
    int64_t started_ms;
    int64_t started_ns;          /* monotonic, for the handler's measured time */
    _Atomic int pending;         /* its handler returned PENDING: pgjobq_ctx_finish ends it */
    _Atomic int64_t timeout_at_ms; /* INT64_MAX until the handler starts: the timeout counts from there */
    _Atomic(char *) progress;    /* the latest progress set (pgjobq_ctx_set_progress), taken by the engine */
    /* Durable execution (steps.c), on the handler's side. */
    pgjobq_client *lent;         /* the connection the pool lent the job (pgjobq_ctx_client), or NULL */
    _Atomic int parked;          /* a sleep or a wait parked the job (or it ended cancelled there): the
                                    database ended this attempt, the engine writes nothing */
    int unnamed_sleeps, unnamed_waits; /* for the names of sleeps and waits given none */
    struct {                     /* its stored steps, read once per attempt (pgjobq.steps_of) */
        int loaded;
        size_t n, cap;
        char **names, **results;
    } steps;
    char errmsg[512];            /* pgjobq_ctx_errmsg */
    /* Engine only. */
    int64_t lease_valid_until_ms;
    size_t run_index;            /* position in the worker's running set */
    int ended;                   /* the database already ended the job (cancelled) or we lost it */
    int unwritten;               /* its outcome waits to be written (counted in q->claim.unwritten) */
    int refused;                 /* the database refused its outcome once: it was rewritten as a failure */
    /* Set by the handler. */
    pgjobq_outcome outcome;
    char *result;
    char *error;
    int64_t retry_delay_ms;      /* PGJOBQ_BACKOFF unless set */
    struct pgjobq_ctx *next;
};

typedef struct pgjobq__queue {
    struct pgjobq__pool *pool; /* whose mailbox its ended jobs go to */
    char name[PGJOBQ_NAME_MAX + 1];
    int concurrency;
    pgjobq__handler handlers[PGJOBQ__MAX_HANDLERS];
    int nhandlers;
    /* The dispatch list, shared with the queue's threads. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pgjobq_ctx *head, *tail;
    int active; /* jobs taken by a thread and not yet ended (pending ones included): at most concurrency */
    int sleeping;  /* threads waiting on cv */
    int signalled; /* a thread was signalled and has not run yet: another signal now would only make
                    * two threads fight for the same jobs */
    int exit_threads;
    pthread_t *threads;
    int nthreads;
    int64_t timeout_ms;
    /* Moving average of handler run time, ns: fast handlers share a batch among few threads, and
     * get jobs claimed ahead (pgjobq__prefetch). */
    _Atomic int64_t handler_ns;
    _Atomic int64_t handled;
    /* Moving average of the time a handler holds its thread, ns: the same as handler_ns, except for
     * handlers that return PENDING (they hold it only to hand the job on).  Decides the wakeups. */
    _Atomic int64_t busy_ns;
    int64_t payload_bytes; /* engine only: moving average of claimed payload sizes */
    /* Engine only: the claim policy's view, and where the next claim starts. */
    pgjobq__claim_view claim;
    pgjobq__cursor cursor;
    int drained; /* engine only: its last claim, sent while the worker held no job, found none (burst) */
    /* Engine only: the notification gate's promise (worker.c, "The notification gate"). */
    struct {
        int state;        /* PGJOBQ__GATE_* */
        int64_t end_us;   /* WINDOW: when the window ends; HORIZON: the tick the cap must reach (database
                           * clock, microseconds since 1970) */
        int64_t retry_ms; /* HORIZON: the wait before the next claim, doubling up to the poll */
        int handed;       /* the promise was handed on (pgjobq.notify_now) since it was made */
        int hand_now;     /* it must be handed on before the next claim */
        int64_t note_us;  /* the queue's last notification (monotonic clock, microseconds; 0: none) */
        int64_t gap_us;   /* the moving average of the gaps between its notifications (0: not known) */
        int64_t window_us; /* the window, as the last claim reported it */
    } gate;
} pgjobq__queue;

/* The notification gate's promise, per queue: none; the window runs (claim again once it has ended);
 * the horizon (claim until a claim's cap reaches the first claim after the window). */
enum { PGJOBQ__GATE_NONE, PGJOBQ__GATE_WINDOW, PGJOBQ__GATE_HORIZON };

/* The pool's side of a worker: where its threads hand ended jobs back.  The mailbox is a list, taken
 * whole by the engine (pgjobq__pool_collect); a job that arrives in an empty mailbox calls the wakeup
 * registered at pgjobq__pool_init, so one wakeup covers a batch.  The pool knows nothing of the engine
 * beyond these. */
typedef struct pgjobq__pool {
    const char *worker_id;   /* for messages */
    const char *conninfo;    /* the worker's database, for the connections lent to jobs (steps.c) */
    int64_t tcp_timeout_ms;  /* theirs */
    pthread_mutex_t lend_mu; /* the connections lent and given back: */
    pgjobq_client **idle;    /* those given back, for the next job that asks */
    size_t nidle, capidle;
    void (*wake)(void *arg); /* called, from a handler thread, when a job arrives in an empty mailbox */
    void *wake_arg;
    pthread_mutex_t mu;
    pgjobq_ctx *done;        /* the mailbox: jobs ended, newest first */
    _Atomic int progress_set; /* a job's progress was set since the engine last took them */
} pgjobq__pool;

/* Sets the pool up (its mailbox, empty) with the wakeup and the worker id it gives messages: 0, or
 * pthread_mutex_init's error number (then there is nothing to destroy). */
int pgjobq__pool_init(pgjobq__pool *pool, const char *worker_id, void (*wake)(void *arg), void *wake_arg);
/* Releases what pgjobq__pool_init set up (and closes the connections given back); after
 * pgjobq__pool_stop and the last collect. */
void pgjobq__pool_destroy(pgjobq__pool *pool);
/* Starts each queue's threads, handing ended jobs to pool; PGJOBQ_OK or PGJOBQ_ENOMEM (err says why). */
int pgjobq__pool_start(pgjobq__pool *pool, pgjobq__queue *queues, int nqueues, char *err, size_t err_size);
/* Stops and joins every thread; jobs still on a list are left there for the caller. */
void pgjobq__pool_stop(pgjobq__queue *queues, int nqueues);
/* Takes the jobs in the mailbox, as a chain (newest first); NULL when none. */
pgjobq_ctx *pgjobq__pool_collect(pgjobq__pool *pool);
/* Appends a chain of jobs to a queue's list and wakes one thread. */
void pgjobq__pool_dispatch(pgjobq__queue *q, pgjobq_ctx *first, pgjobq_ctx *last);
/* Takes the jobs waiting on a queue's list (not started), as a chain; NULL when none. */
pgjobq_ctx *pgjobq__pool_take_waiting(pgjobq__queue *q);
/* Whether any queue has jobs waiting on its list; if so, wakes one more thread for each such queue
 * (so that a slow job cannot hold back the fast ones behind it). */
int pgjobq__pool_help(pgjobq__queue *queues, int nqueues);
/* Frees a context and everything it owns (a connection lent to it goes back to the pool).  Accepts
 * NULL. */
void pgjobq__ctx_free(pgjobq_ctx *ctx);
/* A connection for a job (the pool's conninfo): one given back, else a new one.  PGJOBQ_OK, or the
 * error of connecting, its message in errbuf. */
int pgjobq__pool_lend(pgjobq__pool *pool, pgjobq_client **out, char *errbuf, size_t errsize);
/* Gives a lent connection back (closed instead when it is not idle and sound).  Accepts NULL. */
void pgjobq__pool_give_back(pgjobq__pool *pool, pgjobq_client *c);
/* Asks a handler to stop, keeping the first reason given. */
void pgjobq__ctx_stop(pgjobq_ctx *ctx, pgjobq_stop_reason why);

/* A monotonic clock in milliseconds. */
int64_t pgjobq__mono_ms(void);

/* ------------------------------------------------------------------------------------------------ */
/* The worker: worker_api.c (its public functions and their checks), worker_sql.c (its statements)  */
/* and worker.c (the engine loop)                                                                    */

/* The worker's connections. */
enum { PGJOBQ__C_CLAIM, PGJOBQ__C_WRITE, PGJOBQ__C_MAINT, PGJOBQ__NCONN };

/* worker_sql.c: every statement the engine prepares and sends, in one table (pgjobq__worker_stmts),
 * grouped by the connection that carries it: the claim connection's, the write connection's, then the
 * maintenance connection's (pgjobq__worker_conn_stmts: each connection prepares its own). */
enum {
    PGJOBQ__S_CLAIM,
    PGJOBQ__S_HAND_ON, /* the notification gate's promise, handed on: a notification, ungated */
    /* The kinds of write the engine batches, in the order it writes them (PGJOBQ__W_*), then the
     * heartbeat, the registry's beat and the handlers' progress. */
    PGJOBQ__S_COMPLETE,
    PGJOBQ__S_FAIL,
    PGJOBQ__S_RELEASE,
    PGJOBQ__S_CANCEL,
    PGJOBQ__S_SNOOZE,
    PGJOBQ__S_EXTEND,
    PGJOBQ__S_BEAT,
    PGJOBQ__S_PROGRESS,
    PGJOBQ__S_RESCUE,
    PGJOBQ__S_PRUNE,
    PGJOBQ__S_TICK,
    PGJOBQ__S_HEALTH,
    PGJOBQ__NSTMTS
};
enum { PGJOBQ__W_COMPLETE, PGJOBQ__W_FAIL, PGJOBQ__W_RELEASE, PGJOBQ__W_CANCEL, PGJOBQ__W_SNOOZE, PGJOBQ__W_KINDS };
#define PGJOBQ__WRITE_STMT(kind) (PGJOBQ__S_COMPLETE + (kind))
/* The claim's columns after the claimed job's (PGJOBQ__K_ID ...). */
enum { PGJOBQ__K_KEY = PGJOBQ__K_NCOLS, PGJOBQ__K_META, PGJOBQ__K_CAP, PGJOBQ__K_TICK_XID, PGJOBQ__K_NEXT_DUE,
       PGJOBQ__K_LIMITED, PGJOBQ__K_CLAIM_NCOLS };
typedef struct pgjobq__stmt_range {
    int first, n;
} pgjobq__stmt_range;
extern const pgjobq__stmtdef pgjobq__worker_stmts[PGJOBQ__NSTMTS];
extern const pgjobq__stmt_range pgjobq__worker_conn_stmts[PGJOBQ__NCONN];
extern const char *const pgjobq__worker_write_what[PGJOBQ__W_KINDS]; /* "complete" ...: for the log */
extern const char pgjobq__worker_listen_sql[];       /* the claim connection's LISTEN */
extern const char pgjobq__worker_listen_check_sql[]; /* whether it still listens */
extern const char pgjobq__worker_setup_plain[];      /* session setup and the schema check (last) */
extern const char pgjobq__worker_setup_listen[];     /* the same, listening */

/* Jobs, in a growing array. */
typedef struct pgjobq__batch {
    pgjobq_ctx **items;
    size_t n, cap;
} pgjobq__batch;

/* The statement a connection carries, and what the engine must remember about it (kind: worker.c's
 * R_*). */
typedef struct pgjobq__request {
    int kind;
    int queue;      /* claim, next due */
    int want;       /* claim */
    int from_cursor; /* claim */
    int woken;       /* claim: made because the queue was woken */
    int idle;        /* claim: sent while the worker held no job (for burst) */
    int wkind;      /* write: PGJOBQ__W_* */
    pgjobq__batch items;    /* write: the jobs it writes, owned until its result */
    int64_t sent_ms;
} pgjobq__request;

/* A worker: what worker_api.c configures and worker.c runs. */
struct pgjobq_worker {
    char *conninfo;
    char worker_id[256];
    pgjobq_worker_opts o;
    pgjobq__queue queues[PGJOBQ__MAX_QUEUES];
    int nqueues;
    char errmsg[512];
    int ran;

    /* Stop requests (signal-safe). */
    _Atomic int stop_requests;
    int wake_pipe[2];

    /* pgjobq_worker_set_unhealthy: why the worker claims nothing (NULL: it claims), under problem_lock
     * (a spin lock: held only to swap or copy it); unhealthy says whether one is set, problem_changed
     * that the engine has not beaten since it changed.  Engine only: claims_held, what it last saw. */
    _Atomic int problem_lock;
    char *problem;
    _Atomic int unhealthy;
    _Atomic int problem_changed;
    int claims_held;

    /* The handler threads, and the mailbox they hand outcomes back through. */
    pgjobq__pool pool;

    /* Engine state. */
    pgjobq__aconn conn[PGJOBQ__NCONN];
    pgjobq__request req[PGJOBQ__NCONN];
    int was_ready[PGJOBQ__NCONN];
    int ever_ready[PGJOBQ__NCONN];
    int failed_connects[PGJOBQ__NCONN];    /* connection attempts failed since it was last ready */
    int64_t down_since_ms[PGJOBQ__NCONN];  /* when it was lost (or first failed); 0 while up */
    int64_t next_down_warn_ms[PGJOBQ__NCONN];
    pgjobq__batch pending[PGJOBQ__W_KINDS];
    pgjobq__split split[PGJOBQ__W_KINDS]; /* the parts of a refused batch still to write, of each kind */
    int64_t first_pending_ms; /* when the oldest unwritten outcome arrived; 0 when none */
    pgjobq_ctx **running;     /* every claimed job not yet written or given up */
    size_t nrunning, caprunning;
    int64_t deadlines_at_ms;  /* no running job passes its timeout or its lease's margin before this (a
                                 lower bound, lowered as jobs are claimed): phase_deadlines looks at
                                 the jobs only from then, and the loop sleeps no longer */
    int stopping, handed_back, fatal, exit_rc;
    int64_t shutdown_at_ms;
    int64_t next_heartbeat_ms, next_rescue_ms, next_prune_ms, next_tick_ms, listen_check_ms, last_summary_ms;
    int64_t next_health_ms;
    int health_failed;        /* the last health check failed (said at warn once, then at debug) */
    int64_t next_beat_ms;
    int64_t next_progress_ms; /* the earliest the handlers' progress is written again */
    struct pgjobq__progress_sent {
        int64_t id;
        char *value;
    } *progress_sent;         /* the values of the progress write under way, kept until its answer */
    size_t nprogress_sent, progress_cap;
    size_t progress_alone;    /* progress writes left that take one job's value each (after a refusal) */
    int64_t rescue_since_us;      /* the next rescue's since (PGJOBQ_TIME_NONE: every expired lease) */
    int64_t next_full_rescue_ms;
    char host[128], pid_s[16], queues_s[1024]; /* what the beat says */
    char secret_s[24];                         /* random, drawn at start: its row of pgjobq.workers is its own */
    int registered;                            /* a beat had the id (or failed for another reason): claims may start */
    int64_t id_refused_ms;                     /* when a beat first found the id in use by a live worker; 0: never */
    int need_listen;
    int claim_rr; /* round-robin start among queues */
    pgjobq__ticks ticks; /* the latest claims' ticks (cursor.c) */
    char lease_s[48], completed_s[48], failed_s[48]; /* the retention: "" for the database's */

    /* Statistics. */
    _Atomic int64_t st_claimed, st_completed, st_retried, st_failed, st_cancelled, st_lost, st_released,
        st_running, st_claims, st_rescued, st_writes, st_parked;
    _Atomic int st_connected; /* connections ready now */

    /* Failed attempts in the log: at most FAIL_LOG_MAX lines a FAIL_LOG_WINDOW_MS (engine thread). */
    int64_t faillog_window_ms;
    int faillog_lines;
    int64_t faillog_dropped;
};

/* worker_api.c */
/* The longest reason pgjobq_worker_set_unhealthy keeps (pgjobq.workers keeps 4096 characters). */
#define PROBLEM_MAX 4000
/* Copies why the worker is unhealthy into buf ("" when it is not). */
void pgjobq__worker_problem(pgjobq_worker *w, char *buf, size_t size);
/* Sets the worker's message and returns code. */
int pgjobq__worker_err(pgjobq_worker *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Wakes the engine from its poll (signal-safe: a byte into its pipe). */
void pgjobq__worker_wake(pgjobq_worker *w);

#endif /* PGJOBQ_ENGINE_H */
