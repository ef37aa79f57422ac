#!/bin/bash
# alibi_scale.sh OUTDIR -- ALiBi's product F * (float)(kv - q) as one FMA
# per element from F once a row (mods.lua's kvq_scale) against the
# distance's add, the multiply and the score's add (noscale), from build/
# on the GPU machine: the runs of alibi_scale.runs, interleaved.
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/alibi_scale.runs")" \
  VARIANTS='noscale|mods.lua|s/local sc = R.kvq and kvq_scale_form(R.kernel_score_text)/local sc = nil/' \
  bash "$here/../mods_probe.sh" "$@"
