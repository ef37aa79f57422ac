/*
 * launch_record.h -- launch records (fj_launch_record): what an attention
 * call of a recording thread launched, copied for the caller to launch
 * again.
 */
#ifndef FJ_LAUNCH_RECORD_H
#define FJ_LAUNCH_RECORD_H

#include "kparams.h"
#include "mods.h"

/* The launches a call made (noted once all were queued): the plan's
 * attention kernel (function) and, for split-KV, its combine, both given
 * args, whose entries point at kp, maps or mod_args (FJ_MOD_ARGS_MAX
 * bytes). */
typedef struct fj_launch_note {
  const fj_plan *plan;
  void *function, *combine;  /* combine: NULL for a one-kernel call */
  void *vt;                  /* FP8 attention's V^T pass, launched first
                                (vt_grid, 256 threads, the parameter block
                                its one argument); NULL otherwise */
  unsigned vt_grid[3];
  void *stream;
  void *const *args;         /* 3 */
  const fj_kparams *kp;
  const fj_tmaps *maps;
  const unsigned char *mod_args;
} fj_launch_note;

/* Whether this thread records; the cheap test before building a note. */
int fj__launch_recording(void);

/* Empties this thread's record, if it records (count 0, nothing to
 * zero): each public call does it on entry, so that a call that fails
 * leaves it empty. */
void fj__launch_record_clear(void);

/* Copies n into this thread's record, if it records. */
void fj__launch_record_note(const fj_launch_note *n);

#endif /* FJ_LAUNCH_RECORD_H */
