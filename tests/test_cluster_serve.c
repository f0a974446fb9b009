/*
 * test_cluster_serve.c - `pgjobq serve --cluster SPEC` (docs/shards.md, "Seeing it"; docs/serve.md):
 * /metrics over every shard of a map, each series labelled shard="NAME", pgjobq_shard_up per shard;
 * a shard whose server is stopped (-m immediate) shows pgjobq_shard_up 0 and nothing else, while the
 * other shard's series go on and the scrape answers 200; the shard's series come back with its server.
 * Without --cluster the exposition has no shard label at all.
 *
 * Two shards are two databases of the test's server, or (for the stopped shard) a second server.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"

/* A map of shards "sa" (number 0) and "sb" (number 1) over 4 partitions, 0-1 owned by sa and 2-3 by
 * sb.  Static buffer. */
static const char *map_of(const char *ci_a, const char *ci_b)
{
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"name\": \"test\", \"epoch\": 1, \"partitions\": 4, \"shards\": {"
             "\"sa\": {\"number\": 0, \"conninfo\": \"%s\"}, \"sb\": {\"number\": 1, \"conninfo\": \"%s\"}},"
             " \"owners\": [\"sa\", \"sa\", \"sb\", \"sb\"], \"queues\": {}}",
             ci_a, ci_b);
    return buf;
}

static void install(const char *conninfo, const char *map, const char *self)
{
    PGconn *pg = t_connect(conninfo);
    t_cluster_install(pg, map, self);
    PQfinish(pg);
}

/* A queue name whose pinned partition (of 4) is `want`, into buf. */
static void queue_of_partition(char *buf, size_t size, uint32_t want)
{
    for (int i = 0;; i++) {
        snprintf(buf, size, "q%d", i);
        if ((pgjobq__route_hash(buf, strlen(buf)) & 3u) == want)
            return;
    }
}

/* Enqueues n jobs of queue on the shard at conninfo, directly. */
static void enqueue_on(const char *conninfo, const char *queue, int n)
{
    pgjobq_client *c = NULL;
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id;

    CHECK_MSG(pgjobq_client_open(&c, conninfo) == PGJOBQ_OK, "open: %s", pgjobq_errmsg(c));
    o.queue = queue;
    for (int i = 0; i < n; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    pgjobq_client_close(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* The server under test and HTTP. */

static pid_t server = -1;
static const char *server_log;

static void stop_server(void)
{
    if (server > 0) {
        pid_t pid = server;
        server = -1;
        kill(pid, SIGTERM);
        int status = t_wait_exit(pid, 10000);
        if (status == -1)
            kill(pid, SIGKILL);
        if (status != 0) {
            t_show_log(server_log);
            t_fail(__FILE__, __LINE__, "pgjobq serve ended with status %d after SIGTERM", status);
        }
    }
}

/* Starts `pgjobq serve --listen 127.0.0.1:0 --interval 200ms` with env (may be NULL) and up to three
 * more arguments; returns the port it prints. */
static int serve_start(const char *env, const char *a1, const char *a2, const char *a3)
{
    static int n;
    char name[32];
    snprintf(name, sizeof name, "serve%d", n++);
    stop_server();
    server_log = t_log_path(name);
    server = t_spawn(server_log, env, "serve", "--listen", "127.0.0.1:0", "--interval", "200ms", a1, a2, a3, NULL);
    t_defer(stop_server);
    int64_t t0 = t_now_ms();
    for (;;) {
        struct stat st;
        if (stat(server_log, &st) == 0) {
            char *log = t_read_file(server_log);
            const char *p = strstr(log, "listening on http://127.0.0.1:");
            int port = p ? atoi(p + strlen("listening on http://127.0.0.1:")) : 0;
            free(log);
            if (port > 0)
                return port;
        }
        if (t_now_ms() - t0 > 15000) {
            t_show_log(server_log);
            t_fail(__FILE__, __LINE__, "pgjobq serve did not start");
        }
        usleep(50000);
    }
}

/* A request over HTTP/1.0 (form: a POST of it, from this server's own page); returns the status, the
 * body in *body (malloc'd). */
static int request(int port, const char *path, const char *form, char **body)
{
    struct sockaddr_in sa;
    char req[2048];
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    CHECK(fd >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_MSG(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect to port %d", port);
    int n = form ? snprintf(req, sizeof req,
                            "POST %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nOrigin: http://127.0.0.1:%d\r\n"
                            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %zu\r\n\r\n%s",
                            path, port, port, strlen(form), form)
                 : snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n", path, port);
    CHECK(n > 0 && (size_t)n < sizeof req);
    CHECK(write(fd, req, (size_t)n) == n);
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    CHECK(buf != NULL);
    for (;;) {
        if (len + 4096 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            CHECK(buf != NULL);
        }
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    buf[len] = '\0';
    close(fd);
    int status = 0;
    CHECK_MSG(sscanf(buf, "HTTP/%*s %d", &status) == 1, "no status line in: %.200s", buf);
    char *b = strstr(buf, "\r\n\r\n");
    *body = strdup(b ? b + 4 : "");
    free(buf);
    return status;
}

static int get(int port, const char *path, char **body)
{
    return request(port, path, NULL, body);
}

/* The value of a series (exact name and labels), or -1 when absent. */
static double metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

/* Waits until the series has the value want (15 s at most); returns the last scrape (malloc'd). */
static char *wait_metric(int port, const char *series, double want)
{
    int64_t t0 = t_now_ms();
    for (;;) {
        char *body = NULL;
        int status = get(port, "/metrics", &body);
        CHECK_MSG(status == 200, "/metrics answered %d: %.300s", status, body);
        double have = metric(body, series);
        if (have == want)
            return body;
        free(body);
        if (t_now_ms() - t0 > 15000) {
            t_show_log(server_log);
            t_fail(__FILE__, __LINE__, "%s is %g after 15 s, expected %g", series, have, want);
        }
        usleep(100000);
    }
}

/* Every series line of text: how many there are, and how many carry no shard label first. */
static void count_series(const char *text, int *series, int *unlabelled)
{
    *series = *unlabelled = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (*p == '#' || *p == '\n')
            continue;
        (*series)++;
        const char *brace = strchr(p, '{'), *space = strchr(p, ' ');
        if (brace == NULL || (space && space < brace) || strncmp(brace, "{shard=\"", 8) != 0)
            (*unlabelled)++;
    }
}

/* How many series lines of text carry the label shard="name". */
static int series_of_shard(const char *text, const char *name)
{
    char want[64];
    int n = 0;
    snprintf(want, sizeof want, "{shard=\"%s\"", name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *end = strchr(p, '\n');
        const char *at = strstr(p, want);
        if (*p != '#' && at && (end == NULL || at < end))
            n++;
    }
    return n;
}

static void promtool_check(const char *text)
{
    char path[512], cmd[1100];
    snprintf(path, sizeof path, "%s/metrics.txt", t_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s > %s.out 2>&1", path, path);
    int rc = system(cmd);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "%s.out", path);
        t_show_log(cmd);
    }
    CHECK_MSG(rc == 0, "promtool check metrics failed (status %d)", rc);
}

/* ------------------------------------------------------------------------------------------------ */

/* Two shards of one server: each one's queues under its own label, every series labelled, the
 * exposition valid for promtool; the same database served without --cluster has no shard label. */
TEST_FULL(cluster_serve_metrics_label_every_series_by_shard, 90, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), qa[16], qb[16], series[128];
    int n, unlabelled;

    install(ci_a, map_of(ci_a, ci_b), "sa");
    install(ci_b, map_of(ci_a, ci_b), "sb");
    queue_of_partition(qa, sizeof qa, 1);
    queue_of_partition(qb, sizeof qb, 2);
    enqueue_on(ci_a, qa, 3);
    enqueue_on(ci_b, qb, 2);

    int port = serve_start(NULL, "--cluster", ci_a, NULL);
    snprintf(series, sizeof series, "pgjobq_jobs{shard=\"sa\",queue=\"%s\",state=\"queued\"}", qa);
    free(wait_metric(port, series, 3));
    snprintf(series, sizeof series, "pgjobq_jobs{shard=\"sb\",queue=\"%s\",state=\"queued\"}", qb);
    char *text = wait_metric(port, series, 2);
    CHECK(metric(text, "pgjobq_shard_up{shard=\"sa\"}") == 1);
    CHECK(metric(text, "pgjobq_shard_up{shard=\"sb\"}") == 1);
    CHECK(metric(text, "pgjobq_up{shard=\"sb\"}") == 1);
    /* Each queue on its own shard only. */
    snprintf(series, sizeof series, "pgjobq_jobs{shard=\"sa\",queue=\"%s\",state=\"queued\"}", qb);
    CHECK(metric(text, series) == -1);
    snprintf(series, sizeof series, "pgjobq_jobs{shard=\"sb\",queue=\"%s\",state=\"queued\"}", qa);
    CHECK(metric(text, series) == -1);
    count_series(text, &n, &unlabelled);
    CHECK_MSG(n > 20 && unlabelled == 0, "%d of %d series without a shard label:\n%s", unlabelled, n, text);
    promtool_check(text);
    free(text);

    /* A map that cannot be read: refused at start, saying why. */
    char *o = NULL, *e = NULL;
    int rc = t_cli(&o, &e, NULL, 0, "serve", "--listen", "127.0.0.1:0", "--cluster", "/nonexistent/map.json", NULL);
    CHECK_MSG(rc != 0 && strstr(e, "cluster") != NULL, "status %d, stderr: %s", rc, e);
    free(o);
    free(e);

    /* One database, no cluster: no shard label, no pgjobq_shard_up. */
    char db[900];
    snprintf(db, sizeof db, "PGJOBQ_DATABASE_URL=%s", ci_b);
    port = serve_start(db, NULL, NULL, NULL);
    snprintf(series, sizeof series, "pgjobq_jobs{queue=\"%s\",state=\"queued\"}", qb);
    text = wait_metric(port, series, 2);
    CHECK(strstr(text, "shard") == NULL);
    CHECK(metric(text, "pgjobq_up") == 1);
    free(text);
    stop_server();
    free(ci_a);
    free(ci_b);
}

/* Enqueues one job of queue on the shard at conninfo, directly; returns its id. */
static int64_t one_on(const char *conninfo, const char *queue)
{
    pgjobq_client *c = NULL;
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id = 0;

    CHECK_MSG(pgjobq_client_open(&c, conninfo) == PGJOBQ_OK, "open: %s", pgjobq_errmsg(c));
    o.queue = queue;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    pgjobq_client_close(c);
    return id;
}

/* The dashboard over two shards: the overview lists each queue with its shard; a job's page is found
 * on its shard by id; a shard's page (?shard=) shows that shard's jobs and keeps the shard in its
 * links; an unknown shard is 404; an action goes to the shard holding the job. */
TEST_FULL(cluster_serve_dashboard_spans_every_shard, 90, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), qa[16], qb[16], path[128], want[256];
    char *body = NULL;

    install(ci_a, map_of(ci_a, ci_b), "sa");
    install(ci_b, map_of(ci_a, ci_b), "sb");
    queue_of_partition(qa, sizeof qa, 1);
    queue_of_partition(qb, sizeof qb, 2);
    int64_t id_a = one_on(ci_a, qa), id_b = one_on(ci_b, qb);
    CHECK_INT(id_a % 1024, 0);
    CHECK_INT(id_b % 1024, 1);

    int port = serve_start(NULL, "--cluster", ci_a, NULL);
    CHECK_INT(get(port, "/", &body), 200);
    snprintf(want, sizeof want, "data-shard=\"sa\" data-queue=\"%s\"", qa);
    CHECK_MSG(strstr(body, want) != NULL, "no row of %s on sa in:\n%s", qa, body);
    snprintf(want, sizeof want, "data-shard=\"sb\" data-queue=\"%s\"", qb);
    CHECK_MSG(strstr(body, want) != NULL, "no row of %s on sb in:\n%s", qb, body);
    CHECK(strstr(body, "shards-down") == NULL);
    free(body);

    /* A job's page, by id, on its shard. */
    snprintf(path, sizeof path, "/jobs/%lld", (long long)id_b);
    CHECK_INT(get(port, path, &body), 200);
    CHECK_MSG(strstr(body, qb) != NULL, "job %lld's page does not name its queue %s:\n%s", (long long)id_b, qb, body);
    free(body);

    /* A shard's jobs page. */
    CHECK_INT(get(port, "/jobs?shard=sb", &body), 200);
    snprintf(want, sizeof want, "href=\"/jobs/%lld\"", (long long)id_b);
    CHECK_MSG(strstr(body, want) != NULL, "sb's jobs page has no link to job %lld:\n%s", (long long)id_b, body);
    snprintf(want, sizeof want, "href=\"/jobs/%lld\"", (long long)id_a);
    CHECK(strstr(body, want) == NULL);
    CHECK(strstr(body, "href=\"/queues?shard=sb\"") != NULL);
    CHECK(strstr(body, "name=\"shard\" value=\"sb\"") != NULL);
    free(body);
    CHECK_INT(get(port, "/queues?shard=nope", &body), 404);
    free(body);
    stop_server();

    /* Cancel sb's job from its page: done on sb. */
    port = serve_start(NULL, "--allow-actions", "--cluster", ci_a);
    snprintf(path, sizeof path, "/jobs/%lld", (long long)id_b);
    CHECK_INT(get(port, path, &body), 200);
    const char *at = strstr(body, "name=\"csrf\" value=\"");
    CHECK_MSG(at != NULL, "no action form on job %lld's page:\n%s", (long long)id_b, body);
    char csrf[65], form[256];
    snprintf(csrf, sizeof csrf, "%.64s", at + strlen("name=\"csrf\" value=\""));
    free(body);
    snprintf(form, sizeof form, "csrf=%s&op=cancel&id=%lld&back=%%2Fjobs", csrf, (long long)id_b);
    int status = request(port, "/actions", form, &body);
    CHECK_MSG(status == 303, "cancel answered %d: %s", status, body);
    free(body);
    PGconn *b = t_connect(ci_b);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'cancelled'", (long long)id_b),
              1);
    PQfinish(b);
    stop_server();
    free(ci_a);
    free(ci_b);
}

static pid_t worker = -1;

static void stop_worker(void)
{
    if (worker > 0) {
        kill(worker, SIGKILL);
        t_wait_exit(worker, 10000);
        worker = -1;
    }
}

/* `pgjobq work --cluster --metrics-listen`: every engine's counters, each labelled with its shard,
 * counting that shard's jobs. */
TEST_FULL(cluster_work_metrics_listen_labels_each_engine_by_shard, 90, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), qa[16], qb[16];
    const char *log = t_log_path("worker");
    const char *handler = t_script("handler.sh", "#!/bin/sh\ncat > /dev/null\n");
    int n, unlabelled, port = 0;

    install(ci_a, map_of(ci_a, ci_b), "sa");
    install(ci_b, map_of(ci_a, ci_b), "sb");
    queue_of_partition(qa, sizeof qa, 1);
    queue_of_partition(qb, sizeof qb, 2);
    worker = t_spawn(log, NULL, "work", "--cluster", ci_a, "--queue", qa, "--queue", qb, "--exec", handler,
                     "--metrics-listen", "127.0.0.1:0", NULL);
    t_defer(stop_worker);
    server_log = log;
    for (int64_t t0 = t_now_ms(); port == 0;) {
        struct stat st;
        if (stat(log, &st) == 0) {
            char *text = t_read_file(log);
            const char *p = strstr(text, "metrics at http://127.0.0.1:");
            port = p ? atoi(p + strlen("metrics at http://127.0.0.1:")) : 0;
            free(text);
        }
        if (port == 0 && t_now_ms() - t0 > 15000) {
            t_show_log(log);
            t_fail(__FILE__, __LINE__, "the worker did not say where its metrics are");
        }
        if (port == 0)
            usleep(50000);
    }
    enqueue_on(ci_a, qa, 3);
    enqueue_on(ci_b, qb, 2);
    free(wait_metric(port, "pgjobq_worker_completed_total{shard=\"sa\"}", 3));
    char *text = wait_metric(port, "pgjobq_worker_completed_total{shard=\"sb\"}", 2);
    CHECK(metric(text, "pgjobq_worker_completed_total{shard=\"sa\"}") == 3);
    CHECK(metric(text, "pgjobq_worker_claimed_total{shard=\"sb\"}") == 2);
    char series[128];
    snprintf(series, sizeof series, "pgjobq_worker_slots{shard=\"sb\",queue=\"%s\"}", qa);
    CHECK(metric(text, series) >= 1);
    count_series(text, &n, &unlabelled);
    CHECK_MSG(n > 20 && unlabelled == 0, "%d of %d series without a shard label:\n%s", unlabelled, n, text);
    promtool_check(text);
    free(text);
    kill(worker, SIGTERM);
    CHECK_INT(t_wait_exit(worker, 30000), 0);
    worker = -1;
    free(ci_a);
    free(ci_b);
}

/* Shard sb's server stopped (-m immediate) under `serve` ($PGJOBQ_CLUSTER): pgjobq_shard_up{shard="sb"}
 * 0 and no other sb series, sa's series still there and counting, every scrape 200; the overview
 * names sb as down and still shows sa's queues, sb's pages say it is down; sb's series come back once
 * its server is back. */
TEST_FULL(cluster_serve_shows_a_stopped_shard_as_down, 120, 0)
{
    char *ci_a = t_extra_db("sa", 1), ci_b[800], qa[16], qb[16], series[128], env[900];

    t_server2_start(ci_b, sizeof ci_b);
    install(ci_a, map_of(ci_a, ci_b), "sa");
    install(ci_b, map_of(ci_a, ci_b), "sb");
    queue_of_partition(qa, sizeof qa, 1);
    queue_of_partition(qb, sizeof qb, 2);
    enqueue_on(ci_a, qa, 1);
    enqueue_on(ci_b, qb, 2);

    snprintf(env, sizeof env, "PGJOBQ_CLUSTER=%s", ci_a);
    int port = serve_start(env, NULL, NULL, NULL);
    snprintf(series, sizeof series, "pgjobq_jobs{shard=\"sb\",queue=\"%s\",state=\"queued\"}", qb);
    free(wait_metric(port, series, 2));

    CHECK_INT(t_server2_ctl("-m", "immediate", "stop"), 0);
    char *text = wait_metric(port, "pgjobq_shard_up{shard=\"sb\"}", 0);
    CHECK_MSG(series_of_shard(text, "sb") == 1, "shard sb is down, yet:\n%s", text);
    CHECK(metric(text, "pgjobq_shard_up{shard=\"sa\"}") == 1);
    free(text);
    /* sa goes on: a job enqueued there now is counted. */
    enqueue_on(ci_a, qa, 1);
    snprintf(series, sizeof series, "pgjobq_jobs{shard=\"sa\",queue=\"%s\",state=\"queued\"}", qa);
    text = wait_metric(port, series, 2);
    CHECK(metric(text, "pgjobq_shard_up{shard=\"sb\"}") == 0);
    CHECK(series_of_shard(text, "sb") == 1);
    promtool_check(text);
    free(text);

    /* The dashboard: the overview names sb as down and shows sa's queue; sb's own pages say it is down. */
    char *body = NULL, want[128];
    CHECK_INT(get(port, "/", &body), 200);
    CHECK_MSG(strstr(body, "data-shard-down=\"sb\"") && strstr(body, "id=\"shards-down\""),
              "the overview does not show sb down:\n%s", body);
    snprintf(want, sizeof want, "data-shard=\"sa\" data-queue=\"%s\"", qa);
    CHECK_MSG(strstr(body, want) != NULL, "no row of %s on sa in:\n%s", qa, body);
    free(body);
    CHECK_INT(get(port, "/jobs?shard=sb", &body), 503);
    CHECK_MSG(strstr(body, "id=\"shard-down\" data-shard=\"sb\"") != NULL, "sb's page:\n%s", body);
    free(body);
    CHECK_INT(get(port, "/jobs?shard=sa", &body), 200);
    free(body);

    CHECK_INT(t_server2_ctl("start", NULL, NULL), 0);
    free(wait_metric(port, "pgjobq_shard_up{shard=\"sb\"}", 1));
    snprintf(series, sizeof series, "pgjobq_jobs{shard=\"sb\",queue=\"%s\",state=\"queued\"}", qb);
    free(wait_metric(port, series, 2));
    stop_server();
    free(ci_a);
}

/* The map read again while serving (--map-reload): a shard that joins the cluster (epoch 2, a third
 * database) gets its series in /metrics, its queues on the overview and its jobs' pages, without a
 * restart; the log says the epoch. */
TEST_FULL(cluster_serve_follows_the_map_as_a_shard_joins, 90, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1), *ci_c = t_extra_db("sc", 1);
    char qc[16], series[128], want[256], path[64], env[1000], *body = NULL;

    install(ci_a, map_of(ci_a, ci_b), "sa");
    install(ci_b, map_of(ci_a, ci_b), "sb");
    snprintf(env, sizeof env, "PGJOBQ_CLUSTER=%s", ci_a);
    int port = serve_start(env, "--map-reload", "300ms", NULL);
    free(wait_metric(port, "pgjobq_shard_up{shard=\"sb\"}", 1));
    CHECK_INT(get(port, "/queues?shard=sc", &body), 404);
    free(body);

    /* Epoch 2: sc joins and takes partition 3. */
    static char map2[4096];
    snprintf(map2, sizeof map2,
             "{\"name\": \"test\", \"epoch\": 2, \"partitions\": 4, \"shards\": {"
             "\"sa\": {\"number\": 0, \"conninfo\": \"%s\"}, \"sb\": {\"number\": 1, \"conninfo\": \"%s\"},"
             " \"sc\": {\"number\": 2, \"conninfo\": \"%s\"}}, \"owners\": [\"sa\", \"sa\", \"sb\", \"sc\"],"
             " \"queues\": {}}",
             ci_a, ci_b, ci_c);
    install(ci_a, map2, "sa");
    install(ci_b, map2, "sb");
    install(ci_c, map2, "sc");
    queue_of_partition(qc, sizeof qc, 3);
    int64_t id_c = one_on(ci_c, qc);
    one_on(ci_c, qc);
    CHECK_INT(id_c % 1024, 2);

    snprintf(series, sizeof series, "pgjobq_jobs{shard=\"sc\",queue=\"%s\",state=\"queued\"}", qc);
    char *text = wait_metric(port, series, 2);
    CHECK(metric(text, "pgjobq_shard_up{shard=\"sa\"}") == 1);
    CHECK(metric(text, "pgjobq_shard_up{shard=\"sc\"}") == 1);
    free(text);
    CHECK_INT(get(port, "/", &body), 200);
    snprintf(want, sizeof want, "data-shard=\"sc\" data-queue=\"%s\"", qc);
    CHECK_MSG(strstr(body, want) != NULL, "no row of %s on sc in:\n%s", qc, body);
    free(body);
    snprintf(path, sizeof path, "/jobs/%lld", (long long)id_c);
    CHECK_INT(get(port, path, &body), 200);
    CHECK_MSG(strstr(body, qc) != NULL, "job %lld's page does not name its queue %s:\n%s", (long long)id_c, qc, body);
    free(body);
    stop_server();
    char *log = t_read_file(server_log);
    CHECK_MSG(strstr(log, "epoch 2 (was 1), 3 shards, the shards changed") != NULL, "the log:\n%s", log);
    free(log);
    free(ci_a);
    free(ci_b);
    free(ci_c);
}
