/*
 * test_cluster_tool.c - `pgjobq cluster` (docs/shards.md, "Operations"): init installs one map in every
 * shard and router; move-queue installs the next one so that the old owner refuses the queue's new
 * jobs (PJQ01) and keeps working those it has; running a change again is safe; a shard that cannot be
 * reached stops a change before anything is written, and a change that stops half-way says exactly
 * where it is and is finished by running it again.  Also the tour of docs/shards.md, run as written.
 *
 * The shards are databases of the test's own PostgreSQL (t_extra_db), as in tests/test_cluster.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "harness.h"
#include "internal.h"

/* Runs `pgjobq cluster ARGS...`; returns its exit status, with its output in *out and *err (malloc'd). */
#define CLUSTER(out, err, ...) t_cli(out, err, NULL, 0, "cluster", __VA_ARGS__, NULL)

/* The SQLSTATE of an enqueue of queue on pg ("" when it succeeds). */
static char *enqueue_state(PGconn *pg, const char *queue)
{
    const char *v[1] = {queue};
    PGresult *r = PQexecParams(pg, "SELECT id FROM pgjobq.enqueue($1)", 1, NULL, v, NULL, NULL, 0);
    const char *st = PQresultStatus(r) == PGRES_TUPLES_OK ? "" : PQresultErrorField(r, PG_DIAG_SQLSTATE);
    char *out = strdup(st ? st : "?");
    PQclear(r);
    return out;
}

#define CHECK_ENQUEUE(pg, queue, want)        \
    do {                                      \
        char *st_ = enqueue_state(pg, queue); \
        CHECK_STR(st_, want);                 \
        free(st_);                            \
    } while (0)

/* Two migrated shards "sa" and "sb" and (with_router) a router, the map of `pgjobq cluster init`
 * installed in them: 16 partitions, 0-7 on sa, 8-15 on sb. */
typedef struct two_shards {
    char *ci_a, *ci_b, *ci_r;
    PGconn *a, *b;
} two_shards;

static void two_shards_init(two_shards *t, int with_router)
{
    char *out, *err, sa[1200], sb[1200];
    memset(t, 0, sizeof *t);
    t->ci_a = t_extra_db("sa", 1);
    t->ci_b = t_extra_db("sb", 1);
    if (with_router) {
        t->ci_r = t_extra_db("router", 0);
        int rc = t_cli(&out, &err, NULL, 0, "migrate", "--router", "--db", t->ci_r, NULL);
        CHECK_MSG(rc == 0, "migrate --router: %d %s %s", rc, out, err);
        free(out);
        free(err);
    }
    snprintf(sa, sizeof sa, "sa=%s", t->ci_a);
    snprintf(sb, sizeof sb, "sb=%s", t->ci_b);
    int rc = with_router
                 ? CLUSTER(&out, &err, "init", "--name", "tool", "--shard", sa, "--shard", sb, "--partitions", "16",
                           "--router", t->ci_r)
                 : CLUSTER(&out, &err, "init", "--name", "tool", "--shard", sa, "--shard", sb, "--partitions", "16");
    CHECK_MSG(rc == 0, "cluster init: %d %s %s", rc, out, err);
    free(out);
    free(err);
    t->a = t_connect(t->ci_a);
    t->b = t_connect(t->ci_b);
}

static void two_shards_free(two_shards *t)
{
    PQfinish(t->a);
    PQfinish(t->b);
    free(t->ci_a);
    free(t->ci_b);
    free(t->ci_r);
}

/* A queue name whose pinned partition of 16 is owned by sa (owner 'a': partitions 0-7) or sb. */
static void queue_on(char *buf, size_t size, char owner)
{
    for (int i = 0;; i++) {
        snprintf(buf, size, "mail%d", i);
        uint32_t p = pgjobq__route_hash(buf, strlen(buf)) & 15u;
        if ((owner == 'a') == (p < 8))
            return;
    }
}

/* init: the same map in both shards (each its own self) and the router (self NULL), partitions in
 * order; again, nothing to do; a conninfo with a password, a shard that is not migrated, a shard that
 * cannot be reached: refused, and nothing is installed anywhere; another map over a cluster: refused. */
TEST_FULL(cluster_tool_init_installs_one_map_everywhere, 120, 0)
{
    char *out, *err, sa[1200], sb[1200], bad[1200];
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), *ci_empty = t_extra_db("empty", 0);
    char *ci_r = t_extra_db("router", 0);
    PGconn *a = t_connect(ci_a), *b = t_connect(ci_b), *r = t_connect(ci_r);
    int rc;

    rc = t_cli(&out, &err, NULL, 0, "migrate", "--router", "--db", ci_r, NULL);
    CHECK_MSG(rc == 0, "%d %s", rc, err);
    free(out);
    free(err);
    snprintf(sa, sizeof sa, "sa=%s", ci_a);

    /* Refused before anything is written. */
    snprintf(bad, sizeof bad, "sb=%s password=hunter2", ci_b);
    rc = CLUSTER(&out, &err, "init", "--name", "tool", "--shard", sa, "--shard", bad);
    CHECK_MSG(rc == EX_USAGE && strstr(err, "must not carry a password") && !strstr(err, "hunter2"), "%d %s", rc, err);
    free(out);
    free(err);
    snprintf(bad, sizeof bad, "sb=%s", ci_empty);
    rc = CLUSTER(&out, &err, "init", "--name", "tool", "--shard", sa, "--shard", bad);
    CHECK_MSG(rc == EX_CONFIG && strstr(err, "shard \"sb\" is not a pgjobq database") &&
                  strstr(err, "nothing was changed"),
              "%d %s", rc, err);
    free(out);
    free(err);
    snprintf(bad, sizeof bad, "sb=host=/nonexistent/pgjobq-test port=5432 dbname=x connect_timeout=2");
    rc = CLUSTER(&out, &err, "init", "--name", "tool", "--shard", sa, "--shard", bad);
    CHECK_MSG(rc == EX_UNAVAILABLE && strstr(err, "shard \"sb\" cannot be reached") &&
                  strstr(err, "nothing was changed"),
              "%d %s", rc, err);
    free(out);
    free(err);
    /* A user who may not install a map (a producer): refused before anything is written. */
    pgjobq_client *c = NULL;
    CHECK_OK(c, pgjobq_client_open(&c, ci_a));
    CHECK_OK(c, pgjobq_migrate_roles(c));
    pgjobq_client_close(c);
    PQclear(t_exec(a, "DO $$ BEGIN CREATE ROLE ctool_producer LOGIN IN ROLE pgjobq_producer;"
                      " EXCEPTION WHEN duplicate_object THEN NULL; END $$"));
    snprintf(bad, sizeof bad, "sa=%s user=ctool_producer", ci_a);
    rc = CLUSTER(&out, &err, "init", "--name", "tool", "--shard", bad);
    CHECK_MSG(rc == EX_NOPERM && strstr(err, "may not run pgjobq.cluster_set") && strstr(err, "nothing was changed"),
              "%d %s %s", rc, out, err);
    free(out);
    free(err);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.cluster"), 0);

    /* The map, in order: sa owns 0-7, sb 8-15; the same everywhere but for self. */
    snprintf(sb, sizeof sb, "sb=%s", ci_b);
    rc = CLUSTER(&out, &err, "init", "--name", "tool", "--shard", sa, "--shard", sb, "--partitions", "16", "--router",
                 ci_r, "--spread", "tenants");
    CHECK_MSG(rc == 0 && strstr(out, "cluster at epoch 1"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    char *map_a = t_str(a, "SELECT pgjobq.cluster_map() - 'self'"),
         *map_b = t_str(b, "SELECT pgjobq.cluster_map() - 'self'"),
         *map_r = t_str(r, "SELECT pgjobq.cluster_map() - 'self'");
    CHECK_STR(map_b, map_a);
    CHECK_STR(map_r, map_a);
    free(map_a);
    free(map_b);
    free(map_r);
    char *self = t_str(a, "SELECT pgjobq.cluster_map() ->> 'self'");
    CHECK_STR(self, "sa");
    free(self);
    self = t_str(b, "SELECT pgjobq.cluster_map() ->> 'self'");
    CHECK_STR(self, "sb");
    free(self);
    CHECK_INT(t_int(r, "SELECT (pgjobq.cluster_map() ->> 'self' IS NULL)::int"), 1);
    char *owners = t_str(a, "SELECT string_agg(shard, ',' ORDER BY partition) FROM pgjobq.cluster_owners");
    CHECK_STR(owners, "sa,sa,sa,sa,sa,sa,sa,sa,sb,sb,sb,sb,sb,sb,sb,sb");
    free(owners);
    char *shards = t_str(b, "SELECT string_agg(name || ':' || number, ',' ORDER BY number) FROM pgjobq.cluster_shards");
    CHECK_STR(shards, "sa:0,sb:1");
    free(shards);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.cluster_queues WHERE queue = 'tenants' AND placement = 'spread'"),
              1);
    CHECK_INT(t_int(a, "SELECT epoch FROM pgjobq.cluster"), 1);

    /* Again: nothing to do.  Another map over it: refused. */
    rc = CLUSTER(&out, &err, "init", "--name", "tool", "--shard", sa, "--shard", sb, "--partitions", "16", "--router",
                 ci_r, "--spread", "tenants");
    CHECK_MSG(rc == 0 && strstr(out, "nothing to do"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    rc = CLUSTER(&out, &err, "init", "--name", "tool", "--shard", sa, "--shard", sb, "--partitions", "32");
    CHECK_MSG(rc == EX_DATAERR && strstr(err, "is in a cluster already"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    CHECK_INT(t_int(b, "SELECT partitions FROM pgjobq.cluster"), 16);

    /* A spread queue moves with its partitions, not by itself. */
    rc = CLUSTER(&out, &err, "move-queue", "tenants", "--to", "sb", "--cluster", ci_a);
    CHECK_MSG(rc == EX_DATAERR && strstr(err, "queue \"tenants\" is spread over the shards") &&
                  strstr(err, "nothing was changed"),
              "%d %s %s", rc, out, err);
    free(out);
    free(err);

    /* show, from the router: the map as text and as JSON. */
    rc = CLUSTER(&out, &err, "show", ci_r);
    CHECK_MSG(rc == 0 && strstr(out, "cluster tool, epoch 1, 16 partitions") &&
                  strstr(out, "shard sa (number 0): partitions 0-7 (8)") &&
                  strstr(out, "shard sb (number 1): partitions 8-15 (8)") && strstr(out, "queue tenants: spread"),
              "%d %s %s", rc, out, err);
    free(out);
    free(err);
    rc = CLUSTER(&out, &err, "show", "--json", "--cluster", ci_a);
    CHECK_MSG(rc == 0 && strstr(out, "\"self\": \"sa\"") && strstr(out, "\"epoch\": 1"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    /* A database in no cluster says so. */
    rc = CLUSTER(&out, &err, "show");
    CHECK_MSG(rc == EX_DATAERR && strstr(err, "no cluster map"), "%d %s %s", rc, out, err);
    free(out);
    free(err);

    PQfinish(a);
    PQfinish(b);
    PQfinish(r);
    free(ci_a);
    free(ci_b);
    free(ci_r);
    free(ci_empty);
}

/* move-queue: the next map everywhere; the old owner refuses the queue's new jobs (PJQ01) and the new
 * one takes them, the router sends them there, and the jobs queued before the move stay on the old
 * owner and are claimed there.  Again: nothing to do.  move-partitions likewise. */
TEST_FULL(cluster_tool_move_queue_leaves_the_old_owner_draining, 120, 0)
{
    two_shards t;
    char q[32], *out, *err;
    pgjobq_client *c = NULL;
    pgjobq_job *jobs = NULL;
    size_t n = 0;

    two_shards_init(&t, 1);
    queue_on(q, sizeof q, 'a');
    for (int i = 0; i < 3; i++)
        CHECK_ENQUEUE(t.a, q, "");
    CHECK_ENQUEUE(t.b, q, "PJQ01");

    /* A schedule of the queue on its old owner: it does not move, and the command says so. */
    int rc = t_cli(&out, &err, NULL, 0, "--db", t.ci_a, "cron", "add", "nightly", "--schedule", "0 3 * * *", "--queue",
                   q, NULL);
    CHECK_MSG(rc == 0, "cron add: %d %s %s", rc, out, err);
    free(out);
    free(err);
    /* An option of another action is refused. */
    rc = CLUSTER(&out, &err, "move-queue", q, "--to", "sb", "--partitions", "32", "--cluster", t.ci_r);
    CHECK_MSG(rc == EX_USAGE && strstr(err, "--partitions is not an option of move-queue"), "%d %s %s", rc, out, err);
    free(out);
    free(err);

    rc = CLUSTER(&out, &err, "move-queue", q, "--to", "sb", "--cluster", t.ci_r);
    CHECK_MSG(rc == 0 && strstr(out, "cluster at epoch 2"), "%d %s %s", rc, out, err);
    CHECK_MSG(strstr(err, "shard \"sa\" has schedules of queues it no longer owns: nightly (queue mail") != NULL, "%s",
              err);
    /* The order: the new owner, the router, the old owner last. */
    char *gains = strstr(out, "shard \"sb\" (gains work)"), *router = strstr(out, "(a router)"),
         *loses = strstr(out, "shard \"sa\" (loses work)");
    CHECK_MSG(gains && router && loses && gains < router && router < loses, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_int(t.a, "SELECT epoch FROM pgjobq.cluster"), 2);
    CHECK_INT(t_int(t.b, "SELECT epoch FROM pgjobq.cluster"), 2);
    CHECK_INT(t_int(t.b, "SELECT (partition BETWEEN 8 AND 15)::int FROM pgjobq.cluster_queues WHERE queue = '%s'", q),
              1);
    CHECK_ENQUEUE(t.a, q, "PJQ01");
    CHECK_ENQUEUE(t.b, q, "");
    PGconn *r = t_connect(t.ci_r);
    CHECK_INT(t_int(r, "SELECT id %% 1024 FROM pgjobq.enqueue('%s')", q), 1);
    PQfinish(r);
    CHECK_INT(t_int(t.b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s'", q), 2);

    /* The old owner drains: its three jobs are claimed there. */
    CHECK_OK(c, pgjobq_client_open(&c, t.ci_a));
    CHECK_OK(c, pgjobq_claim(c, q, 10, 30000, "w-a", &jobs, &n));
    CHECK_INT(n, 3);
    pgjobq_jobs_free(jobs);
    pgjobq_client_close(c);

    /* Again, from either shard: nothing to do, the epoch stays. */
    rc = CLUSTER(&out, &err, "move-queue", q, "--to", "sb", "--cluster", t.ci_a, "--router", t.ci_r);
    CHECK_MSG(rc == 0 && strstr(out, "nothing to do"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    CHECK_INT(t_int(t.a, "SELECT epoch FROM pgjobq.cluster"), 2);

    /* Partitions: 0-3 to sb (the router learns it from being the map's source). */
    rc = CLUSTER(&out, &err, "move-partitions", "0-3", "--to", "sb", "--cluster", t.ci_r);
    CHECK_MSG(rc == 0 && strstr(out, "cluster at epoch 3"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    char *owners = t_str(t.a, "SELECT string_agg(shard, ',' ORDER BY partition) FROM pgjobq.cluster_owners");
    CHECK_STR(owners, "sb,sb,sb,sb,sa,sa,sa,sa,sb,sb,sb,sb,sb,sb,sb,sb");
    free(owners);
    /* Bad requests change nothing. */
    rc = CLUSTER(&out, &err, "move-partitions", "12-16", "--to", "sa", "--cluster", t.ci_a);
    CHECK_MSG(rc == EX_DATAERR && strstr(err, "partitions 0 to 15"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    rc = CLUSTER(&out, &err, "move-queue", q, "--to", "sc", "--cluster", t.ci_a);
    CHECK_MSG(rc == EX_DATAERR && strstr(err, "no shard \"sc\""), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    CHECK_INT(t_int(t.b, "SELECT epoch FROM pgjobq.cluster"), 3);
    two_shards_free(&t);
}

/* A shard that cannot be reached stops a change before anything is written; a change that stops
 * half-way (the old owner's map locked past cluster_set's lock_timeout) says where the new map is and
 * where not; meanwhile both owners accept the queue's jobs; run again, it finishes. */
TEST_FULL(cluster_tool_a_shard_down_or_a_change_half_done, 120, 0)
{
    two_shards t;
    char q[32], *out, *err;

    two_shards_init(&t, 0);
    queue_on(q, sizeof q, 'a');
    char *dbname_b = t_str(t.b, "SELECT current_database()");

    /* A router that cannot be reached: nothing changed, and its password (a router is not in the map:
     * its conninfo may hold one) is not shown. */
    int rc = CLUSTER(&out, &err, "move-queue", q, "--to", "sb", "--cluster", t.ci_a, "--router",
                     "host=/nonexistent/pgjobq-test dbname=r password=hunter2");
    CHECK_MSG(rc == EX_UNAVAILABLE && strstr(err, "the router (") && strstr(err, "cannot be reached") &&
                  strstr(err, "nothing was changed") && !strstr(err, "hunter2"),
              "%d %s %s", rc, out, err);
    free(out);
    free(err);
    CHECK_INT(t_int(t.b, "SELECT epoch FROM pgjobq.cluster"), 1);

    /* sb down (its database renamed away): nothing changed. */
    PGconn *admin = t_pg();
    PQfinish(t.b);
    PQclear(t_exec(admin, "ALTER DATABASE \"%s\" RENAME TO \"%s_down\"", dbname_b, dbname_b));
    rc = CLUSTER(&out, &err, "move-queue", q, "--to", "sb", "--cluster", t.ci_a);
    CHECK_MSG(rc == EX_UNAVAILABLE && strstr(err, "shard \"sb\" cannot be reached") &&
                  strstr(err, "nothing was changed"),
              "%d %s %s", rc, out, err);
    free(out);
    free(err);
    CHECK_INT(t_int(t.a, "SELECT epoch FROM pgjobq.cluster"), 1);
    PQclear(t_exec(admin, "ALTER DATABASE \"%s_down\" RENAME TO \"%s\"", dbname_b, dbname_b));
    t.b = t_connect(t.ci_b);

    /* The old owner's map held by another transaction: sb gets epoch 2, sa does not. */
    PQclear(t_exec(t.a, "BEGIN"));
    PQclear(t_exec(t.a, "LOCK TABLE pgjobq.cluster IN EXCLUSIVE MODE"));
    rc = CLUSTER(&out, &err, "move-queue", q, "--to", "sb", "--cluster", t.ci_a);
    CHECK_MSG(rc == EX_TEMPFAIL && strstr(err, "stopped half-way") && strstr(err, "installed in: shard \"sb\"") &&
                  strstr(err, "not installed in: shard \"sa\" (loses work)") &&
                  strstr(err, "run the same command again"),
              "%d %s %s", rc, out, err);
    free(out);
    free(err);
    PQclear(t_exec(t.a, "ROLLBACK"));
    CHECK_INT(t_int(t.a, "SELECT epoch FROM pgjobq.cluster"), 1);
    CHECK_INT(t_int(t.b, "SELECT epoch FROM pgjobq.cluster"), 2);
    /* In the window, a producer of either map has its job accepted. */
    CHECK_ENQUEUE(t.a, q, "");
    CHECK_ENQUEUE(t.b, q, "");
    rc = CLUSTER(&out, &err, "show", "--check", "--cluster", t.ci_b);
    CHECK_MSG(rc == EX_TEMPFAIL && strstr(out, "shard sa (number 0)") && strstr(out, "[has the map of epoch 1]"),
              "%d %s %s", rc, out, err);
    free(out);
    free(err);

    /* Again, from the shard that is behind: it finishes. */
    rc = CLUSTER(&out, &err, "move-queue", q, "--to", "sb", "--cluster", t.ci_a);
    CHECK_MSG(rc == 0 && strstr(out, "shard \"sa\" (loses work): the map of epoch 2 installed") &&
                  !strstr(out, "shard \"sb\" ("),
              "%d %s %s", rc, out, err);
    free(out);
    free(err);
    CHECK_INT(t_int(t.a, "SELECT epoch FROM pgjobq.cluster"), 2);
    CHECK_ENQUEUE(t.a, q, "PJQ01");
    free(dbname_b);
    PQfinish(admin);
    two_shards_free(&t);
}

/* add-shard: a new migrated database joins owning nothing, gets partitions with move-partitions, and
 * its jobs' ids end in its number. */
TEST_FULL(cluster_tool_add_shard_then_give_it_partitions, 120, 0)
{
    two_shards t;
    char *out, *err, sc[1200];
    char *ci_c = t_extra_db("sc", 1);

    two_shards_init(&t, 0);
    snprintf(sc, sizeof sc, "sc=%s", ci_c);
    int rc = CLUSTER(&out, &err, "add-shard", sc, "--cluster", t.ci_b);
    CHECK_MSG(rc == 0 && strstr(out, "shard \"sc\" (a new shard): the map of epoch 2 installed"), "%d %s %s", rc, out,
              err);
    free(out);
    free(err);
    rc = CLUSTER(&out, &err, "add-shard", sc, "--cluster", t.ci_b);
    CHECK_MSG(rc == 0 && strstr(out, "nothing to do"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    rc = CLUSTER(&out, &err, "move-partitions", "15", "--to", "sc", "--cluster", t.ci_a);
    CHECK_MSG(rc == 0 && strstr(out, "cluster at epoch 3"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    PGconn *c = t_connect(ci_c);
    CHECK_INT(t_int(c, "SELECT number FROM pgjobq.cluster_shards WHERE name = 'sc'"), 2);
    CHECK_INT(t_int(c, "SELECT count(*) FROM pgjobq.cluster_owners WHERE shard = 'sc' AND partition = 15"), 1);
    char q[32];
    for (int i = 0;; i++) {
        snprintf(q, sizeof q, "q%d", i);
        if ((pgjobq__route_hash(q, strlen(q)) & 15u) == 15u)
            break;
    }
    CHECK_INT(t_int(c, "SELECT id %% 1024 FROM pgjobq.enqueue('%s')", q), 2);
    CHECK_ENQUEUE(t.b, q, "PJQ01");
    PQfinish(c);
    free(ci_c);
    two_shards_free(&t);
}

/* The embedded servers the tour started under this test's directory, stopped whatever happened. */
static void stop_tour_servers(void)
{
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd,
             "for h in '%s'/tmp.*/a '%s'/tmp.*/b; do [ -d \"$h/data\" ] && PGJOBQ_HOME=\"$h\" '%s' db stop; done; true",
             t_tmpdir(), t_tmpdir(), getenv("PGJOBQ_CLI"));
    (void)t_shell(out, sizeof out, cmd);
}

/* docs/shards.md's tour runs as written: its ```sh blocks, in order, in one shell (as a reader types
 * them into one terminal), from the source tree; at the end every job is done on its shard, the moved
 * queue's job on its old owner too. */
TEST_FULL(cluster_tool_the_tour_of_docs_shards_md_runs, 180, 0)
{
    char path[1024], script[600], cmd[4096], bindir[600];
    const char *cli = getenv("PGJOBQ_CLI");

    CHECK_MSG(cli != NULL && strrchr(cli, '/') != NULL, "PGJOBQ_CLI is not set (run through make check)");
    snprintf(path, sizeof path, "%s/docs/shards.md", t_srcdir());
    char *doc = t_read_file(path);
    const char *tour = strstr(doc, "\n## A tour\n");
    CHECK_MSG(tour != NULL, "docs/shards.md has no section \"A tour\"");
    const char *end = strstr(tour + 1, "\n## ");
    snprintf(script, sizeof script, "%s/tour.sh", t_tmpdir());
    FILE *f = fopen(script, "w");
    CHECK(f != NULL);
    int blocks = 0;
    for (const char *p = tour; (p = strstr(p, "\n```sh\n")) != NULL && (end == NULL || p < end); blocks++) {
        p += strlen("\n```sh\n");
        const char *stop = strstr(p, "\n```\n");
        CHECK(stop != NULL);
        fwrite(p, 1, (size_t)(stop - p) + 1, f);
        p = stop;
    }
    fclose(f);
    CHECK_MSG(blocks >= 5, "the tour has %d sh blocks", blocks);
    free(doc);

    t_defer(stop_tour_servers);
    snprintf(bindir, sizeof bindir, "%.*s", (int)(strrchr(cli, '/') - cli), cli);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && env -u PGJOBQ_DATABASE_URL -u DATABASE_URL TMPDIR='%s' PATH='%s':\"$PATH\" bash -e '%s'",
             t_srcdir(), t_tmpdir(), bindir, script);
    static char out[65536];
    int rc = t_shell(out, sizeof out, cmd);
    CHECK_MSG(rc == 0, "the tour failed (status %d):\n%s", rc, out);
    CHECK_MSG(strstr(out, "cluster at epoch 1: cluster \"tour\" of 2 shards and 64 partitions") &&
                  strstr(out, "cluster at epoch 2: queue mail is on shard \"a\"") &&
                  strstr(out, " a     | mail    | completed |    1") &&
                  strstr(out, " b     | mail    | completed |    1") && strstr(out, " a     | tenants | completed |") &&
                  strstr(out, " b     | tenants | completed |"),
              "the tour:\n%s", out);
    /* Nothing was left queued: the last table has only completed jobs. */
    const char *last = strstr(out, "cluster at epoch 2");
    CHECK_MSG(strstr(last, "| queued ") == NULL, "the tour:\n%s", out);
    /* ...and it stopped its servers. */
    CHECK_MSG(strstr(out, "/a stopped") && strstr(out, "/b stopped"), "the tour:\n%s", out);
}
