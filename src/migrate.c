/*
 * migrate.c - applies the numbered migrations embedded from sql/ and checks the schema version.
 *
 * Migration N runs in its own transaction, under a transaction-scoped advisory lock, and only when
 * pgjobq.schema_version does not list N yet.  Hosts that migrate at once queue on the lock; the later
 * ones find the work done.  A transaction-scoped lock (not a session lock) keeps this working through
 * PgBouncer in transaction mode.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern const char *const pgjobq__migrations[];
extern const char *const pgjobq__migration_names[];
extern const int pgjobq__migration_count;
extern const int pgjobq__migration_needs[];

/* The first migration whose schema_version row says which libraries can use the database. */
#define FIRST_WITH_NEEDS 7
extern const char *const pgjobq__roles_sql;

/* Advisory lock key of the migration runner: ('pgjq', 1). */
#define MIGRATE_LOCK_SQL "SELECT pg_catalog.pg_advisory_xact_lock(1885825649, 1)"

/* The database's schema version, and (needs, may be NULL) the oldest library schema version that can
 * use it: the largest "needs" of the applied migrations, a migration that does not say (all before
 * version 7) needing its own version. */
static int read_version(pgjobq_client *c, int *version, int *needs)
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
    /* needs through to_jsonb: the column does not exist before version 7. */
    static const pgjobq__stmt max = {"read schema version",
                                     "SELECT coalesce(max(version), 0), coalesce(max(coalesce("
                                     "(pg_catalog.to_jsonb(s) ->> 'needs')::integer, version)), 0)"
                                     " FROM pgjobq.schema_version s",
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
    return read_version(c, version, NULL);
}

int pgjobq__check_schema(pgjobq_client *c)
{
    int version, needs, rc;

    rc = read_version(c, &version, &needs);
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

/* Runs sql (possibly several statements) with the simple protocol; 0 or an error code. */
static int simple(pgjobq_client *c, const char *what, const char *sql)
{
    PGresult *r = PQexec(c->conn, sql);
    ExecStatusType s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;

    if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
        PQclear(r);
        return PGJOBQ_OK;
    }
    if (r == NULL || PQstatus(c->conn) != CONNECTION_OK) {
        PQclear(r);
        return pgjobq__seterr(c, PGJOBQ_ECONN, "%s: %s", what, PQerrorMessage(c->conn));
    }
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    int code = pgjobq__code_from_sqlstate(state);
    snprintf(c->sqlstate, sizeof c->sqlstate, "%s", state ? state : "");
    pgjobq__seterr(c, code == PGJOBQ_ESCHEMA ? PGJOBQ_EDB : code, "%s: %s (SQLSTATE %s)", what,
                   msg ? msg : PQresultErrorMessage(r), state ? state : "?");
    PQclear(r);
    return code == PGJOBQ_ESCHEMA ? PGJOBQ_EDB : code;
}

static int apply_one(pgjobq_client *c, int n, int *applied)
{
    char what[160], record[128];
    int version, needs, rc;

    snprintf(what, sizeof what, "migration %s", pgjobq__migration_names[n - 1]);
    rc = simple(c, what, "BEGIN");
    if (rc == PGJOBQ_OK)
        rc = simple(c, what, MIGRATE_LOCK_SQL);
    if (rc == PGJOBQ_OK)
        rc = read_version(c, &version, &needs);
    if (rc == PGJOBQ_OK && version > pgjobq__migration_count && !pgjobq__schema_usable(version, needs)) {
        c->schema_state = -1;
        rc = pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                            "the database has pgjobq schema version %d, newer than this pgjobq understands "
                            "(version %d): upgrade pgjobq",
                            version, pgjobq__migration_count);
    }
    if (rc == PGJOBQ_OK && version < n) {
        rc = simple(c, what, pgjobq__migrations[n - 1]);
        if (n >= FIRST_WITH_NEEDS)
            snprintf(record, sizeof record, "INSERT INTO pgjobq.schema_version (version, needs) VALUES (%d, %d)", n,
                     pgjobq__migration_needs[n - 1]);
        else
            snprintf(record, sizeof record, "INSERT INTO pgjobq.schema_version (version) VALUES (%d)", n);
        if (rc == PGJOBQ_OK)
            rc = simple(c, what, record);
        if (rc == PGJOBQ_OK) {
            (*applied)++;
            pgjobq__log(c, PGJOBQ_LOG_INFO, "applied %s", what);
        }
    }
    if (rc == PGJOBQ_OK)
        return simple(c, what, "COMMIT");
    if (PQstatus(c->conn) == CONNECTION_OK) {
        /* Keep the first error: the rollback's own outcome does not matter. */
        PGresult *r = PQexec(c->conn, "ROLLBACK");
        PQclear(r);
    }
    return rc;
}

int pgjobq_migrate(pgjobq_client *c, int *applied_out)
{
    int applied = 0, rc = PGJOBQ_OK;

    if (applied_out)
        *applied_out = 0;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if (c->conn == NULL || PQstatus(c->conn) != CONNECTION_OK)
        return pgjobq__seterr(c, PGJOBQ_ECONN, "migrate: not connected");
    if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
        return pgjobq__seterr(c, PGJOBQ_ESTATE,
                              "migrate: the connection is inside a transaction; migrations run their own");
    if (pgjobq__migration_count != PGJOBQ_SCHEMA_VERSION)
        return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                              "migrate: this build embeds %d migrations but declares "
                              "schema version %d",
                              pgjobq__migration_count, PGJOBQ_SCHEMA_VERSION);
    for (int n = 1; n <= pgjobq__migration_count && rc == PGJOBQ_OK; n++)
        rc = apply_one(c, n, &applied);
    if (applied_out)
        *applied_out = applied;
    if (rc != PGJOBQ_OK)
        return rc;
    return pgjobq__check_schema(c);
}

int pgjobq_migrate_roles(pgjobq_client *c)
{
    int rc;

    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
        return pgjobq__seterr(c, PGJOBQ_ESTATE, "migrate roles: the connection is inside a transaction");
    rc = simple(c, "roles", "BEGIN");
    if (rc == PGJOBQ_OK)
        rc = simple(c, "roles", MIGRATE_LOCK_SQL);
    if (rc == PGJOBQ_OK)
        rc = simple(c, "roles", pgjobq__roles_sql);
    if (rc == PGJOBQ_OK)
        return simple(c, "roles", "COMMIT");
    PGresult *r = PQexec(c->conn, "ROLLBACK");
    PQclear(r);
    return rc;
}
