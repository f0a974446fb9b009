/*
 * test_cluster_client.c - the C client over a cluster of shards (pgjobq_cluster_*, docs/shards.md):
 * routing equal to SQL's route_partition, a batch split over the shards, a stale map refused (PJQ01)
 * and read again, a shard that does not answer, and a database without a map as a direct client.
 *
 * The shards are databases of the test's own PostgreSQL (t_extra_db); a shard that is down is an
 * address that accepts connections and never answers (a listening socket nobody accepts on), which is
 * what a stopped or unreachable host costs a client: its connect timeout.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"

/* A map of shards "sa" (number 0) and "sb" (number 1); owners: P letters 'a' or 'b'; queues: the
 * "queues" member's object ("" for none).  Static buffer. */
static const char *map_of(int epoch, const char *ci_a, const char *ci_b, const char *owners, const char *queues)
{
    static char buf[16384];
    int n = snprintf(buf, sizeof buf,
                     "{\"name\": \"test\", \"epoch\": %d, \"partitions\": %zu, \"shards\": {"
                     "\"sa\": {\"number\": 0, \"conninfo\": \"%s\"}, \"sb\": {\"number\": 1, \"conninfo\": \"%s\"}},"
                     " \"owners\": [",
                     epoch, strlen(owners), ci_a, ci_b);
    for (const char *o = owners; *o; o++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s\"s%c\"", o == owners ? "" : ", ", *o);
    snprintf(buf + n, sizeof buf - (size_t)n, "], \"queues\": {%s}}", queues);
    return buf;
}

/* A queue name whose pinned partition is `want` of p, into buf. */
static void queue_of_partition(char *buf, size_t size, int p, uint32_t want)
{
    for (int i = 0;; i++) {
        snprintf(buf, size, "q%d", i);
        if ((pgjobq__route_hash(buf, strlen(buf)) & (uint32_t)(p - 1)) == want)
            return;
    }
}

/* The owner SQL gives a job of queue with key (NULL: none), by pg's map (malloc'd). */
static char *sql_owner(PGconn *pg, const char *queue, const char *key)
{
    const char *values[2] = {queue, key};
    PGresult *r = PQexecParams(pg,
                               "SELECT o.shard FROM pgjobq.cluster_owners o"
                               " WHERE o.partition = pgjobq.route_partition($1, $2)",
                               2, NULL, values, NULL, NULL, 0);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "route_partition: %s", PQerrorMessage(pg));
    char *out = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return out;
}

/* Whether every job of every queue of the cluster's map routes as SQL routes it on pg. */
static void check_routes_as_sql(pgjobq_cluster *cl, PGconn *pg)
{
    static const char *const keys[] = {NULL, "", "tenant-1", "Ærøskøbing", "北京", "a-long-key-of-tenants-0123456789"};
    char queue[32], key[32];

    for (int i = 0; i < 300; i++) {
        /* Queues the map lists (pinned, pinned to a partition, spread) and queues it does not. */
        snprintf(queue, sizeof queue, "%s", i % 4 == 0 ? "spread1" : i % 4 == 1 ? "pin3" : i % 4 == 2 ? "default" : "");
        if (queue[0] == '\0')
            snprintf(queue, sizeof queue, "q%d", i);
        const char *k = i < 6 ? keys[i] : key;
        snprintf(key, sizeof key, "k%d", i * 7919);
        for (int with_key = 0; with_key < 2; with_key++) {
            size_t s;
            const char *kk = with_key ? k : NULL;
            CHECK_OK(NULL, pgjobq_cluster_route(cl, queue, kk, &s));
            char *want = sql_owner(pg, queue, kk);
            CHECK_MSG(strcmp(pgjobq_cluster_shard_name(cl, s), want) == 0, "queue %s key %s: C says %s, SQL %s", queue,
                      kk ? kk : "(none)", pgjobq_cluster_shard_name(cl, s), want);
            free(want);
        }
    }
    /* NULL is the default queue. */
    size_t s1, s2;
    CHECK_OK(NULL, pgjobq_cluster_route(cl, NULL, NULL, &s1));
    CHECK_OK(NULL, pgjobq_cluster_route(cl, "default", NULL, &s2));
    CHECK_INT(s1, s2);
}

/* The client routes every job as pgjobq.route_partition does (pinned, pinned to a partition, spread
 * with and without keys, queues the map does not list, multibyte keys), with the map read from a shard
 * and from a JSON file; shard names, numbers, conninfos and epoch as the map says; ids route by their
 * number, and ids at most the floor to any shard. */
TEST(cluster_client_routes_as_route_partition)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1);
    PGconn *a = t_connect(ci_a);
    pgjobq_cluster *cl = NULL;
    const char *owners = "aabbabbbaaaabbab";

    t_cluster_install(
        a,
        map_of(4, ci_a, ci_b, owners,
               "\"spread1\": {\"placement\": \"spread\"}, \"pin3\": {\"placement\": \"pinned\", \"partition\": 3}"),
        "sa");
    PQclear(t_exec(a, "UPDATE pgjobq.cluster SET id_floor = 100"));
    CHECK_MSG(pgjobq_cluster_open(&cl, ci_a) == PGJOBQ_OK, "open: %s", pgjobq_cluster_errmsg(cl));
    CHECK_INT(pgjobq_cluster_epoch(cl), 4);
    CHECK_INT(pgjobq_cluster_shards(cl), 2);
    for (size_t i = 0; i < 2; i++) {
        const char *name = pgjobq_cluster_shard_name(cl, i);
        int sb = strcmp(name, "sb") == 0;
        CHECK(sb || strcmp(name, "sa") == 0);
        CHECK_INT(pgjobq_cluster_shard_number(cl, i), sb);
        CHECK_STR(pgjobq_cluster_shard_conninfo(cl, i), sb ? ci_b : ci_a);
    }
    CHECK(pgjobq_cluster_shard_name(cl, 2) == NULL);
    check_routes_as_sql(cl, a);

    size_t s;
    CHECK_OK(NULL, pgjobq_cluster_route_job(cl, 1024 * 5 + 1, &s));
    CHECK_STR(pgjobq_cluster_shard_name(cl, s), "sb");
    CHECK_OK(NULL, pgjobq_cluster_route_job(cl, 1024 * 5, &s));
    CHECK_STR(pgjobq_cluster_shard_name(cl, s), "sa");
    CHECK_OK(NULL, pgjobq_cluster_route_job(cl, 100, &s));
    CHECK(s == PGJOBQ_SHARD_ANY);
    CHECK_INT(pgjobq_cluster_route_job(cl, 1024 * 5 + 7, &s), PGJOBQ_ENOTFOUND);
    CHECK_INT(pgjobq_cluster_route_job(cl, 0, &s), PGJOBQ_EINVAL);
    CHECK_INT(pgjobq_cluster_route(cl, "bad name!", NULL, &s), PGJOBQ_EINVAL);
    pgjobq_cluster_close(cl);

    /* The same map from a file (what cluster_map() returns). */
    char path[4096];
    snprintf(path, sizeof path, "%s/map.json", t_tmpdir());
    char *json = t_str(a, "SELECT pgjobq.cluster_map()::text");
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(json, f) >= 0 && fclose(f) == 0);
    free(json);
    char spec[4200];
    snprintf(spec, sizeof spec, "file:%s", path);
    cl = NULL;
    CHECK_MSG(pgjobq_cluster_open(&cl, spec) == PGJOBQ_OK, "open %s: %s", spec, pgjobq_cluster_errmsg(cl));
    CHECK_INT(pgjobq_cluster_epoch(cl), 4);
    check_routes_as_sql(cl, a);
    pgjobq_cluster_close(cl);
    cl = NULL;
    CHECK_INT(pgjobq_cluster_open(&cl, path), PGJOBQ_OK);
    pgjobq_cluster_close(cl);

    /* A file that is not a map, or not there: EINVAL and why. */
    f = fopen(path, "w");
    CHECK(f && fputs("{\"epoch\": 1, \"shards\": {}}", f) >= 0 && fclose(f) == 0);
    cl = NULL;
    CHECK_INT(pgjobq_cluster_open(&cl, path), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_cluster_errmsg(cl), "\"shards\" must name 1 to 1024 shards"), "%s",
              pgjobq_cluster_errmsg(cl));
    pgjobq_cluster_close(cl);
    cl = NULL;
    snprintf(spec, sizeof spec, "%s/none.json", t_tmpdir());
    CHECK_INT(pgjobq_cluster_open(&cl, spec), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_cluster_errmsg(cl), "none.json"), "%s", pgjobq_cluster_errmsg(cl));
    pgjobq_cluster_close(cl);
    PQfinish(a);
    free(ci_a);
    free(ci_b);
}

/* A batch over two shards: each job lands on its owner (checked in each database, by id, queue and
 * key), ids in the caller's order, each id ending in its shard's number; single enqueues too; the
 * shards' clients are the cluster's (one per shard). */
TEST(cluster_client_batch_lands_each_job_on_its_owner)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1);
    PGconn *a = t_connect(ci_a), *b = t_connect(ci_b);
    const char *owners = "aaaabbbb";
    const char *queues = "\"t\": {\"placement\": \"spread\"}";
    pgjobq_cluster *cl = NULL;
    enum { N = 300 };
    static pgjobq_job_spec specs[N];
    static char qnames[N][16], keys[N][16];
    int64_t ids[N];
    unsigned char dups[N];

    t_cluster_install(a, map_of(1, ci_a, ci_b, owners, queues), "sa");
    t_cluster_install(b, map_of(1, ci_a, ci_b, owners, queues), "sb");
    CHECK_MSG(pgjobq_cluster_open(&cl, ci_b) == PGJOBQ_OK, "open: %s", pgjobq_cluster_errmsg(cl));
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "tenant%d", i % 37);
        if (i % 3 == 0) {
            snprintf(qnames[i], sizeof qnames[i], "t");
            specs[i].opts.route_key = keys[i];
        } else
            queue_of_partition(qnames[i], sizeof qnames[i], 8, (uint32_t)(i % 8));
        specs[i].opts.queue = qnames[i];
        specs[i].payload = "{\"n\": 1}";
    }
    CHECK_MSG(pgjobq_cluster_enqueue_many(cl, specs, N, ids, dups) == PGJOBQ_OK, "enqueue_many: %s",
              pgjobq_cluster_errmsg(cl));
    int on_a = 0;
    for (int i = 0; i < N; i++) {
        char *owner = sql_owner(a, qnames[i], specs[i].opts.route_key);
        int is_a = strcmp(owner, "sa") == 0;
        on_a += is_a;
        CHECK_MSG(ids[i] > 0 && ids[i] % 1024 == (is_a ? 0 : 1), "job %d: id %lld, owner %s", i, (long long)ids[i],
                  owner);
        CHECK_INT(dups[i], 0);
        PGconn *own = is_a ? a : b, *other = is_a ? b : a;
        CHECK_INT(t_int(own, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND queue = '%s' AND %s",
                        (long long)ids[i], qnames[i], i % 3 == 0 ? "route_key IS NOT NULL" : "route_key IS NULL"),
                  1);
        CHECK_INT(t_int(other, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld", (long long)ids[i]), 0);
        free(owner);
    }
    CHECK_MSG(on_a > 0 && on_a < N, "all %d jobs on one shard", on_a);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs"), on_a);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs"), N - on_a);

    /* One job at a time, and a batch of one queue (written as it is, in one statement on its shard). */
    int64_t id;
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.queue = qnames[1];
    CHECK_OK(NULL, pgjobq_cluster_enqueue(cl, "{}", &o, &id));
    char *owner = sql_owner(a, qnames[1], NULL);
    CHECK_INT(
        t_int(strcmp(owner, "sa") == 0 ? a : b, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld", (long long)id), 1);
    free(owner);
    for (int i = 0; i < 10; i++)
        specs[i].opts = o;
    CHECK_OK(NULL, pgjobq_cluster_enqueue_many(cl, specs, 10, ids, NULL));
    /* A bad job: EINVAL, named, nothing written. */
    long long before = t_int(a, "SELECT count(*) FROM pgjobq.jobs") + t_int(b, "SELECT count(*) FROM pgjobq.jobs");
    specs[3].payload = "{not json";
    CHECK_INT(pgjobq_cluster_enqueue_many(cl, specs, 10, ids, NULL), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_cluster_errmsg(cl), "shard s") && strstr(pgjobq_cluster_errmsg(cl), "job 3"), "%s",
              pgjobq_cluster_errmsg(cl));
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs") + t_int(b, "SELECT count(*) FROM pgjobq.jobs"), before);
    /* Each shard's client is opened once and kept. */
    pgjobq_client *c1, *c2;
    CHECK_OK(NULL, pgjobq_cluster_client(cl, 0, &c1));
    CHECK_OK(NULL, pgjobq_cluster_client(cl, 0, &c2));
    CHECK(c1 == c2);
    CHECK_INT(pgjobq_cluster_client(cl, 2, &c1), PGJOBQ_EINVAL);
    CHECK(c1 == NULL);
    pgjobq_cluster_close(cl);
    PQfinish(a);
    PQfinish(b);
    free(ci_a);
    free(ci_b);
}

/* A stale map: the client holds epoch 1; then epoch 2 moves a queue's partition (and epoch 3 a spread
 * queue's key's) from sa to sb in both shards.  The old owner refuses with PJQ01, the client reads the
 * map again and writes to the new owner; nothing lands on sa. */
TEST(cluster_client_reads_a_stale_map_again_on_pjq01)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1);
    PGconn *a = t_connect(ci_a), *b = t_connect(ci_b);
    pgjobq_cluster *cl = NULL;
    const char *queues = "\"t\": {\"placement\": \"spread\"}";
    char qa[16], qc[16], key[16];

    queue_of_partition(qa, sizeof qa, 4, 1); /* moves at epoch 2 */
    queue_of_partition(qc, sizeof qc, 4, 0); /* stays on sa */
    for (int i = 0;; i++) {
        snprintf(key, sizeof key, "k%d", i);
        if ((pgjobq__route_hash(key, strlen(key)) & 3) == 2)
            break;
    }
    t_cluster_install(a, map_of(1, ci_a, ci_b, "aaab", queues), "sa");
    t_cluster_install(b, map_of(1, ci_a, ci_b, "aaab", queues), "sb");
    CHECK_MSG(pgjobq_cluster_open(&cl, ci_a) == PGJOBQ_OK, "open: %s", pgjobq_cluster_errmsg(cl));
    CHECK_INT(pgjobq_cluster_epoch(cl), 1);
    pgjobq_client *ca;
    CHECK_OK(NULL, pgjobq_cluster_client(cl, 0, &ca)); /* sa connected: it is asked first */

    t_cluster_install(b, map_of(2, ci_a, ci_b, "abab", queues), "sb");
    t_cluster_install(a, map_of(2, ci_a, ci_b, "abab", queues), "sa");
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.queue = qa;
    int64_t id;
    CHECK_MSG(pgjobq_cluster_enqueue(cl, "{}", &o, &id) == PGJOBQ_OK, "enqueue: %s", pgjobq_cluster_errmsg(cl));
    CHECK_INT(pgjobq_cluster_epoch(cl), 2);
    CHECK_INT(id % 1024, 1);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND queue = '%s'", (long long)id, qa), 1);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs"), 0);

    /* A batch: sa's part stays (qc), the moved part (a spread queue's key) is refused and goes to sb. */
    t_cluster_install(b, map_of(3, ci_a, ci_b, "abbb", queues), "sb");
    t_cluster_install(a, map_of(3, ci_a, ci_b, "abbb", queues), "sa");
    pgjobq_job_spec specs[6];
    int64_t ids[6];
    memset(specs, 0, sizeof specs);
    for (int i = 0; i < 6; i++) {
        specs[i].opts.queue = i % 2 ? "t" : qc;
        specs[i].opts.route_key = i % 2 ? key : NULL;
    }
    CHECK_MSG(pgjobq_cluster_enqueue_many(cl, specs, 6, ids, NULL) == PGJOBQ_OK, "enqueue_many: %s",
              pgjobq_cluster_errmsg(cl));
    CHECK_INT(pgjobq_cluster_epoch(cl), 3);
    for (int i = 0; i < 6; i++) {
        CHECK_INT(ids[i] % 1024, i % 2);
        CHECK_INT(t_int(i % 2 ? b : a, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld", (long long)ids[i]), 1);
    }
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't' OR queue = '%s'", qa), 0);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs"), 3);

    /* pgjobq_cluster_reload reads the map again itself; a map of a lower epoch is not taken. */
    t_cluster_install(a, map_of(4, ci_a, ci_b, "aaaa", queues), "sa");
    CHECK_OK(NULL, pgjobq_cluster_reload(cl));
    CHECK_INT(pgjobq_cluster_epoch(cl), 4);
    size_t s;
    CHECK_OK(NULL, pgjobq_cluster_route(cl, qa, NULL, &s));
    CHECK_STR(pgjobq_cluster_shard_name(cl, s), "sa");
    pgjobq_cluster_close(cl);

    /* Opened on a router that holds an older map (epoch 3: the spread key's partition on sb, the
     * shards now at 5 with it on sa): the job goes to sb, is refused there (PJQ01), and the map read
     * from sb (epoch 5) sends it to sa. */
    char *ci_r = t_extra_db("router", 0);
    pgjobq_client *rc = NULL;
    CHECK_RC(rc, pgjobq_client_open(&rc, ci_r), PGJOBQ_ESCHEMA);
    CHECK_OK(rc, pgjobq_migrate_router(rc, NULL));
    pgjobq_client_close(rc);
    PGconn *r = t_connect(ci_r);
    const char *values[1] = {map_of(3, ci_a, ci_b, "abbb", queues)};
    PGresult *res = PQexecParams(r, "SELECT pgjobq.cluster_set($1::jsonb, NULL)", 1, NULL, values, NULL, NULL, 0);
    CHECK_MSG(PQresultStatus(res) == PGRES_TUPLES_OK, "router: %s", PQerrorMessage(r));
    PQclear(res);
    t_cluster_install(a, map_of(5, ci_a, ci_b, "aaaa", queues), "sa");
    t_cluster_install(b, map_of(5, ci_a, ci_b, "aaaa", queues), "sb");
    cl = NULL;
    CHECK_MSG(pgjobq_cluster_open(&cl, ci_r) == PGJOBQ_OK, "open the router: %s", pgjobq_cluster_errmsg(cl));
    CHECK_INT(pgjobq_cluster_epoch(cl), 3);
    CHECK_INT(pgjobq_cluster_shards(cl), 2);
    o.queue = "t";
    o.route_key = key;
    CHECK_MSG(pgjobq_cluster_enqueue(cl, "{}", &o, &id) == PGJOBQ_OK, "enqueue: %s", pgjobq_cluster_errmsg(cl));
    CHECK_INT(pgjobq_cluster_epoch(cl), 5);
    CHECK_INT(id % 1024, 0);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND route_key = '%s'", (long long)id, key), 1);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'"), 3); /* the batch's, nothing more */
    pgjobq_cluster_close(cl);
    PQfinish(r);
    free(ci_r);
    PQfinish(a);
    PQfinish(b);
    free(ci_a);
    free(ci_b);
}

static int listener = -1;

static void close_listener(void)
{
    if (listener >= 0)
        close(listener);
}

/* One shard does not answer (connections to it are accepted by the kernel and never served: a host
 * that is down or cut off costs the same, its connect timeout).  Jobs of the other shard are written,
 * before and after; jobs of the silent shard fail with ECONN naming it, after the default connect
 * timeout (the conninfo sets none), not forever; a batch over both writes the live shard's part and
 * gives 0 for the others' ids. */
TEST_FULL(cluster_client_a_shard_that_is_down_fails_alone, 120, 0)
{
    char *ci_a = t_extra_db("sa", 1), ci_b[128];
    PGconn *a = t_connect(ci_a);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    char qa[16], qb[16];

    listener = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(listener >= 0);
    t_defer(close_listener);
    CHECK(bind(listener, (struct sockaddr *)&addr, sizeof addr) == 0);
    CHECK(listen(listener, 64) == 0);
    CHECK(getsockname(listener, (struct sockaddr *)&addr, &len) == 0);
    snprintf(ci_b, sizeof ci_b, "host=127.0.0.1 port=%d dbname=b sslmode=disable", ntohs(addr.sin_port));
    t_cluster_install(a, map_of(1, ci_a, ci_b, "aabb", ""), "sa");
    queue_of_partition(qa, sizeof qa, 4, 0);
    queue_of_partition(qb, sizeof qb, 4, 3);

    pgjobq_cluster *cl = NULL;
    CHECK_MSG(pgjobq_cluster_open(&cl, ci_a) == PGJOBQ_OK, "open: %s", pgjobq_cluster_errmsg(cl));
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id;
    o.queue = qa;
    CHECK_OK(NULL, pgjobq_cluster_enqueue(cl, "{}", &o, &id));
    o.queue = qb;
    int64_t t0 = t_now_ms();
    CHECK_INT(pgjobq_cluster_enqueue(cl, "{}", &o, &id), PGJOBQ_ECONN);
    int64_t took = t_now_ms() - t0;
    CHECK_INT(id, 0);
    CHECK_MSG(strncmp(pgjobq_cluster_errmsg(cl), "shard sb: ", 10) == 0 && strstr(pgjobq_cluster_errmsg(cl), "timeout"),
              "%s", pgjobq_cluster_errmsg(cl));
    /* It gave up by its connect timeout: not at once (it waited), and not never (a generous bound). */
    CHECK_MSG(took < 10 * PGJOBQ_CLUSTER_CONNECT_TIMEOUT_S * 1000, "took %lld ms", (long long)took);
    o.queue = qa;
    CHECK_OK(NULL, pgjobq_cluster_enqueue(cl, "{}", &o, &id));
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs"), 2);

    /* A batch over both: sa's part written, sb's ids 0, the error names sb. */
    pgjobq_job_spec specs[4];
    int64_t ids[4];
    memset(specs, 0, sizeof specs);
    for (int i = 0; i < 4; i++)
        specs[i].opts.queue = i % 2 ? qb : qa;
    CHECK_INT(pgjobq_cluster_enqueue_many(cl, specs, 4, ids, NULL), PGJOBQ_ECONN);
    CHECK_MSG(strstr(pgjobq_cluster_errmsg(cl), "shard sb: ") && !strstr(pgjobq_cluster_errmsg(cl), "shard sa"), "%s",
              pgjobq_cluster_errmsg(cl));
    for (int i = 0; i < 4; i++) {
        if (i % 2)
            CHECK_INT(ids[i], 0);
        else
            CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld", (long long)ids[i]), 1);
    }
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs"), 4);
    pgjobq_cluster_close(cl);
    PQfinish(a);
    free(ci_a);
}

/* A database without a map is a cluster of one shard: that database, on the connection the cluster
 * was opened on (one session), ids as a direct client's (the next of one sequence). */
TEST(cluster_client_a_database_without_a_map_is_a_direct_client)
{
    pgjobq_cluster *cl = NULL;
    pgjobq_client *c = t_client(), *cc;
    PGconn *pg = t_pg();
    int64_t id1, id2, id3, ids[3];

    CHECK_MSG(pgjobq_cluster_open(&cl, t_conninfo()) == PGJOBQ_OK, "open: %s", pgjobq_cluster_errmsg(cl));
    CHECK_INT(pgjobq_cluster_shards(cl), 1);
    CHECK_INT(pgjobq_cluster_epoch(cl), 0);
    CHECK_STR(pgjobq_cluster_shard_name(cl, 0), t_dbname());
    CHECK_STR(pgjobq_cluster_shard_conninfo(cl, 0), t_conninfo());
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id1));
    CHECK_OK(NULL, pgjobq_cluster_enqueue(cl, "{}", NULL, &id2));
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id3));
    CHECK_INT(id2, id1 + 1);
    CHECK_INT(id3, id2 + 1);
    pgjobq_job_spec specs[3];
    memset(specs, 0, sizeof specs);
    specs[1].opts.queue = "other";
    CHECK_OK(NULL, pgjobq_cluster_enqueue_many(cl, specs, 3, ids, NULL));
    CHECK_INT(ids[0], id3 + 1);
    CHECK_INT(ids[2], id3 + 3);
    size_t s;
    CHECK_OK(NULL, pgjobq_cluster_route_job(cl, 7, &s));
    CHECK_INT(s, 0);
    CHECK_OK(NULL, pgjobq_cluster_route(cl, "x", "k", &s));
    CHECK_INT(s, 0);
    /* One connection: the cluster's shard client is the one it opened on. */
    CHECK_OK(NULL, pgjobq_cluster_client(cl, 0, &cc));
    int pid = PQbackendPID(pgjobq_client_conn(cc));
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'pgjobq' AND pid <> pg_backend_pid() AND pid <> %d",
                    PQbackendPID(pgjobq_client_conn(c))),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_stat_activity WHERE pid = %d", pid), 1);
    CHECK_OK(NULL, pgjobq_cluster_reload(cl));
    CHECK_INT(pgjobq_cluster_shards(cl), 1);
    pgjobq_cluster_close(cl);

    /* A database that cannot be reached: ECONN, the password never in the message. */
    cl = NULL;
    CHECK_INT(pgjobq_cluster_open(&cl, "postgresql://u:s3cret@127.0.0.1:1/x?connect_timeout=2"), PGJOBQ_ECONN);
    CHECK_MSG(!strstr(pgjobq_cluster_errmsg(cl), "s3cret") && pgjobq_cluster_errmsg(cl)[0], "%s",
              pgjobq_cluster_errmsg(cl));
    pgjobq_cluster_close(cl);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* The command over a cluster (--cluster, $PGJOBQ_CLUSTER): enqueue (one job, a --file) writes to the
 * owner; show, cancel and retry find the job on its shard from its id; stats and list span the
 * shards with a shard column; a shard that is down is reported as down while the others answer, and
 * exit status 69 only when none answers. */
TEST_FULL(cluster_client_cli_routes_over_the_shards, 120, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), *out = NULL, *err = NULL;
    PGconn *a = t_connect(ci_a), *b = t_connect(ci_b);
    char qa[16], qb[16];

    t_cluster_install(a, map_of(1, ci_a, ci_b, "aabb", "\"t\": {\"placement\": \"spread\"}"), "sa");
    t_cluster_install(b, map_of(1, ci_a, ci_b, "aabb", "\"t\": {\"placement\": \"spread\"}"), "sb");
    queue_of_partition(qa, sizeof qa, 4, 0);
    queue_of_partition(qb, sizeof qb, 4, 3);

    /* One job, to sb, through sa's map. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--cluster", ci_a, "--queue", qb, "{\"x\": 1}", NULL), 0);
    long long id_b = strtoll(out, NULL, 10);
    CHECK_MSG(id_b % 1024 == 1, "%s %s", out, err);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND queue = '%s'", id_b, qb), 1);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs"), 0);
    free(out);
    free(err);
    /* A spread queue's job by its key; $PGJOBQ_CLUSTER instead of the option. */
    char key[16];
    for (int i = 0;; i++) {
        snprintf(key, sizeof key, "k%d", i);
        if ((pgjobq__route_hash(key, strlen(key)) & 3) < 2)
            break;
    }
    CHECK(setenv("PGJOBQ_CLUSTER", ci_b, 1) == 0);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "t", "--route-key", key, NULL), 0);
    CHECK_INT(
        t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND route_key = '%s'", strtoll(out, NULL, 10), key),
        1);
    free(out);
    free(err);
    CHECK(unsetenv("PGJOBQ_CLUSTER") == 0);
    /* A file of jobs: to the queue's shard, ids in order. */
    const char *lines = "{\"n\": 1}\n{\"n\": 2}\n{\"n\": 3}\n";
    CHECK_INT(t_cli(&out, &err, lines, strlen(lines), "enqueue", "--cluster", ci_b, "--queue", qa, "--file", "-", NULL),
              0);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s'", qa), 3);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s'", qa), 0);
    long long id_a = strtoll(out, NULL, 10);
    CHECK_INT(id_a % 1024, 0);
    free(out);
    free(err);

    /* show and cancel by id, each on its shard. */
    char id_s[32];
    snprintf(id_s, sizeof id_s, "%lld", id_b);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--cluster", ci_a, id_s, NULL), 0);
    CHECK_MSG(strstr(out, qb) && strstr(out, "\"x\": 1") && strstr(out, "\nshard:         sb\n"), "%s", out);
    free(out);
    free(err);
    /* An id at most the map's floor (from before the cluster) is looked for on every shard. */
    PQclear(t_exec(a, "UPDATE pgjobq.cluster SET id_floor = 1000000"));
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--cluster", ci_a, "--json", id_s, NULL), 0);
    CHECK_MSG(strstr(out, "\"shard\":\"sb\"") && strstr(out, qb), "%s", out);
    free(out);
    free(err);
    PQclear(t_exec(a, "UPDATE pgjobq.cluster SET id_floor = 0"));
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cancel", "--cluster", ci_a, id_s, NULL), 0);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %s AND state = 'cancelled'", id_s), 1);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "--cluster", ci_a, id_s, NULL), 0);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE id = %s AND state = 'queued'", id_s), 1);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--cluster", ci_a, "99999", NULL), 65); /* 99999 % 1024: no shard */
    free(out);
    free(err);
    /* A filter acts on every shard, the counts summed. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cancel", "--cluster", ci_a, "--queue", qa, "--state", "queued", NULL), 0);
    CHECK_MSG(strstr(out, "cancelled 3 queued jobs of queue"), "%s %s", out, err);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = '%s' AND state = 'cancelled'", qa), 3);
    free(out);
    free(err);
    CHECK_INT(
        t_cli(&out, &err, NULL, 0, "retry", "--cluster", ci_a, "--queue", qa, "--state", "cancelled", "--json", NULL),
        0);
    CHECK_STR(out, "{\"retried\":3,\"skipped\":0,\"dry_run\":false}\n");
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s' AND state = 'queued'", qa), 3);
    free(out);
    free(err);

    /* stats and list span both shards. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--cluster", ci_a, NULL), 0);
    CHECK_MSG(strstr(out, "SHARD") && strstr(out, "sa ") && strstr(out, "sb ") && strstr(out, qa) && strstr(out, qb),
              "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--json", "--cluster", ci_a, NULL), 0);
    CHECK_MSG(strstr(out, "\"shard\":\"sb\",\"queue\":\"") && strstr(out, "\"total\":{\"queued\":5,"), "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "list", "--cluster", ci_a, "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"shard\":\"sa\"") && strstr(out, "\"shard\":\"sb\""), "%s", out);
    free(out);
    free(err);

    /* sb down (an address nothing listens on): stats and list print sa's and say sb is down. */
    t_cluster_install(a, map_of(2, ci_a, "host=127.0.0.1 port=1 dbname=b", "aabb", ""), "sa");
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--cluster", ci_a, NULL), 0);
    CHECK_MSG(strstr(out, qa) && !strstr(out, qb) && strstr(err, "shard sb: down ("), "%s / %s", out, err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "list", "--cluster", ci_a, NULL), 0);
    CHECK_MSG(strstr(out, qa) && strstr(err, "shard sb: down ("), "%s / %s", out, err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--cluster", ci_a, "--queue", qb, NULL), 69);
    CHECK_MSG(strstr(err, "shard sb: "), "%s", err);
    free(out);
    free(err);
    /* A change by filter while a shard is down: the others' counts, then 69 (not every shard was told). */
    CHECK_INT(
        t_cli(&out, &err, NULL, 0, "cancel", "--cluster", ci_a, "--queue", qa, "--state", "queued", "--dry-run", NULL),
        69);
    CHECK_MSG(strstr(out, "would cancel 3 queued jobs") && strstr(err, "shard sb: down ("), "%s / %s", out, err);
    free(out);
    free(err);
    /* Every shard down: 69. */
    char path[4096],
        *json = t_str(a, "SELECT replace(pgjobq.cluster_map()::text, '%s', 'host=127.0.0.1 port=1')", ci_a);
    snprintf(path, sizeof path, "%s/down.json", t_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(json, f) >= 0 && fclose(f) == 0);
    free(json);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "stats", "--cluster", path, NULL), 69);
    CHECK_MSG(strstr(err, "shard sa: down (") && strstr(err, "shard sb: down ("), "%s", err);
    free(out);
    free(err);
    PQfinish(a);
    PQfinish(b);
    free(ci_a);
    free(ci_b);
}

/* `pgjobq bench enqueue --cluster SPEC` routes its jobs through the cluster client (a smoke run of a
 * few hundred jobs, on a cluster of one shard and on two), and says so; other scenarios refuse it. */
TEST(cluster_client_bench_enqueue_through_the_cluster)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), *out = NULL, *err = NULL;
    PGconn *a = t_connect(ci_a), *b = t_connect(ci_b);

    /* A database without a map: a cluster of one shard, this one. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "enqueue", "--jobs", "300", "--batch", "100", "--json", "--cluster",
                    t_conninfo(), NULL),
              0);
    CHECK_MSG(strstr(out, "\"jobs\":300,") && strstr(out, "\"path\":\"cluster\",\"shards\":1}"), "%s %s", out, err);
    free(out);
    free(err);
    PGconn *pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'bench'"), 300);
    PQfinish(pg);
    /* Two shards: queue "bench" lives on its owner. */
    char owners[5];
    for (int p = 0; p < 4; p++)
        owners[p] = (pgjobq__route_hash("bench", 5) & 3) == (uint32_t)p ? 'b' : 'a';
    owners[4] = '\0';
    t_cluster_install(a, map_of(1, ci_a, ci_b, owners, ""), "sa");
    t_cluster_install(b, map_of(1, ci_a, ci_b, owners, ""), "sb");
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", ci_b, "bench", "enqueue", "--jobs", "200", "--batch", "50",
                    "--cluster", ci_a, NULL),
              0);
    CHECK_MSG(strstr(out, "routed by the cluster client"), "%s %s", out, err);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'bench'"), 200);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs"), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "bench", "drain", "--cluster", ci_a, NULL), 64);
    free(out);
    free(err);
    PQfinish(a);
    PQfinish(b);
    free(ci_a);
    free(ci_b);
}

/* Parks one job of queue q on client c waiting for the event ("paid", key); returns its id. */
static int64_t park_for_event(pgjobq_client *c, const char *q, const char *key)
{
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t id = 0;
    char *payload = NULL;
    o.queue = q;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    CHECK_OK(c, pgjobq_claim(c, q, 1, 60000, "w", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, id);
    CHECK_RC(c, pgjobq_job_wait_event(c, id, jobs[0].lease_token, "w", "paid", key, 3600000, &payload), PGJOBQ_PARKED);
    CHECK(payload == NULL);
    pgjobq_jobs_free(jobs);
    return id;
}

/* The resumed job id of queue q, claimed again: its wait answers the event's payload (want); then it
 * completes. */
static void resumed_with(pgjobq_client *c, const char *q, int64_t id, const char *key, const char *want)
{
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    char *payload = NULL;
    CHECK_OK(c, pgjobq_claim(c, q, 1, 60000, "w", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, id);
    CHECK_OK(c, pgjobq_job_wait_event(c, id, jobs[0].lease_token, "w", "paid", key, 3600000, &payload));
    CHECK_STR(payload, want);
    pgjobq_free(payload);
    CHECK_OK(c, pgjobq_job_complete(c, id, jobs[0].lease_token, NULL));
    pgjobq_jobs_free(jobs);
}

/* How many jobs of pg wait for ("paid", key), parked. */
static long long waiting_for(PGconn *pg, const char *key)
{
    return t_int(pg, "SELECT count(*) FROM pgjobq.job_parks p JOIN pgjobq.jobs j ON j.id = p.job_id"
                     " WHERE p.event_name = 'paid' AND p.event_key = '%s' AND j.run_at > now()",
                 key);
}

/* A job waiting for an event may be on any shard: the cluster's send reaches every one, from C, the
 * command and (python/tests) Python; a shard that is down does not keep the others from it, and is
 * named; a bad event reaches none. */
TEST_FULL(cluster_client_an_event_reaches_the_waiting_jobs_of_every_shard, 120, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1);
    PGconn *a = t_connect(ci_a), *b = t_connect(ci_b);
    char qa[16], qb[16];
    pgjobq_client *ca, *cb;
    int resumed = -1;

    t_cluster_install(a, map_of(1, ci_a, ci_b, "aabb", ""), "sa");
    t_cluster_install(b, map_of(1, ci_a, ci_b, "aabb", ""), "sb");
    queue_of_partition(qa, sizeof qa, 4, 0);
    queue_of_partition(qb, sizeof qb, 4, 3);
    pgjobq_cluster *cl = NULL;
    CHECK_MSG(pgjobq_cluster_open(&cl, ci_a) == PGJOBQ_OK, "open: %s", pgjobq_cluster_errmsg(cl));
    CHECK_OK(NULL, pgjobq_cluster_client(cl, 0, &ca));
    CHECK_OK(NULL, pgjobq_cluster_client(cl, 1, &cb));

    int64_t ja = park_for_event(ca, qa, "k1"), jb = park_for_event(cb, qb, "k1");
    CHECK_INT(waiting_for(a, "k1") + waiting_for(b, "k1"), 2);
    CHECK_MSG(pgjobq_cluster_send_event(cl, "paid", "k1", "{\"n\": 1}", &resumed) == PGJOBQ_OK, "%s",
              pgjobq_cluster_errmsg(cl));
    CHECK_INT(resumed, 2);
    CHECK_INT(waiting_for(a, "k1") + waiting_for(b, "k1"), 0);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND run_at <= now()",
                    (long long)ja),
              1);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND run_at <= now()",
                    (long long)jb),
              1);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.events WHERE name = 'paid' AND key = 'k1' AND payload = '{\"n\": 1}'"),
              1);
    resumed_with(ca, qa, ja, "k1", "{\"n\": 1}");
    resumed_with(cb, qb, jb, "k1", "{\"n\": 1}");

    /* The command, the same. */
    ja = park_for_event(ca, qa, "k2");
    jb = park_for_event(cb, qb, "k2");
    char *out = NULL, *err = NULL;
    CHECK_INT(t_cli(&out, &err, NULL, 0, "send-event", "--cluster", ci_a, "paid", "k2", "--payload", "{}", NULL), 0);
    CHECK_MSG(strcmp(out, "2\n") == 0, "%s %s", out, err);
    free(out);
    free(err);
    CHECK_INT(waiting_for(a, "k2") + waiting_for(b, "k2"), 0);
    resumed_with(ca, qa, ja, "k2", "{}");
    resumed_with(cb, qb, jb, "k2", "{}");

    /* A bad name reaches no shard. */
    CHECK_INT(pgjobq_cluster_send_event(cl, "", "k9", NULL, &resumed), PGJOBQ_EINVAL);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.events WHERE key = 'k9'") +
                  t_int(b, "SELECT count(*) FROM pgjobq.events WHERE key = 'k9'"),
              0);
    pgjobq_cluster_close(cl);

    /* sb down (nothing listens where the map now says it is): sa still takes the event, sb is named,
     * and the command exits 69 saying so. */
    t_cluster_install(a, map_of(2, ci_a, "host=127.0.0.1 port=1 dbname=b sslmode=disable", "aabb", ""), "sa");
    CHECK_MSG(pgjobq_cluster_open(&cl, ci_a) == PGJOBQ_OK, "open: %s", pgjobq_cluster_errmsg(cl));
    CHECK_OK(NULL, pgjobq_cluster_client(cl, 0, &ca));
    ja = park_for_event(ca, qa, "k3");
    CHECK_INT(pgjobq_cluster_send_event(cl, "paid", "k3", NULL, &resumed), PGJOBQ_ECONN);
    CHECK_INT(resumed, 1);
    CHECK_MSG(strncmp(pgjobq_cluster_errmsg(cl), "shard sb: ", 10) == 0 && !strstr(pgjobq_cluster_errmsg(cl), "shard sa"),
              "%s", pgjobq_cluster_errmsg(cl));
    CHECK_INT(waiting_for(a, "k3"), 0);
    resumed_with(ca, qa, ja, "k3", "null");
    park_for_event(ca, qa, "k4");
    CHECK_INT(t_cli(&out, &err, NULL, 0, "send-event", "--cluster", ci_a, "paid", "k4", NULL), 69);
    CHECK_MSG(strstr(err, "shard sb") != NULL && strstr(err, "send it again") != NULL && out[0] == '\0', "%s %s", out,
              err);
    free(out);
    free(err);
    CHECK_INT(waiting_for(a, "k4"), 0);
    pgjobq_cluster_close(cl);
    PQfinish(a);
    PQfinish(b);
    free(ci_a);
    free(ci_b);
}
