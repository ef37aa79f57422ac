#!/bin/bash
# pair.sh OUTDIR -- the wide backward's pair (issue 31, head dims above
# 192): a cluster of two blocks splits a key tile of 128 and exchanges dS,
# so that each block adds dQ over 128 keys for half of its columns (half
# the float32 reductions of the 64-key kernel).  From the repository root
# with build/ carried (device_env.sh's conventions).  First one checked
# call (a hang ends at its bound), then the GPU tests that run head dims
# above 192, then the pair against FLASHJIT_BWD_PAIR=0 (the 64-key kernel)
# in one process each, alternately, two rounds, backward time (PAIR_TESTS
# and PAIR_SHAPES, ';' between shapes, choose).
set -u
out=${1:-/tmp/fj-pair}
mkdir -p "$out"
. bench/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/pair gpu: /'
timeout 60 ./flashjit run --backward --shape 1,2,640,256 --causal --dtype bf16 --check >"$out/first.log" 2>&1
echo "pair first check: exit $?; $(grep -E '^check' "$out/first.log" | cut -c1-160)"
grep -E "^backward|^grid|error|rror" "$out/first.log" | head -4
if ! grep -q -- '-> PASS' "$out/first.log"; then
  echo "pair: the first check did not pass; no more"
  exit 1
fi
. ../bench/probes/ab_lib.sh
ab_tests pair "$out" "${PAIR_TESTS-gpu_backward:200 gpu_backward_mods:120 gpu_backward_deterministic:90}"
ab_shapes pair "${PAIR_SHAPES:-8,8,2048,256;8,8,2048,256 --causal;2,8,8192,256;2,8,8192,256 --causal;2,9,8192,224 --causal}" \
  "--backward --dtype bf16" single FLASHJIT_BWD_PAIR=0 pair FLASHJIT_BWD_PAIR=1
