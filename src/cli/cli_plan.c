/*
 * cli_plan.c -- flashjit plan: what fj_attention_fwd would launch for a
 * problem, one key=value a line, with no GPU (a compile-only context for
 * --arch, planning for --sms multiprocessors) or for --device's GPU.  A
 * --varlen or --page-size problem is planned from its bounds: its index
 * arrays are placeholders (cli_problem); --param's tensors have extents
 * and no data (a plan needs none).
 */
#include <stdio.h>

#include "cli.h"

/* An expression as one value: a control character (a newline, a tab,
 * which the expressions may hold) escaped, so that it stays on its line. */
static void print_expr(const char *key, const char *text, const char *before,
                       const char *after)
{
  printf("%s%s=", before, key);
  for (const unsigned char *s = (const unsigned char *)text; *s; s++)
    if (*s == '\n')
      fputs("\\n", stdout);
    else if (*s == '\t')
      fputs("\\t", stdout);
    else if (*s < 0x20 || *s == 0x7f)
      printf("\\x%02x", *s);
    else
      putchar(*s);
  fputs(after, stdout);
}

void cli_mods_print(const cli *c, const char *before, const char *after)
{
  const fj_mods *m = &c->mods;
  if (!c->mods_on)
    return;
  if (m->window_left != -1 || m->window_right != -1)
    printf("%swindow=%d,%d%s", before, m->window_left, m->window_right, after);
  if (m->softcap > 0.f)
    printf("%ssoftcap=%g%s", before, (double)m->softcap, after);
  if (m->sinks)
    printf("%ssinks=%g%s", before, (double)c->sink, after);
  if (m->block_mask)
    printf("%sblock_mask=%d,%d%s", before, m->block_mask->block_q,
           m->block_mask->block_kv, after);
  if (m->checked)
    printf("%schecked=1%s", before, after);
  if (m->score && m->score[0])
    print_expr("score_mod", m->score, before, after);
  if (m->mask && m->mask[0])
    print_expr("mask_mod", m->mask, before, after);
  for (int i = 0; i < m->num_params; i++)
    printf("%s%s%s:%s:%d%s", i ? "" : before, i ? "," : "params=",
           m->params[i].name, cli_mod_type_name(m->params[i].type),
           m->params[i].rank, i + 1 < m->num_params ? "" : after);
}

/* mods=none, or the pieces that are on and a line for each. */
static void print_mods(const cli *c)
{
  const fj_mods *m = &c->mods;
  if (!c->mods_on) {
    printf("mods=none\n");
    return;
  }
  const char *pieces[] = {
      m->window_left != -1 || m->window_right != -1 ? "window" : NULL,
      m->softcap > 0.f ? "softcap" : NULL,
      m->sinks ? "sinks" : NULL,
      m->block_mask ? "block_mask" : NULL,
      m->checked ? "checked" : NULL,
      m->score && m->score[0] ? "score_mod" : NULL,
      m->mask && m->mask[0] ? "mask_mod" : NULL,
      m->num_params > 0 ? "params" : NULL};
  const char *sep = "mods=";
  for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
    if (pieces[i]) {
      printf("%s%s", sep, pieces[i]);
      sep = ",";
    }
  printf("\n");
  cli_mods_print(c, "", "\n");
}

static void print_grid(const char *key, const unsigned g[3])
{
  printf("%s=%u,%u,%u\n", key, g[0], g[1], g[2]);
}

/* The relative table's kernel, where p's kernels read one (its bytes are
 * the workspace's last; naming it compiles it): 0, or the exit status of
 * a failure other than there being none. */
static int print_rel_table(cli *c, fj_ctx *ctx, const fj_problem *p)
{
  fj_kernel *k;
  fj_status st = fj_rel_table_kernel(ctx, p, &k);
  if (st == FJ_OK)
    printf("rel_table=%s\n", fj_kernel_name(k));
  return st == FJ_OK || st == FJ_ERR_NOT_FOUND ? 0 : cli_fj_error(c, ctx, st);
}

/* plan --backward: fj_attention_bwd_plan's choice, a key=value a line. */
static int plan_backward(cli *c, fj_ctx *ctx, const fj_problem *p)
{
  fj_bwd_plan plan;
  fj_status st = fj_attention_bwd_plan(ctx, p, &plan);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  printf("problem=%d,%d/%d,%d/%d,%d\n", p->batch, p->heads_q, p->heads_kv,
         p->seq_q, p->seq_kv, p->head_dim);
  printf("arch=%s\n", fj_ctx_arch(ctx));
  printf("direction=backward\n");
  printf("deterministic=%d\n", p->deterministic);
  for (int i = 0; i < FJ_BWD_KERNELS; i++) {
    fj_kernel *k;
    static const char *const keys[] = {"preprocess", "main", "postprocess"};
    st = fj_attention_bwd_kernel(ctx, p, &plan, i, &k);
    if (st != FJ_OK)
      return cli_fj_error(c, ctx, st);
    printf("%s=%s\n", keys[i], fj_kernel_name(k));
  }
  print_mods(c);
  print_grid("grid", plan.grid);
  printf("threads=%u\n", plan.threads);
  printf("smem_bytes=%u\n", plan.smem_bytes);
  printf("rows_grid=%u\n", plan.rows_grid);
  int rc = print_rel_table(c, ctx, p);
  if (rc)
    return rc;
  printf("workspace_bytes=%zu\n", plan.workspace_bytes);
  return 0;
}

int cli_cmd_plan(cli *c)
{
  fj_problem p;
  int rc = cli_problem(c, &p);
  if (rc)
    return rc;
  int on_device = cli_flag_given(c, "device");
  if (on_device && (cli_flag_given(c, "arch") || cli_flag_given(c, "sms")))
    return cli_usage_error(c, "--device plans for that GPU: it takes no "
                              "--arch or --sms");
  fj_ctx *ctx;
  rc = cli_open_ctx(c, on_device ? c->device : -1,
                    on_device ? NULL : c->arch ? c->arch : "sm_90a", &ctx);
  if (rc)
    return rc;
  /* FP8 scales are launch arguments; only their presence is checked. */
  static const float placeholder[1];
  if (p.kv_dtype == FJ_E4M3 || p.dtype == FJ_E4M3)
    p.k_scale = p.v_scale = p.q_scale = placeholder;
  if (c->backward) {
    rc = plan_backward(c, ctx, &p);
    fj_ctx_destroy(ctx);
    return rc;
  }
  fj_plan plan;
  fj_status st = fj_attention_plan(ctx, &p, &plan);
  if (st != FJ_OK) {
    rc = cli_fj_error(c, ctx, st);
    fj_ctx_destroy(ctx);
    return rc;
  }
  char name[160];
  fj_variant_name(&plan.variant, name, sizeof name);
  const fj_variant *v = &plan.variant;
  printf("problem=%d,%d/%d,%d/%d,%d\n", p.batch, p.heads_q, p.heads_kv,
         p.seq_q, p.seq_kv, p.head_dim);
  if (cli_head_dim_v(&p) != p.head_dim)
    printf("head_dim_v=%d\n", cli_head_dim_v(&p));
  printf("arch=%s\n", fj_ctx_arch(ctx));
  printf("sm_count=%d\n", plan.sm_count);
  printf("sm_count_from=%s\n", on_device                ? "device"
                               : cli_flag_given(c, "sms") ? "--sms"
                                                          : "arch (assumed)");
  printf("variant=%s\n", name);
  printf("from=%s\n", plan.from == FJ_CHOICE_TUNED ? "tuned" : "heuristic");
  printf("mma=%s\n", fj_mma_name(v->mma));
  printf("pack_gqa=%d\n", v->pack_gqa);
  printf("varlen=%d\n", v->varlen);
  printf("paged=%d\n", v->paged);
  if (v->paged)
    printf("page_size=%d\n", p.page_size);
  print_mods(c);
  printf("rows=%d\n", plan.rows);
  print_grid("grid", plan.grid);
  printf("threads=%u\n", plan.threads);
  printf("smem_bytes=%u\n", plan.smem_bytes);
  printf("blocks_per_sm=%d\n", plan.blocks_per_sm);
  printf("splits=%d\n", plan.splits);
  if (v->split_kv) {
    /* As the library names it (attention.c's fj__combine_kernel): O's
     * head dim, the dtype, varlen, sinks, and a block's columns where
     * they are a slice of O's. */
    int dv = v->head_dim_v ? v->head_dim_v : v->head_dim;
    char slice[16] = "";
    if (plan.combine_cols != dv)
      snprintf(slice, sizeof slice, "_c%d", plan.combine_cols);
    printf("combine=fj_combine_d%d_%s%s%s%s\n", dv, fj_dtype_name(v->dtype),
           v->varlen ? "_vl" : "", p.mods && p.mods->sinks ? "_sink" : "",
           slice);
    print_grid("combine_grid", plan.combine_grid);
    printf("combine_threads=%u\n", plan.combine_threads);
  }
  rc = print_rel_table(c, ctx, &p);
  if (!rc)
    printf("workspace_bytes=%zu\n", plan.workspace_bytes);
  fj_ctx_destroy(ctx);
  return rc;
}
