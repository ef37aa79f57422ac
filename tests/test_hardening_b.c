/*
 * test_hardening_b.c -- issue 35, part B: the limits of template
 * development (every Lua entry point bounded), the cache's trust boundary
 * (packs checked as renders are), and a newcomer's first hour.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner.h"
#include "template.h"
#include "util.h"

/* ---- class 7: template development is bounded too ----------------------------- */

/* A directory holding every built-in template, render.lua edited by
 * `edit` (a Lua line put first, or a function's first line, see below)
 * and `name` holding `text` (both optional); FLASHJIT_TEMPLATE_DIR points
 * at it. */
static int dev_dir(const char *renderer_first, const char *name,
                   const char *text)
{
  const char *dir = fjt_tmpdir();
  char path[4400];
  for (size_t i = 0; i < fj__embedded_count; i++) {
    const fj_embedded *e = &fj__embedded[i];
    fj_buf b = {0};
    if (!strcmp(e->name, "render.lua") && renderer_first)
      fj__buf_appendf(&b, "%s\n", renderer_first);
    if (name && !strcmp(e->name, name))
      fj__buf_appendf(&b, "%s\n", text);
    fj__buf_append(&b, e->data, e->len);
    snprintf(path, sizeof path, "%s/%s", dir, e->name);
    int bad = fjt_write_file(path, b.data, b.len);
    fj__buf_free(&b);
    if (bad)
      return -1;
  }
  return setenv("FLASHJIT_TEMPLATE_DIR", dir, 1);
}

/* Checks (renders, no compile) the default variant of head dim 64 for
 * sm_80 in a fresh context; its status, the milliseconds it took in *ms,
 * the context in *ctx. */
static fj_status dev_build(fj_ctx **ctx, double *ms)
{
  fj_ctx_destroy(*ctx);
  *ctx = fjt_ctx("sm_80", NULL);
  if (!*ctx)
    return FJ_ERR_IO;
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  double t0 = fj__now_ms();
  fj_status st = fj_variant_check(*ctx, &v);
  *ms = fj__now_ms() - t0;
  return st;
}

/* A render.lua of the developer's runs with the bounded string functions
 * from its first line on: a pattern bomb at its top level, or kept in a
 * local and run at render time, is refused at once. */
int test_hostile_b_renderer_patterns(void)
{
  fj_ctx *ctx = NULL;
  double ms;
  CHECK(dev_dir("string.find(string.rep('a', 40), string.rep('a*', 40) .. 'b')",
                NULL, NULL) == 0);
  CHECK_ST(ctx, dev_build(&ctx, &ms), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "cannot load the template renderer");
  CHECK_MSG(ctx, "string.find: the pattern 'a*a*a*");
  CHECK_MSG(ctx, "could take");
  CHECK(ms < 5000);
  CHECK(dev_dir("local f, r = string.find, string.rep\n"
                "_G.__bomb = function() return f(r('a', 40), r('a*', 40) .. 'b') end",
                NULL, NULL) == 0);
  /* The bomb kept by the renderer, fired by a template through an
   * unsandboxed global the renderer set: still the bounded function. */
  fj_ctx_destroy(ctx);
  ctx = NULL;
  const char *dir = getenv("FLASHJIT_TEMPLATE_DIR");
  char path[4400];
  snprintf(path, sizeof path, "%s/render.lua", dir);
  size_t len = 0;
  char *text = fj__file_read(path, 1 << 20, &len);
  CHECK(text);
  fj_buf b = {0};
  const char *at = strstr(text, "function R.render(name, params)\n");
  CHECK(at);
  fj__buf_append(&b, text, (size_t)(at - text));
  fj__buf_appendf(&b, "function R.render(name, params) __bomb()\n");
  fj__buf_appendf(&b, "%s", at + strlen("function R.render(name, params)\n"));
  free(text);
  CHECK(fjt_write_file(path, b.data, b.len) == 0);
  fj__buf_free(&b);
  CHECK_ST(ctx, dev_build(&ctx, &ms), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "could take");
  CHECK(ms < 5000);
  /* A renderer edited but sound renders the real kernels with the
   * bounded functions: its own patterns are linear and charged by what
   * they scan. */
  CHECK(dev_dir("-- a developer's note", NULL, NULL) == 0);
  CHECK_OK(ctx, dev_build(&ctx, &ms));
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* Work inside C functions and VM instructions that the count hook does not
 * see stops within about a call of the limits: many short string.rep
 * calls, a copy of 40 MB a call (string.upper, `..`, string.format,
 * table.concat). */
int test_hostile_b_c_loops(void)
{
  static const char *const loops[] = {
      "{% for i = 1, 1e9 do local s = ('x'):rep(100) end %}",
      "{% for i = 1, 1e9 do local s = ('ab'):rep(50, ',') end %}",
      "{% local s = ('x'):rep(4e7) for i = 1, 1e9 do local u = s:upper() end %}",
      "{% local s = ('x'):rep(4e7) for i = 1, 1e9 do local u = s:reverse() end %}",
      "{% local s = ('x'):rep(4e7) for i = 1, 1e9 do local u = s .. i end %}",
      "{% local s = ('x'):rep(4e7) for i = 1, 1e9 do local u = string.format('%s', s) end %}",
      "{% local s = ('x'):rep(2e7) for i = 1, 1e9 do local u = table.concat({s, s}) end %}",
      "{% local s = ('x'):rep(4e7) for i = 1, 1e9 do local u = s:sub(2) end %}",
  };
  fj_ctx *ctx = NULL;
  for (size_t i = 0; i < FJ_ARRAY_LEN(loops); i++) {
    double ms;
    CHECK(dev_dir(NULL, "common.cuh", loops[i]) == 0);
    fj_status st = dev_build(&ctx, &ms);
    if (st != FJ_ERR_TEMPLATE || ms > 6000)
      fprintf(stderr, "loop %zu: status %d after %.0f ms: %s\n", i, (int)st,
              ms, fj_errmsg(ctx));
    CHECK_ST(ctx, st, FJ_ERR_TEMPLATE);
    CHECK(strstr(fj_errmsg(ctx), "instruction limit") ||
          strstr(fj_errmsg(ctx), "memory limit"));
    CHECK(ms < 6000);
  }
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}
