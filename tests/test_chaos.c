/*
 * test_chaos.c - faults while jobs flow, then a checker in the style of Jepsen.
 *
 * Worker daemons (`pgjobq work --exec`, with a handler that records every execution in a ledger
 * file) and a producer run while a nemesis kills workers (-9), freezes them past their lease
 * (SIGSTOP, then SIGCONT), restarts PostgreSQL (fast, and immediate = crash recovery), terminates
 * pgjobq's backends, holds a transaction open, and (as root, with ip and iptables) cuts a fourth worker
 * in its own network namespace off from the database, half-open (DROP) and refused (REJECT).  Then everything is healed and drained, and the
 * checker reads the ledger, the jobs table and an audit trail of every row change (a trigger):
 *
 * One job in fifty is poisoned: its handler prints a result PostgreSQL refuses (a number beyond
 * numeric's range), which must cost the jobs written in the same batch nothing.  The queue has a
 * concurrency limit (12, below the workers' 16 slots), so every claim counts and folds the lease
 * alarms under the faults.
 *
 *   must be zero:  lost (acknowledged, never completed), unexpected (executed, never enqueued),
 *                  claims while another lease on the job was valid, stale writes accepted (a write
 *                  by a holder whose lease had expired), stuck running, attempts over max_attempts,
 *                  innocent jobs failed, poisoned jobs that did not end failed
 *   reported:      executions of a job more than once (after a lease was lost), enqueue errors and
 *                  indeterminate commits that landed, rescue delay after expiry, recovery after a
 *                  database restart, listener recovery, pickup latency
 *
 * The short form runs in `make check` (PGJOBQ_CHAOS_SECONDS, default 30); `make chaos` runs it long.
 * Two more modes follow: effects in the completing transaction, and ten-step workflows (durable
 * steps, docs/durable.md) whose size is PGJOBQ_CHAOS_WORKFLOWS (1,000 in make chaos, 100 in make check).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

enum { WORKERS = 3, MAX_ACKED = 200000, POISON_EVERY = 50 };

static pid_t workers[WORKERS];
static char handler_path[512], ledger_path[512];

static struct {
    int64_t ids[MAX_ACKED];
    _Atomic int n;
    _Atomic int errors;
    _Atomic int stop;
    _Atomic int attempts;
} produced;

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* What a failed drain leaves behind: the jobs, the sessions and the logs of the workers holding them. */
static void dump_undrained(PGconn *pg)
{
    PGresult *r = PQexec(pg, "SELECT id, state, attempt, coalesce(worker_id, '-'),"
                             " coalesce(round(extract(epoch FROM lease_until - now())::numeric, 2)::text, '-'),"
                             " round(extract(epoch FROM run_at - now())::numeric, 2), coalesce(last_error, '-')"
                             " FROM pgjobq.all_jobs WHERE queue = 'chaos' AND state IN ('queued', 'running')"
                             " ORDER BY id LIMIT 20");
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        for (int i = 0; i < PQntuples(r); i++)
            fprintf(stderr, "    undrained: id %s %s attempt %s worker %s lease_in %s due_in %s error %.80s\n",
                    PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3),
                    PQgetvalue(r, i, 4), PQgetvalue(r, i, 5), PQgetvalue(r, i, 6));
    PQclear(r);
    r = PQexec(pg, "SELECT application_name, state, coalesce(wait_event, '-'), left(query, 100)"
                   " FROM pg_stat_activity WHERE application_name LIKE 'pgjobq%' ORDER BY 1");
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        for (int i = 0; i < PQntuples(r); i++)
            fprintf(stderr, "    session: %s %s %s %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
                    PQgetvalue(r, i, 2), PQgetvalue(r, i, 3));
    PQclear(r);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "for f in %s/w*.log %s/netns-worker.log; do [ -f \"$f\" ] &&"
                              " { echo \"    == $f\"; tail -n 15 \"$f\" | sed 's/^/    /'; }; done >&2",
             t_tmpdir(), t_tmpdir());
    if (system(cmd) == -1)
        fprintf(stderr, "(could not show the worker logs)\n");
}

/* Lines of the workers' logs that match an extended regular expression. */
static long long worker_log_lines(const char *regex)
{
    char cmd[1200];
    long long n = -1;
    snprintf(cmd, sizeof cmd, "cat %s/w*.log %s/netns-worker.log 2>/dev/null | grep -cE '%s'", t_tmpdir(), t_tmpdir(),
             regex);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    if (fscanf(f, "%lld", &n) != 1)
        n = -1;
    pclose(f);
    return n;
}

static pid_t start_worker(int i)
{
    char env[32], id[32], log[600];
    snprintf(env, sizeof env, "WHO=w%d", i);
    snprintf(id, sizeof id, "w%d", i);
    snprintf(log, sizeof log, "%s/w%d.log", t_tmpdir(), i);
    return t_spawn(log, env, "work", "--queue", "chaos:4", "--exec", handler_path, "--lease", "2s", "--timeout",
                   "1500ms", "--poll", "200ms", "--shutdown-timeout", "3s", "--worker-id", id, "--log-level",
                   "warn", NULL);
}

/* A connection that survives the nemesis: retried until the server is back. */
static PGconn *connect_retry(int timeout_ms)
{
    int64_t deadline = t_now_ms() + timeout_ms;
    for (;;) {
        PGconn *c = PQconnectdb(t_conninfo());
        if (PQstatus(c) == CONNECTION_OK)
            return c;
        PQfinish(c);
        if (t_now_ms() > deadline)
            t_fail(__FILE__, __LINE__, "the database did not come back within %d ms", timeout_ms);
        pause_ms(100);
    }
}

static long long int_retry(PGconn **c, const char *sql)
{
    for (int tries = 0;; tries++) {
        PGresult *r = PQexec(*c, sql);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) {
            long long v = atoll(PQgetvalue(r, 0, 0));
            PQclear(r);
            return v;
        }
        PQclear(r);
        if (tries > 100)
            t_fail(__FILE__, __LINE__, "query keeps failing: %s: %s", sql, PQerrorMessage(*c));
        PQfinish(*c);
        *c = connect_retry(60000);
    }
}

/* The producer offers jobs faster than `--exec` workers run them on a slow machine (a process or
 * four per job): it holds back while the backlog is over BACKLOG_MAX, so that what is left to drain
 * at the end is bounded by the faults, not by the length of the run.  Never fails: a fault may make
 * the check itself fail, and then the producer just goes on. */
enum { BACKLOG_MAX = 200 };
typedef struct backlog_watch {
    PGconn *conn;
    int calls;
    long long queued;
} backlog_watch;

static int backlog_full(backlog_watch *b)
{
    if (b->calls++ % 20 == 0) {
        if (b->conn == NULL || PQstatus(b->conn) != CONNECTION_OK) {
            PQfinish(b->conn);
            b->conn = PQconnectdb(t_conninfo());
        }
        PGresult *r = PQexec(b->conn, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'chaos' AND state = 'queued'");
        b->queued = PQresultStatus(r) == PGRES_TUPLES_OK ? atoll(PQgetvalue(r, 0, 0)) : 0;
        PQclear(r);
    }
    if (b->queued <= BACKLOG_MAX)
        return 0;
    pause_ms(50);
    b->calls = 0; /* look again next time */
    return 1;
}

static void *producer(void *arg)
{
    pgjobq_client *c = NULL;
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    backlog_watch watch = {NULL, 0, 0};
    (void)arg;

    o.queue = "chaos";
    while (!atomic_load(&produced.stop)) {
        if (backlog_full(&watch))
            continue;
        if (c == NULL && pgjobq_client_open(&c, t_conninfo()) != PGJOBQ_OK) {
            pgjobq_client_close(c);
            c = NULL;
            pause_ms(100);
            continue;
        }
        int64_t id = 0;
        /* One job in fifty is poisoned: its handler gives a result PostgreSQL refuses, on each of its
         * two attempts.  The others may be tried 1000 times, so that repeated faults never fail one
         * by policy. */
        int poison = atomic_fetch_add(&produced.attempts, 1) % POISON_EVERY == POISON_EVERY - 1;
        o.max_attempts = poison ? 2 : 1000;
        int rc = pgjobq_enqueue(c, poison ? "{\"chaos\": true, \"poison\": true}" : "{\"chaos\": true}", &o, &id);
        if (rc == PGJOBQ_OK) {
            int k = atomic_fetch_add(&produced.n, 1);
            if (k < MAX_ACKED)
                produced.ids[k] = id;
        } else {
            /* Indeterminate: the commit may or may not have landed.  Counted, never acknowledged. */
            atomic_fetch_add(&produced.errors, 1);
            pause_ms(20);
        }
        pause_ms(8);
    }
    pgjobq_client_close(c);
    PQfinish(watch.conn);
    return NULL;
}

static int64_t ms_since(int64_t t)
{
    return t_now_ms() - t;
}

/* ------------------------------------------------------------------------------------------------ */
/* A worker on its own network: a namespace joined to the host by a veth pair whose link-local       */
/* addresses (169.254.77.0/30) exist only on that pair, cut off with iptables.                       */

static char netns[32], veth[16], ip_cmd[64], iptables_cmd[64];
static int netns_ready;
static pid_t netns_worker = -1;

static int find_tool(char *out, size_t size, const char *name)
{
    static const char *const dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin", NULL};
    for (int i = 0; dirs[i]; i++) {
        snprintf(out, size, "%s/%s", dirs[i], name);
        if (access(out, X_OK) == 0)
            return 1;
    }
    return 0;
}

static int run_quiet(const char *cmd)
{
    char full[4200];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    return system(full);
}

static void netns_teardown(void)
{
    char cmd[256];
    if (netns_worker > 0) {
        kill(netns_worker, SIGKILL);
        waitpid(netns_worker, NULL, 0);
        netns_worker = -1;
    }
    if (netns_ready) {
        snprintf(cmd, sizeof cmd, "%s netns delete %s", ip_cmd, netns); /* takes the veth pair with it */
        run_quiet(cmd);
        netns_ready = 0;
    }
}

/* Sets up the namespace and makes the server listen on the host end; returns 0 with a reason when
 * this machine cannot do it. */
static int netns_setup(PGconn **pg, char *why, size_t why_size)
{
    char cmd[4096], hba[700];

    if (geteuid() != 0) {
        snprintf(why, why_size, "not running as root");
        return 0;
    }
    if (!find_tool(ip_cmd, sizeof ip_cmd, "ip") || !find_tool(iptables_cmd, sizeof iptables_cmd, "iptables")) {
        snprintf(why, why_size, "ip (iproute2) or iptables is not installed");
        return 0;
    }
    snprintf(netns, sizeof netns, "pgjobq%d", (int)getpid());
    snprintf(veth, sizeof veth, "pjq%d", (int)getpid() % 1000000);
    snprintf(cmd, sizeof cmd,
             "%1$s netns add %2$s && %1$s link add %3$sh type veth peer name %3$sn && "
             "%1$s link set %3$sn netns %2$s && %1$s addr add 169.254.77.1/30 dev %3$sh && %1$s link set %3$sh up && "
             "%1$s netns exec %2$s %1$s addr add 169.254.77.2/30 dev %3$sn && "
             "%1$s netns exec %2$s %1$s link set %3$sn up && %1$s netns exec %2$s %1$s link set lo up",
             ip_cmd, netns, veth);
    netns_ready = 1;
    t_defer(netns_teardown);
    if (run_quiet(cmd) != 0) {
        netns_teardown();
        snprintf(why, why_size, "network namespaces are not available here (ip netns add failed)");
        return 0;
    }
    /* The server listens on the host end too, for this test only. */
    snprintf(hba, sizeof hba, "%s/pg_hba.conf", t_pgdata());
    FILE *f = fopen(hba, "a");
    CHECK(f != NULL);
    fprintf(f, "host all all 169.254.77.0/30 trust\n");
    fclose(f);
    PQclear(t_exec(*pg, "ALTER SYSTEM SET listen_addresses = '169.254.77.1'"));
    CHECK_INT(t_pg_ctl("restart", "-m", "fast", "-w", "-t", "60", NULL), 0);
    PQfinish(*pg);
    *pg = connect_retry(60000);
    return 1;
}

static void netns_restore_server(PGconn **pg)
{
    PQclear(t_exec(*pg, "ALTER SYSTEM RESET listen_addresses"));
    CHECK_INT(t_pg_ctl("restart", "-m", "fast", "-w", "-t", "60", NULL), 0);
    PQfinish(*pg);
    *pg = connect_retry(60000);
}

static pid_t start_netns_worker(void)
{
    char db[256], log[600];
    pid_t pid;

    snprintf(db, sizeof db, "host=169.254.77.1 port=5432 user=postgres dbname=%s", t_dbname());
    snprintf(log, sizeof log, "%s/netns-worker.log", t_tmpdir());
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setenv("WHO", "wnet", 1);
        unsetenv("PGJOBQ_DATABASE_URL");
        execl(ip_cmd, ip_cmd, "netns", "exec", netns, getenv("PGJOBQ_CLI"), "--db", db, "work", "--queue", "chaos:4",
              "--exec", handler_path, "--lease", "2s", "--timeout", "1500ms", "--poll", "200ms", "--shutdown-timeout",
              "3s", "--worker-id", "wnet", "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Cuts the namespace off for ms milliseconds: DROP leaves connections half-open, REJECT resets them. */
static void partition(const char *target, int ms)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s netns exec %s %s -A OUTPUT -d 169.254.77.1 -j %s", ip_cmd, netns, iptables_cmd, target);
    CHECK_MSG(run_quiet(cmd) == 0, "iptables failed");
    pause_ms(ms);
    snprintf(cmd, sizeof cmd, "%s netns exec %s %s -D OUTPUT -d 169.254.77.1 -j %s", ip_cmd, netns, iptables_cmd, target);
    CHECK_MSG(run_quiet(cmd) == 0, "iptables failed to heal");
}


TEST_FULL(chaos_no_job_lost_none_run_under_a_valid_lease_twice_no_stale_write, 900, TEST_EXCLUSIVE)
{
    const char *env = getenv("PGJOBQ_CHAOS_SECONDS");
    int seconds = env ? atoi(env) : 30;
    PGconn *pg = t_pg();
    pthread_t prod;
    int faults[8] = {0};
    int64_t restart_recovery_max = 0, listener_recovery_max = 0;
    static const char *const fault_names[8] = {"kill -9 worker", "SIGSTOP past lease", "restart fast",
                                               "stop immediate + start", "terminate backends",
                                               "held transaction", "partition (DROP)", "partition (REJECT)"};
    char netns_why[200] = "";
    int have_netns;

    /* The harness's cluster trades durability for speed (synchronous_commit = off): a crash then loses
     * commits that were acknowledged, and a first run of this suite showed exactly that (2 acknowledged
     * jobs gone, 2 executions repeated under one token).  Acknowledged must mean durable here. */
    PQclear(t_exec(pg, "ALTER DATABASE %s SET synchronous_commit = on", t_dbname()));
    PQfinish(pg);
    pg = t_pg();
    char *sc = t_str(pg, "SHOW synchronous_commit");
    CHECK_STR(sc, "on");
    free(sc);

    t_audit_install(pg);
    /* A concurrency limit below the workers' 16 slots: every claim counts the running jobs and folds
     * the queue's lease alarms (pgjobq.running_fold) under the faults as well. */
    PQclear(t_exec(pg, "SELECT pgjobq.queue_set('chaos', '{\"concurrency\": 12}')"));

    snprintf(ledger_path, sizeof ledger_path, "%s/ledger", t_tmpdir());
    char body[1024];
    snprintf(body, sizeof body,
             "payload=$(cat)\n"
             "start=$(date +%%s%%N)\n"
             "sleep 0.0$(( $$ %% 9 ))\n"
             "echo \"$PGJOBQ_JOB_ID $PGJOBQ_LEASE_TOKEN $WHO $start $(date +%%s%%N)\" >> %s\n"
             "case \"$payload\" in *poison*) echo '{\"n\": 1e1000000}';; *) echo '{}';; esac",
             ledger_path);
    snprintf(handler_path, sizeof handler_path, "%s", t_script("handler.sh", body));
    have_netns = netns_setup(&pg, netns_why, sizeof netns_why);
    for (int i = 0; i < WORKERS; i++)
        workers[i] = start_worker(i);
    if (have_netns)
        netns_worker = start_netns_worker();
    CHECK(pthread_create(&prod, NULL, producer, NULL) == 0);

    /* The nemesis: a fault every 1.5 to 3 seconds, in turn, for `seconds`. */
    int64_t t0 = t_now_ms();
    unsigned seed = (unsigned)getpid();
    for (int round = 0; ms_since(t0) < (int64_t)seconds * 1000; round++) {
        seed = seed * 1103515245u + 12345u;
        pause_ms(1500 + (long)((seed >> 8) % 1500));
        int f = round % (have_netns ? 8 : 6), w = (int)((seed >> 4) % WORKERS);
        faults[f]++;
        switch (f) {
        case 0: /* kill -9 a worker; the harness restarts it */
            kill(workers[w], SIGKILL);
            t_wait_exit(workers[w], 10000);
            workers[w] = start_worker(w);
            break;
        case 1: /* freeze a worker past its lease: a zombie that must not be able to write */
            kill(workers[w], SIGSTOP);
            pause_ms(3500);
            kill(workers[w], SIGCONT);
            break;
        case 2:
        case 3: {
            int64_t t = t_now_ms();
            if (f == 2) {
                CHECK_INT(t_pg_ctl("restart", "-m", "fast", "-w", "-t", "60", NULL), 0);
            } else {
                CHECK_INT(t_pg_ctl("stop", "-m", "immediate", "-w", NULL), 0);
                CHECK_INT(t_pg_ctl("start", "-w", "-t", "60", NULL), 0);
            }
            PQfinish(pg);
            pg = connect_retry(60000);
            /* Recovery: until some job completes again after the restart. */
            long long before = int_retry(&pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'");
            while (int_retry(&pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'") <= before &&
                   ms_since(t) < 60000)
                pause_ms(20);
            if (ms_since(t) > restart_recovery_max)
                restart_recovery_max = ms_since(t);
            break;
        }
        case 4: { /* kill pgjobq's backends: claimers (which listen), writers, maintenance */
            int64_t t = t_now_ms();
            char sql[400];
            long long killed_at = int_retry(&pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint");
            PQclear(PQexec(pg, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname ="
                               " current_database() AND application_name LIKE 'pgjobq%' AND pid <> pg_backend_pid()"));
            /* A claim connection listens once it is past its set-up query (LISTEN is part of it). */
            snprintf(sql, sizeof sql,
                     "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                     " AND application_name = 'pgjobq-claim' AND query <> '' AND query NOT LIKE '%%schema_version%%'"
                     " AND backend_start > to_timestamp(%lld / 1000000.0)",
                     killed_at);
            while (int_retry(&pg, sql) < WORKERS && ms_since(t) < 60000)
                pause_ms(20);
            if (ms_since(t) > listener_recovery_max)
                listener_recovery_max = ms_since(t);
            break;
        }
        case 6: /* the namespace's worker cut off, half-open, past its lease */
            partition("DROP", 3500);
            break;
        case 7: /* and refused outright */
            partition("REJECT", 3500);
            break;
        case 5: { /* hold back the xmin horizon for a while */
            PGconn *h = connect_retry(10000);
            PQclear(PQexec(h, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
            PQclear(PQexec(h, "SELECT count(*) FROM pgjobq.all_jobs"));
            pause_ms(3000);
            PQclear(PQexec(h, "COMMIT"));
            PQfinish(h);
            break;
        }
        }
    }

    /* Heal: everything running, the producer stopped, the queue drained. */
    atomic_store(&produced.stop, 1);
    pthread_join(prod, NULL);
    for (int i = 0; i < WORKERS; i++)
        kill(workers[i], SIGCONT);
    int64_t drain_start = t_now_ms();
    const char *unfinished = "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'chaos' AND state IN ('queued', 'running')";
    long long left_at_heal = int_retry(&pg, unfinished), left;
    while ((left = int_retry(&pg, unfinished)) > 0) {
        if (ms_since(drain_start) > 180000) {
            dump_undrained(pg);
            t_fail(__FILE__, __LINE__, "the queue did not drain within 180 s after healing (%lld of %lld jobs left)",
                   left, left_at_heal);
        }
        pause_ms(100);
    }
    int64_t drain_ms = ms_since(drain_start);
    for (int i = 0; i < WORKERS; i++)
        kill(workers[i], SIGTERM);
    /* 0, or 75 when it handed jobs back at its shutdown timeout: both are clean stops. */
    for (int i = 0; i < WORKERS; i++) {
        int status = t_wait_exit(workers[i], 30000);
        CHECK_MSG(status == 0 || status == 75, "worker %d did not stop cleanly (status %d)", i, status);
    }
    long long netns_jobs = 0;
    if (have_netns) {
        kill(netns_worker, SIGTERM);
        int status = t_wait_exit(netns_worker, 30000);
        if (status != 0) {
            char cmd[700];
            snprintf(cmd, sizeof cmd, "tail -n 20 %s/netns-worker.log >&2", t_tmpdir());
            if (system(cmd) != 0)
                fprintf(stderr, "(no log)\n");
        }
        CHECK_MSG(status == 0 || status == 75, "the namespace's worker did not stop cleanly (status %d)", status);
        netns_worker = -1;
        netns_jobs = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE worker_id = 'wnet'");
        netns_teardown();
        netns_restore_server(&pg);
    }

    /* The checker. */
    int acked = atomic_load(&produced.n);
    CHECK(acked > 0 && acked <= MAX_ACKED);
    PQclear(t_exec(pg, "CREATE TEMP TABLE acked (id bigint)"));
    for (int i = 0; i < acked; i += 1000) {
        char sql[32000];
        size_t len = (size_t)snprintf(sql, sizeof sql, "INSERT INTO acked VALUES ");
        for (int k = i; k < acked && k < i + 1000; k++)
            len += (size_t)snprintf(sql + len, sizeof sql - len, "%s(%lld)", k > i ? "," : "", (long long)produced.ids[k]);
        PQclear(t_exec(pg, "%s", sql));
    }
    PQclear(t_exec(pg, "CREATE TEMP TABLE ledger (id bigint, token bigint, who text, start_ns numeric, end_ns numeric)"));
    PQclear(t_exec(pg, "COPY ledger FROM '%s' WITH (DELIMITER ' ')", ledger_path));

    /* Lost: an acknowledged job that is gone, or not completed although its handler completes it. */
    long long lost = t_int(pg, "SELECT count(*) FROM acked a LEFT JOIN pgjobq.all_jobs j USING (id)"
                               " WHERE j.id IS NULL OR (j.state <> 'completed' AND NOT j.payload ? 'poison')");
    long long poisoned = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'chaos' AND payload ? 'poison'");
    long long poison_not_failed = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'chaos'"
                                            " AND payload ? 'poison' AND state <> 'failed'");
    long long poison_refused = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'chaos'"
                                         " AND payload ? 'poison' AND last_error LIKE 'result not storable: %%'");
    /* The engine used to drop every outcome of a batch the database refused (their leases expired and
     * the jobs ran again): none may be dropped now. */
    long long dropped = worker_log_lines("outcomes \\((complete|fail)\\) failed: .*value overflows numeric format|the database refused its outcome");
    long long innocent_failed = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'chaos'"
                                          " AND NOT payload ? 'poison' AND state = 'failed'");
    long long unexpected = t_int(pg, "SELECT count(*) FROM (SELECT DISTINCT id FROM ledger) l"
                                     " LEFT JOIN pgjobq.all_jobs j USING (id) WHERE j.id IS NULL");
    long long claim_in_valid = t_audit_claims_in_valid_lease(pg);
    long long stale = t_audit_stale_writes(pg);
    long long stuck = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running'");
    long long over = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE attempt > max_attempts");
    /* Reported. */
    long long executions = t_int(pg, "SELECT count(*) FROM ledger");
    /* The most handlers running at one instant (the queue's limit is 12; a frozen worker's handlers
     * past their lease no longer count, so faults may show more). */
    long long most_at_once = t_int(pg, "SELECT coalesce(max(n), 0) FROM (SELECT sum(d) OVER (ORDER BY t, d) AS n"
                                       " FROM (SELECT start_ns AS t, 1 AS d FROM ledger"
                                       "       UNION ALL SELECT end_ns, -1 FROM ledger) e) x");
    long long dup_jobs = t_int(pg, "SELECT count(*) FROM (SELECT id FROM ledger GROUP BY id HAVING count(*) > 1) d");
    long long dup_same_token = t_int(pg, "SELECT count(*) FROM (SELECT id, token FROM ledger GROUP BY 1, 2"
                                         " HAVING count(*) > 1) d");
    long long landed = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs j WHERE queue = 'chaos'"
                                 " AND NOT EXISTS (SELECT 1 FROM acked a WHERE a.id = j.id)");
    long long rescues = t_int(pg, "SELECT count(*) FROM job_audit WHERE query LIKE '%%rescue_expired%%'");
    long long rescue_p50 = t_int(pg, "SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY"
                                     " extract(epoch FROM at - old_lease_until) * 1000), 0)::bigint FROM job_audit"
                                     " WHERE query LIKE '%%rescue_expired%%'");
    long long rescue_max = t_int(pg, "SELECT coalesce(max(extract(epoch FROM at - old_lease_until) * 1000), 0)::bigint"
                                     " FROM job_audit WHERE query LIKE '%%rescue_expired%%'");
    long long p50 = t_int(pg, "SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM"
                              " started_at - created_at) * 1000), 0)::bigint FROM pgjobq.all_jobs WHERE attempt = 1"
                              " AND queue = 'chaos'");
    long long p99 = t_int(pg, "SELECT coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM"
                              " started_at - created_at) * 1000), 0)::bigint FROM pgjobq.all_jobs WHERE attempt = 1"
                              " AND queue = 'chaos'");

    printf("chaos: %d s, %d workers, %d jobs acknowledged, %lld executions\n", seconds, WORKERS, acked, executions);
    printf("faults:");
    for (int f = 0; f < (have_netns ? 8 : 6); f++)
        printf(" %s x%d%s", fault_names[f], faults[f], f < (have_netns ? 7 : 5) ? "," : "\n");
    if (have_netns)
        printf("a fourth worker ran in its own network namespace and completed %lld jobs\n", netns_jobs);
    else
        printf("fault skipped: network partition (%s)\n", netns_why);
    printf("%-58s %8s\n", "must be zero", "");
    printf("  %-56s %8lld\n", "lost (acknowledged, not completed)", lost);
    printf("  %-56s %8lld\n", "unexpected (executed, never enqueued)", unexpected);
    printf("  %-56s %8lld\n", "claims while another lease was valid", claim_in_valid);
    printf("  %-56s %8lld\n", "stale writes accepted (holder wrote after its lease)", stale);
    printf("  %-56s %8lld\n", "stuck running at the end", stuck);
    printf("  %-56s %8lld\n", "attempts over max_attempts", over);
    printf("  %-56s %8lld\n", "innocent jobs failed (beside a poisoned one)", innocent_failed);
    printf("  %-56s %8lld\n", "poisoned jobs not failed", poison_not_failed);
    printf("  %-56s %8lld\n", "outcomes dropped for a refused batch (worker logs)", dropped);
    printf("%-58s\n", "reported");
    printf("  %-56s %8lld\n", "jobs executed more than once (after losing a lease)", dup_jobs);
    printf("  %-56s %8lld\n", "executions repeated under one lease token", dup_same_token);
    printf("  %-56s %8d\n", "enqueue errors during faults", atomic_load(&produced.errors));
    printf("  %-56s %8lld\n", "  of which the commit landed anyway (indeterminate)", landed);
    printf("  %-56s %8lld\n", "poisoned jobs (a result PostgreSQL refuses)", poisoned);
    printf("  %-56s %8lld\n", "  of which failed saying 'result not storable'", poison_refused);
    printf("  %-56s %8lld\n", "leases rescued", rescues);
    printf("  %-56s %5lld ms\n", "rescue delay after lease expiry, p50", rescue_p50);
    printf("  %-56s %5lld ms\n", "rescue delay after lease expiry, max", rescue_max);
    printf("  %-56s %5lld ms\n", "database restart to next completion, max", (long long)restart_recovery_max);
    printf("  %-56s %5lld ms\n", "backends killed to all listeners back, max", (long long)listener_recovery_max);
    printf("  %-56s %5lld / %lld ms\n", "pickup latency p50 / p99", p50, p99);
    printf("  %-56s %5lld ms (%lld jobs)\n", "drain after healing", (long long)drain_ms, left_at_heal);
    printf("  %-56s %5lld (the limit: 12)\n", "most handlers running at once", most_at_once);
    CHECK_INT(lost, 0);
    CHECK_INT(unexpected, 0);
    CHECK_INT(claim_in_valid, 0);
    CHECK_INT(stale, 0);
    CHECK_INT(stuck, 0);
    CHECK_INT(over, 0);
    CHECK_INT(innocent_failed, 0);
    CHECK_INT(poison_not_failed, 0);
    CHECK_INT(dropped, 0);
    CHECK(poisoned > 0 && poison_refused > 0);
    CHECK(executions >= acked); /* the ledger saw every job at least once */
    PQfinish(pg);
}

/* ------------------------------------------------------------------------------------------------ */
/* Second mode: the effect and the fenced completion in one transaction.                            */

/* Each handler thread keeps its own connection, wrapped in a client for the fenced completion. */
static _Thread_local PGconn *effect_conn;
static _Thread_local pgjobq_client *effect_client;

static pgjobq_outcome effect_handler(pgjobq_ctx *ctx, void *arg)
{
    const pgjobq_job *job = pgjobq_ctx_job(ctx);
    char sql[256];
    PGresult *r;
    (void)arg;

    if (effect_conn && PQstatus(effect_conn) != CONNECTION_OK) {
        pgjobq_client_close(effect_client);
        PQfinish(effect_conn);
        effect_conn = NULL;
        effect_client = NULL;
    }
    if (effect_conn == NULL) {
        effect_conn = PQconnectdb(t_conninfo());
        if (PQstatus(effect_conn) != CONNECTION_OK || pgjobq_client_wrap(&effect_client, effect_conn) != PGJOBQ_OK) {
            pgjobq_ctx_set_error(ctx, "no connection for the effect");
            return PGJOBQ_OUTCOME_RETRY;
        }
    }
    /* A moment of work, so that faults land in the middle of jobs. */
    struct timespec pause = {0, (long)(job->id % 7) * 3000000L};
    nanosleep(&pause, NULL);
    r = PQexec(effect_conn, "BEGIN");
    PQclear(r);
    snprintf(sql, sizeof sql, "INSERT INTO effects VALUES (%lld, %lld)", (long long)job->id, (long long)job->lease_token);
    r = PQexec(effect_conn, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    int rc = ok ? pgjobq_job_complete(effect_client, job->id, job->lease_token, NULL) : PGJOBQ_EDB;
    r = PQexec(effect_conn, rc == PGJOBQ_OK ? "COMMIT" : "ROLLBACK");
    int committed = rc == PGJOBQ_OK && PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
    PQclear(r);
    if (committed || rc == PGJOBQ_ELEASE || rc == PGJOBQ_ECANCELLED)
        return PGJOBQ_OUTCOME_DONE; /* ended here: completed with its effect, or not ours any more */
    /* The commit's fate is unknown (the connection broke): the fenced completion went with it or not,
     * and a retry of an already completed job is refused by the fence. */
    pgjobq_ctx_set_error(ctx, "effect transaction failed");
    return PGJOBQ_OUTCOME_RETRY;
}

static pgjobq_worker *effect_worker;

static void effect_stop(int sig)
{
    (void)sig;
    if (effect_worker)
        pgjobq_worker_stop(effect_worker);
}

static pid_t start_effect_worker(void)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    o.lease_ms = 2000;
    o.timeout_ms = 1500;
    o.poll_ms = 200;
    o.shutdown_timeout_ms = 3000;
    if (pgjobq_worker_new(&effect_worker, t_conninfo(), &o) != PGJOBQ_OK ||
        pgjobq_worker_handle(effect_worker, "effects", NULL, 4, effect_handler, NULL) != PGJOBQ_OK)
        _exit(2);
    signal(SIGTERM, effect_stop);
    int rc = pgjobq_worker_run(effect_worker);
    _exit(rc == PGJOBQ_OK || rc == PGJOBQ_ETIMEOUT ? 0 : 1);
}

TEST_FULL(chaos_effects_in_the_completing_transaction_happen_exactly_once, 900, TEST_EXCLUSIVE)
{
    const char *env = getenv("PGJOBQ_CHAOS_SECONDS");
    int seconds = env ? atoi(env) : 30;
    enum { BATCH = 300, K = 2 };
    pid_t pids[K];
    PGconn *pg = t_pg();
    pgjobq_client *c = NULL;
    pgjobq_job_spec specs[BATCH];
    long long enqueued = 0;

    PQclear(t_exec(pg, "ALTER DATABASE %s SET synchronous_commit = on", t_dbname()));
    PQclear(t_exec(pg, "CREATE TABLE effects (job_id bigint, token bigint)"));
    memset(specs, 0, sizeof specs);
    for (int i = 0; i < BATCH; i++) {
        specs[i].opts.queue = "effects";
        specs[i].opts.max_attempts = 1000;
    }
    for (int i = 0; i < K; i++)
        pids[i] = start_effect_worker();

    int64_t t0 = t_now_ms();
    for (int round = 0; ms_since(t0) < (int64_t)seconds * 1000; round++) {
        /* Jobs keep arriving, so that every fault lands while jobs run; a batch either lands whole
         * (counted) or not at all, even across a restart. */
        if (c == NULL && pgjobq_client_open(&c, t_conninfo()) != PGJOBQ_OK) {
            pgjobq_client_close(c);
            c = NULL;
        }
        if (c && pgjobq_enqueue_many(c, specs, BATCH, NULL, NULL) == PGJOBQ_OK)
            enqueued += BATCH;
        pause_ms(2000);
        int w = round % K;
        switch (round % 4) {
        case 0:
            kill(pids[w], SIGKILL);
            t_wait_exit(pids[w], 10000);
            pids[w] = start_effect_worker();
            break;
        case 1:
            kill(pids[w], SIGSTOP);
            pause_ms(3500);
            kill(pids[w], SIGCONT);
            break;
        case 2:
            CHECK_INT(t_pg_ctl("restart", "-m", "fast", "-w", "-t", "60", NULL), 0);
            PQfinish(pg);
            pg = connect_retry(60000);
            break;
        case 3:
            CHECK_INT(t_pg_ctl("stop", "-m", "immediate", "-w", NULL), 0);
            CHECK_INT(t_pg_ctl("start", "-w", "-t", "60", NULL), 0);
            PQfinish(pg);
            pg = connect_retry(60000);
            break;
        }
    }
    pgjobq_client_close(c);
    for (int i = 0; i < K; i++)
        kill(pids[i], SIGCONT);
    int64_t drain = t_now_ms();
    while (int_retry(&pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'effects' AND state <> 'completed'") > 0) {
        if (ms_since(drain) > 180000)
            t_fail(__FILE__, __LINE__, "the effects queue did not drain");
        pause_ms(100);
    }
    for (int i = 0; i < K; i++) {
        kill(pids[i], SIGTERM);
        CHECK_MSG(t_wait_exit(pids[i], 30000) == 0, "effect worker %d did not stop cleanly", i);
    }
    long long effects = t_int(pg, "SELECT count(*) FROM effects");
    long long dup = t_int(pg, "SELECT count(*) FROM (SELECT job_id FROM effects GROUP BY 1 HAVING count(*) > 1) d");
    long long missing = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs j WHERE queue = 'effects'"
                                  " AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.job_id = j.id)");
    long long wrong_token = t_int(pg, "SELECT count(*) FROM effects e JOIN pgjobq.all_jobs j ON j.id = e.job_id"
                                      " WHERE e.token <> j.lease_token");
    long long retried = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'effects' AND attempt > 1");
    long long jobs = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'effects'");
    printf("effects mode: %d s of faults, %lld jobs (%lld acknowledged), %lld effects, %lld jobs attempted more than"
           " once\n", seconds, jobs, enqueued, effects, retried);
    printf("  duplicate effects %lld, jobs without effect %lld, effects under a stale token %lld\n", dup, missing,
           wrong_token);
    CHECK(jobs >= enqueued && enqueued > 0); /* an indeterminate batch may have landed too */
    CHECK_INT(effects, jobs);
    CHECK_INT(dup, 0);
    CHECK_INT(missing, 0);
    CHECK_INT(wrong_token, 0);
    PQfinish(pg);
}

/* ------------------------------------------------------------------------------------------------ */
/* Third mode: ten-step workflows (docs/durable.md), each step's effect in its fenced transaction.  */

/*
 * Worker processes (the C library, pgjobq_ctx_step_tx) run workflows of ten steps; each step appends
 * its row to a ledger in the transaction that stores the step, and each execution of a step's
 * function first records itself in an unfenced log (autocommit, a connection of its own), so that
 * every rerun is seen.  Meanwhile, one fault at a time, a worker is killed (-9), cut off (its
 * connections terminated as soon as they are made, for 2.5 s: past its 2 s lease) or frozen past its
 * lease (SIGSTOP); and the worker running step 4 of every SC_STALL_EVERY-th workflow's first attempt
 * is frozen while that step is in flight (the step says so and waits), so that its store comes after
 * its lease: it must be refused.  An audit of pgjobq.jobs (at clock_timestamp()) says when each
 * lease was taken away.
 *
 * Must be zero: workflows not completed, jobs left, (job, step) pairs not in the ledger exactly once,
 * ledger rows not of the holder that stored the step, steps stored by a holder after it had lost the
 * job, executions of a step by a later attempt than the one that stored it (a stored step run again:
 * that attempt claimed the job after the store committed, so it found the step stored), stalled
 * steps stored.  PGJOBQ_CHAOS_WORKFLOWS sets how many run (make chaos: 1,000; make check: 100).
 */
enum { SC_WORKERS = 3, SC_STEPS = 10, SC_STALL_EVERY = 40, SC_STALL_STEP = 4 };

static char sc_conninfo[SC_WORKERS][1024];
static pgjobq_worker *sc_worker;
static _Thread_local PGconn *sc_log;

/* This thread's unfenced connection (autocommit), made again when it broke. */
static PGconn *sc_log_conn(void)
{
    if (sc_log && PQstatus(sc_log) != CONNECTION_OK) {
        PQfinish(sc_log);
        sc_log = NULL;
    }
    if (sc_log == NULL) {
        char ci[1200];
        snprintf(ci, sizeof ci, "%s application_name=chaos-log", t_conninfo());
        sc_log = PQconnectdb(ci);
    }
    return sc_log;
}

/* Records an execution (or a refused store) of a step, outside any transaction of the job's: 0, or -1
 * when it could not be recorded (then the step must not run, so that no execution goes unseen). */
static int sc_record(const pgjobq_job *job, int step, const char *what)
{
    char id[32], tok[32], st[16], att[16], pid[16];
    const char *values[6] = {id, st, tok, att, what, pid};
    snprintf(id, sizeof id, "%lld", (long long)job->id);
    snprintf(tok, sizeof tok, "%lld", (long long)job->lease_token);
    snprintf(st, sizeof st, "%d", step);
    snprintf(att, sizeof att, "%d", job->attempt);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    PGresult *r =
        PQexecParams(sc_log_conn(), "INSERT INTO step_runs VALUES ($1, $2, $3, $4, $5, clock_timestamp(), $6)", 6, NULL,
                     values, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok ? 0 : -1;
}

/* A step in flight when its worker stalls past its lease: says so (the test freezes this process as
 * soon as it sees it), then waits until the database says the lease it runs under is over (expired,
 * or the job taken over or ended), at most 60 s; then the step's store must be refused. */
static void sc_stall(const pgjobq_job *job, int step)
{
    if (sc_record(job, step, "stall") != 0)
        return;
    char id[32], tok[32];
    const char *values[2] = {id, tok};
    snprintf(id, sizeof id, "%lld", (long long)job->id);
    snprintf(tok, sizeof tok, "%lld", (long long)job->lease_token);
    for (int64_t t0 = t_now_ms(); t_now_ms() - t0 < 60000; pause_ms(50)) {
        PGresult *r = PQexecParams(sc_log_conn(),
                                   "SELECT NOT EXISTS (SELECT 1 FROM pgjobq.jobs WHERE id = $1 AND lease_token = $2"
                                   " AND lease_until >= clock_timestamp())",
                                   2, NULL, values, NULL, NULL, 0);
        int over = PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
        PQclear(r);
        if (over)
            return;
    }
}

/* The next holder of a stalled step: waits (at most 10 s) until the stalled one has tried to store it
 * (when it came to stall at all),
 * so that the store the fence must refuse comes after this holder claimed the job (else this one,
 * which does not stall, would store the step first). */
static void sc_after_stall(const pgjobq_job *job, int step)
{
    char id[32], st[16];
    const char *values[2] = {id, st};
    snprintf(id, sizeof id, "%lld", (long long)job->id);
    snprintf(st, sizeof st, "%d", step);
    for (int64_t t0 = t_now_ms(); t_now_ms() - t0 < 10000; pause_ms(50)) {
        PGresult *r = PQexecParams(sc_log_conn(),
                                   "SELECT EXISTS (SELECT 1 FROM step_runs WHERE job_id = $1 AND step = $2"
                                   " AND attempt = 1 AND what = 'tried')"
                                   " OR NOT EXISTS (SELECT 1 FROM step_runs WHERE job_id = $1 AND step = $2"
                                   " AND attempt = 1 AND what = 'stall')",
                                   2, NULL, values, NULL, NULL, 0);
        int tried = PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
        PQclear(r);
        if (tried)
            return;
    }
}

/* Whether the worker PID holds a stalled step that has not tried its store yet. */
static int sc_stall_pending(PGconn *pg, int pid)
{
    return t_int(pg,
                 "SELECT count(*) FROM step_runs s WHERE s.what = 'stall' AND s.pid = %d"
                 " AND NOT EXISTS (SELECT 1 FROM step_runs t WHERE t.job_id = s.job_id AND t.step = s.step"
                 " AND t.attempt = s.attempt AND t.what = 'tried')",
                 pid) > 0;
}

/* One step: recorded as run, a moment of work, then its ledger row in the transaction that stores it;
 * its result says who stored it. */
static int sc_step(pgjobq_ctx *ctx, pgjobq_client *tx, void *arg, char **result)
{
    const pgjobq_job *job = pgjobq_ctx_job(ctx);
    int step = *(const int *)arg;
    char id[32], tok[32], st[16], att[16];
    const char *values[4] = {id, st, tok, att};

    if (sc_record(job, step, "run") != 0)
        return PGJOBQ_EDB;
    pause_ms((job->id * 7 + step) % 5);
    if (job->id % SC_STALL_EVERY == 0 && step == SC_STALL_STEP) {
        if (job->attempt == 1)
            sc_stall(job, step);
        else
            sc_after_stall(job, step);
    }
    snprintf(id, sizeof id, "%lld", (long long)job->id);
    snprintf(tok, sizeof tok, "%lld", (long long)job->lease_token);
    snprintf(st, sizeof st, "%d", step);
    snprintf(att, sizeof att, "%d", job->attempt);
    PGresult *r = PQexecParams(pgjobq_client_conn(tx), "INSERT INTO ledger VALUES ($1, $2, $3, $4, clock_timestamp())",
                               4, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok)
        return PGJOBQ_EDB;
    if ((*result = malloc(96)) == NULL)
        return PGJOBQ_ENOMEM;
    snprintf(*result, 96, "{\"token\": %lld, \"attempt\": %d}", (long long)job->lease_token, job->attempt);
    return PGJOBQ_OK;
}

static pgjobq_outcome sc_handler(pgjobq_ctx *ctx, void *arg)
{
    static const int steps[SC_STEPS] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    (void)arg;
    for (int i = 0; i < SC_STEPS; i++) {
        char name[16], *stored = NULL;
        if (pgjobq_ctx_should_stop(ctx))
            return PGJOBQ_OUTCOME_RETRY;
        snprintf(name, sizeof name, "s%d", steps[i]);
        int rc = pgjobq_ctx_step_tx(ctx, name, sc_step, (void *)&steps[i], &stored);
        pgjobq_free(stored);
        const pgjobq_job *job = pgjobq_ctx_job(ctx);
        if (job->id % SC_STALL_EVERY == 0 && steps[i] == SC_STALL_STEP && job->attempt == 1)
            (void)sc_record(job, steps[i], "tried"); /* the next holder waits for this */
        if (rc != PGJOBQ_OK) {
            /* PGJOBQ_ELEASE: not ours any more (its store refused, its ledger row rolled back). */
            (void)sc_record(pgjobq_ctx_job(ctx), steps[i], rc == PGJOBQ_ELEASE ? "refused" : pgjobq_errname(rc));
            pgjobq_ctx_set_error(ctx, pgjobq_ctx_errmsg(ctx));
            return PGJOBQ_OUTCOME_RETRY;
        }
    }
    return PGJOBQ_OUTCOME_COMPLETE;
}

static void sc_stop(int sig)
{
    (void)sig;
    if (sc_worker)
        pgjobq_worker_stop(sc_worker);
}

static pid_t sc_start_worker(int i)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    o.lease_ms = 2000;
    o.timeout_ms = 1500;
    o.poll_ms = 200;
    o.shutdown_timeout_ms = 3000;
    if (pgjobq_worker_new(&sc_worker, sc_conninfo[i], &o) != PGJOBQ_OK ||
        pgjobq_worker_handle(sc_worker, "steps", NULL, 4, sc_handler, NULL) != PGJOBQ_OK)
        _exit(2);
    signal(SIGTERM, sc_stop);
    int rc = pgjobq_worker_run(sc_worker);
    _exit(rc == PGJOBQ_OK || rc == PGJOBQ_ETIMEOUT ? 0 : 1);
}

TEST_FULL(chaos_ten_step_workflows_complete_and_no_stored_step_runs_again, 900, TEST_EXCLUSIVE)
{
    const char *env = getenv("PGJOBQ_CHAOS_WORKFLOWS"), *secs = getenv("PGJOBQ_CHAOS_SECONDS");
    /* The long form (make chaos: PGJOBQ_CHAOS_SECONDS of 60 or more) runs 1,000; make check 100. */
    int workflows = env ? atoi(env) : secs && atoi(secs) >= 60 ? 1000 : 100;
    enum { BATCH = 10 };
    pid_t pids[SC_WORKERS];
    int faults[3] = {0};
    PGconn *pg = t_pg();

    CHECK(workflows >= BATCH);
    CHECK_MSG(strstr(t_conninfo(), "://") == NULL, "the test's conninfo is a URL: %s", t_conninfo());
    PQclear(t_exec(pg, "ALTER DATABASE %s SET synchronous_commit = on", t_dbname()));
    /* The workflows' retries back off 0.2 s, doubling, at most 2 s: a policy for short jobs (pgjobq.backoff
     * replaced, as documented).  With the default (2^attempt s, up to an hour) a job whose attempts the
     * faults kept ending (cut off, or frozen past its timeout) 14 times was due again 50 minutes later,
     * after the run's end: a 1,000-workflow run left two such jobs, queued, neither lost nor stuck. */
    PQclear(t_exec(pg, "CREATE OR REPLACE FUNCTION pgjobq.backoff(attempt integer) RETURNS interval LANGUAGE sql"
                       " VOLATILE SET search_path = pg_catalog, pg_temp"
                       " AS $$ SELECT make_interval(secs => least(0.1 * power(2, least(greatest(attempt, 1), 10)), 2)) $$"));
    PQclear(t_exec(pg, "CREATE TABLE ledger (job_id bigint, step int, token bigint, attempt int, at timestamptz)"));
    PQclear(t_exec(pg, "CREATE TABLE step_runs (job_id bigint, step int, token bigint, attempt int, what text,"
                       " at timestamptz, pid int)"));
    /* When each lease was taken away (claimed under another token, put back, ended), by the clock. */
    PQclear(t_exec(pg, "CREATE TABLE lease_audit (job_id bigint, old_token bigint, new_token bigint, old_state text,"
                       " new_state text, at timestamptz)"));
    PQclear(t_exec(pg, "CREATE FUNCTION lease_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                       " IF TG_OP = 'DELETE' THEN"
                       "  INSERT INTO public.lease_audit VALUES (OLD.id, OLD.lease_token, NULL, OLD.state, 'moved',"
                       "  clock_timestamp());"
                       " ELSIF OLD.lease_token IS DISTINCT FROM NEW.lease_token OR OLD.state <> NEW.state THEN"
                       "  INSERT INTO public.lease_audit VALUES (OLD.id, OLD.lease_token, NEW.lease_token, OLD.state,"
                       "  NEW.state, clock_timestamp());"
                       " END IF; RETURN NULL; END $$"));
    PQclear(t_exec(pg, "CREATE TRIGGER lease_audit AFTER UPDATE OR DELETE ON pgjobq.jobs FOR EACH ROW"
                       " EXECUTE FUNCTION lease_audit_row()"));
    for (int i = 0; i < SC_WORKERS; i++) {
        snprintf(sc_conninfo[i], sizeof sc_conninfo[i], "%s application_name=chaos-sw%d", t_conninfo(), i);
        pids[i] = sc_start_worker(i);
    }

    /* Workflows arrive BATCH at a time while the faults go on, until all have arrived and finished.  A
     * fault lasts (a freeze, a cut) while the loop goes on: it ends at its time. */
    int enqueued = 0, stalls_frozen = 0;
    unsigned seed = (unsigned)getpid();
    int64_t t0 = t_now_ms(), next_fault = t0 + 500, next_batch = t0, frozen_until[SC_WORKERS] = {0},
            cut_until[SC_WORKERS] = {0};
    const char *unfinished = "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'steps' AND state <> 'completed'";
    for (int round = 0;; pause_ms(100)) {
        int64_t now = t_now_ms();
        for (int w = 0; w < SC_WORKERS; w++) {
            if (frozen_until[w] && now >= frozen_until[w]) {
                kill(pids[w], SIGCONT);
                frozen_until[w] = 0;
            }
            if (cut_until[w] && now >= cut_until[w])
                cut_until[w] = 0;
            if (cut_until[w]) /* its connections ended as soon as they are made */
                PQclear(t_exec(pg,
                               "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                               " WHERE application_name = 'chaos-sw%d'",
                               w));
        }
        if (enqueued < workflows && now >= next_batch) {
            PQclear(t_exec(pg,
                           "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('steps'::text, ARRAY[%d]), NULL,"
                           " array_fill('{}'::jsonb, ARRAY[%d]), max_attempts => array_fill(1000, ARRAY[%d]))",
                           BATCH, BATCH, BATCH));
            enqueued += BATCH;
            next_batch = now + 800;
        } else if (enqueued >= workflows && int_retry(&pg, unfinished) == 0) {
            break;
        }
        if (ms_since(t0) >= 600000) {
            /* What is left, and why: its row, its park and its steps. */
            char *left = t_str(pg, "SELECT coalesce(string_agg(format('%%s %%s attempt %%s/%%s run_at %%s lease_until %%s"
                                   " worker %%s error %%s park %%s steps %%s', a.id, a.state, a.attempt,"
                                   " a.max_attempts, a.run_at, a.lease_until, a.worker_id, left(a.last_error, 200),"
                                   " (SELECT row_to_json(p) FROM pgjobq.job_park_of(a.id) p),"
                                   " (SELECT count(*) FROM pgjobq.steps(a.id))), E'\\n'), 'none')"
                                   " FROM pgjobq.all_jobs a WHERE a.queue = 'steps' AND a.state <> 'completed'");
            t_fail(__FILE__, __LINE__, "the workflows did not finish within 600 s (%lld left, now %s):\n%s",
                   int_retry(&pg, unfinished), t_str(pg, "SELECT now()::text"), left);
        }
        /* A step in flight on a worker that stalls past its lease: frozen as soon as it says so. */
        int busy = 0;
        for (int k = 0; k < SC_WORKERS; k++)
            busy |= frozen_until[k] || cut_until[k];
        if (!busy) {
            PGresult *r = t_exec(pg, "SELECT pid FROM step_runs WHERE what = 'stall' ORDER BY at OFFSET %d LIMIT 1",
                                 stalls_frozen);
            int pid = PQntuples(r) ? atoi(PQgetvalue(r, 0, 0)) : 0;
            PQclear(r);
            for (int k = 0; pid && k < SC_WORKERS; k++)
                if (pids[k] == pid) {
                    kill(pid, SIGSTOP);
                    frozen_until[k] = now + 2500;
                    busy = 1;
                }
            stalls_frozen += pid != 0; /* (a stall of a worker killed since: nothing to freeze) */
        }
        if (now < next_fault || busy)
            continue; /* one fault at a time: the others keep the workflows going */
        seed = seed * 1103515245u + 12345u;
        next_fault = now + 500 + (long)((seed >> 8) % 500);
        int f = round++ % 3, w = (int)((seed >> 4) % SC_WORKERS);
        /* Not a worker whose stalled step has yet to try its store: killed or cut off, it would never
         * try, and the fence's check below would have nothing to see (a CI run failed that way). */
        int tries = 0;
        while (tries < SC_WORKERS && sc_stall_pending(pg, pids[w])) {
            w = (w + 1) % SC_WORKERS;
            tries++;
        }
        if (tries == SC_WORKERS)
            continue;
        faults[f]++;
        if (f == 0) { /* killed */
            kill(pids[w], SIGKILL);
            t_wait_exit(pids[w], 10000);
            pids[w] = sc_start_worker(w);
        } else if (f == 1) { /* cut off past its lease */
            cut_until[w] = now + 2500;
            next_fault += 2500;
        } else { /* frozen past its lease */
            kill(pids[w], SIGSTOP);
            frozen_until[w] = now + 2500;
            next_fault += 2500;
        }
    }
    for (int w = 0; w < SC_WORKERS; w++)
        kill(pids[w], SIGCONT);
    int64_t took = ms_since(t0);
    /* A step frozen in flight near the end (its workflow finished elsewhere meanwhile) tries its store
     * when it runs again: let it, before the workers stop, or the fence's check below has nothing to
     * see (a 20 s run with one such stall failed that way). */
    for (int64_t until = t_now_ms() + 15000; stalls_frozen > 0 && t_now_ms() < until; pause_ms(100))
        if (t_int(pg, "SELECT count(*) FROM step_runs WHERE what = 'refused'") >= stalls_frozen)
            break;
    for (int i = 0; i < SC_WORKERS; i++) {
        kill(pids[i], SIGTERM);
        int status = t_wait_exit(pids[i], 30000);
        CHECK_MSG(status == 0, "steps worker %d did not stop cleanly (status %d)", i, status);
    }

    /* The checker. */
    long long completed =
        t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'steps' AND state = 'completed'");
    long long stuck = t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'steps'");
    /* Every step of every workflow in the ledger exactly once, by the holder that stored it. */
    long long pairs = t_int(pg, "SELECT count(*) FROM (SELECT DISTINCT job_id, step FROM ledger) l");
    long long rows = t_int(pg, "SELECT count(*) FROM ledger");
    long long not_stored_by_writer =
        t_int(pg, "SELECT count(*) FROM ledger l LEFT JOIN pgjobq.job_steps s ON s.job_id = l.job_id"
                  " AND s.name = 's' || l.step WHERE s.job_id IS NULL OR (s.result->>'token')::bigint <> l.token"
                  " OR s.attempt <> l.attempt");
    long long steps_stored =
        t_int(pg, "SELECT count(*) FROM pgjobq.job_steps s JOIN pgjobq.history h ON h.id = s.job_id"
                  " WHERE h.queue = 'steps'");
    /* Stored by a holder after it had lost the job (the fence broken): its lease taken away before. */
    long long stale = t_int(pg, "SELECT count(*) FROM pgjobq.job_steps s JOIN lease_audit a ON a.job_id = s.job_id"
                                " AND a.old_token = (s.result->>'token')::bigint AND a.old_state = 'running'"
                                " AND (a.new_token IS DISTINCT FROM a.old_token OR a.new_state <> 'running')"
                                " AND a.at < s.stored_at");
    /* A stored step run again: executed by a later attempt than the one that stored it (which claimed
     * the job only after the store had committed, so found it stored). */
    long long rerun = t_int(pg, "SELECT count(*) FROM step_runs r JOIN pgjobq.job_steps s ON s.job_id = r.job_id"
                                " AND s.name = 's' || r.step WHERE r.what = 'run' AND r.attempt > s.attempt");
    long long runs = t_int(pg, "SELECT count(*) FROM step_runs WHERE what = 'run'");
    long long refused = t_int(pg, "SELECT count(*) FROM step_runs WHERE what = 'refused'");
    long long stalls = t_int(pg, "SELECT count(*) FROM step_runs WHERE what = 'stall'");
    long long stalls_stored = t_int(pg,
                                    "SELECT count(*) FROM pgjobq.job_steps s WHERE s.name = 's%d'"
                                    " AND s.job_id %% %d = 0 AND (s.result->>'attempt')::int = 1",
                                    SC_STALL_STEP, SC_STALL_EVERY);
    long long attempts_max = t_int(pg, "SELECT coalesce(max(attempt), 0) FROM pgjobq.history WHERE queue = 'steps'");
    printf("steps mode: %d workflows of %d steps, %d workers, %lld ms; faults: kill -9 x%d, cut off x%d, SIGSTOP past"
           " lease x%d (and x%d with a step in flight)\n",
           workflows, SC_STEPS, SC_WORKERS, (long long)took, faults[0], faults[1], faults[2], stalls_frozen);
    printf("  must be zero: not completed %lld, stuck %lld, ledger rows beyond one per step %lld, steps missing from"
           " the ledger %lld, ledger rows not of the stored step %lld, steps stored after their holder lost the job"
           " %lld, stored steps run again %lld, stalled stores accepted %lld\n",
           (long long)workflows - completed, stuck, rows - pairs, (long long)workflows * SC_STEPS - pairs,
           not_stored_by_writer, stale, rerun, stalls_stored);
    printf("  reported: %lld step executions for %lld steps (%lld reruns), %lld stores refused"
           " (%lld stalls past the lease), most attempts of a workflow %lld\n",
           runs, steps_stored, runs - steps_stored, refused, stalls, attempts_max);
    CHECK_INT(completed, workflows);
    CHECK_INT(stuck, 0);
    CHECK_INT(rows, pairs);
    CHECK_INT(pairs, (long long)workflows * SC_STEPS);
    CHECK_INT(steps_stored, (long long)workflows * SC_STEPS);
    CHECK_INT(not_stored_by_writer, 0);
    CHECK_INT(stale, 0);
    CHECK_INT(rerun, 0);
    /* The fence was exercised: each stall's store was refused. */
    CHECK(stalls > 0);
    CHECK_INT(stalls_stored, 0);
    /* ...and exercised: a stalled step whose worker lived on to store it had its store refused (one
     * killed meanwhile stored nothing). */
    CHECK_MSG(stalls > 0 && refused > 0, "no stalled store refused; the stalls' records: %s",
              t_str(pg, "SELECT coalesce(string_agg(format('%%s/%%s attempt %%s %%s pid %%s', job_id, step, attempt,"
                        " what, pid), '; ' ORDER BY at), 'none') FROM step_runs r WHERE EXISTS (SELECT 1"
                        " FROM step_runs s WHERE s.what = 'stall' AND s.job_id = r.job_id AND s.step = r.step)"));
    PQfinish(pg);
}
