/* The ferry command line: dispatches to self-registered subcommands. */
#include <stdio.h>
#include <string.h>

#include <ferry/ferry.h>

#include "cli.h"

static struct ferry_cmd *commands;

void ferry_cli_register(struct ferry_cmd *cmd)
{
    /* Keep the list sorted by name for the usage text. */
    struct ferry_cmd **pp = &commands;
    while (*pp && strcmp((*pp)->name, cmd->name) < 0) pp = &(*pp)->next;
    cmd->next = *pp;
    *pp = cmd;
}

static void usage(FILE *out)
{
    fprintf(out, "ferry %s: a data transfer engine for disaggregated LLM inference\n\nusage: ferry COMMAND [ARGS]\n\n",
            FERRY_VERSION_STRING);
    for (struct ferry_cmd *c = commands; c; c = c->next) fprintf(out, "  %-10s %s\n", c->name, c->help);
    fprintf(out, "\n`ferry COMMAND --help` describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ferry %s (protocol %d)\n", FERRY_VERSION_STRING, FERRY_PROTOCOL_VERSION);
        return 0;
    }
    for (struct ferry_cmd *c = commands; c; c = c->next)
        if (strcmp(c->name, argv[1]) == 0) return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "ferry: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
