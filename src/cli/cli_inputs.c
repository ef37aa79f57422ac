/*
 * cli_inputs.c -- the inputs of `run`: seeded random tensors, the index
 * arrays of --varlen and --page-size, in host and device memory; freeing
 * them all (with cli_mod_inputs.c's); one launch over them.
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
uint64_t cli_next_u64(uint64_t *state)
{
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return x;
}

/* Uniform in [-1, 1). */
float cli_next_uniform(uint64_t *state)
{
  uint64_t x = cli_next_u64(state);
  return (float)((double)(x >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

/* The state --seed starts from. */
uint64_t cli_seed_state(int seed)
{
  return UINT64_C(0x9e3779b97f4a7c15) ^ (uint64_t)seed;
}

void *cli_random_tensor(fj_dtype dtype, size_t n, float scale,
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
    f[i] = cli_next_uniform(state) * scale;
  fj_convert(dtype, out, FJ_F32, f, n);
  free(f);
  return out;
}

/* FP8 K/V (and Q, for --dtype e4m3): values spread over e4m3's range (x
 * 64) with per-(batch, head) scales of 1/64 that bring them back. */
static int run_fp8_scales(run_data *d)
{
  size_t n = (size_t)d->p.batch * (size_t)d->p.heads_kv;
  d->hks = malloc(n * sizeof(float));
  d->hvs = malloc(n * sizeof(float));
  d->hqs = malloc(n * sizeof(float));
  if (!d->hks || !d->hvs || !d->hqs)
    return EXIT_FAIL;
  for (size_t i = 0; i < n; i++)
    d->hks[i] = d->hvs[i] = d->hqs[i] = 1.0f / 64;
  if (d->p.dtype == FJ_E4M3) {
    CUDA_TRY(cudaMalloc((void **)&d->dqs, n * sizeof(float)));
    CUDA_TRY(cudaMemcpy(d->dqs, d->hqs, n * sizeof(float), cudaMemcpyHostToDevice));
    d->p.q_scale = d->dqs;
  }
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
long long cli_pages_for(long long len, int n)
{
  return (len + n - 1) / n;
}

/* d's problem with its host index arrays in place of the device's (for
 * fj_reference_fwd and fj_problem_check_lengths). */
fj_problem cli_host_problem(const run_data *d)
{
  fj_problem p = d->p;
  p.cu_seqlens_q = p.cu_seqlens_q ? d->hix.cu_q : NULL;
  p.cu_seqlens_kv = p.cu_seqlens_kv ? d->hix.cu_kv : NULL;
  p.seqused_kv = p.seqused_kv ? d->hix.used_kv : NULL;
  p.block_table = p.block_table ? d->hix.table : NULL;
  p.mods = p.mods ? &d->hmods : NULL;
  return p;
}

/* Frees the host index arrays (cli_index_make's). */
void cli_index_free(seq_index *ix)
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
  uint64_t state = cli_seed_state(seed) ^ UINT64_C(0x7061676573);  /* "pages" */
  for (size_t i = 0; perm && i < n; i++)
    perm[i] = (int32_t)i;
  for (size_t i = n; perm && i > 1; i--) {
    size_t j = (size_t)(cli_next_u64(&state) % i);
    int32_t x = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = x;
  }
  for (int b = 0; perm && t && b < p->batch; b++) {
    long long used = cli_pages_for(cli_len_kv(d, b), p->page_size);
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
int cli_index_make(const cli *c, run_data *d, int seed)
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
  fj_problem hp = cli_host_problem(d);
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

/* Elements of Q (and O, whose rows have head_dim_v columns: dim): with
 * cu_seqlens_q the tokens of all sequences packed, else batch x seq_q
 * rows. */
static size_t q_elements(const run_data *d, const int64_t s[3], int dim)
{
  const fj_problem *p = &d->p;
  if (!d->hix.cu_q)
    return span(s, p->batch, p->heads_q, p->seq_q, dim);
  int tokens = d->hix.cu_q[p->batch];
  return span(s, 1, p->heads_q, tokens > 0 ? tokens : 1, dim);
}

/* Elements of K (and V: its strides s, its head dim dim): num_pages pages
 * of page_size tokens when paged, all sequences' keys packed with
 * cu_seqlens_kv, else batch x seq_kv rows. */
static size_t kv_elements(const run_data *d, const int64_t s[3], int dim)
{
  const fj_problem *p = &d->p;
  if (p->block_table)
    return span(s, p->num_pages, p->heads_kv, p->page_size, dim);
  if (!d->hix.cu_kv)
    return span(s, p->batch, p->heads_kv, p->seq_kv, dim);
  int tokens = d->hix.cu_kv[p->batch];
  return span(s, 1, p->heads_kv, tokens > 0 ? tokens : 1, dim);
}

int cli_run_alloc(run_data *d, int seed)
{
  const fj_problem *p = &d->p;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  float kv_scale = kv == FJ_E4M3 ? 64.f : 1.f;
  /* esize: O's element (bf16 for --dtype e4m3 unless --o-dtype); qsize:
   * Q's. */
  d->esize = cli_o_dtype(p) == FJ_E4M3 ? 1 : 2;
  size_t qsize = p->dtype == FJ_E4M3 ? 1 : 2;
  d->kvsize = kv == FJ_E4M3 ? 1 : 2;
  int dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
  d->nq = q_elements(d, p->q_stride, p->head_dim);
  d->nk = kv_elements(d, p->k_stride, p->head_dim);
  d->nv = kv_elements(d, p->v_stride, dv);
  d->no = q_elements(d, p->o_stride, dv);
  if (run_upload_index(d))
    return EXIT_FAIL;
  uint64_t state = cli_seed_state(seed);
  d->hq = cli_random_tensor(p->dtype, d->nq, p->dtype == FJ_E4M3 ? 64.f : 1.f, &state);
  d->hk = cli_random_tensor(kv, d->nk, kv_scale, &state);
  /* --latent: V is K (cli_problem gave it K's strides). */
  d->hv = d->latent ? d->hk : cli_random_tensor(kv, d->nv, kv_scale, &state);
  if (kv == FJ_E4M3 && run_fp8_scales(d))
    return EXIT_FAIL;
  d->ho = malloc(d->no * d->esize);
  size_t nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  d->hlse = malloc(nlse * sizeof(float));
  if (!d->hq || !d->hk || !d->hv || !d->ho || !d->hlse) {
    fprintf(stderr, "flashjit run: out of host memory\n");
    return EXIT_FAIL;
  }
  CUDA_TRY(cudaMalloc(&d->dq, d->nq * qsize));
  CUDA_TRY(cudaMalloc(&d->dk, d->nk * d->kvsize));
  if (d->latent)
    d->dv = d->dk;
  else
    CUDA_TRY(cudaMalloc(&d->dv, d->nv * d->kvsize));
  CUDA_TRY(cudaMalloc(&d->dout, d->no * d->esize));
  CUDA_TRY(cudaMalloc((void **)&d->dlse, nlse * sizeof(float)));
  /* FP8 attention: max |O| kept, and an e4m3 O's scale. */
  if (p->dtype == FJ_E4M3) {
    CUDA_TRY(cudaMalloc((void **)&d->damax, sizeof(float)));
    d->p.o_amax = d->damax;
  }
  if (cli_o_dtype(p) == FJ_E4M3) {
    CUDA_TRY(cudaMalloc((void **)&d->dos, sizeof(float)));
    CUDA_TRY(cudaMemcpy(d->dos, &d->o_scale, sizeof(float), cudaMemcpyHostToDevice));
    d->p.o_scale = d->dos;
  }
  CUDA_TRY(cudaMemcpy(d->dq, d->hq, d->nq * qsize, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dk, d->hk, d->nk * d->kvsize, cudaMemcpyHostToDevice));
  if (!d->latent)
    CUDA_TRY(cudaMemcpy(d->dv, d->hv, d->nv * d->kvsize, cudaMemcpyHostToDevice));
  return 0;
}


void cli_run_free(run_data *d)
{
  cudaFree(d->dbm_buf);
  free(d->hbm_buf);
  free(d->hq);
  free(d->hk);
  if (!d->latent)
    free(d->hv);
  free(d->ho);
  free(d->hlse);
  free(d->hks);
  free(d->hvs);
  free(d->hqs);
  cudaFree(d->dks);
  cudaFree(d->dvs);
  cudaFree(d->dqs);
  cudaFree(d->damax);
  cudaFree(d->dos);
  cli_free_blocks(d);
  cudaFree(d->dq);
  cudaFree(d->dk);
  if (!d->latent)
    cudaFree(d->dv);
  cudaFree(d->dout);
  cudaFree(d->dlse);
  cli_index_free(&d->hix);
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
