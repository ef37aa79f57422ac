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
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "ctx.h"
#include "template.h"
#include "util.h"

enum {
  TPL_MEM_LIMIT = 256 << 20,       /* bytes the Lua state may hold */
  TPL_HOOK_EVERY = 1000,           /* instructions between hook calls */
  TPL_FILE_MAX = 16 << 20,         /* bytes of one template file */
  TPL_MOVE_MAX = 1 << 24,          /* elements one table.move may move */
  TPL_BIG_ALLOC = 64 << 10,        /* bytes from which an allocation is charged */
};
static const long long TPL_STEP_LIMIT = 200000000; /* per render */
int fj__tpl_time_limit_ms = 20000;  /* wall-clock time of one render */
/* The steps one pattern call may take (see pattern_cost): far more than
 * any template needs, and well under a second. */
static const double TPL_PATTERN_LIMIT = 5e7;

struct fj_tpl {
  lua_State *L;
  size_t mem_used;
  int refused;         /* 1 once TPL_MEM_LIMIT refused an allocation */
  int limited;         /* 1 while a render (or the renderer's load) runs */
  long long steps;     /* instructions and pattern steps of this render */
  double deadline_ms;  /* fj__now_ms() past which the render is stopped */
  int renderer;        /* registry reference to render.lua's table */
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

/* Reads the regular file at path, of exactly `len` bytes (what stat
 * said), into dst: opened without blocking (a FIFO is refused, not waited
 * on), checked again once open.  NULL, or what is wrong. */
static const char *read_exact(const char *path, char *dst, size_t len)
{
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return strerror(errno);
  struct stat st;
  const char *why = NULL;
  if (fstat(fd, &st) != 0)
    why = strerror(errno);
  else if (!S_ISREG(st.st_mode) || (size_t)st.st_size != len)
    why = "changed while it was read";
  else if (fj__read_all(fd, dst, len) != 0)
    why = strerror(errno);
  close(fd);
  return why;
}

/* Pushes the text of template `name` from directory dir, or nil and what
 * is wrong.  The size comes first (stat), so that the text is read
 * straight into Lua-owned memory allocated before the file is opened: a
 * memory error raised by Lua never leaves an open file behind. */
static int push_file(lua_State *L, const char *dir, const char *name)
{
  char path[PATH_MAX];
  struct stat st;
  const char *why;
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    why = "the path is longer than PATH_MAX";
  else if (stat(path, &st) != 0)
    why = strerror(errno);
  else if (!S_ISREG(st.st_mode))
    why = "not a regular file";
  else if (st.st_size > TPL_FILE_MAX)
    why = "larger than 16 MiB";
  else {
    size_t len = (size_t)st.st_size;
    char *dst = lua_newuserdatauv(L, len + 1, 0);
    if (!(why = read_exact(path, dst, len))) {
      lua_pushlstring(L, dst, len);
      lua_remove(L, -2);
      return 1;
    }
    lua_pop(L, 1);
  }
  lua_pushnil(L);
  lua_pushfstring(L, "%s (FLASHJIT_TEMPLATE_DIR)", why);
  return 2;
}

/* Pushes the text of a template, or nil and the reason.  The built-in copies
 * are generated from templates/ at build time; FLASHJIT_TEMPLATE_DIR, when
 * set, overrides them (for template development). */
static int push_template(lua_State *L, const char *name)
{
  const char *dir = getenv("FLASHJIT_TEMPLATE_DIR");
  size_t len = 0;
  const char *text;
  if (!valid_name(name)) {
    lua_pushnil(L);
    lua_pushstring(L, "invalid template name");
    return 2;
  }
  if (dir && *dir)
    return push_file(L, dir, name);
  if ((text = fj__template_text(name, &len))) {
    lua_pushlstring(L, text, len);
    return 1;
  }
  lua_pushnil(L);
  lua_pushstring(L, "no such built-in template");
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

static void tpl_hook(lua_State *L, lua_Debug *ar);

/* A large allocation is the start of work proportional to its size that
 * the count hook does not see: a copy or a fill inside a C function
 * (string.upper, string.format, table.concat) or a VM instruction
 * (`..`, a string's creation).  It is charged a step per 16 bytes, and
 * past the budget or the clock the hook is armed to run at the very next
 * instruction, so that such work in a loop stops within one call of the
 * limit rather than a thousand.  (The allocator may not raise an error,
 * and lua_sethook may be called from anywhere.) */
static void big_alloc(fj_tpl *t, size_t nsize)
{
  if (!t->limited)
    return;
  t->steps += (long long)(nsize / 16);
  if (t->steps > TPL_STEP_LIMIT || fj__now_ms() > t->deadline_ms)
    lua_sethook(t->L, tpl_hook, LUA_MASKCOUNT, 1);
}

static void *tpl_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
  fj_tpl *t = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    t->mem_used -= old;
    return NULL;
  }
  if (t->mem_used - old + nsize > (size_t)TPL_MEM_LIMIT) {
    t->refused = 1;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p)
    t->mem_used = t->mem_used - old + nsize;
  if (p && nsize >= TPL_BIG_ALLOC)
    big_alloc(t, nsize);
  return p;
}

/* Stops the render past its instruction budget or its time. */
static void check_limits(lua_State *L, fj_tpl *t)
{
  if (t->steps > TPL_STEP_LIMIT)
    luaL_error(L, "template exceeded its instruction limit (%d million)",
               (int)(TPL_STEP_LIMIT / 1000000));
  if (fj__now_ms() > t->deadline_ms)
    luaL_error(L, "template exceeded its time limit (%d ms)",
               fj__tpl_time_limit_ms);
}

static void tpl_hook(lua_State *L, lua_Debug *ar)
{
  fj_tpl *t;
  (void)ar;
  lua_getallocf(L, (void **)&t);
  t->steps += TPL_HOOK_EVERY;
  check_limits(L, t);
}

/* Ends a render's limits: no hook, and allocations no longer charged. */
static void limits_stop(lua_State *L)
{
  fj_tpl *t;
  lua_getallocf(L, (void **)&t);
  t->limited = 0;
  lua_sethook(L, NULL, 0, 0);
}

/* Starts the budget of one render (or of loading the renderer). */
static void limits_start(lua_State *L, fj_tpl *t)
{
  t->steps = 0;
  t->deadline_ms = fj__now_ms() + fj__tpl_time_limit_ms;
  t->limited = 1;
  lua_sethook(L, tpl_hook, LUA_MASKCOUNT, TPL_HOOK_EVERY);
}

/* ---- bounded library functions ---------------------------------------------- */

/* The length of the single-character class at p (a literal, '.', %x or
 * a set [...]) in a pattern ending at end. */
static size_t class_len(const char *p, const char *end)
{
  if (*p == '%')
    return p + 1 < end ? 2 : 1;
  if (*p != '[')
    return 1;
  const char *q = p + 1;
  if (q < end && *q == '^')
    q++;
  do {  /* the first ']' of a set is a member */
    if (q < end && *q == '%')
      q++;
    q++;
  } while (q < end && *q != ']');
  return (size_t)(q < end ? q + 1 - p : end - p);
}

/* Whether the byte c is in the class letter cl of a pattern's %x, as
 * Lua's matcher decides it (lstrlib.c's match_class): an upper-case class
 * is the complement, any other byte stands for itself. */
static int in_class(int c, int cl)
{
  int r;
  switch (tolower(cl)) {
  case 'a': r = isalpha(c); break;
  case 'c': r = iscntrl(c); break;
  case 'd': r = isdigit(c); break;
  case 'g': r = isgraph(c); break;
  case 'l': r = islower(c); break;
  case 'p': r = ispunct(c); break;
  case 's': r = isspace(c); break;
  case 'u': r = isupper(c); break;
  case 'w': r = isalnum(c); break;
  case 'x': r = isxdigit(c); break;
  default: return cl == c;
  }
  return isupper(cl) ? !r : r != 0;
}

/* Whether c is in the set [...] from p to its ']' at ec (matchbracketclass). */
static int in_set(int c, const char *p, const char *ec)
{
  int sig = 1;
  if (p[1] == '^') {
    sig = 0;
    p++;
  }
  while (++p < ec) {
    if (*p == '%') {
      if (++p < ec && in_class(c, (unsigned char)*p))
        return sig;
    } else if (p[1] == '-' && p + 2 < ec) {
      p += 2;
      if ((unsigned char)p[-2] <= c && c <= (unsigned char)*p)
        return sig;
    } else if ((unsigned char)*p == c) {
      return sig;
    }
  }
  return !sig;
}

/* The longest run of the subject's bytes that the class at p (len bytes)
 * matches, or n where that is not worked out ('.', a malformed set).  A
 * repetition of one class cannot take more steps than that run plus one
 * (lstrlib.c's max_expand counts matches, min_expand stops at the first
 * byte the class refuses), so `%s*` around a long text of few blanks is
 * cheap however long the text is. */
static size_t class_run(const char *p, size_t len, const char *s, size_t n)
{
  if (*p == '.' || (*p == '[' && (len < 2 || p[len - 1] != ']')) ||
      (*p == '%' && len < 2))
    return n;
  size_t run = 0, best = 0;
  for (size_t i = 0; i < n; i++) {
    int c = (unsigned char)s[i];
    int in = *p == '%'   ? in_class(c, (unsigned char)p[1])
             : *p == '[' ? in_set(c, p, p + len - 1)
                         : c == (unsigned char)*p;
    run = in ? run + 1 : 0;
    best = run > best ? run : best;
  }
  return best;
}

/* Classes whose runs pattern_cost works out; past them, n + 1 a
 * repetition (each run costs a pass over the subject). */
#define TPL_PATTERN_RUNS 8

/* An upper bound of the steps Lua's matcher can take for pattern p (m
 * bytes) from one start position of the subject s (n bytes): the
 * pattern's length, times n + 1 for every balance (%b) and
 * back-reference (%1..%9), times the longest run of bytes its class
 * matches in s, plus one, for every repetition ('*', '+', '-'), times 2
 * for every '?'.  Backtracking makes the real cost grow as that product,
 * so a pattern that could run for hours is refused before it starts.
 * *anchored: the pattern starts with '^' (where anchor allows it), so
 * only one start position is tried.  *scanned: the subject's bytes read
 * to find the runs, for the render's budget. */
static double pattern_cost(const char *p, size_t m, const char *s, size_t n,
                           int anchor, int *anchored, double *scanned)
{
  const char *end = p + m;
  double cost = (double)m + 1, per = (double)n + 1;
  int runs = 0;
  *anchored = anchor && p < end && *p == '^';
  *scanned = 0;
  p += *anchored;
  while (p < end) {
    if (*p == '(' || *p == ')') {
      p++;
    } else if (*p == '%' && p + 1 < end && (p[1] == 'b' || isdigit((unsigned char)p[1]))) {
      cost *= per;
      p += p[1] == 'b' ? 4 : 2;
    } else if (*p == '%' && p + 1 < end && p[1] == 'f') {
      p += 2 + class_len(p + 2, end);
    } else {
      const char *cl = p;
      p += class_len(p, end);
      if (p >= end || (*p != '*' && *p != '+' && *p != '-' && *p != '?'))
        continue;
      if (*p++ == '?') {
        cost *= 2;
      } else if (runs < TPL_PATTERN_RUNS) {
        runs++;
        *scanned += (double)n;
        cost *= (double)class_run(cl, (size_t)(p - 1 - cl), s, n) + 1;
      } else {
        cost *= per;
      }
    }
  }
  return cost;
}

static const char *const pattern_names[] = {"find", "match", "gmatch", "gsub"};
enum { PAT_FIND, PAT_MATCH, PAT_GMATCH, PAT_GSUB };

/* The bytes of a subject of n bytes from init (argument 3 of find, match
 * and gmatch, as Lua reads it) to its end. */
static size_t pattern_span(lua_State *L, int kind, size_t n)
{
  if (kind == PAT_GSUB)
    return n;
  lua_Integer init = luaL_optinteger(L, 3, 1);
  if (init < 0)
    init = (lua_Integer)n + init + 1;
  if (init < 1)
    init = 1;
  return (lua_Unsigned)init > n ? 0 : n - (size_t)init + 1;
}

/* string.find, match, gmatch and gsub in the sandbox: the library's own,
 * refused when the pattern could backtrack past TPL_PATTERN_LIMIT steps,
 * and charged to the render's budget (C calls are not counted by the
 * hook): the bound for each start position times the start positions
 * from init on -- for a find, those before the match it returned. */
static int bounded_pattern(lua_State *L)
{
  size_t n, m;
  const char *s = luaL_checklstring(L, 1, &n);
  const char *p = luaL_checklstring(L, 2, &m);
  int kind = (int)lua_tointeger(L, lua_upvalueindex(2)), anchored = 0;
  int plain = kind == PAT_FIND && lua_toboolean(L, 4);
  size_t span = pattern_span(L, kind, n);
  double scanned = 0;
  double per = plain ? (double)m + 1
                     : pattern_cost(p, m, s + (n - span), span,
                                    kind != PAT_GMATCH, &anchored, &scanned);
  double cost = per * (anchored ? 1 : (double)span + 1);
  fj_tpl *t;
  lua_getallocf(L, (void **)&t);
  if (cost > TPL_PATTERN_LIMIT) {
    char msg[200];
    snprintf(msg, sizeof msg, "string.%s: the pattern '%.40s' on %zu bytes "
                              "could take %.1e steps; the limit is %.0e",
             pattern_names[kind], p, n, cost, TPL_PATTERN_LIMIT);
    return luaL_error(L, "%s", msg);
  }
  check_limits(L, t);
  lua_Integer from = (lua_Integer)(n - span) + 1;
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  if (kind == PAT_FIND && !anchored && lua_isinteger(L, 1))
    cost = per * (double)(lua_tointeger(L, 1) - from + 1);
  t->steps += (long long)(cost + scanned);
  check_limits(L, t);
  return lua_gettop(L);
}

/* table.move in the sandbox: at most TPL_MOVE_MAX elements a call (a C
 * loop the hook does not see). */
static int bounded_move(lua_State *L)
{
  lua_Integer f = luaL_checkinteger(L, 2), e = luaL_checkinteger(L, 3);
  lua_Unsigned span = (lua_Unsigned)e - (lua_Unsigned)f;
  if (e >= f && span >= (lua_Unsigned)TPL_MOVE_MAX)
    return luaL_error(L, "table.move: %f elements; the limit is %d",
                      (double)span + 1, (int)TPL_MOVE_MAX);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* table.sort, table.concat and string.rep in the sandbox: the library's
 * own, charged to the render's budget by the work they do (10 n log n
 * for the comparisons, n pieces, a step per piece and per 16 bytes
 * made). */
static int charged(lua_State *L)
{
  int kind = (int)lua_tointeger(L, lua_upvalueindex(2));
  double n = 0;
  if (kind < 2) {
    luaL_checktype(L, 1, LUA_TTABLE);
    n = (double)lua_rawlen(L, 1);
    /* A comparison through the API costs about ten instructions. */
    n = kind == 0 ? 10 * n * (log2(n + 1) + 1) : n;
  } else {
    size_t len, sep = 0;
    luaL_checklstring(L, 1, &len);
    luaL_optlstring(L, 3, "", &sep);
    /* Each piece is a copy of its own (a call of memcpy), whatever its
     * length: ("x"):rep(100) costs 106 steps, not 6. */
    double count = (double)luaL_optinteger(L, 2, 0);
    n = count * (1 + ((double)len + (double)sep) / 16);
  }
  n += 1;  /* the call itself */
  fj_tpl *t;
  lua_getallocf(L, (void **)&t);
  t->steps += n > 1e15 ? (long long)1e15 : n > 0 ? (long long)n : 0;
  check_limits(L, t);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* Replaces lib.name by fn wrapping the original (upvalue 1; upvalue 2 an
 * integer for fn). */
static void wrap(lua_State *L, const char *lib, const char *name,
                 lua_CFunction fn, int arg)
{
  lua_getglobal(L, lib);
  lua_getfield(L, -1, name);
  lua_pushinteger(L, arg);
  lua_pushcclosure(L, fn, 2);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

/* The library tables the sandbox copies, and the string metatable's
 * __index (the same table), get the bounded functions -- before any Lua
 * code runs, the renderer's own top level included. */
static void bound_libs(lua_State *L)
{
  for (int i = 0; i < (int)FJ_ARRAY_LEN(pattern_names); i++)
    wrap(L, LUA_STRLIBNAME, pattern_names[i], bounded_pattern, i);
  wrap(L, LUA_TABLIBNAME, "move", bounded_move, 0);
  wrap(L, LUA_TABLIBNAME, "sort", charged, 0);
  wrap(L, LUA_TABLIBNAME, "concat", charged, 1);
  wrap(L, LUA_STRLIBNAME, "rep", charged, 2);
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
 * registry.  Called under lua_pcall; the renderer's top level runs under
 * the same limits as a render, with the bounded library functions. */
static int open_renderer(lua_State *L)
{
  fj_tpl *t = lua_touserdata(L, 1);
  open_libs(L);
  bound_libs(L);
  if (push_template(L, "render.lua") != 1)
    return luaL_error(L, "render.lua: %s", lua_tostring(L, -1));
  size_t len;
  const char *text = lua_tolstring(L, -1, &len);
  if (luaL_loadbufferx(L, text, len, "=render.lua", "t") != LUA_OK)
    return lua_error(L);
  lua_pushcfunction(L, l_source);
  limits_start(L, t);
  lua_call(L, 1, 1);
  limits_stop(L);
  if (!lua_istable(L, -1))
    return luaL_error(L, "render.lua did not return a table");
  t->renderer = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

/* Where the error being handled was raised: "name:line" of the innermost
 * Lua function with a line, or "?" (for an error object that is not a
 * string, which carries no position of its own). */
static void error_where(lua_State *L, char *buf, size_t size)
{
  lua_Debug ar;
  snprintf(buf, size, "?");
  for (int level = 1; lua_getstack(L, level, &ar); level++)
    if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
      snprintf(buf, size, "%s:%d", ar.short_src, ar.currentline);
      return;
    }
}

/* The message handler: a string error gets a traceback; a refusal (a table
 * with a `why` field, from refuse()) becomes "\1" .. why. */
static int msgh(lua_State *L)
{
  limits_stop(L);
  if (lua_istable(L, 1)) {
    lua_getfield(L, 1, "why");
    if (lua_isstring(L, -1)) {
      lua_pushfstring(L, "\1%s", lua_tostring(L, -1));
      return 1;
    }
    lua_pop(L, 1);
  }
  const char *msg = lua_type(L, 1) == LUA_TSTRING ? lua_tostring(L, 1) : NULL;
  if (!msg) {
    char where[300];
    error_where(L, where, sizeof where);
    msg = lua_pushfstring(L, "%s: error object is a %s value, not a message",
                          where, luaL_typename(L, 1));
  }
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
  int rc = lua_pcall(L, 1, 0, 1);
  if (rc != LUA_OK) {
    fj_status st = fj__fail(ctx, rc == LUA_ERRMEM && !t->refused
                                     ? FJ_ERR_NOMEM : FJ_ERR_TEMPLATE,
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
  char bad_meta[256];  /* what is wrong with the meta table, if anything */
} render_call;

void fj__lut_push(lua_State *L, const fj_lut *lut)
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

static void push_params(lua_State *L, const fj_param *p, size_t n);

/* One parameter's value; 0 where it is nil (nothing pushed). */
static int push_value(lua_State *L, const fj_param *p)
{
  switch (p->type) {
  case FJ_PARAM_INT:
    lua_pushinteger(L, p->i);
    return 1;
  case FJ_PARAM_STR:
    if (!p->s)
      return 0;
    lua_pushstring(L, p->s);
    return 1;
  case FJ_PARAM_BOOL:
    lua_pushboolean(L, p->i != 0);
    return 1;
  case FJ_PARAM_LUT:
    fj__lut_push(L, p->lut);
    return 1;
  case FJ_PARAM_TABLE:
    push_params(L, fj_param_kids(p), (size_t)p->i);
    return 1;
  }
  return 0;
}

/* A table of parameters: keyed ones as fields, the others as a list. */
static void push_params(lua_State *L, const fj_param *p, size_t n)
{
  lua_Integer list = 0;
  lua_createtable(L, 0, (int)n);
  for (size_t i = 0; i < n; i++) {
    if (!push_value(L, &p[i]))
      continue;
    if (p[i].key)
      lua_setfield(L, -2, p[i].key);
    else
      lua_rawseti(L, -2, ++list);
  }
}

/* The integer fields of a template's meta table and what each may be:
 * they size launches, so they are checked like user input. */
static const struct meta_field {
  const char *key;
  size_t offset;
  int lo, hi, required;
} meta_fields[] = {
    {"threads", offsetof(fj_kmeta, threads), 1, 1024, 1},
    /* Past any GPU's limit is the variant check's to refuse (with the
     * target's limit); this bound only keeps the count an int. */
    {"smem_bytes", offsetof(fj_kmeta, smem_bytes), 0, 1 << 30, 1},
    {"rows_per_block", offsetof(fj_kmeta, rows_per_block), 0, 1 << 16, 1},
    {"tma", offsetof(fj_kmeta, tma), 0, 1, 0},
    {"persistent", offsetof(fj_kmeta, persistent), 0, 2, 0},
    {"isolate", offsetof(fj_kmeta, isolate), 0, 1, 0},
    {"quick", offsetof(fj_kmeta, quick), 0, 1, 0},
};

/* The value at the top of the stack as a message shows it. */
static const char *meta_shown(lua_State *L)
{
  if (lua_type(L, -1) != LUA_TNUMBER)
    return luaL_typename(L, -1);
  lua_pushvalue(L, -1);
  return lua_tostring(L, -1);  /* left on the stack: render_call resets it */
}

/* One integer field of the meta table at idx into m; 0, or -1 with why. */
static int meta_int(lua_State *L, int idx, const struct meta_field *f,
                    fj_kmeta *m, char *why, size_t n)
{
  int isint = 0;
  lua_getfield(L, idx, f->key);
  lua_Integer v = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
  if (lua_isnil(L, -1) && !f->required)
    isint = 1;
  if (isint && v >= f->lo && v <= f->hi) {
    *(int *)(void *)((char *)m + f->offset) = (int)v;
    lua_pop(L, 1);
    return 0;
  }
  snprintf(why, n, "meta.%s = %s is invalid: an integer in %d..%d", f->key,
           meta_shown(L), f->lo, f->hi);
  return -1;
}

/* meta.symbol: the kernel's name, a C identifier of 1..127 bytes. */
static int meta_symbol(lua_State *L, int idx, fj_kmeta *m, char *why, size_t n)
{
  size_t len = 0;
  lua_getfield(L, idx, "symbol");
  const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
  int ok = s && len >= 1 && len < sizeof m->symbol &&
           (isalpha((unsigned char)s[0]) || s[0] == '_');
  for (size_t i = 0; ok && i < len; i++)
    ok = isalnum((unsigned char)s[i]) || s[i] == '_';
  if (!ok) {
    snprintf(why, n, "meta.symbol = %.60s%s is invalid: a C identifier of "
                     "1..%zu characters",
             s ? s : luaL_typename(L, -1), s && len > 60 ? "..." : "",
             sizeof m->symbol - 1);
    return -1;
  }
  memcpy(m->symbol, s, len + 1);
  lua_pop(L, 1);
  return 0;
}

/* The meta table at idx, checked; 0, or -1 with why. */
static int read_meta(lua_State *L, int idx, fj_kmeta *m, char *why, size_t n)
{
  memset(m, 0, sizeof *m);
  if (meta_symbol(L, idx, m, why, n) != 0)
    return -1;
  for (size_t i = 0; i < FJ_ARRAY_LEN(meta_fields); i++)
    if (meta_int(L, idx, &meta_fields[i], m, why, n) != 0)
      return -1;
  return fj__kmeta_wrong(m, why, n) ? -1 : 0;
}

const char *fj__kmeta_wrong(const fj_kmeta *m, char *why, size_t n)
{
  size_t len = strnlen(m->symbol, sizeof m->symbol);
  int ok = len >= 1 && len < sizeof m->symbol &&
           (isalpha((unsigned char)m->symbol[0]) || m->symbol[0] == '_');
  for (size_t i = 0; ok && i < len; i++)
    ok = isalnum((unsigned char)m->symbol[i]) || m->symbol[i] == '_';
  if (!ok) {
    snprintf(why, n, "meta.symbol is invalid: a C identifier of 1..%zu "
                     "characters", sizeof m->symbol - 1);
    return why;
  }
  for (size_t i = 0; i < FJ_ARRAY_LEN(meta_fields); i++) {
    const struct meta_field *f = &meta_fields[i];
    int v = *(const int *)(const void *)((const char *)m + f->offset);
    if (v < f->lo || v > f->hi) {
      snprintf(why, n, "meta.%s = %d is invalid: an integer in %d..%d",
               f->key, v, f->lo, f->hi);
      return why;
    }
  }
  return NULL;
}

static int render_protected(lua_State *L)
{
  render_call *c = lua_touserdata(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->tpl->renderer);
  lua_getfield(L, -1, "render");
  lua_pushstring(L, c->name);
  push_params(L, c->params, c->nparams);
  limits_start(L, c->tpl);
  lua_call(L, 2, 2);
  limits_stop(L);
  if (!lua_isstring(L, -2) || !lua_istable(L, -1))
    return luaL_error(L, "%s: render returned no text", c->name);
  if (read_meta(L, lua_gettop(L), c->meta, c->bad_meta, sizeof c->bad_meta))
    return 0;
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
  /* The process's memory, not the template's limit, ran out. */
  if (rc == LUA_ERRMEM && !ctx->tpl->refused)
    return fj__fail(ctx, FJ_ERR_NOMEM, "rendering %s: out of memory", name);
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
  render_call c = {ctx->tpl, name, params, nparams, out, meta, 0, ""};
  ctx->tpl->refused = 0;
  lua_settop(L, 0);
  lua_pushcfunction(L, msgh);
  lua_pushcfunction(L, render_protected);
  lua_pushlightuserdata(L, &c);
  int rc = lua_pcall(L, 1, 0, 1);
  limits_stop(L);
  fj_status st = FJ_OK;
  if (rc != LUA_OK)
    st = render_failed(ctx, name, rc, lua_tostring(L, -1));
  else if (c.bad_meta[0])
    st = fj__fail(ctx, FJ_ERR_TEMPLATE, "rendering %s: %s", name, c.bad_meta);
  else if (c.nomem)
    st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  lua_settop(L, 0);
  return st;
}
