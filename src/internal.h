/*
 * internal.h -- what the modules of src/ share with each other.  Nothing here
 * is API: include/flashjit.h is the only door.  Non-static functions are
 * named fj__name; each section says which module owns them.
 */
#ifndef FJ_INTERNAL_H
#define FJ_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "flashjit.h"

/* Bumped whenever the cache file format, the kernel ABI or the meaning of a
 * rendered template changes, so that older disk entries become misses. */
#define FJ_FORMAT_VERSION 1

#define FJ_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- util.c: growable byte buffers, files, clocks ---------------------- */

typedef struct fj_buf {
  char *data;  /* always NUL-terminated when non-NULL */
  size_t len;
  size_t cap;
} fj_buf;

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

/* ---- ctx.c: the context, messages, logging ----------------------------- */

typedef struct fj_cache fj_cache;
typedef struct fj_tpl fj_tpl;
typedef struct fj_kmap fj_kmap;

/* The dispatch caches of fj_attention_fwd (attention.c): a launch that
 * finds its kernel here skips parameters, rendering keys and the map. */
enum { FJ_HOT = 16 };
typedef struct fj_hot {
  fj_variant v;
  struct fj_kernel *kernel;
  void *function;
} fj_hot;
typedef struct fj_pick {
  int key[8];  /* head dim, dtypes, mask, sequence buckets, GQA ratio,
                  fewer 128-row blocks than multiprocessors */
  fj_variant v;
  fj_choice from;
} fj_pick;

struct fj_ctx {
  uint64_t serial;  /* identifies the context in thread-local messages */
  pthread_mutex_t lock;
  fj_ctx_opts opts;
  char arch[16];    /* "sm_90a" */
  int sm;           /* 90 */
  int arch_specific; /* 1 for the "a" targets */
  int has_device;
  fj_device_info dev;
  void *cu_ctx;     /* CUcontext: the device's primary context */
  fj_tpl *tpl;      /* Lua state, created on first render */
  fj_cache *cache;
  fj_kmap *kernels; /* variant -> kernel */
  fj_lut luts[FJ_FRAG_COUNT + 1];
  int lut_ready[FJ_FRAG_COUNT + 1];
  void *tunedb;     /* the tuning database's entries (json_t), read once */
  fj_hot hot[FJ_HOT];   /* variant -> loaded kernel, most recent first */
  int nhot;
  fj_pick picks[FJ_HOT]; /* problem class -> chosen variant */
  int npicks;
  long renders;     /* templates rendered (the render index saves some) */
  char templates_hash[33]; /* the built-in templates, "" until needed */
};

/* Records a failure on the calling thread and returns status. */
fj_status fj__fail(const fj_ctx *ctx, fj_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Appends a further line to the calling thread's current message. */
void fj__fail_more(const fj_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Clears the calling thread's message for ctx (called on entry). */
void fj__clear_error(const fj_ctx *ctx);
void fj__log(const fj_ctx *ctx, fj_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Parses "sm_XY" / "sm_XYa"; 0 on success. */
int fj__parse_arch(const char *arch, int *sm, int *specific);
/* Largest dynamic shared memory per block on the context's target. */
int fj__smem_limit(const fj_ctx *ctx);

/* ---- driver.c: libcuda through dlopen ---------------------------------- */

typedef struct fj_launch {
  void *function;        /* CUfunction */
  unsigned grid[3];
  unsigned block[3];
  unsigned smem_bytes;
  void *stream;
  void **args;
} fj_launch;

/* Loads libcuda.so.1 and the entry points (once per process). */
fj_status fj__cu_init(const fj_ctx *ctx);
/* Retains the primary context of ctx->opts.device and fills ctx->dev. */
fj_status fj__cu_open_device(fj_ctx *ctx);
void fj__cu_close_device(fj_ctx *ctx);
/* Make the primary context current on this thread / restore the old one. */
fj_status fj__cu_enter(const fj_ctx *ctx);
void fj__cu_leave(const fj_ctx *ctx);
fj_status fj__cu_module_load(const fj_ctx *ctx, const void *cubin,
                             void **module);
/* Looks up a kernel and raises its dynamic shared memory limit if needed. */
fj_status fj__cu_function(const fj_ctx *ctx, void *module, const char *symbol,
                          unsigned smem_bytes, void **function);
void fj__cu_module_unload(void *module);
fj_status fj__cu_launch(const fj_ctx *ctx, const fj_launch *l);
fj_status fj__cu_alloc(const fj_ctx *ctx, size_t bytes, uint64_t *dptr);
void fj__cu_free(uint64_t dptr);
fj_status fj__cu_copy_to_host(const fj_ctx *ctx, void *dst, uint64_t src,
                              size_t bytes);
fj_status fj__cu_copy_to_device(const fj_ctx *ctx, uint64_t dst,
                                const void *src, size_t bytes);
fj_status fj__cu_sync(const fj_ctx *ctx);
fj_status fj__cu_memset(const fj_ctx *ctx, uint64_t dst, unsigned char byte,
                        size_t bytes);
fj_status fj__cu_event_create(const fj_ctx *ctx, void **event);
void fj__cu_event_destroy(void *event);
fj_status fj__cu_event_record(const fj_ctx *ctx, void *event, void *stream);
/* Waits for `end`, then the milliseconds between the two events. */
fj_status fj__cu_event_ms(const fj_ctx *ctx, void *start, void *end, float *ms);

/* ---- template.c: the Lua renderer -------------------------------------- */

/* The files of templates/, built in (generated by src/embed.cmake). */
typedef struct fj_embedded {
  const char *name;
  const unsigned char *data;  /* NUL-terminated */
  size_t len;
} fj_embedded;
extern const fj_embedded fj__embedded[];
extern const size_t fj__embedded_count;

typedef enum fj_param_type {
  FJ_PARAM_INT,
  FJ_PARAM_STR,
  FJ_PARAM_BOOL,
  FJ_PARAM_LUT
} fj_param_type;

typedef struct fj_param {
  const char *key;
  fj_param_type type;
  long long i;
  const char *s;
  const fj_lut *lut;
} fj_param;

/* What a template says about the kernel it rendered (its `meta` table). */
typedef struct fj_kmeta {
  char symbol[128];
  int threads;
  int smem_bytes;
  int rows_per_block;  /* query rows one block covers */
} fj_kmeta;

/* Renders templates/<name> with params into *out.  FJ_ERR_TEMPLATE with the
 * template name, line and a traceback; FJ_ERR_UNSUPPORTED when the template
 * refuses the parameters (refuse("...")). */
fj_status fj__render(fj_ctx *ctx, const char *name, const fj_param *params,
                     size_t nparams, fj_buf *out, fj_kmeta *meta);
void fj__tpl_close(fj_tpl *tpl);
/* The text of a template file (the override directory first). */
const char *fj__template_text(const char *name, size_t *len);

/* ---- compile.c: NVRTC --------------------------------------------------- */

typedef struct fj_compiled {
  char *log;
  char *ptx;
  size_t ptx_len;
  void *cubin;
  size_t cubin_len;
  double ms;
} fj_compiled;

typedef struct fj_nvrtc_opts {
  char arch[48];
  const char *argv[12];
  int argc;
} fj_nvrtc_opts;

/* The options passed to NVRTC for arch. */
void fj__nvrtc_options(const char *arch, fj_nvrtc_opts *o);
/* "13.0" ("unknown" if NVRTC cannot say). */
const char *fj__nvrtc_version(void);
/* One compile of a batch (fj__compile_many): inputs, then the result;
 * message is malloc'd on failure. */
typedef struct fj_compile_job {
  const char *name;
  const char *src;
  const char *arch;
  fj_status status;
  char *message;
  fj_compiled out;
} fj_compile_job;

/* Compiles n sources, each in a child process, up to `workers` at once;
 * progress (optional) is called from this thread as jobs finish. */
void fj__compile_many(fj_compile_job *jobs, size_t n, int workers,
                      fj_progress_fn progress, void *user);
/* Compiles src for arch; isolate runs NVRTC in a child process. */
fj_status fj__compile(const fj_ctx *ctx, const char *name, const char *src,
                      const char *arch, int isolate, fj_compiled *out);
void fj__compiled_free(fj_compiled *c);
/* Reads registers, barriers, shared memory, spills and stack frame from a
 * ptxas -v log. */
void fj__parse_resources(const char *log, fj_resources *res);

/* ---- cache.c: memory + disk --------------------------------------------- */

typedef struct fj_cache_key {
  char text[512];  /* everything the entry depends on */
  char hex[33];    /* XXH3-128 of text: the file name */
} fj_cache_key;

void fj__cache_key(fj_cache_key *key, const char *kind, const char *arch,
                   const char *source_hash, const char *extra);
fj_status fj__cache_open(fj_ctx *ctx);
void fj__cache_close(fj_cache *c);
/* 1 and the payload (malloc'd) on a valid hit; 0 on a miss, which also
 * covers corrupt, truncated and stale entries. */
int fj__cache_load(fj_ctx *ctx, const char *kind, const fj_cache_key *key,
                   void **payload, size_t *len);
/* Writes atomically (temp file + rename); failures are logged, counted and
 * otherwise ignored: the cache is an optimisation. */
void fj__cache_store(fj_ctx *ctx, const char *kind, const char *label,
                     const fj_cache_key *key, const void *payload, size_t len);
void fj__cache_count(fj_ctx *ctx, fj_cache_origin origin);

/* ---- kernel.c: variant -> kernel ---------------------------------------- */

struct fj_kernel {
  fj_variant variant;
  fj_kmeta meta;
  char *source;
  size_t source_len;
  fj_compiled out;
  fj_resources res;
  void *module;    /* CUmodule, loaded on first launch */
  void *function;  /* CUfunction */
};

void fj__kmap_free(fj_kmap *m);
/* The kernel's function (meta.symbol), loading its module on first use.
 * The caller has entered the CUDA context. */
fj_status fj__kernel_function(fj_ctx *ctx, fj_kernel *k, void **function);
/* Another function of the same module (the probe module has several). */
fj_status fj__kernel_symbol(fj_ctx *ctx, fj_kernel *k, const char *symbol,
                            void **function);
/* Compile-and-cache for any template, shared by attention kernels and the
 * layout probe: renders name with params, then memory/disk/NVRTC. */
fj_status fj__kernel_build(fj_ctx *ctx, const char *template_name,
                           const fj_param *params, size_t nparams,
                           fj_kernel **out);
void fj__kernel_free(fj_kernel *k);

/* One kernel of a batch: the template and parameters in, the kernel (or a
 * failed status, message on the thread) out.  A status other than FJ_OK on
 * entry skips the item. */
typedef struct fj_build {
  const char *template_name;
  const fj_param *params;
  size_t nparams;
  fj_kernel *kernel;
  fj_status status;
  char *message;  /* malloc'd copy of a failure's message */
} fj_build;

/* fj__kernel_build for many at once: renders under ctx->lock, compiles
 * what the caches lack in up to `workers` child processes without holding
 * the lock, then stores the results.  Called without the lock. */
fj_status fj__kernel_build_many(fj_ctx *ctx, fj_build *builds, size_t n,
                                int workers, fj_progress_fn progress,
                                void *user);
/* FJ_ERR_RESOURCES when the rendered kernel needs more shared memory than
 * the target allows per block. */
fj_status fj__check_smem(const fj_ctx *ctx, const fj_kmeta *meta);

/* ---- attention.c ------------------------------------------------------------- */

/* sizeof the kernel parameter block, checked by the template. */
size_t fj__kparams_size(void);
/* The heuristic's variant for a problem on the context's target. */
void fj__heuristic(const fj_ctx *ctx, const fj_problem *p, fj_variant *v);
/* The variant for a problem: the tuning database, else the heuristic. */
fj_status fj__choose(fj_ctx *ctx, const fj_problem *p, fj_variant *v,
                     fj_choice *from);

/* ---- tune.c --------------------------------------------------------------------- */

/* 1 and the tuned variant in *v when the database has the problem's class;
 * ctx->lock held. */
int fj__tune_lookup(fj_ctx *ctx, const fj_problem *p, fj_variant *v);
void fj__tunedb_free(void *db);
/* Forgets the chosen variants (the database changed); ctx->lock held. */
void fj__picks_clear(fj_ctx *ctx);
/* Records a tuning result for p's class (fj_tune's last step). */
fj_status fj__tune_record(fj_ctx *ctx, const fj_problem *p,
                          const fj_variant *v, double ms, double default_ms);

/* ---- variant.c ----------------------------------------------------------- */

/* Axis rules and what is implemented; the message names axis and limit. */
fj_status fj__variant_validate(const fj_ctx *ctx, const fj_variant *v);

/* The template parameters of a variant, with the storage they point to. */
typedef struct fj_vparams {
  const char *template_name;
  char symbol[128];
  fj_lut luts[4];  /* accumulator, A, B col_major (K), B row_major (V) */
  fj_param p[24];
  size_t n;
} fj_vparams;

/* Fills out for v; variants that read the layout tables (softmax regs,
 * swizzle xor) fetch them, which probes the device on first use.
 * ctx->lock held. */
fj_status fj__variant_params(fj_ctx *ctx, const fj_variant *v,
                             fj_vparams *out);
/* Validates and builds a variant's kernel; ctx->lock held. */
fj_status fj__variant_kernel(fj_ctx *ctx, const fj_variant *v, fj_kernel **k);
/* kv_dtype with 0 resolved to dtype. */
fj_dtype fj__kv_dtype(const fj_variant *v);
int fj__dtype_bytes(fj_dtype d);

/* ---- layout.c ------------------------------------------------------------ */

/* fj_layout_get with ctx->lock held. */
fj_status fj__layout_locked(fj_ctx *ctx, fj_frag frag, fj_lut *lut);
/* Checks that a table covers the tile; message in buf on failure. */
int fj__lut_validate(const fj_lut *lut, char *buf, size_t size);
/* The reference table of a fragment kind (what the H200 showed). */
void fj__lut_reference(fj_frag frag, fj_lut *lut);

/* ---- reference.c --------------------------------------------------------- */

float fj__half_to_float(uint16_t h);
uint16_t fj__float_to_half(float f);
float fj__bf16_to_float(uint16_t h);
uint16_t fj__float_to_bf16(float f);
float fj__e4m3_to_float(uint8_t v);
uint8_t fj__float_to_e4m3(float f);

#endif /* FJ_INTERNAL_H */
