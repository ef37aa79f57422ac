#!/bin/bash
# distance_d64.sh OUTDIR -- a distance table at head dim 64 on the wgmma
# family: the pick (80 keys, the tile without spills for every form)
# against 96 and 128 keys, from build/ on the GPU machine: the runs of
# distance_d64.runs, interleaved.
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/distance_d64.runs")" VARIANTS="base||" \
  bash "$here/../mods_probe.sh" "$@"
