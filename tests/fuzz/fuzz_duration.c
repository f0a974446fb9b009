/*
 * fuzz_duration.c - libFuzzer target for the command's duration parser (--delay, --lease, ...):
 * any input is either refused with a reason or gives 0 .. 100 years.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1), why[160];
    int64_t ms = -1;
    long long v;

    if (s == NULL)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    if (cli_parse_duration_ms(s, &ms, why, sizeof why) == 0) {
        if (ms < 0 || ms > INT64_C(3155760000000))
            abort();
    } else if (why[0] == '\0') {
        abort(); /* a refusal must say why */
    }
    if (cli_parse_int(s, -100, 100, &v, why, sizeof why) == 0 && (v < -100 || v > 100))
        abort();
    free(s);
    return 0;
}
