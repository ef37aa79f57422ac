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
/* A temporary file's name part, unique to this call: "<pid>-<tag>-<n>",
 * tag a random 64-bit number drawn once a process (getrandom; the clock
 * and the pid where that fails), n a process-wide count.  Two processes
 * of one pid (containers in their own pid namespaces sharing a cache
 * directory) do not pick the same name. */
#define FJ_TEMP_ID_MAX 64
void fj__temp_id(char id[FJ_TEMP_ID_MAX]);
/* Writes n parts to `path` through the temporary file `tmp`, created new
 * (O_EXCL: never an existing file, nor a planted link) with `mode`, and a
 * rename, so that a reader sees the whole file or none; 0, or -1 with
 * errno (the temporary removed where this call created it: never another
 * writer's of the same name). */
int fj__write_replace(const char *tmp, const char *path, int mode,
                      const void *const *parts, const size_t *sizes,
                      size_t n);
/* Opens a file for reading only if it is a regular file of at most max
 * bytes, without blocking (a FIFO) and without following a symbolic link
 * in its last component: files of the cache directory may be anything.
 * Returns the descriptor (close-on-exec) and the file's size in *size; -1
 * with errno ELOOP for a link, EINVAL for anything but a regular file,
 * EFBIG for one over max (*size then holds its size), or open's own. */
int fj__open_file(const char *path, uint64_t max, uint64_t *size);
/* What fj__open_file's errno means for a message about the file ("is a
 * symbolic link", "is 2147483648 bytes, over the limit of 268435456"). */
void fj__open_why(int err, uint64_t size, uint64_t max, char *buf,
                  size_t n);
/* read() exactly len bytes (EINTR retried); 0 on success, -1 with errno
 * (EIO when the file ends first). */
int fj__read_all(int fd, void *data, size_t len);
/* Reads a whole file as fj__open_file allows it, NUL-terminated; NULL with
 * errno set on failure (EFBIG: *len holds the file's size). */
char *fj__file_read(const char *path, uint64_t max, size_t *len);
/* mkdir -p; 0 on success, -1 with errno. */
int fj__mkdirs(const char *path);
/* 128-bit XXH3 of data, as 32 lowercase hex digits + NUL. */
void fj__hash_hex(const void *data, size_t len, char out[33]);
uint64_t fj__hash64(const void *data, size_t len);
/* The same with a seed: hashes of pieces chained without copying them
 * into one buffer. */
uint64_t fj__hash64_seed(const void *data, size_t len, uint64_t seed);
/* fj__hash64 of the n parts one after another, without joining them (so
 * without an allocation that could fail). */
uint64_t fj__hash64_parts(const void *const *parts, const size_t *sizes,
                          size_t n);
/* floor(log2(n)) for n >= 1 (0 for n < 1), for every int up to INT_MAX:
 * a loop that doubles an int would pass 2^30 into 2^31 and never end. */
int fj__log2_floor(int n);
/* s between double quotes, as C writes a string literal: a backslash, a
 * quote and every byte outside printable ASCII but UTF-8's as an escape
 * (\n, \x1b), so that a path with a newline or a terminal's escape
 * sequence prints as one visible line.  Cut with "..." to fit n bytes
 * (n at least 8). */
void fj__quote(const char *s, char *out, size_t n);

#endif /* FJ_UTIL_H */
