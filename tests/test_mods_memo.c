/*
 * test_mods_memo.c -- the memo of checked forms (mods_memo.c): a form a
 * thread found good is not parsed again, so what must hold is that every
 * change to it is seen -- a text, a name, a type or a rank changed in
 * place between calls gets the status and message a thread that never saw
 * the good form gets, the values are still checked on every call, the
 * reads the plan counts follow the text -- and that threads checking
 * different forms at once each get their own answers.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mods.h"
#include "mods_memo.h"
#include "runner.h"

/* fj_problem_check on a thread of its own, whose memo is empty. */
typedef struct fresh_check {
  fj_ctx *ctx;
  const fj_problem *p;
  fj_status st;
  char msg[512];
} fresh_check;

static void *fresh_thread(void *arg)
{
  fresh_check *f = arg;
  f->st = fj_problem_check(f->ctx, f->p);
  snprintf(f->msg, sizeof f->msg, "%s", fj_errmsg(f->ctx));
  return NULL;
}

/* p checked here (after its good form was remembered) and on a fresh
 * thread: the same refusal, word for word. */
static int same_refusal(fj_ctx *ctx, const fj_problem *p)
{
  fresh_check f = {ctx, p, FJ_OK, ""};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, fresh_thread, &f) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK_ST(ctx, fj_problem_check(ctx, p), FJ_ERR_INVALID_ARG);
  if (f.st != FJ_ERR_INVALID_ARG || strcmp(f.msg, fj_errmsg(ctx))) {
    fprintf(stderr, "here:  %s\nfresh: %d %s\n", fj_errmsg(ctx), (int)f.st, f.msg);
    return 1;
  }
  return 0;
}

/* The reads the plan counts (fj__mods_info_reads): every expression's,
 * and the score's alone. */
static int reads_of(const fj_mods *m)
{
  fj_mods_info mi;
  fj__mods_info_reads(m, &mi);
  return mi.reads;
}

static int score_reads_of(const fj_mods *m)
{
  fj_mods_info mi;
  fj__mods_info_reads(m, &mi);
  return mi.score_reads;
}

int test_mods_memo_in_place(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  static _Alignas(16) int32_t doc[256];
  char mask[64] = "doc(q) == doc(kv)", name[16] = "doc";
  fj_mod_param prm = {name, FJ_MOD_I32, 1, {256, 0, 0, 0}, doc, 0};
  fj_mods m;
  fj_mods_init(&m);
  m.mask = mask;
  m.params = &prm;
  m.num_params = 1;
  fj_problem p;
  fj_problem_init(&p, 1, 8, 8, 256, 256, 64, FJ_F16, FJ_BSHD);
  p.mods = &m;
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  CHECK(fj__mods_memo_find(&m, NULL) && reads_of(&m) == 1);
  /* fj__mods_info reads fields only: the reads are left uncounted. */
  fj_mods_info mi;
  fj__mods_info(&m, &mi);
  CHECK(mi.on && mi.user && !mi.window && !mi.checked && mi.reads == -1 &&
        mi.score_reads == -1 && mi.distance_reads == -1);
  fj__mods_info_reads(NULL, &mi);
  CHECK(!mi.on && !mi.user && mi.reads == 0 && mi.score_reads == 0);
  /* The text, then each part of the parameter's form, changed in place. */
  strcpy(mask, "doc(q) == doc(kv) +");
  CHECK(same_refusal(ctx, &p) == 0);
  CHECK_MSG(ctx, "mods.mask:");
  strcpy(mask, "doc(q) == doc(kv)");
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  strcpy(name, "dog");
  CHECK(same_refusal(ctx, &p) == 0);
  CHECK_MSG(ctx, "'doc' at column 1");
  strcpy(name, "fjx");
  CHECK(same_refusal(ctx, &p) == 0);
  CHECK_MSG(ctx, "mods.params[0].name \"fjx\" is reserved");
  strcpy(name, "doc");
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  prm.rank = 2;
  prm.extents[1] = 4;
  CHECK(same_refusal(ctx, &p) == 0);
  CHECK_MSG(ctx, "mods.mask:");
  prm.rank = 1;
  strcpy(mask, "doc(q) % 2 == doc(kv) % 2");
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  prm.type = FJ_MOD_F32;
  CHECK(same_refusal(ctx, &p) == 0);
  CHECK_MSG(ctx, "mods.mask:");
  prm.type = FJ_MOD_I32;
  /* Values are checked on every call, the form remembered or not. */
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  prm.extents[0] = 0;
  CHECK(same_refusal(ctx, &p) == 0);
  CHECK_MSG(ctx, "mods.params[0] (doc): extents[0] = 0 is outside 1..2147483647");
  prm.extents[0] = 256;
  /* The reads the plan counts follow the text: two reads using kv. */
  strcpy(mask, "doc(q) == doc(kv)");
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  CHECK(reads_of(&m) == 1);
  strcpy(mask, "doc(kv) == doc(kv + 1)");
  CHECK(reads_of(&m) == 2);  /* not yet checked: parsed */
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  CHECK(fj__mods_memo_find(&m, NULL) && reads_of(&m) == 2);
  CHECK(score_reads_of(&m) == 0);
  /* The score's own reads are counted apart (the plan gives one a tile of
   * its own): by key, yes; by query alone, no; remembered or parsed. */
  strcpy(mask, "doc(q) == doc(kv)");
  for (int pass = 0; pass < 2; pass++) {
    m.score = "s + (float)doc(q - kv + 128)";
    CHECK(score_reads_of(&m) == 1 && reads_of(&m) == 2);
    m.score = "s + (float)doc(q)";
    CHECK(score_reads_of(&m) == 0 && reads_of(&m) == 1);
    CHECK_OK(ctx, fj_problem_check(ctx, &p));
    m.score = "s + (float)doc(q - kv + 128)";
    CHECK_OK(ctx, fj_problem_check(ctx, &p));
  }
  m.score = NULL;
  /* More forms than the memo holds, twice round: each still checked. */
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < FJ_MODS_MEMO + 3; i++) {
      snprintf(mask, sizeof mask, "doc(q) == doc(kv) || kv < %d", i);
      CHECK_OK(ctx, fj_problem_check(ctx, &p));
      snprintf(mask, sizeof mask, "doc(q) == doc(kv) || kv < %d)", i);
      CHECK(same_refusal(ctx, &p) == 0);
    }
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- threads -------------------------------------------------------------------- */

enum { THREADS = 4, LOOPS = 400 };

typedef struct worker {
  fj_ctx *ctx;
  int id;
  int fails;
} worker;

/* Each thread cycles through three forms of its own structs -- one read,
 * two reads, refused -- which the others check at the same time. */
static void *work(void *arg)
{
  worker *w = arg;
  static _Alignas(16) int32_t doc[512];
  static const char *const masks[3] = {
      "doc(q) == doc(kv)", "doc(kv) == doc(kv + 1)", "doc(q) == doc(kv) +"};
  fj_mod_param prm = {"doc", FJ_MOD_I32, 1, {512, 0, 0, 0}, doc, 0};
  fj_mods m;
  fj_mods_init(&m);
  m.params = &prm;
  m.num_params = 1;
  fj_problem p;
  fj_problem_init(&p, 1, 8, 8, 512, 512, 64, FJ_F16, FJ_BSHD);
  p.mods = &m;
  for (int i = 0; i < LOOPS; i++) {
    int k = (i + w->id) % 3;
    m.mask = masks[k];
    fj_status st = fj_problem_check(w->ctx, &p);
    w->fails += k < 2 ? st != FJ_OK || reads_of(&m) != k + 1
                      : st != FJ_ERR_INVALID_ARG ||
                            !strstr(fj_errmsg(w->ctx), "mods.mask:");
  }
  return NULL;
}

static void *find_thread(void *arg)
{
  return fj__mods_memo_find(arg, NULL) ? arg : NULL;
}

int test_mods_memo_threads(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  /* A form remembered here is this thread's alone. */
  fj_mods m;
  fj_mods_init(&m);
  m.mask = "kv <= q";
  CHECK_OK(NULL, fj_mods_check(&m));
  CHECK(fj__mods_memo_find(&m, NULL));
  pthread_t other;
  void *found = &m;
  CHECK(pthread_create(&other, NULL, find_thread, &m) == 0);
  CHECK(pthread_join(other, &found) == 0 && !found);
  /* Threads checking forms at once, each its own answers. */
  pthread_t t[THREADS];
  worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){ctx, i, 0};
    CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0);
  }
  int fails = 0;
  for (int i = 0; i < THREADS; i++) {
    CHECK(pthread_join(t[i], NULL) == 0);
    fails += w[i].fails;
  }
  CHECK(fails == 0);
  fj_ctx_destroy(ctx);
  return 0;
}
