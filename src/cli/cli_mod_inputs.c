/*
 * cli_mod_inputs.c -- the inputs of `run` that modifications bring: the
 * tensors of --param (random or read from a file), the sinks of --sinks,
 * the block mask of --block-mask built on the GPU.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- the tensors of --param ----------------------------------------------------------- */

/* A tensor parameter of n elements from state: floats uniform in [-1, 1),
 * i32 uniform in 0..extents[0] - 1 (indices into its first dimension:
 * document ids of a document mask, for one). */
static void *random_param(const fj_mod_param *p, size_t n, uint64_t *state)
{
  if (p->type == FJ_MOD_F16 || p->type == FJ_MOD_BF16)
    return cli_random_tensor(p->type == FJ_MOD_F16 ? FJ_F16 : FJ_BF16, n, 1.f,
                         state);
  void *out = malloc(n * 4);
  int32_t *i32 = out;
  float *f32 = out;
  for (size_t i = 0; out && i < n; i++) {
    if (p->type == FJ_MOD_I32)
      i32[i] = (int32_t)(cli_next_u64(state) % (uint64_t)p->extents[0]);
    else
      f32[i] = cli_next_uniform(state);
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
  uint64_t state = cli_seed_state(seed) ^
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
void cli_free_blocks(run_data *d)
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
  d->hbm.q_num = (const int32_t *)(h0 + ((const char *)d->dbm.q_num - d0));
  d->hbm.q_indices = (const int32_t *)(h0 + ((const char *)d->dbm.q_indices - d0));
  d->hbm.full_q_num = (const int32_t *)(h0 + ((const char *)d->dbm.full_q_num - d0));
  d->hbm.full_q_indices = (const int32_t *)(h0 + ((const char *)d->dbm.full_q_indices - d0));
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
