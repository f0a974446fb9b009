/*
 * outbox.c - the outbox's forwarder (docs/shards.md, "The outbox"): a handler for the jobs of the
 * queue pgjobq.outbox, each a job that a producer enqueued with pgjobq.forward() in its own database
 * and transaction, to be written to the shard that owns it.
 *
 * A forward is one statement on the job's shard, pgjobq.enqueue_forwarded(source, source id, spec),
 * which makes the job once per (source, source id) (sql/functions/outbox.sql); the worker then
 * completes the outbox job with the fenced completion.  A forwarder that dies in between leaves the
 * outbox job to be rescued and forwarded again, which finds the job it made: exactly once, without a
 * transaction across the two databases.
 *
 * The forwarder's cluster (the map and a connection per shard) is shared by the handler's threads
 * under a mutex: a forward is one short statement, and the map is read once, not per job.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* How long a job waits before it is forwarded again when its shard cannot be reached or the map
 * cannot be read: the shard's failover, not a fault of the job (no attempt is used). */
#define FORWARD_AGAIN_MS 5000

struct pgjobq_forwarder {
    pthread_mutex_t mu;
    char *spec;
    pgjobq_cluster *cluster; /* opened at the first job, and again after a failure to open it */
};

int pgjobq_forwarder_new(pgjobq_forwarder **out, const char *cluster_spec)
{
    pgjobq_forwarder *f;

    *out = NULL;
    if (cluster_spec == NULL || cluster_spec[0] == '\0')
        return PGJOBQ_EINVAL;
    f = calloc(1, sizeof *f);
    if (f == NULL)
        return PGJOBQ_ENOMEM;
    f->spec = strdup(cluster_spec);
    if (f->spec == NULL || pthread_mutex_init(&f->mu, NULL) != 0) {
        free(f->spec);
        free(f);
        return PGJOBQ_ENOMEM;
    }
    *out = f;
    return PGJOBQ_OK;
}

void pgjobq_forwarder_free(pgjobq_forwarder *f)
{
    if (f == NULL)
        return;
    pgjobq_cluster_close(f->cluster);
    pthread_mutex_destroy(&f->mu);
    free(f->spec);
    free(f);
}

/* Sets the outcome's text and returns a SNOOZE of FORWARD_AGAIN_MS. */
static pgjobq_outcome again(pgjobq_ctx *ctx, const char *what, const char *why)
{
    char msg[1200];
    snprintf(msg, sizeof msg, "forwarding: %s: %.1000s (again in %d s)", what, why, FORWARD_AGAIN_MS / 1000);
    pgjobq_ctx_set_error(ctx, msg);
    pgjobq_ctx_set_retry_delay(ctx, FORWARD_AGAIN_MS);
    return PGJOBQ_OUTCOME_SNOOZE;
}

/* One try: enqueue_forwarded on the job's shard.  Returns 0 (the result in result), PJQ01's 1 (the
 * map is stale), or -1 with why (a shard that cannot be reached: *down set). */
static int forward_once(pgjobq_forwarder *f, const pgjobq_job *job, const char *source, const char *queue,
                        const char *route_key, char *result, size_t result_size, char *why, size_t why_size,
                        int *down)
{
    size_t shard;
    pgjobq_client *c;
    char idtext[24];
    const char *values[3] = {source, idtext, job->payload};
    PGresult *r;
    int rc;

    *down = 0;
    if (pgjobq_cluster_route(f->cluster, queue, route_key, &shard) != PGJOBQ_OK) {
        snprintf(why, why_size, "%s", pgjobq_cluster_errmsg(f->cluster));
        return -1;
    }
    if (pgjobq_cluster_client(f->cluster, shard, &c) != PGJOBQ_OK) {
        snprintf(why, why_size, "shard %s: %s", pgjobq_cluster_shard_name(f->cluster, shard),
                 pgjobq_cluster_errmsg(f->cluster));
        *down = 1;
        return -1;
    }
    snprintf(idtext, sizeof idtext, "%lld", (long long)job->id);
    r = PQexecParams(pgjobq_client_conn(c),
                     "SELECT id, duplicate FROM pgjobq.enqueue_forwarded($1::pg_catalog.uuid, $2::pg_catalog.int8,"
                     " $3::pg_catalog.jsonb)",
                     3, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        snprintf(result, result_size, "{\"shard\": \"%s\", \"id\": %s, \"duplicate\": %s}",
                 pgjobq_cluster_shard_name(f->cluster, shard), PQgetvalue(r, 0, 0),
                 strcmp(PQgetvalue(r, 0, 1), "t") == 0 ? "true" : "false");
        PQclear(r);
        return 0;
    }
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    rc = state && strcmp(state, "PJQ01") == 0 ? 1 : -1;
    /* No SQLSTATE, or class 08 or 57 (the server going away): the shard is down, not the job wrong. */
    *down = state == NULL || strncmp(state, "08", 2) == 0 || strncmp(state, "57", 2) == 0 ||
            PQstatus(pgjobq_client_conn(c)) != CONNECTION_OK;
    snprintf(why, why_size, "shard %s: %s", pgjobq_cluster_shard_name(f->cluster, shard),
             state ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : PQerrorMessage(pgjobq_client_conn(c)));
    PQclear(r);
    if (*down)
        PQreset(pgjobq_client_conn(c)); /* (the next job finds it connected, or fails fast again) */
    return rc;
}

pgjobq_outcome pgjobq_forward_handler(pgjobq_ctx *ctx, void *forwarder)
{
    pgjobq_forwarder *f = forwarder;
    const pgjobq_job *job = pgjobq_ctx_job(ctx);
    char *source = NULL, *queue = NULL, *route_key = NULL;
    char result[256], why[1024];
    pgjobq_outcome out;
    int rc = -1, down = 0;

    if (job->payload == NULL ||
        pgjobq__json_get_string(job->payload, strlen(job->payload), "source", &source) != 1 ||
        pgjobq__json_get_string(job->payload, strlen(job->payload), "queue", &queue) < 0 ||
        pgjobq__json_get_string(job->payload, strlen(job->payload), "route_key", &route_key) < 0) {
        free(source);
        free(queue);
        pgjobq_ctx_set_error(ctx, "forwarding: not a job of pgjobq.forward() (no source, or not a JSON object)");
        return PGJOBQ_OUTCOME_FAIL;
    }
    pthread_mutex_lock(&f->mu);
    if (f->cluster == NULL && pgjobq_cluster_open(&f->cluster, f->spec) != PGJOBQ_OK) {
        snprintf(why, sizeof why, "%s", f->cluster ? pgjobq_cluster_errmsg(f->cluster) : "out of memory");
        pgjobq_cluster_close(f->cluster);
        f->cluster = NULL;
        out = again(ctx, "the cluster's map cannot be read", why);
        goto done;
    }
    for (int tries = 0; tries < 2; tries++) {
        rc = forward_once(f, job, source, queue ? queue : "default", route_key, result, sizeof result, why,
                          sizeof why, &down);
        if (rc != 1)
            break;
        /* PJQ01: the partition moved; read the map again and route again (once). */
        if (pgjobq_cluster_reload(f->cluster) != PGJOBQ_OK) {
            snprintf(why, sizeof why, "%s", pgjobq_cluster_errmsg(f->cluster));
            down = 1;
            rc = -1;
            break;
        }
    }
    if (rc == 0) {
        out = pgjobq_ctx_set_result(ctx, result) == PGJOBQ_OK ? PGJOBQ_OUTCOME_COMPLETE : PGJOBQ_OUTCOME_RETRY;
    } else if (down || rc == 1) {
        out = again(ctx, "its shard cannot take it now", why);
    } else {
        /* The shard refused the job itself: judged at pgjobq.forward(), so a rule changed since. */
        char msg[1100];
        snprintf(msg, sizeof msg, "forwarding: %s", why);
        pgjobq_ctx_set_error(ctx, msg);
        out = PGJOBQ_OUTCOME_RETRY;
    }
done:
    pthread_mutex_unlock(&f->mu);
    free(source);
    free(queue);
    free(route_key);
    return out;
}
