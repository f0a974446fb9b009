/*
 * route.c - where a job lives in a cluster of shards (docs/shards.md): the routing hash, the same as the
 * SQL's pgjobq.route_hash (sql/functions/cluster.sql), so that a client routes without asking a
 * database (tests/test_cluster.c holds the two equal).
 */
#include <string.h>

#include "internal.h"

uint32_t pgjobq__route_hash(const char *key, size_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a, 32 bits: offset basis, then per byte xor and multiply by the prime */

    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 16777619u;
    }
    return h;
}
