/* sha256.h - SHA-256 of a buffer as 64 lowercase hex digits. */
#ifndef PGJOBQ_SHA256_H
#define PGJOBQ_SHA256_H

#include <stddef.h>

void sha256_hex(const void *data, size_t len, char out[65]);

#endif
