#!/bin/bash
# plan_fill.sh -- the library's plans that fill under half the GPU, without
# a GPU: for each arch, head dim and shape (decodes whose keys could be
# split, GQA decodes, a short and a long prefill; the backward of a short
# GQA training shape, examples/gpt_train.py's), `flashjit plan`'s grid
# beside the arch's multiprocessors; a line per plan whose blocks number
# fewer than half of them, and one per refusal.  From the repository root,
# build/ built.  ARCHS and DIMS override the lists.
ARCHS=${ARCHS:-"sm_80 sm_86 sm_89 sm_90a sm_120"}
DIMS=${DIMS:-"8 16 24 32 40 48 56 64 72 80 88 96 112 128 160 192 256 320 512"}
for arch in $ARCHS; do
  for d in $DIMS; do
    sm=$(build/flashjit plan --shape 1,1,1,64 --arch "$arch" 2>&1 | grep "^sm_count=" | cut -d= -f2)
    for s in "1,32,1,$d --heads-kv 8 --seq-kv 4096" "1,8,1,$d --heads-kv 1 --seq-kv 30000" \
             "4,32,4,$d --heads-kv 8 --seq-kv 8192" "1,8,512,$d" "1,16,2048,$d --heads-kv 4" \
             "8,8,512,$d --heads-kv 2 --causal --backward"; do
      out=$(build/flashjit plan --shape $s --arch "$arch" --dtype bf16 2>&1)
      if ! grep -q "^grid=" <<<"$out"; then
        echo "$arch d$d [$s]: $(tail -1 <<<"$out")"
        continue
      fi
      g=$(grep "^grid=" <<<"$out" | cut -d= -f2 | tr ',' '*' | bc)
      v=$(grep -E "^(variant|main)=" <<<"$out" | cut -d= -f2)
      [ $((g * 2)) -lt "$sm" ] && echo "$arch d$d [$s]: grid $g of $sm multiprocessors: $v"
    done
  done
done
exit 0
