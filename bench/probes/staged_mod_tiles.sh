#!/bin/bash
# staged_mod_tiles.sh OUTDIR -- with O staged through shared memory, the
# key tile of the window's and the bias table's wgmma kernels again (their
# picks, 128 keys, were chosen with register stores), from build/ on the
# GPU machine, interleaved (staged_mod_tiles.runs).
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/staged_mod_tiles.runs")" VARIANTS="base||" \
  bash "$here/../mods_probe.sh" "$@"
