/*
 * mods_memo.h -- the forms of fj_mods that this thread has checked and
 * found good, so that a call repeating one compares strings instead of
 * parsing its expressions again.
 *
 * A form here is what the checks of names and expressions read: the
 * score and mask texts (NULL and "" alike), the number of parameters and
 * each one's name, type and rank.  Entries are copies, compared by
 * content, never by pointer: a caller may change a text in place between
 * calls.  Each thread keeps its own few (freed when it exits), so no lock
 * is taken and no context is needed.
 */
#ifndef FJ_MODS_MEMO_H
#define FJ_MODS_MEMO_H

#include "flashjit.h"

/* How many forms a thread remembers; the oldest falls off. */
#define FJ_MODS_MEMO 8

/* 1 when this thread remembered m's form, with what was remembered of it
 * in *reads (NULL: not wanted); 0 otherwise (m NULL, a NULL name or
 * params, a count outside 1..FJ_MOD_PARAMS_MAX where params are given). */
int fj__mods_memo_find(const fj_mods *m, int *reads);
/* Remembers m's form, which the caller has checked and found good, with
 * its per-element tensor reads (as mods.c counts them: three counts packed
 * in one int).  Out of memory: nothing is remembered. */
void fj__mods_memo_add(const fj_mods *m, int reads);

#endif /* FJ_MODS_MEMO_H */
