#!/bin/bash
# fwddesc.sh OUTDIR -- the forward wgmma kernels' descriptors as a base's
# plus one add in uniform registers (branch fwddesc: its templates/ copied
# to build-fd/templates here and carried with build/).  From the
# repository root (device_env.sh's conventions): checked calls, the wgmma
# and FP8 forward's GPU tests with those templates, then before (the
# build's templates) against after, in one process each, alternately, two
# rounds, forward time (FD_SHAPES, ';' between shapes; FD_TESTS).
set -u
out=${1:-/tmp/fj-fwddesc}
mkdir -p "$out"
root=$(pwd)
fd=${FD_TEMPLATES:-$root/build-fd/templates}
. bench/device_env.sh
[ -f "$fd/mainloop_fwd.cuh" ] || { echo "fwddesc: no templates at $fd"; exit 2; }
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/fwddesc gpu: /'
for args in "--shape 1,4,1000,128 --causal --dtype bf16" "--shape 1,4,1000,128 --dtype e4m3" "--shape 1,4,700,256 --causal --dtype e4m3" "--shape 1,4,700,64 --dtype f16"; do
  FLASHJIT_TEMPLATE_DIR=$fd timeout 60 ./flashjit run $args --check >"$out/check.log" 2>&1
  echo "fwddesc check $args: exit $?; $(grep -oE 'fj_attn[a-z0-9_]+' "$out/check.log" | head -1) $(grep -oE 'rel_err=[^ ]+ [a-zA-Z]+' "$out/check.log" | head -2 | tr '\n' ' ')"
done
. ../bench/probes/ab_lib.sh
ab_tests fwddesc "$out" "${FD_TESTS-gpu_wgmma_axes:150 gpu_fp8_forward:120}" FLASHJIT_TEMPLATE_DIR="$fd"
ab_shapes fwddesc "${FD_SHAPES:-4,16,4096,128 --dtype bf16;4,16,4096,128 --dtype bf16 --causal;4,32,4096,64 --dtype bf16 --causal;4,16,4096,128 --dtype e4m3;4,16,4096,128 --dtype e4m3 --causal;4,8,4096,256 --dtype e4m3}" \
  "" before FLASHJIT_TEMPLATE_DIR= after "FLASHJIT_TEMPLATE_DIR=$fd"
