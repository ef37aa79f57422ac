#!/bin/bash
# softcap_shift.sh OUTDIR -- the softcap's fixed shift (mods.lua's bounded)
# against the running max (online: fixed_on rendered false), from build/ on
# the GPU machine, on mods_probe.sh's wgmma variant (128 x 128, 12 warps,
# (4, 16, 4096, 128) bf16 causal): the runs of softcap_shift.runs,
# interleaved.
here=$(cd "$(dirname "$0")" && pwd)
SASS_RUNS="" RUNS="$(cat "$here/softcap_shift.runs")" \
  VARIANTS='online|mods.lua|s/R.fixed_on = .*/R.fixed_on = "false"/' \
  bash "$here/../mods_probe.sh" "$@"
