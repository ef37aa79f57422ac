#!/bin/bash
# s39a.sh OUTDIR -- the thirty-ninth session's device call, from the
# repository root with main's build as build/, fp8_vtk.patch's CLI as
# build-vtk/ (fp8_vtk.sh says how it is made) and combine_unroll.patch's
# library as build-cc/ (s39b.sh):
#   1. fp8_vtk.sh's check and time parts (any Hopper GPU: the two ways
#      are timed beside each other), about 200 s;
#   2. where build-cc/ is carried, s39b.sh (the MLA combine's unroll and
#      width), about 150 s;
#   3. on an H200 only, s38a.sh's bf16det, d192 and decode parts in the
#      time left (issue 31's and 34's H200 figures; their predictions are
#      in s38a.sh).
# The whole bounded by S39A_SECONDS (580).
set -u
t0=$SECONDS
total=${S39A_SECONDS:-580}
FP8_VTK_SECONDS=200 bash bench/probes/fp8_vtk.sh "${1:-/tmp/fj-s39a}/vtk"
[ -d build-cc ] && S39B_SECONDS=150 bash bench/probes/s39b.sh "${1:-/tmp/fj-s39a}/s39b"
left=$(( total - (SECONDS - t0) ))
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ $left -gt 30 ]; then
  S38A_PARTS="bf16det d192 decode" S38A_SECONDS=$left bash bench/probes/s38a.sh "${1:-/tmp/fj-s39a}/s38a"
fi
