/*
 * test_template.c -- rendering: golden files, byte stability, the sandbox
 * (no os, io, require, load; an instruction limit; a memory cap) and how
 * template errors are reported.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "entry.h"
#include "template.h"
#include "util.h"
#include "variant.h"
#include "runner.h"

/* Renders a variant's source without compiling it. */
static fj_status render_variant(fj_ctx *ctx, const fj_variant *v, fj_buf *out)
{
  fj_vparams vp;
  fj_kmeta meta;
  fj_status st = fj__variant_params(ctx, v, &vp);
  return st == FJ_OK ? fj__render(ctx, vp.template_name, vp.p, vp.n, out, &meta)
                     : st;
}

/* Variants that between them use every code path of the templates: WMMA
 * Stage-2 with synchronous loads, Stage-3 with LUT-driven ldmatrix loads
 * under xor, Stage-2 with a three-stage cp.async ring; the mma family's
 * pick for head dim 128 (pipelined, causal bottom-right, bf16); the wgmma
 * family's pick for head dim 128 (two consumer warpgroups, ping-pong);
 * the decode pick (GQA packing and split-KV, causal bottom-right). */
enum { NGOLDEN = 7 };
static void golden_variants(fj_variant v[NGOLDEN])
{
  fj_variant_default(&v[0], 64, FJ_F16, FJ_CAUSAL_NONE);
  v[0].softmax = FJ_SOFTMAX_SMEM;
  v[0].stages = 1;
  fj_variant_default(&v[1], 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT);
  v[1].softmax = FJ_SOFTMAX_REGS;
  v[1].swizzle = FJ_SWIZZLE_XOR;
  v[1].stages = 2;
  fj_variant_default(&v[2], 96, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT);
  v[2].softmax = FJ_SOFTMAX_SMEM;
  v[2].warps = 8;
  v[2].tile_m = 128;
  v[2].tile_n = 32;
  v[2].stages = 3;
  v[2].swizzle = FJ_SWIZZLE_NONE;
  fj_variant_default(&v[3], 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT);
  v[3].mma = FJ_MMA_SYNC;
  v[3].tile_m = 128;
  v[3].warps = 4;
  fj_variant_default(&v[4], 128, FJ_F16, FJ_CAUSAL_NONE);
  v[4].mma = FJ_MMA_WGMMA;
  v[4].swizzle = FJ_SWIZZLE_XOR;
  v[4].tile_m = 128;
  v[4].warps = 12;
  v[4].tile_n = 176;
  fj_variant_default(&v[5], 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT);
  v[5].mma = FJ_MMA_SYNC;
  v[5].tile_m = 64;
  v[5].warps = 4;
  v[5].tile_n = 64;
  v[5].pack_gqa = 1;
  v[5].split_kv = 1;
  /* Paged, varlen, packed and split: the serving decode of a page cache. */
  v[6] = v[5];
  v[6].dtype = FJ_F16;
  v[6].causal = FJ_CAUSAL_NONE;
  v[6].swizzle = FJ_SWIZZLE_XOR;
  v[6].varlen = 1;
  v[6].paged = 1;
}

/* FJ_UPDATE_GOLDEN=1 rewrites the files from the current templates. */
int test_render_golden(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_variant v[NGOLDEN];
  golden_variants(v);
  for (int i = 0; i < NGOLDEN; i++) {
    fj_buf src = {0};
    CHECK_OK(ctx, render_variant(ctx, &v[i], &src));
    char name[128], path[4300];
    fj_variant_name(&v[i], name, sizeof name);
    snprintf(path, sizeof path, "%s/golden/%s.cu", fjt_data_dir(), name);
    if (getenv("FJ_UPDATE_GOLDEN")) {
      CHECK(fjt_write_file(path, src.data, src.len) == 0);
    } else {
      size_t len = 0;
      char *want = fj__file_read(path, (uint64_t)1 << 30, &len);
      if (!want)
        fprintf(stderr, "missing golden %s (FJ_UPDATE_GOLDEN=1 makes it)\n",
                path);
      CHECK(want);
      if (len != src.len || memcmp(want, src.data, len) != 0)
        fprintf(stderr, "%s differs from the rendering (%zu vs %zu bytes)\n",
                path, len, src.len);
      CHECK(len == src.len && memcmp(want, src.data, len) == 0);
      free(want);
    }
    fj__buf_free(&src);
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* Two contexts (two Lua states) render byte-identical text, and text the
 * cache's source check takes (entry.c): a template that wrote what the
 * check refuses (a _Pragma, another #pragma, an #include of a file) would
 * have its render-index entry ignored on every load, and its packs and
 * packages refused. */
int test_render_stable(void)
{
  fj_ctx *a = fjt_ctx("sm_90a", NULL), *b = fjt_ctx("sm_90a", NULL);
  CHECK(a && b);
  fj_variant v[NGOLDEN];
  golden_variants(v);
  for (int i = 0; i < NGOLDEN; i++) {
    fj_buf x = {0}, y = {0}, z = {0};
    char why[200];
    CHECK_OK(a, render_variant(a, &v[i], &x));
    CHECK_OK(b, render_variant(b, &v[i], &y));
    CHECK_OK(a, render_variant(a, &v[i], &z));
    CHECK(x.len == y.len && memcmp(x.data, y.data, x.len) == 0);
    CHECK(x.len == z.len && memcmp(x.data, z.data, x.len) == 0);
    if (fj__source_wrong(x.data, x.len, why, sizeof why))
      fprintf(stderr, "golden variant %d: %s\n", i, why);
    CHECK(!fj__source_wrong(x.data, x.len, why, sizeof why));
    fj__buf_free(&x);
    fj__buf_free(&y);
    fj__buf_free(&z);
  }
  fj_ctx_destroy(a);
  fj_ctx_destroy(b);
  return 0;
}

/* The parameters reach the source: the header names the variant, tile sizes
 * change the code, and the meta table sizes the launch. */
int test_render_params(void)
{
  fj_ctx *ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx);
  fj_variant v;
  fj_variant_default(&v, 64, FJ_BF16, FJ_CAUSAL_TOP_LEFT);
  v.softmax = FJ_SOFTMAX_SMEM;
  v.stages = 1;
  fj_buf a = {0}, b = {0};
  CHECK_OK(ctx, render_variant(ctx, &v, &a));
  CHECK(strstr(a.data, "// flashjit generated kernel: "
                       "fj_attn_d64_m64_n128_w4_s1_pad_smem_wmma_tl_bf16"));
  CHECK(strstr(a.data, "target: sm_80"));
  CHECK(strstr(a.data, "typedef __nv_bfloat16 elem_t;"));
  CHECK(strstr(a.data, "p.causal_offset"));
  v.tile_n = 32;
  v.causal = FJ_CAUSAL_NONE;
  fj_vparams vp;
  fj_kmeta meta;
  CHECK_OK(ctx, fj__variant_params(ctx, &v, &vp));
  CHECK_OK(ctx, fj__render(ctx, vp.template_name, vp.p, vp.n, &b, &meta));
  CHECK(!strstr(b.data, "p.causal_offset"));
  CHECK(meta.threads == 128 && meta.rows_per_block == 64);
  CHECK(meta.smem_bytes > 0 && strcmp(meta.symbol, vp.symbol) == 0);
  fj__buf_free(&a);
  fj__buf_free(&b);
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the sandbox, through a template directory of our own ------------------- */

/* A template directory holding the real renderer plus one test template;
 * FLASHJIT_TEMPLATE_DIR points the next context at it. */
static int template_dir(const char *name, const char *text)
{
  const char *dir = fjt_tmpdir();
  char path[4300];
  size_t len = 0;
  const char *renderer = fj__template_text("render.lua", &len);
  snprintf(path, sizeof path, "%s/render.lua", dir);
  if (!renderer || fjt_write_file(path, renderer, len))
    return -1;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (fjt_write_file(path, text, strlen(text)))
    return -1;
  return setenv("FLASHJIT_TEMPLATE_DIR", dir, 1);
}

/* Renders `text` as template `name`; returns the status, message in ctx. */
static fj_status render_text(fj_ctx **ctx, const char *name, const char *text)
{
  if (template_dir(name, text) != 0)
    return FJ_ERR_IO;
  fj_ctx_destroy(*ctx);
  *ctx = fjt_ctx("sm_90a", NULL);
  if (!*ctx)
    return FJ_ERR_IO;
  fj_param p = {"answer", FJ_PARAM_INT, 42, NULL, NULL};
  fj_buf out = {0};
  fj_kmeta meta;
  fj_status st = fj__render(*ctx, name, &p, 1, &out, &meta);
  fj__buf_free(&out);
  return st;
}

int test_sandbox_os(void)
{
  fj_ctx *ctx = NULL;
  CHECK_ST(ctx, render_text(&ctx, "evil.cu", "x\n{% os.execute('touch /tmp/fj-pwned') %}\n"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "evil.cu:2:");
  CHECK_MSG(ctx, "global 'os'");
  fj_ctx_destroy(ctx);
  return 0;
}

int test_sandbox_io(void)
{
  fj_ctx *ctx = NULL;
  CHECK_ST(ctx, render_text(&ctx, "evil.cu", "{{ io.open('/etc/passwd'):read('a') }}"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "global 'io'");
  fj_ctx_destroy(ctx);
  return 0;
}

int test_sandbox_require(void)
{
  fj_ctx *ctx = NULL;
  CHECK_ST(ctx, render_text(&ctx, "evil.cu", "{% local os = require('os') %}"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "global 'require'");
  /* Nor can a template reach the renderer's own globals. */
  CHECK_ST(ctx, render_text(&ctx, "evil.cu", "{% local f = dofile or loadfile or _G.load %}"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "_G");
  fj_ctx_destroy(ctx);
  return 0;
}

int test_sandbox_load(void)
{
  fj_ctx *ctx = NULL;
  CHECK_ST(ctx, render_text(&ctx, "evil.cu", "{% load('return 1')() %}"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "global 'load'");
  CHECK_ST(ctx, render_text(&ctx, "evil.cu", "{{ string.dump(tostring) }}"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "dump");
  fj_ctx_destroy(ctx);
  return 0;
}

int test_sandbox_endless_loop(void)
{
  fj_ctx *ctx = NULL;
  CHECK_ST(ctx, render_text(&ctx, "loop.cu", "a\nb\n{% while true do end %}\n"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "instruction limit");
  CHECK_MSG(ctx, "loop.cu:3:");
  fj_ctx_destroy(ctx);
  return 0;
}

int test_sandbox_memory(void)
{
  fj_ctx *ctx = NULL;
  CHECK_ST(ctx, render_text(&ctx, "big.cu",
                            "{% local t = {} for i = 1, 100000 do "
                            "t[i] = string.rep('xxxxxxxxxxxxxxxx', 4096) .. i end %}"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "memory limit");
  /* The state survives the error: the same context renders again (and
   * fails the same way, not worse). */
  fj_buf out = {0};
  fj_kmeta meta;
  CHECK_ST(ctx, fj__render(ctx, "big.cu", NULL, 0, &out, &meta), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "memory limit");
  fj__buf_free(&out);
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

int test_template_errors(void)
{
  fj_ctx *ctx = NULL;
  /* A Lua syntax error reports the template's own line. */
  CHECK_ST(ctx, render_text(&ctx, "syntax.cu", "one\ntwo\n{% if then %}\n"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "syntax.cu:3:");
  /* A misspelt parameter is an error, not the text "nil". */
  CHECK_ST(ctx, render_text(&ctx, "typo.cu", "\n{{ anwser }}"), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "{{ anwser }} is nil");
  CHECK_MSG(ctx, "typo.cu:2:");
  /* A runtime error carries a traceback. */
  CHECK_ST(ctx, render_text(&ctx, "rt.cu", "{% local x = nil; x.y = 1 %}"),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "stack traceback");
  /* An unclosed tag names its line. */
  CHECK_ST(ctx, render_text(&ctx, "open.cu", "a\n{{ answer\n"), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "open.cu:2: unclosed");
  /* refuse() is a clean "unsupported" with the template's reason. */
  CHECK_ST(ctx, render_text(&ctx, "no.cu", "{% refuse('tile_m 48 is too odd') %}"),
           FJ_ERR_UNSUPPORTED);
  CHECK(strcmp(fj_errmsg(ctx), "tile_m 48 is too odd") == 0);
  /* A missing template. */
  CHECK_ST(ctx, render_text(&ctx, "x.cu", "{{ include('nope.cu') }}"), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "template 'nope.cu' not found");
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* The override directory is read; tags alone on a line leave no blank line;
 * values print as the C code needs them. */
int test_template_override_dir(void)
{
  fj_ctx *ctx = NULL;
  const char *text =
      "{% meta.symbol = 'ok'; meta.threads = 1; meta.smem_bytes = 0; "
      "meta.rows_per_block = 0 %}\n"
      "begin\n"
      "{% for i = 1, 3 do %}\n"
      "  {% if i ~= 2 then %}\n"
      "row {{ i }} {{ answer / 8 }} {{ answer // 8 }} {{ i == 1 }}\n"
      "  {% end %}\n"
      "{% end %}\n"
      "{# a note #}\n"
      "end {{ 0.1 }}\n";
  CHECK_OK(ctx, render_text(&ctx, "ok.cu", text));
  fj_param p = {"answer", FJ_PARAM_INT, 42, NULL, NULL};
  fj_buf out = {0};
  fj_kmeta meta;
  CHECK_OK(ctx, fj__render(ctx, "ok.cu", &p, 1, &out, &meta));
  const char *want = "begin\nrow 1 5.25 5 true\nrow 3 5.25 5 false\nend 0.1\n";
  if (strcmp(out.data, want) != 0)
    fprintf(stderr, "rendered:\n%s\nwanted:\n%s\n", out.data, want);
  CHECK(strcmp(out.data, want) == 0);
  fj__buf_free(&out);
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the sandbox's holes, closed (issue 10) ---------------------------------- */

/* The meta line a template needs to render at all. */
#define META "{% meta.symbol = 'k'; meta.threads = 128; meta.smem_bytes = 0; " \
             "meta.rows_per_block = 64 %}"

/* Renders text; the status, and the milliseconds it took in *ms. */
static fj_status render_timed(fj_ctx **ctx, const char *text, double *ms)
{
  double t0 = fj__now_ms();
  fj_status st = render_text(ctx, "pat.cu", text);
  *ms = fj__now_ms() - t0;
  return st;
}

/* Patterns that backtrack for hours are refused before they run, through
 * the string table and through a string's methods; patterns the templates
 * use still work. */
int test_sandbox_patterns(void)
{
  static const char *const slow[] = {
      "{% string.find(string.rep('a', 5000), string.rep('a*', 20) .. 'b') %}",
      "{% local s = ('a'):rep(5000) s:match('.-.-.-.-b') %}",
      "{% local s = ('a'):rep(3000) local n = s:gsub('(a*)*b', 'x') %}",
      "{% for x in ('a'):rep(3000):gmatch('a-a-a-b') do end %}",
      "{% local m = string.match(('x'):rep(100000), '%b()%b()') %}",
      "{% local m = ('ab'):rep(20000):find('(.-)%1%1') %}",
      /* blanks around a text of blanks: each %s* may take them all */
      "{% local m = (' '):rep(3000):match('^%s*(.-)f?%s*$') %}",
  };
  fj_ctx *ctx = NULL;
  double ms;
  for (size_t i = 0; i < sizeof slow / sizeof slow[0]; i++) {
    CHECK_ST(ctx, render_timed(&ctx, slow[i], &ms), FJ_ERR_TEMPLATE);
    CHECK_MSG(ctx, "could take");
    CHECK_MSG(ctx, "pat.cu:1:");
    CHECK(ms < 5000);
  }
  /* Many calls under the limit add up to the render's budget. */
  CHECK_ST(ctx, render_timed(&ctx, "{% local s = ('a'):rep(150) "
                                   "for i = 1, 1e9 do s:find('a*a*b') end %}", &ms),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "instruction limit");
  CHECK(ms < 20000);
  /* What templates do with patterns still renders (mods.lua, lut_probe),
   * whatever the length of a subject with few bytes of a repeated class. */
  CHECK_OK(ctx, render_text(&ctx, "ok.cu", META
           "{% local n, t, r = ('bias:f16:2'):match('^([%w_]+):(%w+):(%d)$') %}"
           "{{ n }} {{ t }} {{ r }}{% for w in ('a;b;c'):gmatch('[^;]+') do %}"
           "{{ w }}{% end %} {{ ('sm_90a'):sub(-1) }} {{ select(2, ('a.b.c'):gsub('%.', '')) }}"
           /* mods.lua's trim of a long derivative: %s* takes its few blanks */
           "{% local d = ('(1.0f - s) * '):rep(400):match('^%s*(.-)f?%s*$') %}"));
  fj_buf out = {0};
  fj_kmeta meta;
  CHECK_OK(ctx, fj__render(ctx, "ok.cu", NULL, 0, &out, &meta));
  CHECK(strcmp(out.data, "bias f16 2abc a 2") == 0);
  fj__buf_free(&out);
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* C loops the hook does not see are bounded, and a render stops at its
 * wall-clock limit even when its instructions are few. */
int test_sandbox_time(void)
{
  fj_ctx *ctx = NULL;
  double ms;
  CHECK_ST(ctx, render_timed(&ctx, "{% table.move({}, 1, 1 << 40, 2) %}", &ms),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "table.move: ");
  CHECK(ms < 5000);
  /* Sorting in C is charged too: a loop of sorts ends at the budget. */
  CHECK_ST(ctx, render_timed(&ctx, "{% local t = {} for i = 1, 100000 do "
                                   "t[i] = (i * 7919) % 100003 end "
                                   "for i = 1, 1e6 do table.sort(t) end %}", &ms),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "instruction limit");
  CHECK(ms < 20000);
  CHECK_ST(ctx, render_timed(&ctx, "{% for i = 1, 1e6 do "
                                   "local s = ('x'):rep(1e3, ('y'):rep(1e3)) end %}", &ms),
           FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "instruction limit");
  CHECK(ms < 20000);
  /* The wall clock stops a render whatever its instructions. */
  int saved = fj__tpl_time_limit_ms;
  fj__tpl_time_limit_ms = 50;
  fj_status st = render_timed(&ctx, "{% while true do end %}", &ms);
  fj__tpl_time_limit_ms = saved;
  CHECK_ST(ctx, st, FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "time limit (50 ms)");
  CHECK(ms < 5000);
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* The renderer's own top level runs under the instruction limit. */
int test_sandbox_renderer_loop(void)
{
  const char *dir = fjt_tmpdir();
  char path[4300];
  snprintf(path, sizeof path, "%s/render.lua", dir);
  const char *evil = "local source = ...\nwhile true do end\n";
  CHECK(fjt_write_file(path, evil, strlen(evil)) == 0);
  CHECK(setenv("FLASHJIT_TEMPLATE_DIR", dir, 1) == 0);
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_buf out = {0};
  fj_kmeta meta;
  double t0 = fj__now_ms();
  CHECK_ST(ctx, fj__render(ctx, "x.cu", NULL, 0, &out, &meta), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "cannot load the template renderer");
  CHECK_MSG(ctx, "instruction limit");
  CHECK_MSG(ctx, "render.lua:2:");
  CHECK(fj__now_ms() - t0 < 30000);
  fj__buf_free(&out);
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* An error object that is not a string names where it was raised. */
int test_sandbox_error_objects(void)
{
  static const char *const objs[] = {"{}", "nil", "42", "true", "{1, 2}"};
  static const char *const types[] = {"table", "nil", "number", "boolean",
                                      "table"};
  fj_ctx *ctx = NULL;
  for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) {
    char text[128], want[96];
    snprintf(text, sizeof text, "a\nb\n{%% error(%s) %%}\n", objs[i]);
    CHECK_ST(ctx, render_text(&ctx, "obj.cu", text), FJ_ERR_TEMPLATE);
    snprintf(want, sizeof want, "obj.cu:3: error object is a %s value",
             types[i]);
    CHECK_MSG(ctx, want);
    CHECK(!strstr(fj_errmsg(ctx), "failed: table"));
  }
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* The override directory: a file that is not a regular one (a directory,
 * a FIFO) is refused with the reason, never waited on; a missing one says
 * so; no stale errno. */
/* Renders x.cu, which includes `name`, from a template directory that
 * holds what make() put there. */
static fj_status render_include(fj_ctx **ctx, const char *name,
                                int (*make)(const char *path))
{
  char text[96], path[4300];
  snprintf(text, sizeof text, "{{ include('%s') }}", name);
  if (template_dir("x.cu", text) != 0)
    return FJ_ERR_IO;
  snprintf(path, sizeof path, "%s/%s", getenv("FLASHJIT_TEMPLATE_DIR"), name);
  if (make && make(path) != 0)
    return FJ_ERR_IO;
  fj_ctx_destroy(*ctx);
  if (!(*ctx = fjt_ctx("sm_90a", NULL)))
    return FJ_ERR_IO;
  fj_buf out = {0};
  fj_kmeta meta;
  fj_status st = fj__render(*ctx, "x.cu", NULL, 0, &out, &meta);
  fj__buf_free(&out);
  return st;
}

static int make_dir(const char *path) { return mkdir(path, 0700); }
static int make_fifo(const char *path) { return mkfifo(path, 0600); }

int test_template_dir_files(void)
{
  fj_ctx *ctx = NULL;
  CHECK_ST(ctx, render_include(&ctx, "sub.cu", NULL), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "template 'sub.cu' not found: No such file or directory");
  CHECK_ST(ctx, render_include(&ctx, "sub.cu", make_dir), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "template 'sub.cu' not found: not a regular file");
  CHECK(!strstr(fj_errmsg(ctx), "File exists"));
  CHECK_ST(ctx, render_include(&ctx, "fifo.cu", make_fifo), FJ_ERR_TEMPLATE);
  CHECK_MSG(ctx, "template 'fifo.cu' not found: not a regular file");
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* A template's meta table is checked like user input: the field, the
 * value and the limit. */
int test_template_meta(void)
{
  static const struct {
    const char *set, *want;
  } cases[] = {
      {"meta.smem_bytes = 1 << 40",
       "meta.smem_bytes = 1099511627776 is invalid: an integer in 0..1073741824"},
      {"meta.threads = -1", "meta.threads = -1 is invalid: an integer in 1..1024"},
      {"meta.threads = 2000", "meta.threads = 2000 is invalid"},
      {"meta.threads = 1.5", "meta.threads = 1.5 is invalid"},
      {"meta.threads = '128'", "meta.threads = string is invalid"},
      {"meta.rows_per_block = nil", "meta.rows_per_block = nil is invalid"},
      {"meta.tma = 2", "meta.tma = 2 is invalid: an integer in 0..1"},
      {"meta.isolate = -1", "meta.isolate = -1 is invalid"},
      {"meta.symbol = 'a b'", "meta.symbol = a b is invalid: a C identifier"},
      {"meta.symbol = 7", "meta.symbol = number is invalid"},
      {"meta.symbol = string.rep('k', 200)", "is invalid: a C identifier of 1..127"},
  };
  fj_ctx *ctx = NULL;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[256];
    snprintf(text, sizeof text, "%s{%% %s %%}", META, cases[i].set);
    CHECK_ST(ctx, render_text(&ctx, "meta.cu", text), FJ_ERR_TEMPLATE);
    CHECK_MSG(ctx, "rendering meta.cu: ");
    CHECK_MSG(ctx, cases[i].want);
  }
  CHECK_OK(ctx, render_text(&ctx, "meta.cu", META "{% meta.tma = 1 %}"));
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- wgmma.cuh's forms ------------------------------------------------------------ */

/* Renders a template that includes wgmma.cuh (the built-in one, copied
 * beside it) with `forms` (a Lua list); the text in *out (freed by the
 * caller), the status returned. */
static fj_status render_forms(fj_ctx **ctx, const char *forms, fj_buf *out)
{
  char text[1024], path[4300];
  size_t len = 0;
  snprintf(text, sizeof text,
           "%s\n{{ include('wgmma.cuh', { spin_limit = 0, forms = { %s } }) }}\n",
           META, forms);
  const char *wgmma = fj__template_text("wgmma.cuh", &len);
  if (!wgmma || template_dir("forms.cu", text) != 0)
    return FJ_ERR_IO;
  snprintf(path, sizeof path, "%s/wgmma.cuh", getenv("FLASHJIT_TEMPLATE_DIR"));
  if (fjt_write_file(path, wgmma, len) != 0)
    return FJ_ERR_IO;
  fj_ctx_destroy(*ctx);
  *ctx = fjt_ctx("sm_90a", NULL);
  if (!*ctx)
    return FJ_ERR_IO;
  fj_kmeta meta;
  return fj__render(*ctx, "forms.cu", NULL, 0, out, &meta);
}

/* The 8-bit forms: m64nNk32 with the scales last (the PTX ISA gives 8-bit
 * wgmma no transpose immediates), the RS form's four A registers, and the
 * 8-bit helpers with them; a 16-bit form alone brings no helpers.  An
 * 8-bit form that transposes, or a k that is not the type's, is refused
 * with one line naming the form. */
int test_template_wgmma_forms(void)
{
  fj_ctx *ctx = NULL;
  fj_buf out = {0};
  CHECK_OK(ctx, render_forms(&ctx, "{ t = 'e4m3', n = 64, a = 'ss', tb = 0 }, "
                                   "{ t = 'e5m2', n = 96, a = 'rs', tb = 0, k = 32 }",
                             &out));
  CHECK(strstr(out.data, "void wg_ss_e4m3_64(float (&d)[4][8], unsigned long long da"));
  CHECK(strstr(out.data, "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 { %0, "));
  CHECK(strstr(out.data, "%31 }, %32, %33, p, 1, 1; }"));
  CHECK(strstr(out.data, "void wg_rs_e5m2_96(float (&d)[6][8], const unsigned (&a)[4]"));
  CHECK(strstr(out.data, "wgmma.mma_async.sync.aligned.m64n96k32.f32.e5m2.e5m2 { %0, "));
  CHECK(strstr(out.data, "%47 }, { %48, %49, %50, %51 }, %52, p, 1, 1; }"));
  CHECK(strstr(out.data, "unsigned sw128_b8(int r, int c)"));
  CHECK(strstr(out.data, "unsigned pack4_e4m3(float x0, float x1, float x2, float x3)"));
  CHECK(strstr(out.data, "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;"));
  CHECK(strstr(out.data, "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;"));
  CHECK(strstr(out.data, "unsigned pack4_e5m2("));
  fj__buf_free(&out);
  CHECK_OK(ctx, render_forms(&ctx, "{ t = 'f16', n = 64, a = 'rs', tb = 1, k = 16 }", &out));
  CHECK(strstr(out.data, "m64n64k16.f32.f16.f16 { %0, "));
  CHECK(strstr(out.data, "{ %32, %33, %34, %35 }, %36, p, 1, 1, 1; }"));
  CHECK(!strstr(out.data, "sw128_b8") && !strstr(out.data, "pack4_"));
  fj__buf_free(&out);
  static const struct {
    const char *forms, *want;
  } refused[] = {
      {"{ t = 'e4m3', n = 64, a = 'rs', tb = 1 }",
       "wgmma.cuh: form { t = e4m3, n = 64, a = rs, tb = 1, ta = 0, k = 32 }: "
       "e4m3 operands have no transpose (K-major only; tb and ta must be 0)"},
      {"{ t = 'e5m2', n = 128, a = 'ss', tb = 1, ta = 1 }",
       "wgmma.cuh: form { t = e5m2, n = 128, a = ss, tb = 1, ta = 1, k = 32 }: "
       "e5m2 operands have no transpose"},
      {"{ t = 'e4m3', n = 64, a = 'ss', tb = 0, k = 16 }",
       "form { t = e4m3, n = 64, a = ss, tb = 0, ta = 0, k = 16 }: e4m3 takes k 32 "
       "(32 bytes of the element)"},
      {"{ t = 'bf16', n = 64, a = 'ss', tb = 0, k = 32 }", "bf16 takes k 16"},
      {"{ t = 's8', n = 64, a = 'ss', tb = 0 }",
       "form { t = s8, n = 64, a = ss, tb = 0, ta = 0, k = nil }: the types are "
       "f16, bf16, e4m3 and e5m2"},
  };
  for (size_t i = 0; i < FJ_ARRAY_LEN(refused); i++) {
    CHECK_ST(ctx, render_forms(&ctx, refused[i].forms, &out), FJ_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, refused[i].want);
    CHECK(!strchr(fj_errmsg(ctx), '\n'));
    fj__buf_free(&out);
  }
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  fj_ctx_destroy(ctx);
  return 0;
}
