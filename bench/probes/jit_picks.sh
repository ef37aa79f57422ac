#!/bin/bash
# jit_picks.sh -- cold compiles of the library's picks (issue 11's JIT bar),
# from build/ on the GPU machine: each pick's `flashjit emit --what
# resources` in a fresh process with the disk cache off (the library turns
# NVRTC's own cache off), three rounds, interleaved; compile_ms is
# nvrtcCompileProgram's wall time (front end, optimiser and ptxas).
picks=(
  "4,16,4096,128 --dtype bf16 --causal"
  "4,32,4096,64"
  "8,32,2048,64 --causal"
  "2,8,8192,256 --causal"
  "1,8,512,64"
  "64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16"
  "1,32,1,128 --heads-kv 8 --seq-kv 4096"
)
for round in 1 2 3; do
  for s in "${picks[@]}"; do
    r=$(./flashjit emit --shape $s --what resources --no-disk-cache 2>&1)
    echo "jit $round [$s]: $(grep -oE '^variant=.*' <<<"$r" | cut -d= -f2) $(grep -oE '^compile_ms=.*' <<<"$r")"
  done
done
