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

/* How emit chose its kernel: the library's plan for a problem, or the
 * variant flags. */
typedef struct emit_choice {
  int planned;
  int backward;   /* a kernel of the library's backward (fj_attention_bwd) */
  int rel_table;  /* the relative table's kernel (fj_rel_table_kernel) */
  fj_problem p;
} emit_choice;

static int print_resources(const cli *c, const fj_kernel *k, const char *arch,
                           const emit_choice *ch)
{
  fj_resources r;
  fj_kernel_resources(k, &r);
  char text[1024], chosen[160] = "chosen=flags\n";
  const fj_problem *p = &ch->p;
  if (ch->planned)
    snprintf(chosen, sizeof chosen,
             "chosen=library%s\nproblem=%d,%d/%d,%d/%d,%d\n",
             ch->backward    ? "\ndirection=backward"
             : ch->rel_table ? "\nkernel=rel_table"
                             : "",
             p->batch, p->heads_q, p->heads_kv, p->seq_q, p->seq_kv,
             p->head_dim);
  int n = snprintf(
      text, sizeof text,
      "variant=%s\n%sarch=%s\nregisters=%d\nshared_bytes=%d\n"
      "shared_static=%d\nshared_dynamic=%d\nspill_store_bytes=%d\n"
      "spill_load_bytes=%d\nlocal_bytes=%d\nthreads=%d\nbarriers=%d\n"
      "cubin_bytes=%zu\nptx_bytes=%zu\ncompile_ms=%.1f\ncache=%s\n",
      fj_kernel_name(k), chosen, arch, r.registers,
      r.shared_static + r.shared_dynamic, r.shared_static, r.shared_dynamic,
      r.spill_store_bytes, r.spill_load_bytes, r.local_bytes, r.threads,
      r.barriers, r.cubin_bytes, r.ptx_bytes, r.compile_ms,
      r.cache == FJ_CACHE_MISS ? "miss" : "hit");
  return write_out(c, text, (size_t)n, 0);
}

static const char *const whats[] = {"source", "ptx",  "cubin",
                                    "resources", "log", "name"};

/* 0 for a --what emit knows (or none), else the exit status. */
static int check_what(const cli *c)
{
  for (size_t i = 0; c->what && i < sizeof whats / sizeof whats[0]; i++)
    if (!strcmp(c->what, whats[i]))
      return 0;
  if (!c->what)
    return 0;
  char q[300];
  return cli_usage_error(c, "invalid value '%s' for --what: one of source, "
                            "ptx, cubin, resources, log, name",
                         cli_quote(c->what, q, sizeof q));
}

/* Says on stderr that the kernel is the library's choice (stdout holds
 * only the kernel's text). */
static void say_planned(const cli *c, const fj_kernel *k, const char *arch,
                        const emit_choice *ch)
{
  const fj_problem *p = &ch->p;
  if (ch->rel_table) {
    fprintf(stderr, "flashjit emit: %s fills the score expression's relative "
                    "table for B,H/Hkv,S/Skv,D = %d,%d/%d,%d/%d,%d on %s (once "
                    "a launch, before the attention kernels)\n",
            fj_kernel_name(k), p->batch, p->heads_q, p->heads_kv, p->seq_q,
            p->seq_kv, p->head_dim, arch);
    return;
  }
  fprintf(stderr, "flashjit emit: %s is %s for B,H/Hkv,"
                  "S/Skv,D = %d,%d/%d,%d/%d,%d on %s (%s%s)\n",
          fj_kernel_name(k),
          ch->backward ? "the main kernel of the library's backward"
          : c->first   ? "the first kernel of the library's choice"
                       : "the library's choice",
          p->batch, p->heads_q, p->heads_kv, p->seq_q, p->seq_kv, p->head_dim,
          arch,
          ch->backward ? "as fj_attention_bwd would launch it"
          : c->first   ? "what run --jit-tiers launches while the choice compiles"
                       : "as run would launch it",
          ch->backward ? "" : "; variant flags pick another");
}

static int emit_what(const cli *c, const fj_kernel *k, const char *arch,
                     const emit_choice *ch)
{
  size_t len;
  const char *w = c->what ? c->what : "source";
  if (!strcmp(w, "resources"))
    return print_resources(c, k, arch, ch);
  if (!strcmp(w, "name")) {
    char line[200];
    int n = snprintf(line, sizeof line, "%s\n", fj_kernel_name(k));
    return write_out(c, line, (size_t)n, 0);
  }
  int rc;
  if (!strcmp(w, "ptx")) {
    const char *s = fj_kernel_ptx(k, &len);
    rc = write_out(c, s, len, 0);
  } else if (!strcmp(w, "cubin")) {
    const void *b = fj_kernel_cubin(k, &len);
    rc = write_out(c, b, len, 1);
  } else if (!strcmp(w, "log")) {
    const char *s = fj_kernel_log(k);
    rc = write_out(c, s, strlen(s), 0);
  } else {
    const char *s = fj_kernel_source(k, &len);
    rc = write_out(c, s, len, 0);
  }
  /* The note after the output, and only if it was written: a failing
   * command's error is the first line on stderr. */
  if (rc == 0 && ch->planned)
    say_planned(c, k, arch, ch);
  return rc;
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

/* Every combination of the axes' values (each axis not fixed by its
 * flag), written into out (NULL: only counted). */
static size_t axes_sweep(const cli *c, const sweep_axis *axes, size_t na,
                         fj_variant *out)
{
  size_t n = 1, count[8];
  for (size_t a = 0; a < na; a++) {
    count[a] = cli_flag_given(c, axes[a].flag) ? 1 : (size_t)axes[a].count;
    n *= count[a];
  }
  for (size_t i = 0; out && i < n; i++) {
    cli tmp = *c;
    size_t rest = i;
    for (size_t a = 0; a < na; a++) {
      if (count[a] > 1)
        *(int *)(void *)((char *)&tmp + axes[a].offset) = axes[a].values[rest % count[a]];
      rest /= count[a];
    }
    out[i] = tmp.v;
  }
  return n;
}

/* The mma family's wide heads (head dims above 256): 16- or 32-row tiles
 * whose 2, 4 or 8 warps split the keys (and V's columns), key tiles,
 * stages and swizzles; the softmax in registers. */
static const sweep_axis wide_axes[] = {
    {"tile-m", OFF(v.tile_m), {16, 32}, 2},
    {"tile-n", OFF(v.tile_n), {32, 64, 128}, 3},
    {"warps", OFF(v.warps), {2, 4, 8}, 3},
    {"stages", OFF(v.stages), {1, 2, 3}, 3},
    {"swizzle", OFF(v.swizzle), {FJ_SWIZZLE_PAD, FJ_SWIZZLE_XOR}, 2},
};

/* All combinations, written into out (NULL: only counted). */
static size_t sweep_variants(const cli *c, fj_variant *out)
{
  if (c->v.mma == FJ_MMA_WGMMA)
    return wgmma_sweep(c, out);
  if (c->v.mma == FJ_MMA_SYNC &&
      (c->v.head_dim > 256 || (c->v.head_dim_v && c->v.head_dim_v > 256))) {
    cli regs = *c;
    regs.v.softmax = FJ_SOFTMAX_REGS;
    return axes_sweep(&regs, wide_axes, sizeof wide_axes / sizeof wide_axes[0], out);
  }
  return axes_sweep(c, sweep_axes, SWEEP_AXES, out);
}

static void sweep_progress(void *user, size_t done, size_t total)
{
  (void)user;
  if (isatty(STDERR_FILENO))
    fprintf(stderr, "\rcompiling: %zu/%zu", done, total);
  else if (done == total || done % 25 == 0)
    fprintf(stderr, "compiling: %zu/%zu\n", done, total);
}

int cli_sweep_unbuilt(fj_ctx *ctx, const fj_variant *v, fj_status st,
                      const char *name)
{
  /* The batch keeps no message per variant, and the context's last
   * message is another call's: the check is asked again. */
  if (fj_variant_check(ctx, v) == FJ_OK) {
    printf("%-56s failed: %s\n", name, fj_status_str(st));
    return 1;
  }
  char why[400];
  snprintf(why, sizeof why, "%s", fj_errmsg(ctx));
  why[strcspn(why, "\n")] = '\0';
  printf("%-56s refused: %s\n", name, why);
  return 0;
}

/* One variant's line; returns 1 when it failed to build although the check
 * accepts it (a compile, template or memory failure: the sweep's exit
 * status says so), 0 when it built or was refused. */
static int sweep_line(fj_ctx *ctx, const fj_variant *v, fj_status st)
{
  char name[160];
  fj_variant_name(v, name, sizeof name);
  fj_kernel *k;
  if (st == FJ_OK)
    st = fj_kernel_get(ctx, v, &k);
  if (st != FJ_OK)
    return cli_sweep_unbuilt(ctx, v, st, name);
  fj_resources r;
  fj_kernel_resources(k, &r);
  printf("%-56s regs=%3d smem=%6d spill=%d/%d local=%d compile_ms=%.0f\n", name,
         r.registers, r.shared_static + r.shared_dynamic, r.spill_store_bytes,
         r.spill_load_bytes, r.local_bytes, r.compile_ms);
  return 0;
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

/* Whether any variant of the sweep passes the check; when none does, the
 * sweep is bad input: exit 2 with the first one's reason, before any
 * compile. */
static int sweep_check(cli *c, fj_ctx *ctx, const fj_variant *vs, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (fj_variant_check(ctx, &vs[i]) == FJ_OK)
      return 0;
  fj_status st = fj_variant_check(ctx, &vs[0]);
  char line[400];
  snprintf(line, sizeof line, "no variant of the sweep can be built: %s",
           fj_errmsg(ctx));
  line[strcspn(line, "\n")] = '\0';
  (void)st;
  return cli_usage_error(c, "%s", line);
}

int cli_sweep_failed(const char *who, const char *why)
{
  fprintf(stderr, "flashjit %s --sweep: %s\n", who, why);
  return EXIT_FAIL;
}

static int emit_sweep(cli *c, fj_ctx *ctx)
{
  fj_variant *vs;
  fj_status *st;
  size_t n = sweep_variants(c, NULL);
  if (!(vs = calloc(n, sizeof *vs)))
    return cli_sweep_failed("emit", "its variants: out of memory");
  sweep_variants(c, vs);
  int rc = sweep_check(c, ctx, vs, n);
  free(vs);
  if (rc)
    return rc;
  /* Which family the sweep walks, first: without --mma it is the
   * variant flags' default (wmma), not the library's choice for the
   * arch. */
  printf("# sweep of the %s family%s on %s: %zu variants (--mma wmma|mma|"
         "wgmma chooses the family)\n",
         fj_mma_name(c->v.mma),
         cli_flag_given(c, "mma") ? "" : " (the default without --mma)",
         fj_ctx_arch(ctx), n);
  fflush(stdout);
  if (!(n = cli_sweep_prepare(c, ctx, &vs, &st)))
    return cli_sweep_failed("emit", "its variants: out of memory");
  size_t failed = 0;
  for (size_t i = 0; i < n; i++)
    failed += (size_t)sweep_line(ctx, &vs[i], st[i]);
  free(vs);
  free(st);
  if (failed) {
    char line[120];
    snprintf(line, sizeof line, "%zu of its %zu variants failed to build "
             "(the lines marked failed)", failed, n);
    return cli_sweep_failed("emit", line);
  }
  return 0;
}

/* --page-size for a paged variant the flags give: the kernel does not
 * depend on it, but a value the library would refuse for a problem is
 * refused here too, by checking a one-token problem paged that way. */
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

/* The kernel emit shows: the variant the flags describe, or the library's
 * choice (fj_attention_plan, as fj_attention_fwd makes it) for the
 * problem of --shape and friends on --arch. */
static int emit_variant(cli *c, fj_ctx *ctx, fj_variant *v, emit_choice *ch)
{
  ch->planned = !c->variant_given;
  if (!ch->planned) {
    *v = c->v;
    return cli_flag_given(c, "page-size") ? emit_check_page_size(c, ctx) : 0;
  }
  int rc = cli_problem(c, &ch->p);
  if (rc)
    return rc;
  /* FP8 scales are launch arguments; only their presence is checked. */
  static const float placeholder[1];
  if (ch->p.kv_dtype == FJ_E4M3 || ch->p.dtype == FJ_E4M3)
    ch->p.k_scale = ch->p.v_scale = ch->p.q_scale = placeholder;
  fj_plan plan;
  fj_status st = fj_attention_plan(ctx, &ch->p, &plan);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  *v = plan.variant;
  return 0;
}

/* Whether a flag that picks a variant, or --first or --sweep, was given:
 * the kernels of --shape's problem (--backward, --rel-table) take none. */
static int variant_flags_given(cli *c)
{
  return cli_flag_given(c, "tile-m") || cli_flag_given(c, "tile-n") ||
         cli_flag_given(c, "warps") || cli_flag_given(c, "stages") ||
         cli_flag_given(c, "mma") || cli_flag_given(c, "swizzle") ||
         cli_flag_given(c, "softmax") || c->first || c->sweep;
}

/* emit --backward: the main kernel of the backward of --shape's problem
 * (fj_attention_bwd_plan's), or each kernel's resources. */
static int emit_backward(cli *c, fj_ctx *ctx)
{
  if (variant_flags_given(c))
    return cli_usage_error(c, "--backward emits the library's backward for "
                              "--shape's problem: it takes no variant flags, "
                              "--first or --sweep");
  emit_choice ch;
  memset(&ch, 0, sizeof ch);
  ch.planned = ch.backward = 1;
  int rc = cli_problem(c, &ch.p);
  if (rc)
    return rc;
  fj_bwd_plan plan;
  fj_status st = fj_attention_bwd_plan(ctx, &ch.p, &plan);
  int all = c->what && !strcmp(c->what, "resources");
  for (int i = all ? 0 : 1; st == FJ_OK && i < (all ? FJ_BWD_KERNELS : 2); i++) {
    fj_kernel *k;
    st = fj_attention_bwd_kernel(ctx, &ch.p, &plan, i, &k);
    if (st == FJ_OK && (rc = emit_what(c, k, fj_ctx_arch(ctx), &ch)) != 0)
      return rc;
  }
  return st == FJ_OK ? 0 : cli_fj_error(c, ctx, st);
}

/* emit --rel-table: the kernel that fills the score expression's
 * relative table for --shape's problem (fj_rel_table_kernel). */
static int emit_rel_table(cli *c, fj_ctx *ctx)
{
  if (variant_flags_given(c) || c->backward)
    return cli_usage_error(c, "--rel-table emits the relative table's kernel "
                              "for --shape's problem: it takes no variant "
                              "flags, --first, --sweep or --backward");
  emit_choice ch;
  memset(&ch, 0, sizeof ch);
  ch.planned = ch.rel_table = 1;
  int rc = cli_problem(c, &ch.p);
  if (rc)
    return rc;
  fj_kernel *k;
  fj_status st = fj_rel_table_kernel(ctx, &ch.p, &k);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  return emit_what(c, k, fj_ctx_arch(ctx), &ch);
}

static int emit_one(cli *c, fj_ctx *ctx)
{
  fj_variant v;
  emit_choice ch;
  memset(&ch, 0, sizeof ch);
  int rc = emit_variant(c, ctx, &v, &ch);
  if (rc)
    return rc;
  fj_kernel *k;
  fj_status st = c->first ? fj_kernel_get_first(ctx, &v, &k)
                          : fj_kernel_get(ctx, &v, &k);
  return st == FJ_OK ? emit_what(c, k, fj_ctx_arch(ctx), &ch)
                     : cli_fj_error(c, ctx, st);
}

int cli_cmd_emit(cli *c)
{
  int rc = check_what(c);
  if (rc)
    return rc;
  fj_ctx *ctx;
  if ((rc = cli_open_ctx(c, -1, c->arch ? c->arch : "sm_90a", &ctx)))
    return rc;
  if (c->sweep && cli_flag_given(c, "page-size"))
    rc = emit_check_page_size(c, ctx);
  if (!rc)
    rc = c->rel_table  ? emit_rel_table(c, ctx)
         : c->backward ? emit_backward(c, ctx)
         : c->sweep    ? emit_sweep(c, ctx)
                       : emit_one(c, ctx);
  fj_ctx_destroy(ctx);
  return rc;
}
