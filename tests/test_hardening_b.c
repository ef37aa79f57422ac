/*
 * test_hardening_b.c -- issue 35, part B: the limits of template
 * development (every Lua entry point bounded), the cache's trust boundary
 * (packs checked as renders are), and a newcomer's first hour.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "runner.h"
#include "template.h"
#include "tune.h"
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
    double ms = 0;
    CHECK(dev_dir(NULL, "common.cuh", loops[i]) == 0);
    fj_status st = dev_build(&ctx, &ms);
    /* Bounded, not fast: the limit stops each loop after 200 million Lua
     * instructions, which take 2-7 s on a loaded 2-core machine; unbounded
     * they would run for hours. */
    if (st != FJ_ERR_TEMPLATE || ms > 20000)
      fprintf(stderr, "loop %zu: status %d after %.0f ms: %s\n", i, (int)st,
              ms, fj_errmsg(ctx));
    CHECK_ST(ctx, st, FJ_ERR_TEMPLATE);
    CHECK(strstr(fj_errmsg(ctx), "instruction limit") ||
          strstr(fj_errmsg(ctx), "memory limit"));
    CHECK(ms < 20000);
  }
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- class 2: the cache's trust boundary ---------------------------------------- */

#include "cache.h"
#include "ctx.h"
#include "entry.h"
#include "package.h"

/* The entries of a genuine cache: one kernel's render and kernel entries. */
typedef struct gentry {
  char kind[16], label[160];
  fj_cache_key key;
  char *payload;
  size_t len;
} gentry;

typedef struct genuine {
  gentry e[8];
  int n;
  fj_variant v;
  char *source;  /* the kernel's rendered source */
  int threads;
} genuine;

/* Reads every entry file of dir into g. */
static int genuine_read(genuine *g, const char *dir)
{
  char cmd[4400];
  snprintf(cmd, sizeof cmd, "ls %s", dir);
  FILE *ls = popen(cmd, "r");
  char name[256];
  while (ls && fgets(name, sizeof name, ls) && g->n < 8) {
    name[strcspn(name, "\n")] = '\0';
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len;
    char *data = fj__file_read(path, FJ_CACHE_ENTRY_MAX, &len);
    fj_entry_view v;
    if (!data || fj__cache_entry_parse(data, len, &v)) {
      free(data);
      continue;
    }
    gentry *e = &g->e[g->n++];
    snprintf(e->kind, sizeof e->kind, "%.*s", (int)v.kind_len, v.kind);
    snprintf(e->label, sizeof e->label, "%.*s", (int)v.label_len, v.label);
    snprintf(e->key.text, sizeof e->key.text, "%.*s", (int)v.key_len, v.key);
    fj__hash_hex(e->key.text, strlen(e->key.text), e->key.hex);
    e->len = (size_t)v.payload_len;
    e->payload = fj__memdup(v.payload, e->len);
    free(data);
  }
  if (ls)
    pclose(ls);
  return g->n == 2 ? 0 : -1;
}

/* Compiles one small kernel into a cache of its own and reads its two
 * entries (a render and a kernel). */
static int genuine_make(genuine *g)
{
  memset(g, 0, sizeof *g);
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_80", dir);
  if (!ctx)
    return -1;
  fj_variant_default(&g->v, 64, FJ_F16, FJ_CAUSAL_NONE);
  fj_kernel *k;
  fj_resources r;
  int bad = fj_kernel_get(ctx, &g->v, &k) != FJ_OK;
  if (!bad) {
    g->source = fj__strdup(fj_kernel_source(k, NULL));
    fj_kernel_resources(k, &r);
    g->threads = r.threads;
  }
  fj_ctx_destroy(ctx);
  return bad || genuine_read(g, dir);
}

static void genuine_free(genuine *g)
{
  for (int i = 0; i < g->n; i++)
    free(g->e[i].payload);
  free(g->source);
}

/* A mutation of one genuine entry's payload: into out, or 1 to leave the
 * entry out of the cache. */
typedef struct mutation {
  const char *kind;  /* the entry it changes */
  int field;         /* render: offset of an int of fj_kmeta, or -1 */
  int value;
  const char *symbol;  /* render: a new symbol (field -2) */
  const char *prefix;  /* render: text put before the source (field -3) */
  int kernel_op;       /* kernel: 1 truncate, 2 empty cubin, 3 empty PTX,
                          4 flip a cubin byte, 5 flip a PTX byte, 6 drop */
  const char *want;    /* in the import's message */
  int verify_only;     /* accepted without FJ_CACHE_IMPORT_VERIFY */
} mutation;

#define META(f) (int)offsetof(fj_kmeta, f)

static int mutate(const mutation *m, const gentry *e, fj_buf *out)
{
  if (strcmp(m->kind, e->kind) != 0)
    return fj__buf_append(out, e->payload, e->len), 0;
  if (!strcmp(e->kind, "render")) {
    fj_kmeta meta;
    memcpy(&meta, e->payload, sizeof meta);
    if (m->field >= 0)
      memcpy((char *)&meta + m->field, &m->value, sizeof m->value);
    if (m->field == -2) {
      memset(meta.symbol, m->symbol[0] == '\1' ? 'k' : 0, sizeof meta.symbol);
      if (m->symbol[0] != '\1')
        memcpy(meta.symbol, m->symbol, strlen(m->symbol));
    }
    fj__buf_append(out, &meta, sizeof meta);
    if (m->field == -3 && m->prefix[0] == '\2')  /* the text, then a NUL */
      fj__buf_append(out, m->prefix + 1, strlen(m->prefix));
    else if (m->field == -3)
      fj__buf_append(out, m->prefix, strlen(m->prefix));
    fj__buf_append(out, e->payload + sizeof meta, e->len - sizeof meta);
    return 0;
  }
  if (m->kernel_op == 6)
    return 1;
  if (m->kernel_op == 1)
    return fj__buf_append(out, e->payload, e->len - 9), 0;
  fj_compiled c;
  if (fj__kernel_payload_read(e->payload, e->len, &c))
    return 1;
  if (m->kernel_op == 2)
    c.cubin_len = 0;
  if (m->kernel_op == 3)
    c.ptx_len = 0;
  if (m->kernel_op == 4)
    ((char *)c.cubin)[c.cubin_len / 2] ^= 1;
  if (m->kernel_op == 5)
    c.ptx[c.ptx_len - 3] ^= 1;
  fj__kernel_payload(&c, out);
  fj__compiled_free(&c);
  return 0;
}

/* Writes the genuine entries, one mutated, into a fresh cache directory
 * (by the cache's own writer: every checksum right); its path (in a
 * buffer of its own: fjt_tmpdir's is reused). */
static const char *plant(const genuine *g, const mutation *m)
{
  static char dir[4400];
  snprintf(dir, sizeof dir, "%s", fjt_tmpdir());
  fj_ctx *ctx = fjt_ctx("sm_80", dir);
  for (int i = 0; ctx && i < g->n; i++) {
    fj_buf b = {0};
    if (!mutate(m, &g->e[i], &b))
      fj__cache_store(ctx, g->e[i].kind, g->e[i].label, &g->e[i].key,
                      b.data ? b.data : "", b.len);
    fj__buf_free(&b);
  }
  fj_ctx_destroy(ctx);
  return ctx ? dir : NULL;
}

static int files_in(const char *dir)
{
  char cmd[4400];
  snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
  FILE *p = popen(cmd, "r");
  int n = -1;
  if (p && fscanf(p, "%d", &n) != 1)
    n = -1;
  if (p)
    pclose(p);
  return n;
}

static const mutation pack_cases[] = {
    /* the render entry's metadata, field by field, as a template's */
    {"render", META(threads), -5, 0, 0, 0, "meta.threads = -5 is invalid: an integer in 1..1024", 0},
    {"render", META(threads), 0, 0, 0, 0, "meta.threads = 0 is invalid", 0},
    {"render", META(threads), 1025, 0, 0, 0, "meta.threads = 1025 is invalid", 0},
    {"render", META(threads), 4096, 0, 0, 0, "meta.threads = 4096 is invalid", 0},
    {"render", META(threads), INT_MIN, 0, 0, 0, "meta.threads = -2147483648 is invalid", 0},
    {"render", META(threads), INT_MAX, 0, 0, 0, "meta.threads = 2147483647 is invalid", 0},
    {"render", META(smem_bytes), -1, 0, 0, 0, "meta.smem_bytes = -1 is invalid", 0},
    {"render", META(smem_bytes), INT_MIN, 0, 0, 0, "meta.smem_bytes = -2147483648 is invalid", 0},
    {"render", META(smem_bytes), (1 << 30) + 1, 0, 0, 0, "meta.smem_bytes = 1073741825 is invalid", 0},
    {"render", META(smem_bytes), INT_MAX, 0, 0, 0, "meta.smem_bytes = 2147483647 is invalid", 0},
    {"render", META(rows_per_block), -1, 0, 0, 0, "meta.rows_per_block = -1 is invalid", 0},
    {"render", META(rows_per_block), 65537, 0, 0, 0, "meta.rows_per_block = 65537 is invalid", 0},
    {"render", META(rows_per_block), INT_MIN, 0, 0, 0, "meta.rows_per_block = -2147483648 is invalid", 0},
    {"render", META(rows_per_block), INT_MAX, 0, 0, 0, "meta.rows_per_block = 2147483647 is invalid", 0},
    {"render", META(tma), 7, 0, 0, 0, "meta.tma = 7 is invalid: an integer in 0..1", 0},
    {"render", META(tma), -1, 0, 0, 0, "meta.tma = -1 is invalid", 0},
    {"render", META(tma), 2, 0, 0, 0, "meta.tma = 2 is invalid", 0},
    {"render", META(persistent), 3, 0, 0, 0, "meta.persistent = 3 is invalid: an integer in 0..2", 0},
    {"render", META(persistent), -1, 0, 0, 0, "meta.persistent = -1 is invalid", 0},
    {"render", META(persistent), 99, 0, 0, 0, "meta.persistent = 99 is invalid", 0},
    {"render", META(isolate), 2, 0, 0, 0, "meta.isolate = 2 is invalid: an integer in 0..1", 0},
    {"render", META(isolate), -1, 0, 0, 0, "meta.isolate = -1 is invalid", 0},
    {"render", -2, 0, "", 0, 0, "meta.symbol is invalid: a C identifier", 0},
    {"render", -2, 0, "1abc", 0, 0, "meta.symbol is invalid", 0},
    {"render", -2, 0, "a b", 0, 0, "meta.symbol is invalid", 0},
    {"render", -2, 0, "a;b", 0, 0, "meta.symbol is invalid", 0},
    {"render", -2, 0, "fj\nx", 0, 0, "meta.symbol is invalid", 0},
    {"render", -2, 0, "../x", 0, 0, "meta.symbol is invalid", 0},
    {"render", -2, 0, "a-b", 0, 0, "meta.symbol is invalid", 0},
    {"render", -2, 0, "\1", 0, 0, "meta.symbol is not terminated", 0},
    /* the rendered source: nothing but the toolkit's headers */
    {"render", -3, 0, 0, "#include \"/etc/passwd\"\n", 0, "'#include \"/etc/passwd\"', not one of the toolkit headers", 0},
    {"render", -3, 0, 0, "#include </etc/passwd>\n", 0, "'#include </etc/passwd>'", 0},
    {"render", -3, 0, 0, "#include <stdio.h>\n", 0, "'#include <stdio.h>'", 0},
    {"render", -3, 0, 0, "#include <cuda_fp16.h> /**/\n", 0, "not one of the toolkit headers", 0},
    {"render", -3, 0, 0, "#include <cuda_fp16.h>\"x\"\n", 0, "not one of the toolkit headers", 0},
    {"render", -3, 0, 0, "  #  include   </proc/self/environ>\n", 0, "not one of the toolkit headers", 0},
    {"render", -3, 0, 0, "#include_next <cuda_fp16.h>\n", 0, "the directive '#include_next", 0},
    {"render", -3, 0, 0, "#import </etc/passwd>\n", 0, "the directive '#import", 0},
    {"render", -3, 0, 0, "#embed \"/etc/passwd\"\n", 0, "the directive '#embed", 0},
    {"render", -3, 0, 0, "%:include </etc/passwd>\n", 0, "'#include </etc/passwd>'", 0},
    {"render", -3, 0, 0, "?\?=include </etc/passwd>\n", 0, "a trigraph at byte 0", 0},
    {"render", -3, 0, 0, "/**/#include </etc/passwd>\n", 0, "'#include </etc/passwd>'", 0},
    {"render", -3, 0, 0, "/*\n*/ #include </etc/passwd>\n", 0, "'#include </etc/passwd>'", 0},
    {"render", -3, 0, 0, "#/**/include </etc/passwd>\n", 0, "'#include </etc/passwd>'", 0},
    {"render", -3, 0, 0, "#inc\\\nlude </etc/passwd>\n", 0, "a line continuation at byte 4", 0},
    {"render", -3, 0, 0, "#include \\\r\n</etc/passwd>\n", 0, "a line continuation", 0},
    {"render", -3, 0, 0, "_Pragma(\"once\")\n", 0, "uses _Pragma", 0},
    {"render", -3, 0, 0, "int x = __has_include(</etc/passwd>);\n", 0, "uses __has_include", 0},
    {"render", -3, 0, 0, "#if __has_include_next(<x>)\n#endif\n", 0, "the directive '#if", 0},
    {"render", -3, 0, 0, "#error leak\n", 0, "the directive '#error", 0},
    {"render", -3, 0, 0, "#warning leak\n", 0, "the directive '#warning", 0},
    {"render", -3, 0, 0, "#pragma once\n", 0, "the directive '#pragma", 0},
    {"render", -3, 0, 0, "#pragma message(\"x\")\n", 0, "the directive '#pragma", 0},
    {"render", -3, 0, 0, "#pragma push_macro(\"x\")\n", 0, "the directive '#pragma", 0},
    {"render", -3, 0, 0, "#ident \"x\"\n", 0, "the directive '#ident", 0},
    {"render", -3, 0, 0, "#assert x(y)\n", 0, "the directive '#assert", 0},
    {"render", -3, 0, 0, "#define H </etc/passwd>\n#include H\n", 0, "'#include H'", 0},
    {"render", -3, 0, 0, "#include __FILE__\n", 0, "'#include __FILE__'", 0},
    {"render", -3, 0, 0, "# 1 \"/etc/passwd\"\n", 0, "the directive '#1 \"/etc/passwd\"'", 0},
    {"render", -3, 0, 0, "#\n", 0, "the directive '#'", 0},
    {"render", -3, 0, 0, "#ifdef X\n#endif\n", 0, "the directive '#ifdef", 0},
    {"render", -3, 0, 0, "\2x", 0, "a NUL byte at byte 1", 0},
    /* the kernel entry's parts */
    {"kernel", 0, 0, 0, 0, 1, "its payload is not a kernel's", 0},
    {"kernel", 0, 0, 0, 0, 2, "its PTX or cubin is empty", 0},
    {"kernel", 0, 0, 0, 0, 3, "its PTX or cubin is empty", 0},
    /* what only recompiling finds */
    {"kernel", 0, 0, 0, 0, 4, "is not what its rendered source compiles to", 1},
    {"kernel", 0, 0, 0, 0, 5, "is not what its rendered source compiles to", 1},
    {"render", -3, 0, 0, "// another source\n", 0, "whose rendered source is not in the pack", 1},
};

/* Crafted packs -- every checksum right, so only the checks of what an
 * entry says stand between them and the cache -- are refused whole, with
 * the entry and what is wrong, and install nothing; what only a compile
 * can find is refused under FJ_CACHE_IMPORT_VERIFY. */
int test_hostile_b_packs(void)
{
  genuine g;
  CHECK(genuine_make(&g) == 0);
  int cases = 0;
  for (size_t i = 0; i < FJ_ARRAY_LEN(pack_cases); i++) {
    const mutation *m = &pack_cases[i];
    char src_dir[4400];
    const char *planted = plant(&g, m);
    CHECK(planted);
    snprintf(src_dir, sizeof src_dir, "%s", planted);
    char pack[4400];
    snprintf(pack, sizeof pack, "%s/p.fjpack", fjt_tmpdir());
    fj_ctx *s = fjt_ctx("sm_80", src_dir);
    fj_cache_pack_report r;
    CHECK_OK(s, fj_cache_export(s, pack, &r));
    if (r.entries != 2 - (m->kernel_op == 6))
      fprintf(stderr, "case %zu: %d entries exported, %d left out\n", i,
              r.entries, r.skipped);
    CHECK(r.entries == 2 - (m->kernel_op == 6));
    fj_ctx_destroy(s);
    for (int verify = m->verify_only; verify <= 1; verify++) {
      const char *dst = fjt_tmpdir();
      fj_ctx *d = fjt_ctx("sm_80", dst);
      CHECK(d);
      fj_status st = fj_cache_import_ex(d, pack, verify ? FJ_CACHE_IMPORT_VERIFY : 0, &r);
      if (st != FJ_ERR_INVALID_ARG || !strstr(fj_errmsg(d), m->want) ||
          !strstr(fj_errmsg(d), "nothing imported") || strchr(fj_errmsg(d), '\n'))
        fprintf(stderr, "case %zu (verify %d): %d %s\n", i, verify, (int)st,
                fj_errmsg(d));
      CHECK_ST(d, st, FJ_ERR_INVALID_ARG);
      CHECK_MSG(d, m->want);
      CHECK_MSG(d, "nothing imported");
      CHECK(!strchr(fj_errmsg(d), '\n'));
      CHECK(files_in(dst) == 0);
      fj_ctx_destroy(d);
      cases++;
    }
    if (m->verify_only) {  /* the documented trust: accepted unverified */
      fj_ctx *d = fjt_ctx("sm_80", fjt_tmpdir());
      CHECK_OK(d, fj_cache_import(d, pack, &r));
      fj_ctx_destroy(d);
    }
  }
  fprintf(stderr, "%d crafted imports refused\n", cases);
  /* The genuine pack passes the same checks, recompiled too. */
  mutation none = {"none", 0, 0, 0, 0, 0, "", 0};
  const char *src_dir = plant(&g, &none);
  char pack[4400];
  snprintf(pack, sizeof pack, "%s/p.fjpack", fjt_tmpdir());
  fj_ctx *s = fjt_ctx("sm_80", src_dir);
  fj_cache_pack_report r;
  CHECK_OK(s, fj_cache_export(s, pack, &r));
  fj_ctx_destroy(s);
  fj_ctx *d = fjt_ctx("sm_80", fjt_tmpdir());
  CHECK_OK(d, fj_cache_import_ex(d, pack, FJ_CACHE_IMPORT_VERIFY, &r));
  CHECK(r.installed == 2);
  CHECK_ST(d, fj_cache_import_ex(d, pack, 6, &r), FJ_ERR_INVALID_ARG);
  CHECK_MSG(d, "flags = 0x6 has unknown bits");
  fj_ctx_destroy(d);
  genuine_free(&g);
  return 0;
}

/* The same render entries found in a cache directory (another process,
 * or a pack imported by an older library) are held to the same rules on
 * load: ignored and rendered again, never used to size a launch or given
 * to NVRTC. */
int test_hostile_b_index_load(void)
{
  genuine g;
  CHECK(genuine_make(&g) == 0);
  int cases = 0;
  for (size_t i = 0; i < FJ_ARRAY_LEN(pack_cases); i++) {
    const mutation *m = &pack_cases[i];
    if (strcmp(m->kind, "render") || m->verify_only)
      continue;
    const char *dir = plant(&g, m);
    fj_ctx *ctx = fjt_ctx("sm_80", dir);
    CHECK(ctx);
    fj_kernel *k;
    CHECK_OK(ctx, fj_kernel_get(ctx, &g.v, &k));
    fj_resources r;
    fj_kernel_resources(k, &r);
    if (strcmp(fj_kernel_source(k, NULL), g.source) != 0 || r.threads != g.threads)
      fprintf(stderr, "case %zu: the planted render entry was used\n", i);
    CHECK(strcmp(fj_kernel_source(k, NULL), g.source) == 0);
    CHECK(r.threads == g.threads);
    fj_ctx_destroy(ctx);
    cases++;
  }
  fprintf(stderr, "%d planted render entries ignored\n", cases);
  genuine_free(&g);
  return 0;
}

/* A kernel package is a cache directory from elsewhere, read by the
 * cache's reader and held to the same checks (entry.c): each planted
 * entry of the import corpus, render or kernel, in a package (a manifest
 * beside it) is ignored with a warning that says what the import's
 * refusal says, and the kernel is rendered or compiled again, never taken
 * from the package; a FIFO in an entry's place is a miss, not a hang. */
static char pkg_warnings[4096];

static void pkg_capture(void *user, fj_log_level level, const char *msg)
{
  (void)user;
  size_t n = strlen(pkg_warnings);
  if (level == FJ_LOG_WARN)
    snprintf(pkg_warnings + n, sizeof pkg_warnings - n, "%s\n", msg);
}

/* A context with an empty cache of its own and pkg as its package; the
 * kernel of g's variant from it, how it was found, the stats. */
static int package_get(const genuine *g, const char *pkg, fj_resources *r,
                       fj_cache_stats *s, long *renders, int *same)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_80";
  o.cache_dir = fjt_tmpdir();
  o.package_dir = pkg;
  o.log = pkg_capture;
  pkg_warnings[0] = '\0';
  fj_ctx *ctx = NULL;
  fj_kernel *k;
  if (fj_ctx_create(&ctx, &o) != FJ_OK || !fj_cache_package_dir(ctx) ||
      fj_kernel_get(ctx, &g->v, &k) != FJ_OK) {
    fprintf(stderr, "package_get: %s\n", fj_errmsg(ctx));
    fj_ctx_destroy(ctx);
    return -1;
  }
  fj_kernel_resources(k, r);
  fj_cache_stats_get(ctx, s);
  *renders = ctx->renders;
  *same = !strcmp(fj_kernel_source(k, NULL), g->source) &&
          r->threads == g->threads;
  fj_ctx_destroy(ctx);
  return 0;
}

int test_hostile_b_package_load(void)
{
  genuine g;
  CHECK(genuine_make(&g) == 0);
  int cases = 0;
  fj_resources r;
  fj_cache_stats s;
  long renders;
  int same;
  for (size_t i = 0; i < FJ_ARRAY_LEN(pack_cases); i++) {
    const mutation *m = &pack_cases[i];
    if (m->verify_only)
      continue;
    const char *pkg = plant(&g, m);
    CHECK(pkg);
    CHECK(fj__package_manifest_add(NULL, pkg, "sm_80") == FJ_OK);
    CHECK(package_get(&g, pkg, &r, &s, &renders, &same) == 0);
    int render = !strcmp(m->kind, "render");
    /* A refused render entry is rendered again and its genuine kernel
     * found in the package; a refused kernel entry is compiled again
     * from the package's genuine render entry. */
    int ok = same && strstr(pkg_warnings, m->want) &&
             strstr(pkg_warnings, "(kernel package) ignored") &&
             (render ? renders == 1 && s.package_hits == 1 &&
                           r.cache == FJ_CACHE_DISK
                     : renders == 0 && s.package_hits == 0 &&
                           r.cache == FJ_CACHE_MISS);
    if (!ok)
      fprintf(stderr, "case %zu: renders %ld, package hits %llu, origin %d, "
                      "same %d, warnings: %s\n", i, renders,
              (unsigned long long)s.package_hits, (int)r.cache, same,
              pkg_warnings);
    CHECK(ok);
    cases++;
  }
  fprintf(stderr, "%d planted package entries ignored\n", cases);
  /* The genuine package is used whole; a FIFO where its kernel entry was
   * is a miss with a warning, compiled again. */
  mutation none = {"none", 0, 0, 0, 0, 0, "", 0};
  const char *pkg = plant(&g, &none);
  CHECK(pkg && fj__package_manifest_add(NULL, pkg, "sm_80") == FJ_OK);
  CHECK(package_get(&g, pkg, &r, &s, &renders, &same) == 0);
  CHECK(same && renders == 0 && s.package_hits == 1 && !pkg_warnings[0]);
  char path[4400];
  for (int i = 0; i < g.n; i++)
    if (!strcmp(g.e[i].kind, "kernel"))
      fj__cache_entry_path(pkg, &g.e[i].key, path, sizeof path);
  CHECK(unlink(path) == 0 && mkfifo(path, 0600) == 0);
  CHECK(package_get(&g, pkg, &r, &s, &renders, &same) == 0);
  CHECK(same && s.package_hits == 0 && r.cache == FJ_CACHE_MISS);
  CHECK(strstr(pkg_warnings, "is not a regular file"));
  genuine_free(&g);
  return 0;
}

/* fj_cache_export replaces a regular file and nothing else: a device
 * node, a FIFO, a directory or a symbolic link at the path is left as it
 * was, and no temporary is left beside it. */
int test_hostile_b_export_target(void)
{
  const char *dir = fjt_tmpdir();
  char cache[4400], path[4400], target[4400];
  snprintf(cache, sizeof cache, "%s/cache", dir);
  mkdir(cache, 0700);
  fj_ctx *ctx = fjt_ctx("sm_80", cache);
  CHECK(ctx);
  static const struct {
    const char *name, *want;
  } cases[] = {{"fifo", "is a FIFO"},
               {"dir", "is a directory"},
               {"link", "is a symbolic link"},
               {"dangling", "is a symbolic link"},
               {"null", "is a character device"}};
  snprintf(target, sizeof target, "%s/target", dir);
  CHECK(fjt_write_file(target, "keep", 4) == 0);
  for (size_t i = 0; i < FJ_ARRAY_LEN(cases); i++) {
    snprintf(path, sizeof path, "%s/%s", dir, cases[i].name);
    int made = i == 0   ? mkfifo(path, 0600)
               : i == 1 ? mkdir(path, 0700)
               : i == 2 ? symlink(target, path)
               : i == 3 ? symlink("/nonexistent/x", path)
                        : mknod(path, S_IFCHR | 0666, makedev(1, 3));
    if (made != 0 && i == 4)
      continue;  /* not root: no device node to make */
    CHECK(made == 0);
    fj_cache_pack_report r;
    CHECK_ST(ctx, fj_cache_export(ctx, path, &r), FJ_ERR_INVALID_ARG);
    CHECK_MSG(ctx, cases[i].want);
    CHECK_MSG(ctx, "a pack replaces only a regular file (nothing written)");
    struct stat st;
    CHECK(lstat(path, &st) == 0 && !S_ISREG(st.st_mode));
  }
  size_t len;
  char *kept = fj__file_read(target, 100, &len);
  CHECK(kept && len == 4 && !memcmp(kept, "keep", 4));
  free(kept);
  CHECK(files_in(dir) == 7);  /* cache, target and the five: no temporary */
  /* A regular file is replaced, as before. */
  fj_cache_pack_report r;
  CHECK_OK(ctx, fj_cache_export(ctx, target, &r));
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- a tune's candidates never drop out silently ------------------------------ */

static struct {
  int info, warn;
  char last[512];
} tune_log;

static void tune_capture(void *user, fj_log_level level, const char *msg)
{
  (void)user;
  if (strncmp(msg, "tune: ", 6))
    return;
  tune_log.info += level == FJ_LOG_INFO;
  tune_log.warn += level == FJ_LOG_WARN;
  snprintf(tune_log.last, sizeof tune_log.last, "%s", msg);
}

/* fj__tune_count (both tuners' counter): a refusal (the rules, shared
 * memory, a launch refused) is counted as refused and logged as info, any
 * other status as failed and logged as a warning, each line naming the
 * candidate and the reason. */
int test_hostile_b_tune_counts(void)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_90a";
  o.cache_dir = fjt_tmpdir();
  o.log = tune_capture;
  fj_ctx *ctx = NULL;
  CHECK(fj_ctx_create(&ctx, &o) == FJ_OK);
  memset(&tune_log, 0, sizeof tune_log);
  fj_tune_report r;
  memset(&r, 0, sizeof r);
  fj__tune_count(ctx, &r, FJ_ERR_UNSUPPORTED, "fj_attn_d192_v128_mma",
                 "the mma family needs V in K's rows");
  CHECK(r.refused == 1 && r.failed == 0 && tune_log.info == 1 &&
        tune_log.warn == 0);
  CHECK(strstr(tune_log.last, "fj_attn_d192_v128_mma refused") &&
        strstr(tune_log.last, "needs V in K's rows"));
  fj__tune_count(ctx, &r, FJ_ERR_RESOURCES, "big", NULL);
  CHECK(r.refused == 2 && strstr(tune_log.last, "big refused: "));
  fj__tune_count(ctx, &r, FJ_ERR_COMPILE, "the mma backward, 1 stage", NULL);
  CHECK(r.refused == 2 && r.failed == 1 && tune_log.warn == 1);
  CHECK(strstr(tune_log.last, "the mma backward, 1 stage failed: ") &&
        strstr(tune_log.last, fj_status_str(FJ_ERR_COMPILE)));
  fj__tune_count(ctx, &r, FJ_ERR_CUDA, NULL, "launch timed out");
  CHECK(r.failed == 2 &&
        strstr(tune_log.last, "a candidate failed: launch timed out"));
  fj_ctx_destroy(ctx);
  return 0;
}
