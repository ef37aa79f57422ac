/*
 * flashjit -- the command-line tool.  Uses only include/flashjit.h (and the
 * CUDA runtime for device memory and events in `run`, as any embedder
 * would); main() parses, then dispatches to one function per subcommand.
 */
#include "cli.h"

/* Runs the parsed command. */
static int dispatch(cli *c)
{
  switch (c->cmd) {
  case CMD_EMIT: return cli_cmd_emit(c);
  case CMD_RUN: return cli_cmd_run(c);
  case CMD_LUT: return cli_cmd_lut(c);
  case CMD_CACHE: return cli_cmd_cache(c);
  case CMD_TUNE: return cli_cmd_tune(c);
  case CMD_PLAN: return cli_cmd_plan(c);
  }
  return EXIT_FAIL;  /* cli_parse sets one of the commands above */
}

int main(int argc, char **argv)
{
  cli c;
  int rc = cli_parse(&c, argc, argv);
  rc = rc ? (rc < 0 ? 0 : rc) : dispatch(&c);
  cli_release(&c);
  return rc;
}
