/*
 * entry.c -- the payloads of the disk cache's compiler entries, and the
 * checks that a payload from outside this process's renders (the render
 * index of a shared cache directory, a cache pack) is one the library
 * could have made: a template's metadata within its ranges, a source
 * that includes only the toolkit headers the templates include.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "entry.h"

/* ---- kernel payloads: log, PTX, cubin, compile time --------------------------- */

int fj__kernel_payload(const fj_compiled *c, fj_buf *out)
{
  const void *parts[] = {c->log, c->ptx, c->cubin};
  uint64_t sizes[] = {strlen(c->log), c->ptx_len, c->cubin_len};
  for (size_t i = 0; i < 3; i++)
    if (fj__buf_append(out, &sizes[i], sizeof sizes[i]) ||
        fj__buf_append(out, parts[i], (size_t)sizes[i]))
      return -1;
  return fj__buf_append(out, &c->ms, sizeof c->ms);
}

static int part_read(const char **p, const char *end, char **out,
                     size_t *len)
{
  uint64_t n;
  if ((size_t)(end - *p) < sizeof n)
    return -1;
  memcpy(&n, *p, sizeof n);
  *p += sizeof n;
  if (n > (uint64_t)(end - *p) || !(*out = malloc((size_t)n + 1)))
    return -1;
  memcpy(*out, *p, (size_t)n);
  (*out)[n] = '\0';
  *p += n;
  if (len)
    *len = (size_t)n;
  return 0;
}

int fj__kernel_payload_read(const void *payload, size_t len, fj_compiled *c)
{
  const char *p = payload, *end = p + len;
  char *cubin = NULL;
  memset(c, 0, sizeof *c);
  if (part_read(&p, end, &c->log, NULL) ||
      part_read(&p, end, &c->ptx, &c->ptx_len) ||
      part_read(&p, end, &cubin, &c->cubin_len) ||
      (size_t)(end - p) != sizeof c->ms) {
    free(cubin);
    fj__compiled_free(c);
    memset(c, 0, sizeof *c);
    return -1;
  }
  c->cubin = cubin;
  memcpy(&c->ms, p, sizeof c->ms);
  return 0;
}

const char *fj__kernel_payload_check(const void *payload, size_t len,
                                     fj_compiled *c)
{
  if (fj__kernel_payload_read(payload, len, c) != 0)
    return "its payload is not a kernel's (log, PTX, cubin)";
  if (c->cubin_len == 0 || c->ptx_len == 0) {
    fj__compiled_free(c);
    return "its PTX or cubin is empty";
  }
  return NULL;
}

/* ---- render payloads: metadata, source ------------------------------------------ */

int fj__render_payload(const fj_kmeta *meta, const char *src, size_t len,
                       fj_buf *out)
{
  return fj__buf_append(out, meta, sizeof *meta) ||
         fj__buf_append(out, src, len);
}

const char *fj__render_payload_read(const void *payload, size_t len,
                                    fj_kmeta *meta, const char **src,
                                    size_t *src_len, char *why, size_t n)
{
  if (len <= sizeof *meta) {
    snprintf(why, n, "its payload (%zu bytes) is shorter than a render's "
                     "metadata and source", len);
    return why;
  }
  memcpy(meta, payload, sizeof *meta);
  if (memchr(meta->symbol, '\0', sizeof meta->symbol) == NULL) {
    snprintf(why, n, "meta.symbol is not terminated");
    return why;
  }
  if (fj__kmeta_wrong(meta, why, n))
    return why;
  *src = (const char *)payload + sizeof *meta;
  *src_len = len - sizeof *meta;
  return fj__source_wrong(*src, *src_len, why, n);
}

/* ---- the source check ------------------------------------------------------------ */

/* The scanner's place in a source: the text, its end, the position, and
 * whether a token came before it on its line (a '#' after one is not a
 * directive). */
typedef struct scan {
  const char *p, *end;
  int token_on_line;
} scan;

static const char *const headers[] = {"<cuda_fp16.h>", "<cuda_bf16.h>",
                                      "<cuda_fp8.h>", "<mma.h>"};
static const char *const directives[] = {"define", "undef", "line", "pragma",
                                         "include"};
static const char *const banned_words[] = {"_Pragma", "__has_include",
                                           "__has_include_next", "__has_embed"};

static int is_ident(int c) { return isalnum(c) || c == '_'; }

/* Skips a comment at s->p (a block or a line comment), newlines counted as line
 * starts; 1 when there was one. */
static int skip_comment(scan *s)
{
  if (s->end - s->p < 2 || s->p[0] != '/' || (s->p[1] != '*' && s->p[1] != '/'))
    return 0;
  int block = s->p[1] == '*';
  s->p += 2;
  while (s->p < s->end) {
    if (block && s->end - s->p >= 2 && s->p[0] == '*' && s->p[1] == '/') {
      s->p += 2;
      return 1;
    }
    if (*s->p == '\n') {
      if (!block)
        return 1;
      s->token_on_line = 0;
    }
    s->p++;
  }
  return 1;
}

/* Skips a string or character literal at s->p (its quote). */
static void skip_literal(scan *s)
{
  char q = *s->p++;
  while (s->p < s->end && *s->p != q && *s->p != '\n')
    s->p += *s->p == '\\' && s->end - s->p > 1 ? 2 : 1;
  if (s->p < s->end && *s->p == q)
    s->p++;
}

/* The rest of the line at p (blanks and a '\r' at its end dropped) equals
 * want. */
static int line_is(const char *p, const char *end, const char *want)
{
  const char *e = memchr(p, '\n', (size_t)(end - p));
  e = e ? e : end;
  while (p < e && (*p == ' ' || *p == '\t'))
    p++;
  while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
    e--;
  return (size_t)(e - p) == strlen(want) && !memcmp(p, want, (size_t)(e - p));
}

/* The word at p (an identifier), shown in a message. */
static void shown(char *out, size_t n, const char *p, const char *end)
{
  size_t i = 0;
  while (p + i < end && i + 1 < n && i < 40 && p[i] != '\n')
    i++;
  snprintf(out, n, "%.*s", (int)i, p);
  for (char *c = out; *c; c++)
    *c = (unsigned char)*c < 0x20 || *c == 0x7f ? '?' : *c;
}

/* A directive whose '#' (or "%:") s->p has just passed: NULL when it is
 * one the templates write. */
static const char *directive_wrong(scan *s, char *why, size_t n)
{
  char word[48];
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || skip_comment(s)))
    if (*s->p == ' ' || *s->p == '\t')
      s->p++;
  const char *w = s->p;
  while (s->p < s->end && is_ident((unsigned char)*s->p))
    s->p++;
  size_t wl = (size_t)(s->p - w);
  for (size_t i = 0; i < FJ_ARRAY_LEN(directives); i++) {
    if (wl != strlen(directives[i]) || memcmp(w, directives[i], wl))
      continue;
    if (i == 3 && !line_is(s->p, s->end, "unroll") &&
        !(s->end - s->p > 8 && !memcmp(s->p, " unroll ", 8)))
      break;
    if (i < 4)
      return NULL;
    for (size_t h = 0; h < FJ_ARRAY_LEN(headers); h++)
      if (line_is(s->p, s->end, headers[h]))
        return NULL;
    shown(word, sizeof word, w, s->end);
    snprintf(why, n, "its source has '#%s', not one of the toolkit headers "
                     "the templates include", word);
    return why;
  }
  shown(word, sizeof word, w, s->end);
  snprintf(why, n, "its source has the directive '#%s', which no template "
                   "writes", word);
  return why;
}

/* What is wrong at s->p, where a token of the source starts: a directive
 * that is not the templates', a banned word; NULL, and s->p past it. */
static const char *token_wrong(scan *s, char *why, size_t n)
{
  int first = !s->token_on_line;
  s->token_on_line = 1;
  if (first && (*s->p == '#' ||
                (s->end - s->p > 1 && s->p[0] == '%' && s->p[1] == ':'))) {
    s->p += *s->p == '#' ? 1 : 2;
    return directive_wrong(s, why, n);
  }
  if (*s->p == '"' || *s->p == '\'') {
    skip_literal(s);
    return NULL;
  }
  if (!is_ident((unsigned char)*s->p)) {
    s->p++;
    return NULL;
  }
  const char *w = s->p;
  while (s->p < s->end && is_ident((unsigned char)*s->p))
    s->p++;
  for (size_t i = 0; i < FJ_ARRAY_LEN(banned_words); i++)
    if ((size_t)(s->p - w) == strlen(banned_words[i]) &&
        !memcmp(w, banned_words[i], (size_t)(s->p - w))) {
      snprintf(why, n, "its source uses %s, which no template writes",
               banned_words[i]);
      return why;
    }
  return NULL;
}

/* What translation phases 1 and 2 would change: a NUL, a trigraph, a line
 * continuation (each could hide a directive from the scan below). */
static const char *phase_wrong(const char *src, size_t len, char *why,
                               size_t n)
{
  for (size_t i = 0; i < len; i++) {
    const char *what = NULL;
    if (src[i] == '\0')
      what = "a NUL byte";
    else if (src[i] == '?' && i + 2 < len && src[i + 1] == '?' &&
             strchr("=/'()!<>-", src[i + 2]))
      what = "a trigraph";
    else if (src[i] == '\\' && (i + 1 < len) &&
             (src[i + 1] == '\n' ||
              (src[i + 1] == '\r' && i + 2 < len && src[i + 2] == '\n')))
      what = "a line continuation";
    if (what) {
      snprintf(why, n, "its source has %s at byte %zu, which no template "
                       "writes", what, i);
      return why;
    }
  }
  return NULL;
}

const char *fj__source_wrong(const char *src, size_t len, char *why,
                             size_t n)
{
  if (phase_wrong(src, len, why, n))
    return why;
  scan s = {src, src + len, 0};
  while (s.p < s.end) {
    if (*s.p == '\n') {
      s.token_on_line = 0;
      s.p++;
    } else if (isspace((unsigned char)*s.p)) {
      s.p++;
    } else if (!skip_comment(&s) && token_wrong(&s, why, n)) {
      return why;
    }
  }
  return NULL;
}
