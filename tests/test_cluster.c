/*
 * test_cluster.c - a cluster of shards (docs/shards.md): the map in every shard, the routing hash in SQL
 * and C, the shard's guard (PJQ01), ids that name their shard, and the PL/Proxy router.
 *
 * The shards and the router are databases of the test's own PostgreSQL (t_extra_db): PL/Proxy connects
 * to them by conninfo as it would to other servers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

/* A map of shards "sa" (number 0) and "sb" (number 1): owners is a string of P letters, 'a' or 'b',
 * the owner of each partition; extra is more members ("\"queues\": {...}, \"id_floor\": 5" or "").
 * Returns a static buffer. */
static const char *map_of(int epoch, const char *ci_a, const char *ci_b, const char *owners, const char *extra)
{
    static char buf[16384];
    int n = snprintf(buf, sizeof buf,
                     "{\"name\": \"test\", \"epoch\": %d, \"partitions\": %zu, \"shards\": {"
                     "\"sa\": {\"number\": 0, \"conninfo\": \"%s\"}, \"sb\": {\"number\": 1, \"conninfo\": \"%s\"}},"
                     " \"owners\": [",
                     epoch, strlen(owners), ci_a, ci_b);
    for (const char *o = owners; *o; o++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s\"s%c\"", o == owners ? "" : ", ", *o);
    snprintf(buf + n, sizeof buf - (size_t)n, "]%s%s}", extra[0] ? ", " : "", extra);
    return buf;
}

/* P letters, all 'a' then all 'b' from partition `from` on (static). */
static const char *split_at(int p, int from)
{
    static char buf[4097];
    for (int i = 0; i < p; i++)
        buf[i] = i < from ? 'a' : 'b';
    buf[p] = '\0';
    return buf;
}

/* pgjobq.cluster_set(map, self) on pg; returns its SQLSTATE ("" on success) and, in *msg (may be NULL),
 * its error message (malloc'd, "" on success). */
static char *cluster_set(PGconn *pg, const char *map, const char *self, char **msg)
{
    const char *values[2] = {map, self};
    PGresult *r = PQexecParams(pg, "SELECT pgjobq.cluster_set($1::jsonb, $2)", 2, NULL, values, NULL, NULL, 0);
    const char *state = PQresultStatus(r) == PGRES_TUPLES_OK ? "" : PQresultErrorField(r, PG_DIAG_SQLSTATE);
    char *out = strdup(state ? state : "?");
    if (msg)
        *msg = strdup(PQresultStatus(r) == PGRES_TUPLES_OK ? "" : PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY));
    PQclear(r);
    return out;
}

/* A queue name whose pinned partition (route_hash & (p - 1)) is `want`, into buf. */
static void queue_of_partition(char *buf, size_t size, int p, uint32_t want)
{
    for (int i = 0;; i++) {
        snprintf(buf, size, "q%d", i);
        if ((pgjobq__route_hash(buf, strlen(buf)) & (uint32_t)(p - 1)) == want)
            return;
    }
}

/* Checks that a query's one value (t_str) is want, and frees it. */
#define CHECK_SQL_STR(pg, want, ...)         \
    do {                                     \
        char *got_ = t_str(pg, __VA_ARGS__); \
        CHECK_STR(got_, want);               \
        free(got_);                          \
    } while (0)

/* FNV-1a's published vectors, and the SQL and the C of many keys (ASCII, multibyte UTF-8, long) agree. */
TEST(cluster_route_hash_is_fnv1a_in_sql_and_in_c)
{
    PGconn *pg = t_pg();
    static const struct {
        const char *key;
        uint32_t hash;
    } vectors[] = {{"", 0x811c9dc5u}, {"a", 0xe40c292cu}, {"foobar", 0xbf9cf968u}};

    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        CHECK_INT(pgjobq__route_hash(vectors[i].key, strlen(vectors[i].key)), vectors[i].hash);
        const char *values[1] = {vectors[i].key};
        PGresult *r = PQexecParams(pg, "SELECT pgjobq.route_hash($1)", 1, NULL, values, NULL, NULL, 0);
        CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
        CHECK_INT(strtoll(PQgetvalue(r, 0, 0), NULL, 10), vectors[i].hash);
        PQclear(r);
    }
    /* 300 keys, each compared. */
    char *sql = t_str(pg, "SELECT string_agg(k || '=' || pgjobq.route_hash(k), '\n' ORDER BY g) FROM"
                          " (SELECT g, CASE g %% 3 WHEN 0 THEN 'tenant-' || g WHEN 1 THEN 'é€𝄞-' || g"
                          " ELSE repeat('x', g) END AS k FROM generate_series(1, 300) g) s");
    int n = 0;
    for (char *line = strtok(sql, "\n"); line; line = strtok(NULL, "\n"), n++) {
        char *eq = strrchr(line, '=');
        CHECK(eq != NULL);
        CHECK_INT(pgjobq__route_hash(line, (size_t)(eq - line)), strtoll(eq + 1, NULL, 10));
    }
    CHECK_INT(n, 300);
    free(sql);
    /* NULL in, NULL out (STRICT). */
    CHECK_INT(t_int(pg, "SELECT (pgjobq.route_hash(NULL) IS NULL)::int"), 1);
    PQfinish(pg);
}

/* A database in no cluster has no guard and its ids step by one, as before: nothing is paid. */
TEST(cluster_a_database_without_a_map_is_unchanged)
{
    PGconn *pg = t_pg();

    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pgjobq.jobs'::regclass AND NOT tgisinternal"
                        " AND tgname NOT IN ('jobs_ready_stamp', 'jobs_lease_alarm')"),
              0);
    CHECK_INT(t_int(pg, "SELECT seqincrement FROM pg_sequence"
                        " WHERE seqrelid = pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass"),
              1);
    CHECK_INT(t_int(pg, "SELECT (pgjobq.cluster_map() IS NULL)::int"), 1);
    int64_t a = t_int(pg, "SELECT id FROM pgjobq.enqueue('q', route_key => 'tenant-1')");
    int64_t b = t_int(pg, "SELECT id FROM pgjobq.enqueue('q')");
    CHECK_INT(b, a + 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE route_key = 'tenant-1'"), 1);
    free(t_expect_error(pg, "55000", "SELECT pgjobq.route_partition('q')"));
    free(t_expect_error(pg, "55000", "SELECT pgjobq.route_job(1)"));
    PQfinish(pg);
}

/* Bad maps are refused with 22023 and the reason, and change nothing. */
TEST(cluster_set_refuses_a_bad_map_and_changes_nothing)
{
    PGconn *pg = t_pg();
    const char *ci = "host=/nowhere dbname=x";
    static const struct {
        const char *map;
        const char *why;
    } bad[] = {
        {"[]", "must be a JSON object"},
        {"{\"name\": \"t\", \"epoch\": 1, \"shard\": {}}", "unknown key \"shard\""},
        {"{\"name\": \"1t\", \"epoch\": 1}", "\"name\" must be a name"},
        {"{\"name\": \"t\", \"epoch\": \"1\"}", "\"epoch\" must be an integer"},
        {"{\"name\": \"t\", \"epoch\": 0}", "\"epoch\" must be an integer"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 3}", "power of two"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 8192}", "power of two"},
        {"{\"name\": \"t\", \"epoch\": 1, \"shards\": {}}", "at least one shard"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"a\": {\"number\": 1024, \"conninfo\": "
         "\"x\"}},"
         " \"owners\": [\"a\"]}",
         "\"number\" must be an integer from 0 to 1023"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"a\": {\"number\": 0, \"conninfo\":"
         " \"host=db password=secret\"}}, \"owners\": [\"a\"]}",
         "must not carry a password"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"a\": {\"number\": 0, \"conninfo\":"
         " \"postgresql://u:secret@db/x\"}}, \"owners\": [\"a\"]}",
         "must not carry a password"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"a\": {\"number\": 0, \"conninfo\":"
         " \"postgresql://db/x?sslmode=require&password=secret\"}}, \"owners\": [\"a\"]}",
         "must not carry a password"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"a\": {\"number\": 0, \"conninfo\": \"x\"},"
         " \"b\": {\"number\": 0, \"conninfo\": \"y\"}}, \"owners\": [\"a\"]}",
         "shards \"a\" and \"b\" have the same number, 0"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 2, \"shards\": {\"a\": {\"number\": 0, \"conninfo\": \"x\"}},"
         " \"owners\": [\"a\"]}",
         "\"owners\" must be an array of 2 shard names"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 2, \"shards\": {\"a\": {\"number\": 0, \"conninfo\": \"x\"}},"
         " \"owners\": [\"a\", \"c\"]}",
         "owners[1] is \"c\", which is no shard of the map"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"a\": {\"number\": 0, \"conninfo\": \"x\"}},"
         " \"owners\": [\"a\"], \"queues\": {\"q\": {\"placement\": \"spread\", \"partition\": 0}}}",
         "and only for a pinned queue"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"a\": {\"number\": 0, \"conninfo\": \"x\"}},"
         " \"owners\": [\"a\"], \"queues\": {\"q\": {\"placement\": \"pinned\", \"partition\": 1}}}",
         "\"partition\" must be an integer from 0 to 0"},
        {"{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"a\": {\"number\": 0, \"conninfo\": \"x\"}},"
         " \"owners\": [\"a\"], \"queues\": {\"q\": {\"placement\": \"everywhere\"}}}",
         "must be {\"placement\": \"pinned\"}"},
    };
    char *msg, *state;

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        state = cluster_set(pg, bad[i].map, "a", &msg);
        CHECK_MSG(strcmp(state, "22023") == 0 && strstr(msg, bad[i].why) != NULL, "map %s: %s %s (expected ...%s...)",
                  bad[i].map, state, msg, bad[i].why);
        free(state);
        free(msg);
    }
    /* A shard must name itself among the shards; a router (no jobs) is the one without a name. */
    state = cluster_set(pg, map_of(1, ci, ci, "ab", ""), NULL, &msg);
    CHECK_MSG(strcmp(state, "22023") == 0 && strstr(msg, "self must name one of the map's shards"), "%s", msg);
    free(state);
    free(msg);
    state = cluster_set(pg, map_of(1, ci, ci, "ab", ""), "sc", &msg);
    CHECK_MSG(strcmp(state, "22023") == 0 && strstr(msg, "not \"sc\""), "%s", msg);
    free(state);
    free(msg);
    CHECK_INT(t_int(pg, "SELECT (SELECT count(*) FROM pgjobq.cluster) + (SELECT count(*) FROM pgjobq.cluster_shards)"
                        " + (SELECT count(*) FROM pgjobq.cluster_owners)"),
              0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_trigger WHERE tgname = 'jobs_cluster_guard'"), 0);

    /* Installed; then against it: the epoch grows, the name, self and a shard's number stay, the
     * id floor does not go down. */
    t_cluster_install(pg, map_of(1, ci, ci, "ab", "\"id_floor\": 100"), "sa");
    CHECK_SQL_STR(pg, "sa", "SELECT pgjobq.cluster_map() ->> 'self'");
    CHECK_INT(t_int(pg, "SELECT jsonb_array_length(pgjobq.cluster_map() -> 'owners')"), 2);
    static const struct {
        const char *map;
        const char *self;
        const char *why;
    } against[] = {
        {"{\"name\": \"test\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"sa\": {\"number\": 0, \"conninfo\": "
         "\"x\"}},"
         " \"owners\": [\"sa\"], \"id_floor\": 100}",
         "sa", "the epoch must grow"},
        {"{\"name\": \"other\", \"epoch\": 2, \"partitions\": 1, \"shards\": {\"sa\": {\"number\": 0, \"conninfo\": "
         "\"x\"}},"
         " \"owners\": [\"sa\"], \"id_floor\": 100}",
         "sa", "is in cluster \"test\""},
        {"{\"name\": \"test\", \"epoch\": 2, \"partitions\": 1, \"shards\": {\"sa\": {\"number\": 0, \"conninfo\": "
         "\"x\"},"
         " \"sb\": {\"number\": 2, \"conninfo\": \"x\"}}, \"owners\": [\"sa\"], \"id_floor\": 100}",
         "sa", "shard \"sb\" has number 1"},
        {"{\"name\": \"test\", \"epoch\": 2, \"partitions\": 1, \"shards\": {\"sa\": {\"number\": 0, \"conninfo\": "
         "\"x\"},"
         " \"sb\": {\"number\": 1, \"conninfo\": \"x\"}}, \"owners\": [\"sb\"], \"id_floor\": 100}",
         "sb", "is shard \"sa\""},
        {"{\"name\": \"test\", \"epoch\": 2, \"partitions\": 1, \"shards\": {\"sa\": {\"number\": 0, \"conninfo\": "
         "\"x\"}},"
         " \"owners\": [\"sa\"], \"id_floor\": 99}",
         "sa", "the id floor must not go down"},
    };
    for (size_t i = 0; i < sizeof against / sizeof against[0]; i++) {
        state = cluster_set(pg, against[i].map, against[i].self, &msg);
        CHECK_MSG(strcmp(state, "22023") == 0 && strstr(msg, against[i].why) != NULL,
                  "map %s: %s %s (expected ...%s...)", against[i].map, state, msg, against[i].why);
        free(state);
        free(msg);
    }
    CHECK_INT(t_int(pg, "SELECT epoch FROM pgjobq.cluster"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.cluster_shards"), 2);
    /* A new map that grows the epoch replaces the old one. */
    t_cluster_install(
        pg, map_of(5, ci, ci, "bbbb", "\"id_floor\": 100, \"queues\": {\"t\": {\"placement\": \"spread\"}}"), "sa");
    CHECK_INT(t_int(pg, "SELECT epoch * 100 + partitions FROM pgjobq.cluster"), 504);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.cluster_owners WHERE shard = 'sb'"), 4);
    CHECK_SQL_STR(pg, "{\"placement\": \"spread\"}", "SELECT pgjobq.cluster_map() -> 'queues' ->> 't'");
    PQfinish(pg);
}

/* Once in a cluster, every way a job enters pgjobq.jobs is checked against the partitions the shard owns:
 * a job of a partition another shard owns fails its whole statement with PJQ01, which names the queue,
 * the partition, the owner and the epoch, and nothing of the statement is written. */
TEST(cluster_guard_refuses_a_job_of_a_partition_owned_elsewhere)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    char mine[16], theirs[16], sql[512], want[160], *msg;
    const int p = 8;

    queue_of_partition(mine, sizeof mine, p, 1);     /* partitions 0-3: this shard, sa */
    queue_of_partition(theirs, sizeof theirs, p, 6); /* 4-7: sb */
    /* A job finished before the cluster, of the queue that will be sb's, for the retry below. */
    int64_t old = t_int(pg, "SELECT id FROM pgjobq.enqueue('%s')", theirs);
    PQclear(t_exec(pg, "SELECT pgjobq.cancel(%lld)", (long long)old));
    PQclear(t_exec(pg, "SELECT pgjobq.schedule_set('tick', '* * * * *', 'UTC', '%s')", theirs));
    t_cluster_install(pg,
                      map_of(3, "host=/nowhere dbname=a", "host=/nowhere dbname=b", split_at(p, 4),
                             "\"id_floor\": 1000, \"queues\": {\"t\": {\"placement\": \"spread\"}, \"pinned6\":"
                             " {\"placement\": \"pinned\", \"partition\": 6}}"),
                      "sa");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_trigger WHERE tgname = 'jobs_cluster_guard'"), 1);
    long long before = t_int(pg, "SELECT count(*) FROM pgjobq.jobs");

    snprintf(want, sizeof want,
             "a job of queue \"%s\" is of partition 6, which shard \"sb\" owns in the map of epoch 3", theirs);
    /* enqueue, enqueue_many (a batch with a job of this shard's too: nothing of it), enqueue_graph. */
    snprintf(sql, sizeof sql, "SELECT pgjobq.enqueue('%s')", theirs);
    msg = t_expect_error(pg, "PJQ01", sql);
    CHECK_MSG(strstr(msg, want) && strstr(msg, "this shard (\"sa\")"), "%s", msg);
    free(msg);
    snprintf(sql, sizeof sql, "SELECT * FROM pgjobq.enqueue_many(ARRAY['%s', '%s'], NULL, NULL)", mine, theirs);
    msg = t_expect_error(pg, "PJQ01", sql);
    CHECK_MSG(strstr(msg, want), "%s", msg);
    free(msg);
    snprintf(sql, sizeof sql, "SELECT * FROM pgjobq.enqueue_graph('[{\"queue\": \"%s\"}, {\"queue\": \"%s\"}]')", mine,
             theirs);
    free(t_expect_error(pg, "PJQ01", sql));
    /* A queue pinned by the map to another shard's partition; a spread queue by its key (a key of
     * partition 6), and without a key (its own partition, as a pinned queue's). */
    free(t_expect_error(pg, "PJQ01", "SELECT pgjobq.enqueue('pinned6')"));
    char key[16];
    for (int i = 0;; i++) {
        snprintf(key, sizeof key, "k%d", i);
        if ((pgjobq__route_hash(key, strlen(key)) & (p - 1)) >= 4)
            break;
    }
    snprintf(sql, sizeof sql, "SELECT pgjobq.enqueue('t', route_key => '%s')", key);
    free(t_expect_error(pg, "PJQ01", sql));
    CHECK_INT(t_int(pg, "SELECT (pgjobq.route_partition('t', '%s') >= 4)::int", key), 1);
    /* The retry of a finished job, and a schedule's tick. */
    snprintf(sql, sizeof sql, "SELECT pgjobq.retry(%lld)", (long long)old);
    free(t_expect_error(pg, "PJQ01", sql));
    free(t_expect_error(pg, "PJQ01", "SELECT pgjobq.schedule_trigger('tick')"));
    /* COPY (the C library's path for large batches), 500 jobs of which one is another shard's. */
    pgjobq_job_spec *specs = calloc(600, sizeof *specs);
    int64_t *ids = calloc(600, sizeof *ids);
    CHECK(specs && ids);
    for (int i = 0; i < 600; i++)
        specs[i].opts.queue = i == 599 ? theirs : mine;
    CHECK_RC(c, pgjobq_enqueue_many(c, specs, 600, ids, NULL), PGJOBQ_EDB);
    CHECK_STR(pgjobq_sqlstate(c), "PJQ01");
    CHECK(strstr(pgjobq_errmsg(c), want) != NULL);

    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), before);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld", (long long)old), 1);

    /* This shard's own jobs go in, by every path; a spread queue's jobs by their keys. */
    for (int i = 0; i < 600; i++)
        specs[i].opts.queue = mine;
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 600, ids, NULL));
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 3, ids, NULL));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('%s')", mine));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.enqueue_graph('[{\"queue\": \"%s\"}]')", mine));
    for (int i = 0;; i++) {
        snprintf(key, sizeof key, "k%d", i);
        if ((pgjobq__route_hash(key, strlen(key)) & (p - 1)) < 4)
            break;
    }
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('t', route_key => '%s')", key));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), before + 600 + 3 + 3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't' AND route_key = '%s'", key), 1);

    /* A map that gives this shard every partition has nothing to refuse: the guard goes (its
     * statements cost what a database in no cluster's do), and comes back with the next map that gives
     * a partition to another shard. */
    t_cluster_install(
        pg, map_of(4, "host=/nowhere dbname=a", "host=/nowhere dbname=b", split_at(p, p), "\"id_floor\": 1000"), "sa");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_trigger WHERE tgname = 'jobs_cluster_guard'"), 0);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('%s')", theirs));
    t_cluster_install(
        pg, map_of(5, "host=/nowhere dbname=a", "host=/nowhere dbname=b", split_at(p, 4), "\"id_floor\": 1000"), "sa");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_trigger WHERE tgname = 'jobs_cluster_guard'"), 1);
    snprintf(sql, sizeof sql, "SELECT pgjobq.enqueue('%s')", theirs);
    free(t_expect_error(pg, "PJQ01", sql));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s'", theirs), 1);
    free(specs);
    free(ids);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* Ids: once in a cluster, each shard hands out ids that end in its number (id % 1024), above the map's
 * id floor, increasing; a database with jobs joins only when the floor covers its ids. */
TEST(cluster_ids_name_their_shard_and_never_meet)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), *msg, *state;
    PGconn *a = t_connect(ci_a), *b = t_connect(ci_b);
    pgjobq_client *ca = NULL;
    const char *owners = split_at(4, 2);

    /* sa has jobs (ids 1 to 5): a map whose floor is below them is refused, naming the highest. */
    PQclear(t_exec(a, "SELECT pgjobq.enqueue('q') FROM generate_series(1, 5)"));
    state = cluster_set(a, map_of(1, ci_a, ci_b, owners, ""), "sa", &msg);
    CHECK_MSG(strcmp(state, "22023") == 0 && strstr(msg, "handed out job ids up to 5"), "%s %s", state, msg);
    free(state);
    free(msg);
    CHECK_INT(t_int(a, "SELECT seqincrement FROM pg_sequence"
                       " WHERE seqrelid = pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass"),
              1);
    t_cluster_install(a, map_of(1, ci_a, ci_b, owners, "\"id_floor\": 5"), "sa");
    t_cluster_install(b, map_of(1, ci_a, ci_b, owners, "\"id_floor\": 5"), "sb");
    /* Installing a later map leaves the ids as they are. */
    t_cluster_install(a, map_of(2, ci_a, ci_b, owners, "\"id_floor\": 5"), "sa");
    t_cluster_install(b, map_of(2, ci_a, ci_b, owners, "\"id_floor\": 5"), "sb");

    char qa[16], qb[16];
    queue_of_partition(qa, sizeof qa, 4, 0);
    queue_of_partition(qb, sizeof qb, 4, 3);
    /* Through every way ids are drawn: enqueue, enqueue_many, enqueue_graph, reserve_ids and COPY. */
    CHECK_OK(ca, pgjobq_client_open(&ca, ci_a));
    pgjobq_job_spec specs[500];
    int64_t ids[500];
    memset(specs, 0, sizeof specs);
    for (int i = 0; i < 500; i++)
        specs[i].opts.queue = qa;
    CHECK_OK(ca, pgjobq_enqueue_many(ca, specs, 500, ids, NULL));
    for (int i = 0; i < 500; i++)
        CHECK_MSG(ids[i] % 1024 == 0 && ids[i] > 5 && (i == 0 || ids[i] > ids[i - 1]), "COPY's id %lld",
                  (long long)ids[i]);
    PQclear(t_exec(a, "SELECT pgjobq.enqueue('%s')", qa));
    PQclear(t_exec(a, "SELECT * FROM pgjobq.enqueue_many(ARRAY['%s', '%s'], NULL, NULL)", qa, qa));
    PQclear(t_exec(a, "SELECT * FROM pgjobq.enqueue_graph('[{\"queue\": \"%s\"}]')", qa));
    CHECK_INT(t_int(a, "SELECT count(*) FROM unnest(pgjobq.reserve_ids(10)) AS x WHERE x %% 1024 = 0"), 10);
    PQclear(t_exec(b, "SELECT pgjobq.enqueue('%s') FROM generate_series(1, 20)", qb));
    PQclear(t_exec(b, "SELECT * FROM pgjobq.enqueue_many(ARRAY['%s', '%s'], NULL, NULL)", qb, qb));

    /* Each shard's new ids end in its number, go up with each job, and are above the floor. */
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE id > 5 AND id %% 1024 <> 0"), 0);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE id > 5"), 504);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE id %% 1024 <> 1 OR id <= 5"), 0);
    CHECK_INT(t_int(b, "SELECT min(id) FROM pgjobq.jobs"), 1025);
    CHECK_INT(t_int(b, "SELECT count(*) FROM (SELECT id, lag(id) OVER (ORDER BY created_at, id) AS prev"
                       " FROM pgjobq.jobs) s WHERE prev >= id"),
              0);
    /* route_job names the shard from the id alone; an id of before the cluster names none. */
    int64_t id_b = t_int(b, "SELECT max(id) FROM pgjobq.jobs");
    CHECK_SQL_STR(a, "sb", "SELECT pgjobq.route_job(%lld)", (long long)id_b);
    CHECK_SQL_STR(b, "sa", "SELECT pgjobq.route_job(%lld)", (long long)ids[0]);
    CHECK_SQL_STR(a, "none", "SELECT coalesce(pgjobq.route_job(3), 'none')");
    /* No id is on both shards. */
    char *ids_a = t_str(a, "SELECT string_agg(id::text, ',') FROM pgjobq.jobs");
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE id = ANY ('{%s}'::bigint[])", ids_a), 0);
    free(ids_a);
    pgjobq_client_close(ca);
    PQfinish(a);
    PQfinish(b);
    free(ci_a);
    free(ci_b);
}

/* Two shards and a router: the router's migration; the map on all three; enqueue and enqueue_many
 * through the router land where route_partition says, and enqueue_many answers in the caller's order;
 * the reads span the shards; a map that moved a partition (epoch 2 on the shards, the router still at
 * 1) makes the router's enqueue of that partition fail with PJQ01 on its old owner, which writes
 * nothing; once the router has epoch 2, the job goes to the new owner. */
TEST_FULL(cluster_router_routes_enqueues_and_reads_over_the_shards, 120, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), *ci_r = t_extra_db("router", 0);
    PGconn *a = t_connect(ci_a), *b = t_connect(ci_b);
    pgjobq_client *c = NULL;
    int applied = -1;
    const int p = 64;
    const char *queues = "\"queues\": {\"t\": {\"placement\": \"spread\"}}";

    /* The router: made by pgjobq_migrate_router, again a no-op; a shard's migrate refuses it, and it
     * refuses a shard. */
    CHECK_RC(c, pgjobq_client_open(&c, ci_r), PGJOBQ_ESCHEMA);
    CHECK_OK(c, pgjobq_migrate_router(c, &applied));
    CHECK_INT(applied, 2);
    CHECK_OK(c, pgjobq_migrate_router(c, &applied));
    CHECK_INT(applied, 0);
    CHECK_RC(c, pgjobq_migrate(c, NULL), PGJOBQ_ESCHEMA);
    CHECK(strstr(pgjobq_errmsg(c), "is a pgjobq router") != NULL);
    pgjobq_client_close(c);
    CHECK_RC(c, pgjobq_client_open(&c, ci_a), PGJOBQ_OK);
    CHECK_RC(c, pgjobq_migrate_router(c, NULL), PGJOBQ_ESCHEMA);
    pgjobq_client_close(c);
    PGconn *r = t_connect(ci_r);
    CHECK_INT(t_int(r, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgjobq'"), 1);
    CHECK_INT(
        t_int(r, "SELECT (to_regclass('pgjobq.jobs') IS NULL AND to_regclass('pgjobq.schema_version') IS NULL)::int"),
        1);
    /* The router's map tables are a shard's, column for column and constraint for constraint. */
    static const char digest[] =
        "SELECT string_agg(x, E'\\n' ORDER BY x) FROM ("
        " SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull"
        "        || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') AS x"
        "   FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0"
        "   LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum"
        "  WHERE c.relnamespace = 'pgjobq'::regnamespace AND c.relname LIKE 'cluster%%' AND c.relkind = 'r'"
        " UNION ALL SELECT conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint"
        "  WHERE connamespace = 'pgjobq'::regnamespace AND conrelid IN (SELECT oid FROM pg_class"
        "        WHERE relname LIKE 'cluster%%')) s";
    char *shard_tables = t_str(a, digest), *router_tables = t_str(r, digest);
    CHECK(strstr(shard_tables, "cluster_owners_shard_fkey") != NULL);
    CHECK_STR(router_tables, shard_tables);
    free(shard_tables);
    free(router_tables);

    /* The map: partitions 0-31 on sa, 32-63 on sb, and a spread queue t. */
    t_cluster_install(a, map_of(1, ci_a, ci_b, split_at(p, 32), queues), "sa");
    t_cluster_install(b, map_of(1, ci_a, ci_b, split_at(p, 32), queues), "sb");
    t_cluster_install(r, map_of(1, ci_a, ci_b, split_at(p, 32), queues), NULL);
    CHECK_SQL_STR(r, "none", "SELECT coalesce(pgjobq.cluster_map() ->> 'self', 'none')");

    /* One job of each of 40 queues, and 40 of the spread queue by key, one at a time. */
    for (int i = 0; i < 40; i++) {
        PQclear(t_exec(r, "SELECT * FROM pgjobq.enqueue(queue => 'q%d', payload => '{\"i\": %d}')", i, i));
        PQclear(t_exec(r, "SELECT * FROM pgjobq.enqueue(queue => 't', route_key => 'tenant-%d')", i));
    }
    /* A batch of 200 over both shards: queues q0..q9 and keys tenant-0..tenant-99, each row's answer in
     * the caller's order. */
    PGresult *res = t_exec(r, "SELECT e.ord, e.id, e.duplicate FROM pgjobq.enqueue_many("
                              "  ARRAY(SELECT CASE WHEN g %% 2 = 0 THEN 'q' || g %% 10 ELSE 't' END"
                              "          FROM generate_series(1, 200) g),"
                              "  NULL,"
                              "  ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 200) g),"
                              "  route_keys => ARRAY(SELECT 'tenant-' || g %% 100 FROM generate_series(1, 200) g)) e");
    CHECK_INT(PQntuples(res), 200);
    long long on_a = 0, on_b = 0;
    for (int i = 0; i < 200; i++) {
        CHECK_INT(atoi(PQgetvalue(res, i, 0)), i + 1);
        CHECK_STR(PQgetvalue(res, i, 2), "f");
        long long id = strtoll(PQgetvalue(res, i, 1), NULL, 10);
        PGconn *owner = id % 1024 == 0 ? a : b;
        CHECK_INT(t_int(owner, "SELECT (payload->>'n')::int FROM pgjobq.jobs WHERE id = %lld", id), i + 1);
        *(id % 1024 == 0 ? &on_a : &on_b) += 1;
    }
    PQclear(res);
    CHECK_MSG(on_a > 20 && on_b > 20, "the batch went %lld to sa and %lld to sb", on_a, on_b);

    /* Every job is on the shard that owns its partition, by the shard's own route_partition. */
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs j JOIN pgjobq.cluster_owners o"
                       " ON o.partition = pgjobq.route_partition(j.queue, j.route_key) WHERE o.shard <> 'sa'"),
              0);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs j JOIN pgjobq.cluster_owners o"
                       " ON o.partition = pgjobq.route_partition(j.queue, j.route_key) WHERE o.shard <> 'sb'"),
              0);
    long long n_a = t_int(a, "SELECT count(*) FROM pgjobq.jobs"), n_b = t_int(b, "SELECT count(*) FROM pgjobq.jobs");
    CHECK_INT(n_a + n_b, 280);
    CHECK_MSG(n_a > 40 && n_b > 40, "sa has %lld jobs, sb %lld", n_a, n_b);

    /* The reads: counts summed over the shards (each shard once, though it owns 32 partitions), per
     * shard, and a job by its id alone. */
    CHECK_INT(t_int(r, "SELECT sum(jobs) FROM pgjobq.stats()"), 280);
    CHECK_INT(t_int(r, "SELECT jobs FROM pgjobq.stats() WHERE queue = 't' AND state = 'queued'"), 140);
    CHECK_INT(t_int(r, "SELECT sum(jobs) FROM pgjobq.shard_stats() WHERE shard = 'sa'"), n_a);
    CHECK_INT(t_int(r, "SELECT sum(jobs) FROM pgjobq.shard_stats() WHERE shard = 'sb'"), n_b);
    long long id_b = t_int(b, "SELECT max(id) FROM pgjobq.jobs"), id_a = t_int(a, "SELECT max(id) FROM pgjobq.jobs");
    char *job_b = t_str(b, "SELECT queue || ' queued' FROM pgjobq.jobs WHERE id = %lld", id_b);
    CHECK_SQL_STR(r, job_b, "SELECT queue || ' ' || state FROM pgjobq.monitor_job(%lld)", id_b);
    free(job_b);
    CHECK_INT(t_int(r, "SELECT count(*) FROM pgjobq.monitor_job(%lld)", id_a), 1);
    CHECK_INT(t_int(r, "SELECT count(*) FROM pgjobq.monitor_job(%lld)", id_a + 1024 * 1000), 0);

    /* cancel and retry of one job, on the shard that holds it, with the shard's answers; of a filter,
     * on every shard, summed. */
    CHECK_SQL_STR(r, "cancelled", "SELECT pgjobq.cancel(%lld)", id_b);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'cancelled'", id_b), 1);
    CHECK_SQL_STR(r, "already_cancelled", "SELECT pgjobq.cancel(%lld)", id_b);
    CHECK_SQL_STR(r, "queued", "SELECT pgjobq.retry(%lld)", id_b);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued'", id_b), 1);
    CHECK_SQL_STR(r, "not_found", "SELECT pgjobq.cancel(%lld)", id_a + 1024 * 1000);
    CHECK_SQL_STR(r, "not_found", "SELECT pgjobq.retry(%lld)", id_a + 1024 * 1000);
    CHECK_INT(t_int(r, "SELECT pgjobq.cancel_where('t', 'queued', dry_run => true)"), 140);
    CHECK_INT(t_int(r, "SELECT pgjobq.cancel_where('t', 'queued')"), 140);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'") +
                  t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'"),
              0);
    CHECK_SQL_STR(r, "140 0", "SELECT retried || ' ' || skipped FROM pgjobq.retry_where('t', 'cancelled')");
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'") +
                  t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'"),
              140);
    free(t_expect_error(r, "22023", "SELECT pgjobq.cancel_where('t', 'completed')"));

    /* An event, to every shard (a job waiting for it may be on any), the jobs it resumed summed. */
    char *qa = t_str(a, "SELECT min(queue) FROM pgjobq.jobs WHERE queue <> 't'");
    CHECK_SQL_STR(a, "parked",
                  "SELECT w.outcome FROM pgjobq.claim('%s', 1, '1 minute', 'w') c,"
                  " pgjobq.wait_event(c.id, c.lease_token, 'w', 'paid', 'r1', '1 hour') w",
                  qa);
    free(qa);
    CHECK_SQL_STR(r, "1", "SELECT resumed FROM pgjobq.send_event('paid', 'r1', '{\"r\": 1}')");
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.job_parks"), 0);

    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.events WHERE name = 'paid' AND key = 'r1'") +
                  t_int(b, "SELECT count(*) FROM pgjobq.events WHERE name = 'paid' AND key = 'r1'"),
              2);

    /* The map moves the partition of queue qm from sa to sb: epoch 2 on the shards, not yet on the
     * router, whose enqueue goes to sa, which refuses it: nothing written on either shard. */
    char qm[16], moved[65], want[200];
    queue_of_partition(qm, sizeof qm, p, 5);
    memcpy(moved, split_at(p, 32), sizeof moved);
    moved[5] = 'b';
    t_cluster_install(a, map_of(2, ci_a, ci_b, moved, queues), "sa");
    t_cluster_install(b, map_of(2, ci_a, ci_b, moved, queues), "sb");
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT * FROM pgjobq.enqueue('%s')", qm);
    char *msg = t_expect_error(r, "PJQ01", sql);
    snprintf(want, sizeof want,
             "a job of queue \"%s\" is of partition 5, which shard \"sb\" owns in the map of epoch 2", qm);
    CHECK_MSG(strstr(msg, want) != NULL, "%s", msg);
    free(msg);
    snprintf(sql, sizeof sql, "SELECT * FROM pgjobq.enqueue_many(ARRAY['%s', '%s'], NULL, NULL)", qm, qm);
    free(t_expect_error(r, "PJQ01", sql));
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s'", qm), 0);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s'", qm), 0);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs") + t_int(b, "SELECT count(*) FROM pgjobq.jobs"), 280);
    /* The router learns the map: the same call lands on sb. */
    t_cluster_install(r, map_of(2, ci_a, ci_b, moved, queues), NULL);
    long long id = t_int(r, "SELECT id FROM pgjobq.enqueue('%s')", qm);
    CHECK_INT(id % 1024, 1);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s' AND id = %lld", qm, id), 1);

    /* A unique key's conflict mode through the router: replace debounces the queued job on its shard. */
    long long dk = t_int(r, "SELECT id FROM pgjobq.enqueue('t', payload => '{\"v\": 1}', route_key => 'tenant-7',"
                            " unique_key => 'deb', on_conflict => 'replace')");
    CHECK_SQL_STR(r, "t", "SELECT duplicate FROM pgjobq.enqueue('t', payload => '{\"v\": 2}', route_key => 'tenant-7',"
                          " unique_key => 'deb', on_conflict => 'replace')");
    PGconn *owner = dk % 1024 == 0 ? a : b;
    CHECK_INT(t_int(owner, "SELECT (payload ->> 'v')::int FROM pgjobq.jobs WHERE id = %lld", dk), 2);
    /* A redrive through the router: each shard's dead letters of the queue go back. */
    PQclear(t_exec(owner, "SELECT pgjobq.queue_set('t', '{\"dead_letter\": \"t.dead\"}')"));
    CHECK_SQL_STR(owner, "failed",
                  "SELECT f.outcome FROM pgjobq.claim('t', 1, '1 minute', 'w') c,"
                  " pgjobq.fail_many(ARRAY[c.id], ARRAY[c.lease_token], ARRAY['boom'], permanent => ARRAY[true]) f");
    CHECK_INT(t_int(owner, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't.dead'"), 1);
    CHECK_SQL_STR(r, "1 0", "SELECT retried || ' ' || skipped FROM pgjobq.retry_where('t.dead', 'queued', redrive => true)");
    CHECK_INT(t_int(owner, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't.dead'"), 0);

    PQfinish(a);
    PQfinish(b);
    PQfinish(r);
    free(ci_a);
    free(ci_b);
    free(ci_r);
}

/* The roles: every role reads the map and routes, the admin installs a map, a producer cannot. */
TEST(cluster_functions_are_granted_to_the_roles)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();

    CHECK_OK(c, pgjobq_migrate_roles(c));
    static const char *const readers[] = {"pgjobq_producer", "pgjobq_worker", "pgjobq_admin", "pgjobq_monitor"};
    for (size_t i = 0; i < 4; i++)
        CHECK_INT(t_int(pg,
                        "SELECT (has_function_privilege('%s', 'pgjobq.cluster_map()', 'EXECUTE')"
                        " AND has_function_privilege('%s', 'pgjobq.route_partition(text, text)', 'EXECUTE')"
                        " AND has_function_privilege('%s', 'pgjobq.route_job(bigint)', 'EXECUTE')"
                        " AND has_table_privilege('%s', 'pgjobq.cluster_owners', 'SELECT'))::int",
                        readers[i], readers[i], readers[i], readers[i]),
                  1);
    CHECK_INT(
        t_int(pg, "SELECT has_function_privilege('pgjobq_admin', 'pgjobq.cluster_set(jsonb, text)', 'EXECUTE')::int"),
        1);
    CHECK_INT(t_int(pg, "SELECT has_function_privilege('pgjobq_producer', 'pgjobq.cluster_set(jsonb, text)', 'EXECUTE')"
                        "::int"),
              0);
    CHECK_INT(
        t_int(pg,
              "SELECT has_function_privilege('pgjobq_producer', 'pgjobq.enqueue(text, text, jsonb, smallint,"
              " timestamptz, interval, integer, text, text, bigint[], text[], text, text, text, interval, timestamptz,"
              " interval, text)', 'EXECUTE')"
              "::int"),
        1);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* The command: `pgjobq migrate --router` makes a router, and refuses a shard (with the reason and a
 * non-zero status); --roles goes with a shard only. */
TEST(cluster_cli_migrate_router)
{
    char *ci_r = t_extra_db("router", 0), *out = NULL, *err = NULL;

    int rc = t_cli(&out, &err, NULL, 0, "migrate", "--router", "--db", ci_r, NULL);
    CHECK_MSG(rc == 0 && strstr(out, "pgjobq router migrated (2 migrations applied)"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    rc = t_cli(&out, &err, NULL, 0, "migrate", "--router", "--db", ci_r, NULL);
    CHECK_MSG(rc == 0 && strstr(out, "pgjobq router is up to date"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    rc = t_cli(&out, &err, NULL, 0, "migrate", "--db", ci_r, NULL);
    CHECK_MSG(rc != 0 && strstr(err, "is a pgjobq router"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    rc = t_cli(&out, &err, NULL, 0, "migrate", "--router", NULL); /* the test's own database: a shard */
    CHECK_MSG(rc != 0 && strstr(err, "a router is a database of its own"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    rc = t_cli(&out, &err, NULL, 0, "migrate", "--router", "--roles", NULL);
    CHECK_MSG(rc == 64 && strstr(err, "--roles is for a shard"), "%d %s %s", rc, out, err);
    free(out);
    free(err);
    free(ci_r);
}

/* On a shard, a job of its queue that fails for good leaves its dead letter on that shard, in the
 * failing transaction, whichever shard the map gives the dead-letter queue's partition to: the guard
 * lets dead letters through (as the outbox's jobs), so a failure, or the rescue of a dead worker's job,
 * is never refused for where its copy goes (docs/shards.md). */
TEST(cluster_a_dead_letter_stays_on_the_shard_of_the_job_that_failed)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1);
    PGconn *a = t_connect(ci_a);
    pgjobq_client *c = NULL;
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job *jobs = NULL;
    pgjobq_state st;
    size_t n = 0;
    int64_t id = 0;
    char qa[16], qd[16];

    queue_of_partition(qa, sizeof qa, 4, 0); /* sa's */
    queue_of_partition(qd, sizeof qd, 4, 3); /* sb's */
    t_cluster_install(a, map_of(1, ci_a, ci_b, "aabb", ""), "sa");
    CHECK_RC(c, pgjobq_client_open(&c, ci_a), PGJOBQ_OK);
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, qa, qd));
    /* (A job of sb's queue is still refused here.) */
    o.queue = qd;
    CHECK_RC(c, pgjobq_enqueue(c, "{}", &o, &id), PGJOBQ_EDB);
    CHECK_STR(pgjobq_sqlstate(c), "PJQ01");

    o.queue = qa;
    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 1}", &o, &id));
    CHECK_OK(c, pgjobq_claim(c, qa, 1, 60000, "w", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_OK(c, pgjobq_job_fail(c, id, jobs[0].lease_token, "boom", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.dead_letters d JOIN pgjobq.jobs j ON j.id = d.id"
                       " WHERE d.original_id = %lld AND j.queue = '%s'",
                    (long long)id, qd),
              1);

    /* The rescue of a job whose last lease expired, the same. */
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 2}", &o, &id));
    CHECK_OK(c, pgjobq_claim(c, qa, 1, 60000, "w", &jobs, &n));
    CHECK_INT((long long)n, 1);
    pgjobq_jobs_free(jobs);
    PQclear(t_exec(a, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 second' WHERE id = %lld", (long long)id));
    int rescued = 0;
    CHECK_OK(c, pgjobq_rescue_expired(c, 100, &rescued));
    CHECK_INT(rescued, 1);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.dead_letters WHERE original_id = %lld", (long long)id), 1);
    pgjobq_client_close(c);
    PQfinish(a);
    free(ci_a);
    free(ci_b);
}
