/*
 * test_coproc.c - `pgjobq work --coproc`: the Python and Node handlers of examples/ run real jobs;
 * a coprocess that exits, writes garbage or a reply with a bad status is restarted and its jobs
 * retried; a job past its timeout is given up and the coprocess told; the coprocess never sees the
 * database credentials.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static pid_t worker;

static void stop_worker(void)
{
    if (worker > 0) {
        kill(worker, SIGTERM);
        t_wait_exit(worker, 20000);
        worker = 0;
    }
}

static void enqueue(pgjobq_client *c, const char *queue, const char *payload, int max_attempts)
{
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.queue = queue;
    o.max_attempts = max_attempts;
    CHECK_OK(c, pgjobq_enqueue(c, payload, &o, NULL));
}

/* Waits until no job of the queue is queued or running. */
static void wait_drained(PGconn *pg, const char *queue, const char *log, int timeout_ms)
{
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s' AND (state = 'running' OR run_at <= now())",
                 queue) > 0) {
        if (t_now_ms() - t0 > timeout_ms) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "queue %s not drained after %d ms", queue, timeout_ms);
        }
        usleep(50000);
    }
}

/* Saves a Python handler under the test's directory; command: how to run it. */
static void python_script(const char *name, const char *text, char *command, size_t size)
{
    char script[600];
    snprintf(script, sizeof script, "%s/%s", t_tmpdir(), name);
    FILE *sf = fopen(script, "w");
    CHECK(sf != NULL && fputs(text, sf) >= 0 && fclose(sf) == 0);
    snprintf(command, size, "/usr/bin/python3 %s", script);
}

/* The worker's log, whole (free it). */
static char *read_log(const char *log)
{
    FILE *f = fopen(log, "r");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long size = ftell(f);
    CHECK(size >= 0);
    rewind(f);
    char *text = calloc(1, (size_t)size + 1);
    CHECK(text && fread(text, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    return text;
}

/* Runs the example handler of one language over 200 jobs, some of which ask to fail. */
static void run_example(const char *handler, const char *queue)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char command[1024], q[64];
    const char *log = t_log_path(queue);

    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('%s'::text, ARRAY[200]), NULL,"
                       " (SELECT array_agg(jsonb_build_object('n', i)) FROM generate_series(1, 200) i))",
                   queue));
    for (int i = 0; i < 3; i++)
        enqueue(c, queue, "{\"fail\": true}", 2);
    snprintf(command, sizeof command, "%s %s/examples/%s", strstr(handler, ".py") ? "/usr/bin/python3" : "node",
             getenv("PGJOBQ_SRCDIR") ? getenv("PGJOBQ_SRCDIR") : ".", handler);
    snprintf(q, sizeof q, "%s:16", queue);
    worker = t_spawn(log, NULL, "work", "--queue", q, "--coproc", command, "--coprocs", "2", NULL);
    t_defer(stop_worker);
    /* The failing jobs back off about 2 s before their second attempt. */
    wait_drained(pg, queue, log, 30000);
    while (t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s'", queue) > 0) {
        usleep(100000);
        wait_drained(pg, queue, log, 30000);
    }
    stop_worker();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = '%s' AND state = 'completed'"
                        " AND (result->'echo'->>'n')::int = (payload->>'n')::int AND attempt = 1",
                    queue),
              200);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = '%s' AND state = 'failed'"
                        " AND attempt = 2 AND last_error = 'asked to fail'",
                    queue),
              3);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST_FULL(coproc_python_example_runs_jobs, 90, 0)
{
    run_example("coproc.py", "py");
}

TEST_FULL(coproc_node_example_runs_jobs, 90, 0)
{
    run_example("coproc.js", "js");
}

/* A handler that misbehaves on request: exits, writes garbage, writes a bad status, sleeps past the
 * timeout (and records the cancel it is sent), or reports whether it can see database credentials. */
static const char misbehave[] =
    "import json, os, sys, time\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'cancel' in m:\n"
    "        open(os.environ['CANCEL_LOG'], 'a').write(str(m['cancel']) + '\\n')\n"
    "        continue\n"
    "    p = m['payload']\n"
    "    first = m['attempt'] == 1\n"
    "    if p.get('exit') and first:\n"
    "        sys.exit(3)\n"
    "    if p.get('garbage') and first:\n"
    "        print('this is not json', flush=True)\n"
    "        continue\n"
    "    if p.get('bad_status') and first:\n"
    "        print(json.dumps({'id': m['id'], 'status': 'maybe'}), flush=True)\n"
    "        continue\n"
    "    if p.get('sleep') and first:\n"
    "        continue\n"
    "    if p.get('noisy'):\n"
    "        print('a line for the log', file=sys.stderr, flush=True)\n"
    "    env = {k: True for k in os.environ if 'PGJOBQ_DATABASE_URL' in k or k == 'PGPASSWORD'}\n"
    "    reply = {'id': m['id'], 'status': 'completed', 'result': {'env': env, 'attempt': m['attempt']}}\n"
    "    if p.get('retry'):\n"
    "        reply = {'id': m['id'], 'status': 'retry', 'error': 'later', 'delay_ms': 0} if first else reply\n"
    "    print(json.dumps(reply), flush=True)\n";

TEST_FULL(coproc_restarts_a_broken_handler_and_retries_its_jobs, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    const char *log = t_log_path("misbehave");
    char env[600], cancels[512], command[700];
    python_script("misbehave.py", misbehave, command, sizeof command);

    snprintf(cancels, sizeof cancels, "%s/cancels", t_tmpdir());
    snprintf(env, sizeof env, "CANCEL_LOG=%s", cancels);
    enqueue(c, "mb", "{\"exit\": true}", 3);
    enqueue(c, "mb", "{\"garbage\": true}", 3);
    enqueue(c, "mb", "{\"bad_status\": true}", 3);
    enqueue(c, "mb", "{\"sleep\": true}", 3);
    enqueue(c, "mb", "{\"retry\": true}", 3);
    enqueue(c, "mb", "{\"noisy\": true}", 3);
    worker = t_spawn(log, env, "work", "--queue", "mb:1", "--coproc", command, "--lease", "6s", "--timeout", "2s", NULL);
    t_defer(stop_worker);
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'mb'") < 6) {
        if (t_now_ms() - t0 > 60000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the jobs did not all finish");
        }
        usleep(100000);
    }
    stop_worker();

    /* Every job ended completed, on its second attempt where the first misbehaved. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'mb' AND state = 'completed'"), 6);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'mb' AND attempt = 2"
                        " AND payload ?| array['exit', 'garbage', 'bad_status', 'sleep', 'retry']"),
              5);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'mb' AND payload ? 'noisy' AND attempt = 1"),
              1);
    /* No database credentials reached it. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'mb' AND result->'env' = '{}'"), 6);
    /* The log says what happened, quoting the bad line; stderr went to the log. */
    char *text = read_log(log);
    CHECK_MSG(strstr(text, "'this is not json'") != NULL, "the garbage line is not quoted in the log");
    CHECK(strstr(text, "unknown status \"maybe\"") != NULL);
    CHECK(strstr(text, "exited with status 3") != NULL);
    CHECK(strstr(text, "a line for the log") != NULL);
    free(text);
    /* The timed-out job was cancelled on the coprocess. */
    FILE *f = fopen(cancels, "r");
    CHECK_MSG(f != NULL, "the coprocess was never told to cancel");
    fclose(f);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* A handler that reports progress: a first value, then (once the test has seen it in the database) a
 * value too large, a line for a job it does not hold, and the last value with the answer in the same
 * write. */
static const char progressing[] =
    "import json, os, sys, time\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'cancel' in m:\n"
    "        continue\n"
    "    print(json.dumps({'id': m['id'], 'progress': {'step': 1}}), flush=True)\n"
    "    t0 = time.monotonic()\n"
    "    while not os.path.exists(os.environ['SEEN']) and time.monotonic() - t0 < 30:\n"
    "        time.sleep(0.02)\n"
    "    print(json.dumps({'id': m['id'], 'progress': 'x' * 9000}), flush=True)\n"
    "    print(json.dumps({'id': 123456789, 'progress': {'step': 9}}), flush=True)\n"
    "    sys.stdout.write(json.dumps({'id': m['id'], 'progress': {'step': 2}}) + '\\n'\n"
    "                     + json.dumps({'id': m['id'], 'status': 'completed'}) + '\\n')\n"
    "    sys.stdout.flush()\n";

TEST_FULL(coproc_progress_lines_reach_the_job, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    const char *log = t_log_path("progressing");
    char env[600], seen[512], command[700];
    python_script("progressing.py", progressing, command, sizeof command);
    snprintf(seen, sizeof seen, "%s/seen", t_tmpdir());
    snprintf(env, sizeof env, "SEEN=%s", seen);

    enqueue(c, "pg", "{}", 1);
    worker = t_spawn(log, env, "work", "--queue", "pg:1", "--coproc", command, NULL);
    t_defer(stop_worker);
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'pg' AND state = 'running'"
                     " AND progress = '{\"step\": 1}'") < 1) {
        if (t_now_ms() - t0 > 30000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the first progress never reached the running job");
        }
        usleep(20000);
    }
    FILE *f = fopen(seen, "w");
    CHECK(f != NULL && fclose(f) == 0);
    wait_drained(pg, "pg", log, 30000);
    stop_worker();
    /* The last value came in the same write as the answer, and was written before it. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'pg' AND state = 'completed'"
                        " AND progress = '{\"step\": 2}'"),
              1);
    char *text = read_log(log);
    CHECK_MSG(strstr(text, "is not JSON of at most 8192 bytes: ignored") != NULL, "the oversized progress was not logged");
    free(text);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(coproc_options_are_checked)
{
    char *out = NULL, *err = NULL;
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--exec", "/bin/true", "--coproc", "/bin/cat", NULL), 64);
    CHECK(strstr(err, "not both") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--coprocs", "2", "--exec", "/bin/true", NULL), 64);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--coproc", "/bin/cat", "--coprocs", "0", NULL), 64);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", NULL), 64);
    CHECK(strstr(err, "--coproc") != NULL);
    free(out);
    free(err);
}

/* Issue 36's reproduction: a coprocess that answers one job of 400 with a result PostgreSQL refuses
 * (a number beyond numeric's range) and another with a retry delay past the table's range, and an
 * --exec handler that prints such a result for one job of 60.  Only those jobs pay: each of their
 * attempts fails, saying why, and every other job completes on its first attempt. */
static const char refusing[] =
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'cancel' in m:\n"
    "        continue\n"
    "    n = m['payload']['n']\n"
    "    if n == 100:\n"
    "        sys.stdout.write('{\"id\": %d, \"status\": \"completed\", \"result\": {\"n\": 1e1000000}}\\n' % m['id'])\n"
    "    elif n == 200:\n"
    "        sys.stdout.write(json.dumps({'id': m['id'], 'status': 'retry', 'error': 'much later',\n"
    "                                     'delay_ms': 9223372036854775807}) + '\\n')\n"
    "    else:\n"
    "        sys.stdout.write(json.dumps({'id': m['id'], 'status': 'completed', 'result': {'n': n}}) + '\\n')\n"
    "    sys.stdout.flush()\n";

TEST_FULL(coproc_and_exec_a_result_the_database_refuses_fails_that_job_alone, 120, 0)
{
    PGconn *pg = t_pg();
    const char *log = t_log_path("refusing"), *elog = t_log_path("refusing-exec");
    char command[700];
    python_script("refusing.py", refusing, command, sizeof command);
    const char *exec = t_script("refusing.sh", "payload=$(cat)\n"
                                               "case \"$payload\" in\n"
                                               "  *'\"n\": 7}'*) echo '{\"n\": 1e1000000}';;\n"
                                               "  *) echo \"$payload\";;\n"
                                               "esac");

    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('rfc'::text, ARRAY[400]), NULL,"
                       " (SELECT array_agg(jsonb_build_object('n', i)) FROM generate_series(1, 400) i),"
                       " max_attempts => array_fill(3, ARRAY[400]))"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('rfe'::text, ARRAY[60]), NULL,"
                       " (SELECT array_agg(jsonb_build_object('n', i)) FROM generate_series(1, 60) i),"
                       " max_attempts => array_fill(2, ARRAY[60]))"));
    worker = t_spawn(log, NULL, "work", "--queue", "rfc:32", "--coproc", command, "--coprocs", "2", NULL);
    t_defer(stop_worker);
    pid_t ew = t_spawn(elog, NULL, "work", "--queue", "rfe:16", "--exec", exec, NULL);
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue IN ('rfc', 'rfe')") < 460) {
        if (t_now_ms() - t0 > 90000) {
            t_show_log(log);
            t_show_log(elog);
            t_fail(__FILE__, __LINE__, "the jobs did not all finish");
        }
        usleep(100000);
    }
    stop_worker();
    kill(ew, SIGTERM);
    CHECK_INT(t_wait_exit(ew, 20000), 0);

    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rfc' AND state = 'completed'"
                        " AND attempt = 1 AND result = payload"),
              398);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rfe' AND state = 'completed'"
                        " AND attempt = 1 AND result = payload"),
              59);
    /* The refused result: three failed attempts, each saying why. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rfc' AND payload->>'n' = '100'"
                        " AND state = 'failed' AND attempt = 3"
                        " AND last_error = 'result not storable: value overflows numeric format'"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rfe' AND payload->>'n' = '7'"
                        " AND state = 'failed' AND attempt = 2"
                        " AND last_error = 'result not storable: value overflows numeric format'"),
              1);
    /* The refused delay: retried after the backoff instead, its last attempt failed with its error. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rfc' AND payload->>'n' = '200'"
                        " AND state = 'failed' AND attempt = 3 AND last_error = 'much later'"),
              1);
    char *text = read_log(log);
    CHECK_MSG(strstr(text, "attempt 3 of 3 failed for good: result not storable: value overflows numeric format"),
              "the log does not say why the job failed");
    free(text);
    PQfinish(pg);
}

/* A handler that answers each job with the variables it can see (a coprocess when it reads lines, an
 * exec handler when it is given one payload), and writes them to its stderr too, for the log. */
static const char env_report[] =
    "import json, os, sys\n"
    "names = ['PGPASSWORD', 'DATABASE_URL', 'PGJOBQ_DATABASE_URL', 'APP_SETTING', 'PGAPPNAME',\n"
    "         'PGJOBQ_COPROC_PROTOCOL', 'PGJOBQ_JOB_ID']\n"
    "seen = {k: os.environ[k] for k in names if k in os.environ}\n"
    "print('handler env: ' + ' '.join(str(v) for v in seen.values()), file=sys.stderr, flush=True)\n"
    "if os.environ.get('PGJOBQ_JOB_ID'):\n"
    "    seen['PGJOBQ_JOB_ID'] = 'set'\n"
    "    print(json.dumps(seen))\n"
    "    sys.exit(0)\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'id' in m:\n"
    "        print(json.dumps({'id': m['id'], 'status': 'completed', 'result': seen}), flush=True)\n";

/* Runs one job of queue q through a worker started with the handler option `how` (--coproc or --exec)
 * and the extra option `opt` (may be NULL), and returns the variables its handler saw (the job's result
 * as text; free it).  The log goes to the test's directory, named after the queue. */
static char *env_seen(pgjobq_client *c, PGconn *pg, const char *q, const char *how, const char *command,
                      const char *opt, const char *opt_arg)
{
    char qarg[64];
    const char *log = t_log_path(q);
    enqueue(c, q, "{}", 1);
    snprintf(qarg, sizeof qarg, "%s:1", q);
    if (opt_arg)
        worker = t_spawn(log, NULL, "work", "--queue", qarg, how, command, opt, opt_arg, NULL);
    else if (opt)
        worker = t_spawn(log, NULL, "work", "--queue", qarg, how, command, opt, NULL);
    else
        worker = t_spawn(log, NULL, "work", "--queue", qarg, how, command, NULL);
    wait_drained(pg, q, log, 30000);
    stop_worker();
    return t_str(pg, "SELECT coalesce(result::text, '') FROM pgjobq.history WHERE queue = '%s'", q);
}

TEST_FULL(coproc_and_exec_handlers_get_the_environment_they_are_told, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char command[700], *seen, *text;
    python_script("env_report.py", env_report, command, sizeof command);
    t_defer(stop_worker);
    setenv("PGPASSWORD", "pw-of-the-worker", 1);
    setenv("DATABASE_URL", "postgresql://app:url-secret@db.example/app", 1);
    setenv("APP_SETTING", "on", 1);
    setenv("PGAPPNAME", "the-app", 1);

    /* By default: nothing that reaches the database; a coprocess is told the protocol's version. */
    seen = env_seen(c, pg, "envdef", "--coproc", command, NULL, NULL);
    CHECK_MSG(strcmp(seen, "{\"APP_SETTING\": \"on\", \"PGJOBQ_COPROC_PROTOCOL\": \"3\"}") == 0, "saw %s", seen);
    free(seen);
    /* --pass-env names what passes (a list, and repeatable). */
    seen = env_seen(c, pg, "envpass", "--coproc", command, "--pass-env", "DATABASE_URL,PGAPPNAME");
    CHECK_MSG(strstr(seen, "\"DATABASE_URL\": \"postgresql://app:url-secret@db.example/app\"") &&
                  strstr(seen, "\"PGAPPNAME\": \"the-app\"") && !strstr(seen, "PGPASSWORD") &&
                  !strstr(seen, "PGJOBQ_DATABASE_URL"),
              "saw %s", seen);
    free(seen);
    /* --keep-env: all of it. */
    seen = env_seen(c, pg, "envkeep", "--coproc", command, "--keep-env", NULL);
    CHECK_MSG(strstr(seen, "\"PGPASSWORD\": \"pw-of-the-worker\"") && strstr(seen, "\"DATABASE_URL\"") &&
                  strstr(seen, "\"PGJOBQ_DATABASE_URL\"") && strstr(seen, "\"PGJOBQ_COPROC_PROTOCOL\": \"3\""),
              "saw %s", seen);
    free(seen);
    /* The same for --exec, whose job variables are pgjobq's own. */
    seen = env_seen(c, pg, "envexec", "--exec", command, NULL, NULL);
    CHECK_MSG(strcmp(seen, "{\"APP_SETTING\": \"on\", \"PGJOBQ_JOB_ID\": \"set\"}") == 0, "saw %s", seen);
    free(seen);
    seen = env_seen(c, pg, "envexecpass", "--exec", command, "--pass-env", "PGPASSWORD");
    CHECK_MSG(strstr(seen, "\"PGPASSWORD\": \"pw-of-the-worker\"") && !strstr(seen, "DATABASE_URL"), "saw %s", seen);
    free(seen);
    /* Whatever a handler prints, the worker's log shows no password. */
    text = read_log(t_log_path("envkeep"));
    CHECK_MSG(strstr(text, "handler env:") != NULL, "the handler's stderr is not in the log");
    CHECK_MSG(strstr(text, "pw-of-the-worker") == NULL && strstr(text, "url-secret") == NULL,
              "a password reached the log:\n%s", text);
    free(text);
    /* A name that cannot be a variable's is refused. */
    char *out = NULL, *err = NULL;
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--coproc", "/bin/cat", "--pass-env", "DATABASE_URL,A=B", NULL), 64);
    CHECK_MSG(strstr(err, "'A=B' is not a variable name") != NULL, "%s", err);
    free(out);
    free(err);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* A handler that cannot start, as a tasks module that fails to import: after a second (jobs have been
 * handed to it by then) it writes a traceback and exits 78, until the file $FIXED exists; then it says
 * it is ready and completes every job with its attempt. */
static const char cannot_start[] =
    "import json, os, sys, time\n"
    "if not os.path.exists(os.environ['FIXED']):\n"
    "    time.sleep(1)\n"
    "    sys.stderr.write('Traceback (most recent call last):\\n  File \"tasks.py\", line 1, in <module>\\n'\n"
    "                     '    import stripe\\nModuleNotFoundError: No module named \\'stripe\\'\\n')\n"
    "    sys.exit(78)\n"
    "print(json.dumps({'ready': True}), flush=True)\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'id' in m:\n"
    "        print(json.dumps({'id': m['id'], 'status': 'completed', 'result': {'attempt': m['attempt']}}), "
    "flush=True)\n";

/* How many times the log says text. */
static int log_count(const char *log, const char *text)
{
    char *all = read_log(log);
    int n = 0;
    for (const char *p = all; (p = strstr(p, text)) != NULL; p += strlen(text))
        n++;
    free(all);
    return n;
}

TEST_FULL(coproc_that_cannot_start_hands_its_jobs_back_and_the_worker_is_unhealthy, 150, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    const char *log = t_log_path("cannotstart");
    char env[600], fixed[512], command[700], *out = NULL, *err = NULL;
    python_script("cannot_start.py", cannot_start, command, sizeof command);
    snprintf(fixed, sizeof fixed, "%s/fixed", t_tmpdir());
    snprintf(env, sizeof env, "FIXED=%s", fixed);
    for (int i = 0; i < 3; i++)
        enqueue(c, "cs", "{}", 3);
    worker = t_spawn(log, env, "work", "--queue", "cs:4", "--coproc", command, "--worker-id", "broken-release", NULL);
    t_defer(stop_worker);

    /* Every job was in a copy that died before answering: handed back, no attempt used, with its
     * traceback as the reason; copies keep being tried (with backoff); the worker says it is unhealthy. */
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'cs' AND state = 'queued' AND attempt = 0"
                     " AND last_error LIKE 'not run: the coprocess could not start: it exited with status 78%%'"
                     " AND last_error LIKE '%%ModuleNotFoundError: No module named ''stripe''%%'") < 3 ||
           log_count(log, "it cannot start") < 3 ||
           t_int(pg, "SELECT count(*) FROM pgjobq.monitor_unhealthy_workers() WHERE id = 'broken-release'"
                     " AND reason LIKE '%%ModuleNotFoundError: No module named ''stripe''%%'") < 1) {
        if (t_now_ms() - t0 > 60000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the jobs were not handed back, or the worker not marked unhealthy");
        }
        usleep(100000);
    }
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'cs' AND (attempt > 0 OR state <> 'queued')"), 0);
    /* pgjobq health and its JSON say so. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "health", NULL), 0);
    CHECK_MSG(strstr(out, "workers        1 unhealthy") && strstr(out, "broken-release (pid ") &&
                  strstr(out, "    ModuleNotFoundError: No module named 'stripe'"),
              "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "health", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"unhealthy_workers\":[{\"id\":\"broken-release\"") &&
                  strstr(out, "ModuleNotFoundError: No module named 'stripe'\\n\"}]}"),
              "%s", out);
    free(out);
    free(err);

    /* SIGTERM: the worker stops (status 0) and starts no copy again. */
    int starts = log_count(log, "started (pid");
    kill(worker, SIGTERM);
    CHECK_INT(t_wait_exit(worker, 20000), 0);
    worker = 0;
    CHECK_INT(log_count(log, "started (pid"), starts);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'cs' AND state = 'queued' AND attempt = 0"), 3);

    /* The release fixed: a worker runs the jobs, each at its first attempt, and is healthy. */
    FILE *f = fopen(fixed, "w");
    CHECK(f != NULL && fclose(f) == 0);
    worker = t_spawn(log, env, "work", "--queue", "cs:4", "--coproc", command, "--worker-id", "fixed-release", NULL);
    wait_drained(pg, "cs", log, 30000);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'cs' AND state = 'completed' AND attempt = 1"
                        " AND result = '{\"attempt\": 1}'"),
              3);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "health", NULL), 0);
    CHECK_MSG(strstr(out, "workers        none unhealthy") != NULL, "%s", out);
    free(out);
    free(err);
    stop_worker();
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* A handler that hands jobs back: "later" for a minute with a reason; "once" without a delay the first
 * time it sees it (the backoff), then completes it; "far" with a delay over 100 years (refused). */
static const char snoozer[] =
    "import json, os, sys\n"
    "seen = set()\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'id' not in m:\n"
    "        continue\n"
    "    p = m['payload']\n"
    "    if p.get('later'):\n"
    "        r = {'id': m['id'], 'status': 'snooze', 'reason': 'not on this release', 'delay_ms': 60000}\n"
    "    elif p.get('far'):\n"
    "        r = {'id': m['id'], 'status': 'snooze', 'delay_ms': 4000000 * 86400000}\n"
    "    elif m['id'] not in seen:\n"
    "        seen.add(m['id'])\n"
    "        r = {'id': m['id'], 'status': 'snooze'}\n"
    "    else:\n"
    "        r = {'id': m['id'], 'status': 'completed', 'result': {'attempt': m['attempt']}}\n"
    "    print(json.dumps(r), flush=True)\n";

TEST_FULL(coproc_snooze_hands_a_job_back_without_using_an_attempt, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    const char *log = t_log_path("snoozer");
    char command[700];
    python_script("snoozer.py", snoozer, command, sizeof command);
    enqueue(c, "sn", "{\"later\": true}", 1);
    enqueue(c, "sn", "{\"once\": true}", 1);
    worker = t_spawn(log, NULL, "work", "--queue", "sn:2", "--coproc", command, NULL);
    t_defer(stop_worker);
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'sn' AND state = 'completed'") < 1 ||
           t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'sn' AND state = 'queued'") < 1) {
        if (t_now_ms() - t0 > 30000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the jobs were not snoozed as asked");
        }
        usleep(50000);
    }
    /* Due in a minute, its attempt given back, its reason kept; the other ran again and completed at
     * its first attempt (a max_attempts of 1 left no room for a counted one). */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'sn' AND attempt = 0"
                        " AND run_at BETWEEN now() + interval '50 seconds' AND now() + interval '61 seconds'"
                        " AND last_error = 'not on this release'"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'sn' AND attempt = 1"
                        " AND result = '{\"attempt\": 1}'"),
              1);
    /* A delay over 100 years breaks the protocol. */
    enqueue(c, "sn", "{\"far\": true}", 1);
    t0 = t_now_ms();
    while (log_count(log, "a snooze's \"delay_ms\" must be an integer from 0 to 100 years") < 1) {
        if (t_now_ms() - t0 > 30000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "a delay over 100 years was not refused");
        }
        usleep(50000);
    }
    stop_worker();
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* A handler that hands "back" jobs back (a kind it does not know: "hand_back": true) until it has seen
 * each three times, then completes them; snoozes "snooze" jobs (counted); "bad" has a marker that is
 * no boolean. */
static const char hander[] =
    "import json, sys\n"
    "seen = {}\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'id' not in m:\n"
    "        continue\n"
    "    p = m['payload']\n"
    "    seen[m['id']] = seen.get(m['id'], 0) + 1\n"
    "    if p.get('bad'):\n"
    "        r = {'id': m['id'], 'status': 'snooze', 'hand_back': 'yes'}\n"
    "    elif p.get('snooze'):\n"
    "        r = {'id': m['id'], 'status': 'snooze', 'reason': 'not yet', 'delay_ms': 100, 'hand_back': False}\n"
    "    elif seen[m['id']] <= 3:\n"
    "        r = {'id': m['id'], 'status': 'snooze', 'reason': 'unknown kind', 'delay_ms': 100, 'hand_back': True}\n"
    "    else:\n"
    "        r = {'id': m['id'], 'status': 'completed', 'result': {'seen': seen[m['id']]}}\n"
    "    print(json.dumps(r), flush=True)\n";

/* A hand-back ("hand_back": true on a snooze: the coprocess did not run the job) uses no attempt and
 * counts no snooze, so that pgjobq.snooze_cap() never fails a job a rolling deploy keeps handing back;
 * a snooze still counts, and at the cap is a failed attempt. */
TEST_FULL(coproc_a_hand_back_counts_no_snooze, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    const char *log = t_log_path("hander");
    char command[700];
    python_script("hander.py", hander, command, sizeof command);
    enqueue(c, "hb", "{\"back\": true}", 1);
    enqueue(c, "hb", "{\"snooze\": true}", 1);
    /* At the cap already: one more counted snooze is a failed attempt, the only one they have. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET snoozes = pgjobq.snooze_cap() WHERE queue = 'hb'"));
    worker = t_spawn(log, NULL, "work", "--queue", "hb:2", "--coproc", command, NULL);
    t_defer(stop_worker);
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'hb'") < 2) {
        if (t_now_ms() - t0 > 30000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the jobs did not finish");
        }
        usleep(50000);
    }
    /* Handed back three times past the cap, then run at its first attempt, its snoozes untouched. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'hb' AND state = 'completed'"
                        " AND attempt = 1 AND result = '{\"seen\": 4}' AND snoozes = pgjobq.snooze_cap()"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'hb' AND state = 'failed'"
                        " AND attempt = 1 AND payload = '{\"snooze\": true}'"
                        " AND last_error LIKE 'snoozed 1000 times, the cap (pgjobq.snooze_cap()): %%; not yet'"),
              1);
    /* A marker that is no boolean breaks the protocol. */
    enqueue(c, "hb", "{\"bad\": true}", 1);
    t0 = t_now_ms();
    while (log_count(log, "a snooze's \"hand_back\" must be true or false") < 1) {
        if (t_now_ms() - t0 > 30000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "a hand_back that is no boolean was not refused");
        }
        usleep(50000);
    }
    stop_worker();
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* A handler that writes to its stderr at every level, a line per job id, a JSON log line, then a flood. */
static const char chatty[] = "import json, sys\n"
                             "for line in sys.stdin:\n"
                             "    m = json.loads(line)\n"
                             "    if 'id' not in m:\n"
                             "        continue\n"
                             "    e = sys.stderr\n"
                             "    e.write('ERROR: the card was declined\\n')\n"
                             "    e.write('WARNING:root:retrying the provider\\n')\n"
                             "    e.write('[debug] a detail nobody wants at info\\n')\n"
                             "    e.write('job %d: INFO: charged\\n' % m['id'])\n"
                             "    e.write('job %d: a line without a level\\n' % m['id'])\n"
                             "    e.write(json.dumps({'level': 'warn', 'msg': 'structured'}) + '\\n')\n"
                             "    e.write('Informational, but not a level\\n')\n"
                             "    e.flush()\n"
                             "    if m['payload'].get('flood'):\n"
                             "        e.write('flood line\\n' * 50000)\n"
                             "        e.flush()\n"
                             "    print(json.dumps({'id': m['id'], 'status': 'completed'}), flush=True)\n";

TEST_FULL(coproc_stderr_is_logged_at_its_level_and_a_flood_is_cut, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    const char *log = t_log_path("chatty");
    char command[700], want[200];
    python_script("chatty.py", chatty, command, sizeof command);
    enqueue(c, "ch", "{\"flood\": true}", 1);
    worker = t_spawn(log, NULL, "work", "--queue", "ch:1", "--coproc", command, NULL);
    t_defer(stop_worker);
    wait_drained(pg, "ch", log, 30000);
    int64_t id = t_int(pg, "SELECT id FROM pgjobq.history WHERE queue = 'ch'");
    int64_t t0 = t_now_ms();
    while (log_count(log, "flood line") < 990) {
        if (t_now_ms() - t0 > 30000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the flood did not reach the log");
        }
        usleep(50000);
    }
    stop_worker();
    char *text = read_log(log);
    CHECK_MSG(strstr(text, "error coprocess 0: the card was declined\n") != NULL, "%s", text);
    CHECK(strstr(text, "warn  coprocess 0: root:retrying the provider\n") != NULL);
    CHECK(strstr(text, "a detail nobody wants") == NULL); /* debug, under --log-level info */
    snprintf(want, sizeof want, "info  coprocess 0: job %lld: charged\n", (long long)id);
    CHECK_MSG(strstr(text, want) != NULL, "no '%s'", want);
    snprintf(want, sizeof want, "info  coprocess 0: job %lld: a line without a level\n", (long long)id);
    CHECK_MSG(strstr(text, want) != NULL, "no '%s'", want);
    CHECK(strstr(text, "warn  coprocess 0: {\"level\": \"warn\", \"msg\": \"structured\"}\n") != NULL);
    CHECK(strstr(text, "info  coprocess 0: Informational, but not a level\n") != NULL);
    free(text);
    /* 50,000 lines in a moment: at most 1,000 logged a window, and the rest counted (said when the next
     * window begins, or, here, when the coprocess ends). */
    int logged = log_count(log, "flood line");
    CHECK_MSG(logged <= 1000, "%d flood lines logged", logged);
    CHECK_MSG(log_count(log, "more lines of its standard error in 10 s were not logged (at most 1000 are)") >= 1,
              "the dropped lines were not counted");
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* A handler that answers with a long error (2 MiB), a result over the 1 MiB a result may be, and a
 * line over the 4 MiB a line may be. */
static const char wordy[] =
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'id' not in m:\n"
    "        continue\n"
    "    p = m['payload']\n"
    "    if p.get('error') and m['attempt'] == 1:\n"
    "        r = {'id': m['id'], 'status': 'retry', 'error': 'E' * (2 << 20), 'delay_ms': 0}\n"
    "    elif p.get('result'):\n"
    "        r = {'id': m['id'], 'status': 'completed', 'result': {'big': 'R' * (1536 << 10)}}\n"
    "    elif p.get('line') and m['attempt'] == 1:\n"
    "        r = {'id': m['id'], 'status': 'completed', 'result': {'huge': 'L' * (5 << 20)}}\n"
    "    else:\n"
    "        r = {'id': m['id'], 'status': 'completed'}\n"
    "    print(json.dumps(r), flush=True)\n";

TEST_FULL(coproc_lines_up_to_4_mib_are_replies_and_results_up_to_1_mib_are_stored, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    const char *log = t_log_path("wordy");
    char command[700];
    python_script("wordy.py", wordy, command, sizeof command);
    enqueue(c, "wd", "{\"error\": true}", 2);
    enqueue(c, "wd", "{\"result\": true}", 1);
    worker = t_spawn(log, NULL, "work", "--queue", "wd:1", "--coproc", command, NULL);
    t_defer(stop_worker);
    wait_drained(pg, "wd", log, 30000);
    /* A reply of 2 MiB is a reply: the error cut to 8 KiB, the job retried, the coprocess kept. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'wd' AND payload ? 'error'"
                        " AND state = 'completed' AND attempt = 2 AND length(last_error) BETWEEN 8000 AND 8192"),
              1);
    /* A result over 1 MiB fails its attempt, saying so. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'wd' AND payload ? 'result'"
                        " AND state = 'failed' AND last_error ~ '^the coprocess''s result is 157[0-9]+ bytes of JSON: "
                        "at most 1048576 are stored$'"),
              1);
    CHECK_INT(log_count(log, "started (pid"), 1);
    /* A line over 4 MiB breaks the protocol. */
    enqueue(c, "wd", "{\"line\": true}", 2);
    wait_drained(pg, "wd", log, 30000);
    CHECK_INT(log_count(log, "wrote a line longer than 4194304 bytes; restarting it"), 1);
    stop_worker();
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* A coprocess of protocol 3 (docs/coproc.md, "Steps"): asks for its step, runs it when it is not
 * stored (writing a line to a ledger), stores it; kind flow asks for a retry at its first attempt,
 * kind nap sleeps 300 ms (parked: its attempt ends there), kind waiter waits for the event "go"
 * with its n as the key.  Job lines that come while it waits for an answer are kept for later. */
static const char steps_coproc[] =
    "import json, os, sys\n"
    "ledger = sys.argv[1]\n"
    "if os.environ.get('PGJOBQ_COPROC_PROTOCOL') != '3':\n"
    "    sys.exit('protocol ' + str(os.environ.get('PGJOBQ_COPROC_PROTOCOL')))\n"
    "backlog = []\n"
    "def send(m):\n"
    "    sys.stdout.write(json.dumps(m) + '\\n'); sys.stdout.flush()\n"
    "def answer(i):\n"
    "    while True:\n"
    "        line = sys.stdin.readline()\n"
    "        if not line: sys.exit(0)\n"
    "        m = json.loads(line)\n"
    "        if m.get('parked') == i or m.get('cancel') == i: return m\n"
    "        if m.get('id') == i and ('step' in m or 'sleep' in m or 'wait' in m): return m\n"
    "        backlog.append(m)\n"
    "def run(job):\n"
    "    i, n = job['id'], job['payload']['n']\n"
    "    send({'id': i, 'step': 'a'})\n"
    "    a = answer(i)\n"
    "    if not a['stored']:\n"
    "        with open(ledger, 'a') as f: f.write('%d a\\n' % i)\n"
    "        send({'id': i, 'step': 'a', 'result': {'n': n}})\n"
    "        a = answer(i)\n"
    "        assert a['stored'], a\n"
    "    extra = None\n"
    "    if job['kind'] == 'nap':\n"
    "        send({'id': i, 'sleep': 'nap', 'delay_ms': 300})\n"
    "        s = answer(i)\n"
    "        if 'parked' in s: return\n"
    "        assert s['over'], s\n"
    "    if job['kind'] == 'waiter':\n"
    "        send({'id': i, 'wait': 'w', 'event': 'go', 'key': str(n), 'timeout_ms': 60000})\n"
    "        w = answer(i)\n"
    "        if 'parked' in w: return\n"
    "        extra = w.get('event')\n"
    "    if job['kind'] == 'flow' and job['attempt'] == 1:\n"
    "        send({'id': i, 'status': 'retry', 'error': 'once more', 'delay_ms': 0}); return\n"
    "    send({'id': i, 'status': 'completed', 'result': {'a': a['result'], 'attempt': job['attempt'], 'event': "
    "extra}})\n"
    "while True:\n"
    "    if backlog: m = backlog.pop(0)\n"
    "    else:\n"
    "        line = sys.stdin.readline()\n"
    "        if not line: break\n"
    "        m = json.loads(line)\n"
    "    if 'payload' in m: run(m)\n";

static void enqueue_kind(PGconn *pg, const char *kind, int n)
{
    PQclear(t_exec(pg,
                   "SELECT pgjobq.enqueue_many(array_fill('st'::text, ARRAY[%d]), array_fill('%s'::text, ARRAY[%d]),"
                   " (SELECT array_agg(jsonb_build_object('n', i)) FROM generate_series(1, %d) i))",
                   n, kind, n, n));
}

TEST_FULL(coproc_steps_run_once_over_attempts_and_sleeps_and_waits_park_the_job, 120, 0)
{
    PGconn *pg = t_pg();
    char command[1200], script_cmd[700];
    const char *log = t_log_path("st");

    python_script("steps_coproc.py", steps_coproc, script_cmd, sizeof script_cmd);
    snprintf(command, sizeof command, "%s %s/ledger", script_cmd, t_tmpdir());
    enqueue_kind(pg, "flow", 30);
    enqueue_kind(pg, "nap", 10);
    enqueue_kind(pg, "waiter", 5);
    worker = t_spawn(log, NULL, "work", "--queue", "st:4", "--coproc", command, "--poll", "100ms", NULL);
    t_defer(stop_worker);
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'st'") < 40 ||
           t_int(pg, "SELECT coalesce(sum(waiting), 0) FROM pgjobq.monitor_parked() WHERE queue = 'st'") < 5) {
        if (t_now_ms() - t0 > 60000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "not all 40 jobs finished and 5 waiting");
        }
        usleep(50000);
    }
    /* waiter: parked until its event, which resumes it with the payload. */
    CHECK_INT(t_int(pg, "SELECT sum(resumed) FROM generate_series(1, 5) n,"
                        " LATERAL pgjobq.send_event('go', n::text, jsonb_build_object('v', n))"),
              5);
    while (t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'st'") < 45) {
        if (t_now_ms() - t0 > 60000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the 5 waiting jobs did not finish");
        }
        usleep(50000);
    }
    stop_worker();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'st' AND kind = 'waiter'"
                        " AND state = 'completed' AND attempt = 1 AND result->'event' = jsonb_build_object('v', payload->'n')"),
              5);
    /* flow: two attempts, step a run once (the second attempt got it from storage). */
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.history WHERE queue = 'st' AND kind = 'flow' AND state = 'completed'"
                    " AND attempt = 2 AND result = jsonb_build_object('a', jsonb_build_object('n', payload->'n'),"
                    " 'attempt', 2, 'event', NULL)"),
              30);
    /* nap: parked once (no attempt used), resumed after its sleep, step a not run again. */
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.history h WHERE queue = 'st' AND kind = 'nap' AND state = 'completed'"
                    " AND attempt = 1 AND result->'a' = jsonb_build_object('n', payload->'n')"
                    " AND EXISTS (SELECT FROM pgjobq.job_steps s WHERE s.job_id = h.id AND s.name = 'nap'"
                    "              AND (s.result->>'sleep_until')::timestamptz <= h.finished_at)"),
              10);
    char path[600];
    snprintf(path, sizeof path, "%s/ledger", t_tmpdir());
    char *text = read_log(path);
    int lines = 0;
    for (char *p = text; *p; p++)
        lines += *p == '\n';
    free(text);
    CHECK_INT(lines, 45);
    PQfinish(pg);
}
