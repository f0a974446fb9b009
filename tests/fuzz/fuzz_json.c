/*
 * fuzz_json.c - libFuzzer target for the JSON checker every payload and result goes through.
 * Properties: no crash or out-of-bounds read on any input; the verdict is deterministic; a document
 * that is accepted stays accepted with whitespace around it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pgjobq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[160];
    int a = pgjobq_json_check((const char *)data, size, why, sizeof why);
    int b = pgjobq_json_check((const char *)data, size, NULL, 0);
    if (a != b)
        abort();
    if (a == PGJOBQ_OK && size + 2 <= PGJOBQ_PAYLOAD_MAX) {
        char *padded = malloc(size + 2);
        if (padded == NULL)
            return 0;
        padded[0] = ' ';
        memcpy(padded + 1, data, size);
        padded[size + 1] = '\n';
        if (pgjobq_json_check(padded, size + 2, NULL, 0) != PGJOBQ_OK)
            abort();
        free(padded);
    }
    return 0;
}
