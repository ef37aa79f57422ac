#!/bin/bash
# s30c.sh OUTDIR -- the thirtieth session's last call, from the repository
# root with build/ (main's) carried: on an H200, s29.sh's f16 part (the
# backward's fp16 sweep and GQA rows, the bar's other half); on any other
# GPU, examples/gpt_train.py under torch.compile (both models compiled:
# the step without most of the eager call's host time), interleaved
# timing rounds as in G2.  S30C_SECONDS bounds it (default 200).
set -u
out=${1:-/tmp/fj-s30c}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
echo "s30c gpu: $gpu"
case "$gpu" in
*H200*) S29_PARTS=f16 S29_SECONDS=${S30C_SECONDS:-200} bash bench/probes/s29.sh "$out" ;;
*) PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s30c-gpt timeout ${S30C_SECONDS:-200} \
     python3 examples/gpt_train.py --compile --steps 60 --time-rounds 12 --time-steps 10 >"$out/gpt_compile.log" 2>&1
   echo "gpt_train --compile: exit $?"; grep -E "median step|interleaved|PASS|FAIL|Error" "$out/gpt_compile.log" | cut -c1-300 ;;
esac
