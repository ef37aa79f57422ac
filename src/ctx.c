/*
 * ctx.c -- what every module needs of the context: the per-thread error
 * messages, the log callback, the target architecture and its limits.
 * Creating and destroying a context is lifecycle.c's (the top layer).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "util.h"

/* ---- status text ---------------------------------------------------------- */

const char *fj_status_str(fj_status status)
{
  switch (status) {
#define FJ_STATUS_CASE_(name, value, text) \
  case FJ_##name:                          \
    return text;
    FJ_STATUS_MAP(FJ_STATUS_CASE_)
#undef FJ_STATUS_CASE_
  }
  return "unknown status";
}

const char *fj_version(void)
{
  return "0.1.0";
}

int fj_abi_version(void)
{
  return FJ_ABI_VERSION;
}

/* ---- per-thread messages ---------------------------------------------------
 * A context is shared by threads, so its "last message" is kept per thread:
 * a thread reading fj_errmsg sees its own failure, never another thread's.
 * Each thread holds one message, tagged with the serial of the context it
 * belongs to (serial 0: fj_ctx_create).
 */

typedef struct fj_tls_msg {
  uint64_t serial;
  fj_buf text;
} fj_tls_msg;

static pthread_key_t msg_key;
static pthread_once_t msg_once = PTHREAD_ONCE_INIT;
static uint64_t next_serial = 1;
static pthread_mutex_t serial_lock = PTHREAD_MUTEX_INITIALIZER;

static void msg_free(void *p)
{
  fj_tls_msg *m = p;
  fj__buf_free(&m->text);
  free(m);
}

static void msg_key_create(void)
{
  pthread_key_create(&msg_key, msg_free);
}

static fj_tls_msg *thread_msg(int create)
{
  pthread_once(&msg_once, msg_key_create);
  fj_tls_msg *m = pthread_getspecific(msg_key);
  if (!m && create) {
    m = calloc(1, sizeof *m);
    if (m && pthread_setspecific(msg_key, m) != 0) {
      free(m);
      m = NULL;
    }
  }
  return m;
}

void fj__ctx_serial(fj_ctx *ctx)
{
  pthread_mutex_lock(&serial_lock);
  ctx->serial = next_serial++;
  pthread_mutex_unlock(&serial_lock);
}

static uint64_t serial_of(const fj_ctx *ctx)
{
  return ctx ? ctx->serial : 0;
}

void fj__clear_error(const fj_ctx *ctx)
{
  fj_tls_msg *m = thread_msg(0);
  if (m && m->serial == serial_of(ctx) && m->text.data) {
    m->text.len = 0;
    m->text.data[0] = '\0';
  }
}

fj_status fj__fail(const fj_ctx *ctx, fj_status status, const char *fmt, ...)
{
  fj_tls_msg *m = thread_msg(1);
  if (!m)
    return status;
  m->serial = serial_of(ctx);
  /* Emptied first: a message that memory cannot hold must not leave the
   * previous error's in its place. */
  m->text.len = 0;
  if (m->text.data)
    m->text.data[0] = '\0';
  va_list ap;
  va_start(ap, fmt);
  fj__buf_vappendf(&m->text, fmt, ap);
  va_end(ap);
  return status;
}

fj_status fj__null_arg(const fj_ctx *ctx, const char *fn, const char *arg)
{
  return fj__fail(ctx, FJ_ERR_INVALID_ARG, "%s: %s is NULL", fn, arg);
}

void fj__fail_more(const fj_ctx *ctx, const char *fmt, ...)
{
  fj_tls_msg *m = thread_msg(1);
  if (!m || m->serial != serial_of(ctx))
    return;
  fj__buf_append(&m->text, "\n", 1);
  va_list ap;
  va_start(ap, fmt);
  fj__buf_vappendf(&m->text, fmt, ap);
  va_end(ap);
}

const char *fj_errmsg(const fj_ctx *ctx)
{
  fj_tls_msg *m = thread_msg(0);
  if (!m || m->serial != serial_of(ctx) || !m->text.data)
    return "";
  return m->text.data;
}

void fj__log(const fj_ctx *ctx, fj_log_level level, const char *fmt, ...)
{
  if (!ctx || !ctx->opts.log)
    return;
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  /* A diagnostic is one line: a control byte that came in with a path or
   * a name (a newline, a terminal's escape) is shown as '?', never sent. */
  for (char *c = text; *c; c++)
    if ((unsigned char)*c < 0x20 || *c == 0x7f)
      *c = '?';
  ctx->opts.log(ctx->opts.log_user, level, text);
}

/* ---- architecture ---------------------------------------------------------- */

int fj__parse_arch(const char *arch, int *sm, int *specific)
{
  if (!arch || strncmp(arch, "sm_", 3) != 0)
    return -1;
  const char *p = arch + 3;
  int n = 0, digits = 0;
  while (isdigit((unsigned char)*p) && digits < 4) {
    n = n * 10 + (*p++ - '0');
    digits++;
  }
  int a = 0;
  if (*p == 'a') {
    a = 1;
    p++;
  }
  if (digits < 2 || *p != '\0')
    return -1;
  *sm = n;
  *specific = a;
  return 0;
}

/* One row per compute capability NVRTC 13 targets.  Shared memory and
 * threads from the CUDA programming guide's table of compute
 * capabilities; multiprocessors of each family's largest part (the
 * split rule's default, flashjit.h's fj_attention_plan).  sm_88 has no
 * documented part: it takes sm_86's limits. */
#define KB 1024
#define SM80_ (FJ_ARCH_CP_ASYNC | FJ_ARCH_MMA_SYNC | FJ_ARCH_BF16)
#define SM89_ (SM80_ | FJ_ARCH_FP8)
static const fj_arch_info arch_table[] = {
    {75, "T4, RTX 20", 64 * KB, 64 * KB, 65536, 255, 1024, 72, 0},
    {80, "A100", 163 * KB, 164 * KB, 65536, 255, 2048, 108, SM80_},
    {86, "A10, A40, RTX 30", 99 * KB, 100 * KB, 65536, 255, 1536, 84, SM80_},
    {87, "Jetson Orin", 163 * KB, 164 * KB, 65536, 255, 2048, 16, SM80_},
    {88, "(none documented)", 99 * KB, 100 * KB, 65536, 255, 1536, 84, SM80_},
    {89, "L4, L40S, RTX 40", 99 * KB, 100 * KB, 65536, 255, 1536, 128, SM89_},
    {90, "H100, H200", 227 * KB, 228 * KB, 65536, 255, 2048, 132,
     SM89_ | FJ_ARCH_WGMMA},
    {100, "B200", 227 * KB, 228 * KB, 65536, 255, 2048, 148, SM89_},
    {103, "B300", 227 * KB, 228 * KB, 65536, 255, 2048, 148, SM89_},
    {110, "Jetson Thor", 227 * KB, 228 * KB, 65536, 255, 2048, 20, SM89_},
    {120, "RTX 50, RTX PRO 6000", 99 * KB, 100 * KB, 65536, 255, 1536, 170,
     SM89_},
    {121, "DGX Spark", 99 * KB, 100 * KB, 65536, 255, 1536, 48, SM89_},
};
#undef SM89_
#undef SM80_
#undef KB

const fj_arch_info *fj__arch_info(int sm)
{
  const fj_arch_info *row = &arch_table[0];
  for (size_t i = 0; i < FJ_ARRAY_LEN(arch_table); i++)
    if (arch_table[i].sm <= sm)
      row = &arch_table[i];
  return row;
}

const fj_arch_info *fj__arch(const fj_ctx *ctx)
{
  return fj__arch_info(ctx->sm);
}

int fj__arch_has(const fj_ctx *ctx, unsigned feature)
{
  if ((feature & FJ_ARCH_WGMMA) && !ctx->arch_specific)
    return 0;
  return (fj__arch(ctx)->features & feature) == feature;
}

int fj__smem_limit(const fj_ctx *ctx)
{
  return ctx->has_device ? ctx->dev.smem_optin_bytes : fj__arch(ctx)->smem_block;
}

int fj__smem_sm(const fj_ctx *ctx)
{
  return ctx->has_device ? ctx->dev.smem_optin_bytes + 1024
                         : fj__arch(ctx)->smem_sm;
}

int fj__sm_count(const fj_ctx *ctx)
{
  if (ctx->has_device)
    return ctx->dev.sm_count;
  if (ctx->opts.sm_count > 0)
    return ctx->opts.sm_count;
  return fj__arch(ctx)->sm_count;
}

static fj_status check_arch(const fj_ctx *ctx, const char *arch)
{
  int sm, specific;
  if (fj__parse_arch(arch, &sm, &specific) != 0)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "invalid arch '%s': expected sm_XY or sm_XYa, e.g. sm_80, "
                    "sm_90a",
                    arch);
  if (sm < 75 || sm > 130)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "arch '%s' is out of range: NVRTC 13 targets sm_75 and "
                    "newer",
                    arch);
  if (specific && sm < 90)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "arch '%s': arch-specific ('a') targets start at sm_90a",
                    arch);
  (void)ctx;
  return FJ_OK;
}

fj_status fj__ctx_set_arch(fj_ctx *ctx, const char *arch)
{
  if (!arch) {
    /* A GPU context defaults to the device's own target; on compute
     * capability 9.0 the arch-specific one, so that wgmma is available. */
    snprintf(ctx->arch, sizeof ctx->arch, "sm_%d%d%s", ctx->dev.cc_major,
             ctx->dev.cc_minor, ctx->dev.cc_major == 9 ? "a" : "");
  } else {
    fj_status st = check_arch(ctx, arch);
    if (st != FJ_OK)
      return st;
    snprintf(ctx->arch, sizeof ctx->arch, "%s", arch);
  }
  fj__parse_arch(ctx->arch, &ctx->sm, &ctx->arch_specific);
  if (!ctx->has_device)
    return FJ_OK;
  int dev_sm = ctx->dev.cc_major * 10 + ctx->dev.cc_minor;
  /* A cubin runs on its own major version at an equal or newer minor; an
   * arch-specific one only on exactly its own compute capability. */
  int runs = ctx->sm / 10 == dev_sm / 10 && ctx->sm <= dev_sm &&
             (!ctx->arch_specific || ctx->sm == dev_sm);
  if (!runs)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "arch '%s' cannot run on device %d (%s, compute "
                    "capability %d.%d)",
                    ctx->arch, ctx->dev.ordinal, ctx->dev.name,
                    ctx->dev.cc_major, ctx->dev.cc_minor);
  return FJ_OK;
}

/* ---- facts about a context ------------------------------------------------ */

const char *fj_ctx_arch(const fj_ctx *ctx)
{
  return ctx ? ctx->arch : "";
}

int fj_ctx_has_device(const fj_ctx *ctx)
{
  return ctx && ctx->has_device;
}

fj_status fj_device_get(fj_ctx *ctx, fj_device_info *info)
{
  if (!ctx || !info)
    return fj__null_arg(ctx, "fj_device_get", ctx ? "info" : "ctx");
  fj__clear_error(ctx);
  if (!ctx->has_device)
    return fj__fail(ctx, FJ_ERR_COMPILE_ONLY,
                    "compile-only context (arch %s) has no device",
                    ctx->arch);
  *info = ctx->dev;
  return FJ_OK;
}
