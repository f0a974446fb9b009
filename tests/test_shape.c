/*
 * test_shape.c - the job row's shape, spelled out wherever a statement must spell it, is the table's.
 *
 * The functions that move a finished job to the history, and a retried one back, name its columns
 * (sql/functions: statements tuned for their plans, where `SELECT *` of the other table's row would
 * not do: the live row has columns the history has not); the C library reads jobs and claims by column position
 * (src/internal.h); the claims return a RETURNS TABLE each; the Python package reads pgjobq.all_jobs into JobInfo. Each
 * list is compared here with the catalog (pg_attribute, pg_proc), so that a column added to the
 * tables and forgotten in one list fails `make check` (migration 9 found one the version 3 functions
 * had forgotten).  What a list leaves out on purpose is named below, with the reason.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

/* A list of names as "a,b,c": white space dropped. */
static void squeeze(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++)
        if (!isspace((unsigned char)*r))
            *w++ = *r;
    *w = '\0';
}

/* The columns of a relation, in order, "a,b,c" (malloc'd). */
static char *columns_of(PGconn *pg, const char *rel)
{
    return t_str(pg,
                 "SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute"
                 " WHERE attrelid = '%s'::regclass AND attnum > 0 AND NOT attisdropped",
                 rel);
}

/* Checks that the list (names "a,b,c") holds the same names as want, but for those of `left_out`
 * ("a,b": want's names the list leaves out on purpose) and `added` (the list's own). */
static void same_names(PGconn *pg, const char *what, const char *list, const char *want, const char *left_out,
                       const char *added)
{
    const char *values[4] = {list, want, left_out, added};
    PGresult *r = PQexecParams(pg,
                               "SELECT coalesce((SELECT string_agg(x, ', ') FROM unnest(string_to_array($2, ',')) x"
                               "                  WHERE x <> ALL (string_to_array($1, ','))"
                               "                    AND x <> ALL (string_to_array($3, ','))), ''),"
                               "       coalesce((SELECT string_agg(x, ', ') FROM unnest(string_to_array($1, ',')) x"
                               "                  WHERE x <> ALL (string_to_array($2, ','))"
                               "                    AND x <> ALL (string_to_array($4, ','))), ''),"
                               "       (SELECT count(*) - count(DISTINCT x) FROM unnest(string_to_array($1, ',')) x)",
                               4, NULL, values, NULL, NULL, 0);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(pg));
    CHECK_MSG(PQgetvalue(r, 0, 0)[0] == '\0', "%s lacks %s (it has %s)", what, PQgetvalue(r, 0, 0), list);
    CHECK_MSG(PQgetvalue(r, 0, 1)[0] == '\0', "%s has %s, which %s has not", what, PQgetvalue(r, 0, 1), want);
    CHECK_MSG(strcmp(PQgetvalue(r, 0, 2), "0") == 0, "%s names a column twice: %s", what, list);
    PQclear(r);
}

/* The names of a statement's result columns, "a,b,c" (malloc'd). */
static char *result_names(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s", sql, PQerrorMessage(pg));
    size_t len = 1;
    for (int i = 0; i < PQnfields(r); i++)
        len += strlen(PQfname(r, i)) + 1;
    char *out = calloc(1, len);
    CHECK(out != NULL);
    for (int i = 0; i < PQnfields(r); i++) {
        if (i)
            strcat(out, ",");
        strcat(out, PQfname(r, i));
    }
    PQclear(r);
    return out;
}

/* The function (its name and '(') that the text at p is in. */
static const char *function_at(const char *text, const char *p)
{
    const char *fn = NULL;
    for (const char *q = text; (q = strstr(q, "FUNCTION pgjobq.")) != NULL && q < p; q++)
        fn = q + strlen("FUNCTION pgjobq.");
    CHECK(fn != NULL);
    return fn;
}

/* The job's moves between the tables, in the function files: every `INSERT INTO pgjobq.history (...)`
 * (a finished job) names every column of the history but lease_until (a finished job holds no lease),
 * and every `INSERT INTO pgjobq.jobs (...)` of retry and retry_where (a finished job run again) every
 * column of the history but those a live job has not (finished_at, lease_until) or starts afresh
 * (cancel_requested and its times).  load_history, which makes rows for the benchmarks, writes the history's
 * columns that cannot be NULL; the enqueue functions write the fields a new job is given.  Returns how
 * many moves there are. */
static int check_moves(PGconn *pg, const char *history)
{
    static const char *const files[] = {"admin",  "claim",     "enqueue",     "maintenance", "monitor",
                                        "queues", "schedules", "transitions", "workflows"};
    static const char *const heads[] = {"INSERT INTO pgjobq.history (", "INSERT INTO pgjobq.jobs ("};
    char path[4096], what[200];
    int n = 0;

    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/sql/functions/%s.sql", t_srcdir(), files[i]);
        char *text = t_read_file(path);
        for (int h = 0; h < 2; h++) {
            for (char *p = text; (p = strstr(p, heads[h])) != NULL;) {
                char *start = p + strlen(heads[h]), *end = strchr(start, ')');
                CHECK(end != NULL);
                char *list = strndup(start, (size_t)(end - start));
                CHECK(list != NULL);
                squeeze(list);
                int line = 1;
                for (char *q = text; q < p; q++)
                    line += *q == '\n';
                const char *fn = function_at(text, p);
                snprintf(what, sizeof what, "sql/functions/%s.sql:%d, %.*s (in %.*s)", files[i], line,
                         (int)strlen(heads[h]) - 2, heads[h], (int)strcspn(fn, "("), fn);
                if (h == 0 && strncmp(fn, "load_history(", 13) == 0)
                    same_names(pg, what, list,
                               "id,queue,kind,payload,priority,state,attempt,max_attempts,run_at,created_at,"
                               "started_at,finished_at,lease_token",
                               "", "");
                else if (h == 0) {
                    same_names(pg, what, list, history, "lease_until", "");
                    n++;
                } else if (strncmp(fn, "retry(", 6) == 0 || strncmp(fn, "retry_where(", 12) == 0) {
                    same_names(pg, what, list, history,
                               "finished_at,lease_until,cancel_requested,cancel_requested_at,cancel_told_at", "");
                    n++;
                }
                free(list);
                p = end;
            }
        }
        free(text);
    }
    return n;
}

/* The names of out arguments of a function (RETURNS TABLE), or their types, in order (malloc'd). */
static char *returned(PGconn *pg, const char *fn, int types)
{
    return t_str(pg,
                 "SELECT string_agg(%s, ',' ORDER BY u.o) FROM pg_proc p,"
                 " unnest(p.proargnames, p.proargmodes, p.proallargtypes) WITH ORDINALITY AS u(n, m, t, o)"
                 " WHERE p.oid = '%s'::regproc AND u.m = 't'",
                 types ? "format_type(u.t, NULL)" : "u.n", fn);
}

/* The Python package's JobInfo fields, and the names of the columns its statement reads them from
 * (pgjobq._jobs._GET_SQL, run on the test's database), "a,b,c" each (fields and columns: 1024 bytes). */
static void python_job_info(char *fields, char *columns)
{
    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && PYTHONPATH='%s/python' PYTHONDONTWRITEBYTECODE=1 SHAPE_URL='%s' /usr/bin/python3 -c '"
             "import dataclasses, os, psycopg\n"
             "from pgjobq import _jobs, _sql\n"
             "print(\",\".join(f.name for f in dataclasses.fields(_jobs.JobInfo)))\n"
             "with psycopg.connect(os.environ[\"SHAPE_URL\"]) as c:\n"
             "    cur = c.execute(_sql._pyformat(_jobs._GET_SQL), {\"id\": 0})\n"
             "    print(\",\".join(d.name for d in cur.description))\n"
             "'",
             t_tmpdir(), t_srcdir(), t_conninfo());
    int rc = t_shell(out, sizeof out, cmd);
    CHECK_MSG(rc == 0, "python3: %s", out);
    CHECK_MSG(sscanf(out, "%1023s %1023s", fields, columns) == 2, "python3 said: %s", out);
}

TEST(schema_the_job_rows_columns_are_the_same_everywhere)
{
    PGconn *pg = t_pg();
    char *jobs = columns_of(pg, "pgjobq.jobs"), *history = columns_of(pg, "pgjobq.history");
    char *all_jobs = columns_of(pg, "pgjobq.all_jobs");

    /* The history keeps what a finished job was; the columns only a live job needs stay behind. */
    same_names(pg, "pgjobq.history", history, jobs, "ready_at,has_children,pending_parents,on_parent_failure", "");
    /* pgjobq.all_jobs is both tables, with the history's columns. */
    same_names(pg, "pgjobq.all_jobs", all_jobs, history, "", "");

    /* The function files' moves between the tables: six to the history and two back, in four files,
     * when this was written. */
    CHECK_INT(check_moves(pg, history), 8);

    /* The C library's reads of jobs: every column of pgjobq.all_jobs but concurrency_key, cancel_told_at,
     * route_key, snoozes, expires_at and base_priority (pgjobq_job has no field for them, and no
     * reserved one left: include/pgjobq.h; the routing key is the cluster client's, docs/shards.md;
     * `pgjobq show` reads the expiry and the base priority itself), and the parents a claim adds. */
    char *c_jobs = result_names(pg, "SELECT " PGJOBQ__JOB_COLUMNS " FROM pgjobq.all_jobs LIMIT 0");
    same_names(pg, "PGJOBQ__JOB_COLUMNS (src/internal.h)", c_jobs, all_jobs,
               "concurrency_key,cancel_told_at,route_key,snoozes,expires_at,base_priority", "parents");

    /* The claims: claim_batch returns PGJOBQ__CLAIMED_COLUMNS, which claim_next's rows begin with,
     * names and types; each a column of pgjobq.jobs but parents (traceparent among them, which
     * pgjobq_job keeps after its kind: pgjobq_job_traceparent). */
    char claimed[] = PGJOBQ__CLAIMED_COLUMNS;
    squeeze(claimed);
    char *batch = returned(pg, "pgjobq.claim_batch", 0), *next = returned(pg, "pgjobq.claim_next", 0);
    CHECK_STR(batch, claimed);
    CHECK_MSG(strncmp(next, claimed, strlen(claimed)) == 0 && next[strlen(claimed)] == ',',
              "claim_next returns %s, not first PGJOBQ__CLAIMED_COLUMNS (%s)", next, claimed);
    char *batch_types = returned(pg, "pgjobq.claim_batch", 1), *next_types = returned(pg, "pgjobq.claim_next", 1);
    CHECK_MSG(strncmp(next_types, batch_types, strlen(batch_types)) == 0, "claim_next's types %s, claim_batch's %s",
              next_types, batch_types);
    for (char *name = strtok(claimed, ","); name; name = strtok(NULL, ","))
        CHECK_MSG(strcmp(name, "parents") == 0 || t_int(pg,
                                                        "SELECT count(*) FROM pg_attribute WHERE attrelid ="
                                                        " 'pgjobq.jobs'::regclass AND attname = '%s'",
                                                        name) == 1,
                  "a claim returns %s, which is no column of pgjobq.jobs", name);

    /* The Python package: JobInfo has every column of pgjobq.all_jobs but the lease (lease_token is
     * the holder's secret; lease_until the engine's business) and the routing key (the cluster
     * client's, not yet in Python: docs/shards.md), and reads them in its fields' order, then the job's
     * steps and park (pgjobq.steps, pgjobq.job_park_of: docs/durable.md) and its dead-letter links
     * (pgjobq.monitor_dead_letters: docs/queues.md). */
    char fields[1024], columns[1024];
    python_job_info(fields, columns);
    same_names(pg, "pgjobq._jobs.JobInfo", fields, all_jobs, "lease_token,lease_until,route_key",
               "steps,parked,dead_letter_of,dead_letters");
    CHECK_STR(columns, fields);

    free(jobs);
    free(history);
    free(all_jobs);
    free(c_jobs);
    free(batch);
    free(next);
    free(batch_types);
    free(next_types);
    PQfinish(pg);
}
