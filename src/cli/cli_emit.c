/*
 * cli_emit.c -- `flashjit emit`: renders and compiles one variant and writes
 * its source, PTX, cubin, resources or log, or with --sweep compiles every
 * combination (the sweep that `run --sweep` times too).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static int write_out(const cli *c, const void *data, size_t len, int binary)
{
  FILE *f = stdout;
  if (c->out_file && !(f = fopen(c->out_file, "wb"))) {
    fprintf(stderr, "flashjit emit: cannot write %s: %s\n", c->out_file,
            strerror(errno));
    return EXIT_FAIL;
  }
  if (binary && f == stdout && isatty(STDOUT_FILENO)) {
    fprintf(stderr, "flashjit emit: the cubin is binary: use -o FILE or a "
                    "redirection\n");
    return EXIT_USAGE;
  }
  int bad = fwrite(data, 1, len, f) != len;
  if (f != stdout)
    bad |= fclose(f) != 0;
  else
    bad |= fflush(f) != 0;
  if (bad) {
    fprintf(stderr, "flashjit emit: write failed: %s\n", strerror(errno));
    return EXIT_FAIL;
  }
  return 0;
}

static int print_resources(const cli *c, const fj_kernel *k,
                           const char *arch)
{
  fj_resources r;
  fj_kernel_resources(k, &r);
  char text[1024];
  int n = snprintf(
      text, sizeof text,
      "variant=%s\narch=%s\nregisters=%d\nshared_bytes=%d\nshared_static=%d\n"
      "shared_dynamic=%d\nspill_store_bytes=%d\nspill_load_bytes=%d\n"
      "local_bytes=%d\nthreads=%d\nbarriers=%d\ncubin_bytes=%zu\n"
      "ptx_bytes=%zu\ncompile_ms=%.1f\ncache=%s\n",
      fj_kernel_name(k), arch, r.registers, r.shared_static + r.shared_dynamic,
      r.shared_static, r.shared_dynamic, r.spill_store_bytes,
      r.spill_load_bytes, r.local_bytes, r.threads, r.barriers, r.cubin_bytes,
      r.ptx_bytes, r.compile_ms, r.cache == FJ_CACHE_MISS ? "miss" : "hit");
  return write_out(c, text, (size_t)n, 0);
}

static int emit_what(const cli *c, const fj_kernel *k, const char *arch)
{
  size_t len;
  const char *w = c->what ? c->what : "source";
  if (strcmp(w, "source") == 0) {
    const char *s = fj_kernel_source(k, &len);
    return write_out(c, s, len, 0);
  }
  if (strcmp(w, "ptx") == 0) {
    const char *s = fj_kernel_ptx(k, &len);
    return write_out(c, s, len, 0);
  }
  if (strcmp(w, "cubin") == 0) {
    const void *b = fj_kernel_cubin(k, &len);
    return write_out(c, b, len, 1);
  }
  if (strcmp(w, "log") == 0) {
    const char *s = fj_kernel_log(k);
    return write_out(c, s, strlen(s), 0);
  }
  if (strcmp(w, "resources") == 0)
    return print_resources(c, k, arch);
  return cli_usage_error(c, "invalid value '%s' for --what: one of source, "
                            "ptx, cubin, resources, log",
                         w);
}

/* ---- emit --sweep -------------------------------------------------------------- */

/* The structural axes a sweep varies, each unless fixed by a flag. */
typedef struct sweep_axis {
  const char *flag;
  size_t offset;
  int values[4];
  int count;
} sweep_axis;

static const sweep_axis sweep_axes[] = {
    {"tile-m", OFF(v.tile_m), {64, 128}, 2},
    {"tile-n", OFF(v.tile_n), {32, 64, 128}, 3},
    {"warps", OFF(v.warps), {4, 8}, 2},
    {"stages", OFF(v.stages), {1, 2, 3}, 3},
    {"swizzle", OFF(v.swizzle), {FJ_SWIZZLE_NONE, FJ_SWIZZLE_PAD, FJ_SWIZZLE_XOR}, 3},
    {"softmax", OFF(v.softmax), {FJ_SOFTMAX_SMEM, FJ_SOFTMAX_REGS}, 2},
};
enum { SWEEP_AXES = sizeof sweep_axes / sizeof sweep_axes[0] };

/* The wgmma family's space: consumer warpgroups (tile_m and warps move
 * together), key tiles and stages, each unless fixed by a flag. */
static size_t wgmma_sweep(const cli *c, fj_variant *out)
{
  static const int groups[3][2] = {{64, 8}, {128, 12}, {192, 16}};
  static const int tn[] = {64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256};
  int fix_m = cli_flag_given(c, "tile-m") || cli_flag_given(c, "warps");
  int fix_n = cli_flag_given(c, "tile-n"), fix_s = cli_flag_given(c, "stages");
  size_t n = 0;
  for (int g = 0; g < (fix_m ? 1 : 3); g++)
    for (size_t b = 0; b < (fix_n ? 1 : sizeof tn / sizeof tn[0]); b++)
      for (int s = 2; s <= (fix_s ? 2 : 4); s++, n++) {
        if (!out)
          continue;
        out[n] = c->v;
        if (!fix_m) {
          out[n].tile_m = groups[g][0];
          out[n].warps = groups[g][1];
        }
        if (!fix_n)
          out[n].tile_n = tn[b];
        if (!fix_s)
          out[n].stages = s;
      }
  return n;
}

/* All combinations, written into out (NULL: only counted). */
static size_t sweep_variants(const cli *c, fj_variant *out)
{
  if (c->v.mma == FJ_MMA_WGMMA)
    return wgmma_sweep(c, out);
  size_t n = 1, count[SWEEP_AXES];
  for (size_t a = 0; a < SWEEP_AXES; a++) {
    count[a] = cli_flag_given(c, sweep_axes[a].flag)
                   ? 1
                   : (size_t)sweep_axes[a].count;
    n *= count[a];
  }
  for (size_t i = 0; out && i < n; i++) {
    cli tmp = *c;
    size_t rest = i;
    for (size_t a = 0; a < SWEEP_AXES; a++) {
      if (count[a] > 1)
        *(int *)(void *)((char *)&tmp + sweep_axes[a].offset) =
            sweep_axes[a].values[rest % count[a]];
      rest /= count[a];
    }
    out[i] = tmp.v;
  }
  return n;
}

static void sweep_progress(void *user, size_t done, size_t total)
{
  (void)user;
  if (isatty(STDERR_FILENO))
    fprintf(stderr, "\rcompiling: %zu/%zu", done, total);
  else if (done == total || done % 25 == 0)
    fprintf(stderr, "compiling: %zu/%zu\n", done, total);
}

static void sweep_line(fj_ctx *ctx, const fj_variant *v, fj_status st)
{
  char name[160];
  fj_variant_name(v, name, sizeof name);
  fj_kernel *k;
  if (st == FJ_OK)
    st = fj_kernel_get(ctx, v, &k);
  if (st != FJ_OK) {
    char why[160];
    fj_variant_check(ctx, v);
    snprintf(why, sizeof why, "%s", fj_errmsg(ctx));
    why[strcspn(why, "\n")] = '\0';
    printf("%-56s refused: %s\n", name, why);
    return;
  }
  fj_resources r;
  fj_kernel_resources(k, &r);
  printf("%-56s regs=%3d smem=%6d spill=%d/%d local=%d compile_ms=%.0f\n", name,
         r.registers, r.shared_static + r.shared_dynamic, r.spill_store_bytes,
         r.spill_load_bytes, r.local_bytes, r.compile_ms);
}

/* The sweep's variants, compiled in parallel; *st gets each one's status.
 * Returns how many (0 when out of memory). */
size_t cli_sweep_prepare(const cli *c, fj_ctx *ctx, fj_variant **vs,
                         fj_status **st)
{
  size_t n = sweep_variants(c, NULL);
  *vs = calloc(n, sizeof **vs);
  *st = calloc(n, sizeof **st);
  if (!*vs || !*st) {
    free(*vs);
    free(*st);
    return 0;
  }
  sweep_variants(c, *vs);
  fj_prepare_opts o = {c->workers, sweep_progress, NULL};
  fj_kernel_prepare(ctx, *vs, n, &o, *st);
  if (isatty(STDERR_FILENO))
    fputc('\n', stderr);
  return n;
}

static int emit_sweep(cli *c, fj_ctx *ctx)
{
  fj_variant *vs;
  fj_status *st;
  size_t n = cli_sweep_prepare(c, ctx, &vs, &st);
  if (!n)
    return EXIT_FAIL;
  for (size_t i = 0; i < n; i++)
    sweep_line(ctx, &vs[i], st[i]);
  free(vs);
  free(st);
  return 0;
}

/* --page-size for a paged variant: the kernel does not depend on it, but
 * a value the library would refuse for a problem is refused here too, by
 * checking a one-token problem paged that way. */
static int emit_check_page_size(const cli *c, fj_ctx *ctx)
{
  static const int32_t placeholder[1];
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, 1, 1, c->v.head_dim, c->v.dtype, FJ_BHSD);
  p.block_table = p.seqused_kv = placeholder;
  p.page_size = c->page_size;
  p.max_pages = p.num_pages = 1;
  fj_status st = fj_problem_check(ctx, &p);
  return st == FJ_OK ? 0 : cli_fj_error(c, ctx, st);
}

int cli_cmd_emit(cli *c)
{
  if (c->what && strcmp(c->what, "source") && strcmp(c->what, "ptx") &&
      strcmp(c->what, "cubin") && strcmp(c->what, "log") &&
      strcmp(c->what, "resources"))
    return cli_usage_error(c, "invalid value '%s' for --what: one of source, "
                              "ptx, cubin, resources, log",
                           c->what);
  fj_ctx *ctx;
  int rc = cli_open_ctx(c, -1, c->arch ? c->arch : "sm_90a", &ctx);
  if (rc)
    return rc;
  if (cli_flag_given(c, "page-size") && (rc = emit_check_page_size(c, ctx))) {
    fj_ctx_destroy(ctx);
    return rc;
  }
  if (c->sweep) {
    rc = emit_sweep(c, ctx);
    fj_ctx_destroy(ctx);
    return rc;
  }
  fj_kernel *k;
  fj_status st = fj_kernel_get(ctx, &c->v, &k);
  rc = st == FJ_OK ? emit_what(c, k, fj_ctx_arch(ctx))
                   : cli_fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}

