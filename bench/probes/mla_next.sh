#!/bin/bash
# mla_next.sh OUTDIR -- what the next MLA step needs measured, from build/ on
# the GPU machine: `flashjit run --sweep` of the wide variants on the
# batched, the single long and the 128-head decodes (the fastest last),
# then whether `flashjit run` answers on the FP8 decode shape that gave no
# answer in the ninth session's first calls (output unbuffered, bounded).
set -u
out=${1:-/tmp}
base="--heads-kv 1 --head-dim-v 512 --latent --dtype bf16 --pack-gqa --split-kv --mma mma --softmax regs"
for shape in "--shape 64,16,1,576 --seq-kv 4096" "--shape 1,16,1,576 --seq-kv 32768" \
             "--shape 64,128,1,576 --seq-kv 4096"; do
  timeout ${SWEEP_TIMEOUT:-150} ./flashjit run $shape $base --sweep --iters 20 >"$out/sweep.log" 2>&1
  echo "mla sweep $shape: exit $?; $(grep -c 'us ' "$out/sweep.log") timed; $(grep fastest "$out/sweep.log")"
done
s=$(date +%s%N)
timeout -s INT 60 stdbuf -o0 -e0 ./flashjit run --shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 \
  --kv-dtype e4m3 --iters 20 >"$out/fp8run.log" 2>&1
echo "fp8 run: exit $? in $(( ($(date +%s%N) - s) / 1000000 )) ms; last lines: $(tail -3 "$out/fp8run.log" | tr '\n' '|')"
