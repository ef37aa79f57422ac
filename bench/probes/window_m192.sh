#!/bin/bash
# window_m192.sh OUTDIR -- a sliding window's wgmma kernel with 192 query
# rows a tile (three consumer warpgroups: a row tile's fixed cost over more
# rows, key tiles of 64 or 80 for the registers) against the pick (128 x
# 128), from build/ on the GPU machine, interleaved (window_m192.runs).
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/window_m192.runs")" VARIANTS="base||" \
  bash "$here/../mods_probe.sh" "$@"
