/*
 * package.c -- the read-only kernel package: a directory of disk-cache
 * entry files, exactly as a cache directory holds them (header, key text,
 * checksum, payload; named by the hash of the key), and a manifest:
 *
 *   flashjit package 1
 *   format=3
 *   nvrtc=13.0
 *   library=0.1.0
 *   arch=sm_80
 *   arch=sm_90a
 *
 * An entry's key holds everything it depends on -- the rendered source's
 * hash, the NVRTC version and options (the target architecture among
 * them), the cache format -- and a lookup compares the whole key text, so
 * an entry made by another toolkit, for another architecture or from
 * another source is never used even if the manifest were wrong.  The
 * manifest only spares a context a package it could not use: checked
 * once, when the context opens it.  Nothing here writes into a package
 * but fj__package_manifest_add, which builds one.
 *
 * A package comes from outside the process as a shared cache directory or
 * a cache pack does, and crosses the same boundary: its files are read by
 * the disk cache's one reader (fj__cache_entry_load: a regular file,
 * bounded, checksum, kind and key), and kernel.c holds their payloads to
 * the same checks as the disk cache's and an import's (entry.c: a
 * render's metadata and source as a render would have made them, a
 * kernel's parts) before anything sizes a launch or reaches NVRTC or the
 * driver.  Nothing here parses an entry itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "compile.h"
#include "ctx.h"
#include "package.h"
#include "util.h"

#define MANIFEST_MAX ((uint64_t)64 << 10)
#define DIR_MAX 4096

struct fj_package {
  char dir[DIR_MAX];
};

/* ---- the manifest ---------------------------------------------------------------- */

/* The manifest's fields: its format and NVRTC lines, and its archs as one
 * space-separated list. */
typedef struct manifest {
  int ok;  /* it starts with FJ_PACKAGE_MAGIC */
  char format[32], nvrtc[32], library[32];
  char archs[512];
} manifest;

static void manifest_line(manifest *m, const char *line, size_t len)
{
  char v[64];
  const char *eq = memchr(line, '=', len);
  if (!eq || (size_t)(line + len - eq - 1) >= sizeof v)
    return;
  snprintf(v, sizeof v, "%.*s", (int)(line + len - eq - 1), eq + 1);
  size_t k = (size_t)(eq - line);
  if (k == 6 && !memcmp(line, "format", 6))
    snprintf(m->format, sizeof m->format, "%s", v);
  else if (k == 5 && !memcmp(line, "nvrtc", 5))
    snprintf(m->nvrtc, sizeof m->nvrtc, "%s", v);
  else if (k == 7 && !memcmp(line, "library", 7))
    snprintf(m->library, sizeof m->library, "%s", v);
  else if (k == 4 && !memcmp(line, "arch", 4) &&
           strlen(m->archs) + strlen(v) + 2 < sizeof m->archs)
    snprintf(m->archs + strlen(m->archs), sizeof m->archs - strlen(m->archs),
             "%s%s", m->archs[0] ? " " : "", v);
}

/* Reads dir's manifest; 0, or -1 with errno (ENOENT: none there). */
static int manifest_read(const char *dir, manifest *m)
{
  char path[DIR_MAX + 64];
  size_t len = 0;
  memset(m, 0, sizeof *m);
  snprintf(path, sizeof path, "%s/%s", dir, FJ_PACKAGE_MANIFEST);
  char *text = fj__file_read(path, MANIFEST_MAX, &len);
  if (!text)
    return -1;
  size_t magic = strlen(FJ_PACKAGE_MAGIC);
  m->ok = len > magic && !memcmp(text, FJ_PACKAGE_MAGIC, magic) &&
          text[magic] == '\n';
  for (char *p = text; m->ok && *p;) {
    size_t n = strcspn(p, "\n");
    manifest_line(m, p, n);
    p += n + (p[n] != '\0');
  }
  free(text);
  return 0;
}

static int has_arch(const char *archs, const char *arch)
{
  size_t n = strlen(arch);
  for (const char *p = archs; (p = strstr(p, arch)) != NULL; p += n)
    if ((p == archs || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
      return 1;
  return 0;
}

/* Whether m was made by this process's NVRTC and cache format; why
 * otherwise. */
static int manifest_current(const manifest *m, char *why, size_t n)
{
  char mine[32];
  snprintf(mine, sizeof mine, "%d", FJ_FORMAT_VERSION);
  if (!m->ok) {
    snprintf(why, n, "has a manifest that does not start with '%s'",
             FJ_PACKAGE_MAGIC);
    return 0;
  }
  if (strcmp(m->format, mine) != 0) {
    snprintf(why, n, "was made for cache format %s; this process has %s",
             m->format[0] ? m->format : "?", mine);
    return 0;
  }
  if (strcmp(m->nvrtc, fj__nvrtc_version()) != 0) {
    snprintf(why, n, "was made by NVRTC %s; this process has %s",
             m->nvrtc[0] ? m->nvrtc : "?", fj__nvrtc_version());
    return 0;
  }
  return 1;
}

int fj__package_usable(const char *dir, const char *arch, char *why, size_t n)
{
  manifest m;
  if (manifest_read(dir, &m) != 0) {
    snprintf(why, n, "has no readable manifest %s (%s)", FJ_PACKAGE_MANIFEST,
             strerror(errno));
    return 0;
  }
  if (!manifest_current(&m, why, n))
    return 0;
  if (!has_arch(m.archs, arch)) {
    snprintf(why, n, "holds no kernels for %s (it has %s)", arch,
             m.archs[0] ? m.archs : "none");
    return 0;
  }
  return 1;
}

/* The manifest's text with arch added to m's archs. */
static int manifest_text(const manifest *m, const char *arch, fj_buf *b)
{
  int bad = fj__buf_appendf(b, "%s\nformat=%d\nnvrtc=%s\nlibrary=%s\n",
                            FJ_PACKAGE_MAGIC, FJ_FORMAT_VERSION,
                            fj__nvrtc_version(), fj_version());
  char archs[600];
  snprintf(archs, sizeof archs, "%s%s%s", m->archs,
           m->archs[0] && !has_arch(m->archs, arch) ? " " : "",
           has_arch(m->archs, arch) ? "" : arch);
  for (const char *p = archs; *p && !bad;) {
    size_t n = strcspn(p, " ");
    bad = fj__buf_appendf(b, "arch=%.*s\n", (int)n, p);
    p += n + (p[n] == ' ');
  }
  return bad;
}

static int write_file(const char *dir, const char *text, size_t len)
{
  char tmp[DIR_MAX + 96], path[DIR_MAX + 64];
  char id[FJ_TEMP_ID_MAX];
  fj__temp_id(id);
  snprintf(tmp, sizeof tmp, "%s/.tmp-manifest-%s", dir, id);
  snprintf(path, sizeof path, "%s/%s", dir, FJ_PACKAGE_MANIFEST);
  const void *parts[1] = {text};
  return fj__write_replace(tmp, path, 0444, parts, &len, 1);
}

fj_status fj__package_manifest_add(fj_ctx *ctx, const char *dir,
                                   const char *arch)
{
  manifest m;
  char why[160];
  if (manifest_read(dir, &m) == 0 && !manifest_current(&m, why, sizeof why))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s already holds a package that %s: build a package "
                    "in an empty directory",
                    dir, why);
  if (!m.ok)
    memset(&m, 0, sizeof m);
  fj_buf b = {0};
  if (manifest_text(&m, arch, &b) != 0) {
    fj__buf_free(&b);
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  }
  int rc = write_file(dir, b.data, b.len);
  int err = errno;
  fj__buf_free(&b);
  if (rc != 0)
    return fj__fail(ctx, FJ_ERR_IO, "cannot write %s/%s: %s", dir,
                    FJ_PACKAGE_MANIFEST, strerror(err));
  return FJ_OK;
}

/* ---- opening -------------------------------------------------------------------- */

fj_status fj__package_open(fj_ctx *ctx)
{
  const char *dir = ctx->opts.package_dir;
  const char *from = "package_dir";
  if (!dir) {
    dir = getenv("FLASHJIT_PACKAGE_DIR");
    from = "FLASHJIT_PACKAGE_DIR";
  }
  if (!dir || !*dir)
    return FJ_OK;
  if (strlen(dir) >= DIR_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s is %zu bytes long: at most %d", from, strlen(dir),
                    DIR_MAX - 1);
  char why[256], shown[160];
  if (!fj__package_usable(dir, ctx->arch, why, sizeof why)) {
    fj__quote(dir, shown, sizeof shown);
    fj__log(ctx, FJ_LOG_WARN, "kernel package %s (%s) %s: not used", shown,
            from, why);
    return FJ_OK;
  }
  fj_package *p = calloc(1, sizeof *p);
  if (!p)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  snprintf(p->dir, sizeof p->dir, "%s", dir);
  ctx->package = p;
  return FJ_OK;
}

void fj__package_close(fj_package *p)
{
  free(p);
}

const char *fj_cache_package_dir(const fj_ctx *ctx)
{
  return ctx && ctx->package ? ctx->package->dir : NULL;
}

/* ---- lookups -------------------------------------------------------------------- */

int fj__package_load(fj_ctx *ctx, const char *kind, const fj_cache_key *key,
                     void **payload, size_t *len)
{
  const fj_package *p = ctx->package;
  /* A package holds what a cache pack may: compiler entries, nothing
   * else (a layout table is the device's, never shipped). */
  if (!p || (strcmp(kind, "kernel") != 0 && strcmp(kind, "render") != 0))
    return 0;
  char path[DIR_MAX + 64], why[128];
  fj__cache_entry_path(p->dir, key, path, sizeof path);
  if (fj__cache_entry_load(path, kind, key, payload, len, why, sizeof why))
    return 1;
  if (why[0])
    fj__log(ctx, FJ_LOG_WARN, "package entry %s %s: ignored", path, why);
  return 0;
}
