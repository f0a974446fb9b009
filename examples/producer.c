/*
 * producer.c - enqueue jobs from C: one at a time, then a batch, then one inside your own transaction.
 *
 *   producer [CONNINFO] [N]
 *
 * CONNINFO defaults to $PGJOBQ_DATABASE_URL (try the output of `pgjobq db url`).
 */
#include <stdio.h>
#include <stdlib.h>

#include <libpq-fe.h>
#include <pgjobq.h>

int main(int argc, char **argv)
{
    const char *conninfo = argc > 1 ? argv[1] : getenv("PGJOBQ_DATABASE_URL");
    int n = argc > 2 ? atoi(argv[2]) : 10;
    pgjobq_client *c = NULL;
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id;
    int rc;

    if (conninfo == NULL || n < 1) {
        fprintf(stderr, "usage: producer CONNINFO [N]\n");
        return 64;
    }
    rc = pgjobq_client_open(&c, conninfo);
    if (rc == PGJOBQ_ESCHEMA && c)
        rc = pgjobq_migrate(c, NULL); /* first use of this database */
    if (rc != PGJOBQ_OK) {
        fprintf(stderr, "producer: %s\n", pgjobq_errmsg(c));
        pgjobq_client_close(c);
        return 69;
    }

    /* One job at a time. */
    o.queue = "example";
    o.kind = "greet";
    rc = pgjobq_enqueue(c, "{\"name\": \"Ada\"}", &o, &id);
    if (rc != PGJOBQ_OK) {
        fprintf(stderr, "producer: %s\n", pgjobq_errmsg(c));
        pgjobq_client_close(c);
        return 65;
    }
    printf("enqueued job %lld\n", (long long)id);

    /* A batch: one statement, all or none. */
    pgjobq_job_spec *batch = calloc((size_t)n, sizeof *batch);
    char(*payloads)[32] = calloc((size_t)n, sizeof *payloads);
    if (batch == NULL || payloads == NULL) {
        pgjobq_client_close(c);
        return 71;
    }
    for (int i = 0; i < n; i++) {
        snprintf(payloads[i], sizeof payloads[i], "{\"name\": \"guest %d\"}", i);
        batch[i].payload = payloads[i];
        batch[i].opts = o;
    }
    rc = pgjobq_enqueue_many(c, batch, (size_t)n, NULL, NULL);
    free(batch);
    free(payloads);
    if (rc != PGJOBQ_OK) {
        fprintf(stderr, "producer: %s\n", pgjobq_errmsg(c));
        pgjobq_client_close(c);
        return 65;
    }
    printf("enqueued %d more jobs\n", n);

    /* Inside your own transaction: the job exists if and only if your data commits. */
    PGconn *app = PQconnectdb(conninfo);
    pgjobq_client *tx = NULL;
    if (PQstatus(app) == CONNECTION_OK && pgjobq_client_wrap(&tx, app) == PGJOBQ_OK) {
        PQclear(PQexec(app, "BEGIN"));
        /* ... your INSERTs and UPDATEs here ... */
        rc = pgjobq_enqueue(tx, "{\"name\": \"committed with my data\"}", &o, &id);
        PQclear(PQexec(app, rc == PGJOBQ_OK ? "COMMIT" : "ROLLBACK"));
        if (rc == PGJOBQ_OK)
            printf("enqueued job %lld in my transaction\n", (long long)id);
    } else {
        fprintf(stderr, "producer: %s\n", tx ? pgjobq_errmsg(tx) : PQerrorMessage(app));
        rc = PGJOBQ_ECONN;
    }
    pgjobq_client_close(tx);
    PQfinish(app);
    pgjobq_client_close(c);
    return rc == PGJOBQ_OK ? 0 : 70;
}
