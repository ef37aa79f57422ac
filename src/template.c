/*
 * template.c -- the Lua state that renders templates/ into CUDA source.
 *
 * One state per context, created on the first render, holding the renderer
 * (templates/render.lua) and its compiled templates.  Templates run
 * sandboxed (see render.lua); this file adds what only C can: a memory cap
 * through the allocator, an instruction budget through a count hook, and
 * the rule that every Lua call that can raise an error happens inside
 * lua_pcall, so no longjmp crosses C code holding resources.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "ctx.h"
#include "template.h"
#include "util.h"

enum {
  TPL_MEM_LIMIT = 256 << 20,       /* bytes the Lua state may hold */
  TPL_HOOK_EVERY = 1000,           /* instructions between hook calls */
};
static const long long TPL_STEP_LIMIT = 200000000; /* per render */

struct fj_tpl {
  lua_State *L;
  size_t mem_used;
  long long steps;
  int renderer;  /* registry reference to render.lua's table */
};

/* ---- template text ------------------------------------------------------- */

static int valid_name(const char *name)
{
  if (!name || !*name || name[0] == '.')
    return 0;
  for (const char *p = name; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_' && *p != '.' && *p != '-')
      return 0;
  return 1;
}

/* Pushes the text of a template, or nil and the reason.  The built-in copies
 * are generated from templates/ at build time; FLASHJIT_TEMPLATE_DIR, when
 * set, overrides them (for template development).  A file is read straight
 * into Lua-owned memory, so that a memory error raised by Lua never leaves a
 * C allocation or an open FILE behind. */
static int push_template(lua_State *L, const char *name)
{
  const char *dir = getenv("FLASHJIT_TEMPLATE_DIR");
  size_t len = 0;
  const char *why = "no such built-in template";
  if (!valid_name(name)) {
    why = "invalid template name";
  } else if (dir && *dir) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      len = (size_t)st.st_size;
      char *dst = lua_newuserdatauv(L, len + 1, 0);
      FILE *f = fopen(path, "rb");
      size_t got = f ? fread(dst, 1, len, f) : 0;
      if (f)
        fclose(f);
      if (got == len) {
        lua_pushlstring(L, dst, len);
        lua_remove(L, -2);
        return 1;
      }
      lua_pop(L, 1);
    }
    why = strerror(errno ? errno : EIO);
  } else {
    const char *text = fj__template_text(name, &len);
    if (text) {
      lua_pushlstring(L, text, len);
      return 1;
    }
  }
  lua_pushnil(L);
  lua_pushfstring(L, "%s (%s)", why,
                  dir && *dir ? "FLASHJIT_TEMPLATE_DIR" : "built in");
  return 2;
}

const char *fj__template_text(const char *name, size_t *len)
{
  for (size_t i = 0; i < fj__embedded_count; i++)
    if (strcmp(fj__embedded[i].name, name) == 0) {
      if (len)
        *len = fj__embedded[i].len;
      return (const char *)fj__embedded[i].data;
    }
  return NULL;
}

/* source(name) -> text | nil, why: the renderer's only way to read files. */
static int l_source(lua_State *L)
{
  return push_template(L, luaL_checkstring(L, 1));
}

/* ---- the state -------------------------------------------------------------- */

static void *tpl_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
  fj_tpl *t = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    t->mem_used -= old;
    return NULL;
  }
  if (t->mem_used - old + nsize > (size_t)TPL_MEM_LIMIT)
    return NULL;
  void *p = realloc(ptr, nsize);
  if (p)
    t->mem_used = t->mem_used - old + nsize;
  return p;
}

static void tpl_hook(lua_State *L, lua_Debug *ar)
{
  fj_tpl *t;
  (void)ar;
  lua_getallocf(L, (void **)&t);
  t->steps += TPL_HOOK_EVERY;
  if (t->steps > TPL_STEP_LIMIT)
    luaL_error(L, "template exceeded its instruction limit (%d million)",
               (int)(TPL_STEP_LIMIT / 1000000));
}

/* Loads the standard libraries the renderer may use -- base, string, table,
 * math, utf8 and nothing else -- and removes the base functions that reach
 * the file system or the terminal. */
static int open_libs(lua_State *L)
{
  static const luaL_Reg libs[] = {
      {LUA_GNAME, luaopen_base},     {LUA_STRLIBNAME, luaopen_string},
      {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
      {LUA_UTF8LIBNAME, luaopen_utf8},
  };
  for (size_t i = 0; i < FJ_ARRAY_LEN(libs); i++) {
    luaL_requiref(L, libs[i].name, libs[i].func, 1);
    lua_pop(L, 1);
  }
  static const char *const unsafe[] = {"dofile", "loadfile", "print",
                                       "collectgarbage"};
  for (size_t i = 0; i < FJ_ARRAY_LEN(unsafe); i++) {
    lua_pushnil(L);
    lua_setglobal(L, unsafe[i]);
  }
  return 0;
}

/* Runs render.lua, which returns the renderer table; keeps it in the
 * registry.  Called under lua_pcall. */
static int open_renderer(lua_State *L)
{
  fj_tpl *t = lua_touserdata(L, 1);
  open_libs(L);
  if (push_template(L, "render.lua") != 1)
    return luaL_error(L, "render.lua: %s", lua_tostring(L, -1));
  size_t len;
  const char *text = lua_tolstring(L, -1, &len);
  if (luaL_loadbufferx(L, text, len, "=render.lua", "t") != LUA_OK)
    return lua_error(L);
  lua_pushcfunction(L, l_source);
  lua_call(L, 1, 1);
  if (!lua_istable(L, -1))
    return luaL_error(L, "render.lua did not return a table");
  t->renderer = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

/* The message handler: a string error gets a traceback; a refusal (a table
 * with a `why` field, from refuse()) becomes "\1" .. why. */
static int msgh(lua_State *L)
{
  lua_sethook(L, NULL, 0, 0);
  if (lua_istable(L, 1)) {
    lua_getfield(L, 1, "why");
    if (lua_isstring(L, -1)) {
      lua_pushfstring(L, "\1%s", lua_tostring(L, -1));
      return 1;
    }
    lua_pop(L, 1);
  }
  const char *msg = lua_tostring(L, 1);
  if (!msg)
    msg = luaL_typename(L, 1);
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static fj_status tpl_open(fj_ctx *ctx)
{
  fj_tpl *t = calloc(1, sizeof *t);
  if (!t)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  t->L = lua_newstate(tpl_alloc, t);
  if (!t->L) {
    free(t);
    return fj__fail(ctx, FJ_ERR_NOMEM, "cannot create the Lua state");
  }
  lua_State *L = t->L;
  lua_pushcfunction(L, msgh);
  lua_pushcfunction(L, open_renderer);
  lua_pushlightuserdata(L, t);
  if (lua_pcall(L, 1, 0, 1) != LUA_OK) {
    fj_status st = fj__fail(ctx, FJ_ERR_TEMPLATE,
                            "cannot load the template renderer: %s",
                            lua_tostring(L, -1));
    fj__tpl_close(t);
    return st;
  }
  lua_settop(L, 0);
  ctx->tpl = t;
  return FJ_OK;
}

void fj__tpl_close(fj_tpl *t)
{
  if (!t)
    return;
  if (t->L)
    lua_close(t->L);
  free(t);
}

/* ---- rendering ------------------------------------------------------------- */

typedef struct render_call {
  fj_tpl *tpl;
  const char *name;
  const fj_param *params;
  size_t nparams;
  fj_buf *out;
  fj_kmeta *meta;
  int nomem;
} render_call;

static void push_lut(lua_State *L, const fj_lut *lut)
{
  lua_createtable(L, 0, 8);
  lua_pushstring(L, fj_frag_name(lut->frag));
  lua_setfield(L, -2, "frag");
  lua_pushinteger(L, lut->slots);
  lua_setfield(L, -2, "slots");
  lua_pushinteger(L, lut->rows);
  lua_setfield(L, -2, "rows");
  lua_pushinteger(L, lut->cols);
  lua_setfield(L, -2, "cols");
  lua_pushstring(L, lut->origin == FJ_LUT_REFERENCE ? "reference"
                                                    : "probed");
  lua_setfield(L, -2, "origin");
  lua_pushstring(L, lut->device);
  lua_setfield(L, -2, "device");
  /* map[lane * slots + slot + 1] = row * cols + col */
  lua_createtable(L, 32 * lut->slots, 0);
  for (int lane = 0; lane < 32; lane++)
    for (int s = 0; s < lut->slots; s++) {
      lua_pushinteger(L, lut->map[lane][s]);
      lua_rawseti(L, -2, lane * lut->slots + s + 1);
    }
  lua_setfield(L, -2, "map");
}

static void push_params(lua_State *L, const fj_param *p, size_t n)
{
  lua_createtable(L, 0, (int)n);
  for (size_t i = 0; i < n; i++) {
    switch (p[i].type) {
    case FJ_PARAM_INT:
      lua_pushinteger(L, p[i].i);
      break;
    case FJ_PARAM_STR:
      lua_pushstring(L, p[i].s);
      break;
    case FJ_PARAM_BOOL:
      lua_pushboolean(L, p[i].i != 0);
      break;
    case FJ_PARAM_LUT:
      push_lut(L, p[i].lut);
      break;
    }
    lua_setfield(L, -2, p[i].key);
  }
}

static int meta_int(lua_State *L, int idx, const char *key)
{
  lua_getfield(L, idx, key);
  int v = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

static void read_meta(lua_State *L, int idx, fj_kmeta *m)
{
  memset(m, 0, sizeof *m);
  lua_getfield(L, idx, "symbol");
  const char *s = lua_tostring(L, -1);
  snprintf(m->symbol, sizeof m->symbol, "%s", s ? s : "");
  lua_pop(L, 1);
  m->threads = meta_int(L, idx, "threads");
  m->smem_bytes = meta_int(L, idx, "smem_bytes");
  m->rows_per_block = meta_int(L, idx, "rows_per_block");
  m->tma = meta_int(L, idx, "tma");
  m->persistent = meta_int(L, idx, "persistent");
  m->isolate = meta_int(L, idx, "isolate");
}

static int render_protected(lua_State *L)
{
  render_call *c = lua_touserdata(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->tpl->renderer);
  lua_getfield(L, -1, "render");
  lua_pushstring(L, c->name);
  push_params(L, c->params, c->nparams);
  c->tpl->steps = 0;
  lua_sethook(L, tpl_hook, LUA_MASKCOUNT, TPL_HOOK_EVERY);
  lua_call(L, 2, 2);
  lua_sethook(L, NULL, 0, 0);
  if (!lua_isstring(L, -2) || !lua_istable(L, -1))
    return luaL_error(L, "%s: render returned no text", c->name);
  read_meta(L, lua_gettop(L), c->meta);
  size_t len;
  const char *text = lua_tolstring(L, -2, &len);
  c->out->len = 0;
  if (fj__buf_append(c->out, text, len))
    c->nomem = 1;
  return 0;
}

static fj_status render_failed(fj_ctx *ctx, const char *name, int rc,
                               const char *msg)
{
  if (!msg)
    msg = "(no message)";
  if (msg[0] == '\1')
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED, "%s", msg + 1);
  if (rc == LUA_ERRMEM)
    return fj__fail(ctx, FJ_ERR_TEMPLATE,
                    "rendering %s: template exceeded the memory limit "
                    "(%d MiB)",
                    name, TPL_MEM_LIMIT >> 20);
  return fj__fail(ctx, FJ_ERR_TEMPLATE, "rendering %s failed: %s", name, msg);
}

fj_status fj__render(fj_ctx *ctx, const char *name, const fj_param *params,
                     size_t nparams, fj_buf *out, fj_kmeta *meta)
{
  if (!ctx->tpl) {
    fj_status st = tpl_open(ctx);
    if (st != FJ_OK)
      return st;
  }
  lua_State *L = ctx->tpl->L;
  render_call c = {ctx->tpl, name, params, nparams, out, meta, 0};
  lua_settop(L, 0);
  lua_pushcfunction(L, msgh);
  lua_pushcfunction(L, render_protected);
  lua_pushlightuserdata(L, &c);
  int rc = lua_pcall(L, 1, 0, 1);
  lua_sethook(L, NULL, 0, 0);
  fj_status st = FJ_OK;
  if (rc != LUA_OK)
    st = render_failed(ctx, name, rc, lua_tostring(L, -1));
  else if (c.nomem)
    st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  lua_settop(L, 0);
  return st;
}
