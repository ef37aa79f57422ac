/*
 * util.c -- small helpers every module needs: growable buffers, bounded
 * file reads that neither block nor follow links, directory creation, a
 * monotonic clock and hashing (xxHash from Debian's libxxhash-dev,
 * inlined).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util.h"

int fj__buf_reserve(fj_buf *b, size_t extra)
{
  size_t need = b->len + extra + 1;
  if (need <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need)
    cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p)
    return -1;
  b->data = p;
  b->cap = cap;
  return 0;
}

int fj__buf_append(fj_buf *b, const void *data, size_t len)
{
  if (fj__buf_reserve(b, len))
    return -1;
  if (len)
    memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
  return 0;
}

int fj__buf_vappendf(fj_buf *b, const char *fmt, va_list ap)
{
  va_list again;
  va_copy(again, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  if (n < 0 || fj__buf_reserve(b, (size_t)n)) {
    va_end(again);
    return -1;
  }
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, again);
  va_end(again);
  b->len += (size_t)n;
  return 0;
}

int fj__buf_appendf(fj_buf *b, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int rc = fj__buf_vappendf(b, fmt, ap);
  va_end(ap);
  return rc;
}

void fj__buf_free(fj_buf *b)
{
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

char *fj__buf_take(fj_buf *b)
{
  if (!b->data && fj__buf_reserve(b, 0))
    return NULL;
  char *p = b->data;
  b->data = NULL;
  b->len = b->cap = 0;
  return p;
}

char *fj__strdup(const char *s)
{
  return s ? fj__memdup(s, strlen(s) + 1) : NULL;
}

void *fj__memdup(const void *p, size_t n)
{
  void *q = malloc(n ? n : 1);
  if (q && n)
    memcpy(q, p, n);
  return q;
}

int fj__write_all(int fd, const void *data, size_t len)
{
  const char *p = data;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

int fj__write_replace(const char *tmp, const char *path, int mode,
                      const void *const *parts, const size_t *sizes,
                      size_t n)
{
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
  int bad = fd < 0;
  for (size_t i = 0; i < n && !bad; i++)
    bad = fj__write_all(fd, parts[i], sizes[i]) != 0;
  int err = errno;
  if (fd >= 0 && close(fd) != 0 && !bad) {
    bad = 1;
    err = errno;
  }
  if (!bad && rename(tmp, path) != 0) {
    bad = 1;
    err = errno;
  }
  if (bad) {
    if (fd >= 0)
      unlink(tmp);
    errno = err;
  }
  return bad ? -1 : 0;
}

static uint64_t process_tag;
static pthread_once_t process_tag_once = PTHREAD_ONCE_INIT;

static void process_tag_draw(void)
{
  uint64_t t = 0;
  if (getrandom(&t, sizeof t, GRND_NONBLOCK) != (ssize_t)sizeof t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    t = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
        ((uint64_t)getpid() << 12);
  }
  process_tag = t;
}

void fj__temp_id(char id[FJ_TEMP_ID_MAX])
{
  static uint64_t count;
  pthread_once(&process_tag_once, process_tag_draw);
  snprintf(id, FJ_TEMP_ID_MAX, "%ld-%016llx-%llu", (long)getpid(),
           (unsigned long long)process_tag,
           (unsigned long long)__atomic_add_fetch(&count, 1, __ATOMIC_RELAXED));
}

double fj__now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int fj__open_file(const char *path, uint64_t max, uint64_t *size)
{
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -1;
  struct stat st;
  int err = fstat(fd, &st) != 0 ? errno : 0;
  *size = err ? 0 : (uint64_t)st.st_size;
  if (!err && !S_ISREG(st.st_mode))
    err = EINVAL;
  else if (!err && *size > max)
    err = EFBIG;
  if (err) {
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

void fj__open_why(int err, uint64_t size, uint64_t max, char *buf, size_t n)
{
  if (err == ELOOP)
    snprintf(buf, n, "is a symbolic link");
  else if (err == EINVAL)
    snprintf(buf, n, "is not a regular file");
  else if (err == EFBIG)
    snprintf(buf, n, "is %llu bytes, over the limit of %llu",
             (unsigned long long)size, (unsigned long long)max);
  else
    snprintf(buf, n, "cannot be read (%s)", strerror(err));
}

int fj__read_all(int fd, void *data, size_t len)
{
  char *p = data;
  while (len > 0) {
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      if (r == 0)
        errno = EIO;
      return -1;
    }
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

char *fj__file_read(const char *path, uint64_t max, size_t *len)
{
  uint64_t size = 0;
  int fd = fj__open_file(path, max, &size);
  if (fd < 0) {
    if (errno == EFBIG && len)
      *len = (size_t)size;
    return NULL;
  }
  char *data = malloc((size_t)size + 1);
  int err = !data ? ENOMEM : fj__read_all(fd, data, (size_t)size) ? errno : 0;
  close(fd);
  if (err) {
    free(data);
    errno = err;
    return NULL;
  }
  data[size] = '\0';
  if (len)
    *len = (size_t)size;
  return data;
}

int fj__mkdirs(const char *path)
{
  char tmp[4096];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof tmp) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(tmp, path, n + 1);
  /* Create each prefix in turn; EEXIST is the normal case when several
   * processes race to create the same directory. */
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
      return -1;
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
    return -1;
  struct stat st;
  if (stat(tmp, &st) != 0)
    return -1;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return -1;
  }
  return 0;
}

void fj__hash_hex(const void *data, size_t len, char out[33])
{
  XXH128_hash_t h = XXH3_128bits(data, len);
  snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64,
           (unsigned long long)h.low64);
}

uint64_t fj__hash64(const void *data, size_t len)
{
  return XXH3_64bits(data, len);
}

uint64_t fj__hash64_seed(const void *data, size_t len, uint64_t seed)
{
  return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t fj__hash64_parts(const void *const *parts, const size_t *sizes,
                          size_t n)
{
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (size_t i = 0; i < n; i++)
    XXH3_64bits_update(&state, parts[i], sizes[i]);
  return XXH3_64bits_digest(&state);
}

int fj__log2_floor(int n)
{
  int b = 0;
  /* Halving n cannot overflow, whatever n is. */
  while (n > 1) {
    n /= 2;
    b++;
  }
  return b;
}

/* One byte of fj__quote's: its text in buf (at most 5 bytes). */
static void quote_byte(unsigned char c, char buf[8])
{
  if (c == '"' || c == '\\')
    snprintf(buf, 8, "\\%c", c);
  else if (c >= 7 && c <= 13)
    snprintf(buf, 8, "\\%c", "abtnvfr"[c - 7]);
  else if (c < 0x20 || c == 0x7f)
    snprintf(buf, 8, "\\x%02x", c);
  else
    snprintf(buf, 8, "%c", c);
}

void fj__quote(const char *s, char *out, size_t n)
{
  size_t len = 0;
  out[len++] = '"';
  for (; s && *s; s++) {
    char b[8];
    quote_byte((unsigned char)*s, b);
    size_t k = strlen(b);
    if (len + k + 5 > n) {  /* room for ..." and the NUL */
      memcpy(out + len, "...", 3);
      len += 3;
      break;
    }
    memcpy(out + len, b, k);
    len += k;
  }
  out[len++] = '"';
  out[len] = '\0';
}
