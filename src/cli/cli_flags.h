/*
 * cli_flags.h -- the flag table's entry and its value setters, shared by
 * cli_flag_table.c (the table), cli_args.c (the parser), cli_help.c (the
 * help) and cli_values.c (the setters).  Private to the command-line tool.
 */
#ifndef FLASHJIT_CLI_FLAGS_H
#define FLASHJIT_CLI_FLAGS_H

#include "cli.h"

typedef int (*flag_fn)(cli *c, const flag_def *f, const char *value);

struct flag_def {
  const char *name;
  int needs_value;  /* 1: --flag V or --flag=V; 0: a switch; 2: --flag[=V] */
  unsigned cmds;
  flag_fn fn;
  size_t offset;    /* of the field the setter writes */
  const name_value *names;
  size_t nnames;
  int lo, hi;       /* cli_set_int's range; lo > hi: the library checks it */
  const char *arg;  /* the value's placeholder in the help ("N") */
  const char *help; /* what it does, and its default */
};

/* The setters: 0, or the exit status after a one-line message. */
int cli_set_int(cli *c, const flag_def *f, const char *value);
int cli_set_warps(cli *c, const flag_def *f, const char *value);
int cli_set_name(cli *c, const flag_def *f, const char *value);
/* The library's axes (FJ_VARIANT_AXES): a named one's value by its names;
 * an integer one as cli_set_int (--warps as cli_set_warps). */
int cli_set_axis(cli *c, const flag_def *f, const char *value);
int cli_set_axis_int(cli *c, const flag_def *f, const char *value);
int cli_set_switch(cli *c, const flag_def *f, const char *value);
int cli_set_causal(cli *c, const flag_def *f, const char *value);
int cli_set_shape(cli *c, const flag_def *f, const char *value);
int cli_set_splits(cli *c, const flag_def *f, const char *value);
int cli_set_varlen(cli *c, const flag_def *f, const char *value);
int cli_set_page_size(cli *c, const flag_def *f, const char *value);
int cli_set_string(cli *c, const flag_def *f, const char *value);
int cli_set_expr(cli *c, const flag_def *f, const char *value);
int cli_set_path(cli *c, const flag_def *f, const char *value);
int cli_set_out(cli *c, const flag_def *f, const char *value);

/* The flag table (cli_flag_table.c): every option, in the help's order. */
extern const flag_def cli_flags[];
extern const size_t cli_nflags;

/* The subcommands (cli_help.c): name, bit in flag_def.cmds (what main()
 * dispatches on), line in the help. */
typedef struct cli_command {
  const char *name;
  unsigned cmd;
  const char *synopsis;
} cli_command;
extern const cli_command cli_commands[];
extern const int cli_ncommands;
/* A command's help (cli_commands[i]); flashjit help [COMMAND] and
 * flashjit --help: -1 after printing, or the exit status. */
void cli_print_help(int i);
int cli_help_command(cli *c, const char *name);

/* "--name" or, for the one-letter flag, "-o". */
const char *cli_flag_spelling(const flag_def *f, char *buf, size_t size);

#endif
