/*
 * cli_problem.c -- the problem of `run` and `tune` from --shape and friends,
 * checked before any GPU is looked for; for `run`, its random inputs in
 * device memory and the check of a variant against the float64 reference.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_cuda_failed(const char *what, cudaError_t e)
{
  fprintf(stderr, "flashjit run: %s failed: %s (%s)\n", what,
          cudaGetErrorName(e), cudaGetErrorString(e));
  return EXIT_FAIL;
}

/* Elements spanned by a tensor with these strides (last index + 1). */
static size_t span(const int64_t s[3], int b, int h, int seq, int d)
{
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + (seq - 1) * s[2] + d);
}

/* A small xorshift generator: inputs (and the block table's order)
 * reproducible from --seed. */
static uint64_t next_u64(uint64_t *state)
{
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return x;
}

/* Uniform in [-1, 1). */
static float next_uniform(uint64_t *state)
{
  uint64_t x = next_u64(state);
  return (float)((double)(x >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

/* The state --seed starts from. */
static uint64_t seed_state(int seed)
{
  return UINT64_C(0x9e3779b97f4a7c15) ^ (uint64_t)seed;
}

static void *random_tensor(fj_dtype dtype, size_t n, float scale,
                           uint64_t *state)
{
  float *f = malloc(n * sizeof *f);
  void *out = malloc(n * 2 + 16);
  if (!f || !out) {
    free(f);
    free(out);
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    f[i] = next_uniform(state) * scale;
  fj_convert(dtype, out, FJ_F32, f, n);
  free(f);
  return out;
}

/* FP8 K/V: values spread over e4m3's range (x 64) with per-(batch, head)
 * scales of 1/64 that bring them back. */
static int run_fp8_scales(run_data *d)
{
  size_t n = (size_t)d->p.batch * (size_t)d->p.heads_kv;
  d->hks = malloc(n * sizeof(float));
  d->hvs = malloc(n * sizeof(float));
  if (!d->hks || !d->hvs)
    return EXIT_FAIL;
  for (size_t i = 0; i < n; i++)
    d->hks[i] = d->hvs[i] = 1.0f / 64;
  CUDA_TRY(cudaMalloc((void **)&d->dks, n * sizeof(float)));
  CUDA_TRY(cudaMalloc((void **)&d->dvs, n * sizeof(float)));
  CUDA_TRY(cudaMemcpy(d->dks, d->hks, n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dvs, d->hvs, n * sizeof(float), cudaMemcpyHostToDevice));
  d->p.k_scale = d->dks;
  d->p.v_scale = d->dvs;
  return 0;
}

/* ---- the index arrays of --varlen and --page-size ---------------------------------- */

int cli_len_q(const run_data *d, int b)
{
  const int32_t *cu = d->hix.cu_q;
  return cu ? cu[b + 1] - cu[b] : d->p.seq_q;
}

int cli_len_kv(const run_data *d, int b)
{
  if (d->hix.used_kv)
    return d->hix.used_kv[b];
  const int32_t *cu = d->hix.cu_kv;
  return cu ? cu[b + 1] - cu[b] : d->p.seq_kv;
}

/* Pages of n tokens that len keys take. */
static long long pages_for(long long len, int n)
{
  return (len + n - 1) / n;
}

/* d's problem with its host index arrays in place of the device's (for
 * fj_reference_fwd and fj_problem_check_lengths). */
static fj_problem host_problem(const run_data *d)
{
  fj_problem p = d->p;
  p.cu_seqlens_q = p.cu_seqlens_q ? d->hix.cu_q : NULL;
  p.cu_seqlens_kv = p.cu_seqlens_kv ? d->hix.cu_kv : NULL;
  p.seqused_kv = p.seqused_kv ? d->hix.used_kv : NULL;
  p.block_table = p.block_table ? d->hix.table : NULL;
  p.mods = p.mods ? &d->hmods : NULL;
  return p;
}

/* Frees the host index arrays (index_make's). */
static void index_free(seq_index *ix)
{
  free(ix->cu_q);
  free(ix->cu_kv);
  free(ix->used_kv);
  free(ix->table);
  memset(ix, 0, sizeof *ix);
}

/* cu_seqlens of one side of --varlen: 0, then the running sums. */
static int32_t *prefix_sums(const cli *c, int batch, int keys)
{
  int32_t *cu = malloc(((size_t)batch + 1) * sizeof *cu);
  for (int b = 0; cu && b <= batch; b++)
    cu[b] = b == 0 ? 0
                   : cu[b - 1] + (keys ? c->lens[b - 1].kv : c->lens[b - 1].q);
  return cu;
}

/* The block table: the pages 0..num_pages - 1 in an order shuffled from
 * seed, handed out to the sequences in turn, ceil(keys / page_size) each;
 * the entries past a sequence's pages are 0. */
static int32_t *block_table(const run_data *d, int seed)
{
  const fj_problem *p = &d->p;
  size_t n = (size_t)p->num_pages, next = 0;
  int32_t *perm = malloc(n * sizeof *perm);
  int32_t *t = malloc((size_t)p->batch * (size_t)p->max_pages * sizeof *t);
  uint64_t state = seed_state(seed) ^ UINT64_C(0x7061676573);  /* "pages" */
  for (size_t i = 0; perm && i < n; i++)
    perm[i] = (int32_t)i;
  for (size_t i = n; perm && i > 1; i--) {
    size_t j = (size_t)(next_u64(&state) % i);
    int32_t x = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = x;
  }
  for (int b = 0; perm && t && b < p->batch; b++) {
    long long used = pages_for(cli_len_kv(d, b), p->page_size);
    for (int j = 0; j < p->max_pages; j++)
      t[(size_t)b * (size_t)p->max_pages + (size_t)j] =
          j < used ? perm[next++] : 0;
  }
  free(perm);
  if (!perm) {
    free(t);
    return NULL;
  }
  return t;
}

/* The host index arrays of d's problem, where cli_problem set a
 * placeholder: prefix sums from --varlen, each sequence's keys
 * (--varlen's K, else seq_kv), the shuffled block table; then checked as
 * the library checks them.  0 or the exit status. */
static int index_make(const cli *c, run_data *d, int seed)
{
  const fj_problem *p = &d->p;
  seq_index *ix = &d->hix;
  int lost = 0;
  if (p->cu_seqlens_q)
    lost |= !(ix->cu_q = prefix_sums(c, p->batch, 0));
  if (p->cu_seqlens_kv)
    lost |= !(ix->cu_kv = prefix_sums(c, p->batch, 1));
  if (p->seqused_kv && (ix->used_kv = malloc((size_t)p->batch * sizeof(int32_t))))
    for (int b = 0; b < p->batch; b++)
      ix->used_kv[b] = c->lens ? c->lens[b].kv : p->seq_kv;
  lost |= p->seqused_kv && !ix->used_kv;
  if (p->block_table && !lost)
    lost |= !(ix->table = block_table(d, seed));
  if (lost) {
    fprintf(stderr, "flashjit %s: out of host memory\n", c->cmd_name);
    return EXIT_FAIL;
  }
  fj_problem hp = host_problem(d);
  fj_status st = fj_problem_check_lengths(&hp);
  return st == FJ_OK ? 0 : cli_fj_error(c, NULL, st);
}

/* Copies one host index array of n entries to the device (none: *dev
 * stays NULL). */
static int upload_index(const int32_t *host, size_t n, int32_t **dev)
{
  if (!host)
    return 0;
  CUDA_TRY(cudaMalloc((void **)dev, n * sizeof(int32_t)));
  CUDA_TRY(cudaMemcpy(*dev, host, n * sizeof(int32_t), cudaMemcpyHostToDevice));
  return 0;
}

/* The index arrays on the device, and the problem pointing at them. */
static int run_upload_index(run_data *d)
{
  fj_problem *p = &d->p;
  size_t b = (size_t)p->batch;
  if (upload_index(d->hix.cu_q, b + 1, &d->dix.cu_q) ||
      upload_index(d->hix.cu_kv, b + 1, &d->dix.cu_kv) ||
      upload_index(d->hix.used_kv, b, &d->dix.used_kv) ||
      upload_index(d->hix.table, b * (size_t)p->max_pages, &d->dix.table))
    return EXIT_FAIL;
  p->cu_seqlens_q = d->dix.cu_q;
  p->cu_seqlens_kv = d->dix.cu_kv;
  p->seqused_kv = d->dix.used_kv;
  p->block_table = d->dix.table;
  return 0;
}

/* ---- inputs ---------------------------------------------------------------------- */

/* Elements of Q (and O): with cu_seqlens_q the tokens of all sequences
 * packed, else batch x seq_q rows. */
static size_t q_elements(const run_data *d, const int64_t s[3])
{
  const fj_problem *p = &d->p;
  if (!d->hix.cu_q)
    return span(s, p->batch, p->heads_q, p->seq_q, p->head_dim);
  int tokens = d->hix.cu_q[p->batch];
  return span(s, 1, p->heads_q, tokens > 0 ? tokens : 1, p->head_dim);
}

/* Elements of K (and V): num_pages pages of page_size tokens when paged,
 * all sequences' keys packed with cu_seqlens_kv, else batch x seq_kv rows. */
static size_t kv_elements(const run_data *d)
{
  const fj_problem *p = &d->p;
  if (p->block_table)
    return span(p->k_stride, p->num_pages, p->heads_kv, p->page_size,
                p->head_dim);
  if (!d->hix.cu_kv)
    return span(p->k_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  int tokens = d->hix.cu_kv[p->batch];
  return span(p->k_stride, 1, p->heads_kv, tokens > 0 ? tokens : 1,
              p->head_dim);
}

int cli_run_alloc(run_data *d, int seed)
{
  const fj_problem *p = &d->p;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  float kv_scale = kv == FJ_E4M3 ? 64.f : 1.f;
  d->esize = 2;
  d->kvsize = kv == FJ_E4M3 ? 1 : 2;
  d->nq = q_elements(d, p->q_stride);
  d->nk = kv_elements(d);
  d->no = q_elements(d, p->o_stride);
  if (run_upload_index(d))
    return EXIT_FAIL;
  uint64_t state = seed_state(seed);
  d->hq = random_tensor(p->dtype, d->nq, 1.f, &state);
  d->hk = random_tensor(kv, d->nk, kv_scale, &state);
  d->hv = random_tensor(kv, d->nk, kv_scale, &state);
  if (kv == FJ_E4M3 && run_fp8_scales(d))
    return EXIT_FAIL;
  d->ho = malloc(d->no * d->esize);
  size_t nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  d->hlse = malloc(nlse * sizeof(float));
  if (!d->hq || !d->hk || !d->hv || !d->ho || !d->hlse) {
    fprintf(stderr, "flashjit run: out of host memory\n");
    return EXIT_FAIL;
  }
  CUDA_TRY(cudaMalloc(&d->dq, d->nq * d->esize));
  CUDA_TRY(cudaMalloc(&d->dk, d->nk * d->kvsize));
  CUDA_TRY(cudaMalloc(&d->dv, d->nk * d->kvsize));
  CUDA_TRY(cudaMalloc(&d->dout, d->no * d->esize));
  CUDA_TRY(cudaMalloc((void **)&d->dlse, nlse * sizeof(float)));
  CUDA_TRY(cudaMemcpy(d->dq, d->hq, d->nq * d->esize, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dk, d->hk, d->nk * d->kvsize, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dv, d->hv, d->nk * d->kvsize, cudaMemcpyHostToDevice));
  return 0;
}

/* ---- the tensors of --param ----------------------------------------------------------- */

/* A tensor parameter of n elements from state: floats uniform in [-1, 1),
 * i32 uniform in 0..extents[0] - 1 (indices into its first dimension:
 * document ids of a document mask, for one). */
static void *random_param(const fj_mod_param *p, size_t n, uint64_t *state)
{
  if (p->type == FJ_MOD_F16 || p->type == FJ_MOD_BF16)
    return random_tensor(p->type == FJ_MOD_F16 ? FJ_F16 : FJ_BF16, n, 1.f,
                         state);
  void *out = malloc(n * 4);
  int32_t *i32 = out;
  float *f32 = out;
  for (size_t i = 0; out && i < n; i++) {
    if (p->type == FJ_MOD_I32)
      i32[i] = (int32_t)(next_u64(state) % (uint64_t)p->extents[0]);
    else
      f32[i] = next_uniform(state);
  }
  return out;
}

/* A tensor parameter's file, exactly bytes long (as --param checked; the
 * file may have changed since).  NULL with errno set, 0 for a file whose
 * size changed. */
static void *read_param(const char *file, size_t bytes)
{
  FILE *f = fopen(file, "rb");
  void *out = f ? malloc(bytes) : NULL;
  int ok = out && fread(out, 1, bytes, f) == bytes && fgetc(f) == EOF;
  if (out && !ok && !ferror(f))
    errno = 0;
  if (f)
    fclose(f);
  if (!ok) {
    free(out);
    return NULL;
  }
  return out;
}

/* Parameter i's host data: its file, or random from seed in a stream of
 * its own (so that one parameter's values do not depend on the others'). */
static int param_host_data(const cli *c, run_data *d, int i, int seed)
{
  fj_mod_param *hp = &d->hparams[i];
  const char *file = c->param_args[i].file;
  size_t bytes = cli_param_bytes(hp);
  size_t esize = hp->type == FJ_MOD_F16 || hp->type == FJ_MOD_BF16 ? 2 : 4;
  uint64_t state = seed_state(seed) ^
                   UINT64_C(0x706172616d) * (uint64_t)(2 * i + 1);  /* "param" */
  errno = ENOMEM;
  if (bytes != SIZE_MAX)
    hp->data = file ? read_param(file, bytes)
                    : random_param(hp, bytes / esize, &state);
  if (hp->data)
    return 0;
  if (file && errno != ENOMEM)
    fprintf(stderr, "flashjit run: cannot read --param %s's FILE '%s' (%zu "
                    "bytes): %s\n",
            hp->name, file, bytes, errno ? strerror(errno) : "its size changed");
  else
    fprintf(stderr, "flashjit run: out of host memory for --param %s (%zu "
                    "bytes)\n",
            hp->name, bytes);
  return EXIT_FAIL;
}

/* --sinks: its value for each of the heads_q heads, on the host (the
 * reference's) and on the device (the kernels'). */
static int run_sinks(const cli *c, run_data *d)
{
  size_t n = (size_t)d->p.heads_q;
  d->hsinks = malloc(n * sizeof *d->hsinks);
  if (!d->hsinks) {
    fprintf(stderr, "flashjit run: out of host memory for --sinks\n");
    return EXIT_FAIL;
  }
  for (size_t i = 0; i < n; i++)
    d->hsinks[i] = c->sink;
  CUDA_TRY(cudaMalloc((void **)&d->dsinks, n * sizeof *d->dsinks));
  CUDA_TRY(cudaMemcpy(d->dsinks, d->hsinks, n * sizeof *d->dsinks,
                      cudaMemcpyHostToDevice));
  d->hmods.sinks = d->hsinks;
  d->dmods.sinks = d->dsinks;
  return 0;
}

int cli_run_mods(const cli *c, run_data *d, int seed)
{
  if (!d->p.mods)
    return 0;
  d->hmods = d->dmods = c->mods;
  memcpy(d->hparams, c->params, sizeof d->hparams);
  memcpy(d->dparams, c->params, sizeof d->dparams);
  d->hmods.params = d->hparams;
  d->dmods.params = d->dparams;
  d->p.mods = &d->dmods;
  if (c->mods.sinks && run_sinks(c, d))
    return EXIT_FAIL;
  for (int i = 0; i < c->mods.num_params; i++) {
    if (c->params[i].rank == 0)
      continue;
    if (param_host_data(c, d, i, seed))
      return EXIT_FAIL;
    size_t bytes = cli_param_bytes(&d->hparams[i]);
    void *dev = NULL;
    CUDA_TRY(cudaMalloc(&dev, bytes));
    d->dparams[i].data = dev;
    CUDA_TRY(cudaMemcpy(dev, d->hparams[i].data, bytes, cudaMemcpyHostToDevice));
  }
  return 0;
}

/* The check's blocks and their reference (see check_blocks). */
static void free_blocks(run_data *d)
{
  for (int i = 0; i < d->nblocks; i++) {
    free(d->blocks[i].ref);
    free(d->blocks[i].lse);
  }
  free(d->blocks);
  d->blocks = NULL;
  d->nblocks = d->sampled = 0;
}

/* --block-mask: the lists built on the GPU from the problem's mask
 * (fj_block_mask_build), and their download for the reference. */
int cli_run_block_mask(const cli *c, fj_ctx *ctx, run_data *d)
{
  if (!c->mods.block_mask)
    return 0;
  int bq = c->bmask.block_q, bkv = c->bmask.block_kv;
  size_t bytes;
  fj_problem p = d->p;
  d->dmods.block_mask = NULL;
  fj_status st = fj_block_mask_size(ctx, &p, bq, bkv, &bytes);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaMalloc(&d->dbm_buf, bytes));
  st = fj_block_mask_build(ctx, &p, bq, bkv, d->dbm_buf, bytes, &d->dbm, NULL);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  d->hbm_buf = malloc(bytes);
  if (!d->hbm_buf) {
    fprintf(stderr, "flashjit run: out of host memory for the block mask\n");
    return EXIT_FAIL;
  }
  CUDA_TRY(cudaMemcpy(d->hbm_buf, d->dbm_buf, bytes, cudaMemcpyDeviceToHost));
  const char *d0 = d->dbm_buf, *h0 = d->hbm_buf;
  d->hbm = d->dbm;
  d->hbm.kv_num = (const int32_t *)(h0 + ((const char *)d->dbm.kv_num - d0));
  d->hbm.kv_indices = (const int32_t *)(h0 + ((const char *)d->dbm.kv_indices - d0));
  d->hbm.full_num = (const int32_t *)(h0 + ((const char *)d->dbm.full_num - d0));
  d->hbm.full_indices = (const int32_t *)(h0 + ((const char *)d->dbm.full_indices - d0));
  size_t rows = (size_t)d->dbm.batch * (size_t)d->dbm.heads * (size_t)d->dbm.q_blocks;
  long kept = 0, full = 0;
  for (size_t r = 0; r < rows; r++) {
    kept += d->hbm.kv_num[r] + d->hbm.full_num[r];
    full += d->hbm.full_num[r];
  }
  printf("block mask: %dx%d blocks, %d x %d x %d x %d; %ld kept (%ld full) of %zu\n",
         bq, bkv, d->dbm.batch, d->dbm.heads, d->dbm.q_blocks, d->dbm.kv_blocks,
         kept, full, rows * (size_t)d->dbm.kv_blocks);
  d->dmods.block_mask = &d->dbm;
  d->hmods.block_mask = &d->hbm;
  return 0;
}

void cli_run_free(run_data *d)
{
  cudaFree(d->dbm_buf);
  free(d->hbm_buf);
  free(d->hq);
  free(d->hk);
  free(d->hv);
  free(d->ho);
  free(d->hlse);
  free(d->hks);
  free(d->hvs);
  cudaFree(d->dks);
  cudaFree(d->dvs);
  free_blocks(d);
  cudaFree(d->dq);
  cudaFree(d->dk);
  cudaFree(d->dv);
  cudaFree(d->dout);
  cudaFree(d->dlse);
  index_free(&d->hix);
  cudaFree(d->dix.cu_q);
  cudaFree(d->dix.cu_kv);
  cudaFree(d->dix.used_kv);
  cudaFree(d->dix.table);
  for (int i = 0; i < FJ_MOD_PARAMS_MAX; i++) {
    free((void *)d->hparams[i].data);
    cudaFree((void *)d->dparams[i].data);
  }
  free(d->hsinks);
  cudaFree(d->dsinks);
}

/* One launch: variant v, or the library's choice when v is NULL. */
fj_status cli_launch_one(fj_ctx *ctx, run_data *d, const fj_variant *v,
                         float *lse)
{
  if (v)
    return fj_attention_fwd_variant(ctx, &d->p, v, d->dq, d->dk, d->dv,
                                    d->dout, lse, NULL);
  return fj_attention_fwd(ctx, &d->p, d->dq, d->dk, d->dv, d->dout, lse, NULL);
}

/* The (query, key) pairs of one sequence inside --window (and the causal
 * mask): the kernels skip the tiles outside, so only these count.  The
 * window sits on the causal diagonal, bottom-right unless top-left. */
static double window_pairs(const fj_problem *p, int len_q, int len_kv)
{
  const fj_mods *m = p->mods;
  long long off = p->causal == FJ_CAUSAL_TOP_LEFT ? 0 : (long long)len_kv - len_q;
  double pairs = 0;
  for (long long r = 0; r < len_q; r++) {
    long long diag = r + off;
    long long lo = m->window_left >= 0 ? diag - m->window_left : 0;
    long long hi = p->causal != FJ_CAUSAL_NONE ? diag
                   : m->window_right >= 0      ? diag + m->window_right
                                               : len_kv - 1;
    lo = lo > 0 ? lo : 0;
    hi = hi < len_kv - 1 ? hi : len_kv - 1;
    pairs += hi >= lo ? (double)(hi - lo + 1) : 0;
  }
  return pairs;
}

/* Two matrix products over each sequence's own queries and keys: half of
 * them under a causal mask (near enough), those inside a window exactly;
 * a mask expression hides pairs the kernels still compute, so all count. */
static double problem_flops(const run_data *d)
{
  const fj_problem *p = &d->p;
  int window = p->mods && (p->mods->window_left != -1 ||
                           p->mods->window_right != -1);
  double pairs = 0;
  for (int b = 0; b < p->batch; b++)
    pairs += window ? window_pairs(p, cli_len_q(d, b), cli_len_kv(d, b))
                    : (double)cli_len_q(d, b) * cli_len_kv(d, b);
  double f = 4.0 * p->heads_q * pairs * p->head_dim;
  return p->causal != FJ_CAUSAL_NONE && !window ? f / 2 : f;
}

double cli_tflops(const run_data *d, double ms)
{
  return problem_flops(d) / (ms * 1e-3) / 1e12;
}

/* Appends a block of the check: rows r0..r1 - 1 of sequences b0..b1 - 1
 * (blocks holds room for them all: see check_blocks). */
static void add_block(run_data *d, int b0, int b1, int r0, int r1)
{
  check_block *k = &d->blocks[d->nblocks++];
  memset(k, 0, sizeof *k);
  k->b0 = b0;
  k->b1 = b1;
  k->r0 = r0;
  k->r1 = r1;
}

/* Adds one sequence range's blocks: all of its len rows when three blocks
 * of `rows` would cover them, else the start, middle and end. */
static void add_sampled(run_data *d, int b0, int b1, int len, int rows)
{
  if ((long long)rows * 3 >= len) {
    add_block(d, b0, b1, 0, len);
    return;
  }
  d->sampled = 1;
  int starts[3] = {0, len / 2 - rows / 2, len - rows};
  for (int i = 0; i < 3; i++)
    add_block(d, b0, b1, starts[i], starts[i] + rows);
}

/* The rows the check covers: all of them when the float64 reference is
 * cheap, else three blocks of each sequence (start, middle, end), about
 * 2e9 multiply-adds in all.  Fixed lengths: the same rows of every
 * sequence at once; --varlen: each sequence on its own, so that its own
 * end is checked and no row past it is computed.  0 or EXIT_FAIL. */
static int check_blocks(run_data *d)
{
  const fj_problem *p = &d->p;
  double keys = 0, pairs = 0;
  for (int b = 0; b < p->batch; b++) {
    keys += cli_len_kv(d, b);
    pairs += (double)cli_len_q(d, b) * cli_len_kv(d, b);
  }
  double per_pair = 2.0 * p->heads_q * p->head_dim;
  double fit = keys > 0 ? 2e9 / (per_pair * keys) / 3 : (double)p->seq_q;
  int rows = (int)fmax(1, fmin((double)p->seq_q, fit));
  int sampled = pairs * per_pair > 2e9, varlen = d->hix.cu_q != NULL;
  d->blocks = calloc(varlen ? 3 * (size_t)p->batch : 3, sizeof *d->blocks);
  if (!d->blocks)
    return EXIT_FAIL;
  if (!varlen)
    add_sampled(d, 0, p->batch, p->seq_q, sampled ? rows : p->seq_q);
  for (int b = 0; varlen && b < p->batch; b++)
    if (cli_len_q(d, b) > 0)
      add_sampled(d, b, b + 1, cli_len_q(d, b),
                  sampled ? rows : cli_len_q(d, b));
  return 0;
}

typedef struct err_sum {
  double diff2, ref2, max_abs, lse_diff2, lse_ref2;
  size_t nonfinite, checked;
} err_sum;

/* Compares one O row (converted to float) and its log-sum-exp l with the
 * reference's. */
static void compare_row(const float *row, const double *want, int dim,
                        double l, double want_lse, err_sum *e)
{
  for (int x = 0; x < dim; x++) {
    double o = row[x];
    if (!isfinite(o))
      e->nonfinite++;
    e->diff2 += (o - want[x]) * (o - want[x]);
    e->ref2 += want[x] * want[x];
    e->max_abs = fmax(e->max_abs, fabs(o - want[x]));
  }
  if (isfinite(want_lse)) {
    e->lse_diff2 += (l - want_lse) * (l - want_lse);
    e->lse_ref2 += want_lse * want_lse;
  } else if (isfinite(l)) {
    e->nonfinite++;
  }
  e->checked++;
}

/* Compares a block's rows, of every sequence and head that has them (a
 * row past its sequence's end has no output), with their reference; a
 * sequence's row r is O's row cu_seqlens_q[b] + r when packed, and its
 * log-sum-exp entry r of [batch][heads_q][seq_q]. */
static void compare_block(const run_data *d, const check_block *k, err_sum *e)
{
  const fj_problem *p = &d->p;
  int rows = k->r1 - k->r0, dim = p->head_dim;
  float *row = malloc(sizeof *row * (size_t)dim);
  for (int b = k->b0; b < k->b1 && row; b++)
    for (int h = 0; h < p->heads_q; h++)
      for (int r = k->r0; r < k->r1 && r < cli_len_q(d, b); r++) {
        int64_t first = d->hix.cu_q ? d->hix.cu_q[b] : 0;
        size_t base = (size_t)(b * p->o_stride[0] + h * p->o_stride[1] +
                               (first + r) * p->o_stride[2]);
        fj_convert(FJ_F32, row, p->dtype, (const char *)d->ho + base * 2,
                   (size_t)dim);
        size_t ri = (size_t)((b - k->b0) * p->heads_q + h) * (size_t)rows +
                    (size_t)(r - k->r0);
        size_t li = (size_t)(b * p->heads_q + h) * (size_t)p->seq_q + (size_t)r;
        compare_row(row, k->ref + ri * (size_t)dim, dim, d->hlse[li],
                    k->lse[ri], e);
      }
  free(row);
}

/* The problem of sequences b0..b1 - 1 alone, with the host index arrays:
 * only for b0 0 or a varlen problem (whose Q and O are packed tokens and
 * K and V packed or paged, so that only the index arrays move). */
static fj_problem sub_problem(const run_data *d, int b0, int b1)
{
  fj_problem p = host_problem(d);
  size_t hkv = (size_t)b0 * (size_t)p.heads_kv;
  p.batch = b1 - b0;
  p.cu_seqlens_q = p.cu_seqlens_q ? p.cu_seqlens_q + b0 : NULL;
  p.cu_seqlens_kv = p.cu_seqlens_kv ? p.cu_seqlens_kv + b0 : NULL;
  p.seqused_kv = p.seqused_kv ? p.seqused_kv + b0 : NULL;
  p.block_table = p.block_table ? p.block_table + (size_t)b0 * (size_t)p.max_pages
                                : NULL;
  p.k_scale = d->hks ? d->hks + hkv : NULL;
  p.v_scale = d->hvs ? d->hvs + hkv : NULL;
  return p;
}

/* The float64 reference of one block. */
static int reference_block(const run_data *d, check_block *k)
{
  fj_problem p = sub_problem(d, k->b0, k->b1);
  size_t cnt = (size_t)p.batch * (size_t)p.heads_q * (size_t)(k->r1 - k->r0);
  k->ref = malloc((cnt ? cnt : 1) * (size_t)p.head_dim * sizeof(double));
  k->lse = malloc((cnt ? cnt : 1) * sizeof(double));
  if (!k->ref || !k->lse ||
      fj_reference_fwd(&p, d->hq, d->hk, d->hv, p.k_scale, p.v_scale, k->r0,
                       k->r1, k->ref, k->lse) != FJ_OK) {
    fprintf(stderr, "flashjit run: the reference failed: %s\n",
            fj_errmsg(NULL));
    return EXIT_FAIL;
  }
  return 0;
}

/* The float64 reference for the checked rows, computed once per run (and
 * tried again by the next check if it failed). */
static int reference_rows(run_data *d)
{
  if (d->blocks)
    return 0;
  if (check_blocks(d)) {
    fprintf(stderr, "flashjit run: out of host memory\n");
    return EXIT_FAIL;
  }
  for (int i = 0; i < d->nblocks; i++)
    if (reference_block(d, &d->blocks[i])) {
      free_blocks(d);
      return EXIT_FAIL;
    }
  return 0;
}

/* The check's line: the rows compared -- per (batch, head), or with
 * --varlen per head, of all sequences' real rows -- and the errors. */
static void print_check(const run_data *d, const err_sum *e, double rel,
                        double lse_rel, int pass)
{
  const fj_problem *p = &d->p;
  long long rows = 0;
  for (int b = 0; b < p->batch; b++)
    rows += cli_len_q(d, b);
  int varlen = d->hix.cu_q != NULL;
  size_t per = (size_t)p->heads_q * (size_t)(varlen ? 1 : p->batch);
  printf("check: %zu of %lld rows per %s%s; rel_err=%.3e max_abs_err=%.3e "
         "lse_rel_err=%.3e nonfinite=%zu -> %s\n",
         e->checked / per, varlen ? rows : (long long)p->seq_q,
         varlen ? "head (all sequences)" : "(batch, head)",
         !d->sampled ? "" : varlen ? " (start, middle, end of each sequence)"
                                   : " (start, middle, end)",
         rel, e->max_abs, lse_rel, e->nonfinite, pass ? "PASS" : "FAIL");
}

/* Runs v (NULL: the library's choice) on poisoned outputs and compares O
 * and the log-sum-exp with the reference.  Prints one line unless quiet;
 * *rel gets the relative error.  0 on PASS. */
int cli_check_variant(const cli *c, fj_ctx *ctx, run_data *d,
                      const fj_variant *v, int quiet, double *rel_out)
{
  const fj_problem *p = &d->p;
  size_t nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  /* Poison: 0xff bytes are NaN in f16 and bf16 (and in float32), so any
   * element the kernel fails to write shows up. */
  CUDA_TRY(cudaMemset(d->dout, 0xff, d->no * d->esize));
  CUDA_TRY(cudaMemset(d->dlse, 0xff, nlse * sizeof(float)));
  fj_status st = cli_launch_one(ctx, d, v, d->dlse);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaDeviceSynchronize());
  CUDA_TRY(cudaMemcpy(d->ho, d->dout, d->no * d->esize, cudaMemcpyDeviceToHost));
  CUDA_TRY(cudaMemcpy(d->hlse, d->dlse, nlse * sizeof(float),
                      cudaMemcpyDeviceToHost));
  if (reference_rows(d))
    return EXIT_FAIL;
  err_sum e = {0};
  for (int i = 0; i < d->nblocks; i++)
    compare_block(d, &d->blocks[i], &e);
  double rel = e.ref2 > 0 ? sqrt(e.diff2 / e.ref2) : sqrt(e.diff2);
  double lse_rel = e.lse_ref2 > 0 ? sqrt(e.lse_diff2 / e.lse_ref2) : 0;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  double limit = kv == FJ_E4M3 ? 3e-2 : 1e-2;
  int pass = e.nonfinite == 0 && rel < limit && lse_rel < 1e-3;
  *rel_out = rel;
  if (!quiet)
    print_check(d, &e, rel, lse_rel, pass);
  return pass ? 0 : EXIT_FAIL;
}

/* A placeholder for the index arrays of a problem that is only planned or
 * checked: the library looks at which pointers are set, not at them. */
static const int32_t index_placeholder[1];

/* --varlen against the problem's bounds: one item per sequence, each
 * within seq_q and seq_kv (a seq_kv below 1 is the library's to name). */
static int check_varlen(const cli *c, int batch, int seq_q, int seq_kv)
{
  if (c->nlens != batch)
    return cli_usage_error(c, "invalid value '%s' for --varlen: %d items for "
                              "--shape's B = %d (one Q[:K] per sequence)",
                           c->varlen, c->nlens, batch);
  for (int b = 0; b < batch; b++) {
    if (c->lens[b].q > seq_q)
      return cli_usage_error(c, "invalid value '%s' for --varlen: item %d has "
                                "%d queries, more than --shape's S = %d",
                             c->varlen, b + 1, c->lens[b].q, seq_q);
    if (seq_kv >= 1 && c->lens[b].kv > seq_kv)
      return cli_usage_error(c, "invalid value '%s' for --varlen: item %d has "
                                "%d keys, more than seq_kv = %d (--seq-kv, "
                                "default S)",
                             c->varlen, b + 1, c->lens[b].kv, seq_kv);
  }
  return 0;
}

/* --varlen: Q, O, K and V as packed tokens, with their totals (what the
 * wgmma family's tensor maps need). */
static void varlen_problem(const cli *c, fj_problem *p)
{
  long long tq = 0, tkv = 0;
  for (int b = 0; b < p->batch; b++) {
    tq += c->lens[b].q;
    tkv += c->lens[b].kv;
  }
  p->cu_seqlens_q = p->cu_seqlens_kv = index_placeholder;
  p->total_q = tq > INT32_MAX ? 0 : (int)tq;  /* 0: the mma family takes it */
  p->total_kv = tkv > INT32_MAX ? 0 : (int)tkv;
}

/* --page-size N: K and V as pages of N tokens (NHD), as many pages as the
 * sequences use (at least one), a table row of ceil(seq_kv / N) pages per
 * sequence, and each sequence's keys in seqused_kv.  A page size the
 * library refuses gets one page, for fj_problem_check to name. */
static void page_problem(const cli *c, fj_problem *p)
{
  int n = c->page_size;
  p->page_size = n;
  p->block_table = p->seqused_kv = index_placeholder;
  p->cu_seqlens_kv = NULL;
  p->total_kv = 0;
  p->max_pages = p->num_pages = 1;
  if (n < 1 || p->seq_kv < 1)
    return;
  long long pages = 0;
  for (int b = 0; b < p->batch; b++)
    pages += pages_for(c->lens ? c->lens[b].kv : p->seq_kv, n);
  p->max_pages = (int)pages_for(p->seq_kv, n);
  p->num_pages = pages < 1 ? 1 : pages > INT32_MAX ? INT32_MAX : (int)pages;
  int64_t row = (int64_t)p->heads_kv * p->head_dim;
  int64_t s[3] = {row * n, p->head_dim, row};
  memcpy(p->k_stride, s, sizeof s);
  memcpy(p->v_stride, s, sizeof s);
}

/* emit's problem when --shape is not given: B,H,S,D = 2,16,4096,D; with
 * --varlen B its items and S (and seq_kv, unless given) their longest. */
static void emit_default_shape(cli *c, int *skv)
{
  int q = 1, kv = 1;
  for (int b = 0; b < c->nlens; b++) {
    q = c->lens[b].q > q ? c->lens[b].q : q;
    kv = c->lens[b].kv > kv ? c->lens[b].kv : kv;
  }
  c->shape[0] = c->lens ? c->nlens : 2;
  c->shape[1] = 16;
  c->shape[2] = c->lens ? q : 4096;
  c->shape[3] = c->v.head_dim;
  if (!cli_flag_given(c, "seq-kv"))
    *skv = c->lens ? kv : c->shape[2];
}

int cli_problem(cli *c, fj_problem *p)
{
  int skv = c->seq_kv;
  if (!c->shape_given && c->cmd != CMD_EMIT)
    return cli_usage_error(c, "--shape B,H,S,D is required");
  if (!c->shape_given)
    emit_default_shape(c, &skv);
  else if (!cli_flag_given(c, "seq-kv"))
    skv = c->shape[2];
  int b = c->shape[0], h = c->shape[1], s = c->shape[2], dim = c->shape[3];
  /* Given values are taken as given: fj_problem_check names bad ones. */
  int hkv = cli_flag_given(c, "heads-kv") ? c->heads_kv : h;
  if (cli_flag_given(c, "head-dim") && c->v.head_dim != dim)
    return cli_usage_error(c, "--head-dim %d contradicts --shape's D = %d",
                           c->v.head_dim, dim);
  if (c->lens && cli_flag_given(c, "layout"))
    return cli_usage_error(c, "--layout does not apply with --varlen: its "
                              "sequences are packed tokens (thd)");
  int rc = c->lens ? check_varlen(c, b, s, skv) : 0;
  if (rc)
    return rc;
  c->v.head_dim = dim;
  fj_problem_init(p, b, h, hkv, s, skv, dim, c->v.dtype,
                  c->lens ? FJ_THD : c->order);
  p->causal = c->v.causal;
  p->kv_dtype = c->v.kv_dtype;
  p->splits = c->splits;
  p->mods = c->mods_on ? &c->mods : NULL;
  cli_block_mask_shape(c, p);
  if (c->lens)
    varlen_problem(c, p);
  if (cli_flag_given(c, "page-size"))
    page_problem(c, p);
  return 0;
}

/* The variant the flags give, checked on a compile-only sm_90a context:
 * a value out of range, an axis value not implemented or a combination
 * over sm_90a's limits (the most any target allows) is refused on every
 * GPU, so it is refused here, before one is looked for. */
static int check_given_variant(cli *c, fj_ctx *ctx)
{
  fj_status st = fj_variant_check(ctx, &c->v);
  return st == FJ_OK ? 0 : cli_fj_error(c, ctx, st);
}

/* The library's choice for the problem, planned for sm_90a: what it
 * refuses for every target (FP8 K/V in pages, say) is refused here. */
static int check_plan(cli *c, fj_ctx *ctx, const fj_problem *p)
{
  fj_plan plan;
  fj_status st = fj_attention_plan(ctx, p, &plan);
  return st == FJ_OK || st == FJ_ERR_RESOURCES ? 0 : cli_fj_error(c, ctx, st);
}

/* Checks the problem (and the variant the flags give, or else the
 * library's plan) before looking for a GPU, so that bad input is reported
 * as bad input on any machine. */
static int run_validate(cli *c, const fj_problem *p)
{
  fj_ctx *ctx;
  int rc = cli_open_ctx(c, -1, "sm_90a", &ctx);
  if (rc)
    return rc;
  /* FP8 scales are allocated later; only their presence is checked here. */
  static const float placeholder[1];
  fj_problem check = *p;
  if (check.kv_dtype == FJ_E4M3)
    check.k_scale = check.v_scale = placeholder;
  fj_status st = fj_problem_check(ctx, &check);
  if (st != FJ_OK)
    rc = cli_fj_error(c, ctx, st);
  else if (c->variant_given)
    rc = check_given_variant(c, ctx);
  else if (c->cmd == CMD_RUN && !c->sweep)
    rc = check_plan(c, ctx, &check);
  fj_ctx_destroy(ctx);
  return rc;
}

/* The problem of --shape and friends, checked without a GPU, and a context
 * on the device (run and tune). */
int cli_problem_on_device(cli *c, run_data *d, fj_ctx **ctx)
{
  memset(d, 0, sizeof *d);
  int rc = cli_problem(c, &d->p);
  if (!rc)
    rc = run_validate(c, &d->p);
  if (!rc)
    rc = index_make(c, d, c->seed);
  if (!rc)
    rc = cli_open_ctx(c, c->device, NULL, ctx);
  if (rc)
    index_free(&d->hix);
  return rc;
}

