/*
 * schema.c - the database's schema version, and whether this library can use it: read when a client
 * connects (pgjobq__check_schema), before every call (pgjobq__require_schema) and by the migrations.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The database's schema version, and (needs, may be NULL) the oldest library schema version that can
 * use it: the largest "needs" of the applied migrations, a migration that does not say (all before
 * version 7) needing its own version. */
int pgjobq__read_version(pgjobq_client *c, int *version, int *needs)
{
    /* A plain query of the catalogs, not to_regclass(): the latter answers from the backend's cache,
     * which a migrator that waited on the advisory lock has not refreshed, so it would miss the table
     * another host has just created. */
    static const pgjobq__stmt exists = {
        "read schema version",
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = 'pgjobq' AND c.relname = 'schema_version')",
        0,
        NULL,
        NULL,
        NULL,
        NULL,
        0};
    static const pgjobq__stmt max = {"read schema version",
                                     "SELECT " PGJOBQ__SCHEMA_VERSION_COLS PGJOBQ__SCHEMA_VERSION_FROM,
                                     0,
                                     NULL,
                                     NULL,
                                     NULL,
                                     NULL,
                                     0};
    PGresult *r;
    int rc;

    *version = 0;
    if (needs)
        *needs = 0;
    rc = pgjobq__exec(c, &exists, &r);
    if (rc != PGJOBQ_OK)
        return rc;
    int present = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!present)
        return PGJOBQ_OK;
    rc = pgjobq__exec(c, &max, &r);
    if (rc != PGJOBQ_OK)
        return rc;
    *version = atoi(PQgetvalue(r, 0, 0));
    if (needs)
        *needs = atoi(PQgetvalue(r, 0, 1));
    PQclear(r);
    return PGJOBQ_OK;
}

int pgjobq__schema_usable(int version, int needs)
{
    if (version == PGJOBQ_SCHEMA_VERSION)
        return 1;
    return version > PGJOBQ_SCHEMA_VERSION && needs <= PGJOBQ_SCHEMA_VERSION;
}

int pgjobq_schema_version(pgjobq_client *c, int *version)
{
    if (c == NULL || version == NULL)
        return PGJOBQ_EINVAL;
    return pgjobq__read_version(c, version, NULL);
}

int pgjobq__check_schema(pgjobq_client *c)
{
    int version, needs, rc;

    rc = pgjobq__read_version(c, &version, &needs);
    if (rc != PGJOBQ_OK)
        return rc;
    if (version > PGJOBQ_SCHEMA_VERSION && !pgjobq__schema_usable(version, needs)) {
        c->schema_state = -1;
        return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                              "the database has pgjobq schema version %d, newer than this pgjobq %s "
                              "understands (version %d), and it needs at least version %d: upgrade pgjobq",
                              version, PGJOBQ_VERSION, PGJOBQ_SCHEMA_VERSION, needs);
    }
    if (version < PGJOBQ_SCHEMA_VERSION) {
        c->schema_state = 0;
        if (version == 0)
            return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                                  "the pgjobq schema is not installed in this database: run `pgjobq migrate`");
        return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                              "the database has pgjobq schema version %d, older than the version %d this "
                              "pgjobq needs: run `pgjobq migrate`",
                              version, PGJOBQ_SCHEMA_VERSION);
    }
    c->schema_state = 1;
    return PGJOBQ_OK;
}

int pgjobq__require_schema(pgjobq_client *c)
{
    if (c->schema_state == 1)
        return PGJOBQ_OK;
    if (c->schema_state == -1)
        return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                              "the database's pgjobq schema is newer than this library (version %d): "
                              "upgrade pgjobq",
                              PGJOBQ_SCHEMA_VERSION);
    return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                          "the pgjobq schema is not installed or is out of date: "
                          "run `pgjobq migrate` (or pgjobq_migrate())");
}
