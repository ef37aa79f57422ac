#!/bin/bash
# alibi_kvq.sh OUTDIR -- ALiBi's distance as a float built per element
# (mods.lua's kvq) against the expression as written (nokvq: the integer
# subtraction and conversion per element), from build/ on the GPU machine:
# the runs of alibi_kvq.runs (library picks and one mma variant),
# interleaved.
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/alibi_kvq.runs")" \
  VARIANTS='nokvq|mods.lua|s/R.kernel_score_text = R.score_text and kvq_form(R.score_text)/R.kernel_score_text = R.score_text/' \
  bash "$here/../mods_probe.sh" "$@"
