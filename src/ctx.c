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
  m->text.len = 0;
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

int fj__smem_limit(const fj_ctx *ctx)
{
  if (ctx->has_device)
    return ctx->dev.smem_optin_bytes;
  /* Opt-in limits per block from the CUDA programming guide's table of
   * compute capabilities, for compile-only contexts. */
  switch (ctx->sm) {
  case 80:
  case 87:
    return 163 * 1024;
  case 90:
  case 100:
  case 103:
  case 110:
    return 227 * 1024;
  case 75:
    return 64 * 1024;
  default:
    return 99 * 1024;
  }
}

int fj__sm_count(const fj_ctx *ctx)
{
  if (ctx->has_device)
    return ctx->dev.sm_count;
  if (ctx->opts.sm_count > 0)
    return ctx->opts.sm_count;
  /* The largest part of each architecture (flashjit.h, fj_attention_plan). */
  switch (ctx->sm) {
  case 80: return 108;   /* A100 */
  case 86: return 84;    /* RTX 3090, A40 */
  case 89: return 128;   /* RTX 4090 */
  case 90: return 132;   /* H100, H200 SXM */
  case 100: return 148;  /* B200 */
  case 120: return 170;  /* RTX 5090 */
  default: return 132;
  }
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
