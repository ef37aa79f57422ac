#!/bin/bash
# arch_picks.sh [FLASHJIT] -- the library's picks for the other targets
# (sm_80 to sm_120; sm_75's wmma and sm_90a's own picks aside) as explicit
# `flashjit run` lines that an H100 or H200 can time and check: each
# target's choice for the 16k-token problems at head dims 32-256, causal
# and not, f16 and bf16, and the serving shapes (varlen, paged decode),
# one line per distinct variant and shape.  No GPU needed: it only plans.
fj=${1:-build/flashjit}
declare -A seen
flags() {  # a variant name -> the run flags that give it
  local n=$1 d m t w s sw c dt
  d=$(sed -E 's/.*_d([0-9]+)_.*/\1/' <<<"$n"); m=$(sed -E 's/.*_m([0-9]+)_.*/\1/' <<<"$n")
  t=$(sed -E 's/.*_n([0-9]+)_.*/\1/' <<<"$n"); w=$(sed -E 's/.*_w([0-9]+)_.*/\1/' <<<"$n")
  s=$(sed -E 's/.*_s([0-9]+)_.*/\1/' <<<"$n"); sw=$(sed -E 's/.*_s[0-9]+_([a-z]+)_.*/\1/' <<<"$n")
  echo "--mma mma --head-dim $d --tile-m $m --tile-n $t --warps $w --stages $s --swizzle $sw --softmax regs"
}
for a in sm_80 sm_86 sm_89 sm_100a sm_120; do
  for d in 32 64 96 128 160 192 256; do
    h=$((2048 / d)); [ $h -gt 32 ] && h=32
    for c in "" "--causal"; do
      for dt in f16 bf16; do
        for shape in "--shape 4,$h,4096,$d" "--shape 3,8,4096,$d --varlen 17,1000,4096" \
                     "--shape 4,32,1,$d --heads-kv 8 --seq-kv 4096 --varlen 1:4096,1:100,1:1,1:0 --page-size 16"; do
          n=$("$fj" emit --arch $a $shape $c --dtype $dt --what name 2>/dev/null) || continue
          case $n in *_mma_*) ;; *) continue ;; esac
          key="$n $shape"
          [ -n "${seen[$key]:-}" ] && continue
          seen[$key]=1
          extra=""; case $n in *_gqa*) extra="$extra --pack-gqa" ;; esac; case $n in *_sk*|*split*) extra="$extra --split-kv" ;; esac
          echo "$shape $c --dtype $dt $(flags "$n")$extra   # $a: $n"
        done
      done
    done
  done
done
