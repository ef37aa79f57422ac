#!/bin/bash
# staged_o.sh OUTDIR -- the wgmma family's O through shared memory
# (epilogue_regs.cuh's stage: 16-byte row-segment stores) against the
# register stores it replaced (STAGE_O = false), the library's picks, from
# build/ on the GPU machine, interleaved (staged_o.runs).
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/staged_o.runs")" \
  VARIANTS="no-stage|attention_wgmma.cu|s/local STAGE_O = true/local STAGE_O = false/" \
  bash "$here/../mods_probe.sh" "$@"
