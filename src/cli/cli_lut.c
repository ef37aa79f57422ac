/*
 * cli_lut.c -- `flashjit lut`: prints the fragment-layout tables, probed on
 * the GPU, or the reference tables of an --arch.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char *origin_text(fj_lut_origin o)
{
  switch (o) {
  case FJ_LUT_PROBED: return "probed on this device now";
  case FJ_LUT_CACHED: return "from the cache (probed on this device earlier)";
  case FJ_LUT_REFERENCE: return "reference table (no GPU seen: not observed "
                                "here, but what an NVIDIA H200 showed when "
                                "probed)";
  }
  return "?";
}

static void print_lut(const fj_lut *l)
{
  if (l->origin == FJ_LUT_REFERENCE)  /* no device seen: none to name */
    printf("fragment %s: %dx%d tile, %d slots per lane; %s\n",
           fj_frag_name(l->frag), l->rows, l->cols, l->slots,
           origin_text(l->origin));
  else
    printf("fragment %s: %dx%d tile, %d slots per lane; %s; device %s\n",
           fj_frag_name(l->frag), l->rows, l->cols, l->slots,
           origin_text(l->origin), l->device);
  printf("lane: (row,col) of slot 0..%d\n", l->slots - 1);
  for (int lane = 0; lane < 32; lane++) {
    printf("%4d:", lane);
    for (int s = 0; s < l->slots; s++)
      printf(" (%2d,%2d)", l->map[lane][s] / l->cols, l->map[lane][s] % l->cols);
    printf("\n");
  }
}

/* --frag against the kinds the library names, before any GPU is looked
 * for: bad input is refused as such, with the kinds it may be. */
static int check_frag(const cli *c)
{
  char kinds[1024] = "", q[300];
  size_t n = 0;
  for (int f = 1; f <= FJ_FRAG_COUNT; f++) {
    if (!strcmp(c->frag, fj_frag_name((fj_frag)f)))
      return 0;
    n += (size_t)snprintf(kinds + n, sizeof kinds - n, "%s%s", f > 1 ? ", " : "",
                          fj_frag_name((fj_frag)f));
    if (n >= sizeof kinds)
      break;
  }
  return cli_usage_error(c, "unknown fragment kind '%s' for --frag: one of %s",
                         cli_quote(c->frag, q, sizeof q), kinds);
}

int cli_cmd_lut(cli *c)
{
  fj_ctx *ctx;
  if (c->frag && check_frag(c))
    return EXIT_USAGE;
  int rc = cli_open_ctx(c, c->arch ? -1 : c->device, c->arch, &ctx);
  if (rc)
    return rc;
  for (int f = 1; f <= FJ_FRAG_COUNT && !rc; f++) {
    if (c->frag && strcmp(c->frag, fj_frag_name((fj_frag)f)) != 0)
      continue;
    fj_lut l;
    fj_status st = fj_layout_get(ctx, (fj_frag)f, &l);
    if ((st == FJ_ERR_COMPILE_ONLY || st == FJ_ERR_UNSUPPORTED) && !c->frag)
      continue;  /* no table for this kind here (no reference, or a kind
                    that needs sm_80); the others still print */
    if (st != FJ_OK)
      rc = cli_fj_error(c, ctx, st);
    else
      print_lut(&l);
  }
  fj_ctx_destroy(ctx);
  return rc;
}

