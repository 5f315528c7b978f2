/* SPDX-License-Identifier: Apache-2.0 */
/* ferry explain CODE: what an error code means, its causes, what to do. */
#include <stdio.h>
#include <string.h>

#include <ferry/ferry.h>

#include "cli.h"

static int cmd_explain(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: ferry explain CODE   (a number like -3 or a name like TIMEOUT)\n"
                "       ferry explain --all  (every code)\n");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--all") == 0) {
        for (int code = 0; code >= -600; code--)
            if (strcmp(ferry_error_name(code), "UNKNOWN") != 0)
                printf("%6d  %-24s %s%s\n", code, ferry_error_name(code), ferry_strerror(code),
                       ferry_error_retryable(code) ? " [retryable]" : "");
        return 0;
    }
    int code;
    if (!ferry_error_parse(argv[1], &code)) {
        fprintf(stderr, "ferry explain: unknown error code '%s' (try ferry explain --all)\n", argv[1]);
        return 1;
    }
    printf("%s (%d): %s\n", ferry_error_name(code), code, ferry_strerror(code));
    printf("Retryable: %s\n", ferry_error_retryable(code) ? "yes" : "no");
    printf("%s\n", ferry_error_advice(code));
    return 0;
}

FERRY_COMMAND("explain", cmd_explain, "explain an error code: meaning, likely causes, what to do")
