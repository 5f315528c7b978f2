/* SPDX-License-Identifier: Apache-2.0 */
/* Subcommands of the `ferry` CLI register themselves: one file per command,
 * ending with FERRY_COMMAND(name, function, "one-line help"). No shared
 * table to edit. */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

typedef int (*ferry_cmd_fn)(int argc, char **argv); /* argv[0] is the command name */

struct ferry_cmd {
    const char *name;
    ferry_cmd_fn fn;
    const char *help;
    struct ferry_cmd *next;
};

void ferry_cli_register(struct ferry_cmd *cmd);

#define FERRY_COMMAND(name_, fn_, help_)                                          \
    static struct ferry_cmd ferry_cmd_entry_##fn_ = {name_, fn_, help_, 0};       \
    __attribute__((constructor)) static void ferry_cmd_register_##fn_(void)      \
    {                                                                             \
        ferry_cli_register(&ferry_cmd_entry_##fn_);                               \
    }

#endif
