/* The ferry command line: explain, and (as the project grows) serve, bench, doctor, demo. */
#include <stdio.h>
#include <string.h>

#include <ferry/ferry.h>

static int cmd_explain(int argc, char **argv)
{
    if (argc < 1) {
        fprintf(stderr, "usage: ferry explain CODE   (a number like -3 or a name like TIMEOUT)\n");
        return 2;
    }
    int code;
    if (!ferry_error_parse(argv[0], &code)) {
        fprintf(stderr, "ferry explain: unknown error code '%s'\n", argv[0]);
        return 1;
    }
    printf("%s (%d): %s\n", ferry_error_name(code), code, ferry_strerror(code));
    printf("Retryable: %s\n", ferry_error_retryable(code) ? "yes" : "no");
    printf("%s\n", ferry_error_advice(code));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "explain") == 0) return cmd_explain(argc - 2, argv + 2);
    fprintf(stderr, "usage: ferry explain CODE\n");
    return 2;
}
