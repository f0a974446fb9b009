/*
 * test_rules.c - one rule, one judge: the enqueue rules are the database's (sql/functions/enqueue.sql,
 * "The enqueue rules"), and every way in gives the same answer.  The same edge cases go through SQL
 * enqueue, enqueue_many and enqueue_graph, the C library (one job, a batch through enqueue_many, a
 * batch through COPY), the command (one job, --file) and the Python package (enqueue, enqueue_many,
 * enqueue_graph): each accepts the case, or refuses it naming the same rule, and writes nothing then.
 * The few bounds the C library still checks itself (names, priority, max_attempts: it needs them for
 * COPY) are cases too, so that they cannot drift from the database's.  And a job enqueued without
 * fields gets the database's defaults (pgjobq.job_defaults) on every path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

#define EX_USAGE   64
#define EX_DATAERR 65

#define COPY_JOBS 600 /* more than the library's COPY_MIN_JOBS (src/enqueue.c) */

/* One edge case, the fields a job is given (NULL, 0: not given) and the answer every path must give. */
typedef struct rule_case {
    const char *name;
    const char *queue;
    const char *run_at;    /* text; "+101 years": now() plus that, read from the database */
    const char *delay;     /* an interval ("101 years") ... */
    int64_t delay_ms;      /* ... the same for the C library, */
    const char *cli_delay; /* the command (whose duration parser refuses what is out of its range) */
    int priority, max_attempts;
    int unique_after, unique_tags; /* a unique key, and parents or tags */
    const char *refused;           /* NULL: accepted; else words every refusal holds */
    int cli_status;                /* the command's exit status when refused */
} rule_case;

static const rule_case cases[] = {
    {"run_at in 1901", NULL, "1901-06-01 00:00:00+00", NULL, 0, NULL, 0, 0, 0, 0, "within 100 years of now",
     EX_DATAERR},
    {"run_at in 1965", NULL, "1965-06-01 00:00:00+00", NULL, 0, NULL, 0, 0, 0, 0, NULL, 0},
    {"run_at 101 years ahead", NULL, "+101 years", NULL, 0, NULL, 0, 0, 0, 0, "within 100 years of now", EX_DATAERR},
    {"run_at 99 years ahead", NULL, "+99 years", NULL, 0, NULL, 0, 0, 0, 0, NULL, 0},
    {"run_at infinity", NULL, "infinity", NULL, 0, NULL, 0, 0, 0, 0, "within 100 years of now", EX_DATAERR},
    {"delay of 101 years", NULL, NULL, "101 years", INT64_C(3187252800000), "36890d", 0, 0, 0, 0, "100 years",
     EX_USAGE},
    {"negative delay", NULL, NULL, "-5 seconds", -5000, "-5s", 0, 0, 0, 0, "negative", EX_USAGE},
    {"delay of a day", NULL, NULL, "1 day", 86400000, "1d", 0, 0, 0, 0, NULL, 0},
    {"run_at and delay", NULL, "2030-01-01 00:00:00+00", "5 seconds", 5000, "5s", 0, 0, 0, 0, "not both", EX_DATAERR},
    {"unique key with after", NULL, NULL, NULL, 0, NULL, 0, 0, 1, 0, "cannot have a unique key", EX_DATAERR},
    {"unique key with tags", NULL, NULL, NULL, 0, NULL, 0, 0, 0, 1, "cannot have a unique key", EX_DATAERR},
    /* What the C library checks itself, against the database's answer. */
    {"priority 100", NULL, NULL, NULL, 0, NULL, 100, 0, 0, 0, NULL, 0},
    {"priority 101", NULL, NULL, NULL, 0, NULL, 101, 0, 0, 0, "priority", EX_USAGE},
    {"priority -101", NULL, NULL, NULL, 0, NULL, -101, 0, 0, 0, "priority", EX_USAGE},
    {"max_attempts 1000", NULL, NULL, NULL, 0, NULL, 0, 1000, 0, 0, NULL, 0},
    {"max_attempts 1001", NULL, NULL, NULL, 0, NULL, 0, 1001, 0, 0, "1000", EX_USAGE},
    {"queue of 64 characters", "q234567890123456789012345678901234567890123456789012345678901234", NULL, NULL, 0, NULL,
     0, 0, 0, 0, NULL, 0},
    {"queue of 65 characters", "q2345678901234567890123456789012345678901234567890123456789012345", NULL, NULL, 0, NULL,
     0, 0, 0, 0, "queue", EX_DATAERR},
    {"queue 9x", "9x", NULL, NULL, 0, NULL, 0, 0, 0, 0, "queue", EX_DATAERR},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* The fields of a case as the paths give them. */
typedef struct fields {
    const char *queue; /* always set: the case's, else "rules" */
    char run_at[64];   /* "" when none */
    char after[32];    /* "" when none; else the parent's id */
    int tags, unique;
} fields;

static int64_t parent_id;

static void case_fields(PGconn *pg, const rule_case *k, fields *f)
{
    memset(f, 0, sizeof *f);
    f->queue = k->queue ? k->queue : "rules";
    if (k->run_at && k->run_at[0] == '+') {
        char *t = t_str(pg, "SELECT to_char((now() + interval '%s') AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS+00')",
                        k->run_at + 1);
        snprintf(f->run_at, sizeof f->run_at, "%s", t);
        free(t);
    } else if (k->run_at)
        snprintf(f->run_at, sizeof f->run_at, "%s", k->run_at);
    if (k->unique_after)
        snprintf(f->after, sizeof f->after, "%lld", (long long)parent_id);
    f->tags = k->unique_tags;
    f->unique = k->unique_after || k->unique_tags;
}

static long long jobs_now(PGconn *pg)
{
    return t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs");
}

/* Checks one path's answer against the case: accepted (n jobs more), or refused holding the case's
 * words (and nothing written). */
static void check_answer(PGconn *pg, const rule_case *k, const char *path, int accepted, const char *msg,
                         long long before, long long n)
{
    long long after = jobs_now(pg);
    if (k->refused == NULL) {
        CHECK_MSG(accepted, "%s, %s: refused (%s), but the case is to be accepted", k->name, path, msg);
        CHECK_MSG(after == before + n, "%s, %s: %lld jobs written, expected %lld", k->name, path, after - before, n);
        return;
    }
    CHECK_MSG(!accepted, "%s, %s: accepted, but the case is refused (\"%s\")", k->name, path, k->refused);
    CHECK_MSG(strstr(msg, k->refused) != NULL, "%s, %s: the refusal \"%s\" does not say \"%s\"", k->name, path, msg,
              k->refused);
    CHECK_MSG(after == before, "%s, %s: refused, but %lld jobs were written", k->name, path, after - before);
}

/* ------------------------------------------------------------------------------------------------ */
/* The paths                                                                                         */

/* Runs SQL with text parameters (NULL: SQL NULL); 1 when it succeeded, else 0 with the message. */
static int sql_run(PGconn *pg, const char *sql, int n, const char *const *values, char *msg, size_t size)
{
    PGresult *r = PQexecParams(pg, sql, n, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK;
    const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    snprintf(msg, size, "%s", ok ? "" : m ? m : PQerrorMessage(pg));
    PQclear(r);
    return ok;
}

static void sql_params(const rule_case *k, const fields *f, const char *v[8], char prio[16], char att[16])
{
    snprintf(prio, 16, "%d", k->priority);
    snprintf(att, 16, "%d", k->max_attempts);
    v[0] = f->queue;
    v[1] = f->run_at[0] ? f->run_at : NULL;
    v[2] = k->delay;
    v[3] = f->unique ? "rule-key" : NULL;
    v[4] = f->after[0] ? f->after : NULL;
    v[5] = f->tags ? "t" : NULL;
    v[6] = k->priority ? prio : NULL;
    v[7] = k->max_attempts ? att : NULL;
}

/* A path of the SQL API: the statement, with the case's fields as $1 .. $8 (sql_params), writes
 * `jobs` jobs when the case is accepted, and names the job with `named` when it is refused. */
static void path_sql(PGconn *pg, const rule_case *k, const fields *f, const char *path, const char *sql, long long jobs,
                     const char *named)
{
    const char *v[8];
    char prio[16], att[16], msg[1024];
    long long before = jobs_now(pg);

    sql_params(k, f, v, prio, att);
    int ok = sql_run(pg, sql, 8, v, msg, sizeof msg);
    check_answer(pg, k, path, ok, msg, before, jobs);
    if (k->refused && named)
        CHECK_MSG(strstr(msg, named) != NULL, "%s, %s: \"%s\" does not name %s", k->name, path, msg, named);
}

/* enqueue; enqueue_many with the case as the second job of two, unless the case has parents or
 * tags, which enqueue_many does not take; enqueue_graph with the case as the second job. */
static void paths_sql(PGconn *pg, const rule_case *k, const fields *f)
{
    path_sql(pg, k, f, "SQL enqueue",
             "SELECT * FROM pgjobq.enqueue(queue => $1, run_at => $2::timestamptz, delay => $3::interval,"
             " unique_key => $4, after => CASE WHEN $5::bigint IS NOT NULL THEN ARRAY[$5::bigint] END,"
             " tags => CASE WHEN $6::text IS NOT NULL THEN ARRAY[$6::text] END,"
             " priority => coalesce($7::smallint, 0::smallint), max_attempts => coalesce($8::integer, 25))",
             1, NULL);
    if (!f->tags && !f->after[0])
        path_sql(pg, k, f, "SQL enqueue_many",
                 "SELECT * FROM pgjobq.enqueue_many(ARRAY['rules', $1], NULL, NULL,"
                 " priorities => ARRAY[NULL, $7]::smallint[], run_ats => ARRAY[NULL, $2]::timestamptz[],"
                 " delays => ARRAY[NULL, $3]::interval[], max_attempts => ARRAY[NULL, $8]::integer[],"
                 " unique_keys => ARRAY[NULL, $4]) WHERE $5::text IS NULL AND $6::text IS NULL",
                 2, "[2]");
    path_sql(pg, k, f, "SQL enqueue_graph",
             "SELECT * FROM pgjobq.enqueue_graph(jsonb_build_array('{\"queue\": \"rules\"}'::jsonb,"
             " jsonb_strip_nulls(jsonb_build_object('queue', $1::text, 'run_at', $2::text,"
             " 'delay', extract(epoch FROM $3::interval), 'unique_key', $4::text,"
             " 'after', CASE WHEN $5::bigint IS NOT NULL THEN jsonb_build_array($5::bigint) END,"
             " 'tags', CASE WHEN $6::text IS NOT NULL THEN jsonb_build_array($6::text) END,"
             " 'priority', $7::integer, 'max_attempts', $8::integer))))",
             2, "job 1:");
}

static void spec_of(const rule_case *k, const fields *f, pgjobq_job_spec *s, const int64_t *after,
                    const char *const *tags)
{
    memset(s, 0, sizeof *s);
    s->payload = "{}";
    s->opts.queue = f->queue;
    s->opts.run_at = f->run_at[0] ? f->run_at : NULL;
    s->opts.delay_ms = k->delay_ms;
    s->opts.priority = k->priority;
    s->opts.max_attempts = k->max_attempts;
    s->opts.unique_key = f->unique ? "rule-key" : NULL;
    s->opts.after = f->after[0] ? after : NULL;
    s->opts.tags = f->tags ? tags : NULL;
}

static void path_c_enqueue(PGconn *pg, pgjobq_client *c, const rule_case *k, const fields *f)
{
    static const char *const tags[] = {"t", NULL};
    int64_t after[2] = {parent_id, 0}, id = 0;
    pgjobq_job_spec s;
    long long before = jobs_now(pg);

    spec_of(k, f, &s, after, tags);
    int rc = pgjobq_enqueue(c, s.payload, &s.opts, &id);
    if (k->refused)
        CHECK_MSG(rc == PGJOBQ_EINVAL, "%s, C enqueue: %s (%s)", k->name, pgjobq_errname(rc), pgjobq_errmsg(c));
    check_answer(pg, k, "C pgjobq_enqueue", rc == PGJOBQ_OK, pgjobq_errmsg(c), before, 1);
}

/* n jobs, the last m of them the case's (the others plain jobs of queue rules). */
static void path_c_many(PGconn *pg, pgjobq_client *c, const rule_case *k, const fields *f, size_t n, size_t m,
                        const char *path)
{
    static const char *const tags[] = {"t", NULL};
    int64_t after[2] = {parent_id, 0};
    pgjobq_job_spec *s = calloc(n, sizeof *s);
    int64_t *ids = calloc(n, sizeof *ids);
    long long before = jobs_now(pg);

    CHECK(s != NULL && ids != NULL);
    for (size_t i = 0; i < n; i++) {
        if (i >= n - m)
            spec_of(k, f, &s[i], after, tags);
        else {
            s[i].payload = "{}";
            s[i].opts.queue = "rules";
        }
    }
    int rc = pgjobq_enqueue_many(c, s, n, ids, NULL);
    if (k->refused)
        CHECK_MSG(rc == PGJOBQ_EINVAL, "%s, %s: %s (%s)", k->name, path, pgjobq_errname(rc), pgjobq_errmsg(c));
    check_answer(pg, k, path, rc == PGJOBQ_OK, pgjobq_errmsg(c), before, (long long)n);
    free(s);
    free(ids);
}

/* The statements that inserted into pgjobq.jobs, newest last (a trigger of this test's). */
static void log_inserts(PGconn *pg)
{
    PQclear(t_exec(pg, "CREATE TABLE public.rule_inserts (n bigserial, query text)"));
    PQclear(t_exec(pg,
                   "CREATE FUNCTION public.rule_insert() RETURNS trigger LANGUAGE plpgsql AS"
                   " $$ BEGIN INSERT INTO public.rule_inserts (query) VALUES (current_query()); RETURN NULL; END $$"));
    PQclear(t_exec(pg, "CREATE TRIGGER rule_insert AFTER INSERT ON pgjobq.jobs FOR EACH STATEMENT"
                       " EXECUTE FUNCTION public.rule_insert()"));
}

/* A batch large enough for COPY, every job the case's (COPY takes run_at on every job or none, and no
 * delay, unique key, parents or tags: those batches go through enqueue_many, tested above). */
static void path_c_copy(PGconn *pg, pgjobq_client *c, const rule_case *k, const fields *f)
{
    if (k->delay || f->unique)
        return;
    long long last = t_int(pg, "SELECT coalesce(max(n), 0) FROM public.rule_inserts");
    path_c_many(pg, c, k, f, COPY_JOBS, COPY_JOBS, "C pgjobq_enqueue_many (COPY)");
    if (k->refused == NULL)
        CHECK_MSG(t_int(pg, "SELECT count(*) FROM public.rule_inserts WHERE n > %lld AND query LIKE 'COPY %%'", last) ==
                      1,
                  "%s: the batch did not go through COPY", k->name);
}

/* The command: one job, or (file) a file of COPY_JOBS lines. */
static void path_cli(PGconn *pg, const rule_case *k, const fields *f, int file)
{
    const char *argv[24];
    int n = 0;
    char *out = NULL, *err = NULL, prio[16], att[16], *data = NULL;
    long long before = jobs_now(pg);

    argv[n++] = "enqueue";
    argv[n++] = "--queue";
    argv[n++] = f->queue;
    if (f->run_at[0]) {
        argv[n++] = "--run-at";
        argv[n++] = f->run_at;
    }
    if (k->cli_delay) {
        argv[n++] = "--delay";
        argv[n++] = k->cli_delay;
    }
    if (k->priority) {
        snprintf(prio, sizeof prio, "%d", k->priority);
        argv[n++] = "--priority";
        argv[n++] = prio;
    }
    if (k->max_attempts) {
        snprintf(att, sizeof att, "%d", k->max_attempts);
        argv[n++] = "--max-attempts";
        argv[n++] = att;
    }
    if (f->unique) {
        argv[n++] = "--unique-key";
        argv[n++] = "rule-key";
    }
    if (f->after[0]) {
        argv[n++] = "--after";
        argv[n++] = f->after;
    }
    if (f->tags) {
        argv[n++] = "--tag";
        argv[n++] = "t";
    }
    if (file) {
        argv[n++] = "--file";
        argv[n++] = "-";
        data = malloc(COPY_JOBS * 3 + 1);
        CHECK(data != NULL);
        for (int i = 0; i < COPY_JOBS; i++)
            memcpy(data + 3 * i, "{}\n", 3);
        data[COPY_JOBS * 3] = '\0';
    } else
        argv[n++] = "{}";
    argv[n] = NULL;

    int status;
    switch (n) { /* t_cli takes its arguments as a list */
#define A(i) argv[i]
    case 4: status = t_cli(&out, &err, data, data ? strlen(data) : 0, A(0), A(1), A(2), A(3), NULL); break;
    case 5: status = t_cli(&out, &err, data, data ? strlen(data) : 0, A(0), A(1), A(2), A(3), A(4), NULL); break;
    case 6: status = t_cli(&out, &err, data, data ? strlen(data) : 0, A(0), A(1), A(2), A(3), A(4), A(5), NULL); break;
    case 7:
        status = t_cli(&out, &err, data, data ? strlen(data) : 0, A(0), A(1), A(2), A(3), A(4), A(5), A(6), NULL);
        break;
    case 8:
        status = t_cli(&out, &err, data, data ? strlen(data) : 0, A(0), A(1), A(2), A(3), A(4), A(5), A(6), A(7), NULL);
        break;
    case 9:
        status = t_cli(&out, &err, data, data ? strlen(data) : 0, A(0), A(1), A(2), A(3), A(4), A(5), A(6), A(7), A(8),
                       NULL);
        break;
    default: CHECK_MSG(0, "%s: %d arguments", k->name, n);
#undef A
    }
    const char *path = file ? "pgjobq enqueue --file" : "pgjobq enqueue";
    if (k->refused)
        CHECK_MSG(status == k->cli_status, "%s, %s: exit %d, expected %d (%s)", k->name, path, status, k->cli_status,
                  err);
    check_answer(pg, k, path, status == 0, err, before, file ? COPY_JOBS : 1);
    free(out);
    free(err);
    free(data);
}

/* The Python package's enqueue, enqueue_many and enqueue_graph, each case through each, in one run of
 * python3: one line per call, "ok" or "refused: MESSAGE". */
static const char PY_SCRIPT[] =
    "import json, os, sys\n"
    "import pgjobq\n"
    "url = os.environ['RULES_URL']\n"
    "for c in json.loads(os.environ['RULES_CASES']):\n"
    "    opts = {k: v for k, v in c.items() if v is not None}\n"
    "    calls = [lambda: pgjobq.enqueue(url, 'k', {}, **opts),\n"
    "             lambda: pgjobq.enqueue_many(url, [pgjobq.JobSpec(queue='rules'), pgjobq.JobSpec(**opts)]),\n"
    "             lambda: pgjobq.enqueue_graph(url, [pgjobq.JobSpec(**opts)])]\n"
    "    for call in calls:\n"
    "        try:\n"
    "            call()\n"
    "            print('ok', flush=True)\n"
    "        except pgjobq.PgjobqError as e:\n"
    "            print('refused: ' + str(e).replace('\\n', ' '), flush=True)\n";

static void path_python(PGconn *pg, const fields *fs)
{
    char script[600], cmd[2048];
    static char json[16384], out[65536];
    size_t len = 0;

    /* The cases as JobSpec's fields. */
    len += (size_t)snprintf(json + len, sizeof json - len, "[");
    for (size_t i = 0; i < NCASES; i++) {
        const rule_case *k = &cases[i];
        const fields *f = &fs[i];
        char delay[64] = "null", run_at[80] = "null", after[48] = "null", prio[16] = "null", att[16] = "null";
        if (k->delay)
            snprintf(delay, sizeof delay, "%.3f", (double)k->delay_ms / 1000.0);
        if (f->run_at[0])
            snprintf(run_at, sizeof run_at, "\"%s\"", f->run_at);
        if (f->after[0])
            snprintf(after, sizeof after, "[%s]", f->after);
        if (k->priority)
            snprintf(prio, sizeof prio, "%d", k->priority);
        if (k->max_attempts)
            snprintf(att, sizeof att, "%d", k->max_attempts);
        len += (size_t)snprintf(json + len, sizeof json - len,
                                "%s{\"queue\": \"%s\", \"run_at\": %s, \"delay\": %s, \"unique_key\": %s, "
                                "\"after\": %s, \"tags\": %s, \"priority\": %s, \"max_attempts\": %s}",
                                i ? ", " : "", f->queue, run_at, delay, f->unique ? "\"rule-key\"" : "null", after,
                                f->tags ? "[\"t\"]" : "null", prio, att);
        CHECK(len < sizeof json);
    }
    len += (size_t)snprintf(json + len, sizeof json - len, "]");
    snprintf(script, sizeof script, "%s/rules.py", t_tmpdir());
    FILE *f = fopen(script, "w");
    CHECK(f != NULL);
    fputs(PY_SCRIPT, f);
    CHECK(fclose(f) == 0);
    setenv("RULES_URL", t_conninfo(), 1);
    setenv("RULES_CASES", json, 1);
    snprintf(cmd, sizeof cmd, "cd '%s' && PYTHONPATH='%s/python' PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 '%s'",
             t_tmpdir(), t_srcdir(), script);
    long long before = jobs_now(pg);
    int rc = t_shell(out, sizeof out, cmd);
    CHECK_MSG(rc == 0, "python3 exited with %d:\n%s", rc, out);

    /* Each line against its case; the jobs written, all told. */
    static const char *const calls[] = {"Python enqueue", "Python enqueue_many", "Python enqueue_graph"};
    static const int jobs_per_call[] = {1, 2, 1};
    long long written = 0;
    char *line = out;
    for (size_t i = 0; i < NCASES; i++) {
        for (int call = 0; call < 3; call++) {
            char *end = strchr(line, '\n');
            CHECK_MSG(end != NULL, "python3 answered for fewer calls than asked:\n%s", out);
            *end = '\0';
            const rule_case *k = &cases[i];
            if (k->refused == NULL) {
                CHECK_MSG(strcmp(line, "ok") == 0, "%s, %s: %s", k->name, calls[call], line);
                written += jobs_per_call[call];
            } else {
                CHECK_MSG(strncmp(line, "refused: ", 9) == 0, "%s, %s: accepted, but the case is refused (\"%s\")",
                          k->name, calls[call], k->refused);
                CHECK_MSG(strstr(line, k->refused) != NULL, "%s, %s: the refusal \"%s\" does not say \"%s\"", k->name,
                          calls[call], line + 9, k->refused);
            }
            line = end + 1;
        }
    }
    CHECK_INT(jobs_now(pg) - before, written);
}

TEST_FULL(enqueue_rules_give_the_same_answer_on_every_path, 180, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    static fields f[NCASES];

    PQclear(t_exec(pg, "SET TIME ZONE 'UTC'"));
    log_inserts(pg);
    parent_id = t_int(pg, "SELECT id FROM pgjobq.enqueue(queue => 'rules')");
    for (size_t i = 0; i < NCASES; i++) {
        const rule_case *k = &cases[i];
        case_fields(pg, k, &f[i]);
        paths_sql(pg, k, &f[i]);
        path_c_enqueue(pg, c, k, &f[i]);
        path_c_many(pg, c, k, &f[i], 3, 1, "C pgjobq_enqueue_many");
        path_c_copy(pg, c, k, &f[i]);
        path_cli(pg, k, &f[i], 0);
        path_cli(pg, k, &f[i], 1);
    }
    path_python(pg, f);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* ------------------------------------------------------------------------------------------------ */

/* The frontend's Sync messages in a libpq trace: its round trips (a pipeline sends one per statement). */
static int syncs_in(const char *path)
{
    char line[4096];
    int n = 0;
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f))
        n += strncmp(line, "F\t", 2) == 0 && strstr(line, "\tSync") != NULL;
    fclose(f);
    return n;
}

/* The statements one pgjobq_enqueue sends (libpq's trace of the client's connection). */
static int enqueue_syncs(pgjobq_client *c, const pgjobq_enqueue_opts *o, const char *name)
{
    char path[600];
    int64_t id;

    snprintf(path, sizeof path, "%s/%s.trace", t_tmpdir(), name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    PQtrace(pgjobq_client_conn(c), f);
    PQsetTraceFlags(pgjobq_client_conn(c), PQTRACE_SUPPRESS_TIMESTAMPS);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", o, &id));
    PQuntrace(pgjobq_client_conn(c));
    CHECK(fclose(f) == 0);
    return syncs_in(path);
}

/* An enqueue with run_at costs no more statements than one without (the run_at is judged in the
 * insert's statement), and a run_at text the database cannot read is named by its job all the same:
 * found on the error path, after the batch's statement failed, on the client's own connection, or
 * without asking when the jobs share the text (in a caller's transaction too); through enqueue_many
 * and through COPY.  Nothing is written. */
TEST(enqueue_rules_a_run_at_costs_no_round_trip_and_a_bad_one_names_its_job)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job_spec *s = calloc(COPY_JOBS, sizeof *s);
    int64_t id = 0;

    CHECK(s != NULL);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id)); /* the schema check and the session's first statements */
    int plain = enqueue_syncs(c, &o, "plain");
    o.run_at = "2030-01-01 00:00:00+00";
    CHECK_INT(enqueue_syncs(c, &o, "run_at"), plain);
    CHECK_INT(plain, 2); /* the insert, then the notification (pipelined) */
    long long before = jobs_now(pg);

    /* One job. */
    o.run_at = "garbage";
    CHECK_RC(c, pgjobq_enqueue(c, "{}", &o, &id), PGJOBQ_EINVAL);
    CHECK_MSG(strncmp(pgjobq_errmsg(c), "job: run_at: ", 13) == 0 && strstr(pgjobq_errmsg(c), "\"garbage\""), "%s",
              pgjobq_errmsg(c));
    CHECK_STR(pgjobq_sqlstate(c), "22007");

    /* A batch through enqueue_many, several texts: the one that does not read is asked for. */
    for (int i = 0; i < 3; i++) {
        s[i].payload = "{}";
        s[i].opts.run_at = i == 2 ? "2030-13-45" : i ? "2030-01-02" : "2030-01-01";
    }
    CHECK_RC(c, pgjobq_enqueue_many(c, s, 3, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strncmp(pgjobq_errmsg(c), "job 2: run_at: ", 15) == 0 && strstr(pgjobq_errmsg(c), "2030-13-45"), "%s",
              pgjobq_errmsg(c));

    /* Through COPY. */
    for (int i = 0; i < COPY_JOBS; i++) {
        s[i].payload = "{}";
        s[i].opts.run_at = i == 417 ? "2030-01-01 10:00 Mars/Olympus" : "2030-01-01";
    }
    CHECK_RC(c, pgjobq_enqueue_many(c, s, COPY_JOBS, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strncmp(pgjobq_errmsg(c), "job 417: run_at: ", 17) == 0 && strstr(pgjobq_errmsg(c), "time zone"), "%s",
              pgjobq_errmsg(c));

    /* In the caller's transaction: one text for every job is named without a question; several are not
     * asked for (the failure aborted the transaction), and the error is the database's. */
    for (int i = 0; i < 3; i++)
        s[i].opts.run_at = "tomorrow at noon";
    CHECK_OK(c, pgjobq_begin(c));
    CHECK_RC(c, pgjobq_enqueue_many(c, s, 3, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strncmp(pgjobq_errmsg(c), "job 0: run_at: ", 15) == 0, "%s", pgjobq_errmsg(c));
    CHECK_OK(c, pgjobq_rollback(c));
    s[1].opts.run_at = "2030-01-01";
    CHECK_OK(c, pgjobq_begin(c));
    CHECK_RC(c, pgjobq_enqueue_many(c, s, 3, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "tomorrow at noon") && strncmp(pgjobq_errmsg(c), "job ", 4) != 0, "%s",
              pgjobq_errmsg(c));
    CHECK_OK(c, pgjobq_rollback(c));
    CHECK_INT(jobs_now(pg), before);

    /* A rule the database judges is its own message, not taken for a text it cannot read. */
    for (int i = 0; i < 3; i++)
        s[i].opts.run_at = i == 1 ? "1800-01-01" : "2030-01-01";
    CHECK_RC(c, pgjobq_enqueue_many(c, s, 3, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "run_ats[2] is 1800-01-01") && strncmp(pgjobq_errmsg(c), "job ", 4) != 0, "%s",
              pgjobq_errmsg(c));
    CHECK_INT(jobs_now(pg), before);
    free(s);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* ------------------------------------------------------------------------------------------------ */

/* A job enqueued without fields gets pgjobq.job_defaults() on every path, which are the columns'
 * defaults of pgjobq.jobs and enqueue()'s, and what the header says of max_attempts. */
TEST(enqueue_rules_a_job_without_fields_gets_the_databases_defaults)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    pgjobq_job_spec *s = calloc(COPY_JOBS, sizeof *s);
    char *want = t_str(pg, "SELECT concat_ws(' ', queue, kind, payload::text, priority, max_attempts)"
                           " FROM pgjobq.job_defaults()");
    int64_t id, first;

    CHECK(s != NULL);
    CHECK_STR(want, "default default {} 0 25");
    CHECK_INT(t_int(pg, "SELECT max_attempts FROM pgjobq.job_defaults()"), PGJOBQ_DEFAULT_MAX_ATTEMPTS);
    /* The table's column defaults (a row inserted by hand, rolled back). */
    PQclear(t_exec(pg, "BEGIN"));
    char *table = t_str(pg, "INSERT INTO pgjobq.jobs DEFAULT VALUES"
                            " RETURNING concat_ws(' ', queue, kind, payload::text, priority, max_attempts)");
    PQclear(t_exec(pg, "ROLLBACK"));
    CHECK_STR(table, want);
    free(table);

    first = t_int(pg, "SELECT id FROM pgjobq.enqueue()");
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue(tags => ARRAY['t'])"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.enqueue_many(NULL, NULL, ARRAY[NULL]::jsonb[])"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.enqueue_graph('[{}]')"));
    CHECK_OK(c, pgjobq_enqueue(c, NULL, NULL, &id));
    CHECK_OK(c, pgjobq_enqueue_many(c, s, 3, NULL, NULL));
    long long last = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs");
    CHECK_OK(c, pgjobq_enqueue_many(c, s, COPY_JOBS, NULL, NULL)); /* COPY (the owner may) */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), last + COPY_JOBS);
    char *got = t_str(pg, "SELECT string_agg(DISTINCT concat_ws(' ', queue, kind, payload::text, priority,"
                          " max_attempts), '; ') FROM pgjobq.all_jobs");
    CHECK_STR(got, want);
    free(got);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id >= %lld", (long long)first), 8 + COPY_JOBS);
    /* The levels the claims visit: the default queue's, at the default priority, once. */
    char *levels = t_str(pg, "SELECT string_agg(queue || ' ' || priority, ', ') FROM pgjobq.levels");
    CHECK_STR(levels, "default 0");
    free(levels);
    free(want);
    free(s);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* ------------------------------------------------------------------------------------------------ */

/* What the C library's result code for a SQLSTATE (pgjobq__code_from_sqlstate) is in the Python
 * package (errors.translate): its exception class.  A plain PgjobqError for the codes Python has no
 * class of its own for: a lost connection, a timeout, any other database error. */
static const char *python_class_of(int code)
{
    switch (code) {
    case PGJOBQ_EINVAL: return "InvalidArgument";
    case PGJOBQ_EDUPLICATE: return "DuplicateJob";
    case PGJOBQ_EPERM: return "PermissionDenied";
    case PGJOBQ_ESCHEMA: return "SchemaMissing";
    case PGJOBQ_ECONFLICT: return "TransactionConflict";
    case PGJOBQ_ECONN:
    case PGJOBQ_ETIMEOUT:
    case PGJOBQ_EDB: return "PgjobqError";
    }
    return "?";
}

/* The C library and the Python package read a SQLSTATE alike: one meaning in both (23505, a unique
 * key held, was PGJOBQ_EINVAL in C and DuplicateJob in Python), every branch of either map tried. */
TEST(errors_c_and_python_map_sqlstates_alike)
{
    static const char *const states[] = {"22023", "22P02", "22007", "22008", "22003", "23505", "23514", "23503",
                                         "23502", "23P01", "23001", "42501", "3F000", "42883", "42P01", "40001",
                                         "40P01", "08006", "08001", "57P01", "57P02", "57P03", "57014", "55P03",
                                         "25006", "42P10", "P0001", "XX000", "55006"};
    char cmd[4096], out[8192], want[2048], args[512];
    size_t len = 0, alen = 0;

    want[0] = '\0';
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
        len += (size_t)snprintf(want + len, sizeof want - len, "%s %s\n", states[i],
                                python_class_of(pgjobq__code_from_sqlstate(states[i])));
        alen += (size_t)snprintf(args + alen, sizeof args - alen, " %s", states[i]);
    }
    CHECK(len < sizeof want && alen < sizeof args);
    CHECK(strstr(want, "?") == NULL);
    CHECK(strstr(want, "23505 DuplicateJob\n") != NULL);
    snprintf(cmd, sizeof cmd,
             "PYTHONPATH='%s/python' PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -c '"
             "import sys\n"
             "from pgjobq import errors\n"
             "class E(Exception):\n"
             "    def __init__(self, s):\n"
             "        super().__init__(\"x\")\n"
             "        self.sqlstate = s\n"
             "for s in sys.argv[1:]:\n"
             "    print(s, type(errors.translate(E(s))).__name__)\n"
             "'%s",
             t_srcdir(), args);
    int rc = t_shell(out, sizeof out, cmd);
    CHECK_MSG(rc == 0, "python3: %s", out);
    CHECK_STR(out, want);
}
