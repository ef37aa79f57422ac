/*
 * cli_help.c -- the subcommands of the flashjit tool (name, bit, synopsis)
 * and the help: the overview, a command's options from the flag table.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"

/* Each subcommand's name, its bit in flag_def.cmds (what main() dispatches
 * on) and its line in the help. */
const cli_command cli_commands[] = {
    {"emit", CMD_EMIT,
     "render and compile a kernel -- the library's choice for a problem, or "
     "the variant the flags describe -- and print its source, PTX, cubin, "
     "resources or log (no GPU needed)"},
    {"run", CMD_RUN,
     "run attention on the GPU (--backward: its backward): time it, and "
     "with --check compare it with the float64 reference"},
    {"plan", CMD_PLAN,
     "print what the library would launch for a problem: variant, grid, "
     "splits, GQA packing, workspace (no GPU needed)"},
    {"lut", CMD_LUT,
     "print the fragment-layout tables (probed on the GPU; --arch gives the "
     "reference)"},
    {"cache", CMD_CACHE,
     "dir | ls | stats | clear | prune | prewarm | export FILE | import FILE: "
     "the disk cache (prune removes corrupt and stale entries; prewarm "
     "compiles the library's picks for --arch, with --backward the "
     "backward's kernels, no GPU needed; export and import move it between "
     "machines)"},
    {"tune", CMD_TUNE,
     "autotune a problem class on the GPU (--backward: its backward's main "
     "kernel) and record the winner (--show lists the database)"},
};
const int cli_ncommands = (int)(sizeof cli_commands / sizeof cli_commands[0]);

static void print_flags(unsigned cmd)
{
  for (size_t i = 0; i < cli_nflags; i++) {
    const flag_def *f = &cli_flags[i];
    if (!(f->cmds & cmd))
      continue;
    char left[64], name[48];
    snprintf(left, sizeof left, "%s%s%s", cli_flag_spelling(f, name, sizeof name),
             f->arg && f->needs_value == 1 ? " " : "", f->arg ? f->arg : "");
    printf("  %-26s %s\n", left, f->help);
  }
}

void cli_print_help(int i)
{
  printf("usage: flashjit %s%s [options]   (flashjit %s)\n\n",
         cli_commands[i].name, cli_commands[i].cmd == CMD_CACHE
             ? " dir|ls|stats|clear|prune|prewarm|export FILE|import FILE" : "",
         fj_version());
  printf("%s\n\noptions:\n", cli_commands[i].synopsis);
  print_flags(cli_commands[i].cmd);
}

static void print_overview(void)
{
  printf("usage: flashjit <command> [options]   (flashjit %s)\n\n", fj_version());
  for (size_t i = 0; i < (size_t)cli_ncommands; i++)
    printf("  %-6s %s\n", cli_commands[i].name, cli_commands[i].synopsis);
  printf("\n'flashjit <command> --help' lists a command's options.  Bad input "
         "exits with status 2 and one line naming the bad value.\n");
}

/* flashjit help [COMMAND] and flashjit --help. */
int cli_help_command(cli *c, const char *name)
{
  if (!name) {
    print_overview();
    return -1;
  }
  for (int i = 0; i < cli_ncommands; i++)
    if (!strcmp(name, cli_commands[i].name)) {
      cli_print_help(i);
      return -1;
    }
  char q[300];
  return cli_usage_error(c, "unknown command '%s' for help: one of emit, run, "
                            "plan, lut, cache, tune",
                         cli_quote(name, q, sizeof q));
}
