#!/bin/bash
# lazy_rescale.sh OUTDIR -- the softmax's lazy rescale (softmax_regs.cuh's
# `lazy`), from build/ on the GPU machine: the runs of lazy_rescale.runs
# (library picks and one mma variant), each rendered from templates/ as
# they are (base: the mma family lazy, the wgmma family eager), with the
# mma family eager (eager) and with the wgmma family lazy too (wg-lazy),
# interleaved.
here=$(cd "$(dirname "$0")" && pwd)
PROBE_V="" SASS_RUNS="" RUNS="$(cat "$here/lazy_rescale.runs")" \
  VARIANTS='eager|attention_mma.cu|s/ lazy = 8,//
wg-lazy|attention_wgmma.cu|s/NJ = BN \/\/ 16, mask = "branch",/NJ = BN \/\/ 16, mask = "branch", lazy = 8,/' \
  bash "$here/../mods_probe.sh" "$@"
