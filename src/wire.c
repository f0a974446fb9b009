/*
 * wire.c - PostgreSQL's binary wire formats: one-dimensional arrays for parameters, and the column
 * types pgjobq reads from binary results.  Binary arrays spare both sides the quoting and parsing of
 * array literals, which matters for a batch of 100,000 payloads.
 */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"


void pgjobq__buf_free(pgjobq__buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static int reserve(pgjobq__buf *b, size_t n)
{
    size_t cap;
    char *p;

    if (b->oom)
        return -1;
    if (b->len + n <= b->cap)
        return 0;
    cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) {
        if (cap > SIZE_MAX / 2) {
            b->oom = 1;
            return -1;
        }
        cap *= 2;
    }
    p = realloc(b->data, cap);
    if (p == NULL) {
        b->oom = 1;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

void pgjobq__buf_put(pgjobq__buf *b, const void *p, size_t n)
{
    if (n == 0 || reserve(b, n) != 0)
        return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

void pgjobq__buf_u32(pgjobq__buf *b, uint32_t v)
{
    uint32_t be = htonl(v);
    pgjobq__buf_put(b, &be, 4);
}

void pgjobq__buf_u64(pgjobq__buf *b, uint64_t v)
{
    pgjobq__buf_u32(b, (uint32_t)(v >> 32));
    pgjobq__buf_u32(b, (uint32_t)v);
}

static void set_u32(pgjobq__buf *b, size_t at, uint32_t v)
{
    uint32_t be = htonl(v);
    if (!b->oom)
        memcpy(b->data + at, &be, 4);
}

void pgjobq__array_begin(pgjobq__array *a, Oid elem_type)
{
    memset(a, 0, sizeof *a);
    pgjobq__buf_u32(&a->buf, 1); /* dimensions */
    a->has_null_at = (int)a->buf.len;
    pgjobq__buf_u32(&a->buf, 0); /* has nulls */
    pgjobq__buf_u32(&a->buf, elem_type);
    a->count_at = a->buf.len;
    pgjobq__buf_u32(&a->buf, 0); /* length of the dimension, set by _end */
    pgjobq__buf_u32(&a->buf, 1); /* lower bound */
}

void pgjobq__array_null(pgjobq__array *a)
{
    pgjobq__buf_u32(&a->buf, UINT32_MAX); /* length -1 */
    a->has_null = 1;
    a->count++;
}

void pgjobq__array_int8(pgjobq__array *a, int64_t v)
{
    pgjobq__buf_u32(&a->buf, 8);
    pgjobq__buf_u64(&a->buf, (uint64_t)v);
    a->count++;
}

void pgjobq__array_int4(pgjobq__array *a, int32_t v)
{
    pgjobq__buf_u32(&a->buf, 4);
    pgjobq__buf_u32(&a->buf, (uint32_t)v);
    a->count++;
}

void pgjobq__array_int2(pgjobq__array *a, int16_t v)
{
    uint16_t be = htons((uint16_t)v);
    pgjobq__buf_u32(&a->buf, 2);
    pgjobq__buf_put(&a->buf, &be, 2);
    a->count++;
}

void pgjobq__array_bool(pgjobq__array *a, int v)
{
    char b = v ? 1 : 0;
    pgjobq__buf_u32(&a->buf, 1);
    pgjobq__buf_put(&a->buf, &b, 1);
    a->count++;
}

void pgjobq__array_text(pgjobq__array *a, const char *s, size_t n)
{
    pgjobq__buf_u32(&a->buf, (uint32_t)n);
    pgjobq__buf_put(&a->buf, s, n);
    a->count++;
}

void pgjobq__array_jsonb(pgjobq__array *a, const char *s, size_t n)
{
    const char version = 1; /* jsonb's binary format is a version byte followed by the JSON text */
    pgjobq__buf_u32(&a->buf, (uint32_t)(n + 1));
    pgjobq__buf_put(&a->buf, &version, 1);
    pgjobq__buf_put(&a->buf, s, n);
    a->count++;
}

void pgjobq__array_interval_us(pgjobq__array *a, int64_t us)
{
    pgjobq__buf_u32(&a->buf, 16);
    pgjobq__buf_u64(&a->buf, (uint64_t)us); /* microseconds */
    pgjobq__buf_u32(&a->buf, 0);            /* days */
    pgjobq__buf_u32(&a->buf, 0);            /* months */
    a->count++;
}

int pgjobq__array_end(pgjobq__array *a)
{
    if (a->count == 0) {
        /* An empty array has no dimensions at all. */
        set_u32(&a->buf, 0, 0);
        a->buf.len = 12;
    } else {
        set_u32(&a->buf, a->count_at, a->count);
        set_u32(&a->buf, (size_t)a->has_null_at, (uint32_t)a->has_null);
    }
    return a->buf.oom ? -1 : 0;
}

uint32_t pgjobq__get_be32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | (uint32_t)u[3];
}

uint64_t pgjobq__get_be64(const char *p)
{
    return (uint64_t)pgjobq__get_be32(p) << 32 | pgjobq__get_be32(p + 4);
}

static uint32_t read_u32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return ntohl(v);
}

int64_t pgjobq__get_int8(const PGresult *r, int row, int col)
{
    const char *p = PQgetvalue(r, row, col);
    if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 8)
        return 0;
    return (int64_t)(((uint64_t)read_u32(p) << 32) | read_u32(p + 4));
}

int32_t pgjobq__get_int4(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 4)
        return 0;
    return (int32_t)read_u32(PQgetvalue(r, row, col));
}

int16_t pgjobq__get_int2(const PGresult *r, int row, int col)
{
    uint16_t v;
    if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 2)
        return 0;
    memcpy(&v, PQgetvalue(r, row, col), 2);
    return (int16_t)ntohs(v);
}

int pgjobq__get_bool(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 1)
        return 0;
    return PQgetvalue(r, row, col)[0] != 0;
}

int64_t pgjobq__get_time(const PGresult *r, int row, int col)
{
    int64_t v;
    if (PQgetisnull(r, row, col))
        return PGJOBQ_TIME_NONE;
    v = pgjobq__get_int8(r, row, col);
    if (v == INT64_MAX || v == INT64_MIN) /* +-infinity */
        return v;
    return v + PGJOBQ__PG_EPOCH_US;
}

const char *pgjobq__get_text(const PGresult *r, int row, int col, size_t *len)
{
    const char *p;
    size_t n;

    if (PQgetisnull(r, row, col)) {
        if (len)
            *len = 0;
        return NULL;
    }
    p = PQgetvalue(r, row, col);
    n = (size_t)PQgetlength(r, row, col);
    if (PQftype(r, col) == OID_JSONB && n > 0) {
        p++; /* the version byte */
        n--;
    }
    if (len)
        *len = n;
    return p;
}

void pgjobq__ms_interval(char *buf, size_t size, int64_t ms)
{
    snprintf(buf, size, "%lld milliseconds", (long long)ms);
}
