/*
 * mods_memo.c -- the forms of fj_mods this thread has found good
 * (mods_memo.h): a few copies per thread, behind a pthread key whose
 * destructor frees them, looked up by comparing every string.
 */
#include "mods_memo.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct form {
  char *text;        /* the score text, NUL, the mask text, NUL (one
                        block); NULL: the slot is empty */
  const char *mask;  /* into text */
  int nparams;
  char names[FJ_MOD_PARAMS_MAX][FJ_MOD_NAME_MAX + 1];
  fj_mod_type types[FJ_MOD_PARAMS_MAX];
  int ranks[FJ_MOD_PARAMS_MAX];
  int reads;
} form;

typedef struct memo {
  form forms[FJ_MODS_MEMO];
  int next;  /* the slot the next form takes (the oldest) */
} memo;

static pthread_key_t memo_key;
static int memo_key_ok;
static pthread_once_t memo_once = PTHREAD_ONCE_INIT;

static void memo_free(void *p)
{
  memo *mm = p;
  for (int i = 0; i < FJ_MODS_MEMO; i++)
    free(mm->forms[i].text);
  free(mm);
}

static void memo_key_create(void)
{
  memo_key_ok = pthread_key_create(&memo_key, memo_free) == 0;
}

/* The thread's memo; NULL where it has none (and create is 0) or memory
 * ran out. */
static memo *thread_memo(int create)
{
  pthread_once(&memo_once, memo_key_create);
  if (!memo_key_ok)
    return NULL;
  memo *mm = pthread_getspecific(memo_key);
  if (!mm && create && (mm = calloc(1, sizeof *mm)) &&
      pthread_setspecific(memo_key, mm) != 0) {
    free(mm);
    mm = NULL;
  }
  return mm;
}

static const char *text_of(const char *s)
{
  return s ? s : "";
}

/* Whether m's form can be looked up: its parameters readable, each with
 * a name (what the checks refuse otherwise is left to them). */
static int readable(const fj_mods *m)
{
  if (!m || m->num_params < 0 || m->num_params > FJ_MOD_PARAMS_MAX ||
      (m->num_params > 0 && !m->params))
    return 0;
  for (int i = 0; i < m->num_params; i++)
    if (!m->params[i].name)
      return 0;
  return 1;
}

static int same(const form *f, const fj_mods *m)
{
  if (!f->text || f->nparams != m->num_params ||
      strcmp(f->text, text_of(m->score)) || strcmp(f->mask, text_of(m->mask)))
    return 0;
  for (int i = 0; i < f->nparams; i++) {
    const fj_mod_param *p = &m->params[i];
    if (f->types[i] != p->type || f->ranks[i] != p->rank ||
        strcmp(f->names[i], p->name))
      return 0;
  }
  return 1;
}

int fj__mods_memo_find(const fj_mods *m, int *reads)
{
  memo *mm = readable(m) ? thread_memo(0) : NULL;
  for (int i = 0; mm && i < FJ_MODS_MEMO; i++)
    if (same(&mm->forms[i], m)) {
      if (reads)
        *reads = mm->forms[i].reads;
      return 1;
    }
  return 0;
}

void fj__mods_memo_add(const fj_mods *m, int reads)
{
  if (!readable(m))
    return;
  for (int i = 0; i < m->num_params; i++)
    if (strlen(m->params[i].name) > FJ_MOD_NAME_MAX)
      return;  /* not a good form: the checks refuse such a name */
  const char *score = text_of(m->score), *mask = text_of(m->mask);
  size_t ls = strlen(score), lm = strlen(mask);
  memo *mm = thread_memo(1);
  char *text = mm ? malloc(ls + lm + 2) : NULL;
  if (!text)
    return;
  memcpy(text, score, ls + 1);
  memcpy(text + ls + 1, mask, lm + 1);
  form *f = &mm->forms[mm->next];
  mm->next = (mm->next + 1) % FJ_MODS_MEMO;
  free(f->text);
  memset(f, 0, sizeof *f);
  f->text = text;
  f->mask = text + ls + 1;
  f->nparams = m->num_params;
  for (int i = 0; i < m->num_params; i++) {
    strcpy(f->names[i], m->params[i].name);
    f->types[i] = m->params[i].type;
    f->ranks[i] = m->params[i].rank;
  }
  f->reads = reads;
}
