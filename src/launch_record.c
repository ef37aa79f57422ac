/*
 * launch_record.c -- launch records (launch_record.h): a thread's
 * record, set by fj_launch_record, filled by the attention calls once
 * their launches are queued.  The arguments are copied whole, so that the
 * record can be launched again after the call's stack is gone; the
 * tensor maps keep the 64-byte alignment the driver's CUtensorMap has.
 */
#include <stdint.h>
#include <string.h>

#include "launch_record.h"

static _Thread_local fj_launches *recording;

/* The copies in the record's params: the parameter block, the tensor
 * maps and the modifications' values, each at an offset from the first
 * 64-byte boundary inside params. */
enum {
  OFF_MAPS = (sizeof(fj_kparams) + 63) / 64 * 64,
  OFF_MODS = OFF_MAPS + sizeof(fj_tmaps),
  COPIED = OFF_MODS + FJ_MOD_ARGS_MAX
};
_Static_assert(COPIED + 63 <= FJ_LAUNCH_PARAMS_BYTES,
               "FJ_LAUNCH_PARAMS_BYTES must hold a launch's arguments");

/* Nothing launched: no kernels, and nothing to zero. */
static void empty(fj_launches *rec)
{
  rec->count = 0;
  rec->zero_at = 0;
  rec->zero_words = 0;
}

void fj_launch_record(fj_launches *rec)
{
  recording = rec;
  if (rec)
    empty(rec);
}

int fj__launch_recording(void)
{
  return recording != NULL;
}

void fj__launch_record_clear(void)
{
  if (recording)
    empty(recording);
}

static void one(fj_launch_rec *r, void *function, const unsigned grid[3],
                unsigned threads, unsigned smem_bytes, void *stream,
                void *const args[3])
{
  r->function = function;
  for (int i = 0; i < 3; i++) {
    r->grid[i] = grid[i];
    r->block[i] = i == 0 ? threads : 1;
    r->args[i] = args[i];
  }
  r->smem_bytes = smem_bytes;
  r->stream = stream;
}

void fj__launch_record_note(const fj_launch_note *n)
{
  fj_launches *rec = recording;
  if (!rec)
    return;
  unsigned char *base = rec->params + (-(uintptr_t)rec->params & 63);
  memcpy(base, n->kp, sizeof *n->kp);
  memcpy(base + OFF_MAPS, n->maps, sizeof *n->maps);
  memcpy(base + OFF_MODS, n->mod_args, FJ_MOD_ARGS_MAX);
  /* Each argument where the call's points: its copy. */
  void *args[3];
  for (int i = 0; i < 3; i++)
    args[i] = n->args[i] == (const void *)n->kp     ? base
              : n->args[i] == (const void *)n->maps ? base + OFF_MAPS
                                                    : base + OFF_MODS;
  const fj_plan *p = n->plan;
  int i = 0;
  if (n->vt) {
    void *vt_args[3] = {base, NULL, NULL};
    one(&rec->launch[i++], n->vt, n->vt_grid, 256, 0, n->stream, vt_args);
  }
  one(&rec->launch[i++], n->function, p->grid, p->threads, p->smem_bytes,
      n->stream, args);
  if (n->combine)
    one(&rec->launch[i++], n->combine, p->combine_grid, p->combine_threads, 0,
        n->stream, args);
  /* A dynamic walk's counter, or FP8 attention's o_amax: never both
   * (FP8 attention walks statically). */
  const void *zero = n->kp->work ? (const void *)n->kp->work : n->kp->o_amax;
  rec->zero_at = (uint64_t)(uintptr_t)zero;
  rec->zero_words = zero ? 1 : 0;
  rec->count = i;
}
