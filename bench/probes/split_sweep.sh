#!/bin/bash
# split_sweep.sh [SECONDS] -- every wgmma variant the tuner would try for
# split head dims (192 / 128, bf16, top-left causal, (1, 4, 512)), each
# `flashjit run --check` in a process of its own (a fault cannot poison
# the next), from the repository root with build/ carried.  gpu_tune_split
# (5b6aa99) timed 25 of 97 compiled candidates and counted 72 "failed":
# a launch that faults leaves the context unusable, so every later one
# fails.  One line per variant that does not pass.
set -u
deadline=$((SECONDS + ${1:-300}))
pass=0 bad=0 refused=0
for c in 1 2 3; do for tn in 64 80 96 112 128 144 160 176 192 224 256; do for st in 2 3 4; do
  [ $SECONDS -lt $deadline ] || { echo "out of time at m$((64 * c)) n$tn s$st"; break 3; }
  args="--head-dim 192 --head-dim-v 128 --dtype bf16 --causal --mma wgmma --tile-m $((64 * c)) --warps $((4 * (c + 1))) --tile-n $tn --stages $st"
  build/flashjit emit $args --arch sm_90a --what name >/dev/null 2>&1 || { refused=$((refused + 1)); continue; }
  outp=$(timeout 30 build/flashjit run --shape 1,4,512,192 $args --check --iters 3 2>&1); rc=$?
  if [ $rc -eq 0 ] && ! grep -q FAIL <<<"$outp"; then pass=$((pass + 1)); else
    bad=$((bad + 1)); echo "m$((64 * c)) n$tn s$st: rc $rc: $(tail -2 <<<"$outp" | tr '\n' ' ' | cut -c1-220)"; fi
done; done; done
echo "split sweep: $pass pass, $bad bad, $refused refused by emit"
