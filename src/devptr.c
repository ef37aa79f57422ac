/*
 * devptr.c -- the device check of an attention call's pointers
 * (devptr.h).
 *
 * What passes.  Device memory of the context's device.  Managed memory,
 * on any device: it migrates to the GPU that touches it.  Page-locked
 * host memory (cuMemHostAlloc, cuMemHostRegister): under unified
 * addressing every device reaches it.  Memory CUDA does not know
 * (pageable host memory, or no memory at all): not this check's to
 * judge -- a GPU with HMM or ATS reads pageable memory, and a bad
 * address was never checked before either.  What is refused: device
 * memory of another device, even where peer access would let the kernel
 * read it, since a read across the link costs what the caller did not
 * ask for, and where peer access is off the kernel faults and the
 * context is lost.
 *
 * What it costs.  In a process that sees one device, nothing: every
 * device allocation of the process is then that device's, and every
 * other kind passes, so the check could refuse nothing (the count is
 * fixed from cuInit on).  With two or more devices, one
 * cuPointerGetAttributes per distinct allocation among the call's
 * pointers: that call takes one address and several attributes (all
 * five in one lookup), not several addresses, so the lookups cannot be
 * batched further; what can be saved is a second lookup for a pointer
 * inside a range already found, as when q, k and v are views of one
 * packed QKV tensor.  q, k, v, o and lse: one to five lookups, each of
 * the order of 0.1-0.3 us (estimated; bench/device_check.sh's part multi
 * measures the host time per call with one device visible and with
 * two), against about 3.6 us for the whole call.  Remembering verdicts
 * across calls would save the lookups but is not safe: the address space
 * is shared by all devices, so a freed address may come back as another
 * device's allocation, and the attribute that would tell (BUFFER_ID)
 * costs the same lookup.
 */
#include <stdint.h>
#include <stdio.h>

#include "ctx.h"
#include "devptr.h"
#include "driver.h"

static void add(fj_devptr *out, size_t *n, const char *name, int index,
                const void *ptr)
{
  if (!ptr)
    return;
  out[*n].name = name;
  out[*n].index = index;
  out[*n].ptr = ptr;
  (*n)++;
}

/* The modifications' device arrays: sinks, a block mask, tensors. */
static void add_mods(const fj_mods *m, fj_devptr *out, size_t *n)
{
  add(out, n, "mods.sinks", -1, m->sinks);
  const fj_block_mask *b = m->block_mask;
  if (b) {
    add(out, n, "mods.block_mask.kv_num", -1, b->kv_num);
    add(out, n, "mods.block_mask.kv_indices", -1, b->kv_indices);
    add(out, n, "mods.block_mask.full_num", -1, b->full_num);
    add(out, n, "mods.block_mask.full_indices", -1, b->full_indices);
    add(out, n, "mods.block_mask.q_num", -1, b->q_num);
    add(out, n, "mods.block_mask.q_indices", -1, b->q_indices);
    add(out, n, "mods.block_mask.full_q_num", -1, b->full_q_num);
    add(out, n, "mods.block_mask.full_q_indices", -1, b->full_q_indices);
  }
  for (int i = 0; m->params && i < m->num_params && i < FJ_MOD_PARAMS_MAX; i++)
    if (m->params[i].rank > 0)
      add(out, n, "mods.params", i, m->params[i].data);
}

size_t fj__devptr_list(const fj_problem *p, const void *q, const void *k,
                       const void *v, const void *o, const void *lse,
                       const void *workspace, fj_devptr *out)
{
  size_t n = 0;
  add(out, &n, "q", -1, q);
  add(out, &n, "k", -1, k);
  add(out, &n, "v", -1, v);
  add(out, &n, "o", -1, o);
  add(out, &n, "lse", -1, lse);
  add(out, &n, "workspace", -1, workspace);
  if (p->kv_dtype == FJ_E4M3 || p->dtype == FJ_E4M3) {
    add(out, &n, "k_scale", -1, p->k_scale);
    add(out, &n, "v_scale", -1, p->v_scale);
  }
  if (p->dtype == FJ_E4M3) {
    add(out, &n, "q_scale", -1, p->q_scale);
    add(out, &n, "o_scale", -1, p->o_scale);
    add(out, &n, "o_amax", -1, p->o_amax);
  }
  add(out, &n, "cu_seqlens_q", -1, p->cu_seqlens_q);
  add(out, &n, "cu_seqlens_kv", -1, p->cu_seqlens_kv);
  add(out, &n, "seqused_kv", -1, p->seqused_kv);
  add(out, &n, "block_table", -1, p->block_table);
  if (p->mods)
    add_mods(p->mods, out, &n);
  return n;
}

/* Whether ptr lies in one of the allocations already found right. */
static int inside(const fj_mem_info *ok, size_t n, const void *ptr)
{
  uint64_t a = (uint64_t)(uintptr_t)ptr;
  for (size_t i = 0; i < n; i++)
    if (a - ok[i].start < ok[i].bytes)
      return 1;
  return 0;
}

fj_status fj__devptr_check(const fj_ctx *ctx, const char *fn,
                           const fj_devptr *ptrs, size_t n,
                           fj_mem_query query)
{
  fj_mem_info ok[FJ_DEVPTR_MAX];
  size_t nok = 0;
  for (size_t i = 0; i < n; i++) {
    const fj_devptr *d = &ptrs[i];
    if (!d->ptr || inside(ok, nok, d->ptr))
      continue;
    fj_mem_info m;
    fj_status st = query(ctx, d->ptr, &m);
    if (st != FJ_OK)
      return st;
    if (m.kind == FJ_MEM_DEVICE && m.ordinal >= 0 &&
        m.ordinal != ctx->dev.ordinal) {
      char index[16] = "";
      if (d->index >= 0)
        snprintf(index, sizeof index, "[%d]", d->index);
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "%s: %s%s is memory of device %d; this context runs "
                      "on device %d",
                      fn, d->name, index, m.ordinal, ctx->dev.ordinal);
    }
    if (m.bytes && nok < FJ_DEVPTR_MAX)
      ok[nok++] = m;
  }
  return FJ_OK;
}

fj_status fj__devptr_check_list(const fj_ctx *ctx, const char *fn,
                                const fj_devptr *ptrs, size_t n)
{
  if (ctx->devices < 2)
    return FJ_OK;  /* one device: nothing to refuse (see the top) */
  return fj__devptr_check(ctx, fn, ptrs, n, fj__cu_memory);
}

fj_status fj__devptr_check_call(const fj_ctx *ctx, const char *fn,
                                const fj_problem *p, const void *q,
                                const void *k, const void *v, const void *o,
                                const void *lse, const void *workspace)
{
  if (ctx->devices < 2)
    return FJ_OK;  /* not even the list */
  fj_devptr ptrs[FJ_DEVPTR_MAX];
  size_t n = fj__devptr_list(p, q, k, v, o, lse, workspace, ptrs);
  return fj__devptr_check_list(ctx, fn, ptrs, n);
}
