/*
 * fuzz_sanitize.c - libFuzzer target for the text sanitiser behind every stored error (last_error):
 * whatever bytes come in, what comes out is valid UTF-8, has no NUL, and fits the cap.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t cap = size ? (size_t)data[0] * 8 + 1 : 16;
    for (int tail = 0; tail < 2; tail++) {
        char *out = pgjobq__sanitize_text((const char *)data, size, cap, tail);
        if (out == NULL)
            return 0;
        size_t n = strlen(out);
        if (n > cap || !pgjobq__utf8_valid(out, n))
            abort();
        free(out);
    }
    return 0;
}
