#!/bin/bash
# window_tile.sh OUTDIR -- the key tile of a sliding window's wgmma kernel
# (plan.c's window rule: 128 keys at head dim 128), from build/ on the GPU
# machine: the runs of window_tile.runs (the pick, and explicit key tiles
# from 64 to 176), interleaved.
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/window_tile.runs")" VARIANTS="base||" \
  bash "$here/../mods_probe.sh" "$@"
