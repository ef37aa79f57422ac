/*
 * cli_cache.c -- `flashjit cache`: prints the disk cache's directory, lists
 * or counts its entries, or clears it.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"

typedef struct cache_tally {
  int entries, invalid, kernels, luts;
  uint64_t bytes;
} cache_tally;

static int list_entry(void *user, const fj_cache_entry *e)
{
  (void)user;
  char when[32];
  time_t t = (time_t)e->mtime;
  strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime(&t));
  printf("%-40s %-6s %9llu %s %s%s%s\n", e->file, e->kind,
         (unsigned long long)e->bytes, when, e->valid ? "" : "(invalid: ",
         e->label, e->valid ? "" : ")");
  return 0;
}

static int tally_entry(void *user, const fj_cache_entry *e)
{
  cache_tally *t = user;
  t->entries++;
  t->bytes += e->bytes;
  t->invalid += !e->valid;
  t->kernels += e->valid && strcmp(e->kind, "kernel") == 0;
  t->luts += e->valid && strcmp(e->kind, "lut") == 0;
  return 0;
}

int cli_cmd_cache(cli *c)
{
  const char *a = c->action;
  if (!a || (strcmp(a, "dir") && strcmp(a, "ls") && strcmp(a, "stats") &&
             strcmp(a, "clear")))
    return cli_usage_error(c, "expected one of dir, ls, stats, clear%s%s%s",
                           a ? " (not '" : "", a ? a : "", a ? "')" : "");
  fj_ctx *ctx;
  int rc = cli_open_ctx(c, -1, "sm_90a", &ctx);
  if (rc)
    return rc;
  const char *dir = fj_cache_dir(ctx);
  fj_status st = FJ_OK;
  if (!strcmp(a, "dir")) {
    printf("%s\n", dir ? dir : "(disk cache disabled)");
  } else if (!strcmp(a, "ls")) {
    st = fj_cache_list(ctx, list_entry, NULL);
  } else if (!strcmp(a, "stats")) {
    cache_tally t = {0};
    st = fj_cache_list(ctx, tally_entry, &t);
    if (st == FJ_OK)
      printf("dir=%s\nentries=%d\nkernels=%d\nluts=%d\ninvalid=%d\nbytes=%llu\n",
             dir, t.entries, t.kernels, t.luts, t.invalid,
             (unsigned long long)t.bytes);
  } else {
    int removed = 0;
    st = fj_cache_clear(ctx, &removed);
    if (st == FJ_OK)
      printf("removed %d file(s) from %s\n", removed, dir);
  }
  if (st != FJ_OK)
    rc = cli_fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}
