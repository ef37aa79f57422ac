/*
 * util.h -- the bottom layer: growable byte buffers, files, clocks and
 * hashing.  Knows nothing of contexts; every other module may use it.
 */
#ifndef FJ_UTIL_H
#define FJ_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define FJ_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

typedef struct fj_buf {
  char *data;  /* always NUL-terminated when non-NULL */
  size_t len;
  size_t cap;
} fj_buf;

/* Each returns 0 on success, -1 when memory ran out (the buffer is kept). */
int fj__buf_reserve(fj_buf *b, size_t extra);
int fj__buf_append(fj_buf *b, const void *data, size_t len);
int fj__buf_appendf(fj_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int fj__buf_vappendf(fj_buf *b, const char *fmt, va_list ap);
void fj__buf_free(fj_buf *b);
/* Hands the buffer's storage to the caller (never NULL on success). */
char *fj__buf_take(fj_buf *b);

char *fj__strdup(const char *s);
void *fj__memdup(const void *p, size_t n);
double fj__now_ms(void);
/* write() until done (EINTR retried); 0 on success, -1 with errno. */
int fj__write_all(int fd, const void *data, size_t len);
/* Reads a whole file; NULL with errno set on failure. */
char *fj__file_read(const char *path, size_t *len);
/* mkdir -p; 0 on success, -1 with errno. */
int fj__mkdirs(const char *path);
/* 128-bit XXH3 of data, as 32 lowercase hex digits + NUL. */
void fj__hash_hex(const void *data, size_t len, char out[33]);
uint64_t fj__hash64(const void *data, size_t len);

#endif /* FJ_UTIL_H */
