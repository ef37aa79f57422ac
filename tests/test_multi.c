/*
 * test_multi.c -- what several GPUs need, checked without one: the device
 * check of a call's pointers (devptr.c) against a stand-in for the
 * driver's query, and the tuning database written by several processes at
 * once (the GPUs' tuners).  test_gpu_multi.c runs the same on two GPUs.
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctx.h"
#include "devptr.h"
#include "tunedb.h"
#include "runner.h"

/* ---- the pointer check ------------------------------------------------------- */

/* The stand-in's memory: a few allocations, and how often it was asked. */
typedef struct fake_alloc {
  uint64_t start, bytes;
  fj_mem_kind kind;
  int ordinal;
} fake_alloc;

static const fake_alloc fake[] = {
    {0x100000, 0x10000, FJ_MEM_DEVICE, 0},   /* a packed QKV tensor */
    {0x200000, 0x1000, FJ_MEM_DEVICE, 0},    /* an output */
    {0x300000, 0x1000, FJ_MEM_DEVICE, 1},    /* device 1's */
    {0x400000, 0x1000, FJ_MEM_MANAGED, 1},
    {0x500000, 0x1000, FJ_MEM_HOST, -1},
};
static int queries;
static int query_fails;

static fj_status fake_query(const fj_ctx *ctx, const void *ptr, fj_mem_info *m)
{
  uint64_t a = (uint64_t)(uintptr_t)ptr;
  queries++;
  if (query_fails)
    return fj__fail(ctx, FJ_ERR_CUDA, "cuPointerGetAttributes failed (fake)");
  memset(m, 0, sizeof *m);
  m->kind = FJ_MEM_OTHER;  /* pageable host memory, or none */
  m->ordinal = -1;
  for (size_t i = 0; i < sizeof fake / sizeof fake[0]; i++)
    if (a - fake[i].start < fake[i].bytes) {
      m->kind = fake[i].kind;
      m->ordinal = fake[i].ordinal;
      m->start = fake[i].start;
      m->bytes = fake[i].bytes;
    }
  return FJ_OK;
}

#define AT(x) ((const void *)(uintptr_t)(x))

static fj_status check(fj_ctx *ctx, const fj_devptr *p, size_t n)
{
  queries = 0;
  return fj__devptr_check(ctx, "fj_attention_fwd", p, n, fake_query);
}

int test_devptr_check(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  ctx->dev.ordinal = 0;
  /* q, k and v inside one allocation: one lookup for the three. */
  fj_devptr ok[] = {{"q", -1, AT(0x100000)}, {"k", -1, AT(0x104000)},
                    {"v", -1, AT(0x108000)}, {"o", -1, AT(0x200000)},
                    {"lse", -1, NULL}};
  CHECK_OK(ctx, check(ctx, ok, 5));
  CHECK(queries == 2);
  /* Device 1's memory is named with both devices, whatever its place. */
  fj_devptr wrong[] = {{"q", -1, AT(0x100000)}, {"k", -1, AT(0x300010)},
                       {"v", -1, AT(0x108000)}, {"o", -1, AT(0x200000)}};
  CHECK_ST(ctx, check(ctx, wrong, 4), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_attention_fwd: k is memory of device 1; this context "
                 "runs on device 0");
  CHECK(queries == 2);  /* stops at the first */
  /* Managed memory, page-locked and pageable host memory pass. */
  fj_devptr other[] = {{"q", -1, AT(0x400000)}, {"k", -1, AT(0x500000)},
                       {"v", -1, AT(0x900000)}, {"o", -1, AT(0x200000)}};
  CHECK_OK(ctx, check(ctx, other, 4));
  CHECK(queries == 4);
  /* An element of an array argument is named with its index. */
  fj_devptr param[] = {{"o", -1, AT(0x200000)},
                       {"mods.params", 1, AT(0x300800)}};
  CHECK_ST(ctx, check(ctx, param, 2), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "mods.params[1] is memory of device 1; this context runs "
                 "on device 0");
  /* The other way round: a context on device 1. */
  ctx->dev.ordinal = 1;
  CHECK_ST(ctx, check(ctx, ok, 5), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "q is memory of device 0; this context runs on device 1");
  CHECK_OK(ctx, check(ctx, &wrong[1], 1));
  /* A failed lookup is the call's failure, not a pass. */
  query_fails = 1;
  CHECK_ST(ctx, check(ctx, ok, 5), FJ_ERR_CUDA);
  CHECK_MSG(ctx, "cuPointerGetAttributes failed");
  query_fails = 0;
  /* One device seen: nothing is looked up (the driver is not even
   * loaded here, so a lookup would crash). */
  ctx->devices = 1;
  fj_problem p;
  fj_problem_init(&p, 1, 2, 2, 64, 64, 64, FJ_F16, FJ_BHSD);
  CHECK_OK(ctx, fj__devptr_check_call(ctx, "fj_attention_fwd", &p, AT(0x300000),
                                      AT(0x300000), AT(0x300000),
                                      AT(0x300000), NULL, NULL));
  fj_ctx_destroy(ctx);
  return 0;
}

/* Every device pointer of a call is listed, named as messages name it. */
int test_devptr_list(void)
{
  static const float scales[4], sinks[4];
  static const int32_t ints[12];
  fj_problem p;
  fj_problem_init(&p, 2, 2, 2, 64, 64, 64, FJ_F16, FJ_THD);
  p.kv_dtype = FJ_E4M3;
  p.k_scale = scales;
  p.v_scale = scales + 2;
  p.cu_seqlens_q = ints;
  p.cu_seqlens_kv = ints + 1;
  p.seqused_kv = ints + 2;
  p.block_table = ints + 3;
  fj_block_mask bm;
  memset(&bm, 0, sizeof bm);
  bm.kv_num = ints + 4;
  bm.kv_indices = ints + 5;
  bm.full_num = ints + 6;
  bm.full_indices = ints + 7;
  bm.q_num = ints + 8;
  bm.q_indices = ints + 9;
  bm.full_q_num = ints + 10;
  bm.full_q_indices = ints + 11;
  fj_mod_param params[3];
  memset(params, 0, sizeof params);
  params[0].rank = 1;
  params[0].data = scales;
  params[1].rank = 0;  /* a scalar: no memory */
  params[2].rank = 2;
  params[2].data = sinks;
  fj_mods m;
  fj_mods_init(&m);
  m.params = params;
  m.num_params = 3;
  m.sinks = sinks;
  m.block_mask = &bm;
  p.mods = &m;
  fj_devptr out[FJ_DEVPTR_MAX];
  size_t n = fj__devptr_list(&p, AT(16), AT(32), AT(48), AT(64), AT(80),
                             AT(96), out);
  static const char *const names[] = {
      "q", "k", "v", "o", "lse", "workspace", "k_scale", "v_scale",
      "cu_seqlens_q", "cu_seqlens_kv", "seqused_kv", "block_table",
      "mods.sinks", "mods.block_mask.kv_num", "mods.block_mask.kv_indices",
      "mods.block_mask.full_num", "mods.block_mask.full_indices",
      "mods.block_mask.q_num", "mods.block_mask.q_indices",
      "mods.block_mask.full_q_num", "mods.block_mask.full_q_indices",
      "mods.params", "mods.params"};
  CHECK(n == sizeof names / sizeof names[0] && n <= FJ_DEVPTR_MAX);
  for (size_t i = 0; i < n; i++)
    CHECK(!strcmp(out[i].name, names[i]) && out[i].ptr);
  CHECK(out[21].index == 0 && out[22].index == 2 && out[0].index == -1);
  /* NULL arguments, and the scales of a problem without FP8 K/V, are not
   * listed. */
  p.kv_dtype = 0;
  p.mods = NULL;
  n = fj__devptr_list(&p, AT(16), AT(32), AT(48), AT(64), NULL, NULL, out);
  CHECK(n == 8 && !strcmp(out[4].name, "cu_seqlens_q"));
  return 0;
}

/* ---- the tuning database, written by several processes at once ----------------- */

enum { WRITERS = 4, EACH = 6 };

typedef struct tally {
  int n;
  int per_dim[WRITERS];
} tally;

static int count_entry(void *user, const fj_tune_entry *e)
{
  tally *t = user;
  t->n++;
  for (int i = 0; i < WRITERS; i++) {
    char dim[16];
    snprintf(dim, sizeof dim, "|d%d|", 64 + 32 * i);
    t->per_dim[i] += strstr(e->key, dim) != NULL;
  }
  return 0;
}

/* Writer i records EACH problem classes of head dim 64 + 32 i. */
static int write_entries(fj_ctx *ctx, int i)
{
  for (int j = 0; j < EACH; j++) {
    int d = 64 + 32 * i, seq = 64 << j;
    fj_problem p;
    fj_problem_init(&p, 1, 4, 4, seq, seq, d, FJ_F16, FJ_BHSD);
    fj_variant v;
    fj_variant_default(&v, d, FJ_F16, FJ_CAUSAL_NONE);
    v.stages = 1 + j % 3;
    if (fj__tune_record(ctx, &p, &v, 1.0 + j, 2.0 + j) != FJ_OK)
      return 1;
  }
  return 0;
}

static int temporaries(const char *dir)
{
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d)) != NULL;)
    n += strncmp(e->d_name, "tune.json.tmp", 13) == 0;
  if (d)
    closedir(d);
  return n;
}

/* WRITERS processes (the tuners of as many GPUs) record their entries
 * into one database at once, released together; none is lost, the file
 * stays whole, no temporary is left.  A context that read the database
 * before they wrote then records one more without dropping theirs. */
int test_tunedb_processes(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *early = fjt_ctx("sm_90a", dir);
  CHECK(early);
  tally t;
  memset(&t, 0, sizeof t);
  CHECK_ST(early, fj_tune_list(early, count_entry, &t), FJ_ERR_NOT_FOUND);
  CHECK(write_entries(early, 0) == 0);  /* reads the file into memory */
  int go[2];
  CHECK(pipe(go) == 0);
  pid_t pids[WRITERS];
  for (int i = 0; i < WRITERS; i++) {
    pids[i] = fork();
    CHECK(pids[i] >= 0);
    if (pids[i] == 0) {
      close(go[1]);
      char c;
      (void)!read(go[0], &c, 1);  /* until the parent closes its end */
      fj_ctx *ctx = fjt_ctx("sm_90a", dir);
      int bad = !ctx || write_entries(ctx, i);
      fj_ctx_destroy(ctx);
      _exit(bad);
    }
  }
  close(go[0]);
  close(go[1]);
  for (int i = 0; i < WRITERS; i++) {
    int ws;
    CHECK(waitpid(pids[i], &ws, 0) == pids[i]);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  }
  CHECK_OK(early, fj_tune_list(early, count_entry, &t));
  printf("%d processes x %d entries: %d listed\n", WRITERS, EACH, t.n);
  CHECK(t.n == WRITERS * EACH);
  for (int i = 0; i < WRITERS; i++)
    CHECK(t.per_dim[i] == EACH);
  CHECK(temporaries(dir) == 0);
  /* The early context's memory lacks the others' entries; its next record
   * merges into the file and keeps them. */
  fj_problem p;
  fj_problem_init(&p, 1, 4, 4, 7, 7, 256, FJ_F16, FJ_BHSD);
  fj_variant v;
  fj_variant_default(&v, 256, FJ_F16, FJ_CAUSAL_NONE);
  CHECK_OK(early, fj__tune_record(early, &p, &v, 1.0, 1.0));
  memset(&t, 0, sizeof t);
  CHECK_OK(early, fj_tune_list(early, count_entry, &t));
  CHECK(t.n == WRITERS * EACH + 1);
  fj_ctx_destroy(early);
  return 0;
}
