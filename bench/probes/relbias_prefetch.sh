#!/bin/bash
# relbias_prefetch.sh OUTDIR -- the next key tile's bias-table lines into
# L1 while this tile's softmax runs (mods.lua's prefetch, the wgmma family)
# against no prefetch (nopf), from build/ on the GPU machine: the runs of
# relbias_prefetch.runs, interleaved.
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/relbias_prefetch.runs")" \
  VARIANTS='nopf|attention_wgmma.cu|s/local PREFETCH = true/local PREFETCH = false/' \
  bash "$here/../mods_probe.sh" "$@"
