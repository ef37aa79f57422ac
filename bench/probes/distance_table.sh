#!/bin/bash
# distance_table.sh OUTDIR -- a relative-position bias read per tile at a
# row pointer and constant offsets (mods.lua's dg) against the read per
# score through the accessor (nodg: the index, bounds test and 64-bit
# address per score), from build/ on the GPU machine: the runs of
# distance_table.runs (library picks and explicit key tiles of both
# families, prefill and decode), interleaved.
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/distance_table.runs")" \
  VARIANTS='nodg|mods.lua|s/R.dg = dg_form(R.kernel_score_text)/R.dg = nil/' \
  bash "$here/../mods_probe.sh" "$@"
