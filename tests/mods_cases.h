/*
 * mods_cases.h -- the named built-ins written as expressions
 * (fj_mod_builtins without a field), each with the parameters it lists,
 * sized for problems of 16 heads and 4096 positions: the compile tests of
 * the families (test_mods.c) and of the tiered JIT's first kernel
 * (test_tier.c) walk the same cases.
 */
#ifndef FJ_TEST_MODS_CASES_H
#define FJ_TEST_MODS_CASES_H

#include "flashjit.h"

typedef struct fjt_builtin_case {
  const char *name;
  fj_mod_param prm[2];
  int n;
} fjt_builtin_case;

enum { FJT_BUILTIN_CASES = 6 };
extern const fjt_builtin_case fjt_builtin_cases[FJT_BUILTIN_CASES];

#endif
