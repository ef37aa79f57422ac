/*
 * fault_inject.c -- an LD_PRELOAD shim for the allocation-failure audit
 * (tests/oom.sh): the Nth call to malloc, calloc, realloc, strdup or
 * strndup (and, with FJ_FAULT_IO, fopen, open, openat, write) made from
 * the library's code fails as it would when memory or the disk ran out.
 * Not part of the library; never linked into it.
 *
 * Environment:
 *   FJ_FAULT_N       the call to fail, counting from 1 (0 or unset: none)
 *   FJ_FAULT_AFTER   set: every counted call from the Nth on fails
 *   FJ_FAULT_RANGES  a file of "START SIZE" hex offsets into the main
 *                    program (tests/fault_ranges.sh): only calls whose
 *                    return address lies in one count (unset: every call)
 *   FJ_FAULT_IO      set: fopen, open, openat and write count too
 *   FJ_FAULT_TRACE   a file that gets the failed call's stack (offsets
 *                    into the main program, for addr2line -f -i -e)
 *   FJ_FAULT_REPORT  a file that gets the number of counted calls and
 *                    whether one was failed, at exit
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <link.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct range {
  uintptr_t lo, hi;
} range;

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static FILE *(*real_fopen)(const char *, const char *);
static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static ssize_t (*real_write)(int, const void *, size_t);

static int ready, busy, io, after;
static unsigned long fail_at, count, failed;
static uintptr_t base;
static range *ranges;
static size_t nranges;

/* dlsym may allocate before real_calloc is known: a little static room. */
static char boot[4096];
static size_t boot_used;

static void *boot_alloc(size_t n)
{
  n = (n + 15) & ~(size_t)15;
  if (boot_used + n > sizeof boot)
    return NULL;
  void *p = boot + boot_used;
  boot_used += n;
  return p;
}

static int is_boot(const void *p)
{
  return (const char *)p >= boot && (const char *)p < boot + sizeof boot;
}

static int cmp_range(const void *a, const void *b)
{
  const range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The main program is the first object dl_iterate_phdr reports. */
static int main_base(struct dl_phdr_info *info, size_t size, void *data)
{
  (void)size;
  (void)data;
  base = (uintptr_t)info->dlpi_addr;
  return 1;
}

static void load_ranges(const char *path)
{
  FILE *f = real_fopen(path, "r");
  if (!f) {
    fprintf(stderr, "fault_inject: cannot open %s\n", path);
    _exit(99);
  }
  size_t cap = 0;
  unsigned long lo, size;
  while (fscanf(f, "%lx %lx", &lo, &size) == 2) {
    if (nranges == cap) {
      cap = cap ? 2 * cap : 1024;
      ranges = real_realloc(ranges, cap * sizeof *ranges);
    }
    ranges[nranges].lo = lo;
    ranges[nranges].hi = lo + size;
    nranges++;
  }
  fclose(f);
  qsort(ranges, nranges, sizeof *ranges, cmp_range);
  dl_iterate_phdr(main_base, NULL);
}

static void report(void)
{
  const char *path = getenv("FJ_FAULT_REPORT");
  if (!path)
    return;
  busy = 1;
  FILE *f = real_fopen(path, "w");
  if (f) {
    fprintf(f, "%lu %lu\n", count, failed);
    fclose(f);
  }
}

static void init(void)
{
  busy = 1;
  real_calloc = dlsym(RTLD_NEXT, "calloc");
  real_malloc = dlsym(RTLD_NEXT, "malloc");
  real_realloc = dlsym(RTLD_NEXT, "realloc");
  real_fopen = dlsym(RTLD_NEXT, "fopen");
  real_open = dlsym(RTLD_NEXT, "open");
  real_openat = dlsym(RTLD_NEXT, "openat");
  real_write = dlsym(RTLD_NEXT, "write");
  const char *n = getenv("FJ_FAULT_N");
  fail_at = n ? strtoul(n, NULL, 10) : 0;
  after = getenv("FJ_FAULT_AFTER") != NULL;
  io = getenv("FJ_FAULT_IO") != NULL;
  const char *r = getenv("FJ_FAULT_RANGES");
  if (r)
    load_ranges(r);
  else
    dl_iterate_phdr(main_base, NULL);
  atexit(report);
  ready = 1;
  busy = 0;
}

static int from_library(uintptr_t ret)
{
  if (!ranges)
    return 1;
  uintptr_t off = ret - base;
  size_t lo = 0, hi = nranges;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ranges[mid].hi <= off)
      lo = mid + 1;
    else if (ranges[mid].lo > off)
      hi = mid;
    else
      return 1;
  }
  return 0;
}

/* With FJ_FAULT_TRACE, the failed call's stack, as offsets into the main
 * program (addr2line -f -e PROGRAM reads them), to that file. */
static void trace(void)
{
  const char *path = getenv("FJ_FAULT_TRACE");
  if (!path || failed > 1)
    return;
  busy = 1;
  void *pc[32];
  int n = backtrace(pc, 32);
  FILE *f = real_fopen(path, "w");
  if (f) {
    for (int i = 1; i < n; i++)
      fprintf(f, "0x%lx\n", (unsigned long)((uintptr_t)pc[i] - base - 1));
    fclose(f);
  }
  busy = 0;
}

/* Whether this call fails. */
static int should_fail(void *ret)
{
  if (!ready) {
    if (busy)
      return 0;
    init();
  }
  if (busy || !from_library((uintptr_t)ret))
    return 0;
  count++;
  if (fail_at && (count == fail_at || (after && count > fail_at))) {
    failed++;
    trace();
    return 1;
  }
  return 0;
}

void *malloc(size_t n)
{
  if (!real_malloc && busy)
    return boot_alloc(n);
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  return real_malloc(n);
}

void *calloc(size_t n, size_t m)
{
  if (!real_calloc) {
    if (busy) {
      void *p = boot_alloc(n * m);
      if (p)
        memset(p, 0, n * m);
      return p;
    }
    init();
  }
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  return real_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
  if (!real_realloc && busy)
    return boot_alloc(n);
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  return real_realloc(p, n);
}

void free(void *p)
{
  static void (*real_free)(void *);
  if (!p || is_boot(p))
    return;
  if (!real_free)
    real_free = dlsym(RTLD_NEXT, "free");
  real_free(p);
}

char *strdup(const char *s)
{
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  size_t n = strlen(s) + 1;
  char *p = real_malloc(n);
  return p ? memcpy(p, s, n) : NULL;
}

char *strndup(const char *s, size_t m)
{
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  size_t n = strnlen(s, m);
  char *p = real_malloc(n + 1);
  if (!p)
    return NULL;
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

/* Whether the I/O call made from `caller` fails (errno set to err). */
static int io_fails(void *caller, int err)
{
  if (!ready && !busy)
    init();
  if (!io || !should_fail(caller))
    return 0;
  errno = err;
  return 1;
}

FILE *fopen(const char *path, const char *mode)
{
  if (io_fails(__builtin_return_address(0), EMFILE))
    return NULL;
  return real_fopen(path, mode);
}

int open(const char *path, int flags, ...)
{
  va_list ap;
  va_start(ap, flags);
  int mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, int) : 0;
  va_end(ap);
  if (io_fails(__builtin_return_address(0), EMFILE))
    return -1;
  return real_open(path, flags, mode);
}

int openat(int dir, const char *path, int flags, ...)
{
  va_list ap;
  va_start(ap, flags);
  int mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, int) : 0;
  va_end(ap);
  if (io_fails(__builtin_return_address(0), EMFILE))
    return -1;
  return real_openat(dir, path, flags, mode);
}

ssize_t write(int fd, const void *data, size_t n)
{
  if (io_fails(__builtin_return_address(0), ENOSPC))
    return -1;
  return real_write(fd, data, n);
}
